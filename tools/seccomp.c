/* tools/seccomp.c: does the target's seccomp filter allow what dlopen and mmleak do. */
#include "inject.h"

#if defined(__x86_64__) && defined(__linux__)

/* ---- seccomp ----
 * A thread under seccomp would be killed (or its calls failed) by a system call its filter
 * does not allow, and dlopen, then mmleak in that process, make system calls the program
 * itself may never make.  So before anything runs in the process: a thread in strict mode
 * refuses the attach; a filter is read (PTRACE_SECCOMP_GET_FILTER, which needs
 * CAP_SYS_ADMIN), run here on each system call dlopen and mmleak make (SC_NEEDED, with the
 * arguments they use: seen with strace), and the attach is refused unless it allows them
 * all.  The filters are the stopped thread's; every other thread must have as many (a thread
 * that added its own cannot be read without stopping it too). */
#ifndef PTRACE_SECCOMP_GET_FILTER
#define PTRACE_SECCOMP_GET_FILTER 0x420c
#endif
#define SC_MAX_INSNS 4096       /* BPF_MAXINSNS */
#define SC_MAX_FILTERS 64

static const struct sc_call {
    int nr;
    const char *name;
    uint64_t a[6];
} SC_NEEDED[] = {
    /* dlopen */
    { SYS_openat, "openat", { (uint64_t)AT_FDCWD, 0, O_RDONLY | O_CLOEXEC, 0, 0, 0 } },
    { SYS_read, "read", { 3, 0, 832, 0, 0, 0 } },
    { SYS_pread64, "pread64", { 3, 0, 784, 64, 0, 0 } },
    { SYS_newfstatat, "newfstatat", { 3, 0, 0, AT_EMPTY_PATH, 0, 0 } },
    { SYS_fstat, "fstat", { 3, 0, 0, 0, 0, 0 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ, MAP_PRIVATE | MAP_DENYWRITE, 3, 0 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED | MAP_DENYWRITE,
                          3, 4096 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED |
                          MAP_DENYWRITE, 3, 4096 } },
    { SYS_mmap, "mmap", { 0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED |
                          MAP_ANONYMOUS, (uint64_t)-1, 0 } },
    { SYS_mprotect, "mprotect", { 0, 4096, PROT_READ, 0, 0, 0 } },
    { SYS_close, "close", { 3, 0, 0, 0, 0, 0 } },
    { SYS_munmap, "munmap", { 0, 8192, 0, 0, 0, 0 } },
    { SYS_futex, "futex", { 0, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, 0, 0, 0 } },
    { SYS_futex, "futex", { 0, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, 2, 0, 0, 0 } },
    /* mmleak_attach, and mmleak while it traces */
    { SYS_openat, "openat", { (uint64_t)AT_FDCWD, 0, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW |
                              O_NONBLOCK | O_CLOEXEC, 0600, 0, 0 } },
    { SYS_openat, "openat", { (uint64_t)AT_FDCWD, 0, O_WRONLY | O_NOFOLLOW | O_NONBLOCK |
                              O_CLOEXEC, 0, 0, 0 } },
    { SYS_mmap, "mmap", { 0, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, 3, 0 } },
    { SYS_mmap, "mmap", { 0, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          (uint64_t)-1, 0 } },
    { SYS_mprotect, "mprotect", { 0, 4096, PROT_READ | PROT_WRITE, 0, 0, 0 } },
    { SYS_madvise, "madvise", { 0, 4096, MADV_WIPEONFORK, 0, 0, 0 } },
    { SYS_fallocate, "fallocate", { 3, 0, 0, 65536, 0, 0 } },
    { SYS_pwrite64, "pwrite64", { 3, 0, 4096, 0, 0, 0 } },
    { SYS_write, "write", { 2, 0, 80, 0, 0, 0 } },
    { SYS_unlinkat, "unlinkat", { (uint64_t)AT_FDCWD, 0, 0, 0, 0, 0 } },
    { SYS_renameat, "renameat", { (uint64_t)AT_FDCWD, 0, (uint64_t)AT_FDCWD, 0, 0, 0 } },
    { SYS_prlimit64, "prlimit64", { 0, RLIMIT_FSIZE, 0, 0, 0, 0 } },
    { SYS_getrandom, "getrandom", { 0, 8, 1 /* GRND_NONBLOCK */, 0, 0, 0 } },
    { SYS_getpid, "getpid", { 0 } },
    { SYS_gettid, "gettid", { 0 } },
    { SYS_geteuid, "geteuid", { 0 } },
    { SYS_clock_nanosleep, "clock_nanosleep", { CLOCK_REALTIME, 0, 0, 0, 0, 0 } },
    { SYS_process_vm_readv, "process_vm_readv", { 0, 0, 1, 0, 2, 0 } },
};

/* The classic BPF of a seccomp filter, run on one call (the kernel checked the program when
 * it was installed: jumps go forward, loads stay inside seccomp_data). */
static uint32_t sc_run(const struct sock_filter *f, size_t n, const struct seccomp_data *d)
{
    uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = { 0 };
    const unsigned char *raw = (const unsigned char *)d;
    for (size_t pc = 0; pc < n; pc++) {
        const struct sock_filter *i = &f[pc];
        uint32_t k = i->k, src = BPF_SRC(i->code) == BPF_X ? x : k;
        switch (BPF_CLASS(i->code)) {
        case BPF_LD:
            if (BPF_MODE(i->code) == BPF_ABS) {
                if (k + 4 > sizeof *d)
                    return SECCOMP_RET_KILL_PROCESS;
                memcpy(&a, raw + k, 4);
            } else if (BPF_MODE(i->code) == BPF_IMM) {
                a = k;
            } else if (BPF_MODE(i->code) == BPF_MEM) {
                a = mem[k % BPF_MEMWORDS];
            } else if (BPF_MODE(i->code) == BPF_LEN) {
                a = sizeof *d;
            } else {
                return SECCOMP_RET_KILL_PROCESS;
            }
            break;
        case BPF_LDX:
            if (BPF_MODE(i->code) == BPF_IMM)
                x = k;
            else if (BPF_MODE(i->code) == BPF_MEM)
                x = mem[k % BPF_MEMWORDS];
            else if (BPF_MODE(i->code) == BPF_LEN)
                x = sizeof *d;
            else
                return SECCOMP_RET_KILL_PROCESS;
            break;
        case BPF_ST:
            mem[k % BPF_MEMWORDS] = a;
            break;
        case BPF_STX:
            mem[k % BPF_MEMWORDS] = x;
            break;
        case BPF_ALU:
            switch (BPF_OP(i->code)) {
            case BPF_ADD: a += src; break;
            case BPF_SUB: a -= src; break;
            case BPF_MUL: a *= src; break;
            case BPF_DIV: a = src ? a / src : 0; break;
            case BPF_MOD: a = src ? a % src : 0; break;
            case BPF_OR: a |= src; break;
            case BPF_AND: a &= src; break;
            case BPF_XOR: a ^= src; break;
            case BPF_LSH: a = src < 32 ? a << src : 0; break;
            case BPF_RSH: a = src < 32 ? a >> src : 0; break;
            case BPF_NEG: a = -a; break;
            default: return SECCOMP_RET_KILL_PROCESS;
            }
            break;
        case BPF_JMP: {
            int t;
            switch (BPF_OP(i->code)) {
            case BPF_JA: pc += k; continue;
            case BPF_JEQ: t = a == src; break;
            case BPF_JGT: t = a > src; break;
            case BPF_JGE: t = a >= src; break;
            case BPF_JSET: t = (a & src) != 0; break;
            default: return SECCOMP_RET_KILL_PROCESS;
            }
            pc += t ? i->jt : i->jf;
            break;
        }
        case BPF_RET:
            return BPF_RVAL(i->code) == BPF_A ? a : k;
        case BPF_MISC:
            if (BPF_MISCOP(i->code) == BPF_TAX)
                x = a;
            else
                a = x;
            break;
        default:
            return SECCOMP_RET_KILL_PROCESS;
        }
    }
    return SECCOMP_RET_KILL_PROCESS;     /* fell off the end: the kernel never allows it */
}

static const char *sc_action(uint32_t r, char *buf, size_t cap)
{
    switch (r & SECCOMP_RET_ACTION_FULL) {
    case SECCOMP_RET_KILL_PROCESS: return "it would kill the process";
    case SECCOMP_RET_KILL_THREAD: return "it would kill the thread";
    case SECCOMP_RET_TRAP: return "it would send SIGSYS";
    case SECCOMP_RET_ERRNO:
        snprintf(buf, cap, "it would fail with errno %u", r & SECCOMP_RET_DATA);
        return buf;
    case SECCOMP_RET_TRACE: return "it would hand it to a tracer";
    case SECCOMP_RET_USER_NOTIF: return "it would ask a supervisor";
    default: return "an unknown action";
    }
}

static int sc_field(const char *buf, const char *key, long *v)
{
    const char *f = field(buf, key);
    if (!f)
        return -1;
    *v = strtol(f, NULL, 10);
    return 0;
}

/* 0: the process may be used as far as seccomp goes; 1: refused (*code set). */
int seccomp_check(struct inj *c, int tid, int *code)
{
    char buf[4096];
    long mode = 0, nfilt = -1;
    if (read_status(c->pid, tid, buf, sizeof buf) < 0 || sc_field(buf, "Seccomp", &mode) < 0)
        return 0;               /* no seccomp in this kernel */
    sc_field(buf, "Seccomp_filters", &nfilt);
    /* every thread: strict mode anywhere refuses; filters must be the same count */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", c->pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int t = atoi(e->d_name);
        long m2 = 0, n2 = -1;
        if (t <= 0 || read_status(c->pid, t, buf, sizeof buf) < 0 ||
            sc_field(buf, "Seccomp", &m2) < 0)
            continue;
        sc_field(buf, "Seccomp_filters", &n2);
        if (m2 == SECCOMP_MODE_STRICT) {
            closedir(d);
            *code = fail(c, MMLEAK_INJ_EUNSUPP, "thread %d of %d is in seccomp strict mode: "
                         "the system calls of dlopen and of mmleak would kill it", t, c->pid);
            return 1;
        }
        if (m2 != mode || n2 != nfilt) {
            closedir(d);
            *code = fail(c, MMLEAK_INJ_EUNSUPP, "threads %d and %d of %d have different "
                         "seccomp filters: they cannot all be checked, attaching could kill "
                         "it", tid, t, c->pid);
            return 1;
        }
    }
    if (d)
        closedir(d);
    if (mode != SECCOMP_MODE_FILTER)
        return 0;
    struct sock_filter *f = malloc(SC_MAX_INSNS * sizeof *f);
    if (!f) {
        *code = fail(c, MMLEAK_INJ_ESYS, "out of memory");
        return 1;
    }
    uint32_t worst[sizeof SC_NEEDED / sizeof SC_NEEDED[0]];
    for (size_t j = 0; j < sizeof SC_NEEDED / sizeof SC_NEEDED[0]; j++)
        worst[j] = SECCOMP_RET_ALLOW;
    int nread = 0;
    for (long i = 0; i < SC_MAX_FILTERS; i++) {
        long n = ptrace(PTRACE_SECCOMP_GET_FILTER, tid, (void *)i, f);
        if (n < 0 && errno == ENOENT)
            break;
        if (n < 0 || n > SC_MAX_INSNS) {
            int err = errno;
            free(f);
            if (n < 0 && (err == EACCES || err == EPERM))
                *code = fail(c, MMLEAK_INJ_EPERM, "%d has a seccomp filter, and only a process "
                             "with CAP_SYS_ADMIN may read it to see whether dlopen and mmleak "
                             "may run there (run as root)", c->pid);
            else
                *code = fail(c, MMLEAK_INJ_EUNSUPP, "%d has a seccomp filter that cannot be "
                             "read (PTRACE_SECCOMP_GET_FILTER: %s): attaching could kill it",
                             c->pid, n < 0 ? strerror(err) : "too long");
            return 1;
        }
        nread++;
        for (size_t j = 0; j < sizeof SC_NEEDED / sizeof SC_NEEDED[0]; j++) {
            struct seccomp_data sd;
            memset(&sd, 0, sizeof sd);
            sd.nr = SC_NEEDED[j].nr;
            sd.arch = AUDIT_ARCH_X86_64;
            sd.instruction_pointer = c->libc_xlo;
            memcpy(sd.args, SC_NEEDED[j].a, sizeof sd.args);
            uint32_t r = sc_run(f, (size_t)n, &sd);
            /* the kernel keeps the most restrictive verdict: the lowest action, signed */
            if ((int32_t)(r & SECCOMP_RET_ACTION_FULL) <
                (int32_t)(worst[j] & SECCOMP_RET_ACTION_FULL))
                worst[j] = r;
        }
    }
    free(f);
    if (nfilt >= 0 && nread != nfilt) {
        *code = fail(c, MMLEAK_INJ_EUNSUPP, "%d: %d of its %ld seccomp filters could be read: "
                     "attaching could kill it", c->pid, nread, nfilt);
        return 1;
    }
    for (size_t j = 0; j < sizeof SC_NEEDED / sizeof SC_NEEDED[0]; j++) {
        uint32_t act = worst[j] & SECCOMP_RET_ACTION_FULL;
        if (act != SECCOMP_RET_ALLOW && act != SECCOMP_RET_LOG) {
            char ab[48];
            *code = fail(c, MMLEAK_INJ_EUNSUPP, "%d has a seccomp filter that does not allow "
                         "%s (%s), a system call dlopen or mmleak makes", c->pid,
                         SC_NEEDED[j].name, sc_action(worst[j], ab, sizeof ab));
            return 1;
        }
    }
    return 0;
}

#endif
