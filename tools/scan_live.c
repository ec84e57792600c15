/* tools/scan_live.c: the live set of a scan's cut (tools/scan.c, step 3), from each event's
 * address, number, kind and size only.
 *
 *   int mmleak_live_set(int nfiles, int (*open_input)(int, struct mmleak_input *),
 *                       struct mmleak_live *out);
 *
 * The algorithm is the shrink algorithm of mmleak-format(5) ("The shrink algorithm", the
 * one tools/shrink.c implements), run --final: per address one event, or the hull of the
 * lowest and the highest seen; an allocation numbered s and a free numbered s+1 that are an
 * address's whole state cancel.  The live blocks are the addresses whose last event is an
 * allocation.  The lines are read by tools/dumplines.h, as tools/shrink_read.c reads them
 * (mmleak-format(5)): a run of NUL bytes ends the text before it, which is not an event,
 * and the line after it is not one either when its pointer has fewer than 12 digits (its
 * start was lost); a line longer than MMLEAK_LINE_MAX, and a last line without its newline,
 * are not events; an event seen twice counts once.  What the scan does not need is not kept: no line, no stack, no time;
 * nothing is written.
 *
 * How, without a hash table (whose probe, a cache miss per line, was most of the time):
 * the states are kept in an array sorted by address (S: per address its state, one event
 * or a hull), and the events are merged into it in batches.
 *  - A sorted input (a compacted result or run, whose lines come in address order) read
 *    while S is empty goes straight into it, each line folded into the last state or
 *    appended (from the first line out of order on, the rest goes to the batch).
 *  - Every other event goes to the batch (BATCH events, or half of S if more), in the
 *    order read, except an address's runs of pairs in one input (an allocation numbered s,
 *    its free s+1), given as one event after two pairs (pre_event: a table of 1.5 MiB); a
 *    full batch is sorted by address (a stable radix sort, skipped when the
 *    events came in order: an address's events keep their order) and merged into S in
 *    place, each address's events applied to its state in that order (slot_event).
 *  So every address's events are applied in the order the inputs give them, as the shrink
 *  engine's table applies them: the same states, wherever the batches end.  Memory: S (40
 *  bytes a state, as many as the shrink engine keeps) and the batch with its sort's copy
 *  (64 bytes an event).  At the end, the live blocks are S's states whose high end is an
 *  allocation, in address order.
 *  Inputs of 8 MiB or more in all, when a CPU is idle, are read and parsed by two
 *  threads (fold_piped: in segments of about 4 MiB that end at a newline, each through a
 *  pre_event table of its own, the batch's events handed over in chunks, 15 MiB for the
 *  two); the calling thread merges them in the inputs' order, as above.
 *
 * OPEN_INPUT(i, in): input I (scan_live.h: a descriptor, how much of it, lines after it,
 * whether it is sorted), 0; -1 when it cannot be read.
 * Returns 0; -1 out of memory; -2 an input could not be read.  OUT's arrays are malloc'ed
 * (NULL when there is no block). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../tracer/compiler.h"
#include "facts.h"
#include "dumplines.h"
#include "eventline.h"
#include "scan_live.h"


#define LINE_MAX_BYTES ((size_t)MMLEAK_LINE_MAX)
#define READ_CHUNK ((size_t)1 << 20)
#ifndef SCAN_LIVE_BATCH                 /* (tests/test_scan.py builds it small) */
#define SCAN_LIVE_BATCH ((size_t)1 << 20)
#endif
#define BATCH ((size_t)SCAN_LIVE_BATCH)  /* events sorted at once (32 MiB), or S / 2 */

/* An address's state: one event (s0, k0), or a hull (s0, k0)..(s1, k1); SIZE: the
 * allocation's at the high end (or the single one). */
struct slot {
    uint64_t s0, s1, size;
    uint8_t k0, k1, hull;
    uint8_t pend;           /* a held adjacent pair (tools/shrink_fold.h's ent_update): 1, input
                             * FILE's event is its low end; 2, its high end */
    int32_t file;           /* single: the input of its event; PEND: of the held event */
};

/* An event: its address (KEY), number, size (an allocation's) and kind, plus EV_IFANY
 * (pre_event) and 8 times its input's number (slot_event needs it). */
#define EV_IFANY 4
struct ev { uint64_t key, seq, size; uint32_t kind; };
struct evs {                /* an array of events in mapped memory (grows in place) */
    struct ev *v;
    size_t n, cap, bytes;
};

/* The slots of pre_event's table of recent addresses (below) */
#define PRE_BITS 15
#define PRE_SLOTS ((size_t)1 << PRE_BITS)

/* An address's state in S. */
struct st { uint64_t key; struct slot e; };
struct states {             /* S: sorted by address, one state per address */
    struct st *v;
    size_t n, cap, bytes;
};

struct feed {
    struct states S;
    struct evs batch, spare;    /* the batch, and its sort's copy (kept from batch to batch) */
    size_t bcap;            /* the batch's events before it is merged */
    int direct;             /* the input being read goes straight into S */
    int file;               /* the input being read */
    int unsorted;           /* the batch's events are not all in address order */
    int attached, glibc, oom;
    struct pre *pre;        /* the current input's recent addresses (pre_event) */
    uint64_t pre_used[PRE_SLOTS / 64];  /* its slots in use, one bit each: pre_drain visits
                             * those only (the whole table is 1.5 MiB: reading it for the few
                             * events of a small program's trace faulted in 384 pages, about
                             * 5 ms of a 2-core VM's time at every exit) */
    struct ring *pipe;      /* a parser thread's feed: its events go to its ring */
    int64_t pos;            /* a parser's: the offset its input's bytes are read at (pread) */
};

static void pipe_event(struct feed *f, uint64_t key, uint64_t s, int kind, uint64_t size);

/* An event line (ended by its newline), as tools/shrink_read.c takes it (tools/eventline.h):
 * its kind, or -1.  *SIZE: an allocation's. */
static inline int parse_event(const char *p, uint64_t *ptr, uint64_t *seq, uint64_t *size)
{
    uint64_t tm;
    return event_fields(p, ptr, seq, size, &tm);
}

static void *map_mem(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (n >= ((size_t)2 << 20))
        madvise(p, n, MADV_HUGEPAGE);   /* fewer faults (a hint: "never" ignores it) */
    return p;
}

/* N bytes that free() takes back, on huge pages when the system gives them on request
 * (transparent_hugepage "madvise"): a big array of the scan (the live blocks' addresses,
 * sizes, numbers; their states) is then faulted in and zeroed 2 MiB at a time, not 4 KiB.
 * Measured on a 1 GB live heap of 10 million blocks: see docs/performance-heap.rst. */
void *mmleak_big_alloc(size_t n)
{
    const size_t huge = (size_t)2 << 20;
    if (n < 2 * huge)
        return malloc(n);
    void *p;
    if (posix_memalign(&p, huge, n))
        return NULL;
    madvise(p, n & ~(huge - 1), MADV_HUGEPAGE);    /* (a hint: "never" ignores it) */
    return p;
}

static void evs_free(struct evs *a)
{
    if (a->v)
        munmap(a->v, a->bytes);
    memset(a, 0, sizeof *a);
}

/* Room for NEED elements of ELEM bytes in the mapping *V of *BYTES bytes (none yet: NULL,
 * 0), grown by doubling from 1 MiB (mremap: no copy), huge pages from 2 MiB.  Its capacity
 * in elements, or 0 when it cannot grow. */
static size_t map_room(void **v, size_t *bytes, size_t elem, size_t need)
{
    size_t nb = *bytes ? *bytes : (size_t)1 << 20;
    while (nb / elem < need)
        nb *= 2;
    if (nb == *bytes)
        return nb / elem;
    void *p = *v ? mremap(*v, *bytes, nb, MREMAP_MAYMOVE) : map_mem(nb);
    if (!p || p == MAP_FAILED)
        return 0;
    if (nb >= ((size_t)2 << 20))
        madvise(p, nb, MADV_HUGEPAGE);
    *v = p;
    *bytes = nb;
    return nb / elem;
}

/* Room for N more events in A.  0, or -1. */
static int evs_room(struct evs *a, size_t n)
{
    if (a->n + n <= a->cap)
        return 0;
    void *v = a->v;
    size_t cap = map_room(&v, &a->bytes, sizeof *a->v, a->n + n);
    if (!cap)
        return -1;
    a->v = v;
    a->cap = cap;
    return 0;
}

/* An address's state E (*HAVE: 0, none; then E is set) after the event S, KIND, SIZE of
 * input FILE: the shrink algorithm's update (tools/shrink_fold.h's event() and ent_update(),
 * without the lines: an adjacent pair from two inputs is held until the second one's input
 * goes on); *HAVE becomes 0 when the state cancels. */
static inline void slot_event(struct slot *e, int *have, uint64_t s, int kind, uint64_t size,
                              int file)
{
    if (*have && e->hull && e->pend) {
        if (e->file != file || s == (e->pend == 2 ? e->s1 + 1 : e->s0 - 1))
            *have = 0;                  /* the pair held cancelled: the address anew */
        else
            e->pend = 0;
    }
    if (!*have) {
        e->s0 = s;
        e->k0 = (uint8_t)kind;
        e->hull = 0;
        e->pend = 0;
        e->file = file;
        e->size = size;
        *have = 1;
        return;
    }
    if (!e->hull) {
        int pend = 0;
        if (e->s0 == s)
            return;                     /* seen twice */
        if (e->s0 < s) {                /* old is the low end */
            if ((e->k0 & 1) && !(kind & 1) && s == e->s0 + 1) {
                if (e->file == file) {
                    *have = 0;
                    return;
                }
                pend = 2;
            }
            e->s1 = s;
            e->k1 = (uint8_t)kind;
            e->size = size;
        } else {                        /* old is the high end */
            if ((kind & 1) && !(e->k0 & 1) && e->s0 == s + 1) {
                if (e->file == file) {
                    *have = 0;
                    return;
                }
                pend = 1;
            }
            e->s1 = e->s0;
            e->k1 = e->k0;
            e->s0 = s;
            e->k0 = (uint8_t)kind;
        }
        e->hull = 1;
        e->pend = (uint8_t)pend;
        e->file = file;
        return;
    }
    if (s < e->s0) {
        e->s0 = s;
        e->k0 = (uint8_t)kind;
    } else if (s > e->s1) {
        e->s1 = s;
        e->k1 = (uint8_t)kind;
        e->size = size;
    }
}

/* V (N events) by address, stable (an address's events keep their order): a radix sort
 * over the bits in which the addresses differ only (a heap's: its low 4 bits are all 0, its
 * high ones all the same), at most 16 of them a pass, through SPARE (room for N more, kept
 * for the next sort).  0, or -1 (out
 * of memory). */
#define SORT_FEW 64

static int sort_ev(struct ev *v, size_t n, struct evs *spare)
{
    uint64_t diff = 0;
    for (size_t i = 1; i < n; i++)
        diff |= v[i].key ^ v[0].key;
    if (n < 2 || !diff)
        return 0;
    if (n <= SORT_FEW) {
        /* a few events (a short program's whole trace): an insertion sort, stable as well;
         * the radix sort's counts (up to 512 KiB, zeroed at every pass, for two addresses
         * as for a million) would cost more than the sort */
        for (size_t i = 1; i < n; i++) {
            struct ev x = v[i];
            size_t j = i;
            for (; j && v[j - 1].key > x.key; j--)
                v[j] = v[j - 1];
            v[j] = x;
        }
        return 0;
    }
    int lo = __builtin_ctzll(diff), bits = 64 - __builtin_clzll(diff) - lo;
    int passes = (bits + 15) / 16, width = (bits + passes - 1) / passes;
    size_t buckets = (size_t)1 << width, mask = buckets - 1;
    if (evs_room(spare, n))
        return -1;
    struct ev *tmp = spare->v;
    size_t *count = malloc(buckets * sizeof *count);
    if (!count)
        return -1;
    struct ev *from = v, *to = tmp;
    for (int p = 0; p < passes; p++) {
        int shift = lo + p * width;
        memset(count, 0, buckets * sizeof *count);
        for (size_t i = 0; i < n; i++)
            count[(from[i].key >> shift) & mask]++;
        size_t at = 0;
        for (size_t d = 0; d < buckets; d++) {
            size_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++)
            to[count[(from[i].key >> shift) & mask]++] = from[i];
        struct ev *t = from;
        from = to;
        to = t;
    }
    if (from != v)
        memcpy(v, from, n * sizeof *v);
    free(count);
    return 0;
}

/* Room for N states in S.  0, or -1. */
static int states_room(struct states *S, size_t n)
{
    if (n <= S->cap)
        return 0;
    void *v = S->v;
    size_t cap = map_room(&v, &S->bytes, sizeof *S->v, n);
    if (!cap)
        return -1;
    S->v = v;
    S->cap = cap;
    return 0;
}

/* The batch, sorted by address if it is not, merged into S in place, from the back: the
 * result ends where S's room for both does (n + m), written downwards from its highest
 * address; what is written never overtakes what is still to read (at most one state per
 * address of the batch).  A batch that only adds addresses (a growing live set) leaves S
 * in place, untouched below its lowest address; one whose events cancel out (a block
 * allocated and freed) leaves a gap, closed by moving down what the merge wrote (not all
 * of S: it used to be moved up first, whole, every batch).  0, or -1 (out of memory). */
static int flush(struct feed *f)
{
    struct evs *b = &f->batch;
    struct states *S = &f->S;
    size_t m = b->n, n = S->n;
    if (!m)
        return 0;
    if ((f->unsorted && sort_ev(b->v, m, &f->spare)) || states_room(S, n + m))
        return -1;
    struct st *const v = S->v, *const end = v + n + m;
    struct st *w = end, *rd = v + n;
    const struct ev *const p0 = b->v;
    const struct ev *p = p0 + m;
    while (p > p0) {
        uint64_t key = p[-1].key;
        if (rd > v && rd[-1].key > key) {
            *--w = *--rd;
            continue;
        }
        const struct ev *q = p - 1;
        while (q > p0 && q[-1].key == key)
            q--;
        struct slot e = { 0 };
        int have = 0;
        if (rd > v && rd[-1].key == key) {
            e = rd[-1].e;
            have = 1;
            rd--;
        }
        for (const struct ev *x = q; x < p; x++)        /* in the files' order */
            if (have || !(x->kind & EV_IFANY))
                slot_event(&e, &have, x->seq, (int)(x->kind & 3), x->size, (int)(x->kind >> 3));
        if (have) {
            --w;
            w->key = key;
            w->e = e;
        }
        p = q;
    }
    /* S is now [v, rd) then [w, end) */
    if (w != rd)
        memmove(rd, w, (size_t)(end - w) * sizeof *w);
    S->n = (size_t)(rd - v) + (size_t)(end - w);
    b->n = 0;
    f->unsorted = 0;
    f->bcap = S->n / 2 > BATCH ? S->n / 2 : BATCH;
    return 0;
}

/* An event for the batch, its input's number in its kind already (a parser's). */
static inline void batch_push(struct feed *f, const struct ev *e)
{
    struct evs *b = &f->batch;
    if (unlikely(b->n >= f->bcap) && flush(f)) {
        f->oom = 1;
        return;
    }
    /* doubled from the 1 MiB map_room starts with: a small trace (a process's start and
     * exit) never maps and zeroes a huge page for a batch of a million */
    if (unlikely(b->n == b->cap) && evs_room(b, b->cap ? b->cap : 1)) {
        f->oom = 1;
        return;
    }
    if (b->n && e->key < b->v[b->n - 1].key)
        f->unsorted = 1;
    b->v[b->n++] = *e;
}

/* An event for the batch (a parser's: for its ring). */
static inline void batch_event(struct feed *f, uint64_t key, uint64_t s, int kind,
                               uint64_t size)
{
    int k = kind | f->file << 3;
    if (f->pipe) {
        pipe_event(f, key, s, k, size);
        return;
    }
    struct ev e = { key, s, size, (uint32_t)k };
    batch_push(f, &e);
}

/* An event of a sorted input read into S directly (S held nothing before it): folded into
 * the last state, or a new one after it; from one out of order on, the batch's. */
static inline void direct_event(struct feed *f, uint64_t key, uint64_t s, int kind,
                                uint64_t size)
{
    struct states *S = &f->S;
    if (likely(S->n)) {
        struct st *last = &S->v[S->n - 1];
        if (unlikely(key < last->key)) {
            f->direct = 0;
            batch_event(f, key, s, kind, size);
            return;
        }
        if (key == last->key) {
            int have = 1;
            slot_event(&last->e, &have, s, kind, size, f->file);
            if (!have)
                S->n--;
            return;
        }
    }
    if (unlikely(S->n == S->cap) && states_room(S, S->cap ? S->cap * 2 : 1)) {
        f->oom = 1;
        return;
    }
    struct st *x = &S->v[S->n++];
    int have = 0;
    x->key = key;
    slot_event(&x->e, &have, s, kind, size, f->file);
}

/* ---- an input's pairs of one address, most merged as one event ----
 * A pair: an allocation numbered s and a free numbered s+1 of one input, the address's next
 * two events in it (mmleak.so numbers an address's events one by one: a program's blocks
 * come as such pairs).  After two pairs of one input, whatever the state before them (any
 * inputs, any batch), the address's state is either none (each pair cancelled) or a hull
 * that holds no pair (slot_event), which stays one: a later event only moves its low or
 * high end.  So the input's next pairs of that address, in increasing order, change the
 * state only through their highest event, and only when there is a state: they go to the
 * batch as that one event, marked EV_IFANY (merged only into a state, dropped on none).
 * A table of the recent addresses of the input being read (PRE_SLOTS, direct-mapped) holds
 * per address the allocation not yet paired, the pairs' count since the last event that
 * was not in one (to 2; those are given to the batch as they are) and the highest event of
 * the pairs after them.  An address's events reach the batch in the input's order (its
 * slot is emptied before any other of its events goes there); the table is emptied at the
 * end of every input.  tests/test_scan.py (test_live_set_pairs_merged_as_one) holds the
 * result to the shrink engine's on traces made of such runs. */

struct pre {
    uint64_t key, top;      /* TOP: the highest number of the address in this input (the
                             * allocation held's, HELD: it waits for its free) */
    uint64_t hsize;
    uint64_t lseq, lsize;   /* LAST: the highest event of the pairs merged as one */
    uint8_t hkind, lkind, held, last, pairs, used;
};

/* The slot of address KEY: its bits above the 16-byte alignment, nothing else, so that a
 * heap that grows (blocks allocated in address order, kept) has its allocations pushed out
 * of the table in the order they came, which is the address order: the batch needs no
 * sort (with the high bits folded in, 58 % of a batch's neighbours came out of order, and
 * the sort was a third of the live set of 10 million kept blocks). */
static inline size_t pre_slot(uint64_t key)
{
    return (size_t)(key >> 4) & (PRE_SLOTS - 1);
}

/* What slot E holds, to the batch; E emptied. */
static void pre_out(struct feed *f, struct pre *e)
{
    if (e->last)
        batch_event(f, e->key, e->lseq, e->lkind | EV_IFANY, e->lsize);
    if (e->held)
        batch_event(f, e->key, e->top, e->hkind, e->hsize);
    e->used = e->last = e->held = 0;
}

static inline void pre_event(struct feed *f, uint64_t key, uint64_t s, int kind, uint64_t size)
{
    struct pre *e = &f->pre[pre_slot(key)];
    if (unlikely(!e->used || e->key != key)) {
        if (e->used)
            pre_out(f, e);
        else
            f->pre_used[pre_slot(key) / 64] |= (uint64_t)1 << (pre_slot(key) % 64);
        e->used = 1;
        e->key = key;
        e->pairs = 0;
    } else if (likely(e->held && s == e->top + 1 && !(kind & 1))) {     /* a pair */
        e->held = 0;
        if (e->pairs < 2) {
            e->pairs++;
            batch_event(f, key, e->top, e->hkind, e->hsize);
            e->top = s;
            batch_event(f, key, s, kind, size);
        } else {
            e->top = s;
            e->last = 1;
            e->lseq = s;
            e->lsize = size;
            e->lkind = (uint8_t)kind;
        }
        return;
    } else if (!e->held && s > e->top && (kind & 1)) {
        ;                               /* (after a pair, or an event given) */
    } else {                            /* no pair: what is held, then the event, as they are */
        pre_out(f, e);
        e->used = 1;
        e->pairs = 0;
    }
    if (kind & 1) {
        e->held = 1;
        e->hsize = size;
        e->hkind = (uint8_t)kind;
    } else {
        batch_event(f, key, s, kind, size);
    }
    e->top = s;
}

/* The table emptied (the end of an input). */
static void pre_drain(struct feed *f)
{
    for (size_t w = 0; w < PRE_SLOTS / 64; w++) {
        uint64_t m = f->pre_used[w];
        f->pre_used[w] = 0;
        for (; m; m &= m - 1)           /* in the slots' order, as before the bits */
            pre_out(f, &f->pre[w * 64 + (size_t)__builtin_ctzll(m)]);
    }
}

#if defined(__x86_64__)
/* ---- the same parse, branch-free over a line of at most 64 bytes (SSE2, every x86-64) ----
 * parse_event's loops end on a misjudged branch at every field; here the delimiters and the
 * bytes that are not hex digits are found as bit masks of the line, and a field is turned
 * into its number 8 digits at a time.  Exactly parse_event's verdict (the rules: a field is
 * 1 to 16 lowercase hex digits, one space between fields; see parse_event). */
#include <emmintrin.h>

#define SLACK 64                        /* readable bytes around every line (the buffer's) */

static inline uint64_t load8(const char *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

/* The 8 hex digits X (first in its low byte) as a number. */
static inline uint64_t hex8(uint64_t x)
{
    x = (x & 0x0F0F0F0F0F0F0F0Full) + 9 * ((x >> 6) & 0x0101010101010101ull);
    x = ((x << 4) | (x >> 8)) & 0x00FF00FF00FF00FFull;
    x = ((x << 8) | (x >> 16)) & 0x0000FFFF0000FFFFull;
    return ((x << 16) | (x >> 32)) & 0xFFFFFFFFull;
}

/* The L (1 to 16) hex digits that end before P[E], known to be hex digits. */
static inline uint64_t field_value(const char *p, unsigned e, unsigned l)
{
    uint64_t lo = load8(p + e - 8);
    if (l <= 8) {
        uint64_t keep = ~0ull << (8 * (8 - l));
        return hex8((lo & keep) | (0x3030303030303030ull & ~keep));
    }
    uint64_t hi = load8(p + e - 16), keep = ~0ull << (8 * (16 - l));
    return hex8((hi & keep) | (0x3030303030303030ull & ~keep)) << 32 | hex8(lo);
}

/* parse_event for a line of N bytes (2 to 64, its newline last). */
static inline int parse_short(const char *p, unsigned n, uint64_t *ptr, uint64_t *seq,
                              uint64_t *size)
{
    uint64_t sp = 0, hx = 0;
    const __m128i space = _mm_set1_epi8(' ');
    for (unsigned k = 0; 16 * k < n; k++) {    /* (the bytes after the line: not looked at) */
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * k));
        __m128i dig = _mm_and_si128(_mm_cmpgt_epi8(b, _mm_set1_epi8('0' - 1)),
                                    _mm_cmplt_epi8(b, _mm_set1_epi8('9' + 1)));
        __m128i let = _mm_and_si128(_mm_cmpgt_epi8(b, _mm_set1_epi8('a' - 1)),
                                    _mm_cmplt_epi8(b, _mm_set1_epi8('f' + 1)));
        sp |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(b, space)) << (16 * k);
        hx |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_or_si128(dig, let)) << (16 * k);
    }
    uint64_t line = n == 64 ? ~0ull : (1ull << n) - 1, nl = 1ull << (n - 1);
    sp &= line & ~nl;
    uint64_t other = ~hx & line & ~sp & ~nl;    /* neither a digit, a space nor the end */
    uint64_t delim = sp | nl;
    /* the fields: between delimiters, none empty (no delimiter first, none adjacent) */
    if ((delim & 1) || (delim & (delim >> 1)))
        return -1;
    unsigned d1 = (unsigned)__builtin_ctzll(delim);
    uint64_t rest = delim & (delim - 1);
    unsigned d2 = (unsigned)__builtin_ctzll(rest);
    if (!rest || d1 > 16 || d2 - d1 - 1 > 16)
        return -1;
    rest &= rest - 1;
    if (!rest)
        return -1;                      /* two fields */
    unsigned d3 = (unsigned)__builtin_ctzll(rest);
    if (d3 == n - 1 && d3 - d2 == 2 && (p[d2 + 1] == '+' || p[d2 + 1] == '-') && !(other &
        ~(1ull << (d2 + 1)))) {         /* PTR SEQ + / PTR SEQ - */
        *ptr = field_value(p, d1, d1);
        *seq = field_value(p, d2, d2 - d1 - 1);
        return p[d2 + 1] == '+' ? K_START : K_END;
    }
    if (d3 - d2 - 1 > 16)
        return -1;
    if (d3 == n - 1) {                  /* PTR SEQ CALLER: a free */
        if (other)
            return -1;
        *ptr = field_value(p, d1, d1);
        *seq = field_value(p, d2, d2 - d1 - 1);
        return K_FREE;
    }
    rest &= rest - 1;
    unsigned d4 = (unsigned)__builtin_ctzll(rest);      /* rest: at least the newline */
    if (d4 == n - 1 || d4 - d3 - 1 > 16)
        return -1;                      /* PTR SEQ SIZE TIME, no caller */
    rest &= rest - 1;
    /* the callers: "@ID" alone (format 2), or fields of hex digits (format 1) */
    if (p[d4 + 1] == '@') {
        unsigned digits = n - 1 - (d4 + 2);
        if (rest != nl || (other & ~(1ull << (d4 + 1))) || digits - 1 > 15)
            return -1;                  /* 1 to 16 digits ("@" alone: digits - 1 wraps) */
    } else {
        if (other)
            return -1;
        unsigned prev = d4;
        while (rest) {                  /* each caller field: 1 to 16 digits */
            unsigned d = (unsigned)__builtin_ctzll(rest);
            if (d - prev - 1 > 16)
                return -1;
            prev = d;
            rest &= rest - 1;
        }
    }
    *ptr = field_value(p, d1, d1);
    *seq = field_value(p, d2, d2 - d1 - 1);
    *size = field_value(p, d3, d3 - d2 - 1);
    return K_ALLOC;
}
#else
#define SLACK 0
#endif

/* A line ended by its newline (N bytes at P, the newline included). */
static inline void one_line(struct feed *f, const char *p, size_t n)
{
    uint64_t key, s, size = 0;
#if defined(__x86_64__)
    int kind = n >= 2 && n <= 64 ? parse_short(p, (unsigned)n, &key, &s, &size) :
                                   parse_event(p, &key, &s, &size);
#else
    int kind = parse_event(p, &key, &s, &size);
#endif
    if (likely(kind >= 0)) {
        if (unlikely(f->pipe != NULL) && f->direct)
            pipe_event(f, key, s, kind, size);  /* a sorted input's: the folder's */
        else if (f->direct)
            direct_event(f, key, s, kind, size);
        else
            pre_event(f, key, s, kind, size);
        return;
    }
    if (p[0] != '#')
        return;
    /* the headers the scan needs (tools/scan.c's on_header before) */
    if (n > 8 && !memcmp(p, "#mmleak ", 8) && memmem(p, n, " window=1", 9))
        f->attached = 1;
    if (n > 7 && !memcmp(p, "#alloc ", 7) && memmem(p, n, "/libc.so", 8))
        f->glibc = 1;
}

/* Up to N bytes of input IN into TO: from its descriptor, up to its limit, then its tail.
 * The bytes read, 0 at the end, -1 (read failed). */
static ssize_t next_bytes(struct feed *f, struct mmleak_input *in, char *to, size_t n)
{
    while (in->limit) {
        size_t want = n < in->limit ? n : (size_t)in->limit;
        ssize_t got = f->pipe ? pread(in->fd, to, want, (off_t)f->pos) : read(in->fd, to, want);
        if (got > 0 && f->pipe)
            f->pos += got;
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return -1;
        if (got == 0) {                 /* shorter than at the cut: no tail after it */
            in->limit = 0;
            in->tlen = 0;
            return 0;
        }
        in->limit -= (uint64_t)got;
        return got;
    }
    size_t k = n < in->tlen ? n : in->tlen;
    memcpy(to, in->tail, k);
    in->tail += k;
    in->tlen -= k;
    return (ssize_t)k;
}

/* feed_input's handlers of tools/dumplines.h's reader: an event line is folded; nothing
 * else is an event, and the scan says nothing of it. */
static inline void scan_start(void *c, const char *p, const char *lim, int nuls)
{
    (void)c, (void)p, (void)lim, (void)nuls;
}

static inline __attribute__((always_inline)) int scan_line(void *c, uint64_t lineno,
                                                           const char *p, size_t n)
{
    (void)lineno;
    one_line(c, p, n);
    return 0;
}

static inline int scan_odd(void *c, int what, uint64_t lineno, const char *p, size_t n)
{
    (void)c, (void)what, (void)lineno, (void)p, (void)n;
    return 0;
}

/* Every line of input IN (BUF: LINE_MAX_BYTES + READ_CHUNK bytes), read by tools/dumplines.h's
 * reader.  0, or -1 (read failed). */
static int feed_input(struct feed *f, struct mmleak_input *in, char *buf)
{
    struct dumplines d;
    memset(&d, 0, sizeof d);
    while (!f->oom) {
        ssize_t got = next_bytes(f, in, buf + d.have, READ_CHUNK);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        const char *p = dl_chunk(&d, buf, buf + d.have + (size_t)got, f, scan_start, scan_line,
                                 scan_odd);
        if (d.have && p != buf)         /* the line not ended yet, at BUF */
            memmove(buf, p, d.have);
    }
    return 0;
}

/* ---- the parse on threads of their own (a big trace) ------------------------------
 * The exiting process is stopped while the scan runs, and the machine may have other
 * cores: the inputs are cut into segments of about SEG_BYTES, each ended by a newline (the
 * one at or after its nominal end: after a newline the reading's state is the same
 * whatever came before, so a segment is read on its own exactly as it is in its input),
 * the last one of an input with its tail; NPARSE parser threads read and parse them, in
 * turn (parser j the segments j, j + NPARSE...), each into a ring of chunks of events;
 * the calling thread folds them as the sequential loop does, segment after segment, each
 * from its parser's ring: an address's events in the same order.  A parser runs pre_event
 * itself, with a table of its own emptied at the end of each segment (as if every address
 * in it had been pushed out by another: the table is direct-mapped, its slots are taken
 * back at any moment, and the state after an address's pairs does not depend on where
 * its runs were cut), and hands over the batch's events only; a sorted input's events go
 * over as they are (direct_event, while S is empty, is the folder's).  So the same states. */
#ifndef SCAN_LIVE_CHUNK                 /* (tests/test_scan.py builds them small) */
#define SCAN_LIVE_CHUNK 32768           /* events a chunk */
#endif
#ifndef SCAN_LIVE_SEG
#define SCAN_LIVE_SEG ((uint64_t)4 << 20)  /* a segment's nominal bytes */
#endif
#ifndef SCAN_LIVE_PIPE_MIN              /* the inputs' bytes from which the threads pay */
#define SCAN_LIVE_PIPE_MIN ((uint64_t)8 << 20)
#endif
#define PIPE_CHUNKS 4                   /* a ring's */
#define NPARSE 2

struct seg {
    int input, last;        /* LAST: its input's last segment */
    uint64_t off, len;      /* its bytes of the input's descriptor (then, if LAST, the tail) */
};

struct chunk {
    struct ev *v;
    size_t n;
    int last;               /* the segment's last chunk */
    int err;                /* its read failed (then the parser stops) */
};

struct ring {
    pthread_mutex_t mu;
    pthread_cond_t ready, freed;
    struct chunk ch[PIPE_CHUNKS];
    size_t head, tail;      /* chunks given (to the folder), taken back (by the parser) */
    int stop;               /* the folder wants no more (out of memory, an error) */
    struct chunk *cur;      /* the parser's */
    int first;              /* its first segment (then every NPARSE-th) */
    int nseg;
    const struct seg *seg;
    const struct mmleak_input *in;
    char *buf;
    struct pre *pre;        /* its table (pre_event), emptied at the end of each segment */
    int attached, glibc;    /* what the headers it parsed said (read after the join) */
};

/* The parser's chunk given to the folder; a free one taken (waiting for it).  0, or -1
 * (the folder stopped). */
static int pipe_give(struct ring *r, int last, int err)
{
    pthread_mutex_lock(&r->mu);
    r->cur->last = last;
    r->cur->err = err;
    r->head++;
    pthread_cond_signal(&r->ready);
    while (!r->stop && r->head - r->tail == PIPE_CHUNKS)
        pthread_cond_wait(&r->freed, &r->mu);
    int stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    r->cur = &r->ch[r->head % PIPE_CHUNKS];
    r->cur->n = 0;
    return stop ? -1 : 0;
}

static void pipe_event(struct feed *f, uint64_t key, uint64_t s, int kind, uint64_t size)
{
    struct ring *r = f->pipe;
    struct chunk *c = r->cur;
    c->v[c->n++] = (struct ev){ key, s, size, (uint32_t)kind };
    if (unlikely(c->n == SCAN_LIVE_CHUNK) && pipe_give(r, 0, 0))
        f->oom = 1;                     /* (only ends the parser's loop) */
}

static void *parser(void *arg)
{
    struct ring *r = arg;
    struct feed f;
    memset(&f, 0, sizeof f);
    f.pipe = r;
    f.pre = r->pre;
    r->cur = &r->ch[0];
    r->cur->n = 0;
    for (int k = r->first; k < r->nseg && !f.oom; k += NPARSE) {
        const struct seg *g = &r->seg[k];
        struct mmleak_input in = r->in[g->input];
        in.limit = g->len;
        if (!g->last)
            in.tlen = 0;
        f.pos = (int64_t)g->off;
        f.file = g->input;
        f.direct = in.sorted;           /* its events as they are, else through pre_event */
        int err = feed_input(&f, &in, r->buf) != 0;
        if (!f.direct)
            pre_drain(&f);
        if (f.oom || pipe_give(r, 1, err) || err)
            break;
    }
    r->attached = f.attached;
    r->glibc = f.glibc;
    return NULL;
}

/* The offset of the first newline at or after OFF and before END in FD, or END. */
static uint64_t newline_from(int fd, uint64_t off, uint64_t end)
{
    char b[4096];
    while (off < end) {
        size_t want = end - off < sizeof b ? (size_t)(end - off) : sizeof b;
        ssize_t got = pread(fd, b, want, (off_t)off);
        if (got <= 0)
            return end;
        const char *nl = memchr(b, '\n', (size_t)got);
        if (nl)
            return off + (uint64_t)(nl - b);
        off += (uint64_t)got;
    }
    return end;
}

/* The segments of the inputs IN (N of them, opened), *NS of them; NULL (out of memory, or
 * an input read already or shorter than its limit: those are read sequentially). */
static struct seg *segments(const struct mmleak_input *in, int n, int *ns)
{
    size_t cap = 0, k = 0;
    struct seg *v = NULL;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (lseek(in[i].fd, 0, SEEK_CUR) != 0 || fstat(in[i].fd, &st) ||
            (uint64_t)st.st_size < in[i].limit) {
            free(v);
            return NULL;
        }
        uint64_t b = 0, len = in[i].limit;
        for (;;) {
            uint64_t e = len;
            if (len - b > SCAN_LIVE_SEG + SCAN_LIVE_SEG / 2)
                e = newline_from(in[i].fd, b + SCAN_LIVE_SEG - 1, len) + 1;
            if (e >= len)
                e = len;
            if (k == cap) {
                cap = cap ? 2 * cap : 64;
                struct seg *w = realloc(v, cap * sizeof *v);
                if (!w) {
                    free(v);
                    return NULL;
                }
                v = w;
            }
            v[k++] = (struct seg){ i, e == len, b, e - b };
            if (e == len)
                break;
            b = e;
        }
    }
    *ns = (int)k;
    return v;
}

/* The inputs IN (N of them, opened) folded into F by parser threads.  0, -1 (not started:
 * nothing was read), -2 (an input could not be read). */
static int fold_piped(struct feed *f, struct mmleak_input *in, int n)
{
    int nseg = 0;
    struct seg *seg = segments(in, n, &nseg);
    if (!seg)
        return -1;
    struct ring r[NPARSE];
    memset(r, 0, sizeof r);
    size_t buf_bytes = (LINE_MAX_BYTES + READ_CHUNK + 1 + 2 * SLACK + 4095) & ~(size_t)4095;
    size_t ring_bytes = (size_t)PIPE_CHUNKS * SCAN_LIVE_CHUNK * sizeof(struct ev);
    size_t pre_bytes = PRE_SLOTS * sizeof(struct pre);
    size_t bytes = NPARSE * (ring_bytes + buf_bytes + pre_bytes);
    char *mem = map_mem(bytes);
    if (!mem) {
        free(seg);
        return -1;
    }
    pthread_t th[NPARSE];
    int started = 0;
    sigset_t all, old;                  /* they take no signal (mmleak-scan's alarm) */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int j = 0; j < NPARSE; j++) {
        struct ring *q = &r[j];
        char *m = mem + j * (ring_bytes + buf_bytes + pre_bytes);
        for (int k = 0; k < PIPE_CHUNKS; k++)
            q->ch[k].v = (struct ev *)(void *)m + (size_t)k * SCAN_LIVE_CHUNK;
        q->buf = m + ring_bytes + SLACK;
        q->pre = (struct pre *)(void *)(m + ring_bytes + buf_bytes);
        q->first = j;
        q->nseg = nseg;
        q->seg = seg;
        q->in = in;
        pthread_mutex_init(&q->mu, NULL);
        pthread_cond_init(&q->ready, NULL);
        pthread_cond_init(&q->freed, NULL);
        if (pthread_create(&th[j], NULL, parser, q))
            break;
        started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    int rc = started == NPARSE ? 0 : -1;
    for (int k = 0; !rc && k < nseg && !f->oom; k++) {
        struct ring *q = &r[k % NPARSE];
        const struct seg *g = &seg[k];
        if (g->input != f->file || !k) {        /* an input begins */
            f->direct = in[g->input].sorted && !f->S.n && !f->batch.n;
            f->file = g->input;
        }
        for (;;) {
            pthread_mutex_lock(&q->mu);
            while (q->tail == q->head)
                pthread_cond_wait(&q->ready, &q->mu);
            pthread_mutex_unlock(&q->mu);
            struct chunk *c = &q->ch[q->tail % PIPE_CHUNKS];
            const struct ev *e = c->v, *end = c->v + c->n;
            if (!in[g->input].sorted) {         /* the batch's events, pre_event done */
                for (; e < end && !f->oom; e++)
                    batch_push(f, e);
            }
            for (; e < end && f->direct && !f->oom; e++)
                direct_event(f, e->key, e->seq, (int)e->kind, e->size);
            for (; e < end && !f->oom; e++)
                pre_event(f, e->key, e->seq, (int)e->kind, e->size);
            int last = c->last;
            if (c->err)
                rc = -2;
            pthread_mutex_lock(&q->mu);
            q->tail++;
            pthread_cond_signal(&q->freed);
            pthread_mutex_unlock(&q->mu);
            if (last || rc || f->oom)
                break;
        }
        if (g->last && !rc) {
            pre_drain(f);
            f->direct = 0;
        }
    }
    for (int j = 0; j < started; j++) {          /* the parsers stopped (when not done) */
        pthread_mutex_lock(&r[j].mu);
        r[j].stop = 1;
        pthread_cond_signal(&r[j].freed);
        pthread_mutex_unlock(&r[j].mu);
    }
    for (int j = 0; j < started; j++) {
        pthread_join(th[j], NULL);
        f->attached |= r[j].attached;
        f->glibc |= r[j].glibc;
    }
    for (int j = 0; j < NPARSE; j++) {
        pthread_cond_destroy(&r[j].ready);
        pthread_cond_destroy(&r[j].freed);
        pthread_mutex_destroy(&r[j].mu);
    }
    munmap(mem, bytes);
    free(seg);
    return rc;                          /* (-1: F untouched, the descriptors' offsets too) */
}

#ifdef MML_SCAN_INPROC
void scan_dbg(const char *fmt, ...);    /* tools/scan.c (MMLEAK_SCAN_DEBUG) */
extern int mml_here_stays;              /* tracer/scanhere.c */
#endif

#ifdef MML_SCAN_INPROC
/* Whether mmleak-scan, started with the process's credentials, could read it: the kernel
 * lets one process read another's memory and /proc/PID/maps (a ptrace "read" access) when
 * their uids and gids match in full (real, effective, saved) and the target is dumpable
 * (or the reader has CAP_SYS_PTRACE, which a daemon that dropped root has not).  A child of
 * ours that shares our memory reads it anyway (the same mm).  A daemon that became another
 * user with setuid is not dumpable (nsd, memcached's -u); squid keeps root as its saved uid:
 * mmleak-scan got "/proc/PID/maps: Permission denied" there, and no verdict. */
static int scanner_may_read(void)
{
    uid_t r, e, s;
    gid_t rg, eg, sg;
    if (getresuid(&r, &e, &s) || getresgid(&rg, &eg, &sg))
        return 0;
    if (r == 0 && e == 0 && s == 0)
        return 1;                       /* root: CAP_SYS_PTRACE, or the same uids */
    return r == e && e == s && rg == eg && eg == sg &&
           syscall(SYS_prctl, PR_GET_DUMPABLE, 0, 0, 0, 0) == 1;
}
#endif

/* Whether a CPU we may run on is idle now (/proc/stat's procs_running, ourselves
 * included, below the CPUs of our affinity): the parser threads only pay on one.  On a
 * busy machine they would take their time from the thread that folds (measured: the live
 * set slower, not faster, with every core taken).  SCAN_LIVE_PIPE_ALWAYS (the tests):
 * always. */
int mmleak_cpu_to_spare(void)
{
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) || CPU_COUNT(&cpus) < 2)
        return 0;
#ifdef MML_SCAN_INPROC
    /* mmleak.so's copy (tools/scan_inproc.h) starts no thread: their stacks and glibc's
     * state would be the process's.  Where mmleak-scan could start one (asked only for a
     * big trace or heap, and the process may run on two CPUs or more), the child gives up
     * at once, status 4, and mmleak.so starts mmleak-scan instead (tracer/scanhere.c),
     * which judges the load itself: nothing was written yet (but the debug file), and the
     * child's memory is mmleak.so's.  Not by the load now, which changes: a child that
     * found the CPUs busy at the live set and one idle at the marking gave the scan up
     * after its live set, which mmleak-scan made again; the affinity stays, so a big
     * trace's live set is made once, by one or the other (and what a fallback at the
     * marking makes again is a small trace's: below SCAN_LIVE_PIPE_MIN).  Not when the
     * other threads are parked by mmleak.so's signal (tracer/park.c): mmleak-scan could not
     * stop them; nor when mmleak-scan could not read the process (scanner_may_read): the
     * scan stays here, with no thread of its own. */
    if (mml_here_stays || !scanner_may_read())
        return 0;
    scan_dbg("mmleak-scan: a thread would pay: mmleak-scan takes over\n");
    syscall(SYS_exit_group, 4);
    return 0;
#else
    int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t cap = (size_t)1 << 16;       /* (its per-CPU and interrupt lines come first) */
    char *b = malloc(cap);
    ssize_t n = b ? read(fd, b, cap - 1) : -1;
    close(fd);
    int idle = 0;
    if (n > 0) {
        b[n] = 0;
        const char *p = strstr(b, "\nprocs_running ");
        idle = p && atoi(p + 15) < CPU_COUNT(&cpus);
    }
    free(b);
    return idle;
#endif
}

static int cpu_to_spare(void)
{
#ifdef SCAN_LIVE_PIPE_ALWAYS
    return 1;
#else
    return mmleak_cpu_to_spare();
#endif
}

int mmleak_live_set(int nfiles, int (*open_input)(int, struct mmleak_input *),
                    struct mmleak_live *out)
{
    memset(out, 0, sizeof *out);
    struct feed f;
    memset(&f, 0, sizeof f);
    f.bcap = BATCH;
    /* the read buffer and the pairs table in one mapping: one mmap and one munmap fewer
     * at every exit (only the pages used are faulted in) */
    size_t buf_bytes = (LINE_MAX_BYTES + READ_CHUNK + 1 + 2 * SLACK + 4095) & ~(size_t)4095;
    size_t map_bytes = buf_bytes + PRE_SLOTS * sizeof *f.pre;
    char *base = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (base == MAP_FAILED)
        return -1;
    char *buf = base + SLACK;
    int rc = 0;
    f.pre = (void *)(base + buf_bytes);
    struct mmleak_input *in = calloc((size_t)nfiles + 1, sizeof *in);
    if (!in) {
        munmap(base, map_bytes);
        return -1;
    }
    /* every input opened first (they are held open since the cut): their size decides */
    int nin = 0;
    uint64_t bytes = 0;
    for (; nin < nfiles; nin++) {
        if (open_input(nin, &in[nin]))
            break;
        bytes += in[nin].limit + in[nin].tlen;
    }
    int piped = -1;
    if (nin == nfiles && nin && bytes >= SCAN_LIVE_PIPE_MIN && cpu_to_spare())
        piped = fold_piped(&f, in, nin);
    if (piped != -1) {
        rc = piped;
    } else {
        for (int i = 0; i < nin && !f.oom && !rc; i++) {
            f.direct = in[i].sorted && !f.S.n && !f.batch.n;
            f.file = i;
            if (feed_input(&f, &in[i], buf))
                rc = -2;
            pre_drain(&f);
            f.direct = 0;
        }
        if (nin < nfiles && !rc && !f.oom)
            rc = -2;                    /* (the inputs before it read, as they always were) */
    }
    for (int i = 0; i < nin; i++)
        close(in[i].fd);
    free(in);
    munmap(base, map_bytes);
    if (!rc && !f.oom && flush(&f))
        f.oom = 1;
    evs_free(&f.batch);
    evs_free(&f.spare);
    if (f.oom && !rc)
        rc = -1;
    /* room for every state: the blocks are fewer (what is past them is never touched, so
     * never faulted in: one pass over the states, not one to count them first) */
    size_t n = f.S.n;
    if (!rc) {
        out->ptr = mmleak_big_alloc((n + 1) * 8);
        out->size = mmleak_big_alloc((n + 1) * 8);
        out->seq = mmleak_big_alloc((n + 1) * 8);
        if (!out->ptr || !out->size || !out->seq)
            rc = -1;
    }
    for (size_t i = 0; !rc && i < f.S.n; i++) {
        const struct st *x = &f.S.v[i];
        if ((!x->e.hull ? x->e.k0 : x->e.k1) == K_ALLOC) {
            out->ptr[out->n] = x->key;
            out->seq[out->n] = x->e.hull ? x->e.s1 : x->e.s0;
            out->size[out->n] = x->e.size;
            out->n++;
        }
    }
    if (f.S.v)
        munmap(f.S.v, f.S.bytes);
    if (rc) {
        free(out->ptr); free(out->size); free(out->seq);
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->attached = f.attached;
    out->glibc = f.glibc;
    return 0;
}
