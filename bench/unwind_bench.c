/* Cost of capturing a stack: tracer/unwind.c against glibc's backtrace(), libunwind's
 * unw_backtrace() (when built with -DHAVE_LIBUNWIND) and a frame-pointer walk.
 *
 *     unwind_bench [RUNS]
 *
 * chain12: 16 frames captured at the bottom of a chain of 12 functions compiled -O2
 * -fomit-frame-pointer (bench/unwind_chain.c; the frame-pointer walk runs on a copy compiled
 * with frame pointers), warm: the same stack again and again.  ns per capture, one line per
 * method and run (RUNS runs, default 7; bench/run.py takes the medians).
 *
 * tree: 4096 distinct call paths 8-20 deep through 4096 distinct return addresses
 * (bench/unwind_tree.c), each path captured once per pass (at most 16 frames); the cost of the
 * descent itself (measured with an empty capture) is subtracted.  For mmleak-unwind: "cold" is
 * the first pass after its cache was emptied (every rule computed), "warm" later passes; the
 * other methods are measured warm (after a pass not counted).  Warm figures and the descent
 * are averaged over 8 passes (glibc: 2).
 *
 * This file is compiled with frame pointers (-O2 -fno-omit-frame-pointer): its functions are
 * the top four of the sixteen frames; the chain is where the twelve others are. */
#define _GNU_SOURCE
#include "../tracer/unwind.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef HAVE_LIBUNWIND
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#endif

#define NOINLINE __attribute__((noinline))
#define DEPTH 16

typedef long (*chain_cb)(void);
long chain_nofp(chain_cb cb);
long chain_fp(chain_cb cb);
void tree_init(void);
long tree_run(unsigned long path, int depth);
long tree_leaf(void);

static int (*glibc_backtrace)(void **, int); /* from libc itself: libunwind exports one too */
static long iters;
static volatile long vsink;
static uintptr_t stack_top;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* ---- one capture of DEPTH frames from the caller of the cap_* function ------------------- */

static NOINLINE long cap_ours(void)
{
    uintptr_t buf[DEPTH];
    return MML_UNWIND_CALLER(buf, DEPTH);
}

static NOINLINE long cap_ours_ra(void) /* how the tracer may call it: from the entry's ra */
{
    uintptr_t buf[DEPTH];
    return mml_unwind_from_ra(__builtin_return_address(0), buf, DEPTH);
}

static NOINLINE long cap_glibc(void)
{
    void *buf[DEPTH + 1];
    return glibc_backtrace(buf, DEPTH + 1) - 1; /* its first entry is in cap_glibc */
}

#ifdef HAVE_LIBUNWIND
static NOINLINE long cap_libunwind(void)
{
    void *buf[DEPTH + 1];
    return unw_backtrace(buf, DEPTH + 1) - 1;
}
#endif

static NOINLINE long cap_fp(void) /* every frame here has a frame pointer, libc's excepted */
{
    uintptr_t buf[DEPTH];
    uintptr_t *fp = __builtin_frame_address(0);
    int n = 0;
    while (n < DEPTH) {
        buf[n++] = fp[1];
        uintptr_t *next = (uintptr_t *)fp[0];
        if (next <= fp || (uintptr_t)next >= stack_top)
            break;
        fp = next;
    }
    vsink += (long)buf[n - 1];
    return n;
}

static NOINLINE long cap_none(void) { return 0; }

static long (*cap)(void);
static long frames_seen;

/* the bottom of the chain: ITERS captures */
static NOINLINE long chain_bottom(void)
{
    long n = 0;
    for (long i = 0; i < iters; i++)
        n = cap();
    frames_seen = n;
    return n;
}

struct method {
    const char *name;
    long (*cap)(void);
    int fp; /* walks the frame-pointer copy of the chain */
};

static struct method methods[] = {
    {"glibc backtrace", cap_glibc, 0},
#ifdef HAVE_LIBUNWIND
    {"libunwind unw_backtrace", cap_libunwind, 0},
#endif
    {"mmleak-unwind", cap_ours, 0},
    {"mmleak-unwind from_ra", cap_ours_ra, 0},
    {"frame-pointer walk", cap_fp, 1},
};
#define NMETHODS (sizeof methods / sizeof methods[0])

static NOINLINE void bench_chain(int runs)
{
    for (int r = 0; r < runs; r++) {
        for (size_t m = 0; m < NMETHODS; m++) { /* interleaved: load hits all methods alike */
            cap = methods[m].cap;
            long (*chain)(chain_cb) = methods[m].fp ? chain_fp : chain_nofp;
            /* as many iterations as take about 30 ms */
            iters = 200;
            double t0 = now();
            chain(chain_bottom);
            double one = (now() - t0) / (double)iters;
            iters = (long)(3e7 / (one > 1 ? one : 1));
            if (iters < 1000)
                iters = 1000;
            t0 = now();
            chain(chain_bottom);
            double ns = (now() - t0) / (double)iters;
            printf("chain12 method=\"%s\" run=%d ns=%.2f frames=%ld iters=%ld\n", methods[m].name,
                   r, ns, frames_seen, iters);
        }
    }
}

/* ---- many distinct stacks ---------------------------------------------------------------- */

enum { PATHS = 4096 };
static unsigned long paths[PATHS];
static int depths[PATHS];
static long tree_frames;

long tree_leaf(void)
{
    long n = cap();
    tree_frames += n;
    return n;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* REPS passes over all paths: ns per path */
static NOINLINE double tree_pass(long (*c)(void), int reps)
{
    cap = c;
    tree_frames = 0;
    double t0 = now();
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < PATHS; i++)
            vsink += tree_run(paths[i], depths[i]);
    tree_frames /= reps;
    return (now() - t0) / PATHS / reps;
}

/* distinct return addresses over all paths (a capture of everything, checked once) */
static uintptr_t seen[1 << 16];
static long distinct;
static NOINLINE long cap_count(void)
{
    uintptr_t buf[DEPTH];
    int n = MML_UNWIND_CALLER(buf, DEPTH);
    for (int i = 0; i < n; i++) {
        uint64_t h = (buf[i] * 0x9E3779B97F4A7C15ULL) >> 48;
        while (seen[h] && seen[h] != buf[i])
            h = (h + 1) & 0xffff;
        if (!seen[h]) {
            seen[h] = buf[i];
            distinct++;
        }
    }
    return n;
}

static NOINLINE void bench_tree(int runs)
{
    tree_init();
    uint64_t s = 42;
    for (int i = 0; i < PATHS; i++) {
        paths[i] = splitmix(&s);
        depths[i] = 8 + (int)(paths[i] >> 59) % 13;
    }
    tree_pass(cap_count, 1);
    printf("tree paths=%d distinct_return_addresses=%ld\n", PATHS, distinct);
    /* warm-up, not counted: libgcc's and libunwind's own caches (which cannot be emptied from
     * here) are then warm as well */
    tree_pass(cap_glibc, 1);
#ifdef HAVE_LIBUNWIND
    tree_pass(cap_libunwind, 1);
#endif
    for (int r = 0; r < runs; r++) {
        double base = tree_pass(cap_none, 8);
        mml_unwind_dlclose_begin(); /* empties the cache, as a dlclose does */
        mml_unwind_dlclose_end();
        double cold = tree_pass(cap_ours, 1);
        double fr = (double)tree_frames / PATHS;
        double warm = tree_pass(cap_ours, 8);
        double bt = tree_pass(cap_glibc, 2);
        printf("tree method=\"mmleak-unwind cold\" run=%d ns=%.2f frames=%.1f\n", r, cold - base, fr);
        printf("tree method=\"mmleak-unwind warm\" run=%d ns=%.2f frames=%.1f\n", r, warm - base, fr);
        printf("tree method=\"glibc backtrace\" run=%d ns=%.2f frames=%.1f\n", r, bt - base,
               (double)tree_frames / PATHS - 1);
#ifdef HAVE_LIBUNWIND
        double lu = tree_pass(cap_libunwind, 8);
        printf("tree method=\"libunwind unw_backtrace\" run=%d ns=%.2f frames=%.1f\n", r,
               lu - base, (double)tree_frames / PATHS - 1);
#endif
        printf("tree method=\"(descent, subtracted)\" run=%d ns=%.2f\n", r, base);
    }
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 7;
    stack_top = (uintptr_t)__builtin_frame_address(0) + 4096;
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    glibc_backtrace = (int (*)(void **, int))dlsym(libc, "backtrace");
    Dl_info di;
    if (!glibc_backtrace || !dladdr((void *)glibc_backtrace, &di) || !strstr(di.dli_fname, "libc.so")) {
        fprintf(stderr, "unwind_bench: glibc's backtrace not found\n");
        return 1;
    }
    mml_unwind_thread_init();
    void *warm[4];
    glibc_backtrace(warm, 4); /* loads libgcc_s */
    bench_chain(runs);
    bench_tree(runs);
    return 0;
}
