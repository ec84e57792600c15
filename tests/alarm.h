/* A timer signal for the test programs whose signal handlers allocate while the main code
 * does (tests/sigstorm.c, tests/memo_stacks.c). */
#ifndef MMLEAK_TESTS_ALARM_H
#define MMLEAK_TESTS_ALARM_H
#include <signal.h>
#include <string.h>
#include <sys/time.h>

/* Run HANDLER on SIGALRM every USEC microseconds of real time, interrupted calls restarted. */
static inline void alarm_every(void (*handler)(int), long usec)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, usec}, {0, usec}};
    setitimer(ITIMER_REAL, &it, NULL);
}

/* Stop the timer of alarm_every (a signal already pending is still delivered). */
static inline void alarm_stop(void)
{
    struct itimerval off;
    memset(&off, 0, sizeof off);
    setitimer(ITIMER_REAL, &off, NULL);
}
#endif
