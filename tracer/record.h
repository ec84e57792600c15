/*
 * tracer/record.h: the hot path, inline in every interposed entry point.
 *
 * An event is recorded by the calling thread into its own staging half, with no lock, no
 * system call and no allocation: a sequence number from the address's bucket counter, the
 * time from the vDSO, the line's bytes taken at the cursor with one instruction (reserve),
 * written by line.h's fast writers, the newline last.  One unlikely() test sends everything
 * else (no room, our own code running, stacks wanted, an unknown caller, a new epoch, a forked
 * copy, values too wide) to the general path in stacks.c.  Everything here is HOT_INLINE: the
 * compiler sees one function per entry point, as if it were written by hand.
 */
#ifndef MMLEAK_RECORD_H
#define MMLEAK_RECORD_H

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "internal.h"
#include "line.h"
#include "recent.h"

#pragma GCC visibility push(hidden)     /* see internal.h */

/* Room the fast path needs at the cursor: the longest depth-1 line is 12+1+8+1+8+1+8+1+12+1
 * = 53 bytes (the 8-byte stores of the variable-width fields stay inside it), and lines that
 * signal handlers record while we write ours must fit after it without a flush. */
#define FAST_ROOM 256

/* Event order.  A free in thread B and a later malloc in thread C that returns the same
 * address are ordered by the allocator's own synchronisation; an atomic counter taken
 * before the real free and after the real malloc inherits that order.  One counter per
 * bucket of addresses gives every address a total order without one hot shared line:
 * threads working on different memory touch different counters.  Two events of one address
 * whose numbers differ by exactly one are adjacent: nothing happened to that address in
 * between, which is what lets the shrinker cancel them in any grouping of files.
 *
 * Buckets follow the heap: a counter for every 32 bytes of address space (glibc's blocks
 * are at least 32 bytes apart), the table covering 2 MiB, rotated by a hash of the
 * 64 MiB region the address is in (glibc's thread arenas are 64 MiB aligned: without the
 * rotation, threads working in lockstep would share counters).  A free finds its counter
 * beside those of the blocks around it instead of on a random line of a 512 KiB table, and
 * two blocks less than 2 MiB apart in one region never share a counter, so the events of one
 * address stay adjacent more often than with a random hash: a thread's file of
 * bench/pywork.py shrinks on its own to 0.21 % of its events instead of 0.46 %, one of a
 * perl run to 3.3 % instead of 7.9 %.
 * Measured on alloc_bench: 0.5-0.9 ns less per event.  (A coarser grain was faster still but
 * put small neighbouring blocks on one counter: perl's leftovers tripled.) */
#define SEQ_BITS 16
#define SEQ_GRAIN 5
#define SEQ_REGION 26
extern _Atomic uint64_t g_seq[1u << SEQ_BITS] __attribute__((aligned(64)));


/* What the fast path reads besides the thread's own state, in a page of its own mapped with
 * MADV_WIPEONFORK.  A child made by a raw clone() or fork system call skips our atfork
 * handler, and its threads' staging pointers still point into the parent's shared .tail
 * mappings; but it finds this page zeroed, so its first event takes the slow path, which
 * starts the child's own trace.  A vfork() child shares the page with its parent, as it
 * shares all memory: its events are the parent's address space's and go on into the parent
 * thread's file, exactly as if the parent had made them. */
struct hot {
    int fast;        /* tracing: 1 with depth 1 or auto (the one-frame writer below), 2 with
                        stacks (the stack writer, stacks.c); 0 otherwise (the general path) */
    int alive;       /* tracing in this address space; 0 in a freshly forked copy */
    uintptr_t mask;  /* ~0: the caller must be a known program address (mml_direct) */
    unsigned epoch;  /* g_epoch: a thread that has not seen this one takes the slow path */
    int memo;        /* stacks of a fixed depth: the entry points prefetch their memo record */
};
extern struct hot hot_off;          /* before the start, and where WIPEONFORK is missing */
extern struct hot *H;


/* The counter of p's bucket (see g_seq). */
HOT_INLINE _Atomic uint64_t *seq_bucket(const void *p)
{
    uint64_t a = (uintptr_t)p;
    uint64_t rot = ((a >> SEQ_REGION) * 0x9E3779B97F4A7C15ull) >> (64 - SEQ_BITS);
    return &g_seq[((a >> SEQ_GRAIN) + rot) & ((1u << SEQ_BITS) - 1)];
}

HOT_INLINE uint64_t seq_next(const void *p)
{
    return atomic_fetch_add_explicit(seq_bucket(p), 1, memory_order_relaxed);
}

/* Take n bytes at the cursor.  One instruction on x86-64 (xadd without lock: only this
 * thread writes the cursor, but a signal handler may run between any two instructions of
 * it): a handler that records an event of its own gets the bytes after ours, and neither
 * line is cut into the other. */
HOT_INLINE char *reserve(struct tstate *t, size_t n)
{
#if defined(__x86_64__)
    char *d = (char *)n;
    __asm__ volatile("xaddq %0, %1" : "+r"(d), "+m"(t->cur) : : "memory");
    return d;
#else
    char *d = t->cur;
    t->cur = d + n;
    atomic_signal_fence(memory_order_seq_cst);
    return d;
#pragma GCC visibility pop

#endif
}

/* stacks.c: the general path of an event (whatever the writers cannot write), and the stack
 * writer's lookups that rec_stack_ref below does not make inline */
COLD void record_with_stack(void *p, size_t n, const void *ra);
COLD void record_free_slow(void *p, uint64_t s, const void *ra);
#define REF_NO_START 2      /* stack_ref_lookup's rec: the caller's frame is still to be found */
int stack_ref_lookup(struct tstate *t, struct mml_start *st, const void *ra, int rec,
                     struct mml_recent_slot *e1, uint64_t *id);
int stack_ref_stamp(struct tstate *t, const struct mml_memo_hit *h, uint64_t id);

/* The stack writer: every allocation with MMLEAK_DEPTH above 1 (the default) comes here from
 * the entry point, inline in it (no call, no frame of its own), FP the entry point's frame.
 * The common case: the thread's recent walks (recent.h: a comparison per stack word) or the
 * memo (memo.c: a hash of them, in memory shared by all threads) know the walk from the
 * caller's frame, and this thread's file already holds the stack, so the line "PTR SEQ SIZE
 * TIME @ID" is written at the cursor like the fast path's, with no call that can allocate or
 * block.  Inline: the checks of the thread's state, the start (the entry point's return
 * address and frame), a recent walk's hit whose slot is stamped (this file's set of ids was
 * seen to hold its id, and has lost none since), the memo's call, the line; the rest of the
 * lookup is stack_ref_lookup's and stack_ref_stamp's (stacks.c).  The guard is held while the
 * walks, the memo and the file's set of ids are read (a signal handler's allocation in
 * between passes through untraced, as in the general path).  Anything else (a first walk, a
 * stack new to the file, a full half, values too wide...) goes to the general path. */
HOT_INLINE void rec_stack_ref(void *p, size_t n, const void *ra, const void *fp)
{
    struct tstate *t = &T;
    if (unlikely((t->end - t->cur < FAST_ROOM) | t->guard | (t->epoch != H->epoch) |
                 (t->open == 0) | t->dead | t->dropping | (t->ss_n == 0))) {
        record_with_stack(p, n, ra);
        return;
    }
    t->guard++;
    atomic_signal_fence(memory_order_seq_cst);
    /* the caller's frame: the entry point's return address is ra, unless the entry point
     * passed the call on to a function of its own (then stack_ref_lookup finds it) */
    const uintptr_t *e = fp;
    struct mml_start st = { (uintptr_t)ra, (uintptr_t)fp + 16, e[0] };
    uint64_t id;
    struct mml_recent_slot *e1 = NULL;
    int rec = REF_NO_START;
    if (likely(e[1] == (uintptr_t)ra))
        rec = t->recent ? mml_recent_get(t->recent, &st, (unsigned)cfg.depth, &id, &e1) : 0;
    int found;
    if (likely(rec == 1)) {
        found = 1;
        if (unlikely(e1->stamp != t->ss_gen + 1))
            found = stack_ref_lookup(t, &st, ra, rec, e1, &id);
    } else if (rec == 0) {
        /* the memo; its record's stamp: this file's set of ids was seen to hold its id, and
         * has lost none since (else the set is asked, and the record stamped) */
        struct mml_memo_hit h;
        int nf;
        found = mml_memo_get(&st, (unsigned)cfg.depth, &id, &nf, NULL, &h) && nf > 1;
        if (found && unlikely((MML_MEMO_HIT_STAMP(&h) != t->ss_stamp) | !t->ss_stamp))
            found = stack_ref_stamp(t, &h, id);
    } else {
        found = stack_ref_lookup(t, &st, ra, rec, e1, &id);
    }
    atomic_signal_fence(memory_order_seq_cst);
    t->guard--;
    if (unlikely(!found)) {
        record_with_stack(p, n, ra);
        return;
    }
    uint64_t s = seq_next(p);
    uint64_t now = (uint64_t)(time(NULL) - g_t0);
    if (unlikely(((s | n | now) >> 32) | ((uintptr_t)p >> 48))) {
        record_with_stack(p, n, ra);    /* rare: a huge block, a clock jump, a wide address */
        return;
    }
    unsigned ns = ndig((uint32_t)s), nn = ndig((uint32_t)n), nt = ndig((uint32_t)now);
    char *d = reserve(t, REF_LINE_LEN(ns, nn, nt));
    d = put_ref_fields(d, (uintptr_t)p, (uint32_t)s, ns, (uint32_t)n, nn, (uint32_t)now, nt, id);
    atomic_signal_fence(memory_order_release);
    *d = '\n';
}

/* One allocation line: PTR SEQ SIZE TIME CALLER.  The newline is stored last, behind a
 * compiler barrier, so a process killed in the middle leaves a line without newline that
 * readers recognise as torn, never a short line that parses. */
HOT_INLINE void rec_alloc(void *p, size_t n, const void *ra)
{
    struct tstate *t = &T;
    int fast = H->fast;
    if (fast == 2) {
        /* stacks: the stack writer checks the thread's state itself (and needs no known
         * caller: the table of known callers is not read); FP is the frame of the entry
         * point this is inlined in */
        rec_stack_ref(p, n, ra, __builtin_frame_address(0));
        return;
    }
    uintptr_t known = atomic_load_explicit(&mml_direct[MML_DIRECT_SLOT(ra)], memory_order_relaxed);
    if (unlikely((t->end - t->cur < FAST_ROOM) | t->guard | (fast != 1) |
                 (((known ^ (uintptr_t)ra) & H->mask) != 0) | (t->epoch != H->epoch))) {
        record_with_stack(p, n, ra);
        return;
    }
    uint64_t s = seq_next(p);
    uint64_t now = (uint64_t)(time(NULL) - g_t0);
    uintptr_t c = (uintptr_t)ra - 1; /* inside the call instruction: names the calling line */
    if (unlikely(((s | n | now) >> 32) | (((uintptr_t)p | c) >> 48))) {
        record_with_stack(p, n, ra); /* rare: huge block, clock jump, or a wide address */
        return;
    }
    unsigned ns = ndig((uint32_t)s), nn = ndig((uint32_t)n), nt = ndig((uint32_t)now);
    char *d = reserve(t, ALLOC_LINE_LEN(ns, nn, nt));
    d = put_alloc_fields(d, (uintptr_t)p, (uint32_t)s, ns, (uint32_t)n, nn, (uint32_t)now, nt, c);
    atomic_signal_fence(memory_order_release);
    *d = '\n';
}

/* One free line: PTR SEQ CALLER.  The number is taken before the real free runs. */
HOT_INLINE void rec_free(void *p, uint64_t s, const void *ra)
{
    struct tstate *t = &T;
    uintptr_t c = (uintptr_t)ra - 1;
    if (unlikely((t->end - t->cur < FAST_ROOM) | t->guard | (H->alive == 0) |
                 (t->epoch != H->epoch) | (((s >> 32) | (((uintptr_t)p | c) >> 48)) != 0))) {
        record_free_slow(p, s, ra);
        return;
    }
    unsigned ns = ndig((uint32_t)s);
    char *d = reserve(t, FREE_LINE_LEN(ns));
    d = put_free_fields(d, (uintptr_t)p, (uint32_t)s, ns, c);
    atomic_signal_fence(memory_order_release);
    *d = '\n';
}

/* A free takes its number before the real free: after it, another thread may already own the
 * address again. */
HOT_INLINE void note_free(void *p, const void *ra)
{
    rec_free(p, seq_next(p), ra);
}

#pragma GCC visibility pop

#endif
