/*
 * tracer/stacks.c: the frames of an allocation, their stack id, the set of ids a file already
 * holds, and the general path of an event: whatever the fast path (record.h) cannot write.
 * With MMLEAK_DEPTH above 1, and with auto past the runtime and the wrappers, that is every
 * allocation's path; it writes with line.h's writers, like the fast path.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "record.h"
#include "recent.h"
#include "unwind.h"

/* The general paths' first step, before the guard: whether to record at all (not our own
 * code's allocations, not in a disabled or paused trace).  0: go on. */
static int record_enter(struct tstate *t)
{
    if (IN_OWN_CODE(t)) {
        if (g_probe_t == t)
            g_probe_hit = 1;
        return -1;
    }
    if (g_state < 0)
        return -1;
    if (t->trace_gen != g_trace_gen)
        thread_reset(t);
    if (g_state == 2) {          /* paused: the slots point elsewhere; a stored pointer */
        t->epoch = H->epoch;     /* to our function still comes here: let it pass */
        return -1;
    }
    return 0;
}

/* The next step, with the guard held: the trace started, and this address space's own (a copy
 * made by a raw clone()/fork syscall starts its own: see struct hot).  0: go on. */
HOT_INLINE int record_ready(void)
{
    if (g_state == 0)
        global_init();
    if (g_state < 0)
        return -1;
    if (unlikely(!H->alive))
        fork_child();
    return 0;
}

/* Both steps, in the general path's own scope (the guard is let go when it returns): the
 * thread's state in T_, or return. */
#define RECORD_BEGIN(T_)                                                                      \
    struct tstate *T_ = &T;                                                                   \
    if (record_enter(T_))                                                                     \
        return;                                                                               \
    GUARDED;                                                                                  \
    if (record_ready())                                                                       \
        return

/* ---- stacks ----
 * An allocation whose stack has more than one frame is written as "PTR SEQ SIZE TIME @ID",
 * and its stack once per file as "#s ID FRAME...": ID is a 44-bit hash of the frames
 * (STACK_ID_BITS: "@ID" is then as long as the caller's address it replaces), the same in
 * every file and process, so readers can merge any files.  Two distinct stacks share an id
 * with a chance of about N^2 / 2^45 among N stacks (3 in 10,000 for 100,000 stacks).  Each thread keeps the set
 * of ids its current file already holds (it moves with the file when a new thread continues
 * a parked one, and is emptied when the file ends). */

/* Each frame is mixed with its index on its own and the results summed: the frames' terms do
 * not wait for each other (a chained hash costs 5 cycles a frame), and the frames' order
 * still matters.  The sum is then mixed (murmur3's finaliser).  A term must not be linear in
 * its frame: a sum of frame times a weight linear in the index is the same for two stacks
 * whose frames differ by +d -d -d +d at four consecutive places, whatever d, and a recursion
 * through two call sites of one function (X Y Y X against Y X X Y) makes exactly that
 * (python3 -m http.server: two such pairs a run; tests/stack_collide.c); the xor-shift after
 * the multiplication folds the high bits of the product into the low ones. */
_Static_assert(STACK_ID_BITS <= MML_MEMO_VALUE_BITS, "the memo keeps a stack's id");
static uint64_t stack_id(const uintptr_t *f, int n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
    for (int i = 0; i < n; i++) {
        uint64_t x = (f[i] ^ ((uint64_t)i << 52)) * 0xff51afd7ed558ccdull;
        h += (x ^ x >> 29) * (0xc4ceb9fe1a85ec53ull + 2 * (uint64_t)i);
    }
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h >>= 64 - STACK_ID_BITS;
    return h ? h : 1;
}

static int sset_has(const struct tstate *t, uint64_t id)
{
    if (!t->ss_cap)
        return 0;
    for (size_t i = id & (t->ss_cap - 1);; i = (i + 1) & (t->ss_cap - 1)) {
        if (t->ss[i] == id)
            return 1;
        if (!t->ss[i])
            return 0;
    }
}

static void sset_add(struct tstate *t, uint64_t id)
{
    if (2 * (t->ss_n + 1) > t->ss_cap) {
        size_t ncap = t->ss_cap ? 2 * t->ss_cap : 1024;
        uint64_t *a = mml_map(ncap * sizeof *a);
        if (!a)
            return;     /* the stack is written again next time: more bytes, still exact */
        for (size_t i = 0; i < t->ss_cap; i++)
            if (t->ss[i])
                for (size_t j = t->ss[i] & (ncap - 1);; j = (j + 1) & (ncap - 1))
                    if (!a[j]) {
                        a[j] = t->ss[i];
                        break;
                    }
        if (t->ss)
            mml_unmap(t->ss, t->ss_cap * sizeof *t->ss);
        t->ss = a;
        t->ss_cap = ncap;
    }
    for (size_t i = id & (t->ss_cap - 1);; i = (i + 1) & (t->ss_cap - 1))
        if (!t->ss[i]) {
            t->ss[i] = id;
            t->ss_n++;
            return;
        }
}

/* The thread is gone: its recent walks too. */
void recent_free(struct tstate *t)
{
    struct mml_recent *r = t->recent;
    t->recent = NULL;       /* before the unmap: a signal handler's event may look */
    atomic_signal_fence(memory_order_seq_cst);
    if (r)
        mml_unmap(r, sizeof *r);
}

void sset_free(struct tstate *t)
{
    if (t->ss)
        mml_unmap(t->ss, t->ss_cap * sizeof *t->ss);
    t->ss = NULL;
    t->ss_cap = t->ss_n = 0;
    sset_lost(t);
}

/* The file ended: none of its stacks is in the next one. */
void sset_clear(struct tstate *t)
{
    if (t->ss_n)
        memset(t->ss, 0, t->ss_cap * sizeof *t->ss);
    t->ss_n = 0;
    sset_lost(t);
}

/* The frames of an allocation: f[0] the caller's return address, then its callers'.
 * MMLEAK_DEPTH=N: N frames.  Auto: through the runtime and the wrappers to the program's
 * first frame, and AUTO_CONTEXT more of its callers. */
#define AUTO_CONTEXT 4

/* A frame in a range an object was unloaded from carries the epoch in its top 16 bits: the
 * readers then take the object that was mapped there in that epoch (mmleak.ID.loads). */
static uintptr_t tagged(uintptr_t a, int cls)
{
    return cls & MML_SITE_VOLATILE ? a | (uintptr_t)(H->epoch & 0xffff) << 48 : a;
}

/* The frames f[1..] of an allocation from the walk bt[0..k-1] (bt[0] == f[0]'s address):
 * all of them for MMLEAK_DEPTH=N (want), else up to the program's first frame and
 * AUTO_CONTEXT more.  A frame is classified only when the answer matters: in auto mode until
 * the program's first frame, and, once something was unloaded, for its epoch tag.  *more: in
 * auto mode, the walk ended before it could tell (k frames were all it was asked for). */
static int pick_frames(const uintptr_t *bt, int k, uintptr_t *f, int want, int max, int *more)
{
    int n = 1, program_at = -1;
    int tag = mml_sites_unloaded();     /* not the epoch: attach and detach move it too */
    *more = 0;
    for (int j = 1; j < k && n < max; j++) {
        f[n] = (uintptr_t)bt[j];
        if (!tag && (want != 0 || program_at >= 0)) {
            n++;
            if (want == 0 && n > program_at + AUTO_CONTEXT)
                return n;
            continue;
        }
        int c = mml_site_class(f[n]);
        f[n] = tagged(f[n], c);
        if (want == 0 && program_at < 0 && !(c & MML_SITE_PASS))
            program_at = n;
        n++;
        if (want == 0 && program_at >= 0 && n > program_at + AUTO_CONTEXT)
            return n;
    }
    *more = want == 0 && k == max;
    return n;
}

/* The frames of an allocation in f (f[0] the caller's return address, then its callers'),
 * their count, and *id, the stack's id (0 for one frame).  MEMO: a walk whose stack words
 * are all as they were when the same walk was made before is not made again (unwind.h:
 * the memo): then the count and the id come from the memo and *filled is 0 (f[1..] not
 * written). */
#define AUTO_FIRST 8    /* auto: frames walked first (the program's frame is usually there) */
static int capture(const void *ra, uintptr_t *f, uint64_t *id, int memo, int *filled,
                   struct mml_recent *recent)
{
    f[0] = (uintptr_t)ra;
    *id = 0;
    *filled = 1;
    int want = cfg.depth;
    int cls = want == 0 || mml_sites_unloaded() ? mml_site_class((uintptr_t)ra)
                                                : MML_SITE_PROGRAM;
    f[0] = tagged(f[0], cls);
    if (want == 1)
        return 1;
    if (want == 0 && !(cls & MML_SITE_PASS))
        return 1;
    /* unwind.c: the frame-pointer chain of our own frames up to ra, then the cached
     * CFI rules of the program's frames (bt[0] == ra) */
    struct mml_start st;
    if (!mml_unwind_start(ra, &st))
        return 1;
    int nf;
    if (memo && mml_memo_get(&st, (unsigned)want, id, &nf, NULL, NULL)) {
        *filled = 0;
        return nf;
    }
    T.walks++;          /* the file's "#walks": what the memo and recent walks did not save */
    unsigned gen = mml_memo_gen();
    uintptr_t bt[MMLEAK_MAX_DEPTH];
    struct mml_trail tr;
    int max = want ? want : AUTO_FIRST, more;
    int k = mml_unwind_trail(&st, bt, max, &tr);
    nf = pick_frames(bt, k, f, want, max, &more);
    if (more) {                 /* auto: the program's frame is further up */
        k = mml_unwind_trail(&st, bt, MMLEAK_MAX_DEPTH, &tr);
        nf = pick_frames(bt, k, f, want, MMLEAK_MAX_DEPTH, &more);
    }
    if (nf > 1) {
        *id = stack_id(f, nf);
        mml_memo_put(&st, (unsigned)want, gen, &tr, nf, *id);
        if (recent)
            mml_recent_put(recent, &st, (unsigned)want, gen, &tr, nf, *id, 0);
    }
    return nf;
}

/* Stamp the memo record of hit h with this thread's set of ids (which holds its id): the
 * set's stamp is taken at the first use since the set last lost ids.  Stamps are 32 bits:
 * when the numbers come round to 0, the memo's generation moves on (every record then dies,
 * and with them the stamps of sets long gone that the new numbers could repeat). */
static _Atomic uint64_t g_ss_stamps;
static __attribute__((noinline)) void memo_stamp(struct tstate *t, const struct mml_memo_hit *h)
{
    if (!t->ss_stamp) {
        uint64_t k = atomic_fetch_add_explicit(&g_ss_stamps, 1, memory_order_relaxed) + 1;
        if (!(uint32_t)k) {
            atomic_fetch_add_explicit(&g_memo_gen, 1, memory_order_seq_cst);
            return;     /* this record is dead now; the next stamp is not 0 */
        }
        t->ss_stamp = (uint32_t)k;
    }
    mml_memo_stamp(h, t->ss_stamp);
}

/* The stack writer's memo lookup when the thread's recent walks may take the walk found: the
 * words are copied out of the stack (out of line: the general path does not carry them). */
static __attribute__((noinline)) int memo_to_recent(struct tstate *t, const struct mml_start *st,
                                                    unsigned salt, uint64_t *id)
{
    struct mml_trail w;
    unsigned gen = mml_memo_gen();
    int nf;
    if (!mml_memo_get(st, salt, id, &nf, &w, NULL) || nf < 2 || !sset_has(t, *id))
        return 0;
    mml_recent_put(t->recent, st, salt, gen, &w, nf, *id, 1);
    return 1;
}

/* The stack writer's lookup where rec_stack_ref (record.h) could not answer inline, the guard
 * held: rec is mml_recent_get's answer (1 with its slot e1, whose stamp is not this set's; 0;
 * -1), or REF_NO_START when the caller's frame is still to be found (the entry point passed
 * the call on to a function of its own: the frame-pointer chain finds it).  1 with the
 * stack's id in *id when this thread's file holds it. */
int stack_ref_lookup(struct tstate *t, struct mml_start *st, const void *ra, int rec,
                     struct mml_recent_slot *e1, uint64_t *id)
{
    unsigned salt = (unsigned)cfg.depth;
    if (rec == REF_NO_START) {
        if (!mml_unwind_start(ra, st))
            return 0;
        rec = t->recent ? mml_recent_get(t->recent, st, salt, id, &e1) : 0;
    }
    if (rec > 0) {
        /* the slot's stamp: this file's set of ids was seen to hold its id, and has lost
         * none since */
        if (e1->stamp == t->ss_gen + 1)
            return 1;
        if (!sset_has(t, *id))
            return 0;
        e1->stamp = t->ss_gen + 1;
        return 1;
    }
    if (rec < 0)        /* a memo hit may take the recent slot */
        return memo_to_recent(t, st, salt, id);
    /* the memo, as rec_stack_ref asks it */
    struct mml_memo_hit h;
    int nf;
    if (!mml_memo_get(st, salt, id, &nf, NULL, &h) || nf < 2)
        return 0;
    if (MML_MEMO_HIT_STAMP(&h) != t->ss_stamp || !t->ss_stamp)
        return stack_ref_stamp(t, &h, *id);
    return 1;
}

/* A memo hit h whose record's stamp is not this thread's set's: 1 if the set holds id (the
 * record is then stamped with the set's number). */
int stack_ref_stamp(struct tstate *t, const struct mml_memo_hit *h, uint64_t id)
{
    if (!sset_has(t, id))
        return 0;
    memo_stamp(t, h);
    return 1;
}

/* An allocation the writers did not write: with its stack (MMLEAK_DEPTH above 1, or auto
 * past the runtime and the wrappers: then every allocation comes here), a thread's first
 * event, a full half, our own code, a new epoch, a forked copy, a value too wide.  COLD keeps
 * its call out of the entry points' hot code; with stacks, the common case here is a stack the
 * file already holds, written at the cursor with line.h's fast writers like the fast path. */
COLD void record_with_stack(void *p, size_t n, const void *ra)
{
    RECORD_BEGIN(t);
    if (t->guard & GUARD_NEW)
        ra = new_caller(t, ra);
    uint64_t s = seq_next(p);
    time_t now = time(NULL) - g_t0;
    uintptr_t f[MMLEAK_MAX_DEPTH];
    uint64_t id;
    int filled;
    if (cfg.depth > 1 && !t->recent && !t->dead)
        t->recent = mml_map(sizeof *t->recent);     /* NULL: the memo alone serves */
    struct mml_recent *rc = cfg.depth > 1 ? t->recent : NULL;
    int nf = capture(ra, f, &id, 1, &filled, rc);
    int def = nf > 1 && (!t->open || !sset_has(t, id));
    if (def && !filled)         /* the memo gave the id, the frames are needed now */
        nf = capture(ra, f, &id, 0, &filled, rc);
    if (nf > 1 && !def && !(t->dead | t->dropping) && t->end - t->cur >= FAST_ROOM &&
        !((s | n | (uint64_t)now) >> 32) && !((uintptr_t)p >> 48) && now >= 0) {
        /* the common case with stacks: a stack this file holds, written like the fast path */
        unsigned ns = ndig((uint32_t)s), nn = ndig((uint32_t)n), nt = ndig((uint32_t)now);
        char *d = reserve(t, REF_LINE_LEN(ns, nn, nt));
        d = put_ref_fields(d, (uintptr_t)p, (uint32_t)s, ns, (uint32_t)n, nn, (uint32_t)now, nt,
                           id);
        atomic_signal_fence(memory_order_release);
        *d = '\n';
        t->epoch = H->epoch;
        return;
    }
    /* "#s ID FRAME..." when this file does not hold the stack yet, then the event line */
    char line[STACK_LINES_MAX], *d = line;
    if (def) {
        d = put_stack_def(d, id, f, nf);
        *d++ = '\n';
    }
    d = put_alloc_line(d, (uintptr_t)p, s, n, now < 0 ? 0 : (uint64_t)now, f[0] - 1,
                       nf > 1 ? id : 0);
    *d++ = '\n';
    t->epoch = H->epoch;
    unsigned fileno = t->fileno;
    int was_open = t->open;
    if (emit(line, (size_t)(d - line)) && def && was_open && t->open && t->fileno == fileno)
        sset_add(t, id);
}

/* A free the fast path did not write: a thread's first event, a full half, our own code, a
 * new epoch, a forked copy, a value too wide. */
COLD void record_free_slow(void *p, uint64_t s, const void *ra)
{
    struct tstate *t0 = &T;
    if (unlikely((t0->guard & GUARD_FREES) && (t0->guard & GUARD_NEST) == 1)) {
        /* freed by glibc in a call of ours, but the program's block (scan_at_exit's dlsym
         * frees the text of the program's last failed dl call): recorded as the program's */
        t0->guard = t0->guard - 1 - GUARD_FREES;
        record_free_slow(p, s, ra);
        t0->guard = t0->guard + 1 + GUARD_FREES;
        return;
    }
    RECORD_BEGIN(t);
    char line[64], *d = put_free_line(line, (uintptr_t)p, s, (uintptr_t)ra - 1);
    *d++ = '\n';
    t->epoch = H->epoch;
    emit_free(line, (size_t)(d - line));
}
