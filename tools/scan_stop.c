/* tools/scan_stop.c: the reachability scan's hold on the process (step 2 of tools/scan.c):
 * every thread seized and stopped, its registers read, and let go at the end (a signal that
 * came meanwhile given back); for a scan on demand, the snapshot, a copy of the process
 * made by one of its stopped threads (clone, injected) that the scan reads while the
 * process goes on, and that copy's end.  Separate because this file alone runs ptrace on
 * the process: the rest of the scan only reads. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tracer/compiler.h"
#include "../tracer/procstatus.h"

#include "scan_int.h"

#define STOP_NS 5000000000LL            /* a thread must stop within this */

/* A wait for a thread to stop: 10 us, doubling up to 1 ms (most stop within microseconds;
 * the stall of a scan on demand is mostly these waits). */
static void nap(int *n)
{
    long ns = 10000L << (*n < 7 ? *n : 7);
    if (*n < 7)
        (*n)++;
    struct timespec ts = { 0, ns > 1000000 ? 1000000 : ns };
    nanosleep(&ts, NULL);
}

/* ---- 1. the threads -------------------------------------------------------------- */

static int have_tid(struct scan *s, int tid)
{
    for (int i = 0; i < s->nth; i++)
        if (s->th[i].tid == tid)
            return 1;
    return 0;
}

/* Has thread TID of process PID ended, though /proc/PID/task still lists it?  The main
 * thread after its pthread_exit, while others run: a zombie ("State: Z") until the whole
 * process ends, which ptrace refuses (EPERM).  Its stack is then no root (valgrind: its
 * blocks are lost).  Before, the scan said "cannot trace thread" and reached no verdict. */
static int thread_ended(int pid, int tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task/%d/status", pid, tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *st = mml_status_field(buf, "\nState:");
    return st && (*st == 'Z' || *st == 'X');
}

/* Wait until thread TID reports a stop: 1 stopped, 0 gone, -1 not within STOP_NS. */
static int wait_stopped(struct scan *s, struct thr *t)
{
    int64_t until = mono_ns() + STOP_NS;
    t->naps = 0;
    for (;;) {
        int st;
        pid_t r = waitpid(t->tid, &st, __WALL | WNOHANG);
        if (r == t->tid) {
            if (WIFEXITED(st) || WIFSIGNALED(st))
                return 0;
            if (WIFSTOPPED(st)) {
                int ev = st >> 16;
                if (ev == 0 && WSTOPSIG(st) != SIGSTOP && WSTOPSIG(st) != SIGTRAP)
                    t->sig = WSTOPSIG(st);      /* a signal for it: given back at the end */
                else if (ev == 0 && WSTOPSIG(st) == SIGSTOP)
                    t->sig = SIGSTOP;
                return 1;
            }
        } else if (r < 0 && errno != EINTR) {
            return errno == ECHILD ? 0 : -1;
        }
        if (mono_ns() > until)
            return say(s, "thread %d of process %d did not stop within %lld s", t->tid,
                       s->pid, STOP_NS / 1000000000LL);
        nap(&t->naps);
    }
}

/* The thread that asked for the scan (at exit, or mmleak_leak_check) when it is the
 * process's only one: it waits for us, our parent, in mmleak.so with every signal blocked
 * (tracer/exitscan.c), so no code of the program runs until we are done, and no thread can
 * appear.  Then it is not stopped: its stack pointer and thread pointers are mmleak.so's
 * word (s->lone), and its other registers are not roots anyway (mmleak_scan_floor).  That
 * saves the seize, the interrupt, the wait for the stop and the detach: hand-overs between
 * the two processes, each a wait for the scheduler on a busy machine (docs/performance-heap.rst,
 * "Start-up and exit, the scan's hand-overs").
 * At the exit of a process whose other threads mmleak-scan may not trace (not dumpable, a
 * tracer already there: tracer/park.c), mmleak.so parked them with a signal of its own
 * before it started us (s->park): each waits in mmleak.so's handler, which copied its
 * registers from its ucontext into a slot.  They are taken as a ptrace stop's (registers
 * and stacks from their stack pointers up are roots), and none can start a thread.  Every
 * task must then be the asking thread, a parked one or one that ended (a zombie main
 * thread, one exiting: no root, as with ptrace); any other, or a reason mmleak.so gave (a
 * thread that blocks the signal, or did not stop in time), and there is no verdict.
 * 1 held so (with s->park, failed perhaps: s->failed says why), 0 not (another thread is
 * there, or we are not its child): the threads are seized. */
int hold_here(struct scan *s)
{
    if (!s->lone || s->floor_tid <= 0 || getppid() != s->pid)
        return 0;
    const struct mml_park *pk = s->park;
    if (pk && pk->why[0]) {
        say(s, "%s", pk->why);
        return 1;
    }
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/task", s->pid);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return pk ? say(s, "process %d: %s", s->pid, strerror(errno)), 1 : 0;
    int ok = 1, seen = 0;
    for (;;) {
        long k = syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (k <= 0)
            break;
        for (long off = 0; off < k && ok > 0;) {
            struct dirent64 *e = (struct dirent64 *)(buf + off);
            off += e->d_reclen;
            int tid = atoi(e->d_name);
            if (tid <= 0)
                continue;
            const struct user_regs_struct *r = NULL;
            if (tid == s->floor_tid)
                seen = 1;
            else if (!pk)
                ok = 0;                 /* not alone: seized */
            else {
                int st = -1;
                for (int i = 0; i < pk->n && st < 0; i++)
                    if (pk->slot[i].tid == tid) {
                        st = __atomic_load_n(&pk->slot[i].state, __ATOMIC_ACQUIRE);
                        r = &pk->slot[i].regs;
                    }
                if (MML_PARK_STATE(st) != MML_PARK_HELD) {
                    if (thread_ended(s->pid, tid))
                        continue;
                    say(s, "thread %d of process %d was not stopped by mmleak.so's signal",
                        tid, s->pid);
                    ok = -1;
                    break;
                }
            }
            if (ok <= 0)
                break;
            struct thr *n = realloc(s->th, (size_t)(s->nth + 1) * sizeof *n);
            if (!n) {
                say(s, "out of memory");
                ok = -1;
                break;
            }
            s->th = n;
            struct thr *t = &s->th[s->nth++];
            memset(t, 0, sizeof *t);
            t->tid = tid;
            if (r)
                t->regs = *r;
            else {
                t->regs.rsp = s->lone[0];
                t->regs.fs_base = s->lone[1];
                t->regs.gs_base = s->lone[2];
            }
        }
        if (ok <= 0)
            break;
    }
    close(fd);
    if (ok > 0 && !seen && pk)
        ok = say(s, "thread %d of process %d is not listed", s->floor_tid, s->pid);
    if (ok == 0 || (ok > 0 && !seen)) {
        free(s->th);
        s->th = NULL;
        s->nth = 0;
        return 0;
    }
    s->held = pk ? HELD_SIGNAL : HELD_ALONE;
    return 1;
}

int seize_all(struct scan *s)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", s->pid);
    for (int round = 0; round < 1000; round++) {
        DIR *d = opendir(path);
        if (!d)
            return say(s, "process %d: %s", s->pid, strerror(errno));
        int added = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            int tid = atoi(e->d_name);
            if (tid <= 0 || have_tid(s, tid))
                continue;
            if (ptrace(PTRACE_SEIZE, tid, 0, 0)) {
                if (errno == ESRCH || (errno == EPERM && thread_ended(s->pid, tid)))
                    continue;           /* ended meanwhile, or before (a zombie) */
                int e2 = errno;
                s->refused = e2 == EPERM;
                closedir(d);
                return say(s, "cannot trace thread %d of process %d: %s%s", tid, s->pid,
                           strerror(e2), e2 == EPERM ? " (another tracer, another user, or "
                           "yama's ptrace_scope)" : "");
            }
            struct thr *n = realloc(s->th, (size_t)(s->nth + 1) * sizeof *n);
            if (!n) {
                closedir(d);
                return say(s, "out of memory");
            }
            s->th = n;
            struct thr *t = &s->th[s->nth++];
            memset(t, 0, sizeof *t);
            t->tid = tid;
            added++;
            if (ptrace(PTRACE_INTERRUPT, tid, 0, 0) && errno == ESRCH)
                t->tid = -tid;          /* gone: keep the slot, never use it */
        }
        /* all of this round interrupted at once, then each waited for */
        for (int i = s->nth - added; i < s->nth; i++) {
            struct thr *t = &s->th[i];
            if (t->tid <= 0)
                continue;
            int r = wait_stopped(s, t);
            if (r < 0) {
                closedir(d);
                return -1;
            }
            if (r == 0) {
                t->tid = -t->tid;
                continue;
            }
            t->stopped = 1;
            if (ptrace(PTRACE_GETREGS, t->tid, 0, &t->regs))
                memset(&t->regs, 0, sizeof t->regs);
        }
        closedir(d);
        if (!added)
            return 0;
    }
    return say(s, "process %d keeps starting threads", s->pid);
}

void let_go(struct scan *s)
{
    for (int i = 0; i < s->nth; i++)
        if (s->th[i].tid > 0 && s->th[i].stopped) {
            int sig = s->th[i].sig == SIGSTOP ? 0 : s->th[i].sig;
            ptrace(PTRACE_DETACH, s->th[i].tid, 0, (void *)(long)sig);
            s->th[i].stopped = 0;
        }
}

/* ---- 1b. the snapshot: a copy of the process, made by the process, never run ----------
 *
 * For a scan on demand the process is stopped only while the threads' registers, the cut
 * and a copy of it are taken: one stopped thread is made to run one system call, clone()
 * without CLONE_VM (a fork: copy-on-write, the cost of a fork) and with no exit signal, so
 * the process is never told of it.  We trace the copy from its birth (PTRACE_O_TRACECLONE):
 * it starts stopped and never runs a single instruction of its own; nothing in it can take a
 * lock.  The threads are let go, the scan reads the copy, then the copy is killed and the
 * process made to reap it the same way (wait4 with __WALL on that pid: its own children
 * are not touched).  The thread's registers are put back exactly, and a system call it was
 * in is restarted as the kernel would have (rax = orig_rax, rip - 2). */

#define SYS_CLONE 56
#define SYS_WAIT4 61
#define SYS_RESTART 219
#define ERESTARTSYS_ 512
#define ERESTARTNOINTR_ 513
#define ERESTARTNOHAND_ 514
#define ERESTART_RESTARTBLOCK_ 516

static int under_seccomp(int pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    return mml_status_seccomp(path, buf, sizeof buf);
}

/* A `syscall` instruction of the process: where a thread stopped in a system call is.  Read
 * through RPID, a live thread's id (not the pid of a main thread that ended: a zombie has
 * no memory; then there was no copy, and the process stayed stopped for the whole scan). */
static int syscall_at(int rpid, uint64_t at)
{
    unsigned char b[2];
    struct iovec l = { b, 2 }, rv = { (void *)at, 2 };
    return at && process_vm_readv(rpid, &l, 1, &rv, 1, 0) == 2 && b[0] == 0x0f && b[1] == 0x05;
}

static uint64_t syscall_insn(struct scan *s, int rpid)
{
    for (int t = 0; t < s->nth; t++) {
        const struct user_regs_struct *r = &s->th[t].regs;
        if (s->th[t].tid > 0 && (int64_t)r->orig_rax >= 0 && r->rip >= 2 &&
            syscall_at(rpid, r->rip - 2))
            return r->rip - 2;
    }
    return 0;
}

/* Wait for the next stop of thread T: its status, or -1 (gone, or not within STOP_NS). */
static int next_stop(struct thr *t)
{
    int64_t until = mono_ns() + STOP_NS;
    t->naps = 0;
    for (;;) {
        int st;
        pid_t r = waitpid(t->tid, &st, __WALL | WNOHANG);
        if (r == t->tid)
            return WIFSTOPPED(st) ? st : -1;
        if (r < 0 && errno != EINTR)
            return -1;
        if (mono_ns() > until)
            return -1;
        nap(&t->naps);
    }
}

/* The next stop of thread T while it runs a system call we made it run: its status, or -1
 * (gone).  No time limit: given up, the thread would be left running our call with our
 * registers, and stopped at its end by a tracer who never comes back (let go when we end:
 * it then goes on at the instruction after the `syscall`, in whatever function held it,
 * with the call's result), and a copy the clone made, traced from its birth but never
 * told to die (PTRACE_O_EXITKILL is set once it has stopped), would run the program.
 * A clone or a wait4 on a zombie does not block; a thread killed meanwhile is gone. */
static int injected_stop(struct thr *t)
{
    for (;;) {
        int st;
        pid_t r = waitpid(t->tid, &st, __WALL);
        if (r == t->tid)
            return WIFSTOPPED(st) ? st : -1;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* Run system call NR(A0, A1, A2, A3) in the stopped thread T (whose registers are
 * T->regs); its result in *RET.  CHILD: the pid of a process it cloned (traced by us).
 * Returns 0, or -1 (the thread is left as it was, if it still exists). */
static int inject_syscall(struct thr *t, uint64_t insn, long nr, uint64_t a0, uint64_t a1,
                          uint64_t a2, uint64_t a3, int64_t *ret, int *child)
{
    struct user_regs_struct r = t->regs, back = t->regs;
    r.rip = insn;
    r.rax = (uint64_t)nr;
    r.orig_rax = (uint64_t)-1;
    r.rdi = a0;
    r.rsi = a1;
    r.rdx = a2;
    r.r10 = a3;
    r.r8 = r.r9 = 0;
    /* put back: an interrupted system call restarted by hand, as the kernel would */
    if ((int64_t)back.orig_rax >= 0) {
        int64_t e = -(int64_t)back.rax;
        if (e == ERESTARTSYS_ || e == ERESTARTNOINTR_ || e == ERESTARTNOHAND_) {
            back.rax = back.orig_rax;
            back.rip -= 2;
        } else if (e == ERESTART_RESTARTBLOCK_) {
            back.rax = SYS_RESTART;
            back.rip -= 2;
        }
    }
    back.orig_rax = (uint64_t)-1;
    if (ptrace(PTRACE_SETOPTIONS, t->tid, 0, (void *)(long)(PTRACE_O_TRACESYSGOOD |
                                                             PTRACE_O_TRACECLONE)))
        return -1;
    if (ptrace(PTRACE_SETREGS, t->tid, 0, &r) || ptrace(PTRACE_SYSCALL, t->tid, 0, 0)) {
        ptrace(PTRACE_SETREGS, t->tid, 0, &t->regs);
        return -1;
    }
    int done = 0, entered = 0;
    while (!done) {
        int st = injected_stop(t);
        if (st < 0)
            return -1;                  /* gone: nothing to put back */
        int sig = WSTOPSIG(st), ev = st >> 16;
        if (sig == (SIGTRAP | 0x80)) {
            if (entered) {
                struct user_regs_struct now;
                ptrace(PTRACE_GETREGS, t->tid, 0, &now);
                *ret = (int64_t)now.rax;
                done = 1;
                break;
            }
            entered = 1;
        } else if (ev == PTRACE_EVENT_CLONE || ev == PTRACE_EVENT_FORK) {
            unsigned long msg = 0;
            ptrace(PTRACE_GETEVENTMSG, t->tid, 0, &msg);
            if (child)
                *child = (int)msg;
        } else if (ev == 0 && sig != SIGTRAP && !t->sig) {
            t->sig = sig;               /* a signal for it: given back when it is let go */
        }
        if (ptrace(PTRACE_SYSCALL, t->tid, 0, 0))
            return -1;
    }
    ptrace(PTRACE_SETREGS, t->tid, 0, &back);
    ptrace(PTRACE_SETOPTIONS, t->tid, 0, 0);
    return 0;
}

/* The copy: 0 made (s->child, s->rpid), -1 not (the scan reads the stopped process). */
int snapshot(struct scan *s)
{
    if (under_seccomp(s->rpid))
        return -1;                      /* a filter may kill the process for the clone */
    uint64_t insn = syscall_insn(s, s->rpid);
    struct thr *t = NULL;
    for (int i = 0; i < s->nth && !t; i++)
        if (s->th[i].tid > 0 && s->th[i].stopped && !s->th[i].sig)
            t = &s->th[i];
    if (!insn || !t)
        return -1;
    int64_t ret = -1;
    int child = 0;
    if (inject_syscall(t, insn, SYS_CLONE, 0 /* no CLONE_VM, no exit signal */, 0, 0, 0, &ret,
                       &child) || ret <= 0) {
        if (child > 0)
            kill(child, SIGKILL);
        return -1;
    }
    struct thr c = { .tid = (int)ret };
    int st = next_stop(&c);             /* it starts stopped (traced from its birth) */
    /* should we die (SIGALRM, SIGKILL), the copy dies with us: it must never run */
    ptrace(PTRACE_SETOPTIONS, c.tid, 0, (void *)(long)PTRACE_O_EXITKILL);
    if (st < 0) {
        kill((int)ret, SIGKILL);
        return -1;
    }
    s->child = s->rpid = (int)ret;
    s->forked = 1;
    s->insn = insn;
    return 0;
}

/* After the scan: the copy killed, and reaped by the process (its child). */
void drop_snapshot(struct scan *s)
{
    if (!s->child)
        return;
    kill(s->child, SIGKILL);
    int st;
    while (waitpid(s->child, &st, __WALL) < 0 && errno == EINTR)
        ;
    /* the zombie is the process's now: one thread runs wait4(copy, NULL, __WALL) */
    struct thr t = { 0 };
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", s->pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) && !t.tid)
        if (atoi(e->d_name) > 0 && !ptrace(PTRACE_SEIZE, atoi(e->d_name), 0, 0)) {
            t.tid = atoi(e->d_name);
            if (ptrace(PTRACE_INTERRUPT, t.tid, 0, 0) || next_stop(&t) < 0 ||
                ptrace(PTRACE_GETREGS, t.tid, 0, &t.regs)) {
                ptrace(PTRACE_DETACH, t.tid, 0, 0);
                t.tid = 0;
            }
        }
    if (d)
        closedir(d);
    if (t.tid) {
        struct scan one = *s;
        one.th = &t;
        one.nth = 1;
        t.stopped = 1;
        uint64_t insn = syscall_insn(&one, t.tid);
        /* a thread in the program's code, not in a system call: the instruction the copy
         * was made with, if it still is one (before, no wait4 was run: the copy stayed, a
         * zombie child of the process, which a wait() of its own would have reaped) */
        if (!insn && syscall_at(t.tid, s->insn))
            insn = s->insn;
        int64_t ret;
        if (insn)
            inject_syscall(&t, insn, SYS_WAIT4, (uint64_t)s->child, 0, __WALL, 0, &ret, NULL);
        ptrace(PTRACE_DETACH, t.tid, 0, (void *)(long)(t.sig == SIGSTOP ? 0 : t.sig));
    }
    s->child = 0;
}

