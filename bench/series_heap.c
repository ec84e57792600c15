/* bench/series_heap.c: a daemon with a big live heap whose blocks are replaced slowly (the
 * running trace's points of the series, bench/series_points.py).  It keeps N blocks of 64
 * bytes alive (keep_one), then for SECONDS seconds replaces R of them a second, at random
 * (replace_one: the old block freed, a new one of 80 bytes kept in its place), and makes as
 * many short-lived pairs (churn_one: never alive at a point).  Nothing is freed at exit.
 *
 *     series_heap [-n N] [-t SECONDS] [-r R] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void **blocks;
volatile unsigned long sink;

static __attribute__((noinline)) void *keep_one(void) { return malloc(64); }
static __attribute__((noinline)) void *replace_one(void) { return malloc(80); }
static __attribute__((noinline)) void churn_one(void)
{
    char *p = malloc(48);
    p[0] = 1;
    sink += (unsigned long)p[0];
    free(p);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    unsigned long n = 3000000, rate = 2000;
    double seconds = 60;
    int c;
    while ((c = getopt(argc, argv, "n:t:r:")) != -1) {
        switch (c) {
        case 'n': n = strtoul(optarg, NULL, 10); break;
        case 't': seconds = atof(optarg); break;
        case 'r': rate = strtoul(optarg, NULL, 10); break;
        default:
            fprintf(stderr, "usage: series_heap [-n N] [-t SECONDS] [-r R]\n");
            return 2;
        }
    }
    blocks = calloc(n, sizeof *blocks);
    if (!blocks)
        return 1;
    for (unsigned long i = 0; i < n; i++)
        blocks[i] = keep_one();
    fprintf(stderr, "built %lu blocks\n", n);
    unsigned long x = 88172645463325252UL, done = 0;
    double t0 = now();
    while (now() - t0 < seconds) {
        /* R replacements a second, in batches of R/100 every 10 ms */
        for (unsigned long k = 0; k < (rate + 99) / 100; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            unsigned long i = x % n;
            free(blocks[i]);
            blocks[i] = replace_one();
            churn_one();
            done++;
        }
        usleep(10000);
    }
    fprintf(stderr, "replaced %lu\n", done);
    return 0;
}
