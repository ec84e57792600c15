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
#include <sys/fsuid.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tracer/compiler.h"
#include "tracer/platform.h"
#include "tracer/internal.h"
#include "tracer/unwind.h"

extern int renameat(int, const char *, int, const char *); /* <stdio.h> is not wanted here */

#define FORMAT_VERSION 2
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
    int depth;               /* MMLEAK_DEPTH: frames per allocation; 0: auto (the default) */
    size_t rotate;           /* MMLEAK_ROTATE_MB: start a new file past this size (256) */
    size_t buffer;           /* MMLEAK_BUFFER_KB: staging area of a busy thread (1024) */
    size_t hold;             /* MMLEAK_HOLD_MB: lines held in memory while unwritable (64) */
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
static int g_state;                  /* 0: not started, 1: tracing, -1: disabled, 2: paused */
static unsigned g_trace_gen;         /* a new trace in this process (attach after detach) */
static int g_attached;               /* loaded into a running process by mmleak.py attach */
static int g_window;                 /* this trace was started by mmleak_attach */
/* What `mmleak.py status` reads from the process's memory (/proc/PID/mem), without
 * stopping it: "tracing ID DIR", "paused", "dormant" (see set_status). */
EXPORT char mmleak_status[PATH_MAX + 64];
static char g_cmd[2048];             /* escaped command line for the file headers */
static char g_alloc[512];            /* the allocator's file (libc, jemalloc...), escaped */
static _Atomic uint64_t g_lost_orphan; /* events lost where no thread file could say so */
static atomic_uint g_episode;        /* numbers the gaps: "#dropping k=K", "#lost N k=K" */
static atomic_uint g_epoch;          /* dlclose() calls so far: see loads_log_locked */
static int g_closing;                /* calls inside the real dlclose() (under g_lock) */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* cold path only */
static pthread_key_t g_key;
static int g_key_ok;

/* Event order.  A free in thread B and a later malloc in thread C that returns the same
 * address are ordered by the allocator's own synchronisation; an atomic counter taken
 * before the real free and after the real malloc inherits that order.  One counter per
 * bucket of addresses gives every address a total order without one hot shared line:
 * threads working on different memory touch different counters.  Two events of one address
 * whose numbers differ by exactly one are adjacent: nothing happened to that address in
 * between, which is what lets the shrinker cancel them in any grouping of files.
 *
 * Buckets follow the heap: a counter for every 32 bytes of address space (glibc's blocks
 * are at least 32 bytes apart), the table covering 2 MiB, rotated by a hash of the
 * 64 MiB region the address is in (glibc's thread arenas are 64 MiB aligned: without the
 * rotation, threads working in lockstep would share counters).  A free finds its counter
 * beside those of the blocks around it instead of on a random line of a 512 KiB table, and
 * two blocks less than 2 MiB apart in one region never share a counter, so the events of one
 * address stay adjacent more often than with a random hash: a thread's file of
 * bench/pywork.py shrinks on its own to 0.21 % of its events instead of 0.46 %, one of a
 * perl run to 3.3 % instead of 7.9 %.
 * Measured on alloc_bench: 0.5-0.9 ns less per event.  (A coarser grain was faster still but
 * put small neighbouring blocks on one counter: perl's leftovers tripled.) */
#define SEQ_BITS 16
#define SEQ_GRAIN 5
#define SEQ_REGION 26
static _Atomic uint64_t g_seq[1u << SEQ_BITS] __attribute__((aligned(64)));

/* What the fast path reads besides the thread's own state, in a page of its own mapped with
 * MADV_WIPEONFORK.  A child made by a raw clone() or fork system call skips our atfork
 * handler, and its threads' staging pointers still point into the parent's shared .tail
 * mappings; but it finds this page zeroed, so its first event takes the slow path, which
 * starts the child's own trace.  A vfork() child shares the page with its parent, as it
 * shares all memory: its events are the parent's address space's and go on into the parent
 * thread's file, exactly as if the parent had made them. */
struct hot {
    int fast;        /* the one-frame fast writer may be used (tracing, depth 1 or auto) */
    int alive;       /* tracing in this address space; 0 in a freshly forked copy */
    uintptr_t mask;  /* ~0: the caller must be a known program address (mml_direct) */
    unsigned epoch;  /* g_epoch: a thread that has not seen this one takes the slow path */
    int memo;        /* stacks of a fixed depth: the entry points prefetch their memo record */
};
static struct hot hot_off;          /* before the start, and where WIPEONFORK is missing */
static struct hot *H = &hot_off;

/* Which file a name of ours was when we made it: a name reopened later must still be that
 * file (see open_again), whatever was done to the directory meanwhile.  {0, 0}: unknown. */
struct fid { dev_t dev; ino_t ino; };

/* Per-thread state.  The hot fields come first, in one cache line. */
#define GUARD_NEST 0xffff       /* nesting count of mmleak's own code in this thread */
#define GUARD_NEW (1 << 24)     /* a failing operator new is in libstdc++: see new_failed */
struct tstate {
    char *cur;            /* next byte to write in the staging half */
    char *end;            /* end of that half; NULL forces the slow path */
    volatile int guard;   /* nonzero sends every event to the slow path (GUARD_ bits) */
    int open;             /* a file is open for this thread */
    int dropping;         /* cannot write now: events are counted in `lost`, retried later */
    int dead;             /* past its last pthread key destructor round: see thread_exit */
    int anon;             /* staging in anonymous memory: no file could be created yet */
    int late;             /* this thread's file was closed (process exit, exec) */
    int late_lines;       /* lines appended directly to it since */
    int early_frees;      /* frees before this thread's first allocation: see emit_cold */
    int exit_rounds;      /* pthread key destructor rounds seen */
    char *stage;          /* shared mapping of the .tail file: two halves */
    size_t half_size;
    int half;             /* the half being written */
    uint64_t out_off;     /* bytes already in the .out file */
    /* Lines of half h not yet in .out: from ustart[h], ulen[h] bytes.  Only a half whose
     * flush failed keeps any while the other one is written (see make_room). */
    size_t ustart[2], ulen[2];
    int slot;             /* 1 + our index in the registry of files, 0 if none */
    uint64_t *ss;         /* ids of the stacks the current file holds (open addressing) */
    size_t ss_cap, ss_n;
    uint64_t lost;        /* events not recorded while dropping, not yet reported */
    unsigned episode;     /* k= of the "#dropping"/"#lost" lines of the current gap */
    unsigned epoch;       /* the dlclose() epoch this thread's fast path is valid for */
    unsigned trace_gen;   /* the trace its files belong to (attach/detach start new ones) */
    time_t retry_at;      /* while dropping: next time a write is tried */
    char *hold;           /* lines that could not be written yet, older than the halves' */
    size_t hold_start, hold_len, hold_cap;  /* see hold_take */
    int holding;          /* "#dropping k=EPISODE" is staged: a "#lost" line must close it */
    unsigned fileno;      /* N of the current file */
    struct fid out_id, tail_id; /* its .out and .tail files (see open_again) */
    const void *new_ra;   /* while GUARD_NEW: the caller of the failing operator new */
    struct tstate *next, *prev; /* registry of open threads, under g_lock */
};
static __thread struct tstate T __attribute__((tls_model("initial-exec")));

/* ---------------------------------------------------------------------------------------
 * 2. The hot path
 * ------------------------------------------------------------------------------------- */

/* The counter of p's bucket (see g_seq). */
HOT_INLINE _Atomic uint64_t *seq_bucket(const void *p)
{
    uint64_t a = (uintptr_t)p;
    uint64_t rot = ((a >> SEQ_REGION) * 0x9E3779B97F4A7C15ull) >> (64 - SEQ_BITS);
    return &g_seq[((a >> SEQ_GRAIN) + rot) & ((1u << SEQ_BITS) - 1)];
}

HOT_INLINE uint64_t seq_next(const void *p)
{
    return atomic_fetch_add_explicit(seq_bucket(p), 1, memory_order_relaxed);
}

#if defined(__SSE2__)
#include <emmintrin.h>
/* Sixteen nibbles (one per byte) as hex digits: add '0', and 'a'-'0'-10 where the nibble is
 * above 9. */
HOT_INLINE __m128i hex_ascii(__m128i nib)
{
    __m128i over9 = _mm_cmpgt_epi8(nib, _mm_set1_epi8(9));
    return _mm_add_epi8(_mm_add_epi8(nib, _mm_set1_epi8('0')),
                        _mm_and_si128(over9, _mm_set1_epi8('a' - '0' - 10)));
}

/* Sixteen hex digits of v, most significant first: split the bytes into nibbles, interleave
 * them, and make digits of them.  About ten SSE2 instructions, all x86-64 CPUs have them. */
HOT_INLINE __m128i hex16(uint64_t v)
{
    __m128i x = _mm_cvtsi64_si128((long long)__builtin_bswap64(v));
    __m128i m = _mm_set1_epi8(0x0f);
    return hex_ascii(_mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi64(x, 4), m),
                                       _mm_and_si128(x, m)));
}

/* The sixteen digits of a and those of b at once: the nibbles of both split in one register,
 * which costs little more than one hex16.  A line's fields are packed into pairs of such
 * 64-bit groups (put_alloc_fields, put_free_fields), so that an allocation line takes two conversions, not
 * five, and a free line one and a half (measured: the formatting of the fast path went from
 * 3.8 ns per event, found by writing constant text instead, to about half of that). */
HOT_INLINE void hex32(uint64_t a, uint64_t b, __m128i *ra, __m128i *rb)
{
    __m128i x = _mm_set_epi64x((long long)__builtin_bswap64(b), (long long)__builtin_bswap64(a));
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i hi = _mm_and_si128(_mm_srli_epi64(x, 4), m), lo = _mm_and_si128(x, m);
    *ra = hex_ascii(_mm_unpacklo_epi8(hi, lo));
    *rb = hex_ascii(_mm_unpackhi_epi8(hi, lo));
}

/* v < 2^32 as the minimal-width digits, left-aligned in 32 bits (n = ndig(v)): converted in
 * a group of 8 digits, its first n are the number. */
HOT_INLINE uint64_t left32(uint32_t v, unsigned n)
{
    return (uint64_t)(uint32_t)(v << (32 - 4 * n));
}

HOT_INLINE void store8(char *d, __m128i r)
{
    _mm_storel_epi64((__m128i *)(void *)d, r);
}

HOT_INLINE void store8_high(char *d, __m128i r)
{
    _mm_storel_epi64((__m128i *)(void *)d, _mm_unpackhi_epi64(r, r));
}

/* Exactly the first 12 digits of r: the last field of a line must not spill past its
 * newline (a signal handler's line may already follow it). */
HOT_INLINE void store12(char *d, __m128i r)
{
    _mm_storel_epi64((__m128i *)(void *)d, r);
    uint32_t w = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(r, 8));
    memcpy(d + 8, &w, 4);
}

/* An allocation line's fields, "PTR SEQ SIZE TIME CALLER" (without the newline), at d: two
 * pairs of groups, (PTR, SEQ|SIZE) and (TIME, CALLER).  Every store but the last writes up to
 * 8 bytes past its field, inside the line, and the next field's store overwrites them. */
HOT_INLINE char *put_alloc_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint32_t n,
                                  unsigned nn, uint32_t now, unsigned nt, uint64_t c)
{
    __m128i r0, r1, r2, r3;
    hex32(p << 16, (left32(s, ns) << 32) | left32(n, nn), &r0, &r1);
    hex32(left32(now, nt) << 32, c << 16, &r2, &r3);
    _mm_storeu_si128((__m128i *)(void *)d, r0);
    d[12] = ' ';
    d += 13;
    store8(d, r1);
    d += ns;
    *d++ = ' ';
    store8_high(d, r1);
    d += nn;
    *d++ = ' ';
    store8(d, r2);
    d += nt;
    *d++ = ' ';
    store12(d, r3);
    return d + 12;
}

/* A free line's fields, "PTR SEQ CALLER": one pair (PTR, CALLER) and SEQ alone. */
HOT_INLINE char *put_free_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint64_t c)
{
    __m128i r0, r1;
    hex32(p << 16, c << 16, &r0, &r1);
    _mm_storeu_si128((__m128i *)(void *)d, r0);
    d[12] = ' ';
    d += 13;
    store8(d, hex16(left32(s, ns) << 32));
    d += ns;
    *d++ = ' ';
    store12(d, r1);
    return d + 12;
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

/* All sixteen digits of v. */
HOT_INLINE char *put_hex16(char *d, uint64_t v)
{
    _mm_storeu_si128((__m128i *)(void *)d, hex16(v));
    return d + 16;
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

HOT_INLINE char *put_hex16(char *d, uint64_t v)
{
    uint64_t hi = hex8((uint32_t)(v >> 32)), lo = hex8((uint32_t)v);
    memcpy(d, &hi, 8);
    memcpy(d + 8, &lo, 8);
    return d + 16;
}

HOT_INLINE char *put_alloc_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint32_t n,
                                  unsigned nn, uint32_t now, unsigned nt, uint64_t c)
{
    d = put_hex12(d, p);
    *d++ = ' ';
    d = put_hexv(d, s, ns);
    *d++ = ' ';
    d = put_hexv(d, n, nn);
    *d++ = ' ';
    d = put_hexv(d, now, nt);
    *d++ = ' ';
    return put_hex12(d, c);
}

HOT_INLINE char *put_free_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint64_t c)
{
    d = put_hex12(d, p);
    *d++ = ' ';
    d = put_hexv(d, s, ns);
    *d++ = ' ';
    return put_hex12(d, c);
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
    uintptr_t known = atomic_load_explicit(&mml_direct[MML_DIRECT_SLOT(ra)], memory_order_relaxed);
    if (unlikely((t->end - t->cur < FAST_ROOM) | t->guard | (H->fast == 0) |
                 (((known ^ (uintptr_t)ra) & H->mask) != 0) | (t->epoch != H->epoch))) {
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
    d = put_alloc_fields(d, (uintptr_t)p, (uint32_t)s, ns, (uint32_t)n, nn, (uint32_t)now, nt, c);
    atomic_signal_fence(memory_order_release);
    *d = '\n';
}

/* One free line: PTR SEQ CALLER.  The number is taken before the real free runs. */
HOT_INLINE void rec_free(void *p, uint64_t s, const void *ra)
{
    struct tstate *t = &T;
    uintptr_t c = (uintptr_t)ra - 1;
    if (unlikely((t->end - t->cur < FAST_ROOM) | t->guard | (H->alive == 0) |
                 (t->epoch != H->epoch) | (((s >> 32) | (((uintptr_t)p | c) >> 48)) != 0))) {
        slow_free(p, s, ra);
        return;
    }
    unsigned ns = ndig((uint32_t)s);
    char *d = reserve(t, 12 + 1 + ns + 1 + 12 + 1);
    d = put_free_fields(d, (uintptr_t)p, (uint32_t)s, ns, c);
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

/* Threads inside a slow path (they may flush, grow or close their staging area): a detach
 * waits for none to be left before it closes their files from outside. */
static atomic_int g_inflight;
struct inflight_scope { int on; };
static void inflight_leave(struct inflight_scope *s)
{
    if (s->on)
        atomic_fetch_sub(&g_inflight, 1);
}
#define INFLIGHT struct inflight_scope _if __attribute__((cleanup(inflight_leave))) = \
    { (atomic_fetch_add(&g_inflight, 1), 1) }
#define IN_OWN_CODE(t) ((t)->guard & GUARD_NEST)

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

/* open_again's refusal of what stands at one of our names: not a regular file of ours (a
 * FIFO, a device, a directory, another user's file, a hard link to some other file).  Not an
 * errno value: messages say it in words and give no number. */
#define E_NOT_OURS 4096

/* Why a write failed, for the one message we print (strerror may allocate). */
static const char *why(int err)
{
    switch (err) {
    case E_NOT_OURS: return "what stands at the name of a file of mmleak's is not that file "
                            "(a FIFO, a device, another user's file or a link: planted?)";
    case EEXIST: return "the name is taken by a file mmleak did not make";
    case ELOOP: return "a symbolic link stands at the name of a file of mmleak's";
    case ENXIO: return "a FIFO or a device stands at the name of a file of mmleak's";
    case EISDIR: return "a directory stands at the name of a file of mmleak's";
    case ENAMETOOLONG: return "the file name is too long";
    case ENOSPC: case EDQUOT: return "disk full";
    case EACCES: case EPERM: return "permission denied (did the program change its user, "
                                    "or the directory's permissions?)";
    case ENOENT: return "the file or its directory was removed";
    case ENOTDIR: return "not a directory";
    case EMFILE: case ENFILE: return "no file descriptor left (RLIMIT_NOFILE)";
    case EFBIG: return "the file size limit (RLIMIT_FSIZE) is reached";
    case EBADF: return "the program closed the directory descriptor mmleak keeps after chroot()";
    case EROFS: return "read-only file system";
    case EIO: return "I/O error";
    case ENOMEM: return "out of memory";
    default: return "error";
    }
}

/* Descriptor 2 when the trace started.  A daemon may close it and open a file of its own,
 * which then gets that number: a message written there would go into the daemon's data.
 * So we write only while descriptor 2 is still the file it was. */
static int g_err_ok;
static dev_t g_err_dev;
static ino_t g_err_ino;

static void note_stderr(void)
{
    struct stat st;
    g_err_ok = fstat(2, &st) == 0;
    g_err_dev = g_err_ok ? st.st_dev : 0;
    g_err_ino = g_err_ok ? st.st_ino : 0;
}

static void say4(const char *a, const char *b, const char *c, const char *f)
{
    struct stat st;
    if (cfg.quiet || !g_err_ok || fstat(2, &st) || st.st_dev != g_err_dev ||
        st.st_ino != g_err_ino)
        return;
    char msg[2 * PATH_MAX + 512], *e = msg + sizeof msg, *d = msg;
    d = cat(d, e, "mmleak: ");
    d = cat(d, e, a);
    d = cat(d, e, b ? b : "");
    d = cat(d, e, c ? c : "");
    d = cat(d, e, f ? f : "");
    d = cat(d, e, "\n");
    ssize_t r = write(2, msg, (size_t)(d - msg));
    (void)r;
}

static void say(const char *a, const char *b, const char *c) { say4(a, b, c, NULL); }

/* "WHAT DIR: REASON (errno N)TAIL"; REASON is why(ERR) unless given */
static void say_why(const char *what, const char *reason, int err, const char *tail)
{
    char r[512], *e = r + sizeof r, *d = r;
    d = cat(d, e, ": ");
    d = cat(d, e, reason ? reason : why(err));
    if (err != E_NOT_OURS) {
        d = cat(d, e, " (errno ");
        d = cat_u(d, e, (unsigned long)err);
        d = cat(d, e, ")");
    }
    cat(d, e, tail);
    say(what, cfg.dir, r);
}

static void say_err(const char *what, int err, const char *tail)
{
    say_why(what, NULL, err, tail);
}

/* Settings come from the environment, or, for mmleak_attach, from its argument: lines
 * "MMLEAK_DIR=/var/tmp/leaks" with the same names. */
static char g_args[PATH_MAX + 512];
static int g_from_args;

static const char *cfg_get(const char *name)
{
    if (!g_from_args)
        return secure_getenv(name);
    size_t n = my_strlen(name);
    for (const char *l = g_args; *l;) {
        const char *e = l;
        while (*e && *e != '\n')
            e++;
        if ((size_t)(e - l) > n && !memcmp(l, name, n) && l[n] == '=') {
            static char val[PATH_MAX + 64];
            size_t k = (size_t)(e - l) - n - 1;
            if (k >= sizeof val)
                k = sizeof val - 1;
            memcpy(val, l + n + 1, k);
            val[k] = 0;
            return val;
        }
        l = *e ? e + 1 : e;
    }
    return NULL;
}

static long env_num(const char *name, long def, long lo, long hi)
{
    const char *s = cfg_get(name);
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

/* 0, or -1 when MMLEAK_DIR cannot be used as given (said why). */
static int read_config(void)
{
    cfg.quiet = (int)env_num("MMLEAK_QUIET", 0, 0, 1);
    const char *dp = cfg_get("MMLEAK_DEPTH");
    cfg.depth = !dp || !*dp || !strcmp(dp, "auto") ? 0 : (int)env_num("MMLEAK_DEPTH", 0, 1, MAXDEPTH);
    cfg.rotate = (size_t)env_num("MMLEAK_ROTATE_MB", 256, 1, 1 << 20) << 20;
    cfg.buffer = (size_t)env_num("MMLEAK_BUFFER_KB", 1024, 16, 1 << 20) << 10;
    cfg.hold = (size_t)env_num("MMLEAK_HOLD_MB", 64, 0, 1 << 20) << 20;
    const char *dir = cfg_get("MMLEAK_DIR");
    if (!dir || !*dir)
        dir = "/tmp";
    static char dir_copy[PATH_MAX];     /* cfg_get's buffer is reused by the next call */
    size_t dn = my_strlen(dir);
    if (dn >= sizeof dir_copy) {
        cfg.dir[0] = 0;
        say("MMLEAK_DIR is too long: tracing disabled (at most ", "4000 bytes", ")");
        return -1;
    }
    memcpy(dir_copy, dir, dn + 1);
    dir = dir_copy;
    size_t have = 0, n = my_strlen(dir);
    if (dir[0] != '/') { /* the program may chdir later: pin the directory now */
        if (!getcwd(cfg.dir, sizeof cfg.dir) || cfg.dir[0] != '/') {
            cfg.dir[0] = 0;
            say("MMLEAK_DIR=", dir, " is relative and the current directory cannot be "
                "resolved: tracing disabled (give an absolute MMLEAK_DIR)");
            return -1;
        }
        have = my_strlen(cfg.dir);
        if (cfg.dir[have - 1] != '/' && have + 1 < sizeof cfg.dir)
            cfg.dir[have++] = '/';
    }
    /* room is left for "/mmleak.ID.N.tail" after it: names are never cut short */
    if (have + n >= sizeof cfg.dir) {
        cfg.dir[0] = 0;
        say("MMLEAK_DIR is too long: tracing disabled (at most ", "4000 bytes", ")");
        return -1;
    }
    memcpy(cfg.dir + have, dir, n + 1);
    have += n;
    while (have > 1 && cfg.dir[have - 1] == '/')
        cfg.dir[--have] = 0;
    return 0;
}

static void *sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

/* Our own functions under names the dynamic linker cannot rebind: &malloc itself would give
 * the process's malloc, whoever provides it. */
extern void *mmleak_own_malloc(size_t) __attribute__((alias("malloc"), visibility("hidden"), copy(malloc)));

/* f, if it is defined in the same object as `base` (the allocator's); else NULL.  An allocator
 * that lacks a function (jemalloc has no pvalloc, neither jemalloc nor tcmalloc has
 * reallocarray) must not get libc's: the program would free libc's block with its allocator. */
static void *same_object(void *f, const void *base)
{
    Dl_info di;
    if (!f || !dladdr(f, &di) || di.dli_fbase != base)
        return NULL;
    return f;
}

static const void *object_of(const void *f)
{
    Dl_info di;
    return f && dladdr(f, &di) ? di.dli_fbase : NULL;
}

static atomic_int g_resolving;

/* The allocator's functions, from `lookup`: RTLD_NEXT normally; the process's own (RTLD_DEFAULT)
 * when another allocator comes before us and we stay out of the way.  Functions it lacks are
 * left NULL and made from its malloc and memalign (see the al_* helpers). */
static void resolve_from(void *handle)
{
    struct real_fns r;
    memset(&r, 0, sizeof r);
    const void *self = object_of((void *)mmleak_own_malloc);
    r.malloc = dlsym(handle, "malloc");
    r.free = dlsym(handle, "free");
    r.realloc = dlsym(handle, "realloc");
    if (handle == RTLD_DEFAULT && object_of((void *)r.realloc) == self)
        r.realloc = sym("realloc");     /* ours would call itself: libc's, as without us */
    if (!r.malloc || !r.free || !r.realloc) {
        static const char m[] = "mmleak: cannot find the real malloc; aborting\n";
        ssize_t w = write(2, m, sizeof m - 1);
        (void)w;
        abort();
    }
    const void *base = object_of(r.malloc);
    if (handle == RTLD_DEFAULT) {
        /* anything but our own definitions: a non-PIE program's canonical PLT entries are fine */
        void *f;
#define PROC_FN(n) (f = dlsym(RTLD_DEFAULT, #n), object_of(f) == self ? NULL : f)
        r.calloc = PROC_FN(calloc);
        r.memalign = PROC_FN(memalign);
        r.posix_memalign = PROC_FN(posix_memalign);
        r.aligned_alloc = PROC_FN(aligned_alloc);
        r.valloc = PROC_FN(valloc);
        r.pvalloc = PROC_FN(pvalloc);
#undef PROC_FN
        /* a program that defines malloc, free, calloc and realloc only: its aligned
         * allocations are libc's without us, so they are libc's with us too */
        if (!r.memalign && !r.posix_memalign && !r.aligned_alloc) {
            r.memalign = sym("memalign");
            r.posix_memalign = sym("posix_memalign");
            r.aligned_alloc = sym("aligned_alloc");
            r.valloc = r.valloc ? r.valloc : sym("valloc");
            r.pvalloc = r.pvalloc ? r.pvalloc : sym("pvalloc");
        }
    } else {
        r.calloc = same_object(sym("calloc"), base);
        r.memalign = same_object(sym("memalign"), base);
        r.posix_memalign = same_object(sym("posix_memalign"), base);
        r.aligned_alloc = same_object(sym("aligned_alloc"), base);
        r.valloc = same_object(sym("valloc"), base);
        r.pvalloc = same_object(sym("pvalloc"), base);
    }
    r.dlclose = sym("dlclose");
    real = r;
}

COLD static void resolve(void)
{
    if (atomic_exchange(&g_resolving, 1)) /* nested call from dlsym: the boot arena serves */
        return;
    resolve_from(RTLD_NEXT);
}

/* Aligned allocation from whatever the allocator has. */
static void *al_alloc(size_t al, size_t n)
{
    if (real.memalign)
        return real.memalign(al, n);
    if (al < sizeof(void *))
        al = sizeof(void *);
    if (real.posix_memalign) {
        void *p;
        int rc = real.posix_memalign(&p, al, n);
        if (rc) {
            errno = rc;
            return NULL;
        }
        return p;
    }
    if (real.aligned_alloc && n <= SIZE_MAX - al)
        return real.aligned_alloc(al, (n + al - 1) / al * al);
    errno = ENOMEM;
    return NULL;
}

static void *al_calloc(size_t k, size_t n, size_t total)
{
    if (real.calloc)
        return real.calloc(k, n);
    void *p = real.malloc(total);
    if (p)
        memset(p, 0, total);
    return p;
}

/* ---- files ----
 * Every file is named "mmleak.ID.SUFFIX" in cfg.dir.  After chroot() the directory may no
 * longer be reachable by its name: the chroot wrapper then keeps a descriptor of it (and of
 * /proc) and names are opened relative to that, checked before each use against the device
 * and inode it had (a daemon that closes every descriptor and reuses the number must not make
 * us write into its own directory). */

static int g_dirfd = -1, g_procfd = -1;
static dev_t g_dir_dev;
static ino_t g_dir_ino;
static uid_t g_give_uid = (uid_t)-1;   /* set*uid in progress or done: the files' new owner */
static atomic_int g_said_write;         /* the one message about failing writes */
#define WRITE_FAILED_TAIL "; events are kept and writing is retried; events that do not fit " \
    "are counted, and every report will say the trace is incomplete"

static char *file_name(char *buf, size_t len, const char *suffix)
{
    char *e = buf + len, *d = buf;
    d = cat(d, e, "mmleak.");
    d = cat(d, e, g_id);
    cat(d, e, suffix);
    return buf;
}

static char *full_path(char *buf, size_t len, const char *name)
{
    char *e = buf + len, *d = buf;
    d = cat(d, e, cfg.dir);
    d = cat(d, e, "/");
    cat(d, e, name);
    return buf;
}

/* The directory descriptor, if we are in "after chroot" mode and it is still ours: -1 with
 * errno EBADF if the program took the number over; AT_FDCWD-style -100 otherwise. */
static int dir_fd(void)
{
    if (g_dirfd < 0)
        return AT_FDCWD;
    struct stat st;
    if (fstat(g_dirfd, &st) || st.st_dev != g_dir_dev || st.st_ino != g_dir_ino) {
        errno = EBADF;
        return -1;
    }
    return g_dirfd;
}

/* A file server acts as another user in one thread for a while (nfs-ganesha, samba: a raw
 * setresuid, or setfsuid, around each request; glibc passes neither on to the other threads,
 * and we do not see them): our 0600 files are then out of that thread's reach.  So when one
 * of our file operations is refused, and the thread's file system uid is not the files'
 * owner but may become it again (its real, effective or saved uid is the owner's, or it is
 * root), it is done again as the owner, and the thread's own uid put back.  Only then: a
 * unit's seccomp filter may forbid setfsuid (SystemCallFilter=~@privileged kills the
 * process), and a thread that never changed its uid never needs it. */
static uid_t g_owner;                   /* euid when the trace started: our files' owner */

static uid_t files_owner(void)
{
    return g_give_uid != (uid_t)-1 ? g_give_uid : g_owner;
}

/* The thread's real, effective, saved and file system uids, from /proc (no setfsuid). */
static int thread_uids(unsigned long u[4])
{
    int fd = g_procfd >= 0 ? openat(g_procfd, "thread-self/status", O_RDONLY | O_CLOEXEC)
                           : open("/proc/thread-self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char b[2048];
    ssize_t n = read(fd, b, sizeof b - 1);
    close(fd);
    if (n <= 0)
        return -1;
    b[n] = 0;
    char *p = strstr(b, "\nUid:");
    if (!p)
        return -1;
    p += 5;
    for (int i = 0; i < 4; i++) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p < '0' || *p > '9')
            return -1;
        u[i] = strtoul(p, &p, 10);
    }
    return 0;
}

struct fs_scope { uid_t old; int switched; };

/* Switch the file system uid to the owner's if the thread is another user now and may.  1 if
 * switched. */
static int fs_begin(struct fs_scope *f)
{
    f->switched = 0;
    int e = errno;
    unsigned long u[4];
    uid_t want = files_owner();
    if (thread_uids(u) == 0 && u[3] != want &&
        (u[0] == want || u[1] == want || u[2] == want || u[1] == 0)) {
        f->old = (uid_t)u[3];
        setfsuid(want);
        f->switched = 1;
    }
    errno = e;
    return f->switched;
}

static void fs_end(struct fs_scope *f)
{
    if (f->switched) {
        int e = errno;
        setfsuid(f->old);
        errno = e;
    }
}

/* Do OP; when refused, and the thread is another user for now, once more as the owner. */
#define AS_OWNER(rc, op)                                                                      \
    do {                                                                                      \
        (rc) = (op);                                                                          \
        struct fs_scope fs_;                                                                  \
        if ((rc) < 0 && (errno == EACCES || errno == EPERM) && fs_begin(&fs_)) {              \
            (rc) = (op);                                                                      \
            fs_end(&fs_);                                                                     \
        }                                                                                     \
    } while (0)

/* The same operations by full path (no directory held open: dir_fd() gave AT_FDCWD, the
 * usual case before any chroot).  The paths are built in buffers of their own length, not
 * PATH_MAX: these are the deepest frames of a thread's first event and of a rotation, and a
 * thread may have little stack left there (it had 10 KB of buffers). */
enum { D_OPEN, D_UNLINK, D_RENAME };
static COLD int d_by_path(int op, const char *name, const char *to, int flags, mode_t mode)
{
    size_t dl = my_strlen(cfg.dir) + 2;     /* cfg.dir is shorter than PATH_MAX */
    char a[dl + my_strlen(name) + 1], b[to ? dl + my_strlen(to) + 1 : 1];
    const char *pa = full_path(a, sizeof a, name);
    int rc = -1;
    switch (op) {
    case D_OPEN:
        AS_OWNER(rc, openat(AT_FDCWD, pa, flags, mode));
        break;
    case D_UNLINK:
        AS_OWNER(rc, unlinkat(AT_FDCWD, pa, 0));
        break;
    case D_RENAME: {
        const char *pb = full_path(b, sizeof b, to);
        AS_OWNER(rc, renameat(AT_FDCWD, pa, AT_FDCWD, pb));
        break;
    }
    }
    return rc;
}

static int d_open(const char *name, int flags, mode_t mode)
{
    int dfd = dir_fd(), rc;
    if (dfd == -1)
        return -1;
    if (dfd == AT_FDCWD)
        return d_by_path(D_OPEN, name, NULL, flags, mode);
    AS_OWNER(rc, openat(dfd, name, flags, mode));
    return rc;
}

static int d_unlink(const char *name)
{
    int dfd = dir_fd(), rc;
    if (dfd == -1)
        return -1;
    if (dfd == AT_FDCWD)
        return d_by_path(D_UNLINK, name, NULL, 0, 0);
    AS_OWNER(rc, unlinkat(dfd, name, 0));
    return rc;
}

static int d_rename(const char *from, const char *to)
{
    int dfd = dir_fd(), rc;
    if (dfd == -1)
        return -1;
    if (dfd == AT_FDCWD)
        return d_by_path(D_RENAME, from, to, 0, 0);
    AS_OWNER(rc, renameat(dfd, from, dfd, to));
    return rc;
}

/* Create one of our files: O_EXCL|O_NOFOLLOW, mode 0600, so a name somebody else made is
 * refused, never followed (O_NONBLOCK as everywhere: a FIFO is never opened by a create, but
 * no open of ours may ever wait).  ID, if given, gets the file's identity.  Under g_lock: a
 * daemon dropping root hands every file to its new user (give_files_to), and a file made by
 * another thread at that moment must be handed too. */
static int create_locked(const char *name, struct fid *id)
{
    for (int tries = 0;; tries++) {
        int fd = d_open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                        0600);
        struct stat st;
        int known = fd >= 0 && fstat(fd, &st) == 0;
        if (fd >= 0)
            fchmod(fd, 0600);   /* the program's umask (0277, 0777) must not take our write */
        if (known && g_give_uid == (uid_t)-1 && st.st_uid != g_owner) {
            /* made by a thread that is another user for now: the owner's, like the others */
            struct fs_scope f;
            if (fs_begin(&f)) {
                if (fchown(fd, g_owner, (gid_t)-1)) { /* then it stays that user's */ }
                fs_end(&f);
            }
        }
        if (fd >= 0 && id)
            *id = known ? (struct fid){ st.st_dev, st.st_ino } : (struct fid){ 0, 0 };
        if (fd < 0 || g_give_uid == (uid_t)-1 || !known || st.st_uid == g_give_uid ||
            fchown(fd, g_give_uid, (gid_t)-1) == 0 || tries)
            return fd;
        /* Created as root, and the switch happened before the fchown (glibc changes every
         * thread's ids with a signal, at any moment): create it again as the new user. */
        close(fd);
        d_unlink(name);
    }
}

/* Re-open one of our files by name: O_NOFOLLOW (a symbolic link is refused), O_NONBLOCK (a
 * FIFO put at the name can never make the program wait, with our lock held), and then we
 * refuse anything but a regular file of ours (root's files may belong to the user a daemon is
 * about to become: see give_files_to) that is still the file we made, when WANT says which
 * (a name whose file was deleted, by a compactor say, may since be another user's FIFO, or a
 * hard link to any file).  errno E_NOT_OURS when refused. */
static int open_again(const char *name, int flags, const struct fid *want)
{
    int fd = d_open(name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0) {
        if (errno == ELOOP || errno == ENXIO || errno == EISDIR)
            errno = E_NOT_OURS;
        return -1;
    }
    struct stat st;
    uid_t me = geteuid();
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
        (st.st_uid != me && st.st_uid != files_owner() && me != 0) ||
        (want && want->ino && (st.st_dev != want->dev || st.st_ino != want->ino))) {
        close(fd);
        errno = E_NOT_OURS;
        return -1;
    }
    return fd;
}

/* ---- names others may have taken ----
 * Whoever can write to the dump directory (/tmp: anybody) can create files at the names a
 * process to come will use, thousands of them.  A taken name is skipped (O_EXCL refuses it);
 * after TAKEN_RUN taken names in a row the numbering jumps ahead by an amount nobody can
 * guess (getrandom), where nothing was planted, and goes on from there: the process always
 * gets its files, at the cost of a system call per taken name.  One message says so. */
#define TAKEN_RUN 64

static uint64_t unguessable(void)
{
    uint64_t r = 0;
    if (syscall(SYS_getrandom, &r, sizeof r, 1 /* GRND_NONBLOCK */) != (long)sizeof r) {
        struct timespec ts;   /* no getrandom (a seccomp filter, an old kernel): the clock */
        clock_gettime(CLOCK_MONOTONIC, &ts);
        r = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    return r;
}

/* WHAT: "names of dump files in ", and what is done about it */
static void say_taken(const char *what, const char *done)
{
    static atomic_int said;
    if (!atomic_exchange(&said, 1))
        say4(what, cfg.dir, " are taken by files mmleak did not make (planted by another "
             "user?): ", done);
}

/* RLIMIT_FSIZE: writing past it kills the program with SIGXFSZ.  So every size we give a file
 * is checked against it first (a system call per flush, next to the flush's own three). */
static uint64_t fsize_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_FSIZE, &r) || r.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return r.rlim_cur;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            if (w == 0)
                errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static char *hexw(char *d, uint64_t v, int width);

/* ---- the maps file: a sorted union of every file-backed mapping seen in this process ---- */

struct mline { uint64_t start; uint32_t off, len; int seen, present; };
static struct {
    char *text; size_t tlen, tcap;      /* unique lines, back to back */
    struct mline *ln; size_t n, cap;    /* sorted by start address */
    unsigned long long adds, subs;      /* dl_iterate_phdr counters at the last snapshot */
    int stale;                          /* the last snapshot could not be written: retry */
    char *buf; size_t bcap;             /* scratch for reading /proc/self/maps */
} M;

/* An array of *CAP elements of UNIT bytes, grown (doubling) to hold NEED: mmap only, since
 * mmleak's own memory must never come from the allocator it traces.  NULL if it cannot. */
void *mml_grow(void *p, size_t *cap, size_t need, size_t unit)
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
    if (!slash || slash == l || slash[-1] != ' ')
        return 0;
    /* not our own staging files: they come and go, and the addresses they leave free are
     * soon a library's, which would then look like two objects over one range */
    if (n > 5 && !memcmp(l + n - 5, ".tail", 5)) {
        const char *base = l + n;
        while (base > slash && base[-1] != '/')
            base--;
        if (!memcmp(base, "mmleak.", 7))
            return 0;
    }
    return 1;
}

static int maps_add(const char *l, size_t n)
{
    for (size_t i = 0; i < M.n; i++)
        if (M.ln[i].len == n && !memcmp(M.text + M.ln[i].off, l, n)) {
            M.ln[i].seen = 1;
            return 0;
        }
    char *t = mml_grow(M.text, &M.tcap, M.tlen + n, 1);
    struct mline *a = mml_grow(M.ln, &M.cap, M.n + 1, sizeof *a);
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
    M.ln[i] = (struct mline){ start, (uint32_t)M.tlen, (uint32_t)n, 1, 0 };
    M.n++;
    M.tlen += n;
    return 1;
}

/* ---- mmleak.ID.loads: which mapping was there in which epoch ----
 * The epoch counts dlclose() calls.  A plugin unloaded and another object loaded at the same
 * addresses would make those addresses ambiguous in the maps file (it keeps every mapping
 * ever seen, for eu-addr2line -M); so every change is logged, "+EPOCH LINE" when a mapping
 * appears and "-EPOCH LINE" when it is gone, and frames in a range some object was unloaded
 * from carry the epoch in their top 16 bits (see capture). */
static int g_loads_on;  /* from the first dlclose on: before it, no range had two objects */
static struct fid g_loads_id, g_maps_id;    /* made by reserve_id (.maps: its last version) */
static int g_loads_used;                     /* a line was written to it */

/* 0, or -1 if a line could not be written (it is tried again at the next snapshot) */
static int loads_log_locked(void)
{
    if (!g_loads_on)
        return 0;
    unsigned e = atomic_load(&g_epoch);
    int fd = -1;
    for (size_t i = 0; i < M.n; i++) {
        struct mline *l = &M.ln[i];
        if (l->seen == l->present)
            continue;
        /* a mapping gone while a dlclose() runs (a flush inside it takes a snapshot) was
         * there for the whole of the current epoch: its removal belongs to the epoch that
         * dlclose() opens, or the readers would not find it for the frames of this one */
        unsigned le = e + (!l->seen && g_closing);
        if (fd < 0) {
            /* made with the trace id (reserve_id): a FIFO or a link put at the name before
             * or since is refused, never waited on (the first dlclose holds our lock) */
            char name[64];
            fd = open_again(file_name(name, sizeof name, ".loads"), O_WRONLY | O_APPEND,
                            &g_loads_id);
            if (fd < 0)
                return -1;
            g_loads_used = 1;
        }
        char hdr[24], *d = hdr;
        *d++ = l->seen ? '+' : '-';
        d = cat_u(d, hdr + sizeof hdr, le);
        *d++ = ' ';
        /* one file for the whole trace: past RLIMIT_FSIZE it would kill the program */
        struct stat st;
        if (fstat(fd, &st) ||
            (uint64_t)st.st_size + (size_t)(d - hdr) + l->len > fsize_limit()) {
            static atomic_int said;
            if (!atomic_exchange(&said, 1))
                say_err("cannot write the log of loads in ", EFBIG, ": addresses in unloaded "
                        "ranges may be put in the wrong library");
            close(fd);
            return 0;           /* not a passing failure: do not retry at every flush */
        }
        if (write_all(fd, hdr, (size_t)(d - hdr)) || write_all(fd, M.text + l->off, l->len)) {
            close(fd);
            return -1;
        }
        l->present = l->seen;
    }
    if (fd >= 0)
        close(fd);
    return 0;
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
    if (!force && !M.stale && c[0] == M.adds && c[1] == M.subs)
        return;
    M.adds = c[0];
    M.subs = c[1];
    /* until the file is written (a full disk, no descriptor left: passing failures), every
     * later call tries again: the readers need every mapping to name a call site */
    int was_stale = M.stale;
    M.stale = 1;
    int fd = g_procfd >= 0 ? openat(g_procfd, "self/maps", O_RDONLY | O_CLOEXEC)
                           : open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    size_t len = 0;
    for (;;) {
        if (M.bcap - len < 4096) {  /* grown only when nearly full: a new mapping costs faults */
            char *b = mml_grow(M.buf, &M.bcap, len + 65536, 1);
            if (!b)
                break;
            M.buf = b;
        }
        ssize_t r = read(fd, M.buf + len, M.bcap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    int changed = 0;
    for (size_t i = 0; i < M.n; i++)
        M.ln[i].seen = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(M.buf + i, '\n', len - i);
        size_t n = (nl ? (size_t)(nl - (M.buf + i)) : len - i) + 1;
        if (nl && wanted_map_line(M.buf + i, n - 1))
            changed |= maps_add(M.buf + i, n);
        i += n;
    }
    int loads_bad = loads_log_locked();
    if (!changed && !force && !was_stale) {
        M.stale = loads_bad;
        return;
    }
    size_t total = 0;
    for (size_t i = 0; i < M.n; i++)
        total += M.ln[i].len;
    if (total > fsize_limit()) {
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            say_err("cannot write the maps file in ", EFBIG, ": addresses of later libraries "
                    "may stay unresolved");
        return;
    }
    char name[64], tmp[64];
    file_name(name, sizeof name, ".maps");
    file_name(tmp, sizeof tmp, ".maps.tmp");
    d_unlink(tmp);
    struct fid id;
    fd = create_locked(tmp, &id);
    for (int i = 0; fd < 0 && errno == EEXIST && i < 8; i++) {
        /* another user's file there, which we may not remove (a sticky directory): a name
         * nobody can guess */
        char *d = tmp + my_strlen(file_name(tmp, sizeof tmp, ".maps.tmp."));
        *hexw(d, unguessable() & 0xffffffffffffull, 12) = 0;
        fd = create_locked(tmp, &id);
    }
    if (fd < 0)
        return;
    /* one write when the sorted text fits the read buffer (done with /proc's text by now):
     * a line per write() was a twentieth of a small program's start-up under the tracer */
    int bad = 0;
    char *b = mml_grow(M.buf, &M.bcap, total, 1);
    if (b) {
        M.buf = b;
        size_t at = 0;
        for (size_t i = 0; i < M.n; i++) {
            memcpy(b + at, M.text + M.ln[i].off, M.ln[i].len);
            at += M.ln[i].len;
        }
        bad = write_all(fd, b, at);
    } else {
        for (size_t i = 0; i < M.n && !bad; i++)
            bad = write_all(fd, M.text + M.ln[i].off, M.ln[i].len);
    }
    close(fd);
    if (bad || d_rename(tmp, name)) {
        d_unlink(tmp);
    } else {
        M.stale = loads_bad;
        g_maps_id = id;
    }
}

/* The loader's counters are read before g_lock is taken: dl_iterate_phdr takes the loader's
 * lock, and a thread inside dlopen() may be waiting for g_lock in its malloc. */
static unsigned long long g_got_adds;   /* loader's count of loads when slots were last set */

COLD static void maps_snapshot(int force)
{
    unsigned long long c[2] = { 0, 0 };
    dl_iterate_phdr(phdr_counts, c);
    pthread_mutex_lock(&g_lock);
    maps_snapshot_locked(force, c);
    int patch = g_attached && g_state == 1 && c[0] != g_got_adds;
    g_got_adds = c[0];
    pthread_mutex_unlock(&g_lock);
    /* loaded into a running process: an object loaded since (by libc itself, or by a dlopen
     * that had to keep its caller's search path) gets its slots now */
    if (patch)
        mml_got_new_objects();
}

/* ---- process start ---- */

static void escape_into(char *d, char *e, const unsigned char *raw, size_t n, int nul_space)
{
    static const char hx[] = "0123456789abcdef";
    e -= 5;
    for (size_t i = 0; i < n && d < e; i++) {
        unsigned char ch = raw[i];
        if (ch == 0 && nul_space) {
            if (i + 1 < n)
                *d++ = ' ';
        } else if (ch < 0x20 || ch >= 0x7f || ch == '\\') {
            *d++ = '\\'; *d++ = 'x'; *d++ = hx[ch >> 4]; *d++ = hx[ch & 15];
        } else {
            *d++ = (char)ch;
        }
    }
    *d = 0;
}

static void read_cmdline(void)
{
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    unsigned char raw[sizeof g_cmd / 4];
    ssize_t n = fd >= 0 ? read(fd, raw, sizeof raw) : -1;
    if (fd >= 0)
        close(fd);
    escape_into(g_cmd, g_cmd + sizeof g_cmd, raw, n > 0 ? (size_t)n : 0, 1);
}

/* Reserve a trace id with O_EXCL creates of mmleak.ID.maps and mmleak.ID.loads (the log of
 * loads is made now, empty, so that nobody else's file can stand at its name when it is
 * needed): the pid, else pid-1, pid-2..  (an exec'd image, a reused pid).  Past TAKEN_RUN
 * taken ids (planted?), pid-T, T the time in microseconds: later images of the process still
 * get higher numbers, and nobody can plant a name for every microsecond to come. */
static int reserve_id(void)
{
    char name[64];
    int err = 0;
    uint64_t k = 0;
    for (int tries = 0; tries < TAKEN_RUN + 256; tries++) {
        if (tries < TAKEN_RUN) {
            k = (uint64_t)tries;
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t now = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
            /* a few hundred microseconds' worth of names to plant per try, or none at all */
            k = (now > k ? now : k + 1) + unguessable() % 256;
            say_taken("names of trace files in ", "this trace's id is the pid and the time in "
                      "microseconds");
        }
        char *e = g_id + sizeof g_id, *d = g_id;
        d = cat_u(d, e, (unsigned long)g_pid);
        if (k) {
            d = cat(d, e, "-");
            cat_u(d, e, (unsigned long)k);
        }
        int fd = create_locked(file_name(name, sizeof name, ".maps"), &g_maps_id);
        if (fd >= 0) {
            close(fd);
            fd = create_locked(file_name(name, sizeof name, ".loads"), &g_loads_id);
            if (fd < 0) {
                err = errno;
                d_unlink(file_name(name, sizeof name, ".maps"));
                errno = err;
            }
        }
        if (fd >= 0) {
            close(fd);
            g_loads_used = 0;
            return 0;
        }
        err = errno;
        if (err != EEXIST)
            break;
    }
    /* at the start, a missing name is a directory that was never there */
    say_why("cannot create files in ", err == ENOENT ? "no such directory" : NULL, err,
            ": tracing disabled (set MMLEAK_DIR to a writable directory)");
    return -1;
}

static void thread_exit(void *arg);
static void fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void fork_child(void);

/* The fast path's page (see struct hot): mapped once, re-armed in every new trace. */
static void arm_hot(void)
{
    if (H == &hot_off) {
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED && madvise(p, 4096, MADV_WIPEONFORK) == 0)
            H = p;
        else if (p != MAP_FAILED)
            munmap(p, 4096);    /* kernel before 4.14: raw clone() children are not detected */
    }
    H->fast = cfg.depth <= 1;
    H->epoch = atomic_load(&g_epoch);
    /* once something was unloaded even depth 1 asks the cache: the verdict says "no unloaded
     * range".  Not merely because the epoch moved: an attach or a detach moves it too (so
     * that every thread drops its stale state), and an attached process at depth 1 would
     * then send every caller outside the program (libstdc++, libc) to the slow path */
    H->mask = cfg.depth == 0 || mml_sites_unloaded() ? ~(uintptr_t)0 : 0;
    H->memo = cfg.depth > 1;
    atomic_signal_fence(memory_order_seq_cst);
    H->alive = 1;
}

static void set_status(void)
{
    char *e = mmleak_status + sizeof mmleak_status, *d = mmleak_status;
    if (g_state == 1) {
        d = cat(d, e, "tracing ");
        d = cat(d, e, g_id);
        d = cat(d, e, " ");
        cat(d, e, cfg.dir);
    } else {
        cat(d, e, g_state == 2 ? "paused" : "dormant");
    }
}

static void prealloc_decide(void);

/* Called under g_lock, with the guard held.  LOADED: dl_iterate_phdr's counters, taken by
 * the caller before g_lock (the loader's lock is never taken under ours), or NULL: with them
 * the first flush finds the maps file current instead of reading /proc/self/maps again. */
static void process_start(const unsigned long long *loaded)
{
    g_pid = getpid();
    g_owner = geteuid();
    g_t0 = time(NULL);
    prealloc_decide();
    if (reserve_id()) {
        g_state = -1;
        return;
    }
    g_state = 1;
    atomic_store(&g_next_file, 0);
    for (size_t i = 0; i < M.n; i++)
        M.ln[i].present = 0;     /* a new trace: its loads log starts with every mapping */
    unsigned long long c[2] = { loaded ? loaded[0] : 0, loaded ? loaded[1] : 0 };
    maps_snapshot_locked(1, c);
    arm_hot();
    set_status();
}

/* Is our malloc the one the program calls?  Not when another allocator (jemalloc, tcmalloc, the
 * program's own) is found before us: LD_PRELOAD="libjemalloc.so.2 mmleak.so".  Asked by calling
 * the process's malloc: a non-PIE program's canonical PLT entry gives no other answer. */
static struct tstate *volatile g_probe_t;
static volatile int g_probe_hit;

static int malloc_is_ours(void)
{
    void *(*m)(size_t) = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "malloc");
    void (*f)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "free");
    if (!m || !f || m == mmleak_own_malloc)
        return 1;
    g_probe_hit = 0;
    g_probe_t = &T;
    void *p = m(24);
    g_probe_t = NULL;
    if (p)
        f(p);
    return g_probe_hit;
}

/* Two mmleak.so files preloaded (an installed one and a build, say): the first in the global
 * scope is the process's; a second one would record every event again, with the first
 * copy's code as the caller of all of them. */
static int another_copy_first(Dl_info *other, Dl_info *self)
{
    void *f = dlsym(RTLD_DEFAULT, "mmleak_state");
    return f && dladdr(f, other) && dladdr((void *)mmleak_own_malloc, self) &&
           other->dli_fbase != self->dli_fbase && other->dli_fname && self->dli_fname;
}

static int g_once_done;
static void hooks_init(void);

COLD static void global_init(void)
{
    if (!real.malloc)
        resolve();
    unsigned long long loaded[2] = { 0, 0 };
    dl_iterate_phdr(phdr_counts, loaded);
    pthread_mutex_lock(&g_lock);
    if (!g_once_done) {
        g_once_done = 1;
        note_stderr();
        int bad = read_config();
        read_cmdline();
        Dl_info other, self;
        if (another_copy_first(&other, &self)) {
            /* the first copy traces; its calls to the allocator pass through us untouched */
            say4(self.dli_fname, " is loaded after another mmleak.so (", other.dli_fname,
                 "): it stays out of the way");
            g_state = -1;
        } else if (!malloc_is_ours()) {
            Dl_info di;
            void *m = dlsym(RTLD_DEFAULT, "malloc");
            const char *who = m && dladdr(m, &di) && di.dli_fname && *di.dli_fname
                              ? di.dli_fname : "the program";
            say("malloc is replaced by ", who, ", found before mmleak.so: nothing is traced "
                "(put mmleak.so first in LD_PRELOAD)");
            resolve_from(RTLD_DEFAULT);     /* strdup & co. must use that allocator too */
            g_state = -1;
        } else if (bad) {
            g_state = -1;
        } else {
            Dl_info di;
            if (dladdr((void *)real.malloc, &di) && di.dli_fname)
                escape_into(g_alloc, g_alloc + sizeof g_alloc, (const unsigned char *)di.dli_fname,
                            my_strlen(di.dli_fname), 0);
            if (!pthread_key_create(&g_key, thread_exit))
                g_key_ok = 1;
            pthread_atfork(fork_prepare, fork_parent, fork_child);
            hooks_init();
            if (env_num("MMLEAK_PAUSED", 0, 0, 1)) {
                g_state = 2;    /* preloaded, paused: until mmleak.py attach */
                set_status();
                pthread_mutex_unlock(&g_lock);
                mml_got_switch(0);
                return;
            }
            process_start(loaded);
        }
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
 * flushes the last half and deletes the .tail: the .out file is then exact.
 *
 * When a flush fails (disk full, no descriptor left, the file size limit), nothing staged is
 * thrown away: the half stays pending in the .tail (readers find it there) and the thread
 * goes on in the other half; the next flush writes the pending half first.  Only when both
 * halves are pending does the thread drop events, counting them, and try again once a second:
 * "#dropping" marks where that began, "#lost N" how many events are missing, and every
 * report then says the trace is incomplete. */

#define HALF_HDR 32
/* The end of every half is kept free for signal handlers: an event recorded by a handler
 * that interrupted us in the middle of a line must not flush the half under that line, so
 * when the half is full it goes here instead (see emit). */
#define SLACK 4096
#define START_HALF (32 * 1024)

static char *side_name(char *buf, size_t len, unsigned n, const char *ext)
{
    char num[32], *d = num;
    d = cat(d, num + sizeof num, ".");
    d = cat_u(d, num + sizeof num, n);
    cat(d, num + sizeof num, ext);
    return file_name(buf, len, num);
}

static char *dump_name(char *buf, size_t len, unsigned n)
{
    return side_name(buf, len, n, ".out");
}

static void sset_clear(struct tstate *t);
static void sset_free(struct tstate *t);

/* ---- the registry of files, in mmleak's own memory ----
 * Never in a thread's TLS: glibc gives a dead thread's TLS to the next thread, zeroed.  fork
 * unmaps the staging areas of the threads that do not exist in the child; a daemon dropping
 * root hands the files over; a thread's file is parked here when it ends, for the next new
 * thread (a program that starts thousands of short threads writes about as many files as it
 * ever had threads at once).  Under g_lock. */
enum { SLOT_FREE, SLOT_OPEN, SLOT_PARKED };
struct slot {
    int state; unsigned fileno; char *stage; size_t half_size; uint64_t out_off;
    uint64_t *ss; size_t ss_cap, ss_n;     /* the stacks the file holds (parked files) */
    struct fid out_id, tail_id;
};
static struct { struct slot *a; size_t n, cap; } R;

static int slot_new_locked(unsigned fileno)
{
    size_t i = 0;
    while (i < R.n && R.a[i].state != SLOT_FREE)
        i++;
    if (i == R.n) {
        struct slot *a = mml_grow(R.a, &R.cap, R.n + 1, sizeof *a);
        if (!a)
            return 0;
        R.a = a;
        R.n++;
    }
    R.a[i] = (struct slot){ .state = SLOT_OPEN, .fileno = fileno };
    return (int)i + 1;
}

static void slot_sync(struct tstate *t)
{
    if (!t->slot)
        return;
    pthread_mutex_lock(&g_lock);
    struct slot *s = &R.a[t->slot - 1];
    s->fileno = t->fileno;
    s->stage = t->stage;
    s->half_size = t->half_size;
    s->out_id = t->out_id;
    s->tail_id = t->tail_id;
    pthread_mutex_unlock(&g_lock);
}

static void slot_free(struct tstate *t)
{
    if (!t->slot)
        return;
    pthread_mutex_lock(&g_lock);
    R.a[t->slot - 1].state = SLOT_FREE;
    pthread_mutex_unlock(&g_lock);
    t->slot = 0;
}

static void stage_drop(struct tstate *t)
{
    if (t->stage)
        munmap(t->stage, 2 * t->half_size);
    t->stage = NULL;
    t->cur = t->end = NULL;
    t->ustart[0] = t->ustart[1] = t->ulen[0] = t->ulen[1] = 0;
}

static char *half_body(const struct tstate *t, int h)
{
    return t->stage + (size_t)h * t->half_size + HALF_HDR;
}

/* Begin writing into half h (which holds nothing unflushed): clear it first (so a line torn
 * by a kill is followed by NULs, never by the stale end of an older line), then stamp where
 * its lines go in .out: after the held lines and the other half's pending ones, if any. */
static void half_start(struct tstate *t, int h)
{
    char *b = t->stage + (size_t)h * t->half_size;
    memset(b, 0, t->half_size);
    atomic_signal_fence(memory_order_seq_cst);
    char hdr[HALF_HDR], *d = hdr;
    memcpy(d, "#at ", 4);
    d = hexw(d + 4, t->out_off + t->hold_len + t->ulen[h ^ 1], 16);
    while (d < hdr + HALF_HDR - 1)
        *d++ = ' ';
    *d = '\n';
    memcpy(b, hdr, HALF_HDR);
    t->half = h;
    t->ustart[h] = t->ulen[h] = 0;
    t->cur = b + HALF_HDR;
    t->end = b + t->half_size - SLACK;
}

/* A flush of a busy thread reserves the blocks of what it is about to append with
 * fallocate(FALLOC_FL_KEEP_SIZE) before the pwrite, on ext4.  ext4 allocates the blocks of a
 * plain write late (delayed allocation), and reserving them page by page in the write costs
 * more than one call that allocates the whole range as one extent: measured on this
 * project's VM (bench/append_bench.c, the append section of make bench), appending in 512 KiB
 * writes cost 5.53 ns per 33 bytes (an event) without the call and 4.01 with it, the whole
 * machine's time with the later writeback included 7.4 and 6.2; the file's size is not
 * changed, so readers never see a byte the write did not put there.  It only pays for big
 * writes (64 KiB writes gained nothing), and not on tmpfs, where it costs a little (pages
 * zeroed, then written): other file systems are left as they were, unmeasured.  Files that
 * compaction deletes within seconds (MMLEAK_ROTATE_MB=8) are reserved too: measured, writing
 * 8 MB files and deleting them at once cost the same either way (9-10 ns per 33 bytes).  A
 * hint: when it fails the write allocates as it always did, and reports a full disk itself. */
#define PREALLOC_MIN (256 * 1024)
#define EXT4_MAGIC 0xEF53
static int g_prealloc;

static void prealloc_decide(void)
{
    struct statfs sf;
    g_prealloc = statfs(cfg.dir, &sf) == 0 && sf.f_type == EXT4_MAGIC;
}

/* Such a flush also ends on a page boundary of .out, with a line of blanks (readers skip
 * blank lines; about 100 bytes per 512 KiB flush, since a full half's lines end a little
 * before a page boundary).  A write that starts in the middle of a page cost about 1 ns per
 * event more on ext4 (alloc_bench, MMLEAK_DEPTH=1, medians of 11 interleaved runs: -0.94 ns
 * with the padding), the kernel's page cache handling the partial first page and smaller
 * folios.  Not after "#end" (readers know a closed file by its last line): only the flush of
 * a full half pads (make_room).  The padding is written after the lines and before the next
 * half is stamped with its "#at", so a process killed in between leaves complete lines and
 * at most part of the blank line, without its newline, at the end of .out, which readers
 * take for padding, as they take the NULs of older files. */
#define PAD_PAGE 4096
static const char g_pad_line[PAD_PAGE] = { [0 ... PAD_PAGE - 2] = ' ', [PAD_PAGE - 1] = '\n' };

static size_t pad_size(uint64_t end)
{
    return (size_t)((PAD_PAGE - end % PAD_PAGE) % PAD_PAGE);
}

static void pad_out(int fd, struct tstate *t, size_t pad)
{
    ssize_t w = pwrite(fd, g_pad_line + PAD_PAGE - pad, pad, (off_t)t->out_off);
    if (w == (ssize_t)pad)
        t->out_off += pad;
    else if (w > 0 && ftruncate(fd, (off_t)t->out_off)) {
        /* part of the blank line stays past out_off; the next flush writes over it */
    }
}

/* Write half h's pending lines at the end of .out. */
static int write_half(int fd, struct tstate *t, int h)
{
    const char *p = half_body(t, h) + t->ustart[h];
    while (t->ulen[h]) {
        ssize_t w = pwrite(fd, p, t->ulen[h], (off_t)t->out_off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            return -1;
        }
        p += w;
        t->ustart[h] += (size_t)w;
        t->ulen[h] -= (size_t)w;
        t->out_off += (uint64_t)w;
    }
    return 0;
}

/* ---- holding: lines that cannot be written yet wait in memory ----
 * When a flush fails (no descriptor left, a full disk, a name taken away) while the other half
 * still waits too, the older half's lines move to an anonymous buffer, the hold, and the thread
 * goes on in that half: no event is dropped while memory allows (MMLEAK_HOLD_MB, for all the
 * process's holds together).  Every flush writes the hold first, then the halves; a half's
 * "#at" counts the held bytes before it.  While anything is held the thread comes to the slow
 * path every HOLD_STEP bytes of events (its `end` is set that much ahead, see set_end) and
 * tries to write everything: the lines are in the file as soon as it can take them, at the
 * cost of a failed system call or two per HOLD_STEP bytes while it cannot, and nothing on the
 * fast path.  Held lines are only in memory: every half begun while lines are held starts
 * with "#dropping k=K", so a process killed meanwhile leaves a gap every report sees; once
 * all is written, "#lost 0 k=K" closes it (nothing was lost), or "#lost N k=K" when the lines
 * had to be given up (the file ended while nothing could be written). */
#define HOLD_STEP (16 * 1024)
static _Atomic size_t g_hold_total;     /* bytes of every thread's hold */

static uint64_t count_events(const char *p, size_t n);
static void stage_line(struct tstate *t, const char *s, size_t n);

static uint64_t hold_events(const struct tstate *t)
{
    return t->hold ? count_events(t->hold + t->hold_start, t->hold_len) : 0;
}

static void hold_free(struct tstate *t)
{
    if (t->hold) {
        munmap(t->hold, t->hold_cap);
        atomic_fetch_sub(&g_hold_total, t->hold_cap);
    }
    t->hold = NULL;
    t->hold_start = t->hold_len = t->hold_cap = 0;
}

/* Move half h's pending lines to the end of the hold.  0, or -1 when MMLEAK_HOLD_MB or the
 * memory is exhausted (nothing moved). */
static int hold_take(struct tstate *t, int h)
{
    size_t n = t->ulen[h];
    if (t->hold_len + n > t->hold_cap - t->hold_start) {
        size_t cap = t->hold_cap ? t->hold_cap : 64 * 1024;
        while (cap < t->hold_len + n)
            cap *= 2;
        size_t more = cap - t->hold_cap;
        if (atomic_fetch_add(&g_hold_total, more) + more > cfg.hold) {
            atomic_fetch_sub(&g_hold_total, more);
            errno = ENOMEM;
            return -1;
        }
        char *q = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) {
            atomic_fetch_sub(&g_hold_total, more);
            return -1;
        }
        if (t->hold) {
            memcpy(q, t->hold + t->hold_start, t->hold_len);
            munmap(t->hold, t->hold_cap);
        }
        t->hold = q;
        t->hold_start = 0;
        t->hold_cap = cap;
    }
    memcpy(t->hold + t->hold_start + t->hold_len, half_body(t, h) + t->ustart[h], n);
    t->hold_len += n;
    t->ustart[h] += n;
    t->ulen[h] = 0;
    return 0;
}

/* Where the current half's room ends (the slack behind it is the signal handlers'). */
static char *half_end(const struct tstate *t)
{
    return t->stage + (size_t)(t->half + 1) * t->half_size - SLACK;
}

/* The fast path's limit: the half's end, or HOLD_STEP bytes ahead while lines are held. */
static void set_end(struct tstate *t)
{
    t->end = half_end(t);
    if (t->hold_len && t->end - t->cur > HOLD_STEP)
        t->end = t->cur + HOLD_STEP;
}

static int move_pending(struct tstate *t);
static int append_to(const char *name, const char *line, size_t n, const struct fid *id);

/* Write the held lines at the end of .out. */
static int write_hold(int fd, struct tstate *t)
{
    while (t->hold_len) {
        ssize_t w = pwrite(fd, t->hold + t->hold_start, t->hold_len, (off_t)t->out_off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            return -1;
        }
        t->hold_start += (size_t)w;
        t->hold_len -= (size_t)w;
        t->out_off += (uint64_t)w;
    }
    hold_free(t);
    return 0;
}

/* Append what is staged to .out: the held lines first, then the other half's pending lines,
 * then the current half's.  0 when all is in .out; -1 (errno says why) when some stays
 * pending. */
static int flush_here(struct tstate *t, int full)
{
    int h = t->half, o = h ^ 1;
    if (t->cur)
        t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
    size_t n = t->hold_len + t->ulen[o] + t->ulen[h];
    if (!n)
        return 0;
    if (t->out_off + n > fsize_limit()) {
        errno = EFBIG;
        return -1;
    }
    int big = g_prealloc && n >= PREALLOC_MIN;     /* see g_prealloc and g_pad_line */
    size_t pad = big && full ? pad_size(t->out_off + n) : 0;
    if (t->out_off + n + pad > fsize_limit())
        pad = 0;
    char name[64];
    int fd = open_again(dump_name(name, sizeof name, t->fileno), O_WRONLY, &t->out_id);
    if (fd < 0)
        return -1;
    if (big)    /* a hint: on failure the write allocates as ever, and reports a full disk */
        (void)fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)t->out_off, (off_t)(n + pad));
    int rc = write_hold(fd, t);
    if (rc == 0)
        rc = write_half(fd, t, o);
    if (rc == 0)
        rc = write_half(fd, t, h);
    if (rc == 0 && pad)
        pad_out(fd, t, pad);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* The same; when the file cannot take the lines without passing RLIMIT_FSIZE (lowered after
 * it had grown), or is no longer there or no longer ours (deleted, and another user's FIFO or
 * link put at its name), they go on in a new file (see move_pending). */
static int flush_staged(struct tstate *t, int full)
{
    if (flush_here(t, full) == 0)
        return 0;
    int err = errno;
    if ((err == EFBIG || err == E_NOT_OURS || err == ENOENT) && !t->anon &&
        move_pending(t) == 0) {
        static atomic_int said;
        if (err != EFBIG && !atomic_exchange(&said, 1))
            say_why("a dump file in ", NULL, err, "; its thread goes on in a new file");
        return 0;
    }
    errno = err;
    return -1;
}

/* A thread that filled its first half is a busy one: give it the full MMLEAK_BUFFER_KB.  Every
 * staged line is in .out at this point.  The file is only extended (never truncated under our
 * own mapping): the first half of the new layout covers the old one and is cleared by
 * half_start, so no old "#at" header survives where the new layout reads one. */
static int grow_stage(struct tstate *t)
{
    size_t half = cfg.buffer / 2;
    if (2 * (uint64_t)half + 4096 > fsize_limit())
        return -1;
    char name[64];
    int fd = open_again(side_name(name, sizeof name, t->fileno, ".tail"), O_RDWR, &t->tail_id);
    if (fd < 0)
        return -1;
    void *p = MAP_FAILED;
    if (posix_fallocate(fd, 0, (off_t)(2 * half)) == 0)
        p = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return -1;  /* keep writing the small one */
    munmap(t->stage, 2 * t->half_size);
    t->stage = p;
    t->half_size = half;
    slot_sync(t);
    return 0;
}

/* "#lost N k=K\n": N events of gap K were not recorded.  K makes every such line unique, so
 * that readers, who pass identical '#' lines on once, never fold two gaps into one. */
static size_t lost_line(char *line, size_t cap, uint64_t n, unsigned k)
{
    char *e = line + cap, *d = line;
    d = cat(d, e, "#lost ");
    d = cat_u(d, e, (unsigned long)n);
    d = cat(d, e, " k=");
    d = cat_u(d, e, k ? k : atomic_fetch_add(&g_episode, 1) + 1);
    d = cat(d, e, "\n");
    return (size_t)(d - line);
}

/* End the thread's file: "#lost N" if events were dropped, "#end", flush, delete the staging
 * file.  If the flush fails, the .tail stays: readers take the lines from it. */
static int anon_to_file(struct tstate *t);

/* Events (not '#' lines) in a stretch of staged lines. */
static uint64_t count_events(const char *p, size_t n)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] == '\n' && i + 1 < n && p[i + 1] != '#')
            k++;
    return k + (n && p[0] != '#');
}

/* A file's last lines into LINE (CAP bytes, 96 is enough): "#lost" when events were counted
 * but not kept, or a gap of held lines is still open (the caller then clears the count and
 * the gap), and "#end". */
static size_t trailer_text(char *line, size_t cap, const struct tstate *t)
{
    char *e = line + cap, *d = line;
    if (t->lost || t->holding)
        d += lost_line(d, cap, t->lost, t->episode);
    d = cat(d, e, "#end\n");
    return (size_t)(d - line);
}

/* "#title t=TIME TITLE": the process's command line as it is now (a daemon's worker renames
 * itself: PostgreSQL, nginx, sshd...), TIME seconds after the start, escaped like "#cmd",
 * into D (ROOM bytes); 0 bytes when it does not fit or cannot be read. */
static size_t title_text(char *d, size_t room)
{
    unsigned char raw[sizeof g_cmd / 4];     /* as much as "#cmd" has */
    if (room < 80)
        return 0;
    int fd = g_procfd >= 0 ? openat(g_procfd, "self/cmdline", O_RDONLY | O_CLOEXEC)
                           : open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, raw, sizeof raw) : -1;
    if (fd >= 0)
        close(fd);
    while (n > 0 && (raw[n - 1] == 0 || raw[n - 1] == ' '))
        n--;                /* a title written over the arguments is padded */
    if (n <= 0)
        return 0;
    char *e = d + room, *p = cat(d, e, "#title t=");
    time_t now = time(NULL) - g_t0;
    p = cat_u(p, e, (unsigned long)(now < 0 ? 0 : now));
    p = cat(p, e, " ");
    escape_into(p, e - 1, raw, (size_t)n, 1);
    p += my_strlen(p);
    *p++ = '\n';
    return (size_t)(p - d);
}

static void file_close(struct tstate *t, int trailer)
{
    if (!t->stage)
        return;
    if (t->anon && anon_to_file(t)) {
        /* never got a file: what is in memory is lost, and counted */
        int h = t->half, o = h ^ 1;
        if (t->cur)
            t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
        uint64_t n = count_events(half_body(t, o) + t->ustart[o], t->ulen[o]) +
                     count_events(half_body(t, h) + t->ustart[h], t->ulen[h]) +
                     hold_events(t);
        atomic_fetch_add(&g_lost_orphan, n + t->lost);
        hold_free(t);
        munmap(t->stage, 2 * t->half_size);
        t->stage = NULL;
        t->cur = t->end = NULL;
        t->anon = t->open = t->dropping = t->holding = 0;
        t->lost = 0;
        return;
    }
    if (t->dropping && flush_staged(t, 0) == 0) {
        t->dropping = 0;
        half_start(t, t->half ^ 1);
    }
    if (t->hold_len && (t->dropping || flush_staged(t, 0))) {
        /* the file ends and its held lines still cannot be written: they are lost, and the
         * count says how many (the gap their "#dropping" opened closes with it) */
        t->lost += hold_events(t);
        hold_free(t);
    }
    if (!t->dropping) {
        if (trailer) {
            /* the slack behind `end` always has room for the "#lost" and "#end" lines, and
             * for the title when no signal handler's lines took it */
            char line[64];
            size_t n = trailer_text(line, sizeof line, t);
            stage_line(t, line, n - 5);
            ptrdiff_t room = half_end(t) + SLACK - t->cur - 64;
            t->cur += room > 0 ? title_text(t->cur, (size_t)room) : 0;
            stage_line(t, "#end\n", 5);
            t->lost = 0;
            t->holding = 0;
        }
        if (flush_staged(t, 0) == 0) {
            char name[64];
            d_unlink(side_name(name, sizeof name, t->fileno, ".tail"));
        }
    }
    hold_free(t);
    stage_drop(t);
    slot_free(t);
    sset_clear(t);
    t->open = 0;
    t->dropping = 0;
    t->holding = 0;
}

static size_t header_text(char *h, size_t cap, unsigned fileno, int late)
{
    char *e = h + cap, *d = h;
    d = cat(d, e, "#mmleak ");
    d = cat_u(d, e, FORMAT_VERSION);
    d = cat(d, e, " id=");
    d = cat(d, e, g_id);
    d = cat(d, e, " pid=");
    d = cat_u(d, e, (unsigned long)g_pid);
    d = cat(d, e, " tid=");
    d = cat_u(d, e, (unsigned long)syscall(SYS_gettid));
    d = cat(d, e, " file=");
    d = cat_u(d, e, fileno);
    d = cat(d, e, " depth=");
    d = cfg.depth ? cat_u(d, e, (unsigned long)cfg.depth) : cat(d, e, "auto");
    d = cat(d, e, " start=");
    d = cat_u(d, e, (unsigned long)g_t0);
    d = cat(d, e, late ? " late=1" : "");
    d = cat(d, e, g_window ? " window=1" : "");
    d = cat(d, e, "\n#cmd ");
    d = cat(d, e, g_cmd);
    if (g_alloc[0]) {
        d = cat(d, e, "\n#alloc ");
        d = cat(d, e, g_alloc);
    }
    d = cat(d, e, "\n");
    return (size_t)(d - h);
}

static void stage_line(struct tstate *t, const char *s, size_t n)
{
    memcpy(t->cur, s, n);
    t->cur += n;
}

/* The file's header line, written straight into the half just started (it always has room:
 * at least 8 KiB less the slack): a copy on the stack was 2.8 KB of the deepest frame of a
 * thread's first event and of a rotation. */
static void stage_header(struct tstate *t, unsigned fileno)
{
    size_t room = (size_t)(t->end - t->cur), cap = sizeof g_cmd + sizeof g_alloc + 256;
    t->cur += header_text(t->cur, cap < room ? cap : room, fileno, t->late);
}

/* Create a new dump file mmleak.ID.N.out with an N nobody took (and, if TAIL_FD, its staging
 * file .N.tail, the same N): under g_lock.  The .out's descriptor, or -1 (errno). */
static int new_dump_locked(unsigned *np, struct fid *out_id, int *tail_fd, struct fid *tail_id)
{
    char name[64], tname[64];
    for (int run = 0; run < 16 * TAKEN_RUN; run++) {
        if (run && run % TAKEN_RUN == 0) {
            atomic_fetch_add(&g_next_file, (1u << 16) + (unsigned)(unguessable() % (1u << 24)));
            say_taken("names of dump files in ", "they are skipped, and this trace's files "
                      "are numbered past them");
        }
        unsigned n = atomic_fetch_add(&g_next_file, 1);
        int ofd = create_locked(dump_name(name, sizeof name, n), out_id);
        if (ofd < 0) {
            if (errno == EEXIST)
                continue;
            atomic_store(&g_next_file, n);  /* not taken: the next try uses it (g_lock) */
            return -1;
        }
        if (tail_fd) {
            int fd = create_locked(side_name(tname, sizeof tname, n, ".tail"), tail_id);
            if (fd < 0) {
                int err = errno;
                close(ofd);
                d_unlink(name);
                errno = err;
                if (err == EEXIST)
                    continue;
                atomic_store(&g_next_file, n);
                return -1;
            }
            *tail_fd = fd;
        }
        *np = n;
        return ofd;
    }
    errno = EEXIST;
    return -1;
}

/* Open a new dump file for this thread: mmleak.ID.N.out and its staging file .N.tail. */
static size_t first_half(void)
{
    return (cfg.buffer < 2 * START_HALF ? cfg.buffer : 2 * START_HALF) / 2;
}

static int file_open(struct tstate *t, size_t min_half)
{
    size_t half = first_half();
    while (half < min_half)
        half *= 2;
    if (2 * (uint64_t)half + 4096 > fsize_limit()) {
        errno = EFBIG;
        return -1;
    }
    char name[64], tname[64];
    int fd = -1;
    unsigned n = 0;
    struct fid out_id, tail_id;
    pthread_mutex_lock(&g_lock);
    int ofd = new_dump_locked(&n, &out_id, &fd, &tail_id);
    int err = errno;
    if (ofd >= 0)
        close(ofd);
    int slot = fd >= 0 ? slot_new_locked(n) : 0;
    pthread_mutex_unlock(&g_lock);
    if (fd < 0) {
        errno = err;
        return -1;
    }
    dump_name(name, sizeof name, n);
    side_name(tname, sizeof tname, n, ".tail");
    void *p = MAP_FAILED;
    /* fallocate, not just ftruncate: a full disk must fail here, not SIGBUS later */
    int rc = posix_fallocate(fd, 0, (off_t)(2 * half));
    if (rc == 0) {
        p = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        rc = p == MAP_FAILED ? errno : 0;
    }
    close(fd);
    if (p == MAP_FAILED || !slot) {
        if (p != MAP_FAILED)
            munmap(p, 2 * half);
        t->slot = slot;
        slot_free(t);
        d_unlink(tname);
        d_unlink(name);
        errno = rc ? rc : ENOMEM;
        return -1;
    }
    t->fileno = n;
    t->out_id = out_id;
    t->tail_id = tail_id;
    t->stage = p;
    t->half_size = half;
    t->out_off = 0;
    t->ulen[0] = t->ulen[1] = 0;
    t->slot = slot;
    half_start(t, 0);
    t->open = 1;
    t->late_lines = 0;
    stage_header(t, n);
    slot_sync(t);
    return 0;
}

/* Rotation (the file reached MMLEAK_ROTATE_MB, every staged line is in it): the thread goes
 * on in a new file with the same staging file, renamed, so that no new mapping has to be made
 * and faulted in (with the 8 MB files of compaction, a new staging file per rotation cost the
 * traced program a few percent more CPU than the tracer alone).  The old file gets its "#end"
 * written straight to it; the staging halves are cleared before the rename, so that under
 * either name they hold nothing a reader would take for unflushed lines.  0: done; -1: not
 * done, the old file as it was (the caller closes it and opens another the usual way); 1:
 * the old file is ended and the thread has no file (a compactor folded the ended file and
 * removed the staging file before the rename: the caller opens another). */
static int file_rotate(struct tstate *t)
{
    if (t->anon || t->dropping || t->late || !t->stage || t->ulen[0] || t->ulen[1] ||
        t->hold_len)
        return -1;
    char oname[64], nname[64], otail[64], ntail[64], line[96];
    size_t len = trailer_text(line, sizeof line, t);
    if (t->out_off + len > fsize_limit())
        return -1;
    unsigned n = 0;
    int tfd = -1;
    struct fid out_id, tail_id;
    pthread_mutex_lock(&g_lock);
    /* the new .tail's name is made too (O_EXCL), and then renamed over: never a name that
     * somebody else's file may hold */
    int ofd = new_dump_locked(&n, &out_id, &tfd, &tail_id);
    pthread_mutex_unlock(&g_lock);
    if (ofd < 0)
        return -1;
    close(ofd);
    close(tfd);
    dump_name(nname, sizeof nname, n);
    side_name(ntail, sizeof ntail, n, ".tail");
    int fd = open_again(dump_name(oname, sizeof oname, t->fileno), O_WRONLY, &t->out_id);
    ssize_t w = fd >= 0 ? pwrite(fd, line, len, (off_t)t->out_off) : -1;
    if (fd >= 0)
        close(fd);
    if (w != (ssize_t)len) {
        d_unlink(ntail);
        d_unlink(nname);
        return -1;          /* a partial "#end" is a torn line: the next flush overwrites it */
    }
    t->out_off += len;
    t->lost = 0;
    t->holding = 0;         /* trailer_text closed the gap */
    memset(t->stage, 0, 2 * t->half_size);
    side_name(otail, sizeof otail, t->fileno, ".tail");
    int moved = d_rename(otail, ntail) == 0;
    /* what was renamed must be our staging file: if a compactor took the old name away
     * meanwhile (the file was ended), another user may have put anything there */
    int ours = moved;
    if (moved && (fd = open_again(ntail, O_RDONLY, &t->tail_id)) >= 0)
        close(fd);
    else if (moved && errno == E_NOT_OURS)
        ours = 0;           /* (any other failure, no descriptor say: it is ours) */
    if (!ours) {
        d_unlink(ntail);    /* our reservation, or what was renamed onto it */
        d_unlink(nname);
        if (!moved)
            d_unlink(otail);
        stage_drop(t);
        slot_free(t);
        sset_clear(t);
        t->open = 0;
        return 1;
    }
    t->fileno = n;
    t->out_id = out_id;
    t->out_off = 0;
    t->late_lines = 0;
    sset_clear(t);
    half_start(t, 0);
    stage_header(t, n);
    slot_sync(t);
    return 0;
}

/* The longest run of whole lines at P (of N bytes) that fits in ROOM bytes. */
static size_t whole_lines(const char *p, size_t n, uint64_t room)
{
    if (n <= room)
        return n;
    size_t k = (size_t)room;
    while (k > 0 && p[k - 1] != '\n')
        k--;
    return k;
}

/* T goes on in the file F was opened on (F: a scratch state that file_open filled, whose
 * staged lines are all T's pending ones): T's old staging area is the caller's to release. */
static void take_file(struct tstate *t, const struct tstate *f)
{
    t->stage = f->stage;
    t->half_size = f->half_size;
    t->half = f->half;
    t->fileno = f->fileno;
    t->out_id = f->out_id;
    t->tail_id = f->tail_id;
    t->out_off = f->out_off;
    t->slot = f->slot;
    t->ustart[0] = t->ustart[1] = t->ulen[0] = t->ulen[1] = 0;
    t->cur = f->cur;
    t->end = f->end;
    t->late_lines = 0;
}

/* The thread's file cannot take its pending lines: RLIMIT_FSIZE was lowered below what it
 * holds (a limit known from the start makes us rotate before it).  New files take them,
 * written at once behind their headers (as many files as the limit needs, each ended with
 * "#end"), and the thread goes on in the last one; the old file gets "#end" if the limit
 * allows, and loses its staging file (whose lines moved).  -1 when the lines could not all
 * be moved (what was not stays pending, in order). */
static int move_pending(struct tstate *t)
{
    uint64_t lim = fsize_limit();
    for (;;) {
        int h = t->half, o = h ^ 1;
        struct tstate f;
        memset(&f, 0, sizeof f);
        f.late = t->late;
        if (file_open(&f, 0))
            return -1;
        char name[64];
        int fd = -1;
        if (flush_here(&f, 0) == 0)         /* the header */
            fd = open_again(dump_name(name, sizeof name, f.fileno), O_WRONLY, &f.out_id);
        /* whole lines, with room left for "#end": the held ones, then each half's */
        uint64_t room = f.out_off + 5 + SLACK < lim ? lim - f.out_off - 5 - SLACK : 0;
        const char *seg[3] = { t->hold ? t->hold + t->hold_start : NULL,
                               half_body(t, o) + t->ustart[o], half_body(t, h) + t->ustart[h] };
        size_t *start[3] = { &t->hold_start, &t->ustart[o], &t->ustart[h] };
        size_t *len[3] = { &t->hold_len, &t->ulen[o], &t->ulen[h] };
        size_t take[3], moved = 0;
        int ok = fd >= 0;
        for (int i = 0; i < 3; i++) {
            take[i] = i && take[i - 1] < *len[i - 1] ? 0 : whole_lines(seg[i], *len[i], room - moved);
            ok = ok && (!take[i] || pwrite(fd, seg[i], take[i], (off_t)(f.out_off + moved)) ==
                                    (ssize_t)take[i]);
            moved += take[i];
        }
        if (fd >= 0)
            close(fd);
        if (!ok || !moved) {
            file_close(&f, 1);
            sset_free(&f);
            errno = EFBIG;
            return -1;
        }
        f.out_off += moved;
        for (int i = 0; i < 3; i++) {
            *start[i] += take[i];
            *len[i] -= take[i];
        }
        if (!t->hold_len)
            hold_free(t);
        half_start(&f, f.half ^ 1);         /* "#at" after the moved lines */
        if (t->hold_len || t->ulen[o] || t->ulen[h]) {  /* more than one new file holds */
            file_close(&f, 1);
            sset_free(&f);
            continue;
        }
        append_to(dump_name(name, sizeof name, t->fileno), "#end\n", 5, &t->out_id);
        d_unlink(side_name(name, sizeof name, t->fileno, ".tail"));
        munmap(t->stage, 2 * t->half_size);
        slot_free(t);
        sset_clear(t);                      /* the new file holds none of the stacks */
        take_file(t, &f);
        return 0;
    }
}

/* Take a parked file, if there is one. */
static int take_parked(struct tstate *t)
{
    pthread_mutex_lock(&g_lock);
    size_t i = R.n;
    while (i > 0 && R.a[i - 1].state != SLOT_PARKED)
        i--;
    struct slot s = i ? R.a[i - 1] : (struct slot){ .state = SLOT_FREE };
    if (i)
        R.a[i - 1].state = SLOT_OPEN;
    pthread_mutex_unlock(&g_lock);
    if (!i)
        return -1;
    t->slot = (int)i;
    t->fileno = s.fileno;
    t->out_id = s.out_id;
    t->tail_id = s.tail_id;
    t->stage = s.stage;
    t->half_size = s.half_size;
    t->out_off = s.out_off;
    t->ulen[0] = t->ulen[1] = 0;
    sset_free(t);
    t->ss = s.ss;
    t->ss_cap = s.ss_cap;
    t->ss_n = s.ss_n;
    half_start(t, 0);
    t->open = 1;
    return 0;
}

/* A new thread continues a parked file, if there is one; "#thread" marks the handover. */
static int unpark(struct tstate *t)
{
    if (take_parked(t))
        return -1;
    t->late = 0;
    t->late_lines = 0;
    t->exit_rounds = 0;
    char line[64], *d = line, *e = line + sizeof line;
    d = cat(d, e, "#thread tid=");
    d = cat_u(d, e, (unsigned long)syscall(SYS_gettid));
    d = cat(d, e, "\n");
    stage_line(t, line, (size_t)(d - line));
    return 0;
}

/* The thread's file is given up when it ends: parked for the next new thread. */
static void park(struct tstate *t)
{
    if (t->dropping || t->lost || t->holding || flush_staged(t, 0) != 0) {
        file_close(t, 1); /* keeps what could not be written in the .tail */
        return;
    }
    pthread_mutex_lock(&g_lock);
    struct slot *s = &R.a[t->slot - 1];
    *s = (struct slot){ SLOT_PARKED, t->fileno, t->stage, t->half_size, t->out_off,
                        t->ss, t->ss_cap, t->ss_n, t->out_id, t->tail_id };
    pthread_mutex_unlock(&g_lock);
    t->ss = NULL;
    t->ss_cap = t->ss_n = 0;
    t->slot = 0;
    t->stage = NULL;
    t->cur = t->end = NULL;
    t->open = 0;
}

/* Close every parked file (process exit). */
static void close_parked(void)
{
    struct tstate tmp;
    memset(&tmp, 0, sizeof tmp);
    while (take_parked(&tmp) == 0)
        file_close(&tmp, 1);
    sset_free(&tmp);
}

static void key_for_exit(struct tstate *t)
{
    t->exit_rounds = 0;
    if (g_key_ok)
        pthread_setspecific(g_key, t);
}

static void start_dropping(struct tstate *t, int err)
{
    if (!atomic_exchange(&g_said_write, 1))
        say_err("cannot write a dump file in ", err, WRITE_FAILED_TAIL);
    if (!t->holding)    /* the gap of held lines goes on: its "#lost" will count these too */
        t->episode = atomic_fetch_add(&g_episode, 1) + 1;
    t->holding = 0;
    if (t->stage && t->cur) {
        /* in the slack behind `end`: where the gap begins, for a reader after a crash */
        char line[48], *e = line + sizeof line, *d = line;
        d = cat(d, e, "#dropping k=");
        d = cat_u(d, e, t->episode);
        d = cat(d, e, "\n");
        stage_line(t, line, (size_t)(d - line));
        t->ulen[t->half] += (size_t)(d - line);
    }
    t->cur = t->end = NULL;
    t->dropping = 1;
    t->retry_at = time(NULL) + 1;
    key_for_exit(t);
}

COLD static void maps_snapshot(int force);

/* No file could be created (no descriptor left, a full disk, a directory gone): stage in
 * anonymous memory meanwhile, exactly as in a .tail (only a SIGKILL now would lose it), and
 * try to create the file at every full half. */
static int anon_open(struct tstate *t)
{
    size_t half = first_half();
    void *p = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    t->stage = p;
    t->half_size = half;
    t->out_off = 0;
    t->ulen[0] = t->ulen[1] = 0;
    t->anon = 1;
    t->open = 1;
    half_start(t, 0);
    return 0;
}

/* A file just made by file_open, given up: removed with its staging file. */
static void file_discard(struct tstate *f)
{
    char name[64];
    munmap(f->stage, 2 * f->half_size);
    f->stage = NULL;
    slot_free(f);
    sset_free(f);
    d_unlink(side_name(name, sizeof name, f->fileno, ".tail"));
    d_unlink(dump_name(name, sizeof name, f->fileno));
}

/* The file can be created now: create it, and write its header and everything the anonymous
 * halves and the hold have, in order, at once; the thread goes on in the file.  All or
 * nothing: -1 (errno) when the file cannot be made or written, and every line is still
 * where it was. */
static int anon_to_file(struct tstate *t)
{
    int h = t->half, o = h ^ 1;
    if (t->cur)
        t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
    struct tstate f;
    memset(&f, 0, sizeof f);
    f.late = t->late;
    if (file_open(&f, 0))
        return -1;
    size_t hn = (size_t)(f.cur - half_body(&f, 0));     /* the header file_open staged */
    const char *seg[4] = { half_body(&f, 0), t->hold ? t->hold + t->hold_start : NULL,
                           half_body(t, o) + t->ustart[o], half_body(t, h) + t->ustart[h] };
    size_t len[4] = { hn, t->hold_len, t->ulen[o], t->ulen[h] };
    uint64_t total = hn + t->hold_len + t->ulen[o] + t->ulen[h], off = 0;
    char name[64];
    int fd = total <= fsize_limit()
             ? open_again(dump_name(name, sizeof name, f.fileno), O_WRONLY, &f.out_id)
             : (errno = EFBIG, -1);
    int bad = fd < 0;
    for (int i = 0; !bad && i < 4; i++) {
        const char *p = seg[i];
        for (size_t left = len[i]; left && !bad;) {
            ssize_t w = pwrite(fd, p, left, (off_t)off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                if (w == 0)
                    errno = ENOSPC;
                bad = 1;
                break;
            }
            p += w;
            left -= (size_t)w;
            off += (uint64_t)w;
        }
    }
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (bad) {
        file_discard(&f);
        errno = err;
        return -1;
    }
    f.out_off = total;
    f.ustart[0] = hn;
    half_start(&f, 1);
    hold_free(t);
    munmap(t->stage, 2 * t->half_size);
    t->anon = 0;
    take_file(t, &f);
    return 0;
}

/* While lines are held: a half begins with "#dropping k=K" (see hold_take). */
static void hold_mark(struct tstate *t)
{
    char line[48], *e = line + sizeof line, *d = line;
    d = cat(d, e, "#dropping k=");
    d = cat_u(d, e, t->episode);
    d = cat(d, e, "\n");
    stage_line(t, line, (size_t)(d - line));
}

/* Every held line is written: "#lost 0 k=K" closes the gap "#dropping k=K" opened. */
static void hold_close(struct tstate *t)
{
    if (!t->holding || t->hold_len || t->dropping || !t->cur)
        return;
    char line[64];
    stage_line(t, line, lost_line(line, sizeof line, 0, t->episode));
    t->holding = 0;
}

/* Make room for `need` bytes at t->cur: open the thread's files, flush a half, rotate. */
static int make_room(struct tstate *t, size_t need)
{
    if (g_state == 0)
        global_init();
    if (g_state < 0 || t->dropping || t->dead) {
        if (g_state < 0)
            t->cur = t->end = NULL;
        return -1;
    }
    if (!t->open) {
        mml_unwind_thread_init();   /* its stack's bounds, while we are near its top */
        if (unpark(t) && file_open(t, 0)) {
            int err = errno;
            if (anon_open(t)) {
                start_dropping(t, err);
                return -1;
            }
            if (!atomic_exchange(&g_said_write, 1))
                say_err("cannot create a dump file in ", err, WRITE_FAILED_TAIL);
        }
        key_for_exit(t);
        maps_snapshot(0);
        if ((size_t)(t->end - t->cur) >= need)
            return 0;
    }
    if (t->hold_len && half_end(t) - t->cur >= (ptrdiff_t)(need + 64)) {
        /* lines are held and the half has room: a step (see HOLD_STEP), a try to write */
        if (t->anon ? anon_to_file(t) == 0 : flush_staged(t, 0) == 0)
            hold_close(t);
        set_end(t);
        return (size_t)(t->end - t->cur) >= need ? 0 : -1;
    }
    /* the current half is full */
    int h = t->half, was_anon = t->anon;
    if (was_anon ? anon_to_file(t) == 0 : flush_staged(t, 1) == 0) {
        if (was_anon) { /* now in a file, its current half empty */
            hold_close(t);
            return (size_t)(t->end - t->cur) >= need ? 0 : -1;
        }
        if (t->out_off >= cfg.rotate || t->out_off + t->half_size + 4096 > fsize_limit()) {
            int r = t->out_off >= cfg.rotate ? file_rotate(t) : -1;
            if (r == 0) {
                maps_snapshot(0);
                return (size_t)(t->end - t->cur) >= need ? 0 : -1;
            }
            if (r < 0)
                file_close(t, 1);
            return make_room(t, need);
        }
        int grown = 2 * t->half_size < cfg.buffer ? grow_stage(t) : -1;
        half_start(t, grown == 0 ? 0 : h ^ 1);
        hold_close(t);
        maps_snapshot(0);
        return (size_t)(t->end - t->cur) >= need ? 0 : -1;
    }
    int err = errno;
    if (t->anon)
        t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
    /* this half stays pending (in the .tail, or the anonymous halves); the other one, if it is
     * still pending too, goes to the hold; go on in it, and try again soon */
    if (t->ulen[h ^ 1] == 0 || hold_take(t, h ^ 1) == 0) {
        if (!atomic_exchange(&g_said_write, 1))
            say_err("cannot write a dump file in ", err, WRITE_FAILED_TAIL);
        if (t->hold_len && !t->holding) {
            t->holding = 1;
            t->episode = atomic_fetch_add(&g_episode, 1) + 1;
        }
        half_start(t, h ^ 1);
        if (t->holding)
            hold_mark(t);
        set_end(t);
        return (size_t)(t->end - t->cur) >= need ? 0 : -1;
    }
    start_dropping(t, err);
    return -1;
}

/* While dropping: once a second (and every 1024 events) try to write again; 1 when that
 * worked and there is room for this event's N bytes, else the event is counted as lost. */
static int drop_event(struct tstate *t, size_t n)
{
    time_t now = time(NULL);
    if (now < t->retry_at && ((t->lost + 1) & 1023)) {
        t->lost++;
        return 0;
    }
    t->retry_at = now + 1;
    int ok;
    if (t->anon) {
        ok = anon_to_file(t) == 0;
    } else if (t->stage) {
        ok = flush_staged(t, 0) == 0;
        if (ok)
            half_start(t, t->half ^ 1);
    } else {
        ok = !(unpark(t) && file_open(t, 0));
        if (ok)
            key_for_exit(t);
    }
    if (!ok) {
        t->lost++;
        return 0;
    }
    t->dropping = 0;
    char line[64];
    stage_line(t, line, lost_line(line, sizeof line, t->lost, t->episode));
    t->lost = 0;
    if (t->end - t->cur >= (ptrdiff_t)n)
        return 1;   /* the event that found writing works again is written, not lost */
    t->lost++;
    return 0;
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
    char *lo = half_body(t, t->half) + t->ustart[t->half];
    char *from = t->cur - lo > 2 * SLACK ? t->cur - 2 * SLACK : lo;
    return from < t->cur && memchr(from, 0, (size_t)(t->cur - from)) != NULL;
}

/* After the main thread's file was closed (process exit, exec), a few more events may come:
 * destructors, execvp's search of PATH.  They go to the process's shared late file (below), a
 * write each, rather than a new file and staging file for them; past LATE_DIRECT lines the
 * thread is evidently going on (a failed exec) and gets a new file.  A file that ends with
 * "#end" is final: nothing is ever appended to it (mmleak.py compact relies on that). */
#define LATE_DIRECT 256

static int late_direct(const struct tstate *t)
{
    return t->late && !t->open && !t->dead && t->late_lines < LATE_DIRECT && g_state == 1 &&
           g_pid == getpid();
}

/* Append a line to a closed file of ours, if the size limit allows. */
static int append_to(const char *name, const char *line, size_t n, const struct fid *id)
{
    int fd = open_again(name, O_WRONLY | O_APPEND, id);
    if (fd < 0)
        return -1;
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size + n <= fsize_limit())
        rc = write_all(fd, line, n);
    close(fd);
    return rc;
}

static void late_shared(const char *line, size_t n);

static void append_direct(struct tstate *t, const char *line, size_t n)
{
    late_shared(line, n);
    t->late_lines++;
}

/* Events of a thread after its last key destructor round (glibc frees the dlerror() and
 * strerror() buffers after that): appended, a write each, to one shared "late" file of the
 * process.  Such a thread never registers again: its TLS is about to be reused. */
static unsigned g_late_file = ~0u;
static struct fid g_late_id;

static void late_shared(const char *line, size_t n)
{
    char name[64];
    pthread_mutex_lock(&g_lock);
    if (g_late_file == ~0u ||
        append_to(dump_name(name, sizeof name, g_late_file), line, n, &g_late_id)) {
        unsigned no = 0;
        struct fid id;
        int fd = new_dump_locked(&no, &id, NULL, NULL);
        char h[sizeof g_cmd + sizeof g_alloc + 256];
        size_t hn = fd >= 0 ? header_text(h, sizeof h, no, 1) : 0;
        if (fd >= 0 && hn + n <= fsize_limit() && !write_all(fd, h, hn) && !write_all(fd, line, n)) {
            g_late_file = no;
            g_late_id = id;
        } else
            atomic_fetch_add(&g_lost_orphan, 1);
        if (fd >= 0)
            close(fd);
    }
    pthread_mutex_unlock(&g_lock);
}

/* The general writer: any width, any depth.  Builds the line on the stack, then reserves
 * its bytes and copies them, newline last. */
static int emit_cold(struct tstate *t, const char *line, size_t n);

static int emit_free_cold(struct tstate *t, const char *line, size_t n);

static int emit(const char *line, size_t n)
{
    struct tstate *t = &T;
    if (unlikely(t->dead | t->dropping) || t->end - t->cur < (ptrdiff_t)(n + 16)) {
        int rc = emit_cold(t, line, n);
        if (rc <= 0)
            return 0;
    }
    char *d = reserve(t, n);
    memcpy(d, line, n - 1);
    atomic_signal_fence(memory_order_release);
    d[n - 1] = '\n';
    return 1;
}

/* A free, written like any event; but a thread that has no file yet and never allocated
 * puts its first frees in the shared late file instead of making a file for them.  The
 * thread may be past its last key destructor: glibc frees a dlerror() or strerror() buffer
 * after them, and when tracing started after the buffer was made (MMLEAK_PAUSED, attach)
 * that free is the thread's first event; a file it made then could never be given up (our
 * key destructor would not run again) and stayed behind, one per ending thread.  glibc frees
 * a handful of such buffers; past EARLY_FREES frees (a write each) the thread is evidently
 * going on, freeing what others allocated, and makes its file. */
#define EARLY_FREES 16

static int emit_free(const char *line, size_t n)
{
    struct tstate *t = &T;
    if (unlikely(!t->stage) && !t->open && !t->dead && !t->dropping && !t->late &&
        t->early_frees < EARLY_FREES)
        return emit_free_cold(t, line, n);
    return emit(line, n);
}

static int emit_free_cold(struct tstate *t, const char *line, size_t n)
{
    INFLIGHT;
    if (g_state != 1)
        return 0;
    if (g_pid != getpid() || t->trace_gen != g_trace_gen)
        return emit(line, n);   /* a forked child, an old trace: the ordinary way */
    late_shared(line, n);
    t->early_frees++;
    return 0;
}

/* The part of emit that touches files: counted in g_inflight, so that a detach waits for it
 * (and, begun after the detach, it does nothing).  1: room was made; 0: nothing to write. */
static int emit_cold(struct tstate *t, const char *line, size_t n)
{
    INFLIGHT;
    if (g_state != 1)
        return 0;
    if (t->dead) {
        late_shared(line, n);
        return 0;
    }
    if (t->dropping)
        return drop_event(t, n + 16);
    if (late_direct(t)) {
        append_direct(t, line, n);
        return 0;
    }
    if (unfinished_line(t)) {
        /* a signal handler, while the line it interrupted is unfinished: no flush */
        if (!t->stage || half_end(t) + SLACK - t->cur < (ptrdiff_t)(n + 16)) {
            /* deeper than the slack (a storm of signals that keeps the interrupted line
             * from finishing): the event is lost, counted, and "#lost" says so after the
             * next flush, so every report says the trace is incomplete */
            t->lost++;
            return 0;
        }
        return 1;
    }
    char gap[64];
    size_t ng = t->lost ? lost_line(gap, sizeof gap, t->lost, 0) : 0;
    if (make_room(t, n + 16 + ng)) {
        if (t->dropping)
            t->lost++;
        return 0;
    }
    if (ng && !t->dropping) {       /* events lost under an unfinished line, see above */
        stage_line(t, gap, ng);
        t->lost = 0;
    }
    return 1;
}

/* Shared entry of the slow paths: 0 to go on and record. */
/* The thread's state belongs to an earlier trace of this process (a detach came between):
 * forget it.  Its staging mapping was closed by the detach, from outside. */
static void thread_reset(struct tstate *t)
{
    t->stage = NULL;
    t->cur = t->end = NULL;
    hold_free(t);           /* its lines are lost: the halves' "#dropping" said so */
    t->holding = 0;
    t->open = t->dropping = t->anon = t->late = 0;
    t->late_lines = t->exit_rounds = t->early_frees = 0;
    t->slot = 0;
    t->lost = 0;
    t->ustart[0] = t->ustart[1] = t->ulen[0] = t->ulen[1] = 0;
    sset_clear(t);
    t->trace_gen = g_trace_gen;
}

static int slow_enter(struct tstate *t)
{
    if (IN_OWN_CODE(t)) {
        if (g_probe_t == t)
            g_probe_hit = 1;
        return -1;
    }
    if (g_state < 0)
        return -1;
    if (t->trace_gen != g_trace_gen)
        thread_reset(t);
    if (g_state == 2) {          /* paused: the slots point elsewhere; a stored pointer */
        t->epoch = H->epoch;     /* to our function still comes here: let it pass */
        return -1;
    }
    return 0;
}

static const void *new_caller(const struct tstate *t, const void *ra);

/* ---- stacks ----
 * An allocation whose stack has more than one frame is written as "PTR SEQ SIZE TIME @ID",
 * and its stack once per file as "#s ID FRAME...": ID is a 64-bit hash of the frames, the
 * same in every file and process, so readers can merge any files.  Each thread keeps the set
 * of ids its current file already holds (it moves with the file when a new thread continues
 * a parked one, and is emptied when the file ends). */

/* Each frame is multiplied by a constant of its own and the products summed: the
 * multiplications do not wait for each other (a chained hash costs 5 cycles a frame), and
 * the frames' order still matters.  The sum is then mixed (murmur3's finaliser). */
static uint64_t stack_id(const uintptr_t *f, int n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
    for (int i = 0; i < n; i++)
        h += (f[i] ^ ((uint64_t)i << 52)) * (0xff51afd7ed558ccdull + 2 * (uint64_t)i);
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h ? h : 1;
}

static int sset_has(const struct tstate *t, uint64_t id)
{
    if (!t->ss_cap)
        return 0;
    for (size_t i = id & (t->ss_cap - 1);; i = (i + 1) & (t->ss_cap - 1)) {
        if (t->ss[i] == id)
            return 1;
        if (!t->ss[i])
            return 0;
    }
}

static void sset_add(struct tstate *t, uint64_t id)
{
    if (2 * (t->ss_n + 1) > t->ss_cap) {
        size_t ncap = t->ss_cap ? 2 * t->ss_cap : 1024;
        uint64_t *a = mmap(NULL, ncap * sizeof *a, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a == MAP_FAILED)
            return;     /* the stack is written again next time: more bytes, still exact */
        for (size_t i = 0; i < t->ss_cap; i++)
            if (t->ss[i])
                for (size_t j = t->ss[i] & (ncap - 1);; j = (j + 1) & (ncap - 1))
                    if (!a[j]) {
                        a[j] = t->ss[i];
                        break;
                    }
        if (t->ss)
            munmap(t->ss, t->ss_cap * sizeof *t->ss);
        t->ss = a;
        t->ss_cap = ncap;
    }
    for (size_t i = id & (t->ss_cap - 1);; i = (i + 1) & (t->ss_cap - 1))
        if (!t->ss[i]) {
            t->ss[i] = id;
            t->ss_n++;
            return;
        }
}

static void sset_free(struct tstate *t)
{
    if (t->ss)
        munmap(t->ss, t->ss_cap * sizeof *t->ss);
    t->ss = NULL;
    t->ss_cap = t->ss_n = 0;
}

/* The file ended: none of its stacks is in the next one. */
static void sset_clear(struct tstate *t)
{
    if (t->ss_n)
        memset(t->ss, 0, t->ss_cap * sizeof *t->ss);
    t->ss_n = 0;
}

/* The frames of an allocation: f[0] the caller's return address, then its callers'.
 * MMLEAK_DEPTH=N: N frames.  Auto: through the runtime and the wrappers to the program's
 * first frame, and AUTO_CONTEXT more of its callers. */
#define AUTO_CONTEXT 4

/* A frame in a range an object was unloaded from carries the epoch in its top 16 bits: the
 * readers then take the object that was mapped there in that epoch (mmleak.ID.loads). */
static uintptr_t tagged(uintptr_t a, int cls)
{
    return cls & MML_SITE_VOLATILE ? a | (uintptr_t)(H->epoch & 0xffff) << 48 : a;
}

/* The frames f[1..] of an allocation from the walk bt[0..k-1] (bt[0] == f[0]'s address):
 * all of them for MMLEAK_DEPTH=N (want), else up to the program's first frame and
 * AUTO_CONTEXT more.  A frame is classified only when the answer matters: in auto mode until
 * the program's first frame, and, once something was unloaded, for its epoch tag.  *more: in
 * auto mode, the walk ended before it could tell (k frames were all it was asked for). */
static int pick_frames(const uintptr_t *bt, int k, uintptr_t *f, int want, int max, int *more)
{
    int n = 1, program_at = -1;
    int tag = mml_sites_unloaded();     /* not the epoch: attach and detach move it too */
    *more = 0;
    for (int j = 1; j < k && n < max; j++) {
        f[n] = (uintptr_t)bt[j];
        if (!tag && (want != 0 || program_at >= 0)) {
            n++;
            if (want == 0 && n > program_at + AUTO_CONTEXT)
                return n;
            continue;
        }
        int c = mml_site_class(f[n]);
        f[n] = tagged(f[n], c);
        if (want == 0 && program_at < 0 && !(c & MML_SITE_PASS))
            program_at = n;
        n++;
        if (want == 0 && program_at >= 0 && n > program_at + AUTO_CONTEXT)
            return n;
    }
    *more = want == 0 && k == max;
    return n;
}

/* The frames of an allocation in f (f[0] the caller's return address, then its callers'),
 * their count, and *id, the stack's id (0 for one frame).  MEMO: a walk whose stack words
 * are all as they were when the same walk was made before is not made again (mmleak-unwind.h:
 * the memo): then the count and the id come from the memo and *filled is 0 (f[1..] not
 * written). */
#define AUTO_FIRST 8    /* auto: frames walked first (the program's frame is usually there) */
static int capture(const void *ra, uintptr_t *f, uint64_t *id, int memo, int *filled)
{
    f[0] = (uintptr_t)ra;
    *id = 0;
    *filled = 1;
    int want = cfg.depth;
    int cls = want == 0 || mml_sites_unloaded() ? mml_site_class((uintptr_t)ra)
                                                : MML_SITE_PROGRAM;
    f[0] = tagged(f[0], cls);
    if (want == 1)
        return 1;
    if (want == 0 && !(cls & MML_SITE_PASS))
        return 1;
    /* mmleak-unwind.c: the frame-pointer chain of our own frames up to ra, then the cached
     * CFI rules of the program's frames (bt[0] == ra) */
    struct mml_start st;
    if (!mml_unwind_start(ra, &st))
        return 1;
    int nf;
    if (memo && mml_memo_get(&st, (unsigned)want, id, &nf)) {
        *filled = 0;
        return nf;
    }
    unsigned gen = mml_memo_gen();
    uintptr_t bt[MAXDEPTH];
    struct mml_trail tr;
    int max = want ? want : AUTO_FIRST, more;
    int k = mml_unwind_trail(&st, bt, max, &tr);
    nf = pick_frames(bt, k, f, want, max, &more);
    if (more) {                 /* auto: the program's frame is further up */
        k = mml_unwind_trail(&st, bt, MAXDEPTH, &tr);
        nf = pick_frames(bt, k, f, want, MAXDEPTH, &more);
    }
    if (nf > 1) {
        *id = stack_id(f, nf);
        mml_memo_put(&st, (unsigned)want, gen, &tr, nf, *id);
    }
    return nf;
}

COLD static void slow_alloc(void *p, size_t n, const void *ra)
{
    struct tstate *t = &T;
    if (slow_enter(t))
        return;
    GUARDED;
    if (g_state == 0)
        global_init();
    if (g_state < 0)
        return;
    if (unlikely(!H->alive))
        fork_child();   /* a copy made by a raw clone()/fork syscall: see struct hot */
    if (t->guard & GUARD_NEW)
        ra = new_caller(t, ra);
    uint64_t s = seq_next(p);
    time_t now = time(NULL) - g_t0;
    uintptr_t f[MAXDEPTH];
    uint64_t id;
    int filled;
    int nf = capture(ra, f, &id, 1, &filled);
    /* "#s ID FRAME..." when this file does not hold the stack yet, then the event line */
    char line[40 + 17 * MAXDEPTH + 96], *d = line;
    int def = nf > 1 && (!t->open || !sset_has(t, id));
    if (def && !filled)         /* the memo gave the id, the frames are needed now */
        nf = capture(ra, f, &id, 0, &filled);
    if (nf > 1 && !def && !(t->dead | t->dropping) && t->end - t->cur >= FAST_ROOM &&
        !((s | n | (uint64_t)now) >> 32) && !((uintptr_t)p >> 48) && now >= 0) {
        /* the common case with stacks: a stack this file holds, written like the fast path */
        unsigned ns = ndig((uint32_t)s), nn = ndig((uint32_t)n), nt = ndig((uint32_t)now);
        char *d = reserve(t, 12 + 1 + ns + 1 + nn + 1 + nt + 1 + 1 + 16 + 1);
        d = put_hex12(d, (uintptr_t)p);
        *d++ = ' ';
        d = put_hexv(d, (uint32_t)s, ns);
        *d++ = ' ';
        d = put_hexv(d, (uint32_t)n, nn);
        *d++ = ' ';
        d = put_hexv(d, (uint32_t)now, nt);
        *d++ = ' ';
        *d++ = '@';
        d = put_hex16(d, id);
        atomic_signal_fence(memory_order_release);
        *d = '\n';
        t->epoch = H->epoch;
        return;
    }
    if (def) {
        memcpy(d, "#s ", 3);
        d = hexw(d + 3, id, 16);    /* always 16 digits, as in the references */
        for (int i = 0; i < nf; i++) {
            *d++ = ' ';
            d = hexw(d, f[i] - 1, 1);   /* inside the call instruction: the calling line */
        }
        *d++ = '\n';
    }
    d = hexw(d, (uintptr_t)p, 12);
    *d++ = ' ';
    d = hexw(d, s, 1);
    *d++ = ' ';
    d = hexw(d, n, 1);
    *d++ = ' ';
    d = hexw(d, now < 0 ? 0 : (uint64_t)now, 1);
    *d++ = ' ';
    if (nf > 1) {
        *d++ = '@';
        d = hexw(d, id, 16);
    } else {
        d = hexw(d, f[0] - 1, 12);
    }
    *d++ = '\n';
    t->epoch = H->epoch;
    unsigned fileno = t->fileno;
    int was_open = t->open;
    if (emit(line, (size_t)(d - line)) && def && was_open && t->open && t->fileno == fileno)
        sset_add(t, id);
}

COLD static void slow_free(void *p, uint64_t s, const void *ra)
{
    struct tstate *t = &T;
    if (slow_enter(t))
        return;
    GUARDED;
    if (g_state == 0)
        global_init();
    if (g_state < 0)
        return;
    if (unlikely(!H->alive))
        fork_child();
    char line[64], *d = line;
    d = hexw(d, (uintptr_t)p, 12);
    *d++ = ' ';
    d = hexw(d, s, 1);
    *d++ = ' ';
    d = hexw(d, (uintptr_t)ra - 1, 12);
    *d++ = '\n';
    t->epoch = H->epoch;
    emit_free(line, (size_t)(d - line));
}

/* A free takes its number before the real free: after it, another thread may already own the
 * address again. */
HOT_INLINE void note_free(void *p, const void *ra)
{
    rec_free(p, seq_next(p), ra);
}

/* pthread key destructor: the thread is exiting.  Other libraries' destructors run in the
 * same rounds and may still free memory, so we re-arm our key and only give the file up in
 * the last round, parked for the next thread.  Events after that go to the late file. */
static void thread_exit(void *arg)
{
    struct tstate *t = arg;
    if (t != &T)
        return;
    if (++t->exit_rounds < PTHREAD_DESTRUCTOR_ITERATIONS && g_key_ok) {
        pthread_setspecific(g_key, t);
        return;
    }
    INFLIGHT;
    if (g_state != 1 || t->trace_gen != g_trace_gen) {
        thread_reset(t);
        t->dead = 1;
        return;
    }
    GUARDED;
    if (t->open) {
        maps_snapshot(0);
        park(t);
    }
    if (t->lost) {
        atomic_fetch_add(&g_lost_orphan, t->lost);
        t->lost = 0;
    }
    t->dropping = 0;
    t->dead = 1;
    t->cur = t->end = NULL;
}

/* In the child of fork (glibc's, through our atfork handler, or a raw clone()/fork syscall,
 * found by the wiped page): the staging areas we inherited are the parent's files.  Unmap them
 * (the parent keeps writing them) and start a trace of our own under the child's pid. */
static void fork_child(void)
{
    if (H->alive && g_pid == getpid())
        return;     /* done already: the raw-fork check ran before the atfork handler */
    pthread_mutex_init(&g_lock, NULL);
    g_closing = 0;      /* the threads inside dlclose() are not in the child */
    mml_sites_after_fork();
    mml_unwind_fork_child();
    int saved = errno;
    T.guard++;
    for (size_t i = 0; i < R.n; i++)
        if (R.a[i].state != SLOT_FREE && (int)i + 1 != T.slot && R.a[i].stage)
            munmap(R.a[i].stage, 2 * R.a[i].half_size); /* those threads are not in the child */
    R.n = 0;
    T.slot = 0;
    sset_clear(&T);
    stage_drop(&T);
    hold_free(&T);          /* the parent's lines, in a copy */
    atomic_store(&g_hold_total, 0);
    T.holding = 0;
    T.open = 0;
    T.late = 0;
    T.dropping = 0;
    T.lost = 0;
    g_late_file = ~0u;
    atomic_store(&g_lost_orphan, 0);
    atomic_store(&g_said_write, 0);
    if (g_state == 1)
        process_start(NULL);
    else
        g_pid = getpid();   /* paused (or dormant): so stays the child, writing nothing */
    T.guard--;
    errno = saved;
}


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
    /* Loaded with dlopen (mmleak.py attach, before it calls mmleak_attach): our allocation
     * functions are not the process's, there is nothing to trace yet. */
    if (!preloaded()) {
        g_state = -1;
        g_once_done = 1;
        set_status();           /* "dormant": until mmleak_attach */
        T.guard--;
        errno = saved;
        return;
    }
    global_init();
    T.guard--;
    errno = saved;
}

/* The log of loads is made with the trace id (reserve_id); a trace that never unloaded
 * anything ends without it, as it always did.  (Removed by name: if ours was removed and
 * another user's file put at the name, that one goes, which harms nobody.) */
static void loads_drop_unused(void)
{
    char name[64];
    pthread_mutex_lock(&g_lock);
    if (!g_loads_used)
        d_unlink(file_name(name, sizeof name, ".loads"));
    g_loads_used = 1;       /* gone: never written again */
    pthread_mutex_unlock(&g_lock);
}

/* Process exit, _exit, exec: close the parked files and the calling thread's.  Events lost
 * where no file could say so are counted in the calling thread's file, or in the late file.
 * FINAL: the process ends (not an exec, which may fail). */
static void leave_files(int final)
{
    maps_snapshot(0);
    close_parked();
    T.lost += atomic_exchange(&g_lost_orphan, 0);
    if (T.open) {
        file_close(&T, 1);  /* its trailer says how many were lost */
        T.late = 1;
    }
    if (final)
        loads_drop_unused();
    T.lost += atomic_exchange(&g_lost_orphan, 0);
    if (T.lost) {
        char line[64];
        size_t n = lost_line(line, sizeof line, T.lost, 0);
        T.lost = 0;
        late_shared(line, n);
    }
}

__attribute__((destructor)) static void mmleak_fini(void)
{
    /* not in a vfork() child (other pid, the parent's memory): the files are the parent's */
    if (g_state != 1 || g_pid != getpid() || IN_OWN_CODE(&T))
        return;
    int saved = errno;
    T.guard++;
    leave_files(1);
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

/* At the top of every allocating entry point: the real allocator found (before that, the
 * boot arena serves); and with stacks of a fixed depth, this call's memo record starts coming
 * into the cache now, so that the lookup after the real allocator finds it there
 * (mmleak-unwind.h: the memo).  A macro: both need the entry point's own frame. */
#define ENSURE_REAL(n, zero)                                                                  \
    do {                                                                                      \
        if (unlikely(!real.malloc)) {                                                         \
            void *bp_ = boot_or_resolve((n), (zero));                                         \
            if (!real.malloc)                                                                 \
                return bp_;                                                                   \
        }                                                                                     \
        if (H->memo)                                                                          \
            MML_MEMO_PREFETCH(__builtin_return_address(0));                                   \
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
    return noted(al_calloc(k, n, total), total, __builtin_return_address(0));
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
    return noted(al_alloc(al, n), n, __builtin_return_address(0));
}

EXPORT int posix_memalign(void **out, size_t al, size_t n)
{
    if (unlikely(!real.malloc)) {
        boot_or_resolve(0, 0);
        if (!real.malloc)
            return ENOMEM;
    }
    int rc;
    if (real.posix_memalign) {
        rc = real.posix_memalign(out, al, n);
    } else if (al < sizeof(void *) || (al & (al - 1))) {
        rc = EINVAL;
    } else {
        int saved = errno;
        void *p = al_alloc(al, n);
        rc = p ? 0 : ENOMEM;
        if (p)
            *out = p;
        errno = saved;
    }
    if (rc == 0 && *out)
        rec_alloc(*out, n, __builtin_return_address(0));
    return rc;
}

EXPORT void *aligned_alloc(size_t al, size_t n)
{
    ENSURE_REAL(n + al, 0);
    return noted(real.aligned_alloc ? real.aligned_alloc(al, n) : al_alloc(al, n), n,
                 __builtin_return_address(0));
}

EXPORT void *valloc(size_t n)
{
    ENSURE_REAL(n + 4096, 0);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return noted(real.valloc ? real.valloc(n) : al_alloc(pg, n), n, __builtin_return_address(0));
}

EXPORT void *pvalloc(size_t n)
{
    ENSURE_REAL(n + 4096, 0);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if (!real.pvalloc && n > SIZE_MAX - pg) {
        errno = ENOMEM;
        return NULL;
    }
    return noted(real.pvalloc ? real.pvalloc(n) : al_alloc(pg, (n + pg - 1) / pg * pg), n,
                 __builtin_return_address(0));
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
    int tracing = g_state == 1 && g_pid == getpid() && !IN_OWN_CODE(&T);
    if (tracing) {
        GUARDED;
        pthread_mutex_lock(&g_lock);
        g_loads_on = 1;     /* the first one writes every mapping seen so far, as "+0" */
        pthread_mutex_unlock(&g_lock);
        maps_snapshot(1);
        /* the object's range: code there may belong to another object from now on */
        struct link_map *lm = NULL;
        struct dl_find_object fo;
        if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_ld &&
            _dl_find_object(lm->l_ld, &fo) == 0)
        {
            mml_sites_unloading((uintptr_t)fo.dlfo_map_start, (uintptr_t)fo.dlfo_map_end);
            mml_got_forget_object((uintptr_t)fo.dlfo_map_start, (uintptr_t)fo.dlfo_map_end);
        }
        pthread_mutex_lock(&g_lock);
        g_closing++;
        pthread_mutex_unlock(&g_lock);
    }
    mml_unwind_dlclose_begin();
    int rc = real.dlclose(h);
    mml_unwind_dlclose_end();   /* no cached rule of the unloaded code survives */
    if (tracing) {
        GUARDED;
        pthread_mutex_lock(&g_lock);    /* one step for loads_log_locked: the epoch and */
        atomic_fetch_add(&g_epoch, 1);  /* whether a dlclose() is still running */
        g_closing--;
        pthread_mutex_unlock(&g_lock);
        mml_sites_forget();   /* other code may come at the same addresses */
        arm_hot();            /* every thread notices the new epoch on its next event */
    }
    return rc;
}

/* ---- _exit and exec: no destructor runs, so flush the calling thread's file first ----
 * Nothing would be lost without this (the staging file keeps the lines and the readers merge
 * it), but the directory stays tidy: a finished thread has one .out file and no .tail.  In a
 * vfork() child the pid differs from ours and nothing is touched: the memory is the parent's. */

COLD static void flush_before_leaving(int final)
{
    if (g_state != 1 || g_pid != getpid() || IN_OWN_CODE(&T))
        return;
    GUARDED;
    leave_files(final);
}

static void *next_fn(const char *name)
{
    /* loaded with dlopen, mmleak.so is not in the global scope: RTLD_NEXT means nothing */
    void *f = g_attached ? mml_find_definition(name) : sym(name);
    if (!f)
        abort();
    return f;
}

EXPORT __attribute__((noreturn)) void _exit(int status)
{
    static void (*real_exit)(int);
    flush_before_leaving(1);
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
        flush_before_leaving(0);                                                              \
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

/* Hand one file to UID: by its descriptor, and only if the name is still the file we made
 * (a name freed meanwhile may be a hard link to anybody's file: chown by name would give
 * that file away). */
static void give_one(const char *name, const struct fid *id, uid_t uid)
{
    int fd = open_again(name, O_RDONLY, id);
    if (fd < 0)
        return;             /* gone, or not ours: nothing to do */
    if (fchown(fd, uid, (gid_t)-1)) { /* then it stays root's: flushes as UID will fail */ }
    close(fd);
}

COLD static void give_files_to(uid_t uid)
{
    if (uid == (uid_t)-1 || uid == 0 || g_state != 1 || g_pid != getpid() || geteuid() != 0 ||
        IN_OWN_CODE(&T))
        return;
    GUARDED;
    char name[64];
    /* Under g_lock, which every creation of a file of ours holds too: a file another thread
     * creates from now on is handed over at once (create_locked), none slips between. */
    pthread_mutex_lock(&g_lock);
    g_give_uid = uid;
    for (size_t i = 0; i < R.n; i++)
        if (R.a[i].state != SLOT_FREE) {
            give_one(dump_name(name, sizeof name, R.a[i].fileno), &R.a[i].out_id, uid);
            give_one(side_name(name, sizeof name, R.a[i].fileno, ".tail"), &R.a[i].tail_id, uid);
        }
    if (g_late_file != ~0u)
        give_one(dump_name(name, sizeof name, g_late_file), &g_late_id, uid);
    give_one(file_name(name, sizeof name, ".maps"), &g_maps_id, uid);
    give_one(file_name(name, sizeof name, ".loads"), &g_loads_id, uid);
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

/* ---- chroot: the dump directory may be out of reach by name afterwards ----
 * So we keep a descriptor of it (and of /proc, for the maps), and name our files relative to
 * it from then on, checking before each use that it is still the same directory (see dir_fd).
 * This is the one descriptor mmleak keeps open, and only in a process that called chroot(). */
COLD static void hold_dir(void)
{
    if (g_state <= 0 || g_pid != getpid() || IN_OWN_CODE(&T))
        return;
    GUARDED;
    pthread_mutex_lock(&g_lock);
    if (g_dirfd < 0) {
        int fd = open(cfg.dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0) {
            g_dir_dev = st.st_dev;
            g_dir_ino = st.st_ino;
            g_dirfd = fd;
        } else if (fd >= 0) {
            close(fd);
        }
    }
    if (g_procfd < 0)
        g_procfd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
    pthread_mutex_unlock(&g_lock);
}

EXPORT int chroot(const char *path)
{
    static int (*real_fn)(const char *);
    hold_dir();
    if (!real_fn)
        real_fn = (int (*)(const char *))next_fn("chroot");
    return real_fn(path);
}

/* ---- C++: operator new and delete in all forms, with the user's code as the caller ----
 * The common case is malloc (or memalign) plus a record.  Only when that fails do we call
 * the real operator (resolved then), with the guard held, so new_handler, std::bad_alloc
 * and nothrow semantics are exactly libstdc++'s. */

/* The real operators' code ranges: an allocation made from inside one of them, while a failing
 * operator new of ours runs it, is the user's `new` and gets the user's line. */
static struct { uintptr_t lo, hi; } g_newfn[4];

/* The C++ runtime's operator NAME (libstdc++'s: the object that defines std::get_new_handler),
 * never an allocator's: jemalloc, tcmalloc and mimalloc define operator new too, and theirs
 * allocate inside themselves, out of our sight (the block a retry after the new_handler gets
 * would not be recorded).  The runtime's calls malloc, aligned_alloc and, in the nothrow
 * forms, the throwing operator through the PLT: all of them come back to us. */
static void *new_op(const char *name, int i)
{
    void *f = NULL;
    Dl_info di;
    void *gnh = dlsym(RTLD_DEFAULT, "_ZSt15get_new_handlerv");
    if (gnh && dladdr(gnh, &di) && di.dli_fname) {
        void *h = dlopen(di.dli_fname[0] ? di.dli_fname : NULL, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            f = same_object(dlsym(h, name), di.dli_fbase);
            if (real.dlclose)
                real.dlclose(h);    /* ours would count an unload that is not one */
        }
    }
    if (!f)
        f = sym(name);
    const ElfW(Sym) *es = NULL;
    if (f && dladdr1(f, &di, (void **)&es, RTLD_DL_SYMENT) && es && es->st_size) {
        g_newfn[i].lo = (uintptr_t)f;
        g_newfn[i].hi = (uintptr_t)f + es->st_size;
    }
    return f;
}

static const void *new_caller(const struct tstate *t, const void *ra)
{
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ra - g_newfn[i].lo < g_newfn[i].hi - g_newfn[i].lo)
            return t->new_ra;
    return ra;
}

struct new_scope { struct tstate *t; int had; const void *ra; };

static void new_leave(struct new_scope *s)
{
    if (!s->had)
        s->t->guard &= ~GUARD_NEW;
    s->t->new_ra = s->ra;
}

/* malloc failed under operator new: libstdc++'s operator (see new_op) runs the new_handler loop
 * and throws std::bad_alloc, exactly as without us.  It runs with tracing on: its own malloc call comes
 * back to our malloc (recorded there, with the user's line: GUARD_NEW), the handler's
 * allocations and the exception object are recorded as what they are. */
COLD static void *new_failed(size_t n, size_t al, int nothrow, const void *ra)
{
    if (!real.new_) {
        GUARDED;        /* what dlopen allocates is ours, not the program's */
        real.new_al_nothrow = new_op("_ZnwmSt11align_val_tRKSt9nothrow_t", 3);
        real.new_al = new_op("_ZnwmSt11align_val_t", 2);
        real.new_nothrow = new_op("_ZnwmRKSt9nothrow_t", 1);
        real.new_ = new_op("_Znwm", 0);
    }
    static const char nothrow_tag = 0; /* std::nothrow_t is an empty struct */
    struct tstate *t = &T;
    struct new_scope sc __attribute__((cleanup(new_leave))) = { t, t->guard & GUARD_NEW, t->new_ra };
    /* nested: the runtime's nothrow operator calls the throwing one, which failed too; the
     * block is still the user's `new` */
    t->new_ra = sc.had ? new_caller(t, ra) : ra;
    t->guard |= GUARD_NEW;  /* cleared by new_leave, also when the operator throws */
    if (al) {
        if (nothrow ? !real.new_al_nothrow : !real.new_al)
            abort();
        return nothrow ? real.new_al_nothrow(n, al, &nothrow_tag) : real.new_al(n, al);
    }
    if (nothrow ? !real.new_nothrow : !real.new_)
        abort();
    return nothrow ? real.new_nothrow(n, &nothrow_tag) : real.new_(n);
}

HOT_INLINE void *op_new(size_t n, size_t al, int nothrow, const void *ra)
{
    if (unlikely(!real.malloc))
        resolve();
    if (H->memo)    /* see ENSURE_REAL: inlined into the entry point, this is its frame */
        MML_MEMO_PREFETCH(ra);
    void *p = al ? al_alloc(al, n ? n : 1) : real.malloc(n ? n : 1);
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

/* ---------------------------------------------------------------------------------------
 * 5. Attach and detach: tracing a running process, pausing a preloaded one
 *
 * mmleak.py attach PID loads mmleak.so into the process (mmleak-inject.c, through ptrace)
 * and calls mmleak_attach; mmleak.py detach calls mmleak_detach.  Both switch the GOT slots
 * of every module (mmleak-got.c): towards mmleak's functions, or back to the allocator's.
 * A preloaded process is paused and resumed the same way (its slots then point past
 * mmleak, so a paused process pays nothing), and MMLEAK_PAUSED=1 starts it paused.
 * ------------------------------------------------------------------------------------- */

/* our functions, under names the dynamic linker cannot rebind */
#define OWN(f) extern __typeof(f) own_##f __attribute__((alias(#f), visibility("hidden"), copy(f)));
OWN(malloc) OWN(free) OWN(calloc) OWN(realloc) OWN(reallocarray) OWN(memalign)
OWN(posix_memalign) OWN(aligned_alloc) OWN(valloc) OWN(pvalloc) OWN(strdup) OWN(__strdup)
OWN(strndup) OWN(__strndup) OWN(dlclose) OWN(_exit) OWN(_Exit) OWN(execve) OWN(execv)
OWN(execvp) OWN(execvpe) OWN(fexecve) OWN(execl) OWN(execlp) OWN(execle) OWN(setuid)
OWN(seteuid) OWN(setreuid) OWN(setresuid) OWN(chroot)
#define OWN_CXX(m, ret, params)                                                               \
    extern ret own_##m params __attribute__((alias(#m), visibility("hidden")));
OWN_CXX(_Znwm, void *, (size_t)) OWN_CXX(_Znam, void *, (size_t))
OWN_CXX(_ZnwmRKSt9nothrow_t, void *, (size_t, const void *))
OWN_CXX(_ZnamRKSt9nothrow_t, void *, (size_t, const void *))
OWN_CXX(_ZnwmSt11align_val_t, void *, (size_t, size_t))
OWN_CXX(_ZnamSt11align_val_t, void *, (size_t, size_t))
OWN_CXX(_ZnwmSt11align_val_tRKSt9nothrow_t, void *, (size_t, size_t, const void *))
OWN_CXX(_ZnamSt11align_val_tRKSt9nothrow_t, void *, (size_t, size_t, const void *))
OWN_CXX(_ZdlPv, void, (void *)) OWN_CXX(_ZdaPv, void, (void *))
OWN_CXX(_ZdlPvm, void, (void *, size_t)) OWN_CXX(_ZdaPvm, void, (void *, size_t))
OWN_CXX(_ZdlPvRKSt9nothrow_t, void, (void *, const void *))
OWN_CXX(_ZdaPvRKSt9nothrow_t, void, (void *, const void *))
OWN_CXX(_ZdlPvSt11align_val_t, void, (void *, size_t))
OWN_CXX(_ZdaPvSt11align_val_t, void, (void *, size_t))
OWN_CXX(_ZdlPvmSt11align_val_t, void, (void *, size_t, size_t))
OWN_CXX(_ZdaPvmSt11align_val_t, void, (void *, size_t, size_t))
OWN_CXX(_ZdlPvSt11align_val_tRKSt9nothrow_t, void, (void *, size_t, const void *))
OWN_CXX(_ZdaPvSt11align_val_tRKSt9nothrow_t, void, (void *, size_t, const void *))

/* dlopen, when loaded into a running process: the objects it loads get their slots at once.
 * glibc takes the caller's search path (its RUNPATH) from the return address, so a call from
 * an object that has one is passed on by a jump, keeping its return address; those objects
 * are switched at the next flush (maps_snapshot). */
void *attach_dlopen_entry(const char *file, int mode);
__attribute__((visibility("hidden"))) void *(*mml_real_dlopen)(const char *, int);
__attribute__((visibility("hidden"))) int mml_dlopen_keep_caller(const void *ra, const char *file);
__attribute__((visibility("hidden"))) void *mml_dlopen_here(const char *file, int mode);
__asm__(".text\n"
        ".p2align 4\n"
        ".type attach_dlopen_entry,@function\n"
        "attach_dlopen_entry:\n"
        "    endbr64\n"
        "    push %rdi\n"
        "    push %rsi\n"
        "    sub $8, %rsp\n"
        "    mov 24(%rsp), %rdi\n"          /* the caller's return address */
        "    mov 16(%rsp), %rsi\n"          /* file */
        "    call mml_dlopen_keep_caller\n"
        "    add $8, %rsp\n"
        "    pop %rsi\n"
        "    pop %rdi\n"
        "    test %eax, %eax\n"
        "    jnz 1f\n"
        "    jmp mml_dlopen_here\n"
        "1:  jmp *mml_real_dlopen(%rip)\n"
        ".size attach_dlopen_entry, .-attach_dlopen_entry\n");

int mml_dlopen_keep_caller(const void *ra, const char *file)
{
    if (!file || strchr(file, '/'))
        return 0;               /* a path, or the program itself: the caller does not matter */
    struct dl_find_object fo;
    if (_dl_find_object((void *)ra, &fo) != 0 || !fo.dlfo_link_map)
        return 1;
    for (const ElfW(Dyn) *d = fo.dlfo_link_map->l_ld; d && d->d_tag != DT_NULL; d++)
        if (d->d_tag == DT_RPATH || d->d_tag == DT_RUNPATH)
            return 1;
    return 0;
}

void *mml_dlopen_here(const char *file, int mode)
{
    void *h = mml_real_dlopen(file, mode);
    if (h && g_state == 1 && !IN_OWN_CODE(&T)) {
        GUARDED;
        mml_got_new_objects();
    }
    return h;
}

#define HOOK(n, real_ptr, is_free) { #n, (void *)own_##n, (void *const *)(real_ptr), is_free, 0 }
static void *hook_real[64];
static struct mml_hook hooks[] = {
    HOOK(free, &real.free, 1), HOOK(realloc, &real.realloc, 1),
    HOOK(reallocarray, &hook_real[0], 1),
    HOOK(_ZdlPv, &hook_real[1], 1), HOOK(_ZdaPv, &hook_real[2], 1),
    HOOK(_ZdlPvm, &hook_real[3], 1), HOOK(_ZdaPvm, &hook_real[4], 1),
    HOOK(_ZdlPvRKSt9nothrow_t, &hook_real[5], 1), HOOK(_ZdaPvRKSt9nothrow_t, &hook_real[6], 1),
    HOOK(_ZdlPvSt11align_val_t, &hook_real[7], 1), HOOK(_ZdaPvSt11align_val_t, &hook_real[8], 1),
    HOOK(_ZdlPvmSt11align_val_t, &hook_real[9], 1), HOOK(_ZdaPvmSt11align_val_t, &hook_real[10], 1),
    HOOK(_ZdlPvSt11align_val_tRKSt9nothrow_t, &hook_real[11], 1),
    HOOK(_ZdaPvSt11align_val_tRKSt9nothrow_t, &hook_real[12], 1),
    HOOK(malloc, &real.malloc, 0), HOOK(calloc, &real.calloc, 0),
    HOOK(memalign, &real.memalign, 0), HOOK(posix_memalign, &real.posix_memalign, 0),
    HOOK(aligned_alloc, &real.aligned_alloc, 0), HOOK(valloc, &real.valloc, 0),
    HOOK(pvalloc, &real.pvalloc, 0), HOOK(strdup, &hook_real[13], 0),
    HOOK(__strdup, &hook_real[14], 0), HOOK(strndup, &hook_real[15], 0),
    HOOK(__strndup, &hook_real[16], 0),
    HOOK(_Znwm, &hook_real[17], 0), HOOK(_Znam, &hook_real[18], 0),
    HOOK(_ZnwmRKSt9nothrow_t, &hook_real[19], 0), HOOK(_ZnamRKSt9nothrow_t, &hook_real[20], 0),
    HOOK(_ZnwmSt11align_val_t, &hook_real[21], 0), HOOK(_ZnamSt11align_val_t, &hook_real[22], 0),
    HOOK(_ZnwmSt11align_val_tRKSt9nothrow_t, &hook_real[23], 0),
    HOOK(_ZnamSt11align_val_tRKSt9nothrow_t, &hook_real[24], 0),
    HOOK(dlclose, &real.dlclose, 0), HOOK(_exit, &hook_real[25], 0),
    HOOK(_Exit, &hook_real[26], 0), HOOK(execve, &hook_real[27], 0),
    HOOK(execv, &hook_real[28], 0), HOOK(execvp, &hook_real[29], 0),
    HOOK(execvpe, &hook_real[30], 0), HOOK(fexecve, &hook_real[31], 0),
    HOOK(execl, &hook_real[32], 0), HOOK(execlp, &hook_real[33], 0),
    HOOK(execle, &hook_real[34], 0), HOOK(setuid, &hook_real[35], 0),
    HOOK(seteuid, &hook_real[36], 0), HOOK(setreuid, &hook_real[37], 0),
    HOOK(setresuid, &hook_real[38], 0), HOOK(chroot, &hook_real[39], 0),
    { "dlopen", (void *)attach_dlopen_entry, (void *const *)&mml_real_dlopen, 0, 1 },
};

/* The function each hooked name reaches without mmleak: the next definition after mmleak.so
 * when preloaded, the process's own when loaded into it. */
static void hooks_init(void)
{
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
        void **r = (void **)hooks[i].real;
        if (r >= hook_real && r < hook_real + sizeof hook_real / sizeof hook_real[0])
            *r = g_attached ? mml_find_definition(hooks[i].name) : sym(hooks[i].name);
    }
    if (g_attached)
        mml_real_dlopen = mml_find_definition("dlopen");
    mml_got_init(hooks, (int)(sizeof hooks / sizeof hooks[0]), (void *)mmleak_own_malloc,
                 g_attached, real.dlclose);
}

/* ---- closing a thread's file from another thread (detach) ----
 * The owner may be anywhere (its GOT slots no longer lead here): what its staging mapping
 * holds beyond .out is appended, complete lines only, as readers would (mmleak.py's
 * unflushed_tail), then "#end"; the mapping is replaced by anonymous memory, so a write the
 * owner was in the middle of lands harmlessly, and unmapped one cycle later. */
static struct { void *p; size_t len; unsigned cycle; } g_retired[256];
static unsigned g_nretired, g_cycle;

static void retire(void *p, size_t len)
{
    mmap(p, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g_nretired < sizeof g_retired / sizeof g_retired[0])
        g_retired[g_nretired++] = (typeof(g_retired[0])){ p, len, g_cycle };
}

static void unmap_retired(void)
{
    unsigned k = 0;
    for (unsigned i = 0; i < g_nretired; i++) {
        if (g_retired[i].cycle + 2 <= g_cycle)
            munmap(g_retired[i].p, g_retired[i].len);
        else
            g_retired[k++] = g_retired[i];
    }
    g_nretired = k;
}

static void close_from_outside(const struct slot *s)
{
    char name[64];
    int fd = open_again(dump_name(name, sizeof name, s->fileno), O_RDWR, &s->out_id);
    if (fd >= 0) {
        struct stat st;
        uint64_t have = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
        int kept = 0;
        struct { uint64_t off; const char *body; size_t n; } h[2];
        for (int i = 0; i < 2; i++) {
            const char *b = s->stage + (size_t)i * s->half_size;
            const char *e;
            h[i].off = memcmp(b, "#at ", 4) == 0 ? parse_hex(b + 4, &e) : UINT64_MAX;
            h[i].body = b + HALF_HDR;
            const char *nul = memchr(h[i].body, 0, s->half_size - HALF_HDR);
            size_t n = nul ? (size_t)(nul - h[i].body) : s->half_size - HALF_HDR;
            while (n && h[i].body[n - 1] != '\n')
                n--;                    /* a line being written: not kept */
            h[i].n = n;
        }
        for (int k = 0; k < 2; k++) {
            int i = (h[0].off <= h[1].off) ? k : 1 - k;
            if (h[i].off == UINT64_MAX || h[i].off + h[i].n <= have)
                continue;
            uint64_t skip = have > h[i].off ? have - h[i].off : 0;
            if (have + h[i].n - skip <= fsize_limit() &&     /* else SIGXFSZ: keep the .tail */
                pwrite(fd, h[i].body + skip, h[i].n - skip, (off_t)have) ==
                (ssize_t)(h[i].n - skip))
                have = h[i].off + h[i].n;
            else
                kept = 1;       /* readers take those lines from the .tail */
        }
        if (!kept && have + 5 <= fsize_limit() && pwrite(fd, "#end\n", 5, (off_t)have) == 5) {
            d_unlink(side_name(name, sizeof name, s->fileno, ".tail"));
        }
        close(fd);
    }
    retire(s->stage, 2 * s->half_size);
}

static int lock_briefly(void)
{
    /* the thread mmleak.py borrowed may have been stopped inside mmleak's own cold path,
     * holding the lock: never wait for ourselves */
    for (int i = 0; i < 200; i++) {
        if (pthread_mutex_trylock(&g_lock) == 0)
            return 0;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* Start tracing (a new trace, new files).  ARGS: "MMLEAK_DIR=...\nMMLEAK_DEPTH=...\n".
 * 0: started; 1: already tracing; 2: tracing cannot start (said why on stderr and in the
 * returned status); 3: busy, try again. */
EXPORT int mmleak_attach(const char *args)
{
    if (g_state == 1)
        return 1;
    struct tstate *t = &T;
    if (IN_OWN_CODE(t))
        return 3;
    GUARDED;
    if (!real.malloc)
        resolve();
    if (lock_briefly())
        return 3;
    int first = g_state == -1 && !g_attached && !g_key_ok;   /* loaded by dlopen, dormant */
    if (first) {
        g_attached = 1;
        resolve_from(RTLD_DEFAULT);
        /* functions the allocator lacks are made from its own (see resolve_from) */
        void *m = mml_find_definition("malloc");
        if (m)
            real.malloc = m;
        void *f = mml_find_definition("free");
        if (f)
            real.free = f;
        void *r = mml_find_definition("realloc");
        if (r)
            real.realloc = r;
        real.dlclose = mml_find_definition("dlclose");
    }
    if (args) {
        size_t n = my_strlen(args);
        if (n >= sizeof g_args)
            n = sizeof g_args - 1;
        memcpy(g_args, args, n);
        g_args[n] = 0;
        g_from_args = 1;
    }
    note_stderr();              /* the process's stderr now: its journal, say */
    int bad = read_config();
    g_from_args = 0;
    if (bad) {
        pthread_mutex_unlock(&g_lock);
        return 2;
    }
    if (first) {
        read_cmdline();
        Dl_info di;
        if (dladdr((void *)real.malloc, &di) && di.dli_fname)
            escape_into(g_alloc, g_alloc + sizeof g_alloc, (const unsigned char *)di.dli_fname,
                        my_strlen(di.dli_fname), 0);
        if (!pthread_key_create(&g_key, thread_exit))
            g_key_ok = 1;
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        hooks_init();
    }
    g_trace_gen++;
    g_cycle++;
    unmap_retired();
    R.n = 0;
    g_late_file = ~0u;
    atomic_store(&g_said_write, 0);
    g_window = 1;
    process_start(NULL);        /* a new trace id: pid, or pid-K after an earlier one */
    if (g_state != 1) {
        pthread_mutex_unlock(&g_lock);
        return 2;
    }
    atomic_fetch_add(&g_epoch, 1);  /* every thread's next event resets its stale state */
    arm_hot();
    pthread_mutex_unlock(&g_lock);
    mml_got_switch(1);
    unsigned long long c[2] = { 0, 0 };
    dl_iterate_phdr(phdr_counts, c);
    g_got_adds = c[0];
    return 0;
}

/* Stop tracing: the slots back to the allocator, every file flushed and closed.  0: done;
 * 1: not tracing; 3: busy, try again; 4: paused, but a thread stayed in mmleak's slow path
 * for a second: its files were left as they are (readers and `mmleak.py recover` take
 * them). */
EXPORT int mmleak_detach(const char *args)
{
    (void)args;
    if (g_state != 1)
        return 1;
    struct tstate *t = &T;
    if (IN_OWN_CODE(t))
        return 3;
    GUARDED;
    mml_got_switch(0);
    /* calls already inside mmleak finish now; later ones (through a pointer stored while
     * tracing) see the pause and only pass through */
    g_state = 2;
    set_status();
    atomic_fetch_add(&g_epoch, 1);
    H->epoch = atomic_load(&g_epoch);
    H->fast = 0;
    /* a thread inside a slow path finishes it (and sees the pause at its next event) */
    for (int i = 0; atomic_load(&g_inflight) > 0; i++) {
        if (i == 2000)
            return 4;   /* paused; the files stay as they are, readers take them */
        struct timespec ts = { 0, 500000 };
        nanosleep(&ts, NULL);
    }
    maps_snapshot(0);
    if (lock_briefly())
        return 3;       /* paused already; the files stay as they are (readers take them) */
    g_cycle++;
    for (size_t i = 0; i < R.n; i++) {
        struct slot *s = &R.a[i];
        if (s->state == SLOT_PARKED) {
            struct tstate tmp;
            memset(&tmp, 0, sizeof tmp);
            tmp.slot = (int)i + 1;
            tmp.fileno = s->fileno;
            tmp.out_id = s->out_id;
            tmp.tail_id = s->tail_id;
            tmp.stage = s->stage;
            tmp.half_size = s->half_size;
            tmp.out_off = s->out_off;
            half_start(&tmp, 0);
            tmp.open = 1;
            s->state = SLOT_OPEN;
            pthread_mutex_unlock(&g_lock);
            file_close(&tmp, 1);
            if (lock_briefly())
                return 3;
        } else if (s->state == SLOT_OPEN && s->stage) {
            close_from_outside(s);
            s->state = SLOT_FREE;
        }
    }
    R.n = 0;
    g_trace_gen++;              /* every thread forgets its file at its next event */
    thread_reset(t);
    set_status();
    pthread_mutex_unlock(&g_lock);
    loads_drop_unused();
    return 0;
}

/* What mmleak.py and mmleak-install.py status show: "tracing ID", "paused", "dormant". */
EXPORT const char *mmleak_state(void)
{
    static char out[64];
    char *e = out + sizeof out, *d = out;
    if (g_state == 1) {
        d = cat(d, e, "tracing ");
        cat(d, e, g_id);
    } else {
        cat(d, e, g_state == 2 ? "paused" : g_state == 0 ? "starting" : "dormant");
    }
    return out;
}
