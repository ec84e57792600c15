/* mmleak-inject.c: make a running process load a shared library and call a function in it,
 * with ptrace, stopping only its busy threads and only meanwhile (x86-64 Linux, glibc
 * targets).  Built into
 * mmleak.so; mmleak.py loads it with ctypes (the tracer stays dormant there) for
 * `mmleak.py attach PID` / `detach PID`.
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
 * Signals: the thread's signal mask is never changed.  A signal that reaches the thread
 * while we hold it (signal-delivery-stop) is recorded and not delivered then; at the end the
 * first one is delivered by PTRACE_DETACH with its own siginfo, any others are queued again
 * to the thread (rt_tgsigqueueinfo with their siginfo when the kernel allows it, that is for
 * sigqueue-like codes; tgkill otherwise).  Standard signals recorded twice count once (the
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
 *  - FUNC runs on the hijacked thread with its signal mask and TLS; it must not need locks
 *    that thread may hold (stdio locks of a stream it reads, application locks).
 *  - If this process dies while a call runs in the target, the call returns to address 0
 *    untraced and the target gets SIGSEGV.  If a stopped thread cannot be brought back
 *    (a thread that entered D state for more than the timeout + 5 s), it stays traced by
 *    this process until this process exits (the kernel then lets it go): callers that stay
 *    alive may want to run this in a child process.
 *  - A running thread is stopped as a debugger stops it: one that enters a system call just
 *    as it is interrupted (microseconds after it was seen running) sees the call end as
 *    after a signal: restarted, or EINTR for epoll_wait and the others of rule 1's rank 1.
 *  - A busy thread that holds a lock FUNC or dlopen needs while it is not inside one of the
 *    libraries above (an application lock around an allocation: the call waits on it) costs
 *    the call the steps of "Holding the busy threads" (up to about 0.5 s more) before all are
 *    let go; then the call runs beside them as it would have without holding.
 *  - The kernel keeps one restart record per thread for an interrupted nanosleep, poll or
 *    futex wait with timeout.  If the hijacked thread was in one, and a signal, a stop or
 *    the timeout interrupted such a sleep inside the call too, the thread's own sleep is
 *    restarted from its start (its full duration again) rather than for the time left.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stddef.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/futex.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#define API __attribute__((visibility("default")))

enum {
    MMLEAK_INJ_OK = 0,
    MMLEAK_INJ_EINVAL = -1,
    MMLEAK_INJ_ESRCH = -2,
    MMLEAK_INJ_EPERM = -3,
    MMLEAK_INJ_EUNSUPP = -4,
    MMLEAK_INJ_EBUSY = -5,
    MMLEAK_INJ_ELOAD = -6,
    MMLEAK_INJ_ECALL = -7,
    MMLEAK_INJ_ESYS = -8,
};

API int mmleak_inject_abi(void) { return 1; }

#if !defined(__x86_64__) || !defined(__linux__)

API int mmleak_inject_call(int pid, const char *lib, const char *func, const char *arg,
                           int timeout_ms, long *result, char *err, size_t errlen)
{
    (void)pid, (void)lib, (void)func, (void)arg, (void)timeout_ms, (void)result;
    if (err && errlen)
        snprintf(err, errlen, "attaching to a running process is implemented for x86-64 only");
    return MMLEAK_INJ_EUNSUPP;
}

API int mmleak_inject_call_within(int pid, const char *lib, const char *func, const char *arg,
                                  int search_ms, int total_ms, long *result, char *err,
                                  size_t errlen)
{
    (void)search_ms;
    return mmleak_inject_call(pid, lib, func, arg, total_ms, result, err, errlen);
}

#else

#define DEFAULT_TIMEOUT_MS 10000
#define GRACE_NS 5000000000LL   /* past the deadline, for a thread that must still stop */
#define MAX_STEPS 4000          /* single steps to get a thread out of libc/ld.so */
#define STEP_NS 50000000LL      /* and at most that long (each step waits for a CPU) */
#define MAX_LETS 8              /* "let it run a little" per thread and round */
#define MAX_RUNS 3              /* runs to the return of a library call */
#define RUN_NS 20000000LL       /* each at most that long */
#define SETTLE_BATCH 4          /* held threads run out of libc at once (the others stopped) */
#define SETTLE_RUN_NS 2000000LL /* for at most that long */
#define SETTLE_NS 50000000LL    /* and all those runs, per round */
#define ASLEEP_NS 2000000LL     /* a call asleep that long lets the unsafe held threads go */
#define UNHOLD_STEP 8           /* then that many every ASLEEP_NS it still sleeps */
#define ASLEEP_ALL_NS 500000000LL /* all of them, that long after the last such step */
#define MIN_STACK (64 * 1024)
#define MAX_STRINGS 8192
#define MAX_RECS 64
#define XSTATE_MAX (64 * 1024)
#define RTLD_G_MAX 16384
#define ERESTARTSYS_ 512
#define ERESTARTNOINTR_ 513
#define ERESTARTNOHAND_ 514
#define ERESTART_RESTARTBLOCK_ 516
#define RTLD_NOW_ 2

struct mapent {
    uint64_t start, end, off, ino;
    unsigned dmaj, dmin;
    char perm[5];
    const char *path; /* "" for anonymous; " (deleted)" stripped */
};

struct range {
    uint64_t lo, hi;
};

struct inj {
    int pid, me;
    int mtid; /* a live thread, for its memory map: the main thread may have exited */
    int64_t deadline, timeout_ns;
    char *err;
    size_t errlen;
    int have_err;
    const char *lib;
    /* the target's memory map and what we found in it */
    char *mapsbuf;
    struct mapent *maps;
    size_t nmaps;
    struct range *unsafe; /* user code where a thread is not used (libc, ld.so, LIB...) */
    size_t nunsafe;
    struct range *ldx; /* ld.so's code: syscalls from there are the loader's */
    size_t nldx;
    uint64_t libc_base, libc_xlo, libc_xhi;
    int seccomp_ok;     /* its seccomp filters allow what dlopen and mmleak do */
    uint64_t a_dlopen, a_dlsym, a_dlerror;
    uint64_t rtld_g, rtld_gsize;
    uint64_t int3; /* an 0xCC byte in libc's code; 0 unknown, 1 none */
    uint64_t sysinsn; /* a `syscall` (0f 05) in libc's code; 0 unknown, 1 none */
    int at_sysexit;   /* stopped at the exit of the getpid our call's return became */
    int memfd;
    /* the thread held */
    int tid, attached, stuck, in_sigstop, modified, clobbered, bp_set;
    struct user_regs_struct saved;
    unsigned char *xbuf;
    size_t xlen;
    int xkind; /* 0 none, 1 NT_X86_XSTATE, 2 FPREGS */
    struct user_fpregs_struct fpregs;
    siginfo_t recs[MAX_RECS];
    int nrec;
    uint64_t sp;
    int trapsig;
    uint64_t trap_rip;
    char why[200]; /* last reason a thread was not used, for the timeout message */
    /* the busy threads held stopped meanwhile (see "Holding the busy threads") */
    struct held *held;
    int nheld, capheld;
    int hold_off;            /* no holding any more in this operation (it failed once) */
    struct range *libx;      /* LIB's code: a thread with a frame there is inside LIB */
    size_t nlibx;
    uint64_t ignored;        /* the signals the process ignores (SigIgn), read once */
    int64_t calls_until;     /* the calls' deadline (0: timeout_ns from the thread's choice) */
};

struct held {
    int tid;
    int in_sigstop; /* stopped at our own breakpoint (nothing to deliver) */
    int unsafe;     /* may it hold a lock our calls need?  0, 1, 2: see held_risk */
};

/* ---- small helpers ------------------------------------------------------------------ */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

__attribute__((format(printf, 3, 4))) static int fail(struct inj *c, int code, const char *fmt,
                                                       ...)
{
    if (!c->have_err && c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
        for (char *p = c->err; *p; p++)
            if (*p == '\n')
                *p = ' ';
        c->have_err = 1;
    }
    return code;
}

__attribute__((format(printf, 2, 3))) static void because(struct inj *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
}

/* Read a whole small file into BUF (NUL-terminated); -1 with errno on failure. */
static ssize_t slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = 0;
    while (n < cap - 1) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        if (r == 0)
            break;
        n += r;
    }
    close(fd);
    buf[n] = 0;
    return n;
}

/* The text after "KEY:" in a /proc status file, or NULL. */
static const char *field(const char *buf, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, key, k) && p[k] == ':') {
            p += k + 1;
            while (*p == ' ' || *p == '\t')
                p++;
            return p;
        }
    return NULL;
}

static long field_long(const char *buf, const char *key, long dflt)
{
    const char *p = field(buf, key);
    return p ? strtol(p, NULL, 10) : dflt;
}

static int read_status(int pid, int tid, char *buf, size_t cap)
{
    char path[64];
    if (tid > 0)
        snprintf(path, sizeof path, "/proc/%d/task/%d/status", pid, tid);
    else
        snprintf(path, sizeof path, "/proc/%d/status", pid);
    return slurp(path, buf, cap) < 0 ? -1 : 0;
}

static const char *signame(int sig, char *buf, size_t cap)
{
    static const char *const names[] = {
        [SIGHUP] = "SIGHUP",   [SIGINT] = "SIGINT",       [SIGQUIT] = "SIGQUIT",
        [SIGILL] = "SIGILL",   [SIGTRAP] = "SIGTRAP",     [SIGABRT] = "SIGABRT",
        [SIGBUS] = "SIGBUS",   [SIGFPE] = "SIGFPE",       [SIGKILL] = "SIGKILL",
        [SIGUSR1] = "SIGUSR1", [SIGSEGV] = "SIGSEGV",     [SIGUSR2] = "SIGUSR2",
        [SIGPIPE] = "SIGPIPE", [SIGALRM] = "SIGALRM",     [SIGTERM] = "SIGTERM",
        [SIGCHLD] = "SIGCHLD", [SIGCONT] = "SIGCONT",     [SIGSTOP] = "SIGSTOP",
        [SIGTSTP] = "SIGTSTP", [SIGTTIN] = "SIGTTIN",     [SIGTTOU] = "SIGTTOU",
        [SIGSYS] = "SIGSYS",   [SIGXCPU] = "SIGXCPU",     [SIGPROF] = "SIGPROF",
    };
    if (sig > 0 && sig < (int)(sizeof names / sizeof *names) && names[sig])
        return names[sig];
    snprintf(buf, cap, "signal %d", sig);
    return buf;
}

static int is_fault_sig(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE ||
           sig == SIGTRAP || sig == SIGSYS;
}

/* A fault the kernel raised for the thread's own instruction (not a kill() of one). */
static int is_fault(const siginfo_t *si)
{
    return is_fault_sig(si->si_signo) && si->si_code > 0;
}

/* ---- the target's memory -------------------------------------------------------------- */

static int mem_rw(struct inj *c, uint64_t addr, void *buf, size_t len, int write)
{
    struct iovec l = {buf, len}, r = {(void *)addr, len};
    ssize_t n = write ? process_vm_writev(c->mtid, &l, 1, &r, 1, 0)
                      : process_vm_readv(c->mtid, &l, 1, &r, 1, 0);
    if (n == (ssize_t)len)
        return 0;
    if (n >= 0)
        errno = EFAULT;
    if (errno == EFAULT)
        return -1;
    /* no process_vm_* (seccomp, old kernel): /proc/PID/mem */
    if (c->memfd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task/%d/mem", c->pid, c->mtid);
        c->memfd = open(path, O_RDWR | O_CLOEXEC);
        if (c->memfd < 0)
            c->memfd = open(path, O_RDONLY | O_CLOEXEC);
        if (c->memfd < 0)
            return -1;
    }
    n = write ? pwrite(c->memfd, buf, len, (off_t)addr) : pread(c->memfd, buf, len, (off_t)addr);
    if (n >= 0 && n != (ssize_t)len)
        errno = EFAULT;
    return n == (ssize_t)len ? 0 : -1;
}

static int rd(struct inj *c, uint64_t addr, void *buf, size_t len)
{
    return mem_rw(c, addr, buf, len, 0);
}

/* A NUL-terminated string of the target, cut to CAP-1 bytes. */
static int rd_str(struct inj *c, uint64_t addr, char *buf, size_t cap)
{
    size_t n = 0;
    while (n < cap - 1) {
        size_t chunk = 4096 - ((addr + n) & 4095);
        if (chunk > cap - 1 - n)
            chunk = cap - 1 - n;
        if (rd(c, addr + n, buf + n, chunk) < 0)
            return -1;
        void *z = memchr(buf + n, 0, chunk);
        if (z)
            return 0;
        n += chunk;
    }
    buf[cap - 1] = 0;
    return 0;
}

/* ---- /proc/PID/maps ------------------------------------------------------------------- */

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

static int load_maps(struct inj *c)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/maps", c->pid, c->mtid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            close(fd);
            errno = ENOMEM;
            return -1;
        }
        if (n + 4096 > cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                continue;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            free(buf);
            errno = e;
            return -1;
        }
        if (r == 0)
            break;
        n += r;
    }
    close(fd);
    buf[n] = 0;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += buf[i] == '\n';
    struct mapent *m = calloc(lines + 1, sizeof *m);
    if (!m) {
        free(buf);
        errno = ENOMEM;
        return -1;
    }
    size_t k = 0;
    for (char *p = buf, *nl; p < buf + n; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl)
            nl = buf + n;
        *nl = 0;
        struct mapent *e = &m[k];
        int pos = 0;
        if (sscanf(p, "%lx-%lx %4s %lx %x:%x %lu %n", &e->start, &e->end, e->perm, &e->off,
                   &e->dmaj, &e->dmin, &e->ino, &pos) < 7)
            continue;
        char *q = p + pos;
        while (*q == ' ')
            q++;
        size_t ql = strlen(q);
        if (ql > 10 && !strcmp(q + ql - 10, " (deleted)"))
            q[ql - 10] = 0;
        e->path = q;
        k++;
    }
    free(c->mapsbuf);
    free(c->maps);
    c->mapsbuf = buf;
    c->maps = m;
    c->nmaps = k;
    return 0;
}

static const struct mapent *map_at(struct inj *c, uint64_t addr)
{
    for (size_t i = 0; i < c->nmaps; i++)
        if (addr >= c->maps[i].start && addr < c->maps[i].end)
            return &c->maps[i];
    return NULL;
}

static int in_ranges(const struct range *r, size_t n, uint64_t a)
{
    for (size_t i = 0; i < n; i++)
        if (a >= r[i].lo && a < r[i].hi)
            return 1;
    return 0;
}

static int add_range(struct range **r, size_t *n, uint64_t lo, uint64_t hi)
{
    struct range *nr = realloc(*r, (*n + 1) * sizeof **r);
    if (!nr)
        return -1;
    nr[*n].lo = lo;
    nr[*n].hi = hi;
    *r = nr;
    (*n)++;
    return 0;
}

enum { O_OTHER, O_LIBC, O_LD, O_LIBDL, O_LIBPTHREAD, O_MUSL, O_ALLOC };

static int classify(const char *path)
{
    const char *b = base_name(path);
    if (!strncmp(b, "ld-musl-", 8) || !strncmp(b, "libc.musl-", 10))
        return O_MUSL;
    if (!strncmp(b, "ld-linux", 8) || (!strncmp(b, "ld-", 3) && strstr(b, ".so")))
        return O_LD;
    if (!strcmp(b, "libc.so.6") || (!strncmp(b, "libc-", 5) && strstr(b, ".so")))
        return O_LIBC;
    if (!strncmp(b, "libdl.so", 8) || !strncmp(b, "libdl-", 6))
        return O_LIBDL;
    if (!strncmp(b, "libpthread.so", 13) || !strncmp(b, "libpthread-", 11))
        return O_LIBPTHREAD;
    if (strstr(b, "malloc") || strstr(b, "hoard"))
        return O_ALLOC;
    return O_OTHER;
}

/* Load address of the object mapped from PATH (its mapping at file offset 0). */
static uint64_t object_base(struct inj *c, const char *path)
{
    for (size_t i = 0; i < c->nmaps; i++)
        if (c->maps[i].off == 0 && !strcmp(c->maps[i].path, path))
            return c->maps[i].start;
    return 0;
}

/* ---- dynamic symbols, read from the target's memory -------------------------------- */

struct elfdyn {
    uint64_t bias, symtab, strtab, strsz, gnuhash, hash, versym;
};

static int elf_open(struct inj *c, uint64_t base, struct elfdyn *d)
{
    Elf64_Ehdr eh;
    memset(d, 0, sizeof *d);
    if (rd(c, base, &eh, sizeof eh) < 0)
        return -1;
    errno = ENOEXEC;
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG))
        return -1;
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_machine != EM_X86_64)
        return -2;
    if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > 64)
        return -1;
    Elf64_Phdr ph[64];
    if (rd(c, base + eh.e_phoff, ph, eh.e_phnum * sizeof *ph) < 0)
        return -1;
    uint64_t lowest = UINT64_MAX, dyn = 0;
    for (int i = 0; i < eh.e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr < lowest)
            lowest = ph[i].p_vaddr;
        if (ph[i].p_type == PT_DYNAMIC)
            dyn = ph[i].p_vaddr;
    }
    if (lowest == UINT64_MAX || !dyn)
        return -1;
    d->bias = base - (lowest & ~4095UL);
    Elf64_Dyn dv[64];
    uint64_t at = d->bias + dyn;
    for (int chunk = 0; chunk < 16; chunk++, at += sizeof dv) {
        if (rd(c, at, dv, sizeof dv) < 0)
            return -1;
        for (int i = 0; i < 64; i++) {
            /* ld.so relocates these in place on x86-64; tolerate both forms */
            uint64_t v = dv[i].d_un.d_ptr;
            uint64_t p = (d->bias && v < d->bias) ? v + d->bias : v;
            switch (dv[i].d_tag) {
            case DT_NULL:
                return d->symtab && d->strtab && (d->gnuhash || d->hash) ? 0 : -1;
            case DT_SYMTAB: d->symtab = p; break;
            case DT_STRTAB: d->strtab = p; break;
            case DT_STRSZ: d->strsz = v; break;
            case DT_GNU_HASH: d->gnuhash = p; break;
            case DT_HASH: d->hash = p; break;
            case DT_VERSYM: d->versym = p; break;
            }
        }
    }
    return -1;
}

/* Is symbol IDX called NAME, defined, and (with versions) the default version?
 * Returns 2 default, 1 defined but hidden version, 0 no. */
static int sym_match(struct inj *c, struct elfdyn *d, uint32_t idx, const char *name,
                     Elf64_Sym *out)
{
    Elf64_Sym s;
    if (rd(c, d->symtab + (uint64_t)idx * sizeof s, &s, sizeof s) < 0)
        return 0;
    if (s.st_shndx == SHN_UNDEF || !s.st_value)
        return 0;
    size_t len = strlen(name) + 1;
    char nm[128];
    if (len > sizeof nm || (d->strsz && s.st_name + len > d->strsz))
        return 0;
    if (rd(c, d->strtab + s.st_name, nm, len) < 0 || memcmp(nm, name, len))
        return 0;
    *out = s;
    if (d->versym) {
        uint16_t v;
        if (rd(c, d->versym + (uint64_t)idx * 2, &v, 2) == 0 && (v & 0x8000))
            return 1;
    }
    return 2;
}

/* Address (and size) of the dynamic symbol NAME, or 0. */
static uint64_t elf_sym(struct inj *c, struct elfdyn *d, const char *name, uint64_t *size)
{
    Elf64_Sym best, s;
    int found = 0;
    if (d->gnuhash) {
        uint32_t h = 5381, hdr[4];
        for (const unsigned char *p = (const unsigned char *)name; *p; p++)
            h = h * 33 + *p;
        if (rd(c, d->gnuhash, hdr, sizeof hdr) < 0 || !hdr[0])
            return 0;
        uint64_t buckets = d->gnuhash + 16 + (uint64_t)hdr[2] * 8;
        uint64_t chain = buckets + (uint64_t)hdr[0] * 4;
        uint32_t idx;
        if (rd(c, buckets + (uint64_t)(h % hdr[0]) * 4, &idx, 4) < 0 || idx < hdr[1])
            return 0;
        for (int guard = 0; guard < 100000; guard++, idx++) {
            uint32_t hv;
            if (rd(c, chain + (uint64_t)(idx - hdr[1]) * 4, &hv, 4) < 0)
                break;
            if ((hv | 1) == (h | 1)) {
                int m = sym_match(c, d, idx, name, &s);
                if (m && (m == 2 || !found)) {
                    best = s;
                    found = m;
                    if (m == 2)
                        break;
                }
            }
            if (hv & 1)
                break;
        }
    } else {
        uint32_t hdr[2], h = 0, g, idx;
        for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
            h = (h << 4) + *p;
            g = h & 0xf0000000;
            if (g)
                h ^= g >> 24;
            h &= ~g;
        }
        if (rd(c, d->hash, hdr, sizeof hdr) < 0 || !hdr[0])
            return 0;
        uint64_t chain = d->hash + 8 + (uint64_t)hdr[0] * 4;
        if (rd(c, d->hash + 8 + (uint64_t)(h % hdr[0]) * 4, &idx, 4) < 0)
            return 0;
        for (int guard = 0; idx && idx < hdr[1] && guard < 100000; guard++) {
            int m = sym_match(c, d, idx, name, &s);
            if (m && (m == 2 || !found)) {
                best = s;
                found = m;
                if (m == 2)
                    break;
            }
            if (rd(c, chain + (uint64_t)idx * 4, &idx, 4) < 0)
                break;
        }
    }
    if (!found || ELF64_ST_TYPE(best.st_info) == STT_GNU_IFUNC)
        return 0;
    if (size)
        *size = best.st_size;
    return d->bias + best.st_value;
}

/* ---- permission problems, explained ------------------------------------------------ */

static int has_cap_sys_ptrace(void)
{
    char buf[4096];
    if (slurp("/proc/self/status", buf, sizeof buf) < 0)
        return geteuid() == 0;
    const char *p = field(buf, "CapEff");
    return p ? (strtoull(p, NULL, 16) >> 19) & 1 : geteuid() == 0;
}

static int is_descendant(int pid, int me)
{
    char buf[4096], path[64];
    for (int guard = 0; pid > 1 && guard < 4096; guard++) {
        snprintf(path, sizeof path, "/proc/%d/status", pid);
        if (slurp(path, buf, sizeof buf) < 0)
            return 0;
        pid = (int)field_long(buf, "PPid", 0);
        if (pid == me)
            return 1;
    }
    return 0;
}

static int tracer_of(int pid, int tid, char *name, size_t cap)
{
    char buf[4096], path[64];
    if (read_status(pid, tid, buf, sizeof buf) < 0)
        return 0;
    int t = (int)field_long(buf, "TracerPid", 0);
    name[0] = 0;
    if (t > 0) {
        snprintf(path, sizeof path, "/proc/%d/comm", t);
        if (slurp(path, name, cap) > 0)
            name[strcspn(name, "\n")] = 0;
    }
    return t;
}

static int explain_eperm(struct inj *c, int tid, const char *what)
{
    char buf[4096], tname[64];
    int pid = c->pid;
    int t = tracer_of(pid, tid > 0 ? tid : 0, tname, sizeof tname);
    if (t > 0 && t != c->me)
        return fail(c, MMLEAK_INJ_EPERM, "%d is being traced by another process (%d %s)", pid,
                    t, tname[0] ? tname : "?");
    int cap = has_cap_sys_ptrace();
    if (read_status(pid, 0, buf, sizeof buf) < 0)
        return fail(c, MMLEAK_INJ_ESRCH, "no such process %d", pid);
    unsigned long u[4] = {0}, g[4] = {0};
    const char *p = field(buf, "Uid"), *q = field(buf, "Gid");
    if (p)
        sscanf(p, "%lu %lu %lu %lu", &u[0], &u[1], &u[2], &u[3]);
    if (q)
        sscanf(q, "%lu %lu %lu %lu", &g[0], &g[1], &g[2], &g[3]);
    uid_t ru = getuid();
    gid_t rg = getgid();
    if (!cap && (u[0] != ru || u[1] != ru || u[2] != ru))
        return fail(c, MMLEAK_INJ_EPERM,
                    "%d belongs to another user (uid %lu): run as that user or as root", pid,
                    u[0] != ru ? u[0] : u[1] != ru ? u[1] : u[2]);
    if (!cap && (g[0] != rg || g[1] != rg || g[2] != rg))
        return fail(c, MMLEAK_INJ_EPERM,
                    "%d runs with another group (gid %lu): run as root", pid,
                    g[0] != rg ? g[0] : g[1] != rg ? g[1] : g[2]);
    struct stat st;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid); /* root's when not dumpable */
    if (!cap && stat(path, &st) == 0 && st.st_uid != (uid_t)u[1])
        return fail(c, MMLEAK_INJ_EPERM,
                    "%d is not dumpable (set-uid or set-gid program, file capabilities, or "
                    "prctl(PR_SET_DUMPABLE, 0)): only root can attach to it", pid);
    char ys[16];
    int scope = slurp("/proc/sys/kernel/yama/ptrace_scope", ys, sizeof ys) > 0 ? atoi(ys) : 0;
    if (scope >= 3)
        return fail(c, MMLEAK_INJ_EPERM,
                    "not permitted to trace %d: kernel.yama.ptrace_scope is %d (no process may "
                    "be traced until reboot)", pid, scope);
    if (scope == 2 && !cap)
        return fail(c, MMLEAK_INJ_EPERM,
                    "not permitted to trace %d: kernel.yama.ptrace_scope is 2 (run as root)", pid);
    if (scope == 1 && !cap && !is_descendant(pid, c->me))
        return fail(c, MMLEAK_INJ_EPERM,
                    "not permitted to trace %d: kernel.yama.ptrace_scope is 1 and %d is not a "
                    "descendant (run as root, or set it to 0)", pid, pid);
    return fail(c, MMLEAK_INJ_EPERM,
                "not permitted to trace %d (%s: a security module, seccomp or a user namespace "
                "forbids it)", pid, what);
}

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
static int loader_lock_owner(struct inj *c, int only)
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
static int process_alive(int pid);

static int wait_tid(struct inj *c, int tid, int *st, int64_t until)
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

static void unhold_all(struct inj *c);

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

#define DR_OFF(i) ((void *)(offsetof(struct user, u_debugreg) + (i) * sizeof(long)))

/* Remove our hardware breakpoint: it would outlive PTRACE_DETACH (and kill the process). */
static void clear_bp(struct inj *c)
{
    if (!c->bp_set)
        return;
    ptrace(PTRACE_POKEUSER, c->tid, DR_OFF(7), 0);
    ptrace(PTRACE_POKEUSER, c->tid, DR_OFF(0), 0);
    c->bp_set = 0;
}

static int64_t hard_until(struct inj *c) { return c->deadline + GRACE_NS; }

static void record(struct inj *c, const siginfo_t *si)
{
    if (si->si_signo < SIGRTMIN)
        for (int i = 0; i < c->nrec; i++)
            if (c->recs[i].si_signo == si->si_signo)
                return;
    if (c->nrec < MAX_RECS)
        c->recs[c->nrec++] = *si;
}

static void requeue(struct inj *c, const siginfo_t *si)
{
    if (si->si_code < 0 && si->si_code != SI_TKILL &&
        syscall(SYS_rt_tgsigqueueinfo, c->pid, c->tid, si->si_signo, si) == 0)
        return;
    syscall(SYS_tgkill, c->pid, c->tid, si->si_signo);
}

/* PTRACE_DETACH of thread TID (stopped), with SIG; if it is no longer stopped (killed: its
 * process exits), wait for its end and reap it: a traced thread is its tracer's to reap, and
 * until then its process cannot end. */
static void detach_or_reap(struct inj *c, int tid, int sig)
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
static int process_alive(int pid)
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
static int trap_pending(struct inj *c, int tid)
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
static int held_index(struct inj *c, int tid)
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
static const char *unsafe_here(struct inj *c, const struct user_regs_struct *r, int *movable)
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
enum { SR_CALLER, SR_LIB, SR_ANY };

static uint64_t stack_return(struct inj *c, uint64_t rsp, int inside)
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
static uint64_t caller_address(struct inj *c, uint64_t rsp)
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

static void unhold_all(struct inj *c)
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
static int risky(struct inj *c)
{
    int n = 0;
    for (int i = 0; i < c->nheld; i++)
        n += c->held[i].unsafe > 0;
    return n;
}

/* Let go at most MAX of the held threads that may hold a lock, the likeliest first: how
 * many were. */
static int unhold_risky(struct inj *c, int max)
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
static void adopt(struct inj *c, int i)
{
    c->tid = c->held[i].tid;
    c->attached = 1;
    c->in_sigstop = c->held[i].in_sigstop;
    c->stuck = c->modified = c->clobbered = c->at_sysexit = c->bp_set = 0;
    c->nrec = 0;
    c->held[i] = c->held[--c->nheld];
}

/* The state letter of thread TID in /proc (R, S, D, t...), or 0. */
static char thread_state(struct inj *c, int tid)
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
static int hold_running(struct inj *c)
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
static int settle_held(struct inj *c)
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

/* ---- seccomp ----
 * A thread under seccomp would be killed (or its calls failed) by a system call its filter
 * does not allow, and dlopen, then mmleak in that process, make system calls the program
 * itself may never make.  So before anything runs in the process: a thread in strict mode
 * refuses the attach; a filter is read (PTRACE_SECCOMP_GET_FILTER, which needs
 * CAP_SYS_ADMIN), run here on each system call dlopen and mmleak make (SC_NEEDED, with the
 * arguments they use: seen with strace), and the attach is refused unless it allows them
 * all.  The filters are the stopped thread's; every other thread must have as many (a thread
 * that added its own cannot be read without stopping it too). */
#ifndef PTRACE_SECCOMP_GET_FILTER
#define PTRACE_SECCOMP_GET_FILTER 0x420c
#endif
#define SC_MAX_INSNS 4096       /* BPF_MAXINSNS */
#define SC_MAX_FILTERS 64

static const struct sc_call {
    int nr;
    const char *name;
    uint64_t a[6];
} SC_NEEDED[] = {
    /* dlopen */
    { SYS_openat, "openat", { (uint64_t)AT_FDCWD, 0, O_RDONLY | O_CLOEXEC, 0, 0, 0 } },
    { SYS_read, "read", { 3, 0, 832, 0, 0, 0 } },
    { SYS_pread64, "pread64", { 3, 0, 784, 64, 0, 0 } },
    { SYS_newfstatat, "newfstatat", { 3, 0, 0, AT_EMPTY_PATH, 0, 0 } },
    { SYS_fstat, "fstat", { 3, 0, 0, 0, 0, 0 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ, MAP_PRIVATE | MAP_DENYWRITE, 3, 0 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED | MAP_DENYWRITE,
                          3, 4096 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED |
                          MAP_DENYWRITE, 3, 4096 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED |
                          MAP_ANONYMOUS, (uint64_t)-1, 0 } },
    { SYS_mprotect, "mprotect", { 0, 4096, PROT_READ, 0, 0, 0 } },
    { SYS_close, "close", { 3, 0, 0, 0, 0, 0 } },
    { SYS_munmap, "munmap", { 0, 8192, 0, 0, 0, 0 } },
    { SYS_futex, "futex", { 0, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, 0, 0, 0 } },
    { SYS_futex, "futex", { 0, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, 2, 0, 0, 0 } },
    /* mmleak_attach, and mmleak while it traces */
    { SYS_openat, "openat", { (uint64_t)AT_FDCWD, 0, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW |
                              O_NONBLOCK | O_CLOEXEC, 0600, 0, 0 } },
    { SYS_openat, "openat", { (uint64_t)AT_FDCWD, 0, O_WRONLY | O_NOFOLLOW | O_NONBLOCK |
                              O_CLOEXEC, 0, 0, 0 } },
    { SYS_mmap, "mmap", { 0, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, 3, 0 } },
    { SYS_mmap, "mmap", { 0, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          (uint64_t)-1, 0 } },
    { SYS_mprotect, "mprotect", { 0, 4096, PROT_READ | PROT_WRITE, 0, 0, 0 } },
    { SYS_madvise, "madvise", { 0, 4096, MADV_WIPEONFORK, 0, 0, 0 } },
    { SYS_fallocate, "fallocate", { 3, 0, 0, 65536, 0, 0 } },
    { SYS_pwrite64, "pwrite64", { 3, 0, 4096, 0, 0, 0 } },
    { SYS_write, "write", { 2, 0, 80, 0, 0, 0 } },
    { SYS_unlinkat, "unlinkat", { (uint64_t)AT_FDCWD, 0, 0, 0, 0, 0 } },
    { SYS_renameat, "renameat", { (uint64_t)AT_FDCWD, 0, (uint64_t)AT_FDCWD, 0, 0, 0 } },
    { SYS_prlimit64, "prlimit64", { 0, RLIMIT_FSIZE, 0, 0, 0, 0 } },
    { SYS_getrandom, "getrandom", { 0, 8, 1 /* GRND_NONBLOCK */, 0, 0, 0 } },
    { SYS_getpid, "getpid", { 0 } },
    { SYS_gettid, "gettid", { 0 } },
    { SYS_geteuid, "geteuid", { 0 } },
    { SYS_clock_nanosleep, "clock_nanosleep", { CLOCK_REALTIME, 0, 0, 0, 0, 0 } },
    { SYS_process_vm_readv, "process_vm_readv", { 0, 0, 1, 0, 2, 0 } },
};

/* The classic BPF of a seccomp filter, run on one call (the kernel checked the program when
 * it was installed: jumps go forward, loads stay inside seccomp_data). */
static uint32_t sc_run(const struct sock_filter *f, size_t n, const struct seccomp_data *d)
{
    uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = { 0 };
    const unsigned char *raw = (const unsigned char *)d;
    for (size_t pc = 0; pc < n; pc++) {
        const struct sock_filter *i = &f[pc];
        uint32_t k = i->k, src = BPF_SRC(i->code) == BPF_X ? x : k;
        switch (BPF_CLASS(i->code)) {
        case BPF_LD:
            if (BPF_MODE(i->code) == BPF_ABS) {
                if (k + 4 > sizeof *d)
                    return SECCOMP_RET_KILL_PROCESS;
                memcpy(&a, raw + k, 4);
            } else if (BPF_MODE(i->code) == BPF_IMM) {
                a = k;
            } else if (BPF_MODE(i->code) == BPF_MEM) {
                a = mem[k % BPF_MEMWORDS];
            } else if (BPF_MODE(i->code) == BPF_LEN) {
                a = sizeof *d;
            } else {
                return SECCOMP_RET_KILL_PROCESS;
            }
            break;
        case BPF_LDX:
            if (BPF_MODE(i->code) == BPF_IMM)
                x = k;
            else if (BPF_MODE(i->code) == BPF_MEM)
                x = mem[k % BPF_MEMWORDS];
            else if (BPF_MODE(i->code) == BPF_LEN)
                x = sizeof *d;
            else
                return SECCOMP_RET_KILL_PROCESS;
            break;
        case BPF_ST:
            mem[k % BPF_MEMWORDS] = a;
            break;
        case BPF_STX:
            mem[k % BPF_MEMWORDS] = x;
            break;
        case BPF_ALU:
            switch (BPF_OP(i->code)) {
            case BPF_ADD: a += src; break;
            case BPF_SUB: a -= src; break;
            case BPF_MUL: a *= src; break;
            case BPF_DIV: a = src ? a / src : 0; break;
            case BPF_MOD: a = src ? a % src : 0; break;
            case BPF_OR: a |= src; break;
            case BPF_AND: a &= src; break;
            case BPF_XOR: a ^= src; break;
            case BPF_LSH: a = src < 32 ? a << src : 0; break;
            case BPF_RSH: a = src < 32 ? a >> src : 0; break;
            case BPF_NEG: a = -a; break;
            default: return SECCOMP_RET_KILL_PROCESS;
            }
            break;
        case BPF_JMP: {
            int t;
            switch (BPF_OP(i->code)) {
            case BPF_JA: pc += k; continue;
            case BPF_JEQ: t = a == src; break;
            case BPF_JGT: t = a > src; break;
            case BPF_JGE: t = a >= src; break;
            case BPF_JSET: t = (a & src) != 0; break;
            default: return SECCOMP_RET_KILL_PROCESS;
            }
            pc += t ? i->jt : i->jf;
            break;
        }
        case BPF_RET:
            return BPF_RVAL(i->code) == BPF_A ? a : k;
        case BPF_MISC:
            if (BPF_MISCOP(i->code) == BPF_TAX)
                x = a;
            else
                a = x;
            break;
        default:
            return SECCOMP_RET_KILL_PROCESS;
        }
    }
    return SECCOMP_RET_KILL_PROCESS;     /* fell off the end: the kernel never allows it */
}

static const char *sc_action(uint32_t r, char *buf, size_t cap)
{
    switch (r & SECCOMP_RET_ACTION_FULL) {
    case SECCOMP_RET_KILL_PROCESS: return "it would kill the process";
    case SECCOMP_RET_KILL_THREAD: return "it would kill the thread";
    case SECCOMP_RET_TRAP: return "it would send SIGSYS";
    case SECCOMP_RET_ERRNO:
        snprintf(buf, cap, "it would fail with errno %u", r & SECCOMP_RET_DATA);
        return buf;
    case SECCOMP_RET_TRACE: return "it would hand it to a tracer";
    case SECCOMP_RET_USER_NOTIF: return "it would ask a supervisor";
    default: return "an unknown action";
    }
}

static int sc_field(const char *buf, const char *key, long *v)
{
    const char *f = field(buf, key);
    if (!f)
        return -1;
    *v = strtol(f, NULL, 10);
    return 0;
}

/* 0: the process may be used as far as seccomp goes; 1: refused (*code set). */
static int seccomp_check(struct inj *c, int tid, int *code)
{
    char buf[4096];
    long mode = 0, nfilt = -1;
    if (read_status(c->pid, tid, buf, sizeof buf) < 0 || sc_field(buf, "Seccomp", &mode) < 0)
        return 0;               /* no seccomp in this kernel */
    sc_field(buf, "Seccomp_filters", &nfilt);
    /* every thread: strict mode anywhere refuses; filters must be the same count */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", c->pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int t = atoi(e->d_name);
        long m2 = 0, n2 = -1;
        if (t <= 0 || read_status(c->pid, t, buf, sizeof buf) < 0 ||
            sc_field(buf, "Seccomp", &m2) < 0)
            continue;
        sc_field(buf, "Seccomp_filters", &n2);
        if (m2 == SECCOMP_MODE_STRICT) {
            closedir(d);
            *code = fail(c, MMLEAK_INJ_EUNSUPP, "thread %d of %d is in seccomp strict mode: "
                         "the system calls of dlopen and of mmleak would kill it", t, c->pid);
            return 1;
        }
        if (m2 != mode || n2 != nfilt) {
            closedir(d);
            *code = fail(c, MMLEAK_INJ_EUNSUPP, "threads %d and %d of %d have different "
                         "seccomp filters: they cannot all be checked, attaching could kill "
                         "it", tid, t, c->pid);
            return 1;
        }
    }
    if (d)
        closedir(d);
    if (mode != SECCOMP_MODE_FILTER)
        return 0;
    struct sock_filter *f = malloc(SC_MAX_INSNS * sizeof *f);
    if (!f) {
        *code = fail(c, MMLEAK_INJ_ESYS, "out of memory");
        return 1;
    }
    uint32_t worst[sizeof SC_NEEDED / sizeof SC_NEEDED[0]];
    for (size_t j = 0; j < sizeof SC_NEEDED / sizeof SC_NEEDED[0]; j++)
        worst[j] = SECCOMP_RET_ALLOW;
    int nread = 0;
    for (long i = 0; i < SC_MAX_FILTERS; i++) {
        long n = ptrace(PTRACE_SECCOMP_GET_FILTER, tid, (void *)i, f);
        if (n < 0 && errno == ENOENT)
            break;
        if (n < 0 || n > SC_MAX_INSNS) {
            int err = errno;
            free(f);
            if (n < 0 && (err == EACCES || err == EPERM))
                *code = fail(c, MMLEAK_INJ_EPERM, "%d has a seccomp filter, and only a process "
                             "with CAP_SYS_ADMIN may read it to see whether dlopen and mmleak "
                             "may run there (run as root)", c->pid);
            else
                *code = fail(c, MMLEAK_INJ_EUNSUPP, "%d has a seccomp filter that cannot be "
                             "read (PTRACE_SECCOMP_GET_FILTER: %s): attaching could kill it",
                             c->pid, n < 0 ? strerror(err) : "too long");
            return 1;
        }
        nread++;
        for (size_t j = 0; j < sizeof SC_NEEDED / sizeof SC_NEEDED[0]; j++) {
            struct seccomp_data sd;
            memset(&sd, 0, sizeof sd);
            sd.nr = SC_NEEDED[j].nr;
            sd.arch = AUDIT_ARCH_X86_64;
            sd.instruction_pointer = c->libc_xlo;
            memcpy(sd.args, SC_NEEDED[j].a, sizeof sd.args);
            uint32_t r = sc_run(f, (size_t)n, &sd);
            /* the kernel keeps the most restrictive verdict: the lowest action, signed */
            if ((int32_t)(r & SECCOMP_RET_ACTION_FULL) <
                (int32_t)(worst[j] & SECCOMP_RET_ACTION_FULL))
                worst[j] = r;
        }
    }
    free(f);
    if (nfilt >= 0 && nread != nfilt) {
        *code = fail(c, MMLEAK_INJ_EUNSUPP, "%d: %d of its %ld seccomp filters could be read: "
                     "attaching could kill it", c->pid, nread, nfilt);
        return 1;
    }
    for (size_t j = 0; j < sizeof SC_NEEDED / sizeof SC_NEEDED[0]; j++) {
        uint32_t act = worst[j] & SECCOMP_RET_ACTION_FULL;
        if (act != SECCOMP_RET_ALLOW && act != SECCOMP_RET_LOG) {
            char ab[48];
            *code = fail(c, MMLEAK_INJ_EUNSUPP, "%d has a seccomp filter that does not allow "
                         "%s (%s), a system call dlopen or mmleak makes", c->pid,
                         SC_NEEDED[j].name, sc_action(worst[j], ab, sizeof ab));
            return 1;
        }
    }
    return 0;
}

/* Try thread TID.  1: done (the result or a fatal error is set); 0: not usable now. */
static int attempt(struct inj *c, int tid, const char *func, const char *arg, long *result,
                   int *code)
{
    c->tid = tid;
    c->nrec = 0;
    c->in_sigstop = c->modified = c->clobbered = 0;
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
    return code;
}

API int mmleak_inject_call(int pid, const char *lib, const char *func, const char *arg,
                           int timeout_ms, long *result, char *err, size_t errlen)
{
    if (timeout_ms <= 0)
        timeout_ms = DEFAULT_TIMEOUT_MS;
    return inject_call(pid, lib, func, arg, timeout_ms, 0, result, err, errlen);
}

API int mmleak_inject_call_within(int pid, const char *lib, const char *func, const char *arg,
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
