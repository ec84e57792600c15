/* Allocation microbenchmark: random 16-512 B blocks in a table of 1000 live slots.
 * Each step frees the block in a random slot and puts a new one there: one malloc and one
 * free per step, two events.  With -t 2, two threads share the table (a slot is claimed with
 * an atomic exchange), so about half of the frees release a block the other thread made.
 *
 *   alloc_bench [-t THREADS] [-n STEPS_PER_THREAD] [-r NEST]
 * -r NEST runs the loop NEST extra (non-inlined) call frames deep, so that a tracer recording
 * several return addresses per allocation (MMLEAK_DEPTH) has that many frames to walk.
 * prints: threads, steps, events, seconds, ns per event (wall clock of the whole run).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "numopts.h"

#define SLOTS 1000
static _Atomic(void *) slots[SLOTS];
static long steps = 2000000;
static int nest = 0;

static void *loop(void *arg)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (uintptr_t)(1 + (intptr_t)arg);
    for (long i = 0; i < steps; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;          /* xorshift64 */
        size_t size = 16 + (x >> 40) % 497;               /* 16..512 bytes */
        unsigned slot = (unsigned)((x >> 20) % SLOTS);
        void *p = malloc(size);
        if (!p) abort();
        *(volatile char *)p = 1;
        free(atomic_exchange_explicit(&slots[slot], p, memory_order_acq_rel));
    }
    return NULL;
}

/* Recurse NEST times before running the loop; the asm keeps each frame real (no tail call). */
__attribute__((noinline)) static void *deeper(void *arg, int n)
{
    void *r = n > 0 ? deeper(arg, n - 1) : loop(arg);
    __asm__ volatile("" : : "r"(r) : "memory");
    return r;
}

static void *worker(void *arg) { return deeper(arg, nest); }

int main(int argc, char **argv)
{
    long threads = 1, nest_opt = 0;
    const struct numopt opts[] = {{'t', &threads}, {'n', &steps}, {'r', &nest_opt}};
    if (!numopts(argc, argv, opts, 3, "usage: alloc_bench [-t THREADS] [-n STEPS] [-r NEST]"))
        return 2;
    if (threads < 1 || threads > 64 || nest_opt < 0 || nest_opt > 10000)
        return 2;
    nest = (int)nest_opt;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pthread_t tid[64];
    for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int i = 0; i < SLOTS; i++) free(slots[i]);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    long events = 2L * steps * threads;
    printf("threads=%ld steps=%ld events=%ld seconds=%.4f ns_per_event=%.2f\n",
           threads, steps, events, s, s * 1e9 / (double)events);
    return 0;
}
