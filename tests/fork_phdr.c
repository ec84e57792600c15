/* A thread parked inside dl_iterate_phdr's callback (the loader's lock held) while main forks;
 * the child allocates and exits.  Prints "child ok" from the child and its status, or "child
 * hung" (status 3) when it has not ended within 5 s.  Untraced the child never calls
 * dl_iterate_phdr; traced, mmleak.so's first maps check in the child did, and the lock that
 * fork copied held waited forever (test_tracer.py, test_fork_while_the_loader_lock_is_held). */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int in_cb[2], go_on[2];

static int cb(struct dl_phdr_info *i, size_t n, void *d)
{
    (void)i; (void)n; (void)d;
    char c = 1;
    if (write(in_cb[1], &c, 1) != 1 || read(go_on[0], &c, 1) != 1)
        abort();
    return 1;
}

static void *parked(void *a)
{
    (void)a;
    dl_iterate_phdr(cb, NULL);
    return NULL;
}

int main(void)
{
    if (pipe(in_cb) || pipe(go_on))
        return 1;
    pthread_t t;
    pthread_create(&t, NULL, parked, NULL);
    char c;
    if (read(in_cb[0], &c, 1) != 1)
        return 1;
    pid_t p = fork();
    if (p == 0) {
        for (int i = 0; i < 100000; i++)
            free(malloc(100 + i % 1000));
        void *keep = malloc(48);
        (void)keep;
        printf("child ok\n");
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    for (int k = 0; k < 50; k++) {          /* 5 s */
        if (waitpid(p, &st, WNOHANG) == p) {
            printf("child status %d\n", WEXITSTATUS(st));
            if (write(go_on[1], "x", 1) != 1)
                return 1;
            pthread_join(t, NULL);
            return 0;
        }
        usleep(100000);
    }
    printf("child hung\n");
    kill(p, 9);
    waitpid(p, &st, 0);
    if (write(go_on[1], "x", 1) != 1)
        return 1;
    pthread_join(t, NULL);
    return 3;
}
