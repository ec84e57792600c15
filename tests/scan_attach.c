/* scan_attach.c: a process traced only from an attach on (test_scan.py).  Before: a block
 * of 64 bytes held by a global.  It prints "ready" and waits for SIGUSR1 (the attach comes
 * meanwhile); then it allocates two blocks of 4321 bytes: one pointed to only from inside
 * the untraced block (still reachable: the untraced heap is a root), one nothing points to
 * (definitely lost); prints "planted" and waits for SIGTERM. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void **g_old;
static volatile sig_atomic_t go, stop;

static void on_usr1(int s) { (void)s; go = 1; }
static void on_term(int s) { (void)s; stop = 1; }

__attribute__((noinline)) static void plant(void)
{
    g_old[2] = calloc(1, 4321);
    volatile char *lost = calloc(1, 4321);
    lost[0] = 1;
}

__attribute__((noinline)) static void wipe(void)
{
    volatile char junk[64 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

int main(void)
{
    sigset_t m, old;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR1);
    sigaddset(&m, SIGTERM);
    sigprocmask(SIG_BLOCK, &m, &old);
    signal(SIGUSR1, on_usr1);
    signal(SIGTERM, on_term);
    g_old = calloc(8, sizeof *g_old);
    printf("ready\n");
    fflush(stdout);
    while (!go)
        sigsuspend(&old);
    plant();
    wipe();
    printf("planted\n");
    fflush(stdout);
    while (!stop)
        sigsuspend(&old);
    return 0;
}
