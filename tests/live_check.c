/* live_check.c: the live set of the scan (tools/scan_live.c) against the shrink engine's
 * (tools/shrink*.c, final) on the same files: prints "same N" (N live blocks), or each
 * difference and "differ".  Built by tests/test_scan.py with both sources.
 *
 *   live_check [-t] [-p K] FILE...   the files as one trace (each read whole)
 *
 * A FILE written "s:PATH" is given to the live set as sorted (a compacted result's lines
 * come in address order; one that does not is taken like any other input).  -p K: the
 * live set reads, instead of the first K files, their partial shrink (not --final: what a
 * compaction pass writes), as a sorted input first; the shrink engine reads them all.
 * -t: the live set is given each file's last third as its tail (the staging lines a scan
 * takes after a dump file's bytes), the rest from the descriptor. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_live.h"

struct mmleak_shrink_stats {
    uint64_t events, allocs, max_time, files_done, entries, fatal, malformed, out_errno;
    uint64_t lines, alloc_lines;
    uint64_t free_lines, alloc_bytes, newest, used, nused, used_bytes;
    uint64_t alloc_bytes_hi;
};
int mmleak_shrink(const char *const *paths, const int *name_id, int npaths, int out_fd,
                  int show, int final, int (*on_header)(const char *, size_t, int, uint64_t),
                  int (*on_tick)(int, uint64_t, uint64_t, uint64_t), int (*on_open)(int),
                  int (*on_problem)(int, uint64_t, int, const char *, size_t),
                  uint64_t *counts, struct mmleak_shrink_stats *stats);

static char **g_paths;
static char **g_live;           /* the live set's inputs */
static int g_partial = -1;      /* the descriptor of the partial shrink, or -1 */
static int g_tail;              /* -t: each file's last third given as its tail */

static int open_whole(int i, struct mmleak_input *in)
{
    const char *p = g_live[i];
    in->sorted = !strncmp(p, "s:", 2);
    if (g_partial >= 0 && i == 0) {
        in->fd = dup(g_partial);
        lseek(in->fd, 0, SEEK_SET);
        in->sorted = 1;
    } else {
        in->fd = open(in->sorted ? p + 2 : p, O_RDONLY);
    }
    in->limit = UINT64_MAX;
    in->tail = NULL;
    in->tlen = 0;
    struct stat st;
    if (in->fd >= 0 && !fstat(in->fd, &st) && S_ISREG(st.st_mode)) {
        in->limit = (uint64_t)st.st_size;   /* as the scan gives it (its cut's size) */
        if (g_tail && st.st_size > 2) {     /* -t: its last third as the staging lines */
            size_t t = (size_t)st.st_size / 3;
            char *b = malloc(t);
            if (b && pread(in->fd, b, t, st.st_size - (off_t)t) == (ssize_t)t) {
                in->limit -= t;
                in->tail = b;
                in->tlen = t;
            }
        }
    }
    return in->fd < 0 ? -1 : 0;
}

static int on_open(int i)
{
    const char *p = g_paths[i];
    return open(!strncmp(p, "s:", 2) ? p + 2 : p, O_RDONLY);
}
static int on_header(const char *l, size_t n, int f, uint64_t k)
{ (void)l; (void)n; (void)f; (void)k; return 0; }
static int on_tick(int a, uint64_t b, uint64_t c, uint64_t d)
{ (void)a; (void)b; (void)c; (void)d; return 0; }
static int on_problem(int a, uint64_t b, int c, const char *d, size_t e)
{ (void)a; (void)b; (void)c; (void)d; (void)e; return 0; }

static const char *hex(const char *p, const char *e, uint64_t *v)
{
    uint64_t x = 0;
    const char *b = p;
    for (; p < e; p++) {
        unsigned c = (unsigned char)*p;
        if (c - '0' < 10)
            x = x << 4 | (c - '0');
        else if (c - 'a' < 6)
            x = x << 4 | (c - 'a' + 10);
        else
            break;
    }
    *v = x;
    return p == b ? NULL : p;
}

int main(int argc, char **argv)
{
    int kp = 0;
    if (argc > 1 && !strcmp(argv[1], "-t")) {
        g_tail = 1;
        argv++;
        argc--;
    }
    if (argc > 2 && !strcmp(argv[1], "-p")) {
        kp = atoi(argv[2]);
        argv += 2;
        argc -= 2;
    }
    int n = argc - 1;
    g_paths = argv + 1;
    g_live = g_paths;
    int nlive = n;
    if (kp > 0 && kp <= n) {          /* the first K files' partial shrink, then the rest */
        int *pid = calloc((size_t)kp + 1, sizeof *pid);
        uint64_t *pc = calloc((size_t)kp + 1, 4 * sizeof *pc);
        struct mmleak_shrink_stats ps;
        for (int i = 0; i < kp; i++)
            pid[i] = i;
        g_partial = memfd_create("partial", 0);
        if (mmleak_shrink((const char *const *)g_paths, pid, kp, g_partial, 0, 0, on_header,
                          on_tick, on_open, on_problem, pc, &ps) || ps.fatal) {
            printf("partial shrink failed\n");
            return 2;
        }
        g_live = g_paths + kp - 1;   /* [0]: the partial result */
        nlive = n - kp + 1;
    }
    struct mmleak_live lv;
    int rc = mmleak_live_set(nlive, open_whole, &lv);
    if (rc) {
        printf("live set: %d\n", rc);
        return 2;
    }
    int out = memfd_create("live_check", 0);
    int *ids = calloc((size_t)n + 1, sizeof *ids);
    uint64_t *counts = calloc((size_t)n + 1, 4 * sizeof *counts);
    struct mmleak_shrink_stats st;
    for (int i = 0; i < n; i++)
        ids[i] = i;
    if (mmleak_shrink((const char *const *)g_paths, ids, n, out, 0, 1, on_header, on_tick,
                      on_open, on_problem, counts, &st) || st.fatal) {
        printf("shrink failed\n");
        return 2;
    }
    off_t len = lseek(out, 0, SEEK_END);
    char *m = len > 0 ? mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, out, 0) : NULL;
    const char *p = m, *e = m + (len > 0 ? len : 0);
    size_t k = 0;
    int bad = 0;
    while (p < e) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        if (!nl)
            nl = e;
        uint64_t ptr, seq, size;
        const char *q = hex(p, nl, &ptr);
        if (q && q < nl && *q == ' ' && (q = hex(q + 1, nl, &seq)) && q < nl && *q == ' ') {
            const char *r = hex(q + 1, nl, &size);
            if (r && r < nl && *r == ' ') {
                if (k >= lv.n || lv.ptr[k] != ptr || lv.seq[k] != seq || lv.size[k] != size) {
                    printf("shrink: %" PRIx64 " %" PRIx64 " %" PRIx64 "; live set: ", ptr,
                           seq, size);
                    if (k < lv.n)
                        printf("%" PRIx64 " %" PRIx64 " %" PRIx64 "\n", lv.ptr[k],
                               lv.seq[k], lv.size[k]);
                    else
                        printf("none\n");
                    if (++bad > 20)
                        break;
                }
                k++;
            }
        }
        p = nl + 1;
    }
    if (k != lv.n) {
        printf("shrink: %zu blocks; live set: %zu\n", k, lv.n);
        bad++;
    }
    if (bad) {
        printf("differ\n");
        return 1;
    }
    printf("same %zu\n", lv.n);
    return 0;
}
