"""The dump format (mmleak-format(5), docs/format.rst): the line reader and the parsers."""
import collections
import errno
import io
import os
import re
import stat

from .errors import warn
from .facts import LINE_MAX

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
             b"noscan", b"nofile", b"walks", b"thread", b"end", b"clock", b"compacted", b"folded", b"at",
             b"s")
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
