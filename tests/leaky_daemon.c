/* A small daemon with a known leak, run as a systemd service by tests/test_systemd.py.
 *
 *   leaky_daemon N SIZE [CHURN [K]]
 *
 * It handles 1000 "requests" (malloc, strdup, realloc, calloc, all freed), remembers N of
 * them in blocks of SIZE bytes that it never frees (in remember(), its "site:" line), then
 * handles CHURN more requests (default 0; 8 events each: enough of them make mmleak.so rotate
 * its dump file, for the compactor to fold), writes its pid to $STATE_DIRECTORY/ready (a
 * rename, so the file is whole when it appears), then waits for SIGTERM without allocating
 * anything more: its dump files no longer change, and the leak is exactly N blocks of SIZE
 * bytes from remember().  Output through write(2) only (stdio would allocate a buffer of its
 * own).
 *
 * With K (tests/test_systemd.py attaches to it with `mmleak.py attach`): after "ready" it
 * keeps serving, one request a millisecond (serve_request(): one malloc and one free, both
 * made inside libc's qsort, where the injector never stops a thread: tools/inject.c,
 * "Which thread"), so that an attach or a detach never falls inside a request and an
 * attached window holds whole requests only.  On SIGUSR1 it leaks K blocks of SIZE bytes
 * (window_leak(), its "site:" line), serves one more request, then writes the total number
 * of blocks leaked that way to $STATE_DIRECTORY/leaked (a rename): a window that saw the
 * signal and the file has exactly K blocks not freed, from window_leak(), and at least one
 * request.  (With requests 64 times longer, so that an attach or a detach often comes
 * during one, a comparison function of its own, user code between the malloc and the
 * free, left a request's block at the edge of 14 windows out of 40; strcmp, none.)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h> /* snprintf only: no stdio streams */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
static void *volatile sink;

NOINLINE static void handle_request(int i)
{
    char *buf = malloc(64 + i % 200);
    memset(buf, 'r', 63);
    buf[63] = '\0';
    char *copy = strdup(buf);
    copy = realloc(copy, 200 + i % 50);
    int *counts = calloc(16, sizeof *counts);
    sink = copy;
    free(counts);
    free(copy);
    free(buf);
}

NOINLINE static void remember(size_t size)
{
    sink = malloc(size); /* site:remember */
}

NOINLINE static void window_leak(size_t size)
{
    sink = malloc(size); /* site:window_leak */
}

/* One request: qsort() of 128 strings of 16 bytes, compared by strcmp: glibc's qsort
 * allocates a 2 KB buffer and frees it before it returns, and everything it calls is in
 * libc (no comparison function of ours): the request's malloc and free are made inside
 * libc, where the injector never stops a thread. */
NOINLINE static void serve_request(unsigned seed)
{
    char v[128][16];
    for (unsigned i = 0; i < 128; i++)
        snprintf(v[i], sizeof v[i], "%08x", (seed + i) * 2654435761u);
    qsort(v, 128, sizeof v[0], (int (*)(const void *, const void *))(void (*)(void))strcmp);
}

static volatile sig_atomic_t leak_asked;

static void on_usr1(int sig)
{
    (void)sig;
    leak_asked = 1;
}

static int write_file(const char *state, const char *name, long value)
{
    char tmp[4096], path[4096], text[32];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", state, name);
    snprintf(path, sizeof path, "%s/%s", state, name);
    int len = snprintf(text, sizeof text, "%ld\n", value);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, text, (size_t)len) != len || close(fd) != 0)
        return -1;
    return rename(tmp, path);
}

static int fail(const char *what)
{
    char line[256];
    int n = snprintf(line, sizeof line, "leaky_daemon: %s failed\n", what);
    ssize_t r = write(2, line, (size_t)n);
    (void)r;
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5)
        return fail("usage: leaky_daemon N SIZE [CHURN [K]];");
    int n = atoi(argv[1]);
    size_t size = (size_t)atol(argv[2]);
    long churn = argc >= 4 ? atol(argv[3]) : 0;
    long k = argc == 5 ? atol(argv[4]) : 0;
    const char *state = getenv("STATE_DIRECTORY"); /* set by StateDirectory= */
    if (state == NULL)
        return fail("getenv(STATE_DIRECTORY)");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    if (argc == 5 && sigaction(SIGUSR1, &sa, NULL) != 0)
        return fail("sigaction(SIGUSR1)");
    for (int i = 0; i < 1000; i++) {
        handle_request(i);
        if (i % 100 == 0 && i / 100 < n)
            remember(size);
    }
    for (int i = 10; i < n; i++)
        remember(size);
    for (long i = 0; i < churn; i++)
        handle_request((int)(i % 1000));

    if (write_file(state, "ready", (long)getpid()) != 0)
        return fail("writing $STATE_DIRECTORY/ready");
    if (argc < 5) {
        for (;;)
            pause();
    }
    long leaked = 0;
    for (unsigned r = 0;; r++) {
        serve_request(r);
        if (leak_asked) {
            leak_asked = 0;
            for (long i = 0; i < k; i++)
                window_leak(size);
            leaked += k;
            serve_request(r);
            if (write_file(state, "leaked", leaked) != 0)
                return fail("writing $STATE_DIRECTORY/leaked");
        }
        struct timespec ms = { 0, 1000000 };
        while (nanosleep(&ms, &ms) != 0 && errno == EINTR && !leak_asked)
            ;
    }
}
