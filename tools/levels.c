/* tools/levels.c: the lines of an old compaction level at the addresses newer levels touch
 * (issue 19: a point of the series that costs what the new runs hold, mmleaklib/series.py).
 *
 * mmleak_levels_pick(BIG, SMALL, N, EXTRA, NEXTRA, OUT) writes to the descriptor OUT BIG's
 * first line, stacks and clock (its "#mmleak", "#s" and "#clock" lines before the first
 * event line) and every event line of BIG whose address is the address of some event line
 * of the files SMALL[0..N), or one of the NEXTRA addresses EXTRA (in any order; a running
 * trace's point adds those of the blocks a merge into BIG brought in, series.py).  BIG is a compacted
 * result (its event lines sorted by address, as every result and run is); the SMALL files'
 * addresses are gathered, sorted and deduplicated, then found in BIG by a galloping search
 * over its bytes (a line start is found back from any byte), so the cost follows the small
 * files, not BIG's size.  Returns the number of event lines written, or -1 (errno set; -1
 * with errno EINVAL: BIG's event lines are not sorted where the search looked, or a line is
 * not an event line: the caller reads the trace whole instead). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tracer/compiler.h"
#include "dumplines.h"

struct map { const char *p; size_t n; };
/* an empty file's bytes: P is never NULL, so that P + N is defined (C11 6.5.6) */
static const char no_bytes[1];

static int map_file(const char *path, struct map *m)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    m->p = no_bytes;
    m->n = 0;
    if (fd < 0)
        return -1;
    /* a regular file of ours or root's (the caller checked the names it passes; this holds
     * should one be replaced meanwhile by another user's).  Root too maps only its own: the
     * owner of a mapped file can truncate it while it is read, and the reader then dies of
     * SIGBUS (root's compactor, of a trace whose owner wants it dead); EPERM makes the
     * caller read the trace with read(2) instead (series.py, level_sums) */
    uid_t me = geteuid();
    int e = fstat(fd, &st) ? errno : !S_ISREG(st.st_mode) ? EINVAL
            : st.st_uid != me && st.st_uid ? EPERM : 0;
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    if (st.st_size) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        m->p = p;
        m->n = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

static void unmap(struct map *m)
{
    if (m->n)
        munmap((void *)m->p, m->n);
}

/* The address of the line at P (hex digits up to a space), or -1 if it has none. */
static int line_ptr(const char *p, const char *end, uint64_t *out)
{
    uint64_t v = 0;
    int digits = 0;
    for (; p < end && *p != ' '; p++, digits++) {
        int c = (unsigned char)*p, d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else
            return -1;
        if (digits >= 16)
            return -1;
        v = v << 4 | (uint64_t)d;
    }
    if (!digits || p >= end)
        return -1;
    *out = v;
    return 0;
}

static const char *line_end(const char *p, const char *end)
{
    const char *e = memchr(p, '\n', (size_t)(end - p));
    return e ? e + 1 : end;
}

/* The addresses of the event lines of the files SMALL, read by tools/dumplines.h's reader
 * (as every reader reads them: NUL runs, blank lines, torn and cut lines, a last line
 * without its newline are no events).  Without this, a running trace's point fell back to
 * reading the whole live set whenever a file beside the result had been flushed by a busy
 * thread (a line of spaces, EINVAL). */
struct addrs { uint64_t *v, n, cap; int err; };

static int addrs_push(struct addrs *a, uint64_t v)
{
    if (a->n == a->cap) {
        uint64_t *p = realloc(a->v, (a->cap = a->cap ? 2 * a->cap : 4096) * sizeof *p);
        if (!p) {
            a->err = ENOMEM;
            return -1;
        }
        a->v = p;
    }
    a->v[a->n++] = v;
    return 0;
}

static void small_start(void *c, const char *p, const char *lim, int nuls)
{
    (void)c, (void)p, (void)lim, (void)nuls;
}

/* An event line's address; a header or a blank line is skipped; any other line: EINVAL
 * (the caller reads the trace whole, which says what is wrong). */
static int small_line(void *c, uint64_t lineno, const char *p, size_t n)
{
    struct addrs *a = c;
    uint64_t v, seq, size, tm;
    (void)lineno;
    if (event_fields(p, &v, &seq, &size, &tm) < 0) {
        if (*p == '#' || dl_blank(p, n))
            return 0;
        a->err = EINVAL;
        return -1;
    }
    return a->n && a->v[a->n - 1] == v ? 0 : addrs_push(a, v);
}

static int small_odd(void *c, int what, uint64_t lineno, const char *p, size_t n)
{
    (void)c, (void)what, (void)lineno, (void)p, (void)n;
    return 0;
}

/* Adds the event lines' addresses of the dump file M (mapped whole: one chunk) to A.  0, or
 * -1 (A->err). */
static int small_addrs(const struct map *m, struct addrs *a)
{
    struct dumplines d;
    memset(&d, 0, sizeof d);
    const char *p = dl_chunk(&d, m->p, m->p + m->n, a, small_start, small_line, small_odd);
    if (!p)
        return -1;
    dl_end(&d, p, a, small_odd);
    return 0;
}

/* The start of the line holding byte P (>= LO). */
static const char *line_start(const char *lo, const char *p)
{
    while (p > lo && p[-1] != '\n')
        p--;
    return p;
}

/* The first event line: after the head's '#' lines. */
static const char *events_start(const struct map *m)
{
    const char *p = m->p, *end = m->p + m->n;
    while (p < end && *p == '#')
        p = line_end(p, end);
    return p;
}

/* The end of the event lines: before trailing '#' lines, if any (none expected). */
static const char *events_end(const char *lo, const char *end)
{
    const char *e = end;
    for (;;) {
        if (e == lo)
            return e;
        const char *s = line_start(lo, e - 1);
        if (*s != '#')
            return e;
        e = s;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

struct out { int fd; char buf[1 << 16]; size_t n; };

static int flush_out(struct out *o)
{
    size_t off = 0;
    while (off < o->n) {
        ssize_t w = write(o->fd, o->buf + off, o->n - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        off += (size_t)w;
    }
    o->n = 0;
    return 0;
}

static int put(struct out *o, const char *p, size_t n)
{
    while (n) {
        size_t k = sizeof o->buf - o->n < n ? sizeof o->buf - o->n : n;
        memcpy(o->buf + o->n, p, k);
        o->n += k;
        p += k;
        n -= k;
        if (o->n == sizeof o->buf && flush_out(o))
            return -1;
    }
    return 0;
}

/* The first line in [LO, HI) (line starts) whose address is >= T: a galloping search from
 * LO forward, then a binary search over the bytes.  NULL with errno EINVAL: a line without
 * an address. */
static const char *seek_ptr(const char *lo, const char *hi, uint64_t t)
{
    uint64_t v;
    if (lo >= hi)
        return hi;
    if (line_ptr(lo, hi, &v)) {
        errno = EINVAL;
        return NULL;
    }
    if (v >= t)
        return lo;
    /* lo's line is below T: find a line at or above it, doubling the step */
    const char *base = lo, *found = hi;
    size_t step = 256;
    for (;;) {
        if ((size_t)(hi - base) <= step)
            break;
        const char *s = line_start(lo, base + step);
        if (s <= lo) {
            step *= 2;
            continue;
        }
        if (line_ptr(s, hi, &v)) {
            errno = EINVAL;
            return NULL;
        }
        if (v >= t) {
            found = s;
            break;
        }
        lo = s;
        step *= 2;
    }
    /* invariant: LO's line is below T, FOUND is a line start at or above T (or HI) */
    while (1) {
        const char *next = line_end(lo, hi);
        if (next >= found)
            return found;
        const char *half = lo + (found - lo) / 2;
        const char *mid = half < next ? next : line_start(next, half);
        if (line_ptr(mid, hi, &v)) {
            errno = EINVAL;
            return NULL;
        }
        if (v >= t)
            found = mid;
        else
            lo = mid;
    }
}

EXPORT int64_t mmleak_levels_pick(const char *big, const char *const *small, int nsmall,
                                  const uint64_t *extra, int64_t nextra, int out_fd)
{
    struct map bm, sm;
    struct addrs A = { NULL, 0, 0, 0 };
    int64_t written = -1;
    int e = 0;
    struct out *o = NULL;
    if (map_file(big, &bm))
        return -1;
    for (int i = 0; i < nsmall; i++) {
        if (map_file(small[i], &sm)) {
            e = errno;
            goto out;
        }
        int r = sm.n ? small_addrs(&sm, &A) : 0;
        unmap(&sm);
        if (r) {
            e = A.err;
            goto out;
        }
    }
    for (int64_t i = 0; i < nextra; i++)
        if (addrs_push(&A, extra[i])) {
            e = A.err;
            goto out;
        }
    uint64_t *addr = A.v, n = A.n;
    if (n)
        qsort(addr, n, sizeof *addr, cmp_u64);
    o = malloc(sizeof *o);
    if (!o) {
        e = ENOMEM;
        goto out;
    }
    o->fd = out_fd;
    o->n = 0;
    const char *head_end = events_start(&bm), *end = events_end(head_end, bm.p + bm.n);
    for (const char *h = bm.p; h < head_end;) {        /* its header, stacks and clock */
        const char *next = line_end(h, head_end);
        size_t len = (size_t)(next - h);
        if (((len > 8 && !memcmp(h, "#mmleak ", 8)) || (len > 3 && !memcmp(h, "#s ", 3)) ||
             (len > 7 && !memcmp(h, "#clock ", 7))) && put(o, h, len)) {
            e = errno;
            goto out;
        }
        h = next;
    }
    const char *p = head_end;
    int64_t lines = 0;
    uint64_t last = 0;
    int have_last = 0;
    for (uint64_t i = 0; i < n && p < end; i++) {
        if (i && addr[i] == addr[i - 1])
            continue;
        p = seek_ptr(p, end, addr[i]);
        if (!p) {
            e = errno;
            goto out;
        }
        while (p < end) {
            uint64_t v;
            if (line_ptr(p, end, &v)) {
                e = EINVAL;
                goto out;
            }
            if (have_last && v < last) {        /* not sorted: the caller reads it whole */
                e = EINVAL;
                goto out;
            }
            last = v;
            have_last = 1;
            if (v != addr[i])
                break;
            const char *next = line_end(p, end);
            if (put(o, p, (size_t)(next - p))) {
                e = errno;
                goto out;
            }
            lines++;
            p = next;
        }
    }
    if (flush_out(o)) {
        e = errno;
        goto out;
    }
    written = lines;
out:
    free(o);
    free(A.v);
    unmap(&bm);
    if (written < 0)
        errno = e ? e : EINVAL;
    return written;
}
