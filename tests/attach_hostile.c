/* tests/attach_hostile.c: processes that make an attach hard (tests/test_attach.py).
 *
 *   attach_hostile threads N   N threads: 4 allocate and free as fast as they can, the
 *                              others sleep in pause()
 *   attach_hostile forks       2 threads allocate and free, a third forks all the time (each
 *                              child allocates, frees and exits)
 *   attach_hostile forklock    one thread only, with an atfork prepare handler that, for the
 *                              fork of the "fork" command, waits for "release": a fork it
 *                              holds up (and, once mmleak.so registered its own handler, which
 *                              runs before, mmleak's lock with it)
 *
 * Then says "ready"; the main thread reads lines: "leak N" (N blocks of 96 bytes, site
 * hostile_leak) answered "ok N", "quit"; with forklock also "fork" (a thread forks, and "in
 * prepare" once its prepare handler waits) and "release" (the handler returns; "forked" once
 * the child was reaped). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink;

static void *churn(void *arg)
{
    unsigned x = (unsigned)(long)arg * 2654435761u + 1;
    void *slot[32] = {0};
    for (;;) {
        x = x * 1103515245u + 12345u;
        free(slot[x % 32]);
        slot[x % 32] = malloc(16 + (x >> 16) % 500);
    }
    return NULL;
}

static void *sleeper(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static void *forker(void *arg)
{
    (void)arg;
    for (;;) {
        pid_t c = fork();
        if (c == 0) {
            sink = malloc(40);
            free(sink);
            _exit(0);
        }
        if (c > 0)
            waitpid(c, NULL, 0);
    }
    return NULL;
}

static int gate[2];                     /* the prepare handler waits for a byte there */
static volatile int hold_fork, in_prepare;

static void prepare_waits(void)
{
    char c;
    if (!hold_fork)
        return;
    in_prepare = 1;
    while (read(gate[0], &c, 1) < 0 && errno == EINTR)
        ;
}

static void *fork_once(void *arg)
{
    (void)arg;
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    if (c > 0)
        waitpid(c, NULL, 0);
    return NULL;
}

static void leak(long n)
{
    for (long i = 0; i < n; i++)
        sink = malloc(96);                      /* site:hostile_leak */
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    pthread_t t;
    if (!strcmp(mode, "threads") && argc > 2) {
        int n = atoi(argv[2]);
        for (int i = 0; i < n; i++)
            if (pthread_create(&t, NULL, i < 4 ? churn : sleeper, (void *)(long)i))
                return 3;
    } else if (!strcmp(mode, "forklock")) {
        if (pipe(gate) || pthread_atfork(prepare_waits, NULL, NULL))
            return 3;
    } else if (!strcmp(mode, "forks")) {
        pthread_create(&t, NULL, churn, (void *)1L);
        pthread_create(&t, NULL, churn, (void *)2L);
        pthread_create(&t, NULL, forker, NULL);
    } else {
        fprintf(stderr, "usage: attach_hostile threads N | forks | forklock\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "leak ", 5)) {
            leak(atol(line + 5));
            printf("ok %ld\n", atol(line + 5));
        } else if (!strncmp(line, "fork", 4)) {
            hold_fork = 1;
            if (pthread_create(&t, NULL, fork_once, NULL))
                return 3;
            while (!in_prepare)
                usleep(1000);
            printf("in prepare\n");
        } else if (!strncmp(line, "release", 7)) {
            if (write(gate[1], "x", 1) != 1)
                return 3;
            pthread_join(t, NULL);
            hold_fork = in_prepare = 0;
            printf("forked\n");
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
    }
    printf("bye\n");
    fflush(stdout);
    _exit(0);       /* the other threads never end */
}
