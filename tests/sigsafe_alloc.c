/* An allocator that is safe to call from a signal handler (a lock-free bump pointer, free
 * does nothing), preloaded *behind* mmleak.so by tests/test_tracer.py: glibc's malloc would
 * deadlock when a handler interrupts it, this one cannot, so the test exercises only
 * mmleak's own behaviour when a handler records events in the middle of ours. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define ARENA (1ull << 30)
static char *_Atomic base;
static _Atomic size_t used;

static char *arena(void)
{
    char *b = atomic_load(&base);
    if (!b) {
        char *m = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                       MAP_NORESERVE, -1, 0);
        char *expected = NULL;
        if (!atomic_compare_exchange_strong(&base, &expected, m)) {
            munmap(m, ARENA);
            m = expected;
        }
        b = m;
    }
    return b;
}

/* Internal calls go straight here, never through the PLT: a PLT call would reach mmleak's
 * memalign again and record the block twice. */
static void *bump(size_t al, size_t n)
{
    if (al < 16)
        al = 16;
    size_t need = n + al + 16, off = atomic_fetch_add(&used, (need + 15) & ~(size_t)15);
    if (off + need > ARENA)
        return NULL;
    uintptr_t p = ((uintptr_t)arena() + off + 16 + al - 1) & ~(uintptr_t)(al - 1);
    memcpy((char *)p - 16, &n, sizeof n);
    return (void *)p;
}

void *memalign(size_t al, size_t n) { return bump(al, n); }
void *malloc(size_t n) { return bump(16, n); }
void free(void *p) { (void)p; }
void *calloc(size_t k, size_t n) { return bump(16, k * n); }   /* the arena is zeroed memory */
void *aligned_alloc(size_t al, size_t n) { return bump(al, n); }
void *valloc(size_t n) { return bump(4096, n); }
void *pvalloc(size_t n) { return bump(4096, (n + 4095) & ~(size_t)4095); }
int posix_memalign(void **out, size_t al, size_t n)
{
    *out = bump(al, n);
    return *out ? 0 : 12;
}
void *realloc(void *old, size_t n)
{
    void *p = bump(16, n);
    if (p && old) {
        size_t k;
        memcpy(&k, (char *)old - 16, sizeof k);
        memcpy(p, old, k < n ? k : n);
    }
    return p;
}
