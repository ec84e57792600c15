// C++: thread_local objects (joined threads: freed by their destructors; a thread still
// blocked at exit: its thread_local pointer holds a block), static destructors, an
// exception_ptr kept across threads, a sigaltstack buffer whose pointer is dropped
// (only the kernel knows it), std::async, a detached thread alive at exit.
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

static thread_local std::vector<std::string> tl_strings;
thread_local char *tl_raw;              // extern: the store stays
static std::map<int, std::string> statics;          // freed by its static destructor
static std::exception_ptr kept;
static std::mutex mu;
static std::condition_variable cv;
static int ready;

static void on_usr1(int) { static volatile int n; n++; }

int main()
{
    std::vector<std::thread> ts;
    for (int i = 0; i < 3; i++)
        ts.emplace_back([i] {
            for (int k = 0; k < 50; k++)
                tl_strings.push_back(std::string(40 + k, 'a' + i));
            try {
                throw std::runtime_error("thread " + std::to_string(i));
            } catch (...) {
                std::lock_guard<std::mutex> g(mu);
                kept = std::current_exception();
            }
        });
    for (auto &t : ts)
        t.join();
    // a detached thread, alive at exit: its thread_local raw pointer holds 300 bytes
    std::thread([] {
        tl_raw = (char *)malloc(300);
        memset(tl_raw, 1, 300);
        { std::lock_guard<std::mutex> g(mu); ready = 1; }
        cv.notify_all();
        for (;;)
            pause();
    }).detach();
    { std::unique_lock<std::mutex> g(mu); cv.wait(g, [] { return ready; }); }
    auto f = std::async(std::launch::async, [] { return std::string(1000, 'z'); });
    std::string r = f.get();
    for (int i = 0; i < 200; i++)
        statics[i] = std::string(30 + i % 50, 's');
    // an alternate signal stack from malloc, its pointer dropped: lost for every tool
    stack_t ss{};
    ss.ss_sp = malloc(64 * 1024);
    ss.ss_size = 64 * 1024;
    sigaltstack(&ss, nullptr);
    ss.ss_sp = nullptr;
    struct sigaction sa{};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, nullptr);
    raise(SIGUSR1);
    // a lost unique_ptr array
    new std::unique_ptr<int[]>(new int[64]);
    std::cout << r.size() << " " << statics.size() << std::endl;
    return 0;
}
