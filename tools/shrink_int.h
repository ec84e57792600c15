/* tools/shrink_int.h: what the files of the compiled shrinker share (tools/shrink.c, the
 * entry points, says what it does and lists the files): the status records and callbacks of
 * its interface, the state a run keeps (the line storage, the table of entries, the headers
 * seen, the output buffer, struct run) and the functions one file calls in another.  The few
 * operations of the state that the reader's loop runs per event stay inline here (home,
 * slab_free, table_del), so that splitting the files changed no code the loop runs.  Not an
 * interface of mmleak-tools.so: the EXPORT functions are (mmleaklib/native.py). */
#ifndef MMLEAK_SHRINK_INT_H
#define MMLEAK_SHRINK_INT_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "../tracer/compiler.h"
#include "blocks.h"
#include "dumplines.h"
#include "eventline.h"
#include "facts.h"

enum { P_TORN = 0, P_PADDING = 1, P_MALFORMED = 2, P_DUPLICATE = 3, P_KINDS = 4 };
/* What a problem is (mmleaklib's dumpformat.PROBLEMS words each, and knows its kind). */
enum {
    /* what the reader finds (tools/dumplines.h) */
    Q_TORN_LINE = DL_TORN,      /* a line without its end (process killed while writing it?) */
    Q_TORN_LAST = DL_TORN_LAST, /* a '#' line without its newline, at the end */
    Q_PADDING_END = DL_PADDING_END, /* blanks after the last line */
    Q_NULS = DL_NULS,           /* a run of NUL bytes (padding, or a hole a crash left) */
    Q_TOO_LONG = DL_TOO_LONG,   /* a line longer than LINE_MAX */
    Q_MALFORMED = 6,    /* not a line of the format */
    Q_CUT_START = DL_CUT_START, /* a line after NULs with a pointer too short: its start is lost */
    Q_DUPLICATE,        /* an event seen twice */
    Q_UNREADABLE,       /* read() failed (the errno instead of the line's bytes) */
    /* (10 to 14: problems mmleaklib finds in '#' lines) */
    Q_JOINED = 15,      /* a '#mmleak' header after events: files joined into one (refused) */
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
#ifndef READ_CHUNK      /* (`make fuzz` reads in chunks of a few bytes: every boundary) */
#define READ_CHUNK ((size_t)1 << 20)
#endif
#define READ_BUF (4096 + LINE_MAX_BYTES + READ_CHUNK)
#define HEAD DL_HEAD                    /* what messages show of a line too long */

struct chunk { struct chunk *next; size_t size; };

struct slab {
    void *free_list[SLAB_CLASSES + 1];
    char *cur, *end;                   /* carving area of the newest chunk */
    struct chunk *chunks;              /* every mapping, for the final release */
};

static inline size_t big_size(size_t n)
{
    return (n + sizeof(struct chunk) + 4095) & ~(size_t)4095;
}

/* slab_free: the line storage's block P of N bytes back to its free list (or unmapped) */
static inline void slab_free(struct slab *s, char *p, size_t n)
{
    if (unlikely(n > SLAB_MAX)) {
        munmap(p - sizeof(struct chunk), big_size(n));
        return;
    }
    size_t c = (n + SLAB_GRAIN - 1) / SLAB_GRAIN;
    memcpy(p, &s->free_list[c], sizeof(void *));
    s->free_list[c] = p;
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

static inline size_t home(const struct table *t, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - t->bits));
}

/* Delete the entry of index slot I: backward-shift deletion in the index (no tombstones,
 * so probe chains stay as short as the load), then the last entry moves into the hole. */
static inline void table_del(struct table *t, size_t i)
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

/* ---- output buffer ------------------------------------------------------------------- */

struct obuf { int fd; int err; size_t n; char b[1 << 16]; };

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
    /* mmleak_shrink_merge's retry (an input to stream not sorted): OWN counts the problems
     * this reader found itself (not those the header callback counts in COUNTS), MUTE
     * (NULL: no retry) what OWN was at the attempt's end; the first MUTE of each name and
     * kind were counted and handed back by the attempt, COUNTS keeps them.  One mapping of
     * OWN_BYTES (OWN, then MUTE); NULL: not counted. */
    uint64_t *own, *mute;
    size_t own_bytes;
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

/* ---- what one file calls in another ------------------------------------------------- */

/* tools/shrink_state.c: the memory (mmap only), the line storage, the table, the headers */
void *map_mem(size_t n);
int populate(void *p, size_t n);
char *slab_alloc(struct slab *s, size_t n);
void slab_release(struct slab *s);
__attribute__((cold)) void populate_ahead(struct table *t);
int index_init(struct table *t, int bits);
int table_init(struct table *t, int bits);
__attribute__((cold)) int table_grow(struct table *t);
int table_room(struct table *t);
__attribute__((cold)) int table_index(struct table *t);
int hset_add(struct hset *hs, const char *s, size_t n);
void hset_release(struct hset *hs);

/* tools/shrink_read.c: the inputs read, line by line, into the state */
void problem(struct run *r, int file, uint64_t lineno, int what, const char *p, size_t n);
void feed_fd(struct run *r, int fd, int file, char *buf);
int shrink_inputs(struct run *r, const char *const *paths, const int *name_id, int npaths,
                  int show, mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                  mmleak_open_cb on_open, mmleak_problem_cb on_problem, uint64_t *counts,
                  struct mmleak_shrink_stats *stats, char *buf);

/* tools/shrink_write.c: the state written out, the head's counts */
int cmp_ent(const void *a, const void *b);
void note_last(struct run *r);
__attribute__((cold)) void notes_drop(struct run *r);
void write_state(struct run *r, struct obuf *o, int final, struct ent *ents, size_t m);
void write_end(struct run *r, struct obuf *o);
void write_ent(struct run *r, struct obuf *o, int final, const struct ent *e, uint64_t c[3]);

/* tools/shrink.c: the entry points' common ends, survivors as blocks */
int run_end(struct run *r, char *buf, struct obuf *out, int rc);
int line_block(const char *l, struct mmleak_block *b);
int final_blocks(struct run *r, struct obuf *out, struct mmleak_shrink_stats *stats,
                 struct mmleak_blocks *blocks);
void table_blocks(struct run *r, struct mmleak_blocks *blocks);

/* tools/shrink_merge.c: an event of the input streamed (r->merge set) */
void merge_event(struct run *r, int file, uint64_t lineno, const char *p, size_t n,
                 uint64_t key, uint64_t s, int kind);

#endif
