/* tests/scan_ahead.c: a heap the marking reads stretch by stretch (tools/scan_read.c, its
 * reader thread): N list nodes allocated in a row, of sizes 16 to 207 bytes, in 8 lists,
 * 4 linked from the newest node down (the marking walks the heap downwards) and 4 from the
 * oldest up (upwards), freed spacers between them (gaps), and every 1000th node (the 501st of each thousand) a lost
 * chain of 3 (its head definitely lost, the other two indirectly).
 *
 *     scan_ahead N          (exits 0; the scan at exit classifies)
 *     scan_ahead N wait     (then says "ready" on stdout and waits, changing nothing, for the
 *                           end of its stdin: a scan on demand classifies; exits 0)
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node { struct node *next; };

struct node *down[4], *up_head[4];
static struct node *up_tail[4];

struct node *volatile sink;             /* a chain's head escapes: its links are stored */

static __attribute__((noinline)) int lose_chain(void)
{
    struct node *c = malloc(64), *d = malloc(64), *e = malloc(64);
    if (!c || !d || !e)
        return 1;
    c->next = d;
    d->next = e;
    e->next = NULL;
    sink = c;
    sink = NULL;                        /* c's last copy dies here */
    return 0;
}

/* The stack below main's frame zeroed, where the thread's red zone will be while it waits
 * (a scan on demand reads it): no stale copy of a lost chain's head left there. */
static __attribute__((noinline)) void scrub_stack(void)
{
    volatile char pad[65536];
    for (size_t i = 0; i < sizeof pad; i++)
        pad[i] = 0;
}

int main(int argc, char **argv)
{
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 0) : 100000, r = 12345;
    void *spacer = NULL;
    for (unsigned long i = 0; i < n; i++) {
        r = r * 6364136223846793005ul + 1442695040888963407ul;
        struct node *x = malloc(16 + (r >> 56) % 192);
        if (!x)
            return 1;
        x->next = NULL;
        unsigned k = (unsigned)(i % 8);
        if (k < 4) {
            x->next = down[k];
            down[k] = x;
        } else {
            k -= 4;
            if (up_tail[k])
                up_tail[k]->next = x;
            else
                up_head[k] = x;
            up_tail[k] = x;
        }
        if (i % 7 == 3) {               /* a gap: the one before freed, this one kept */
            free(spacer);
            spacer = malloc(48 + i % 64);
        }
        if (i % 1000 == 500 && lose_chain())    /* lost: a chain of 3 */
            return 1;
    }
    free(spacer);
    up_tail[0] = up_tail[1] = up_tail[2] = up_tail[3] = NULL;
    if (argc > 2 && !strcmp(argv[2], "wait")) {
        char c;
        scrub_stack();
        if (write(1, "ready\n", 6) != 6)
            return 1;
        while (read(0, &c, 1) > 0)
            ;
    }
    return 0;
}
