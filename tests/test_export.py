"""Exports (issue #22, part 3): `mmleak.py report --pprof/--folded/--heaptrack` against the
clients that read them.

Run: /usr/bin/python3 -m pytest tests/test_export.py

A program with known leaks (tests/export_leaks.c; and make demo's tests/demo_leaky.cpp) runs
under mmleak.so; `mmleak.py report` writes its CSV (mmleak's own call-site table) and the three
exports; then `go tool pprof` (golang-go), `heaptrack_print` (heaptrack) and a parser of the
folded format must give exactly the CSV's sites, bytes and blocks: for a finished trace, a
compacted one and one whose process still runs.  The protobuf is also decoded here, by a
small decoder of its own, to check what the clients do not print (sample types, default,
period, build ids, has_* flags, inline levels, labels).  .ci/run installs golang-go and
heaptrack; without them those checks are skipped, with the reason.
"""
import collections
import csv
import gzip
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

import pytest

from conftest import LIB, ROOT, TESTS, mmleak, site_line

from mmleaklib import export as mx

PY = "/usr/bin/python3"
MMLEAK = os.path.join(ROOT, "mmleak.py")
SRC = os.path.join(TESTS, "export_leaks.c")
GO = shutil.which("go")
HEAPTRACK_PRINT = shutil.which("heaptrack_print")

# (function, marker, bytes, blocks) of tests/export_leaks.c (its header says why)
FINISHED = [
    ("grow", "realloc", 1024, 1),
    ("two_sites", "two_b", 600, 2),
    ("two_sites", "two_a", 300, 3),
    ("intern", "xmalloc_call", 200, 5),
    ("keep_name", "strdup", 168, 7),
    ("fill_in", "calloc", 64, 1),
]
WITH_LATE = FINISHED + [("late", "late", 4000, 4)]
INLINED = {"fill_in": "make_table"}


def clients_checked():
    """Called at the end of a test whose checks by go tool pprof or heaptrack_print ran only
    where those are installed: the test is skipped, with the reason, if one was missing (after
    every other check of it passed); under CI (CI=true, .ci/run installs both) it fails."""
    missing = [n for n, p in (("go (golang-go)", GO), ("heaptrack_print (heaptrack)",
                                                        HEAPTRACK_PRINT)) if not p]
    if not missing:
        return
    why = "%s not installed: not checked by %s (apt-get install golang-go heaptrack; " \
          ".ci/run installs them)" % (" and ".join(missing), "them" if len(missing) > 1
                                      else "it")
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


# ---------------------------------------------------------------------------------------
# A tiny protobuf decoder (wire format only), to read the profile back
# ---------------------------------------------------------------------------------------

def varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def fields(buf):
    """(field, wire type, value) of one message: ints for varints, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 2:
            n, i = varint(buf, i)
            v = bytes(buf[i:i + n])
            assert len(v) == n, "truncated field %d" % f
            i += n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise AssertionError("wire type %d" % wt)
        yield f, wt, v


def ints(wt, v):
    """A repeated integer field's values, packed or not."""
    if wt == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        n, i = varint(v, i)
        out.append(n)
    return out


def decode_profile(data):
    """profile.proto -> dict of plain Python values, strings resolved."""
    raw = collections.defaultdict(list)
    for f, wt, v in fields(data):
        raw[f].append((wt, v))
    st = [v.decode("utf-8") for _, v in raw[6]]
    assert st and st[0] == ""

    def msg(v):
        d = collections.defaultdict(list)
        for f, wt, x in fields(v):
            d[f].append((wt, x))
        return d

    def one(d, f):
        return d[f][-1][1] if d[f] else 0

    p = {"strings": st}
    p["sample_type"] = [(st[one(m, 1)], st[one(m, 2)]) for m in map(msg, (v for _, v in raw[1]))]
    p["samples"] = []
    for _, v in raw[2]:
        m = msg(v)
        locs = [x for wt, b in m[1] for x in ints(wt, b)]
        vals = [x for wt, b in m[2] for x in ints(wt, b)]
        labels = [(st[one(lm, 1)], st[one(lm, 2)]) for lm in (msg(b) for _, b in m[3])]
        p["samples"].append((locs, vals, labels))
    p["mappings"] = {}
    for _, v in raw[3]:
        m = msg(v)
        p["mappings"][one(m, 1)] = {
            "start": one(m, 2), "limit": one(m, 3), "offset": one(m, 4),
            "file": st[one(m, 5)], "build_id": st[one(m, 6)],
            "flags": tuple(one(m, k) for k in (7, 8, 9, 10))}
    p["locations"] = {}
    for _, v in raw[4]:
        m = msg(v)
        lines = [(one(lm, 1), one(lm, 2)) for lm in (msg(b) for _, b in m[4])]
        p["locations"][one(m, 1)] = {"mapping": one(m, 2), "address": one(m, 3),
                                     "lines": lines}
    p["functions"] = {}
    for _, v in raw[5]:
        m = msg(v)
        p["functions"][one(m, 1)] = (st[one(m, 2)], st[one(m, 3)], st[one(m, 4)])
    for k, f in (("time_nanos", 9), ("duration_nanos", 10), ("period", 12),
                 ("default_sample_type", 14)):
        p[k] = raw[f][-1][1] if raw[f] else 0
    p["period_type"] = tuple(st[one(msg(v), k)] for _, v in raw[11] for k in (1, 2))
    p["comments"] = [st[x] for wt, v in raw[13] for x in ints(wt, v)]
    p["default_sample_type"] = st[p["default_sample_type"]]
    return p


def stack_levels(p, locs):
    """[(function, file, line)] of a sample's locations, leaf first, inline levels inline."""
    out = []
    for lid in locs:
        for fid, line in p["locations"][lid]["lines"]:
            name, _, fl = p["functions"][fid]
            out.append((name, fl, line))
    return out


# ---------------------------------------------------------------------------------------
# Running the program, the report and the clients
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prog(tmp_path_factory, lib):
    d = tmp_path_factory.mktemp("export")
    exe = str(d / "export_leaks")
    subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", exe, SRC], check=True)
    return exe


def traced_env(dump, **kw):
    e = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump), MMLEAK_SCAN="0")
    e.update({k: str(v) for k, v in kw.items()})
    return e


def only_trace(dump):
    t = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    assert len(t) == 1, t
    return t[0]


def report(dump, out, *extra, expect_status=0):
    """`mmleak.py report DUMP --csv --pprof --folded --heaptrack` into directory OUT;
    returns {csv, pprof, folded, heaptrack: path} and the CSV's rows."""
    out.mkdir(exist_ok=True)
    paths = {"csv": str(out / "sites.csv"), "pprof": str(out / "leaks.pb.gz"),
             "folded": str(out / "leaks.folded"), "heaptrack": str(out / "leaks.heaptrack.gz")}
    argv = [PY, MMLEAK, "report", str(dump), "--no-html", "--top", "100"]
    for k, v in paths.items():
        argv += ["--" + k, v]
    r = subprocess.run(argv + list(extra), capture_output=True, text=True)
    assert r.returncode == expect_status, r.stderr
    for k in ("pprof", "folded", "heaptrack"):
        assert "%s: %s\n" % (k, paths[k]) in r.stdout
    with open(paths["csv"], newline="") as f:
        rows = [dict(r, bytes=int(r["bytes"]), blocks=int(r["blocks"]),
                     line=int(r["line"]) if r["line"] else None) for r in csv.DictReader(f)]
    return paths, rows


def expected_rows(spec, source=SRC):
    return sorted((fn, source, site_line(os.path.basename(source), marker), b, n)
                  for fn, marker, b, n in spec)


def site_table(rows):
    """mmleak's CSV as [(name, file, line, bytes, blocks)], sorted: NAME the function, or
    for a site without one, what the exports call it (object+offset); FILE None if none."""
    return sorted((r["function"] or "%s+%s" % (r["module"], r["offset"]), r["file"] or None,
                   r["line"], r["bytes"], r["blocks"]) for r in rows)


def pprof_name(t):
    """How go tool pprof -lines names site T (name, file, line, ...)."""
    return "%s %s:%d" % t[:3] if t[1] else t[0]


def flame_name(t):
    """How heaptrack_print's flame graph names site T."""
    return "%s (%s)" % (t[0], os.path.basename(t[1])) if t[1] else t[0]


def go_env(tmp):
    home = os.path.join(str(tmp), "gohome")
    os.makedirs(home, exist_ok=True)
    return dict(os.environ, HOME=home, GOCACHE=os.path.join(home, "cache"), PPROF_TMPDIR=home,
                GOFLAGS="", GOTOOLCHAIN="local")


def pprof(path, tmp, *args):
    r = subprocess.run([GO, "tool", "pprof", "-unit=B", "-nodefraction=0",
                        "-edgefraction=0"] + list(args) + [path],
                       capture_output=True, text=True, env=go_env(tmp), timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


TOP_ROW = re.compile(r"^\s*(\d+)B?\s+[\d.]+%\s+[\d.]+%\s+(\d+)B?\s+[\d.]+%\s+(.*)$")


def pprof_top(path, tmp, index, lines=False):
    """{name: flat} of the rows of `go tool pprof -top` with a flat value (name with
    ' FILE:LINE' with LINES; without the ' (inline)' of code inlined into a caller)."""
    out = pprof(path, tmp, "-top", "-sample_index=" + index, *(["-lines"] if lines else []))
    got = {}
    for line in out.splitlines():
        m = TOP_ROW.match(line)
        if m and int(m.group(1)):
            name = m.group(3)[:-len(" (inline)")] if m.group(3).endswith(" (inline)") \
                else m.group(3)
            assert name not in got, line
            got[name] = int(m.group(1))
    return got, out


def pprof_traces(path, tmp, index):
    """[(value, [frame lines, leaf first])] of `go tool pprof -traces -lines`."""
    out = pprof(path, tmp, "-traces", "-lines", "-sample_index=" + index)
    traces = []
    for block in out.split("-----------+-------------------------------------------------------")[1:]:
        lines = [l for l in block.splitlines() if l.strip()]
        if not lines:
            continue
        m = re.match(r"^\s*(\d+)B?\s+(.*)$", lines[0])
        assert m, block
        traces.append((int(m.group(1)), [m.group(2).strip()] + [l.strip() for l in lines[1:]]))
    return traces


def ht_bytes(n):
    """heaptrack_print's formatBytes (src/analyze/print/heaptrack_print.cpp)."""
    b, i = float(n), 0
    while i < 4 and abs(b) > 1000.0:
        b /= 1000.0
        i += 1
    return "%dB" % n if i == 0 else "%.2f%s" % (b, "BKMGT"[i])


def heaptrack(path, tmp):
    """heaptrack_print on PATH: (stdout, {(function, file, line): (bytes text, calls)} of its
    MEMORY LEAKS section, {leaf 'function (file)': exact leaked bytes} of its flame graph)."""
    flame = os.path.join(str(tmp), "ht.flame")
    r = subprocess.run([HEAPTRACK_PRINT, "--print-leaks=1", "--print-peaks=0",
                        "--print-allocators=0", "--print-temporary=0", "--peak-limit=10000",
                        "--shorten-templates=0", "--print-flamegraph", flame,
                        "--flamegraph-cost-type", "leaked", path],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "failed to parse" not in r.stderr and "Failed" not in r.stderr, r.stderr
    leaks = {}
    sect = r.stdout[r.stdout.index("MEMORY LEAKS\n"):]
    for m in re.finditer(r"^(\S+) leaked over (\d+) calls from\n(.*)\n(?:  at (.*):(\d+)\n)?"
                         r"  in (.*)\n", sect, re.M):
        key = (m.group(3), m.group(4), int(m.group(5)) if m.group(5) else None)
        assert key not in leaks, key
        leaks[key] = (m.group(1), int(m.group(2)))
    flames = collections.Counter()
    with open(flame) as f:
        for line in f:
            stack, n = line.rstrip("\n").rsplit(" ", 1)
            flames[stack.rstrip(";").split(";")[-1]] += int(n)
    return r.stdout, leaks, flames


def read_folded(path):
    with open(path, "rb") as f:
        data = f.read().decode("utf-8")
    out = []
    for line in data.split("\n")[:-1]:
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        assert all(frames), line
        out.append((frames, int(n)))
    assert data == "" or data.endswith("\n")
    return out


def readelf_build_id(path):
    r = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, check=True)
    return re.search(r"Build ID: ([0-9a-f]+)", r.stdout).group(1)


def check_exports(paths, rows, tmp, exe=None, inlined=None):
    """Every export against mmleak's own CSV ROWS: the same sites, bytes and blocks.
    INLINED: {function: the function it is inlined into} of the sites that are inlined
    (heaptrack_print's flame graph writes a location's levels innermost first, so there the
    last name of such a site is the outer function's)."""
    inlined = inlined or {}
    table = site_table(rows)
    total_b = sum(r["bytes"] for r in rows)
    total_n = sum(r["blocks"] for r in rows)
    by_fn = collections.Counter()
    by_fn_n = collections.Counter()
    for fn, fl, ln, b, n in table:
        by_fn[fn] += b
        by_fn_n[fn] += n

    # pprof, decoded here
    with gzip.open(paths["pprof"]) as f:
        p = decode_profile(f.read())
    assert p["sample_type"] == [("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert p["default_sample_type"] == "inuse_space"
    assert p["period"] == 1 and p["period_type"] == ("space", "bytes")
    assert sum(v[1] for _, v, _ in p["samples"]) == total_b
    assert sum(v[0] for _, v, _ in p["samples"]) == total_n
    assert all(m["flags"] == (1, 1, 1, 1) for m in p["mappings"].values())
    for loc in p["locations"].values():
        assert loc["lines"], loc                   # every location symbolized, or named
        assert loc["mapping"] in p["mappings"]
    if exe:
        mine = [m for m in p["mappings"].values() if m["file"] == exe]
        assert len(mine) == 1 and mine[0]["build_id"] == readelf_build_id(exe)
    leaf_sites = collections.Counter()
    for locs, v, _ in p["samples"]:
        fn, fl, ln = stack_levels(p, locs)[0]
        leaf_sites[(fn, fl or None, ln or None)] += v[1]
    exp = collections.Counter()
    for fn, fl, ln, b, n in table:
        exp[(fn, fl, ln)] += b
    assert leaf_sites == exp

    # go tool pprof
    if GO:
        for index, want in (("inuse_space", 3), ("inuse_objects", 4)):
            got, out = pprof_top(paths["pprof"], tmp, index, lines=True)
            exp = collections.Counter()
            for t in table:
                exp[pprof_name(t)] += t[want]
            assert got == dict(exp), out
        got, out = pprof_top(paths["pprof"], tmp, "inuse_space")
        assert got == dict(by_fn), out
        got, out = pprof_top(paths["pprof"], tmp, "inuse_objects")
        assert got == dict(by_fn_n), out
        for index, want in (("inuse_space", 3), ("inuse_objects", 4)):
            leaf = collections.Counter()
            for n, frames in pprof_traces(paths["pprof"], tmp, index):
                leaf[frames[0].replace(" (inline)", "")] += n
            exp = collections.Counter()
            for t in table:
                exp[pprof_name(t)] += t[want]
            assert leaf == exp

    # heaptrack_print
    if HEAPTRACK_PRINT:
        out, leaks, flames = heaptrack(paths["heaptrack"], tmp)
        assert "total memory leaked: %s\n" % ht_bytes(total_b) in out
        assert "calls to allocation functions: %d " % total_n in out
        assert sum(flames.values()) == total_b
        exp = {}
        for fn, fl, ln, b, n in table:
            exp[(fn, fl, ln)] = (ht_bytes(b), n)
        assert leaks == exp, out
        exp_flames = collections.Counter()
        for t in table:
            exp_flames[flame_name((inlined[t[0]],) + t[1:]) if t[0] in inlined
                       else flame_name(t)] += t[3]
        assert flames == exp_flames

    # folded stacks
    folded = read_folded(paths["folded"])
    assert sum(n for _, n in folded) == total_b
    leafs = collections.Counter()
    for frames, n in folded:
        leafs[frames[-1]] += n
    assert leafs == by_fn
    return p, folded


# ---------------------------------------------------------------------------------------
# Real traces: finished, compacted, live
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [None, "auto"])
def test_finished_trace_exports_equal_the_report(prog, tmp_path, depth):
    """A finished trace (its dump files as the program left them): every client shows
    exactly the report's sites; the inlined frame and the stack's outer frames are there.
    With the default (whole stacks) and with MMLEAK_DEPTH=auto (up to the program's frame
    and four more)."""
    dump = tmp_path / "dump"
    dump.mkdir()
    subprocess.run([prog], env=traced_env(dump, **({"MMLEAK_DEPTH": depth} if depth else {})),
                   check=True)
    paths, rows = report(dump, tmp_path / "out")
    assert site_table(rows) == expected_rows(FINISHED)
    p, folded = check_exports(paths, rows, tmp_path, exe=prog, inlined=INLINED)
    # fill_in is inlined into make_table: one location, two lines, innermost first
    inl = [stack_levels(p, locs) for locs, _, _ in p["samples"]
           if stack_levels(p, locs)[0][0] == "fill_in"]
    assert len(inl) == 1
    assert inl[0][:2] == [("fill_in", SRC, site_line("export_leaks.c", "calloc")),
                          ("make_table", SRC, site_line("export_leaks.c", "inlined_into"))]
    assert ["make_table", "fill_in"] in [f[-2:] for f, _ in folded]
    # intern's stack goes on through main to _start (depth auto: the runtime was crossed)
    assert any(f[-3:] == ["__libc_start_call_main", "main", "intern"] for f, _ in folded)
    # the comments say what the profile is; its time is the end of the trace
    assert any("mmleak trace %s" % only_trace(dump) in c for c in p["comments"])
    rep = mmleak.build_report(str(dump), progress=False)
    assert p["time_nanos"] == (rep["start"] + rep["end_time"]) * 10 ** 9
    assert p["duration_nanos"] == rep["end_time"] * 10 ** 9
    if GO:
        tr = pprof_traces(paths["pprof"], tmp_path, "inuse_space")
        inl = [f for n, f in tr if f[0].startswith("fill_in ")]
        want = [["fill_in %s:%d (inline)" % (SRC, site_line("export_leaks.c", "calloc")),
                 "make_table %s:%d" % (SRC, site_line("export_leaks.c", "inlined_into"))]]
        if depth == "auto":
            assert inl == want
        else:   # the whole stack: the same two frames, then main's and on to _start
            assert [f[:2] for f in inl] == want, inl
            assert any(x.startswith("main ") for x in inl[0]) and inl[0][-1] == "_start", inl
    clients_checked()


def test_compacted_trace_exports_equal_the_report(prog, tmp_path):
    """The same program, its trace folded by `mmleak.py compact` into mmleak.ID.compact (no
    dump file left): the exports are those of the finished trace."""
    dump = tmp_path / "dump"
    dump.mkdir()
    subprocess.run([prog], env=traced_env(dump), check=True)
    tid = only_trace(dump)
    subprocess.run([PY, MMLEAK, "compact", str(dump)], check=True)
    names = os.listdir(str(dump))
    assert "mmleak.%s.compact" % tid in names and not [n for n in names if n.endswith(".out")]
    paths, rows = report(dump, tmp_path / "out")
    assert site_table(rows) == expected_rows(FINISHED)
    check_exports(paths, rows, tmp_path, exe=prog, inlined=INLINED)
    clients_checked()


def test_live_trace_exports_equal_the_report(prog, tmp_path):
    """A process still running (its newest events only staged): the exports show what it
    holds now; after it goes on and ends, they show the late leak too."""
    dump = tmp_path / "dump"
    dump.mkdir()
    p = subprocess.Popen([prog, "wait"], env=traced_env(dump), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        paths, rows = report(dump, tmp_path / "live")
        assert p.poll() is None                                 # it was alive throughout
        assert site_table(rows) == expected_rows(FINISHED)
        check_exports(paths, rows, tmp_path, exe=prog, inlined=INLINED)
        p.stdin.write(b"\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"done\n"
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    paths, rows = report(dump, tmp_path / "end")
    assert site_table(rows) == expected_rows(WITH_LATE)
    check_exports(paths, rows, tmp_path, exe=prog, inlined=INLINED)
    clients_checked()


def test_allocator_frames_keep_the_wrappers(prog, tmp_path):
    """--export-allocator-frames: stacks go down to the allocator's caller (xmalloc, for
    intern's blocks); the totals are the same."""
    dump = tmp_path / "dump"
    dump.mkdir()
    subprocess.run([prog], env=traced_env(dump), check=True)
    paths, rows = report(dump, tmp_path / "out", "--export-allocator-frames")
    folded = read_folded(paths["folded"])
    assert sum(n for _, n in folded) == sum(r["bytes"] for r in rows) == 2356
    leaf_of = collections.Counter()
    for frames, n in folded:
        leaf_of[tuple(frames[-2:])] += n
    assert leaf_of[("intern", "xmalloc")] == 200 and ("xmalloc",) not in leaf_of
    with gzip.open(paths["pprof"]) as f:
        p = decode_profile(f.read())
    assert any("down to the allocator's caller" in c for c in p["comments"])
    leaves = {stack_levels(p, locs)[0][:2] for locs, _, _ in p["samples"]}
    assert ("xmalloc", SRC) in leaves
    if GO:
        got, out = pprof_top(paths["pprof"], tmp_path, "inuse_space")
        assert got["xmalloc"] == 200 and "intern" not in got, out
    clients_checked()


def test_kind_label_when_the_report_knows_it(prog, tmp_path):
    """A report that knows each block's kind (rep["kind_of"]: the reachability scan's
    answer) gives each stack and kind a sample of its own, labelled kind=...; go tool pprof
    filters on it."""
    dump = tmp_path / "dump"
    dump.mkdir()
    subprocess.run([prog], env=traced_env(dump), check=True)
    rep = mmleak.build_report(str(dump), progress=False)
    rep["wrappers"] = []
    # two_sites' blocks of 100 bytes are 'definite', the rest 'reachable'
    rep["kind_of"] = lambda a: "definite" if a.size == 100 else "reachable"
    path = str(tmp_path / "k.pb.gz")
    mx.write_pprof(mmleak.export_model(rep, mx), path)
    with gzip.open(path) as f:
        p = decode_profile(f.read())
    kinds = collections.Counter()
    for locs, v, labels in p["samples"]:
        assert len(labels) == 1 and labels[0][0] == "kind"
        kinds[labels[0][1]] += v[1]
    assert kinds == {"definite": 300, "reachable": 2056}
    if GO:
        got, out = pprof_top(path, tmp_path, "inuse_space", True)
        assert sum(got.values()) == 2356, out
        out = pprof(path, tmp_path, "-top", "-lines", "-tagfocus=kind=definite")
        assert re.search(r"^\s*300B .*two_sites %s:%d$" % (re.escape(SRC),
                                                        site_line("export_leaks.c", "two_a")),
                         out, re.M), out
        assert "Showing nodes accounting for 300B, 12.73% of 2356B total" in out, out
    clients_checked()


def test_the_demo_in_go_tool_pprof_and_heaptrack(tmp_path):
    """make demo's program run by `mmleak.py run` (compacted in the background): go tool
    pprof -top -sample_index=inuse_space lists its leaking functions with the report's bytes,
    heaptrack_print its total leaked bytes; the program's five planted leaks are there."""
    exe = str(tmp_path / "demo_leaky")
    src = os.path.join(TESTS, "demo_leaky.cpp")
    subprocess.run(["g++", "-O0", "-g", "-pthread", "-o", exe, src], check=True)
    dump = tmp_path / "dump"
    r = subprocess.run([PY, MMLEAK, "run", "-d", str(dump), "--", exe, "1", "2"],
                       capture_output=True, text=True, env=dict(os.environ, MMLEAK_SCAN="0"))
    assert r.returncode == 0, r.stderr
    paths, rows = report(dump, tmp_path / "out")
    check_exports(paths, rows, tmp_path, exe=exe)
    own = {(r["function"], r["line"]): (r["bytes"], r["blocks"]) for r in rows
           if r["file"] == src}

    def line(tag):
        with open(src) as f:
            return next(i for i, l in enumerate(f, 1) if "// " + tag in l)
    for fn, tag, b, n in (("load_config", "LEAK-config", 4096, 1),
                          ("Worker::handle(int)", "LEAK-session", 48 * 20, 20),
                          ("intern_name", "LEAK-intern", 24 * 10, 10),
                          ("grow_log", "LEAK-log", 64 * 10, 1),
                          ("Pool<Item<int> >::make()", "LEAK-pool", 64 * 10, 10)):
        assert own[(fn, line(tag))] == (b, n), fn
    if GO:
        # what the issue asks for, as a user would type it (names shortened by pprof)
        out = pprof(paths["pprof"], tmp_path, "-top", "-sample_index=inuse_space")
        for fn, b in (("load_config", 4096), ("Worker::handle(int)", 960),
                      ("Pool<Item<int> >::make()", 640), ("grow_log", 640)):
            assert re.search(r"^\s*%dB\s.*\s%s$" % (b, re.escape(fn)), out, re.M), out
    clients_checked()


# ---------------------------------------------------------------------------------------
# Hostile names, bad output paths
# ---------------------------------------------------------------------------------------

def test_names_with_separators_stay_one_frame(tmp_path):
    """A stripped program whose path holds ';', a space and a backslash: its frames are
    named by object and offset ('le;ak\\ prog+0x...'), and no export breaks a line or a
    frame on them (folded escapes ';' and '\\' as \\xHH)."""
    d = tmp_path / "we;ird dir"
    d.mkdir()
    exe = str(d / "le;ak\\ prog")
    subprocess.run(["cc", "-O1", "-s", "-o", exe, SRC], check=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    # MMLEAK_DEPTH=auto: one stack per call site, so one folded line per report site
    subprocess.run([exe], env=traced_env(dump, MMLEAK_DEPTH="auto"), check=True)
    paths, rows = report(dump, tmp_path / "out")
    mine = [r for r in rows if r["module"] == "le;ak\\ prog"]
    assert sum(r["bytes"] for r in mine) == 2356 and not any(r["function"] for r in mine)
    folded = read_folded(paths["folded"])
    assert sum(n for _, n in folded) == sum(r["bytes"] for r in rows)
    esc = "le\\x3bak\\x5c prog+0x"
    leafs = [f[-1] for f, _ in folded]
    assert all(l.startswith(esc) for l in leafs), leafs
    # each leaf is one frame: as many as the report's sites
    assert sorted((f[-1], n) for f, n in folded) == sorted(
        (esc + r["offset"][2:], r["bytes"]) for r in mine)
    with gzip.open(paths["pprof"]) as f:
        p = decode_profile(f.read())
    names = {p["functions"][fid][0] for l in p["locations"].values() for fid, _ in l["lines"]}
    assert {"le;ak\\ prog" + "+" + r["offset"] for r in mine} <= names
    assert any(m["file"] == exe for m in p["mappings"].values())
    if HEAPTRACK_PRINT:
        out, leaks, flames = heaptrack(paths["heaptrack"], tmp_path)
        assert "total memory leaked: %s\n" % ht_bytes(2356) in out
        assert sorted((k[0], v[1]) for k, v in leaks.items()) == sorted(
            ("le;ak\\ prog+" + r["offset"], r["blocks"]) for r in mine)
        assert "  in %s\n" % exe in out
    clients_checked()


def test_an_export_that_cannot_be_written(prog, tmp_path):
    """A directory that does not exist, a .zst heaptrack file: one line each on stderr, exit
    status 2, the other exports written, no temporary file left."""
    dump = tmp_path / "dump"
    dump.mkdir()
    subprocess.run([prog], env=traced_env(dump), check=True)
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([PY, MMLEAK, "report", str(dump), "--no-html",
                        "--pprof", str(tmp_path / "missing" / "p.pb.gz"),
                        "--folded", str(out / "f.folded"),
                        "--heaptrack", str(out / "h.zst")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    errs = r.stderr.strip().splitlines()
    assert errs == [
        "mmleak.py: cannot write %s: No such file or directory" % (tmp_path / "missing" / "p.pb.gz"),
        "mmleak.py: cannot write %s: %s: zstd is not written by mmleak; name the file .gz "
        "(gzip) or give it no compression suffix" % (out / "h.zst", out / "h.zst")], errs
    assert sorted(os.listdir(str(out))) == ["f.folded"]
    assert sum(n for _, n in read_folded(str(out / "f.folded"))) == 2356


def test_an_export_replaces_a_link_never_its_target(prog, tmp_path):
    """The export's path is a symbolic link (to a file of someone else's, say): the link is
    replaced by the export, the file it pointed to is left as it was."""
    dump = tmp_path / "dump"
    dump.mkdir()
    subprocess.run([prog], env=traced_env(dump), check=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("p.pb.gz", "f.folded", "h.gz"):
        os.symlink(str(victim), str(out / name))
    r = subprocess.run([PY, MMLEAK, "report", str(dump), "--no-html",
                        "--pprof", str(out / "p.pb.gz"), "--folded", str(out / "f.folded"),
                        "--heaptrack", str(out / "h.gz")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious\n"
    for name in ("p.pb.gz", "f.folded", "h.gz"):
        assert stat.S_ISREG(os.lstat(str(out / name)).st_mode)
    assert sorted(os.listdir(str(out))) == ["f.folded", "h.gz", "p.pb.gz"]


# ---------------------------------------------------------------------------------------
# The encoders on their own
# ---------------------------------------------------------------------------------------

def model(stacks, mappings=(), **kw):
    return mx.Profile(list(stacks), list(mappings), kw.get("start"), kw.get("duration"),
                      kw.get("command"), kw.get("comments", []))


def frame(addr, fn, fl=None, ln=None, inlined=(), mapping=None, module=None, offset=None):
    return mx.Frame(addr, module, offset, fn, fl, ln, tuple(inlined), mapping)


def test_varints_round_trip():
    for n in (0, 1, 127, 128, 300, 2 ** 32, 2 ** 63 - 1, 2 ** 64 - 1):
        assert varint(mx._varint(n), 0) == (n, len(mx._varint(n)))
    assert mx._varint(-1) == b"\xff" * 9 + b"\x01"        # int64 -1: ten bytes
    assert mx._varint(300) == b"\xac\x02"


def test_pprof_round_trip_with_alloc_values_and_labels():
    """Every field written is read back: alloc_* before inuse_* when every stack knows them,
    labels, inline levels innermost first, mappings with build ids, times, comments."""
    m = mx.Mapping(0x1000, 0x2000, 0x0, "/bin/prog", "abcd")
    leaf = frame(0x1010, "inner", "a.c", 3, inlined=[("outer", "a.c", 9)], mapping=0)
    root = frame(0x1020, "main", "a.c", 20, mapping=0)
    raw = frame(0x7000, None, module="lib.so", offset=0x42)
    prof = model([mx.Stack((leaf, root), 2, 96, 10, 480, (("kind", "definite"),), None),
                  mx.Stack((raw, root), 1, 7, 3, 21, (), None)], [m], start=1700000000,
                 duration=2.5, comments=["hello"])
    p = decode_profile(mx.pprof_bytes(prof))
    assert p["sample_type"] == [("alloc_objects", "count"), ("alloc_space", "bytes"),
                                ("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert p["default_sample_type"] == "inuse_space"
    assert p["time_nanos"] == 1700000002500000000 and p["duration_nanos"] == 2500000000
    assert p["comments"] == ["hello"] and p["period"] == 1
    s0, s1 = p["samples"]
    assert s0[1] == [10, 480, 2, 96] and s0[2] == [("kind", "definite")]
    assert s1[1] == [3, 21, 1, 7] and s1[2] == []
    assert stack_levels(p, s0[0]) == [("inner", "a.c", 3), ("outer", "a.c", 9),
                                      ("main", "a.c", 20)]
    assert stack_levels(p, s1[0])[0] == ("lib.so+0x42", "", 0)
    assert s0[0][1] == s1[0][1]                       # one location for one frame
    assert p["mappings"] == {1: {"start": 0x1000, "limit": 0x2000, "offset": 0,
                                 "file": "/bin/prog", "build_id": "abcd",
                                 "flags": (1, 1, 1, 1)}}
    locs = p["locations"]
    assert locs[s0[0][0]]["mapping"] == 1 and locs[s1[0][0]]["mapping"] == 0
    assert locs[s0[0][0]]["address"] == 0x1010


def test_pprof_without_alloc_values_and_empty():
    """One stack without alloc values: no alloc_* types at all; an empty report is a valid
    profile that go tool pprof reads."""
    f = frame(0x10, "f")
    prof = model([mx.Stack((f,), 1, 8, 1, 8, (), None), mx.Stack((f,), 1, 8, None, None, (),
                                                                 None)])
    p = decode_profile(mx.pprof_bytes(prof))
    assert p["sample_type"] == [("inuse_objects", "count"), ("inuse_space", "bytes")]
    assert [v for _, v, _ in p["samples"]] == [[1, 8], [1, 8]]
    p = decode_profile(mx.pprof_bytes(model([])))
    assert p["samples"] == [] and p["default_sample_type"] == "inuse_space"


def test_empty_report_in_every_client(tmp_path):
    """A trace with nothing alive: the three files are written, and the clients read them."""
    prof = model([], command="true")
    paths = {k: str(tmp_path / n) for k, n in (("pprof", "e.pb.gz"), ("folded", "e.folded"),
                                               ("heaptrack", "e.gz"))}
    for k, path in paths.items():
        getattr(mx, "write_" + k)(prof, path)
    assert open(paths["folded"]).read() == ""
    if GO:
        out = pprof(paths["pprof"], tmp_path, "-top")
        assert "Type: inuse_space" in out
    if HEAPTRACK_PRINT:
        out, leaks, flames = heaptrack(paths["heaptrack"], tmp_path)
        assert "total memory leaked: 0B" in out and leaks == {} and not flames
    clients_checked()


def test_values_pprof_cannot_hold():
    f = frame(0x10, "f")
    with pytest.raises(mx.ExportError, match="does not fit pprof's int64"):
        mx.pprof_bytes(model([mx.Stack((f,), 2, 2 ** 64, None, None, (), None)]))


def test_folded_escaping():
    """';' separates frames and '\\n' lines: in a name they are written as \\xHH (and '\\'
    too, so that the escape is unambiguous); spaces are kept (the count is the last field)."""
    odd = frame(0x10, "a;b\nc\\d e")
    root = frame(0x20, None, module="lib x.so", offset=0x9)
    prof = model([mx.Stack((odd, root), 1, 5, None, None, (), None),
                  mx.Stack((odd, root), 2, 6, None, None, (), None),
                  mx.Stack((root,), 1, 0, None, None, (), None)])
    assert mx.folded_lines(prof) == [("lib x.so+0x9;a\\x3bb\\x0ac\\x5cd e", 11)]
    inl = frame(0x30, "leaf", inlined=[("mid", None, None), (None, None, None)])
    assert mx.folded_lines(model([mx.Stack((inl,), 1, 3, None, None, (), None)])) == \
        [("??;mid;leaf", 3)]


def test_heaptrack_lines_define_before_use():
    """Strings, ips and trace nodes come before what refers to them; sized strings keep
    spaces; a newline in a name cannot start a line; blocks without times are spread over
    the count exactly."""
    odd = frame(0x10, "f(int, char)", "my file.c", 7, inlined=[("g", "my file.c", 9)])
    nl = frame(0x20, "evil\nname")
    prof = model([mx.Stack((odd, nl), 3, 10, None, None, (), None)], command="prog a\nb",
                 duration=2)
    text = "".join(mx.heaptrack_text(prof))
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    assert lines[0] == "v 10400 3"
    assert "X prog a\\x0ab" in lines
    strings, ips, traces, infos = [None], [None], [None], []
    for line in lines:
        kind, rest = line[0], line[2:]
        if kind == "s":
            n, text = rest.split(" ", 1)
            assert int(n, 16) == len(text.encode())
            strings.append(text)
        elif kind == "i":
            refs = [int(x, 16) for x in rest.split()[1:]]
            assert all(r < len(strings) for r in refs[:2])
            ips.append(refs)
        elif kind == "t":
            ip, parent = (int(x, 16) for x in rest.split())
            assert ip < len(ips) and parent < len(traces)
            traces.append((ip, parent))
        elif kind == "a":
            size, trace = (int(x, 16) for x in rest.split())
            assert 0 < trace < len(traces)
            infos.append(size)
        elif kind == "+":
            assert int(rest, 16) < len(infos)
    assert "evil\\x0aname" in strings and "f(int, char)" in strings and "my file.c" in strings
    assert infos == [4, 3]                        # 10 bytes in 3 blocks: 4, 3 and 3
    assert [l for l in lines if l[0] in "c+"] == ["c 0", "+ 0", "+ 1", "+ 1", "c 7d0"]


def test_build_id_of_real_files(prog, tmp_path):
    """read_build_id gives readelf's build id, for the test program and for libc; nothing
    for a file that is not ELF, a FIFO (without blocking) or a missing file."""
    assert mx.read_build_id(prog) == readelf_build_id(prog)
    libc = next(l.split()[-1] for l in open("/proc/self/maps") if "/libc.so" in l)
    assert mx.read_build_id(libc) == readelf_build_id(libc)
    (tmp_path / "text").write_text("not an ELF file\n" * 10)
    assert mx.read_build_id(str(tmp_path / "text")) is None
    os.mkfifo(str(tmp_path / "fifo"))
    assert mx.read_build_id(str(tmp_path / "fifo")) is None
    assert mx.read_build_id(str(tmp_path / "missing")) is None
    stripped = str(tmp_path / "nobuildid")
    subprocess.run(["cc", "-Wl,--build-id=none", "-o", stripped, SRC], check=True)
    assert mx.read_build_id(stripped) is None


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    """A writer that fails half way leaves the file that was there and no temporary file."""
    path = tmp_path / "f.folded"
    path.write_text("old\n")

    def boom(profile):
        yield ("a", 1)
        raise RuntimeError("half way")
    monkeypatch.setattr(mx, "folded_lines", boom)
    with pytest.raises(RuntimeError):
        mx.write_folded(model([]), str(path))
    assert path.read_text() == "old\n" and os.listdir(str(tmp_path)) == ["f.folded"]


# ---------------------------------------------------------------------------------------
# The default records whole stacks (issue 21)
# ---------------------------------------------------------------------------------------

def test_default_records_whole_stacks(tmp_path, lib):
    """With no setting, a leak at the bottom of a recursion 12 deep under main has its whole
    stack: 13 frames of rec, then main, then on to _start, in the dump, the report, the
    folded flame graph, the pprof profile and the HTML page's flame graph."""
    src = os.path.join(TESTS, "deep_stack.c")
    exe = str(tmp_path / "deep_stack")
    subprocess.run(["cc", "-O1", "-g", "-o", exe, src], check=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    env = traced_env(dump)
    env.pop("MMLEAK_DEPTH", None)
    subprocess.run([exe], env=env, check=True)
    want = ["rec"] * 13 + ["main"]
    # the dump: one stack line, referenced by the leak, header depth=64 (the default)
    text = b"".join(open(f, "rb").read() for f in mmleak.find_traces(str(dump)).popitem()[1])
    assert b" depth=64 " in text
    (ref,) = [l for l in text.split(b"\n") if re.match(rb"[0-9a-f]{12} \w+ 10e1 \w+ @", l)]
    sid = ref.rsplit(b"@", 1)[1]
    (sdef,) = {l for l in text.split(b"\n") if l.startswith(b"#s " + sid + b" ")}
    assert len(sdef.split()) - 2 >= len(want) + 2, sdef     # + __libc_start*, _start
    # the report: the block's callers, symbolized
    rep = mmleak.build_report(str(dump), progress=False)
    (blk,) = [a for a in rep["survivors"] if a.size == 4321]
    names = [rep["frames"][c].function if rep["frames"].get(c) else None for c in blk.callers]
    assert [mmleak.base_name(n) if n else n for n in names[:14]] == want, names
    assert names[-1] == "_start", names
    assert (rep["frames"][blk.callers[0]].line, rep["frames"][blk.callers[13]].line) == (
        site_line("deep_stack.c", "deep"), site_line("deep_stack.c", "main"))
    # the exports: the folded flame graph (root first) and pprof (leaf first)
    paths, rows = report(dump, tmp_path / "out")
    (folded,) = [f for f, n in read_folded(paths["folded"]) if n == 4321]
    assert folded[-14:] == want[::-1] and folded[0] == "_start", folded
    with gzip.open(paths["pprof"]) as f:
        p = decode_profile(f.read())
    levels = [[fn for fn, _, _ in stack_levels(p, locs)] for locs, vals, _ in p["samples"]
              if 4321 in vals]
    assert levels and all(l[:14] == want and l[-1] == "_start" for l in levels), levels
    # the page: its flame graph holds main's box with 13 boxes of rec above it
    page = tmp_path / "page.html"
    r = subprocess.run([PY, MMLEAK, "report", str(dump), "-o", str(page)], capture_output=True,
                       text=True)
    if r.returncode != 0 and "pandas" in r.stderr:
        pytest.skip("the page needs pandas")
    assert r.returncode == 0, r.stderr
    data = json.loads(re.search(r'<script type="application/json" id="flame-data">(.*?)'
                                r'</script>', page.read_text(), re.S).group(1))
    name = [data["s"][f[0]] if f[0] >= 0 else None for f in data["f"]]
    boxes = [(name[f] if f >= 0 else None, d) for f, d, _, _, _ in
             zip(*[iter(data["n"])] * 5)]
    (dm,) = [d for n, d in boxes if n == "main"]
    assert sorted(d for n, d in boxes if n == "rec") == list(range(dm + 1, dm + 14)), boxes
