"""The survivors of a trace as the report reads them (issue 19): bytes, not objects.

Live holds a trace's survivors in two parts: the native array the compiled shrinker fills
(native.NativeBlocks, 48 bytes a block: address, SEQ, size, time, stack id or its one
caller; see tools/blocks.h) and a list of Alloc tuples (the Python engine's survivors, and the few of
format 1, whose callers are inline).  Live.aggregate sums them per (stack, kind) with the
report's filters: in C for the array, in Python (aggregate_allocs, the reference) for the
list, and the two are merged.  The report's call-site table (sites.sites_from_groups), the
terminal, the CSV and the page are computed from those groups: O(call sites) memory, never a
Python object per block.

A block is (address, SEQ): the key a per-block classification joins on.  KINDS, a mapping
{(ptr, seq): kind name} (the reachability scan's definite, indirect, possible, reachable,
unknown), splits every group by kind; a block not in it has kind None.
"""
import collections
import math

from .dumpformat import NO_STACK, Alloc

# One group: the blocks of one stack (and kind) that the filters keep.
Group = collections.namedtuple("Group", "callers kind blocks bytes min max min_time max_time "
                                        "min_ptr")
Totals = collections.namedtuple("Totals", "all_blocks all_bytes blocks bytes")
TIME_MAX = (1 << 64) - 1


def time_bounds(end_time, since=None, older_than=None):
    """The integer times [tmin, tmax] the report's filters keep, exactly as keep_blocks
    decides: time >= SINCE, END_TIME - time >= OLDER_THAN.  None when nothing can be kept."""
    tmin, tmax = 0, TIME_MAX
    if since is not None:
        tmin = max(int(math.ceil(since)), 0)
    if older_than is not None:
        lim = end_time - older_than
        if lim < 0:
            return None
        tmax = int(math.floor(lim))
    return (tmin, tmax) if tmin <= tmax else None


def aggregate_allocs(allocs, tmin=0, tmax=TIME_MAX, exclude=None, kinds=None, seen=None):
    """The reference: ALLOCS (Alloc tuples) per (callers, kind), in the order they are met
    ({key: [blocks, bytes, min, max, min_time, max_time, min_ptr]}), and the Totals.  SEEN
    (a set) receives the keys of EXCLUDE met among the blocks the time filter keeps."""
    groups = {}
    all_n = all_b = n = b = 0
    for a in allocs:
        all_n += 1
        all_b += a.size
        if a.time < tmin or a.time > tmax:
            continue
        if exclude is not None and (a.ptr, a.seq) in exclude:
            if seen is not None:
                seen.add((a.ptr, a.seq))
            continue
        n += 1
        b += a.size
        key = (a.callers, kinds.get((a.ptr, a.seq)) if kinds else None)
        g = groups.get(key)
        if g is None:
            groups[key] = [1, a.size, a.size, a.size, a.time, a.time, a.ptr]
        else:
            g[0] += 1
            g[1] += a.size
            g[2] = min(g[2], a.size)
            g[3] = max(g[3], a.size)
            g[4] = min(g[4], a.time)
            g[5] = max(g[5], a.time)
            g[6] = min(g[6], a.ptr)
    return groups, Totals(all_n, all_b, n, b)


def _callers(stacks, st):
    """The callers of a native block's stack: ST is a stack id, or (caller,) inline."""
    return st if type(st) is tuple else stacks.get(st, NO_STACK)


def _merge(into, key, g):
    h = into.get(key)
    if h is None:
        into[key] = list(g)
        return
    h[0] += g[0]
    h[1] += g[1]
    h[2] = min(h[2], g[2])
    h[3] = max(h[3], g[3])
    h[4] = min(h[4], g[4])
    h[5] = max(h[5], g[5])
    h[6] = min(h[6], g[6])


class Live:
    """A trace's survivors: NATIVE (native.NativeBlocks or None) and ALLOCS (Alloc tuples),
    STACKS the trace's {stack id: callers}."""

    def __init__(self, native, allocs, stacks):
        self.native, self.allocs, self.stacks = native, list(allocs), stacks

    def __len__(self):
        return (len(self.native) if self.native is not None else 0) + len(self.allocs)

    def aggregate(self, tmin=0, tmax=TIME_MAX, exclude=None, kinds=None):
        """([Group] ordered by the address of each group's first block, Totals, the keys
        of EXCLUDE alive among the blocks the time filter keeps)."""
        seen = set()
        merged, totals = aggregate_allocs(self.allocs, tmin, tmax, exclude, kinds, seen)
        if self.native is not None and len(self.native):
            ex = sorted(exclude) if exclude else None
            kt = None
            names = []
            if kinds and hasattr(kinds, "table"):
                # the scan's Kinds (scan.py): its sorted columns go to C as they are
                from .scan import KINDS as names
                names = list(names)
                a, s, k = kinds.table()
                kt = ("columns", a, s, k.translate(bytes(range(1, 256)) + b"\0"))
            elif kinds:
                # a dict: keys (ptr, seq), a kind each
                items = sorted(kinds.items())
                pairs = [p for p, _ in items]
                vals = [k for _, k in items]
                names = sorted({k for k in vals if k is not None})
                if len(names) > 254:
                    raise ValueError("more than 254 kinds")
                code = {k: i + 1 for i, k in enumerate(names)}
                kt = (pairs, [code.get(v, 0) for v in vals])
            groups, tot, flags = self.native.aggregate(tmin, tmax, ex, kt)
            seen.update(k for k, f in zip(ex or (), flags) if f)
            stacks = self.stacks
            for st, kind, n, b, lo, hi, t0, t1, p0 in groups:
                key = (_callers(stacks, st), names[kind - 1] if kind else None)
                _merge(merged, key, (n, b, lo, hi, t0, t1, p0))
            totals = Totals(*(x + y for x, y in zip(totals, tot)))
        out = [Group(k[0], k[1], *v) for k, v in merged.items()]
        out.sort(key=lambda g: g.min_ptr)
        return out, totals, seen

    def __iter__(self):
        """Every survivor as an Alloc, by address then SEQ (a Python object each: for small
        traces, and the exports that list every block)."""
        if self.native is None or not len(self.native):
            return iter(sorted(self.allocs))
        stacks = self.stacks
        every = [Alloc(p, s, size, t, _callers(stacks, st))
                 for p, s, size, t, st in self.native]
        every.extend(self.allocs)
        every.sort()
        return iter(every)

    def sample(self, most):
        """At most MOST survivors as Alloc tuples, evenly spread, ordered by time: what a
        chart of the blocks over time draws (the page stays bounded)."""
        if self.native is None or not len(self.native):
            allocs = sorted(self.allocs, key=lambda a: (a.time, a.ptr))
            step = max(-(-len(allocs) // most), 1) if most else 1
            return allocs[::step][:most]
        share = max(most * len(self.native) // max(len(self), 1), 1)
        stacks = self.stacks
        out = [Alloc(p, s, size, t, _callers(stacks, st))
               for p, s, size, t, st in self.native.sample(share)]
        step = max(-(-len(self.allocs) // max(most - share, 1)), 1)
        out.extend(self.allocs[::step])
        out.sort(key=lambda a: (a.time, a.ptr))
        return out[:most]


class Survivors:
    """The survivors a report shows (its filters applied), list-like: len() and the totals
    come from the aggregation; iterating makes an Alloc per block (sorted by address), for
    the views that need every block."""

    def __init__(self, live, totals, keep):
        self.live, self.totals, self.keep = live, totals, keep

    def __len__(self):
        return self.totals.blocks

    def __bool__(self):
        return self.totals.blocks > 0

    @property
    def bytes(self):
        return self.totals.bytes

    def __iter__(self):
        keep = self.keep
        return (a for a in self.live if keep(a))
