/* tracer/unwind.c: a fast, cached DWARF CFI stack unwinder for mmleak.so (x86-64, glibc >= 2.35).
 * API and contract: unwind.h.
 *
 * How it works
 * ------------
 * A frame is (ip, sp, bp): a pc, the stack pointer and rbp of that frame.  Stepping to the
 * caller needs the rule of the pc: where the CFA (the caller's sp) is, the return address is
 * always at CFA-8 on x86-64, and where the caller's rbp was saved.  The rule is looked up at
 * x = ip - 1 for a return address (the call instruction), at x = ip for an interrupted pc (the
 * frame after a signal frame), exactly as libgcc does.
 *
 *  - Cache: a table of 2^16 64-bit words in .bss (512 KiB), shared by all threads, keyed by
 *    the return address, one slot per 8 bytes of code (see "the cache" below): an entry holds
 *    the rule and enough bits of the key that, with its slot, it can only match the address
 *    it was made for.  Entries are
 *    read and written with single 64-bit relaxed atomic accesses: a racing writer can
 *    overwrite a slot (a later miss) but never produce a word that matches another address
 *    with a wrong rule.  A hit costs one load and a compare; the walk is then a chain of
 *    dependent loads (return address, cache entry, next return address).
 *  - Miss: _dl_find_object (lock-free, async-signal-safe) gives the object and its
 *    PT_GNU_EH_FRAME (.eh_frame_hdr); binary search of its sorted table gives the FDE; the
 *    CIE's and the FDE's CFA programs run up to x (DW_CFA_remember/restore_state, advance_loc,
 *    def_cfa*, offset*, restore*, register, expression ... are interpreted; DWARF expressions
 *    are evaluated symbolically in rsp, rbp and the CFA, with rip a constant).  The result is
 *    one of: CFA = rsp + off; CFA = rbp + off; CFA = *(rbp + off) (gcc's DRAP, stack
 *    realignment); signal frame (CIE augmentation 'S' with the kernel's ucontext layout:
 *    rip/rsp/rbp are read back from the ucontext at sp); stop.  The caller's rbp: unchanged,
 *    at CFA + k, at *(rbp + k) (DRAP), or lost (then a later frame that needs rbp stops the
 *    walk).  The PLT's CFA expression (rsp + 8 + 8 * ((rip & 15) >= 11)) is evaluated for the
 *    exact pc; such rip-dependent results are not cached.
 *  - Stops: no object (JIT, anonymous code: not cached, so code mapped there later is seen),
 *    no FDE covering x, return address undefined (_start, clone3) or not at CFA-8, a CFA not
 *    in rsp/rbp, an unknown expression, a return address of 0, a CFA that does not move up the
 *    stack, a read outside the known stack.
 *  - Memo (mml_memo_get/put, tracer/memo.c): a whole walk, remembered by its start and a
 *    hash of the stack words it read, is not made again while those words are unchanged;
 *    checking that costs independent loads instead of the walk's chain.
 *
 * Memory safety
 * -------------
 * Reads of .eh_frame data: inside the object _dl_find_object returned for x, where x is a pc of
 * a live frame of the calling thread, so the object cannot be unloaded during the walk unless
 * the program itself is running code of an object it is unloading.  Table and FDE pointers are
 * checked to stay inside the object's mapping [dlfo_map_start, dlfo_map_end) or, when its
 * .eh_frame_hdr is outside that (a program whose segments are mapped apart), inside the
 * segment of the same object that holds it (eh_span).
 *
 * Reads of the stack: every read is checked against the segment the walk is on:
 *  - the thread's own stack [lo, hi), known per thread (TLS, initial-exec): hi is the thread
 *    descriptor (glibc puts struct pthread and the static TLS at the top of every thread's
 *    stack block, also of user-supplied stacks) or, for the initial thread, the end of the page
 *    of AT_EXECFN (the strings at the top of [stack]); lo is the page of the stack pointer when
 *    the bounds were learnt, moved down when the stack has grown.  Both are verified: the pages
 *    in between must be readable (probe below).  A stack only grows below lo contiguously, so
 *    a deeper sp is accepted after probing the pages between it and lo (the initial thread's
 *    [stack] VMA has the kernel's stack guard gap below it, a pthread stack its guard page, so
 *    another mapping cannot be reached this way unless it was placed with MAP_FIXED right below
 *    the stack or the thread has no guard page);
 *  - the alternate signal stack, if the walk (or a signal frame it crosses) is on it: its
 *    bounds from sigaltstack();
 *  - any other stack (makecontext/swapcontext, hand-made coroutine stacks): pages are probed
 *    on demand during the walk, from the page of its sp up, at most 256 KiB per walk;
 *  - the probe: process_vm_readv() on the process itself, one byte of each page (a partial
 *    read tells where the first unreadable page is); if /proc/self/status shows a seccomp
 *    filter (where the call could kill the process) or it fails, /proc/self/maps is parsed
 *    instead (slow: only for the rare paths above); if neither works, a thread's own stack is
 *    trusted from the glibc layout alone and other stacks stop the walk.
 *
 * Not handled (the walk stops there, as documented): frames whose CFA is in a register other
 * than rsp/rbp (hand-written asm), JIT frames (registered with __register_frame or not),
 * signal trampolines other than glibc's __restore_rt (libgcc recognises their code bytes;
 * we do not read code), objects without PT_GNU_EH_FRAME or with an unsorted .eh_frame_hdr are
 * handled by a linear scan of .eh_frame (slow but correct). */
#define _GNU_SOURCE
#include "unwind.h"
#include "unwind_shared.h"
#include "rulecache.h"
#include "compiler.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

extern void *__libc_stack_end; /* ld.so: the initial thread's argc slot */

#define PG 4096UL
#define PAGE_DOWN(a) ((uintptr_t)(a) & ~(PG - 1))
#define PAGE_UP(a) (((uintptr_t)(a) + PG - 1) & ~(PG - 1))
#define MAX_STACK (1UL << 30)         /* an own stack larger than this is not believed */
#define MAX_FOREIGN (256UL << 10)     /* probed per walk on a foreign stack */
#define MAX_SWITCHES 4                /* stack changes at signal frames per walk */

/* ---- rules ----------------------------------------------------------------------------- */


struct rule {
    int kind;
    int bmode;
    long off;       /* CFA = reg + off, or *(rbp + off) */
    long k;         /* rbp saved at CFA + k (B_CFA) or at rbp + k (B_DEREF), bytes */
    int cacheable;
};

/* ---- the cache (its layout and lookup: rulecache.h) ------------------------------------- */

_Atomic uint64_t g_cache[1U << CACHE_BITS] __attribute__((aligned(64)));
_Atomic int g_unloading;        /* dlclose calls in progress: walks bypass the cache */
_Atomic unsigned g_memo_gen;    /* changes at every dlclose: older memo records are dead */

/* The rule bits of an entry, 0 if the rule does not fit. */
static inline uint64_t rule_encode(const struct rule *r)
{
    if (r->off < R_OFF_MIN || r->off > R_OFF_MAX || (r->k & 7) || r->k < -128 * 8 ||
        r->k > 127 * 8)
        return 0;
    return ((uint64_t)r->kind | (uint64_t)r->bmode << 3 | ((uint64_t)(r->k / 8) & 0xff) << 5)
               << TAG_BITS |
           (uint64_t)r->off << OFF_SHIFT;
}

/* Into the primary slot if it is free (or holds this key: a racing thread's copy), else into
 * the alternate one if that is free (or ours), else over whichever of the two holds an entry
 * out of its own primary slot, else over the alternate.  Each store is one atomic word: a
 * concurrent writer can only make another entry disappear. */
static void cache_put(uintptr_t key, uint64_t rule)
{
    if (key > KEY_MAX || !rule)
        return;
    uint64_t tag = key_tag(key);
    _Atomic uint64_t *p1 = &g_cache[slot1(key)], *p2 = &g_cache[slot2(key)];
    uint64_t e1 = atomic_load_explicit(p1, memory_order_relaxed), e2;
    if (!e1 || (e1 & TAG_MASK) == tag)
        atomic_store_explicit(p1, tag | rule, memory_order_relaxed);
    else if (!(e2 = atomic_load_explicit(p2, memory_order_relaxed)) ||   /* (see cache_get) */
             (e2 & TAG_MASK) == (tag | 1) || !(e1 & 1))
        atomic_store_explicit(p2, tag | 1 | rule, memory_order_relaxed);
    else
        atomic_store_explicit(p1, tag | rule, memory_order_relaxed);
}

static void cache_clear(void)
{
    for (size_t i = 0; i < sizeof g_cache / sizeof g_cache[0]; i++)
        atomic_store_explicit(&g_cache[i], 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

void mml_unwind_dlclose_begin(void)
{
    atomic_fetch_add_explicit(&g_unloading, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&g_memo_gen, 1, memory_order_seq_cst);
}

void mml_unwind_dlclose_end(void)
{
    cache_clear();
    atomic_fetch_add_explicit(&g_memo_gen, 1, memory_order_seq_cst);
    int v = atomic_load_explicit(&g_unloading, memory_order_relaxed);
    while (v > 0 && !atomic_compare_exchange_weak_explicit(&g_unloading, &v, v - 1,
                                                           memory_order_seq_cst,
                                                           memory_order_relaxed))
        ;
}

void mml_unwind_fork_child(void)
{
    /* a dlclose in progress in another thread of the parent never ends here: its cache
     * entries may be stale */
    if (atomic_load_explicit(&g_unloading, memory_order_relaxed)) {
        atomic_store_explicit(&g_unloading, 0, memory_order_relaxed);
        cache_clear();
        atomic_fetch_add_explicit(&g_memo_gen, 1, memory_order_relaxed);
    }
}

/* ---- reading .eh_frame data -------------------------------------------------------------- */

struct span { uintptr_t lo, hi; }; /* the object's mapping: every pointer must stay inside */

static inline int in_span(const struct span *o, const uint8_t *p, size_t n)
{
    return (uintptr_t)p >= o->lo && (uintptr_t)p <= o->hi && o->hi - (uintptr_t)p >= n;
}

/* A LEB128 number at *pp (sign-extended if SIGN); 0 if it runs past end. */
static inline int leb(const uint8_t **pp, const uint8_t *end, int sign, uint64_t *v)
{
    const uint8_t *p = *pp;
    uint64_t r = 0;
    unsigned shift = 0;
    while (p < end) {
        uint8_t b = *p++;
        if (shift < 64)
            r |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            if (sign && shift < 64 && (b & 0x40))
                r |= ~0ULL << shift;
            *pp = p;
            *v = r;
            return 1;
        }
    }
    return 0;
}

static int uleb(const uint8_t **pp, const uint8_t *end, uint64_t *v)
{
    return leb(pp, end, 0, v);
}

static int sleb(const uint8_t **pp, const uint8_t *end, int64_t *v)
{
    uint64_t u;
    if (!leb(pp, end, 1, &u))
        return 0;
    *v = (int64_t)u;
    return 1;
}

#define DW_EH_PE_omit 0xff
#define DW_EH_PE_indirect 0x80

/* A little-endian field of WIDTH bytes (2, 4 or 8) at *pp, sign-extended if SIGN; 0 if it does
 * not fit before end. */
static int read_fixed(const uint8_t **pp, const uint8_t *end, unsigned width, int sign,
                      uint64_t *v)
{
    if (end - *pp < (ptrdiff_t)width)
        return 0;
    uint64_t u = 0;
    memcpy(&u, *pp, width);
    *pp += width;
    unsigned shift = 64 - 8 * width;
    *v = sign && shift ? (uint64_t)((int64_t)(u << shift) >> shift) : u;
    return 1;
}

/* A DW_EH_PE-encoded pointer at *pp.  datarel is relative to dbase (the .eh_frame_hdr);
 * textrel and funcrel are not used on x86-64 (refused).  raw: no application (pc_range). */
static int read_enc(const uint8_t **pp, const uint8_t *end, uint8_t enc, uintptr_t dbase,
                    int raw, uintptr_t *out)
{
    const uint8_t *p = *pp;
    uint64_t v;
    if (enc == DW_EH_PE_omit)
        return 0;
    switch (enc & 0x0f) {
    case 0x00: /* absptr */
    case 0x04: /* udata8 */
    case 0x0c: /* sdata8 */
        if (!read_fixed(&p, end, 8, 0, &v))
            return 0;
        break;
    case 0x01:
        if (!uleb(&p, end, &v))
            return 0;
        break;
    case 0x09: {
        int64_t s;
        if (!sleb(&p, end, &s))
            return 0;
        v = (uint64_t)s;
        break;
    }
    case 0x02: /* udata2, sdata2, udata4, sdata4 */
    case 0x0a:
    case 0x03:
    case 0x0b:
        if (!read_fixed(&p, end, (enc & 1) ? 4 : 2, enc & 8, &v))
            return 0;
        break;
    default:
        return 0;
    }
    if (!raw && v) {
        switch (enc & 0x70) {
        case 0x00:
            break;
        case 0x10: /* pcrel */
            v += (uintptr_t)*pp;
            break;
        case 0x30: /* datarel */
            v += dbase;
            break;
        default:
            return 0;
        }
        if (enc & DW_EH_PE_indirect)
            return 0; /* only personality pointers use it: skipped, never read */
    }
    *pp = p;
    *out = (uintptr_t)v;
    return 1;
}

/* Size in bytes of an encoded value (to skip a personality pointer). */
static int enc_size(uint8_t enc, const uint8_t *p, const uint8_t *end)
{
    switch (enc & 0x0f) {
    case 0x00: case 0x04: case 0x0c: return 8;
    case 0x02: case 0x0a: return 2;
    case 0x03: case 0x0b: return 4;
    case 0x01: case 0x09: {
        const uint8_t *q = p;
        while (q < end && (*q & 0x80))
            q++;
        return q < end ? (int)(q - p + 1) : -1;
    }
    default: return -1;
    }
}

struct cie {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;
    int has_z, signal;
    const uint8_t *insn, *end;
};

/* One CIE or FDE record at p: its body [*body, *end); 0 for the terminator or garbage. */
static int record(const struct span *o, const uint8_t *p, const uint8_t **body,
                  const uint8_t **end)
{
    uint32_t len;
    if (!in_span(o, p, 4))
        return 0;
    memcpy(&len, p, 4);
    p += 4;
    uint64_t n = len;
    if (len == 0xffffffffU) {
        if (!in_span(o, p, 8))
            return 0;
        memcpy(&n, p, 8);
        p += 8;
    }
    if (n < 4 || !in_span(o, p, n))
        return 0;
    *body = p;
    *end = p + n;
    return 1;
}

static int parse_cie(const struct span *o, const uint8_t *p, struct cie *c)
{
    const uint8_t *body, *end;
    uint32_t id;
    if (!record(o, p, &body, &end))
        return 0;
    memcpy(&id, body, 4);
    if (id != 0)
        return 0;
    p = body + 4;
    if (p >= end)
        return 0;
    uint8_t version = *p++;
    if (version != 1 && version != 3)
        return 0;
    const char *aug = (const char *)p;
    while (p < end && *p)
        p++;
    if (p >= end)
        return 0;
    p++;
    memset(c, 0, sizeof *c);
    c->fde_enc = 0; /* absptr */
    if (!uleb(&p, end, &c->code_align) || !sleb(&p, end, &c->data_align))
        return 0;
    if (version == 1) {
        if (p >= end)
            return 0;
        c->ra_reg = *p++;
    } else if (!uleb(&p, end, &c->ra_reg)) {
        return 0;
    }
    const uint8_t *aug_end = NULL;
    if (aug[0] == 'z') {
        uint64_t alen;
        c->has_z = 1;
        if (!uleb(&p, end, &alen) || (uint64_t)(end - p) < alen)
            return 0;
        aug_end = p + alen;
        for (const char *a = aug + 1; *a; a++) {
            switch (*a) {
            case 'R':
                if (p >= aug_end)
                    return 0;
                c->fde_enc = *p++;
                break;
            case 'L':
                if (p >= aug_end)
                    return 0;
                p++;
                break;
            case 'P': {
                if (p >= aug_end)
                    return 0;
                uint8_t penc = *p++;
                int sz = enc_size(penc, p, aug_end);
                if (sz < 0 || aug_end - p < sz)
                    return 0;
                p += sz;
                break;
            }
            case 'S':
                c->signal = 1;
                break;
            case 'B': case 'G':
                break;
            default:
                return 0;
            }
        }
        p = aug_end;
    } else if (aug[0] != 0) {
        return 0; /* "eh" and other ancient forms */
    }
    c->insn = p;
    c->end = end;
    return 1;
}

/* The FDE record at p: its CIE, pc range and instructions.  0 if not an FDE. */
static int parse_fde(const struct span *o, const uint8_t *p, struct cie *c, uintptr_t *begin,
                     uintptr_t *range, const uint8_t **insn, const uint8_t **iend)
{
    const uint8_t *body, *end;
    int32_t cie_off;
    if (!record(o, p, &body, &end))
        return 0;
    memcpy(&cie_off, body, 4);
    if (cie_off == 0)
        return 0;
    if (!parse_cie(o, body - cie_off, c))
        return 0;
    const uint8_t *q = body + 4;
    if (!read_enc(&q, end, c->fde_enc, 0, 0, begin) ||
        !read_enc(&q, end, c->fde_enc & 0x0f, 0, 1, range))
        return 0;
    if (c->has_z) {
        uint64_t alen;
        if (!uleb(&q, end, &alen) || (uint64_t)(end - q) < alen)
            return 0;
        q += alen;
    }
    *insn = q;
    *iend = end;
    return 1;
}

/* ---- CFA programs ------------------------------------------------------------------------ */

enum { R_SAME, R_UNDEF, R_OFFSET, R_VALOFF, R_REG, R_EXPR, R_VALEXPR };
enum { IX_RBP, IX_RSP, IX_RA, NREG };

/* Compact (a walk may run with little stack left): offsets beyond 32 bits and expressions
 * longer than 64 KiB are refused. */
struct reg { const uint8_t *expr; int32_t val; uint16_t elen; uint8_t how; };
struct cfstate {
    const uint8_t *expr; /* CFA = expression, if cfa_expr */
    int32_t cfa_off;     /* else CFA = cfa_reg + cfa_off */
    uint16_t elen;
    uint8_t cfa_expr, cfa_reg;
    struct reg r[NREG];
};

static inline int fits32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

static int reg_ix(uint64_t dw, uint64_t ra_reg)
{
    if (dw == 6)
        return IX_RBP;
    if (dw == 7)
        return IX_RSP;
    if (dw == ra_reg)
        return IX_RA;
    return -1;
}

#define REMEMBER_DEPTH 3

/* Runs [p, end) while loc <= x.  init: the state after the CIE (for DW_CFA_restore). */
static int run_cfa(const uint8_t *p, const uint8_t *end, const struct cie *c, uintptr_t loc,
                   uintptr_t x, struct cfstate *st, const struct cfstate *init)
{
    struct cfstate saved[REMEMBER_DEPTH];
    int nsaved = 0;
    while (p < end) {
        uint8_t op = *p++;
        uint64_t reg, u;
        int64_t s;
        int ix;
        switch (op >> 6) {
        case 1: /* advance_loc */
            loc += (op & 0x3f) * c->code_align;
            if (loc > x)
                return 1;
            continue;
        case 2: /* offset */
            if (!uleb(&p, end, &u))
                return 0;
            ix = reg_ix(op & 0x3f, c->ra_reg);
            if (ix >= 0) {
                st->r[ix].how = R_OFFSET;
                if (!fits32((int64_t)u * c->data_align))
                    return 0;
                st->r[ix].val = (int32_t)((int64_t)u * c->data_align);
            }
            continue;
        case 3: /* restore */
            ix = reg_ix(op & 0x3f, c->ra_reg);
            if (ix >= 0) {
                if (!init)
                    return 0;
                st->r[ix] = init->r[ix];
            }
            continue;
        }
        switch (op) {
        case 0x00: /* nop */
            break;
        case 0x01: { /* set_loc */
            uintptr_t a;
            if (!read_enc(&p, end, c->fde_enc, 0, 0, &a))
                return 0;
            loc = a;
            if (loc > x)
                return 1;
            break;
        }
        case 0x02: case 0x03: case 0x04: { /* advance_loc1/2/4 */
            unsigned n = op == 0x02 ? 1 : op == 0x03 ? 2 : 4;
            uint32_t d = 0;
            if ((size_t)(end - p) < n)
                return 0;
            memcpy(&d, p, n); /* little-endian */
            p += n;
            loc += d * c->code_align;
            if (loc > x)
                return 1;
            break;
        }
        case 0x05: /* offset_extended */
            if (!uleb(&p, end, &reg) || !uleb(&p, end, &u))
                return 0;
            if ((ix = reg_ix(reg, c->ra_reg)) >= 0) {
                st->r[ix].how = R_OFFSET;
                if (!fits32((int64_t)u * c->data_align))
                    return 0;
                st->r[ix].val = (int32_t)((int64_t)u * c->data_align);
            }
            break;
        case 0x11: /* offset_extended_sf */
        case 0x14: /* val_offset */
        case 0x15: /* val_offset_sf */
            if (!uleb(&p, end, &reg))
                return 0;
            if (op == 0x14) {
                if (!uleb(&p, end, &u))
                    return 0;
                s = (int64_t)u;
            } else if (!sleb(&p, end, &s)) {
                return 0;
            }
            if ((ix = reg_ix(reg, c->ra_reg)) >= 0) {
                st->r[ix].how = op == 0x11 ? R_OFFSET : R_VALOFF;
                if (!fits32(s * c->data_align))
                    return 0;
                st->r[ix].val = (int32_t)(s * c->data_align);
            }
            break;
        case 0x2f: /* GNU_negative_offset_extended */
            if (!uleb(&p, end, &reg) || !uleb(&p, end, &u))
                return 0;
            if ((ix = reg_ix(reg, c->ra_reg)) >= 0) {
                st->r[ix].how = R_OFFSET;
                if (!fits32(-(int64_t)u * c->data_align))
                    return 0;
                st->r[ix].val = (int32_t)(-(int64_t)u * c->data_align);
            }
            break;
        case 0x06: /* restore_extended */
            if (!uleb(&p, end, &reg))
                return 0;
            if ((ix = reg_ix(reg, c->ra_reg)) >= 0) {
                if (!init)
                    return 0;
                st->r[ix] = init->r[ix];
            }
            break;
        case 0x07: /* undefined */
        case 0x08: /* same_value */
            if (!uleb(&p, end, &reg))
                return 0;
            if ((ix = reg_ix(reg, c->ra_reg)) >= 0)
                st->r[ix].how = op == 0x07 ? R_UNDEF : R_SAME;
            break;
        case 0x09: /* register */
            if (!uleb(&p, end, &reg) || !uleb(&p, end, &u))
                return 0;
            if ((ix = reg_ix(reg, c->ra_reg)) >= 0) {
                st->r[ix].how = R_REG;
                if (!fits32((int64_t)u))
                    return 0;
                st->r[ix].val = (int32_t)((int64_t)u);
            }
            break;
        case 0x0a: /* remember_state */
            if (nsaved == REMEMBER_DEPTH)
                return 0;
            saved[nsaved++] = *st;
            break;
        case 0x0b: /* restore_state: the CFA rule is restored too (as libgcc does) */
            if (!nsaved)
                return 0;
            *st = saved[--nsaved];
            break;
        case 0x0c: /* def_cfa */
            if (!uleb(&p, end, &reg) || !uleb(&p, end, &u))
                return 0;
            st->cfa_expr = 0;
            st->cfa_reg = reg > 255 ? 255 : (uint8_t)reg;
            if (!fits32((int64_t)u))
                return 0;
            st->cfa_off = (int32_t)((int64_t)u);
            break;
        case 0x12: /* def_cfa_sf */
            if (!uleb(&p, end, &reg) || !sleb(&p, end, &s))
                return 0;
            st->cfa_expr = 0;
            st->cfa_reg = reg > 255 ? 255 : (uint8_t)reg;
            if (!fits32(s * c->data_align))
                return 0;
            st->cfa_off = (int32_t)(s * c->data_align);
            break;
        case 0x0d: /* def_cfa_register */
            if (!uleb(&p, end, &reg))
                return 0;
            st->cfa_expr = 0;
            st->cfa_reg = reg > 255 ? 255 : (uint8_t)reg;
            break;
        case 0x0e: /* def_cfa_offset */
            if (!uleb(&p, end, &u))
                return 0;
            if (!fits32((int64_t)u))
                return 0;
            st->cfa_off = (int32_t)((int64_t)u);
            break;
        case 0x13: /* def_cfa_offset_sf */
            if (!sleb(&p, end, &s))
                return 0;
            if (!fits32(s * c->data_align))
                return 0;
            st->cfa_off = (int32_t)(s * c->data_align);
            break;
        case 0x0f: /* def_cfa_expression */
            if (!uleb(&p, end, &u) || (uint64_t)(end - p) < u || u > UINT16_MAX)
                return 0;
            st->cfa_expr = 1;
            st->expr = p;
            st->elen = (uint16_t)u;
            p += u;
            break;
        case 0x10: /* expression */
        case 0x16: /* val_expression */
            if (!uleb(&p, end, &reg) || !uleb(&p, end, &u) || (uint64_t)(end - p) < u ||
                u > UINT16_MAX)
                return 0;
            if ((ix = reg_ix(reg, c->ra_reg)) >= 0) {
                st->r[ix].how = op == 0x10 ? R_EXPR : R_VALEXPR;
                st->r[ix].expr = p;
                st->r[ix].elen = (uint16_t)u;
            }
            p += u;
            break;
        case 0x2e: /* GNU_args_size */
            if (!uleb(&p, end, &u))
                return 0;
            break;
        default:
            return 0; /* unknown: refuse rather than guess */
        }
    }
    return 1;
}

/* Symbolic DWARF expression values: c + (base register), optionally dereferenced once at the
 * very end.  rip is a known constant. */
enum { V_CONST, V_RSP, V_RBP, V_CFA };
struct sv { int base, deref; int64_t c; };

static int eval_expr(const uint8_t *p, uint64_t len, uintptr_t rip, int push_cfa,
                     struct sv *res, int *rip_used)
{
    const uint8_t *end = p + len;
    struct sv st[8];
    int n = 0;
    if (push_cfa)
        st[n++] = (struct sv){V_CFA, 0, 0};
    while (p < end) {
        uint8_t op = *p++;
        uint64_t u;
        int64_t s;
        if (n && st[n - 1].deref)
            return 0; /* nothing may follow a deref */
        if (op >= 0x30 && op <= 0x4f) { /* lit */
            if (n == 8)
                return 0;
            st[n++] = (struct sv){V_CONST, 0, op - 0x30};
            continue;
        }
        if ((op >= 0x70 && op <= 0x8f) || op == 0x92) { /* breg, bregx */
            uint64_t reg = op - 0x70;
            if (op == 0x92 && !uleb(&p, end, &reg))
                return 0;
            if (!sleb(&p, end, &s) || n == 8)
                return 0;
            if (reg == 7)
                st[n++] = (struct sv){V_RSP, 0, s};
            else if (reg == 6)
                st[n++] = (struct sv){V_RBP, 0, s};
            else if (reg == 16) {
                st[n++] = (struct sv){V_CONST, 0, (int64_t)rip + s};
                *rip_used = 1;
            } else
                return 0;
            continue;
        }
        if (op >= 0x08 && op <= 0x11) { /* const1u .. consts */
            static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 8, 8};
            int64_t v = 0;
            if (op <= 0x0f) {
                unsigned k = sz[op - 0x08];
                if ((size_t)(end - p) < k)
                    return 0;
                uint64_t raw = 0;
                memcpy(&raw, p, k);
                p += k;
                if ((op & 1) && k < 8) { /* signed forms: 0x09, 0x0b, 0x0d, 0x0f */
                    unsigned sh = 64 - 8 * k;
                    v = (int64_t)(raw << sh) >> sh;
                } else {
                    v = (int64_t)raw;
                }
            } else if (op == 0x10) {
                if (!uleb(&p, end, &u))
                    return 0;
                v = (int64_t)u;
            } else if (!sleb(&p, end, &v)) {
                return 0;
            }
            if (n == 8)
                return 0;
            st[n++] = (struct sv){V_CONST, 0, v};
            continue;
        }
        switch (op) {
        case 0x96: /* nop */
            continue;
        case 0x06: /* deref */
            if (!n || st[n - 1].base == V_CONST)
                return 0;
            st[n - 1].deref = 1;
            continue;
        case 0x12: /* dup */
            if (!n || n == 8)
                return 0;
            st[n] = st[n - 1];
            n++;
            continue;
        case 0x13: /* drop */
            if (!n)
                return 0;
            n--;
            continue;
        case 0x14: /* over */
            if (n < 2 || n == 8)
                return 0;
            st[n] = st[n - 2];
            n++;
            continue;
        case 0x16: { /* swap */
            if (n < 2)
                return 0;
            struct sv t = st[n - 1];
            st[n - 1] = st[n - 2];
            st[n - 2] = t;
            continue;
        }
        case 0x23: /* plus_uconst */
            if (!n || !uleb(&p, end, &u))
                return 0;
            st[n - 1].c += (int64_t)u;
            continue;
        case 0x1f: case 0x20: /* neg, not */
            if (!n || st[n - 1].base != V_CONST)
                return 0;
            st[n - 1].c = op == 0x1f ? -st[n - 1].c : ~st[n - 1].c;
            continue;
        }
        /* binary operators */
        if (n < 2)
            return 0;
        struct sv a = st[n - 2], b = st[n - 1];
        n -= 2;
        struct sv r = {V_CONST, 0, 0};
        if (op == 0x22) { /* plus */
            if (a.base != V_CONST && b.base != V_CONST)
                return 0;
            r.base = a.base != V_CONST ? a.base : b.base;
            r.c = a.c + b.c;
        } else if (op == 0x1c) { /* minus */
            if (b.base == V_CONST) {
                r.base = a.base;
                r.c = a.c - b.c;
            } else if (a.base == b.base) {
                r.c = a.c - b.c;
            } else {
                return 0;
            }
        } else {
            if (a.base != V_CONST || b.base != V_CONST)
                return 0;
            switch (op) {
            case 0x1a: r.c = a.c & b.c; break;
            case 0x21: r.c = a.c | b.c; break;
            case 0x27: r.c = a.c ^ b.c; break;
            case 0x1e: r.c = (int64_t)((uint64_t)a.c * (uint64_t)b.c); break;
            case 0x24: r.c = b.c >= 64 ? 0 : (int64_t)((uint64_t)a.c << b.c); break;
            case 0x25: r.c = b.c >= 64 ? 0 : (int64_t)((uint64_t)a.c >> b.c); break;
            case 0x26: r.c = b.c >= 64 ? (a.c < 0 ? -1 : 0) : a.c >> b.c; break;
            case 0x29: r.c = a.c == b.c; break;
            case 0x2a: r.c = a.c >= b.c; break;
            case 0x2b: r.c = a.c > b.c; break;
            case 0x2c: r.c = a.c <= b.c; break;
            case 0x2d: r.c = a.c < b.c; break;
            case 0x2e: r.c = a.c != b.c; break;
            default: return 0;
            }
        }
        st[n++] = r;
    }
    if (!n)
        return 0;
    *res = st[n - 1];
    return 1;
}

/* ---- finding the FDE --------------------------------------------------------------------- */

static const uint8_t *fde_linear(const struct span *o, const uint8_t *p, uintptr_t x)
{
    for (;;) {
        const uint8_t *body, *end;
        int32_t id;
        if (!record(o, p, &body, &end))
            return NULL;
        memcpy(&id, body, 4);
        if (id != 0) {
            struct cie c;
            uintptr_t begin, range;
            const uint8_t *i, *ie;
            if (parse_fde(o, p, &c, &begin, &range, &i, &ie) && x >= begin && x - begin < range)
                return p;
        }
        p = end;
    }
}

static const uint8_t *fde_find(const struct span *o, const uint8_t *hdr, uintptr_t x)
{
    if (!in_span(o, hdr, 4) || hdr[0] != 1)
        return NULL;
    uint8_t ptr_enc = hdr[1], cnt_enc = hdr[2], tab_enc = hdr[3];
    const uint8_t *p = hdr + 4, *lim = (const uint8_t *)o->hi;
    uintptr_t eh_frame, count;
    if (!read_enc(&p, lim, ptr_enc, (uintptr_t)hdr, 0, &eh_frame))
        return NULL;
    if (cnt_enc == DW_EH_PE_omit || tab_enc != 0x3b /* datarel | sdata4 */ ||
        !read_enc(&p, lim, cnt_enc, (uintptr_t)hdr, 0, &count) ||
        count > (o->hi - (uintptr_t)p) / 8)
        return fde_linear(o, (const uint8_t *)eh_frame, x);
    /* the last entry whose initial location is <= x */
    size_t lo = 0, hi = count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int32_t loc;
        memcpy(&loc, p + mid * 8, 4);
        if ((uintptr_t)hdr + (intptr_t)loc <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!lo)
        return NULL;
    int32_t f;
    memcpy(&f, p + (lo - 1) * 8 + 4, 4);
    return hdr + f;
}

/* ---- from a CFA row to a rule ------------------------------------------------------------ */

/* The .eh_frame_hdr of the object of *fo lies outside the range _dl_find_object gave for x.
 * That range is the whole object only when its PT_LOAD segments are mapped without a gap
 * between them (a shared library's always are: ld.so reserves the whole span, holes
 * included).  The kernel maps a program's segments one by one, and when they are not
 * contiguous (a 2 MiB-aligned .bss, -z max-page-size=0x200000) glibc 2.36 reports each
 * segment as its own range, so x's is the text segment and the table is in another one.
 * Then the reads of the table and of .eh_frame stay inside the segment that holds the
 * .eh_frame_hdr, as glibc reports it too, provided it is a segment of the same object (a
 * PT_GNU_EH_FRAME pointing into another object or into no mapping at all is still refused:
 * the span is left as it is and fde_find finds nothing).  Cold: only on a miss of the
 * cache, and _dl_find_object is lock-free and async-signal-safe. */
static COLD void eh_span(const struct dl_find_object *fo, struct span *o)
{
    struct dl_find_object t;
    if (_dl_find_object(fo->dlfo_eh_frame, &t) == 0 && t.dlfo_link_map == fo->dlfo_link_map &&
        fo->dlfo_link_map) {
        o->lo = (uintptr_t)t.dlfo_map_start;
        o->hi = (uintptr_t)t.dlfo_map_end;
    }
}

/* The object containing x: its mapping, and the FDE covering x if any.  0: no object (JIT or
 * anonymous code).  Apart from rule_at() so that their frames are not on the stack together
 * (a walk may run with little stack left). */
static COLD int find_fde(uintptr_t x, struct span *o, const uint8_t **fde)
{
    struct dl_find_object fo;
    if (_dl_find_object((void *)x, &fo) != 0)
        return 0;
    o->lo = (uintptr_t)fo.dlfo_map_start;
    o->hi = (uintptr_t)fo.dlfo_map_end;
    if (fo.dlfo_eh_frame && !in_span(o, fo.dlfo_eh_frame, 4))
        eh_span(&fo, o);
    *fde = fo.dlfo_eh_frame ? fde_find(o, fo.dlfo_eh_frame, x) : NULL;
    return 1;
}

static COLD void rule_at(const struct span *o, const uint8_t *fde, uintptr_t x, uintptr_t rip,
                         struct rule *R);

/* The rule at x for the frame whose pc (rip) is x (exact, after a signal frame) or x + 1 (a
 * return address). */
static COLD void find_rule(uintptr_t x, uintptr_t rip, struct rule *R)
{
    R->kind = K_STOP;
    R->bmode = B_SAME;
    R->off = R->k = 0;
    R->cacheable = 0;
    struct span o;
    const uint8_t *fde;
    if (!find_fde(x, &o, &fde))
        return; /* no object: JIT or anonymous code; not cached (code may be mapped here later) */
    R->cacheable = 1; /* from here on, the answer depends on the object only */
    if (fde)
        rule_at(&o, fde, x, rip, R);
}

static COLD void rule_at(const struct span *o, const uint8_t *fde, uintptr_t x, uintptr_t rip,
                         struct rule *R)
{
    struct cie c;
    uintptr_t begin, range;
    const uint8_t *insn, *iend;
    if (!parse_fde(o, fde, &c, &begin, &range, &insn, &iend) || x < begin || x - begin >= range)
        return; /* no CFI for x */
    struct cfstate st, init;
    memset(&st, 0, sizeof st);
    st.cfa_reg = 7;
    for (int i = 0; i < NREG; i++)
        st.r[i].how = R_SAME;
    if (!run_cfa(c.insn, c.end, &c, 0, UINTPTR_MAX, &st, NULL))
        return;
    init = st;
    if (!run_cfa(insn, iend, &c, begin, x, &st, &init))
        return;
    int rip_used = 0;
    struct sv v;

    /* signal frame: glibc's __restore_rt, the kernel's struct ucontext at sp */
    if (c.signal) {
        struct sv a, b;
        if (st.cfa_expr && eval_expr(st.expr, st.elen, rip, 0, &v, &rip_used) &&
            v.base == V_RSP && v.deref && v.c == 160 && st.r[IX_RA].how == R_EXPR &&
            eval_expr(st.r[IX_RA].expr, st.r[IX_RA].elen, rip, 1, &a, &rip_used) &&
            a.base == V_RSP && !a.deref && a.c == 168 && st.r[IX_RBP].how == R_EXPR &&
            eval_expr(st.r[IX_RBP].expr, st.r[IX_RBP].elen, rip, 1, &b, &rip_used) &&
            b.base == V_RSP && !b.deref && b.c == 120 && !rip_used)
            R->kind = K_SIGNAL;
        return;
    }
    /* the return address: at CFA - 8, or undefined (the outermost frame) */
    if (st.r[IX_RA].how != R_OFFSET || st.r[IX_RA].val != -8)
        return;
    if (st.r[IX_RSP].how != R_SAME)
        return; /* the caller's sp is not the CFA */
    /* the CFA */
    if (!st.cfa_expr) {
        if (st.cfa_reg == 7)
            R->kind = K_RSP;
        else if (st.cfa_reg == 6)
            R->kind = K_RBP;
        else
            return;
        R->off = st.cfa_off;
    } else {
        if (!eval_expr(st.expr, st.elen, rip, 0, &v, &rip_used))
            return;
        if (v.base == V_RSP && !v.deref)
            R->kind = K_RSP;
        else if (v.base == V_RBP)
            R->kind = v.deref ? K_DRAP : K_RBP;
        else
            return;
        R->off = v.c;
    }
    /* the caller's rbp */
    struct reg *b = &st.r[IX_RBP];
    switch (b->how) {
    case R_SAME:
        break;
    case R_OFFSET:
        R->bmode = B_CFA;
        R->k = b->val;
        break;
    case R_REG:
        R->bmode = b->val == 6 ? B_SAME : B_LOST;
        break;
    case R_EXPR:
        if (eval_expr(b->expr, b->elen, rip, 1, &v, &rip_used) && !v.deref &&
            (v.base == V_CFA || v.base == V_RBP)) {
            R->bmode = v.base == V_CFA ? B_CFA : B_DEREF;
            R->k = v.c;
        } else {
            R->bmode = B_LOST;
        }
        break;
    default: /* undefined, val_offset, val_expression: not followed */
        R->bmode = B_LOST;
        break;
    }
    if (rip_used)
        R->cacheable = 0; /* the same x means rip = x or x + 1: do not share the result */
}

/* ---- stack bounds ------------------------------------------------------------------------ */

/* System calls without libc: no PLT (whose lazy binding needs kilobytes of stack, maybe near
 * a guard page), no errno (a walk runs inside malloc, maybe in a signal handler). */
static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#define sys3(n, a, b, c) sys6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)

static int sys_open(const char *path)
{
    return (int)sys3(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
}
static long sys_read(int fd, void *buf, size_t n) { return sys3(SYS_read, fd, buf, n); }
static void sys_close(int fd) { sys3(SYS_close, fd, 0, 0); }

__thread struct mml_tls U __attribute__((tls_model("initial-exec")));

enum { PROBE_UNKNOWN, PROBE_VMREAD, PROBE_MAPS, PROBE_NONE };
static _Atomic int g_probe = PROBE_UNKNOWN;

/* /proc/self/status has "Seccomp:\t0" when no seccomp filter is installed: 1; 0 if there is
 * one; -1 if the file cannot be read (no /proc, or the buffer is not writable: the read fails
 * with EFAULT instead of a fault when the stack is nearly exhausted). */
static int seccomp_off(void)
{
    int fd = sys_open("/proc/self/status");
    if (fd < 0)
        return -1;
    static const char key[] = "\nSeccomp:";
    char buf[128];
    size_t m = 1; /* the file starts at the beginning of a line */
    int res = -1;
    long r;
    while (res < 0 && (r = sys_read(fd, buf, sizeof buf)) > 0) {
        for (long i = 0; i < r; i++) {
            char ch = buf[i];
            if (m == sizeof key - 1) { /* after the key: blanks, then the mode */
                if (ch == ' ' || ch == '\t')
                    continue;
                res = ch == '0';
                break;
            }
            m = ch == key[m] ? m + 1 : ch == '\n' ? 1 : 0;
        }
    }
    sys_close(fd);
    return res;
}

static COLD int probe_mode(void)
{
    int m = atomic_load_explicit(&g_probe, memory_order_relaxed);
    if (m != PROBE_UNKNOWN)
        return m;
    /* a seccomp filter may kill the process on a syscall it does not expect: then only
     * open/read/close of /proc/self/maps are used */
    int off = seccomp_off();
    if (off < 0)
        return PROBE_MAPS; /* for now; asked again next time */
    m = off ? PROBE_VMREAD : PROBE_MAPS;
    atomic_store_explicit(&g_probe, m, memory_order_relaxed);
    return m;
}

/* How many consecutive readable pages start at page p (at most n), via /proc/self/maps.
 * -1: cannot tell.  Parsed a character at a time: lines can be longer than the buffer. */
static COLD long probe_maps(uintptr_t p, long n)
{
    int fd = sys_open("/proc/self/maps");
    if (fd < 0)
        return -1;
    char buf[128];
    uintptr_t cur = p, want = p + (uintptr_t)n * PG, a = 0, b = 0;
    int state = 0, done = 0, ok = 0; /* 0 start, 1 end, 2 perms, 3 rest of the line */
    while (!done) {
        long r = sys_read(fd, buf, sizeof buf);
        if (r <= 0)
            break;
        ok = 1;
        for (long i = 0; i < r && !done; i++) {
            char ch = buf[i];
            int d = ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= '0' && ch <= '9' ? ch - '0' : -1;
            switch (state) {
            case 0:
                if (ch == '-')
                    state = 1;
                else if (d >= 0)
                    a = a << 4 | (uintptr_t)d;
                break;
            case 1:
                if (ch == ' ')
                    state = 2;
                else if (d >= 0)
                    b = b << 4 | (uintptr_t)d;
                break;
            case 2: /* lines come in address order */
                state = 3;
                if (b <= cur)
                    break;
                if (a > cur || ch != 'r') {
                    done = 1;
                    break;
                }
                cur = b;
                if (cur >= want)
                    done = 1;
                break;
            default:
                if (ch == '\n') {
                    state = 0;
                    a = b = 0;
                }
            }
        }
    }
    sys_close(fd);
    if (!ok)
        return -1;
    if (cur >= want)
        return n;
    return (long)((cur - p) / PG);
}

/* How many consecutive readable pages start at page p (at most n), with process_vm_readv on
 * ourselves, one byte of each page.  -2: the call is refused. */
static COLD long probe_vm(uintptr_t p, long n)
{
    long pid = sys3(SYS_getpid, 0, 0, 0); /* never cached: fork */
    long done = 0;
    while (done < n) {
        enum { B = 16 };
        struct iovec remote[B], local;
        char sink[B];
        long k = n - done < B ? n - done : B;
        for (long i = 0; i < k; i++) {
            remote[i].iov_base = (void *)(p + (uintptr_t)(done + i) * PG);
            remote[i].iov_len = 1;
        }
        local.iov_base = sink;
        local.iov_len = (size_t)k;
        long r = sys6(SYS_process_vm_readv, pid, (long)&local, 1, (long)remote, k, 0);
        if (r < 0)
            return r == -EFAULT || done ? done : -2;
        done += r;
        if (r < k)
            break;
    }
    return done;
}

/* How many consecutive readable pages start at page p (at most n); -1: cannot tell. */
static COLD long probe(uintptr_t p, long n)
{
    if (probe_mode() == PROBE_VMREAD) {
        long r = probe_vm(p, n);
        if (r >= 0)
            return r;
        atomic_store_explicit(&g_probe, PROBE_MAPS, memory_order_relaxed);
    }
    if (atomic_load_explicit(&g_probe, memory_order_relaxed) != PROBE_NONE) {
        long r = probe_maps(p, n);
        if (r < 0)
            atomic_store_explicit(&g_probe, PROBE_NONE, memory_order_relaxed);
        return r;
    }
    return -1;
}

/* [a, b) all readable?  1 yes, 0 no, -1 cannot tell */
static int readable(uintptr_t a, uintptr_t b)
{
    uintptr_t p = PAGE_DOWN(a);
    long n = (long)((PAGE_UP(b) - p) / PG);
    long r = probe(p, n);
    return r < 0 ? -1 : r == n;
}

static int on_altstack(uintptr_t sp, uintptr_t *lo, uintptr_t *hi)
{
    stack_t ss;
    if (sys3(SYS_sigaltstack, 0, &ss, 0) != 0 || (ss.ss_flags & SS_DISABLE) || !ss.ss_sp)
        return 0;
    uintptr_t a = (uintptr_t)ss.ss_sp, b = a + ss.ss_size;
    if (sp < a || sp >= b)
        return 0;
    *lo = a;
    *hi = b;
    return 1;
}

/* Learn the calling thread's own stack, from the stack pointer sp (on it). */
static COLD int own_init(uintptr_t sp)
{
    uintptr_t a, b;
    if (on_altstack(sp, &a, &b))
        return 0;
    uintptr_t cands[2];
    int nc = 0;
    /* a thread created by pthread_create: its descriptor is at the top of its stack block */
    uintptr_t self = (uintptr_t)__builtin_thread_pointer(); /* == pthread_self() */
    if (sp < self && self - sp <= MAX_STACK)
        cands[nc++] = self;
    /* the initial thread: [stack], up to the strings at its top */
    uintptr_t top = getauxval(AT_EXECFN);
    uintptr_t end = (uintptr_t)__libc_stack_end;
    if (!(top > end && top - end < (1UL << 20)))
        top = end ? end + 8 : 0;
    top = PAGE_UP(top + 1);
    if (end && sp < end && top - sp <= MAX_STACK)
        cands[nc++] = top;
    for (int i = 0; i < nc; i++) {
        int r = readable(sp, cands[i]);
        if (r != 0) { /* yes, or cannot tell: then the glibc layout is trusted */
            U.lo = PAGE_DOWN(sp);
            /* a signal handler's walk in this thread must not see hi before lo */
            atomic_signal_fence(memory_order_seq_cst);
            U.hi = cands[i];
            return 1;
        }
    }
    return 0;
}

/* Bind the two library functions a walk calls now, not lazily in a first walk that may run
 * with little stack left (lazy binding saves the vector registers on the stack). */
__attribute__((constructor)) static void mml_unwind_bind(void)
{
    struct dl_find_object fo;
    _dl_find_object((void *)(uintptr_t)mml_unwind_bind, &fo);
    (void)getauxval(AT_EXECFN);
}

void mml_unwind_thread_init(void)
{
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    if (!U.hi)
        own_init(sp);
}

/* The stack segment a walk at sp reads from. */
struct seg { uintptr_t lo, hi; int probed; };

static COLD int seg_for(uintptr_t sp, struct seg *s)
{
    s->probed = 0;
    if (!U.hi) {
        unsigned t = ++U.tries;
        if (!(t & (t - 1))) /* the 1st, 2nd, 4th, 8th ... time */
            own_init(sp);
    }
    if (U.hi && sp >= U.lo && sp < U.hi) {
        s->lo = U.lo;
        s->hi = U.hi;
        return 1;
    }
    if (on_altstack(sp, &s->lo, &s->hi))
        return 1;
    /* the own stack, grown below what was verified */
    if (U.hi && sp < U.lo && U.lo - sp <= MAX_STACK) {
        int r = readable(sp, U.lo);
        if (r != 0) {
            U.lo = PAGE_DOWN(sp);
            s->lo = U.lo;
            s->hi = U.hi;
            return 1;
        }
    }
    /* another stack: probe its pages as the walk needs them */
    uintptr_t p = PAGE_DOWN(sp);
    long r = probe(p, 2);
    if (r <= 0)
        return 0;
    s->lo = p;
    s->hi = p + (uintptr_t)r * PG;
    s->probed = 1;
    return 1;
}

/* A read up to address need (exclusive) is outside s: extend a probed segment. */
static COLD int seg_extend(struct seg *s, uintptr_t need)
{
    if (!s->probed || need <= s->hi || need - s->lo > MAX_FOREIGN)
        return 0;
    long n = (long)((PAGE_UP(need) - s->hi) / PG);
    long r = probe(s->hi, n);
    if (r <= 0)
        return 0;
    s->hi += (uintptr_t)r * PG;
    return need <= s->hi;
}

/* ---- the walk ---------------------------------------------------------------------------- */

#ifdef MML_UNWIND_TESTING /* tests/unwind_check.c: which rules were computed */
static _Atomic long g_kinds[8];
void mml_unwind_test_kinds(long out[8]);
void mml_unwind_test_kinds(long out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = atomic_load(&g_kinds[i]);
}
static void count_rule(const struct rule *R)
{
    atomic_fetch_add(&g_kinds[R->kind - 1], 1);
    if (!R->cacheable || !rule_encode(R))
        atomic_fetch_add(&g_kinds[5], 1);
    if (R->bmode == B_DEREF)
        atomic_fetch_add(&g_kinds[6], 1);
    if (R->bmode == B_LOST)
        atomic_fetch_add(&g_kinds[7], 1);
}
#else
#define count_rule(R) ((void)0)
#endif

/* The rule of key (see the cache) for the frame at ip, computed and cached. */
static COLD uint64_t slow_rule(uintptr_t key, uintptr_t ip, int use_cache, struct rule *R)
{
    find_rule(key - 1, ip, R);
    count_rule(R);
    uint64_t e = rule_encode(R);
    if (R->cacheable && use_cache)
        cache_put(key, e);
    return e;
}

/* A read up to need (exclusive) beyond hi, on a probed stack: the new hi, 0 if not readable. */
static COLD uintptr_t grow(uintptr_t lo, uintptr_t hi, uintptr_t need)
{
    struct seg s = {lo, hi, 1};
    return seg_extend(&s, need) ? s.hi : 0;
}

/* [a, a + 8) readable in the segment [lo, hi) (hi may grow if probed) */
#define READABLE(a)                                                                           \
    ((a) >= lo && ((a) + 8 <= hi || (probed && (a) + 8 > (a) && (nh = grow(lo, hi, (a) + 8)) && \
                                     (hi = nh, 1))))

/* A trail's entry for the word v read at address a (sp0: where the walk started). */
static inline void trail_log(struct mml_trail *tr, uintptr_t sp0, uintptr_t a, uintptr_t v)
{
    uintptr_t off = a - sp0;
    if (unlikely(a < sp0 || (off & 7) || off >= (uintptr_t)8 << 16)) {
        tr->bad = 1;
        return;
    }
    if (likely(tr->n < MML_TRAIL_MAX)) {
        tr->off[tr->n] = (uint16_t)(off >> 3);
        tr->val[tr->n] = v;
    }
    tr->n++;
}

/* The walk.  key: ip for a return address, ip + 1 for an exact pc.  tr: NULL, or the trail to
 * fill (a constant at every call, so the walk without one has no trace of it). */
/* A read that fails the bounds check stops the walk; the bounds may widen later (the stack
 * grew), so such a walk is not memoised. */
#define UNREADABLE(a) (!READABLE(a) && (!tr || (tr->bad = 1)))
#define RD(a) (tr ? rd_log(tr, sp0, (a)) : *(const uintptr_t *)(a))
static inline __attribute__((always_inline)) uintptr_t rd_log(struct mml_trail *tr, uintptr_t sp0,
                                                               uintptr_t a)
{
    uintptr_t v = *(const uintptr_t *)a;
    trail_log(tr, sp0, a, v);
    return v;
}
#define FRAME_OUT(v)                                                                          \
    do {                                                                                      \
        out[n++] = (v);                                                                       \
        if (tr && n <= MML_TRAIL_FRAMES)                                                      \
            tr->upto[n] = (uint8_t)(tr->n > 255 ? 255 : tr->n);                               \
    } while (0)
/* rbp loaded from the stack: a trail records the word only when a later step uses rbp (code
 * without frame pointers saves rbp in most frames, as any callee-saved register, and a walk
 * through it never looks at the value: those words are not part of what the walk depends on,
 * and a check of a memoised walk does not read them). */
#define RDB(a) (tr ? (pa = (a), pv = *(const uintptr_t *)pa) : *(const uintptr_t *)(a))
#define USES_BP()                                                                             \
    do {                                                                                      \
        if (tr && pa) {                                                                       \
            trail_log(tr, sp0, pa, pv);                                                       \
            pa = 0;                                                                           \
        } else if (tr && bp_init && tr->bp_from > n) {                                        \
            tr->bp_from = n;                                                                  \
        }                                                                                     \
    } while (0)

static inline __attribute__((always_inline)) int
walk_impl(uintptr_t ip, uintptr_t sp, uintptr_t bp, uintptr_t key, uintptr_t *out, int max,
          const int use_cache, struct mml_trail *const tr)
{
    int n = 0;
    const uintptr_t sp0 = sp;
    int bp_init = 1;        /* bp is still the start's: a walk that uses it depends on it */
    uintptr_t pa = 0, pv = 0;   /* the stack word bp was last loaded from, not yet in tr */
    uintptr_t lo = U.lo, hi = U.hi, nh;
    int probed = 0;
    if (tr) {
        tr->n = tr->bad = 0;
        tr->bp_from = 1 << 30;
        tr->upto[0] = 0;
    }
    FRAME_OUT(ip);
    if (n >= max)
        goto done;
    if (unlikely(sp < lo || sp >= hi)) {
        struct seg s;
        if (tr)
            tr->bad = 1;    /* not the thread's own stack (as known): not memoised */
        if (!seg_for(sp, &s))
            goto done;
        lo = s.lo;
        hi = s.hi;
        probed = s.probed;
    }
    int bp_ok = 1, switches = 0;
    for (;;) {
        uint64_t e = use_cache ? cache_get(key) : 0;
        struct rule R;
        int kind, bmode;
        long off, k;
        if (likely(e)) {
            kind = (int)(e >> TAG_BITS & 7);
            bmode = (int)(e >> (TAG_BITS + 3) & 3);
            k = (long)(int8_t)(e >> (TAG_BITS + 5)) * 8;
            off = (long)((int64_t)e >> OFF_SHIFT);
        } else {
            e = slow_rule(key, ip, use_cache, &R);
            if (tr && !R.cacheable)
                tr->bad = 1;    /* no object there (JIT code...), or a rip-dependent rule */
            kind = R.kind;
            bmode = R.bmode;
            off = R.off;
            k = R.k;
        }
        uintptr_t cfa, a;
        if (likely(kind == K_RSP)) {
            cfa = sp + (uintptr_t)off;
        } else if (kind == K_RBP) {
            USES_BP();
            if (!bp_ok)
                goto done;
            cfa = bp + (uintptr_t)off;
        } else if (kind == K_DRAP) {
            USES_BP();
            a = bp + (uintptr_t)off;
            if (!bp_ok || UNREADABLE(a))
                goto done;
            cfa = RD(a);
        } else if (kind == K_SIGNAL) {
            /* sp is the handler's CFA: the kernel's ucontext, general registers at +40 */
            a = sp + 120;
            uintptr_t b = sp + 160, c = sp + 168;
            if (UNREADABLE(a) || UNREADABLE(b) || UNREADABLE(c))
                goto done;
            uintptr_t rip = RD(c), rsp = RD(b);
            if (!rip)
                goto done;
            bp = RDB(a);
            bp_ok = 1;
            bp_init = 0;
            FRAME_OUT(rip);
            if (n >= max)
                goto done;
            if (rsp < lo || rsp >= hi) { /* another stack: back from an alternate one */
                struct seg s;
                if (tr)
                    tr->bad = 1;
                if (++switches > MAX_SWITCHES || !seg_for(rsp, &s))
                    goto done;
                lo = s.lo;
                hi = s.hi;
                probed = s.probed;
            }
            ip = rip;
            key = rip + 1;
            sp = rsp;
            continue;
        } else {
            goto done;
        }
        /* the CFA must move up the stack; the return address is at CFA - 8 */
        if (unlikely(cfa < sp + 8))
            goto done;
        if (unlikely(cfa > hi)) {
            if (tr)
                tr->bad = 1;    /* hi is the probed end of a foreign stack */
            if (!probed || !(nh = grow(lo, hi, cfa)))
                goto done;
            hi = nh;
        }
        uintptr_t ra = RD(cfa - 8);
        if (bmode == B_CFA) {
            a = cfa + (uintptr_t)k;
            if (unlikely(UNREADABLE(a)))
                goto done;
            bp = RDB(a);
            bp_init = 0;
        } else if (bmode != B_SAME) {
            if (bmode == B_DEREF) {
                USES_BP();
                a = bp + (uintptr_t)k;
                if (!bp_ok || UNREADABLE(a))
                    goto done;
                bp = RDB(a);
                bp_init = 0;
            } else {
                bp_ok = 0;
            }
        }
        if (unlikely(!ra))
            goto done;
        FRAME_OUT(ra);
        if (n >= max)
            goto done;
        ip = key = ra;
        sp = cfa;
    }
done:
    if (tr) {
        tr->walked = n;
        if (probed)
            tr->bad = 1;
    }
    return n;
}
#undef RD
#undef UNREADABLE
#undef FRAME_OUT
#undef USES_BP
#undef RDB

static int walk(uintptr_t ip, uintptr_t sp, uintptr_t bp, uintptr_t key, uintptr_t *out, int max)
{
    if (max <= 0)
        return 0;
    if (likely(atomic_load_explicit(&g_unloading, memory_order_acquire) == 0))
        return walk_impl(ip, sp, bp, key, out, max, 1, NULL);
    return walk_impl(ip, sp, bp, key, out, max, 0, NULL);
}

int mml_unwind(uintptr_t ip, uintptr_t sp, uintptr_t bp, uintptr_t *out, int max)
{
    return walk(ip, sp, bp, ip, out, max);
}

int mml_unwind_exact(uintptr_t pc, uintptr_t sp, uintptr_t bp, uintptr_t *out, int max)
{
    return walk(pc, sp, bp, pc + 1, out, max);
}

/* Our own frames (frame pointers) up to the one whose return address is ra: the frame of the
 * interposed function, whose CFA is its caller's sp.  The chain only goes up the stack (each
 * frame above the last), so one bound is checked per frame. */
__attribute__((noinline)) int mml_unwind_start(const void *ra, struct mml_start *st)
{
    uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
    uintptr_t lo = U.lo, hi = U.hi, nh;
    int probed = 0;
    if (unlikely(fp < lo || fp >= hi)) {
        struct seg s;
        if (!seg_for(fp, &s))
            return 0;
        lo = s.lo;
        hi = s.hi;
        probed = s.probed;
    }
    for (int i = 0; i < 16; i++) {
        uintptr_t b = fp + 8;   /* fp >= lo: only the top of [fp, fp + 16) needs a check */
        if (unlikely(b + 8 > hi) && !READABLE(b))
            break;
        uintptr_t next = *(const uintptr_t *)fp, ret = *(const uintptr_t *)b;
        if (ret == (uintptr_t)ra) {
            st->ip = ret;
            st->sp = fp + 16;
            st->bp = next;
            return 1;
        }
        if (next <= fp)
            break;
        fp = next;
    }
    return 0;
}

__attribute__((noinline)) int mml_unwind_from_ra(const void *ra, uintptr_t *out, int max)
{
    if (max <= 0)
        return 0;
    struct mml_start st;
    if (mml_unwind_start(ra, &st))
        return walk(st.ip, st.sp, st.bp, st.ip, out, max);
    out[0] = (uintptr_t)ra;
    return 1;
}

int mml_unwind_trail(const struct mml_start *s, uintptr_t *out, int max, struct mml_trail *tr)
{
    if (max <= 0)
        return 0;
    if (likely(atomic_load_explicit(&g_unloading, memory_order_acquire) == 0))
        return walk_impl(s->ip, s->sp, s->bp, s->ip, out, max, 1, tr);
    int n = walk_impl(s->ip, s->sp, s->bp, s->ip, out, max, 0, tr);
    tr->bad = 1;
    return n;
}
