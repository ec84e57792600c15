/*
 * tracer/got.c: route a running process's allocation calls through mmleak, and back.
 *
 * When mmleak.so is preloaded, the dynamic linker binds every module's calls to malloc & co
 * to mmleak's functions, because mmleak.so comes first in the search order.  When it is
 * loaded into a running process (mmleak.py attach), those bindings are already made, to
 * libc's functions: they live in each module's GOT, one slot per called function.  So we
 * rewrite the slots: every module's (libc's own included, since glibc calls its malloc
 * through its GOT so that it can be replaced), honouring RELRO (the slots of a module linked
 * with -z relro -z now are read-only after relocation: mprotect'ed writable for the store and
 * back).  The same switch, the other way, pauses a preloaded process at no cost: its slots
 * then point to the functions mmleak would call itself.
 *
 * Slots are found from each module's dynamic relocations (DT_JMPREL and DT_RELA):
 * R_X86_64_JUMP_SLOT and R_X86_64_GLOB_DAT (calls and address-taking through the GOT), and
 * R_X86_64_64 with no addend (a function pointer stored in data, such as a table of
 * allocation functions), the last only when the slot still holds the value the loader put
 * there.  Every slot is remembered with its original value, for the way back.
 *
 * Order matters while other threads run: the frees (free, realloc, operator delete) are
 * switched before the allocations when tracing starts, and after them when it stops, so a
 * block mmleak saw allocated is never freed where mmleak cannot see it.  Each store is one
 * aligned 8-byte write: a thread calls either the old or the new function, never garbage.
 *
 * Runs in mmleak's cold path, with its re-entrancy guard held; allocates with mmap only.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#if !defined(__x86_64__)
#error "got.c: x86-64 relocations only"
#endif

struct slot {
    uintptr_t *addr;        /* the GOT entry or data word */
    uintptr_t orig;         /* what the loader put there */
    int hook;               /* index in the hook table */
    uintptr_t lo, hi;       /* its object's RELRO range, [0,0) if none */
};

static struct {
    pthread_mutex_t lock;
    const struct mml_hook *hooks;
    int nhooks;
    struct slot *s;
    size_t n, cap;
    struct { uintptr_t base; const void *ld; } *seen;   /* objects scanned */
    size_t nseen, capseen;
    int traced;             /* the state the slots are in */
    int attached;           /* mmleak.so was loaded into a running process (not preloaded) */
    uintptr_t self;         /* mmleak.so's base: never rewritten */
    int (*dlclose)(void *);
} G = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, NULL, 0, 0, NULL, 0, 0, 0, 0, 0, NULL };

static int hook_index(const char *name)
{
    for (int i = 0; i < G.nhooks; i++)
        if (G.hooks[i].name[0] == name[0] && strcmp(G.hooks[i].name, name) == 0)
            return G.hooks[i].kind == MML_HOOK_ATTACH_ONLY && !G.attached ? -1 : i;
    return -1;
}

static uintptr_t real_of(const struct mml_hook *h)
{
    return h->real ? (uintptr_t)*h->real : 0;
}

/* A d_ptr of the in-memory dynamic section: glibc relocates most of them in place, but not
 * all objects' (the vDSO's, ld.so's on some targets): an unrelocated one is below the base. */
static uintptr_t dyn_ptr(uintptr_t base, ElfW(Addr) p)
{
    return p < base ? base + p : p;
}

struct scan_ctx { int added; };

static void scan_relocs(uintptr_t base, const ElfW(Rela) *r, size_t n, const ElfW(Sym) *symtab,
                        const char *strtab, uintptr_t relro_lo, uintptr_t relro_hi)
{
    for (size_t i = 0; i < n; i++) {
        unsigned type = (unsigned)ELF64_R_TYPE(r[i].r_info);
        size_t si = ELF64_R_SYM(r[i].r_info);
        if (!si || (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT &&
                    type != R_X86_64_64))
            continue;
        if (type == R_X86_64_64 && r[i].r_addend != 0)
            continue;
        int h = hook_index(strtab + symtab[si].st_name);
        if (h < 0)
            continue;
        uintptr_t *addr = (uintptr_t *)(base + r[i].r_offset);
        if (type == R_X86_64_64 && *addr != real_of(&G.hooks[h]) &&
            *addr != (uintptr_t)G.hooks[h].ours)
            continue;       /* the program changed it since: not ours to touch */
        struct slot *a = mml_grow(G.s, &G.cap, G.n + 1, sizeof *a);
        if (!a)
            return;
        G.s = a;
        G.s[G.n++] = (struct slot){ addr, *addr, h, relro_lo, relro_hi };
    }
}

static int scan_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct scan_ctx *ctx = data;
    uintptr_t base = info->dlpi_addr;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t relro_lo = 0, relro_hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        else if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = base + ph->p_vaddr;
            relro_hi = relro_lo + ph->p_memsz;
        }
    }
    if (!dyn || base == G.self)
        return 0;
    if (info->dlpi_name && strstr(info->dlpi_name, "linux-vdso"))
        return 0;
    for (size_t i = 0; i < G.nseen; i++)
        if (G.seen[i].base == base && G.seen[i].ld == dyn)
            return 0;       /* scanned already */
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *rela = NULL, *jmprel = NULL;
    size_t relasz = 0, pltsz = 0;
    int pltrel_rela = 1;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const void *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const void *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_RELA: rela = (const void *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_JMPREL: jmprel = (const void *)dyn_ptr(base, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: pltsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel_rela = d->d_un.d_val == DT_RELA; break;
        default: break;
        }
    }
    void *seen = mml_grow(G.seen, &G.capseen, G.nseen + 1, sizeof *G.seen);
    if (!seen)
        return 0;
    G.seen = seen;
    G.seen[G.nseen].base = base;
    G.seen[G.nseen++].ld = dyn;
    if (!symtab || !strtab)
        return 0;
    size_t before = G.n;
    if (rela)
        scan_relocs(base, rela, relasz / sizeof *rela, symtab, strtab, relro_lo, relro_hi);
    if (jmprel && pltrel_rela)
        scan_relocs(base, jmprel, pltsz / sizeof *jmprel, symtab, strtab, relro_lo, relro_hi);
    ctx->added += (int)(G.n - before);
    return 0;
}

/* One slot to VALUE, through a writable window if it is in RELRO. */
static void store(struct slot *s, uintptr_t value)
{
    if (*s->addr == value)
        return;
    uintptr_t a = (uintptr_t)s->addr;
    int ro = a >= s->lo && a < s->hi;
    long pg = sysconf(_SC_PAGESIZE);
    void *page = (void *)(a & ~(uintptr_t)(pg - 1));
    if (ro && mprotect(page, (size_t)pg, PROT_READ | PROT_WRITE))
        return;
    __atomic_store_n(s->addr, value, __ATOMIC_RELEASE);
    if (ro)
        mprotect(page, (size_t)pg, PROT_READ);
}

/* The untraced value of a slot.  Preloaded: the function mmleak calls itself, also for a
 * slot the loader has not bound yet (lazy binding would bind it to mmleak's function, the
 * first in the search order, and a paused process would go through mmleak after all).
 * Loaded into a running process: what the loader put there (a lazy stub binds to the
 * allocator, mmleak.so not being in the global scope). */
static uintptr_t untraced(const struct slot *s)
{
    const struct mml_hook *h = &G.hooks[s->hook];
    if (!G.attached && real_of(h))
        return real_of(h);
    return s->orig == (uintptr_t)h->ours && real_of(h) ? real_of(h) : s->orig;
}

static void apply_locked(int traced, size_t from)
{
    /* tracing on: frees first; off: allocations first (see the comment at the top) */
    for (int pass = 0; pass < 2; pass++) {
        int frees_now = traced ? pass == 0 : pass == 1;
        for (size_t i = from; i < G.n; i++) {
            struct slot *s = &G.s[i];
            const struct mml_hook *h = &G.hooks[s->hook];
            if ((h->kind == MML_HOOK_FREE) != frees_now)
                continue;
            store(s, traced ? (uintptr_t)h->ours : untraced(s));
        }
    }
}

void mml_got_init(const struct mml_hook *hooks, int n, const void *self_addr, int attached,
                  int (*real_dlclose)(void *))
{
    Dl_info di;
    pthread_mutex_lock(&G.lock);
    G.hooks = hooks;
    G.nhooks = n;
    G.attached = attached;
    G.dlclose = real_dlclose;
    G.self = dladdr(self_addr, &di) ? (uintptr_t)di.dli_fbase : 0;
    pthread_mutex_unlock(&G.lock);
}

int mml_got_switch(int traced)
{
    pthread_mutex_lock(&G.lock);
    struct scan_ctx ctx = { 0 };
    mml_each_object(scan_object, &ctx);
    G.traced = traced;
    apply_locked(traced, 0);
    size_t n = G.n;
    pthread_mutex_unlock(&G.lock);
    return (int)n;
}

int mml_got_new_objects(void)
{
    pthread_mutex_lock(&G.lock);
    struct scan_ctx ctx = { 0 };
    size_t from = G.n;
    mml_each_object(scan_object, &ctx);
    apply_locked(G.traced, from);
    pthread_mutex_unlock(&G.lock);
    return ctx.added;
}

void mml_got_forget_object(uintptr_t lo, uintptr_t hi)
{
    /* an object unloaded: its slots are gone, and its address may be reused */
    pthread_mutex_lock(&G.lock);
    size_t k = 0;
    for (size_t i = 0; i < G.n; i++)
        if (!((uintptr_t)G.s[i].addr >= lo && (uintptr_t)G.s[i].addr < hi))
            G.s[k++] = G.s[i];
    G.n = k;
    k = 0;
    for (size_t i = 0; i < G.nseen; i++)
        if (!(G.seen[i].base >= lo && G.seen[i].base < hi))
            G.seen[k++] = G.seen[i];
    G.nseen = k;
    pthread_mutex_unlock(&G.lock);
}

int mml_got_traced(void)
{
    return G.traced;
}

/* ---- the first definition of a symbol in the process, as the loader would find it ----
 * mmleak.so loaded with dlopen is not in the global scope, and dlsym(RTLD_DEFAULT) may give
 * a non-PIE program's canonical PLT entry, whose GOT slot we are about to point at mmleak:
 * calling it would come back to us.  So: the objects in load order, the first that defines
 * NAME itself (its address inside that object, and not a PLT stub). */
struct def_ctx { const char *name; void *found; };

static int looks_like_plt(const unsigned char *p)
{
    /* jmp *rel(%rip), or endbr64; bnd jmp *rel(%rip), or endbr64; jmp *rel(%rip) */
    return (p[0] == 0xff && p[1] == 0x25) ||
           (p[0] == 0xf3 && p[1] == 0x0f && p[2] == 0x1e && p[3] == 0xfa &&
            ((p[4] == 0xf2 && p[5] == 0xff && p[6] == 0x25) || (p[4] == 0xff && p[5] == 0x25)));
}

static int find_def(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct def_ctx *c = data;
    if (c->found || info->dlpi_addr == G.self || (info->dlpi_name && strstr(info->dlpi_name,
                                                                            "linux-vdso")))
        return 0;
    void *h = dlopen(info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : NULL,
                     RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *f = dlsym(h, c->name);
    if (G.dlclose)
        G.dlclose(h);       /* the real one: mmleak's would count an unload that is not one */
    Dl_info di;
    if (f && dladdr(f, &di) && (uintptr_t)di.dli_fbase == info->dlpi_addr &&
        !looks_like_plt(f))
        c->found = f;
    return 0;
}

void *mml_find_definition(const char *name)
{
    struct def_ctx c = { name, NULL };
    mml_each_object(find_def, &c);
    return c.found;
}
