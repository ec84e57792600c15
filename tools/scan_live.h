/* tools/scan_live.h: the live set of a scan's cut (tools/scan_live.c). */
#ifndef MMLEAK_SCAN_LIVE_H
#define MMLEAK_SCAN_LIVE_H
#include <stddef.h>
#include <stdint.h>

/* The live blocks, sorted by address: N of them, their address, size and number (SEQ);
 * ATTACHED: a "#mmleak" header says window=1; GLIBC: an "#alloc" header names libc.so. */
struct mmleak_live {
    uint64_t *ptr, *size, *seq;
    size_t n;
    int attached, glibc;
};

/* An input: the first LIMIT bytes of FD (closed by mmleak_live_set), then TLEN bytes at TAIL
 * (taken only when FD had all LIMIT bytes: they follow them).  SORTED: a compacted result
 * or run (mmleak-compaction(7)), whose event lines come in address order: read into an
 * array and merged, without the table (one out of order, and it goes through the table
 * like any other input). */
struct mmleak_input {
    int fd;
    uint64_t limit;
    const char *tail;
    size_t tlen;
    int sorted;
};

/* N bytes for free(), on huge pages when they can be had (a big array) */
void *mmleak_big_alloc(size_t n);

/* Is a CPU idle (/proc/stat's procs_running, this thread included, below the CPUs of our
 * affinity)?  A helper thread started then does not take its time from ours. */
int mmleak_cpu_to_spare(void);

int mmleak_live_set(int nfiles, int (*open_input)(int, struct mmleak_input *),
                    struct mmleak_live *out);

#endif
