/*
 * tracer/facts.h: the facts mmleak.so shares with mmleak.py, as C macros.
 *
 * TO BE GENERATED: hand-written until mmleaklib/facts.py holds these facts; the build will then
 * make this file with `$(PYTHON) -m mmleaklib.facts --c-header`, in exactly this shape (the
 * names below are the interface), and this copy will go.
 *
 * MMLEAK_OPTIONS(X): X(NAME, "MMLEAK_<NAME>", type, default, min, max, "help"), one row per
 * setting, in the order the documentation lists them.
 *   type     path: a directory (made absolute at start); depth: "auto" or min..max frames;
 *            int: min..max; bool: 0 or 1
 *   default  a string for path and depth, a number for int and bool
 *   min, max the range accepted (0, 0 for path); a value outside it is ignored with a message
 *   help     one line
 * MMLEAK_RUNTIME_OBJECTS(X): X("prefix"): a loaded object whose file name starts with one of
 *   these is the runtime (its code allocates on the program's behalf).
 * MMLEAK_WRAPPERS(X): X("name"): a function of this name is an allocation wrapper (C names; a
 *   C++ function at namespace scope with that name is one too).
 */
#ifndef MMLEAK_FACTS_H
#define MMLEAK_FACTS_H

/* The dump format's version (the "#mmleak N" header line of every dump file). */
#define MMLEAK_FORMAT_VERSION 2
/* Frames recorded per allocation at most: MMLEAK_DEPTH's upper bound. */
#define MMLEAK_MAX_DEPTH 64

#define MMLEAK_OPTIONS(X)                                                                     \
    X(DIR, "MMLEAK_DIR", path, "/tmp", 0, 0,                                                  \
      "where the dump and maps files go (made absolute at start)")                            \
    X(DEPTH, "MMLEAK_DEPTH", depth, "auto", 1, 64,                                            \
      "frames recorded per allocation: auto (through the runtime and the allocation "         \
      "wrappers to the program's first frame, and four more) or N, exactly N")                \
    X(ROTATE_MB, "MMLEAK_ROTATE_MB", int, 256, 1, 1048576,                                    \
      "a thread starts a new dump file past this size")                                       \
    X(BUFFER_KB, "MMLEAK_BUFFER_KB", int, 1024, 16, 1048576,                                  \
      "staging area of a busy thread (its .tail file, two halves)")                           \
    X(HOLD_MB, "MMLEAK_HOLD_MB", int, 64, 0, 1048576,                                         \
      "lines that cannot be written yet are held in memory up to this much, for the whole "   \
      "process, before events are dropped (counted); 0: never held")                          \
    X(QUIET, "MMLEAK_QUIET", bool, 0, 0, 1, "1: never write to stderr, even when tracing fails") \
    X(PAUSED, "MMLEAK_PAUSED", bool, 0, 0, 1,                                                 \
      "1: preloaded but paused, at no cost, until mmleak.py attach PID")

#define MMLEAK_RUNTIME_OBJECTS(X)                                                             \
    X("libc.so") X("libstdc++.so") X("libgcc_s.so") X("ld-linux") X("ld64.so") X("libm.so")   \
    X("libpthread.so") X("libdl.so") X("libjemalloc.so") X("libtcmalloc") X("libmimalloc.so")

#define MMLEAK_WRAPPERS(X)                                                                    \
    X("xmalloc") X("xcalloc") X("xrealloc") X("xstrdup") X("xstrndup") X("xmemdup")           \
    X("xzalloc") X("xnmalloc") X("xcharalloc") X("xasprintf") X("xvasprintf")                 \
    X("xreallocarray") X("g_malloc") X("g_malloc0") X("g_malloc_n") X("g_malloc0_n")          \
    X("g_realloc") X("g_realloc_n") X("g_try_malloc") X("g_try_malloc0") X("g_strdup")        \
    X("g_strndup") X("g_memdup") X("g_memdup2") X("g_slice_alloc") X("g_slice_alloc0")        \
    X("g_strdup_printf") X("g_strdup_vprintf") X("g_strconcat") X("Perl_safesysmalloc")       \
    X("Perl_safesyscalloc") X("Perl_safesysrealloc") X("PyMem_RawMalloc")                     \
    X("PyMem_RawCalloc") X("PyMem_RawRealloc") X("_PyMem_RawMalloc") X("_PyMem_RawCalloc")    \
    X("_PyMem_RawRealloc") X("PyMem_Malloc") X("PyMem_Calloc") X("PyMem_Realloc")             \
    X("PyObject_Malloc") X("PyObject_Calloc") X("PyObject_Realloc") X("_PyObject_Malloc")     \
    X("_PyObject_Calloc") X("_PyObject_Realloc") X("sqlite3Malloc") X("sqlite3MallocZero")    \
    X("sqlite3_malloc") X("sqlite3_malloc64") X("sqlite3Realloc") X("sqlite3_realloc")        \
    X("sqlite3_realloc64") X("sqlite3DbMallocRaw") X("sqlite3DbMallocZero")                   \
    X("sqlite3DbMallocRawNN") X("sqlite3MemMalloc") X("sqlite3MemRealloc") X("OPENSSL_malloc") \
    X("OPENSSL_zalloc") X("CRYPTO_malloc") X("CRYPTO_zalloc") X("CRYPTO_realloc")             \
    X("xmlMalloc") X("xmlMallocAtomic") X("xmlRealloc") X("xmlStrdup") X("xmlStrndup")

#endif
