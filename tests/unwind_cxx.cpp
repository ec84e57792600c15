// C++ call chains for tracer/unwind.c, built by tests/test_unwind.py: templates, lambdas,
// std::function, virtual calls, a replaced operator new that walks the stack, and C++
// exceptions unwinding through frames that call the unwinder (also from a destructor run
// during that unwinding, and from a catch block).  Output as tests/unwind_check.c:
//     site NAME n=N match=1 frames=... addrs=...
#include <execinfo.h>
#include <dlfcn.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>
#include <algorithm>

extern "C" {
#include "../tracer/unwind.h"
}

#define NOINLINE __attribute__((noinline))
enum { MAXF = 64 };
static volatile int sink;
static int in_new; // the replaced operator new checks only when asked

static void report(const char *site, const uintptr_t *ours, int n, const uintptr_t *expect, int m)
{
    bool match = n == m && !memcmp(ours, expect, sizeof *ours * (size_t)n);
    std::string line = std::string("site ") + site + " n=" + std::to_string(n) +
                       " match=" + (match ? "1" : "0") + " frames=";
    for (int i = 0; i < n; i++) {
        Dl_info di;
        const char *s = dladdr((void *)(ours[i] - 1), &di) && di.dli_sname ? di.dli_sname : "?";
        line += (i ? "," : "") + std::string(s);
    }
    char b[32];
    line += " addrs=";
    for (int i = 0; i < n; i++) {
        snprintf(b, sizeof b, "%s%lx", i ? "," : "", (unsigned long)ours[i]);
        line += b;
    }
    if (!match) {
        line += " bt=";
        for (int i = 0; i < m; i++) {
            snprintf(b, sizeof b, "%s%lx", i ? "," : "", (unsigned long)expect[i]);
            line += b;
        }
    }
    printf("%s\n", line.c_str());
}

extern "C" NOINLINE void check(const char *site)
{
    uintptr_t ours[MAXF], expect[MAXF];
    void *bt[MAXF + 1];
    uintptr_t *fp = (uintptr_t *)__builtin_frame_address(0);
    int n = mml_unwind(fp[1], (uintptr_t)(fp + 2), fp[0], ours, MAXF);
    int m = backtrace(bt, MAXF + 1);
    for (int i = 1; i < m; i++)
        expect[i - 1] = (uintptr_t)bt[i];
    report(site, ours, n, expect, m - 1);
}

// operator new walks the stack like mmleak's would (its frame has a frame pointer: it uses
// __builtin_frame_address), then allocates or throws
void *operator new(std::size_t n)
{
    if (in_new) {
        in_new = 0;
        check("operator-new");
    }
    void *p = malloc(n ? n : 1);
    if (!p)
        throw std::bad_alloc();
    return p;
}
void operator delete(void *p) noexcept { free(p); }
void operator delete(void *p, std::size_t) noexcept { free(p); }

template <int N> struct Rec {
    static NOINLINE void go(const char *site)
    {
        volatile char pad[N * 8 + 8];
        pad[0] = 1;
        Rec<N - 1>::go(site);
        sink += pad[0];
    }
};
template <> struct Rec<0> {
    static NOINLINE void go(const char *site) { check(site); sink++; }
};

struct Base {
    virtual ~Base() {}
    virtual void run(const char *site) = 0;
};
struct Derived : Base {
    NOINLINE void run(const char *site) override
    {
        std::function<void()> f = [site]() { check(site); };
        f();
        sink++;
    }
};

struct Guard { // its destructor walks the stack, also while an exception passes
    const char *site;
    NOINLINE ~Guard() { check(site); }
};

NOINLINE void thrower(int x)
{
    if (x >= 0)
        throw std::runtime_error("boom");
    sink++;
}

NOINLINE void through(int x) // calls the unwinder, then an exception passes through its frame
{
    Guard g{"dtor-during-unwind"};
    check("before-throw");
    thrower(x);
    sink++;
}

struct Ctor {
    NOINLINE Ctor() { throw std::logic_error("ctor"); }
    char pad[40];
};

int main()
{
    void *warm[4];
    backtrace(warm, 4);
    for (int round = 0; round < 2; round++) {
        Rec<6>::go("template");
        Derived d;
        Base *b = &d;
        b->run("virtual-lambda");
        std::vector<int> v{5, 3, 9, 1};
        bool once = true;
        std::sort(v.begin(), v.end(), [&](int a, int c) {
            if (once) {
                once = false;
                check("sort-lambda");
            }
            return a < c;
        });
        try {
            through(round);
        } catch (const std::exception &e) {
            check("catch");
        }
        try {
            in_new = 1;
            Ctor *c = new Ctor; // operator new walks, then the constructor throws
            delete c;
        } catch (const std::logic_error &) {
            check("catch-ctor");
        }
    }
    printf("end cxx\n");
    return 0;
}
