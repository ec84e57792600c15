/* tests/test_unwind.py: the memo's check (tracer/memo.c) against the walk it remembers,
 * linked with tracer/unwind.c and tracer/memo.c directly.  A walk from a frame 16 calls deep
 * is kept with mml_memo_put (the first frames whose words fit a record), then looked up with
 * mml_memo_get both ways: for a stamp (the check without the words, which hashes a record's
 * words with one branch, on their number) and with the words (the general check).  Each must
 * hit with the value kept; then each word the walk read, changed in turn, and each pair of
 * different words swapped, must make both miss, and both hit again once the stack is
 * restored.  The same for the walk's first frames of at most 8 words, under another salt (a
 * short walk: the check hashes fewer words).  Prints "words N", "short N", "checks N" and
 * "ok", or "FAIL ..." and exits 1. */
#define _GNU_SOURCE
#include "../tracer/unwind.h"

#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))
#define VALUE 0x123456789abull
#define SALT 7

static int checks;

/* both lookups: 1 if both hit with VALUE and nf frames, 0 if both miss; else it fails */
static int both(const struct mml_start *s, unsigned salt, int nf, const char *what)
{
    uint64_t v1 = 0, v2 = 0;
    int f1 = 0, f2 = 0;
    struct mml_memo_hit hit;
    static struct mml_trail words;
    int a = mml_memo_get(s, salt, &v1, &f1, NULL, &hit);
    int b = mml_memo_get(s, salt, &v2, &f2, &words, NULL);
    checks++;
    if (a != b || (a && (v1 != VALUE || v2 != VALUE || f1 != nf || f2 != nf))) {
        printf("FAIL %s: stamp check %d (value %llx, %d frames), words check %d (%llx, %d)\n",
               what, a, (unsigned long long)v1, f1, b, (unsigned long long)v2, f2);
        exit(1);
    }
    return a;
}

static int check_walk(const struct mml_start *sp, unsigned gen, const struct mml_trail *tr,
                      int nf, unsigned salt);

static NOINLINE int probe(void)
{
    struct mml_start s = {(uintptr_t)__builtin_return_address(0),
                          (uintptr_t)__builtin_frame_address(0) + 16,
                          *(uintptr_t *)__builtin_frame_address(0)};
    static uintptr_t out[64];
    static struct mml_trail tr;
    /* the thread's stack as known from here: its lowest page is this frame's (a walk from
     * below what was known is not memoised) */
    mml_unwind_thread_init();
    unsigned gen = mml_memo_gen();
    int walked = mml_unwind_trail(&s, out, 16, &tr);     /* f0-f15: not into libc's frames */
    /* the most frames whose words fit a record without escapes, at least 21 words */
    int nf = 0;
    for (int k = 1; k <= walked && k < MML_TRAIL_FRAMES; k++)
        if (tr.upto[k] <= 28)
            nf = k;
    if (tr.bad || nf < 2 || tr.upto[nf] < 21) {
        printf("FAIL walk: %d frames, bad %d, %d frames in %d words\n", walked, tr.bad, nf,
               nf ? tr.upto[nf] : 0);
        exit(1);
    }
    printf("words %d\n", tr.upto[nf]);
    if (check_walk(&s, gen, &tr, nf, SALT))
        return 1;
    /* the first frames of at most 8 words */
    int ns = 0;
    for (int k = 1; k < nf; k++)
        if (tr.upto[k] <= 8)
            ns = k;
    if (ns < 1 || tr.upto[ns] < 2)
        return printf("FAIL walk: no first frames of 2 to 8 words\n"), 1;
    printf("short %d\n", tr.upto[ns]);
    return check_walk(&s, gen, &tr, ns, SALT + 1);
}

/* Keep the first nf frames of walk tr from s under salt, and check them as above. */
static int check_walk(const struct mml_start *sp, unsigned gen, const struct mml_trail *tr,
                      int nf, unsigned salt)
{
    struct mml_start s = *sp;
    int n = tr->upto[nf];
    mml_memo_put(&s, salt, gen, tr, nf, VALUE);
    if (!both(&s, salt, nf, "kept"))
        return printf("FAIL kept (%d words): both miss\n", n), 1;
    for (int i = 0; i < n; i++) {
        uintptr_t *p = (uintptr_t *)(s.sp + 8 * (uintptr_t)tr->off[i]);
        uintptr_t old = *p;
        *p = old ^ 0x100;
        __asm__ volatile("" ::: "memory");
        int h = both(&s, salt, nf, "changed");
        *p = old;
        __asm__ volatile("" ::: "memory");
        if (h)
            return printf("FAIL word %d (offset %d) changed: hit\n", i, tr->off[i]), 1;
        if (!both(&s, salt, nf, "restored"))
            return printf("FAIL word %d restored: miss\n", i), 1;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            uintptr_t *p = (uintptr_t *)(s.sp + 8 * (uintptr_t)tr->off[i]);
            uintptr_t *q = (uintptr_t *)(s.sp + 8 * (uintptr_t)tr->off[j]);
            uintptr_t x = *p, y = *q;
            if (x == y)
                continue;
            *p = y;
            *q = x;
            __asm__ volatile("" ::: "memory");
            int h = both(&s, salt, nf, "swapped");
            *p = x;
            *q = y;
            __asm__ volatile("" ::: "memory");
            if (h)
                return printf("FAIL words %d and %d swapped: hit\n", i, j), 1;
        }
    if (!both(&s, salt, nf, "end"))
        return printf("FAIL end: miss\n"), 1;
    return 0;
}

/* 16 frames above probe, with locals so that the saved registers and return addresses are
 * not all adjacent */
#define LEVEL(name, next)                                                                     \
    static NOINLINE int name(int x)                                                           \
    {                                                                                         \
        volatile int pad[3] = {x, x + 1, x + 2};                                              \
        int r = next;                                                                         \
        return r + pad[1] - x - 1;                                                            \
    }
LEVEL(f0, probe())
LEVEL(f1, f0(x + 1))
LEVEL(f2, f1(x + 1))
LEVEL(f3, f2(x + 1))
LEVEL(f4, f3(x + 1))
LEVEL(f5, f4(x + 1))
LEVEL(f6, f5(x + 1))
LEVEL(f7, f6(x + 1))
LEVEL(f8, f7(x + 1))
LEVEL(f9, f8(x + 1))
LEVEL(f10, f9(x + 1))
LEVEL(f11, f10(x + 1))
LEVEL(f12, f11(x + 1))
LEVEL(f13, f12(x + 1))
LEVEL(f14, f13(x + 1))
LEVEL(f15, f14(x + 1))

int main(void)
{
    if (f15(0))
        return 1;
    printf("checks %d\nok\n", checks);
    return 0;
}
