/*
 * tracer/mem.c: mmleak's own memory.  Never from the allocator it traces (its blocks would be
 * recorded, and its locks may be held by the very call we are in): anonymous mappings only,
 * grown by doubling.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

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

