/* The shape of GLib's allocation macros (glib/gmem.h, written from its description): a
 * type-safe macro my_new0(T, n) over my_malloc0_n (overflow check) -> my_malloc0 -> calloc,
 * and my_strdup over my_malloc -> malloc.  No name here is one mmleak knows.  Leaks:
 * 4 x 24 (struct item) at the g_items line, 1 x 80 (10 pointers) at the g_array line,
 * 1 x 6 at the g_dup line and 1 x 6 at the g_dup2 line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((noipa))

W static void my_error(const char *what, size_t n) { fprintf(stderr, "%s: %zu\n", what, n); abort(); }

W void *my_malloc(size_t n) {
    if (n == 0) return NULL;
    void *p = malloc(n);
    if (!p) my_error("my_malloc", n);
    return p;
}

W void *my_malloc0(size_t n) {
    if (n == 0) return NULL;
    void *p = calloc(1, n);
    if (!p) my_error("my_malloc0", n);
    return p;
}

W void *my_malloc0_n(size_t count, size_t size) {
    if (size && count > (size_t)-1 / size) my_error("overflow", count);
    return my_malloc0(count * size);
}

W char *my_strdup(const char *s) {
    if (!s) return NULL;
    size_t l = strlen(s) + 1;
    char *p = my_malloc(l);
    memcpy(p, s, l);
    return p;
}

#define my_new0(T, n) ((T *)my_malloc0_n((n), sizeof(T)))

struct item { long a, b, c; };
void *keep[16];             /* not static: the stores stay */

int main(void) {
    for (int i = 0; i < 4; i++)
        keep[i] = my_new0(struct item, 1);           /* site:g_items */
    keep[4] = my_new0(char *, 10);                   /* site:g_array */
    keep[5] = my_strdup("hello");                    /* site:g_dup */
    keep[6] = my_strdup("world");                    /* site:g_dup2 */
    printf("%p\n", keep[0]);
    return 0;
}
