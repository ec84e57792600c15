/* Whose calls of syscall() and prctl() does a library after mmleak.so in LD_PRELOAD see?
 * (tests/test_tracer.py, test_mmleaks_own_system_calls_are_not_the_programs)
 *
 * Built twice.  With -DOWN_CALLS_LIB, a library that defines syscall() and prctl(): each
 * call writes "own_calls: syscall NR" or "own_calls: prctl OPTION" on stderr, then goes
 * on to the C library's.  Preloaded after mmleak.so, it is what mmleak.so's interposers
 * pass the program's calls on to; mmleak.so's own calls must not reach it.
 * Without: the program.  It calls syscall(SYS_getpid) twice and prctl(PR_GET_DUMPABLE)
 * once, and nothing else does; a thread allocates with a stack (its file, its staging
 * mapping), one block is left lost, and the exit scans it (one thread left: the scan in
 * mmleak.so's child). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef OWN_CALLS_LIB
static void note(const char *what, long v)
{
    char b[64];
    int n = snprintf(b, sizeof b, "own_calls: %s %ld\n", what, v);
    if (write(2, b, (size_t)n) < 0) {
        /* nowhere else to say it */
    }
}

long syscall(long nr, ...)
{
    static long (*next)(long, ...);
    va_list ap;
    va_start(ap, nr);
    long a[6];
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    note("syscall", nr);
    if (!next)
        next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return next(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

int prctl(int option, ...)
{
    static int (*next)(int, ...);
    va_list ap;
    va_start(ap, option);
    unsigned long a[4];
    for (int i = 0; i < 4; i++)
        a[i] = va_arg(ap, unsigned long);
    va_end(ap);
    note("prctl", option);
    if (!next)
        next = (int (*)(int, ...))dlsym(RTLD_NEXT, "prctl");
    return next(option, a[0], a[1], a[2], a[3]);
}
#else
#include <pthread.h>

static void *volatile keep[64];

static __attribute__((noinline)) void *grab(size_t n)
{
    return malloc(n);
}

static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 64; i++)
        keep[i] = grab(32 + (size_t)i);
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    return NULL;
}

int main(void)
{
    if (syscall(SYS_getpid) != getpid() || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) < 0)
        return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) || pthread_join(t, NULL))
        return 1;
    keep[0] = grab(4321);
    keep[0] = NULL;                     /* lost */
    if (syscall(SYS_getpid) != getpid())
        return 1;
    puts("own_calls done");
    return 0;
}
#endif
