"""Another user in a shared directory (round 3 of the red team): a spreadsheet opening
report's --csv never evaluates a name from the trace; root's `recover` of another user's
trace appends with that user's rights; a reader waits a bounded time for a trace's lock.
See mmleak-limits(7), "Hostile users".

Run: /usr/bin/python3 -m pytest tests/test_shared_tmp.py
"""
import csv
import fcntl
import io
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import ROOT, mmleak, run_traced

MMLEAK_PY = [sys.executable, os.path.join(ROOT, "mmleak.py")]
NOBODY = 65534


def run(*args):
    r = subprocess.run(MMLEAK_PY + [str(a) for a in args], capture_output=True, text=True,
                       timeout=120)
    assert "Traceback" not in r.stderr
    return r


def nobodys_copy(src, mode=0o1777, maps_gid=NOBODY):
    """A directory under /tmp of MODE holding nobody's copies (0600) of the trace files in
    SRC (the .maps file's group MAPS_GID); the caller removes it."""
    shared = tempfile.mkdtemp(prefix="mmleak-share-", dir="/tmp")
    os.chmod(shared, mode)
    for n in os.listdir(str(src)):
        shutil.copy(str(os.path.join(str(src), n)), shared)
        os.chown(os.path.join(shared, n), NOBODY, maps_gid if n.endswith(".maps") else NOBODY)
        os.chmod(os.path.join(shared, n), 0o600)
    return shared


def test_csv_cells_never_start_a_formula(tmp_path):
    # The module column is the maps file's path (whoever wrote it chose it), the function
    # and file columns the object's symbols and debug information: a text cell starting
    # with = + - @ TAB or CR gets a quote in front (OWASP); numbers stay numbers.
    names = ["=1+1", "+1", "-2", "@SUM(A1)", "\tx", "\rx", "plain"]
    (tmp_path / "mmleak.90.0.out").write_bytes(
        b"#mmleak 2 id=90 pid=90 tid=90 file=0 depth=1 start=1700000000\n#cmd ./x\n" +
        b"".join(b"%x 0 %x 0 %x\n" % (0x1000 + i, 16 * (i + 1), 0x400010 + 0x10000 * i)
                 for i in range(len(names))) + b"#end\n")
    (tmp_path / "mmleak.90.maps").write_bytes(b"".join(
        b"%x-%x r-xp 00000000 fe:00 0    /nonexistent/%s\n"
        % (0x400000 + 0x10000 * i, 0x401000 + 0x10000 * i, n.encode())
        for i, n in enumerate(names)))
    r = run("report", tmp_path, "--no-html", "--csv", tmp_path / "sites.csv")
    assert r.returncode == 0, r.stderr
    with open(str(tmp_path / "sites.csv"), newline="") as f:
        text = f.read()
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0][10] == "module"
    got = sorted((row[0], row[10]) for row in rows[1:])
    assert got == sorted((str(16 * (i + 1)), ("'" if n != "plain" else "") + n)
                         for i, n in enumerate(names))
    for line in text.split("\r\n")[1:-1]:
        assert line.split(",")[0].isdigit(), line       # a number, not quoted


@pytest.mark.skipif(os.geteuid() != 0, reason="root recovers another user's trace")
def test_root_recovers_another_users_trace_with_that_users_rights(bins, tmp_path):
    # A trace of nobody's in a sticky directory, its process killed: root's recover appends
    # to nobody's dump file as nobody (quota, reserved blocks, permissions are nobody's):
    # a dump file nobody cannot write is not written (root could), one line, status 2;
    # a writable one is recovered and stays nobody's.
    run_traced([bins["hostile"], "kill"], tmp_path, check=False)
    shared = nobodys_copy(tmp_path)
    try:
        (out,) = [os.path.join(shared, n) for n in os.listdir(shared) if n.endswith(".out")]
        tail = out[:-4] + ".tail"
        before = open(out, "rb").read()
        want = mmleak.unflushed_tail(out)
        want = want[:want.rfind(b"\n") + 1]
        assert want.count(b"\n") > 10
        os.chmod(out, 0o400)
        r = run("recover", shared)
        assert (r.returncode, r.stdout, r.stderr) == (
            2, "nothing to recover\n",
            "mmleak.py: %s: cannot recover: Permission denied (done as the file's owner, "
            "uid %d)\n" % (out, NOBODY))
        assert open(out, "rb").read() == before and os.path.exists(tail)
        os.chmod(out, 0o600)
        r = run("recover", shared)
        assert (r.returncode, r.stderr) == (0, "")
        assert r.stdout == "%s: %d bytes recovered from %s\n" % (out, len(want),
                                                                 os.path.basename(tail))
        st = os.lstat(out)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (NOBODY, NOBODY, 0o600)
        assert open(out, "rb").read() == before + want and not os.path.exists(tail)
    finally:
        shutil.rmtree(shared)


def test_a_reader_waits_for_a_held_lock_as_long_as_asked(tmp_path):
    # The trace's owner holds its lock as long as it likes: report and snapshot say who
    # holds it at once, give up after --lock-wait seconds with one more line, status 2.
    (tmp_path / "mmleak.81.0.out").write_bytes(
        b"#mmleak 2 id=81 pid=81 tid=81 file=0 depth=1 start=1700000000\n#cmd ./x\n"
        b"1000 0 64 0 400010\n#end\n")
    (tmp_path / "mmleak.81.maps").write_bytes(b"")
    lock = tmp_path / "mmleak.81.lock"
    fd = os.open(str(lock), os.O_RDWR | os.O_CREAT, 0o600)
    holder = "pid %d (%s)" % (os.getpid(), open("/proc/self/comm").read().strip())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for cmd in (["report", tmp_path, "--no-html"], ["snapshot", tmp_path, "-o", "/dev/null"]):
            r = run(*cmd + ["--lock-wait", "0.3"])
            assert (r.returncode, r.stdout, r.stderr) == (
                2, "",
                "mmleak.py: trace 81: waiting for its lock %s, held by %s\n"
                "mmleak.py: trace 81: its lock %s still held by %s after 0.3 s: gave up "
                "(--lock-wait SECONDS to wait longer, 0 for ever)\n"
                % (lock, holder, lock, holder)), cmd
        # a compactor skips the trace, as it always did
        r = run("compact", tmp_path)
        assert r.returncode == 0 and os.path.exists(str(tmp_path / "mmleak.81.0.out")), r.stderr
    finally:
        os.close(fd)
    r = run("report", tmp_path, "--no-html", "--lock-wait", "0.3")
    assert r.returncode == 0 and "100 B in 1 blocks not freed" in r.stdout, r.stderr


FAKE = (b"#mmleak 2 id=%d pid=%d tid=%d file=0 depth=1 start=1700000000\n#cmd ./x\n"
        b"1000 0 1000000 0 400010\n#end\n")


def plant_trace(d, tid, uid, when=2e9):
    """A trace TID of uid UID's in D, one block of 16 MiB, its files dated WHEN."""
    for name, data in (("mmleak.%d.0.out" % tid, FAKE % (tid, tid, tid)),
                       ("mmleak.%d.maps" % tid, b"")):
        p = os.path.join(d, name)
        with open(p, "wb") as f:
            f.write(data)
        os.chown(p, uid, uid)
        os.utime(p, (when, when))


def shared_with_trace_82(tmp_path):
    """A directory anybody can write (as /tmp) holding your trace 82 (40 bytes not freed)."""
    d = tmp_path / "share"
    d.mkdir()
    os.chmod(str(d), 0o1777)
    (d / "mmleak.82.0.out").write_bytes(FAKE.replace(b"1000000", b"40") % (82, 82, 82))
    (d / "mmleak.82.maps").write_bytes(b"")
    return d


@pytest.mark.skipif(os.geteuid() != 0, reason="plants another user's trace")
def test_report_takes_your_newest_trace_not_anothers_newer_one(tmp_path):
    # Anybody can put a trace in /tmp and date it after yours: report (and snapshot) with
    # neither --pid nor --trace take the newest of the user's own, and say so
    d = shared_with_trace_82(tmp_path)
    plant_trace(str(d), 99997, NOBODY)
    r = run("report", d, "--no-html")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ("mmleak.py: 2 traces in %s (82 99997); reporting the newest of yours, 82 "
                        "(choose with --pid or --trace)\n" % d)
    assert "mmleak: trace 82 " in r.stdout and "64 B in 1 blocks not freed" in r.stdout
    os.unlink(str(d / "mmleak.82.0.out"))
    os.unlink(str(d / "mmleak.82.maps"))
    plant_trace(str(d), 99996, NOBODY, 2e9 + 10)
    r = run("report", d, "--no-html")
    assert r.stderr == ("mmleak.py: 2 traces in %s (99996 99997); reporting the newest, 99996, "
                        "uid %d's (nobody) (choose with --pid or --trace)\n" % (d, NOBODY))


@pytest.mark.skipif(os.geteuid() != 0, reason="plants another user's trace")
def test_run_check_leaves_out_another_users_trace_made_meanwhile(tmp_path):
    # root's `run --check -d /tmp`: a trace another user makes there during the run is not
    # the run's (one line), not compacted by it, and does not fail its check
    d = tmp_path / "share"
    d.mkdir()
    os.chmod(str(d), 0o1777)
    plant = ("import os, sys; sys.path.insert(0, %r); from test_shared_tmp import plant_trace; "
             "plant_trace(%r, 99995, %d)" % (os.path.dirname(__file__), str(d), NOBODY))
    r = run("run", "-d", d, "--check", "--", sys.executable, "-c", plant)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(
        "mmleak.py: traces of other users appeared in %s during the run (anybody can write "
        "there): 99995, uid %d's (nobody): not this run's, left out (report one with --trace "
        "ID)\n" % (d, NOBODY)), r.stderr
    assert "check passed" in r.stdout + r.stderr and "99995" not in r.stdout
    assert sorted(n for n in os.listdir(str(d)) if "99995" in n) == ["mmleak.99995.0.out",
                                                                     "mmleak.99995.maps"]


@pytest.mark.skipif(os.geteuid() != 0, reason="maps another user's file as root")
def test_the_level_picker_maps_only_files_of_root_or_the_user_running_it(lib, tmp_path):
    # tools/levels.c maps a trace's result and runs: their owner can truncate one while it
    # is read, and the reader dies of SIGBUS (seen: root's picker killed in 3 runs of 3 with
    # a 75 MB run truncated 0.4 s in).  Root maps its own files only; another user's file
    # is EPERM, and the compactor reads that trace with read(2) (series.level_sums).
    import ctypes
    fn = ctypes.CDLL(os.path.join(ROOT, "mmleak-tools.so"), use_errno=True).mmleak_levels_pick
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.c_int64, ctypes.c_int]
    fn.restype = ctypes.c_int64
    hdr = b"#mmleak 2 id=5 pid=5 tid=5 file=0 depth=1 start=1700000000\n"
    big, small = tmp_path / "mmleak.5.compact", tmp_path / "mmleak.5.0.out"
    big.write_bytes(hdr + b"1000 0 10 0 400010\n2000 0 10 0 400010\n")
    small.write_bytes(hdr + b"2000 1 400020\n")
    runs = (ctypes.c_char_p * 1)(bytes(small))
    none = (ctypes.c_uint64 * 1)(0)
    with open(os.devnull, "wb") as out:
        assert fn(bytes(big), runs, 1, none, 0, out.fileno()) == 1
        for f in (big, small):
            os.chown(str(f), NOBODY, NOBODY)
            ctypes.set_errno(0)
            assert fn(bytes(big), runs, 1, none, 0, out.fileno()) == -1
            assert ctypes.get_errno() == 1     # EPERM
            os.chown(str(f), 0, 0)


def test_a_lying_scan_result_is_one_line_not_a_memory_bomb(tmp_path):
    # The scan result is the trace's owner's: its section lengths, block count and kind runs
    # are checked against the bytes there before anything is allocated for them (they made
    # root's report die of MemoryError, or of OverflowError, with a traceback)
    import struct
    (tmp_path / "mmleak.301.0.out").write_bytes(
        b"#mmleak 2 id=301 pid=301 tid=301 file=0 depth=1 start=1700000000\n#cmd ./x\n"
        b"1000 0 10 0 400010\n#end\n")
    (tmp_path / "mmleak.301.maps").write_bytes(b"")
    hdr = (b"#mmleak-scan 1 id=%s pid=301\n#when exit time=1700000001 by=mmleak-scan\n"
           b"#status done\n#attached 0\n#blocks %d\n#data\n")

    def sec(data, n=None):
        return struct.pack("<Q", len(data) if n is None else n) + data
    addr, seq, runs = b"\x80\x20", b"\x00", b"\x00\x01"    # 0x1000, seq 0, one "definite"
    path = tmp_path / "mmleak.301.scan.1"
    for data, said in (
            (hdr % (b"301", 1) + sec(addr) + sec(seq) + sec(runs), None),
            (hdr % (b"\xff", 1) + sec(addr) + sec(seq) + sec(runs), None),
            (hdr % (b"301", 1) + sec(addr, 1 << 62), "the scan's data is cut short"),
            (hdr % (b"301", 1 << 40) + sec(addr) + sec(seq) + sec(runs),
             "the scan's data is damaged (1099511627776 blocks in 2 and 1 bytes)"),
            (hdr % (b"301", 1) + sec(addr) + sec(seq) + sec(b"\x00" + b"\xff" * 9 + b"\x7f"),
             "the scan's data is damaged (a number over 64 bits)"),
            (hdr % (b"301", 1) + sec(addr) + sec(seq) + sec(b"\x00\xff\xff\xff\xff\x0f"),
             "the scan's kinds cover 4294967295 blocks, not 1")):
        path.write_bytes(data)
        r = run("report", tmp_path, "--no-html")
        if said is None:
            assert (r.returncode, r.stderr) == (0, ""), r.stderr
            assert "definitely lost:       16 bytes in 1 blocks" in r.stdout, r.stdout
        else:
            assert (r.returncode, r.stderr) == (2, "mmleak.py: %s: %s\n" % (path, said))


@pytest.mark.skipif(os.geteuid() != 0, reason="root compacts another user's trace")
def test_root_compacts_another_users_trace_into_that_users_files(bins, tmp_path):
    # Root's `compact` of nobody's trace (a sticky directory, its process killed): every
    # file it leaves (result, series, lock) is nobody's, mode 0600, none of root's
    # (files.replace and TraceLock give them to the trace's owner); nothing is left over.
    run_traced([bins["hostile"], "kill"], tmp_path, check=False)
    shared = nobodys_copy(tmp_path)
    try:
        r = run("compact", shared)
        assert r.returncode == 0 and "the trace is over" in r.stdout, r.stderr
        names = sorted(os.listdir(shared))
        # (no .loads: traced in a directory of root's own, it was never made)
        assert [n.split(".", 2)[2] for n in names] == [
            "compact", "lock", "maps", "series"], names
        for n in names:
            st = os.lstat(os.path.join(shared, n))
            assert (n, st.st_uid, st.st_gid, st.st_mode & 0o777) == (n, NOBODY, NOBODY, 0o600)
    finally:
        shutil.rmtree(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="root compacts another user's trace")
def test_root_compacts_another_users_trace_with_that_users_rights(bins, tmp_path):
    # Root's `compact` of nobody's trace, in a sticky directory, writes and deletes as nobody
    # (permissions, quota, reserved blocks, groups are nobody's, as recover's): what it makes
    # has nobody's own group, as what nobody's process makes (root's pass gave it the
    # maps file's, here root's group). Run from a directory nobody cannot search (the pass
    # as nobody uses absolute paths). In a directory nobody cannot write (a daemon's files
    # handed over in root's directory), root folds it, as before.
    src = tmp_path / "src"
    src.mkdir()
    run_traced([bins["hostile"], "kill"], src, check=False)
    here = tmp_path / "private"
    here.mkdir(mode=0o700)
    for mode, gid in ((0o1777, NOBODY), (0o755, 0)):
        shared = nobodys_copy(src, mode, maps_gid=0)
        try:
            r = subprocess.run(MMLEAK_PY + ["compact", os.path.relpath(shared, str(here))],
                               capture_output=True, text=True, timeout=120, cwd=str(here))
            assert r.returncode == 0 and "the trace is over" in r.stdout, r.stderr
            names = sorted(os.listdir(shared))
            assert [n.split(".", 2)[2] for n in names] == [
                "compact", "lock", "maps", "series"], names
            for n in names:
                st = os.lstat(os.path.join(shared, n))
                # (the lock is mmleak.so's, copied: made with the trace)
                assert (n, st.st_uid, st.st_gid if n.endswith(("compact", "series"))
                        else "-", st.st_mode & 0o777) == \
                    (n, NOBODY, gid if n.endswith(("compact", "series")) else "-",
                     0o600), mode
        finally:
            shutil.rmtree(shared)


@pytest.mark.skipif(os.geteuid() != 0, reason="plants another user's files")
def test_files_planted_at_other_traces_names_do_not_fail_your_report(tmp_path):
    # Another user's links and FIFOs at other traces' names in /tmp were said by every
    # report there (a line each), and made root's report of its own trace exit 2: now only
    # the reported trace's are said (and still make it 2); compact DIR, over all, says all
    d = shared_with_trace_82(tmp_path)
    os.symlink("/etc/passwd", str(d / "mmleak.99993.0.out"))
    os.mkfifo(str(d / "mmleak.99992.0.out"))
    for n in ("mmleak.99993.0.out", "mmleak.99992.0.out"):
        os.lchown(str(d / n), NOBODY, NOBODY)
    for args in (["--trace", "82"], ["--pid", "82"], []):
        r = run("report", d, "--no-html", *args)
        assert (r.returncode, r.stderr) == (0, ""), args
        assert "64 B in 1 blocks not freed" in r.stdout
    r = run("report", d, "--no-html", "--trace", "99993")
    assert r.returncode == 2 and r.stderr.startswith(
        "mmleak.py: %s/mmleak.99993.0.out: a symbolic link, not a regular file: ignored\n" % d)
    r = run("compact", d)
    assert r.stderr.count("not a regular file: ignored") == 2, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="plants another user's file")
def test_a_lock_planted_at_the_next_pids_name_does_not_take_the_trace(tmp_path):
    # Another user's file at mmleak.PID.lock (planted for the next pids in /tmp) made every
    # compactor, reader and the scan at the exit refuse root's trace PID: never folded,
    # scanned or reported.  mmleak.so makes the lock with the trace's id, as the .maps and
    # .loads: a planted one takes the id, and the trace is PID-1, whole.
    d = tmp_path / "share"
    d.mkdir()
    os.chmod(str(d), 0o1777)
    env = dict(os.environ, LD_PRELOAD=os.path.join(ROOT, "mmleak.so"), MMLEAK_DIR=str(d))
    p = subprocess.Popen([sys.executable, "-c", "import os, sys; sys.stdin.readline(); "
                          "os.execve('/bin/ls', ['ls', '/'], %r)" % env],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    lock = d / ("mmleak.%d.lock" % p.pid)
    lock.write_bytes(b"x")
    os.chown(str(lock), NOBODY, NOBODY)
    p.communicate(b"\n", timeout=60)
    tid = "%d-1" % p.pid
    mine = sorted(n for n in os.listdir(str(d)) if n != lock.name)
    assert [n.split(".", 2)[2] for n in mine] == ["0.out", "lock", "maps", "scan.1"], mine
    assert all(n.startswith("mmleak.%s." % tid) for n in mine), mine
    st = os.lstat(str(d / ("mmleak.%s.lock" % tid)))
    assert (st.st_uid, st.st_size, st.st_mode & 0o777) == (0, 0, 0o600)
    r = run("report", d, "--no-html", "--pid", str(p.pid))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert "reachability unknown" not in r.stdout and "not freed" in r.stdout
    r = run("compact", d)
    assert r.returncode == 0 and "the trace is over" in r.stdout, r.stderr
    # marked by the pass's first change: a scan then lists the files (tools/scan_cut.c)
    assert (d / ("mmleak.%s.lock" % tid)).read_bytes() == b"c"


@pytest.mark.skipif(os.geteuid() != 0, reason="plants another user's files")
@pytest.mark.parametrize("how", ["here", "mmleak-scan", "no-scanner"])
def test_scan_names_planted_for_the_pid_do_not_cost_the_exit_its_result(tmp_path, how):
    # Another user's files at mmleak.PID.scan.1 .. .99999 (the names the scan at the exit
    # tried, one link() each) cost the exit 0.55 s and its result: now 1..64 are tried, then
    # names nobody can guess (from 65536 on), and the report reads that result as the
    # trace's.  By the scan in the process (here), by mmleak-scan, and by mmleak.so's note
    # that it found no mmleak-scan (a copy of mmleak.so alone).
    d = tmp_path / "share"
    d.mkdir()
    os.chmod(str(d), 0o1777)
    lib = os.path.join(ROOT, "mmleak.so")
    if how == "no-scanner":
        lib = str(tmp_path / "mmleak.so")
        shutil.copy(os.path.join(ROOT, "mmleak.so"), lib)
    env = dict(os.environ, LD_PRELOAD=lib, MMLEAK_DIR=str(d),
               MMLEAK_SCAN_HERE="1" if how == "here" else "0")
    p = subprocess.Popen([sys.executable, "-c", "import os, sys; sys.stdin.readline(); "
                          "os.execve('/bin/ls', ['ls', '/'], %r)" % env],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    planted = ["mmleak.%d.scan.%d" % (p.pid, k) for k in range(1, 65)]
    for n in planted:
        fd = os.open(str(d / n), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchown(fd, NOBODY, NOBODY)
        os.close(fd)
    p.communicate(b"\n", timeout=60)
    scans = [n for n in os.listdir(str(d)) if ".scan." in n and n not in planted]
    assert len(scans) == 1, sorted(os.listdir(str(d)))
    assert int(scans[0].split(".")[-1]) >= 65536, scans
    st = os.lstat(str(d / scans[0]))
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    assert all(os.lstat(str(d / n)).st_uid == NOBODY and not os.lstat(str(d / n)).st_size
               for n in planted)
    from mmleaklib import scan
    s = scan.newest_scan(str(d), str(p.pid))
    assert s is not None and s.path == str(d / scans[0])
    assert s.status == ("unknown" if how == "no-scanner" else "done"), s.reason
    r = run("report", d, "--no-html", "--pid", str(p.pid))
    assert r.returncode == 0 and "not freed" in r.stdout, r.stderr
    assert ("mmleak-scan not found" in r.stdout) == (how == "no-scanner"), r.stdout


REUSED_PID = r"""
import os, subprocess, sys, time
lib, mmleak_py, d = sys.argv[1:]
p = subprocess.Popen(["/bin/sleep", "60"], env=dict(os.environ, LD_PRELOAD=lib, MMLEAK_DIR=d))
deadline = time.monotonic() + 60           # (never a spin for ever: a tracer that wrote none)
while not any(n.endswith(".tail") for n in os.listdir(d)):
    if time.monotonic() > deadline or p.poll() is not None:
        p.kill()
        sys.exit("no staging file made in %s" % d)
    time.sleep(0.001)
# the trace's process and the next one are told apart by their start in clock ticks after
# boot (pstart=): wait until the clock is two ticks past the first one's start, so that the
# second starts in another tick however fast this machine is (on a fast one both started in
# the same 10 ms and the second passed for the trace's)
tck = os.sysconf("SC_CLK_TCK")
with open("/proc/%d/stat" % p.pid) as f:
    pstart = int(f.read().rsplit(")", 1)[1].split()[19])
while time.clock_gettime_ns(time.CLOCK_BOOTTIME) * tck // 10**9 < pstart + 2:
    time.sleep(0.001)
p.kill()                                                  # its staging file left
p.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:      # the next process gets its pid
    f.write(str(p.pid - 1))
q = subprocess.Popen([sys.executable, "-c", "import mmap, sys\n"
                      "f = open(sys.argv[1], 'w+b'); f.truncate(4096)\n"
                      "m = mmap.mmap(f.fileno(), 4096); sys.stdin.read()",
                      "%s/mmleak.%d.9.tail" % (d, p.pid)], stdin=subprocess.PIPE, user=65534)
r = [subprocess.run([sys.executable, mmleak_py, c, d], capture_output=True, text=True)
     for c in ("recover", "compact")]
q.stdin.close()
q.wait()
print(p.pid, q.pid)
print("".join(x.stdout + x.stderr for x in r))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a pid namespace of its own")
def test_a_process_given_the_pid_of_a_trace_that_ended_does_not_keep_it_running(tmp_path):
    # Another user's process given the pid of a trace that ended (pids are reused), which
    # maps a file of its own at a staging file's name, kept the trace "running" for every
    # compactor and reader while it lived (it started within 2 s of the trace, or maps that
    # name): the trace was never over, no last point; `recover` left its staging file.  Now the process's start in clock
    # ticks after boot, which mmleak.so writes in the header (pstart=) and the kernel keeps,
    # must be the trace's.  In a pid namespace of the test's own, whose next pid it sets.
    d = tmp_path / "share"
    d.mkdir()
    os.chmod(str(d), 0o1777)
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                        REUSED_PID, os.path.join(ROOT, "mmleak.so"),
                        os.path.join(ROOT, "mmleak.py"), str(d)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first, out = r.stdout.split("\n", 1)
    pid, other = first.split()
    assert pid == other, r.stdout               # the pid was given again
    assert "%s/mmleak.%s.0.out: " % (d, pid) in out and "bytes recovered" in out, out
    assert "trace %s: folded 1 files" % pid in out and "the trace is over" in out, out
