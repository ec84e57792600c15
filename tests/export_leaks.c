/* Known leaks for tests/test_export.py (mmleak.py report --pprof/--folded/--heaptrack).
 *
 *   export_leaks [wait]
 *
 * Leaks, each on the line with the marker "site:NAME" (NAME in parentheses below); no
 * stdio, so nothing else allocates:
 *   two_sites      3 blocks of 100 bytes (two_a) and 2 of 300 bytes (two_b): one function,
 *                  two call sites
 *   keep_name      7 strdup()s of a 23-character name, 24 bytes each (strdup): libc's strdup
 *                  is the allocator's caller, keep_name the call site
 *   intern         5 blocks of 40 bytes through xmalloc (xmalloc_call), a wrapper the report
 *                  looks through (xmalloc's own malloc: xmalloc)
 *   make_table     calloc(4, 16) in fill_in() (calloc), inlined into make_table (always_inline,
 *                  inlined_into)
 *   grow           a realloc chain ending at 1024 bytes (realloc)
 *   main           50 malloc/free pairs, all freed (GCC removes them at -O1)
 * With "wait": after those it writes "ready\n", waits for a line on stdin, then leaks 4
 * blocks of 1000 bytes more in late() (late) and writes "done\n". */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static void *volatile keep[64];
static int nkeep;

static void hold(void *p) { keep[nkeep++ % 64] = p; }

NOINLINE static void two_sites(void)
{
    for (int i = 0; i < 3; i++)
        hold(malloc(100)); /* site:two_a */
    for (int i = 0; i < 2; i++)
        hold(malloc(300)); /* site:two_b */
}

NOINLINE static void keep_name(int i)
{
    char name[] = "a-name-of-23-characters";
    name[0] = (char)('a' + i);
    hold(strdup(name)); /* site:strdup */
}

NOINLINE static void *xmalloc(size_t n)
{
    void *p = malloc(n); /* site:xmalloc */
    if (!p)
        abort();
    return p;
}

NOINLINE static void intern(void)
{
    hold(xmalloc(40)); /* site:xmalloc_call */
}

static inline __attribute__((always_inline)) void *fill_in(size_t n)
{
    return calloc(n, 16); /* site:calloc */
}

NOINLINE static void make_table(void)
{
    hold(fill_in(4)); /* site:inlined_into */
}

NOINLINE static void grow(void)
{
    char *p = NULL;
    for (size_t n = 128; n <= 1024; n *= 2)
        p = realloc(p, n); /* site:realloc */
    hold(p);
}

NOINLINE static void late(void)
{
    for (int i = 0; i < 4; i++)
        hold(malloc(1000)); /* site:late */
}

int main(int argc, char **argv)
{
    for (int i = 0; i < 50; i++)
        free(malloc(10 + i));
    two_sites();
    for (int i = 0; i < 7; i++)
        keep_name(i);
    for (int i = 0; i < 5; i++)
        intern();
    make_table();
    grow();
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char c;
        if (write(1, "ready\n", 6) != 6)
            return 1;
        while (read(0, &c, 1) == 1 && c != '\n')
            ;
        late();
        if (write(1, "done\n", 5) != 5)
            return 1;
    }
    return 0;
}
