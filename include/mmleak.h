/* mmleak.h: what a program may ask of mmleak (see mmleak-scan(7)).
 *
 *   #include <mmleak.h>
 *   ...
 *   int r = mmleak_leak_check();   // 1: leaks, 0: none, -1: not traced or cannot scan
 *
 * mmleak_leak_check asks the tracer for a reachability scan now, like LeakSanitizer's
 * __lsan_do_recoverable_leak_check: every thread of the process is stopped while the scan
 * reads the registers, the trace and the memory (by ptrace; where the kernel refuses it, a
 * process not dumpable after setuid for one, by a real-time signal the program leaves at
 * its default, after which each thread goes back to where it was, but a call such as poll
 * or nanosleep it was in returns EINTR; a thread that blocks every signal then leaves no
 * verdict; see mmleak-scan(7), "While the program runs"; one call at a time, another
 * thread's waits), the caller waits for the verdict, and the
 * result is written next to the trace (mmleak.ID.scan.S, the newest is what `mmleak.py
 * report` shows).  It returns 1 when some block is definitely or indirectly lost, 0 when
 * none is, -1 when the program is not traced (mmleak.so not loaded, or not tracing) or the
 * scan could not be done.  The function mmleak.so defines is declared weak: a program
 * built with this header links and runs unchanged without mmleak.so (the call returns -1).
 * No link flag is needed. */
#ifndef MMLEAK_H
#define MMLEAK_H

#ifdef __cplusplus
extern "C" {
#endif

/* defined by mmleak.so; weak, so absent (NULL) in a process without it */
extern int mmleak_do_leak_check(void) __attribute__((weak));

static inline int mmleak_leak_check(void)
{
    return mmleak_do_leak_check ? mmleak_do_leak_check() : -1;
}

#ifdef __cplusplus
}
#endif

#endif
