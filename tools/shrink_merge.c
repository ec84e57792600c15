/* tools/shrink_merge.c: the last input streamed (mmleak_shrink_merge,
 * mmleak_shrink_blocks_merge): a sorted result merged by address with the state of the
 * other inputs, each address written as soon as the stream has passed it, never entered in
 * the table (see struct merge).  Separate from the usual run: its own state and its own end
 * (and its fall back to the usual run when the input is not sorted after all). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shrink_fold.h"

/* ---- the last input streamed: a merge of sorted results (mmleak_shrink_merge) ---------
 * A compacted result is written sorted by address (write_state), and the levels of a trace
 * (mmleak-compaction(7)) are such results.  Folding them, the biggest (the oldest) need not
 * go through the table: the other inputs are read into it as usual, its entries sorted, and
 * the big one is read as a stream, its lines merged by address with those entries (an
 * address's state is the same whatever the order of its events: the shrink's algebra), each
 * address written out as soon as the stream has passed it.  Memory and time then follow the
 * other inputs, plus one pass over the streamed one's text: no index slot per line, no
 * sort of its entries. */
struct merge {
    struct ent *e;              /* the table's entries, sorted by address */
    size_t m, j;                /* how many; the first not written yet */
    struct ent cur;             /* the state of the stream's current address */
    int have;                   /* CUR holds an entry */
    int started, disorder;      /* the stream's address went down: not a sorted result */
    uint64_t last;              /* the stream's last address */
    struct obuf *o;
    uint64_t c[3], entries;     /* lines, allocations, frees written; entries */
    struct mmleak_blocks *blocks;   /* the survivors as blocks too (NULL: not wanted) */
    size_t bytes;               /* the blocks' mapping */
    int whole;                  /* every survivor so far is a block */
    int final;                  /* the final result, as mmleak_shrink_blocks gives it */
};

/* The survivor line L as a block appended to the merge's BLOCKS: 1, or 0 when it is not a
 * block (several callers inline) or there is no memory (r->stop). */
static int merge_block(struct run *r, struct merge *g, const char *l)
{
    struct mmleak_blocks *b = g->blocks;
    if ((b->n + 1) * sizeof *b->v > g->bytes) {
        size_t nb = g->bytes ? g->bytes * 2 : (size_t)1 << 21;
        void *p = b->v ? mremap(b->v, g->bytes, nb, MREMAP_MAYMOVE) : map_mem(nb);
        if (!p || p == MAP_FAILED) {
            r->stop = -1;
            return 0;
        }
        b->v = p;
        g->bytes = nb;
    }
    if (!line_block(l, &b->v[b->n]))
        return 0;
    b->n++;
    return 1;
}

/* The entry E written (and its survivor kept as a block), its lines freed. */
static void merge_put(struct run *r, struct merge *g, struct ent *e)
{
    int k_last = e->hull ? e->k1 : e->k0;
    if (g->final) {             /* as final_blocks: a survivor a block, the rest lines */
        struct ent x = *e;
        int line = 1;
        if (!x.hull) {
            if (x.k0 == K_ALLOC && merge_block(r, g, x.l0))
                line = 0;
            else if (x.k0 != K_ALLOC && x.k0 != K_FREE)
                line = 0;       /* a bracket: nothing final */
        } else {
            if (x.k1 == K_ALLOC && merge_block(r, g, x.l1))
                x.k1 = K_END;   /* a bracket: the final result leaves it out */
            line = x.k0 == K_FREE || x.k1 == K_ALLOC;
        }
        if (line) {
            write_ent(r, g->o, 1, &x, g->c);
            g->entries++;
        }
    } else if (!e->pend) {      /* (a held pair: it cancelled) */
        write_ent(r, g->o, 0, e, g->c);
        g->entries++;
        if (g->blocks && g->whole && k_last == K_ALLOC &&
            !merge_block(r, g, e->hull ? e->l1 : e->l0))
            g->whole = 0;       /* (several callers inline: the caller reads again) */
    }
    slab_free(&r->mem, e->l0, e->n0);
    if (e->hull)
        slab_free(&r->mem, e->l1, e->n1);
}

/* An event of the streamed input: the state update of its address (the table's entry of
 * the same address, taken over when the stream reaches it), the addresses before it
 * written. */
void merge_event(struct run *r, int file, uint64_t lineno, const char *p, size_t n,
                        uint64_t key, uint64_t s, int kind)
{
    struct merge *g = r->merge;
    if (g->have && key == g->cur.key) {
        if (ent_update(r, &g->cur, file, lineno, p, n, s, kind))
            g->have = 0;
        return;
    }
    if (unlikely(g->started && key < g->last)) {
        g->disorder = 1;        /* not sorted: mmleak_shrink_merge reads it all again */
        r->stop = 2;
        return;
    }
    g->started = 1;
    g->last = key;
    if (g->have) {
        merge_put(r, g, &g->cur);
        g->have = 0;
    }
    while (g->j < g->m && g->e[g->j].key < key)
        merge_put(r, g, &g->e[g->j++]);
    if (g->j < g->m && g->e[g->j].key == key) {
        g->cur = g->e[g->j++];
        g->have = !ent_update(r, &g->cur, file, lineno, p, n, s, kind);
    } else {
        g->have = !ent_new(r, &g->cur, p, n, key, s, kind, file);
    }
}

/* mmleak_shrink_result_blocks (BLOCKS NULL: mmleak_shrink, not final; FINAL: as
 * mmleak_shrink_blocks, BLOCKS needed), the LAST input
 * (PATHS[NPATHS - 1]: a compacted result, sorted by address) read as a stream and merged
 * with the others' state (see struct merge): the same result, the same counts and problems.
 * The others are read first, so header lines come in that order (the caller lists the
 * inputs so).  An input to stream that is not sorted is read again with the others, the
 * usual way (the problems already handed back are not handed back again).  Returns as
 * mmleak_shrink. */
static int shrink_merge(const char *const *paths, const int *name_id, int npaths, int out_fd,
                        int show, mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                        mmleak_open_cb on_open, mmleak_problem_cb on_problem, uint64_t *counts,
                        struct mmleak_shrink_stats *stats, struct mmleak_blocks *blocks,
                        int final)
{
    struct obuf *out = map_mem(sizeof *out);
    char *buf = map_mem(READ_BUF);
    struct run r;
    struct merge g;
    memset(&r, 0, sizeof r);
    memset(&g, 0, sizeof g);
    if (blocks)
        memset(blocks, 0, sizeof *blocks);
    size_t k = P_KINDS * (size_t)npaths;
    r.own_bytes = 2 * k * sizeof *r.own;      /* (see struct run: a retry's counts) */
    r.own = npaths < 1 ? NULL : map_mem(r.own_bytes);
    if (!out || !buf || npaths < 1 || !r.own)
        return run_end(&r, buf, out, npaths < 1 && out && buf ? 0 : -1);
    out->fd = out_fd;
    int last = npaths - 1;
    int rc = shrink_inputs(&r, paths, name_id, last, show, on_header, on_tick, on_open,
                           on_problem, counts, stats, buf);
    memset(&counts[(size_t)last * P_KINDS], 0, sizeof(uint64_t) * P_KINDS);
    if (rc == 0) {
        int fd = strcmp(paths[last], "-") ? on_open(last) : 0;
        if (fd == -2)
            rc = r.stop = 1;
        else if (fd < 0)
            stats->fatal = 1;
        qsort(r.t.e, r.t.count, sizeof *r.t.e, cmp_ent);
        g.e = r.t.e;
        g.m = r.t.count;
        g.o = out;
        g.blocks = blocks;
        g.whole = 1;
        g.final = final;
        if (fd >= 0) {
            r.merge = &g;
            feed_fd(&r, fd, last, buf);
            if (fd)
                close(fd);
        }
        if (!r.stop) {
            if (g.have)
                merge_put(&r, &g, &g.cur);
            g.have = 0;
            while (g.j < g.m && !r.stop)
                merge_put(&r, &g, &g.e[g.j++]);
        }
        r.merge = NULL;
        rc = r.stop;
    }
    if (rc == 2 && g.disorder) {
        /* not a sorted result: everything again, the usual way, into a new table (the
         * header lines seen stay seen: not handed back again, the problems the header
         * callback counted for them stay counted; those this reader found are counted
         * again only past where the attempt stopped, see problem()) */
        memcpy(r.own + k, r.own, k * sizeof *r.own);
        memset(r.own, 0, k * sizeof *r.own);
        if (blocks && blocks->v)
            munmap(blocks->v, g.bytes);
        if (blocks)
            memset(blocks, 0, sizeof *blocks);
        munmap(r.t.e, r.t.e_bytes);
        if (r.t.ix)
            munmap(r.t.ix, r.t.ix_bytes);
        memset(&r.t, 0, sizeof r.t);
        slab_release(&r.mem);
        memset(&r.mem, 0, sizeof r.mem);
        if (r.used)
            munmap(r.used, (r.used_mask + 1) * sizeof *r.used);
        r.used = NULL;
        r.used_mask = r.used_n = 0;
        r.used_zero = 0;
        r.last_used = 0;
        r.last_ref_n = 0;
        r.stop = 0;
        r.mute = r.own + k;
        out->n = 0;
        out->err = 0;
        if (ftruncate(out_fd, 0) || lseek(out_fd, 0, SEEK_SET) < 0) {
            stats->out_errno = (uint64_t)errno;
            return run_end(&r, buf, out, -2);
        }
        rc = shrink_inputs(&r, paths, name_id, npaths, show, on_header, on_tick, on_open,
                           on_problem, counts, stats, buf);
        r.mute = NULL;
        if (rc == 0 && final) {
            rc = final_blocks(&r, out, stats, blocks);
        } else if (rc == 0) {
            write_state(&r, out, 0, r.t.e, r.t.count);
            if (!out->err && blocks)
                table_blocks(&r, blocks);
        }
    } else if (rc == 0) {
        stats->entries = g.entries + (final ? blocks->n : 0);
        stats->lines = g.c[0];
        stats->alloc_lines = g.c[1];
        stats->free_lines = g.c[2];
        write_end(&r, out);
        if (blocks && !g.whole) {       /* (the caller reads the result again) */
            if (blocks->v)
                munmap(blocks->v, g.bytes);
            memset(blocks, 0, sizeof *blocks);
        } else if (blocks) {
            if (!blocks->v && (blocks->v = map_mem(4096)) != NULL)
                g.bytes = 4096;         /* no survivor: an empty array, not none */
            blocks->cap_bytes = g.bytes;
            if (!blocks->v)
                rc = -1;
        }
    }
    if (rc == 0 && out->err) {
        stats->out_errno = (uint64_t)out->err;
        rc = -2;
    }
    if (rc != 0 && blocks && blocks->v) {
        munmap(blocks->v, blocks->cap_bytes ? blocks->cap_bytes : g.bytes);
        memset(blocks, 0, sizeof *blocks);
    }
    return run_end(&r, buf, out, rc);
}

EXPORT int mmleak_shrink_merge(const char *const *paths, const int *name_id, int npaths,
                               int out_fd, int show, mmleak_header_cb on_header,
                               mmleak_tick_cb on_tick, mmleak_open_cb on_open,
                               mmleak_problem_cb on_problem, uint64_t *counts,
                               struct mmleak_shrink_stats *stats, struct mmleak_blocks *blocks)
{
    return shrink_merge(paths, name_id, npaths, out_fd, show, on_header, on_tick, on_open,
                        on_problem, counts, stats, blocks, 0);
}

/* mmleak_shrink_blocks, the last input streamed as in mmleak_shrink_merge (BLOCKS needed). */
EXPORT int mmleak_shrink_blocks_merge(const char *const *paths, const int *name_id,
                                      int npaths, int out_fd, int show,
                                      mmleak_header_cb on_header, mmleak_tick_cb on_tick,
                                      mmleak_open_cb on_open, mmleak_problem_cb on_problem,
                                      uint64_t *counts, struct mmleak_shrink_stats *stats,
                                      struct mmleak_blocks *blocks)
{
    return shrink_merge(paths, name_id, npaths, out_fd, show, on_header, on_tick, on_open,
                        on_problem, counts, stats, blocks, 1);
}

/* Release the stack ids a run handed over in STATS. */
