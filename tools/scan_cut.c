/* tools/scan_cut.c: the reachability scan's cut of the trace (steps 1, 3 and 4 of
 * tools/scan.c): the trace's directory lock taken for reading, every file of the trace
 * opened and held while the threads are stopped (the dump files' sizes, the staging lines
 * they lack, what a compacted result says it folded), then the live set of exactly those
 * bytes (tools/scan_live.c).  Separate because this file alone reads the dump directory:
 * it knows the trace's file names and the compaction's lock, nothing of the process. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tracer/compiler.h"
#include <sys/file.h>

#include "scan_int.h"
#include "scan_live.h"

#define TAIL_MAX ((size_t)1 << 30)      /* a staging file bigger than this is not one */

/* ---- 2. the cut ------------------------------------------------------------------ */

static int name_is(const char *n, const char *id, const char *suffix, uint64_t *num)
{
    size_t il = strlen(id);
    if (strncmp(n, "mmleak.", 7) || strncmp(n + 7, id, il) || n[7 + il] != '.')
        return 0;
    const char *p = n + 8 + il;
    if (!suffix) {                      /* N.out */
        if (*p < '0' || *p > '9')
            return 0;
        char *end;
        *num = strtoull(p, &end, 10);
        return !strcmp(end, ".out");
    }
    return !strcmp(p, suffix);
}

/* mmleak.ID.compact.N, a newer run of the trace's result (N: 1 to 9 digits; the readers'
 * RUN_RE, mmleaklib/files.py) */
static int run_is(const char *n, const char *id, uint64_t *num)
{
    size_t il = strlen(id);
    if (strncmp(n, "mmleak.", 7) || strncmp(n + 7, id, il) || strncmp(n + 7 + il, ".compact.", 9))
        return 0;
    const char *p = n + 16 + il;
    size_t k = strspn(p, "0123456789");
    if (k < 1 || k > 9 || p[k])
        return 0;
    *num = strtoull(p, NULL, 10);
    return 1;
}

/* The names the result or run open at FD says it folded: its "#folded NAME" lines, among
 * its first lines (those starting with '#', up to the first stack "#s "), that name a dump
 * file or a run of trace ID (whatever else they say: mmleaklib/files.py,
 * _previously_folded).  A pass that stopped after writing it and before deleting its inputs
 * left them: they are in it already.  Appended to *NAMES (*NN of them).  -1: out of memory. */
static int read_folded(int fd, const char *id, char ***names, int *nn)
{
    size_t cap = 1 << 16, have = 0;
    char *buf = malloc(cap);
    if (!buf)
        return -1;
    off_t off = 0;
    for (;;) {
        ssize_t got = pread(fd, buf + have, cap - have, off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        off += got;
        have += (size_t)got;
        char *p = buf, *e = buf + have, *nl;
        int done = 0;
        while ((nl = memchr(p, '\n', (size_t)(e - p)))) {
            if (*p != '#' || (nl - p >= 3 && !memcmp(p, "#s ", 3))) {
                done = 1;
                break;
            }
            if (nl - p > 8 && !memcmp(p, "#folded ", 8)) {
                *nl = 0;
                uint64_t num;
                const char *name = p + 8;
                if (name_is(name, id, NULL, &num) || run_is(name, id, &num)) {
                    char **n = realloc(*names, (size_t)(*nn + 1) * sizeof *n);
                    char *d = n ? strdup(name) : NULL;
                    if (n)
                        *names = n;
                    if (!d) {
                        free(buf);
                        return -1;
                    }
                    n[(*nn)++] = d;
                }
            }
            p = nl + 1;
        }
        if (done || (p == buf && have == cap && cap >= ((size_t)16 << 20)))
            break;                      /* the stacks, or a first line of 16 MiB: no more */
        have -= (size_t)(p - buf);
        memmove(buf, p, have);
        if (have == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                return -1;
            }
            buf = b;
            cap *= 2;
        }
    }
    free(buf);
    return 0;
}

/* the order of the readers (mmleaklib/files.py, find_traces): the result, its runs by N,
 * the dump files by N */
static int cut_order(const void *a, const void *b)
{
    const struct cutf *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank - y->rank;
    return (x->num > y->num) - (x->num < y->num);
}

static char *path_in(struct scan *s, const char *name)
{
    char *p;
    if (asprintf(&p, "%s/%s", s->dir, name) < 0)
        return NULL;
    return p;
}

/* Open a file of the trace: a regular file of UID or root, never through a link. */
static int open_own(const char *path, uid_t uid, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) || !S_ISREG(st->st_mode) || (st->st_uid != uid && st->st_uid != 0)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

/* The owner of the trace's .maps, or our euid when it has none (found 0): looked up once a
 * scan (the lock, the cut and the result ask; the traced process is held meanwhile). */
uid_t trace_owner(struct scan *s)
{
    if (!s->owner_known) {
        char name[300];
        snprintf(name, sizeof name, "mmleak.%s.maps", s->id);
        char *p = path_in(s, name);
        struct stat st;
        s->owner_found = p && !lstat(p, &st);
        s->owner_uid = s->owner_found ? st.st_uid : geteuid();
        s->owner_gid = s->owner_found ? st.st_gid : getegid();
        s->owner_known = 1;
        free(p);
    }
    return s->owner_uid;
}

/* A lock of byte 0 of the lock file FD, an open file description's (F_OFD_SETLK): TYPE
 * F_RDLCK, F_WRLCK or F_UNLCK.  0, or -1 (errno). */
static int dir_lock(int fd, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

int lock_exists(struct scan *s)
{
    char name[300];
    snprintf(name, sizeof name, "mmleak.%s.lock", s->id);
    char *p = path_in(s, name);
    struct stat st;
    int there = p && !lstat(p, &st);
    free(p);
    return there;
}

/* The trace's directory lock, for reading, while the cut is listed and opened (take_cut):
 * a compaction pass takes it for writing around each rename of a result or run and each
 * deletion of what it folded (mmleaklib/compact.py, TraceLock.changing; mmleak-compaction(7)),
 * so that the files the cut holds are the trace as a kill of that pass at that moment would
 * leave it.  The pass's own lock (the flock) is not waited for: the files are held open, and
 * a pass goes on meanwhile.  No lock file: no compactor ever ran (*NOLOCK; take_cut looks
 * again after the cut).  An empty one (mmleak.so makes it with the trace's id, so that no
 * other user's file can stand at its name, where others can write; a compactor makes it
 * empty too): no pass ever
 * changed the trace's files, since a pass marks it (one byte) under the directory lock
 * before its first change, and none can while we hold it (*NOLOCK too). */
int take_lock(struct scan *s)
{
    char name[300];
    snprintf(name, sizeof name, "mmleak.%s.lock", s->id);
    char *p = path_in(s, name);
    struct stat st;
    s->lockfd = p ? open_own(p, trace_owner(s), &st) : -1;
    int gone = s->lockfd < 0 && errno == ENOENT;
    free(p);
    if (s->lockfd < 0) {
        s->nolock = gone;
        return gone ? 0 : say(s, "cannot open the trace's lock file: %s", strerror(errno));
    }
    int64_t until = mono_ns() + 30 * 1000000000LL;
    while (dir_lock(s->lockfd, F_RDLCK)) {
        if (errno != EAGAIN && errno != EACCES && errno != EINTR)
            return say(s, "cannot lock the trace's lock file: %s", strerror(errno));
        if (mono_ns() > until)
            return say(s, "the trace's directory lock is held by a compaction pass for 30 s");
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    s->nolock = !fstat(s->lockfd, &st) && st.st_size == 0;
    return 0;
}

void drop_lock(struct scan *s)
{
    if (s->lockfd >= 0) {
        dir_lock(s->lockfd, F_UNLCK);
        close(s->lockfd);
        s->lockfd = -1;
    }
}

/* The lines of a staging file (mmleak-format(5): two halves, each "#at OFFSET" and lines up
 * to a NUL), PART[k] the first LEN[k] bytes of half k (read_half), that its .out (HAVE
 * bytes) lacks, in order, to OUT (room for LEN[0] + LEN[1] bytes). */
static size_t tail_lines(char *const part[2], const size_t len[2], uint64_t have, char *out)
{
    struct { uint64_t off; const char *body; size_t len; } h[2];
    int nh = 0;
    for (int k = 0; k < 2; k++) {
        const char *a = part[k], *b = part[k] + len[k];
        if (!a || b - a < 21 || memcmp(a, "#at ", 4))
            continue;
        char hex[17], *end;
        memcpy(hex, a + 4, 16);
        hex[16] = 0;
        uint64_t off = strtoull(hex, &end, 16);
        if (end != hex + 16)
            continue;
        const char *e = a + 20;
        while (e < b && *e == ' ')
            e++;
        if (e >= b || *e != '\n')
            continue;
        const char *body = e + 1;
        const char *nul = memchr(body, 0, (size_t)(b - body));
        h[nh].off = off;
        h[nh].body = body;
        h[nh].len = (size_t)((nul ? nul : b) - body);
        nh++;
    }
    if (nh == 2 && h[1].off < h[0].off) {
        __typeof__(h[0]) t = h[0];
        h[0] = h[1];
        h[1] = t;
    }
    size_t w = 0;
    for (int k = 0; k < nh; k++) {
        if (h[k].off + h[k].len <= have)
            continue;
        size_t skip = have > h[k].off ? (size_t)(have - h[k].off) : 0;
        memcpy(out + w, h[k].body + skip, h[k].len - skip);
        w += h[k].len - skip;
        have = h[k].off + h[k].len;
    }
    return w;
}

/* Half K of the staging file FD (SIZE bytes) up to its first NUL, or whole: its lines begin
 * at its start and zeros follow them, so it is read 4 KiB first, then twice as much each
 * time until a NUL shows (a small program's staging file, 64 KiB, holds a few hundred
 * bytes of lines at exit: reading it whole was a copy of 64 KiB and 16 pages faulted in).
 * The bytes read (*N of them, malloc'd), or NULL (no memory). */
static char *read_half(int fd, uint64_t size, int k, size_t *n)
{
    uint64_t half = size / 2, at = k ? half : 0, end = k ? size : half;
    size_t cap = 0, got = 0;
    char *b = NULL;
    *n = 0;
    while (at + got < end) {
        size_t want = cap ? 2 * cap : 4096;
        if (want > end - at)
            want = (size_t)(end - at);
        char *nb = realloc(b, want);
        if (!nb) {
            free(b);
            return NULL;
        }
        b = nb;
        cap = want;
        ssize_t r = pread(fd, b + got, cap - got, (off_t)(at + got));
        if (r <= 0)
            break;                      /* (cut short since: what there is) */
        int nul = memchr(b + got, 0, (size_t)r) != NULL;
        got += (size_t)r;
        if (nul)
            break;
    }
    *n = got;
    return b;
}

void free_cut(struct scan *s)
{
    for (int i = 0; i < s->ncf; i++) {
        free(s->cf[i].path);
        free(s->cf[i].tail);
        if (s->cf[i].fd >= 0)
            close(s->cf[i].fd);
    }
    free(s->cf);
    s->cf = NULL;
    s->ncf = 0;
    s->open_files = 0;
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* File NAME of the directory, if it is one of the trace's (its result, a run, a dump
 * file), opened and held in the cut (a dump file: its size and staging lines; a result or
 * run: what it says it folded, to *FOLDED).  0 (taken, or not the trace's, or gone: then
 * *GONE is set, if GONE), -1 (said why). */
static int cut_file(struct scan *s, const char *name, uid_t owner, char ***folded,
                    int *nfolded, int *gone)
{
    uint64_t num = 0;
    int rank = 0;
    int compact = name_is(name, s->id, "compact", &num);
    if (!compact && run_is(name, s->id, &num))
        compact = rank = 1;
    else if (!compact && name_is(name, s->id, NULL, &num))
        rank = 2;
    else if (!compact)
        return 0;
    char *p = path_in(s, name);
    struct stat st;
    int fd = p ? open_own(p, owner, &st) : -1;
    if (fd < 0) {
        int why = p ? errno : ENOMEM;
        free(p);
        if (why == ENOENT && gone)
            *gone = 1;
        if (why == ENOENT || why == EPERM || why == ELOOP || why == EACCES)
            return 0;                   /* gone, or not the trace's file: not read */
        return say(s, "cannot open %s in %s: %s", name, s->dir, strerror(why));
    }
    struct cutf *n = realloc(s->cf, (size_t)(s->ncf + 1) * sizeof *n);
    if (!n || (compact && read_folded(fd, s->id, folded, nfolded))) {
        if (n)
            s->cf = n;
        close(fd);
        free(p);
        return say(s, "out of memory");
    }
    s->cf = n;
    struct cutf *c = &s->cf[s->ncf++];
    memset(c, 0, sizeof *c);
    c->path = p;
    c->compact = compact;
    c->rank = rank;
    c->num = num;
    c->size = (uint64_t)st.st_size;
    c->fd = fd;
    char end[5];
    c->ended = c->size >= 5 && pread(fd, end, 5, (off_t)c->size - 5) == 5 &&
               !memcmp(end, "#end\n", 5);
    if (compact || c->ended)
        return 0;
    char *tp;
    if (asprintf(&tp, "%.*s.tail", (int)(strlen(p) - 4), p) < 0)
        return 0;
    int tfd = open_own(tp, owner, &st);
    free(tp);
    if (tfd < 0)
        return 0;
    if (st.st_size > 0 && (size_t)st.st_size <= TAIL_MAX) {
        char *part[2];
        size_t len[2];
        part[0] = read_half(tfd, (uint64_t)st.st_size, 0, &len[0]);
        part[1] = read_half(tfd, (uint64_t)st.st_size, 1, &len[1]);
        c->tail = part[0] && part[1] ? malloc(len[0] + len[1] + 1) : NULL;
        c->tlen = c->tail ? tail_lines(part, len, c->size, c->tail) : 0;
        free(part[0]);
        free(part[1]);
    }
    close(tfd);
    return 0;
}

/* mmleak.so numbers its dump files from 0, one a thread file (they are reused), and jumps
 * 65536 or more past names others took: a directory is listed past this many */
#define CUT_BY_NAME_MAX 64

/* The trace's files, by their names.  Listed from the directory; or, when no compactor ever
 * ran (no lock file: S->nolock) and mmleak.so said its dump files are numbered below
 * S->nfiles (its scan at exit, or at the program's request), opened by name,
 * mmleak.ID.0.out to mmleak.ID.(nfiles - 1).out: only a compaction pass makes the other
 * files of a trace (its result and runs), and one that begins meanwhile has the cut taken
 * again, listed (mmleak_scan_floor).  One of those names gone is listed too: a compactor
 * older than the mark of the lock (mmleak.py before round 6 of the hostile users, still
 * running across an upgrade) folds and deletes files and leaves the lock empty; the blocks
 * of the files it folded would be missing from the cut, and what they point to taken for
 * lost.  Listing costs about 1 us an entry on the 2-core VM:
 * a directory where a test suite's thousands of programs leave their traces made every
 * exit scan read all of their names.  Either way the files mmleak.so made are opened, and
 * each the same way. */
int take_cut(struct scan *s)
{
    uid_t owner = trace_owner(s);
    char **folded = NULL;
    int nfolded = 0;
    int listed = 1;
    if (s->nolock && s->nfiles > 0 && s->nfiles <= CUT_BY_NAME_MAX) {
        if (unlikely(scan_debug > 0))
            scan_dbg("mmleak-scan: cut by name: %d dump files at most\n", s->nfiles);
        int gone = 0;
        for (int i = 0; i < s->nfiles && !gone; i++) {
            char name[300];
            snprintf(name, sizeof name, "mmleak.%s.%d.out", s->id, i);
            if (cut_file(s, name, owner, &folded, &nfolded, &gone)) {
                free_names(folded, nfolded);
                return -1;
            }
        }
        listed = gone;
        if (gone) {
            if (unlikely(scan_debug > 0))
                scan_dbg("mmleak-scan: a dump file is gone: the cut is listed\n");
            free_cut(s);
            free_names(folded, nfolded);
            folded = NULL;
            nfolded = 0;
        }
    }
    if (listed) {
        DIR *d = opendir(s->dir);
        if (!d)
            return say(s, "cannot list %s: %s", s->dir, strerror(errno));
        struct dirent *e;
        while ((e = readdir(d)))
            if (cut_file(s, e->d_name, owner, &folded, &nfolded, NULL)) {
                closedir(d);
                free_names(folded, nfolded);
                return -1;
            }
        closedir(d);
    }
    /* what a result or run names as folded is in it already: left out, as the readers do */
    int k = 0;
    for (int i = 0; i < s->ncf; i++) {
        struct cutf *c = &s->cf[i];
        const char *base = strrchr(c->path, '/') + 1;
        int gone = 0;
        for (int j = 0; j < nfolded && !gone; j++)
            gone = !strcmp(folded[j], base);
        if (gone) {
            free(c->path);
            free(c->tail);
            close(c->fd);
            continue;
        }
        if (!c->compact && !c->ended)
            s->open_files++;
        s->cf[k++] = *c;
    }
    s->ncf = k;
    if (unlikely(scan_debug > 0))
        for (int i = 0; i < k; i++)
            scan_dbg("mmleak-scan: cut %s: %llu bytes and %zu of its staging file\n",
                    s->cf[i].path, (unsigned long long)s->cf[i].size, s->cf[i].tlen);
    free_names(folded, nfolded);
    qsort(s->cf, (size_t)s->ncf, sizeof *s->cf, cut_order);
    if (!s->ncf)
        return say(s, "trace %s has no dump file in %s", s->id, s->dir);
    if (!s->open_files)
        return say(s, "trace %s has ended (every dump file says #end): the process exec'd or "
                   "ended before the scan, or could not create its next dump file (see its "
                   "\"cannot create\" line)", s->id);
    return 0;
}

/* ---- 3. the live set of the cut (tools/scan_live.c) ------------------------------- */

static struct scan *g_s;                /* for the engine's callbacks (one scan at a time) */

/* Input I of the live set: the file held since the cut, its first SIZE bytes followed by
 * its staging lines (a line may begin in one and end in the other), read in place (the
 * engine closes it); a result or run is sorted (its lines in address order). */
static int cut_input(int i, struct mmleak_input *in)
{
    struct scan *s = g_s;
    struct cutf *c = &s->cf[i];
    if (c->fd < 0)
        return -1;
    in->fd = c->fd;
    c->fd = -1;
    in->limit = c->size;
    in->tail = c->tail;
    in->tlen = c->tlen;
    in->sorted = c->compact;
    return 0;
}

int live_set(struct scan *s)
{
    struct mmleak_live lv;
    g_s = s;
    int rc = mmleak_live_set(s->ncf, cut_input, &lv);
    if (rc)
        return say(s, rc == -1 ? "out of memory reading the trace" :
                   "the trace's files could not all be read");
    s->attached = lv.attached;
    s->glibc = lv.glibc;
    s->nb = lv.n;
    s->bp = lv.ptr;
    s->bs = lv.size;
    s->bq = lv.seq;
    s->st = mmleak_big_alloc(s->nb + 1);
    s->pend = mmleak_big_alloc(s->nb + 1);
    s->stack = mmleak_big_alloc((s->nb + 1) * sizeof *s->stack);
    if (!s->st || !s->pend || !s->stack)
        return say(s, "out of memory for %zu blocks", s->nb);
    memset(s->st, UNREACHED, s->nb + 1);
    memset(s->pend, 0, s->nb + 1);
    s->lo = s->nb ? s->bp[0] : 1;
    s->hi = 0;
    for (size_t i = 0; i < s->nb; i++) {
        uint64_t end = s->bp[i] + (s->bs[i] ? s->bs[i] : 1);
        if (end > s->hi)
            s->hi = end;
    }
    page_index(s);
    return 0;
}

