/* tools/scan_glibc.h: what the scan needs of glibc's thread descriptor (tools/scan_glibc.c). */
#ifndef MMLEAK_SCAN_GLIBC_H
#define MMLEAK_SCAN_GLIBC_H
#include <stdint.h>

/* struct pthread's size and where two of its fields are, as the libc.so.6 that the process
 * runs says to debuggers (its _thread_db_* descriptors, the ones libthread_db reads). */
struct mml_pthread_layout {
    uint32_t size;          /* sizeof (struct pthread) */
    uint32_t tid;           /* offset of tid (int): 0 or -1 once the thread has exited */
    uint32_t cancel;        /* offset of cancelhandling (int) */
};

/* glibc's TERMINATED_BIT of cancelhandling (nptl/descr.h, the same since glibc 2.3): the
 * thread was joined, or was detached and exited; its stack went back to glibc's cache */
#define MML_PTHREAD_TERMINATED 0x20

/* Fill L from PATH (the libc.so.6 of the process, opened as PATH, or /proc/PID/root/PATH
 * first).  0 done, -1 not found (another libc, a stripped dynamic symbol table). */
int mml_pthread_layout(int pid, const char *path, struct mml_pthread_layout *l);

#endif
