"""The scan at exit of a process whose other threads mmleak-scan may not trace (a daemon that
dropped root with setuid is not dumpable, as memcached -u): mmleak.so parks them with a
signal of its own (tracer/park.c) and scans in the child that shares its memory; the result
says so ("#held signal").  And the scans such a program asks for while it runs
(mmleak_leak_check), after which the threads go on.  Real processes (tests/scan_park.c,
tests/scan_park_api.c, tests/scan_cases.c), exact kinds of the known blocks."""
import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import LIB, ROOT, TESTS, lib_for_others, run_traced
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


@pytest.fixture(scope="module")
def open_lib():
    """mmleak.so and mmleak-scan where nobody can read and run them (the source tree may be
    in a directory only root may enter: CI's clone in a mktemp directory was): the daemon,
    become nobody, starts mmleak-scan from beside its mmleak.so."""
    return lib_for_others()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the daemon starts as root and "
                                "drops it (setuid), which makes it not dumpable")


@pytest.fixture(scope="module")
def api_bin(tmp_path_factory):
    d = tmp_path_factory.mktemp("parkapi")
    exe = str(d / "scan_park_api")
    subprocess.run(["cc", "-O1", "-g", "-I", os.path.join(ROOT, "include"), "-o", exe,
                    os.path.join(TESTS, "scan_park_api.c"), "-pthread"], check=True)
    os.chmod(str(d), 0o755)
    return exe


def run_api(exe, d, lib, uid, *mode, here=None):
    """Run scan_park_api (as root when UID is a uid: it becomes that user; "-": it makes
    itself not dumpable): its output lines sorted (the threads' come in any order), and
    its scans in the order they were made, each (why, status or reason, held, definite,
    reachable), the kinds as (blocks, bytes)."""
    env = dict(os.environ, LD_PRELOAD=lib, MMLEAK_DIR=d)
    if here is not None:
        env["MMLEAK_SCAN_HERE"] = here
    r = subprocess.run([exe, uid] + list(mode), env=env, capture_output=True, timeout=120)
    assert (r.returncode, r.stderr) == (0, b""), r.stderr       # 3: still dumpable
    from mmleaklib import scan
    import mmleaklib as mm
    (tid,) = mm.find_traces(d)
    got = []
    for p in scan.scan_files(d, tid):
        s = scan.read_scan(p)
        got.append(((s.time, int(scan.SCAN_RE.match(os.path.basename(p)).group(1))),
                    (s.why, s.status if s.status == "done" else s.reason, s.held,
                     s.kinds.get("definite"), s.kinds.get("reachable"))))
    return sorted(r.stdout.decode().splitlines()), [v for _, v in sorted(got)]


WORK = ["work register 1 6000", "work register 2 11994", "work stack 1 6000",
        "work stack 2 11994"]
# before the first scan: 3333 bytes lost (main), 1111 held in the stack thread's frame,
# 2222 in the register thread's r12; then the threads lose 444 and 555 bytes, and main's
# stdout has its buffer (4096); at the exit the threads were joined, their blocks freed
FIRST = ("api", "done", "signal", (1, 3333), (2, 3333))
SECOND = ("api", "done", "signal", (3, 4332), (3, 7429))
AT_EXIT = ("exit", "done", "alone", (3, 4332), (1, 4096))


def check_api_runs(lines, scans):
    assert lines == ["check 1 1", "check 2 1"] + WORK
    assert scans == [FIRST, SECOND, AT_EXIT]


def test_leak_check_parks_the_threads_and_lets_them_go(api_bin, dump):
    """A program that made itself not dumpable (prctl), MMLEAK_SCAN_HERE=2 (parked even as
    root, whose ptrace the kernel would allow): two mmleak_leak_check calls, each an exact
    verdict with the threads parked by mmleak.so's signal (the blocks in a frame and in a
    register reachable, the lost ones definite), and after each the threads go on: each
    does its round of work, its errno and signal mask as it left them, its read() restarted
    (no EINTR)."""
    check_api_runs(*run_api(api_bin, str(dump), LIB, "-", here="2"))


@needs_root
def test_leak_check_of_a_daemon_that_dropped_root(api_bin, open_dir, open_lib):
    """The same program dropping root with setuid (not dumpable, its scanner's ptrace
    refused), MMLEAK_SCAN_HERE left alone: mmleak.so sees ptrace refused and parks."""
    check_api_runs(*run_api(api_bin, open_dir, open_lib, str(NOBODY)))


def test_two_threads_ask_at_once(api_bin, dump):
    """Main and the stack thread call mmleak_leak_check at once: the second waits for the
    first (parked by it like any thread) and scans in turn; both exact (two threads each
    blocking every signal while parking the other had no verdict after 5 s each)."""
    lines, scans = run_api(api_bin, str(dump), LIB, "-", "together", here="2")
    assert lines == ["check 1 1", "check 2 1", "thread check 1"] + WORK
    assert scans == [FIRST, SECOND, SECOND, AT_EXIT]


@pytest.mark.parametrize("here,held,said", [
    ("2", "signal", "poll -1 EINTR"),
    pytest.param("0", "ptrace", "poll 1 0", marks=pytest.mark.skipif(
        os.geteuid() != 0, reason="ptrace of a process not dumpable needs CAP_SYS_PTRACE"))])
def test_the_cost_of_parking_a_thread_in_poll(api_bin, dump, here, held, said):
    """The known cost: a third thread waits in poll() (no time limit) during the first scan.
    Parked by the signal, its poll returns -1 EINTR once it goes on (the kernel never
    restarts poll after a handler); stopped by ptrace (as root, MMLEAK_SCAN_HERE=0), the
    call is restarted and returns 1 when main writes to its pipe after the scan."""
    lines, scans = run_api(api_bin, str(dump), LIB, "-", "poll", here=here)
    assert lines == ["check 1 1", "check 2 1", said] + WORK
    assert scans == [FIRST[:2] + (held,) + FIRST[3:], SECOND[:2] + (held,) + SECOND[3:],
                     AT_EXIT]


def test_leak_check_with_a_thread_blocking_every_signal(api_bin, dump):
    """A third thread blocks every signal: no verdict, which says which thread and why
    (nothing sent, no wait), mmleak_leak_check -1, and the threads go on (their work)."""
    lines, scans = run_api(api_bin, str(dump), LIB, "-", "blockall", here="2")
    assert lines == ["check 1 -1"] + WORK
    assert len(scans) == 2 and scans[1] == AT_EXIT[:3] + ((3, 4332), (1, 4096)), scans
    why, reason, held, definite, reachable = scans[0]
    assert (why, held, definite) == ("api", None, None), scans[0]
    assert re.fullmatch(r"thread \d+ blocks every real-time signal: the other threads "
                        r"cannot be stopped without ptrace", reason), reason


def run_daemon(exe, d, lib, *mode, here=None):
    """Run scan_park as root (it becomes nobody) with the mmleak.so LIB: the trace id of its
    exit's scan, the result's head and the kinds (a Kinds) of that scan."""
    env = dict(os.environ, LD_PRELOAD=lib, MMLEAK_DIR=d)
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


@needs_root
def test_undumpable_daemon_gets_its_verdict(park_bin, open_dir, open_lib):
    """Two threads left besides the exiting one, one waiting in read() with the only pointer
    to a block of 1111 bytes in its frame, one spinning with the only pointer to a block of
    2222 bytes in r12, and a block of 3333 bytes lost: with mmleak-scan's ptrace refused (not
    dumpable), the threads are parked by mmleak.so's signal and the verdict is exact."""
    tid, head, k = run_daemon(park_bin, open_dir, open_lib)
    assert k.status == "done", k.reason
    assert (k.scan.held, k.scan.threads) == ("signal", 3), head
    assert b"\n#roots register 3 448\n" in head, head     # 2 x 216 bytes, the exiting 16
    import mmleaklib as mm
    # (the threads' lines are still in their staging files: the shrink engine reads those)
    sizes = {(a.ptr, a.seq): a.size
             for a in mm.shrink_files(mm.find_traces(open_dir)[tid]).survivors()}
    got = sorted((sizes[key], kind) for key, kind in k.items()
                 if sizes.get(key) in (1111, 2222, 3333))
    assert got == [(1111, "reachable"), (2222, "reachable"), (3333, "definite")]


@needs_root
def test_undumpable_daemon_unknown_through_ptrace(park_bin, open_dir, open_lib):
    """The same daemon with MMLEAK_SCAN_HERE=0 (always mmleak-scan, which must ptrace):
    the kernel refuses it, no verdict.  (What the test above would be without the signal.)"""
    tid, head, k = run_daemon(park_bin, open_dir, open_lib, here="0")
    assert k.status == "unknown"
    assert re.match(r"cannot trace thread \d+ of process \d+: Operation not permitted",
                    k.reason), k.reason


@needs_root
def test_thread_blocking_every_signal_leaves_the_verdict_unknown(park_bin, open_dir,
                                                                open_lib):
    """A third thread blocks every signal: it cannot be parked; the verdict is unknown and
    says which thread and why, at once (nothing sent, no wait), the exit unharmed."""
    tid, head, k = run_daemon(park_bin, open_dir, open_lib, "blockall")
    assert k.status == "unknown"
    assert re.fullmatch(r"thread \d+ blocks every real-time signal: the other threads "
                        r"cannot be stopped without ptrace", k.reason), k.reason


@needs_root
def test_thread_being_started_is_parked_once_it_runs(park_bin, open_dir, open_lib):
    """A third thread blocks every signal, glibc's own two (32, 33) too, as a thread that
    pthread_create is starting does until its mask is restored; it restores none blocked
    once mmleak.so has put its handler on (it watches the dispositions: no timing).  Such a
    mask is glibc's for a moment, not the program's: the signal is chosen all the same, waits
    pending, parks the thread once it runs, and the verdict is exact (it was unknown: "blocks
    every real-time signal")."""
    tid, head, k = run_daemon(park_bin, open_dir, open_lib, "starting")
    assert k.status == "done", k.reason
    assert (k.scan.held, k.scan.threads) == ("signal", 4), head
    import mmleaklib as mm
    sizes = {(a.ptr, a.seq): a.size
             for a in mm.shrink_files(mm.find_traces(open_dir)[tid]).survivors()}
    got = sorted((sizes[key], kind) for key, kind in k.items()
                 if sizes.get(key) in (1111, 2222, 3333))
    assert got == [(1111, "reachable"), (2222, "reachable"), (3333, "definite")]


def test_thread_that_never_takes_the_signal_leaves_the_verdict_unknown(park_bin, dump):
    """A third thread waits for its vfork child, which takes no signal but a fatal one, and
    ends only after the process: it never parks.  MMLEAK_SCAN_HERE=2 (no drop of root
    needed): after the bounded wait (5 s, the time a ptrace stop is given), the verdict is
    unknown and says which thread and why; no hang, the exit unharmed."""
    r = run_traced([park_bin, "-", "vfork"], dump, env={"MMLEAK_SCAN_HERE": "2"})
    assert r.stderr == b""
    from mmleaklib import scan
    import mmleaklib as mm
    (tid,) = mm.find_traces(str(dump))
    k = scan.kinds_for(str(dump), tid)
    assert k.status == "unknown"
    assert re.fullmatch(r"thread \d+ did not stop within 5 s for the signal sent \(it blocks "
                        r"it, or waits uninterruptibly\): the other threads cannot be "
                        r"stopped without ptrace", k.reason), k.reason


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


HELD_C = r"""#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static int ready[2], never[2];
static void *run(void *a) {
  void *volatile local = malloc(4321);
  char c;
  (void)!write(ready[1], "x", 1);
  (void)!read(never[0], &c, 1);      /* never returns: nothing is written there */
  return local;
}
int main(void) {
  char line[8];
  pthread_t t;
  if (pipe(ready) || pipe(never) || pthread_create(&t, NULL, run, NULL) ||
      read(ready[0], line, 1) != 1)
    return 2;
  void *volatile lost = malloc(4321);
  lost = NULL;
  puts("ready");
  fflush(stdout);
  if (!fgets(line, sizeof line, stdin)) return 1;
  return 0;
}
"""


def run_held(dump, which):
    """HELD_C with one of its threads held by a debugger (the test: PTRACE_SEIZE, each stop
    continued with its signal): the main one (WHICH "main", the one that exits) or the
    other ("thread").  The Kinds of its scan at exit and the kinds of its 4321-byte blocks."""
    src = dump / "held.c"
    src.write_text(HELD_C)
    exe = str(dump / "held")
    subprocess.run(["cc", "-O1", "-o", exe, str(src), "-pthread"], check=True)
    e = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump))
    p = subprocess.Popen([exe], env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    PTRACE_SEIZE, PTRACE_CONT = 0x4206, 7
    try:
        assert p.stdout.readline() == b"ready\n"
        tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % p.pid))
        assert len(tids) == 2 and tids[0] == p.pid, tids
        tid = p.pid if which == "main" else tids[1]
        assert libc.ptrace(PTRACE_SEIZE, tid, None, None) == 0, ctypes.get_errno()
        p.stdin.write(b"go\n")
        p.stdin.close()
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                _, st = os.waitpid(tid, 0x40000000)         # __WALL
            except ChildProcessError:
                break                   # (a thread reaped with its process)
            if os.WIFEXITED(st) or os.WIFSIGNALED(st):
                break
            sig = os.WSTOPSIG(st) if (st >> 16) == 0 else 0
            libc.ptrace(PTRACE_CONT, tid, None, ctypes.c_void_p(sig))
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
    import mmleaklib as mm
    from mmleaklib import scan
    (trace,) = mm.find_traces(str(dump))
    k = scan.kinds_for(str(dump), trace)
    sizes = {(a.ptr, a.seq): a.size
             for a in mm.shrink_files(mm.find_traces(str(dump))[trace]).survivors()}
    return k, sorted(kind for key, kind in k.items() if sizes.get(key) == 4321)


@pytest.mark.parametrize("which", ["main", "thread"])
def test_threads_of_a_process_a_debugger_holds(dump, which):
    """A debugger holds one thread of a process with two: mmleak-scan could not stop it
    ("another tracer").  The exiting one held (main): mmleak.so sees its TracerPid and
    parks the other thread at once; the other held (thread): mmleak-scan, refused, writes
    nothing and exits with 5, and mmleak.so parks it then (the debugger sees the signal
    and passes it on).  Either way the verdicts are exact: the block in the thread's frame
    still reachable, the other lost."""
    k, kinds = run_held(dump, which)
    assert k.status == "done", k.reason
    assert (k.scan.held, k.scan.threads) == ("signal", 2)
    assert kinds == ["definite", "reachable"]
