/* Loaded and unloaded by tests/unwind_check ("dl" mode), built twice: FRAME=200 (a) and
 * FRAME=1000 (b).  The code of both has the same layout (the frame size is a 32-bit immediate
 * in both), so their return addresses are at the same offsets but with different CFA rules:
 * a stale cached rule of a, used for b loaded at the same address, gives wrong frames. */
#ifndef FRAME
#define FRAME 200
#endif
static volatile int lsink;

__attribute__((noinline)) void lib_inner(void (*cb)(const char *), const char *site)
{
    volatile char buf[FRAME];
    buf[0] = 1;
    cb(site);
    lsink += buf[0] + buf[FRAME - 1];
}

void lib_entry(void (*cb)(const char *), const char *site)
{
    lib_inner(cb, site);
    lsink++;
}
