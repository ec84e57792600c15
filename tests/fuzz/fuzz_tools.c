/* tests/fuzz/fuzz_tools.c: libFuzzer harnesses of the entry points of mmleak-tools.so that
 * read files a user names (mmleaklib/native.py and series.py call them through ctypes), one
 * binary per entry point (FUZZ_TARGET, `make fuzz`, docs/format.rst):
 *
 *   shrink           mmleak_shrink, flags 0 to 3 (SHRINK_FINAL, SHRINK_HEAD_FIRST)
 *   blocks           mmleak_shrink_blocks (a report's reading)
 *   result_blocks    mmleak_shrink_result_blocks (the last compaction pass)
 *   merge            mmleak_shrink_merge (the last input streamed: a compacted result)
 *   blocks_merge     mmleak_shrink_blocks_merge
 *   pick             mmleak_levels_pick (the first input is BIG, the others SMALL)
 *   leb              mmleak_blocks_leb_decode (a scan result's columns)
 *
 * The input: its first byte chooses (the flags, the names shared or not, a hole in the first
 * file, LEB's delta and room), the rest is cut at each SEP into up to MAXF files, handed to the entry point as
 * mmleak.py hands them: the shrink functions read descriptors the open callback gives (here a
 * file under a private directory, read as mmleaklib's open would hand it), levels_pick opens
 * the paths itself.  The callbacks accept every header line (mmleaklib refuses unknown format
 * versions first: the C code sees more here than behind mmleak.py).
 *
 * mmap of a file (levels.c maps BIG and SMALL) is wrapped (-Wl,--wrap=mmap,--wrap=munmap) into
 * malloc + pread, so that AddressSanitizer sees a read past a file's end to the byte, not only
 * past its last page; anonymous mappings (the shrinker's memory) are left to the kernel. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../tools/shrink_int.h"
#include "../../tools/blocks.h"

#define MAXF 4
static const char SEP[] = "\n~~8<~~\n";

int mmleak_shrink(const char *const *, const int *, int, int, int, int, mmleak_header_cb,
                  mmleak_tick_cb, mmleak_open_cb, mmleak_problem_cb, uint64_t *,
                  struct mmleak_shrink_stats *);
typedef int (*blocks_fn)(const char *const *, const int *, int, int, int, mmleak_header_cb,
                         mmleak_tick_cb, mmleak_open_cb, mmleak_problem_cb, uint64_t *,
                         struct mmleak_shrink_stats *, struct mmleak_blocks *);
int mmleak_shrink_blocks(const char *const *, const int *, int, int, int, mmleak_header_cb,
                         mmleak_tick_cb, mmleak_open_cb, mmleak_problem_cb, uint64_t *,
                         struct mmleak_shrink_stats *, struct mmleak_blocks *);
int mmleak_shrink_result_blocks(const char *const *, const int *, int, int, int,
                                mmleak_header_cb, mmleak_tick_cb, mmleak_open_cb,
                                mmleak_problem_cb, uint64_t *, struct mmleak_shrink_stats *,
                                struct mmleak_blocks *);
int mmleak_shrink_merge(const char *const *, const int *, int, int, int, mmleak_header_cb,
                        mmleak_tick_cb, mmleak_open_cb, mmleak_problem_cb, uint64_t *,
                        struct mmleak_shrink_stats *, struct mmleak_blocks *);
int mmleak_shrink_blocks_merge(const char *const *, const int *, int, int, int,
                               mmleak_header_cb, mmleak_tick_cb, mmleak_open_cb,
                               mmleak_problem_cb, uint64_t *, struct mmleak_shrink_stats *,
                               struct mmleak_blocks *);
void mmleak_shrink_stats_free(struct mmleak_shrink_stats *);
int64_t mmleak_levels_pick(const char *, const char *const *, int, const uint64_t *, int64_t,
                           int);
int64_t mmleak_blocks_leb_decode(const uint8_t *, uint64_t, uint64_t *, uint64_t, int);

/* ---- file mappings as heap blocks ---------------------------------------------------- */
void *__real_mmap(void *, size_t, int, int, int, off_t);
int __real_munmap(void *, size_t);
#define NMAPS 64
static void *maps[NMAPS];

void *__wrap_mmap(void *addr, size_t n, int prot, int flags, int fd, off_t off)
{
    if (fd < 0 || (flags & MAP_ANONYMOUS) || (prot & PROT_WRITE) || addr)
        return __real_mmap(addr, n, prot, flags, fd, off);
    int k = 0;
    while (k < NMAPS && maps[k])
        k++;
    char *p = k < NMAPS ? malloc(n) : NULL;
    if (!p) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, p + got, n - got, off + (off_t)got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    memset(p + got, 0, n - got);
    maps[k] = p;
    return p;
}

int __wrap_munmap(void *p, size_t n)
{
    for (int k = 0; k < NMAPS; k++)
        if (maps[k] == p) {
            free(p);
            maps[k] = NULL;
            return 0;
        }
    return __real_munmap(p, n);
}

/* ---- the inputs as files -------------------------------------------------------------- */
static char dir[64];
static char paths[MAXF][80];
static int nfiles;

static int cb_header(const char *l, size_t n, int f, uint64_t ln)
{
    (void)l, (void)n, (void)f, (void)ln;
    return 0;
}

static int cb_tick(int f, uint64_t a, uint64_t b, uint64_t c)
{
    (void)f, (void)a, (void)b, (void)c;
    return 0;
}

static int cb_open(int f)
{
    return f >= 0 && f < nfiles ? open(paths[f], O_RDONLY | O_CLOEXEC) : -1;
}

static int cb_problem(int f, uint64_t ln, int what, const char *l, size_t n)
{
    /* the bytes handed back must be readable: mmleaklib copies them (ctypes.string_at) */
    volatile char sink = 0;
    if (l)
        for (size_t i = 0; i < n; i++)
            sink ^= l[i];
    (void)f, (void)ln, (void)what, (void)sink;
    return 0;
}

static void write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            abort();
        p += w, n -= (size_t)w;
    }
}

/* The file PATH holding the N bytes at P; with HOLE, a hole of HOLE_BYTES in their middle
 * (a sparse file's: the readers skip it unread, SEEK_DATA) */
#define HOLE_BYTES 12288
static void write_file(const char *path, const uint8_t *p, size_t n, int hole)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        abort();
    if (hole) {
        write_all(fd, p, n / 2);
        if (lseek(fd, HOLE_BYTES, SEEK_CUR) < 0)
            abort();
        p += n / 2, n -= n / 2;
    }
    write_all(fd, p, n);
    if (hole && ftruncate(fd, lseek(fd, 0, SEEK_CUR)))
        abort();
    close(fd);
}

/* Cut DATA at each SEP into files (at most MAXF; the last takes the rest); HOLE: the
 * first one with a hole in its middle. */
static __attribute__((unused)) void split(const uint8_t *d, size_t n, int hole)
{
    nfiles = 0;
    while (nfiles < MAXF) {
        const uint8_t *s = nfiles < MAXF - 1 ? memmem(d, n, SEP, sizeof SEP - 1) : NULL;
        size_t k = s ? (size_t)(s - d) : n;
        write_file(paths[nfiles], d, k, hole && nfiles == 0);
        nfiles++;
        if (!s)
            break;
        d += k + sizeof SEP - 1;
        n -= k + sizeof SEP - 1;
    }
}

static int devnull = -1;

static void remove_dir(void)
{
    for (int i = 0; i < MAXF; i++)
        unlink(paths[i]);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *base = getenv("FUZZ_TMP") ? getenv("FUZZ_TMP") : "/dev/shm";
    snprintf(dir, sizeof dir, "%.40s/fuzz.%d", base, (int)getpid());
    if (mkdir(dir, 0700) && errno != EEXIST)
        abort();
    for (int i = 0; i < MAXF; i++)
        snprintf(paths[i], sizeof paths[i], "%s/in%d", dir, i);
    devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    atexit(remove_dir);
    return 0;
}

static __attribute__((unused)) void run_shrink(int ctl)
{
    const char *pv[MAXF];
    int ids[MAXF];
    uint64_t counts[P_KINDS * MAXF];
    struct mmleak_shrink_stats st;
    for (int i = 0; i < nfiles; i++) {
        pv[i] = paths[i];
        ids[i] = (ctl & 4) ? 0 : i;     /* one name for all (a directory's rotated files) */
    }
    memset(&st, 0, sizeof st);
#if FUZZ_TARGET == 0
    mmleak_shrink(pv, ids, nfiles, devnull, 5, ctl & 3, cb_header, cb_tick, cb_open,
                  cb_problem, counts, &st);
#else
    static const blocks_fn fns[] = { NULL, mmleak_shrink_blocks, mmleak_shrink_result_blocks,
                                     mmleak_shrink_merge, mmleak_shrink_blocks_merge };
    struct mmleak_blocks bl;
    memset(&bl, 0, sizeof bl);
    int rc = fns[FUZZ_TARGET](pv, ids, nfiles, devnull, 5, cb_header, cb_tick, cb_open,
                              cb_problem, counts, &st,
                              FUZZ_TARGET == 3 && !(ctl & 8) ? NULL : &bl);
    if (rc == 0 && bl.v) {
        volatile uint64_t sink = 0;     /* every block handed over is readable */
        for (uint64_t i = 0; i < bl.n; i++)
            sink ^= bl.v[i].ptr ^ bl.v[i].stack;
        (void)sink;
        mmleak_blocks_free(&bl);
    }
#endif
    mmleak_shrink_stats_free(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int ctl = data[0];
#if FUZZ_TARGET == 6
    uint64_t cap = (uint64_t)(ctl >> 1) * 4;
    uint64_t *out = malloc((cap ? cap : 1) * sizeof *out);
    mmleak_blocks_leb_decode(data + 1, size - 1, out, cap, ctl & 1);
    free(out);
    return 0;
#else
    split(data + 1, size - 1, FUZZ_TARGET != 5 && (ctl & 16));
#if FUZZ_TARGET == 5
    const char *small[MAXF];
    uint64_t extra[4] = { 0x1000, (uint64_t)ctl << 12, UINT64_MAX, 0 };
    for (int i = 1; i < nfiles; i++)
        small[i - 1] = paths[i];
    mmleak_levels_pick(paths[0], small, nfiles - 1, extra, ctl & 3, devnull);
#else
    run_shrink(ctl);
#endif
    return 0;
#endif
}
