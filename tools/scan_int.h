/* tools/scan_int.h: the state of one reachability scan, shared by tools/scan.c (the scan)
 * and tools/scan_result.c (its result file, specified in mmleak-format(5), "The scan
 * result").  Not an interface of mmleak-tools.so: tools/scan.h's mmleak_scan is. */
#ifndef MMLEAK_SCAN_INT_H
#define MMLEAK_SCAN_INT_H
#include <stddef.h>
#include <stdint.h>
#include <sys/user.h>

#include "scan_roots.h"

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
    int glibc;                          /* the allocator traced is glibc's (#alloc) */
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
};

/* Write the result of scan S (done, or "#status unknown" when S->failed) to the first free
 * name DIR/mmleak.ID.scan.N, whose path goes to OUT: 0, or -1 when it could not be. */
int scan_write_result(struct scan *s, char *out, size_t outlen);

#endif
