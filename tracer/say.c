/*
 * tracer/say.c: the tracer's messages on stderr, and the text helpers every cold path uses.
 *
 * One line each, "mmleak: ...", written with write(2) only while descriptor 2 is still the
 * file it was when the trace started (a daemon may have put its own file at that number), and
 * never under MMLEAK_QUIET=1.  No stdio and no allocation here: these run inside the traced
 * program's allocation calls, and strerror or snprintf may allocate or take locks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

size_t my_strlen(const char *s) { size_t n = 0; while (s[n]) n++; return n; }

/* Append src to d without passing end; returns the new end (always NUL terminated). */
char *cat(char *d, char *end, const char *src)
{
    while (*src && d + 1 < end)
        *d++ = *src++;
    *d = 0;
    return d;
}

char *cat_u(char *d, char *end, unsigned long v)
{
    char b[24];
    int i = 23;
    b[i] = 0;
    do { b[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    return cat(d, end, b + i);
}


/* Why a write failed, for the one message we print (strerror may allocate). */
const char *why(int err)
{
    switch (err) {
    case E_NOT_OURS: return "what stands at the name of a file of mmleak's is not that file "
                            "(a FIFO, a device, another user's file or a link: planted?)";
    case EEXIST: return "the name is taken by a file mmleak did not make";
    case ELOOP: return "a symbolic link stands at the name of a file of mmleak's";
    case ENXIO: return "a FIFO or a device stands at the name of a file of mmleak's";
    case EISDIR: return "a directory stands at the name of a file of mmleak's";
    case ENAMETOOLONG: return "the file name is too long";
    case ENOSPC: case EDQUOT: return "disk full";
    case EACCES: case EPERM: return "permission denied (did the program change its user, "
                                    "or the directory's permissions?)";
    case ENOENT: return "the file or its directory was removed";
    case ENOTDIR: return "not a directory";
    case EMFILE: case ENFILE: return "no file descriptor left (RLIMIT_NOFILE)";
    case EFBIG: return "the file size limit (RLIMIT_FSIZE) is reached";
    case EBADF: return "the program closed the directory descriptor mmleak keeps after chroot()";
    case EROFS: return "read-only file system";
    case EIO: return "I/O error";
    case ENOMEM: return "out of memory";
    default: return "error";
    }
}

/* Descriptor 2 when the trace started.  A daemon may close it and open a file of its own,
 * which then gets that number: a message written there would go into the daemon's data.
 * So we write only while descriptor 2 is still the file it was. */
static int g_err_ok;
static dev_t g_err_dev;
static ino_t g_err_ino;

void note_stderr(void)
{
    struct stat st;
    g_err_ok = fstat(2, &st) == 0;
    g_err_dev = g_err_ok ? st.st_dev : 0;
    g_err_ino = g_err_ok ? st.st_ino : 0;
}

void say4(const char *a, const char *b, const char *c, const char *f)
{
    struct stat st;
    if (cfg.quiet || !g_err_ok || fstat(2, &st) || st.st_dev != g_err_dev ||
        st.st_ino != g_err_ino)
        return;
    char msg[2 * PATH_MAX + 512], *e = msg + sizeof msg, *d = msg;
    d = cat(d, e, "mmleak: ");
    d = cat(d, e, a);
    d = cat(d, e, b ? b : "");
    d = cat(d, e, c ? c : "");
    d = cat(d, e, f ? f : "");
    d = cat(d, e, "\n");
    ssize_t r = write(2, msg, (size_t)(d - msg));
    (void)r;
}

void say(const char *a, const char *b, const char *c) { say4(a, b, c, NULL); }

/* "WHAT DIR: REASON (errno N)TAIL"; REASON is why(ERR) unless given */
void say_why(const char *what, const char *reason, int err, const char *tail)
{
    char r[512], *e = r + sizeof r, *d = r;
    d = cat(d, e, ": ");
    d = cat(d, e, reason ? reason : why(err));
    if (err != E_NOT_OURS) {
        d = cat(d, e, " (errno ");
        d = cat_u(d, e, (unsigned long)err);
        d = cat(d, e, ")");
    }
    cat(d, e, tail);
    say(what, cfg.dir, r);
}

void say_err(const char *what, int err, const char *tail)
{
    say_why(what, NULL, err, tail);
}


uint64_t parse_hex(const char *s, const char **end)
{
    uint64_t v = 0;
    for (;; s++) {
        unsigned c = (unsigned char)*s;
        if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
        else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
        else break;
    }
    *end = s;
    return v;
}


void escape_into(char *d, char *e, const unsigned char *raw, size_t n, int nul_space)
{
    static const char hx[] = "0123456789abcdef";
    e -= 5;
    for (size_t i = 0; i < n && d < e; i++) {
        unsigned char ch = raw[i];
        if (ch == 0 && nul_space) {
            if (i + 1 < n)
                *d++ = ' ';
        } else if (ch < 0x20 || ch >= 0x7f || ch == '\\') {
            *d++ = '\\'; *d++ = 'x'; *d++ = hx[ch >> 4]; *d++ = hx[ch & 15];
        } else {
            *d++ = (char)ch;
        }
    }
    *d = 0;
}

