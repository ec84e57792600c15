/*
 * mmleak.h: what the C files of mmleak.so share.  Internal: nothing here is an interface of
 * the library (those are the interposed allocation functions and, for mmleak.py, the
 * functions marked visibility("default") in mmleak-shrink.c and mmleak-inject.c).
 */
#ifndef MMLEAK_H
#define MMLEAK_H

#include <stdatomic.h>
#include <stdint.h>

/* ---- mmleak.c ---- */

/* Grow an array in mmap'ed memory (never the traced allocator's): see mmleak.c. */
void *mml_grow(void *p, size_t *cap, size_t need, size_t unit);

/* ---- mmleak-sites.c: the program's code, or the runtime's / a wrapper's? ---- */

/* Return addresses known to be the program's own code (not the runtime, not a wrapper): a
 * direct-mapped cache the fast path reads with one load.  An entry holds the address itself,
 * so a racing or stale entry can only cause a miss. */
#define MML_DIRECT_SIZE 4096
#define MML_DIRECT_SLOT(a) ((((uintptr_t)(a)) ^ ((uintptr_t)(a) >> 12)) & (MML_DIRECT_SIZE - 1))
extern _Atomic uintptr_t mml_direct[MML_DIRECT_SIZE];

enum { MML_SITE_PROGRAM = 0, MML_SITE_RUNTIME = 1, MML_SITE_WRAPPER = 2, MML_SITE_VOLATILE = 4 };
#define MML_SITE_PASS (MML_SITE_RUNTIME | MML_SITE_WRAPPER)

/* Classify a code address (takes a lock; fills mml_direct for the program's addresses and
 * mml_passing for the others, except in a range an object was unloaded from:
 * MML_SITE_VOLATILE, never cached). */
int mml_site_classify(uintptr_t addr);

/* The other verdicts (runtime, wrapper), cached the same way: an entry is the address with
 * the verdict in its top byte (user-space code addresses are below 2^47). */
extern _Atomic uintptr_t mml_passing[MML_DIRECT_SIZE];
#define MML_PASSING_ADDR(e) ((e) & (((uintptr_t)1 << 56) - 1))

/* Classify a code address: two loads when it was classified before, else the slow way. */
static inline int mml_site_class(uintptr_t a)
{
    if (atomic_load_explicit(&mml_direct[MML_DIRECT_SLOT(a)], memory_order_relaxed) == a)
        return MML_SITE_PROGRAM;
    uintptr_t e = atomic_load_explicit(&mml_passing[MML_DIRECT_SLOT(a)], memory_order_relaxed);
    if (MML_PASSING_ADDR(e) == a && (e >> 56))
        return (int)(e >> 56);
    return mml_site_classify(a);
}
/* Is ADDR in a range an object was unloaded from? */
int mml_site_volatile(uintptr_t addr);
/* Was any object unloaded (mml_sites_unloading) in this process? */
int mml_sites_unloaded(void);
/* An object is about to be unloaded from [lo, hi). */
void mml_sites_unloading(uintptr_t lo, uintptr_t hi);
/* Forget every answer (after dlclose: other code may come at the same addresses). */
void mml_sites_forget(void);
/* In a fork child: the lock may have been held by a thread that does not exist there. */
void mml_sites_after_fork(void);

/* ---- mmleak-got.c: switching a process's GOT slots of malloc & co ---- */

struct mml_hook {
    const char *name;       /* the symbol called */
    void *ours;             /* mmleak's function */
    void *const *real;      /* where the function mmleak calls itself is kept (filled later) */
    int is_free;            /* free, realloc, delete: switched first on, last off */
    int attach_only;        /* only when mmleak.so was loaded into a running process */
};

void mml_got_init(const struct mml_hook *hooks, int n, const void *self_addr, int attached,
                  int (*real_dlclose)(void *));
/* Scan every loaded object and point its slots at mmleak (TRACED) or away; returns the
 * number of slots. */
int mml_got_switch(int traced);
/* Objects loaded since: scan them and give their slots the current state. */
int mml_got_new_objects(void);
/* An object is about to be unloaded from [lo, hi): forget its slots. */
void mml_got_forget_object(uintptr_t lo, uintptr_t hi);
int mml_got_traced(void);
/* The first definition of NAME in the process outside mmleak.so (not a PLT stub). */
void *mml_find_definition(const char *name);

#endif
