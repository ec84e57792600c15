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

#include "internal.h"

/* N bytes of fresh, zeroed memory of our own, or NULL (errno says why). */
void *mml_map(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* named, so that the reachability scan leaves our memory out (mmleak-scan(7)): it holds
     * no pointer of the program's that counts.  Kernels before 5.17 (or without
     * CONFIG_ANON_VMA_NAME) refuse: the mapping is then scanned like any other */
    int saved = errno;
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)p, n, (unsigned long)"mmleak");
    errno = saved;
    return p;
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
        munmap(p, *cap * unit);
    }
    *cap = ncap;
    return q;
}

