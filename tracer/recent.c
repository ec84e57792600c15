/*
 * tracer/recent.c: a thread's recent walks (API in unwind.h), in front of the memo of
 * unwind.c: the stack words a walk read are kept and compared, so a hit needs no hash and a
 * deep whole stack is remembered.  Split from unwind.c, which stays usable alone (the tests
 * and the bench link it without this file).
 */
#include "recent.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

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
    e->stamp = 0;
    atomic_signal_fence(memory_order_seq_cst);
    e->n = (uint8_t)i;
}

#undef LD
#undef ST
