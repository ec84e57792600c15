/* tools/scan_park.h: the other threads of a process that mmleak.so stopped for its scan (at
 * exit, or mmleak_leak_check) with a signal of its own, not ptrace (tracer/park.c;
 * mmleak-scan(7), "Threads that ptrace may not stop"), as the scan in its CLONE_VM child
 * takes them (tools/scan_stop.c, hold_here): each parked thread's registers, as its handler
 * read them from its ucontext. */
#ifndef MMLEAK_SCAN_PARK_H
#define MMLEAK_SCAN_PARK_H

#include <sys/user.h>

enum { MML_PARK_ASKED, MML_PARK_HELD, MML_PARK_ENDED, MML_PARK_GAVE_UP, MML_PARK_TAKING };

/* A slot's state word: MML_PARK_* in its low 4 bits, the park's number above (parks repeat
 * while the program runs, mmleak_leak_check: a handler late from an earlier one must find
 * its number gone, never take a slot of this one) */
#define MML_PARK_STATE(st) ((st) & 15)

struct mml_park_slot {
    int tid;
    int state;                          /* MML_PARK_* and the park's number (atomic: the
                                         * handler and the parker) */
    struct user_regs_struct regs;       /* MML_PARK_HELD: its registers where it stopped */
};

struct mml_park {
    struct mml_park_slot *slot;
    int n;                              /* slots in use */
    int sig;                            /* the signal used */
    char why[240];                      /* not every thread held: why (the scan then fails
                                         * with it: "#status unknown"); "" when all were */
};

#endif
