// operator new failing under mmleak: mmleak then calls libstdc++'s operator new, whose
// new_handler loop and std::bad_alloc behave exactly as without mmleak (tests/test_tracer.py,
// tests/test_hostile.py).  Every leaking line carries "site:NAME".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <sys/resource.h>

static void *volatile sink;
static int handler_calls;
static void *reserve_block;

// An impossible `new char[]`: 1 when it throws std::bad_alloc (as it must), else 0.
static int huge_new_throws()
{
    try {
        char *p = new char[(size_t)1 << 62];
        std::printf("no exception %p\n", (void *)p);
    } catch (const std::bad_alloc &) {
        return 1;
    }
    return 0;
}

// A 1 GiB cap on the address space and a 600 MiB reserve under it: a 500 MiB `new` fails
// until reserve_handler frees the reserve.
static void arm_reserve()
{
    struct rlimit r;
    getrlimit(RLIMIT_AS, &r);
    r.rlim_cur = (rlim_t)1 << 30;
    setrlimit(RLIMIT_AS, &r);
    reserve_block = std::malloc((size_t)600 << 20);
}

// A handler that allocates (recorded, at this line) and gives up the second time.
static void greedy_handler()
{
    handler_calls++;
    sink = std::malloc(1201);                               // site:handler
    if (handler_calls == 2)
        std::set_new_handler(nullptr);
}

// A handler that frees a reserve, so that the retry succeeds.
static void reserve_handler()
{
    handler_calls++;
    std::free(reserve_block);
    reserve_block = nullptr;
    std::set_new_handler(nullptr);
}

static int handlers()
{
    // 1. the handler allocates twice, then bad_alloc: its blocks are recorded, and the
    //    exception object is allocated and freed in the trace (never a "foreign free")
    std::set_new_handler(greedy_handler);
    int caught = huge_new_throws();
    // 2. the retry after the handler succeeds: the block is the user's `new`, on its line
    arm_reserve();
    handler_calls = 0;
    std::set_new_handler(reserve_handler);
    char *q = new char[(size_t)500 << 20];                  // site:new_retry
    std::memset(q, 1, 4096);
    sink = q;
    std::printf("caught=%d handler_calls=%d retry=%s\n", caught, handler_calls,
                q ? "pointer" : "null");
    return 0;
}

// One failing form of operator new whose retry succeeds after the handler frees a reserve:
// the block is the user's `new`, at its line, whatever allocator is preloaded after mmleak
// (jemalloc's and tcmalloc's own operators allocate inside themselves, out of sight).
static int retry(const char *form)
{
    arm_reserve();
    std::set_new_handler(reserve_handler);
    const size_t n = (size_t)500 << 20;
    void *q = nullptr;
    if (!std::strcmp(form, "plain"))
        q = ::operator new(n);                                     // site:retry_plain
    else if (!std::strcmp(form, "array"))
        q = new char[n];                                           // site:retry_array
    else if (!std::strcmp(form, "nothrow"))
        q = new (std::nothrow) char[n];                            // site:retry_nothrow
    else if (!std::strcmp(form, "aligned"))
        q = ::operator new(n, std::align_val_t(64));               // site:retry_aligned
    else if (!std::strcmp(form, "alnothrow"))
        q = ::operator new(n, std::align_val_t(64), std::nothrow); // site:retry_alnothrow
    if (q)
        std::memset(q, 1, 4096);
    sink = q;
    std::printf("%s: handler_calls=%d retry=%s\n", form, handler_calls, q ? "pointer" : "null");
    return 0;
}

// A failing new whose std::bad_alloc is kept (std::current_exception) and never released
// (_Exit: no static destructor runs): the exception object, allocated by libstdc++ under
// mmleak.so's retry of the failing operator, is a leak whose call site is the user's `new`,
// not libstdc++'s nor mmleak.c's line.
static std::exception_ptr kept;

static int keep_exception()
{
    try {
        char *p = new char[(size_t)1 << 62];                // site:kept_exception
        std::printf("no exception %p\n", (void *)p);
    } catch (...) {
        kept = std::current_exception();
    }
    std::printf("kept=%d\n", kept ? 1 : 0);
    std::fflush(stdout);
    std::_Exit(0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !std::strcmp(argv[1], "keep"))
        return keep_exception();
    if (argc > 2)
        return retry(argv[2]);
    if (argc > 1)
        return handlers();
    int caught = huge_new_throws();
    char *q = new (std::nothrow) char[(size_t)1 << 62];
    try {
        void *r = ::operator new((size_t)1 << 62, std::align_val_t(64));
        std::printf("aligned: %s\n", r ? "pointer" : "null");
    } catch (const std::bad_alloc &) {
        caught++;
    }
    std::printf("caught=%d nothrow=%s\n", caught, q ? "pointer" : "null");
    return 0;
}
