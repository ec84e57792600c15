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
STACKS_BIN = os.path.join(OUT, "stacks_bench")
SITES_BIN = os.path.join(OUT, "sites_bench")
APPEND_BIN = os.path.join(OUT, "append_bench")
DAEMON_BIN = os.path.join(OUT, "daemon_load")
ATTACH_BIN = os.path.join(OUT, "attach_target")
BUSY_BIN = os.path.join(OUT, "busy_threads")

# Environment shared by every run of every tracer (deterministic programs).
BASE_ENV = {"LC_ALL": "C", "PYTHONHASHSEED": "0"}


FAILURES = []


def failed(error):
    """ERROR, printed as a measurement that FAILED: remembered, so that the benchmark exits 1
    (a tool the machine does not have is not a failure: its row says so)."""
    if not str(error).endswith("not installed"):
        FAILURES.append(error)
    return error


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


BLANK_RE = re.compile(rb"(?m)^ *\n")


CHUNK = 1 << 24


def chunks(path):
    """The file PATH in chunks of CHUNK bytes."""
    with open(path, "rb") as f:
        while True:
            buf = f.read(CHUNK)
            if not buf:
                return
            yield buf


def count_events(paths):
    """Event lines (lines not starting with '#') in mmleak dump files; NUL padding and blank
    lines (the padding of aligned flushes) ignored."""
    events = 0
    for path in paths:
        lines = hashes = blanks = 0
        prev = b"\n"
        last = b"\n"
        for buf in chunks(path):
            buf = buf.rstrip(b"\0") if len(buf) < CHUNK else buf
            if not buf:
                break
            lines += buf.count(b"\n")
            hashes += buf.count(b"\n#") + (1 if prev == b"\n" and buf[:1] == b"#" else 0)
            blanks += len(BLANK_RE.findall(buf))
            if prev != b"\n" and BLANK_RE.match(buf):
                blanks -= 1     # the end of a line begun in the previous read
            prev = last = buf[-1:]
        if last != b"\n":
            lines += 1  # a torn last line still counts as a line (a header has a newline)
        events += lines - hashes - blanks
    return events


def dump_bytes(paths):
    return sum(os.path.getsize(p) for p in paths)


STACK_LINE_RE = re.compile(rb"^#s ([0-9a-f]+) ", re.M)


def count_stacks(paths):
    """Distinct stack ids on the '#s ID FRAMES' lines of mmleak dump files."""
    ids = set()
    for path in paths:
        rest = b""
        for buf in chunks(path):
            buf = rest + buf
            cut = buf.rfind(b"\n") + 1
            rest = buf[cut:]
            ids.update(STACK_LINE_RE.findall(buf, 0, cut))
        ids.update(STACK_LINE_RE.findall(rest))
    return len(ids)


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
    def __init__(self, depth=None, name=None, scan=True):
        self.depth = depth
        self.scan = scan
        self.name = name or ("mmleak" if depth is None else "mmleak d=%d" % depth)

    def installed(self):
        return os.path.isfile(LIB)

    def wrap(self, argv, dumpdir):
        env = {"LD_PRELOAD": LIB, "MMLEAK_DIR": dumpdir}
        if self.depth is not None:
            env["MMLEAK_DEPTH"] = str(self.depth)
        if not self.scan:
            env["MMLEAK_SCAN"] = "0"
        return argv, env


# mmleak with its defaults but MMLEAK_SCAN=0: the hot path alone, without the reachability
# scan at exit (mmleak-scan(7)); run beside the default on the workloads named here, so
# that the report separates the two (exit_scan_costs)
NOSCAN = "mmleak noscan"
NOSCAN_WORKLOADS = ("startup", "alloc -t1", "alloc -t2")


def exit_scan_costs(rows, with_scan, workloads_=None):
    """For each workload with a row of WITH_SCAN (mmleak's default, the scan at exit on) and
    one of NOSCAN from the same run: the exit scan's cost, their difference: ms of wall and
    of cpu per process, and ns per event of the trace (the scan reads the whole trace).
    Sets exit_scan_* on the WITH_SCAN rows; returns them."""
    out = []
    by = {(r.get("workload"), r.get("tracer")): r for r in rows}
    for (wl, tr), r in sorted(by.items(), key=lambda kv: str(kv[0])):
        if tr != with_scan or (workloads_ and wl not in workloads_):
            continue
        n = by.get((wl, NOSCAN))
        if not n or r.get("wall_s") is None or n.get("wall_s") is None:
            continue
        r["exit_scan_ms"] = (r["wall_s"] - n["wall_s"]) * 1000
        if r.get("cpu_s") is not None and n.get("cpu_s") is not None:
            r["exit_scan_cpu_ms"] = (r["cpu_s"] - n["cpu_s"]) * 1000
        ev = r.get("events")
        if ev and ev >= 1000:
            r["exit_scan_ns_per_event"] = r["exit_scan_ms"] * 1e6 / ev
            if r.get("exit_scan_cpu_ms") is not None:
                r["exit_scan_ns_per_event_cpu"] = r["exit_scan_cpu_ms"] * 1e6 / ev
        out.append(r)
    return out


def print_exit_scan(scan_rows, with_scan):
    if not scan_rows:
        return
    print("exit scan: %s (scan at exit, the default) minus %s (MMLEAK_SCAN=0), same runs:"
          % (with_scan, NOSCAN))
    for r in scan_rows:
        per = ""
        if r.get("exit_scan_ns_per_event") is not None:
            per = "; %s ns/event of trace wall, %s cpu" % (
                f(r["exit_scan_ns_per_event"], "%.1f"), f(r.get("exit_scan_ns_per_event_cpu"), "%.1f"))
        print("  %-10s %-14s +%s ms wall, +%s ms cpu per process%s" % (
            r["workload"], r["size_arg"], f(r["exit_scan_ms"], "%.2f"),
            f(r.get("exit_scan_cpu_ms"), "%.2f"), per))
    print("  (the scan reads the whole uncompacted trace once: its cost grows with the events")
    print("  written, not with the run's length; see mmleak-performance(7))")


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
                 group="a", stacks=False):
        self.name, self.desc, self.make, self.sizes = name, desc, make, sizes
        self.size_label, self.needs, self.internal, self.group = size_label, needs, internal, group
        self.stacks = stacks  # count the distinct stacks in mmleak's dump, and heaptrack's file size


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
        j.update(walls=[], cpus=[], internal=[], bytes=[], ht_bytes=[], events=None, stacks=None,
                 error=None)
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
                # a trace that ended well: its dump files, the maps copy, the scan's result and
                # the trace's lock (made empty by mmleak.so at the start: docs/format.rst)
                other = [x for x in os.listdir(dirs["dump"]) if x.startswith("mmleak.")
                         and not x.endswith((".out", ".maps", ".lock")) and ".scan." not in x]
                if other and not j.get("warned"):
                    j["warned"] = True
                    log("  warning: %s / %s left %s after a normal exit (not counted)"
                        % (label, j["key"], ", ".join(sorted(other)[:4])))
                if j["events"] is None:
                    j["events"] = count_events(files)
                    if j.get("count_stacks"):
                        j["stacks"] = count_stacks(files)
            elif isinstance(j["tracer"], Heaptrack) and j.get("count_stacks"):
                rec = [os.path.join(dirs["dump"], x) for x in os.listdir(dirs["dump"])
                       if x.startswith("heaptrack.bench")]
                if rec:
                    j["ht_bytes"].append(dump_bytes(rec))
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
                                 count_only=False, count_stacks=w.stacks))
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
        if j["stacks"] is not None:
            row["stacks"] = j["stacks"]
        if j["ht_bytes"] and ev:
            row["file_bytes"] = med(j["ht_bytes"])
            row["file_bytes_per_event"] = row["file_bytes"] / ev
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


# ------------------------------------------------------------------------------------------
# stacks: the cost of recording stacks (MMLEAK_DEPTH 1, auto, unset: whole stacks, 16)
# against heaptrack
# ------------------------------------------------------------------------------------------

WHOLE = "mmleak whole"      # MMLEAK_DEPTH unset: the default, whole stacks (up to 64 frames)
BYTES_SLACK = 0.05          # B/event: a file's "#s" lines (its few stacks, once per file)
STACKS_TARGETS = [
    # (workload, tracer, quantity, limit, label); a limit that is a tracer's name: that
    # tracer's value of the same quantity on the same workload, + BYTES_SLACK for bytes.
    # Time per event is the program's own timing of its loop (loop-ns), as issues 9 and 21
    # measure it: the whole process's figure also holds the scan at exit, which reads the
    # whole trace once (about 45 ns per event of a trace never compacted: its own line,
    # "exit scan", below the table), and process start and exit.
    ("a -r 12", WHOLE, "internal_ns_per_event", 25, "default (whole stacks) on (a) alloc_bench -r 12: <= 25 loop-ns/event added"),
    ("b plain", WHOLE, "internal_ns_per_event", 25, "default (whole stacks) on (b) plain alloc_bench: <= 25 loop-ns/event added"),
    ("c tree", WHOLE, "internal_ns_per_event", 40, "default (whole stacks) on (c) stacks_bench: <= 40 loop-ns/event added"),
    ("a -r 12", WHOLE, "bytes_per_event", "mmleak auto", "default on (a): B/event <= auto's (the old default) + 0.05"),
    ("b plain", WHOLE, "bytes_per_event", "mmleak auto", "default on (b): B/event <= auto's (the old default) + 0.05"),
    ("c tree", WHOLE, "bytes_per_event", 40, "default on (c): <= 40 bytes/event (4099 stacks defined per file)"),
    ("a -r 12", "mmleak d=16", "internal_ns_per_event", 80, "depth 16 on (a) alloc_bench -r 12: <= 80 loop-ns/event added"),
    ("a -r 12", "mmleak d=16", "bytes_per_event", 40, "depth 16 on (a) alloc_bench -r 12: <= 40 bytes/event"),
    ("c tree", "mmleak d=16", "internal_ns_per_event", 80, "depth 16 on (c) stacks_bench: <= 80 loop-ns/event added"),
    ("c tree", "mmleak d=16", "bytes_per_event", 40, "depth 16 on (c) stacks_bench: <= 40 bytes/event"),
    ("b plain", "mmleak d=1", "internal_ns_per_event", 20, "depth 1 on (b) plain alloc_bench: <= 20 loop-ns/event added"),
    ("startup", WHOLE, "startup_ms", 1.0, "start-up, default mode (alloc_bench -n 0): <= 1 ms extra"),
    ("startup", NOSCAN, "startup_ms", 1.0, "start-up without the exit scan (MMLEAK_SCAN=0): <= 1 ms extra"),
]


STACKS_NOSCAN = ("b plain",)    # besides startup: an alloc loop with and without the exit scan


def build_stacks_bench():
    cc = os.environ.get("CC", "cc")
    # -O2 without frame pointers: mmleak's unwinder can only use the DWARF CFI.  No -g: the
    # unwinders need only .eh_frame, and the binary stays small.
    for out, src in ((STACKS_BIN, "stacks_bench.c"), (SITES_BIN, "sites_bench.c")):
        subprocess.check_call([cc, "-O2", "-fomit-frame-pointer", "-o", out,
                               os.path.join(HERE, src)])


def stacks_workloads(quick):
    q = quick

    def ab(nest):
        def make(n, indir):
            return [BENCH_BIN, "-t", "1", "-n", str(n)] + (["-r", str(nest)] if nest else []), None
        return make

    def sb(n, indir):
        return [STACKS_BIN, "-n", str(n)], None

    def sd(n, indir):
        return [SITES_BIN, "-n", str(n)], None

    real = {w.name: w for w in workloads(quick)}
    return [
        Workload("startup", "alloc_bench -n 0: start, first events (stdio buffer), exit",
                 ab(0), {"none": 0}, "-n", stacks=True),
        Workload("a -r 12", "alloc_bench -t 1 -r 12: the loop 12 extra frames deep (one stack)",
                 ab(12), {"none": 1000000 if not q else 200000,
                          "heaptrack": 1000000 if not q else 100000}, "-n", stacks=True),
        Workload("b plain", "alloc_bench -t 1: malloc/free called from main's loop (one frame)",
                 ab(0), {"none": 2000000 if not q else 400000,
                         "heaptrack": 500000 if not q else 100000}, "-n", stacks=True),
        # heaptrack on stacks_bench: kept small; from about 70k steps on, heaptrack_interpret
        # grows to ~19 GB and takes 20-50 s (see bench/README.rst).
        Workload("c tree", "bench/stacks_bench.c: 4096 call paths 8-20 deep through 256 functions",
                 sb, {"none": 1000000 if not q else 200000,
                      "heaptrack": 40000 if not q else 20000}, "-n", stacks=True),
        # the shape c lacks: one function calling a wrapper from 16 call sites (one start)
        Workload("d sites", "bench/sites_bench.c: a wrapper called from 16 call sites of one "
                 "function", sd, {"none": 2000000 if not q else 400000,
                                  "heaptrack": 500000 if not q else 100000}, "-n", stacks=True),
        Workload("python", real["python"].desc, real["python"].make,
                 {"none": real["python"].sizes["none"]}, "N", stacks=True),
        Workload("sqlite3", real["sqlite3"].desc, real["sqlite3"].make,
                 {"none": real["sqlite3"].sizes["none"]}, "N", needs="sqlite3", stacks=True),
    ]


def bench_stacks(runs, dirs, quick, have_heaptrack):
    res = {"loadavg_start": os.getloadavg(), "rows": [], "targets": []}
    try:
        build_stacks_bench()
    except (OSError, subprocess.CalledProcessError) as e:
        res["error"] = "building stacks_bench failed: %s" % e
        return res
    mm = [Mmleak(1, "mmleak d=1"), Mmleak("auto", "mmleak auto"), Mmleak(None, WHOLE),
          Mmleak(16, "mmleak d=16")]
    ht = [Heaptrack()] if have_heaptrack else []
    # the default without its scan at exit, where the scan's cost is to be told apart
    noscan = [Mmleak(None, NOSCAN, scan=False)]
    for w in stacks_workloads(quick):
        if w.needs and not which(w.needs):
            res["rows"].append(dict(workload=w.name, tracer="-", size_arg="",
                                    error="%s not installed" % w.needs))
            continue
        if w.name == "startup":
            # a difference of about 1 ms on a ~3 ms process: many short runs
            res["rows"] += bench_workload(w, mm + noscan, max(runs * 6, 31) if not quick else 6,
                                          dirs)
        elif w.name in ("python", "sqlite3"):
            res["rows"] += bench_workload(w, mm, runs, dirs)
        elif w.name in STACKS_NOSCAN:
            res["rows"] += bench_workload(w, mm + noscan + ht, runs, dirs)
        else:
            res["rows"] += bench_workload(w, mm + ht, runs, dirs)
    res["exit_scan"] = exit_scan_costs(res["rows"], WHOLE)
    st = {r["tracer"]: r for r in res["rows"] if r["workload"] == "startup" and r.get("wall_s")}
    for r in st.values():
        if "none" in st and r["tracer"] != "none":
            r["startup_ms"] = (r["wall_s"] - st["none"]["wall_s"]) * 1000
            r["startup_cpu_ms"] = (r["cpu_s"] - st["none"]["cpu_s"]) * 1000
    def value(wl, tr, key):
        row = next((r for r in res["rows"] if r["workload"] == wl and r["tracer"] == tr), None)
        return row.get(key) if row else None
    for wl, tr, key, limit, label in STACKS_TARGETS:
        v = value(wl, tr, key)
        against = isinstance(limit, str)
        if against:
            limit = value(wl, limit, key)
            if limit is not None and key == "bytes_per_event":
                limit += BYTES_SLACK
        res["targets"].append(dict(label=label, value=v, limit=limit, key=key, against=against,
                                   met=None if v is None or limit is None else v <= limit))
    res["loadavg_end"] = os.getloadavg()
    return res


def print_stacks(s):
    print("stacks: recording stacks, MMLEAK_DEPTH=1 / auto / unset (whole: the default) / 16, and heaptrack; "
          "load average %.2f at the start, %.2f at the end"
          % (s["loadavg_start"][0], (s.get("loadavg_end") or s["loadavg_start"])[0]))
    if s.get("error"):
        print("  " + s["error"])
        return
    hdr = "%-9s %-12s %-9s %7s %4s %8s %8s %8s %8s %7s %6s %9s  %s" % (
        "workload", "tracer", "size", "wall_s", "+-%", "ratio", "ns/event", "ns/ev-cpu",
        "loop-ns", "B/event", "stacks", "events", "note")
    for r in table_rows(hdr, s["rows"]):
        if r.get("error"):
            print("%-9s %-12s %-9s FAILED: %s" % (r["workload"], r["tracer"], r["size_arg"],
                                                  failed(r["error"])))
            continue
        bpe = r.get("bytes_per_event")
        note = r.get("note", "")
        if r.get("file_bytes_per_event") is not None:
            bpe = r["file_bytes_per_event"]
            note = ("its compressed recording; " + note).rstrip("; ")
        if r["workload"] == "startup" and r.get("startup_ms") is not None:
            note = ("+%.2f ms wall, +%.2f ms cpu vs none; " % (r["startup_ms"], r["startup_cpu_ms"])
                    + note).rstrip("; ")
        print("%-9s %-12s %-9s %7s %4s %8s %8s %8s %8s %7s %6s %9s  %s" % (
            r["workload"], r["tracer"], r["size_arg"], f(r["wall_s"], "%.3f"),
            f(r["spread_pct"], "%.0f"), f(r["ratio"], "%.2fx"), f(r["ns_per_event"], "%.0f"),
            f(r.get("ns_per_event_cpu"), "%.0f"), f(r.get("internal_ns_per_event"), "%.0f"),
            f(bpe, "%.1f"), f(r.get("stacks"), "%d"), f(r["events"], "%d"), note))
    print()
    print("ns/event = (median wall traced - median wall untraced, same input) / events (whole process);")
    print("  ns/ev-cpu the same from user+system time; loop-ns the same from the program's own timing")
    print("  of its loop (alloc_bench, stacks_bench: without process start and exit);")
    print("B/event = bytes written / events (mmleak: its .out files, #s stack lines included; heaptrack:")
    print("  its zstd-compressed recording); stacks = distinct #s stack ids in mmleak's dump (0: every")
    print("  event fitted in one frame); events = event lines in mmleak's dump (the same for every tracer).")
    print("%s = the default (whole stacks) with MMLEAK_SCAN=0: no reachability scan at exit." % NOSCAN)
    if s.get("exit_scan"):
        print()
        print_exit_scan(s["exit_scan"], WHOLE)
        print()
    print("targets (medians; time per event from the loop's own timing, loop-ns):")
    for t in s["targets"]:
        unit = {"internal_ns_per_event": "ns/event", "bytes_per_event": "B/event",
                "startup_ms": "ms"}[t["key"]]
        fmt = "%.2f" if t["key"] in ("startup_ms", "bytes_per_event") else "%.1f"
        print("  %-71s %s  (%s %s%s)" % (t["label"], {True: "met", False: "NOT MET", None: "not measured"}[t["met"]],
                                          f(t["value"], fmt), unit,
                                          " against " + f(t["limit"], fmt) if t.get("against") else ""))


# ------------------------------------------------------------------------------------------
# longrun: a daemon at 1 M events/s under `mmleak.py run` (compaction, rotation at 8 MB)
# ------------------------------------------------------------------------------------------

LONG_THREADS = 2
LONG_RATE = 250000          # pairs per second per thread: 2 x 250,000 x 2 events = 1 M events/s
LONG_LEAK = 10000           # a 48-byte block leaked every so many pairs, per thread
# target: the dump directory never exceeds 100 MB, or, for a big live set, what follows it:
# the files in flight (per thread: the file being written, one complete and one being folded,
# 8 MB each) plus twice the result (a pass writes a merged run before the runs it replaces go)
LONG_DIR_LIMIT = 100e6
LONG_IN_FLIGHT = LONG_THREADS * 3 * 8e6
CLK_TCK = os.sysconf("SC_CLK_TCK")


def build_daemon_load():
    cc = os.environ.get("CC", "cc")
    subprocess.check_call([cc, "-O2", "-g", "-pthread", "-o", DAEMON_BIN,
                           os.path.join(ROOT, "tests", "daemon_load.c"), "-ldl"])


def proc_stat(pid):
    """(utime + stime, start time since boot, stime), in seconds, of process PID, or None."""
    try:
        with open("/proc/%d/stat" % pid) as fp:
            fields = fp.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state): utime is field 14, stime 15, starttime 22
    return ((int(fields[11]) + int(fields[12])) / CLK_TCK, int(fields[19]) / CLK_TCK,
            int(fields[12]) / CLK_TCK)


def proc_rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as fp:
            for line in fp:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def uptime_s():
    with open("/proc/uptime") as fp:
        return float(fp.read().split()[0])


def dir_usage(d):
    """(apparent bytes, allocated bytes, number of files) of the files in directory D."""
    size = alloc = n = 0
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # deleted meanwhile
                size += st.st_size
                alloc += st.st_blocks * 512
                n += 1
    except OSError:
        pass
    return size, alloc, n


def child_of(pid, timeout=10.0):
    """The first child process of PID (the program `mmleak.py run` started)."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            with open("/proc/%d/task/%d/children" % (pid, pid)) as fp:
                kids = fp.read().split()
            if kids:
                return int(kids[0])
        except OSError:
            for d in os.listdir("/proc"):
                if d.isdigit():
                    try:
                        with open("/proc/%s/stat" % d) as fp:
                            if int(fp.read().rsplit(")", 1)[1].split()[1]) == pid:
                                return int(d)
                    except (OSError, IndexError, ValueError):
                        pass
        time.sleep(0.01)
    return None


# a row: bytes, blocks, the kind where a reachability scan ran (definite, indirect...), the site
REPORT_ROW_RE = re.compile(r"^\s+(\d+)\s+(\d+)\s+(?:(?:definite|indirect|possible|reachable|unknown)\s+)?(\S.*)$")


def report_sites(text):
    """The call-site table of `mmleak.py report --no-html`: [(bytes, blocks, site)] (the kind
    column, when the trace has a scan, is left out: a site's rows of two kinds are two rows)."""
    rows = []
    started = False
    for line in text.splitlines():
        if re.match(r"^\s+bytes\s+blocks\s+(kind\s+)?call site", line):
            started = True
            continue
        if started:
            m = REPORT_ROW_RE.match(line)
            if not m:
                break
            rows.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    return rows


def longrun_once(mode, seconds, root, scratch, sample_every=0.5):
    """One run of daemon_load -t 2 at 1 M events/s for SECONDS: mode "none" (untraced),
    "keep-all" (`mmleak.py run --keep-all`) or "compact" (`mmleak.py run`).  Samples the
    dump directory and the processes twice a second."""
    pairs = LONG_RATE * seconds
    leaks = LONG_THREADS * (pairs // LONG_LEAK)
    ddir = os.path.join(root, "longrun-" + mode)
    reset_dir(ddir)
    load = [DAEMON_BIN, "-t", str(LONG_THREADS), "-n", str(pairs), "-r", str(LONG_RATE),
            "-l", str(LONG_LEAK), "-w"]
    if mode == "none":
        argv = load
    else:
        argv = [PY, MMLEAK_PY, "run", "-d", ddir, "--lib", LIB] + \
               (["--keep-all"] if mode == "keep-all" else []) + ["--"] + load
    env = dict(os.environ, **BASE_ENV)
    err_path = os.path.join(scratch, "longrun-%s.stderr" % mode)
    res = dict(mode=mode, seconds=seconds, pairs_per_thread=pairs, threads=LONG_THREADS,
               expected_leaks=leaks, events_expected=LONG_THREADS * pairs * 2 + leaks,
               loadavg_start=os.getloadavg())
    samples = []
    stop = [False]
    with open(err_path, "wb") as ferr:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=ferr)
        load_pid = p.pid if mode == "none" else child_of(p.pid)
        import threading

        def sampler():
            while not stop[0]:
                size, alloc, n = dir_usage(ddir)
                ls = proc_stat(load_pid) if load_pid else None
                rs = proc_stat(p.pid) if mode != "none" else None
                samples.append(dict(t=round(time.perf_counter() - t0, 2), dir_bytes=size,
                                    dir_alloc=alloc, files=n,
                                    run_rss_kb=proc_rss_kb(p.pid) if mode != "none" else None,
                                    load_rss_kb=proc_rss_kb(load_pid) if load_pid else None,
                                    run_cpu=rs and rs[0], load_cpu=ls and ls[0]))
                time.sleep(sample_every)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        out_lines = []
        at_ready = None
        for raw in p.stdout:
            line = raw.decode("utf-8", "replace").strip()
            out_lines.append(line)
            if line == "ready":
                ls = proc_stat(load_pid) if load_pid else None
                at_ready = dict(t=time.perf_counter() - t0, uptime=uptime_s(), load=ls,
                                run=proc_stat(p.pid) if mode != "none" else None)
                p.stdin.write(b"\n")
                p.stdin.close()
        _, status, ru = os.wait4(p.pid, 0)
        res["total_wall_s"] = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        stop[0] = True
        th.join()
    size, alloc, n = dir_usage(ddir)
    samples.append(dict(t=round(res["total_wall_s"], 2), dir_bytes=size, dir_alloc=alloc, files=n,
                        run_rss_kb=None, load_rss_kb=None, run_cpu=None, load_cpu=None, final=True))
    with open(err_path, "rb") as fp:
        err = fp.read().decode("utf-8", "replace")
    res["rc"] = p.returncode
    res["stdout"] = out_lines
    res["stderr_tail"] = one_line(err, 400)
    res["dup_warnings"] = err.count("event seen twice")
    res["stderr_lines"] = len([l for l in err.splitlines() if l.strip()])
    res["total_cpu_s"] = ru.ru_utime + ru.ru_stime  # run process (compactor) + the load
    if p.returncode != 0 or at_ready is None or not at_ready["load"]:
        res["error"] = "exit status %d: %s" % (p.returncode, one_line(err))
        return res
    res["load_cpu_s"], start, res["load_sys_s"] = at_ready["load"]
    res["load_wall_s"] = at_ready["uptime"] - start
    res["run_cpu_s"] = res["total_cpu_s"] - res["load_cpu_s"] if mode != "none" else 0.0
    res["finish_s"] = res["total_wall_s"] - at_ready["t"]  # after the load's work: final pass
    m = [l for l in out_lines if l.startswith("leaked ")]
    res["load_leaked"] = int(m[-1].split()[1]) if m else None
    res["events_per_s"] = res["events_expected"] / res["load_wall_s"]
    res["max_dir_bytes"] = max(s["dir_bytes"] for s in samples)
    res["max_dir_alloc"] = max(s["dir_alloc"] for s in samples)
    res["final_dir_bytes"], res["final_files"] = size, n
    rss = [s["run_rss_kb"] for s in samples if s.get("run_rss_kb")]
    res["run_rss_kb_max"] = max(rss) if rss else None
    res["run_rss_kb_first"] = rss[0] if rss else None
    res["run_rss_kb_last"] = rss[-1] if rss else None
    res["samples"] = samples
    files = os.listdir(ddir)
    res["final_file_names"] = sorted(files)
    series = [x for x in files if x.endswith(".series")]
    res["series_bytes"] = os.path.getsize(os.path.join(ddir, series[0])) if series else None
    live = [x for x in files if x.endswith(".series.live")]
    res["series_live_bytes"] = os.path.getsize(os.path.join(ddir, live[0])) if live else None
    if mode != "none":
        t1 = time.perf_counter()
        r = subprocess.run([PY, MMLEAK_PY, "report", ddir, "--no-html", "--show-reachable"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env)
        res["report_s"] = time.perf_counter() - t1
        res["report_rc"] = r.returncode
        text = r.stdout.decode("utf-8", "replace")
        res["report_head"] = text.splitlines()[:12]
        sites = report_sites(text)
        res["report_sites"] = sites
        lk = [s for s in sites if s[2].startswith("leak_one ")]
        res["leak_rows"] = lk
        others = [s for s in sites if not s[2].startswith("leak_one ")]
        # The planted leaks, exactly: one row at leak_one, LEAKS blocks of 48 bytes; the rest
        # is what every run of daemon_load leaves (stdout's buffer, the threads' DTVs) and
        # must not grow with the run (no row above 8 KiB).
        # (a site's rows of two kinds are two rows: lost blocks whose stale words point to
        # others are "indirect", the last one kept in a global "reachable"; together exact)
        res["leaks_exact"] = (r.returncode == 0 and res["load_leaked"] == leaks
                              and (sum(b for _, b, _ in lk) == leaks
                                   and sum(n for n, _, _ in lk) == 48 * leaks
                                   if leaks else not lk)
                              and all(b <= 8192 for b, _, _ in others))
        res["report_other_sites"] = others
    res["loadavg_end"] = os.getloadavg()
    shutil.rmtree(ddir, ignore_errors=True)
    return res


def bench_longrun(dirs, quick, seconds=None, modes=("none", "keep-all", "compact")):
    seconds = seconds or (10 if quick else 60)
    res = {"loadavg_start": os.getloadavg(), "runs": [], "seconds": seconds}
    try:
        build_daemon_load()
    except (OSError, subprocess.CalledProcessError) as e:
        res["error"] = "building daemon_load failed: %s" % e
        return res
    for mode in modes:
        log("longrun: %s, %d s at %d events/s" % (mode, seconds, LONG_THREADS * LONG_RATE * 2))
        r = longrun_once(mode, seconds, dirs["root"], dirs["scratch"])
        log("  longrun %s: %s" % (mode, r.get("error") or "load %.1f s wall, %.2f s cpu, max dir %.1f MB"
                                  % (r["load_wall_s"], r["load_cpu_s"], r["max_dir_bytes"] / 1e6)))
        res["runs"].append(r)
    res["loadavg_end"] = os.getloadavg()
    by = {r["mode"]: r for r in res["runs"] if not r.get("error")}
    c, k = by.get("compact"), by.get("keep-all")
    t = []
    if c:
        limit = max(LONG_DIR_LIMIT, LONG_IN_FLIGHT + 2 * c["final_dir_bytes"])
        t.append(dict(label="dump directory never exceeds the larger of 100 MB and %.0f MB in "
                            "flight + 2 x the final result (max of the samples)"
                            % (LONG_IN_FLIGHT / 1e6),
                      met=c["max_dir_bytes"] <= limit,
                      value="%.1f MB against %.1f MB" % (c["max_dir_bytes"] / 1e6, limit / 1e6)))
        t.append(dict(label="report names exactly the planted leaks (%d x 48 B at leak_one)"
                      % c["expected_leaks"], met=c["leaks_exact"],
                      value="; ".join("%d B %d blocks %s" % s for s in c["report_sites"]) or
                      "no rows (exit %s)" % c.get("report_rc")))
    if c and k:
        # The load's own CPU with compaction against the tracer alone; 3 % allowance for the
        # noise of single runs (the load's CPU time varies by 1-2 % between runs).
        t.append(dict(label="load's CPU with compaction <= with the tracer alone (+3 %)",
                      met=c["load_cpu_s"] <= k["load_cpu_s"] * 1.03,
                      value="%.2f s against %.2f s" % (c["load_cpu_s"], k["load_cpu_s"])))
        t.append(dict(label="load's wall time with compaction <= with the tracer alone (+1 %)",
                      met=c["load_wall_s"] <= k["load_wall_s"] * 1.01,
                      value="%.2f s against %.2f s" % (c["load_wall_s"], k["load_wall_s"])))
    res["targets"] = t
    return res


def mb(x):
    return "-" if x is None else "%.1f" % (x / 1e6)


def print_longrun_series(r):
    """The compaction run in ten slices of time: does anything accumulate?"""
    ser = [x for x in r["samples"] if not x.get("final") and x.get("run_cpu") is not None]
    if len(ser) < 10:
        return
    span = r["seconds"] / 10.0
    print("  over time (%d slices of %.0f s): dump directory (max and mean of the samples, most "
          "files), `mmleak.py run` RSS at the slice's end, its CPU in the slice (%% of a CPU):"
          % (10, span))
    for i in range(10):
        w = [x for x in ser if i * span <= x["t"] < (i + 1) * span]
        if len(w) < 2:
            continue
        cpu = (w[-1]["run_cpu"] - w[0]["run_cpu"]) / (w[-1]["t"] - w[0]["t"]) * 100
        print("    %5.0f-%-5.0f s  dir max %6.1f MB  mean %6.1f MB  files %3d  RSS %6.1f MB  "
              "compactor %3.0f %%" % (i * span, (i + 1) * span,
                                      max(x["dir_bytes"] for x in w) / 1e6,
                                      sum(x["dir_bytes"] for x in w) / len(w) / 1e6,
                                      max(x["files"] for x in w),
                                      (w[-1]["run_rss_kb"] or 0) / 1024, cpu))


def print_longrun(lr, title="longrun"):
    print("%s: tests/daemon_load.c -t %d -r %d -l %d -w: %d threads x %d pairs/s = %d events/s "
          "for %d s; load average %.2f at the start, %.2f at the end"
          % (title, LONG_THREADS, LONG_RATE, LONG_LEAK, LONG_THREADS, LONG_RATE,
             LONG_THREADS * LONG_RATE * 2, lr["seconds"], lr["loadavg_start"][0],
             (lr.get("loadavg_end") or lr["loadavg_start"])[0]))
    if lr.get("error"):
        print("  " + lr["error"])
        return
    hdr = "%-9s %8s %8s %6s %9s %8s %10s %10s %9s %6s %9s %9s" % (
        "mode", "wall_s", "cpu_s", "sys_s", "+cpu/ev", "Mev/s", "run cpu_s", "max dir MB",
        "end dir MB", "files", "run RSS MB", "finish_s")
    print(hdr)
    print("-" * len(hdr))
    base = next((r for r in lr["runs"] if r["mode"] == "none" and not r.get("error")), None)
    for r in lr["runs"]:
        if r.get("error"):
            print("%-9s FAILED: %s" % (r["mode"], failed(r["error"])))
            continue
        add = ((r["load_cpu_s"] - base["load_cpu_s"]) * 1e9 / r["events_expected"]
               if base and r is not base else None)
        print("%-9s %8.2f %8.2f %6.2f %9s %8.3f %10s %10s %10s %6d %9s %9s" % (
            r["mode"], r["load_wall_s"], r["load_cpu_s"], r["load_sys_s"], f(add, "%.1f ns"),
            r["events_per_s"] / 1e6, f(r["run_cpu_s"] if r["mode"] != "none" else None, "%.2f"),
            mb(r["max_dir_bytes"]) if r["mode"] != "none" else "-",
            mb(r["final_dir_bytes"]) if r["mode"] != "none" else "-", r["final_files"],
            f(r["run_rss_kb_max"] and r["run_rss_kb_max"] / 1024, "%.1f"),
            f(r["finish_s"] if r["mode"] != "none" else None, "%.2f")))
    print("wall_s, cpu_s: the load process alone (daemon_load, from its start to the end of its work;")
    print("  CPU = user + system of all its threads, sys_s the system part); +cpu/ev: its CPU time per")
    print("  event above the untraced run; run cpu_s: CPU of the `mmleak.py run` process itself (the")
    print("  compactor thread, and Python's start); max/end dir MB: apparent size of all files in the")
    print("  dump directory (sampled every 0.5 s; the end after the final pass); run RSS: the `mmleak.py")
    print("  run` process (its compactor, max of the samples); finish_s: from the end of the load's work")
    print("  to the end of `mmleak.py run` (its last pass).")
    for r in lr["runs"]:
        if r.get("error") or r["mode"] == "none":
            continue
        print("%s: report in %.1f s (exit %d): %s" % (
            r["mode"], r["report_s"], r["report_rc"],
            "; ".join("%d B %d blocks %s" % s for s in r["report_sites"]) or "no call-site rows"))
        if r["dup_warnings"]:
            print("  mmleak.py run printed %d \"event seen twice\" warnings while it ran (%d stderr lines)"
                  % (r["dup_warnings"], r["stderr_lines"]))
        if r["mode"] == "compact":
            print_longrun_series(r)
            print("  at the end: %d files (%s), mmleak.ID.series %s bytes, .series.live %s"
                  % (r["final_files"], " ".join(x.split(".", 2)[-1] for x in r["final_file_names"]),
                     r["series_bytes"], "%d bytes" % r["series_live_bytes"]
                     if r["series_live_bytes"] is not None else "gone (the trace is over)"))
    print("targets:")
    for t in lr.get("targets", []):
        print("  %-66s %s  (%s)" % (t["label"], "met" if t["met"] else "NOT MET", t["value"]))


# ------------------------------------------------------------------------------------------
# attach: mmleak.py attach / detach on a process with 1 GB of heap and 8 threads
# ------------------------------------------------------------------------------------------

ATTACH_HEAP_MB = 1024
ATTACH_THREADS = 8
ATTACH_RATE = 125000        # pairs/s per thread: 8 x 125,000 x 2 = 2 M events/s
ATTACH_SETTLE = 0.5         # s from a trace's start (attach, or start under LD_PRELOAD) to its window


def build_attach_target():
    cc = os.environ.get("CC", "cc")
    subprocess.check_call([cc, "-O2", "-g", "-pthread", "-o", ATTACH_BIN,
                           os.path.join(HERE, "attach_target.c")])


class Target:
    """bench/attach_target.c, started with ENV; asks it for its counters."""

    def __init__(self, env, heap_mb):
        full = dict(os.environ, **BASE_ENV)
        full.update(env)
        t0 = time.perf_counter()
        self.p = subprocess.Popen([ATTACH_BIN, "-m", str(heap_mb), "-t", str(ATTACH_THREADS),
                                   "-r", str(ATTACH_RATE)], env=full, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.p.stdout.readline().decode()
        if not line.startswith("ready"):
            err = self.p.stderr.read().decode("utf-8", "replace") if self.p.poll() is not None else ""
            raise RuntimeError("attach_target did not start: %r %s" % (line, one_line(err)))
        self.ready_s = time.perf_counter() - t0
        self.pid = self.p.pid

    def stats(self):
        self.p.stdin.write(b"s\n")
        self.p.stdin.flush()
        words = self.p.stdout.readline().decode().split()
        return {k: float(v) for k, v in (w.split("=") for w in words[1:])}

    def sys_ticks(self):
        """The process's system time so far, in clock ticks (/proc/PID/stat)."""
        try:
            with open("/proc/%d/stat" % self.pid) as f:
                return int(f.read().rsplit(")", 1)[1].split()[12])
        except (OSError, ValueError, IndexError):
            return None

    def window(self, seconds):
        """CPU ns per event (and its system part, from clock ticks: a few ns coarse) and events
        per second over SECONDS."""
        a = self.stats()
        sa = self.sys_ticks()
        time.sleep(seconds)
        sb = self.sys_ticks()
        b = self.stats()
        ev = b["events"] - a["events"]
        hz = os.sysconf("SC_CLK_TCK")
        return dict(ns_cpu=(b["cpu"] - a["cpu"]) * 1e9 / ev, ev_per_s=ev / (b["wall"] - a["wall"]),
                    cpu_per_s=(b["cpu"] - a["cpu"]) / (b["wall"] - a["wall"]),
                    ns_sys=(sb - sa) * 1e9 / hz / ev if sa is not None and sb is not None else None)

    def rss_kb(self):
        return proc_rss_kb(self.pid)

    def quit(self):
        try:
            self.p.stdin.write(b"q\n")
            self.p.stdin.flush()
            self.p.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def mmleak_cli(args):
    """Wall time of `mmleak.py ARGS`, its exit status and output."""
    env = dict(os.environ, **BASE_ENV)
    env["MMLEAK_LIB"] = LIB
    t0 = time.perf_counter()
    r = subprocess.run([PY, MMLEAK_PY] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env)
    return time.perf_counter() - t0, r.returncode, (r.stdout + r.stderr).decode("utf-8", "replace")


def cli_ok(args, how=None):
    """`mmleak.py ARGS`, which must succeed (RuntimeError otherwise; HOW: said in it): its
    wall time."""
    dt, rc, out = mmleak_cli(args)
    if rc != 0:
        raise RuntimeError("mmleak.py %s%s: exit %d: %s" % (args[0], " (%s)" % how if how else "",
                                                            rc, one_line(out)))
    return dt


def mmleak_module():
    """mmleaklib's attach module, for its injector binding (the call alone, without the
    start of a Python process), or None."""
    os.environ["MMLEAK_LIB"] = LIB
    sys.path.insert(0, ROOT)
    try:
        from mmleaklib import attach
        return attach
    except Exception:  # noqa: BLE001 - the part inside the process is optional
        return None
    finally:
        sys.path.pop(0)


def inject_ms(mod, pid, func, arg):
    """Wall ms of one mmleak_inject_call (what mmleak.py attach/detach does after its start):
    stop a thread, make it call FUNC(ARG) in the process, resume it.  (ms, result)."""
    lib = mod.mmleak_in(pid) or LIB
    for _ in range(20):
        t0 = time.perf_counter()
        rc, res, err = mod._inject(pid, os.path.realpath(lib), func, arg, 10000)
        dt = (time.perf_counter() - t0) * 1000
        if rc != 0:
            raise RuntimeError("%s: %s" % (func, err))
        if res != 3:            # 3: busy, as mmleak.py retries
            return dt, res
        time.sleep(0.05)
    raise RuntimeError("%s: stayed busy" % func)


def bench_attach(dirs, quick):
    res = {"loadavg_start": os.getloadavg(), "heap_mb": ATTACH_HEAP_MB if not quick else 128,
           "threads": ATTACH_THREADS, "rate": ATTACH_RATE}
    try:
        build_attach_target()
    except (OSError, subprocess.CalledProcessError) as e:
        res["error"] = "building attach_target failed: %s" % e
        return res
    heap = res["heap_mb"]
    cycles = 5 if not quick else 2
    win = 2.0 if not quick else 1.0
    res["window_s"] = win
    ddir = os.path.join(dirs["root"], "attach")
    reset_dir(ddir)
    w = {"untraced": [], "attached-same": [], "detached": [], "attached": [], "preloaded": [],
         "paused": [], "paused-bindnow": [], "resumed": []}
    times = {"attach": [], "detach": [], "attach-paused": [], "detach-paused": [], "python": []}
    inside = {"attach": [], "detach": [], "noop": []}
    res["windows"], res["cli_s"], res["inject_ms"] = w, times, inside
    res["pairs_order"] = []
    try:
        # 1. a process started without mmleak: attach/detach cycles, each between an untraced
        # window and a detached one (interleaved, so that a drift of the machine shows in both)
        log("attach: target with %d MB of heap in %d blocks, %d threads x %d pairs/s"
            % (heap, heap * 1024, ATTACH_THREADS, ATTACH_RATE))
        t = Target({}, heap)
        res["ready_s_untraced"] = t.ready_s
        res["rss_mb"] = (t.rss_kb() or 0) / 1024
        time.sleep(0.5)
        t.window(1.0)   # warm-up, not counted: the first seconds after the heap was made are slower
        for i in range(cycles):
            w["untraced"].append(t.window(win))
            times["attach"].append(cli_ok(["attach", str(t.pid), "-d", ddir]))
            time.sleep(ATTACH_SETTLE)
            w["attached-same"].append(t.window(win))
            times["detach"].append(cli_ok(["detach", str(t.pid)]))
            w["detached"].append(t.window(win))
            res["files_per_window"] = len([x for x in os.listdir(ddir) if x.endswith(".out")])
            reset_dir(ddir)
            log("  attach cycle %d/%d: attach %.3f s, detach %.3f s, attached %.1f ns/event cpu"
                % (i + 1, cycles, times["attach"][-1], times["detach"][-1],
                   w["attached-same"][-1]["ns_cpu"]))
        # the injector call alone (no Python start): attach, detach, and a call of a trivial
        # function of mmleak.so (the cost of the injection itself)
        mod = mmleak_module()
        if mod is None:
            res["inject_error"] = "mmleak.py could not be imported for its injector"
        else:
            settings = "MMLEAK_DIR=%s\nMMLEAK_ROTATE_MB=8\n" % ddir
            for i in range(cycles):
                ms, r = inject_ms(mod, t.pid, "mmleak_state", None)
                inside["noop"].append(ms)
                ms, r = inject_ms(mod, t.pid, "mmleak_attach", settings)
                if r != 0:
                    raise RuntimeError("mmleak_attach returned %d" % r)
                inside["attach"].append(ms)
                time.sleep(0.5)
                ms, r = inject_ms(mod, t.pid, "mmleak_detach", None)
                if r != 0:
                    raise RuntimeError("mmleak_detach returned %d" % r)
                inside["detach"].append(ms)
                reset_dir(ddir)
        t.quit()
        # 2. attached against preloaded, measured the same way: a new process for each
        # window, ATTACH_SETTLE seconds after its files were made (after the attach; after the
        # start under LD_PRELOAD, files rotating at 8 MB as after an attach), its files deleted
        # after it (on this VM, page cache that keeps growing past a few hundred MB costs the
        # writer much more system time: see bench/README.rst), the two kinds alternating in
        # order (AP, PA, AP...) so that a change in the machine's load falls on both
        for i in range(cycles):
            order = ("attached", "preloaded") if i % 2 == 0 else ("preloaded", "attached")
            res["pairs_order"].append(order[0][0].upper() + order[1][0].upper())
            for kind in order:
                if kind == "attached":
                    t = Target({}, heap)
                    time.sleep(0.5)
                    cli_ok(["attach", str(t.pid), "-d", ddir])
                else:
                    t = Target({"LD_PRELOAD": LIB, "MMLEAK_DIR": ddir, "MMLEAK_ROTATE_MB": "8"},
                               heap)
                    res.setdefault("ready_s_preloaded", t.ready_s)
                time.sleep(ATTACH_SETTLE)
                w[kind].append(t.window(win))
                t.quit()
                reset_dir(ddir)
            log("  pair %d/%d (%s): attached %.1f, preloaded %.1f ns/event cpu"
                % (i + 1, cycles, res["pairs_order"][-1], w["attached"][-1]["ns_cpu"],
                   w["preloaded"][-1]["ns_cpu"]))
        # 3. preloaded but paused (MMLEAK_PAUSED=1), then resumed and paused again by
        # attach / detach
        t = Target({"LD_PRELOAD": LIB, "MMLEAK_DIR": ddir, "MMLEAK_PAUSED": "1"}, heap)
        time.sleep(0.5)
        t.window(1.0)   # warm-up
        for i in range(cycles):
            w["paused"].append(t.window(win))
        for i in range(cycles):
            times["attach-paused"].append(cli_ok(["attach", str(t.pid), "-d", ddir], "paused"))
            time.sleep(ATTACH_SETTLE)
            w["resumed"].append(t.window(win))
            times["detach-paused"].append(cli_ok(["detach", str(t.pid)], "paused"))
            reset_dir(ddir)
        t.quit()
        # 4. paused again, with every symbol bound at start (LD_BIND_NOW=1): the calls a
        # lazily bound program resolves after mmleak.so pointed its GOT slots past itself
        t = Target({"LD_PRELOAD": LIB, "MMLEAK_DIR": ddir, "MMLEAK_PAUSED": "1",
                    "LD_BIND_NOW": "1"}, heap)
        time.sleep(0.5)
        t.window(1.0)   # warm-up
        for i in range(cycles):
            w["paused-bindnow"].append(t.window(win))
        t.quit()
        # the start of a Python process running mmleak.py, for scale
        for i in range(cycles):
            times["python"].append(mmleak_cli(["--version"])[0])
    except (RuntimeError, OSError) as e:
        res["error"] = str(e)
        try:
            t.p.kill()
            t.p.wait()
        except Exception:  # noqa: BLE001
            pass
    shutil.rmtree(ddir, ignore_errors=True)
    res["loadavg_end"] = os.getloadavg()
    return res


BUSY_COUNTS = (8, 64, 300)


def bench_attach_busy(dirs, quick):
    """attach and detach (the commands' wall clock) on tests/busy_threads.c: N threads and the
    main one spinning (no thread asleep but one under SCHED_IDLE), in a session of their own
    (as a daemon: the command does not share their scheduling group) and in the command's
    own session (it does: with sched_autogroup, it gets 1/(N+1) of the CPU like any of them;
    Python's start alone, timed there too, shows it)."""
    res = {"counts": list(BUSY_COUNTS if not quick else BUSY_COUNTS[:2]), "own": {}, "same": {}}
    try:
        subprocess.check_call([os.environ.get("CC", "cc"), "-O1", "-g", "-pthread", "-o",
                               BUSY_BIN, os.path.join(ROOT, "tests", "busy_threads.c")])
    except (OSError, subprocess.CalledProcessError) as e:
        res["error"] = "building busy_threads failed: %s" % e
        return res
    ddir = os.path.join(dirs["root"], "attach-busy")

    def cycle(n, own):
        p = subprocess.Popen([BUSY_BIN, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             start_new_session=own)
        out = {}
        try:
            if p.stdout.readline() != b"ready\n":
                raise RuntimeError("busy_threads %d did not start" % n)
            reset_dir(ddir)
            for cmd in ("attach", "detach"):
                dt, rc, text = mmleak_cli([cmd, str(p.pid)] + (["-d", ddir] if cmd == "attach" else []))
                out[cmd] = dt
                if rc != 0:
                    raise RuntimeError("mmleak.py %s, %d threads: exit %d: %s" % (cmd, n, rc, one_line(text)))
                if cmd == "attach":
                    p.stdin.write(b"round\n")
                    p.stdin.flush()
                    if p.stdout.readline() != b"round 1\n":
                        raise RuntimeError("busy_threads %d: no round" % n)
            if not own:
                t0 = time.perf_counter()
                subprocess.run([PY, "-c", "pass"], check=True)
                out["python"] = time.perf_counter() - t0
            p.stdin.write(b"quit\n")
            p.stdin.flush()
            if p.stdout.readline() != b"bye\n" or p.wait(timeout=120) != 0:
                raise RuntimeError("busy_threads %d did not end well" % n)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            shutil.rmtree(ddir, ignore_errors=True)
        return out

    try:
        for n in res["counts"]:
            res["own"][n] = [cycle(n, True) for _ in range(3 if not quick else 1)]
            res["same"][n] = [cycle(n, False)]
            log("  %d busy threads: attach %.2f s, detach %.2f s (own session); %.2f s, %.2f s "
                "(the command's session)" % (n, med([x["attach"] for x in res["own"][n]]),
                                             med([x["detach"] for x in res["own"][n]]),
                                             res["same"][n][0]["attach"], res["same"][n][0]["detach"]))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        res["error"] = str(e)
    return res


def print_attach_busy(b):
    print("  many busy threads (tests/busy_threads.c: N threads and the main one spinning in memset, "
          "one asleep under SCHED_IDLE), wall clock of `mmleak.py attach` / `detach`:")
    runs = max([len(v) for v in b.get("own", {}).values()] or [0])
    print("    %7s  %-28s  %s" % ("threads", "own session (median of %d)" % runs,
                                  "the command's session (1 run; python3 -c pass there)"))
    for n in b.get("counts", []):
        own, same = b["own"].get(n), b["same"].get(n)
        if not own:
            continue
        line = "    %7d  %6.2f s  %6.2f s           " % (
            n, med([x["attach"] for x in own]), med([x["detach"] for x in own]))
        if same:
            line += "  %6.2f s  %6.2f s  (%.2f s)" % (same[0]["attach"], same[0]["detach"],
                                                      same[0].get("python", float("nan")))
        print(line)
    if b.get("error"):
        print("    FAILED: " + failed(b["error"]))


def print_attach(a):
    print("attach: bench/attach_target.c, %d MB of heap (%d blocks of 1 KiB) and %d threads x %d "
          "pairs/s (%d events/s); load average %.2f at the start, %.2f at the end"
          % (a["heap_mb"], a["heap_mb"] * 1024, a["threads"], a["rate"], a["threads"] * a["rate"] * 2,
             a["loadavg_start"][0], (a.get("loadavg_end") or a["loadavg_start"])[0]))
    if a.get("error"):
        print("  FAILED: " + failed(a["error"]))
    cli = a.get("cli_s", {})
    ins = a.get("inject_ms", {})

    def ms(xs):
        return "%7.1f ms  (min %.1f, max %.1f, first %.1f)" % (
            med(xs) * 1000, min(xs) * 1000, max(xs) * 1000, xs[0] * 1000) if xs else "-"
    print("  time of the command, median of %d (wall clock of `mmleak.py ...`, Python's start included):"
          % len(cli.get("attach") or []))
    for k, label in (("attach", "attach (mmleak.so loaded at the first)"), ("detach", "detach"),
                     ("attach-paused", "attach, preloaded with MMLEAK_PAUSED=1"),
                     ("detach-paused", "detach, preloaded"),
                     ("python", "mmleak.py --version (Python's start)")):
        print("    %-40s %s" % (label, ms(cli.get(k))))
    if ins.get("attach"):
        na, nd, nn = med(ins["attach"]), med(ins["detach"]), med(ins["noop"])
        print("  the injector call alone (ctypes, as mmleak.py makes it), median of %d, library already loaded:"
              % len(ins["attach"]))
        print("    %-40s %7.1f ms" % ("call of mmleak_attach", na))
        print("    %-40s %7.1f ms" % ("call of mmleak_detach", nd))
        print("    %-40s %7.1f ms" % ("call of a trivial function (injection)", nn))
        print("    %-40s %7.1f ms attach, %.1f ms detach (difference of medians)"
              % ("inside the process, about", na - nn, nd - nn))
    elif a.get("inject_error"):
        print("  " + a["inject_error"])
    wins = a.get("windows", {})
    base = med([x["ns_cpu"] for x in wins.get("untraced", [])])
    print("  cost per event, from the target's CPU time and event count over %g s windows (median of %d):"
          % (a.get("window_s", 0), len(wins.get("untraced", []))))
    for k, label in (("untraced", "never traced"),
                     ("attached-same", "attached (one process, cycles)"),
                     ("detached", "after detach (same process)"),
                     ("attached", "attached (a new process each)"),
                     ("preloaded", "started under LD_PRELOAD (traced)"),
                     ("paused", "LD_PRELOAD, MMLEAK_PAUSED=1"),
                     ("paused-bindnow", "the same with LD_BIND_NOW=1"),
                     ("resumed", "LD_PRELOAD, paused, then attached")):
        xs = wins.get(k) or []
        if not xs:
            continue
        ns = med([x["ns_cpu"] for x in xs])
        sy = [x["ns_sys"] for x in xs if x.get("ns_sys") is not None]
        print("    %-36s %6.1f ns cpu/event  %s  %5s sys  %5.2f M events/s  %4.0f %% of a CPU" % (
            label, ns, ("(+%5.1f)" % (ns - base)) if base is not None and k != "untraced" else "        ",
            "%.0f" % med(sy) if sy else "-",
            med([x["ev_per_s"] for x in xs]) / 1e6, med([x["cpu_per_s"] for x in xs]) * 100))
    att, pre = wins.get("attached") or [], wins.get("preloaded") or []
    if att and len(att) == len(pre):
        d = [x["ns_cpu"] - y["ns_cpu"] for x, y in zip(att, pre)]
        print("  attached - preloaded, pair by pair (%s): median %+.1f ns/event (%s)"
              % (" ".join(a.get("pairs_order") or []), med(d), ", ".join("%+.1f" % x for x in d)))
    if a.get("ready_s_untraced"):
        print("  start of the target (1 GB heap made): %.2f s untraced, %.2f s under LD_PRELOAD; RSS %.0f MB"
              % (a["ready_s_untraced"], a.get("ready_s_preloaded") or float("nan"), a.get("rss_mb") or 0))
    if a.get("busy"):
        print_attach_busy(a["busy"])


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
    with them, tracer/unwind.c with the library's flags.  libunwind is linked in statically
    (its libunwind.a is not PIC: a non-PIE binary) when libunwind-dev is installed; glibc's
    backtrace() is then still taken from libc itself (libunwind defines one too).
    Returns (built, with_libunwind, error)."""
    cc = os.environ.get("CC", "cc")
    odir = os.path.join(OUT, "unwind-obj")
    os.makedirs(odir, exist_ok=True)
    lib_flags = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden",
                 "-fexceptions", "-fno-omit-frame-pointer", "-O2", "-g"]
    parts = [("unwind.o", os.path.join(ROOT, "tracer", "unwind.c"), lib_flags),
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


def busy_jiffies():
    """CPU time the whole machine spent busy so far (all cores, every process and kernel
    thread), in clock ticks (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6]      # user nice system irq softirq


def bench_append(runs, dirs, quick):
    """(f) what a flush costs the kernel: bench/append_bench.c appends in the dump directory's
    file system, in pwrite()s of 64/256/512 KiB, plainly or after fallocate(KEEP_SIZE) of each
    range (tracer/threadfile.c's prealloc on ext4).  Per cell: the writer's own CPU time, and
    the whole machine's busy time until the data is on disk (sync included: the writeback the
    kernel does later in its own threads)."""
    res = {"loadavg_start": os.getloadavg(), "rows": [], "dir": dirs["scratch"]}
    cc = os.environ.get("CC", "cc")
    try:
        subprocess.check_call([cc, "-O2", "-o", APPEND_BIN, os.path.join(HERE, "append_bench.c")])
    except (OSError, subprocess.CalledProcessError) as e:
        res["error"] = "building append_bench failed: %s" % e
        return res
    total = 64 if quick else 256
    cells = [(c, m) for c in (64, 256, 512) for m in ("plain", "reserve")]
    got = {cell: {"cpu": [], "busy": []} for cell in cells}
    tick = os.sysconf("SC_CLK_TCK")
    for _ in range(max(runs, 3)):
        for chunk, mode in cells:
            os.sync()
            b0 = busy_jiffies()
            r = subprocess.run([APPEND_BIN, dirs["scratch"], str(chunk), str(total), mode],
                               capture_output=True, text=True)
            os.sync()
            b1 = busy_jiffies()
            if r.returncode != 0:
                res["error"] = "append_bench %d %s: %s" % (chunk, mode, one_line(r.stderr))
                return res
            m = re.search(r"cpu_s=([\d.]+)", r.stdout)
            if "fallocate_failed" in r.stdout:
                res["note"] = "fallocate failed here: " + r.stdout.split("fallocate_failed=")[1].strip()
            got[(chunk, mode)]["cpu"].append(float(m.group(1)))
            got[(chunk, mode)]["busy"].append((b1 - b0) / tick)
    for (chunk, mode), v in got.items():
        res["rows"].append(dict(chunk_kb=chunk, mode=mode, total_mb=total,
                                cpu_s=med(v["cpu"]), busy_s=med(v["busy"]),
                                ns_per_33B=med(v["cpu"]) * 1e9 / (total << 20) * 33,
                                busy_ns_per_33B=med(v["busy"]) * 1e9 / (total << 20) * 33,
                                spread_pct=spread(v["cpu"])))
    res["loadavg_end"] = os.getloadavg()
    return res


def print_append(a, fs):
    print("append: appending to a file on %s (%s) in pwrite()s, plainly or after "
          "fallocate(KEEP_SIZE) of each range; medians; load average %.2f at the start"
          % (fs, a["dir"], a["loadavg_start"][0]))
    if a.get("error"):
        print("  " + a["error"])
        return
    print("  %-9s %-8s %10s %12s %14s %16s %6s" % ("chunk", "mode", "cpu_s", "ns/33B cpu",
                                                 "machine busy_s", "ns/33B machine", "+-%"))
    for r in a["rows"]:
        print("  %-9s %-8s %10.3f %12.2f %14.2f %16.2f %6s" % (
            "%d KiB" % r["chunk_kb"], r["mode"], r["cpu_s"], r["ns_per_33B"], r["busy_s"],
            r["busy_ns_per_33B"], f(r["spread_pct"], "%.0f")))
    if a.get("note"):
        print("  " + a["note"])
    print("  cpu: the writer's user+system time (%d MB per run); machine: every core's busy time"
          % a["rows"][0]["total_mb"])
    print("  from before the run to the end of a sync after it (10 ms ticks), writeback included;")
    print("  33 B: an average event at MMLEAK_DEPTH=1.  mmleak.so reserves only on ext4, for flushes")
    print("  of 256 KiB or more (a busy thread's half is 512 KiB).")


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
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "mmleak.c", "tracer",
                                "tools", "mmleak.py"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode().split()
        dirty = [x for x in dirty if x.startswith(("mmleak", "tracer/", "tools/"))]
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


def table_rows(hdr, rows):
    """Print the header HDR and its rule, then give ROWS back, a blank line printed between
    two workloads."""
    print(hdr)
    print("-" * len(hdr))
    last = None
    for r in rows:
        if last is not None and r["workload"] != last:
            print()
        last = r["workload"]
        yield r


def print_table(rows):
    hdr = "%-10s %-13s %-14s %7s %4s %8s %8s %8s %7s %8s %6s %9s  %s" % (
        "workload", "tracer", "size", "wall_s", "+-%", "ratio", "ns/event", "ns/ev-net", "cpu_s",
        "ns/ev-cpu", "B/event", "events", "note")
    for r in table_rows(hdr, rows):
        if r.get("error"):
            print("%-10s %-13s %-14s FAILED: %s" % (r["workload"], r["tracer"], r["size_arg"],
                                                     failed(r["error"])))
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
    global LIB, LONG_LEAK
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 runs, small sizes")
    ap.add_argument("--runs", type=int, default=None, help="runs per measurement (default 5, --quick 2)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only this group: a workload name (startup, alloc -t1, alloc -t2, python, "
                         "sqlite3, perl; 'alloc' matches both), 'depth', 'shrink', 'unwind', "
                         "'stacks', 'longrun' or 'attach'; repeatable")
    ap.add_argument("--long", nargs="?", type=int, const=600, default=None, metavar="SECONDS",
                    help="also run the longrun load with compaction for SECONDS (default 600) and "
                         "show that nothing accumulates; alone, unless --only names more")
    ap.add_argument("--leak-every", type=int, default=LONG_LEAK, metavar="PAIRS",
                    help="longrun: leak a block every PAIRS pairs per thread (default %d: 500 "
                         "leaks/s)" % LONG_LEAK)
    ap.add_argument("--dir", default="/var/tmp/mmleak-bench",
                    help="scratch directory on the real disk for dumps and inputs "
                         "(default /var/tmp/mmleak-bench; removed at the end)")
    ap.add_argument("--lib", default=LIB,
                    help="the mmleak.so to measure (default: the one `make` built at the top)")
    ap.add_argument("--json", default=os.path.join(OUT, "results.json"), help="JSON output")
    args = ap.parse_args()
    LIB = os.path.abspath(args.lib)
    runs = args.runs or (2 if args.quick else 5)

    names = [w.name for w in workloads(args.quick)] + ["alloc", "depth", "shrink", "unwind",
                                                        "append", "stacks", "longrun", "attach"]
    for o in args.only:
        if o not in names:
            sys.exit("bench: --only %r: not one of %s" % (o, ", ".join(names)))

    if args.long is not None and args.long < 1:
        sys.exit("bench: --long %d: not a number of seconds" % args.long)
    if args.leak_every < 1:
        sys.exit("bench: --leak-every %d: must be at least 1" % args.leak_every)
    LONG_LEAK = args.leak_every
    if not os.path.isfile(LIB):
        sys.exit("bench: %s not found: run make first" % LIB)
    # The tracer's settings come from each measurement, never from the caller's environment.
    for k in [k for k in os.environ if k.startswith("MMLEAK_")]:
        log("bench: ignoring %s=%s from the environment" % (k, os.environ[k]))
        del os.environ[k]
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
            return args.long is None
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
    stacks = longrun = attach = long_run = append = None
    try:
        for w in workloads(args.quick):
            if not wanted(w.name):
                continue
            if w.needs and not which(w.needs):
                rows.append(dict(workload=w.name, tracer="-", size_arg="", error="%s not installed" % w.needs))
                continue
            extra = [Mmleak(None, NOSCAN, scan=False)] if (
                w.name in NOSCAN_WORKLOADS and any(t.name == "mmleak" for t in tracers)) else []
            rows += bench_workload(w, tracers + extra, runs, dirs)
            for name in missing:
                rows.append(dict(workload=w.name, tracer=name, size_arg="", not_installed=True))
        if wanted("depth"):
            drows, depth_summary = bench_depth(runs, dirs, args.quick)
            rows += drows
        if wanted("shrink"):
            shrink = bench_shrink(runs, dirs, args.quick, "heaptrack" not in missing)
        if wanted("unwind"):
            unwind = bench_unwind(runs)
        if wanted("append"):
            append = bench_append(runs, dirs, args.quick)
        if wanted("stacks"):
            stacks = bench_stacks(runs, dirs, args.quick, "heaptrack" not in missing)
        if wanted("longrun"):
            longrun = bench_longrun(dirs, args.quick)
        if wanted("attach"):
            attach = bench_attach(dirs, args.quick)
            attach["busy"] = bench_attach_busy(dirs, args.quick)
        if args.long is not None:
            long_run = bench_longrun(dirs, False, args.long, modes=("compact",))
    finally:
        for d in ("dump", "input", "scratch", "shrink", "attach", "attach-busy", "longrun-none",
                  "longrun-keep-all", "longrun-compact"):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
        if created:
            try:
                os.rmdir(root)
            except OSError:
                pass
    elapsed = time.time() - t_start
    scan_rows = exit_scan_costs(rows, "mmleak")
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
    if rows:
        print()
        print_table(rows)
        print()
        print("ns/event = (median wall traced - median wall untraced at the same size) / events;")
        print("events = event lines in mmleak's dump of that workload and size (used for every tracer);")
        print("ns/ev-net = the same without the tracer's fixed cost per process (its startup row minus none's);")
        print("cpu_s = median user+system time (process and the children it waited for); ns/ev-cpu is")
        print("  ns/event from cpu_s: less disturbed by other load on the machine than wall time;")
        print("B/event = size of the mmleak.*.out files / events; +-% = (max-min)/median of the wall times.")
        print("mmleak = its defaults, the reachability scan at exit included; %s = MMLEAK_SCAN=0." % NOSCAN)
    if scan_rows:
        print()
        print_exit_scan(scan_rows, "mmleak")
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
        print("MMLEAK_DEPTH (alloc_bench -t 1 -r 12): depth 1 -> 2 adds %s ns/event wall, %s cpu (the one-frame"
              % (f(depth_summary.get("step_1_to_2_ns"), "%.0f"),
                 f(depth_summary.get("step_1_to_2_ns_cpu"), "%.0f")))
        print("  writer gives way to the slow path: stack, memo, id); each extra frame beyond 2 adds %s ns/event wall, %s cpu"
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
    if append is not None:
        print()
        print_append(append, mach["dump_fs"])
    if stacks is not None:
        print()
        print_stacks(stacks)
    if longrun is not None:
        print()
        print_longrun(longrun)
    if attach is not None:
        print()
        print_attach(attach)
    if long_run is not None:
        print()
        print_longrun(long_run, "longrun --long")
    print()
    print("(%.0f s in all)" % elapsed)
    with open(args.json, "w") as fj:
        json.dump(dict(machine=mach, runs=runs, quick=args.quick, rows=rows, depth=depth_summary,
                       unwind=unwind, append=append, stacks=stacks, longrun=longrun, attach=attach,
                       long=long_run,
                       shrink=shrink, elapsed_s=elapsed, generated=time.strftime("%Y-%m-%dT%H:%M:%S%z")),
                  fj, indent=1, default=str)
    log("results written to %s" % os.path.relpath(args.json))
    if FAILURES:
        log("bench: %d measurement(s) FAILED (above); exit status 1" % len(FAILURES))
        sys.exit(1)


if __name__ == "__main__":
    main()
