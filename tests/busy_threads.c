/* tests/busy_threads.c: a process whose threads are all busy, none ever asleep (issue 17,
 * item 14; tests/test_attach.py).
 *
 *   busy_threads N [noidle]
 *
 * N threads and the main thread spin: each lap memset()s a private 16 KiB buffer (so a thread
 * is inside libc most of the time) and counts the lap; nothing is allocated while they spin.
 * One more thread (unless "noidle") sleeps in read() (on a pipe written at the end) under
 * SCHED_IDLE, as a low priority housekeeping thread would: the one an injector borrows first,
 * as it sleeps, and one that gets no CPU at all while the others spin.
 * Between laps the main thread polls stdin (non-blocking: it never sleeps either) for these
 * commands (while it waits for the others to act on one, it naps):
 *   round   every thread, the main one included, runs thread_round() once: a block of 24
 *           bytes allocated and freed, one of 48 bytes allocated and kept; "round K" (K: the
 *           rounds so far) once all N+1 did
 *   check   "check N+1" once every thread has made laps since the last check (they all run)
 *   quit    the threads stop and are joined; "bye" if every thread's buffer holds what its
 *           last lap wrote and every thread did every round, else "BAD ...".
 * "ready" once all threads have made their first lap.
 *
 *   busy_threads -l N
 *
 * No safe moment ever: N threads and the main thread spin in pthread_spin_lock() (inside
 * libc) on a lock taken before them, and that nobody releases until SIGUSR1 comes.  Then each
 * takes it and gives it back; the main thread joins them and says "bye".  "ready" once all
 * are started. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUF 16384
#define MAXT 1024
#define MAXR 64

struct worker {
    pthread_t t;
    unsigned char buf[BUF];
    _Atomic unsigned long laps;
    unsigned long seen;                 /* laps at the last check (main thread only) */
    unsigned rounds;                    /* rounds done (the thread's own) */
    void *kept[MAXR];
};

static struct worker *w;
static int n;
static atomic_int stop;
static atomic_uint gen;                 /* rounds asked for */
static atomic_uint acks;                /* rounds done, all threads together */

static __attribute__((noinline)) void thread_round(struct worker *me)
{
    void *a = malloc(24);                       /* site:round_freed */
    void *b = malloc(48);                       /* site:round_kept */
    if (!a || !b)
        abort();
    memset(a, 1, 24);
    memset(b, 2, 48);
    free(a);
    if (me->rounds < MAXR)
        me->kept[me->rounds] = b;
    me->rounds++;
    atomic_fetch_add(&acks, 1);
    /* (the others have the CPUs until all did theirs: the round is over sooner) */
    while (atomic_load(&acks) < me->rounds * (unsigned)(n + 1) && me != &w[0])
        usleep(1000);
}

/* One lap; a round if one was asked for. */
static void lap(struct worker *me)
{
    unsigned long l = atomic_load_explicit(&me->laps, memory_order_relaxed) + 1;
    memset(me->buf, (int)(l & 0xff), BUF);
    atomic_store_explicit(&me->laps, l, memory_order_relaxed);
    if (me->rounds < atomic_load(&gen))
        thread_round(me);
}

static int idle_pipe[2];

static void *idle(void *arg)
{
    (void)arg;
    struct sched_param sp = {0};
    char c;
    if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp))
        abort();
    while (read(idle_pipe[0], &c, 1) < 0 && errno == EINTR)
        ;
    return NULL;
}

static void *spin(void *arg)
{
    struct worker *me = arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        lap(me);
    return NULL;
}

static void say(const char *s)
{
    size_t len = strlen(s);
    if (write(1, s, len) != (ssize_t)len)
        exit(3);
}

static pthread_spinlock_t never;

static void release_never(int sig)
{
    (void)sig;
    pthread_spin_unlock(&never);
}

static void *wait_never(void *arg)
{
    (void)arg;
    pthread_spin_lock(&never);
    pthread_spin_unlock(&never);
    return NULL;
}

static int never_safe(int count)
{
    pthread_t t[MAXT];
    pthread_spin_init(&never, PTHREAD_PROCESS_PRIVATE);
    pthread_spin_lock(&never);
    signal(SIGUSR1, release_never);
    for (int i = 0; i < count; i++)
        if (pthread_create(&t[i], NULL, wait_never, NULL))
            return 1;
    say("ready\n");
    wait_never(NULL);
    for (int i = 0; i < count; i++)
        pthread_join(t[i], NULL);
    say("bye\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "-l"))
        return never_safe(atoi(argv[2]) < MAXT ? atoi(argv[2]) : 0);
    n = argc > 1 ? atoi(argv[1]) : 0;
    if (n < 0 || n >= MAXT) {
        fprintf(stderr, "usage: busy_threads N (0 to %d)\n", MAXT - 1);
        return 2;
    }
    w = calloc((size_t)n + 1, sizeof *w);
    pthread_t idler;
    int with_idle = !(argc > 2 && !strcmp(argv[2], "noidle"));
    if (!w || pipe(idle_pipe) || (with_idle && pthread_create(&idler, NULL, idle, NULL)))
        return 1;
    for (int i = 1; i <= n; i++)
        if (pthread_create(&w[i].t, NULL, spin, &w[i]))
            return 1;
    for (int i = 1; i <= n; i++)
        while (!atomic_load(&w[i].laps))
            usleep(1000);
    if (fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK) < 0)
        return 1;
    say("ready\n");
    char cmd[64], out[64];
    size_t have = 0;
    for (;;) {
        lap(&w[0]);
        ssize_t r = read(0, cmd + have, sizeof cmd - 1 - have);
        if (r == 0)
            break;
        if (r < 0 && errno != EAGAIN && errno != EINTR)
            return 1;
        if (r > 0)
            have += (size_t)r;
        char *nl = memchr(cmd, '\n', have);
        if (!nl)
            continue;
        *nl = 0;
        if (!strcmp(cmd, "round")) {
            unsigned k = atomic_fetch_add(&gen, 1) + 1;
            lap(&w[0]);
            while (atomic_load(&acks) < k * (unsigned)(n + 1))
                usleep(1000);
            snprintf(out, sizeof out, "round %u\n", k);
            say(out);
        } else if (!strcmp(cmd, "check")) {
            lap(&w[0]);
            for (int i = 0; i <= n; i++) {
                while (atomic_load(&w[i].laps) == w[i].seen)
                    usleep(1000);
                w[i].seen = atomic_load(&w[i].laps);
            }
            snprintf(out, sizeof out, "check %d\n", n + 1);
            say(out);
        } else if (!strcmp(cmd, "quit")) {
            break;
        } else {
            say("?\n");
        }
        have -= (size_t)(nl + 1 - cmd);
        memmove(cmd, nl + 1, have);
    }
    atomic_store(&stop, 1);
    for (int i = 1; i <= n; i++)
        pthread_join(w[i].t, NULL);
    if (with_idle && (write(idle_pipe[1], "x", 1) != 1 || pthread_join(idler, NULL)))
        return 1;
    for (int i = 0; i <= n; i++) {
        unsigned char v = (unsigned char)(atomic_load(&w[i].laps) & 0xff);
        for (int k = 0; k < BUF; k++)
            if (w[i].buf[k] != v) {
                snprintf(out, sizeof out, "BAD buffer of thread %d\n", i);
                say(out);
                return 1;
            }
        if (w[i].rounds != atomic_load(&gen)) {
            snprintf(out, sizeof out, "BAD rounds of thread %d\n", i);
            say(out);
            return 1;
        }
    }
    say("bye\n");
    return 0;
}
