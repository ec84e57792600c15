/* tools/shrink.c: the compiled shrinker mmleak.py uses (through ctypes) when it can.
 *
 * The same algorithm as mmleaklib/shrink.py's Shrinker (specified above that class, and in
 * mmleak-format(5), "The shrink algorithm"):
 * per address, one event or the hull of the lowest and highest event by SEQ, and an
 * allocation with SEQ s followed by a free with SEQ s+1 cancels when that pair is the whole
 * state (from two inputs, once the second one's input goes on: ent_update).  Input validation (which lines are problems, their line numbers, the first few per
 * file and kind) and header handling are those of Shrinker.feed and Shrinker._odd_line;
 * mmleaklib is the reference, tests/test_shrink_native.py holds the two to byte-identical
 * results.  A problem is handed back as a record (what, file, line, the line's first bytes):
 * mmleaklib words every message, once, for both engines.
 *
 * Loaded by mmleaklib (native.py) with ctypes, independent of the tracer: it allocates with
 * mmap/munmap only, so it behaves the same whether the library that holds it was dlopen'ed
 * by Python or the process itself runs under the tracer.
 *
 * Memory is proportional to the state kept (open addresses and hull ends), not to the input:
 * the table shrinks nothing, but adjacent pairs leave it at once and their line storage goes
 * back to a per-size free list.  (One exception, bounded: the index is sized before each
 * file is read for the lines its size can hold, at most 2^24 slots of 4 bytes; presize_file.)
 * The input is read in chunks into one buffer of fixed size, whatever it holds: a line
 * longer than LINE_MAX is reported, not kept, and the holes of a sparse file are skipped,
 * never read (feed_fd, and mmleaklib's dump_lines, byte for byte).
 *
 * The files are opened by mmleaklib (the open callback: the checks every reader of a dump
 * directory makes are in one place, open_trace_file); this file reads descriptors. */
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
#include "blocks.h"
#include "eventline.h"
#include "facts.h"

enum { P_TORN = 0, P_PADDING = 1, P_MALFORMED = 2, P_DUPLICATE = 3, P_KINDS = 4 };
/* What a problem is (mmleaklib's dumpformat.PROBLEMS words each, and knows its kind). */
enum {
    Q_TORN_LINE = 1,    /* a line without its end (process killed while writing it?) */
    Q_TORN_LAST,        /* a '#' line without its newline, at the end */
    Q_PADDING_END,      /* blanks after the last line */
    Q_NULS,             /* a run of NUL bytes (padding, or a hole a crash left) */
    Q_TOO_LONG,         /* a line longer than LINE_MAX */
    Q_MALFORMED,        /* not a line of the format */
    Q_CUT_START,        /* a line after NULs with a pointer too short: its start is lost */
    Q_DUPLICATE,        /* an event seen twice */
    Q_UNREADABLE,       /* read() failed (the errno instead of the line's bytes) */
};
static const unsigned char Q_KIND[] = {
    [Q_TORN_LINE] = P_TORN, [Q_TORN_LAST] = P_TORN, [Q_PADDING_END] = P_PADDING,
    [Q_NULS] = P_PADDING, [Q_TOO_LONG] = P_MALFORMED, [Q_MALFORMED] = P_MALFORMED,
    [Q_CUT_START] = P_MALFORMED, [Q_DUPLICATE] = P_DUPLICATE,
};

/* Callbacks into mmleaklib.  header: a '#' line (with its newline) not seen before in this
 * run; returns nonzero to stop (unknown format version).  tick: called every 65536 lines
 * and after an interrupted read; returns nonzero to stop (KeyboardInterrupt). */
typedef int (*mmleak_header_cb)(const char *line, size_t len, int file, uint64_t lineno);
typedef int (*mmleak_tick_cb)(int file, uint64_t file_events, uint64_t events_before,
                              uint64_t files_done);
/* open: a descriptor of input FILE (closed here after reading), -1 when it cannot be read
 * (mmleaklib said why), -2 to stop (an exception to pass on). */
typedef int (*mmleak_open_cb)(int file);
/* problem: the record of a problem in input FILE at LINENO (Q_*), to be said: the first
 * bytes of the line (N of them at LINE, at most HEAD), or for Q_UNREADABLE the errno in N
 * (LINE NULL, LINENO 0).  Only the first SHOW of each kind per file name are handed back:
 * COUNTS counts them all.  Returns nonzero to stop (KeyboardInterrupt). */
typedef int (*mmleak_problem_cb)(int file, uint64_t lineno, int what, const char *line,
                                 size_t n);

/* lines, alloc_lines: the event lines of the result written, and the allocations among them
 * (what a compacted result counts in its "#compacted" line) */
struct mmleak_shrink_stats {
    uint64_t events, allocs, max_time, files_done, entries, fatal, malformed, out_errno;
    uint64_t lines, alloc_lines;
    /* of the lines written: the frees among them, the allocations' bytes and newest time,
     * and the stack ids ("@ID") they use, NUSED of them at USED (a mapping of USED_BYTES:
     * mmleak_shrink_stats_free) in no order */
    uint64_t free_lines, alloc_bytes, newest, used, nused, used_bytes;
    uint64_t alloc_bytes_hi;   /* the high half of ALLOC_BYTES (sizes are 64-bit) */
};

/* ---- memory: mmap only ------------------------------------------------------------ */

static void *map_mem(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* the table's index and entries, the line storage: with millions of addresses, read
     * and written all over; huge pages where the system gives them on request (fewer page
     * faults and TLB misses; a mapping keeps the advice when mremap grows it) */
    if (n >= ((size_t)2 << 20))
        madvise(p, n, MADV_HUGEPAGE);
    return p;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* N bytes at P (page-aligned) faulted in by one call (Linux 5.14 and later; before, they
 * fault in as they are written): 0, or -1 when the kernel cannot. */
static int populate(void *p, size_t n)
{
    int saved = errno, rc = madvise(p, n, MADV_POPULATE_WRITE);
    errno = saved;
    return rc;
}

/* Line storage: size classes of 16 bytes up to SLAB_MAX, each with a free list; bigger lines
 * get a mapping of their own.  A block's class is recomputed from the length kept in the
 * table, so blocks carry no header. */
#define SLAB_GRAIN 8
#define SLAB_MAX 1024
#define SLAB_CLASSES (SLAB_MAX / SLAB_GRAIN)
#define CHUNK (4u << 20)
/* Reading: a line is kept up to LINE_MAX bytes (mmleaklib/facts.py), read READ_CHUNK at a
 * time (never more than LINE_MAX: only a line that began in an earlier chunk can be longer). */
#define LINE_MAX_BYTES ((size_t)MMLEAK_LINE_MAX)   /* facts.h: mmleaklib/facts.py's bound */
#define READ_CHUNK ((size_t)1 << 20)
#define READ_BUF (4096 + LINE_MAX_BYTES + READ_CHUNK)
#define HEAD 80                         /* what messages show of a line too long */

struct chunk { struct chunk *next; size_t size; };

struct slab {
    void *free_list[SLAB_CLASSES + 1];
    char *cur, *end;                   /* carving area of the newest chunk */
    struct chunk *chunks;              /* every mapping, for the final release */
};

static size_t big_size(size_t n) { return (n + sizeof(struct chunk) + 4095) & ~(size_t)4095; }

static char *slab_alloc(struct slab *s, size_t n)
{
    if (unlikely(n > SLAB_MAX)) {
        size_t sz = big_size(n);
        char *p = map_mem(sz);
        return p ? p + sizeof(struct chunk) : NULL;
    }
    size_t c = (n + SLAB_GRAIN - 1) / SLAB_GRAIN;
    void *p = s->free_list[c];
    if (p) {
        memcpy(&s->free_list[c], p, sizeof(void *));
        return p;
    }
    size_t sz = c * SLAB_GRAIN;
    if ((size_t)(s->end - s->cur) < sz) {
        /* a chunk is carved from its start, line after line: in pages of 4 KiB (no huge
         * pages: on a VM, zeroing them took from 0.3 to 1.3 s of system time from run to
         * run for bench/live.py's 400 MB of lines), all faulted in by one call from the
         * second chunk on (a slab that holds a few lines costs no more than before) */
        struct chunk *ch = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (ch == MAP_FAILED)
            return NULL;
        if (s->chunks)
            populate(ch, CHUNK);
        ch->next = s->chunks;
        ch->size = CHUNK;
        s->chunks = ch;
        s->cur = (char *)ch + 64;
        s->end = (char *)ch + CHUNK;
    }
    char *r = s->cur;
    s->cur += sz;
    return r;
}

static void slab_free(struct slab *s, char *p, size_t n)
{
    if (unlikely(n > SLAB_MAX)) {
        munmap(p - sizeof(struct chunk), big_size(n));
        return;
    }
    size_t c = (n + SLAB_GRAIN - 1) / SLAB_GRAIN;
    memcpy(p, &s->free_list[c], sizeof(void *));
    s->free_list[c] = p;
}

static void slab_release(struct slab *s)
{
    for (struct chunk *ch = s->chunks, *nx; ch; ch = nx) {
        nx = ch->next;
        munmap(ch, ch->size);
    }
    s->chunks = NULL;
}

/* ---- the state: entries in a dense array, found through an index keyed by the pointer --
 * The entries stay packed (a deletion moves the last one into the hole) and grow in place
 * (mremap: no second copy); the index is open addressing over 4-byte entry numbers, so the
 * state costs the entry, its lines, and a few bytes of index per address.
 *
 * The index is built only when it is needed: while the addresses come in ascending order
 * (a compacted result, a dump of a heap that only grew), the table is LAZY: its entries
 * are sorted by address, a new address (above the last) is appended and an event of the
 * last address updates the last entry, with no hash, no index and no sort before writing;
 * the first event of a lower address builds the index over the entries (table_index), and
 * the table stays indexed from then on. */

struct ent {
    uint64_t key;
    uint64_t s0, s1;         /* single: s0; hull: low end s0, high end s1 */
    char *l0, *l1;           /* stored lines; a bracket end keeps only its PTR field */
    uint32_t n0, n1;
    uint8_t k0, k1, hull;
    uint8_t pend;            /* a hull held for an adjacent pair from two inputs (ent_update):
                              * 1, input FILE's event is its low end; 2, its high end */
    int32_t file;            /* single: the input of its event; PEND: of the held event */
};

struct table {
    struct ent *e;           /* count entries, room for cap */
    uint32_t *ix;            /* 0: empty slot, else 1 + the entry's number (NULL: LAZY) */
    size_t mask, count, cap, e_bytes, ix_bytes;
    int bits;
    int lazy;                /* the entries sorted by address, no index yet (BITS: its size) */
    size_t pop;              /* bytes of E faulted in ahead (populate_ahead) */
};

/* The entry array's next POP_STEP bytes faulted in by one call, not a page fault per page
 * as the entries reach them: never more than POP_STEP beyond the entries written. */
#define POP_STEP ((size_t)8 << 20)
static __attribute__((cold, noinline)) void populate_ahead(struct table *t)
{
    size_t end = t->pop + POP_STEP < t->e_bytes ? t->pop + POP_STEP : t->e_bytes;
    t->pop = populate((char *)t->e + t->pop, end - t->pop) ? SIZE_MAX : end;
}

static inline size_t home(const struct table *t, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - t->bits));
}

static int index_init(struct table *t, int bits)
{
    size_t n = (size_t)1 << bits;
    if (t->lazy) {              /* no index yet: only its size, for table_index */
        t->mask = n - 1;
        t->bits = bits;
        return 0;
    }
    uint32_t *ix = map_mem(n * sizeof *ix);    /* zero-filled: every slot empty */
    if (!ix)
        return -1;
    if (t->ix)
        munmap(t->ix, t->ix_bytes);
    t->ix = ix;
    t->ix_bytes = n * sizeof *ix;
    t->mask = n - 1;
    t->bits = bits;
    for (size_t d = 0; d < t->count; d++) {
        size_t j = home(t, t->e[d].key);
        while (t->ix[j])
            j = (j + 1) & t->mask;
        t->ix[j] = (uint32_t)(d + 1);
    }
    return 0;
}

static int table_init(struct table *t, int bits)
{
    memset(t, 0, sizeof *t);
    t->cap = (size_t)1 << (bits - 1);
    t->e_bytes = t->cap * sizeof(struct ent);
    t->e = map_mem(t->e_bytes);
    if (!t->e)
        return -1;
    t->lazy = 1;
    return index_init(t, bits);
}

/* The entry array twice as big, in place. */
static __attribute__((cold, noinline)) int table_grow(struct table *t)
{
    if (t->cap >= UINT32_MAX / 2)
        return -1;
    size_t nb = t->e_bytes * 2;
    void *p = mremap(t->e, t->e_bytes, nb, MREMAP_MAYMOVE);
    if (p == MAP_FAILED)
        return -1;
    t->e = p;
    t->e_bytes = nb;
    t->cap *= 2;
    return 0;
}

/* Room for one more entry: the array grows in place, the index at 70% load. */
static int table_room(struct table *t)
{
    if (t->count == t->cap && table_grow(t))
        return -1;
    if (!t->lazy && (t->count + 1) * 10 > (t->mask + 1) * 7)
        return index_init(t, t->bits + 1);
    return 0;
}

/* A LAZY table indexed: an address came below the last one.  The index gets the size the
 * hints asked for (grow_index), or more for the entries it holds. */
static __attribute__((cold, noinline)) int table_index(struct table *t)
{
    int bits = t->bits;
    while ((t->count + 1) * 10 > ((size_t)1 << bits) * 7)
        bits++;
    t->lazy = 0;
    return index_init(t, bits);
}

/* Delete the entry of index slot I: backward-shift deletion in the index (no tombstones,
 * so probe chains stay as short as the load), then the last entry moves into the hole. */
static void table_del(struct table *t, size_t i)
{
    size_t d = t->ix[i] - 1, j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (!t->ix[j])
            break;
        size_t h = home(t, t->e[t->ix[j] - 1].key);
        if (((j - h) & t->mask) >= ((j - i) & t->mask)) {
            t->ix[i] = t->ix[j];
            i = j;
        }
    }
    t->ix[i] = 0;
    size_t last = --t->count;
    if (d != last) {
        t->e[d] = t->e[last];
        size_t k = home(t, t->e[d].key);
        while (t->ix[k] != last + 1)
            k = (k + 1) & t->mask;
        t->ix[k] = (uint32_t)(d + 1);
    }
}

/* ---- header lines seen (a small set of byte strings) --------------------------------- */

struct hset {
    struct hitem { uint64_t h; char *s; size_t n; } *v;
    size_t mask, count, bytes;
    struct slab mem;
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* 1: added (new), 0: present, -1: out of memory */
static int hset_add(struct hset *hs, const char *s, size_t n)
{
    if (!hs->v || (hs->count + 1) * 2 > hs->mask + 1) {
        size_t cap = hs->v ? (hs->mask + 1) * 2 : 64;
        struct hitem *nv = map_mem(cap * sizeof *nv);
        if (!nv)
            return -1;
        for (size_t i = 0; hs->v && i <= hs->mask; i++) {
            if (!hs->v[i].s)
                continue;
            size_t j = hs->v[i].h & (cap - 1);
            while (nv[j].s)
                j = (j + 1) & (cap - 1);
            nv[j] = hs->v[i];
        }
        if (hs->v)
            munmap(hs->v, hs->bytes);
        hs->v = nv;
        hs->mask = cap - 1;
        hs->bytes = cap * sizeof *nv;
    }
    uint64_t h = hash_bytes(s, n);
    size_t j = h & hs->mask;
    for (; hs->v[j].s; j = (j + 1) & hs->mask)
        if (hs->v[j].h == h && hs->v[j].n == n && !memcmp(hs->v[j].s, s, n))
            return 0;
    char *c = slab_alloc(&hs->mem, n ? n : 1);
    if (!c)
        return -1;
    memcpy(c, s, n);
    hs->v[j] = (struct hitem){ h, c, n };
    hs->count++;
    return 1;
}

static void hset_release(struct hset *hs)
{
    if (hs->v)
        munmap(hs->v, hs->bytes);
    slab_release(&hs->mem);
}

/* ---- output buffer ------------------------------------------------------------------- */

struct obuf { int fd; int err; size_t n; char b[1 << 16]; };

static void write_all(int fd, const char *p, size_t n, int *err)
{
    while (n && !*err) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            *err = errno;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void ob_flush(struct obuf *o)
{
    write_all(o->fd, o->b, o->n, &o->err);
    o->n = 0;
}

static void ob_put(struct obuf *o, const char *p, size_t n)
{
    if (o->n + n > sizeof o->b) {
        ob_flush(o);
        if (n > sizeof o->b) {
            write_all(o->fd, p, n, &o->err);
            return;
        }
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void ob_u(struct obuf *o, uint64_t v, int base)
{
    char t[24];
    int i = sizeof t;
    do {
        t[--i] = "0123456789abcdef"[v % (unsigned)base];
        v /= (unsigned)base;
    } while (v);
    ob_put(o, t + i, sizeof t - (size_t)i);
}

/* ---- the run ------------------------------------------------------------------------- */

enum { SHRINK_FINAL = 1, SHRINK_HEAD_FIRST = 2 };      /* mmleak_shrink's FINAL */

struct run {
    struct table t;
    struct slab mem;
    struct hset headers;
    uint64_t *counts;          /* [name id * P_KINDS + kind] */
    const int *name_id;        /* file index -> index of the first file with the same name */
    uint64_t show;             /* records handed back per name and kind at most */
    mmleak_header_cb on_header;
    mmleak_tick_cb on_tick;
    mmleak_problem_cb on_problem;
    struct mmleak_shrink_stats *st;
    int stop;                  /* 1: a callback asked to stop; -1: out of memory */
    uint64_t *used;            /* the stack ids the result uses: open addressing, 0 empty */
    size_t used_mask, used_n;
    int used_zero;             /* "@0" used */
    uint64_t last_used;        /* the stack id use_stack took last (0: none yet) */
    /* note_alloc: the last line's stack reference, a copy of its text (not a pointer into
     * the line: a line's memory is freed once written, and the next line may take its place
     * with another reference at the same address) */
    char last_ref[24];
    size_t last_ref_n;          /* 0: none */
    struct merge *merge;       /* the input being streamed (merge_event), NULL: none */
    const uint64_t *mute;      /* problems already handed back (counts before a retry) */
    int head_first;            /* mmleak_shrink's SHRINK_HEAD_FIRST (write_state) */
    /* SHRINK_HEAD_FIRST while the table is LAZY: the entries before NOTED are noted already
     * for the head (put_ent's PUT_NOTE into NC, as FINAL_NOTES asks; NPEND held pairs),
     * each when the next address was appended, while its line was still in the cache;
     * write_state notes only the rest.  NOTING 0: no such notes (notes_drop: an entry noted
     * changed, or the table was indexed), write_state notes every entry. */
    int noting, final_notes;
    size_t noted;
    uint64_t nc[3], npend;
};

/* EVENT_RE.fullmatch on a line that ends with its newline (tools/eventline.h).  Returns
 * the kind or -1. */
static inline int parse_line(const char *p, uint64_t *ptr, uint64_t *seq, uint64_t *tm)
{
    uint64_t size;
    return event_fields(p, ptr, seq, &size, tm);
}

/* A problem WHAT at LINENO, the line's first bytes at P (N of them, at most HEAD used). */
static void problem(struct run *r, int file, uint64_t lineno, int what, const char *p, size_t n)
{
    int kind = Q_KIND[what];
    uint64_t *c = &r->counts[(size_t)r->name_id[file] * P_KINDS + kind];
    ++*c;
    if (kind == P_MALFORMED || kind == P_DUPLICATE)
        r->st->malformed = 1;
    if (unlikely(r->mute) && *c <= r->mute[c - r->counts])
        return;                 /* said by the attempt before (mmleak_shrink_merge) */
    if (*c <= r->show && r->on_problem(file, lineno, what, p, n < HEAD ? n : HEAD))
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

/* Shrinker._odd_line: everything that is not an event (a line without NUL bytes, ended by
 * its newline, or the last one of the input without it). */
static void odd_line(struct run *r, int file, uint64_t lineno, const char *p, size_t n)
{
    int nl = n && p[n - 1] == '\n';
    if (p[0] == '#') {
        if (!nl) {
            problem(r, file, lineno, Q_TORN_LAST, p, 0);
            return;
        }
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
    if (!nl) {
        size_t i = 0;                   /* not line.strip(b" "): spaces only */
        while (i < n && p[i] == ' ')
            i++;
        problem(r, file, lineno, i == n ? Q_PADDING_END : Q_TORN_LINE, p, n);
        return;
    }
    size_t i;                           /* not line.strip(): ASCII whitespace only */
    for (i = 0; i < n; i++) {
        char c = p[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f')
            break;
    }
    if (i == n)
        return;
    problem(r, file, lineno, Q_MALFORMED, p, n);
}

/* Text cut by a run of NUL bytes (N bytes at P, LONG: it was longer than LINE_MAX and this is
 * its head): a torn line, or padding when it is empty or blank.  The line goes on after the
 * run, under the same number. */
static __attribute__((cold, noinline)) void cut_line(struct run *r, int file, uint64_t lineno,
                                                    const char *p, size_t n,
                     int is_long)
{
    size_t i = 0;
    while (!is_long && i < n && p[i] == ' ')
        i++;
    problem(r, file, lineno, i == n && !is_long ? Q_NULS : Q_TORN_LINE, p, n);
}

/* A line longer than LINE_MAX (its head: N bytes at P), ended by END: a newline, a NUL, or
 * nothing (the end of the input). */
static __attribute__((cold, noinline)) void long_line(struct run *r, int file, uint64_t lineno,
                                                     const char *p, size_t n,
                      int end)
{
    if (end == 0)
        cut_line(r, file, lineno, p, n, 1);
    else
        problem(r, file, lineno, end == '\n' ? Q_TOO_LONG : p[0] == '#' ? Q_TORN_LAST :
                Q_TORN_LINE, p, n);
}

static inline size_t ptr_len(const char *p)
{
    return (size_t)((const char *)memchr(p, ' ', 17) - p);
}

/* Store an end: the whole line, or only its PTR field when the end is a bracket. */
static inline char *store(struct run *r, const char *p, size_t n, uint32_t *len)
{
    char *c = slab_alloc(&r->mem, n);
    if (unlikely(!c)) {
        r->stop = -1;
        return NULL;
    }
    memcpy(c, p, n);
    *len = (uint32_t)n;
    return c;
}

/* Cut a stored line down to its PTR field (a hull end that will be written as a bracket). */
static inline void to_bracket(struct run *r, char **l, uint32_t *n)
{
    size_t k = ptr_len(*l);
    /* keep the block only when its size class stays the same (slab_free recomputes it) */
    if (*n > SLAB_MAX || (k + SLAB_GRAIN - 1) / SLAB_GRAIN != (*n + SLAB_GRAIN - 1) / SLAB_GRAIN) {
        uint32_t nk;
        char *c = store(r, *l, k, &nk);
        if (!c)
            return;
        slab_free(&r->mem, *l, *n);
        *l = c;
    }
    *n = (uint32_t)k;
}

/* A hull end (its line L, length LEN, number SEQ, kind K) replaced by the event P (N bytes
 * kept: the line, or its PTR field for a bracket), number S. */
static inline void new_end(struct run *r, char **l, uint32_t *len, uint64_t *seq, uint8_t *k,
                           const char *p, size_t n, uint64_t s, int kind)
{
    uint32_t nn;
    char *c = store(r, p, n, &nn);
    if (!c)
        return;
    slab_free(&r->mem, *l, *len);
    *l = c;
    *len = nn;
    *seq = s;
    *k = (uint8_t)kind;
}

static void dup_event(struct run *r, int file, uint64_t lineno)
{
    problem(r, file, lineno, Q_DUPLICATE, NULL, 0);
}

/* A new entry E for the address KEY: the event P (N bytes), number S, kind KIND.  0, or -1
 * when its line could not be stored (r->stop says so). */
static inline int ent_new(struct run *r, struct ent *e, const char *p, size_t n, uint64_t key,
                          uint64_t s, int kind, int file)
{
    e->l0 = store(r, p, n, &e->n0);
    if (!e->l0)
        return -1;
    e->key = key;
    e->s0 = s;
    e->k0 = (uint8_t)kind;
    e->hull = 0;
    e->pend = 0;
    e->file = file;
    return 0;
}

/* The entry E, a hull held for an adjacent pair (PEND), dropped (the pair is all there is
 * of its two inputs) and made anew of the event P (N bytes), number S, kind KIND of input
 * FILE. */
static inline void ent_renew(struct run *r, struct ent *e, const char *p, size_t n, uint64_t s,
                             int kind, int file)
{
    struct ent x;
    if (ent_new(r, &x, p, n, e->key, s, kind, file))
        return;                 /* no memory (r->stop says so): E is left as it was */
    slab_free(&r->mem, e->l0, e->n0);
    slab_free(&r->mem, e->l1, e->n1);
    *e = x;
}

/* The event P (N bytes), number S, kind KIND, added to the entry E of its address: the
 * whole algorithm (Shrinker.feed) once the address has a state.  Returns 1 when the pair
 * cancelled (the entry's line is freed: the caller drops the entry), else 0. */
static inline int ent_update(struct run *r, struct ent *e, int file, uint64_t lineno,
                             const char *p, size_t n, uint64_t s, int kind)
{
    int pend = 0;
    if (!e->hull) {
        if (e->s0 == s) {
            dup_event(r, file, lineno);
            return 0;
        }
        /* an adjacent pair cancels when both events are of this input (all it has of the
         * address); from two inputs, this one's event may be one end of a hull whose other
         * end comes later in it (a result's two lines): the pair is held as a hull until
         * this input's next event of the address, or its end, says it is not (Shrinker.feed) */
        if (e->s0 < s) {          /* old is the low end */
            if ((e->k0 & 1) && !(kind & 1) && s == e->s0 + 1) {
                if (e->file == file) {
                    slab_free(&r->mem, e->l0, e->n0);
                    return 1;
                }
                pend = 2;
            }
            e->l1 = store(r, p, n, &e->n1);
            if (!e->l1)
                return 0;
            e->s1 = s;
            e->k1 = (uint8_t)kind;
        } else {                  /* old is the high end */
            if ((kind & 1) && !(e->k0 & 1) && e->s0 == s + 1) {
                if (e->file == file) {
                    slab_free(&r->mem, e->l0, e->n0);
                    return 1;
                }
                pend = 1;
            }
            char *c = store(r, p, n, &e->n1);   /* n1 temporarily holds the new length */
            if (!c)
                return 0;
            e->l1 = e->l0;
            e->s1 = e->s0;
            e->k1 = e->k0;
            uint32_t nn = e->n1;
            e->n1 = e->n0;
            e->l0 = c;
            e->n0 = nn;
            e->s0 = s;
            e->k0 = (uint8_t)kind;
        }
        e->hull = 1;
        e->pend = (uint8_t)pend;
        e->file = file;
        if (e->k0 != K_FREE)
            to_bracket(r, &e->l0, &e->n0);
        if (e->k1 != K_ALLOC)
            to_bracket(r, &e->l1, &e->n1);
        return 0;
    }
    if (e->pend) {
        /* a held pair: another input's event (the pair's input is over), or this input's
         * next to its end: nothing of it lies between, the pair cancels */
        if (e->file != file ||
            s == (e->pend == 2 ? e->s1 + 1 : e->s0 - 1)) {
            ent_renew(r, e, p, n, s, kind, file);
            return 0;
        }
        e->pend = 0;
    }
    if (s < e->s0)
        new_end(r, &e->l0, &e->n0, &e->s0, &e->k0, p, kind == K_FREE ? n : ptr_len(p), s, kind);
    else if (s > e->s1)
        new_end(r, &e->l1, &e->n1, &e->s1, &e->k1, p, kind == K_ALLOC ? n : ptr_len(p), s, kind);
    else if (s == e->s0 || s == e->s1) {
        dup_event(r, file, lineno);
    }
    return 0;
}

static void note_last(struct run *r);
static void notes_drop(struct run *r);

/* The state update: an event into the table (Shrinker.feed). */
static inline void event(struct run *r, int file, uint64_t lineno, const char *p, size_t n,
                         uint64_t key, uint64_t s, int kind)
{
    struct table *t = &r->t;
    if (t->lazy) {              /* the addresses ascending so far: no index */
        struct ent *last = t->count ? &t->e[t->count - 1] : NULL;
        if (!last || key > last->key) {
            if (r->noting && r->noted < t->count)
                note_last(r);   /* the last entry is what it will be written as */
            if (unlikely(t->count == t->cap) && table_grow(t)) {
                r->stop = -1;
                return;
            }
            if (unlikely((t->count + 1) * sizeof *t->e > t->pop))
                populate_ahead(t);
            if (!ent_new(r, &t->e[t->count], p, n, key, s, kind, file))
                t->count++;
            return;
        }
        if (key == last->key) {
            if (unlikely(r->noting && r->noted >= t->count))
                notes_drop(r);  /* an entry noted changes */
            if (ent_update(r, last, file, lineno, p, n, s, kind))
                t->count--;     /* (its line freed: the last entry, no hole to fill) */
            return;
        }
        if (r->noting)
            notes_drop(r);      /* (the notes hold for a LAZY table only) */
        if (table_index(t)) {   /* a lower address: the index from now on */
            r->stop = -1;
            return;
        }
    }
    size_t i = home(t, key);
    uint32_t x;
    while ((x = t->ix[i]) && t->e[x - 1].key != key)
        i = (i + 1) & t->mask;
    if (!x) {
        if (unlikely(t->count == t->cap || (t->count + 1) * 10 > (t->mask + 1) * 7)) {
            if (table_room(t)) {
                r->stop = -1;
                return;
            }
            event(r, file, lineno, p, n, key, s, kind);
            return;
        }
        if (unlikely((t->count + 1) * sizeof *t->e > t->pop))
            populate_ahead(t);
        if (ent_new(r, &t->e[t->count], p, n, key, s, kind, file))
            return;
        t->ix[i] = (uint32_t)++t->count;
        return;
    }
    if (ent_update(r, &t->e[x - 1], file, lineno, p, n, s, kind))
        table_del(t, i);
}

static int tick(struct run *r, int file, uint64_t file_events)
{
    if (r->on_tick && r->on_tick(file, file_events, r->st->events, r->st->files_done))
        r->stop = 1;
    return r->stop;
}

/* The first newline or NUL in [P, LIM), or NULL. */
static const char *line_end(const char *p, const char *lim)
{
    const char *nl = memchr(p, '\n', (size_t)(lim - p));
    const char *z = memchr(p, 0, (size_t)((nl ? nl : lim) - p));
    return z ? z : nl;
}

static void merge_event(struct run *r, int file, uint64_t lineno, const char *p, size_t n,
                        uint64_t key, uint64_t s, int kind);

/* One line ended by its newline (N bytes at P, at most LINE_MAX + 1). */
static inline __attribute__((always_inline)) void one_line(struct run *r, int file,
                                                             uint64_t lineno, const char *p,
                                                             size_t n, uint64_t *events,
                                                             uint64_t *allocs,
                                                             uint64_t *max_time)
{
    uint64_t key, s, tm = 0;
    int kind = parse_line(p, &key, &s, &tm);
    if (likely(kind >= 0)) {
        if (kind == K_ALLOC) {
            ++*allocs;
            if (tm > *max_time)
                *max_time = tm;
        }
        ++*events;
        if (unlikely(r->merge != NULL))
            merge_event(r, file, lineno, p, n, key, s, kind);
        else
            event(r, file, lineno, p, n, key, s, kind);
    } else {
        odd_line(r, file, lineno, p, n);
    }
}

/* The first line after a run of NULs, an event whose pointer has fewer than 12 digits: the
 * end of a line whose start a hole took (dumpformat.py's CUT_START).  1 if it is (said). */
static __attribute__((cold, noinline)) int cut_start(struct run *r, int file, uint64_t lineno,
                                                     const char *p, size_t n)
{
    uint64_t a, b, c;
    if (parse_line(p, &a, &b, &c) < 0 || ptr_len(p) >= 12)
        return 0;
    problem(r, file, lineno, Q_CUT_START, p, n);
    return 1;
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

/* Shrinker.feed over a descriptor, reading as mmleaklib's dump_lines does: BUF (READ_BUF
 * bytes) holds the start of a line not ended yet (HAVE bytes, no NUL, at most LINE_MAX) and
 * the chunk just read; a run of NULs ends the text before it (cut_line) and the next line
 * starts after it; a line longer than LINE_MAX keeps its head (HEAD bytes) and its rest is
 * skipped; a hole of a regular file is a run of NULs, never read (SEEK_DATA). */
static void feed_fd(struct run *r, int fd, int file, char *buf)
{
    size_t have = 0;
    char head[HEAD];
    size_t head_n = 0;
    int skip = 0, in_nul = 0, failed = 0, hole_to_end = 0;
    int after_nul = 0;                  /* the next line comes right after a run of NULs */
    uint64_t lineno = 0, events = 0, allocs = 0, max_time = r->st->max_time;
    struct stat sb;
    int seekable = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    char *pend = buf;                   /* where the HAVE bytes are */
    off_t at = seekable ? lseek(fd, 0, SEEK_CUR) : 0;  /* the file offset read next */
    if (at < 0)
        at = 0;
    while (!r->stop) {
        int hole = 0;
        if (seekable) {
            off_t cur = lseek(fd, 0, SEEK_CUR), d = cur < 0 ? -1 : lseek(fd, cur, SEEK_DATA);
            if (cur < 0) {
                seekable = 0;
            } else if (d < 0 && errno == ENXIO) {   /* no data after CUR: a hole to the end? */
                hole = hole_to_end = fstat(fd, &sb) == 0 && cur < sb.st_size;
            } else if (d < 0) {
                seekable = 0;           /* no SEEK_DATA here: all of it is data */
            } else {
                hole = d > cur;
                at = d;
            }
        }
        if (hole) {                     /* as many NULs as the hole is long */
            if (skip) {
                long_line(r, file, lineno + 1, head, head_n, 0);
                skip = 0;
            } else if (!in_nul) {
                cut_line(r, file, lineno + 1, pend, have, 0);
                have = 0;
            }
            in_nul = after_nul = 1;
            if (hole_to_end)
                break;
        }
        /* the chunk goes where its bytes have the file's alignment in a page: the kernel
         * copies from the page cache a third faster than to a place out of step with it */
        char *to = buf + (((uint64_t)at - have) & 4095);
        if (to != pend)
            memmove(to, pend, have);
        pend = to;
        ssize_t got = read(fd, pend + have, READ_CHUNK);
        if (got < 0) {
            if (errno == EINTR) {
                tick(r, file, events);
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
        const char *p = pend, *q = pend + have, *lim = pend + have + (size_t)got;
        if (skip) {                     /* the rest of a line too long, up to its end */
            const char *t = line_end(q, lim);
            if (!t) {
                have = 0;
                continue;
            }
            if (*t == '\n')
                lineno++;
            long_line(r, file, *t ? lineno : lineno + 1, head, head_n, *t);
            skip = 0;
            in_nul = after_nul = !*t;
            p = q = t + 1;
        }
        if (in_nul) {                   /* a run of NULs that goes on */
            while (q < lim && !*q)
                q++;
            p = q;
            if (q == lim) {
                have = 0;
                continue;
            }
            in_nul = 0;
        }
        /* one loop, one place where a line is parsed (inlined once: the parser and the
         * state update stay inlined); NULs are looked for only in a chunk that has some */
        int nuls = memchr(q, 0, (size_t)(lim - q)) != NULL;
        const char *t;
        struct ahead ah;
        ahead_start(&ah, &r->t, p, lim, nuls || r->merge || r->t.lazy);
        while ((t = nuls ? line_end(q, lim) : memchr(q, '\n', (size_t)(lim - q))) != NULL) {
            ahead_step(&ah, &r->t);
            size_t n = (size_t)(t - p);         /* the text, without what ended it */
            if (likely(*t == '\n')) {
                lineno++;
                if (unlikely(after_nul)) {
                    after_nul = 0;
                    if (n <= LINE_MAX_BYTES && cut_start(r, file, lineno, p, n + 1)) {
                        p = q = t + 1;
                        continue;
                    }
                }
                if (unlikely(n > LINE_MAX_BYTES))
                    long_line(r, file, lineno, p, HEAD, '\n');
                else
                    one_line(r, file, lineno, p, n + 1, &events, &allocs, &max_time);
                p = q = t + 1;
                if (unlikely(r->stop) ||
                    (unlikely((lineno & 0xFFFF) == 0) && tick(r, file, events)))
                    break;
                continue;
            }
            if (n > LINE_MAX_BYTES)             /* text cut by a run of NULs */
                long_line(r, file, lineno + 1, p, HEAD, 0);
            else
                cut_line(r, file, lineno + 1, p, n, 0);
            while (++t < lim && !*t)
                ;
            in_nul = t == lim;
            after_nul = 1;
            p = q = t;
            if (r->stop)
                break;
        }
        if (r->stop)
            break;
        have = (size_t)(lim - p);
        pend = (char *)p;
        if (have > LINE_MAX_BYTES) {    /* too long: keep its head, skip the rest */
            head_n = HEAD;
            memcpy(head, pend, HEAD);
            skip = 1;
            have = 0;
        }
    }
    if (!r->stop && !failed) {          /* the last line, without its newline */
        if (skip)
            long_line(r, file, ++lineno, head, head_n, -1);
        else if (have)
            odd_line(r, file, ++lineno, pend, have);
    }
    r->st->events += events;
    r->st->allocs += allocs;
    r->st->max_time = max_time;
    if (!r->stop && !failed)
        r->st->files_done++;
}

static int cmp_ent(const void *a, const void *b)
{
    uint64_t x = ((const struct ent *)a)->key, y = ((const struct ent *)b)->key;
    return x < y ? -1 : x > y;
}

/* A hull end: its line, or (EVENT 0) its bracket "PTR SEQ SIGN" (L holds only the PTR). */
static void put_end(struct obuf *o, const char *l, size_t n, uint64_t s, char sign, int event)
{
    ob_put(o, l, n);
    if (event)
        return;
    ob_put(o, " ", 1);
    ob_u(o, s, 16);
    char t[2] = { ' ', sign };
    ob_put(o, t, 2);
    ob_put(o, "\n", 1);
}

/* Note stack id ID as used by the result (a set: open addressing, doubled at half load). */
static int use_stack(struct run *r, uint64_t id)
{
    if (!id) {
        r->used_zero = 1;
        return 0;
    }
    if (id == r->last_used)     /* the result's lines come by address: runs of one stack */
        return 0;
    if (!r->used || (r->used_n + 1) * 2 > r->used_mask + 1) {
        size_t cap = r->used ? (r->used_mask + 1) * 2 : 256;
        uint64_t *nv = map_mem(cap * sizeof *nv);
        if (!nv)
            return -1;
        for (size_t i = 0; r->used && i <= r->used_mask; i++) {
            if (!r->used[i])
                continue;
            size_t j = (size_t)((r->used[i] * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
            while (nv[j])
                j = (j + 1) & (cap - 1);
            nv[j] = r->used[i];
        }
        if (r->used)
            munmap(r->used, (r->used_mask + 1) * sizeof *nv);
        r->used = nv;
        r->used_mask = cap - 1;
    }
    size_t j = (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) & r->used_mask;
    for (; r->used[j]; j = (j + 1) & r->used_mask)
        if (r->used[j] == id) {
            r->last_used = id;
            return 0;
        }
    r->used[j] = id;
    r->used_n++;
    r->last_used = id;
    return 0;
}

/* An allocation line of the result (valid: parse_line took it), N bytes with its newline:
 * its size, time and stack.  Its first two fields (PTR and SEQ) are skipped, not parsed;
 * a stack reference that is the same text as the last line's is not looked up again (the
 * result comes by address, and neighbours often share their stack). */
static void note_alloc(struct run *r, const char *l, size_t n)
{
    uint64_t v, size = 0, tm = 0;
    const char *q = memchr(l, ' ', n);
    q = memchr(q + 1, ' ', n - (size_t)(q + 1 - l));
    q = hexf(q + 1, &size);
    q = hexf(q + 1, &tm);
    r->st->alloc_bytes_hi += (r->st->alloc_bytes += size) < size;
    if (tm > r->st->newest)
        r->st->newest = tm;
    if (!q || q[0] != ' ' || q[1] != '@')
        return;
    const char *id = q + 2;
    size_t len = (size_t)(l + n - 1 - id);
    if (len == r->last_ref_n && !memcmp(id, r->last_ref, len))
        return;
    if (hexf(id, &v) && use_stack(r, v))
        r->stop = -1;
    if (len <= sizeof r->last_ref) {
        memcpy(r->last_ref, id, len);
        r->last_ref_n = len;
    } else
        r->last_ref_n = 0;
}

/* What put_ent does with an entry: its lines written (PUT_LINES), its allocations noted
 * and the lines counted (PUT_NOTE), or both. */
enum { PUT_LINES = 1, PUT_NOTE = 2, PUT_BOTH = 3 };

/* The lines of the entry E (FINAL: without brackets) to O; C: lines, allocations and frees
 * written, counted. */
static inline __attribute__((always_inline)) void put_ent(struct run *r, struct obuf *o,
                                                          int final, const struct ent *e,
                                                          uint64_t c[3], int what)
{
    if (e->pend)                /* a held pair whose inputs are over: it cancelled */
        return;
    if (!e->hull) {
        if (!final || e->k0 == K_ALLOC || e->k0 == K_FREE) {
            if (what & PUT_LINES)
                ob_put(o, e->l0, e->n0);
            if (!(what & PUT_NOTE))
                return;
            c[0]++;
            if (e->k0 == K_ALLOC) {
                c[1]++;
                note_alloc(r, e->l0, e->n0);
            }
            c[2] += e->k0 == K_FREE;
        }
        return;
    }
    if (e->k0 == K_FREE || !final) {
        if (what & PUT_LINES)
            put_end(o, e->l0, e->n0, e->s0, '+', e->k0 == K_FREE);
        if (what & PUT_NOTE) {
            c[0]++;
            c[2] += e->k0 == K_FREE;
        }
    }
    if (e->k1 == K_ALLOC || !final) {
        if (what & PUT_LINES)
            put_end(o, e->l1, e->n1, e->s1, '-', e->k1 == K_ALLOC);
        if (what & PUT_NOTE) {
            c[0]++;
            if (e->k1 == K_ALLOC) {
                c[1]++;
                note_alloc(r, e->l1, e->n1);
            }
        }
    }
}

static void write_end(struct run *r, struct obuf *o);
static void hand_used(struct run *r);

/* The last entry of the LAZY table noted for the head (see struct run's NOTING). */
static void note_last(struct run *r)
{
    const struct ent *e = &r->t.e[r->t.count - 1];
    r->npend += e->pend != 0;
    put_ent(r, NULL, r->final_notes, e, r->nc, PUT_NOTE);
    r->noted = r->t.count;
}

/* The notes taken while reading dropped: write_state takes them all. */
static __attribute__((cold, noinline)) void notes_drop(struct run *r)
{
    r->noting = 0;
    r->noted = 0;
    memset(r->nc, 0, sizeof r->nc);
    r->npend = 0;
    r->st->alloc_bytes = r->st->alloc_bytes_hi = r->st->newest = 0;
    if (r->used)
        munmap(r->used, (r->used_mask + 1) * sizeof *r->used);
    r->used = NULL;
    r->used_mask = r->used_n = 0;
    r->used_zero = 0;
    r->last_used = 0;
    r->last_ref_n = 0;
}

/* Shrinker.entries: sorted by address then number; FINAL drops brackets.  The M entries
 * E (the table's, or those mmleak_shrink_blocks leaves) are sorted in place (a LAZY
 * table's are sorted already). */
static void write_state(struct run *r, struct obuf *o, int final, struct ent *ents, size_t m)
{
    int table = ents == r->t.e && m == r->t.count;
    size_t sorted = table && r->t.lazy ? m : 1;
    while (sorted < m && ents[sorted - 1].key < ents[sorted].key)
        sorted++;
    if (sorted < m)             /* (a result read whole comes in order: no sort then) */
        qsort(ents, m, sizeof *ents, cmp_ent);
    uint64_t c[3] = { 0, 0, 0 }, npend = 0;
    if (r->head_first) {        /* what the head needs first, then the head, then the lines */
        size_t from = 0;
        if (r->noting && table && r->t.lazy && r->final_notes == final && r->noted <= m) {
            from = r->noted;    /* noted while reading */
            memcpy(c, r->nc, sizeof c);
            npend = r->npend;
        } else if (r->noting) {
            notes_drop(r);
        }
        r->noting = 0;
        for (size_t i = from; i < m; i++) {
            npend += ents[i].pend != 0;         /* a held pair: it cancelled */
            put_ent(r, o, final, &ents[i], c, PUT_NOTE);
        }
        r->st->entries = m - npend;
        r->st->lines = c[0];
        r->st->alloc_lines = c[1];
        r->st->free_lines = c[2];
        hand_used(r);
        if (r->stop || (r->on_header && r->on_header(NULL, 0, -1, 0))) {
            r->stop = r->stop ? r->stop : 1;
            return;
        }
        for (size_t i = 0; i < m; i++)
            put_ent(r, o, final, &ents[i], c, PUT_LINES);
        ob_flush(o);
        return;
    }
    for (size_t i = 0; i < m; i++) {
        npend += ents[i].pend != 0;             /* a held pair: it cancelled */
        put_ent(r, o, final, &ents[i], c, PUT_BOTH);
    }
    r->st->entries = m - npend;
    r->st->lines = c[0];
    r->st->alloc_lines = c[1];
    r->st->free_lines = c[2];
    write_end(r, o);
}

/* The end of a result written: the output flushed, the stack ids it uses handed over. */
static void write_end(struct run *r, struct obuf *o)
{
    ob_flush(o);
    hand_used(r);
}

/* The stack ids the result uses, packed at the front of their own mapping, handed over
 * (stats' used, nused, used_bytes). */
static void hand_used(struct run *r)
{
    size_t n = 0;
    for (size_t i = 0; r->used && i <= r->used_mask; i++)
        if (r->used[i])
            r->used[n++] = r->used[i];
    if (r->used_zero) {
        if (!r->used && use_stack(r, 1)) {      /* a mapping for the one id 0 */
            r->stop = -1;
            return;
        }
        r->used[n++] = 0;
    }
    r->st->used = (uint64_t)(uintptr_t)r->used;
    r->st->nused = n;
    r->st->used_bytes = r->used ? (r->used_mask + 1) * sizeof *r->used : 0;
    r->used = NULL;
    r->last_used = 0;
    r->last_ref_n = 0;
}

/* The run both entry points share: shrink PATHS into R's table (see mmleak_shrink).
 * Returns 0, or the status to return (1, -1). */
static int shrink_inputs(struct run *r, const char *const *paths, const int *name_id,
                         int npaths, int show, mmleak_header_cb on_header,
                         mmleak_tick_cb on_tick, mmleak_open_cb on_open,
                         mmleak_problem_cb on_problem, uint64_t *counts,
                         struct mmleak_shrink_stats *stats, char *buf)
{
    if (table_init(&r->t, 16))
        return -1;
    memset(stats, 0, sizeof *stats);
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

static void run_release(struct run *r)
{
    if (r->t.e)
        munmap(r->t.e, r->t.e_bytes);
    /* the stack ids of a run stopped before write_end handed them over (hand_used) */
    if (r->used)
        munmap(r->used, (r->used_mask + 1) * sizeof *r->used);
    if (r->t.ix)
        munmap(r->t.ix, r->t.ix_bytes);
    slab_release(&r->mem);
    hset_release(&r->headers);
}

/* The end of a call of mmleak_shrink or mmleak_shrink_blocks: the run's memory, the read
 * buffer BUF and the output buffer OUT go back; RC is returned. */
static int run_end(struct run *r, char *buf, struct obuf *out, int rc)
{
    run_release(r);
    if (buf)
        munmap(buf, READ_BUF);
    if (out)
        munmap(out, sizeof *out);
    return rc;
}

/* Shrink PATHS ("-" is stdin, descriptor 0; any other is opened by ON_OPEN) and write the
 * result (events only, no header lines: those go to the header callback) to OUT_FD.
 * NAME_ID[i]: the index of the first input with the name input i has in messages; COUNTS
 * (npaths * 4: torn, padding, malformed, duplicate) receives the problem counts under it,
 * and the first SHOW problems of each kind and name go to ON_PROBLEM.
 * FINAL: SHRINK_FINAL, the final result (no brackets); SHRINK_HEAD_FIRST: OUT_FD is where
 * the whole result goes (no temporary file): once the lines are known, before any is
 * written, ON_HEADER is called with no line (LINE NULL, FILE -1), STATS already saying what
 * the head needs (newest, used, and the counts of lines), to write the head lines there.
 * Returns 0 when done, 1 when a callback stopped the run, -1 out of memory, -2 output error
 * (the errno in stats->out_errno). */
EXPORT int mmleak_shrink(const char *const *paths, const int *name_id, int npaths, int out_fd,
                      int show, int final, mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                      mmleak_open_cb on_open, mmleak_problem_cb on_problem, uint64_t *counts,
                      struct mmleak_shrink_stats *stats)
{
    struct obuf *out = map_mem(sizeof *out);
    char *buf = map_mem(READ_BUF);
    struct run r;
    memset(&r, 0, sizeof r);
    r.head_first = (final & SHRINK_HEAD_FIRST) != 0;
    r.noting = r.head_first;    /* the head's notes taken while reading, where they can be */
    r.final_notes = final & SHRINK_FINAL;
    int rc = !out || !buf ? -1 : shrink_inputs(&r, paths, name_id, npaths, show, on_header,
                                                on_tick, on_open, on_problem, counts, stats,
                                                buf);
    if (rc == 0) {
        out->fd = out_fd;
        write_state(&r, out, final & SHRINK_FINAL, r.t.e, r.t.count);
        rc = r.stop;
        if (rc == 0 && out->err) {
            stats->out_errno = (uint64_t)out->err;
            rc = -2;
        }
    }
    return run_end(&r, buf, out, rc);
}

/* An allocation line as a block: "PTR SEQ SIZE TIME @ID\n" (a stack's id) or "PTR SEQ SIZE
 * TIME CALLER\n" (one caller inline); 0 when the line is neither (format 1 with several
 * callers inline). */
static int block_of(const char *l, struct mmleak_block *b)
{
    const char *q = hexf(l, &b->ptr);
    if (!q || *q != ' ' || !(q = hexf(q + 1, &b->seq)) || *q != ' ' ||
        !(q = hexf(q + 1, &b->size)) || *q != ' ' || !(q = hexf(q + 1, &b->time)) ||
        q[0] != ' ')
        return 0;
    b->frame = q[1] != '@';
    b->pad = 0;
    q = hexf(q + 1 + !b->frame, &b->stack);
    return q && *q == '\n';
}

/* What the entry points that give blocks start with: their buffers, BLOCKS emptied, the
 * inputs read into R's state.  Returns as shrink_inputs (-1: no memory for the buffers). */
static int read_for_blocks(struct run *r, struct obuf **out, char **buf,
                           const char *const *paths, const int *name_id, int npaths, int show,
                           mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                           mmleak_open_cb on_open, mmleak_problem_cb on_problem,
                           uint64_t *counts, struct mmleak_shrink_stats *stats,
                           struct mmleak_blocks *blocks)
{
    *out = map_mem(sizeof **out);
    *buf = map_mem(READ_BUF);
    memset(r, 0, sizeof *r);
    memset(blocks, 0, sizeof *blocks);
    return !*out || !*buf ? -1 : shrink_inputs(r, paths, name_id, npaths, show, on_header,
                                               on_tick, on_open, on_problem, counts, stats,
                                               *buf);
}

/* The final result of mmleak_shrink (FINAL 1) in two parts: the survivors as blocks in
 * BLOCKS (an array in a mapping of its own: mmleak_blocks_free; in the table's
 * order, not sorted), and the rest as lines to OUT_FD, sorted by address: the foreign frees
 * and the survivors with several callers inline (format 1).  stats->lines counts those lines
 * only.  Returns as mmleak_shrink. */
/* The final result of R's table (read already) as mmleak_shrink_blocks gives it: the survivors
 * as blocks in BLOCKS, the rest as lines to OUT.  Returns 0, -1 (no memory), -2 (output). */
static int final_blocks(struct run *r, struct obuf *out, struct mmleak_shrink_stats *stats,
                        struct mmleak_blocks *blocks)
{
    int rc = 0;
    {
        /* The blocks take the place of the entries, in the same mapping (a block is smaller
         * than an entry, and block k is written over entries before i >= k: read first):
         * the state's memory becomes the result's.  The entries that are not blocks (foreign
         * frees, survivors with several callers) go to REST, to be written as lines. */
        struct table *t = &r->t;
        struct mmleak_block *v = (struct mmleak_block *)(void *)t->e;
        size_t k = 0, nrest = 0, rest_bytes = 0;
        struct ent *rest = NULL;
        if (t->ix)
            munmap(t->ix, t->ix_bytes);
        t->ix = NULL;
        for (size_t i = 0; i < t->count; i++) {
            struct ent e = t->e[i];
            struct mmleak_block b;
            if (!e.hull) {
                if (e.k0 == K_ALLOC && block_of(e.l0, &b)) {
                    v[k++] = b;
                    continue;
                }
                if (e.k0 != K_ALLOC && e.k0 != K_FREE)
                    continue;           /* a bracket: nothing final */
            } else {
                if (e.k1 == K_ALLOC && block_of(e.l1, &b)) {
                    v[k++] = b;
                    e.k1 = K_END;       /* a bracket: the final result leaves it out */
                }
                if (e.k0 != K_FREE && e.k1 != K_ALLOC)
                    continue;
            }
            if ((nrest + 1) * sizeof *rest > rest_bytes) {
                size_t nb = rest_bytes ? rest_bytes * 2 : 1 << 16;
                void *p = rest ? mremap(rest, rest_bytes, nb, MREMAP_MAYMOVE) : map_mem(nb);
                if (!p || p == MAP_FAILED) {
                    rc = -1;
                    break;
                }
                rest = p;
                rest_bytes = nb;
            }
            rest[nrest++] = e;
        }
        if (rc == 0) {
            write_state(r, out, 1, rest, nrest);
            stats->entries += k;
            if (out->err) {
                stats->out_errno = (uint64_t)out->err;
                rc = -2;
            }
        }
        if (rest)
            munmap(rest, rest_bytes);
        if (rc == 0) {
            blocks->v = v;
            blocks->n = k;
            blocks->cap_bytes = t->e_bytes;
            t->e = NULL;                /* the blocks' now */
        }
    }
    return rc;
}

EXPORT int mmleak_shrink_blocks(const char *const *paths, const int *name_id, int npaths,
                                int out_fd, int show, mmleak_header_cb on_header,
                                mmleak_tick_cb on_tick, mmleak_open_cb on_open,
                                mmleak_problem_cb on_problem, uint64_t *counts,
                                struct mmleak_shrink_stats *stats,
                                struct mmleak_blocks *blocks)
{
    struct obuf *out;
    char *buf;
    struct run r;
    int rc = read_for_blocks(&r, &out, &buf, paths, name_id, npaths, show, on_header, on_tick,
                             on_open, on_problem, counts, stats, blocks);
    if (rc == 0) {
        out->fd = out_fd;
        rc = final_blocks(&r, out, stats, blocks);
    }
    return run_end(&r, buf, out, rc);
}

/* The survivors of R's table (its entries, written already) as blocks in BLOCKS, over the
 * entries in place (block k over entries before i >= k, each read first), as
 * mmleak_shrink_blocks gives them; BLOCKS left empty when a survivor is not a block. */
static void table_blocks(struct run *r, struct mmleak_blocks *blocks)
{
    struct table *t = &r->t;
    struct mmleak_block *v = (struct mmleak_block *)(void *)t->e;
    size_t k = 0;
    int whole = 1;
    for (size_t i = 0; i < t->count && whole; i++) {
        struct ent e = t->e[i];
        struct mmleak_block b;
        int k_last = e.hull ? e.k1 : e.k0;
        if (k_last != K_ALLOC)
            continue;       /* freed, a bracket or a foreign free: not alive */
        if (!block_of(e.hull ? e.l1 : e.l0, &b))
            whole = 0;
        else
            v[k++] = b;
    }
    if (whole) {
        if (t->ix)
            munmap(t->ix, t->ix_bytes);
        t->ix = NULL;
        blocks->v = v;
        blocks->n = k;
        blocks->cap_bytes = t->e_bytes;
        t->e = NULL;                /* the blocks' now */
    }
}

/* mmleak_shrink's result (not final, every entry) written to OUT_FD as mmleak_shrink writes
 * it, and then its survivors as blocks in BLOCKS, as mmleak_shrink_blocks gives them: what
 * the last compaction pass of a trace writes and what that trace's last series point reads,
 * from one reading of the inputs.  Returns as mmleak_shrink; 0 with BLOCKS empty (v NULL)
 * when a survivor is not a block (several callers inline, format 1): then the caller reads
 * the result again. */
EXPORT int mmleak_shrink_result_blocks(const char *const *paths, const int *name_id,
                                       int npaths, int out_fd, int show,
                                       mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                                       mmleak_open_cb on_open, mmleak_problem_cb on_problem,
                                       uint64_t *counts, struct mmleak_shrink_stats *stats,
                                       struct mmleak_blocks *blocks)
{
    struct obuf *out;
    char *buf;
    struct run r;
    int rc = read_for_blocks(&r, &out, &buf, paths, name_id, npaths, show, on_header, on_tick,
                             on_open, on_problem, counts, stats, blocks);
    if (rc == 0) {
        struct table *t = &r.t;
        out->fd = out_fd;
        write_state(&r, out, 0, t->e, t->count);    /* (sorts the entries in place) */
        if (out->err) {
            stats->out_errno = (uint64_t)out->err;
            rc = -2;
        }
    }
    if (rc == 0)
        table_blocks(&r, blocks);
    return run_end(&r, buf, out, rc);
}

/* ---- the last input streamed: a merge of sorted results (mmleak_shrink_merge) ---------
 * A compacted result is written sorted by address (write_state), and the levels of a trace
 * (mmleak-compaction(7)) are such results.  Folding them, the biggest (the oldest) need not
 * go through the table: the other inputs are read into it as usual, its entries sorted, and
 * the big one is read as a stream, its lines merged by address with those entries (an
 * address's state is the same whatever the order of its events: the shrink's algebra), each
 * address written out as soon as the stream has passed it.  Memory and time then follow the
 * other inputs, plus one pass over the streamed one's text: no index slot per line, no
 * sort of its entries. */
struct merge {
    struct ent *e;              /* the table's entries, sorted by address */
    size_t m, j;                /* how many; the first not written yet */
    struct ent cur;             /* the state of the stream's current address */
    int have;                   /* CUR holds an entry */
    int started, disorder;      /* the stream's address went down: not a sorted result */
    uint64_t last;              /* the stream's last address */
    struct obuf *o;
    uint64_t c[3], entries;     /* lines, allocations, frees written; entries */
    struct mmleak_blocks *blocks;   /* the survivors as blocks too (NULL: not wanted) */
    size_t bytes;               /* the blocks' mapping */
    int whole;                  /* every survivor so far is a block */
    int final;                  /* the final result, as mmleak_shrink_blocks gives it */
};

/* The survivor line L as a block appended to the merge's BLOCKS: 1, or 0 when it is not a
 * block (several callers inline) or there is no memory (r->stop). */
static int merge_block(struct run *r, struct merge *g, const char *l)
{
    struct mmleak_blocks *b = g->blocks;
    if ((b->n + 1) * sizeof *b->v > g->bytes) {
        size_t nb = g->bytes ? g->bytes * 2 : (size_t)1 << 21;
        void *p = b->v ? mremap(b->v, g->bytes, nb, MREMAP_MAYMOVE) : map_mem(nb);
        if (!p || p == MAP_FAILED) {
            r->stop = -1;
            return 0;
        }
        b->v = p;
        g->bytes = nb;
    }
    if (!block_of(l, &b->v[b->n]))
        return 0;
    b->n++;
    return 1;
}

/* The entry E written (and its survivor kept as a block), its lines freed. */
static void merge_put(struct run *r, struct merge *g, struct ent *e)
{
    int k_last = e->hull ? e->k1 : e->k0;
    if (g->final) {             /* as final_blocks: a survivor a block, the rest lines */
        struct ent x = *e;
        int line = 1;
        if (!x.hull) {
            if (x.k0 == K_ALLOC && merge_block(r, g, x.l0))
                line = 0;
            else if (x.k0 != K_ALLOC && x.k0 != K_FREE)
                line = 0;       /* a bracket: nothing final */
        } else {
            if (x.k1 == K_ALLOC && merge_block(r, g, x.l1))
                x.k1 = K_END;   /* a bracket: the final result leaves it out */
            line = x.k0 == K_FREE || x.k1 == K_ALLOC;
        }
        if (line) {
            put_ent(r, g->o, 1, &x, g->c, PUT_BOTH);
            g->entries++;
        }
    } else if (!e->pend) {      /* (a held pair: it cancelled) */
        put_ent(r, g->o, 0, e, g->c, PUT_BOTH);
        g->entries++;
        if (g->blocks && g->whole && k_last == K_ALLOC &&
            !merge_block(r, g, e->hull ? e->l1 : e->l0))
            g->whole = 0;       /* (several callers inline: the caller reads again) */
    }
    slab_free(&r->mem, e->l0, e->n0);
    if (e->hull)
        slab_free(&r->mem, e->l1, e->n1);
}

/* An event of the streamed input: the state update of its address (the table's entry of
 * the same address, taken over when the stream reaches it), the addresses before it
 * written. */
static void merge_event(struct run *r, int file, uint64_t lineno, const char *p, size_t n,
                        uint64_t key, uint64_t s, int kind)
{
    struct merge *g = r->merge;
    if (g->have && key == g->cur.key) {
        if (ent_update(r, &g->cur, file, lineno, p, n, s, kind))
            g->have = 0;
        return;
    }
    if (unlikely(g->started && key < g->last)) {
        g->disorder = 1;        /* not sorted: mmleak_shrink_merge reads it all again */
        r->stop = 2;
        return;
    }
    g->started = 1;
    g->last = key;
    if (g->have) {
        merge_put(r, g, &g->cur);
        g->have = 0;
    }
    while (g->j < g->m && g->e[g->j].key < key)
        merge_put(r, g, &g->e[g->j++]);
    if (g->j < g->m && g->e[g->j].key == key) {
        g->cur = g->e[g->j++];
        g->have = !ent_update(r, &g->cur, file, lineno, p, n, s, kind);
    } else {
        g->have = !ent_new(r, &g->cur, p, n, key, s, kind, file);
    }
}

/* mmleak_shrink_result_blocks (BLOCKS NULL: mmleak_shrink, not final; FINAL: as
 * mmleak_shrink_blocks, BLOCKS needed), the LAST input
 * (PATHS[NPATHS - 1]: a compacted result, sorted by address) read as a stream and merged
 * with the others' state (see struct merge): the same result, the same counts and problems.
 * The others are read first, so header lines come in that order (the caller lists the
 * inputs so).  An input to stream that is not sorted is read again with the others, the
 * usual way (the problems already handed back are not handed back again).  Returns as
 * mmleak_shrink. */
static int shrink_merge(const char *const *paths, const int *name_id, int npaths, int out_fd,
                        int show, mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                        mmleak_open_cb on_open, mmleak_problem_cb on_problem, uint64_t *counts,
                        struct mmleak_shrink_stats *stats, struct mmleak_blocks *blocks,
                        int final)
{
    struct obuf *out = map_mem(sizeof *out);
    char *buf = map_mem(READ_BUF);
    struct run r;
    struct merge g;
    memset(&r, 0, sizeof r);
    memset(&g, 0, sizeof g);
    if (blocks)
        memset(blocks, 0, sizeof *blocks);
    if (!out || !buf || npaths < 1)
        return run_end(&r, buf, out, !out || !buf ? -1 : 0);
    out->fd = out_fd;
    int last = npaths - 1;
    int rc = shrink_inputs(&r, paths, name_id, last, show, on_header, on_tick, on_open,
                           on_problem, counts, stats, buf);
    memset(&counts[(size_t)last * P_KINDS], 0, sizeof(uint64_t) * P_KINDS);
    if (rc == 0) {
        int fd = strcmp(paths[last], "-") ? on_open(last) : 0;
        if (fd == -2)
            rc = r.stop = 1;
        else if (fd < 0)
            stats->fatal = 1;
        qsort(r.t.e, r.t.count, sizeof *r.t.e, cmp_ent);
        g.e = r.t.e;
        g.m = r.t.count;
        g.o = out;
        g.blocks = blocks;
        g.whole = 1;
        g.final = final;
        if (fd >= 0) {
            r.merge = &g;
            feed_fd(&r, fd, last, buf);
            if (fd)
                close(fd);
        }
        if (!r.stop) {
            if (g.have)
                merge_put(&r, &g, &g.cur);
            g.have = 0;
            while (g.j < g.m && !r.stop)
                merge_put(&r, &g, &g.e[g.j++]);
        }
        r.merge = NULL;
        rc = r.stop;
    }
    if (rc == 2 && g.disorder) {
        /* not a sorted result: everything again, the usual way, into a new table (the
         * header lines seen stay seen: not handed back again) */
        size_t cb = sizeof(uint64_t) * P_KINDS * (size_t)npaths;
        uint64_t *mute = map_mem(cb);
        if (!mute)
            return run_end(&r, buf, out, -1);
        memcpy(mute, counts, cb);
        if (blocks && blocks->v)
            munmap(blocks->v, g.bytes);
        if (blocks)
            memset(blocks, 0, sizeof *blocks);
        munmap(r.t.e, r.t.e_bytes);
        if (r.t.ix)
            munmap(r.t.ix, r.t.ix_bytes);
        memset(&r.t, 0, sizeof r.t);
        slab_release(&r.mem);
        memset(&r.mem, 0, sizeof r.mem);
        if (r.used)
            munmap(r.used, (r.used_mask + 1) * sizeof *r.used);
        r.used = NULL;
        r.used_mask = r.used_n = 0;
        r.used_zero = 0;
        r.last_used = 0;
        r.last_ref_n = 0;
        r.stop = 0;
        r.mute = mute;
        out->n = 0;
        out->err = 0;
        if (ftruncate(out_fd, 0) || lseek(out_fd, 0, SEEK_SET) < 0) {
            stats->out_errno = (uint64_t)errno;
            munmap(mute, cb);
            return run_end(&r, buf, out, -2);
        }
        rc = shrink_inputs(&r, paths, name_id, npaths, show, on_header, on_tick, on_open,
                           on_problem, counts, stats, buf);
        r.mute = NULL;
        munmap(mute, cb);
        if (rc == 0 && final) {
            rc = final_blocks(&r, out, stats, blocks);
        } else if (rc == 0) {
            write_state(&r, out, 0, r.t.e, r.t.count);
            if (!out->err && blocks)
                table_blocks(&r, blocks);
        }
    } else if (rc == 0) {
        stats->entries = g.entries + (final ? blocks->n : 0);
        stats->lines = g.c[0];
        stats->alloc_lines = g.c[1];
        stats->free_lines = g.c[2];
        write_end(&r, out);
        if (blocks && !g.whole) {       /* (the caller reads the result again) */
            if (blocks->v)
                munmap(blocks->v, g.bytes);
            memset(blocks, 0, sizeof *blocks);
        } else if (blocks) {
            if (!blocks->v && (blocks->v = map_mem(4096)) != NULL)
                g.bytes = 4096;         /* no survivor: an empty array, not none */
            blocks->cap_bytes = g.bytes;
            if (!blocks->v)
                rc = -1;
        }
    }
    if (rc == 0 && out->err) {
        stats->out_errno = (uint64_t)out->err;
        rc = -2;
    }
    if (rc != 0 && blocks && blocks->v) {
        munmap(blocks->v, blocks->cap_bytes ? blocks->cap_bytes : g.bytes);
        memset(blocks, 0, sizeof *blocks);
    }
    return run_end(&r, buf, out, rc);
}

EXPORT int mmleak_shrink_merge(const char *const *paths, const int *name_id, int npaths,
                               int out_fd, int show, mmleak_header_cb on_header,
                               mmleak_tick_cb on_tick, mmleak_open_cb on_open,
                               mmleak_problem_cb on_problem, uint64_t *counts,
                               struct mmleak_shrink_stats *stats, struct mmleak_blocks *blocks)
{
    return shrink_merge(paths, name_id, npaths, out_fd, show, on_header, on_tick, on_open,
                        on_problem, counts, stats, blocks, 0);
}

/* mmleak_shrink_blocks, the last input streamed as in mmleak_shrink_merge (BLOCKS needed). */
EXPORT int mmleak_shrink_blocks_merge(const char *const *paths, const int *name_id,
                                      int npaths, int out_fd, int show,
                                      mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                                      mmleak_open_cb on_open, mmleak_problem_cb on_problem,
                                      uint64_t *counts, struct mmleak_shrink_stats *stats,
                                      struct mmleak_blocks *blocks)
{
    return shrink_merge(paths, name_id, npaths, out_fd, show, on_header, on_tick, on_open,
                        on_problem, counts, stats, blocks, 1);
}

/* Release the stack ids a run handed over in STATS. */
EXPORT void mmleak_shrink_stats_free(struct mmleak_shrink_stats *stats)
{
    if (stats->used)
        munmap((void *)(uintptr_t)stats->used, stats->used_bytes);
    stats->used = 0;
    stats->nused = 0;
}

/* The interface version mmleak.py checks before it relies on the functions' signatures. */
EXPORT int mmleak_shrink_abi(void) { return 8; }
