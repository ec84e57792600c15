/* tools/blocks.h: survivors as bytes, not objects (issue 19).
 *
 * A live block is one struct mmleak_block, 48 bytes: its address, its number (SEQ: the
 * block is (ptr, seq), the key a per-block classification joins on), size, time (seconds
 * after the trace's start) and stack (the "@ID" of its line, or its one caller).  mmleak_shrink_blocks
 * (shrink.c) fills an array of them; mmleak_blocks_aggregate (blocks.c) sums them per
 * (stack, kind) with the report's filters, without a Python object per block.  Loaded by
 * mmleaklib/native.py with ctypes: the layouts below are mirrored there (NATIVE_ABI). */
#ifndef MMLEAK_TOOLS_BLOCKS_H
#define MMLEAK_TOOLS_BLOCKS_H
#include <stddef.h>
#include <stdint.h>

struct mmleak_block {
    uint64_t ptr, seq, size, time, stack;
    uint32_t frame;             /* 1: STACK is the one caller of a line "PTR SEQ SIZE TIME
                                   CALLER" (depth 1), 0: the id of "@ID" */
    uint32_t pad;
};

/* An array of blocks in its own mapping (mmleak_blocks_free releases it). */
struct mmleak_blocks {
    struct mmleak_block *v;
    uint64_t n, cap_bytes;
};

/* A per-block classification to join (the reachability scan's kinds): N entries sorted by
 * (ptr, seq), KIND[i] the kind of block (PTR[i], SEQ[i]), 1..254; a block not in the table
 * has kind 0.  KIND NULL: no table, every block kind 0. */
struct mmleak_kinds {
    const uint64_t *ptr, *seq;
    const uint8_t *kind;
    uint64_t n;
};

/* One group of the aggregation: the blocks of one (stack, kind) the filters keep.  Sums of
 * bytes are 128 bits (BYTES_HI: the high half): sizes are 64-bit, the report's sums exact. */
struct mmleak_group {
    uint64_t stack, frame, kind, blocks, bytes, min_size, max_size, min_time, max_time, min_ptr;
    uint64_t bytes_hi;
};

/* What mmleak_blocks_aggregate keeps: time in [TMIN, TMAX], and not in EXCLUDE (a sorted
 * (ptr, seq) table, the --baseline snapshot; kinds unused).  EXCLUDE's SEEN (n bytes, may be
 * NULL) gets 1 where the entry is alive now among the blocks the time filter keeps. */
struct mmleak_filter {
    uint64_t tmin, tmax;
    struct mmleak_kinds exclude;
    uint8_t *seen;
};

/* The result: the groups (ordered by min_ptr, the address of each group's first block, as
 * the Python engine meets them), and the totals before and after the filters. */
struct mmleak_aggregate {
    struct mmleak_group *g;
    uint64_t n, cap_bytes;
    uint64_t all_blocks, all_bytes, kept_blocks, kept_bytes, all_bytes_hi, kept_bytes_hi;
};

/* Release the mapping of B (blocks.c). */
void mmleak_blocks_free(struct mmleak_blocks *b);

#endif
