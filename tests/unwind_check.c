/* Compares tracer/unwind.c's walk with glibc's backtrace() at many call sites, and runs it on
 * hostile stacks.  Built by tests/test_unwind.py in several variants (PIE or not, -O0/-O2, with
 * and without frame pointers) and linked with tracer/unwind.c directly.
 *
 *     unwind_check MODE      (chains, signal, async, threads, fork, plt, nocfi, dl, dl-noinval,
 *                             tiny, ucontext, altstack, deep, garbage)
 *
 * Output, one line per capture:
 *     site NAME n=N match=1 frames=sym,sym,... addrs=hex,hex,...
 * match: our frames are exactly backtrace()'s frames at the same point (backtrace's first
 * entry is inside check() itself and is dropped).  frames: dladdr names of our entries (the
 * address - 1), "?" when unknown; addrs: the entries.  On a mismatch backtrace()'s list
 * follows as "bt=".
 * Other lines: "info ...", "kinds ..." (rule kinds computed), "end MODE" at the end. */
#define _GNU_SOURCE
#include "../tracer/unwind.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define MAXF 64

volatile int sink;
static int quiet; /* threads: print only mismatches */
static atomic_int mismatches, captures;

extern void mml_unwind_test_kinds(long out[8]); /* MML_UNWIND_TESTING: rules computed by kind */

static void sym(uintptr_t a, char *buf, size_t n)
{
    Dl_info di;
    if (dladdr((void *)(a - 1), &di) && di.dli_sname)
        snprintf(buf, n, "%s", di.dli_sname);
    else
        snprintf(buf, n, "?");
}

static void print_list(FILE *f, const char *tag, const uintptr_t *v, int n)
{
    fprintf(f, " %s=", tag);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%lx", i ? "," : "", (unsigned long)v[i]);
}

/* Report a capture: OURS against EXPECT (or no comparison if expect is NULL). */
static void report(const char *site, const uintptr_t *ours, int n, const uintptr_t *expect, int m)
{
    int match = expect ? (n == m && !memcmp(ours, expect, sizeof *ours * (size_t)n)) : 1;
    atomic_fetch_add(&captures, 1);
    if (!match)
        atomic_fetch_add(&mismatches, 1);
    if (quiet && match)
        return;
    enum { LINE = 16384 };
    char *line = malloc(LINE); /* not on the stack: tiny stacks */
    FILE *f = fmemopen(line, LINE, "w");
    fprintf(f, "site %s n=%d match=%d frames=", site, n, match);
    for (int i = 0; i < n; i++) {
        char s[128];
        sym(ours[i], s, sizeof s);
        fprintf(f, "%s%s", i ? "," : "", s);
    }
    print_list(f, "addrs", ours, n);
    if (!match && expect)
        print_list(f, "bt", expect, m);
    fputc('\n', f);
    fclose(f);
    line[LINE - 1] = 0;
    fputs(line, stdout);
    fflush(stdout);
    free(line);
}

/* As mmleak.so may call it: from a function below the one whose return address is ra, all
 * with frame pointers (__builtin_frame_address forces one). */
NOINLINE int from_ra(uintptr_t ra, uintptr_t *out)
{
    sink += (int)(uintptr_t)__builtin_frame_address(0) & 1;
    return mml_unwind_from_ra((const void *)ra, out, MAXF);
}

/* Our walk from check()'s caller, then backtrace() here; also mml_unwind_from_ra(), which
 * must give the same list ("fromra=0" at the end of the line if it does not). */
NOINLINE void check(const char *site)
{
    uintptr_t ours[MAXF], expect[MAXF], viara[MAXF];
    void *bt[MAXF + 1];
    uintptr_t *fp = __builtin_frame_address(0);
    int n = mml_unwind(fp[1], (uintptr_t)(fp + 2), fp[0], ours, MAXF);
    int m = backtrace(bt, MAXF + 1);
    for (int i = 1; i < m; i++)
        expect[i - 1] = (uintptr_t)bt[i];
    int k = from_ra(fp[1], viara);
    if (k != n || memcmp(viara, ours, sizeof *ours * (size_t)n))
        printf("fromra=0 %s\n", site);
    report(site, ours, n, expect, m - 1);
}

/* ---- call chains: every kind of frame ---------------------------------------------------- */

NOINLINE void leaf(const char *site) { check(site); sink++; }

NOINLINE void f_small(const char *site, int d)
{
    volatile char buf[24];
    buf[0] = (char)d;
    if (d > 0)
        f_small(site, d - 1);
    else
        leaf(site);
    sink += buf[0];
}

NOINLINE void f_big(const char *site) /* CFA = rsp + ~70000 */
{
    volatile char buf[70000];
    buf[0] = 1;
    leaf(site);
    sink += buf[0] + buf[69999];
}

NOINLINE void f_huge(const char *site) /* CFA = rsp + ~300000: too large for a cache entry */
{
    volatile char buf[300000];
    buf[0] = 1;
    leaf(site);
    sink += buf[0] + buf[299999];
}

NOINLINE void f_vla(const char *site, int n) /* rbp-based CFA even without frame pointers */
{
    volatile char buf[n];
    buf[0] = 1;
    leaf(site);
    sink += buf[0] + buf[n - 1];
}

NOINLINE void f_realign(const char *site, int n) /* dynamic realignment (gcc's DRAP at -O2) */
{
    char buf[n] __attribute__((aligned(64)));
    _Alignas(64) volatile char b2[64];
    memset(buf, 1, (size_t)n);
    b2[0] = buf[n - 1];
    leaf(site);
    sink += b2[0];
}

NOINLINE long many_args(const char *site, long a, long b, long c, long d, long e, long f, long g,
                        long h, long i, long j)
{
    leaf(site);
    return a + b + c + d + e + f + g + h + i + j;
}

NOINLINE void f_stackargs(const char *site) /* arguments pushed on the stack before the call */
{
    sink += (int)many_args(site, sink, 2, 3, 4, 5, 6, sink, 8, sink, 10);
}

NOINLINE long f_regs(const char *site, long x) /* many callee-saved registers live across calls */
{
    long a = x * 3, b = x ^ 5, c = x + 7, d = x * x, e = x - 11, g = x | 13;
    leaf(site);
    long r = a * b + c * d + e * g;
    leaf(site);
    return r + a + b + c + d + e + g;
}

NOINLINE void f_varargs(const char *site, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    long s = 0;
    for (int i = 0; i < n; i++)
        s += va_arg(ap, long);
    va_end(ap);
    leaf(site);
    sink += (int)s;
}

NOINLINE void f_ptr(void (*fn)(const char *), const char *site) { fn(site); sink++; }

static __thread const char *qsort_site;
static __thread int qsort_done;
static int cmp_int(const void *a, const void *b)
{
    if (!qsort_done) {
        qsort_done = 1;
        check(qsort_site); /* called from inside glibc's qsort */
    }
    return *(const int *)a - *(const int *)b;
}

NOINLINE void f_qsort(const char *site)
{
    int v[8] = {5, 3, 7, 1, 0, 6, 2, 4};
    qsort_site = site;
    qsort_done = 0;
    qsort(v, 8, sizeof v[0], cmp_int);
    sink += v[0];
}

/* no CFI at all: hand-written asm with garbage in rbp, calling back into C */
void nocfi_call(void (*fn)(void));
extern const char nocfi_call_end[];
__asm__(".text\n"
        ".globl nocfi_call\n"
        ".type nocfi_call,@function\n"
        "nocfi_call:\n"
        "    push %rbp\n"
        "    movabs $0x5a5a5a5a5a5a5a5a, %rbp\n"
        "    call *%rdi\n"
        "    pop %rbp\n"
        "    ret\n"
        ".globl nocfi_call_end\n"
        "nocfi_call_end:\n"
        ".size nocfi_call, .-nocfi_call\n");

NOINLINE void nocfi_cb(void) { leaf("nocfi"); sink++; }

/* a C function compiled without unwind tables (tests/unwind_notables.c) */
void notables_call(void (*fn)(void));
NOINLINE void notables_cb(void) { leaf("notables"); sink++; }

NOINLINE void run_chains(void)
{
    f_small("small0", 0);
    f_small("small5", 5);
    f_big("big");
    f_huge("huge");
    f_vla("vla", 100 + sink % 3);
    f_realign("realign", 100 + sink % 3);
    f_stackargs("stackargs");
    sink += (int)f_regs("regs", sink);
    f_varargs("varargs", 3, 1L, 2L, 3L);
    f_ptr(leaf, "ptr");
    f_qsort("qsort");
    sink++; /* no tail call: run_chains stays on the stack */
}

/* ---- signals ----------------------------------------------------------------------------- */

void on_usr1(int sig);
void on_usr1(int sig)
{
    (void)sig;
    leaf("signal");
}

NOINLINE void raise_in_chain(int d)
{
    volatile char buf[40];
    buf[0] = 0;
    if (d)
        raise_in_chain(d - 1);
    else
        raise(SIGUSR1);
    sink += buf[0];
}

/* async: another thread interrupts a busy loop at random instructions */
static atomic_int async_stop, async_left, in_spin;
static pthread_t async_target;

NOINLINE long tiny(long x) { volatile long y = x; return y * 3 + 1; }
NOINLINE long spin_mid(long x)
{
    volatile char buf[56];
    buf[0] = (char)x;
    return tiny(x) + buf[0];
}
NOINLINE void spin(void)
{
    long x = 1;
    char a[512], b[512];
    memset(a, 'x', sizeof a - 1);
    a[sizeof a - 1] = 0;
    atomic_store(&in_spin, 1);
    while (!atomic_load(&async_stop)) {
        x = spin_mid(x) & 0xffff;
        /* and glibc's code: hand-written asm, the vDSO, malloc */
        memcpy(b, a, sizeof a);
        x += (long)strlen(b);
        void *p = malloc(16 + (size_t)(x & 1023));
        snprintf(b, sizeof b, "%ld", x);
        free(p);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        x += ts.tv_nsec & 7;
    }
    sink += (int)x;
}

/* the handler may interrupt malloc or stdio: it only records, the reports come after */
enum { ASYNC_MAX = 4000, ASYNC_F = 32 };
static struct arec { int n, m; uintptr_t ours[ASYNC_F], bt[ASYNC_F]; } arecs[ASYNC_MAX];
static atomic_int nrecs;

NOINLINE void check_async(void)
{
    struct arec *a = &arecs[atomic_fetch_add(&nrecs, 1)];
    void *bt[ASYNC_F + 1];
    uintptr_t *fp = __builtin_frame_address(0);
    a->n = mml_unwind(fp[1], (uintptr_t)(fp + 2), fp[0], a->ours, ASYNC_F);
    a->m = backtrace(bt, ASYNC_F + 1) - 1;
    for (int i = 0; i < a->m; i++)
        a->bt[i] = (uintptr_t)bt[i + 1];
}

void on_usr2_async(int sig);
void on_usr2_async(int sig)
{
    (void)sig;
    if (atomic_load(&in_spin) && atomic_load(&async_left) > 0) {
        check_async();
        if (atomic_fetch_sub(&async_left, 1) == 1)
            atomic_store(&async_stop, 1);
    }
}

static void *async_killer(void *arg)
{
    (void)arg;
    while (!atomic_load(&async_stop)) {
        pthread_kill(async_target, SIGUSR2);
        usleep(100);
    }
    return NULL;
}

/* ---- PLT: an exact pc inside PLT entries ------------------------------------------------- */

static int first_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    *(uintptr_t *)data = info->dlpi_addr;
    return 1; /* the main program comes first */
}

/* the exe's section WANT, from its section headers */
static int find_section(const char *want, uintptr_t *addr, size_t *size)
{
    int fd = open("/proc/self/exe", O_RDONLY);
    if (fd < 0)
        return 0;
    Elf64_Ehdr eh;
    int ok = 0;
    if (pread(fd, &eh, sizeof eh, 0) == sizeof eh && eh.e_shentsize == sizeof(Elf64_Shdr)) {
        Elf64_Shdr *sh = calloc(eh.e_shnum, sizeof *sh);
        char *names = NULL;
        if (pread(fd, sh, sizeof *sh * eh.e_shnum, (off_t)eh.e_shoff) > 0) {
            names = calloc(1, sh[eh.e_shstrndx].sh_size + 1);
            if (pread(fd, names, sh[eh.e_shstrndx].sh_size, (off_t)sh[eh.e_shstrndx].sh_offset) > 0) {
                uintptr_t base = 0;
                dl_iterate_phdr(first_object, &base);
                for (int i = 0; i < eh.e_shnum; i++) {
                    if (!strcmp(names + sh[i].sh_name, want)) {
                        *addr = base + sh[i].sh_addr;
                        *size = sh[i].sh_size;
                        ok = 1;
                    }
                }
            }
        }
        free(names);
        free(sh);
    }
    close(fd);
    return ok;
}

/* A walk from an exact pc inside the PLT whose CFA is sp + cfa_off: the fake frame's return
 * address is this function's, so the walk must go on exactly as backtrace() from here. */
NOINLINE void plt_check(const char *site, uintptr_t pc, long cfa_off)
{
    uintptr_t ours[MAXF], expect[MAXF];
    void *bt[MAXF + 1];
    uintptr_t *fp = __builtin_frame_address(0);
    uintptr_t sp = (uintptr_t)(fp + 2) - (uintptr_t)cfa_off;
    int n = mml_unwind_exact(pc, sp, fp[0], ours, MAXF);
    int m = backtrace(bt, MAXF + 1);
    expect[0] = pc;
    for (int i = 1; i < m && i < MAXF; i++)
        expect[i] = (uintptr_t)bt[i];
    report(site, ours, n, expect, m < MAXF ? m : MAXF);
}

static void mode_plt(void)
{
    uintptr_t plt;
    size_t size;
    if (!find_section(".plt", &plt, &size) || size < 48) {
        printf("info plt: no .plt section\n");
        return;
    }
    const uint8_t *c = (const uint8_t *)plt;
    /* the classic lazy PLT: PLT0 = push GOT+8; jmp *GOT+16, entries = jmp *GOT; push n; jmp PLT0 */
    if (!(c[0] == 0xff && c[1] == 0x35 && c[6] == 0xff && c[7] == 0x25 && c[16] == 0xff &&
          c[17] == 0x25 && c[22] == 0x68 && c[27] == 0xe9)) {
        printf("info plt: not the classic layout\n");
        return;
    }
    size_t entries = size / 16 - 1;
    printf("info plt entries=%zu\n", entries);
    char site[64];
    for (int o = 0; o < 16; o++) {
        snprintf(site, sizeof site, "plt0+%d", o);
        plt_check(site, plt + (uintptr_t)o, o < 6 ? 16 : 24);
    }
    size_t which[2] = {1, entries};
    for (int w = 0; w < 2; w++) {
        for (int o = 0; o < 16; o++) {
            snprintf(site, sizeof site, "plt%zu+%d", w ? (size_t)2 : (size_t)1, o);
            plt_check(site, plt + which[w] * 16 + (uintptr_t)o, o < 11 ? 8 : 16);
        }
    }
    uintptr_t got;
    if (find_section(".plt.got", &got, &size) && size >= 8) {
        printf("info plt.got\n");
        for (int o = 0; o < 8; o++) {
            snprintf(site, sizeof site, "pltgot+%d", o);
            plt_check(site, got + (uintptr_t)o, 8);
        }
    }
}

/* A real PLT frame: the GOT page made unreadable, a call through the PLT faults on the entry's
 * first instruction (jmp *GOT); the SIGSEGV handler makes the page readable again (a raw
 * system call: the PLT, errno and globals may all be on that page) and walks through the
 * signal frame into the PLT entry, then into its caller. */
static long raw_mprotect(uintptr_t a, size_t n, int prot)
{
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(10L /* SYS_mprotect */), "D"(a), "S"(n), "d"((long)prot)
                     : "rcx", "r11", "memory");
    return ret;
}

static __thread uintptr_t got_lo, got_len, fault_addr; /* TLS: not on the GOT's pages */

void on_segv(int sig, siginfo_t *si, void *uc);
void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    raw_mprotect(got_lo, got_len, PROT_READ | PROT_WRITE);
    fault_addr = (uintptr_t)si->si_addr;
    check("plt-real");
}

NOINLINE void plt_fault(void)
{
    raw_mprotect(got_lo, got_len, PROT_NONE);
    sink += getppid() > 0; /* through the PLT: faults at the entry, resumes after the handler */
}

static void mode_pltreal(void)
{
    uintptr_t plt, got;
    size_t psize, gsize;
    if (!find_section(".plt", &plt, &psize) || !find_section(".got.plt", &got, &gsize)) {
        printf("info plt: no .plt or .got.plt section\n");
        return;
    }
    printf("info plt_lo=%lx plt_hi=%lx\n", (unsigned long)plt, (unsigned long)(plt + psize));
    struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
    sigaction(SIGSEGV, &sa, NULL);
    getppid(); /* bound now: the fault is then on reading the GOT entry, not in the resolver */
    got_lo = got & ~(uintptr_t)4095;
    got_len = ((got + gsize + 4095) & ~(uintptr_t)4095) - got_lo;
    plt_fault();
    printf("info fault_in_got=%d\n", fault_addr >= got && fault_addr < got + gsize);
}

/* ---- dlopen / dlclose: another library at the same address ------------------------------- */

static uintptr_t dl_ra, dl_base;
static void dl_cb(const char *site)
{
    uintptr_t v[4];
    uintptr_t *fp = __builtin_frame_address(0);
    mml_unwind(fp[1], (uintptr_t)(fp + 2), fp[0], v, 4);
    dl_ra = v[0]; /* the return address inside lib_inner */
    check(site);
}

static void mode_dl(const char *dir, int invalidate)
{
    const char *names[2] = {"libunwind_lib_a.so", "libunwind_lib_b.so"};
    for (int round = 0; round < 4; round++) {
        int w = round & 1;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[w]);
        void *h = dlopen(path, RTLD_NOW);
        if (!h) {
            printf("info dlopen failed: %s\n", dlerror());
            return;
        }
        void (*entry)(void (*)(const char *), const char *) = (void (*)(void (*)(const char *), const char *))dlsym(h, "lib_entry");
        Dl_info di;
        dladdr((void *)entry, &di);
        dl_base = (uintptr_t)di.dli_fbase;
        char site[32];
        snprintf(site, sizeof site, "dl-%c%d", "ab"[w], round);
        entry(dl_cb, site);
        printf("info dl %s base=%lx raoff=%lx\n", site, (unsigned long)dl_base,
               (unsigned long)(dl_ra - dl_base));
        if (invalidate)
            mml_unwind_dlclose_begin();
        dlclose(h);
        if (invalidate)
            mml_unwind_dlclose_end();
    }
}

/* ---- hostile stacks ---------------------------------------------------------------------- */

/* ours only (backtrace and printf may not fit): a walk from the caller, reported later */
static uintptr_t kept[32], kept_sp;
static int nkept;
NOINLINE void capture_only(void)
{
    uintptr_t *fp = __builtin_frame_address(0);
    kept_sp = (uintptr_t)fp;
    nkept = mml_unwind(fp[1], (uintptr_t)(fp + 2), fp[0], kept, 32);
}

#ifndef DEEP_MARGIN_TINY
#define DEEP_MARGIN_TINY 1536
#endif
static uintptr_t stack_low; /* lowest usable address of the current thread's stack */
static size_t deep_margin;

NOINLINE void deep(int d)
{
    volatile char buf[200];
    buf[0] = (char)d;
    if ((uintptr_t)__builtin_frame_address(0) > stack_low + deep_margin)
        deep(d + 1);
    else
        capture_only();
    sink += buf[0];
}

static void set_stack_low(void)
{
    pthread_attr_t a;
    void *addr;
    size_t size;
    pthread_getattr_np(pthread_self(), &a);
    pthread_attr_getstack(&a, &addr, &size);
    pthread_attr_destroy(&a);
    stack_low = (uintptr_t)addr;
}

void *tiny_thread(void *arg);
void *tiny_thread(void *arg)
{
    (void)arg;
    set_stack_low();
    /* the thread's first walk, with little stack left under it */
    deep_margin = DEEP_MARGIN_TINY;
    deep(0);
    printf("info tiny left=%ld\n", (long)(kept_sp - stack_low));
    report("tiny-bottom", kept, nkept, NULL, 0);
    f_small("tiny-shallow", 1);
    return NULL;
}

static void mode_tiny(void)
{
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, PTHREAD_STACK_MIN);
    pthread_t t;
    if (pthread_create(&t, &a, tiny_thread, NULL) != 0) {
        printf("info tiny: pthread_create failed\n");
        return;
    }
    pthread_join(t, NULL);
    printf("info tiny stacksize=%d\n", (int)PTHREAD_STACK_MIN);
}

static void *deep_thread(void *arg)
{
    (void)arg;
    set_stack_low();
    deep_margin = 4096;
    deep(0);
    printf("info deep-thread left=%ld\n", (long)(kept_sp - stack_low));
    report("deep-thread", kept, nkept, NULL, 0);
    return NULL;
}

static void mode_deep(void)
{
    /* the initial thread: down to 256 KiB above the stack limit (the stack grows on the way) */
    struct rlimit rl;
    getrlimit(RLIMIT_STACK, &rl);
    size_t lim = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (64UL << 20) ? 64UL << 20 : rl.rlim_cur;
    uintptr_t top = (uintptr_t)__builtin_frame_address(0);
    stack_low = top - lim + (256UL << 10);
    deep_margin = 0;
    deep(0);
    printf("info deep-main depth=%ld\n", (long)(top - kept_sp));
    report("deep-main", kept, nkept, NULL, 0);
    /* a thread: 8 KiB above its guard page */
    pthread_t t;
    pthread_create(&t, NULL, deep_thread, NULL);
    pthread_join(t, NULL);
}

/* makecontext/swapcontext coroutines on heap and mmap stacks */
static ucontext_t uc_main, uc_co;
void coroutine(void);
void coroutine(void)
{
    f_small("uc-1", 2);
    swapcontext(&uc_co, &uc_main);
    f_small("uc-2", 0);
}

static void run_coroutine(void *stack, size_t size, const char *tag)
{
    printf("info uc %s\n", tag);
    getcontext(&uc_co);
    uc_co.uc_stack.ss_sp = stack;
    uc_co.uc_stack.ss_size = size;
    uc_co.uc_link = &uc_main;
    makecontext(&uc_co, coroutine, 0);
    swapcontext(&uc_main, &uc_co); /* runs up to the first swap */
    swapcontext(&uc_main, &uc_co); /* runs to the end, back through uc_link */
}

static void mode_ucontext(void)
{
    size_t size = 64 << 10;
    void *heap = malloc(size);
    run_coroutine(heap, size, "malloc");
    free(heap);
    char *m = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(m, 4096, PROT_NONE); /* guard page below */
    run_coroutine(m + 4096, size, "mmap");
    munmap(m, size + 4096);
}

/* signal handlers on an alternate stack */
void on_alt(int sig);
void on_alt(int sig)
{
    (void)sig;
    leaf("altstack");
}

void *alt_thread(void *arg);
void *alt_thread(void *arg)
{
    (void)arg;
    stack_t ss = {.ss_sp = malloc(64 << 10), .ss_size = 64 << 10};
    sigaltstack(&ss, NULL);
    raise_in_chain(1); /* this thread's first walk is on the alternate stack */
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, NULL);
    return NULL;
}

static void mode_altstack(void)
{
    struct sigaction sa = {.sa_handler = on_alt, .sa_flags = SA_ONSTACK};
    sigaction(SIGUSR1, &sa, NULL);
    pthread_t t;
    pthread_create(&t, NULL, alt_thread, NULL);
    pthread_join(t, NULL);
    stack_t ss = {.ss_sp = malloc(64 << 10), .ss_size = 64 << 10};
    sigaltstack(&ss, NULL);
    raise_in_chain(2);
    raise_in_chain(0);
}

/* nonsense start states: exact results, no fault */
static void garbage(const char *name, uintptr_t ip, uintptr_t sp, uintptr_t bp, int max)
{
    uintptr_t out[8] = {0};
    int n = mml_unwind(ip, sp, bp, out, max);
    printf("garbage %s n=%d", name, n);
    for (int i = 0; i < n; i++)
        printf(" %lx", (unsigned long)out[i]);
    printf("\n");
}

static uintptr_t ra_leaf, ra_vla;
NOINLINE void note_ra(void) { ra_leaf = (uintptr_t)__builtin_return_address(0); }
NOINLINE void vla_ra(int n) /* rbp-based CFA */
{
    volatile char buf[n];
    buf[0] = 0;
    note_ra();
    ra_vla = ra_leaf;
    sink += buf[0];
}
NOINLINE void rsp_ra(void) /* rsp-based CFA (without frame pointers) */
{
    volatile char buf[64];
    buf[0] = 0;
    note_ra();
    sink += buf[0];
}

static void mode_garbage(void)
{
    rsp_ra();
    uintptr_t ra_rsp = ra_leaf;
    vla_ra(10);
    printf("info ra_rsp=%lx ra_vla=%lx\n", (unsigned long)ra_rsp, (unsigned long)ra_vla);
    garbage("max0", ra_rsp, 0, 0, 0);
    garbage("null-sp", ra_rsp, 0, 0, 8);
    garbage("high-sp", ra_rsp, 0x7ffffffff000UL - 64, 0, 8);
    garbage("kernel-sp", ra_rsp, 0xffffffffff600000UL, 0, 8);
    garbage("null-ip", 0, (uintptr_t)__builtin_frame_address(0), 0, 8);
    garbage("data-ip", (uintptr_t)&sink + 1, (uintptr_t)__builtin_frame_address(0), 0, 8);
    /* a heap block full of a constant: one step, then no object at that address */
    uintptr_t *heap = malloc(1 << 16);
    for (size_t i = 0; i < (1 << 16) / 8; i++)
        heap[i] = 0x1111111111111111UL;
    garbage("heap-const", ra_rsp, (uintptr_t)(heap + 16), (uintptr_t)(heap + 16), 8);
    /* rbp-based rule with rbp below sp / pointing at the heap block */
    garbage("bad-rbp", ra_vla, (uintptr_t)__builtin_frame_address(0), 0x5a5a5a5a5a5a5a5aUL, 8);
    garbage("heap-rbp", ra_vla, (uintptr_t)(heap + 16), (uintptr_t)(heap + 16), 8);
    free(heap);
    /* the last bytes of a mapping followed by a hole: the read of the return address fails */
    char *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(m + 4096, 4096);
    memset(m, 0x22, 4096);
    garbage("edge", ra_rsp, (uintptr_t)m + 4096 - 16, 0, 8);
    /* a PROT_NONE page above */
    char *g = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(g + 4096, 4096, PROT_NONE);
    memset(g, 0x22, 4096);
    garbage("guard", ra_rsp, (uintptr_t)g + 4096 - 16, 0, 8);
    munmap(m, 4096);
    munmap(g, 8192);
}

/* ---- threads and fork -------------------------------------------------------------------- */

static atomic_int stop_churn;
static void *churn(void *arg) /* empties the cache all the time, as a dlclose would */
{
    (void)arg;
    while (!atomic_load(&stop_churn)) {
        mml_unwind_dlclose_begin();
        mml_unwind_dlclose_end();
        usleep(50);
    }
    return NULL;
}

static void *chain_thread(void *arg)
{
    for (int i = 0; i < (int)(intptr_t)arg; i++)
        run_chains();
    return NULL;
}

static void mode_threads(void)
{
    quiet = 1;
    pthread_t t[4], c;
    int iters = 40;
    pthread_create(&c, NULL, churn, NULL);
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, chain_thread, (void *)(intptr_t)iters);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    atomic_store(&stop_churn, 1);
    pthread_join(c, NULL);
    printf("threads captures=%d mismatches=%d\n", atomic_load(&captures), atomic_load(&mismatches));
}

void mode_fork(void);
void mode_fork(void)
{
    run_chains();
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        mml_unwind_fork_child();
        f_small("child-small", 2);
        f_vla("child-vla", 50);
        f_realign("child-realign", 50);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    printf("info child status=%d\n", st);
}

/* ---- main -------------------------------------------------------------------------------- */

#ifdef MML_UNWIND_TESTING
static void print_kinds(void)
{
    long k[8];
    mml_unwind_test_kinds(k);
    printf("kinds rsp=%ld rbp=%ld drap=%ld signal=%ld stop=%ld uncached=%ld bderef=%ld blost=%ld\n",
           k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]);
}
#else
static void print_kinds(void) {}
#endif

/* The modes that take no argument and need nothing set up in main. */
static const struct {
    const char *name;
    void (*run)(void);
} plain_modes[] = {
    {"threads", mode_threads}, {"fork", mode_fork}, {"plt", mode_plt},
    {"pltreal", mode_pltreal}, {"tiny", mode_tiny}, {"deep", mode_deep},
    {"ucontext", mode_ucontext}, {"altstack", mode_altstack}, {"garbage", mode_garbage},
};

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "chains";
    void *warm[4];
    backtrace(warm, 4); /* loads libgcc_s */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* glibc's __restore_rt, the return address of every signal handler */
    struct sigaction probe = {.sa_handler = SIG_IGN}, old, restorer;
    sigaction(SIGURG, &probe, &old);
    sigaction(SIGURG, &old, &restorer);
    printf("info restorer=%lx\n", (unsigned long)(uintptr_t)restorer.sa_restorer);
    if (!strcmp(mode, "chains")) {
        run_chains(); /* rules computed */
        run_chains(); /* rules from the cache */
    } else if (!strcmp(mode, "signal")) {
        struct sigaction sa = {.sa_handler = on_usr1};
        sigaction(SIGUSR1, &sa, NULL);
        raise_in_chain(3);
        raise_in_chain(3);
    } else if (!strcmp(mode, "async")) {
        struct sigaction sa = {.sa_handler = on_usr2_async};
        sigaction(SIGUSR2, &sa, NULL);
        async_target = pthread_self();
        atomic_store(&async_left, argc > 2 ? atoi(argv[2]) : 1000);
        if (atomic_load(&async_left) > ASYNC_MAX)
            atomic_store(&async_left, ASYNC_MAX);
        pthread_t k;
        pthread_create(&k, NULL, async_killer, NULL);
        spin();
        pthread_join(k, NULL);
        for (int i = 0; i < atomic_load(&nrecs); i++)
            report("async", arecs[i].ours, arecs[i].n, arecs[i].bt, arecs[i].m);
    } else if (!strcmp(mode, "nocfi")) {
        nocfi_call(nocfi_cb);
        notables_call(notables_cb);
        printf("info nocfi_call=%lx nocfi_call_end=%lx\n", (unsigned long)(uintptr_t)nocfi_call,
               (unsigned long)(uintptr_t)nocfi_call_end);
    } else if (!strcmp(mode, "dl") || !strcmp(mode, "dl-noinval")) {
        mode_dl(argc > 2 ? argv[2] : ".", !strcmp(mode, "dl"));
    } else {
        size_t i = 0;
        while (i < sizeof plain_modes / sizeof *plain_modes && strcmp(mode, plain_modes[i].name))
            i++;
        if (i == sizeof plain_modes / sizeof *plain_modes) {
            fprintf(stderr, "unknown mode %s\n", mode);
            return 2;
        }
        plain_modes[i].run();
    }
    print_kinds();
    printf("end %s\n", mode);
    return 0;
}
