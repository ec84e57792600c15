/* tools/scan_roots.h: what the reachability scan leaves out of its roots, read from the
 * process: mmleak.so's own mappings (the list tracer/ownlist.h describes), the stacks of
 * threads glibc took back, glibc's heaps (tools/scan_roots.c; the rules: mmleak-scan(7),
 * "Roots").  Memory is read through a callback, so that this knows nothing of the scan. */
#ifndef MMLEAK_SCAN_ROOTS_H
#define MMLEAK_SCAN_ROOTS_H
#include <stddef.h>
#include <stdint.h>

#include "../tracer/ownlist.h"

/* Read N bytes at ADDR of the process into BUF; what cannot be read reads as zeros. */
typedef size_t (*mml_read_fn)(void *ctx, uint64_t addr, void *buf, size_t n);

/* struct pthread's size and where two of its fields are, as the libc.so.6 that the process
 * runs says to debuggers (its _thread_db_* descriptors, the ones libthread_db reads). */
struct mml_pthread_layout {
    uint32_t size;          /* sizeof (struct pthread) */
    uint32_t tid;           /* offset of tid (int): 0 or -1 once the thread has exited */
    uint32_t cancel;        /* offset of cancelhandling (int) */
};

/* glibc's TERMINATED_BIT of cancelhandling (nptl/descr.h, the same since glibc 2.3): the
 * thread was joined, or was detached and exited; its stack went back to glibc's cache */
#define MML_PTHREAD_TERMINATED 0x20

/* The three _thread_db_* symbols read (the size: one uint32_t; tid, cancelhandling: three
 * each, bits, count, offset) */
extern const char *const mml_pthread_symbols[3];
/* L from what the three symbols hold, GOT (the size in got[0][0]), if it is a layout: 0, or
 * -1 (not one: a descriptor that is not one int inside the struct) */
int mml_pthread_layout_of(const uint32_t got[3][3], struct mml_pthread_layout *l);

/* Fill L from PATH (the libc.so.6 of the process, opened as PATH, or /proc/PID/root/PATH
 * first), mapped from LO.  0 done, -1 not found (another libc, a stripped dynamic symbol
 * table).  mmleak.so's copy (tools/scan_inproc.h) takes it from mml_here_layout first. */
int mml_pthread_layout(int pid, const char *path, uint64_t lo, struct mml_pthread_layout *l);
#ifdef MML_SCAN_INPROC
/* tracer/scanhere.c: the layout the exiting process's loader had for the object mapped from
 * LO, read before the scan: 0 (L filled), or -1 */
int mml_here_layout(uint64_t lo, struct mml_pthread_layout *l);
#endif

/* mmleak.so's own mappings, from its list (tracer/ownlist.h) if its magic is in [LO, HI)
 * (one of mmleak.so's writable mappings): their ranges, sorted by address, in *OUT (malloc'd;
 * NULL with 0), and how many.  A slot being taken or given back is no range. */
size_t mml_own_ranges(mml_read_fn rd, void *ctx, uint64_t lo, uint64_t hi,
                      struct mml_own_slot **out);

/* Is [LO, HI), an anonymous mapping right above a guard page, the stack of a thread glibc
 * took back: glibc's struct pthread at its top (tcb and self point to it), its tid 0 or -1
 * and TERMINATED in its cancelhandling?  1, the descriptor in *PD and the page end after it
 * in *END (the caller checks that no live thread has that descriptor); 0 when the
 * descriptor says otherwise; -1 when there is none. */
int mml_dead_pthread(mml_read_fn rd, void *ctx, const struct mml_pthread_layout *l,
                     uint64_t lo, uint64_t hi, uint64_t *pd, uint64_t *end);

/* Does the anonymous mapping [LO, HI) start with the heap_info of one of glibc's arenas (a
 * thread's heap: 64 MiB-aligned, its ar_ptr 32 or 48 bytes into such a heap, the
 * malloc_state after the first heap_info, 48 since glibc 2.35)? */
int mml_arena_heap(mml_read_fn rd, void *ctx, uint64_t lo, uint64_t hi);

#endif
