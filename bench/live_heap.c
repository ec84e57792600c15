/* bench/live_heap.c: a big live heap (issue 19).  N blocks of SIZE bytes (default 10 million
 * of 100 bytes) kept alive in linked lists from a global, plus LOST blocks (default 1,000)
 * whose last pointer is dropped.  Everything is still allocated at exit: a tracer must carry
 * N + LOST survivors to its report.
 *
 *     live_heap [-n N] [-s SIZE] [-l LOST]
 *
 * Allocation sites: the kept blocks come from keep_one() (one call site), the lost ones from
 * lose_one() (another): the report must name exactly two sites, N and LOST blocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LISTS 64

struct node { struct node *next; };

struct node *lists[LISTS];          /* the roots: every kept block is reachable from here */
volatile unsigned long sink;

static __attribute__((noinline)) void keep_one(size_t size, unsigned long i)
{
    struct node *n = malloc(size);
    if (!n) {
        perror("malloc");
        exit(1);
    }
    n->next = lists[i % LISTS];
    lists[i % LISTS] = n;
}

static __attribute__((noinline)) void lose_one(size_t size)
{
    char *p = malloc(size);
    if (!p) {
        perror("malloc");
        exit(1);
    }
    memset(p, 1, size < 16 ? size : 16);
    sink += (unsigned long)p[1];   /* p's last copy dies here */
}

int main(int argc, char **argv)
{
    unsigned long n = 10000000, lost = 1000;
    size_t size = 100;
    int c;
    while ((c = getopt(argc, argv, "n:s:l:")) != -1) {
        switch (c) {
        case 'n': n = strtoul(optarg, NULL, 0); break;
        case 's': size = strtoul(optarg, NULL, 0); break;
        case 'l': lost = strtoul(optarg, NULL, 0); break;
        default:
            fprintf(stderr, "usage: live_heap [-n N] [-s SIZE] [-l LOST]\n");
            return 2;
        }
    }
    if (size < sizeof(struct node))
        size = sizeof(struct node);
    unsigned long every = lost ? (n / lost ? n / lost : 1) : 0, done = 0;
    for (unsigned long i = 0; i < n; i++) {
        keep_one(size, i);
        if (every && i % every == 0 && done < lost) {
            lose_one(size);
            done++;
        }
    }
    for (; done < lost; done++)     /* fewer kept blocks than lost ones */
        lose_one(size);
    return 0;
}
