/* tracer/unwind.h: the stack unwinder of mmleak.so (internal API, x86-64 Linux, glibc >= 2.35).
 *
 * It returns the return addresses of the calling thread's stack, like backtrace(), but caches
 * one compact rule per return address (how to find the caller's frame), so a warm walk costs a
 * few nanoseconds per frame.  The rule of an address is computed once from the object's DWARF
 * CFI (.eh_frame_hdr found with _dl_find_object, then the CIE/FDE program); the cache is shared
 * by all threads, lock-free, and a racing or torn entry can only be a miss.
 *
 * Every function is async-signal-safe and never calls malloc.  A walk never faults: each stack
 * read is checked against the bounds of the stack it walks (see unwind.c for how they
 * are found), and the walk STOPS (it never guesses) at a frame without CFI (JIT code, asm
 * without .cfi directives), at a rule it cannot express (CFA in a register other than rsp/rbp,
 * unknown DWARF expressions), at the outermost frame (_start, clone3: return address
 * undefined) and at a return address of 0.  Signal frames (glibc's __restore_rt) are followed
 * into the interrupted code, as backtrace() does.
 *
 * out[0] is always the start address; out[1..] the return addresses of the callers (raw: the
 * caller subtracts 1 if it wants an address inside the call instruction), except after a
 * signal frame, where the entry is the interrupted pc itself.  The result is the same list as
 * glibc's backtrace() called at the same point (tests/test_unwind.py checks this), except
 * where libgcc finds unwind information this walk does not use: FDEs registered at run time
 * (__register_frame, JIT compilers) and signal trampolines without CFI (libgcc recognises
 * the code of a sigreturn call): this walk stops at such a frame. */
#ifndef MMLEAK_UNWIND_H
#define MMLEAK_UNWIND_H

#include <stdint.h>

/* Walk from a frame state: ip is a return address (a pc just after a call instruction), sp the
 * stack pointer the frame of ip has after that call returned (the CFA of the callee), bp its
 * rbp at that point.  Writes at most max entries to out and returns how many (>= 1 when
 * max >= 1).  In a function compiled with frame pointers (push rbp; mov rsp,rbp), for its
 * caller's frame:
 *     ip = (uintptr_t)__builtin_return_address(0)
 *     sp = (uintptr_t)__builtin_frame_address(0) + 16
 *     bp = *(uintptr_t *)__builtin_frame_address(0)
 * (MML_UNWIND_CALLER below). */
int mml_unwind(uintptr_t ip, uintptr_t sp, uintptr_t bp, uintptr_t *out, int max);

/* The same from an exact pc (the next instruction to run, as in a ucontext after a signal):
 * its rule is looked up at pc itself, not at pc - 1. */
int mml_unwind_exact(uintptr_t pc, uintptr_t sp, uintptr_t bp, uintptr_t *out, int max);

/* Convenience for code compiled with frame pointers (mmleak.so): follows the frame-pointer
 * chain of the calling function and its callers (at most 16 frames, bounds-checked) up to the
 * frame whose return address is ra (the return address of the interposed entry point, i.e.
 * __builtin_return_address(0) there), then walks on from ra as mml_unwind() does.  If no such
 * frame is found, out[0] = ra and it returns 1. */
int mml_unwind_from_ra(const void *ra, uintptr_t *out, int max);

/* ---- memo of whole walks ----
 * A walk is a function of its start (ip, sp, bp), of the rules of the code (fixed until a
 * dlclose) and of the stack words it reads.  A trail lists those words (offset from sp and
 * value); a later walk from the same (ip, sp[, bp]) whose stack still holds the same words
 * would give the same frames, and checking that takes independent loads (no chain of
 * dependent cache lookups, which is what a walk costs).  The memo keeps, per (ip, sp), the
 * trail of the frames a caller used and a 64-bit value of the caller's (stacks.c: the stack
 * id): see mml_memo_get.  A torn or racing record can only be a miss. */

/* Where a walk starts: the frame of the caller of an interposed function. */
struct mml_start { uintptr_t ip, sp, bp; };

/* Find it from the interposed function's return address ra, following the frame-pointer
 * chain of the calling function and its callers (code compiled with frame pointers, as
 * mmleak.so is), at most 16 frames.  0 if not found. */
int mml_unwind_start(const void *ra, struct mml_start *s);

#define MML_TRAIL_MAX 64     /* stack words a remembered walk may have read (the memo keeps
                                walks of up to 32, a thread's recent walks up to 64) */
#define MML_TRAIL_FRAMES 64  /* frames of a walk that may be memoised */
struct mml_trail {
    int n;                              /* words read (more than MML_TRAIL_MAX: not usable) */
    int bad;                            /* not usable: a stack other than the thread's own... */
    int bp_from;                        /* the frame whose step first used the start's bp */
    int walked;                         /* frames the walk returned */
    uint8_t upto[MML_TRAIL_FRAMES + 1]; /* words read when the walk had k frames */
    uint16_t off[MML_TRAIL_MAX];        /* (address - sp) / 8 */
    uintptr_t val[MML_TRAIL_MAX];
};

/* mml_unwind() from s, also filling tr. */
int mml_unwind_trail(const struct mml_start *s, uintptr_t *out, int max, struct mml_trail *tr);

/* The generation of the memo: read it before a walk whose result will be memoised (a dlclose
 * in between makes that record useless). */
unsigned mml_memo_gen(void);
/* A memoised walk from s under salt (the caller's own settings) whose stack words are all
 * still the same: 1, with the caller's value and frame count; and in *words if not NULL,
 * the words checked (for mml_recent_put: n, off, val, walked, bp_from); else in *hit if not
 * NULL, the record found and its stamp (for mml_memo_stamp).  A value has at most
 * MML_MEMO_VALUE_BITS bits (a wider one is not kept). */
#define MML_MEMO_VALUE_BITS 44
struct mml_memo_hit {
    void *rec;
    uint64_t seq;           /* the record's sequence number (low 32 bits) and stamp (high) */
};
#define MML_MEMO_HIT_STAMP(h) ((uint32_t)((h)->seq >> 32))
int mml_memo_get(const struct mml_start *s, unsigned salt, uint64_t *value, int *nframes,
                 struct mml_trail *words, struct mml_memo_hit *hit);
/* Stamp the record of hit with the caller's stamp, a nonzero number that names a set the
 * value belongs to (stacks.c: a thread's set of the stack ids its file holds, while it loses
 * none): a later hit on the record with the same stamp shows it holds the value without
 * asking the set.  Nothing if the record changed since (a new walk kept there, another
 * stamp).  A record written anew has no stamp (0). */
void mml_memo_stamp(const struct mml_memo_hit *hit, uint32_t stamp);

/* ---- the thread's recent walks ----
 * In front of the memo, per thread: the last walks from a few starts, with the stack words
 * themselves (not a hash of them), so that checking one is a comparison per word, with no
 * hashing and no shared cache line.  Owned by the caller (one per thread, mapped when its
 * first stack is recorded, never shared: only its thread reads and writes it, with mmleak's
 * guard held, so a signal handler never meets it half written).  A hit gives what the memo
 * would: the caller's value for the walk from s under salt, its stack words unchanged. */
#define MML_RECENT_SLOTS 16
struct mml_recent_slot {
    uintptr_t ip, sp, bp;
    uint64_t value;
    uint64_t key;               /* the caller's salt << 32 | the memo's generation (a dlclose
                                   makes the slot dead) */
    uint64_t stamp;             /* the caller's: stacks.c marks a slot whose value its current
                                   file already holds */
    uint8_t n, use_bp, misses;  /* n: words, padded to a multiple of 4 with copies of the last */
    uint16_t off[MML_TRAIL_MAX];    /* (address - sp) / 8 */
    uintptr_t val[MML_TRAIL_MAX] __attribute__((aligned(16)));
};
struct mml_recent {
    unsigned tries, hits, skip;     /* a thread whose recent walks seldom hit stops asking */
    struct mml_recent_slot slot[MML_RECENT_SLOTS];
};
/* recent.h, inline: mml_recent_get(r, s, salt, &value, &slot): 1, a hit (and its slot); 0, a
 * miss; -1, a miss, and a memo hit's walk may take the slot (it is empty, or it missed many
 * times in a row). */
/* Keep the walk (trail tr, its first nframes frames) in r; from a memo hit (from_memo: its
 * words from mml_memo_get), only where mml_recent_get said -1. */
void mml_recent_put(struct mml_recent *r, const struct mml_start *s, unsigned salt, unsigned gen,
                    const struct mml_trail *tr, int nframes, uint64_t value, int from_memo);
/* Remember that the first nframes frames of the walk with trail tr gave value. */
void mml_memo_put(const struct mml_start *s, unsigned salt, unsigned gen,
                  const struct mml_trail *tr, int nframes, uint64_t value);

/* Start bringing the memo's records of a walk from (ip, sp) into the cache: an entry point may
 * call it (MML_MEMO_PREFETCH) before it calls the real allocator, so that the lookup after it
 * finds them there. */
void mml_memo_prefetch(uintptr_t ip, uintptr_t sp);
/* In the interposed function itself (its frame is where the walk starts).  Not called while
 * the thread's recent walks serve most lookups (mml_memo_prefetch_off: the flag it would
 * check first, read here without the call). */
extern __thread int mml_memo_prefetch_off __attribute__((tls_model("initial-exec")));
#define MML_MEMO_PREFETCH(ra)                                                                 \
    do {                                                                                      \
        if (!mml_memo_prefetch_off)                                                           \
            mml_memo_prefetch((uintptr_t)(ra), (uintptr_t)__builtin_frame_address(0) + 16);  \
    } while (0)

#define MML_UNWIND_CALLER(out, max)                                                           \
    mml_unwind((uintptr_t)__builtin_return_address(0),                                       \
               (uintptr_t)__builtin_frame_address(0) + 16,                                   \
               *(uintptr_t *)__builtin_frame_address(0), (out), (max))

/* Per thread, optional: learn the calling thread's stack bounds now (else the first walk of the
 * thread does it).  Async-signal-safe, no malloc: a few system calls (sigaltstack, getpid,
 * process_vm_readv; the first call in the process also reads /proc/self/status once, and
 * /proc/self/maps is read instead of process_vm_readv under a seccomp filter), about 5 us.
 * Best called early in the thread's life, on its own stack (the bounds are probed from the
 * current stack pointer up, so a shallow call probes fewer pages).
 *
 * Stack use: a walk that computes a rule or learns bounds needs about 1 KiB of stack below
 * its caller; a walk from the cache, about 200 bytes. */
void mml_unwind_thread_init(void);

/* dlclose: call begin before the real dlclose and end after it returns (also when it fails).
 * Between the two, walks bypass the cache; end empties it, so no rule of an unloaded object
 * survives for another object later mapped at the same address.  Calls may nest and overlap
 * between threads. */
void mml_unwind_dlclose_begin(void);
void mml_unwind_dlclose_end(void);

/* In the child of fork(), from an atfork child handler: if another thread of the parent was
 * inside dlclose (between begin and end: that never ends in the child), forgets it and
 * empties the cache.  Otherwise nothing to do (the child has the parent's mappings). */
void mml_unwind_fork_child(void);

#endif
