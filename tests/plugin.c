/* A plugin for tests/test_plugins.py, built twice: -DPLUGIN=alpha and -DPLUGIN=beta. */
#include <stdlib.h>
#include <string.h>
#define STR2(x) #x
#define STR(x) STR2(x)
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

static void *volatile kept[8];

void *plugin_leak(int n)
{
    void *p = malloc(100 + n);                  /* site:plugin_leak */
    kept[n & 7] = p;
    return p;
}

const char *plugin_name(void) { return STR(PLUGIN); }

/* make the two builds differ in size and layout */
int CAT(pad_, PLUGIN)(int x) { return x * (int)sizeof(STR(PLUGIN)); }

/* blocks allocated and freed in the plugin's own code (tests/plugin_race.c) */
void plugin_churn(int n)
{
    for (int i = 0; i < n; i++) {
        void *volatile p = malloc(16 + (size_t)i);
        free(p);
    }
}
