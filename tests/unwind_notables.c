/* Part of tests/unwind_check: compiled with -fno-asynchronous-unwind-tables -fno-unwind-tables,
 * so this function has no CFI; a walk must stop at its frame. */
void notables_call(void (*fn)(void));

__attribute__((noinline)) void notables_call(void (*fn)(void))
{
    volatile char buf[40];
    buf[0] = 0;
    fn();
    buf[1] = buf[0];
}
