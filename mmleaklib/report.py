"""The report: a trace shrunk and symbolized, and its terminal, CSV and export views."""
import collections
import csv
import os
import re
import sys
import time

from . import elfcode, files
from .compact import READ_LOCK_WAIT, read_trace
from .dumpformat import header_int, read_head
from .errors import Fail, Refused, printable, refuse, warn
from .facts import MAX_DEPTH
from .files import TraceFiles, new_output
from .series import read_series
from .shrink import baseline_blocks, progress_printer
from . import suppressions as supp
from .blocks import Survivors, time_bounds
from .sites import (KIND_TEXT, KINDS, Wrappers, find_wrappers, growth_sites, hourly_rate,
                    human_bytes, incremental_sites, kind_summary, leak_sites, no_rate_reason,
                    site_resolver, sites_from_groups)
from .symbolize import ADDR_MASK, Maps, Symbolizer, _module_problem, frame_label


TRACE_ID_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def trace_head(paths):
    """(start, command) from the first lines of a trace's first readable file (None, None)."""
    for p in paths:
        try:
            with files.open_trace_file(p) as f:
                head = read_head(f, p)
        except (OSError, Fail):         # (Refused too; its reader says why)
            continue
        h = head["header"]
        return header_int(h, "start", None) if h else None, head["cmd"]
    return None, None


def process_images(traces, pid):
    """The trace ids of process PID in TRACES ({id: files}), oldest first.  mmleak.so names
    a process's first trace PID and the next ones PID-1, PID-2...: the image it exec'd (a
    service started through a shell is the shell first), a new attach, or a later process
    that got the same pid.  Ordered by the start time in their headers, then by number."""
    ids = [t for t in traces if TRACE_ID_RE.match(t) and TRACE_ID_RE.match(t).group(1) == pid]

    def key(t):
        start = trace_head(traces[t])[0] if traces[t] else None
        return (start if start is not None else -1, int(TRACE_ID_RE.match(t).group(2) or 0))
    return sorted(ids, key=key)


def owner_uid(directory, tid):
    owner = files.trace_owner(directory, tid)
    return owner[0] if owner else None


def whose(directory, tid):
    """ ", uid N's (NAME)" when trace TID is not the user's running this, else ""."""
    uid = owner_uid(directory, tid)
    if uid is None or uid == os.geteuid():
        return ""
    try:
        import pwd
        return ", uid %d's (%s)" % (uid, pwd.getpwuid(uid).pw_name)
    except KeyError:
        return ", uid %d's" % uid


def choose_trace(directory, pid=None, trace=None):
    """(trace id, files) to report.  TRACE: that trace id exactly.  PID: the process as it is
    now, or was last: its newest image with dump files (an id PID-K given as PID is taken
    exactly, as before --trace existed); a note on stderr names its earlier images.
    Neither: the trace written last.  The results' "#folded" lines are not read here: the
    trace's reader does it, under its lock (read_trace), so FILES may still hold inputs a
    stopped pass folded and did not delete."""
    traces = files.find_traces(directory, said=False, folded=False)
    try:
        tid, paths = _choose(traces, directory, pid, trace)
    except Fail:
        files.say_ignored(traces, trace or pid)     # (why it has no files, perhaps)
        raise
    files.say_ignored(traces, tid)              # (the other traces' are not ours to say)
    return tid, paths


def _choose(traces, directory, pid, trace):
    """choose_trace's choice among TRACES (find_traces)."""
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
                cmd = trace_head(traces[t])[1]
                return "%s (%s%s)" % (t, cmd if cmd else "no dump files yet"
                                      if not traces[t] else "command unknown",
                                      whose(directory, t))
            warn("pid %s: %d traces in %s, oldest first: %s; reporting %s, the newest with "
                 "dump files (another one: --trace ID)"
                 % (pid, len(images), directory, ", ".join(named(t) for t in images), newest))
        return newest, traces[newest]
    with_files = {k: v for k, v in traces.items() if v}
    if not with_files:
        raise Fail("no mmleak dump files in %s (a traced program writes them where "
                   "`run -d DIR` or MMLEAK_DIR says, /tmp by default)" % directory)
    if len(with_files) > 1:
        # In a shared directory anybody can make a trace that looks newer than yours (file
        # times are theirs to set): the newest of your own, if you have any there
        mine = {k: v for k, v in with_files.items() if owner_uid(directory, k) == os.geteuid()}
        pool = mine or with_files
        newest = max(pool, key=lambda k: max(os.path.getmtime(p) for p in pool[k]))
        warn("%d traces in %s (%s); reporting the newest%s, %s%s (choose with --pid or --trace)"
             % (len(with_files), directory, " ".join(sorted(with_files)),
                " of yours" if mine and len(mine) < len(with_files) else "", newest,
                whose(directory, newest)))
        return newest, with_files[newest]
    k = next(iter(with_files))
    return k, with_files[k]


def scan_kinds(directory, tid):
    """The kinds of the blocks of trace TID in DIRECTORY by its newest reachability scan:
    mmleaklib/scan.py's kinds_for (the scan's file: docs/format.rst), a mapping whose
    .get((ptr, seq), default) gives a block's kind, with .status ("done", or "unknown" and
    .reason why) and .attached.  None when this mmleak has no scanner."""
    try:
        from . import scan
    except ImportError:
        return None
    return scan.kinds_for(directory, tid)


def reachability(kinds):
    """(the kinds if a scan classified the trace, else None; a note on it or None)."""
    if kinds is None:
        return None, None
    if getattr(kinds, "status", "done") != "done":
        return None, getattr(kinds, "reason", None)
    if getattr(kinds, "attached", False):
        return kinds, ("an attached trace: the blocks allocated before the attach are not "
                       "known, and the memory they hold was taken as roots")
    return kinds, None


def build_report(directory, pid=None, progress=True, depth=None, since=None,
                 older_than=None, baseline=None, trace=None, kinds=None, wrappers=(),
                 detect_wrappers=True, debuginfo_path=(), now=None,
                 lock_wait=READ_LOCK_WAIT):
    """Shrink and symbolize one process's files; returns a dict the report renderers use.
    WRAPPERS: more allocation wrapper names (--wrappers); DETECT_WRAPPERS: find the
    program's own (report_wrappers); DEBUGINFO_PATH: more directories of separate debug
    information (--debuginfo-path, see symbolize.debuginfo_args).

    The incremental view: SINCE keeps survivors allocated at or after that many seconds
    from the trace start, OLDER_THAN those at least that old at the last event, BASELINE
    (a file written by an earlier `mmleak.py shrink` of the same process) those that were
    not alive yet in that snapshot.  PID and TRACE: see choose_trace.  KINDS: a per-block
    classification {(ptr, seq): kind} (the reachability scan's): the aggregates
    (rep["groups"]) are then per (stack, kind).  NOW: (Shrinker, blocks.Live) of the whole
    trace as a reading of it now would give them (`run --check`: from the compactor's last
    pass, compact._result_view), instead of reading it.  LOCK_WAIT: see read_trace.
    PROGRESS: the reading's and the symbolizing's progress on stderr: True on a terminal,
    "always" (--progress) there or not, False never."""
    tid, paths = choose_trace(directory, pid, trace)
    old = None
    if baseline is not None:            # (read first: one that is no snapshot stops it all)
        try:
            old = baseline_blocks(baseline)
        except OSError as e:
            raise Fail("--baseline %s: %s" % (baseline, e.strerror or e))
    prog = (progress_printer() if progress == "always" or (progress and sys.stderr.isatty())
            else None)
    t0 = time.monotonic()
    if now is not None:
        sh = now[0]
    else:
        sh, paths = read_trace(directory, tid, progress=prog, blocks=True, lock_wait=lock_wait)
    if prog and now is None and time.monotonic() - t0 > 1:
        prog(sh, paths[-1], 0, done=True)
    # the survivors stay native arrays (blocks.Live); the call sites come from per-stack
    # aggregates with the filters applied there, never a Python object per block
    live = sh.live()
    bounds = time_bounds(sh.max_time, since, older_than)
    tmin, tmax = bounds if bounds is not None else (1, 0)       # (1, 0): keeps nothing
    filters = []
    if since is not None:
        filters.append("allocated %gs or more after start" % since)
    if older_than is not None:
        filters.append("at least %gs old at the end" % older_than)
    if baseline is not None:
        filters.append("allocated since the snapshot %s" % baseline)
    # the kinds: those given (KINDS), else the newest reachability scan's, if any
    scan_note, scan_failed = None, False
    if kinds is None:
        k = scan_kinds(directory, tid)
        # a result that says no scan could be done (mmleak-scan not found, the process
        # could not be stopped...): its reason is news, unlike the usual "no scan ran"
        scan_failed = getattr(k, "scan", None) is not None and k.status != "done"
        kinds, scan_note = reachability(k)
        if k is not None and getattr(k, "scan", True) is None and sh.noscan:
            # no result, and the traced process kept why: news as well
            from .scan import no_result_text
            scan_note, scan_failed = no_result_text(*sh.noscan), True
    groups, totals, seen = live.aggregate(tmin, tmax, set(old) if old is not None else None,
                                          kinds)
    freed_since = [a for k, a in old.items() if k not in seen] if old is not None else None
    excl = old or ()
    survivors = Survivors(live, totals, lambda a: tmin <= a.time <= tmax and
                          (a.ptr, a.seq) not in excl)
    all_count, all_bytes = totals.all_blocks, totals.all_bytes
    hdr = sh.headers[0] if sh.headers else {}
    hist = sh.history()
    start = header_int(hdr, "start")
    trace_depth = max([MAX_DEPTH if h.get("depth") == "auto" else header_int(h, "depth", 1)
                       for h in sh.headers] or [1])
    names = TraceFiles(directory, tid)
    maps = names.maps
    frames = {}
    sym_error = maps_read = None
    try:
        series, _ = read_series(names.series, sh.problems)
    except Refused as e:                # replaced since it was looked at
        refuse(str(e))
        series = []
    addrs = {c for g in groups for c in g.callers}
    addrs |= {c for pt in series for k in pt.sites if k != "other" for c in k}
    addrs |= {c for a in freed_since or () for c in a.callers}
    addrs |= {f.caller for f in sh.foreign_frees()}
    if os.path.lexists(maps):
        try:
            sym = Symbolizer(maps, trace_start=start or None, debuginfo_path=debuginfo_path,
                             progress=progress == "always")
            frames = sym.lookup(sorted(addrs))
            sym_error = sym.tool_error
            maps_read = sym.maps        # (the wrappers' code reader reads no file again)
        except Refused as e:
            refuse(str(e))
            sym_error = str(e)
    else:
        sym_error = "maps file %s missing" % maps
    sh.problems.summary()
    rep = {
        # the reachability scan's kinds, {(ptr, seq): kind}, or None (no scan: "unknown")
        "scan_note": scan_note,
        "scan_failed": scan_failed,
        "kind_of": ((lambda a: kinds.get((a.ptr, a.seq), "unknown")) if kinds is not None
                    else None),
        "program_suppressions": sh.program_suppressions,
        "suppressed": [], "suppressed_total": (0, 0),
        # a program that sets its title pads its argv area with spaces (redis-server's
        # "redis-server *:6379" and 44 blanks): they would trail the report's first line
        "trace": tid, "pid": hdr.get("pid", tid.split("-")[0]),
        "cmd": sh.cmd.rstrip(" ") if sh.cmd else sh.cmd,
        "title": sh.title.rstrip(" ") if sh.title else sh.title,
        "start": start, "end_time": sh.max_time, "files": paths, "maps": maps,
        "maps_read": maps_read,
        # the whole history's, compacted events included (allocs and frees None when an
        # older compacted result did not count them); "folded": (events, files) compacted
        "events": hist["events"], "allocs": hist["allocs"], "frees": hist["frees"],
        "folded": (hist["folded_events"], hist["folded_files"]),
        "survivors": survivors, "foreign_frees": sh.foreign_frees(),
        "frames": frames, "symbol_error": sym_error, "depth": depth or trace_depth,
        "trace_depth": trace_depth, "shrinker": sh,
        "depth_auto": any(h.get("depth") == "auto" for h in sh.headers),
        "incomplete": bool(sh.problems.malformed or sh.problems.fatal or sh.gap_text()),
        "gaps": sh.gap_text(), "alloc": sh.alloc,
        "since": since, "older_than": older_than, "baseline": baseline,
        "freed_since_baseline": freed_since,
        "series": series,
        "filter": "; ".join(filters) or None,
        "unfiltered": (all_count, all_bytes),
        # per (stack, kind) aggregates of the survivors shown (blocks.Group), ordered by
        # the address of each one's first block; "live": every survivor (blocks.Live)
        "groups": groups, "live": live, "kinds": kinds,
        "wrappers": list(wrappers), "detect_wrappers": detect_wrappers,
        "debuginfo_path": list(debuginfo_path or ()),
    }
    rep["growth"] = growth_sites(series, frames, report_wrappers(rep), trace_depth) \
        if len(series) > 1 else None
    return rep


def report_stacks(rep):
    """The distinct stacks of REP (survivors, the series' keys, the blocks freed since the
    baseline), as the trace recorded them."""
    depth = rep["trace_depth"]
    if rep.get("groups") is not None:       # native blocks: one group per (stack, kind)
        st = {g.callers[:depth] for g in rep["groups"]}
    else:
        st = {a.callers[:depth] for a in rep["survivors"]}
    st |= {k[:depth] for pt in rep.get("series") or () for k in pt.sites if k != "other"}
    st |= {a.callers[:depth] for a in rep.get("freed_since_baseline") or ()}
    return sorted(st)


def report_wrappers(rep, extra=()):
    """The allocation wrappers of REP's sites (a sites.Wrappers): the known ones, REP's
    --wrappers and EXTRA, and, unless rep["detect_wrappers"] is false, the program's own
    found in its stacks and code (sites.find_wrappers; kept in rep["found_wrappers"])."""
    names = [n for n in list(rep.get("wrappers") or ()) + list(extra) if n]
    base = Wrappers(names)
    if not rep.get("detect_wrappers", True) or not rep.get("frames"):
        rep["found_wrappers"] = {}
        return base
    cache = rep.setdefault("found_wrappers_by_names", {})
    key = tuple(sorted(set(names)))
    if key not in cache:
        cache[key] = find_wrappers(report_stacks(rep), rep["frames"], base,
                                   CodeReader(rep.get("maps"), rep.get("start"),
                                              rep.get("debuginfo_path"),
                                              rep.get("maps_read")))
    rep["found_wrappers"] = cache[key]
    return Wrappers(names, cache[key])


class CodeReader:
    """Reads the code at a frame's return address in the object it is in, for
    sites.find_wrappers (elfcode.hands_back, elfcode.uses_result); (None, why) when that
    file changed since the run."""

    def __init__(self, maps_path, start=None, debug_dirs=(), maps=None):
        """MAPS: MAPS_PATH's Maps, read already (the symbolizer's), if any."""
        self.maps = maps if maps is not None else Maps(maps_path) \
            if maps_path and os.path.exists(maps_path) else Maps(None, [])
        self.start = start or None
        self.debug_dirs = tuple(debug_dirs or ())

    def _path(self, fr):
        real = fr.addr & ADDR_MASK
        hit = next((h for h in self.maps.find(real) if os.path.basename(h[4]) == fr.module
                    and real - h[0] + h[2] == fr.offset), None)
        if hit is None:
            return None, "not in a mapped file"
        why = _module_problem(hit[4], hit[3], self.start)
        return (None, why) if why else (hit[4], None)

    def hands_back(self, fr):
        path, why = self._path(fr)
        return elfcode.hands_back(path, fr.offset, self.debug_dirs) if path else (None, why)

    def uses_result(self, fr):
        path, why = self._path(fr)
        return elfcode.uses_result(path, fr.offset, self.debug_dirs) if path else (None, why)

    def read_ahead(self, frs):
        """Read the code around the frames FRS ahead, in few runs (elfcode.read_ahead)."""
        by_path = {}
        for fr in frs:
            path, _ = self._path(fr)
            if path:
                by_path.setdefault(path, []).append(fr.offset)
        for path, offsets in sorted(by_path.items()):
            elfcode.read_ahead(path, offsets, self.debug_dirs)

    def function_name(self, fr):
        """'module+0xSTART' for the function without a symbol around FR (a static function
        of a stripped object, read between its .eh_frame bounds), or None."""
        path, _ = self._path(fr)
        return elfcode.unnamed_function(path, fr.offset, self.debug_dirs) if path else None


def apply_suppressions(rep, rules):
    """Leave out of REP's survivors the blocks a suppression rule takes: a block of any kind
    but still reachable (no leak to suppress); the built-in rules only blocks a scan found
    lost or possibly lost (without a scan, a block of the runtime is reported as not freed,
    as it is).  The first rule (in RULES' order) that matches a frame of a block's stack
    takes it.  Applied per (stack, kind) aggregate when REP has them (rep["groups"]: never
    a pass over the blocks), else per block.  REP["suppressed"]: [(rule, blocks, bytes)] of
    the rules used, most bytes first; REP["suppressed_total"]: (blocks, bytes)."""
    if not rules:
        return rep
    user = supp.Matcher([r for r in rules if r.origin != "built-in"], rep["frames"])
    builtin = supp.Matcher([r for r in rules if r.origin == "built-in"], rep["frames"])

    def taken(st, kind, n, size):
        if user.rule_of(st) < 0 and builtin.rule_of(st) < 0:
            return False
        return kind != "reachable" and (user.take(st, size, n) or (
            kind != "unknown" and builtin.take(st, size, n)))
    if rep.get("groups") is not None:
        kept, gone = [], set()
        for g in rep["groups"]:
            if taken(g.callers, g.kind or "unknown", g.blocks, g.bytes):
                gone.add((g.callers, g.kind))
            else:
                kept.append(g)
        if gone:
            rep["groups"] = kept
            sv, kinds = rep["survivors"], rep.get("kinds")
            keep0 = sv.keep

            def keep(a):
                return keep0(a) and (a.callers, kinds.get((a.ptr, a.seq)) if kinds is not None
                                     else None) not in gone
            rep["survivors"] = Survivors(sv.live, sv.totals._replace(
                blocks=sum(g.blocks for g in kept), bytes=sum(g.bytes for g in kept)), keep)
    else:
        kind_of = rep.get("kind_of")
        rep["survivors"] = [a for a in rep["survivors"]
                            if not taken(a.callers, kind_of(a) if kind_of else "unknown", 1,
                                         a.size)]
    rep["suppressed"] = sorted(user.used() + builtin.used(),
                               key=lambda r: (-r[2], -r[1], r[0].origin))
    rep["suppressed_total"] = (sum(n for _, n, _ in rep["suppressed"]),
                               sum(b for _, _, b in rep["suppressed"]))
    return rep


def report_rules(rep, files=(), builtin=True):
    """The suppression rules of a report: --suppressions FILES, MMLEAK_SUPPRESSIONS, the
    program's __lsan_default_suppressions() (from the trace), the built-in list."""
    return supp.load(files, program=rep.get("program_suppressions"), builtin=builtin)


def kind_totals(rep):
    """{kind: [blocks, bytes]} of REP's survivors (after suppressions): from the per-(stack,
    kind) aggregates when REP has them, else from the blocks; computed once per list of
    survivors (the summary, the verdict and the CSV ask for it)."""
    src = rep.get("groups")
    if src is None:
        src = rep["survivors"]
    memo = rep.get("_kind_totals")
    if memo is None or memo[0] is not src:
        if rep.get("groups") is not None:
            tot = {k: [0, 0] for k in KINDS}
            for g in src:
                t = tot[g.kind or "unknown"]
                t[0] += g.blocks
                t[1] += g.bytes
        else:
            tot = kind_summary(src, rep.get("kind_of"))
        memo = rep["_kind_totals"] = (src, tot)
    return memo[1]


def check_failures(rep, kinds):
    """(blocks, bytes) of REP's survivors whose kind is in KINDS (the --check gate)."""
    tot = kind_totals(rep)
    return (sum(tot[k][0] for k in kinds), sum(tot[k][1] for k in kinds))


def reachability_note(rep):
    """The word on the trace's reachability scan above the leak summary (the text report's
    and the page's), or None: why the kinds are unknown, or what the scan said."""
    if rep.get("kinds") is None:
        return "reachability unknown: %s" % (
            rep.get("scan_note") or "no reachability scan of this trace, so the kind of "
            "every block is unknown")
    return rep.get("scan_note") or None


def print_kind_summary(rep, out):
    """valgrind's LEAK SUMMARY: a line per kind, and the suppressed blocks per rule."""
    out = terminal(out)
    tot = kind_totals(rep)
    note = reachability_note(rep)
    if note:
        out.write("  %s\n" % note)
    out.write("  leak summary:\n")
    for k in KINDS:
        if k == "unknown" and not tot[k][0] and rep.get("kinds") is not None:
            continue
        out.write("    %-22s %s in %d blocks\n" % (KIND_TEXT[k] + ":", bytes_text(tot[k][1]),
                                                 tot[k][0]))
    n, b = rep.get("suppressed_total") or (0, 0)
    out.write("    %-22s %s in %d blocks\n" % ("suppressed:", bytes_text(b), n))
    for rule, rn, rb in rep.get("suppressed") or ():
        out.write("      %s in %d blocks by leak:%s (%s)\n" % (bytes_text(rb), rn, rule.pattern,
                                                             rule.origin))


def bytes_text(n):
    return "%d bytes" % n if n < 1024 else "%d bytes (%s)" % (n, human_bytes(n))


def site_depth(rep):
    """Frames per call site: the report's --depth, at most the trace's own depth."""
    depth = int(rep.get("depth") or rep.get("trace_depth") or 1)
    return max(min(depth, int(rep.get("trace_depth") or depth)), 1)


def site_table(rep, stacks=None, wrappers=None):
    """The leak sites of REP (sites.leak_sites): what the terminal, the CSV and the HTML page
    show.  STACKS: see leak_sites; WRAPPERS: default, the report's (rep["wrappers"])."""
    if wrappers is None:
        wrappers = report_wrappers(rep)
    if rep.get("groups") is not None:
        return sites_from_groups(((g.callers, g.kind, g[2:]) for g in rep["groups"]),
                                 rep["end_time"],
                                 site_depth(rep), rep.get("frames"), wrappers, stacks)
    return leak_sites(rep["survivors"], rep["end_time"], site_depth(rep), rep.get("frames"),
                      wrappers, stacks, rep.get("kind_of"))


def live_bytes(survivors):
    """The bytes of SURVIVORS (blocks.Survivors knows them; a list is summed)."""
    b = getattr(survivors, "bytes", None)
    return b if b is not None else sum(a.size for a in survivors)


class Printable:
    """A text stream OUT whose lines are written printable(): every line of the terminal
    report goes through one (terminal)."""

    def __init__(self, out):
        self.out = out

    def write(self, text):
        return self.out.write("\n".join(printable(part) for part in text.split("\n")))

    def __getattr__(self, name):
        return getattr(self.out, name)


def terminal(out):
    """OUT, a stream the report is printed on, as a Printable (once)."""
    return out if isinstance(out, Printable) else Printable(out)


def print_top_sites(rep, out, top=10):
    out = terminal(out)
    surv = rep["survivors"]
    total = live_bytes(surv)
    title, cmd = printable(rep.get("title")), printable(rep["cmd"])
    shown = ("%s (started as: %s)" % (title, cmd) if title and cmd and
             title != cmd else title or cmd)
    out.write("mmleak: trace %s (pid %s)%s\n" % (rep["trace"], rep["pid"],
                                                ": " + shown if shown else ""))
    folded = rep.get("folded") or (0, 0)
    if folded[1]:
        read = "%d events (%d of them folded by compaction from %d files)" % (
            rep["events"], folded[0], folded[1])
    else:
        read = "%d events read from %d files" % (rep["events"], len(rep["files"]))
    # not freed: every block, the suppressed ones too (valgrind's "in use at exit"); the
    # leak summary says how many of them the suppressions took
    sn, sb = rep.get("suppressed_total") or (0, 0)
    out.write("  %s; %s in %d blocks not freed; %d frees of blocks allocated before tracing\n"
              % (read, human_bytes(total + sb), len(surv) + sn, len(rep["foreign_frees"])))
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
    print_found_wrappers(rep, out)
    scanned = rep.get("kinds") is not None
    if scanned or rep.get("suppressed") or rep.get("check"):
        print_kind_summary(rep, out)
    elif rep.get("scan_failed"):
        out.write("  reachability unknown: %s\n" % rep["scan_note"])
    sites = site_table(rep)
    if not sites:
        out.write("  no block matches the filter\n" if rep["filter"] else
                  "  no dump file of this trace: the program allocated nothing while traced, or "
                  "its files were removed\n"
                  if not rep["events"] and not rep["files"] else
                  "  no events in these dump files: nothing was traced (a dump file starts "
                  "with a '#mmleak' line)\n" if not rep["events"] else
                  "  no leaks: every block allocated while tracing was freed or suppressed\n"
                  if rep.get("suppressed") else
                  "  no leaks: every block allocated while tracing was freed\n")
        return sites
    shown = sites if rep.get("show_reachable") else [s for s in sites
                                                     if s.kind != "reachable"]
    hidden = len(sites) - len(shown)
    if not shown:
        # every block not freed is still reachable: no table (a header over nothing)
        out.write("  no leaks: every block not freed is still reachable; %d call site%s not "
                  "shown (--show-reachable)\n" % (hidden, "s"[:hidden > 1]))
        if rep.get("freed_since_baseline") is not None:
            print_incremental(rep, out, top)
        if rep.get("growth"):
            print_growth(rep, out, top)
        return sites
    wb = max([12] + [len(str(s.bytes)) for s in shown[:top]])
    wn = max([8] + [len(str(s.blocks)) for s in shown[:top]])
    # the kind column when a scan gave kinds (without one, every kind is "unknown")
    kcol = "%-10s " if scanned else "%.0s"
    out.write(("  %*s %*s  " + kcol + "%s\n") % (wb, "bytes", wn, "blocks", "kind", "call site"))
    labels = [frame_label(rep["frames"][s.caller]) if rep["frames"].get(s.caller)
              else "0x%x" % s.caller for s in shown]
    # the same label twice: the same source in two objects (plugins); not the same site
    # under two kinds
    objs = {}
    for s, l in zip(shown, labels):
        objs.setdefault(l, set()).add(s.caller)
    twice = {l for l, c in objs.items() if len(c) > 1}
    for s, label in zip(shown[:top], labels):
        fr = rep["frames"].get(s.caller)
        if label in twice and fr and fr.module:
            label += "  [%s]" % fr.module
        out.write(("  %*d %*d  " + kcol + "%s\n") % (wb, s.bytes, wn, s.blocks, s.kind, label))
    if len(shown) > top:
        out.write("  ... %d more call sites\n" % (len(shown) - top))
    if hidden:
        out.write("  %d call sites of still reachable blocks not shown (--show-reachable)\n"
                  % hidden)
    print_unsymbolized(rep, shown[:top], out)
    if rep.get("freed_since_baseline") is not None:
        print_incremental(rep, out, top)
    if rep.get("growth"):
        print_growth(rep, out, top)
    return sites


def print_unsymbolized(rep, shown, out):
    """Why call sites printed as module+offset were not symbolized when their object could
    not be used (rebuilt, replaced or removed since the run): a line per reason, as the
    page's Symbols note says; without it a rebuilt program's sites just turn into offsets.
    An object without symbols (stripped) is not named: module+offset says it."""
    why = collections.OrderedDict()
    for s in shown:
        fr = rep["frames"].get(s.caller)
        if fr and fr.error and not fr.function and not fr.file and \
                not fr.error.startswith("no symbol or line information"):
            why.setdefault(fr.error, []).append(s)
    for err, ss in list(why.items())[:3]:
        out.write("  %d call site%s not symbolized: %s\n" % (len(ss), "s"[:len(ss) > 1], err))


def found_wrapper_lines(rep, limit=None):
    """One line per allocation wrapper found in REP's program (report_wrappers): its name,
    the code evidence and where it was read, how many call sites above it the stacks show."""
    report_wrappers(rep)
    found = sorted(rep.get("found_wrappers", {}).values(), key=lambda f: (-f.callers, f.name))
    lines = []
    for f in found[:limit]:
        lines.append("%s: %s (at %s%s); %s" % (
            f.name, f.how, f.where, " and %d more" % (len(f.addrs) - 1) if len(f.addrs) > 1
            else "", "%d call site%s above it" % (f.callers, "s" if f.callers != 1 else "")))
    return lines, len(found)


def print_found_wrappers(rep, out, top=10):
    if not rep.get("detect_wrappers", True):
        out.write("  allocation wrappers: detection off (--no-wrapper-detection)\n")
        return
    lines, n = found_wrapper_lines(rep, top)
    if not n:
        return
    out.write("  allocation wrappers found (their callers are the call sites):\n")
    for line in lines:
        out.write("    %s\n" % line)
    if n > len(lines):
        out.write("    ... %d more\n" % (n - len(lines)))


def print_growth(rep, out, top=10):
    g = rep["growth"]
    pts = rep["series"]
    span = pts[-1].time - pts[0].time
    why = no_rate_reason(pts)
    out.write("  growth over %d points of the series (%s of the trace's time), by call site "
              "(live bytes first -> last%s):\n"
              % (len(pts), _duration(span), "; no rate per hour from %s" % why if why else ""))
    rows = sorted(((site, vals) for site, vals in g.items() if any(v[2] for v in vals)),
                  key=lambda kv: (-(kv[1][-1][2] - kv[1][0][2]), kv[0]))
    for site, vals in rows[:top]:
        fr = rep["frames"].get(site)
        d = vals[-1][2] - vals[0][2]
        rate = hourly_rate(d, pts)
        rate = " (%+.0f B/h)" % rate if rate is not None else ""
        out.write("  %12d -> %12d %+12d%s  %s\n" % (vals[0][2], vals[-1][2], d, rate,
                                                 frame_label(fr) if fr else "0x%x" % site))


def _duration(s):
    s = int(s)
    if s < 120:
        return "%d s" % s
    if s < 7200:
        return "%d min" % (s // 60)
    return "%.1f h" % (s / 3600.0)


def print_incremental(rep, out, top=10):
    rows = incremental_sites(rep, report_wrappers(rep))
    freed = rep["freed_since_baseline"]
    out.write("  since the snapshot %s: +%s in %d blocks allocated and still alive, -%s in %d "
              "blocks of the snapshot freed\n"
              % (rep["baseline"], human_bytes(live_bytes(rep["survivors"])),
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
    sites = site_table(rep)
    try:
        _write_csv(rep, sites, path)
    except OSError as e:
        raise Fail("cannot write %s: %s" % (path, e.strerror or e))


# A text cell a spreadsheet would take for a formula (OWASP "CSV injection"): a function
# name or a path is the traced program's, or whoever wrote its maps file
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(v):
    """V as a CSV cell no spreadsheet evaluates: a text that starts as a formula gets a
    single quote in front (shown as text, the quote hidden); numbers stay numbers."""
    return "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v


class _SafeWriter:
    def __init__(self, f):
        self.w = csv.writer(f)

    def writerow(self, row):
        self.w.writerow([csv_cell(v) for v in row])


def _write_csv(rep, sites, path):
    with new_output(path, text=True) as f:
        w = _SafeWriter(f)
        w.writerow(["bytes", "blocks", "mean", "min", "max", "oldest_s", "youngest_s",
                    "function", "file", "line", "module", "offset", "kind", "caller"])
        for s in sites:
            fr = rep["frames"].get(s.caller)
            w.writerow([s.bytes, s.blocks, s.bytes // s.blocks, s.min, s.max, s.oldest,
                        s.youngest, fr.function if fr else "", fr.file if fr else "",
                        fr.line if fr else "", fr.module if fr else "",
                        "0x%x" % fr.offset if fr and fr.offset is not None else "",
                        s.kind, "0x%x" % s.caller])
        if rep.get("kinds") is not None:
            # the summary (valgrind's LEAK SUMMARY): a row per kind, caller "total"
            for k, (n, b) in kind_totals(rep).items():
                w.writerow([b, n, b // n if n else 0, "", "", "", "", "", "", "", "", "", k,
                            "total"])


def export_model(rep, mx, allocator_frames=False, blocks=False):
    """The report REP as the model of export.py (module MX): one stack per distinct
    stack of the survivors (and kind, when the report knows blocks' kinds: rep["kind_of"],
    a function of an Alloc), ending at the call site the report names unless
    ALLOCATOR_FRAMES (then down to the allocator's caller); the mappings its frames are in,
    with build ids (of files unchanged since the run); with BLOCKS, each block's time and
    size (heaptrack's events).  Allocations per stack are not known (the shrink cancels
    them): alloc_* stay None."""
    frames = rep["frames"]
    resolve = site_resolver(frames, report_wrappers(rep))
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
                % (live_bytes(surv), len(surv), rep["events"])]
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
    from . import export as mx
    model = export_model(rep, mx, args.export_allocator_frames, blocks=bool(args.heaptrack))
    ok = True
    for kind, path in wanted:
        try:
            getattr(mx, "write_" + kind)(model, path)
        except Fail as e:               # the output's name is a directory, say
            warn(str(e))
            ok = False
            continue
        except (OSError, mx.ExportError) as e:
            warn("cannot write %s: %s" % (path, e.strerror if isinstance(e, OSError) and
                                          e.strerror else e))
            ok = False
            continue
        sys.stdout.write("%s: %s\n" % (kind, path))
    return ok
