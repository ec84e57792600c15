#!/usr/bin/python3
"""Benchmark mmleak.so against no tracer and the installed peers (heaptrack, valgrind).

    /usr/bin/python3 bench/run.py [--quick] [--runs N] [--only NAME] [--dir DIR]

Every workload is run with each tracer on the same binary and the same generated input; the
runs of the tracers are interleaved (run 1 of every tracer, then run 2, ...) so that noise from
other load on the machine spreads over all of them, and the median wall time is reported.
See bench/README.rst for what is measured and how to read it.  Standard library only.
"""
import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "out")
LIB = os.path.join(ROOT, "mmleak.so")
MMLEAK_PY = os.path.join(ROOT, "mmleak.py")
PY = "/usr/bin/python3"
BENCH_BIN = os.path.join(OUT, "alloc_bench")
UNWIND_BIN = os.path.join(OUT, "unwind_bench")

# Environment shared by every run of every tracer (deterministic programs).
BASE_ENV = {"LC_ALL": "C", "PYTHONHASHSEED": "0"}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def which(name):
    return shutil.which(name)


# ------------------------------------------------------------------------------------------
# Running one command
# ------------------------------------------------------------------------------------------

class RunResult:
    def __init__(self, wall, rc, stdout, stderr, maxrss_kb=None, cpu=None):
        self.wall, self.rc, self.stdout, self.stderr, self.maxrss_kb = wall, rc, stdout, stderr, maxrss_kb
        self.cpu = cpu  # user + system seconds of the process and the children it waited for


def run_cmd(argv, env=None, stdin_path=None, scratch=None, keep_stdout=True, stdout_path=None):
    """Run ARGV; return its wall time (fork to exit), exit status, stdout and stderr tail."""
    full_env = dict(os.environ)
    full_env.update(BASE_ENV)
    if env:
        full_env.update(env)
    out_path = stdout_path or os.path.join(scratch, "stdout")
    err_path = os.path.join(scratch, "stderr")
    fin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    try:
        with open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, env=full_env, stdin=fin, stdout=fout, stderr=ferr)
            _, status, ru = os.wait4(p.pid, 0)
            wall = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if stdin_path:
            fin.close()
    out = ""
    if keep_stdout and not stdout_path:
        with open(out_path, "rb") as f:
            out = f.read(1 << 16).decode("utf-8", "replace")
    with open(err_path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 2000))
        err = f.read().decode("utf-8", "replace")
    return RunResult(wall, p.returncode, out, err, ru.ru_maxrss, ru.ru_utime + ru.ru_stime)


def one_line(text, limit=240):
    """The last non-empty lines of TEXT joined on one line, at most LIMIT characters."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    s = " | ".join(lines[-3:])
    return s if len(s) <= limit else "..." + s[-limit:]


def reset_dir(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)


def dump_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d)
                  if f.startswith("mmleak.") and f.endswith(".out"))


def count_events(paths):
    """Event lines (lines not starting with '#') in mmleak dump files; NUL padding ignored."""
    events = 0
    for path in paths:
        lines = hashes = 0
        prev = b"\n"
        last = b"\n"
        with open(path, "rb") as f:
            while True:
                buf = f.read(1 << 24)
                if not buf:
                    break
                buf = buf.rstrip(b"\0") if len(buf) < (1 << 24) else buf
                if not buf:
                    break
                lines += buf.count(b"\n")
                hashes += buf.count(b"\n#") + (1 if prev == b"\n" and buf[:1] == b"#" else 0)
                prev = last = buf[-1:]
        if last != b"\n":
            lines += 1  # a torn last line still counts as a line (a header has a newline)
        events += lines - hashes
    return events


def dump_bytes(paths):
    return sum(os.path.getsize(p) for p in paths)


# ------------------------------------------------------------------------------------------
# Tracers
# ------------------------------------------------------------------------------------------

def tool_version(argv):
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        return r.stdout.decode("utf-8", "replace").strip().splitlines()[0]
    except Exception:
        return None


class Tracer:
    """How to run a command under one tracer.  wrap() returns (argv, extra env)."""
    name = "?"

    def installed(self):
        return True

    def wrap(self, argv, dumpdir):
        return argv, {}


class NoTracer(Tracer):
    name = "none"


class Mmleak(Tracer):
    def __init__(self, depth=None):
        self.depth = depth
        self.name = "mmleak" if depth is None else "mmleak d=%d" % depth

    def installed(self):
        return os.path.isfile(LIB)

    def wrap(self, argv, dumpdir):
        env = {"LD_PRELOAD": LIB, "MMLEAK_DIR": dumpdir}
        if self.depth is not None:
            env["MMLEAK_DEPTH"] = str(self.depth)
        return argv, env


class Heaptrack(Tracer):
    name = "heaptrack"

    def installed(self):
        return which("heaptrack") is not None

    def wrap(self, argv, dumpdir):
        # heaptrack appends .zst (or .gz) to the -o name; the recording is compressed on the
        # fly by heaptrack_interpret | zstd, which is part of the cost a user pays.
        return ["heaptrack", "-o", os.path.join(dumpdir, "heaptrack.bench")] + argv, {}


class Valgrind(Tracer):
    name = "valgrind"

    def installed(self):
        return which("valgrind") is not None

    def wrap(self, argv, dumpdir):
        return ["valgrind", "--tool=memcheck", "--leak-check=full",
                "--log-file=" + os.path.join(dumpdir, "valgrind.%p.log")] + argv, {}


# ------------------------------------------------------------------------------------------
# Workloads
# ------------------------------------------------------------------------------------------

def gen_sql(path, n):
    """An SQL script: N inserts in one transaction, two indexes, grouped and point queries."""
    r = random.Random(42)
    keys = max(10, n // 4)
    with open(path, "w") as f:
        f.write("CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER, pad TEXT);\nBEGIN;\n")
        for _ in range(n):
            f.write("INSERT INTO t(k,v,pad) VALUES('k%d',%d,'%s');\n"
                    % (r.randrange(keys), r.randrange(1000000), "x" * r.randrange(0, 100)))
        f.write("COMMIT;\nCREATE INDEX tk ON t(k);\nCREATE INDEX tv ON t(v);\n")
        f.write("SELECT k, count(*), sum(v) FROM t GROUP BY k ORDER BY 3 DESC LIMIT 5;\n")
        for _ in range(max(10, n // 50)):
            f.write("SELECT count(*), max(pad) FROM t WHERE k='k%d';\n" % r.randrange(keys))
        f.write("SELECT count(DISTINCT v) FROM t;\n")
        f.write("SELECT length(group_concat(k)) FROM (SELECT k FROM t ORDER BY v LIMIT %d);\n"
                % max(10, n // 10))
        f.write("DELETE FROM t WHERE v % 3 = 0;\nSELECT count(*) FROM t;\n")


PERL_PROG = (r'my $n = shift; my %h; srand(7);'
             r' for my $i (1..$n) { my $k = "k" . int(rand($n / 2));'
             r' push @{$h{$k}}, "x" x int(rand(300)); delete $h{"k" . int(rand($n / 2))} if $i % 3 == 0; }'
             r' my $s = join(",", sort keys %h); my %c; $c{length $_}++ for values %h;'
             r' print length($s), " ", scalar(keys %c), "\n";')


class Workload:
    """NAME; make(size, indir) -> (argv, stdin_path); sizes: tracer name -> size."""

    def __init__(self, name, desc, make, sizes, size_label, needs=None, internal=False,
                 group="a"):
        self.name, self.desc, self.make, self.sizes = name, desc, make, sizes
        self.size_label, self.needs, self.internal, self.group = size_label, needs, internal, group


def fmt_n(n):
    if n == 0:
        return "0"
    for div, suf in ((1000000, "M"), (1000, "k")):
        if n >= div and n % (div // 10) == 0:
            v = n / div
            return ("%d%s" % (v, suf)) if v == int(v) else ("%.1f%s" % (v, suf))
    return str(n)


def workloads(quick):
    def ab(threads, nest=0):
        def make(n, indir):
            argv = [BENCH_BIN, "-t", str(threads), "-n", str(n)]
            if nest:
                argv += ["-r", str(nest)]
            return argv, None
        return make

    def py(n, indir):
        return [PY, os.path.join(HERE, "pywork.py"), str(n)], None

    def sq(n, indir):
        path = os.path.join(indir, "bench-%d.sql" % n)
        if not os.path.exists(path):
            gen_sql(path, n)
        return [which("sqlite3") or "sqlite3", ":memory:"], path

    def pl(n, indir):
        return [which("perl") or "perl", "-e", PERL_PROG, str(n)], None

    q = quick
    # Sizes: the untraced run of the full size takes ~0.1-0.5 s here; valgrind (and for the
    # alloc loops heaptrack) get a smaller input, compared with an untraced run of that size.
    return [
        Workload("startup", "alloc_bench -n 0: process start and exit only (fixed cost per process)",
                 ab(1), {"none": 0}, "-n"),
        Workload("alloc -t1", "bench/alloc_bench.c, 1 thread, 16-512 B blocks, 1000 live slots",
                 ab(1), {"none": 10000000 if not q else 1000000,
                         "heaptrack": 1000000 if not q else 200000,
                         "valgrind": 500000 if not q else 100000},
                 "-n", internal=True),
        Workload("alloc -t2", "bench/alloc_bench.c, 2 threads sharing the slots (cross-thread frees)",
                 ab(2), {"none": 2000000 if not q else 500000,
                         "heaptrack": 500000 if not q else 100000,
                         "valgrind": 250000 if not q else 50000},
                 "-n", internal=True),
        Workload("python", "/usr/bin/python3 bench/pywork.py N (dicts, lists, strings; pymalloc on)",
                 py, {"none": 150000 if not q else 30000,
                      "valgrind": 15000 if not q else 5000},
                 "N"),
        Workload("sqlite3", "sqlite3 :memory: < generated script (N inserts, 2 indexes, queries)",
                 sq, {"none": 60000 if not q else 10000,
                      "valgrind": 6000 if not q else 2000},
                 "N", needs="sqlite3"),
        Workload("perl", "perl -e: hash of arrays of strings, deletes, sort keys (N iterations)",
                 pl, {"none": 300000 if not q else 50000,
                      "valgrind": 30000 if not q else 10000},
                 "N", needs="perl"),
    ]


# ------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------

INTERNAL_RE = re.compile(r"seconds=([0-9.]+) ns_per_event=([0-9.]+)")


def med(xs):
    return statistics.median(xs) if xs else None


def spread(xs):
    if not xs or len(xs) < 2:
        return None
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m * 100 if m else None


def measure_group(jobs, runs, dirs, label):
    """JOBS: list of dicts with key, tracer, argv, stdin.  Runs every job RUNS times,
    interleaved; fills job['walls'], ['internal'], ['bytes'], ['events'], ['error']."""
    for j in jobs:
        j.update(walls=[], cpus=[], internal=[], bytes=[], events=None, error=None)
        if isinstance(j["tracer"], NoTracer) and runs > 1:
            run_cmd(j["argv"], None, j["stdin"], dirs["scratch"])  # warm-up, not counted
    for rep in range(runs):
        for j in jobs:
            if j["error"]:
                continue
            reset_dir(dirs["dump"])
            os.sync()  # start every run with no dirty pages of an earlier run pending
            argv, env = j["tracer"].wrap(j["argv"], dirs["dump"])
            r = run_cmd(argv, env, j["stdin"], dirs["scratch"])
            if r.rc != 0:
                j["error"] = "exit status %d: %s" % (r.rc, one_line(r.stderr))
                log("  %s / %s: FAILED (%s)" % (label, j["key"], j["error"]))
                continue
            j["walls"].append(r.wall)
            j["cpus"].append(r.cpu)
            m = INTERNAL_RE.search(r.stdout)
            if m:
                j["internal"].append(float(m.group(1)))
            if isinstance(j["tracer"], Mmleak):
                files = dump_files(dirs["dump"])
                if not files:
                    j["error"] = "no dump files written (%s)" % one_line(r.stderr)
                    log("  %s / %s: FAILED (%s)" % (label, j["key"], j["error"]))
                    continue
                j["bytes"].append(dump_bytes(files))
                other = [x for x in os.listdir(dirs["dump"]) if x.startswith("mmleak.")
                         and not x.endswith((".out", ".maps"))]
                if other and not j.get("warned"):
                    j["warned"] = True
                    log("  warning: %s / %s left %s after a normal exit (not counted)"
                        % (label, j["key"], ", ".join(sorted(other)[:4])))
                if j["events"] is None:
                    j["events"] = count_events(files)
        log("  %s: run %d/%d done (%s)" % (
            label, rep + 1, runs,
            ", ".join("%s %.3fs" % (j["key"], j["walls"][-1]) for j in jobs if j["walls"])))
    reset_dir(dirs["dump"])


def bench_workload(w, tracers, runs, dirs):
    """One workload, every tracer; returns a list of row dicts."""
    sizes_used = {}
    for t in tracers:
        sizes_used[t.name] = w.sizes.get(t.name, w.sizes["none"])
    full = w.sizes["none"]
    jobs = []
    for size in sorted(set(sizes_used.values()), reverse=True):
        argv, stdin = w.make(size, dirs["input"])
        jobs.append(dict(key="none" if size == full else "none@%s" % fmt_n(size),
                         tracer=NoTracer(), argv=argv, stdin=stdin, size=size, count_only=False))
        for t in tracers:
            if sizes_used[t.name] == size:
                jobs.append(dict(key=t.name, tracer=t, argv=argv, stdin=stdin, size=size,
                                 count_only=False))
    # Events for a reduced size: counted from one mmleak run of that size.
    mm = [t for t in tracers if isinstance(t, Mmleak)]
    extra = []
    for size in set(sizes_used.values()):
        if size != full and mm:
            argv, stdin = w.make(size, dirs["input"])
            extra.append(dict(key="mmleak@%s (event count)" % fmt_n(size), tracer=mm[0],
                              argv=argv, stdin=stdin, size=size, count_only=True))
    log("%s: %s" % (w.name, ", ".join("%s %s=%s" % (j["key"], w.size_label, fmt_n(j["size"]))
                                        for j in jobs)))
    measure_group(jobs, runs, dirs, w.name)
    if extra:
        measure_group(extra, 1, dirs, w.name)
    events = {j["size"]: j["events"] for j in jobs + extra if j["events"]}
    base = {j["size"]: med(j["walls"]) for j in jobs if j["tracer"].name == "none" and j["walls"]}
    base_cpu = {j["size"]: med(j["cpus"]) for j in jobs if j["tracer"].name == "none" and j["cpus"]}
    base_int = {j["size"]: med(j["internal"]) for j in jobs
                if j["tracer"].name == "none" and j["internal"]}
    rows = []
    for j in jobs:
        size = j["size"]
        wall = med(j["walls"])
        ev = events.get(size)
        row = dict(workload=w.name, tracer=j["tracer"].name, size=size,
                   size_arg="%s %s" % (w.size_label, fmt_n(size)), full_size=(size == full),
                   runs=len(j["walls"]), wall_s=wall, walls=j["walls"], spread_pct=spread(j["walls"]),
                   min_s=min(j["walls"]) if j["walls"] else None, events=ev, ratio=None, ns_per_event=None, bytes_per_event=None,
                   error=j["error"], note="")
        b = base.get(size)
        if j["cpus"]:
            row["cpu_s"] = med(j["cpus"])
            row["cpus"] = j["cpus"]
            bc = base_cpu.get(size)
            if bc is not None and ev and ev >= 1000 and j["tracer"].name != "none":
                row["ns_per_event_cpu"] = (row["cpu_s"] - bc) * 1e9 / ev
        if wall is not None and b:
            row["ratio"] = wall / b
            if ev and ev >= 1000 and j["tracer"].name != "none":
                row["ns_per_event"] = (wall - b) * 1e9 / ev
        if j["bytes"] and ev:
            row["dump_bytes"] = med(j["bytes"])
            if ev >= 1000:
                row["bytes_per_event"] = med(j["bytes"]) / ev
        if j["internal"]:
            row["internal_s"] = med(j["internal"])
            bi = base_int.get(size)
            if bi is not None and ev and j["tracer"].name != "none":
                row["internal_ns_per_event"] = (row["internal_s"] - bi) * 1e9 / ev
        if size != full:
            row["note"] = "smaller input: vs none at %s %s" % (w.size_label, fmt_n(size))
        rows.append(row)
    return rows


def bench_depth(runs, dirs, quick):
    """(c) MMLEAK_DEPTH 1, 2, 4, 8 on alloc_bench -t 1 with 12 extra frames of nesting."""
    n = 1000000 if not quick else 200000
    nest = 12
    argv = [BENCH_BIN, "-t", "1", "-n", str(n), "-r", str(nest)]
    jobs = [dict(key="none", tracer=NoTracer(), argv=argv, stdin=None, size=n)]
    for d in (1, 2, 4, 8):
        t = Mmleak(d)
        jobs.append(dict(key=t.name, tracer=t, argv=argv, stdin=None, size=n))
    log("depth: alloc_bench -t 1 -n %s -r %d, MMLEAK_DEPTH 1 2 4 8" % (fmt_n(n), nest))
    measure_group(jobs, runs, dirs, "depth")
    base = med(jobs[0]["walls"])
    base_i = med(jobs[0]["internal"])
    base_c = med(jobs[0]["cpus"])
    rows = []
    for j in jobs:
        wall = med(j["walls"])
        ev = j["events"] or (jobs[1]["events"])
        row = dict(workload="depth", tracer=j["key"], size=n, size_arg="-n %s -r %d" % (fmt_n(n), nest),
                   runs=len(j["walls"]), wall_s=wall, walls=j["walls"], spread_pct=spread(j["walls"]),
                   min_s=min(j["walls"]) if j["walls"] else None,
                   events=ev, ratio=(wall / base if wall and base else None),
                   ns_per_event=None, bytes_per_event=None, error=j["error"], note="",
                   depth=getattr(j["tracer"], "depth", None), full_size=True)
        if j["key"] != "none" and wall is not None and base and ev:
            row["ns_per_event"] = (wall - base) * 1e9 / ev
        if j["cpus"]:
            row["cpu_s"] = med(j["cpus"])
            row["cpus"] = j["cpus"]
            if j["key"] != "none" and base_c is not None and ev:
                row["ns_per_event_cpu"] = (row["cpu_s"] - base_c) * 1e9 / ev
        if j["internal"]:
            row["internal_s"] = med(j["internal"])
            if j["key"] != "none" and base_i is not None and ev:
                row["internal_ns_per_event"] = (row["internal_s"] - base_i) * 1e9 / ev
        if j["bytes"] and ev:
            row["bytes_per_event"] = med(j["bytes"]) / ev
        rows.append(row)
    summary = {}
    for key, suffix in (("ns_per_event", ""), ("ns_per_event_cpu", "_cpu")):
        pts = [(r["depth"], r[key]) for r in rows if r.get("depth") and r.get(key) is not None]
        d = dict(pts)
        if 1 in d and 2 in d:
            summary["step_1_to_2_ns" + suffix] = d[2] - d[1]
        deep = [(x, y) for x, y in pts if x >= 2]
        if len(deep) >= 2:
            mx = sum(x for x, _ in deep) / len(deep)
            my = sum(y for _, y in deep) / len(deep)
            sxx = sum((x - mx) ** 2 for x, _ in deep)
            summary["ns_per_extra_frame" + suffix] = sum((x - mx) * (y - my) for x, y in deep) / sxx
    bp = {r["depth"]: r["bytes_per_event"] for r in rows if r.get("depth") and r["bytes_per_event"]}
    if 1 in bp and 8 in bp:
        summary["bytes_per_extra_frame"] = (bp[8] - bp[1]) / 7
    return rows, summary


def bench_shrink(runs, dirs, quick, have_heaptrack):
    """(d) post-processing speed on a ~10M event dump of alloc_bench -t 2."""
    res = {"available": False}
    if not os.path.isfile(MMLEAK_PY):
        res["skipped"] = "skipped: mmleak.py shrink not available yet (no mmleak.py)"
        return res
    r = subprocess.run([PY, MMLEAK_PY, "shrink", "--help"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    if r.returncode != 0:
        res["skipped"] = "skipped: mmleak.py shrink not available yet"
        return res
    res["available"] = True
    n = 2500000 if not quick else 250000
    sd = os.path.join(dirs["root"], "shrink")
    dump = os.path.join(sd, "dump")
    reset_dir(sd)
    os.makedirs(dump)
    scratch = dirs["scratch"]
    argv = [BENCH_BIN, "-t", "2", "-n", str(n)]
    log("shrink: recording alloc_bench -t 2 -n %s under mmleak" % fmt_n(n))
    rr = run_cmd(argv, {"LD_PRELOAD": LIB, "MMLEAK_DIR": dump}, None, scratch)
    files = dump_files(dump)
    if rr.rc != 0 or not files:
        res["error"] = "recording failed: %s" % one_line(rr.stderr)
        return res
    events = count_events(files)
    res.update(workload="alloc_bench -t 2 -n %s" % fmt_n(n), events=events,
               files=len(files), dump_bytes=dump_bytes(files))
    pid = re.match(r"mmleak\.(\d+)\.", os.path.basename(files[0])).group(1)
    timebin = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
    out = os.path.join(sd, "out")

    def timed(argv, stdout_path=None, stdin_path=None):
        """Wall seconds and peak RSS (KiB, via /usr/bin/time -f %M when present)."""
        tf = os.path.join(scratch, "time.out")
        full = ([timebin, "-f", "%M", "-o", tf] + argv) if timebin else argv
        r = run_cmd(full, None, stdin_path, scratch, keep_stdout=False,
                    stdout_path=stdout_path or os.path.join(scratch, "stdout"))
        rss = r.maxrss_kb
        if timebin:
            try:
                with open(tf) as f:
                    rss = int(f.read().strip().splitlines()[-1])
            except (OSError, ValueError, IndexError):
                pass
        return r, rss

    def pipeline(cmds, stdout_path):
        """cmd1 | cmd2 ... > stdout_path; wall seconds and status of every stage."""
        env = dict(os.environ, **BASE_ENV)
        t0 = time.perf_counter()
        procs = []
        prev = None
        with open(stdout_path, "wb") as fout, open(os.path.join(scratch, "stderr"), "wb") as ferr:
            for i, c in enumerate(cmds):
                p = subprocess.Popen(c, env=env, stdin=prev if prev is not None else subprocess.DEVNULL,
                                     stdout=fout if i == len(cmds) - 1 else subprocess.PIPE,
                                     stderr=ferr)
                if prev is not None:
                    prev.close()
                prev = p.stdout
                procs.append(p)
            rcs = [p.wait() for p in procs]
        return time.perf_counter() - t0, rcs

    shrink = [PY, MMLEAK_PY, "shrink"]
    sort = ["sort", "-s", "-k1,1"]
    reps = max(1, min(runs, 3))
    direct, direct_rss, classic, sort_only, errs = [], [], [], [], []
    for rep in range(reps):
        # direct: mmleak.py shrink FILES > out
        r, rss = timed(shrink + files, stdout_path=out)
        if r.rc != 0:
            errs.append("direct shrink: exit %d: %s" % (r.rc, one_line(r.stderr)))
        direct.append(r.wall)
        direct_rss.append(rss)
        res["direct_out_bytes"] = os.path.getsize(out)
        os.unlink(out)
        # classic: per file sort | shrink, then cat parts | sort | shrink --final
        total = 0.0
        parts = []
        for i, f in enumerate(files):
            part = os.path.join(sd, "part.%d" % i)
            w, rcs = pipeline([sort + [f], shrink], part)
            total += w
            parts.append(part)
            if any(rcs):
                errs.append("sort|shrink on %s: %s" % (os.path.basename(f), rcs))
        w, rcs = pipeline([["cat"] + parts, sort, shrink + ["--final"]], out)
        total += w
        if any(rcs):
            errs.append("merge: %s" % rcs)
        classic.append(total)
        for p in parts:
            os.unlink(p)
        os.unlink(out)
        # sort alone, every file
        total = 0.0
        for f in files:
            w, rcs = pipeline([sort + [f]], out)
            total += w
            os.unlink(out)
        sort_only.append(total)
        log("  shrink: run %d/%d: direct %.2fs, sort|shrink %.2fs, sort %.2fs"
            % (rep + 1, reps, direct[-1], classic[-1], sort_only[-1]))
    res.update(runs=reps, direct_s=med(direct), direct_walls=direct, direct_rss_kb=max(direct_rss) if all(direct_rss) else None,
               direct_events_per_s=events / med(direct), classic_s=med(classic), classic_walls=classic,
               classic_events_per_s=events / med(classic), sort_s=med(sort_only), sort_walls=sort_only,
               errors=errs)
    # mmleak.py report, if present
    r = subprocess.run([PY, MMLEAK_PY, "report", "--help"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    if r.returncode == 0:
        rep_walls, rep_err = [], None
        for rep in range(reps):
            rr, rss = timed([PY, MMLEAK_PY, "report", dump, "--pid", pid, "--no-html"])
            if rr.rc not in (0, 4):
                rep_err = "exit %d: %s" % (rr.rc, one_line(rr.stderr))
                break
            if rr.rc == 4:
                rep_err = "exit 4 (eu-addr2line missing or failing; addresses unresolved)"
            rep_walls.append(rr.wall)
            res["report_rss_kb"] = rss
        res.update(report_s=med(rep_walls), report_walls=rep_walls, report_error=rep_err,
                   report_events_per_s=(events / med(rep_walls)) if rep_walls else None)
        log("  report: %s" % (", ".join("%.2fs" % x for x in rep_walls) or rep_err))
    else:
        res["report_skipped"] = "mmleak.py report not available"
    shutil.rmtree(dump, ignore_errors=True)
    # heaptrack_print on heaptrack's recording of the same run
    if have_heaptrack and which("heaptrack_print"):
        htdir = os.path.join(sd, "ht")
        os.makedirs(htdir, exist_ok=True)
        log("shrink: recording the same run under heaptrack")
        rr = run_cmd(Heaptrack().wrap(argv, htdir)[0], None, None, scratch)
        rec = [os.path.join(htdir, f) for f in os.listdir(htdir) if f.startswith("heaptrack.bench")]
        if rr.rc == 0 and rec:
            res["heaptrack_record_s"] = rr.wall
            res["heaptrack_file_bytes"] = os.path.getsize(rec[0])
            walls = []
            for rep in range(reps):
                r, rss = timed(["heaptrack_print", rec[0]])
                if r.rc != 0:
                    res["heaptrack_print_error"] = "exit %d: %s" % (r.rc, one_line(r.stderr))
                    break
                walls.append(r.wall)
                res["heaptrack_print_rss_kb"] = rss
            if walls:
                res.update(heaptrack_print_s=med(walls), heaptrack_print_walls=walls,
                           heaptrack_print_events_per_s=events / med(walls))
            log("  heaptrack_print: %s" % ", ".join("%.2fs" % x for x in walls))
        else:
            res["heaptrack_print_error"] = "heaptrack recording failed: %s" % one_line(rr.stderr)
    shutil.rmtree(sd, ignore_errors=True)
    return res


def build_unwind_bench():
    """bench/unwind_bench.c: the chain and the tree without frame pointers, the chain again
    with them, mmleak-unwind.c with the library's flags.  libunwind is linked in statically
    (its libunwind.a is not PIC: a non-PIE binary) when libunwind-dev is installed; glibc's
    backtrace() is then still taken from libc itself (libunwind defines one too).
    Returns (built, with_libunwind, error)."""
    cc = os.environ.get("CC", "cc")
    odir = os.path.join(OUT, "unwind-obj")
    os.makedirs(odir, exist_ok=True)
    lib_flags = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden",
                 "-fexceptions", "-fno-omit-frame-pointer", "-O2", "-g"]
    parts = [("unwind.o", os.path.join(ROOT, "mmleak-unwind.c"), lib_flags),
             ("chain_nofp.o", os.path.join(HERE, "unwind_chain.c"),
              ["-O2", "-g", "-fomit-frame-pointer", "-DCHAIN=chain_nofp"]),
             ("chain_fp.o", os.path.join(HERE, "unwind_chain.c"),
              ["-O2", "-g", "-fno-omit-frame-pointer", "-DCHAIN=chain_fp"]),
             ("tree.o", os.path.join(HERE, "unwind_tree.c"), ["-O2", "-g", "-fomit-frame-pointer"])]
    objs = []
    for name, src, flags in parts:
        o = os.path.join(odir, name)
        r = subprocess.run([cc] + flags + ["-c", "-o", o, src], capture_output=True, text=True)
        if r.returncode != 0:
            return False, False, "%s: %s" % (name, one_line(r.stderr))
        objs.append(o)
    main = [cc, "-O2", "-g", "-fno-omit-frame-pointer", "-o", UNWIND_BIN,
            os.path.join(HERE, "unwind_bench.c")] + objs
    for extra, with_lu in ((["-DHAVE_LIBUNWIND", "-no-pie", "-Wl,-Bstatic", "-lunwind",
                             "-Wl,-Bdynamic", "-llzma", "-ldl"], True),
                           (["-DHAVE_LIBUNWIND", "-no-pie", "-Wl,-Bstatic", "-lunwind",
                             "-Wl,-Bdynamic", "-ldl"], True),
                           (["-ldl"], False)):
        r = subprocess.run(main + extra, capture_output=True, text=True)
        if r.returncode == 0:
            return True, with_lu, None
    return False, False, one_line(r.stderr)


UNWIND_RE = re.compile(r'^(chain12|tree) method="([^"]+)" run=(\d+) ns=(-?[0-9.]+)(?: frames=([0-9.]+))?')


def bench_unwind(runs):
    """(e) the stack unwinder alone: ns per capture, medians of RUNS runs (interleaved)."""
    res = {"loadavg_start": os.getloadavg()}
    built, with_lu, err = build_unwind_bench()
    if not built:
        res["error"] = "build failed: " + err
        return res
    res["libunwind"] = with_lu
    log("unwind: bench/unwind_bench %d%s" % (runs, "" if with_lu else " (libunwind-dev not installed)"))
    r = subprocess.run([UNWIND_BIN, str(runs)], capture_output=True, text=True,
                       env=dict(os.environ, **BASE_ENV))
    if r.returncode != 0:
        res["error"] = "exit status %d: %s" % (r.returncode, one_line(r.stderr))
        return res
    vals, frames = {}, {}
    for line in r.stdout.splitlines():
        m = UNWIND_RE.match(line)
        if m:
            key = (m.group(1), m.group(2))
            vals.setdefault(key, []).append(float(m.group(4)))
            if m.group(5):
                frames[key] = float(m.group(5))
        m = re.match(r"tree paths=(\d+) distinct_return_addresses=(\d+)", line)
        if m:
            res["tree_paths"], res["tree_distinct"] = int(m.group(1)), int(m.group(2))
    res["rows"] = [dict(case=c, method=meth, ns=med(v), runs=v, spread_pct=spread(v),
                        frames=frames.get((c, meth))) for (c, meth), v in vals.items()]
    res["loadavg_end"] = os.getloadavg()
    return res


def print_unwind(u):
    print("unwind: ns per stack capture (bench/unwind_bench.c), median of the runs; load average "
          "%.2f at the start, %.2f at the end" % (u["loadavg_start"][0],
                                                   (u.get("loadavg_end") or u["loadavg_start"])[0]))
    if u.get("error"):
        print("  " + u["error"])
        return
    for case, title in (("chain12", "16 frames at the bottom of a 12-deep chain (-O2 -fomit-frame-pointer), "
                                    "warm, the same stack again and again:"),
                        ("tree", "%s distinct call paths 8-20 deep (%s distinct return addresses), one "
                                 "capture of at most 16 frames per path and pass:"
                         % (u.get("tree_paths", "?"), u.get("tree_distinct", "?")))):
        print("  " + title)
        for r in u["rows"]:
            if r["case"] != case:
                continue
            per = ("%7.1f ns/frame" % (r["ns"] / r["frames"])) if r.get("frames") else " " * 15
            print("    %-28s %9.1f ns %s  +-%s%%" % (r["method"], r["ns"], per,
                                                     f(r["spread_pct"], "%.0f")))
    if not u.get("libunwind"):
        print("  (libunwind: libunwind-dev not installed)")
    print("  frame-pointer walk: on a copy of the chain built with frame pointers (wrong where a "
          "frame has none, e.g. in Debian's libc);")
    print("  tree: the cost of the descent itself (an empty capture) is subtracted; \"cold\" is "
          "the first pass after emptying mmleak-unwind's cache.")


# ------------------------------------------------------------------------------------------
# Machine description and output
# ------------------------------------------------------------------------------------------

def fs_of(path):
    path = os.path.realpath(path)
    best = ("?", "?", "")
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[2]):
                    best = (fstype, dev, mnt)
    except OSError:
        pass
    return best


def machine(dumpdir):
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    fstype, dev, mnt = fs_of(dumpdir)
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode().strip()
    except OSError:
        commit = "?"
    try:
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "mmleak.c", "mmleak.py"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode().split()
        dirty = [x for x in dirty if x.startswith("mmleak")]
    except OSError:
        dirty = []
    st = os.stat(LIB)
    return dict(cpu=cpu, cores=os.cpu_count(), uncommitted=dirty, lib=LIB,
                lib_mtime=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)), kernel=platform.release(),
                libc=" ".join(platform.libc_ver()), python=platform.python_version(),
                dump_dir=dumpdir, dump_fs=fstype, dump_dev=dev, dump_mount=mnt,
                loadavg_start=os.getloadavg(), git_commit=commit,
                heaptrack=tool_version(["heaptrack", "--version"]) if which("heaptrack") else None,
                valgrind=tool_version(["valgrind", "--version"]) if which("valgrind") else None,
                sqlite3=tool_version(["sqlite3", "--version"]) if which("sqlite3") else None,
                cc=tool_version(["cc", "--version"]))


def f(v, fmt):
    return "-" if v is None else fmt % v


def print_table(rows):
    hdr = "%-10s %-13s %-14s %7s %4s %8s %8s %8s %7s %8s %6s %9s  %s" % (
        "workload", "tracer", "size", "wall_s", "+-%", "ratio", "ns/event", "ns/ev-net", "cpu_s",
        "ns/ev-cpu", "B/event", "events", "note")
    print(hdr)
    print("-" * len(hdr))
    last = None
    for r in rows:
        if last is not None and r["workload"] != last:
            print()
        last = r["workload"]
        if r.get("error"):
            print("%-10s %-13s %-14s FAILED: %s" % (r["workload"], r["tracer"], r["size_arg"], r["error"]))
            continue
        if r.get("not_installed"):
            print("%-10s %-13s %-14s not installed" % (r["workload"], r["tracer"], ""))
            continue
        print("%-10s %-13s %-14s %7s %4s %8s %8s %8s %7s %8s %6s %9s  %s" % (
            r["workload"], r["tracer"], r["size_arg"], f(r["wall_s"], "%.3f"),
            f(r["spread_pct"], "%.0f"), f(r["ratio"], "%.2fx"), f(r["ns_per_event"], "%.0f"),
            f(r.get("ns_per_event_net"), "%.0f"), f(r.get("cpu_s"), "%.3f"),
            f(r.get("ns_per_event_cpu"), "%.0f"), f(r.get("bytes_per_event"), "%.1f"),
            f(r["events"], "%d"), r.get("note", "")))


def main():
    global LIB
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 runs, small sizes")
    ap.add_argument("--runs", type=int, default=None, help="runs per measurement (default 5, --quick 2)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only this group: a workload name (startup, alloc -t1, alloc -t2, python, "
                         "sqlite3, perl; 'alloc' matches both), 'depth', 'shrink' or 'unwind'; "
                         "repeatable")
    ap.add_argument("--dir", default="/var/tmp/mmleak-bench",
                    help="scratch directory on the real disk for dumps and inputs "
                         "(default /var/tmp/mmleak-bench; removed at the end)")
    ap.add_argument("--lib", default=LIB,
                    help="the mmleak.so to measure (default: the one `make` built at the top)")
    ap.add_argument("--json", default=os.path.join(OUT, "results.json"), help="JSON output")
    args = ap.parse_args()
    LIB = os.path.abspath(args.lib)
    runs = args.runs or (2 if args.quick else 5)

    names = [w.name for w in workloads(args.quick)] + ["alloc", "depth", "shrink", "unwind"]
    for o in args.only:
        if o not in names:
            sys.exit("bench: --only %r: not one of %s" % (o, ", ".join(names)))

    if not os.path.isfile(LIB):
        sys.exit("bench: %s not found: run make first" % LIB)
    os.makedirs(OUT, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    subprocess.check_call([cc, "-O2", "-g", "-pthread", "-o", BENCH_BIN,
                           os.path.join(HERE, "alloc_bench.c")])

    root = os.path.abspath(args.dir)
    created = not os.path.exists(root)
    os.makedirs(root, exist_ok=True)
    dirs = dict(root=root, dump=os.path.join(root, "dump"), input=os.path.join(root, "input"),
                scratch=os.path.join(root, "scratch"))
    for d in ("dump", "input", "scratch"):
        reset_dir(dirs[d])

    def wanted(name):
        if not args.only:
            return True
        return any(o == name or name.startswith(o + " ") or (o == "alloc" and name.startswith("alloc"))
                   for o in args.only)

    mach = machine(root)
    if mach["dump_fs"] in ("tmpfs", "ramfs"):
        log("warning: %s is on %s, not on a disk" % (root, mach["dump_fs"]))
    tracers_all = [Mmleak(), Heaptrack(), Valgrind()]
    tracers = [t for t in tracers_all if t.installed()]
    missing = [t.name for t in tracers_all if not t.installed()]
    t_start = time.time()
    rows, depth_summary, shrink, unwind = [], None, None, None
    try:
        for w in workloads(args.quick):
            if not wanted(w.name):
                continue
            if w.needs and not which(w.needs):
                rows.append(dict(workload=w.name, tracer="-", size_arg="", error="%s not installed" % w.needs))
                continue
            rows += bench_workload(w, tracers, runs, dirs)
            for name in missing:
                rows.append(dict(workload=w.name, tracer=name, size_arg="", not_installed=True))
        if wanted("depth"):
            drows, depth_summary = bench_depth(runs, dirs, args.quick)
            rows += drows
        if wanted("shrink"):
            shrink = bench_shrink(runs, dirs, args.quick, "heaptrack" not in missing)
        if wanted("unwind"):
            unwind = bench_unwind(runs)
    finally:
        for d in ("dump", "input", "scratch", "shrink"):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
        if created:
            try:
                os.rmdir(root)
            except OSError:
                pass
    elapsed = time.time() - t_start
    # Fixed cost of each tracer (startup row minus untraced startup), taken out for ns/ev-net.
    st = {r["tracer"]: r["wall_s"] for r in rows
          if r["workload"] == "startup" and r.get("wall_s") is not None}
    fixed = {k: v - st["none"] for k, v in st.items() if "none" in st and k != "none"}
    for r in rows:
        if r.get("ns_per_event") is not None and r["tracer"] in fixed and r["workload"] != "startup":
            base = r["wall_s"] / r["ratio"]
            r["ns_per_event_net"] = (r["wall_s"] - base - fixed[r["tracer"]]) * 1e9 / r["events"]

    print("machine: %s, %s cores, kernel %s, %s; dump dir %s on %s (%s); load avg at start %.2f"
          % (mach["cpu"], mach["cores"], mach["kernel"], mach["libc"], root, mach["dump_fs"],
             mach["dump_dev"], mach["loadavg_start"][0]))
    print("tools: %s; %s; %s; mmleak %s%s; %d runs per cell, median wall time of the whole process"
          % (mach["heaptrack"] or "heaptrack not installed", mach["valgrind"] or "valgrind not installed",
             "sqlite3 " + (mach["sqlite3"] or "?").split()[0], mach["git_commit"],
             (" + uncommitted changes to " + ", ".join(mach["uncommitted"])) if mach["uncommitted"] else "",
             runs))
    print("mmleak.so measured: %s (built %s)" % (mach["lib"], mach["lib_mtime"]))
    print()
    print_table(rows)
    print()
    print("ns/event = (median wall traced - median wall untraced at the same size) / events;")
    print("events = event lines in mmleak's dump of that workload and size (used for every tracer);")
    print("ns/ev-net = the same without the tracer's fixed cost per process (its startup row minus none's);")
    print("cpu_s = median user+system time (process and the children it waited for); ns/ev-cpu is")
    print("  ns/event from cpu_s: less disturbed by other load on the machine than wall time;")
    print("B/event = size of the mmleak.*.out files / events; +-% = (max-min)/median of the wall times.")
    ints = [r for r in rows if r.get("internal_s") is not None]
    if ints:
        print()
        print("alloc_bench's own timing of its loop (excludes process start and exit):")
        for r in ints:
            print("  %-10s %-13s %-14s loop %.3f s  %s" % (
                r["workload"], r["tracer"], r["size_arg"], r["internal_s"],
                ("added %.1f ns/event" % r["internal_ns_per_event"])
                if r.get("internal_ns_per_event") is not None else "(baseline)"))
    if depth_summary:
        print()
        print("MMLEAK_DEPTH (alloc_bench -t 1 -r 12): depth 1 -> 2 adds %s ns/event wall, %s cpu (the fast"
              % (f(depth_summary.get("step_1_to_2_ns"), "%.0f"),
                 f(depth_summary.get("step_1_to_2_ns_cpu"), "%.0f")))
        print("  writer gives way to backtrace()); each extra frame beyond 2 adds %s ns/event wall, %s cpu"
              % (f(depth_summary.get("ns_per_extra_frame"), "%.1f"),
                 f(depth_summary.get("ns_per_extra_frame_cpu"), "%.1f")))
        print("  (least-squares slope over depths 2, 4, 8) and %s bytes/event per frame (1 -> 8)."
              % f(depth_summary.get("bytes_per_extra_frame"), "%.1f"))
    if shrink is not None:
        print()
        if not shrink.get("available"):
            print(shrink.get("skipped"))
        elif shrink.get("error"):
            print("shrink: " + shrink["error"])
        else:
            ev = shrink["events"]
            print("post-processing a dump of %s (%d events, %d files, %.0f MB), median of %d:" % (
                shrink["workload"], ev, shrink["files"], shrink["dump_bytes"] / 1e6, shrink["runs"]))
            print("  mmleak.py shrink FILES > out             %7.2f s  %6.2f M events/s  peak RSS %s MB" % (
                shrink["direct_s"], shrink["direct_events_per_s"] / 1e6,
                f(shrink["direct_rss_kb"] and shrink["direct_rss_kb"] / 1024, "%.0f")))
            print("  per file sort -s -k1,1 | shrink, merged  %7.2f s  %6.2f M events/s" % (
                shrink["classic_s"], shrink["classic_events_per_s"] / 1e6))
            print("  LC_ALL=C sort -s -k1,1 alone, every file %7.2f s  %6.2f M events/s" % (
                shrink["sort_s"], ev / shrink["sort_s"] / 1e6))
            if shrink.get("report_s") is not None:
                print("  mmleak.py report --no-html               %7.2f s  %6.2f M events/s%s" % (
                    shrink["report_s"], shrink["report_events_per_s"] / 1e6,
                    ("  (" + shrink["report_error"] + ")") if shrink.get("report_error") else ""))
            elif shrink.get("report_error") or shrink.get("report_skipped"):
                print("  mmleak.py report: " + (shrink.get("report_error") or shrink.get("report_skipped")))
            if shrink.get("heaptrack_print_s") is not None:
                print("  heaptrack_print on heaptrack's recording %7.2f s  %6.2f M events/s  (recording %.0f MB)" % (
                    shrink["heaptrack_print_s"], shrink["heaptrack_print_events_per_s"] / 1e6,
                    shrink["heaptrack_file_bytes"] / 1e6))
            elif shrink.get("heaptrack_print_error"):
                print("  heaptrack_print: " + shrink["heaptrack_print_error"])
            for e in shrink.get("errors") or []:
                print("  error: " + e)
            target = 10e6
            print("  target >= 10 M events/s: %s" % (
                "met" if shrink["direct_events_per_s"] >= target else "not met"))
    if unwind is not None:
        print()
        print_unwind(unwind)
    print()
    print("(%.0f s in all)" % elapsed)
    with open(args.json, "w") as fj:
        json.dump(dict(machine=mach, runs=runs, quick=args.quick, rows=rows, depth=depth_summary,
                       unwind=unwind,
                       shrink=shrink, elapsed_s=elapsed, generated=time.strftime("%Y-%m-%dT%H:%M:%S%z")),
                  fj, indent=1, default=str)
    log("results written to %s" % os.path.relpath(args.json))


if __name__ == "__main__":
    main()
