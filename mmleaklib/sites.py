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
    def __init__(self, extra=()):
        self.names = set(WRAPPERS) | {w.strip() for w in extra if w.strip()}

    def __contains__(self, frame):
        if frame is None or not frame.function:
            return False
        return frame.function in self.names or base_name(frame.function) in self.names


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
    survivors grouped by call site (see site_resolver; with DEPTH > 1 and WRAPPERS, the
    first frame outside the wrappers); largest total first.  Each Site: its bytes, blocks,
    smallest and largest block, the ages (seconds at END_TIME, the last time seen in the
    dump) of its oldest and youngest block, its heaviest stack (the one with the most bytes,
    the first seen of those) and where the site is in it (INDEX), and how many stacks it has.

    KIND_OF: a function of a block -> its kind (KINDS); the sites are then (call site,
    kind) pairs, one row each, lost first (KIND_RANK), largest total first within a rank.
    Without it, every block's kind is "unknown".

    STACKS: a dict, filled with {stack (DEPTH frames): [bytes, blocks, site, index]} in the
    order the stacks were first seen (all kinds together)."""
    groups = {}
    resolve = site_resolver(frames, wrappers)
    stacks = {} if stacks is None else stacks
    for a in survivors:
        st = a.callers[:depth]
        per = stacks.get(st)
        if per is None:
            per = stacks[st] = [0, 0] + list(resolve(st))
        per[0] += a.size
        per[1] += 1
        key = (per[2], kind_of(a) if kind_of else "unknown")
        g = groups.get(key)
        age = max(end_time - a.time, 0)
        if g is None:
            groups[key] = [a.size, 1, a.size, a.size, age, age]
        else:
            g[0] += a.size
            g[1] += 1
            g[2] = min(g[2], a.size)
            g[3] = max(g[3], a.size)
            g[4] = max(g[4], age)
            g[5] = min(g[5], age)
    heaviest, count = {}, collections.Counter()
    for st, per in stacks.items():
        count[per[2]] += 1
        if per[2] not in heaviest or per[0] > stacks[heaviest[per[2]]][0]:
            heaviest[per[2]] = st
    sites = [Site(k, heaviest[k], *v, stacks[heaviest[k]][3], count[k], kind)
             for (k, kind), v in groups.items()]
    sites.sort(key=lambda s: (KIND_RANK[s.kind], -s.bytes, -s.blocks, s.caller, s.kind))
    return sites


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


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
