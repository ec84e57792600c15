/* blocks of each size class an alternate allocator handles apart, each lost, and kept:
 * small (48), large (64 KiB), huge (4 MiB); to run with LD_PRELOAD=libjemalloc.so.2 or
 * libtcmalloc_minimal.so.4 after mmleak.so */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
void *kept[3];                  /* extern: the stores stay */
__attribute__((noinline)) static void *get(size_t n) { void *p = malloc(n); memset(p, 7, n); return p; }
__attribute__((noinline)) static void wipe(void) { volatile char j[65536]; memset((char *)j, 0, sizeof j); }
__attribute__((noinline)) static void plant(void)
{
    static const size_t sz[3] = { 48, 64 << 10, 4 << 20 };
    for (int i = 0; i < 3; i++) {
        kept[i] = get(sz[i]);
        (void)get(sz[i] + 8);      /* lost */
    }
    for (int i = 0; i < 100; i++)  /* churn: freed blocks */
        free(get(16 + i * 40));
}
int main(void) { plant(); wipe(); puts("done"); return 0; }
