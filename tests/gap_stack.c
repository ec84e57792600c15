/* tests/test_stacks.py: whole stacks through objects whose PT_LOAD segments are far apart.
 * A 2 MiB-aligned array in .bss (as huge-page-aligned data, or -z max-page-size=0x200000,
 * lay objects out) puts a gap between the object's data and its .bss segment.  The kernel
 * maps a program's segments one by one, so glibc 2.36's _dl_find_object then reports the
 * segment holding the pc (the text) as the program's range, and its .eh_frame_hdr lies in
 * another segment; a shared library is mapped by ld.so over one reserved span, gap included.
 * Built twice from this file: with -DGAP_LIB as libgap_stack.so (lib_rec, lib_leaf), and as
 * the program (prog_rec, main), linked with it.  main -> prog_rec x4 -> lib_rec x3 ->
 * lib_leaf, which leaks one block of 4321 bytes: its stack must name every one of those
 * frames down to main.  Prints "ok". */
#include <stdio.h>
#include <stdlib.h>

#define NOINLINE __attribute__((noinline))

/* the gap: an object whose .bss starts at a 2 MiB boundary */
static char far_away[4096] __attribute__((aligned(1 << 21)));

#ifdef GAP_LIB
void *volatile gap_sink;

NOINLINE void lib_leaf(void)
{
    gap_sink = malloc(4321);
    far_away[0]++;
}

/* not a tail call: each level keeps its frame */
NOINLINE int lib_rec(int k)
{
    if (k == 0)
        lib_leaf();
    else
        lib_rec(k - 1);
    return far_away[k]++;
}
#else
int lib_rec(int k);

NOINLINE static int prog_rec(int k)
{
    int r = k == 0 ? lib_rec(2) : prog_rec(k - 1);
    return r + far_away[k]++;
}

int main(void)
{
    prog_rec(3);
    puts("ok");
    return far_away[100];
}
#endif
