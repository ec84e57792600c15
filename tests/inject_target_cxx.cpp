// tests/inject_target_cxx.cpp: a C++ process for tests/test_inject.py: a worker thread churns
// std::string / std::map allocations while main waits in std::getline on stdin; prints
// "ready", then "line TEXT" and "worker ok" once the line came and the worker, still alive
// after the injections, finished one more round (waited for: a worker that cannot go on,
// deadlocked by an injection, makes the test time out instead of depending on the machine's
// speed).
#include <atomic>
#include <iostream>
#include <map>
#include <string>
#include <thread>

int main()
{
    std::atomic<bool> stop{false};
    std::atomic<long> rounds{0};
    std::thread worker([&] {
        while (!stop) {
            std::map<int, std::string> m;
            for (int i = 0; i < 200; i++)
                m[i] = std::string(16 + i % 300, 'x');
            rounds++;
        }
    });
    std::cout << "ready" << std::endl;
    std::string line;
    std::getline(std::cin, line);
    for (long r0 = rounds; rounds == r0;)
        std::this_thread::yield();
    stop = true;
    worker.join();
    std::cout << "line " << line << std::endl;
    std::cout << "worker " << (rounds > 0 ? "ok" : "IDLE") << std::endl;
    return 0;
}
