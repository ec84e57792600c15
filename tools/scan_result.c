/* tools/scan_result.c: the result file of a reachability scan, mmleak.ID.scan.N (its
 * format: mmleak-format(5), "The scan result"): header lines, then three sections of LEB128
 * numbers (the blocks' address deltas, their numbers, their kinds run-length coded), written
 * to a hidden temporary file and linked to the first free name, so that a reader never sees
 * a file in the making. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "scan_int.h"
#include "../tracer/unguessable.h"

/* how the other threads were held: PTRACE_SEIZE, none (the asking thread alone), or
 * mmleak.so's signal (tracer/park.c) */
const char *const HELD_NAME[3] = { "ptrace", "alone", "signal" };
const char *const KIND_NAME[4] = { "definite", "indirect", "possible", "reachable" };
const char *const ROOT_NAME[R_KINDS] = { "object", "anon", "stack", "register", "tls",
                                         "untraced-heap", "file" };

struct wbuf { char *p; size_t n, cap; int oom; };

static void wput(struct wbuf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 1 << 16;
        while (c < b->n + n)
            c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static __attribute__((format(printf, 2, 3))) void wprintf(struct wbuf *b, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0)
        wput(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* V in unsigned LEB128 at P; past it */
static inline unsigned char *leb(unsigned char *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

#define SMALL_DATA ((size_t)64 << 10)

static void free_data(unsigned char *m, size_t cap)
{
    if (cap <= SMALL_DATA)
        free(m);
    else
        munmap(m, cap);
}

/* The data's three sections (mmleak-format(5)), each its length (8 bytes, little-endian)
 * then its LEB128 numbers, encoded straight into one mapping big enough for the worst case
 * (10 bytes a number; only the pages written are touched): the blocks' addresses (each the
 * difference from the one before), their numbers, and the runs of their kinds (kind,
 * length).  Sets *LEN[k], *SEC[k]; returns the mapping (of *MAPLEN bytes), or NULL. */
static unsigned char *encode_data(struct scan *s, unsigned char *sec[3], size_t len[3],
                                  size_t *maplen)
{
    size_t cap = 8 * 3 + (size_t)10 * 4 * (s->nb + 1);
    /* a small one from the heap: no mapping made and unmapped at every exit */
    unsigned char *m = cap <= SMALL_DATA ? malloc(cap) :
                       mmap(NULL, cap, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!m || m == MAP_FAILED)
        return NULL;
    unsigned char *p = m;
    uint64_t prev = 0;
    sec[0] = p;
    for (size_t i = 0; i < s->nb; i++) {
        p = leb(p, s->bp[i] - prev);
        prev = s->bp[i];
    }
    sec[1] = p;
    for (size_t i = 0; i < s->nb; i++)
        p = leb(p, s->bq[i]);
    sec[2] = p;
    for (size_t i = 0; i < s->nb;) {
        size_t j = i;
        while (j < s->nb && s->st[j] == s->st[i])
            j++;
        p = leb(p, s->st[i]);
        p = leb(p, j - i);
        i = j;
    }
    len[0] = (size_t)(sec[1] - sec[0]);
    len[1] = (size_t)(sec[2] - sec[1]);
    len[2] = (size_t)(p - sec[2]);
    *maplen = cap;
    return m;
}

/* The number N of the K-th name (from 0) a scan's file tries, mmleak.ID.scan.N (or
 * .scan-debug.N): the first free of 1 to 64, as readers and people expect; past those, a
 * number from 65536 on that nobody can guess.  Another user can create files at every
 * name a trace will use: 99,999 of them made the scan at exit give up after as many
 * link() calls, 0.55 s later, with no result (they are skipped as taken, not read: they
 * are not the trace's owner's). */
uint64_t scan_name_number(int k)
{
    return k < SCAN_NAME_FIRST ? (uint64_t)k + 1 : 65536 + unguessable() % (1ull << 40);
}

void scan_file_owner(struct scan *s, int fd)
{
    struct stat st;
    /* 0600 whatever the process's umask (0777 would leave it 0000: unreadable to its
     * owner), as the tracer's own files */
    if (!fstat(fd, &st) && (st.st_mode & 0777) != 0600)
        fchmod(fd, 0600);
    if (trace_owner(s) != geteuid() && s->owner_found)
        if (fchown(fd, s->owner_uid, s->owner_gid)) {
            /* the file stays ours: readers take root's and the owner's */
        }
}

/* The N pieces of IOV to FD, in one writev when it takes them all: 0, or -1 (IOV is
 * consumed) */
static int write_all(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t k = writev(fd, iov, n);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return -1;
        }
        while (n > 0 && (size_t)k >= iov->iov_len) {
            k -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
    return 0;
}

int scan_write_result(struct scan *s, char *out, size_t outlen)
{
    struct wbuf b = { 0 };
    unsigned char *data = NULL, *sec[3];
    size_t len[3], maplen = 0;
    wprintf(&b, "#mmleak-scan 1 id=%s pid=%d\n", s->id, s->pid);
    wprintf(&b, "#when %s time=%.6f by=mmleak-scan\n", s->why, s->when);
    if (s->failed) {
        char clean[512];
        snprintf(clean, sizeof clean, "%s", s->err);
        for (char *c = clean; *c; c++)
            if (*c == '\n' || (unsigned char)*c < ' ')
                *c = ' ';
        wprintf(&b, "#status unknown %s\n", clean);
    } else {
        wprintf(&b, "#status done\n#attached %d\n", s->attached);
        int live = 0;
        for (int t = 0; t < s->nth; t++)
            live += s->th[t].tid > 0;
        wprintf(&b, "#threads %d\n", live);
        wprintf(&b, "#stall %.6f %s\n", s->stall, s->forked ? "fork" : "stopped");
        wprintf(&b, "#held %s\n", HELD_NAME[s->held]);
        for (int k = 0; k < R_KINDS; k++)
            wprintf(&b, "#roots %s %" PRIu64 " %" PRIu64 "\n", ROOT_NAME[k], s->roots[k][0],
                    s->roots[k][1]);
        wprintf(&b, "#excluded mmleak %" PRIu64 " %" PRIu64 "\n", s->excluded[0],
                s->excluded[1]);
        wprintf(&b, "#excluded glibc %" PRIu64 " %" PRIu64 "\n", s->glibc_ex[0],
                s->glibc_ex[1]);
        if (s->unreadable)
            wprintf(&b, "#unreadable %" PRIu64 "\n", s->unreadable);
        for (int k = 0; k < 4; k++)
            wprintf(&b, "#kind %s %" PRIu64 " %" PRIu64 "\n", KIND_NAME[k], s->kinds[k][0],
                    s->kinds[k][1]);
        wprintf(&b, "#blocks %zu\n#data\n", s->nb);
        data = encode_data(s, sec, len, &maplen);
        if (!data)
            b.oom = 1;
    }
    if (b.oom) {
        free(b.p);
        if (data)
            free_data(data, maplen);
        errno = ENOMEM;
        return -1;
    }
    /* a hidden temporary file (a name nobody can guess: another user may create files
     * there), then linked to the first free name */
    char tmpname[400];
    int fd = -1;
    for (int k = 0; k < 4 && fd < 0; k++) {
        snprintf(tmpname, sizeof tmpname, "%s/.mmleak.%s.scan.%016" PRIx64 ".tmp", s->dir,
                 s->id, unguessable());
        fd = open(tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                  0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        int e = errno;                      /* for the caller's message */
        free(b.p);
        if (data)
            free_data(data, maplen);
        errno = e;
        return -1;
    }
    scan_file_owner(s, fd);
    /* the header and the three sections, each after its length: written at once */
    struct iovec iov[7] = { { b.p, b.n } };
    unsigned char le[3][8];
    int n = 1;
    for (int k = 0; data && k < 3; k++) {
        for (int j = 0; j < 8; j++)
            le[k][j] = (unsigned char)((uint64_t)len[k] >> (8 * j));
        iov[n++] = (struct iovec){ le[k], 8 };
        iov[n++] = (struct iovec){ sec[k], len[k] };
    }
    int ok = !write_all(fd, iov, n), e = errno;
    free(b.p);
    if (data)
        free_data(data, maplen);
    /* no fsync: it would delay the program's exit by a journal commit (about 0.5 ms on ext4
     * here); a result cut short by a crash of the machine is not one to readers (they
     * check its first line and the length of its data), like the trace it is about */
    close(fd);
    if (!ok) {
        unlink(tmpname);
        errno = e;
        return -1;
    }
    /* renamed to the first free name: RENAME_NOREPLACE, one system call and one change of
     * the directory where link and unlink made two; link where the file system has no
     * such rename (EINVAL) */
    static int no_noreplace;
    for (int k = 0; k < SCAN_NAME_TRIES; k++) {
        snprintf(out, outlen, "%s/mmleak.%s.scan.%" PRIu64, s->dir, s->id, scan_name_number(k));
        if (!no_noreplace) {
            if (!renameat2(AT_FDCWD, tmpname, AT_FDCWD, out, RENAME_NOREPLACE))
                return 0;
            if (errno == EINVAL || errno == ENOSYS)
                no_noreplace = 1;
            else if (errno != EEXIST)
                break;
            else
                continue;
        }
        if (!link(tmpname, out)) {
            unlink(tmpname);
            return 0;
        }
        if (errno != EEXIST)
            break;
    }
    int e2 = errno;
    unlink(tmpname);
    errno = e2;
    return -1;
}
