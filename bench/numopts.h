/* bench/numopts.h: the command line of a benchmark program, options "-X NUMBER" only
 * (bench/alloc_bench.c, bench/attach_target.c, bench/stacks_bench.c). */
#ifndef MMLEAK_BENCH_NUMOPTS_H
#define MMLEAK_BENCH_NUMOPTS_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct numopt {
    char letter;        /* -LETTER NUMBER */
    long *value;        /* set to NUMBER; left as it is (the default) when not given */
};

/* Read ARGV's options into the N values of OPTS; on an unknown option, a missing number, a
 * number that is not whole or out of range, or an operand: USAGE on stderr, and 0; else 1. */
static inline int numopts(int argc, char **argv, const struct numopt *opts, size_t n,
                          const char *usage)
{
    char spec[2 * 26 + 1];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 2 < sizeof spec; i++) {
        spec[k++] = opts[i].letter;
        spec[k++] = ':';
    }
    spec[k] = 0;
    int c;
    while ((c = getopt(argc, argv, spec)) != -1) {
        size_t i = 0;
        while (i < n && opts[i].letter != c)
            i++;
        char *end;
        errno = 0;
        long v = i < n ? strtol(optarg, &end, 10) : 0;
        if (i == n || errno || end == optarg || *end) {
            fprintf(stderr, "%s\n", usage);
            return 0;
        }
        *opts[i].value = v;
    }
    if (optind < argc) {
        fprintf(stderr, "%s\n", usage);
        return 0;
    }
    return 1;
}
#endif
