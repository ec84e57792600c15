/* tools/blocks.c: the per-(stack, kind) aggregation of the survivors (blocks.h), what the
 * report's call-site table is computed from: O(call sites) memory whatever the block count.
 * mmleaklib/sites.py's aggregate_allocs is the same computation on Python objects (the
 * reference; tests/test_blocks.py holds the two equal). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../tracer/compiler.h"
#include "blocks.h"

static void *map_zero(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* *LO, *HI += V (128 bits) */
static inline void add128(uint64_t *lo, uint64_t *hi, uint64_t v)
{
    *hi += (*lo += v) < v;
}

/* *LO, *HI -= V (128 bits) */
static inline void sub128(uint64_t *lo, uint64_t *hi, uint64_t v)
{
    *hi -= *lo < v;
    *lo -= v;
}

static inline int key_below(const struct mmleak_kinds *k, uint64_t i, uint64_t ptr,
                            uint64_t seq)
{
    return k->ptr[i] < ptr || (k->ptr[i] == ptr && k->seq[i] < seq);
}

/* The index of (PTR, SEQ) in the sorted table K, or -1.  *AT: where the search starts
 * (the place of the last key looked for) and the place of this one on return: blocks that
 * come in the table's order (a result read whole comes sorted by address) are found a few
 * steps away from the last one (a galloping search), not by a binary search over the whole
 * table, a cache miss at most of its steps; blocks in any other order are found as well. */
static int64_t find(const struct mmleak_kinds *k, uint64_t ptr, uint64_t seq, uint64_t *at)
{
    uint64_t n = k->n, lo = 0, hi = n, i = *at < n ? *at : 0;
    if (!n)
        return -1;
    /* [LO, HI] holds the first place whose key is not below (PTR, SEQ) */
    if (key_below(k, i, ptr, seq)) {            /* after the last one: gallop forward */
        uint64_t step = 1;
        lo = i + 1;
        while (i + step < n && key_below(k, i + step, ptr, seq)) {
            lo = i + step + 1;
            step *= 2;
        }
        hi = i + step < n ? i + step : n;
    } else {                                    /* at or before it: gallop back */
        uint64_t step = 1;
        hi = i;
        while (step <= i && !key_below(k, i - step, ptr, seq)) {
            hi = i - step;
            step *= 2;
        }
        lo = step <= i ? i - step + 1 : 0;
    }
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (key_below(k, mid, ptr, seq))
            lo = mid + 1;
        else
            hi = mid;
    }
    *at = lo;
    return lo < n && k->ptr[lo] == ptr && k->seq[lo] == seq ? (int64_t)lo : -1;
}

struct gtab {
    struct mmleak_group *g;     /* open addressing on (stack, kind); blocks == 0: empty */
    size_t mask, count, bytes;
};

static size_t ghash(const struct gtab *t, uint64_t stack, uint64_t frame, uint64_t kind)
{
    return (size_t)(((stack ^ (kind << 56) ^ (frame << 55)) * 0x9E3779B97F4A7C15ull) >> 20)
           & t->mask;
}

static int gtab_init(struct gtab *t, size_t cap)
{
    t->bytes = cap * sizeof *t->g;
    t->g = map_zero(t->bytes);
    t->mask = cap - 1;
    t->count = 0;
    return t->g ? 0 : -1;
}

static int gtab_grow(struct gtab *t)
{
    struct gtab n;
    if (gtab_init(&n, (t->mask + 1) * 2))
        return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        if (!t->g[i].blocks)
            continue;
        size_t j = ghash(&n, t->g[i].stack, t->g[i].frame, t->g[i].kind);
        while (n.g[j].blocks)
            j = (j + 1) & n.mask;
        n.g[j] = t->g[i];
    }
    n.count = t->count;
    munmap(t->g, t->bytes);
    *t = n;
    return 0;
}

static int cmp_group(const void *a, const void *b)
{
    const struct mmleak_group *x = a, *y = b;
    if (x->min_ptr != y->min_ptr)
        return x->min_ptr < y->min_ptr ? -1 : 1;
    if (x->kind != y->kind)
        return x->kind < y->kind ? -1 : 1;
    if (x->frame != y->frame)
        return x->frame < y->frame ? -1 : 1;
    return (x->stack > y->stack) - (x->stack < y->stack);
}

/* Aggregate the N blocks B per (stack, kind): KINDS (may be NULL, or have n 0) gives each
 * block its kind, F (may be NULL) filters.  OUT->g is a mapping of its own (released by
 * mmleak_aggregate_free).  Returns 0, or -1 out of memory. */
EXPORT int mmleak_blocks_aggregate(const struct mmleak_block *b, uint64_t n,
                                   const struct mmleak_kinds *kinds,
                                   const struct mmleak_filter *f, struct mmleak_aggregate *out)
{
    struct gtab t;
    memset(out, 0, sizeof *out);
    if (gtab_init(&t, 1024))
        return -1;
    int use_kinds = kinds && kinds->n && kinds->kind;
    int use_excl = f && f->exclude.n;
    uint64_t near_excl = 0, near_kind = 0;      /* where find looks first */
    for (uint64_t i = 0; i < n; i++) {
        const struct mmleak_block *x = &b[i];
        out->all_blocks++;
        add128(&out->all_bytes, &out->all_bytes_hi, x->size);
        if (f && (x->time < f->tmin || x->time > f->tmax))
            continue;
        if (use_excl) {
            int64_t at = find(&f->exclude, x->ptr, x->seq, &near_excl);
            if (at >= 0) {
                if (f->seen)
                    f->seen[at] = 1;
                continue;
            }
        }
        uint64_t kind = 0;
        if (use_kinds) {
            int64_t at = find(kinds, x->ptr, x->seq, &near_kind);
            kind = at >= 0 ? kinds->kind[at] : 0;
        }
        out->kept_blocks++;
        add128(&out->kept_bytes, &out->kept_bytes_hi, x->size);
        size_t j = ghash(&t, x->stack, x->frame, kind);
        struct mmleak_group *g;
        while ((g = &t.g[j])->blocks && (g->stack != x->stack || g->frame != x->frame ||
                                        g->kind != kind))
            j = (j + 1) & t.mask;
        if (!g->blocks) {
            if ((t.count + 1) * 2 > t.mask + 1) {
                if (gtab_grow(&t)) {
                    munmap(t.g, t.bytes);
                    return -1;
                }
                i--;                    /* again, in the grown table */
                out->all_blocks--;
                sub128(&out->all_bytes, &out->all_bytes_hi, x->size);
                out->kept_blocks--;
                sub128(&out->kept_bytes, &out->kept_bytes_hi, x->size);
                continue;
            }
            *g = (struct mmleak_group){ x->stack, x->frame, kind, 1, x->size, x->size,
                                        x->size, x->time, x->time, x->ptr, 0 };
            t.count++;
            continue;
        }
        g->blocks++;
        add128(&g->bytes, &g->bytes_hi, x->size);
        if (x->size < g->min_size)
            g->min_size = x->size;
        if (x->size > g->max_size)
            g->max_size = x->size;
        if (x->time < g->min_time)
            g->min_time = x->time;
        if (x->time > g->max_time)
            g->max_time = x->time;
        if (x->ptr < g->min_ptr)
            g->min_ptr = x->ptr;
    }
    size_t m = 0;                       /* the groups, packed, in the order they are met */
    for (size_t i = 0; i <= t.mask; i++)
        if (t.g[i].blocks)
            t.g[m++] = t.g[i];
    qsort(t.g, m, sizeof *t.g, cmp_group);
    out->g = t.g;
    out->n = m;
    out->cap_bytes = t.bytes;
    return 0;
}

static int cmp_time(const void *a, const void *b)
{
    const struct mmleak_block *x = a, *y = b;
    if (x->time != y->time)
        return x->time < y->time ? -1 : 1;
    return (x->ptr > y->ptr) - (x->ptr < y->ptr);
}

/* An evenly spaced sample of at most MAX of the N blocks B (every ceil(N / MAX)-th, in the
 * array's order), copied to OUT sorted by time then address: what a chart of the blocks
 * over time draws from.  Returns how many. */
EXPORT uint64_t mmleak_blocks_sample(const struct mmleak_block *b, uint64_t n, uint64_t max,
                                     struct mmleak_block *out)
{
    if (!max)
        return 0;
    uint64_t step = n > max ? (n + max - 1) / max : 1, k = 0;
    for (uint64_t i = 0; i < n && k < max; i += step)
        out[k++] = b[i];
    qsort(out, k, sizeof *out, cmp_time);
    return k;
}

struct key {
    uint64_t ptr, seq;
};

static int cmp_key(const void *a, const void *b)
{
    const struct key *x = a, *y = b;
    if (x->ptr != y->ptr)
        return x->ptr < y->ptr ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* The keys (ptr, seq) of the N blocks B and of the M blocks (XPTR[i], XSEQ[i]), sorted, into
 * PTR and SEQ (N + M each): the table of a series point's blocks (mmleaklib/series.py), which
 * the next point joins on as a kinds table (every block of it "alive at the last point").
 * Returns 0, or -1 out of memory. */
EXPORT int mmleak_blocks_keys(const struct mmleak_block *b, uint64_t n, const uint64_t *xptr,
                              const uint64_t *xseq, uint64_t m, uint64_t *ptr, uint64_t *seq)
{
    uint64_t total = n + m;
    size_t bytes = (total ? total : 1) * sizeof(struct key);
    struct key *k = map_zero(bytes);
    if (!k)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        k[i] = (struct key){ b[i].ptr, b[i].seq };
    for (uint64_t i = 0; i < m; i++)
        k[n + i] = (struct key){ xptr[i], xseq[i] };
    uint64_t i = 1;
    while (i < total && cmp_key(&k[i - 1], &k[i]) < 0)
        i++;
    if (i < total)              /* a result read whole comes sorted: no sort then */
        qsort(k, total, sizeof *k, cmp_key);
    for (uint64_t i = 0; i < total; i++) {
        ptr[i] = k[i].ptr;
        seq[i] = k[i].seq;
    }
    munmap(k, bytes);
    return 0;
}

/* The keys of the sorted table A (NA keys: APTR, ASEQ) that are not in the sorted table B
 * (NB keys), in order, into OPTR and OSEQ (room for NA): the blocks a series point finds
 * beside the result (mmleaklib/series.py).  Returns their number. */
EXPORT uint64_t mmleak_blocks_keys_minus(const uint64_t *aptr, const uint64_t *aseq, uint64_t na,
                                  const uint64_t *bptr, const uint64_t *bseq, uint64_t nb,
                                  uint64_t *optr, uint64_t *oseq)
{
    uint64_t i = 0, j = 0, n = 0;
    while (i < na) {
        struct key a = { aptr[i], aseq[i] }, b;
        int c = 1;
        while (j < nb) {
            b = (struct key){ bptr[j], bseq[j] };
            c = cmp_key(&a, &b);
            if (c <= 0)
                break;
            j++;
        }
        if (j >= nb || c < 0) {
            optr[n] = a.ptr;
            oseq[n] = a.seq;
            n++;
        }
        i++;
    }
    return n;
}

EXPORT void mmleak_aggregate_free(struct mmleak_aggregate *a)
{
    if (a->g)
        munmap(a->g, a->cap_bytes);
    a->g = NULL;
}

EXPORT void mmleak_blocks_free(struct mmleak_blocks *b)
{
    if (b->v)
        munmap(b->v, b->cap_bytes);
    b->v = NULL;
    b->n = 0;
}

/* The unsigned LEB128 numbers of D (LEN bytes) into OUT (room for CAP), as running sums of
 * them when DELTA (a scan result's address column: differences, mmleak-format(5)).  Returns
 * how many, or -1 when D does not end a number or holds more than CAP, or a number of more
 * than 64 bits (mmleaklib/scan.py's reading of a scan result, without a Python step per
 * byte). */
EXPORT int64_t mmleak_blocks_leb_decode(const uint8_t *d, uint64_t len, uint64_t *out, uint64_t cap,
                                 int delta)
{
    uint64_t n = 0, v = 0, acc = 0;
    unsigned shift = 0;
    for (uint64_t i = 0; i < len; i++) {
        uint8_t b = d[i];
        if (shift > 63 || (shift == 63 && (b & 0x7E)))
            return -1;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b & 0x80) {
            shift += 7;
            continue;
        }
        if (n == cap)
            return -1;
        acc = delta ? acc + v : v;
        out[n++] = acc;
        v = 0;
        shift = 0;
    }
    return shift ? -1 : (int64_t)n;
}
