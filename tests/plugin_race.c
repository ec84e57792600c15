/* dlclose in one thread while another allocates (tests/test_plugins.py): the main thread
 * swaps two plugins (tests/plugin.c built as ALPHA and BETA) ROUNDS times, dlclose then
 * dlopen, the other one landing at the same address (tests/test_plugins.py links both at
 * one address); a worker thread meanwhile calls the loaded plugin's plugin_leak (under a
 * read lock: a plugin is never unloaded under a call) and churns malloc/free in both the
 * plugin's range and the host.  Every leak is a block of 100 + n bytes with n even for alpha and odd for beta, so the test knows which
 * library made each one.  Prints "alpha N BYTES" and "beta N BYTES" at the end, and how
 * many loads took the address the other library had just been unloaded from.
 *   plugin_race ALPHA BETA ROUNDS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static void *handle;
static void *(*leak_fn)(int);
static void (*churn_fn)(int);
static int cur;                         /* 0 alpha, 1 beta */
static atomic_int stop;
static long count[2], bytes[2];
static void *volatile sink;

static void leak(int who, unsigned k)
{
    int n = (int)(k % 4000) * 2 + who;
    leak_fn(n);
    count[who]++;
    bytes[who] += 100 + n;
}

static void *worker(void *arg)
{
    (void)arg;
    unsigned x = 12345;
    while (!atomic_load(&stop)) {
        pthread_rwlock_rdlock(&lock);
        for (int i = 0; i < 64; i++) {
            x = x * 1103515245u + 12345u;
            sink = malloc(16 + (x >> 20) % 200);        /* the host's churn */
            free(sink);
            if ((x >> 8) % 32 == 0)
                leak(cur, x >> 12);
            if ((x >> 8) % 8 == 1)
                churn_fn(4);                            /* the plugin's churn */
        }
        pthread_rwlock_unlock(&lock);
    }
    return NULL;
}

static int load(const char *path, int who)
{
    handle = dlopen(path, RTLD_NOW);
    if (!handle) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    leak_fn = (void *(*)(int))dlsym(handle, "plugin_leak");
    churn_fn = (void (*)(int))dlsym(handle, "plugin_churn");
    cur = who;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    int rounds = atoi(argv[3]);
    if (load(argv[1], 0))
        return 1;
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    Dl_info di;
    void *prev = dladdr((void *)leak_fn, &di) ? di.dli_fbase : NULL;
    int same = 0;
    for (int r = 1; r <= rounds; r++) {
        pthread_rwlock_wrlock(&lock);
        dlclose(handle);
        if (load(argv[1 + (r & 1)], r & 1))
            return 1;
        void *base = dladdr((void *)leak_fn, &di) ? di.dli_fbase : NULL;
        same += base == prev;           /* the other library took the address just freed */
        prev = base;
        leak(cur, (unsigned)r * 7u);
        pthread_rwlock_unlock(&lock);
        for (volatile int i = 0; i < 20000; i++)
            ;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("alpha %ld %ld\nbeta %ld %ld\nsame address %d of %d\n", count[0], bytes[0],
           count[1], bytes[1], same, rounds);
    return 0;
}
