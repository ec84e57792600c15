/* Loaded with dlopen() and unloaded again by tests/hostile.c ("dl" mode). */
#include <stdlib.h>

void *dl_leak(size_t n)
{
    return malloc(n); /* site:dl */
}
