/* The program's own LeakSanitizer suppressions: the rules its __lsan_default_suppressions()
 * returns, read once at the start and written into every dump file's header
 * ("#suppressions", docs/format.rst), for mmleak.py's report and --check.
 *
 * An executable exports that function only when a shared object refers to it (libasan does;
 * a plain build does not), so dlsym cannot find it, and a dlsym that fails allocates.  It is
 * looked up in the executable's symbol tables on disk instead (.symtab, else .dynsym), and
 * called only when the file is the program that runs: its entry point, moved by the load
 * base, must be the process's (AT_ENTRY).  Cold: one open and one mapping of the executable,
 * at the start. */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "internal.h"

char g_supp[1024];

static const char SUPP_NAME[] = "__lsan_default_suppressions";

static int first_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    *(ElfW(Addr) *)data = info->dlpi_addr;
    return 1;                       /* the executable comes first */
}

/* The address of the function SUPP_NAME in the ELF image IMG (N bytes), 0 if none. */
static ElfW(Addr) find_symbol(const unsigned char *img, size_t n)
{
    const ElfW(Ehdr) *eh = (const void *)img;
    if (eh->e_shoff == 0 || eh->e_shentsize != sizeof(ElfW(Shdr)) ||
        eh->e_shoff > n || (size_t)eh->e_shnum * sizeof(ElfW(Shdr)) > n - eh->e_shoff)
        return 0;
    const ElfW(Shdr) *sh = (const void *)(img + eh->e_shoff);
    for (int pass = 0; pass < 2; pass++) {
        unsigned want = pass ? SHT_DYNSYM : SHT_SYMTAB;
        for (unsigned i = 0; i < eh->e_shnum; i++) {
            if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum ||
                sh[i].sh_entsize != sizeof(ElfW(Sym)) || sh[i].sh_offset > n ||
                sh[i].sh_size > n - sh[i].sh_offset)
                continue;
            const ElfW(Shdr) *st = &sh[sh[i].sh_link];
            if (st->sh_offset > n || st->sh_size > n - st->sh_offset)
                continue;
            const char *strs = (const char *)img + st->sh_offset;
            const ElfW(Sym) *sym = (const void *)(img + sh[i].sh_offset);
            size_t count = sh[i].sh_size / sizeof(ElfW(Sym));
            for (size_t k = 0; k < count; k++) {
                if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || sym[k].st_shndx == SHN_UNDEF ||
                    !sym[k].st_value || sym[k].st_name + sizeof SUPP_NAME > st->sh_size)
                    continue;
                if (!memcmp(strs + sym[k].st_name, SUPP_NAME, sizeof SUPP_NAME))
                    return sym[k].st_value;
            }
        }
    }
    return 0;
}

/* Keep the whole lines of RAW (N bytes) that fit in g_supp once escaped; the length kept. */
static size_t whole_lines(const char *raw, size_t n)
{
    size_t need = 0, keep = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)raw[i];
        need += (c < 0x20 || c >= 0x7f || c == '\\') ? 4 : 1;
        if (need + 6 > sizeof g_supp)
            return keep;
        if (c == '\n')
            keep = i + 1;
    }
    return n;
}

COLD void read_default_suppressions(void)
{
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_size < (off_t)sizeof(ElfW(Ehdr))) {
        close(fd);
        return;
    }
    size_t n = (size_t)sb.st_size;
    const unsigned char *img = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (img == MAP_FAILED)
        return;
    const ElfW(Ehdr) *eh = (const void *)img;
    ElfW(Addr) base = 0, at = 0;
    if (!memcmp(eh->e_ident, ELFMAG, SELFMAG) && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
        (eh->e_type == ET_DYN || eh->e_type == ET_EXEC)) {
        mml_each_object(first_object, &base);
        if (eh->e_type == ET_EXEC)
            base = 0;
        if (base + eh->e_entry == getauxval(AT_ENTRY))
            at = find_symbol(img, n);
    }
    munmap((void *)img, n);
    if (!at)
        return;
    const char *(*f)(void) = (const char *(*)(void))(base + at);
    const char *rules = f();
    if (!rules)
        return;
    size_t len = strnlen(rules, 1 << 20), keep = whole_lines(rules, len);
    escape_into(g_supp, g_supp + sizeof g_supp, (const unsigned char *)rules, keep, 0);
    if (keep < len)
        say("__lsan_default_suppressions(): its rules past the first ", "1 KiB",
            " are not kept (give them in a file: mmleak.py --suppressions)");
}
