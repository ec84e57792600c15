/* The scan at exit of a lone thread with a big trace (tests/test_scan.py,
 * test_lone_scan_falls_back_to_mmleak_scan_by_affinity): 250,000 blocks allocated and freed
 * (about 16 MiB of trace: mmleak-scan's live set would start its parsers), then 40 kept
 * (a list from a global), 10 lost (a chain of 3: one definitely, two indirectly lost).
 *
 *   scan_fallback one|all [heap]
 * one: the process is allowed on one CPU only (sched_setaffinity), all: on every CPU it was
 * given.  heap (test_lone_scan_falls_back_at_the_marking): no 250,000 blocks (a small
 * trace: the live set starts no thread), but one of 80 MiB kept (the marking's reader
 * would start, for a heap that spans 64 MiB or more).  Prints "done". */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node { struct node *next; char pad[120]; };   /* 128 bytes: no size of the loop's */

static struct node *volatile kept;
static void *volatile big;

static __attribute__((noinline)) void *grab(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    memset(p, 0, n);
    return p;
}

/* the blocks, planted in a function of their own, then the stack below main's frame wiped:
 * no stale copy of a pointer is left where a scan reads (as tests/scan_cases.c does) */
static __attribute__((noinline)) void plant(int heap)
{
    for (int i = 0; i < (heap ? 0 : 250000); i++)
        free(grab(24 + (size_t)(i & 7) * 8));
    if (heap && !(big = malloc((size_t)80 << 20)))
        abort();
    for (int i = 0; i < 40; i++) {
        struct node *n = grab(sizeof *n);
        n->next = kept;
        kept = n;
    }
    for (int i = 0; i < 10; i++) {
        struct node *a = grab(sizeof *a), *b = grab(sizeof *b), *c = grab(sizeof *c);
        a->next = b;
        b->next = c;
    }
}

static __attribute__((noinline)) void wipe(void)
{
    volatile char junk[64 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3 || (strcmp(argv[1], "one") && strcmp(argv[1], "all")) ||
        (argc == 3 && strcmp(argv[2], "heap")))
        return 2;
    if (!strcmp(argv[1], "one")) {
        cpu_set_t cur, one;
        if (sched_getaffinity(0, sizeof cur, &cur))
            return 1;
        CPU_ZERO(&one);
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &cur)) {
                CPU_SET(c, &one);
                break;
            }
        if (sched_setaffinity(0, sizeof one, &one))
            return 1;
    }
    plant(argc == 3);
    wipe();
    puts("done");
    return 0;
}
