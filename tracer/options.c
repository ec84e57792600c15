/*
 * tracer/options.c: the MMLEAK_* settings, read once per trace: from the environment at the
 * start (secure_getenv, so a setuid program ignores them), or from mmleak_attach's argument.
 * An invalid value is ignored with a message; MMLEAK_DIR is made absolute at once (the program
 * may chdir later).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

struct mml_cfg cfg;

/* Settings come from the environment, or, for mmleak_attach, from its argument: lines
 * "MMLEAK_DIR=/var/tmp/leaks" with the same names. */
static char g_args[PATH_MAX + 512];
static int g_from_args;

static const char *cfg_get(const char *name)
{
    if (!g_from_args)
        return secure_getenv(name);
    size_t n = my_strlen(name);
    for (const char *l = g_args; *l;) {
        const char *e = l;
        while (*e && *e != '\n')
            e++;
        if ((size_t)(e - l) > n && !memcmp(l, name, n) && l[n] == '=') {
            static char val[PATH_MAX + 64];
            size_t k = (size_t)(e - l) - n - 1;
            if (k >= sizeof val)
                k = sizeof val - 1;
            memcpy(val, l + n + 1, k);
            val[k] = 0;
            return val;
        }
        l = *e ? e + 1 : e;
    }
    return NULL;
}

long env_num(const char *name, long def, long lo, long hi)
{
    const char *s = cfg_get(name);
    if (!s || !*s)
        return def;
    char *e;
    long v = strtol(s, &e, 10);
    if (*e || v < lo || v > hi) {
        say("ignoring invalid ", name, "");
        return def;
    }
    return v;
}

static int read_settings(void)
{
    cfg.quiet = (int)env_num("MMLEAK_QUIET", 0, 0, 1);
    const char *dp = cfg_get("MMLEAK_DEPTH");
    cfg.depth = !dp || !*dp || !strcmp(dp, "auto") ? 0
                                                     : (int)env_num("MMLEAK_DEPTH", 0, 1, MMLEAK_MAX_DEPTH);
    cfg.rotate = (size_t)env_num("MMLEAK_ROTATE_MB", 256, 1, 1 << 20) << 20;
    cfg.buffer = (size_t)env_num("MMLEAK_BUFFER_KB", 1024, 16, 1 << 20) << 10;
    cfg.hold = (size_t)env_num("MMLEAK_HOLD_MB", 64, 0, 1 << 20) << 20;
    const char *dir = cfg_get("MMLEAK_DIR");
    if (!dir || !*dir)
        dir = "/tmp";
    static char dir_copy[PATH_MAX];     /* cfg_get's buffer is reused by the next call */
    size_t dn = my_strlen(dir);
    if (dn >= sizeof dir_copy) {
        cfg.dir[0] = 0;
        say("MMLEAK_DIR is too long: tracing disabled (at most ", "4000 bytes", ")");
        return -1;
    }
    memcpy(dir_copy, dir, dn + 1);
    dir = dir_copy;
    size_t have = 0, n = my_strlen(dir);
    if (dir[0] != '/') { /* the program may chdir later: pin the directory now */
        if (!getcwd(cfg.dir, sizeof cfg.dir) || cfg.dir[0] != '/') {
            cfg.dir[0] = 0;
            say("MMLEAK_DIR=", dir, " is relative and the current directory cannot be "
                "resolved: tracing disabled (give an absolute MMLEAK_DIR)");
            return -1;
        }
        have = my_strlen(cfg.dir);
        if (cfg.dir[have - 1] != '/' && have + 1 < sizeof cfg.dir)
            cfg.dir[have++] = '/';
    }
    /* room is left for "/mmleak.ID.N.tail" after it: names are never cut short */
    if (have + n >= sizeof cfg.dir) {
        cfg.dir[0] = 0;
        say("MMLEAK_DIR is too long: tracing disabled (at most ", "4000 bytes", ")");
        return -1;
    }
    memcpy(cfg.dir + have, dir, n + 1);
    have += n;
    while (have > 1 && cfg.dir[have - 1] == '/')
        cfg.dir[--have] = 0;
    return 0;
}


int read_config(const char *args)
{
    if (args) {
        size_t n = my_strlen(args);
        if (n >= sizeof g_args)
            n = sizeof g_args - 1;
        memcpy(g_args, args, n);
        g_args[n] = 0;
        g_from_args = 1;
    }
    int rc = read_settings();
    g_from_args = 0;
    return rc;
}
