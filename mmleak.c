/*
 * mmleak.so: record every allocation and free of a process, for leak hunting.
 *
 * Loaded with LD_PRELOAD (or into a running process by mmleak.py attach: tracer/attach.c).
 * Every thread appends one text line per event to its own file $MMLEAK_DIR/mmleak.ID.N.out,
 * staged in a MAP_SHARED mapping of mmleak.ID.N.tail, so the kernel keeps every completed line
 * even when the process is killed with SIGKILL.  The dump format is specified in
 * mmleak-format(5) (docs/format.rst); mmleaklib/dumpformat.py is its reader.
 *
 * This file is the library's face: the functions it interposes (malloc & co, the C++
 * operators, strdup, dlclose, _exit and exec, set*uid, chroot, prctl and syscall for a
 * seccomp filter; listed once in tracer/hooks.def), the boot arena that serves the loader
 * before the real allocator is known, and the allocator's real functions.  Each entry point calls the real function and
 * records the event with the hot path of tracer/record.h; the rest of the tracer is in tracer/
 * (tracer/internal.h says which file owns what).
 *
 * Rules that keep the host safe (each one has bitten a tracer before):
 *   - the hot path takes no lock, makes no syscall, allocates nothing, and calls nothing but
 *     time() (a read of the vDSO page); anything else happens in noinline cold functions
 *     behind one unlikely() branch;
 *   - no descriptor is kept open between cold calls: a daemon that closes every fd and
 *     dup2()s over them can never make us write into one of its files;
 *   - errno is saved and restored around every cold call;
 *   - while our own cold code runs, a thread-local guard makes nested allocation calls
 *     pass straight to the real allocator (our bookkeeping is never recorded).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tracer/record.h"
#include "tracer/seccompfilter.h"
#include "tracer/unwind.h"

struct real_fns real;

/* The real functions of the hooks whose slot is NEXT (tracer/hooks.def): mml_next_NAME. */
#define MML_SLOT_ALLOCATOR(name, ret, params)
#define MML_SLOT_NEXT(name, ret, params) ret (*mml_next_##name) params;
#define HOOK(name, ret, params, args, kind, slot, make, extra) MML_SLOT_##slot(name, ret, params)
#include "tracer/hooks.def"
#undef HOOK

/* The next definition of NAME: after mmleak.so when preloaded; the process's own when loaded
 * into it (with dlopen, mmleak.so is not in the global scope: RTLD_NEXT means nothing). */
static void *next_definition(const char *name)
{
    return g_attached ? mml_find_definition(name) : sym(name);
}

static void *next_fn(const char *name)
{
    void *f = next_definition(name);
    if (!f)
        abort();
    return f;
}

/* A NEXT hook's real function, found at its first use if hooks_init has not run. */
#define FIND_NEXT(name)                                                                       \
    do {                                                                                      \
        if (!mml_next_##name)                                                                 \
            mml_next_##name = (__typeof(mml_next_##name))next_fn(#name);                      \
    } while (0)

/* Some callers of malloc run before libc can give us dlsym: serve them from a static
 * arena.  Blocks from it are never recorded (they are mmleak's, not the program's) and
 * never passed to the real free. */
static char boot_arena[64 * 1024] __attribute__((aligned(64)));
static size_t boot_used;

static int in_boot(const void *p)
{
    return (const char *)p >= boot_arena && (const char *)p < boot_arena + sizeof boot_arena;
}

static void *boot_alloc(size_t n)
{
    size_t need = (n + 16 + 15) & ~(size_t)15;
    if (boot_used + need > sizeof boot_arena)
        return NULL;
    char *p = boot_arena + boot_used;
    boot_used += need;
    memcpy(p, &n, sizeof n); /* size header, for realloc */
    return p + 16;
}

static size_t boot_size(const void *p)
{
    size_t n;
    memcpy(&n, (const char *)p - 16, sizeof n);
    return n;
}

void *sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}


/* f, if it is defined in the same object as `base` (the allocator's); else NULL.  An allocator
 * that lacks a function (jemalloc has no pvalloc, neither jemalloc nor tcmalloc has
 * reallocarray) must not get libc's: the program would free libc's block with its allocator. */
static void *same_object(void *f, const void *base)
{
    const void *o = mml_object_of(f);
    return o && o == base ? f : NULL;
}

/* The object that defines f, as dladdr tells it (searching its symbols for the nearest), for
 * resolve_from(RTLD_DEFAULT), which runs under g_lock: mml_object_of would take the loader's
 * write lock there, which a program's dl_iterate_phdr callback holds while it allocates
 * (global_init takes it before g_lock, never under). */
static const void *fbase(const void *f)
{
    Dl_info di;
    return f && dladdr(f, &di) ? di.dli_fbase : NULL;
}

static atomic_int g_resolving;

/* The allocator's functions, from `lookup`: RTLD_NEXT normally; the process's own (RTLD_DEFAULT)
 * when another allocator comes before us and we stay out of the way.  Functions it lacks are
 * left NULL and made from its malloc and memalign (see the al_* helpers). */
void resolve_from(void *handle)
{
    struct real_fns r;
    memset(&r, 0, sizeof r);
    const void *self = handle == RTLD_DEFAULT ? fbase((void *)own_malloc) : NULL;
    r.malloc = dlsym(handle, "malloc");
    r.free = dlsym(handle, "free");
    r.realloc = dlsym(handle, "realloc");
    if (handle == RTLD_DEFAULT && fbase((void *)r.realloc) == self)
        r.realloc = sym("realloc");     /* ours would call itself: libc's, as without us */
    if (!r.malloc || !r.free || !r.realloc) {
        static const char m[] = "mmleak: cannot find the real malloc; aborting\n";
        ssize_t w = write(2, m, sizeof m - 1);
        (void)w;
        abort();
    }
    if (handle == RTLD_DEFAULT) {
        /* anything but our own definitions: a non-PIE program's canonical PLT entries are fine */
        void *f;
#define PROC_FN(n) (f = dlsym(RTLD_DEFAULT, #n), fbase(f) == self ? NULL : f)
        r.calloc = PROC_FN(calloc);
        r.memalign = PROC_FN(memalign);
        r.posix_memalign = PROC_FN(posix_memalign);
        r.aligned_alloc = PROC_FN(aligned_alloc);
        r.valloc = PROC_FN(valloc);
        r.pvalloc = PROC_FN(pvalloc);
#undef PROC_FN
        /* a program that defines malloc, free, calloc and realloc only: its aligned
         * allocations are libc's without us, so they are libc's with us too */
        if (!r.memalign && !r.posix_memalign && !r.aligned_alloc) {
            r.memalign = sym("memalign");
            r.posix_memalign = sym("posix_memalign");
            r.aligned_alloc = sym("aligned_alloc");
            r.valloc = r.valloc ? r.valloc : sym("valloc");
            r.pvalloc = r.pvalloc ? r.pvalloc : sym("pvalloc");
        }
    } else {
        /* not under g_lock (resolve: a hook's, or global_init's before it takes g_lock) */
        const void *base = mml_object_of(r.malloc);
        r.calloc = same_object(sym("calloc"), base);
        r.memalign = same_object(sym("memalign"), base);
        r.posix_memalign = same_object(sym("posix_memalign"), base);
        r.aligned_alloc = same_object(sym("aligned_alloc"), base);
        r.valloc = same_object(sym("valloc"), base);
        r.pvalloc = same_object(sym("pvalloc"), base);
    }
    r.dlclose = sym("dlclose");
    real = r;
}

COLD void resolve(void)
{
    if (atomic_exchange(&g_resolving, 1)) /* nested call from dlsym: the boot arena serves */
        return;
    resolve_from(RTLD_NEXT);
}

/* Aligned allocation from whatever the allocator has. */
static void *al_alloc(size_t al, size_t n)
{
    if (real.memalign)
        return real.memalign(al, n);
    if (al < sizeof(void *))
        al = sizeof(void *);
    if (real.posix_memalign) {
        void *p;
        int rc = real.posix_memalign(&p, al, n);
        if (rc) {
            errno = rc;
            return NULL;
        }
        return p;
    }
    if (real.aligned_alloc && n <= SIZE_MAX - al)
        return real.aligned_alloc(al, (n + al - 1) / al * al);
    errno = ENOMEM;
    return NULL;
}

static void *al_calloc(size_t k, size_t n, size_t total)
{
    if (real.calloc)
        return real.calloc(k, n);
    void *p = real.malloc(total);
    if (p)
        memset(p, 0, total);
    return p;
}

/* ---------------------------------------------------------------------------------------
 * The entry points
 * ------------------------------------------------------------------------------------- */

COLD static void *boot_or_resolve(size_t n, int zero)
{
    if (!atomic_load(&g_resolving))
        resolve();
    if (real.malloc)
        return NULL;
    void *p = boot_alloc(n); /* a call from inside dlsym while we resolve */
    if (p && zero)
        memset(p, 0, n);
    return p;
}

/* At the top of every allocating entry point: the real allocator found (before that, the
 * boot arena serves); and with stacks of a fixed depth, this call's memo record starts coming
 * into the cache now, so that the lookup after the real allocator finds it there
 * (tracer/unwind.h: the memo).  A macro: both need the entry point's own frame. */
#define ENSURE_REAL(n, zero)                                                                  \
    do {                                                                                      \
        if (unlikely(!real.malloc)) {                                                         \
            void *bp_ = boot_or_resolve((n), (zero));                                         \
            if (!real.malloc)                                                                 \
                return bp_;                                                                   \
        }                                                                                     \
        if (H->memo)                                                                          \
            MML_MEMO_PREFETCH(__builtin_return_address(0));                                   \
    } while (0)

/* Record a block the real allocator returned (nothing when it failed).  Always inlined, like
 * traced_malloc: the stack writer (record.h) takes the frame it runs in for the entry
 * point's, whose return address is the caller's (else it finds it through the frame-pointer
 * chain, at a cost). */
HOT_INLINE void *noted(void *p, size_t n, const void *ra)
{
    if (likely(p != NULL))
        rec_alloc(p, n, ra);
    return p;
}

HOT_INLINE void *traced_malloc(size_t n, const void *ra)
{
    return noted(real.malloc(n), n, ra);
}

EXPORT void *malloc(size_t n)
{
    ENSURE_REAL(n, 0);
    return traced_malloc(n, __builtin_return_address(0));
}

EXPORT void free(void *p)
{
    if (unlikely(!p || in_boot(p)))
        return;
    if (unlikely(!real.free)) {
        boot_or_resolve(0, 0);
        if (!real.free)
            return;
    }
    note_free(p, __builtin_return_address(0));
    real.free(p);
}

EXPORT void *calloc(size_t k, size_t n)
{
    size_t total;
    if (unlikely(__builtin_mul_overflow(k, n, &total))) {
        errno = ENOMEM;
        return NULL;
    }
    ENSURE_REAL(total, 1);
    return noted(al_calloc(k, n, total), total, __builtin_return_address(0));
}

static void *traced_realloc(void *old, size_t n, const void *ra)
{
    if (unlikely(in_boot(old))) {
        void *p = traced_malloc(n, ra);
        if (p) {
            size_t k = boot_size(old);
            memcpy(p, old, k < n ? k : n);
        }
        return p;
    }
    if (!old)
        return traced_malloc(n, ra);
    /* The old block's number is taken before the call: once realloc has moved the block,
     * another thread may be handed the old address. */
    uint64_t s = seq_next(old);
    void *p = real.realloc(old, n);
    if (p == NULL && n != 0)
        return NULL; /* failed: the old block is untouched (its number stays unused) */
    rec_free(old, s, ra);
    if (p)
        rec_alloc(p, n, ra);
    return p;
}

EXPORT void *realloc(void *old, size_t n)
{
    ENSURE_REAL(n, 0);
    return traced_realloc(old, n, __builtin_return_address(0));
}

EXPORT void *reallocarray(void *old, size_t k, size_t n)
{
    size_t total;
    if (__builtin_mul_overflow(k, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    ENSURE_REAL(total, 0);
    return traced_realloc(old, total, __builtin_return_address(0));
}

EXPORT void *memalign(size_t al, size_t n)
{
    ENSURE_REAL(n + al, 0);
    return noted(al_alloc(al, n), n, __builtin_return_address(0));
}

EXPORT int posix_memalign(void **out, size_t al, size_t n)
{
    if (unlikely(!real.malloc)) {
        boot_or_resolve(0, 0);
        if (!real.malloc)
            return ENOMEM;
    }
    int rc;
    if (real.posix_memalign) {
        rc = real.posix_memalign(out, al, n);
    } else if (al < sizeof(void *) || (al & (al - 1))) {
        rc = EINVAL;
    } else {
        int saved = errno;
        void *p = al_alloc(al, n);
        rc = p ? 0 : ENOMEM;
        if (p)
            *out = p;
        errno = saved;
    }
    if (rc == 0 && *out)
        rec_alloc(*out, n, __builtin_return_address(0));
    return rc;
}

EXPORT void *aligned_alloc(size_t al, size_t n)
{
    ENSURE_REAL(n + al, 0);
    return noted(real.aligned_alloc ? real.aligned_alloc(al, n) : al_alloc(al, n), n,
                 __builtin_return_address(0));
}

EXPORT void *valloc(size_t n)
{
    ENSURE_REAL(n + 4096, 0);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return noted(real.valloc ? real.valloc(n) : al_alloc(pg, n), n, __builtin_return_address(0));
}

EXPORT void *pvalloc(size_t n)
{
    ENSURE_REAL(n + 4096, 0);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if (!real.pvalloc && n > SIZE_MAX - pg) {
        errno = ENOMEM;
        return NULL;
    }
    return noted(real.pvalloc ? real.pvalloc(n) : al_alloc(pg, (n + pg - 1) / pg * pg), n,
                 __builtin_return_address(0));
}

#define RA __builtin_return_address(0)

/* strdup and strndup allocate inside libc, where the caller would be libc itself: doing
 * them here keeps the user's line as the caller. */
static inline char *dup_n(const char *s, size_t n, const void *ra)
{
    ENSURE_REAL(n + 1, 0);
    char *p = traced_malloc(n + 1, ra);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* strdup, __strdup, strndup, __strndup: generated (DUP) below. */

/* dlclose: remember the mappings of what is about to be unloaded, so addresses in it stay
 * symbolizable (or at least recognisably unresolvable) later. */
EXPORT int dlclose(void *h)
{
    if (unlikely(!real.dlclose))
        resolve();
    int tracing = g_state == 1 && g_pid == getpid() && !IN_OWN_CODE(&T);
    if (tracing) {
        GUARDED;
        pthread_mutex_lock(&g_lock);
        g_loads_on = 1;     /* the first one writes every mapping seen so far, as "+0" */
        pthread_mutex_unlock(&g_lock);
        maps_snapshot(1);
        /* the object's range: code there may belong to another object from now on */
        struct link_map *lm = NULL;
        struct dl_find_object fo;
        if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_ld &&
            _dl_find_object(lm->l_ld, &fo) == 0)
        {
            mml_sites_unloading((uintptr_t)fo.dlfo_map_start, (uintptr_t)fo.dlfo_map_end);
            mml_got_forget_object((uintptr_t)fo.dlfo_map_start, (uintptr_t)fo.dlfo_map_end);
        }
        pthread_mutex_lock(&g_lock);
        g_closing++;
        pthread_mutex_unlock(&g_lock);
    }
    mml_unwind_dlclose_begin();
    int rc = real.dlclose(h);
    mml_unwind_dlclose_end();   /* no cached rule of the unloaded code survives */
    if (tracing) {
        GUARDED;
        pthread_mutex_lock(&g_lock);    /* one step for loads_log_locked: the epoch and */
        atomic_fetch_add(&g_epoch, 1);  /* whether a dlclose() is still running */
        g_closing--;
        pthread_mutex_unlock(&g_lock);
        mml_sites_forget();   /* other code may come at the same addresses */
        arm_hot();            /* every thread notices the new epoch on its next event */
    }
    return rc;
}

/* _exit and _Exit, from their entry in assembly (FLOOR_ENTRY_EXIT, below: the program's
 * callee-saved registers pushed, FLOOR where mmleak.so's frames start).  No destructor runs
 * after them, so the scan at the exit runs here, with mml_fini_from's rules (exit_is_ours: not
 * in a vfork child, not inside our own code; MMLEAK_SCAN, seccomp and the rest in scan_at_exit):
 * dash ends every `sh -c` this way, and its blocks were "reachability unknown".  MMLEAK_SCAN=2
 * leaves out a fork child that did not exec (prefork servers' children: a scan of a copy of
 * the parent's heap each).  exit() ends by glibc's internal _exit, not this one: one scan. */
__attribute__((used, noinline, noreturn)) void mml_exit_from(uintptr_t floor, int status)
{
    if (exit_is_ours() && !(cfg.scan == 2 && g_forked))
        scan_at_exit(floor, 1); /* before the files close, as at exit */
    flush_before_leaving(1);
    FIND_NEXT(_exit);
    mml_next__exit(status);
    __builtin_unreachable();
}
FLOOR_ENTRY_EXIT(_exit, mml_exit_from, EXPORT __attribute__((noreturn)))
FLOOR_ENTRY_EXIT(_Exit, mml_exit_from, EXPORT __attribute__((noreturn)))

/* execve and the other vector forms: generated (EXEC) below.  The list forms collect their
 * arguments, then go through the vector forms. */
#define COLLECT_ARGS(first, last_named, argv, envp_out)                                       \
    size_t n_ = 1;                                                                            \
    va_list ap_;                                                                              \
    va_start(ap_, last_named);                                                                \
    while (va_arg(ap_, char *))                                                               \
        n_++;                                                                                 \
    va_end(ap_);                                                                              \
    char *argv[n_ + 1];                                                                       \
    argv[0] = (char *)(first);                                                                \
    va_start(ap_, last_named);                                                                \
    for (size_t i_ = 1; i_ <= n_; i_++)                                                       \
        argv[i_] = va_arg(ap_, char *);                                                       \
    envp_out;                                                                                 \
    va_end(ap_)

EXPORT int execl(const char *path, const char *arg, ...)
{
    COLLECT_ARGS(arg, arg, argv, (void)0);
    return execv(path, argv);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
    COLLECT_ARGS(arg, arg, argv, (void)0);
    return execvp(file, argv);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
    char **envp;
    COLLECT_ARGS(arg, arg, argv, envp = va_arg(ap_, char **));
    return execve(path, argv, envp);
}

/* setuid and friends (generated, SETUID, below) first hand our files to the new user: see
 * give_files_to.  chroot first keeps a descriptor of the dump directory: see hold_dir. */
EXPORT int chroot(const char *path)
{
    hold_dir();
    FIND_NEXT(chroot);
    return mml_next_chroot(path);
}

EXPORT int mmleak_detach(const char *args);    /* tracer/attach.c */

/* ---- a seccomp filter the process puts on itself: checked before it goes in ----
 * Such a filter allows the system calls the program makes, and perhaps not mmleak's: sshd's
 * privilege-separated child would be killed (SIGSYS) at the prlimit64 of a flush or the
 * sigaltstack of a stack's first event, chronyd -F 1 at its exit's flush.  So the filter is
 * run, as the injector runs a target's before an attach (tracer/seccompfilter.h), on each
 * system call mmleak makes; unless it allows them all (or the process enters strict mode),
 * the trace ends first, as a detach ends it: every file complete, the process paused (its
 * calls go straight to the allocator).  glibc's prctl and the seccomp system call through
 * syscall() (libseccomp) are seen; a raw one is not. */
static COLD void before_seccomp(int strict, const struct sock_fprog *prog)
{
    if (g_state != 1 || g_pid != getpid())
        return;     /* not tracing, or a vfork child: the files are its parent's */
    const char *what = "strict mode";
#ifdef MMLEAK_SC_CHECK
    if (!strict) {
        uint32_t act = 0;
        int j = !prog || !prog->filter || prog->len > SC_MAX_INSNS ? -2 :
                sc_refused(prog->filter, prog->len, (uint64_t)(uintptr_t)&write, &act);
        if (j == -1)
            return;     /* it allows everything mmleak does: tracing goes on */
        what = j < 0 ? "a filter mmleak cannot read" : SC_NEEDED[j].name;
    }
#else
    (void)prog;
    what = strict ? what : "a filter (not checked on this architecture)";
#endif
    say4("the program enters seccomp ", strict ? what : "with a filter that refuses ",
         strict ? "" : what, ", a system call of mmleak's: tracing ends here (the trace is "
         "complete up to this point)");
    mmleak_detach(NULL);
}

EXPORT int prctl(int option, ...)
{
    va_list ap;
    va_start(ap, option);
    unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long);
    unsigned long a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
    va_end(ap);
    if (option == PR_SET_SECCOMP)
        before_seccomp(a2 == SECCOMP_MODE_STRICT, (const struct sock_fprog *)a3);
    FIND_NEXT(prctl);
    return mml_next_prctl(option, a2, a3, a4, a5);
}

/* Like glibc's, six arguments are passed on whatever the call's own number.  The program's
 * calls only: mmleak.so's own are made with mml_sys (tracer/internal.h), never through this. */
EXPORT long syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (nr == SYS_seccomp && (a[0] == SECCOMP_SET_MODE_STRICT || a[0] == SECCOMP_SET_MODE_FILTER))
        before_seccomp(a[0] == SECCOMP_SET_MODE_STRICT, (const struct sock_fprog *)a[2]);
    FIND_NEXT(syscall);
    return mml_next_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* ---- C++: operator new and delete in all forms, with the user's code as the caller ----
 * The common case is malloc (or memalign) plus a record.  Only when that fails do we call
 * the real operator (resolved then), with the guard held, so new_handler, std::bad_alloc
 * and nothrow semantics are exactly libstdc++'s. */

/* The real operators' code ranges: an allocation made from inside one of them, while a failing
 * operator new of ours runs it, is the user's `new` and gets the user's line. */
static struct { uintptr_t lo, hi; } g_newfn[4];

/* The C++ runtime's operator NAME (libstdc++'s: the object that defines std::get_new_handler),
 * never an allocator's: jemalloc, tcmalloc and mimalloc define operator new too, and theirs
 * allocate inside themselves, out of our sight (the block a retry after the new_handler gets
 * would not be recorded).  The runtime's calls malloc, aligned_alloc and, in the nothrow
 * forms, the throwing operator through the PLT: all of them come back to us. */
static void *new_op(const char *name, int i)
{
    void *f = NULL;
    Dl_info di;
    void *gnh = dlsym(RTLD_DEFAULT, "_ZSt15get_new_handlerv");
    if (gnh && dladdr(gnh, &di) && di.dli_fname) {
        void *h = dlopen(di.dli_fname[0] ? di.dli_fname : NULL, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            f = same_object(dlsym(h, name), mml_object_of(gnh));
            if (real.dlclose)
                real.dlclose(h);    /* ours would count an unload that is not one */
        }
    }
    if (!f)
        f = sym(name);
    const ElfW(Sym) *es = NULL;
    if (f && dladdr1(f, &di, (void **)&es, RTLD_DL_SYMENT) && es && es->st_size) {
        g_newfn[i].lo = (uintptr_t)f;
        g_newfn[i].hi = (uintptr_t)f + es->st_size;
    }
    return f;
}

const void *new_caller(const struct tstate *t, const void *ra)
{
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ra - g_newfn[i].lo < g_newfn[i].hi - g_newfn[i].lo)
            return t->new_ra;
    return ra;
}

struct new_scope { struct tstate *t; int had; const void *ra; };

static void new_leave(struct new_scope *s)
{
    if (!s->had)
        s->t->guard &= ~GUARD_NEW;
    s->t->new_ra = s->ra;
}

/* malloc failed under operator new: libstdc++'s operator (see new_op) runs the new_handler loop
 * and throws std::bad_alloc, exactly as without us.  It runs with tracing on: its own malloc call comes
 * back to our malloc (recorded there, with the user's line: GUARD_NEW), the handler's
 * allocations and the exception object are recorded as what they are. */
COLD static void *new_failed(size_t n, size_t al, int nothrow, const void *ra)
{
    if (!real.new_) {
        GUARDED;        /* what dlopen allocates is ours, not the program's */
        real.new_al_nothrow = new_op("_ZnwmSt11align_val_tRKSt9nothrow_t", 3);
        real.new_al = new_op("_ZnwmSt11align_val_t", 2);
        real.new_nothrow = new_op("_ZnwmRKSt9nothrow_t", 1);
        real.new_ = new_op("_Znwm", 0);
    }
    static const char nothrow_tag = 0; /* std::nothrow_t is an empty struct */
    struct tstate *t = &T;
    struct new_scope sc __attribute__((cleanup(new_leave))) = { t, t->guard & GUARD_NEW, t->new_ra };
    /* nested: the runtime's nothrow operator calls the throwing one, which failed too; the
     * block is still the user's `new` */
    t->new_ra = sc.had ? new_caller(t, ra) : ra;
    t->guard |= GUARD_NEW;  /* cleared by new_leave, also when the operator throws */
    if (al) {
        if (nothrow ? !real.new_al_nothrow : !real.new_al)
            abort();
        return nothrow ? real.new_al_nothrow(n, al, &nothrow_tag) : real.new_al(n, al);
    }
    if (nothrow ? !real.new_nothrow : !real.new_)
        abort();
    return nothrow ? real.new_nothrow(n, &nothrow_tag) : real.new_(n);
}

HOT_INLINE void *op_new(size_t n, size_t al, int nothrow, const void *ra)
{
    if (unlikely(!real.malloc))
        resolve();
    if (H->memo)    /* see ENSURE_REAL: inlined into the entry point, this is its frame */
        MML_MEMO_PREFETCH(ra);
    void *p = al ? al_alloc(al, n ? n : 1) : real.malloc(n ? n : 1);
    if (likely(p != NULL)) {
        rec_alloc(p, n, ra);
        return p;
    }
    return new_failed(n, al, nothrow, ra);
}

static inline void op_delete(void *p, const void *ra)
{
    if (unlikely(!p || in_boot(p)))
        return;
    note_free(p, ra);
    real.free(p);
}

/* ---------------------------------------------------------------------------------------
 * Generated from tracer/hooks.def: the definitions that follow a pattern, our functions'
 * own_ names, the hook table and its real functions
 * ------------------------------------------------------------------------------------- */

/* Every definition that follows a pattern, and an own_NAME for every function we define: our
 * functions under names the dynamic linker cannot rebind (&malloc itself would give the
 * process's malloc, whoever provides it). */
#define MML_OWN(name)                                                                         \
    extern __typeof(name) own_##name                                                          \
        __attribute__((alias(#name), visibility("hidden"), copy(name)));
#define MML_OP_NEW(n, al, nothrow) op_new(n, al, nothrow, RA)
#define MML_MAKE_BY_HAND(name, ret, params, args, extra) MML_OWN(name)
#define MML_MAKE_ASM(name, ret, params, args, extra)
#define MML_MAKE_NEW(name, ret, params, args, extra)                                          \
    EXPORT ret name params { return MML_OP_NEW extra; }                                       \
    MML_OWN(name)
#define MML_MAKE_DELETE(name, ret, params, args, extra)                                       \
    EXPORT ret name params { op_delete(p, RA); }                                              \
    MML_OWN(name)
#define MML_MAKE_DUP(name, ret, params, args, extra)                                          \
    EXPORT ret name params { return dup_n(s, extra, RA); }                                    \
    MML_OWN(name)
#define MML_MAKE_EXEC(name, ret, params, args, extra)                                         \
    EXPORT ret name params                                                                    \
    {                                                                                         \
        flush_before_leaving(0);                                                              \
        FIND_NEXT(name);                                                                      \
        return mml_next_##name args;                                                          \
    }                                                                                         \
    MML_OWN(name)
#define MML_MAKE_SETUID(name, ret, params, args, extra)                                       \
    EXPORT ret name params                                                                    \
    {                                                                                         \
        give_files_to extra;                                                                  \
        FIND_NEXT(name);                                                                      \
        return mml_next_##name args;                                                          \
    }                                                                                         \
    MML_OWN(name)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"     /* a sized delete ignores the size */
#define HOOK(name, ret, params, args, kind, slot, make, extra)                                \
    MML_MAKE_##make(name, ret, params, args, extra)
#include "tracer/hooks.def"
#undef HOOK
#pragma GCC diagnostic pop

/* Every definition is the one hooks.def says (and so, for the C functions, the C library's):
 * an incompatible pointer is an error (-Werror). */
#define HOOK(name, ret, params, args, kind, slot, make, extra)                                \
    static ret (*const mml_check_##name) params __attribute__((unused)) = name;
#include "tracer/hooks.def"
#undef HOOK

/* The table got.c switches slots with: what a slot points to while traced (ours), and what
 * it points to otherwise (the real function, kept in `real` or in mml_next_NAME). */
#define MML_REAL_ALLOCATOR(name) (void *const *)&real.name
#define MML_REAL_NEXT(name) (void *const *)&mml_next_##name
static const struct mml_hook hooks[] = {
#define HOOK(name, ret, params, args, kind, slot, make, extra)                                \
    { #name, (void *)own_##name, MML_REAL_##slot(name), MML_HOOK_##kind },
#include "tracer/hooks.def"
#undef HOOK
};

/* The function each hooked name reaches without mmleak: the next definition after mmleak.so
 * when preloaded, the process's own when loaded into it.  (The allocator's are in `real`.) */
void hooks_init(void)
{
#define MML_FILL_ALLOCATOR(name)
#define MML_FILL_NEXT(name) mml_next_##name = (__typeof(mml_next_##name))next_definition(#name);
#define HOOK(name, ret, params, args, kind, slot, make, extra) MML_FILL_##slot(name)
#include "tracer/hooks.def"
#undef HOOK
    mml_got_init(hooks, (int)(sizeof hooks / sizeof hooks[0]), (void *)own_malloc, g_attached,
                 real.dlclose);
}
