// demo_leaky.cpp: a small program with known leaks, for `make demo` and tests/test_report.py.
//
//   demo_leaky [SECONDS [THREADS]]      (default 3 seconds, 4 worker threads)
//
// Every tick (10 per second) each worker thread handles 10 requests: each request allocates
// a Request (C++ new) and a scratch buffer (malloc) and frees both, except that one request
// in 10 forgets its Session.  The main thread meanwhile interns a name through an
// xmalloc-style wrapper, grows a log with a realloc chain, and fills a template pool.
// Exact leaks, with T = 10 * SECONDS ticks and N = THREADS:
//   LEAK-config   load_config            1 block of 4096 bytes (start-up, still referenced)
//   LEAK-session  Worker::handle         N * T blocks of sizeof(Session) = 48 bytes
//   LEAK-intern   intern_name -> xmalloc T blocks of 24 bytes
//   LEAK-log      grow_log (realloc)     1 block of 64 * T bytes
//   LEAK-pool     Pool<Item<int>>::make  T blocks of 4 * sizeof(Item<int>) = 64 bytes
// The test checks these numbers in the HTML report; the markers name the lines.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

struct Request { char payload[56]; int id; };
struct Session { long user; long created; char token[32]; };
static_assert(sizeof(Session) == 48, "Session is 48 bytes");

template <typename T> struct Item { T key; T value; char tag[8]; };
static_assert(sizeof(Item<int>) == 16, "Item<int> is 16 bytes");

static char *g_config;
static char *g_log;
static size_t g_log_len;

__attribute__((noinline)) static void *xmalloc(size_t n)
{
    void *p = malloc(n);  // LEAK-xmalloc
    if (!p) { fputs("out of memory\n", stderr); abort(); }
    return p;
}

__attribute__((noinline)) static char *intern_name(int i)
{
    char *s = static_cast<char *>(xmalloc(24));  // LEAK-intern
    snprintf(s, 24, "name-%d", i);
    return s;
}

__attribute__((noinline)) static void load_config()
{
    g_config = static_cast<char *>(malloc(4096));  // LEAK-config
    memset(g_config, 0, 4096);
}

__attribute__((noinline)) static void grow_log(const char *line)
{
    size_t n = strlen(line);
    g_log = static_cast<char *>(realloc(g_log, g_log_len + 64));  // LEAK-log
    memcpy(g_log + g_log_len, line, n < 64 ? n : 64);
    g_log_len += 64;
}

template <typename T> struct Pool {
    __attribute__((noinline)) T *make() { return new T[4]; }  // LEAK-pool
};

struct Worker {
    int id;
    std::vector<Session *> live;
    __attribute__((noinline)) void handle(int req)
    {
        Request *r = new Request;
        r->id = req;
        char *scratch = static_cast<char *>(malloc(200 + req % 50));
        snprintf(scratch, 200, "request %d", req);
        Session *s = new Session;  // LEAK-session
        s->user = req;
        if (req % 10 != 0)
            delete s;              // one request in 10 forgets its session
        free(scratch);
        delete r;
    }
};

int main(int argc, char **argv)
{
    int seconds = argc > 1 ? atoi(argv[1]) : 3;
    int nthreads = argc > 2 ? atoi(argv[2]) : 4;
    int ticks = 10 * seconds;
    load_config();
    Pool<Item<int>> pool;
    std::vector<Item<int> *> items;
    for (int t = 0; t < ticks; t++) {
        std::vector<std::thread> ths;
        for (int k = 0; k < nthreads; k++)
            ths.emplace_back([k, t] {
                Worker w{k, {}};
                for (int i = 0; i < 10; i++)
                    w.handle(t * 10 + i);
            });
        for (auto &th : ths)
            th.join();
        intern_name(t);
        char line[80];
        snprintf(line, sizeof line, "tick %d", t);
        grow_log(line);
        items.push_back(pool.make());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    printf("demo_leaky: %d ticks, %d threads done\n", ticks, nthreads);
    // the program forgets its config and its log at the end: both leaked, not still
    // reachable (valgrind and the reachability scan agree)
    g_config = nullptr;
    g_log = nullptr;
    return 0;
}
