/* tools/hold.c: holding the busy threads stopped while one thread makes the calls (see "Holding
 * the busy threads" at the top of tools/inject.c). */
#include "inject.h"

#if defined(__x86_64__) && defined(__linux__)

/* ---- holding the busy threads ---------------------------------------------------------
 * See "Holding the busy threads" at the top.  A held thread is attached and in an interrupt
 * stop (or at our breakpoint, after a run), with nothing to deliver: PTRACE_DETACH lets it
 * go on exactly as before. */

static void held_push(struct inj *c, int tid, int in_sigstop, int unsafe)
{
    if (c->nheld == c->capheld) {
        int cap = c->capheld ? 2 * c->capheld : 64;
        struct held *n = realloc(c->held, cap * sizeof *n);
        if (!n) {
            detach_or_reap(c, tid, 0);
            return;
        }
        c->held = n;
        c->capheld = cap;
    }
    c->held[c->nheld++] = (struct held){tid, in_sigstop, unsafe};
}

static void unhold(struct inj *c, int i)
{
    int tid = c->held[i].tid;
    c->held[i] = c->held[--c->nheld];
    detach_or_reap(c, tid, 0);
}

void unhold_all(struct inj *c)
{
    for (int i = 0; i < c->nheld;) /* the leader last: its end is seen after the others' */
        if (c->held[i].tid != c->pid)
            unhold(c, i);
        else
            i++;
    while (c->nheld)
        unhold(c, c->nheld - 1);
}

/* How many held threads may hold a lock. */
int risky(struct inj *c)
{
    int n = 0;
    for (int i = 0; i < c->nheld; i++)
        n += c->held[i].unsafe > 0;
    return n;
}

/* Let go at most MAX of the held threads that may hold a lock, the likeliest first: how
 * many were. */
int unhold_risky(struct inj *c, int max)
{
    int n = 0;
    for (int risk = 2; risk > 0; risk--)
        for (int i = 0; i < c->nheld && n < max;)
            if (c->held[i].unsafe == risk) {
                unhold(c, i);
                n++;
            } else {
                i++;
            }
    return n;
}

/* Held thread I becomes the thread C holds (c->tid), to run it or to use it. */
void adopt(struct inj *c, int i)
{
    c->tid = c->held[i].tid;
    c->attached = 1;
    c->in_sigstop = c->held[i].in_sigstop;
    c->stuck = c->modified = c->clobbered = c->at_sysexit = c->bp_set = 0;
    c->nrec = 0;
    c->held[i] = c->held[--c->nheld];
}

/* The state letter of thread TID in /proc (R, S, D, t...), or 0. */
char thread_state(struct inj *c, int tid)
{
    char path[96], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", c->pid, tid);
    if (slurp(path, buf, sizeof buf) < 0)
        return 0;
    char *rp = strrchr(buf, ')');
    return rp && rp[1] ? rp[2] : 0;
}

/* Is thread TID running (state R), or waiting in a futex (a lock: its wait is restarted
 * when it is let go, and futex callers take a spurious wake-up anyway)?  Threads asleep in
 * other system calls are left alone: they take no CPU, and some of those calls would end
 * in EINTR. */
static int holdable(struct inj *c, int tid)
{
    char st = thread_state(c, tid);
    if (st == 'R')
        return 1;
    if (st != 'S')
        return 0;
    char path[96], buf[256];
    snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", c->pid, tid);
    return slurp(path, buf, sizeof buf) > 0 && strtol(buf, NULL, 10) == SYS_futex;
}

/* The first stop of TID, just seized and interrupted.  1: held; 0: let go (it stopped for a
 * signal, which it then gets, or for job control, which it re-enters), or gone; 2: its
 * process exits (held, to be reaped); -1: it did not stop (it stays attached to this
 * process until it exits). */
/* wait_tid for a thread of ours other than the borrowed one, or 2 if its process exits
 * meanwhile: a thread killed by the exit does not stop, and the leader's end is not seen
 * while traced threads are not reaped (it is then held, to be reaped with the others). */
static int wait_held(struct inj *c, int tid, int *st, int64_t until)
{
    int w;
    while ((w = wait_tid(c, tid, st, now_ns() + 50000000 < until ? now_ns() + 50000000 : until))
           == 0 && now_ns() < until)
        if (!process_alive(c->pid))
            return 2;
    return w;
}

static int hold_take(struct inj *c, int tid)
{
    int st, w = wait_held(c, tid, &st, hard_until(c));
    if (w == 2)
        return 2;
    if (w == 0)
        return -1;
    if (w < 0)
        return 0;
    int ev = (st >> 16) & 0xff, sig = WSTOPSIG(st);
    if (ev == PTRACE_EVENT_STOP && sig == SIGTRAP)
        return 1;
    detach_or_reap(c, tid, ev ? 0 : sig);
    return 0;
}

/* Stop every running thread of the process (see holdable) but the one C holds: all seized and
 * interrupted first, then their stops taken; again for threads that appeared meanwhile.
 * 0, or a fatal error code (a thread that does not stop). */
int hold_running(struct inj *c)
{
    int *fresh = NULL;
    size_t cap = 0;
    for (int pass = 0; pass < 4 && !c->hold_off; pass++) {
        char path[96];
        snprintf(path, sizeof path, "/proc/%d/task", c->pid);
        DIR *d = opendir(path);
        if (!d)
            break;
        size_t n = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            int tid = atoi(e->d_name);
            if (tid <= 0 || (c->attached && tid == c->tid) || held_index(c, tid) >= 0 ||
                !holdable(c, tid))
                continue;
            if (n == cap) {
                int *nf = realloc(fresh, (cap = cap ? 2 * cap : 64) * sizeof *nf);
                if (!nf)
                    break;
                fresh = nf;
            }
            if (ptrace(PTRACE_SEIZE, tid, 0, (void *)(long)PTRACE_O_TRACESYSGOOD) < 0) {
                if (errno != ESRCH)
                    c->hold_off = 1; /* not permitted: the borrowed thread will say why */
                continue;
            }
            ptrace(PTRACE_INTERRUPT, tid, 0, 0); /* if it fails, it exits: reaped below */
            fresh[n++] = tid;
        }
        closedir(d);
        if (!n)
            break;
        int stuck_tid = 0;
        for (size_t i = 0; i < n; i++) {
            int h = hold_take(c, fresh[i]);
            if (h < 0 && !stuck_tid)
                stuck_tid = fresh[i];
            if (h > 0) /* (2: not stopped, only to be reaped) */
                held_push(c, fresh[i], 0, 1);
            if (h == 2)
                c->hold_off = 1;
        }
        if (stuck_tid) {
            free(fresh);
            c->stuck = 1;
            return fail(c, MMLEAK_INJ_ESYS,
                        "thread %d of %d did not stop when asked to (uninterruptible sleep?): it "
                        "stays attached to this process until it exits", stuck_tid, c->pid);
        }
    }
    free(fresh);
    return 0;
}

/* How likely a held thread, stopped where R says it is, holds a lock our calls may need:
 * 0 not (user code of the program, or a system call it made itself), 1 maybe (inside libc,
 * ld.so or an allocator: malloc's arena locks, the loader's; in a system call malloc or the
 * loader make, or made from inside those libraries: malloc waits for one arena's lock
 * holding another's), 2 likely (a frame of LIB on its stack: LIB's own locks, a detach
 * waiting for the threads inside it). */
static int held_risk(struct inj *c, const struct user_regs_struct *r)
{
    int movable;
    if (c->nlibx && (in_ranges(c->libx, c->nlibx, r->rip) || stack_return(c, r->rsp, SR_LIB)))
        return 2;
    if (unsafe_here(c, r, &movable))
        return 1;
    const struct mapent *m = (long)r->orig_rax < 0 ? map_at(c, r->rip) : NULL;
    if ((long)r->orig_rax < 0 && m && strcmp(m->path, "[vdso]"))
        return 0;
    uint64_t ra = stack_return(c, r->rsp, SR_ANY);
    return ra && in_ranges(c->unsafe, c->nunsafe, ra);
}

/* Start held thread TID (stopped at R) running to the return of the library call it is in,
 * with a hardware breakpoint there (as run_to_caller).  0: running; -1: not possible. */
static int run_out(struct inj *c, int tid, const struct user_regs_struct *r)
{
    uint64_t blocked = ~0ULL, ra;
    errno = 0;
    ptrace(PTRACE_GETSIGMASK, tid, (void *)sizeof blocked, &blocked);
    if (((blocked | c->ignored) & (1ULL << (SIGTRAP - 1))) || !(ra = caller_address(c, r->rsp)) ||
        ptrace(PTRACE_PEEKUSER, tid, DR_OFF(7), 0) != 0 || errno ||
        ptrace(PTRACE_POKEUSER, tid, DR_OFF(0), (void *)ra) < 0)
        return -1;
    if (ptrace(PTRACE_POKEUSER, tid, DR_OFF(7), (void *)1L) < 0 ||
        ptrace(PTRACE_CONT, tid, 0, 0) < 0) {
        ptrace(PTRACE_POKEUSER, tid, DR_OFF(7), 0);
        ptrace(PTRACE_POKEUSER, tid, DR_OFF(0), 0);
        return -1;
    }
    return 0;
}

/* Take the stop of TID, started by run_out, by SOFT (else interrupted), and hold it again:
 * as safe if it got there.  0; or it is let go (it stopped for a signal, which it then gets,
 * or for job control), or gone; -1: it did not stop. */
static int run_out_end(struct inj *c, int tid, int64_t soft)
{
    int st, interrupted = 0;
    for (;;) {
        int w = wait_held(c, tid, &st, interrupted ? hard_until(c) : soft);
        if (w == 2) {
            held_push(c, tid, 0, 1); /* to be reaped */
            c->hold_off = 1;
            return 0;
        }
        if (w == 0 && !interrupted) {
            interrupted = 1;
            ptrace(PTRACE_INTERRUPT, tid, 0, 0); /* if it fails, it exits: seen above */
            continue;
        }
        if (w <= 0)
            return w == 0 ? -1 : 0;
        int ev = (st >> 16) & 0xff, sig = WSTOPSIG(st);
        if (ev == PTRACE_EVENT_STOP && sig == SIGTRAP && trap_pending(c, tid)) {
            /* it reached the breakpoint just as it was interrupted: take that stop */
            if (ptrace(PTRACE_CONT, tid, 0, 0) < 0)
                return 0;
            continue;
        }
        siginfo_t si;
        int bp = !ev && sig == SIGTRAP && ptrace(PTRACE_GETSIGINFO, tid, 0, &si) == 0 &&
                 si.si_code == TRAP_HWBKPT;
        struct user_regs_struct r;
        ptrace(PTRACE_POKEUSER, tid, DR_OFF(7), 0);
        ptrace(PTRACE_POKEUSER, tid, DR_OFF(0), 0);
        if (bp || (ev == PTRACE_EVENT_STOP && sig == SIGTRAP)) {
            held_push(c, tid, bp, ptrace(PTRACE_GETREGS, tid, 0, &r) < 0 ? 1 : held_risk(c, &r));
            return 0;
        }
        detach_or_reap(c, tid, ev ? 0 : sig);
        return 0;
    }
}

/* The held threads that are not safe where they stopped are run, SETTLE_BATCH at a time
 * while the others stay stopped, to the return of the library call they are in (at most
 * SETTLE_RUN_NS per batch, SETTLE_NS in all); those that stop for anything else (a signal,
 * which they then get; job control) are let go.  The others stay held, safe or not (if our
 * call then waits, see call).  Any thread that owns a loader's lock is let go.  0, or a
 * fatal error code. */
int settle_held(struct inj *c)
{
    int64_t until = now_ns() + SETTLE_NS;
    int *todo = malloc((c->nheld + 1) * sizeof *todo), ntodo = 0, stuck_tid = 0;
    if (!todo)
        return 0;
    for (int i = 0; i < c->nheld;) {
        struct user_regs_struct r;
        if (ptrace(PTRACE_GETREGS, c->held[i].tid, 0, &r) < 0) {
            unhold(c, i);
            continue;
        }
        c->held[i].unsafe = held_risk(c, &r);
        i++;
    }
    for (int risk = 2; risk > 0; risk--) /* the likeliest first */
        for (int i = 0; i < c->nheld; i++)
            if (c->held[i].unsafe == risk)
                todo[ntodo++] = c->held[i].tid;
    for (int k = 0; k < ntodo && now_ns() < until && !stuck_tid;) {
        int batch[SETTLE_BATCH], n = 0;
        for (; k < ntodo && n < SETTLE_BATCH; k++) {
            int i = held_index(c, todo[k]);
            struct user_regs_struct r;
            if (i >= 0 && ptrace(PTRACE_GETREGS, todo[k], 0, &r) == 0 &&
                run_out(c, todo[k], &r) == 0) {
                c->held[i] = c->held[--c->nheld];
                batch[n++] = todo[k];
            }
        }
        int64_t soft = now_ns() + SETTLE_RUN_NS;
        for (int j = 0; j < n; j++)
            if (run_out_end(c, batch[j], soft) < 0 && !stuck_tid)
                stuck_tid = batch[j];
    }
    free(todo);
    if (stuck_tid) {
        c->stuck = 1;
        return fail(c, MMLEAK_INJ_ESYS,
                    "thread %d of %d did not stop when asked to (uninterruptible sleep?): it "
                    "stays attached to this process until it exits", stuck_tid, c->pid);
    }
    for (int owner; (owner = loader_lock_owner(c, 0)) && held_index(c, owner) >= 0;)
        unhold(c, held_index(c, owner));
    return 0;
}

#endif
