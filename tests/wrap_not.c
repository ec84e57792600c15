/* Counterexamples, and a constructor.  register_name allocates for its own use (the record
 * goes into a list; it returns a count) under two callers: it is no wrapper, its own line is
 * the site: 2 x 32 at the own line.  make_node is a constructor: it returns the block it allocated,
 * but of a size fixed in its code (sizeof *n), so it is no wrapper and its own line is the
 * site for both callers: 5 x 16 at the node line (the callers are in the stack).  A function that
 * returns printf's result after allocating through the runtime (stdio's buffer) is no wrapper
 * either (not checked: it did not call an allocator).  keep_block allocates a block of its
 * caller's size and keeps it (a list of its own), returning nothing: rax still holds the block
 * at its ret, but its caller never reads rax (the loop, then `return 0`: xor eax,eax, which
 * writes rax and reads nothing), so it is no wrapper: 4 x 40 at the keep line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W __attribute__((noipa))

struct rec { struct rec *next; char name[24]; };
static struct rec *records;
static int nrecords;

W int register_name(const char *name) {
    struct rec *r = malloc(sizeof *r);               /* site:own */
    if (!r) abort();
    strncpy(r->name, name, sizeof r->name - 1);
    r->name[sizeof r->name - 1] = 0;
    r->next = records;
    records = r;
    return ++nrecords;
}

struct node { struct node *next; int key; };

W struct node *make_node(int key, struct node *next) {
    struct node *n = malloc(sizeof *n);              /* site:node */
    if (!n) abort();
    n->key = key;
    n->next = next;
    return n;
}

struct blk { struct blk *next; char pad[32]; };
static struct blk *kept;

W void keep_block(size_t size) {
    struct blk *b = malloc(size);                    /* site:keep */
    if (!b) abort();
    b->next = kept;
    kept = b;
}

W int keep_blocks(int n, size_t size) {
    for (int i = 0; i < n; i++)
        keep_block(size);
    return 0;
}

W int first_user(void) { return register_name("first"); }
W int second_user(void) { return register_name("second"); }

int main(void) {
    struct node *list = NULL, *other = NULL;
    first_user();
    keep_blocks(4, sizeof(struct blk));
    second_user();
    for (int i = 0; i < 3; i++)
        list = make_node(i, list);
    for (int i = 0; i < 2; i++)
        other = make_node(10 + i, other);
    printf("%d %d %d\n", nrecords, list->key, other->key);
    return 0;
}
