/* A pool allocator: many objects carved out of one malloc'ed slab.  pool_grow takes a new
 * 4096-byte slab from malloc and links it (returns nothing); pool_alloc carves objects and
 * is no wrapper of malloc (what it returns is a pointer into a slab, not the block malloc
 * gave).  Leaks: the slabs, 3 x 4096, at the p_slab line (the grow path); the pool's header,
 * 1 x 24, at the p_new line (in pool_new: a constructor, its block of a fixed size). */
#include <stdio.h>
#include <stdlib.h>

#define W __attribute__((noipa))
#define SLAB 4096

struct slab { struct slab *next; size_t used; char data[]; };
struct pool { struct slab *slabs; size_t objects; size_t pad; };

W struct pool *pool_new(void) {
    struct pool *p = calloc(1, sizeof *p);           /* site:p_new */
    if (!p) abort();
    return p;
}

W void pool_grow(struct pool *p) {
    struct slab *s = malloc(SLAB);                   /* site:p_slab */
    if (!s) abort();
    s->used = 0;
    s->next = p->slabs;
    p->slabs = s;
}

W void *pool_alloc(struct pool *p, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!p->slabs || p->slabs->used + n > SLAB - sizeof(struct slab))
        pool_grow(p);
    void *o = p->slabs->data + p->slabs->used;
    p->slabs->used += n;
    p->objects++;
    return o;
}

int main(void) {
    struct pool *pool = pool_new();
    void *last = NULL;
    /* 100 objects of 96 bytes: 42 fit in a slab (4080 / 96): three slabs */
    for (int i = 0; i < 100; i++)
        last = pool_alloc(pool, 96);
    printf("%p %zu\n", last, pool->objects);
    return 0;
}
