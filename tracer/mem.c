/*
 * tracer/mem.c: mmleak's own memory.  Never from the allocator it traces (its blocks would be
 * recorded, and its locks may be held by the very call we are in): anonymous mappings only,
 * taken with mml_map, and arrays grown by doubling with mml_grow.  Used by every file of the
 * tracer (sites.c and got.c included, which need nothing else of the rest).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "internal.h"
#include "ownlist.h"

/* ---- the list of our mappings (ownlist.h), for the reachability scan ----
 * A slot is taken by a compare-and-swap of its lo, then its hi is written; it is given back
 * (hi, then lo, cleared) before the memory is unmapped.  So a slot that reads as a range
 * always is our memory: the scan may read some of ours (a mapping being listed or given
 * back, one that found no free slot), never leave out the program's.  Cold: mappings are
 * taken and given back seldom (a thread's first events, an array that doubles). */
static struct mml_own_slot own_slots[MML_OWN_SLOTS];
__attribute__((used, aligned(16))) static struct mml_own_list own_list = {
    MML_OWN_MAGIC, MML_OWN_VERSION, MML_OWN_SLOTS, 0, 0, own_slots
};

static void own_add(void *p, size_t n)
{
    uint64_t lo = (uint64_t)(uintptr_t)p;
    for (uint32_t i = 0; i < MML_OWN_SLOTS; i++) {
        uint64_t zero = 0;
        if (__atomic_load_n(&own_slots[i].lo, __ATOMIC_RELAXED) ||
            !__atomic_compare_exchange_n(&own_slots[i].lo, &zero, lo, 0, __ATOMIC_SEQ_CST,
                                         __ATOMIC_RELAXED))
            continue;
        uint32_t u = __atomic_load_n(&own_list.used, __ATOMIC_RELAXED);
        while (u < i + 1 && !__atomic_compare_exchange_n(&own_list.used, &u, i + 1, 0,
                                                         __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            ;
        __atomic_store_n(&own_slots[i].hi, lo + n, __ATOMIC_SEQ_CST);
        return;
    }
    /* every slot taken: this mapping is scanned like the program's (a stale copy in it can
     * only make a block look reachable) */
}

static void own_drop(void *p)
{
    uint64_t lo = (uint64_t)(uintptr_t)p;
    uint32_t used = __atomic_load_n(&own_list.used, __ATOMIC_SEQ_CST);
    for (uint32_t i = 0; i < used; i++)
        if (__atomic_load_n(&own_slots[i].lo, __ATOMIC_RELAXED) == lo &&
            __atomic_load_n(&own_slots[i].hi, __ATOMIC_RELAXED) > lo) {
            __atomic_store_n(&own_slots[i].hi, 0, __ATOMIC_SEQ_CST);
            __atomic_store_n(&own_slots[i].lo, 0, __ATOMIC_SEQ_CST);
            return;
        }
}

/* N bytes of fresh, zeroed memory of our own, or NULL (errno says why). */
void *mml_map(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    mml_own_note(p, n);
    return p;
}

/* A mapping of ours made elsewhere (the memo's huge page, tracer/memo.c), of N bytes at P:
 * named and listed as mml_map's are. */
void mml_own_note(void *p, size_t n)
{
    /* named, and listed (ownlist.h), so that the reachability scan leaves our memory out
     * (mmleak-scan(7)): it holds copies of the program's words, which must not count.
     * Kernels before 5.17 (or without CONFIG_ANON_VMA_NAME) refuse the name: the list
     * says it then, and the kernel is not asked again (a system call for each mapping
     * taken: 7 of a small program's start-up) */
    int saved = errno;
    static int unnamed;
    if (!__atomic_load_n(&unnamed, __ATOMIC_RELAXED) &&
        mml_sys(SYS_prctl, PR_SET_VMA, PR_SET_VMA_ANON_NAME, p, n, "mmleak") &&
        errno == EINVAL)
        __atomic_store_n(&unnamed, 1, __ATOMIC_RELAXED);
    own_add(p, n);
    errno = saved;
}

/* Unmap N bytes at P, a mapping of ours (mml_map's, or another: then it is only unmapped). */
void mml_unmap(void *p, size_t n)
{
    int saved = errno;
    own_drop(p);
    munmap(p, n);
    errno = saved;
}

/* An array of *CAP elements of UNIT bytes, grown (doubling) to hold NEED: mmap only, since
 * mmleak's own memory must never come from the allocator it traces.  NULL if it cannot. */
void *mml_grow(void *p, size_t *cap, size_t need, size_t unit)
{
    if (need <= *cap)
        return p;
    size_t ncap = *cap ? *cap : 4096 / unit + 1;
    while (ncap < need)
        ncap *= 2;
    void *q = mml_map(ncap * unit);
    if (!q)
        return NULL;
    if (p) {
        memcpy(q, p, *cap * unit);
        mml_unmap(p, *cap * unit);
    }
    *cap = ncap;
    return q;
}

