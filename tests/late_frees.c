/* late_frees.c: frees after mmleak.so's destructor, as a daemon's libraries make them (ngircd:
 * GnuTLS's destructor frees its libtasn1 blocks), in a process that became another user
 * (test_dumpdir_tracer.py).  Built twice: -DLIB, a shared library whose constructor
 * allocates 50 blocks of 24 bytes and whose destructor frees them (the executable needs it,
 * so ld.so runs that destructor after mmleak.so's); and the executable, which becomes
 * argv[1] with setuid, allocates one block of 33 bytes, kept, and exits. */
#include <stdlib.h>
#include <unistd.h>

#ifdef LIB
static void *volatile held[50];

__attribute__((constructor)) static void up(void)
{
    for (int i = 0; i < 50; i++)
        held[i] = malloc(24);
}

__attribute__((destructor)) static void down(void)
{
    for (int i = 0; i < 50; i++)
        free(held[i]);
}
#else
int main(int argc, char **argv)
{
    static void *volatile keep;
    if (argc != 2 || setuid((uid_t)atoi(argv[1])))
        return 1;
    keep = malloc(33);
    return 0;
}
#endif
