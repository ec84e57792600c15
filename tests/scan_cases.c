/* scan_cases.c: one root or fate per run (argv[1]), each planting blocks of TARGET bytes,
 * allocated by target() only, whose reachability kinds are known exactly (test_scan.py
 * checks them against mmleak's scan at exit and against valgrind memcheck).  Every case
 * plants in a function of its own, then wipes the stack below main's frame, so that no
 * stale copy of a pointer is left where a scan reads. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define TARGET 4321

__attribute__((noinline)) void *target(void)
{
    void *p = malloc(TARGET);
    memset(p, 0, TARGET);
    return p;
}

__attribute__((noinline)) static void wipe(void)
{
    volatile char junk[64 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

void *g_slot;
void *g_many[50000];
uintptr_t g_hidden;
struct node { struct node *next; char pad[TARGET - sizeof(void *)]; };

static void *lib(void)
{
    const char *self = getenv("SCAN_LIB");
    void *h = dlopen(self, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
    return h;
}

static int ready[2];

static void *stack_thread(void *arg)
{
    (void)arg;
    void *volatile local = target();
    (void)!write(ready[1], "x", 1);
    for (;;)
        pause();
    return local;
}

static void *register_thread(void *arg)
{
    (void)arg;
    register uintptr_t r asm("r12") = (uintptr_t)target() ^ 1;
    wipe();
    r ^= 1;
    (void)!write(ready[1], "x", 1);
    for (;;)
        __asm__ volatile("pause" : "+r"(r));
    return NULL;
}

/* stale-rbp: rbp, a general register where the frame pointer is omitted, holds P while
 * malloc is called (from 32 stack depths: as many starts of mmleak.so's stack walks, whose
 * recent walks keep a copy of each start's registers and stack words); then P is dropped.
 * Only mmleak.so's own memory still holds it: the block is lost (valgrind agrees). */
#if defined(__x86_64__)
__attribute__((noinline, optimize("omit-frame-pointer"))) static void *malloc_rbp(void *p,
                                                                                 size_t n)
{
    register void *r asm("rbp") = p;
    __asm__ volatile("" : "+r"(r));
    void *q = malloc(n);
    __asm__ volatile("" : "+r"(r));
    return q;
}
#endif

/* joined-arg: a thread given a block as its argument, which it drops, then joined: glibc
 * keeps its stack (and descriptor, which still holds the argument) in its cache, to reuse;
 * the block is lost.  unjoined-result: a thread that returns a block and is never joined:
 * its descriptor keeps the result for pthread_join, the block is still reachable. */
static void *drop_arg(void *arg)
{
    (void)arg;
    return NULL;
}

static void *give_result(void *arg)
{
    (void)arg;
    void *p = target();
    (void)!write(ready[1], "x", 1);
    return p;
}

/* freed-arena: a thread keeps the block's address in a block of its own arena, frees it and
 * is joined: the arena holds no live block, only that stale word in its free memory */
static void *hold_and_free(void *arg)
{
    void **holder = malloc(200);
    holder[5] = arg;
    __asm__ volatile("" ::"r"(holder) : "memory");
    free(holder);
    return NULL;
}

__attribute__((noinline)) static void calls_with_rbp(void *p, int depth)
{
    volatile char frame[48];
    frame[0] = (char)depth;
#if defined(__x86_64__)
    free(malloc_rbp(p, 16 + (size_t)depth));
#endif
    if (depth)
        calls_with_rbp(p, depth - 1);
    __asm__ volatile("" ::"r"(frame) : "memory");
}

/* pool-beside-chunk: a pool (an anonymous mapping of the program's, as Python's obmalloc
 * arenas are) mapped right after a block glibc's malloc gave its own mmap: the kernel merges
 * the two into one mapping, which then holds a live block; the pool is a root all the same
 * (valgrind agrees).  Exit status 3 if glibc's chunk is an mmap'ed one but the two did not
 * merge: the case would not test what it says.  (Under valgrind, whose malloc is its own,
 * the pool goes where the kernel puts it.) */
static void *g_big[8];

static void pool_beside_chunk(void)
{
    char *pool = MAP_FAILED;
    int mmapped = 0;
    uintptr_t chunk = 0, end = 0;
    /* mmleak.so maps its files and tables at its first events, as likely as not right beside
     * the chunk: a few tries, each block kept (still reachable, and not TARGET's) */
    for (int t = 0; t < 8 && pool == MAP_FAILED; t++) {
        g_big[t] = malloc(256 * 1024);          /* over glibc's mmap threshold */
        size_t head = ((size_t *)g_big[t])[-1];
        chunk = (uintptr_t)g_big[t] - 16;
        end = chunk + (head & ~(size_t)7);
        mmapped = (head & 2) && !(chunk & 4095);        /* IS_MMAPPED */
        /* below the chunk (the kernel maps top-down), else above it */
        for (int k = 0; k < 2 && pool == MAP_FAILED; k++)
            pool = mmap(!mmapped ? NULL : k ? (void *)end : (void *)(chunk - (1 << 20)),
                        1 << 20, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | (mmapped ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    }
    if (pool == MAP_FAILED)
        exit(3);
    if (mmapped) {
        uintptr_t lo_want = chunk < (uintptr_t)pool ? chunk : (uintptr_t)pool;
        uintptr_t hi_want = end > (uintptr_t)pool + (1 << 20) ? end : (uintptr_t)pool + (1 << 20);
        FILE *f = fopen("/proc/self/maps", "r");
        unsigned long lo, hi;
        int merged = 0;
        while (f && fscanf(f, "%lx-%lx%*[^\n]", &lo, &hi) == 2)
            merged |= lo <= lo_want && hi >= hi_want;
        if (f)
            fclose(f);
        if (!merged)
            exit(3);
    }
    void **obj = (void **)(pool + 300000);
    obj[3] = target();
}

/* altstack-exit: the block is held by a frame of the main thread's stack only, and the
 * program exits from a signal handler that runs on its alternate signal stack (a mapping
 * of its own): the main thread's stack pointer is there, not in [stack], whose frames are
 * still live (valgrind: still reachable) */
static void exit_on_signal(int sig)
{
    (void)sig;
    exit(0);
}

__attribute__((noinline)) static void altstack_exit(void)
{
    void *volatile held = target();
    stack_t ss = { .ss_size = 1 << 16 };
    ss.ss_sp = mmap(NULL, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct sigaction sa = { .sa_handler = exit_on_signal, .sa_flags = SA_ONSTACK };
    if (ss.ss_sp == MAP_FAILED || sigaltstack(&ss, NULL) || sigaction(SIGTERM, &sa, NULL))
        exit(2);
    raise(SIGTERM);
    exit(held ? 2 : 3);                 /* not reached */
}

/* main-exited: the block is held by a frame of the main thread's stack only, and the main
 * thread ends (pthread_exit): a zombie, which ptrace refuses, while another thread calls
 * exit() once /proc says so.  The stack of a thread that ended is no root: lost (valgrind
 * agrees); before, the scan reached no verdict ("cannot trace thread"). */
static void *exit_after_main(void *arg)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)getpid());
    for (int tries = 0; tries < 10000; tries++) {       /* 10 s at most */
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        char *st = strstr(buf, "\nState:");
        if (st && strchr("ZX", st[8 + strspn(st + 8, " \t")]))
            exit(0);
        usleep(1000);
    }
    (void)arg;
    exit(3);                            /* main never ended: the case did not happen */
}

__attribute__((noinline)) static void main_exited(void)
{
    void *volatile held = target();
    pthread_t t;
    if (pthread_create(&t, NULL, exit_after_main, NULL))
        exit(2);
    __asm__ volatile("" ::"r"(held) : "memory");
    pthread_exit(NULL);
}

__attribute__((noinline)) static void plant(const char *c)
{
    if (!strcmp(c, "global")) {
        g_slot = target();
    } else if (!strcmp(c, "static")) {
        static void *kept;
        kept = target();
        __asm__ volatile("" ::"m"(kept));
    } else if (!strcmp(c, "dlbss")) {
        void (*set)(void *) = (void (*)(void *))dlsym(lib(), "lib_set");
        set(target());
    } else if (!strcmp(c, "tls")) {
        static __thread void *tls_slot;
        tls_slot = target();
        __asm__ volatile("" ::"m"(tls_slot));
    } else if (!strcmp(c, "dltls")) {
        void (*set)(void *) = (void (*)(void *))dlsym(lib(), "lib_set_tls");
        set(target());
    } else if (!strcmp(c, "thread-stack") || !strcmp(c, "thread-register")) {
        pthread_t t;
        char x;
        if (pipe(ready) || pthread_create(&t, NULL, c[7] == 's' ? stack_thread : register_thread,
                                          NULL))
            exit(2);
        (void)!read(ready[0], &x, 1);
    } else if (!strcmp(c, "mmap")) {
        void **m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        m[0] = target();
    } else if (!strcmp(c, "pool")) {
        char *pool = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
        void **obj = (void **)(pool + 300000);
        obj[3] = target();
    } else if (!strcmp(c, "shared-anon")) {
        /* shared anonymous memory (a server's shared segment, PostgreSQL's): /proc/PID/maps
         * names it "/dev/zero (deleted)" */
        void **m = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        m[100] = target();
    } else if (!strcmp(c, "pool-beside-chunk")) {
        pool_beside_chunk();
    } else if (!strcmp(c, "chain")) {
        struct node *a = target(), *b = target(), *d = target();
        a->next = b;
        b->next = d;
        g_slot = a;
    } else if (!strcmp(c, "cycle")) {
        struct node *a = target(), *b = target();
        a->next = b;
        b->next = a;
    } else if (!strcmp(c, "lost-chain")) {
        struct node *a = target(), *b = target();
        a->next = b;
    } else if (!strcmp(c, "last-word")) {
        /* a pointer to the block's last 8 bytes (a list node at the end of a struct:
         * PostgreSQL's RegisteredBgWorker), where glibc's header of the next chunk lies when
         * the size leaves none spare (4321 bytes: a chunk of 4336, the next header at 4320) */
        g_slot = (char *)target() + 4320;
    } else if (!strcmp(c, "interior")) {
        g_slot = (char *)target() + 16;
    } else if (!strcmp(c, "interior-many")) {
        /* one block held only by 50,000 interior pointers (none at 8 or 24, where memcheck's
         * heuristics look): each of them meets the heuristics; what they read of the block
         * is read once (tools/scan_mark.c, heuristic), not once per pointer */
        char *p = target();
        for (size_t k = 0; k < sizeof g_many / sizeof *g_many; k++)
            g_many[k] = p + 32 + 8 * (k % 500);
    } else if (!strcmp(c, "xor")) {
        g_hidden = (uintptr_t)target() ^ (uintptr_t)0xa5a5a5a5a5a5a5a5ull;
    } else if (!strcmp(c, "freed")) {
        void **holder = malloc(3000);
        holder[5] = target();
        free(holder);
    } else if (!strcmp(c, "tcache-stale")) {
        /* the block's address left in a freed block that glibc's per-thread cache (tcache)
         * hands out again to a block kept, which never writes it: MALLOC_PERTURB_ overwrites
         * neither a block freed into tcache nor one taken from it (gdb's 30 strings,
         * docs/scan.rst); with glibc.malloc.tcache_count=0 it overwrites both */
        void **holder = malloc(200);
        holder[5] = target();
        __asm__ volatile("" ::"r"(holder) : "memory");
        free(holder);
        g_slot = malloc(200);
    } else if (!strcmp(c, "lost")) {
        target();
    } else if (!strcmp(c, "staged-many")) {
        /* 200 blocks kept, one lost: at the exit their lines, about 10 KB, are still in the
         * thread's staging file only (its first half: 32 KiB), which the scan reads */
        static void *kept[200];
        for (int i = 0; i < 200; i++)
            kept[i] = target();
        __asm__ volatile("" ::"r"(kept) : "memory");
        target();
    } else if (!strcmp(c, "joined-arg")) {
        pthread_t t;
        if (pthread_create(&t, NULL, drop_arg, target()) || pthread_join(t, NULL))
            exit(2);
    } else if (!strcmp(c, "freed-arena")) {
        pthread_t t;
        if (pthread_create(&t, NULL, hold_and_free, target()) || pthread_join(t, NULL))
            exit(2);
    } else if (!strcmp(c, "unjoined-result")) {
        pthread_t t;
        char x;
        if (pipe(ready) || pthread_create(&t, NULL, give_result, NULL))
            exit(2);
        (void)!read(ready[0], &x, 1);
    } else if (!strcmp(c, "stale-rbp")) {
        calls_with_rbp(target(), 31);
    } else if (!strcmp(c, "altstack-exit")) {
        altstack_exit();
    } else if (!strcmp(c, "main-exited")) {
        main_exited();
    } else if (!strcmp(c, "dlerror-pending")) {
        /* a dlsym that fails: glibc keeps its error text (and a 24-byte record pointing to
         * it) for dlerror(), and frees the text at the thread's next dl call, which is
         * mmleak.so's own dlsym at the exit; no TARGET block (test_dlerror_text_freed_at_exit) */
        if (dlsym(RTLD_DEFAULT, "no_such_symbol_in_scan_cases"))
            exit(2);
    } else {
        fprintf(stderr, "unknown case %s\n", c);
        exit(2);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    plant(argv[1]);
    wipe();
    return 0;
}
