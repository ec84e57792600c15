/* tools/dumplines.h: the one reader of a dump file's lines (mmleak-format(5), "The dump
 * format"): how the bytes of a dump file or result, read in chunks, become lines.  The
 * shrink engine (tools/shrink_read.c), the scan's live set (tools/scan_live.c) and the
 * levels' pick (tools/levels.c) read through it, so that they agree on every rule:
 *
 *  - a line is an event line only when it ends with its newline (the handler parses it);
 *  - a run of NUL bytes is padding wherever it is: it ends the text before it (DL_TORN, or
 *    DL_NULS when that text is empty or spaces), the next line starts right after it (under
 *    the same number), and that line is a piece whose start a hole took (DL_CUT_START) when
 *    it parses as an event whose pointer has fewer than 12 digits;
 *  - a line longer than MMLEAK_LINE_MAX keeps its first DL_HEAD bytes and its rest is
 *    skipped (DL_TOO_LONG when its newline ends it), so memory stays bounded;
 *  - the last text of the input without its newline is not an event: DL_TORN_LAST (a '#'
 *    line), DL_PADDING_END (spaces only) or DL_TORN;
 *  - a complete line of ASCII whitespace only is padding too (dl_blank: the handler of a
 *    line that is not an event asks it).
 *
 * Use: a struct dumplines zeroed per input; each chunk read goes right after the D.have bytes
 * of the line not ended yet (at most MMLEAK_LINE_MAX), and dl_chunk reads its lines, handing
 * each complete one to LINE and everything else to ODD (the DL_* it is, the line number, its
 * first bytes), and returns where the line not ended yet starts (D.have bytes there: the
 * caller keeps them before the next chunk), or NULL when a handler returned nonzero (stop).
 * dl_hole: a run of NULs the caller did not read (a hole of a sparse file); dl_end: the input
 * ended.  The handlers are inline functions given by name: dl_chunk is always inlined, so
 * that the caller's parser and state update stay inlined in its loop (as they were when each
 * reader had a loop of its own).  No allocation, no syscall, no stdio. */
#ifndef MMLEAK_DUMPLINES_H
#define MMLEAK_DUMPLINES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "../tracer/compiler.h"
#include "eventline.h"
#include "facts.h"

#define DL_LINE_MAX ((size_t)MMLEAK_LINE_MAX)   /* facts.h: mmleaklib/facts.py's bound */
#define DL_HEAD 80                              /* what is kept of a line too long */

/* What a piece that is not a complete line is (the shrink's problem numbers, Q_* of
 * tools/shrink_int.h, are these). */
enum {
    DL_TORN = 1,            /* text cut by NULs, or the last text without its newline */
    DL_TORN_LAST = 2,       /* a '#' line without its newline, at the end */
    DL_PADDING_END = 3,     /* spaces without a newline, at the end */
    DL_NULS = 4,            /* a run of NULs after no text, or after spaces only */
    DL_TOO_LONG = 5,        /* a line longer than MMLEAK_LINE_MAX, ended by its newline */
    DL_CUT_START = 7,       /* the end of a line whose start a run of NULs took */
};

struct dumplines {
    uint64_t lineno;        /* the lines ended by their newline so far */
    size_t have;            /* the bytes of the line not ended yet (before the next chunk) */
    int skip;               /* in a line too long: its rest is skipped up to its end */
    int in_nul;             /* in a run of NULs */
    int after_nul;          /* the next line starts right after a run of NULs */
    char head[DL_HEAD];     /* a line too long: its first bytes */
};

/* A line of ASCII whitespace only (N bytes at P): padding (Python's bytes.strip() empties
 * it: spaces, tabs, CR, LF, VT, FF). */
static inline int dl_blank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f')
            return 0;
    }
    return 1;
}

/* Spaces only (N bytes at P; none is spaces only too). */
static inline int dl_spaces(const char *p, size_t n)
{
    size_t i = 0;
    while (i < n && p[i] == ' ')
        i++;
    return i == n;
}

/* Text cut by a run of NULs (N bytes at P): DL_NULS when there is none or only spaces. */
static inline int dl_cut_kind(const char *p, size_t n)
{
    return dl_spaces(p, n) ? DL_NULS : DL_TORN;
}

/* The last text of the input, without its newline (N > 0 bytes at P). */
static inline int dl_last_kind(const char *p, size_t n)
{
    return p[0] == '#' ? DL_TORN_LAST : dl_spaces(p, n) ? DL_PADDING_END : DL_TORN;
}

/* A line ended by its newline right after a run of NULs: an event line whose pointer has
 * fewer than 12 digits (mmleak.so writes at least 12) is the end of a line whose start the
 * run took. */
static __attribute__((cold, noinline, unused)) int dl_cut_start(const char *p)
{
    uint64_t a, b, c, d;
    if (event_fields(p, &a, &b, &c, &d) < 0)
        return 0;
    const char *sp = memchr(p, ' ', 17);
    return sp && sp - p < 12;
}

/* The first newline or NUL in [P, LIM), or NULL. */
static inline const char *dl_line_end(const char *p, const char *lim)
{
    const char *nl = memchr(p, '\n', (size_t)(lim - p));
    const char *z = memchr(p, 0, (size_t)((nl ? nl : lim) - p));
    return z ? z : nl;
}

/* The first newline in [P, LIM), or NULL: memchr's, inline for lines of a few dozen bytes. */
static inline const char *dl_newline(const char *p, const char *lim)
{
#if defined(__x86_64__)
    const __m128i newline = _mm_set1_epi8('\n');
    for (; lim - p >= 16; p += 16) {
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(
            _mm_loadu_si128((const __m128i *)(const void *)p), newline));
        if (m)
            return p + __builtin_ctz(m);
    }
#endif
    return memchr(p, '\n', (size_t)(lim - p));
}

/* dl_chunk's handlers: LINE(CTX, LINENO, P, N): a line ended by its newline (N bytes at P,
 * the newline included, N <= MMLEAK_LINE_MAX + 1); ODD(CTX, WHAT, LINENO, P, N): a DL_*
 * piece (its first N bytes at P); START(CTX, P, LIM, NULS): the lines of [P, LIM) are next
 * (NULS: there is a NUL among them).  Each returns nonzero to stop (START: nothing). */
typedef int (*dl_line_fn)(void *ctx, uint64_t lineno, const char *p, size_t n);
typedef int (*dl_odd_fn)(void *ctx, int what, uint64_t lineno, const char *p, size_t n);
typedef void (*dl_start_fn)(void *ctx, const char *p, const char *lim, int nuls);

/* A line too long (its head kept in D) ended by END: its newline, a NUL (or a hole: 0), or
 * the end of the input (-1). */
static inline int dl_long(struct dumplines *d, void *ctx, dl_odd_fn odd, uint64_t lineno,
                          int end)
{
    int what = end == '\n' ? DL_TOO_LONG : end < 0 && d->head[0] == '#' ? DL_TORN_LAST :
               DL_TORN;
    return odd(ctx, what, lineno, d->head, DL_HEAD);
}

/* The chunk [P, LIM): P starts with the D->have bytes of the line not ended yet (no NUL
 * among them).  Returns where the line not ended yet starts now (D->have bytes), or NULL
 * (a handler stopped). */
static inline __attribute__((always_inline)) const char *
dl_chunk(struct dumplines *d, const char *p, const char *lim, void *ctx, dl_start_fn start,
         dl_line_fn line, dl_odd_fn odd)
{
    const char *q = p + d->have;
    uint64_t lineno = d->lineno;
    int after_nul = d->after_nul, in_nul = d->in_nul;
    d->have = 0;
    if (d->skip) {                      /* the rest of a line too long, up to its end */
        const char *t = dl_line_end(q, lim);
        if (!t)
            return lim;
        if (*t == '\n')
            lineno++;
        d->skip = 0;
        in_nul = after_nul = !*t;
        d->lineno = lineno;
        if (dl_long(d, ctx, odd, *t ? lineno : lineno + 1, *t))
            goto stop;
        p = q = t + 1;
    }
    if (in_nul) {                       /* a run of NULs that goes on */
        while (q < lim && !*q)
            q++;
        p = q;
        if (q == lim)
            goto out;
        in_nul = 0;
    }
    /* NULs are looked for only in a chunk that has some (they are rare) */
    int nuls = memchr(q, 0, (size_t)(lim - q)) != NULL;
    start(ctx, p, lim, nuls);
    const char *t;
    while ((t = nuls ? dl_line_end(q, lim) : dl_newline(q, lim)) != NULL) {
        size_t n = (size_t)(t - p);     /* the text, without what ended it */
        if (likely(*t == '\n')) {
            int s;
            lineno++;
            if (unlikely(after_nul)) {
                after_nul = 0;
                if (n <= DL_LINE_MAX && dl_cut_start(p)) {
                    s = odd(ctx, DL_CUT_START, lineno, p, n + 1);
                    p = q = t + 1;
                    if (s)
                        goto stop;
                    continue;
                }
            }
            if (unlikely(n > DL_LINE_MAX))
                s = odd(ctx, DL_TOO_LONG, lineno, p, DL_HEAD);
            else
                s = line(ctx, lineno, p, n + 1);
            p = q = t + 1;
            if (unlikely(s))
                goto stop;
            continue;
        }
        /* text cut by a run of NULs: the line goes on after the run, under the same number */
        int s = n > DL_LINE_MAX ? odd(ctx, DL_TORN, lineno + 1, p, DL_HEAD) :
                odd(ctx, dl_cut_kind(p, n), lineno + 1, p, n);
        while (++t < lim && !*t)
            ;
        in_nul = t == lim;
        after_nul = 1;
        p = q = t;
        if (s)
            goto stop;
    }
    d->have = (size_t)(lim - p);
    if (d->have > DL_LINE_MAX) {        /* too long: keep its head, skip the rest */
        memcpy(d->head, p, DL_HEAD);
        d->skip = 1;
        d->have = 0;
        p = lim;
    }
out:
    d->lineno = lineno;
    d->in_nul = in_nul;
    d->after_nul = after_nul;
    return p;
stop:
    d->lineno = lineno;
    d->in_nul = in_nul;
    d->after_nul = after_nul;
    return NULL;
}

/* A run of NULs the caller skipped unread (a hole of a sparse file), after the D->have
 * bytes at P.  Nonzero: a handler stopped. */
static inline int dl_hole(struct dumplines *d, const char *p, void *ctx, dl_odd_fn odd)
{
    int s = 0;
    if (d->skip)
        s = dl_long(d, ctx, odd, d->lineno + 1, 0);
    else if (!d->in_nul)
        s = odd(ctx, dl_cut_kind(p, d->have), d->lineno + 1, p, d->have);
    d->skip = 0;
    d->have = 0;
    d->in_nul = d->after_nul = 1;
    return s;
}

/* The end of the input, after the D->have bytes at P: the last line without its newline.
 * (Of a '#' line, no byte is shown: it is the start of a header, not an event.) */
static inline int dl_end(struct dumplines *d, const char *p, void *ctx, dl_odd_fn odd)
{
    if (d->skip) {
        d->skip = 0;
        return dl_long(d, ctx, odd, ++d->lineno, -1);
    }
    if (!d->have)
        return 0;
    int what = dl_last_kind(p, d->have);
    size_t n = d->have;
    d->have = 0;
    return odd(ctx, what, ++d->lineno, p, what == DL_TORN_LAST ? 0 : n);
}

#endif
