/* scan_hostile.c: processes that make a scan's life hard (test_scan.py).  Each leaks one
 * block of 4321 bytes (definitely lost) and keeps others of 4321 bytes reachable:
 *   threads N   N threads, each holding one on its stack; waits for SIGTERM
 *   fork        forks and reaps children without pause; waits for SIGTERM
 *   seccomp     a seccomp filter that kills the process on clone/fork/vfork/execve, then
 *               exits 0 (a scan at exit must not get it killed)
 *   rlimit      RLIMIT_AS a little above what it uses, then exits 0
 *   fakelibc D  maps D/libc.so.6 (made empty), then, in a mount namespace of its own, mounts
 *               the FIFO D/fifo over that name, and leaves a joined thread's stack in
 *               glibc's cache (a scan then reads glibc's thread layout from "libc");
 *               waits for SIGTERM
 *   spin        main busy in the program's code (no system call) until SIGTERM, another
 *               thread holding one on its stack, asleep (usleep): the scan's copy is
 *               reaped by a thread that is in a system call, or not
 *   main-exited another one held only by main's frame, then main ends (pthread_exit); a
 *               thread waits until /proc says main is a zombie, then for SIGTERM, and
 *               calls exit(0) (main's frame is no root: that block is definitely lost)
 * Prints "ready" when set; exits 0 (status 3 if a child was not reaped right). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "term_wait.h"

void *g_kept;
static atomic_int held;

__attribute__((noinline)) static void *target(void) { return calloc(1, 4321); }

__attribute__((noinline)) static void leak(void)
{
    volatile char *p = target();
    p[0] = 1;
}

__attribute__((noinline)) static void wipe(void)
{
    volatile char junk[64 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

static void *holder(void *arg)
{
    (void)arg;
    void *volatile mine = target();
    atomic_fetch_add(&held, 1);
    /* asleep in nanosleep (the spin case wants a thread in a system call), but not every
     * millisecond: 500 threads waking so often kept both cores of a CI machine busy, and a
     * scan (and the tests beside it) waited for the CPU past their timeouts */
    while (!atomic_load(&terminated))
        usleep(100000);
    free(mine);
    return NULL;
}

static void *quick(void *arg)
{
    return arg;
}

/* A mapping named D/libc.so.6 whose name, in the process's own mount namespace, now opens a
 * FIFO: the name is the process's to choose; the scan must not block on it. */
static int fake_libc(const char *d)
{
    char lib[4096], fifo[4096];
    snprintf(lib, sizeof lib, "%s/libc.so.6", d);
    snprintf(fifo, sizeof fifo, "%s/fifo", d);
    int fd = open(lib, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, 4096))
        return -1;
    /* low, so that the scan meets it before the real libc */
    void *m = mmap((void *)0x200000000, 4096, PROT_READ, MAP_PRIVATE | MAP_FIXED_NOREPLACE,
                   fd, 0);
    close(fd);
    if (m == MAP_FAILED || mkfifo(fifo, 0600) || unshare(CLONE_NEWNS) ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
        mount(fifo, lib, NULL, MS_BIND, NULL))
        return -1;
    pthread_t t;
    if (pthread_create(&t, NULL, quick, NULL) || pthread_join(t, NULL))
        return -1;
    return 0;
}

/* main-exited: the thread left once main ended (a zombie until the process ends, with no
 * memory of its own: /proc/PID/maps is empty) */
static void *after_main(void *arg)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)getpid());
    for (int tries = 0; tries < 10000; tries++) {       /* 10 s at most */
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        buf[n > 0 ? n : 0] = 0;
        char *st = strrchr(buf, ')');
        if (st && (st[2] == 'Z' || st[2] == 'X')) {
            ready_until_term();
            exit(0);
        }
        usleep(1000);
    }
    (void)arg;
    exit(3);                            /* main never ended */
}

__attribute__((noinline)) static void main_exits(void)
{
    void *volatile mine = target();
    pthread_t t;
    if (pthread_create(&t, NULL, after_main, NULL))
        exit(2);
    __asm__ volatile("" ::"r"(mine) : "memory");
    pthread_exit(NULL);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (!strcmp(argv[1], "fakelibc") && (argc < 3 || fake_libc(argv[2])))
        return 2;
    term_ends_wait();
    g_kept = target();
    leak();
    wipe();
    if (!strcmp(argv[1], "threads")) {
        int n = argc > 2 ? atoi(argv[2]) : 500;
        pthread_t *t = calloc((size_t)n, sizeof *t);
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setstacksize(&a, 64 * 1024);
        for (int i = 0; i < n; i++)
            if (pthread_create(&t[i], &a, holder, NULL))
                return 2;
        while (atomic_load(&held) < n)
            usleep(1000);
        ready_until_term();
        for (int i = 0; i < n; i++)
            pthread_join(t[i], NULL);
        free(t);
        return 0;
    }
    if (!strcmp(argv[1], "fork")) {
        say_ready();
        while (!atomic_load(&terminated)) {
            pid_t c = fork();
            if (c == 0)
                _exit(7);
            if (c < 0) {
                if (errno != EAGAIN)
                    return 3;
                continue;
            }
            int st;
            pid_t r;
            while ((r = waitpid(c, &st, 0)) < 0 && errno == EINTR)
                ;
            if (r != c || !WIFEXITED(st) || WEXITSTATUS(st) != 7)
                return 3;
        }
        return 0;
    }
    if (!strcmp(argv[1], "seccomp")) {
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 5, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 4, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fork, 3, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_vfork, 2, 0),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_execve, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        };
        struct sock_fprog prog = { sizeof f / sizeof f[0], f };
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
            return 2;
        say_ready();
        return 0;
    }
    if (!strcmp(argv[1], "main-exited"))
        main_exits();
    if (!strcmp(argv[1], "spin")) {
        pthread_t t;
        if (pthread_create(&t, NULL, holder, NULL))
            return 2;
        while (atomic_load(&held) < 1)
            usleep(1000);
        say_ready();
        while (!atomic_load(&terminated))
            ;
        pthread_join(t, NULL);
        return 0;
    }
    if (!strcmp(argv[1], "fakelibc")) {
        ready_until_term();
        return 0;
    }
    if (!strcmp(argv[1], "rlimit")) {
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        long vm = 0;
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "VmSize:", 7))
                vm = atol(line + 7);
        if (f)
            fclose(f);
        struct rlimit rl = { (rlim_t)(vm + 8192) * 1024, (rlim_t)(vm + 8192) * 1024 };
        if (setrlimit(RLIMIT_AS, &rl))
            return 2;
        say_ready();
        return 0;
    }
    return 2;
}
