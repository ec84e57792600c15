/* tests/test_stacks.py: the memo's shortcut (a memo record stamped with the thread's set of
 * the stacks its file holds) must end with the file.  16 functions, each with its own malloc
 * call: a step walks a path of 2 to 6 of them chosen by the digits of one of 512 path numbers
 * drawn at random (fixed seed), so the thread's recent walks seldom hit and the memo serves
 * most lookups; STEPS steps in the main thread, then as many in a second thread.  With
 * MMLEAK_ROTATE_MB=1 each thread goes through several files, and every file must define
 * every stack it references.  Prints "steps N" (the program's allocations) at the end. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))
#define STEPS 200000
#define PATHS 512

static void *volatile sink;
typedef void (*node_fn)(uint64_t path, int level);
static node_fn node[16];

#define NODE(K)                                                                               \
    NOINLINE static void node##K(uint64_t path, int level)                                   \
    {                                                                                         \
        if (level > 0) {                                                                      \
            node[path & 15](path >> 4, level - 1);                                            \
        } else {                                                                              \
            void *p = malloc(16 + K);                                                         \
            sink = p;                                                                         \
            free(p);                                                                          \
        }                                                                                     \
        __asm__ volatile("" ::: "memory");                                                    \
    }
NODE(0) NODE(1) NODE(2) NODE(3) NODE(4) NODE(5) NODE(6) NODE(7)
NODE(8) NODE(9) NODE(10) NODE(11) NODE(12) NODE(13) NODE(14) NODE(15)

static uint64_t next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static uint64_t paths[PATHS];

NOINLINE static void *run(void *arg)
{
    (void)arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < STEPS; i++) {
        uint64_t p = paths[next(&rng) % PATHS];
        node[p & 15](p >> 4, 1 + (int)(p >> 60) % 5);
    }
    return NULL;
}

int main(void)
{
    node_fn all[16] = { node0, node1, node2, node3, node4, node5, node6, node7,
                        node8, node9, node10, node11, node12, node13, node14, node15 };
    for (int k = 0; k < 16; k++)
        node[k] = all[k];
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (int k = 0; k < PATHS; k++)
        paths[k] = next(&rng);
    run(NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, run, NULL) || pthread_join(t, NULL))
        return 1;
    printf("steps %d\n", 2 * STEPS);
    return 0;
}
