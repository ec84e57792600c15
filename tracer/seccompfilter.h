/*
 * tracer/seccompfilter.h: would a seccomp filter let dlopen and mmleak make their system
 * calls?  SC_NEEDED lists them (with the arguments they use: seen with strace), sc_run runs
 * a filter's classic BPF on one of them.  The injector checks the target's filters before an
 * attach (tools/seccomp.c); the tracer checks a filter the traced process installs on
 * itself, before it goes in (mmleak.c, before_seccomp).  In a header, inline, because the
 * two are different artefacts (mmleak.so, mmleak-tools.so).
 */
#ifndef MMLEAK_SECCOMPFILTER_H
#define MMLEAK_SECCOMPFILTER_H

#if defined(__x86_64__) && defined(__linux__)
#define MMLEAK_SC_CHECK 1

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>

#define SC_AUDIT_ARCH 0xc000003eu   /* AUDIT_ARCH_X86_64: the only architecture built */

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
    { SYS_sigaltstack, "sigaltstack", { 0, 0, 0, 0, 0, 0 } },
    { SYS_getrandom, "getrandom", { 0, 8, 1 /* GRND_NONBLOCK */, 0, 0, 0 } },
    { SYS_getpid, "getpid", { 0 } },
    { SYS_gettid, "gettid", { 0 } },
    { SYS_geteuid, "geteuid", { 0 } },
    { SYS_clock_nanosleep, "clock_nanosleep", { CLOCK_REALTIME, 0, 0, 0, 0, 0 } },
    { SYS_process_vm_readv, "process_vm_readv", { 0, 0, 1, 0, 2, 0 } },
};

/* The classic BPF of a seccomp filter, run on one call (the kernel checked the program when
 * it was installed: jumps go forward, loads stay inside seccomp_data). */
static inline uint32_t sc_run(const struct sock_filter *f, size_t n, const struct seccomp_data *d)
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

/* The action of filter F (N instructions) on each call of SC_NEEDED, from the instruction
 * pointer IP: the first that is neither allowed nor only logged, its index; -1 if none. */
static inline int sc_refused(const struct sock_filter *f, size_t n, uint64_t ip, uint32_t *act)
{
    for (size_t j = 0; j < sizeof SC_NEEDED / sizeof SC_NEEDED[0]; j++) {
        struct seccomp_data sd;
        memset(&sd, 0, sizeof sd);
        sd.nr = SC_NEEDED[j].nr;
        sd.arch = SC_AUDIT_ARCH;
        sd.instruction_pointer = ip;
        memcpy(sd.args, SC_NEEDED[j].a, sizeof sd.args);
        uint32_t r = sc_run(f, n, &sd);
        uint32_t a = r & SECCOMP_RET_ACTION_FULL;
        if (a != SECCOMP_RET_ALLOW && a != SECCOMP_RET_LOG) {
            *act = r;
            return (int)j;
        }
    }
    return -1;
}

#endif /* x86_64 */
#endif
