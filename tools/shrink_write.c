/* tools/shrink_write.c: the compiled shrinker's output: the state written as a result
 * (Shrinker.entries: sorted by address then number, brackets unless final) through a
 * buffer, and what a result's head says of it (its lines, allocations and frees, the
 * allocations' bytes and newest time, the stack ids it uses), counted while writing, or
 * while reading when the head comes first (SHRINK_HEAD_FIRST: note_last).  Separate from
 * the input and the algebra: this file alone knows how an entry becomes lines. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shrink_int.h"

/* ---- output buffer ------------------------------------------------------------------- */

static void write_all(int fd, const char *p, size_t n, int *err)
{
    while (n && !*err) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            *err = errno;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static void ob_flush(struct obuf *o)
{
    write_all(o->fd, o->b, o->n, &o->err);
    o->n = 0;
}

static void ob_put(struct obuf *o, const char *p, size_t n)
{
    if (o->n + n > sizeof o->b) {
        ob_flush(o);
        if (n > sizeof o->b) {
            write_all(o->fd, p, n, &o->err);
            return;
        }
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void ob_u(struct obuf *o, uint64_t v, int base)
{
    char t[24];
    int i = sizeof t;
    do {
        t[--i] = "0123456789abcdef"[v % (unsigned)base];
        v /= (unsigned)base;
    } while (v);
    ob_put(o, t + i, sizeof t - (size_t)i);
}

int cmp_ent(const void *a, const void *b)
{
    uint64_t x = ((const struct ent *)a)->key, y = ((const struct ent *)b)->key;
    return x < y ? -1 : x > y;
}

/* A hull end: its line, or (EVENT 0) its bracket "PTR SEQ SIGN" (L holds only the PTR). */
static void put_end(struct obuf *o, const char *l, size_t n, uint64_t s, char sign, int event)
{
    ob_put(o, l, n);
    if (event)
        return;
    ob_put(o, " ", 1);
    ob_u(o, s, 16);
    char t[2] = { ' ', sign };
    ob_put(o, t, 2);
    ob_put(o, "\n", 1);
}

/* Note stack id ID as used by the result (a set: open addressing, doubled at half load). */
static int use_stack(struct run *r, uint64_t id)
{
    if (!id) {
        r->used_zero = 1;
        return 0;
    }
    if (id == r->last_used)     /* the result's lines come by address: runs of one stack */
        return 0;
    if (!r->used || (r->used_n + 1) * 2 > r->used_mask + 1) {
        size_t cap = r->used ? (r->used_mask + 1) * 2 : 256;
        uint64_t *nv = map_mem(cap * sizeof *nv);
        if (!nv)
            return -1;
        for (size_t i = 0; r->used && i <= r->used_mask; i++) {
            if (!r->used[i])
                continue;
            size_t j = (size_t)((r->used[i] * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
            while (nv[j])
                j = (j + 1) & (cap - 1);
            nv[j] = r->used[i];
        }
        if (r->used)
            munmap(r->used, (r->used_mask + 1) * sizeof *nv);
        r->used = nv;
        r->used_mask = cap - 1;
    }
    size_t j = (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) & r->used_mask;
    for (; r->used[j]; j = (j + 1) & r->used_mask)
        if (r->used[j] == id) {
            r->last_used = id;
            return 0;
        }
    r->used[j] = id;
    r->used_n++;
    r->last_used = id;
    return 0;
}

/* An allocation line of the result (valid: parse_line took it), N bytes with its newline:
 * its size, time and stack.  Its first two fields (PTR and SEQ) are skipped, not parsed;
 * a stack reference that is the same text as the last line's is not looked up again (the
 * result comes by address, and neighbours often share their stack). */
static void note_alloc(struct run *r, const char *l, size_t n)
{
    uint64_t v, size = 0, tm = 0;
    const char *q = memchr(l, ' ', n);
    q = memchr(q + 1, ' ', n - (size_t)(q + 1 - l));
    q = hexf(q + 1, &size);
    q = hexf(q + 1, &tm);
    r->st->alloc_bytes_hi += (r->st->alloc_bytes += size) < size;
    if (tm > r->st->newest)
        r->st->newest = tm;
    if (!q || q[0] != ' ' || q[1] != '@')
        return;
    const char *id = q + 2;
    size_t len = (size_t)(l + n - 1 - id);
    if (len == r->last_ref_n && !memcmp(id, r->last_ref, len))
        return;
    if (hexf(id, &v) && use_stack(r, v))
        r->stop = -1;
    if (len <= sizeof r->last_ref) {
        memcpy(r->last_ref, id, len);
        r->last_ref_n = len;
    } else
        r->last_ref_n = 0;
}

/* What put_ent does with an entry: its lines written (PUT_LINES), its allocations noted
 * and the lines counted (PUT_NOTE), or both. */
enum { PUT_LINES = 1, PUT_NOTE = 2, PUT_BOTH = 3 };

/* The lines of the entry E (FINAL: without brackets) to O; C: lines, allocations and frees
 * written, counted. */
static inline __attribute__((always_inline)) void put_ent(struct run *r, struct obuf *o,
                                                          int final, const struct ent *e,
                                                          uint64_t c[3], int what)
{
    if (e->pend)                /* a held pair whose inputs are over: it cancelled */
        return;
    if (!e->hull) {
        if (!final || e->k0 == K_ALLOC || e->k0 == K_FREE) {
            if (what & PUT_LINES)
                ob_put(o, e->l0, e->n0);
            if (!(what & PUT_NOTE))
                return;
            c[0]++;
            if (e->k0 == K_ALLOC) {
                c[1]++;
                note_alloc(r, e->l0, e->n0);
            }
            c[2] += e->k0 == K_FREE;
        }
        return;
    }
    if (e->k0 == K_FREE || !final) {
        if (what & PUT_LINES)
            put_end(o, e->l0, e->n0, e->s0, '+', e->k0 == K_FREE);
        if (what & PUT_NOTE) {
            c[0]++;
            c[2] += e->k0 == K_FREE;
        }
    }
    if (e->k1 == K_ALLOC || !final) {
        if (what & PUT_LINES)
            put_end(o, e->l1, e->n1, e->s1, '-', e->k1 == K_ALLOC);
        if (what & PUT_NOTE) {
            c[0]++;
            if (e->k1 == K_ALLOC) {
                c[1]++;
                note_alloc(r, e->l1, e->n1);
            }
        }
    }
}

/* put_ent (PUT_BOTH), for the merge (tools/shrink_merge.c), which writes an entry at a time */
void write_ent(struct run *r, struct obuf *o, int final, const struct ent *e, uint64_t c[3])
{
    put_ent(r, o, final, e, c, PUT_BOTH);
}

static void hand_used(struct run *r);

/* The last entry of the LAZY table noted for the head (see struct run's NOTING). */
void note_last(struct run *r)
{
    const struct ent *e = &r->t.e[r->t.count - 1];
    r->npend += e->pend != 0;
    put_ent(r, NULL, r->final_notes, e, r->nc, PUT_NOTE);
    r->noted = r->t.count;
}

/* The notes taken while reading dropped: write_state takes them all. */
__attribute__((cold, noinline)) void notes_drop(struct run *r)
{
    r->noting = 0;
    r->noted = 0;
    memset(r->nc, 0, sizeof r->nc);
    r->npend = 0;
    r->st->alloc_bytes = r->st->alloc_bytes_hi = r->st->newest = 0;
    if (r->used)
        munmap(r->used, (r->used_mask + 1) * sizeof *r->used);
    r->used = NULL;
    r->used_mask = r->used_n = 0;
    r->used_zero = 0;
    r->last_used = 0;
    r->last_ref_n = 0;
}

/* Shrinker.entries: sorted by address then number; FINAL drops brackets.  The M entries
 * E (the table's, or those mmleak_shrink_blocks leaves) are sorted in place (a LAZY
 * table's are sorted already). */
void write_state(struct run *r, struct obuf *o, int final, struct ent *ents, size_t m)
{
    int table = ents == r->t.e && m == r->t.count;
    size_t sorted = table && r->t.lazy ? m : 1;
    while (sorted < m && ents[sorted - 1].key < ents[sorted].key)
        sorted++;
    if (sorted < m)             /* (a result read whole comes in order: no sort then) */
        qsort(ents, m, sizeof *ents, cmp_ent);
    uint64_t c[3] = { 0, 0, 0 }, npend = 0;
    if (r->head_first) {        /* what the head needs first, then the head, then the lines */
        size_t from = 0;
        if (r->noting && table && r->t.lazy && r->final_notes == final && r->noted <= m) {
            from = r->noted;    /* noted while reading */
            memcpy(c, r->nc, sizeof c);
            npend = r->npend;
        } else if (r->noting) {
            notes_drop(r);
        }
        r->noting = 0;
        for (size_t i = from; i < m; i++) {
            npend += ents[i].pend != 0;         /* a held pair: it cancelled */
            put_ent(r, o, final, &ents[i], c, PUT_NOTE);
        }
        r->st->entries = m - npend;
        r->st->lines = c[0];
        r->st->alloc_lines = c[1];
        r->st->free_lines = c[2];
        hand_used(r);
        if (r->stop || (r->on_header && r->on_header(NULL, 0, -1, 0))) {
            r->stop = r->stop ? r->stop : 1;
            return;
        }
        for (size_t i = 0; i < m; i++)
            put_ent(r, o, final, &ents[i], c, PUT_LINES);
        ob_flush(o);
        return;
    }
    for (size_t i = 0; i < m; i++) {
        npend += ents[i].pend != 0;             /* a held pair: it cancelled */
        put_ent(r, o, final, &ents[i], c, PUT_BOTH);
    }
    r->st->entries = m - npend;
    r->st->lines = c[0];
    r->st->alloc_lines = c[1];
    r->st->free_lines = c[2];
    write_end(r, o);
}

/* The end of a result written: the output flushed, the stack ids it uses handed over. */
void write_end(struct run *r, struct obuf *o)
{
    ob_flush(o);
    hand_used(r);
}

/* The stack ids the result uses, packed at the front of their own mapping, handed over
 * (stats' used, nused, used_bytes). */
static void hand_used(struct run *r)
{
    size_t n = 0;
    for (size_t i = 0; r->used && i <= r->used_mask; i++)
        if (r->used[i])
            r->used[n++] = r->used[i];
    if (r->used_zero) {
        if (!r->used && use_stack(r, 1)) {      /* a mapping for the one id 0 */
            r->stop = -1;
            return;
        }
        r->used[n++] = 0;
    }
    r->st->used = (uint64_t)(uintptr_t)r->used;
    r->st->nused = n;
    r->st->used_bytes = r->used ? (r->used_mask + 1) * sizeof *r->used : 0;
    r->used = NULL;
    r->last_used = 0;
    r->last_ref_n = 0;
}

