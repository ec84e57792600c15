/*
 * tracer/rulecache.h: the layout of the unwinder's cache of rules (unwind.c) and its lookup,
 * shared with the memo (memo.c), which reads one rule to choose a record's set.  Not part of
 * unwind.h's API.
 */
#ifndef MMLEAK_RULECACHE_H
#define MMLEAK_RULECACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

enum { K_NONE, K_RSP, K_RBP, K_DRAP, K_SIGNAL, K_STOP };      /* how to find the CFA */
enum { B_SAME, B_CFA, B_DEREF, B_LOST };                      /* where the caller's rbp is */

/* The cache is indexed by the key k = x + 1 (the return address for a normal frame, pc + 1 for
 * an exact one: the rule of k is the rule at k - 1 in both cases).  An entry lives in slot
 * (k / 8) mod 2^16 (its primary slot: a shift and an AND on the walk's chain of dependent
 * loads) or, when that one is taken, in its alternate slot (slot2: code laid out in equal
 * power-of-two strides makes many keys share a primary slot, not an alternate one).  One
 * slot per 8 bytes of code, not per byte: the return addresses of one function share a few
 * cache lines instead of taking one line each (on the many-stacks benchmark, 4360 return
 * addresses in about 50 KiB of code: about 800 lines instead of 4360, which stay in the
 * cache while the program and mmleak's writing evict the rest).  An entry is
 *     bit  0      1 in an alternate slot
 *     bits 1-3    k mod 8
 *     bits 4-31   k >> 19 (k < 2^47): with the slot and bits 0-3, this gives back all of k
 *     bits 32-34  kind (never 0: an entry is never 0)
 *     bits 35-36  bmode
 *     bits 37-44  rbp's offset k / 8 (signed)
 *     bits 45-63  the CFA offset off (signed, 19 bits: larger frames are not cached)
 * so that a hit costs one load, one compare and one arithmetic shift for the CFA.  2^16
 * entries: 512 KiB of .bss, of which only the pages touched cost memory. */
#define CACHE_BITS 16
#define SLOT_MASK ((1U << CACHE_BITS) - 1)
#define KEY_MAX ((1ULL << 47) - 1)
#define SLOT_SHIFT 3
#define TAG_BITS (47 - CACHE_BITS + 1)
#define TAG_MASK ((1ULL << TAG_BITS) - 1)
#define OFF_SHIFT (TAG_BITS + 13)
#define R_OFF_MIN (-(1L << (63 - OFF_SHIFT)))
#define R_OFF_MAX ((1L << (63 - OFF_SHIFT)) - 1)

extern _Atomic uint64_t g_cache[1U << CACHE_BITS];

/* The slots and the tag of a key: the tag holds the bits of k the primary slot does not. */
static inline size_t slot1(uintptr_t key)
{
    return (key >> SLOT_SHIFT) & SLOT_MASK;
}

static inline uint64_t key_tag(uintptr_t key)
{
    return ((key & ((1U << SLOT_SHIFT) - 1)) | key >> (CACHE_BITS + SLOT_SHIFT) << SLOT_SHIFT) << 1;
}

/* The alternate slot: the primary slot's bits mixed with a hash of the tag's (keys sharing a
 * primary slot differ in those only), so that, given the tag, it still determines k. */
static inline size_t slot2(uintptr_t key)
{
    return (slot1(key) ^ (size_t)((key_tag(key) * 0x9E3779B97F4A7C15ULL) >> 40)) & SLOT_MASK;
}

static inline uint64_t cache_get(uintptr_t key)
{
    if (unlikely(key > KEY_MAX))
        return 0;
    uint64_t tag = key_tag(key);
    uint64_t e = atomic_load_explicit(&g_cache[slot1(key)], memory_order_relaxed);
    if (likely((e & TAG_MASK) == tag && (e >> TAG_BITS)))
        return e;
    /* An empty primary slot: the key is not in its alternate either (cache_put uses that one
     * only when the primary is taken, and only cache_clear empties slots; a lookup during a
     * clear that finds the primary emptied and the alternate not yet is a miss, the safe
     * answer for a rule of an object being unloaded).
     * Not reading the alternate spares a miss a load, and a fresh process's first walks a
     * page fault per key: a random page of the table mapped to the zero page for nothing. */
    if (!e)
        return 0;
    e = atomic_load_explicit(&g_cache[slot2(key)], memory_order_relaxed);
    if ((e & TAG_MASK) == (tag | 1) && (e >> TAG_BITS))
        return e;
    return 0;
}

#endif
