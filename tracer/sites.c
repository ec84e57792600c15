/*
 * tracer/sites.c: is a return address the program's own code, or code that allocates on the
 * program's behalf?
 *
 * The call site a user wants is the first frame that is neither inside the C/C++ runtime
 * (libc, libstdc++, libgcc_s, the dynamic loader, the allocator itself) nor inside a known
 * allocation wrapper (xmalloc, g_malloc, PyMem_Malloc, sqlite3Malloc...).  mmleak.so asks
 * that question for the caller of every allocation in its default mode: when the answer is
 * "the program", one frame says it all and the fast writer is used; otherwise the stack is
 * unwound until the program's frame.
 *
 * The answers are cached per return address in direct-mapped tables (one load and compare
 * on the fast path for the program's addresses, two for the others: mml_site_class in
 * internal.h; a program that allocates through a wrapper, perl or python, asks for every
 * allocation).  A miss comes here: the object holding
 * the address is found with glibc's lock-free _dl_find_object, classified once (runtime by
 * file name; wrapper functions by name, from the symbol tables of its file on disk: .symtab
 * when the file has one, else .dynsym), and the result kept per object.  dlclose forgets
 * everything (mml_sites_forget): another object may come at the same addresses.
 *
 * Everything here runs in mmleak's slow path, with its re-entrancy guard held: the symbol
 * scan may open and map files; it allocates with mmap only.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

_Atomic uintptr_t mml_direct[MML_DIRECT_SIZE];
_Atomic uintptr_t mml_passing[MML_DIRECT_SIZE];

/* Runtime objects, by the start of their file name (facts.h): the code in them allocates on the
 * program's behalf (stdio buffers, std::string, getline, the loader's TLS blocks). */
static const char *const RUNTIME[] = {
#define X(prefix) prefix,
    MMLEAK_RUNTIME_OBJECTS(X)
#undef X
};

/* Allocation wrappers, by symbol name (facts.h). */
static const char *const WRAPPERS[] = {
#define X(name) name,
    MMLEAK_WRAPPERS(X)
#undef X
};
#define NWRAP (sizeof WRAPPERS / sizeof WRAPPERS[0])

struct range { uintptr_t lo, hi; };

/* One object seen: its address range, whether it is the runtime, its wrapper functions. */
struct object {
    uintptr_t start, end;
    int runtime;
    struct range *wrap;  /* sorted */
    size_t nwrap, wcap;
};

/* Address ranges an object was unloaded from (dlclose): code there may belong to different
 * objects at different times, so its addresses are never cached as the program's and their
 * frames carry the epoch (see capture in stacks.c).  Past VOLATILE_MAX ranges, everything is. */
#define VOLATILE_MAX 256
static struct range volatile_r[VOLATILE_MAX];
static _Atomic size_t volatile_n;
static atomic_int volatile_all;

static struct {
    pthread_mutex_t lock;
    struct object *a;
    size_t n, cap;
    _Atomic unsigned gen;       /* bumped by mml_sites_forget */
} S = { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0 };

static int starts_with(const char *s, const char *p)
{
    while (*p)
        if (*s++ != *p++)
            return 0;
    return 1;
}

/* Template code of the C++ standard library instantiated in the program (std::vector's
 * _M_realloc_insert, std::__new_allocator<T>::allocate...): the runtime's code, compiled into
 * the program.  Recognised by the mangled namespace: std:: and __gnu_cxx::. */
static int is_std_name(const char *s)
{
    static const char *const std_prefix[] = {
        "_ZNSt", "_ZNKSt", "_ZSt", "_ZN9__gnu_cxx", "_ZNK9__gnu_cxx", "_ZN10__cxxabiv1",
    };
    for (size_t i = 0; i < sizeof std_prefix / sizeof std_prefix[0]; i++)
        if (starts_with(s, std_prefix[i]))
            return 1;
    return 0;
}

static int is_wrapper_name(const char *s, const char *end)
{
    size_t n = 0;
    while (s + n < end && s[n])
        n++;
    if (s + n >= end)
        return 0;
    if (is_std_name(s))
        return 1;
    /* a C++ function at namespace scope: _Z [L] LENGTH NAME PARAMETERS ("_ZL7xmallocm") */
    if (s[0] == '_' && s[1] == 'Z') {
        const char *p = s + 2 + (s[2] == 'L');
        size_t len = 0;
        while (*p >= '0' && *p <= '9' && len < 4096)
            len = len * 10 + (size_t)(*p++ - '0');
        if (!len || len > (size_t)(s + n - p))
            return 0;
        for (size_t i = 0; i < NWRAP; i++)
            if (strlen(WRAPPERS[i]) == len && memcmp(WRAPPERS[i], p, len) == 0)
                return 1;
        return 0;
    }
    for (size_t i = 0; i < NWRAP; i++)
        if (WRAPPERS[i][0] == s[0] && strcmp(WRAPPERS[i], s) == 0)
            return 1;
    return 0;
}

/* The wrapper functions of the ELF file PATH, loaded with bias BIAS: every FUNC symbol whose
 * name is a known wrapper.  .symtab is preferred (it has static functions too). */
static void scan_wrappers(const char *path, uintptr_t bias, struct object *o)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > (off_t)sizeof(ElfW(Ehdr)))
        m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return;
    const char *base = m;
    const ElfW(Ehdr) *eh = m;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shoff == 0 ||
        eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(ElfW(Shdr)) > (uint64_t)st.st_size)
        goto out;
    const ElfW(Shdr) *sh = (const void *)(base + eh->e_shoff);
    const ElfW(Shdr) *tab = NULL;
    for (int pass = 0; pass < 2 && !tab; pass++)
        for (unsigned i = 0; i < eh->e_shnum; i++)
            if (sh[i].sh_type == (pass ? SHT_DYNSYM : SHT_SYMTAB) && sh[i].sh_link < eh->e_shnum)
                tab = &sh[i];
    if (!tab || tab->sh_entsize != sizeof(ElfW(Sym)))
        goto out;
    const ElfW(Shdr) *strs = &sh[tab->sh_link];
    if (tab->sh_offset + tab->sh_size > (uint64_t)st.st_size ||
        strs->sh_offset + strs->sh_size > (uint64_t)st.st_size)
        goto out;
    const ElfW(Sym) *sym = (const void *)(base + tab->sh_offset);
    size_t nsym = tab->sh_size / sizeof(ElfW(Sym));
    const char *str = base + strs->sh_offset, *send = str + strs->sh_size;
    for (size_t i = 0; i < nsym; i++) {
        if (ELF64_ST_TYPE(sym[i].st_info) != STT_FUNC || sym[i].st_shndx == SHN_UNDEF ||
            sym[i].st_value == 0 || sym[i].st_name >= strs->sh_size)
            continue;
        const char *name = str + sym[i].st_name;
        if (!is_wrapper_name(name, send))
            continue;
        struct range *r = mml_grow(o->wrap, &o->wcap, o->nwrap + 1, sizeof *r);
        if (!r)
            break;
        o->wrap = r;
        uintptr_t lo = bias + sym[i].st_value;
        o->wrap[o->nwrap++] = (struct range){ lo, lo + (sym[i].st_size ? sym[i].st_size : 1) };
    }
    /* shell sort (no qsort: it may allocate), for the binary search in mml_site_classify */
    for (size_t gap = o->nwrap / 2; gap > 0; gap /= 2)
        for (size_t i = gap; i < o->nwrap; i++)
            for (size_t j = i; j >= gap && o->wrap[j - gap].lo > o->wrap[j].lo; j -= gap) {
                struct range x = o->wrap[j];
                o->wrap[j] = o->wrap[j - gap];
                o->wrap[j - gap] = x;
            }
out:
    munmap(m, (size_t)st.st_size);
}

static const struct object *find_locked(uintptr_t a)
{
    for (size_t i = 0; i < S.n; i++)
        if (a - S.a[i].start < S.a[i].end - S.a[i].start)
            return &S.a[i];
    return NULL;
}

/* The object holding address A, classified on first sight; NULL for code outside every
 * object (a JIT): that is the program's. */
static const struct object *object_at(uintptr_t a)
{
    const struct object *o = find_locked(a);
    if (o)
        return o;
    struct dl_find_object f;
    if (_dl_find_object((void *)a, &f) != 0 || !f.dlfo_link_map)
        return NULL;
    struct link_map *lm = f.dlfo_link_map;
    const char *name = lm->l_name && lm->l_name[0] ? lm->l_name : "/proc/self/exe";
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    struct object *na = mml_grow(S.a, &S.cap, S.n + 1, sizeof *na);
    if (!na)
        return NULL;
    S.a = na;
    struct object *n = &S.a[S.n];
    memset(n, 0, sizeof *n);
    n->start = (uintptr_t)f.dlfo_map_start;
    n->end = (uintptr_t)f.dlfo_map_end;
    for (size_t i = 0; i < sizeof RUNTIME / sizeof RUNTIME[0]; i++)
        if (starts_with(base, RUNTIME[i]))
            n->runtime = 1;
    /* mmleak.so itself, whatever its file is called: the retry of a failing operator new
     * allocates from mmleak.c on the program's behalf */
    if ((uintptr_t)&mml_site_classify >= n->start && (uintptr_t)&mml_site_classify < n->end)
        n->runtime = 1;
    if (!n->runtime)
        scan_wrappers(name, lm->l_addr, n);
    S.n++;
    return n;
}

int mml_site_volatile(uintptr_t a)
{
    if (atomic_load_explicit(&volatile_all, memory_order_relaxed))
        return 1;
    size_t n = atomic_load_explicit(&volatile_n, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (a - volatile_r[i].lo < volatile_r[i].hi - volatile_r[i].lo)
            return 1;
    return 0;
}

int mml_sites_unloaded(void)
{
    return atomic_load_explicit(&volatile_all, memory_order_relaxed) ||
           atomic_load_explicit(&volatile_n, memory_order_relaxed) != 0;
}

void mml_sites_unloading(uintptr_t lo, uintptr_t hi)
{
    pthread_mutex_lock(&S.lock);
    size_t n = atomic_load(&volatile_n);
    int known = 0;
    for (size_t i = 0; i < n; i++)
        if (volatile_r[i].lo <= lo && hi <= volatile_r[i].hi)
            known = 1;
    if (!known) {
        if (n == VOLATILE_MAX) {
            atomic_store(&volatile_all, 1);
        } else {
            volatile_r[n] = (struct range){ lo, hi };
            atomic_store_explicit(&volatile_n, n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&S.lock);
}

int mml_site_classify(uintptr_t a)
{
    pthread_mutex_lock(&S.lock);
    const struct object *o = object_at(a);
    int pass = 0;
    if (o && o->runtime) {
        pass = MML_SITE_RUNTIME;
    } else if (o && o->nwrap) {
        size_t lo = 0, hi = o->nwrap;       /* the last range starting at or below a */
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (o->wrap[mid].lo <= a)
                lo = mid;
            else
                hi = mid;
        }
        if (o->wrap[lo].lo <= a && a < o->wrap[lo].hi)
            pass = MML_SITE_WRAPPER;
    }
    pthread_mutex_unlock(&S.lock);
    if (mml_site_volatile(a))
        return pass | MML_SITE_VOLATILE;
    if (!pass)
        atomic_store_explicit(&mml_direct[MML_DIRECT_SLOT(a)], a, memory_order_relaxed);
    else if (MML_PASSING_ADDR(a) == a)
        atomic_store_explicit(&mml_passing[MML_DIRECT_SLOT(a)], a | (uintptr_t)pass << 56,
                              memory_order_relaxed);
    return pass;
}

void mml_sites_forget(void)
{
    for (size_t i = 0; i < MML_DIRECT_SIZE; i++) {
        atomic_store_explicit(&mml_direct[i], 0, memory_order_relaxed);
        atomic_store_explicit(&mml_passing[i], 0, memory_order_relaxed);
    }
    pthread_mutex_lock(&S.lock);
    for (size_t i = 0; i < S.n; i++)
        if (S.a[i].wrap)
            mml_unmap(S.a[i].wrap, S.a[i].wcap * sizeof(struct range));
    S.n = 0;
    pthread_mutex_unlock(&S.lock);
}

void mml_sites_after_fork(void)
{
    pthread_mutex_init(&S.lock, NULL);
}
