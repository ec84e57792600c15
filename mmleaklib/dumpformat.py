"""The dump format (mmleak-format(5), docs/format.rst): the line reader and the parsers.

The one place that knows the syntax of the files of mmleak-format(5): the event lines, the
stacks, every '#' line of a dump, a result and a compacted result (read: parse_tagged,
read_head; written: clock_line, compacted_line, folded_line, result_header), a staging
half's '#at', and a scan result's head (read_scan_head).  The other modules ask it."""
import collections
import errno
import io
import os
import re
import stat

from .errors import Fail, warn
from .facts import LINE_MAX, READ_VERSIONS

# Reading in bounded memory, whatever a file holds (mmleak-format(5), "The dump format"): a line
# longer than LINE_MAX is reported, not kept; a run of NUL bytes (padding; a hole a crash left
# in the file) ends the text before it, and holes are skipped without being read.
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
    """The lines of the binary file F, read in bounded memory (tools/shrink_read.c's feed_fd
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


# ---------------------------------------------------------------------------------------
# The dump format (mmleak-format(5), docs/format.rst)
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


# an allocation line's stack ("@ID" at its end)
STACK_REF_RE = re.compile(rb"@([0-9a-f]{1,16})\n")


def stack_ref(line):
    """The stack ID of the allocation line LINE ("@ID"), or None (its callers are its
    fields)."""
    at = line.rfind(b"@")
    return int(line[at + 1:], 16) if at >= 0 else None


def alloc_time(line):
    """The TIME of the allocation line LINE."""
    return int(line.split(b" ", 4)[3], 16)


def bracket_line(line, seq, start):
    """The bracket line ('PTR SEQ +' for START, else 'PTR SEQ -') at SEQ of the address of
    the event line LINE."""
    return b"%s %x %s\n" % (line.split(b" ", 1)[0], seq, b"+" if start else b"-")


def is_header(line):
    """Whether LINE is a '#mmleak' header line (a file's first: parse_header reads it)."""
    return line.startswith(b"#mmleak ")


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
    if not is_header(line):
        return None
    text = line.decode("utf-8", "replace").rstrip("\n")
    parts = text.split()
    h = {"version": parts[1] if len(parts) > 1 else "?"}
    for p in parts[2:]:
        k, _, v = p.partition("=")
        h[k] = v
    return h


def check_version(h, name, lineno):
    """Fail (one line, NAME:LINENO) for the header H of a format version not read here."""
    if h["version"] not in READ_VERSIONS:
        raise Fail("%s:%d: dump format version %s, this mmleak.py reads %s"
                   % (name, lineno, h["version"], " and ".join(READ_VERSIONS)))


# ---------------------------------------------------------------------------------------
# The other '#' lines (docs/format.rst's table), read and written here only: a reader asks
# parse_tagged for a line's tag and value, a writer for the line (clock_line...).
# ---------------------------------------------------------------------------------------

def _rest(line, tag):
    """What follows '#TAG ' on the line (its newline dropped)."""
    return line[len(tag) + 2:].rstrip(b"\n")


def _fields(words):
    """{key: value} of the 'key=value' words (bytes)."""
    return dict(w.split(b"=", 1) for w in words if b"=" in w)


def _clock(line):
    v = _rest(line, b"clock")
    return int(v) if v.isdigit() and len(v) <= 20 else None


def _title(line):
    t, _, text = _rest(line, b"title").partition(b" ")
    if t[:2] != b"t=" or not t[2:].isdigit():
        return None
    return int(t[2:]), _unescape(text)


def _noscan(line):
    why, _, text = _rest(line, b"noscan").partition(b" ")
    return why.decode("ascii", "replace"), _unescape(text)


def _lost(line):
    words = line.split()
    return (int(words[1]) if len(words) > 1 and words[1].isdigit() else None,
            _fields(words[1:]).get(b"k", b"?"))


def _nofile(line):
    """'#nofile THREADS ERRNO': that many threads lost their events (counted in '#lost') for
    want of a dump file of their own; (threads, errno)."""
    words = line.split()
    if len(words) == 3 and words[1].isdigit() and words[2].isdigit():
        return int(words[1]), int(words[2])
    return None


def _compacted(line):
    return {k.decode("ascii", "replace"): int(v) if v.isdigit() else None
            for k, v in _fields(line.split()[1:]).items()}


def _at(line):
    m = re.fullmatch(rb"#at ([0-9a-f]{16}) *\n", line)
    return int(m.group(1), 16) if m else None


# tag -> the value of a line with it (None: malformed, or nothing to say)
_TAGGED = {
    b"mmleak": parse_header,
    b"cmd": lambda line: _unescape(_rest(line, b"cmd")),
    b"alloc": lambda line: _unescape(_rest(line, b"alloc")),
    b"suppressions": lambda line: _unescape(_rest(line, b"suppressions")),
    b"title": _title,                                   # (t, text)
    b"noscan": _noscan,                                 # (why, reason)
    b"dropping": lambda line: _fields(line.split()[1:]).get(b"k", b"?"),   # the gap's k
    b"lost": _lost,                                     # (events or None, the gap's k)
    b"nofile": _nofile,                                 # (threads, errno)
    b"clock": _clock,                                   # the trace's clock
    b"compacted": _compacted,                           # {field: number or None}
    b"folded": lambda line: _rest(line, b"folded").decode("utf-8", "replace"),
    b"s": parse_stack,                                  # (id, frames)
    b"at": _at,                                         # a staging half's place in .out
}


def parse_tagged(line):
    """(tag, value) of the '#' line LINE (with its newline): its tag without the '#'
    (b"mmleak", b"cmd"...; b"" for a line that is '#' alone) and what it says (see
    _TAGGED; None when the line is malformed or says nothing but its tag: #end, #thread,
    #walks, or a tag not in the format)."""
    tag = line[1:].split(b" ", 1)[0].rstrip(b"\n")
    parse = _TAGGED.get(tag)
    return tag, parse(line) if parse else None


def staged_at(data):
    """(OFFSET, the length of its line) of the '#at OFFSET' line that starts DATA (a half of
    a staging file, mmleak.ID.N.tail), or None."""
    line = data[:data.find(b"\n") + 1]
    off = _at(line) if line else None
    return None if off is None else (off, len(line))


def clock_line(t):
    return b"#clock %d\n" % t


def folded_line(name):
    return b"#folded %s\n" % name.encode()


def compacted_line(files, events, entries, allocs, entry_allocs, at, run=None):
    """A compacted result's '#compacted' line (ALLOCS None: the counts of allocations are
    unknown, left out; RUN: the run's number, for a run)."""
    return b"#compacted files=%d events=%d entries=%d%s at=%d%s\n" % (
        files, events, entries,
        b"" if allocs is None else b" allocs=%d entry_allocs=%d" % (allocs, entry_allocs),
        at, b"" if run is None else b" run=%d" % run)


# the '#' lines of the inputs a compacted result does not keep: they are of one file (its
# thread, its end, its stack walks), or of an earlier pass (its own lines, written anew)
NOT_KEPT = (b"thread", b"end", b"folded", b"compacted", b"at", b"walks")


def result_header(line):
    """The '#mmleak' line of a result made of the file whose header is LINE: without the
    fields of that one file (tid=, file=)."""
    return re.sub(rb" (tid|file)=\S+", b"", line)


def header_file(line):
    """The file= number of the '#mmleak' line LINE (-1: none, as a result's)."""
    h = parse_header(line)
    return header_int(h, "file", -1) if h else -1


# ---------------------------------------------------------------------------------------
# The head of a file: its '#' lines before its stacks and events, for the readers that need
# only that (the files a result folded, its counts, a trace's start and command)
# ---------------------------------------------------------------------------------------

def read_head(f, name):
    """What the '#' lines at the start of F say (a regular file, binary, read from where it
    is; NAME for messages), up to its first line that is not one of them (a stack, an
    event, a torn or a too long line): {"header": parse_header's dict of its first
    '#mmleak' line or None, "cmd": the command or None, "clock": the clock or None,
    "compacted": its first '#compacted' fields or None, "folded": the names of its
    '#folded' lines}.  Blank lines, and a start a crash left NULs in, are skipped as the
    readers skip them.  A line at a time (LINE_MAX bytes at most), the names kept.  Raises
    Fail (one line, the file and line, status 2): a file that is not a dump at all
    (not_a_dump), a format version not read here."""
    head = {"header": None, "cmd": None, "clock": None, "compacted": None, "folded": []}
    start = f.tell()
    if not_a_dump(f.read(PEEK)):
        raise not_dump_fail(name)
    f.seek(start)
    lineno = 0
    while True:
        line = f.readline(LINE_MAX + 1)
        lineno += 1
        if line[-1:] != b"\n":
            break                       # the end, or a torn or too long line
        if not line.strip(b" \n") or b"\0" in line:
            continue
        if line[:1] != b"#":
            break
        tag, value = parse_tagged(line)
        if tag == b"s":
            break
        if tag == b"mmleak" and head["header"] is None:
            check_version(value, name, lineno)
            head["header"] = value
        elif tag == b"cmd" and head["cmd"] is None:
            head["cmd"] = value
        elif tag == b"clock" and value is not None:
            head["clock"] = max(head["clock"] or 0, value)
        elif tag == b"compacted" and head["compacted"] is None:
            head["compacted"] = value
        elif tag == b"folded":
            head["folded"].append(value)
    return head


# ---------------------------------------------------------------------------------------
# The scan result (mmleak-format(5), "The scan result"): its '#' lines, then its data
# ---------------------------------------------------------------------------------------

SCAN_FIRST_RE = re.compile(rb"#mmleak-scan (\d+) id=(\S+) pid=(\d+)")
SCAN_FORMAT = 1                     # the newest version of the scan result read here


def read_scan_head(f, name):
    """What the '#' lines of the scan result F (binary, at its start; NAME for messages)
    say, up to its '#data' line: {attribute of scan.Scan: value} of those it has (version,
    id, pid, why, time, status, reason, attached, threads, held, roots, excluded, kinds,
    blocks; data_at: where its data start, after '#data').  Read PEEK bytes at a time, in
    bounded memory.  Raises Fail (one line, NAME:LINE): a first line that is not a scan's,
    a version newer than SCAN_FORMAT, a damaged line."""
    m = SCAN_FIRST_RE.match(f.readline(PEEK))
    if not m:                           # (none of its bytes shown: they may be anything)
        raise Fail("%s:1: not an mmleak scan result (its first line is not "
                   "'#mmleak-scan VERSION id=ID pid=PID')" % name)
    out = {"version": int(m.group(1)), "id": m.group(2).decode("utf-8", "replace"),
           "pid": int(m.group(3))}
    if out["version"] > SCAN_FORMAT:
        raise Fail("%s: scan format %d is newer than this mmleak.py reads (%d)"
                   % (name, out["version"], SCAN_FORMAT))
    lineno = 1
    while True:
        line = f.readline(PEEK)
        lineno += 1
        if not line:
            return out                  # no #data: nothing classified
        w = line.decode("utf-8", "replace").rstrip("\n").split(" ")
        key = w[0]
        if key == "#data":
            out["data_at"] = f.tell()
            return out
        try:
            if key == "#when":
                out["why"] = w[1]
                for kv in w[2:]:
                    if kv.startswith("time="):
                        out["time"] = float(kv[5:])
            elif key == "#status":
                out["status"] = w[1]
                out["reason"] = " ".join(w[2:]) if w[1] != "done" else None
            elif key == "#attached":
                out["attached"] = w[1] == "1"
            elif key == "#threads":
                out["threads"] = int(w[1])
            elif key == "#held":
                out["held"] = w[1]
            elif key in ("#roots", "#excluded"):
                out.setdefault(key[1:], {})[w[1]] = (int(w[2]), int(w[3]))
            elif key == "#kind":
                out.setdefault("kinds", {})[w[1]] = (int(w[2]), int(w[3]))
            elif key == "#blocks":
                out["blocks"] = int(w[1])
        except (IndexError, ValueError):
            raise Fail("%s:%d: bad header line %r" % (name, lineno, line[:80]))


# ---------------------------------------------------------------------------------------
# Problems in the input: what a reader found (a record: what, file, line, the line), worded
# here once for both shrink engines (tools/shrink_read.c hands back the same records, numbered
# as below)
# ---------------------------------------------------------------------------------------

TORN, PADDING, MALFORMED, DUPLICATE = "torn", "padding", "malformed", "duplicate"
PROBLEM_KINDS = (TORN, PADDING, MALFORMED, DUPLICATE)       # the order of the native counts
(Q_TORN_LINE, Q_TORN_LAST, Q_PADDING_END, Q_NULS, Q_TOO_LONG, Q_MALFORMED, Q_CUT_START,
 Q_DUPLICATE, Q_UNREADABLE, Q_BAD_STACK, Q_STACK_AGAIN, Q_BAD_CLOCK, Q_BAD_FIELD,
 Q_BAD_SERIES, Q_JOINED) = range(1, 16)

# what -> (kind, message, how many bytes of the line it shows: None, DETAIL is not the line
# but the message's values)
PROBLEMS = {
    Q_TORN_LINE: (TORN, "torn line (process killed while writing it?) ignored: %r", 60),
    Q_TORN_LAST: (TORN, "torn last line ignored", 0),
    Q_PADDING_END: (PADDING, "padding after the last line (the process did not exit "
                             "cleanly); ignored", 0),
    Q_NULS: (PADDING, "NUL bytes skipped (padding, or a hole a crash left in the file)", 0),
    Q_TOO_LONG: (MALFORMED, "malformed line skipped (longer than %d bytes): %%r" % LINE_MAX,
                 80),
    Q_MALFORMED: (MALFORMED, "malformed line skipped: %r", 80),
    Q_CUT_START: (MALFORMED, CUT_START, 80),
    Q_DUPLICATE: (DUPLICATE, "event seen twice (same address and number): was a file given "
                             "twice?", 0),
    Q_BAD_STACK: (MALFORMED, "malformed stack line skipped: %r", 80),
    Q_STACK_AGAIN: (MALFORMED, "stack %x defined again with other frames: ignored (the first "
                               "definition is kept)", None),
    Q_BAD_CLOCK: (MALFORMED, "malformed clock line skipped: %r", 80),
    Q_BAD_FIELD: (MALFORMED, "malformed header field %s=%s (a decimal number expected): "
                             "ignored", None),
    Q_BAD_SERIES: (MALFORMED, "malformed series line skipped: %r", 80),
    Q_JOINED: (MALFORMED, "partial results joined into one file (a header after event "
                          "lines, and bracket lines): the shrink cannot tell their lines "
                          "apart; give them as separate files: refused", 0),
}


def problem_text(what, detail=b""):
    """The message of a problem WHAT found in a line (DETAIL: the line, or what the message
    says, see PROBLEMS)."""
    _, text, show = PROBLEMS[what]
    if show is None:
        return text % detail
    return text % (detail[:show],) if show else text


# A file that is not a dump at all (a text file, a program, a picture, a compressed file given
# by mistake, or left under a dump file's name) is refused in one line instead of being read
# as thousands of malformed lines (its bytes are never shown: they may be anything).  The
# first line decides: a dump starts with its '#mmleak ' header, a result of shrink or
# compact with one of the format's '#' lines (DUMP_TAGS), a piece of a trace cut out by hand
# with an event line, a sorted one (`sort`) with any of them; the '#' of a C file
# ('#include'), a script ('#!') or a comment ('# ...') is none of these.  A dump whose start
# a crash damaged is still read, its problems counted: it then starts with blanks (padding),
# or NULs (a hole a crash left where the header was: the end of the line it cut, then
# lines of the format; text with NULs between its characters, UTF-16's, is none), or is
# empty, or holds only the torn start of its first line.  Only the first PEEK bytes are
# looked at.
PEEK = 4096
NOT_DUMP = ("not an mmleak dump (its first line is neither an event line nor one of the "
            "format's '#' lines, as the '#mmleak' that starts a dump); refused")
# the '#' lines of a dump, a result and a compacted result (docs/format.rst), by their tag
DUMP_TAGS = (b"mmleak", b"cmd", b"title", b"alloc", b"suppressions", b"dropping", b"lost",
             b"noscan", b"nofile", b"walks", b"thread", b"end", b"clock", b"compacted",
             b"folded", b"at", b"s")
_TAG_LINE = re.compile(rb"#(?:%s)[ \n]" % b"|".join(DUMP_TAGS))
_TORN_EVENT = re.compile(rb"[0-9a-f]{1,16}(?: [0-9a-f@+-]*)*")

# line_verdict's verdicts
SKIP, DUMP, NOT = "skip", "dump", "not"


def line_verdict(line, whole):
    """What the line LINE (with its newline, if it has one) at a file's start says: SKIP
    (blank; or a run of NULs, a hole, and the end of the line it cut: the next line
    decides), DUMP or NOT (see NOT_DUMP).  WHOLE: a LINE without its newline ends where the
    file ends (torn), else where the bytes looked at end.  Text before a run of NULs is a
    torn line (a process killed while writing it, padding after it); one run of NULs per
    line at most: text with NULs between its characters (UTF-16) is no dump."""
    text, nul, rest = line.partition(b"\0")
    if nul and b"\0" in rest.lstrip(b"\0"):
        return NOT
    if nul:
        return _text_verdict(text, True) if text.strip(b" \n") else SKIP
    return _text_verdict(line, whole)


def _text_verdict(line, whole):
    if not line.strip(b" \n"):
        return SKIP
    if _TAG_LINE.match(line):
        return DUMP
    if line[-1:] == b"\n":
        return DUMP if EVENT_RE.fullmatch(line) else NOT
    if not whole:                       # cut: longer than any first line of a dump
        return NOT
    # torn: the start of one of the format's '#' lines, or of an event line
    return DUMP if _TORN_EVENT.fullmatch(line) or any(
        (b"#" + t + b" ").startswith(line) for t in DUMP_TAGS) else NOT


def not_a_dump(head):
    """Whether HEAD, the first PEEK bytes of a file (fewer: all of it), says the file is not
    a dump (see NOT_DUMP)."""
    whole = len(head) < PEEK
    lines = head.lstrip(b" \n").split(b"\n")
    last = len(lines) - 1
    for k, line in enumerate(lines):
        v = line_verdict(line + b"\n" if k < last else line, whole)
        if v != SKIP:
            return v == NOT
    return False


def not_dump_fail(name):
    """The Fail of NAME, a file that is not a dump at all (NOT_DUMP)."""
    return Fail("%s: %s" % (name, NOT_DUMP))


def cannot_read(name, why):
    """The message of an input that could not be read."""
    return "%s: cannot read: %s" % (name, why)


class Problems:
    """Collects input problems: the first few of each kind per file are reported with their
    line number, the rest counted, so a damaged 10 GB file gives a readable stderr."""
    SHOW = 5

    def __init__(self):
        self.counts = collections.Counter()
        self.fatal = False
        self.malformed = False

    def add(self, name, lineno, what, detail=b""):
        """A problem WHAT at NAME:LINENO (see problem_text)."""
        kind = PROBLEMS[what][0]
        key = (name, kind)
        self.counts[key] += 1
        if self.counts[key] <= self.SHOW:
            self.say(name, lineno, what, detail)
        if kind not in (TORN, PADDING):
            self.malformed = True

    def say(self, name, lineno, what, detail=b""):
        """Word a problem (counted already: the compiled shrinker counts its own)."""
        if what == Q_UNREADABLE:
            warn(cannot_read(name, os.strerror(detail)))
        else:
            warn("%s:%d: %s" % (name, lineno, problem_text(what, detail)))

    def summary(self):
        for (name, kind), n in sorted(self.counts.items()):
            if n > self.SHOW:
                warn("%s: %d more lines with the same problem (%s) not shown"
                     % (name, n - self.SHOW, kind))
