/* The shape of redis's allocator (src/zmalloc.c, written from its description): zmalloc ->
 * ztrymalloc_usable -> malloc, zstrdup over zmalloc, zcalloc -> ztrycalloc_usable -> calloc.
 * The wrappers are noipa, as if in their own translation unit.  Leaks: 3 x 100 at
 * the z_a line, 2 x 7 ("leak 1" + NUL, copied) at the z_dup line, 1 x 48 at the z_calloc line,
 * 1 x 64 at the z_b line (another function), 2 x 40 at the z_ctor line (create_client, a
 * constructor: zmalloc of a fixed size); the block freed is not reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((noipa))
static size_t used_memory;

W static void zmalloc_oom(size_t size) { fprintf(stderr, "zmalloc: out of memory (%zu)\n", size); abort(); }

W void *ztrymalloc_usable(size_t size, size_t *usable) {
    void *ptr = malloc(size);
    if (!ptr) return NULL;
    used_memory += size;
    if (usable) *usable = size;
    return ptr;
}

W void *zmalloc(size_t size) {
    void *ptr = ztrymalloc_usable(size, NULL);
    if (!ptr) zmalloc_oom(size);
    return ptr;
}

W void *ztrycalloc_usable(size_t size, size_t *usable) {
    void *ptr = calloc(1, size);
    if (ptr == NULL) return NULL;
    used_memory += size;
    if (usable) *usable = size;
    return ptr;
}

W void *zcalloc(size_t size) {
    void *ptr = ztrycalloc_usable(size, NULL);
    if (!ptr) zmalloc_oom(size);
    return ptr;
}

W char *zstrdup(const char *s) {
    size_t l = strlen(s) + 1;
    char *p = zmalloc(l);
    memcpy(p, s, l);
    return p;
}

W void zfree(void *p) { free(p); }

struct client { int fd; char buf[36]; };

/* a constructor over the wrapper: zmalloc(sizeof *c), a size fixed in its code */
W struct client *create_client(int fd) {
    struct client *c = zmalloc(sizeof *c);           /* site:z_ctor */
    c->fd = fd;
    return c;
}

void *keep[16];

W void other_function(void) {
    keep[10] = zmalloc(64);                          /* site:z_b */
}

int main(void) {
    for (int i = 0; i < 3; i++)
        keep[i] = zmalloc(100);                      /* site:z_a */
    for (int i = 0; i < 2; i++)
        keep[3 + i] = zstrdup("leak 1");             /* site:z_dup */
    keep[5] = zcalloc(48);                           /* site:z_calloc */
    other_function();
    keep[6] = create_client(1);
    keep[7] = create_client(2);
    zfree(zmalloc(33));
    printf("%zu\n", used_memory);
    return 0;
}
