/*
 * tracer/scanhere.c: the scan at exit of a process left with one thread, without starting a
 * program (mmleak-scan(7), "At the exit of a traced process").  Starting mmleak-scan costs a
 * new address space (execve, the static executable's start, its exit): about half of the
 * scan at a small program's exit (mmleak-performance-heap(7), "Start-up and exit without a new
 * address space").  Here the scan's own code (tools/scan*.c, compiled a second time into
 * mmleak.so with tools/scan_inproc.h) runs in a child made with CLONE_VM: a process of its
 * own (its pid, signals, descriptors, alarm), sharing the exiting process's memory, which it
 * reads with process_vm_readv as mmleak-scan does; the exiting thread waits for it with every
 * signal blocked, so nothing of the program runs meanwhile and no thread can appear.
 *
 * The child's memory is the process's: its stack and everything the scan allocates are
 * mml_map's mappings (listed in tracer/ownlist.h, left out of the roots), never the
 * program's heap (its state is the program's; a child killed in the middle of a malloc would
 * leave its lock held).  Cold code: once per process, at its exit; and at each
 * mmleak_leak_check of a process whose other threads are parked (tracer/park.c: ptrace
 * refused), the program going on after it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "../tools/scan_park.h"
#include "../tools/scan_roots.h"

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

/* tools/scan.c and tools/scan_main.c's, in mmleak.so's copy (tools/scan_inproc.h) */
int mmleak_scan_floor(int pid, const char *dir, const char *id, const char *why, char *out,
                      size_t outlen, char *err, size_t errlen, uint64_t *totals,
                      int floor_tid, uint64_t floor, int nfiles, const uint64_t *lone,
                      const struct mml_park *park);
unsigned mmleak_scan_secs(void);
void mmleak_scan_limits(void);

/* ---- the scan's memory: mml_map's only ----
 * A block: a header of 32 bytes, then the caller's bytes.  Small ones (under BIG) are cut
 * from chunks of CHUNK bytes and never given back one by one (a scan allocates few: all go
 * at its end, but the last one taken, given back at once); a big one is a mapping of its
 * own, unmapped by free.  BIG is above 64 KiB: the buffers of the maps and of the result's
 * header lines (64 KiB each) come from the first chunk, not two mappings made at every
 * exit. */
#define CHUNK ((size_t)1 << 20)
#define BIG ((size_t)128 << 10)
#define MAX_CHUNKS 4096
struct hdr { void *base; size_t maplen, size, pad; };

/* The scan at the exit: the process ends right after it, and its memory goes then, all
 * at once.  A munmap of each of the scan's mappings (its
 * window, its tables, its chunks, the child's stack), each a change of an address space
 * that two processes share, was 5 % of the samples of a small program's start-up and exit
 * under the tracer (mmleak-performance-heap(7), "Start-up and exit, the scan at exit's costs
 * counted").  So up to KEEP bytes of them stay mapped, and listed (tracer/ownlist.h:
 * mmleak-scan, if it runs after us, still leaves them out); past that they are unmapped as
 * ever (a big scan's gigabytes are not held to the end).  The scan a running program asked
 * for (mmleak_leak_check, its threads parked) keeps nothing: the program goes on. */
#define KEEP ((size_t)64 << 20)
static size_t kept;

static void sc_unmap(void *p, size_t n)
{
    if (n <= KEEP - kept) {
        kept += n;
        return;
    }
    mml_unmap(p, n);
}

static char *chunk_at, *chunk_end;
static void *chunks[MAX_CHUNKS];
static int nchunks;

static void *sc_alloc(size_t n, size_t align)
{
    if (n > ((size_t)1 << 46) || align > ((size_t)1 << 30))
        return NULL;
    size_t need = (n + 15) & ~(size_t)15;
    if (align <= 16 && need < BIG) {
        if ((size_t)(chunk_end - chunk_at) < need + sizeof(struct hdr)) {
            if (nchunks == MAX_CHUNKS)
                return NULL;
            char *c = mml_map(CHUNK);
            if (!c)
                return NULL;
            chunks[nchunks++] = c;
            chunk_at = c;
            chunk_end = c + CHUNK;
        }
        struct hdr *h = (struct hdr *)chunk_at;
        chunk_at += sizeof *h + need;
        h->base = NULL;
        h->size = n;
        return h + 1;
    }
    if (align < 16)
        align = 16;
    size_t pre = (sizeof(struct hdr) + align - 1) & ~(align - 1);
    size_t maplen = (pre + need + (align > 4096 ? align : 0) + 4095) & ~(size_t)4095;
    char *m = mml_map(maplen);
    if (!m)
        return NULL;
    uintptr_t p = ((uintptr_t)m + pre + align - 1) & ~(uintptr_t)(align - 1);
    struct hdr *h = (struct hdr *)p - 1;
    h->base = m;
    h->maplen = maplen;
    h->size = n;
    return (void *)p;
}

void *mml_sc_malloc(size_t n)
{
    return sc_alloc(n, 16);
}

void *mml_sc_calloc(size_t k, size_t n)
{
    if (n && k > SIZE_MAX / n)
        return NULL;
    void *p = sc_alloc(k * n, 16);     /* (a chunk's room may have been given back) */
    return p ? memset(p, 0, k * n) : NULL;
}

void mml_sc_free(void *p)
{
    if (!p)
        return;
    struct hdr *h = (struct hdr *)p - 1;
    if (h->base)
        sc_unmap(h->base, h->maplen);
    else if ((char *)p + ((h->size + 15) & ~(size_t)15) == chunk_at)
        chunk_at = (char *)h;           /* the last one taken (a buffer of a loop's turn) */
}

void *mml_sc_realloc(void *p, size_t n)
{
    if (!p)
        return sc_alloc(n, 16);
    struct hdr *h = (struct hdr *)p - 1;
    if (n <= h->size)
        return p;
    void *q = sc_alloc(n, 16);
    if (q) {
        memcpy(q, p, h->size);
        mml_sc_free(p);
    }
    return q;
}

int mml_sc_posix_memalign(void **out, size_t align, size_t n)
{
    void *p = sc_alloc(n, align);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

char *mml_sc_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = sc_alloc(n, 16);
    return d ? memcpy(d, s, n) : NULL;
}

int mml_sc_asprintf(char **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !(*out = sc_alloc((size_t)n + 1, 16)))
        return -1;
    va_start(ap, fmt);
    vsnprintf(*out, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return n;
}

/* Directories (the cut's listing, the tasks of /proc/PID/task): glibc's opendir takes its
 * buffer from malloc, the program's heap here.  These read them with getdents64 into a
 * buffer of ours; on 64-bit Linux glibc's struct dirent is the kernel's linux_dirent64, so
 * an entry is handed out where the kernel put it, as glibc's readdir does. */
struct sc_dir {
    int fd;
    size_t pos, len;
    char buf[8192] __attribute__((aligned(8)));
};
_Static_assert(sizeof(struct dirent) == 280 && offsetof(struct dirent, d_name) == 19,
               "struct dirent is linux_dirent64");

DIR *mml_sc_opendir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct sc_dir *d = sc_alloc(sizeof *d, 16);
    if (!d) {
        int e = errno;
        close(fd);
        errno = e ? e : ENOMEM;
        return NULL;
    }
    d->fd = fd;
    d->pos = d->len = 0;
    return (DIR *)d;
}

struct dirent *mml_sc_readdir(DIR *dir)
{
    struct sc_dir *d = (struct sc_dir *)dir;
    if (d->pos >= d->len) {
        long n = mml_sys(SYS_getdents64, d->fd, d->buf, sizeof d->buf);
        if (n <= 0)
            return NULL;        /* the end (errno kept) or an error (errno set) */
        d->len = (size_t)n;
        d->pos = 0;
    }
    struct dirent *e = (struct dirent *)(d->buf + d->pos);
    d->pos += e->d_reclen;
    return e;
}

int mml_sc_closedir(DIR *dir)
{
    struct sc_dir *d = (struct sc_dir *)dir;
    int r = close(d->fd);
    mml_sc_free(d);
    return r;
}

/* syscall() of the scan's files: the system call itself (tracer/internal.h, mml_sys) */
long mml_sc_syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    return mml_sys6(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* the scan maps anonymous memory only (its buffers, big tables) */
void *mml_sc_mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off)
{
    if (addr || fd != -1 || off || !(flags & MAP_ANONYMOUS) ||
        prot != (PROT_READ | PROT_WRITE)) {
        errno = EINVAL;
        return MAP_FAILED;
    }
    void *p = mml_map(n);
    return p ? p : MAP_FAILED;
}

int mml_sc_munmap(void *p, size_t n)
{
    sc_unmap(p, n);
    return 0;
}

/* grown by a copy into a mapping of ours (the live set's arrays, doubling: the copies add
 * up to the last size) */
void *mml_sc_mremap(void *p, size_t n, size_t nn, int flags, ...)
{
    (void)flags;
    void *q = mml_map(nn);
    if (!q)
        return MAP_FAILED;
    memcpy(q, p, n < nn ? n : nn);
    sc_unmap(p, n);
    return q;
}

/* glibc's qsort may take its buffer from malloc (the program's heap here): a heapsort */
static void swap_bytes(char *a, char *b, size_t n)
{
    while (n--) {
        char t = *a;
        *a++ = *b;
        *b++ = t;
    }
}

static void sift(char *b, size_t r, size_t end, size_t w,
                 int (*cmp)(const void *, const void *))
{
    for (size_t c; (c = 2 * r + 1) < end; r = c) {
        if (c + 1 < end && cmp(b + c * w, b + (c + 1) * w) < 0)
            c++;
        if (cmp(b + r * w, b + c * w) >= 0)
            return;
        swap_bytes(b + r * w, b + c * w, w);
    }
}

void mml_sc_qsort(void *base, size_t n, size_t w, int (*cmp)(const void *, const void *))
{
    char *b = base;
    if (n < 2)
        return;
    for (size_t i = n / 2; i-- > 0;)
        sift(b, i, n, w, cmp);
    for (size_t end = n - 1; end > 0; end--) {
        swap_bytes(b, b + end * w, w);
        sift(b, 0, end, w, cmp);
    }
}

static void release_all(void)
{
    for (int i = 0; i < nchunks; i++)
        sc_unmap(chunks[i], CHUNK);
    nchunks = 0;
    chunk_at = chunk_end = NULL;
}

/* ---- glibc's struct pthread, as the process's loader has libc.so.6 ----
 * The scan needs it when a thread was joined (its stack waits in glibc's cache: not a root);
 * mmleak-scan reads it from the file (tools/scan_roots.c: two opens through /proc, 11 reads,
 * 17 system calls at the exit of such a program).  Here, before the scan, the same three
 * _thread_db_* symbols are looked up in the object's own GNU hash table and symbols, as the
 * loader mapped them, and the same checks made; the scan takes the result for the mapping
 * at the object's start (mml_here_layout), the file otherwise. */
static struct { uint64_t lo; struct mml_pthread_layout l; int ok; } g_layout;

/* DT_* pointer of the object at BASE: glibc's loader relocates them in place (most ports),
 * others leave them file-relative */
static uintptr_t dyn_ptr(uintptr_t base, uintptr_t p)
{
    return p && p < base ? p + base : p;
}

static const ElfW(Sym) *gnu_find(const uint32_t *gh, const ElfW(Sym) *sym, const char *str,
                                 size_t strsz, const char *name)
{
    uint32_t nb = gh[0], off = gh[1], nbloom = gh[2];
    if (!nb)
        return NULL;
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(gh + 4) + nbloom);
    const uint32_t *chain = buckets + nb;
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = h * 33 + *c;
    uint32_t i = buckets[h % nb];
    if (i < off)
        return NULL;
    for (;; i++) {
        uint32_t ch = chain[i - off];
        if ((ch | 1) == (h | 1) && sym[i].st_name < strsz && sym[i].st_shndx != SHN_UNDEF &&
            !strcmp(str + sym[i].st_name, name))
            return &sym[i];
        if (ch & 1)
            return NULL;
    }
}

static int layout_of_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    const char *b = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    if (!b || (strncmp(b, "/libc.so.", 9) && strncmp(b, "/libpthread.so.", 15)))
        return 0;
    uintptr_t base = info->dlpi_addr, lo = UINTPTR_MAX;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && base + (ph->p_vaddr & ~(uintptr_t)4095) < lo)
            lo = base + (ph->p_vaddr & ~(uintptr_t)4095);
        if (ph->p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
    }
    uintptr_t gh = 0, sym = 0, str = 0, strsz = 0;
    for (; dyn && dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_GNU_HASH)
            gh = dyn_ptr(base, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_SYMTAB)
            sym = dyn_ptr(base, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRTAB)
            str = dyn_ptr(base, dyn->d_un.d_ptr);
        else if (dyn->d_tag == DT_STRSZ)
            strsz = dyn->d_un.d_val;
    }
    if (!gh || !sym || !str || lo == UINTPTR_MAX)
        return 0;
    uint32_t got[3][3];
    for (int k = 0; k < 3; k++) {
        const ElfW(Sym) *y = gnu_find((const uint32_t *)gh, (const ElfW(Sym) *)sym,
                                      (const char *)str, strsz, mml_pthread_symbols[k]);
        if (!y || y->st_size < (k ? 12u : 4u))
            return 0;
        memcpy(got[k], (const void *)(base + y->st_value), k ? 12 : 4);
    }
    if (mml_pthread_layout_of(got, &g_layout.l))
        return 0;
    g_layout.lo = lo;
    g_layout.ok = 1;
    return 1;
}

int mml_here_layout(uint64_t lo, struct mml_pthread_layout *l)
{
    if (!g_layout.ok || g_layout.lo != lo)
        return -1;
    *l = g_layout.l;
    return 0;
}

/* ---- the child ---- */
struct here {
    int pid, tid, nfiles;
    const char *dir, *id, *why;
    uint64_t floor, lone[3];
    const struct mml_park *park;        /* the other threads, parked (park.c), or NULL */
    int go;                             /* set (and woken) once we may read the process */
    char err[512];                      /* why no result was written (the child's, status 3) */
};

#define STACK ((size_t)1 << 20)

static int child_main(void *arg)
{
    struct here *h = arg;
    /* the process's descriptors are not ours to hold (a copy of its table: a daemon's
     * sockets would outlive it if it were killed during the scan) */
    mml_sys(SYS_close_range, 3, ~0u, 0);
    /* every signal stays blocked (a handler of the program's must not run here, in its
     * memory), but SIGALRM, whose default action is our time limit, as mmleak-scan's;
     * a fault is still fatal (the kernel unblocks it) */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGALRM, &dfl, NULL);
    uint64_t alrm = (uint64_t)1 << (SIGALRM - 1), all = ~alrm;
    mml_sys(SYS_rt_sigprocmask, SIG_SETMASK, &all, NULL, sizeof all);
    mmleak_scan_limits();
    alarm(mmleak_scan_secs());
    /* Yama (ptrace_scope 1) lets us read the process once it named us (PR_SET_PTRACER);
     * (the alarm first: a process killed before it said go leaves no child waiting) */
    while (!__atomic_load_n(&h->go, __ATOMIC_ACQUIRE))
        mml_sys(SYS_futex, &h->go, FUTEX_WAIT, 0, NULL, NULL, 0);
    char out[4200], err[512];
    uint64_t totals[8] = { 0 };
    int rc = mmleak_scan_floor(h->pid, h->dir, h->id, h->why, out, sizeof out, err,
                               sizeof err, totals, h->tid, h->floor, h->nfiles, h->lone,
                               h->park);
    release_all();
    if (rc < 0) {                       /* as mmleak-scan says it */
        /* and to the exiting process (our memory is its): its dump file keeps the reason,
         * which a daemon's user never sees on stderr (exitscan.c, note_scan_error) */
        memcpy(h->err, err, sizeof h->err);
        h->err[sizeof h->err - 1] = 0;
        char m[600];
        int n = snprintf(m, sizeof m, "mmleak-scan: %s\n", err);
        if (n > 0 && write(2, m, (size_t)n < sizeof m ? (size_t)n : sizeof m - 1) < 0) {
            /* (nowhere else to say it) */
        }
    }
    mml_sys(SYS_exit_group, rc ? (rc < 0 ? 3 : 2) : totals[0] || totals[2] ? 1 : 0);
    return 0;
}

/* 1: the scan may not hand over to mmleak-scan (tools/scan_live.c, mmleak_cpu_to_spare):
 * the other threads are parked because mmleak-scan could not stop them. */
int mml_here_stays;

/* The scan WHY of this process, its thread TID alone, or the others parked (PARK:
 * tracer/park.c, here), and waiting below FLOOR (SP FS GS: LONE), in a child of ours that
 * shares our memory; the caller blocked every signal.  The child's exit status
 * (mmleak-scan's: 0 done, 1 leaks, 2 could not scan, 3 no result: ERR, ERRLEN bytes, then
 * says why), -1 when it did not end by itself, -2 when it could not be started
 * (mmleak-scan may be). */
COLD int mml_scan_here(const char *why, int tid, uintptr_t floor, int nfiles,
                       const uint64_t lone[3], int park, char *err, size_t errlen)
{
    static struct here h;               /* (in our .bss, which the scan leaves out) */
    memset(&h, 0, sizeof h);
    h.pid = getpid();
    h.why = why;
    h.tid = tid;
    h.nfiles = nfiles;
    h.dir = cfg.dir;
    h.id = g_id;
    h.floor = floor;
    memcpy(h.lone, lone, sizeof h.lone);
    mml_here_stays = park;
    g_layout.ok = 0;
    kept = strcmp(why, "exit") ? KEEP : 0;      /* (the budget spent: nothing kept) */
    /* before the others are parked: the loader's lock (dl_iterate_phdr's) may be held by
     * one of them, which would then wait for us */
    mml_each_object(layout_of_object, NULL);
    char *stack = mml_map(STACK);
    if (!stack)
        return -2;
    mprotect(stack, 4096, PROT_NONE);   /* an overflow faults, never writes below */
    if (park)
        h.park = mml_park_others();
    pid_t child = clone(child_main, stack + STACK, CLONE_VM | SIGCHLD, &h);
    int api = strcmp(why, "exit") != 0;
    if (child < 0) {
        if (park)
            mml_unpark(api);
        mml_unmap(stack, STACK);
        return -2;
    }
    /* (no Yama: EINVAL, and nothing to take back after) */
    int named = !mml_sys(SYS_prctl, PR_SET_PTRACER, (unsigned long)child, 0, 0, 0);
    __atomic_store_n(&h.go, 1, __ATOMIC_RELEASE);
    mml_sys(SYS_futex, &h.go, FUTEX_WAKE, 1, NULL, NULL, 0);
    int st = 0;
    pid_t r;
    while ((r = waitpid(child, &st, 0)) < 0 && errno == EINTR)
        ;
    if (park)
        mml_unpark(api);
    if (named)
        mml_sys(SYS_prctl, PR_SET_PTRACER, 0, 0, 0, 0);
    sc_unmap(stack, STACK);
    release_all();                      /* (ours: a child killed left them) */
    if (r != child || !WIFEXITED(st))
        return -1;
    if (WEXITSTATUS(st) == 3 && errlen) {
        size_t n = strnlen(h.err, sizeof h.err - 1);
        n = n < errlen ? n : errlen - 1;
        memcpy(err, h.err, n);
        err[n] = 0;
    }
    /* 4: the scan would start a thread (a big trace or heap, a CPU idle): mmleak-scan
     * (never with PARK: mml_here_stays) */
    return WEXITSTATUS(st) == 4 ? -2 : WEXITSTATUS(st);
}
