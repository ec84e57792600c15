/* scan_api.c: the program asks for scans itself (include/mmleak.h): first with nothing lost
 * (prints 0), then after leaking one block (prints 1).  Without mmleak.so it prints -1 -1.
 *
 * scan_api rbx (x86-64): a block of 4321 bytes whose only copy is in %rbx, a callee-saved
 * register, while the program asks for a scan: mmleak.so's frames below the call must not be
 * scanned (they hold stale copies of addresses), but the registers they save are the
 * program's: the block is reachable (prints 0), then freed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmleak.h"

void *g_kept;

__attribute__((noinline)) static void leak(void)
{
    volatile char *p = malloc(4321);
    p[0] = 1;
}

__attribute__((noinline)) static void wipe(void)
{
    volatile char junk[64 * 1024];
    memset((char *)junk, 0, sizeof junk);
}

#if defined(__x86_64__)
/* int held_in_rbx(void): malloc(4321) into %rbx only, mmleak_do_leak_check(), free(%rbx).
 * No other copy: malloc's return register is overwritten by the call's, and nothing of this
 * function is on its stack but the caller's %rbx. */
int held_in_rbx(void);
__asm__(".text\n"
        ".globl held_in_rbx\n"
        ".type held_in_rbx, @function\n"
        "held_in_rbx:\n"
        "    push %rbx\n"                       /* the stack is 16-byte aligned for calls */
        "    mov $4321, %edi\n"
        "    call malloc@PLT\n"
        "    mov %rax, %rbx\n"
        "    xor %eax, %eax\n"
        "    xor %edi, %edi\n"
        "    xor %esi, %esi\n"
        "    xor %edx, %edx\n"
        "    xor %ecx, %ecx\n"
        "    xor %r8d, %r8d\n"
        "    xor %r9d, %r9d\n"
        "    xor %r10d, %r10d\n"
        "    xor %r11d, %r11d\n"
        "    call mmleak_do_leak_check@PLT\n"
        "    push %rax\n"
        "    sub $8, %rsp\n"
        "    mov %rbx, %rdi\n"
        "    call free@PLT\n"
        "    add $8, %rsp\n"
        "    pop %rax\n"
        "    pop %rbx\n"
        "    ret\n"
        ".size held_in_rbx, .-held_in_rbx\n");
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "rbx")) {
#if defined(__x86_64__)
        if (!mmleak_do_leak_check)
            return 2;
        wipe();
        printf("%d\n", held_in_rbx());
        return 0;
#else
        return 3;
#endif
    }
    g_kept = malloc(100);
    int a = mmleak_leak_check();
    leak();
    wipe();
    int b = mmleak_leak_check();
    printf("%d %d\n", a, b);
    return 0;
}
