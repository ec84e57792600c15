/*
 * tracer/memo.c: the memo of whole walks (API in unwind.h): a walk from the same start whose
 * stack words still hash the same is not made again.  Split from unwind.c (the walk), which
 * stays usable alone: the tests and the unwinder's benchmark link it without this file.
 */
#include "unwind.h"
#include "unwind_shared.h"
#include "rulecache.h"
#include "compiler.h"

#include "procstatus.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- the memo ------------------------------------------------------------------------------
 * One table for all threads (a key holds a stack pointer, so threads do not share records,
 * and one table costs less memory than one per thread), sets of four records chosen by the
 * start (memo_set0, memo_set1), one cache line per record: the walk it replaces costs a chain
 * of dependent loads, and a record that
 * is itself a cache miss would eat most of the gain (a record of 384 bytes with the words
 * themselves was measured at about 100 ns per lookup on the many-stacks benchmark, most of
 * it waiting for memory).  So a record keeps a 64-bit hash of the words, not the words: a
 * walk is skipped when the same start (ip, sp, the settings, the dlclose generation, and bp
 * if the walk used it) finds stack words with the same hash at the same places.  A false
 * match needs two 64-bit hashes to collide, as likely as two stacks sharing an id.
 *
 * The places are kept as the differences between consecutive offsets, in words: one byte
 * each (frames below 1 KiB), or an escape and 16 bits (up to 256 KiB); a walk whose steps do
 * not fit the 32 bytes is not kept.  A record is written under a
 * sequence number (odd while written: readers miss, another writer, such as a signal handler
 * interrupting this one, gives up) and read with the number checked before and after, and
 * every offset read is checked against this thread's stack, so a torn record is a miss,
 * never a stray read. */
#define MEMO_BITS 15         /* 8192 sets of four records: 2 MiB of .bss, only the pages used
                                cost memory (until memo_huge) */
#define MEMO_WAYS 4
#define MEMO_DELTAS 30
#define MEMO_HASHED 28      /* words hashed: the walk's n (at most 28, a multiple of 4), then
                               copies of the last (MEMO_SHORT of them for a short walk) */
#define MEMO_SHORT 8        /* a walk of at most this many words hashes this many (short
                               stacks: a wrapper's callers), not MEMO_HASHED; see memo_len */
#define MEMO_ESC (-128)     /* in delta[]: the step does not fit a byte, two bytes follow */
#define MEMO_F_BP 1         /* flags: the walk used the start's bp (the tag holds it) */
#define MEMO_F_ESC 2        /* delta[] holds an escape (a step of 128 words or more) */
#define MEMO_F_REDIR 4      /* a marker, not a walk: the walks of this start (the tag's) are kept
                               in its second set (memo_set1) */
/* value's word: the caller's value in its low MML_MEMO_VALUE_BITS, then the words (n, 6
 * bits), the frames (7 bits) and the flags (3 bits) */
#define MEMO_N_SHIFT MML_MEMO_VALUE_BITS
#define MEMO_NF_SHIFT (MEMO_N_SHIFT + 6)
#define MEMO_FL_SHIFT (MEMO_NF_SHIFT + 7)
_Static_assert(MEMO_FL_SHIFT + 3 <= 64, "value, n, nframes and flags share a word");
struct memo {
    _Atomic uint64_t seq;   /* low 32 bits: the sequence number, odd while written; high 32:
                               the stamp (mml_memo_stamp: the id set of that stamp holds the
                               value), 0 when written */
    uint64_t tag;           /* memo_tag(): the start (ip, sp, bp if used), settings, generation */
    uint64_t vhash;         /* hash of the words */
    uint64_t value;         /* the value, n, nframes, flags (MEMO_*_SHIFT) */
    uint64_t dw[4];         /* bytes 0-29: the offsets of the words from sp, in words, as
                               differences (a byte, or MEMO_ESC and 16 bits: frames of 1 KiB
                               or more); bytes 30-31: the highest offset (little-endian) */
} __attribute__((aligned(64)));
_Static_assert(sizeof(struct memo) == 64, "a memo record is one cache line");
/* The table: first in .bss, then (memo_huge) in one huge page of its own.  Read through
 * g_memo, one load of a pointer that changes once per process. */
#define MEMO_HUGE_PAGE (2u << 20)
static struct memo g_memo_bss[1U << MEMO_BITS] __attribute__((aligned(64 * MEMO_WAYS)));
_Static_assert(sizeof g_memo_bss == MEMO_HUGE_PAGE, "the memo fills one huge page");
static struct memo *_Atomic g_memo_at = g_memo_bss;
#define g_memo (atomic_load_explicit(&g_memo_at, memory_order_relaxed))

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ h >> 33;
}

/* The four records (ways) a walk from (ip, sp) may be kept in, as the one it is looked up in
 * first (its preferred way: memo_put keeps it there when that way is free, and the entry
 * point prefetches that record alone); memo_ways gives the set.
 *
 * A start has two sets.  Its first (memo_set0) is chosen by the start alone, so that the
 * entry point's prefetch can leave at once: choosing it by the return address one frame up
 * too meant reading the cached rule of ip first, a miss of its own on many stacks
 * (bench/stacks_bench: 5 to 9 ns per event, docs/performance-stacks.rst, the tenth pass).  But many
 * paths can reach one function at one depth (the same start: a wrapper called from many
 * call sites of one function, bench/sites_bench.c), more than four ways hold; when a third
 * walk of one start comes, memo_put leaves a marker in its first set (MEMO_F_REDIR) and keeps
 * the walks of that start in its second set (memo_set1), chosen by the start and by the
 * return address one frame up, found with the cached rule of ip: there they spread over
 * sets.  A wrong or missing rule only costs a miss: the words checked include that return
 * address. */
static inline struct memo *memo_pick(uint64_t h)
{
    h ^= h >> 29;
    return &g_memo[MEMO_WAYS * (h >> (64 - MEMO_BITS + 2)) + (h >> 20 & (MEMO_WAYS - 1))];
}

static inline uint64_t memo_start_hash(uintptr_t ip, uintptr_t sp)
{
    return (uint64_t)ip * 0x9E3779B97F4A7C15ull ^ (uint64_t)sp * 0xC2B2AE3D27D4EB4Full;
}

static inline struct memo *memo_set0(uintptr_t ip, uintptr_t sp)
{
    return memo_pick(memo_start_hash(ip, sp));
}

static inline __attribute__((always_inline)) struct memo *memo_set1(uintptr_t ip, uintptr_t sp)
{
    uintptr_t up = 0;
    uint64_t e = cache_get(ip);
    if (likely(e) && (e >> TAG_BITS & 7) == K_RSP) {
        uintptr_t cfa = sp + (uintptr_t)((int64_t)e >> OFF_SHIFT);
        if (cfa >= sp + 8 && cfa <= U.hi && sp >= U.lo)
            up = *(const uintptr_t *)(cfa - 8);
    }
    /* never the first set's hash, even without a rule (up = 0) */
    return memo_pick(memo_start_hash(ip, sp) ^ ((uint64_t)up * 0x165667B19E3779F9ull +
                                                0x27D4EB2F165667C5ull));
}

/* The record's 32 bytes of steps into b (16-aligned), in two 16-byte loads and stores: each
 * a single access, so the byte loads that follow are forwarded from one store.  A torn copy
 * is caught by the sequence number, checked after it as before. */
static inline __attribute__((always_inline)) void memo_copy_steps(int8_t *b, const uint64_t *dw)
{
#if defined(__SSE2__)
    __m128i lo = _mm_load_si128((const __m128i *)(const void *)dw);
    __m128i hi = _mm_load_si128((const __m128i *)(const void *)(dw + 2));
    _mm_store_si128((__m128i *)(void *)b, lo);
    _mm_store_si128((__m128i *)(void *)(b + 16), hi);
#else
    for (int i = 0; i < 4; i++) {
        uint64_t v = __atomic_load_n(&dw[i], __ATOMIC_RELAXED);
        __builtin_memcpy(b + 8 * i, &v, 8);
    }
#endif
}

_Static_assert((MEMO_WAYS & (MEMO_WAYS - 1)) == 0, "ways: a power of two");
static inline struct memo *memo_ways(struct memo *r)
{
    return (struct memo *)((uintptr_t)r & ~(uintptr_t)(sizeof *r * MEMO_WAYS - 1));
}

/* 1 while the thread's recent walks serve most lookups (recent.h): the entry points do not
 * prefetch (U.pf_ip is then 0: the lookup computes its set) */
__thread int mml_memo_prefetch_off __attribute__((tls_model("initial-exec")));

/* The last start whose walks this thread found kept in their second set (MEMO_F_REDIR): its
 * prefetch and lookup go there first.  Not in U: U grown to 64 bytes measured slower on
 * bench/sites_bench (docs/performance-stacks.rst, the eleventh pass). */
static __thread struct { uintptr_t ip, sp; } second_guess
    __attribute__((tls_model("initial-exec")));

/* The set to look in first: the start's second set if this thread last found it there. */
static inline struct memo *memo_set_guess(uintptr_t ip, uintptr_t sp)
{
    return unlikely(ip == second_guess.ip && sp == second_guess.sp) ? memo_set1(ip, sp)
                                                                    : memo_set0(ip, sp);
}

void mml_memo_prefetch(uintptr_t ip, uintptr_t sp)
{
    struct memo *r = memo_set_guess(ip, sp);
    __builtin_prefetch(r);
    U.pf_ip = 0;            /* a handler that reads the three between these stores misses */
    atomic_signal_fence(memory_order_seq_cst);
    U.pf_set = r;
    U.pf_sp = sp;
    atomic_signal_fence(memory_order_seq_cst);
    U.pf_ip = ip;
}

/* The tag of a record: its start, with bp if the walk used it, the caller's settings and the
 * generation.  Only compared for equality: a mix (a bijection) would not make two tags
 * differ that are equal without it.  With bp, that of a walk without it and a mix of bp. */
static inline uint64_t memo_tag0(const struct mml_start *s, unsigned salt, unsigned gen)
{
    return s->ip * 0x9E3779B97F4A7C15ull + s->sp * 0xC2B2AE3D27D4EB4Full +
           ((uint64_t)salt << 32 | gen);
}

static inline uint64_t memo_tag1(uint64_t tag0, uintptr_t bp)
{
    return tag0 ^ mix64(bp * 0x165667B19E3779F9ull + 0x27D4EB2F165667C5ull);
}

/* The words' hash: n + the sum of word i times memo_w[i], an odd constant of its own (not
 * mixed: only compared for equality, see memo_tag0), over n = MEMO_HASHED words: the walk's,
 * then copies of its last.  The constants are random, not a function of i: weights linear in
 * i (the sum K * A + 2 * (n * A - B) of A the words and B the running sums, two additions a
 * word, that this was) give the same sum to two walks whose words differ by +d -d -d +d at
 * four consecutive places, whatever d, and a recursion through two call sites of one
 * function (X Y Y X against Y X X Y) makes exactly that: the memo then gave the second walk
 * the first one's stack (tests/stack_collide.c).  The products do not wait for each other:
 * the chain is still one addition a word.
 *
 * The weights have 31 bits and a sign (between 2^30 and 2^31 in magnitude, sign-extended to
 * 64), so that the multiplication takes its weight as an immediate: one instruction with the
 * word's load (imul $w, (sp,o,8), r), where a 64-bit weight needed a movabs first, four
 * instructions a word instead of five (bench/stacks_bench: 14.7 fewer per event,
 * docs/performance-stacks.rst, the twelfth pass).  The sum is still taken mod 2^64 over whole
 * words: one word changed never keeps it (odd weights); two words swapped keep it only if
 * their difference times the difference of their weights, which has at most 13 trailing
 * zero bits here, is 0 mod 2^64; what small weights add is that a few words' differences can
 * cancel over the integers too, which takes differences that are exact multiples of other
 * weights, 2^30 or more apart: not a shape that return addresses and frames of one program
 * take (tests/memo_check.c and tests/stack_collide.c check the shapes they do). */
static const int64_t memo_w[MEMO_HASHED] = {
    -0x4e7c0219,  0x5593a225,  0x43b09f57, -0x68b8f3c5,
    -0x7a0788cd,  0x733a6d5d,  0x61a5062b, -0x7546d8a3,
     0x479183dd,  0x4269bd2f,  0x76ab934f, -0x7e053639,
    -0x4a66c75f, -0x5fdbb135, -0x5382e9ef, -0x526c970d,
     0x730a0a43, -0x6a9d257b,  0x48e8ded7, -0x579b7ea7,
    -0x6182e1e3,  0x46df2121,  0x685c95b5, -0x79e4933f,
    -0x4e74f33f, -0x60926acd, -0x4ab7803f, -0x5fba015b,
};
static inline uint64_t memo_sum(unsigned n, uint64_t a)
{
    return (uint64_t)n + a;
}

/* The words hashed for a record of n words (padded with copies of the last): MEMO_SHORT for
 * a short walk, else MEMO_HASHED.  Two lengths, one branch on n in the check: bench/sites_bench
 * (8 words) 38 instructions and about 6 ns per event less; bench/stacks_bench, whose walks
 * all have 12 words or more (the branch always the same way), 3 instructions more and no
 * time lost.  A boundary of 16 put stacks_bench's walks on both sides of it, at random:
 * +0.21 mispredicted branches per event, no gain (docs/performance-stacks.rst, the twelfth pass). */
static inline unsigned memo_len(unsigned n)
{
    return n > MEMO_SHORT ? MEMO_HASHED : MEMO_SHORT;
}

unsigned mml_memo_gen(void)
{
    return atomic_load_explicit(&g_memo_gen, memory_order_acquire);
}

#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

/* Record r, whose tag is the start's: 1 if the words still hash the same; 2 if r is a marker
 * (MEMO_F_REDIR: the start's walks are in its second set).  The record is
 * copied first, its sequence number checked before and after: the copy is then one whole
 * record as memo_put wrote it, whose offsets all lie in [0, top], so one bounds check against
 * this thread's stack covers every word read.  Its words are a multiple of 4 (memo_put pads
 * them with copies of the last, and hashes memo_len(n) of them: the check of a record without
 * escapes reads that many). */
static inline __attribute__((always_inline)) int
memo_check(struct memo *r, const struct mml_start *s, uint64_t tag, int with_bp, uint64_t *value,
           int *nframes, struct mml_trail *words, struct mml_memo_hit *hit)
{
    uint64_t q = atomic_load_explicit(&r->seq, memory_order_acquire);
    uint64_t rtag = LD(r->tag);
    uint64_t vh = LD(r->vhash), vw = LD(r->value);
    /* the steps, copied in the width they are stored and read back in: 8-byte copies read
     * back as 16 bytes (GCC's copy into db) stalled on store forwarding, a tenth of the
     * lookup's time on bench/stacks_bench (docs/performance-stacks.rst, the fifteenth pass) */
    union { uint64_t w[4]; int8_t b[32]; } d __attribute__((aligned(16)));
    memo_copy_steps(d.b, r->dw);
    atomic_thread_fence(memory_order_acquire);
    unsigned n = (unsigned)(vw >> MEMO_N_SHIFT) & 63, nf = (unsigned)(vw >> MEMO_NF_SHIFT) & 127;
    unsigned flags = (unsigned)(vw >> MEMO_FL_SHIFT) & 7;
    uint64_t val = vw & ((1ull << MML_MEMO_VALUE_BITS) - 1);
    /* the tag again, in the copy: the record may have been rewritten for another start
     * since the scan read it (a new stamp alone changes nothing of it) */
    if ((q & 1) || (uint32_t)atomic_load_explicit(&r->seq, memory_order_relaxed) != (uint32_t)q ||
        rtag != tag || n > MEMO_DELTAS || (n & 3) || (unsigned)with_bp > (flags & MEMO_F_BP))
        return 0;
    /* the words must lie on this thread's stack as it is known now */
    uintptr_t sp = s->sp, top = (uint8_t)d.b[30] | (uintptr_t)(uint8_t)d.b[31] << 8;
    if (sp < U.lo || sp >= U.hi || top >= (U.hi - sp) / 8)
        return 0;
    const uintptr_t *w = (const uintptr_t *)sp;
    uint64_t a = 0;
    long o = 0;
    if (likely(!(flags & (MEMO_F_ESC | MEMO_F_REDIR))) && !words) {
        /* one byte per step, no escape to decode: MEMO_SHORT or MEMO_HASHED words, the
         * steps after the n-th being 0 (copies of the last word), so one branch on n, not a
         * loop of n steps (its exit was mispredicted about one lookup in two on
         * bench/stacks_bench) */
        int8_t *db = d.b;
        /* the steps read back one byte each from memory (one load that sign-extends), not
         * shifted out of the record's words in registers (three instructions more a step) */
        __asm__("" : "+m"(d));
#pragma GCC unroll 8
        for (unsigned i = 0; i < MEMO_SHORT; i++) {
            o += db[i];
            a += w[o] * memo_w[i];
        }
        if (n > MEMO_SHORT) {
#pragma GCC unroll 20
            for (unsigned i = MEMO_SHORT; i < MEMO_HASHED; i++) {
                o += db[i];
                a += w[o] * memo_w[i];
            }
        }
    } else if (flags & MEMO_F_REDIR) {
        return 2;
    } else for (unsigned i = 0, j = 0; i < n; i++) {
        long k = d.b[j++];
        if (k == MEMO_ESC) {         /* a larger step: 16 bits follow */
            if (j + 2 > MEMO_DELTAS)
                return 0;
            k = (int16_t)(uint16_t)((uint8_t)d.b[j] | (uint8_t)d.b[j + 1] << 8);
            j += 2;
        }
        o += k;
        if (unlikely(o < 0 || (uintptr_t)o > top || j > MEMO_DELTAS))
            return 0;
        uintptr_t v = w[o];
        a += v * memo_w[i];
        if (words) {
            words->off[i] = (uint16_t)o;
            words->val[i] = v;
        }
        if (i + 1 == n)         /* the hash goes on with copies of the last word */
            for (unsigned k = n; k < memo_len(n); k++)
                a += v * memo_w[k];
    }
    if (memo_sum(MEMO_HASHED, a) != vh)
        return 0;
    *value = val;
    *nframes = (int)nf;
    if (hit) {
        hit->rec = r;
        hit->seq = q;
    }
    if (words) {
        words->n = (int)n;
        words->bad = 0;
        words->walked = *nframes;
        words->bp_from = with_bp ? 0 : 1 << 30;
    }
    return 1;
}

/* The ways of the set whose tag is the start's (without bp, or with it for a walk that used
 * it), each checked: r, the preferred way, first.  1: a hit; 2: a marker of the start. */
static inline __attribute__((always_inline)) int
memo_find(struct memo *r, const struct mml_start *s, uint64_t t0, uint64_t *value,
          int *nframes, struct mml_trail *words, struct mml_memo_hit *hit)
{
    uint64_t t1 = 0;
    struct memo *set = memo_ways(r);
    unsigned p = (unsigned)(r - set);
    for (unsigned k = 0; k < MEMO_WAYS; k++) {
        struct memo *x = &set[(p + k) & (MEMO_WAYS - 1)];
        uint64_t tag = LD(x->tag);
        int with_bp = 0;
        if (tag != t0) {
            if (!(LD(x->value) >> MEMO_FL_SHIFT & MEMO_F_BP))
                continue;
            if (!t1)
                t1 = memo_tag1(t0, s->bp);
            if (tag != t1)
                continue;
            with_bp = 1;
        }
        int k = memo_check(x, s, tag, with_bp, value, nframes, words, hit);
        if (k)
            return k;
    }
    return 0;
}

/* mml_memo_get's lookup missed in set r (k = 0), or met a marker there (k = 2): if r was the
 * start's first set, a marker sends it to the second (and the thread's next prefetch of this
 * start goes there); if r was the second (the thread's guess), the first is looked at too, in
 * case the start's walks are no longer kept in the second (its marker was replaced). */
static __attribute__((noinline)) int
memo_get_more(struct memo *r, const struct mml_start *s, uint64_t t0, int k, uint64_t *value,
              int *nframes, struct mml_trail *words, struct mml_memo_hit *hit)
{
    struct memo *r0 = memo_set0(s->ip, s->sp);
    if (memo_ways(r) == memo_ways(r0)) {
        if (k != 2)
            return 0;
        /* a handler that reads the two between these stores guesses wrong */
        second_guess.ip = 0;
        atomic_signal_fence(memory_order_seq_cst);
        second_guess.sp = s->sp;
        atomic_signal_fence(memory_order_seq_cst);
        second_guess.ip = s->ip;
        r = memo_set1(s->ip, s->sp);
    } else {
        r = r0;
    }
    k = words ? memo_find(r, s, t0, value, nframes, words, NULL)
              : memo_find(r, s, t0, value, nframes, NULL, hit);
    if (r == r0 && k != 2)
        second_guess.ip = 0;    /* the first set holds no marker of the start: no guessing */
    return k == 1;
}

int mml_memo_get(const struct mml_start *s, unsigned salt, uint64_t *value, int *nframes,
                 struct mml_trail *words, struct mml_memo_hit *hit)
{
    /* the set the entry point prefetched, if this is that start (a signal handler's
     * allocation in between may have prefetched another) */
    struct memo *r = U.pf_ip == s->ip && U.pf_sp == s->sp ? U.pf_set : memo_set_guess(s->ip, s->sp);
    if (atomic_load_explicit(&g_unloading, memory_order_relaxed))
        return 0;
    uint64_t t0 = memo_tag0(s, salt, atomic_load_explicit(&g_memo_gen, memory_order_relaxed));
    /* two copies of the check: the one without words has no trace of them */
    int k = words ? memo_find(r, s, t0, value, nframes, words, NULL)
                  : memo_find(r, s, t0, value, nframes, NULL, hit);
    if (likely(k == 1))
        return 1;
    return memo_get_more(r, s, t0, k, value, nframes, words, hit);
}

/* ---- the memo in one huge page ----
 * A busy memo's records are read at random over the whole table: the 4096 walks of
 * bench/stacks_bench lie on its 512 pages of 4 KiB, far more than the first-level TLB holds,
 * so a lookup's record costs a TLB miss as well as a cache miss (under a VM, a walk of two
 * sets of page tables).  In one 2 MiB page the table takes one TLB entry
 * (docs/performance-stacks.rst, the thirteenth pass).  Only once the memo has kept MEMO_HUGE_AT
 * walks: by then about 87 % of the table's pages are resident anyway (1024 records at random
 * over 512 pages), so the huge page, all of it resident, adds little; a program with fewer
 * walks keeps the .bss table and its few pages.  The .bss table cannot take the huge page
 * itself: it is not aligned to 2 MiB (aligned so, it moved the segments of the executables
 * that link this file, and glibc's _dl_find_object then gave them a range without their
 * .eh_frame_hdr: the walks of tests/memo_check.c stopped after one frame).  So a new table
 * is mapped, 2 MiB-aligned, with MADV_HUGEPAGE (its first write faults in the huge page),
 * and g_memo switched to it, empty: the walks are made once more and kept there.  A lookup
 * still on the old table (its prefetched set, a record being stamped) reads valid memory:
 * the old pages are given back with MADV_DONTNEED and read as zeros, an empty way, a miss.
 * Once per process, from a walk (the cold path), never under a seccomp filter, which the
 * advice could offend (the status is read with calls mmleak already makes); without
 * transparent huge pages nothing changes but the address.  errno is the program's, kept. */
#define MEMO_HUGE_AT 1024
static _Atomic unsigned g_memo_puts;
/* tracer/mem.c's, in mmleak.so: the new table named and listed as mmleak's own memory, which
 * the reachability scan leaves out (its words are not the program's).  Weak: the tests and
 * the unwinder's benchmark link this file without mem.c. */
void mml_own_note(void *p, size_t n) __attribute__((weak));
static atomic_int g_memo_huge_once;

static __attribute__((noinline, cold)) void memo_huge(void)
{
    static char status[8192];   /* not on the stack: a walk may run on a small signal stack */
    if (atomic_exchange_explicit(&g_memo_huge_once, 1, memory_order_relaxed))
        return;
    int e = errno;
    if (!mml_status_seccomp("/proc/self/status", status, sizeof status)) {
        char *m = mmap(NULL, 2 * MEMO_HUGE_PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m != MAP_FAILED) {
            uintptr_t up = ((uintptr_t)m + MEMO_HUGE_PAGE - 1) & ~(uintptr_t)(MEMO_HUGE_PAGE - 1);
            char *a = (char *)up;
            /* the rest of the mapping, before and after the aligned table, given back */
            if (a > m)
                munmap(m, (size_t)(a - m));
            munmap(a + MEMO_HUGE_PAGE, (size_t)(m + MEMO_HUGE_PAGE - a));
            if (madvise(a, MEMO_HUGE_PAGE, MADV_HUGEPAGE) == 0) {
                if (mml_own_note)
                    mml_own_note(a, MEMO_HUGE_PAGE);
                atomic_store_explicit(&g_memo_at, (struct memo *)(void *)a, memory_order_release);
                /* its whole pages (the table is aligned to 256 bytes only) */
                uintptr_t lo = ((uintptr_t)g_memo_bss + 4095) & ~(uintptr_t)4095;
                uintptr_t hi = ((uintptr_t)g_memo_bss + sizeof g_memo_bss) & ~(uintptr_t)4095;
                madvise((void *)lo, hi - lo, MADV_DONTNEED);
            } else {
                munmap(a, MEMO_HUGE_PAGE);
            }
        }
    }
    errno = e;
}

/* Write record r (tag, hash h, the value's word vw, the steps d) under its sequence number,
 * unless another writer holds it. */
static void memo_write(struct memo *r, uint64_t tag, uint64_t h, uint64_t vw, const uint64_t d[4])
{
    uint64_t q = atomic_load_explicit(&r->seq, memory_order_relaxed);
    uint32_t lo = (uint32_t)q;
    if ((lo & 1) || !atomic_compare_exchange_strong_explicit(&r->seq, &q,
                                                            (q & ~0xffffffffull) | (lo + 1),
                                                            memory_order_acquire,
                                                            memory_order_relaxed))
        return;
    atomic_thread_fence(memory_order_release);
    for (int i = 0; i < 4; i++)
        ST(r->dw[i], d[i]);
    ST(r->value, vw);
    ST(r->tag, tag);
    ST(r->vhash, h);
    /* the new sequence number, and no stamp: no id set is known to hold the new value */
    atomic_store_explicit(&r->seq, (uint32_t)(lo + 2), memory_order_release);
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
    if (n > MEMO_HASHED || n > MML_TRAIL_MAX)      /* memo_check takes at most MEMO_HASHED */
        return;
    union { uint64_t w[4]; int8_t b[32]; } d = {{0, 0, 0, 0}};
    uint64_t a = 0;
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
        a += tr->val[i] * memo_w[i];
    }
    uintptr_t last = n ? tr->val[n - 1] : 0;
    for (; n & 3; n++) {
        /* up to a multiple of 4: copies of the last word (a step of 0) */
        if (j + 1 > MEMO_DELTAS)
            return;
        d.b[j++] = 0;
        a += last * memo_w[n];
    }
    d.b[30] = (int8_t)(uint8_t)(top & 0xff);
    d.b[31] = (int8_t)(uint8_t)(top >> 8);
    /* the hash: memo_len(n) words, the last one repeated (what memo_check reads: the steps
     * after the n-th are 0) */
    for (int i = n; i < (int)memo_len((unsigned)n); i++)
        a += last * memo_w[i];
    /* the same constant added for both lengths (the record's n tells them apart) */
    uint64_t h = memo_sum(MEMO_HASHED, a);
    uint64_t tag = memo_tag0(s, salt, gen);
    if (use_bp)
        tag = memo_tag1(tag, s->bp);
    /* The first set, unless it holds a marker of this start, or two walks of it already
     * (this is the third: the start's walks then go to its second set, and a marker, in
     * place of the two, sends the lookups there) */
    /* racing threads may count one put for two: MEMO_HUGE_AT is a size, not an exact count;
     * before the set is chosen, so that this walk goes to the new table */
    unsigned puts = atomic_load_explicit(&g_memo_puts, memory_order_relaxed);
    if (unlikely(puts < MEMO_HUGE_AT)) {
        atomic_store_explicit(&g_memo_puts, puts + 1, memory_order_relaxed);
        if (puts + 1 == MEMO_HUGE_AT)
            memo_huge();
    }
    struct memo *pref = memo_set0(s->ip, s->sp), *set = memo_ways(pref), *r = NULL, *mine = NULL;
    int same = 0, redir = 0;
    for (unsigned w = 0; w < MEMO_WAYS; w++) {
        if (LD(set[w].tag) != tag)
            continue;
        if (LD(set[w].value) >> MEMO_FL_SHIFT & MEMO_F_REDIR) {
            redir = 1;
        } else {
            same++;
            if (!mine || &set[w] == pref)
                mine = &set[w];
        }
    }
    if (!redir && same >= 2) {
        /* the others emptied: a lookup would check them before it meets the marker */
        static const uint64_t none[4];
        for (unsigned w = 0; w < MEMO_WAYS; w++)
            if (&set[w] != mine && LD(set[w].tag) == tag)
                memo_write(&set[w], 0, 0, 0, none);
        memo_write(mine, tag, 0, (uint64_t)(MEMO_F_REDIR | (use_bp ? MEMO_F_BP : 0))
                                     << MEMO_FL_SHIFT, none);
        redir = 1;
    }
    if (redir) {
        pref = memo_set1(s->ip, s->sp);
        set = memo_ways(pref);
    }
    /* The preferred way if empty, else an empty way; else, at random (the hash), one that
     * holds another start: a way with
     * this start holds another path that reaches the same function at the same depth (the
     * words differ), worth keeping; else any. */
    unsigned start = (unsigned)(mix64(h) >> 17);
    if (!LD(pref->tag))
        r = pref;
    for (unsigned w = 0; w < MEMO_WAYS && !r; w++)
        if (!LD(set[w].tag))
            r = &set[w];
    for (unsigned w = 0; w < MEMO_WAYS && !r; w++)
        if (LD(set[(start + w) % MEMO_WAYS].tag) != tag)
            r = &set[(start + w) % MEMO_WAYS];
    if (!r)
        r = &set[start % MEMO_WAYS];
    unsigned flags = (use_bp ? MEMO_F_BP : 0) | (j != n ? MEMO_F_ESC : 0);
    memo_write(r, tag, h,
               value | (uint64_t)n << MEMO_N_SHIFT | (uint64_t)nframes << MEMO_NF_SHIFT |
                   (uint64_t)flags << MEMO_FL_SHIFT, d.w);
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
