/*
 * tracer/park.c: the other threads of an exiting process stopped for its scan without ptrace,
 * or of a running one for the scan it asks for (mmleak_leak_check, below)
 * (mmleak-scan(7), "Threads that ptrace may not stop").  mmleak-scan stops them with
 * PTRACE_SEIZE and PTRACE_INTERRUPT, and may not: a process that dropped root with setuid
 * is not dumpable (memcached -u), a debugger or strace already traces it, Yama's
 * ptrace_scope is 2 or 3.
 * Then the exiting (or asking) thread parks them itself: it sends each one a real-time
 * signal the program leaves at its default; the handler (ours, installed for the moment)
 * copies the thread's registers from its ucontext into a slot of ours, says it is held, and
 * waits on a futex until the scan is done.  The scan runs in the CLONE_VM child of
 * tracer/scanhere.c, which reads the memory it shares (no ptrace, no dumpability check: the
 * kernel lets a process read an address space that is its own), and takes those registers
 * and the stacks from their stack pointers up as roots, as it would a ptrace stop's
 * (tools/scan_stop.c, hold_here).  Cold code: once per process at its exit, once per
 * mmleak_leak_check.
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
 * handler may still read its slot after we gave up on it.
 *
 * The scan the program asks for while it runs (mmleak_leak_check, the "api" scan) parks
 * them the same way, and the program goes on afterwards, so more is owed to it:
 *  - each park has a number, in the signal's value and in each slot's state word
 *    (tools/scan_park.h): a handler late from an earlier park (its signal taken after we
 *    gave up on it) finds its number gone and returns at once, never holding a slot of a
 *    later park, whose threads it would otherwise make look parked while they run;
 *  - the threads are let go by that number (g_go: the last park let go), and mml_unpark
 *    waits until each parked one has left the handler (bounded as the park): when
 *    mmleak_leak_check returns, every thread is back where the signal found it, its mask
 *    (the kernel's, from the signal frame), its errno (saved) and the disposition (put
 *    back) as they were; what a ptrace stop would have restarted and the handler cannot
 *    (above: EINTR of poll, nanosleep...) is the one trace of the park;
 *  - one scan at a time: exitscan.c serialises them (a second caller waits, signals open,
 *    so the first parks it like any thread, then scans in turn);
 *  - a fork meanwhile (a thread in fork() parks once it returns): the child inherits our
 *    handler, which mml_park_fork_child puts back to the program's disposition.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
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
static int g_go;                        /* futex: the number of the last park let go */
static int g_gen;                       /* this park's number (1, 2, ..., wrapping) */
static int g_left;                      /* futex: parked threads that left the handler */
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

/* A slot's state word in park GEN (its low 27 bits: a late handler 2^27 parks old is not
 * feared) */
static int state_of(int st, int gen)
{
    return st | (int)(((unsigned)gen & ((1u << 27) - 1)) << 4);
}

/* Has park GEN been let go?  (g_go at or past it, the numbers wrapping) */
static int let_go(int go, int gen)
{
    return (int)((unsigned)go - (unsigned)gen) >= 0;
}

static void park_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    int saved = errno;
    /* the value: the park's number, the slot's */
    uint64_t v = (uint64_t)(uintptr_t)si->si_value.sival_ptr;
    int gen = (int)(v >> 32), i = (int)(uint32_t)v;
    struct mml_park_slot *slots = __atomic_load_n(&g_park.slot, __ATOMIC_ACQUIRE);
    if (si->si_code == SI_QUEUE && si->si_pid == g_park_pid && slots && i >= 0 &&
        i < PARK_SLOTS) {
        struct mml_park_slot *t = &slots[i];
        int asked = state_of(MML_PARK_ASKED, gen);
        /* the parker may have given up on us meanwhile (or this park is over): then go on
         * at once; taking first, the registers next, held last (the scan reads held slots) */
        if (t->tid == (int)mml_sys(SYS_gettid) &&
            __atomic_compare_exchange_n(&t->state, &asked, state_of(MML_PARK_TAKING, gen), 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            regs_of(&t->regs, uc);
            __atomic_store_n(&t->state, state_of(MML_PARK_HELD, gen), __ATOMIC_RELEASE);
            __atomic_add_fetch(&g_held, 1, __ATOMIC_RELEASE);
            mml_sys(SYS_futex, &g_held, FUTEX_WAKE_PRIVATE, 1);
            for (int go; !let_go(go = __atomic_load_n(&g_go, __ATOMIC_ACQUIRE), gen);)
                mml_sys(SYS_futex, &g_go, FUTEX_WAIT_PRIVATE, go, NULL);
            __atomic_add_fetch(&g_left, 1, __ATOMIC_RELEASE);
            mml_sys(SYS_futex, &g_left, FUTEX_WAKE_PRIVATE, 1);
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
            int now = MML_PARK_STATE(__atomic_load_n(&t->state, __ATOMIC_ACQUIRE));
            if (now != MML_PARK_ASKED && now != MML_PARK_TAKING)
                continue;
            /* exiting, or the zombie of a main thread that ended: never answers */
            if (now == MML_PARK_ASKED && (task_status(t->tid, st, stcap) || ended(st))) {
                int asked = state_of(MML_PARK_ASKED, g_gen);
                __atomic_compare_exchange_n(&t->state, &asked,
                                            state_of(MML_PARK_ENDED, g_gen), 0,
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
    /* the slots of an earlier park (mmleak_leak_check) are used again: a late handler
     * finds their number changed */
    struct mml_park_slot *slots = g_park.slot;
    memset(&g_park, 0, sizeof g_park);
    g_park_pid = getpid();
    g_gen = (int)((unsigned)g_gen + 1);
    g_held = 0;
    g_left = 0;
    int me = (int)mml_sys(SYS_gettid);
    char st[4096];
    int tids[256];
    __atomic_store_n(&g_park.slot, slots ? slots : mml_map(PARK_SLOTS * sizeof *slots),
                     __ATOMIC_RELEASE);
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
            __atomic_store_n(&t->state, state_of(MML_PARK_ASKED, g_gen), __ATOMIC_RELEASE);
            t->tid = tids[k];
            g_park.n++;
            siginfo_t si;
            memset(&si, 0, sizeof si);
            si.si_signo = g_park.sig;
            si.si_code = SI_QUEUE;
            si.si_pid = g_park_pid;
            si.si_uid = getuid();
            si.si_value.sival_ptr = (void *)(uintptr_t)((uint64_t)(unsigned)g_gen << 32 |
                                                        (uint64_t)(t - g_park.slot));
            if (mml_sys(SYS_rt_tgsigqueueinfo, g_park_pid, t->tid, g_park.sig, &si)) {
                if (errno == ESRCH) {   /* ended since it was listed */
                    t->state = state_of(MML_PARK_ENDED, g_gen);
                    continue;
                }
                t->state = state_of(MML_PARK_GAVE_UP, g_gen);
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

/* After the scan: the parked threads go on; the disposition is put back (see above).
 * WAIT (the program goes on: mmleak_leak_check): until each parked thread has left the
 * handler, within PARK_NS. */
COLD void mml_unpark(int wait)
{
    int pending = 0, parked = 0;
    for (int i = 0; g_park.slot && i < g_park.n; i++) {
        int asked = state_of(MML_PARK_ASKED, g_gen);
        /* never answered: its handler, should it still come, goes on at once */
        if (__atomic_compare_exchange_n(&g_park.slot[i].state, &asked,
                                        state_of(MML_PARK_GAVE_UP, g_gen), 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) ||
            MML_PARK_STATE(asked) == MML_PARK_GAVE_UP)
            pending = 1;
        else if (MML_PARK_STATE(asked) == MML_PARK_HELD ||
                 MML_PARK_STATE(asked) == MML_PARK_TAKING)
            parked++;
    }
    __atomic_store_n(&g_go, g_gen, __ATOMIC_RELEASE);
    mml_sys(SYS_futex, &g_go, FUTEX_WAKE_PRIVATE, INT_MAX);
    int64_t until = now_ns() + PARK_NS, left;
    for (; wait;) {
        int n = __atomic_load_n(&g_left, __ATOMIC_ACQUIRE);
        if (n >= parked || (left = until - now_ns()) <= 0)
            break;
        struct timespec ts = { 0, left < 10000000 ? left : 10000000 };
        mml_sys(SYS_futex, &g_left, FUTEX_WAIT_PRIVATE, n, &ts);
    }
    /* Each has left the wait, and is a few instructions from its sigreturn, every signal
     * still blocked: a scan asked next would take it for a thread that blocks them all
     * (seen: "blocks every real-time signal" when two threads asked at once).  Its own mask
     * never blocked our signal (it took it): back in it once that bit is clear in SigBlk. */
    char st[4096];
    for (int i = 0; wait && i < g_park.n; i++) {
        int now = MML_PARK_STATE(__atomic_load_n(&g_park.slot[i].state, __ATOMIC_ACQUIRE));
        while ((now == MML_PARK_HELD || now == MML_PARK_TAKING) && now_ns() < until &&
               !task_status(g_park.slot[i].tid, st, sizeof st) && !ended(st) &&
               mml_status_hex(st, "\nSigBlk:") >> (g_park.sig - 1) & 1)
            sched_yield();
    }
    if (!g_installed)
        return;
    if (pending) {
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigaction(g_park.sig, &ign, NULL);
    }
    sigaction(g_park.sig, &g_old, NULL);
    g_installed = 0;
}

/* In the child of a fork made while threads were parked (a thread in fork() parks once it
 * returns, and the child has only it): the program's disposition again, not our handler */
COLD void mml_park_fork_child(void)
{
    if (g_installed) {
        sigaction(g_park.sig, &g_old, NULL);
        g_installed = 0;
    }
}
