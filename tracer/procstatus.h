/*
 * tracer/procstatus.h: is a process under a seccomp filter?  Read from the "Seccomp:" field
 * of its /proc/PID/status.  The tracer asks it of itself before it starts the scanner at exit
 * (tracer/exitscan.c), the scanner of a process before it injects a fork (tools/scan_stop.c).
 * Its other fields too: a thread's state, its signal masks (tracer/park.c), capabilities.
 * Inline, because the two are different artefacts (mmleak.so, mmleak-scan).
 */
#ifndef MMLEAK_PROCSTATUS_H
#define MMLEAK_PROCSTATUS_H

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

/* The value of the status field NAME ("\nSeccomp:", with its newline and colon) in BUF, the
 * blanks after the colon skipped; NULL when BUF has no such field. */
static inline const char *mml_status_field(const char *buf, const char *name)
{
    const char *p = strstr(buf, name);
    if (!p)
        return NULL;
    p += strlen(name);
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

/* The hexadecimal value of the status field NAME (a mask: "\nSigBlk:", "\nCapEff:"), 0
 * when BUF has none. */
static inline unsigned long long mml_status_hex(const char *buf, const char *name)
{
    const char *p = mml_status_field(buf, name);
    unsigned long long v = 0;
    for (; p; p++) {
        int c = *p;
        int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (x < 0)
            break;
        v = v << 4 | (unsigned long long)x;
    }
    return v;
}

/* 1 under a filter, or when PATH cannot be read (assume the worst); 0 with none.  BUF, CAP:
 * scratch space for the file. */
static inline int mml_status_seccomp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = 0;
    const char *p = mml_status_field(buf, "\nSeccomp:");
    return p && *p != '0';
}

#endif
