/* tests/inject_lib.c: the library tests/test_inject.py makes running processes load
 * (tools/inject.c).  Each function takes the string argument the injector passes. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

static int loads; /* constructor runs: 1 however many times the library is injected */
static int calls;

__attribute__((constructor)) static void init(void) { loads++; }

/* Appends "pid P tid T loads L calls C\n" to the file ARG (allocating on the way: small,
 * large and freed blocks), returns 4242. */
API int inject_record(const char *arg)
{
    char *line = malloc(256);
    void *big = malloc(1 << 20); /* above the mmap threshold: mmap and munmap */
    char *copy = strdup(arg);
    int n = snprintf(line, 256, "pid %d tid %d loads %d calls %d\n", getpid(), gettid(), loads,
                     ++calls);
    int fd = open(copy, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, n) != n)
        return -1;
    close(fd);
    free(copy);
    free(big);
    free(line);
    return 4242;
}

/* A full 64-bit, negative result. */
API long inject_long(const char *arg)
{
    (void)arg;
    return -0x123456789abcdefL;
}

/* Clobbers every SSE register, the x87 and MXCSR control words; returns 5. */
API int inject_clobber(const char *arg)
{
    (void)arg;
    unsigned mx = 0x7f80; /* all exceptions masked, round toward zero */
    unsigned short cw = 0x0c7f;
    __asm__ volatile("pcmpeqd %%xmm0, %%xmm0\n\t"
                     "pcmpeqd %%xmm1, %%xmm1\n\tpcmpeqd %%xmm2, %%xmm2\n\t"
                     "pcmpeqd %%xmm3, %%xmm3\n\tpcmpeqd %%xmm4, %%xmm4\n\t"
                     "pcmpeqd %%xmm5, %%xmm5\n\tpcmpeqd %%xmm6, %%xmm6\n\t"
                     "pcmpeqd %%xmm7, %%xmm7\n\tpcmpeqd %%xmm8, %%xmm8\n\t"
                     "pcmpeqd %%xmm9, %%xmm9\n\tpcmpeqd %%xmm10, %%xmm10\n\t"
                     "pcmpeqd %%xmm11, %%xmm11\n\tpcmpeqd %%xmm12, %%xmm12\n\t"
                     "pcmpeqd %%xmm13, %%xmm13\n\tpcmpeqd %%xmm14, %%xmm14\n\t"
                     "pcmpeqd %%xmm15, %%xmm15\n\t"
                     "ldmxcsr %0\n\tfldcw %1"
                     :
                     : "m"(mx), "m"(cw)
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                       "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    return 5;
}

/* Dereferences address 16. */
API int inject_crash(const char *arg)
{
    (void)arg;
    return *(volatile int *)16;
}

/* Sleeps ARG seconds. */
API int inject_sleep(const char *arg)
{
    sleep(atoi(arg));
    return 1;
}

/* Says "called" on the process's stdout (the test reads it: the call has begun), then
 * sleeps an hour (the injector abandons it at its deadline). */
API int inject_tell_sleep(const char *arg)
{
    (void)arg;
    if (write(1, "called\n", 7) != 7)
        return -1;
    sleep(3600);
    return 1;
}

/* Signals the process while the injector holds the thread: SIGUSR1 by kill(), SIGUSR2 by
 * raise(), SIGRTMIN twice by sigqueue (values 11 and 22); returns 7. */
API int inject_signals(const char *arg)
{
    (void)arg;
    union sigval v;
    kill(getpid(), SIGUSR1);
    raise(SIGUSR2);
    v.sival_int = 11;
    sigqueue(getpid(), SIGRTMIN, v);
    v.sival_int = 22;
    sigqueue(getpid(), SIGRTMIN, v);
    return 7;
}

/* Queues ARG SIGRTMIN+1 to its own process, with the values 1, 2... ARG, all while the
 * injector holds the thread (each one stops it: it gets them when let go); returns how
 * many were queued. */
API int inject_rtburst(const char *arg)
{
    int n = atoi(arg), k = 0;
    for (union sigval v = {0}; k < n; k++) {
        v.sival_int = k + 1;
        if (sigqueue(getpid(), SIGRTMIN + 1, v) < 0)
            break;
    }
    return k;
}
