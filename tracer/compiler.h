/*
 * tracer/compiler.h: the few compiler words every C file of mmleak uses, defined once.
 *
 * likely/unlikely: the hot path is one test whose failing side is the rare one; the branch
 * hints keep the common side straight-line.  COLD: a function the fast path calls only on
 * that rare side, kept out of line and out of the hot code's cache lines (noinline, cold).
 * HOT_INLINE: the fast path's helpers, always inlined into the interposed entry points, so
 * that the compiler sees one function per entry point, as if it were written by hand.
 * EXPORT: what another object may call (the interposed functions, mmleak_attach & co. in
 * mmleak.so, the ctypes API of mmleak-tools.so); everything else is hidden
 * (-fvisibility=hidden, and tracer/internal.h's pragma for the declarations).
 */
#ifndef MMLEAK_COMPILER_H
#define MMLEAK_COMPILER_H

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define COLD __attribute__((noinline, cold))
#define EXPORT __attribute__((visibility("default")))
#define HOT_INLINE static inline __attribute__((always_inline))

#endif
