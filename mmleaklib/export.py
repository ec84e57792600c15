"""export: a leak report as files that other tools open (standard library only).

    write_pprof(profile, path)      profile.proto, gzipped: go tool pprof, Parca, Pyroscope
    write_folded(profile, path)     folded stacks (flamegraph.pl, inferno, speedscope)
    write_heaptrack(profile, path)  heaptrack's interpreted format (heaptrack_print, _gui)
    read_build_id(path)             the GNU build id of an ELF file, or None

The input is the neutral model below (Profile, Stack, Frame, Mapping), which knows nothing of
mmleak's dump format: the report builds it (report.export_model).  Each writer writes its
file with files.new_output (a temporary file in the target directory renamed over PATH), so
a reader never sees half a file; it raises OSError (the file could not be written), Fail
(PATH cannot be a file: a directory) or ExportError (the model cannot be expressed in the
format).

The formats, as their readers define them (read in their sources, not copied):
  pprof:     github.com/google/pprof proto/profile.proto, hand-encoded (varints).
  folded:    one line per stack, "root;caller;leaf VALUE", as flamegraph.pl's stackcollapse
             scripts write it.
  heaptrack: the output of heaptrack_interpret (file format 3: sized strings), what
             heaptrack_print and heaptrack_gui read (src/analyze/accumulatedtracedata.cpp).
"""
import collections
import gzip
import os
import struct

from .files import new_output, open_regular

# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------

# One return address of a stack, as symbolized.  ADDRESS: the address in the process (None
# if unknown); MODULE: the object's file name (for display) or None; OFFSET: ADDRESS's offset
# in that file or None; FUNCTION, FILE, LINE: the innermost source location (any may be
# None); INLINED: the levels that inlined it, innermost first, each (function, file, line),
# the last being the function the code was compiled into; MAPPING: index into
# Profile.mappings of the mapping that holds ADDRESS, or None.
Frame = collections.namedtuple("Frame", "address module offset function file line inlined mapping")

# One stack with what is alive on it.  FRAMES: leaf first (the caller of the allocator, or
# the call site, first; the outermost frame recorded last).  INUSE_OBJECTS, INUSE_BYTES: the
# blocks alive at the end and their bytes.  ALLOC_OBJECTS, ALLOC_BYTES: every allocation
# made on the stack over the trace, or None when the trace does not know them (then no
# format claims them).  LABELS: ((key, value), ...) strings, e.g. (("kind", "definite"),).
# BLOCKS: None, or ((time in seconds, size), ...) of the blocks alive (heaptrack's events;
# without it the heaptrack writer spreads INUSE_BYTES over INUSE_OBJECTS blocks at time 0).
Stack = collections.namedtuple(
    "Stack", "frames inuse_objects inuse_bytes alloc_objects alloc_bytes labels blocks")

# A file-backed mapping of the process: [START, LIMIT) at OFFSET in PATH; BUILD_ID hex or None.
Mapping = collections.namedtuple("Mapping", "start limit offset path build_id")

# STACKS, MAPPINGS (the main executable's first), START: Unix time the trace began (or None),
# DURATION: seconds from START to the state the stacks describe (the trace's last event; or
# None), COMMAND: the command line (or None), COMMENTS: lines of text about the trace (pprof
# keeps them; heaptrack's file gets them as '#' lines).  Block times are seconds from START.
Profile = collections.namedtuple("Profile", "stacks mappings start duration command comments")

# The values a label "kind" takes (the reachability of a block, valgrind's names).
KINDS = ("definite", "indirect", "possible", "reachable", "unknown")


class ExportError(Exception):
    """The model cannot be written in the format asked (one line, for the user)."""


def frame_name(fr):
    """The name a frame's function goes by where a function name is needed: the function,
    or, when it has none, the object and offset (what mmleak's report shows), the address,
    or '??'."""
    if fr.function:
        return fr.function
    if fr.module and fr.offset is not None:
        return "%s+0x%x" % (fr.module, fr.offset)
    if fr.address is not None:
        return "0x%x" % fr.address
    return "??"


def frame_levels(fr):
    """The source levels of one frame, innermost first: [(name, file, line), ...]; the first
    is the frame's own location, named by frame_name."""
    return [(frame_name(fr), fr.file, fr.line)] + [(f or "??", fl, ln)
                                                   for f, fl, ln in fr.inlined]


# ---------------------------------------------------------------------------------------
# ELF build ids
# ---------------------------------------------------------------------------------------

NT_GNU_BUILD_ID = 3
PT_NOTE = 4
SHT_NOTE = 7
_NOTE_MAX = 1 << 20          # read at most this much of a note segment or section


def _notes(data, end, align):
    """(name, type, desc) of the ELF notes in DATA."""
    off = 0
    while off + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(end + "III", data, off)
        off += 12
        name = data[off:off + namesz]
        off += (namesz + align - 1) // align * align
        desc = data[off:off + descsz]
        off += (descsz + align - 1) // align * align
        if len(desc) < descsz:
            return
        yield name, ntype, desc


def read_build_id(path):
    """The GNU build id of the ELF file at PATH (note NT_GNU_BUILD_ID, in .note.gnu.build-id),
    as lowercase hex; None if PATH is not a regular ELF file or has none.  Looks in the
    PT_NOTE segments, then, if there are none, in the SHT_NOTE sections."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            return _build_id(f)
        except (OSError, struct.error):
            return None


def _build_id(f):
    ident = f.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) \
            or ident[5] not in (1, 2):
        return None
    end = "<" if ident[5] == 1 else ">"
    if ident[4] == 2:
        phoff, shoff = struct.unpack_from(end + "QQ", ident, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", ident, 54)
        ph_fmt, ph_fields = end + "IIQQQQQQ", (0, 2, 5, 7)        # type, offset, filesz, align
        sh_fmt, sh_fields = end + "IIQQQQIIQQ", (1, 4, 5, 8)      # type, offset, size, align
    else:
        phoff, shoff = struct.unpack_from(end + "II", ident, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", ident, 42)
        ph_fmt, ph_fields = end + "IIIIIIII", (0, 1, 4, 7)
        sh_fmt, sh_fields = end + "IIIIIIIIII", (1, 4, 5, 8)
    regions = []
    for table, num, entsize, fmt, (ti, oi, si, ai), want in (
            (phoff, phnum, phentsize, ph_fmt, ph_fields, PT_NOTE),
            (shoff, shnum, shentsize, sh_fmt, sh_fields, SHT_NOTE)):
        if regions or not table or entsize < struct.calcsize(fmt):
            continue
        f.seek(table)
        raw = f.read(min(num, 4096) * entsize)
        for i in range(len(raw) // entsize):
            e = struct.unpack_from(fmt, raw, i * entsize)
            if e[ti] == want:
                regions.append((e[oi], e[si], 8 if e[ai] == 8 else 4))
    for off, size, align in regions:
        f.seek(off)
        for name, ntype, desc in _notes(f.read(min(size, _NOTE_MAX)), end, align):
            if ntype == NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU" and desc:
                return desc.hex()
    return None


# ---------------------------------------------------------------------------------------
# pprof (profile.proto)
# ---------------------------------------------------------------------------------------

INT64_MAX = (1 << 63) - 1


def _varint(n):
    if n < 0:
        n += 1 << 64                    # int64: two's complement, ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(field, v):
    """A varint field (omitted when 0, as proto3 does)."""
    return _varint(field << 3) + _varint(v) if v else b""


def _len(field, data):
    """A length-delimited field: bytes, a string, a message, a packed list."""
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _packed(field, values):
    return _len(field, b"".join(_varint(v) for v in values)) if values else b""


class _Strings:
    """profile.proto's string table: index 0 is ''."""

    def __init__(self):
        self.index = {"": 0}
        self.table = [""]

    def __call__(self, s):
        s = "" if s is None else str(s)
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def _check_int64(what, v):
    if not 0 <= v <= INT64_MAX:
        raise ExportError("%s %d does not fit pprof's int64" % (what, v))
    return v


def _ns(seconds):
    return seconds * 10 ** 9 if isinstance(seconds, int) else int(round(seconds * 1e9))


def pprof_bytes(profile):
    """The profile.proto message (not compressed) of PROFILE."""
    s = _Strings()
    with_alloc = bool(profile.stacks) and all(
        st.alloc_objects is not None and st.alloc_bytes is not None for st in profile.stacks)
    types = ([("alloc_objects", "count"), ("alloc_space", "bytes")] if with_alloc else []) + \
        [("inuse_objects", "count"), ("inuse_space", "bytes")]
    out = [_len(1, _int(1, s(t)) + _int(2, s(u))) for t, u in types]

    mappings = []
    for i, m in enumerate(profile.mappings, 1):
        mappings.append(_len(3, _int(1, i) + _int(2, m.start) + _int(3, m.limit) +
                             _int(4, m.offset) + _int(5, s(m.path)) + _int(6, s(m.build_id)) +
                             _int(7, 1) + _int(8, 1) + _int(9, 1) + _int(10, 1)))
    functions = {}          # (name, file) -> id
    fmsgs = []
    locations = {}          # Frame -> id
    lmsgs = []

    def function_id(name, filename):
        k = (name, filename)
        if k not in functions:
            functions[k] = len(functions) + 1
            # no system_name: pprof takes a function whose name differs from it as
            # demangled already, and shows the name as it is (as mmleak's report does)
            fmsgs.append(_len(5, _int(1, functions[k]) + _int(2, s(name)) +
                              _int(4, s(filename))))
        return functions[k]

    def location_id(fr):
        if fr not in locations:
            lid = locations[fr] = len(locations) + 1
            lines = b"".join(_len(4, _int(1, function_id(name, fl)) + _int(2, ln or 0))
                             for name, fl, ln in frame_levels(fr))
            mid = fr.mapping + 1 if fr.mapping is not None else 0
            lmsgs.append(_len(4, _int(1, lid) + _int(2, mid) +
                              _int(3, _check_int64("address", fr.address or 0)) + lines))
        return locations[fr]

    samples = []
    for st in profile.stacks:
        values = ([st.alloc_objects, st.alloc_bytes] if with_alloc else []) + \
            [st.inuse_objects, st.inuse_bytes]
        for v in values:
            _check_int64("value", v)
        labels = b"".join(_len(3, _int(1, s(k)) + _int(2, s(v))) for k, v in st.labels or ())
        samples.append(_len(2, _packed(1, [location_id(fr) for fr in st.frames]) +
                            _packed(2, values) + labels))
    out += samples + mappings + lmsgs + fmsgs
    comments = [s(c) for c in profile.comments or ()]
    tail = b""
    if profile.start:                   # the time of the state: the end of the trace
        tail += _int(9, _check_int64("time", _ns(profile.start) + _ns(profile.duration or 0)))
    if profile.duration:
        tail += _int(10, _check_int64("duration", _ns(profile.duration)))
    tail += _len(11, _int(1, s("space")) + _int(2, s("bytes"))) + _int(12, 1)
    tail += b"".join(_int(13, c) for c in comments)
    tail += _int(14, s("inuse_space"))
    strings = b"".join(_len(6, t.encode("utf-8", "replace")) for t in s.table)
    return b"".join(out) + strings + tail


def write_pprof(profile, path):
    """PROFILE as a gzipped profile.proto at PATH: sample types inuse_objects/inuse_space
    (preceded by alloc_objects/alloc_space when every stack knows them), the default
    inuse_space, period 1 (every block, not a sample); one location per frame with its
    function, file, line and inlined levels, mappings marked as symbolized (has_functions,
    has_filenames, has_line_numbers, has_inline_frames) so that no client symbolizes again;
    a stack's labels as string labels; time_nanos the end of the trace (the moment the live
    blocks are those of), duration_nanos the trace's span."""
    data = pprof_bytes(profile)
    with new_output(path) as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, compresslevel=6) as z:
            z.write(data)


# ---------------------------------------------------------------------------------------
# Folded stacks
# ---------------------------------------------------------------------------------------

def _escape(name, also):
    """NAME with control characters and the characters in ALSO as \\xHH (as mmleak.so
    escapes its dump): nothing in a name can end a line or a field.  ALSO holds the
    backslash where the escape must be unambiguous."""
    if all(" " <= c != "\x7f" and c not in also for c in name):
        return name
    return "".join("\\x%02x" % ord(c) if c < " " or c == "\x7f" or c in also else c
                   for c in name)


def folded_name(level):
    """A frame's name in a folded line: the function (';', '\\' and control characters
    escaped as \\xHH)."""
    return _escape(level[0] or "??", ";\\") or "??"


def folded_lines(profile):
    """[(stack, bytes)] of PROFILE: stack 'root;...;leaf', each frame's inlined levels as
    frames of their own (outermost first); stacks with the same names merged, sorted."""
    acc = collections.Counter()
    for st in profile.stacks:
        names = []
        for fr in reversed(st.frames):
            names.extend(folded_name(lv) for lv in reversed(frame_levels(fr)))
        acc[";".join(names) or "??"] += st.inuse_bytes
    return sorted((k, v) for k, v in acc.items() if v)


def write_folded(profile, path):
    """PROFILE's live bytes as folded stacks at PATH (see folded_lines); stacks holding 0
    bytes are left out."""
    with new_output(path) as f:
        for stack, n in folded_lines(profile):
            f.write(("%s %d\n" % (stack, n)).encode("utf-8", "replace"))


# ---------------------------------------------------------------------------------------
# heaptrack
# ---------------------------------------------------------------------------------------

HEAPTRACK_VERSION = 0x010400        # the heaptrack whose format this is (1.4.0)
HEAPTRACK_FILE_FORMAT = 3           # sized strings ("s LEN TEXT")


def heaptrack_compression(path):
    """How heaptrack reads PATH: 'gzip' (.gz), 'plain', or raises ExportError for .zst
    (heaptrack reads zstd, but the standard library cannot write it)."""
    if path.endswith(".zst"):
        raise ExportError("%s: zstd is not written by mmleak; name the file .gz (gzip) or "
                          "give it no compression suffix" % path)
    return "gzip" if path.endswith(".gz") else "plain"


def heaptrack_text(profile):
    """PROFILE in heaptrack's interpreted format, as pieces of text of whole lines.

    Strings, instruction pointers ('i' with function, file, line and inlined levels, so
    heaptrack needs no binary), trace nodes ('t', a tree from the outermost frame down),
    allocation infos ('a' SIZE TRACE) are each defined before their first use; then one '+'
    per live block, in the order of its allocation time, with 'c' (milliseconds) lines as
    time goes on; no '-': every block of the profile is alive at the end, so heaptrack's
    "leaked" is the profile's live bytes."""
    strings = {}
    ips = {}
    traces = {}
    infos = {}
    head = ["v %x %x" % (HEAPTRACK_VERSION, HEAPTRACK_FILE_FORMAT)]
    head += ["# " + _escape(c, "") for c in profile.comments or ()]
    if profile.command:
        head.append("X " + _escape(profile.command, ""))
    yield "\n".join(head) + "\n"

    def string(text, out):
        if not text:
            return 0
        text = _escape(text, "")
        if text not in strings:
            strings[text] = len(strings) + 1
            out.append("s %x %s" % (len(text.encode("utf-8", "replace")), text))
        return strings[text]

    def ip(fr, out):
        if fr not in ips:
            m = profile.mappings[fr.mapping] if fr.mapping is not None else None
            module = string(m.path if m else fr.module, out)
            levels = frame_levels(fr)
            parts = ["i %x %x" % (fr.address or 0, module)]
            name, fl, ln = levels[0]
            parts.append("%x" % string(name, out))
            if fl:
                parts.append("%x %x" % (string(fl, out), ln or 0))
                for name, fl, ln in levels[1:]:
                    parts.append("%x %x %x" % (string(name, out), string(fl, out), ln or 0))
            out.append(" ".join(parts))
            ips[fr] = len(ips) + 1
        return ips[fr]

    events = []         # time in ms << 32 | info index: one int a block, sorted fast
    for st in profile.stacks:
        out = []
        parent = 0
        for fr in reversed(st.frames):
            i = ip(fr, out)
            node = traces.get((parent, i))
            if node is None:
                node = traces[(parent, i)] = len(traces) + 1
                out.append("t %x %x" % (i, parent))
            parent = node
        blocks = st.blocks
        if blocks is None:
            n, b = st.inuse_objects, st.inuse_bytes
            blocks = [(0, b // n + (1 if k < b % n else 0)) for k in range(n)] if n else []
        for t, size in blocks:
            key = (size, parent)
            info = infos.get(key)
            if info is None:
                info = infos[key] = len(infos)
                out.append("a %x %x" % key)
            events.append(int(t * 1000) << 32 | info)
        if out:
            yield "\n".join(out) + "\n"
    events.sort()
    plus = ["+ %x" % i for i in range(len(infos))]
    mask = (1 << 32) - 1
    last = None
    for k in range(0, len(events), 65536):
        out = []
        for e in events[k:k + 65536]:
            ms = e >> 32
            if ms != last:
                out.append("c %x" % ms)
                last = ms
            out.append(plus[e & mask])
        yield "\n".join(out) + "\n"
    end = int((profile.duration or 0) * 1000)
    if last is None or end > last:
        yield "c %x\n" % end


def write_heaptrack(profile, path):
    """PROFILE in heaptrack's format at PATH (heaptrack_text), gzipped when PATH ends in .gz
    (heaptrack_print and heaptrack_gui decide by the name), plain text otherwise."""
    gz = heaptrack_compression(path) == "gzip"
    with new_output(path) as f:
        z = gzip.GzipFile(fileobj=f, mode="wb", mtime=0, compresslevel=6) if gz else None
        w = (z or f).write
        for text in heaptrack_text(profile):
            w(text.encode("utf-8", "replace"))
        if z:
            z.close()
