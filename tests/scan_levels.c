/* scan_levels.c: a trace compacted in levels while the program runs, scanned at its exit
 * (test_scan.py).  Each line "KEEP FREE LOST" read from stdin is a batch run by a new
 * thread: it frees the FREE blocks kept last, keeps KEEP blocks of KEEP_SIZE bytes in a
 * global array (still reachable), leaks LOST blocks of LOST_SIZE bytes (definitely lost: the
 * thread wipes its stack before it ends, and glibc keeps the stacks of ended threads
 * mapped), then allocates and frees CHURN blocks, more than MMLEAK_ROTATE_MB=1 takes to
 * start a new dump file: the batch is then in a complete file (ends with "#end"), ready for
 * a compaction pass.  Writes "ok" after each batch; exits through exit at the end of its
 * input (the scan at exit runs then).  No stdio: its buffers would be blocks of their own. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KEEP_SIZE 321
#define LOST_SIZE 777
#define MAX_KEPT 100000
#define CHURN 40000

static void *kept[MAX_KEPT];
static int nkept;
static int batch[3];

__attribute__((noinline)) static void wipe(void)
{
    volatile char junk[256 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

__attribute__((noinline)) static void run_batch(void)
{
    void *volatile first = malloc(8);   /* an allocation first: a thread whose first event
                                         * is a free writes it to a file of its own */
    free(first);
    for (int i = 0; i < batch[1] && nkept > 0; i++) {
        free(kept[--nkept]);
        kept[nkept] = NULL;
    }
    for (int i = 0; i < batch[0] && nkept < MAX_KEPT; i++) {
        kept[nkept] = malloc(KEEP_SIZE);
        memset(kept[nkept++], 0, KEEP_SIZE);
    }
    for (int i = 0; i < batch[2]; i++) {
        volatile char *p = malloc(LOST_SIZE);
        p[0] = 1;
    }
    for (int i = 0; i < CHURN; i++) {
        void *volatile q = malloc(8);
        free(q);
    }
}

static void *thread(void *arg)
{
    (void)arg;
    run_batch();
    wipe();
    return NULL;
}

int main(void)
{
    char line[256];
    size_t have = 0;
    for (;;) {
        ssize_t n = read(0, line + have, sizeof line - 1 - have);
        if (n <= 0)
            break;
        have += (size_t)n;
        line[have] = 0;
        char *nl;
        while ((nl = strchr(line, '\n'))) {
            *nl = 0;
            char *p = line;
            for (int k = 0; k < 3; k++)
                batch[k] = (int)strtol(p, &p, 10);
            pthread_t t;
            if (pthread_create(&t, NULL, thread, NULL) || pthread_join(t, NULL))
                return 2;
            if (write(1, "ok\n", 3) != 3)
                return 2;
            have -= (size_t)(nl + 1 - line);
            memmove(line, nl + 1, have + 1);
        }
    }
    wipe();
    return 0;
}
