/* tests/inject_slowctor.c: a library whose constructor does not return until the test says
 * so (tests/inject_target.c `ctor`): the loader's lock stays held meanwhile.  It returns
 * when a byte (or the end) comes on stdin. */
#include <unistd.h>

__attribute__((constructor)) static void slow(void)
{
    char c;
    if (read(0, &c, 1) < 0)
        _exit(3);
}
