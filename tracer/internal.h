/*
 * tracer/internal.h: what the C files of mmleak.so share (was mmleak.h).
 *
 * Nothing here is an interface of the library: those are the interposed functions and
 * mmleak_attach/detach/state/status (EXPORT).  Every declaration below is hidden (the pragma),
 * so a reference from another file of the tracer is a direct, PC-relative access, exactly as
 * for a static one: the hot path does not change when its data live in another file.
 *
 * Who owns what (each file's top comment says why it is shaped as it is):
 *   mmleak.c       the interposed entry points (tracer/hooks.def), the boot arena, the
 *                  allocator's real functions, the hook table
 *   record.h       the hot path: sequence numbers, the fast writers' callers and the stack
 *                  writer (inline)
 *   line.h         the line layout: every writer of an event line, fast path and stack path
 *   options.c      MMLEAK_* settings (the table in facts.h), from the environment or attach
 *   say.c          messages on stderr, and text without stdio
 *   mem.c          mmleak's own memory (mmap only)
 *   dumpdir.c      the dump directory: safe opens, file system uid, set*uid, chroot
 *   maps.c         mmleak.ID.maps and mmleak.ID.loads; the loaded objects (mml_each_object)
 *   threadfile.c   a thread's staging halves and dump files, holding, dropping, late lines
 *   stacks.c       capture, stack ids, and the general (non-fast) recording of an event
 *   lifecycle.c    process-wide state, start, fork, thread exit, _exit/exec, the constructor
 *   attach.c       mmleak_attach/detach/state, closing files from outside, the dlopen trampoline
 *   sites.c        is a code address the program's, the runtime's or a wrapper's?
 *   got.c          switching the GOT slots of every loaded object (attach, detach, pause)
 *   unwind.c/.h    the stack unwinder (its own API, usable alone)
 *   exitscan.c     the reachability scan at exit: mmleak-scan started, or scanhere.c
 *   scanhere.c     the scan of a lone thread at exit in a CLONE_VM child (the copy of
 *                  tools/scan*.c built with tools/scan_inproc.h), its memory mml_map's
 *   park.c         the other threads stopped by a signal of ours for that scan, where
 *                  ptrace may not (a daemon that dropped root with setuid)
 *
 * Rules that keep the host safe hold in every file (mmleak.c lists them): no lock, syscall or
 * allocation on the hot path; no descriptor kept between cold calls; errno saved around every
 * cold call (GUARDED); our own allocations never recorded (the thread's guard).
 */
#ifndef MMLEAK_INTERNAL_H
#define MMLEAK_INTERNAL_H

#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "compiler.h"
#include "platform.h"
#include "facts.h"

#pragma GCC visibility push(hidden)

/* ---- options.c: the settings (MMLEAK_OPTIONS in facts.h) ---- */

struct mml_cfg {
    char dir[PATH_MAX - 64]; /* MMLEAK_DIR, made absolute at start (default /tmp) */
    int depth;               /* MMLEAK_DEPTH: frames per allocation at most (the default: MMLEAK_MAX_DEPTH, the whole stack); 0: auto */
    size_t rotate;           /* MMLEAK_ROTATE_MB: start a new file past this size (256) */
    size_t buffer;           /* MMLEAK_BUFFER_KB: staging area of a busy thread (1024) */
    size_t hold;             /* MMLEAK_HOLD_MB: lines held in memory while unwritable (64) */
    int quiet;               /* MMLEAK_QUIET=1: no message on stderr, even on failure */
    int paused;              /* MMLEAK_PAUSED=1: preloaded, paused until mmleak.py attach */
    int scan;                /* MMLEAK_SCAN=1: the reachability scan at exit and _exit (the
                              * default); 2: not at a fork child's _exit; 0: never */
    int scan_here;           /* MMLEAK_SCAN_HERE=1: a lone thread's exit scan in a CLONE_VM child */
};
extern struct mml_cfg cfg;
/* Read the settings: from the environment (ARGS NULL), or, for mmleak_attach, from its
 * argument, lines "MMLEAK_DIR=/var/tmp/leaks" with the same names.  0, or -1 when MMLEAK_DIR
 * cannot be used as given (said why). */
int read_config(const char *args);

/* ---- exitscan.c: the reachability scan at the process's exit (mmleak-scan(7)) ---- */
/* FLOOR: where the program's part of the calling thread's stack begins (FLOOR_ENTRY), or 0;
 * BY__EXIT: called from _exit/_Exit (maybe in a signal handler: nothing allocated or freed) */
COLD void scan_at_exit(uintptr_t floor, int by__exit);
COLD void freeres_lookup(void);
COLD int run_scanner(const char *why, uintptr_t floor, int lone);
/* the child of a fork: no scan of the parent's is running here (exitscan.c) */
COLD void mml_scan_fork_child(void);
/* scanhere.c: the scan WHY ("exit", "api") of this thread, the process's only one, or
 * (PARK) with the others parked meanwhile (park.c), in a child sharing our memory (no
 * mmleak-scan started); the caller blocked every signal.  LONE: stack pointer, fs_base,
 * gs_base.  The scan's exit status (as mmleak-scan's), -1 (the child did not end by
 * itself), or -2 (no child could be started). */
struct mml_park;
COLD int mml_scan_here(const char *why, int tid, uintptr_t floor, int nfiles,
                       const uint64_t lone[3], int park, char *err, size_t errlen);
/* park.c: every other thread stopped by a signal of ours, no ptrace (the result: the slots,
 * and why when not all could be); mml_unpark lets them go (WAIT: until each has left our
 * handler) and puts the disposition back; mml_park_fork_child, in a fork's child, puts
 * the disposition back */
COLD struct mml_park *mml_park_others(void);
COLD void mml_unpark(int wait);
COLD void mml_park_fork_child(void);

/* FLOOR_ENTRY(NAME, INNER, ATTRS): the function NAME, in assembly, for a call from the
 * program that leads to a scan of its memory while it waits: it pushes the callee-saved
 * registers (rbx, rbp, r12-r15: the program's values, or its callers') and calls
 * INNER(floor), floor being its stack pointer after the pushes, then returns INNER's value.
 * FLOOR_ENTRY_EXIT: the same for _exit and _Exit, INNER(floor, status), which never returns
 * (NAME's first argument, in rdi, is passed on as INNER's second, in rsi).
 * The scanner reads that thread's stack from the floor up: mmleak.so's frames below it (stale
 * copies of addresses) are not roots, the registers it pushed are.  Elsewhere than x86-64:
 * INNER(0), no floor (the whole stack from the stack pointer, as for other threads). */
#if defined(__x86_64__)
#ifdef __CET__
#define FLOOR_ENDBR "    endbr64\n"
#else
#define FLOOR_ENDBR ""
#endif
/* the call frame information of each step, for an unwinder that walks through the entry (a
 * cancellation at the wait, a debugger's backtrace): GCC opens the entry's frame description
 * (.cfi_startproc) when it emits unwind tables, and says so with this macro */
#ifdef __GCC_HAVE_DWARF2_CFI_ASM
#define FLOOR_CFI(X) X "\n"
#else
#define FLOOR_CFI(X) ""
#endif
#define FLOOR_PUSH(R) "    push %" R "\n" FLOOR_CFI("    .cfi_adjust_cfa_offset 8") \
                      FLOOR_CFI("    .cfi_rel_offset %" R ", 0")
#define FLOOR_POP(R) "    pop %" R "\n" FLOOR_CFI("    .cfi_adjust_cfa_offset -8") \
                     FLOOR_CFI("    .cfi_restore %" R)
#define FLOOR_ASM(INNER)                                                                   \
        __asm__ volatile(FLOOR_ENDBR                                                      \
                         FLOOR_PUSH("rbp") FLOOR_PUSH("rbx") FLOOR_PUSH("r12")            \
                         FLOOR_PUSH("r13") FLOOR_PUSH("r14") FLOOR_PUSH("r15")            \
                         "    mov %rdi, %rsi\n"                                          \
                         "    mov %rsp, %rdi\n"                                          \
                         "    sub $8, %rsp\n"   /* 16-byte aligned at the call */         \
                         FLOOR_CFI("    .cfi_adjust_cfa_offset 8")                        \
                         "    call " #INNER "\n"                                         \
                         "    add $8, %rsp\n"                                            \
                         FLOOR_CFI("    .cfi_adjust_cfa_offset -8")                       \
                         FLOOR_POP("r15") FLOOR_POP("r14") FLOOR_POP("r13")               \
                         FLOOR_POP("r12") FLOOR_POP("rbx") FLOOR_POP("rbp")               \
                         "    ret\n")
#define FLOOR_ENTRY(NAME, INNER, ATTRS)                                                    \
    ATTRS __attribute__((naked)) int NAME(void) { FLOOR_ASM(INNER); }
#define FLOOR_ENTRY_EXIT(NAME, INNER, ATTRS)                                               \
    ATTRS __attribute__((naked)) void NAME(int status __attribute__((unused))) { FLOOR_ASM(INNER); }
#else
#define FLOOR_ENTRY(NAME, INNER, ATTRS)                                                    \
    ATTRS int NAME(void) { return INNER(0); }
#define FLOOR_ENTRY_EXIT(NAME, INNER, ATTRS)                                               \
    ATTRS void NAME(int status) { INNER(0, status); }
#endif

/* ---- mml_sys: a system call of mmleak's own, straight to the kernel ----
 * mmleak.so exports syscall() and prctl() (hooks.def: a seccomp filter the program installs
 * is checked first), so a call of either from mmleak.so's own code would bind, like any call
 * to an exported name, to the first definition in the process: our interposer when preloaded
 * (a compare and a forward, and a seccomp call of ours checked against the filter), or a
 * definition of the program's or of a library preloaded after us, which would count our calls
 * as the program's.  Our calls are made here instead: the instruction itself (no PLT, no
 * lookup, nothing that a vfork or CLONE_VM child must not run), errno set as glibc's
 * syscall() sets it.  mml_sys(NR, ARGS...): up to six arguments, the missing ones 0. */
#if defined(__x86_64__)
static inline long mml_sys6(long nr, long a, long b, long c, long d, long e, long f)
{
    register long r10 __asm__("r10") = d, r8 __asm__("r8") = e, r9 __asm__("r9") = f;
    long r;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "0"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    if (unlikely((unsigned long)r > -4096UL)) {
        errno = (int)-r;
        return -1;
    }
    return r;
}
#else   /* (not built: platform.h) the C library's, which resolves to our interposer */
long syscall(long nr, ...);
#define mml_sys6(nr, a, b, c, d, e, f) syscall(nr, a, b, c, d, e, f)
#endif
#define MML_SYS_(nr, a, b, c, d, e, f, ...) \
    mml_sys6((long)(nr), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))
#define mml_sys(...) MML_SYS_(__VA_ARGS__, 0, 0, 0, 0, 0, 0, 0)
#include "unguessable.h"  /* after mml_sys, which it uses */

/* ---- per-thread state ---- */

/* Which file a name of ours was when we made it: a name reopened later must still be that
 * file (see open_again), whatever was done to the directory meanwhile.  {0, 0}: unknown. */
struct fid { dev_t dev; ino_t ino; };

/* Per-thread state.  The hot fields come first, in one cache line. */
#define GUARD_NEST 0xffff       /* nesting count of mmleak's own code in this thread */
#define GUARD_NEW (1 << 24)     /* a failing operator new is in libstdc++: see new_failed */
#define GUARD_FREES (1 << 25)   /* our own call frees the program's blocks: see scan_at_exit */
struct tstate {
    char *cur;            /* next byte to write in the staging half */
    char *end;            /* end of that half; NULL forces the slow path */
    volatile int guard;   /* nonzero sends every event to the slow path (GUARD_ bits) */
    int open;             /* a file is open for this thread */
    int dropping;         /* cannot write now: events are counted in `lost`, retried later */
    int dead;             /* past its last pthread key destructor round: see thread_exit */
    int anon;             /* staging in anonymous memory: no file could be created yet */
    int late;             /* this thread's file was closed (process exit, exec) */
    int late_lines;       /* lines appended directly to it since */
    int early_frees;      /* frees before this thread's first allocation: see emit_cold */
    int exit_rounds;      /* pthread key destructor rounds seen */
    char *stage;          /* shared mapping of the .tail file: two halves */
    size_t half_size;
    int half;             /* the half being written */
    uint64_t out_off;     /* bytes already in the .out file */
    /* Lines of half h not yet in .out: from ustart[h], ulen[h] bytes.  Only a half whose
     * flush failed keeps any while the other one is written (see make_room). */
    size_t ustart[2], ulen[2];
    int slot;             /* 1 + our index in the registry of files, 0 if none */
    struct mml_recent *recent; /* its recent walks (unwind.h), mapped at its first stack */
    uint64_t *ss;         /* ids of the stacks the current file holds (open addressing) */
    size_t ss_cap, ss_n;
    uint64_t ss_gen;      /* changes whenever ss loses ids (emptied, freed, swapped): a recent
                             walk's slot stamped ss_gen + 1 holds an id that ss holds */
    uint32_t ss_stamp;    /* 0, or ss's number among all threads' sets since it last lost ids
                             (sset_lost): a memo record stamped with it holds an id ss holds */
    uint64_t lost;        /* events not recorded while dropping, not yet reported */
    unsigned episode;     /* k= of the "#dropping"/"#lost" lines of the current gap */
    unsigned epoch;       /* the dlclose() epoch this thread's fast path is valid for */
    unsigned trace_gen;   /* the trace its files belong to (attach/detach start new ones) */
    time_t retry_at;      /* while dropping: next time a write is tried */
    char *hold;           /* lines that could not be written yet, older than the halves' */
    size_t hold_start, hold_len, hold_cap;  /* see hold_take */
    int holding;          /* "#dropping k=EPISODE" is staged: a "#lost" line must close it */
    unsigned fileno;      /* N of the current file */
    struct fid out_id, tail_id; /* its .out and .tail files (see open_again) */
    const void *new_ra;   /* while GUARD_NEW: the caller of the failing operator new */
    struct tstate *next, *prev; /* registry of open threads, under g_lock */
    uint64_t walks;       /* stack walks made for the current file's events ("#walks") */
    int nofile_err;       /* staging in memory (anon): why its file could not be made */
};
extern __thread struct tstate T __attribute__((tls_model("initial-exec")));


/* The guard: while our own code runs, allocation calls pass straight through, and errno is
 * given back as it was. */
struct guard_scope { struct tstate *t; int saved_errno; };

static inline struct guard_scope guard_enter(void)
{
    struct guard_scope g = { &T, errno };
    g.t->guard++;
    return g;
}

static inline void guard_leave(struct guard_scope *g)
{
    g->t->guard--;
    errno = g->saved_errno;
}

#define GUARDED struct guard_scope _gs __attribute__((cleanup(guard_leave))) = guard_enter()

/* Threads inside a slow path (they may flush, grow or close their staging area): a detach
 * waits for none to be left before it closes their files from outside. */
extern atomic_int g_inflight;
struct inflight_scope { int on; };
static inline void inflight_leave(struct inflight_scope *s)
{
    if (s->on)
        atomic_fetch_sub(&g_inflight, 1);
}
#define INFLIGHT struct inflight_scope _if __attribute__((cleanup(inflight_leave))) = \
    { (atomic_fetch_add(&g_inflight, 1), 1) }
#define IN_OWN_CODE(t) ((t)->guard & GUARD_NEST)


/* ---- mmleak.c: the allocator's functions, the entry points' helpers ---- */

struct real_fns {
    void *(*malloc)(size_t);
    void (*free)(void *);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void *(*memalign)(size_t, size_t);
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
    void *(*valloc)(size_t);
    void *(*pvalloc)(size_t);
    int (*dlclose)(void *);
    /* C++ operators, used only when malloc fails, so new_handler and bad_alloc behave. */
    void *(*new_)(size_t);
    void *(*new_nothrow)(size_t, const void *);
    void *(*new_al)(size_t, size_t);
    void *(*new_al_nothrow)(size_t, size_t, const void *);
};
extern struct real_fns real;
/* Our own malloc under a name the dynamic linker cannot rebind: &malloc itself would give the
 * process's malloc, whoever provides it (mmleak.c makes an own_NAME of every hook). */
void *own_malloc(size_t n);
/* The real function of each hook whose slot is NEXT (tracer/hooks.def) */
#define MML_NEXT_DECL_ALLOCATOR(name, ret, params)
#define MML_NEXT_DECL_NEXT(name, ret, params) extern ret (*mml_next_##name) params;
#define HOOK(name, ret, params, args, kind, slot, make, extra) \
    MML_NEXT_DECL_##slot(name, ret, params)
#include "hooks.def"
#undef HOOK
void *sym(const char *name);
/* The allocator's functions from HANDLE: RTLD_NEXT normally; the process's own (RTLD_DEFAULT)
 * when another allocator comes before us, or when loaded into a running process. */
void resolve_from(void *handle);
COLD void resolve(void);
/* The function each hooked name reaches without mmleak, and the GOT switch's hook table. */
void hooks_init(void);
/* While a failing operator new runs the runtime's: its allocations are the user's `new`. */
const void *new_caller(const struct tstate *t, const void *ra);

/* ---- lifecycle.c: process-wide state, start, fork, thread exit ---- */

/* The trace id names this process image's files: the pid, or pid-K when mmleak.PID.maps
 * already exists (an exec'd image of the same process, or a reused pid). */
extern char g_id[32];
extern pid_t g_pid;
extern unsigned long long g_pstart;  /* the process's start, ticks after boot (pstart=) */
extern time_t g_t0;                  /* time() at trace start; event times are relative */
extern atomic_uint g_next_file;      /* N of the next mmleak.ID.N.out */
extern int g_state;                  /* 0: not started, 1: tracing, -1: disabled, 2: paused */
extern int g_forked;                 /* a fork child that did not exec (MMLEAK_SCAN=2) */
extern unsigned g_trace_gen;         /* a new trace in this process (attach after detach) */
extern int g_attached;               /* loaded into a running process by mmleak.py attach */
extern int g_window;                 /* this trace was started by mmleak_attach */
extern char g_cmd[2048];             /* escaped command line for the file headers */
extern char g_supp[1024];            /* the program's __lsan_default_suppressions(), escaped */
extern char g_alloc[512];            /* the allocator's file (libc, jemalloc...), escaped */
extern _Atomic uint64_t g_lost_orphan; /* events lost where no thread file could say so */
extern atomic_uint g_episode;        /* numbers the gaps: "#dropping k=K", "#lost N k=K" */
extern atomic_uint g_epoch;          /* dlclose() calls so far: see loads_log_locked */
extern int g_closing;                /* calls inside the real dlclose() (under g_lock) */
extern int g_ending;                 /* the process ends (its last files are closing): see
                                      * stage_drop */
extern pthread_mutex_t g_lock;       /* cold path only */
extern pthread_key_t g_key;
extern int g_key_ok;
/* malloc_is_ours: the thread whose probe allocation is expected, and whether it came */
extern struct tstate *volatile g_probe_t;
extern volatile int g_probe_hit;

COLD void global_init(void);
void tracer_setup(const char *alloc);
void process_start(const unsigned long long *loaded);
void arm_hot(void);
void set_status(void);
void read_cmdline(void);
void thread_exit(void *arg);
void fork_prepare(void);
void fork_parent(void);
void fork_child(void);
COLD void flush_before_leaving(int final);
int exit_is_ours(void);    /* an exit here may scan and close the files (lifecycle.c) */

/* ---- say.c: messages, and text without stdio ---- */

/* open_again's refusal of what stands at one of our names: not a regular file of ours (a
 * FIFO, a device, a directory, another user's file, a hard link to some other file).  Not an
 * errno value: messages say it in words and give no number. */
#define E_NOT_OURS 4096

size_t my_strlen(const char *s);
/* Append src to d without passing end; returns the new end (always NUL terminated). */
char *cat(char *d, char *end, const char *src);
char *cat_u(char *d, char *end, unsigned long v);
uint64_t parse_hex(const char *s, const char **end);
void escape_into(char *d, char *e, const unsigned char *raw, size_t n, int nul_space);
/* Why a write failed, for the one message we print (strerror may allocate). */
const char *why(int err);
void note_stderr(void);
void say4(const char *a, const char *b, const char *c, const char *f);
void say(const char *a, const char *b, const char *c);
/* The program's __lsan_default_suppressions() into g_supp, once at the start (tracer/lsan.c). */
void read_default_suppressions(void);
/* "WHAT DIR: REASON (errno N)TAIL"; REASON is why(ERR) unless given */
void say_why(const char *what, const char *reason, int err, const char *tail);
void say_err(const char *what, int err, const char *tail);

/* ---- mem.c: mmleak's own memory, never the traced allocator's ---- */

void *mml_map(size_t n);
/* Name and list a mapping of ours made with mmap itself (see mem.c). */
void mml_own_note(void *p, size_t n);
/* Give back a mapping of ours: mml_map's (listed for the scan: see ownlist.h) or another. */
void mml_unmap(void *p, size_t n);
/* Grow an array in mmap'ed memory: see mem.c. */
void *mml_grow(void *p, size_t *cap, size_t need, size_t unit);

/* ---- dumpdir.c: the files in the dump directory ---- */

extern int g_procfd;                    /* /proc, held after chroot(); else -1 */
extern uid_t g_owner;                   /* euid when the trace started: our files' owner */
extern atomic_int g_said_write;         /* the one message about failing writes */
#define WRITE_FAILED_TAIL "; events are kept and writing is retried; events that do not fit " \
    "are counted, and every report will say the trace is incomplete"
/* ... when a rotation's new file cannot be made (threadfile.c, make_room) */
#define ROTATE_FAILED_TAIL "; the thread goes on writing its current dump file past " \
    "MMLEAK_ROTATE_MB (compaction folds it when it ends)"
/* A taken name is skipped; after TAKEN_RUN taken names in a row, see dumpdir.c */
#define TAKEN_RUN 64

/* The file system uid switched to our files' owner while a thread that is another user
 * for now (a seteuid) works on them, and put back (dumpdir.c) */
struct fs_scope { uid_t old; int switched; };
int fs_begin(struct fs_scope *f);
int fs_begin_from(struct fs_scope *f, const char *status);
void fs_end(struct fs_scope *f);
char *file_name(char *buf, size_t len, const char *suffix);
int dir_writable(void);
int d_open(const char *name, int flags, mode_t mode);
int d_unlink(const char *name);
int d_taken(const char *name);
int dir_private(void);
int d_rename(const char *from, const char *to);
int create_locked(const char *name, struct fid *id);
int open_again(const char *name, int flags, const struct fid *want);
void say_taken(const char *what, const char *done);
uint64_t fsize_limit(void);
int write_all(int fd, const char *p, size_t n);
COLD void give_files_to(uid_t r, uid_t e, uid_t s, int re);
COLD void hold_dir(void);

/* ---- maps.c: mmleak.ID.maps and mmleak.ID.loads ---- */

extern int g_loads_on;  /* from the first dlclose on: before it, no range had two objects */
extern struct fid g_loads_id, g_maps_id;    /* made by reserve_id (.maps: its last version) */
extern struct fid g_lock_id;                /* made by reserve_id, or {0, 0} */
extern int g_loads_used;                     /* a line was written to it */
extern int g_loads_later, g_lock_later;      /* not made yet (reserve_id: a directory of ours) */
extern unsigned long long g_got_adds;   /* loader's count of loads when slots were last set */
int phdr_counts(struct dl_phdr_info *info, size_t size, void *data);
extern int g_loader_stuck;  /* a child forked while the loader's write lock was held */
/* dl_iterate_phdr, also in such a child (without the lock: nothing can change the list) */
COLD int mml_each_object(int (*cb)(struct dl_phdr_info *, size_t, void *), void *data);
COLD const char *mml_object_name(const void *a);
COLD const void *mml_object_of(const void *a);     /* an id of the object holding A, or NULL */
/* fork_child: was the loader's write lock held at the fork? */
void loader_after_fork(int parent_had_threads);
/* A new trace: every mapping goes into its log of loads again; then a snapshot, written
 * through CLAIM (the empty .maps reserve_id made: closed here), or -1. */
void maps_start_locked(const unsigned long long c[2], int claim);
COLD void maps_snapshot(int force);
void loads_drop_unused(void);

/* ---- threadfile.c: a thread's staging halves and dump files ---- */

#define HALF_HDR 32
/* The end of every half is kept free for signal handlers (see emit). */
#define SLACK 4096

/* The registry of files, in mmleak's own memory (see threadfile.c).  Under g_lock. */
/* SLOT_ANON: a thread staging in memory (no file of its own): its halves, so that its lines
 * can be written for it into the shared file at the exit (see sink_catch_up). */
enum { SLOT_FREE, SLOT_OPEN, SLOT_PARKED, SLOT_ANON };
struct file_slot {
    int state; unsigned fileno; char *stage; size_t half_size; uint64_t out_off;
    uint64_t *ss; size_t ss_cap, ss_n;     /* the stacks the file holds (parked files) */
    struct fid out_id, tail_id;
    uint64_t walks;                        /* its "#walks" count so far (parked files) */
    int sink_half; size_t sink_done;       /* SLOT_ANON: its current half, bytes written */
};
extern struct file_registry { struct file_slot *a; size_t n, cap; } R;
extern _Atomic size_t g_hold_total;     /* bytes of every thread's hold */
extern unsigned g_late_file;            /* the shared late file's N, ~0u: none yet */
extern struct fid g_late_id;
extern int g_sink;  /* the late file takes the lines of threads that cannot make a file */

char *side_name(char *buf, size_t len, unsigned n, const char *ext);
char *dump_name(char *buf, size_t len, unsigned n);
void prealloc_decide(void);
void stage_drop(struct tstate *t);
void half_start(struct tstate *t, int h);
void hold_free(struct tstate *t);
size_t lost_line(char *line, size_t cap, uint64_t n, unsigned k);
void file_close(struct tstate *t, int trailer);
void park(struct tstate *t);
void close_parked(void);
void late_shared(const char *line, size_t n);
void sink_make_locked(void);
void sink_catch_up(void);
void sink_catch_up_locked(void);
size_t nofile_line(char *line, size_t cap);
void note_line(struct tstate *t, const char *line, size_t n);
extern atomic_uint g_nofile;            /* threads whose events were lost for want of a file */
extern atomic_int g_nofile_err;         /* why the first of them could have none (errno) */
int emit(const char *line, size_t n);
int emit_free(const char *line, size_t n);
void thread_reset(struct tstate *t);

/* ---- attach.c ---- */

/* dlopen in a process mmleak.so was loaded into: the hook table's entry (the process's own
 * dlopen is kept in mml_next_dlopen) */
void *own_dlopen(const char *file, int mode);
int mml_dlopen_keep_caller(const void *ra, const char *file);
void *mml_dlopen_here(const char *file, int mode);

/* ---- stacks.c: stacks, and the general recording of an event ---- */

void sset_free(struct tstate *t);
void recent_free(struct tstate *t);
void sset_clear(struct tstate *t);
/* ss lost ids (emptied, freed, handed over): the stamps that said it held them are void */
static inline void sset_lost(struct tstate *t)
{
    t->ss_gen++;
    t->ss_stamp = 0;
}
/* ---- sites.c: the program's code, or the runtime's / a wrapper's? ---- */

/* Return addresses known to be the program's own code (not the runtime, not a wrapper): a
 * direct-mapped cache the fast path reads with one load.  An entry holds the address itself,
 * so a racing or stale entry can only cause a miss. */
#define MML_DIRECT_SIZE 4096
#define MML_DIRECT_SLOT(a) ((((uintptr_t)(a)) ^ ((uintptr_t)(a) >> 12)) & (MML_DIRECT_SIZE - 1))
extern _Atomic uintptr_t mml_direct[MML_DIRECT_SIZE];

enum { MML_SITE_PROGRAM = 0, MML_SITE_RUNTIME = 1, MML_SITE_WRAPPER = 2, MML_SITE_VOLATILE = 4 };
#define MML_SITE_PASS (MML_SITE_RUNTIME | MML_SITE_WRAPPER)

/* Classify a code address (takes a lock; fills mml_direct for the program's addresses and
 * mml_passing for the others, except in a range an object was unloaded from:
 * MML_SITE_VOLATILE, never cached). */
int mml_site_classify(uintptr_t addr);

/* The other verdicts (runtime, wrapper), cached the same way: an entry is the address with
 * the verdict in its top byte (user-space code addresses are below 2^47). */
extern _Atomic uintptr_t mml_passing[MML_DIRECT_SIZE];
#define MML_PASSING_ADDR(e) ((e) & (((uintptr_t)1 << 56) - 1))

/* Classify a code address: two loads when it was classified before, else the slow way. */
static inline int mml_site_class(uintptr_t a)
{
    if (atomic_load_explicit(&mml_direct[MML_DIRECT_SLOT(a)], memory_order_relaxed) == a)
        return MML_SITE_PROGRAM;
    uintptr_t e = atomic_load_explicit(&mml_passing[MML_DIRECT_SLOT(a)], memory_order_relaxed);
    if (MML_PASSING_ADDR(e) == a && (e >> 56))
        return (int)(e >> 56);
    return mml_site_classify(a);
}
/* Is ADDR in a range an object was unloaded from? */
int mml_site_volatile(uintptr_t addr);
/* Was any object unloaded (mml_sites_unloading) in this process? */
int mml_sites_unloaded(void);
/* An object is about to be unloaded from [lo, hi). */
void mml_sites_unloading(uintptr_t lo, uintptr_t hi);
/* Forget every answer (after dlclose: other code may come at the same addresses). */
void mml_sites_forget(void);
/* In a fork child: the lock may have been held by a thread that does not exist there. */
void mml_sites_after_fork(void);

/* ---- got.c: switching a process's GOT slots of malloc & co ---- */

/* The kinds of hooks.def */
enum { MML_HOOK_FREE, MML_HOOK_ALLOC, MML_HOOK_OTHER, MML_HOOK_ATTACH_ONLY };
struct mml_hook {
    const char *name;       /* the symbol called */
    void *ours;             /* mmleak's function */
    void *const *real;      /* where the function mmleak calls itself is kept (filled later) */
    int kind;               /* FREE (free, realloc, delete): switched first on, last off;
                             * ATTACH_ONLY: only when mmleak.so was loaded into a running
                             * process */
};

void mml_got_init(const struct mml_hook *hooks, int n, const void *self_addr, int attached,
                  int (*real_dlclose)(void *));
/* Scan every loaded object and point its slots at mmleak (TRACED) or away; returns the
 * number of slots. */
int mml_got_switch(int traced);
/* Objects loaded since: scan them and give their slots the current state. */
int mml_got_new_objects(void);
/* An object is about to be unloaded from [lo, hi): forget its slots. */
void mml_got_forget_object(uintptr_t lo, uintptr_t hi);
int mml_got_traced(void);
/* The first definition of NAME in the process outside mmleak.so (not a PLT stub). */
void *mml_find_definition(const char *name);

#pragma GCC visibility pop

#endif
