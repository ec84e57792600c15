/* scan_park_api.c: a running program, not dumpable, asks for two scans
 * (mmleak_leak_check) while its threads hold blocks and go on working between and after
 * them: mmleak.so parks the threads with a signal of its own (tracer/park.c) and lets each
 * go back to where it was (test_scan_park.py).
 *   scan_park_api UID|- [blockall|together|poll]
 * UID: setuid(UID) first, which makes the process not dumpable (status 3 if it stays so);
 * "-": prctl(PR_SET_DUMPABLE, 0).  Threads: "stack" holds the only pointer to a block of
 * 1111 bytes in a local of its frame and waits in read() for its orders; "register" holds
 * the only pointer to a block of 2222 bytes in r12 and spins (no system call) until told;
 * a block of 3333 bytes is lost before the first scan.  Each round after a scan, each
 * thread does ROUND x 1000 turns of a known sum, reports it, and checks that its errno and
 * its signal mask are what it set (SIGUSR1 blocked, errno EDOM); round 1 loses a block of
 * 444 bytes (stack) and one of 555 bytes (register).  Then they free their blocks and end,
 * and the process exits (its scan at the exit: one thread).
 * Output: "check N R" after each scan (R: mmleak_leak_check's value), "work T ROUND SUM"
 * from each thread each round.
 * "blockall": a third thread blocks every signal: one scan, R -1 (no verdict), the others
 * go on all the same.  "together": no second scan from main; the "stack" thread and main
 * ask for the second scan at once (a pipe each way, no timing): both get a verdict.  "poll":
 * a third thread waits in poll() (no time limit) during the first scan, then says what
 * it returned: -1 EINTR where it was parked by a signal (poll is never restarted after a
 * handler), 1 where ptrace stopped it (restarted; main writes to its pipe after the scan). */
#define _GNU_SOURCE
#include <errno.h>
#include <mmleak.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "scan_park.h"

static int to_stack[2], to_block[2], from_threads[2], ready[2];
static volatile int phase;              /* the round the register thread is told to do */
static volatile int spinning;           /* the round after which it spins again */
static volatile int stack_tid, reading;    /* the round after which it reads again */
static volatile int poll_tid;
static int together;

/* The block just lost, out of every place malloc may have left its address: the stack
 * below (wipe) and the caller-saved registers (a parked thread's registers are roots) */
__attribute__((noinline)) static void forget(void)
{
    wipe();
    __asm__ volatile("xor %%eax, %%eax\n\txor %%ecx, %%ecx\n\txor %%edx, %%edx\n\t"
                     "xor %%esi, %%esi\n\txor %%edi, %%edi\n\txor %%r8d, %%r8d\n\t"
                     "xor %%r9d, %%r9d\n\txor %%r10d, %%r10d\n\txor %%r11d, %%r11d\n\t"
                     "pxor %%xmm0, %%xmm0\n\tpxor %%xmm1, %%xmm1"
                     ::: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11",
                         "xmm0", "xmm1", "memory");
}

static unsigned long work(int round)
{
    unsigned long sum = 0;
    for (int i = 0; i < round * 1000; i++)
        sum += (unsigned long)i * 7 % 13;
    return sum;
}

/* errno EDOM and SIGUSR1 alone blocked, as this thread left them: 1 if so */
static int as_left(void)
{
    sigset_t now;
    if (errno != EDOM || pthread_sigmask(SIG_BLOCK, NULL, &now))
        return 0;
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&now, s) != (s == SIGUSR1))
            return 0;
    return 1;
}

static void report(const char *who, int round)
{
    char line[96];
    int ok = as_left();
    int n = snprintf(line, sizeof line, "work %s %d %lu%s\n", who, round, work(round),
                     ok ? "" : " (errno or mask changed)");
    (void)!write(from_threads[1], line, (size_t)n);
}

static void keep_mask(void)
{
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, SIGUSR1);
    pthread_sigmask(SIG_SETMASK, &m, NULL);
}

static void *stack_thread(void *arg)
{
    (void)arg;
    keep_mask();
    void *volatile local = malloc(1111);
    stack_tid = gettid();
    (void)!write(ready[1], "s", 1);
    for (int done = 0;; done++) {
        char c;
        __atomic_store_n(&reading, done, __ATOMIC_RELEASE);
        errno = EDOM;
        ssize_t r = read(to_stack[0], &c, 1);   /* parked here (restarted: SA_RESTART) */
        if (r != 1) {
            (void)!write(from_threads[1], "stack read failed\n", 18);
            return NULL;
        }
        if (c == 'q')
            break;
        if (c == 'c') {                 /* ask for a scan, with main (together) */
            int v = mmleak_leak_check();
            char line[32];
            int n = snprintf(line, sizeof line, "thread check %d\n", v);
            (void)!write(from_threads[1], line, (size_t)n);
            continue;
        }
        if (c == '1') {                 /* lost before it says so: before the next scan */
            lose(444);
            forget();
        }
        errno = EDOM;
        report("stack", c - '0');
        errno = EDOM;
    }
    free(local);
    return NULL;
}

static void *register_thread(void *arg)
{
    (void)arg;
    keep_mask();
    register uintptr_t r asm("r12") = (uintptr_t)malloc(2222) ^ 1;
    wipe();
    r ^= 1;
    errno = EDOM;
    (void)!write(ready[1], "r", 1);
    for (int done = 0;;) {
        int p;
        __atomic_store_n(&spinning, done, __ATOMIC_RELEASE);
        while ((p = __atomic_load_n(&phase, __ATOMIC_ACQUIRE)) == done)
            __asm__ volatile("pause" : "+r"(r));        /* parked here, no system call */
        if (p < 0)
            break;
        done = p;
        if (p == 1) {
            lose(555);
            forget();
        }
        errno = EDOM;
        report("register", p);
        errno = EDOM;
    }
    free((void *)r);
    return NULL;
}

static void *poll_thread(void *arg)
{
    (void)arg;
    struct pollfd p = { .fd = to_block[0], .events = POLLIN };
    poll_tid = gettid();
    (void)!write(ready[1], "p", 1);
    int r = poll(&p, 1, -1);            /* parked here */
    char line[64];
    int n = snprintf(line, sizeof line, "poll %d %s\n", r, r < 0 && errno == EINTR ? "EINTR" :
                     r < 0 ? "error" : "0");
    (void)!write(from_threads[1], line, (size_t)n);
    return NULL;
}

static void *blocking_thread(void *arg)
{
    (void)arg;
    block_all_and_wait(ready[1], to_block[0]);
    return NULL;
}

/* Both threads do ROUND and say so (their lines, in either order, copied to stdout) */
static int round_of_work(int round)
{
    char c = (char)('0' + round);
    if (write(to_stack[1], &c, 1) != 1)
        return -1;
    __atomic_store_n(&phase, round, __ATOMIC_RELEASE);
    return 0;
}

static int relay_lines(int n)
{
    static char buf[4096];
    static size_t have;
    while (n > 0) {
        char *nl = memchr(buf, '\n', have);
        if (nl) {
            size_t len = (size_t)(nl - buf) + 1;
            fwrite(buf, 1, len, stdout);
            memmove(buf, buf + len, have - len);
            have -= len;
            n--;
            continue;
        }
        ssize_t r = read(from_threads[0], buf + have, sizeof buf - have);
        if (r <= 0)
            return -1;
        have += (size_t)r;
    }
    fflush(stdout);
    return 0;
}

/* Thread TID asleep (its /proc stat's state S; /proc's syscall file, which would say
 * where, is root's once not dumpable): 0, or -1 */
static int asleep(int tid)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    for (;;) {
        FILE *f = fopen(path, "r");
        if (!f)
            return -1;
        char *end = fgets(line, sizeof line, f) ? strrchr(line, ')') : NULL;
        fclose(f);
        if (!end)
            return -1;
        if (end[1] == ' ' && end[2] == 'S')
            return 0;
        sched_yield();
    }
}

/* Both threads back where a scan finds them (a thread parked on its way back would show
 * the stale copies its last calls left in their frames): the register thread in its spin
 * after ROUND, the stack thread past its work and asleep (in read(), its one blocking
 * call).  0, or -1. */
static int at_rest(int round)
{
    while (__atomic_load_n(&spinning, __ATOMIC_ACQUIRE) != round ||
           __atomic_load_n(&reading, __ATOMIC_ACQUIRE) != round)
        sched_yield();
    return asleep(stack_tid);
}

int main(int argc, char **argv)
{
    if (argc < 2 || pipe(to_stack) || pipe(to_block) || pipe(from_threads) || pipe(ready))
        return 2;
    const char *mode = argc > 2 ? argv[2] : "";
    int blockall = !strcmp(mode, "blockall"), polling = !strcmp(mode, "poll");
    together = !strcmp(mode, "together");
    pthread_t ts, tr, tb;
    if (pthread_create(&ts, NULL, stack_thread, NULL) ||
        pthread_create(&tr, NULL, register_thread, NULL) ||
        (blockall && pthread_create(&tb, NULL, blocking_thread, NULL)) ||
        (polling && pthread_create(&tb, NULL, poll_thread, NULL)))
        return 2;
    char c;
    for (int i = 0; i < 2 + blockall + polling; i++)
        if (read(ready[0], &c, 1) != 1)
            return 2;
    if (strcmp(argv[1], "-") ? setuid((uid_t)atoi(argv[1])) : prctl(PR_SET_DUMPABLE, 0))
        return 2;
    if (prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        return 3;
    lose(3333);
    wipe();
    if (at_rest(0) || (polling && asleep(poll_tid)))
        return 4;
    printf("check 1 %d\n", mmleak_leak_check());
    fflush(stdout);
    if (polling && (write(to_block[1], "g", 1) != 1 || relay_lines(1) ||
                    pthread_join(tb, NULL)))
        return 2;
    if (round_of_work(1) || relay_lines(2))
        return 2;
    if (at_rest(1))
        return 4;
    if (blockall) {
        if (write(to_block[1], "g", 1) != 1 || pthread_join(tb, NULL))
            return 2;
    } else if (together) {
        /* the stack thread asks as main does: whichever comes second waits for the first */
        if (write(to_stack[1], "c", 1) != 1)
            return 2;
        printf("check 2 %d\n", mmleak_leak_check());
        fflush(stdout);
        if (relay_lines(1))
            return 2;
    } else {
        printf("check 2 %d\n", mmleak_leak_check());
        fflush(stdout);
    }
    if (round_of_work(2) || relay_lines(2))
        return 2;
    if (write(to_stack[1], "q", 1) != 1)
        return 2;
    __atomic_store_n(&phase, -1, __ATOMIC_RELEASE);
    if (pthread_join(ts, NULL) || pthread_join(tr, NULL))
        return 2;
    return 0;
}
