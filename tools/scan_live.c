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
 * allocation.  The lines are read as tools/shrink.c reads them (mmleak-format(5)): a run of
 * NUL bytes ends the text before it, which is not an event, and the line after it is not
 * one either when its pointer has fewer than 12 digits (its start was lost); a line longer
 * than MMLEAK_LINE_MAX, and a last line without its newline, are not events; an event seen
 * twice counts once.  What the scan does not need is not kept: no line, no stack, no time;
 * nothing is written; only the live blocks are sorted.  A table entry per address whose
 * state is open (40 bytes and 4 to 8 of index), as the shrink engine's, less its lines.
 *
 * OPEN_INPUT(i, in): input I (scan_live.h: a descriptor, how much of it, lines after it),
 * 0; -1 when it cannot be read.
 * Returns 0; -1 out of memory; -2 an input could not be read.  OUT's arrays are malloc'ed
 * (NULL when there is no block). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../tracer/compiler.h"
#include "facts.h"
#include "eventline.h"
#include "scan_live.h"


#define LINE_MAX_BYTES ((size_t)MMLEAK_LINE_MAX)
#define READ_CHUNK ((size_t)1 << 20)

struct slot {
    uint64_t key, s0, s1;    /* single: s0; hull: low end s0, high end s1 */
    uint64_t size;           /* the allocation's at the high end (or the single one) */
    uint8_t k0, k1, hull;
};

/* The entries, dense (appended; a deleted one is replaced by the last), and an index over
 * them, open addressing of 4-byte entry numbers: a probe touches the small index, not the
 * entries, and the entries grow in place (as tools/shrink.c's table). */
struct tab {
    struct slot *e;          /* count entries, room for cap */
    uint32_t *ix;            /* 0: empty, else 1 + the entry's number */
    size_t mask, count, cap, e_bytes, ix_bytes;
    int bits;
};

struct feed {
    struct tab t;
    int attached, glibc, oom;
};

/* An event line (ended by its newline), as tools/shrink.c takes it (tools/eventline.h):
 * its kind, or -1.  *SIZE: an allocation's. */
static inline int parse_event(const char *p, uint64_t *ptr, uint64_t *seq, uint64_t *size)
{
    uint64_t tm;
    return event_fields(p, ptr, seq, size, &tm);
}

static inline size_t home(const struct tab *t, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - t->bits));
}

static void *map_mem(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* An index of 2^BITS slots over the entries. */
static int index_init(struct tab *t, int bits)
{
    size_t n = (size_t)1 << bits;
    uint32_t *ix = map_mem(n * sizeof *ix);
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

static int tab_init(struct tab *t, int bits)
{
    memset(t, 0, sizeof *t);
    t->cap = (size_t)1 << (bits - 1);
    t->e_bytes = t->cap * sizeof(struct slot);
    t->e = map_mem(t->e_bytes);
    return t->e ? index_init(t, bits) : -1;
}

/* Room for one more entry: the entries grow in place, the index at 70 % load. */
static int tab_room(struct tab *t)
{
    if (t->count == t->cap) {
        if (t->cap >= UINT32_MAX / 2)
            return -1;
        void *p = mremap(t->e, t->e_bytes, t->e_bytes * 2, MREMAP_MAYMOVE);
        if (p == MAP_FAILED)
            return -1;
        t->e = p;
        t->e_bytes *= 2;
        t->cap *= 2;
    }
    if ((t->count + 1) * 10 > (t->mask + 1) * 7)
        return index_init(t, t->bits + 1);
    return 0;
}

/* Delete the entry of index slot I: backward-shift deletion in the index (no tombstones),
 * then the last entry moves into the hole. */
static void tab_del(struct tab *t, size_t i)
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

/* The state update (tools/shrink.c's event(), without the lines). */
static inline void event(struct feed *f, uint64_t key, uint64_t s, int kind, uint64_t size)
{
    struct tab *t = &f->t;
    size_t i = home(t, key);
    uint32_t x;
    while ((x = t->ix[i]) && t->e[x - 1].key != key)
        i = (i + 1) & t->mask;
    if (!x) {
        if (unlikely(t->count == t->cap || (t->count + 1) * 10 > (t->mask + 1) * 7)) {
            if (tab_room(t)) {
                f->oom = 1;
                return;
            }
            i = home(t, key);           /* the index may be new */
            while (t->ix[i])
                i = (i + 1) & t->mask;
        }
        struct slot *e = &t->e[t->count];
        e->key = key;
        e->s0 = s;
        e->k0 = (uint8_t)kind;
        e->hull = 0;
        e->size = size;
        t->ix[i] = (uint32_t)++t->count;
        return;
    }
    struct slot *e = &t->e[x - 1];
    if (!e->hull) {
        if (e->s0 == s)
            return;                     /* seen twice */
        if (e->s0 < s) {                /* old is the low end */
            if ((e->k0 & 1) && !(kind & 1) && s == e->s0 + 1) {
                tab_del(t, i);
                return;
            }
            e->s1 = s;
            e->k1 = (uint8_t)kind;
            e->size = size;
        } else {                        /* old is the high end */
            if ((kind & 1) && !(e->k0 & 1) && e->s0 == s + 1) {
                tab_del(t, i);
                return;
            }
            e->s1 = e->s0;
            e->k1 = e->k0;
            e->s0 = s;
            e->k0 = (uint8_t)kind;
        }
        e->hull = 1;
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
    for (int k = 0; k < 4; k++) {
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
        event(f, key, s, kind, size);
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

/* The first line after a run of NULs whose pointer has fewer than 12 digits: the end of a
 * line whose start a hole took; not an event. */
static int cut_start(const char *p)
{
    uint64_t a, b, c;
    if (parse_event(p, &a, &b, &c) < 0)
        return 0;
    const char *sp = memchr(p, ' ', 17);
    return sp && sp - p < 12;
}

/* The first newline or NUL in [P, LIM), or NULL. */
static const char *line_end(const char *p, const char *lim)
{
    const char *nl = memchr(p, '\n', (size_t)(lim - p));
    const char *z = memchr(p, 0, (size_t)((nl ? nl : lim) - p));
    return z ? z : nl;
}

/* Up to N bytes of input IN into TO: from its descriptor, up to its limit, then its tail.
 * The bytes read, 0 at the end, -1 (read failed). */
static ssize_t next_bytes(struct mmleak_input *in, char *to, size_t n)
{
    while (in->limit) {
        ssize_t got = read(in->fd, to, n < in->limit ? n : (size_t)in->limit);
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

/* Every line of input IN (BUF: LINE_MAX_BYTES + READ_CHUNK bytes).  0, or -1 (read
 * failed). */
static int feed_input(struct feed *f, struct mmleak_input *in, char *buf)
{
    size_t have = 0;                    /* the start of a line not ended yet, at BUF */
    int skip = 0, in_nul = 0, after_nul = 0;
    while (!f->oom) {
        ssize_t got = next_bytes(in, buf + have, READ_CHUNK);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        const char *p = buf, *q = buf + have, *lim = buf + have + (size_t)got;
        if (skip) {                     /* the rest of a line too long, up to its end */
            const char *t = line_end(q, lim);
            if (!t) {
                have = 0;
                continue;
            }
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
        int nuls = memchr(q, 0, (size_t)(lim - q)) != NULL;
        const char *t;
        while ((t = nuls ? line_end(q, lim) : memchr(q, '\n', (size_t)(lim - q))) != NULL) {
            size_t n = (size_t)(t - p);
            if (likely(*t == '\n')) {
                int take = n <= LINE_MAX_BYTES;
                if (unlikely(after_nul)) {
                    after_nul = 0;
                    if (take && cut_start(p))
                        take = 0;
                }
                if (take)
                    one_line(f, p, n + 1);
                p = q = t + 1;
                continue;
            }
            while (++t < lim && !*t)    /* text cut by a run of NULs: not an event */
                ;
            in_nul = t == lim;
            after_nul = 1;
            p = q = t;
        }
        have = (size_t)(lim - p);
        if (have > LINE_MAX_BYTES) {    /* too long: the rest is skipped */
            skip = 1;
            have = 0;
        } else if (have && p != buf) {
            memmove(buf, p, have);
        }
    }
    return 0;
}

struct live { uint64_t ptr, seq, size; };

static int cmp_live(const void *a, const void *b)
{
    uint64_t x = ((const struct live *)a)->ptr, y = ((const struct live *)b)->ptr;
    return x < y ? -1 : x > y;
}

/* V (N blocks, distinct addresses) in address order: qsort for a few, else a radix sort,
 * 16 bits of the address a pass (3 passes for user-space addresses), through a second array
 * (qsort's comparisons were a tenth of a scan of a million blocks). */
static void sort_live(struct live *v, size_t n)
{
    uint64_t top = 0;
    for (size_t i = 0; i < n; i++)
        top |= v[i].ptr;
    struct live *tmp = n >= 65536 ? malloc(n * sizeof *v) : NULL;
    size_t *count = tmp ? calloc(65536, sizeof *count) : NULL;
    if (!count) {
        free(tmp);
        qsort(v, n, sizeof *v, cmp_live);
        return;
    }
    struct live *from = v, *to = tmp;
    for (int shift = 0; shift < 64 && (top >> shift); shift += 16) {
        memset(count, 0, 65536 * sizeof *count);
        for (size_t i = 0; i < n; i++)
            count[(from[i].ptr >> shift) & 0xFFFF]++;
        size_t at = 0;
        for (size_t d = 0; d < 65536; d++) {
            size_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++)
            to[count[(from[i].ptr >> shift) & 0xFFFF]++] = from[i];
        struct live *t = from;
        from = to;
        to = t;
    }
    if (from != v)
        memcpy(v, from, n * sizeof *v);
    free(count);
    free(tmp);
}

int mmleak_live_set(int nfiles, int (*open_input)(int, struct mmleak_input *),
                    struct mmleak_live *out)
{
    memset(out, 0, sizeof *out);
    struct feed f;
    memset(&f, 0, sizeof f);
    size_t buf_bytes = LINE_MAX_BYTES + READ_CHUNK + 1 + 2 * SLACK;
    char *base = mmap(NULL, buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (base == MAP_FAILED || tab_init(&f.t, 12)) {
        if (base != MAP_FAILED)
            munmap(base, buf_bytes);
        if (f.t.e)
            munmap(f.t.e, f.t.e_bytes);
        return -1;
    }
    char *buf = base + SLACK;
    int rc = 0;
    for (int i = 0; i < nfiles && !f.oom && !rc; i++) {
        struct mmleak_input in;
        if (open_input(i, &in)) {
            rc = -2;
            break;
        }
        if (feed_input(&f, &in, buf))
            rc = -2;
        close(in.fd);
    }
    munmap(base, buf_bytes);
    if (f.oom)
        rc = -1;
    struct live *v = NULL;
    size_t n = 0;
    if (!rc) {
        v = malloc((f.t.count + 1) * sizeof *v);
        if (!v)
            rc = -1;
    }
    for (size_t i = 0; !rc && i < f.t.count; i++) {
        const struct slot *e = &f.t.e[i];
        if (!e->hull && e->k0 == K_ALLOC)
            v[n++] = (struct live){ e->key, e->s0, e->size };
        else if (e->hull && e->k1 == K_ALLOC)
            v[n++] = (struct live){ e->key, e->s1, e->size };
    }
    munmap(f.t.e, f.t.e_bytes);
    munmap(f.t.ix, f.t.ix_bytes);
    if (rc) {
        free(v);
        return rc;
    }
    sort_live(v, n);
    out->ptr = malloc((n + 1) * 8);
    out->size = malloc((n + 1) * 8);
    out->seq = malloc((n + 1) * 8);
    if (!out->ptr || !out->size || !out->seq) {
        free(v);
        free(out->ptr); free(out->size); free(out->seq);
        memset(out, 0, sizeof *out);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        out->ptr[i] = v[i].ptr;
        out->size[i] = v[i].size;
        out->seq[i] = v[i].seq;
    }
    free(v);
    out->n = n;
    out->attached = f.attached;
    out->glibc = f.glibc;
    return 0;
}
