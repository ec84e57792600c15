/* scan_daemon.c: a busy daemon scanned while it runs (test_scan.py).  At start it leaks
 * LOST blocks of LOST_SIZE bytes (definitely lost); then THREADS threads allocate and free
 * blocks of CHURN_SIZE bytes without pause between four operations, each block always held by a global slot,
 * a register or the stack until freed (so every one a scan finds is still reachable).  Each
 * block is filled with a pattern checked before it is freed: a scan that changed the
 * process's memory would make it exit 1.  Prints "ready" once the leaks are planted; on
 * SIGTERM the threads stop and it exits 0 (through exit: the scan at exit runs then). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "term_wait.h"

#define LOST 7
#define LOST_SIZE 777
#define CHURN_SIZE 555
#define THREADS 4
#define SLOTS 64

static void *volatile slots[THREADS][SLOTS];
static atomic_int bad;
static atomic_long ops;

__attribute__((noinline)) static void leak_some(void)
{
    for (int i = 0; i < LOST; i++) {
        volatile char *p = malloc(LOST_SIZE);
        p[0] = 1;
    }
}

static void *churn(void *arg)
{
    int t = (int)(intptr_t)arg;
    unsigned x = (unsigned)t * 2654435761u + 1;
    while (!atomic_load_explicit(&terminated, memory_order_relaxed)) {
        x = x * 1103515245u + 12345u;
        int i = (int)((x >> 8) % SLOTS);
        unsigned char *old = slots[t][i];
        if (old) {
            slots[t][i] = NULL;
            for (int k = 0; k < CHURN_SIZE; k++)
                if (old[k] != (unsigned char)(k + i))
                    atomic_store(&bad, 1);
            free(old);
        } else {
            unsigned char *p = malloc(CHURN_SIZE);
            for (int k = 0; k < CHURN_SIZE; k++)
                p[k] = (unsigned char)(k + i);
            slots[t][i] = p;
        }
        /* busy, but bounded: about 20,000 operations a second per thread (a trace of a
         * few MB a second) */
        if ((atomic_fetch_add_explicit(&ops, 1, memory_order_relaxed) & 3) == 3)
            usleep(200);
    }
    return NULL;
}

int main(void)
{
    term_ends_wait();
    leak_some();
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, churn, (void *)(intptr_t)t);
    ready_until_term();
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    printf("ops %ld bad %d\n", atomic_load(&ops), atomic_load(&bad));
    return atomic_load(&bad) ? 1 : 0;
}
