/*
 * tracer/dumpdir.c: the files of a trace in the dump directory, which others may be able to
 * write to (/tmp).
 *
 * Every name is "mmleak.ID.SUFFIX" in cfg.dir.  A file is created O_EXCL|O_NOFOLLOW, mode 0600,
 * and reopened by name only if it is still the regular file of ours we made (struct fid);
 * names others took are skipped, then jumped past.  The file system uid of a thread that is
 * another user for a while is switched to the owner's for the one operation that needs it; a
 * daemon that drops root hands the files to its new user first; after chroot() the directory
 * is reached through a descriptor kept for it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

extern int renameat(int, const char *, int, const char *); /* <stdio.h> is not wanted here */

/* ---- files ----
 * Every file is named "mmleak.ID.SUFFIX" in cfg.dir.  After chroot() the directory may no
 * longer be reachable by its name: the chroot wrapper then keeps a descriptor of it (and of
 * /proc) and names are opened relative to that, checked before each use against the device
 * and inode it had (a daemon that closes every descriptor and reuses the number must not make
 * us write into its own directory). */

static int g_dirfd = -1;
int g_procfd = -1;
static dev_t g_dir_dev;
static ino_t g_dir_ino;
static uid_t g_give_uid = (uid_t)-1;   /* set*uid in progress or done: the files' new owner */
atomic_int g_said_write;
char *file_name(char *buf, size_t len, const char *suffix)
{
    char *e = buf + len, *d = buf;
    d = cat(d, e, "mmleak.");
    d = cat(d, e, g_id);
    cat(d, e, suffix);
    return buf;
}

static char *full_path(char *buf, size_t len, const char *name)
{
    char *e = buf + len, *d = buf;
    d = cat(d, e, cfg.dir);
    d = cat(d, e, "/");
    cat(d, e, name);
    return buf;
}

/* The directory descriptor, if we are in "after chroot" mode and it is still ours: -1 with
 * errno EBADF if the program took the number over; AT_FDCWD-style -100 otherwise. */
static int dir_fd(void)
{
    if (g_dirfd < 0)
        return AT_FDCWD;
    struct stat st;
    if (fstat(g_dirfd, &st) || st.st_dev != g_dir_dev || st.st_ino != g_dir_ino) {
        errno = EBADF;
        return -1;
    }
    return g_dirfd;
}

/* Whether we may create files in the dump directory now, as ourselves or as the files'
 * owner (AS_OWNER, below): a daemon that became another user for good may not, in a
 * directory of root's.  1 yes or unknown, 0 no. */
static int dir_access(int fd)
{
    /* AT_EACCESS: the file system uid, which fs_begin sets, not the real one */
    return fd == AT_FDCWD ? faccessat(AT_FDCWD, cfg.dir, W_OK | X_OK, AT_EACCESS)
                          : faccessat(fd, ".", W_OK | X_OK, AT_EACCESS);
}

int dir_writable(void)
{
    int fd = dir_fd(), e = errno;
    if (fd == -1)
        return 1;
    int rc = dir_access(fd);
    struct fs_scope fs;
    if (rc < 0 && (errno == EACCES || errno == EPERM) && fs_begin(&fs)) {
        rc = dir_access(fd);
        fs_end(&fs);
    }
    int no = rc < 0 && (errno == EACCES || errno == EPERM || errno == EROFS);
    errno = e;
    return !no;
}

/* A file server acts as another user in one thread for a while (nfs-ganesha, samba: a raw
 * setresuid, or setfsuid, around each request; glibc passes neither on to the other threads,
 * and we do not see them): our 0600 files are then out of that thread's reach.  So when one
 * of our file operations is refused, and the thread's file system uid is not the files'
 * owner but may become it again (its real, effective or saved uid is the owner's, or it is
 * root), it is done again as the owner, and the thread's own uid put back.  Only then: a
 * unit's seccomp filter may forbid setfsuid (SystemCallFilter=~@privileged kills the
 * process), and a thread that never changed its uid never needs it. */
uid_t g_owner;                   /* euid when the trace started: our files' owner */

static uid_t files_owner(void)
{
    return g_give_uid != (uid_t)-1 ? g_give_uid : g_owner;
}

/* The real, effective, saved and file system uids of the "Uid:" line of the status text B. */
static int status_uids(const char *b, unsigned long u[4])
{
    char *p = strstr(b, "\nUid:");
    if (!p)
        return -1;
    p += 5;
    for (int i = 0; i < 4; i++) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p < '0' || *p > '9')
            return -1;
        u[i] = strtoul(p, &p, 10);
    }
    return 0;
}

/* The thread's real, effective, saved and file system uids, from /proc (no setfsuid). */
static int thread_uids(unsigned long u[4])
{
    int fd = g_procfd >= 0 ? openat(g_procfd, "thread-self/status", O_RDONLY | O_CLOEXEC)
                           : open("/proc/thread-self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char b[2048];
    ssize_t n = read(fd, b, sizeof b - 1);
    close(fd);
    if (n <= 0)
        return -1;
    b[n] = 0;
    return status_uids(b, u);
}

/* Switch the file system uid to the owner's if the thread is another user now and may.  1 if
 * switched.  STATUS: this thread's /proc status text, just read, or NULL (it is read). */
int fs_begin_from(struct fs_scope *f, const char *status)
{
    f->switched = 0;
    int e = errno;
    unsigned long u[4];
    uid_t want = files_owner();
    if ((status ? status_uids(status, u) : thread_uids(u)) == 0 && u[3] != want &&
        (u[0] == want || u[1] == want || u[2] == want || u[1] == 0)) {
        f->old = (uid_t)u[3];
        setfsuid(want);
        f->switched = 1;
    }
    errno = e;
    return f->switched;
}

int fs_begin(struct fs_scope *f)
{
    return fs_begin_from(f, NULL);
}

void fs_end(struct fs_scope *f)
{
    if (f->switched) {
        int e = errno;
        setfsuid(f->old);
        errno = e;
    }
}

/* Do OP; when refused, and the thread is another user for now, once more as the owner. */
#define AS_OWNER(rc, op)                                                                      \
    do {                                                                                      \
        (rc) = (op);                                                                          \
        struct fs_scope fs_;                                                                  \
        if ((rc) < 0 && (errno == EACCES || errno == EPERM) && fs_begin(&fs_)) {              \
            (rc) = (op);                                                                      \
            fs_end(&fs_);                                                                     \
        }                                                                                     \
    } while (0)

/* The same operations by full path (no directory held open: dir_fd() gave AT_FDCWD, the
 * usual case before any chroot).  The paths are built in buffers of their own length, not
 * PATH_MAX: these are the deepest frames of a thread's first event and of a rotation, and a
 * thread may have little stack left there (it had 10 KB of buffers). */
enum { D_OPEN, D_UNLINK, D_RENAME, D_STAT };
static COLD int d_by_path(int op, const char *name, const char *to, int flags, mode_t mode)
{
    size_t dl = my_strlen(cfg.dir) + 2;     /* cfg.dir is shorter than PATH_MAX */
    char a[dl + my_strlen(name) + 1], b[to ? dl + my_strlen(to) + 1 : 1];
    const char *pa = full_path(a, sizeof a, name);
    int rc = -1;
    switch (op) {
    case D_OPEN:
        AS_OWNER(rc, openat(AT_FDCWD, pa, flags, mode));
        break;
    case D_UNLINK:
        AS_OWNER(rc, unlinkat(AT_FDCWD, pa, 0));
        break;
    case D_RENAME: {
        const char *pb = full_path(b, sizeof b, to);
        AS_OWNER(rc, renameat(AT_FDCWD, pa, AT_FDCWD, pb));
        break;
    }
    case D_STAT: {
        struct stat st;
        AS_OWNER(rc, fstatat(AT_FDCWD, pa, &st, AT_SYMLINK_NOFOLLOW));
        break;
    }
    }
    return rc;
}

int d_open(const char *name, int flags, mode_t mode)
{
    int dfd = dir_fd(), rc;
    if (dfd == -1)
        return -1;
    if (dfd == AT_FDCWD)
        return d_by_path(D_OPEN, name, NULL, flags, mode);
    AS_OWNER(rc, openat(dfd, name, flags, mode));
    return rc;
}

/* Whether anything stands at NAME (a file, a link, a FIFO: any would refuse our O_EXCL
 * create): 0 only when the name is surely free (ENOENT). */
int d_taken(const char *name)
{
    int dfd = dir_fd(), rc;
    struct stat st;
    if (dfd == -1)
        return 1;
    if (dfd == AT_FDCWD)
        rc = d_by_path(D_STAT, name, NULL, 0, 0);
    else
        AS_OWNER(rc, fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW));
    return rc == 0 || errno != ENOENT;
}

/* Whether the dump directory is one nobody but our files' owner (and root) can write to:
 * the owner's, with no write bit for its group or others (an ACL that lets anyone else
 * write shows in the group's bits, its mask).  There nobody else can put a file at one of
 * our names, so the files made only to hold a name (the log of loads, the lock) can wait
 * for their first need (reserve_id).  0 when unsure. */
int dir_private(void)
{
    int dfd = dir_fd();
    struct stat st;
    if (dfd == -1)
        return 0;
    int rc = dfd == AT_FDCWD ? stat(cfg.dir, &st) : fstat(dfd, &st);
    return rc == 0 && S_ISDIR(st.st_mode) && st.st_uid == g_owner && geteuid() == g_owner &&
           !(st.st_mode & 022);
}

int d_unlink(const char *name)
{
    int dfd = dir_fd(), rc;
    if (dfd == -1)
        return -1;
    if (dfd == AT_FDCWD)
        return d_by_path(D_UNLINK, name, NULL, 0, 0);
    AS_OWNER(rc, unlinkat(dfd, name, 0));
    return rc;
}

int d_rename(const char *from, const char *to)
{
    int dfd = dir_fd(), rc;
    if (dfd == -1)
        return -1;
    if (dfd == AT_FDCWD)
        return d_by_path(D_RENAME, from, to, 0, 0);
    AS_OWNER(rc, renameat(dfd, from, dfd, to));
    return rc;
}

/* Create one of our files: O_EXCL|O_NOFOLLOW, mode 0600, so a name somebody else made is
 * refused, never followed (O_NONBLOCK as everywhere: a FIFO is never opened by a create, but
 * no open of ours may ever wait).  ID, if given, gets the file's identity.  Under g_lock: a
 * daemon dropping root hands every file to its new user (give_files_to), and a file made by
 * another thread at that moment must be handed too. */
int create_locked(const char *name, struct fid *id)
{
    for (int tries = 0;; tries++) {
        int fd = d_open(name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                        0600);
        struct stat st;
        int known = fd >= 0 && fstat(fd, &st) == 0;
        /* the program's umask (0277, 0777) must not take our write; its usual 0022 or
         * 0077 left 0600 (one system call less for each file a start-up makes) */
        if (fd >= 0 && (!known || (st.st_mode & 07777) != 0600))
            fchmod(fd, 0600);
        if (known && g_give_uid == (uid_t)-1 && st.st_uid != g_owner) {
            /* made by a thread that is another user for now: the owner's, like the others */
            struct fs_scope f;
            if (fs_begin(&f)) {
                if (fchown(fd, g_owner, (gid_t)-1)) { /* then it stays that user's */ }
                fs_end(&f);
            }
        }
        if (fd >= 0 && id)
            *id = known ? (struct fid){ st.st_dev, st.st_ino } : (struct fid){ 0, 0 };
        if (fd < 0 || g_give_uid == (uid_t)-1 || !known || st.st_uid == g_give_uid ||
            fchown(fd, g_give_uid, (gid_t)-1) == 0 || tries)
            return fd;
        /* Created as root, and the switch happened before the fchown (glibc changes every
         * thread's ids with a signal, at any moment): create it again as the new user. */
        close(fd);
        d_unlink(name);
    }
}

/* Re-open one of our files by name: O_NOFOLLOW (a symbolic link is refused), O_NONBLOCK (a
 * FIFO put at the name can never make the program wait, with our lock held), and then we
 * refuse anything but a regular file of ours (root's files may belong to the user a daemon is
 * about to become: see give_files_to) that is still the file we made, when WANT says which
 * (a name whose file was deleted, by a compactor say, may since be another user's FIFO, or a
 * hard link to any file).  errno E_NOT_OURS when refused. */
int open_again(const char *name, int flags, const struct fid *want)
{
    int fd = d_open(name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
    if (fd < 0) {
        if (errno == ELOOP || errno == ENXIO || errno == EISDIR)
            errno = E_NOT_OURS;
        return -1;
    }
    struct stat st;
    uid_t me = geteuid();
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
        (st.st_uid != me && st.st_uid != files_owner() && me != 0) ||
        (want && want->ino && (st.st_dev != want->dev || st.st_ino != want->ino))) {
        close(fd);
        errno = E_NOT_OURS;
        return -1;
    }
    return fd;
}

/* ---- names others may have taken ----
 * Whoever can write to the dump directory (/tmp: anybody) can create files at the names a
 * process to come will use, thousands of them.  A taken name is skipped (O_EXCL refuses it);
 * after TAKEN_RUN taken names in a row the numbering jumps ahead by an amount nobody can
 * guess (unguessable(), tracer/unguessable.h), where nothing was planted, and goes on from
 * there: the process always gets its files, at the cost of a system call per taken name.  One
 * message says so. */

/* WHAT: "names of dump files in ", and what is done about it */
void say_taken(const char *what, const char *done)
{
    static atomic_int said;
    if (!atomic_exchange(&said, 1))
        say4(what, cfg.dir, " are taken by files mmleak did not make (planted by another "
             "user?): ", done);
}

/* RLIMIT_FSIZE: writing past it kills the program with SIGXFSZ.  So every size we give a file
 * is checked against it first (a system call per flush, next to the flush's own three). */
uint64_t fsize_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_FSIZE, &r) || r.rlim_cur == RLIM_INFINITY)
        return UINT64_MAX;
    return r.rlim_cur;
}

int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            if (w == 0)
                errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ---- setuid and friends: a daemon that drops root keeps being traced ----
 * Our files are 0600 and reopened by name at every flush; once the process is another user
 * it could not open them again.  So, just before the process drops root for good (no real,
 * effective or saved uid left 0), they are given to the new user (the dump directory must
 * let that user in and create files: /tmp does).  Not for a drop for a while (seteuid around
 * a request of a file server): that user would own the trace of a root process, its
 * addresses and all, for good (round 6 of the hostile users); the files stay root's, and a
 * thread refused them meanwhile does it again as root (fs_begin: its saved uid is 0). */

/* Hand one file to UID: by its descriptor, and only if the name is still the file we made
 * (a name freed meanwhile may be a hard link to anybody's file: chown by name would give
 * that file away). */
static void give_one(const char *name, const struct fid *id, uid_t uid)
{
    int fd = open_again(name, O_RDONLY, id);
    if (fd < 0)
        return;             /* gone, or not ours: nothing to do */
    if (fchown(fd, uid, (gid_t)-1)) { /* then it stays root's: flushes as UID will fail */ }
    close(fd);
}

/* R, E, S: the arguments of setresuid (-1: unchanged); RE: setreuid's rule for the saved uid
 * (set to the new effective uid when the real uid is set, or the effective one to another
 * than the real one). */
COLD void give_files_to(uid_t r, uid_t e, uid_t s, int re)
{
    uid_t none = (uid_t)-1;
    unsigned long u[4];                 /* (from /proc: no system call a filter may forbid) */
    if (g_state != 1 || g_pid != getpid() || IN_OWN_CODE(&T) || thread_uids(u))
        return;
    uid_t r0 = (uid_t)u[0], e0 = (uid_t)u[1], s0 = (uid_t)u[2];
    uid_t r1 = r == none ? r0 : r, e1 = e == none ? e0 : e;
    uid_t s1 = re ? (r != none || (e != none && e != r0) ? e1 : s0) : s == none ? s0 : s;
    if (!r1 || !e1 || !s1 || files_owner() != 0)
        return;                         /* root still (or again) within reach; not root's */
    /* from a drop for a while, this thread is root again for the handover (the system call:
     * this thread alone) */
    if (e0 != 0 && (r0 != 0 && s0 != 0 ? 1 : mml_sys(SYS_setresuid, none, 0, none) != 0))
        return;
    GUARDED;
    uid_t uid = e1;
    char name[64];
    /* Under g_lock, which every creation of a file of ours holds too: a file another thread
     * creates from now on is handed over at once (create_locked), none slips between. */
    pthread_mutex_lock(&g_lock);
    g_give_uid = uid;
    /* the files that were to wait for a first need (reserve_id): the new user may not be
     * able to make them, so they are made now, and handed over by create_locked */
    if (g_loads_later) {
        int fd = create_locked(file_name(name, sizeof name, ".loads"), &g_loads_id);
        if (fd >= 0)
            close(fd);
        g_loads_later = 0;
    }
    if (g_lock_later) {
        int fd = create_locked(file_name(name, sizeof name, ".lock"), &g_lock_id);
        if (fd >= 0)
            close(fd);
        else
            g_lock_id = (struct fid){ 0, 0 };
        g_lock_later = 0;
    }
    for (size_t i = 0; i < R.n; i++)
        if (R.a[i].state == SLOT_OPEN || R.a[i].state == SLOT_PARKED) {
            give_one(dump_name(name, sizeof name, R.a[i].fileno), &R.a[i].out_id, uid);
            give_one(side_name(name, sizeof name, R.a[i].fileno, ".tail"), &R.a[i].tail_id, uid);
        }
    if (g_late_file != ~0u)
        give_one(dump_name(name, sizeof name, g_late_file), &g_late_id, uid);
    give_one(file_name(name, sizeof name, ".maps"), &g_maps_id, uid);
    give_one(file_name(name, sizeof name, ".loads"), &g_loads_id, uid);
    if (g_lock_id.ino)
        give_one(file_name(name, sizeof name, ".lock"), &g_lock_id, uid);
    /* The threads the process starts from now on make their files as UID: when the directory
     * does not let UID create any (a daemon started as root in mmleak.py run's own directory,
     * root's, 0755), they would have none, and their events would be lost.  So the shared
     * late file is made now, while we still may (given to UID, as above), and takes their
     * lines (threadfile.c, sink_flush).  Asked as UID (the file system uid, this thread, for
     * the one call; setfsuid is in the same group of system calls as the set*uid the program
     * is making, so a seccomp filter that lets that through lets this through). */
    int dfd = dir_fd();
    if (dfd != -1) {
        int old = setfsuid(uid);
        int no = dir_access(dfd) < 0 && (errno == EACCES || errno == EPERM || errno == EROFS);
        setfsuid((uid_t)old);
        if (no)
            sink_make_locked();
    }
    pthread_mutex_unlock(&g_lock);
    if (e0 != 0)
        mml_sys(SYS_setresuid, none, e0, none);
}

/* ---- chroot: the dump directory may be out of reach by name afterwards ----
 * So we keep a descriptor of it (and of /proc, for the maps), and name our files relative to
 * it from then on, checking before each use that it is still the same directory (see dir_fd).
 * This is the one descriptor mmleak keeps open, and only in a process that called chroot(). */
COLD void hold_dir(void)
{
    if (g_state <= 0 || g_pid != getpid() || IN_OWN_CODE(&T))
        return;
    GUARDED;
    pthread_mutex_lock(&g_lock);
    if (g_dirfd < 0) {
        int fd = open(cfg.dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0) {
            g_dir_dev = st.st_dev;
            g_dir_ino = st.st_ino;
            g_dirfd = fd;
        } else if (fd >= 0) {
            close(fd);
        }
    }
    if (g_procfd < 0)
        g_procfd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
    pthread_mutex_unlock(&g_lock);
}

