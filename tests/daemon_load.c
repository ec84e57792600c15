/* A daemon-like load for compaction (tests/test_compact.py, bench/run.py): THREADS threads
 * allocate and free blocks (half of them freed by another thread), at a given rate or as
 * fast as they can, and leak one 48-byte block every LEAK events (marked in leak_one), so the
 * leaks are known exactly: threads * (pairs / LEAK).
 *
 *   daemon_load [-t THREADS] [-n PAIRS per thread] [-r PAIRS/s per thread, 0: no limit]
 *               [-l LEAK every so many pairs, 0: never] [-f: fork a child at half time]
 *               [-w: say "ready" and wait for a line on stdin before exiting]
 *               [-p PHASES: after each phase of PAIRS pairs, say "phase K" and wait for a
 *                line on stdin]
 *               [-c: commands: the threads churn until "quit"; the main thread reads lines
 *                "leak N" (N blocks of 64 bytes, site cmd_leak), "fork" (a child leaks 7
 *                blocks of 65 bytes, site fork_leak, and exits), "load PATH" (dlopen a
 *                tests/plugin.c library and call its plugin_leak), "keep N" (N blocks of
 *                72 bytes kept, site keep), "drop" (frees them, site drop), "pairs" (the
 *                pairs each thread has done, to the last 1024: "pairs N0 N1 ..."), and
 *                answers each]
 * Prints "leaked N" (this process) at the end. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long threads = 2, pairs = 100000, rate = 0, leak_every = 0;
static int do_fork, do_wait, phases = 1;
static _Atomic long leaked;
static void *volatile sink;

/* blocks handed between threads: a slot per thread, freed by the next thread */
#define SLOTS 64
static _Atomic(void *) handoff[SLOTS];

/* pairs done by each thread, published every 1024: a test waits for the threads to have
 * churned (an event), never for a time that a loaded machine may not give them */
static _Atomic long churned[64];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void leak_one(void)
{
    sink = malloc(48);                          /* site:load_leak */
    atomic_fetch_add(&leaked, 1);
}

static atomic_int quit;

static void *body(void *arg)
{
    long id = (long)arg;
    unsigned x = (unsigned)id * 2654435761u + 1;
    double t0 = now();
    for (long i = 1; pairs < 0 ? !atomic_load_explicit(&quit, memory_order_relaxed) : i <= pairs;
         i++) {
        x = x * 1103515245u + 12345u;
        void *p = malloc(16 + (x >> 16) % 240);
        if (x & 0x100) {
            /* give it to another thread, free what was there */
            void *old = atomic_exchange(&handoff[(x >> 20) % SLOTS], p);
            free(old);
        } else {
            free(p);
        }
        if (leak_every && i % leak_every == 0)
            leak_one();
        if ((i & 1023) == 0)
            atomic_store_explicit(&churned[id], i, memory_order_relaxed);
        if (rate && (i & 1023) == 0) {
            double due = t0 + (double)i / (double)rate;
            double d = due - now();
            if (d > 0) {
                struct timespec ts = { (time_t)d, (long)((d - (time_t)d) * 1e9) };
                nanosleep(&ts, NULL);
            }
        }
    }
    return NULL;
}

static void run_phase(void)
{
    pthread_t t[64];
    for (long i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, body, (void *)i);
    for (long i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
}

static void cmd_leak(long n)
{
    for (long i = 0; i < n; i++)
        sink = malloc(64);                      /* site:cmd_leak */
}

static void *kept[4096];
static long nkept;

static void cmd_keep(long n)
{
    for (long i = 0; i < n && nkept < 4096; i++)
        kept[nkept++] = malloc(72);             /* site:keep */
}

static void cmd_drop(void)
{
    while (nkept)
        free(kept[--nkept]);                    /* site:drop */
}

static int commands(void)
{
    pthread_t t[64];
    pairs = -1;
    for (long i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, body, (void *)i);
    printf("churning\n");
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "leak ", 5)) {
            cmd_leak(atol(line + 5));
            printf("ok %ld\n", atol(line + 5));
        } else if (!strncmp(line, "keep ", 5)) {
            cmd_keep(atol(line + 5));
            printf("kept %ld\n", nkept);
        } else if (!strcmp(line, "pairs")) {
            printf("pairs");
            for (long i = 0; i < threads; i++)
                printf(" %ld", atomic_load_explicit(&churned[i], memory_order_relaxed));
            printf("\n");
        } else if (!strcmp(line, "drop")) {
            long n = nkept;
            cmd_drop();
            printf("dropped %ld\n", n);
        } else if (!strcmp(line, "fork")) {
            pid_t c = fork();
            if (c == 0) {
                for (int i = 0; i < 7; i++)
                    sink = malloc(65);          /* site:fork_leak */
                _exit(0);
            }
            waitpid(c, NULL, 0);
            printf("forked %d\n", (int)c);
        } else if (!strncmp(line, "load ", 5)) {
            void *h = dlopen(line + 5, RTLD_NOW);
            void *(*leak)(int) = h ? (void *(*)(int))dlsym(h, "plugin_leak") : NULL;
            if (leak)
                leak(1);
            printf("%s\n", leak ? "loaded" : dlerror());
        } else if (!strcmp(line, "quit")) {
            break;
        }
    }
    atomic_store(&quit, 1);
    for (long i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < SLOTS; i++)
        free(atomic_exchange(&handoff[i], NULL));
    printf("bye\n");
    return 0;
}

int main(int argc, char **argv)
{
    int c, cmds = 0;
    while ((c = getopt(argc, argv, "t:n:r:l:fwp:c")) != -1) {
        switch (c) {
        case 't': threads = atol(optarg); break;
        case 'n': pairs = atol(optarg); break;
        case 'r': rate = atol(optarg); break;
        case 'l': leak_every = atol(optarg); break;
        case 'f': do_fork = 1; break;
        case 'w': do_wait = 1; break;
        case 'p': phases = atoi(optarg); break;
        case 'c': cmds = 1; break;
        default:
            fprintf(stderr, "usage: daemon_load [-t N] [-n PAIRS] [-r RATE] [-l LEAK] [-f] [-w] [-p PHASES]\n");
            return 2;
        }
    }
    if (threads < (cmds ? 0 : 1) || threads > 64)    /* commands: -t 0, no churn */
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cmds)
        return commands();
    char line[64];
    for (int ph = 1; ph <= phases; ph++) {
        pid_t child = -1;
        if (do_fork && ph == (phases + 1) / 2) {
            child = fork();
            if (child == 0) {
                leaked = 0;
                run_phase();
                printf("child leaked %ld\n", (long)leaked);
                _exit(0);
            }
        }
        run_phase();
        if (child > 0)
            waitpid(child, NULL, 0);
        if (phases > 1) {
            printf("phase %d leaked %ld\n", ph, (long)leaked);
            if (!fgets(line, sizeof line, stdin))
                break;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        free(atomic_exchange(&handoff[i], NULL));
    printf("leaked %ld\n", (long)leaked);
    if (do_wait) {
        printf("ready\n");
        if (!fgets(line, sizeof line, stdin))
            return 0;
    }
    return 0;
}
