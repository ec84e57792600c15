/* tests/inject_slowctor.c: a library whose constructor does not return for ARG seconds
 * (tests/inject_target.c `ctor`): the loader's lock stays held meanwhile. */
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void slow(void)
{
    const char *s = getenv("SLOWCTOR_SECONDS");
    sleep(s ? atoi(s) : 30);
}
