/* Hostile processes for mmleak.so (tests/test_hostile.py): each mode is one way a program
 * once broke the tracer.  Every leaking call carries "site:NAME"; everything else is freed.
 * Built -O0: at -O1 GCC deletes free(malloc(n)). */
#define _GNU_SOURCE
#include <alloca.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink;
static void keep(void *p) { sink = p; }

/* n allocation/free pairs: enough of them fill the staging halves and force flushes */
static void churn(long n)
{
    for (long i = 0; i < n; i++)
        free(malloc(16 + (size_t)(i % 200)));
}

/* The test's go: one byte on stdin.  0 when it came, 1 when stdin ended first. */
static int wait_go(void)
{
    char c;
    return read(0, &c, 1) != 1;
}

/* Say "ready" and wait for the test's go (wait_go). */
static int ready_then_go(void)
{
    puts("ready");
    return wait_go();
}

/* ---- 1. threads whose exit frees dlerror()/strerror() buffers after our destructor ---- */
static void *dlerr_body(void *arg)
{
    (void)arg;
    void *h = dlopen("/nonexistent/mmleak-none.so", RTLD_NOW);
    if (h)
        dlclose(h);
    keep(strerror(123456));     /* an unknown number: glibc formats it into a thread buffer */
    churn(10);
    return NULL;
}

static int dlerr_fork(int nthreads)
{
    for (int i = 0; i < nthreads; i++) {
        pthread_t t;
        pthread_create(&t, NULL, dlerr_body, NULL);
        pthread_join(t, NULL);
    }
    keep(malloc(771));                          /* site:dlerr_parent */
    pid_t c = fork();
    if (c == 0) {
        keep(malloc(772));                      /* site:dlerr_child */
        exit(0);
    }
    int st;
    waitpid(c, &st, 0);
    printf("child %s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "failed");
    return 0;
}

/* ---- 1b. threads that fail a dlopen before tracing starts (MMLEAK_PAUSED, then attach),
 * and end after: the free of their dlerror() buffer at exit is their first event ---- */
static pthread_barrier_t late_go;

static void *late_body(void *arg)
{
    (void)arg;
    void *h = dlopen("/nonexistent/mmleak-none.so", RTLD_NOW);
    if (h)
        dlclose(h);
    keep(strerror(123456));
    pthread_barrier_wait(&late_go);             /* ready */
    pthread_barrier_wait(&late_go);             /* traced now: end */
    return NULL;
}

static int dlerr_attach(int nthreads)
{
    pthread_t t[100];
    pthread_barrier_init(&late_go, NULL, (unsigned)nthreads + 1);
    for (int i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, late_body, NULL);
    pthread_barrier_wait(&late_go);
    if (ready_then_go())                        /* the test attaches meanwhile */
        return 1;
    pthread_barrier_wait(&late_go);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    keep(malloc(773));                          /* site:dlerr_attach */
    churn(1000);
    puts("dlerr_attach done");
    return 0;
}

/* ---- 4d. events staged, then the test lowers our RLIMIT_FSIZE and detaches ---- */
static int detach_fsize(void)
{
    signal(SIGXFSZ, SIG_DFL);
    if (ready_then_go())                        /* attached now */
        return 1;
    keep(malloc(1302));                         /* site:detach_staged */
    churn(300);                                 /* staged, not flushed */
    puts("staged");
    if (wait_go())                              /* detached now */
        return 1;
    puts("detach_fsize done");
    return 0;
}

/* ---- 2. allocator functions, for LD_PRELOAD with jemalloc/tcmalloc ---- */
static int allocator(void)
{
    /* every entry point mmleak provides, each block freed by the program with free() */
    char *a = strdup("hello");
    char *b = strndup("hello world", 5);
    int *c = reallocarray(NULL, 10, sizeof(int));
    void *d = pvalloc(100);
    void *e = valloc(100);
    void *f = aligned_alloc(64, 128);
    void *g = memalign(32, 100);
    void *h = calloc(4, 8);
    void *pm = NULL;
    if (posix_memalign(&pm, 64, 100))
        return 1;
    free(a); free(b); free(c); free(d); free(e); free(f); free(g); free(h); free(pm);
    churn(1000);
    keep(strdup("leaked!"));                    /* site:alloc_strdup */
    keep(reallocarray(NULL, 3, 100));           /* site:alloc_reallocarray */
    keep(pvalloc(5000));                        /* site:alloc_pvalloc */
    keep(malloc(333));                          /* site:alloc_malloc */
    puts("allocator done");
    return 0;
}

/* Lower RLIMIT_NOFILE to 64 and open /dev/null until no descriptor is left: FDS gets them
 * (the caller closes them), their number is returned. */
static int use_all_fds(int fds[64])
{
    struct rlimit r = { 64, 64 };
    setrlimit(RLIMIT_NOFILE, &r);
    int n = 0;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0)
            break;
        fds[n++] = fd;
    }
    return n;
}

/* ---- 3. no descriptor left while a flush is due ---- */
static int nofile(long window, int pre)
{
    if (pre) {                                  /* the thread's file exists before the window */
        keep(malloc(500));                      /* site:nofile_pre */
        churn(pre);
    }
    int fds[64], n = use_all_fds(fds);
    keep(malloc(501));                          /* site:nofile_during */
    churn(window);                              /* flushes fail here: EMFILE */
    keep(malloc(502));                          /* site:nofile_during2 */
    while (n > 0)
        close(fds[--n]);
    churn(5000);
    keep(malloc(503));                          /* site:nofile_after */
    puts("nofile done");
    return 0;
}

/* ---- 3c. the first event after a long failure: the one that finds writing works again ---- */
static int recover_first(void)
{
    keep(malloc(510));                          /* site:recover_pre */
    int fds[64], n = use_all_fds(fds);
    churn(100000);                              /* far more than the staging area holds */
    while (n > 0)
        close(fds[--n]);
    sleep(2);                                   /* the next event tries to write again */
    keep(malloc(511));                          /* site:recover_first */
    churn(100);
    puts("recover done");
    return 0;
}

/* ---- 3f. issue 17 #10: a transient EMFILE, then a leak once descriptors are free ---- */
static int nofile_leak(long pairs, int step)
{
    keep(malloc(505));                          /* site:nofile_leak_pre */
    int fds[64], n = use_all_fds(fds);
    churn(pairs);                               /* 2 * PAIRS events, no descriptor free */
    while (n > 0)
        close(fds[--n]);
    if (step) {                                 /* writing is retried while we run on */
        churn(step);
        if (ready_then_go())
            return 1;
    }
    keep(malloc(506));                          /* site:nofile_leak */
    puts("nofile_leak done");
    return 0;
}

/* ---- issue 17 #5: the test does something to the dump directory while we wait ---- */
static int pause_churn(long pairs, int wait)
{
    keep(malloc(541));                          /* site:pause_before */
    churn(100);
    if (ready_then_go())
        return 1;
    churn(pairs);                               /* flushes (and rotations) after the deed */
    keep(malloc(542));                          /* site:pause_after */
    puts("pause done");
    while (wait)                                /* to be killed */
        pause();
    return 0;
}

/* ---- issue 17 #5: a daemon that drops root after the test did something ---- */
static int setuid_pause(void)
{
    keep(malloc(551));                          /* site:setuid_before */
    churn(100);
    if (ready_then_go())
        return 1;
    if (setgid(65534) || setuid(65534))
        return 4;
    churn(1000);
    keep(malloc(552));                          /* site:setuid_after */
    puts("setuid done");
    return 0;
}

/* ---- issue 17 #15: a worker renames itself over its arguments, as PostgreSQL does ---- */
static int retitle(int argc, char **argv, const char *title)
{
    char t[256];
    snprintf(t, sizeof t, "%s", title);         /* it may be in the area written over */
    char *end = argv[argc - 1] + strlen(argv[argc - 1]);
    memset(argv[0], 0, (size_t)(end - argv[0]));
    snprintf(argv[0], (size_t)(end - argv[0]) + 1, "%s", t);
    keep(malloc(561));                          /* site:retitle */
    puts("retitle done");
    return 0;
}

/* ---- 3d. a disk full when the trace starts, then room again (the test frees it) ---- */
static int waitdisk(void)
{
    keep(malloc(921));                          /* site:disk_before */
    if (ready_then_go())                        /* the tracer met the full disk: room now */
        return 1;
    churn(5000);
    keep(malloc(922));                          /* site:disk_after */
    puts("waitdisk done");
    return 0;
}

/* ---- 3e. the program's own file takes descriptor 2, then writing fails for a while ---- */
static int stderr_taken(const char *data)
{
    keep(malloc(520));                          /* site:stderr_before */
    churn(100);
    close(2);
    int fd = open(data, O_RDWR | O_CREAT | O_TRUNC, 0600);     /* descriptor 2 */
    if (fd != 2 || write(fd, "precious data\n", 14) != 14)
        return 2;
    struct rlimit r = { 8, 8 };
    setrlimit(RLIMIT_NOFILE, &r);
    int fds[8], n = 0;
    for (;;) {
        int f = open("/dev/null", O_RDONLY);
        if (f < 0)
            break;
        fds[n++] = f;
    }
    churn(100000);                              /* mmleak cannot write: it says so, once */
    while (n > 0)
        close(fds[--n]);
    puts("stderr_taken done");
    return 0;
}

/* ---- 3f. a umask that takes the owner's write permission ---- */
static int strict_umask(void)
{
    umask(0777);
    keep(malloc(530));                          /* site:umask_leak */
    churn(50000);
    puts("umask done");
    return 0;
}

/* ---- 4. a file size limit ---- */
static int fsize(long limit, long events)
{
    signal(SIGXFSZ, SIG_DFL);
    struct rlimit r = { (rlim_t)limit, (rlim_t)limit };
    if (setrlimit(RLIMIT_FSIZE, &r))
        return 2;
    keep(malloc(601));                          /* site:fsize_before */
    churn(events);
    keep(malloc(602));                          /* site:fsize_after */
    puts("fsize done");
    return 0;
}

/* ---- 4b. the limit lowered below what the thread's file already holds ---- */
static int fsize_late(long before, long limit, long after)
{
    signal(SIGXFSZ, SIG_DFL);
    keep(malloc(611));                          /* site:fsize_late_before */
    churn(before);
    struct rlimit r = { (rlim_t)limit, (rlim_t)limit };
    if (setrlimit(RLIMIT_FSIZE, &r))
        return 2;
    keep(malloc(612));                          /* site:fsize_late_after */
    churn(after);
    puts("fsize_late done");
    return 0;
}

/* ---- 4c. plugins loaded and unloaded in turn under a file size limit: the log of loads
 * (mmleak.ID.loads) grows at every unload ---- */
static int fsize_dl(long limit, int cycles, const char *lib0, const char *lib1)
{
    signal(SIGXFSZ, SIG_DFL);
    struct rlimit r = { (rlim_t)limit, (rlim_t)limit };
    if (setrlimit(RLIMIT_FSIZE, &r))
        return 2;
    for (int k = 0; k < cycles; k++) {
        void *h = dlopen(k % 2 ? lib1 : lib0, RTLD_NOW);
        if (!h)
            return 4;
        void *(*leak)(size_t) = (void *(*)(size_t))dlsym(h, "dl_leak");
        free(leak(20));
        dlclose(h);
    }
    puts("fsize_dl done");
    return 0;
}

/* ---- 5. threads starting (creating their files) while the process drops root ---- */
static pthread_barrier_t go;

static void *uid_body(void *arg)
{
    pthread_barrier_wait(&go);
    keep(malloc(700 + (size_t)(long)arg));      /* site:uid_thread */
    churn(20000);
    return NULL;
}

static int uidrace(int nthreads)
{
    pthread_t t[16];
    pthread_barrier_init(&go, NULL, (unsigned)nthreads + 1);
    for (long i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, uid_body, (void *)i);
    pthread_barrier_wait(&go);
    if (setresuid(65534, 65534, 65534))
        return 3;
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    keep(malloc(799));                          /* site:uid_main */
    return 0;
}

/* ---- 5c. one thread acting as another user for a while, as file servers do per request:
 * a raw setresuid (glibc's would change every thread) or setfsuid, then back ---- */
static const char *creds_how;

static void *creds_body(void *arg)
{
    (void)arg;
    keep(malloc(740));                          /* site:creds_root */
    churn(10);                                  /* this thread's file exists, root's */
    for (size_t req = 0; req < 5; req++) {
        uid_t who = 65533 + (uid_t)(req % 2);   /* another user at each request */
        if (!strcmp(creds_how, "fsuid"))
            setfsuid(who);
        else
            syscall(SYS_setresuid, -1, who, -1);
        keep(malloc(741 + req));                /* site:creds_request */
        churn(20000);                           /* flushes, as the other user */
        if (!strcmp(creds_how, "fsuid"))
            setfsuid(0);
        else
            syscall(SYS_setresuid, -1, 0, -1);
    }
    return NULL;
}

static int threadcreds(const char *how)
{
    creds_how = how;
    pthread_t t;
    pthread_create(&t, NULL, creds_body, NULL);
    pthread_join(t, NULL);
    puts("threadcreds done");
    return 0;
}

/* Install the seccomp filter F of N instructions (with no_new_privs, as an unprivileged
 * process must): 0, or -1. */
static int install_filter(struct sock_filter *f, size_t n)
{
    struct sock_fprog prog = { (unsigned short)n, f };
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
                   syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)
               ? -1
               : 0;
}

/* ---- 5d. a seccomp filter that kills the process at setfsuid (a unit's
 * SystemCallFilter=~@privileged): mmleak must not call it on its own ---- */
static int no_setfsuid(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_setfsuid, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (install_filter(f, sizeof f / sizeof f[0]))
        return 5;
    keep(malloc(750));                          /* site:seccomp_leak */
    churn(50000);                               /* flushes, new files */
    puts("no_setfsuid done");
    return 0;
}

/* ---- 5e. a seccomp filter like sshd's sandbox (its privilege-separated child): it kills
 * at prlimit64 and sigaltstack, which mmleak makes (a flush, a new stack) and the program
 * does not, and fails openat.  Installed with prctl (sshd) or syscall(SYS_seccomp)
 * (libseccomp: chronyd -F 1); then a churn that flushes, a thread, and a normal exit ---- */
static void *sandboxed_thread(void *arg)
{
    (void)arg;
    keep(malloc(760));                          /* site:sandbox_thread_leak */
    return NULL;
}

static int sandbox(const char *how)
{
    keep(malloc(755));                          /* site:sandbox_before */
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prlimit64, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_sigaltstack, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat, 2, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EACCES),
    };
    struct sock_fprog prog = { sizeof f / sizeof f[0], f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return 5;
    if (strcmp(how, "prctl") ? syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)
                             : prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        return 6;
    keep(malloc(757));                          /* site:sandbox_after */
    churn(50000);
    pthread_t t;
    if (pthread_create(&t, NULL, sandboxed_thread, NULL) || pthread_join(t, NULL))
        return 7;
    puts("sandbox done");
    return 0;
}

/* ---- 5f. a seccomp filter that kills at madvise(MADV_HUGEPAGE), and then over a thousand
 * stacks: mmleak must not give the memo of walks its huge page under the filter ---- */
static __attribute__((noinline)) void hp_leaf(void)
{
    free(malloc(24));
    __asm__ volatile("" ::: "memory");          /* not a tail call: this frame stays */
}

static __attribute__((noinline)) void hp_at(size_t k)
{
    volatile char *p = alloca(16 * k);          /* each k: hp_leaf's frame at another sp */
    p[0] = 0;
    hp_leaf();
    __asm__ volatile("" ::: "memory");
}

static int no_hugepage(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_madvise, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 14 /* MADV_HUGEPAGE */, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (install_filter(f, sizeof f / sizeof f[0]))
        return 5;
    keep(malloc(765));                          /* site:hugepage_leak */
    for (size_t k = 1; k <= 3000; k++)
        hp_at(k);
    puts("no_hugepage done");
    return 0;
}

/* ---- 5b. a plugin unloaded before and after the process drops root ---- */
static int dlsetuid(const char *lib0, const char *lib1)
{
    for (int k = 0; k < 2; k++) {
        if (k == 1 && setresuid(65534, 65534, 65534))
            return 3;
        void *h = dlopen(k ? lib1 : lib0, RTLD_NOW);
        if (!h)
            return 4;
        void *(*leak)(size_t) = (void *(*)(size_t))dlsym(h, "dl_leak");
        keep(leak(730 + (size_t)k));
        churn(3000);
        dlclose(h);
    }
    puts("dlsetuid done");
    return 0;
}

/* ---- 6. vfork() child that allocates before exec; a child of a raw fork system call ---- */
static int do_vfork(void)
{
    keep(malloc(801));                          /* site:vfork_before */
    pid_t c = vfork();
    if (c == 0) {
        /* the parent's memory: this block is the parent's and is never freed */
        keep(malloc(802));                      /* site:vfork_child */
        churn(2000);                            /* a flush, from the child */
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(c, &st, 0);
    keep(malloc(803));                          /* site:vfork_after */
    churn(3000);
    printf("vfork child %d\n", WEXITSTATUS(st));
    return 0;
}

static int rawfork(void)
{
    keep(malloc(811));                          /* site:raw_before */
    churn(100);
    long c = syscall(SYS_fork);
    if (c == 0) {
        keep(malloc(812));                      /* site:raw_child */
        churn(3000);
        _exit(0);
    }
    int st;
    waitpid((pid_t)c, &st, 0);
    keep(malloc(813));                          /* site:raw_after */
    churn(3000);
    printf("raw child %d\n", WEXITSTATUS(st));
    return 0;
}

/* ---- 9. chroot ---- */
static int do_chroot(const char *root, int close_all)
{
    keep(malloc(901));                          /* site:chroot_before */
    if (chroot(root) || chdir("/"))
        return 4;
    churn(5000);                                /* flushes after the chroot */
    if (close_all)
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    keep(malloc(902));                          /* site:chroot_after */
    churn(5000);
    return 0;
}

/* ---- 3b. several threads writing until the disk is full ---- */
static void *fill_body(void *arg)
{
    keep(malloc(950 + (size_t)(long)arg));      /* site:fill_thread */
    churn(200000);
    return NULL;
}

static int fill(int nthreads)
{
    pthread_t t[16];
    for (long i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, fill_body, (void *)i);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    puts("fill done");
    return 0;
}

/* ---- stacks in a process that is then killed (tests/test_stacks.py) ---- */
static int stackwait(void)
{
    for (int i = 0; i < 3; i++) {
        char *p;
        if (asprintf(&p, "%0100d", i) > 0)      /* site:stack_asprintf */
            keep(p);
    }
    churn(100);
    puts("ready");
    char c;
    if (read(0, &c, 1) < 0)
        return 1;
    return 0;
}

/* ---- 11. (nothing to do: MMLEAK_DIR is refused at start) ---- */

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(mode, "dlerr_fork")) return dlerr_fork(argc > 2 ? atoi(argv[2]) : 3);
    if (!strcmp(mode, "allocator")) return allocator();
    if (!strcmp(mode, "nofile")) return nofile(atol(argv[2]), argc > 3 ? atoi(argv[3]) : 0);
    if (!strcmp(mode, "fsize")) return fsize(atol(argv[2]), atol(argv[3]));
    if (!strcmp(mode, "recover")) return recover_first();
    if (!strcmp(mode, "nofile_leak"))
        return nofile_leak(atol(argv[2]), argc > 3 ? atoi(argv[3]) : 0);
    if (!strcmp(mode, "pause")) return pause_churn(atol(argv[2]), argc > 3);
    if (!strcmp(mode, "setuid_pause")) return setuid_pause();
    if (!strcmp(mode, "retitle")) return retitle(argc, argv, argv[2]);
    if (!strcmp(mode, "no_setfsuid")) return no_setfsuid();
    if (!strcmp(mode, "sandbox")) return sandbox(argv[2]);
    if (!strcmp(mode, "no_hugepage")) return no_hugepage();
    if (!strcmp(mode, "umask")) return strict_umask();
    if (!strcmp(mode, "stderr_taken")) return stderr_taken(argv[2]);
    if (!strcmp(mode, "detach_fsize")) return detach_fsize();
    if (!strcmp(mode, "fsize_dl"))
        return fsize_dl(atol(argv[2]), atoi(argv[3]), argv[4], argv[5]);
    if (!strcmp(mode, "dlerr_attach")) return dlerr_attach(atoi(argv[2]));
    if (!strcmp(mode, "threadcreds")) return threadcreds(argv[2]);
    if (!strcmp(mode, "fsize_late")) return fsize_late(atol(argv[2]), atol(argv[3]), atol(argv[4]));
    if (!strcmp(mode, "dlsetuid")) return dlsetuid(argv[2], argv[3]);
    if (!strcmp(mode, "waitdisk")) return waitdisk();
    if (!strcmp(mode, "stackwait")) return stackwait();
    if (!strcmp(mode, "fill")) return fill(atoi(argv[2]));
    if (!strcmp(mode, "uidrace")) return uidrace(atoi(argv[2]));
    if (!strcmp(mode, "vfork")) return do_vfork();
    if (!strcmp(mode, "rawfork")) return rawfork();
    if (!strcmp(mode, "chroot")) return do_chroot(argv[2], argc > 3);
    if (!strcmp(mode, "plain")) {
        keep(malloc(1101));                     /* site:plain */
        return 0;
    }
    fprintf(stderr, "adversary: unknown mode %s\n", mode);
    return 2;
}
