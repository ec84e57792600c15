/* tools/scan.c: the reachability scan (issue 20; the result file is specified in
 * mmleak-format(5), "The scan result"; the design in mmleak-scan(7)).
 *
 *   int mmleak_scan(int pid, const char *dir, const char *id, const char *why,
 *                   char *out, size_t outlen, char *err, size_t errlen, uint64_t *totals);
 *
 * Classifies every block live in trace ID (in DIR) of process PID with valgrind memcheck's
 * four kinds and writes DIR/mmleak.ID.scan.S (its name goes to OUT).  WHY: "exit", "demand"
 * or "api".  Returns 0 when the scan was done, 1 when it could not be (a result saying
 * "#status unknown" and why was written if it could be, the reason in ERR too), -1 when not
 * even that could be written (ERR says why).  TOTALS (NULL, or 8 numbers): blocks and bytes
 * of each kind, definite, indirect, possible, reachable.
 *
 * How (read-only for the target: nothing is written into it):
 *  1. the trace's directory lock, for reading (byte 0 of mmleak.ID.lock: a compaction
 *     pass holds it for writing only around its renames and deletions; its flock, held for
 *     the whole pass, is not waited for);
 *  2. every thread seized and stopped (PTRACE_SEIZE + PTRACE_INTERRUPT, listed again until
 *     no new one appears: a stopped thread starts none); their registers;
 *  3. the cut, while they are stopped: every file of the trace opened and held (a pass may
 *     rename or delete it afterwards), the size of each dump file and the lines of its
 *     staging file that it lacks (what a SIGKILL at that moment would leave); the lock let
 *     go;
 *  4. the live set of the cut: the shrink algorithm over exactly those bytes, final, from
 *     each event's address, number, kind and size only (tools/scan_live.c);
 *  5. the roots from /proc/PID/maps and the registers; the marking (an explicit stack, no
 *     recursion), then memcheck's clique pass for the unreached; the memory is read with
 *     process_vm_readv in big chunks (and the heap around a batch of neighbours, ahead);
 *  6. the threads let go (a signal that reached one while we held it is delivered then),
 *     the result written (a hidden temporary file, linked to the first free name).
 * Memory: malloc (never preloaded: mmleak-scan runs without LD_PRELOAD, and the Python side
 * that loads mmleak-tools.so is not traced). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tracer/compiler.h"
#include "../tracer/procstatus.h"

#include "scan_int.h"
#include "scan_live.h"
#include "scan_read.h"

#define REDZONE 128                     /* below the stack pointer (x86-64 ABI) */
#define WINDOW ((size_t)4 << 20)        /* block contents are read this much at a time */
#define TAIL_MAX ((size_t)1 << 30)      /* a staging file bigger than this is not one */
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

static __attribute__((format(printf, 2, 3))) int say(struct scan *s, const char *fmt, ...)
{
    if (s->failed)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, s->errlen, fmt, ap);
    va_end(ap);
    s->failed = 1;
    return -1;
}

static int64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int g_debug = -1;                /* MMLEAK_SCAN_DEBUG: 1, the time of each step, the
                                           cut, the roots, the reads on stderr; 2, also every
                                           word that points into a block */

/* MMLEAK_SCAN_DEBUG=1: the time of the step just done (since the last call), on stderr */
static void step_time(const char *step, int64_t *t)
{
    int64_t now = mono_ns();
    if (unlikely(g_debug > 0))
        fprintf(stderr, "mmleak-scan: time %s %.3f ms\n", step, (now - *t) / 1e6);
    *t = now;
}

/* ---- 1. the threads -------------------------------------------------------------- */

static int have_tid(struct scan *s, int tid)
{
    for (int i = 0; i < s->nth; i++)
        if (s->th[i].tid == tid)
            return 1;
    return 0;
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

static int seize_all(struct scan *s)
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
                if (errno == ESRCH)
                    continue;           /* ended meanwhile */
                int e2 = errno;
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

static void let_go(struct scan *s)
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

/* A `syscall` instruction of the process: where a thread stopped in a system call is. */
static uint64_t syscall_insn(struct scan *s)
{
    for (int t = 0; t < s->nth; t++) {
        const struct user_regs_struct *r = &s->th[t].regs;
        if (s->th[t].tid <= 0 || (int64_t)r->orig_rax < 0 || r->rip < 2)
            continue;
        unsigned char b[2];
        struct iovec l = { b, 2 }, rv = { (void *)(r->rip - 2), 2 };
        if (process_vm_readv(s->pid, &l, 1, &rv, 1, 0) == 2 && b[0] == 0x0f && b[1] == 0x05)
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
        int st = next_stop(t);
        if (st < 0)
            return -1;                  /* gone (or hung in the kernel): nothing to put back */
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
static int snapshot(struct scan *s)
{
    if (under_seccomp(s->pid))
        return -1;                      /* a filter may kill the process for the clone */
    uint64_t insn = syscall_insn(s);
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
    return 0;
}

/* After the scan: the copy killed, and reaped by the process (its child). */
static void drop_snapshot(struct scan *s)
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
        uint64_t insn = syscall_insn(&one);
        int64_t ret;
        if (insn)
            inject_syscall(&t, insn, SYS_WAIT4, (uint64_t)s->child, 0, __WALL, 0, &ret, NULL);
        ptrace(PTRACE_DETACH, t.tid, 0, (void *)(long)(t.sig == SIGSTOP ? 0 : t.sig));
    }
    s->child = 0;
}

/* ---- 2. the cut ------------------------------------------------------------------ */

static int name_is(const char *n, const char *id, const char *suffix, uint64_t *num)
{
    size_t il = strlen(id);
    if (strncmp(n, "mmleak.", 7) || strncmp(n + 7, id, il) || n[7 + il] != '.')
        return 0;
    const char *p = n + 8 + il;
    if (!suffix) {                      /* N.out */
        if (*p < '0' || *p > '9')
            return 0;
        char *end;
        *num = strtoull(p, &end, 10);
        return !strcmp(end, ".out");
    }
    return !strcmp(p, suffix);
}

/* mmleak.ID.compact.N, a newer run of the trace's result (N: 1 to 9 digits; the readers'
 * RUN_RE, mmleaklib/files.py) */
static int run_is(const char *n, const char *id, uint64_t *num)
{
    size_t il = strlen(id);
    if (strncmp(n, "mmleak.", 7) || strncmp(n + 7, id, il) || strncmp(n + 7 + il, ".compact.", 9))
        return 0;
    const char *p = n + 16 + il;
    size_t k = strspn(p, "0123456789");
    if (k < 1 || k > 9 || p[k])
        return 0;
    *num = strtoull(p, NULL, 10);
    return 1;
}

/* The names the result or run open at FD says it folded: its "#folded NAME" lines, among
 * its first lines (those starting with '#', up to the first stack "#s "), that name a dump
 * file or a run of trace ID (whatever else they say: mmleaklib/files.py,
 * _previously_folded).  A pass that stopped after writing it and before deleting its inputs
 * left them: they are in it already.  Appended to *NAMES (*NN of them).  -1: out of memory. */
static int read_folded(int fd, const char *id, char ***names, int *nn)
{
    size_t cap = 1 << 16, have = 0;
    char *buf = malloc(cap);
    if (!buf)
        return -1;
    off_t off = 0;
    for (;;) {
        ssize_t got = pread(fd, buf + have, cap - have, off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        off += got;
        have += (size_t)got;
        char *p = buf, *e = buf + have, *nl;
        int done = 0;
        while ((nl = memchr(p, '\n', (size_t)(e - p)))) {
            if (*p != '#' || (nl - p >= 3 && !memcmp(p, "#s ", 3))) {
                done = 1;
                break;
            }
            if (nl - p > 8 && !memcmp(p, "#folded ", 8)) {
                *nl = 0;
                uint64_t num;
                const char *name = p + 8;
                if (name_is(name, id, NULL, &num) || run_is(name, id, &num)) {
                    char **n = realloc(*names, (size_t)(*nn + 1) * sizeof *n);
                    char *d = n ? strdup(name) : NULL;
                    if (n)
                        *names = n;
                    if (!d) {
                        free(buf);
                        return -1;
                    }
                    n[(*nn)++] = d;
                }
            }
            p = nl + 1;
        }
        if (done || (p == buf && have == cap && cap >= ((size_t)16 << 20)))
            break;                      /* the stacks, or a first line of 16 MiB: no more */
        have -= (size_t)(p - buf);
        memmove(buf, p, have);
        if (have == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                return -1;
            }
            buf = b;
            cap *= 2;
        }
    }
    free(buf);
    return 0;
}

/* the order of the readers (mmleaklib/files.py, find_traces): the result, its runs by N,
 * the dump files by N */
static int cut_order(const void *a, const void *b)
{
    const struct cutf *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank - y->rank;
    return (x->num > y->num) - (x->num < y->num);
}

static char *path_in(struct scan *s, const char *name)
{
    char *p;
    if (asprintf(&p, "%s/%s", s->dir, name) < 0)
        return NULL;
    return p;
}

/* Open a file of the trace: a regular file of UID or root, never through a link. */
static int open_own(const char *path, uid_t uid, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) || !S_ISREG(st->st_mode) || (st->st_uid != uid && st->st_uid != 0)) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

static uid_t trace_owner(struct scan *s)
{
    char name[300];
    snprintf(name, sizeof name, "mmleak.%s.maps", s->id);
    char *p = path_in(s, name);
    struct stat st;
    uid_t u = p && !lstat(p, &st) ? st.st_uid : geteuid();
    free(p);
    return u;
}

/* A lock of byte 0 of the lock file FD, an open file description's (F_OFD_SETLK): TYPE
 * F_RDLCK, F_WRLCK or F_UNLCK.  0, or -1 (errno). */
static int dir_lock(int fd, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

static int lock_exists(struct scan *s)
{
    char name[300];
    snprintf(name, sizeof name, "mmleak.%s.lock", s->id);
    char *p = path_in(s, name);
    struct stat st;
    int there = p && !lstat(p, &st);
    free(p);
    return there;
}

/* The trace's directory lock, for reading, while the cut is listed and opened (take_cut):
 * a compaction pass takes it for writing around each rename of a result or run and each
 * deletion of what it folded (mmleaklib/compact.py, TraceLock.changing; mmleak-compaction(7)),
 * so that the files the cut holds are the trace as a kill of that pass at that moment would
 * leave it.  The pass's own lock (the flock) is not waited for: the files are held open, and
 * a pass goes on meanwhile.  No lock file: no compactor ever ran (*NOLOCK; take_cut looks
 * again after the cut). */
static int take_lock(struct scan *s)
{
    char name[300];
    snprintf(name, sizeof name, "mmleak.%s.lock", s->id);
    char *p = path_in(s, name);
    struct stat st;
    s->lockfd = p ? open_own(p, trace_owner(s), &st) : -1;
    int gone = s->lockfd < 0 && errno == ENOENT;
    free(p);
    if (s->lockfd < 0) {
        s->nolock = gone;
        return gone ? 0 : say(s, "cannot open the trace's lock file: %s", strerror(errno));
    }
    int64_t until = mono_ns() + 30 * 1000000000LL;
    while (dir_lock(s->lockfd, F_RDLCK)) {
        if (errno != EAGAIN && errno != EACCES && errno != EINTR)
            return say(s, "cannot lock the trace's lock file: %s", strerror(errno));
        if (mono_ns() > until)
            return say(s, "the trace's directory lock is held by a compaction pass for 30 s");
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return 0;
}

static void drop_lock(struct scan *s)
{
    if (s->lockfd >= 0) {
        dir_lock(s->lockfd, F_UNLCK);
        close(s->lockfd);
        s->lockfd = -1;
    }
}

/* The lines of the staging file TFD (its bytes BUF, N) that its .out (HAVE bytes) lacks,
 * in order (mmleak-format(5): two halves, each "#at OFFSET" and lines up to a NUL). */
static size_t tail_lines(char *buf, size_t n, uint64_t have)
{
    struct { uint64_t off; size_t body, len; } h[2];
    int nh = 0;
    size_t half = n / 2;
    for (int k = 0; k < 2; k++) {
        size_t a = k ? half : 0, b = k ? n : half;
        if (b - a < 21 || memcmp(buf + a, "#at ", 4))
            continue;
        char *end;
        uint64_t off = strtoull(buf + a + 4, &end, 16);
        if (end != buf + a + 20)
            continue;
        while (end < buf + b && *end == ' ')
            end++;
        if (end >= buf + b || *end != '\n')
            continue;
        size_t body = (size_t)(end + 1 - buf);
        char *nul = memchr(buf + body, 0, b - body);
        h[nh].off = off;
        h[nh].body = body;
        h[nh].len = (nul ? (size_t)(nul - buf) : b) - body;
        nh++;
    }
    if (nh == 2 && h[1].off < h[0].off) {
        __typeof__(h[0]) t = h[0];
        h[0] = h[1];
        h[1] = t;
    }
    size_t w = 0;
    for (int k = 0; k < nh; k++) {
        if (h[k].off + h[k].len <= have)
            continue;
        size_t skip = have > h[k].off ? (size_t)(have - h[k].off) : 0;
        memmove(buf + w, buf + h[k].body + skip, h[k].len - skip);
        w += h[k].len - skip;
        have = h[k].off + h[k].len;
    }
    return w;
}

static void free_cut(struct scan *s)
{
    for (int i = 0; i < s->ncf; i++) {
        free(s->cf[i].path);
        free(s->cf[i].tail);
        if (s->cf[i].fd >= 0)
            close(s->cf[i].fd);
    }
    free(s->cf);
    s->cf = NULL;
    s->ncf = 0;
    s->open_files = 0;
}

static void free_names(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int take_cut(struct scan *s)
{
    uid_t owner = trace_owner(s);
    DIR *d = opendir(s->dir);
    if (!d)
        return say(s, "cannot list %s: %s", s->dir, strerror(errno));
    struct dirent *e;
    char **folded = NULL;
    int nfolded = 0;
    while ((e = readdir(d))) {
        uint64_t num = 0;
        int rank = 0;
        int compact = name_is(e->d_name, s->id, "compact", &num);
        if (!compact && run_is(e->d_name, s->id, &num))
            compact = rank = 1;
        else if (!compact && name_is(e->d_name, s->id, NULL, &num))
            rank = 2;
        else if (!compact)
            continue;
        char *p = path_in(s, e->d_name);
        struct stat st;
        int fd = p ? open_own(p, owner, &st) : -1;
        if (fd < 0) {
            int why = p ? errno : ENOMEM;
            free(p);
            if (why == ENOENT || why == EPERM || why == ELOOP || why == EACCES)
                continue;               /* gone, or not the trace's file: not read */
            closedir(d);
            free_names(folded, nfolded);
            return say(s, "cannot open %s in %s: %s", e->d_name, s->dir, strerror(why));
        }
        struct cutf *n = realloc(s->cf, (size_t)(s->ncf + 1) * sizeof *n);
        if (!n || (compact && read_folded(fd, s->id, &folded, &nfolded))) {
            if (n)
                s->cf = n;
            close(fd);
            free(p);
            closedir(d);
            free_names(folded, nfolded);
            return say(s, "out of memory");
        }
        s->cf = n;
        struct cutf *c = &s->cf[s->ncf++];
        memset(c, 0, sizeof *c);
        c->path = p;
        c->compact = compact;
        c->rank = rank;
        c->num = num;
        c->size = (uint64_t)st.st_size;
        c->fd = fd;
        char end[5];
        c->ended = c->size >= 5 && pread(fd, end, 5, (off_t)c->size - 5) == 5 &&
                   !memcmp(end, "#end\n", 5);
        if (compact || c->ended)
            continue;
        char *tp;
        if (asprintf(&tp, "%.*s.tail", (int)(strlen(p) - 4), p) < 0)
            continue;
        int tfd = open_own(tp, owner, &st);
        free(tp);
        if (tfd < 0)
            continue;
        if (st.st_size > 0 && (size_t)st.st_size <= TAIL_MAX) {
            c->tail = malloc((size_t)st.st_size);
            ssize_t got = c->tail ? pread(tfd, c->tail, (size_t)st.st_size, 0) : -1;
            c->tlen = got > 0 ? tail_lines(c->tail, (size_t)got, c->size) : 0;
        }
        close(tfd);
    }
    closedir(d);
    /* what a result or run names as folded is in it already: left out, as the readers do */
    int k = 0;
    for (int i = 0; i < s->ncf; i++) {
        struct cutf *c = &s->cf[i];
        const char *base = strrchr(c->path, '/') + 1;
        int gone = 0;
        for (int j = 0; j < nfolded && !gone; j++)
            gone = !strcmp(folded[j], base);
        if (gone) {
            free(c->path);
            free(c->tail);
            close(c->fd);
            continue;
        }
        if (!c->compact && !c->ended)
            s->open_files++;
        s->cf[k++] = *c;
    }
    s->ncf = k;
    if (unlikely(g_debug > 0))
        for (int i = 0; i < k; i++)
            fprintf(stderr, "mmleak-scan: cut %s: %llu bytes and %zu of its staging file\n",
                    s->cf[i].path, (unsigned long long)s->cf[i].size, s->cf[i].tlen);
    free_names(folded, nfolded);
    qsort(s->cf, (size_t)s->ncf, sizeof *s->cf, cut_order);
    if (!s->ncf)
        return say(s, "trace %s has no dump file in %s", s->id, s->dir);
    if (!s->open_files)
        return say(s, "trace %s has ended (every dump file says #end): the process exec'd or "
                   "ended before the scan", s->id);
    return 0;
}

/* ---- 3. the live set of the cut (tools/scan_live.c) ------------------------------- */

static struct scan *g_s;                /* for the engine's callbacks (one scan at a time) */
static pthread_mutex_t g_scan_lock = PTHREAD_MUTEX_INITIALIZER;

/* Input I of the live set: the file held since the cut, its first SIZE bytes followed by
 * its staging lines (a line may begin in one and end in the other), read in place (the
 * engine closes it); a result or run is sorted (its lines in address order). */
static int cut_input(int i, struct mmleak_input *in)
{
    struct scan *s = g_s;
    struct cutf *c = &s->cf[i];
    if (c->fd < 0)
        return -1;
    in->fd = c->fd;
    c->fd = -1;
    in->limit = c->size;
    in->tail = c->tail;
    in->tlen = c->tlen;
    in->sorted = c->compact;
    return 0;
}

/* The blocks by page, so that the block a word points into is found without a binary
 * search over millions of addresses (a cache miss per step): regions of pages the blocks
 * cover, split where no block covers RG_GAP pages in a row; per page of a region, the
 * number of blocks that start before its end.  Not built (block_of searches them all)
 * when the pages would be more than 4 per block and a million: blocks far apart. */
#define RG_GAP 16
static void page_index(struct scan *s)
{
    size_t nrg = 0, pages = 0;
    uint64_t last = 0;
    for (size_t i = 0; i < s->nb; i++) {
        uint64_t a = s->bp[i] >> 12, b = (s->bp[i] + (s->bs[i] ? s->bs[i] : 1) - 1) >> 12;
        if (!nrg || a > last + RG_GAP) {
            nrg++;
            pages += b - a + 1;
            last = b;
        } else if (b > last) {
            pages += b - last;
            last = b;
        }
        if (pages > 4 * s->nb + (1u << 20))
            return;
    }
    if (!nrg)
        return;
    s->rg = calloc(nrg, sizeof *s->rg);
    s->ptab = malloc(pages * sizeof *s->ptab);
    if (!s->rg || !s->ptab) {
        free(s->rg);
        free(s->ptab);
        s->rg = NULL;
        s->ptab = NULL;
        return;
    }
    struct region *r = NULL;
    for (size_t i = 0; i < s->nb; i++) {        /* the regions, as counted above */
        uint64_t a = s->bp[i] >> 12, b = (s->bp[i] + (s->bs[i] ? s->bs[i] : 1) - 1) >> 12;
        if (!r || a > r->page + r->npages - 1 + RG_GAP) {
            r = r ? r + 1 : s->rg;
            r->page = a;
            r->npages = 0;
            r->first = i;
        }
        if (b + 1 > r->page + r->npages)
            r->npages = (size_t)(b + 1 - r->page);
    }
    s->nrg = (size_t)(r - s->rg) + 1;
    uint32_t *t = s->ptab;
    size_t j = 0;
    for (size_t k = 0; k < s->nrg; k++) {       /* per page: blocks starting up to it */
        r = &s->rg[k];
        r->tab = t;
        for (size_t p = 0; p < r->npages; p++) {
            while (j < s->nb && (s->bp[j] >> 12) <= r->page + p)
                j++;
            r->tab[p] = (uint32_t)j;
        }
        t += r->npages;
    }
}

static int live_set(struct scan *s)
{
    struct mmleak_live lv;
    g_s = s;
    int rc = mmleak_live_set(s->ncf, cut_input, &lv);
    if (rc)
        return say(s, rc == -1 ? "out of memory reading the trace" :
                   "the trace's files could not all be read");
    s->attached = lv.attached;
    s->glibc = lv.glibc;
    s->nb = lv.n;
    s->bp = lv.ptr;
    s->bs = lv.size;
    s->bq = lv.seq;
    s->st = mmleak_big_alloc(s->nb + 1);
    s->pend = mmleak_big_alloc(s->nb + 1);
    s->stack = mmleak_big_alloc((s->nb + 1) * sizeof *s->stack);
    if (!s->st || !s->pend || !s->stack)
        return say(s, "out of memory for %zu blocks", s->nb);
    memset(s->st, UNREACHED, s->nb + 1);
    memset(s->pend, 0, s->nb + 1);
    s->lo = s->nb ? s->bp[0] : 1;
    s->hi = 0;
    for (size_t i = 0; i < s->nb; i++) {
        uint64_t end = s->bp[i] + (s->bs[i] ? s->bs[i] : 1);
        if (end > s->hi)
            s->hi = end;
    }
    page_index(s);
    return 0;
}

/* ---- 4. the memory map ----------------------------------------------------------- */

static size_t first_block_at_or_after(struct scan *s, uint64_t a)
{
    size_t lo = 0, hi = s->nb;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->bp[mid] < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int read_maps(struct scan *s)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", s->rpid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return say(s, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    s->mapsbuf = malloc(cap + 1);
    for (;;) {
        if (!s->mapsbuf) {
            close(fd);
            return say(s, "out of memory");
        }
        ssize_t r = read(fd, s->mapsbuf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == cap) {
            cap *= 2;
            s->mapsbuf = realloc(s->mapsbuf, cap + 1);
        }
    }
    close(fd);
    s->mapsbuf[n] = 0;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += s->mapsbuf[i] == '\n';
    s->mp = calloc(lines + 1, sizeof *s->mp);
    if (!s->mp)
        return say(s, "out of memory");
    char *line = s->mapsbuf, *save = NULL;
    for (char *l = strtok_r(line, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        struct mapping *m = &s->mp[s->nmp];
        unsigned long long lo, hi, fo;
        int off = 0;
        if (sscanf(l, "%llx-%llx %4s %llx %*s %*s%n", &lo, &hi, m->perm, &fo, &off) < 4)
            continue;
        m->off = fo;
        char *pth = l + off;
        while (*pth == ' ')
            pth++;
        m->lo = lo;
        m->hi = hi;
        m->path = pth;
        size_t i = first_block_at_or_after(s, lo);
        m->heap = i < s->nb && s->bp[i] < hi;
        s->nmp++;
    }
    return 0;
}

static const struct mapping *mapping_at(struct scan *s, uint64_t a)
{
    size_t lo = 0, hi = s->nmp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->mp[mid].hi <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->nmp && s->mp[lo].lo <= a ? &s->mp[lo] : NULL;
}

/* ---- 5. reading the target --------------------------------------------------------- */

/* Read N bytes at A into BUF; what cannot be read is zeros.  Returns the bytes read. */
static size_t rd(struct scan *s, uint64_t a, void *buf, size_t n)
{
    struct iovec l = { buf, n }, r = { (void *)a, n };
    s->reads++;
    ssize_t got = process_vm_readv(s->rpid, &l, 1, &r, 1, 0);
    if (got == (ssize_t)n)
        return n;
    if (got < 0 && errno == ESRCH)
        s->vanished = 1;
    size_t done = got > 0 ? (size_t)got : 0;
    /* a page that cannot be read (a hole of a file mapping, PROT_NONE): page by page */
    while (done < n) {
        uint64_t at = a + done;
        size_t chunk = 4096 - (at & 4095);
        if (chunk > n - done)
            chunk = n - done;
        l.iov_base = (char *)buf + done;
        l.iov_len = r.iov_len = chunk;
        r.iov_base = (void *)at;
        s->reads++;
        got = process_vm_readv(s->rpid, &l, 1, &r, 1, 0);
        if (got != (ssize_t)chunk) {
            size_t ok = got > 0 ? (size_t)got : 0;
            memset((char *)buf + done + ok, 0, chunk - ok);
            s->unreadable += chunk - ok;
        }
        done += chunk;
    }
    return n;
}

/* ---- 6. marking (memcheck's rules: mmleak-format(5), "The scan result") --------------- */

static inline ssize_t block_of(struct scan *s, uint64_t w)
{
    if (w < s->lo || w >= s->hi)
        return -1;
    size_t lo = 0, hi = s->nb;
    if (s->rg) {                        /* the region, then the page: a few blocks */
        uint64_t pg = w >> 12;
        size_t a = 0, b = s->nrg;
        while (a < b) {
            size_t m = (a + b) / 2;
            if (s->rg[m].page <= pg)
                a = m + 1;
            else
                b = m;
        }
        if (!a)
            return -1;
        const struct region *r = &s->rg[a - 1];
        if (pg >= r->page + r->npages)
            return -1;
        size_t p = (size_t)(pg - r->page);
        lo = p ? r->tab[p - 1] : r->first;
        hi = r->tab[p];
        if (lo == hi || s->bp[lo] > w) {        /* none starts in the page at or below W */
            if (lo == r->first)
                return -1;
            lo = hi = lo - 1;
            hi++;
        }
    }
    while (lo < hi) {                   /* the last block starting at or below W */
        size_t mid = (lo + hi) / 2;
        if (s->bp[mid] <= w)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!lo)
        return -1;
    size_t i = lo - 1;
    if (w < s->bp[i] + s->bs[i] || (s->bs[i] == 0 && w == s->bp[i]))
        return (ssize_t)i;
    return -1;
}

static inline void push(struct scan *s, size_t i)
{
    if (!s->pend[i]) {
        s->pend[i] = 1;
        s->stack[s->top++] = (uint32_t)i;
    }
}

/* memcheck's vtable test: A is in a readable file mapping and, among its first 21 words,
 * two non-null ones point into executable file mappings before one that does not. */
static int is_vtable(struct scan *s, uint64_t a)
{
    const struct mapping *m = mapping_at(s, a);
    if (!m || m->perm[0] != 'r' || m->path[0] != '/')
        return 0;
    uint64_t w[21];
    size_t n = 21;
    if (a + n * 8 > m->hi - 8 + 8)
        n = (size_t)((m->hi - a) / 8);
    if (!n)
        return 0;
    rd(s, a, w, n * 8);
    int fns = 0;
    for (size_t k = 0; k < n; k++) {
        if (!w[k])
            continue;
        const struct mapping *f = mapping_at(s, w[k]);
        if (!f || f->perm[2] != 'x' || f->path[0] != '/')
            return 0;
        if (++fns == 2)
            return 1;
    }
    return 0;
}

/* memcheck's heuristics (--leak-check-heuristics=all, its default): may the interior
 * pointer W into block I count as a pointer to its start?
 *
 * What the heuristics read of a block does not change while the scan reads (the process is
 * stopped, or the scan reads its copy), and three of the four depend on the block alone:
 * they are read once per block and kept in s->hk.  Without that, every interior pointer
 * into a block that stays "possible" read its head again, two to four process_vm_readv
 * calls each: perl's exit, where millions of words point into the middle of a few thousand
 * arenas, took 8.7 s instead of a fraction of one. */
enum {
    HK_KNOWN = 1,                       /* the bits below are set */
    HK_LEN8 = 2,                        /* length64 or newarray: an interior pointer at 8 */
    HK_STR24 = 4,                       /* stdstring: an interior pointer at 24 */
    HK_VTABLE = 8,                      /* the first word is a vtable: multipleinheritance */
};

/* What block I's head says, read now (cold: once per block that meets an interior pointer) */
static uint8_t block_head_kinds(struct scan *s, size_t i)
{
    uint64_t b = s->bp[i], sz = s->bs[i], h[2] = { 0, 0 };
    uint8_t k = HK_KNOWN;
    if (sz >= 8)
        rd(s, b, h, sz >= 16 ? 16 : 8);
    if (sz >= 24 && 24 + h[1] + 1 == sz && h[0] <= h[1])
        k |= HK_STR24;                  /* length capacity refcount chars */
    if (sz >= 8 && h[0] > 0 && (sz - 8 == h[0] || (sz - 8) % h[0] == 0))
        k |= HK_LEN8;
    if (sz >= 8 && !(h[0] & 7) && h[0] >= 4096 && is_vtable(s, h[0]))
        k |= HK_VTABLE;
    return k;
}

static int heuristic(struct scan *s, size_t i, uint64_t w)
{
    uint64_t b = s->bp[i], sz = s->bs[i];
    uint64_t off = w - b;
    if (off != 8 && off != 24 && (w & 7))
        return 0;
    if (!s->hk)                         /* NULL when out of memory: read every time */
        s->hk = calloc(s->nb + 1, 1);
    uint8_t k = s->hk ? s->hk[i] : 0;
    if (!(k & HK_KNOWN)) {
        k = block_head_kinds(s, i);
        if (s->hk)
            s->hk[i] = k;
    }
    if (off == 24 && (k & HK_STR24))
        return 1;
    if (off == 8 && (k & HK_LEN8))
        return 1;
    if ((k & HK_VTABLE) && !(w & 7) && w + 8 <= b + sz) {   /* multipleinheritance */
        uint64_t inner;
        rd(s, w, &inner, 8);
        if (!(inner & 7) && inner >= 4096 && is_vtable(s, inner))
            return 1;
    }
    return 0;
}

/* One word W found in memory whose holder is definite (PRIOR: a root, or a reachable
 * block) or not; CLIQUE >= 0: the clique pass of that leader. */
/* glibc's own pointer to the header of the chunk after block I: it overlaps the block's last
 * bytes when the size asked leaves none spare (4321 bytes: a chunk of 4336, the next header
 * at 4320).  malloc_state's top and bins hold such words; they are not the program's. */
static inline int chunk_after(struct scan *s, size_t i, uint64_t w)
{
    uint64_t r = s->bs[i], cs = (r + 8 + 15) & ~15ull;
    if (cs < 32)
        cs = 32;
    return s->glibc && w == s->bp[i] + cs - 16;
}

static inline void found(struct scan *s, uint64_t w, int prior, ssize_t clique)
{
    ssize_t i = block_of(s, w);
    if (i < 0 || (w != s->bp[i] && chunk_after(s, (size_t)i, w)))
        return;
    uint8_t *st = &s->st[i];
    if (clique >= 0) {
        if (*st == UNREACHED && i != clique) {
            *st = INDIRECT;
            push(s, (size_t)i);
        }
        return;
    }
    if (*st == REACHABLE)
        return;
    int start = w == s->bp[i] || heuristic(s, (size_t)i, w);
    if (start && prior) {
        *st = REACHABLE;
        push(s, (size_t)i);
    } else if (*st == UNREACHED) {
        *st = POSSIBLE;
        push(s, (size_t)i);
    }
}


static void scan_words(struct scan *s, const uint64_t *w, size_t n, int prior, ssize_t clique,
                       uint64_t at)
{
    uint64_t lo = s->lo, hi = s->hi;
    for (size_t k = 0; k < n; k++)
        if (unlikely(w[k] >= lo && w[k] < hi)) {
            if (unlikely(g_debug > 1) && block_of(s, w[k]) >= 0)
                fprintf(stderr, "mmleak-scan: %#" PRIx64 " holds %#" PRIx64 " (%s)\n",
                        at + 8 * k, w[k], clique >= 0 ? "clique" : prior ? "definite" :
                        "possible");
            found(s, w[k], prior, clique);
        }
}

/* Scan [A, B) of the target (a root range). */
static void scan_range(struct scan *s, uint64_t a, uint64_t b, int prior, ssize_t clique)
{
    a = (a + 7) & ~7ull;
    b &= ~7ull;
    while (a < b) {
        size_t n = b - a > WINDOW ? WINDOW : (size_t)(b - a);
        rd(s, a, s->win, n);
        s->wlo = s->whi = 0;            /* the window no longer holds a block's memory */
        scan_words(s, (const uint64_t *)s->win, n / 8, prior, clique, a);
        a += n;
    }
}

/* The contents of block I, read on their own (a big block, or one a batch could not read). */
static void scan_block(struct scan *s, size_t i, int prior, ssize_t clique)
{
    uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
    if (a < b)
        scan_range(s, a, b, prior, clique);
}

/* The mark stack, until empty.  Blocks are read in batches: up to IOV_BATCH blocks (and
 * WINDOW bytes) with one process_vm_readv, so that list nodes far apart cost no more than
 * neighbours; the batch in address order, blocks less than GAP bytes apart read as one
 * remote range (the kernel pins the pages of each range: one range per block cost more than
 * reading the memory when the blocks are neighbours, as list nodes allocated in a row are).
 * The states are a fixpoint (reachable only grows; a block upgraded after it was read is
 * pushed and read again), so the order changes neither the verdict nor, in a clique pass,
 * the set its leader reaches. */
#define IOV_BATCH 1024
#define GAP 64
#define CACHE ((size_t)1 << 20)
static void sort_batch(uint32_t *b, size_t n)
{
    size_t k = 1;
    while (k < n && b[k - 1] < b[k])
        k++;
    if (k == n)
        return;
    k = 1;
    while (k < n && b[k - 1] > b[k])
        k++;
    if (k == n) {                       /* popped from the stack: often the reverse */
        for (size_t i = 0, j = n - 1; i < j; i++, j--) {
            uint32_t t = b[i];
            b[i] = b[j];
            b[j] = t;
        }
        return;
    }
    for (size_t i = 1; i < n; i++) {    /* insertion sort: a batch is small */
        uint32_t v = b[i];
        size_t j = i;
        while (j > 0 && b[j - 1] > v) {
            b[j] = b[j - 1];
            j--;
        }
        b[j] = v;
    }
}

/* The heap just read into the cache (s->clo to s->chi), the next stretch of it (DOWN: below,
 * else above) asked of the reader thread, overlapping the cache by CACHE / 16: a batch that
 * straddles the cache's end is in it whole. */
static void read_ahead(struct scan *s, int down)
{
    const struct mapping *m = mapping_at(s, down ? s->clo : s->chi - 1);
    if (!m)
        return;
    uint64_t lo, hi;
    if (down) {
        if (s->clo <= m->lo)
            return;
        hi = s->clo + CACHE / 16;
        lo = hi - m->lo > CACHE ? hi - CACHE : m->lo;
    } else {
        if (s->chi >= m->hi)
            return;
        lo = s->chi - CACHE / 16;
        hi = m->hi - lo > CACHE ? lo + CACHE : m->hi;
    }
    reader_ask(s->rd, lo, hi);
}

static void drain(struct scan *s, ssize_t clique)
{
    static uint32_t batch[IOV_BATCH];
    static struct iovec riov[IOV_BATCH];
    static size_t boff[IOV_BATCH];
    while (s->top) {
        size_t n = 0, bytes = 0;
        while (s->top && n < IOV_BATCH) {
            size_t i = s->stack[s->top - 1];
            uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
            size_t len = a < b ? (size_t)(b - a) : 0;
            if (len > WINDOW / 4) {     /* a big block: alone, in chunks */
                if (n)
                    break;
                s->top--;
                s->pend[i] = 0;
                scan_block(s, i, clique >= 0 || s->st[i] != POSSIBLE, clique);
                continue;
            }
            if (bytes + len + GAP > WINDOW)     /* room for a gap read with each block */
                break;
            s->top--;
            s->pend[i] = 0;
            if (!len)
                continue;
            batch[n++] = (uint32_t)i;
            bytes += len + GAP;
        }
        if (!n)
            continue;
        sort_batch(batch, n);
        /* the remote ranges: each block's, merged with the one before when the gap is
         * small; BOFF[k] is where block k's bytes land in the window */
        size_t nr = 0, off = 0;
        uint64_t end = 0;
        for (size_t k = 0; k < n; k++) {
            size_t i = batch[k];
            uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
            if (nr && a >= end && a - end < GAP) {
                riov[nr - 1].iov_len += (size_t)(b - end);
                boff[k] = off + (size_t)(a - end);
                off += (size_t)(b - end);
            } else {
                riov[nr].iov_base = (void *)a;
                riov[nr].iov_len = (size_t)(b - a);
                nr++;
                boff[k] = off;
                off += (size_t)(b - a);
            }
            end = b;
        }
        /* a batch that is one range (the nodes of lists allocated in a row): the heap
         * around it, CACHE bytes in one read, which the next batches, nearby, take from
         * (the process is stopped, or a snapshot: its memory does not change); ahead in
         * the direction the batches go */
        uint64_t a0 = (uint64_t)riov[0].iov_base;
        uint64_t bn = (uint64_t)riov[nr - 1].iov_base + riov[nr - 1].iov_len;
        int cached = s->cw && a0 >= s->clo && bn <= s->chi, filled = 0;
        if (!cached && s->rd && nr == 1 &&
            reader_take(s->rd, a0, bn, &s->cw, &s->clo, &s->chi))
            cached = filled = 1;        /* the range read ahead */
        if (!cached && s->cw && nr == 1 && bn - a0 <= CACHE / 4) {
            const struct mapping *m = mapping_at(s, a0);
            if (m && bn <= m->hi) {
                uint64_t lo, hi;
                if (a0 < s->last_a) {           /* going down: the window ends with it */
                    hi = (bn + 4095) & ~4095ull;
                    hi = hi > m->hi ? m->hi : hi;
                    lo = hi - m->lo > CACHE ? hi - CACHE : m->lo;
                } else {                        /* up, or first: from it, or around it */
                    lo = a0 > s->last_a ? a0 : a0 - (a0 - m->lo < CACHE / 2 ? a0 - m->lo :
                                                     CACHE / 2);
                    lo = lo & ~4095ull;
                    lo = lo < m->lo ? m->lo : lo;
                    hi = m->hi - lo < CACHE ? m->hi : lo + CACHE;
                }
                struct iovec cl = { s->cw, (size_t)(hi - lo) }, cr = { (void *)lo, cl.iov_len };
                s->clo = s->chi = 0;
                if (lo <= a0 && bn <= hi && ++s->reads &&
                    process_vm_readv(s->rpid, &cl, 1, &cr, 1, 0) == (ssize_t)cl.iov_len) {
                    s->clo = lo;
                    s->chi = hi;
                    cached = filled = 1;
                }
            }
        }
        if (filled && s->rd)
            read_ahead(s, a0 < s->last_a);
        s->last_a = a0;
        ssize_t got = -1;
        if (!cached) {
            struct iovec l = { s->win, off };
            s->reads++;
            got = process_vm_readv(s->rpid, &l, 1, riov, nr, 0);
            if (got < 0 && errno == ESRCH)
                s->vanished = 1;
        }
        for (size_t k = 0; k < n; k++) {
            size_t i = batch[k];
            uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
            size_t len = (size_t)(b - a);
            int prior = clique >= 0 || s->st[i] != POSSIBLE;
            if (cached) {
                scan_words(s, (const uint64_t *)(s->cw + (a - s->clo)), len / 8, prior,
                           clique, a);
            } else if (got >= 0 && boff[k] + len <= (size_t)got) {
                scan_words(s, (const uint64_t *)(s->win + boff[k]), len / 8, prior, clique,
                           a);
            } else {                    /* not read (a page gone?): on its own, then */
                uint64_t *tmp = malloc(len);
                if (tmp) {
                    rd(s, a, tmp, len);
                    scan_words(s, tmp, len / 8, prior, clique, a);
                    free(tmp);
                }
            }
        }
    }
}

static int is_own(struct scan *s, const struct mapping *m)
{
    const char *p = m->path;
    size_t n = strlen(p);
    if (n >= 10 && !strcmp(p + n - 10, "/mmleak.so"))
        return 1;
    if (!strncmp(p, "[anon:mmleak", 12))
        return 1;
    if (n > 5 && !strcmp(p + n - 5, ".tail") && strstr(p, "/mmleak."))
        return 1;
    (void)s;
    return 0;
}

/* mmleak.so's .bss past its last file page: an anonymous mapping in /proc/PID/maps, right
 * after mmleak.so's writable one.  Its end is read from mmleak.so's program headers, in the
 * process (the ELF header is in the mapping at file offset 0).  Sets s->own_lo, own_hi. */
static void own_bss(struct scan *s)
{
    for (size_t k = 0; k < s->nmp; k++) {
        const struct mapping *m = &s->mp[k];
        size_t n = strlen(m->path);
        if (m->off || n < 10 || strcmp(m->path + n - 10, "/mmleak.so"))
            continue;
        unsigned char eh[64];
        uint64_t ph[56 / 8];
        if (rd(s, m->lo, eh, sizeof eh) != sizeof eh || memcmp(eh, "\177ELF\2\1", 6))
            return;
        uint64_t phoff, end = 0, first = UINT64_MAX;
        uint16_t phnum, phentsize;
        memcpy(&phoff, eh + 32, 8);
        memcpy(&phentsize, eh + 54, 2);
        memcpy(&phnum, eh + 56, 2);
        if (phentsize != 56 || phnum > 64 || phoff > 4096)
            return;
        for (unsigned i = 0; i < phnum; i++) {
            memset(ph, 0, sizeof ph);
            rd(s, m->lo + phoff + i * 56ull, ph, 56);
            if ((uint32_t)ph[0] != 1 /* PT_LOAD */)
                continue;
            uint64_t vaddr = ph[2], memsz = ph[5];
            if (vaddr < first)
                first = vaddr & ~4095ull;
            if (vaddr + memsz > end)
                end = vaddr + memsz;
        }
        if (first == UINT64_MAX || end <= first || end - first > ((uint64_t)1 << 32))
            return;
        end = (m->lo - first + end + 4095) & ~4095ull;
        /* the anonymous mapping that starts where one of mmleak.so's file mappings ends */
        for (size_t j = k + 1; j < s->nmp && s->mp[j].lo < end; j++)
            if (!s->mp[j].path[0] && s->mp[j - 1].hi == s->mp[j].lo &&
                strstr(s->mp[j - 1].path, "/mmleak.so")) {
                s->own_lo = s->mp[j].lo;
                s->own_hi = end < s->mp[j].hi ? end : s->mp[j].hi;
                return;
            }
        return;
    }
}

static size_t read_cb(void *ctx, uint64_t a, void *buf, size_t n)
{
    return rd(ctx, a, buf, n);
}

/* mmleak.so's own anonymous mappings, as the list it keeps says (tracer/ownlist.h): where the
 * kernel keeps no names, nothing else tells them from the program's, and they hold copies of
 * the program's words (its recent stack walks).  Sets s->own, s->nown. */
static void own_maps(struct scan *s)
{
    for (size_t k = 0; k < s->nmp && !s->own; k++) {
        const struct mapping *m = &s->mp[k];
        size_t n = strlen(m->path);
        if (m->perm[0] == 'r' && m->perm[1] == 'w' && n >= 10 &&
            !strcmp(m->path + n - 10, "/mmleak.so"))
            s->nown = mml_own_ranges(read_cb, s, m->lo, m->hi, &s->own);
    }
}

/* Is mapping K the stack of a thread that glibc took back (joined, or detached and ended:
 * its stack waits in glibc's cache, to be reused or unmapped; valgrind's __libc_freeres
 * unmaps those, LeakSanitizer reads live threads only)?  Right above a guard page, with
 * glibc's descriptor at its top saying so (mml_dead_pthread), which no thread of the
 * process has.  Sets *PDP, the descriptor, and *END, where the dead stack ends. */
static int dead_stack(struct scan *s, size_t k, uint64_t *pdp, uint64_t *end)
{
    const struct mapping *m = &s->mp[k];
    if (m->path[0] || !k || s->mp[k - 1].hi != m->lo || strcmp(s->mp[k - 1].perm, "---p"))
        return 0;
    if (!s->layout) {
        s->layout = -1;
        for (size_t j = 0; j < s->nmp && s->layout < 0; j++) {
            const char *b = strrchr(s->mp[j].path, '/');
            if (b && s->mp[j].off == 0 && (!strncmp(b, "/libc.so.", 9) ||
                                           !strncmp(b, "/libpthread.so.", 15)) &&
                !mml_pthread_layout(s->pid, s->mp[j].path, &s->pl))
                s->layout = 1;
        }
    }
    if (s->layout < 0 || mml_dead_pthread(read_cb, s, &s->pl, m->lo, m->hi, pdp, end) != 1)
        return 0;
    for (int t = 0; t < s->nth; t++)
        if (s->th[t].tid > 0 && s->th[t].regs.fs_base == *pdp)
            return 0;
    return 1;
}

/* Is mapping M one of glibc's heaps, though it holds no live block ([heap], or a thread
 * arena's: mml_arena_heap)?  Its memory is free chunks: the stale words of blocks freed,
 * which valgrind never reads.  Only when the trace is glibc's malloc, and not an attached
 * one (blocks allocated before the attach may be there). */
static int glibc_heap(struct scan *s, const struct mapping *m)
{
    if (!s->glibc || s->attached || m->perm[3] != 'p')
        return 0;
    return !strcmp(m->path, "[heap]") ||
           (!m->path[0] && mml_arena_heap(read_cb, s, m->lo, m->hi));
}

/* May the pages of mapping M that are neither in memory nor in swap be left unread?  Yes
 * for private anonymous memory (they read as zeros); not for a file's pages (their contents
 * are the file's) nor for shared memory (another process may have written them). */
static int zero_unless_present(const struct mapping *m)
{
    const char *p = m->path;
    return m->perm[3] == 'p' && (!p[0] || !strcmp(p, "[stack]") || !strcmp(p, "[heap]") ||
                                 !strncmp(p, "[anon:", 6));
}

#define PM_BATCH 4096                   /* pagemap entries read at a time (16 MiB of memory) */

/* Scan root [A, B) of mapping M, skipping the pages that hold nothing (never touched, or
 * dropped: MADV_DONTNEED) when M allows it: an idle thread's 8 MiB stack, a big .bss, an
 * arena mapped and never filled cost the pages in use, not their size.  A page that is in
 * memory or in swap (bits 63, 62 of its /proc/PID/pagemap entry) is read. */
static void scan_present(struct scan *s, const struct mapping *m, uint64_t a, uint64_t b)
{
    if (s->pagemap == -2) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/pagemap", s->rpid);
        s->pagemap = open(path, O_RDONLY | O_CLOEXEC);
        s->pm = s->pagemap >= 0 ? malloc(PM_BATCH * 8) : NULL;
        if (!s->pm && s->pagemap >= 0) {
            close(s->pagemap);
            s->pagemap = -1;
        }
    }
    if (s->pagemap < 0 || !zero_unless_present(m)) {
        scan_range(s, a, b, 1, -1);
        return;
    }
    uint64_t page = a & ~4095ull;
    while (page < b) {
        uint64_t n = (b - page + 4095) / 4096;
        if (n > PM_BATCH)
            n = PM_BATCH;
        ssize_t got = pread(s->pagemap, s->pm, n * 8, (off_t)(page / 4096 * 8));
        if (got != (ssize_t)(n * 8)) {          /* cannot tell: read it all */
            scan_range(s, page > a ? page : a, b, 1, -1);
            return;
        }
        for (uint64_t i = 0; i < n;) {
            if (!(s->pm[i] >> 62)) {            /* neither present nor swapped */
                i++;
                continue;
            }
            uint64_t j = i;
            while (j < n && s->pm[j] >> 62)
                j++;
            uint64_t lo = page + i * 4096, hi = page + j * 4096;
            scan_range(s, lo > a ? lo : a, hi < b ? hi : b, 1, -1);
            i = j;
        }
        page += n * 4096;
    }
}

static void root_range(struct scan *s, const struct mapping *m, int kind, uint64_t a,
                       uint64_t b)
{
    if (b <= a)
        return;
    s->roots[kind][0]++;
    s->roots[kind][1] += b - a;
    if (unlikely(g_debug > 0))
        fprintf(stderr, "mmleak-scan: root %s %#" PRIx64 "-%#" PRIx64 "\n", ROOT_NAME[kind], a,
                b);
    scan_present(s, m, a, b);
}

/* Root [A, B) of mapping M, less mmleak.so's own mappings (own_maps) in it: the kernel merges
 * neighbouring anonymous mappings, so one of ours may be a part of a mapping, anywhere. */
static void add_root(struct scan *s, const struct mapping *m, int kind, uint64_t a, uint64_t b)
{
    size_t lo = 0, hi = s->nown;
    while (lo < hi) {                   /* the first of ours that ends after A */
        size_t mid = (lo + hi) / 2;
        if (s->own[mid].hi <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t k = lo; k < s->nown && s->own[k].lo < b && a < b; k++) {
        uint64_t olo = s->own[k].lo > a ? s->own[k].lo : a;
        uint64_t ohi = s->own[k].hi < b ? s->own[k].hi : b;
        root_range(s, m, kind, a, olo);
        s->excluded[0]++;
        s->excluded[1] += ohi - olo;
        a = ohi;
    }
    root_range(s, m, kind, a, b);
}

/* The floor of the thread that asked (mmleak_scan_floor): kept only when that thread is
 * held, and the floor is at or above its stack pointer in the same mapping. */
static void check_floor(struct scan *s)
{
    int ok = 0;
    for (int t = 0; s->floor && t < s->nth; t++) {
        if (s->th[t].tid <= 0 || s->th[t].tid != s->floor_tid)
            continue;
        uint64_t sp = s->th[t].regs.rsp;
        const struct mapping *m = mapping_at(s, sp);
        ok = m && s->floor >= sp && s->floor < m->hi;
    }
    if (!ok)
        s->floor = 0;
}

static void mark(struct scan *s)
{
    own_bss(s);
    own_maps(s);
    /* registers */
    check_floor(s);
    for (int t = 0; t < s->nth; t++) {
        if (s->th[t].tid <= 0)
            continue;
        const uint64_t *r = (const uint64_t *)&s->th[t].regs;
        size_t n = sizeof s->th[t].regs / 8;
        /* the thread that asked (a floor): its thread pointers only, fs_base and gs_base
         * (the others are mmleak.so's; the program's callee-saved ones are on its stack) */
        int asked = s->floor && s->th[t].tid == s->floor_tid;
        s->roots[R_REGISTER][0]++;
        s->roots[R_REGISTER][1] += asked ? 16 : n * 8;
        for (size_t k = 0; k < n; k++)
            if (r[k] >= s->lo && r[k] < s->hi &&
                (!asked || k * 8 == offsetof(struct user_regs_struct, fs_base) ||
                 k * 8 == offsetof(struct user_regs_struct, gs_base))) {
                if (g_debug > 1 && block_of(s, r[k]) >= 0)
                    fprintf(stderr, "mmleak-scan: register %zu of thread %d holds %#" PRIx64
                            "\n", k, s->th[t].tid, r[k]);
                found(s, r[k], 1, -1);
            }
    }
    drain(s, -1);
    for (size_t k = 0; k < s->nmp; k++) {
        const struct mapping *m = &s->mp[k];
        if (m->perm[0] != 'r' || m->perm[1] != 'w')
            continue;
        if (is_own(s, m) || (m->lo >= s->own_lo && m->hi <= s->own_hi)) {
            s->excluded[0]++;
            s->excluded[1] += m->hi - m->lo;
            continue;
        }
        if (!strcmp(m->path, "[vvar]") || !strcmp(m->path, "[vsyscall]") ||
            !strncmp(m->path, "/dev/", 5) || !strcmp(m->path, "[vvar_vclock]"))
            continue;
        /* a thread's stack: from its stack pointer (less the red zone) up */
        uint64_t from = m->lo;
        int stack = 0;
        for (int t = 0; t < s->nth; t++) {
            uint64_t sp = s->th[t].regs.rsp;
            if (s->th[t].tid > 0 && sp >= m->lo && sp < m->hi) {
                uint64_t f = sp - REDZONE < m->lo ? m->lo : sp - REDZONE;
                if (s->floor && s->th[t].tid == s->floor_tid)
                    f = s->floor;
                if (!stack || f < from)
                    from = f;
                stack = 1;
            }
        }
        if (!stack && !strcmp(m->path, "[stack]"))
            continue;                   /* no thread of ours there (it ended) */
        if (!stack && m->lo == s->own_lo && m->hi > s->own_hi) {
            from = s->own_hi;           /* mmleak.so's .bss, and memory mapped right after */
            s->excluded[0]++;
            s->excluded[1] += s->own_hi - s->own_lo;
        }
        if (!m->heap && !stack && glibc_heap(s, m)) {
            if (unlikely(g_debug > 0))
                fprintf(stderr, "mmleak-scan: %#" PRIx64 "-%#" PRIx64 " is a glibc heap with "
                        "no live block (not a root)\n", m->lo, m->hi);
            s->glibc_ex[0]++;
            s->glibc_ex[1] += m->hi - m->lo;
            continue;
        }
        if (m->heap) {
            if (!s->attached)
                continue;
            /* blocks allocated before the attach are not known: the memory between known
             * blocks is taken as roots, so that nothing reachable through them is lost */
            uint64_t a = m->lo;
            for (size_t i = first_block_at_or_after(s, m->lo); i < s->nb && s->bp[i] < m->hi;
                 i++) {
                add_root(s, m, R_UNTRACED, a, s->bp[i]);
                uint64_t e = s->bp[i] + s->bs[i];
                if (e > a)
                    a = e;
            }
            add_root(s, m, R_UNTRACED, a, m->hi);
            drain(s, -1);
            continue;
        }
        uint64_t pd, dead_end;
        if (!stack && dead_stack(s, k, &pd, &dead_end)) {
            if (unlikely(g_debug > 0))
                fprintf(stderr, "mmleak-scan: %#" PRIx64 "-%#" PRIx64 " is the stack of a "
                        "thread joined (not a root)\n", m->lo, dead_end);
            /* but for its descriptor's header (tcb, dtv): glibc keeps the thread's DTV with
             * the stack, to reuse both; it stays what it was, possibly lost (dtv points to
             * its second word), never definitely lost */
            add_root(s, m, R_ANON, pd, pd + 16);
            drain(s, -1);
            s->glibc_ex[0]++;
            s->glibc_ex[1] += dead_end - m->lo - 16;
            from = dead_end;
        }
        int kind = stack ? R_STACK : m->path[0] == '/' ? (m->perm[3] == 's' ? R_FILE : R_OBJECT)
                                                       : R_ANON;
        add_root(s, m, kind, from, m->hi);
        drain(s, -1);
    }
    /* memcheck's cliques: each unreached block, in address order, leads the blocks only it
     * reaches (indirectly lost); it stays definitely lost */
    for (size_t i = 0; i < s->nb; i++)
        if (s->st[i] == UNREACHED) {
            push(s, i);
            drain(s, (ssize_t)i);
        }
    for (size_t i = 0; i < s->nb; i++) {
        int k = s->st[i] == UNREACHED ? DEFINITE : s->st[i];
        s->st[i] = (uint8_t)k;
        s->kinds[k][0]++;
        s->kinds[k][1] += s->bs[i];
    }
}

static void release(struct scan *s)
{
    let_go(s);
    drop_lock(s);
    free_cut(s);
    free(s->th);
    free(s->bp); free(s->bs); free(s->bq); free(s->st); free(s->hk); free(s->pend); free(s->stack);
    free(s->rg); free(s->ptab);
    free(s->mapsbuf);
    free(s->mp);
    free(s->own);
    if (s->pagemap >= 0)
        close(s->pagemap);
    free(s->pm);
    if (s->win)
        munmap(s->win, WINDOW);
    if (s->cw)
        munmap(s->cw, CACHE);
}

static int valid_id(const char *id)
{
    if (!*id || strlen(id) > 40)
        return 0;
    for (const char *p = id; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '-'))
            return 0;
    return 1;
}

/* mmleak_scan, with FLOOR_TID's stack scanned from FLOOR up (0 0: none).  The thread that
 * asked for the scan (at exit, or mmleak_leak_check) waits for it in mmleak.so, whose frames
 * hold stale copies of addresses (its stack walks'): FLOOR is where the program's part of
 * that stack begins, below the program's callee-saved registers, which mmleak.so's entry
 * pushed there.  That thread's registers are then not roots (mmleak.so's, at a system call;
 * the program's caller-saved registers are dead across its call, by the ABI).  A FLOOR not
 * in the mapping of the thread's stack pointer, or below that pointer, is ignored. */
int mmleak_scan_floor(int pid, const char *dir, const char *id, const char *why,
                      char *out, size_t outlen, char *err, size_t errlen,
                      uint64_t *totals, int floor_tid, uint64_t floor)
{
    if (pid <= 0 || !dir || !id || !why || !valid_id(id) || !err || !errlen || !out) {
        if (err && errlen)
            snprintf(err, errlen, "bad arguments");
        return -1;
    }
    pthread_mutex_lock(&g_scan_lock);
    struct scan s;
    memset(&s, 0, sizeof s);
    s.pid = pid;
    s.dir = dir;
    s.id = id;
    s.why = why;
    s.err = err;
    s.errlen = errlen;
    s.lockfd = -1;
    s.pagemap = -2;
    s.floor_tid = floor_tid;
    s.floor = floor;
    if (g_debug < 0) {
        const char *d = getenv("MMLEAK_SCAN_DEBUG");
        g_debug = d && *d >= '1' && *d <= '9' && !d[1] ? *d - '0' : 0;
    }
    err[0] = 0;
    out[0] = 0;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    s.when = (double)tv.tv_sec + tv.tv_usec / 1e6;
    s.win = mmap(NULL, WINDOW, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    s.cw = mmap(NULL, CACHE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s.cw == MAP_FAILED)
        s.cw = NULL;                    /* (the batches are read as they come) */
    if (s.win == MAP_FAILED) {
        s.win = NULL;
        say(&s, "out of memory");
    }
    int64_t tstep = mono_ns();
    if (!s.failed)
        take_lock(&s);
    step_time("lock", &tstep);
    int64_t t0 = mono_ns();
    if (!s.failed)
        seize_all(&s);
    step_time("stop", &tstep);
    if (!s.failed) {
        gettimeofday(&tv, NULL);
        s.when = (double)tv.tv_sec + tv.tv_usec / 1e6;
        take_cut(&s);
        /* no lock file before the cut, one now: a first compaction pass began meanwhile
         * and may have changed what the cut listed: again, under its lock */
        if (!s.failed && s.nolock && lock_exists(&s)) {
            free_cut(&s);
            s.nolock = 0;
            if (!take_lock(&s))
                take_cut(&s);
        }
    }
    drop_lock(&s);
    step_time("cut", &tstep);
    s.rpid = pid;
    /* on demand: a copy, so that the process goes on while the scan reads */
    if (!s.failed && !strcmp(why, "demand") &&
        !snapshot(&s)) {
        let_go(&s);
    }
    s.stall = (mono_ns() - t0) / 1e9;
    step_time("snapshot", &tstep);
    if (!s.failed)
        live_set(&s);
    step_time("live-set", &tstep);
    if (!s.failed)
        read_maps(&s);
    step_time("maps", &tstep);
    if (!s.failed && s.cw && s.nb)
        s.rd = reader_start(s.rpid, CACHE, s.hi - s.lo);
    if (!s.failed)
        mark(&s);
    if (s.rd) {
        s.reads += reader_stop(s.rd);
        s.rd = NULL;
        if (unlikely(g_debug > 0))
            fprintf(stderr, "mmleak-scan: marking read ahead by a thread\n");
    }
    if (unlikely(g_debug > 0))
        fprintf(stderr, "mmleak-scan: reads %" PRIu64 " (process_vm_readv calls of marking)\n",
                s.reads);
    step_time("mark", &tstep);
    /* a thread that ended, or a process gone (SIGKILL), while we held it: no verdict */
    for (int t = 0; !s.failed && t < s.nth; t++) {
        int st;
        if (s.th[t].tid > 0 && s.th[t].stopped &&
            waitpid(s.th[t].tid, &st, __WALL | WNOHANG) == s.th[t].tid &&
            (WIFEXITED(st) || WIFSIGNALED(st))) {
            s.th[t].stopped = 0;
            s.vanished = 1;
        }
    }
    if (s.vanished && !s.failed)
        say(&s, "process %d ended during the scan", pid);
    if (!s.child)
        s.stall = (mono_ns() - t0) / 1e9;
    let_go(&s);
    drop_snapshot(&s);
    int rc = s.failed ? 1 : 0;
    if (totals)
        memcpy(totals, s.kinds, sizeof s.kinds);
    step_time("let-go", &tstep);
    if (scan_write_result(&s, out, outlen)) {
        if (!s.failed)
            snprintf(err, errlen, "cannot write the result in %s", dir);
        rc = -1;
    }
    step_time("result", &tstep);
    release(&s);
    pthread_mutex_unlock(&g_scan_lock);
    return rc;
}

EXPORT int mmleak_scan(int pid, const char *dir, const char *id, const char *why, char *out,
                       size_t outlen, char *err, size_t errlen, uint64_t *totals)
{
    return mmleak_scan_floor(pid, dir, id, why, out, outlen, err, errlen, totals, 0, 0);
}

EXPORT int mmleak_scan_abi(void) { return 1; }
