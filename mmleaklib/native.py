"""The ctypes binding of the compiled helpers the Python side uses: the shrink engine
(tools/shrink.c) and the ptrace injector (tools/inject.c), in mmleak-tools.so beside
mmleak.so.

The compiled shrinker is the same algorithm as shrink.Shrinker, at tens of millions of events
per second.  The library is loaded with ctypes (RTLD_LOCAL); it holds no tracer.  The C code reads the files (the
open callback opens them: the checks of every reader are open_trace_file's), hands every new
'#' line to Shrinker._odd_line (so headers, #cmd and the version check are Python's), hands
back a record of each problem it finds (what, file, line: the Python side words it), and
writes the non-final result to a temporary file, which is loaded back into the Shrinker's
state: a partial result shrinks to itself, so entries(), write(), survivors() give what the
Python path gives.  MMLEAK_SHRINK=python|native chooses; default: native when the library
has it, else Python.
"""
import array
import os
import signal
import sys
import tempfile
import threading
import time

from . import files
from .dumpformat import (EVENT_RE, KIND_ALLOC, KIND_END, KIND_FREE, KIND_START, PROBLEM_KINDS,
                         Q_JOINED, problem_text)
from .errors import EXIT_INPUT, EXIT_TOOL, EXIT_USAGE, Fail
from .facts import LIBNAME, TOOLS_LIBNAME

SHRINK_ENV = "MMLEAK_SHRINK"
NATIVE_ABI = 8
INJECT_ABI = 1
class Abandoned(Exception):
    """A run of the compiled shrinker stopped by its caller's CANCEL (native_shrink): it
    wrote nothing the caller keeps."""


_native = None          # None: not tried yet; False: unavailable; else the ctypes binding
_native_why = None      # why it is unavailable


def tools_library():
    """The library of the compiled helpers: mmleak-tools.so beside mmleak.so (found by
    files.find_library); None without them."""
    lib = files.find_library()
    if lib is None:
        return None
    tools = os.path.join(os.path.dirname(lib), TOOLS_LIBNAME)
    return tools if os.path.isfile(tools) else None


def _native_engine():
    """The ctypes binding of mmleak_shrink, or None (with the reason in _native_why)."""
    global _native, _native_why
    if _native is not None:
        return _native or None
    _native, _native_why = False, None
    lib = tools_library()
    if not lib:
        _native_why = "%s not found beside %s" % (TOOLS_LIBNAME, LIBNAME)
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
                                                    "alloc_lines", "free_lines",
                                                    "alloc_bytes", "newest", "used", "nused",
                                                    "used_bytes", "alloc_bytes_hi")]
    u64, size, i32 = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int
    hdr_cb = ctypes.CFUNCTYPE(i32, ctypes.c_void_p, size, i32, u64)
    tick_cb = ctypes.CFUNCTYPE(i32, i32, u64, u64, u64)
    open_cb = ctypes.CFUNCTYPE(i32, i32)
    problem_cb = ctypes.CFUNCTYPE(i32, i32, u64, i32, ctypes.c_void_p, size)
    fn.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(i32), i32, i32, i32, i32,
                   hdr_cb, tick_cb, open_cb, problem_cb, ctypes.POINTER(u64),
                   ctypes.POINTER(Stats)]
    fn.restype = i32
    blocks_fn = dll.mmleak_shrink_blocks
    blocks_fn.argtypes = fn.argtypes[:5] + fn.argtypes[6:] + [ctypes.POINTER(BlocksT)]
    blocks_fn.restype = i32
    both_fn = dll.mmleak_shrink_result_blocks
    both_fn.argtypes, both_fn.restype = blocks_fn.argtypes, i32
    _blocks_api["result_blocks"] = both_fn
    merge_fn = dll.mmleak_shrink_merge
    merge_fn.argtypes, merge_fn.restype = blocks_fn.argtypes, i32
    _blocks_api["merge"] = merge_fn
    blocks_merge_fn = dll.mmleak_shrink_blocks_merge
    blocks_merge_fn.argtypes, blocks_merge_fn.restype = blocks_fn.argtypes, i32
    _blocks_api["blocks_merge"] = blocks_merge_fn
    _bind_blocks(dll)
    dll.mmleak_shrink_stats_free.argtypes = [ctypes.POINTER(Stats)]
    dll.mmleak_shrink_stats_free.restype = None
    _blocks_api["stats_free"] = dll.mmleak_shrink_stats_free
    _native = (ctypes, fn, Stats, hdr_cb, tick_cb, open_cb, problem_cb, blocks_fn)
    return _native


def _structs():
    """The ctypes mirrors of tools/blocks.h."""
    import ctypes
    u64, p64 = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)

    class Block(ctypes.Structure):
        _fields_ = [(n, u64) for n in ("ptr", "seq", "size", "time", "stack")] + \
            [("frame", ctypes.c_uint32), ("pad", ctypes.c_uint32)]

    class Blocks(ctypes.Structure):
        _fields_ = [("v", ctypes.POINTER(Block)), ("n", u64), ("cap_bytes", u64)]

    class Kinds(ctypes.Structure):
        _fields_ = [("ptr", p64), ("seq", p64), ("kind", ctypes.POINTER(ctypes.c_uint8)),
                    ("n", u64)]

    class Group(ctypes.Structure):
        _fields_ = [(n, u64) for n in ("stack", "frame", "kind", "blocks", "bytes", "min_size",
                                       "max_size", "min_time", "max_time", "min_ptr",
                                       "bytes_hi")]

    class Filter(ctypes.Structure):
        _fields_ = [("tmin", u64), ("tmax", u64), ("exclude", Kinds),
                    ("seen", ctypes.POINTER(ctypes.c_uint8))]

    class Aggregate(ctypes.Structure):
        _fields_ = [("g", ctypes.POINTER(Group)), ("n", u64), ("cap_bytes", u64),
                    ("all_blocks", u64), ("all_bytes", u64), ("kept_blocks", u64),
                    ("kept_bytes", u64), ("all_bytes_hi", u64), ("kept_bytes_hi", u64)]
    return Block, Blocks, Kinds, Group, Filter, Aggregate


try:
    Block, BlocksT, KindsT, GroupT, FilterT, AggregateT = _structs()
except ImportError:             # no ctypes: the Python engine only
    Block = BlocksT = KindsT = GroupT = FilterT = AggregateT = None
_blocks_api = {}


def _bind_blocks(dll):
    import ctypes
    f = dll.mmleak_blocks_aggregate
    f.argtypes = [ctypes.POINTER(Block), ctypes.c_uint64, ctypes.POINTER(KindsT),
                  ctypes.POINTER(FilterT), ctypes.POINTER(AggregateT)]
    f.restype = ctypes.c_int
    s = dll.mmleak_blocks_sample
    s.argtypes = [ctypes.POINTER(Block), ctypes.c_uint64, ctypes.c_uint64,
                  ctypes.POINTER(Block)]
    s.restype = ctypes.c_uint64
    dll.mmleak_blocks_free.argtypes = [ctypes.POINTER(BlocksT)]
    dll.mmleak_blocks_free.restype = None
    dll.mmleak_aggregate_free.argtypes = [ctypes.POINTER(AggregateT)]
    dll.mmleak_aggregate_free.restype = None
    k = dll.mmleak_blocks_keys
    u64p = ctypes.POINTER(ctypes.c_uint64)
    k.argtypes = [ctypes.POINTER(Block), ctypes.c_uint64, u64p, u64p, ctypes.c_uint64, u64p,
                  u64p]
    k.restype = ctypes.c_int
    leb = dll.mmleak_blocks_leb_decode
    leb.argtypes = [ctypes.c_char_p, ctypes.c_uint64, u64p, ctypes.c_uint64, ctypes.c_int]
    leb.restype = ctypes.c_int64
    km = dll.mmleak_blocks_keys_minus
    km.argtypes = [u64p, u64p, ctypes.c_uint64, u64p, u64p, ctypes.c_uint64, u64p, u64p]
    km.restype = ctypes.c_uint64
    _blocks_api["keys_minus"] = km
    _blocks_api.update(aggregate=f, sample=s, free=dll.mmleak_blocks_free, keys=k,
                       aggregate_free=dll.mmleak_aggregate_free, leb=leb)


def leb_numbers(data, n, delta=False):
    """The unsigned LEB128 numbers of the bytes DATA as array('Q') (their running sums if
    DELTA), decoded by the compiled tools: N of them at most (None: up to one a byte), or
    None when DATA is not that, or when the tools cannot be loaded."""
    if not _native_engine() or "leb" not in _blocks_api:
        return None
    import array
    import ctypes
    cap = len(data) if n is None else n
    out = array.array("Q", bytes(8 * cap))
    buf = (ctypes.c_uint64 * max(cap, 1)).from_buffer(out) if cap else None
    got = _blocks_api["leb"](data, len(data), buf, cap, 1 if delta else 0)
    del buf
    if got < 0 or (n is not None and got != n):
        return None
    del out[got:]
    return out


def sorted_keys(blocks=None, xptr=(), xseq=()):
    """array('Q') ptr and seq: the keys of the NativeBlocks BLOCKS (or none) and of the pairs
    XPTR[i], XSEQ[i] (arrays of uint64), sorted in C (a series point's table of keys)."""
    import ctypes
    if not _blocks_api and not _native_engine():
        raise MemoryError("tools/blocks.c: not available")
    n = len(blocks) if blocks is not None else 0
    m = len(xptr)
    total = n + m
    ptr = array.array("Q", bytes(8 * max(total, 1)))
    seq = array.array("Q", bytes(8 * max(total, 1)))
    u64 = ctypes.c_uint64 * max(m, 1)
    xp = u64.from_buffer(array.array("Q", xptr) if m else array.array("Q", [0]))
    xs = u64.from_buffer(array.array("Q", xseq) if m else array.array("Q", [0]))
    out = ctypes.c_uint64 * max(total, 1)
    if _blocks_api["keys"](blocks.s.v if n else None, n, xp, xs, m, out.from_buffer(ptr),
                           out.from_buffer(seq)):
        raise MemoryError("tools/blocks.c: out of memory")
    return ptr[:total], seq[:total]


def keys_minus(a, b):
    """The keys of the sorted table A ((ptr, seq) arrays of uint64) not in the sorted table
    B, in order (C)."""
    import ctypes
    if not _blocks_api and not _native_engine():
        raise MemoryError("tools/blocks.c: not available")
    na, nb = len(a[0]), len(b[0])
    if not na or not nb:
        return array.array("Q", a[0]), array.array("Q", a[1])
    ptr, seq = array.array("Q", bytes(8 * na)), array.array("Q", bytes(8 * na))
    ta, tb = ctypes.c_uint64 * na, ctypes.c_uint64 * nb
    args = [ta.from_buffer(array.array("Q", x)) for x in a] + [na] + \
        [tb.from_buffer(array.array("Q", x)) for x in b] + [nb] + \
        [ta.from_buffer(ptr), ta.from_buffer(seq)]
    n = _blocks_api["keys_minus"](*args)
    return ptr[:n], seq[:n]


class NativeBlocks:
    """Survivors in a native array (tools/blocks.h: 40 bytes a block, no Python object per
    block), as mmleak_shrink_blocks left them; released when this object goes.  A block's
    stack is its stack id, or a tuple (the one caller) for a line without "@ID"."""

    def __init__(self, struct):
        self.s = struct

    def __len__(self):
        return self.s.n

    def __del__(self):
        import ctypes
        if self.s is not None and self.s.v and _blocks_api:
            _blocks_api["free"](ctypes.byref(self.s))
        self.s = None

    def _table(self, pairs, codes=None):
        """A sorted (ptr, seq) table (KindsT) over PAIRS (sorted list), with CODES; the
        ctypes arrays are kept alive in the returned tuple."""
        import ctypes
        n = len(pairs)
        ptr = (ctypes.c_uint64 * max(n, 1))(*[p for p, _ in pairs])
        seq = (ctypes.c_uint64 * max(n, 1))(*[s for _, s in pairs])
        kind = (ctypes.c_uint8 * max(n, 1))(*(codes or []))
        return KindsT(ptr, seq, kind if codes is not None else None, n), (ptr, seq, kind)

    def aggregate(self, tmin, tmax, exclude=None, kinds=None):
        """Per (stack, kind code): [(stack, kind, blocks, bytes, min, max, min_time,
        max_time, min_ptr)] ordered by min_ptr, and (all_blocks, all_bytes, kept_blocks,
        kept_bytes), and the exclude entries seen (a list of flags).

        TMIN, TMAX: the times kept (inclusive); EXCLUDE: a sorted list of (ptr, seq) left
        out; KINDS: (sorted list of (ptr, seq), list of codes 1..254), or ("columns", the
        addresses, the SEQs, the codes) as arrays sorted by address."""
        import ctypes
        keep = []
        filt = FilterT(tmin, tmax)
        seen = None
        if exclude:
            filt.exclude, arrays = self._table(exclude)
            seen = (ctypes.c_uint8 * len(exclude))()
            filt.seen = seen
            keep.append(arrays)
        kt = None
        if kinds and kinds[0] == "columns":       # (tag, ptr array, seq array, codes)
            _, a, s, codes = kinds
            n = len(a)
            if n:
                codes = bytearray(codes)
                arrays = ((ctypes.c_uint64 * n).from_buffer(a),
                          (ctypes.c_uint64 * n).from_buffer(s),
                          (ctypes.c_uint8 * n).from_buffer(codes), codes)
                kt = KindsT(arrays[0], arrays[1], arrays[2], n)
                keep.append(arrays)
        elif kinds and kinds[0]:
            kt, arrays = self._table(kinds[0], kinds[1])
            keep.append(arrays)
        out = AggregateT()
        rc = _blocks_api["aggregate"](self.s.v, self.s.n, ctypes.byref(kt) if kt else None,
                                      ctypes.byref(filt), ctypes.byref(out))
        if rc:
            raise MemoryError("tools/blocks.c: out of memory")
        try:
            groups = [((g.stack,) if g.frame else g.stack, g.kind, g.blocks,
                       g.bytes_hi << 64 | g.bytes, g.min_size, g.max_size, g.min_time,
                       g.max_time, g.min_ptr) for g in out.g[:out.n]]
        finally:
            _blocks_api["aggregate_free"](ctypes.byref(out))
        totals = (out.all_blocks, out.all_bytes_hi << 64 | out.all_bytes, out.kept_blocks,
                  out.kept_bytes_hi << 64 | out.kept_bytes)
        return groups, totals, (list(seen) if seen is not None else [])

    def keys(self, extra=()):
        """The (ptr, seq) of every block and of EXTRA (pairs), sorted: two arrays('Q')
        (sorted_keys: a series point's table)."""
        extra = list(extra)
        return sorted_keys(self, array.array("Q", [p for p, _ in extra]),
                           array.array("Q", [q for _, q in extra]))

    def split(self, ptr, seq, n):
        """Per stack, the blocks that are in the sorted table (PTR, SEQ: N keys, ctypes
        arrays of uint64: keys() converted, see series._groups) and those that are not:
        [(stack, in table, blocks, bytes)], in C (no Python object per block)."""
        import ctypes
        kind = (ctypes.c_uint8 * max(n, 1))()
        ctypes.memset(kind, 1, n)
        kt = KindsT(ptr, seq, kind, n)
        out = AggregateT()
        filt = FilterT(0, (1 << 64) - 1)
        rc = _blocks_api["aggregate"](self.s.v, self.s.n, ctypes.byref(kt), ctypes.byref(filt),
                                      ctypes.byref(out))
        if rc:
            raise MemoryError("tools/blocks.c: out of memory")
        try:
            return [((g.stack,) if g.frame else g.stack, g.kind == 1, g.blocks,
                     g.bytes_hi << 64 | g.bytes) for g in out.g[:out.n]]
        finally:
            _blocks_api["aggregate_free"](ctypes.byref(out))

    def sample(self, most):
        """At most MOST blocks, evenly spread over the array, ordered by time then address:
        [(ptr, seq, size, time, stack)]."""
        import ctypes
        buf = (Block * max(most, 1))()
        n = _blocks_api["sample"](self.s.v, self.s.n, most, buf)
        return [(b.ptr, b.seq, b.size, b.time, (b.stack,) if b.frame else b.stack)
                for b in buf[:n]]

    def __iter__(self):
        """Every block as (ptr, seq, size, time, stack: an id or (caller,)), in the array's order (a Python
        tuple each: for small traces and the exports that need every block)."""
        v, n = self.s.v, self.s.n
        step = 1 << 16
        for i in range(0, n, step):
            for b in v[i:min(i + step, n)]:
                yield (b.ptr, b.seq, b.size, b.time, (b.stack,) if b.frame else b.stack)


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


class _Counts:
    """The problem counts of a native run, as Problems.counts takes them ({(name, kind):
    n}): the C code's array, so that the problems Shrinker._odd_line finds in header lines
    count with the C code's of the same file and kind (the first few of each are shown)."""

    def __init__(self, array, first):
        self.array, self.first = array, first

    def _at(self, key):
        name, kind = key
        return len(PROBLEM_KINDS) * self.first[name] + PROBLEM_KINDS.index(kind)

    def __getitem__(self, key):
        return self.array[self._at(key)]

    def __setitem__(self, key, n):
        self.array[self._at(key)] = n

    def items(self):
        for name, i in self.first.items():
            for k, kind in enumerate(PROBLEM_KINDS):
                n = self.array[len(PROBLEM_KINDS) * i + k]
                if n:
                    yield (name, kind), n


def native_shrink(sh, paths, names=None, raw=None, blocks=False, final=False, also_blocks=False,
                  stream_last=False, direct=None, cancel=None):
    """Feed PATHS ('-': stdin) into the fresh Shrinker SH with the compiled shrinker.

    RAW (a binary file): the result's event lines (as Shrinker.entries(FINAL) gives them)
    are written there instead of being loaded into SH.state, and SH.raw_result says what
    Shrinker.write needs of them: {"newest": the newest allocation's time, "stacks": the
    stack ids they use (sorted), "allocs", "alloc_bytes", "frees": lines of each}.  BLOCKS: the
    final result only (what a report reads), its survivors of format 2 as a native array
    in SH.native_blocks (NativeBlocks), the rest (foreign frees, survivors of format 1) in
    SH.state.  ALSO_BLOCKS (with RAW, not FINAL): the result written to RAW, and its survivors
    also in SH.native_blocks, from the same reading; None there when a survivor is not a
    block (format 1: read the result again).  STREAM_LAST (with RAW, not FINAL): the last of
    PATHS is a compacted result (sorted by address), read as a stream and merged with the
    others' state (mmleak_shrink_merge: the same result, at the cost of the others plus one
    pass over its text); with BLOCKS too (mmleak_shrink_blocks_merge).  DIRECT (with RAW,
    neither BLOCKS nor ALSO_BLOCKS nor STREAM_LAST): (a descriptor, WRITE_HEAD): the event
    lines go to the descriptor instead of RAW, right after WRITE_HEAD(SH) wrote the result's
    head there (called once the lines are known, before the first is written, with
    SH.raw_result and SH.max_time set; an exception there stops the run and nothing of the
    lines is written); SH.raw_direct is then True.  CANCEL (a function): asked every 65,536
    lines read; True stops the run, which raises Abandoned (what it wrote to RAW is not a
    result).  Returns False, having done nothing, when the Python path must do it instead
    (not available, not wanted, or stdin is not descriptor 0)."""
    if direct and (raw is None or blocks or also_blocks or stream_last):
        raise ValueError("native_shrink: DIRECT is for mmleak_shrink's plain result")
    if _shrink_engine() != "native":
        return False
    ctypes, fn, Stats, hdr_cb, tick_cb, open_cb, problem_cb, blocks_fn = _native
    if names is None:
        names = ["<stdin>" if p == "-" else p for p in paths]
    try:
        if "-" in paths and sys.stdin.buffer.fileno() != 0:
            raise ValueError("stdin is not descriptor 0")
        c_paths = [os.fsencode(p) for p in paths]
        if any(b"\0" in x for x in c_paths):
            raise ValueError("NUL in a file name")
    except (ValueError, AttributeError, OSError):
        return False            # stdin replaced (tests, embedding): the Python path
    if sh.state or sh.events or sh.header_lines:
        raise ValueError("native_shrink needs a fresh Shrinker")
    pending = []
    interrupted = []
    first = {}
    for i, name in enumerate(names):
        first.setdefault(name, i)
    # the inputs that are streams peek_stream hands back ({index: stream_key}): a read error
    # that ended one is said once the reader is past it (Shrinker.stream_ended), in its place
    streams = {i: sh.stream_key(0) for i, p in enumerate(paths) if p == "-"}

    def streams_read(upto):
        for i in sorted(k for k in streams if k < upto):
            sh.stream_ended(names[i], key=streams.pop(i))

    def call(f, *args, stop=1):
        """F(*ARGS) for the C code: 0, or STOP after keeping the exception (Fail on a format
        version, KeyboardInterrupt, a broken stream)."""
        try:
            if interrupted:
                raise KeyboardInterrupt
            return f(*args) or 0
        except BaseException as e:
            pending.append(e)
            return stop

    def header(ptr, n, i, lineno):
        if ptr is None:                 # SHRINK_HEAD_FIRST: the head now, the lines next
            sh.max_time = max(sh.max_time, stats.max_time)
            sh.raw_result = raw_info()
            direct[1](sh)
            return
        sh._odd_line(ctypes.string_at(ptr, n), names[i], lineno)

    def raw_info():
        used = []
        if stats.nused:
            used = sorted(ctypes.cast(stats.used, ctypes.POINTER(ctypes.c_uint64))
                          [:stats.nused])
        return {"newest": stats.newest, "stacks": used, "allocs": stats.alloc_lines,
                "alloc_bytes": stats.alloc_bytes_hi << 64 | stats.alloc_bytes,
                "frees": stats.free_lines}

    def problem(i, lineno, what, ptr, n):
        if what == Q_JOINED:
            raise Fail("%s:%d: %s" % (names[i], lineno, problem_text(Q_JOINED)))
        sh.problems.say(names[i], lineno, what, n if ptr is None else ctypes.string_at(ptr, n))

    next_tick = [time.monotonic() + 1.0]

    def tick(i, file_events, before, files_done):
        if cancel is not None and cancel():
            raise Abandoned()
        if sh.progress and time.monotonic() > next_tick[0]:
            next_tick[0] = time.monotonic() + 1.0
            sh.events, sh.files_done = before, files_done
            sh.progress(sh, names[i], file_events)

    def open_input(i):
        streams_read(i)
        f = sh.open_input(paths[i], names[i])     # the checks of every reader, and its
        if f is None:                             # messages, in their place
            return -1
        with f:
            streams[i] = sh.stream_key(f.fileno())
            return os.dup(f.fileno())

    n = len(paths)
    counts = (ctypes.c_uint64 * (len(PROBLEM_KINDS) * max(n, 1)))()
    stats = Stats()
    own = sh.problems.counts
    sh.problems.counts = _Counts(counts, first)
    old_sigint = _defer_sigint(interrupted)
    try:
        with (tempfile.TemporaryFile(prefix="mmleak-shrink.") if raw is None else
              open(os.dup(raw.fileno()), "r+b")) as out:
            cbs = (hdr_cb(lambda *a: call(header, *a)), tick_cb(lambda *a: call(tick, *a)),
                   open_cb(lambda i: call(open_input, i, stop=-2)),
                   problem_cb(lambda *a: call(problem, *a)))
            argv = ctypes.c_char_p * max(n, 1)
            ids = ctypes.c_int * max(n, 1)
            if stream_last and raw is not None and not final and not blocks and n:
                bl = BlocksT()
                rc = _blocks_api["merge"](
                    argv(*c_paths), ids(*[first[name] for name in names]), n, out.fileno(),
                    sh.problems.SHOW, *cbs, counts, ctypes.byref(stats),
                    ctypes.byref(bl) if also_blocks else None)
                if rc == 0 and bl.v:
                    sh.native_blocks = NativeBlocks(bl)
            elif also_blocks and raw is not None and not final:
                bl = BlocksT()
                rc = _blocks_api["result_blocks"](
                    argv(*c_paths), ids(*[first[name] for name in names]), n, out.fileno(),
                    sh.problems.SHOW, *cbs, counts, ctypes.byref(stats), ctypes.byref(bl))
                if rc == 0 and bl.v:
                    sh.native_blocks = NativeBlocks(bl)
            elif blocks:
                bl = BlocksT()
                rc = (_blocks_api["blocks_merge"] if stream_last and n else blocks_fn)(argv(*c_paths), ids(*[first[name] for name in names]), n,
                               out.fileno(), sh.problems.SHOW, *cbs, counts,
                               ctypes.byref(stats), ctypes.byref(bl))
                if rc == 0:
                    sh.native_blocks = NativeBlocks(bl)
            else:
                # SHRINK_FINAL (1), SHRINK_HEAD_FIRST (2): tools/shrink.c's mmleak_shrink
                flags = (1 if final and raw is not None else 0) | (2 if direct else 0)
                rc = fn(argv(*c_paths), ids(*[first[name] for name in names]), n,
                        direct[0] if direct else out.fileno(), sh.problems.SHOW, flags,
                        *cbs, counts, ctypes.byref(stats))
            info = raw_info()
            _blocks_api["stats_free"](ctypes.byref(stats))
            if interrupted:
                raise KeyboardInterrupt
            if rc == 0 and raw is not None:
                sh.raw_result = info
                sh.raw_direct = bool(direct)
            if rc == 1 and pending:
                raise pending[0]
            if rc == -1:
                raise MemoryError("tools/shrink.c: out of memory")
            if rc == -2 and direct:     # the output itself (EPIPE: BrokenPipeError)
                raise OSError(stats.out_errno, os.strerror(stats.out_errno))
            if rc == -2:
                raise Fail("cannot write a temporary file in %s (the shrink's result): %s"
                           % (tempfile.gettempdir(), os.strerror(stats.out_errno)))
            if rc != 0:
                raise RuntimeError("tools/shrink.c: unexpected status %d" % rc)
            streams_read(n)
            if raw is None:
                out.seek(0)
                _load_state(sh, out)
    finally:
        if old_sigint is not None:
            signal.signal(signal.SIGINT, old_sigint)
        for key, c in sh.problems.counts.items():
            own[key] += c
        sh.problems.counts = own
    sh.events = stats.events
    sh.allocs = stats.allocs
    sh.frees = stats.events - stats.allocs
    sh.max_time = max(sh.max_time, stats.max_time)
    sh.files_done += stats.files_done
    sh.result_lines = (stats.lines, stats.alloc_lines)
    sh.problems.malformed = sh.problems.malformed or bool(stats.malformed)
    sh.problems.fatal = sh.problems.fatal or bool(stats.fatal)
    return True


def _defer_sigint(flag):
    """While the compiled shrinker runs, Ctrl-C (SIGINT) only appends to FLAG, which its
    callbacks see (they then stop it): Python's KeyboardInterrupt would be raised at the
    first line of whichever callback runs next, outside any try, where ctypes prints it as
    "Exception ignored" and the C code goes on (an interrupted shrink exited 0).  In the main
    thread, and only over Python's default handler.  -> the handler to put back, or None."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return None
    return signal.signal(signal.SIGINT, lambda signum, frame: flag.append(signum))


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


def _inject(pid, lib, func, arg, timeout_ms, total_ms=0):
    """Call FUNC(ARG) in process PID after it loaded LIB: (code, result, error text).  The
    search for a safe moment takes at most TIMEOUT_MS; with TOTAL_MS, all is over by then
    (the calls get what is left: mmleak_inject_call_within), else the calls get TIMEOUT_MS
    of their own."""
    fn = inject_call(within=bool(total_ms))
    import ctypes
    res = ctypes.c_long(0)
    err = ctypes.create_string_buffer(1024)
    limits = (timeout_ms, total_ms) if total_ms else (timeout_ms,)
    rc = fn(pid, os.fsencode(lib), func.encode() if func is not None else None,
            arg.encode() if arg is not None else None, *limits, ctypes.byref(res), err,
            len(err))
    return rc, ctypes.c_int(res.value & 0xffffffff).value, err.value.decode("utf-8", "replace")


def inject_call(lib=None, within=False):
    """The ctypes binding of mmleak_inject_call (WITHIN: mmleak_inject_call_within, one
    deadline for the search and the calls) in LIB (default: tools_library()); Fail when
    there is none."""
    import ctypes
    here = lib or tools_library()
    if not here:
        raise Fail("%s not found beside %s (run `make`, or set MMLEAK_LIB)"
                   % (TOOLS_LIBNAME, files.find_library() or LIBNAME), EXIT_INPUT)
    dll = ctypes.CDLL(here)
    try:
        if dll.mmleak_inject_abi() != INJECT_ABI:
            raise Fail("%s: injector interface version differs" % here, EXIT_TOOL)
    except AttributeError:
        raise Fail("%s: no injector in it" % here, EXIT_TOOL)
    fn = dll.mmleak_inject_call_within if within else dll.mmleak_inject_call
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int] + \
        ([ctypes.c_int] if within else []) + \
        [ctypes.POINTER(ctypes.c_long), ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn
