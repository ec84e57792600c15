/* tools/scan_mark.c: the marking of the reachability scan (memcheck's rules:
 * mmleak-format(5), "The scan result"): where a word points (the blocks by page), a word
 * found and the state of its block (reachable, possible, and memcheck's heuristics for an
 * interior pointer), the mark stack drained in batches of blocks read with one
 * process_vm_readv (the heap around a batch kept, and read ahead by a thread:
 * tools/scan_read.c), then memcheck's clique pass for the blocks no root reached and each
 * block's final kind.  Separate because this is the scan's hot loop: what a word means and
 * how the blocks are read, whatever the roots (tools/scan_rootset.c feeds it). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tracer/compiler.h"

#include "scan_int.h"
#include "scan_live.h"
#include "scan_read.h"

/* ---- 6. marking (memcheck's rules: mmleak-format(5), "The scan result") --------------- */

/* The blocks by page, so that the block a word points into is found without a binary
 * search over millions of addresses (a cache miss per step): regions of pages the blocks
 * cover, split where no block covers RG_GAP pages in a row; per page of a region, the
 * number of blocks that start before its end.  Not built (block_of searches them all)
 * when the pages would be more than 4 per block and a million: blocks far apart. */
#define RG_GAP 16
void page_index(struct scan *s)
{
    size_t nrg = 0, pages = 0;
    uint64_t last = 0;
    for (size_t i = 0; i < s->nb; i++) {
        uint64_t a = s->bp[i] >> 12, b = (s->bp[i] + (s->bs[i] ? s->bs[i] : 1) - 1) >> 12;
        if (!nrg || a > last + RG_GAP) {
            nrg++;
            pages += b - a + 1;
            last = b;
        } else if (b > last) {
            pages += b - last;
            last = b;
        }
        if (pages > 4 * s->nb + (1u << 20))
            return;
    }
    if (!nrg)
        return;
    s->rg = calloc(nrg, sizeof *s->rg);
    s->ptab = malloc(pages * sizeof *s->ptab);
    if (!s->rg || !s->ptab) {
        free(s->rg);
        free(s->ptab);
        s->rg = NULL;
        s->ptab = NULL;
        return;
    }
    struct region *r = NULL;
    for (size_t i = 0; i < s->nb; i++) {        /* the regions, as counted above */
        uint64_t a = s->bp[i] >> 12, b = (s->bp[i] + (s->bs[i] ? s->bs[i] : 1) - 1) >> 12;
        if (!r || a > r->page + r->npages - 1 + RG_GAP) {
            r = r ? r + 1 : s->rg;
            r->page = a;
            r->npages = 0;
            r->first = i;
        }
        if (b + 1 > r->page + r->npages)
            r->npages = (size_t)(b + 1 - r->page);
    }
    s->nrg = (size_t)(r - s->rg) + 1;
    uint32_t *t = s->ptab;
    size_t j = 0;
    for (size_t k = 0; k < s->nrg; k++) {       /* per page: blocks starting up to it */
        r = &s->rg[k];
        r->tab = t;
        for (size_t p = 0; p < r->npages; p++) {
            while (j < s->nb && (s->bp[j] >> 12) <= r->page + p)
                j++;
            r->tab[p] = (uint32_t)j;
        }
        t += r->npages;
    }
}

static inline ssize_t block_of(struct scan *s, uint64_t w)
{
    if (w < s->lo || w >= s->hi)
        return -1;
    size_t lo = 0, hi = s->nb;
    if (s->rg) {                        /* the region, then the page: a few blocks */
        uint64_t pg = w >> 12;
        size_t a = 0, b = s->nrg;
        while (a < b) {
            size_t m = (a + b) / 2;
            if (s->rg[m].page <= pg)
                a = m + 1;
            else
                b = m;
        }
        if (!a)
            return -1;
        const struct region *r = &s->rg[a - 1];
        if (pg >= r->page + r->npages)
            return -1;
        size_t p = (size_t)(pg - r->page);
        lo = p ? r->tab[p - 1] : r->first;
        hi = r->tab[p];
        if (lo == hi || s->bp[lo] > w) {        /* none starts in the page at or below W */
            if (lo == r->first)
                return -1;
            lo = hi = lo - 1;
            hi++;
        }
    }
    while (lo < hi) {                   /* the last block starting at or below W */
        size_t mid = (lo + hi) / 2;
        if (s->bp[mid] <= w)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!lo)
        return -1;
    size_t i = lo - 1;
    if (w < s->bp[i] + s->bs[i] || (s->bs[i] == 0 && w == s->bp[i]))
        return (ssize_t)i;
    return -1;
}

static inline void push(struct scan *s, size_t i)
{
    if (!s->pend[i]) {
        s->pend[i] = 1;
        s->stack[s->top++] = (uint32_t)i;
    }
}

/* memcheck's vtable test: A is in a readable file mapping and, among its first 21 words,
 * two non-null ones point into executable file mappings before one that does not. */
static int is_vtable(struct scan *s, uint64_t a)
{
    const struct mapping *m = mapping_at(s, a);
    if (!m || m->perm[0] != 'r' || m->path[0] != '/')
        return 0;
    uint64_t w[21];
    size_t n = 21;
    if (a + n * 8 > m->hi - 8 + 8)
        n = (size_t)((m->hi - a) / 8);
    if (!n)
        return 0;
    scan_rd(s, a, w, n * 8);
    int fns = 0;
    for (size_t k = 0; k < n; k++) {
        if (!w[k])
            continue;
        const struct mapping *f = mapping_at(s, w[k]);
        if (!f || f->perm[2] != 'x' || f->path[0] != '/')
            return 0;
        if (++fns == 2)
            return 1;
    }
    return 0;
}

/* memcheck's heuristics (--leak-check-heuristics=all, its default): may the interior
 * pointer W into block I count as a pointer to its start?
 *
 * What the heuristics read of a block does not change while the scan reads (the process is
 * stopped, or the scan reads its copy), and three of the four depend on the block alone:
 * they are read once per block and kept in s->hk.  Without that, every interior pointer
 * into a block that stays "possible" read its head again, two to four process_vm_readv
 * calls each: perl's exit, where millions of words point into the middle of a few thousand
 * arenas, took 8.7 s instead of a fraction of one. */
enum {
    HK_KNOWN = 1,                       /* the bits below are set */
    HK_LEN8 = 2,                        /* length64 or newarray: an interior pointer at 8 */
    HK_STR24 = 4,                       /* stdstring: an interior pointer at 24 */
    HK_VTABLE = 8,                      /* the first word is a vtable: multipleinheritance */
};

/* What block I's head says, read now (cold: once per block that meets an interior pointer) */
static uint8_t block_head_kinds(struct scan *s, size_t i)
{
    uint64_t b = s->bp[i], sz = s->bs[i], h[2] = { 0, 0 };
    uint8_t k = HK_KNOWN;
    if (sz >= 8)
        scan_rd(s, b, h, sz >= 16 ? 16 : 8);
    if (sz >= 24 && 24 + h[1] + 1 == sz && h[0] <= h[1])
        k |= HK_STR24;                  /* length capacity refcount chars */
    if (sz >= 8 && h[0] > 0 && (sz - 8 == h[0] || (sz - 8) % h[0] == 0))
        k |= HK_LEN8;
    if (sz >= 8 && !(h[0] & 7) && h[0] >= 4096 && is_vtable(s, h[0]))
        k |= HK_VTABLE;
    return k;
}

static int heuristic(struct scan *s, size_t i, uint64_t w)
{
    uint64_t b = s->bp[i], sz = s->bs[i];
    uint64_t off = w - b;
    if (off != 8 && off != 24 && (w & 7))
        return 0;
    if (!s->hk)                         /* NULL when out of memory: read every time */
        s->hk = calloc(s->nb + 1, 1);
    uint8_t k = s->hk ? s->hk[i] : 0;
    if (!(k & HK_KNOWN)) {
        k = block_head_kinds(s, i);
        if (s->hk)
            s->hk[i] = k;
    }
    if (off == 24 && (k & HK_STR24))
        return 1;
    if (off == 8 && (k & HK_LEN8))
        return 1;
    if ((k & HK_VTABLE) && !(w & 7) && w + 8 <= b + sz) {   /* multipleinheritance */
        uint64_t inner;
        scan_rd(s, w, &inner, 8);
        if (!(inner & 7) && inner >= 4096 && is_vtable(s, inner))
            return 1;
    }
    return 0;
}

/* One word W found in memory whose holder is definite (PRIOR: a root, or a reachable
 * block) or not; CLIQUE >= 0: the clique pass of that leader. */
/* glibc's own pointer to the header of the chunk after block I: it overlaps the block's last
 * bytes when the size asked leaves none spare (4321 bytes: a chunk of 4336, the next header
 * at 4320).  malloc_state's top and bins hold such words (main_arena is in libc.so.6's data),
 * and malloc's frames and registers may: not the program's.  Elsewhere (the program's data, a
 * block) the same word is the program's pointer to its block's last 8 bytes: a list node at
 * the end of a struct (PostgreSQL's RegisteredBgWorker), and counts, as for valgrind. */
static inline int chunk_after(struct scan *s, size_t i, uint64_t w)
{
    uint64_t r = s->bs[i], cs = (r + 8 + 15) & ~15ull;
    if (cs < 32)
        cs = 32;
    return s->glibc && s->glibc_words && w == s->bp[i] + cs - 16;
}

static inline void found(struct scan *s, uint64_t w, int prior, ssize_t clique)
{
    ssize_t i = block_of(s, w);
    if (i < 0 || (w != s->bp[i] && chunk_after(s, (size_t)i, w)))
        return;
    uint8_t *st = &s->st[i];
    if (clique >= 0) {
        if (*st == UNREACHED && i != clique) {
            *st = INDIRECT;
            push(s, (size_t)i);
        }
        return;
    }
    if (*st == REACHABLE)
        return;
    int start = w == s->bp[i] || heuristic(s, (size_t)i, w);
    if (start && prior) {
        *st = REACHABLE;
        push(s, (size_t)i);
    } else if (*st == UNREACHED) {
        *st = POSSIBLE;
        push(s, (size_t)i);
    }
}


static void scan_words(struct scan *s, const uint64_t *w, size_t n, int prior, ssize_t clique,
                       uint64_t at)
{
    uint64_t lo = s->lo, hi = s->hi;
    for (size_t k = 0; k < n; k++)
        if (unlikely(w[k] >= lo && w[k] < hi)) {
            if (unlikely(scan_debug > 1) && block_of(s, w[k]) >= 0)
                scan_dbg("mmleak-scan: %#" PRIx64 " holds %#" PRIx64 " (%s)\n",
                        at + 8 * k, w[k], clique >= 0 ? "clique" : prior ? "definite" :
                        "possible");
            found(s, w[k], prior, clique);
        }
}

/* Scan [A, B) of the target (a root range). */
void scan_range(struct scan *s, uint64_t a, uint64_t b, int prior, ssize_t clique)
{
    a = (a + 7) & ~7ull;
    b &= ~7ull;
    while (a < b) {
        size_t n = b - a > WINDOW ? WINDOW : (size_t)(b - a);
        scan_rd(s, a, s->win, n);
        s->wlo = s->whi = 0;            /* the window no longer holds a block's memory */
        scan_words(s, (const uint64_t *)s->win, n / 8, prior, clique, a);
        a += n;
    }
}

/* The contents of block I, read on their own (a big block, or one a batch could not read). */
static void scan_block(struct scan *s, size_t i, int prior, ssize_t clique)
{
    uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
    if (a < b)
        scan_range(s, a, b, prior, clique);
}

/* The mark stack, until empty.  Blocks are read in batches: up to IOV_BATCH blocks (and
 * WINDOW bytes) with one process_vm_readv, so that list nodes far apart cost no more than
 * neighbours; the batch in address order, blocks less than GAP bytes apart read as one
 * remote range (the kernel pins the pages of each range: one range per block cost more than
 * reading the memory when the blocks are neighbours, as list nodes allocated in a row are).
 * The states are a fixpoint (reachable only grows; a block upgraded after it was read is
 * pushed and read again), so the order changes neither the verdict nor, in a clique pass,
 * the set its leader reaches. */
#define IOV_BATCH 1024
#define GAP 64
static void sort_batch(uint32_t *b, size_t n)
{
    size_t k = 1;
    while (k < n && b[k - 1] < b[k])
        k++;
    if (k == n)
        return;
    k = 1;
    while (k < n && b[k - 1] > b[k])
        k++;
    if (k == n) {                       /* popped from the stack: often the reverse */
        for (size_t i = 0, j = n - 1; i < j; i++, j--) {
            uint32_t t = b[i];
            b[i] = b[j];
            b[j] = t;
        }
        return;
    }
    for (size_t i = 1; i < n; i++) {    /* insertion sort: a batch is small */
        uint32_t v = b[i];
        size_t j = i;
        while (j > 0 && b[j - 1] > v) {
            b[j] = b[j - 1];
            j--;
        }
        b[j] = v;
    }
}

/* [*LO, *HI) cut to the pages of mapping M that hold live blocks: the heap past the first
 * and the last of them holds nothing to read (a small program's 132 KiB [heap] with its one
 * stdout buffer was read whole at every exit, its untouched pages faulted in on both sides:
 * docs/performance-heap.rst, "Start-up and exit, the scan's hand-overs"). */
static void live_span(struct scan *s, const struct mapping *m, uint64_t *lo, uint64_t *hi)
{
    size_t i = first_block_at_or_after(s, m->lo), j = first_block_at_or_after(s, m->hi);
    if (i >= j)
        return;
    uint64_t a = s->bp[i] & ~4095ull, b = (s->bp[j - 1] + s->bs[j - 1] + 4095) & ~4095ull;
    if (*lo < a)
        *lo = a;
    if (*hi > b)
        *hi = b;
}

/* The heap just read into the cache (s->clo to s->chi), the next stretch of it (DOWN: below,
 * else above) asked of the reader thread, overlapping the cache by CACHE / 16: a batch that
 * straddles the cache's end is in it whole. */
static void read_ahead(struct scan *s, int down)
{
    const struct mapping *m = mapping_at(s, down ? s->clo : s->chi - 1);
    if (!m)
        return;
    uint64_t lo, hi;
    if (down) {
        if (s->clo <= m->lo)
            return;
        hi = s->clo + CACHE / 16;
        lo = hi - m->lo > CACHE ? hi - CACHE : m->lo;
    } else {
        if (s->chi >= m->hi)
            return;
        lo = s->chi - CACHE / 16;
        hi = m->hi - lo > CACHE ? lo + CACHE : m->hi;
    }
    live_span(s, m, &lo, &hi);
    reader_ask(s->rd, lo, hi);
}

void drain(struct scan *s, ssize_t clique)
{
    static uint32_t batch[IOV_BATCH];
    static struct iovec riov[IOV_BATCH];
    static size_t boff[IOV_BATCH];
    while (s->top) {
        size_t n = 0, bytes = 0;
        while (s->top && n < IOV_BATCH) {
            size_t i = s->stack[s->top - 1];
            uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
            size_t len = a < b ? (size_t)(b - a) : 0;
            if (len > WINDOW / 4) {     /* a big block: alone, in chunks */
                if (n)
                    break;
                s->top--;
                s->pend[i] = 0;
                scan_block(s, i, clique >= 0 || s->st[i] != POSSIBLE, clique);
                continue;
            }
            if (bytes + len + GAP > WINDOW)     /* room for a gap read with each block */
                break;
            s->top--;
            s->pend[i] = 0;
            if (!len)
                continue;
            batch[n++] = (uint32_t)i;
            bytes += len + GAP;
        }
        if (!n)
            continue;
        sort_batch(batch, n);
        /* the remote ranges: each block's, merged with the one before when the gap is
         * small; BOFF[k] is where block k's bytes land in the window */
        size_t nr = 0, off = 0;
        uint64_t end = 0;
        for (size_t k = 0; k < n; k++) {
            size_t i = batch[k];
            uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
            if (nr && a >= end && a - end < GAP) {
                riov[nr - 1].iov_len += (size_t)(b - end);
                boff[k] = off + (size_t)(a - end);
                off += (size_t)(b - end);
            } else {
                riov[nr].iov_base = (void *)a;
                riov[nr].iov_len = (size_t)(b - a);
                nr++;
                boff[k] = off;
                off += (size_t)(b - a);
            }
            end = b;
        }
        /* a batch that is one range (the nodes of lists allocated in a row): the heap
         * around it, CACHE bytes in one read, which the next batches, nearby, take from
         * (the process is stopped, or a snapshot: its memory does not change); ahead in
         * the direction the batches go */
        uint64_t a0 = (uint64_t)riov[0].iov_base;
        uint64_t bn = (uint64_t)riov[nr - 1].iov_base + riov[nr - 1].iov_len;
        int cached = s->cw && a0 >= s->clo && bn <= s->chi, filled = 0;
        if (!cached && s->rd && nr == 1 &&
            reader_take(s->rd, a0, bn, &s->cw, &s->clo, &s->chi))
            cached = filled = 1;        /* the range read ahead */
        if (!cached && s->cw && nr == 1 && bn - a0 <= CACHE / 4) {
            const struct mapping *m = mapping_at(s, a0);
            if (m && bn <= m->hi) {
                uint64_t lo, hi;
                if (a0 < s->last_a) {           /* going down: the window ends with it */
                    hi = (bn + 4095) & ~4095ull;
                    hi = hi > m->hi ? m->hi : hi;
                    lo = hi - m->lo > CACHE ? hi - CACHE : m->lo;
                } else {                        /* up, or first: from it, or around it */
                    lo = a0 > s->last_a ? a0 : a0 - (a0 - m->lo < CACHE / 2 ? a0 - m->lo :
                                                     CACHE / 2);
                    lo = lo & ~4095ull;
                    lo = lo < m->lo ? m->lo : lo;
                    hi = m->hi - lo < CACHE ? m->hi : lo + CACHE;
                }
                live_span(s, m, &lo, &hi);
                struct iovec cl = { s->cw, (size_t)(hi - lo) }, cr = { (void *)lo, cl.iov_len };
                s->clo = s->chi = 0;
                if (lo <= a0 && bn <= hi && ++s->reads &&
                    process_vm_readv(s->rpid, &cl, 1, &cr, 1, 0) == (ssize_t)cl.iov_len) {
                    s->clo = lo;
                    s->chi = hi;
                    cached = filled = 1;
                }
            }
        }
        if (filled && s->rd)
            read_ahead(s, a0 < s->last_a);
        s->last_a = a0;
        ssize_t got = -1;
        if (!cached) {
            struct iovec l = { s->win, off };
            s->reads++;
            got = process_vm_readv(s->rpid, &l, 1, riov, nr, 0);
            if (got < 0 && errno == ESRCH)
                s->vanished = 1;
        }
        for (size_t k = 0; k < n; k++) {
            size_t i = batch[k];
            uint64_t a = (s->bp[i] + 7) & ~7ull, b = (s->bp[i] + s->bs[i]) & ~7ull;
            size_t len = (size_t)(b - a);
            int prior = clique >= 0 || s->st[i] != POSSIBLE;
            if (cached) {
                scan_words(s, (const uint64_t *)(s->cw + (a - s->clo)), len / 8, prior,
                           clique, a);
            } else if (got >= 0 && boff[k] + len <= (size_t)got) {
                scan_words(s, (const uint64_t *)(s->win + boff[k]), len / 8, prior, clique,
                           a);
            } else {                    /* not read (a page gone?): on its own, then */
                uint64_t *tmp = malloc(len);
                if (tmp) {
                    scan_rd(s, a, tmp, len);
                    scan_words(s, tmp, len / 8, prior, clique, a);
                    free(tmp);
                }
            }
        }
    }
}

/* Register K of thread TID holds W, in the blocks' range: a root's word (found) */
void mark_register(struct scan *s, int tid, size_t k, uint64_t w)
{
    if (scan_debug > 1 && block_of(s, w) >= 0)
        scan_dbg("mmleak-scan: register %zu of thread %d holds %#" PRIx64 "\n", k, tid,
                w);
    s->glibc_words = 1;
    found(s, w, 1, -1);
    s->glibc_words = 0;
}

/* After the roots: the blocks no root reached, and each block's kind final, with the totals
 * of each kind. */
void mark_cliques(struct scan *s)
{
    /* memcheck's cliques: each unreached block, in address order, leads the blocks only it
     * reaches (indirectly lost); it stays definitely lost */
    for (size_t i = 0; i < s->nb; i++)
        if (s->st[i] == UNREACHED) {
            push(s, i);
            drain(s, (ssize_t)i);
        }
    for (size_t i = 0; i < s->nb; i++) {
        int k = s->st[i] == UNREACHED ? DEFINITE : s->st[i];
        s->st[i] = (uint8_t)k;
        s->kinds[k][0]++;
        s->kinds[k][1] += s->bs[i];
    }
}
