/*
 * tracer/threadfile.c: a thread's dump files and the path of its lines into them.
 *
 * Owns: the staging halves (a MAP_SHARED .tail file: nothing completed is lost to SIGKILL),
 * their flush into the .out file (with the ext4 preallocation and page padding measured
 * below), opening, rotating and closing files, the registry of files and the parking of an
 * ended thread's file for the next new thread, holding lines in memory and dropping (counted)
 * when nothing can be written, the late file of events after a thread's or the process's
 * end, and emit, the writer of a line built elsewhere.  All of it is the cold path: the hot
 * path only writes at the cursor of the current half (record.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "record.h"
#include "unwind.h"

/* ---- per-thread files: the staging area and the dump file ----
 *
 * Events are written into a small shared mapping of mmleak.ID.N.tail (two halves, reused)
 * and, one half at a time, appended to mmleak.ID.N.out with pwrite().  Why not map the .out
 * file and write there directly: every fresh page of a growing file mapping costs a fault
 * (or a populate), a zeroing and a TLB entry, and that came to twice the rest of an event;
 * the kernel's write path fills page cache far more cheaply, and the staging pages stay hot
 * in the cache.  The staging file is a shared mapping, so a killed process loses nothing:
 * each half starts with "#at OFFSET", where in .out its lines belong, and readers append
 * what .out does not have yet (`mmleak.py recover` folds it in for good).  A clean close
 * flushes the last half and deletes the .tail: the .out file is then exact.
 *
 * When a flush fails (disk full, no descriptor left, the file size limit), nothing staged is
 * thrown away: the half stays pending in the .tail (readers find it there) and the thread
 * goes on in the other half; the next flush writes the pending half first.  Only when both
 * halves are pending does the thread drop events, counting them, and try again once a second:
 * "#dropping" marks where that began, "#lost N" how many events are missing, and every
 * report then says the trace is incomplete. */

/* HALF_HDR (internal.h): the "#at" line's room.  SLACK (internal.h): the end of every half
 * is kept free for signal handlers: an event recorded by a handler that interrupted us in the
 * middle of a line must not flush the half under that line, so when the half is full it goes
 * here instead (see emit). */
#define START_HALF (32 * 1024)

char *side_name(char *buf, size_t len, unsigned n, const char *ext)
{
    char num[32], *d = num;
    d = cat(d, num + sizeof num, ".");
    d = cat_u(d, num + sizeof num, n);
    cat(d, num + sizeof num, ext);
    return file_name(buf, len, num);
}

char *dump_name(char *buf, size_t len, unsigned n)
{
    return side_name(buf, len, n, ".out");
}


/* ---- the registry of files, in mmleak's own memory ----
 * Never in a thread's TLS: glibc gives a dead thread's TLS to the next thread, zeroed.  fork
 * unmaps the staging areas of the threads that do not exist in the child; a daemon dropping
 * root hands the files over; a thread's file is parked here when it ends, for the next new
 * thread (a program that starts thousands of short threads writes about as many files as it
 * ever had threads at once).  Under g_lock. */
struct file_registry R;     /* struct file_slot: internal.h */

static int slot_new_locked(unsigned fileno)
{
    size_t i = 0;
    while (i < R.n && R.a[i].state != SLOT_FREE)
        i++;
    if (i == R.n) {
        struct file_slot *a = mml_grow(R.a, &R.cap, R.n + 1, sizeof *a);
        if (!a)
            return 0;
        R.a = a;
        R.n++;
    }
    R.a[i] = (struct file_slot){ .state = SLOT_OPEN, .fileno = fileno };
    return (int)i + 1;
}

static void slot_sync(struct tstate *t)
{
    if (!t->slot)
        return;
    pthread_mutex_lock(&g_lock);
    struct file_slot *s = &R.a[t->slot - 1];
    s->fileno = t->fileno;
    s->stage = t->stage;
    s->half_size = t->half_size;
    s->out_id = t->out_id;
    s->tail_id = t->tail_id;
    pthread_mutex_unlock(&g_lock);
}

static void slot_free(struct tstate *t)
{
    if (!t->slot)
        return;
    pthread_mutex_lock(&g_lock);
    R.a[t->slot - 1].state = SLOT_FREE;
    pthread_mutex_unlock(&g_lock);
    t->slot = 0;
}

/* The staging halves given up.  Not unmapped when the process ends: its memory goes with
 * it, at once (a munmap, after the exit scan's child shared the address space, was 0.6 % of
 * a small program's samples under the tracer: mmleak-performance-heap(7), "Start-up and exit,
 * the scan at exit's costs counted"). */
void stage_drop(struct tstate *t)
{
    if (t->stage && !g_ending)
        mml_unmap(t->stage, 2 * t->half_size);
    t->stage = NULL;
    t->cur = t->end = NULL;
    t->ustart[0] = t->ustart[1] = t->ulen[0] = t->ulen[1] = 0;
}

/* The staging file FD's two halves of HALF bytes, mapped shared.  MADV_RANDOM: the first
 * touch of the mapping (the first half's "#at" line) would otherwise read ahead the whole
 * file, 16 pages of a 64 KiB file allocated, zeroed (its blocks are fallocated, unwritten)
 * and put in the page cache where a small program's lines need one: 1.5 % of the samples
 * of a start-up and exit under the tracer (mmleak-performance-heap(7), "Start-up and exit,
 * the files a start makes").  A page is then read when first written, which the halves'
 * writing does in order, page after page, each a fault anyway. */
static void *stage_map(int fd, size_t half)
{
    void *p = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        int e = errno;
        (void)madvise(p, 2 * half, MADV_RANDOM);
        errno = e;
    }
    return p;
}

static char *half_body(const struct tstate *t, int h)
{
    return t->stage + (size_t)h * t->half_size + HALF_HDR;
}

static void half_stamp(struct tstate *t, int h);

/* Begin writing into half h (which holds nothing unflushed): clear it first (so a line torn
 * by a kill is followed by NULs, never by the stale end of an older line), then stamp where
 * its lines go in .out: after the held lines and the other half's pending ones, if any. */
void half_start(struct tstate *t, int h)
{
    memset(t->stage + (size_t)h * t->half_size, 0, t->half_size);
    atomic_signal_fence(memory_order_seq_cst);
    half_stamp(t, h);
}

/* The same for a half that is zeros already: a staging file just made (fallocated, never
 * written) or anonymous memory just mapped.  The clearing wrote every page of the half: a
 * page fault each (on ext4, a block reserved for each page of the shared mapping), the
 * first half of a new thread's file 8 pages where its first lines need one or two: 2.5 %
 * of the samples of a small program's start-up and exit under the tracer
 * (mmleak-performance-heap(7), "Start-up and exit, the scan at exit's costs counted"). */
static void half_stamp(struct tstate *t, int h)
{
    char *b = t->stage + (size_t)h * t->half_size;
    char hdr[HALF_HDR], *d = hdr;
    memcpy(d, "#at ", 4);
    d = hexw(d + 4, t->out_off + t->hold_len + t->ulen[h ^ 1], 16);
    while (d < hdr + HALF_HDR - 1)
        *d++ = ' ';
    *d = '\n';
    memcpy(b, hdr, HALF_HDR);
    t->half = h;
    t->ustart[h] = t->ulen[h] = 0;
    t->cur = b + HALF_HDR;
    t->end = b + t->half_size - SLACK;
}

/* A flush of a busy thread reserves the blocks of what it is about to append with
 * fallocate(FALLOC_FL_KEEP_SIZE) before the pwrite, on ext4.  ext4 allocates the blocks of a
 * plain write late (delayed allocation), and reserving them page by page in the write costs
 * more than one call that allocates the whole range as one extent: measured on this
 * project's VM (bench/append_bench.c, the append section of make bench), appending in 512 KiB
 * writes cost 5.53 ns per 33 bytes (an event) without the call and 4.01 with it, the whole
 * machine's time with the later writeback included 7.4 and 6.2; the file's size is not
 * changed, so readers never see a byte the write did not put there.  It only pays for big
 * writes (64 KiB writes gained nothing), and not on tmpfs, where it costs a little (pages
 * zeroed, then written): other file systems are left as they were, unmeasured.  Files that
 * compaction deletes within seconds (MMLEAK_ROTATE_MB=8) are reserved too: measured, writing
 * 8 MB files and deleting them at once cost the same either way (9-10 ns per 33 bytes).  A
 * hint: when it fails the write allocates as it always did, and reports a full disk itself. */
#define PREALLOC_MIN (256 * 1024)
#define EXT4_MAGIC 0xEF53
static int g_prealloc;

void prealloc_decide(void)
{
    struct statfs sf;
    g_prealloc = statfs(cfg.dir, &sf) == 0 && sf.f_type == EXT4_MAGIC;
}

/* Such a flush also ends on a page boundary of .out, with a line of blanks (readers skip
 * blank lines; about 100 bytes per 512 KiB flush, since a full half's lines end a little
 * before a page boundary).  A write that starts in the middle of a page cost about 1 ns per
 * event more on ext4 (alloc_bench, MMLEAK_DEPTH=1, medians of 11 interleaved runs: -0.94 ns
 * with the padding), the kernel's page cache handling the partial first page and smaller
 * folios.  Not after "#end" (readers know a closed file by its last line): only the flush of
 * a full half pads (make_room).  The padding is written after the lines and before the next
 * half is stamped with its "#at", so a process killed in between leaves complete lines and
 * at most part of the blank line, without its newline, at the end of .out, which readers
 * take for padding, as they take the NULs of older files. */
#define PAD_PAGE 4096
static const char g_pad_line[PAD_PAGE] = { [0 ... PAD_PAGE - 2] = ' ', [PAD_PAGE - 1] = '\n' };

static size_t pad_size(uint64_t end)
{
    return (size_t)((PAD_PAGE - end % PAD_PAGE) % PAD_PAGE);
}

static void pad_out(int fd, struct tstate *t, size_t pad)
{
    ssize_t w = pwrite(fd, g_pad_line + PAD_PAGE - pad, pad, (off_t)t->out_off);
    if (w == (ssize_t)pad)
        t->out_off += pad;
    else if (w > 0 && ftruncate(fd, (off_t)t->out_off)) {
        /* part of the blank line stays past out_off; the next flush writes over it */
    }
}

/* Write the *LEN bytes at BASE + *START at the end of .out; *START and *LEN follow what was
 * written (a failed write leaves the rest pending).  0, or -1 (errno). */
static int write_pending(int fd, struct tstate *t, const char *base, size_t *start, size_t *len)
{
    while (*len) {
        ssize_t w = pwrite(fd, base + *start, *len, (off_t)t->out_off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            return -1;
        }
        *start += (size_t)w;
        *len -= (size_t)w;
        t->out_off += (uint64_t)w;
    }
    return 0;
}

/* Write half h's pending lines at the end of .out. */
static int write_half(int fd, struct tstate *t, int h)
{
    return write_pending(fd, t, half_body(t, h), &t->ustart[h], &t->ulen[h]);
}

/* ---- holding: lines that cannot be written yet wait in memory ----
 * When a flush fails (no descriptor left, a full disk, a name taken away) while the other half
 * still waits too, the older half's lines move to an anonymous buffer, the hold, and the thread
 * goes on in that half: no event is dropped while memory allows (MMLEAK_HOLD_MB, for all the
 * process's holds together).  Every flush writes the hold first, then the halves; a half's
 * "#at" counts the held bytes before it.  While anything is held the thread comes to the slow
 * path every HOLD_STEP bytes of events (its `end` is set that much ahead, see set_end) and
 * tries to write everything: the lines are in the file as soon as it can take them, at the
 * cost of a failed system call or two per HOLD_STEP bytes while it cannot, and nothing on the
 * fast path.  Held lines are only in memory: every half begun while lines are held starts
 * with "#dropping k=K", so a process killed meanwhile leaves a gap every report sees; once
 * all is written, "#lost 0 k=K" closes it (nothing was lost), or "#lost N k=K" when the lines
 * had to be given up (the file ended while nothing could be written). */
#define HOLD_STEP (16 * 1024)
_Atomic size_t g_hold_total;

static uint64_t count_events(const char *p, size_t n);
static void stage_line(struct tstate *t, const char *s, size_t n);

static uint64_t hold_events(const struct tstate *t)
{
    return t->hold ? count_events(t->hold + t->hold_start, t->hold_len) : 0;
}

void hold_free(struct tstate *t)
{
    if (t->hold) {
        mml_unmap(t->hold, t->hold_cap);
        atomic_fetch_sub(&g_hold_total, t->hold_cap);
    }
    t->hold = NULL;
    t->hold_start = t->hold_len = t->hold_cap = 0;
}

/* Move half h's pending lines to the end of the hold.  0, or -1 when MMLEAK_HOLD_MB or the
 * memory is exhausted (nothing moved). */
static int hold_take(struct tstate *t, int h)
{
    size_t n = t->ulen[h];
    if (t->hold_len + n > t->hold_cap - t->hold_start) {
        size_t cap = t->hold_cap ? t->hold_cap : 64 * 1024;
        while (cap < t->hold_len + n)
            cap *= 2;
        size_t more = cap - t->hold_cap;
        if (atomic_fetch_add(&g_hold_total, more) + more > cfg.hold) {
            atomic_fetch_sub(&g_hold_total, more);
            errno = ENOMEM;
            return -1;
        }
        char *q = mml_map(cap);
        if (!q) {
            atomic_fetch_sub(&g_hold_total, more);
            return -1;
        }
        if (t->hold) {
            memcpy(q, t->hold + t->hold_start, t->hold_len);
            mml_unmap(t->hold, t->hold_cap);
        }
        t->hold = q;
        t->hold_start = 0;
        t->hold_cap = cap;
    }
    memcpy(t->hold + t->hold_start + t->hold_len, half_body(t, h) + t->ustart[h], n);
    t->hold_len += n;
    t->ustart[h] += n;
    t->ulen[h] = 0;
    return 0;
}

/* Where the current half's room ends (the slack behind it is the signal handlers'). */
static char *half_end(const struct tstate *t)
{
    return t->stage + (size_t)(t->half + 1) * t->half_size - SLACK;
}

/* The fast path's limit: the half's end, or HOLD_STEP bytes ahead while lines are held. */
static void set_end(struct tstate *t)
{
    t->end = half_end(t);
    if (t->hold_len && t->end - t->cur > HOLD_STEP)
        t->end = t->cur + HOLD_STEP;
}

static int move_pending(struct tstate *t);
static int anon_out(struct tstate *t);
static int sink_flush(struct tstate *t);
static int append_to(const char *name, const char *line, size_t n, const struct fid *id);

/* Write the held lines at the end of .out. */
static int write_hold(int fd, struct tstate *t)
{
    if (write_pending(fd, t, t->hold, &t->hold_start, &t->hold_len))
        return -1;
    hold_free(t);
    return 0;
}

/* Append what is staged to .out: the held lines first, then the other half's pending lines,
 * then the current half's.  0 when all is in .out; -1 (errno says why) when some stays
 * pending. */
static int flush_here(struct tstate *t, int full)
{
    int h = t->half, o = h ^ 1;
    if (t->cur)
        t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
    size_t n = t->hold_len + t->ulen[o] + t->ulen[h];
    if (!n)
        return 0;
    if (t->out_off + n > fsize_limit()) {
        errno = EFBIG;
        return -1;
    }
    int big = g_prealloc && n >= PREALLOC_MIN;     /* see g_prealloc and g_pad_line */
    size_t pad = big && full ? pad_size(t->out_off + n) : 0;
    if (t->out_off + n + pad > fsize_limit())
        pad = 0;
    char name[64];
    int fd = open_again(dump_name(name, sizeof name, t->fileno), O_WRONLY, &t->out_id);
    if (fd < 0)
        return -1;
    if (big)    /* a hint: on failure the write allocates as ever, and reports a full disk */
        (void)fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)t->out_off, (off_t)(n + pad));
    int rc = write_hold(fd, t);
    if (rc == 0)
        rc = write_half(fd, t, o);
    if (rc == 0)
        rc = write_half(fd, t, h);
    if (rc == 0 && pad)
        pad_out(fd, t, pad);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* The same; when the file cannot take the lines without passing RLIMIT_FSIZE (lowered after
 * it had grown), or is no longer there or no longer ours (deleted, and another user's FIFO or
 * link put at its name), they go on in a new file (see move_pending). */
static int flush_staged(struct tstate *t, int full)
{
    if (flush_here(t, full) == 0)
        return 0;
    int err = errno;
    if ((err == EFBIG || err == E_NOT_OURS || err == ENOENT) && !t->anon &&
        move_pending(t) == 0) {
        static atomic_int said;
        if (err != EFBIG && !atomic_exchange(&said, 1))
            say_why("a dump file in ", NULL, err, "; its thread goes on in a new file");
        return 0;
    }
    errno = err;
    return -1;
}

/* A thread that filled its first half is a busy one: give it the full MMLEAK_BUFFER_KB.  Every
 * staged line is in .out at this point.  The file is only extended (never truncated under our
 * own mapping): the first half of the new layout covers the old one and is cleared by
 * half_start, so no old "#at" header survives where the new layout reads one. */
static int grow_stage(struct tstate *t)
{
    size_t half = cfg.buffer / 2;
    if (2 * (uint64_t)half + 4096 > fsize_limit())
        return -1;
    char name[64];
    int fd = open_again(side_name(name, sizeof name, t->fileno, ".tail"), O_RDWR, &t->tail_id);
    if (fd < 0)
        return -1;
    void *p = MAP_FAILED;
    if (posix_fallocate(fd, 0, (off_t)(2 * half)) == 0)
        p = stage_map(fd, half);
    close(fd);
    if (p == MAP_FAILED)
        return -1;  /* keep writing the small one */
    mml_unmap(t->stage, 2 * t->half_size);
    t->stage = p;
    t->half_size = half;
    slot_sync(t);
    return 0;
}

/* "#lost N k=K\n": N events of gap K were not recorded.  K makes every such line unique, so
 * that readers, who pass identical '#' lines on once, never fold two gaps into one. */
size_t lost_line(char *line, size_t cap, uint64_t n, unsigned k)
{
    char *e = line + cap, *d = line;
    d = cat(d, e, "#lost ");
    d = cat_u(d, e, (unsigned long)n);
    d = cat(d, e, " k=");
    d = cat_u(d, e, k ? k : atomic_fetch_add(&g_episode, 1) + 1);
    d = cat(d, e, "\n");
    return (size_t)(d - line);
}

/* End the thread's file: "#lost N" if events were dropped, "#end", flush, delete the staging
 * file.  If the flush fails, the .tail stays: readers take the lines from it. */
static int anon_to_file(struct tstate *t);

/* Events (not '#' lines) in a stretch of staged lines. */
static uint64_t count_events(const char *p, size_t n)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] == '\n' && i + 1 < n && p[i + 1] != '#')
            k++;
    return k + (n && p[0] != '#');
}

/* A file's last lines into LINE (CAP bytes, 128 is enough): "#lost" when events were
 * counted but not kept, or a gap of held lines is still open (the caller then clears the
 * count and the gap), "#walks" with stacks (the caller clears the count), and "#end". */
static size_t trailer_text(char *line, size_t cap, const struct tstate *t)
{
    char *e = line + cap, *d = line;
    if (t->lost || t->holding)
        d += lost_line(d, cap, t->lost, t->episode);
    if (cfg.depth != 1) {
        /* the stack walks made for this file's events: a test of the memo's choice of set
         * reads it (a change that put many paths in one set walked again at every event) */
        d = cat(d, e, "#walks ");
        d = cat_u(d, e, (unsigned long)t->walks);
        d = cat(d, e, "\n");
    }
    d = cat(d, e, "#end\n");
    return (size_t)(d - line);
}

/* "#title t=TIME TITLE": the process's command line as it is now (a daemon's worker renames
 * itself: PostgreSQL, nginx, sshd...), TIME seconds after the start, escaped like "#cmd",
 * into D (ROOM bytes); 0 bytes when it does not fit or cannot be read. */
static size_t title_text(char *d, size_t room)
{
    unsigned char raw[sizeof g_cmd / 4];     /* as much as "#cmd" has */
    if (room < 80)
        return 0;
    int fd = g_procfd >= 0 ? openat(g_procfd, "self/cmdline", O_RDONLY | O_CLOEXEC)
                           : open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, raw, sizeof raw) : -1;
    if (fd >= 0)
        close(fd);
    while (n > 0 && (raw[n - 1] == 0 || raw[n - 1] == ' '))
        n--;                /* a title written over the arguments is padded */
    if (n <= 0)
        return 0;
    char *e = d + room, *p = cat(d, e, "#title t=");
    time_t now = time(NULL) - g_t0;
    p = cat_u(p, e, (unsigned long)(now < 0 ? 0 : now));
    p = cat(p, e, " ");
    escape_into(p, e - 1, raw, (size_t)n, 1);
    p += my_strlen(p);
    *p++ = '\n';
    return (size_t)(p - d);
}

void file_close(struct tstate *t, int trailer)
{
    if (!t->stage)
        return;
    /* a thread staging in memory: its lines into a file of its own, or the shared one (which
     * has no end of its own: the thread's count of lost events goes there as a line) */
    int gone = 0;
    if (t->anon && g_sink) {
        char *at = t->cur;
        uint64_t lost = t->lost;
        if (trailer && (t->lost || t->holding) && t->cur) {
            char line[64];
            stage_line(t, line, lost_line(line, sizeof line, t->lost, t->episode));
            t->lost = 0;
            t->holding = 0;
        }
        if (sink_flush(t)) {        /* not written: the line taken back, the count kept */
            t->cur = at;
            t->lost = lost;
        }
        gone = 1;
    } else if (t->anon) {
        gone = anon_to_file(t) != 0;
    }
    if (gone) {
        /* what is still in memory (nothing, when the shared file took it all) is lost,
         * and counted */
        int h = t->half, o = h ^ 1;
        if (t->cur)
            t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
        uint64_t n = count_events(half_body(t, o) + t->ustart[o], t->ulen[o]) +
                     count_events(half_body(t, h) + t->ustart[h], t->ulen[h]) +
                     hold_events(t);
        atomic_fetch_add(&g_lost_orphan, n + t->lost);
        if (n + t->lost) {      /* said at the exit: "#nofile" (nofile_line) */
            int none = 0;
            atomic_fetch_add(&g_nofile, 1);
            atomic_compare_exchange_strong(&g_nofile_err, &none, t->nofile_err);
        }
        hold_free(t);
        mml_unmap(t->stage, 2 * t->half_size);
        slot_free(t);
        t->stage = NULL;
        t->cur = t->end = NULL;
        t->anon = t->open = t->dropping = t->holding = 0;
        t->lost = 0;
        return;
    }
    if (t->dropping && flush_staged(t, 0) == 0) {
        t->dropping = 0;
        half_start(t, t->half ^ 1);
    }
    if (t->hold_len && (t->dropping || flush_staged(t, 0))) {
        /* the file ends and its held lines still cannot be written: they are lost, and the
         * count says how many (the gap their "#dropping" opened closes with it) */
        t->lost += hold_events(t);
        hold_free(t);
    }
    if (!t->dropping) {
        if (trailer) {
            /* the slack behind `end` always has room for the "#lost" and "#end" lines, and
             * for the title when no signal handler's lines took it */
            char line[128];
            size_t n = trailer_text(line, sizeof line, t);
            stage_line(t, line, n - 5);
            ptrdiff_t room = half_end(t) + SLACK - t->cur - 64;
            t->cur += room > 0 ? title_text(t->cur, (size_t)room) : 0;
            stage_line(t, "#end\n", 5);
            t->lost = 0;
            t->holding = 0;
            t->walks = 0;
        }
        if (flush_staged(t, 0) == 0) {
            char name[64];
            d_unlink(side_name(name, sizeof name, t->fileno, ".tail"));
        }
    }
    hold_free(t);
    stage_drop(t);
    slot_free(t);
    sset_clear(t);
    t->open = 0;
    t->dropping = 0;
    t->holding = 0;
}

static size_t header_text(char *h, size_t cap, unsigned fileno, int late)
{
    char *e = h + cap, *d = h;
    d = cat(d, e, "#mmleak ");
    d = cat_u(d, e, MMLEAK_FORMAT_VERSION);
    d = cat(d, e, " id=");
    d = cat(d, e, g_id);
    d = cat(d, e, " pid=");
    d = cat_u(d, e, (unsigned long)g_pid);
    d = cat(d, e, " tid=");
    d = cat_u(d, e, (unsigned long)mml_sys(SYS_gettid));
    d = cat(d, e, " file=");
    d = cat_u(d, e, fileno);
    d = cat(d, e, " depth=");
    d = cfg.depth ? cat_u(d, e, (unsigned long)cfg.depth) : cat(d, e, "auto");
    d = cat(d, e, " start=");
    d = cat_u(d, e, (unsigned long)g_t0);
    if (g_pstart) {
        d = cat(d, e, " pstart=");
        d = cat_u(d, e, (unsigned long)g_pstart);
    }
    d = cat(d, e, late ? " late=1" : "");
    d = cat(d, e, g_window ? " window=1" : "");
    d = cat(d, e, "\n#cmd ");
    d = cat(d, e, g_cmd);
    if (g_alloc[0]) {
        d = cat(d, e, "\n#alloc ");
        d = cat(d, e, g_alloc);
    }
    if (g_supp[0]) {
        d = cat(d, e, "\n#suppressions ");
        d = cat(d, e, g_supp);
    }
    d = cat(d, e, "\n");
    return (size_t)(d - h);
}

static void stage_line(struct tstate *t, const char *s, size_t n)
{
    memcpy(t->cur, s, n);
    t->cur += n;
}

/* The file's header line, written straight into the half just started (it always has room:
 * at least 8 KiB less the slack): a copy on the stack was 2.8 KB of the deepest frame of a
 * thread's first event and of a rotation. */
static void stage_header(struct tstate *t, unsigned fileno)
{
    size_t room = (size_t)(t->end - t->cur), cap = sizeof g_cmd + sizeof g_alloc +
                                            sizeof g_supp + 256;
    t->cur += header_text(t->cur, cap < room ? cap : room, fileno, t->late);
}

/* Create a new dump file mmleak.ID.N.out with an N nobody took (and, if TAIL_FD, its staging
 * file .N.tail, the same N): under g_lock.  The .out's descriptor, or -1 (errno). */
static int new_dump_locked(unsigned *np, struct fid *out_id, int *tail_fd, struct fid *tail_id)
{
    char name[64], tname[64];
    for (int run = 0; run < 16 * TAKEN_RUN; run++) {
        if (run && run % TAKEN_RUN == 0) {
            atomic_fetch_add(&g_next_file, (1u << 16) + (unsigned)(unguessable() % (1u << 24)));
            say_taken("names of dump files in ", "they are skipped, and this trace's files "
                      "are numbered past them");
        }
        unsigned n = atomic_fetch_add(&g_next_file, 1);
        int ofd = create_locked(dump_name(name, sizeof name, n), out_id);
        if (ofd < 0) {
            if (errno == EEXIST)
                continue;
            atomic_store(&g_next_file, n);  /* not taken: the next try uses it (g_lock) */
            return -1;
        }
        if (tail_fd) {
            int fd = create_locked(side_name(tname, sizeof tname, n, ".tail"), tail_id);
            if (fd < 0) {
                int err = errno;
                close(ofd);
                d_unlink(name);
                errno = err;
                if (err == EEXIST)
                    continue;
                atomic_store(&g_next_file, n);
                return -1;
            }
            *tail_fd = fd;
        }
        *np = n;
        return ofd;
    }
    errno = EEXIST;
    return -1;
}

/* Open a new dump file for this thread: mmleak.ID.N.out and its staging file .N.tail. */
static size_t first_half(void)
{
    return (cfg.buffer < 2 * START_HALF ? cfg.buffer : 2 * START_HALF) / 2;
}

static int file_open(struct tstate *t, size_t min_half)
{
    size_t half = first_half();
    while (half < min_half)
        half *= 2;
    if (2 * (uint64_t)half + 4096 > fsize_limit()) {
        errno = EFBIG;
        return -1;
    }
    char name[64], tname[64];
    int fd = -1;
    unsigned n = 0;
    struct fid out_id, tail_id;
    pthread_mutex_lock(&g_lock);
    int ofd = new_dump_locked(&n, &out_id, &fd, &tail_id);
    int err = errno;
    if (ofd >= 0)
        close(ofd);
    int slot = fd >= 0 ? slot_new_locked(n) : 0;
    pthread_mutex_unlock(&g_lock);
    if (fd < 0) {
        errno = err;
        return -1;
    }
    dump_name(name, sizeof name, n);
    side_name(tname, sizeof tname, n, ".tail");
    void *p = MAP_FAILED;
    /* fallocate, not just ftruncate: a full disk must fail here, not SIGBUS later */
    int rc = posix_fallocate(fd, 0, (off_t)(2 * half));
    if (rc == 0) {
        p = stage_map(fd, half);
        rc = p == MAP_FAILED ? errno : 0;
    }
    close(fd);
    if (p == MAP_FAILED || !slot) {
        if (p != MAP_FAILED)
            mml_unmap(p, 2 * half);
        t->slot = slot;
        slot_free(t);
        d_unlink(tname);
        d_unlink(name);
        errno = rc ? rc : ENOMEM;
        return -1;
    }
    t->fileno = n;
    t->out_id = out_id;
    t->tail_id = tail_id;
    t->stage = p;
    t->half_size = half;
    t->out_off = 0;
    t->ulen[0] = t->ulen[1] = 0;
    t->slot = slot;
    half_stamp(t, 0);           /* (a new file: zeros) */
    t->open = 1;
    t->late_lines = 0;
    stage_header(t, n);
    slot_sync(t);
    return 0;
}

/* Rotation (the file reached MMLEAK_ROTATE_MB, every staged line is in it): the thread goes
 * on in a new file with the same staging file, renamed, so that no new mapping has to be made
 * and faulted in (with the 8 MB files of compaction, a new staging file per rotation cost the
 * traced program a few percent more CPU than the tracer alone).  The old file gets its "#end"
 * written straight to it; the staging halves are cleared before the rename, so that under
 * either name they hold nothing a reader would take for unflushed lines.  0: done; -1: not
 * done, the old file as it was (the caller closes it and opens another the usual way); 1:
 * the old file is ended and the thread has no file (a compactor folded the ended file and
 * removed the staging file before the rename: the caller opens another); 2: no new file
 * could be made (errno), the old file as it was: the caller goes on in it (a daemon that
 * became a user who may not create files in the directory still writes the file it has). */
static int file_rotate(struct tstate *t)
{
    if (t->anon || t->dropping || t->late || !t->stage || t->ulen[0] || t->ulen[1] ||
        t->hold_len)
        return -1;
    char oname[64], nname[64], otail[64], ntail[64], line[128];
    size_t len = trailer_text(line, sizeof line, t);
    if (t->out_off + len > fsize_limit())
        return -1;
    unsigned n = 0;
    int tfd = -1;
    struct fid out_id, tail_id;
    pthread_mutex_lock(&g_lock);
    /* the new .tail's name is made too (O_EXCL), and then renamed over: never a name that
     * somebody else's file may hold */
    int ofd = new_dump_locked(&n, &out_id, &tfd, &tail_id), err = errno;
    pthread_mutex_unlock(&g_lock);
    if (ofd < 0) {
        errno = err;
        return 2;
    }
    close(ofd);
    close(tfd);
    dump_name(nname, sizeof nname, n);
    side_name(ntail, sizeof ntail, n, ".tail");
    int fd = open_again(dump_name(oname, sizeof oname, t->fileno), O_WRONLY, &t->out_id);
    ssize_t w = fd >= 0 ? pwrite(fd, line, len, (off_t)t->out_off) : -1;
    if (fd >= 0)
        close(fd);
    if (w != (ssize_t)len) {
        d_unlink(ntail);
        d_unlink(nname);
        return -1;          /* a partial "#end" is a torn line: the next flush overwrites it */
    }
    t->out_off += len;
    t->lost = 0;
    t->holding = 0;         /* trailer_text closed the gap */
    t->walks = 0;
    memset(t->stage, 0, 2 * t->half_size);
    side_name(otail, sizeof otail, t->fileno, ".tail");
    int moved = d_rename(otail, ntail) == 0;
    /* what was renamed must be our staging file: if a compactor took the old name away
     * meanwhile (the file was ended), another user may have put anything there */
    int ours = moved;
    if (moved && (fd = open_again(ntail, O_RDONLY, &t->tail_id)) >= 0)
        close(fd);
    else if (moved && errno == E_NOT_OURS)
        ours = 0;           /* (any other failure, no descriptor say: it is ours) */
    if (!ours) {
        d_unlink(ntail);    /* our reservation, or what was renamed onto it */
        d_unlink(nname);
        if (!moved)
            d_unlink(otail);
        stage_drop(t);
        slot_free(t);
        sset_clear(t);
        t->open = 0;
        return 1;
    }
    t->fileno = n;
    t->out_id = out_id;
    t->out_off = 0;
    t->late_lines = 0;
    sset_clear(t);
    half_start(t, 0);
    stage_header(t, n);
    slot_sync(t);
    return 0;
}

/* The longest run of whole lines at P (of N bytes) that fits in ROOM bytes. */
static size_t whole_lines(const char *p, size_t n, uint64_t room)
{
    if (n <= room)
        return n;
    size_t k = (size_t)room;
    while (k > 0 && p[k - 1] != '\n')
        k--;
    return k;
}

/* T goes on in the file F was opened on (F: a scratch state that file_open filled, whose
 * staged lines are all T's pending ones): T's old staging area is the caller's to release. */
static void take_file(struct tstate *t, const struct tstate *f)
{
    t->stage = f->stage;
    t->half_size = f->half_size;
    t->half = f->half;
    t->fileno = f->fileno;
    t->out_id = f->out_id;
    t->tail_id = f->tail_id;
    t->out_off = f->out_off;
    t->slot = f->slot;
    t->ustart[0] = t->ustart[1] = t->ulen[0] = t->ulen[1] = 0;
    t->cur = f->cur;
    t->end = f->end;
    t->late_lines = 0;
}

/* The thread's file cannot take its pending lines: RLIMIT_FSIZE was lowered below what it
 * holds (a limit known from the start makes us rotate before it).  New files take them,
 * written at once behind their headers (as many files as the limit needs, each ended with
 * "#end"), and the thread goes on in the last one; the old file gets "#end" if the limit
 * allows, and loses its staging file (whose lines moved).  -1 when the lines could not all
 * be moved (what was not stays pending, in order). */
static int move_pending(struct tstate *t)
{
    uint64_t lim = fsize_limit();
    for (;;) {
        int h = t->half, o = h ^ 1;
        struct tstate f;
        memset(&f, 0, sizeof f);
        f.late = t->late;
        if (file_open(&f, 0))
            return -1;
        char name[64];
        int fd = -1;
        if (flush_here(&f, 0) == 0)         /* the header */
            fd = open_again(dump_name(name, sizeof name, f.fileno), O_WRONLY, &f.out_id);
        /* whole lines, with room left for "#end": the held ones, then each half's */
        uint64_t room = f.out_off + 5 + SLACK < lim ? lim - f.out_off - 5 - SLACK : 0;
        const char *seg[3] = { t->hold ? t->hold + t->hold_start : NULL,
                               half_body(t, o) + t->ustart[o], half_body(t, h) + t->ustart[h] };
        size_t *start[3] = { &t->hold_start, &t->ustart[o], &t->ustart[h] };
        size_t *len[3] = { &t->hold_len, &t->ulen[o], &t->ulen[h] };
        size_t take[3], moved = 0;
        int ok = fd >= 0;
        for (int i = 0; i < 3; i++) {
            take[i] = i && take[i - 1] < *len[i - 1] ? 0 : whole_lines(seg[i], *len[i], room - moved);
            ok = ok && (!take[i] || pwrite(fd, seg[i], take[i], (off_t)(f.out_off + moved)) ==
                                    (ssize_t)take[i]);
            moved += take[i];
        }
        if (fd >= 0)
            close(fd);
        if (!ok || !moved) {
            file_close(&f, 1);
            sset_free(&f);
            errno = EFBIG;
            return -1;
        }
        f.out_off += moved;
        for (int i = 0; i < 3; i++) {
            *start[i] += take[i];
            *len[i] -= take[i];
        }
        if (!t->hold_len)
            hold_free(t);
        half_start(&f, f.half ^ 1);         /* "#at" after the moved lines */
        if (t->hold_len || t->ulen[o] || t->ulen[h]) {  /* more than one new file holds */
            file_close(&f, 1);
            sset_free(&f);
            continue;
        }
        append_to(dump_name(name, sizeof name, t->fileno), "#end\n", 5, &t->out_id);
        d_unlink(side_name(name, sizeof name, t->fileno, ".tail"));
        mml_unmap(t->stage, 2 * t->half_size);
        slot_free(t);
        sset_clear(t);                      /* the new file holds none of the stacks */
        take_file(t, &f);
        return 0;
    }
}

/* Take a parked file, if there is one. */
static int take_parked(struct tstate *t)
{
    pthread_mutex_lock(&g_lock);
    size_t i = R.n;
    while (i > 0 && R.a[i - 1].state != SLOT_PARKED)
        i--;
    struct file_slot s = i ? R.a[i - 1] : (struct file_slot){ .state = SLOT_FREE };
    if (i)
        R.a[i - 1].state = SLOT_OPEN;
    pthread_mutex_unlock(&g_lock);
    if (!i)
        return -1;
    t->slot = (int)i;
    t->fileno = s.fileno;
    t->out_id = s.out_id;
    t->tail_id = s.tail_id;
    t->stage = s.stage;
    t->half_size = s.half_size;
    t->out_off = s.out_off;
    t->ulen[0] = t->ulen[1] = 0;
    sset_free(t);
    t->ss = s.ss;
    t->ss_cap = s.ss_cap;
    t->ss_n = s.ss_n;
    t->walks += s.walks;    /* the file's, and a new thread's for its first event */
    sset_lost(t);
    half_start(t, 0);
    t->open = 1;
    return 0;
}

/* A new thread continues a parked file, if there is one; "#thread" marks the handover. */
static int unpark(struct tstate *t)
{
    if (take_parked(t))
        return -1;
    t->late = 0;
    t->late_lines = 0;
    t->exit_rounds = 0;
    char line[64], *d = line, *e = line + sizeof line;
    d = cat(d, e, "#thread tid=");
    d = cat_u(d, e, (unsigned long)mml_sys(SYS_gettid));
    d = cat(d, e, "\n");
    stage_line(t, line, (size_t)(d - line));
    return 0;
}

/* The thread's file is given up when it ends: parked for the next new thread. */
void park(struct tstate *t)
{
    /* (a thread staging in memory has no file to park: its lines go where file_close puts
     * them; flush_staged would write them into file N of its zeroed state, the main
     * thread's 0, over its start) */
    if (t->anon || t->dropping || t->lost || t->holding || flush_staged(t, 0) != 0) {
        file_close(t, 1); /* keeps what could not be written in the .tail */
        return;
    }
    pthread_mutex_lock(&g_lock);
    struct file_slot *s = &R.a[t->slot - 1];
    *s = (struct file_slot){ SLOT_PARKED, t->fileno, t->stage, t->half_size, t->out_off,
                        t->ss, t->ss_cap, t->ss_n, t->out_id, t->tail_id, t->walks, -1, 0 };
    pthread_mutex_unlock(&g_lock);
    t->ss = NULL;
    t->ss_cap = t->ss_n = 0;
    sset_lost(t);
    t->slot = 0;
    t->stage = NULL;
    t->cur = t->end = NULL;
    t->open = 0;
    t->walks = 0;
}

/* Close every parked file (process exit). */
void close_parked(void)
{
    struct tstate tmp;
    memset(&tmp, 0, sizeof tmp);
    while (take_parked(&tmp) == 0)
        file_close(&tmp, 1);
    sset_free(&tmp);
}

static void key_for_exit(struct tstate *t)
{
    t->exit_rounds = 0;
    if (g_key_ok)
        pthread_setspecific(g_key, t);
}

static void start_dropping(struct tstate *t, int err)
{
    if (!atomic_exchange(&g_said_write, 1))
        say_err("cannot write a dump file in ", err, WRITE_FAILED_TAIL);
    if (!t->holding)    /* the gap of held lines goes on: its "#lost" will count these too */
        t->episode = atomic_fetch_add(&g_episode, 1) + 1;
    t->holding = 0;
    if (t->stage && t->cur) {
        /* in the slack behind `end`: where the gap begins, for a reader after a crash */
        char line[48], *e = line + sizeof line, *d = line;
        d = cat(d, e, "#dropping k=");
        d = cat_u(d, e, t->episode);
        d = cat(d, e, "\n");
        stage_line(t, line, (size_t)(d - line));
        t->ulen[t->half] += (size_t)(d - line);
    }
    t->cur = t->end = NULL;
    t->dropping = 1;
    t->retry_at = time(NULL) + 1;
    key_for_exit(t);
}

/* No file could be created (no descriptor left, a full disk, a directory gone): stage in
 * anonymous memory meanwhile, exactly as in a .tail (only a SIGKILL now would lose it), and
 * try to create the file at every full half. */
static int anon_open(struct tstate *t)
{
    size_t half = first_half();
    void *p = mml_map(2 * half);
    if (!p)
        return -1;
    t->stage = p;
    t->half_size = half;
    t->out_off = 0;
    t->ulen[0] = t->ulen[1] = 0;
    t->anon = 1;
    t->open = 1;
    half_stamp(t, 0);           /* (a new mapping: zeros) */
    /* registered, so that the exit can write its lines for it (sink_catch_up);
     * without a slot (no memory) it still stages, and writes them itself */
    pthread_mutex_lock(&g_lock);
    int slot = slot_new_locked(0);
    if (slot) {
        struct file_slot *s = &R.a[slot - 1];
        s->state = SLOT_ANON;
        s->stage = t->stage;
        s->half_size = half;
        s->sink_half = g_sink ? 0 : -1;     /* (-1: not known to sink_catch_up, see there) */
        s->sink_done = 0;
    }
    t->slot = slot;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* A file just made by file_open, given up: removed with its staging file. */
static void file_discard(struct tstate *f)
{
    char name[64];
    mml_unmap(f->stage, 2 * f->half_size);
    f->stage = NULL;
    slot_free(f);
    sset_free(f);
    d_unlink(side_name(name, sizeof name, f->fileno, ".tail"));
    d_unlink(dump_name(name, sizeof name, f->fileno));
}

/* The file can be created now: create it, and write its header and everything the anonymous
 * halves and the hold have, in order, at once; the thread goes on in the file.  All or
 * nothing: -1 (errno) when the file cannot be made or written, and every line is still
 * where it was. */
static int anon_to_file(struct tstate *t)
{
    int h = t->half, o = h ^ 1;
    if (t->cur)
        t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
    struct tstate f;
    memset(&f, 0, sizeof f);
    f.late = t->late;
    if (file_open(&f, 0))
        return -1;
    size_t hn = (size_t)(f.cur - half_body(&f, 0));     /* the header file_open staged */
    const char *seg[4] = { half_body(&f, 0), t->hold ? t->hold + t->hold_start : NULL,
                           half_body(t, o) + t->ustart[o], half_body(t, h) + t->ustart[h] };
    size_t len[4] = { hn, t->hold_len, t->ulen[o], t->ulen[h] };
    uint64_t total = hn + t->hold_len + t->ulen[o] + t->ulen[h], off = 0;
    char name[64];
    int fd = total <= fsize_limit()
             ? open_again(dump_name(name, sizeof name, f.fileno), O_WRONLY, &f.out_id)
             : (errno = EFBIG, -1);
    int bad = fd < 0;
    for (int i = 0; !bad && i < 4; i++) {
        const char *p = seg[i];
        for (size_t left = len[i]; left && !bad;) {
            ssize_t w = pwrite(fd, p, left, (off_t)off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                if (w == 0)
                    errno = ENOSPC;
                bad = 1;
                break;
            }
            p += w;
            left -= (size_t)w;
            off += (uint64_t)w;
        }
    }
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (bad) {
        file_discard(&f);
        errno = err;
        return -1;
    }
    f.out_off = total;
    f.ustart[0] = hn;
    half_start(&f, 1);
    hold_free(t);
    mml_unmap(t->stage, 2 * t->half_size);
    slot_free(t);
    t->anon = 0;
    take_file(t, &f);
    return 0;
}

/* While lines are held: a half begins with "#dropping k=K" (see hold_take). */
static void hold_mark(struct tstate *t)
{
    char line[48], *e = line + sizeof line, *d = line;
    d = cat(d, e, "#dropping k=");
    d = cat_u(d, e, t->episode);
    d = cat(d, e, "\n");
    stage_line(t, line, (size_t)(d - line));
}

/* Every held line is written: "#lost 0 k=K" closes the gap "#dropping k=K" opened. */
static void hold_close(struct tstate *t)
{
    if (!t->holding || t->hold_len || t->dropping || !t->cur)
        return;
    char line[64];
    stage_line(t, line, lost_line(line, sizeof line, 0, t->episode));
    t->holding = 0;
}

/* Make room for `need` bytes at t->cur: open the thread's files, flush a half, rotate. */
static int make_room(struct tstate *t, size_t need)
{
    if (g_state == 0)
        global_init();
    if (g_state < 0 || t->dropping || t->dead) {
        if (g_state < 0)
            t->cur = t->end = NULL;
        return -1;
    }
    if (!t->open) {
        mml_unwind_thread_init();   /* its stack's bounds, while we are near its top */
        /* (where the user the process became may not create files, the shared file takes
         * the lines of a thread without one: no try, no message) */
        if (unpark(t) && (g_sink || file_open(t, 0))) {
            int err = g_sink ? EACCES : errno;
            if (anon_open(t)) {
                start_dropping(t, err);
                return -1;
            }
            t->nofile_err = err;
            if (!g_sink && !atomic_exchange(&g_said_write, 1))
                say_err("cannot create a dump file in ", err, WRITE_FAILED_TAIL);
        }
        key_for_exit(t);
        maps_snapshot(0);
        if ((size_t)(t->end - t->cur) >= need)
            return 0;
    }
    if (t->hold_len && half_end(t) - t->cur >= (ptrdiff_t)(need + 64)) {
        /* lines are held and the half has room: a step (see HOLD_STEP), a try to write */
        if (t->anon ? anon_out(t) == 0 : flush_staged(t, 0) == 0)
            hold_close(t);
        set_end(t);
        return (size_t)(t->end - t->cur) >= need ? 0 : -1;
    }
    /* the current half is full */
    int h = t->half, was_anon = t->anon;
    if (was_anon ? anon_out(t) == 0 : flush_staged(t, 1) == 0) {
        if (was_anon) { /* now in a file (or the shared file took it all), its half empty */
            hold_close(t);
            return (size_t)(t->end - t->cur) >= need ? 0 : -1;
        }
        int near_limit = t->out_off + t->half_size + 4096 > fsize_limit();
        if (t->out_off >= cfg.rotate || near_limit) {
            int r = t->out_off >= cfg.rotate ? file_rotate(t) : -1;
            if (r == 0) {
                maps_snapshot(0);
                return (size_t)(t->end - t->cur) >= need ? 0 : -1;
            }
            /* no new file (the directory refuses the user the daemon became): ending this
             * one would leave the thread only memory, lost at the exit; it goes on here,
             * past the rotation size, and tries again at its next full half */
            if (r != 2 || near_limit) {
                if (r != 1)
                    file_close(t, 1);
                return make_room(t, need);
            }
            if (!atomic_exchange(&g_said_write, 1))
                say_err("cannot create a dump file in ", errno, ROTATE_FAILED_TAIL);
        }
        int grown = 2 * t->half_size < cfg.buffer ? grow_stage(t) : -1;
        half_start(t, grown == 0 ? 0 : h ^ 1);
        hold_close(t);
        maps_snapshot(0);
        return (size_t)(t->end - t->cur) >= need ? 0 : -1;
    }
    int err = errno;
    if (t->anon)
        t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
    /* this half stays pending (in the .tail, or the anonymous halves); the other one, if it is
     * still pending too, goes to the hold; go on in it, and try again soon */
    if (t->ulen[h ^ 1] == 0 || hold_take(t, h ^ 1) == 0) {
        if (!atomic_exchange(&g_said_write, 1))
            say_err("cannot write a dump file in ", err, WRITE_FAILED_TAIL);
        if (t->hold_len && !t->holding) {
            t->holding = 1;
            t->episode = atomic_fetch_add(&g_episode, 1) + 1;
        }
        half_start(t, h ^ 1);
        if (t->holding)
            hold_mark(t);
        set_end(t);
        return (size_t)(t->end - t->cur) >= need ? 0 : -1;
    }
    start_dropping(t, err);
    return -1;
}

/* While dropping: once a second (and every 1024 events) try to write again; 1 when that
 * worked and there is room for this event's N bytes, else the event is counted as lost. */
static int drop_event(struct tstate *t, size_t n)
{
    time_t now = time(NULL);
    if (now < t->retry_at && ((t->lost + 1) & 1023)) {
        t->lost++;
        return 0;
    }
    t->retry_at = now + 1;
    int ok;
    if (t->anon) {
        ok = anon_out(t) == 0;
    } else if (t->stage) {
        ok = flush_staged(t, 0) == 0;
        if (ok)
            half_start(t, t->half ^ 1);
    } else {
        ok = !(unpark(t) && file_open(t, 0));
        if (ok)
            key_for_exit(t);
    }
    if (!ok) {
        t->lost++;
        return 0;
    }
    t->dropping = 0;
    char line[64];
    stage_line(t, line, lost_line(line, sizeof line, t->lost, t->episode));
    t->lost = 0;
    if (t->end - t->cur >= (ptrdiff_t)n)
        return 1;   /* the event that found writing works again is written, not lost */
    t->lost++;
    return 0;
}

/* Is a line being written under us (we are a signal handler that interrupted it)?  Its
 * newline slot, written last, is still the zero the half was cleared with, and finished text
 * never has a NUL: a look at the recent bytes answers it.  Asked only before a flush. */
static int unfinished_line(const struct tstate *t)
{
    if (!t->stage || !t->cur)
        return 0;
    char *lo = half_body(t, t->half) + t->ustart[t->half];
    char *from = t->cur - lo > 2 * SLACK ? t->cur - 2 * SLACK : lo;
    return from < t->cur && memchr(from, 0, (size_t)(t->cur - from)) != NULL;
}

/* After the main thread's file was closed (process exit, exec), a few more events may come:
 * destructors, execvp's search of PATH.  They go to the process's shared late file (below), a
 * write each, rather than a new file and staging file for them; past LATE_DIRECT lines the
 * thread is evidently going on (a failed exec) and gets a new file.  A file that ends with
 * "#end" is final: nothing is ever appended to it (mmleak.py compact relies on that). */
#define LATE_DIRECT 256

static int late_direct(const struct tstate *t)
{
    return t->late && !t->open && !t->dead && t->late_lines < LATE_DIRECT && g_state == 1 &&
           g_pid == getpid();
}

/* Append a line to a closed file of ours, if the size limit allows. */
static int append_to(const char *name, const char *line, size_t n, const struct fid *id)
{
    int fd = open_again(name, O_WRONLY | O_APPEND, id);
    if (fd < 0)
        return -1;
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size + n <= fsize_limit())
        rc = write_all(fd, line, n);
    close(fd);
    return rc;
}


static void append_direct(struct tstate *t, const char *line, size_t n)
{
    late_shared(line, n);
    t->late_lines++;
}

/* Events of a thread after its last key destructor round (glibc frees the dlerror() and
 * strerror() buffers after that): appended, a write each, to one shared "late" file of the
 * process.  Such a thread never registers again: its TLS is about to be reused.
 * A daemon that starts a thread per task sends a few lines here per thread, for as long as
 * it runs: past LATE_ROTATE bytes the file is ended ("#end", final, so the compactor folds
 * and deletes it while the process runs) and the next line starts a new one. */
unsigned g_late_file = ~0u;
struct fid g_late_id;
#define LATE_ROTATE (64u << 10)

/* Append LINE to the late file NAME, and end that file when it has grown past LATE_ROTATE
 * (the next line starts a new one).  0: appended; -1: not (a new file takes the line). */
static int late_append_locked(const char *name, const char *line, size_t n)
{
    int fd = open_again(name, O_WRONLY | O_APPEND, &g_late_id);
    if (fd < 0)
        return -1;
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size + n <= fsize_limit()) {
        rc = write_all(fd, line, n);
        /* (never while it is the shared file of threads that cannot make one: no other
         * file could follow it) */
        if (!rc && !g_sink && (uint64_t)st.st_size + n >= LATE_ROTATE &&
            (uint64_t)st.st_size + n + 5 <= fsize_limit() && !write_all(fd, "#end\n", 5))
            g_late_file = ~0u;
    }
    close(fd);
    return rc;
}

void late_shared(const char *line, size_t n)
{
    char name[64];
    pthread_mutex_lock(&g_lock);
    if (g_late_file != ~0u &&
        !late_append_locked(dump_name(name, sizeof name, g_late_file), line, n)) {
        /* appended */
    } else {
        unsigned no = 0;
        struct fid id;
        int fd = new_dump_locked(&no, &id, NULL, NULL);
        char h[sizeof g_cmd + sizeof g_alloc + sizeof g_supp + 256];
        size_t hn = fd >= 0 ? header_text(h, sizeof h, no, 1) : 0;
        if (fd >= 0 && hn + n <= fsize_limit() && !write_all(fd, h, hn) && !write_all(fd, line, n)) {
            g_late_file = no;
            g_late_id = id;
        } else
            atomic_fetch_add(&g_lost_orphan, 1);
        if (fd >= 0)
            close(fd);
    }
    pthread_mutex_unlock(&g_lock);
}

/* ---- the shared file of threads that cannot make one of their own ----
 * A daemon started as root that becomes another user for good (memcached -u, nsd, ngircd)
 * in a directory that user may not create files in (mmleak.py run's own, root's, 0755):
 * every thread it starts afterwards would have no file, and its events, staged in memory
 * (anon_open), would be lost at its end.  So at the drop, while still root, the late file is
 * made (give_files_to, sink_make_locked) and from then on takes their lines: each appends
 * its pending lines there whenever a half is full and at its end, under g_lock, whole lines
 * only (lines of any number of threads may share a file: SEQ orders the events of an
 * address, and every "#s" line comes before the lines of its thread that use it).  A write
 * per half, as a thread with a file of its own makes; nothing is lost while it works.
 * What is in a thread's current half when the process ends (a worker blocked in epoll_wait
 * for good) is written for it by the exiting thread: sink_catch_up, from the registry, where
 * such a thread keeps how much of its current half is written (sink_done).  Only a SIGKILL loses the lines staged since the
 * last flush, as before; and the file is never ended while the process runs (no other
 * could follow it), nor at its exit (the events after its files close come here too). */
int g_sink;

void sink_make_locked(void)
{
    g_sink = 1;
    if (g_late_file != ~0u)
        return;                 /* there is one: it is not ended from now on */
    unsigned no = 0;
    struct fid id;
    int fd = new_dump_locked(&no, &id, NULL, NULL);
    char h[sizeof g_cmd + sizeof g_alloc + sizeof g_supp + 256];
    size_t hn = fd >= 0 ? header_text(h, sizeof h, no, 1) : 0;
    if (fd >= 0 && hn <= fsize_limit() && !write_all(fd, h, hn)) {
        g_late_file = no;
        g_late_id = id;
    } else {
        g_sink = 0;             /* (none: such threads lose their events, counted) */
    }
    if (fd >= 0)
        close(fd);
}

/* Append the N[i] bytes at P[i] (K pieces, whole lines) to the shared file, advancing *ST[i]
 * and *N[i] past what was written.  Under g_lock.  0, or -1 (errno). */
static int sink_write_locked(int k, const char *const *p, size_t **st, size_t **n)
{
    char name[64];
    int fd = g_late_file == ~0u ? (errno = ENOENT, -1)
             : open_again(dump_name(name, sizeof name, g_late_file), O_WRONLY | O_APPEND,
                          &g_late_id);
    if (fd < 0)
        return -1;
    struct stat sb;
    uint64_t total = 0;
    for (int i = 0; i < k; i++)
        total += *n[i];
    int rc = fstat(fd, &sb) ? -1 : (uint64_t)sb.st_size + total > fsize_limit()
                                  ? (errno = EFBIG, -1) : 0;
    for (int i = 0; !rc && i < k; i++)
        while (*n[i]) {
            ssize_t w = write(fd, p[i] + *st[i], *n[i]);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                if (w == 0)
                    errno = ENOSPC;
                rc = -1;
                break;
            }
            *st[i] += (size_t)w;
            *n[i] -= (size_t)w;
        }
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* A thread staging in memory, in a process with the shared file: its pending lines (held,
 * the other half's, the current half's, in that order) appended there, and it goes on in a
 * cleared half.  0, or -1 (errno) with what was not written still pending. */
static int sink_flush(struct tstate *t)
{
    int h = t->half, o = h ^ 1;
    if (t->cur)
        t->ulen[h] = (size_t)(t->cur - half_body(t, h)) - t->ustart[h];
    pthread_mutex_lock(&g_lock);
    struct file_slot *s = t->slot ? &R.a[t->slot - 1] : NULL;
    if (s && s->sink_half == h && s->sink_done > t->ustart[h]) {
        /* the exit (or a detach) wrote part of this half for us (sink_catch_up) */
        size_t d = s->sink_done - t->ustart[h];
        d = d < t->ulen[h] ? d : t->ulen[h];
        t->ustart[h] += d;
        t->ulen[h] -= d;
    }
    const char *p[3] = { t->hold, half_body(t, o), half_body(t, h) };
    size_t *st[3] = { &t->hold_start, &t->ustart[o], &t->ustart[h] };
    size_t *n[3] = { &t->hold_len, &t->ulen[o], &t->ulen[h] };
    int rc = sink_write_locked(3, p, st, n), e = errno;
    char *big = NULL;
    if (rc == 0) {
        hold_free(t);
        /* a busy thread gets the full MMLEAK_BUFFER_KB, as grow_stage gives one with a file:
         * with the first 32 KiB halves, 3 threads of 100,000 events made 359 writes (and
         * 2,817 system calls in all) where they made 42 pwrites in files of their own */
        if (2 * t->half_size < cfg.buffer && (big = mml_map(cfg.buffer / 2 * 2)) != NULL) {
            mml_unmap(t->stage, 2 * t->half_size);
            t->stage = big;
            t->half_size = cfg.buffer / 2;
            t->ustart[1] = t->ulen[1] = 0;
            half_stamp(t, 0);           /* (a new mapping: zeros) */
        } else {
            half_start(t, o);
        }
    }
    if (s && big) {
        s->stage = t->stage;
        s->half_size = t->half_size;
    }
    if (s) {
        /* after a failure the thread holds and drops as usual, its halves' use unknown here */
        s->sink_half = rc == 0 ? t->half : -1;
        s->sink_done = 0;
    }
    pthread_mutex_unlock(&g_lock);
    errno = e;
    return rc;
}

/* An anonymous thread's lines out of memory: into a file of its own, or, where none can be
 * made, the shared one. */
static int anon_out(struct tstate *t)
{
    return g_sink ? sink_flush(t) : anon_to_file(t);
}

/* At the exit (and a detach): write every such thread's complete lines (the other threads
 * go on running) of its current half, as a reader of a .tail takes them: up to the last
 * newline before the first NUL (a half is cleared before it is begun, and a line's newline
 * is written last).  Not before a scan: where the shared file is needed, the scan cannot
 * write its result either (it says so, "#noscan"). */
void sink_catch_up(void)
{
    if (!g_sink)
        return;
    pthread_mutex_lock(&g_lock);
    sink_catch_up_locked();
    pthread_mutex_unlock(&g_lock);
}

void sink_catch_up_locked(void)
{
    if (!g_sink)
        return;
    for (size_t i = 0; i < R.n; i++) {
        struct file_slot *s = &R.a[i];
        if (s->state != SLOT_ANON || s->sink_half < 0 || !s->stage)
            continue;
        const char *b = s->stage + (size_t)s->sink_half * s->half_size + HALF_HDR;
        size_t room = s->half_size - HALF_HDR - s->sink_done;
        const char *from = b + s->sink_done, *z = memchr(from, 0, room);
        size_t len = (size_t)((z ? z : from + room) - from);
        while (len && from[len - 1] != '\n')
            len--;
        size_t start = 0, *st[1] = { &start }, *n[1] = { &len };
        sink_write_locked(1, &from, st, n);
        s->sink_done += start;
    }
}

/* At the exit: threads that lost their events for want of a file of their own (they are
 * counted in "#lost" too), as "#nofile THREADS ERRNO" (the report says why, and what to do:
 * a drop of root that mmleak.so did not see, no descriptor left, a full disk); into LINE
 * (CAP bytes, 64 are enough), or 0 bytes when there were none. */
atomic_uint g_nofile;
atomic_int g_nofile_err;

size_t nofile_line(char *line, size_t cap)
{
    unsigned threads = atomic_exchange(&g_nofile, 0);
    if (!threads)
        return 0;
    char *e = line + cap, *d = line;
    d = cat(d, e, "#nofile ");
    d = cat_u(d, e, threads);
    d = cat(d, e, " ");
    d = cat_u(d, e, (unsigned long)atomic_load(&g_nofile_err));
    d = cat(d, e, "\n");
    return (size_t)(d - line);
}

/* Say LINE (N bytes of whole '#' lines) in the thread's own file while it is open (in its
 * staging half: the slack behind `end` has room for a few lines), else in the late file. */
void note_line(struct tstate *t, const char *line, size_t n)
{
    if (!n)
        return;
    if (t->cur && t->open && !t->anon && !t->dropping)
        stage_line(t, line, n);
    else
        late_shared(line, n);
}

/* The general writer: any width, any depth.  Builds the line on the stack, then reserves
 * its bytes and copies them, newline last. */
static int emit_cold(struct tstate *t, const char *line, size_t n);

static int emit_free_cold(struct tstate *t, const char *line, size_t n);

int emit(const char *line, size_t n)
{
    struct tstate *t = &T;
    if (unlikely(t->dead | t->dropping) || t->end - t->cur < (ptrdiff_t)(n + 16)) {
        int rc = emit_cold(t, line, n);
        if (rc <= 0)
            return 0;
    }
    char *d = reserve(t, n);
    memcpy(d, line, n - 1);
    atomic_signal_fence(memory_order_release);
    d[n - 1] = '\n';
    return 1;
}

/* A free, written like any event; but a thread that has no file yet and never allocated
 * puts its first frees in the shared late file instead of making a file for them.  The
 * thread may be past its last key destructor: glibc frees a dlerror() or strerror() buffer
 * after them, and when tracing started after the buffer was made (MMLEAK_PAUSED, attach)
 * that free is the thread's first event; a file it made then could never be given up (our
 * key destructor would not run again) and stayed behind, one per ending thread.  glibc frees
 * a handful of such buffers; past EARLY_FREES frees (a write each) the thread is evidently
 * going on, freeing what others allocated, and makes its file. */
#define EARLY_FREES 16

int emit_free(const char *line, size_t n)
{
    struct tstate *t = &T;
    if (unlikely(!t->stage) && !t->open && !t->dead && !t->dropping && !t->late &&
        t->early_frees < EARLY_FREES)
        return emit_free_cold(t, line, n);
    return emit(line, n);
}

static int emit_free_cold(struct tstate *t, const char *line, size_t n)
{
    INFLIGHT;
    if (g_state != 1)
        return 0;
    if (g_pid != getpid() || t->trace_gen != g_trace_gen)
        return emit(line, n);   /* a forked child, an old trace: the ordinary way */
    late_shared(line, n);
    t->early_frees++;
    return 0;
}

/* The part of emit that touches files: counted in g_inflight, so that a detach waits for it
 * (and, begun after the detach, it does nothing).  1: room was made; 0: nothing to write. */
static int emit_cold(struct tstate *t, const char *line, size_t n)
{
    INFLIGHT;
    if (g_state != 1)
        return 0;
    if (t->dead) {
        late_shared(line, n);
        return 0;
    }
    if (t->dropping)
        return drop_event(t, n + 16);
    if (late_direct(t)) {
        append_direct(t, line, n);
        return 0;
    }
    if (unfinished_line(t)) {
        /* a signal handler, while the line it interrupted is unfinished: no flush */
        if (!t->stage || half_end(t) + SLACK - t->cur < (ptrdiff_t)(n + 16)) {
            /* deeper than the slack (a storm of signals that keeps the interrupted line
             * from finishing): the event is lost, counted, and "#lost" says so after the
             * next flush, so every report says the trace is incomplete */
            t->lost++;
            return 0;
        }
        return 1;
    }
    char gap[64];
    size_t ng = t->lost ? lost_line(gap, sizeof gap, t->lost, 0) : 0;
    if (make_room(t, n + 16 + ng)) {
        if (t->dropping)
            t->lost++;
        return 0;
    }
    if (ng && !t->dropping) {       /* events lost under an unfinished line, see above */
        stage_line(t, gap, ng);
        t->lost = 0;
    }
    return 1;
}

/* The thread's state belongs to an earlier trace of this process (a detach came between):
 * forget it.  Its staging mapping was closed by the detach, from outside. */
void thread_reset(struct tstate *t)
{
    t->stage = NULL;
    t->cur = t->end = NULL;
    hold_free(t);           /* its lines are lost: the halves' "#dropping" said so */
    t->holding = 0;
    t->open = t->dropping = t->anon = t->late = 0;
    t->late_lines = t->exit_rounds = t->early_frees = 0;
    t->slot = 0;
    t->lost = 0;
    t->walks = 0;
    t->ustart[0] = t->ustart[1] = t->ulen[0] = t->ulen[1] = 0;
    sset_clear(t);
    t->trace_gen = g_trace_gen;
}

