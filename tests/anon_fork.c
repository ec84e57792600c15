/* anon_fork.c: a thread that cannot create its dump file (no descriptor left), stages in
 * memory, then forks (test_dumpdir_tracer.py).  Run with RLIMIT_NOFILE at 64: the thread
 * takes every descriptor left, allocates 111 bytes (its first event: no file can be made),
 * gives them back and forks; the child makes 3,000 pairs of malloc(40) and free and keeps
 * 222 bytes; the thread then keeps 333, main 44 before it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile keep[4];

static void *worker(void *arg)
{
    (void)arg;
    int fds[4096], n = 0;
    while (n < 4096 && (fds[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
        n++;
    keep[0] = malloc(111);                  /* site:staged */
    while (n > 0)
        close(fds[--n]);
    pid_t c = fork();
    if (c == 0) {
        for (int i = 0; i < 3000; i++) {
            void *volatile q = malloc(40);  /* site:pair (volatile: a pair the compiler keeps) */
            free(q);
        }
        keep[1] = malloc(222);              /* site:child */
        exit(0);
    }
    int st;
    if (c < 0 || waitpid(c, &st, 0) != c || st != 0)
        exit(1);
    keep[2] = malloc(333);                  /* site:after */
    return NULL;
}

int main(void)
{
    keep[3] = malloc(44);                   /* site:main */
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) || pthread_join(t, NULL))
        return 1;
    return 0;
}
