/* tools/target.c: the target process seen from outside: small helpers, its memory, /proc/PID/maps,
 * its dynamic symbols, and why a ptrace was not permitted. */
#include "inject.h"

#if defined(__x86_64__) && defined(__linux__)

/* ---- small helpers ------------------------------------------------------------------ */

int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

__attribute__((format(printf, 3, 4))) int fail(struct inj *c, int code, const char *fmt,
                                                       ...)
{
    if (!c->have_err && c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
        for (char *p = c->err; *p; p++)
            if (*p == '\n')
                *p = ' ';
        c->have_err = 1;
    }
    return code;
}

__attribute__((format(printf, 2, 3))) void because(struct inj *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
}

/* read() again when a signal interrupts it; on an error FD is closed, errno kept. */
static ssize_t read_or_close(int fd, char *buf, size_t room)
{
    for (;;) {
        ssize_t r = read(fd, buf, room);
        if (r >= 0)
            return r;
        if (errno != EINTR) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
    }
}

/* Read FD on into BUF, which holds N bytes already, until the end of the file or until only
 * the last byte of CAP (the NUL's) is left: the new length (below CAP - 1 means the end came),
 * or -1 with errno, FD then closed. */
static ssize_t read_on(int fd, char *buf, size_t n, size_t cap)
{
    while (n < cap - 1) {
        ssize_t r = read_or_close(fd, buf + n, cap - 1 - n);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        n += r;
    }
    return n;
}

/* Read a whole small file into BUF (NUL-terminated); -1 with errno on failure. */
ssize_t slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read_on(fd, buf, 0, cap);
    if (n < 0)
        return -1;
    close(fd);
    buf[n] = 0;
    return n;
}

/* A whole file of any size in a malloc'd, NUL-terminated buffer, its length in *LEN; NULL
 * with errno on failure. */
static char *slurp_all(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 1 << 16;
    ssize_t n = 0;
    char *buf = NULL;
    for (;; cap *= 2) {
        char *nb = realloc(buf, cap);
        if (!nb) {
            free(buf);
            close(fd);
            errno = ENOMEM;
            return NULL;
        }
        buf = nb;
        n = read_on(fd, buf, (size_t)n, cap);
        if (n < 0) {
            int e = errno;
            free(buf);
            errno = e;
            return NULL;
        }
        if ((size_t)n < cap - 1)
            break;
    }
    close(fd);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* The text after "KEY:" in a /proc status file, or NULL. */
const char *field(const char *buf, const char *key)
{
    size_t k = strlen(key);
    for (const char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, key, k) && p[k] == ':') {
            p += k + 1;
            while (*p == ' ' || *p == '\t')
                p++;
            return p;
        }
    return NULL;
}

long field_long(const char *buf, const char *key, long dflt)
{
    const char *p = field(buf, key);
    return p ? strtol(p, NULL, 10) : dflt;
}

int read_status(int pid, int tid, char *buf, size_t cap)
{
    char path[64];
    if (tid > 0)
        snprintf(path, sizeof path, "/proc/%d/task/%d/status", pid, tid);
    else
        snprintf(path, sizeof path, "/proc/%d/status", pid);
    return slurp(path, buf, cap) < 0 ? -1 : 0;
}

const char *signame(int sig, char *buf, size_t cap)
{
    static const char *const names[] = {
        [SIGHUP] = "SIGHUP",   [SIGINT] = "SIGINT",       [SIGQUIT] = "SIGQUIT",
        [SIGILL] = "SIGILL",   [SIGTRAP] = "SIGTRAP",     [SIGABRT] = "SIGABRT",
        [SIGBUS] = "SIGBUS",   [SIGFPE] = "SIGFPE",       [SIGKILL] = "SIGKILL",
        [SIGUSR1] = "SIGUSR1", [SIGSEGV] = "SIGSEGV",     [SIGUSR2] = "SIGUSR2",
        [SIGPIPE] = "SIGPIPE", [SIGALRM] = "SIGALRM",     [SIGTERM] = "SIGTERM",
        [SIGCHLD] = "SIGCHLD", [SIGCONT] = "SIGCONT",     [SIGSTOP] = "SIGSTOP",
        [SIGTSTP] = "SIGTSTP", [SIGTTIN] = "SIGTTIN",     [SIGTTOU] = "SIGTTOU",
        [SIGSYS] = "SIGSYS",   [SIGXCPU] = "SIGXCPU",     [SIGPROF] = "SIGPROF",
    };
    if (sig > 0 && sig < (int)(sizeof names / sizeof *names) && names[sig])
        return names[sig];
    snprintf(buf, cap, "signal %d", sig);
    return buf;
}

static int is_fault_sig(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE ||
           sig == SIGTRAP || sig == SIGSYS;
}

/* A fault the kernel raised for the thread's own instruction (not a kill() of one). */
int is_fault(const siginfo_t *si)
{
    return is_fault_sig(si->si_signo) && si->si_code > 0;
}

/* ---- the target's memory -------------------------------------------------------------- */

int mem_rw(struct inj *c, uint64_t addr, void *buf, size_t len, int write)
{
    struct iovec l = {buf, len}, r = {(void *)addr, len};
    ssize_t n = write ? process_vm_writev(c->mtid, &l, 1, &r, 1, 0)
                      : process_vm_readv(c->mtid, &l, 1, &r, 1, 0);
    if (n == (ssize_t)len)
        return 0;
    if (n >= 0)
        errno = EFAULT;
    if (errno == EFAULT)
        return -1;
    /* no process_vm_* (seccomp, old kernel): /proc/PID/mem */
    if (c->memfd < 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task/%d/mem", c->pid, c->mtid);
        c->memfd = open(path, O_RDWR | O_CLOEXEC);
        if (c->memfd < 0)
            c->memfd = open(path, O_RDONLY | O_CLOEXEC);
        if (c->memfd < 0)
            return -1;
    }
    n = write ? pwrite(c->memfd, buf, len, (off_t)addr) : pread(c->memfd, buf, len, (off_t)addr);
    if (n >= 0 && n != (ssize_t)len)
        errno = EFAULT;
    return n == (ssize_t)len ? 0 : -1;
}

int rd(struct inj *c, uint64_t addr, void *buf, size_t len)
{
    return mem_rw(c, addr, buf, len, 0);
}

/* A NUL-terminated string of the target, cut to CAP-1 bytes. */
int rd_str(struct inj *c, uint64_t addr, char *buf, size_t cap)
{
    size_t n = 0;
    while (n < cap - 1) {
        size_t chunk = 4096 - ((addr + n) & 4095);
        if (chunk > cap - 1 - n)
            chunk = cap - 1 - n;
        if (rd(c, addr + n, buf + n, chunk) < 0)
            return -1;
        void *z = memchr(buf + n, 0, chunk);
        if (z)
            return 0;
        n += chunk;
    }
    buf[cap - 1] = 0;
    return 0;
}

/* ---- /proc/PID/maps ------------------------------------------------------------------- */

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

int load_maps(struct inj *c)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/maps", c->pid, c->mtid);
    size_t n;
    char *buf = slurp_all(path, &n);
    if (!buf)
        return -1;
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += buf[i] == '\n';
    struct mapent *m = calloc(lines + 1, sizeof *m);
    if (!m) {
        free(buf);
        errno = ENOMEM;
        return -1;
    }
    size_t k = 0;
    for (char *p = buf, *nl; p < buf + n; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl)
            nl = buf + n;
        *nl = 0;
        struct mapent *e = &m[k];
        int pos = 0;
        if (sscanf(p, "%lx-%lx %4s %lx %x:%x %lu %n", &e->start, &e->end, e->perm, &e->off,
                   &e->dmaj, &e->dmin, &e->ino, &pos) < 7)
            continue;
        char *q = p + pos;
        while (*q == ' ')
            q++;
        size_t ql = strlen(q);
        if (ql > 10 && !strcmp(q + ql - 10, " (deleted)"))
            q[ql - 10] = 0;
        e->path = q;
        k++;
    }
    free(c->mapsbuf);
    free(c->maps);
    c->mapsbuf = buf;
    c->maps = m;
    c->nmaps = k;
    return 0;
}

const struct mapent *map_at(struct inj *c, uint64_t addr)
{
    for (size_t i = 0; i < c->nmaps; i++)
        if (addr >= c->maps[i].start && addr < c->maps[i].end)
            return &c->maps[i];
    return NULL;
}

int in_ranges(const struct range *r, size_t n, uint64_t a)
{
    for (size_t i = 0; i < n; i++)
        if (a >= r[i].lo && a < r[i].hi)
            return 1;
    return 0;
}

int add_range(struct range **r, size_t *n, uint64_t lo, uint64_t hi)
{
    struct range *nr = realloc(*r, (*n + 1) * sizeof **r);
    if (!nr)
        return -1;
    nr[*n].lo = lo;
    nr[*n].hi = hi;
    *r = nr;
    (*n)++;
    return 0;
}

int classify(const char *path)
{
    const char *b = base_name(path);
    if (!strncmp(b, "ld-musl-", 8) || !strncmp(b, "libc.musl-", 10))
        return O_MUSL;
    if (!strncmp(b, "ld-linux", 8) || (!strncmp(b, "ld-", 3) && strstr(b, ".so")))
        return O_LD;
    if (!strcmp(b, "libc.so.6") || (!strncmp(b, "libc-", 5) && strstr(b, ".so")))
        return O_LIBC;
    if (!strncmp(b, "libdl.so", 8) || !strncmp(b, "libdl-", 6))
        return O_LIBDL;
    if (!strncmp(b, "libpthread.so", 13) || !strncmp(b, "libpthread-", 11))
        return O_LIBPTHREAD;
    if (strstr(b, "malloc") || strstr(b, "hoard"))
        return O_ALLOC;
    return O_OTHER;
}

/* Load address of the object mapped from PATH (its mapping at file offset 0). */
uint64_t object_base(struct inj *c, const char *path)
{
    for (size_t i = 0; i < c->nmaps; i++)
        if (c->maps[i].off == 0 && !strcmp(c->maps[i].path, path))
            return c->maps[i].start;
    return 0;
}

/* ---- dynamic symbols, read from the target's memory -------------------------------- */

int elf_open(struct inj *c, uint64_t base, struct elfdyn *d)
{
    Elf64_Ehdr eh;
    memset(d, 0, sizeof *d);
    if (rd(c, base, &eh, sizeof eh) < 0)
        return -1;
    errno = ENOEXEC;
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG))
        return -1;
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_machine != EM_X86_64)
        return -2;
    if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > 64)
        return -1;
    Elf64_Phdr ph[64];
    if (rd(c, base + eh.e_phoff, ph, eh.e_phnum * sizeof *ph) < 0)
        return -1;
    uint64_t lowest = UINT64_MAX, dyn = 0;
    for (int i = 0; i < eh.e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr < lowest)
            lowest = ph[i].p_vaddr;
        if (ph[i].p_type == PT_DYNAMIC)
            dyn = ph[i].p_vaddr;
    }
    if (lowest == UINT64_MAX || !dyn)
        return -1;
    d->bias = base - (lowest & ~4095UL);
    Elf64_Dyn dv[64];
    uint64_t at = d->bias + dyn;
    for (int chunk = 0; chunk < 16; chunk++, at += sizeof dv) {
        if (rd(c, at, dv, sizeof dv) < 0)
            return -1;
        for (int i = 0; i < 64; i++) {
            /* ld.so relocates these in place on x86-64; tolerate both forms */
            uint64_t v = dv[i].d_un.d_ptr;
            uint64_t p = (d->bias && v < d->bias) ? v + d->bias : v;
            switch (dv[i].d_tag) {
            case DT_NULL:
                return d->symtab && d->strtab && (d->gnuhash || d->hash) ? 0 : -1;
            case DT_SYMTAB: d->symtab = p; break;
            case DT_STRTAB: d->strtab = p; break;
            case DT_STRSZ: d->strsz = v; break;
            case DT_GNU_HASH: d->gnuhash = p; break;
            case DT_HASH: d->hash = p; break;
            case DT_VERSYM: d->versym = p; break;
            }
        }
    }
    return -1;
}

/* Is symbol IDX called NAME, defined, and (with versions) the default version?
 * Returns 2 default, 1 defined but hidden version, 0 no. */
static int sym_match(struct inj *c, struct elfdyn *d, uint32_t idx, const char *name,
                     Elf64_Sym *out)
{
    Elf64_Sym s;
    if (rd(c, d->symtab + (uint64_t)idx * sizeof s, &s, sizeof s) < 0)
        return 0;
    if (s.st_shndx == SHN_UNDEF || !s.st_value)
        return 0;
    size_t len = strlen(name) + 1;
    char nm[128];
    if (len > sizeof nm || (d->strsz && s.st_name + len > d->strsz))
        return 0;
    if (rd(c, d->strtab + s.st_name, nm, len) < 0 || memcmp(nm, name, len))
        return 0;
    *out = s;
    if (d->versym) {
        uint16_t v;
        if (rd(c, d->versym + (uint64_t)idx * 2, &v, 2) == 0 && (v & 0x8000))
            return 1;
    }
    return 2;
}

/* Keep symbol S, of sym_match's answer M, in *BEST when it is the first match (*FOUND 0) or
 * the default version, *FOUND then M; 1 when it is the default version: the search is over. */
static int better_sym(int m, const Elf64_Sym *s, Elf64_Sym *best, int *found)
{
    if (m && (m == 2 || !*found)) {
        *best = *s;
        *found = m;
    }
    return m == 2;
}

/* Address (and size) of the dynamic symbol NAME, or 0. */
uint64_t elf_sym(struct inj *c, struct elfdyn *d, const char *name, uint64_t *size)
{
    Elf64_Sym best, s;
    int found = 0;
    if (d->gnuhash) {
        uint32_t h = 5381, hdr[4];
        for (const unsigned char *p = (const unsigned char *)name; *p; p++)
            h = h * 33 + *p;
        if (rd(c, d->gnuhash, hdr, sizeof hdr) < 0 || !hdr[0])
            return 0;
        uint64_t buckets = d->gnuhash + 16 + (uint64_t)hdr[2] * 8;
        uint64_t chain = buckets + (uint64_t)hdr[0] * 4;
        uint32_t idx;
        if (rd(c, buckets + (uint64_t)(h % hdr[0]) * 4, &idx, 4) < 0 || idx < hdr[1])
            return 0;
        for (int guard = 0; guard < 100000; guard++, idx++) {
            uint32_t hv;
            if (rd(c, chain + (uint64_t)(idx - hdr[1]) * 4, &hv, 4) < 0)
                break;
            if ((hv | 1) == (h | 1)) {
                if (better_sym(sym_match(c, d, idx, name, &s), &s, &best, &found))
                    break;
            }
            if (hv & 1)
                break;
        }
    } else {
        uint32_t hdr[2], h = 0, g, idx;
        for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
            h = (h << 4) + *p;
            g = h & 0xf0000000;
            if (g)
                h ^= g >> 24;
            h &= ~g;
        }
        if (rd(c, d->hash, hdr, sizeof hdr) < 0 || !hdr[0])
            return 0;
        uint64_t chain = d->hash + 8 + (uint64_t)hdr[0] * 4;
        if (rd(c, d->hash + 8 + (uint64_t)(h % hdr[0]) * 4, &idx, 4) < 0)
            return 0;
        for (int guard = 0; idx && idx < hdr[1] && guard < 100000; guard++) {
            if (better_sym(sym_match(c, d, idx, name, &s), &s, &best, &found))
                break;
            if (rd(c, chain + (uint64_t)idx * 4, &idx, 4) < 0)
                break;
        }
    }
    if (!found || ELF64_ST_TYPE(best.st_info) == STT_GNU_IFUNC)
        return 0;
    if (size)
        *size = best.st_size;
    return d->bias + best.st_value;
}

/* ---- permission problems, explained ------------------------------------------------ */

static int has_cap_sys_ptrace(void)
{
    char buf[4096];
    if (slurp("/proc/self/status", buf, sizeof buf) < 0)
        return geteuid() == 0;
    const char *p = field(buf, "CapEff");
    return p ? (strtoull(p, NULL, 16) >> 19) & 1 : geteuid() == 0;
}

static int is_descendant(int pid, int me)
{
    char buf[4096], path[64];
    for (int guard = 0; pid > 1 && guard < 4096; guard++) {
        snprintf(path, sizeof path, "/proc/%d/status", pid);
        if (slurp(path, buf, sizeof buf) < 0)
            return 0;
        pid = (int)field_long(buf, "PPid", 0);
        if (pid == me)
            return 1;
    }
    return 0;
}

int tracer_of(int pid, int tid, char *name, size_t cap)
{
    char buf[4096], path[64];
    if (read_status(pid, tid, buf, sizeof buf) < 0)
        return 0;
    int t = (int)field_long(buf, "TracerPid", 0);
    name[0] = 0;
    if (t > 0) {
        snprintf(path, sizeof path, "/proc/%d/comm", t);
        if (slurp(path, name, cap) > 0)
            name[strcspn(name, "\n")] = 0;
    }
    return t;
}

int explain_eperm(struct inj *c, int tid, const char *what)
{
    char buf[4096], tname[64];
    int pid = c->pid;
    int t = tracer_of(pid, tid > 0 ? tid : 0, tname, sizeof tname);
    if (t > 0 && t != c->me)
        return fail(c, MMLEAK_INJ_EPERM, "%d is being traced by another process (%d %s)", pid,
                    t, tname[0] ? tname : "?");
    int cap = has_cap_sys_ptrace();
    if (read_status(pid, 0, buf, sizeof buf) < 0)
        return fail(c, MMLEAK_INJ_ESRCH, "no such process %d", pid);
    unsigned long u[4] = {0}, g[4] = {0};
    const char *p = field(buf, "Uid"), *q = field(buf, "Gid");
    if (p)
        sscanf(p, "%lu %lu %lu %lu", &u[0], &u[1], &u[2], &u[3]);
    if (q)
        sscanf(q, "%lu %lu %lu %lu", &g[0], &g[1], &g[2], &g[3]);
    uid_t ru = getuid();
    gid_t rg = getgid();
    if (!cap && (u[0] != ru || u[1] != ru || u[2] != ru))
        return fail(c, MMLEAK_INJ_EPERM,
                    "%d belongs to another user (uid %lu): run as that user or as root", pid,
                    u[0] != ru ? u[0] : u[1] != ru ? u[1] : u[2]);
    if (!cap && (g[0] != rg || g[1] != rg || g[2] != rg))
        return fail(c, MMLEAK_INJ_EPERM,
                    "%d runs with another group (gid %lu): run as root", pid,
                    g[0] != rg ? g[0] : g[1] != rg ? g[1] : g[2]);
    struct stat st;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid); /* root's when not dumpable */
    if (!cap && stat(path, &st) == 0 && st.st_uid != (uid_t)u[1])
        return fail(c, MMLEAK_INJ_EPERM,
                    "%d is not dumpable (set-uid or set-gid program, file capabilities, or "
                    "prctl(PR_SET_DUMPABLE, 0)): only root can attach to it", pid);
    char ys[16];
    int scope = slurp("/proc/sys/kernel/yama/ptrace_scope", ys, sizeof ys) > 0 ? atoi(ys) : 0;
    if (scope >= 3)
        return fail(c, MMLEAK_INJ_EPERM,
                    "not permitted to trace %d: kernel.yama.ptrace_scope is %d (no process may "
                    "be traced until reboot)", pid, scope);
    if (scope == 2 && !cap)
        return fail(c, MMLEAK_INJ_EPERM,
                    "not permitted to trace %d: kernel.yama.ptrace_scope is 2 (run as root)", pid);
    if (scope == 1 && !cap && !is_descendant(pid, c->me))
        return fail(c, MMLEAK_INJ_EPERM,
                    "not permitted to trace %d: kernel.yama.ptrace_scope is 1 and %d is not a "
                    "descendant (run as root, or set it to 0)", pid, pid);
    return fail(c, MMLEAK_INJ_EPERM,
                "not permitted to trace %d (%s: a security module, seccomp or a user namespace "
                "forbids it)", pid, what);
}

#endif
