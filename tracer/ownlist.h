/*
 * tracer/ownlist.h: the list of mmleak.so's own anonymous mappings, which the reachability
 * scan leaves out of its roots (tracer/mem.c keeps it; tools/scan_rootset.c reads it from the
 * process).
 *
 * Their names ("[anon:mmleak]", PR_SET_VMA_ANON_NAME) say the same where the kernel keeps
 * them; a kernel older than 5.17, or built without CONFIG_ANON_VMA_NAME, does not, and the
 * scan would then read them as the program's: they hold copies of the program's words (a
 * thread's recent stack walks keep the registers and stack words each walk started from),
 * stale pointers to blocks lost since, which would be called still reachable.
 *
 * In mmleak.so's writable data, found by its magic: struct mml_own_list, whose slots (in
 * mmleak.so's .bss) hold [lo, hi) of each mapping taken with mml_map and not yet unmapped.
 * A slot whose hi is not above its lo is being taken or given back: not a range.
 */
#ifndef MMLEAK_OWNLIST_H
#define MMLEAK_OWNLIST_H

#include <stdint.h>

#define MML_OWN_MAGIC "mmleak own maps"         /* 15 characters and the NUL: 16 bytes */
#define MML_OWN_VERSION 1
#define MML_OWN_SLOTS 8192

struct mml_own_slot { uint64_t lo, hi; };

struct mml_own_list {
    char magic[16];
    uint32_t version, cap;      /* cap: slots there are */
    uint32_t used, pad;         /* slots ever taken: the first USED are all that can be */
    struct mml_own_slot *slots;
};

#endif
