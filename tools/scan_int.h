/* tools/scan_int.h: the state of one reachability scan, shared by the files of the scan
 * (tools/scan.c, the course of a scan, lists them) and tools/scan_result.c (its result
 * file, specified in mmleak-format(5), "The scan result"), and the functions one of them
 * calls in another.  Not an interface of mmleak-tools.so: tools/scan.c's mmleak_scan is. */
#ifndef MMLEAK_SCAN_INT_H
#define MMLEAK_SCAN_INT_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/user.h>

#include "scan_park.h"
#include "scan_roots.h"
#include "scan_names.h"

enum { DEFINITE = 0, INDIRECT = 1, POSSIBLE = 2, REACHABLE = 3, UNREACHED = 4 };
extern const char *const KIND_NAME[4];        /* the result file's names (scan_result.c) */
/* what the roots were (the "#roots" lines), and what was left out ("#excluded") */
enum { R_OBJECT, R_ANON, R_STACK, R_REGISTER, R_TLS, R_UNTRACED, R_FILE, R_KINDS };
extern const char *const ROOT_NAME[R_KINDS];


struct thr { int tid, sig, stopped, naps; struct user_regs_struct regs; };

/* a file of the cut: its path, size, the .tail lines past it, and its descriptor, opened
 * (and checked for type and owner) when the cut was taken and held until it is read: the
 * file the cut listed, whatever a compaction pass renames or deletes meanwhile */
struct cutf { char *path; uint64_t size; char *tail; size_t tlen; int compact, ended;
              int rank; uint64_t num; int fd; };
struct mapping { uint64_t lo, hi, off; char perm[5]; int heap; const char *path; };
/* pages [page, page + npages) hold blocks first .. (see page_index); tab: for each page,
 * the number of blocks that start before its end */
struct region { uint64_t page; size_t npages, first; uint32_t *tab; };

struct scan {
    int pid;
    const char *dir, *id, *why;
    char *err;
    size_t errlen;
    int failed;
    double when;
    int lockfd, nolock, attached;
    /* the trace's owner, the owner of its .maps (made first): looked up once (trace_owner) */
    int owner_known, owner_found;
    uid_t owner_uid;
    gid_t owner_gid;
    int glibc;                          /* the allocator traced is glibc's (#alloc) */
    /* the words being read may be glibc's own (libc.so.6's data, a stack, registers, a heap
     * outside the known blocks after an attach): one that points to the next chunk's header
     * is then not a pointer into a block */
    int glibc_words;
    struct thr *th;
    int nth;
    struct cutf *cf;
    int ncf;
    /* the live blocks, sorted by address */
    uint64_t *bp, *bs, *bq;
    uint8_t *st, *pend;
    uint8_t *hk;                        /* per block: what the heuristics learnt (HK_*), or NULL */
    size_t nb;
    uint64_t lo, hi;
    /* where a word points: the pages the blocks cover, in regions (see page_index) */
    struct region *rg;
    size_t nrg;
    uint32_t *ptab;
    /* the memory map */
    char *mapsbuf;
    struct mapping *mp;
    size_t nmp;
    /* marking */
    uint32_t *stack;
    size_t top;
    char *win;
    uint64_t wlo, whi;
    char *cw;                           /* the heap around the last batch (drain), CACHE */
    uint64_t clo, chi, last_a;          /* the range it holds; the last batch's start */
    struct reader *rd;                  /* reads the next range ahead (scan_read.h), or NULL */
    uint64_t roots[R_KINDS][2], excluded[2], glibc_ex[2];
    uint64_t kinds[4][2];
    uint64_t unreadable;
    uint64_t reads;                     /* process_vm_readv calls of marking (debug output) */
    int vanished;                       /* the process ended (SIGKILL...) during the scan */
    int rpid;                           /* where memory is read: the process, or its copy */
    int child;                          /* the copy (a fork made in the process), or 0 */
    int forked;                         /* a copy was read ("#stall S fork") */
    uint64_t insn;                      /* the `syscall` instruction it was made with */
    double stall;                       /* seconds the process was stopped */
    int open_files;                     /* dump files of the cut without "#end" */
    int pagemap;                        /* /proc/RPID/pagemap, -1 none, -2 not yet opened */
    uint64_t *pm;                       /* its entries for one stretch of a root */
    uint64_t own_lo, own_hi;            /* mmleak.so's .bss (its anonymous part), or 0 0 */
    struct mml_own_slot *own;           /* mmleak.so's own mappings (own_maps), by address */
    size_t nown;
    int layout;                         /* struct pthread's (dead_stack): 1 known, -1 not, 0 */
    struct mml_pthread_layout pl;
    int floor_tid;                      /* this thread's stack is scanned from floor up */
    uint64_t floor;
    int nfiles;                         /* > 0: the trace's dump files are numbered below it
                                         * (mmleak.so's word: take_cut) */
    const uint64_t *lone;               /* the asking thread alone: sp, fs_base, gs_base */
    const struct mml_park *park;        /* the others parked by mmleak.so's signal, or NULL */
    int held;                           /* how the threads were held (HELD_*: hold_here) */
    int refused;                        /* the kernel refused to let us trace a thread */
};

#define WINDOW ((size_t)4 << 20)        /* block contents are read this much at a time */
#define CACHE ((size_t)1 << 20)         /* the heap around the last batch (drain) */

/* tools/scan.c: the course of a scan */
extern int scan_debug;                  /* MMLEAK_SCAN_DEBUG: 1, the time of each step, the
                                           cut, the roots, the reads; 2, also every word that
                                           points into a block */
/* A debug line (MMLEAK_SCAN_DEBUG) into the scan's debug file, mmleak.ID.scan-debug.K beside
 * the trace (never a descriptor of the process's: at exit the scanner's stderr is the
 * program's, which may be a pipe it speaks a protocol on); nothing when it has none. */
__attribute__((format(printf, 1, 2))) void scan_dbg(const char *fmt, ...);
/* The scan failed: why, in S->err (the first reason only); returns -1. */
__attribute__((format(printf, 2, 3))) int say(struct scan *s, const char *fmt, ...);
int64_t mono_ns(void);

/* tools/scan_result.c: a file the scan made in the trace's directory (the result, the debug
 * file), mode 0600 whatever the umask, given to the trace's owner (root scanning a user's
 * trace) */
void scan_file_owner(struct scan *s, int fd);

/* how the threads were held: seized with ptrace; the asking thread alone, not stopped; the
 * others parked by mmleak.so's signal (the result's "#held" line, scan_result.c) */
enum { HELD_PTRACE, HELD_ALONE, HELD_SIGNAL };
extern const char *const HELD_NAME[3];

/* tools/scan_stop.c: the threads held, the snapshot */
int hold_here(struct scan *s);
int seize_all(struct scan *s);
void let_go(struct scan *s);
int snapshot(struct scan *s);
void drop_snapshot(struct scan *s);

/* tools/scan_cut.c: the trace's lock, its cut, the live set */
uid_t trace_owner(struct scan *s);
int lock_exists(struct scan *s);
int take_lock(struct scan *s);
void drop_lock(struct scan *s);
void free_cut(struct scan *s);
int take_cut(struct scan *s);
int live_set(struct scan *s);

/* tools/scan_mem.c: the target's map and memory */
size_t first_block_at_or_after(struct scan *s, uint64_t a);
int read_maps(struct scan *s);
const struct mapping *mapping_at(struct scan *s, uint64_t a);
size_t scan_rd(struct scan *s, uint64_t a, void *buf, size_t n);

/* tools/scan_mark.c: the marking */
void page_index(struct scan *s);
void scan_range(struct scan *s, uint64_t a, uint64_t b, int prior, ssize_t clique);
void drain(struct scan *s, ssize_t clique);
void mark_register(struct scan *s, int tid, size_t k, uint64_t w);
void mark_cliques(struct scan *s);

/* tools/scan_rootset.c: the roots, each marked from; then the cliques (mark_cliques) */
void mark(struct scan *s);

/* Write the result of scan S (done, or "#status unknown" when S->failed) to the first free
 * name DIR/mmleak.ID.scan.N (scan_name_number), whose path goes to OUT: 0, or -1 when it
 * could not be. */
int scan_write_result(struct scan *s, char *out, size_t outlen);

#endif
