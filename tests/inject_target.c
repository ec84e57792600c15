/* tests/inject_target.c: processes for tests/test_inject.py to inject into (tools/inject.c).
 * Each mode prints "ready" when in place, then what it saw, so that the test can check it
 * still behaves as if nothing happened:
 *   sleep          one nanosleep of LONG_SLEEP s, which the test ends with SIGUSR1 when it
 *                  is done (never the machine's speed: a loaded machine once took more than
 *                  the 1 s this sleep was before an injection ended): "nanosleep -1 EINTR
 *                  at_signal slept_enough", at_signal if the nanosleep ended only when our
 *                  SIGUSR1 came (EARLY if it ended before: an injection that ended it, or a
 *                  restart for too short a time), slept_enough if the time it slept plus the
 *                  time it had left (its REM) is at least the time asked (SHORT if not: a
 *                  restart for less than the time left, e.g. the 60 s of an abandoned call's
 *                  own sleep instead of the program's)
 *   read           read() on stdin: "read N TEXT", with counting handlers (SA_RESTART) for
 *                  SIGUSR1, SIGUSR2, SIGRTMIN: "usr1 A usr2 B rt C values V"
 *   rtcount        read() on stdin, counting SIGRTMIN+1 (SA_RESTART): "read N TEXT rt COUNT";
 *                  if some came with a value (sigqueue), also "values V in order|OUT OF ORDER"
 *                  (V the last value seen; in order: each value one more than the last)
 *   epoll          epoll_wait (no timeout) on stdin, then reads it: "epoll_wait R ERRNO"
 *                  for each return until the data came, then "read N TEXT"
 *   busy           user code only, sums 1.0 in a register until SIGUSR1: "busy same|DIFFER"
 *   threads N      N threads (main included) malloc/free as fast as they can until SIGUSR1:
 *                  "threads N ok"
 *   undumpable     prctl(PR_SET_DUMPABLE, 0), then as sleep
 *   segvblock [trap]  a SIGSEGV handler, SIGSEGV blocked (and SIGTRAP with "trap"), then the
 *                  nanosleep of sleep: "handler kept|LOST blocked kept|LOST", then as sleep
 *   mainexit       the main thread exits (pthread_exit), another one does as sleep
 *   ctor LIB       a thread sleeps in nanosleep while main dlopen()s LIB (whose constructor
 *                  waits: tests/inject_slowctor.c): "dlopen ok", then waits for the end of
 *                  stdin (the injected call may still run in the other thread)
 *   exitafter USECS  a thread in malloc/free all the time; main exits after USECS us
 *   blockread      every signal blocked (sigfillset), then read() on stdin: "read N TEXT" 
 *   seccomp HOW    under seccomp, then read() on stdin: "read N TEXT".  HOW: strict (strict
 *                  mode), kill-openat or kill-fallocate (a filter that kills the process at
 *                  that call), errno-openat (fails it with EPERM), errno-acct (fails acct,
 *                  which nothing here makes) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop, usr1, usr2, rt, rtvals;
static int started; /* churn threads past their first round */

static void on_stop(int s) { (void)s; stop = 1; }
static void on_usr1(int s) { (void)s; usr1++; }
static void on_usr2(int s) { (void)s; usr2++; }
static void on_rt(int s, siginfo_t *si, void *uc)
{
    (void)s, (void)uc;
    rt++;
    rtvals = rtvals * 100 + si->si_value.sival_int;
}
static void on_segv(int s) { (void)s; }
static volatile sig_atomic_t woken;
static void on_wake(int s) { (void)s; woken = 1; }

/* Longer than any test: the test ends the sleep with SIGUSR1 */
#define LONG_SLEEP 3600
static volatile long rtcount;
static volatile int rtlast, rtdisorder;
static void on_rtcount(int s, siginfo_t *si, void *uc)
{
    (void)s, (void)uc;
    rtcount++;
    if (si->si_code == SI_QUEUE && si->si_value.sival_int) {
        rtdisorder |= si->si_value.sival_int != rtlast + 1;
        rtlast = si->si_value.sival_int;
    }
}

static void handle(int sig, void (*fn)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, NULL);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void ready(void)
{
    printf("ready\n");
    fflush(stdout);
}

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(long)arg, n = 0;
    void *slot[64] = {0};
    int first = 1;
    do { /* at least once: a stop request may come at once */
        unsigned i = (seed = seed * 1103515245 + 12345) >> 16;
        free(slot[i % 64]);
        size_t sz = (i % 97 == 0) ? 200000 + i % 5000 : 16 + i % 600; /* some mmap'ed */
        slot[i % 64] = malloc(sz);
        if (slot[i % 64])
            ((char *)slot[i % 64])[0] = 1;
        n++;
        if (first) {
            first = 0;
            __atomic_add_fetch(&started, 1, __ATOMIC_SEQ_CST);
        }
    } while (!stop);
    for (int i = 0; i < 64; i++)
        free(slot[i]);
    return (void *)(long)(n > 0);
}

/* sleep's nanosleep, until SIGUSR1 (a handler without SA_RESTART: nanosleep is never
 * restarted after a handler, it returns EINTR with the time left in REM).  The time slept
 * plus the time left: the time asked, if every restart (after an injection, a stop, a
 * tracer) went on for the time that was left; more (a little, or the time slept before a
 * restart from the start); less only if a restart slept for less than was left. */
static void sleep_and_tell(void)
{
    struct timespec ts = {LONG_SLEEP, 0}, rem = {0, 0};
    double t0 = now();
    int r = nanosleep(&ts, &rem);
    int e = r ? errno : 0;
    double took = now() - t0, left = r ? rem.tv_sec + rem.tv_nsec / 1e9 : 0;
    printf("nanosleep %d %s %s %s\n", r, e ? strerrorname_np(e) : "0",
           woken ? "at_signal" : "EARLY",
           took + left >= LONG_SLEEP - 0.001 ? "slept_enough" : "SHORT");
    fflush(stdout);
}

static void *sleep_thread(void *arg)
{
    (void)arg;
    sleep_and_tell();
    return NULL;
}

static void *sleeper(void *arg)
{
    (void)arg;
    struct timespec ts = {LONG_SLEEP, 0};
    nanosleep(&ts, NULL);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "sleep") || !strcmp(mode, "segvblock") || !strcmp(mode, "undumpable") ||
        !strcmp(mode, "mainexit")) {
        struct sigaction wake;
        memset(&wake, 0, sizeof wake);
        wake.sa_handler = on_wake;
        sigaction(SIGUSR1, &wake, NULL);
        if (!strcmp(mode, "undumpable"))
            prctl(PR_SET_DUMPABLE, 0);
        if (!strcmp(mode, "segvblock")) {
            handle(SIGSEGV, on_segv);
            sigset_t s;
            sigemptyset(&s);
            sigaddset(&s, SIGSEGV);
            if (argc > 2 && !strcmp(argv[2], "trap"))
                sigaddset(&s, SIGTRAP);
            sigprocmask(SIG_BLOCK, &s, NULL);
        }
        if (!strcmp(mode, "mainexit")) {
            pthread_t t;
            pthread_create(&t, NULL, sleep_thread, NULL);
            ready();
            pthread_exit(NULL);
        }
        ready();
        sleep_and_tell();
        if (!strcmp(mode, "segvblock")) {
            struct sigaction sa;
            sigset_t cur;
            sigaction(SIGSEGV, NULL, &sa);
            sigprocmask(SIG_BLOCK, NULL, &cur);
            printf("handler %s blocked %s\n", sa.sa_handler == on_segv ? "kept" : "LOST",
                   sigismember(&cur, SIGSEGV) ? "kept" : "LOST");
        }
        return 0;
    }
    if (!strcmp(mode, "read")) {
        handle(SIGUSR1, on_usr1);
        handle(SIGUSR2, on_usr2);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_rt;
        sa.sa_flags = SA_RESTART | SA_SIGINFO;
        sigaction(SIGRTMIN, &sa, NULL);
        char buf[256];
        ready();
        ssize_t n = read(0, buf, sizeof buf - 1);
        int e = errno;
        if (n < 0) {
            printf("read -1 %s\n", strerrorname_np(e));
            return 1;
        }
        buf[n] = 0;
        buf[strcspn(buf, "\n")] = 0;
        printf("read %zd %s\n", n, buf);
        printf("usr1 %d usr2 %d rt %d values %d\n", (int)usr1, (int)usr2, (int)rt, (int)rtvals);
        return 0;
    }
    if (!strcmp(mode, "rtcount")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_rtcount;
        sa.sa_flags = SA_RESTART | SA_SIGINFO;
        sigaction(SIGRTMIN + 1, &sa, NULL);
        char buf[256];
        ready();
        ssize_t n = read(0, buf, sizeof buf - 1);
        if (n < 0) {
            printf("read -1 %s\n", strerrorname_np(errno));
            return 1;
        }
        buf[n] = 0;
        buf[strcspn(buf, "\n")] = 0;
        printf("read %zd %s rt %ld\n", n, buf, rtcount);
        if (rtlast)
            printf("values %d %s\n", rtlast, rtdisorder ? "OUT OF ORDER" : "in order");
        return 0;
    }
    if (!strcmp(mode, "epoll")) {
        int ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN}, got;
        epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
        ready();
        for (;;) {
            int r = epoll_wait(ep, &got, 1, -1);
            printf("epoll_wait %d %s\n", r, r < 0 ? strerrorname_np(errno) : "0");
            if (r == 1)
                break;
        }
        char buf[256];
        ssize_t n = read(0, buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = 0;
        buf[strcspn(buf, "\n")] = 0;
        printf("read %zd %s\n", n, buf);
        return 0;
    }
    if (!strcmp(mode, "busy")) {
        handle(SIGUSR1, on_stop);
        double x = 0;
        long n = 0;
        ready();
        while (!stop) {
            x += 1.0;
            n++;
        }
        printf("busy %s\n", x == (double)n && n > 0 ? "same" : "DIFFER");
        return 0;
    }
    if (!strcmp(mode, "threads")) {
        int nt = argc > 2 ? atoi(argv[2]) : 4;
        handle(SIGUSR1, on_stop);
        pthread_t t[64];
        for (int i = 1; i < nt && i < 64; i++)
            pthread_create(&t[i], NULL, churn, (void *)(long)i);
        while (__atomic_load_n(&started, __ATOMIC_SEQ_CST) < nt - 1)
            sched_yield();
        ready();
        long ok = (long)churn((void *)0L);
        for (int i = 1; i < nt && i < 64; i++) {
            void *r;
            pthread_join(t[i], &r);
            ok = ok && r;
        }
        printf("threads %d %s\n", nt, ok ? "ok" : "IDLE");
        return 0;
    }
    if (!strcmp(mode, "ctor") && argc > 2) {
        pthread_t t;
        pthread_create(&t, NULL, sleeper, NULL);
        ready();
        void *h = dlopen(argv[2], RTLD_NOW);
        printf("dlopen %s\n", h ? "ok" : dlerror());
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0)
            ;
        return 0;
    }
    if (!strcmp(mode, "blockread")) {
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_BLOCK, &all, NULL);
        char buf[64];
        ready();
        ssize_t n = read(0, buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = 0;
        printf("read %zd %s", n, buf);
        return 0;
    }
    if (!strcmp(mode, "exitafter") && argc > 2) {
        pthread_t t;
        pthread_create(&t, NULL, churn, (void *)1L);
        ready();
        usleep((useconds_t)atol(argv[2]));
        exit(0);
    }
    if (!strcmp(mode, "seccomp") && argc > 2) {
        const char *how = argv[2];
        char buf[64];
        if (!strcmp(how, "strict")) {
            fflush(stdout);
            if (syscall(SYS_prctl, PR_SET_SECCOMP, SECCOMP_MODE_STRICT))
                return 3;
            /* only read, write and exit from here */
            syscall(SYS_write, 1, "ready\n", 6);
            long n = syscall(SYS_read, 0, buf, sizeof buf);
            char out[80] = "read ";
            long k = 5;
            out[k++] = (char)('0' + (n > 9 ? 9 : n < 0 ? 0 : n));
            out[k++] = ' ';
            for (long i = 0; i < n && k < 70; i++)
                out[k++] = buf[i];
            out[k++] = '\n';
            syscall(SYS_write, 1, out, k);
            syscall(SYS_exit, 0);
        }
        int nr = strstr(how, "openat") ? SYS_openat : strstr(how, "fallocate") ? SYS_fallocate
                                                                                : SYS_acct;
        unsigned act = !strncmp(how, "kill", 4) ? SECCOMP_RET_KILL_PROCESS
                                                : SECCOMP_RET_ERRNO | EPERM;
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, act),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = { 4, f };
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER,
                                                             &prog))
            return 3;
        ready();
        ssize_t n = read(0, buf, sizeof buf - 1);
        buf[n > 0 ? n : 0] = 0;
        printf("read %zd %s\n", n, buf);
        return 0;
    }
    fprintf(stderr, "usage: inject_target sleep|read|busy|threads|segvblock|ctor|seccomp ...\n");
    return 2;
}
