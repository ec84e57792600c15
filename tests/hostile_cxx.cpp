// C++ entry points, for tests/test_tracer.py: every form of operator new leaks one block
// with a distinct size ("site:NAME" marks the line), and every form of delete frees one.
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

struct alignas(64) Wide { char b[128]; };
struct Node { char b[40]; };
template <typename T> struct Box { T v[3]; };

static void *volatile sink;
static std::string *early = new std::string(200, 'x');  // site:static_init

__attribute__((noinline)) static void forms()
{
    sink = new Node;                                      // site:new
    sink = new char[301];                                 // site:new_array
    sink = new (std::nothrow) char[302];                  // site:new_nothrow
    sink = new Wide;                                      // site:new_aligned
    sink = new (std::nothrow) Wide[2];                    // site:new_aligned_nothrow
    sink = new Box<Node>;                                 // site:template
    delete new Node;
    delete[] new char[50];
    delete new Wide;
    delete[] new Wide[3];
    operator delete(operator new(33), std::nothrow);
    ::operator delete(::operator new(34), 34);            // sized
    ::operator delete(::operator new(64, std::align_val_t(64)), 64, std::align_val_t(64));
    std::vector<int> v;
    for (int i = 0; i < 1000; i++)
        v.push_back(i);                                   // freed when v goes
}

int main()
{
    sink = early;
    forms();
    return 0;
}
