/* tests/test_stacks.py: the stack mmleak.so records for an allocation equals glibc's
 * backtrace() at the same place.  Each leaf prints its callers as backtrace() sees them, then
 * leaks one block of a size that names it. */
#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *volatile sink;

__attribute__((noinline)) static void leaf(int size)
{
    void *b[64];
    int n = backtrace(b, 64);
    printf("%d", size);
    for (int i = 1; i < n; i++)
        printf(" %lx", (unsigned long)b[i] - 1);
    printf("\n");
    sink = malloc((size_t)size);
}

__attribute__((noinline)) static void a3(int s) { leaf(s); __asm__ volatile(""); }
__attribute__((noinline)) static void a2(int s) { a3(s); __asm__ volatile(""); }
__attribute__((noinline)) static void a1(int s) { a2(s); __asm__ volatile(""); }
__attribute__((noinline)) static void b2(int s) { leaf(s); __asm__ volatile(""); }

static void *thread_body(void *arg)
{
    (void)arg;
    a1(303);
    return NULL;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    a1(301);
    b2(302);
    pthread_t t;
    pthread_create(&t, NULL, thread_body, NULL);
    pthread_join(t, NULL);
    return 0;
}
