"""The time series of live blocks per call site (mmleak.ID.series).

  #series 1 id=ID
  #s ID FRAME...                     stacks the keys below use
  p UNIX TIME BYTES BLOCKS NEWB NEWN FREEDB FREEDN     one point: the live set
  k KEY BYTES BLOCKS NEWB NEWN FREEDB FREEDN           ... per call site (top SERIES_SITES)

TIME is the trace's clock (seconds since start, the newest event seen); KEY is the caller
(hex: a stack of one frame too) or @STACK.  NEW are the blocks alive now that were not
alive at the previous point, FREED those alive then and not now (so BYTES = previous BYTES
+ NEWB - FREEDB, exactly).  Past SERIES_POINTS points every other old point is merged into
the next one (NEW and FREED summed), so the file stays small however long the trace runs.

The blocks of the last point are in mmleak.ID.series.live: that point's own lines
("#point ..."), every site's sums ("#site KEY BYTES BLOCKS"), and the blocks' keys ("#keys
N", then N addresses and N SEQs, 8-byte words, sorted), which the next point joins its
survivors on in C (native.NativeBlocks.split: new or not, per site).  It is written first (temporary
file, rename), then the series (the same way), so a compactor killed in between leaves a
.live whose point the series lacks, and the next pass appends it before its own.  When the
trace is over, its last point is taken and the .live deleted: the series is complete.

A point comes from the levels when it can (level_sums, below), while the trace runs as at
its end: the per-site sums of the result (mmleak.ID.series.base, tied to the result by its
inode, size, mtime and header hash: written by the first fold, and again by every merge into
the result, from the old sums and the merged files) plus the effect of the files beside it
at their addresses; NEW against the previous point's keys when its .live names the same
result ("#levels").  Once there is a result the .live keeps only the keys of the blocks
allocated beside it ("#partial"; _point_sites), and a merge into the result adds those it
brought in ("#exclude"; before_result_merge).  Otherwise (no base or another result's, no
compiled shrinker) the trace is read whole, as above.
"""
import array
import bisect
import collections
import contextlib
import os
import re
import shutil
import time

from .dumpformat import NO_STACK, Q_BAD_SERIES, Problems, dump_lines, parse_stack
from . import files
from .files import TraceFiles, _own_file, _remove_quietly, open_trace_file
from .errors import Refused, refuse
from .native import Abandoned, native_shrink
from .shrink import Shrinker, header_order, stream_order


SERIES_POINTS = 720          # passes kept in mmleak.ID.series (older ones thinned out)
SERIES_SITES = 40            # call sites per pass in the series (the rest summed)
SERIES_INTERVAL = 10.0       # seconds between two points of the series (each reads the live set)


SeriesPoint = collections.namedtuple("SeriesPoint", "unix time live new freed sites")


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


def _site_keys(sh, stack_lines):
    """(key of a native group's stack, key of a list of callers): the call site as a point
    writes it, a caller in hex or @ID, the stack lines its keys use added to STACK_LINES."""
    by_frames = None

    def of_stack(st):
        # a stack of one frame: its caller; a stack without its "#s" line: NO_STACK's (as
        # the Python reading has them, parse_event, and the report, blocks._callers)
        if type(st) is not tuple and len(sh.stacks.get(st, NO_STACK)) == 1:
            st = sh.stacks.get(st, NO_STACK)
        if type(st) is tuple:
            return b"%x" % st[0]
        if st in sh.stack_lines:
            stack_lines[st] = sh.stack_lines[st]
        return b"@%x" % st

    def of_callers(callers):
        nonlocal by_frames
        if by_frames is None and len(callers) > 1:
            by_frames = {fr: sid for sid, fr in sh.stacks.items()}
        return _key_text(callers, stack_lines, sh, by_frames)
    return of_stack, of_callers


def _groups(native, table):
    """[(stack, old, blocks, bytes)] of the native blocks NATIVE per stack, OLD: in TABLE
    ((ptr, seq) arrays of the previous point's blocks; None: every group old, none new)."""
    if table is not None and len(table[0]):
        import ctypes
        n = len(table[0])
        ct = [(ctypes.c_uint64 * n).from_buffer(a) for a in table]
        return native.split(ct[0], ct[1], n)
    return [(st, table is None, nb, b) for st, _, nb, b, *_ in
            native.aggregate(0, (1 << 64) - 1)[0]]


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
                    problems.add(path, lineno, Q_BAD_SERIES, line)
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


def _live_now(directory, tid, stream=False, cancel=None, snap=None):
    """(Shrinker, blocks.Live): the trace's survivors now, as a report reads them: a native
    array when the compiled shrinker runs (no Python object per block), Alloc tuples
    otherwise.  A file it cannot read whole stops the point (Refused), as it stops a pass.
    STREAM: the compacted result (the biggest file, sorted) is read last, as a stream merged
    with the others' state (native_shrink STREAM_LAST: the same survivors; header lines in
    that order, which a point does not use).  CANCEL: see native_shrink (Abandoned).
    SNAP: (the trace's files, and what files.with_unflushed_tails made of them), when the
    caller has them (it removes their temporary directory)."""
    if snap is None:
        found = files.find_traces(directory, only=tid).get(tid, [])
        paths, names, tmpdir, refused = files.with_unflushed_tails(found)
    else:
        (found, paths, names, _, refused), tmpdir = snap, None
    # (the result alone, as when the trace is over and folded: streamed in any case, nothing
    # is read in another order)
    stream = stream or len(found) == 1
    given = names
    if stream:
        paths, names, stream = stream_order(paths, names)
    try:
        if refused:
            for msg in refused[1:]:
                refuse(msg)
            raise Refused(refused[0])
        sh = Shrinker()
        if not native_shrink(sh, paths, names, blocks=True, stream_last=stream, cancel=cancel):
            for p, name in zip(paths, names):
                sh.feed_path(p, name)
        if stream:
            header_order(sh, given)
        sh.check_single_process()
        return sh, sh.live()
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _in_table(ptr, seq, p, q):
    """Is (P, Q) in the sorted table PTR, SEQ?"""
    i = bisect.bisect_left(ptr, p)
    while i < len(ptr) and ptr[i] == p:
        if seq[i] == q:
            return True
        i += 1
    return False


def add_point(directory, tid, final=False, now=None, cancel=None):
    """Add one point to the series; the caller holds the trace's lock (a pass's, made shared
    once its inputs are deleted: no other compactor runs meanwhile).  FINAL: the
    trace is over: its last point, after which the .live is deleted.  Returns the point.

    It sums the live set per call site (in C, from the native blocks), splitting each site's
    blocks into those in the previous point's table of blocks (.live: their (address, SEQ),
    sorted) and the new ones; FREED follows from the previous point's sums (also in .live):
    previous + NEW - now.  No Python object per block, no pattern over the result.
    NOW: (Shrinker, blocks.Live) of the trace as its files hold it, when the caller has them
    (the last pass, which read the whole trace): the trace is not read again.  CANCEL: its
    reading of the trace stops when that says True (native.Abandoned: no point, nothing of
    it written)."""
    t = TraceFiles(directory, tid)
    spath, lpath = t.series, t.live
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
        _remove_quietly(base_path(directory, tid))
        return None
    live_stacks = pending[1] if pending is not None else {}
    ident = _identity(t.compact)
    if prev is not None and prev[3] and not _same_result(prev[2], ident):
        # the keys beside another result (a compactor killed between a merge into the result
        # and its update of the .live): no record of the previous point's blocks
        prev = None
    found = files.find_traces(directory, only=tid).get(tid, [])
    snap = files.with_unflushed_tails(found)
    try:
        sh, live, sites, stack_lines, keys, prev = _point_sites(
            directory, tid, t, found, snap, ident, prev, final, now, cancel)
    finally:
        if snap[2]:
            shutil.rmtree(snap[2], ignore_errors=True)
    other_freed = [0, 0]
    if prev is not None:
        sums = {}
        for k, (b, nb) in prev[1].items():
            if k.startswith(b"@") and len(sh.stacks.get(int(k[1:], 16), ())) == 1:
                k = b"%x" % sh.stacks[int(k[1:], 16)][0]    # as an older mmleak.py wrote it
            v = sums.get(k, (0, 0))
            sums[k] = (v[0] + b, v[1] + nb)
        for k, (b, nb) in sums.items():         # FREED = previous + NEW - now, per site
            v = sites[k]
            v[4] = b + v[2] - v[0]
            v[5] = nb + v[3] - v[1]
            if not v[1] and k.startswith(b"@"):
                sid = int(k[1:], 16)    # a stack whose blocks are all gone: its line
                if sid in live_stacks:
                    stack_lines.setdefault(sid, live_stacks[sid])
        for k in [k for k, v in sites.items() if not any(v)]:
            del sites[k]
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
    _save_live(lpath, None if final else live, sites, plines, stack_lines, final,
               None if final else ident, keys=None if final else keys)
    points.append(plines)
    have_stacks.update(stack_lines)
    if len(points) > SERIES_POINTS:
        points = _thin(points)
    _write_series(spath, tid, head, have_stacks, points)
    if final:
        _remove_quietly(lpath)
        _remove_quietly(base_path(directory, tid))
    stacks = {sid: parse_stack(line)[1] for sid, line in have_stacks.items()}
    return _series_point_of(plines[0], plines[1], stacks)


def _point_sites(directory, tid, t, found, snap, ident, prev, final, now, cancel):
    """(Shrinker, Live, {site key: [bytes, blocks, newb, newn, 0, 0]}, stack lines, keys for
    the .live, the previous point's record as it was used: PREV, or None when its partial
    keys could not be used) of a point: see add_point.  SNAP: with_unflushed_tails(FOUND),
    the trace's files now, which every reading here uses (the same events).  IDENT: the
    result's identity (None: no result).  KEYS: the partial keys the .live keeps
    ("#partial"): those of the blocks alive now allocated beside the result (in the files
    beside it), sorted; or None (the .live then keeps every block's)."""
    paths, names, _, refused = snap
    others = [q for q, p in zip(paths, found) if p != t.compact]
    partial = prev is not None and prev[3]
    excl = prev[4] if partial else None
    keys = None
    levels = ident is not None and t.compact in found and not refused
    sites = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    inc = None
    if now is None and levels and (prev is None or _same_result(prev[2], ident)):
        # from the levels (see level_sums), not the whole live set, when the result's base
        # is there
        base = load_base(directory, tid, t.compact)
        said = []                       # (said if the point is made of this reading)
        if base is not None:
            inc = level_sums(t.compact, base, others, excl[0] if excl else None, cancel,
                             said)
        if inc and (not final or partial):
            _given_up(cancel)
            keys = _keys_beside(inc[3], inc[4], cancel)
            inc = inc if keys is not None else None
        for problem in said if inc else ():
            Problems().say(*problem)
    if not inc and levels and (not final or partial):
        _given_up(cancel)
        keys = _keys_alone(others, cancel=cancel)
    _given_up(cancel)
    if partial and keys is None:
        prev, partial = None, False
    if inc:
        sums, stack_lines, sh, live, _ = inc
        _given_up(cancel)
        if partial:
            new = _new_partial(sh, live, keys, excl, prev[0], stack_lines)
        elif prev is not None:
            # NEW: blocks alive now not in the previous point's keys.  Those the files beside
            # the result do not touch are the result's, alive then too (the point saw the
            # same result, and the files it read beside it are beside it still, or in the
            # runs now): only their addresses count
            new = _new_sums(sh, live, prev[0], stack_lines)
        else:
            new = {}
        for k, v in new.items():
            sites[k][2], sites[k][3] = v
        for k, (b, nb) in sums.items():
            sites[k][0], sites[k][1] = b, nb
            if k.startswith(b"@") and int(k[1:], 16) in sh.stack_lines:
                # (a site of the base alone: its stack is among the result's, which the
                # picked lines carry)
                stack_lines.setdefault(int(k[1:], 16), sh.stack_lines[int(k[1:], 16)])
        return sh, live, sites, stack_lines, keys, prev
    sh, live = now if now is not None else _live_now(directory, tid, stream=True, cancel=cancel,
                                                      snap=(found,) + tuple(snap))
    # the call site of each group as the series writes it: a caller in hex, or @ID (stacks
    # the trace defines keep their id; a list of callers gets one of its own)
    stack_lines = {}
    key_of_stack, key_of_callers = _site_keys(sh, stack_lines)
    table = prev[0] if prev is not None and not partial else None   # the last point's keys
    if live.native is not None and len(live.native):
        for st, old, nb, b in _groups(live.native, table):
            v = sites[key_of_stack(st)]
            v[0] += b
            v[1] += nb
            if not old:
                v[2] += b
                v[3] += nb
    for a in live.allocs:               # the Python engine's survivors, and those of format 1
        v = sites[key_of_callers(a.callers)]
        v[0] += a.size
        v[1] += 1
        if table is not None and not _in_table(table[0], table[1], a.ptr, a.seq):
            v[2] += a.size
            v[3] += 1
    if partial:
        for k, v in _new_partial(sh, live, keys, excl, prev[0], stack_lines).items():
            sites[k][2], sites[k][3] = v
    return sh, live, sites, stack_lines, keys, prev


def _given_up(cancel):
    """Raise Abandoned when CANCEL (a function, or None) says so: a point's steps between
    its readings (each a C call that cannot stop halfway) ask it, as the readings do."""
    if cancel is not None and cancel():
        raise Abandoned()


def _keys_of(live):
    """The sorted keys ((ptr, seq) arrays) of LIVE's blocks, all native; None otherwise."""
    if live.allocs:
        return None
    if live.native is None or not len(live.native):
        return array.array("Q"), array.array("Q")
    return live.native.keys()


def _keys_beside(both, alone, cancel=None):
    """The keys of the blocks alive in BOTH (a reading of the files beside the result and
    of its lines at their addresses) that are not in ALONE (those lines read alone): the
    blocks alive now allocated beside the result (every block alive now allocated in it is
    alive in its lines read alone).  None when either is not all native blocks.  CANCEL:
    asked between the sorts (see _given_up): most of the heap beside the result, they are
    a point's longest steps after its readings.  BOTH and ALONE one reading (level_sums
    without runs): none, without sorting them."""
    from .native import keys_minus
    if both is alone:
        return None if both.allocs else (array.array("Q"), array.array("Q"))
    a = _keys_of(both)
    _given_up(cancel)
    b = _keys_of(alone)
    if a is None or b is None:
        return None
    _given_up(cancel)
    try:
        return keys_minus(a, b)
    except MemoryError:
        return None


def _keys_alone(paths, extra=None, cancel=None):
    """The sorted keys ((ptr, seq) arrays) of the survivors of PATHS read alone, and of the
    keys EXTRA ((ptr, seq) arrays) if any; None when the compiled shrinker cannot read them.
    CANCEL: see native_shrink (Abandoned)."""
    from .native import sorted_keys
    blocks = None
    if paths:
        # (quiet: the point, or the merge, that wants these keys reads the files too)
        got = _read_native(paths, cancel, [])
        if got is None or got[1].allocs:
            return None
        blocks = got[1].native if got[1].native is not None and len(got[1].native) else None
    try:
        return sorted_keys(blocks, *(extra or ((), ())))
    except MemoryError:
        return None


def _in_sums(sh, live, table, stack_lines):
    """{site key: [bytes, blocks]} of LIVE's blocks in TABLE ((ptr, seq) sorted arrays)."""
    out = collections.defaultdict(lambda: [0, 0])
    if not len(table[0]):
        return out
    key_of_stack, key_of_callers = _site_keys(sh, stack_lines)
    if live.native is not None and len(live.native):
        for st, old, nb, b in _groups(live.native, table):
            if old:
                v = out[key_of_stack(st)]
                v[0] += b
                v[1] += nb
    for a in live.allocs:
        if _in_table(table[0], table[1], a.ptr, a.seq):
            v = out[key_of_callers(a.callers)]
            v[0] += a.size
            v[1] += 1
    return out


def _new_partial(sh, live, keys, excl, prev_keys, stack_lines):
    """NEW per site against a previous point's partial keys PREV_KEYS (the survivors of the
    files then beside the same result, read alone): a block alive now was alive then unless
    it was allocated beside the result since, so the new blocks are among KEYS (the
    survivors of the files beside the result now, read alone) and EXCL (those of the files
    that merges into the result took in since; None: none), less those of the previous
    point.  A block alive now in PREV_KEYS was beside the result then: it is beside it now
    (in KEYS) or was merged into it since (in EXCL), hence in KEYS+EXCL minus in PREV_KEYS."""
    from .native import sorted_keys
    if excl is not None and len(excl[0]):
        keys = sorted_keys(None, keys[0] + excl[0], keys[1] + excl[1])
    plus = _in_sums(sh, live, keys, stack_lines)
    minus = _in_sums(sh, live, prev_keys, stack_lines)
    for k, (b, nb) in minus.items():
        plus[k][0] -= b
        plus[k][1] -= nb
    return {k: v for k, v in plus.items() if v[1] or v[0]}


def _live_keys(live):
    """The sorted (ptr, seq) of LIVE's blocks: two arrays of uint64 (C sorts the native
    ones)."""
    extra = [(a.ptr, a.seq) for a in live.allocs]
    if live.native is not None and len(live.native):
        return live.native.keys(extra)
    extra.sort()
    return array.array("Q", [p for p, _ in extra]), array.array("Q", [q for _, q in extra])


def _save_live(path, live, sites, plines, stack_lines, final=False, levels=None, keys=None):
    """The blocks of this point, for the next one to tell which are new and how many were
    freed per site: after the point's own lines ("#point", "#final" for the trace's last)
    and the stacks of their sites, every site's sums ("#site KEY BYTES BLOCKS") and the
    blocks' keys ("#keys N", then N addresses and N SEQs, 8 bytes each, native byte order,
    sorted).  LIVE None: no blocks (the trace's last point).  LEVELS: the identity of
    mmleak.ID.compact when the point was made ("#levels", see level_sums), if any.  KEYS:
    the partial keys of the point (see _point_sites), written instead of every block's,
    after "#partial"."""
    if keys is not None:
        ptr, seq = keys
    else:
        ptr, seq = _live_keys(live) if live is not None else ((), ())
    _write_live(path, final, plines, stack_lines, levels,
                {k: v[:2] for k, v in sites.items() if v[1]} if live is not None else None,
                (ptr, seq), keys is not None, None)


def _write_live(path, final, plines, stack_lines, levels, sums, keys, partial, excl,
                guard=None):
    """The .live's lines (see _save_live): SUMS {key: (bytes, blocks)} (None: no "#site"
    lines), KEYS (ptr, seq), PARTIAL, EXCL: keys that merges into the result brought in
    since the point ("#exclude N" and their 2N words, before "#keys"), or None."""
    ptr, seq = keys

    def fill(f):
        if final:
            f.write(b"#final\n")
        f.write(b"".join(b"#point " + line for line in [plines[0]] + plines[1]))
        f.write(b"".join(b"#point " + line for line in stack_lines.values()))
        if levels is not None:
            f.write(b"#levels %s\n" % levels)
        if partial:
            f.write(b"#partial\n")
        if sums is not None:
            f.write(b"".join(b"#site %s %d %d\n" % (k, v[0], v[1])
                             for k, v in sums.items() if v[1]))
        for tag, pair in ((b"#exclude", excl), (b"#keys", (ptr, seq))):
            if pair is None:
                continue
            p, q = pair
            f.write(b"%s %d\n" % (tag, len(p)))
            if len(p):
                f.write(memoryview(p).cast("B"))
                f.write(memoryview(q).cast("B"))
    files.replace(path, fill, guard=guard)


def _load_live(path):
    """(((ptr array, seq array): the sorted keys of the point's blocks, {site key: (bytes,
    blocks)}), the point it belongs to as ([p line, [k lines]], {stack id: line}, whether it
    was the trace's last)), or (None, None) without a usable file.  A .live of an older
    mmleak.py (a line per block: "PTR SEQ SIZE KEY") is read too.  LEVELS (third of the
    first): the "#levels" identity, or None; then whether the keys are partial ("#partial":
    see _point_sites) and the "#exclude" keys ((ptr, seq) arrays, or None)."""
    sums, plines, stacks, final, levels, partial, excl = {}, None, {}, False, None, False, None
    old = []
    ptr = seq = None
    lineno = 0
    if not _own_file(path):
        return None, None

    def damaged(what):
        # written whole (a temporary file renamed): not one a compactor left, but damaged
        # or another file at its name; the point goes on without it (see the caller), said
        # once (status 2, as any file of the trace a reader refuses)
        refuse("%s%s: not a usable .series.live (%s): taken as lost (the point counts every "
               "block alive as new)" % (path, ":%d" % lineno if lineno else "", what))
        return None, None
    try:
        with open_trace_file(path) as f:
            for line in iter(f.readline, b""):
                lineno += 1
                if line.startswith((b"#keys ", b"#exclude ")):
                    n = int(line.split()[1])
                    if 16 * n > os.fstat(f.fileno()).st_size:
                        return damaged("%d keys in a smaller file" % n)
                    ptr, seq = array.array("Q", bytes(8 * n)), array.array("Q", bytes(8 * n))
                    for a in (ptr, seq):
                        if n and f.readinto(memoryview(a).cast("B")) != 8 * n:
                            return damaged("its keys are cut short")
                    if line.startswith(b"#keys "):
                        break
                    excl, ptr, seq = (ptr, seq), None, None
                    continue
                if not line.endswith(b"\n"):
                    return damaged("a line without its end")
                if line.startswith(b"#"):
                    if line == b"#final\n":
                        final = True
                    elif line.startswith(b"#levels "):
                        levels = line[8:-1]
                    elif line == b"#partial\n":
                        partial = True
                    elif line.startswith(b"#site "):
                        _, k, b, nb = line.split()
                        sums[k] = (int(b), int(nb))
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
                p, q, size, k = line.split()          # an older .live: a line per block
                old.append((int(p, 16), int(q, 16)))
                v = sums.get(k, (0, 0))
                sums[k] = (v[0] + int(size, 16), v[1] + 1)
    except OSError:                     # (gone since: as if there were none)
        return None, None
    except ValueError:
        return damaged("a line not in its format")
    if plines is None:                  # (an older mmleak.py's, a line per block: lost)
        lineno = 0
        return (None, None) if old else damaged("no '#point p' line")
    if ptr is None:
        old.sort()
        ptr, seq = array.array("Q", [p for p, _ in old]), array.array("Q", [q for _, q in old])
    if partial and (levels is None or old):
        lineno = 0
        return damaged("'#partial' without its '#levels'")
    return ((ptr, seq), sums, levels, partial, excl), (plines, stacks, final)


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
    files.replace(spath, lambda f: f.write(
        (b"".join(head) if head else b"#series 1 id=%s\n" % tid.encode()) +
        b"".join(stack_lines[i] for i in sorted(used) if i in stack_lines) +
        b"".join(p + b"".join(ks) for p, ks in points)))


def point_due(directory, tid):
    """A point of the series costs a walk of the live set: one every SERIES_INTERVAL."""
    try:
        return time.time() - os.path.getmtime(TraceFiles(directory, tid).series) >= SERIES_INTERVAL
    except OSError:
        return True


# ---- a point from the levels (issue 19; while the trace runs too) -------------------------
#
# mmleak.ID.series.base: the per-site sums of mmleak.ID.compact's survivors read alone, written
# by the fold that wrote it (from that fold's own reading), and what ties them to it:
#   #base INODE SIZE MTIME_NS HEAD     HEAD: a hash of the result's header lines (its
#   #bsite KEY BYTES BLOCKS            "#compacted" and "#folded" lines among them)
#   #bend
# With it, a point is the base plus, at the addresses the files beside the result touch
# (its runs, the files being written), what they and the result's lines there leave minus
# what those lines alone left: the result's lines at those addresses are found in C
# (tools/levels.c, mmleak_levels_pick) and shrunk with the others; the rest of the result is
# not read.  Anything else (no base, a result changed since, a previous point's .live of
# another result, no compiled shrinker): the point reads the trace whole, as before.

def base_path(directory, tid):
    return TraceFiles(directory, tid).name("series.base")


def _identity(cpath):
    """(inode, size, mtime_ns, hash of the head lines) of the result CPATH, or None."""
    import hashlib
    if not _own_file(cpath):
        return None                     # (another user's file: said once by the pass, unread)
    try:
        with open_trace_file(cpath) as f:
            st = os.fstat(f.fileno())
            h = hashlib.blake2b(digest_size=16)
            for line in iter(f.readline, b""):
                if not line.startswith(b"#"):
                    break
                h.update(line)
    except OSError:
        return None
    return b"%d %d %d %s" % (st.st_ino, st.st_size, st.st_mtime_ns, h.hexdigest().encode())


def site_sums(sh, live):
    """({site key: [bytes, blocks]}, {stack id: '#s' line}) of the survivors LIVE (keys as a
    point writes them: a caller in hex, or @ID)."""
    sums = collections.defaultdict(lambda: [0, 0])
    stack_lines = {}
    key_of_stack, key_of_callers = _site_keys(sh, stack_lines)
    if live.native is not None and len(live.native):
        for st, _, nb, b in _groups(live.native, None):
            v = sums[key_of_stack(st)]
            v[0] += b
            v[1] += nb
    for a in live.allocs:
        v = sums[key_of_callers(a.callers)]
        v[0] += a.size
        v[1] += 1
    return sums, stack_lines


def save_base(directory, tid, cpath, sh, live, guard=None):
    """Write the base of the result CPATH just written, whose survivors read alone are LIVE."""
    ident = _identity(cpath)
    if ident is None:
        return
    sums, _ = site_sums(sh, live)
    _write_base(directory, tid, ident, sums, guard)


def _write_base(directory, tid, ident, sums, guard=None, path=None):
    files.replace(path or base_path(directory, tid), lambda f: f.write(
        b"#base " + ident + b"\n" +
        b"".join(b"#bsite %s %d %d\n" % (k, v[0], v[1]) for k, v in sums.items() if v[1]) +
        b"#bend\n"), guard=guard)


def load_base(directory, tid, cpath):
    """{site key: (bytes, blocks)} of the result CPATH read alone, or None: no base, or not
    the one of the result now there (a merge, a kill between the two writes, another
    mmleak.py), or damaged."""
    path = base_path(directory, tid)
    if not _own_file(path):
        return None
    try:
        with open_trace_file(path) as f:
            data = f.read()
    except OSError:
        return None
    lines = data.split(b"\n")
    if len(lines) < 3 or lines[-1] != b"" or lines[-2] != b"#bend" or \
            not lines[0].startswith(b"#base ") or lines[0][6:] != _identity(cpath):
        return None
    out = {}
    try:
        for line in lines[1:-2]:
            tag, k, b, nb = line.split()
            if tag != b"#bsite":
                return None
            out[k] = (int(b), int(nb))
    except ValueError:
        return None
    return out


def _pick(cpath, runs, out, extra=None):
    """Write to OUT (a file) the result's lines at the addresses RUNS touch and at the
    addresses EXTRA (an array of uint64), with its header, stacks and clock.  False when the
    compiled helper cannot."""
    import ctypes
    from .native import tools_library
    lib = tools_library()
    if not lib:
        return False
    try:
        fn = ctypes.CDLL(lib, use_errno=True).mmleak_levels_pick
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.c_int64, ctypes.c_int]
    fn.restype = ctypes.c_int64
    arr = (ctypes.c_char_p * max(len(runs), 1))(*[os.fsencode(p) for p in runs])
    n = len(extra) if extra is not None else 0
    xa = (ctypes.c_uint64 * max(n, 1)).from_buffer(array.array("Q", extra) if n
                                                    else array.array("Q", [0]))
    return fn(os.fsencode(cpath), arr, len(runs), xa, n, out.fileno()) >= 0


def _read_native(paths, cancel=None, said=None):
    """(Shrinker, Live) of PATHS read by the compiled shrinker, or None.  CANCEL: see
    native_shrink (Abandoned).  SAID (a list): the problems are kept there (the arguments of
    Problems.say), not said: a reading of files that another reading of the same command
    reads too says nothing (each warning once), or says them only if it is the one used."""
    sh = Shrinker()
    if said is not None:
        sh.problems.say = lambda *problem: said.append(problem)
    if not native_shrink(sh, paths, [os.path.basename(p) for p in paths], blocks=True,
                         cancel=cancel):
        return None
    if sh.problems.fatal or sh.problems.malformed:
        return None
    return sh, sh.live()


def level_sums(cpath, base, runs, extra=None, cancel=None, said=None):
    """(sums {key: [bytes, blocks]}, stack lines, (Shrinker, Live) of the runs and the
    result's picked lines, Live of those lines alone) of the levels CPATH and RUNS, from
    CPATH's BASE: BASE + (runs and the result's lines at their addresses) - (those lines
    alone).  RUNS: any dump files beside
    the result (the files still being written too).  EXTRA: more addresses to pick (an
    array).  None when it cannot.  CANCEL (a function): asked before the pick and as the
    readings go (native_shrink); True raises Abandoned (a point, or the base of a merge into
    the result, given up: `run`'s compactor once its program has ended).  SAID: see
    _read_native."""
    import tempfile
    with tempfile.NamedTemporaryFile(prefix="mmleak-pick.") as x:
        _given_up(cancel)
        if not _pick(cpath, runs, x, extra):
            return None
        x.flush()
        _given_up(cancel)
        both = _read_native(list(runs) + [x.name], cancel, said)
        # no runs (the last point after a merge of everything, its EXTRA addresses picked):
        # the two readings are one, and BOTH - ALONE is nothing
        alone = _read_native([x.name], cancel, []) if runs else both
    if both is None or alone is None:
        return None
    plus, stack_lines = site_sums(*both)
    minus = site_sums(*alone)[0] if alone is not both else plus
    sums = collections.defaultdict(lambda: [0, 0])
    for src, sign in ((base, 1), (plus, 1), (minus, -1)):
        for k, (b, nb) in src.items():
            sums[k][0] += sign * b
            sums[k][1] += sign * nb
    return ({k: v for k, v in sums.items() if v[1] or v[0]}, stack_lines, both[0], both[1],
            alone[1])


def incremental_ready(directory, tid):
    """Can the trace's last point come from its levels (see above)?  Its files are the
    result and runs only, no .live (a previous point's blocks: that point needs them), and
    the result's base is there and its own."""
    t = TraceFiles(directory, tid)
    lv = _live_levels(t.live)
    if lv is False:
        return None
    found = files.find_traces(directory, only=tid).get(tid, [])
    runs = [p for p in found if p != t.compact]
    if t.compact not in found or any(not files.RUN_RE.match(os.path.basename(p))
                                     for p in runs):
        return None
    if any(os.path.lexists(tail) for tail in (files.tail_of(p) for p in found) if tail):
        return None
    base = load_base(directory, tid, t.compact)
    if base is None or lv is not None and lv != _identity(t.compact):
        return None
    return t.compact, base, sorted(runs)


def _same_result(a, b):
    """Do the identities A and B (_identity) name the same result?  Its inode aside: a copy
    of the directory (cp -p, shutil.copytree) keeps the size, the modification time and the
    head lines, whose "#compacted" and "#folded" lines change at every merge."""
    return a is not None and b is not None and a.split()[1:] == b.split()[1:]


def _live_levels(lpath):
    """None: no .live; its "#levels" identity; False: a .live without one (an older
    mmleak.py's, or made before the result) or unreadable."""
    if not os.path.lexists(lpath):
        return None
    if not _own_file(lpath):
        return False
    try:
        with open_trace_file(lpath) as f:
            for line in iter(f.readline, b""):
                if line.startswith(b"#levels ") and line.endswith(b"\n"):
                    return line[8:-1]
                if not line.startswith(b"#") or line.startswith(b"#keys "):
                    break
    except OSError:
        pass
    return False


def _new_sums(sh, live, table, stack_lines):
    """{site key: (bytes, blocks)} of LIVE's blocks not in TABLE ((ptr, seq) arrays)."""
    out = collections.defaultdict(lambda: [0, 0])
    key_of_stack, key_of_callers = _site_keys(sh, stack_lines)
    if live.native is not None and len(live.native):
        for st, old, nb, b in _groups(live.native, table):
            if not old:
                v = out[key_of_stack(st)]
                v[0] += b
                v[1] += nb
    for a in live.allocs:
        if not _in_table(table[0], table[1], a.ptr, a.seq):
            v = out[key_of_callers(a.callers)]
            v[0] += a.size
            v[1] += 1
    return out


# ---- a merge into the result while the trace runs ------------------------------------------
#
# A merge into mmleak.ID.compact changes its identity: its base and a partial .live (see
# _point_sites) name the result they were made for.  The pass that merges brings both along:
# the new result's base is the old one plus what the merged files change at their addresses
# (level_sums, as a point computes it: the result is not read whole), and the .live's keys,
# partial, gain the survivors of the merged files read alone ("#exclude": blocks now in the
# result that may be newer than the point), under the new identity.  Both are written under
# names of their own (PENDING: .series.base.next, .series.live.next) once the new result is
# written and flushed, before its rename (stage_result_merge: its identity is the temporary
# file's, which the rename keeps), and renamed over the base and the .live after it.  A pass
# killed anywhere in between leaves them, and the next pass renames them in if they name the
# result there, or removes them (finish_result_merge): a kill between the result's rename
# and the .live's lost the .live (the next point counted every block alive as new, the
# previous point's as freed), and the base (the next point read the trace whole).

def before_result_merge(directory, tid, cpath, inputs, over=False, cancel=None):
    """What after_result_merge needs, computed before the merge of the dump files and runs
    INPUTS into the result CPATH (their paths, not the result's): the new base's sums (when
    the result has a base), the .live's exclusions (when its keys are partial and of this
    result).  Removes the base.  OVER: the trace is over (no base is written again: its
    last point reads what the merge left).  CANCEL: see level_sums (Abandoned: nothing
    changed, the base still there)."""
    t = TraceFiles(directory, tid)
    ident = _identity(cpath)
    if ident is None:
        return None
    base = load_base(directory, tid, cpath)
    lv = _load_live(t.live)
    lv = lv if lv[0] is not None and lv[0][3] and _same_result(lv[0][2], ident) else None
    out = {"base": base, "new_base": None, "live": lv, "excl": None, "over": over,
           "ident": ident}
    if base is None and lv is None:
        return out
    paths, _, tmpdir, refused = files.with_unflushed_tails(inputs)
    try:
        if refused:
            return out
        # (the trace over: no base is written again, the new one is not needed; the
        # .live's exclusions then come from the inputs read alone)
        # (quiet: the merge reads the same files, and says what they hold)
        got = level_sums(cpath, base, paths, None, cancel, []) if base is not None and \
            not over else None
        if got:
            out["new_base"] = got[0]
        if lv is not None:
            # the blocks alive after the merge that it brings into the result
            _given_up(cancel)
            new = _keys_beside(got[3], got[4], cancel) if got else None
            if new is None:
                out["excl"] = _keys_alone(paths, lv[0][4], cancel)
            else:
                from .native import sorted_keys
                old = lv[0][4] or (array.array("Q"), array.array("Q"))
                out["excl"] = sorted_keys(None, new[0] + old[0], new[1] + old[1])
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
    _remove_quietly(base_path(directory, tid))
    return out


def _pending(directory, tid):
    """[(pending name, the file it replaces)]: the base and the .live of a merge's new
    result, written before its rename (stage_result_merge)."""
    t = TraceFiles(directory, tid)
    return [(t.name("series.base.next"), base_path(directory, tid)),
            (t.name("series.live.next"), t.live)]


def _pending_identity(path):
    """The result identity the pending file PATH was written for, or None."""
    if not _own_file(path):
        return None
    try:
        with open_trace_file(path) as f:
            for line in iter(f.readline, b""):
                if line.startswith((b"#base ", b"#levels ")) and line.endswith(b"\n"):
                    return line.split(b" ", 1)[1][:-1]
                if not line.startswith(b"#") or line.startswith((b"#keys ", b"#exclude ")):
                    break
    except OSError:
        pass
    return None


def stage_result_merge(directory, tid, new, token, guard=None):
    """The merge's new result written and flushed as NEW (its temporary name), not renamed
    yet: the base and the .live it will have (TOKEN: before_result_merge's), written under
    their pending names (_pending), for that result's identity (the rename keeps it)."""
    if token is None:
        return
    ident = _identity(new)
    if ident is None:
        return
    (pbase, _), (plive, _) = _pending(directory, tid)
    if not token["over"] and token["new_base"] is not None:
        _write_base(directory, tid, ident, token["new_base"], guard, path=pbase)
    lv = token["live"]
    if lv is not None and token["excl"] is not None:
        (keys, lsums, _, _, _), (plines, stacks, final) = lv
        _write_live(plive, final, plines, stacks, ident, lsums, keys, True, token["excl"],
                    guard=guard)


def finish_result_merge(directory, tid, guard=None):
    """A pending base or .live (stage_result_merge) renamed over the file it replaces if it
    names the result now there (its merge's rename was made), else removed (the merge did not
    happen: the old base and .live are the result's).  Run by a pass before anything else,
    under the trace's lock: a pass killed after it staged them leaves them."""
    cpath = TraceFiles(directory, tid).compact
    ident = None
    for pending, final in _pending(directory, tid):
        if not os.path.lexists(pending):
            continue
        if ident is None:
            ident = _identity(cpath) or b""
        if _same_result(_pending_identity(pending), ident):
            with guard() if guard else contextlib.nullcontext():
                os.rename(pending, final)
        else:
            _remove_quietly(pending)


def after_result_merge(directory, tid, cpath, token, merged, guard=None):
    """After the merge (MERGED: it ended; else it was given up or failed, before or after
    its rename): the base and the .live staged for the new result put in place
    (finish_result_merge) if the result there is a new one, else the base written again for
    the result still there.  A .live without its exclusions, of the result merged, can no
    longer serve: it is removed, as lost."""
    if token is None:
        return
    t = TraceFiles(directory, tid)
    ident = _identity(cpath)
    if not _same_result(ident, token["ident"]):         # the merge's rename was made
        finish_result_merge(directory, tid, guard)
        if token["live"] is not None:
            now = _live_levels(t.live)
            if not (isinstance(now, bytes) and _same_result(now, ident)):
                _remove_quietly(t.live)
        return
    for pending, _ in _pending(directory, tid):
        _remove_quietly(pending)
    if token["base"] is not None and ident is not None:
        _write_base(directory, tid, ident, token["base"], guard)
