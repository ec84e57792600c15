/* tools/scan_read.h: the marking's reader thread (tools/scan_read.c): the next stretch of
 * the heap read ahead, on a CPU otherwise idle, while the words of the last are scanned. */
#ifndef MMLEAK_SCAN_READ_H
#define MMLEAK_SCAN_READ_H
#include <stddef.h>
#include <stdint.h>

struct reader;

/* A reader of process RPID's memory into buffers of CAP bytes (mmap'ed), its thread started;
 * or NULL: no thread (none wanted for a heap of SPAN bytes, no CPU idle, or none could be
 * had), the caller reads as it would without. */
struct reader *reader_start(int rpid, size_t cap, uint64_t span);

/* Read [LO, HI) (at most CAP bytes) ahead, once the read asked before is done. */
void reader_ask(struct reader *r, uint64_t lo, uint64_t hi);

/* When the read asked last holds [A, B): waits for it; when it read all it asked, gives the
 * caller its buffer in exchange for *BUF (CAP bytes, mmap'ed), sets *LO, *HI to the range
 * that buffer holds, and returns 1.  Otherwise 0 (nothing changed but the wait). */
int reader_take(struct reader *r, uint64_t a, uint64_t b, char **buf, uint64_t *lo,
                uint64_t *hi);

/* Stops R's thread and frees it; the process_vm_readv calls it made, for the debug output. */
uint64_t reader_stop(struct reader *r);

#endif
