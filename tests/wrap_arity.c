/* A constructor over a two-argument wrapper, with a third argument register busy.  my_calloc
 * (n, size) is a wrapper: main's two calls with variable counts are sites, 1 x 24 and 1 x 48
 * at their lines.  register_fd(ev, fd, ctx) is lighttpd's fdevent_register: it stores a new
 * node in ev->nodes[fd] and returns it, after my_calloc(1, sizeof *n), a fixed size; but gcc
 * computes &ev->nodes[fd] in rdx (movsxd rdx,esi) before the call.  Without knowing that
 * my_calloc reads rdi and rsi only, rdx looked like a third, variable argument and
 * register_fd like a wrapper.  It is a constructor: its line is the site of all 5 nodes,
 * 5 x 32, whoever called it (two callers).  A file/line wrapper, my_alloc_at(size, file,
 * line): make_buf passes a variable size on (a tail call at -O2: no frame of its own, so
 * main's line is the site, 2 x 100), make_rec sizeof and constants (a constructor: 3 x 40 at
 * make_rec's line).
 * Pointers: dup_hook allocates through a hook in a global (libxml2's xmlMalloc, sqlite's
 * configured xMalloc): a wrapper, main's line is the site (2 x 10).  call_make and call_blob
 * call a method read from an object (o->ops->make: Python's PyObject_Vectorcall,
 * tp_getattro), a dispatch.  A dispatcher is no wrapper: make_str is one (main calls it
 * directly: 1 x 20 at main's line), yet call_make's line is the site of the 2 x 30 it made
 * through call_make.  And a dispatcher's use of what a method returns does not make the
 * method a wrapper: make_blob, only called through call_blob, is the site of its blocks
 * (2 x 40 at make_blob's line), not the dispatcher (which would be the site of every
 * method's blocks: Python's eval loop).
 * A pool of one type: pool_get(pool, flags) returns a block of the pool's size, a wrapper
 * (main's line for a local pool, 1 x 56); conn_new calls it with a pool read from a global
 * (haproxy's pool_alloc(pool_head_connection)): its size is not its caller's, a
 * constructor, 3 x 48 at conn_new's line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((noipa))

W void *my_calloc(size_t n, size_t size) {
    void *p = calloc(n, size);
    if (!p) abort();
    return p;
}

struct node { void *ctx; int fd; int events; void *next; void *pad; };
struct ev { struct node **nodes; };

W struct node *register_fd(struct ev *ev, int fd, void *ctx) {
    struct node *n = ev->nodes[fd] = my_calloc(1, sizeof *n);    /* site:reg */
    n->ctx = ctx;
    n->fd = fd;
    return n;
}

W void *my_alloc_at(size_t size, const char *file, int line) {
    void *p = malloc(size);
    if (!p) {
        fprintf(stderr, "%s:%d: out of memory\n", file, line);
        abort();
    }
    return p;
}

W char *make_buf(size_t n) { return my_alloc_at(n, __FILE__, __LINE__); }

struct rec { char name[32]; struct rec *next; };

W struct rec *make_rec(struct rec *next) {
    struct rec *r = my_alloc_at(sizeof *r, __FILE__, __LINE__);  /* site:rec */
    r->name[0] = 0;
    r->next = next;
    return r;
}

void *(*volatile alloc_hook)(size_t) = malloc;

W char *dup_hook(const char *s, size_t n) {
    char *p = alloc_hook(n);
    memcpy(p, s, n);
    return p;
}

W void *make_str(size_t n) {
    void *p = my_alloc_at(n, "str", 1);
    *(char *)p = 0;
    return p;
}

W void *make_blob(size_t n) {
    void *p = my_alloc_at(n, "blob", 1);                         /* site:blob */
    *(char *)p = 1;
    return p;
}

struct ops { void *(*make)(size_t n); void *(*blob)(size_t n); };
struct obj { const struct ops *ops; int calls; };

W void *call_make(struct obj *o, size_t n) {
    void *r = o->ops->make(n);                                   /* site:meth */
    o->calls++;
    return r;
}

W void *call_blob(struct obj *o, size_t n) {
    void *r = o->ops->blob(n);
    o->calls++;
    return r;
}

W void *first_make(struct obj *o) { return call_make(o, 30); }
W void *second_make(struct obj *o) { return call_make(o, 30); }

struct pool { size_t size; int allocated; };

W void *pool_get(struct pool *p, int flags) {
    void *b = flags ? calloc(1, p->size) : malloc(p->size);
    if (!b) abort();
    p->allocated++;
    return b;
}

struct pool *pool_head_conn;

struct conn { int fd; void *owner; };

W struct conn *conn_new(void *owner) {
    struct conn *c = pool_get(pool_head_conn, 0);                /* site:conn */
    c->fd = -1;
    c->owner = owner;
    return c;
}

W int first_user(struct ev *ev) { return register_fd(ev, 1, ev)->fd; }
W int other_user(struct ev *ev, int fd) { return register_fd(ev, fd, NULL)->fd; }

int main(int argc, char **argv) {
    (void)argv;
    static struct node *slots[8];
    struct ev ev = { slots };
    struct rec *list = NULL;
    char *b[2];
    int *a = my_calloc(argc + 5, sizeof(int));                  /* site:a1 */
    long *c = my_calloc(argc + 5, sizeof(long));                /* site:a2 */
    first_user(&ev);
    for (int fd = 2; fd < 6; fd++)
        other_user(&ev, fd);
    for (int i = 0; i < 2; i++)
        b[i] = make_buf(100 + argc - 1);                        /* site:buf */
    for (int i = 0; i < 3; i++)
        list = make_rec(list);
    static const struct ops ops = { make_str, make_blob };
    struct obj o = { &ops, 0 };
    char *h[2];
    void *m1 = first_make(&o), *m2 = second_make(&o);
    void *d = make_str(20 + argc - 1);                           /* site:direct */
    void *b1 = call_blob(&o, 40), *b2 = call_blob(&o, 40);
    for (int i = 0; i < 2; i++)
        h[i] = dup_hook("0123456789", 10 + argc - 1);           /* site:hook */
    static struct pool conns = { 48, 0 };
    struct pool local = { 56, 0 };
    struct conn *cs[3];
    pool_head_conn = &conns;
    for (int i = 0; i < 3; i++)
        cs[i] = conn_new(&ev);
    char *pl = pool_get(&local, 0);                              /* site:pool */
    printf("%d %d %d %d\n", cs[2]->fd, conns.allocated, local.allocated, pl != NULL);
    printf("%d %ld %d %d %d %d %d %d\n", a[0], c[0], slots[3]->fd, b[0][0] == 0, list->name[0],
           h[0][1], m1 != m2 && d != b1 && b1 != b2, o.calls);
    return 0;
}
