/* Test programs that run until the test sends SIGTERM (tests/scan_daemon.c,
 * tests/scan_hostile.c): "ready" on stdout when set, then wait for the signal. */
#ifndef MMLEAK_TESTS_TERM_WAIT_H
#define MMLEAK_TESTS_TERM_WAIT_H
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

/* 1 once SIGTERM came (after term_ends_wait): the program's threads and loops stop on it. */
static atomic_int terminated;

/* The self-pipe the handler writes a byte to: ready_until_term sleeps reading it.  (It slept
 * in `while (!terminated) pause();`, which loses a SIGTERM that comes between the test and
 * the pause: a scan on demand that interrupted the pause (ptrace) lets it restart when the
 * thread next runs, and on a loaded machine the SIGTERM came first, its handler ran, and
 * the pause began after it: the test waited 120 s for a process asleep for ever.) */
static int term_pipe[2] = { -1, -1 };

static void on_term(int sig)
{
    (void)sig;
    int e = errno;
    atomic_store(&terminated, 1);
    if (write(term_pipe[1], "", 1) < 0) {
        /* (cannot fail: a byte per SIGTERM, and they merge) */
    }
    errno = e;
}

/* From now on SIGTERM sets terminated instead of killing the process. */
static inline void term_ends_wait(void)
{
    if (pipe(term_pipe))
        _exit(2);
    fcntl(term_pipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(term_pipe[1], F_SETFD, FD_CLOEXEC);
    signal(SIGTERM, on_term);
}

/* Tell the test the program is set: "ready", flushed at once. */
static inline void say_ready(void)
{
    printf("ready\n");
    fflush(stdout);
}

/* say_ready, then sleep until SIGTERM came (whichever thread took it). */
static inline void ready_until_term(void)
{
    say_ready();
    char c;
    while (!atomic_load(&terminated))
        if (read(term_pipe[0], &c, 1) < 0 && errno != EINTR)
            _exit(2);
}
#endif
