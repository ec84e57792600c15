/* tests/inject_clock.c: mmleak_inject_call_within (tools/inject.c) on a clock the test moves.
 *
 *     inject_clock MMLEAK_TOOLS_SO PID LIB FUNC ARG SEARCH_MS TOTAL_MS
 *
 * The injector reads CLOCK_MONOTONIC through clock_gettime (tools/target.c's now_ns); this
 * program defines clock_gettime itself and exports it (-rdynamic), so mmleak-tools.so,
 * loaded here, calls this one: CLOCK_MONOTONIC stands still until the test moves it.  Every
 * wait of the injector is a loop that ends at an event (a stop, an exit) or when that clock
 * passes a deadline, so it neither times out early on a slow machine nor late: it times out
 * when the test says the time has come.  The other clocks are the kernel's.
 *
 * Stdin: one number a line, the clock in milliseconds after the injector's start.  Each is
 * answered on stdout by "at MS" once the injector has read the clock SEEN times at that
 * time (it has looked at it: had that time ended a wait, the wait is over).  The clock is
 * moved only after the injector has read it SEEN times at the time before (so its start,
 * its first reading, is at 0).  At the end: "result N at MS" or "error CODE MESSAGE at MS",
 * MS being the clock when the injector returned.  Exit 0, or 2 for a usage error. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SEEN 5
#define BASE_NS 1000000000000LL     /* any value: the injector only subtracts two readings */

static _Atomic int64_t clock_ms;    /* the time after the start */
static _Atomic long reads;          /* readings of CLOCK_MONOTONIC since it last moved */

__attribute__((visibility("default"))) int clock_gettime(clockid_t id, struct timespec *ts)
{
    if (id != CLOCK_MONOTONIC)
        return (int)syscall(SYS_clock_gettime, id, ts);
    int64_t ns = BASE_NS + atomic_load(&clock_ms) * 1000000;
    atomic_fetch_add(&reads, 1);
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    return 0;
}

static void wait_reads(void)
{
    while (atomic_load(&reads) < SEEN)
        usleep(200);
}

/* The test's hand on the clock. */
static void *mover(void *arg)
{
    (void)arg;
    long long ms;
    while (scanf("%lld", &ms) == 1) {
        wait_reads();
        atomic_store(&clock_ms, ms);
        atomic_store(&reads, 0);
        wait_reads();
        printf("at %lld\n", ms);
        fflush(stdout);
    }
    return NULL;
}

typedef int within_fn(int, const char *, const char *, const char *, int, int, long *, char *,
                      size_t);

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: inject_clock MMLEAK_TOOLS_SO PID LIB FUNC ARG SEARCH_MS "
                        "TOTAL_MS\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    within_fn *within = h ? (within_fn *)dlsym(h, "mmleak_inject_call_within") : NULL;
    if (!within) {
        fprintf(stderr, "inject_clock: %s\n", dlerror());
        return 2;
    }
    pthread_t t;
    pthread_create(&t, NULL, mover, NULL);
    long res = 0;
    char err[1024];
    int rc = within(atoi(argv[2]), argv[3], argv[4], argv[5], atoi(argv[6]), atoi(argv[7]),
                    &res, err, sizeof err);
    flockfile(stdout);
    if (rc == 0)
        printf("result %ld at %lld\n", res, (long long)atomic_load(&clock_ms));
    else
        printf("error %d %s at %lld\n", rc, err, (long long)atomic_load(&clock_ms));
    fflush(stdout);
    _exit(0);
}
