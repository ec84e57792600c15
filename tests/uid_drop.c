/* uid_drop.c: a root process that changes its uid while traced (test_dumpdir_tracer.py).
 * argv[1]: "t" seteuid(UID) for a while (a file server's request) and back to root; "e"
 * seteuid(UID) until the exit (varnishd's manager), "ef" with a child forked then, which
 * allocates 400 bytes (proftpd's sessions); "p" setuid(UID), for good; "ep"
 * seteuid(UID), then setresuid(UID, UID, UID) from there; "pr" as "p", then 200,000 pairs of
 * malloc and free (past a rotation at MMLEAK_ROTATE_MB=1).  One block of 100, 200 and 300
 * bytes is allocated before, during and after, and kept. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    } else if (!strcmp(argv[1], "p") || !strcmp(argv[1], "pr")) {
        if (setuid(u))
            return 1;
        keep[1] = malloc(200);
        for (int i = 0; argv[1][1] && i < 200000; i++) {
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
