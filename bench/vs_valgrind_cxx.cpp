// vs_valgrind_cxx.cpp: the C++ program of bench/vs_valgrind.py: iostream, exceptions thrown
// and caught in 4 threads (joined), a std::map kept to the end (freed by its destructor),
// and two planted leaks: a list of 10 nodes (1 definitely lost, 9 indirectly) and a
// std::string (its object definitely lost, its buffer indirectly).
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

static std::map<std::string, std::vector<int>> table;

struct Node {
    Node *next;
    char pad[40];
};

int main()
{
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; i++)
        ts.emplace_back([i] {
            std::ostringstream o;
            o << "thread " << i;
            try {
                throw std::runtime_error(o.str());
            } catch (const std::exception &e) {
                std::cout << e.what() << "\n";
            }
        });
    for (auto &t : ts)
        t.join();
    for (int i = 0; i < 100; i++)
        table["key" + std::to_string(i)].push_back(i);
    Node *head = nullptr;
    for (int i = 0; i < 10; i++)
        head = new Node{head, {}};
    head = nullptr;
    new std::string(100, 'x');
    std::cout << table.size() << std::endl;
    return 0;
}
