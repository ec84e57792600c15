/* tools/scan_read.c: the marking's reader thread (tools/scan_read.h).
 *
 * The marking (tools/scan_mark.c, drain) reads the heap around a batch of blocks, CACHE bytes in
 * one process_vm_readv, then scans the words of the blocks in it; a heap of list nodes
 * allocated in a row is read that way from one end to the other, a gigabyte in a thousand
 * such reads, each waited for while no word is scanned.  With this thread the next stretch
 * (the one past the last, in the direction the batches go) is read while the words of the
 * last are scanned.  What it reads is the memory of a stopped process, or of its copy: it
 * does not change, so the words are the same whoever read them, and the verdict too.
 *
 * Started only for a big heap and when a CPU is idle (mmleak_cpu_to_spare, as the live
 * set's parsers): on a machine whose every core is taken, the thread would take its time
 * from the scan's.  SCAN_READ_ALWAYS (the tests): always. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include "scan_live.h"
#include "scan_read.h"

#ifndef SCAN_READ_MIN
#define SCAN_READ_MIN ((uint64_t)64 << 20)      /* a heap smaller than this: no thread */
#endif

struct reader {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t asked, done;
    int rpid, state, quit;              /* state: 0 nothing asked, 1 reading, 2 read */
    char *buf;                          /* what the thread reads into */
    size_t cap;
    uint64_t lo, hi, reads;
    ssize_t got;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->state != 1 && !r->quit)
            pthread_cond_wait(&r->asked, &r->mu);
        if (r->quit)
            break;
        struct iovec l = { r->buf, (size_t)(r->hi - r->lo) }, rm = { (void *)r->lo, l.iov_len };
        pthread_mutex_unlock(&r->mu);
        ssize_t got = process_vm_readv(r->rpid, &l, 1, &rm, 1, 0);
        pthread_mutex_lock(&r->mu);
        r->reads++;
        r->got = got;
        r->state = 2;
        pthread_cond_signal(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

struct reader *reader_start(int rpid, size_t cap, uint64_t span)
{
#ifndef SCAN_READ_ALWAYS
    if (span < SCAN_READ_MIN || !mmleak_cpu_to_spare())
        return NULL;
#else
    (void)span;
#endif
    struct reader *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->buf = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->buf == MAP_FAILED) {
        free(r);
        return NULL;
    }
    r->cap = cap;
    r->rpid = rpid;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->asked, NULL);
    pthread_cond_init(&r->done, NULL);
    if (pthread_create(&r->th, NULL, reader_main, r)) {
        munmap(r->buf, cap);
        free(r);
        return NULL;
    }
    return r;
}

void reader_ask(struct reader *r, uint64_t lo, uint64_t hi)
{
    if (hi <= lo || hi - lo > r->cap)
        return;
    pthread_mutex_lock(&r->mu);
    while (r->state == 1)
        pthread_cond_wait(&r->done, &r->mu);
    r->lo = lo;
    r->hi = hi;
    r->state = 1;
    pthread_cond_signal(&r->asked);
    pthread_mutex_unlock(&r->mu);
}

int reader_take(struct reader *r, uint64_t a, uint64_t b, char **buf, uint64_t *lo,
                uint64_t *hi)
{
    int took = 0;
    pthread_mutex_lock(&r->mu);
    if (r->state && r->lo <= a && b <= r->hi) {
        while (r->state == 1)
            pthread_cond_wait(&r->done, &r->mu);
        if (r->got == (ssize_t)(r->hi - r->lo)) {
            char *t = *buf;
            *buf = r->buf;
            r->buf = t;
            *lo = r->lo;
            *hi = r->hi;
            took = 1;
        }
        r->state = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return took;
}

uint64_t reader_stop(struct reader *r)
{
    pthread_mutex_lock(&r->mu);
    r->quit = 1;
    pthread_cond_signal(&r->asked);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->th, NULL);          /* (a read under way ends first) */
    uint64_t n = r->reads;
    munmap(r->buf, r->cap);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->asked);
    pthread_cond_destroy(&r->done);
    free(r);
    return n;
}
