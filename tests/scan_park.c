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
 * the process has ended; "starting": a third thread blocks every signal, glibc's own too, as
 * one being started does, until mmleak.so has put its handler on.  Then setuid(UID) ("-":
 * none), and exit(0) while they wait (status 3: still dumpable after a setuid, the test
 * would prove nothing). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scan_park.h"

static int ready[2], never[2], until_end[2], go[2];

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

/* Like a thread that pthread_create is starting: every signal blocked, glibc's own two
 * included (only the raw system call can), until mmleak.so has chosen its signal and put
 * its handler on one (the first real-time signal whose disposition stops being SIG_DFL);
 * then nothing blocked, and it waits in read(). */
static void *starting_thread(void *arg)
{
    (void)arg;
    uint64_t all = ~(uint64_t)0, none = 0;
    char c;
    (void)!write(ready[1], "t", 1);
    /* only after main's setuid: glibc's setuid waits for every thread to take its signal 33 */
    if (read(go[0], &c, 1) != 1)
        return NULL;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, NULL, sizeof all);
    (void)!write(ready[1], "T", 1);
    for (int chosen = 0; !chosen; sched_yield())
        for (int s = SIGRTMIN; s <= SIGRTMAX && !chosen; s++) {
            struct sigaction sa;
            chosen = !sigaction(s, NULL, &sa) && sa.sa_handler != SIG_DFL;
        }
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, sizeof none);
    (void)!read(never[0], &c, 1);
    return NULL;
}

static void *blocking_thread(void *arg)
{
    (void)arg;
    block_all_and_wait(ready[1], never[0]);
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

int main(int argc, char **argv)
{
    if (argc < 2 || pipe(ready) || pipe(never) || pipe(until_end) || pipe(go))
        return 2;
    const char *mode = argc > 2 ? argv[2] : "";
    void *(*third)(void *) = !strcmp(mode, "blockall") ? blocking_thread :
                             !strcmp(mode, "vfork") ? vfork_thread :
                             !strcmp(mode, "starting") ? starting_thread : NULL;
    pthread_t t;
    if (pthread_create(&t, NULL, stack_thread, NULL) ||
        pthread_create(&t, NULL, register_thread, NULL) ||
        (third && pthread_create(&t, NULL, third, NULL)))
        return 2;
    char c;
    for (int i = 0; i < 2 + !!third; i++)
        if (read(ready[0], &c, 1) != 1)
            return 2;
    lose(3333);
    wipe();
    if (strcmp(argv[1], "-") && setuid((uid_t)atoi(argv[1])))
        return 2;
    if (strcmp(argv[1], "-") && prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        return 3;
    if (third == starting_thread &&
        (write(go[1], "g", 1) != 1 || read(ready[0], &c, 1) != 1 || c != 'T'))
        return 2;
    exit(0);
}
