/* A process to attach to (bench/run.py, section attach): a big heap and busy threads.
 *
 *   attach_target [-m HEAP_MB] [-b BLOCK] [-t THREADS] [-r PAIRS/s per thread, 0: no limit]
 *
 * First allocates HEAP_MB MiB in blocks of BLOCK bytes (default 1024 MiB in 1 KiB blocks:
 * 1,048,576 blocks, kept alive until the end), then starts THREADS threads (default 8) that
 * allocate and free 16-512 byte blocks (each thread in its own table of 256 slots: one malloc
 * and one free per pair), at RATE pairs per second each (default 125000; 0: as fast as they
 * can), and says "ready blocks=N".  The main thread then sleeps in read() on stdin (so that an
 * injector finds a thread in a system call) and answers each line:
 *   s   "stats events=E cpu=C wall=W": events (mallocs and frees) made by the threads so far
 *       (counted per 64 pairs), the process's CPU time (user + system, all threads) and a
 *       monotonic clock, in seconds; the difference of two answers gives the cost per event
 *       from outside
 *   q   stop the threads and exit (the big heap is not freed) */
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

#define SLOTS 256
#define MAXT 64

struct counter {
    _Atomic long pairs;
    char pad[64 - sizeof(long)];
} __attribute__((aligned(64)));

static struct counter done[MAXT];
static long rate = 125000;
static atomic_int stop;

static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *churn(void *arg)
{
    long id = (long)arg;
    void *slot[SLOTS] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
    double t0 = clock_s(CLOCK_MONOTONIC);
    long i = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int k = 0; k < 64; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            void *p = malloc(16 + (x >> 40) % 497);
            if (!p)
                abort();
            *(volatile char *)p = 1;
            unsigned s = (unsigned)(x >> 20) % SLOTS;
            free(slot[s]);
            slot[s] = p;
        }
        i += 64;
        atomic_store_explicit(&done[id].pairs, i, memory_order_relaxed);
        if (rate && (i & 1023) == 0) {
            double d = t0 + (double)i / (double)rate - clock_s(CLOCK_MONOTONIC);
            if (d > 0) {
                struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
                nanosleep(&ts, NULL);
            }
        }
    }
    for (int s = 0; s < SLOTS; s++)
        free(slot[s]);
    return NULL;
}

int main(int argc, char **argv)
{
    long heap_mb = 1024, block = 1024, threads = 8;
    const struct numopt opts[] = {{'m', &heap_mb}, {'b', &block}, {'t', &threads}, {'r', &rate}};
    if (!numopts(argc, argv, opts, 4,
                 "usage: attach_target [-m HEAP_MB] [-b BLOCK] [-t THREADS] [-r RATE]"))
        return 2;
    if (threads < 1 || threads > MAXT || block < 1 || heap_mb < 0)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    long nblocks = heap_mb * 1024 * 1024 / block;
    void **heap = malloc(sizeof *heap * (size_t)(nblocks ? nblocks : 1));
    if (!heap)
        return 1;
    for (long i = 0; i < nblocks; i++) {
        heap[i] = malloc((size_t)block);
        if (!heap[i])
            return 1;
        memset(heap[i], (int)i, 16);
    }
    pthread_t tid[MAXT];
    for (long i = 0; i < threads; i++)
        pthread_create(&tid[i], NULL, churn, (void *)i);
    printf("ready blocks=%ld\n", nblocks);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 's') {
            long pairs = 0;
            for (long i = 0; i < threads; i++)
                pairs += atomic_load_explicit(&done[i].pairs, memory_order_relaxed);
            printf("stats events=%ld cpu=%.6f wall=%.6f\n", 2 * pairs,
                   clock_s(CLOCK_PROCESS_CPUTIME_ID), clock_s(CLOCK_MONOTONIC));
        } else if (line[0] == 'q') {
            break;
        }
    }
    atomic_store(&stop, 1);
    for (long i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    printf("bye\n");
    return 0;
}
