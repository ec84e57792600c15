/* tests/test_stacks.py: stacks that differ only in which of two call sites of a recursive
 * function made each call are distinct stacks.  Sixteen paths of depth 4, each a sequence of
 * the two sites X and Y; X Y Y X and Y X X Y (paths 6 and 9) differ by +d -d -d +d at four
 * consecutive frames, which a hash linear in the frames (a sum of frame times a weight linear
 * in its index) cannot tell apart, whatever d is: a deep recursion through a function with
 * several call sites (CPython's evaluator, a parser) makes such pairs.  Each leaf prints its
 * callers as backtrace() sees them (the first time), then leaks one block whose size names
 * its path; the paths are taken four times, so that the second walk of a path may be served
 * by the memo of walks (tracer/memo.c), which must not take one path's walk for the other's. */
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>

static void *volatile sink;

static int round_;

__attribute__((noinline)) static void leaf(int size)
{
    if (round_ == 0) {
        void *b[64];
        int n = backtrace(b, 64);
        printf("%d", size);
        for (int i = 1; i < n; i++)
            printf(" %lx", (unsigned long)b[i] - 1);
        printf("\n");
    }
    sink = malloc((size_t)size);
}

/* The two calls differ in the code after them, so the compiler keeps two call sites (two
 * return addresses) and makes no tail call. */
__attribute__((noinline)) static void rec(int depth, unsigned path, int size)
{
    if (depth == 0) {
        leaf(size);
        __asm__ volatile("");
        return;
    }
    if (path & 1) {
        rec(depth - 1, path >> 1, size);            /* site Y */
        __asm__ volatile("nop");
    } else {
        rec(depth - 1, path >> 1, size);            /* site X */
        __asm__ volatile("nop\n\tnop");
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* 9 right after 6: the memo's record of 6's walk is then the newest of the start's ways */
    static const unsigned order[16] = {0, 1, 2, 3, 4, 5, 6, 9, 7, 8, 10, 11, 12, 13, 14, 15};
    for (round_ = 0; round_ < 4; round_++)
        for (int i = 0; i < 16; i++)
            rec(4, order[i], 200 + (int)order[i]);
    return 0;
}
