/* tools/shrink_read.c: the compiled shrinker's input: each input file read in chunks of a
 * fixed buffer (a hole of a sparse file skipped unread), its lines read by tools/dumplines.h
 * (the format's rules: runs of NULs, lines too long, the last line without its newline, as
 * mmleaklib's dump_lines reads), each line an event for the folding algebra
 * (tools/shrink_fold.h) or a header or a problem (the validation of Shrinker.feed and
 * Shrinker._odd_line: which lines are problems, their numbers, the first few per file and
 * kind), the table's index sized ahead and its slots fetched ahead.  Separate from the state
 * and the output. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shrink_fold.h"

static const unsigned char Q_KIND[] = {
    [Q_TORN_LINE] = P_TORN, [Q_TORN_LAST] = P_TORN, [Q_PADDING_END] = P_PADDING,
    [Q_NULS] = P_PADDING, [Q_TOO_LONG] = P_MALFORMED, [Q_MALFORMED] = P_MALFORMED,
    [Q_CUT_START] = P_MALFORMED, [Q_DUPLICATE] = P_DUPLICATE,
};

/* EVENT_RE.fullmatch on a line that ends with its newline (tools/eventline.h).  Returns
 * the kind or -1. */
static inline int parse_line(const char *p, uint64_t *ptr, uint64_t *seq, uint64_t *tm)
{
    uint64_t size;
    return event_fields(p, ptr, seq, &size, tm);
}

/* A problem WHAT at LINENO, the line's first bytes at P (N of them, at most HEAD used). */
void problem(struct run *r, int file, uint64_t lineno, int what, const char *p, size_t n)
{
    int kind = Q_KIND[what];
    size_t at = (size_t)r->name_id[file] * P_KINDS + kind;
    if (kind == P_MALFORMED || kind == P_DUPLICATE)
        r->st->malformed = 1;
    if (unlikely(r->own != NULL) && ++r->own[at] <= (r->mute ? r->mute[at] : 0))
        return;                 /* counted and said by the attempt before (shrink_merge) */
    uint64_t c = ++r->counts[at];
    if (c <= r->show && r->on_problem(file, lineno, what, p, n < HEAD ? n : HEAD))
        r->stop = 1;
}

/* A compacted result's "#compacted ... entries=N" line: its N entries are coming, so the
 * table's index gets room for them (and those it holds) now, at once, instead of doubling
 * its way there, each time placing every entry again.  A hint: a wrong N costs only time. */
static __attribute__((cold, noinline)) void grow_index(struct run *r, uint64_t more, int most)
{
    uint64_t want = r->t.count + more;
    if (want > UINT32_MAX / 2)
        return;
    int bits = r->t.bits;
    while ((want + 1) * 10 > ((uint64_t)1 << bits) * 7 && bits < most)
        bits++;
    if (bits > r->t.bits && index_init(&r->t, bits))
        r->stop = -1;
}

static __attribute__((cold, noinline)) void presize(struct run *r, const char *p, size_t n)
{
    const char *e = memmem(p, n, " entries=", 9);
    if (e)
        grow_index(r, strtoull(e + 9, NULL, 10), 40);
}

/* The same before a dump file of SIZE bytes is read: an event line takes at least about
 * PRESIZE_LINE bytes, and a file of the live set leaves most of its lines; the index gets
 * room for them at once (at most 2^PRESIZE_BITS slots, 64 MB: a file whose events cancel
 * leaves few entries, and the index's pages that no entry uses are never touched), instead
 * of doubling its way there and placing every entry again at each step. */
#define PRESIZE_LINE 32
#define PRESIZE_BITS 24
static void presize_file(struct run *r, int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0)
        grow_index(r, (uint64_t)sb.st_size / PRESIZE_LINE, PRESIZE_BITS);
}

/* Shrinker._odd_line: a line ended by its newline that is not an event: a header, padding
 * (a blank line, tools/dumplines.h) or malformed. */
static void odd_line(struct run *r, int file, uint64_t lineno, const char *p, size_t n)
{
    if (p[0] == '#') {
        if (n > 11 && !memcmp(p, "#compacted ", 11) && !r->merge)
            presize(r, p, n);           /* (a streamed input's entries need no index) */
        int added = hset_add(&r->headers, p, n);
        if (added < 0) {
            r->stop = -1;
            return;
        }
        if (added && r->on_header && r->on_header(p, n, file, lineno))
            r->stop = 1;
        return;
    }
    if (!dl_blank(p, n))
        problem(r, file, lineno, Q_MALFORMED, p, n);
}

/* Partial results joined into one input (`cat` of shrink results): a '#mmleak' header after
 * event lines (WHAT 2) and bracket lines (WHAT 1), in either order, in the same input.  The
 * shrink cannot take its parts apart (a hull end of one part cancelled against another
 * part's event: a false foreign free).  Refused at the line that made it known: mmleaklib
 * raises it (Shrinker._joined).  Raw dump files joined are read right: no brackets. */
static __attribute__((cold, noinline)) void joined(struct run *r, int file, uint64_t lineno,
                                                   const char *p, size_t n, unsigned *seen,
                                                   unsigned what)
{
    *seen |= what;
    if (*seen != 3)
        return;
    r->st->fatal = 1;
    if (r->on_problem(file, lineno, Q_JOINED, p, n < HEAD ? n : HEAD))
        r->stop = 1;
}

static int tick(struct run *r, int file, uint64_t file_events)
{
    if (r->on_tick && r->on_tick(file, file_events, r->st->events, r->st->files_done))
        r->stop = 1;
    return r->stop;
}

/* One line ended by its newline (N bytes at P, at most LINE_MAX + 1). */
static inline __attribute__((always_inline)) void one_line(struct run *r, int file,
                                                             uint64_t lineno, const char *p,
                                                             size_t n, uint64_t *events,
                                                             uint64_t *allocs,
                                                             uint64_t *max_time,
                                                             unsigned *seen)
{
    uint64_t key, s, tm = 0;
    int kind = parse_line(p, &key, &s, &tm);
    if (likely(kind >= 0)) {
        if (kind == K_ALLOC) {
            ++*allocs;
            if (tm > *max_time)
                *max_time = tm;
        } else if (unlikely(kind >= K_END) && !(*seen & 1)) {
            joined(r, file, lineno, p, n, seen, 1);
            if (r->stop)        /* refused as joined: the line is not read (Shrinker.feed) */
                return;
        }
        ++*events;
        if (unlikely(r->merge != NULL))
            merge_event(r, file, lineno, p, n, key, s, kind);
        else
            event(r, file, lineno, p, n, key, s, kind);
    } else {
        if (unlikely(*events != 0) && n > 8 && !memcmp(p, "#mmleak ", 8))
            joined(r, file, lineno, p, n, seen, 2);
        if (likely(!r->stop))   /* refused as joined: the header is not read (Shrinker.feed) */
            odd_line(r, file, lineno, p, n);
    }
}

/* The lines ahead of the one being read: the table's index slot of each of the next
 * AHEAD lines' address is fetched into the cache, and the entry of the line AHEAD / 2
 * ahead, so that the state update finds them there (with millions of addresses the table
 * is far bigger than the cache: a miss on each line's slot, then on its entry, was most of
 * the time).  Hints only: a line that is not an event, or a table grown since, fetches
 * something useless, never reads out of bounds. */
#define AHEAD 16
struct ahead {
    const char *next, *lim;             /* the first line not looked at yet */
    size_t slot[AHEAD];
    unsigned pos, filled;
};

static inline void ahead_push(struct ahead *a, const struct table *t)
{
    const char *nl = memchr(a->next, '\n', (size_t)(a->lim - a->next));
    if (!nl) {
        a->next = a->lim;
        return;
    }
    uint64_t v = 0;
    unsigned d;
    for (const char *p = a->next; (d = EV_HEX[(unsigned char)*p]) < 16; p++)
        v = v << 4 | d;
    size_t h = home(t, v);
    __builtin_prefetch(&t->ix[h]);
    a->slot[(a->pos + a->filled++) % AHEAD] = h;
    a->next = nl + 1;
}

static inline void ahead_start(struct ahead *a, const struct table *t, const char *p,
                               const char *lim, int off)
{
    a->next = p;
    a->lim = off ? p : lim;             /* a chunk with NULs: none (a rare, slow path) */
    a->pos = a->filled = 0;
    while (a->filled < AHEAD && a->next < a->lim)
        ahead_push(a, t);
}

/* One line is being read: one more line ahead. */
static inline void ahead_step(struct ahead *a, const struct table *t)
{
    if (!a->filled)
        return;
    a->pos = (a->pos + 1) % AHEAD;
    a->filled--;
    if (a->next < a->lim)
        ahead_push(a, t);
    if (a->filled > AHEAD / 2) {
        uint32_t x = t->ix[a->slot[(a->pos + AHEAD / 2) % AHEAD] & t->mask];
        if (x)
            __builtin_prefetch(&t->e[x - 1]);
    }
}

/* feed_fd's handlers of tools/dumplines.h's reader: the input's state while it is read. */
struct reading {
    struct run *r;
    int file;
    uint64_t events, allocs, max_time;
    unsigned joined;            /* see joined() */
    struct ahead ah;
};

static inline __attribute__((always_inline)) void read_start(void *c, const char *p,
                                                             const char *lim, int nuls)
{
    struct reading *x = c;
    ahead_start(&x->ah, &x->r->t, p, lim, nuls || x->r->merge || x->r->t.lazy);
}

static inline __attribute__((always_inline)) int read_line(void *c, uint64_t lineno,
                                                           const char *p, size_t n)
{
    struct reading *x = c;
    ahead_step(&x->ah, &x->r->t);
    one_line(x->r, x->file, lineno, p, n, &x->events, &x->allocs, &x->max_time, &x->joined);
    return unlikely(x->r->stop) ||
           (unlikely((lineno & 0xFFFF) == 0) && tick(x->r, x->file, x->events));
}

/* Not a line: a problem (its DL_* is its Q_*). */
static __attribute__((cold, noinline)) int read_odd(void *c, int what, uint64_t lineno,
                                                    const char *p, size_t n)
{
    struct reading *x = c;
    problem(x->r, x->file, lineno, what, p, n);
    return x->r->stop;
}

/* Shrinker.feed over a descriptor, its lines read by tools/dumplines.h's reader (as
 * mmleaklib's dump_lines reads them): BUF (READ_BUF bytes) holds the start of a line not
 * ended yet and the chunk just read; a hole of a regular file is a run of NULs, never read
 * (SEEK_DATA). */
void feed_fd(struct run *r, int fd, int file, char *buf)
{
    struct dumplines d;
    memset(&d, 0, sizeof d);
    struct reading x = { .r = r, .file = file, .max_time = r->st->max_time };
    int failed = 0, hole_to_end = 0;
    struct stat sb;
    int seekable = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    char *pend = buf;                   /* where the D.have bytes are */
    off_t at = seekable ? lseek(fd, 0, SEEK_CUR) : 0;  /* the file offset read next */
    if (at < 0)
        at = 0;
    while (!r->stop) {
        int hole = 0;
        if (seekable) {
            off_t cur = lseek(fd, 0, SEEK_CUR), dt = cur < 0 ? -1 : lseek(fd, cur, SEEK_DATA);
            if (cur < 0) {
                seekable = 0;
            } else if (dt < 0 && errno == ENXIO) {  /* no data after CUR: a hole to the end? */
                hole = hole_to_end = fstat(fd, &sb) == 0 && cur < sb.st_size;
            } else if (dt < 0) {
                seekable = 0;           /* no SEEK_DATA here: all of it is data */
            } else {
                hole = dt > cur;
                at = dt;
            }
        }
        if (hole) {                     /* as many NULs as the hole is long */
            if (dl_hole(&d, pend, &x, read_odd) || hole_to_end)
                break;
        }
        /* the chunk goes where its bytes have the file's alignment in a page: the kernel
         * copies from the page cache a third faster than to a place out of step with it */
        char *to = buf + (((uint64_t)at - d.have) & 4095);
        if (to != pend)
            memmove(to, pend, d.have);
        pend = to;
        ssize_t got = read(fd, pend + d.have, READ_CHUNK);
        if (got < 0) {
            if (errno == EINTR) {
                tick(r, file, x.events);
                continue;
            }
            if (r->on_problem(file, 0, Q_UNREADABLE, NULL, (size_t)errno))
                r->stop = 1;
            r->st->fatal = 1;
            failed = 1;
            break;
        }
        if (got == 0)
            break;
        at += got;
        const char *p = dl_chunk(&d, pend, pend + d.have + (size_t)got, &x, read_start,
                                 read_line, read_odd);
        if (!p)
            break;
        pend = (char *)p;
    }
    if (!r->stop && !failed)            /* the last line, without its newline */
        dl_end(&d, pend, &x, read_odd);
    r->st->events += x.events;
    r->st->allocs += x.allocs;
    r->st->max_time = x.max_time;
    if (!r->stop && !failed)
        r->st->files_done++;
}

/* The run both entry points share: shrink PATHS into R's table (see mmleak_shrink).
 * Returns 0, or the status to return (1, -1). */
int shrink_inputs(struct run *r, const char *const *paths, const int *name_id,
                         int npaths, int show, mmleak_header_cb on_header,
                         mmleak_tick_cb on_tick, mmleak_open_cb on_open,
                         mmleak_problem_cb on_problem, uint64_t *counts,
                         struct mmleak_shrink_stats *stats, char *buf)
{
    if (table_init(&r->t, 16))
        return -1;
    memset(stats, 0, sizeof *stats);
    if (!r->mute)               /* (a retry adds to the attempt's counts: see struct run) */
        memset(counts, 0, sizeof(uint64_t) * P_KINDS * (size_t)npaths);
    r->counts = counts;
    r->name_id = name_id;
    r->show = show > 0 ? (uint64_t)show : 0;
    r->on_header = on_header;
    r->on_tick = on_tick;
    r->on_problem = on_problem;
    r->st = stats;
    for (int i = 0; i < npaths && !r->stop; i++) {
        int fd = strcmp(paths[i], "-") ? on_open(i) : 0;
        if (fd == -2) {
            r->stop = 1;
            break;
        }
        if (fd < 0) {                   /* mmleak.py said why */
            stats->fatal = 1;
            continue;
        }
        presize_file(r, fd);
        feed_fd(r, fd, i, buf);
        if (fd)
            close(fd);
    }
    return r->stop;
}

