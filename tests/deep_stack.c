/* A recursion 12 deep under main, then one leak at the bottom (tests/test_export.py,
 * test_default_records_whole_stacks): with default settings its stack must reach main
 * and go on to _start.  rec's work after the call keeps every level a real frame. */
#include <stdlib.h>

static volatile int sink;

static __attribute__((noinline)) void *rec(int n)
{
    if (n == 0)
        return malloc(4321);        /* site:deep */
    void *p = rec(n - 1);
    sink += n;
    return p;
}

int main(void)
{
    return rec(12) == NULL;         /* site:main */
}
