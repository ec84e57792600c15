/* How much stack does a thread's first malloc take?  The thread runs on a stack we made and
 * painted, so the lowest byte changed below the caller's frame is the high-water mark.  Under
 * mmleak this is the deepest moment of the tracer: the thread's dump and staging files are
 * made in it (test_hostile.py compares it with the same program untraced, where glibc makes
 * the thread's arena). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SZ (1 << 20)
static char *lo;
static void *volatile sink;

static size_t depth(const char *sp)
{
    const char *p = lo;
    while (p < sp && *p == (char)0xa5)
        p++;
    return (size_t)(sp - p);
}

static __attribute__((noinline)) void *body(void *arg)
{
    (void)arg;
    char here;
    sink = malloc(16);                  /* site:first_malloc */
    size_t d = depth(&here);
    printf("%zu\n", d);
    return NULL;
}

int main(void)
{
    lo = mmap(NULL, SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (lo == MAP_FAILED)
        return 1;
    memset(lo, 0xa5, SZ);
    pthread_attr_t a;
    pthread_t t;
    if (pthread_attr_init(&a) || pthread_attr_setstack(&a, lo, SZ) ||
        pthread_create(&t, &a, body, NULL) || pthread_join(t, NULL))
        return 1;
    return 0;
}
