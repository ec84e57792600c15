/* tools/shrink.c: the compiled shrinker mmleak.py uses (through ctypes) when it can.
 *
 * The same algorithm as mmleaklib/shrink.py's Shrinker (specified above that class, and in
 * mmleak-format(5), "The shrink algorithm"):
 * per address, one event or the hull of the lowest and highest event by SEQ, and an
 * allocation with SEQ s followed by a free with SEQ s+1 cancels when that pair is the whole
 * state (from two inputs, once the second one's input goes on: ent_update).  Input validation (which lines are problems, their line numbers, the first few per
 * file and kind) and header handling are those of Shrinker.feed and Shrinker._odd_line;
 * mmleaklib is the reference, tests/test_shrink_native.py holds the two to byte-identical
 * results.  A problem is handed back as a record (what, file, line, the line's first bytes):
 * mmleaklib words every message, once, for both engines.
 *
 * Loaded by mmleaklib (native.py) with ctypes, independent of the tracer: it allocates with
 * mmap/munmap only, so it behaves the same whether the library that holds it was dlopen'ed
 * by Python or the process itself runs under the tracer.
 *
 * Memory is proportional to the state kept (open addresses and hull ends), not to the input:
 * the table shrinks nothing, but adjacent pairs leave it at once and their line storage goes
 * back to a per-size free list.  (One exception, bounded: the index is sized before each
 * file is read for the lines its size can hold, at most 2^24 slots of 4 bytes; presize_file.)
 * The input is read in chunks into one buffer of fixed size, whatever it holds: a line
 * longer than LINE_MAX is reported, not kept, and the holes of a sparse file are skipped,
 * never read (feed_fd, and mmleaklib's dump_lines, byte for byte).
 *
 * The files are opened by mmleaklib (the open callback: the checks every reader of a dump
 * directory makes are in one place, open_trace_file); the shrinker reads descriptors.
 *
 * This file holds the entry points (mmleak_shrink, the blocks' ones) and the survivors made
 * blocks; the rest, each concern in its own file, sharing tools/shrink_int.h:
 *   tools/shrink_state.c   the memory, the line storage, the table of entries, the headers
 *   tools/shrink_fold.h    the folding algebra: an event into its address's state (inline)
 *   tools/shrink_read.c    the inputs read line by line, the problems, the reader's loop
 *   tools/shrink_write.c   the state written as a result, the counts its head needs
 *   tools/shrink_merge.c   the last input streamed and merged (mmleak_shrink_merge) */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shrink_int.h"

static void run_release(struct run *r)
{
    if (r->t.e)
        munmap(r->t.e, r->t.e_bytes);
    /* the stack ids of a run stopped before write_end handed them over (hand_used) */
    if (r->used)
        munmap(r->used, (r->used_mask + 1) * sizeof *r->used);
    if (r->t.ix)
        munmap(r->t.ix, r->t.ix_bytes);
    slab_release(&r->mem);
    hset_release(&r->headers);
    if (r->own)
        munmap(r->own, r->own_bytes);
}

/* The end of a call of mmleak_shrink or mmleak_shrink_blocks: the run's memory, the read
 * buffer BUF and the output buffer OUT go back; RC is returned. */
int run_end(struct run *r, char *buf, struct obuf *out, int rc)
{
    run_release(r);
    if (buf)
        munmap(buf, READ_BUF);
    if (out)
        munmap(out, sizeof *out);
    return rc;
}

/* Shrink PATHS ("-" is stdin, descriptor 0; any other is opened by ON_OPEN) and write the
 * result (events only, no header lines: those go to the header callback) to OUT_FD.
 * NAME_ID[i]: the index of the first input with the name input i has in messages; COUNTS
 * (npaths * 4: torn, padding, malformed, duplicate) receives the problem counts under it,
 * and the first SHOW problems of each kind and name go to ON_PROBLEM.
 * FINAL: SHRINK_FINAL, the final result (no brackets); SHRINK_HEAD_FIRST: OUT_FD is where
 * the whole result goes (no temporary file): once the lines are known, before any is
 * written, ON_HEADER is called with no line (LINE NULL, FILE -1), STATS already saying what
 * the head needs (newest, used, and the counts of lines), to write the head lines there.
 * Returns 0 when done, 1 when a callback stopped the run, -1 out of memory, -2 output error
 * (the errno in stats->out_errno). */
EXPORT int mmleak_shrink(const char *const *paths, const int *name_id, int npaths, int out_fd,
                      int show, int final, mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                      mmleak_open_cb on_open, mmleak_problem_cb on_problem, uint64_t *counts,
                      struct mmleak_shrink_stats *stats)
{
    struct obuf *out = map_mem(sizeof *out);
    char *buf = map_mem(READ_BUF);
    struct run r;
    memset(&r, 0, sizeof r);
    r.head_first = (final & SHRINK_HEAD_FIRST) != 0;
    r.noting = r.head_first;    /* the head's notes taken while reading, where they can be */
    r.final_notes = final & SHRINK_FINAL;
    int rc = !out || !buf ? -1 : shrink_inputs(&r, paths, name_id, npaths, show, on_header,
                                                on_tick, on_open, on_problem, counts, stats,
                                                buf);
    if (rc == 0) {
        out->fd = out_fd;
        write_state(&r, out, final & SHRINK_FINAL, r.t.e, r.t.count);
        rc = r.stop;
        if (rc == 0 && out->err) {
            stats->out_errno = (uint64_t)out->err;
            rc = -2;
        }
    }
    return run_end(&r, buf, out, rc);
}

/* An allocation line as a block: "PTR SEQ SIZE TIME @ID\n" (a stack's id) or "PTR SEQ SIZE
 * TIME CALLER\n" (one caller inline); 0 when the line is neither (format 1 with several
 * callers inline). */
int line_block(const char *l, struct mmleak_block *b)
{
    const char *q = hexf(l, &b->ptr);
    if (!q || *q != ' ' || !(q = hexf(q + 1, &b->seq)) || *q != ' ' ||
        !(q = hexf(q + 1, &b->size)) || *q != ' ' || !(q = hexf(q + 1, &b->time)) ||
        q[0] != ' ')
        return 0;
    b->frame = q[1] != '@';
    b->pad = 0;
    q = hexf(q + 1 + !b->frame, &b->stack);
    return q && *q == '\n';
}

/* What the entry points that give blocks start with: their buffers, BLOCKS emptied, the
 * inputs read into R's state.  Returns as shrink_inputs (-1: no memory for the buffers). */
static int read_for_blocks(struct run *r, struct obuf **out, char **buf,
                           const char *const *paths, const int *name_id, int npaths, int show,
                           mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                           mmleak_open_cb on_open, mmleak_problem_cb on_problem,
                           uint64_t *counts, struct mmleak_shrink_stats *stats,
                           struct mmleak_blocks *blocks)
{
    *out = map_mem(sizeof **out);
    *buf = map_mem(READ_BUF);
    memset(r, 0, sizeof *r);
    memset(blocks, 0, sizeof *blocks);
    return !*out || !*buf ? -1 : shrink_inputs(r, paths, name_id, npaths, show, on_header,
                                               on_tick, on_open, on_problem, counts, stats,
                                               *buf);
}

/* The K blocks written over the table T's entries (at V, their mapping) handed over to
 * BLOCKS: the entries' mapping is the blocks' now. */
static void hand_over(struct table *t, struct mmleak_block *v, size_t k,
                      struct mmleak_blocks *blocks)
{
    blocks->v = v;
    blocks->n = k;
    blocks->cap_bytes = t->e_bytes;
    t->e = NULL;
}

/* The final result of mmleak_shrink (FINAL 1) in two parts: the survivors as blocks in
 * BLOCKS (an array in a mapping of its own: mmleak_blocks_free; in the table's
 * order, not sorted), and the rest as lines to OUT_FD, sorted by address: the foreign frees
 * and the survivors with several callers inline (format 1).  stats->lines counts those lines
 * only.  Returns as mmleak_shrink. */
/* The final result of R's table (read already) as mmleak_shrink_blocks gives it: the survivors
 * as blocks in BLOCKS, the rest as lines to OUT.  Returns 0, -1 (no memory), -2 (output). */
int final_blocks(struct run *r, struct obuf *out, struct mmleak_shrink_stats *stats,
                        struct mmleak_blocks *blocks)
{
    int rc = 0;
    {
        /* The blocks take the place of the entries, in the same mapping (a block is smaller
         * than an entry, and block k is written over entries before i >= k: read first):
         * the state's memory becomes the result's.  The entries that are not blocks (foreign
         * frees, survivors with several callers) go to REST, to be written as lines. */
        struct table *t = &r->t;
        struct mmleak_block *v = (struct mmleak_block *)(void *)t->e;
        size_t k = 0, nrest = 0, rest_bytes = 0;
        struct ent *rest = NULL;
        if (t->ix)
            munmap(t->ix, t->ix_bytes);
        t->ix = NULL;
        for (size_t i = 0; i < t->count; i++) {
            struct ent e = t->e[i];
            struct mmleak_block b;
            if (!e.hull) {
                if (e.k0 == K_ALLOC && line_block(e.l0, &b)) {
                    v[k++] = b;
                    continue;
                }
                if (e.k0 != K_ALLOC && e.k0 != K_FREE)
                    continue;           /* a bracket: nothing final */
            } else {
                if (e.k1 == K_ALLOC && line_block(e.l1, &b)) {
                    v[k++] = b;
                    e.k1 = K_END;       /* a bracket: the final result leaves it out */
                }
                if (e.k0 != K_FREE && e.k1 != K_ALLOC)
                    continue;
            }
            if ((nrest + 1) * sizeof *rest > rest_bytes) {
                size_t nb = rest_bytes ? rest_bytes * 2 : 1 << 16;
                void *p = rest ? mremap(rest, rest_bytes, nb, MREMAP_MAYMOVE) : map_mem(nb);
                if (!p || p == MAP_FAILED) {
                    rc = -1;
                    break;
                }
                rest = p;
                rest_bytes = nb;
            }
            rest[nrest++] = e;
        }
        if (rc == 0) {
            write_state(r, out, 1, rest, nrest);
            stats->entries += k;
            if (out->err) {
                stats->out_errno = (uint64_t)out->err;
                rc = -2;
            }
        }
        if (rest)
            munmap(rest, rest_bytes);
        if (rc == 0)
            hand_over(t, v, k, blocks);
    }
    return rc;
}

EXPORT int mmleak_shrink_blocks(const char *const *paths, const int *name_id, int npaths,
                                int out_fd, int show, mmleak_header_cb on_header,
                                mmleak_tick_cb on_tick, mmleak_open_cb on_open,
                                mmleak_problem_cb on_problem, uint64_t *counts,
                                struct mmleak_shrink_stats *stats,
                                struct mmleak_blocks *blocks)
{
    struct obuf *out;
    char *buf;
    struct run r;
    int rc = read_for_blocks(&r, &out, &buf, paths, name_id, npaths, show, on_header, on_tick,
                             on_open, on_problem, counts, stats, blocks);
    if (rc == 0) {
        out->fd = out_fd;
        rc = final_blocks(&r, out, stats, blocks);
    }
    return run_end(&r, buf, out, rc);
}

/* The survivors of R's table (its entries, written already) as blocks in BLOCKS, over the
 * entries in place (block k over entries before i >= k, each read first), as
 * mmleak_shrink_blocks gives them; BLOCKS left empty when a survivor is not a block. */
void table_blocks(struct run *r, struct mmleak_blocks *blocks)
{
    struct table *t = &r->t;
    struct mmleak_block *v = (struct mmleak_block *)(void *)t->e;
    size_t k = 0;
    int whole = 1;
    for (size_t i = 0; i < t->count && whole; i++) {
        struct ent e = t->e[i];
        struct mmleak_block b;
        int k_last = e.hull ? e.k1 : e.k0;
        if (k_last != K_ALLOC)
            continue;       /* freed, a bracket or a foreign free: not alive */
        if (!line_block(e.hull ? e.l1 : e.l0, &b))
            whole = 0;
        else
            v[k++] = b;
    }
    if (whole) {
        if (t->ix)
            munmap(t->ix, t->ix_bytes);
        t->ix = NULL;
        hand_over(t, v, k, blocks);
    }
}

/* mmleak_shrink's result (not final, every entry) written to OUT_FD as mmleak_shrink writes
 * it, and then its survivors as blocks in BLOCKS, as mmleak_shrink_blocks gives them: what
 * the last compaction pass of a trace writes and what that trace's last series point reads,
 * from one reading of the inputs.  Returns as mmleak_shrink; 0 with BLOCKS empty (v NULL)
 * when a survivor is not a block (several callers inline, format 1): then the caller reads
 * the result again. */
EXPORT int mmleak_shrink_result_blocks(const char *const *paths, const int *name_id,
                                       int npaths, int out_fd, int show,
                                       mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                                       mmleak_open_cb on_open, mmleak_problem_cb on_problem,
                                       uint64_t *counts, struct mmleak_shrink_stats *stats,
                                       struct mmleak_blocks *blocks)
{
    struct obuf *out;
    char *buf;
    struct run r;
    int rc = read_for_blocks(&r, &out, &buf, paths, name_id, npaths, show, on_header, on_tick,
                             on_open, on_problem, counts, stats, blocks);
    if (rc == 0) {
        struct table *t = &r.t;
        out->fd = out_fd;
        write_state(&r, out, 0, t->e, t->count);    /* (sorts the entries in place) */
        if (out->err) {
            stats->out_errno = (uint64_t)out->err;
            rc = -2;
        }
    }
    if (rc == 0)
        table_blocks(&r, blocks);
    return run_end(&r, buf, out, rc);
}

EXPORT void mmleak_shrink_stats_free(struct mmleak_shrink_stats *stats)
{
    if (stats->used)
        munmap((void *)(uintptr_t)stats->used, stats->used_bytes);
    stats->used = 0;
    stats->nused = 0;
}

/* The interface version mmleak.py checks before it relies on the functions' signatures. */
EXPORT int mmleak_shrink_abi(void) { return 8; }
