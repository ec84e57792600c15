/* scan_api.c: the program asks for scans itself (include/mmleak.h): first with nothing lost
 * (prints 0), then after leaking one block (prints 1).  Without mmleak.so it prints -1 -1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmleak.h"

void *g_kept;

__attribute__((noinline)) static void leak(void)
{
    volatile char *p = malloc(4321);
    p[0] = 1;
}

__attribute__((noinline)) static void wipe(void)
{
    volatile char junk[64 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

int main(void)
{
    g_kept = malloc(100);
    int a = mmleak_leak_check();
    leak();
    wipe();
    int b = mmleak_leak_check();
    printf("%d %d\n", a, b);
    return 0;
}
