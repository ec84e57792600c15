/* tests/test_stacks.py: mmleak.so remembers a walk from the same start (return address and
 * stack pointer) and skips it when the stack words it read are unchanged (the memo,
 * tracer/unwind.h).  This program makes the memo's hard cases: different callers that reach
 * the allocating function at exactly the same stack pointer (only a return address further up
 * differs), the same function at many depths (recursion), paths taken in a shuffled order,
 * thousands of times, in two threads.
 *
 * Every allocation leaks a block whose size names its thread and path (SIZE = 1000 + path in
 * the main thread, 2000 + path in the other), made by xmalloc().  Before the first allocation
 * of a size, xmalloc prints its callers as glibc's backtrace() sees them: "SIZE addr ...";
 * at the end, "count SIZE N" for every size.  The test checks that every block of a size
 * carries exactly that stack (all of it with MMLEAK_DEPTH=64; with the default settings, the
 * wrapper's frame, leaf's and four more). */
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alarm.h"

#define NOINLINE __attribute__((noinline))
#define PATHS 13

static void *volatile sink;
static int printed[2][PATHS];
static __thread int which;      /* 0: the main thread, 1: the other */
static int counts[2][PATHS];
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

/* An allocation wrapper by name: with the default settings mmleak.so walks through it to
 * leaf() and records four more callers; with MMLEAK_DEPTH=64, everything. */
NOINLINE static void *xmalloc(int path)
{
    int size = 1000 * (1 + which) + path;
    if (!printed[which][path]) {
        void *b[64];
        int n = backtrace(b, 64);
        pthread_mutex_lock(&print_lock);
        printf("%d", size);
        for (int i = 1; i < n; i++)
            printf(" %lx", (unsigned long)b[i] - 1);
        printf("\n");
        pthread_mutex_unlock(&print_lock);
        printed[which][path] = 1;
    }
    void *p = malloc((size_t)size);
    counts[which][path]++;
    __asm__ volatile("");
    return p;
}

NOINLINE static void leaf(int path)
{
    sink = xmalloc(path);
    __asm__ volatile("");
}

/* Same frame size each: leaf runs at the same stack pointer whichever of them called it.  The
 * nops differ so that the compiler does not merge identical functions. */
NOINLINE static void mid_a(int p) { leaf(p); __asm__ volatile("nop"); }
NOINLINE static void mid_b(int p) { leaf(p); __asm__ volatile("nop; nop"); }
/* Two levels up: top_x/top_y call mid_a/mid_b at the same depth, so only a return address two
 * frames above leaf tells those paths apart. */
NOINLINE static void top_x(int p) { if (p & 1) mid_a(p); else mid_b(p); __asm__ volatile("nop"); }
NOINLINE static void top_y(int p)
{
    if (p & 1)
        mid_a(p);
    else
        mid_b(p);
    __asm__ volatile("nop; nop");
}

NOINLINE static void rec(int depth, int p)
{
    if (depth > 0)
        rec(depth - 1, p);
    else
        leaf(p);
    __asm__ volatile("");
}

/* A frame of 3 KiB: the memo keeps steps of 1 KiB or more in a longer form. */
NOINLINE static void big_frame(int p)
{
    volatile char buf[3000];
    buf[0] = (char)p;
    leaf(p);
    buf[1] = buf[0];
}

/* path: 0-3 top_x/top_y x mid_a/mid_b; 4-11 recursion of depth 0..7; 12 a big frame */
static void take(int path)
{
    if (path == 12) {
        big_frame(path);
    } else if (path < 4) {
        if (path < 2)
            top_x(path);
        else
            top_y(path);
    } else {
        rec(path - 4, path);
    }
}

/* "signals": a timer every 50 us whose handler allocates and frees through another wrapper
 * (its blocks are not leaked), so that memo lookups and records of the handler land in the
 * middle of the main thread's own.  The test preloads an async-signal-safe allocator behind
 * mmleak.so (glibc's malloc is not one). */
NOINLINE static void *xzalloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("");
    return p;
}

NOINLINE static void sig_leaf(int k)
{
    void *p = xzalloc((size_t)(48 + k));
    sink = p;
    free(p);
    __asm__ volatile("");
}

static volatile int handler_runs;

static void handler(int sig)
{
    (void)sig;
    sig_leaf(handler_runs++ & 7);
}

static unsigned next(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return *seed >> 16;
}

static void run(unsigned seed, int rounds)
{
    for (int i = 0; i < rounds; i++)
        take((int)(next(&seed) % PATHS));
}

static void *thread_body(void *arg)
{
    which = 1;
    run((unsigned)(uintptr_t)arg, 2000);
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int signals = argc > 1 && !strcmp(argv[1], "signals");
    if (signals)
        alarm_every(handler, 50);
    /* with the timer, the main thread goes on until the handler ran 1000 times (one call
     * site of run: a path's stack is the same in every round) */
    unsigned seed = 7;
    int rounds = 3000;
    do {
        run(seed++, rounds);
        rounds = 100;
    } while (signals && handler_runs < 1000);
    pthread_t t;
    pthread_create(&t, NULL, thread_body, (void *)(uintptr_t)11);
    pthread_join(t, NULL);
    alarm_stop();
    for (int w = 0; w < 2; w++)
        for (int p = 0; p < PATHS; p++)
            printf("count %d %d\n", 1000 * (1 + w) + p, counts[w][p]);
    return 0;
}
