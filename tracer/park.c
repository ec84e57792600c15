/*
 * tracer/park.c: the other threads of an exiting process stopped for its scan without ptrace
 * (mmleak-scan(7), "Threads that ptrace may not stop").  mmleak-scan stops them with
 * PTRACE_SEIZE and PTRACE_INTERRUPT, and may not: a process that dropped root with setuid
 * is not dumpable (memcached -u), a debugger or strace already traces it, Yama's
 * ptrace_scope is 2 or 3.
 * Then the exiting thread parks them itself: it sends each one a real-time signal the
 * program leaves at its default; the handler (ours, installed for the moment) copies the
 * thread's registers from its ucontext into a slot of ours, says it is held, and waits on a
 * futex until the scan is done.  The scan runs in the CLONE_VM child of tracer/scanhere.c,
 * which reads the memory it shares (no ptrace, no dumpability check: the kernel lets a
 * process read an address space that is its own), and takes those registers and the stacks
 * from their stack pointers up as roots, as it would a ptrace stop's
 * (tools/scan_stop.c, hold_here).  Cold code: once per process, at its exit.
 *
 * The host must not see it (what LeakSanitizer's and conservative collectors' signal stops
 * must also care for, done here our way):
 *  - the signal: the highest real-time one whose disposition is SIG_DFL (so the program
 *    neither handles nor ignores it: it does not use it, or sending it would have killed
 *    the process), that no other thread blocks or has pending (read from each one's
 *    /proc/self/task/TID/status).  None: no verdict, and the reason says which thread
 *    blocks them all; nothing is sent.
 *  - the handler: SA_SIGINFO; every signal blocked while it runs (a handler of the
 *    program's must not run in a parked thread: it would change the memory the scan
 *    reads); errno saved; it only makes system calls and stores into our slot:
 *    async-signal-safe.  It acts on our signal only, sent by rt_tgsigqueueinfo with
 *    SI_QUEUE, our pid and the slot's number as its value (tgkill with a payload: no search
 *    of the slots by tid, no lock).
 *  - a thread in a system call: SA_RESTART, so the call is restarted as if nothing came;
 *    but those the kernel never restarts after a handler, SA_RESTART or not (signal(7):
 *    epoll_wait, poll, select, nanosleep, a socket read with a timeout...), return EINTR,
 *    where a ptrace stop would have restarted them.  Harmless here (the process is ending,
 *    and any signal may interrupt such a call), but one more reason for ptrace first.
 *  - bounded: a thread that does not answer within PARK_NS (it blocked the signal since we
 *    looked, it is in an uninterruptible wait, a vfork parent) makes the verdict unknown,
 *    with that reason, never a hang and never a "definitely lost" from a stack not read; a
 *    thread that is exiting, or the zombie of a main thread that ended, is never answered:
 *    seen ended (its task gone, or State Z or X), it is no root (as with ptrace).
 *  - afterwards: the threads let go, the disposition put back; if a signal of ours may still
 *    be pending (a thread that never answered), SIG_IGN first, which discards it (POSIX),
 *    so that SIG_DFL, put back after, never kills the process for it.
 * The slots are a mapping of ours (mml_map: left out of the roots), never unmapped: a late
 * handler may still read its slot after we gave up on it.  Used once, at the exit (the
 * flag that lets the threads go is never set back).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/ucontext.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <asm/prctl.h>
#endif

#include "internal.h"
#include "procstatus.h"
#include "../tools/scan_park.h"

#define PARK_SLOTS 16384                /* threads at most (the mapping is touched as used) */
#define PARK_NS 5000000000LL            /* a thread must park within this (as a ptrace stop) */
#define PARK_ROUNDS 1000                /* listings of the tasks (threads started meanwhile) */
/* signals 32 and 33 (bits 31 and 32 of a mask as /proc shows it): glibc's own */
#define GLIBC_OWN_SIGNALS ((uint64_t)3 << 31)

static struct mml_park g_park;
static int g_park_pid;
static int g_held;                      /* futex: threads parked so far */
static int g_go;                        /* futex: 1, the scan is done, every thread goes on */
static int g_installed;
static struct sigaction g_old;          /* the disposition put back */

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

#if defined(__x86_64__)
/* The thread's registers where the signal stopped it, as ptrace's PTRACE_GETREGS gives them
 * (the scan's struct thr): the ucontext's general registers; fs_base and gs_base, which it
 * has not, from the kernel (they are this thread's).  A system call interrupted for
 * restarting shows its restart (rax its number, rip at the `syscall`). */
static void regs_of(struct user_regs_struct *r, const ucontext_t *uc)
{
    const greg_t *g = uc->uc_mcontext.gregs;
    memset(r, 0, sizeof *r);
    r->r8 = (uint64_t)g[REG_R8];
    r->r9 = (uint64_t)g[REG_R9];
    r->r10 = (uint64_t)g[REG_R10];
    r->r11 = (uint64_t)g[REG_R11];
    r->r12 = (uint64_t)g[REG_R12];
    r->r13 = (uint64_t)g[REG_R13];
    r->r14 = (uint64_t)g[REG_R14];
    r->r15 = (uint64_t)g[REG_R15];
    r->rdi = (uint64_t)g[REG_RDI];
    r->rsi = (uint64_t)g[REG_RSI];
    r->rbp = (uint64_t)g[REG_RBP];
    r->rbx = (uint64_t)g[REG_RBX];
    r->rdx = (uint64_t)g[REG_RDX];
    r->rax = (uint64_t)g[REG_RAX];
    r->rcx = (uint64_t)g[REG_RCX];
    r->rsp = (uint64_t)g[REG_RSP];
    r->rip = (uint64_t)g[REG_RIP];
    r->eflags = (uint64_t)g[REG_EFL];
    r->orig_rax = (uint64_t)-1;
    unsigned long fs = 0, gs = 0;
    mml_sys(SYS_arch_prctl, ARCH_GET_FS, &fs);
    mml_sys(SYS_arch_prctl, ARCH_GET_GS, &gs);
    r->fs_base = fs;
    r->gs_base = gs;
}

static void park_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    int saved = errno;
    int i = si->si_value.sival_int;
    if (si->si_code == SI_QUEUE && si->si_pid == g_park_pid && i >= 0 &&
        i < __atomic_load_n(&g_park.n, __ATOMIC_ACQUIRE)) {
        struct mml_park_slot *t = &g_park.slot[i];
        if (t->tid == (int)mml_sys(SYS_gettid)) {
            regs_of(&t->regs, uc);      /* (before the state: the scan reads held slots) */
            int asked = MML_PARK_ASKED;
            /* the parker may have given up on us meanwhile: then go on at once */
            if (__atomic_compare_exchange_n(&t->state, &asked, MML_PARK_HELD, 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
                __atomic_add_fetch(&g_held, 1, __ATOMIC_RELEASE);
                mml_sys(SYS_futex, &g_held, FUTEX_WAKE_PRIVATE, 1);
                while (!__atomic_load_n(&g_go, __ATOMIC_ACQUIRE))
                    mml_sys(SYS_futex, &g_go, FUTEX_WAIT_PRIVATE, 0, NULL);
            }
        }
    }
    errno = saved;
}
#endif

/* /proc/self/task/TID/status into BUF: 0, or -1 (the thread is gone) */
static int task_status(int tid, char *buf, size_t cap)
{
    char path[48], *e = path + sizeof path;
    char *d = cat(path, e, "/proc/self/task/");
    d = cat_u(d, e, (unsigned long)tid);
    cat(d, e, "/status");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return 0;
}

/* Has the thread ended?  Its task gone, or a zombie (a main thread after pthread_exit) or
 * dead: no signal will ever be taken. */
static int ended(const char *buf)
{
    const char *st = mml_status_field(buf, "\nState:");
    return st && (*st == 'Z' || *st == 'X');
}

static COLD void park_why(const char *a, int tid, const char *b)
{
    char *e = g_park.why + sizeof g_park.why;
    char *d = cat(g_park.why, e, a);
    d = cat_u(d, e, (unsigned long)tid);
    cat(d, e, b);
}

/* The highest real-time signal at SIG_DFL that no thread blocks or has pending (BLOCKED:
 * their union, 64 bits as /proc shows them), or 0.  Below SIGRTMIN are glibc's own two. */
static int choose_signal(uint64_t blocked)
{
    for (int s = SIGRTMAX; s >= SIGRTMIN; s--) {
        struct sigaction old;
        if (blocked >> (s - 1) & 1 || sigaction(s, NULL, &old))
            continue;
        if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL)
            return s;
    }
    return 0;
}

static int listed(int tid)
{
    for (int i = 0; i < g_park.n; i++)
        if (g_park.slot[i].tid == tid)
            return 1;
    return 0;
}

/* The real-time signals glibc leaves to programs, as /proc shows a mask */
static uint64_t rt_mask(void)
{
    uint64_t m = 0;
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
        m |= (uint64_t)1 << (s - 1);
    return m;
}

/* The threads of the process not yet in a slot, but ME (and those ended), into TIDS (CAP):
 * how many; *BLOCKED gets the signals each blocks or has pending, *WHO the first that blocks
 * SIG (0: every real-time one); -1 when the tasks cannot be listed. */
static int new_threads(int me, int *tids, int cap, uint64_t *blocked, int sig, int *who,
                       char *st, size_t stcap)
{
    uint64_t rt = sig ? (uint64_t)1 << (sig - 1) : rt_mask();
    int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[4096] __attribute__((aligned(8)));
    int n = 0;
    for (;;) {
        long k = mml_sys(SYS_getdents64, fd, buf, sizeof buf);
        if (k <= 0)
            break;
        for (long off = 0; off < k;) {
            const char *name = buf + off + 19;          /* linux_dirent64's d_name */
            off += *(const unsigned short *)(buf + off + 16);
            int tid = 0;
            for (const char *c = name; *c >= '0' && *c <= '9'; c++)
                tid = tid * 10 + (*c - '0');
            if (tid <= 0 || tid == me || listed(tid) || task_status(tid, st, stcap) ||
                ended(st))
                continue;
            uint64_t b = mml_status_hex(st, "\nSigBlk:");
            /* glibc's own two signals (32 and 33: thread cancellation and set*id) cannot be
             * blocked by the program (sigprocmask takes them out of its sets): a thread that
             * blocks them is inside glibc with every signal blocked for a moment, a thread
             * being started (pthread_create's child, until start_thread restores the
             * creator's mask) or its creator.  That mask says nothing of what the thread
             * will block: not counted (a thread seen so at an exit was taken for one that
             * blocks every signal, and the verdict was unknown).  The signal sent meanwhile
             * waits pending until the mask is restored, then parks it within the bound, or,
             * if the restored mask blocks it, the bound gives the reason. */
            if ((b & GLIBC_OWN_SIGNALS) == GLIBC_OWN_SIGNALS)
                b = 0;
            if ((b & rt) == rt && !*who)
                *who = tid;
            *blocked |= b | mml_status_hex(st, "\nSigPnd:") | mml_status_hex(st, "\nShdPnd:");
            if (n < cap)
                tids[n] = tid;
            n++;
        }
    }
    close(fd);
    return n;
}

/* Wait until every slot from FIRST on is held or ended, up to UNTIL: 0, or -1 (the tid of
 * one that is neither in *LATE). */
static int wait_round(int first, int64_t until, int *late, char *st, size_t stcap)
{
    for (;;) {
        int held = __atomic_load_n(&g_held, __ATOMIC_ACQUIRE), open_ = 0;
        for (int i = first; i < g_park.n; i++) {
            struct mml_park_slot *t = &g_park.slot[i];
            if (__atomic_load_n(&t->state, __ATOMIC_ACQUIRE) != MML_PARK_ASKED)
                continue;
            /* exiting, or the zombie of a main thread that ended: never answers */
            if (task_status(t->tid, st, stcap) || ended(st)) {
                int asked = MML_PARK_ASKED;
                __atomic_compare_exchange_n(&t->state, &asked, MML_PARK_ENDED, 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
                continue;
            }
            open_++;
            *late = t->tid;
        }
        if (!open_)
            return 0;
        int64_t left = until - now_ns();
        if (left <= 0)
            return -1;
        /* a wake at each thread held; otherwise a look every 10 ms (one ending) */
        struct timespec ts = { 0, left < 10000000 ? left : 10000000 };
        mml_sys(SYS_futex, &g_held, FUTEX_WAIT_PRIVATE, held, &ts);
    }
}

#if defined(__x86_64__)
COLD struct mml_park *mml_park_others(void)
{
    memset(&g_park, 0, sizeof g_park);
    g_park_pid = getpid();
    int me = (int)mml_sys(SYS_gettid);
    char st[4096];
    int tids[256];
    g_park.slot = mml_map(PARK_SLOTS * sizeof *g_park.slot);
    if (!g_park.slot) {
        cat(g_park.why, g_park.why + sizeof g_park.why, "out of memory");
        return &g_park;
    }
    for (int round = 0; round < PARK_ROUNDS; round++) {
        uint64_t blocked = 0;
        int who = 0;
        int n = new_threads(me, tids, (int)(sizeof tids / sizeof *tids), &blocked, g_park.sig,
                            &who, st, sizeof st);
        if (n < 0) {
            cat(g_park.why, g_park.why + sizeof g_park.why, "/proc/self/task cannot be read");
            return &g_park;
        }
        if (!n)
            return &g_park;             /* all held (or ended): no thread can start one */
        if (!g_park.sig) {
            if (!task_status(me, st, sizeof st))
                blocked |= mml_status_hex(st, "\nShdPnd:");
            g_park.sig = choose_signal(blocked);
            if (!g_park.sig) {
                park_why("thread ", who ? who : tids[0], who ? " blocks every real-time "
                         "signal: the other threads cannot be stopped without ptrace" :
                         " (or another) blocks or has pending every real-time signal the "
                         "program leaves at its default: the other threads cannot be "
                         "stopped without ptrace");
                return &g_park;
            }
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = park_handler;
            sa.sa_flags = SA_SIGINFO | SA_RESTART;
            sigfillset(&sa.sa_mask);
            if (sigaction(g_park.sig, &sa, &g_old)) {
                g_park.sig = 0;
                cat(g_park.why, g_park.why + sizeof g_park.why, "sigaction failed");
                return &g_park;
            }
            g_installed = 1;
        } else if (blocked >> (g_park.sig - 1) & 1) {
            park_why("thread ", who ? who : tids[0], " (started meanwhile) blocks or has "
                     "pending the signal that stops the others without ptrace");
            return &g_park;
        }
        int first = g_park.n;
        for (int k = 0; k < n && k < (int)(sizeof tids / sizeof *tids); k++) {
            if (g_park.n == PARK_SLOTS) {
                cat(g_park.why, g_park.why + sizeof g_park.why, "too many threads to stop "
                    "without ptrace");
                return &g_park;
            }
            struct mml_park_slot *t = &g_park.slot[g_park.n];
            t->tid = tids[k];
            t->state = MML_PARK_ASKED;
            __atomic_store_n(&g_park.n, g_park.n + 1, __ATOMIC_RELEASE);
            siginfo_t si;
            memset(&si, 0, sizeof si);
            si.si_signo = g_park.sig;
            si.si_code = SI_QUEUE;
            si.si_pid = g_park_pid;
            si.si_uid = getuid();
            si.si_value.sival_int = (int)(t - g_park.slot);
            if (mml_sys(SYS_rt_tgsigqueueinfo, g_park_pid, t->tid, g_park.sig, &si)) {
                if (errno == ESRCH) {   /* ended since it was listed */
                    t->state = MML_PARK_ENDED;
                    continue;
                }
                t->state = MML_PARK_GAVE_UP;
                park_why("thread ", t->tid, errno == EAGAIN ? ": the signal queue is full"
                                                        : ": the signal cannot be sent");
                return &g_park;
            }
        }
        int late = 0;
        if (wait_round(first, now_ns() + PARK_NS, &late, st, sizeof st)) {
            park_why("thread ", late, " did not stop within 5 s for the signal sent (it "
                     "blocks it, or waits uninterruptibly): the other threads cannot be "
                     "stopped without ptrace");
            return &g_park;
        }
    }
    cat(g_park.why, g_park.why + sizeof g_park.why, "the process keeps starting threads");
    return &g_park;
}
#endif

/* After the scan: the parked threads go on; the disposition is put back (see above) */
COLD void mml_unpark(void)
{
    __atomic_store_n(&g_go, 1, __ATOMIC_RELEASE);
    mml_sys(SYS_futex, &g_go, FUTEX_WAKE_PRIVATE, INT_MAX);
    if (!g_installed)
        return;
    int pending = 0;
    for (int i = 0; i < g_park.n; i++) {
        int asked = MML_PARK_ASKED;
        /* never answered: its handler, should it still come, goes on at once */
        if (__atomic_compare_exchange_n(&g_park.slot[i].state, &asked, MML_PARK_GAVE_UP, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) ||
            asked == MML_PARK_GAVE_UP)
            pending = 1;
    }
    if (pending) {
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigaction(g_park.sig, &ign, NULL);
    }
    sigaction(g_park.sig, &g_old, NULL);
    g_installed = 0;
}
