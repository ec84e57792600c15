/*
 * mmleak.so: record every allocation and free of a process, for leak hunting.
 *
 * Loaded with LD_PRELOAD.  Every thread appends one text line per event to its own file
 * $MMLEAK_DIR/mmleak.ID.N.out, staged in a MAP_SHARED mapping of mmleak.ID.N.tail, so the
 * kernel keeps every completed line even when the process is killed with SIGKILL.  The dump
 * format is specified in README.rst ("The dump format"); mmleak.py is its reader.
 *
 * Layout of this file:
 *   1. configuration (environment variables) and process-wide state
 *   2. the hot path: sequence numbers, hex formatting, the fast line writers
 *   3. the cold path: bootstrap, files, staging, rotation, maps, fork, thread exit
 *   4. the interposed entry points (malloc & co, C++ operators, strdup)
 *
 * Rules that keep the host safe (each one has bitten a tracer before):
 *   - the hot path takes no lock, makes no syscall, allocates nothing, and calls nothing but
 *     time() (a read of the vDSO page); anything else happens in noinline cold functions
 *     behind one unlikely() branch;
 *   - no descriptor is kept open between cold calls: a daemon that closes every fd and
 *     dup2()s over them can never make us write into one of its files;
 *   - errno is saved and restored around every cold call;
 *   - while our own cold code runs, a thread-local guard makes nested allocation calls
 *     pass straight to the real allocator (our bookkeeping is never recorded).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

extern int rename(const char *, const char *); /* <stdio.h> is not wanted here */

_Static_assert(sizeof(void *) == 8 && sizeof(size_t) == 8, "mmleak supports LP64 only");

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define COLD __attribute__((noinline, cold))
#define EXPORT __attribute__((visibility("default")))
#define HOT_INLINE static inline __attribute__((always_inline))

#define FORMAT_VERSION 1
#define MAXDEPTH 64
/* Room the fast path needs at the cursor: the longest depth-1 line is 12+1+8+1+8+1+8+1+12+1
 * = 53 bytes (the 8-byte stores of the variable-width fields stay inside it), and lines that
 * signal handlers record while we write ours must fit after it without a flush. */
#define FAST_ROOM 256
#define SLOW_LINE (64 + 17 * MAXDEPTH)

/* ---------------------------------------------------------------------------------------
 * 1. Configuration and process-wide state
 * ------------------------------------------------------------------------------------- */

/* Every knob is an environment variable (read with secure_getenv, so setuid programs ignore
 * them); defaults are documented in README.rst. */
static struct {
    char dir[PATH_MAX - 64]; /* MMLEAK_DIR, made absolute at start (default /tmp) */
    int depth;               /* MMLEAK_DEPTH: return addresses per allocation (default 1) */
    size_t rotate;           /* MMLEAK_ROTATE_MB: start a new file past this size (256) */
    size_t buffer;           /* MMLEAK_BUFFER_KB: staging area of a busy thread (1024) */
    int quiet;               /* MMLEAK_QUIET=1: no message on stderr, even on failure */
} cfg;

struct real_fns {
    void *(*malloc)(size_t);
    void (*free)(void *);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void *(*memalign)(size_t, size_t);
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
    void *(*valloc)(size_t);
    void *(*pvalloc)(size_t);
    int (*dlclose)(void *);
    /* C++ operators, used only when malloc fails, so new_handler and bad_alloc behave. */
    void *(*new_)(size_t);
    void *(*new_nothrow)(size_t, const void *);
    void *(*new_al)(size_t, size_t);
    void *(*new_al_nothrow)(size_t, size_t, const void *);
};
static struct real_fns real;

/* The trace id names this process image's files: the pid, or pid-K when mmleak.PID.maps
 * already exists (an exec'd image of the same process, or a reused pid). */
static char g_id[32];
static pid_t g_pid;
static time_t g_t0;                  /* time() at trace start; event times are relative */
static atomic_uint g_next_file;      /* N of the next mmleak.ID.N.out */
static int g_state;                  /* 0: not started, 1: tracing, -1: disabled */
static char g_cmd[2048];             /* escaped command line for the file headers */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* cold path only */
static pthread_key_t g_key;
static int g_key_ok;

/* Event order.  A free in thread B and a later malloc in thread C that returns the same
 * address are ordered by the allocator's own synchronisation; an atomic counter taken
 * before the real free and after the real malloc inherits that order.  One counter per
 * address hash bucket gives every address a total order without one hot shared line:
 * threads working on different memory touch different counters.  Two events of one address
 * whose numbers differ by exactly one are adjacent: nothing happened to that address in
 * between, which is what lets the shrinker cancel them in any grouping of files. */
#define SEQ_BITS 16
static _Atomic uint64_t g_seq[1u << SEQ_BITS] __attribute__((aligned(64)));

/* Per-thread state.  The hot fields come first, in one cache line. */
struct tstate {
    char *cur;            /* next byte to write in the staging half */
    char *end;            /* end of that half; NULL forces the slow path */
    volatile int guard;   /* >0 while mmleak's own code runs in this thread */
    int open;             /* a file is open for this thread */
    int disabled;         /* tracing failed for good; write into scratch */
    int late;             /* this thread's file was closed (thread exit, exit, exec) */
    int late_lines;       /* lines appended directly to it since */
    int exit_rounds;      /* pthread key destructor rounds seen */
    char *stage;          /* shared mapping of the .tail file: two halves */
    size_t half_size;
    int half;             /* the half being written */
    uint64_t out_off;     /* bytes already in the .out file */
    unsigned fileno;      /* N of the current file */
    struct tstate *next, *prev; /* registry of open threads, under g_lock */
    char scratch[256];
};
static __thread struct tstate T __attribute__((tls_model("initial-exec")));
static struct tstate *g_threads;

/* ---------------------------------------------------------------------------------------
 * 2. The hot path
 * ------------------------------------------------------------------------------------- */

HOT_INLINE uint64_t seq_next(const void *p)
{
    uint64_t h = ((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> (64 - SEQ_BITS);
    return atomic_fetch_add_explicit(&g_seq[h], 1, memory_order_relaxed);
}

#if defined(__SSE2__)
#include <emmintrin.h>
/* Sixteen hex digits of v, most significant first: split the bytes into nibbles, interleave
 * them, add '0', and 'a'-'0'-10 where the nibble is above 9.  About ten SSE2 instructions,
 * all x86-64 CPUs have them. */
HOT_INLINE __m128i hex16(uint64_t v)
{
    __m128i x = _mm_cvtsi64_si128((long long)__builtin_bswap64(v));
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi64(x, 4), m), _mm_and_si128(x, m));
    __m128i over9 = _mm_cmpgt_epi8(nib, _mm_set1_epi8(9));
    return _mm_add_epi8(_mm_add_epi8(nib, _mm_set1_epi8('0')),
                        _mm_and_si128(over9, _mm_set1_epi8('a' - '0' - 10)));
}

/* 12 digits, zero padded: the width of every user-space address on x86-64.  Exactly 12
 * bytes are stored (the last field of a line must not spill past its newline). */
HOT_INLINE char *put_hex12(char *d, uint64_t v)
{
    __m128i r = hex16(v << 16);
    _mm_storel_epi64((__m128i *)(void *)d, r);
    uint32_t w = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(r, 8));
    memcpy(d + 8, &w, 4);
    return d + 12;
}

/* Minimal-width hex for v < 2^32; stores 8 bytes, returns the end of the digits. */
HOT_INLINE char *put_hexv(char *d, uint32_t v, unsigned n)
{
    _mm_storel_epi64((__m128i *)(void *)d, hex16((uint64_t)v << (64 - 4 * n)));
    return d + n;
}
#else
/* Portable version: eight hex digits of x as eight ASCII bytes, most significant first in
 * memory (SWAR: spread the nibbles into bytes, then add '0', and 'a'-'0'-10 above 9). */
HOT_INLINE uint64_t hex8(uint32_t x)
{
    uint64_t v = x;
    v = (v | (v << 16)) & 0x0000FFFF0000FFFFull;
    v = (v | (v << 8)) & 0x00FF00FF00FF00FFull;
    v = (v | (v << 4)) & 0x0F0F0F0F0F0F0F0Full;
    v = __builtin_bswap64(v);
    uint64_t letters = ((v + 0x0606060606060606ull) >> 4) & 0x0101010101010101ull;
    return v + 0x3030303030303030ull + letters * 0x27;
}

HOT_INLINE char *put_hex12(char *d, uint64_t v)
{
    uint32_t hi = (uint32_t)(hex8((uint32_t)(v >> 32)) >> 32);
    uint64_t lo = hex8((uint32_t)v);
    memcpy(d, &hi, 4);
    memcpy(d + 4, &lo, 8);
    return d + 12;
}

HOT_INLINE char *put_hexv(char *d, uint32_t v, unsigned n)
{
    uint64_t w = hex8(v << (32 - 4 * n));
    memcpy(d, &w, 8);
    return d + n;
}
#endif

/* Hex digits of v < 2^32 (at least one). */
HOT_INLINE unsigned ndig(uint32_t v)
{
    return (32 - (unsigned)__builtin_clz(v | 1) + 3) >> 2;
}

/* Take n bytes at the cursor.  One instruction on x86-64 (xadd without lock: only this
 * thread writes the cursor, but a signal handler may run between any two instructions of
 * it): a handler that records an event of its own gets the bytes after ours, and neither
 * line is cut into the other. */
HOT_INLINE char *reserve(struct tstate *t, size_t n)
{
#if defined(__x86_64__)
    char *d = (char *)n;
    __asm__ volatile("xaddq %0, %1" : "+r"(d), "+m"(t->cur) : : "memory");
    return d;
#else
    char *d = t->cur;
    t->cur = d + n;
    atomic_signal_fence(memory_order_seq_cst);
    return d;
#endif
}

COLD static void slow_alloc(void *p, size_t n, const void *ra);
COLD static void slow_free(void *p, uint64_t s, const void *ra);

/* One allocation line: PTR SEQ SIZE TIME CALLER.  The newline is stored last, behind a
 * compiler barrier, so a process killed in the middle leaves a line without newline that
 * readers recognise as torn, never a short line that parses. */
HOT_INLINE void rec_alloc(void *p, size_t n, const void *ra)
{
    struct tstate *t = &T;
    if (unlikely((t->end - t->cur < FAST_ROOM) | t->guard | (cfg.depth != 1))) {
        slow_alloc(p, n, ra);
        return;
    }
    uint64_t s = seq_next(p);
    uint64_t now = (uint64_t)(time(NULL) - g_t0);
    uintptr_t c = (uintptr_t)ra - 1; /* inside the call instruction: names the calling line */
    if (unlikely(((s | n | now) >> 32) | (((uintptr_t)p | c) >> 48))) {
        slow_alloc(p, n, ra); /* rare: huge block, clock jump, or a wide address */
        return;
    }
    unsigned ns = ndig((uint32_t)s), nn = ndig((uint32_t)n), nt = ndig((uint32_t)now);
    char *d = reserve(t, 12 + 1 + ns + 1 + nn + 1 + nt + 1 + 12 + 1);
    d = put_hex12(d, (uintptr_t)p);
    *d++ = ' ';
    d = put_hexv(d, (uint32_t)s, ns);
    *d++ = ' ';
    d = put_hexv(d, (uint32_t)n, nn);
    *d++ = ' ';
    d = put_hexv(d, (uint32_t)now, nt);
    *d++ = ' ';
    d = put_hex12(d, c);
    atomic_signal_fence(memory_order_release);
    *d = '\n';
}

/* One free line: PTR SEQ CALLER.  The number is taken before the real free runs. */
HOT_INLINE void rec_free(void *p, uint64_t s, const void *ra)
{
    struct tstate *t = &T;
    uintptr_t c = (uintptr_t)ra - 1;
    if (unlikely((t->end - t->cur < FAST_ROOM) | t->guard | (((s >> 32) | (((uintptr_t)p | c) >> 48)) != 0))) {
        slow_free(p, s, ra);
        return;
    }
    unsigned ns = ndig((uint32_t)s);
    char *d = reserve(t, 12 + 1 + ns + 1 + 12 + 1);
    d = put_hex12(d, (uintptr_t)p);
    *d++ = ' ';
    d = put_hexv(d, (uint32_t)s, ns);
    *d++ = ' ';
    d = put_hex12(d, c);
    atomic_signal_fence(memory_order_release);
    *d = '\n';
}

/* ---------------------------------------------------------------------------------------
 * 3. The cold path
 * ------------------------------------------------------------------------------------- */

/* Some callers of malloc run before libc can give us dlsym: serve them from a static
 * arena.  Blocks from it are never recorded (they are mmleak's, not the program's) and
 * never passed to the real free. */
static char boot_arena[64 * 1024] __attribute__((aligned(64)));
static size_t boot_used;

static int in_boot(const void *p)
{
    return (const char *)p >= boot_arena && (const char *)p < boot_arena + sizeof boot_arena;
}

static void *boot_alloc(size_t n)
{
    size_t need = (n + 16 + 15) & ~(size_t)15;
    if (boot_used + need > sizeof boot_arena)
        return NULL;
    char *p = boot_arena + boot_used;
    boot_used += need;
    memcpy(p, &n, sizeof n); /* size header, for realloc */
    return p + 16;
}

static size_t boot_size(const void *p)
{
    size_t n;
    memcpy(&n, (const char *)p - 16, sizeof n);
    return n;
}

struct guard_scope { struct tstate *t; int saved_errno; };

static struct guard_scope guard_enter(void)
{
    struct guard_scope g = { &T, errno };
    g.t->guard++;
    return g;
}

static void guard_leave(struct guard_scope *g)
{
    g->t->guard--;
    errno = g->saved_errno;
}

#define GUARDED struct guard_scope _gs __attribute__((cleanup(guard_leave))) = guard_enter()

static size_t my_strlen(const char *s) { size_t n = 0; while (s[n]) n++; return n; }

/* Append src to d without passing end; returns the new end (always NUL terminated). */
static char *cat(char *d, char *end, const char *src)
{
    while (*src && d + 1 < end)
        *d++ = *src++;
    *d = 0;
    return d;
}

static char *cat_u(char *d, char *end, unsigned long v)
{
    char b[24];
    int i = 23;
    b[i] = 0;
    do { b[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    return cat(d, end, b + i);
}

/* The reason for a failed write, for the one message we print (strerror may allocate). */
static const char *why_failed(void)
{
    switch (errno) {
    case ENOSPC: case EDQUOT: return ": disk full: tracing stopped";
    case EACCES: case EPERM: return ": permission denied (did the program change its user, "
                                    "or the directory's permissions?): tracing stopped";
    case ENOENT: return ": the file was removed: tracing stopped";
    default: return ": tracing stopped";
    }
}

static void say(const char *a, const char *b, const char *c)
{
    if (cfg.quiet)
        return;
    char msg[PATH_MAX + 256], *e = msg + sizeof msg, *d = msg;
    d = cat(d, e, "mmleak: ");
    d = cat(d, e, a);
    d = cat(d, e, b ? b : "");
    d = cat(d, e, c ? c : "");
    d = cat(d, e, "\n");
    ssize_t r = write(2, msg, (size_t)(d - msg));
    (void)r;
}

static long env_num(const char *name, long def, long lo, long hi)
{
    const char *s = secure_getenv(name);
    if (!s || !*s)
        return def;
    char *e;
    long v = strtol(s, &e, 10);
    if (*e || v < lo || v > hi) {
        say("ignoring invalid ", name, "");
        return def;
    }
    return v;
}

static void read_config(void)
{
    const char *dir = secure_getenv("MMLEAK_DIR");
    if (!dir || !*dir)
        dir = "/tmp";
    char *e = cfg.dir + sizeof cfg.dir, *d = cfg.dir;
    if (dir[0] != '/') { /* the program may chdir later: pin the directory now */
        if (!getcwd(cfg.dir, sizeof cfg.dir - 2))
            cfg.dir[0] = 0;
        d = cfg.dir + my_strlen(cfg.dir);
        d = cat(d, e, "/");
    }
    cat(d, e, dir);
    cfg.quiet = (int)env_num("MMLEAK_QUIET", 0, 0, 1);
    cfg.depth = (int)env_num("MMLEAK_DEPTH", 1, 1, MAXDEPTH);
    cfg.rotate = (size_t)env_num("MMLEAK_ROTATE_MB", 256, 1, 1 << 20) << 20;
    cfg.buffer = (size_t)env_num("MMLEAK_BUFFER_KB", 1024, 16, 1 << 20) << 10;
}

static void *sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static atomic_int g_resolving;

COLD static void resolve(void)
{
    if (atomic_exchange(&g_resolving, 1)) /* nested call from dlsym: the boot arena serves */
        return;
    struct real_fns r;
    r.malloc = sym("malloc");
    r.free = sym("free");
    r.calloc = sym("calloc");
    r.realloc = sym("realloc");
    r.memalign = sym("memalign");
    r.posix_memalign = sym("posix_memalign");
    r.aligned_alloc = sym("aligned_alloc");
    r.valloc = sym("valloc");
    r.pvalloc = sym("pvalloc");
    r.dlclose = sym("dlclose");
    r.new_ = NULL;
    r.new_nothrow = NULL;
    r.new_al = NULL;
    r.new_al_nothrow = NULL;
    if (!r.malloc || !r.free || !r.calloc || !r.realloc || !r.memalign) {
        static const char m[] = "mmleak: cannot find the real malloc; aborting\n";
        ssize_t w = write(2, m, sizeof m - 1);
        (void)w;
        abort();
    }
    real = r;
}

/* ---- files ---- */

static char *file_path(char *buf, size_t len, const char *id, const char *suffix)
{
    char *e = buf + len, *d = buf;
    d = cat(d, e, cfg.dir);
    d = cat(d, e, "/mmleak.");
    d = cat(d, e, id);
    d = cat(d, e, suffix);
    return buf;
}

static int open_excl(const char *path)
{
    return open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

/* Re-open one of our files by name.  We refuse anything but a regular file of ours (root's
 * files may belong to the user a daemon is about to become: see give_files_to). */
static int open_again(const char *path)
{
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    uid_t me = geteuid();
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (st.st_uid != me && me != 0)) {
        close(fd);
        return -1;
    }
    return fd;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static char *hexw(char *d, uint64_t v, int width);

/* ---- the maps file: a sorted union of every file-backed mapping seen in this process ---- */

struct mline { uint64_t start; uint32_t off, len; };
static struct {
    char *text; size_t tlen, tcap;      /* unique lines, back to back */
    struct mline *ln; size_t n, cap;    /* sorted by start address */
    unsigned long long adds, subs;      /* dl_iterate_phdr counters at the last snapshot */
    char *buf; size_t bcap;             /* scratch for reading /proc/self/maps */
} M;

static void *grow(void *p, size_t *cap, size_t need, size_t unit)
{
    if (need <= *cap)
        return p;
    size_t ncap = *cap ? *cap : 4096 / unit + 1;
    while (ncap < need)
        ncap *= 2;
    void *q = mmap(NULL, ncap * unit, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED)
        return NULL;
    if (p) {
        memcpy(q, p, *cap * unit);
        munmap(p, *cap * unit);
    }
    *cap = ncap;
    return q;
}

static uint64_t parse_hex(const char *s, const char **end)
{
    uint64_t v = 0;
    for (;; s++) {
        unsigned c = (unsigned char)*s;
        if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
        else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
        else break;
    }
    *end = s;
    return v;
}

/* Keep lines that name a file: eu-addr2line -M needs every segment of a module. */
static int wanted_map_line(const char *l, size_t n)
{
    const char *slash = memchr(l, '/', n);
    return slash && slash > l && slash[-1] == ' ';
}

static int maps_add(const char *l, size_t n)
{
    for (size_t i = 0; i < M.n; i++)
        if (M.ln[i].len == n && !memcmp(M.text + M.ln[i].off, l, n))
            return 0;
    char *t = grow(M.text, &M.tcap, M.tlen + n, 1);
    struct mline *a = grow(M.ln, &M.cap, M.n + 1, sizeof *a);
    if (!t || !a)
        return 0;
    M.text = t;
    M.ln = a;
    memcpy(M.text + M.tlen, l, n);
    const char *e;
    uint64_t start = parse_hex(l, &e);
    size_t i = M.n;
    while (i > 0 && M.ln[i - 1].start > start) {
        M.ln[i] = M.ln[i - 1];
        i--;
    }
    M.ln[i] = (struct mline){ start, (uint32_t)M.tlen, (uint32_t)n };
    M.n++;
    M.tlen += n;
    return 1;
}

static int phdr_counts(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    unsigned long long *c = data;
    c[0] = info->dlpi_adds;
    c[1] = info->dlpi_subs;
    return 1;
}

/* Merge /proc/self/maps into the table and rewrite mmleak.ID.maps (temp file + rename) when
 * anything is new.  force=0 skips the work when no object was loaded or unloaded since. */
static void maps_snapshot_locked(int force, const unsigned long long c[2])
{
    if (!force && c[0] == M.adds && c[1] == M.subs)
        return;
    M.adds = c[0];
    M.subs = c[1];
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    size_t len = 0;
    for (;;) {
        char *b = grow(M.buf, &M.bcap, len + 65536, 1);
        if (!b)
            break;
        M.buf = b;
        ssize_t r = read(fd, M.buf + len, M.bcap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    int changed = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(M.buf + i, '\n', len - i);
        size_t n = (nl ? (size_t)(nl - (M.buf + i)) : len - i) + 1;
        if (nl && wanted_map_line(M.buf + i, n - 1))
            changed |= maps_add(M.buf + i, n);
        i += n;
    }
    if (!changed && !force)
        return;
    char path[PATH_MAX], tmp[PATH_MAX];
    file_path(path, sizeof path, g_id, ".maps");
    file_path(tmp, sizeof tmp, g_id, ".maps.tmp");
    unlink(tmp);
    fd = open_excl(tmp);
    if (fd < 0)
        return;
    for (size_t i = 0; i < M.n; i++)
        write_all(fd, M.text + M.ln[i].off, M.ln[i].len);
    close(fd);
    if (rename(tmp, path))
        unlink(tmp);
}

/* The loader's counters are read before g_lock is taken: dl_iterate_phdr takes the loader's
 * lock, and a thread inside dlopen() may be waiting for g_lock in its malloc. */
COLD static void maps_snapshot(int force)
{
    unsigned long long c[2] = { 0, 0 };
    dl_iterate_phdr(phdr_counts, c);
    pthread_mutex_lock(&g_lock);
    maps_snapshot_locked(force, c);
    pthread_mutex_unlock(&g_lock);
}

/* ---- process start ---- */

static void read_cmdline(void)
{
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    char raw[sizeof g_cmd / 4];
    ssize_t n = fd >= 0 ? read(fd, raw, sizeof raw) : -1;
    if (fd >= 0)
        close(fd);
    char *d = g_cmd, *e = g_cmd + sizeof g_cmd - 8;
    for (ssize_t i = 0; i < n && d < e; i++) {
        unsigned char ch = (unsigned char)raw[i];
        if (ch == 0) {
            if (i + 1 < n)
                *d++ = ' ';
        } else if (ch < 0x20 || ch >= 0x7f || ch == '\\') {
            static const char hx[] = "0123456789abcdef";
            *d++ = '\\'; *d++ = 'x'; *d++ = hx[ch >> 4]; *d++ = hx[ch & 15];
        } else {
            *d++ = (char)ch;
        }
    }
    *d = 0;
}

/* Reserve a trace id with an O_EXCL create of mmleak.ID.maps: the pid, else pid-1, pid-2.. */
static int reserve_id(void)
{
    char path[PATH_MAX];
    for (int k = 0; k < 1000; k++) {
        char *e = g_id + sizeof g_id, *d = g_id;
        d = cat_u(d, e, (unsigned long)g_pid);
        if (k) {
            d = cat(d, e, "-");
            cat_u(d, e, (unsigned long)k);
        }
        int fd = open_excl(file_path(path, sizeof path, g_id, ".maps"));
        if (fd >= 0) {
            close(fd);
            return 0;
        }
        if (errno != EEXIST)
            break;
    }
    say("cannot create files in ", cfg.dir, ": tracing disabled (set MMLEAK_DIR to a writable directory)");
    return -1;
}

static void thread_exit(void *arg);
static int unpark(struct tstate *t);
static void fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void fork_child(void);

/* Called under g_lock, with the guard held. */
static void process_start(void)
{
    g_pid = getpid();
    g_t0 = time(NULL);
    if (reserve_id()) {
        g_state = -1;
        return;
    }
    g_state = 1;
    atomic_store(&g_next_file, 0);
    unsigned long long c[2] = { 0, 0 };
    maps_snapshot_locked(1, c);
}

static int g_once_done;

COLD static void global_init(void)
{
    if (!real.malloc)
        resolve();
    pthread_mutex_lock(&g_lock);
    if (!g_once_done) {
        g_once_done = 1;
        read_config();
        read_cmdline();
        if (!pthread_key_create(&g_key, thread_exit))
            g_key_ok = 1;
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        if (cfg.depth > 1) { /* the first backtrace() loads libgcc_s: do it now */
            void *b[4];
            backtrace(b, 4);
        }
        process_start();
    }
    pthread_mutex_unlock(&g_lock);
}

/* ---- per-thread files: the staging area and the dump file ----
 *
 * Events are written into a small shared mapping of mmleak.ID.N.tail (two halves, reused)
 * and, one half at a time, appended to mmleak.ID.N.out with pwrite().  Why not map the .out
 * file and write there directly: every fresh page of a growing file mapping costs a fault
 * (or a populate), a zeroing and a TLB entry, and that came to twice the rest of an event;
 * the kernel's write path fills page cache far more cheaply, and the staging pages stay hot
 * in the cache.  The staging file is a shared mapping, so a killed process loses nothing:
 * each half starts with "#at OFFSET", where in .out its lines belong, and readers append
 * what .out does not have yet (`mmleak.py recover` folds it in for good).  A clean close
 * flushes the last half and deletes the .tail: the .out file is then exact. */

#define HALF_HDR 32
/* The end of every half is kept free for signal handlers: an event recorded by a handler
 * that interrupted us in the middle of a line must not flush the half under that line, so
 * when the half is full it goes here instead (see emit). */
#define SLACK 4096
#define START_HALF (32 * 1024)

static char *side_path(char *buf, size_t len, unsigned n, const char *ext)
{
    char num[32], *d = num;
    d = cat(d, num + sizeof num, ".");
    d = cat_u(d, num + sizeof num, n);
    cat(d, num + sizeof num, ext);
    return file_path(buf, len, g_id, num);
}

static char *dump_path(char *buf, size_t len, unsigned n)
{
    return side_path(buf, len, n, ".out");
}

static void stage_drop(struct tstate *t)
{
    if (t->stage)
        munmap(t->stage, 2 * t->half_size);
    t->stage = NULL;
    t->cur = t->end = NULL;
}

/* Begin writing into half h: clear it first (so a line torn by a kill is followed by NULs,
 * never by the stale end of an older line), then stamp where its lines go in .out. */
static void half_start(struct tstate *t, int h)
{
    char *b = t->stage + (size_t)h * t->half_size;
    memset(b, 0, t->half_size);
    atomic_signal_fence(memory_order_seq_cst);
    char hdr[HALF_HDR], *d = hdr;
    memcpy(d, "#at ", 4);
    d = hexw(d + 4, t->out_off, 16);
    while (d < hdr + HALF_HDR - 1)
        *d++ = ' ';
    *d = '\n';
    memcpy(b, hdr, HALF_HDR);
    t->half = h;
    t->cur = b + HALF_HDR;
    t->end = b + t->half_size - SLACK;
}

/* Append the current half's lines to .out (opened by name: we keep no descriptor). */
static int flush_half(struct tstate *t)
{
    char *b = t->stage + (size_t)t->half * t->half_size + HALF_HDR;
    size_t n = (size_t)(t->cur - b), done = 0;
    if (n == 0)
        return 0;
    char path[PATH_MAX];
    int fd = open_again(dump_path(path, sizeof path, t->fileno));
    if (fd < 0)
        return -1;
    while (done < n) {
        ssize_t w = pwrite(fd, b + done, n - done, (off_t)(t->out_off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    close(fd);
    t->out_off += done;
    return done == n ? 0 : -1;
}

/* A thread that filled its first half is a busy one: give it the full MMLEAK_BUFFER_KB.  Every
 * staged line is in .out at this point, so the old content is simply dropped (truncated to
 * nothing first, so that no old "#at" header survives at a place the new layout reads). */
static int grow_stage(struct tstate *t)
{
    char path[PATH_MAX];
    int fd = open_again(side_path(path, sizeof path, t->fileno, ".tail"));
    if (fd < 0)
        return -1;
    size_t half = cfg.buffer / 2;
    void *p = MAP_FAILED;
    if (ftruncate(fd, 0) == 0 && posix_fallocate(fd, 0, (off_t)(2 * half)) == 0)
        p = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        /* keep writing the small one (its pages are still there unless truncated) */
        if (ftruncate(fd, (off_t)(2 * t->half_size)) != 0 ||
            posix_fallocate(fd, 0, (off_t)(2 * t->half_size)) != 0) {
            close(fd);
            return -2;
        }
        close(fd);
        return -1;
    }
    close(fd);
    munmap(t->stage, 2 * t->half_size);
    t->stage = p;
    t->half_size = half;
    return 0;
}

/* Flush, end the file with "#end", delete the staging file, forget both. */
static void file_close(struct tstate *t, int trailer)
{
    if (!t->stage)
        return;
    if (trailer) {
        if (t->end - t->cur < 8 && flush_half(t) == 0)
            half_start(t, t->half ^ 1);
        if (t->end - t->cur >= 8) {
            memcpy(t->cur, "#end\n", 5);
            t->cur += 5;
        }
    }
    flush_half(t);
    char path[PATH_MAX];
    unlink(side_path(path, sizeof path, t->fileno, ".tail"));
    stage_drop(t);
    t->open = 0;
}

static void registry_add(struct tstate *t)
{
    t->prev = NULL;
    t->next = g_threads;
    if (g_threads)
        g_threads->prev = t;
    g_threads = t;
}

static void registry_del(struct tstate *t)
{
    if (t->prev) t->prev->next = t->next;
    else if (g_threads == t) g_threads = t->next;
    if (t->next) t->next->prev = t->prev;
    t->next = t->prev = NULL;
}

static void write_header(struct tstate *t)
{
    char h[sizeof g_cmd + 512], *e = h + sizeof h, *d = h;
    d = cat(d, e, "#mmleak ");
    d = cat_u(d, e, FORMAT_VERSION);
    d = cat(d, e, " id=");
    d = cat(d, e, g_id);
    d = cat(d, e, " pid=");
    d = cat_u(d, e, (unsigned long)g_pid);
    d = cat(d, e, " tid=");
    d = cat_u(d, e, (unsigned long)syscall(SYS_gettid));
    d = cat(d, e, " file=");
    d = cat_u(d, e, t->fileno);
    d = cat(d, e, " depth=");
    d = cat_u(d, e, (unsigned long)cfg.depth);
    d = cat(d, e, " start=");
    d = cat_u(d, e, (unsigned long)g_t0);
    d = cat(d, e, t->late ? " late=1" : "");
    d = cat(d, e, "\n#cmd ");
    d = cat(d, e, g_cmd);
    d = cat(d, e, "\n");
    size_t n = (size_t)(d - h);
    if (t->end - t->cur >= (ptrdiff_t)n) {
        memcpy(t->cur, h, n);
        t->cur += n;
    }
}

static void go_scratch(struct tstate *t)
{
    t->disabled = 1;
    t->cur = t->scratch;
    t->end = t->scratch + sizeof t->scratch;
}

/* Open a new dump file for this thread: mmleak.ID.N.out and its staging file .N.tail, both
 * created O_EXCL|O_NOFOLLOW, mode 0600: a name somebody else made is skipped, not used. */
static int file_open(struct tstate *t)
{
    char path[PATH_MAX], tpath[PATH_MAX];
    for (int tries = 0; tries < 64; tries++) {
        t->fileno = atomic_fetch_add(&g_next_file, 1);
        int fd = open_excl(dump_path(path, sizeof path, t->fileno));
        if (fd < 0) {
            if (errno == EEXIST)
                continue;
            return -1;
        }
        close(fd);
        fd = open_excl(side_path(tpath, sizeof tpath, t->fileno, ".tail"));
        if (fd < 0) {
            int e = errno;
            unlink(path);
            if (e == EEXIST)
                continue;
            return -1;
        }
        /* small at first: most threads make few events; grown at the first full half */
        t->half_size = (cfg.buffer < 2 * START_HALF ? cfg.buffer : 2 * START_HALF) / 2;
        void *p = MAP_FAILED;
        /* fallocate, not just ftruncate: a full disk must fail here, not SIGBUS later */
        if (posix_fallocate(fd, 0, (off_t)(2 * t->half_size)) == 0)
            p = mmap(NULL, 2 * t->half_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            unlink(tpath);
            unlink(path);
            return -1;
        }
        t->stage = p;
        t->out_off = 0;
        half_start(t, 0);
        t->open = 1;
        t->late_lines = 0;
        write_header(t);
        return 0;
    }
    return -1;
}

/* Make room for `need` bytes at t->cur: open the thread's files, flush a half, rotate. */
static int make_room(struct tstate *t, size_t need)
{
    if (t->disabled) {
        t->cur = t->scratch;
        return (size_t)(t->end - t->cur) >= need ? 0 : -1;
    }
    if (g_state == 0 || g_pid != getpid()) {
        /* not started yet, or a child made by a raw clone() that skipped our atfork hook */
        if (g_state != 0)
            fork_child();
        global_init();
    }
    if (g_state < 0) {
        go_scratch(t);
        return -1;
    }
    if (!t->open) {
        if (unpark(t) && file_open(t)) {
            static atomic_int said;
            if (!atomic_exchange(&said, 1))
                say("cannot write dump files in ", cfg.dir, ": tracing of the thread stopped");
            go_scratch(t);
            return -1;
        }
        pthread_mutex_lock(&g_lock);
        registry_add(t);
        pthread_mutex_unlock(&g_lock);
        t->exit_rounds = 0;
        if (g_key_ok)
            pthread_setspecific(g_key, t);
        maps_snapshot(0);
        if ((size_t)(t->end - t->cur) >= need)
            return 0;
    }
    /* the current half is full */
    if (t->out_off >= cfg.rotate) {
        file_close(t, 1);
        pthread_mutex_lock(&g_lock);
        registry_del(t);
        pthread_mutex_unlock(&g_lock);
        return make_room(t, need);
    }
    if (flush_half(t)) {
        say("cannot write a dump file in ", cfg.dir, why_failed());
        file_close(t, 0);
        go_scratch(t);
        return -1;
    }
    int grown = 2 * t->half_size < cfg.buffer ? grow_stage(t) : -1;
    if (grown == -2) { /* the staging file is gone and cannot be sized again: stop here */
        say("cannot write a dump file in ", cfg.dir, why_failed());
        char path[PATH_MAX];
        unlink(side_path(path, sizeof path, t->fileno, ".tail"));
        stage_drop(t);
        t->open = 0;
        go_scratch(t);
        return -1;
    }
    half_start(t, grown == 0 ? 0 : t->half ^ 1);
    maps_snapshot(0);
    return (size_t)(t->end - t->cur) >= need ? 0 : -1;
}

static char *hexw(char *d, uint64_t v, int width)
{
    static const char hx[] = "0123456789abcdef";
    char b[16];
    int n = 0;
    do { b[n++] = hx[v & 15]; v >>= 4; } while (v);
    while (n < width)
        b[n++] = '0';
    while (n)
        *d++ = b[--n];
    return d;
}

/* Is a line being written under us (we are a signal handler that interrupted it)?  Its
 * newline slot, written last, is still the zero the half was cleared with, and finished text
 * never has a NUL: a look at the recent bytes answers it.  Asked only before a flush. */
static int unfinished_line(const struct tstate *t)
{
    if (!t->stage || !t->cur)
        return 0;
    char *lo = t->stage + (size_t)t->half * t->half_size + HALF_HDR;
    char *from = t->cur - lo > 2 * SLACK ? t->cur - 2 * SLACK : lo;
    return from < t->cur && memchr(from, 0, (size_t)(t->cur - from)) != NULL;
}

/* After a thread's file was closed (its exit, process exit, exec), a few more events may
 * come: destructors, execvp's search of PATH.  They are appended to that same file, a write
 * each, rather than opening a new file and staging file for them; past LATE_DIRECT lines
 * the thread is evidently going on (a failed exec) and gets a new file. */
#define LATE_DIRECT 256

static int late_direct(const struct tstate *t)
{
    return t->late && !t->open && !t->disabled && t->late_lines < LATE_DIRECT &&
           g_state > 0 && g_pid == getpid();
}

static void append_direct(struct tstate *t, const char *line, size_t n)
{
    char path[PATH_MAX];
    int fd = open(dump_path(path, sizeof path, t->fileno),
                  O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        write_all(fd, line, n);
        close(fd);
    }
    t->late_lines++;
}

/* The general writer: any width, any depth.  Builds the line on the stack, then reserves
 * its bytes and copies them, newline last. */
static void emit(const char *line, size_t n)
{
    struct tstate *t = &T;
    if (t->end - t->cur < (ptrdiff_t)(n + 16)) {
        if (late_direct(t)) {
            append_direct(t, line, n);
            return;
        }
        if (unfinished_line(t)) {
            /* a signal handler, while the line it interrupted is unfinished: no flush */
            if (!t->stage || t->end + SLACK - t->cur < (ptrdiff_t)(n + 16))
                return; /* deeper than the slack: lost (and the interrupted line kept) */
        } else if (make_room(t, n + 16)) {
            return;
        }
    }
    char *d = reserve(t, n);
    memcpy(d, line, n - 1);
    atomic_signal_fence(memory_order_release);
    d[n - 1] = '\n';
}

COLD static void slow_alloc(void *p, size_t n, const void *ra)
{
    struct tstate *t = &T;
    if (t->guard)
        return;
    GUARDED;
    if (!t->open && !t->disabled && !late_direct(t) && make_room(t, FAST_ROOM))
        return;
    uint64_t s = seq_next(p);
    time_t now = time(NULL) - g_t0;
    char line[SLOW_LINE], *d = line;
    d = hexw(d, (uintptr_t)p, 12);
    *d++ = ' ';
    d = hexw(d, s, 1);
    *d++ = ' ';
    d = hexw(d, n, 1);
    *d++ = ' ';
    d = hexw(d, now < 0 ? 0 : (uint64_t)now, 1);
    *d++ = ' ';
    d = hexw(d, (uintptr_t)ra - 1, 12);
    if (cfg.depth > 1) {
        /* Our own frames above the caller are slow_alloc and the entry point: ask for just
         * two more than wanted (every frame unwound costs), more only if ra is not there. */
        void *bt[MAXDEPTH + 8];
        int k = backtrace(bt, cfg.depth + 2), i = 0;
        while (i < k && bt[i] != ra)
            i++;
        if (i == k) {
            k = backtrace(bt, cfg.depth + 8);
            for (i = 0; i < k && bt[i] != ra; i++)
                ;
        }
        for (int j = i + 1; j < k && j <= i + cfg.depth - 1; j++) {
            *d++ = ' ';
            d = hexw(d, (uintptr_t)bt[j] - 1, 12);
        }
    }
    *d++ = '\n';
    emit(line, (size_t)(d - line));
}

COLD static void slow_free(void *p, uint64_t s, const void *ra)
{
    struct tstate *t = &T;
    if (t->guard)
        return;
    GUARDED;
    if (!t->open && !t->disabled && !late_direct(t) && make_room(t, FAST_ROOM))
        return;
    char line[64], *d = line;
    d = hexw(d, (uintptr_t)p, 12);
    *d++ = ' ';
    d = hexw(d, s, 1);
    *d++ = ' ';
    d = hexw(d, (uintptr_t)ra - 1, 12);
    *d++ = '\n';
    emit(line, (size_t)(d - line));
}

/* A free takes its number before the real free: after it, another thread may already own the
 * address again. */
HOT_INLINE void note_free(void *p, const void *ra)
{
    rec_free(p, seq_next(p), ra);
}

/* Files of exited threads, kept for the next new thread: a program that starts thousands of
 * short threads writes about as many files as it ever had threads at once, not thousands.
 * A parked file is fully flushed; its staging mapping stays.  Under g_lock. */
struct parked { unsigned fileno; char *stage; size_t half_size; uint64_t out_off; };
static struct { struct parked *a; size_t n, cap; } P;

static void park(struct tstate *t)
{
    pthread_mutex_lock(&g_lock);
    registry_del(t);
    struct parked *a = flush_half(t) == 0 ? grow(P.a, &P.cap, P.n + 1, sizeof *a) : NULL;
    if (a) {
        P.a = a;
        P.a[P.n++] = (struct parked){ t->fileno, t->stage, t->half_size, t->out_off };
        t->stage = NULL;
        t->cur = t->end = NULL;
        t->open = 0;
    }
    pthread_mutex_unlock(&g_lock);
    if (t->open) /* could not park: close it as before */
        file_close(t, 1);
    t->late = 1;
    t->late_lines = LATE_DIRECT; /* the file may soon be another thread's: no direct appends */
}

/* A new thread continues a parked file, if there is one; "#thread" marks the handover. */
static int unpark(struct tstate *t)
{
    struct parked p;
    pthread_mutex_lock(&g_lock);
    int got = P.n > 0;
    if (got)
        p = P.a[--P.n];
    pthread_mutex_unlock(&g_lock);
    if (!got)
        return -1;
    t->fileno = p.fileno;
    t->stage = p.stage;
    t->half_size = p.half_size;
    t->out_off = p.out_off;
    half_start(t, 0);
    t->open = 1;
    t->late = 0;
    t->late_lines = 0;
    t->exit_rounds = 0;
    char line[64], *d = line, *e = line + sizeof line;
    d = cat(d, e, "#thread tid=");
    d = cat_u(d, e, (unsigned long)syscall(SYS_gettid));
    d = cat(d, e, "\n");
    memcpy(t->cur, line, (size_t)(d - line));
    t->cur += d - line;
    return 0;
}

/* Close every parked file (process exit). */
static void close_parked(void)
{
    pthread_mutex_lock(&g_lock);
    while (P.n > 0) {
        struct parked p = P.a[--P.n];
        struct tstate tmp;
        memset(&tmp, 0, sizeof tmp);
        tmp.fileno = p.fileno;
        tmp.stage = p.stage;
        tmp.half_size = p.half_size;
        tmp.out_off = p.out_off;
        half_start(&tmp, 0);
        file_close(&tmp, 1);
    }
    pthread_mutex_unlock(&g_lock);
}

/* pthread key destructor: the thread is exiting.  Other libraries' destructors run in the
 * same rounds and may still free memory, so we re-arm our key and only give the file up in
 * the last round, parked for the next thread.  The rare events after that open a new file. */
static void thread_exit(void *arg)
{
    struct tstate *t = arg;
    if (t != &T || !t->open)
        return;
    if (++t->exit_rounds < PTHREAD_DESTRUCTOR_ITERATIONS && g_key_ok) {
        pthread_setspecific(g_key, t);
        return;
    }
    GUARDED;
    maps_snapshot(0);
    park(t);
}

/* In the child of fork: the staging areas we inherited are the parent's files.  Unmap them
 * (the parent keeps writing them) and start a trace of our own under the child's pid. */
static void fork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    int saved = errno;
    T.guard++;
    for (struct tstate *o = g_threads; o; o = o->next)
        if (o != &T && o->stage)
            munmap(o->stage, 2 * o->half_size); /* those threads do not exist in the child */
    g_threads = NULL;
    for (size_t i = 0; i < P.n; i++)
        munmap(P.a[i].stage, 2 * P.a[i].half_size);
    P.n = 0;
    stage_drop(&T);
    T.open = 0;
    T.late = 0;
    if (g_state > 0)
        process_start();
    T.guard--;
    errno = saved;
}

/* Our malloc under a name the dynamic linker cannot rebind: &malloc itself would give the
 * process's malloc, whoever provides it. */
extern void *mmleak_own_malloc(size_t) __attribute__((alias("malloc"), visibility("hidden"), copy(malloc)));

/* Is this library one of the preloaded ones (LD_PRELOAD, /etc/ld.so.preload)?  Compared by
 * device and inode, or by file name for entries without a slash. */
static int named_in(const char *list, const struct stat *self, const char *self_base)
{
    char item[PATH_MAX];
    while (list && *list) {
        while (*list == ' ' || *list == ':' || *list == '\t' || *list == '\n')
            list++;
        size_t n = 0;
        while (list[n] && list[n] != ' ' && list[n] != ':' && list[n] != '\t' && list[n] != '\n')
            n++;
        if (n && n < sizeof item) {
            memcpy(item, list, n);
            item[n] = 0;
            struct stat st;
            if (strchr(item, '/') ? (stat(item, &st) == 0 && st.st_dev == self->st_dev &&
                                     st.st_ino == self->st_ino)
                                  : strcmp(item, self_base) == 0)
                return 1;
        }
        list += n;
    }
    return 0;
}

static int preloaded(void)
{
    /* dlsym finds our malloc first when we were preloaded into a position-independent
     * program; a non-PIE program has a canonical PLT entry for malloc, so ask the lists. */
    if (dlsym(RTLD_DEFAULT, "malloc") == (void *)mmleak_own_malloc)
        return 1;
    Dl_info di;
    struct stat self;
    if (!dladdr((void *)mmleak_own_malloc, &di) || !di.dli_fname || stat(di.dli_fname, &self))
        return 1; /* cannot tell: trace rather than miss a program */
    const char *base = strrchr(di.dli_fname, '/');
    base = base ? base + 1 : di.dli_fname;
    if (named_in(getenv("LD_PRELOAD"), &self, base))
        return 1;
    char buf[4096];
    int fd = open("/etc/ld.so.preload", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = 0;
        if (named_in(buf, &self, base))
            return 1;
    }
    return 0;
}

__attribute__((constructor)) static void mmleak_init(void)
{
    int saved = errno;
    T.guard++;
    /* Loaded with dlopen (mmleak.py loads the library for its compiled shrinker): our
     * allocation functions are not the process's, there is nothing to trace. */
    if (!preloaded()) {
        g_state = -1;
        g_once_done = 1;
        T.guard--;
        errno = saved;
        return;
    }
    global_init();
    T.guard--;
    errno = saved;
}

__attribute__((destructor)) static void mmleak_fini(void)
{
    if (g_state <= 0 || g_pid != getpid())
        return;
    int saved = errno;
    T.guard++;
    maps_snapshot(0);
    if (T.open) {
        pthread_mutex_lock(&g_lock);
        registry_del(&T);
        pthread_mutex_unlock(&g_lock);
        file_close(&T, 1);
        T.late = 1;
    }
    close_parked();
    T.guard--;
    errno = saved;
}

/* ---------------------------------------------------------------------------------------
 * 4. Entry points
 * ------------------------------------------------------------------------------------- */

COLD static void *boot_or_resolve(size_t n, int zero)
{
    if (!atomic_load(&g_resolving))
        resolve();
    if (real.malloc)
        return NULL;
    void *p = boot_alloc(n); /* a call from inside dlsym while we resolve */
    if (p && zero)
        memset(p, 0, n);
    return p;
}

#define ENSURE_REAL(n, zero)                                                                  \
    do {                                                                                      \
        if (unlikely(!real.malloc)) {                                                         \
            void *bp_ = boot_or_resolve((n), (zero));                                         \
            if (!real.malloc)                                                                 \
                return bp_;                                                                   \
        }                                                                                     \
    } while (0)

/* Record a block the real allocator returned (nothing when it failed). */
static inline void *noted(void *p, size_t n, const void *ra)
{
    if (likely(p != NULL))
        rec_alloc(p, n, ra);
    return p;
}

static inline void *traced_malloc(size_t n, const void *ra)
{
    return noted(real.malloc(n), n, ra);
}

EXPORT void *malloc(size_t n)
{
    ENSURE_REAL(n, 0);
    return traced_malloc(n, __builtin_return_address(0));
}

EXPORT void free(void *p)
{
    if (unlikely(!p || in_boot(p)))
        return;
    if (unlikely(!real.free)) {
        boot_or_resolve(0, 0);
        if (!real.free)
            return;
    }
    note_free(p, __builtin_return_address(0));
    real.free(p);
}

EXPORT void *calloc(size_t k, size_t n)
{
    size_t total;
    if (unlikely(__builtin_mul_overflow(k, n, &total))) {
        errno = ENOMEM;
        return NULL;
    }
    ENSURE_REAL(total, 1);
    return noted(real.calloc(k, n), total, __builtin_return_address(0));
}

static void *traced_realloc(void *old, size_t n, const void *ra)
{
    if (unlikely(in_boot(old))) {
        void *p = traced_malloc(n, ra);
        if (p) {
            size_t k = boot_size(old);
            memcpy(p, old, k < n ? k : n);
        }
        return p;
    }
    if (!old)
        return traced_malloc(n, ra);
    /* The old block's number is taken before the call: once realloc has moved the block,
     * another thread may be handed the old address. */
    uint64_t s = seq_next(old);
    void *p = real.realloc(old, n);
    if (p == NULL && n != 0)
        return NULL; /* failed: the old block is untouched (its number stays unused) */
    rec_free(old, s, ra);
    if (p)
        rec_alloc(p, n, ra);
    return p;
}

EXPORT void *realloc(void *old, size_t n)
{
    ENSURE_REAL(n, 0);
    return traced_realloc(old, n, __builtin_return_address(0));
}

EXPORT void *reallocarray(void *old, size_t k, size_t n)
{
    size_t total;
    if (__builtin_mul_overflow(k, n, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    ENSURE_REAL(total, 0);
    return traced_realloc(old, total, __builtin_return_address(0));
}

EXPORT void *memalign(size_t al, size_t n)
{
    ENSURE_REAL(n + al, 0);
    return noted(real.memalign(al, n), n, __builtin_return_address(0));
}

EXPORT int posix_memalign(void **out, size_t al, size_t n)
{
    if (unlikely(!real.malloc)) {
        boot_or_resolve(0, 0);
        if (!real.malloc)
            return ENOMEM;
    }
    int rc = real.posix_memalign(out, al, n);
    if (rc == 0 && *out)
        rec_alloc(*out, n, __builtin_return_address(0));
    return rc;
}

EXPORT void *aligned_alloc(size_t al, size_t n)
{
    ENSURE_REAL(n + al, 0);
    return noted(real.aligned_alloc(al, n), n, __builtin_return_address(0));
}

EXPORT void *valloc(size_t n)
{
    ENSURE_REAL(n + 4096, 0);
    return noted(real.valloc(n), n, __builtin_return_address(0));
}

EXPORT void *pvalloc(size_t n)
{
    ENSURE_REAL(n + 4096, 0);
    return noted(real.pvalloc(n), n, __builtin_return_address(0));
}

#define RA __builtin_return_address(0)

/* strdup and strndup allocate inside libc, where the caller would be libc itself: doing
 * them here keeps the user's line as the caller. */
static inline char *dup_n(const char *s, size_t n, const void *ra)
{
    ENSURE_REAL(n + 1, 0);
    char *p = traced_malloc(n + 1, ra);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

EXPORT char *strdup(const char *s) { return dup_n(s, strlen(s), RA); }
EXPORT char *__strdup(const char *s) { return dup_n(s, strlen(s), RA); }
EXPORT char *strndup(const char *s, size_t max) { return dup_n(s, strnlen(s, max), RA); }
EXPORT char *__strndup(const char *s, size_t max) { return dup_n(s, strnlen(s, max), RA); }

/* dlclose: remember the mappings of what is about to be unloaded, so addresses in it stay
 * symbolizable (or at least recognisably unresolvable) later. */
EXPORT int dlclose(void *h)
{
    if (unlikely(!real.dlclose))
        resolve();
    if (g_state > 0 && g_pid == getpid() && !T.guard) {
        GUARDED;
        maps_snapshot(1);
    }
    return real.dlclose(h);
}

/* ---- _exit and exec: no destructor runs, so flush the calling thread's file first ----
 * Nothing would be lost without this (the staging file keeps the lines and the readers merge
 * it), but the directory stays tidy: a finished thread has one .out file and no .tail.  In a
 * vfork() child the pid differs from ours and nothing is touched: the memory is the parent's. */

static void close_parked(void);

COLD static void flush_before_leaving(void)
{
    if (g_state <= 0 || g_pid != getpid() || T.guard)
        return;
    GUARDED;
    maps_snapshot(0);
    if (T.open) {
        pthread_mutex_lock(&g_lock);
        registry_del(&T);
        pthread_mutex_unlock(&g_lock);
        file_close(&T, 1);
        T.late = 1;
    }
    close_parked(); /* files of threads that ended before */
}

static void *next_fn(const char *name)
{
    void *f = sym(name);
    if (!f)
        abort();
    return f;
}

EXPORT __attribute__((noreturn)) void _exit(int status)
{
    static void (*real_exit)(int);
    flush_before_leaving();
    if (!real_exit)
        real_exit = (void (*)(int))next_fn("_exit");
    real_exit(status);
    __builtin_unreachable();
}

EXPORT __attribute__((noreturn)) void _Exit(int status) { _exit(status); }

#define EXEC_WRAPPER(name, params, args)                                                      \
    EXPORT int name params                                                                    \
    {                                                                                         \
        static int (*real_fn) params;                                                         \
        flush_before_leaving();                                                               \
        if (!real_fn)                                                                         \
            real_fn = (int (*) params)next_fn(#name);                                         \
        return real_fn args;                                                                  \
    }
EXEC_WRAPPER(execve, (const char *p, char *const a[], char *const e[]), (p, a, e))
EXEC_WRAPPER(execv, (const char *p, char *const a[]), (p, a))
EXEC_WRAPPER(execvp, (const char *p, char *const a[]), (p, a))
EXEC_WRAPPER(execvpe, (const char *p, char *const a[], char *const e[]), (p, a, e))
EXEC_WRAPPER(fexecve, (int fd, char *const a[], char *const e[]), (fd, a, e))

/* The list forms collect their arguments, then go through the vector forms above. */
#define COLLECT_ARGS(first, last_named, argv, envp_out)                                       \
    size_t n_ = 1;                                                                            \
    va_list ap_;                                                                              \
    va_start(ap_, last_named);                                                                \
    while (va_arg(ap_, char *))                                                               \
        n_++;                                                                                 \
    va_end(ap_);                                                                              \
    char *argv[n_ + 1];                                                                       \
    argv[0] = (char *)(first);                                                                \
    va_start(ap_, last_named);                                                                \
    for (size_t i_ = 1; i_ <= n_; i_++)                                                       \
        argv[i_] = va_arg(ap_, char *);                                                       \
    envp_out;                                                                                 \
    va_end(ap_)

EXPORT int execl(const char *path, const char *arg, ...)
{
    COLLECT_ARGS(arg, arg, argv, (void)0);
    return execv(path, argv);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
    COLLECT_ARGS(arg, arg, argv, (void)0);
    return execvp(file, argv);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
    char **envp;
    COLLECT_ARGS(arg, arg, argv, envp = va_arg(ap_, char **));
    return execve(path, argv, envp);
}

/* ---- setuid and friends: a daemon that drops root keeps being traced ----
 * Our files are 0600 and reopened by name at every flush; once the process is another user
 * it could not open them again.  So, just before the effective uid changes, they are given
 * to the new user (the dump directory must let that user in and create files: /tmp does). */

COLD static void give_files_to(uid_t uid)
{
    if (uid == (uid_t)-1 || uid == 0 || g_state <= 0 || g_pid != getpid() || geteuid() != 0 ||
        T.guard)
        return;
    GUARDED;
    char path[PATH_MAX];
    pthread_mutex_lock(&g_lock);
    for (struct tstate *o = g_threads; o; o = o->next)
        if (o->open) {
            if (chown(dump_path(path, sizeof path, o->fileno), uid, (gid_t)-1)) { /* gone */ }
            if (chown(side_path(path, sizeof path, o->fileno, ".tail"), uid, (gid_t)-1)) { }
        }
    for (size_t i = 0; i < P.n; i++) {
        if (chown(dump_path(path, sizeof path, P.a[i].fileno), uid, (gid_t)-1)) { }
        if (chown(side_path(path, sizeof path, P.a[i].fileno, ".tail"), uid, (gid_t)-1)) { }
    }
    if (chown(file_path(path, sizeof path, g_id, ".maps"), uid, (gid_t)-1)) { }
    pthread_mutex_unlock(&g_lock);
}

#define UID_WRAPPER(name, params, args, new_euid)                                             \
    EXPORT int name params                                                                    \
    {                                                                                         \
        static int (*real_fn) params;                                                         \
        give_files_to(new_euid);                                                              \
        if (!real_fn)                                                                         \
            real_fn = (int (*) params)next_fn(#name);                                         \
        return real_fn args;                                                                  \
    }
UID_WRAPPER(setuid, (uid_t u), (u), u)
UID_WRAPPER(seteuid, (uid_t u), (u), u)
UID_WRAPPER(setreuid, (uid_t r, uid_t e), (r, e), e)
UID_WRAPPER(setresuid, (uid_t r, uid_t e, uid_t s), (r, e, s), e)

/* ---- C++: operator new and delete in all forms, with the user's code as the caller ----
 * The common case is malloc (or memalign) plus a record.  Only when that fails do we call
 * the real operator (resolved then), with the guard held, so new_handler, std::bad_alloc
 * and nothrow semantics are exactly libstdc++'s. */

COLD static void *new_failed(size_t n, size_t al, int nothrow, const void *ra)
{
    if (!real.new_) {
        real.new_ = sym("_Znwm");
        real.new_nothrow = sym("_ZnwmRKSt9nothrow_t");
        real.new_al = sym("_ZnwmSt11align_val_t");
        real.new_al_nothrow = sym("_ZnwmSt11align_val_tRKSt9nothrow_t");
    }
    static const char nothrow_tag = 0; /* std::nothrow_t is an empty struct */
    void *p = NULL;
    {
        GUARDED; /* cleanup runs even when the real operator throws (-fexceptions) */
        if (al) {
            if (nothrow ? !real.new_al_nothrow : !real.new_al)
                abort();
            p = nothrow ? real.new_al_nothrow(n, al, &nothrow_tag) : real.new_al(n, al);
        } else {
            if (nothrow ? !real.new_nothrow : !real.new_)
                abort();
            p = nothrow ? real.new_nothrow(n, &nothrow_tag) : real.new_(n);
        }
    }
    if (p)
        rec_alloc(p, n, ra);
    return p;
}

static inline void *op_new(size_t n, size_t al, int nothrow, const void *ra)
{
    if (unlikely(!real.malloc))
        resolve();
    void *p = al ? real.memalign(al, n ? n : 1) : real.malloc(n ? n : 1);
    if (likely(p != NULL)) {
        rec_alloc(p, n, ra);
        return p;
    }
    return new_failed(n, al, nothrow, ra);
}

static inline void op_delete(void *p, const void *ra)
{
    if (unlikely(!p || in_boot(p)))
        return;
    note_free(p, ra);
    real.free(p);
}

EXPORT void *_Znwm(size_t n) { return op_new(n, 0, 0, RA); }
EXPORT void *_Znam(size_t n) { return op_new(n, 0, 0, RA); }
EXPORT void *_ZnwmRKSt9nothrow_t(size_t n, const void *nt) { (void)nt; return op_new(n, 0, 1, RA); }
EXPORT void *_ZnamRKSt9nothrow_t(size_t n, const void *nt) { (void)nt; return op_new(n, 0, 1, RA); }
EXPORT void *_ZnwmSt11align_val_t(size_t n, size_t al) { return op_new(n, al, 0, RA); }
EXPORT void *_ZnamSt11align_val_t(size_t n, size_t al) { return op_new(n, al, 0, RA); }
EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt) { (void)nt; return op_new(n, al, 1, RA); }
EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t n, size_t al, const void *nt) { (void)nt; return op_new(n, al, 1, RA); }
EXPORT void _ZdlPv(void *p) { op_delete(p, RA); }
EXPORT void _ZdaPv(void *p) { op_delete(p, RA); }
EXPORT void _ZdlPvm(void *p, size_t n) { (void)n; op_delete(p, RA); }
EXPORT void _ZdaPvm(void *p, size_t n) { (void)n; op_delete(p, RA); }
EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; op_delete(p, RA); }
EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const void *nt) { (void)nt; op_delete(p, RA); }
EXPORT void _ZdlPvSt11align_val_t(void *p, size_t al) { (void)al; op_delete(p, RA); }
EXPORT void _ZdaPvSt11align_val_t(void *p, size_t al) { (void)al; op_delete(p, RA); }
EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t al) { (void)n; (void)al; op_delete(p, RA); }
EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t al) { (void)n; (void)al; op_delete(p, RA); }
EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) { (void)al; (void)nt; op_delete(p, RA); }
EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t al, const void *nt) { (void)al; (void)nt; op_delete(p, RA); }
