/* The --check gate and the kinds: a program whose blocks not freed at exit are known exactly.
 *
 *   leakcheck MODE [STATUS]   MODE is a word of letters, each one thing done:
 *     l  lost:      a 104-byte block whose only pointer is dropped (definitely lost), holding
 *                   the only pointer to a 48-byte block (indirectly lost)
 *     d  dropped:   a 32-byte block whose only pointer is dropped (definitely lost), alone
 *     r  reachable: a 200-byte block a global points to (still reachable)
 *     p  possible:  a 72-byte block only an interior pointer in a global points to
 *     n  none:      a block allocated and freed
 *     s  system:    system("true"): a `sh -c` child, which dash ends with _exit
 *     x  _exit:     ends there, by _exit(STATUS)
 *   and exits with STATUS (default 0).  No stdio: its buffers would be blocks not freed too.
 *   Built with -DDEFAULT_SUPP it defines __lsan_default_suppressions().
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *volatile g_keep;          /* r */
char *volatile g_inner;         /* p: points 8 bytes into its block */

struct node {
    char pad[92];
    void *child;
};

__attribute__((noinline)) void *lost_one(void)
{
    struct node *n = malloc(sizeof *n);             /* site:lost */
    memset(n, 1, sizeof *n);
    n->child = malloc(48);                          /* site:indirect */
    memset(n->child, 2, 48);
    return n;
}

__attribute__((noinline)) void caller_of_lost(void)
{
    void *volatile p = lost_one();
    p = NULL;
    (void)p;
}

__attribute__((noinline)) void drop_one(void)
{
    void *volatile p = malloc(32);                  /* site:dropped */
    memset(p, 5, 32);
    p = NULL;
}

__attribute__((noinline)) void caller_of_drop(void)
{
    drop_one();
}

__attribute__((noinline)) void keep_one(void)
{
    g_keep = malloc(200);                           /* site:reachable */
    memset(g_keep, 3, 200);
}

__attribute__((noinline)) void possible_one(void)
{
    char *p = malloc(72);                           /* site:possible */
    memset(p, 4, 72);
    g_inner = p + 8;
}

__attribute__((noinline)) void none(void)
{
    void *volatile p = malloc(64);
    free(p);
}

#ifdef DEFAULT_SUPP
const char *__lsan_default_suppressions(void)
{
    return "# the program's own rules\nleak:^drop_one$\n";
}
#endif

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    for (const char *m = mode; *m; m++) {
        if (*m == 'l')
            caller_of_lost();
        else if (*m == 'd')
            caller_of_drop();
        else if (*m == 'r')
            keep_one();
        else if (*m == 'p')
            possible_one();
        else if (*m == 'n')
            none();
        else if (*m == 's' && system("true") != 0)
            return 1;
        else if (*m == 'x')
            _exit(argc > 2 ? atoi(argv[2]) : 0);
    }
    return argc > 2 ? atoi(argv[2]) : 0;
}
