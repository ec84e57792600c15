/* An allocator hook in a field of a global struct, as sqlite's sqlite3Config.m.xMalloc:
 * built -fPIC (as a shared library's code is), the struct's address comes from the GOT into
 * a register that the function keeps, and the hook is called as `call [rbx+0x8]`.
 * mem_malloc (the configured hook: a size header before the block) and cfg_malloc (calls
 * it, counts) are wrappers: the sites are main's lines, 3 x 40 and 1 x 24. */
#include <stdio.h>
#include <stdlib.h>

#define W __attribute__((noipa))

W void *mem_malloc(int n) {
    long *p = malloc(n + 8);
    if (!p) return NULL;
    p[0] = n;
    return p + 1;
}

struct mem_methods { int enabled; void *(*x_malloc)(int); long count; long bytes; };
struct mem_methods mem_config = { 1, mem_malloc, 0, 0 };

W void *cfg_malloc(int n) {
    if (n <= 0 || !mem_config.enabled)
        return NULL;
    void *p = mem_config.x_malloc(n);
    if (p) {
        mem_config.count++;
        mem_config.bytes += n;
    }
    return p;
}

int main(int argc, char **argv) {
    (void)argv;
    void *a[3];
    for (int i = 0; i < 3; i++)
        a[i] = cfg_malloc(31 + argc);                            /* site:hook3 */
    void *b = cfg_malloc(15 + argc);                             /* site:hook1 */
    printf("%ld %ld %d\n", mem_config.count, mem_config.bytes, a[2] != b);
    return 0;
}
