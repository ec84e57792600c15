/* tools/scan_roots.c: what the reachability scan leaves out of its roots (API and rules:
 * tools/scan_roots.h, mmleak-scan(7) "Roots"): mmleak.so's own mappings, the stacks of
 * threads glibc took back, glibc's heaps.  Only the mechanics; tools/scan_rootset.c decides.
 *
 * struct pthread's layout, read from the libc.so.6 the process runs: glibc describes its thread descriptor for debuggers: libthread_db (nptl_db) reads the
 * _thread_db_* symbols that libc.so.6 exports (GLIBC_PRIVATE, since glibc 2.34; in
 * libpthread.so.0 before): _thread_db_sizeof_pthread (one uint32_t, the size), and for each
 * field a descriptor of three uint32_t: its size in bits, its count, its offset.  They are
 * read here from the file's dynamic symbol table and its bytes, never from the process (only
 * its mount namespace's copy of the file: /proc/PID/root/PATH): it tells the stack of a
 * thread that was joined (glibc keeps it in its cache, to reuse it) from a live one. */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "scan_roots.h"

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r <= 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

/* The file offset of virtual address V (a section that has bytes in the file), or 0. */
static uint64_t file_off(const Elf64_Shdr *sh, int nsh, uint64_t v, uint64_t n)
{
    for (int i = 0; i < nsh; i++)
        if (sh[i].sh_type != SHT_NOBITS && sh[i].sh_addr && v >= sh[i].sh_addr &&
            v + n <= sh[i].sh_addr + sh[i].sh_size)
            return v - sh[i].sh_addr + sh[i].sh_offset;
    return 0;
}

/* Symbol NAME, defined, through the file's GNU hash table (section GH, over the symbols of
 * DS, their names in SS; TAB: the section's bytes, read once for the three names: 25
 * system calls at every exit when it was read a few words at a time), the symbol and its
 * name read alone: 1 found (*SYM), 0 not in the table, -1 the table cannot be read (the
 * caller reads the whole symbol table instead).  libc.so.6's table is about 15 KB, its
 * symbols and names about 100 KB, read at every scan that needs the layout otherwise. */
static int gnu_lookup(int fd, const Elf64_Shdr *gh, const uint32_t *tab, const Elf64_Shdr *ds,
                      const Elf64_Shdr *ss, const char *name, Elf64_Sym *sym)
{
    uint32_t hd[4];                     /* nbuckets, symoffset, bloom words, bloom shift */
    if (gh->sh_size < sizeof hd || !tab)
        return -1;
    memcpy(hd, tab, sizeof hd);
    if (!hd[0])
        return -1;
    uint64_t nsym = ds->sh_size / sizeof *sym;
    uint64_t buckets = 16 + (uint64_t)hd[2] * 8, chains = buckets + 4ull * hd[0];
    if (chains > gh->sh_size || hd[1] > nsym)
        return -1;
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = h * 33 + *c;
    uint32_t i, ch;
    memcpy(&i, (const char *)tab + buckets + 4ull * (h % hd[0]), 4);
    if (!i)
        return 0;
    if (i < hd[1] || i >= nsym)
        return -1;
    size_t len = strlen(name) + 1;
    char got[64];
    if (len > sizeof got)
        return -1;
    for (;; i++) {
        uint64_t at = chains + 4ull * (i - hd[1]);
        if (i >= nsym || at + 4 > gh->sh_size)
            return -1;
        memcpy(&ch, (const char *)tab + at, 4);
        if ((ch | 1) == (h | 1)) {
            if (pread_all(fd, sym, sizeof *sym, ds->sh_offset + (uint64_t)i * sizeof *sym))
                return -1;
            if (sym->st_name < ss->sh_size && ss->sh_size - sym->st_name >= len &&
                !pread_all(fd, got, len, ss->sh_offset + sym->st_name) &&
                !memcmp(got, name, len) && sym->st_shndx != SHN_UNDEF)
                return 1;
        }
        if (ch & 1)
            return 0;
    }
}

/* A descriptor of PATH, read-only, if it is a regular file; -1 otherwise, having opened
 * nothing else: the path is the traced process's (a name in its maps, in its mount
 * namespace), and a FIFO mounted there would block the scan, a device be opened (opening
 * /dev/watchdog starts its timer).  Looked up with O_PATH, which opens nothing, checked,
 * then opened through /proc/self/fd. */
static int open_regular(const char *path)
{
    int o = open(path, O_PATH | O_CLOEXEC);
    if (o < 0)
        return -1;
    struct stat st;
    int fd = -1;
    if (!fstat(o, &st) && S_ISREG(st.st_mode)) {
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", o);
        fd = open(self, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    }
    close(o);
    return fd;
}

const char *const mml_pthread_symbols[3] = { "_thread_db_sizeof_pthread",
                                             "_thread_db_pthread_tid",
                                             "_thread_db_pthread_cancelhandling" };

int mml_pthread_layout_of(const uint32_t got[3][3], struct mml_pthread_layout *l)
{
    /* a descriptor: 32 bits (an int), one of them, at an offset inside the struct */
    if (got[0][0] < 64 || got[0][0] > 65536)
        return -1;
    for (int k = 1; k < 3; k++)
        if (got[k][0] != 32 || got[k][1] != 1 || got[k][2] + 4 > got[0][0] || (got[k][2] & 3))
            return -1;
    l->size = got[0][0];
    l->tid = got[1][2];
    l->cancel = got[2][2];
    return 0;
}

int mml_pthread_layout(int pid, const char *path, uint64_t lo, struct mml_pthread_layout *l)
{
    const char *const *want = mml_pthread_symbols;
#ifdef MML_SCAN_INPROC
    if (!mml_here_layout(lo, l))
        return 0;                       /* (no file opened and read: 17 system calls) */
#else
    (void)lo;
#endif
    char p[4096 + 64];
    snprintf(p, sizeof p, "/proc/%d/root%s", pid, path);
    int fd = open_regular(p);
    if (fd < 0)
        fd = open_regular(path);
    if (fd < 0)
        return -1;
    int rc = -1;
    Elf64_Ehdr eh;
    Elf64_Shdr *sh = NULL;
    Elf64_Sym *sym = NULL;
    char *str = NULL;
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || pread_all(fd, &eh, sizeof eh, 0) ||
        memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || !eh.e_shnum || eh.e_shnum > 4096)
        goto out;
    sh = malloc(eh.e_shnum * sizeof *sh);
    if (!sh || pread_all(fd, sh, eh.e_shnum * sizeof *sh, eh.e_shoff))
        goto out;
    int ds = -1;
    for (int i = 0; i < eh.e_shnum; i++)
        if (sh[i].sh_type == SHT_DYNSYM && sh[i].sh_link < eh.e_shnum)
            ds = i;
    if (ds < 0 || sh[ds].sh_entsize != sizeof(Elf64_Sym) || sh[ds].sh_size > (64u << 20))
        goto out;
    const Elf64_Shdr *ss = &sh[sh[ds].sh_link];
    if (ss->sh_size > (64u << 20))
        goto out;
    uint32_t got[3][3];
    int have = 0;
    /* the three symbols through the GNU hash table, when the file has one for DS */
    for (int i = 0; i < eh.e_shnum && !have; i++)
        if (sh[i].sh_type == SHT_GNU_HASH && (int)sh[i].sh_link == ds) {
            uint32_t *tab = sh[i].sh_size <= (1u << 20) ? malloc(sh[i].sh_size) : NULL;
            if (tab && pread_all(fd, tab, sh[i].sh_size, sh[i].sh_offset)) {
                free(tab);
                tab = NULL;
            }
            int k = 0;
            for (; k < 3; k++) {
                Elf64_Sym y;
                uint64_t n = k ? 12 : 4, off;
                if (gnu_lookup(fd, &sh[i], tab, &sh[ds], ss, want[k], &y) != 1 ||
                    !(off = file_off(sh, eh.e_shnum, y.st_value, n)) ||
                    pread_all(fd, got[k], n, off))
                    break;
            }
            have = k == 3 ? 7 : 0;
            free(tab);
        }
    if (have)
        goto check;
    size_t nsym = sh[ds].sh_size / sizeof *sym;
    sym = malloc(sh[ds].sh_size);
    str = malloc(ss->sh_size + 1);
    if (!sym || !str || pread_all(fd, sym, sh[ds].sh_size, sh[ds].sh_offset) ||
        pread_all(fd, str, ss->sh_size, ss->sh_offset))
        goto out;
    str[ss->sh_size] = 0;
    for (size_t i = 0; i < nsym; i++) {
        if (sym[i].st_name >= ss->sh_size || sym[i].st_shndx == SHN_UNDEF)
            continue;
        for (int k = 0; k < 3; k++) {
            uint64_t n = k ? 12 : 4, off;
            if (strcmp(str + sym[i].st_name, want[k]) || (have & 1 << k))
                continue;
            if (!(off = file_off(sh, eh.e_shnum, sym[i].st_value, n)) ||
                pread_all(fd, got[k], n, off))
                goto out;
            have |= 1 << k;
        }
    }
check:
    if (have == 7)
        rc = mml_pthread_layout_of(got, l);
out:
    free(sh);
    free(sym);
    free(str);
    close(fd);
    return rc;
}

static int own_cmp(const void *a, const void *b)
{
    const struct mml_own_slot *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

size_t mml_own_ranges(mml_read_fn rd, void *ctx, uint64_t lo, uint64_t hi,
                      struct mml_own_slot **out)
{
    struct mml_own_list l;
    size_t len = (size_t)(hi - lo), n = 0;
    int have = 0;
    *out = NULL;
    char *buf = len <= ((size_t)1 << 20) ? malloc(len) : NULL;
    if (!buf)
        return 0;
    rd(ctx, lo, buf, len);
    for (size_t off = 0; off + sizeof l <= len && !have; off += 16)
        if (!memcmp(buf + off, MML_OWN_MAGIC, sizeof l.magic)) {
            memcpy(&l, buf + off, sizeof l);
            have = 1;
        }
    free(buf);
    if (!have || l.version != MML_OWN_VERSION || l.cap > ((uint32_t)1 << 20) || l.used > l.cap ||
        !l.used || !(*out = malloc(l.used * sizeof **out)))
        return 0;
    struct mml_own_slot *o = *out;
    rd(ctx, (uint64_t)(uintptr_t)l.slots, o, l.used * sizeof *o);
    for (uint32_t i = 0; i < l.used; i++)
        if (o[i].hi > o[i].lo && !(o[i].lo & 4095))
            o[n++] = o[i];
    qsort(o, n, sizeof *o, own_cmp);
    return n;
}

int mml_dead_pthread(mml_read_fn rd, void *ctx, const struct mml_pthread_layout *l,
                     uint64_t lo, uint64_t hi, uint64_t *pd, uint64_t *end)
{
    uint64_t size = l->size, span = size + 8192;
    if (hi - lo < span)
        return -1;
    uint64_t *w = malloc(span), base = hi - span;
    if (!w)
        return -1;
    rd(ctx, base, w, span);
    int dead = -1;
    for (uint64_t a = (hi - size) & ~15ull; a >= base; a -= 16) {
        const uint64_t *p = w + (a - base) / 8;
        if (p[0] != a || p[2] != a)     /* tcb, self */
            continue;
        int32_t tid, cancel;
        memcpy(&tid, (const char *)p + l->tid, 4);
        memcpy(&cancel, (const char *)p + l->cancel, 4);
        dead = tid <= 0 && (cancel & MML_PTHREAD_TERMINATED);
        *pd = a;
        *end = (a + size + 4095) & ~4095ull;
        break;
    }
    free(w);
    return dead;
}

#define ARENA_HEAP_MAX ((uint64_t)64 << 20)     /* glibc's HEAP_MAX_SIZE on 64-bit */

int mml_arena_heap(mml_read_fn rd, void *ctx, uint64_t lo, uint64_t hi)
{
    uint64_t h[4];                      /* ar_ptr, prev, size, mprotect_size */
    if ((lo & (ARENA_HEAP_MAX - 1)) || hi - lo > ARENA_HEAP_MAX)
        return 0;
    rd(ctx, lo, h, sizeof h);
    uint64_t at = h[0] & (ARENA_HEAP_MAX - 1);
    return (at == 32 || at == 48) && !(h[1] & (ARENA_HEAP_MAX - 1)) && h[2] &&
           h[2] <= hi - lo && h[3] >= h[2] && h[3] <= ARENA_HEAP_MAX;
}
