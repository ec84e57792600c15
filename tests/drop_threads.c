/* drop_threads.c: a root process that becomes another user for good, then starts threads
 * (memcached -u, nsd): test_dumpdir_tracer.py.  argv: MODE UID THREADS PAIRS.  It keeps a
 * block of 100 bytes allocated before the drop and one of 200 after it; thread i (from 0)
 * keeps one of 1000 + i bytes and makes PAIRS pairs of malloc(32) and free.  MODE "j": each
 * thread is joined before the next starts; "w": they all run at once and are still waiting
 * (pthread_cond_wait) when main returns; "r" as "j", the uids changed by raw system calls
 * (mmleak.so does not see the drop).  main keeps a block of 300 bytes last. */
#define _GNU_SOURCE
#include <grp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER, never = PTHREAD_COND_INITIALIZER;
static int started, pairs, wait_there;
static void *volatile keep[1024];

static void *worker(void *arg)
{
    long i = (long)arg;
    keep[3 + i] = malloc(1000 + (size_t)i);     /* site:kept */
    for (int k = 0; k < pairs; k++) {
        void *volatile q = malloc(32);  /* site:pair (volatile: a pair the compiler keeps) */
        free(q);
    }
    pthread_mutex_lock(&lock);
    started++;
    pthread_cond_signal(&ready);
    while (wait_there)
        pthread_cond_wait(&never, &lock);
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    uid_t u = (uid_t)atoi(argv[2]);
    long n = atol(argv[3]);
    pairs = atoi(argv[4]);
    wait_there = argv[1][0] == 'w';
    if (n < 0 || n > 1000)
        return 2;
    keep[0] = malloc(100);     /* site:before */
    if (setgroups(0, NULL) || setresgid(u, u, u))
        return 1;
    if (argv[1][0] == 'r' ? syscall(SYS_setresuid, u, u, u) : setresuid(u, u, u))
        return 1;
    keep[1] = malloc(200);     /* site:after */
    for (long i = 0; i < n; i++) {
        pthread_t th;
        if (pthread_create(&th, NULL, worker, (void *)i))
            return 1;
        if (!wait_there && pthread_join(th, NULL))
            return 1;
    }
    pthread_mutex_lock(&lock);
    while (started < n)
        pthread_cond_wait(&ready, &lock);
    pthread_mutex_unlock(&lock);
    keep[2] = malloc(300);     /* site:last */
    return 0;
}
