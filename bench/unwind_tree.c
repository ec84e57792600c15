/* Part of bench/unwind_bench.c: many distinct call paths.  256 functions, each with 16 call
 * sites (one per value of a 4-bit digit of the path number) calling 16 different functions:
 * 4096 distinct return addresses; a path of depth D goes through D of them.  Compiled
 * -O2 -fomit-frame-pointer. */
#define NOINLINE __attribute__((noinline))

typedef long (*tree_fn)(unsigned long path, int level);
long tree_leaf(void); /* in unwind_bench.c: the capture */
tree_fn tree_tab[256];
static volatile int tsink;

#define CASE(I, K)                                                                            \
    case K:                                                                                   \
        r = tree_tab[((I) * 7 + (K) * 13 + 1) & 255](path, level - 1);                       \
        return r + K + tsink;
#define CASES(I)                                                                              \
    CASE(I, 0) CASE(I, 1) CASE(I, 2) CASE(I, 3) CASE(I, 4) CASE(I, 5) CASE(I, 6) CASE(I, 7)  \
    CASE(I, 8) CASE(I, 9) CASE(I, 10) CASE(I, 11) CASE(I, 12) CASE(I, 13) CASE(I, 14)        \
    CASE(I, 15)
#define FN(H, K) FN_(tree_##H##_##K, ((H) - 1) * 16 + (K))
#define FN_(NAME, I)                                                                          \
    static NOINLINE long NAME(unsigned long path, int level)                                  \
    {                                                                                         \
        volatile char pad[((I) % 5) * 16 + 8];                                                \
        pad[0] = (char)level;                                                                 \
        long r;                                                                               \
        if (level <= 0)                                                                       \
            return tree_leaf() + pad[0];                                                      \
        switch ((path >> ((level & 15) * 4)) & 15) { CASES(I) }                               \
        return pad[0];                                                                        \
    }
#define FN16(H)                                                                               \
    FN(H, 0) FN(H, 1) FN(H, 2) FN(H, 3) FN(H, 4) FN(H, 5) FN(H, 6) FN(H, 7) FN(H, 8)          \
    FN(H, 9) FN(H, 10) FN(H, 11) FN(H, 12) FN(H, 13) FN(H, 14) FN(H, 15)
FN16(1) FN16(2) FN16(3) FN16(4) FN16(5) FN16(6) FN16(7) FN16(8) FN16(9) FN16(10) FN16(11)
FN16(12) FN16(13) FN16(14) FN16(15) FN16(16)

#define TAB(H)                                                                                \
    tree_##H##_0, tree_##H##_1, tree_##H##_2, tree_##H##_3, tree_##H##_4, tree_##H##_5,       \
    tree_##H##_6, tree_##H##_7, tree_##H##_8, tree_##H##_9, tree_##H##_10, tree_##H##_11,     \
    tree_##H##_12, tree_##H##_13, tree_##H##_14, tree_##H##_15
static const tree_fn all[256] = {TAB(1), TAB(2), TAB(3), TAB(4), TAB(5), TAB(6), TAB(7),
                                 TAB(8), TAB(9), TAB(10), TAB(11), TAB(12), TAB(13), TAB(14),
                                 TAB(15), TAB(16)};

void tree_init(void);
void tree_init(void)
{
    for (int i = 0; i < 256; i++)
        tree_tab[i] = all[i];
}

long tree_run(unsigned long path, int depth);
NOINLINE long tree_run(unsigned long path, int depth)
{
    return tree_tab[path & 255](path, depth - 1) + tsink;
}
