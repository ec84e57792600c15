/*
 * tracer/line.h: the layout of an event line, and every writer of one.
 *
 *   allocation  PTR SEQ SIZE TIME CALLER      (one frame)
 *               PTR SEQ SIZE TIME @ID         (a stack, defined once per file by "#s ID FRAME...")
 *   free        PTR SEQ CALLER
 * PTR and CALLER: 12 hex digits (user-space addresses have 48 bits: platform.h), wider only when
 * they are; SEQ, SIZE, TIME: hex, minimal width; ID: 16 hex digits.  mmleak-format(5)
 * (docs/format.rst) specifies it.
 *
 * The fast writers (put_alloc_fields, put_free_fields) take values that fit (SEQ, SIZE, TIME
 * below 2^32, addresses below 2^48): they convert pairs of 64-bit groups at once (SSE2, or
 * SWAR bytes without it) and store whole words, each store writing a few bytes past its
 * field, which the next field's store overwrites; the last field of a line is stored exactly,
 * since a signal handler's line may already follow it.  The reader of a staging half sees a
 * line only once its newline is there (record.h stores it last).
 */
#ifndef MMLEAK_LINE_H
#define MMLEAK_LINE_H

#include <stdint.h>
#include <string.h>

#include "compiler.h"
#include "facts.h"

#if defined(__SSE2__)
#include <emmintrin.h>
/* Sixteen nibbles (one per byte) as hex digits: add '0', and 'a'-'0'-10 where the nibble is
 * above 9. */
HOT_INLINE __m128i hex_ascii(__m128i nib)
{
    __m128i over9 = _mm_cmpgt_epi8(nib, _mm_set1_epi8(9));
    return _mm_add_epi8(_mm_add_epi8(nib, _mm_set1_epi8('0')),
                        _mm_and_si128(over9, _mm_set1_epi8('a' - '0' - 10)));
}

/* Sixteen hex digits of v, most significant first: split the bytes into nibbles, interleave
 * them, and make digits of them.  About ten SSE2 instructions, all x86-64 CPUs have them. */
HOT_INLINE __m128i hex16(uint64_t v)
{
    __m128i x = _mm_cvtsi64_si128((long long)__builtin_bswap64(v));
    __m128i m = _mm_set1_epi8(0x0f);
    return hex_ascii(_mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi64(x, 4), m),
                                       _mm_and_si128(x, m)));
}

/* The sixteen digits of a and those of b at once: the nibbles of both split in one register,
 * which costs little more than one hex16.  A line's fields are packed into pairs of such
 * 64-bit groups (put_alloc_fields, put_free_fields), so that an allocation line takes two conversions, not
 * five, and a free line one and a half (measured: the formatting of the fast path went from
 * 3.8 ns per event, found by writing constant text instead, to about half of that). */
HOT_INLINE void hex32(uint64_t a, uint64_t b, __m128i *ra, __m128i *rb)
{
    __m128i x = _mm_set_epi64x((long long)__builtin_bswap64(b), (long long)__builtin_bswap64(a));
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i hi = _mm_and_si128(_mm_srli_epi64(x, 4), m), lo = _mm_and_si128(x, m);
    *ra = hex_ascii(_mm_unpacklo_epi8(hi, lo));
    *rb = hex_ascii(_mm_unpackhi_epi8(hi, lo));
}

/* v < 2^32 as the minimal-width digits, left-aligned in 32 bits (n = ndig(v)): converted in
 * a group of 8 digits, its first n are the number. */
HOT_INLINE uint64_t left32(uint32_t v, unsigned n)
{
    return (uint64_t)(uint32_t)(v << (32 - 4 * n));
}

HOT_INLINE void store8(char *d, __m128i r)
{
    _mm_storel_epi64((__m128i *)(void *)d, r);
}

HOT_INLINE void store8_high(char *d, __m128i r)
{
    _mm_storel_epi64((__m128i *)(void *)d, _mm_unpackhi_epi64(r, r));
}

/* Exactly the first 12 digits of r: the last field of a line must not spill past its
 * newline (a signal handler's line may already follow it). */
HOT_INLINE void store12(char *d, __m128i r)
{
    _mm_storel_epi64((__m128i *)(void *)d, r);
    uint32_t w = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(r, 8));
    memcpy(d + 8, &w, 4);
}

/* An allocation line's fields, "PTR SEQ SIZE TIME CALLER" (without the newline), at d: two
 * pairs of groups, (PTR, SEQ|SIZE) and (TIME, CALLER).  Every store but the last writes up to
 * 8 bytes past its field, inside the line, and the next field's store overwrites them. */
HOT_INLINE char *put_alloc_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint32_t n,
                                  unsigned nn, uint32_t now, unsigned nt, uint64_t c)
{
    __m128i r0, r1, r2, r3;
    hex32(p << 16, (left32(s, ns) << 32) | left32(n, nn), &r0, &r1);
    hex32(left32(now, nt) << 32, c << 16, &r2, &r3);
    _mm_storeu_si128((__m128i *)(void *)d, r0);
    d[12] = ' ';
    d += 13;
    store8(d, r1);
    d += ns;
    *d++ = ' ';
    store8_high(d, r1);
    d += nn;
    *d++ = ' ';
    store8(d, r2);
    d += nt;
    *d++ = ' ';
    store12(d, r3);
    return d + 12;
}

/* A free line's fields, "PTR SEQ CALLER": one pair (PTR, CALLER) and SEQ alone. */
HOT_INLINE char *put_free_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint64_t c)
{
    __m128i r0, r1;
    hex32(p << 16, c << 16, &r0, &r1);
    _mm_storeu_si128((__m128i *)(void *)d, r0);
    d[12] = ' ';
    d += 13;
    store8(d, hex16(left32(s, ns) << 32));
    d += ns;
    *d++ = ' ';
    store12(d, r1);
    return d + 12;
}

/* 12 digits, zero padded: the width of every user-space address on x86-64.  Exactly 12
 * bytes are stored (the last field of a line must not spill past its newline). */
HOT_INLINE char *put_hex12(char *d, uint64_t v)
{
    __m128i r = hex16(v << 16);
    _mm_storel_epi64((__m128i *)(void *)d, r);
    uint32_t w = (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(r, 8));
    memcpy(d + 8, &w, 4);
    return d + 12;
}

/* Minimal-width hex for v < 2^32; stores 8 bytes, returns the end of the digits. */
HOT_INLINE char *put_hexv(char *d, uint32_t v, unsigned n)
{
    _mm_storel_epi64((__m128i *)(void *)d, hex16((uint64_t)v << (64 - 4 * n)));
    return d + n;
}
#else
/* Portable version: eight hex digits of x as eight ASCII bytes, most significant first in
 * memory (SWAR: spread the nibbles into bytes, then add '0', and 'a'-'0'-10 above 9). */
HOT_INLINE uint64_t hex8(uint32_t x)
{
    uint64_t v = x;
    v = (v | (v << 16)) & 0x0000FFFF0000FFFFull;
    v = (v | (v << 8)) & 0x00FF00FF00FF00FFull;
    v = (v | (v << 4)) & 0x0F0F0F0F0F0F0F0Full;
    v = __builtin_bswap64(v);
    uint64_t letters = ((v + 0x0606060606060606ull) >> 4) & 0x0101010101010101ull;
    return v + 0x3030303030303030ull + letters * 0x27;
}

HOT_INLINE char *put_hex12(char *d, uint64_t v)
{
    uint32_t hi = (uint32_t)(hex8((uint32_t)(v >> 32)) >> 32);
    uint64_t lo = hex8((uint32_t)v);
    memcpy(d, &hi, 4);
    memcpy(d + 4, &lo, 8);
    return d + 12;
}

HOT_INLINE char *put_hexv(char *d, uint32_t v, unsigned n)
{
    uint64_t w = hex8(v << (32 - 4 * n));
    memcpy(d, &w, 8);
    return d + n;
}

#endif

/* "PTR SEQ SIZE TIME " field by field: the stack reference's (put_ref_fields below), and the
 * portable allocation line's. */
HOT_INLINE char *put_head_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint32_t n,
                                 unsigned nn, uint32_t now, unsigned nt)
{
    d = put_hex12(d, p);
    *d++ = ' ';
    d = put_hexv(d, s, ns);
    *d++ = ' ';
    d = put_hexv(d, n, nn);
    *d++ = ' ';
    d = put_hexv(d, now, nt);
    *d++ = ' ';
    return d;
}

#if !defined(__SSE2__)
HOT_INLINE char *put_alloc_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint32_t n,
                                  unsigned nn, uint32_t now, unsigned nt, uint64_t c)
{
    return put_hex12(put_head_fields(d, p, s, ns, n, nn, now, nt), c);
}

HOT_INLINE char *put_free_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint64_t c)
{
    d = put_hex12(d, p);
    *d++ = ' ';
    d = put_hexv(d, s, ns);
    *d++ = ' ';
    return put_hex12(d, c);
}
#endif

/* Hex digits of v < 2^32 (at least one). */
HOT_INLINE unsigned ndig(uint32_t v)
{
    return (32 - (unsigned)__builtin_clz(v | 1) + 3) >> 2;
}

/* The bytes of each kind of line, newline included, from the widths of SEQ, SIZE and TIME */
#define ALLOC_LINE_LEN(ns, nn, nt) (12 + 1 + (ns) + 1 + (nn) + 1 + (nt) + 1 + 12 + 1)
#define REF_LINE_LEN(ns, nn, nt) (12 + 1 + (ns) + 1 + (nn) + 1 + (nt) + 1 + 1 + STACK_ID_DIGITS + 1)
#define FREE_LINE_LEN(ns) (12 + 1 + (ns) + 1 + 12 + 1)

/* A stack's id (stacks.c) has STACK_ID_BITS bits, written as STACK_ID_DIGITS digits: "@ID"
 * takes the 12 bytes of a caller's address, so a line with a whole stack is no longer than
 * one with its caller alone. */
#define STACK_ID_BITS 44
#define STACK_ID_DIGITS 11

/* An allocation line with a stack's id instead of the caller, "PTR SEQ SIZE TIME @ID": the
 * id's 12 digits (the first one 0: id < 2^44), that 0 then replaced by the '@'.  With SSE2,
 * converted in two pairs of groups like put_alloc_fields' line, the id in the caller's place. */
_Static_assert(STACK_ID_BITS <= 44, "an id is 11 hex digits, the 12th (first) one is 0");
HOT_INLINE char *put_ref_fields(char *d, uint64_t p, uint32_t s, unsigned ns, uint32_t n,
                                unsigned nn, uint32_t now, unsigned nt, uint64_t id)
{
#if defined(__SSE2__)
    d = put_alloc_fields(d, p, s, ns, n, nn, now, nt, id);
#else
    d = put_head_fields(d, p, s, ns, n, nn, now, nt);
    d = put_hex12(d, id);
#endif
    d[-12] = '@';
    return d;
}

/* ---- the general writers: any values, into a buffer (not the staging half) ----
 * For the events the fast path does not write: with a stack, or with a value too wide for
 * the fast writers (a block of 4 GiB or more, a sequence number or a time past 2^32, an
 * address past 2^48, a frame tagged with its epoch).  The same fields, the same writers when
 * the values fit; digit by digit (hexw) when they do not.  The buffer must have room for the
 * whole line and for the 8 bytes a fast writer may store past a field. */

/* Any value, at least WIDTH digits (zero padded). */
static inline char *hexw(char *d, uint64_t v, int width)
{
    static const char hx[] = "0123456789abcdef";
    char b[16];
    int n = 0;
    do { b[n++] = hx[v & 15]; v >>= 4; } while (v);
    while (n < width)
        b[n++] = '0';
    while (n)
        *d++ = b[--n];
    return d;
}

/* "PTR SEQ " of the general writers when a value does not fit the fast ones */
static inline char *put_head_wide(char *d, uint64_t p, uint64_t s)
{
    d = hexw(d, p, 12);
    *d++ = ' ';
    d = hexw(d, s, 1);
    *d++ = ' ';
    return d;
}

/* "PTR SEQ SIZE TIME CALLER", or "PTR SEQ SIZE TIME @ID" when ID is not 0 (without the
 * newline). */
static inline char *put_alloc_line(char *d, uint64_t p, uint64_t s, uint64_t n, uint64_t now,
                                   uint64_t c, uint64_t id)
{
    if (!((s | n | now) >> 32) && !((p | (id ? 0 : c)) >> 48)) {
        unsigned ns = ndig((uint32_t)s), nn = ndig((uint32_t)n), nt = ndig((uint32_t)now);
        return id ? put_ref_fields(d, p, (uint32_t)s, ns, (uint32_t)n, nn, (uint32_t)now, nt, id)
                  : put_alloc_fields(d, p, (uint32_t)s, ns, (uint32_t)n, nn, (uint32_t)now, nt,
                                     c);
    }
    d = put_head_wide(d, p, s);
    d = hexw(d, n, 1);
    *d++ = ' ';
    d = hexw(d, now, 1);
    *d++ = ' ';
    if (!id)
        return hexw(d, c, 12);
    *d++ = '@';
    return hexw(d, id, STACK_ID_DIGITS);
}

/* "PTR SEQ CALLER" (without the newline). */
static inline char *put_free_line(char *d, uint64_t p, uint64_t s, uint64_t c)
{
    if (!(s >> 32) && !((p | c) >> 48))
        return put_free_fields(d, p, (uint32_t)s, ndig((uint32_t)s), c);
    return hexw(put_head_wide(d, p, s), c, 12);
}

/* "#s ID FRAME..." (without the newline): a stack, once per file; FRAME: a return address
 * minus 1, inside the call instruction, which names the calling line.  The id always has
 * STACK_ID_DIGITS digits, as in the references to it. */
static inline char *put_stack_def(char *d, uint64_t id, const uintptr_t *f, int nf)
{
    memcpy(d, "#s ", 3);
    d = hexw(d + 3, id, STACK_ID_DIGITS);
    for (int i = 0; i < nf; i++) {
        *d++ = ' ';
        d = hexw(d, f[i] - 1, 1);
    }
    return d;
}

/* Room for a stack's definition and its first reference: what the general path builds */
#define STACK_LINES_MAX (40 + 17 * MMLEAK_MAX_DEPTH + 96)


#endif
