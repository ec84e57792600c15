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
import csv
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
     mixed, no dump files found), or an output file could not be written; whatever could
     be read was still processed
  3  malformed lines were skipped (each reported on stderr with file and line): the result
     may miss events
  4  eu-addr2line (elfutils) missing or failing: addresses left unresolved
A torn last line or padding (NULs, blanks), which a killed process leaves behind, is reported
but is not an error: the events before it are complete."""


class Fail(Exception):
    """An error for the user: one line on stderr, then exit with .status."""

    def __init__(self, msg, status=EXIT_INPUT):
        super().__init__(msg)
        self.status = status


def warn(msg):
    sys.stderr.write("%s: %s\n" % (PROG, msg))


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


def find_traces(directory):
    """Map trace id ("PID" or "PID-K") -> sorted list of its dump files in DIRECTORY (its
    compacted result mmleak.ID.compact first, if any)."""
    traces = collections.defaultdict(list)
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise Fail("cannot list %s: %s" % (directory, e.strerror))
    for n in names:
        m = DUMP_RE.match(n)
        if m and os.path.islink(os.path.join(directory, n)):
            warn("%s: a symbolic link where a dump file should be: ignored"
                 % os.path.join(directory, n))
            continue
        if m:
            traces[m.group(1)].append((int(m.group(2)), os.path.join(directory, n)))
        elif MAPS_RE.match(n):
            traces.setdefault(MAPS_RE.match(n).group(1), [])
        elif COMPACT_RE.match(n):       # a compacted trace's running result: read it first
            traces[COMPACT_RE.match(n).group(1)].append((-1, os.path.join(directory, n)))
    out = {}
    for k, v in traces.items():
        files = [p for _, p in sorted(v)]
        if files and files[0].endswith(".compact"):
            # a compaction pass stopped after writing its result, before deleting its
            # inputs: they are in the result already (the next pass deletes them)
            folded = set(_previously_folded(files[0]))
            if folded:
                files = [p for p in files if os.path.basename(p) not in folded]
        out[k] = files
    return out


def trace_start_for_maps(maps_path):
    """The start time (Unix seconds) in the header of a dump file beside MAPS_PATH, or None."""
    d, n = os.path.split(os.path.abspath(maps_path))
    m = MAPS_RE.match(n)
    if not m:
        return None
    for p in find_traces(d).get(m.group(1), []):
        try:
            with open(p, "rb") as f:
                h = parse_header(f.readline())
        except OSError:
            continue
        if h and header_int(h, "start", None) is not None:
            return header_int(h, "start")
    return None


def unflushed_tail(out_path, with_size=False):
    """The lines of OUT_PATH's thread that are still only in its staging file, as bytes.

    mmleak.so stages events in mmleak.ID.N.tail (a shared mapping: two halves, each starting
    with "#at OFFSET", the place in .out its lines belong) and appends a half to .out when it
    is full.  A clean close flushes it and deletes the .tail; after a crash, or while the
    process runs, the .tail holds the newest lines.  The .tail is read before the size of
    .out is taken, so a flush in between never yields a line twice.  WITH_SIZE: returns
    (lines, size of .out they follow): a reader of a file still being written must read that
    much of .out, not more (a later flush appends lines it has from the .tail)."""
    tail = out_path[:-4] + ".tail" if out_path.endswith(".out") else None
    if not tail:
        return (b"", None) if with_size else b""
    try:
        with open(tail, "rb") as f:
            data = f.read()
        have, ended = _out_end(out_path)
    except OSError:
        return (b"", None) if with_size else b""
    # An ended .out needs no staging lines: every line was flushed before its "#end".  And a
    # rotating thread renames its staging file to the next file's name, so a name (or a hard
    # link) taken before may now hold the next file's lines.
    if ended:
        return (b"", have) if with_size else b""
    size = have
    halves = []
    half = len(data) // 2
    for h in (data[:half], data[half:]):
        m = re.match(rb"#at ([0-9a-f]{16}) *\n", h)
        if m:
            body = h[m.end():]
            nul = body.find(b"\0")
            halves.append((int(m.group(1), 16), body if nul < 0 else body[:nul + 1]))
    out = []
    halves.sort()
    for i, (off, body) in enumerate(halves):
        n = len(body.rstrip(b"\0"))
        if off + n <= have:
            continue                      # already in .out
        body = body[:n]                   # the NULs after the last line: not data
        out.append(body[max(have - off, 0):])
        have = off + n
    return (b"".join(out), size) if with_size else b"".join(out)


def with_unflushed_tails(paths):
    """PATHS, where every dump file with a staging file is replaced by a temporary copy of
    what it holds now followed by the lines not yet flushed (unflushed_tail): the file may
    grow while it is read, by lines the copy already has.  Returns (paths, names for messages,
    tmpdir or None)."""
    out, shown, tmpdir = [], [], None
    for p in paths:
        shown.append("<stdin>" if p == "-" else p)
        out.append(p)
        if p == "-" or not os.path.exists(p[:-4] + ".tail" if p.endswith(".out") else "/"):
            continue
        data, size = unflushed_tail(p, with_size=True)
        if size is None:
            continue
        tmpdir = tmpdir or tempfile.mkdtemp(prefix="mmleak-tail.")
        q = os.path.join(tmpdir, os.path.basename(p))
        try:
            with open(p, "rb") as src, open(q, "wb") as dst:
                left = size
                while left > 0:
                    chunk = src.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    dst.write(chunk)
                    left -= len(chunk)
                dst.write(data)
        except OSError:
            continue                    # read as it is (the reader says what is wrong)
        out[-1] = q
        shown[-1] = "%s (with the lines of its .tail)" % p if data else p
    return out, shown, tmpdir


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
        try:
            f = open(path, "rb")
        except OSError as e:
            self.problems.fatal = True
            warn("%s: cannot read: %s" % (name or path, e.strerror))
            return
        with f:
            self.feed(f, name or path)

    def feed(self, f, name):
        D = self.state
        get = D.get
        match = EVENT_RE.fullmatch
        problems = self.problems
        lineno = 0
        events = allocs = 0
        max_time = self.max_time
        tick = time.monotonic() + 1.0
        for line in f:
            lineno += 1
            m = match(line)
            if m is None:
                self._odd_line(line, name, lineno)
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
        self.max_time = max_time
        self.files_done += 1

    def _odd_line(self, line, name, lineno):
        if line.startswith(b"#"):
            if not line.endswith(b"\n"):
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
            return
        # A killed writer leaves its last line without newline, and NULs after it (the
        # rest of the mapped window).  After `sort` those become lines of their own.
        if b"\0" in line or not line.endswith(b"\n"):
            if not line.rstrip(b"\n").strip(b"\0 "):
                self.problems.add(name, lineno, "padding",
                                  "padding after the last line (the process did not "
                                  "exit cleanly); ignored")
            else:
                self.problems.add(name, lineno, "torn",
                                  "torn line (process killed while writing it?) ignored: %r"
                                  % line.rstrip(b"\0\n")[:60])
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
        """The result in the dump format: the header lines, the stacks its allocations use,
        then the events, by address."""
        for h in self.header_lines:
            out.write(h)
        entries = list(self.entries(final))
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
    paths, names, tmpdir = with_unflushed_tails(paths)
    try:
        return _shrink_files(paths, progress, mixed, names)
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def shrink_raw(paths):
    """Shrink PATHS (dump files of one trace, their unflushed lines included) without
    building the per-address state in Python: (Shrinker with headers, stacks and counts,
    the result's event lines as bytes, non-final, sorted by address then number).  What a
    compaction pass writes and what a series point reads, at the compiled shrinker's speed;
    the Python path gives the same bytes."""
    paths, names, tmpdir = with_unflushed_tails(paths)
    try:
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
NATIVE_ABI = 2
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
    strv = ctypes.POINTER(ctypes.c_char_p)
    fn.argtypes = [strv, strv, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   hdr_cb, tick_cb, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(Stats)]
    fn.restype = ctypes.c_int
    _native = (ctypes, fn, Stats, hdr_cb, tick_cb)
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
    ctypes, fn, Stats, hdr_cb, tick_cb = _native
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

    def on_header(ptr, n, i, lineno):
        try:
            sh._odd_line(ctypes.string_at(ptr, n), names[i], lineno)
            return 0
        except BaseException as e:          # Fail (format version), KeyboardInterrupt
            pending.append(e)
            return 1

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
        h_cb, t_cb = hdr_cb(on_header), tick_cb(on_tick)
        try:
            argv = ctypes.c_char_p * max(n, 1)
            rc = fn(argv(*c_paths), argv(*c_names), n, out.fileno(), err_fd, 0, h_cb, t_cb,
                    counts, ctypes.byref(stats))
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
            raise OSError(stats.out_errno, "mmleak-shrink.c: writing the result: %s"
                          % os.strerror(stats.out_errno))
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
            with open(path, "r", encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        for line in lines:
            m = MAPS_LINE_RE.match(line.rstrip("\n"))
            if not m:
                continue
            self.entries.append((int(m.group(1), 16), int(m.group(2), 16),
                                 int(m.group(4), 16), int(m.group(6)), m.group(7),
                                 line if line.endswith("\n") else line + "\n"))
        self.entries.sort()
        self.starts = [e[0] for e in self.entries]

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
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            for line in f:
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
            self.loads = Loads(loads) if loads and os.path.exists(loads) else None
        except OSError:
            self.loads = None
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
                    good[id(view)][a] = (mod, off, view)
        for g in good.values():
            view = next(iter(g.values()))[2]
            self._run_tool({a: v[:2] for a, v in g.items()}, view)
        return {a: self.cache[a] for a in addrs}

    def _run_tool(self, good, view=None):
        view = view or self.maps
        exe = shutil.which(self.tool)
        if not exe:
            self.tool_error = "%s not found (install elfutils)" % self.tool
            for a, (mod, off) in good.items():
                self.cache[a] = Frame(a, mod, off, None, None, None, (), self.tool_error)
            return
        # A clean maps file for the tool: only the modules we trust, no ambiguous ranges.
        trusted = set()
        for a in good:
            for h in view.find(a & ADDR_MASK):
                trusted.add(h[4])
        with tempfile.NamedTemporaryFile("w", prefix="mmleak-maps.", delete=False) as tf:
            for e in view.entries:
                if e[4] in trusted:
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
    out = sys.stdout.buffer
    if args.output:
        try:
            out = open(args.output, "wb")
        except OSError as e:
            raise Fail("cannot write %s: %s" % (args.output, e.strerror or e))
    try:
        sh.write(out, final=args.final)
    finally:
        if args.output:
            out.close()
        else:
            out.flush()
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
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise Fail("cannot create %s: %s" % (d, e.strerror))
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
    main = str(proc.pid) if str(proc.pid) in traces else (new[0] if new else None)
    how = ("exit status %d" % rc) if rc >= 0 else ("killed by signal %d" % -rc)
    if main is None:
        warn("%s ended (%s) and wrote no dump files in %s: was LD_PRELOAD cleared, or is "
             "the program static or setuid?" % (cmd[0], how, d))
        return rc if rc >= 0 else 128 - rc
    size = sum(os.path.getsize(p) for p in traces[main] if os.path.exists(p))
    others = [t for t in new if t != main]
    comp = compact_path(d, main)
    if os.path.exists(comp):
        sys.stderr.write("%s: %s ended (%s); trace %s compacted in the background: %s (%s) "
                         "and %d more dump files in %s\n"
                         % (PROG, cmd[0], how, main, os.path.basename(comp),
                            human_bytes(os.path.getsize(comp)), len(traces[main]) - 1, d))
    else:
        sys.stderr.write("%s: %s ended (%s); trace %s: %d dump files, %s in %s\n"
                         % (PROG, cmd[0], how, main, len(traces[main]), human_bytes(size), d))
    if others:
        sys.stderr.write("%s: child processes traced too: %s\n" % (PROG, " ".join(others)))
    sys.stderr.write("%s: next: %s report %s --pid %s\n" % (PROG, sys.argv[0], d, main))
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
        if not tail or not os.path.exists(tail):
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
        data = unflushed_tail(p)
        keep = data[:data.rfind(b"\n") + 1]      # complete lines only
        if len(keep) < len(data.rstrip(b"\0")):
            warn("%s: torn last line dropped: %r" % (tail, data[len(keep):].rstrip(b"\0")[:60]))
        with open(p, "ab") as f:
            f.write(keep)
        os.unlink(tail)
        done += 1
        sys.stdout.write("%s: %d bytes recovered from %s\n" % (p, len(keep), os.path.basename(tail)))
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
        flags = os.O_CLOEXEC | os.O_NOFOLLOW
        if self.shared:
            try:
                return os.open(self.path, flags | os.O_RDONLY)
            except OSError:
                return None
        try:
            return os.open(self.path, flags | os.O_RDWR)
        except FileNotFoundError:
            pass
        except OSError:
            try:
                return os.open(self.path, flags | os.O_RDONLY)
            except OSError:
                return None
        try:
            fd = os.open(self.path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:         # made by another compactor meanwhile
            return self._open()
        except OSError:
            return None
        if os.geteuid() == 0:
            try:
                st = os.stat(os.path.join(self.directory, "mmleak.%s.maps" % self.tid))
            except OSError:
                st = None
            if st is not None and st.st_uid != 0:
                try:
                    os.fchown(fd, st.st_uid, st.st_gid)
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


def trace_alive(directory, tid, traces=None, start=None):
    """Is trace TID still being written?  Its process must exist, be the same process (not a
    reused pid: it started before the trace, or it has one of the trace's staging files
    mapped, should the wall clock have been set forward since the trace began), and not
    have been replaced by exec (a newer trace of the same pid in DIRECTORY).  A process
    that exists but cannot be looked at counts as alive."""
    pid = int(tid.split("-")[0])
    began = _process_start_time(pid)
    if began is None:
        return False
    if began is not PROCESS_HIDDEN and start is not None and began > start + 2 and \
            not _maps_a_staging_file(pid, directory, tid):
        return False                    # the pid was reused
    traces = traces if traces is not None else find_traces(directory)
    k = int(tid.split("-")[1]) if "-" in tid else 0
    for other in traces:
        if other.split("-")[0] == str(pid) and (int(other.split("-")[1]) if "-" in other else 0) > k:
            return False                # exec'd: this image's trace is over
    return True


def _out_end(path):
    """(size, whether it ends with "#end") of a dump file, from one open; OSError passes."""
    with open(path, "rb") as f:
        n = f.seek(0, os.SEEK_END)
        if n < 5:
            return n, False
        f.seek(n - 5)
        return n, f.read(5) == b"#end\n"


def _ends_with_end(path):
    try:
        return _out_end(path)[1]
    except OSError:
        return False


def _trace_start(paths):
    for p in paths:
        try:
            with open(p, "rb") as f:
                h = parse_header(f.readline())
        except OSError:
            continue
        if h and h.get("start", "").isdigit():
            return int(h["start"])
    return None


def complete_files(directory, tid, files, traces=None):
    """The dump files of TID that can be folded now, and whether the trace is over."""
    outs = [p for p in files if p.endswith(".out")]
    alive = trace_alive(directory, tid, traces, _trace_start(outs))
    if not alive:
        return outs, True
    return [p for p in outs if not os.path.exists(p[:-4] + ".tail") and _ends_with_end(p)], False


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
    out.append(b"#compacted files=%d events=%d entries=%d%s at=%d\n"
               % (files, h["events"], entries, allocs, int(time.time())))
    for p in folded:
        out.append(b"#folded %s\n" % os.path.basename(p).encode())
    return out


def _private(path, mode="wb"):
    """Open PATH for writing with mode 0600, as mmleak.so makes its files (the owner of the
    directory's files, root or the traced service's user, alone can read them)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    flags |= os.O_APPEND if mode == "ab" else os.O_TRUNC
    return os.fdopen(os.open(path, flags, 0o600), mode)


def _write_atomic(path, header_lines, sh, data):
    """The result: its header lines, the stacks its allocations use, its event lines DATA;
    written to PATH.tmp, flushed to disk, renamed over PATH."""
    tmp = path + ".tmp"
    with _private(tmp) as f:
        for h in header_lines:
            f.write(h)
        for i in sorted({int(x, 16) for x in STACK_REF_RE.findall(data)}):
            if i in sh.stack_lines:
                f.write(sh.stack_lines[i])
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _previously_folded(path):
    """The inputs the result at PATH names (its pass may have stopped before deleting them).
    They are among its first lines, before the stacks."""
    names = []
    try:
        with open(path, "rb") as f:
            for line in f:
                if not line.startswith(b"#") or line.startswith(b"#s "):
                    break
                if line.startswith(b"#folded "):
                    names.append(line[8:].rstrip(b"\n").decode("utf-8", "replace"))
    except OSError:
        pass
    return names


def _site_key(a):
    return a.callers if len(a.callers) > 1 else a.callers[0]


def compact_trace(directory, tid, files=None, traces=None, series=True):
    """One compaction pass over trace TID, and a point of its series when one is due
    (SERIES: False never).  Returns a dict of what it did, or None when another compactor
    holds the trace (it is skipped, not waited for)."""
    traces = traces if traces is not None else find_traces(directory)
    files = files if files is not None else traces.get(tid, [])
    cpath = compact_path(directory, tid)
    try:
        lock = TraceLock(directory, tid, wait=False).__enter__()
    except BlockingIOError:
        return None
    try:
        for name in _previously_folded(cpath):
            if DUMP_RE.match(name):     # its .out, or its .tail if the .out went first
                _remove_dump(os.path.join(directory, name))
        spath = series_path(directory, tid)
        for tmp in (cpath, spath, spath + ".live"):     # left by a pass that was stopped
            _remove_quietly(tmp + ".tmp")
        files = [p for p in files if os.path.exists(p)]
        done, over = complete_files(directory, tid, files, traces)
        res = {"trace": tid, "folded": 0, "over": over, "events": 0, "bytes": 0,
               "point": None}
        if done:
            res.update(_fold(directory, tid, cpath, done))
        # a trace that is over gets its last point (unless it has it: the .live is gone)
        if series and files and (over and (done or os.path.exists(spath + ".live") or
                                           not os.path.exists(spath))
                                 or not over and _series_due(directory, tid)):
            res["point"] = _series_point(directory, tid, final=over)
        return res
    finally:
        lock.__exit__()


def _fold(directory, tid, cpath, done):
    """Fold the complete files DONE into CPATH (under the trace's exclusive lock)."""
    before = os.path.getsize(cpath) if os.path.exists(cpath) else 0
    inputs = ([cpath] if os.path.exists(cpath) else []) + done
    nbytes = sum(os.path.getsize(p) for p in done) + sum(
        os.path.getsize(p[:-4] + ".tail") for p in done if os.path.exists(p[:-4] + ".tail"))
    sh, data = shrink_raw(inputs)
    if sh.problems.fatal:
        raise Fail("%s: cannot compact trace %s: an input could not be read" % (directory, tid))
    _write_atomic(cpath, _compact_header_lines(sh, done), sh, data)
    for p in done:
        _remove_dump(p)
    return {"folded": len(done), "events": sh.events - sh.compacted["entries"],
            "bytes": nbytes, "before": before, "after": os.path.getsize(cpath),
            "malformed": sh.problems.malformed}


def _remove_dump(p):
    for q in (p, p[:-4] + ".tail"):
        try:
            os.unlink(q)
        except FileNotFoundError:
            pass


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
    try:
        f = open(path, "rb")
    except OSError:
        return head, stacks, points
    with f:
        for lineno, line in enumerate(f, 1):
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


def _remove_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _save_live(path, now, plines, stack_lines, final=False):
    """The blocks of this point ({b"PTR SEQ": (site key, size)}), for the next one to tell
    which were freed and where from, after the point's own lines ("#point", "#final" for
    the trace's last) and the stacks of their sites."""
    tmp = path + ".tmp"
    with _private(tmp) as f:
        if final:
            f.write(b"#final\n")
        f.write(b"".join(b"#point " + line for line in [plines[0]] + plines[1]))
        f.write(b"".join(b"#point " + line for line in stack_lines.values()))
        f.write(b"".join(b"%s %x %s\n" % (ident, size, k) for ident, (k, size) in now.items()))
    os.rename(tmp, path)


def _load_live(path):
    """({b"PTR SEQ": (site key, size)}, the point it belongs to as ([p line, [k lines]],
    {stack id: line}, whether it was the trace's last)), or (None, None) without a usable
    file."""
    out, plines, stacks, final = {}, None, {}, False
    try:
        with open(path, "rb") as f:
            for line in f:
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
    tmp = spath + ".tmp"
    with _private(tmp) as f:
        f.write(b"".join(head) if head else b"#series 1 id=%s\n" % tid.encode())
        f.write(b"".join(stack_lines[i] for i in sorted(used) if i in stack_lines))
        f.write(b"".join(p + b"".join(ks) for p, ks in points))
    os.rename(tmp, spath)


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
        res = compact_trace(directory, tid, traces[tid], traces, series=series)
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
        try:
            paths = find_traces(directory).get(tid, [])
            sh = shrink_files(paths, progress=progress)
        finally:
            said, sys.stderr = sys.stderr.getvalue(), real
    if not (sh.problems.fatal or any(k == "duplicate" for _, k in sh.problems.counts)):
        sys.stderr.write(said)
        return sh, paths
    with TraceLock(directory, tid, shared=True):
        paths = find_traces(directory).get(tid, [])
        return shrink_files(paths, progress=progress), paths


def cmd_snapshot(args):
    """The live set of a trace now, in the dump format (an earlier moment for --baseline)."""
    tid, _ = choose_trace(args.dir, args.pid)
    sh, _ = read_trace(args.dir, tid)
    sh.problems.summary()
    if sh.problems.fatal:
        raise Fail("trace %s: a file could not be read: no snapshot written" % tid)
    out = sys.stdout.buffer
    if args.output:
        try:
            out = open(args.output, "wb")
        except OSError as e:
            raise Fail("cannot write %s: %s" % (args.output, e.strerror))
    try:
        sh.write(out, final=False)
    finally:
        if args.output:
            out.close()
        else:
            out.flush()
    warn("trace %s: %d blocks alive (%s)" % (tid, len(sh.survivors()),
                                             human_bytes(sum(a.size for a in sh.survivors()))))
    return EXIT_PARTIAL if sh.problems.malformed else EXIT_OK


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
    try:
        if not stat.S_ISDIR(os.stat(d).st_mode):
            raise Fail("%s: not a directory" % d, EXIT_INPUT)
    except OSError as e:
        raise Fail("%s: %s" % (d, e.strerror), EXIT_INPUT)
    mmleak_in(pid)              # not permitted to look at it: said before anything else
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


def choose_trace(directory, pid):
    traces = find_traces(directory)
    if pid is not None:
        if pid not in traces:
            raise Fail("no dump files of process %s in %s (traces there: %s)"
                       % (pid, directory, " ".join(sorted(traces)) or "none"))
        return pid, traces[pid]
    with_files = {k: v for k, v in traces.items() if v}
    if not with_files:
        raise Fail("no mmleak dump files in %s" % directory)
    if len(with_files) > 1:
        newest = max(with_files, key=lambda k: max(os.path.getmtime(p) for p in with_files[k]))
        warn("%d traces in %s (%s); reporting the newest, %s (choose with --pid)"
             % (len(with_files), directory, " ".join(sorted(with_files)), newest))
        return newest, with_files[newest]
    k = next(iter(with_files))
    return k, with_files[k]


def baseline_blocks(path):
    """The allocations alive in a saved snapshot (`mmleak.py snapshot`, or a `shrink` output
    of the same process), {(ptr, seq): Alloc} with their stacks."""
    sh = Shrinker()
    with open(path, "rb") as f:
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
                 older_than=None, baseline=None):
    """Shrink and symbolize one process's files; returns a dict the report renderers use.

    The incremental view: SINCE keeps survivors allocated at or after that many seconds
    from the trace start, OLDER_THAN those at least that old at the last event, BASELINE
    (a file written by an earlier `mmleak.py shrink` of the same process) those that were
    not alive yet in that snapshot."""
    tid, paths = choose_trace(directory, pid)
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
    series, _ = read_series(series_path(directory, tid), sh.problems)
    addrs = {c for a in survivors for c in a.callers}
    addrs |= {c for pt in series for k in pt.sites if k != "other" for c in k}
    addrs |= {c for a in freed_since or () for c in a.callers}
    addrs |= {f.caller for f in sh.foreign_frees()}
    if os.path.exists(maps):
        sym = Symbolizer(maps, trace_start=start or None)
        frames = sym.lookup(sorted(addrs))
        sym_error = sym.tool_error
    else:
        sym_error = "maps file %s missing" % maps
    sh.problems.summary()
    return {
        "trace": tid, "pid": hdr.get("pid", tid.split("-")[0]), "cmd": sh.cmd,
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
    out.write("mmleak: trace %s (pid %s)%s\n" % (rep["trace"], rep["pid"],
                                                ": " + rep["cmd"] if rep["cmd"] else ""))
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
    with open(path, "w", newline="") as f:
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
                       since=args.since, older_than=args.older_than, baseline=args.baseline)
    rep["wrappers"] = [n for w in args.wrappers for n in w.split(",") if n]
    print_top_sites(rep, sys.stdout, args.top)
    if args.csv:
        write_csv(rep, args.csv)
        sys.stdout.write("CSV: %s\n" % args.csv)
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
    r.add_argument("-d", "--dir", help="dump directory (default: $MMLEAK_DIR or /tmp)")
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
                    "process that is still running are left alone.",
        epilog=EXIT_HELP)
    v.add_argument("paths", nargs="+", metavar="DIR|FILE.out")
    v.add_argument("--force", action="store_true",
                   help="also when a process with that pid runs (a reused pid)")
    v.set_defaults(func=cmd_recover)

    q = sub.add_parser(
        "report", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="what a process leaked, and where",
        description="Shrink all dump files of one process in DIR, symbolize the survivors' "
                    "call sites, print the top leaking call sites, and write the HTML report "
                    "(needs python3-pandas and python3-matplotlib).",
        epilog=EXIT_HELP)
    q.add_argument("dir", help="the dump directory (MMLEAK_DIR)")
    q.add_argument("--pid", help="trace id (PID, or PID-K for an exec'd image); default: newest")
    q.add_argument("-o", "--output", help="HTML file (default DIR/mmleak.PID.html)")
    q.add_argument("--csv", help="also write the call-site table as CSV")
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
                    "growth chart.",
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
    n.add_argument("--pid", help="trace id; default: newest")
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
    a.add_argument("-d", "--dir", help="dump directory (default: $MMLEAK_DIR or /tmp)")
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
    try:
        return args.func(args)
    except Fail as e:
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
