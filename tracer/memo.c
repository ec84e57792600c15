/*
 * tracer/memo.c: the memo of whole walks (API in unwind.h): a walk from the same start whose
 * stack words still hash the same is not made again.  Split from unwind.c (the walk), which
 * stays usable alone: the tests and the unwinder's benchmark link it without this file.
 */
#include "memo.h"

#include <stdatomic.h>
#include <stdint.h>

/* The records (memo.h): 8192 sets of four, 2 MiB of .bss, only the pages used cost memory. */
struct memo g_memo[1U << MEMO_BITS] __attribute__((aligned(64 * MEMO_WAYS)));

/* 1 while the thread's recent walks serve most lookups (recent.h): the entry points do not
 * prefetch (U.pf_ip is then 0: the lookup computes its set) */
__thread int mml_memo_prefetch_off __attribute__((tls_model("initial-exec")));

void mml_memo_prefetch(uintptr_t ip, uintptr_t sp)
{
    memo_prefetch(ip, sp);
}

unsigned mml_memo_gen(void)
{
    return atomic_load_explicit(&g_memo_gen, memory_order_acquire);
}

int mml_memo_get(const struct mml_start *s, unsigned salt, uint64_t *value, int *nframes,
                 struct mml_trail *words, struct mml_memo_hit *hit)
{
    /* two copies of the check: the one without words has no trace of them */
    if (words)
        return memo_lookup(s, salt, value, nframes, words, NULL);
    return memo_lookup(s, salt, value, nframes, NULL, hit);
}

void mml_memo_put(const struct mml_start *s, unsigned salt, unsigned gen,
                  const struct mml_trail *tr, int nframes, uint64_t value)
{
    if (tr->bad || nframes < 1 || nframes > tr->walked || nframes > MML_TRAIL_FRAMES ||
        value >> MML_MEMO_VALUE_BITS)
        return;
    /* the words the first nframes frames depend on: all of them if the walk ended there
     * (its last step, that found no caller, read some too) */
    int all = nframes == tr->walked;
    int n = all ? tr->n : tr->upto[nframes];
    int use_bp = all ? tr->bp_from < (1 << 30) : tr->bp_from < nframes;
    if (n > MEMO_DELTAS || n > MML_TRAIL_MAX)
        return;
    union { uint64_t w[4]; int8_t b[32]; } d = {{0, 0, 0, 0}};
    uint64_t a = 0, b = 0;
    long prev = 0, top = 0;
    int j = 0;
    for (int i = 0; i < n; i++) {
        long delta = (long)tr->off[i] - prev;
        if (delta > MEMO_ESC && delta <= 127) {
            if (j + 1 > MEMO_DELTAS)
                return;
            d.b[j++] = (int8_t)delta;
        } else {
            if (delta < INT16_MIN || delta > INT16_MAX || j + 3 > MEMO_DELTAS)
                return;
            d.b[j++] = MEMO_ESC;
            d.b[j++] = (int8_t)(uint8_t)((uint16_t)delta & 0xff);
            d.b[j++] = (int8_t)(uint8_t)((uint16_t)delta >> 8);
        }
        prev = tr->off[i];
        top = prev > top ? prev : top;
        a += tr->val[i];
        b += a;
    }
    uintptr_t last = n ? tr->val[n - 1] : 0;
    for (; n & 3; n++) {
        /* up to a multiple of 4: copies of the last word (a step of 0) */
        if (j + 1 > MEMO_DELTAS)
            return;
        d.b[j++] = 0;
        a += last;
        b += a;
    }
    d.b[30] = (int8_t)(uint8_t)(top & 0xff);
    d.b[31] = (int8_t)(uint8_t)(top >> 8);
    /* the hash: MEMO_HASHED words, the last one repeated (what memo_check reads: the steps
     * after the n-th are 0) */
    for (int i = n; i < MEMO_HASHED; i++) {
        a += last;
        b += a;
    }
    uint64_t h = memo_sum(MEMO_HASHED, a, b);
    /* The preferred way if empty, else an empty way; else, at random (the hash), one that
     * holds another start: a way with
     * this start holds another path that reaches the same function at the same depth (the
     * words differ), worth keeping; else any. */
    uint64_t tag = memo_tag0(s, salt, gen);
    if (use_bp)
        tag = memo_tag1(tag, s->bp);
    struct memo *pref = memo_set(s->ip, s->sp), *set = memo_ways(pref), *r = NULL;
    unsigned start = (unsigned)(mix64(h) >> 17);
    if (!MEMO_LD(pref->tag))
        r = pref;
    for (unsigned w = 0; w < MEMO_WAYS && !r; w++)
        if (!MEMO_LD(set[w].tag))
            r = &set[w];
    for (unsigned w = 0; w < MEMO_WAYS && !r; w++)
        if (MEMO_LD(set[(start + w) % MEMO_WAYS].tag) != tag)
            r = &set[(start + w) % MEMO_WAYS];
    if (!r)
        r = &set[start % MEMO_WAYS];
    uint64_t q = atomic_load_explicit(&r->seq, memory_order_relaxed);
    uint32_t lo = (uint32_t)q;
    if ((lo & 1) || !atomic_compare_exchange_strong_explicit(&r->seq, &q,
                                                            (q & ~0xffffffffull) | (lo + 1),
                                                            memory_order_acquire,
                                                            memory_order_relaxed))
        return;
    atomic_thread_fence(memory_order_release);
    for (int i = 0; i < 4; i++)
        MEMO_ST(r->dw[i], d.w[i]);
    unsigned flags = (use_bp ? MEMO_F_BP : 0) | (j != n ? MEMO_F_ESC : 0);
    MEMO_ST(r->value, value | (uint64_t)n << MEMO_N_SHIFT | (uint64_t)nframes << MEMO_NF_SHIFT |
                     (uint64_t)flags << MEMO_FL_SHIFT);
    MEMO_ST(r->tag, tag);
    MEMO_ST(r->vhash, h);
    /* the new sequence number, and no stamp: no id set is known to hold the new value */
    atomic_store_explicit(&r->seq, (uint32_t)(lo + 2), memory_order_release);
}

void mml_memo_stamp(const struct mml_memo_hit *hit, uint32_t stamp)
{
    struct memo *r = hit->rec;
    uint64_t q = hit->seq;
    if ((uint32_t)(q >> 32) == stamp)
        return;
    /* only if the record is still the one checked, with the stamp seen then */
    atomic_compare_exchange_strong_explicit(&r->seq, &q, (uint32_t)q | (uint64_t)stamp << 32,
                                            memory_order_relaxed, memory_order_relaxed);
}
