/* A scripted history of live blocks per call site (tests/test_compact.py): the growth series
 * and the incremental view are checked against it.  Commands on stdin, one per line, each
 * answered "ok" once done:
 *   a SITE N SIZE   allocate N blocks of SIZE bytes at call site SITE (0..3)
 *   f SITE N        free the N oldest live blocks of SITE
 *   c SITE N SIZE   allocate N blocks and free them at once (churn: never alive at a point)
 * Each site is a function of its own, so each has its own line. */
#include <stdio.h>
#include <stdlib.h>

#define MAXB 100000
static void *blocks[4][MAXB];
static long head[4], tail[4];

static __attribute__((noinline)) void *site0(size_t n) { return malloc(n); } /* site:hist0 */
static __attribute__((noinline)) void *site1(size_t n) { return malloc(n); } /* site:hist1 */
static __attribute__((noinline)) void *site2(size_t n) { return malloc(n); } /* site:hist2 */
static __attribute__((noinline)) void *site3(size_t n) { return malloc(n); } /* site:hist3 */

static void *alloc_at(int s, size_t n)
{
    switch (s) {
    case 0: return site0(n);
    case 1: return site1(n);
    case 2: return site2(n);
    default: return site3(n);
    }
}

int main(void)
{
    char line[128];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        char op;
        int s;
        long n, size = 0;
        if (sscanf(line, "%c %d %ld %ld", &op, &s, &n, &size) < 3 || s < 0 || s > 3)
            return 2;
        for (long i = 0; i < n; i++) {
            if (op == 'a') {
                if (tail[s] - head[s] >= MAXB)
                    return 3;
                blocks[s][tail[s]++ % MAXB] = alloc_at(s, (size_t)size);
            } else if (op == 'f') {
                if (head[s] == tail[s])
                    return 4;
                free(blocks[s][head[s]++ % MAXB]);
            } else if (op == 'c') {
                free(alloc_at(s, (size_t)size));
            }
        }
        printf("ok\n");
    }
    return 0;
}
