/* tools/dumplines.c: tools/dumplines.h's reader as a test sees it (tests/test_dumplines.py):
 *
 *   int64_t mmleak_dump_lines(const char *data, size_t n, size_t chunk, size_t hole,
 *                             int (*piece)(int what, uint64_t lineno, const char *p,
 *                                          size_t len));
 *
 * reads the N bytes at DATA CHUNK bytes at a time (1 to 1 MiB; the last chunk shorter), as
 * the shrink engine and the scan read a file, a run of NULs the reader did not read (a hole:
 * dl_hole) after the first HOLE bytes when HOLE is not 0, and calls PIECE for each piece
 * read, in order: WHAT a DL_* of tools/dumplines.h, or for a line ended by its newline 0 (an
 * event line: tools/eventline.h), -1 (blank: dl_blank), -2 (anything else: a header, a
 * malformed line).  Returns the number of pieces, -1 (out of memory, or CHUNK out of range),
 * or -2 (PIECE returned nonzero: the reader stopped there).  Nothing else uses it. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dumplines.h"

typedef int (*piece_cb)(int what, uint64_t lineno, const char *p, size_t len);
struct pieces { piece_cb cb; int64_t n; };

static void t_start(void *c, const char *p, const char *lim, int nuls)
{
    (void)c, (void)p, (void)lim, (void)nuls;
}

static int t_line(void *c, uint64_t lineno, const char *p, size_t n)
{
    struct pieces *x = c;
    uint64_t a, b, s, t;
    int what = event_fields(p, &a, &b, &s, &t) >= 0 ? 0 : dl_blank(p, n) ? -1 : -2;
    x->n++;
    return x->cb(what, lineno, p, n);
}

static int t_odd(void *c, int what, uint64_t lineno, const char *p, size_t n)
{
    struct pieces *x = c;
    x->n++;
    return x->cb(what, lineno, p, n);
}

EXPORT int64_t mmleak_dump_lines(const char *data, size_t n, size_t chunk, size_t hole,
                                 piece_cb piece)
{
    if (chunk < 1 || chunk > ((size_t)1 << 20))
        return -1;
    char *buf = malloc(DL_LINE_MAX + chunk + 16);   /* (16: dl_newline's reads are 16 wide) */
    if (!buf)
        return -1;
    struct dumplines d;
    memset(&d, 0, sizeof d);
    struct pieces x = { piece, 0 };
    const char *p = buf;
    int stop = 0, holed = 0;
    for (size_t at = 0; at < n && !stop;) {
        if (hole && !holed && at == hole) {
            holed = 1;
            if (dl_hole(&d, p, &x, t_odd)) {
                stop = 1;
                break;
            }
        }
        size_t k = n - at < chunk ? n - at : chunk;
        if (hole && at < hole && hole < at + k)
            k = hole - at;              /* a chunk ends where the hole is */
        if (d.have && p != buf)
            memmove(buf, p, d.have);
        memcpy(buf + d.have, data + at, k);
        at += k;
        p = dl_chunk(&d, buf, buf + d.have + k, &x, t_start, t_line, t_odd);
        stop = !p;
    }
    if (!stop && hole && !holed && hole == n)
        stop = dl_hole(&d, p, &x, t_odd);
    if (!stop)
        stop = dl_end(&d, p, &x, t_odd);
    free(buf);
    return stop ? -2 : x.n;
}
