/* A small daemon with a known leak, run as a systemd service by tests/test_systemd.py.
 *
 *   leaky_daemon N SIZE [CHURN]
 *
 * It handles 1000 "requests" (malloc, strdup, realloc, calloc, all freed), remembers N of
 * them in blocks of SIZE bytes that it never frees (in remember(), its "site:" line), then
 * handles CHURN more requests (default 0; 8 events each: enough of them make mmleak.so rotate
 * its dump file, for the compactor to fold), writes its pid to $STATE_DIRECTORY/ready (a
 * rename, so the file is whole when it appears), then waits for SIGTERM without allocating
 * anything more: its dump files no longer change, and the leak is exactly N blocks of SIZE
 * bytes from remember().  Output through write(2) only (stdio would allocate a buffer of its
 * own).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h> /* snprintf only: no stdio streams */
#include <stdlib.h>
#include <string.h>
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
    if (argc != 3 && argc != 4)
        return fail("usage: leaky_daemon N SIZE [CHURN];");
    int n = atoi(argv[1]);
    size_t size = (size_t)atol(argv[2]);
    long churn = argc == 4 ? atol(argv[3]) : 0;
    const char *state = getenv("STATE_DIRECTORY"); /* set by StateDirectory= */
    if (state == NULL)
        return fail("getenv(STATE_DIRECTORY)");
    for (int i = 0; i < 1000; i++) {
        handle_request(i);
        if (i % 100 == 0 && i / 100 < n)
            remember(size);
    }
    for (int i = 10; i < n; i++)
        remember(size);
    for (long i = 0; i < churn; i++)
        handle_request((int)(i % 1000));

    char tmp[4096], ready[4096], text[32];
    snprintf(tmp, sizeof tmp, "%s/ready.tmp", state);
    snprintf(ready, sizeof ready, "%s/ready", state);
    int len = snprintf(text, sizeof text, "%d\n", (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, text, (size_t)len) != len || close(fd) != 0)
        return fail("writing $STATE_DIRECTORY/ready.tmp");
    if (rename(tmp, ready) != 0)
        return fail("rename to $STATE_DIRECTORY/ready");
    for (;;)
        pause();
}
