/* scan_park.c: a daemon that starts as root with threads and drops root for good (setuid),
 * so that the kernel makes it not dumpable, as memcached -u does: its scanner at the exit
 * may not ptrace the other threads, and mmleak.so stops them with a signal of its own
 * (tracer/park.c; test_scan_park.py).
 *   scan_park UID [MODE]
 * Before the drop: a thread holds the only pointer to a block of 1111 bytes in a local of its
 * frame and waits in read() (a system call); another holds the only pointer to a block of
 * 2222 bytes in r12 and spins (no system call); a block of 3333 bytes is lost.  MODE
 * "blockall": a third thread blocks every signal and waits in read().  Then setuid(UID),
 * and exit(0) while they wait (status 3: still dumpable, the test would prove nothing). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static int ready[2], never[2];

__attribute__((noinline)) static void wipe(void)
{
    volatile char junk[64 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

static void *stack_thread(void *arg)
{
    (void)arg;
    void *volatile local = malloc(1111);
    char c;
    (void)!write(ready[1], "s", 1);
    (void)!read(never[0], &c, 1);       /* never returns: nothing is written there */
    return local;
}

static void *register_thread(void *arg)
{
    (void)arg;
    register uintptr_t r asm("r12") = (uintptr_t)malloc(2222) ^ 1;
    wipe();
    r ^= 1;
    (void)!write(ready[1], "r", 1);
    for (;;)
        __asm__ volatile("pause" : "+r"(r));
    return NULL;
}

static void *blocking_thread(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    char c;
    (void)!write(ready[1], "b", 1);
    (void)!read(never[0], &c, 1);
    return NULL;
}

__attribute__((noinline)) static void lose(void)
{
    void *volatile p = malloc(3333);
    p = NULL;
    (void)p;
}

int main(int argc, char **argv)
{
    if (argc < 2 || pipe(ready) || pipe(never))
        return 2;
    int block = argc > 2 && !strcmp(argv[2], "blockall");
    pthread_t t;
    if (pthread_create(&t, NULL, stack_thread, NULL) ||
        pthread_create(&t, NULL, register_thread, NULL) ||
        (block && pthread_create(&t, NULL, blocking_thread, NULL)))
        return 2;
    char c;
    for (int i = 0; i < 2 + block; i++)
        if (read(ready[0], &c, 1) != 1)
            return 2;
    lose();
    wipe();
    if (setuid((uid_t)atoi(argv[1])))
        return 2;
    if (prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        return 3;
    exit(0);
}
