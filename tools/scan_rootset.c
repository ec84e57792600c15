/* tools/scan_rootset.c: the roots of the reachability scan, and the marking started from
 * each: the threads' registers and stacks (from the stack pointer, less the red zone, or
 * from the floor of the thread that asked), every writable mapping but those that are not
 * the program's (mmleak.so's own mappings and .bss, the stacks of threads glibc took back, a
 * glibc heap with no live block: what tools/scan_roots.c recognises in the process), the
 * memory between known blocks of a heap after an attach, and only the pages present of a
 * root.  Separate because this file decides what is a root; what a word of a root means is
 * tools/scan_mark.c's. */
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

#define REDZONE 128                     /* below the stack pointer (x86-64 ABI) */

static int is_own(struct scan *s, const struct mapping *m)
{
    const char *p = m->path;
    size_t n = strlen(p);
    if (n >= 10 && !strcmp(p + n - 10, "/mmleak.so"))
        return 1;
    if (!strncmp(p, "[anon:mmleak", 12))
        return 1;
    if (n > 5 && !strcmp(p + n - 5, ".tail") && strstr(p, "/mmleak."))
        return 1;
    (void)s;
    return 0;
}

/* mmleak.so's .bss past its last file page: an anonymous mapping in /proc/PID/maps, right
 * after mmleak.so's writable one.  Its end is read from mmleak.so's program headers, in the
 * process (the ELF header is in the mapping at file offset 0).  Sets s->own_lo, own_hi. */
static void own_bss(struct scan *s)
{
    for (size_t k = 0; k < s->nmp; k++) {
        const struct mapping *m = &s->mp[k];
        size_t n = strlen(m->path);
        if (m->off || n < 10 || strcmp(m->path + n - 10, "/mmleak.so"))
            continue;
        /* its ELF header and program headers, in its first page: one read (one a header
         * before, 11 calls at every exit) */
        unsigned char eh[4096];
        uint64_t ph[56 / 8];
        size_t got = scan_rd(s, m->lo, eh, m->hi - m->lo < sizeof eh ? m->hi - m->lo
                                                                     : sizeof eh);
        if (got < 64 || memcmp(eh, "\177ELF\2\1", 6))
            return;
        uint64_t phoff, end = 0, first = UINT64_MAX;
        uint16_t phnum, phentsize;
        memcpy(&phoff, eh + 32, 8);
        memcpy(&phentsize, eh + 54, 2);
        memcpy(&phnum, eh + 56, 2);
        if (phentsize != 56 || phnum > 64 || phoff > got || got - phoff < phnum * 56ull)
            return;
        for (unsigned i = 0; i < phnum; i++) {
            memcpy(ph, eh + phoff + i * 56ull, 56);
            if ((uint32_t)ph[0] != 1 /* PT_LOAD */)
                continue;
            uint64_t vaddr = ph[2], memsz = ph[5];
            if (vaddr < first)
                first = vaddr & ~4095ull;
            if (vaddr + memsz > end)
                end = vaddr + memsz;
        }
        if (first == UINT64_MAX || end <= first || end - first > ((uint64_t)1 << 32))
            return;
        end = (m->lo - first + end + 4095) & ~4095ull;
        /* the anonymous mapping that starts where one of mmleak.so's file mappings ends */
        for (size_t j = k + 1; j < s->nmp && s->mp[j].lo < end; j++)
            if (!s->mp[j].path[0] && s->mp[j - 1].hi == s->mp[j].lo &&
                strstr(s->mp[j - 1].path, "/mmleak.so")) {
                s->own_lo = s->mp[j].lo;
                s->own_hi = end < s->mp[j].hi ? end : s->mp[j].hi;
                return;
            }
        return;
    }
}

static size_t read_cb(void *ctx, uint64_t a, void *buf, size_t n)
{
    return scan_rd(ctx, a, buf, n);
}

/* mmleak.so's own anonymous mappings, as the list it keeps says (tracer/ownlist.h): where the
 * kernel keeps no names, nothing else tells them from the program's, and they hold copies of
 * the program's words (its recent stack walks).  Sets s->own, s->nown. */
static void own_maps(struct scan *s)
{
    for (size_t k = 0; k < s->nmp && !s->own; k++) {
        const struct mapping *m = &s->mp[k];
        size_t n = strlen(m->path);
        if (m->perm[0] == 'r' && m->perm[1] == 'w' && n >= 10 &&
            !strcmp(m->path + n - 10, "/mmleak.so"))
            s->nown = mml_own_ranges(read_cb, s, m->lo, m->hi, &s->own);
    }
}

/* Is mapping K the stack of a thread that glibc took back (joined, or detached and ended:
 * its stack waits in glibc's cache, to be reused or unmapped; valgrind's __libc_freeres
 * unmaps those, LeakSanitizer reads live threads only)?  Right above a guard page, with
 * glibc's descriptor at its top saying so (mml_dead_pthread), which no thread of the
 * process has.  Sets *PDP, the descriptor, and *END, where the dead stack ends. */
static int dead_stack(struct scan *s, size_t k, uint64_t *pdp, uint64_t *end)
{
    const struct mapping *m = &s->mp[k];
    if (m->path[0] || !k || s->mp[k - 1].hi != m->lo || strcmp(s->mp[k - 1].perm, "---p"))
        return 0;
    if (!s->layout) {
        s->layout = -1;
        for (size_t j = 0; j < s->nmp && s->layout < 0; j++) {
            const char *b = strrchr(s->mp[j].path, '/');
            if (b && s->mp[j].off == 0 && (!strncmp(b, "/libc.so.", 9) ||
                                           !strncmp(b, "/libpthread.so.", 15)) &&
                !mml_pthread_layout(s->rpid, s->mp[j].path, s->mp[j].lo, &s->pl))
                s->layout = 1;
        }
    }
    if (s->layout < 0 || mml_dead_pthread(read_cb, s, &s->pl, m->lo, m->hi, pdp, end) != 1)
        return 0;
    for (int t = 0; t < s->nth; t++)
        if (s->th[t].tid > 0 && s->th[t].regs.fs_base == *pdp)
            return 0;
    return 1;
}

/* Is mapping M one of glibc's heaps, though it holds no live block ([heap], or a thread
 * arena's: mml_arena_heap)?  Its memory is free chunks: the stale words of blocks freed,
 * which valgrind never reads.  Only when the trace is glibc's malloc, and not an attached
 * one (blocks allocated before the attach may be there). */
static int glibc_heap(struct scan *s, const struct mapping *m)
{
    if (!s->glibc || s->attached || m->perm[3] != 'p')
        return 0;
    return !strcmp(m->path, "[heap]") ||
           (!m->path[0] && mml_arena_heap(read_cb, s, m->lo, m->hi));
}

/* Is the memory of mapping M, which holds live blocks, outside them a root?  Yes when the
 * trace is glibc's malloc and M is anonymous, private, neither [heap] nor a thread arena's
 * heap: its blocks are then glibc's mmap'ed chunks, which the kernel merged with the
 * mappings beside them, the program's own (Python's obmalloc arenas, a custom pool): roots,
 * as they are when alone (valgrind agrees).  No for [heap] and the arenas' heaps (the rest is
 * free chunks), and for another allocator's mappings (the rest is its free memory).  A
 * thread arena's heap is found at any 64 MiB boundary in M, merged or not. */
static int beside_chunks(struct scan *s, const struct mapping *m)
{
    if (!s->glibc || s->attached || m->perm[3] != 'p' || m->path[0])
        return 0;
    const uint64_t max = (uint64_t)64 << 20;    /* glibc's HEAP_MAX_SIZE on 64-bit */
    for (uint64_t h = (m->lo + max - 1) & ~(max - 1); h < m->hi; h += max)
        if (mml_arena_heap(read_cb, s, h, m->hi - h < max ? m->hi : h + max))
            return 0;
    return 1;
}

/* Is PATH, a mapping's, a device's memory, which reading may disturb (a frame buffer, a
 * PCI BAR)?  /dev/zero is not: the kernel names shared anonymous memory "/dev/zero
 * (deleted)" (a server's shared segment: PostgreSQL's), and /dev/shm holds POSIX shared
 * memory; valgrind reads both, and a block pointed to from there only is not lost. */
static int device(const char *path)
{
    return !strncmp(path, "/dev/", 5) && strncmp(path, "/dev/zero", 9) &&
           strncmp(path, "/dev/shm/", 9);
}

/* May the pages of mapping M that are neither in memory nor in swap be left unread?  Yes
 * for private anonymous memory (they read as zeros); not for a file's pages (their contents
 * are the file's) nor for shared memory (another process may have written them). */
static int zero_unless_present(const struct mapping *m)
{
    const char *p = m->path;
    return m->perm[3] == 'p' && (!p[0] || !strcmp(p, "[stack]") || !strcmp(p, "[heap]") ||
                                 !strncmp(p, "[anon:", 6));
}

#define SMALL_ROOT ((uint64_t)4 << 12) /* a root this small is read without its pagemap */
#define PM_BATCH 4096                   /* pagemap entries read at a time (16 MiB of memory) */

/* Scan root [A, B) of mapping M, skipping the pages that hold nothing (never touched, or
 * dropped: MADV_DONTNEED) when M allows it: an idle thread's 8 MiB stack, a big .bss, an
 * arena mapped and never filled cost the pages in use, not their size.  A page that is in
 * memory or in swap (bits 63, 62 of its /proc/PID/pagemap entry) is read. */
static void scan_present(struct scan *s, const struct mapping *m, uint64_t a, uint64_t b)
{
    /* a root of a few pages is read whole: one read, not a read of its pagemap entries
     * first (the pages not in memory read as zeros, which point nowhere); a small
     * program's exit had about 9 such preads */
    if (b - a <= SMALL_ROOT) {
        scan_range(s, a, b, 1, -1);
        return;
    }
    if (s->pagemap == -2) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/pagemap", s->rpid);
        s->pagemap = open(path, O_RDONLY | O_CLOEXEC);
        s->pm = s->pagemap >= 0 ? malloc(PM_BATCH * 8) : NULL;
        if (!s->pm && s->pagemap >= 0) {
            close(s->pagemap);
            s->pagemap = -1;
        }
    }
    if (s->pagemap < 0 || !zero_unless_present(m)) {
        scan_range(s, a, b, 1, -1);
        return;
    }
    uint64_t page = a & ~4095ull;
    while (page < b) {
        uint64_t n = (b - page + 4095) / 4096;
        if (n > PM_BATCH)
            n = PM_BATCH;
        ssize_t got = pread(s->pagemap, s->pm, n * 8, (off_t)(page / 4096 * 8));
        if (got != (ssize_t)(n * 8)) {          /* cannot tell: read it all */
            scan_range(s, page > a ? page : a, b, 1, -1);
            return;
        }
        for (uint64_t i = 0; i < n;) {
            if (!(s->pm[i] >> 62)) {            /* neither present nor swapped */
                i++;
                continue;
            }
            uint64_t j = i;
            while (j < n && s->pm[j] >> 62)
                j++;
            uint64_t lo = page + i * 4096, hi = page + j * 4096;
            scan_range(s, lo > a ? lo : a, hi < b ? hi : b, 1, -1);
            i = j;
        }
        page += n * 4096;
    }
}

/* Is mapping M libc.so.6's data (its file's writable mapping, or the .bss right after it)? */
static int libc_data(struct scan *s, const struct mapping *m)
{
    const char *p = m->path;
    if (!p[0] && m > s->mp && m[-1].hi == m->lo)
        p = m[-1].path;
    size_t n = strlen(p);
    return n >= 10 && !strcmp(p + n - 10, "/libc.so.6");
}

static void root_range(struct scan *s, const struct mapping *m, int kind, uint64_t a,
                       uint64_t b)
{
    if (b <= a)
        return;
    s->roots[kind][0]++;
    s->roots[kind][1] += b - a;
    if (unlikely(scan_debug > 0))
        scan_dbg("mmleak-scan: root %s %#" PRIx64 "-%#" PRIx64 "\n", ROOT_NAME[kind], a,
                b);
    s->glibc_words = kind == R_STACK || kind == R_UNTRACED || libc_data(s, m);
    scan_present(s, m, a, b);
    s->glibc_words = 0;
}

/* Root [A, B) of mapping M, less mmleak.so's own mappings (own_maps) in it: the kernel merges
 * neighbouring anonymous mappings, so one of ours may be a part of a mapping, anywhere. */
static void add_root(struct scan *s, const struct mapping *m, int kind, uint64_t a, uint64_t b)
{
    size_t lo = 0, hi = s->nown;
    while (lo < hi) {                   /* the first of ours that ends after A */
        size_t mid = (lo + hi) / 2;
        if (s->own[mid].hi <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t k = lo; k < s->nown && s->own[k].lo < b && a < b; k++) {
        uint64_t olo = s->own[k].lo > a ? s->own[k].lo : a;
        uint64_t ohi = s->own[k].hi < b ? s->own[k].hi : b;
        root_range(s, m, kind, a, olo);
        s->excluded[0]++;
        s->excluded[1] += ohi - olo;
        a = ohi;
    }
    root_range(s, m, kind, a, b);
}

/* The floor of the thread that asked (mmleak_scan_floor): kept only when that thread is
 * held, and the floor is at or above its stack pointer in the same mapping. */
static void check_floor(struct scan *s)
{
    int ok = 0;
    for (int t = 0; s->floor && t < s->nth; t++) {
        if (s->th[t].tid <= 0 || s->th[t].tid != s->floor_tid)
            continue;
        uint64_t sp = s->th[t].regs.rsp;
        const struct mapping *m = mapping_at(s, sp);
        ok = m && s->floor >= sp && s->floor < m->hi;
    }
    if (!ok)
        s->floor = 0;
}

/* Is the main thread alive?  Asked of [stack] when no thread's stack pointer is in it:
 * main then runs on another stack, a signal handler on its sigaltstack (a program that
 * calls exit() from its SIGTERM handler), a coroutine's (swapcontext), and main's frames
 * are still in [stack], below nothing: that mapping is then read whole (its pages in use;
 * the stale words below the stack pointer it left cannot be told from the rest, so they
 * count: LIMITS).  Before, [stack] was skipped as the stack of a main thread that ended,
 * and what main's frames held was definitely lost (valgrind: still reachable;
 * scan_cases.c, altstack-exit). */
static int leader_alive(struct scan *s)
{
    for (int t = 0; t < s->nth; t++)
        if (s->th[t].tid > 0 && s->th[t].tid == s->pid)
            return 1;
    return 0;
}

void mark(struct scan *s)
{
    own_bss(s);
    own_maps(s);
    /* registers */
    check_floor(s);
    for (int t = 0; t < s->nth; t++) {
        if (s->th[t].tid <= 0)
            continue;
        const uint64_t *r = (const uint64_t *)&s->th[t].regs;
        size_t n = sizeof s->th[t].regs / 8;
        /* the thread that asked (a floor): its thread pointers only, fs_base and gs_base
         * (the others are mmleak.so's; the program's callee-saved ones are on its stack) */
        int asked = s->floor && s->th[t].tid == s->floor_tid;
        s->roots[R_REGISTER][0]++;
        s->roots[R_REGISTER][1] += asked ? 16 : n * 8;
        for (size_t k = 0; k < n; k++)
            if (r[k] >= s->lo && r[k] < s->hi &&
                (!asked || k * 8 == offsetof(struct user_regs_struct, fs_base) ||
                 k * 8 == offsetof(struct user_regs_struct, gs_base)))
                mark_register(s, s->th[t].tid, k, r[k]);
    }
    drain(s, -1);
    for (size_t k = 0; k < s->nmp; k++) {
        const struct mapping *m = &s->mp[k];
        if (m->perm[0] != 'r' || m->perm[1] != 'w')
            continue;
        if (is_own(s, m) || (m->lo >= s->own_lo && m->hi <= s->own_hi)) {
            s->excluded[0]++;
            s->excluded[1] += m->hi - m->lo;
            continue;
        }
        if (!strcmp(m->path, "[vvar]") || !strcmp(m->path, "[vsyscall]") ||
            device(m->path) || !strcmp(m->path, "[vvar_vclock]"))
            continue;
        /* a thread's stack: from its stack pointer (less the red zone) up */
        uint64_t from = m->lo;
        int stack = 0;
        for (int t = 0; t < s->nth; t++) {
            uint64_t sp = s->th[t].regs.rsp;
            if (s->th[t].tid > 0 && sp >= m->lo && sp < m->hi) {
                uint64_t f = sp - REDZONE < m->lo ? m->lo : sp - REDZONE;
                if (s->floor && s->th[t].tid == s->floor_tid)
                    f = s->floor;
                if (!stack || f < from)
                    from = f;
                stack = 1;
            }
        }
        if (!stack && !strcmp(m->path, "[stack]") && !leader_alive(s))
            continue;                   /* no thread of ours there (it ended) */
        if (!stack && m->lo == s->own_lo && m->hi > s->own_hi) {
            from = s->own_hi;           /* mmleak.so's .bss, and memory mapped right after */
            s->excluded[0]++;
            s->excluded[1] += s->own_hi - s->own_lo;
        }
        if (!m->heap && !stack && glibc_heap(s, m)) {
            if (unlikely(scan_debug > 0))
                scan_dbg("mmleak-scan: %#" PRIx64 "-%#" PRIx64 " is a glibc heap with "
                        "no live block (not a root)\n", m->lo, m->hi);
            s->glibc_ex[0]++;
            s->glibc_ex[1] += m->hi - m->lo;
            continue;
        }
        if (m->heap) {
            /* blocks allocated before the attach are not known: the memory between known
             * blocks is taken as roots, so that nothing reachable through them is lost;
             * glibc's mmap'ed chunks merged with the program's mappings: those are roots */
            int kind = s->attached ? R_UNTRACED : beside_chunks(s, m) ? R_ANON : -1;
            if (kind < 0)
                continue;
            uint64_t a = m->lo;
            for (size_t i = first_block_at_or_after(s, m->lo); i < s->nb && s->bp[i] < m->hi;
                 i++) {
                add_root(s, m, kind, a, s->bp[i]);
                uint64_t e = s->bp[i] + s->bs[i];
                if (e > a)
                    a = e;
            }
            add_root(s, m, kind, a, m->hi);
            drain(s, -1);
            continue;
        }
        uint64_t pd, dead_end;
        if (!stack && dead_stack(s, k, &pd, &dead_end)) {
            if (unlikely(scan_debug > 0))
                scan_dbg("mmleak-scan: %#" PRIx64 "-%#" PRIx64 " is the stack of a "
                        "thread joined (not a root)\n", m->lo, dead_end);
            /* but for its descriptor's header (tcb, dtv): glibc keeps the thread's DTV with
             * the stack, to reuse both; it stays what it was, possibly lost (dtv points to
             * its second word), never definitely lost */
            add_root(s, m, R_ANON, pd, pd + 16);
            drain(s, -1);
            s->glibc_ex[0]++;
            s->glibc_ex[1] += dead_end - m->lo - 16;
            from = dead_end;
        }
        int kind = stack ? R_STACK : m->path[0] == '/' ? (m->perm[3] == 's' ? R_FILE : R_OBJECT)
                                                       : R_ANON;
        add_root(s, m, kind, from, m->hi);
        drain(s, -1);
    }
    mark_cliques(s);
}
