/* Loaded with dlopen() and unloaded again by tests/hostile.c ("dl" mode). */
#include <stdlib.h>

void *dl_leak(size_t n)
{
    return malloc(n); /* site:dl */
}

#ifdef GAP
/* -DGAP (tests/test_tracer.py): a 2 MiB-aligned .bss, the object's segments far apart */
char dl_far_away[4096] __attribute__((aligned(1 << 21)));
#endif
