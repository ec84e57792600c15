/* Loads and unloads plugins (tests/plugin.c) in the order given (tests/test_plugins.py):
 *   +PATH   dlopen PATH and call its plugin_leak(k): one leaked block of 100 + k bytes
 *   -PATH   dlclose PATH (the handle of its last load)
 * and prints "NAME at ADDRESS" for every load, so the test knows where each one went. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    void *handles[64];
    const char *paths[64];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *path = argv[i] + 1;
        if (argv[i][0] == '+') {
            void *h = dlopen(path, RTLD_NOW);
            if (!h) {
                fprintf(stderr, "%s\n", dlerror());
                return 1;
            }
            void *(*leak)(int) = (void *(*)(int))dlsym(h, "plugin_leak");
            const char *(*name)(void) = (const char *(*)(void))dlsym(h, "plugin_name");
            leak(i);
            printf("%s at %p leaked %d\n", name(), (void *)leak, 100 + i);
            handles[n] = h;
            paths[n++] = path;
        } else {
            for (int j = n - 1; j >= 0; j--)
                if (handles[j] && !strcmp(paths[j], path)) {
                    dlclose(handles[j]);
                    handles[j] = NULL;
                    break;
                }
        }
    }
    return 0;
}
