/*
 * tracer/recent.c: a thread's recent walks (API in unwind.h), in front of the memo of
 * unwind.c: the stack words a walk read are kept and compared, so a hit needs no hash and a
 * deep whole stack is remembered.  Split from unwind.c, which stays usable alone (the tests
 * and the bench link it without this file).
 */
#include "unwind.h"
#include "unwind_shared.h"
#include "compiler.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- the thread's recent walks (unwind.h) ----
 * A slot per start (ip, sp), chosen by a hash of both.  A hit: the same start, settings and
 * generation (and bp if the walk used it), the words on this thread's stack as it is known
 * now, each equal to the one kept. */
static inline struct mml_recent_slot *recent_slot(struct mml_recent *r, uintptr_t ip, uintptr_t sp)
{
    uint64_t h = (uint64_t)ip * 0x9E3779B97F4A7C15ull + (uint64_t)sp * 0xC2B2AE3D27D4EB4Full;
    return &r->slot[h >> (64 - 4)];
}
_Static_assert(MML_RECENT_SLOTS == 16, "recent_slot takes 4 bits");
/* A slot that holds a walk is given to a memo hit's walk after this many misses in a row: on
 * many stacks met at random (stacks_bench), no slot would hit again before it is replaced,
 * and copying every hit's words would cost more than the slots save. */
#define RECENT_PATIENCE 16
#define RECENT_ROUND 256
#define RECENT_WORTH 8
#define RECENT_SKIP 4096

/* The words of slot e (n of them, a multiple of 4) against the stack at sp: 0 if all equal.
 * Two words per SSE2 register, four per step: the slot's copies of its last word make up the
 * last step. */
static inline uint64_t recent_diff(const struct mml_recent_slot *e, uintptr_t sp, unsigned n)
{
    const char *b = (const char *)sp;
#if defined(__SSE2__)
    __m128i acc = _mm_setzero_si128();
    for (unsigned i = 0; i < n; i += 4) {
        __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)(b + 8 * (uintptr_t)e->off[i]));
        __m128i y = _mm_loadl_epi64((const __m128i *)(const void *)(b + 8 * (uintptr_t)e->off[i + 2]));
        x = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(x),
                                          (const double *)(const void *)(b + 8 * (uintptr_t)e->off[i + 1])));
        y = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(y),
                                          (const double *)(const void *)(b + 8 * (uintptr_t)e->off[i + 3])));
        x = _mm_xor_si128(x, _mm_load_si128((const __m128i *)(const void *)&e->val[i]));
        y = _mm_xor_si128(y, _mm_load_si128((const __m128i *)(const void *)&e->val[i + 2]));
        acc = _mm_or_si128(acc, _mm_or_si128(x, y));
    }
    return (uint64_t)_mm_cvtsi128_si64(_mm_or_si128(acc, _mm_unpackhi_epi64(acc, acc)));
#else
    uint64_t diff = 0;
    for (unsigned i = 0; i < n; i++)
        diff |= *(const uintptr_t *)(const void *)(b + 8 * (uintptr_t)e->off[i]) ^ e->val[i];
    return diff;
#endif
}

/* A hit reads the stack at the slot's offsets from sp without a bounds check: the slot was
 * filled from a walk (or a memo record) whose words all lay on this thread's own stack as
 * known then, [U.lo, U.hi), from this very sp; U.hi never changes and U.lo only moves down,
 * and the stack between a live sp and U.hi is the thread's live stack.  A slot dies with a
 * dlclose (its generation; no slot is filled with the generation of a dlclose in progress:
 * mml_unwind_trail marks such a walk bad, mml_memo_get misses). */
int mml_recent_get(struct mml_recent *r, const struct mml_start *s, unsigned salt,
                   uint64_t *value)
{
    /* Of every RECENT_ROUND lookups, fewer than one in RECENT_WORTH hit: the next
     * RECENT_SKIP are not made (each would cost a miss and, now and then, a copy). */
    if (unlikely(r->skip)) {
        if (--r->skip == 0)
            U.pf_off = 0;
        return 0;
    }
    if (unlikely(++r->tries == RECENT_ROUND)) {
        if (r->hits * RECENT_WORTH < RECENT_ROUND)
            r->skip = RECENT_SKIP;
        /* most lookups hit here: the entry points stop prefetching the memo's records */
        U.pf_ip = 0;
        atomic_signal_fence(memory_order_seq_cst);
        U.pf_off = r->hits * 4 >= 3 * RECENT_ROUND;
        r->tries = r->hits = 0;
    }
    struct mml_recent_slot *e = recent_slot(r, s->ip, s->sp);
    uint64_t key = (uint64_t)salt << 32 | atomic_load_explicit(&g_memo_gen, memory_order_relaxed);
    unsigned n = e->n;
    if (e->ip != s->ip || e->sp != s->sp || e->key != key || (e->use_bp && e->bp != s->bp) ||
        n == 0 || recent_diff(e, s->sp, n))
        goto miss;
    *value = e->value;
    e->misses = 0;
    r->hits++;
    return 1;
miss:
    if (e->misses < 255)
        e->misses++;
    return e->n && e->misses < RECENT_PATIENCE ? 0 : -1;
}

void mml_recent_put(struct mml_recent *r, const struct mml_start *s, unsigned salt, unsigned gen,
                    const struct mml_trail *tr, int nframes, uint64_t value, int from_memo)
{
    if (tr->bad || nframes < 1 || nframes > tr->walked || nframes > MML_TRAIL_FRAMES)
        return;
    int all = nframes == tr->walked;
    int n = all ? tr->n : tr->upto[nframes];
    int use_bp = all ? tr->bp_from < (1 << 30) : tr->bp_from < nframes;
    if (n < 1 || n > MML_TRAIL_MAX)
        return;
    struct mml_recent_slot *e = recent_slot(r, s->ip, s->sp);
    if (from_memo && e->n && e->misses < RECENT_PATIENCE)
        return;
    e->n = 0;       /* a signal handler's lookup in between misses */
    atomic_signal_fence(memory_order_seq_cst);
    int i;
    for (i = 0; i < n; i++) {
        e->off[i] = tr->off[i];
        e->val[i] = tr->val[i];
    }
    for (; i & 3; i++) {    /* up to a multiple of 4: copies of the last word */
        e->off[i] = tr->off[n - 1];
        e->val[i] = tr->val[n - 1];
    }
    e->ip = s->ip;
    e->sp = s->sp;
    e->bp = s->bp;
    e->use_bp = (uint8_t)use_bp;
    e->key = (uint64_t)salt << 32 | gen;
    e->value = value;
    e->misses = 0;
    atomic_signal_fence(memory_order_seq_cst);
    e->n = (uint8_t)i;
}

#undef LD
#undef ST
