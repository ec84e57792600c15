"""The readers and the compactor in a dump directory that others can write to (/tmp), and on
damaged input (issue #17): files planted at mmleak's names by another user, FIFOs, a trace
in another pid namespace, NUL runs and holes, a full disk, the trace's clock after
compaction.

Synthetic traces are used where a real process is not needed: their pid is one no process
can have (above pid_max), so the compactor takes them as over, or the pid of a `sleep` the
test runs, so that it takes them as running."""
import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import LIB, ROOT, TESTS, mmleak, site_line

MMLEAK = [sys.executable, os.path.join(ROOT, "mmleak.py")]
NOBODY = 65534
GONE = "4194399"            # above any pid_max (2^22): no process has this pid
START = 1700000000


def hdr(tid, n, start=START):
    return b"#mmleak 2 id=%s pid=%s tid=%s file=%d depth=1 start=%d\n" % (
        tid.encode(), tid.split("-")[0].encode(), tid.split("-")[0].encode(), n, start)


def alloc(ptr, seq, size, t=0, caller=0x400000):
    return b"%012x %x %x %x %x\n" % (ptr, seq, size, t, caller)


def free(ptr, seq, caller=0x400010):
    return b"%012x %x %x\n" % (ptr, seq, caller)


def make_trace(d, tid, files, end=True):
    """Trace TID in D: its maps file and dump files N -> event lines (a header first, "#end"
    last when END)."""
    (d / ("mmleak.%s.maps" % tid)).write_bytes(b"")
    for n, body in files.items():
        (d / ("mmleak.%s.%d.out" % (tid, n))).write_bytes(
            hdr(tid, n) + body + (b"#end\n" if end else b""))


def shared_dir(tmp_path):
    """A directory like /tmp: anybody may write, sticky."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def plant(path, data, uid=NOBODY):
    """A regular file of another user."""
    path.write_bytes(data)
    os.chown(path, uid, uid)


def run(*args, timeout=60):
    r = subprocess.run(MMLEAK + list(args), capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def blocks_line(out):
    """(bytes, blocks) not freed, as the report's table of call sites sums them (and its
    first lines say)."""
    m = re.search(r"; \S+ \S+ in (\d+) blocks not freed", out)
    rows = re.findall(r"^ +(\d+) +(\d+)  \S", out, re.M)
    if not m or int(m.group(1)) != sum(int(b) for _, b in rows):
        return out
    return sum(int(a) for a, _ in rows), int(m.group(1))


# The trace of the tests below: three blocks of 16, 32 and 48 bytes leaked, one pair freed.
LEAKS = alloc(0x1000, 0, 0x10) + alloc(0x2000, 0, 0x20, 3) + alloc(0x3000, 0, 0x40) + \
    free(0x3000, 1) + alloc(0x3000, 2, 0x30, 5)


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root (files of another user)")


@pytest.fixture
def sleeper():
    """A running process: a synthetic trace with its pid is taken as running."""
    p = subprocess.Popen(["sleep", "1000"])     # (Popen returns once the exec is done)
    yield p
    p.kill()
    p.wait()


# ---- item 1: a forged result file ------------------------------------------------------

def test_a_forged_compact_deletes_nothing_and_adds_no_leak(tmp_path, sleeper):
    """Another user's mmleak.T.compact naming the running trace's file in "#folded", with a
    leak of its own: the compactor refuses it (one line, exit 2), deletes nothing, and the
    report does not read it."""
    needs_root()
    d = shared_dir(tmp_path)
    tid = str(sleeper.pid)
    start = int(time.time()) - 1
    (d / ("mmleak.%s.maps" % tid)).write_bytes(b"")
    out = d / ("mmleak.%s.0.out" % tid)
    out.write_bytes(hdr(tid, 0, start) + LEAKS)          # still written: no "#end"
    tail = d / ("mmleak.%s.0.tail" % tid)
    tail.write_bytes(b"#at %016x\n" % out.stat().st_size + b"\0" * 200)
    forged = d / ("mmleak.%s.compact" % tid)
    plant(forged, b"#mmleak 2 id=%s\n#folded mmleak.%s.0.out\n" % (tid.encode(), tid.encode())
          + alloc(0x9000, 0, 0x4000))
    refusal = ("mmleak.py: %s: owned by uid %d, not by the trace's owner (uid 0) or root: "
               "ignored" % (forged, NOBODY))
    r = run("compact", str(d))
    assert out.exists() and tail.exists() and forged.read_bytes().startswith(b"#mmleak")
    assert (r.returncode, r.stderr.splitlines()) == (2, [refusal])
    r = run("report", str(d), "--pid", tid, "--no-html")
    assert r.returncode == 2 and r.stderr.splitlines()[0] == refusal, r.stderr
    assert blocks_line(r.stdout) == (16 + 32 + 48, 3)


def test_a_result_deletes_only_files_of_its_own_trace(tmp_path):
    """A result (even a genuine one) names in "#folded" a file of another trace: that file
    is not deleted."""
    d = tmp_path / "d"
    d.mkdir()
    other = "4194398"
    make_trace(d, GONE, {0: LEAKS})
    make_trace(d, other, {0: alloc(0x5000, 0, 0x50)})
    (d / ("mmleak.%s.compact" % GONE)).write_bytes(
        b"#mmleak 2 id=%s\n#folded mmleak.%s.0.out\n" % (GONE.encode(), other.encode()))
    r = run("compact", "--pid", GONE, str(d))
    assert r.returncode == 0, r.stderr
    assert (d / ("mmleak.%s.0.out" % other)).exists()
    r = run("report", str(d), "--pid", other, "--no-html")
    assert blocks_line(r.stdout) == (0x50, 1)


def test_results_of_root_are_given_to_the_owner_of_the_trace(tmp_path):
    """A compactor running as root gives what it writes (result, series) to the trace's
    owner, as it does its lock: a result of root's in a trace of another user would be
    trusted by the next trace of that name."""
    needs_root()
    d = shared_dir(tmp_path)
    make_trace(d, GONE, {0: LEAKS})
    for p in d.iterdir():
        os.chown(p, NOBODY, NOBODY)
    r = run("compact", str(d))
    assert (r.returncode, r.stderr) == (0, "")
    owned = {p.name: p.stat().st_uid for p in d.iterdir()}
    assert owned == {"mmleak.%s.%s" % (GONE, n): NOBODY
                     for n in ("maps", "compact", "series", "lock")}, owned
    assert {stat.S_IMODE((d / ("mmleak.%s.%s" % (GONE, n))).stat().st_mode)
            for n in ("compact", "series", "lock")} == {0o600}


# ---- item 4: dump files of another user; a trace that lost events ------------------------

def test_dump_files_of_another_user_are_ignored_and_said(tmp_path):
    """Another user's mmleak.T.N.out beside a root trace's files (with a leak, and the
    trace's own header): readers ignore it, in one line, exit 2; the compactor leaves it."""
    needs_root()
    d = shared_dir(tmp_path)
    make_trace(d, GONE, {0: LEAKS})
    fake = d / ("mmleak.%s.7.out" % GONE)
    plant(fake, hdr(GONE, 7) + alloc(0x9000, 0, 0x4000) + b"#end\n")
    said = ("mmleak.py: %s: owned by uid %d, not by the trace's owner (uid 0) or root: "
            "ignored" % (fake, NOBODY))
    r = run("report", str(d), "--pid", GONE, "--no-html")
    assert (r.returncode, r.stderr.splitlines()) == (2, [said])
    assert blocks_line(r.stdout) == (16 + 32 + 48, 3)
    r = run("shrink", "--final", *sorted(str(p) for p in d.glob("*.out")))
    assert r.returncode == 2 and r.stderr.splitlines() == [said.replace("ignored", "refused")]
    assert "000000009000" not in r.stdout
    r = run("compact", str(d))
    assert (r.returncode, r.stderr.splitlines()) == (2, [said])
    assert fake.exists() and not (d / ("mmleak.%s.0.out" % GONE)).exists()
    r = run("report", str(d), "--pid", GONE, "--no-html")
    assert (r.returncode, r.stderr.splitlines()) == (2, [said])
    assert blocks_line(r.stdout) == (16 + 32 + 48, 3)


def test_the_owner_is_the_owner_of_the_maps_file(tmp_path):
    """A daemon that dropped root hands its maps file and the files it is writing to its new
    user; files of threads that ended before stay root's: both are the trace's.  A trace
    whose maps file is gone has no known owner: only root's files (and the reader's) are
    read."""
    needs_root()
    d = shared_dir(tmp_path)
    make_trace(d, GONE, {0: alloc(0x1000, 0, 0x10), 1: alloc(0x2000, 0, 0x20)})
    os.chown(d / ("mmleak.%s.maps" % GONE), NOBODY, NOBODY)
    os.chown(d / ("mmleak.%s.1.out" % GONE), NOBODY, NOBODY)
    r = run("report", str(d), "--pid", GONE, "--no-html")
    assert (r.returncode, r.stderr) == (0, "")
    assert blocks_line(r.stdout) == (0x30, 2)
    os.unlink(d / ("mmleak.%s.maps" % GONE))
    r = run("report", str(d), "--pid", GONE, "--no-html")
    assert r.stderr.splitlines() == [
        "mmleak.py: %s/mmleak.%s.1.out: owned by uid %d, not by root or uid 0 (the trace has "
        "no maps file to name its owner): ignored" % (d, GONE, NOBODY)]
    assert r.returncode == 2 and blocks_line(r.stdout) == (0x10, 1)


def test_every_reader_says_a_trace_that_lost_events_is_incomplete(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    make_trace(d, GONE, {0: LEAKS + b"#dropping k=1\n#lost 7 k=1\n"})
    gap = ("INCOMPLETE TRACE: 7 events were not recorded; blocks may show as leaks whose free "
           "was lost")
    r = run("report", str(d), "--no-html")
    assert r.returncode == 3 and gap in r.stdout
    r = run("snapshot", str(d), "-o", str(tmp_path / "snap"))
    assert r.returncode == 3 and "mmleak.py: " + gap in r.stderr.splitlines(), r.stderr
    r = run("compact", str(d))
    assert r.returncode == 0
    r = run("report", str(d), "--no-html")
    assert r.returncode == 3 and gap in r.stdout


# ---- item 6: a FIFO (or another non-regular file) at any name a reader opens --------------

# name -> (what report says and its status, what compact says and its status); None: the
# command does not open that name
FIFO_CASES = {
    "compact": (("ignored", 2), ("ignored", 2)),
    "1.tail": (("refused", 2), ("refused", 2)),
    "2.out": (("ignored", 2), ("ignored", 2)),
    "series": (("ignored", 2), ("ignored", 2)),
    "series.live": (None, ("ignored", 2)),
    "lock": (("refused", 2), ("refused", 2)),
    "loads": (("refused", 2), None),
    "maps": (("refused", 2), None),
}


@pytest.mark.parametrize("name", sorted(FIFO_CASES))
def test_a_fifo_at_any_name_is_refused_without_blocking(tmp_path, name):
    d = tmp_path / "d"
    d.mkdir()
    make_trace(d, GONE, {0: alloc(0x1000, 0, 0x10)})
    (d / ("mmleak.%s.1.out" % GONE)).write_bytes(hdr(GONE, 1) + alloc(0x2000, 0, 0x20))
    if name == "series.live":   # a series being written: its .live is read by the next point
        assert run("compact", "--series-interval", "0", str(d)).returncode == 0
        (d / ("mmleak.%s.1.out" % GONE)).write_bytes(hdr(GONE, 1) + alloc(0x2000, 0, 0x20))
    fifo = d / ("mmleak.%s.%s" % (GONE, name))
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    report, compact = FIFO_CASES[name]
    for cmd, want in (("report", report), ("compact", compact)):
        args = ["report", "--no-html", "--pid", GONE] if cmd == "report" else ["compact"]
        r = run(*(args + [str(d)]), timeout=30)
        said = [] if want is None else [
            "mmleak.py: %s%s: a FIFO, not a regular file: %s" % (
                "trace %s: not folded: " % GONE if (cmd, name) == ("compact", "lock") else "",
                fifo, want[0])]
        assert (r.returncode, r.stderr.splitlines()) == (want[1] if want else 0, said), \
            (cmd, r.stdout)
        if cmd == "report" and name not in ("lock", "1.tail"):
            assert blocks_line(r.stdout) == (0x30, 2)
    if name in ("compact", "series"):       # written by the compactor: a new one took
        assert stat.S_ISREG(fifo.lstat().st_mode)       # the name
    elif name == "series.live":             # likewise, and deleted after the last point
        assert not os.path.lexists(fifo)
    else:
        assert stat.S_ISFIFO(fifo.lstat().st_mode)     # never removed
    if name in ("lock", "1.tail"):      # nothing folded, nothing deleted
        assert (d / ("mmleak.%s.1.out" % GONE)).exists()


def test_symbolic_links_and_fifos_given_to_shrink_are_refused(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    make_trace(d, GONE, {0: alloc(0x1000, 0, 0x10)})
    os.mkfifo(d / ("mmleak.%s.1.out" % GONE))
    os.symlink(d / ("mmleak.%s.0.out" % GONE), d / ("mmleak.%s.2.out" % GONE))
    for engine in ("python", "native"):
        r = subprocess.run(MMLEAK + ["shrink", "--final"] + sorted(
            str(p) for p in d.glob("*.out")), capture_output=True, text=True, timeout=30,
            env=dict(os.environ, MMLEAK_SHRINK=engine))
        assert r.returncode == 2 and r.stderr.splitlines() == [
            "mmleak.py: %s/mmleak.%s.1.out: a FIFO, not a regular file: refused" % (d, GONE),
            "mmleak.py: %s/mmleak.%s.2.out: a symbolic link, not a regular file: refused"
            % (d, GONE)], (engine, r.stderr)
        assert r.stdout.endswith(alloc(0x1000, 0, 0x10).decode())


# ---- item 8: NUL bytes anywhere -----------------------------------------------------------

@pytest.mark.parametrize("engine", ["python", "native"])
def test_nul_runs_in_the_middle_are_skipped_and_the_events_after_them_counted(tmp_path,
                                                                                engine):
    p = tmp_path / ("mmleak.%s.0.out" % GONE)
    p.write_bytes(hdr(GONE, 0) + alloc(0x1000, 0, 0x10) + b"\0" * 5000 + alloc(0x2000, 0, 0x20)
                  + alloc(0x3000, 0, 0x30)[:9] + b"\0" * 4096 + alloc(0x4000, 0, 0x40)
                  + b"\0" + alloc(0x5000, 0, 0x50) + b"#end\n")
    r = subprocess.run(MMLEAK + ["shrink", "--final", "--stats", str(p)], capture_output=True,
                       text=True, env=dict(os.environ, MMLEAK_SHRINK=engine))
    assert r.returncode == 0
    assert [l for l in r.stdout.splitlines() if not l.startswith("#")] == [
        alloc(a, 0, s).decode().rstrip("\n") for a, s in
        ((0x1000, 0x10), (0x2000, 0x20), (0x4000, 0x40), (0x5000, 0x50))]
    assert r.stderr.splitlines() == [
        "mmleak.py: %s:3: NUL bytes skipped (padding, or a hole a crash left in the file)" % p,
        "mmleak.py: %s:4: torn line (process killed while writing it?) ignored: "
        "b'000000003'" % p,
        "mmleak.py: %s:5: NUL bytes skipped (padding, or a hole a crash left in the file)" % p,
        "mmleak.py: 4 events (4 allocations, 0 frees) in 1 inputs; 4 blocks (192 B) survive, "
        "0 foreign frees"]


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_line_whose_start_a_hole_took_is_not_an_event(tmp_path, engine):
    """A hole that ends in the middle of a line leaves its end: "02000 0 20 0 400000" parses,
    as a block at 0x2000 instead of 0x7f0000002000.  mmleak.so writes every pointer with 12
    digits or more: after a run of NULs a shorter one is the end of a cut line, a loss in the
    middle of the file (status 3), not an event."""
    p = tmp_path / ("mmleak.%s.0.out" % GONE)
    cut = alloc(0x7f0000002000, 0, 0x20)
    p.write_bytes(hdr(GONE, 0) + alloc(0x1000, 0, 0x10) + cut[:7] + b"\0" * 4096 + cut[7:]
                  + alloc(0x3000, 0, 0x30) + b"#end\n")
    r = subprocess.run(MMLEAK + ["shrink", "--final", "--stats", str(p)], capture_output=True,
                       text=True, env=dict(os.environ, MMLEAK_SHRINK=engine))
    assert r.returncode == 3
    assert [l for l in r.stdout.splitlines() if not l.startswith("#")] == [
        alloc(0x1000, 0, 0x10).decode().rstrip("\n"), alloc(0x3000, 0, 0x30).decode().rstrip("\n")]
    assert r.stderr.splitlines() == [
        "mmleak.py: %s:3: torn line (process killed while writing it?) ignored: b'7f00000'" % p,
        "mmleak.py: %s:3: line cut by NUL bytes before it (its start is lost) skipped: %r"
        % (p, cut[7:]),
        "mmleak.py: 2 events (2 allocations, 0 frees) in 1 inputs; 2 blocks (64 B) survive, "
        "0 foreign frees"]


# ---- item 9: memory stays bounded -----------------------------------------------------------

def peak_rss_kb(argv, env):
    """Run ARGV; its exit status, stderr and peak resident set (KiB, from wait4)."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err.decode(), ru.ru_maxrss


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_sparse_file_and_a_giant_line_take_bounded_memory(tmp_path, engine):
    """A hole of 2 GiB (what a crash can leave), then an event; and a line of 48 MiB without
    a newline: each reader's peak memory stays below 80 MiB more than on an empty file."""
    env = dict(os.environ, MMLEAK_SHRINK=engine)
    empty = tmp_path / ("mmleak.%s.0.out" % GONE)
    empty.write_bytes(hdr(GONE, 0))
    rc, err, base = peak_rss_kb(MMLEAK + ["shrink", "--final", str(empty)], env)
    assert (rc, err) == (0, "")
    sparse = tmp_path / ("mmleak.%s.1.out" % GONE)
    with open(sparse, "wb") as f:
        f.write(hdr(GONE, 1) + alloc(0x1000, 0, 0x10))
        f.seek(2 << 30, os.SEEK_CUR)
        f.write(alloc(0x2000, 0, 0x20) + b"#end\n")
    assert os.stat(sparse).st_blocks * 512 < 1 << 20          # really sparse
    giant = tmp_path / ("mmleak.%s.2.out" % GONE)
    with open(giant, "wb") as f:
        f.write(hdr(GONE, 2) + alloc(0x3000, 0, 0x30))
        for _ in range(48):
            f.write(b"x" * (1 << 20))
        f.write(b"\n" + alloc(0x4000, 0, 0x40))
    for p, said, status in ((sparse, "%s:3: NUL bytes skipped (padding, or a hole a crash "
                                     "left in the file)" % sparse, 0),
                            (giant, "%s:3: malformed line skipped (longer than 1048576 bytes): "
                             "%r" % (giant, b"x" * 80), 3)):
        rc, err, peak = peak_rss_kb(MMLEAK + ["shrink", "--final", "--stats", str(p)], env)
        assert peak - base < 80 << 10, (p, peak, base)
        assert rc == status and err.splitlines()[0] == "mmleak.py: " + said, err
        assert "; 2 blocks (" in err.splitlines()[-1], err


# ---- item 13: compaction keeps the trace's clock ------------------------------------------

def test_compaction_keeps_the_trace_clock(tmp_path):
    """The newest event (at 6 s) is a block freed since: after compaction the trace still
    ends at 6 s, so the leak of 0 s is 6 s old (--older-than 3 finds it), and the last point
    of the series is at 6 s.  A partial shrink keeps the clock too."""
    d = tmp_path / "d"
    d.mkdir()
    make_trace(d, GONE, {0: alloc(0x1000, 0, 0x10, 0) + alloc(0x2000, 0, 0x20, 6) +
                         free(0x2000, 1)})
    part = tmp_path / "part"
    r = run("shrink", "-o", str(part), str(d / ("mmleak.%s.0.out" % GONE)))
    assert r.returncode == 0
    assert mmleak.shrink_files([str(part)]).max_time == 6
    for when in ("before", "after"):
        r = run("report", str(d), "--older-than", "3", "--no-html")
        assert (r.returncode, blocks_line(r.stdout)) == (0, (0x10, 1)), (when, r.stdout)
        assert "showing only blocks at least 3s old at the end (1 of 1 blocks" in r.stdout
        assert mmleak.build_report(str(d), GONE, progress=False)["end_time"] == 6
        if when == "before":
            assert run("compact", str(d)).returncode == 0
            assert not (d / ("mmleak.%s.0.out" % GONE)).exists()
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(d), GONE).series)
    assert [p.time for p in points] == [6]
    assert b"\n#clock 6\n" in (d / ("mmleak.%s.compact" % GONE)).read_bytes()
    # the page: its time span, and the age of the leak; from `report` and from a pipe
    page = tmp_path / "page.html"
    r = run("report", str(d), "-o", str(page))
    assert r.returncode == 0, r.stderr
    span = '<div class="k">Time span</div><div class="v">6 s</div>'
    assert span in page.read_text()
    fin = subprocess.run(MMLEAK + ["shrink", "--final", str(d / ("mmleak.%s.compact" % GONE))],
                         capture_output=True, check=True).stdout
    assert b"\n#clock 6\n" in fin
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak-panda.py"), "-o",
                        str(page)], input=fin, capture_output=True)
    assert (r.returncode, r.stderr) == (0, b"")
    assert span in page.read_text()


def test_the_page_from_a_pipe_says_a_trace_that_lost_events_is_incomplete(tmp_path):
    p = tmp_path / ("mmleak.%s.0.out" % GONE)
    p.write_bytes(hdr(GONE, 0) + LEAKS + b"#dropping k=1\n#lost 7 k=1\n#end\n")
    fin = subprocess.run(MMLEAK + ["shrink", "--final", str(p)], capture_output=True).stdout
    page = tmp_path / "page.html"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak-panda.py"), "-o",
                        str(page)], input=fin, capture_output=True)
    gap = ("INCOMPLETE TRACE: 7 events were not recorded; blocks may show as leaks whose free "
           "was lost")
    assert (r.returncode, r.stderr.decode()) == (3, "mmleak-panda.py: %s\n" % gap)
    assert "<b>%s</b>" % gap in page.read_text()


# ---- item 15: a full disk; a stack defined twice --------------------------------------------

def test_compact_on_a_full_disk_names_the_file_and_keeps_the_inputs(tmp_path):
    needs_root()
    d = tempfile.mkdtemp(prefix="mmleak-full.")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", d]).returncode:
        os.rmdir(d)
        pytest.skip("cannot mount a tmpfs here")
    try:
        body = b"".join(alloc(0x1000 + 16 * i, 0, 0x10) for i in range(2000))
        make_trace(_P(d), GONE, {0: body})
        fd = os.open(os.path.join(d, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        r = run("compact", d)
        assert (r.returncode, r.stderr.splitlines()) == (2, [
            "mmleak.py: trace %s: cannot write %s/mmleak.%s.compact.tmp: No space left on "
            "device" % (GONE, d, GONE)])
        assert sorted(os.listdir(d)) == sorted(["filler", "mmleak.%s.maps" % GONE,
                                                "mmleak.%s.0.out" % GONE,
                                                "mmleak.%s.lock" % GONE])
        os.unlink(os.path.join(d, "filler"))
        r = run("compact", d)
        assert (r.returncode, r.stderr) == (0, "")
        r = run("report", d, "--no-html")
        assert blocks_line(r.stdout) == (0x10 * 2000, 2000)
    finally:
        subprocess.run(["umount", d])
        os.rmdir(d)


def _P(p):
    import pathlib
    return pathlib.Path(p)


@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_stack_defined_twice_with_other_frames_is_a_problem(tmp_path, engine):
    p = tmp_path / ("mmleak.%s.0.out" % GONE)
    p.write_bytes(hdr(GONE, 0) + b"#s 1234 400000 400100\n" + b"%012x 0 10 0 @1234\n" % 0x1000
                  + b"#s 1234 400000 400100\n" + b"#s 1234 400200 400300\n" + b"#end\n")
    r = subprocess.run(MMLEAK + ["shrink", "--final", str(p)], capture_output=True, text=True,
                       env=dict(os.environ, MMLEAK_SHRINK=engine))
    assert r.returncode == 3
    assert r.stderr.splitlines() == [
        "mmleak.py: %s:5: stack 1234 defined again with other frames: ignored (the first "
        "definition is kept)" % p]
    assert "#s 1234 400000 400100\n" in r.stdout and "400200" not in r.stdout


# ---- item 7: a trace written in another pid namespace -----------------------------------------

def free_pid():
    """A pid that no process has now, well below pid_max (so a pid namespace can take it)."""
    with open("/proc/sys/kernel/pid_max") as f:
        top = int(f.read())
    for c in range(top - 1000, top // 2, -1):
        if not os.path.exists("/proc/%d" % c):
            return c
    pytest.skip("no free pid")


@pytest.fixture(scope="module")
def load(tmp_path_factory, lib):
    exe = str(tmp_path_factory.mktemp("load") / "daemon_load")
    subprocess.run(["cc", "-O1", "-g", "-pthread", "-o", exe,
                    os.path.join(TESTS, "daemon_load.c")], check=True)
    return exe


def test_a_trace_in_another_pid_namespace_is_not_folded_while_it_runs(tmp_path, load):
    """`unshare -p --fork`: the traced program's files carry its pid in the new namespace,
    which no process of ours has.  Its staging file is mapped by a process we see: the trace
    is running, so only its complete files are folded; once it ended, everything is, and
    the report finds every leak."""
    needs_root()
    if not shutil.which("unshare"):
        pytest.skip("no unshare")
    d = tmp_path / "d"
    d.mkdir()
    pid = free_pid()
    script = ('echo %d > /proc/sys/kernel/ns_last_pid && LD_PRELOAD=%s MMLEAK_DIR=%s '
              'MMLEAK_ROTATE_MB=1 %s -t 2 -n 40000 -l 100 -p 2; exit $?' % (pid - 1, LIB, d, load))
    p = subprocess.Popen(["unshare", "-p", "--fork", "sh", "-c", script],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"phase 1 leaked 800\n"
        tid = str(pid)
        assert sorted(mmleak.find_traces(str(d))) == [tid]
        tails = sorted(n for n in os.listdir(d) if n.endswith(".tail"))
        assert tails, os.listdir(d)
        live, results = mmleak.compact_dir(str(d), series=False)
        assert live == [tid] and results[0]["over"] is False
        assert sorted(n for n in os.listdir(d) if n.endswith(".tail")) == tails
        for t in tails:
            assert (d / t.replace(".tail", ".out")).exists()
        # recover, which folds the staging files of processes that are gone, leaves them
        r = run("recover", str(d))
        assert (r.returncode, r.stdout) == (0, "nothing to recover\n")
        assert sorted(r.stderr.splitlines()) == sorted(
            "mmleak.py: %s/%s: its staging file is mapped by a running process (in another "
            "pid namespace?): left alone (--force to fold anyway)" % (d, t.replace(".tail", ".out"))
            for t in tails)
        assert sorted(n for n in os.listdir(d) if n.endswith(".tail")) == tails
        out, err = p.communicate(b"\n", timeout=120)
        assert p.returncode == 0 and out == b"phase 2 leaked 1600\nleaked 1600\n", err
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    r = run("compact", str(d))
    assert (r.returncode, r.stderr) == (0, "")
    assert not [n for n in os.listdir(d) if n.endswith((".out", ".tail"))]
    rep = mmleak.build_report(str(d), tid, progress=False)
    line = site_line("daemon_load.c", "load_leak")
    assert sum(1 for a in rep["survivors"] if rep["frames"].get(a.callers[0]) and
               rep["frames"][a.callers[0]].line == line) == 1600
    assert not rep["incomplete"]


def test_a_trace_taken_as_over_with_unclosed_files_is_said(tmp_path):
    """A process gone without closing its file (its newest line only in the staging file):
    the pass folds it, .tail included, and a line of its own says that no process maps it
    (were the process alive where the compactor cannot see, this is where it shows)."""
    d = tmp_path / "d"
    d.mkdir()
    make_trace(d, GONE, {0: alloc(0x1000, 0, 0x10)}, end=False)
    out = d / ("mmleak.%s.0.out" % GONE)
    half = b"#at %016x\n" % out.stat().st_size + alloc(0x2000, 0, 0x20)
    (d / ("mmleak.%s.0.tail" % GONE)).write_bytes(half + b"\0" * (256 - len(half)) +
                                                  b"\0" * 256)
    r = run("compact", str(d))
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.splitlines()[1:] == [
        "mmleak.py: trace %s: its process ended without closing 1 files (no process this "
        "compactor can see maps their staging files)" % GONE]
    assert "; the trace is over" in r.stdout.splitlines()[0]
    assert blocks_line(run("report", str(d), "--no-html").stdout) == (0x30, 2)
