/* tools/eventline.h: an event line of the dump format (mmleak-format(5)), as the shrink
 * engine (tools/shrink_read.c) and the scan's live set (tools/scan_live.c) take it: one parser,
 * so that the two agree on which lines are events.  The line must end with its newline,
 * which is the sentinel of every loop here.
 *
 *   PTR SEQ +                      a thread's start        K_START
 *   PTR SEQ -                      a thread's end          K_END
 *   PTR SEQ CALLER                 a free                  K_FREE
 *   PTR SEQ SIZE TIME CALLER...    an allocation (format 1: its frames)
 *   PTR SEQ SIZE TIME @ID          an allocation (format 2: its "#s" stack line)
 *
 * Every field is 1 to 16 lowercase hex digits, one space between two. */
#ifndef MMLEAK_EVENTLINE_H
#define MMLEAK_EVENTLINE_H

#include <stdint.h>

#include "../tracer/compiler.h"

enum { K_FREE = 0, K_ALLOC = 1, K_END = 2, K_START = 3 };   /* odd kinds: allocation-like */

static const unsigned char EV_HEX[256] = {
#define X16 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99
    X16, X16, X16,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 99, 99, 99, 99, 99,
    X16, X16,
    99, 10, 11, 12, 13, 14, 15, 99, 99, 99, 99, 99, 99, 99, 99, 99,
    X16, X16, X16, X16, X16, X16, X16, X16, X16,
#undef X16
};

/* One field of 1 to 16 lowercase hex digits at P: past it, or NULL. */
static inline const char *hexf(const char *p, uint64_t *v)
{
    const char *s = p;
    uint64_t x = 0;
    unsigned d;
    while ((d = EV_HEX[(unsigned char)*p]) < 16) {
        x = x << 4 | d;
        p++;
    }
    if (unlikely(p == s || p - s > 16))
        return NULL;
    *v = x;
    return p;
}

/* A field (hexf) at *P and what ends it: 1 the newline, 0 a space (*P then past it), -1
 * anything else, or no field. */
static inline int field(const char **p, uint64_t *v)
{
    const char *q = hexf(*p, v);
    if (!q || (*q != ' ' && *q != '\n'))
        return -1;
    *p = q + 1;
    return *q == '\n';
}

/* The event line at P (EVENT_RE.fullmatch of mmleaklib/dumpformat.py): its kind, or -1.
 * *PTR and *SEQ always; *SIZE and *TIME an allocation's. */
static inline int event_fields(const char *p, uint64_t *ptr, uint64_t *seq, uint64_t *size,
                               uint64_t *tm)
{
    uint64_t c;
    const char *q = hexf(p, ptr);
    if (!q || *q != ' ')
        return -1;
    q = hexf(q + 1, seq);
    if (!q || *q != ' ')
        return -1;
    q++;
    if (*q == '+' || *q == '-') {
        int k = *q == '+' ? K_START : K_END;
        return q[1] == '\n' ? k : -1;
    }
    int end = field(&q, size);
    if (end)
        return end > 0 ? K_FREE : -1;
    q = hexf(q, tm);
    if (!q || *q != ' ')
        return -1;
    if (q[1] == '@') {      /* format 2: a reference to a "#s" stack line */
        q = hexf(q + 2, &c);
        return q && *q == '\n' ? K_ALLOC : -1;
    }
    q++;
    while (!(end = field(&q, &c)))
        ;
    return end > 0 ? K_ALLOC : -1;
}

#endif
