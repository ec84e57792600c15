/* The shape of nginx's pools (src/core/ngx_palloc.c, written from its description):
 * ngx_pcalloc -> ngx_palloc -> small blocks carved from the pool's data, large ones by
 * ngx_palloc_large -> ngx_alloc -> malloc (linked in the pool's large list and handed back);
 * the pool itself and its later blocks from ngx_memalign -> posix_memalign (ngx_create_pool,
 * ngx_palloc_block: the grow path).  Leaks (the pool is never destroyed):
 *   the pool, 1 x 1024 at the n_pool line (ngx_create_pool's caller: ngx_create_pool hands it
 *   back); its grown blocks, 2 x 1024 at the n_grow line, in ngx_palloc_block, the grow path (it
 *   keeps the block in the pool's list and returns a pointer inside it); large blocks: 3 x 5000 at the n_large line
 *   (ngx_pcalloc's caller) and 1 x 6000 at the n_large2 line (ngx_palloc's caller); small objects
 *   carved from the pool are not blocks at all. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((noipa))
#define POOL_SIZE 1024
#define MAX_SMALL 512

typedef struct large { struct large *next; void *alloc; } large_t;
typedef struct pool {
    unsigned char *last, *end;
    struct pool *next;
    large_t *large;
    struct pool *current;
} pool_t;

static int log_level;

W void *ngx_alloc(size_t size, void *log) {
    void *p = malloc(size);
    if (p == NULL) fprintf(stderr, "malloc(%zu) failed\n", size);
    if (log_level > 1) fprintf(stderr, "malloc: %p:%zu %p\n", p, size, log);
    return p;
}

W void *ngx_memalign(size_t alignment, size_t size, void *log) {
    void *p;
    int err = posix_memalign(&p, alignment, size);
    if (err) {
        fprintf(stderr, "posix_memalign(%zu, %zu) failed %p\n", alignment, size, log);
        p = NULL;
    }
    return p;
}

W pool_t *ngx_create_pool(size_t size, void *log) {
    pool_t *p = ngx_memalign(16, size, log);
    if (p == NULL) return NULL;
    p->last = (unsigned char *)p + sizeof(pool_t);
    p->end = (unsigned char *)p + size;
    p->next = NULL;
    p->large = NULL;
    p->current = p;
    return p;
}

W static void *ngx_palloc_block(pool_t *pool, size_t size) {
    size_t psize = (size_t)(pool->end - (unsigned char *)pool);
    unsigned char *m = ngx_memalign(16, psize, NULL);  /* site:n_grow */
    if (m == NULL) return NULL;
    pool_t *new = (pool_t *)m, *p;
    new->end = m + psize;
    new->next = NULL;
    m += sizeof(pool_t);
    m = (unsigned char *)(((uintptr_t)m + 15) & ~(uintptr_t)15);
    new->last = m + size;
    for (p = pool->current; p->next; p = p->next) {}
    p->next = new;
    return m;
}

W static void *ngx_palloc_small(pool_t *pool, size_t size) {
    for (pool_t *p = pool->current; p; p = p->next) {
        unsigned char *m = (unsigned char *)(((uintptr_t)p->last + 15) & ~(uintptr_t)15);
        if ((size_t)(p->end - m) >= size) {
            p->last = m + size;
            return m;
        }
    }
    return ngx_palloc_block(pool, size);
}

W static void *ngx_palloc_large(pool_t *pool, size_t size) {
    void *p = ngx_alloc(size, NULL);
    if (p == NULL) return NULL;
    large_t *large = ngx_palloc_small(pool, sizeof(large_t));
    if (large == NULL) { free(p); return NULL; }
    large->alloc = p;
    large->next = pool->large;
    pool->large = large;
    return p;
}

W void *ngx_palloc(pool_t *pool, size_t size) {
    if (size <= MAX_SMALL) return ngx_palloc_small(pool, size);
    return ngx_palloc_large(pool, size);
}

W void *ngx_pcalloc(pool_t *pool, size_t size) {
    void *p = ngx_palloc(pool, size);
    if (p) memset(p, 0, size);
    return p;
}

void *keep[16];             /* not static: the stores stay */

int main(void) {
    pool_t *pool = ngx_create_pool(POOL_SIZE, NULL);     /* site:n_pool */
    for (int i = 0; i < 3; i++)
        keep[i] = ngx_pcalloc(pool, 5000);               /* site:n_large */
    keep[3] = ngx_palloc(pool, 6000);                    /* site:n_large2 */
    /* 20 small objects of 100 bytes (112 apart): the first pool holds 8 (after the 4
     * large list entries), each grown block 8: two grown blocks */
    for (int i = 0; i < 20; i++)
        keep[4 + i % 8] = ngx_palloc(pool, 100);
    printf("%p\n", (void *)pool);
    return 0;
}
