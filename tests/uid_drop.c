/* uid_drop.c: a root process that changes its uid while traced (test_dumpdir_tracer.py).
 * argv[1]: "t" seteuid(UID) for a while (a file server's request) and back to root; "e"
 * seteuid(UID) until the exit (varnishd's manager), "ef" with a child forked then, which
 * allocates 400 bytes (proftpd's sessions); "p" setuid(UID), for good; "ep"
 * seteuid(UID), then setresuid(UID, UID, UID) from there; "pr" as "p", then 200,000 pairs of
 * malloc and free (past a rotation at MMLEAK_ROTATE_MB=1); "pt" as "p", and a second thread
 * still waiting (in pthread_cond_wait, a signal ends it) at the exit.  One block of 100, 200
 * and 300 bytes is allocated before, during and after, and kept. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER, never = PTHREAD_COND_INITIALIZER;
static int started;

/* the second thread of "pt": once main has the lock back, it waits in pthread_cond_wait
 * (past glibc's start of a thread, whose signals are blocked until it runs its function) */
static void *waiter(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    started = 1;
    pthread_cond_signal(&ready);
    for (;;)
        pthread_cond_wait(&never, &lock);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    uid_t u = (uid_t)atoi(argv[2]);
    static void *volatile keep[3];
    keep[0] = malloc(100);
    if (!strcmp(argv[1], "t")) {
        if (seteuid(u))
            return 1;
        keep[1] = malloc(200);
        if (seteuid(0))
            return 1;
    } else if (!strcmp(argv[1], "p") || !strcmp(argv[1], "pr") || !strcmp(argv[1], "pt")) {
        if (setuid(u))
            return 1;
        keep[1] = malloc(200);
        pthread_t th;
        if (argv[1][1] == 't') {
            pthread_mutex_lock(&lock);
            if (pthread_create(&th, NULL, waiter, NULL))
                return 1;
            while (!started)
                pthread_cond_wait(&ready, &lock);
            pthread_mutex_unlock(&lock);
        }
        for (int i = 0; argv[1][1] == 'r' && i < 200000; i++) {
            void *volatile q = malloc(32);      /* (volatile: not a pair the compiler drops) */
            free(q);
        }
    } else if (!strcmp(argv[1], "e") || !strcmp(argv[1], "ef")) {
        if (seteuid(u))
            return 1;
        keep[1] = malloc(200);
        if (argv[1][1]) {           /* a child per session, forked as that user */
            pid_t c = fork();
            if (c == 0) {
                keep[0] = malloc(400);
                _exit(0);
            }
            if (c < 0 || waitpid(c, NULL, 0) != c)
                return 1;
        }
    } else if (!strcmp(argv[1], "ep")) {
        if (seteuid(u))
            return 1;
        keep[1] = malloc(200);
        if (setresuid(u, u, u))
            return 1;
    }
    keep[2] = malloc(300);
    return 0;
}
