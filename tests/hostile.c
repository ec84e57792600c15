/* A program whose leaks are known exactly, for the tracer tests (tests/test_tracer.py).
 *
 * Every leaking call carries a comment "site:NAME": the test finds that line in this file
 * and expects the leak to be reported exactly there, with the size given here.  Sizes are
 * distinct so that each one names its site.  Output goes through write(2) only: stdio would
 * allocate a buffer of its own.
 *
 *   hostile MODE [ARG]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h> /* snprintf only: no stdio streams */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
static void *volatile sink;
/* Taking malloc's address in code gives a non-PIE build a canonical PLT entry for it (an
 * initialised pointer would get a dynamic relocation instead): the case where
 * dlsym(RTLD_DEFAULT, "malloc") is the program's, not mmleak's (tests build it both ways). */
void *(*volatile malloc_address)(size_t);
static void keep(void *p) { sink = p; }
/* malloc+free the compiler cannot elide */
static void pair(size_t n) { void *p = malloc(n); sink = p; free(p); }
static void say(const char *s) { ssize_t r = write(1, s, strlen(s)); (void)r; }

/* ---- before main ---- */
static void *ctor_block;
__attribute__((constructor)) static void early(void)
{
    ctor_block = malloc(1001); /* site:ctor */
    pair(1002);                /* freed: must not show */
}

/* ---- every C entry point leaks one block, and frees one ---- */
NOINLINE static void entry_points(void)
{
    void *p;
    keep(malloc(101));                      /* site:malloc */
    keep(calloc(3, 34));                    /* site:calloc */
    p = malloc(10);
    keep(realloc(p, 103));                  /* site:realloc */
    p = malloc(11);
    keep(reallocarray(p, 4, 26));           /* site:reallocarray */
    if (posix_memalign(&p, 64, 105) == 0)   /* site:posix_memalign */
        keep(p);
    keep(aligned_alloc(64, 128));           /* site:aligned_alloc */
    keep(memalign(32, 107));                /* site:memalign */
    keep(valloc(108));                      /* site:valloc */
    keep(pvalloc(109));                     /* site:pvalloc */
    keep(strdup("0123456789"));             /* site:strdup */
    keep(strndup("0123456789abcdef", 12));  /* site:strndup */
    pair(200);
    p = calloc(2, 100);
    keep(p);
    free(p);
    p = realloc(NULL, 201);                 /* realloc(NULL) is malloc */
    p = realloc(p, 0);                      /* realloc(p, 0) frees */
    free(p);
    free(NULL);
}

/* ---- a chain of reallocs: only the last block survives ---- */
NOINLINE static void realloc_chain(void)
{
    void *p = malloc(16);
    for (int i = 1; i <= 20; i++)
        p = realloc(p, 16 + 100 * (size_t)i); /* site:chain */
    keep(p);
}

/* ---- threads ---- */
static void *shared[64];
static int detached_done;

NOINLINE static void *thread_body(void *arg)
{
    long id = (long)arg;
    keep(malloc(300 + (size_t)id));         /* site:thread */
    for (int i = 0; i < 1000; i++)
        pair(64 + (size_t)(i % 200));
    free(shared[id]);                        /* a block another thread allocated */
    if (id == 3)
        __atomic_store_n(&detached_done, 1, __ATOMIC_RELEASE);
    if (id == 2)
        pthread_exit(NULL);
    return NULL;
}

NOINLINE static void threads(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        shared[i] = malloc(500);
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, thread_body, (void *)i);
    pthread_detach(t[3]);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    /* the detached thread: wait until it has freed its shared block */
    while (!__atomic_load_n(&detached_done, __ATOMIC_ACQUIRE))
        usleep(1000);
}

/* ---- blocks side by side, freed in another order than they were made ---- */
NOINLINE static void neighbours(int n, int rounds)
{
    void **b = malloc(sizeof *b * (size_t)n);
    unsigned x = 12345;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < n; i++)
            b[i] = malloc(40);
        for (int i = n - 1; i > 0; i--) {          /* shuffle */
            x = x * 1103515245u + 12345u;
            int j = (int)((x >> 8) % (unsigned)(i + 1));
            void *t = b[i];
            b[i] = b[j];
            b[j] = t;
        }
        for (int i = 0; i < n; i++)
            free(b[i]);
    }
    free(b);
}

/* ---- many threads, freeing each other's blocks through a shared table ---- */
#define SLOTS 512
static void *volatile slots[SLOTS];

NOINLINE static void *churn_body(void *arg)
{
    unsigned x = (unsigned)(long)arg * 2654435761u + 1;
    for (int i = 0; i < 200000; i++) {
        x = x * 1103515245u + 12345u;
        void *p = malloc(16 + (x >> 16) % 300);
        void *old = __atomic_exchange_n(&slots[(x >> 8) % SLOTS], p, __ATOMIC_ACQ_REL);
        free(old);
    }
    return NULL;
}

NOINLINE static void churn(int nthreads)
{
    pthread_t t[16];
    for (long i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, churn_body, (void *)i);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    int kept = 0;
    for (int i = 0; i < SLOTS; i++) {
        if (slots[i] && kept < 7) {
            kept++; /* exactly 7 of the table's blocks stay allocated */
        } else {
            free(slots[i]);
        }
    }
}

/* ---- many short threads, one after another, each with another library's TSD destructor
 * that frees memory while the thread exits ---- */
static pthread_key_t lib_key;

static void lib_destructor(void *p)
{
    free(p);                                 /* freed during thread exit: must cancel out */
}

NOINLINE static void *short_body(void *arg)
{
    (void)arg;
    keep(malloc(910));                       /* site:short */
    pthread_setspecific(lib_key, malloc(77));
    for (int i = 0; i < 100; i++)
        pair(40);
    return NULL;
}

NOINLINE static void serial_threads(int n)
{
    pthread_key_create(&lib_key, lib_destructor);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        pthread_create(&t, NULL, short_body, NULL);
        pthread_join(t, NULL);
    }
}

/* ---- a daemon that drops root while a second thread runs ---- */
static int dropped;

NOINLINE static void *after_drop_body(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&dropped, __ATOMIC_ACQUIRE))
        usleep(1000);
    keep(malloc(923));                       /* site:thread_after_drop */
    for (int i = 0; i < 50000; i++)         /* several flushes, as the new user */
        pair(32);
    return NULL;
}

NOINLINE static int drop_root(void)
{
    pthread_t t;
    pthread_create(&t, NULL, after_drop_body, NULL);
    keep(malloc(921));                       /* site:before_drop */
    for (int i = 0; i < 5000; i++)
        pair(32);
    if (setgid(65534) || setuid(65534)) {
        say("setuid failed\n");
        return 4;
    }
    keep(malloc(922));                       /* site:after_drop */
    __atomic_store_n(&dropped, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 50000; i++)
        pair(32);
    pthread_join(t, NULL);
    return 0;
}

/* ---- the leaks every "end" mode makes before ending ---- */
NOINLINE static void leak_before_end(void)
{
    for (int i = 0; i < 5; i++)
        keep(malloc(700));                  /* site:before_end */
    for (int i = 0; i < 100000; i++)       /* enough events to need several windows */
        pair(32);
}

/* ---- daemonize: close every descriptor, dup2 over them, chdir, setsid ---- */
NOINLINE static int daemonize(const char *own)
{
    for (int fd = 0; fd < 1024; fd++)
        close(fd);
    int n = open("/dev/null", O_RDWR);
    dup2(n, 0); dup2(n, 1); dup2(n, 2);
    if (chdir("/") || setsid() < 0) { /* setsid fails if already a leader: fine */ }
    /* our own file takes the lowest free descriptors, where mmleak's could have been */
    int mine[8];
    for (int i = 0; i < 8; i++)
        mine[i] = open(own, O_WRONLY | O_CREAT | O_APPEND, 0644);
    for (int i = 0; i < 20000; i++)
        pair(48);
    keep(malloc(801));                      /* site:daemon */
    for (int i = 0; i < 8; i++) {
        ssize_t r = write(mine[i], "ok\n", 3);
        (void)r;
        close(mine[i]);
    }
    return 0;
}

/* ---- symlinks planted where mmleak will create its next files ---- */
NOINLINE static int plant(const char *dir, const char *victim)
{
    char path[4096];
    for (int n = 0; n < 8; n++) {
        snprintf(path, sizeof path, "%s/mmleak.%d.%d.out", dir, (int)getpid(), n);
        if (symlink(victim, path)) { /* file 0 exists already: the main thread's */ }
    }
    pthread_t t;
    long id = 9;
    shared[9] = malloc(500);
    pthread_create(&t, NULL, thread_body, (void *)id);
    pthread_join(t, NULL);
    return 0;
}

static const char *self_path;

NOINLINE static void dl_test(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) { say("dlopen failed\n"); exit(3); }
    void *(*f)(size_t) = (void *(*)(size_t))dlsym(h, "dl_leak");
    keep(f(901));
    if (dlclose(h)) { say("dlclose failed\n"); exit(3); }
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    malloc_address = malloc;
    const char *mode = argc > 1 ? argv[1] : "basic";
    keep(ctor_block);
    if (!strcmp(mode, "basic")) {
        errno = 4321;
        void *p = malloc(1);
        int e1 = errno;
        free(p);
        int e2 = errno;
        entry_points();
        realloc_chain();
        if (e1 != 4321 || e2 != 4321) { say("errno changed\n"); return 7; }
        return 0;
    }
    if (!strcmp(mode, "threads")) { threads(); return 0; }
    if (!strcmp(mode, "churn")) { churn(argc > 2 ? atoi(argv[2]) : 4); return 0; }
    if (!strcmp(mode, "neighbours")) { neighbours(atoi(argv[2]), atoi(argv[3])); return 0; }
    if (!strcmp(mode, "serial")) {
        serial_threads(atoi(argv[2]));
        if (argc > 3)
            _exit(0);                        /* no destructors: parked files closed anyway */
        return 0;
    }
    if (!strcmp(mode, "dropuid")) return drop_root();
    if (!strcmp(mode, "dl")) { dl_test(argv[2]); return 0; }
    if (!strcmp(mode, "daemon")) return daemonize(argv[2]);
    if (!strcmp(mode, "plant")) return plant(argv[2], argv[3]);
    if (!strcmp(mode, "fork")) {
        keep(malloc(601));                   /* site:before_fork */
        pid_t c = fork();
        if (c == 0) {
            keep(malloc(602));               /* site:child */
            free(ctor_block);                /* the child frees a block the parent made */
            _exit(0);
        }
        keep(malloc(603));                   /* site:parent */
        int st;
        waitpid(c, &st, 0);
        char b[32];
        snprintf(b, sizeof b, "child %d\n", (int)c);
        say(b);
        return 0;
    }
    if (!strcmp(mode, "exec")) {
        keep(malloc(604));                   /* site:before_exec */
        execl(self_path, self_path, "basic", (char *)NULL);
        return 5;
    }
    if (!strcmp(mode, "wait")) {            /* leak, say so, then wait to be killed */
        for (int i = 0; i < 4; i++)
            keep(malloc(555));               /* site:running */
        say("ready\n");
        char c;
        if (read(0, &c, 1) == 1) {           /* told to go on: leak some more */
            for (int i = 0; i < 2; i++)
                keep(malloc(556));           /* site:later */
            say("more\n");
        }
        for (;;)
            pause();
    }
    /* the ways to end */
    leak_before_end();
    if (!strcmp(mode, "return")) return 0;
    if (!strcmp(mode, "exit")) exit(0);
    if (!strcmp(mode, "_exit")) _exit(0);
    if (!strcmp(mode, "abort")) abort();
    if (!strcmp(mode, "segv")) raise(SIGSEGV);
    if (!strcmp(mode, "kill")) kill(getpid(), SIGKILL);
    return 9;
}
