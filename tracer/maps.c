/*
 * tracer/maps.c: mmleak.ID.maps, a sorted union of every file-backed mapping seen in this
 * process (eu-addr2line -M needs every segment of a module, including those of objects
 * unloaded since), and mmleak.ID.loads, which mapping was there in which epoch (epochs count
 * dlclose() calls).  Rewritten at a flush when the loader's counters say something changed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"
#include "line.h"

/* ---- the maps file: a sorted union of every file-backed mapping seen in this process ---- */

struct mline { uint64_t start; uint32_t off, len; int seen, present; };
static struct {
    char *text; size_t tlen, tcap;      /* unique lines, back to back */
    struct mline *ln; size_t n, cap;    /* sorted by start address */
    unsigned long long adds, subs;      /* dl_iterate_phdr counters at the last snapshot */
    int stale;                          /* the last snapshot could not be written: retry */
    char *buf; size_t bcap;             /* scratch for reading /proc/self/maps */
} M;

/* Keep lines that name a file: eu-addr2line -M needs every segment of a module. */
static int wanted_map_line(const char *l, size_t n)
{
    const char *slash = memchr(l, '/', n);
    if (!slash || slash == l || slash[-1] != ' ')
        return 0;
    /* not our own staging files: they come and go, and the addresses they leave free are
     * soon a library's, which would then look like two objects over one range */
    if (n > 5 && !memcmp(l + n - 5, ".tail", 5)) {
        const char *base = l + n;
        while (base > slash && base[-1] != '/')
            base--;
        if (!memcmp(base, "mmleak.", 7))
            return 0;
    }
    return 1;
}

static int maps_add(const char *l, size_t n)
{
    for (size_t i = 0; i < M.n; i++)
        if (M.ln[i].len == n && !memcmp(M.text + M.ln[i].off, l, n)) {
            M.ln[i].seen = 1;
            return 0;
        }
    char *t = mml_grow(M.text, &M.tcap, M.tlen + n, 1);
    struct mline *a = mml_grow(M.ln, &M.cap, M.n + 1, sizeof *a);
    if (!t || !a)
        return 0;
    M.text = t;
    M.ln = a;
    memcpy(M.text + M.tlen, l, n);
    const char *e;
    uint64_t start = parse_hex(l, &e);
    size_t i = M.n;
    while (i > 0 && M.ln[i - 1].start > start) {
        M.ln[i] = M.ln[i - 1];
        i--;
    }
    M.ln[i] = (struct mline){ start, (uint32_t)M.tlen, (uint32_t)n, 1, 0 };
    M.n++;
    M.tlen += n;
    return 1;
}

/* ---- mmleak.ID.loads: which mapping was there in which epoch ----
 * The epoch counts dlclose() calls.  A plugin unloaded and another object loaded at the same
 * addresses would make those addresses ambiguous in the maps file (it keeps every mapping
 * ever seen, for eu-addr2line -M); so every change is logged, "+EPOCH LINE" when a mapping
 * appears and "-EPOCH LINE" when it is gone, and frames in a range some object was unloaded
 * from carry the epoch in their top 16 bits (see capture). */
int g_loads_on;  /* from the first dlclose on: before it, no range had two objects */
struct fid g_loads_id, g_maps_id;    /* made by reserve_id (.maps: its last version) */
struct fid g_lock_id;                /* made by reserve_id, or {0, 0} */
int g_loads_used;                     /* a line was written to it */
int g_loads_later, g_lock_later;      /* not made yet (reserve_id: a directory of ours) */

/* 0, or -1 if a line could not be written (it is tried again at the next snapshot) */
static int loads_log_locked(void)
{
    if (!g_loads_on)
        return 0;
    unsigned e = atomic_load(&g_epoch);
    int fd = -1;
    for (size_t i = 0; i < M.n; i++) {
        struct mline *l = &M.ln[i];
        if (l->seen == l->present)
            continue;
        /* a mapping gone while a dlclose() runs (a flush inside it takes a snapshot) was
         * there for the whole of the current epoch: its removal belongs to the epoch that
         * dlclose() opens, or the readers would not find it for the frames of this one */
        unsigned le = e + (!l->seen && g_closing);
        if (fd < 0) {
            /* made with the trace id (reserve_id): a FIFO or a link put at the name before
             * or since is refused, never waited on (the first dlclose holds our lock) */
            char name[64];
            if (g_loads_later)
                fd = create_locked(file_name(name, sizeof name, ".loads"), &g_loads_id);
            else
                fd = open_again(file_name(name, sizeof name, ".loads"), O_WRONLY | O_APPEND,
                                &g_loads_id);
            if (fd < 0)
                return -1;
            g_loads_later = 0;
            g_loads_used = 1;
        }
        char hdr[24], *d = hdr;
        *d++ = l->seen ? '+' : '-';
        d = cat_u(d, hdr + sizeof hdr, le);
        *d++ = ' ';
        /* one file for the whole trace: past RLIMIT_FSIZE it would kill the program */
        struct stat st;
        if (fstat(fd, &st) ||
            (uint64_t)st.st_size + (size_t)(d - hdr) + l->len > fsize_limit()) {
            static atomic_int said;
            if (!atomic_exchange(&said, 1))
                say_err("cannot write the log of loads in ", EFBIG, ": addresses in unloaded "
                        "ranges may be put in the wrong library");
            close(fd);
            return 0;           /* not a passing failure: do not retry at every flush */
        }
        if (write_all(fd, hdr, (size_t)(d - hdr)) || write_all(fd, M.text + l->off, l->len)) {
            close(fd);
            return -1;
        }
        l->present = l->seen;
    }
    if (fd >= 0)
        close(fd);
    return 0;
}

/* ---- the loader's list of objects, also in a child forked while the loader's lock was held ----
 * dl_iterate_phdr takes the loader's write lock (dl_load_write_lock, in ld.so's data).  fork
 * copies it held when another thread was inside dl_iterate_phdr (the program's callback, an
 * unwinder's, ours), and glibc's fork resets only the other loader lock (dl_load_lock) in the
 * child.  Measured on glibc 2.36, in such a child: dl_iterate_phdr, dlopen of an object not
 * loaded yet and a dlclose that unloads one wait forever; dladdr, dladdr1, dlsym, dlinfo,
 * dlopen of a loaded object, a dlclose that does not unload and _dl_find_object do not.  So
 * there the list of objects can never change again (whatever would change it waits for the
 * lock too), and mmleak.so reads it without the lock: the loader's own list, each object's
 * program headers where the loader has them (object_phdrs; tests/test_tracer.py compares
 * nothing of it: the child's trace names the right sites, and its scan at exit runs).  Its
 * users there: the counters, the name of the object that holds mmleak.so (mmleak-scan is
 * beside it), libc's symbols (scanhere.c) and, attached, GOT slots not seen before the
 * fork; the maps file and the scan's roots are /proc's, not this list's.  The counters
 * such a walk gives are 0, the same at every check: after the child's first snapshot (the
 * start of its trace, /proc/self/maps as it is then) no check reads the maps again, and none
 * needs to.  The lock is found once per process, in the first call (start-up: about 11,000
 * instructions, once): the recursive mutex of ld.so's writable data that the calling thread
 * owns inside its callback and that a nested call takes once more (wl_scan).  Its layout is
 * glibc's public one (struct __pthread_mutex_s: __lock, __count, __owner, __kind). */
static pthread_mutex_t *g_wlock;    /* the loader's write lock; NULL: not found (see below) */
static int g_wlock_tried;
int g_loader_stuck;                 /* a child forked with that lock held: never take it */

/* The program headers of the object mapped at START (its ELF header, at the start of its
 * first segment, so at a page boundary), or NULL */
static const ElfW(Phdr) *mapped_phdrs(const void *start, int *n)
{
    const ElfW(Ehdr) *eh = start;
    if (!eh || ((uintptr_t)eh & 4095) || memcmp(eh->e_ident, ELFMAG, SELFMAG) ||
        eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_phentsize != sizeof(ElfW(Phdr)) ||
        eh->e_phoff + (size_t)eh->e_phnum * sizeof(ElfW(Phdr)) > 4096)
        return NULL;    /* (the first page is mapped: nothing past it is read) */
    *n = eh->e_phnum;
    return (const ElfW(Phdr) *)((const char *)start + eh->e_phoff);
}

/* Candidates: the recursive mutexes of ld.so's writable data the calling thread owns, with
 * their counts.  Inside our callback the write lock is one of them; a nested call takes it
 * once more, and no other (dl_load_lock is held too when we run inside a dlopen). */
struct wl_find { pthread_mutex_t *m[4]; unsigned count[4]; int n, hits, hit; };

static void wl_scan(struct wl_find *w, int nested)
{
    struct dl_find_object fo;
    int n = 0;
    const ElfW(Phdr) *ph;
    void *ldso = (void *)getauxval(AT_BASE);   /* 0: ld.so run as the program */
    if (!ldso || _dl_find_object(ldso, &fo) || !fo.dlfo_link_map ||
        !(ph = mapped_phdrs(fo.dlfo_map_start, &n)))
        return;
    int tid = (int)mml_sys(SYS_gettid);
    if (nested) {
        for (int i = 0; i < w->n; i++)
            if (w->m[i]->__data.__owner == tid && w->m[i]->__data.__count == w->count[i] + 1) {
                w->hit = i;
                w->hits++;
            }
        return;
    }
    for (int i = 0; i < n; i++) {
        if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_W))
            continue;
        uintptr_t lo = (fo.dlfo_link_map->l_addr + ph[i].p_vaddr + 7) & ~(uintptr_t)7,
                  hi = fo.dlfo_link_map->l_addr + ph[i].p_vaddr + ph[i].p_memsz;
        for (uintptr_t a = lo; a + sizeof(pthread_mutex_t) <= hi; a += 8) {
            pthread_mutex_t *m = (pthread_mutex_t *)a;
            if (m->__data.__owner == tid && m->__data.__lock && m->__data.__count &&
                m->__data.__kind == PTHREAD_MUTEX_RECURSIVE_NP) {
                if (w->n == 4) {
                    w->n = 0;   /* not what we expect: give up */
                    return;
                }
                w->count[w->n] = m->__data.__count;
                w->m[w->n++] = m;
            }
        }
    }
}

static int wl_nested(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)info;
    (void)size;
    wl_scan(data, 1);
    return 1;
}

struct wl_call {
    struct wl_find w;
    int (*cb)(struct dl_phdr_info *, size_t, void *);   /* the caller's, with its data */
    void *data;
    int first;
};

static int wl_outer(struct dl_phdr_info *info, size_t size, void *data)
{
    struct wl_call *c = data;
    if (c->first) {
        c->first = 0;
        wl_scan(&c->w, 0);
        if (c->w.n)
            dl_iterate_phdr(wl_nested, &c->w);
    }
    return c->cb(info, size, c->data);
}

/* Do the program headers PH (N) describe the object L: its dynamic section where L has it,
 * and (HDR not 0) a segment that maps the file's start, the ELF header and these headers,
 * at HDR? */
static int phdrs_of(const struct link_map *l, const ElfW(Phdr) *ph, int n, uintptr_t hdr)
{
    int dyn = 0, head = !hdr;
    uintptr_t end = (uintptr_t)(ph + n) - hdr;     /* (unused when HDR is 0) */
    for (int i = 0; i < n; i++) {
        if (ph[i].p_type == PT_DYNAMIC)
            dyn |= l->l_addr + ph[i].p_vaddr == (uintptr_t)l->l_ld;
        else if (ph[i].p_type == PT_LOAD && ph[i].p_offset < 4096 &&
                 ph[i].p_offset + ph[i].p_filesz >= end &&
                 l->l_addr + ph[i].p_vaddr - ph[i].p_offset == hdr)
            head = 1;
    }
    return dyn && head;
}

/* The program headers of L, as dl_iterate_phdr would give them, or NULL.  The program's are
 * where the kernel said (AT_PHDR: ld.so took them from there).  Any other object's are read
 * from its ELF header, at the start of the span ld.so mapped it over (_dl_find_object of any
 * address in it gives that span; of its load bias, for an object whose span starts there
 * and that _dl_find_object knows segment by segment).  Not the start of the segment that
 * holds the dynamic section, as it was: a program whose segments are mapped apart (a
 * 2 MiB-aligned .bss: tests/gap_stack.c) is known to _dl_find_object segment by segment,
 * so that was its data, and a header forged there was taken as the program's.  A guess is
 * read only at a page boundary in a range _dl_find_object gives for L's object (mapped),
 * and kept only when the headers it gives name L's dynamic section and map the file's first
 * page (the header) where it was read. */
static const ElfW(Phdr) *object_phdrs(struct link_map *l, int *n)
{
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)getauxval(AT_PHDR);
    int k = (int)getauxval(AT_PHNUM);
    if (!l->l_prev && ph && getauxval(AT_PHENT) == sizeof *ph && phdrs_of(l, ph, k, 0)) {
        /* and at the program's load bias as ld.so computed it (PT_PHDR; none: not moved) */
        uintptr_t bias = 0;
        for (int i = 0; i < k; i++)
            if (ph[i].p_type == PT_PHDR)
                bias = (uintptr_t)ph - ph[i].p_vaddr;
        if (bias == l->l_addr) {
            *n = k;
            return ph;
        }
    }
    /* (the object's link map, not always L: in a dlmopen namespace ld.so's entry is a proxy
     * with ld.so's l_addr and l_ld, which dl_iterate_phdr gives as ld.so) */
    struct dl_find_object fo;
    if (!l->l_ld || _dl_find_object(l->l_ld, &fo) || !fo.dlfo_link_map)
        return NULL;
    void *guess[2] = { fo.dlfo_map_start, (void *)l->l_addr };
    for (int i = 0; i < 2; i++) {
        struct dl_find_object at;
        if (i == 1 && guess[1] == guess[0])
            break;
        if (!guess[i] || _dl_find_object(guess[i], &at) ||
            at.dlfo_link_map != fo.dlfo_link_map || !(ph = mapped_phdrs(guess[i], &k)) ||
            !phdrs_of(l, ph, k, (uintptr_t)guess[i]))
            continue;
        *n = k;
        return ph;
    }
    return NULL;
}

/* In a child forked with the lock held: the loader's list, read without it (see above).
 * The list of our own namespace (the program's), from our own entry in it; objects loaded
 * with dlmopen into other namespaces are not in it (glibc 2.35 and later chain their
 * lists from _r_debug, r_next).  Of the users above only the GOT's scan would see them:
 * attached in such a child, an object of another namespace not scanned before the fork is
 * not scanned (mmleak.so, libc's symbols and the counters are the program's namespace's). */
static int walk_stuck(int (*cb)(struct dl_phdr_info *, size_t, void *), void *data)
{
    int r = 0;
    struct dl_find_object self;
    if (_dl_find_object((void *)walk_stuck, &self) || !self.dlfo_link_map)
        return 0;
    struct link_map *head = self.dlfo_link_map;
    while (head->l_prev)
        head = head->l_prev;
    for (struct link_map *l = head; l && !r; l = l->l_next) {
        struct dl_phdr_info info;
        int n = 0;
        memset(&info, 0, sizeof info);
        if (!(info.dlpi_phdr = object_phdrs(l, &n)))
            continue;
        info.dlpi_addr = l->l_addr;
        info.dlpi_name = l->l_name;
        info.dlpi_phnum = (ElfW(Half))n;
        r = cb(&info, sizeof info, data);
    }
    return r;
}

/* dl_iterate_phdr for mmleak.so's every use: the first call of a process finds the loader's
 * lock; in a child forked while it was held, the list is walked without it. */
COLD int mml_each_object(int (*cb)(struct dl_phdr_info *, size_t, void *), void *data)
{
    if (g_loader_stuck)
        return walk_stuck(cb, data);
    if (__atomic_load_n(&g_wlock_tried, __ATOMIC_RELAXED) ||
        __atomic_exchange_n(&g_wlock_tried, 1, __ATOMIC_RELAXED))
        return dl_iterate_phdr(cb, data);
    struct wl_call c;
    memset(&c, 0, sizeof c);
    c.cb = cb;
    c.data = data;
    c.first = 1;
    int r = dl_iterate_phdr(wl_outer, &c);
    /* and released as it returns (still ours, once less, when the first call is made
     * from inside a callback of the program's) */
    if (c.w.hits == 1) {
        pthread_mutex_t *m = c.w.m[c.w.hit];
        unsigned k = c.w.count[c.w.hit];
        if (k == 1 ? m->__data.__owner != (int)mml_sys(SYS_gettid) : m->__data.__count == k - 1)
            __atomic_store_n(&g_wlock, m, __ATOMIC_RELEASE);
    }
    return r;
}

struct obj_at { uintptr_t a; const char *name; const void *id; };

static int obj_at_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct obj_at *q = data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && q->a >= info->dlpi_addr + ph->p_vaddr &&
            q->a < info->dlpi_addr + ph->p_vaddr + ph->p_memsz) {
            q->name = info->dlpi_name;
            q->id = info->dlpi_phdr;
            return 1;
        }
    }
    return 0;
}

/* The name of the loaded object whose segments hold A, as the loader has it ("" for the
 * program), or NULL.  dladdr would tell it too, but searches the object's symbols for the
 * nearest one: libc.so.6's 3000 at a start (12 to 24 us), mmleak.so's at an exit. */
COLD const char *mml_object_name(const void *a)
{
    struct obj_at q = { (uintptr_t)a, NULL, NULL };
    mml_each_object(obj_at_cb, &q);
    return q.name;
}

/* Which loaded object holds A: its program headers' address (one per object, never NULL),
 * or NULL.  For resolve_from's "same object as the allocator's malloc?", asked seven times
 * at a start: dladdr's dli_fbase told it at the price above, each time. */
COLD const void *mml_object_of(const void *a)
{
    struct obj_at q = { (uintptr_t)a, NULL, NULL };
    if (a)
        mml_each_object(obj_at_cb, &q);
    return q.id;
}

/* In the child of fork (one thread): is the loader's write lock held by a thread that is
 * not here (or by the parent's thread that forked from inside a callback, under another
 * thread id now)?  Then nobody can ever take it.  When the lock could not be found (a C
 * library laid out otherwise), a child of a parent with other threads is taken to be stuck:
 * a dlopen of the child's own would then be missed by the maps file (its frames left
 * unresolved), where a wrong guess the other way hangs the child. */
void loader_after_fork(int parent_had_threads)
{
    pthread_mutex_t *m = __atomic_load_n(&g_wlock, __ATOMIC_ACQUIRE);
    if (g_loader_stuck)
        return;         /* the parent's list could not change: neither can ours */
    if (m)
        g_loader_stuck = m->__data.__lock != 0 || m->__data.__owner != 0;
    else
        g_loader_stuck = parent_had_threads;
}

int phdr_counts(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    unsigned long long *c = data;
    c[0] = info->dlpi_adds;
    c[1] = info->dlpi_subs;
    return 1;
}

/* The table's lines, sorted, to FD (TOTAL bytes): 0, or -1.  One write when the sorted
 * text fits the read buffer (done with /proc's text by now): a line per write() was a
 * twentieth of a small program's start-up under the tracer. */
static int maps_write(int fd, size_t total)
{
    int bad = 0;
    char *b = mml_grow(M.buf, &M.bcap, total, 1);
    if (b) {
        M.buf = b;
        size_t at = 0;
        for (size_t i = 0; i < M.n; i++) {
            memcpy(b + at, M.text + M.ln[i].off, M.ln[i].len);
            at += M.ln[i].len;
        }
        bad = write_all(fd, b, at);
    } else {
        for (size_t i = 0; i < M.n && !bad; i++)
            bad = write_all(fd, M.text + M.ln[i].off, M.ln[i].len);
    }
    return bad;
}

/* Merge /proc/self/maps into the table and rewrite mmleak.ID.maps (temp file + rename) when
 * anything is new.  force=0 skips the work when no object was loaded or unloaded since.
 * *CLAIM (a trace's first snapshot): the descriptor of the empty .maps that reserve_id
 * created for the trace's id, written in place: no temporary file created and renamed
 * (an inode and two directory changes at every start-up: mmleak-performance(7)).  Nobody
 * reads it yet: no dump file of the trace exists before this (readers find a trace by its
 * dump files), and a write that fails leaves it empty again, for a later snapshot's
 * temporary file and rename.  NULL otherwise. */
static void maps_snapshot_locked(int force, const unsigned long long c[2], int *claim)
{
    if (!force && !M.stale && c[0] == M.adds && c[1] == M.subs)
        return;
    M.adds = c[0];
    M.subs = c[1];
    /* until the file is written (a full disk, no descriptor left: passing failures), every
     * later call tries again: the readers need every mapping to name a call site */
    int was_stale = M.stale;
    M.stale = 1;
    int fd = g_procfd >= 0 ? openat(g_procfd, "self/maps", O_RDONLY | O_CLOEXEC)
                           : open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0 && claim && *claim >= 0 && (errno == EMFILE || errno == ENFILE)) {
        close(*claim);          /* one descriptor left: the temporary file's way, as ever */
        *claim = -1;
        fd = g_procfd >= 0 ? openat(g_procfd, "self/maps", O_RDONLY | O_CLOEXEC)
                           : open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0)
        return;
    size_t len = 0;
    for (;;) {
        if (M.bcap - len < 4096) {  /* grown only when nearly full: a new mapping costs faults */
            char *b = mml_grow(M.buf, &M.bcap, len + 65536, 1);
            if (!b)
                break;
            M.buf = b;
        }
        ssize_t r = read(fd, M.buf + len, M.bcap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    int changed = 0;
    for (size_t i = 0; i < M.n; i++)
        M.ln[i].seen = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(M.buf + i, '\n', len - i);
        size_t n = (nl ? (size_t)(nl - (M.buf + i)) : len - i) + 1;
        if (nl && wanted_map_line(M.buf + i, n - 1))
            changed |= maps_add(M.buf + i, n);
        i += n;
    }
    int loads_bad = loads_log_locked();
    if (!changed && !force && !was_stale) {
        M.stale = loads_bad;
        return;
    }
    size_t total = 0;
    for (size_t i = 0; i < M.n; i++)
        total += M.ln[i].len;
    if (total > fsize_limit()) {
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            say_err("cannot write the maps file in ", EFBIG, ": addresses of later libraries "
                    "may stay unresolved");
        return;
    }
    if (claim && *claim >= 0) {
        if (maps_write(*claim, total)) {
            if (ftruncate(*claim, 0)) { /* the next snapshot's rename replaces it anyway */ }
        } else {
            M.stale = loads_bad;
        }
        return;
    }
    char name[64], tmp[64];
    file_name(name, sizeof name, ".maps");
    file_name(tmp, sizeof tmp, ".maps.tmp");
    d_unlink(tmp);
    struct fid id;
    fd = create_locked(tmp, &id);
    for (int i = 0; fd < 0 && errno == EEXIST && i < 8; i++) {
        /* another user's file there, which we may not remove (a sticky directory): a name
         * nobody can guess */
        char *d = tmp + my_strlen(file_name(tmp, sizeof tmp, ".maps.tmp."));
        *hexw(d, unguessable() & 0xffffffffffffull, 12) = 0;
        fd = create_locked(tmp, &id);
    }
    if (fd < 0)
        return;
    int bad = maps_write(fd, total);
    close(fd);
    if (bad || d_rename(tmp, name)) {
        d_unlink(tmp);
    } else {
        M.stale = loads_bad;
        g_maps_id = id;
    }
}

/* A new trace (under g_lock): its log of loads starts with every mapping. */
void maps_start_locked(const unsigned long long c[2], int claim)
{
    for (size_t i = 0; i < M.n; i++)
        M.ln[i].present = 0;
    maps_snapshot_locked(1, c, &claim);
    if (claim >= 0)
        close(claim);
}

/* The loader's counters are read before g_lock is taken: dl_iterate_phdr takes the loader's
 * lock, and a thread inside dlopen() may be waiting for g_lock in its malloc. */
unsigned long long g_got_adds;   /* loader's count of loads when slots were last set */

COLD void maps_snapshot(int force)
{
    unsigned long long c[2] = { 0, 0 };
    mml_each_object(phdr_counts, c);
    pthread_mutex_lock(&g_lock);
    maps_snapshot_locked(force, c, NULL);
    int patch = g_attached && g_state == 1 && c[0] != g_got_adds;
    g_got_adds = c[0];
    pthread_mutex_unlock(&g_lock);
    /* loaded into a running process: an object loaded since (by libc itself, or by a dlopen
     * that had to keep its caller's search path) gets its slots now */
    if (patch)
        mml_got_new_objects();
}

/* The log of loads is made with the trace id (reserve_id), or at its first line; a trace
 * that never unloaded anything ends without it, as it always did.  (Removed by name: if ours was removed and
 * another user's file put at the name, that one goes, which harms nobody.) */
void loads_drop_unused(void)
{
    char name[64];
    pthread_mutex_lock(&g_lock);
    if (!g_loads_used && !g_loads_later)
        d_unlink(file_name(name, sizeof name, ".loads"));
    g_loads_used = 1;       /* gone: never written again */
    g_loads_later = 0;
    pthread_mutex_unlock(&g_lock);
}

