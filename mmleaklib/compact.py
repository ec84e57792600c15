"""Compaction (mmleak-compaction(7), docs/compaction.rst): disk use bounded by the live set.

Every complete dump file of a trace is folded into the trace's running partial result,
mmleak.ID.compact and its newer runs mmleak.ID.compact.N (levels: see _fold; each a shrink
without --final: the same algebra, so folding is exact in any order and grouping), and
deleted.  A file is complete when it ends with "#end" (mmleak.so
never appends to such a file) or when its process is gone.  One pass, under the trace's
lock (mmleak.ID.lock, which report takes shared while it reads):
  1. inputs listed by the previous pass ("#folded") that still exist are deleted: that
     pass wrote its result and was stopped before it could;
  2. the new result (or run) is written to its name + .tmp, fsync'ed, renamed over it,
     its directory fsync'ed, and names its inputs (dump files, runs merged) in "#folded";
  3. the inputs are deleted.
A crash anywhere leaves either the old result and all inputs, or the new result and some
inputs it names: never a lost or a doubled event (and folding an input twice changes
nothing anyway: the shrink ignores an event it already has).

Also here: the liveness of a trace's process, readers' shared lock (read_trace), `run`'s
background compactor and `recover`."""
import contextlib
import errno
import io
import os
import stat
import sys
import tempfile
import time

from . import errors, files
from .dumpformat import (NOT_KEPT, STACK_REF_RE, clock_line, compacted_line, folded_line,
                         header_file, header_int, parse_header, parse_tagged, read_head,
                         result_header)
from .errors import EXIT_INPUT, EXIT_OK, Fail, Refused, refuse, warn
from .files import TraceFiles, tail_of
from . import series as series_mod
from .series import add_point, point_due
from .native import Abandoned
from .shrink import shrink_files, shrink_raw
from .sites import human_bytes


class TraceLock:
    """flock on mmleak.ID.lock: exclusive for a compaction pass, shared for a reader.

    The first compactor makes the file; as root, it gives it to the owner of the trace's
    files, so that a reader or a compactor running as the traced service's user can open it
    too.  A reader never makes it (it leaves no file behind): with no lock file, no
    compactor ever ran, and a reader that a first pass overtakes finds a file gone and reads
    again (read_trace), under the lock that pass made."""

    def __init__(self, directory, tid, shared=False, wait=True, limit=None):
        self.directory, self.tid = directory, tid
        self.path = TraceFiles(directory, tid).lock
        self.shared, self.wait, self.fd = shared, wait, None
        self.limit = limit          # seconds a waiting taker waits at most (None: for ever)
        self.held = False           # whether the lock was taken (it stays True after exit)

    def _open(self):
        """A descriptor of the lock file, or None (no lock to take: none made yet, or it
        cannot be made or opened).  A lock file that is not a regular file of the trace's
        owner or root is refused (Refused): another user could hold it, or make a reader
        wait on a FIFO for ever."""
        uids = files.trusted_uids(self.directory, self.tid)
        for mode in ((os.O_RDONLY,) if self.shared else (os.O_RDWR, os.O_RDONLY)):
            try:
                return files._open_checked(self.path, mode, uids)
            except FileNotFoundError:
                return None if self.shared else self._create()
            except Refused:
                raise
            except OSError:
                continue
        return None

    def _create(self):
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
        except FileExistsError:         # made by another compactor meanwhile
            return self._open()
        except OSError:
            return None
        owner = files.trace_owner(self.directory, self.tid)
        if os.geteuid() == 0 and owner is not None and owner[0] != 0:
            try:
                os.fchown(fd, owner[0], owner[1])
            except OSError:
                pass
        return fd

    def __enter__(self):
        import fcntl
        self.fd = self._open()
        if self.fd is None:
            return self
        op = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        try:
            fcntl.flock(self.fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            if not self.wait:
                os.close(self.fd)
                self.fd = None
                raise
            # A pass holds it for seconds; but the trace's owner may hold it as long as it
            # likes (the lock file is the owner's): never wait without saying for whom, and
            # a reader (LIMIT) not for longer than its user asked
            holders = lock_holders(self.fd) or "another process"
            warn("trace %s: waiting for its lock %s, held by %s" % (self.tid, self.path, holders))
            if self.limit is None:
                fcntl.flock(self.fd, op)
            elif not self._wait_for(op):
                os.close(self.fd)
                self.fd = None
                raise Fail("trace %s: its lock %s still held by %s after %g s: gave up "
                           "(--lock-wait SECONDS to wait longer, 0 for ever)"
                           % (self.tid, self.path, holders, self.limit))
        self.held = True
        return self

    def _wait_for(self, op):
        """Take the lock within self.limit seconds (polled: flock has no timeout, and an
        alarm would interrupt the caller's own waits): whether it was taken."""
        import fcntl
        deadline = time.monotonic() + self.limit
        while True:
            try:
                fcntl.flock(self.fd, op | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(0.05, left))

    def downgrade(self):
        """A pass's exclusive lock made shared, for what it does after it deleted its
        inputs (a point of the series: it reads the trace and replaces its own files
        atomically): readers (report, the scan at a process's exit) go on meanwhile, other
        compactors still skip the trace.  (Linux converts a flock without letting another
        exclusive lock in when no one else holds it, as here.)"""
        import fcntl
        if self.fd is not None and not self.shared:
            fcntl.flock(self.fd, fcntl.LOCK_SH)
            self.shared = True

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def changing(self):
        """A context manager: the directory lock around a pass's changes to the files
        readers read (the rename of a result or run, the deletion of what it folded): a
        write lock on byte 0 of the lock file (an open file description's lock, fcntl
        F_OFD_SETLK: independent of the flock, released by the kernel when the pass dies).
        The reachability scan takes it for reading while it lists and opens the files of its
        cut (tools/scan_cut.c), then reads them without any lock: what it holds is the trace as
        a kill of this pass at that moment would leave it, and it need not wait for the pass
        (mmleak-compaction(7)).  Waits while a scan lists (milliseconds); past 30 s, Fail
        (nothing changed).  Without a lock file, nothing to take; a lock file this compactor
        can only read cannot hold a write lock: Fail (nothing changed)."""
        return _DirLock(self.fd, self.path)


def lock_holders(fd):
    """Who holds a lock on the file FD is open on, from /proc/locks: "pid N (COMMAND)",
    joined; "" when it says none (another pid namespace's holder shows as none)."""
    st = os.fstat(fd)
    where = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    pids = []
    try:
        with open("/proc/locks") as f:
            for line in f:
                w = line.split()
                if len(w) > 5 and w[5] == where and w[4].isdigit() and w[4] not in pids:
                    pids.append(w[4])
    except OSError:
        return ""
    out = []
    for pid in pids:
        try:
            with open("/proc/%s/comm" % pid) as f:
                out.append("pid %s (%s)" % (pid, f.read().strip()))
        except OSError:
            out.append("pid %s" % pid)
    return ", ".join(out)


class _DirLock:
    """TraceLock.changing's lock, on the descriptor FD of the lock file PATH (None: none)."""
    def __init__(self, fd, path=None):
        self.fd, self.path, self.held = fd, path, False

    def _set(self, kind):
        import fcntl
        import struct
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for an OFD lock)
        fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", kind, os.SEEK_SET,
                                                              0, 1, 0))

    def __enter__(self):
        import fcntl
        if self.fd is None:
            return self
        until = time.monotonic() + 30
        while True:
            try:
                self._set(fcntl.F_WRLCK)
                self.held = True
                self._mark()
                return self
            except OSError as e:
                if e.errno == errno.EBADF:      # opened read-only: nothing changed
                    raise Fail("%s: cannot take the trace's directory lock: the lock file "
                               "is read-only to this compactor" % self.path)
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EINTR):
                    raise
            if time.monotonic() > until:
                raise Fail("%s: a reachability scan held its directory lock for 30 s"
                           % self.path)
            time.sleep(0.002)

    def _mark(self):
        """Before a pass's first change, the lock file gets a byte: a scan that finds it
        empty (mmleak.so makes it with the trace's id, or a compactor did) knows no pass
        ever changed the trace's files, and opens them by name (tools/scan_cut.c,
        take_lock).  Unmarked, no change is made (Fail)."""
        try:
            if os.fstat(self.fd).st_size == 0:
                os.pwrite(self.fd, b"c", 0)
        except OSError as e:
            self.__exit__()
            raise Fail("%s: cannot mark the trace's lock file: %s" % (self.path, e.strerror))

    def __exit__(self, *exc):
        import fcntl
        if self.held:
            self._set(fcntl.F_UNLCK)
            self.held = False


PROCESS_HIDDEN = "hidden"


def _process_start_time(pid):
    """When process PID started (Unix seconds); None if there is no such process;
    PROCESS_HIDDEN if it exists but its /proc entry cannot be read (/proc mounted with
    hidepid=, another user's process)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            btime = next(int(l.split()[1]) for l in f if l.startswith("btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except (PermissionError, OverflowError):
        pass
    return PROCESS_HIDDEN


def _process_start_ticks(pid):
    """When process PID started, in clock ticks after boot (field 22 of /proc/PID/stat, the
    kernel's: mmleak.so writes its own as pstart=), or None when it cannot be read."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _staging_ids(tails):
    """{(major, minor, inode): name} of the staging files TAILS (paths) that are regular
    files."""
    want = {}
    for t in tails:
        try:
            st = os.lstat(t)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            want[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = os.path.basename(t)
    return want


_MAPPER = {}         # (major, minor, inode) of a staging file -> the pid last seen mapping it


def _maps_any(pid, want):
    """Does process PID map one of the files WANT ({(major, minor, inode): name})?"""
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return False                    # gone, or not ours to look at
    inodes = {b" %d " % k[2] for k in want}
    if not any(i in data for i in inodes):
        return False
    names = set(want.values())
    for line in data.split(b"\n"):
        f = line.split(None, 5)
        if len(f) < 6 or b" %s " % f[4] not in inodes:
            continue
        major, _, minor = f[3].partition(b":")
        try:
            key = (int(major, 16), int(minor, 16), int(f[4]))
        except ValueError:
            continue
        name = os.path.basename(f[5].strip().removesuffix(b" (deleted)")).decode(
            "utf-8", "replace")
        # the same file; or one of that name and inode on another device number (a file
        # system seen through an overlay in a container)
        if key in want or name in names and any(k[2] == key[2] for k in want):
            _MAPPER[key] = pid
            return True
    return False


def _staging_mapped(tails):
    """Does any process we can see map one of the staging files TAILS (paths)?  The process
    writing a trace maps them, whatever its pid looks like from here: in another pid
    namespace (a container, `unshare -p`) its files carry a pid that is not its pid here, or
    no process's.  Known by device and inode, in every /proc/PID/maps we can read (the last
    process found first)."""
    want = _staging_ids(tails)
    if not want:
        return False
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        pids = []
    first = [_MAPPER[k] for k in want if k in _MAPPER]
    return any(_maps_any(pid, want) for pid in first + pids)


_ROOT_SAW_ALIVE = False     # set in _compact_as_owner's child: root saw the trace alive


def trace_alive(directory, tid, traces=None, start=None, tails=(), pstart=None):
    """Is trace TID still being written?  Its process must exist, be the same process (not a
    reused pid: its start in clock ticks after boot is the trace's PSTART, which no process
    can fake; a trace without one: it started before the trace, or it has one of the trace's
    staging files mapped, should the wall clock have been set forward since the trace
    began), and not have been replaced by exec (a newer trace of the same pid in
    DIRECTORY).  A process that exists but cannot be looked at counts as alive.  And
    whatever its pid says, a trace whose staging files (TAILS) a process maps is alive
    (_staging_mapped: known by device and inode, files of the trace's owner that another
    user cannot map)."""
    if _ROOT_SAW_ALIVE:                 # (a child of root's, as the trace's owner)
        return True
    pid = int(tid.split("-")[0])
    began = _process_start_time(pid)
    over = began is None
    ticks = _process_start_ticks(pid) if not over and pstart is not None else None
    if ticks is not None:
        # another process at the pid (reused, or the trace's own seen from another pid
        # namespace: its staging files say so below) did not start when the trace's did
        over = ticks != pstart
    elif not over and began is not PROCESS_HIDDEN and start is not None and \
            began > start + 2 and not (tails and _maps_any(pid, _staging_ids(tails))):
        over = True                     # the pid was reused
    if not over:
        traces = traces if traces is not None else files.find_traces(directory)
        k = int(tid.split("-")[1]) if "-" in tid else 0
        over = any(o.split("-")[0] == str(pid) and (int(o.split("-")[1]) if "-" in o else 0) > k
                   for o in traces)     # exec'd: this image's trace is over
    return not over or bool(tails) and _staging_mapped(tails)


def _staged_header(tail):
    """The header of a dump file still in its staging file TAIL (a process killed before its
    first flush leaves the .out empty), or None."""
    try:
        with files.open_trace_file(tail) as f:
            head = f.read(8192)
    except (OSError, Refused):
        return None
    for line in head.split(b"\n")[:4]:         # after the half's "#at" line
        h = parse_header(line + b"\n")
        if h:
            return h
    return None


def _trace_birth(paths):
    """(start, pstart) of the trace of PATHS (its dump files, result, runs) from the first
    header that has a start: its wall clock time and its process's start in clock ticks
    after boot (None each when absent: pstart is new in mmleak.so of round 6)."""
    for p in paths:
        h = files._first_header(p)
        if not h and tail_of(p):
            h = _staged_header(tail_of(p))
        if h and header_int(h, "start", None) is not None:
            return header_int(h, "start"), header_int(h, "pstart", None)
    return None, None


def complete_files(directory, tid, paths, traces=None):
    """The dump files of TID (among PATHS) that can be folded now, whether the trace is over,
    and the staging files it has (a trace over with some: its process did not close its
    files)."""
    outs = [p for p in paths if tail_of(p)]
    tails = [tail_of(p) for p in outs if os.path.lexists(tail_of(p))]
    # (a result's header is the trace's first: it says when, once every dump file is folded)
    start, pstart = _trace_birth(outs + [p for p in paths if p not in outs])
    alive = trace_alive(directory, tid, traces, start, tails, pstart)
    if not alive:
        return outs, True, tails
    return [p for p in outs if tail_of(p) not in tails and files._ends_with_end(p)], False, \
        tails


def _compact_header_lines(sh, folded, run=None):
    """The '#' lines of a compacted result (SH from shrink_raw): one '#mmleak' header (the
    trace's first), the command, the allocator, the gaps, the counts, and the names of the
    inputs of this pass."""
    out, seen_hdr = [], False
    tags = [parse_tagged(line)[0] for line in sh.header_lines]
    # the trace's first: a result's (it has no file=), else the lowest file= (whatever the
    # order the inputs were read in: a merge reads the oldest level last)
    first = min((l for l, t in zip(sh.header_lines, tags) if t == b"mmleak"), default=None,
                key=header_file)
    for line, tag in zip(sh.header_lines, tags):
        if tag == b"mmleak":
            if seen_hdr:
                continue
            seen_hdr = True
            out.append(result_header(first))
        elif tag not in NOT_KEPT:
            out.append(line)
    entries, entry_allocs = sh.result_lines
    h = sh.history()
    files = sh.compacted["files"] + sum(1 for p in folded if p.endswith(".out"))
    out.append(clock_line(sh.max_time))
    out.append(compacted_line(files, h["events"], entries, h["allocs"], entry_allocs,
                              int(time.time()), run))
    out.extend(folded_line(os.path.basename(p)) for p in folded)
    return out


def _write_atomic(path, header_lines, sh, data, raw=None, guard=None):
    """The result: its header lines, the stacks its allocations use, its event lines DATA
    (None: they are in the file RAW, and the compiled shrinker gave the stacks they use);
    written to PATH.tmp, flushed to disk, renamed over PATH.  Returns the lines written
    before the events (the header lines and the stacks)."""
    used = sh.raw_result["stacks"] if data is None else \
        sorted({int(x, 16) for x in STACK_REF_RE.findall(data)})
    head = list(header_lines) + [sh.stack_lines[i] for i in used if i in sh.stack_lines]

    def fill(f):
        f.write(b"".join(head))
        if data is not None:
            f.write(data)
            return
        f.flush()               # then the lines, copied by the kernel: no copy in Python
        size, at = os.fstat(raw.fileno()).st_size, 0
        while at < size:
            n = os.sendfile(f.fileno(), raw.fileno(), at, min(size - at, 1 << 30))
            if n <= 0:
                raise OSError(errno.EIO, "short copy of the shrink's result")
            at += n
    files.replace(path, fill, sync=True, guard=guard)
    return head


def compact_trace(directory, tid, paths=None, traces=None, series=True, stopping=None,
                  folded=None, view=False, abandon=None, levels=False, base=True, defer=None,
                  progress=None):
    """One compaction pass over trace TID, and a point of its series when one is due
    (SERIES: False never; STOPPING, a function: when it says True, no point but the last of
    a trace that is over: `run`'s compactor, once its program has ended, leaves the point to
    its last pass, which reads the trace as it ends; FOLDED, a function: called with TID once
    the files are folded, before the point, and what a reader of the whole trace would get
    from it when the pass has it (_result_view: the trace is over and folded into one
    result), else None; VIEW: a trace over is then read whole, for FOLDED, when its pass
    folded nothing, left levels (LEVELS) or did not use the compiled shrinker; ABANDON, a
    function: when it says True, the fold, a merge of levels or a point of a trace not over
    is given up, or not begun (the compiled shrinker asks it as it reads: `run`'s compactor,
    once its program has ended, does not wait for them: the files and runs they read stay as
    they were, and the last pass folds them; what was written before stands); LEVELS: a
    trace over keeps its levels (`run`'s compactor): its new files are folded into a run and
    merged by the usual rule, as while it ran, not everything into mmleak.ID.compact (its
    last point and FOLDED's view then read the levels, as a reader does); BASE: the first
    fold writes the result's base for the last point (series.save_base; `run --check`'s
    compactor does not: its last pass reads the whole trace for the verdict); DEFER, a
    function: a point due while the trace runs is put off when complete files the pass did
    not fold are waiting (the compactor is behind the program: the point would read what
    the next pass rewrites, on the core the program needs) and DEFER(TID, True) says so;
    it is called with False when the pass is not behind; so is a merge of a trace not over
    (_fold's HOLD), asked as the merge is due; PROGRESS: see _fold_into.  Returns
    a dict of what it did, or None when another compactor holds the trace (it is skipped,
    not waited for).  A file it cannot trust (Refused) or write stops the pass over this
    trace (Fail), and nothing is deleted."""
    traces = traces if traces is not None else files.find_traces(directory)
    files.say_ignored(traces, tid)
    paths = paths if paths is not None else traces.get(tid, [])
    t = TraceFiles(directory, tid)
    cpath = t.compact
    try:
        lock = TraceLock(directory, tid, wait=False).__enter__()
    except BlockingIOError:
        return None
    except Refused as e:                # (a lock file of another user's: said once, as such)
        raise Refused("trace %s: not folded: %s" % (tid, e))
    try:
        # a merge into the result killed after it staged the base and .live of its new
        # result: in place if its rename was made, else removed
        series_mod.finish_result_merge(directory, tid, lock.changing)
        runs = _runs(directory, tid)
        for r in [cpath] + [p for _, p in runs]:
            if files._own_file(r):
                with lock.changing():
                    for name in files._previously_folded(r, tid):
                        _remove_dump(os.path.join(directory, name))   # .out and .tail, a run
        for p in [cpath, t.series, t.live, series_mod.base_path(directory, tid)] + \
                [n for n, _ in series_mod._pending(directory, tid)] + \
                [p for _, p in runs]:                                   # left by a pass that
            files._remove_quietly(files.temp_of(p))                    # was stopped
        paths = [p for p in paths if os.path.lexists(p)]
        done, over, tails = complete_files(directory, tid, paths, traces)
        res = {"trace": tid, "folded": 0, "over": over, "events": 0, "bytes": 0,
               "point": None, "unclosed": len(tails) if over else 0}
        now = None
        if done or over and not levels and _runs(directory, tid):
            try:
                res.update(_fold(directory, tid, cpath, done, over, lock.changing, abandon,
                                 levels, base=series and base, progress=progress,
                                 hold=None if over or not defer else
                                 lambda: defer(tid, _behind(directory, tid, done))))
            except Abandoned:           # the new files' fold given up: they stay as they are
                res["abandoned"] = 1
                return res
            now = res.pop("now")
        # a trace that is over gets its last point (unless it has it: the .live is gone)
        point = series and paths and (over and (done or os.path.lexists(t.live) or
                                                not os.path.lexists(t.series))
                                      or not over and point_due(directory, tid) and
                                      not (stopping and stopping()) and
                                      not (abandon and abandon()))
        if over and now is None and (point and not (levels and not view and
                                                    series_mod.incremental_ready(directory, tid))
                                     or view and paths):
            # folded already (or not by the compiled shrinker): the trace is read once, for
            # its last point and the caller's verdict both, under the lock made shared
            lock.downgrade()
            sh = series_mod._live_now(directory, tid, stream=True)[0]
            now = (sh, sh.live())
        if folded:
            folded(tid, now)
        if point and not over and defer and defer(tid, _behind(directory, tid, done)):
            point, res["deferred"] = False, 1
        if point:
            lock.downgrade()
            try:
                res["point"] = add_point(directory, tid, final=over, now=now,
                                         cancel=None if over else abandon)
            except Abandoned:           # (nothing of the point written)
                res["abandoned"] = 1
        if over:
            files._remove_quietly(series_mod.base_path(directory, tid))
        return res
    finally:
        lock.__exit__()


def _behind(directory, tid, seen):
    """Are complete dump files of trace TID waiting that are not among SEEN (those the pass
    folded): did the program complete files faster than the pass folded them?"""
    traces = files.find_traces(directory)
    new = [p for p in traces.get(tid, []) if p not in seen and tail_of(p)]
    return bool(new) and bool(complete_files(directory, tid, new, traces)[0])


MERGE_FACTOR = 4      # a run is merged into the one before it when that is at most this
                      # many times bigger than what is folded into it now
HOLD_RUNS = 8         # levels a pass behind its program may leave unmerged (_fold's HOLD)


def _runs(directory, tid):
    """[(N, path)] of the trace's runs, mmleak.ID.compact.N, by N (oldest first): regular
    files of the trace's owner or root only (another file at such a name is said, never
    read, and replaced should its number come up)."""
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for n in names:
        m = files.RUN_RE.match(n)
        if m and m.group(1) == tid and files._own_file(os.path.join(directory, n)):
            out.append((int(m.group(2)), os.path.join(directory, n)))
    return sorted(out)


def _next_run(directory, tid, runs, cpath):
    """A run number no file of the trace has, nor names in its "#folded" lines (a name
    still named there would be deleted as already folded)."""
    used = [n for n, _ in runs]
    for r in [cpath] + [p for _, p in runs]:
        if files._own_file(r):
            used.extend(int(files.RUN_RE.match(name).group(2))
                        for name in files._previously_folded(r, tid)
                        if files.RUN_RE.match(name))
    return max(used, default=0) + 1


def _fold(directory, tid, cpath, done, over=False, guard=None, abandon=None, levels=False,
          base=False, progress=None, hold=None):
    """Fold the complete files DONE into the trace's result (under the trace's exclusive
    lock).  The result is mmleak.ID.compact and newer runs mmleak.ID.compact.N, each at
    least MERGE_FACTOR times smaller than the one before it.  DONE are folded alone into a
    new run (a pass costs what its new files hold: their size says little of what they
    leave, a file of freed blocks leaves nothing), then the newest runs are merged into the
    one before them as long as that one is at most MERGE_FACTOR times what they hold
    (_merge_start; each line is merged about log4 of the live set over a run's lines times).  The
    trace over (OVER, unless LEVELS: `run`'s compactor leaves the levels, but when DONE
    would make a run merged into the result at once or a merge was given up: see
    `straight` below), or no result yet: everything into
    mmleak.ID.compact.  GUARD: the
    pass's directory lock (TraceLock.changing), around each change readers see.  ABANDON
    (a function, the trace not over): when it says True, the fold of DONE into a new run
    (native.Abandoned raised) or the merge after it (the new run stands) is not begun, or
    given up as it reads: its temporary file dropped, nothing renamed, nothing deleted.
    BASE: the first fold of a trace not over (no result yet) also writes the result's
    base for the series' last point (series.save_base), from its own reading.  PROGRESS:
    see _fold_into.  HOLD (a function, the trace not over): asked when the rule would merge
    runs and the levels (the result and its runs, the new one included) are HOLD_RUNS at
    most; True: no merge (runs may then be as big as the
    level before them: the last pass folds them straight into the result)."""
    own = files._own_file(cpath)
    runs = _runs(directory, tid)
    before = (files._size(cpath) if own else 0) + sum(files._size(p) for _, p in runs)
    nbytes = sum(files._size(p) + files._size(tail_of(p)) for p in done)
    work = {"read": 0, "written": 0, "merged": 0, "abandoned": 0}
    sh, now = None, None
    # `run`'s last pass (the trace over, LEVELS) when the compactor fell behind the program:
    # the files waiting would make a run that the rule merges into the result at once (what
    # the levels kept of the events so far says what the files will keep), or a merge was
    # given up at the program's end or held while behind it (HOLD: a run not MERGE_FACTOR
    # times smaller than the level before it, which the rule leaves only so): one shrink of
    # the files with every level into the result, instead of a run written, then read again
    # (or left beside the result for every reader to put through its table)
    sizes = [files._size(cpath)] + [files._size(p) for _, p in runs]
    straight = over and levels and own and bool(done) and (
        _merge_start(sizes + [nbytes * _kept([cpath] + [p for _, p in runs])]) == 0 or
        any(MERGE_FACTOR * b >= a for a, b in zip(sizes, sizes[1:])))
    if over and (not levels or straight) or not own:
        chain = ([cpath] if own else []) + [p for _, p in runs]
        # the result, the biggest, last: the compiled shrinker streams it (_fold_into)
        token = series_mod.before_result_merge(directory, tid, cpath, chain[1:] + done,
                                               over) if own else None
        merged = False
        try:
            sh = _fold_into(directory, tid, cpath, None, chain[1:] + done + chain[:1] if own
                            else chain + done, work, live=over or base and not own,
                            stream_last=own, guard=guard, staged=_stage(directory, tid,
                                                                        token, guard),
                            progress=progress)
            merged = True
        finally:
            series_mod.after_result_merge(directory, tid, cpath, token, merged, guard)
        work["merged"] = len(chain)
        if base and not own and not over and sh.native_blocks is not None:
            from .blocks import Live
            try:
                series_mod.save_base(directory, tid, cpath, sh,
                                     Live(sh.native_blocks, [], sh.stacks), guard)
            except (Fail, OSError):     # no base: the last point reads the trace whole
                files._remove_quietly(series_mod.base_path(directory, tid))
            sh.native_blocks = None
        # the trace over, everything is folded into the result: its survivors, which the
        # compiled shrinker left from the same reading, are the trace's, for its last point
        # and for `run --check`'s verdict (_result_view: the result as a reader reads it)
        if over and sh.native_blocks is not None:
            now = _result_view(cpath, sh)
    else:
        if abandon and abandon():
            raise Abandoned()
        run = _next_run(directory, tid, runs, cpath)
        sh = _fold_into(directory, tid, TraceFiles(directory, tid).run(run), run, done, work,
                        guard=guard, cancel=abandon, progress=progress)
        chain = [(None, cpath)] + _runs(directory, tid)
        i = _merge_start([files._size(p) for _, p in chain])
        if i < len(chain) - 1 and len(chain) <= HOLD_RUNS and not over and hold and hold():
            # behind the program: no level is rewritten while files wait that the next pass
            # folds (for a growing live set, a merge rewrites what the next one rewrites
            # again, on the core the program and its scan at exit need); the last pass folds
            # the runs left straight into the result
            i = len(chain) - 1
        if i < len(chain) - 1 and not (abandon and abandon()):
            (older, target) = chain[i]
            token, merged = None, False
            try:
                # a merge into the result brings its base and the series' .live along (what
                # they become is read before the merge: given up too, as the merge is)
                # (the trace over: no base, the merge's own survivors make the last point)
                token = series_mod.before_result_merge(
                    directory, tid, cpath, [p for _, p in chain[1:]], over,
                    cancel=abandon) if i == 0 else None
                # (a result without its base, a compactor killed between a merge's rename and
                # the base's: this merge's survivors give it one again)
                again = base and not over and token is not None and token["base"] is None
                msh = _fold_into(directory, tid, target, older,
                                 [p for _, p in chain[i + 1:]] + [target], work,
                                 stream_last=True, live=again or over and i == 0,
                                 guard=guard, cancel=abandon,
                                 staged=_stage(directory, tid, token, guard),
                                 progress=progress)
                work["merged"] = len(chain) - 1 - i
                merged = True
                if over and i == 0 and msh.native_blocks is not None:
                    # every run merged into the result of a trace over (`run`'s last pass):
                    # its survivors, from the merge's reading, are the whole trace's, for
                    # its last point and the verdict, as when everything is merged (above)
                    now = _result_view(cpath, msh)
                    msh.native_blocks = None
                if again and msh.native_blocks is not None:
                    from .blocks import Live
                    series_mod.save_base(directory, tid, cpath, msh,
                                         Live(msh.native_blocks, [], msh.stacks), guard)
                    msh.native_blocks = None
            except Abandoned:
                work["abandoned"] = 1
            finally:
                series_mod.after_result_merge(directory, tid, cpath, token, merged, guard)
    after = sum(files._size(p) for p in [cpath] + [p for _, p in _runs(directory, tid)])
    return {"folded": len(done), "events": sh.events - sh.compacted["entries"],
            "bytes": nbytes, "before": before, "after": after,
            "malformed": sh.problems.malformed,
            # the work of this pass: event lines read (the new files' and the runs'
            # entries), lines written, and the runs merged into an older one
            "read": work["read"], "written": work["written"],
            "merged": work["merged"], "abandoned": work["abandoned"],
            "runs": len(_runs(directory, tid)), "now": now}


def _stage(directory, tid, token, guard):
    """The STAGED of _fold_into for a merge into the result (TOKEN: before_result_merge's;
    None: no merge into the result, or nothing to bring along)."""
    if token is None:
        return None
    return lambda new: series_mod.stage_result_merge(directory, tid, new, token, guard)


def _kept(levels):
    """What the LEVELS (the result and its runs) kept of the events they folded: the event
    lines they hold over the events their "#compacted" lines count (1.0 when unknown)."""
    lines = events = 0
    for p in levels:
        try:
            with files.open_trace_file(p) as f:
                c = read_head(f, p)["compacted"] or {}
        except (OSError, Fail):         # (Refused too)
            return 1.0
        if None in (c.get("events", 0), c.get("entries", 0)):
            return 1.0                  # malformed
        events += c.get("events", 0)
        lines += c.get("entries", 0)
    return min(lines / events, 1.0) if events else 1.0


def _result_view(cpath, sh):
    """(Shrinker, blocks.Live) of the result CPATH just written by the fold SH whose
    compiled shrinker left the survivors as native blocks: what a reader of the whole trace
    (report, a point of the series), which is now CPATH alone, gets from it, without reading
    it: its header and stack lines (those written), its event lines' counts, its survivors.
    None when that reader would need the event lines themselves: a foreign free among them
    (a free line; the report lists them)."""
    from .blocks import Live
    from .shrink import Shrinker
    if sh.raw_result is None or sh.raw_result["frees"]:
        return None
    view = Shrinker()
    view.feed(sh.written_head, cpath)           # '#' lines only: no event
    if view.problems.malformed or view.problems.fatal or view.state or view.events:
        return None
    view.events, view.allocs = sh.result_lines
    view.frees = view.events - view.allocs
    view.files_done = 1
    view.native_blocks = sh.native_blocks
    return view, Live(sh.native_blocks, [], view.stacks)


def _merge_start(sizes):
    """SIZES: of the result and its runs, oldest first, the run just written last.  The
    index of the oldest to merge the newer ones into: the newest runs, as long as the one
    before is at most MERGE_FACTOR times what they hold together (len - 1: none)."""
    i, est = len(sizes) - 1, sizes[-1]
    while i > 0 and sizes[i - 1] <= MERGE_FACTOR * est:
        i -= 1
        est += sizes[i]
    return i


def _fold_into(directory, tid, target, run, inputs, work, live=False, stream_last=False,
               guard=None, cancel=None, staged=None, progress=None):
    """Shrink INPUTS into TARGET (run number RUN, None: mmleak.ID.compact), written
    atomically and naming in "#folded" the inputs it replaces, which are then deleted (a
    pass stopped in between leaves them to the next one, which sees them folded).  LIVE:
    the compiled shrinker also leaves the survivors as blocks (sh.native_blocks).
    STREAM_LAST: the last input is TARGET, a compacted result (sorted by address), the
    biggest: the compiled shrinker reads the others into its table and merges it with them
    as a stream (tools/shrink_merge.c, mmleak_shrink_merge), without a table entry per line; the
    result is the same (the shrink's algebra: any order, any grouping).  GUARD: the pass's
    directory lock (TraceLock.changing), around the rename and the deletions.  CANCEL: see
    native_shrink (Abandoned: nothing written, nothing deleted).  STAGED: a function
    called with TARGET's temporary file, written and flushed, before its rename (a merge
    into the result writes the base and .live it will have: series.stage_result_merge).
    PROGRESS: shrink.progress_printer's callback, or None."""
    folded = [p for p in inputs if p != target]
    renaming = guard
    if staged is not None:
        @contextlib.contextmanager
        def renaming():
            staged(files.temp_of(target))
            with guard() if guard else _DirLock(None):
                yield
    with tempfile.TemporaryFile(prefix="mmleak-shrink.") as raw:
        sh, data = shrink_raw(inputs, out=raw, live=live, stream_last=stream_last,
                              cancel=cancel, progress=progress)
        if progress:
            progress.end(sh, inputs[-1])
        if sh.problems.fatal:
            raise Fail("%s: cannot compact trace %s: an input could not be read"
                       % (directory, tid))
        sh.written_head = _write_atomic(target, _compact_header_lines(sh, folded, run), sh,
                                        data, raw, renaming)
    with guard() if guard else _DirLock(None):
        for p in folded:
            _remove_dump(p)
    work["read"] += sh.events
    work["written"] += sh.result_lines[0]
    return sh


def _remove_dump(p):
    """Delete the dump file P and its staging file: only what is the trace's (a file of
    somebody else's at either name is left alone)."""
    for q in (p, tail_of(p)):
        if q is not None:
            files.remove_trace_file(q)


def compact_dir(directory, pid=None, series=True, verbose=False, out=None, stopping=None,
                folded=None, view=False, abandon=None, levels=False, base=True, defer=None,
                progress=None):
    """One compaction pass over every trace in DIRECTORY (or trace PID).  Returns
    (live traces, results).  STOPPING, FOLDED, VIEW, ABANDON, LEVELS, BASE, DEFER: see
    compact_trace.  PROGRESS: shrink.progress_printer's callback (the folds' progress)."""
    out = out or sys.stdout
    traces = files.find_traces(directory, said=pid is None)    # (compact_trace says PID's)
    live, results = [], []
    for tid in sorted(traces, key=lambda t: [int(x) for x in t.split("-")]):
        if pid is not None and tid != pid:
            continue
        def one(d=directory, tr=traces):
            return compact_trace(d, tid, tr and tr[tid], tr, series=series,
                                 stopping=stopping, folded=folded, view=view, abandon=abandon,
                                 levels=levels, base=base, defer=defer, progress=progress)
        try:
            owner = files.trace_owner(directory, tid)
            if owner is not None and owner[0] != 0 and os.geteuid() == 0 and \
                    not (stopping or folded or abandon or defer) and _may_switch_users():
                # absolute, listed again: the owner may not search the directory we run in
                # Whether the trace is alive is root's to say: the owner may not read the
                # maps of a process of theirs that a daemon made (not dumpable), the only
                # sign of a trace alive in another pid namespace (_staging_mapped)
                outs = [p for p in traces[tid] if tail_of(p)]
                start, pstart = _trace_birth(outs + [p for p in traces[tid] if p not in outs])
                alive = trace_alive(directory, tid, traces, start,
                                    [tail_of(p) for p in outs if os.path.lexists(tail_of(p))],
                                    pstart)
                res = _compact_as_owner(owner, os.path.abspath(directory),
                                        lambda: one(os.path.abspath(directory), None), alive)
            else:
                res = one()
        except Fail as e:               # this trace is left as it is; the others go on
            refuse(str(e))
            continue
        except OSError as e:
            refuse("trace %s: %s" % (tid, errors.os_error_text(e)))
            continue
        if res is None:
            live.append(tid)                    # another compactor holds it: alive enough
            continue
        results.append(res)
        if not res["over"]:
            live.append(tid)
        if res["folded"] and verbose:
            out.write("%s: trace %s: folded %d files (%s, %d events) into %s (%s)%s\n"
                      % (errors.PROG, tid, res["folded"], human_bytes(res["bytes"]),
                         res["events"], os.path.basename(TraceFiles(directory, tid).compact),
                         human_bytes(res["after"]), "; the trace is over" if res["over"] else ""))
            if res["unclosed"]:
                out.write("%s: trace %s: its process ended without closing %d files (no process "
                          "this compactor can see maps their staging files)\n"
                          % (errors.PROG, tid, res["unclosed"]))
            out.flush()
    return live, results


def _may_switch_users():
    """Whether this process may take another user's ids (CAP_SETUID and CAP_SETGID in its
    effective set).  A service's root companion may not (its CapabilityBoundingSet=,
    mmleak-systemd(7)); it has no CAP_SYS_RESOURCE either, so what it writes for another
    user (given to that user: files.replace) is within that user's quota and outside the
    blocks reserved for root anyway."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    eff = int(line.split()[1], 16)
                    return bool(eff & (1 << 6) and eff & (1 << 7))
    except (OSError, ValueError):
        pass
    return False


def _compact_as_owner(owner, directory, func, alive):
    """FUNC() (a compaction pass over one trace, compact_trace) run, by root, as the trace's
    OWNER (uid, gid of its maps file) (_as_user): what the pass writes (result, runs, series,
    .live, lock) and deletes is done under the owner's permissions, disk quota and
    reserved-block limits, not root's (the trace's files may be as big as its owner likes),
    as `recover` does (_as_owner_of).  Returns FUNC's dict (its "point": whether one was
    made).  ALIVE: root saw the trace alive (the child does not look again: see
    compact_dir).  A DIRECTORY the owner cannot reach and write is root's: FUNC() then runs
    here."""
    def as_owner():
        global _ROOT_SAW_ALIVE
        _ROOT_SAW_ALIVE = alive
        res = func()
        if res is not None:
            res["point"] = res.get("point") is not None
        return res

    # a directory the owner cannot write (a daemon's files handed over by mmleak.so in
    # root's directory): root's to compact, as before
    return _as_user(owner[0], owner[1], as_owner, "the trace's owner",
                    usable=lambda: os.access(directory, os.W_OK | os.X_OK), fallback=func)


READ_LOCK_WAIT = 60.0      # seconds a reader waits for a trace's lock by default (--lock-wait)


def read_trace(directory, tid, progress=None, blocks=False, lock_wait=READ_LOCK_WAIT):
    """Shrink every file of trace TID as it is now, under the trace's lock (shared: no
    compaction pass deletes a file while we read).  Returns (Shrinker, the files read).
    BLOCKS: the final result only, survivors as native blocks (shrink_files).  LOCK_WAIT:
    the seconds to wait for the lock at most (None or 0: for ever), then Fail."""
    limit = lock_wait or None
    with TraceLock(directory, tid, shared=True, limit=limit) as lock:
        if lock.held:
            paths = files.find_traces(directory, only=tid).get(tid, [])
            return shrink_files(paths, progress=progress, blocks=blocks), paths
        # No lock file: no compactor has run yet.  Should a first pass start now, it may
        # delete a file under us: then read again, under its lock; the messages of this
        # attempt are shown only if it stands.
        real, sys.stderr = sys.stderr, io.StringIO()
        refused = set(errors.REFUSALS)
        try:
            paths = files.find_traces(directory, only=tid).get(tid, [])
            sh = shrink_files(paths, progress=progress, blocks=blocks)
        finally:
            said, sys.stderr = sys.stderr.getvalue(), real
    if not (sh.problems.fatal or any(k == "duplicate" for _, k in sh.problems.counts)):
        sys.stderr.write(said)
        return sh, paths
    errors.REFUSALS.intersection_update(refused)   # not said: said again by the next attempt
    with TraceLock(directory, tid, shared=True, limit=limit):
        paths = files.find_traces(directory, only=tid).get(tid, [])
        return shrink_files(paths, progress=progress, blocks=blocks), paths


def run_traces(directory, before, traces=None):
    """(the traces a run may have written: those in DIRECTORY not in BEFORE; the others'
    among them).  In a directory anybody can write (/tmp), a new trace of another user's is
    not the run's: anybody could have made one there meanwhile, to fail the run's check or
    load its compactor; the run's programs (LD_PRELOAD does not survive a setuid exec) write
    as the run's user, unless one of root's switches users (its trace then left out too)."""
    traces = files.find_traces(directory) if traces is None else traces
    new = set(traces) - set(before)
    try:
        shared = os.stat(directory).st_mode & stat.S_IWOTH
    except OSError:
        shared = 0
    if not shared:
        return new, []
    others = [t for t in new if (files.trace_owner(directory, t) or (os.geteuid(),))[0]
              != os.geteuid()]
    return new - set(others), sorted(others)


class BackgroundCompactor:
    """`run`'s compaction thread: a pass every second (from the start of one to the start of
    the next) over the traces that were not in the directory before the run, and a last one
    when the program has ended.  VIEWS: keep what the last pass read of each trace over
    (views), for `run --check`'s verdict, and make no point of the series but each trace's
    last (its verdict does not use the series; a point reads the whole live set, and the
    program and its scan at exit wait for the core it takes)."""

    def __init__(self, directory, before, interval=1.0, views=False):
        import threading
        self.directory, self.before, self.interval = directory, set(before), interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.error = None
        self.last = self.crash = None
        self.folds_done = threading.Event()     # the last pass has folded every trace
        # {trace: (Shrinker, blocks.Live)}: the whole trace as the last pass read it, when it
        # has it (_result_view), for `run --check`'s verdict (report.build_report NOW)
        self.views = {}
        self.keep_views = views
        self.deferred = {}                      # {trace: when its due point was first put off}
        self.defer_max = 6 * series_mod.SERIES_INTERVAL

    def start(self):
        self.thread.start()

    def _pass(self, folded=None, view=False, abandon=None):
        # a trace over keeps its levels (LEVELS): merging them all would rewrite the whole
        # live set after the program ended; `compact DIR` merges them
        for tid in sorted(run_traces(self.directory, self.before)[0]):
            compact_dir(self.directory, tid, verbose=False,
                        stopping=(lambda: True) if self.keep_views else self.stop.is_set,
                        folded=folded, view=view, abandon=abandon, levels=True,
                        base=not self.keep_views, defer=self._defer)

    def _defer(self, tid, behind):
        """Put off the point due of trace TID while the compactor is BEHIND the program
        (compact_trace's DEFER): the files waiting come first, and the point, made once a
        pass is not behind, then reads a trace folded.  Never for longer than DEFER_MAX
        seconds in a row: a program that always outruns the compactor still gets points."""
        if not behind:
            self.deferred.pop(tid, None)
            return False
        first = self.deferred.setdefault(tid, time.monotonic())
        return time.monotonic() - first < self.defer_max

    def _loop(self):
        try:
            began = time.monotonic()
            # a pass every INTERVAL from the start of the last: after a long one (a big
            # backlog, a point of the series) the next starts at once
            while not self.stop.wait(max(began + self.interval - time.monotonic(), 0)):
                began = time.monotonic()
                # once the program has ended, a fold, a merge of levels or a point under
                # way is given up: the last pass reads all of it anyway, and would wait
                self._pass(abandon=self.stop.is_set)
        except (Fail, OSError) as e:
            self.error = e

    def _last_pass(self):
        """The last pass; folds_done is set once its last trace is folded (its last point
        may still be under way) or when it stops."""
        tids = sorted(run_traces(self.directory, self.before)[0])

        def folded(tid, view):
            if view is not None and self.keep_views:
                self.views[tid] = view
            if tid == tids[-1]:
                self.folds_done.set()
        try:
            self._pass(folded=folded, view=self.keep_views)
        except (Fail, OSError) as e:
            self.error = self.error or e
        except BaseException as e:      # (out of memory...): raised again by join()
            self.crash = e
        finally:
            self.folds_done.set()

    def finish(self, overlap=False):
        """Stop the passes and make the last one.  OVERLAP: return once it has folded every
        trace, its last points still under way (`run --check` reads the trace meanwhile:
        the point holds the trace's lock shared, as a reader does); join() waits for it."""
        self.stop.set()
        self.thread.join()
        if overlap:
            import threading
            self.last = threading.Thread(target=self._last_pass, daemon=True)
            self.last.start()
            self.folds_done.wait()
        else:
            self._last_pass()
            self.join()

    def join(self):
        if self.last is not None:
            self.last.join()
            self.last = None
        if self.crash is not None:
            crash, self.crash = self.crash, None
            raise crash
        if self.error:
            warn("background compaction stopped: %s (the files left are complete; run "
                 "`mmleak.py compact %s`)" % (self.error, self.directory))
            self.error = None


def _recover_one(p, tail):
    """Append to the dump file P the complete lines its staging file TAIL has not flushed,
    and delete TAIL: the bytes appended.  Bounded memory; Refused, OSError pass."""
    with files.open_trace_file(tail) as t:
        have, ended = files._out_end(p)
        segments = [] if ended else files._tail_segments(t.fileno(), have)
        keep = size = 0                 # complete lines only: up to the last newline
        for chunk in files._segment_chunks(t.fileno(), segments):
            i = chunk.rfind(b"\n")
            keep = size + i + 1 if i >= 0 else keep
            size += len(chunk)
        if keep < size:
            torn, at = b"", 0
            for chunk in files._segment_chunks(t.fileno(), segments):
                torn += chunk[max(keep - at, 0):][:60 - len(torn)] if at + len(chunk) > keep \
                    else b""
                at += len(chunk)
            warn("%s: torn last line dropped: %r" % (tail, torn[:60]))
        fd = files._open_checked(p, os.O_WRONLY | os.O_APPEND, files.uids_for(p))
        with os.fdopen(fd, "wb") as f:
            # a second name (a hard link planted at P) may be another file of the owner's:
            # never appended to
            nlink = os.fstat(fd).st_nlink
            if nlink != 1:
                raise OSError(0, "it has %d names (hard links): left alone" % nlink)
            left = keep
            for chunk in files._segment_chunks(t.fileno(), segments):
                f.write(chunk[:left])
                left -= min(left, len(chunk))
    files.remove_trace_file(tail)
    return keep


def _as_user(uid, gid, func, who, usable=None, fallback=None):
    """FUNC() run, by root, as user UID, in a forked child that takes that user's uid, gid and
    groups (GID, the file's group, where the uid has no name: a container's): what it writes
    and deletes is done under that user's permissions, disk quota and reserved-block limits,
    not root's.  FUNC's result (JSON: a dict, an int, None) comes back; Fail, Refused and
    OSError come back as the parent's, said as done by WHO; the lines the child refused count
    as the parent's (exit status 2).  USABLE(), checked as that user first: if false,
    FALLBACK() runs here instead (as root)."""
    import json
    import pwd
    try:
        pw = pwd.getpwuid(uid)
        gid, groups = pw.pw_gid, os.getgrouplist(pw.pw_name, pw.pw_gid)
    except KeyError:
        groups = [gid]
    before = set(errors.REFUSALS)
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                        # the child: never returns
        out = {"kind": "bug", "text": "the child process died"}
        try:
            os.close(r)
            os.setgroups(groups)
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if usable is not None and not usable():
                out = {"kind": "root"}
            else:
                out = {"kind": "ok", "res": func()}
        except Fail as e:
            out = {"kind": "refused" if isinstance(e, Refused) else "fail", "text": str(e)}
        except OSError as e:
            out = {"kind": "os", "errno": e.errno or 0, "text": e.strerror or str(e),
                   "file": e.filename if isinstance(e.filename, str) else None}
        except BaseException as e:      # a bug: said, as the parent would
            out = {"kind": "bug", "text": "%s: %s" % (type(e).__name__, e)}
        finally:
            try:
                out["refusals"] = sorted(errors.REFUSALS - before)
                sys.stdout.flush()
                sys.stderr.flush()
                data = json.dumps(out).encode("ascii")
                while data:
                    data = data[os.write(w, data):]
            finally:
                os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    try:
        out = json.loads(said.decode("ascii"))
    except ValueError:
        out = {"kind": "bug", "text": "the child process died"}
    errors.REFUSALS.update(out.get("refusals", ()))
    done_as = " (done as %s, uid %d)" % (who, uid)
    if out["kind"] == "ok":
        return out["res"]
    if out["kind"] == "root":
        return fallback()
    if out["kind"] == "refused":
        raise Refused(out["text"] + done_as)
    if out["kind"] == "os":
        raise OSError(out["errno"], out["text"] + done_as, out["file"])
    raise Fail(out["text"] + done_as)


def _as_owner_of(path, func, *args):
    """FUNC(*ARGS) run as the owner of PATH when root runs it for another user's file
    (_as_user): what it appends and deletes is done under the owner's permissions, disk
    quota and reserved-block limits, not root's (a trace of theirs may be as big as they
    like)."""
    st = os.lstat(path)
    if os.geteuid() != 0 or st.st_uid == 0:
        return func(*args)
    try:
        return _as_user(st.st_uid, st.st_gid, lambda: func(*args), "the file's owner")
    except OSError as e:                # said against PATH by the caller
        raise OSError(e.errno, e.strerror) from None


def recover(paths, force=False):
    """`recover`: fold the staging files of dead processes back into their dump files
    (PATHS: dump directories and dump files).  Returns the exit status."""
    outs = []
    status = EXIT_OK
    for a in paths:
        if os.path.isdir(a):
            for found in files.find_traces(a, said=True).values():
                outs.extend(found)
        elif os.path.exists(a):
            outs.append(a)
        else:
            warn("%s: No such file or directory" % a)
            status = EXIT_INPUT
    done = 0
    for p in outs:
        tail = tail_of(p)
        if not tail or not os.path.lexists(tail):
            continue
        pid = files.dump_pid(p)
        if pid and not force:
            pstart, ticks = _trace_birth([p])[1], _process_start_ticks(pid)
            try:
                if pstart is not None and ticks is not None and ticks != pstart:
                    raise ProcessLookupError    # another process has the pid (round 6: it
                                                # kept the trace unrecovered while it lived)
                os.kill(pid, 0)
                warn("%s: process %d is still running: left alone (--force to fold anyway)"
                     % (p, pid))
                continue
            except (ProcessLookupError, OverflowError):
                pass                    # not running (OverflowError: no pid can be that big)
            except PermissionError:
                warn("%s: process %d exists (not ours): left alone" % (p, pid))
                continue
            if _staging_mapped([tail]):
                warn("%s: its staging file is mapped by a running process (in another pid "
                     "namespace?): left alone (--force to fold anyway)" % p)
                continue
        try:
            # absolute: the owner may not search the directory we run in
            keep = _as_owner_of(p, _recover_one, os.path.abspath(p), os.path.abspath(tail))
        except Refused as e:
            refuse(str(e))
            continue
        except OSError as e:
            warn("%s: cannot recover: %s" % (p, errors.os_error_text(e)))
            status = EXIT_INPUT
            continue
        done += 1
        sys.stdout.write("%s: %d bytes recovered from %s\n" % (p, keep, os.path.basename(tail)))
    if not done:
        sys.stdout.write("nothing to recover\n")
    return status
