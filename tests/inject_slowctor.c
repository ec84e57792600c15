/* tests/inject_slowctor.c: a library whose constructor does not return until the test says
 * so (tests/inject_target.c `ctor`): the loader's lock stays held meanwhile.  It returns
 * when a byte (or the end) comes on stdin, or, with SLOWCTOR_SECONDS, after that many
 * seconds (a test of the injector's own deadline, which needs the lock freed at a time). */
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void slow(void)
{
    const char *s = getenv("SLOWCTOR_SECONDS");
    char c;
    if (s)
        sleep(atoi(s));
    else if (read(0, &c, 1) < 0)
        _exit(3);
}
