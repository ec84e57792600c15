/* Loads and unloads plugins (tests/plugin.c) in the order given (tests/test_plugins.py):
 *   +PATH   dlopen PATH and call its plugin_leak(k): one leaked block of 100 + k bytes
 *   -PATH   dlclose PATH (the handle of its last load)
 *   !PATH   dlclose PATH, then map an inaccessible anonymous region over every address its
 *           last load occupied (MAP_FIXED_NOREPLACE), so that the loader cannot put the next
 *           load of anything there: a library loaded again goes to another address
 *   =ADDR   map an inaccessible anonymous page at ADDR (hexadecimal; MAP_FIXED_NOREPLACE)
 *   ~ADDR   unmap that page again
 *   ^       dig a pit: the kernel places a mapping without an address at the top of the
 *           highest free range it fits in; hold a region, fill every free page above it
 *           (asking the kernel for one page at a time until it answers below the region),
 *           then free the region's top PIT bytes.  The next mappings go there, each one
 *           right below the one before, or where one was unmapped above it if it fits
 *           (prints "pit START-END")
 * and prints "NAME at ADDRESS leaked SIZE in START-END" for every load (the address of its
 * plugin_leak, the range of its mappings), so the test knows where each one went. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* The lowest start and highest end of the mappings of the file PATH in /proc/self/maps. */
static int extent(const char *path, unsigned long *lo, unsigned long *hi)
{
    char real[PATH_MAX], line[PATH_MAX + 128];
    if (!realpath(path, real))
        return -1;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    *lo = ~0UL;
    *hi = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long s, e;
        int at = 0;
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &s, &e, &at) == 2 && at &&
            !strcmp(line + at, real)) {
            *lo = s < *lo ? s : *lo;
            *hi = e > *hi ? e : *hi;
        }
    }
    fclose(f);
    return *hi ? 0 : -1;
}

#define PIT (1UL << 20)

static int dig_pit(void)
{
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    char *r = mmap(NULL, 2 * PIT, PROT_NONE, flags, -1, 0);
    if (r == MAP_FAILED)
        return -1;
    for (long n = 0; n < (1L << 20); n++) {
        char *p = mmap(NULL, 4096, PROT_NONE, flags, -1, 0);
        if (p == MAP_FAILED)
            return -1;
        if (p < r) {            /* nothing free above the region any more */
            munmap(p, 4096);
            munmap(r + PIT, PIT);
            printf("pit %p-%p\n", (void *)(r + PIT), (void *)(r + 2 * PIT));
            return 0;
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    void *handles[64];
    const char *paths[64];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *path = argv[i] + 1;
        if (argv[i][0] == '^') {
            if (dig_pit()) {
                fprintf(stderr, "cannot dig a pit\n");
                return 1;
            }
        } else if (argv[i][0] == '=' || argv[i][0] == '~') {
            void *at = (void *)strtoul(path, NULL, 16);
            if (argv[i][0] == '~' ? munmap(at, 4096) != 0 :
                mmap(at, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0) != at) {
                fprintf(stderr, "cannot %s %p\n", argv[i][0] == '~' ? "unmap" : "map", at);
                return 1;
            }
        } else if (argv[i][0] == '+') {
            void *h = dlopen(path, RTLD_NOW);
            if (!h) {
                fprintf(stderr, "%s\n", dlerror());
                return 1;
            }
            void *(*leak)(int) = (void *(*)(int))dlsym(h, "plugin_leak");
            const char *(*name)(void) = (const char *(*)(void))dlsym(h, "plugin_name");
            leak(i);
            unsigned long lo, hi;
            if (extent(path, &lo, &hi)) {
                fprintf(stderr, "%s: not in /proc/self/maps\n", path);
                return 1;
            }
            printf("%s at %p leaked %d in %#lx-%#lx\n", name(), (void *)leak, 100 + i, lo, hi);
            if (n == 64) {      /* the unloaded ones' slots, in order: any number of loads */
                int k = 0;
                for (int j = 0; j < n; j++)
                    if (handles[j]) {
                        handles[k] = handles[j];
                        paths[k++] = paths[j];
                    }
                if ((n = k) == 64) {
                    fprintf(stderr, "more than 64 libraries loaded at once\n");
                    return 1;
                }
            }
            handles[n] = h;
            paths[n++] = path;
        } else {
            for (int j = n - 1; j >= 0; j--)
                if (handles[j] && !strcmp(paths[j], path)) {
                    unsigned long lo = 0, hi = 0;
                    if (argv[i][0] == '!' && extent(path, &lo, &hi)) {
                        fprintf(stderr, "%s: not in /proc/self/maps\n", path);
                        return 1;
                    }
                    dlclose(handles[j]);
                    handles[j] = NULL;
                    if (argv[i][0] == '!') {
                        void *p = mmap((void *)lo, hi - lo, PROT_NONE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
                        if (p != (void *)lo) {
                            fprintf(stderr, "cannot reserve %#lx-%#lx\n", lo, hi);
                            return 1;
                        }
                        printf("reserved %#lx-%#lx\n", lo, hi);
                    }
                    break;
                }
        }
    }
    return 0;
}
