/* tracer/unguessable.h: eight bytes nobody can guess, for the tracer (the jump past names
 * planted in the dump directory: dumpdir.c, threadfile.c, lifecycle.c, maps.c) and for the
 * scan's files (tools/scan_result.c: the names of a scan's files past the first 64), which
 * mmleak-scan and mmleak.so's own copy of the scan both carry.  One definition, inline in
 * each object, as the scan has no library of the tracer's to call.
 *
 * Safe wherever it is used: in a signal handler, in a vfork or CLONE_VM child, at _exit, in
 * the scan's child that shares the program's memory.  It makes system calls only
 * (getrandom, and else clock_gettime, a vDSO read, and getpid: all async-signal-safe),
 * allocates nothing, takes no lock, and leaves errno as it found it (a failed getrandom
 * sets it; our callers' callers are the program's code).  GRND_NONBLOCK: getrandom never
 * waits for the kernel's entropy pool at boot; a seccomp filter or an old kernel that
 * refuses it gives the clock instead, mixed with the pid (two processes in the same
 * nanosecond still differ).
 *
 * The system call: mml_sys (tracer/internal.h, included first by every tracer file: the
 * instruction itself, never mmleak.so's syscall() interposer), else syscall(), which
 * tools/scan_inproc.h turns into the same instruction in mmleak.so's copy of the scan and
 * which is the C library's in mmleak-scan. */
#ifndef MMLEAK_UNGUESSABLE_H
#define MMLEAK_UNGUESSABLE_H

#include <errno.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef mml_sys
#define MML_GETRANDOM_(buf, n) mml_sys(SYS_getrandom, (buf), (n), 1 /* GRND_NONBLOCK */)
#else
#define MML_GETRANDOM_(buf, n) syscall(SYS_getrandom, (buf), (n), 1 /* GRND_NONBLOCK */)
#endif

static inline uint64_t unguessable(void)
{
    int saved = errno;
    uint64_t r = 0;
    if (MML_GETRANDOM_(&r, sizeof r) != (long)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        r = ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec) +
            (uint64_t)getpid();
    }
    errno = saved;
    return r;
}

#endif
