"""The scan at exit of a process whose other threads mmleak-scan may not trace (a daemon that
dropped root with setuid is not dumpable, as memcached -u): mmleak.so parks them with a
signal of its own (tracer/park.c) and scans in the child that shares its memory; the result
says so ("#held signal").  Real processes (tests/scan_park.c, tests/scan_cases.c), exact
kinds of the known blocks."""
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from conftest import LIB, TESTS, run_traced
from test_scan import CASES, mmleak_kinds, scan_bins  # noqa: F401 (a fixture)

NOBODY = 65534


@pytest.fixture(scope="module")
def park_bin(tmp_path_factory):
    d = tmp_path_factory.mktemp("parkbin")
    exe = str(d / "scan_park")
    subprocess.run(["cc", "-O1", "-g", "-o", exe, os.path.join(TESTS, "scan_park.c"),
                    "-pthread"], check=True)
    os.chmod(str(d), 0o755)             # (run as root; nothing else needs it)
    return exe


@pytest.fixture
def open_dir():
    """A dump directory the daemon can still write in after it became nobody (its scanner,
    as nobody, writes the result there), in /tmp (every directory up to it open)."""
    d = tempfile.mkdtemp(prefix="mmleak-park.", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d)


def run_daemon(exe, d, *mode, here=None):
    """Run scan_park as root (it becomes nobody): the trace id of its exit's scan, the
    result's head and the kinds (a Kinds) of that scan."""
    env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=d)
    if here is not None:
        env["MMLEAK_SCAN_HERE"] = here
    r = subprocess.run([exe, str(NOBODY)] + list(mode), env=env, capture_output=True,
                       timeout=120)
    assert (r.returncode, r.stderr) == (0, b""), r.stderr       # 3: still dumpable
    from mmleaklib import scan
    scans = [n for n in os.listdir(d) if ".scan." in n]
    assert len(scans) == 1, sorted(os.listdir(d))
    tid = scans[0].split(".")[1]
    with open(os.path.join(d, scans[0]), "rb") as f:
        head = f.read(2000)
    return tid, head, scan.kinds_for(d, tid)


pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon starts as root and "
                                "drops it (setuid), which makes it not dumpable")


def test_undumpable_daemon_gets_its_verdict(park_bin, open_dir):
    """Two threads left besides the exiting one, one waiting in read() with the only pointer
    to a block of 1111 bytes in its frame, one spinning with the only pointer to a block of
    2222 bytes in r12, and a block of 3333 bytes lost: with mmleak-scan's ptrace refused (not
    dumpable), the threads are parked by mmleak.so's signal and the verdict is exact."""
    tid, head, k = run_daemon(park_bin, open_dir)
    assert k.status == "done", k.reason
    assert b"\n#held signal\n" in head and b"\n#threads 3\n" in head, head
    assert b"\n#roots register 3 448\n" in head, head     # 2 x 216 bytes, the exiting 16
    import mmleaklib as mm
    # (the threads' lines are still in their staging files: the shrink engine reads those)
    sizes = {(a.ptr, a.seq): a.size
             for a in mm.shrink_files(mm.find_traces(open_dir)[tid]).survivors()}
    got = sorted((sizes[key], kind) for key, kind in k.items()
                 if sizes.get(key) in (1111, 2222, 3333))
    assert got == [(1111, "reachable"), (2222, "reachable"), (3333, "definite")]


def test_undumpable_daemon_unknown_through_ptrace(park_bin, open_dir):
    """The same daemon with MMLEAK_SCAN_HERE=0 (always mmleak-scan, which must ptrace):
    the kernel refuses it, no verdict.  (What the test above would be without the signal.)"""
    tid, head, k = run_daemon(park_bin, open_dir, here="0")
    assert k.status == "unknown"
    assert re.match(r"cannot trace thread \d+ of process \d+: Operation not permitted",
                    k.reason), k.reason


def test_thread_blocking_every_signal_leaves_the_verdict_unknown(park_bin, open_dir):
    """A third thread blocks every signal: it cannot be parked; the verdict is unknown and
    says which thread and why, at once (nothing sent, no wait), the exit unharmed."""
    tid, head, k = run_daemon(park_bin, open_dir, "blockall")
    assert k.status == "unknown"
    assert re.fullmatch(r"thread \d+ blocks every real-time signal: the other threads "
                        r"cannot be stopped without ptrace", k.reason), k.reason


THREAD_CASES = ["thread-stack", "thread-register", "unjoined-result", "main-exited",
                "freed-arena"]


@pytest.mark.parametrize("case", THREAD_CASES)
def test_thread_cases_with_the_threads_parked(scan_bins, dump, case):  # noqa: F811
    """MMLEAK_SCAN_HERE=2: every process with more threads is scanned with them parked by
    the signal, even where ptrace would do: the same kinds as with ptrace (CASES)."""
    env = {"SCAN_LIB": scan_bins["libscan.so"], "MMLEAK_SCAN_HERE": "2"}
    assert mmleak_kinds(scan_bins, dump, case, env) == CASES[case]
    if case in ("thread-stack", "thread-register"):
        (res,) = [n for n in os.listdir(str(dump)) if ".scan." in n]
        with open(str(dump / res), "rb") as f:
            assert b"\n#held signal\n#" in f.read(2000)
