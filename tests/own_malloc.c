/* A program with its own malloc (here a counting layer over glibc's): under mmleak.so it must
 * run exactly as without it, every allocation function included (tests/test_hostile.py). */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_calloc(size_t, size_t);

static long nmalloc, nfree;

void *malloc(size_t n) { nmalloc++; return __libc_malloc(n); }
void free(void *p) { if (p) nfree++; __libc_free(p); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void *calloc(size_t k, size_t n) { nmalloc++; return __libc_calloc(k, n); }

int main(void)
{
    char *s = strdup("hello"), *t = strndup("world", 3);
    void *pm = NULL;
    int rc = posix_memalign(&pm, 64, 100);
    void *m = memalign(32, 100), *a = aligned_alloc(64, 128), *v = valloc(100);
    int *r = reallocarray(NULL, 10, sizeof(int));
    printf("posix_memalign=%d memalign=%d aligned_alloc=%d valloc=%d reallocarray=%d\n", rc,
           m != NULL, a != NULL, v != NULL, r != NULL);
    free(s); free(t); free(pm); free(m); free(a); free(v); free(r);
    printf("own malloc calls=%ld frees=%ld\n", nmalloc, nfree);
    return 0;
}
