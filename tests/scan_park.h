/* scan_park.h: what tests/scan_park.c and tests/scan_park_api.c share (test_scan_park.py):
 * a thread that blocks every signal, and a block lost without a copy of its address left
 * below the caller's frame. */
#ifndef SCAN_PARK_H
#define SCAN_PARK_H

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 64 KiB of the stack below the caller zeroed (the frames of the calls it made before).
 * The asm says the zeroes are read: a memset of a local array nobody reads is a dead
 * store, which the compiler drops (with the volatile cast away, it did: wipe was empty). */
__attribute__((noinline)) static void wipe(void)
{
    char junk[64 * 1024];
    memset(junk, 0, sizeof junk);
    __asm__ volatile("" : : "r"(junk) : "memory");
}

__attribute__((noinline)) static void lose(size_t n)
{
    void *volatile p = malloc(n);
    p = NULL;
    (void)p;
}

/* Every signal blocked, then "b" to READY and a wait in read() on WAIT (a byte, or never) */
static void block_all_and_wait(int ready, int wait)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    char c;
    (void)!write(ready, "b", 1);
    (void)!read(wait, &c, 1);
}

#endif
