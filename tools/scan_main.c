/* tools/scan_main.c: mmleak-scan, the scanner mmleak.so starts at the exit of a traced
 * process (tracer/exitscan.c), installed beside mmleak.so.  Never preloaded (the tracer
 * takes LD_PRELOAD out of its environment).
 *
 *   mmleak-scan PID DIR ID WHY [READY_FD [TID FLOOR [NFILES [SP FS GS | park]]]]
 *
 * READY_FD: a socket the process sends one byte to once it allowed us to trace it
 * (PR_SET_PTRACER): we wait for it first; when no result could be written, we send back
 * why on it (mmleak.so keeps it in the trace: the "#noscan" line, mmleak-format(5)).
 * Every other inherited descriptor is closed.
 * TID FLOOR (decimal, hexadecimal): the thread that asked waits in mmleak.so, below FLOOR
 * on its stack; only its stack from FLOOR up is scanned (tools/scan.c, mmleak_scan_floor).
 * NFILES (0: unknown): the trace's dump files are numbered below it (tools/scan_cut.c).
 * SP FS GS (hexadecimal): thread TID was the process's only one, and waits with every
 * signal blocked; its stack pointer and thread pointers.  If it is still alone, it is not
 * stopped (tools/scan_stop.c, hold_here).  "park": mmleak.so can stop the other threads
 * itself (tracer/park.c): should the kernel refuse to let us trace one, we write nothing
 * and exit with 5, and mmleak.so parks them and scans in a child of its own.
 * The scan is tools/scan.c's mmleak_scan; the result is DIR/mmleak.ID.scan.S.  Exit status:
 * 0 done, nothing definitely or indirectly lost; 1 done, some is; 2 the scan could not be
 * done (the result says why); 3 no result written; 5 (with "park") a thread could not be
 * traced, nothing written.  Bounded:
 * past MMLEAK_SCAN_SECS seconds (default 60) it is killed by SIGALRM, and the kernel lets
 * the process go on (a tracer's death detaches it). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

#include <stdint.h>

struct mml_park;                        /* (mmleak.so's: tools/scan_park.h) */
extern int mmleak_scan_may_park;        /* tools/scan.c */
int mmleak_scan_floor(int pid, const char *dir, const char *id, const char *why, char *out,
                      size_t outlen, char *err, size_t errlen, uint64_t *totals,
                      int floor_tid, uint64_t floor, int nfiles, const uint64_t *lone,
                      const struct mml_park *park);
unsigned mmleak_scan_secs(void);
void mmleak_scan_limits(void);

int main(int argc, char **argv)
{
    int park = argc == 10 && !strcmp(argv[9], "park");
    if (argc < 5 || argc > 12 || argc == 7 || (argc == 10 && !park) || argc == 11) {
        /* a newcomer who finds this program beside mmleak.so: the command to use */
        fprintf(stderr, "usage: mmleak-scan PID DIR ID WHY [READY_FD [TID FLOOR [NFILES "
                "[SP FS GS | park]]]]\n(mmleak.so starts it at a traced process's exit; "
                "to scan a running process: mmleak.py scan PID)\n");
        return 2;
    }
    int nfiles = argc >= 9 ? atoi(argv[8]) : 0;
    int ready = argc >= 6 ? atoi(argv[5]) : -1;
    int floor_tid = argc >= 8 ? atoi(argv[6]) : 0;
    uint64_t floor = argc >= 8 ? strtoull(argv[7], NULL, 16) : 0;
    uint64_t lone[3] = { 0 };
    for (int k = 0; argc == 12 && k < 3; k++)
        lone[k] = strtoull(argv[9 + k], NULL, 16);
    /* the process's descriptors are not ours to hold (a daemon's sockets...) */
    if (ready < 0 ? close_range(3, ~0u, 0) :
        ready < 3 || (ready > 3 && close_range(3, (unsigned)ready - 1, 0)) ||
        close_range((unsigned)ready + 1, ~0u, 0))
        for (int fd = 3; fd < 1024; fd++)       /* a kernel before 5.9 */
            if (fd != ready)
                close(fd);
    if (ready >= 0) {
        char c;
        while (read(ready, &c, 1) < 0)
            ;
    }
    /* mmleak.so starts us with every signal blocked (tracer/exitscan.c), and a program may
     * have blocked or ignored SIGALRM: our time limit is SIGALRM's default action */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGALRM, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    mmleak_scan_limits();
    alarm(mmleak_scan_secs());
    mmleak_scan_may_park = park;
    char out[4200], err[512];
    uint64_t totals[8] = { 0 };
    int rc = mmleak_scan_floor(atoi(argv[1]), argv[2], argv[3], argv[4], out, sizeof out,
                               err, sizeof err, totals, floor_tid, floor, nfiles,
                               argc == 12 ? lone : NULL, NULL);
    if (rc == 2)
        return 5;                       /* ptrace refused: mmleak.so parks the threads */
    if (rc < 0) {
        fprintf(stderr, "mmleak-scan: %s\n", err);
        /* and to the process, which keeps it in its dump file: a daemon's user never sees
         * our stderr (tracer/exitscan.c, note_scan_error) */
        if (ready >= 0 && write(ready, err, strnlen(err, sizeof err)) < 0) {
            /* (the process reports the missing result without its reason) */
        }
    }
    if (rc)
        return rc < 0 ? 3 : 2;
    return totals[0] || totals[2] ? 1 : 0;     /* definitely or indirectly lost blocks */
}
