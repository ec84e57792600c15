/* tests/test_stacks.py: the stack writer's shortcut (a thread's recent walk stamped with the
 * fact that its file already holds the stack) must end with the file.  Two call paths, 12 and
 * 3 frames deep, allocate and free in turn, STEPS times each, in the main thread and then in a
 * second thread (which continues the first thread's parked file, if it was parked); with
 * MMLEAK_ROTATE_MB=1 each thread goes through several files, and every file must define
 * every stack it references.  Prints "steps N" at the end. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))
#define STEPS 100000

static void *volatile sink;

NOINLINE static void step(int i)
{
    void *p = malloc(16 + (size_t)(i & 63));
    sink = p;
    free(p);
}

NOINLINE static void deep(int n, int i)
{
    if (n > 0)
        deep(n - 1, i);
    else
        step(i);
    __asm__ volatile("" ::: "memory");
}

NOINLINE static void *run(void *arg)
{
    (void)arg;
    for (int i = 0; i < STEPS; i++) {
        deep(12, i);
        deep(3, i);
    }
    return NULL;
}

int main(void)
{
    run(NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, run, NULL) || pthread_join(t, NULL))
        return 1;
    printf("steps %d\n", 2 * 2 * STEPS);
    return 0;
}
