/*
 * tracer/unwind_shared.h: the unwinder's state that its files share (unwind.c, the walk;
 * memo.c, the memo; recent.c and recent.h, a thread's recent walks).  Not part of unwind.h's
 * API.
 */
#ifndef MMLEAK_UNWIND_SHARED_H
#define MMLEAK_UNWIND_SHARED_H

#include <stdatomic.h>
#include <stdint.h>

struct mml_tls {
    uintptr_t lo, hi;       /* the thread's own stack */
    unsigned tries;
    uintptr_t pf_ip, pf_sp; /* the last mml_memo_prefetch: its start and set */
    void *pf_set;
};
extern __thread struct mml_tls U __attribute__((tls_model("initial-exec")));
extern _Atomic int g_unloading;         /* dlclose calls in progress: walks bypass the cache */
extern _Atomic unsigned g_memo_gen;     /* changes at every dlclose */

#endif
