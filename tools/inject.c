/* tools/inject.c: make a running process load a shared library and call a function in it,
 * with ptrace, stopping only its busy threads and only meanwhile (x86-64 Linux, glibc
 * targets).  Built into
 * mmleak-tools.so, which mmleak.py loads with ctypes (mmleaklib/native.py) for
 * `mmleak.py attach PID` / `detach PID`; mmleak.so holds no part of it.
 *
 * API
 * ---
 *   int mmleak_inject_call(int pid, const char *lib, const char *func, const char *arg,
 *                          int timeout_ms, long *result, char *err, size_t errlen);
 *   int mmleak_inject_call_within(int pid, const char *lib, const char *func,
 *                                 const char *arg, int search_ms, int total_ms,
 *                                 long *result, char *err, size_t errlen);
 *   int mmleak_inject_abi(void);                                  (returns 1)
 *
 * In process PID: h = dlopen(LIB, RTLD_NOW) (LIB: absolute path; a library already loaded
 * is not loaded again, dlopen only counts one more reference), then, if FUNC is not NULL,
 * f = dlsym(h, FUNC) and *result = f(ARG) (ARG: a string copied into the target, or NULL).
 * *result is the whole of rax when f returns: for a function returning int, keep its low
 * 32 bits (ctypes: c_int(result).value).  With FUNC NULL, *result is the handle.
 * mmleak_inject_call: TIMEOUT_MS <= 0 means 10000.  Finding a safe moment, then the calls,
 * each get that time (so at most twice that in all).  mmleak_inject_call_within: one
 * deadline, TOTAL_MS (<= 0: 10000) from the start, for all of it; finding a safe moment ends
 * by SEARCH_MS (<= 0: three quarters of TOTAL_MS), the calls get the rest (what mmleak.py
 * uses: its --timeout bounds the whole command).  See "Limits" for the one wait that can
 * take longer.
 * Returns 0, or one of the negative codes below with one line in ERR (no newline):
 *   -1 MMLEAK_INJ_EINVAL  bad arguments (LIB not absolute, PID is a thread or ourselves...)
 *   -2 MMLEAK_INJ_ESRCH   no such process, or it exited (also during the operation)
 *   -3 MMLEAK_INJ_EPERM   not permitted: another user, not dumpable, yama ptrace_scope,
 *                         already traced by another process (gdb, strace...)
 *   -4 MMLEAK_INJ_EUNSUPP cannot be done in that process: statically linked, no glibc
 *                         (musl), no dlopen, 32-bit, shadow stacks, a seccomp filter (or
 *                         strict mode) that does not allow what dlopen and mmleak do
 *   -5 MMLEAK_INJ_EBUSY   no safe moment before the timeout: the process is stopped
 *                         (job control), a thread holds the loader's lock, no thread safe
 *   -6 MMLEAK_INJ_ELOAD   dlopen or dlsym failed in the target: ERR has its dlerror()
 *   -7 MMLEAK_INJ_ECALL   a call crashed or did not return in time: it was abandoned and
 *                         the thread put back where it was, but the process may now hold
 *                         locks the call took (the only failure that can leave a trace)
 *   -8 MMLEAK_INJ_ESYS    unexpected failure of the injector itself (ptrace, /proc)
 * In every failure but -7 the target is left as it was: registers (general, FPU/SSE/AVX),
 * signal mask, dispositions, pending signals, interrupted system call.
 *
 * How
 * ---
 * Symbols come from the target's memory, not from files: the dynamic symbol tables (GNU or
 * SysV hash) of its libc.so.6 (dlopen, dlsym, dlerror: glibc 2.34+; libdl.so.2 before) and
 * of its ld.so (_rtld_global), located by /proc/PID/maps.  What runs is what is mapped, so
 * no build-id or inode comparison is needed, and a library replaced on disk, or a process
 * in a container, does not matter.
 *
 * ONE thread is hijacked: PTRACE_SEIZE + PTRACE_INTERRUPT (no SIGSTOP is sent, so no job
 * control stop can be left behind).  The busy threads are held stopped meanwhile (see
 * "Holding the busy threads" below): otherwise the hijacked thread gets 1/N of the CPU beside
 * N busy ones, and every stop and resume waits for its turn (a call took minutes beside 300
 * busy threads; a thread under SCHED_IDLE never got it).  A call is made by setting rip = function, rdi/rsi = arguments, rsp below
 * the red zone (128 bytes) of the thread's stack, 16-byte aligned at the call, where the
 * strings were written, with a return address of 0 (the return faults: SIGSEGV at rip 0,
 * seen as a signal-delivery-stop and never delivered) and orig_rax = -1 (so the kernel does
 * not "restart" anything on the way back to user space).  Afterwards the original registers
 * (orig_rax included) and extended state are put back: a system call the thread was in is
 * then restarted or ends with EINTR exactly as after a signal handler (read, nanosleep,
 * futex, poll... restart; epoll_wait, semop, sigtimedwait return EINTR, as under gdb or
 * strace).  If SIGSEGV is blocked in that thread or ignored by the process (a forced fault
 * would reset its disposition), the return address is an 0xCC byte of libc's code instead
 * (SIGTRAP); if both are (a daemon that blocks every signal and takes them with sigwait or
 * signalfd), it is a `syscall` instruction of libc's, and the thread runs under
 * PTRACE_SYSCALL: the entry of that system call is the return (its number is the result),
 * turned into a getpid whose exit stop is where the thread is put back (an interrupted
 * system call is then restarted by hand, as the kernel would: no signal goes to user
 * space there).  See call_return_by_syscall.
 *
 * Signals: during the calls, the thread blocks every signal but SIGSEGV and SIGTRAP (those
 * two as it had them): the others wait in the kernel's queues meanwhile, with their siginfo
 * and order, and a stream of them cannot starve the calls (each would stop the thread before
 * it ran an instruction: a sender in a loop left dlopen no time at all); its mask is put
 * back before it is let go.  A signal that reaches the thread while we hold it otherwise
 * (signal-delivery-stop: before the calls, or SIGSEGV/SIGTRAP sent during them) is recorded
 * and not delivered then (however many: see record); at the end the first one is delivered by PTRACE_DETACH with its own siginfo,
 * the others, in the order they came, are queued again to the thread (rt_tgsigqueueinfo with
 * their siginfo when the kernel allows it, that is for sigqueue-like codes; tgkill
 * otherwise).  Standard signals recorded twice count once (the
 * kernel merges them the same way).  A fault (SIGSEGV, SIGBUS... from the kernel) that the
 * thread takes before the call is delivered at once and the thread let go.
 *
 * Which thread (the rule)
 * -----------------------
 * dlopen takes the loader's lock and calls malloc; it must not run on a thread that is
 * inside malloc (an arena lock held: it would wait for itself) or inside the loader.  So:
 *  1. Threads are tried by rank, and within a rank the main thread first, then by thread
 *     id: (0) sleeping in a system call that restarts transparently (nanosleep, read, poll,
 *     futex, accept, wait4...); (1) sleeping in one that returns EINTR when interrupted
 *     (epoll_wait, epoll_pwait, semop, sigtimedwait, msgrcv, io_getevents); (2) running, or
 *     sleeping outside a system call (page fault).  Never used: threads in D state (they
 *     may not stop), stopped, zombies; threads in mmap, munmap, mremap, mprotect, madvise,
 *     brk (malloc may hold an arena lock around these), clone, fork, vfork, execve, exit.
 *  2. Once stopped, the thread is used only if: (a) it stopped in a system call that is not
 *     in that list, issued from outside ld.so; or it stopped in user code that is not in
 *     libc.so.6, ld.so, libdl/libpthread, LIB itself, or an allocator library (a name with
 *     "malloc" or "hoard": jemalloc, tcmalloc, mimalloc...); (b) it owns none of the
 *     loader's recursive locks (their owner fields in _rtld_global: dlopen, dlclose, a
 *     library constructor, dl_iterate_phdr); (c) its stack has room (64 KB below rsp, or
 *     the growing main stack) and can be written.
 *  3. A thread in user code inside one of those libraries is run to the return address
 *     of the library call it is in (the first return address into other code found on its
 *     stack, with a hardware breakpoint of that thread only: no byte of the program is
 *     changed; up to 3 times, 20 ms each), else single-stepped until it leaves them (at
 *     most 4000 steps or 50 ms; never over a `syscall` instruction).  A thread that still
 *     fails (or that is in one of the system calls above, or owns a loader lock) is let run
 *     for 0.3 to 2.4 ms and stopped again, up to 8 times; then the next thread is tried,
 *     and rounds repeat until the timeout.  Breakpoints and steps are only used when the
 *     thread does not block SIGTRAP and the process does not ignore it.
 *  4. Before a round, and while any loader lock is held by some thread (seen in the
 *     target's memory), we wait: our dlopen would only block on it.
 *  5. Seccomp, checked once, on the first thread stopped: a thread in strict mode anywhere
 *     refuses the attach; filters (which kill or fail the calls they do not allow) are read
 *     with PTRACE_SECCOMP_GET_FILTER (CAP_SYS_ADMIN: otherwise refused, EPERM) and run here
 *     on each system call dlopen and then mmleak make (SC_NEEDED, with the arguments they
 *     use), refused unless every one is allowed; every thread must have as many filters as
 *     that one (they are read from it alone).
 *
 * Holding the busy threads
 * ------------------------
 * At each round of the search (but every other one from the fifth, in case a held thread is
 * what the others wait for), every thread of the process that runs (state R) or waits in a
 * futex (a lock or a condition: the wait is restarted when it is let go, and futex callers
 * take a spurious wake-up anyway) is seized and interrupted, all first, then their stops
 * taken; again for threads created meanwhile.  Threads asleep in other system calls are left
 * alone: they take no CPU, and some of those calls (epoll_wait...) would end in EINTR.  A
 * held thread may hold a lock dlopen or FUNC needs, by where it stopped (held_risk): inside
 * libc, ld.so, an allocator or LIB, in a system call malloc or the loader make or made from
 * inside those libraries (malloc waits for one arena's lock holding another's), a frame of
 * LIB on its stack.  Those are run, 4 at a time while the others stay stopped, to the return
 * address of the library call they are in (a hardware breakpoint of that thread, as in rule
 * 3; 2 ms per batch, 50 ms per round), and held again there; one that stops for anything
 * else is let go (a signal, which it then gets; job control, which it re-enters).  A held
 * thread that owns a loader's lock is let go.  Held threads are candidates too (rank 2, after
 * the sleeping ones): one is used where it stands.  If a call sleeps (state S) for 2 ms with
 * threads held, the risky ones are run out again; when that no longer lowers their number,
 * they are let go, 8 at a time, the likeliest first (a frame of LIB: a detach waits for the
 * threads inside it); 0.5 s after the last of them, if the call still sleeps, all are.  At
 * the end every held thread is let go with PTRACE_DETACH (the leader last), exactly where it
 * was: nothing was changed in it.  A held thread that no longer stops (its process exits)
 * is reaped: a traced thread is its tracer's to reap, and its process cannot end before.
 *
 * Limits
 * ------
 *  - x86-64 only (other architectures get MMLEAK_INJ_EUNSUPP at run time); the target must
 *    be a 64-bit glibc process (musl, static or 32-bit ones are refused).
 *  - LIB must exist at the same path inside the target's root directory (a container).
 *  - A thread blocked in a system call inside a signal handler that interrupted malloc
 *    cannot be told apart: dlopen would then wait for itself (-7 after the timeout).
 *  - FUNC runs on the hijacked thread with its TLS and every signal but SIGSEGV and SIGTRAP
 *    blocked (a thread it creates inherits that mask); it must not need locks
 *    that thread may hold (stdio locks of a stream it reads, application locks).
 *  - If this process dies while a call runs in the target, the call returns to address 0
 *    untraced and the target gets SIGSEGV.  If a stopped thread cannot be brought back
 *    (a thread that entered D state for more than the timeout + 5 s), it stays traced by
 *    this process until this process exits (the kernel then lets it go; if it was in the
 *    calls, with every signal but SIGSEGV and SIGTRAP blocked): callers that stay
 *    alive may want to run this in a child process.
 *  - A running thread is stopped as a debugger stops it: one that enters a system call just
 *    as it is interrupted (microseconds after it was seen running) sees the call end as
 *    after a signal: restarted, or EINTR for epoll_wait and the others of rule 1's rank 1.
 *  - A busy thread that holds a lock FUNC or dlopen needs while it is not inside one of the
 *    libraries above (an application lock around an allocation: the call waits on it) costs
 *    the call the steps of "Holding the busy threads" (up to about 0.5 s more) before all are
 *    let go; then the call runs beside them as it would have without holding.
 *  - pause (and the other calls that a signal ends with EINTR only when its handler runs:
 *    ERESTARTNOHAND) is restarted when the thread is let go, as after SIGSTOP and SIGCONT:
 *    a signal whose handler runs before the thread is back in it (a loaded CPU: until its
 *    next turn) does not end it, and a `while (!flag) pause();` loop (racy anyway) sleeps
 *    on past its flag.  A self-pipe, or sigsuspend with the signal blocked, does not.
 *  - The kernel keeps one restart record per thread for an interrupted nanosleep, poll or
 *    futex wait with timeout.  If the hijacked thread was in one, and a signal, a stop or
 *    the timeout interrupted such a sleep inside the call too, the thread's own sleep is
 *    restarted from its start (its full duration again) rather than for the time left.
 */
#include "inject.h"

EXPORT int mmleak_inject_abi(void) { return 1; }

#if !defined(__x86_64__) || !defined(__linux__)

EXPORT int mmleak_inject_call(int pid, const char *lib, const char *func, const char *arg,
                           int timeout_ms, long *result, char *err, size_t errlen)
{
    (void)pid, (void)lib, (void)func, (void)arg, (void)timeout_ms, (void)result;
    if (err && errlen)
        snprintf(err, errlen, "attaching to a running process is implemented for x86-64 only");
    return MMLEAK_INJ_EUNSUPP;
}

EXPORT int mmleak_inject_call_within(int pid, const char *lib, const char *func, const char *arg,
                                  int search_ms, int total_ms, long *result, char *err,
                                  size_t errlen)
{
    (void)search_ms;
    return mmleak_inject_call(pid, lib, func, arg, total_ms, result, err, errlen);
}

#else

/* ---- the process ---------------------------------------------------------------------- */

/* Find libc, ld.so, dlopen & co. and the ranges a thread must not be stopped in. */
static int survey(struct inj *c)
{
    if (load_maps(c) < 0) {
        if (errno == EACCES || errno == EPERM)
            return explain_eperm(c, 0, "reading its memory map");
        if (errno == ENOENT || errno == ESRCH)
            return fail(c, MMLEAK_INJ_ESRCH, "no such process %d", c->pid);
        return fail(c, MMLEAK_INJ_ESYS, "/proc/%d/maps: %s", c->pid, strerror(errno));
    }
    const char *libc = NULL, *ld = NULL, *libdl = NULL, *musl = NULL;
    struct stat lst;
    char lp[PATH_MAX + 64];
    snprintf(lp, sizeof lp, "/proc/%d/task/%d/root%s", c->pid, c->mtid, c->lib);
    int have_lib = stat(lp, &lst) == 0;
    c->nunsafe = c->nldx = c->nlibx = 0;
    for (size_t i = 0; i < c->nmaps; i++) {
        const struct mapent *m = &c->maps[i];
        if (m->path[0] != '/')
            continue;
        int k = classify(m->path);
        int is_lib = have_lib && m->ino == lst.st_ino &&
                     makedev(m->dmaj, m->dmin) == lst.st_dev;
        is_lib = is_lib || !strcmp(m->path, c->lib);
        if (k == O_LIBC && !libc)
            libc = m->path;
        if (k == O_LD && !ld)
            ld = m->path;
        if (k == O_LIBDL && !libdl)
            libdl = m->path;
        if (k == O_MUSL)
            musl = m->path;
        if (m->perm[2] == 'x' && (k == O_LIBC || k == O_LD || k == O_LIBDL ||
                                  k == O_LIBPTHREAD || k == O_ALLOC || is_lib)) {
            if (add_range(&c->unsafe, &c->nunsafe, m->start, m->end) < 0)
                return fail(c, MMLEAK_INJ_ESYS, "out of memory");
            if (k == O_LD && add_range(&c->ldx, &c->nldx, m->start, m->end) < 0)
                return fail(c, MMLEAK_INJ_ESYS, "out of memory");
            if (is_lib && add_range(&c->libx, &c->nlibx, m->start, m->end) < 0)
                return fail(c, MMLEAK_INJ_ESYS, "out of memory");
            if (k == O_LIBC && !c->libc_xlo) {
                c->libc_xlo = m->start;
                c->libc_xhi = m->end;
            }
        }
    }
    if (musl && !libc)
        return fail(c, MMLEAK_INJ_EUNSUPP, "%d uses musl libc (%s): mmleak needs glibc", c->pid,
                    musl);
    if (!libc && !ld)
        return fail(c, MMLEAK_INJ_EUNSUPP,
                    "%d is statically linked: no dynamic loader, cannot load a library", c->pid);
    if (!libc)
        return fail(c, MMLEAK_INJ_EUNSUPP, "%d has no libc.so.6 mapped: cannot load a library",
                    c->pid);
    c->libc_base = object_base(c, libc);
    struct elfdyn d;
    int r = c->libc_base ? elf_open(c, c->libc_base, &d) : -1;
    if (r == -2)
        return fail(c, MMLEAK_INJ_EUNSUPP, "%d is not a 64-bit x86-64 process (%s)", c->pid,
                    libc);
    if (r < 0 && (errno == EPERM || errno == EACCES))
        return explain_eperm(c, 0, "reading its memory");
    if (r < 0)
        return fail(c, MMLEAK_INJ_ESYS, "%d: cannot read the dynamic symbols of %s", c->pid,
                    libc);
    c->a_dlopen = elf_sym(c, &d, "dlopen", NULL);
    c->a_dlsym = elf_sym(c, &d, "dlsym", NULL);
    c->a_dlerror = elf_sym(c, &d, "dlerror", NULL);
    if (!(c->a_dlopen && c->a_dlsym && c->a_dlerror) && libdl) {
        uint64_t b = object_base(c, libdl);
        if (b && elf_open(c, b, &d) == 0) {
            c->a_dlopen = elf_sym(c, &d, "dlopen", NULL);
            c->a_dlsym = elf_sym(c, &d, "dlsym", NULL);
            c->a_dlerror = elf_sym(c, &d, "dlerror", NULL);
        }
    }
    if (!(c->a_dlopen && c->a_dlsym && c->a_dlerror))
        return fail(c, MMLEAK_INJ_EUNSUPP,
                    "%d uses a libc without dlopen (%s: glibc older than 2.34 without "
                    "libdl.so.2 loaded?)", c->pid, libc);
    c->rtld_g = c->rtld_gsize = 0;
    if (ld) {
        uint64_t b = object_base(c, ld);
        if (b && elf_open(c, b, &d) == 0)
            c->rtld_g = elf_sym(c, &d, "_rtld_global", &c->rtld_gsize);
        if (c->rtld_gsize > RTLD_G_MAX)
            c->rtld_g = c->rtld_gsize = 0;
    }
    return 0;
}

/* A thread of the process holding one of the loader's recursive locks (pthread mutexes in
 * _rtld_global: {int lock; unsigned count; int owner; unsigned nusers; int kind=1...}), or
 * 0.  ONLY: just this thread, or any thread (0). */
int loader_lock_owner(struct inj *c, int only)
{
    if (!c->rtld_g)
        return 0;
    unsigned char buf[RTLD_G_MAX];
    if (rd(c, c->rtld_g, buf, c->rtld_gsize) < 0)
        return 0;
    for (uint64_t o = 0; o + 20 <= c->rtld_gsize; o += 8) {
        int lock, owner, kind;
        unsigned count;
        memcpy(&lock, buf + o, 4);
        memcpy(&count, buf + o + 4, 4);
        memcpy(&owner, buf + o + 8, 4);
        memcpy(&kind, buf + o + 16, 4);
        if (kind != 1 || !lock || owner <= 0 || !count || count > 1000000)
            continue;
        if (only ? owner == only : 1) {
            char path[64];
            snprintf(path, sizeof path, "/proc/%d/task/%d", c->pid, owner);
            if (access(path, F_OK) == 0)
                return owner;
        }
    }
    return 0;
}

/* ---- waiting for a thread ------------------------------------------------------------ */

/* Wait for a stop of thread TID (attached) until UNTIL.  1: stopped (*st); 0: time is up;
 * -1: the thread is gone (its process exited or exec'ed); -2: error.  A thread asked to stop
 * cannot be let go running: those waits go GRACE_NS past the deadline (hard_until). */
int process_alive(int pid);

int wait_tid(struct inj *c, int tid, int *st, int64_t until)
{
    for (unsigned spin = 0;; spin++) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, tid, &si, WEXITED | WSTOPPED | WNOHANG | WNOWAIT | __WALL) < 0) {
            if (errno == EINTR)
                continue;
            if (errno == ECHILD)
                return -1;
            return -2;
        }
        if (si.si_pid == tid) {
            if (si.si_code == CLD_EXITED || si.si_code == CLD_KILLED ||
                si.si_code == CLD_DUMPED) {
                /* Reap it unless it is our own child's leader: its parent (us, e.g. a
                 * test that started it) must get the exit status. */
                char buf[4096];
                int ppid = -1;
                if (read_status(c->pid, 0, buf, sizeof buf) == 0)
                    ppid = (int)field_long(buf, "PPid", -1);
                if (tid != c->pid || ppid != c->me)
                    waitpid(tid, st, WNOHANG | __WALL);
                return -1;
            }
            pid_t r = waitpid(tid, st, WNOHANG | __WALL);
            if (r == tid && WIFSTOPPED(*st))
                return 1;
            if (r == tid)
                return -1;
            continue;
        }
        if (now_ns() >= until)
            return 0;
        if (spin < 20)
            sched_yield();
        else
            nap_us(spin < 30 ? 20 : spin < 40 ? 100 : 500);
    }
}

void unhold_all(struct inj *c);

/* wait_tid for the borrowed thread.  If its process exits meanwhile, the held threads are
 * let go (reaped): the leader's end is not seen while traced threads are not reaped. */
static int wait_stop(struct inj *c, int *st, int64_t until)
{
    int w;
    for (;;) {
        int64_t slice = now_ns() + 50000000;
        w = wait_tid(c, c->tid, st, c->nheld && slice < until ? slice : until);
        if (w != 0 || now_ns() >= until)
            break;
        if (!process_alive(c->pid))
            unhold_all(c);
    }
    if (w == -1)
        c->attached = 0;
    return w;
}


/* Remove our hardware breakpoint: it would outlive PTRACE_DETACH (and kill the process). */
static void clear_bp(struct inj *c)
{
    if (!c->bp_set)
        return;
    ptrace(PTRACE_POKEUSER, c->tid, DR_OFF(7), 0);
    ptrace(PTRACE_POKEUSER, c->tid, DR_OFF(0), 0);
    c->bp_set = 0;
}

static void requeue(struct inj *c, const siginfo_t *si)
{
    if (si->si_code < 0 && si->si_code != SI_TKILL &&
        syscall(SYS_rt_tgsigqueueinfo, c->pid, c->tid, si->si_signo, si) == 0)
        return;
    syscall(SYS_tgkill, c->pid, c->tid, si->si_signo);
}

/* A signal the thread got while we hold it (taken from the kernel's queue by its
 * signal-delivery-stop, which we resume without it): kept, in order, for release.  No
 * bound but memory: a stream of real-time signals during a slow call is hundreds (a fixed
 * 64 once dropped the rest: 75 of 248 lost under load).  Should memory run out, it is
 * queued to the thread again at once: never lost (though ahead of those kept), but the
 * thread then stops for it at every resume (the call makes no progress and times out). */
static void record(struct inj *c, const siginfo_t *si)
{
    if (si->si_signo < SIGRTMIN)
        for (int i = 0; i < c->nrec; i++)
            if (c->recs[i].si_signo == si->si_signo)
                return;
    if (c->nrec == c->caprec) {
        int cap = c->caprec ? 2 * c->caprec : 64;
        siginfo_t *n = realloc(c->recs, cap * sizeof *n);
        if (!n) {
            requeue(c, si);
            return;
        }
        c->recs = n;
        c->caprec = cap;
    }
    c->recs[c->nrec++] = *si;
}

/* PTRACE_DETACH of thread TID (stopped), with SIG; if it is no longer stopped (killed: its
 * process exits), wait for its end and reap it: a traced thread is its tracer's to reap, and
 * until then its process cannot end. */
void detach_or_reap(struct inj *c, int tid, int sig)
{
    int st;
    for (int k = 0; k < 3 && ptrace(PTRACE_DETACH, tid, 0, (void *)(long)sig) < 0 && errno == ESRCH;
         k++)
        if (wait_tid(c, tid, &st, now_ns() + 1000000000LL) != 1)
            break;
}

/* Put the thread back as it was and let it go: registers, extended state, the signals it
 * received meanwhile. */
static void release(struct inj *c)
{
    if (!c->attached || c->stuck)
        return;
    int tid = c->tid;
    clear_bp(c);
    if (c->modified) {
        struct user_regs_struct r = c->saved;
        /* A sleep of our call was interrupted: the kernel's restart record is now the
         * call's, so the thread's own interrupted nanosleep/poll/futex restarts from its
         * start instead (from the same arguments, as for -ERESTARTNOINTR). */
        if (c->clobbered && (long)r.rax == -ERESTART_RESTARTBLOCK_)
            r.rax = (unsigned long)-ERESTARTNOINTR_;
        if (c->at_sysexit && (long)r.orig_rax >= 0) {
            /* no signal is on its way to user space here, so the kernel restarts nothing:
             * do what it would do (arch_do_signal_or_restart without a handler) */
            long e = -(long)r.rax;
            if (e == ERESTARTSYS_ || e == ERESTARTNOINTR_ || e == ERESTARTNOHAND_) {
                r.rax = r.orig_rax;
                r.rip -= 2;
            } else if (e == ERESTART_RESTARTBLOCK_) {
                r.rax = SYS_restart_syscall;
                r.rip -= 2;
            }
        }
        if (c->at_sysexit)
            r.orig_rax = (unsigned long)-1;
        ptrace(PTRACE_SETREGS, tid, 0, &r);
        if (c->xkind == 1) {
            struct iovec iov = {c->xbuf, c->xlen};
            ptrace(PTRACE_SETREGSET, tid, (void *)(long)NT_X86_XSTATE, &iov);
        } else if (c->xkind == 2) {
            ptrace(PTRACE_SETFPREGS, tid, 0, &c->fpregs);
        }
    }
    if (c->mask_set && ptrace(PTRACE_SETSIGMASK, tid, (void *)sizeof c->mask_saved,
                              &c->mask_saved) == 0)
        c->mask_set = 0;
    int sig = 0;
    if (c->at_sysexit)
        c->in_sigstop = 0;      /* a system call stop: the signals are all queued again */
    c->at_sysexit = 0;
    for (int i = c->in_sigstop ? 1 : 0; i < c->nrec; i++)
        requeue(c, &c->recs[i]);
    if (c->nrec && c->in_sigstop) {
        ptrace(PTRACE_SETSIGINFO, tid, 0, &c->recs[0]);
        sig = c->recs[0].si_signo;
    }
    detach_or_reap(c, tid, sig);
    c->attached = 0;
}

/* Let go at once, delivering the fault the thread just took (current signal-delivery-stop). */
static void release_with_fault(struct inj *c, int sig)
{
    clear_bp(c);
    for (int i = 0; i < c->nrec; i++)
        requeue(c, &c->recs[i]);
    detach_or_reap(c, c->tid, sig);
    c->attached = 0;
}

static int stuck(struct inj *c, const char *what)
{
    c->stuck = 1;
    return fail(c, MMLEAK_INJ_ESYS,
                "thread %d of %d did not stop %s (uninterruptible sleep?): it stays attached to "
                "this process until it exits", c->tid, c->pid, what);
}

/* The process exists and one of its threads is neither a zombie nor exiting (PF_EXITING:
 * an exit_group in progress, whose memory map may already be gone). */
int process_alive(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    struct dirent *e;
    int alive = 0;
    while (d && !alive && (e = readdir(d))) {
        int tid = atoi(e->d_name);
        char sbuf[1024];
        snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
        char *rp = tid > 0 && slurp(path, sbuf, sizeof sbuf) > 0 ? strrchr(sbuf, ')') : NULL;
        if (!rp || !rp[1] || rp[2] == 'Z' || rp[2] == 'X')
            continue;
        /* after ") ": state ppid pgrp session tty_nr tpgid flags */
        char *f = rp + 2;
        for (int k = 0; k < 6 && f; k++) {
            f = strchr(f, ' ');
            if (f)
                f++;
        }
        alive = !f || !(strtoul(f, NULL, 10) & 0x4 /* PF_EXITING */);
    }
    if (d)
        closedir(d);
    return alive;
}

static int gone(struct inj *c, const char *when)
{
    return fail(c, MMLEAK_INJ_ESRCH, "%d exited %s", c->pid, when);
}

/* Is a SIGTRAP pending for thread TID (our breakpoint, hit as the thread was interrupted:
 * the interrupt's stop comes first, and the SIGTRAP would reach the thread once let go)? */
int trap_pending(struct inj *c, int tid)
{
    char buf[4096];
    const char *p = read_status(c->pid, tid, buf, sizeof buf) == 0 ? field(buf, "SigPnd") : NULL;
    return p && (strtoull(p, NULL, 16) >> (SIGTRAP - 1)) & 1;
}

/* After asking the thread to stop (TS_STOP: PTRACE_INTERRUPT), to make one step (TS_STEP)
 * or to run to a hardware breakpoint (TS_RUN: interrupted if not there by SOFT): take the
 * stop.  1: stopped somewhere usable (c->in_sigstop tells which kind); 0: let go (a fault
 * was delivered), try another thread; <0: fatal. */
enum { TS_STOP, TS_STEP, TS_RUN };

static int take_stop(struct inj *c, int mode, int64_t soft)
{
    int interrupted = 0;
    for (;;) {
        int st, w;
        if (mode == TS_RUN && !interrupted) {
            w = wait_stop(c, &st, soft < c->deadline ? soft : c->deadline);
            if (w == 0) {
                interrupted = 1;
                if (ptrace(PTRACE_INTERRUPT, c->tid, 0, 0) < 0 && errno != ESRCH)
                    return fail(c, MMLEAK_INJ_ESYS, "PTRACE_INTERRUPT: %s", strerror(errno));
                continue;
            }
        } else {
            w = wait_stop(c, &st, hard_until(c));
        }
        if (w == 0)
            return stuck(c, "when asked to");
        if (w == -1)
            return gone(c, "while being attached");
        if (w < 0)
            return fail(c, MMLEAK_INJ_ESYS, "waitpid %d: %s", c->tid, strerror(errno));
        int ev = (st >> 16) & 0xff, sig = WSTOPSIG(st);
        if (ev == PTRACE_EVENT_STOP) {
            if (sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU) {
                release(c);
                char sb[16];
                return fail(c, MMLEAK_INJ_EBUSY,
                            "%d is stopped (%s): resume it first (kill -CONT %d)", c->pid,
                            signame(sig, sb, sizeof sb), c->pid);
            }
            c->in_sigstop = 0;
            if (mode == TS_RUN && interrupted && trap_pending(c, c->tid)) {
                /* at the breakpoint as it was interrupted: its SIGTRAP comes next */
                if (ptrace(PTRACE_CONT, c->tid, 0, 0) < 0)
                    return fail(c, MMLEAK_INJ_ESYS, "PTRACE_CONT: %s", strerror(errno));
                continue;
            }
            /* an interrupt asked for earlier (the first stop was a signal): go on */
            if (mode == TS_STEP || (mode == TS_RUN && !interrupted)) {
                if (ptrace(mode == TS_STEP ? PTRACE_SINGLESTEP : PTRACE_CONT, c->tid, 0, 0) < 0)
                    return fail(c, MMLEAK_INJ_ESYS, "ptrace: %s", strerror(errno));
                continue;
            }
            return 1;
        }
        if (ev)
            return fail(c, MMLEAK_INJ_ESYS, "unexpected ptrace event %d", ev);
        siginfo_t si;
        if (ptrace(PTRACE_GETSIGINFO, c->tid, 0, &si) < 0)
            return fail(c, MMLEAK_INJ_ESYS, "PTRACE_GETSIGINFO: %s", strerror(errno));
        c->in_sigstop = 1;
        if (sig == SIGTRAP && ((mode == TS_STEP && si.si_code == TRAP_TRACE) ||
                               (mode == TS_RUN && si.si_code == TRAP_HWBKPT)))
            return 1;
        if (is_fault(&si)) {
            if (c->modified) /* our call's own fault: the caller puts the thread back */
                return 1;
            char sb[16];
            release_with_fault(c, sig);
            because(c, "thread %d took %s", c->tid, signame(sig, sb, sizeof sb));
            return 0;
        }
        record(c, &si);
        if (mode == TS_RUN && !interrupted) { /* keep running to the breakpoint */
            if (ptrace(PTRACE_CONT, c->tid, 0, 0) < 0)
                return fail(c, MMLEAK_INJ_ESYS, "PTRACE_CONT: %s", strerror(errno));
            continue;
        }
        return 1;
    }
}

/* ---- choosing a thread ------------------------------------------------------------------ */

static int sys_excluded(long nr)
{
    switch (nr) {
    case SYS_mmap: case SYS_munmap: case SYS_mremap: case SYS_mprotect: case SYS_madvise:
    case SYS_brk: case SYS_clone: case SYS_fork: case SYS_vfork: case SYS_execve:
    case SYS_execveat: case SYS_exit: case SYS_exit_group:
#ifdef SYS_clone3
    case SYS_clone3:
#endif
        return 1;
    }
    return 0;
}

static int sys_eintr(long nr)
{
    switch (nr) {
    case SYS_epoll_wait: case SYS_epoll_pwait: case SYS_semop: case SYS_semtimedop:
    case SYS_rt_sigtimedwait: case SYS_msgrcv: case SYS_msgsnd: case SYS_io_getevents:
#ifdef SYS_epoll_pwait2
    case SYS_epoll_pwait2:
#endif
#ifdef SYS_io_pgetevents
    case SYS_io_pgetevents:
#endif
        return 1;
    }
    return 0;
}

/* The index of TID among the held threads (see hold_running), or -1. */
int held_index(struct inj *c, int tid)
{
    for (int i = 0; i < c->nheld; i++)
        if (c->held[i].tid == tid)
            return i;
    return -1;
}

struct thr {
    int tid, rank;
};

static int thr_cmp(const void *a, const void *b, void *pidp)
{
    const struct thr *x = a, *y = b;
    int pid = *(int *)pidp;
    if (x->rank != y->rank)
        return x->rank - y->rank;
    if ((x->tid == pid) != (y->tid == pid))
        return x->tid == pid ? -1 : 1;
    return x->tid - y->tid;
}

/* The candidate threads, best first.  Sets *stopped when a thread is in job-control stop,
 * *alive to the number of threads not dead. */
static int list_threads(struct inj *c, struct thr **out, int *n, int *stopped, int *alive)
{
    char path[96], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task", c->pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    size_t cap = 16;
    struct thr *v = malloc(cap * sizeof *v);
    *n = *stopped = *alive = 0;
    struct dirent *e;
    while (v && (e = readdir(d))) {
        int tid = atoi(e->d_name);
        if (tid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/task/%d/stat", c->pid, tid);
        if (slurp(path, buf, sizeof buf) < 0)
            continue;
        char *rp = strrchr(buf, ')');
        char state = rp && rp[1] ? rp[2] : '?';
        if (state == 'Z' || state == 'X' || state == 'x')
            continue;
        (*alive)++;
        if (state == 'T')
            (*stopped)++;
        int rank = -1;
        if (state == 'R' || (state == 't' && held_index(c, tid) >= 0)) {
            rank = 2;
        } else if (state == 'S') {
            snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", c->pid, tid);
            if (slurp(path, buf, sizeof buf) < 0) {
                if (errno != EACCES && errno != EPERM)
                    continue; /* gone */
                rank = 2;     /* not ours to see: PTRACE_SEIZE will say why */
            } else if (!strncmp(buf, "running", 7)) {
                rank = 2;
            } else {
                long nr = strtol(buf, NULL, 10);
                char *last = strrchr(buf, ' ');
                uint64_t pc = last ? strtoull(last + 1, NULL, 16) : 0;
                if (nr < 0)
                    rank = 2;
                else if (sys_excluded(nr) || in_ranges(c->ldx, c->nldx, pc))
                    rank = -1;
                else
                    rank = sys_eintr(nr) ? 1 : 0;
            }
        }
        if (rank < 0)
            continue;
        if ((size_t)*n == cap) {
            struct thr *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv)
                break;
            v = nv;
        }
        v[*n].tid = tid;
        v[*n].rank = rank;
        (*n)++;
    }
    closedir(d);
    if (!v)
        return -1;
    qsort_r(v, *n, sizeof *v, thr_cmp, &c->pid);
    *out = v;
    return 0;
}

/* Why the stopped thread cannot be used where it is now (NULL: it can).  *movable: it is
 * in user code that single steps may take out of there. */
const char *unsafe_here(struct inj *c, const struct user_regs_struct *r, int *movable)
{
    *movable = 0;
    if ((long)r->orig_rax >= 0) {
        if (sys_excluded((long)r->orig_rax))
            return "in a system call malloc or the loader may make";
        if (in_ranges(c->ldx, c->nldx, r->rip))
            return "in a system call of the dynamic loader";
        return NULL;
    }
    if (in_ranges(c->unsafe, c->nunsafe, r->rip)) {
        *movable = 1;
        return "running inside libc, ld.so, an allocator or the library";
    }
    return NULL;
}

static int step_out(struct inj *c, const struct user_regs_struct *r)
{
    unsigned char insn[2];
    if (rd(c, r->rip, insn, 2) == 0 && insn[0] == 0x0f && insn[1] == 0x05)
        return 0; /* never step over a system call: it may block, and it ends differently */
    if (ptrace(PTRACE_SINGLESTEP, c->tid, 0, 0) < 0)
        return fail(c, MMLEAK_INJ_ESYS, "PTRACE_SINGLESTEP: %s", strerror(errno));
    int t = take_stop(c, TS_STEP, 0);
    return t <= 0 ? t - 10 : 1; /* -10: let go; < -10: fatal */
}

static int let_run(struct inj *c, long us)
{
    if (ptrace(PTRACE_CONT, c->tid, 0, 0) < 0)
        return fail(c, MMLEAK_INJ_ESYS, "PTRACE_CONT: %s", strerror(errno));
    nap_us(us);
    if (ptrace(PTRACE_INTERRUPT, c->tid, 0, 0) < 0 && errno != ESRCH)
        return fail(c, MMLEAK_INJ_ESYS, "PTRACE_INTERRUPT: %s", strerror(errno));
    return take_stop(c, TS_STOP, 0);
}

/* Scan the stack above RSP (4 KB) for a return address: a value that points into executable
 * code right after a call instruction, and: (SR_CALLER) outside the unsafe ranges, (SR_LIB)
 * into LIB's code, (SR_ANY) anywhere.  The first one, or 0. */

uint64_t stack_return(struct inj *c, uint64_t rsp, int inside)
{
    const struct mapent *m = map_at(c, rsp);
    if (!m)
        return 0;
    uint64_t buf[512];
    size_t len = m->end - rsp > sizeof buf ? sizeof buf : ((m->end - rsp) & ~7UL);
    if (rd(c, rsp, buf, len) < 0)
        return 0;
    for (size_t i = 0; i < len / 8; i++) {
        uint64_t v = buf[i];
        if (inside == SR_LIB ? !in_ranges(c->libx, c->nlibx, v) :
            inside == SR_CALLER && in_ranges(c->unsafe, c->nunsafe, v))
            continue;
        const struct mapent *x = v > 7 ? map_at(c, v) : NULL;
        if (!x || x->perm[2] != 'x' || v - 7 < x->start)
            continue;
        unsigned char b[7];
        if (rd(c, v - 7, b, 7) < 0)
            continue;
        /* call rel32 (e8), or call r/m64 (ff /2) of 2, 3, 6 or 7 bytes */
        if (b[2] == 0xe8 || (b[5] == 0xff && ((b[6] >> 3) & 7) == 2) ||
            (b[4] == 0xff && ((b[5] >> 3) & 7) == 2) || (b[1] == 0xff && ((b[2] >> 3) & 7) == 2) ||
            (b[0] == 0xff && ((b[1] >> 3) & 7) == 2))
            return v;
    }
    return 0;
}

/* The address a call in user code (outside the unsafe ranges) will return to.  0 if none. */
uint64_t caller_address(struct inj *c, uint64_t rsp)
{
    return stack_return(c, rsp, SR_CALLER);
}

/* Run the thread to where its current library call returns into user code (a hardware
 * breakpoint of this thread only: no byte of the program is changed); interrupted after
 * SOFT_NS if it is not there.  2: not possible; else as take_stop. */
static int run_to_caller(struct inj *c, int64_t soft_ns)
{
    uint64_t ra = caller_address(c, c->saved.rsp);
    if (!ra)
        return 2;
    errno = 0;
    long dr7 = ptrace(PTRACE_PEEKUSER, c->tid, DR_OFF(7), 0);
    if (errno || dr7)
        return 2; /* unavailable, or in use */
    if (ptrace(PTRACE_POKEUSER, c->tid, DR_OFF(0), (void *)ra) < 0)
        return 2;
    c->bp_set = 1;
    if (ptrace(PTRACE_POKEUSER, c->tid, DR_OFF(7), (void *)1L) < 0) {
        clear_bp(c);
        return 2;
    }
    if (ptrace(PTRACE_CONT, c->tid, 0, 0) < 0)
        return fail(c, MMLEAK_INJ_ESYS, "PTRACE_CONT: %s", strerror(errno));
    int t = take_stop(c, TS_RUN, now_ns() + soft_ns);
    if (t > 0)
        clear_bp(c);
    return t;
}

/* An 0xCC byte in libc's code (returning there raises SIGTRAP), or 0. */
static uint64_t find_int3(struct inj *c)
{
    if (c->int3)
        return c->int3 == 1 ? 0 : c->int3;
    c->int3 = 1;
    unsigned char buf[4096];
    for (uint64_t a = c->libc_xlo; a && a + sizeof buf <= c->libc_xhi && a < c->libc_xlo + (1 << 22);
         a += sizeof buf) {
        if (rd(c, a, buf, sizeof buf) < 0)
            break;
        unsigned char *p = memchr(buf, 0xcc, sizeof buf);
        if (p) {
            c->int3 = a + (p - buf);
            return c->int3;
        }
    }
    return 0;
}

/* The bytes of a `syscall` instruction (0f 05) in libc's code, or 0: the return address of
 * a call in a thread that blocks both SIGSEGV and SIGTRAP (see call_return_by_syscall). */
static uint64_t find_syscall_insn(struct inj *c)
{
    if (c->sysinsn)
        return c->sysinsn == 1 ? 0 : c->sysinsn;
    c->sysinsn = 1;
    unsigned char buf[4096 + 1];
    for (uint64_t a = c->libc_xlo; a && a + sizeof buf <= c->libc_xhi && a < c->libc_xlo + (1 << 22);
         a += sizeof buf - 1) {
        if (rd(c, a, buf, sizeof buf) < 0)
            break;
        for (size_t i = 0; i + 1 < sizeof buf; i++)
            if (buf[i] == 0x0f && buf[i + 1] == 0x05) {
                c->sysinsn = a + i;
                return c->sysinsn;
            }
    }
    return 0;
}

/* ---- calls in the target ---------------------------------------------------------------- */

/* At a stop inside our call: was a sleep of the call interrupted in a way that makes the
 * kernel keep a restart record (nanosleep, poll, futex with timeout)?  The thread has one
 * record only, which its own interrupted sleep may need (see release). */
static void note_clobber(struct inj *c, const struct user_regs_struct *now)
{
    struct user_regs_struct r;
    if (!now) {
        if (ptrace(PTRACE_GETREGS, c->tid, 0, &r) < 0) {
            c->clobbered = 1;
            return;
        }
        now = &r;
    }
    if ((long)now->orig_rax >= 0 && (long)now->rax == -ERESTART_RESTARTBLOCK_)
        c->clobbered = 1;
}

/* Resume the thread inside our call: with PTRACE_SYSCALL when the call ends in a system
 * call (trapsig 0), to see it. */
static long resume_call(struct inj *c)
{
    return ptrace(c->trapsig ? PTRACE_CONT : PTRACE_SYSCALL, c->tid, 0, 0);
}

/* Trapsig 0: the thread blocks (or ignores) both SIGSEGV and SIGTRAP, so the call returns to
 * a `syscall` instruction of libc's instead, and the thread runs under PTRACE_SYSCALL: the
 * entry stop of that system call (at its address + 2, with the stack pointer just above the
 * return address) is the return, and the number it asks for is the result.  That call is
 * turned into a getpid (harmless, and allowed by every seccomp filter that lets mmleak run:
 * see SC_NEEDED) and its exit stop taken: from there any registers can be set, without a
 * system call pending (see release).  1: it was the return (*RET set); 0: another system
 * call of the callee (resumed); <0: fatal. */
static int call_return_by_syscall(struct inj *c, uint64_t *ret)
{
    struct user_regs_struct now;
    if (ptrace(PTRACE_GETREGS, c->tid, 0, &now) < 0)
        return fail(c, MMLEAK_INJ_ESYS, "PTRACE_GETREGS: %s", strerror(errno));
    c->in_sigstop = 0;
    if (now.rip != c->trap_rip || now.rsp != c->sp + 8 || (long)now.rax != -ENOSYS) {
        if (resume_call(c) < 0)
            return fail(c, MMLEAK_INJ_ESYS, "PTRACE_SYSCALL: %s", strerror(errno));
        return 0;
    }
    *ret = now.orig_rax;
    now.orig_rax = SYS_getpid;
    if (ptrace(PTRACE_SETREGS, c->tid, 0, &now) < 0 || ptrace(PTRACE_SYSCALL, c->tid, 0, 0) < 0)
        return fail(c, MMLEAK_INJ_ESYS, "ptrace: %s", strerror(errno));
    for (;;) {
        int st, w = wait_stop(c, &st, hard_until(c));
        if (w == -1)
            return gone(c, "during the call");
        if (w <= 0)
            return w == 0 ? stuck(c, "after the call") :
                            fail(c, MMLEAK_INJ_ESYS, "waitpid %d: %s", c->tid, strerror(errno));
        if (WSTOPSIG(st) == (SIGTRAP | 0x80) && !((st >> 16) & 0xff)) {
            c->at_sysexit = 1;
            return 1;
        }
        /* a signal (the thread blocks all we could use, but not all) or an interrupt
         * between the entry and the exit: recorded for later, and on to the exit */
        if (!((st >> 16) & 0xff)) {
            siginfo_t si;
            if (ptrace(PTRACE_GETSIGINFO, c->tid, 0, &si) == 0)
                record(c, &si);
        }
        if (ptrace(PTRACE_SYSCALL, c->tid, 0, 0) < 0)
            return fail(c, MMLEAK_INJ_ESYS, "PTRACE_SYSCALL: %s", strerror(errno));
    }
}

static int call(struct inj *c, uint64_t fn, uint64_t a0, uint64_t a1, uint64_t *ret,
                const char *what)
{
    struct user_regs_struct r = c->saved;
    r.rip = fn;
    r.rdi = a0;
    r.rsi = a1;
    r.rdx = r.rcx = r.r8 = r.r9 = 0;
    r.rax = 0; /* no vector registers for a variadic callee */
    r.rsp = c->sp;
    r.orig_rax = (unsigned long)-1; /* no system call restart on the way to user space */
    r.eflags &= ~0x500UL;          /* DF and TF clear, as the ABI wants at a call */
    c->modified = 1;
    if (ptrace(PTRACE_SETREGS, c->tid, 0, &r) < 0)
        return fail(c, MMLEAK_INJ_ESYS, "PTRACE_SETREGS: %s", strerror(errno));
    if (resume_call(c) < 0)
        return fail(c, MMLEAK_INJ_ESYS, "PTRACE_CONT: %s", strerror(errno));
    c->at_sysexit = 0;
    int64_t asleep = 0, since = 0, last = now_ns();
    for (;;) {
        int64_t until = c->deadline;
        if (c->nheld && now_ns() + ASLEEP_NS / 2 < until)
            until = now_ns() + ASLEEP_NS / 2;
        int st, w = wait_stop(c, &st, until);
        if (w == 0 && until < c->deadline) {
            /* the call sleeps (a lock, a nap): maybe for a held thread.  The held threads
             * that may hold a lock are run out of the libraries again; when that no longer
             * helps, they are let go, a few at a time, the likeliest first; if the call
             * sleeps on ASLEEP_ALL_NS after the last of them, all are */
            if (thread_state(c, c->tid) != 'S') {
                asleep = 0;
            } else if (!asleep) {
                asleep = now_ns();
            } else if (now_ns() - asleep >= ASLEEP_NS && now_ns() - since >= ASLEEP_NS) {
                int before = risky(c);
                if (before) {
                    int e = settle_held(c);
                    if (e < 0)
                        return e;
                    if (risky(c) >= before)
                        unhold_risky(c, UNHOLD_STEP);
                    last = now_ns();
                } else if (now_ns() - last >= ASLEEP_ALL_NS) {
                    unhold_all(c);
                }
                since = now_ns();
            }
            continue;
        }
        if (w == 0) {
            if (ptrace(PTRACE_INTERRUPT, c->tid, 0, 0) == 0) {
                int t = take_stop(c, TS_STOP, 0);
                if (t < 0)
                    return t;
                note_clobber(c, NULL);
            } else {
                c->clobbered = 1;
            }
            return fail(c, MMLEAK_INJ_ECALL,
                        "%s did not return within the timeout in thread %d of %d: the call was "
                        "abandoned and the thread put back where it was, but %d may hold locks "
                        "the call took", what, c->tid, c->pid, c->pid);
        }
        if (w == -1)
            return gone(c, what[0] == 'd' ? "during the dlopen" : "during the call");
        if (w < 0)
            return fail(c, MMLEAK_INJ_ESYS, "waitpid %d: %s", c->tid, strerror(errno));
        int ev = (st >> 16) & 0xff, sig = WSTOPSIG(st);
        if (ev) { /* interrupt or job-control stop: go on (the other threads may be stopped) */
            c->in_sigstop = 0;
            note_clobber(c, NULL);
            if (resume_call(c) < 0)
                return fail(c, MMLEAK_INJ_ESYS, "PTRACE_CONT: %s", strerror(errno));
            continue;
        }
        if (!c->trapsig && sig == (SIGTRAP | 0x80)) {    /* a system call stop */
            int k = call_return_by_syscall(c, ret);
            if (k != 0)
                return k < 0 ? k : 0;
            continue;
        }
        siginfo_t si;
        struct user_regs_struct now;
        if (ptrace(PTRACE_GETSIGINFO, c->tid, 0, &si) < 0 ||
            ptrace(PTRACE_GETREGS, c->tid, 0, &now) < 0)
            return fail(c, MMLEAK_INJ_ESYS, "ptrace: %s", strerror(errno));
        c->in_sigstop = 1;
        if (sig == c->trapsig && si.si_code > 0 && now.rip == c->trap_rip) {
            *ret = now.rax;
            return 0;
        }
        char sb[16];
        if (is_fault(&si))
            return fail(c, MMLEAK_INJ_ECALL,
                        "%s crashed in thread %d of %d (%s at rip 0x%llx, address %p): the call "
                        "was abandoned and the thread put back where it was, but %d may hold "
                        "locks the call took", what, c->tid, c->pid, signame(sig, sb, sizeof sb),
                        (unsigned long long)now.rip, si.si_addr, c->pid);
        record(c, &si);
        note_clobber(c, &now);
        if (resume_call(c) < 0)
            return fail(c, MMLEAK_INJ_ESYS, "PTRACE_CONT: %s", strerror(errno));
    }
}

static int dlerror_text(struct inj *c, char *buf, size_t cap)
{
    uint64_t e = 0;
    int r = call(c, c->a_dlerror, 0, 0, &e, "dlerror");
    if (r < 0)
        return r;
    if (!e || rd_str(c, e, buf, cap) < 0)
        snprintf(buf, cap, "(no dlerror message)");
    return 0;
}

/* The thread is stopped and safe: run dlopen, dlsym and the function.  1: its stack could
 * not be written (nothing done, try another thread). */
static int inject(struct inj *c, const char *func, const char *arg, long *result)
{
    const char *lib = c->lib;
    size_t nl = strlen(lib) + 1, nf = func ? strlen(func) + 1 : 0, na = arg ? strlen(arg) + 1 : 0;
    char strings[MAX_STRINGS];
    memcpy(strings, lib, nl);
    if (nf)
        memcpy(strings + nl, func, nf);
    if (na)
        memcpy(strings + nl + nf, arg, na);
    uint64_t top = c->saved.rsp - 128; /* the red zone may hold the interrupted code's data */
    uint64_t at = (top - (nl + nf + na)) & ~15UL;
    c->sp = at - 16 - 8; /* (sp + 8) % 16 == 0 at the callee's entry, as after a call */
    uint64_t retaddr = c->trapsig == SIGSEGV ? 0 : c->trapsig ? c->int3 : c->sysinsn;
    c->trap_rip = c->trapsig == SIGSEGV ? 0 : c->trapsig ? c->int3 + 1 : c->sysinsn + 2;
    if (mem_rw(c, at, strings, nl + nf + na, 1) < 0 || mem_rw(c, c->sp, &retaddr, 8, 1) < 0)
        return 1; /* (the main stack below its mapping: the kernel only grows it on faults) */
    uint64_t a_lib = at, a_func = at + nl, a_arg = na ? at + nl + nf : 0;
    /* the calls get a timeout of their own, or what is left of the operation's */
    c->deadline = c->calls_until ? c->calls_until : now_ns() + c->timeout_ns;
    char msg[512];
    uint64_t h = 0, f = 0, r = 0;
    int e = call(c, c->a_dlopen, a_lib, RTLD_NOW_, &h, "dlopen");
    if (e < 0)
        return e;
    if (!h) {
        if ((e = dlerror_text(c, msg, sizeof msg)) < 0)
            return e;
        struct stat a, b;
        char root[64];
        snprintf(root, sizeof root, "/proc/%d/task/%d/root", c->pid, c->mtid);
        const char *hint = stat("/", &a) == 0 && stat(root, &b) == 0 &&
                                   (a.st_dev != b.st_dev || a.st_ino != b.st_ino)
                               ? " (it has another root directory: a container?)"
                               : "";
        return fail(c, MMLEAK_INJ_ELOAD, "dlopen failed in %d: %s%s", c->pid, msg, hint);
    }
    if (!func) {
        *result = (long)h;
        return 0;
    }
    if ((e = call(c, c->a_dlsym, h, a_func, &f, "dlsym")) < 0)
        return e;
    if (!f) {
        if ((e = dlerror_text(c, msg, sizeof msg)) < 0)
            return e;
        return fail(c, MMLEAK_INJ_ELOAD, "dlsym failed in %d: %s", c->pid, msg);
    }
    if ((e = call(c, f, a_arg, 0, &r, func)) < 0)
        return e;
    *result = (long)r;
    return 0;
}

/* Try thread TID.  1: done (the result or a fatal error is set); 0: not usable now. */
static int attempt(struct inj *c, int tid, const char *func, const char *arg, long *result,
                   int *code)
{
    c->tid = tid;
    c->nrec = 0;
    c->in_sigstop = c->modified = c->clobbered = c->mask_set = 0;
    int hi = held_index(c, tid);
    if (hi >= 0) {
        adopt(c, hi); /* already stopped */
    } else {
        if (ptrace(PTRACE_SEIZE, tid, 0, (void *)(long)PTRACE_O_TRACESYSGOOD) < 0) {
            if (errno == ESRCH)
                return 0;
            if (errno == EPERM) {
                *code = explain_eperm(c, tid, "PTRACE_SEIZE");
                return 1;
            }
            *code = fail(c, MMLEAK_INJ_ESYS, "PTRACE_SEIZE %d: %s", tid, strerror(errno));
            return 1;
        }
        c->attached = 1;
        if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) < 0) {
            *code = fail(c, MMLEAK_INJ_ESYS, "PTRACE_INTERRUPT %d: %s", tid, strerror(errno));
            return 1;
        }
        int t = take_stop(c, TS_STOP, 0);
        if (t <= 0) {
            *code = t;
            return t < 0;
        }
    }
    if (!c->seccomp_ok) {
        if (seccomp_check(c, tid, code))
            return 1;
        c->seccomp_ok = 1;
    }
    /* SIGTRAP must be usable for single steps and breakpoints: the kernel would reset the
     * disposition of a blocked or ignored SIGTRAP it forces on the thread */
    uint64_t blocked = 0, ignored = c->ignored;
    if (ptrace(PTRACE_GETSIGMASK, tid, (void *)sizeof blocked, &blocked) < 0)
        blocked = ~0ULL;
    uint64_t segv = 1ULL << (SIGSEGV - 1), trap = 1ULL << (SIGTRAP - 1);
    int can_trap = !((blocked | ignored) & trap);
    int steps = 0, lets = 0, runs = 0;
    int64_t step_until = 0;
    long nap = 300;
    uint64_t last_rip = 0;
    for (;;) {
        if (ptrace(PTRACE_GETREGS, tid, 0, &c->saved) < 0) {
            *code = fail(c, MMLEAK_INJ_ESYS, "PTRACE_GETREGS: %s", strerror(errno));
            return 1;
        }
        int movable;
        const char *why = unsafe_here(c, &c->saved, &movable);
        if (!why && loader_lock_owner(c, tid))
            why = "holding the dynamic loader's lock";
        if (!why)
            break;
        because(c, "thread %d stays %s", tid, why);
        if (now_ns() >= c->deadline) {
            release(c);
            return 0;
        }
        /* Run it to the return of the library call it is in (one round trip); failing
         * that, single steps (one round trip per instruction: slow when the CPUs are busy,
         * but they get out of malloc for sure); then let it run a little and stop it again. */
        int r = 0;
        if (movable && can_trap && runs < MAX_RUNS) {
            runs++;
            r = run_to_caller(c, RUN_NS);
            if (r == 2) {
                runs = MAX_RUNS;
                r = 0;
            } else if (r <= 0) {
                *code = r;
                return r < 0;
            } else {
                continue;
            }
        }
        if (movable && can_trap && steps < MAX_STEPS) {
            if (!steps++)
                step_until = now_ns() + STEP_NS;
            else if (now_ns() >= step_until)
                steps = MAX_STEPS;
            r = step_out(c, &c->saved);
            if (r == -10) /* let go: a fault was delivered */
                return 0;
            if (r < -10) {
                *code = r + 10;
                return 1;
            }
            if (r < 0) {
                *code = r;
                return 1;
            }
        }
        if (r == 0) {
            if (lets++ >= MAX_LETS) {
                release(c);
                return 0;
            }
            /* not moved since last time: it had no CPU yet, give it longer */
            nap = c->saved.rip == last_rip ? (nap * 2 > 2400 ? 2400 : nap * 2) : 300;
            last_rip = c->saved.rip;
            r = let_run(c, nap);
            if (r <= 0) {
                *code = r;
                return r < 0;
            }
        }
    }
    /* room on its stack? */
    const struct mapent *m = map_at(c, c->saved.rsp - 1);
    if (!m && load_maps(c) == 0)
        m = map_at(c, c->saved.rsp - 1);
    if (!m || m->perm[0] != 'r' || m->perm[1] != 'w' ||
        (c->saved.rsp - m->start < MIN_STACK && strcmp(m->path, "[stack]"))) {
        because(c, "thread %d has too little stack below %#llx", tid,
                (unsigned long long)c->saved.rsp);
        release(c);
        return 0;
    }
    /* how the call will end: SIGSEGV at 0, or SIGTRAP at an int3 */
    if (!((blocked | ignored) & segv)) {
        c->trapsig = SIGSEGV;
    } else if (can_trap && find_int3(c)) {
        c->trapsig = SIGTRAP;
    } else if (find_syscall_insn(c)) {
        c->trapsig = 0;         /* see call_return_by_syscall */
    } else {
        because(c, "thread %d blocks or ignores both SIGSEGV and SIGTRAP", tid);
        release(c);
        return 0;
    }
    /* extended state: SSE/AVX registers, x87 and MXCSR control words */
    struct iovec iov = {c->xbuf, XSTATE_MAX};
    c->xkind = 0;
    if (c->xbuf && ptrace(PTRACE_GETREGSET, tid, (void *)(long)NT_X86_XSTATE, &iov) == 0) {
        c->xkind = 1;
        c->xlen = iov.iov_len;
    } else if (ptrace(PTRACE_GETFPREGS, tid, 0, &c->fpregs) == 0) {
        c->xkind = 2;
    }
    /* During the calls every signal but the two a call may end with (as the thread had
     * them) is blocked: the others then wait in the kernel's queues, siginfo and order
     * intact, and a stream of them cannot starve the calls (each one would stop the thread
     * before it runs an instruction); release restores the mask. */
    if (ptrace(PTRACE_GETSIGMASK, tid, (void *)sizeof c->mask_saved, &c->mask_saved) == 0) {
        uint64_t calls_mask = ~(segv | trap) | (c->mask_saved & (segv | trap));
        c->mask_set = ptrace(PTRACE_SETSIGMASK, tid, (void *)sizeof calls_mask,
                             &calls_mask) == 0;
    }
    *code = inject(c, func, arg, result);
    release(c);
    if (*code == 1) {
        *code = 0;
        because(c, "the stack of thread %d could not be written below %#llx", tid,
                (unsigned long long)c->saved.rsp);
        return 0;
    }
    return 1;
}

/* TIMEOUT_MS: the search for a thread; TOTAL_MS: all of it (0: the calls get TIMEOUT_MS of
 * their own). */
static int inject_call(int pid, const char *lib, const char *func, const char *arg,
                       int timeout_ms, int total_ms, long *result, char *err, size_t errlen)
{
    struct inj ctx, *c = &ctx;
    int64_t start = now_ns();
    memset(c, 0, sizeof *c);
    c->pid = pid;
    c->me = getpid();
    c->err = err;
    c->errlen = errlen;
    c->memfd = -1;
    c->lib = lib;
    if (err && errlen)
        err[0] = 0;
    long dummy;
    if (!result)
        result = &dummy;
    *result = 0;
    c->timeout_ns = (int64_t)timeout_ms * 1000000;
    c->deadline = start + c->timeout_ns;
    c->calls_until = total_ms > 0 ? start + (int64_t)total_ms * 1000000 : 0;
    if (pid <= 0)
        return fail(c, MMLEAK_INJ_EINVAL, "no such process %d", pid);
    if (!lib || lib[0] != '/')
        return fail(c, MMLEAK_INJ_EINVAL, "the library must be an absolute path: %s",
                    lib ? lib : "(null)");
    size_t total = strlen(lib) + 1 + (func ? strlen(func) + 1 : 0) + (arg ? strlen(arg) + 1 : 0);
    if (total > MAX_STRINGS)
        return fail(c, MMLEAK_INJ_EINVAL, "library path, function name and argument are longer "
                    "than %d bytes", MAX_STRINGS);
    if (pid == c->me)
        return fail(c, MMLEAK_INJ_EINVAL, "%d is this process itself", pid);
    char buf[4096];
    if (read_status(pid, 0, buf, sizeof buf) < 0 || (kill(pid, 0) < 0 && errno == ESRCH))
        return fail(c, MMLEAK_INJ_ESRCH, "no such process %d", pid);
    long tgid = field_long(buf, "Tgid", pid);
    if (tgid != pid)
        return fail(c, MMLEAK_INJ_EINVAL, "%d is a thread of process %ld: give the process id",
                    pid, tgid);
    char tname[64];
    int tracer = tracer_of(pid, 0, tname, sizeof tname);
    if (tracer > 0)
        return fail(c, MMLEAK_INJ_EPERM, "%d is being traced by another process (%d %s)", pid,
                    tracer, tname[0] ? tname : "?");
    c->mtid = pid;
    const char *state = field(buf, "State");
    if (state && (*state == 'Z' || *state == 'X')) { /* the main thread exited: others? */
        char path[64], sbuf[512];
        snprintf(path, sizeof path, "/proc/%d/task", pid);
        DIR *d = opendir(path);
        struct dirent *e;
        c->mtid = 0;
        while (d && !c->mtid && (e = readdir(d))) {
            int tid = atoi(e->d_name);
            snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
            char *rp = tid > 0 && slurp(path, sbuf, sizeof sbuf) > 0 ? strrchr(sbuf, ')') : NULL;
            if (rp && rp[1] && rp[2] != 'Z' && rp[2] != 'X')
                c->mtid = tid;
        }
        if (d)
            closedir(d);
        if (!c->mtid)
            return fail(c, MMLEAK_INJ_ESRCH, "%d is a zombie: it exited and was not reaped", pid);
    }
    const char *feat = field(buf, "x86_Thread_features");
    char *shstk = feat ? strstr(feat, "shstk") : NULL;
    if (shstk && !memchr(feat, '\n', shstk - feat))
        return fail(c, MMLEAK_INJ_EUNSUPP, "%d uses shadow stacks (CET): not supported", pid);

    int code = survey(c);
    c->xbuf = malloc(XSTATE_MAX);
    for (int round = 0; code == 0; round++) {
        if (now_ns() >= c->deadline) {
            code = fail(c, MMLEAK_INJ_EBUSY,
                        "timed out after %d ms waiting for a thread of %d that is safe to use "
                        "(%s)", timeout_ms, pid, c->why[0] ? c->why : "none");
            break;
        }
        if (round)
            nap_us(round < 5 ? 200 : round < 20 ? 1000 : 5000);
        if (read_status(pid, 0, buf, sizeof buf) < 0) {
            code = gone(c, "while being attached");
            break;
        }
        int owner = loader_lock_owner(c, 0);
        if (owner) {
            because(c, "thread %d holds the dynamic loader's lock: a dlopen, dlclose or library "
                       "constructor that does not return", owner);
            continue;
        }
        c->ignored = field(buf, "SigIgn") ? strtoull(field(buf, "SigIgn"), NULL, 16) : 0;
        /* the busy threads stopped for this round (every other round from the fifth runs as
         * they are, in case one of them is what the others wait for) */
        if (!c->hold_off && (round < 4 || round % 2 == 0)) {
            int h = hold_running(c);
            if (h == 0)
                h = settle_held(c);
            if (h < 0) {
                code = h;
                break;
            }
        }
        struct thr *v = NULL;
        int n, stopped, alive;
        if (list_threads(c, &v, &n, &stopped, &alive) < 0) {
            code = gone(c, "while being attached");
            break;
        }
        if (!alive) {
            free(v);
            code = fail(c, MMLEAK_INJ_ESRCH, "%d is a zombie: it exited and was not reaped", pid);
            break;
        }
        if (stopped == alive) {
            free(v);
            code = fail(c, MMLEAK_INJ_EBUSY,
                        "%d is stopped (state T): resume it first (kill -CONT %d)", pid, pid);
            break;
        }
        if (!n)
            because(c, "all threads are in uninterruptible sleep, in mmap/brk-like calls or in "
                       "the loader");
        int done = 0;
        for (int i = 0; i < n && i < 16 && !done && now_ns() < c->deadline; i++)
            done = attempt(c, v[i].tid, func, arg, result, &code);
        free(v);
        if (done)
            break;
        unhold_all(c);
        if (code == 0 && !c->have_err)
            continue;
    }
    if (c->attached)
        release(c);
    unhold_all(c);
    /* a failure that was the process exiting under us (its memory map already gone, its
     * threads no longer attachable) says so: an exit takes a few ms to show everywhere */
    if ((code == MMLEAK_INJ_ESYS || code == MMLEAK_INJ_EUNSUPP || code == MMLEAK_INJ_EPERM) &&
        !c->stuck) {
        for (int i = 0; i < 10; i++) {
            if (!process_alive(pid)) {
                c->have_err = 0;
                code = gone(c, "while being attached");
                break;
            }
            nap_us(10000);
        }
    }
    if (c->memfd >= 0)
        close(c->memfd);
    free(c->xbuf);
    free(c->mapsbuf);
    free(c->maps);
    free(c->unsafe);
    free(c->ldx);
    free(c->libx);
    free(c->held);
    free(c->recs);
    return code;
}

EXPORT int mmleak_inject_call(int pid, const char *lib, const char *func, const char *arg,
                           int timeout_ms, long *result, char *err, size_t errlen)
{
    if (timeout_ms <= 0)
        timeout_ms = DEFAULT_TIMEOUT_MS;
    return inject_call(pid, lib, func, arg, timeout_ms, 0, result, err, errlen);
}

EXPORT int mmleak_inject_call_within(int pid, const char *lib, const char *func, const char *arg,
                                  int search_ms, int total_ms, long *result, char *err,
                                  size_t errlen)
{
    if (total_ms <= 0)
        total_ms = DEFAULT_TIMEOUT_MS;
    if (search_ms <= 0 || search_ms > total_ms)
        search_ms = search_ms <= 0 ? total_ms / 4 * 3 : total_ms;
    return inject_call(pid, lib, func, arg, search_ms, total_ms, result, err, errlen);
}

#endif
