/*
 * tracer/platform.h: what mmleak.so assumes of the machine and of the C library, in one place.
 *
 *  - x86-64 Linux, LP64.  User-space addresses have at most 48 significant bits: the fast
 *    writers print exactly 12 hex digits for a pointer or a caller (a wider one takes the
 *    general path), a frame in a range an object was unloaded from carries its epoch in the
 *    top 16 bits, and the sites cache keeps its verdict in the top byte of a code address.
 *    The GOT switching (got.c), the unwinder (unwind.c) and the dlopen trampoline (attach.c)
 *    are x86-64 code; the hot path's xadd (record.h) and SSE2 digits (line.h) have portable
 *    fallbacks.
 *  - glibc 2.35 or later: _dl_find_object (lock-free, async-signal-safe: the unwinder, the
 *    sites cache, dlclose and the trampoline use it), secure_getenv, setfsuid, dladdr1, the
 *    RTLD_NEXT / RTLD_DEFAULT lookups, pthread keys run for several destructor rounds, and the
 *    layout of a thread's stack block (the unwinder's bounds).
 *  - C++ exceptions may unwind through the tracer's frames (-fexceptions: a throwing operator
 *    new of the runtime is called from ours).  The cleanups that then run need libgcc's
 *    personality routine and _Unwind_Resume: weak references, declared below in every object,
 *    so that a C program does not get libgcc_s loaded by us (about 0.1 ms of start-up, and its
 *    constructor runs cpuid, which traps in a VM); a C++ program has it loaded already, for
 *    libstdc++, and the references bind to it.  Without libgcc_s nothing can throw through us:
 *    the personality pointer is then 0, which the unwinder treats as "no cleanups here".
 */
#ifndef MMLEAK_PLATFORM_H
#define MMLEAK_PLATFORM_H

#include <features.h>
#include <stddef.h>

_Static_assert(sizeof(void *) == 8 && sizeof(size_t) == 8, "mmleak supports LP64 only");

#if !defined(__linux__) || !defined(__GLIBC__)
#error "mmleak.so needs Linux and glibc"
#endif
#if !__GLIBC_PREREQ(2, 35)
#error "mmleak.so needs glibc 2.35 or later (_dl_find_object)"
#endif

__asm__(".weak _Unwind_Resume\n\t.weak __gcc_personality_v0");

#endif
