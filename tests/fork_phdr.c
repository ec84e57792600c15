/* A thread parked inside dl_iterate_phdr (the loader's write lock held) while main forks; the
 * child allocates, leaks and ends.  fork_phdr [prog|own|none] [exit|_exit] [LIB]:
 *   prog  the thread is the program's, parked in its own dl_iterate_phdr callback;
 *   own   the thread is parked inside mmleak.so's own dl_iterate_phdr, the check of the loaded
 *         objects at its first allocation, by tests/phdr_park.c (preloaded after mmleak.so);
 *   none  the thread is parked on a pipe, outside the loader: the lock is free at the fork;
 *   exit  the child ends with exit() (the scan at exit runs), _exit: with _exit();
 *   LIB   a library (tests/dl_lib.c) the parent loads first, or with none the child (it
 *         can: nothing holds the lock); the child leaks through it too.
 * The child leaks 48 bytes in main (its "site" mark) and 77 through LIB's dl_leak, prints
 * "child PID ok"; the parent prints "child status N" (its exit status), or "child hung"
 * (status 3) when it has not ended within 60 s (a working child takes well under a second:
 * the limit is for a hang, not for a slow machine; the parent then kills the child, so that
 * no hung process is left behind).  Untraced the child never calls
 * dl_iterate_phdr; traced, mmleak.so's check of the loaded objects in the child did, and the
 * lock that fork copied held waited forever (test_tracer.py,
 * test_fork_while_the_loader_lock_is_held).
 * Built with -DGAP -no-pie (test_fork_stuck_with_segments_apart): the program's .bss is
 * 2 MiB-aligned, so its segments are mapped apart (tests/gap_stack.c) and _dl_find_object
 * knows it segment by segment; its data segment starts with its TLS image, a forged ELF
 * header whose one PT_LOAD spans every address (from 0: the load bias of a program not
 * PIE); the child also keeps a block of 64 bytes from that .bss (far_away).  A child killed
 * by a signal: the parent prints "child signal N" instead of its status. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int in_cb[2], go_on[2];

#ifdef GAP
void *far_away[512] __attribute__((aligned(1 << 21)));
/* the ELF header, then at 64 one PT_LOAD: p_vaddr 0, p_memsz 1 << 47 (0x80 at byte 45) */
__thread unsigned char forged[64 + 56] = { 0x7f, 'E', 'L', 'F', 2, 1, 1, [0x20] = 64,
                                           [0x36] = 56, [0x38] = 1, [64] = 1, [109] = 0x80 };
#endif

static int cb(struct dl_phdr_info *i, size_t n, void *d)
{
    (void)i; (void)n; (void)d;
    char c = 1;
    if (write(in_cb[1], &c, 1) != 1 || read(go_on[0], &c, 1) != 1)
        abort();
    return 1;
}

static void *parked(void *a)
{
    void *volatile q = malloc(20);  /* a thread mmleak.so has seen */
    free(q);
    if (a)
        cb(NULL, 0, NULL);          /* none: outside the loader */
    else
        dl_iterate_phdr(cb, NULL);
    return NULL;
}

/* this thread's first allocation: mmleak.so opens its files and checks the loaded objects,
 * where phdr_park.c parks it */
static void *own_parked(void *a)
{
    void (*arm)(int, int, int) = (void (*)(int, int, int))a;
    arm(gettid(), in_cb[1], go_on[0]);
    void *volatile p = malloc(33);
    free(p);
    return NULL;
}

int main(int argc, char **argv)
{
    int own = argc > 1 && !strcmp(argv[1], "own"), none = argc > 1 && !strcmp(argv[1], "none");
    int use_exit = argc > 2 && !strcmp(argv[2], "exit");
    const char *lib = argc > 3 ? argv[3] : NULL;
    void *(*dl_leak)(size_t) = NULL;
    if (lib && !none) {
        void *h = dlopen(lib, RTLD_NOW);
        if (!h || !(dl_leak = (void *(*)(size_t))dlsym(h, "dl_leak")))
            return 1;
    }
    void *arm = own ? dlsym(RTLD_DEFAULT, "phdr_park_arm") : NULL;
    if (pipe(in_cb) || pipe(go_on) || (own && !arm))
        return 1;
    pthread_t t;
    pthread_create(&t, NULL, own ? own_parked : parked, own ? arm : none ? "none" : NULL);
    char c;
    if (read(in_cb[0], &c, 1) != 1)
        return 1;
    pid_t p = fork();
    if (p == 0) {
        if (lib && none) {
            void *h = dlopen(lib, RTLD_NOW);
            if (!h || !(dl_leak = (void *(*)(size_t))dlsym(h, "dl_leak")))
                _exit(1);
        }
        for (int i = 0; i < 100000; i++) {
            void *volatile q = malloc(100 + i % 1000);
            free(q);
        }
        void *volatile keep = malloc(48);   /* site:child */
        if (dl_leak)
            keep = dl_leak(77);
        (void)keep;
#ifdef GAP
        far_away[0] = malloc(64);           /* site:far */
#endif
        printf("child %d ok\n", (int)getpid());
        fflush(stdout);
        if (use_exit)
            exit(0);
        _exit(0);
    }
    int st = 0;
    for (int k = 0; k < 600; k++) {         /* 60 s */
        if (waitpid(p, &st, WNOHANG) == p) {
            if (WIFSIGNALED(st))
                printf("child signal %d\n", WTERMSIG(st));
            else
                printf("child status %d\n", WEXITSTATUS(st));
            if (write(go_on[1], "x", 1) != 1)
                return 1;
            pthread_join(t, NULL);
            return 0;
        }
        usleep(100000);
    }
    printf("child hung\n");
    kill(p, 9);
    waitpid(p, &st, 0);
    if (write(go_on[1], "x", 1) != 1)
        return 1;
    pthread_join(t, NULL);
    return 3;
}
