"""Compaction (issue #10): folding complete dump files into mmleak.ID.compact while the
process runs, next to another compactor and to reports, across crashes of the compactor,
fork, SIGKILL and rotation, gives exactly the result of the whole trace."""
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import LIB, ROOT, TESTS, mmleak, site_line

MMLEAK = [sys.executable, os.path.join(ROOT, "mmleak.py")]


@pytest.fixture(autouse=True)
def series_every_pass(monkeypatch):
    """The tests compact a few times a second: a point of the series at every pass."""
    monkeypatch.setattr(mmleak.series, "SERIES_INTERVAL", 0.0)
LEAK_LINE = None


@pytest.fixture(scope="module")
def load(tmp_path_factory, lib):
    d = tmp_path_factory.mktemp("load")
    exe = str(d / "daemon_load")
    subprocess.run(["cc", "-O1", "-g", "-pthread", "-o", exe,
                    os.path.join(TESTS, "daemon_load.c")], check=True)
    return exe


def traced_env(dump, **kw):
    e = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump))
    e.update({k: str(v) for k, v in kw.items()})
    return e


def survivors(dump, tid):
    """{(ptr, seq): (size, callers)} of the whole trace, read from whatever DUMP holds."""
    sh = mmleak.shrink_files(mmleak.find_traces(str(dump))[tid])
    assert not sh.problems.malformed and not sh.problems.fatal
    assert not [k for k in sh.problems.counts if k[1] == "duplicate"]
    return {(a.ptr, a.seq): (a.size, a.callers) for a in sh.survivors()}, sh


def leak_count(dump, tid):
    """Blocks reported at daemon_load.c's site:load_leak."""
    rep = mmleak.build_report(str(dump), tid, progress=False)
    sym = rep["frames"]
    line = site_line("daemon_load.c", "load_leak")
    return sum(1 for a in rep["survivors"]
               if any(sym.get(c) and sym[c].line == line and
                      (sym[c].file or "").endswith("daemon_load.c") for c in a.callers[:1]))


def churn_survivors(dump, tid):
    """Blocks reported in daemon_load.c's body(), whose blocks are all freed by the time
    the process prints "leaked N" (a free that compaction lost would leave one)."""
    rep = mmleak.build_report(str(dump), tid, progress=False)
    sym = rep["frames"]
    return sum(1 for a in rep["survivors"] if sym.get(a.callers[0]) and
               sym[a.callers[0]].function == "body" and
               (sym[a.callers[0]].file or "").endswith("daemon_load.c"))


def reference_events(load, args, where):
    """The events of each process of `daemon_load ARGS` (which are the same from run to run:
    every thread makes the same calls), traced without compaction into WHERE: [parent's,
    child's]."""
    where.mkdir()
    p = subprocess.Popen([load] + args, env=traced_env(where, MMLEAK_ROTATE_MB=1),
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    p.communicate(b"\n")
    t = mmleak.find_traces(str(where))
    order = [str(p.pid)] + sorted(k for k in t if k != str(p.pid))
    return [mmleak.shrink_files(t[k]).events for k in order]


def load_and_compactors(load, args, dump, interval, linger):
    """`daemon_load ARGS` traced into DUMP (made here; files rotating at 1 MB), and two
    compactors following it (--interval, --linger; a point of the series at every pass)."""
    dump.mkdir()
    p = subprocess.Popen([load] + args, env=traced_env(dump, MMLEAK_ROTATE_MB=1),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    comps = [subprocess.Popen(MMLEAK + ["compact", "--follow", "--interval", interval,
                                        "--linger", linger, "--series-interval", "0", str(dump)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(2)]
    return p, comps


def only_trace(dump):
    t = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    assert len(t) == 1, t
    return t[0]


def test_compaction_of_a_finished_trace_equals_the_whole(load, tmp_path):
    """A trace kept whole, and a copy of it compacted: the same survivors, stacks and
    foreign frees; only the compacted result, the maps and the series are left."""
    full = tmp_path / "full"
    full.mkdir()
    r = subprocess.run([load, "-t", "3", "-n", "200000", "-l", "1000"],
                       env=traced_env(full, MMLEAK_ROTATE_MB=1), capture_output=True, check=True)
    assert r.stdout == b"leaked 600\n"
    tid = only_trace(full)
    assert len(mmleak.find_traces(str(full))[tid]) > 10
    truth, sh_full = survivors(full, tid)
    comp = tmp_path / "comp"
    shutil.copytree(full, comp)
    subprocess.run(MMLEAK + ["compact", str(comp)], check=True, capture_output=True)
    names = sorted(os.listdir(comp))
    assert names == ["mmleak.%s.%s" % (tid, x) for x in
                     ("compact", "lock", "maps", "scan.1", "series")]   # scan.1: at exit
    got, sh = survivors(comp, tid)
    assert got == truth
    assert sorted(sh.foreign_frees()) == sorted(sh_full.foreign_frees())
    assert leak_count(comp, tid) == 600
    # the report tells how much was folded
    rep = subprocess.run(MMLEAK + ["report", str(comp), "--no-html"], capture_output=True,
                         text=True, check=True)
    assert "events (%d of them folded by compaction" % sh_full.events in rep.stdout


def test_compacting_while_it_runs_with_two_compactors_and_reports(load, tmp_path):
    """The process runs (3 threads, files rotating at 1 MB, a fork half-way); two
    compactors run at once and reports read meanwhile: no report fails or goes backwards
    (a pass deletes files under a reader's feet only after the reader is done), and the end
    result is exact: the leaks, no block of the churn left (a lost free could leave one),
    and as many events as the same run traced without compaction."""
    args = ["-t", "3", "-n", "400000", "-l", "1000", "-f", "-w"]
    ref = reference_events(load, args, tmp_path / "reference")
    dump = tmp_path / "dump"
    p, comps = load_and_compactors(load, args, dump, "0.2", "2")
    seen = []
    out = b""
    while not out.endswith(b"ready\n"):
        if len(seen) < 6 and os.path.exists(dump / ("mmleak.%d.maps" % p.pid)):
            seen.append(leak_count(dump, str(p.pid)))     # while it runs and is compacted
        chunk = p.stdout.readline() if len(seen) >= 6 else b""
        if len(seen) >= 6:
            assert chunk, out
            out += chunk
    assert seen == sorted(seen) and seen[-1] <= 1200, seen
    p.stdin.write(b"\n")
    p.stdin.close()
    p.wait()
    for c in comps:
        _, err = c.communicate(timeout=120)
        assert c.returncode == 0, err
    assert b"child leaked 1200\n" in out and out.endswith(b"leaked 1200\nready\n")
    t = mmleak.find_traces(str(dump))
    parent = str(p.pid)
    child = [k for k in t if k != parent][0]
    assert churn_survivors(dump, parent) == 0
    assert [events_counted(dump, parent), events_counted(dump, child)] == ref
    for tid, n in ((parent, 1200), (child, 1200)):
        assert [os.path.basename(f) for f in t[tid]] == ["mmleak.%s.compact" % tid]
        assert leak_count(dump, tid) == n
        truth, sh = survivors(dump, tid)
        assert sh.gap_text() is None
        # the two compactors' points: each follows from the one before, the last is the end
        points, _ = mmleak.read_series(mmleak.TraceFiles(str(dump), tid).series)
        assert points[-1].live == (sum(v[0] for v in truth.values()), len(truth))
        check_series(points)


def test_a_compactor_killed_at_any_moment_loses_and_doubles_nothing(load, tmp_path):
    """A compactor SIGKILLed at random moments of its passes, thirty times, then one clean
    pass: the result is the whole trace's, and no event is read twice."""
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run([load, "-t", "2", "-n", "300000", "-l", "700"],
                   env=traced_env(full, MMLEAK_ROTATE_MB=1), capture_output=True, check=True)
    tid = only_trace(full)
    truth, sh_full = survivors(full, tid)
    rnd = random.Random(4)
    comp = tmp_path / "comp"
    shutil.copytree(full, comp)
    for _ in range(30):
        c = subprocess.Popen(MMLEAK + ["compact", "--series-interval", "0", str(comp)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rnd.uniform(0.0, 0.4))
        c.send_signal(signal.SIGKILL)
        c.wait()
    r = subprocess.run(MMLEAK + ["compact", str(comp)], capture_output=True)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    got, sh = survivors(comp, tid)
    assert got == truth
    assert events_counted(comp, tid) == sh_full.events      # no file folded twice
    assert not [n for n in os.listdir(comp) if n.endswith((".out", ".tail", ".tmp"))]
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(comp), tid).series)
    assert points[-1].live == (sum(v[0] for v in truth.values()), len(truth))
    check_series(points)


# the system calls that change a dump directory's files (a compactor killed as it enters each)
CHANGES = "rename,renameat,renameat2,unlink,unlinkat,fsync,fdatasync,ftruncate"


def strace_usable():
    try:
        return subprocess.run(["strace", "-qq", "-o", os.devnull, "true"],
                              capture_output=True).returncode == 0
    except OSError:
        return False


def compact_under_strace(d, log, inject=None):
    """`mmleak.py compact --series-interval 0 D` under strace: (the system calls of CHANGES
    it made, in order, its exit status: strace's, -9 when the compactor was killed).  INJECT (NAME, N): SIGKILLed as it enters its Nth
    NAME (the call is not made)."""
    cmd = ["strace", "-qq", "-o", str(log), "-e", "trace=" + CHANGES]
    if inject:
        cmd += ["-e", "inject=%s:signal=KILL:when=%d" % inject]
    r = subprocess.run(cmd + MMLEAK + ["compact", "--series-interval", "0", str(d)],
                       capture_output=True, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    with open(str(log)) as f:
        names = [m.group(1) for m in (re.match(r"(\w+)\(", line) for line in f) if m]
    return names, r.returncode


def distinct_points(d, tid):
    """The series' points, but a point that repeats the one before it (a pass stopped after
    its point, and the next pass's: nothing new, nothing freed)."""
    out = []
    for pt in mmleak.read_series(mmleak.TraceFiles(str(d), tid).series)[0]:
        if out and pt.live == out[-1][0] and pt.new == (0, 0) and pt.freed == (0, 0):
            continue
        out.append((pt.live, pt.new, pt.freed, pt.sites))
    return out


@pytest.mark.skipif(not strace_usable(), reason="needs strace (ptrace)")
def test_a_compactor_killed_at_each_change_of_a_merge_into_the_result(tmp_path, lib):
    """A pass that merges its runs into the result of a running trace, with a point of the
    series (the previous point's keys partial, of that result): SIGKILLed as it enters
    each system call that changes a file (rename, unlink, fsync...), then a pass run to the
    end: the same trace as the pass not stopped gives, block for block, and the same series,
    point for point, live, new and freed per site (a kill between the result's rename and
    the .live's lost the .live: every block counted new, the previous point's freed)."""
    from test_series_levels import Running
    tid = str(os.getpid())              # (alive, started before the trace: running)
    rnd = random.Random(11)
    d = tmp_path / "state"
    d.mkdir()
    h = Running(d, rnd, tid=tid, start=int(time.time()))
    t = mmleak.TraceFiles(str(d), tid)
    h.batch(3000)
    mmleak.compact_dir(str(d), tid)
    series = mmleak.series
    for _ in range(60):                 # until the next pass merges into the result
        h.batch(rnd.choice([100, 300, 1000]))
        probe = tmp_path / "probe"
        shutil.rmtree(str(probe), ignore_errors=True)
        shutil.copytree(str(d), str(probe))
        pt = mmleak.TraceFiles(str(probe), tid)
        was = series._identity(pt.compact)
        lv = series._load_live(pt.live)[0]
        mmleak.compact_dir(str(probe), tid)
        if lv and lv[3] and series._same_result(lv[2], was) and \
                not series._same_result(series._identity(pt.compact), was):
            break
        mmleak.compact_dir(str(d), tid)
    else:
        pytest.fail("no merge into the result")
    ref = tmp_path / "ref"
    shutil.copytree(str(d), str(ref))
    calls, rc = compact_under_strace(ref, tmp_path / "log")
    assert rc == 0 and calls.count("fsync") >= 2 and len(calls) >= 10, calls
    r = subprocess.run(MMLEAK + ["compact", "--series-interval", "0", str(ref)])
    assert r.returncode == 0
    want, points = survivors(ref, tid)[0], distinct_points(ref, tid)
    assert len(points) >= 3
    wrong = []
    for i, name in enumerate(calls):
        k = tmp_path / ("k%d" % i)
        shutil.copytree(str(d), str(k))
        got, rc = compact_under_strace(k, tmp_path / "log", (name, calls[:i + 1].count(name)))
        assert rc == -signal.SIGKILL and got == calls[:i + 1], (i, got)
        r = subprocess.run(MMLEAK + ["compact", "--series-interval", "0", str(k)],
                           capture_output=True, text=True)
        assert (r.returncode, r.stderr) == (0, ""), (i, r.stderr)
        assert survivors(k, tid)[0] == want, i
        if distinct_points(k, tid) != points:
            wrong.append((i, name))
        assert not [n for n in os.listdir(str(k)) if n.endswith(".tmp")], i
        shutil.rmtree(str(k))
    assert wrong == []


def finished_trace(load, tmp_path, *args, rotate=1):
    """A finished trace of daemon_load ARGS, kept whole in tmp_path/full: (dir, trace id,
    survivors, shrinker)."""
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run([load] + list(args), env=traced_env(full, MMLEAK_ROTATE_MB=rotate),
                   capture_output=True, check=True)
    tid = only_trace(full)
    truth, sh = survivors(full, tid)
    return full, tid, truth, sh


def events_counted(dump, tid):
    """The events of a trace as its report counts them (folded ones included)."""
    sh = mmleak.shrink_files(mmleak.find_traces(str(dump))[tid])
    c = sh.compacted
    return c["events"] + sh.events - c["entries"] if c["files"] else sh.events


def exact_readers(dump, tid, truth, events):
    """`report` and `snapshot` on DUMP: exit 0, no warning, every block and event of the
    whole trace, none twice."""
    r = subprocess.run(MMLEAK + ["report", str(dump), "--pid", tid, "--no-html"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert re.search(r"^  %d events .* in %d blocks not freed" % (events, len(truth)),
                     r.stdout, re.M), r.stdout
    snap = str(dump) + ".snap"
    r = subprocess.run(MMLEAK + ["snapshot", str(dump), "--pid", tid, "-o", snap],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "twice" not in r.stderr, r.stderr
    assert {k: (a.size, a.callers) for k, a in mmleak.baseline_blocks(snap).items()} == truth


def test_a_pass_stopped_between_writing_and_deleting(load, tmp_path, monkeypatch):
    """The worst moment: the new result is in place, the inputs are not deleted yet.  Readers
    then leave out the inputs the result names (no event twice, no warning), and the next
    pass deletes them instead of folding them again."""
    full, tid, truth, sh_full = finished_trace(load, tmp_path, "-t", "2", "-n", "100000",
                                               "-l", "500")

    class Stop(Exception):
        pass

    def crash(p):
        raise Stop()
    with monkeypatch.context() as m:
        m.setattr(mmleak.compact, "_remove_dump", crash)
        with pytest.raises(Stop):
            mmleak.compact_trace(str(full), tid)
    outs = [n for n in os.listdir(full) if n.endswith(".out")]
    assert len(outs) > 2                                       # the inputs are still there
    assert [os.path.basename(f) for f in mmleak.find_traces(str(full))[tid]] == \
        ["mmleak.%s.compact" % tid]                            # but readers leave them out
    exact_readers(full, tid, truth, sh_full.events)
    for x in ("compact", "series", "series.live"):        # what a killed pass may leave too
        (full / ("mmleak.%s.%s.tmp" % (tid, x))).write_bytes(b"1 2 3\n")
    res = mmleak.compact_trace(str(full), tid)
    assert res["folded"] == 0                                 # deleted, not folded again
    assert not [n for n in os.listdir(full) if n.endswith((".out", ".tail", ".tmp"))]
    got, _ = survivors(full, tid)
    assert got == truth
    assert events_counted(full, tid) == sh_full.events


def waiting_load(load, tmp_path):
    """daemon_load (2 threads, 1000 blocks leaked) traced into TMP_PATH/dump, its work done,
    waiting before its exit (-w): (dump directory, process); killed if it does not get there."""
    dump = tmp_path / "dump"
    dump.mkdir()
    p = subprocess.Popen([load, "-t", "2", "-n", "50000", "-l", "100", "-w"],
                         env=traced_env(dump), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"leaked 1000\n"
        assert p.stdout.readline() == b"ready\n"
    except BaseException:
        p.kill()
        p.wait()
        raise
    return dump, p


def test_a_pass_stopped_between_a_dump_file_and_its_staging_file(load, tmp_path, monkeypatch):
    """A SIGKILLed process leaves staging files; a pass that deleted a folded .out and was
    stopped before its .tail: the next pass deletes the .tail (no orphan stays forever)."""
    dump, p = waiting_load(load, tmp_path)
    p.send_signal(signal.SIGKILL)
    p.wait()
    tid = str(p.pid)
    truth, sh_full = survivors(dump, tid)
    assert [n for n in os.listdir(dump) if n.endswith(".tail")]

    class Stop(Exception):
        pass

    def half(path):
        os.unlink(path)
        raise Stop()
    with monkeypatch.context() as m:
        m.setattr(mmleak.compact, "_remove_dump", half)
        with pytest.raises(Stop):
            mmleak.compact_trace(str(dump), tid)
    assert [n for n in os.listdir(dump) if n.endswith(".tail")]
    exact_readers(dump, tid, truth, sh_full.events)
    mmleak.compact_trace(str(dump), tid)
    assert not [n for n in os.listdir(dump) if n.endswith((".out", ".tail", ".tmp"))], \
        os.listdir(dump)
    assert survivors(dump, tid)[0] == truth
    assert events_counted(dump, tid) == sh_full.events


def test_a_reader_that_starts_before_the_first_pass(load, tmp_path, monkeypatch, capfd):
    """A reader that starts before any compactor made the trace's lock file (readers make
    none), and a first pass that starts while it reads and deletes its files: the reader
    reads again, under the lock that pass made, without a word about the files that went;
    snapshot and report are exact."""
    full, tid, truth, sh_full = finished_trace(load, tmp_path, "-t", "2", "-n", "100000",
                                               "-l", "500")
    lock = full / ("mmleak.%s.lock" % tid)
    real = mmleak.with_unflushed_tails
    passes, inside = [], []

    def compactor_starts(paths):
        if not inside:                  # a reader's read (not the compactor's own)
            inside.append(1)
            passes.append(mmleak.compact_trace(str(full), tid))  # in the middle of it
            inside.pop()
        return real(paths)
    snap = tmp_path / "snap"
    # (mmleak.so made none: its directory, tmp_path's, is its own; elsewhere one it could
    # not make, or an older mmleak.so)
    assert not lock.exists()
    with monkeypatch.context() as m:
        m.setattr(mmleak.files, "with_unflushed_tails", compactor_starts)
        assert not lock.exists()
        assert mmleak.main(["snapshot", str(full), "--pid", tid, "-o", str(snap)]) == 0
        # the pass folded and deleted what the snapshot was reading; the snapshot read
        # again, holding the lock: the next pass had to skip the trace
        assert passes[0] and passes[0]["folded"] > 2 and passes[1:] == [None], passes
        assert {k: (a.size, a.callers) for k, a in
                mmleak.baseline_blocks(str(snap)).items()} == truth
        rep = mmleak.build_report(str(full), tid, progress=False)
        assert passes[2:] == [None] and not rep["incomplete"]
        assert {(a.ptr, a.seq): (a.size, a.callers) for a in rep["survivors"]} == truth
    err = capfd.readouterr().err
    assert "cannot read" not in err and "twice" not in err, err
    exact_readers(full, tid, truth, sh_full.events)


def test_readers_leave_no_file_behind(load, tmp_path):
    """snapshot and report --no-html on a directory no compactor touched write nothing
    there (no lock file either)."""
    full, tid, truth, sh_full = finished_trace(load, tmp_path, "-t", "1", "-n", "20000",
                                               "-l", "500")
    before = sorted(os.listdir(full))
    exact_readers(full, tid, truth, sh_full.events)
    assert sorted(os.listdir(full)) == before


def test_a_snapshot_that_cannot_read_a_file_says_so(load, tmp_path, monkeypatch):
    """A file that vanished under a snapshot is an error, not a smaller live set."""
    full, tid, truth, _ = finished_trace(load, tmp_path, "-t", "1", "-n", "20000", "-l", "500")
    real = mmleak.find_traces
    monkeypatch.setattr(mmleak.files, "find_traces", lambda d, **kw: {
        k: v + [str(full / ("mmleak.%s.999.out" % k))] for k, v in real(d, **kw).items()})
    assert mmleak.main(["snapshot", str(full), "--pid", tid, "-o", str(tmp_path / "s")]) == 2


def test_killed_process_is_folded_with_its_staging_files(load, tmp_path):
    dump, p = waiting_load(load, tmp_path)
    tid = str(p.pid)
    before, _ = survivors(dump, tid)
    # alive: nothing complete yet (the files have no #end), nothing folded
    r = mmleak.compact_trace(str(dump), tid)
    assert r["folded"] == 0 and not r["over"]
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert [n for n in os.listdir(dump) if n.endswith(".tail")]
    # the whole trace (the process may have allocated stdin's buffer after "ready")
    truth, sh_full = survivors(dump, tid)
    assert set(before) <= set(truth) and len(truth) - len(before) <= 1
    r = mmleak.compact_trace(str(dump), tid)
    assert r["over"] and r["folded"] >= 1
    assert not [n for n in os.listdir(dump) if n.endswith((".tail", ".out"))]
    after, _ = survivors(dump, tid)
    assert after == truth
    assert events_counted(dump, tid) == sh_full.events
    assert leak_count(dump, tid) == 1000


def test_a_damaged_series_live_is_said_and_taken_as_lost(load, tmp_path, capfd):
    """A .series.live that is not one (it is only ever written whole, by a rename): one line
    naming it and the line, status 2, and the point goes on as with none (every block alive
    counted as new: its live bytes still exact).  Then bounded fuzzing of its reader (fixed
    seeds: cuts, changed bytes, garbage): a usable file or one line, never an exception."""
    dump, p = waiting_load(load, tmp_path)
    try:
        tid = str(p.pid)
        mmleak.compact_trace(str(dump), tid)
        t = mmleak.files.TraceFiles(str(dump), tid)
        with open(t.live, "rb") as f:
            good = f.read()
        assert mmleak.series._load_live(t.live)[0] is not None
        with open(t.live, "wb") as f:
            f.write(b"hello\n")
        capfd.readouterr()
        r = subprocess.run(MMLEAK + ["compact", str(dump), "--series-interval", "0"],
                           capture_output=True, text=True)
        assert (r.returncode, r.stderr) == (
            2, "mmleak.py: %s:1: not a usable .series.live (a line not in its format): taken "
               "as lost (the point counts every block alive as new)\n" % t.live)
        truth, _ = survivors(dump, tid)
        points, _ = mmleak.series.read_series(t.series)
        assert len(points) == 2
        live = (sum(size for size, _ in truth.values()), len(truth))
        assert (points[-1].live, points[-1].new) == (live, live)
        for seed in range(60):
            rnd = random.Random(seed)
            d = bytearray(good)
            if seed % 3 == 0:
                d = d[:rnd.randrange(len(d))]
            elif seed % 3 == 1:
                for _ in range(rnd.randint(1, 8)):
                    d[rnd.randrange(len(d))] = rnd.randrange(256)
            else:
                d = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 400)))
            with open(t.live, "wb") as f:
                f.write(d)
            mmleak.errors.REFUSALS.clear()
            got = mmleak.series._load_live(t.live)
            err = capfd.readouterr().err
            if got == (None, None):
                assert re.fullmatch(r"mmleak\.py: %s(:[0-9]+)?: not a usable \.series\.live "
                                    r"\([^\n]*\): taken as lost \(the point counts every "
                                    r"block alive as new\)\n" % re.escape(t.live), err), \
                    (seed, err)
            else:
                assert err == "", (seed, err)
    finally:
        p.kill()
        p.wait()
        mmleak.errors.REFUSALS.clear()


def test_series_follows_the_live_set_exactly(load, tmp_path):
    """Three phases leaking 200, 200 and 200 blocks, a compaction pass after each: the
    series shows the leak site growing by exactly that, with BYTES = previous + NEW - FREED."""
    dump = tmp_path / "dump"
    dump.mkdir()
    p = subprocess.Popen([load, "-t", "2", "-n", "20000", "-l", "200", "-p", "3"],
                         env=traced_env(dump, MMLEAK_ROTATE_MB=1), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    tid = str(p.pid)
    for ph in range(1, 4):
        assert p.stdout.readline() == b"phase %d leaked %d\n" % (ph, 200 * ph)
        mmleak.compact_dir(str(dump), tid)
        p.stdin.write(b"\n")
        p.stdin.flush()
    assert p.stdout.readline() == b"leaked 600\n"
    p.stdin.close()
    p.wait()
    mmleak.compact_dir(str(dump), tid)
    points, stacks = mmleak.read_series(mmleak.TraceFiles(str(dump), tid).series)
    assert len(points) == 4
    sym = mmleak.Symbolizer(os.path.join(str(dump), "mmleak.%s.maps" % tid))
    line = site_line("daemon_load.c", "load_leak")
    keys = [k for k in points[-1].sites if k != "other"]
    fr = sym.lookup(sorted({k[0] for k in keys}))
    (leak_key,) = [k for k in keys if fr[k[0]].line == line]
    counts = [pt.sites.get(leak_key, (0, 0, 0, 0, 0, 0))[1] for pt in points]
    assert counts == [200, 400, 600, 600]
    check_series(points, blocks=False)


def test_run_compacts_in_the_background_and_keep_all_does_not(load, tmp_path):
    d = tmp_path / "d"
    r = subprocess.run(MMLEAK + ["run", "-d", str(d), "--", load, "-t", "2", "-n", "300000",
                                 "-l", "1000"], capture_output=True)
    assert r.returncode == 0 and r.stdout == b"leaked 600\n"
    tid = only_trace(d)
    assert [os.path.basename(f) for f in mmleak.find_traces(str(d))[tid]] == \
        ["mmleak.%s.compact" % tid]
    assert leak_count(d, tid) == 600
    assert churn_survivors(d, tid) == 0
    k = tmp_path / "k"
    r = subprocess.run(MMLEAK + ["run", "--keep-all", "-d", str(k), "--", load, "-t", "2",
                                 "-n", "300000", "-l", "1000"], capture_output=True)
    tid = only_trace(k)
    assert not os.path.exists(mmleak.TraceFiles(str(k), tid).compact)
    assert len(mmleak.find_traces(str(k))[tid]) >= 2


def test_incremental_view_between_a_snapshot_and_now(load, tmp_path):
    """MTrace's incremental view: a snapshot after phase 1, the report after phase 2 shows
    per call site what was allocated since and is still alive (+), and what of the snapshot
    was freed since (-), exactly."""
    dump = tmp_path / "dump"
    dump.mkdir()
    p = subprocess.Popen([load, "-t", "2", "-n", "20000", "-l", "200", "-p", "2", "-w"],
                         env=traced_env(dump), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    tid = str(p.pid)
    assert p.stdout.readline() == b"phase 1 leaked 200\n"
    snap = tmp_path / "snap"
    subprocess.run(MMLEAK + ["snapshot", str(dump), "--pid", tid, "-o", str(snap)], check=True,
                   capture_output=True)
    old = mmleak.baseline_blocks(str(snap))
    p.stdin.write(b"\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"phase 2 leaked 400\n"
    p.stdin.write(b"\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"leaked 400\n"
    assert p.stdout.readline() == b"ready\n"
    rep = mmleak.build_report(str(dump), tid, progress=False, baseline=str(snap))
    rows = mmleak.incremental_sites(rep)
    fr = rep["frames"]
    by_line = {(fr[c].function, fr[c].line): (pb, pn, mb, mn) for c, pb, pn, mb, mn in rows
               if fr.get(c) and (fr[c].file or "").endswith("daemon_load.c")}
    leak = ("leak_one", site_line("daemon_load.c", "load_leak"))
    assert by_line[leak] == (200 * 48, 200, 0, 0)
    # the blocks handed between threads that were alive at the snapshot: all freed since
    sym = mmleak.Symbolizer(os.path.join(str(dump), "mmleak.%s.maps" % tid))
    handed = [a for a in old.values()
              if sym.lookup([a.callers[0]])[a.callers[0]].function == "body"]
    assert handed
    body = [v for k, v in by_line.items() if k[0] == "body"]
    assert sum(v[3] for v in body) == len(handed)
    assert sum(v[2] for v in body) == sum(a.size for a in handed)
    out = subprocess.run(MMLEAK + ["report", str(dump), "--pid", tid, "--no-html",
                                   "--baseline", str(snap)], capture_output=True, text=True)
    assert "since the snapshot %s: +%s in 200 blocks" % (snap, mmleak.human_bytes(9600)) \
        in out.stdout
    p.stdin.write(b"\n")
    p.stdin.close()
    p.wait()


def test_growth_and_incremental_views_on_the_page(load, tmp_path):
    """The HTML page draws the series (a row per call site: first, last, change) and, with
    --baseline, the + and - table."""
    dump = tmp_path / "dump"
    dump.mkdir()
    p = subprocess.Popen([load, "-t", "2", "-n", "20000", "-l", "200", "-p", "3"],
                         env=traced_env(dump), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    tid = str(p.pid)
    snap = tmp_path / "snap"
    for ph in range(1, 4):
        assert p.stdout.readline() == b"phase %d leaked %d\n" % (ph, 200 * ph)
        mmleak.compact_dir(str(dump), tid)
        if ph == 1:
            subprocess.run(MMLEAK + ["snapshot", str(dump), "--pid", tid, "-o", str(snap)],
                           check=True, capture_output=True)
        p.stdin.write(b"\n")
        p.stdin.flush()
    p.stdin.close()
    p.wait()
    page = tmp_path / "r.html"
    r = subprocess.run(MMLEAK + ["report", str(dump), "--pid", tid, "-o", str(page),
                                 "--baseline", str(snap)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    line = site_line("daemon_load.c", "load_leak")
    assert 'id="growth"' in html and 'id="incremental"' in html
    row = "leak_one at %s:%d</td><td class=n>%s</td><td class=n>%s</td><td class=n>+%d</td>" % (
        os.path.join(TESTS, "daemon_load.c"), line, "{:,}".format(200 * 48),
        "{:,}".format(600 * 48), 400 * 48)
    assert row in html
    inc = "leak_one at %s:%d</td><td class=n>+%s</td><td class=n>+400</td>" % (
        os.path.join(TESTS, "daemon_load.c"), line, "{:,}".format(400 * 48))
    assert inc in html


def phases(load, dump, n, *extra, **env):
    """daemon_load in N phases of 2 x 20000 pairs leaking 200 blocks per phase: the process,
    its trace id, and a function that waits for the end of the next phase."""
    p = subprocess.Popen([load, "-t", "2", "-n", "20000", "-l", "200", "-p", str(n)] +
                         list(extra), env=traced_env(dump, MMLEAK_ROTATE_MB=1, **env),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    state = {"ph": 0}

    def next_phase():
        if state["ph"]:
            p.stdin.write(b"\n")
            p.stdin.flush()
        state["ph"] += 1
        if state["ph"] <= n:
            assert p.stdout.readline() == b"phase %d leaked %d\n" % (state["ph"],
                                                                     200 * state["ph"])
    return p, str(p.pid), next_phase


def leak_counts(dump, tid):
    """Blocks at daemon_load.c's site:load_leak in each point of the series, and the
    points."""
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(dump), tid).series)
    sym = mmleak.Symbolizer(os.path.join(str(dump), "mmleak.%s.maps" % tid))
    keys = {k for pt in points for k in pt.sites if k != "other"}
    fr = sym.lookup(sorted({k[0] for k in keys}))
    line = site_line("daemon_load.c", "load_leak")
    (leak_key,) = [k for k in keys if fr[k[0]].line == line]
    return [pt.sites.get(leak_key, (0, 0))[1] for pt in points], points


def check_series(points, blocks=True):
    """BYTES = previous BYTES + NEW - FREED, for the whole and for every site in both (and
    the same of BLOCKS per site, unless BLOCKS is false)."""
    for a, b in zip(points, points[1:]):
        assert b.live[0] == a.live[0] + b.new[0] - b.freed[0]
        assert b.live[1] == a.live[1] + b.new[1] - b.freed[1]
        for k, v in b.sites.items():
            if k != "other" and k in a.sites:
                assert v[0] == a.sites[k][0] + v[2] - v[4], k
                if blocks:
                    assert v[1] == a.sites[k][1] + v[3] - v[5], k


def zombie(p):
    """Wait until P has exited, and leave it unreaped (its pid still exists)."""
    for _ in range(500):
        with open("/proc/%d/stat" % p.pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        time.sleep(0.01)
    raise AssertionError("%d did not exit" % p.pid)


def test_the_series_ends_with_the_trace(load, tmp_path, monkeypatch):
    """--series-interval spaces the points while the process runs; the trace's end still
    gets its point, even when the pass that folded its last files came while the process
    was not yet reaped (it still existed, the files were complete, no point was due), and
    the point after it is the last: the .live file goes."""
    monkeypatch.setattr(mmleak.series, "SERIES_INTERVAL", 3600.0)
    dump = tmp_path / "dump"
    dump.mkdir()
    p, tid, next_phase = phases(load, dump, 2)
    next_phase()
    mmleak.compact_dir(str(dump), tid)              # the first point
    next_phase()
    mmleak.compact_dir(str(dump), tid)              # not due: no point
    next_phase()                                    # exits
    assert p.stdout.read() == b"leaked 400\n"
    zombie(p)
    live, res = mmleak.compact_dir(str(dump), tid)
    assert live == [tid] and not res[0]["over"]     # still there: not over
    assert [n for n in os.listdir(dump) if n.endswith(".out")] == []
    p.wait()
    live, res = mmleak.compact_dir(str(dump), tid)
    assert live == [] and res[0]["over"] and res[0]["folded"] == 0
    counts, points = leak_counts(dump, tid)
    assert counts == [200, 400]
    truth, _ = survivors(dump, tid)
    assert points[-1].live == (sum(v[0] for v in truth.values()), len(truth))
    check_series(points)
    assert not os.path.exists(mmleak.TraceFiles(str(dump), tid).series + ".live")
    mmleak.compact_dir(str(dump), tid)              # over and complete: no more points
    assert len(mmleak.read_series(mmleak.TraceFiles(str(dump), tid).series)[0]) == 2


def test_the_last_point_takes_the_last_pass_survivors(load, tmp_path, monkeypatch):
    """The pass that folds a trace's last files (the trace over: everything into
    mmleak.ID.compact) hands the survivors the compiled shrinker left from that reading to
    the trace's last point, which does not read the trace again (issue 19: run's end); the
    point is exact."""
    if mmleak.native._native_engine() is None:
        pytest.skip("no compiled shrinker")
    monkeypatch.setattr(mmleak.series, "SERIES_INTERVAL", 3600.0)
    dump = tmp_path / "dump"
    dump.mkdir()
    p, tid, next_phase = phases(load, dump, 2)
    next_phase()
    mmleak.compact_dir(str(dump), tid)              # the first point
    next_phase()
    next_phase()                                    # exits: its last files not folded yet
    assert p.stdout.read() == b"leaked 400\n"
    p.wait()

    def read_again(*a, **k):
        raise AssertionError("the last point read the trace again")
    monkeypatch.setattr(mmleak.series, "_live_now", read_again)
    live, res = mmleak.compact_dir(str(dump), tid)
    assert live == [] and res[0]["over"] and res[0]["folded"] >= 1 and res[0]["point"]
    monkeypatch.undo()
    counts, points = leak_counts(dump, tid)
    assert counts == [200, 400]
    truth, _ = survivors(dump, tid)
    assert points[-1].live == (sum(v[0] for v in truth.values()), len(truth))
    check_series(points)
    assert not os.path.exists(mmleak.TraceFiles(str(dump), tid).series + ".live")


def test_run_check_reads_the_trace_while_the_last_point_is_made(load, tmp_path, monkeypatch):
    """`run --check`'s compactor (finish(overlap=True)) returns once its last pass has
    folded the trace, while the trace's last point is still under way (the verdict reads
    the trace meanwhile, under the lock shared); join() waits for the point, which is
    exact."""
    import threading
    monkeypatch.setattr(mmleak.series, "SERIES_INTERVAL", 3600.0)
    dump = tmp_path / "dump"
    dump.mkdir()
    p, tid, next_phase = phases(load, dump, 2)
    next_phase()
    next_phase()
    next_phase()                                    # exits
    assert p.stdout.read() == b"leaked 400\n"
    p.wait()
    release, entered = threading.Event(), threading.Event()
    real = mmleak.compact.add_point

    def held_point(*a, **k):
        entered.set()
        assert release.wait(60)
        return real(*a, **k)
    monkeypatch.setattr(mmleak.compact, "add_point", held_point)
    c = mmleak.compact.BackgroundCompactor(str(dump), set(), interval=3600.0)
    c.start()
    c.finish(overlap=True)
    assert entered.wait(60)                         # the point is under way, held
    assert os.path.exists(mmleak.TraceFiles(str(dump), tid).compact)
    assert not [n for n in os.listdir(dump) if n.endswith(".out")]
    got = []                                        # a reader meanwhile, under the lock
    r = threading.Thread(target=lambda: got.append(mmleak.compact.read_trace(str(dump), tid)))
    r.start()
    r.join(60)
    assert got, "the reader waited for the point"   # shared: it does not wait
    truth = {(a.ptr, a.seq): a.size for a in got[0][0].survivors()}
    release.set()
    c.join()
    assert c.last is None
    counts, points = leak_counts(dump, tid)
    assert counts == [400]
    assert points[-1].live == (sum(truth.values()), len(truth))
    assert not os.path.exists(mmleak.TraceFiles(str(dump), tid).series + ".live")


@pytest.mark.parametrize("check", [False, True])
def test_run_check_makes_the_last_point_only(load, tmp_path, check):
    """`run`'s compactor adds a point at a pass while the program runs (the first pass: no
    series yet); `run --check`'s (views) does not: its verdict does not use the series, and
    a point reads the whole live set while the program and its scan at exit need the
    cores.  Both make the trace's last point, exact."""
    dump, p = waiting_load(load, tmp_path)
    tid = str(p.pid)
    spath = mmleak.TraceFiles(str(dump), tid).series
    c = mmleak.compact.BackgroundCompactor(str(dump), set(), interval=3600.0, views=check)
    try:
        c._pass()                                   # the program still runs
        assert os.path.exists(spath) is not check
    finally:
        p.stdin.close()
        p.wait()
    c.start()
    c.finish(overlap=check)
    c.join()
    counts, points = leak_counts(dump, tid)
    assert counts == ([1000] if check else [1000, 1000])
    truth, _ = survivors(dump, tid)
    assert points[-1].live == (sum(v[0] for v in truth.values()), len(truth))
    assert not os.path.exists(spath + ".live")


@pytest.mark.parametrize("stop_at", [".series.live", ".series"])
def test_a_compactor_killed_while_it_writes_the_series(load, tmp_path, monkeypatch, stop_at):
    """A point is two files: the blocks alive (.series.live, against which the next point
    counts NEW and FREED) and the series.  A compactor stopped between the two leaves them
    so that the next point still follows exactly from the last one in the series."""
    dump = tmp_path / "dump"
    dump.mkdir()
    p, tid, next_phase = phases(load, dump, 3)
    next_phase()
    mmleak.compact_dir(str(dump), tid)
    next_phase()

    class Stop(Exception):
        pass
    real = os.rename

    def rename(a, b):
        if str(b).endswith(stop_at):
            raise Stop()
        return real(a, b)
    with monkeypatch.context() as m:
        m.setattr(os, "rename", rename)
        with pytest.raises(Stop):
            mmleak.compact_dir(str(dump), tid)
    next_phase()
    mmleak.compact_dir(str(dump), tid)
    next_phase()
    assert p.stdout.read() == b"leaked 600\n"
    p.wait()
    mmleak.compact_dir(str(dump), tid)
    counts, points = leak_counts(dump, tid)
    check_series(points)
    # the point of the stopped pass: lost with its .live, or in the series (put there by
    # the next pass)
    assert counts == ([200, 600, 600] if stop_at == ".series.live" else [200, 400, 600, 600])


def test_a_torn_series_is_read_without_its_torn_lines(load, tmp_path):
    """A series file cut in the middle of a line (written by an older mmleak.py killed while
    it appended): the report skips the torn lines, saying so; the next point writes the
    series whole again, without them, and follows exactly from the last good one."""
    dump = tmp_path / "dump"
    dump.mkdir()
    p, tid, next_phase = phases(load, dump, 2)
    next_phase()
    mmleak.compact_dir(str(dump), tid)
    spath = mmleak.TraceFiles(str(dump), tid).series
    with open(spath, "ab") as f:
        f.write(b"p 1700000000 3 4")
    next_phase()
    next_phase()
    p.wait()
    with open(spath, "ab") as f:
        f.write(b"k 12")
    r = subprocess.run(MMLEAK + ["report", str(dump), "--pid", tid, "--no-html"],
                       capture_output=True, text=True)
    assert r.returncode == 3 and r.stderr.count("malformed series line skipped") == 1, \
        r.stderr
    mmleak.compact_dir(str(dump), tid)
    r = subprocess.run(MMLEAK + ["report", str(dump), "--pid", tid, "--no-html"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, "")
    counts, points = leak_counts(dump, tid)
    assert counts == [200, 400]
    check_series(points)


def test_a_live_process_is_never_taken_for_a_reused_pid(load, tmp_path, monkeypatch):
    """The wall clock set forward since the trace began (NTP, hours later), so the process
    seems to have started after its own trace; or a /proc that hides it (hidepid=): the
    process still runs and its files must stay."""
    dump, p = waiting_load(load, tmp_path)
    try:
        tid = str(p.pid)
        outs = sorted(n for n in os.listdir(dump) if n.endswith(".out"))
        real = mmleak.compact._process_start_time
        with monkeypatch.context() as m:
            m.setattr(mmleak.compact, "_process_start_time",
                      lambda pid: real(pid) + 3600 if pid == p.pid else real(pid))
            r = mmleak.compact_trace(str(dump), tid)
        assert not r["over"] and r["folded"] == 0
        assert sorted(n for n in os.listdir(dump) if n.endswith(".out")) == outs
        import builtins
        real_open = builtins.open

        def hidden(path, *a, **kw):
            if str(path) == "/proc/%d/stat" % p.pid:
                raise FileNotFoundError(2, "No such file or directory")
            return real_open(path, *a, **kw)
        with monkeypatch.context() as m:
            m.setattr(builtins, "open", hidden)
            r = mmleak.compact_trace(str(dump), tid)
        assert not r["over"] and r["folded"] == 0
        assert sorted(n for n in os.listdir(dump) if n.endswith(".out")) == outs
    finally:
        p.stdin.close()
        p.wait()
    r = mmleak.compact_trace(str(dump), tid)
    assert r["over"] and r["folded"] == len(outs)
    assert leak_count(dump, tid) == 1000


def test_report_shrink_and_page_of_a_compacted_copy_equal_the_whole(load, tmp_path):
    """One run kept whole (`run --keep-all`, files rotating at 1 MB, a fork child, two
    seconds so that the leaks have different ages), and a copy of it compacted: `report`
    (terminal and CSV: every leak, its bytes, blocks, ages, sizes and line), `shrink
    --final` (the survivors and their stacks) and the HTML page give the same, but for
    where the events were read."""
    full = tmp_path / "full"
    r = subprocess.run(MMLEAK + ["run", "--keep-all", "-d", str(full), "--", load, "-t", "2",
                                 "-n", "40000", "-r", "20000", "-l", "400", "-f"],
                       env=dict(os.environ, MMLEAK_ROTATE_MB="1"), capture_output=True)
    assert r.returncode == 0, r.stderr
    traces = sorted(k for k, v in mmleak.find_traces(str(full)).items() if v)
    assert len(traces) == 2 and all(len(mmleak.find_traces(str(full))[t]) > 2 for t in traces)
    comp = tmp_path / "comp"
    shutil.copytree(full, comp)
    subprocess.run(MMLEAK + ["compact", str(comp)], check=True, capture_output=True)
    for tid in traces:
        out = {}
        for d in (full, comp):
            page, csvf = tmp_path / ("%s.%s.html" % (d.name, tid)), \
                tmp_path / ("%s.%s.csv" % (d.name, tid))
            rep = subprocess.run(MMLEAK + ["report", str(d), "--pid", tid, "-o", str(page),
                                           "--csv", str(csvf)], capture_output=True, text=True)
            assert (rep.returncode, rep.stderr) == (0, ""), rep.stderr
            files = sorted(str(p) for p in mmleak.find_traces(str(d))[tid])
            shr = subprocess.run(MMLEAK + ["shrink", "--final"] + files, capture_output=True)
            assert shr.returncode == 0, shr.stderr
            out[d] = (rep.stdout.replace(str(d), "DIR").splitlines(), csvf.read_text(),
                      [l for l in shr.stdout.splitlines() if not l.startswith(b"#")
                       or l.startswith(b"#s ")],
                      [l for l in page.read_text().replace(str(d), "DIR").splitlines()
                       if "dc:date" not in l])
        (rf, cf, sf, pf), (rc, cc, sc, pc) = out[full], out[comp]
        nfiles = len(mmleak.find_traces(str(full))[tid])
        ages = {row.split(",")[5] for row in cf.splitlines()[1:]}
        assert cf == cc and len(cf.splitlines()) > 2 and len(ages) > 1
        assert sf == sc and len(sf) > 200
        events = int(re.search(r"^  (\d+) events read from %d files;" % nfiles, rf[1]).group(1))
        assert rc[1] == rf[1].replace("events read from %d files" % nfiles,
                                      "events (%d of them folded by compaction from %d files)"
                                      % (events, nfiles))
        assert rf[:1] + rf[2:] == rc[:1] + rc[2:]
        diff = [(a, b) for a, b in zip(pf, pc) if a != b]
        assert len(pf) == len(pc) and len(diff) == 2, diff
        note = "%d dump files</div>" % nfiles
        assert note in diff[0][0] and diff[0][1] == diff[0][0].replace(
            note, "%s of them folded by compaction from %d dump files, the rest read from 0 "
            "files</div>" % ("{:,}".format(events), nfiles))
        assert diff[1][0].startswith("<footer>") and diff[1][1].startswith("<footer>")
        assert re.sub(r" on \S+ \S+ from .* in DIR\.", "", diff[1][0]) == \
            re.sub(r" on \S+ \S+ from .* in DIR\.", "", diff[1][1])


HISTORY = [     # tests/history.c commands, one step each: (op, site, n[, size])
    [("a", 0, 100, 32), ("a", 1, 10, 1000), ("c", 2, 500, 64)],
    [("a", 0, 50, 32), ("f", 1, 4), ("a", 2, 20, 200)],
    [("f", 0, 120), ("a", 3, 7, 4096), ("c", 0, 1000, 32)],
    [("f", 2, 20), ("a", 1, 5, 1000), ("f", 3, 7)],
    [("a", 0, 30, 48), ("a", 3, 1, 100)],
]


class Model:
    """The blocks history.c has alive: per site, [(id, size)] oldest first."""

    def __init__(self):
        self.sites = {s: [] for s in range(4)}
        self.next = 0

    def apply(self, cmd):
        if cmd[0] == "a":
            for _ in range(cmd[2]):
                self.sites[cmd[1]].append((self.next, cmd[3]))
                self.next += 1
        elif cmd[0] == "f":
            del self.sites[cmd[1]][:cmd[2]]

    def alive(self):
        return {s: dict(v) for s, v in self.sites.items()}


def expected_point(now, before):
    """{site: (bytes, blocks, newb, newn, freedb, freedn)} from two Model.alive()s."""
    out = {}
    for s in range(4):
        a, b = now[s], before[s] if before is not None else None
        new = {i: z for i, z in a.items() if b is not None and i not in b}
        freed = {i: z for i, z in (b or {}).items() if i not in a}
        v = (sum(a.values()), len(a), sum(new.values()), len(new), sum(freed.values()),
             len(freed))
        if any(v):
            out[s] = v
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory, lib):
    exe = str(tmp_path_factory.mktemp("history") / "history")
    subprocess.run(["cc", "-O0", "-g", "-o", exe, os.path.join(TESTS, "history.c")],
                   check=True)
    return exe


def run_history(exe, dump, at_step):
    """Run the HISTORY under mmleak.so, calling AT_STEP(k, model) after each step; then
    let the program exit."""
    p = subprocess.Popen([exe], env=traced_env(dump), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    m = Model()
    for k, step in enumerate(HISTORY):
        for cmd in step:
            m.apply(cmd)
            p.stdin.write((" ".join(str(x) for x in cmd) + "\n").encode())
            p.stdin.flush()
            assert p.stdout.readline() == b"ok\n"
        at_step(k, m, str(p.pid))
    p.stdin.close()
    assert p.wait() == 0
    return str(p.pid), m


def by_site(sites, frames):
    """{history.c site number: values} of a series point's or report's {caller key: v}."""
    out = {}
    for k, v in sites.items():
        if k == "other":
            continue
        fr = frames.get(k[0] if isinstance(k, tuple) else k)
        m = re.fullmatch(r"site(\d)", fr.function or "") if fr else None
        if m and (fr.file or "").endswith("history.c"):
            assert fr.line == site_line("history.c", "hist" + m.group(1))
            out[int(m.group(1))] = v
    return out


def test_series_against_a_scripted_history(history, tmp_path):
    """Four call sites whose live blocks go up and down as scripted (allocations, frees of
    the oldest, churn that is never alive at a point): every point of the series gives each
    site's live bytes and blocks, and what is new and what was freed since the previous
    point, exactly; the point at the end of the trace too."""
    dump = tmp_path / "dump"
    dump.mkdir()
    states = []

    def step(k, m, tid):
        mmleak.compact_dir(str(dump), tid)
        states.append(m.alive())
    tid, m = run_history(history, dump, step)
    mmleak.compact_dir(str(dump), tid)
    states.append(m.alive())                    # the end: the same as the last step
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(dump), tid).series)
    assert len(points) == len(HISTORY) + 1
    sym = mmleak.Symbolizer(os.path.join(str(dump), "mmleak.%s.maps" % tid))
    frames = sym.lookup(sorted({k[0] for pt in points for k in pt.sites if k != "other"}))
    for i, pt in enumerate(points):
        want = expected_point(states[i], states[i - 1] if i else None)
        assert by_site(pt.sites, frames) == want, i
    check_series(points)
    # everything else alive (stdio's buffers) stays as it was from the first point on
    rest = [pt.live[0] - sum(v[0] for v in by_site(pt.sites, frames).values())
            for pt in points]
    assert len(set(rest)) == 1


def test_series_interval_against_a_scripted_history(history, tmp_path):
    """`compact --series-interval 3600` after every step: one point when the series begins,
    none more while the process runs, and one at the end of the trace, whose NEW and FREED
    are counted from the first point."""
    dump = tmp_path / "dump"
    dump.mkdir()
    states = []

    def step(k, m, tid):
        r = subprocess.run(MMLEAK + ["compact", "--series-interval", "3600", str(dump)],
                           capture_output=True)
        assert r.returncode == 0, r.stderr
        states.append(m.alive())
    tid, m = run_history(history, dump, step)
    r = subprocess.run(MMLEAK + ["compact", "--series-interval", "3600", str(dump)],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(dump), tid).series)
    assert len(points) == 2
    sym = mmleak.Symbolizer(os.path.join(str(dump), "mmleak.%s.maps" % tid))
    frames = sym.lookup(sorted({k[0] for pt in points for k in pt.sites if k != "other"}))
    assert by_site(points[0].sites, frames) == expected_point(states[0], None)
    assert by_site(points[1].sites, frames) == expected_point(m.alive(), states[0])
    check_series(points)


def test_incremental_view_against_a_scripted_history(history, tmp_path):
    """A snapshot after every step; at every later step, `report --baseline` of each
    earlier snapshot gives per site what was allocated since and is still alive (+) and
    what of the snapshot was freed since (-), exactly, in the terminal and on the page."""
    dump = tmp_path / "dump"
    dump.mkdir()
    snaps = []

    def step(k, m, tid):
        snap = tmp_path / ("snap%d" % k)
        r = subprocess.run(MMLEAK + ["snapshot", str(dump), "--pid", tid, "-o", str(snap)],
                           capture_output=True)
        assert r.returncode == 0, r.stderr
        now = m.alive()
        for i, (old, then) in enumerate(snaps):
            rep = mmleak.build_report(str(dump), tid, progress=False, baseline=str(old))
            got = by_site({r[0]: r[1:] for r in mmleak.incremental_sites(rep)}, rep["frames"])
            want = {}
            for s in range(4):
                plus = [z for j, z in now[s].items() if j not in then[s]]
                minus = [z for j, z in then[s].items() if j not in now[s]]
                if plus or minus:
                    want[s] = (sum(plus), len(plus), sum(minus), len(minus))
            assert got == want, (i, k)
        if k == len(HISTORY) - 1:
            # the terminal and the page, against the first snapshot
            page = tmp_path / "r.html"
            r = subprocess.run(MMLEAK + ["report", str(dump), "--pid", tid, "-o", str(page),
                                         "--baseline", str(snaps[0][0]),
                                         # the sites are history.c's siteN functions, which
                                         # hand their block back: wrappers to the detection
                                         "--no-wrapper-detection"],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            line = site_line("history.c", "hist0")
            plus = [z for j, z in now[0].items() if j not in snaps[0][1][0]]
            minus = [z for j, z in snaps[0][1][0].items() if j not in now[0]]
            assert re.search(r"^  +%d +%d +%d +%d  site0 at %s:%d$" % (
                sum(plus), len(plus), -sum(minus), -len(minus),
                re.escape(os.path.join(TESTS, "history.c")), line), r.stdout, re.M), r.stdout
            html = page.read_text()
            assert ("site0 at %s:%d</td><td class=n>+%s</td><td class=n>+%d</td>"
                    "<td class=n>-%s</td><td class=n>-%d</td>" % (
                        os.path.join(TESTS, "history.c"), line, "{:,}".format(sum(plus)),
                        len(plus), "{:,}".format(sum(minus)), len(minus))) in html
        snaps.append((snap, now))
    run_history(history, dump, step)


def test_compactors_following_a_process_that_is_sigkilled(load, tmp_path):
    """Two compactors follow a process whose files rotate at 1 MB; it is SIGKILLed after its
    work (its last files have no #end, their newest lines only in the staging files): the
    compactors fold everything, .tail included, and stop; the leaks are exact, nothing is
    read twice, no dump or staging file is left, and the series ends with the final live
    set."""
    (ref,) = reference_events(load, ["-t", "2", "-n", "200000", "-l", "1000", "-w"],
                              tmp_path / "reference")
    dump = tmp_path / "dump"
    p, comps = load_and_compactors(load, ["-t", "2", "-n", "200000", "-l", "1000", "-w"], dump,
                                   "0.1", "1")
    assert p.stdout.readline() == b"leaked 400\n"
    assert p.stdout.readline() == b"ready\n"
    p.send_signal(signal.SIGKILL)
    p.wait()
    for c in comps:
        _, err = c.communicate(timeout=120)
        assert (c.returncode, err) == (0, b""), err
    tid = str(p.pid)
    assert not [n for n in os.listdir(dump) if n.endswith((".out", ".tail", ".tmp"))]
    assert leak_count(dump, tid) == 400
    assert churn_survivors(dump, tid) == 0
    # the same events as a run to the end (less, maybe, the allocation of stdin's buffer
    # after "ready", which the kill may come before)
    assert ref - 1 <= events_counted(dump, tid) <= ref
    truth, sh = survivors(dump, tid)
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(dump), tid).series)
    assert points[-1].live == (sum(v[0] for v in truth.values()), len(truth))
    check_series(points)
    assert not os.path.exists(mmleak.TraceFiles(str(dump), tid).series + ".live")


def test_follow_last_pass_waits_for_the_traced_process_stopping_with_it(tmp_path, lib):
    """A service's companion is stopped at the same time as the service (it is no longer
    ordered before it: the service's restart waited for its last pass, 20 s and more after
    sshd was killed).  So after SIGTERM it keeps going while the processes it traced then
    run, and its last pass, once they ended, folds their last files: the trace is over and
    nothing is left to fold.  Without the wait it left at once, the files unfolded."""
    exe = str(tmp_path / "leaky_daemon")
    subprocess.run(["cc", "-O0", "-g", "-o", exe, os.path.join(TESTS, "leaky_daemon.c")],
                   check=True)
    dump, state = tmp_path / "dump", tmp_path / "state"
    dump.mkdir()
    state.mkdir()
    env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump), MMLEAK_ROTATE_MB="1",
               STATE_DIRECTORY=str(state))
    d = subprocess.Popen([exe, "13", "777", "20000"], env=env)
    comp = None
    try:
        deadline = time.monotonic() + 60
        while not (state / "ready").exists():
            assert time.monotonic() < deadline and d.poll() is None
            time.sleep(0.05)
        comp = subprocess.Popen(MMLEAK + ["compact", "--follow", "--forever", "--verbose",
                                          str(dump)], stdout=subprocess.PIPE,
                                universal_newlines=True)
        first = comp.stdout.readline()      # a pass folded the rotated files: it saw the trace
        assert re.match(r"^mmleak\.py: trace %d: folded \d+ files .*\)\n$" % d.pid, first), first
        comp.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert comp.poll() is None          # waiting for the traced process
        d.send_signal(signal.SIGTERM)
        assert d.wait(30) == -signal.SIGTERM
        rest = comp.communicate(timeout=30)[0]
        assert comp.returncode == 0
        assert [l for l in rest.splitlines() if l.endswith("; the trace is over")], rest
        assert not [n for n in os.listdir(str(dump)) if n.endswith((".out", ".tail"))]
    finally:
        for p in (d, comp):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="a lock file of another user's needs root")
def test_companion_does_not_fail_for_a_stale_lock_of_another_user(tmp_path):
    # A daemon's companion (`compact --follow --forever`) meets a mmleak.ID.lock left by an
    # older companion that ran as another user (the chrony row of mmleak-systemd(7)): the
    # trace is not folded, said once with why, and the companion still exits 0 at its stop
    # (systemd would show it failed, and restart it, for a condition it handled).
    (tmp_path / "mmleak.81.0.out").write_bytes(
        b"#mmleak 2 id=81 pid=81 tid=81 file=0 depth=1 start=1700000000\n#cmd ./x\n"
        b"1000 0 64 0 400010\n#end\n")
    (tmp_path / "mmleak.81.maps").write_bytes(b"")
    lock = tmp_path / "mmleak.81.lock"
    lock.write_bytes(b"")
    os.chown(str(lock), 65534, 65534)
    comp = subprocess.Popen(MMLEAK + ["compact", "--follow", "--forever", "--verbose",
                                      "--interval", "0.1", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True)
    try:
        first = comp.stderr.readline()
        time.sleep(0.5)                 # a few more passes: the line is not said again
        comp.send_signal(signal.SIGTERM)
        out, err = comp.communicate(timeout=60)
    finally:
        if comp.poll() is None:
            comp.kill()
            comp.wait()
    assert first + err == ("mmleak.py: trace 81: not folded: %s: owned by uid 65534, not by "
                           "the trace's owner (uid 0) or root: refused\n" % lock)
    assert (comp.returncode, out) == (0, "")
    assert os.path.exists(str(tmp_path / "mmleak.81.0.out"))     # left as it was


def test_each_warning_once_though_a_point_reads_the_files_again(tmp_path, lib):
    """A pass folds the files that are complete, then its point reads the trace again (the
    file still written too), whole and, compiled, its keys beside the result alone: a
    malformed line of that file was said twice (the second named by its base name).  Each
    warning once, each engine alike."""
    alive = subprocess.Popen(["sleep", "60"])       # (the traced process: still running)
    try:
        p, t = alive.pid, int(time.time())
        head = "#mmleak 2 id=%d pid=%d tid=%%d file=%%d depth=1 start=%d\n" % (p, p, t)
        files = {
            "compact": "#mmleak 2 id=%d pid=%d depth=1 start=%d\n#clock 1\n#compacted "
                       "files=1 events=3 entries=2 allocs=2 entry_allocs=2 at=1\n"
                       "1000000000 1 10 1 401000\ngarbage\n3000000000 1 10 1 401000\n"
                       % (p, p, t),
            "0.out": head % (6, 0) + "2000000000 1 10 1 401000\nbad zero\n#end\n",
            "1.out": head % (7, 1) + "4000000000 1 10 1 401000\nbad one\n",    # (running)
        }
        for engine in ("python", "native"):
            d = tmp_path / engine
            d.mkdir()
            (d / ("mmleak.%d.maps" % p)).write_text("")
            for name, text in files.items():
                (d / ("mmleak.%d.%s" % (p, name))).write_text(text)
            r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "compact",
                                str(d)], capture_output=True, text=True,
                               env=dict(os.environ, MMLEAK_SHRINK=engine))
            said = sorted(l for l in r.stderr.splitlines() if "malformed" in l)
            assert (r.returncode, said) == (3, [
                "mmleak.py: %s/mmleak.%d.%s: malformed line skipped: %s" % (d, p, where, line)
                for where, line in (("0.out:3", "b'bad zero\\n'"), ("1.out:3", "b'bad one\\n'"),
                                    ("compact:5", "b'garbage\\n'"))]), engine
            assert os.path.exists(d / ("mmleak.%d.series" % p))    # (the point was made)
    finally:
        alive.kill()
        alive.wait()


class TickingClock:
    """A clock 10 s later at every reading: each chance of a progress line takes it."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        self.now += 10.0
        return self.now


def test_a_pass_shows_its_progress_when_asked(load, tmp_path, monkeypatch):
    """A long fold says how far it is (on a terminal, or with --progress): the callback is
    given to the shrinker of each fold, and its line is ended once the fold is done, with
    every event of the trace counted.  The shrinker's clock runs 10 s a reading here: each
    of its chances to show the line takes it, whatever this machine's speed (one each
    65,536 lines of a file: the files here hold more)."""
    full, tid, truth, sh_full = finished_trace(load, tmp_path, "-t", "2", "-n", "300000",
                                               "-l", "500", rotate=64)
    inputs = mmleak.find_traces(str(full))[tid]
    clock = TickingClock()
    monkeypatch.setattr(mmleak.native, "time", clock)
    monkeypatch.setattr(mmleak.shrink, "time", clock)
    out = io.StringIO()
    live, results = mmleak.compact_dir(str(full), out=io.StringIO(),
                                       progress=mmleak.shrink.progress_printer(out))
    assert (live, [r["folded"] for r in results]) == ([], [len(inputs)])
    lines = out.getvalue().split("\r")
    assert lines[0] == "" and len(lines) > 2, out.getvalue()    # shown while it read
    assert all(re.fullmatch(r"mmleak\.py: [0-9.]+M events, [0-9]+ files done, [0-9.]+M "
                            r"events/s, now mmleak\.%s\.[0-9-]+\.out   " % re.escape(tid), s)
               for s in lines[1:-1]), lines
    assert re.fullmatch(r"mmleak\.py: %.1fM events, [0-9]+ files done, [0-9.]+M events/s, "
                        r"now mmleak\.%s\.[0-9-]+\.out\n" % (sh_full.events / 1e6,
                                                             re.escape(tid)),
                        lines[-1]), lines[-1]
    got, _ = survivors(full, tid)
    assert got == truth



def test_a_report_reads_the_results_folded_names_once(load, tmp_path, monkeypatch):
    """The report's choice of a trace lists the files without reading the result's
    "#folded" lines; the trace's reader, under its lock, reads them: once a report, not
    once for the choice and again for the reading."""
    full, tid, truth, sh_full = finished_trace(load, tmp_path, "-t", "2", "-n", "20000",
                                               "-l", "50")
    mmleak.compact_trace(str(full), tid)
    read = []
    real = mmleak.files._previously_folded

    def counted(path, t):
        read.append(os.path.basename(path))
        return real(path, t)
    monkeypatch.setattr(mmleak.files, "_previously_folded", counted)
    rep = mmleak.build_report(str(full), progress=False)
    assert read == ["mmleak.%s.compact" % tid]
    assert (rep["trace"], rep["files"], len(rep["survivors"])) == (
        tid, [str(full / ("mmleak.%s.compact" % tid))], len(truth))
