"""Files: the names of a trace's files (TraceFiles), finding them, opening the files of a dump
directory safely, the lines a thread has not flushed yet, and writing every output.

A dump directory may be one others can write (/tmp, a service user's): mmleak-format(5)
(docs/format.rst), "Where the files go" and "Whose files are read".  Every file at one of
mmleak's names is opened through open_trace_file (or open_checked): never through a symbolic
link, never blocking on a FIFO, nothing but a regular file, and only one of the trace's owner
or of root.  A file
that fails is refused (or, found in a listing, ignored): one line, exit status 2.  Every
file the tools write goes through new_output."""
import collections
import contextlib
import errno
import os
import re
import stat
import sys
import tempfile

from . import layout
from .dumpformat import _CHUNK, dump_lines, header_int, read_head, staged_at
from .errors import EXIT_INPUT, Fail, Refused, refuse
from .facts import LIBNAME

# ---------------------------------------------------------------------------------------
# Names: mmleak.ID.N.out (and its staging file mmleak.ID.N.tail), mmleak.ID.maps,
# mmleak.ID.loads, mmleak.ID.compact, mmleak.ID.series (and .series.live), mmleak.ID.lock
# ---------------------------------------------------------------------------------------

ID = r"(\d+(?:-\d+)?)"
DUMP_RE = re.compile(r"^mmleak\.%s\.(\d+)\.out$" % ID)
MAPS_RE = re.compile(r"^mmleak\.%s\.maps$" % ID)
COMPACT_RE = re.compile(r"^mmleak\.%s\.compact$" % ID)
RUN_RE = re.compile(r"^mmleak\.%s\.compact\.(\d{1,9})$" % ID)   # a newer run (compact.py)
TRACE_FILE_RE = re.compile(r"^mmleak\.%s\." % ID)       # any file of trace ID


class TraceFiles:
    """The names of the files of trace TID in DIRECTORY."""

    def __init__(self, directory, tid):
        self.directory, self.tid = directory, tid

    def name(self, suffix):
        return os.path.join(self.directory, "mmleak.%s.%s" % (self.tid, suffix))

    def out(self, n):
        return self.name("%d.out" % n)

    maps = property(lambda self: self.name("maps"))
    loads = property(lambda self: self.name("loads"))
    compact = property(lambda self: self.name("compact"))

    def run(self, n):
        """The compacted run number N (mmleak.ID.compact.N: newer than .compact)."""
        return self.name("compact.%d" % n)
    series = property(lambda self: self.name("series"))
    live = property(lambda self: self.name("series.live"))
    lock = property(lambda self: self.name("lock"))
    html = property(lambda self: self.name("html"))

    @classmethod
    def of(cls, path):
        """The TraceFiles of the trace the file PATH belongs to, or None (another name)."""
        d, n = os.path.split(path)
        m = TRACE_FILE_RE.match(n)
        return cls(d or ".", m.group(1)) if m else None


def tail_of(path):
    """The staging file of the dump file PATH (mmleak.ID.N.tail for mmleak.ID.N.out), or
    None for another name."""
    return path[:-len(".out")] + ".tail" if path.endswith(".out") else None


def loads_of(maps_path):
    """The mmleak.ID.loads beside a mmleak.ID.maps, or None."""
    return maps_path[:-len(".maps")] + ".loads" if maps_path.endswith(".maps") else None


def temp_of(path):
    """The temporary name a file of a dump directory is written under (see replace)."""
    return path + ".tmp"


def dump_pid(path):
    """The pid in the name of a dump file (mmleak.PID[-K].N.out), or None."""
    m = DUMP_RE.match(os.path.basename(path))
    return int(m.group(1).split("-")[0]) if m else None


def find_library(explicit=None, name=LIBNAME):
    """Return the absolute path of mmleak.so (or NAME: another library beside it), or None.

    Search order (layout.library_candidates): EXPLICIT, $MMLEAK_LIB's directory, next to the
    mmleaklib package (a source tree), the installed library directory (make install, the
    Debian package), then /usr/local/lib/mmleak and /usr/lib/mmleak.
    """
    for c in layout.library_candidates(name, explicit, LIBNAME):
        if c and os.path.isfile(c):
            return os.path.realpath(c)
    return None


# ---------------------------------------------------------------------------------------
# Reading the files of a dump directory
# ---------------------------------------------------------------------------------------

def trace_owner(directory, tid):
    """(uid, gid) of trace TID's owner: the owner of its mmleak.TID.maps (made first, by the
    traced process: a daemon that switches users hands it over with its other files), or
    None when it has none that is a regular file."""
    try:
        st = os.lstat(TraceFiles(directory, tid).maps)
    except OSError:
        return None
    return (st.st_uid, st.st_gid) if stat.S_ISREG(st.st_mode) else None


def trusted_uids(directory, tid):
    """(uids whose files of trace TID are read, how to name them in a message): the trace's
    owner and root; with no maps file, root and the user running this (a file of anybody
    else could be anything, planted at a name a trace will use)."""
    owner = trace_owner(directory, tid)
    if owner is not None:
        return frozenset((owner[0], 0)), "not by the trace's owner (uid %d) or root" % owner[0]
    me = os.geteuid()
    return frozenset((0, me)), ("not by root or uid %d (the trace has no maps file to name "
                                "its owner)" % me)


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def file_problem(path, st, verb="refused", uids=None):
    """Why the file PATH (its stat ST) is not one of a trace's files, as a message ending
    with VERB; None if it is.  UIDS: None, or (uids, their description) of trusted_uids."""
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        return "%s: %s, not a regular file: %s" % (path, kind, verb)
    if uids is not None and st.st_uid not in uids[0]:
        return "%s: owned by uid %d, %s: %s" % (path, st.st_uid, uids[1], verb)
    return None


def uids_for(path):
    """trusted_uids of the trace a file named mmleak.ID.* belongs to (None for another
    name: a file the user named, anywhere)."""
    t = TraceFiles.of(path)
    return trusted_uids(t.directory, t.tid) if t else None


def _open_checked(path, flags, uids):
    """A descriptor of PATH, one of a trace's files (UIDS: its trusted_uids), opened with
    FLAGS, O_NOFOLLOW and O_NONBLOCK after lstat said it is a regular file of the trace's
    (so that nothing else is even opened: a device, a FIFO), and fstat that it still is the
    same.  Raises Refused, or OSError (missing, unreadable)."""
    st = os.lstat(path)
    why = file_problem(path, st, "refused", uids)
    if why:
        raise Refused(why)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:      # replaced by a symbolic link meanwhile
            raise Refused("%s: a symbolic link, not a regular file: refused" % path)
        raise
    try:
        st2 = os.fstat(fd)
        why = file_problem(path, st2, "refused", uids)
        if why is None and (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            why = "%s: replaced while it was opened: refused" % path
    except OSError:
        os.close(fd)
        raise
    if why:
        os.close(fd)
        raise Refused(why)
    return fd


def open_trace_file(path):
    """PATH opened to be read (binary).  A file named mmleak.ID.* must be a regular file of
    trace ID's owner or root (_open_checked: Refused otherwise); any other name (a file the
    user named) is opened as it is.  OSError passes."""
    uids = uids_for(path)
    if uids is None:
        return open(path, "rb")
    return os.fdopen(_open_checked(path, os.O_RDONLY, uids), "rb")


def remove_trace_file(path, uids=None):
    """Delete PATH if it is a regular file of the trace's owner or root (UIDS, default: of
    the trace its name says); anything else there is left alone.  True if deleted."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if file_problem(path, st, "", uids if uids is not None else uids_for(path)):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _remove_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read_lines(path, text=False):
    """The lines of the trace file PATH (open_trace_file, dump_lines), decoded if TEXT."""
    with open_trace_file(path) as f:
        for line in dump_lines(f):
            yield line.decode("utf-8", "replace") if text else line


def dir_error(directory, e=None):
    """The message of a dump DIRECTORY that cannot be listed (E: the OSError; None: it is not
    a directory): what a first command with a mistyped path meets, so it says what to give."""
    if e is None or e.errno in (errno.ENOENT, errno.ENOTDIR):
        what = "not a directory" if os.path.lexists(directory) else "no such directory"
        return "%s: %s (the dump directory: `run -d DIR`, MMLEAK_DIR)" % (directory, what)
    return "cannot list %s: %s" % (directory, e.strerror)


class Traces(dict):
    """find_traces's map; .ignored: trace id -> the line said (or to say) about its files
    left out."""
    ignored = {}


def say_ignored(traces, tid):
    """Say the line about trace TID's files that find_traces(said=False) left out."""
    why = getattr(traces, "ignored", {}).get(tid)
    if why:
        refuse(why)


def find_traces(directory, only=None, said=None, folded=True):
    """Map trace id ("PID" or "PID-K") -> sorted list of its dump files in DIRECTORY (its
    compacted result mmleak.ID.compact first, if any); ONLY: of that trace alone.  A file
    at one of those names that is not a regular file of the trace's owner or root is left
    out: anybody may have put it there (see open_trace_file).  It is said (one line per
    trace, once; exit status 2) when SAID (default: with ONLY), else kept in .ignored for
    say_ignored: a command about some traces of a shared directory says only theirs (files
    planted at the names of others made root's report of its own trace in /tmp exit 2,
    with a line for each of them).  FOLDED: leave out the files a result names in its
    "#folded" lines (read from it here); False: a listing to choose a trace by, whose
    files are listed again, by their reader, under the trace's lock (compact.read_trace)."""
    said = only is not None if said is None else said
    traces = collections.defaultdict(list)
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise Fail(dir_error(directory, e))
    uids, ignored = {}, collections.defaultdict(list)
    for n in names:
        m = DUMP_RE.match(n) or COMPACT_RE.match(n) or RUN_RE.match(n)
        if m and only is not None and m.group(1) != only:
            continue
        if m:
            tid, p = m.group(1), os.path.join(directory, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue                # gone meanwhile (a compactor folded it)
            if tid not in uids:
                uids[tid] = trusted_uids(directory, tid)
            why = file_problem(p, st, "ignored", uids[tid])
            if why:
                ignored[tid].append(why)
            elif n.endswith(".out"):
                traces[tid].append(((2, int(m.group(2))), p))
            elif m.re is RUN_RE:        # a newer run of the result: after it
                traces[tid].append(((1, int(m.group(2))), p))
            else:                       # a compacted trace's running result: read it first
                traces[tid].append(((0, 0), p))
        elif MAPS_RE.match(n) and (only is None or MAPS_RE.match(n).group(1) == only):
            traces.setdefault(MAPS_RE.match(n).group(1), [])
    out = Traces()
    out.ignored = {}
    for tid, whys in sorted(ignored.items()):
        whys.sort()
        out.ignored[tid] = whys[0] if len(whys) == 1 else "%s (and %d more files of trace " \
            "%s: ignored likewise)" % (whys[0], len(whys) - 1, tid)
        if said:
            refuse(out.ignored[tid])
    for k, v in traces.items():
        files = [p for _, p in sorted(v)]
        names = set()
        for r in [p for p, (key, _) in zip(files, sorted(v)) if key[0] < 2 and folded]:
            # a compaction pass stopped after writing a result (or run), before deleting
            # its inputs: they are in it already (the next pass deletes them)
            try:
                names.update(_previously_folded(r, k))
            except Refused as e:        # replaced since the listing
                refuse(str(e))
                names.add(os.path.basename(r))
        if names:
            files = [p for p in files if os.path.basename(p) not in names]
        out[k] = files
    return out


def _first_header(path):
    """The header of the dump file PATH, or None (a file that cannot be read: its reader
    says why)."""
    try:
        with open_trace_file(path) as f:
            return read_head(f, path)["header"]
    except (OSError, Refused, Fail):
        return None


def trace_start_for_maps(maps_path):
    """The start time (Unix seconds) in the header of a dump file beside MAPS_PATH, or None."""
    d, n = os.path.split(os.path.abspath(maps_path))
    m = MAPS_RE.match(n)
    if not m:
        return None
    for p in find_traces(d, only=m.group(1)).get(m.group(1), []):
        h = _first_header(p)
        if h and header_int(h, "start", None) is not None:
            return header_int(h, "start")
    return None


def _out_end(path):
    """(size, whether it ends with "#end") of a dump file, from one open; OSError and Refused
    pass."""
    with open_trace_file(path) as f:
        n = f.seek(0, os.SEEK_END)
        if n < 5:
            return n, False
        f.seek(n - 5)
        return n, f.read(5) == b"#end\n"


def _ends_with_end(path):
    try:
        return _out_end(path)[1]
    except (OSError, Refused):
        return False


def _own_file(path):
    """Is PATH, a file mmleak.py writes (a trace's result, series, .live), there and a
    regular file of the trace's owner or root?  One that is not is said (once) and is never
    read, nor trusted to delete anything (a result's "#folded" lines): the next pass
    replaces it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    why = file_problem(path, st, "ignored", uids_for(path))
    if why:
        refuse(why)
        return False
    return True


def _previously_folded(path, tid):
    """The inputs the result PATH of trace TID names (its pass may have stopped before
    deleting them): dump files of that trace only, whatever else it says.  They are among
    its first lines, before the stacks.  Refused passes (a result that is not the trace's
    own; see _trusted_result).  The runs it merged (mmleak.ID.compact.N) are among them."""
    names = []
    try:
        with open_trace_file(path) as f:
            folded = read_head(f, path)["folded"]
    except Refused:
        raise
    except (OSError, Fail):             # (the trace's reader says why)
        return names
    for name in folded:
        m = DUMP_RE.match(name) or RUN_RE.match(name)
        if m and m.group(1) == tid:
            names.append(name)
    return names


def _size(path):
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _tail_segments(fd, have):
    """Where the lines of a staging file (descriptor FD) that its .out lacks are, HAVE being
    the size of the .out: [(position in the staging file, length)], in the .out's order.

    mmleak.so stages events in mmleak.ID.N.tail (a shared mapping: two halves, each starting
    with "#at OFFSET", the place in .out its lines belong, its lines ending at the first
    NUL) and appends a half to .out when it is full.  Read in bounded chunks."""
    size = os.fstat(fd).st_size
    half = size // 2
    halves = []
    for start, end in ((0, half), (half, size)):
        at = staged_at(os.pread(fd, min(end - start, 4096), start))
        if not at:
            continue
        pos = body = start + at[1]
        n = end - body                  # the lines end at the first NUL
        while pos < end:
            chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
            if not chunk:
                n = pos - body
                break
            nul = chunk.find(b"\0")
            if nul >= 0:
                n = pos + nul - body
                break
            pos += len(chunk)
        halves.append((at[0], body, n))
    out = []
    for off, body, n in sorted(halves):
        if off + n <= have:
            continue                      # already in .out
        skip = max(have - off, 0)
        out.append((body + skip, n - skip))
        have = off + n
    return out


def _segment_chunks(fd, segments):
    for pos, n in segments:
        while n > 0:
            chunk = os.pread(fd, min(_CHUNK, n), pos)
            if not chunk:
                break
            yield chunk
            pos += len(chunk)
            n -= len(chunk)


def _copy_sparse(src_fd, dst, size):
    """Bytes 0..SIZE of the regular file SRC_FD into the new binary file DST, in bounded
    memory, its holes left holes (a sparse file stays small).  The bytes copied."""
    pos = done = 0
    while pos < size:
        try:
            data = os.lseek(src_fd, pos, os.SEEK_DATA)
            hole = os.lseek(src_fd, data, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break                   # a hole to the end
            data, hole = pos, size
        pos, end = data, min(hole, size)
        if pos >= size:
            break
        dst.seek(pos)
        while pos < end:
            chunk = os.pread(src_fd, min(_CHUNK, end - pos), pos)
            if not chunk:               # shorter than SIZE: no more
                dst.truncate(pos)
                return pos
            dst.write(chunk)
            pos += len(chunk)
            done = pos
    dst.truncate(size)
    dst.seek(size)
    return max(done, size)


def unflushed_tail(out_path, with_size=False):
    """The lines of OUT_PATH's thread that are still only in its staging file (see
    _tail_segments), as bytes.  A clean close flushes it and deletes the .tail; after a
    crash, or while the process runs, the .tail holds the newest lines.  The .tail is read
    before the size of .out is taken, so a flush in between never yields a line twice.
    WITH_SIZE: returns (lines, size of .out they follow): a reader of a file still being
    written must read that much of .out, not more (a later flush appends lines it has from
    the .tail).  For small files (tests, recover); readers stream (with_unflushed_tails)."""
    tail = tail_of(out_path)
    if not tail:
        return (b"", None) if with_size else b""
    try:
        with open_trace_file(tail) as f:
            with tempfile.TemporaryFile(prefix="mmleak-tail.") as copy:
                _copy_sparse(f.fileno(), copy, os.fstat(f.fileno()).st_size)
                copy.flush()
                have, ended = _out_end(out_path)
                data = b"" if ended else b"".join(_segment_chunks(
                    copy.fileno(), _tail_segments(copy.fileno(), have)))
    except (OSError, Refused):
        return (b"", None) if with_size else b""
    # An ended .out needs no staging lines: every line was flushed before its "#end".  And a
    # rotating thread renames its staging file to the next file's name, so a name (or a hard
    # link) taken before may now hold the next file's lines.
    return (data, have) if with_size else data


def _with_tail(p, q):
    """Write to Q (a new file) what the dump file P holds now followed by the lines its
    staging file has not flushed yet: whether it added any; None (Q not made) when P ends
    with "#end".  Bounded memory and, for sparse files, disk.  Raises Refused, OSError."""
    have, ended = _out_end(p)
    if ended:                           # "#end": nothing is appended any more, the .tail is
        return None                     # not read (it may hold the next file's lines)
    with open_trace_file(tail_of(p)) as t, open(q + ".tail", "w+b") as copy:
        _copy_sparse(t.fileno(), copy, os.fstat(t.fileno()).st_size)
        copy.flush()
        have, ended = _out_end(p)       # after the .tail was read (see unflushed_tail)
        segments = [] if ended else _tail_segments(copy.fileno(), have)
        with open_trace_file(p) as src, open(q, "wb") as dst:
            if _copy_sparse(src.fileno(), dst, have) < have:
                raise OSError(errno.EIO, "%s: shorter than it was" % p)
            for chunk in _segment_chunks(copy.fileno(), segments):
                dst.write(chunk)
    os.unlink(q + ".tail")
    return bool(segments)


def with_unflushed_tails(paths):
    """PATHS, where every dump file with a staging file is replaced by a temporary copy of
    what it holds now followed by the lines not yet flushed (unflushed_tail): the file may
    grow while it is read, by lines the copy already has.  Returns (paths, names for
    messages, tmpdir or None, the messages about staging files refused: their .out is read
    as it is)."""
    out, shown, tmpdir, refused = [], [], None, []
    for p in paths:
        shown.append("<stdin>" if p == "-" else p)
        out.append(p)
        if p == "-" or not tail_of(p) or not os.path.lexists(tail_of(p)):
            continue
        tmpdir = tmpdir or tempfile.mkdtemp(prefix="mmleak-tail.")
        q = os.path.join(tmpdir, os.path.basename(p))
        try:
            added = _with_tail(p, q)
        except Refused as e:
            refused.append(str(e))
            continue
        except FileNotFoundError:
            continue                    # folded meanwhile (read_trace reads again)
        except OSError as e:
            raise Fail("cannot read %s with the lines of its .tail: %s%s" % (
                p, (e.filename + ": ") if e.filename else "", e.strerror or e))
        if added is not None:
            out[-1] = q
            shown[-1] = "%s (with the lines of its .tail)" % p if added else p
    return out, shown, tmpdir, refused



# ---------------------------------------------------------------------------------------
# The objects a maps file names: whoever wrote the trace chose those paths
# ---------------------------------------------------------------------------------------

def open_regular(path):
    """A read-only descriptor of PATH if it is a regular file (its links followed), else
    OSError: nothing else is ever opened, not even for a moment (a FIFO would block, opening
    a device can act: /dev/watchdog starts its timer), whatever replaces PATH meanwhile.  It
    is looked up with O_PATH (which opens nothing), checked, then opened through that."""
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(fd)


def safe_directory(path):
    """Can no one but root and this user put or swap a file in the directory PATH names?
    Every directory on its real path must be root's or ours, not writable by others (one
    that is sticky may be, above the last: others cannot rename our directory out of /tmp),
    and every symbolic link on the way to it root's or ours."""
    trusted = (0, os.geteuid())
    d = os.path.abspath(path)
    while d != "/":
        try:
            st = os.lstat(d)
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in trusted:
            return False
        d = os.path.dirname(d)
    d, last = os.path.realpath(path), True
    while True:
        try:
            st = os.stat(d)
        except OSError:
            return False
        if st.st_uid not in trusted or (st.st_mode & 0o022 and
                                        (last or not st.st_mode & stat.S_ISVTX)):
            return False
        if d == "/":
            return True
        d, last = os.path.dirname(d), False


# ---------------------------------------------------------------------------------------
# Writing: every output, and every file of a dump directory
# ---------------------------------------------------------------------------------------
#
# An output may be in a directory others can write (a dump directory in /tmp, a service
# user's own): a name there may be a symbolic link, a hard link, a FIFO or a file planted by
# someone else.  So an output is never opened by its name: its content goes to a new file
# beside it, made with O_CREAT|O_EXCL|O_NOFOLLOW under a name nobody can guess, and that file
# is renamed over the name (replacing whatever was there, a link included, never writing
# through it).  The one exception is a FIFO, a character device or one of our descriptors,
# reached through no link but ours or root's (such as -o /dev/null or /dev/stdout): there is
# no file to replace there, it is written as it is.

TEMP_SUFFIX = ".tmp"
FD_LINK_RE = re.compile(r"^/(?:proc/(?:self|thread-self|%d)/fd|dev/fd)/(\d+)$" % os.getpid())


def _temp_name(path):
    """A name beside PATH for its next content: .NAME.RANDOM.tmp (hidden; systemd reads no
    unit or drop-in of that name; no reader of a dump directory takes it for a dump)."""
    d, base = os.path.split(path)
    return os.path.join(d, ".%s.%s%s" % (base, os.urandom(6).hex(), TEMP_SUFFIX))


def _output_target(path):
    """Where new_output writes PATH: ("fd", N) for our own descriptor N (/dev/stdout,
    /dev/fd/N); ("direct", NAME) for an existing FIFO or character device root or we own
    (/dev/null); else ("replace", PATH), the name whose content is replaced.  Only our and
    root's symbolic links are followed, and only to those: a link to anything else (a
    regular file, nothing), and any link of anyone else's, is the name replaced."""
    trusted = (0, os.geteuid())
    p = path
    for _ in range(40):
        m = FD_LINK_RE.match(os.path.normpath(os.path.abspath(p)))
        if m:
            return "fd", int(m.group(1))
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return "replace", path
        except OSError as e:
            raise Fail("cannot write %s: %s" % (path, e.strerror))
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted:
                return "replace", path
            p = os.path.join(os.path.dirname(p), os.readlink(p))
            continue
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
            return ("direct", p) if st.st_uid in trusted else ("replace", path)
        if stat.S_ISREG(st.st_mode):
            return "replace", path
        raise Fail("cannot write %s: %s" % (path, "a directory" if stat.S_ISDIR(st.st_mode)
                                            else "not a regular file"))
    raise Fail("cannot write %s: too many levels of symbolic links" % path)


def _new_file(target, temp, perm):
    """(descriptor, name) of a new file for TARGET's next content: at TEMP (whatever is
    there is removed first), or at a name nobody can guess."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if temp is not None:
        _remove_quietly(temp)
        return os.open(temp, flags, perm), temp
    for _ in range(100):
        tmp = _temp_name(target)
        try:
            return os.open(tmp, flags, perm), tmp
        except FileExistsError:
            continue
    raise Fail("cannot write %s: no free temporary name beside it" % target)


@contextlib.contextmanager
def new_output(path, text=False, perm=None, owner=None, sync=False, temp=None, guard=None):
    """Write the file PATH: yields a file object (binary, or TEXT: UTF-8, newlines as
    written); on success its content replaces PATH's at once (rename), on an exception PATH
    is left as it was.  PERM: the new file's mode exactly (default 0666 less the umask, as
    open() makes it; 0600 at one of a trace's names, mmleak.ID.*, as mmleak.so makes the
    dump files); OWNER (uid, gid): its owner; SYNC: on disk (file and directory) before
    this returns; TEMP: the temporary name (a file of a dump directory, whose leftover the
    next writer removes), else one nobody can guess; GUARD (with TEMP): a context manager's
    factory entered around the rename.  See the top of this section."""
    kind, target = ("replace", path) if temp is not None else _output_target(path)
    if perm is None and kind == "replace" and TraceFiles.of(target):
        # a trace's name (the page report writes beside the dump files, mmleak.ID.html):
        # what it shows (the command line, the stacks) is as private as the dump files,
        # mode 0600 whatever the umask (a root trace's page in /tmp was world-readable)
        perm = 0o600

    def wrap(fd):
        return os.fdopen(fd, "w", encoding="utf-8", newline="") if text else \
            os.fdopen(fd, "wb")
    if kind != "replace":
        if kind == "fd":
            for std in (sys.stdout, sys.stderr):
                if std is not None and std.fileno() == target:
                    std.flush()         # what was written there before comes first
            fd = os.dup(target)
        else:
            fd = os.open(target, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK)
            os.set_blocking(fd, True)       # (opened without waiting for a FIFO's reader)
        with wrap(fd) as f:
            yield f
        return
    fd, tmp = _new_file(target, temp, 0o666 if perm is None else perm)
    f = None
    try:
        os.set_blocking(fd, True)
        if perm is not None:
            os.fchmod(fd, perm)
        if owner is not None and owner != (os.geteuid(), os.getegid()):
            os.fchown(fd, owner[0], owner[1])
        f = wrap(fd)
        yield f
        f.flush()
        if sync:
            os.fsync(f.fileno())
        f.close()
        if guard is None:
            os.rename(tmp, target)
        else:
            with guard():
                os.rename(tmp, target)
    except BaseException:
        try:
            if f is not None:
                f.close()
            else:
                os.close(fd)
        except OSError:
            pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        fsync_dir(os.path.dirname(target) or ".")


def fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace(path, fill, sync=False, guard=None):
    """Write PATH, a file of mmleak.py's in a dump directory (a trace's result, series,
    .live), whole: by its temporary name PATH.tmp (temp_of), mode 0600 (only its owner reads
    it, as mmleak.so makes its files), filled by FILL(file) and renamed over PATH; made by
    root, it is given to the trace's owner (a file of root's at a name of another user's
    trace would be trusted by the next trace of that name).  SYNC: flushed to disk first,
    and the directory after.  GUARD: a context manager's factory, entered around the rename
    (a compaction pass's directory lock, TraceLock.changing).  A failure (a full disk)
    removes the temporary file and is one line naming it (Fail)."""
    t = TraceFiles.of(path)
    owner = t and trace_owner(t.directory, t.tid)
    owner = owner if os.geteuid() == 0 and owner and owner[0] != 0 else None
    tmp = temp_of(path)
    try:
        with new_output(path, perm=0o600, owner=owner, sync=sync, temp=tmp,
                        guard=guard) as f:
            fill(f)
    except OSError as e:
        raise Fail("%scannot write %s: %s" % ("trace %s: " % t.tid if t else "", tmp,
                                               e.strerror or e))


def make_dump_dir(d, owner=None):
    """The dump directory D of `run` and `attach`: an existing directory is used as it is;
    a missing one is made, with its missing parents, by mkdir (which never follows a symbolic
    link at the name it makes).  OWNER (uid, gid): give the directory this call made, and
    only that one, to the traced process's user, through a descriptor opened without
    following a symbolic link and checked to be our new, empty directory.  True if made."""
    try:
        if not stat.S_ISDIR(os.stat(d).st_mode):
            raise Fail("%s: not a directory" % d, EXIT_INPUT)
        return False
    except FileNotFoundError:
        pass
    except OSError as e:
        raise Fail("%s: %s" % (d, e.strerror), EXIT_INPUT)
    try:
        os.makedirs(os.path.dirname(d), exist_ok=True)
        os.mkdir(d)
    except FileExistsError:
        return make_dump_dir(d, owner=None)     # made meanwhile, by someone else: as it is
    except OSError as e:
        raise Fail("cannot create %s: %s" % (d, e.strerror), EXIT_INPUT)
    if owner is not None and owner != (os.geteuid(), os.getegid()):
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise Fail("%s changed while it was being made: %s" % (d, e.strerror), EXIT_INPUT)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_nlink != 2:
                raise Fail("%s changed while it was being made: not given to uid %d"
                           % (d, owner[0]), EXIT_INPUT)
            os.fchown(fd, owner[0], owner[1])
        except OSError as e:
            raise Fail("cannot give %s to uid %d: %s" % (d, owner[0], e.strerror), EXIT_INPUT)
        finally:
            os.close(fd)
    return True


# ---------------------------------------------------------------------------------------
# Compaction (mmleak-compaction(7), docs/compaction.rst): disk use bounded by the live set
# ---------------------------------------------------------------------------------------
#
# Every complete dump file of a trace is folded into the trace's running partial result,
# mmleak.ID.compact (a shrink without --final: the same algebra, so folding is exact in any
# order and grouping), and deleted.  A file is complete when it ends with "#end" (mmleak.so
# never appends to such a file) or when its process is gone.  One pass, under the trace's
# lock (mmleak.ID.lock, which report takes shared while it reads):
#   1. inputs listed by the previous pass ("#folded") that still exist are deleted: that
#      pass wrote its result and was stopped before it could;
#   2. the new result is written to mmleak.ID.compact.tmp, fsync'ed, renamed over
#      mmleak.ID.compact, its directory fsync'ed, and names its inputs in "#folded";
#   3. the inputs are deleted.
# A crash anywhere leaves either the old result and all inputs, or the new result and some
# inputs it names: never a lost or a doubled event (and folding an input twice changes
# nothing anyway: the shrink ignores an event it already has).
