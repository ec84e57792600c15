/* tools/shrink_fold.h: the folding algebra of the shrink (mmleak-format(5), "The shrink
 * algorithm"; mmleaklib/shrink.py's Shrinker.feed, the reference): an event added to the
 * state of its address, one event or the hull of the lowest and highest, an adjacent pair
 * cancelling, a pair from two inputs held.  Inline, as tracer/record.h is: the reader's loop
 * (tools/shrink_read.c, feed_fd) and the merge (tools/shrink_merge.c, merge_event) each
 * compile it into their own loop, as it was when they were one file. */
#ifndef MMLEAK_SHRINK_FOLD_H
#define MMLEAK_SHRINK_FOLD_H
#include "shrink_int.h"

static inline size_t ptr_len(const char *p)
{
    return (size_t)((const char *)memchr(p, ' ', 17) - p);
}

/* Store an end: the whole line, or only its PTR field when the end is a bracket. */
static inline char *store(struct run *r, const char *p, size_t n, uint32_t *len)
{
    char *c = slab_alloc(&r->mem, n);
    if (unlikely(!c)) {
        r->stop = -1;
        return NULL;
    }
    memcpy(c, p, n);
    *len = (uint32_t)n;
    return c;
}

/* Cut a stored line down to its PTR field (a hull end that will be written as a bracket). */
static inline void to_bracket(struct run *r, char **l, uint32_t *n)
{
    size_t k = ptr_len(*l);
    /* keep the block only when its size class stays the same (slab_free recomputes it) */
    if (*n > SLAB_MAX || (k + SLAB_GRAIN - 1) / SLAB_GRAIN != (*n + SLAB_GRAIN - 1) / SLAB_GRAIN) {
        uint32_t nk;
        char *c = store(r, *l, k, &nk);
        if (!c)
            return;
        slab_free(&r->mem, *l, *n);
        *l = c;
    }
    *n = (uint32_t)k;
}

/* A hull end (its line L, length LEN, number SEQ, kind K) replaced by the event P (N bytes
 * kept: the line, or its PTR field for a bracket), number S. */
static inline void new_end(struct run *r, char **l, uint32_t *len, uint64_t *seq, uint8_t *k,
                           const char *p, size_t n, uint64_t s, int kind)
{
    uint32_t nn;
    char *c = store(r, p, n, &nn);
    if (!c)
        return;
    slab_free(&r->mem, *l, *len);
    *l = c;
    *len = nn;
    *seq = s;
    *k = (uint8_t)kind;
}

static inline void dup_event(struct run *r, int file, uint64_t lineno)
{
    problem(r, file, lineno, Q_DUPLICATE, NULL, 0);
}

/* A new entry E for the address KEY: the event P (N bytes), number S, kind KIND.  0, or -1
 * when its line could not be stored (r->stop says so). */
static inline int ent_new(struct run *r, struct ent *e, const char *p, size_t n, uint64_t key,
                          uint64_t s, int kind, int file)
{
    e->l0 = store(r, p, n, &e->n0);
    if (!e->l0)
        return -1;
    e->key = key;
    e->s0 = s;
    e->k0 = (uint8_t)kind;
    e->hull = 0;
    e->pend = 0;
    e->file = file;
    return 0;
}

/* The entry E, a hull held for an adjacent pair (PEND), dropped (the pair is all there is
 * of its two inputs) and made anew of the event P (N bytes), number S, kind KIND of input
 * FILE. */
static inline void ent_renew(struct run *r, struct ent *e, const char *p, size_t n, uint64_t s,
                             int kind, int file)
{
    struct ent x;
    if (ent_new(r, &x, p, n, e->key, s, kind, file))
        return;                 /* no memory (r->stop says so): E is left as it was */
    slab_free(&r->mem, e->l0, e->n0);
    slab_free(&r->mem, e->l1, e->n1);
    *e = x;
}

/* The event P (N bytes), number S, kind KIND, added to the entry E of its address: the
 * whole algorithm (Shrinker.feed) once the address has a state.  Returns 1 when the pair
 * cancelled (the entry's line is freed: the caller drops the entry), else 0. */
static inline int ent_update(struct run *r, struct ent *e, int file, uint64_t lineno,
                             const char *p, size_t n, uint64_t s, int kind)
{
    int pend = 0;
    if (!e->hull) {
        if (e->s0 == s) {
            dup_event(r, file, lineno);
            return 0;
        }
        /* an adjacent pair cancels when both events are of this input (all it has of the
         * address); from two inputs, this one's event may be one end of a hull whose other
         * end comes later in it (a result's two lines): the pair is held as a hull until
         * this input's next event of the address, or its end, says it is not (Shrinker.feed) */
        if (e->s0 < s) {          /* old is the low end */
            if ((e->k0 & 1) && !(kind & 1) && s == e->s0 + 1) {
                if (e->file == file) {
                    slab_free(&r->mem, e->l0, e->n0);
                    return 1;
                }
                pend = 2;
            }
            e->l1 = store(r, p, n, &e->n1);
            if (!e->l1)
                return 0;
            e->s1 = s;
            e->k1 = (uint8_t)kind;
        } else {                  /* old is the high end */
            if ((kind & 1) && !(e->k0 & 1) && e->s0 == s + 1) {
                if (e->file == file) {
                    slab_free(&r->mem, e->l0, e->n0);
                    return 1;
                }
                pend = 1;
            }
            char *c = store(r, p, n, &e->n1);   /* n1 temporarily holds the new length */
            if (!c)
                return 0;
            e->l1 = e->l0;
            e->s1 = e->s0;
            e->k1 = e->k0;
            uint32_t nn = e->n1;
            e->n1 = e->n0;
            e->l0 = c;
            e->n0 = nn;
            e->s0 = s;
            e->k0 = (uint8_t)kind;
        }
        e->hull = 1;
        e->pend = (uint8_t)pend;
        e->file = file;
        if (e->k0 != K_FREE)
            to_bracket(r, &e->l0, &e->n0);
        if (e->k1 != K_ALLOC)
            to_bracket(r, &e->l1, &e->n1);
        return 0;
    }
    if (e->pend) {
        /* a held pair: another input's event (the pair's input is over), or this input's
         * next to its end: nothing of it lies between, the pair cancels */
        if (e->file != file ||
            s == (e->pend == 2 ? e->s1 + 1 : e->s0 - 1)) {
            ent_renew(r, e, p, n, s, kind, file);
            return 0;
        }
        e->pend = 0;
    }
    if (s < e->s0)
        new_end(r, &e->l0, &e->n0, &e->s0, &e->k0, p, kind == K_FREE ? n : ptr_len(p), s, kind);
    else if (s > e->s1)
        new_end(r, &e->l1, &e->n1, &e->s1, &e->k1, p, kind == K_ALLOC ? n : ptr_len(p), s, kind);
    else if (s == e->s0 || s == e->s1) {
        dup_event(r, file, lineno);
    }
    return 0;
}

/* The state update: an event into the table (Shrinker.feed). */
static inline void event(struct run *r, int file, uint64_t lineno, const char *p, size_t n,
                         uint64_t key, uint64_t s, int kind)
{
    struct table *t = &r->t;
    if (t->lazy) {              /* the addresses ascending so far: no index */
        struct ent *last = t->count ? &t->e[t->count - 1] : NULL;
        if (!last || key > last->key) {
            if (r->noting && r->noted < t->count)
                note_last(r);   /* the last entry is what it will be written as */
            if (unlikely(t->count == t->cap) && table_grow(t)) {
                r->stop = -1;
                return;
            }
            if (unlikely((t->count + 1) * sizeof *t->e > t->pop))
                populate_ahead(t);
            if (!ent_new(r, &t->e[t->count], p, n, key, s, kind, file))
                t->count++;
            return;
        }
        if (key == last->key) {
            if (unlikely(r->noting && r->noted >= t->count))
                notes_drop(r);  /* an entry noted changes */
            if (ent_update(r, last, file, lineno, p, n, s, kind))
                t->count--;     /* (its line freed: the last entry, no hole to fill) */
            return;
        }
        if (r->noting)
            notes_drop(r);      /* (the notes hold for a LAZY table only) */
        if (table_index(t)) {   /* a lower address: the index from now on */
            r->stop = -1;
            return;
        }
    }
    size_t i = home(t, key);
    uint32_t x;
    while ((x = t->ix[i]) && t->e[x - 1].key != key)
        i = (i + 1) & t->mask;
    if (!x) {
        if (unlikely(t->count == t->cap || (t->count + 1) * 10 > (t->mask + 1) * 7)) {
            if (table_room(t)) {
                r->stop = -1;
                return;
            }
            event(r, file, lineno, p, n, key, s, kind);
            return;
        }
        if (unlikely((t->count + 1) * sizeof *t->e > t->pop))
            populate_ahead(t);
        if (ent_new(r, &t->e[t->count], p, n, key, s, kind, file))
            return;
        t->ix[i] = (uint32_t)++t->count;
        return;
    }
    if (ent_update(r, &t->e[x - 1], file, lineno, p, n, s, kind))
        table_del(t, i);
}

#endif
