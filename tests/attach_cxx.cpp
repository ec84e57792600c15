// A C++ program for tests/test_attach.py: waits for "leak" on stdin, then leaks through
// operator new, std::string (its buffer is made inside libstdc++), strdup and getline;
// "strings N" makes and frees N std::string buffers (allocated inside libstdc++), then
// says "made N".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

static void *volatile sink;

__attribute__((noinline)) static void leak_new() { sink = new int[10]; }         // site:new_int
__attribute__((noinline)) static void leak_string() { sink = new std::string(200, 'x'); } // site:string
__attribute__((noinline)) static void leak_strdup() { sink = strdup("hello"); }  // site:strdup
__attribute__((noinline)) static void leak_getline()
{
    FILE *f = fmemopen((void *)"a line\n", 7, "r");
    char *line = nullptr;
    size_t n = 0;
    if (getline(&line, &n, f) > 0)                                                 // site:getline
        sink = line;
    fclose(f);
}

int main()
{
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::printf("ready\n");
    char buf[64];
    while (std::fgets(buf, sizeof buf, stdin)) {
        if (!std::strcmp(buf, "leak\n")) {
            leak_new();
            leak_string();
            leak_strdup();
            leak_getline();
            std::printf("leaked\n");
        } else if (!std::strncmp(buf, "strings ", 8)) {
            long n = std::atol(buf + 8);
            for (long i = 0; i < n; i++) {
                std::string s(100 + i % 50, 'y');
                sink = &s;
            }
            std::printf("made %ld\n", n);
        } else if (!std::strcmp(buf, "quit\n")) {
            break;
        }
    }
    return 0;
}
