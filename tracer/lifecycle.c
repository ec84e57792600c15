/*
 * tracer/lifecycle.c: the process-wide state and the events of a process's life: the first
 * allocation (global_init), the start of a trace, fork (through our atfork handler, or a raw
 * clone() found by the wiped page), the end of a thread (its pthread key destructor), _exit,
 * exec, and the end of the process (the destructor).
 *
 * Loaded with LD_PRELOAD, the constructor starts tracing (or stays out of the way when another
 * allocator, or another copy of mmleak.so, comes first); loaded with dlopen (mmleak.py attach),
 * it stays dormant until mmleak_attach (attach.c).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "record.h"
#include "unwind.h"

/* The process-wide state (internal.h says what each is). */
char g_id[32];
pid_t g_pid;
time_t g_t0;
unsigned long long g_pstart;
atomic_uint g_next_file;
int g_state;
unsigned g_trace_gen;
int g_attached;
int g_forked;
int g_window;
/* What `mmleak.py status` reads from the process's memory (/proc/PID/mem), without
 * stopping it: "tracing ID DIR", "paused", "dormant" (see set_status). */
EXPORT char mmleak_status[PATH_MAX + 64];
char g_cmd[2048];
char g_alloc[512];
_Atomic uint64_t g_lost_orphan;
atomic_uint g_episode;
atomic_uint g_epoch;
int g_closing;
int g_ending;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_key_t g_key;
int g_key_ok;
atomic_int g_inflight;

__thread struct tstate T __attribute__((tls_model("initial-exec")));
_Atomic uint64_t g_seq[1u << SEQ_BITS] __attribute__((aligned(64)));
struct hot hot_off;
struct hot *H = &hot_off;

/* ---- process start ---- */

void read_cmdline(void)
{
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    unsigned char raw[sizeof g_cmd / 4];
    ssize_t n = fd >= 0 ? read(fd, raw, sizeof raw) : -1;
    if (fd >= 0)
        close(fd);
    escape_into(g_cmd, g_cmd + sizeof g_cmd, raw, n > 0 ? (size_t)n : 0, 1);
}

/* Reserve a trace id with O_EXCL creates of mmleak.ID.maps and mmleak.ID.loads (the log of
 * loads is made now, empty, so that nobody else's file can stand at its name when it is
 * needed): the pid, else pid-1, pid-2..  (an exec'd image, a reused pid).  Past TAKEN_RUN
 * taken ids (planted?), pid-T, T the time in microseconds: later images of the process still
 * get higher numbers, and nobody can plant a name for every microsecond to come. */
static int reserve_id(int *maps_fd)
{
    char name[64];
    int err = 0;
    uint64_t k = 0;
    /* In a directory nobody else can write to, no file of anybody else's can stand at a
     * name of ours: the log of loads and the lock wait for their first need (the first
     * dlclose, the first compactor, a daemon's handover of its files before it drops root);
     * a name already taken (by an older trace's file) still takes the id.  Each file made
     * is an inode allocated, on some file systems (ext4 without a journal skips every inode
     * freed in the last minute) the dearest system call of a start. */
    int later = dir_private();
    for (int tries = 0; tries < TAKEN_RUN + 256; tries++) {
        if (tries < TAKEN_RUN) {
            k = (uint64_t)tries;
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t now = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
            /* a few hundred microseconds' worth of names to plant per try, or none at all */
            k = (now > k ? now : k + 1) + unguessable() % 256;
            say_taken("names of trace files in ", "this trace's id is the pid and the time in "
                      "microseconds");
        }
        char *e = g_id + sizeof g_id, *d = g_id;
        d = cat_u(d, e, (unsigned long)g_pid);
        if (k) {
            d = cat(d, e, "-");
            cat_u(d, e, (unsigned long)k);
        }
        int mfd = create_locked(file_name(name, sizeof name, ".maps"), &g_maps_id), fd = mfd;
        if (mfd >= 0 && later) {
            if (d_taken(file_name(name, sizeof name, ".loads")) ||
                d_taken(file_name(name, sizeof name, ".lock"))) {
                close(mfd);
                d_unlink(file_name(name, sizeof name, ".maps"));
                err = EEXIST;
                continue;
            }
            g_loads_id = g_lock_id = (struct fid){ 0, 0 };
            g_loads_used = 0;
            g_loads_later = g_lock_later = 1;
            *maps_fd = mfd;
            return 0;
        }
        if (mfd >= 0) {
            fd = create_locked(file_name(name, sizeof name, ".loads"), &g_loads_id);
            if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
                /* one descriptor left (a forked child of a daemon that took the others):
                 * one at a time, as ever, and the first snapshot renamed over the .maps */
                close(mfd);
                mfd = -1;
                fd = create_locked(file_name(name, sizeof name, ".loads"), &g_loads_id);
            }
            if (fd < 0) {
                err = errno;
                if (mfd >= 0)
                    close(mfd);
                d_unlink(file_name(name, sizeof name, ".maps"));
                errno = err;
            }
        }
        if (fd >= 0) {
            close(fd);
            /* the trace's lock (mmleak-compaction(7)) is made now too, empty: a lock
             * file of another user's at its name made every compactor, reader and scan at
             * the exit refuse the trace (planted for the next pids in /tmp, nothing of
             * root's traces there was ever folded, scanned or reported).  Taken: the id is
             * taken.  Not made for another reason (no descriptor left): the first
             * compactor makes it, as before. */
            int lfd = create_locked(file_name(name, sizeof name, ".lock"), &g_lock_id);
            if (lfd < 0 && errno == EEXIST) {
                if (mfd >= 0)
                    close(mfd);
                d_unlink(file_name(name, sizeof name, ".maps"));
                d_unlink(file_name(name, sizeof name, ".loads"));
                err = EEXIST;
                continue;
            }
            if (lfd >= 0)
                close(lfd);
            else
                g_lock_id = (struct fid){ 0, 0 };
            g_loads_used = 0;
            g_loads_later = g_lock_later = 0;
            *maps_fd = mfd;     /* the first snapshot is written through it */
            return 0;
        }
        err = errno;
        if (err != EEXIST)
            break;
    }
    /* at the start, a missing name is a directory that was never there */
    say_why("cannot create files in ", err == ENOENT ? "no such directory" : NULL, err,
            ": tracing disabled (set MMLEAK_DIR to a writable directory)");
    return -1;
}

void fork_prepare(void) { pthread_mutex_lock(&g_lock); }
void fork_parent(void) { pthread_mutex_unlock(&g_lock); }

/* The fast path's page (see struct hot): mapped once, re-armed in every new trace. */
void arm_hot(void)
{
    if (H == &hot_off) {
        void *p = mml_map(4096);
        if (p && madvise(p, 4096, MADV_WIPEONFORK) == 0)
            H = p;
        else if (p)
            mml_unmap(p, 4096);    /* kernel before 4.14: raw clone() children are not detected */
    }
    H->fast = cfg.depth <= 1 ? 1 : 2;
    H->epoch = atomic_load(&g_epoch);
    /* once something was unloaded even depth 1 asks the cache: the verdict says "no unloaded
     * range".  Not merely because the epoch moved: an attach or a detach moves it too (so
     * that every thread drops its stale state), and an attached process at depth 1 would
     * then send every caller outside the program (libstdc++, libc) to the slow path */
    H->mask = cfg.depth == 0 || mml_sites_unloaded() ? ~(uintptr_t)0 : 0;
    H->memo = cfg.depth > 1;
    atomic_signal_fence(memory_order_seq_cst);
    H->alive = 1;
}

void set_status(void)
{
    char *e = mmleak_status + sizeof mmleak_status, *d = mmleak_status;
    if (g_state == 1) {
        d = cat(d, e, "tracing ");
        d = cat(d, e, g_id);
        d = cat(d, e, " ");
        cat(d, e, cfg.dir);
    } else {
        cat(d, e, g_state == 2 ? "paused" : "dormant");
    }
}


/* When this process started, in clock ticks after boot: field 22 of /proc/self/stat, which
 * the kernel keeps and no process can set (0 when it cannot be read).  In every file's
 * header as pstart=: a reader asks whether the process at the trace's pid is still the one
 * that wrote it, which another process given the pid later cannot fake (a file it maps at a
 * staging file's name, its start within the wall clock's slack: mmleak-format(5)). */
static COLD unsigned long long self_start_ticks(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');        /* the command may hold blanks and parentheses */
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    unsigned long long v = 0;
    for (p = p ? p + 1 : NULL; p && *p >= '0' && *p <= '9'; p++)
        v = v * 10 + (unsigned long long)(*p - '0');
    return v;
}

/* Called under g_lock, with the guard held.  LOADED: dl_iterate_phdr's counters, taken by
 * the caller before g_lock (the loader's lock is never taken under ours), or NULL: with them
 * the first flush finds the maps file current instead of reading /proc/self/maps again. */
void process_start(const unsigned long long *loaded)
{
    g_pid = getpid();
    /* a forked child of a process acting as another user for now (proftpd's master: seteuid
     * nobody, root kept as its real and saved uid) keeps its parent's owner, who may create
     * files in the directory, and whom it may become for that (dumpdir.c, AS_OWNER) */
    uid_t r, e, s;
    if (!(g_forked && !getresuid(&r, &e, &s) &&
          (r == g_owner || e == g_owner || s == g_owner || e == 0)))
        g_owner = geteuid();
    g_t0 = time(NULL);
    g_pstart = self_start_ticks();
    prealloc_decide();
    int maps_fd = -1;
    if (reserve_id(&maps_fd)) {
        g_state = -1;
        return;
    }
    g_state = 1;
    atomic_store(&g_next_file, 0);
    unsigned long long c[2] = { loaded ? loaded[0] : 0, loaded ? loaded[1] : 0 };
    maps_start_locked(c, maps_fd);
    arm_hot();
    set_status();
}

/* Is our malloc the one the program calls?  Not when another allocator (jemalloc, tcmalloc, the
 * program's own) is found before us: LD_PRELOAD="libjemalloc.so.2 mmleak.so".  Asked by calling
 * the process's malloc: a non-PIE program's canonical PLT entry gives no other answer. */
struct tstate *volatile g_probe_t;
volatile int g_probe_hit;

static int malloc_is_ours(void)
{
    void *(*m)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "malloc");
    void (*f)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "free");
    if (!m || !f || m == own_malloc)
        return 1;
    g_probe_hit = 0;
    g_probe_t = &T;
    void *p = m(24);
    g_probe_t = NULL;
    if (p)
        f(p);
    return g_probe_hit;
}

/* Two mmleak.so files preloaded (an installed one and a build, say): the first in the global
 * scope is the process's; a second one would record every event again, with the first
 * copy's code as the caller of all of them. */
static int another_copy_first(Dl_info *other, Dl_info *self)
{
    void *f = dlsym(RTLD_DEFAULT, "mmleak_state");
    return f && dladdr(f, other) && dladdr((void *)own_malloc, self) &&
           other->dli_fbase != self->dli_fbase && other->dli_fname && self->dli_fname;
}

static int g_once_done;

/* What the tracer needs once in a process, before its first trace (preloaded: at the first
 * allocation; loaded into a running process: at the first attach): the allocator's name for
 * the headers (ALLOC, the loader's name of the object that holds it, looked up by the
 * caller before g_lock, or NULL or "": dladdr's, which names the program too), the key
 * whose destructor sees threads end, the fork handlers, the real functions of the hooks.
 * Under g_lock. */
void tracer_setup(const char *alloc)
{
    Dl_info di;
    if (!(alloc && alloc[0]) && dladdr((void *)real.malloc, &di))
        alloc = di.dli_fname;
    if (alloc)
        escape_into(g_alloc, g_alloc + sizeof g_alloc, (const unsigned char *)alloc,
                    my_strlen(alloc), 0);
    if (!pthread_key_create(&g_key, thread_exit))
        g_key_ok = 1;
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    hooks_init();
}

COLD void global_init(void)
{
    if (!real.malloc)
        resolve();
    unsigned long long loaded[2] = { 0, 0 };
    mml_each_object(phdr_counts, loaded);
    /* (the loader's lock is not taken under ours) */
    const char *alloc = mml_object_name((const void *)real.malloc);
    pthread_mutex_lock(&g_lock);
    if (!g_once_done) {
        g_once_done = 1;
        note_stderr();
        int bad = read_config(NULL);
        read_cmdline();
        read_default_suppressions();
        Dl_info other, self;
        if (another_copy_first(&other, &self)) {
            /* the first copy traces; its calls to the allocator pass through us untouched */
            say4(self.dli_fname, " is loaded after another mmleak.so (", other.dli_fname,
                 "): it stays out of the way");
            g_state = -1;
        } else if (!malloc_is_ours()) {
            Dl_info di;
            void *m = dlsym(RTLD_DEFAULT, "malloc");
            const char *who = m && dladdr(m, &di) && di.dli_fname && *di.dli_fname
                              ? di.dli_fname : "the program";
            say("malloc is replaced by ", who, ", found before mmleak.so: nothing is traced "
                "(put mmleak.so first in LD_PRELOAD)");
            resolve_from(RTLD_DEFAULT);     /* strdup & co. must use that allocator too */
            g_state = -1;
        } else if (bad) {
            g_state = -1;
        } else {
            tracer_setup(alloc);
            if (cfg.paused) {
                g_state = 2;    /* preloaded, paused: until mmleak.py attach */
                set_status();
                pthread_mutex_unlock(&g_lock);
                mml_got_switch(0);
                return;
            }
            process_start(loaded);
        }
    }
    pthread_mutex_unlock(&g_lock);
}

/* pthread key destructor: the thread is exiting.  Other libraries' destructors run in the
 * same rounds and may still free memory, so we re-arm our key and only give the file up in
 * the last round, parked for the next thread.  Events after that go to the late file. */
void thread_exit(void *arg)
{
    struct tstate *t = arg;
    if (t != &T)
        return;
    if (++t->exit_rounds < PTHREAD_DESTRUCTOR_ITERATIONS && g_key_ok) {
        pthread_setspecific(g_key, t);
        return;
    }
    INFLIGHT;
    recent_free(t);
    if (g_state != 1 || t->trace_gen != g_trace_gen) {
        thread_reset(t);
        t->dead = 1;
        return;
    }
    GUARDED;
    if (t->open) {
        maps_snapshot(0);
        park(t);
    }
    if (t->lost) {
        atomic_fetch_add(&g_lost_orphan, t->lost);
        t->lost = 0;
    }
    t->dropping = 0;
    t->dead = 1;
    t->cur = t->end = NULL;
}

/* In the child of fork (glibc's, through our atfork handler, or a raw clone()/fork syscall,
 * found by the wiped page): the staging areas we inherited are the parent's files.  Unmap them
 * (the parent keeps writing them) and start a trace of our own under the child's pid. */
void fork_child(void)
{
    if (H->alive && g_pid == getpid())
        return;     /* done already: the raw-fork check ran before the atfork handler */
    g_forked = 1;           /* until an exec: a new image, a new mmleak.so */
    pthread_mutex_init(&g_lock, NULL);
    g_closing = 0;      /* the threads inside dlclose() are not in the child */
    g_ending = 0;       /* (nor the one that was ending the process) */
    mml_sites_after_fork();
    mml_unwind_fork_child();
    mml_scan_fork_child();
    int saved = errno, others = 0;
    T.guard++;
    for (size_t i = 0; i < R.n; i++)
        if (R.a[i].state != SLOT_FREE && (int)i + 1 != T.slot && R.a[i].stage) {
            mml_unmap(R.a[i].stage, 2 * R.a[i].half_size); /* those threads are not in the child */
            others = 1;
        }
    loader_after_fork(others);  /* before any check of the loaded objects */
    R.n = 0;
    T.slot = 0;
    sset_clear(&T);
    stage_drop(&T);
    hold_free(&T);          /* the parent's lines, in a copy */
    atomic_store(&g_hold_total, 0);
    T.holding = 0;
    T.open = 0;
    T.anon = 0;             /* (staging in memory: that memory is the parent's copy, gone) */
    T.late = 0;
    T.dropping = 0;
    T.lost = 0;
    g_late_file = ~0u;
    g_sink = 0;
    atomic_store(&g_lost_orphan, 0);
    atomic_store(&g_nofile, 0);
    atomic_store(&g_nofile_err, 0);
    atomic_store(&g_said_write, 0);
    if (g_state == 1)
        process_start(NULL);
    else
        g_pid = getpid();   /* paused (or dormant): so stays the child, writing nothing */
    T.guard--;
    errno = saved;
}


/* Is this library one of the preloaded ones (LD_PRELOAD, /etc/ld.so.preload)?  Compared by
 * device and inode, or by file name for entries without a slash. */
static int named_in(const char *list, const struct stat *self, const char *self_base)
{
    char item[PATH_MAX];
    while (list && *list) {
        while (*list == ' ' || *list == ':' || *list == '\t' || *list == '\n')
            list++;
        size_t n = 0;
        while (list[n] && list[n] != ' ' && list[n] != ':' && list[n] != '\t' && list[n] != '\n')
            n++;
        if (n && n < sizeof item) {
            memcpy(item, list, n);
            item[n] = 0;
            struct stat st;
            if (strchr(item, '/') ? (stat(item, &st) == 0 && st.st_dev == self->st_dev &&
                                     st.st_ino == self->st_ino)
                                  : strcmp(item, self_base) == 0)
                return 1;
        }
        list += n;
    }
    return 0;
}

static int preloaded(void)
{
    /* dlsym finds our malloc first when we were preloaded into a position-independent
     * program; a non-PIE program has a canonical PLT entry for malloc, so ask the lists. */
    if (dlsym(RTLD_DEFAULT, "malloc") == (void *)own_malloc)
        return 1;
    Dl_info di;
    struct stat self;
    if (!dladdr((void *)own_malloc, &di) || !di.dli_fname || stat(di.dli_fname, &self))
        return 1; /* cannot tell: trace rather than miss a program */
    const char *base = strrchr(di.dli_fname, '/');
    base = base ? base + 1 : di.dli_fname;
    if (named_in(getenv("LD_PRELOAD"), &self, base))
        return 1;
    char buf[4096];
    int fd = open("/etc/ld.so.preload", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = 0;
        if (named_in(buf, &self, base))
            return 1;
    }
    return 0;
}

__attribute__((constructor)) static void mmleak_init(void)
{
    int saved = errno;
    T.guard++;
    /* Loaded with dlopen (mmleak.py attach, before it calls mmleak_attach): our allocation
     * functions are not the process's, there is nothing to trace yet. */
    if (!preloaded()) {
        g_state = -1;
        g_once_done = 1;
        set_status();           /* "dormant": until mmleak_attach */
        T.guard--;
        errno = saved;
        return;
    }
    global_init();
    if (g_state == 1 || g_state == 2)
        freeres_lookup();   /* for a scan at _exit (exitscan.c) */
    T.guard--;
    errno = saved;
}

/* Process exit, _exit, exec: close the parked files and the calling thread's.  Events lost
 * where no file could say so are counted in the calling thread's file, or in the late file.
 * FINAL: the process ends (not an exec, which may fail); 2: from our destructor, after which
 * the other objects' destructors may still free (GnuTLS's, in ngircd). */
static void leave_files(int final)
{
    g_ending = !!final;
    maps_snapshot(0);
    sink_catch_up();        /* the lines of threads without a file that go on running */
    close_parked();
    T.lost += atomic_exchange(&g_lost_orphan, 0);
    char line[128];
    size_t n = nofile_line(line, sizeof line);
    if (T.open && !T.anon && final == 2 && !dir_writable()) {
        /* the user the process became may not create files here: what comes after us would
         * need a new file (the late file) and be lost, unsaid, its blocks then reported not
         * freed.  The thread's file stays open for it instead, without its "#end", its last
         * lines in its staging file, as after a SIGKILL (the readers take them there); and
         * what was lost where no file could say it is said there. */
        n += T.lost ? lost_line(line + n, sizeof line - n, T.lost, 0) : 0;
        T.lost = 0;
        note_line(&T, line, n);
        return;
    }
    note_line(&T, line, n);
    if (T.open) {
        file_close(&T, 1);  /* its trailer says how many were lost */
        T.late = 1;
    }
    if (final)
        loads_drop_unused();
    T.lost += atomic_exchange(&g_lost_orphan, 0);
    n = nofile_line(line, sizeof line);     /* (this thread's own, staging in memory) */
    n += T.lost ? lost_line(line + n, sizeof line - n, T.lost, 0) : 0;
    T.lost = 0;
    if (n)
        late_shared(line, n);
}

/* Whether an exit here (the destructor, _exit, _Exit) is the traced process's own, which may
 * scan and close the files: tracing, not in a vfork() child (other pid, the parent's memory:
 * the files are the parent's), and not from inside mmleak.so's own code (a hook's call that
 * ended the process: its state is half-made). */
int exit_is_ours(void)
{
    return g_state == 1 && g_pid == getpid() && !IN_OWN_CODE(&T);
}

/* mmleak.so's destructor, from its entry in assembly (FLOOR_ENTRY, below): FLOOR is where
 * the stack of the exiting thread stops being ours, for the scan at exit. */
__attribute__((used, noinline)) int mml_fini_from(uintptr_t floor)
{
    if (!exit_is_ours())
        return 0;
    scan_at_exit(floor, 0); /* before the files close: the scanner reads them as they are */
    int saved = errno;
    T.guard++;
    leave_files(2);
    T.guard--;
    errno = saved;
    return 0;
}
FLOOR_ENTRY(mmleak_fini, mml_fini_from, __attribute__((destructor)) static)

/* ---- _exit and exec: no destructor runs, so flush the calling thread's file first ----
 * Nothing would be lost without this (the staging file keeps the lines and the readers merge
 * it), but the directory stays tidy: a finished thread has one .out file and no .tail.  In a
 * vfork() child the pid differs from ours and nothing is touched: the memory is the parent's. */

COLD void flush_before_leaving(int final)
{
    if (g_state != 1 || g_pid != getpid() || IN_OWN_CODE(&T))
        return;
    GUARDED;
    leave_files(final);
}

