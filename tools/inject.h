/* tools/inject.h: what the injector's files share (tools/inject.c holds the design: read
 * its top comment first).  tools/target.c reads the target (its memory, maps, symbols),
 * tools/hold.c holds the busy threads, tools/seccomp.c checks the seccomp filters. */
#ifndef MMLEAK_TOOLS_INJECT_H
#define MMLEAK_TOOLS_INJECT_H

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

#include "../tracer/compiler.h"

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

#if defined(__x86_64__) && defined(__linux__)


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
    siginfo_t *recs; /* the signals it got meanwhile, to deliver when it is let go */
    int nrec, caprec;
    uint64_t mask_saved; /* its signal mask, while mask_set (see attempt) */
    int mask_set;
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

/* The time a thread that must still stop is given past the deadline. */
static inline int64_t hard_until(struct inj *c) { return c->deadline + GRACE_NS; }

/* What a loaded object is to the injector (classify). */
enum { O_OTHER, O_LIBC, O_LD, O_LIBDL, O_LIBPTHREAD, O_MUSL, O_ALLOC };

struct elfdyn {
    uint64_t bias, symtab, strtab, strsz, gnuhash, hash, versym;
};

/* The debug registers in struct user (a hardware breakpoint: run_to_caller, run_out). */
#define DR_OFF(i) ((void *)(offsetof(struct user, u_debugreg) + (i) * sizeof(long)))

/* stack_return's INSIDE: a return address (SR_CALLER) outside the unsafe ranges, (SR_LIB)
 * into LIB's code, (SR_ANY) anywhere. */
enum { SR_CALLER, SR_LIB, SR_ANY };

/* ---- functions one file defines and another calls ---- */
int64_t now_ns(void);   /* target.c */
void nap_us(long us);   /* target.c */
__attribute__((format(printf, 3, 4))) int fail(struct inj *c, int code, const char *fmt,
                                                       ...);
__attribute__((format(printf, 2, 3))) void because(struct inj *c, const char *fmt, ...);   /* target.c */
ssize_t slurp(const char *path, char *buf, size_t cap);   /* target.c */
const char *field(const char *buf, const char *key);   /* target.c */
long field_long(const char *buf, const char *key, long dflt);   /* target.c */
int read_status(int pid, int tid, char *buf, size_t cap);   /* target.c */
const char *signame(int sig, char *buf, size_t cap);   /* target.c */
int is_fault(const siginfo_t *si);   /* target.c */
int mem_rw(struct inj *c, uint64_t addr, void *buf, size_t len, int write);   /* target.c */
int rd(struct inj *c, uint64_t addr, void *buf, size_t len);   /* target.c */
int rd_str(struct inj *c, uint64_t addr, char *buf, size_t cap);   /* target.c */
int load_maps(struct inj *c);   /* target.c */
const struct mapent *map_at(struct inj *c, uint64_t addr);   /* target.c */
int in_ranges(const struct range *r, size_t n, uint64_t a);   /* target.c */
int add_range(struct range **r, size_t *n, uint64_t lo, uint64_t hi);   /* target.c */
int classify(const char *path);   /* target.c */
uint64_t object_base(struct inj *c, const char *path);   /* target.c */
int elf_open(struct inj *c, uint64_t base, struct elfdyn *d);   /* target.c */
uint64_t elf_sym(struct inj *c, struct elfdyn *d, const char *name, uint64_t *size);   /* target.c */
int tracer_of(int pid, int tid, char *name, size_t cap);   /* target.c */
int explain_eperm(struct inj *c, int tid, const char *what);   /* target.c */
void unhold_all(struct inj *c);   /* hold.c */
int risky(struct inj *c);   /* hold.c */
int unhold_risky(struct inj *c, int max);   /* hold.c */
void adopt(struct inj *c, int i);   /* hold.c */
char thread_state(struct inj *c, int tid);   /* hold.c */
int hold_running(struct inj *c);   /* hold.c */
int settle_held(struct inj *c);   /* hold.c */
int seccomp_check(struct inj *c, int tid, int *code);   /* seccomp.c */
int loader_lock_owner(struct inj *c, int only);   /* inject.c */
int wait_tid(struct inj *c, int tid, int *st, int64_t until);   /* inject.c */
void detach_or_reap(struct inj *c, int tid, int sig);   /* inject.c */
int process_alive(int pid);   /* inject.c */
int trap_pending(struct inj *c, int tid);   /* inject.c */
int held_index(struct inj *c, int tid);   /* inject.c */
const char *unsafe_here(struct inj *c, const struct user_regs_struct *r, int *movable);   /* inject.c */
uint64_t stack_return(struct inj *c, uint64_t rsp, int inside);   /* inject.c */
uint64_t caller_address(struct inj *c, uint64_t rsp);   /* inject.c */

#endif
#endif
