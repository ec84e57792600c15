/*
 * tracer/exitscan.c: the reachability scan at the process's exit (issue 20; see
 * mmleak-scan(7)).  mmleak.so's destructor runs last of all (it was loaded first), inside
 * _dl_fini, after the program's atexit handlers and every other library's destructors: then,
 * unless MMLEAK_SCAN=0, it releases libstdc++'s one-time memory (__gnu_cxx::__freeres: the
 * emergency exception pool) and starts mmleak-scan (beside mmleak.so, without LD_PRELOAD),
 * allows it to trace us (PR_SET_PTRACER), and waits for it: the scanner stops every thread
 * left, takes the trace's cut, marks, writes mmleak.ID.scan.S and lets the threads go.
 *
 * _exit and _Exit scan too (mml_exit_from, mmleak.c), as no destructor runs after them.
 * Nothing here runs per event, and nothing after abort, a fatal signal or SIGKILL (no
 * destructor runs): such a trace has no scan, "reachability unknown".
 * __libc_freeres is not called: it frees libc's internal state while other threads may still
 * run and use it (valgrind calls it only once the last thread is gone; heaptrack stopped
 * calling it).  The blocks it would free are reachable from libc's data anyway.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <stdint.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#if defined(__x86_64__)
#include <asm/prctl.h>
#endif
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "procstatus.h"
#include "../tools/scan_names.h"

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

extern char **environ;

static char *put_num(char *d, char *e, unsigned long v)
{
    char t[24];
    int n = 0;
    do
        t[n++] = (char)('0' + v % 10);
    while ((v /= 10) && n < 23);
    while (n && d < e - 1)
        *d++ = t[--n];
    *d = 0;
    return d;
}

static int scanner_path(char *buf, size_t cap);

static void put_hex(char *d, char *e, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char t[17];
    int n = 0;
    do
        t[n++] = digits[v & 15];
    while ((v >>= 4) && n < 16);
    while (n && d < e - 1)
        *d++ = t[--n];
    *d = 0;
}

/* The scanner beside mmleak.so: 0, or -1 (not found; BUF then holds the path looked at, or
 * "" when mmleak.so's own path is not known). */
static int scanner_path(char *buf, size_t cap)
{
    const char *self = mml_object_name((const void *)scanner_path);
    buf[0] = 0;
    if (!self || self[0] != '/')
        return -1;
    const char *slash = strrchr(self, '/');
    size_t n = (size_t)(slash - self) + 1;
    if (n + sizeof "mmleak-scan" > cap)
        return -1;
    memcpy(buf, self, n);
    memcpy(buf + n, "mmleak-scan", sizeof "mmleak-scan");
    return access(buf, X_OK);
}

/* Start PATH with ARGV and ENV, every signal blocked (the caller blocked them, glibc's
 * own two as well, by the system call: a vfork child shares our memory, so no handler may
 * run in it; mmleak-scan unblocks them in its main).  vfork and the execve system call,
 * not posix_spawn: glibc's posix_spawn child resets every signal's handler for the same
 * reason, 124 rt_sigaction calls at every exit, and maps a stack; the raw execve, not the
 * libc function: execve is one of our hooks (the trace's end), which must not run in the
 * child.  The child's pid, or -1. */
static __attribute__((noinline)) pid_t spawn_blocked(const char *path, char **argv,
                                                       char **env)
{
    volatile int failed = 0;            /* (the child's write is ours: one memory) */
    pid_t child = vfork();
    if (child == 0) {
        mml_sys(SYS_execve, path, argv, env);
        failed = 1;
        mml_sys(SYS_exit_group, 127);
    }
    if (child > 0 && failed) {          /* as posix_spawn reports it: no child */
        while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
            ;
        return -1;
    }
    return child;
}

/* Why the scan wrote no result (the scanner's words, mmleak-scan's exit status 3), or "". */
static char scan_err[512];

/* The scan could write no result, nor its "#status unknown" (a daemon that became another
 * user can no longer create files in the root-owned directory its trace began in: ngircd,
 * nsd): its reason would be on stderr only, which a daemon's user never sees, and the report
 * would give the usual "no scan ran".  Our own dump file is still open and ours to write:
 * the reason goes there, one "#noscan WHY REASON" line (mmleak-format(5)), escaped as
 * "#cmd", which the report shows in place of "no scan ran". */
static COLD void note_scan_error(const char *why, const char *reason)
{
    char line[sizeof scan_err * 4 + 64], *e = line + sizeof line;
    char *d = cat(line, e, "#noscan ");
    d = cat(d, e, why);
    d = cat(d, e, " ");
    escape_into(d, e - 1, (const unsigned char *)reason, strlen(reason), 0);
    d += strlen(d);
    *d++ = '\n';
    emit(line, (size_t)(d - line));
}

/* No mmleak-scan beside mmleak.so (a copy of mmleak.so installed alone): the scan at the exit
 * cannot run, and the report would say "reachability unknown" without why.  So mmleak.so
 * writes the result the scanner would have written for a scan it could not do, a
 * "#status unknown" header (mmleak-format(5)), naming the path it looked at: the report shows
 * its reason where it explains every missing scan, and the program's stderr stays its own.
 * Made with O_EXCL as mmleak.ID.scan.K, the first free K (tools/scan_names.h), in one write of
 * its few lines (no temporary file and link as mmleak-scan does: a reader that comes between
 * the create and the write finds no first line and skips the file, as it skips any file not a
 * scan). */
static COLD void note_no_scanner(const char *looked)
{
    char text[PATH_MAX + 256], *e = text + sizeof text, *d = text;
    struct timespec ts = { 0, 0 };
    clock_gettime(CLOCK_REALTIME, &ts);
    d = cat(d, e, "#mmleak-scan 1 id=");
    d = cat(d, e, g_id);
    d = cat(d, e, " pid=");
    d = cat_u(d, e, (unsigned long)getpid());
    d = cat(d, e, "\n#when exit time=");
    d = cat_u(d, e, (unsigned long)ts.tv_sec);
    d = cat(d, e, ".");
    char us[8];
    unsigned long u = (unsigned long)ts.tv_nsec / 1000;
    for (int i = 5; i >= 0; i--, u /= 10)
        us[i] = (char)('0' + u % 10);
    us[6] = 0;
    d = cat(d, e, us);
    d = cat(d, e, " by=mmleak.so\n#status unknown no scan at the exit: mmleak-scan not found "
                  "beside mmleak.so");
    if (*looked) {
        d = cat(d, e, " (");
        for (const char *c = looked; *c && d < e - 3; c++)     /* one line, whatever the path */
            *d++ = (unsigned char)*c < ' ' ? '?' : *c;
        d = cat(d, e, ")");
    }
    d = cat(d, e, "\n");
    char name[64], suffix[24];
    int made = 0;
    pthread_mutex_lock(&g_lock);        /* create_locked's rule: see give_files_to */
    for (int k = 0; k < SCAN_NAME_TRIES; k++) {
        char *s = cat(suffix, suffix + sizeof suffix, ".scan.");
        cat_u(s, suffix + sizeof suffix, (unsigned long)scan_name_number(k));
        int fd = create_locked(file_name(name, sizeof name, suffix), NULL);
        if (fd >= 0) {
            if (write_all(fd, text, (size_t)(d - text))) { /* a file cut short: not a scan */ }
            close(fd);
            made = 1;
            break;
        }
        if (errno != EEXIST)
            break;
    }
    pthread_mutex_unlock(&g_lock);
    if (!made) {                        /* (a directory we may no longer write) */
        char *why = strstr(text, "#status unknown no scan at the exit: ");
        d[-1] = 0;
        note_scan_error("exit", why ? why + sizeof "#status unknown no scan at the exit: " - 1
                                    : "mmleak-scan not found beside mmleak.so");
    }
}

static char status_buf[8192];           /* /proc/self/status, as under_seccomp read it */

#define CAP_SYS_PTRACE_BIT 19

/* Are the real, effective and saved ids of the status line NAME ("\nUid:") not all one? */
static int mixed_ids(const char *status, const char *name)
{
    const char *p = mml_status_field(status, name);
    unsigned long id[3] = { 0, 0, 0 };
    for (int k = 0; p && k < 3; k++) {
        while (*p == ' ' || *p == '\t')
            p++;
        while (*p >= '0' && *p <= '9')
            id[k] = id[k] * 10 + (unsigned long)(*p++ - '0');
    }
    return id[0] != id[1] || id[0] != id[2];
}

/* Would mmleak-scan's PTRACE_SEIZE of our other threads be refused?  It runs with our
 * credentials, and the kernel refuses it when a tracer already holds us (a debugger,
 * strace: TracerPid); when Yama's ptrace_scope is 3 (no attach at all), or 2 (admin only)
 * and it lacks CAP_SYS_PTRACE; and, without CAP_SYS_PTRACE, when the process is not
 * dumpable (a setuid, setgid or capability change made it so: a daemon that dropped root,
 * memcached -u), or when its real, effective and saved uids (or gids) are not all one (a
 * saved uid 0, squid: the kernel compares the tracer's real id with all three).  (Asked
 * only at the exit of a process with more threads, after the status was read: a prctl and
 * the Yama file.)  Then the other threads are parked by a signal of ours instead (park.c).
 * A security module's refusal is not foreseen: mmleak-scan tries, and says so. */
static int ptrace_refused(const char *status)
{
    const char *tp = mml_status_field(status, "\nTracerPid:");
    if (tp && *tp >= '1' && *tp <= '9')
        return 1;
    int cap = (int)(mml_status_hex(status, "\nCapEff:") >> CAP_SYS_PTRACE_BIT & 1);
    if (!cap && (mixed_ids(status, "\nUid:") || mixed_ids(status, "\nGid:")))
        return 1;
    char y = '0';
    int fd = open("/proc/sys/kernel/yama/ptrace_scope", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &y, 1) != 1)
            y = '0';
        close(fd);
    }
    if (y == '3' || (y == '2' && !cap))
        return 1;
    return !cap && mml_sys(SYS_prctl, PR_GET_DUMPABLE, 0, 0, 0, 0) != 1;
}

#if defined(__x86_64__)
/* The scan WHY in a child that shares our memory, no program started (scanhere.c): this
 * thread alone, or with the other threads parked by a signal of ours (PARK: park.c).  Its
 * status, or -2 (no child could be started: mmleak-scan then). */
static COLD int scan_in_child(const char *why, uintptr_t floor, int park)
{
    unsigned long fs = 0, gs = 0;
    if (mml_sys(SYS_arch_prctl, ARCH_GET_FS, &fs) || mml_sys(SYS_arch_prctl, ARCH_GET_GS, &gs))
        return -2;
    volatile char here = 0;             /* below the floor: this frame is mmleak.so's */
    uint64_t lv[3] = { (uint64_t)(uintptr_t)&here, fs, gs };
    uint64_t all = ~(uint64_t)0, old = 0;
    mml_sys(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof all);
    /* a root daemon acting as another user for now (varnishd's manager: seteuid, root
     * kept as its saved uid) left our files root's: the child, which inherits the file
     * system uid, works on them as their owner, as we do (dumpdir.c) */
    struct fs_scope fsc;
    int tid = (int)mml_sys(SYS_gettid);
    /* the process's first thread: its uids are in the /proc/self/status that under_seccomp
     * just read (a /proc/thread-self/status fewer at an exit) */
    fs_begin_from(&fsc, tid == (int)mml_sys(SYS_getpid) ? status_buf : NULL);
    int rc = mml_scan_here(why, tid, floor, (int)atomic_load(&g_next_file), lv, park, scan_err,
                           sizeof scan_err);
    fs_end(&fsc);
    /* a signal that came meanwhile is delivered now */
    mml_sys(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof old);
    return rc;
}
#endif

/* Start mmleak-scan for this process and wait for its verdict.  WHY: "exit" or "api".
 * LONE: this thread was the process's only one (/proc/self/status) and has a FLOOR: it then
 * waits with every signal blocked, so that nothing of the program runs in it until the
 * scanner is done, and tells the scanner its stack pointer and thread pointers: a scanner
 * that finds it alone reads the memory without stopping it (no PTRACE_SEIZE, INTERRUPT,
 * wait for the stop and DETACH: four hand-overs between the two processes; mmleak-scan(7)).
 * Returns the scanner's exit status (0 done, 1 could not scan, 2 no result), -1 when it
 * could not be started.  A scan that wrote no result leaves its reason in our dump file
 * (note_scan_error). */
static COLD int start_scanner(const char *why, uintptr_t floor, int lone);

COLD int run_scanner(const char *why, uintptr_t floor, int lone)
{
    scan_err[0] = 0;
    int rc = start_scanner(why, floor, lone);
    if (rc == 3 && scan_err[0])
        note_scan_error(why, scan_err);
    return rc;
}

/* One scan at a time (futex: the tid of the thread whose scan runs, or 0), from the read
 * of our status (status_buf, which ptrace_refused reads again) to the verdict.  Without
 * it, two threads that asked at once, each with every signal blocked while it parked the
 * other, got no verdict ("did not stop within 5 s", or "blocks every real-time signal");
 * a thread that waits here keeps its signals open, so the running scan parks it (or
 * ptrace stops it) like any other, and it scans in turn.  1 taken, 0 this thread's
 * already (a handler of the program's that calls _exit while this thread asked for a
 * scan: no lock to wait for). */
static int g_scanning;

static COLD int scan_lock(void)
{
    int me = (int)mml_sys(SYS_gettid), cur = 0;
    while (!__atomic_compare_exchange_n(&g_scanning, &cur, me, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
        if (cur == me)
            return 0;
        mml_sys(SYS_futex, &g_scanning, FUTEX_WAIT_PRIVATE, cur, NULL);
        cur = 0;
    }
    return 1;
}

static COLD void scan_unlock(int taken)
{
    if (taken) {
        __atomic_store_n(&g_scanning, 0, __ATOMIC_RELEASE);
        mml_sys(SYS_futex, &g_scanning, FUTEX_WAKE_PRIVATE, INT_MAX);
    }
}

COLD void mml_scan_fork_child(void)
{
    g_scanning = 0;                     /* (the parent's scan is not the child's) */
    mml_park_fork_child();
}

static COLD int start_scanner(const char *why, uintptr_t floor, int lone)
{
    static char path[PATH_MAX], pidbuf[24], fdbuf[24], tidbuf[24], floorbuf[24], nfbuf[24];
    static char spbuf[24], fsbuf[24], gsbuf[24];
    int may_park = 0;
#if defined(__x86_64__)
    /* at the exit, this thread alone: the scan in a child that shares our memory, no
     * program started (tracer/scanhere.c) */
    if (cfg.scan_here && lone && floor && !strcmp(why, "exit")) {
        int rc = scan_in_child(why, floor, 0);
        if (rc != -2)
            return rc;
    }                                   /* (no child: mmleak-scan, then) */
    /* at the exit or asked by the program (mmleak_leak_check: the threads go on
     * afterwards, park.c), other threads that mmleak-scan may not stop (ptrace_refused), or
     * MMLEAK_SCAN_HERE=2: they are parked by a signal of ours.  ptrace stays the way where
     * it works: it stops a thread wherever it is and restarts any system call it
     * interrupted, a signal only where the thread takes it (not while it blocks it), and
     * some calls it interrupts return EINTR once the program goes on */
    may_park = cfg.scan_here && !lone && floor;
    if (may_park && (cfg.scan_here == 2 || ptrace_refused(status_buf))) {
        int rc = scan_in_child(why, floor, 1);
        if (rc != -2)
            return rc;
        may_park = 0;
    }
#endif
    if (scanner_path(path, sizeof path)) {
        if (!strcmp(why, "exit"))
            note_no_scanner(path);
        return -1;
    }
    /* the environment without LD_PRELOAD, in memory of our own */
    size_t n = 0;
    while (environ && environ[n])
        n++;
    size_t bytes = (n + 1) * sizeof(char *);
    char *small[128];                   /* most environments: no mapping made and unmapped */
    char **env = n < 128 ? small : mml_map(bytes);
    if (!env)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11))
            env[k++] = environ[i];
    env[k] = NULL;
    /* the go signal's channel: a socket pair, not a pipe, so that the byte is sent with
     * MSG_NOSIGNAL: a scanner that died before reading it (killed, out of memory) must not
     * make the program die of SIGPIPE at its exit (mmleak-scan reads either alike) */
    int p[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, p)) {
        if (env != small)
            mml_unmap(env, bytes);
        return -1;
    }
    fcntl(p[1], F_SETFD, FD_CLOEXEC);
    put_num(pidbuf, pidbuf + sizeof pidbuf, (unsigned long)getpid());
    put_num(fdbuf, fdbuf + sizeof fdbuf, (unsigned long)p[0]);
    put_num(tidbuf, tidbuf + sizeof tidbuf, floor ? (unsigned long)mml_sys(SYS_gettid) : 0);
    put_hex(floorbuf, floorbuf + sizeof floorbuf, floor);
    /* our dump files are numbered below g_next_file: the scanner may open them by name
     * rather than list the directory (tools/scan_cut.c, take_cut) */
    put_num(nfbuf, nfbuf + sizeof nfbuf, atomic_load(&g_next_file));
    char *argv[] = { path, pidbuf, cfg.dir, g_id, (char *)why, fdbuf, tidbuf, floorbuf, nfbuf,
                     NULL, NULL, NULL, NULL };
#if defined(__x86_64__)
    unsigned long fs = 0, gs = 0;
    if (lone && floor && !mml_sys(SYS_arch_prctl, ARCH_GET_FS, &fs) &&
        !mml_sys(SYS_arch_prctl, ARCH_GET_GS, &gs)) {
        volatile char here = 0;         /* below the floor: this frame is mmleak.so's */
        put_hex(spbuf, spbuf + sizeof spbuf, (uint64_t)(uintptr_t)&here);
        put_hex(fsbuf, fsbuf + sizeof fsbuf, fs);
        put_hex(gsbuf, gsbuf + sizeof gsbuf, gs);
        argv[9] = spbuf;
        argv[10] = fsbuf;
        argv[11] = gsbuf;
    }
#endif
    lone = argv[9] != NULL;
    /* should the kernel refuse its ptrace all the same (a security module, a tracer of
     * another thread than this one), mmleak-scan writes nothing and exits with 5: the
     * threads are parked then */
    if (may_park)
        argv[9] = "park";
    /* vfork: no fork handlers run (ours would start a trace for the child), nothing
     * allocated, nothing copied */
    uint64_t all = ~(uint64_t)0, old = 0;        /* the kernel's mask: 64 signals */
    mml_sys(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof all);
    pid_t child = spawn_blocked(path, argv, env);
    if (!lone || child < 0)
        mml_sys(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof old);
    close(p[0]);
    if (env != small)
        mml_unmap(env, bytes);
    if (child < 0) {
        close(p[1]);
        return -1;
    }
    /* (EINVAL: no Yama) */
    int named = !mml_sys(SYS_prctl, PR_SET_PTRACER, (unsigned long)child, 0, 0, 0);
    while (send(p[1], "g", 1, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
    int st = 0;
    pid_t r;
    while ((r = waitpid(child, &st, 0)) < 0 && errno == EINTR)
        ;
    /* a scanner that wrote no result sent why, on the same socket (tools/scan_main.c) */
    if (r == child && WIFEXITED(st) && WEXITSTATUS(st) == 3) {
        ssize_t got = recv(p[1], scan_err, sizeof scan_err - 1, MSG_DONTWAIT);
        scan_err[got > 0 ? got : 0] = 0;
    }
    close(p[1]);
    if (lone)                           /* a signal that came meanwhile is delivered now */
        mml_sys(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof old);
    if (named)
        mml_sys(SYS_prctl, PR_SET_PTRACER, 0, 0, 0, 0);
    if (r != child || !WIFEXITED(st))
        return -1;
#if defined(__x86_64__)
    if (may_park && WEXITSTATUS(st) == 5)
        return scan_in_child(why, floor, 1);
#endif
    return WEXITSTATUS(st);
}

/* Under a seccomp filter (Seccomp: 2 in /proc/self/status) starting a process may be
 * forbidden, and the process killed for trying: no scan then (mmleak.py scan PID, from
 * outside, still works). */
static int under_seccomp(void)
{
    return mml_status_seccomp("/proc/self/status", status_buf, sizeof status_buf);
}

/* The process has one thread ("Threads:" of the status under_seccomp just read): 1, else 0 */
static int one_thread(void)
{
    const char *p = mml_status_field(status_buf, "\nThreads:");
    return p && p[0] == '1' && p[1] == '\n';
}

/* __gnu_cxx::__freeres, libstdc++'s: it frees the emergency exception pool (71 KiB), which
 * valgrind frees at every exit, _exit included (proftpd's master and its session children end
 * by _exit: the pool was still reachable for mmleak alone).  At _exit it is looked up before
 * (freeres_lookup): a signal handler's _exit may not call dlsym (a symbol not found allocates
 * its error text, and the loader's lock may be held by the code it interrupted). */
#define FREERES "_ZN9__gnu_cxx9__freeresEv"
static void (*g_freeres)(void);

static int is_libstdcxx(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    return slash && strncmp(slash + 1, "libstdc++.so", 12) == 0;
}

/* From the preloaded mmleak.so's constructor (the program's libstdc++, a needed object, is
 * loaded and relocated by then): only when a libstdc++ is loaded, so that a C program's
 * dlerror() is not left our failed lookup's text.  A libstdc++ loaded later (dlopen), or an
 * attached trace's, is looked up at exit() only. */
COLD void freeres_lookup(void)
{
    if (!mml_each_object(is_libstdcxx, NULL))
        return;
    T.guard = T.guard + 1 + GUARD_FREES;    /* as in scan_at_exit, below */
    g_freeres = (void (*)(void))dlsym(RTLD_DEFAULT, FREERES);
    T.guard = T.guard - 1 - GUARD_FREES;
}

static void keep_block(void *p) { (void)p; }

/* At _exit the calling thread may be inside the allocator (a signal handler's _exit), holding
 * the arena's lock a free would wait on for ever: the frees of __freeres are recorded (our
 * free's note) but not made, the memory goes with the process a moment later.  real.free is
 * every thread's: another thread's free within these few instructions is kept too, which is
 * harmless as the process ends. */
static void freeres_keeping_memory(void)
{
    void (*made)(void *) = __atomic_load_n(&real.free, __ATOMIC_RELAXED);
    __atomic_store_n(&real.free, keep_block, __ATOMIC_RELAXED);
    g_freeres();
    __atomic_store_n(&real.free, made, __ATOMIC_RELAXED);
}

COLD void scan_at_exit(uintptr_t floor, int by__exit)
{
    if (!cfg.scan)
        return;
    int saved = errno, taken = scan_lock();
    if (under_seccomp()) {
        scan_unlock(taken);
        errno = saved;
        return;
    }
    /* BY__EXIT: from _exit, which is async-signal-safe: a handler may call it while this very
     * thread is inside glibc's malloc or free (its arena locked: our free passes the call on
     * unguarded).  So nothing here may allocate or free then: no dlsym (a symbol not found
     * allocates its error text), and __freeres, looked up before, frees nothing for real
     * (freeres_keeping_memory).  What follows allocates nothing: the scanner is started by
     * vfork, the lone thread's scan has an allocator of its own (scanhere.c). */
    if (by__exit) {
        if (g_freeres)
            freeres_keeping_memory();
        goto scan;
    }
    /* libstdc++'s one-time memory (__gnu_cxx::__freeres, when it has one: CXXABI_1.3.10).
     * dlsym under our guard: a symbol not found makes it allocate its error text, which is
     * glibc's, not the program's, and must not be recorded; the frees of __freeres must.
     * And so must dlsym's own: every dl call first frees the text of the program's last
     * failed one, kept for dlerror() (haproxy's dlsym of "mallctl"), which would otherwise
     * stay in the trace, a block the scan then calls definitely lost (GUARD_FREES). */
    T.guard = T.guard + 1 + GUARD_FREES;
    void (*freeres)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, FREERES);
    T.guard = T.guard - 1 - GUARD_FREES;
    if (freeres)
        freeres();
scan:;
    int lone = one_thread();
    T.guard++;
    run_scanner("exit", floor, lone);
    T.guard--;
    scan_unlock(taken);
    errno = saved;
}

/* mmleak.h's mmleak_leak_check: a scan now, asked by the program.  1 leaks (definitely or
 * indirectly lost blocks), 0 none, -1 not tracing or no verdict.  The entry, in assembly
 * (FLOOR_ENTRY), gives this its floor. */
__attribute__((used, noinline)) int mml_leak_check_from(uintptr_t floor)
{
    if (g_state != 1 || g_pid != getpid() || IN_OWN_CODE(&T))
        return -1;
    int saved = errno, taken = scan_lock(), rc = -1;
    if (!under_seccomp()) {
        int lone = one_thread();
        T.guard++;
        rc = run_scanner("api", floor, lone);
        T.guard--;
    }
    scan_unlock(taken);
    errno = saved;
    return rc == 0 ? 0 : rc == 1 ? 1 : -1;
}

FLOOR_ENTRY(mmleak_do_leak_check, mml_leak_check_from, EXPORT)
