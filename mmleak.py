#!/usr/bin/python3
"""mmleak.py: shrink, symbolize and report the dump files written by mmleak.so.

This file is both a command (``mmleak.py shrink|symbolize|run|report``) and the shared module
the other scripts import for everything about the dump format: reading it, cancelling
allocation/free pairs, finding a process's files, and turning addresses into source lines.
Standard library only, so it runs wherever the dumps are copied to.

The dump format and the shrink algebra are specified in README.rst ("The dump format",
"Shrinking"); the code below follows that text, and the comments say where.
"""
import argparse
import bisect
import collections
import contextlib
import csv
import errno
import io
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

VERSION = "1.0"
FORMAT_VERSION = 2                  # written by mmleak.so; 1 and 2 are read
READ_VERSIONS = ("1", "2")
MAX_DEPTH = 64                      # frames mmleak.so records at most
LIBNAME = "mmleak.so"
PROG = "mmleak.py"

# Exit statuses, shared by every subcommand (documented in --help and README.rst).
EXIT_OK = 0        # done, result complete
EXIT_USAGE = 1     # bad command line
EXIT_INPUT = 2     # an input could not be used at all (missing, unreadable, mixed processes)
EXIT_PARTIAL = 3   # done, but malformed lines were skipped: the result may be incomplete
EXIT_TOOL = 4      # a helper program (eu-addr2line) is missing or failed

EXIT_HELP = """exit status:
  0  success
  1  usage error
  2  an input could not be used (missing or unreadable file, files of different processes
     mixed, no dump files found, a file at one of mmleak's names that is not a regular file
     of the trace's owner or root: ignored or refused, in one line), or an output file could
     not be written; whatever could be read was still processed
  3  malformed lines were skipped (each reported on stderr with file and line), or the trace
     lost events (INCOMPLETE TRACE): the result may miss events
  4  eu-addr2line (elfutils) missing or failing: addresses left unresolved
A torn last line or padding (NULs anywhere, blanks), which a killed process or a crash leaves
behind, is reported but is not an error: the complete events around it are read."""


class Fail(Exception):
    """An error for the user: one line on stderr, then exit with .status."""

    def __init__(self, msg, status=EXIT_INPUT):
        super().__init__(msg)
        self.status = status


def warn(msg):
    sys.stderr.write("%s: %s\n" % (PROG, msg))


# ---------------------------------------------------------------------------------------
# Output files: every file the three tools write goes through new_output
# ---------------------------------------------------------------------------------------
#
# An output may be in a directory others can write (a dump directory in /tmp, a service
# user's own): a name there may be a symbolic link, a hard link, a FIFO or a file planted by
# someone else.  So an output is never opened by its name: its content goes to a new file
# beside it, made with O_CREAT|O_EXCL|O_NOFOLLOW under a name nobody can guess, and that file
# is renamed over the name (replacing whatever was there, a link included, never writing
# through it).  The one exception is a FIFO or a character device the user or root owns,
# reached through no link of anyone else's (such as -o /dev/null or /dev/stdout): there is
# no file to replace there, it is written as it is.

TEMP_SUFFIX = ".tmp"


def _temp_name(path):
    """A name beside PATH for its next content: .NAME.RANDOM.tmp (hidden; systemd reads no
    unit or drop-in of that name; no reader of a dump directory takes it for a dump)."""
    d, base = os.path.split(path)
    return os.path.join(d, ".%s.%s%s" % (base, os.urandom(6).hex(), TEMP_SUFFIX))




FD_LINK_RE = re.compile(r"^/(?:proc/(?:self|thread-self|%d)/fd|dev/fd)/(\d+)$" % os.getpid())


def _output_target(path):
    """Where new_output writes PATH: ("fd", N) for our own descriptor N (/dev/stdout,
    /dev/fd/N); ("direct", NAME) for an existing FIFO or character device root or we own
    (/dev/null); else ("replace", NAME), the name whose content is replaced.  Only our and
    root's symbolic links are followed to get there: a link of anyone else's is the name
    replaced, never followed."""
    trusted = (0, os.geteuid())
    p = path
    for _ in range(40):
        m = FD_LINK_RE.match(os.path.normpath(os.path.abspath(p)))
        if m:
            return "fd", int(m.group(1))
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return "replace", p
        except OSError as e:
            raise Fail("cannot write %s: %s" % (path, e.strerror))
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in trusted:
                return "replace", p
            p = os.path.join(os.path.dirname(p), os.readlink(p))
            continue
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
            return ("direct", p) if st.st_uid in trusted else ("replace", p)
        if stat.S_ISREG(st.st_mode):
            return "replace", p
        raise Fail("cannot write %s: %s" % (path, "a directory" if stat.S_ISDIR(st.st_mode)
                                            else "not a regular file"))
    raise Fail("cannot write %s: too many levels of symbolic links" % path)


@contextlib.contextmanager
def new_output(path, text=False, perm=None, owner=None, sync=False):
    """Write the file PATH: yields a file object (binary, or TEXT: UTF-8, newlines as
    written); on success its content replaces PATH's at once (rename), on an exception PATH
    is left as it was.  PERM: the new file's mode exactly (default 0666 less the umask, as
    open() makes it); OWNER (uid, gid): its owner; SYNC: on disk (file and directory) before
    this returns.  See the top of this section for why."""
    kind, target = _output_target(path)

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
    d = os.path.dirname(target)
    for _ in range(100):
        tmp = _temp_name(target)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o666 if perm is None else perm)
            break
        except FileExistsError:
            continue
    else:
        raise Fail("cannot write %s: no free temporary name beside it" % path)
    f = None
    try:
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
        _fsync_dir(d or ".")


# ---------------------------------------------------------------------------------------
# Finding things
# ---------------------------------------------------------------------------------------

def find_library(explicit=None):
    """Return the absolute path of mmleak.so, or None.

    Search order: EXPLICIT, $MMLEAK_LIB, next to this file (a build tree), then where
    ``make install`` puts it (PREFIX/lib/mmleak/mmleak.so relative to this script's
    PREFIX/bin, then /usr/local and /usr).
    """
    here = os.path.dirname(os.path.realpath(__file__))
    cands = [explicit, os.environ.get("MMLEAK_LIB"),
             os.path.join(here, LIBNAME),
             os.path.join(here, os.pardir, "lib", "mmleak", LIBNAME),
             "/usr/local/lib/mmleak/" + LIBNAME, "/usr/lib/mmleak/" + LIBNAME]
    for c in cands:
        if c and os.path.isfile(c):
            return os.path.realpath(c)
    return None


DUMP_RE = re.compile(r"^mmleak\.(\d+(?:-\d+)?)\.(\d+)\.out$")
MAPS_RE = re.compile(r"^mmleak\.(\d+(?:-\d+)?)\.maps$")
TRACE_FILE_RE = re.compile(r"^mmleak\.(\d+(?:-\d+)?)\.")     # any file of trace ID


# ---------------------------------------------------------------------------------------
# Files in a dump directory that others may write to (README.rst, "Where the files go",
# "Whose files are read").  Every file at one of mmleak's names is opened through
# open_trace_file (or _open_checked): never through a symbolic link, never blocking on a
# FIFO, nothing but a regular file, and only one of the trace's owner or of root.  A file
# that fails is refused (or, found in a listing, ignored): one line, exit status 2.
# ---------------------------------------------------------------------------------------

REFUSALS = set()        # the lines said about refused files (each once); exit status 2


class Refused(Fail):
    """A file at one of mmleak's names that is not what mmleak makes there."""


def refuse(msg):
    """Say MSG (about a refused file) once in this run, and make the exit status 2."""
    if msg not in REFUSALS:
        REFUSALS.add(msg)
        warn(msg)


def trace_owner(directory, tid):
    """(uid, gid) of trace TID's owner: the owner of its mmleak.TID.maps (made first, by the
    traced process: a daemon that switches users hands it over with its other files), or
    None when it has none that is a regular file."""
    try:
        st = os.lstat(os.path.join(directory, "mmleak.%s.maps" % tid))
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
    d, n = os.path.split(path)
    m = TRACE_FILE_RE.match(n)
    return trusted_uids(d or ".", m.group(1)) if m else None


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


def create_trace_file(path):
    """PATH (a temporary name of mmleak.py's in the dump directory) created for writing:
    whatever is there is removed first, then O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600 (only its
    owner reads it, as mmleak.so makes its files); made by root, it is given to the trace's
    owner, like the lock (a file of root's at a name of another user's trace would be
    trusted by the next trace of that name).  OSError passes."""
    _remove_quietly(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK |
                 os.O_CLOEXEC, 0o600)
    try:
        m = TRACE_FILE_RE.match(os.path.basename(path))
        owner = m and trace_owner(os.path.dirname(path) or ".", m.group(1))
        if os.geteuid() == 0 and owner and owner[0] != 0:
            os.fchown(fd, owner[0], owner[1])
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


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


# Reading in bounded memory, whatever a file holds (README.rst, "The dump format"): a line
# longer than LINE_MAX is reported, not kept; a run of NUL bytes (padding; a hole a crash left
# in the file) ends the text before it, and holes are skipped without being read.
LINE_MAX = 1 << 20
_CHUNK = 1 << 20                    # never more than LINE_MAX (see dump_lines)
_NULS_RE = re.compile(rb"\0+")
_ENDS_RE = re.compile(rb"[\n\0]")


def _file_chunks(fd, pos):
    """The data of the regular file FD from POS on, in chunks; None for a hole (as many NUL
    bytes as it is long, never read)."""
    while True:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno != errno.ENXIO:
                data = pos              # no SEEK_DATA here: all of it is data
            else:                       # no data after POS: a hole to the end, or the end
                if pos < os.fstat(fd).st_size:
                    yield None
                return
        if data > pos:
            yield None
            pos = data
        chunk = os.pread(fd, _CHUNK, pos)
        if not chunk:
            return
        pos += len(chunk)
        yield chunk


def _stream_chunks(f):
    read = getattr(f, "read1", None) or f.read
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            return
        yield chunk


def dump_lines(f, limit=LINE_MAX):
    """The lines of the binary file F, read in bounded memory (mmleak-shrink.c's feed_fd
    reads the same way, to the byte):

    * a line ends with its newline (the last one may have none);
    * a run of NUL bytes ends the text before it: that text is yielded with one NUL after
      it ("text cut by padding"; just b"\\0" when there is none), the run is skipped, and
      the next line starts after it; holes of a sparse file are such runs, never read;
    * a line longer than LIMIT is yielded as its first LIMIT bytes, b"\\x01", then what
      ended it (newline, NUL, or nothing at the end of the file); the rest is not kept.

    Anything without .read (a list of lines) is taken as it is."""
    if not hasattr(f, "read"):
        yield from f
        return
    chunks = None
    try:
        fd = f.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode):
            chunks = _file_chunks(fd, f.tell())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    if chunks is None:
        chunks = _stream_chunks(f)
    pend = b""          # the start of a line not ended yet (no NUL, at most LIMIT bytes)
    skip = None         # the head of a line too long, the rest of which is being skipped
    in_nul = False      # the last byte seen was a NUL: a run may go on in the next chunk
    for chunk in chunks:
        if chunk is None:
            chunk = b"\0"
        nul = b"\0" in chunk
        if nul:
            chunk = _NULS_RE.sub(b"\0", chunk)
            if in_nul and chunk[:1] == b"\0":
                chunk = chunk[1:]
                if not chunk:
                    continue
        in_nul = chunk[-1:] == b"\0"
        if skip is not None:
            m = _ENDS_RE.search(chunk)
            if m is None:
                continue
            yield skip + chunk[m.start():m.end()]
            skip = None
            chunk = chunk[m.end():]
        data = pend + chunk if pend else chunk
        if not nul:
            last = data.rfind(b"\n")
            if last < 0:
                pend = data
            else:
                # only the first line can be longer than a chunk: it began in an earlier one
                i = data.find(b"\n")
                yield data[:i + 1] if i <= limit else data[:limit] + b"\x01\n"
                if i < last:
                    yield from io.BytesIO(data[i + 1:last + 1])
                pend = data[last + 1:]
        else:
            at = 0
            for m in _ENDS_RE.finditer(data):
                j = m.start()
                yield data[at:j + 1] if j - at <= limit else data[at:at + limit] + b"\x01" + \
                    data[j:j + 1]
                at = j + 1
            pend = data[at:]
        if len(pend) > limit:
            skip, pend = pend[:limit] + b"\x01", b""
    if skip is not None:
        yield skip
    elif pend:
        yield pend


def read_lines(path, text=False):
    """The lines of the trace file PATH (open_trace_file, dump_lines), decoded if TEXT."""
    with open_trace_file(path) as f:
        for line in dump_lines(f):
            yield line.decode("utf-8", "replace") if text else line


def find_traces(directory):
    """Map trace id ("PID" or "PID-K") -> sorted list of its dump files in DIRECTORY (its
    compacted result mmleak.ID.compact first, if any).  A file at one of those names that
    is not a regular file of the trace's owner or root is left out, and said (one line per
    trace, once; exit status 2): anybody may have put it there (see open_trace_file)."""
    traces = collections.defaultdict(list)
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise Fail("cannot list %s: %s" % (directory, e.strerror))
    uids, ignored = {}, collections.defaultdict(list)
    for n in names:
        m = DUMP_RE.match(n) or COMPACT_RE.match(n)
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
                traces[tid].append((int(m.group(2)), p))
            else:                       # a compacted trace's running result: read it first
                traces[tid].append((-1, p))
        elif MAPS_RE.match(n):
            traces.setdefault(MAPS_RE.match(n).group(1), [])
    for tid, whys in sorted(ignored.items()):
        whys.sort()
        refuse(whys[0] if len(whys) == 1 else "%s (and %d more files of trace %s: ignored "
               "likewise)" % (whys[0], len(whys) - 1, tid))
    out = {}
    for k, v in traces.items():
        files = [p for _, p in sorted(v)]
        if files and files[0].endswith(".compact"):
            # a compaction pass stopped after writing its result, before deleting its
            # inputs: they are in the result already (the next pass deletes them)
            try:
                folded = set(_previously_folded(files[0], k))
            except Refused as e:        # replaced since the listing
                refuse(str(e))
                files, folded = files[1:], ()
            if folded:
                files = [p for p in files if os.path.basename(p) not in folded]
        out[k] = files
    return out


def _first_header(path):
    """The header of the dump file PATH (its first line, read as a bounded one), or None."""
    try:
        with open_trace_file(path) as f:
            return parse_header(f.readline(4096))
    except (OSError, Refused):
        return None


def trace_start_for_maps(maps_path):
    """The start time (Unix seconds) in the header of a dump file beside MAPS_PATH, or None."""
    d, n = os.path.split(os.path.abspath(maps_path))
    m = MAPS_RE.match(n)
    if not m:
        return None
    for p in find_traces(d).get(m.group(1), []):
        h = _first_header(p)
        if h and header_int(h, "start", None) is not None:
            return header_int(h, "start")
    return None


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
        m = re.match(rb"#at ([0-9a-f]{16}) *\n", os.pread(fd, min(end - start, 4096), start))
        if not m:
            continue
        pos = body = start + m.end()
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
        halves.append((int(m.group(1), 16), body, n))
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
    tail = out_path[:-4] + ".tail" if out_path.endswith(".out") else None
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
    with open_trace_file(p[:-4] + ".tail") as t, open(q + ".tail", "w+b") as copy:
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
        if p == "-" or not p.endswith(".out") or not os.path.lexists(p[:-4] + ".tail"):
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
# The dump format (README.rst, "The dump format")
# ---------------------------------------------------------------------------------------
#   allocation:  PTR SEQ SIZE TIME CALLER [CALLER...]   (5 or more fields)
#   free:        PTR SEQ CALLER                         (3 fields)
#   bracket:     PTR SEQ +   or   PTR SEQ -             (3 fields, written by shrink only)
#   header:      lines starting with '#'
# All numbers are lowercase hex.  A line is complete only with its newline.

KIND_FREE, KIND_ALLOC, KIND_END, KIND_START = 0, 1, 2, 3   # odd kinds are allocation-like
EVENT_RE = re.compile(rb"([0-9a-f]{1,16}) ([0-9a-f]{1,16}) (?:([0-9a-f]{1,16}) ([0-9a-f]{1,16}) "
                      rb"([0-9a-f]{1,16}(?: [0-9a-f]{1,16})*|@[0-9a-f]{1,16})|"
                      rb"([0-9a-f]{1,16}|[+-]))\n")
STACK_RE = re.compile(rb"#s ([0-9a-f]{1,16})((?: [0-9a-f]{1,16})+)\n")
# The callers of an allocation whose stack definition ("#s") is missing from the trace (the
# process ended between the two, or the file holding it was lost).
NO_STACK = (0,)

# The first line after a run of NULs may be the end of a line whose start a hole took (a
# crash leaves zeros in whole blocks, wherever lines begin): mmleak.so writes every pointer
# with 12 digits or more, so an event whose pointer is shorter there is such a piece, and a
# loss in the middle of the file (malformed: the result may miss events).
CUT_START = "line cut by NUL bytes before it (its start is lost) skipped: %r"

Alloc = collections.namedtuple("Alloc", "ptr seq size time callers")
Free = collections.namedtuple("Free", "ptr seq caller")


def parse_event(line, stacks=None):
    """Parse one event line (bytes, with its newline) into Alloc or Free; None if invalid.

    An allocation's callers are its fields, or, for "@ID", the frames of the stack ID in
    STACKS (id -> tuple of addresses, from the "#s" lines; NO_STACK if it is not there).
    Brackets (``PTR SEQ +``/``-``) parse as None: they are bookkeeping, not events."""
    m = EVENT_RE.fullmatch(line)
    if not m:
        return None
    if m.group(3) is not None:
        c = m.group(5)
        if c[0] == 64:                                   # b"@"
            callers = (stacks or {}).get(int(c[1:], 16), NO_STACK)
        else:
            callers = tuple(int(x, 16) for x in c.split())
        return Alloc(int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16),
                     int(m.group(4), 16), callers)
    c = m.group(6)
    if c in (b"+", b"-"):
        return None
    return Free(int(m.group(1), 16), int(m.group(2), 16), int(c, 16))


def _unescape(raw):
    """mmleak.so writes bytes outside printable ASCII (and '\\') as \\xHH."""
    raw = re.sub(rb"\\x([0-9a-f]{2})", lambda g: bytes([int(g.group(1), 16)]), raw)
    return raw.decode("utf-8", "replace")


# Header fields that are decimal numbers (the others, such as id=, are names).
HEADER_NUMBERS = ("pid", "tid", "file", "depth", "start", "late")


def bad_header_fields(h):
    """The (key, value) of header H's numeric fields that are not decimal numbers (or a
    depth below 1)."""
    bad = []
    for k in HEADER_NUMBERS:
        v = h.get(k)
        if k == "depth" and v == "auto":
            continue
        if v is not None and not (v.isascii() and v.isdigit() and (k != "depth" or int(v) >= 1)):
            bad.append((k, v))
    return bad


def header_int(h, key, default=0):
    """A numeric header field as an int (DEFAULT if absent or not a number)."""
    v = h.get(key)
    return int(v) if v and v.isascii() and v.isdigit() else default


def parse_stack(line):
    """'#s ID FRAME...' -> (id, frames) or None."""
    m = STACK_RE.fullmatch(line)
    if not m:
        return None
    return int(m.group(1), 16), tuple(int(x, 16) for x in m.group(2).split())


def parse_header(line):
    """'#mmleak 1 k=v ...' -> dict (with 'version'); other '#' lines -> None."""
    text = line.decode("utf-8", "replace").rstrip("\n")
    if not text.startswith("#mmleak "):
        return None
    parts = text.split()
    h = {"version": parts[1] if len(parts) > 1 else "?"}
    for p in parts[2:]:
        k, _, v = p.partition("=")
        h[k] = v
    return h


class Problems:
    """Collects input problems: the first few of each kind per file are reported with their
    line number, the rest counted, so a damaged 10 GB file gives a readable stderr."""
    SHOW = 5

    def __init__(self):
        self.counts = collections.Counter()
        self.fatal = False
        self.malformed = False

    def add(self, name, lineno, kind, text):
        key = (name, kind)
        self.counts[key] += 1
        if self.counts[key] <= self.SHOW:
            warn("%s:%d: %s" % (name, lineno, text))
        if kind not in ("torn", "padding"):
            self.malformed = True

    def summary(self):
        for (name, kind), n in sorted(self.counts.items()):
            if n > self.SHOW:
                warn("%s: %d more lines with the same problem (%s) not shown"
                     % (name, n - self.SHOW, kind))


# ---------------------------------------------------------------------------------------
# Shrink (README.rst, "Shrinking"): the algorithm, specified once.
#
# Events of one address P are totally ordered by SEQ.  In the true history they alternate
# alloc, free, alloc, free...; what matters at the end is only the first and the last event
# of P: a last event that is an allocation is a block still alive (a survivor), a first
# event that is a free released a block allocated before tracing began (a foreign free).
#
# For each P the shrinker keeps either one event, or a "hull": the lowest and the highest
# event seen (events strictly between them are dropped; they can never be first or last).
# One more rule cancels work: when P's whole state is an allocation with SEQ s and a free
# with SEQ s+1, the two are adjacent in the true history (the tracer's counter for P's
# bucket moved by one, so nothing else touched P in between) and both are dropped.
#
# These rules commute: any grouping of the input files, in any order, in any number of
# partial shrinks, gives the same first and last event for every address, so the same
# survivors and foreign frees.  A partial result keeps what later merges need: the ends of
# every hull.  A hull end that can never be reported (an allocation at the low end, a free
# at the high end) is written as a bracket line "PTR SEQ +" or "PTR SEQ -".
# ---------------------------------------------------------------------------------------

class Shrinker:
    def __init__(self, progress=None):
        self.state = {}
        self.events = 0
        self.allocs = 0
        self.frees = 0
        self.headers = []          # header dicts, one per dump file seen
        self.header_lines = []     # '#' lines to pass through, first-seen order
        self._seen_header = set()
        self.cmd = None
        self.title = None          # the command line at the end, from "#title t=T" (latest T)
        self._title_t = -1
        self.alloc = None          # the allocator's file, from "#alloc"
        self.stacks = {}           # stack id -> frames, from "#s" lines
        # what earlier compaction passes folded ("#compacted"): files, events, and how many
        # event lines their result holds (read again here, not new events)
        # ("allocs": allocations among the events, "entry_allocs": allocation lines among
        # the entries; None when a result of an older mmleak.py has no count of them)
        self.compacted = {"files": 0, "events": 0, "entries": 0, "allocs": 0,
                          "entry_allocs": 0}
        self.stack_lines = {}      # stack id -> its "#s" line
        self.lost = {}             # gap k -> events not recorded ("#lost N k=K")
        self.dropping = set()      # gaps that began ("#dropping k=K")
        self.max_time = 0
        self.problems = Problems()
        self.files_done = 0
        self.progress = progress
        self.result_lines = None   # shrink_raw: (event lines of the result, allocations)

    # -- input -------------------------------------------------------------------------
    def feed_path(self, path, name=None):
        f = self.open_input(path, name)
        if f is not None:
            with f:
                self.feed(f, name or path)

    def open_input(self, path, name=None):
        """PATH opened to be read (open_trace_file), or None after saying why not."""
        try:
            return open_trace_file(path)
        except Refused as e:
            refuse(str(e))
        except OSError as e:
            warn("%s: cannot read: %s" % (name or path, e.strerror or e))
        self.problems.fatal = True
        return None

    def feed(self, f, name):
        D = self.state
        get = D.get
        match = EVENT_RE.fullmatch
        problems = self.problems
        lineno = 0
        events = allocs = 0
        max_time = self.max_time
        tick = time.monotonic() + 1.0
        after_nul = False
        for line in dump_lines(f):
            lineno += 1
            m = match(line)
            if m is None:
                self._odd_line(line, name, lineno)
                after_nul = line[-1:] == b"\0"
                if after_nul:
                    lineno -= 1         # text cut by NULs: the line goes on after them
                continue
            if after_nul:
                after_nul = False
                if m.end(1) < 12:       # see CUT_START
                    problems.add(name, lineno, "malformed", CUT_START % line[:80])
                    continue
            key = int(m.group(1), 16)
            s = int(m.group(2), 16)
            if m.group(3) is not None:
                kind = KIND_ALLOC
                allocs += 1
                t = int(m.group(4), 16)
                if t > max_time:
                    max_time = t
            else:
                c = m.group(6)
                kind = KIND_START if c == b"+" else KIND_END if c == b"-" else KIND_FREE
            events += 1
            # -- the state update: the whole algorithm --
            st = get(key)
            if st is None:
                D[key] = (s, kind, line)
            elif type(st) is tuple:
                s0 = st[0]
                if s0 == s:
                    problems.add(name, lineno, "duplicate",
                                 "event seen twice (same address and number): was a file "
                                 "given twice?")
                    continue
                lo, hi = (st, (s, kind, line)) if s0 < s else ((s, kind, line), st)
                if lo[1] & 1 and not hi[1] & 1 and hi[0] == lo[0] + 1:
                    del D[key]
                else:
                    D[key] = [lo, hi]
            else:
                if s < st[0][0]:
                    st[0] = (s, kind, line)
                elif s > st[1][0]:
                    st[1] = (s, kind, line)
                elif s == st[0][0] or s == st[1][0]:
                    problems.add(name, lineno, "duplicate",
                                 "event seen twice (same address and number): was a file "
                                 "given twice?")
            if self.progress and lineno & 0xFFFF == 0 and time.monotonic() > tick:
                tick = time.monotonic() + 1.0
                self.progress(self, name, events)
        self.events += events
        self.allocs += allocs
        self.frees += events - allocs
        self.max_time = max(self.max_time, max_time)       # "#clock" may have moved it
        self.files_done += 1

    def _odd_line(self, line, name, lineno):
        """Everything that is not an event line (as dump_lines yields them)."""
        end = line[-1:]
        if end == b"\0":                # text cut by a run of NULs (dump_lines)
            if line[:-1].strip(b" "):
                self.problems.add(name, lineno, "torn", "torn line (process killed while "
                                  "writing it?) ignored: %r" % line[:-1][:60])
            else:
                self.problems.add(name, lineno, "padding", "NUL bytes skipped (padding, or a "
                                  "hole a crash left in the file)")
            return
        if len(line) > LINE_MAX + (end == b"\n"):   # cut by dump_lines: it was longer
            if end == b"\n":
                self.problems.add(name, lineno, "malformed", "malformed line skipped (longer "
                                  "than %d bytes): %r" % (LINE_MAX, line[:80]))
            elif line.startswith(b"#"):
                self.problems.add(name, lineno, "torn", "torn last line ignored")
            else:
                self.problems.add(name, lineno, "torn", "torn line (process killed while "
                                  "writing it?) ignored: %r" % line[:60])
            return
        if line.startswith(b"#"):
            if end != b"\n":
                self.problems.add(name, lineno, "torn", "torn last line ignored")
                return
            if line.startswith(b"#s "):
                st = parse_stack(line)
                if st is None:
                    self.problems.add(name, lineno, "malformed",
                                      "malformed stack line skipped: %r" % line[:80])
                elif st[0] not in self.stacks:
                    self.stacks[st[0]] = st[1]
                    self.stack_lines[st[0]] = line
                elif self.stacks[st[0]] != st[1]:
                    self.problems.add(name, lineno, "malformed",
                                      "stack %x defined again with other frames: ignored (the "
                                      "first definition is kept)" % st[0])
                return
            if line.startswith(b"#clock "):    # the trace's clock (written by shrink, compact)
                v = line[7:-1]
                if v.isdigit() and len(v) <= 20:
                    self.max_time = max(self.max_time, int(v))
                else:
                    self.problems.add(name, lineno, "malformed",
                                      "malformed clock line skipped: %r" % line[:80])
                return
            if line not in self._seen_header:
                self._seen_header.add(line)
                self.header_lines.append(line)
                h = parse_header(line)
                if h is not None:
                    if h["version"] not in READ_VERSIONS:
                        raise Fail("%s:%d: dump format version %s, this mmleak.py reads %s"
                                   % (name, lineno, h["version"], " and ".join(READ_VERSIONS)))
                    for k, v in bad_header_fields(h):
                        self.problems.add(name, lineno, "malformed",
                                          "malformed header field %s=%s (a decimal number "
                                          "expected): ignored" % (k, v))
                        del h[k]
                    h["source"] = name
                    self.headers.append(h)
                elif line.startswith(b"#lost ") or line.startswith(b"#dropping"):
                    self._gap_line(line)
                elif line.startswith(b"#compacted "):
                    fields = dict(kv.partition(b"=")[::2] for kv in line.split()[1:])
                    for k in self.compacted:
                        v = fields.get(k.encode(), b"")
                        if self.compacted[k] is not None and v.isdigit():
                            self.compacted[k] += int(v)
                        elif k in ("allocs", "entry_allocs"):
                            self.compacted[k] = None
                elif line.startswith(b"#alloc ") and self.alloc is None:
                    self.alloc = _unescape(line[7:].rstrip(b"\n"))
                elif line.startswith(b"#cmd ") and self.cmd is None:
                    self.cmd = _unescape(line[5:].rstrip(b"\n"))
                elif line.startswith(b"#title t="):
                    t, _, text = line[9:].rstrip(b"\n").partition(b" ")
                    if t.isdigit() and int(t) >= self._title_t:
                        self._title_t, self.title = int(t), _unescape(text)
            return
        if end != b"\n":                # the last line, without its newline
            if not line.strip(b" "):
                self.problems.add(name, lineno, "padding",
                                  "padding after the last line (the process did not "
                                  "exit cleanly); ignored")
            else:
                self.problems.add(name, lineno, "torn",
                                  "torn line (process killed while writing it?) ignored: %r"
                                  % line[:60])
            return
        if not line.strip():
            return
        self.problems.add(name, lineno, "malformed", "malformed line skipped: %r" % line[:80])

    def _gap_line(self, line):
        """'#dropping k=K': mmleak.so began to drop events (it could not write);
        '#lost N k=K': N events of that gap were not recorded."""
        parts = line.split()
        k = dict(p.split(b"=", 1) for p in parts[1:] if b"=" in p).get(b"k", b"?")
        if parts[0] == b"#dropping":
            self.dropping.add(k)
        elif len(parts) >= 2 and parts[1].isdigit():
            self.lost[k] = int(parts[1])

    def gaps(self):
        """(events known lost, gaps of unknown size): events mmleak.so could not record.
        A trace with either is incomplete: a lost free shows as a leak, a lost allocation
        as a free of a block allocated before tracing."""
        return sum(self.lost.values()), len(self.dropping - set(self.lost))

    def gap_text(self):
        lost, unknown = self.gaps()
        if not lost and not unknown:
            return None
        parts = []
        if lost:
            parts.append("%d events were not recorded" % lost)
        if unknown:
            parts.append("%s%d gap%s of unknown size (the process ended while mmleak.so could "
                         "not write)" % ("and " if lost else "", unknown, "s" if unknown > 1 else ""))
        return ("INCOMPLETE TRACE: %s; blocks may show as leaks whose free was lost"
                % " ".join(parts))

    def history(self):
        """What the trace recorded, the events folded by compaction ("#compacted") included:
        {events, allocs, frees (None when an older compacted result did not count them),
        folded_events, folded_files}."""
        c = self.compacted
        if not c["files"]:
            return {"events": self.events, "allocs": self.allocs, "frees": self.frees,
                    "folded_events": 0, "folded_files": 0}
        events = c["events"] + self.events - c["entries"]
        allocs = None if c["allocs"] is None else c["allocs"] + self.allocs - c["entry_allocs"]
        return {"events": events, "allocs": allocs,
                "frees": None if allocs is None else events - allocs,
                "folded_events": c["events"], "folded_files": c["files"]}

    # -- checks --------------------------------------------------------------------------
    def trace_ids(self):
        return sorted({h.get("id", "?") for h in self.headers})

    def check_single_process(self):
        ids = self.trace_ids()
        if len(ids) > 1:
            srcs = {}
            for h in self.headers:
                srcs.setdefault(h.get("id", "?"), h["source"])
            raise Fail("files of different processes mixed: %s (shrink each process on its "
                       "own, or pass --mixed)" % ", ".join("%s (%s)" % (i, srcs[i]) for i in ids))

    # -- output --------------------------------------------------------------------------
    def entries(self, final):
        """Yield (key, seq, kind, line) of the result, sorted by address then number.

        final=False: everything later merges need (survivors, foreign frees, brackets).
        final=True: only what the complete input proves: survivors and foreign frees."""
        for key in sorted(self.state):
            st = self.state[key]
            if type(st) is tuple:
                s, kind, line = st
                if kind in (KIND_ALLOC, KIND_FREE) or not final:
                    yield key, s, kind, line
                continue
            (s0, k0, l0), (s1, k1, l1) = st
            if k0 == KIND_FREE:
                yield key, s0, k0, l0
            elif not final:
                yield key, s0, KIND_START, b"%s %x +\n" % (l0.split(b" ", 1)[0], s0)
            if k1 == KIND_ALLOC:
                yield key, s1, k1, l1
            elif not final:
                yield key, s1, KIND_END, b"%s %x -\n" % (l1.split(b" ", 1)[0], s1)

    def write(self, out, final):
        """The result in the dump format: the header lines, the trace's clock when its
        newest event is not in the result ("#clock"), the stacks its allocations use, then
        the events, by address."""
        for h in self.header_lines:
            out.write(h)
        entries = list(self.entries(final))
        newest = max((int(line.split(b" ", 4)[3], 16) for _, _, kind, line in entries
                      if kind == KIND_ALLOC), default=0)
        if self.max_time > newest:
            out.write(b"#clock %d\n" % self.max_time)
        used = sorted({int(line.split(b"@", 1)[1], 16) for _, _, kind, line in entries
                       if kind == KIND_ALLOC and b"@" in line})
        for i in used:
            if i in self.stack_lines:
                out.write(self.stack_lines[i])
        for _, _, _, line in entries:
            out.write(line)

    def survivors(self):
        """The blocks still allocated at the end (final semantics), as Alloc tuples."""
        res = []
        for _, _, kind, line in self.entries(True):
            if kind == KIND_ALLOC:
                res.append(parse_event(line, self.stacks))
        return res

    def foreign_frees(self):
        return [parse_event(line) for _, _, kind, line in self.entries(True)
                if kind == KIND_FREE]


def progress_printer(stream=None):
    """A progress callback that rewrites one status line on a terminal."""
    stream = stream or sys.stderr
    start = time.monotonic()

    def show(sh, name, file_events, done=False):
        el = time.monotonic() - start
        n = sh.events + file_events
        stream.write("\r%s: %.1fM events, %d files done, %.1fM events/s, now %s%s"
                     % (PROG, n / 1e6, sh.files_done, n / 1e6 / max(el, 1e-9),
                        os.path.basename(name), "\n" if done else "   "))
        stream.flush()
    return show


def shrink_files(paths, progress=None, mixed=False):
    """Shrink the given dump files (and '-' for stdin); return the Shrinker.

    Lines a thread had staged but not yet flushed to its .out (see unflushed_tail) are read
    too: a killed or still running process loses nothing."""
    paths, names, tmpdir, refused = with_unflushed_tails(paths)
    try:
        for msg in refused:             # their .out is read as it is
            refuse(msg)
        sh = _shrink_files(paths, progress, mixed, names)
        sh.problems.fatal = sh.problems.fatal or bool(refused)
        return sh
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def shrink_raw(paths):
    """Shrink PATHS (dump files of one trace, their unflushed lines included) without
    building the per-address state in Python: (Shrinker with headers, stacks and counts,
    the result's event lines as bytes, non-final, sorted by address then number).  What a
    compaction pass writes and what a series point reads, at the compiled shrinker's speed;
    the Python path gives the same bytes."""
    paths, names, tmpdir, refused = with_unflushed_tails(paths)
    try:
        if refused:                     # a compactor folds nothing it cannot read whole
            for msg in refused[1:]:
                refuse(msg)
            raise Refused(refused[0])
        sh = Shrinker()
        with tempfile.TemporaryFile(prefix="mmleak-shrink.") as out:
            if native_shrink(sh, paths, names, raw=out):
                out.seek(0)
                data = out.read()
            else:
                for p, name in zip(paths, names):
                    sh.feed_path(p, name)
                entries = list(sh.entries(False))
                data = b"".join(line for _, _, _, line in entries)
                sh.result_lines = (len(entries),
                                   sum(1 for e in entries if e[2] == KIND_ALLOC))
                sh.state = {}
        sh.check_single_process()
        return sh, data
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _shrink_files(paths, progress=None, mixed=False, names=None):
    sh = Shrinker(progress)
    names = names or ["<stdin>" if p == "-" else p for p in paths]
    if not native_shrink(sh, paths, names):   # the compiled path (below), when it can run
        for p, name in zip(paths, names):
            if p == "-":
                sh.feed(sys.stdin.buffer, name)
            else:
                sh.feed_path(p, name)
    if not mixed:
        sh.check_single_process()
    return sh


# ---------------------------------------------------------------------------------------
# Compiled shrink path (mmleak-shrink.c, built into mmleak.so)
#
# The same algorithm in C, at tens of millions of events per second.  mmleak.so is loaded
# with ctypes (RTLD_LOCAL: its malloc does not become the process's, and its constructor
# sees that and leaves the tracer off).  The C code reads the files, writes the problem
# messages (the very lines Shrinker._odd_line would) to our stderr, hands every new '#' line
# to Shrinker._odd_line through a callback (so headers, #cmd and the version check are this
# file's), and writes the non-final result to a temporary file, which is loaded back into the
# Shrinker's state: a partial result shrinks to itself, so entries(), write(), survivors()
# give what the Python path gives.  MMLEAK_SHRINK=python|native chooses; default: native
# when mmleak.so has it, else Python.
# ---------------------------------------------------------------------------------------

SHRINK_ENV = "MMLEAK_SHRINK"
NATIVE_ABI = 3
_PROBLEM_KINDS = ("torn", "padding", "malformed", "duplicate")
_native = None          # None: not tried yet; False: unavailable; else the ctypes binding
_native_why = None      # why it is unavailable


def _native_engine():
    """The ctypes binding of mmleak_shrink, or None (with the reason in _native_why)."""
    global _native, _native_why
    if _native is not None:
        return _native or None
    _native, _native_why = False, None
    lib = find_library()
    if not lib:
        _native_why = "mmleak.so not found"
        return None
    try:
        import ctypes
        dll = ctypes.CDLL(lib)
        if dll.mmleak_shrink_abi() != NATIVE_ABI:
            _native_why = "%s: mmleak_shrink interface version differs" % lib
            return None
        fn = dll.mmleak_shrink
    except (OSError, AttributeError) as e:
        _native_why = "%s: %s" % (lib, e)
        return None

    class Stats(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("events", "allocs", "max_time",
                                                    "files_done", "entries", "fatal",
                                                    "malformed", "out_errno", "lines",
                                                    "alloc_lines")]
    hdr_cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_uint64)
    tick_cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                               ctypes.c_uint64)
    open_cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
    strv = ctypes.POINTER(ctypes.c_char_p)
    fn.argtypes = [strv, strv, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   hdr_cb, tick_cb, open_cb, ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(Stats)]
    fn.restype = ctypes.c_int
    _native = (ctypes, fn, Stats, hdr_cb, tick_cb, open_cb)
    return _native


def _shrink_engine():
    """'native' or 'python', as MMLEAK_SHRINK asks and the library allows."""
    want = os.environ.get(SHRINK_ENV, "").strip().lower()
    if want == "python":
        return "python"
    if want not in ("", "auto", "native"):
        raise Fail("%s=%s: expected python or native" % (SHRINK_ENV, want), EXIT_USAGE)
    if _native_engine() is not None:
        return "native"
    if want == "native":
        raise Fail("%s=native: the compiled shrinker is not available (%s)"
                   % (SHRINK_ENV, _native_why), EXIT_TOOL)
    return "python"


def native_shrink(sh, paths, names=None, raw=None):
    """Feed PATHS ('-': stdin) into the fresh Shrinker SH with the compiled shrinker.

    RAW (a binary file): the result's event lines (non-final, as Shrinker.entries(False)
    gives them) are written there instead of being loaded into SH.state.  Returns False,
    having done nothing, when the Python path must do it instead (not available, not
    wanted, or stdin/stderr are not plain descriptors)."""
    if _shrink_engine() != "native":
        return False
    ctypes, fn, Stats, hdr_cb, tick_cb, open_cb = _native
    if names is None:
        names = ["<stdin>" if p == "-" else p for p in paths]
    try:
        if "-" in paths and sys.stdin.buffer.fileno() != 0:
            raise ValueError("stdin is not descriptor 0")
        err_fd = None
        try:
            err_fd = sys.stderr.fileno()
        except (AttributeError, ValueError, OSError):
            pass
        if err_fd is not None:
            enc = getattr(sys.stderr, "encoding", None) or "utf-8"
            errors = getattr(sys.stderr, "errors", None) or "strict"
        else:
            enc, errors = "utf-8", "surrogateescape"
        c_paths = [os.fsencode(p) for p in paths]
        c_names = [n.encode(enc, errors) for n in names]
        if any(b"\0" in x for x in c_paths + c_names):
            raise ValueError("NUL in a file name")
    except (ValueError, AttributeError, OSError, UnicodeError):
        return False            # stdin/stderr replaced (tests, embedding): the Python path
    if sh.state or sh.events or sh.header_lines:
        raise ValueError("native_shrink needs a fresh Shrinker")

    pending = []

    first = {}
    for i, name in enumerate(names):
        first.setdefault(name, i)

    def on_header(ptr, n, i, lineno):
        # a problem _odd_line finds (a bad header field, a stack defined twice) counts with
        # the C code's of the same file and kind: the first five of them are shown, as the
        # Python path shows them
        name, base = names[i], len(_PROBLEM_KINDS) * first[names[i]]
        pc = sh.problems.counts
        keys = [(name, k) for k in _PROBLEM_KINDS]
        before = {key: pc[key] for key in keys if key in pc}
        for j, key in enumerate(keys):
            pc[key] = before.get(key, 0) + counts[base + j]
        try:
            sh._odd_line(ctypes.string_at(ptr, n), name, lineno)
            return 0
        except BaseException as e:          # Fail (format version), KeyboardInterrupt
            pending.append(e)
            return 1
        finally:
            for j, key in enumerate(keys):
                counts[base + j] = pc.pop(key) - before.get(key, 0)
                if key in before:
                    pc[key] = before[key]

    next_tick = [time.monotonic() + 1.0]

    def on_tick(i, file_events, before, files_done):
        try:
            if sh.progress and time.monotonic() > next_tick[0]:
                next_tick[0] = time.monotonic() + 1.0
                sh.events, sh.files_done = before, files_done
                sh.progress(sh, names[i], file_events)
            return 0
        except BaseException as e:          # KeyboardInterrupt, or a broken progress stream
            pending.append(e)
            return 1

    def on_open(i):
        try:
            f = sh.open_input(paths[i], names[i])     # the checks of every reader, and
            sys.stderr.flush()                        # its messages, in their place
            if f is None:
                return -1
            with f:
                return os.dup(f.fileno())
        except BaseException as e:          # KeyboardInterrupt
            pending.append(e)
            return -2

    n = len(paths)
    counts = (ctypes.c_uint64 * (len(_PROBLEM_KINDS) * max(n, 1)))()
    stats = Stats()
    errtmp = None
    if err_fd is None:
        errtmp = tempfile.TemporaryFile(prefix="mmleak-err.")
        err_fd = errtmp.fileno()
    else:
        sys.stderr.flush()
    with (tempfile.TemporaryFile(prefix="mmleak-shrink.") if raw is None else
          open(os.dup(raw.fileno()), "r+b")) as out:
        h_cb, t_cb, o_cb = hdr_cb(on_header), tick_cb(on_tick), open_cb(on_open)
        try:
            argv = ctypes.c_char_p * max(n, 1)
            rc = fn(argv(*c_paths), argv(*c_names), n, out.fileno(), err_fd, 0, h_cb, t_cb,
                    o_cb, counts, ctypes.byref(stats))
        finally:
            if errtmp is not None:
                errtmp.seek(0)
                text = errtmp.read().decode(enc, errors)
                errtmp.close()
                if text:
                    sys.stderr.write(text)
        if rc == 1 and pending:
            raise pending[0]
        if rc == -1:
            raise MemoryError("mmleak-shrink.c: out of memory")
        if rc == -2:
            raise Fail("cannot write a temporary file in %s (the shrink's result): %s"
                       % (tempfile.gettempdir(), os.strerror(stats.out_errno)))
        if rc != 0:
            raise RuntimeError("mmleak-shrink.c: unexpected status %d" % rc)
        if raw is None:
            out.seek(0)
            _load_state(sh, out)
    sh.events = stats.events
    sh.allocs = stats.allocs
    sh.frees = stats.events - stats.allocs
    sh.max_time = max(sh.max_time, stats.max_time)
    sh.files_done += stats.files_done
    sh.result_lines = (stats.lines, stats.alloc_lines)
    for i, name in enumerate(names):
        for k, kind in enumerate(_PROBLEM_KINDS):
            if counts[len(_PROBLEM_KINDS) * i + k]:
                sh.problems.counts[(name, kind)] += counts[len(_PROBLEM_KINDS) * i + k]
    sh.problems.malformed = sh.problems.malformed or bool(stats.malformed)
    sh.problems.fatal = sh.problems.fatal or bool(stats.fatal)
    return True


def _load_state(sh, f):
    """Load a shrink result (valid lines, sorted by address then number, at most two per
    address, never an adjacent pair) into SH.state as Shrinker.feed would have built it."""
    D = sh.state
    match = EVENT_RE.fullmatch
    for line in f:
        m = match(line)
        key = int(m.group(1), 16)
        s = int(m.group(2), 16)
        if m.group(3) is not None:
            kind = KIND_ALLOC
        else:
            c = m.group(6)
            kind = KIND_START if c == b"+" else KIND_END if c == b"-" else KIND_FREE
        st = D.get(key)
        D[key] = (s, kind, line) if st is None else [st, (s, kind, line)]
# ------------------------------------------------------------ end of compiled shrink path


# ---------------------------------------------------------------------------------------
# Symbolization (README.rst, "Symbolizing")
# ---------------------------------------------------------------------------------------

Frame = collections.namedtuple("Frame", "addr module offset function file line inlined error")
MAPS_LINE_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) (\S+) (\d+)\s+(.*)$")


ADDR_MASK = (1 << 48) - 1      # a frame's top 16 bits: the dlclose epoch (mmleak.ID.loads)


class Maps:
    """The cumulative maps file: every file-backed mapping the process had (or LINES)."""

    def __init__(self, path, lines=None):
        self.path = path
        self.entries = []   # (start, end, offset, inode, pathname)
        if lines is None:
            lines = list(read_lines(path, text=True))
        for line in lines:
            m = MAPS_LINE_RE.match(line.rstrip("\n"))
            if not m:
                continue
            self.entries.append((int(m.group(1), 16), int(m.group(2), 16),
                                 int(m.group(4), 16), int(m.group(6)), m.group(7),
                                 line if line.endswith("\n") else line + "\n"))
        self.entries.sort()
        self.starts = [e[0] for e in self.entries]
        self._loads = None

    def load_of(self, entry):
        """The mappings of the load ENTRY belongs to (a tuple, in address order).  A file
        loaded at two addresses over the run (dlclose, then dlopen where the loader chose)
        has two loads here, and eu-addr2line must be shown one of them at a time: given the
        same file at two bases it resolves neither."""
        if self._loads is None:
            self._loads = {}
            groups = collections.defaultdict(list)     # path -> [[entries of one load]]
            ends = {}                                   # (path, end) -> the load ending there
            for e in self.entries:                      # (in address order)
                loads = groups[e[4]]
                # a load starts at its offset-0 mapping (the ELF header); a later mapping
                # joins the load it continues, else the nearest one below it
                g = None
                if e[2] != 0 and loads:
                    g = ends.get((e[4], e[0]), loads[-1])
                if g is None:
                    g = []
                    loads.append(g)
                g.append(e)
                ends[(e[4], e[1])] = g
            for loads in groups.values():
                for g in loads:
                    t = tuple(g)
                    for e in g:
                        self._loads[e] = t
        return self._loads[entry]

    def find(self, addr):
        """All mappings containing addr (more than one: the range was reused)."""
        if not hasattr(self, "_maxlen"):
            self._maxlen = max([e[1] - e[0] for e in self.entries] or [0])
        hits = []
        j = bisect.bisect_right(self.starts, addr) - 1
        while j >= 0 and addr - self.entries[j][0] < self._maxlen:
            if addr < self.entries[j][1]:
                hits.append(self.entries[j])
            j -= 1
        return hits


class Loads:
    """mmleak.ID.loads: "+EPOCH LINE" when a mapping appeared, "-EPOCH LINE" when it was gone,
    EPOCH counting the dlclose() calls before.  Tells which object was at an address in an
    epoch, where the maps file (every mapping ever) has several."""

    def __init__(self, path):
        self.log = []
        for line in read_lines(path, text=True):
            m = re.match(r"([-+])(\d+) (.*\n?)$", line)
            if m:
                self.log.append((m.group(1), int(m.group(2)), m.group(3)))
        self._views = {}

    def view(self, epoch):
        """The mappings present in EPOCH, as a Maps."""
        if epoch not in self._views:
            present = {}
            for sign, e, line in self.log:
                if e > epoch:
                    break
                if sign == "+":
                    present[line] = True
                else:
                    present.pop(line, None)
            self._views[epoch] = Maps(None, list(present))
        return self._views[epoch]

    def first_epoch(self, addr):
        """The epoch the first object mapped over ADDR appeared in (frames without an epoch
        were recorded before anything at their address was unloaded)."""
        for sign, e, line in self.log:
            m = MAPS_LINE_RE.match(line.rstrip("\n"))
            if sign == "+" and m and int(m.group(1), 16) <= addr < int(m.group(2), 16):
                return e
        return 0


def _module_problem(path, inode, trace_start):
    """Why a module's file cannot be trusted for the run, or None."""
    if path.endswith(" (deleted)"):
        return "the file was deleted or replaced while the process ran"
    try:
        st = os.stat(path)
    except OSError as e:
        return "cannot read %s: %s" % (path, e.strerror)
    if inode and st.st_ino != inode:
        return "%s was replaced since the run (inode changed)" % path
    if trace_start and st.st_mtime >= trace_start + 1:
        return "%s was modified after the run started" % path
    return None


class Symbolizer:
    """Turns caller addresses into Frames with eu-addr2line, one process per batch."""

    def __init__(self, maps_path, trace_start=None, tool="eu-addr2line", program_lines=True):
        """PROGRAM_LINES: show code inlined from the system's headers at the program's line
        that inlined it (see program_level); False: the innermost location, as it is."""
        self.program_lines = program_lines
        self.maps = Maps(maps_path)
        loads = maps_path[:-5] + ".loads" if maps_path.endswith(".maps") else None
        try:
            self.loads = Loads(loads) if loads and os.path.lexists(loads) else None
        except Refused as e:
            refuse(str(e))
            self.loads = None
        except OSError:
            self.loads = None
        if self.loads is not None and not self.loads.log:
            self.loads = None           # made empty with the trace id: nothing was unloaded
        self.trace_start = trace_start
        self.tool = tool
        self.cache = {}
        self.tool_error = None
        self._checked = {}

    def _usable(self, entry):
        key = (entry[4], entry[3])
        if key not in self._checked:
            self._checked[key] = _module_problem(entry[4], entry[3], self.trace_start)
        return self._checked[key]

    def _view(self, a):
        """The mappings to resolve A with: the whole maps file, or, for a frame with an epoch
        or in a range several objects used over the run, those of its epoch."""
        real, epoch = a & ADDR_MASK, a >> 48
        if epoch and self.loads:
            return self.loads.view(epoch), real
        hits = self.maps.find(real)
        if self.loads and len({(h[4], h[0] - h[2]) for h in hits}) > 1:
            return self.loads.view(self.loads.first_epoch(real)), real
        return self.maps, real

    def lookup(self, addrs):
        """Return {addr: Frame} for every address (unresolved ones with .error set)."""
        todo = [a for a in set(addrs) if a not in self.cache]
        good = collections.defaultdict(dict)        # view -> {addr: (module, offset)}
        for a in todo:
            view, real = self._view(a)
            hits = view.find(real)
            code = [h for h in hits if h[5].split(None, 2)[1:2] and "x" in h[5].split()[1]]
            if code and len(code) < len(hits):
                hits = code         # a return address is in code: not in a data mapping
            paths = {(h[4], h[0] - h[2]) for h in hits}
            if not hits:
                self.cache[a] = Frame(a, None, None, None, None, None, (), "not in any mapped file")
            elif len(paths) > 1:
                self.cache[a] = Frame(a, None, None, None, None, None, (),
                                      "address range used by several objects over the run "
                                      "(dlclose/dlopen): ambiguous")
            else:
                h = hits[0]
                why = self._usable(h)
                mod = os.path.basename(h[4])
                off = real - h[0] + h[2]
                if why:
                    self.cache[a] = Frame(a, mod, off, None, None, None, (), why)
                else:
                    good[id(view)][a] = (mod, off, view.load_of(h))
        for g in good.values():
            # one run of the tool per batch of loads where no file appears twice: each
            # load of a file loaded at two addresses is resolved at its own base
            batches = []            # [({path: load}, {addr: (module, offset)})]
            for a, (mod, off, load) in sorted(g.items()):
                path = load[0][4]
                b = next((b for b in batches if b[0].get(path, load) == load), None)
                if b is None:
                    b = ({}, {})
                    batches.append(b)
                b[0][path] = load
                b[1][a] = (mod, off)
            for loads, batch in batches:
                self._run_tool(batch, [e for l in loads.values() for e in l])
        return {a: self.cache[a] for a in addrs}

    def _run_tool(self, good, entries):
        """Resolve GOOD ({addr: (module, offset)}) with ENTRIES, the mappings of the loads
        the addresses are in (no file twice)."""
        exe = shutil.which(self.tool)
        if not exe:
            self.tool_error = "%s not found (install elfutils)" % self.tool
            for a, (mod, off) in good.items():
                self.cache[a] = Frame(a, mod, off, None, None, None, (), self.tool_error)
            return
        # A clean maps file for the tool: only the loads we trust, no ambiguous ranges.
        with tempfile.NamedTemporaryFile("w", prefix="mmleak-maps.", delete=False) as tf:
            for e in sorted(entries):
                tf.write(e[5])
            tmpmaps = tf.name
        try:
            order = sorted(good)
            inp = "".join("0x%x\n" % (a & ADDR_MASK) for a in order)
            try:
                r = subprocess.run([exe, "-M", tmpmaps, "-a", "-f", "-i", "-C"], input=inp,
                                   capture_output=True, text=True, errors="replace")
            except OSError as e:
                r = None
                self.tool_error = "%s failed: %s" % (self.tool, e)
            parsed = _parse_addr2line(r.stdout) if r is not None else {}
            for a in order:
                mod, off = good[a]
                chain = parsed.get(a & ADDR_MASK)
                if not chain:
                    err = self.tool_error or ("%s gave no answer: %s"
                                              % (self.tool, (r.stderr.strip().splitlines()
                                                             or ["?"])[-1]))
                    self.cache[a] = Frame(a, mod, off, None, None, None, (), err)
                    continue
                if self.program_lines:
                    chain = program_level(chain)
                fn, fl, ln = chain[0]
                err = None if fn or fl else "no symbol or line information in %s" % mod
                self.cache[a] = Frame(a, mod, off, fn, fl, ln, tuple(chain[1:]), err)
        finally:
            os.unlink(tmpmaps)


ADDR_LINE_RE = re.compile(r"^0x([0-9a-f]{16})$")


def _parse_addr2line(text):
    """eu-addr2line -a -f -i output -> {addr: [(function, file, line), ...]} innermost first."""
    res = {}
    cur = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = ADDR_LINE_RE.match(lines[i])
        if m:
            cur = res.setdefault(int(m.group(1), 16), [])
            i += 1
            continue
        if cur is None or i + 1 >= len(lines):
            i += 1
            continue
        fn = lines[i].split(" inlined at ", 1)[0].strip()
        loc = lines[i + 1].strip()
        fl, _, rest = loc.partition(":")
        ln = rest.split(":", 1)[0]
        cur.append((None if fn == "??" else fn,
                    None if fl in ("??", "") else fl,
                    int(ln) if ln.isdigit() and int(ln) > 0 else None))
        i += 2
    return res


def program_level(chain):
    """An inline chain (innermost first) without its innermost levels from the system's
    headers, when the program's own code inlined them: std::string's constructor inlined into
    the program's function is shown at the program's line."""
    for j, (fn, fl, ln) in enumerate(chain):
        if not (fl and fl.startswith(RUNTIME_SOURCES)):
            return chain[j:]
    return chain


def frame_label(fr):
    """'function at file:line' or 'module+0xoff (why)'."""
    if fr.function or fr.file:
        where = "%s:%s" % (fr.file, fr.line) if fr.file else "%s+0x%x" % (fr.module, fr.offset)
        return "%s at %s" % (fr.function or "??", where)
    if fr.module:
        return "%s+0x%x" % (fr.module, fr.offset)
    return "0x%x" % fr.addr


# ---------------------------------------------------------------------------------------
# Leak sites: survivors grouped by caller (shared by `report` and mmleak-panda.py)
# ---------------------------------------------------------------------------------------

Site = collections.namedtuple("Site", "caller stack bytes blocks min max oldest youngest")


# Functions that only pass an allocation through: with a trace depth > 1, a call site is the
# first frame outside these (so every caller of xmalloc is a site of its own).
DEFAULT_WRAPPERS = (
    "xmalloc", "xcalloc", "xrealloc", "xstrdup", "xstrndup", "xmemdup", "xzalloc",
    "xnmalloc", "xcharalloc", "xasprintf", "xvasprintf",
    "g_malloc", "g_malloc0", "g_malloc_n", "g_malloc0_n", "g_new", "g_new0", "g_realloc",
    "g_realloc_n", "g_try_malloc", "g_try_malloc0", "g_strdup", "g_strndup", "g_memdup",
    "g_memdup2", "g_slice_alloc", "g_slice_alloc0", "g_strdup_printf", "g_strconcat",
    "operator new", "operator new[]", "__gnu_cxx::new_allocator<*>::allocate",
    "std::__new_allocator<*>::allocate", "std::allocator<*>::allocate",
    "std::allocator_traits<*>::allocate",
    "strdup", "strndup", "__strdup", "__libc_strdup", "asprintf", "vasprintf",
    "Perl_safesysmalloc", "Perl_safesyscalloc", "Perl_safesysrealloc",
    "PyMem_RawMalloc", "PyMem_RawCalloc", "PyMem_RawRealloc", "_PyMem_RawMalloc",
    "_PyMem_RawCalloc", "_PyMem_RawRealloc", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc",
    "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc",
    "_PyObject_Calloc", "_PyObject_Realloc",
    "sqlite3Malloc", "sqlite3MallocZero", "sqlite3_malloc", "sqlite3_malloc64",
    "sqlite3Realloc", "sqlite3_realloc", "sqlite3_realloc64", "sqlite3DbMallocRaw",
    "sqlite3DbMallocZero", "sqlite3DbMallocRawNN", "sqlite3MemMalloc", "sqlite3MemRealloc",
    "OPENSSL_malloc", "OPENSSL_zalloc", "CRYPTO_malloc", "CRYPTO_zalloc", "CRYPTO_realloc",
    "xmlMalloc", "xmlMallocAtomic", "xmlRealloc", "xmlStrdup", "xmlStrndup",
)



def base_name(fn):
    """'ns::Foo<int>::bar(char const*) const' -> 'ns::Foo<*>::bar' (for wrapper matching)."""
    if not fn:
        return ""
    out, depth, i = [], 0, 0
    name = fn
    if name.startswith("operator new"):
        return "operator new[]" if name.startswith("operator new[]") else "operator new"
    # cut the argument list: the first '(' at template depth 0
    while i < len(name):
        c = name[i]
        if c == "<":
            if depth == 0:
                out.append("<*>")
            depth += 1
        elif c == ">":
            depth = max(depth - 1, 0)
        elif c == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(c)
        i += 1
    return "".join(out).strip()


class Wrappers:
    def __init__(self, extra=()):
        self.names = set(DEFAULT_WRAPPERS) | {w.strip() for w in extra if w.strip()}

    def __contains__(self, frame):
        if frame is None or not frame.function:
            return False
        return frame.function in self.names or base_name(frame.function) in self.names


# Objects of the C/C++ runtime: code in them allocates on the program's behalf (stdio
# buffers, std::string, getline, the loader's TLS blocks).  mmleak-sites.c has the same list.
# mmleak.so itself too: the retry of a failing operator new allocates in its new_failed.
RUNTIME_RE = re.compile(r"^(libc|libstdc\+\+|ld-linux[-\w]*|ld64|libm|libgcc_s|libpthread|libdl|"
                        r"librt|libresolv|libnss_\w+|libjemalloc|libtcmalloc\w*|libmimalloc|"
                        r"mmleak)[.-]")


# Code compiled into the program from the system's headers (std::string's and the containers'
# templates): the runtime's too, for the purpose of naming a call site.
RUNTIME_SOURCES = ("/usr/include/", "/usr/lib/gcc/", "/usr/local/include/")


def is_runtime(fr):
    """A frame inside the C/C++ runtime: in one of its objects, or in code instantiated from
    the system's headers."""
    if fr is None:
        return False
    return bool((fr.module and RUNTIME_RE.match(fr.module)) or
                (fr.file and fr.file.startswith(RUNTIME_SOURCES)))


def site_resolver(frames, wrappers=None):
    """A function stack -> (site address, index in the stack) that names a leak's call site.

    The site is the first frame outside the C/C++ runtime and outside the allocation
    WRAPPERS (with one frame, or none outside, the first frame), and callers that resolve to
    the same source line (one line can compile to several calls: an unrolled loop, a macro)
    are the same site: the lowest such address."""
    frames = frames or {}
    canon = {}
    for addr, fr in sorted(frames.items()):
        if fr.file and fr.line:
            canon.setdefault((fr.module, fr.function, fr.file, fr.line, fr.inlined), addr)

    def resolve(stack):
        i = 0
        for j, c in enumerate(stack):
            fr = frames.get(c)
            if not is_runtime(fr) and (wrappers is None or fr not in wrappers):
                i = j
                break
        fr = frames.get(stack[i])
        if fr is None or not (fr.file and fr.line):
            return stack[i], i
        return canon[(fr.module, fr.function, fr.file, fr.line, fr.inlined)], i
    return resolve


def leak_sites(survivors, end_time, depth=1, frames=None, wrappers=None):
    """Group survivors by call site (see site_resolver; with DEPTH > 1 and WRAPPERS, the
    first frame outside the wrappers); largest total first.

    oldest/youngest are ages in seconds at END_TIME (the last time seen in the dump)."""
    groups = {}
    resolve = site_resolver(frames, wrappers)
    for a in survivors:
        key = resolve(a.callers[:depth])[0]
        g = groups.get(key)
        age = max(end_time - a.time, 0)
        if g is None:
            groups[key] = [a.size, 1, a.size, a.size, age, age, a.callers[:depth]]
        else:
            g[0] += a.size
            g[1] += 1
            g[2] = min(g[2], a.size)
            g[3] = max(g[3], a.size)
            g[4] = max(g[4], age)
            g[5] = min(g[5], age)
    sites = [Site(k, v[6], *v[:6]) for k, v in groups.items()]
    sites.sort(key=lambda s: (-s.bytes, -s.blocks, s.caller))
    return sites


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------

def cmd_shrink(args):
    paths = args.files or ["-"]
    prog = progress_printer() if (args.progress or sys.stderr.isatty()) else None
    sh = shrink_files(paths, progress=prog, mixed=args.mixed)
    if prog and sh.events > 1000000:
        prog(sh, paths[-1], 0, done=True)
    if args.output:
        try:
            with new_output(args.output) as out:
                sh.write(out, final=args.final)
        except OSError as e:
            raise Fail("cannot write %s: %s" % (args.output, e.strerror or e))
    else:
        sh.write(sys.stdout.buffer, final=args.final)
        sys.stdout.buffer.flush()
    sh.problems.summary()
    if args.stats:
        surv = sh.survivors()
        warn("%d events (%d allocations, %d frees) in %d inputs; %d blocks (%s) survive, "
             "%d foreign frees" % (sh.events, sh.allocs, sh.frees, len(paths), len(surv),
                                   human_bytes(sum(a.size for a in surv)),
                                   len(sh.foreign_frees())))
    if sh.gap_text():
        warn(sh.gap_text())
    if sh.problems.fatal:
        return EXIT_INPUT
    return EXIT_PARTIAL if sh.problems.malformed or sh.gap_text() else EXIT_OK


def cmd_symbolize(args):
    try:
        addrs = [int(a, 16) for a in args.addrs]
    except ValueError:
        raise Fail("addresses must be hex (as in the dump): %s" % " ".join(args.addrs),
                   EXIT_USAGE)
    if not os.path.isfile(args.maps):
        raise Fail("%s: no such maps file" % args.maps)
    sym = Symbolizer(args.maps, trace_start=trace_start_for_maps(args.maps), program_lines=False)
    frames = sym.lookup(addrs)
    status = EXIT_OK
    for a in addrs:
        fr = frames[a]
        if fr.error and not fr.function:
            print("%012x  %s  (unresolved: %s)" % (a, frame_label(fr), fr.error))
            if sym.tool_error:
                status = EXIT_TOOL
            continue
        print("%012x  %s  [%s+0x%x]" % (a, frame_label(fr), fr.module, fr.offset))
        for fn, fl, ln in fr.inlined:
            print("%12s    inlined into %s at %s:%s" % ("", fn or "??", fl or "??", ln or "?"))
    return status


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


def process_owner(pid):
    """(uid, gid) process PID creates files as (its file-system ids), or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            ids = dict(line.split(":", 1) for line in f if line.startswith(("Uid:", "Gid:")))
        return int(ids["Uid"].split()[3]), int(ids["Gid"].split()[3])
    except (OSError, KeyError, IndexError, ValueError):
        return None


def cmd_run(args):
    cmd = args.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise Fail("run: no command given (mmleak.py run [-d DIR] -- CMD ARGS...)", EXIT_USAGE)
    lib = find_library(args.lib)
    if not lib:
        raise Fail("mmleak.so not found: run `make` in the source tree, `make install`, or "
                   "set MMLEAK_LIB", EXIT_INPUT)
    d = os.path.abspath(args.dir or os.environ.get("MMLEAK_DIR") or "/tmp")
    make_dump_dir(d)
    env = dict(os.environ)
    # mmleak.so first (an allocator preloaded before it would hide malloc from it), and one
    # copy only (a second one stays out of the way, but say which one traces)
    pre = [p for p in re.split(r"[ \t\n:]+", env.get("LD_PRELOAD", "")) if p]
    for p in pre:
        if p != lib and os.path.basename(p) == os.path.basename(lib):
            warn("LD_PRELOAD named another %s, %s: replaced by %s"
                 % (os.path.basename(lib), p, lib))
    env["LD_PRELOAD"] = " ".join([lib] + [p for p in pre
                                          if os.path.basename(p) != os.path.basename(lib)])
    env["MMLEAK_DIR"] = d
    if args.depth:
        env["MMLEAK_DEPTH"] = str(args.depth)
    if not args.keep_all:
        env.setdefault("MMLEAK_ROTATE_MB", str(COMPACT_ROTATE_MB))
    before = set(find_traces(d))
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise Fail("cannot run %s: %s" % (cmd[0], e.strerror))
    # The program gets the terminal's signals itself; we only wait for it, compacting its
    # traces (and its children's) in the background meanwhile.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    compactor = None
    if not args.keep_all:
        compactor = BackgroundCompactor(d, before)
        compactor.start()
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old)
        if compactor:
            compactor.finish()
    traces = find_traces(d)
    new = sorted(set(traces) - before, key=lambda t: [int(x) for x in t.split("-")])
    # the command's own process: its traces of this run, oldest first (a shell that exec'd
    # the program is the same process: its trace is PID, the program's PID-1); the newest
    # one with files is the process as it ended, the one its next: line reports
    images = [t for t in process_images(traces, str(proc.pid)) if t in new]
    done = [t for t in images if traces[t]]
    main = done[-1] if done else (images[-1] if images else (new[0] if new else None))
    how = ("exit status %d" % rc) if rc >= 0 else ("killed by signal %d" % -rc)
    if main is None:
        warn("%s ended (%s) and wrote no dump files in %s: was LD_PRELOAD cleared, or is "
             "the program static or setuid?" % (cmd[0], how, d))
        return rc if rc >= 0 else 128 - rc
    size = sum(os.path.getsize(p) for p in traces[main] if os.path.exists(p))
    before_exec = [t for t in images if t != main]
    others = [t for t in new if t != main and t not in images]
    comp = compact_path(d, main)
    if os.path.exists(comp):
        sys.stderr.write("%s: %s ended (%s); trace %s compacted in the background: %s (%s) "
                         "and %d more dump files in %s\n"
                         % (PROG, cmd[0], how, main, os.path.basename(comp),
                            human_bytes(os.path.getsize(comp)), len(traces[main]) - 1, d))
    else:
        sys.stderr.write("%s: %s ended (%s); trace %s: %d dump files, %s in %s\n"
                         % (PROG, cmd[0], how, main, len(traces[main]), human_bytes(size), d))
    if before_exec:
        sys.stderr.write("%s: before its last exec the same process was traced as: %s "
                         "(report one with --trace ID)\n" % (PROG, ", ".join(
                             "%s (%s)" % (t, _trace_head(traces[t])[1] or "no dump files")
                             for t in before_exec)))
    if others:
        sys.stderr.write("%s: child processes traced too: %s\n" % (PROG, " ".join(others)))
    what = "--pid %d" % proc.pid if main in images else "--trace %s" % main
    sys.stderr.write("%s: next: %s report %s %s\n" % (PROG, sys.argv[0], d, what))
    return rc if rc >= 0 else 128 - rc


class BackgroundCompactor:
    """`run`'s compaction thread: a pass every second (from the start of one to the start of
    the next) over the traces that were not in the directory before the run, and a last one
    when the program has ended."""

    def __init__(self, directory, before, interval=1.0):
        import threading
        self.directory, self.before, self.interval = directory, set(before), interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.error = None

    def start(self):
        self.thread.start()

    def _pass(self):
        for tid in sorted(set(find_traces(self.directory)) - self.before):
            compact_dir(self.directory, tid, verbose=False)

    def _loop(self):
        try:
            began = time.monotonic()
            # a pass every INTERVAL from the start of the last: after a long one (a big
            # backlog, a point of the series) the next starts at once
            while not self.stop.wait(max(began + self.interval - time.monotonic(), 0)):
                began = time.monotonic()
                self._pass()
        except (Fail, OSError) as e:
            self.error = e

    def finish(self):
        self.stop.set()
        self.thread.join()
        try:
            self._pass()
        except (Fail, OSError) as e:
            self.error = self.error or e
        if self.error:
            warn("background compaction stopped: %s (the files left are complete; run "
                 "`mmleak.py compact %s`)" % (self.error, self.directory))


def _recover_one(p, tail):
    """Append to the dump file P the complete lines its staging file TAIL has not flushed,
    and delete TAIL: the bytes appended.  Bounded memory; Refused, OSError pass."""
    with open_trace_file(tail) as t:
        have, ended = _out_end(p)
        segments = [] if ended else _tail_segments(t.fileno(), have)
        keep = size = 0                 # complete lines only: up to the last newline
        for chunk in _segment_chunks(t.fileno(), segments):
            i = chunk.rfind(b"\n")
            keep = size + i + 1 if i >= 0 else keep
            size += len(chunk)
        if keep < size:
            torn, at = b"", 0
            for chunk in _segment_chunks(t.fileno(), segments):
                torn += chunk[max(keep - at, 0):][:60 - len(torn)] if at + len(chunk) > keep \
                    else b""
                at += len(chunk)
            warn("%s: torn last line dropped: %r" % (tail, torn[:60]))
        fd = _open_checked(p, os.O_WRONLY | os.O_APPEND, uids_for(p))
        with os.fdopen(fd, "wb") as f:
            # a second name (a hard link planted at P) may be another file of the owner's:
            # never appended to
            nlink = os.fstat(fd).st_nlink
            if nlink != 1:
                raise OSError(0, "it has %d names (hard links): left alone" % nlink)
            left = keep
            for chunk in _segment_chunks(t.fileno(), segments):
                f.write(chunk[:left])
                left -= min(left, len(chunk))
    remove_trace_file(tail)
    return keep


def cmd_recover(args):
    """Fold the staging files of dead processes back into their dump files."""
    paths = []
    status = EXIT_OK
    for a in args.paths:
        if os.path.isdir(a):
            for files in find_traces(a).values():
                paths.extend(files)
        elif os.path.exists(a):
            paths.append(a)
        else:
            warn("%s: No such file or directory" % a)
            status = EXIT_INPUT
    done = 0
    for p in paths:
        tail = p[:-4] + ".tail" if p.endswith(".out") else None
        if not tail or not os.path.lexists(tail):
            continue
        m = DUMP_RE.match(os.path.basename(p))
        pid = int(m.group(1).split("-")[0]) if m else None
        if pid and not args.force:
            try:
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
            keep = _recover_one(p, tail)
        except Refused as e:
            refuse(str(e))
            continue
        except OSError as e:
            warn("%s: cannot recover: %s%s" % (p, (e.filename + ": ") if e.filename else "",
                                                e.strerror or e))
            status = EXIT_INPUT
            continue
        done += 1
        sys.stdout.write("%s: %d bytes recovered from %s\n" % (p, keep, os.path.basename(tail)))
    if not done:
        sys.stdout.write("nothing to recover\n")
    return status


# ---------------------------------------------------------------------------------------
# Compaction (README.rst, "Tracing for days: compaction"): disk use bounded by the live set
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

COMPACT_RE = re.compile(r"^mmleak\.(\d+(?:-\d+)?)\.compact$")
SERIES_POINTS = 720          # passes kept in mmleak.ID.series (older ones thinned out)
SERIES_SITES = 40            # call sites per pass in the series (the rest summed)
SERIES_INTERVAL = 10.0       # seconds between two points of the series (each reads the live set)
COMPACT_ROTATE_MB = 8        # MMLEAK_ROTATE_MB under `run` and the installer's service


def compact_path(directory, tid):
    return os.path.join(directory, "mmleak.%s.compact" % tid)


class TraceLock:
    """flock on mmleak.ID.lock: exclusive for a compaction pass, shared for a reader.

    The first compactor makes the file; as root, it gives it to the owner of the trace's
    files, so that a reader or a compactor running as the traced service's user can open it
    too.  A reader never makes it (it leaves no file behind): with no lock file, no
    compactor ever ran, and a reader that a first pass overtakes finds a file gone and reads
    again (read_trace), under the lock that pass made."""

    def __init__(self, directory, tid, shared=False, wait=True):
        self.directory, self.tid = directory, tid
        self.path = os.path.join(directory, "mmleak.%s.lock" % tid)
        self.shared, self.wait, self.fd = shared, wait, None
        self.held = False           # whether the lock was taken (it stays True after exit)

    def _open(self):
        """A descriptor of the lock file, or None (no lock to take: none made yet, or it
        cannot be made or opened).  A lock file that is not a regular file of the trace's
        owner or root is refused (Refused): another user could hold it, or make a reader
        wait on a FIFO for ever."""
        uids = trusted_uids(self.directory, self.tid)
        for mode in ((os.O_RDONLY,) if self.shared else (os.O_RDWR, os.O_RDONLY)):
            try:
                return _open_checked(self.path, mode, uids)
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
        owner = trace_owner(self.directory, self.tid)
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
        op = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | (0 if self.wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(self.fd, op)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            raise
        self.held = True
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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


def _maps_a_staging_file(pid, directory, tid):
    """Does process PID have a staging file (mmleak.TID.N.tail) of DIRECTORY mapped?  Only
    the process writing trace TID does."""
    want = os.path.join(os.path.realpath(directory), "mmleak.%s." % tid).encode()
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            for line in f:
                i = line.find(b" /")
                if i >= 0 and line[i + 1:].startswith(want) and \
                        line.rstrip(b"\n").removesuffix(b" (deleted)").endswith(b".tail"):
                    return True
    except OSError:
        pass
    return False


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
    want = {}
    for t in tails:
        try:
            st = os.lstat(t)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            want[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = os.path.basename(t)
    if not want:
        return False
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        pids = []
    first = [_MAPPER[k] for k in want if k in _MAPPER]
    return any(_maps_any(pid, want) for pid in first + pids)


def trace_alive(directory, tid, traces=None, start=None, tails=()):
    """Is trace TID still being written?  Its process must exist, be the same process (not a
    reused pid: it started before the trace, or it has one of the trace's staging files
    mapped, should the wall clock have been set forward since the trace began), and not
    have been replaced by exec (a newer trace of the same pid in DIRECTORY).  A process
    that exists but cannot be looked at counts as alive.  And whatever its pid says, a
    trace whose staging files (TAILS) a process maps is alive (_staging_mapped)."""
    pid = int(tid.split("-")[0])
    began = _process_start_time(pid)
    over = began is None
    if not over and began is not PROCESS_HIDDEN and start is not None and \
            began > start + 2 and not _maps_a_staging_file(pid, directory, tid):
        over = True                     # the pid was reused
    if not over:
        traces = traces if traces is not None else find_traces(directory)
        k = int(tid.split("-")[1]) if "-" in tid else 0
        over = any(o.split("-")[0] == str(pid) and (int(o.split("-")[1]) if "-" in o else 0) > k
                   for o in traces)     # exec'd: this image's trace is over
    return not over or bool(tails) and _staging_mapped(tails)


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


def _trace_start(paths):
    for p in paths:
        h = _first_header(p)
        if h and h.get("start", "").isdigit():
            return int(h["start"])
    return None


def complete_files(directory, tid, files, traces=None):
    """The dump files of TID that can be folded now, whether the trace is over, and the
    staging files it has (a trace over with some: its process did not close its files)."""
    outs = [p for p in files if p.endswith(".out")]
    tails = [p[:-4] + ".tail" for p in outs if os.path.lexists(p[:-4] + ".tail")]
    alive = trace_alive(directory, tid, traces, _trace_start(outs), tails)
    if not alive:
        return outs, True, tails
    return [p for p in outs if p[:-4] + ".tail" not in tails and _ends_with_end(p)], False, \
        tails


def _fsync_dir(directory):
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


STACK_REF_RE = re.compile(rb"@([0-9a-f]{1,16})\n")         # an allocation's stack


def _compact_header_lines(sh, folded):
    """The '#' lines of a compacted result (SH from shrink_raw): one '#mmleak' header (the
    trace's first), the command, the allocator, the gaps, the counts, and the names of the
    inputs of this pass."""
    out, seen_hdr = [], False
    for line in sh.header_lines:
        if line.startswith(b"#mmleak "):
            if seen_hdr:
                continue
            seen_hdr = True
            out.append(re.sub(rb" (tid|file)=\S+", b"", line))
        elif line.startswith((b"#thread ", b"#end", b"#folded ", b"#compacted ", b"#at ")):
            continue
        else:
            out.append(line)
    entries, entry_allocs = sh.result_lines
    h = sh.history()
    files = sh.compacted["files"] + len(folded)
    allocs = b"" if h["allocs"] is None else b" allocs=%d entry_allocs=%d" % (h["allocs"],
                                                                             entry_allocs)
    out.append(b"#clock %d\n" % sh.max_time)
    out.append(b"#compacted files=%d events=%d entries=%d%s at=%d\n"
               % (files, h["events"], entries, allocs, int(time.time())))
    for p in folded:
        out.append(b"#folded %s\n" % os.path.basename(p).encode())
    return out


def _replace(path, fill, sync=False):
    """Write PATH whole, by a temporary file (create_trace_file) that FILL(file) fills and
    that is renamed over PATH; SYNC: flushed to disk first, and the directory after.  A
    failure (a full disk) removes the temporary file and is one line naming it (Fail)."""
    tmp = path + ".tmp"
    try:
        with create_trace_file(tmp) as f:
            fill(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.rename(tmp, path)
    except OSError as e:
        try:
            _remove_quietly(tmp)
        except OSError:
            pass
        m = TRACE_FILE_RE.match(os.path.basename(path))
        raise Fail("%scannot write %s: %s" % ("trace %s: " % m.group(1) if m else "", tmp,
                                               e.strerror or e))
    if sync:
        _fsync_dir(os.path.dirname(path) or ".")


def _write_atomic(path, header_lines, sh, data):
    """The result: its header lines, the stacks its allocations use, its event lines DATA;
    written to PATH.tmp, flushed to disk, renamed over PATH."""
    def fill(f):
        for h in header_lines:
            f.write(h)
        for i in sorted({int(x, 16) for x in STACK_REF_RE.findall(data)}):
            if i in sh.stack_lines:
                f.write(sh.stack_lines[i])
        f.write(data)
    _replace(path, fill, sync=True)


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
    own; see _trusted_result)."""
    names = []
    try:
        for line in read_lines(path):
            if not line.startswith(b"#") or line.startswith(b"#s "):
                break
            if line.startswith(b"#folded "):
                name = line[8:].rstrip(b"\n").decode("utf-8", "replace")
                m = DUMP_RE.match(name)
                if m and m.group(1) == tid:
                    names.append(name)
    except OSError:
        pass
    return names


def _site_key(a):
    return a.callers if len(a.callers) > 1 else a.callers[0]


def compact_trace(directory, tid, files=None, traces=None, series=True):
    """One compaction pass over trace TID, and a point of its series when one is due
    (SERIES: False never).  Returns a dict of what it did, or None when another compactor
    holds the trace (it is skipped, not waited for).  A file it cannot trust (Refused) or
    write stops the pass over this trace (Fail), and nothing is deleted."""
    traces = traces if traces is not None else find_traces(directory)
    files = files if files is not None else traces.get(tid, [])
    cpath = compact_path(directory, tid)
    try:
        lock = TraceLock(directory, tid, wait=False).__enter__()
    except BlockingIOError:
        return None
    try:
        if _own_file(cpath):
            for name in _previously_folded(cpath, tid):
                _remove_dump(os.path.join(directory, name))   # its .out, and its .tail
        spath = series_path(directory, tid)
        for tmp in (cpath, spath, spath + ".live"):     # left by a pass that was stopped
            _remove_quietly(tmp + ".tmp")
        files = [p for p in files if os.path.lexists(p)]
        done, over, tails = complete_files(directory, tid, files, traces)
        res = {"trace": tid, "folded": 0, "over": over, "events": 0, "bytes": 0,
               "point": None, "unclosed": len(tails) if over else 0}
        if done:
            res.update(_fold(directory, tid, cpath, done))
        # a trace that is over gets its last point (unless it has it: the .live is gone)
        if series and files and (over and (done or os.path.lexists(spath + ".live") or
                                           not os.path.lexists(spath))
                                 or not over and _series_due(directory, tid)):
            res["point"] = _series_point(directory, tid, final=over)
        return res
    finally:
        lock.__exit__()


def _size(path):
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _fold(directory, tid, cpath, done):
    """Fold the complete files DONE into CPATH (under the trace's exclusive lock)."""
    own = _own_file(cpath)
    before = _size(cpath) if own else 0
    inputs = ([cpath] if own else []) + done
    nbytes = sum(_size(p) + _size(p[:-4] + ".tail") for p in done)
    sh, data = shrink_raw(inputs)
    if sh.problems.fatal:
        raise Fail("%s: cannot compact trace %s: an input could not be read" % (directory, tid))
    _write_atomic(cpath, _compact_header_lines(sh, done), sh, data)
    for p in done:
        _remove_dump(p)
    return {"folded": len(done), "events": sh.events - sh.compacted["entries"],
            "bytes": nbytes, "before": before, "after": _size(cpath),
            "malformed": sh.problems.malformed}


def _remove_dump(p):
    """Delete the dump file P and its staging file: only what is the trace's (a file of
    somebody else's at either name is left alone)."""
    for q in (p, p[:-4] + ".tail"):
        remove_trace_file(q)


# ---- the time series of live blocks per call site (mmleak.ID.series) ------------------
#
#   #series 1 id=ID
#   #s ID FRAME...                     stacks the keys below use
#   p UNIX TIME BYTES BLOCKS NEWB NEWN FREEDB FREEDN     one point: the live set
#   k KEY BYTES BLOCKS NEWB NEWN FREEDB FREEDN           ... per call site (top SERIES_SITES)
#
# TIME is the trace's clock (seconds since start, the newest event seen); KEY is the caller
# (hex) or @STACK.  NEW are the blocks alive now that were not alive at the previous point,
# FREED those alive then and not now (so BYTES = previous BYTES + NEWB - FREEDB, exactly).
# Past SERIES_POINTS points every other old point is merged into the next one (NEW and
# FREED summed), so the file stays small however long the trace runs.
#
# The blocks of the last point (address, number, size, call site) are in mmleak.ID.series.live,
# which starts with that point's own lines ("#point ..."): it is written first (temporary
# file, rename), then the series (the same way), so a compactor killed in between leaves a
# .live whose point the series lacks, and the next pass appends it before its own.  When the
# trace is over, its last point is taken and the .live deleted: the series is complete.

SeriesPoint = collections.namedtuple("SeriesPoint", "unix time live new freed sites")


def series_path(directory, tid):
    return os.path.join(directory, "mmleak.%s.series" % tid)


def _key_text(callers, stack_lines, sh, by_frames):
    if len(callers) == 1:
        return b"%x" % callers[0]
    sid = by_frames.get(callers)
    if sid is not None and sid in sh.stack_lines:
        stack_lines[sid] = sh.stack_lines[sid]
        return b"@%x" % sid
    # a stack no longer in the trace's result (its blocks were freed since the last pass):
    # defined here under an id of its own
    import hashlib
    sid = int.from_bytes(hashlib.blake2b(repr(callers).encode(), digest_size=8).digest(),
                         "little")
    stack_lines[sid] = b"#s %016x %s\n" % (sid, b" ".join(b"%x" % c for c in callers))
    return b"@%x" % sid


SERIES_P_RE = re.compile(rb"p(?: [0-9]{1,20}){8}\n?")
SERIES_K_RE = re.compile(rb"k (?:other|@[0-9a-f]{1,16}|[0-9a-f]{1,16})(?: [0-9]{1,20}){6}\n?")


def series_line_ok(line):
    """Is LINE of a .series file one its readers can take (a damaged file must not stop the
    report or the compactor)?  A line without its newline is not whole (it was cut)."""
    if not line.endswith(b"\n"):
        return False
    if line.startswith(b"p "):
        return SERIES_P_RE.fullmatch(line) is not None
    if line.startswith(b"k "):
        return SERIES_K_RE.fullmatch(line) is not None
    if line.startswith(b"#s "):
        return parse_stack(line) is not None
    return True


def _series_lines(path, problems=None):
    """The series file's lines: (head '#' lines other than stacks, {stack id: '#s' line},
    [[p line, [k lines]]]).  Lines that are not in the format (a damaged file; or a torn
    line, left by a compactor of an older mmleak.py killed while it appended: the series is
    now written whole, by rename) are left out, and reported to PROBLEMS if given."""
    head, stacks, points = [], {}, []
    if not _own_file(path):
        return head, stacks, points
    try:
        f = open_trace_file(path)
    except OSError:
        return head, stacks, points
    with f:
        for lineno, line in enumerate(dump_lines(f), 1):
            if not series_line_ok(line):
                if problems is not None:
                    problems.add(path, lineno, "malformed",
                                 "malformed series line skipped: %r" % line[:80])
                continue
            if line.startswith(b"#s "):
                stacks[parse_stack(line)[0]] = line
            elif line.startswith(b"#"):
                head.append(line)
            elif line.startswith(b"p "):
                points.append([line, []])
            elif line.startswith(b"k ") and points:
                points[-1][1].append(line)
    return head, stacks, points


def read_series(path, problems=None):
    """(points, stacks): points oldest first, each with .sites {key: (bytes, blocks, newb,
    newn, freedb, freedn)}; KEY is a tuple of callers (or "other").  Lines that are not in
    the format are skipped (reported to PROBLEMS, if given)."""
    _, stack_lines, raw = _series_lines(path, problems)
    stacks = {sid: parse_stack(line)[1] for sid, line in stack_lines.items()}
    return [_series_point_of(p, ks, stacks) for p, ks in raw], stacks


def _series_point_of(p, ks, stacks):
    v = [int(x) for x in p.split()[1:]]
    out = {}
    for line in ks:
        parts = line.split()
        k = parts[1]
        vals = tuple(int(x) for x in parts[2:8])
        if k == b"other":
            key = "other"
        elif k.startswith(b"@"):
            key = stacks.get(int(k[1:], 16), NO_STACK)
        else:
            key = (int(k, 16),)
        out[key] = vals
    return SeriesPoint(v[0], v[1], (v[2], v[3]), (v[4], v[5]), (v[6], v[7]), out)


def series_pass(directory, tid):
    """Add one point to the trace's series now (the live set: the compacted result and the
    files still being written), under the trace's exclusive lock (waited for).  Returns the
    point."""
    with TraceLock(directory, tid):
        return _series_point(directory, tid)


SURVIVOR_RE = re.compile(rb"^([0-9a-f]+ [0-9a-f]+) ([0-9a-f]+) [0-9a-f]+ ([^\n]+)$", re.M)


def _series_point(directory, tid, final=False):
    """Add one point to the series; the caller holds the trace's exclusive lock.  FINAL: the
    trace is over: its last point, after which the .live is deleted.  Returns the point.

    It reads the live set (every allocation line of the trace's shrink: its address and
    number, size and call site, as bytes: no per-block parsing beyond the size) and the
    previous point's from .live, and compares the two as sets."""
    spath = series_path(directory, tid)
    lpath = spath + ".live"
    head, have_stacks, points = _series_lines(spath)
    prev, pending = _load_live(lpath)
    if pending is not None and (not points or points[-1][0] != pending[0][0]):
        # the last pass was stopped between writing .live and the series: its point first
        points.append(pending[0])
        have_stacks.update(pending[1])
        if pending[2]:                  # it was the last point
            _write_series(spath, tid, head, have_stacks, points)
    elif pending is None and points:
        prev = None                     # .live lost: this point starts again (see below)
    if pending is not None and pending[2]:
        _remove_quietly(lpath)          # the last point is in the series: it is complete
        return None
    live_stacks = pending[1] if pending is not None else {}
    sh, data = shrink_raw(find_traces(directory).get(tid, []))
    # the call site of each distinct key as the series writes it: a caller in hex, or @ID
    # (stacks the trace defines keep their id; a list of callers gets one of its own)
    norm, stack_lines = {}, {}
    by_frames = None
    now = {}
    for ident, size, raw in SURVIVOR_RE.findall(data):
        k = norm.get(raw)
        if k is None:
            if raw.startswith(b"@"):
                sid = int(raw[1:], 16)
                k = b"@%x" % sid
                if sid in sh.stack_lines:
                    stack_lines[sid] = sh.stack_lines[sid]
            elif b" " not in raw:
                k = b"%x" % int(raw, 16)
            else:
                if by_frames is None:
                    by_frames = {fr: sid for sid, fr in sh.stacks.items()}
                k = _key_text(tuple(int(x, 16) for x in raw.split()), stack_lines, sh,
                              by_frames)
            norm[raw] = k
        now[ident] = (k, int(size, 16))
    sites = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for k, size in now.values():
        v = sites[k]
        v[0] += size
        v[1] += 1
    other_freed = [0, 0]
    if prev is not None:
        keys_now = set(norm.values())
        for ident in now.keys() - prev.keys():
            k, size = now[ident]
            v = sites[k]
            v[2] += size
            v[3] += 1
        for ident in prev.keys() - now.keys():
            k, size = prev[ident]
            v = sites[k]
            v[4] += size
            v[5] += 1
            if k not in keys_now and k.startswith(b"@"):
                sid = int(k[1:], 16)    # a stack whose blocks are all gone: its line
                if sid in live_stacks:
                    stack_lines.setdefault(sid, live_stacks[sid])
    elif points:
        # no record of the previous point's blocks: everything alive counts as new, and the
        # previous point's sites as freed, so BYTES = previous + NEW - FREED still holds
        for v in sites.values():
            v[2], v[3] = v[0], v[1]
        for line in points[-1][1]:
            f = line.split()
            if f[1] == b"other":
                other_freed = [int(f[2]), int(f[3])]
                continue
            v = sites[f[1]]
            v[4] += int(f[2])
            v[5] += int(f[3])
    tot = [sum(v[i] for v in sites.values()) for i in range(6)]
    tot[4] += other_freed[0]
    tot[5] += other_freed[1]
    ranked = sorted(sites.items(), key=lambda kv: (-kv[1][0], -kv[1][4], kv[0]))
    top, rest = ranked[:SERIES_SITES], ranked[SERIES_SITES:]
    plines = [b"p %d %d %d %d %d %d %d %d\n" % ((int(time.time()), sh.max_time) + tuple(tot)),
              [b"k %s %d %d %d %d %d %d\n" % ((k,) + tuple(v)) for k, v in top]]
    if rest or other_freed[1]:
        other = [sum(v[i] for _, v in rest) for i in range(6)]
        other[4] += other_freed[0]
        other[5] += other_freed[1]
        plines[1].append(b"k other %d %d %d %d %d %d\n" % tuple(other))
    _save_live(lpath, {} if final else now, plines, stack_lines, final)
    points.append(plines)
    have_stacks.update(stack_lines)
    if len(points) > SERIES_POINTS:
        points = _thin(points)
    _write_series(spath, tid, head, have_stacks, points)
    if final:
        _remove_quietly(lpath)
    stacks = {sid: parse_stack(line)[1] for sid, line in have_stacks.items()}
    return _series_point_of(plines[0], plines[1], stacks)


def _save_live(path, now, plines, stack_lines, final=False):
    """The blocks of this point ({b"PTR SEQ": (site key, size)}), for the next one to tell
    which were freed and where from, after the point's own lines ("#point", "#final" for
    the trace's last) and the stacks of their sites."""
    def fill(f):
        if final:
            f.write(b"#final\n")
        f.write(b"".join(b"#point " + line for line in [plines[0]] + plines[1]))
        f.write(b"".join(b"#point " + line for line in stack_lines.values()))
        f.write(b"".join(b"%s %x %s\n" % (ident, size, k) for ident, (k, size) in now.items()))
    _replace(path, fill)


def _load_live(path):
    """({b"PTR SEQ": (site key, size)}, the point it belongs to as ([p line, [k lines]],
    {stack id: line}, whether it was the trace's last)), or (None, None) without a usable
    file."""
    out, plines, stacks, final = {}, None, {}, False
    if not _own_file(path):
        return None, None
    try:
        for line in read_lines(path):
            if line.startswith(b"#"):
                if line == b"#final\n":
                    final = True
                elif line.startswith(b"#point "):
                    rest = line[7:]
                    if rest.startswith(b"p "):
                        plines = [rest, []]
                    elif rest.startswith(b"k ") and plines:
                        plines[1].append(rest)
                    elif rest.startswith(b"#s "):
                        st = parse_stack(rest)
                        if st:
                            stacks[st[0]] = rest
                continue
            ptr, seq, size, k = line.split()
            out[ptr + b" " + seq] = (k, int(size, 16))
    except (OSError, ValueError):
        return None, None
    if plines is None:
        return None, None
    return out, (plines, stacks, final)


def _thin(points):
    """Merge every other point of the older half into its successor (NEW and FREED
    summed)."""
    half = len(points) // 2
    out = []
    i = 0
    while i < len(points):
        if i < half and i + 1 < len(points):
            a, b = points[i], points[i + 1]
            pa, pb = a[0].split(), b[0].split()
            merged_p = pb[:5] + [b"%d" % (int(pa[j]) + int(pb[j])) for j in range(5, 9)]
            ka = {l.split()[1]: l.split() for l in a[1]}
            kl = []
            for l in b[1]:
                v = l.split()
                if v[1] in ka:
                    w = ka[v[1]]
                    v = v[:4] + [b"%d" % (int(w[j]) + int(v[j])) for j in range(4, 8)]
                kl.append(b" ".join(v) + b"\n")
            out.append([b" ".join(merged_p) + b"\n", kl])
            i += 2
        else:
            out.append(points[i])
            i += 1
    return out


def _write_series(spath, tid, head, stack_lines, points):
    """The series, whole, by temporary file and rename: a reader or a killed writer never
    sees half of it.  Only the stacks its points still use."""
    used = {int(l.split()[1][1:], 16) for _, ks in points for l in ks
            if l.split()[1].startswith(b"@")}
    _replace(spath, lambda f: f.write(
        (b"".join(head) if head else b"#series 1 id=%s\n" % tid.encode()) +
        b"".join(stack_lines[i] for i in sorted(used) if i in stack_lines) +
        b"".join(p + b"".join(ks) for p, ks in points)))


def _series_due(directory, tid):
    """A point of the series costs a walk of the live set: one every SERIES_INTERVAL."""
    try:
        return time.time() - os.path.getmtime(series_path(directory, tid)) >= SERIES_INTERVAL
    except OSError:
        return True


def compact_dir(directory, pid=None, series=True, verbose=False, out=None):
    """One compaction pass over every trace in DIRECTORY (or trace PID).  Returns
    (live traces, results)."""
    out = out or sys.stdout
    traces = find_traces(directory)
    live, results = [], []
    for tid in sorted(traces, key=lambda t: [int(x) for x in t.split("-")]):
        if pid is not None and tid != pid:
            continue
        try:
            res = compact_trace(directory, tid, traces[tid], traces, series=series)
        except Fail as e:               # this trace is left as it is; the others go on
            refuse(str(e))
            continue
        except OSError as e:
            refuse("trace %s: %s%s" % (tid, (e.filename + ": ") if e.filename else "",
                                       e.strerror or e))
            continue
        if res is None:
            live.append(tid)                    # another compactor holds it: alive enough
            continue
        results.append(res)
        if not res["over"]:
            live.append(tid)
        if res["folded"] and verbose:
            out.write("%s: trace %s: folded %d files (%s, %d events) into %s (%s)%s\n"
                      % (PROG, tid, res["folded"], human_bytes(res["bytes"]), res["events"],
                         os.path.basename(compact_path(directory, tid)),
                         human_bytes(res["after"]), "; the trace is over" if res["over"] else ""))
            if res["unclosed"]:
                out.write("%s: trace %s: its process ended without closing %d files (no process "
                          "this compactor can see maps their staging files)\n"
                          % (PROG, tid, res["unclosed"]))
            out.flush()
    return live, results


def cmd_compact(args):
    global SERIES_INTERVAL
    SERIES_INTERVAL = args.series_interval
    d = args.dir
    if not os.path.isdir(d):
        raise Fail("%s: not a directory" % d)
    stop = []
    if args.follow:
        def on_term(signum, frame):
            stop.append(signum)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
    status = EXIT_OK
    seen_live, idle_since = False, time.monotonic()
    while True:
        began = time.monotonic()
        live, results = compact_dir(d, args.pid, series=not args.no_series,
                                    verbose=args.verbose or not args.follow)
        if any(r.get("malformed") for r in results):
            status = EXIT_PARTIAL
        if not args.follow or stop:
            break
        now = time.monotonic()
        if live:
            seen_live, idle_since = True, now
        elif not args.forever and now - idle_since >= args.linger:
            compact_dir(d, args.pid, series=not args.no_series, verbose=args.verbose)
            break
        deadline = began + args.interval    # from the start of this pass: see BackgroundCompactor
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
    if stop:        # stopped with its service: one last pass for what just ended
        compact_dir(d, args.pid, series=not args.no_series, verbose=args.verbose)
    return status


def read_trace(directory, tid, progress=None):
    """Shrink every file of trace TID as it is now, under the trace's lock (shared: no
    compaction pass deletes a file while we read).  Returns (Shrinker, the files read)."""
    with TraceLock(directory, tid, shared=True) as lock:
        if lock.held:
            paths = find_traces(directory).get(tid, [])
            return shrink_files(paths, progress=progress), paths
        # No lock file: no compactor has run yet.  Should a first pass start now, it may
        # delete a file under us: then read again, under its lock; the messages of this
        # attempt are shown only if it stands.
        real, sys.stderr = sys.stderr, io.StringIO()
        refused = set(REFUSALS)
        try:
            paths = find_traces(directory).get(tid, [])
            sh = shrink_files(paths, progress=progress)
        finally:
            said, sys.stderr = sys.stderr.getvalue(), real
    if not (sh.problems.fatal or any(k == "duplicate" for _, k in sh.problems.counts)):
        sys.stderr.write(said)
        return sh, paths
    REFUSALS.intersection_update(refused)   # not said: said again by the next attempt
    with TraceLock(directory, tid, shared=True):
        paths = find_traces(directory).get(tid, [])
        return shrink_files(paths, progress=progress), paths


def cmd_snapshot(args):
    """The live set of a trace now, in the dump format (an earlier moment for --baseline)."""
    tid, _ = choose_trace(args.dir, args.pid, args.trace)
    sh, _ = read_trace(args.dir, tid)
    sh.problems.summary()
    if sh.problems.fatal:
        raise Fail("trace %s: a file could not be read: no snapshot written" % tid)
    if args.output:
        try:
            with new_output(args.output) as out:
                sh.write(out, final=False)
        except OSError as e:
            raise Fail("cannot write %s: %s" % (args.output, e.strerror))
    else:
        sh.write(sys.stdout.buffer, final=False)
        sys.stdout.buffer.flush()
    warn("trace %s: %d blocks alive (%s)" % (tid, len(sh.survivors()),
                                             human_bytes(sum(a.size for a in sh.survivors()))))
    if sh.gap_text():
        warn(sh.gap_text())
    return EXIT_PARTIAL if sh.problems.malformed or sh.gap_text() else EXIT_OK


# ---------------------------------------------------------------------------------------
# Attach and detach (README.rst, "Attaching to a running process")
# ---------------------------------------------------------------------------------------
#
# mmleak-inject.c (built into mmleak.so, loaded here with ctypes like the shrinker) makes the
# process load mmleak.so and call mmleak_attach / mmleak_detach in it (mmleak.c, section 5).

TIMEOUT_HELP = ("the whole command's time limit (default 10): it returns within SECONDS "
                "of its start whatever it waits for.  At most three quarters of the time left "
                "go to waiting for a moment when a thread of the process is safe to borrow "
                "(none found: refused, exit status 2, the process left as it was); the calls "
                "in the process get the rest, and one still running at the limit is abandoned "
                "(exit status 2: the process may then hold a lock the call took).  Only a "
                "thread in uninterruptible sleep that does not stop when asked can hold the "
                "command up to 5 s longer")

INJECT_ERRORS = {-1: EXIT_USAGE, -2: EXIT_INPUT, -3: EXIT_INPUT, -4: EXIT_INPUT,
                 -5: EXIT_INPUT, -6: EXIT_INPUT, -7: EXIT_INPUT, -8: EXIT_TOOL}


def _inject(pid, lib, func, arg, timeout_ms, total_ms=0):
    """Call FUNC(ARG) in process PID after it loaded LIB: (code, result, error text).  The
    search for a safe moment takes at most TIMEOUT_MS; with TOTAL_MS, all is over by then
    (the calls get what is left), else the calls get TIMEOUT_MS of their own."""
    import ctypes
    here = find_library()
    if not here:
        raise Fail("mmleak.so not found (run `make`, or set MMLEAK_LIB)", EXIT_INPUT)
    dll = ctypes.CDLL(here)
    if dll.mmleak_inject_abi() != 1:
        raise Fail("%s: injector interface version differs" % here, EXIT_TOOL)
    args = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
            ctypes.POINTER(ctypes.c_long), ctypes.c_char_p, ctypes.c_size_t]
    limits = (timeout_ms,)
    if total_ms:
        fn = dll.mmleak_inject_call_within
        args.insert(5, ctypes.c_int)
        limits = (timeout_ms, total_ms)
    else:
        fn = dll.mmleak_inject_call
    fn.argtypes = args
    fn.restype = ctypes.c_int
    res = ctypes.c_long(0)
    err = ctypes.create_string_buffer(1024)
    rc = fn(pid, os.fsencode(lib), func.encode(), arg.encode() if arg is not None else None,
            *limits, ctypes.byref(res), err, len(err))
    return rc, ctypes.c_int(res.value & 0xffffffff).value, err.value.decode("utf-8", "replace")


def mmleak_in(pid):
    """The mmleak.so mapped into process PID (its path), or None."""
    try:
        with open("/proc/%d/maps" % pid) as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[5:] or [""]
                if os.path.basename(path[0]) == LIBNAME:
                    return path[0]
    except FileNotFoundError:
        raise Fail("no such process %d" % pid, EXIT_INPUT)
    except PermissionError:
        raise Fail("not permitted to look at process %d (run as root, or as its user)" % pid,
                   EXIT_INPUT)
    except (OSError, IndexError):
        pass
    return None


def _elf_symbol(path, name):
    """(value, size) of the dynamic symbol NAME in the ELF file PATH, or None."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3a)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for s in secs:
        if s[1] == 11:                                   # SHT_DYNSYM
            strtab = secs[s[6]]
            for off in range(s[4], s[4] + s[5], 24):
                st_name, _, _, _, value, size = struct.unpack_from("<IBBHQQ", data, off)
                end = data.index(b"\0", strtab[4] + st_name)
                if data[strtab[4] + st_name:end] == name.encode():
                    return value, size
    return None


def traced_state(pid):
    """What mmleak.so in process PID says of itself ("tracing ID DIR", "paused",
    "dormant"), read from its memory without stopping it; None if mmleak.so is not there."""
    lib = mmleak_in(pid)
    if not lib:
        return None
    base = None
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].rstrip("\n") == lib and int(parts[2], 16) == 0:
                base = int(parts[0].split("-")[0], 16)
                break
    try:        # the file as the process sees it (its mount namespace, its root)
        sym = _elf_symbol("/proc/%d/root%s" % (pid, lib), "mmleak_status") \
            if base is not None else None
    except OSError:
        sym = _elf_symbol(lib, "mmleak_status") if base is not None else None
    if not sym:
        return "loaded (state unknown: %s has no status word)" % lib
    try:
        with open("/proc/%d/mem" % pid, "rb") as m:
            m.seek(base + sym[0])
            raw = m.read(sym[1])
    except OSError as e:
        return "loaded (state unreadable: %s)" % (e.strerror or e)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or "starting"


def traced_processes():
    """[(pid, command, state)] of every process with mmleak.so loaded."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        try:
            if not mmleak_in(pid):
                continue
            state = traced_state(pid)
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").strip().decode("utf-8", "replace")
        except (Fail, OSError):
            continue
        out.append((pid, cmd, state))
    return out


def process_alive(pid):
    """Refuse, with one line, a process that does not exist or has already exited."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        raise Fail("no such process %d" % pid, EXIT_INPUT)
    except (OSError, IndexError):
        return
    if state in ("Z", "X"):
        raise Fail("process %d has exited (a zombie: its parent has not collected it yet)"
                   % pid, EXIT_INPUT)


def same_dir_for(pid, d):
    """Refuse a DIR that process PID sees as another directory, or not at all (its own mount
    namespace, PrivateTmp=, chroot): its files would not be where we look."""
    try:
        ours = os.stat(d)
    except OSError as e:
        raise Fail("%s: %s" % (d, e.strerror), EXIT_INPUT)
    theirs_path = "/proc/%d/root%s" % (pid, d)
    try:
        theirs = os.stat(theirs_path)
    except FileNotFoundError:
        raise Fail("%s does not exist for process %d (another mount namespace or root, such "
                   "as a service's PrivateTmp=): choose a directory it sees as we do"
                   % (d, pid), EXIT_INPUT)
    except PermissionError:
        raise Fail("not permitted to look at process %d's files (run as root, or as its "
                   "user)" % pid, EXIT_INPUT)
    except OSError:
        return          # /proc not readable that way: the process says if it cannot write
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        raise Fail("%s is another directory for process %d (another mount namespace or root, "
                   "such as a service's PrivateTmp=): its files would not be in ours; choose a "
                   "directory it sees as we do" % (d, pid), EXIT_INPUT)


def _call(pid, func, arg, deadline, timeout):
    """FUNC(ARG) in process PID (see _inject), by DEADLINE (time.monotonic()): each try
    searches a safe moment for at most three quarters of the time left, the calls get the
    rest; a try that finds mmleak.so busy is made again while a quarter of TIMEOUT (the
    whole, in seconds) is left, so that the calls of the next one have time."""
    loaded = mmleak_in(pid)     # a path in the process's own mount namespace: used as is
    lib = loaded or find_library()
    if not lib:
        raise Fail("mmleak.so not found (run `make`, or set MMLEAK_LIB)", EXIT_INPUT)
    if not loaded:
        lib = os.path.realpath(lib)
        if not os.path.exists("/proc/%d/root%s" % (pid, lib)):
            raise Fail("%s is not visible to process %d (another mount namespace or root: "
                       "install mmleak.so where it can see it, e.g. `make install`)"
                       % (lib, pid), EXIT_INPUT)
    what = func.replace("mmleak_", "")
    tries = 0
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if tries and left_ms < timeout * 250:
            raise Fail("%s %d: the process stayed busy inside mmleak.so (%d tries in %.1f s of "
                       "--timeout %g s); try again"
                       % (what, pid, tries, timeout - left_ms / 1000, timeout), EXIT_INPUT)
        rc, res, err = _inject(pid, lib, func, arg, max(1, left_ms * 3 // 4), max(1, left_ms))
        if rc != 0:
            if rc == -5 and err.startswith("timed out after"):
                err += " (--timeout %g s: three quarters of what was left for this search, " \
                       "the rest kept for the calls)" % timeout
            raise Fail("%s %d: %s" % (what, pid, err), INJECT_ERRORS.get(rc, EXIT_INPUT))
        if res != 3:            # 3: busy (a thread was inside mmleak): try again
            return res, lib
        tries += 1
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def cmd_attach(args):
    deadline = time.monotonic() + args.timeout
    pid = args.pid
    process_alive(pid)
    d = os.path.abspath(args.dir or os.environ.get("MMLEAK_DIR") or "/tmp")
    if "\n" in d[:-1] or "\0" in d:
        raise Fail("%s: a newline in the directory name" % d, EXIT_USAGE)
    try:
        if not stat.S_ISDIR(os.stat(d).st_mode):
            raise Fail("%s: not a directory" % d, EXIT_INPUT)
    except FileNotFoundError:
        pass                    # made below, once the process may be traced, as run does
    except OSError as e:
        raise Fail("%s: %s" % (d, e.strerror), EXIT_INPUT)
    mmleak_in(pid)              # not permitted to look at it: said before anything else
    # a directory made here belongs to the process's user (it writes its files there
    # itself), and is removed again, still empty, when the attach fails
    made = make_dump_dir(d, owner=process_owner(pid))
    try:
        same_dir_for(pid, d)
        settings = "MMLEAK_DIR=%s\n" % d
        if args.depth:
            settings += "MMLEAK_DEPTH=%d\n" % args.depth
        settings += "MMLEAK_ROTATE_MB=%d\n" % (args.rotate_mb or COMPACT_ROTATE_MB)
        if "\n" in d[:-1] or "\0" in d:
            raise Fail("%s: a newline in the directory name" % d, EXIT_USAGE)
        before = set(find_traces(d))
        res, lib = _call(pid, "mmleak_attach", settings, deadline, args.timeout)
        if res == 1:
            raise Fail("process %d is already being traced (%s)" % (pid, traced_state(pid)),
                       EXIT_INPUT)
        if res != 0:
            raise Fail("process %d could not start tracing into %s (its stderr says why: can "
                       "its user write there?)" % (pid, d), EXIT_INPUT)
    except BaseException:
        if made:
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise
    new = sorted(set(find_traces(d)) - before)
    sys.stdout.write("%s: process %d is traced into %s (trace %s); stop with: %s detach %d\n"
                     % (PROG, pid, d, " ".join(new) or "?", sys.argv[0], pid))
    return EXIT_OK


def cmd_detach(args):
    deadline = time.monotonic() + args.timeout
    pid = args.pid
    process_alive(pid)
    state = traced_state(pid)
    if state is None:
        raise Fail("process %d does not have mmleak.so loaded: nothing to detach" % pid,
                   EXIT_INPUT)
    res, _ = _call(pid, "mmleak_detach", None, deadline, args.timeout)
    if res == 1:
        raise Fail("process %d is not being traced (%s)" % (pid, state), EXIT_INPUT)
    words = state.split(None, 2)
    where = " (trace %s in %s)" % (words[1], words[2]) if len(words) == 3 else ""
    if res == 4:
        warn("process %d is paused, but a thread stayed inside mmleak.so: its files were "
             "left as they are%s (report and recover read them)" % (pid, where))
        return EXIT_PARTIAL
    sys.stdout.write("%s: process %d is no longer traced%s; its files are closed\n"
                     % (PROG, pid, where))
    if len(words) == 3:
        sys.stdout.write("%s: next: %s report %s --pid %s\n" % (PROG, sys.argv[0], words[2],
                                                              words[1]))
    return EXIT_OK


def cmd_status(args):
    procs = traced_processes()
    if not procs:
        sys.stdout.write("no process has mmleak.so loaded\n")
        return EXIT_OK
    for pid, cmd, state in sorted(procs):
        sys.stdout.write("%7d  %-40s  %s\n" % (pid, state, cmd[:120]))
    return EXIT_OK


TRACE_ID_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _trace_head(paths):
    """(start, command) from the first lines of a trace's first readable file (None, None)."""
    for p in paths:
        start, cmd = None, None
        try:
            with open(p, "rb") as f:
                for i, line in enumerate(f):
                    if i == 0:
                        h = parse_header(line)
                        start = header_int(h, "start", None) if h else None
                    elif line.startswith(b"#cmd "):
                        cmd = _unescape(line[5:].rstrip(b"\n"))
                    if cmd is not None or i >= 16 or not line.startswith(b"#"):
                        break
        except (OSError, ValueError):
            continue
        return start, cmd
    return None, None


def process_images(traces, pid):
    """The trace ids of process PID in TRACES ({id: files}), oldest first.  mmleak.so names
    a process's first trace PID and the next ones PID-1, PID-2...: the image it exec'd (a
    service started through a shell is the shell first), a new attach, or a later process
    that got the same pid.  Ordered by the start time in their headers, then by number."""
    ids = [t for t in traces if TRACE_ID_RE.match(t) and TRACE_ID_RE.match(t).group(1) == pid]

    def key(t):
        start = _trace_head(traces[t])[0] if traces[t] else None
        return (start if start is not None else -1, int(TRACE_ID_RE.match(t).group(2) or 0))
    return sorted(ids, key=key)


def choose_trace(directory, pid=None, trace=None):
    """(trace id, files) to report.  TRACE: that trace id exactly.  PID: the process as it is
    now, or was last: its newest image with dump files (an id PID-K given as PID is taken
    exactly, as before --trace existed); a note on stderr names its earlier images.
    Neither: the trace written last."""
    traces = find_traces(directory)
    if trace is None and pid is not None and not pid.isdigit():
        trace = pid
    if trace is not None:
        if trace not in traces:
            raise Fail("no dump files of trace %s in %s (traces there: %s)"
                       % (trace, directory, " ".join(sorted(traces)) or "none"))
        return trace, traces[trace]
    if pid is not None:
        images = process_images(traces, pid)
        if not images:
            raise Fail("no dump files of process %s in %s (traces there: %s)"
                       % (pid, directory, " ".join(sorted(traces)) or "none"))
        with_files = [t for t in images if traces[t]]
        newest = (with_files or images)[-1]     # (none yet: as an empty trace, as before)
        if len(images) > 1:
            def named(t):
                cmd = _trace_head(traces[t])[1]
                return "%s (%s)" % (t, cmd if cmd else "no dump files yet"
                                    if not traces[t] else "command unknown")
            warn("pid %s: %d traces in %s, oldest first: %s; reporting %s, the newest with "
                 "dump files (another one: --trace ID)"
                 % (pid, len(images), directory, ", ".join(named(t) for t in images), newest))
        return newest, traces[newest]
    with_files = {k: v for k, v in traces.items() if v}
    if not with_files:
        raise Fail("no mmleak dump files in %s" % directory)
    if len(with_files) > 1:
        newest = max(with_files, key=lambda k: max(os.path.getmtime(p) for p in with_files[k]))
        warn("%d traces in %s (%s); reporting the newest, %s (choose with --pid or --trace)"
             % (len(with_files), directory, " ".join(sorted(with_files)), newest))
        return newest, with_files[newest]
    k = next(iter(with_files))
    return k, with_files[k]


def baseline_blocks(path):
    """The allocations alive in a saved snapshot (`mmleak.py snapshot`, or a `shrink` output
    of the same process), {(ptr, seq): Alloc} with their stacks."""
    sh = Shrinker()
    with open_trace_file(path) as f:
        sh.feed(f, path)
    if sh.problems.malformed:
        raise Fail("--baseline %s: not a snapshot of a trace (malformed lines)" % path)
    blocks = {}
    for _, _, kind, line in sh.entries(False):
        if kind == KIND_ALLOC:
            a = parse_event(line, sh.stacks)
            blocks[(a.ptr, a.seq)] = a
    return blocks


def build_report(directory, pid=None, progress=True, depth=None, since=None,
                 older_than=None, baseline=None, trace=None):
    """Shrink and symbolize one process's files; returns a dict the report renderers use.

    The incremental view: SINCE keeps survivors allocated at or after that many seconds
    from the trace start, OLDER_THAN those at least that old at the last event, BASELINE
    (a file written by an earlier `mmleak.py shrink` of the same process) those that were
    not alive yet in that snapshot.  PID and TRACE: see choose_trace."""
    tid, paths = choose_trace(directory, pid, trace)
    prog = progress_printer() if progress and sys.stderr.isatty() else None
    t0 = time.monotonic()
    sh, paths = read_trace(directory, tid, progress=prog)
    if prog and time.monotonic() - t0 > 1:
        prog(sh, paths[-1], 0, done=True)
    survivors = sh.survivors()
    all_count, all_bytes = len(survivors), sum(a.size for a in survivors)
    filters = []
    if since is not None:
        survivors = [a for a in survivors if a.time >= since]
        filters.append("allocated %gs or more after start" % since)
    if older_than is not None:
        survivors = [a for a in survivors if sh.max_time - a.time >= older_than]
        filters.append("at least %gs old at the end" % older_than)
    if baseline is not None:
        try:
            old = baseline_blocks(baseline)
        except OSError as e:
            raise Fail("--baseline %s: %s" % (baseline, e.strerror or e))
        alive_now = {(a.ptr, a.seq) for a in survivors}
        freed_since = [a for k, a in old.items() if k not in alive_now]
        survivors = [a for a in survivors if (a.ptr, a.seq) not in old]
        filters.append("allocated since the snapshot %s" % baseline)
    else:
        freed_since = None
    hdr = sh.headers[0] if sh.headers else {}
    hist = sh.history()
    start = header_int(hdr, "start")
    trace_depth = max([MAX_DEPTH if h.get("depth") == "auto" else header_int(h, "depth", 1)
                       for h in sh.headers] or [1])
    maps = os.path.join(directory, "mmleak.%s.maps" % tid)
    frames = {}
    sym_error = None
    try:
        series, _ = read_series(series_path(directory, tid), sh.problems)
    except Refused as e:                # replaced since it was looked at
        refuse(str(e))
        series = []
    addrs = {c for a in survivors for c in a.callers}
    addrs |= {c for pt in series for k in pt.sites if k != "other" for c in k}
    addrs |= {c for a in freed_since or () for c in a.callers}
    addrs |= {f.caller for f in sh.foreign_frees()}
    if os.path.lexists(maps):
        try:
            sym = Symbolizer(maps, trace_start=start or None)
            frames = sym.lookup(sorted(addrs))
            sym_error = sym.tool_error
        except Refused as e:
            refuse(str(e))
            sym_error = str(e)
    else:
        sym_error = "maps file %s missing" % maps
    sh.problems.summary()
    return {
        "trace": tid, "pid": hdr.get("pid", tid.split("-")[0]), "cmd": sh.cmd,
        "title": sh.title,
        "start": start, "end_time": sh.max_time, "files": paths, "maps": maps,
        # the whole history's, compacted events included (allocs and frees None when an
        # older compacted result did not count them); "folded": (events, files) compacted
        "events": hist["events"], "allocs": hist["allocs"], "frees": hist["frees"],
        "folded": (hist["folded_events"], hist["folded_files"]),
        "survivors": survivors, "foreign_frees": sh.foreign_frees(),
        "frames": frames, "symbol_error": sym_error, "depth": depth or trace_depth,
        "trace_depth": trace_depth, "shrinker": sh,
        "incomplete": bool(sh.problems.malformed or sh.problems.fatal or sh.gap_text()),
        "gaps": sh.gap_text(), "alloc": sh.alloc,
        "since": since, "older_than": older_than, "baseline": baseline,
        "freed_since_baseline": freed_since,
        "series": series,
        "growth": growth_sites(series, frames, Wrappers(), trace_depth) if len(series) > 1 else None,
        "filter": "; ".join(filters) or None,
        "unfiltered": (all_count, all_bytes),
    }


def print_top_sites(rep, out, top=10):
    surv = rep["survivors"]
    total = sum(a.size for a in surv)
    title = rep.get("title")
    shown = ("%s (started as: %s)" % (title, rep["cmd"]) if title and rep["cmd"] and
             title != rep["cmd"] else title or rep["cmd"])
    out.write("mmleak: trace %s (pid %s)%s\n" % (rep["trace"], rep["pid"],
                                                ": " + shown if shown else ""))
    folded = rep.get("folded") or (0, 0)
    if folded[1]:
        read = "%d events (%d of them folded by compaction from %d files)" % (
            rep["events"], folded[0], folded[1])
    else:
        read = "%d events read from %d files" % (rep["events"], len(rep["files"]))
    out.write("  %s; %s in %d blocks not freed; %d frees of blocks allocated before tracing\n"
              % (read, human_bytes(total), len(surv), len(rep["foreign_frees"])))
    if rep["filter"]:
        out.write("  showing only blocks %s (%d of %d blocks, %s of %s)\n"
                  % (rep["filter"], len(surv), rep["unfiltered"][0], human_bytes(total),
                     human_bytes(rep["unfiltered"][1])))
    if any(h.get("window") == "1" for h in (rep["shrinker"].headers if rep.get("shrinker")
                                            else [])):
        out.write("  an attached window (mmleak.py attach .. detach): the blocks allocated while "
                  "attached and still alive at its end, ages at its end; frees of blocks "
                  "allocated before the attach are not leaks\n")
    if rep.get("gaps"):
        out.write("  %s\n" % rep["gaps"])
    if rep.get("alloc") and not os.path.basename(rep["alloc"]).startswith("libc.so"):
        out.write("  allocator traced: %s\n" % rep["alloc"])
    if rep["symbol_error"]:
        out.write("  symbols: %s\n" % rep["symbol_error"])
    sites = leak_sites(surv, rep["end_time"], rep["trace_depth"], rep["frames"],
                       Wrappers(rep.get("wrappers") or ()))
    if not sites:
        out.write("  no block matches the filter\n" if rep["filter"] else
                  "  no leaks: every block allocated while tracing was freed\n")
        return sites
    wb = max([12] + [len(str(s.bytes)) for s in sites[:top]])
    wn = max([8] + [len(str(s.blocks)) for s in sites[:top]])
    out.write("  %*s %*s  %s\n" % (wb, "bytes", wn, "blocks", "call site"))
    labels = [frame_label(rep["frames"][s.caller]) if rep["frames"].get(s.caller)
              else "0x%x" % s.caller for s in sites]
    twice = {l for l in labels if labels.count(l) > 1}
    for s, label in zip(sites[:top], labels):
        fr = rep["frames"].get(s.caller)
        if label in twice and fr and fr.module:     # same source in two objects (plugins)
            label += "  [%s]" % fr.module
        out.write("  %*d %*d  %s\n" % (wb, s.bytes, wn, s.blocks, label))
    if len(sites) > top:
        out.write("  ... %d more call sites\n" % (len(sites) - top))
    if rep.get("freed_since_baseline") is not None:
        print_incremental(rep, out, top)
    if rep.get("growth"):
        print_growth(rep, out, top)
    return sites


def growth_sites(points, frames, wrappers=None, depth=MAX_DEPTH):
    """The series by call site: {site address: [(unix, time, bytes, blocks) per point]},
    with the series' keys (stacks) resolved to sites as the report resolves survivors."""
    resolve = site_resolver(frames, wrappers)
    per = collections.defaultdict(lambda: [[0, 0] for _ in points])
    for i, pt in enumerate(points):
        for k, v in pt.sites.items():
            if k == "other":
                continue
            site = resolve(k[:depth])[0]
            per[site][i][0] += v[0]
            per[site][i][1] += v[1]
    return {site: [(pt.unix, pt.time, b, n) for pt, (b, n) in zip(points, vals)]
            for site, vals in per.items()}


def print_growth(rep, out, top=10):
    g = rep["growth"]
    pts = rep["series"]
    span = pts[-1].time - pts[0].time
    out.write("  growth over %d points of the series (%s of the trace's time), by call site "
              "(live bytes first -> last):\n" % (len(pts), _duration(span)))
    rows = sorted(((site, vals) for site, vals in g.items() if any(v[2] for v in vals)),
                  key=lambda kv: (-(kv[1][-1][2] - kv[1][0][2]), kv[0]))
    for site, vals in rows[:top]:
        fr = rep["frames"].get(site)
        d = vals[-1][2] - vals[0][2]
        rate = " (%+.0f B/h)" % (d * 3600.0 / span) if span > 0 else ""
        out.write("  %12d -> %12d %+12d%s  %s\n" % (vals[0][2], vals[-1][2], d, rate,
                                                 frame_label(fr) if fr else "0x%x" % site))


def _duration(s):
    s = int(s)
    if s < 120:
        return "%d s" % s
    if s < 7200:
        return "%d min" % (s // 60)
    return "%.1f h" % (s / 3600.0)


def incremental_sites(rep):
    """Per call site, since the --baseline snapshot: (+bytes, +blocks) allocated since and
    still alive, (-bytes, -blocks) alive in the snapshot and freed since; largest change
    first.  Returns [(caller, plus_bytes, plus_blocks, minus_bytes, minus_blocks)]."""
    resolve = site_resolver(rep["frames"], Wrappers(rep.get("wrappers") or ()))
    depth = rep["trace_depth"]
    acc = collections.defaultdict(lambda: [0, 0, 0, 0])
    for a in rep["survivors"]:
        g = acc[resolve(a.callers[:depth])[0]]
        g[0] += a.size
        g[1] += 1
    for a in rep["freed_since_baseline"]:
        g = acc[resolve(a.callers[:depth])[0]]
        g[2] += a.size
        g[3] += 1
    rows = [(k,) + tuple(v) for k, v in acc.items()]
    rows.sort(key=lambda r: (-(r[1] - r[3]), -r[1], r[0]))
    return rows


def print_incremental(rep, out, top=10):
    rows = incremental_sites(rep)
    freed = rep["freed_since_baseline"]
    out.write("  since the snapshot %s: +%s in %d blocks allocated and still alive, -%s in %d "
              "blocks of the snapshot freed\n"
              % (rep["baseline"], human_bytes(sum(a.size for a in rep["survivors"])),
                 len(rep["survivors"]), human_bytes(sum(a.size for a in freed)), len(freed)))
    out.write("  %12s %8s %12s %8s  %s\n" % ("+bytes", "+blocks", "-bytes", "-blocks",
                                            "call site"))
    for caller, pb, pn, mb, mn in rows[:top]:
        fr = rep["frames"].get(caller)
        out.write("  %12d %8d %12d %8d  %s\n" % (pb, pn, -mb, -mn,
                                                 frame_label(fr) if fr else "0x%x" % caller))
    if len(rows) > top:
        out.write("  ... %d more call sites\n" % (len(rows) - top))


def write_csv(rep, path):
    sites = leak_sites(rep["survivors"], rep["end_time"], rep["trace_depth"], rep["frames"],
                       Wrappers(rep.get("wrappers") or ()))
    try:
        _write_csv(rep, sites, path)
    except OSError as e:
        raise Fail("cannot write %s: %s" % (path, e.strerror or e))


def _write_csv(rep, sites, path):
    with new_output(path, text=True) as f:
        w = csv.writer(f)
        w.writerow(["bytes", "blocks", "mean", "min", "max", "oldest_s", "youngest_s",
                    "function", "file", "line", "module", "offset", "caller"])
        for s in sites:
            fr = rep["frames"].get(s.caller)
            w.writerow([s.bytes, s.blocks, s.bytes // s.blocks, s.min, s.max, s.oldest,
                        s.youngest, fr.function if fr else "", fr.file if fr else "",
                        fr.line if fr else "", fr.module if fr else "",
                        "0x%x" % fr.offset if fr and fr.offset is not None else "",
                        "0x%x" % s.caller])


def export_model(rep, mx, allocator_frames=False, blocks=False):
    """The report REP as the model of mmleak_export (module MX): one stack per distinct
    stack of the survivors (and kind, when the report knows blocks' kinds: rep["kind_of"],
    a function of an Alloc), ending at the call site the report names unless
    ALLOCATOR_FRAMES (then down to the allocator's caller); the mappings its frames are in,
    with build ids (of files unchanged since the run); with BLOCKS, each block's time and
    size (heaptrack's events).  Allocations per stack are not known (the shrink cancels
    them): alloc_* stay None."""
    frames = rep["frames"]
    resolve = site_resolver(frames, Wrappers(rep.get("wrappers") or ()))
    kind_of = rep.get("kind_of")
    depth = rep["trace_depth"]
    groups = {}
    cut = {}                    # stack -> the part exported (blocks share their stacks)
    for a in rep["survivors"]:
        st = cut.get(a.callers)
        if st is None:
            st = cut[a.callers] = a.callers[:depth] if allocator_frames else \
                a.callers[:depth][resolve(a.callers[:depth])[1]:]
        key = (st, kind_of(a) if kind_of else None)
        g = groups.get(key)
        if g is None:
            g = groups[key] = [0, 0, []]
        g[0] += 1
        g[1] += a.size
        if blocks:
            g[2].append((a.time, a.size))
    maps = Maps(rep["maps"]) if os.path.exists(rep["maps"]) else Maps(None, [])
    mappings = {}               # maps entry -> index
    mframes = {}

    def mframe(addr):
        if addr not in mframes:
            fr, real = frames.get(addr), addr & ADDR_MASK
            if fr is None:
                mframes[addr] = mx.Frame(real, None, None, None, None, None, (), None)
                return mframes[addr]
            hit = next((h for h in maps.find(real) if os.path.basename(h[4]) == fr.module
                        and real - h[0] + h[2] == fr.offset), None)
            if hit is not None and hit not in mappings:
                mappings[hit] = len(mappings)
            mframes[addr] = mx.Frame(real, fr.module, fr.offset, fr.function, fr.file, fr.line,
                                     tuple(fr.inlined), None if hit is None else mappings[hit])
        return mframes[addr]
    stacks = [mx.Stack(tuple(mframe(c) for c in st), n, b, None, None,
                       (("kind", kind),) if kind else (), tuple(bl) if blocks else None)
              for (st, kind), (n, b, bl) in sorted(groups.items(), key=lambda kv: (-kv[1][1],
                                                                                 kv[0][0]))]
    # the mappings by address (the executable first, where the kernel puts it), renumbered
    order = sorted(mappings, key=lambda h: h[0])
    renum = {mappings[h]: i for i, h in enumerate(order)}
    stacks = [st._replace(frames=tuple(f._replace(mapping=renum.get(f.mapping))
                                       for f in st.frames)) for st in stacks]
    mlist = [mx.Mapping(h[0], h[1], h[2], h[4],
                        None if _module_problem(h[4], h[3], rep["start"] or None)
                        else mx.read_build_id(h[4])) for h in order]
    surv = rep["survivors"]
    comments = ["mmleak trace %s (pid %s)%s" % (rep["trace"], rep["pid"],
                                                ": " + rep["cmd"] if rep["cmd"] else ""),
                "%d bytes in %d blocks not freed; %d events read"
                % (sum(a.size for a in surv), len(surv), rep["events"])]
    if rep.get("filter"):
        comments.append("only blocks %s" % rep["filter"])
    if rep.get("gaps"):
        comments.append(rep["gaps"])
    comments.append("stacks %s" % ("down to the allocator's caller" if allocator_frames else
                                   "end at the call site (the runtime's and the allocation "
                                   "wrappers' frames below it left out)"))
    return mx.Profile(stacks, mlist, rep["start"] or None, rep["end_time"] or None,
                      rep["cmd"], comments)


def write_exports(rep, args):
    """--pprof, --folded, --heaptrack: each written whole or not at all; a failure is one
    line on stderr and the others are still written.  Returns False if one failed."""
    wanted = [(k, getattr(args, k)) for k in ("pprof", "folded", "heaptrack") if getattr(args, k)]
    if not wanted:
        return True
    try:
        mx = load_script_module("mmleak_export", "mmleak_export.py")
    except (ImportError, OSError) as e:
        warn("cannot write %s: mmleak_export.py is not next to mmleak.py (%s)"
             % (", ".join(p for _, p in wanted), getattr(e, "strerror", None) or e))
        return False
    model = export_model(rep, mx, args.export_allocator_frames, blocks=bool(args.heaptrack))
    ok = True
    for kind, path in wanted:
        try:
            getattr(mx, "write_" + kind)(model, path)
        except (OSError, mx.ExportError) as e:
            warn("cannot write %s: %s" % (path, e.strerror if isinstance(e, OSError) and
                                          e.strerror else e))
            ok = False
            continue
        sys.stdout.write("%s: %s\n" % (kind, path))
    return ok


def load_script_module(name, filename):
    """Import a sibling script (mmleak-panda.py) as a module, by path."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), filename)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cmd_report(args):
    rep = build_report(args.dir, args.pid, progress=True, depth=args.depth,
                       since=args.since, older_than=args.older_than, baseline=args.baseline,
                       trace=args.trace)
    rep["wrappers"] = [n for w in args.wrappers for n in w.split(",") if n]
    print_top_sites(rep, sys.stdout, args.top)
    if args.csv:
        write_csv(rep, args.csv)
        sys.stdout.write("CSV: %s\n" % args.csv)
    exported = write_exports(rep, args)
    out = args.output or os.path.join(args.dir, "mmleak.%s.html" % rep["trace"])
    if not args.no_html:
        try:
            panda = load_script_module("mmleak_panda", "mmleak-panda.py")
        except ImportError as e:
            warn("no HTML report: %s (install python3-pandas and python3-matplotlib)" % e)
            panda = None
        except FileNotFoundError:
            warn("no HTML report: mmleak-panda.py not found next to mmleak.py")
            panda = None
        if panda is not None:
            try:
                panda.render_report(rep, out)
            except OSError as e:
                warn("cannot write %s: %s" % (out, e.strerror or e))
                return EXIT_INPUT
            sys.stdout.write("HTML report: %s\n" % out)
    if not exported:
        return EXIT_INPUT
    if rep["incomplete"]:
        return EXIT_PARTIAL
    if rep["symbol_error"] and "not found" in rep["symbol_error"]:
        return EXIT_TOOL
    return EXIT_OK


def finite_float(v):
    """argparse type: a finite number (not nan, not inf)."""
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % v)
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError("not a finite number: %r" % v)
    return x


def nonnegative_float(v):
    x = finite_float(v)
    if x < 0:
        raise argparse.ArgumentTypeError("must not be negative: %r" % v)
    return x


def positive_float(v):
    x = finite_float(v)
    if x <= 0:
        raise argparse.ArgumentTypeError("must be above 0: %r" % v)
    return x


def trace_depth(v):
    """MMLEAK_DEPTH as mmleak.so takes it: 1 to MAX_DEPTH (it ignores anything else)."""
    n = positive_int(v)
    if n > MAX_DEPTH:
        raise argparse.ArgumentTypeError("at most %d: %r" % (MAX_DEPTH, v))
    return n


def positive_int(v):
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % v)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1: %r" % v)
    return n


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits with EXIT_USAGE (1), as documented, and long
    descriptions are wrapped (the raw formatter keeps the epilogs' layout)."""

    def __init__(self, *args, **kw):
        import textwrap
        if kw.get("description"):
            kw["description"] = textwrap.fill(kw["description"], 92)
        super().__init__(*args, **kw)

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, "%s: error: %s\n" % (self.prog, message))


TRACE_IDS_HELP = """\
Trace ids: mmleak.so names a process's first trace PID, and the next ones PID-1, PID-2...:
the image a process exec'd (a service started through a shell: the shell is PID, the
daemon it exec'd PID-1), a new attach after a detach, or a later process with the same pid.
--pid PID means that process as it is now, or was last: its newest trace with dump files (a
note on stderr lists the others, oldest first, each with its command); --trace ID takes
one trace exactly, an earlier image too.

"""


def add_trace_choice(p, verb):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pid", help="the process: its newest trace (the image it exec'd last); "
                                 "default: the trace written last")
    g.add_argument("--trace", metavar="ID", help="exactly trace ID (PID or PID-K), e.g. the "
                                                 "image before an exec")
    p.epilog = TRACE_IDS_HELP + (p.epilog or "")


def build_parser():
    p = Parser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Shrink, symbolize and report mmleak dump files (mmleak.PID.N.out).",
        epilog="typical use:\n"
               "  %(prog)s run -d /var/tmp/leaks -- ./myprog args   # trace a program\n"
               "  %(prog)s report /var/tmp/leaks --pid PID          # what it leaked, where\n"
               "  %(prog)s shrink --final mmleak.PID.*.out > mmleak.PID.txt  # raw survivors\n\n"
               + EXIT_HELP)
    p.add_argument("--version", action="version", version="%(prog)s " + VERSION)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    s = sub.add_parser(
        "shrink", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="cancel matching allocation/free pairs",
        description="Read dump files (or stdin, sorted or not) and write what does not cancel "
                    "out, in the dump format: the blocks still allocated, the frees of blocks "
                    "allocated before tracing began, and the bracket lines (PTR SEQ +/-) a "
                    "later merge needs.  Shrinking is repeatable: shrink the output of "
                    "several shrinks again, in any grouping and order, and the survivors are "
                    "the same.  With --final (the input is all of a process's files) only "
                    "survivors and foreign frees are written.  Memory use is proportional to "
                    "the addresses still open in the input, not to the number of events.  Lines a "
                    "crashed or still running thread had only staged (mmleak.ID.N.tail) are read "
                    "too.",
        epilog="examples:\n"
               "  %(prog)s mmleak.1234.*.out > mmleak.1234.txt\n"
               "  for f in mmleak.1234.*.out; do LC_ALL=C sort -s -k1,1 $f | mmleak.py shrink > $f.shrinked; done\n"
               "  cat mmleak.1234.*.shrinked | LC_ALL=C sort -s -k1,1 | mmleak.py shrink --final > mmleak.1234.txt\n"
               "  awk 'NF >= 5' mmleak.1234.txt     # just the surviving allocations\n\n"
               + EXIT_HELP)
    s.add_argument("files", nargs="*", metavar="FILE", help="dump files; none or '-': stdin")
    s.add_argument("--final", action="store_true",
                   help="the input is complete: drop bracket lines, keep only survivors and "
                        "foreign frees")
    s.add_argument("-o", "--output", help="write here instead of stdout")
    s.add_argument("--mixed", action="store_true",
                   help="allow files of different processes (their addresses are unrelated: "
                        "only for experts)")
    s.add_argument("--stats", action="store_true", help="print a summary line on stderr")
    s.add_argument("--progress", action="store_true",
                   help="progress on stderr even when it is not a terminal")
    s.set_defaults(func=cmd_shrink)

    y = sub.add_parser(
        "symbolize", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="turn caller addresses into function and file:line",
        description="Resolve addresses from a dump (hex, as written there) with elfutils "
                    "(eu-addr2line -M), in one batch: function (C++ demangled), file:line, "
                    "and the chain of inlined calls.  Callers in the dump already point into "
                    "the call instruction, so the line shown is the calling line.  "
                    "Addresses in objects that were unloaded and replaced, or in files "
                    "changed since the run, are reported unresolved, with the reason.",
        epilog=EXIT_HELP)
    y.add_argument("--maps", required=True, help="the process's mmleak.PID.maps")
    y.add_argument("addrs", nargs="+", metavar="ADDR")
    y.set_defaults(func=cmd_symbolize)

    r = sub.add_parser(
        "run", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run a command under the tracer",
        description="Run CMD with mmleak.so preloaded (found next to mmleak.py, where `make "
                    "install` put it, or $MMLEAK_LIB), then say where its dump files are and "
                    "the command that reports on them.  Exits with CMD's exit status.  While "
                    "it runs, its dump files are compacted every second (see `compact`): the "
                    "files rotate at 8 MB (MMLEAK_ROTATE_MB, unless set) and each finished one "
                    "is folded into mmleak.ID.compact and deleted, so the directory holds the "
                    "live set, not the history; --keep-all keeps every event instead.",
        epilog="example:\n  %(prog)s -d /var/tmp/leaks --depth 16 -- ./server --port 8080\n")
    r.add_argument("-d", "--dir", help="dump directory (default: $MMLEAK_DIR or /tmp; made "
                                       "if missing)")
    r.add_argument("--depth", type=trace_depth,
                   help="frames per allocation, 1 to 64 (MMLEAK_DEPTH; default: auto, through the "
                        "runtime to the program's own frame)")
    r.add_argument("--keep-all", action="store_true",
                   help="no background compaction: keep every dump file as written")
    r.add_argument("--lib", help="path of mmleak.so to use")
    r.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    r.set_defaults(func=cmd_run)

    v = sub.add_parser(
        "recover", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="fold a crashed process's unflushed lines into its dump files",
        description="mmleak.so stages each thread's newest events in mmleak.ID.N.tail and "
                    "deletes it when the thread or process ends cleanly.  After a crash, "
                    "SIGKILL or _exit() the .tail files remain; shrink and report read them "
                    "as they are, but `sort` in the classic pipeline does not: recover appends "
                    "the lines .out does not have yet and deletes the .tail.  Files of a "
                    "process that is still running are left alone: one with that pid, or "
                    "any that maps the .tail (a process in another pid namespace writes "
                    "under its pid there).",
        epilog=EXIT_HELP)
    v.add_argument("paths", nargs="+", metavar="DIR|FILE.out")
    v.add_argument("--force", action="store_true",
                   help="also when a process with that pid runs (a reused pid), or maps "
                        "the .tail")
    v.set_defaults(func=cmd_recover)

    q = sub.add_parser(
        "report", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="what a process leaked, and where",
        description="Shrink all dump files of one process in DIR, symbolize the survivors' "
                    "call sites, print the top leaking call sites, and write the HTML report "
                    "(needs python3-pandas and python3-matplotlib).  The trace may be "
                    "finished, compacted or still running.  --pprof, --folded and --heaptrack "
                    "also write the live blocks for other tools, each file whole or not at "
                    "all (a temporary file renamed over FILE); they and --csv follow the "
                    "same filters (--since, --older-than, --baseline).",
        epilog="examples:\n"
               "  %(prog)s /var/tmp/leaks --pid 1234 --no-html --pprof leaks.pb.gz\n"
               "  go tool pprof -top -sample_index=inuse_space leaks.pb.gz\n"
               "  %(prog)s /var/tmp/leaks --no-html --heaptrack leaks.heaptrack.gz && "
               "heaptrack_print leaks.heaptrack.gz\n"
               "  %(prog)s /var/tmp/leaks --no-html --folded leaks.folded && "
               "flamegraph.pl leaks.folded > leaks.svg\n\n" + EXIT_HELP)
    q.add_argument("dir", help="the dump directory (MMLEAK_DIR)")
    add_trace_choice(q, "report")
    q.add_argument("-o", "--output", help="HTML file (default DIR/mmleak.PID.html)")
    q.add_argument("--csv", metavar="FILE", help="also write the call-site table as CSV")
    q.add_argument("--pprof", metavar="FILE",
                   help="also write the live blocks by stack as a gzipped pprof profile "
                        "(profile.proto: go tool pprof, Parca, Pyroscope); sample types "
                        "inuse_objects and inuse_space, symbolized, with build ids")
    q.add_argument("--folded", metavar="FILE",
                   help="also write the live bytes as folded stacks, 'root;...;site BYTES' "
                        "(flamegraph.pl, inferno, speedscope, Pyroscope)")
    q.add_argument("--heaptrack", metavar="FILE",
                   help="also write the live blocks in heaptrack's format, for "
                        "heaptrack_print and heaptrack_gui (gzipped if FILE ends in .gz, "
                        "as heaptrack expects; plain text otherwise)")
    q.add_argument("--export-allocator-frames", action="store_true",
                   help="in --pprof, --folded and --heaptrack, keep the frames between the "
                        "call site and the allocator (operator new, strdup, xmalloc...); by "
                        "default a stack ends at the call site the report names")
    q.add_argument("--top", type=positive_int, default=10,
                   help="call sites to print (default 10)")
    q.add_argument("--depth", type=positive_int, help="frames per call site (default: the trace's)")
    q.add_argument("--no-html", action="store_true", help="terminal output only")
    q.add_argument("--wrappers", action="append", default=[], metavar="NAME[,NAME...]",
                   help="more allocation wrapper functions to look through (trace depth "
                        "> 1; xmalloc, g_malloc and others are known)")
    q.add_argument("--since", type=finite_float, metavar="SECONDS",
                   help="only blocks allocated at least SECONDS after the trace started "
                        "(hide the start-up state of a daemon)")
    q.add_argument("--older-than", type=finite_float, metavar="SECONDS",
                   help="only blocks at least SECONDS old at the last event (memleax-style)")
    q.add_argument("--baseline", metavar="FILE",
                   help="only blocks not alive in FILE, an earlier `mmleak.py shrink` "
                        "output of the same process (MTrace-style incremental report)")
    q.set_defaults(func=cmd_report)

    c = sub.add_parser(
        "compact", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="fold finished dump files into a running result and delete them",
        description="Fold every complete dump file of every trace in DIR (a file that ends "
                    "with #end, or any file of a process that is gone) into that trace's "
                    "running result, mmleak.ID.compact (the shrink of everything so far), and "
                    "delete it, so that the disk holds the live set, not the history.  Safe "
                    "at any moment: while the process runs, next to another compactor (a "
                    "trace another one holds is skipped), next to `report` (which waits for "
                    "a pass to end), and when killed in the middle (nothing is lost or "
                    "counted twice).  A pass adds a point to mmleak.ID.series (at most every "
                    "--series-interval seconds while the trace runs, and a last one when it "
                    "is over): the live bytes and blocks per call site, for the report's "
                    "growth chart.  A process is gone when its pid is and no process maps "
                    "one of its staging files (.tail): a process in another pid namespace "
                    "is found that way, if this compactor can see it.  Only regular files of "
                    "the trace's owner (the owner of its .maps) or root are read; anything "
                    "else at one of its names is left alone, in one line (exit status 2).",
        epilog="examples:\n"
               "  %(prog)s /var/lib/mmleak/nfs-ganesha.service      # one pass\n"
               "  %(prog)s --follow /var/tmp/leaks    # every second, until no traced process is left\n\n"
               + EXIT_HELP)
    c.add_argument("dir", help="the dump directory (MMLEAK_DIR)")
    c.add_argument("--pid", help="only this trace id")
    c.add_argument("--follow", action="store_true",
                   help="keep compacting every --interval seconds until no traced process "
                        "has been alive for --linger seconds (or until SIGTERM)")
    c.add_argument("--forever", action="store_true",
                   help="with --follow: do not stop when no process is traced (a service's "
                        "companion, stopped with it)")
    c.add_argument("--interval", type=positive_float, default=1.0, metavar="SECONDS",
                   help="with --follow, a pass starts this long after the previous one "
                        "started, or at once if that one took longer (default 1)")
    c.add_argument("--linger", type=positive_float, default=10.0, metavar="SECONDS",
                   help="with --follow: stop after this long without a traced process "
                        "(default 10)")
    c.add_argument("--no-series", action="store_true", help="do not add to mmleak.ID.series")
    c.add_argument("--series-interval", type=nonnegative_float, default=SERIES_INTERVAL,
                   metavar="SECONDS", help="while a trace runs, at most one point of its "
                   "series this often (default %g: each point reads the live set; 0: every "
                   "pass); a trace that is over always gets its last point" % SERIES_INTERVAL)
    c.add_argument("-v", "--verbose", action="store_true", help="one line per folding pass")
    c.set_defaults(func=cmd_compact)

    n = sub.add_parser(
        "snapshot", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="the live set of a trace now, for a later --baseline report",
        description="Write what is alive in the trace now (its compacted result and the files "
                    "still being written, shrunk), in the dump format.  Give it to `report "
                    "--baseline` later: the report then shows, per call site, what was "
                    "allocated since and is still alive, and what of the snapshot was freed "
                    "since (the incremental view MTrace users know).",
        epilog=EXIT_HELP)
    n.add_argument("dir", help="the dump directory (MMLEAK_DIR)")
    add_trace_choice(n, "snapshot")
    n.add_argument("-o", "--output", help="file to write (default: stdout)")
    n.set_defaults(func=cmd_snapshot)

    a = sub.add_parser(
        "attach", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="start tracing a running process, without restarting it",
        description="Make the running process PID (started without mmleak) load mmleak.so and "
                    "trace it from now on into DIR, exactly as if it had been started under "
                    "the tracer.  Blocks allocated before show up as frees of blocks allocated "
                    "before tracing.  A process started with mmleak.so preloaded and then "
                    "detached (or started with MMLEAK_PAUSED=1) resumes, in a new trace.  Needs "
                    "ptrace permission: root, or the same user where kernel.yama.ptrace_scope "
                    "allows it (root for a process under a seccomp filter, which must be "
                    "read).  The process's user must be able to write DIR, and the process "
                    "must see DIR as we do (not in a mount namespace or root of its own).  "
                    "Refusals are one line, exit status 2, the process left as it was.",
        epilog="example:\n  %(prog)s 4242 -d /var/tmp/leaks    # ... later:\n"
               "  mmleak.py detach 4242\n  mmleak.py report /var/tmp/leaks --pid 4242\n\n"
               + EXIT_HELP)
    a.add_argument("pid", type=positive_int, help="the process")
    a.add_argument("-d", "--dir", help="dump directory (default: $MMLEAK_DIR or /tmp); made "
                                       "if missing, and given to the process's user")
    a.add_argument("--depth", type=trace_depth,
                   help="frames per allocation, 1 to 64 (default: auto, see MMLEAK_DEPTH)")
    a.add_argument("--rotate-mb", type=positive_int,
                   help="rotate dump files at this size (default %d, for compaction)"
                        % COMPACT_ROTATE_MB)
    a.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help=TIMEOUT_HELP)
    a.set_defaults(func=cmd_attach)

    t = sub.add_parser(
        "detach", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="stop tracing a process, which goes on at full speed",
        description="Stop tracing process PID: its allocation calls no longer pass through "
                    "mmleak (its speed is back to untraced) and its dump files are flushed and "
                    "closed.  The trace then holds the window from attach to detach: `report` "
                    "shows the blocks allocated in it and still alive at its end, with their "
                    "age.  `attach` later starts a new trace.",
        epilog=EXIT_HELP)
    t.add_argument("pid", type=positive_int, help="the process")
    t.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help=TIMEOUT_HELP)
    t.set_defaults(func=cmd_detach)

    u = sub.add_parser(
        "status", help="which processes have mmleak.so loaded, and what it does in them",
        description="List every process with mmleak.so loaded and its state, read from its "
                    "memory without stopping it: tracing (trace id and directory), paused, or "
                    "dormant.",
        epilog=EXIT_HELP)
    u.set_defaults(func=cmd_status)
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    REFUSALS.clear()                    # (main may run more than once in one process)
    try:
        rc = args.func(args)
        # a file refused (or ignored) in the dump directory: an input that could not be used
        if REFUSALS and args.func in (cmd_shrink, cmd_report, cmd_compact, cmd_snapshot,
                                      cmd_recover) and rc in (EXIT_OK, EXIT_PARTIAL):
            rc = EXIT_INPUT
        return rc
    except Fail as e:
        if isinstance(e, Refused):
            refuse(str(e))
        else:
            warn(str(e))
        return e.status
    except BrokenPipeError:
        try:
            sys.stdout = None
        except Exception:
            pass
        return EXIT_OK
    except OSError as e:
        # a file that could not be read or written and was not caught with a better message
        warn("%s%s" % ((str(e.filename) + ": ") if e.filename else "", e.strerror or e))
        return EXIT_INPUT
    except KeyboardInterrupt:
        warn("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
