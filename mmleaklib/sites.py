"""Leak sites: survivors grouped by call site (leak_sites), the one table the terminal, the
CSV, the HTML page and the exports use; and the call-site policy behind it: what is the
runtime, what is an allocation wrapper (the lists are facts.py's), which frame names a site.
"""
import collections

from .facts import MAX_DEPTH, RUNTIME_RE, RUNTIME_SOURCES, WRAPPERS

Site = collections.namedtuple("Site", "caller stack bytes blocks min max oldest youngest "
                                      "index nstacks kind", defaults=("unknown",))

# A block's kind: valgrind memcheck's four (issue 20's reachability scan), or "unknown" where
# no scan ran (or the block was allocated after it).  The CSV's `kind` column, the pprof
# label, --leak-kinds take these names.
KINDS = ("definite", "indirect", "possible", "reachable", "unknown")
KIND_TEXT = {"definite": "definitely lost", "indirect": "indirectly lost",
             "possible": "possibly lost", "reachable": "still reachable",
             "unknown": "reachability unknown"}
# the order of the sites: lost first (definitely and indirectly, by bytes), then possibly
# lost, unknown, still reachable
KIND_RANK = {"definite": 0, "indirect": 0, "possible": 1, "unknown": 2, "reachable": 3}


def kind_summary(survivors, kind_of=None):
    """{kind: [blocks, bytes]} for every kind in KINDS (valgrind's LEAK SUMMARY)."""
    out = {k: [0, 0] for k in KINDS}
    for a in survivors:
        g = out[kind_of(a) if kind_of else "unknown"]
        g[0] += 1
        g[1] += a.size
    return out


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
    """The allocation wrappers a site is looked for beyond: facts.WRAPPERS, the names EXTRA
    (--wrappers), and FOUND (find_wrappers: {function: Found}), whose return addresses
    (FOUND's .addrs) are the frames passed through."""

    def __init__(self, extra=(), found=None):
        self.names = set(WRAPPERS) | {w.strip() for w in extra if w.strip()}
        self.found = dict(found or {})
        self.addrs = {a for f in self.found.values() for a in f.addrs}

    def __contains__(self, frame):
        if frame is None:
            return False
        if frame.addr in self.addrs:
            return True
        if not frame.function:
            return False
        return frame.function in self.names or base_name(frame.function) in self.names


# A function found to be an allocation wrapper: ADDRS, its return addresses (calls to the
# allocator or to another wrapper) whose code hands the block back; HOW, the evidence in
# words; WHERE, the first of them as 'module+0xoffset'; CALLERS, the distinct return
# addresses seen above them in the trace's stacks.
Found = collections.namedtuple("Found", "name addrs how where callers")


def find_wrappers(stacks, frames, wrappers, code):
    """The program's own allocation wrappers, found in the trace and in its code: {function
    name: Found}.  STACKS: the distinct stacks (tuples of return addresses, the allocator's
    caller first); FRAMES: their symbolized frames; WRAPPERS: the known ones (a Wrappers);
    CODE: reads the program's code at a frame's return address (report.CodeReader:
    .hands_back(frame) and .uses_result(frame), elfcode's verdicts (True/False/None, words)).

    A frame is a candidate when it is the first frame outside the runtime and the wrappers
    known so far, and the frame below it is the allocator's entry (the candidate is the
    stack's first frame) or a wrapper's.  A candidate is a pass-through frame, and its
    function a wrapper, when its code returns the block that call gave it, the call's size
    is not fixed in the code (a constructor: elfcode.fixed_size), and a caller seen above it
    in the stacks uses what it returned (a function that keeps the block and returns nothing
    may still hold it in rax; with no caller recorded, as in a depth-1 trace, it names no
    other site and is not taken).  Repeated until nothing changes, so a chain (zstrdup ->
    zmalloc -> ztrymalloc_usable -> malloc) is found link by link (docs/wrappers.rst).  A function of the distinct stacks only: the same stacks give the same
    wrappers, whatever the blocks."""
    verdicts = {}                       # return address -> (verdict, words)
    passing = set()
    stacks = list(stacks)
    above = collections.defaultdict(set)        # return address -> the callers above it
    for st in stacks:
        for j in range(len(st) - 1):
            above[st[j]].add(st[j + 1])
    used = {}

    def callers_use(c):
        """(a caller uses the value, words), over the callers of C's frame."""
        seen = sorted(above.get(c, ()))
        if not seen:                    # the stack ends there: naming it changes no site
            return False, "no caller recorded"
        for u in seen:
            if u not in used:
                fu = frames.get(u)
                used[u] = code.uses_result(fu) if fu is not None and fu.module else \
                    (None, "unknown")
            if used[u][0]:
                return True, "its callers use it"
        return False, "no caller uses what it returns"

    def known(fr):
        return is_runtime(fr) or fr in wrappers or (fr is not None and fr.addr in passing)

    def candidates():
        for st in stacks:
            for j, c in enumerate(st):
                fr = frames.get(c)
                if not known(fr):
                    break
            else:
                continue
            if fr is None or not fr.module or c in verdicts:
                continue
            below = frames.get(st[j - 1]) if j else None
            if j and not (below in wrappers or below.addr in passing):
                continue            # called the runtime for something else (stdio, qsort)
            yield c, fr

    changed = True
    while changed:
        changed = False
        if hasattr(code, "read_ahead"):
            # the code of this pass's candidates and their callers, in few objdump runs
            ahead = {c: fr for c, fr in candidates()}
            ahead.update((u, frames.get(u)) for c in list(ahead) for u in above.get(c, ())
                         if u not in used)
            code.read_ahead(fr for fr in ahead.values() if fr is not None and fr.module)
        for c, fr in candidates():
            ok, how = code.hands_back(fr)
            if ok:
                ok, why = callers_use(c)
                how = how + "; " + why if ok else why
            verdicts[c] = (ok, how)
            if ok:
                passing.add(c)
                changed = True
    found = {}
    for c in sorted(passing):
        fr = frames[c]
        # a static function of a stripped object is named by where it starts
        name = base_name(fr.function) if fr.function else \
            (getattr(code, "function_name", lambda f: None)(fr) or
             "%s+0x%x" % (fr.module, fr.offset))
        f = found.get(name)
        where = "%s+0x%x" % (fr.module, fr.offset)
        if f is None:
            found[name] = Found(name, (c,), verdicts[c][1], where, len(above.get(c, ())))
        else:
            found[name] = f._replace(addrs=f.addrs + (c,),
                                     callers=f.callers + len(above.get(c, ())))
    return found


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
    WRAPPERS (with one frame, the first frame; with every frame outside the runtime a
    wrapper's, the outermost of those: the stack was cut short), and callers that resolve to
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
            if not is_runtime(fr):
                if wrappers is None or fr not in wrappers:
                    i = j
                    break
                i = j           # none outside the wrappers: the outermost wrapper seen
        fr = frames.get(stack[i])
        if fr is None or not (fr.file and fr.line):
            return stack[i], i
        return canon[(fr.module, fr.function, fr.file, fr.line, fr.inlined)], i
    return resolve


def keep_blocks(survivors, end_time, since=None, older_than=None):
    """The survivors the filters keep (exactly, in integers): allocated SINCE seconds after
    the start or later, at least OLDER_THAN seconds old at END_TIME."""
    if since is not None:
        survivors = [a for a in survivors if a.time >= since]
    if older_than is not None:
        survivors = [a for a in survivors if end_time - a.time >= older_than]
    return survivors


def leak_sites(survivors, end_time, depth=1, frames=None, wrappers=None, stacks=None,
               kind_of=None):
    """THE table of leak sites, which the terminal, the CSV and the HTML page show: the
    survivors (Alloc tuples) grouped by call site; see sites_from_groups, which does it from
    per-stack aggregates (blocks.aggregate_allocs here, the compiled aggregation for a big
    trace: both give the same table).  KIND_OF: a function of a block -> its kind (KINDS);
    the sites are then (call site, kind) pairs."""
    from .blocks import aggregate_allocs

    class ByBlock:              # aggregate_allocs asks kinds.get((ptr, seq))
        def __init__(self, blocks):
            self.of = {(a.ptr, a.seq): kind_of(a) for a in blocks}

        def get(self, key, default=None):
            return self.of.get(key, default)

        def __bool__(self):
            return True
    if kind_of is not None:
        survivors = list(survivors)
        kinds = ByBlock(survivors)
    else:
        kinds = None
    groups, _ = aggregate_allocs(survivors, kinds=kinds)
    return sites_from_groups(((k[0], k[1], v) for k, v in groups.items()), end_time, depth,
                             frames, wrappers, stacks)


def sites_from_groups(groups, end_time, depth=1, frames=None, wrappers=None, stacks=None):
    """The leak sites (site_resolver; with DEPTH > 1 and WRAPPERS, the first frame outside
    the wrappers) of GROUPS, per-(stack, kind) aggregates (callers, kind or None,
    [blocks, bytes, min, max, min_time, max_time, ...]) in the order their stacks were first
    met.  Each Site: its bytes, blocks, smallest and largest block, the ages (seconds at
    END_TIME, the last time seen in the dump) of its oldest and youngest block, its heaviest
    stack (the one with the most bytes, the first met of those) and where the site is in it
    (INDEX), how many stacks it has, and its kind ("unknown" for None).  The sites are
    (call site, kind) pairs, one row each, lost first (KIND_RANK), largest total first
    within a rank.  O(stacks): never a Python object per block.

    STACKS: a dict, filled with {stack (DEPTH frames): [bytes, blocks, site, index]} in the
    order the stacks were first met (all kinds together)."""
    sums = {}
    resolve = site_resolver(frames, wrappers)
    stacks = {} if stacks is None else stacks
    for callers, kind, g in groups:
        n, b, lo, hi, t0, t1 = g[:6]
        st = callers[:depth]
        per = stacks.get(st)
        if per is None:
            per = stacks[st] = [0, 0] + list(resolve(st))
        per[0] += b
        per[1] += n
        key = (per[2], kind or "unknown")
        s = sums.get(key)
        old, young = max(end_time - t0, 0), max(end_time - t1, 0)
        if s is None:
            sums[key] = [b, n, lo, hi, old, young]
        else:
            s[0] += b
            s[1] += n
            s[2] = min(s[2], lo)
            s[3] = max(s[3], hi)
            s[4] = max(s[4], old)
            s[5] = min(s[5], young)
    heaviest, count = {}, collections.Counter()
    for st, per in stacks.items():
        count[per[2]] += 1
        if per[2] not in heaviest or per[0] > stacks[heaviest[per[2]]][0]:
            heaviest[per[2]] = st
    sites = [Site(k, heaviest[k], *v, stacks[heaviest[k]][3], count[k], kind)
             for (k, kind), v in sums.items()]
    sites.sort(key=lambda s: (KIND_RANK[s.kind], -s.bytes, -s.blocks, s.caller, s.kind))
    return sites


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


# A rate per hour only from a series that spans a minute or more in 3 points or more: the
# change of 2 points 2 seconds apart (a short run's first and last) made "+130867200 B/h",
# an hour extrapolated from a start-up.
RATE_MIN_SPAN = 60
RATE_MIN_POINTS = 3


def no_rate_reason(points):
    """None when the series POINTS gives a rate per hour, else why it does not (a phrase)."""
    if len(points) < RATE_MIN_POINTS:
        return "fewer than %d points" % RATE_MIN_POINTS
    if points[-1].time - points[0].time < RATE_MIN_SPAN:
        return "a series shorter than %d s" % RATE_MIN_SPAN
    return None


def hourly_rate(change, points):
    """CHANGE (bytes, first point to last) per hour of the series POINTS (a float), or None
    (no_rate_reason)."""
    if no_rate_reason(points):
        return None
    return change * 3600.0 / (points[-1].time - points[0].time)


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


def incremental_sites(rep, wrappers=None):
    """Per call site, since the --baseline snapshot: (+bytes, +blocks) allocated since and
    still alive, (-bytes, -blocks) alive in the snapshot and freed since; largest change
    first.  Returns [(caller, plus_bytes, plus_blocks, minus_bytes, minus_blocks)]."""
    resolve = site_resolver(rep["frames"], wrappers or Wrappers(rep.get("wrappers") or ()))
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
