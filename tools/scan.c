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
 * even that could be written (ERR says why); (mmleak_scan_floor, with mmleak_scan_may_park)
 * 2 when the kernel refused to let us trace a thread, nothing written.  TOTALS (NULL, or 8
 * numbers): blocks and bytes of each kind, definite, indirect, possible, reachable.
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
 * that loads mmleak-tools.so is not traced).
 *
 * This file is the course of a scan (mmleak_scan_floor: the steps in order, their times for
 * MMLEAK_SCAN_DEBUG, the end); each step is a concern of its own file, and they share
 * struct scan (tools/scan_int.h):
 *   tools/scan_stop.c     the threads seized and let go; the snapshot (a copy of the process)
 *   tools/scan_cut.c      the trace's lock, the cut of its files, their live set
 *   tools/scan_live.c     the live set: the shrink algorithm, final, over the cut's events
 *   tools/scan_mem.c      the target's memory map, and its memory read
 *   tools/scan_rootset.c  the roots (what is one, what is left out), each marked from
 *   tools/scan_roots.c    what is left out, recognised in the process (through a callback)
 *   tools/scan_mark.c     the marking: a word found, the mark stack drained, the cliques
 *   tools/scan_read.c     the marking's reader thread (the heap read ahead)
 *   tools/scan_result.c   the result file */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tracer/compiler.h"
#include "facts.h"

#include "scan_int.h"
#include "scan_read.h"

__attribute__((format(printf, 2, 3))) int say(struct scan *s, const char *fmt, ...)
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

int64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int scan_debug = -1;                    /* MMLEAK_SCAN_DEBUG (scan_int.h), read once */
static int g_debug_fd = -1;             /* the scan's debug file (one scan at a time) */

void scan_dbg(const char *fmt, ...)
{
    if (g_debug_fd < 0)
        return;
    char b[512];                        /* (no stdio: no buffer from the program's heap) */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    size_t len = (size_t)n < sizeof b ? (size_t)n : sizeof b - 1;
    for (size_t off = 0; off < len;) {
        ssize_t k = write(g_debug_fd, b + off, len - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        off += (size_t)k;
    }
}

/* MMLEAK_SCAN_DEBUG: the debug file of this scan, mmleak.ID.scan-debug.K (K the first free
 * number from 1, scan_name_number) in the trace's directory, made as the tracer makes its files there (others
 * may write in it: O_EXCL and O_NOFOLLOW, a name taken by anything is skipped; O_NONBLOCK;
 * a regular file of ours, checked); none when it cannot be made.  Never stderr: at exit the
 * scanner's is the program's, perhaps a pipe it speaks a protocol on (gdb read iconv's
 * output there, the debug lines with it: mmleak-scan(7)). */
static void debug_open(const struct scan *s)
{
    char name[400];
    for (int k = 0; k < SCAN_NAME_TRIES && g_debug_fd < 0; k++) {
        snprintf(name, sizeof name, "%s/mmleak.%s.scan-debug.%" PRIu64, s->dir, s->id,
                 scan_name_number(k));
        int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                      0600);
        if (fd < 0) {
            if (errno == EEXIST)
                continue;
            return;
        }
        struct stat st;
        if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
            close(fd);
            return;
        }
        g_debug_fd = fd;
    }
}

/* MMLEAK_SCAN_DEBUG=1: the time of the step just done (since the last call) */
static void step_time(const char *step, int64_t *t)
{
    int64_t now = mono_ns();
    if (unlikely(scan_debug > 0))
        scan_dbg("mmleak-scan: time %s %.3f ms\n", step, (now - *t) / 1e6);
    *t = now;
}

static pthread_mutex_t g_scan_lock = PTHREAD_MUTEX_INITIALIZER;

/* 1: a thread that ptrace may not stop ends the scan with 2, nothing written, for mmleak.so
 * to park the threads itself (tools/scan_main.c, "park"; tracer/park.c) */
int mmleak_scan_may_park;

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

/* The id through which the process's memory is read (process_vm_readv, /proc/ID/maps and
 * pagemap): its pid, unless its main thread ended (pthread_exit) while others run: a
 * zombie, which has no memory of its own any more (seize_all leaves it out); then a live
 * thread's, which shares the process's. */
static int reader_tid(const struct scan *s)
{
    int live = 0;
    for (int t = 0; t < s->nth; t++) {
        if (s->th[t].tid == s->pid)
            return s->pid;
        if (s->th[t].tid > 0 && !live)
            live = s->th[t].tid;
    }
    return live ? live : s->pid;
}

/* mmleak_scan, with FLOOR_TID's stack scanned from FLOOR up (0 0: none), and NFILES (0:
 * unknown) above the numbers of the trace's dump files (take_cut).  LONE (NULL, or with a
 * floor: stack pointer, fs_base, gs_base): FLOOR_TID was the process's only thread when it
 * started us, our parent, and waits with every signal blocked (tools/scan_stop.c,
 * hold_here); or, with PARK, the others are parked by mmleak.so's signal (tracer/park.c),
 * their registers in PARK's slots.  The thread that
 * asked for the scan (at exit, or mmleak_leak_check) waits for it in mmleak.so, whose frames
 * hold stale copies of addresses (its stack walks'): FLOOR is where the program's part of
 * that stack begins, below the program's callee-saved registers, which mmleak.so's entry
 * pushed there.  That thread's registers are then not roots (mmleak.so's, at a system call;
 * the program's caller-saved registers are dead across its call, by the ABI).  A FLOOR not
 * in the mapping of the thread's stack pointer, or below that pointer, is ignored. */
int mmleak_scan_floor(int pid, const char *dir, const char *id, const char *why,
                      char *out, size_t outlen, char *err, size_t errlen,
                      uint64_t *totals, int floor_tid, uint64_t floor, int nfiles,
                      const uint64_t *lone, const struct mml_park *park)
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
    s.nfiles = nfiles;
    s.lone = floor_tid > 0 && floor ? lone : NULL;
    s.park = s.lone ? park : NULL;
    if (scan_debug < 0) {
        const char *d = getenv("MMLEAK_SCAN_DEBUG");
        scan_debug = d && *d >= '1' && *d <= '9' && !d[1] ? *d - '0' : 0;
    }
    if (unlikely(scan_debug > 0)) {
        debug_open(&s);
        if (g_debug_fd >= 0)
            scan_file_owner(&s, g_debug_fd);
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
    if (!s.failed && !hold_here(&s))
        seize_all(&s);
    step_time(s.held == HELD_ALONE ? "alone, not stopped" : s.held == HELD_SIGNAL ?
              "parked by a signal" : "stop", &tstep);
    if (s.refused && mmleak_scan_may_park) {
        if (g_debug_fd >= 0) {
            close(g_debug_fd);
            g_debug_fd = -1;
        }
        release(&s);                    /* (the threads seized before are let go) */
        pthread_mutex_unlock(&g_scan_lock);
        return 2;
    }
    if (!s.failed) {
        gettimeofday(&tv, NULL);
        s.when = (double)tv.tv_sec + tv.tv_usec / 1e6;
        take_cut(&s);
        /* no lock file before the cut, one now: a first compaction pass began meanwhile
         * and may have changed what the cut listed: again, under its lock */
        if (!s.failed && s.nolock && s.lockfd < 0 && lock_exists(&s)) {
            free_cut(&s);
            s.nolock = 0;
            if (!take_lock(&s))
                take_cut(&s);
        }
    }
    drop_lock(&s);
    step_time("cut", &tstep);
    s.rpid = reader_tid(&s);
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
        if (unlikely(scan_debug > 0))
            scan_dbg("mmleak-scan: marking read ahead by a thread\n");
    }
    if (unlikely(scan_debug > 0))
        scan_dbg("mmleak-scan: reads %" PRIu64 " (process_vm_readv calls of marking)\n",
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
    if (s.held != HELD_PTRACE && getppid() != pid)
        s.vanished = 1;                 /* our parent, the process, is gone */
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
        /* why, and as whom: a daemon that became another user (mosquitto, chronyd) can no
         * longer create files in a directory that was only root's (mmleak-tracer(7)) */
        int e = errno;
        char was[256] = "";
        if (s.failed)                   /* the scan's own reason, kept after the write's */
            snprintf(was, sizeof was, "%s", err);
        snprintf(err, errlen, "cannot write the result in %s (as uid %u): %s%s%s%s", dir,
                 (unsigned)geteuid(), strerror(e), *was ? " (and the scan failed: " : "",
                 was, *was ? ")" : "");
        rc = -1;
    }
    step_time("result", &tstep);
    if (g_debug_fd >= 0) {
        close(g_debug_fd);
        g_debug_fd = -1;
    }
    release(&s);
    pthread_mutex_unlock(&g_scan_lock);
    return rc;
}

EXPORT int mmleak_scan(int pid, const char *dir, const char *id, const char *why, char *out,
                       size_t outlen, char *err, size_t errlen, uint64_t *totals)
{
    return mmleak_scan_floor(pid, dir, id, why, out, outlen, err, errlen, totals, 0, 0, 0,
                             NULL, NULL);
}

EXPORT int mmleak_scan_abi(void) { return 1; }

/* The scanner's limits, taken before a scan at exit (mmleak-scan, and mmleak.so's scan in
 * a child: tracer/scanhere.c): a process that limited its address space (RLIMIT_AS) gave
 * us its limit: take what the hard limit allows, the scan needs memory of its own; the files
 * of the cut are held open until read: as many as the hard limit allows. */
void mmleak_scan_limits(void)
{
    struct rlimit rl;
    if (!getrlimit(RLIMIT_AS, &rl) && rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_AS, &rl);
    }
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* MMLEAK_SCAN_SECS, the time limit of a scan at exit (its default and range are
 * mmleaklib/facts.py's: facts.h) */
unsigned mmleak_scan_secs(void)
{
#define SECS_ROW(NAME, ENV, TYPE, DEF, MIN, MAX, HELP) \
    if (!strcmp(ENV, "MMLEAK_SCAN_SECS")) { dflt = DEF; lo = MIN; hi = MAX; }
    long dflt = 0, lo = 0, hi = 0;
    MMLEAK_SCAN_OPTIONS(SECS_ROW)
    const char *t = getenv("MMLEAK_SCAN_SECS");
    long v = t && *t ? strtol(t, NULL, 10) : dflt;
    return (unsigned)(v >= lo && v <= hi ? v : dflt);
}
