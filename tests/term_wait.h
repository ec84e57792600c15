/* Test programs that run until the test sends SIGTERM (tests/scan_daemon.c,
 * tests/scan_hostile.c): "ready" on stdout when set, then wait for the signal. */
#ifndef MMLEAK_TESTS_TERM_WAIT_H
#define MMLEAK_TESTS_TERM_WAIT_H
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

/* 1 once SIGTERM came (after term_ends_wait): the program's threads and loops stop on it. */
static atomic_int terminated;

static void on_term(int sig)
{
    (void)sig;
    atomic_store(&terminated, 1);
}

/* From now on SIGTERM sets terminated instead of killing the process. */
static inline void term_ends_wait(void)
{
    signal(SIGTERM, on_term);
}

/* Tell the test the program is set: "ready", flushed at once. */
static inline void say_ready(void)
{
    printf("ready\n");
    fflush(stdout);
}

/* say_ready, then sleep until SIGTERM came. */
static inline void ready_until_term(void)
{
    say_ready();
    while (!atomic_load(&terminated))
        pause();
}
#endif
