/* tools/seccomp.c: does the target's seccomp filter allow what dlopen and mmleak do. */
#include "inject.h"
#include "../tracer/seccompfilter.h"

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
