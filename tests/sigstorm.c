/* Signal handlers that allocate while the main loop allocates (tests/test_tracer.py): every
 * event of both must be recorded intact.  Prints the number of handler runs. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "alarm.h"

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
    alarm_every(handler, 20);
    for (long i = 0; i < 500000; i++) {
        void *p = malloc(16 + (size_t)(i % 100));
        sink = p;
        free(p);
    }
    alarm_stop();
    sink = malloc(999);     /* site:storm_leak */
    char b[32];
    int n = snprintf(b, sizeof b, "%ld\n", hits);
    return write(1, b, (size_t)n) == n ? 0 : 1;
}
