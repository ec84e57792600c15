/*
 * tracer/attach.c: tracing a running process, and pausing a preloaded one.
 *
 * mmleak.py attach PID loads mmleak.so into the process (tools/inject.c, through ptrace) and
 * calls mmleak_attach; mmleak.py detach calls mmleak_detach.  Both switch the GOT slots of
 * every module (got.c): towards mmleak's functions, or back to the allocator's.  A preloaded
 * process is paused and resumed the same way (its slots then point past mmleak, so a paused
 * process pays nothing), and MMLEAK_PAUSED=1 starts it paused.  A detach closes every
 * thread's file from outside (the threads may be anywhere), and each attach is a new trace.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "record.h"

/* dlopen, when loaded into a running process: the objects it loads get their slots at once.
 * glibc takes the caller's search path (its RUNPATH) from the return address, so a call from
 * an object that has one is passed on by a jump, keeping its return address; those objects
 * are switched at the next flush (maps_snapshot). */
__asm__(".text\n"
        ".p2align 4\n"
        ".globl own_dlopen\n"
        ".hidden own_dlopen\n"
        ".type own_dlopen,@function\n"
        "own_dlopen:\n"
        "    endbr64\n"
        "    push %rdi\n"
        "    push %rsi\n"
        "    sub $8, %rsp\n"
        "    mov 24(%rsp), %rdi\n"          /* the caller's return address */
        "    mov 16(%rsp), %rsi\n"          /* file */
        "    call mml_dlopen_keep_caller\n"
        "    add $8, %rsp\n"
        "    pop %rsi\n"
        "    pop %rdi\n"
        "    test %eax, %eax\n"
        "    jnz 1f\n"
        "    jmp mml_dlopen_here\n"
        "1:  jmp *mml_next_dlopen(%rip)\n"
        ".size own_dlopen, .-own_dlopen\n");

int mml_dlopen_keep_caller(const void *ra, const char *file)
{
    if (!file || strchr(file, '/'))
        return 0;               /* a path, or the program itself: the caller does not matter */
    struct dl_find_object fo;
    if (_dl_find_object((void *)ra, &fo) != 0 || !fo.dlfo_link_map)
        return 1;
    for (const ElfW(Dyn) *d = fo.dlfo_link_map->l_ld; d && d->d_tag != DT_NULL; d++)
        if (d->d_tag == DT_RPATH || d->d_tag == DT_RUNPATH)
            return 1;
    return 0;
}

void *mml_dlopen_here(const char *file, int mode)
{
    void *h = mml_next_dlopen(file, mode);
    if (h && g_state == 1 && !IN_OWN_CODE(&T)) {
        GUARDED;
        mml_got_new_objects();
    }
    return h;
}

/* ---- closing a thread's file from another thread (detach) ----
 * The owner may be anywhere (its GOT slots no longer lead here): what its staging mapping
 * holds beyond .out is appended, complete lines only, as readers would (mmleaklib/files.py's
 * unflushed_tail), then "#end"; the mapping is replaced by anonymous memory, so a write the
 * owner was in the middle of lands harmlessly, and unmapped one cycle later. */
static struct { void *p; size_t len; unsigned cycle; } g_retired[256];
static unsigned g_nretired, g_cycle;

static void retire(void *p, size_t len)
{
    mmap(p, len, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g_nretired < sizeof g_retired / sizeof g_retired[0])
        g_retired[g_nretired++] = (typeof(g_retired[0])){ p, len, g_cycle };
}

static void unmap_retired(void)
{
    unsigned k = 0;
    for (unsigned i = 0; i < g_nretired; i++) {
        if (g_retired[i].cycle + 2 <= g_cycle)
            mml_unmap(g_retired[i].p, g_retired[i].len);
        else
            g_retired[k++] = g_retired[i];
    }
    g_nretired = k;
}

static void close_from_outside(const struct file_slot *s)
{
    char name[64];
    int fd = open_again(dump_name(name, sizeof name, s->fileno), O_RDWR, &s->out_id);
    if (fd >= 0) {
        struct stat st;
        uint64_t have = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
        int kept = 0;
        struct { uint64_t off; const char *body; size_t n; } h[2];
        for (int i = 0; i < 2; i++) {
            const char *b = s->stage + (size_t)i * s->half_size;
            const char *e;
            h[i].off = memcmp(b, "#at ", 4) == 0 ? parse_hex(b + 4, &e) : UINT64_MAX;
            h[i].body = b + HALF_HDR;
            const char *nul = memchr(h[i].body, 0, s->half_size - HALF_HDR);
            size_t n = nul ? (size_t)(nul - h[i].body) : s->half_size - HALF_HDR;
            while (n && h[i].body[n - 1] != '\n')
                n--;                    /* a line being written: not kept */
            h[i].n = n;
        }
        for (int k = 0; k < 2; k++) {
            int i = (h[0].off <= h[1].off) ? k : 1 - k;
            if (h[i].off == UINT64_MAX || h[i].off + h[i].n <= have)
                continue;
            uint64_t skip = have > h[i].off ? have - h[i].off : 0;
            if (have + h[i].n - skip <= fsize_limit() &&     /* else SIGXFSZ: keep the .tail */
                pwrite(fd, h[i].body + skip, h[i].n - skip, (off_t)have) ==
                (ssize_t)(h[i].n - skip))
                have = h[i].off + h[i].n;
            else
                kept = 1;       /* readers take those lines from the .tail */
        }
        if (!kept && have + 5 <= fsize_limit() && pwrite(fd, "#end\n", 5, (off_t)have) == 5) {
            d_unlink(side_name(name, sizeof name, s->fileno, ".tail"));
        }
        close(fd);
    }
    retire(s->stage, 2 * s->half_size);
}

static int lock_briefly(void)
{
    /* the thread mmleak.py borrowed may have been stopped inside mmleak's own cold path,
     * holding the lock: never wait for ourselves */
    for (int i = 0; i < 200; i++) {
        if (pthread_mutex_trylock(&g_lock) == 0)
            return 0;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* Start tracing (a new trace, new files).  ARGS: "MMLEAK_DIR=...\nMMLEAK_DEPTH=...\n".
 * 0: started; 1: already tracing; 2: tracing cannot start (said why on stderr and in the
 * returned status); 3: busy, try again. */
EXPORT int mmleak_attach(const char *args)
{
    if (g_state == 1)
        return 1;
    struct tstate *t = &T;
    if (IN_OWN_CODE(t))
        return 3;
    GUARDED;
    if (!real.malloc)
        resolve();
    if (lock_briefly())
        return 3;
    int first = g_state == -1 && !g_attached && !g_key_ok;   /* loaded by dlopen, dormant */
    if (first) {
        g_attached = 1;
        resolve_from(RTLD_DEFAULT);
        /* functions the allocator lacks are made from its own (see resolve_from) */
        void *m = mml_find_definition("malloc");
        if (m)
            real.malloc = m;
        void *f = mml_find_definition("free");
        if (f)
            real.free = f;
        void *r = mml_find_definition("realloc");
        if (r)
            real.realloc = r;
        real.dlclose = mml_find_definition("dlclose");
    }
    note_stderr();              /* the process's stderr now: its journal, say */
    int bad = read_config(args);
    if (bad) {
        pthread_mutex_unlock(&g_lock);
        return 2;
    }
    if (first) {
        read_cmdline();
        tracer_setup(NULL);
    }
    g_trace_gen++;
    g_cycle++;
    unmap_retired();
    R.n = 0;
    g_late_file = ~0u;
    g_sink = 0;
    atomic_store(&g_nofile, 0);
    atomic_store(&g_nofile_err, 0);
    atomic_store(&g_said_write, 0);
    g_window = 1;
    process_start(NULL);        /* a new trace id: pid, or pid-K after an earlier one */
    if (g_state != 1) {
        pthread_mutex_unlock(&g_lock);
        return 2;
    }
    atomic_fetch_add(&g_epoch, 1);  /* every thread's next event resets its stale state */
    arm_hot();
    pthread_mutex_unlock(&g_lock);
    mml_got_switch(1);
    unsigned long long c[2] = { 0, 0 };
    mml_each_object(phdr_counts, c);
    g_got_adds = c[0];
    return 0;
}

/* Stop tracing: the slots back to the allocator, every file flushed and closed.  0: done;
 * 1: not tracing; 3: busy, try again; 4: paused, but a thread stayed in mmleak's slow path
 * for a second: its files were left as they are (readers and `mmleak.py recover` take
 * them). */
EXPORT int mmleak_detach(const char *args)
{
    (void)args;
    if (g_state != 1)
        return 1;
    struct tstate *t = &T;
    if (IN_OWN_CODE(t))
        return 3;
    GUARDED;
    mml_got_switch(0);
    /* calls already inside mmleak finish now; later ones (through a pointer stored while
     * tracing) see the pause and only pass through */
    g_state = 2;
    set_status();
    atomic_fetch_add(&g_epoch, 1);
    H->epoch = atomic_load(&g_epoch);
    H->fast = 0;
    /* a thread inside a slow path finishes it (and sees the pause at its next event) */
    for (int i = 0; atomic_load(&g_inflight) > 0; i++) {
        if (i == 2000)
            return 4;   /* paused; the files stay as they are, readers take them */
        struct timespec ts = { 0, 500000 };
        nanosleep(&ts, NULL);
    }
    maps_snapshot(0);
    if (lock_briefly())
        return 3;       /* paused already; the files stay as they are (readers take them) */
    g_cycle++;
    sink_catch_up_locked();     /* the lines of threads without a file (see threadfile.c) */
    for (size_t i = 0; i < R.n; i++) {
        struct file_slot *s = &R.a[i];
        if (s->state == SLOT_PARKED) {
            struct tstate tmp;
            memset(&tmp, 0, sizeof tmp);
            tmp.slot = (int)i + 1;
            tmp.fileno = s->fileno;
            tmp.out_id = s->out_id;
            tmp.tail_id = s->tail_id;
            tmp.stage = s->stage;
            tmp.half_size = s->half_size;
            tmp.out_off = s->out_off;
            half_start(&tmp, 0);
            tmp.open = 1;
            s->state = SLOT_OPEN;
            pthread_mutex_unlock(&g_lock);
            file_close(&tmp, 1);
            if (lock_briefly())
                return 3;
        } else if (s->state == SLOT_OPEN && s->stage) {
            close_from_outside(s);
            s->state = SLOT_FREE;
        } else if (s->state == SLOT_ANON) {
            s->state = SLOT_FREE;   /* its lines were written, if they could be, above */
        }
    }
    R.n = 0;
    g_trace_gen++;              /* every thread forgets its file at its next event */
    thread_reset(t);
    set_status();
    pthread_mutex_unlock(&g_lock);
    loads_drop_unused();
    return 0;
}

/* What mmleak.py and mmleak-install.py status show: "tracing ID", "paused", "dormant". */
EXPORT const char *mmleak_state(void)
{
    static char out[64];
    char *e = out + sizeof out, *d = out;
    if (g_state == 1) {
        d = cat(d, e, "tracing ");
        cat(d, e, g_id);
    } else {
        cat(d, e, g_state == 2 ? "paused" : g_state == 0 ? "starting" : "dormant");
    }
    return out;
}

