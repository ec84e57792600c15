/* Many distinct call stacks, for the cost of recording stacks (bench/run.py, section stacks).
 *
 * 256 small noinline functions; each one, when it is not at the bottom, calls one of 16
 * others chosen by a 4-bit digit of the path number (16 call sites per function), and at the
 * bottom allocates a block and frees an older one itself (256 malloc call sites, 256 free
 * call sites).  A path number and a depth (8 to 20 calls) make one call path; PATHS of them
 * are drawn from a fixed seed, and every step walks one of them, chosen at random (fixed
 * seed too): thousands of distinct stacks, 8-20 frames of this file deep, each met again and
 * again, as in a program with many call sites.  Frames of different sizes, no frame
 * pointers needed (build -O2 -fomit-frame-pointer): a stack can only be walked with the
 * DWARF CFI.
 *
 *   stacks_bench [-n STEPS] [-p PATHS]
 * One step: one walk down, one malloc of 16-512 bytes and one free (of the block that was
 * in a random one of 1000 slots): two events.  Single thread.  Prints paths, steps, events,
 * seconds and ns per event of the loop (wall clock, without process start and exit). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "numopts.h"

#define NOINLINE __attribute__((noinline))
#define SLOTS 1000

typedef long (*node_fn)(uint64_t path, int level);
static node_fn node[256];
static void *slot[SLOTS];
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static volatile long sink;

static inline uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The work at the bottom of a path, inlined into each node: its own malloc and free calls. */
#define LEAF_WORK                                                                            \
    do {                                                                                     \
        uint64_t x = next();                                                                 \
        void *p = malloc(16 + (x >> 40) % 497);                                              \
        if (!p)                                                                              \
            abort();                                                                         \
        *(volatile char *)p = (char)x;                                                       \
        unsigned s = (unsigned)((x >> 20) % SLOTS);                                          \
        free(slot[s]);                                                                       \
        slot[s] = p;                                                                         \
    } while (0)

/* Node I, call site K: the child is a fixed function of (I, K); the addition after the call
 * keeps it a real call (no tail call), so every level is a frame on the stack. */
#define SITE(I, K)                                                                           \
    case K:                                                                                  \
        return node[((I) * 37 + (K) * 101 + 11) & 255](path, level - 1) + (K) + sink;
#define SITES(I)                                                                             \
    SITE(I, 0) SITE(I, 1) SITE(I, 2) SITE(I, 3) SITE(I, 4) SITE(I, 5) SITE(I, 6) SITE(I, 7)  \
    SITE(I, 8) SITE(I, 9) SITE(I, 10) SITE(I, 11) SITE(I, 12) SITE(I, 13) SITE(I, 14)        \
    SITE(I, 15)
/* Node number I = (G - 1) * 16 + K, named node_g<G>_<K>. */
#define NAME(G, K) node_g##G##_##K
#define NODEGK(G, K) NODEX(NAME(G, K), ((G) - 1) * 16 + (K))
#define NODEX(FN, I)                                                                         \
    static NOINLINE long FN(uint64_t path, int level)                                        \
    {                                                                                        \
        volatile char frame[8 + ((I) % 7) * 24];                                             \
        frame[0] = (char)level;                                                              \
        if (level <= 0) {                                                                    \
            LEAF_WORK;                                                                       \
            return frame[0];                                                                 \
        }                                                                                    \
        switch ((path >> ((level & 15) * 4)) & 15) { SITES(I) }                              \
        return frame[0];                                                                     \
    }
#define GROUP(G)                                                                             \
    NODEGK(G, 0) NODEGK(G, 1) NODEGK(G, 2) NODEGK(G, 3) NODEGK(G, 4) NODEGK(G, 5)            \
    NODEGK(G, 6) NODEGK(G, 7) NODEGK(G, 8) NODEGK(G, 9) NODEGK(G, 10) NODEGK(G, 11)          \
    NODEGK(G, 12) NODEGK(G, 13) NODEGK(G, 14) NODEGK(G, 15)
GROUP(1) GROUP(2) GROUP(3) GROUP(4) GROUP(5) GROUP(6) GROUP(7) GROUP(8) GROUP(9) GROUP(10)
GROUP(11) GROUP(12) GROUP(13) GROUP(14) GROUP(15) GROUP(16)
#define TAB(G)                                                                               \
    NAME(G, 0), NAME(G, 1), NAME(G, 2), NAME(G, 3), NAME(G, 4), NAME(G, 5), NAME(G, 6),      \
    NAME(G, 7), NAME(G, 8), NAME(G, 9), NAME(G, 10), NAME(G, 11), NAME(G, 12), NAME(G, 13),  \
    NAME(G, 14), NAME(G, 15)
static const node_fn all_nodes[256] = {TAB(1), TAB(2), TAB(3), TAB(4), TAB(5), TAB(6),
                                       TAB(7), TAB(8), TAB(9), TAB(10), TAB(11), TAB(12),
                                       TAB(13), TAB(14), TAB(15), TAB(16)};

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static NOINLINE long walk(uint64_t path, int depth)
{
    return node[path & 255](path, depth - 1) + sink;
}

int main(int argc, char **argv)
{
    long steps = 1000000, npaths = 4096;
    const struct numopt opts[] = {{'n', &steps}, {'p', &npaths}};
    if (!numopts(argc, argv, opts, 2, "usage: stacks_bench [-n STEPS] [-p PATHS]"))
        return 2;
    if (npaths < 1 || npaths > 1 << 24)
        return 2;
    for (int i = 0; i < 256; i++)
        node[i] = all_nodes[i];
    uint64_t *paths = malloc(sizeof *paths * (size_t)npaths);
    int *depth = malloc(sizeof *depth * (size_t)npaths);
    if (!paths || !depth)
        return 1;
    uint64_t seed = 20251123;
    for (int i = 0; i < npaths; i++) {
        paths[i] = splitmix(&seed);
        depth[i] = 8 + (int)(splitmix(&seed) % 13);          /* 8..20 calls deep */
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long acc = 0;
    for (long i = 0; i < steps; i++) {
        int k = (int)((next() >> 11) % (uint64_t)npaths);
        acc += walk(paths[k], depth[k]);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    sink = acc;
    for (int i = 0; i < SLOTS; i++)
        free(slot[i]);
    free(paths);
    free(depth);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    long events = 2L * steps;
    printf("paths=%ld steps=%ld events=%ld seconds=%.4f ns_per_event=%.2f\n", npaths, steps,
           events, s, s * 1e9 / (double)events);
    return 0;
}
