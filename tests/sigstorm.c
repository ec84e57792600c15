/* Signal handlers that allocate while the main loop allocates (tests/test_tracer.py): every
 * event of both must be recorded intact.  Prints the number of handler runs. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile long hits;
static void *volatile sink;

static void handler(int s)
{
    (void)s;
    void *p = malloc(48);   /* site:handler */
    sink = p;
    free(p);
    hits++;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (long i = 0; i < 500000; i++) {
        void *p = malloc(16 + (size_t)(i % 100));
        sink = p;
        free(p);
    }
    memset(&it, 0, sizeof it);
    setitimer(ITIMER_REAL, &it, NULL);
    sink = malloc(999);     /* site:storm_leak */
    char b[32];
    int n = snprintf(b, sizeof b, "%ld\n", hits);
    return write(1, b, (size_t)n) == n ? 0 : 1;
}
