// Leaks made inside the C and C++ runtime on the program's behalf (tests/test_stacks.py):
// each case is a function of its own whose leaking call carries "site:NAME", and the report
// must name that line.  Between cases main() allocates and frees a marker block of a
// recognisable size, so that an independent record of the same run (glibc's mtrace) can say
// which blocks each case left behind.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <glob.h>
#include <netdb.h>
#include <regex.h>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>
#include <map>
#include <mcheck.h>

static void *volatile sink;
static const char *dir;

#define CASE __attribute__((noinline)) static void

CASE string_new() { sink = new std::string(100, 'x'); }                          // site:string_new
CASE string_append()
{
    static std::string *s = new std::string();                                  // site:string_obj
    for (int i = 0; i < 40; i++)
        s->append("0123456789");                                                // site:string_append
}
CASE vector_push()
{
    auto *v = new std::vector<long>();                                          // site:vector_obj
    for (long i = 0; i < 9; i++)
        v->push_back(i);                                                        // site:vector_push
    sink = v;
}
CASE map_insert()
{
    auto *m = new std::map<int, int>();                                         // site:map_obj
    for (int i = 0; i < 5; i++)
        (*m)[i] = i;                                                            // site:map_insert
    sink = m;
}
CASE ostringstream_str()
{
    std::ostringstream os;
    os << std::string(300, 'y') << 42;
    sink = new std::string(os.str());                                           // site:ostringstream
}
CASE fopen_unclosed()
{
    FILE *f = fopen("/dev/null", "r");                                          // site:fopen
    sink = f;
}
CASE stdio_buffer()
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/input.txt", dir);
    FILE *f = fopen(path, "r");                                                 // site:stdio_fopen
    sink = (void *)(long)fgetc(f);                                              // site:stdio_buffer
    sink = f;
}
CASE asprintf_leak()
{
    char *p;
    if (asprintf(&p, "%0200d", 7) > 0)                                          // site:asprintf
        sink = p;
}
CASE getline_leak()
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/input.txt", dir);
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t n = 0;
    if (getline(&line, &n, f) > 0)                                              // site:getline
        sink = line;
    fclose(f);
}
CASE realpath_leak() { sink = realpath(dir, NULL); }                            // site:realpath
CASE strdup_leak() { sink = strdup("a string to keep"); }                       // site:strdup
CASE memstream_leak()
{
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);                                      // site:memstream_open
    for (int i = 0; i < 100; i++)
        fprintf(f, "line %d\n", i);                                             // site:memstream_write
    fclose(f);                                                                  // site:memstream_close
    sink = buf;
}
CASE scandir_leak()
{
    struct dirent **list;
    int n = scandir(dir, &list, NULL, alphasort);                               // site:scandir
    sink = list;
    (void)n;
}
CASE glob_leak()
{
    static char pat[4096];
    snprintf(pat, sizeof pat, "%s/*.txt", dir);
    glob_t *g = (glob_t *)calloc(1, sizeof *g);                                 // site:glob_t
    glob(pat, 0, NULL, g);                                                      // site:glob
    sink = g;
}
CASE regcomp_leak()
{
    regex_t *re = (regex_t *)malloc(sizeof *re);                                // site:regex_t
    regcomp(re, "^(a|b)+[0-9]{2,4}$", REG_EXTENDED);                            // site:regcomp
    sink = re;
}
CASE getaddrinfo_leak()
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo("127.0.0.1", "80", &hints, &res) == 0)                      // site:getaddrinfo
        sink = res;
}

static void (*const cases[])() = {
    string_new, string_append, vector_push, map_insert, ostringstream_str, fopen_unclosed,
    stdio_buffer, asprintf_leak, getline_leak, realpath_leak, strdup_leak, memstream_leak,
    scandir_leak, glob_leak, regcomp_leak, getaddrinfo_leak,
};

// a block of a size nothing else uses, allocated and freed: "case k begins here"
static void marker(int k)
{
    void *volatile p = malloc(777000 + (size_t)k);     // volatile: -O2 would drop the pair
    free(p);
}

int main(int argc, char **argv)
{
    dir = argc > 1 ? argv[1] : "/tmp";
    mtrace();       // glibc's own record, when run with libc_malloc_debug.so and MALLOC_TRACE
    int n = sizeof cases / sizeof cases[0];
    for (int k = 0; k < n; k++) {
        marker(k);
        cases[k]();
    }
    marker(n);
    std::printf("%d cases\n", n);
    return 0;
}
