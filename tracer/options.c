/*
 * tracer/options.c: the MMLEAK_* settings, one table (MMLEAK_OPTIONS in facts.h: name,
 * variable, type, default, range, help), read once per trace: from the environment at the
 * start (secure_getenv, so a setuid program ignores them), or from mmleak_attach's argument
 * (lines "MMLEAK_DIR=/var/tmp/leaks", the same names; a setting it does not give takes its
 * default).  An invalid value is ignored with a message and the default used; MMLEAK_DIR is
 * made absolute at once (the program may chdir later), and a directory that cannot be used
 * as given disables tracing.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

struct mml_cfg cfg;

enum { T_path, T_depth, T_int, T_bool };
enum {
#define X(name, env, type, def, min, max, help) OPT_##name,
    MMLEAK_OPTIONS(X)
#undef X
    OPT_COUNT
};
/* A default is a string for path, a number otherwise (depth's "auto" is 0). */
#define DEFAULT_path(d) 0, d
#define DEFAULT_depth(d) d, NULL
#define DEFAULT_int(d) d, NULL
#define DEFAULT_bool(d) d, NULL
static const struct option {
    const char *env;
    int type;
    long def;
    const char *def_path;
    long min, max;
} options[] = {
#define X(name, env, type, def, min, max, help) { env, T_##type, DEFAULT_##type(def), min, max },
    MMLEAK_OPTIONS(X)
#undef X
};
#define X(name, env, type, def, min, max, help)                                               \
    _Static_assert(OPT_##name != OPT_DEPTH || (max) == MMLEAK_MAX_DEPTH,                  \
                   "the depth's maximum is not MMLEAK_MAX_DEPTH");
MMLEAK_OPTIONS(X)
#undef X

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

/* A number in the option's range, else its default (said, when it was given). */
static long number(const struct option *o)
{
    const char *s = cfg_get(o->env);
    if (!s || !*s)
        return o->def;
    if (o->type == T_depth && !strcmp(s, "auto"))
        return 0;
    char *e;
    long v = strtol(s, &e, 10);
    if (*e || v < o->min || v > o->max) {
        say("ignoring invalid ", o->env, "");
        return o->def;
    }
    return v;
}

/* MMLEAK_DIR into cfg.dir, absolute: 0, or -1 when it cannot be used as given (said why). */
static int directory(const struct option *o)
{
    const char *dir = cfg_get(o->env);
    if (!dir || !*dir)
        dir = o->def_path;
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

static int read_settings(void)
{
    long v[OPT_COUNT];
    /* MMLEAK_QUIET first: it says whether the others' messages are written */
    cfg.quiet = (int)(v[OPT_QUIET] = number(&options[OPT_QUIET]));
    int bad = 0;
    for (int i = 0; i < OPT_COUNT; i++) {
        if (options[i].type == T_path)
            bad |= directory(&options[i]);
        else if (i != OPT_QUIET)
            v[i] = number(&options[i]);
    }
    cfg.depth = (int)v[OPT_DEPTH];
    cfg.rotate = (size_t)v[OPT_ROTATE_MB] << 20;
    cfg.buffer = (size_t)v[OPT_BUFFER_KB] << 10;
    cfg.hold = (size_t)v[OPT_HOLD_MB] << 20;
    cfg.paused = (int)v[OPT_PAUSED];
    cfg.scan = (int)v[OPT_SCAN];
    cfg.scan_here = (int)v[OPT_SCAN_HERE];
    return bad;
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
