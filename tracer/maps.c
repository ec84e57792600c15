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
#include <sys/stat.h>
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
int g_loads_used;                     /* a line was written to it */

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
            fd = open_again(file_name(name, sizeof name, ".loads"), O_WRONLY | O_APPEND,
                            &g_loads_id);
            if (fd < 0)
                return -1;
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
    dl_iterate_phdr(phdr_counts, c);
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

/* The log of loads is made with the trace id (reserve_id); a trace that never unloaded
 * anything ends without it, as it always did.  (Removed by name: if ours was removed and
 * another user's file put at the name, that one goes, which harms nobody.) */
void loads_drop_unused(void)
{
    char name[64];
    pthread_mutex_lock(&g_lock);
    if (!g_loads_used)
        d_unlink(file_name(name, sizeof name, ".loads"));
    g_loads_used = 1;       /* gone: never written again */
    pthread_mutex_unlock(&g_lock);
}

