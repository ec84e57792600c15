/* scan_bench.c: the reachability benchmark of issue 20 (bench/scan.py runs it).
 *
 *   scan_bench [BLOCKS [LISTS [LOST]]]      (default 10,000,000 1,000 1,000)
 *
 * BLOCKS live blocks of 100 bytes (1 GB at the default) in LISTS singly linked lists whose
 * heads are in a global array, plus LOST blocks of 100 bytes that nothing points to: the
 * verdict must be exactly LOST definitely lost and BLOCKS still reachable.  With SCAN_WAIT
 * set it then prints "ready" and waits for SIGTERM (a process to scan on demand, with
 * SCAN_THREADS - 1 more threads, default 8 in all, idle; SIGUSR1 makes it time one fork of
 * itself and print "fork SECONDS"); else it returns from main. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

struct node { struct node *next; char pad[92]; };

struct node **heads;         /* global: stored, and a root */
static volatile sig_atomic_t stop;

__attribute__((noinline)) static void lose(long n)
{
    for (long i = 0; i < n; i++) {
        volatile char *p = malloc(100);
        p[0] = 1;
    }
}

static volatile sig_atomic_t fork_asked;

static void on_term(int sig) { (void)sig; stop = 1; }
static void on_usr1(int sig) { (void)sig; fork_asked = 1; }

/* How long a fork of this process takes (the unit of the stall bound): printed. */
static void time_a_fork(void)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t c = fork();
    if (c == 0)
        _exit(0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    waitpid(c, NULL, 0);
    printf("fork %.6f\n", (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    fflush(stdout);
}

static void *idle(void *a)
{
    (void)a;
    while (!stop)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    long blocks = argc > 1 ? atol(argv[1]) : 10000000;
    long lists = argc > 2 ? atol(argv[2]) : 1000;
    long lost = argc > 3 ? atol(argv[3]) : 1000;
    heads = calloc((size_t)lists, sizeof *heads);
    for (long i = 0; i < blocks; i++) {
        struct node *n = malloc(sizeof *n);
        n->next = heads[i % lists];
        heads[i % lists] = n;
    }
    lose(lost);
    if (getenv("SCAN_WAIT")) {
        signal(SIGTERM, on_term);
        signal(SIGUSR1, on_usr1);
        signal(SIGUSR2, on_term);
        int nt = getenv("SCAN_THREADS") ? atoi(getenv("SCAN_THREADS")) : 8;
        pthread_t t[64];
        sigset_t mask, old;             /* the signals go to the main thread */
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &mask, &old);
        for (int i = 0; i < nt - 1 && i < 64; i++)
            pthread_create(&t[i], NULL, idle, NULL);
        /* kept blocked but in sigsuspend: a signal sent right after "ready" is not lost */
        printf("ready\n");
        fflush(stdout);
        while (!stop) {
            sigsuspend(&old);
            if (fork_asked) {
                fork_asked = 0;
                time_a_fork();
            }
        }
        for (int i = 0; i < nt - 1 && i < 64; i++)
            pthread_kill(t[i], SIGUSR2);
        for (int i = 0; i < nt - 1 && i < 64; i++)
            pthread_join(t[i], NULL);
    }
    return 0;
}
