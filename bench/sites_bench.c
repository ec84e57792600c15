/* One function calling an allocation wrapper from many call sites, for the cost of recording
 * stacks (bench/run.py, section stacks, row "d sites").
 *
 * A program's wrapper (xmalloc, zmalloc, g_malloc) is often called from several call sites
 * of one function: a constructor filling its fields, a parser's cases.  Every such path has
 * the same start (the wrapper's frame, at the same stack pointer) and differs only in the
 * return address one frame up, which the memo of walks (tracer/memo.c, memo_set1) must take
 * into its choice of set: without it the paths share four records and are walked again at
 * every allocation (docs/performance-stacks.rst, the tenth pass of issue 21: 475 against 1,700
 * instructions per event with 16 sites; the eleventh pass: a start with a third walk is
 * moved to such a second set).  stacks_bench has no such shape: each of its
 * functions allocates from one call site.
 *
 *   sites_bench [-n STEPS] [-s SITES]
 * One step: one call of site() with a random case of SITES (1 to 16), which calls xmalloc
 * from that case's call site, then a free of the block that was in a random one of 1000
 * slots: two events.  Single thread.  Prints sites, steps, events, seconds and ns per event
 * of the loop (wall clock, without process start and exit). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "numopts.h"

#define NOINLINE __attribute__((noinline))
#define SLOTS 1000

static void *slot[SLOTS];
static uint64_t rng = 0x2545F4914F6CDD1Dull;

static inline uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* the program's wrapper: the block's caller is its caller */
static NOINLINE void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

/* sixteen call sites of xmalloc in one function: the same frame, the same stack pointer */
#define CASE(K)                                                                              \
    case K:                                                                                  \
        p = xmalloc(16 + (K) * 24);                                                          \
        break;
static NOINLINE void *site(unsigned k)
{
    void *p = NULL;
    switch (k) {
        CASE(0) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7)
        CASE(8) CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15)
    }
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

int main(int argc, char **argv)
{
    long steps = 1000000, nsites = 16;
    const struct numopt opts[] = {{'n', &steps}, {'s', &nsites}};
    if (!numopts(argc, argv, opts, 2, "usage: sites_bench [-n STEPS] [-s SITES]"))
        return 2;
    if (nsites < 1 || nsites > 16 || steps < 0)
        return 2;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < steps; i++) {
        uint64_t x = next();
        void *p = site((unsigned)((x >> 11) % (uint64_t)nsites));
        *(volatile char *)p = (char)x;
        unsigned s = (unsigned)((x >> 40) % SLOTS);
        free(slot[s]);
        slot[s] = p;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int i = 0; i < SLOTS; i++)
        free(slot[i]);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    long events = 2L * steps;
    printf("sites=%ld steps=%ld events=%ld seconds=%.4f ns_per_event=%.2f\n", nsites, steps,
           events, s, events ? s * 1e9 / (double)events : 0.0);
    return 0;
}
