/* Part of bench/unwind_bench.c: a chain of 12 distinct functions (CHAIN and its levels 1-11)
 * down to a callback, compiled twice: without frame pointers (CHAIN=chain_nofp) and with them
 * (CHAIN=chain_fp). */
#ifndef CHAIN
#define CHAIN chain_nofp
#endif
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define NOINLINE __attribute__((noinline))

typedef long (*chain_cb)(void);
static volatile int csink;

/* each level keeps a local array of a different size, so the frames differ */
#define LEVEL(N, NEXT)                                                                        \
    static NOINLINE long CAT(CHAIN, N)(chain_cb cb)                                           \
    {                                                                                         \
        volatile char pad[8 * (N) + 8];                                                       \
        pad[0] = (char)N;                                                                     \
        long r = NEXT;                                                                        \
        return r + pad[0] + csink;                                                            \
    }

LEVEL(11, cb())
LEVEL(10, CAT(CHAIN, 11)(cb))
LEVEL(9, CAT(CHAIN, 10)(cb))
LEVEL(8, CAT(CHAIN, 9)(cb))
LEVEL(7, CAT(CHAIN, 8)(cb))
LEVEL(6, CAT(CHAIN, 7)(cb))
LEVEL(5, CAT(CHAIN, 6)(cb))
LEVEL(4, CAT(CHAIN, 5)(cb))
LEVEL(3, CAT(CHAIN, 4)(cb))
LEVEL(2, CAT(CHAIN, 3)(cb))
LEVEL(1, CAT(CHAIN, 2)(cb))

long CHAIN(chain_cb cb);
NOINLINE long CHAIN(chain_cb cb) { return CAT(CHAIN, 1)(cb) + csink; }
