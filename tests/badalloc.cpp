// operator new failing under mmleak: mmleak then calls libstdc++'s operator new, whose
// std::bad_alloc unwinds through mmleak's frame (built with -fexceptions).  The output must
// be the same with and without mmleak (tests/test_tracer.py).
#include <cstdio>
#include <new>

int main()
{
    int caught = 0;
    try {
        char *p = new char[(size_t)1 << 62];
        std::printf("no exception %p\n", (void *)p);
    } catch (const std::bad_alloc &) {
        caught++;
    }
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
