/* tools/scan_inproc.h: included first (cc -include) by the copy of the scan's files that
 * mmleak.so carries (Makefile: SCAN_INPROC_OBJS), which a process left with one thread runs
 * at its exit in a child that shares its memory (tracer/scanhere.c; mmleak-scan(7), "At the
 * exit of a traced process").  That child's memory is the process's: what the scan takes
 * must be mmleak.so's own (tracer/ownlist.h: left out of the roots, as a block's copies in
 * it would make the block look reachable), never the program's heap (its locks and state
 * are the program's).  So every allocation and anonymous mapping of these files goes to
 * tracer/scanhere.c's, qsort (whose glibc copy may call malloc) to its own sort, and
 * opendir/readdir/closedir (glibc's buffer is malloc's) to its own getdents64 reader, and
 * syscall (mmleak.so's interposer when preloaded: tracer/internal.h, mml_sys) to the system
 * call itself.  The rest is the same source as mmleak-scan's. */
#ifndef MMLEAK_SCAN_INPROC_H
#define MMLEAK_SCAN_INPROC_H

#define MML_SCAN_INPROC 1
#define malloc mml_sc_malloc
#define calloc mml_sc_calloc
#define realloc mml_sc_realloc
#define free mml_sc_free
#define posix_memalign mml_sc_posix_memalign
#define strdup mml_sc_strdup
#define asprintf mml_sc_asprintf
#define mmap mml_sc_mmap
#define munmap mml_sc_munmap
#define mremap mml_sc_mremap
#define qsort mml_sc_qsort
#define opendir mml_sc_opendir     /* glibc's takes its buffer from malloc */
#define readdir mml_sc_readdir
#define closedir mml_sc_closedir
#define syscall mml_sc_syscall         /* mmleak.so's own calls: never its interposer */
#define say mml_sc_say                  /* tracer/say.c has a say of its own */
/* mmleak-tools.so's entry points (for mmleak.py) are not mmleak.so's: hidden here */
#include "../tracer/compiler.h"
#undef EXPORT
#define EXPORT

#endif
