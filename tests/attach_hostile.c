/* tests/attach_hostile.c: processes that make an attach hard (tests/test_attach.py).
 *
 *   attach_hostile threads N   N threads: 4 allocate and free as fast as they can, the
 *                              others sleep in pause()
 *   attach_hostile forks       2 threads allocate and free, a third forks all the time (each
 *                              child allocates, frees and exits)
 *
 * Then says "ready"; the main thread reads lines: "leak N" (N blocks of 96 bytes, site
 * hostile_leak) answered "ok N", "quit". */
#define _GNU_SOURCE
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
    } else if (!strcmp(mode, "forks")) {
        pthread_create(&t, NULL, churn, (void *)1L);
        pthread_create(&t, NULL, churn, (void *)2L);
        pthread_create(&t, NULL, forker, NULL);
    } else {
        fprintf(stderr, "usage: attach_hostile threads N | forks\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "leak ", 5)) {
            leak(atol(line + 5));
            printf("ok %ld\n", atol(line + 5));
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
    }
    printf("bye\n");
    fflush(stdout);
    _exit(0);       /* the other threads never end */
}
