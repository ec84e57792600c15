/* tools/shrink_state.c: the compiled shrinker's state, the containers alone (what is kept,
 * not what it means: that is the folding algebra, tools/shrink_fold.h): the memory (mmap
 * only, so that the library behaves the same under the tracer or not), the line storage
 * (size classes with free lists), the table of entries and its index, the set of header
 * lines seen.  Separate because nothing here knows the dump format; what the reader's loop
 * runs per event (home, slab_free, table_del) is inline in tools/shrink_int.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shrink_int.h"

/* ---- memory: mmap only ------------------------------------------------------------ */

void *map_mem(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* the table's index and entries, the line storage: with millions of addresses, read
     * and written all over; huge pages where the system gives them on request (fewer page
     * faults and TLB misses; a mapping keeps the advice when mremap grows it) */
    if (n >= ((size_t)2 << 20))
        madvise(p, n, MADV_HUGEPAGE);
    return p;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
/* N bytes at P (page-aligned) faulted in by one call (Linux 5.14 and later; before, they
 * fault in as they are written): 0, or -1 when the kernel cannot. */
int populate(void *p, size_t n)
{
    int saved = errno, rc = madvise(p, n, MADV_POPULATE_WRITE);
    errno = saved;
    return rc;
}


char *slab_alloc(struct slab *s, size_t n)
{
    if (unlikely(n > SLAB_MAX)) {
        size_t sz = big_size(n);
        char *p = map_mem(sz);
        return p ? p + sizeof(struct chunk) : NULL;
    }
    size_t c = (n + SLAB_GRAIN - 1) / SLAB_GRAIN;
    void *p = s->free_list[c];
    if (p) {
        memcpy(&s->free_list[c], p, sizeof(void *));
        return p;
    }
    size_t sz = c * SLAB_GRAIN;
    if ((size_t)(s->end - s->cur) < sz) {
        /* a chunk is carved from its start, line after line: in pages of 4 KiB (no huge
         * pages: on a VM, zeroing them took from 0.3 to 1.3 s of system time from run to
         * run for bench/live.py's 400 MB of lines), all faulted in by one call from the
         * second chunk on (a slab that holds a few lines costs no more than before) */
        struct chunk *ch = mmap(NULL, CHUNK, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (ch == MAP_FAILED)
            return NULL;
        if (s->chunks)
            populate(ch, CHUNK);
        ch->next = s->chunks;
        ch->size = CHUNK;
        s->chunks = ch;
        s->cur = (char *)ch + 64;
        s->end = (char *)ch + CHUNK;
    }
    char *r = s->cur;
    s->cur += sz;
    return r;
}

void slab_release(struct slab *s)
{
    for (struct chunk *ch = s->chunks, *nx; ch; ch = nx) {
        nx = ch->next;
        munmap(ch, ch->size);
    }
    s->chunks = NULL;
}

/* The entry array's next POP_STEP bytes faulted in by one call, not a page fault per page
 * as the entries reach them: never more than POP_STEP beyond the entries written. */
#define POP_STEP ((size_t)8 << 20)
__attribute__((cold, noinline)) void populate_ahead(struct table *t)
{
    size_t end = t->pop + POP_STEP < t->e_bytes ? t->pop + POP_STEP : t->e_bytes;
    t->pop = populate((char *)t->e + t->pop, end - t->pop) ? SIZE_MAX : end;
}

int index_init(struct table *t, int bits)
{
    size_t n = (size_t)1 << bits;
    if (t->lazy) {              /* no index yet: only its size, for table_index */
        t->mask = n - 1;
        t->bits = bits;
        return 0;
    }
    uint32_t *ix = map_mem(n * sizeof *ix);    /* zero-filled: every slot empty */
    if (!ix)
        return -1;
    if (t->ix)
        munmap(t->ix, t->ix_bytes);
    t->ix = ix;
    t->ix_bytes = n * sizeof *ix;
    t->mask = n - 1;
    t->bits = bits;
    for (size_t d = 0; d < t->count; d++) {
        size_t j = home(t, t->e[d].key);
        while (t->ix[j])
            j = (j + 1) & t->mask;
        t->ix[j] = (uint32_t)(d + 1);
    }
    return 0;
}

int table_init(struct table *t, int bits)
{
    memset(t, 0, sizeof *t);
    t->cap = (size_t)1 << (bits - 1);
    t->e_bytes = t->cap * sizeof(struct ent);
    t->e = map_mem(t->e_bytes);
    if (!t->e)
        return -1;
    t->lazy = 1;
    return index_init(t, bits);
}

/* The entry array twice as big, in place. */
__attribute__((cold, noinline)) int table_grow(struct table *t)
{
    if (t->cap >= UINT32_MAX / 2)
        return -1;
    size_t nb = t->e_bytes * 2;
    void *p = mremap(t->e, t->e_bytes, nb, MREMAP_MAYMOVE);
    if (p == MAP_FAILED)
        return -1;
    t->e = p;
    t->e_bytes = nb;
    t->cap *= 2;
    return 0;
}

/* Room for one more entry: the array grows in place, the index at 70% load. */
int table_room(struct table *t)
{
    if (t->count == t->cap && table_grow(t))
        return -1;
    if (!t->lazy && (t->count + 1) * 10 > (t->mask + 1) * 7)
        return index_init(t, t->bits + 1);
    return 0;
}

/* A LAZY table indexed: an address came below the last one.  The index gets the size the
 * hints asked for (grow_index), or more for the entries it holds. */
__attribute__((cold, noinline)) int table_index(struct table *t)
{
    int bits = t->bits;
    while ((t->count + 1) * 10 > ((size_t)1 << bits) * 7)
        bits++;
    t->lazy = 0;
    return index_init(t, bits);
}

/* ---- header lines seen (a small set of byte strings) --------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* 1: added (new), 0: present, -1: out of memory */
int hset_add(struct hset *hs, const char *s, size_t n)
{
    if (!hs->v || (hs->count + 1) * 2 > hs->mask + 1) {
        size_t cap = hs->v ? (hs->mask + 1) * 2 : 64;
        struct hitem *nv = map_mem(cap * sizeof *nv);
        if (!nv)
            return -1;
        for (size_t i = 0; hs->v && i <= hs->mask; i++) {
            if (!hs->v[i].s)
                continue;
            size_t j = hs->v[i].h & (cap - 1);
            while (nv[j].s)
                j = (j + 1) & (cap - 1);
            nv[j] = hs->v[i];
        }
        if (hs->v)
            munmap(hs->v, hs->bytes);
        hs->v = nv;
        hs->mask = cap - 1;
        hs->bytes = cap * sizeof *nv;
    }
    uint64_t h = hash_bytes(s, n);
    size_t j = h & hs->mask;
    for (; hs->v[j].s; j = (j + 1) & hs->mask)
        if (hs->v[j].h == h && hs->v[j].n == n && !memcmp(hs->v[j].s, s, n))
            return 0;
    char *c = slab_alloc(&hs->mem, n ? n : 1);
    if (!c)
        return -1;
    memcpy(c, s, n);
    hs->v[j] = (struct hitem){ h, c, n };
    hs->count++;
    return 1;
}

void hset_release(struct hset *hs)
{
    if (hs->v)
        munmap(hs->v, hs->bytes);
    slab_release(&hs->mem);
}

