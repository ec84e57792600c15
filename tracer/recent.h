/*
 * tracer/recent.h: the lookup in a thread's recent walks (API in unwind.h), inlined into the
 * stack writer (record.h); recent.c keeps them.  Not part of unwind.c, which stays usable
 * alone (the tests and the bench link it without these files).
 */
#ifndef MMLEAK_RECENT_H
#define MMLEAK_RECENT_H

#include "unwind.h"
#include "unwind_shared.h"
#include "compiler.h"

#include <stdatomic.h>
#include <stdint.h>
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
static inline __attribute__((always_inline)) int
mml_recent_get(struct mml_recent *r, const struct mml_start *s, unsigned salt, uint64_t *value,
               struct mml_recent_slot **slot)
{
    /* Of every RECENT_ROUND lookups, fewer than one in RECENT_WORTH hit: the next
     * RECENT_SKIP are not made (each would cost a miss and, now and then, a copy). */
    if (unlikely(r->skip)) {
        if (--r->skip == 0)
            mml_memo_prefetch_off = 0;
        return 0;
    }
    if (unlikely(++r->tries == RECENT_ROUND)) {
        if (r->hits * RECENT_WORTH < RECENT_ROUND)
            r->skip = RECENT_SKIP;
        /* most lookups hit here: the entry points stop prefetching the memo's records */
        U.pf_ip = 0;
        atomic_signal_fence(memory_order_seq_cst);
        mml_memo_prefetch_off = r->hits * 4 >= 3 * RECENT_ROUND;
        r->tries = r->hits = 0;
    }
    struct mml_recent_slot *e = recent_slot(r, s->ip, s->sp);
    uint64_t key = (uint64_t)salt << 32 | atomic_load_explicit(&g_memo_gen, memory_order_relaxed);
    unsigned n = e->n;
    if (e->ip != s->ip || e->sp != s->sp || e->key != key || (e->use_bp && e->bp != s->bp) ||
        n == 0 || recent_diff(e, s->sp, n))
        goto miss;
    *value = e->value;
    *slot = e;
    e->misses = 0;
    r->hits++;
    return 1;
miss:
    if (e->misses < 255)
        e->misses++;
    return e->n && e->misses < RECENT_PATIENCE ? 0 : -1;
}

#endif
