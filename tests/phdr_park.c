/* Preloaded after mmleak.so by test_tracer.py (fork_phdr own): wraps dl_iterate_phdr, and
 * once armed (phdr_park_arm(TID, IN, GO), from tests/fork_phdr.c) parks thread TID's next
 * call made from mmleak.so inside the real one, the loader's lock held: after mmleak's own
 * callback returns, it writes a byte to IN and waits for one on GO.  So mmleak.so's own
 * thread holds the lock at a fork, every time. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*phdr_cb)(struct dl_phdr_info *, size_t, void *);
static int (*real_iterate)(phdr_cb, void *);
static volatile int armed_tid, in_fd = -1, go_fd = -1;

__attribute__((visibility("default"))) void phdr_park_arm(int tid, int in, int go)
{
    in_fd = in;
    go_fd = go;
    armed_tid = tid;
}

struct wrap { phdr_cb cb; void *data; int park; };

static int wrap_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    struct wrap *w = data;
    int r = w->cb(info, size, w->data);
    if (w->park) {
        w->park = 0;
        char c = 1;
        if (write(in_fd, &c, 1) != 1 || read(go_fd, &c, 1) != 1)
            abort();
    }
    return r;
}

__attribute__((visibility("default"))) int dl_iterate_phdr(phdr_cb cb, void *data)
{
    if (!real_iterate)
        real_iterate = (int (*)(phdr_cb, void *))dlsym(RTLD_NEXT, "dl_iterate_phdr");
    struct wrap w = { cb, data, 0 };
    Dl_info di;
    if (armed_tid && armed_tid == gettid() &&
        dladdr(__builtin_return_address(0), &di) && di.dli_fname &&
        strstr(di.dli_fname, "mmleak.so")) {
        armed_tid = 0;
        w.park = 1;
    }
    return real_iterate(wrap_cb, &w);
}
