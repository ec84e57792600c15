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
    shared = tempfile.mkdtemp(prefix="mmleak-share-", dir="/tmp")
    try:
        os.chmod(shared, 0o1777)
        for n in os.listdir(tmp_path):
            shutil.copy(str(tmp_path / n), shared)
            os.chown(os.path.join(shared, n), NOBODY, NOBODY)
            os.chmod(os.path.join(shared, n), 0o600)
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
