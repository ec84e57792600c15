/* scan_park.c: a daemon that starts as root with threads and drops root for good (setuid),
 * so that the kernel makes it not dumpable, as memcached -u does: its scanner at the exit
 * may not ptrace the other threads, and mmleak.so stops them with a signal of its own
 * (tracer/park.c; test_scan_park.py).
 *   scan_park UID|- [MODE]
 * Before the drop: a thread holds the only pointer to a block of 1111 bytes in a local of its
 * frame and waits in read() (a system call); another holds the only pointer to a block of
 * 2222 bytes in r12 and spins (no system call); a block of 3333 bytes is lost.  MODE
 * "blockall": a third thread blocks every signal and waits in read(); "vfork": a third
 * thread waits for a vfork child (which takes no signal but a fatal one) that waits until
 * the process has ended.  Then setuid(UID) ("-": none), and exit(0) while they wait (status
 * 3: still dumpable after a setuid, the test would prove nothing). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static int ready[2], never[2], until_end[2];

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

static void *vfork_thread(void *arg)
{
    (void)arg;
    pid_t c = vfork();
    if (c == 0) {
        char b;
        /* "ready" from the child, not from the thread before its vfork: main must not
         * exit before the thread is held in vfork (it would take the signal then, and
         * park: seen once in ten runs) */
        (void)!write(ready[1], "v", 1);
        /* its copy of the write end closed, the read ends with the process, whose
         * copy is the last */
        close(until_end[1]);
        (void)!read(until_end[0], &b, 1);
        _exit(0);
    }
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
    if (argc < 2 || pipe(ready) || pipe(never) || pipe(until_end))
        return 2;
    const char *mode = argc > 2 ? argv[2] : "";
    void *(*third)(void *) = !strcmp(mode, "blockall") ? blocking_thread :
                             !strcmp(mode, "vfork") ? vfork_thread : NULL;
    pthread_t t;
    if (pthread_create(&t, NULL, stack_thread, NULL) ||
        pthread_create(&t, NULL, register_thread, NULL) ||
        (third && pthread_create(&t, NULL, third, NULL)))
        return 2;
    char c;
    for (int i = 0; i < 2 + !!third; i++)
        if (read(ready[0], &c, 1) != 1)
            return 2;
    lose();
    wipe();
    if (strcmp(argv[1], "-") && setuid((uid_t)atoi(argv[1])))
        return 2;
    if (strcmp(argv[1], "-") && prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        return 3;
    exit(0);
}
