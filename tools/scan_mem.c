/* tools/scan_mem.c: the target as the reachability scan sees it: its memory map
 * (/proc/PID/maps, each mapping marked when a live block is in it) and its memory, read with
 * process_vm_readv, what cannot be read taken as zeros and counted.  Separate because every
 * other part of the scan reads the target through these; the marking's bulk reads (a batch
 * of blocks, the heap around it, the reader thread's: tools/scan_mark.c, tools/scan_read.c)
 * are its own. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tracer/compiler.h"

#include "scan_int.h"

/* ---- 4. the memory map ----------------------------------------------------------- */

size_t first_block_at_or_after(struct scan *s, uint64_t a)
{
    size_t lo = 0, hi = s->nb;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->bp[mid] < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int read_maps(struct scan *s)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", s->rpid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return say(s, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    s->mapsbuf = malloc(cap + 1);
    for (;;) {
        if (!s->mapsbuf) {
            close(fd);
            return say(s, "out of memory");
        }
        ssize_t r = read(fd, s->mapsbuf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == cap) {
            cap *= 2;
            s->mapsbuf = realloc(s->mapsbuf, cap + 1);
        }
    }
    close(fd);
    s->mapsbuf[n] = 0;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += s->mapsbuf[i] == '\n';
    s->mp = calloc(lines + 1, sizeof *s->mp);
    if (!s->mp)
        return say(s, "out of memory");
    char *line = s->mapsbuf, *save = NULL;
    for (char *l = strtok_r(line, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        struct mapping *m = &s->mp[s->nmp];
        unsigned long long lo, hi, fo;
        int off = 0;
        if (sscanf(l, "%llx-%llx %4s %llx %*s %*s%n", &lo, &hi, m->perm, &fo, &off) < 4)
            continue;
        m->off = fo;
        char *pth = l + off;
        while (*pth == ' ')
            pth++;
        m->lo = lo;
        m->hi = hi;
        m->path = pth;
        size_t i = first_block_at_or_after(s, lo);
        m->heap = i < s->nb && s->bp[i] < hi;
        s->nmp++;
    }
    return 0;
}

const struct mapping *mapping_at(struct scan *s, uint64_t a)
{
    size_t lo = 0, hi = s->nmp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->mp[mid].hi <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->nmp && s->mp[lo].lo <= a ? &s->mp[lo] : NULL;
}

/* ---- 5. reading the target --------------------------------------------------------- */

/* Read N bytes at A into BUF; what cannot be read is zeros.  Returns the bytes read. */
size_t scan_rd(struct scan *s, uint64_t a, void *buf, size_t n)
{
    struct iovec l = { buf, n }, r = { (void *)a, n };
    s->reads++;
    ssize_t got = process_vm_readv(s->rpid, &l, 1, &r, 1, 0);
    if (got == (ssize_t)n)
        return n;
    if (got < 0 && errno == ESRCH)
        s->vanished = 1;
    size_t done = got > 0 ? (size_t)got : 0;
    /* a page that cannot be read (a hole of a file mapping, PROT_NONE): page by page */
    while (done < n) {
        uint64_t at = a + done;
        size_t chunk = 4096 - (at & 4095);
        if (chunk > n - done)
            chunk = n - done;
        l.iov_base = (char *)buf + done;
        l.iov_len = r.iov_len = chunk;
        r.iov_base = (void *)at;
        s->reads++;
        got = process_vm_readv(s->rpid, &l, 1, &r, 1, 0);
        if (got != (ssize_t)chunk) {
            size_t ok = got > 0 ? (size_t)got : 0;
            memset((char *)buf + done + ok, 0, chunk - ok);
            s->unreadable += chunk - ok;
        }
        done += chunk;
    }
    return n;
}

