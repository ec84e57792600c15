"""mmleak.so in hostile processes: every case runs a real program under LD_PRELOAD and checks
the exact leaks (function, file:line, size, count) found in its dump files."""
import collections
import os
import re
import signal
import stat
import subprocess
import sys

import pytest

from conftest import LIB, ROOT, expect, leaks, run_traced, site_line

BEFORE_END = [("early", "ctor", 1001, 1), ("leak_before_end", "before_end", 700, 5)]


def basic_expected():
    return expect("hostile.c", [
        ("early", "ctor", 1001, 1),
        ("entry_points", "malloc", 101, 1),
        ("entry_points", "calloc", 102, 1),
        ("entry_points", "realloc", 103, 1),
        ("entry_points", "reallocarray", 104, 1),
        ("entry_points", "posix_memalign", 105, 1),
        ("entry_points", "aligned_alloc", 128, 1),
        ("entry_points", "memalign", 107, 1),
        ("entry_points", "valloc", 108, 1),
        ("entry_points", "pvalloc", 109, 1),
        ("entry_points", "strdup", 11, 1),
        ("entry_points", "strndup", 13, 1),
        ("realloc_chain", "chain", 2016, 1),
    ])


def the_trace(dump, pid=None):
    traces = {k: v for k, v in __import__("conftest").mmleak.find_traces(str(dump)).items() if v}
    if pid is not None:
        return str(pid)
    assert len(traces) == 1, traces
    return next(iter(traces))


def test_every_c_entry_point(bins, dump):
    r = run_traced([bins["hostile"], "basic"], dump)
    assert r.stderr == b""
    got, sh = leaks(dump, the_trace(dump), "hostile")
    assert got == basic_expected()
    # nothing of mmleak's own (the dlsym bootstrap, its bookkeeping) is ever recorded
    assert sh.foreign_frees() == []


def test_files_and_permissions(bins, dump):
    run_traced([bins["hostile"], "basic"], dump)
    names = sorted(os.listdir(dump))
    tid = the_trace(dump)
    # the scan at exit's result (mmleak-scan(7)); no .lock nor .loads: the directory is ours
    # (in /tmp they are made with the trace: test_dumpdir_tracer.py)
    assert names == ["mmleak.%s.0.out" % tid, "mmleak.%s.maps" % tid,
                     "mmleak.%s.scan.1" % tid]
    for n in names:
        st = os.lstat(dump / n)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    text = (dump / names[0]).read_bytes()
    assert text.startswith(b"#mmleak 2 id=%s pid=%s " % (tid.encode(), tid.encode()))
    assert b" depth=64 " in text.split(b"\n")[0]             # the default: MMLEAK_DEPTH unset
    assert text.endswith(b"#end\n") and b"\0" not in text   # clean exit: complete
    maps = (dump / names[1]).read_text()
    assert bins["hostile"] in maps and "/libc.so.6" in maps


def test_errno_preserved(bins, dump):
    # hostile.c checks errno across the first malloc (which creates the files) and free
    r = run_traced([bins["hostile"], "basic"], dump, check=False)
    assert r.returncode == 0, r.stdout


def test_cxx_operators_and_static_init(bins, dump):
    run_traced([bins["hostile_cxx"]], dump)
    got, sh = leaks(dump, the_trace(dump), "hostile_cxx")
    src = "hostile_cxx.cpp"
    want = collections.Counter({
        ("forms", src, site_line(src, "new"), 40): 1,
        ("forms", src, site_line(src, "new_array"), 301): 1,
        ("forms", src, site_line(src, "new_nothrow"), 302): 1,
        ("forms", src, site_line(src, "new_aligned"), 128): 1,
        ("forms", src, site_line(src, "new_aligned_nothrow"), 256): 1,
        ("forms", src, site_line(src, "template"), 120): 1,
    })
    static = {k: v for k, v in got.items() if k[2] == site_line(src, "static_init")}
    assert list(static.values()) == [1] and list(static)[0][3] == 32   # the std::string
    assert {k: v for k, v in got.items() if k[0] == "forms"} == want
    assert sh.foreign_frees() == []


def test_threads_joined_detached_exited(bins, dump):
    run_traced([bins["hostile"], "threads"], dump)
    got, sh = leaks(dump, the_trace(dump), "hostile")
    want = expect("hostile.c", [("early", "ctor", 1001, 1)] +
                  [("thread_body", "thread", 300 + i, 1) for i in range(4)])
    assert got == want
    # every thread's file (some reused by a later thread) is complete, nothing left staged
    files = __import__("conftest").mmleak.find_traces(str(dump))[the_trace(dump)]
    assert len(files) >= 2
    for f in files:
        assert open(f, "rb").read().endswith(b"#end\n"), f
    assert not [n for n in os.listdir(dump) if n.endswith(".tail")]
    assert sh.foreign_frees() == []


@pytest.mark.parametrize("nthreads", [2, 4])
def test_cross_thread_frees_exact(bins, dump, nthreads):
    """Threads free each other's blocks through a shared table; addresses are reused
    hundreds of thousands of times.  Exactly the 7 blocks the program kept survive."""
    r = run_traced([bins["hostile"], "churn", str(nthreads)], dump)
    got, sh = leaks(dump, the_trace(dump), "hostile")
    assert got[("early", "hostile.c", site_line("hostile.c", "ctor"), 1001)] == 1
    churn = {k: v for k, v in got.items() if k[0] == "churn_body"}
    assert sum(churn.values()) == 7, churn
    assert sh.allocs >= nthreads * 200000
    assert sh.foreign_frees() == []


@pytest.mark.parametrize("how,sig", [("return", 0), ("exit", 0), ("_exit", 0),
                                     ("abort", signal.SIGABRT), ("segv", signal.SIGSEGV),
                                     ("kill", signal.SIGKILL)])
def test_every_end_keeps_every_event(bins, dump, how, sig):
    r = run_traced([bins["hostile"], how], dump, check=False)
    assert r.returncode == (-sig if sig else 0)
    got, sh = leaks(dump, the_trace(dump), "hostile")
    assert got == expect("hostile.c", BEFORE_END)
    # 100000 malloc/free pairs, all cancelled: every event before the end is there
    assert sh.allocs >= 100000 + 6 and sh.frees >= 100000
    tails = [n for n in os.listdir(dump) if n.endswith(".tail")]
    if how in ("return", "exit", "_exit"):   # the thread's file was closed properly
        # (and each of the three leaves the reachability scan, mmleak-scan(7), _exit too)
        # (.out, .maps, a scan's result; no .lock in a directory of one's own)
        assert tails == [] and len(os.listdir(dump)) == 3


def test_killed_process_leaves_a_tail_that_recover_folds_in(bins, dump, mm):
    run_traced([bins["hostile"], "kill"], dump, check=False)
    tid = the_trace(dump)
    (out,) = mm.find_traces(str(dump))[tid]
    tail = out[:-4] + ".tail"
    assert os.path.exists(tail), "the staging file of a killed thread stays"
    data = open(out, "rb").read()
    assert b"\0" not in data and data.endswith(b"\n"), ".out only ever gets whole lines"
    assert not data.endswith(b"#end\n")
    assert mm.unflushed_tail(out).rstrip(b"\0").endswith(b"\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "recover", str(dump)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("%s: " % out), r.stdout + r.stderr
    assert not os.path.exists(tail)
    # now the classic pipeline on .out alone sees every event
    srt = subprocess.run(["sort", "-s", "-k1,1", out], capture_output=True, check=True,
                         env=dict(os.environ, LC_ALL="C")).stdout
    sh = mm.Shrinker()
    sh.feed(iter(srt.splitlines(keepends=True)), "sorted")
    assert not sh.problems.malformed
    assert sorted(a.size for a in sh.survivors()) == sorted(
        [a.size for a in mm.shrink_files([out]).survivors()])
    got, _ = leaks(dump, tid, "hostile")
    assert got == expect("hostile.c", BEFORE_END)


def test_recover_leaves_a_running_process_alone(bins, dump, mm):
    e = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump))
    p = subprocess.Popen([bins["hostile"], "wait"], env=e, stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "recover",
                            str(dump)], capture_output=True, text=True)
        assert "is still running: left alone" in r.stderr
        assert [n for n in os.listdir(dump) if n.endswith(".tail")]
    finally:
        p.kill()
        p.wait()


def test_fork_child_has_own_files(bins, dump):
    r = run_traced([bins["hostile"], "fork"], dump)
    child = int(re.search(rb"child (\d+)", r.stdout).group(1))
    parent = the_trace_of_parent = [t for t in os.listdir(dump) if t.endswith(".maps")]
    traces = __import__("conftest").mmleak.find_traces(str(dump))
    assert str(child) in traces and len([t for t in traces if traces[t]]) == 2
    ptrace = [t for t in traces if t != str(child)][0]
    got, sh = leaks(dump, ptrace, "hostile")
    assert got == expect("hostile.c", [("early", "ctor", 1001, 1),
                                       ("main", "before_fork", 601, 1),
                                       ("main", "parent", 603, 1)])
    got, csh = leaks(dump, child, "hostile")
    assert got == expect("hostile.c", [("main", "child", 602, 1)])
    # the child freed a block its parent allocated: a foreign free in the child's trace only
    assert len(csh.foreign_frees()) == 1 and sh.foreign_frees() == []
    # nothing of the parent's was copied into the child's files
    assert csh.allocs < 20


def test_exec_traces_new_image_into_its_own_files(bins, dump):
    r = run_traced([bins["hostile"], "exec"], dump)
    traces = {k: v for k, v in __import__("conftest").mmleak.find_traces(str(dump)).items() if v}
    assert len(traces) == 2
    first = min(traces, key=len)
    second = max(traces, key=len)
    assert second == first + "-1"
    got, _ = leaks(dump, first, "hostile")
    assert got == expect("hostile.c", [("early", "ctor", 1001, 1),
                                       ("main", "before_exec", 604, 1)])
    got, _ = leaks(dump, second, "hostile")
    assert got == basic_expected()
    # exec flushed the first image's file: nothing left half-written
    assert not [n for n in os.listdir(dump) if n.endswith(".tail")]


def test_daemon_closing_all_descriptors(bins, dump, tmp_path):
    own = tmp_path / "own.log"
    run_traced([bins["hostile"], "daemon", str(own)], dump)
    assert own.read_text() == "ok\n" * 8      # mmleak never wrote into the program's fds
    got, _ = leaks(dump, the_trace(dump), "hostile")
    assert got == expect("hostile.c", [("early", "ctor", 1001, 1),
                                       ("daemonize", "daemon", 801, 1)])


def test_planted_symlinks_are_refused(bins, dump, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run_traced([bins["hostile"], "plant", str(dump), str(victim)], dump)
    assert victim.read_text() == "precious\n"
    got, _ = leaks(dump, the_trace(dump), "hostile")
    assert got == expect("hostile.c", [("early", "ctor", 1001, 1),
                                       ("thread_body", "thread", 309, 1)])


def test_unusable_dir_one_line_and_program_runs(bins, tmp_path):
    (tmp_path / "file").write_text("")
    for d, why in ((tmp_path / "does" / "not" / "exist", "no such directory (errno 2)"),
                   (tmp_path / "file", "not a directory (errno 20)"),
                   (tmp_path / "file" / "sub", "not a directory (errno 20)")):
        r = run_traced([bins["hostile"], "basic"], d)
        assert r.stderr.decode().splitlines() == [
            "mmleak: cannot create files in %s: %s: tracing disabled (set MMLEAK_DIR to a "
            "writable directory)" % (d, why)]


def test_dlopen_dlclose_library_symbolized(bins, dump):
    run_traced([bins["hostile"], "dl", bins["libdl_test.so"]], dump)
    got, _ = leaks(dump, the_trace(dump), "libdl_test.so")
    assert got == expect("dl_lib.c", [("dl_leak", "dl", 901, 1)])


def test_depth_records_the_callers_callers(bins, dump, mm):
    run_traced([bins["hostile"], "basic"], dump, env={"MMLEAK_DEPTH": "3"})
    tid = the_trace(dump)
    sh = mm.shrink_files(mm.find_traces(str(dump))[tid])
    surv = [a for a in sh.survivors() if a.size == 101]
    assert len(surv) == 1 and len(surv[0].callers) == 3
    sym = mm.Symbolizer(str(dump / ("mmleak.%s.maps" % tid)))
    fr = sym.lookup(surv[0].callers)
    assert [fr[c].function for c in surv[0].callers[:2]] == ["entry_points", "main"]
    assert fr[surv[0].callers[0]].line == site_line("hostile.c", "malloc")


def test_loading_with_dlopen_traces_nothing(lib, tmp_path):
    """mmleak.py loads mmleak.so with ctypes for its compiled shrinker: that must not start
    tracing the Python process."""
    code = "import ctypes; ctypes.CDLL(%r); print('ok')" % lib
    r = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, MMLEAK_DIR=str(tmp_path)))
    assert r.stdout == "ok\n" and r.stderr == ""
    assert os.listdir(tmp_path) == []


def test_non_pie_program_is_traced(bins, dump):
    """A non-PIE program that takes malloc's address (Debian's /usr/bin/python3 is one) has
    its own canonical address for malloc; mmleak must still know it was preloaded."""
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", bins["hostile_nopie"]],
                          capture_output=True, text=True, check=True).stdout
    canonical = [l for l in syms.splitlines() if " UND malloc@" in l]
    assert canonical and not canonical[0].split()[1].strip("0") == "", \
        "the test program must have a canonical PLT entry for malloc: " + str(canonical)
    r = run_traced([bins["hostile_nopie"], "basic"], dump)
    got, _ = leaks(dump, the_trace(dump), "hostile_nopie")
    assert got == basic_expected()


def test_preloaded_by_bare_name(bins, dump):
    # non-PIE, so that only the LD_PRELOAD entry (a bare name) tells mmleak it was preloaded
    r = run_traced([bins["hostile_nopie"], "basic"], dump,
                   env={"LD_PRELOAD": "mmleak.so", "LD_LIBRARY_PATH": ROOT})
    got, _ = leaks(dump, the_trace(dump), "hostile_nopie")
    assert got == basic_expected()


def test_rotation_keeps_results_exact(bins, dump, mm):
    """With a 1 MiB limit every thread goes through several files; each closed one is complete
    (ends with #end) and all of them together give the exact result."""
    run_traced([bins["hostile"], "churn", "2"], dump, env={"MMLEAK_ROTATE_MB": "1"})
    tid = the_trace(dump)
    files = mm.find_traces(str(dump))[tid]
    assert len(files) >= 8
    for f in files:
        data = open(f, "rb").read()
        assert data.endswith(b"#end\n") and b"\0" not in data, f
    assert not [n for n in os.listdir(dump) if n.endswith(".tail")]
    got, sh = leaks(dump, tid, "hostile")
    assert sum(v for k, v in got.items() if k[0] == "churn_body") == 7
    assert sh.foreign_frees() == []


def test_events_of_neighbouring_blocks_stay_adjacent(bins, dump, mm):
    """Blocks side by side (5,000 of 48 bytes, made in order, freed shuffled, 20 rounds): no
    two of them share a sequence counter, so each allocation and its free are numbered
    adjacently and the thread's file shrinks, on its own, to its survivors: not one bracket
    (with the random hash of before, about 3,000 of these addresses were left bracketed)."""
    run_traced([bins["hostile"], "neighbours", "5000", "20"], dump)
    tid = the_trace(dump)
    (out,) = mm.find_traces(str(dump))[tid]
    sh = mm.shrink_files([out])
    assert sh.allocs == sh.frees + 1 and sh.allocs > 100000        # the ctor block stays
    ptrs = {int(l.split()[0], 16) for l in open(out, "rb") if l[:1] != b"#" and l.count(b" ") == 4}
    if len({p >> 26 for p in ptrs}) > 1:
        pytest.skip("this run's heap crosses a 64 MiB boundary (about 1 run in 250), where "
                    "counters are rotated apart and may meet")
    kinds = collections.Counter(k for _, _, k, _ in sh.entries(False))
    assert kinds == {mm.KIND_ALLOC: 1}, kinds


def fs_magic(path):
    """The file system type (statfs f_type) of PATH."""
    r = subprocess.run(["stat", "-f", "-c", "%t", str(path)], capture_output=True, text=True,
                       check=True)
    return int(r.stdout, 16)


@pytest.mark.parametrize("fs,magic", [("ext4", 0xEF53), ("tmpfs", 0x01021994)], ids=["ext4", "tmpfs"])
def test_busy_flushes_reserve_their_blocks_on_ext4_only(bins, mm, tmp_path, fs, magic):
    """A busy thread's flushes (512 KiB) first reserve the range they append with one
    fallocate(FALLOC_FL_KEEP_SIZE) on ext4, and end on a page boundary with a line of blanks;
    on no other file system (tmpfs: measured slower).  The files hold exactly their lines
    (and that padding), end with #end, the result is exact, and no block is left allocated
    past the end of a file."""
    import shutil
    import tempfile
    if not shutil.which("strace"):
        pytest.skip("strace not installed (.ci/run installs it)")
    base = next((b for b in (str(tmp_path), ROOT, "/var/tmp", "/dev/shm", "/tmp")
                 if os.path.isdir(b) and fs_magic(b) == magic), None)
    if base is None:
        pytest.skip("no %s directory on this machine" % fs)
    dump = tempfile.mkdtemp(prefix="mmleak-prealloc.", dir=base)
    try:
        log = tmp_path / "strace.log"
        subprocess.run(["strace", "-f", "-qq", "-e", "trace=fallocate", "-o", str(log),
                        "-E", "LD_PRELOAD=" + LIB, "-E", "MMLEAK_DIR=" + dump,
                        bins["hostile"], "churn", "1"], check=True, capture_output=True,
                       timeout=120)
        calls = re.findall(r"fallocate\(\d+, ([A-Z_|0-9]+), (\d+), (\d+)\) = (-?\d+)",
                           log.read_text())
        keep = [c for c in calls if "FALLOC_FL_KEEP_SIZE" in c[0]]
        if fs == "ext4":
            # 400,000 events, about 13 MB: two dozen flushes of a full half
            assert len(keep) >= 10, calls
            assert all(int(n) >= 256 * 1024 and rc == "0" for _, _, n, rc in keep), keep
        else:
            assert keep == [], keep
        tid = the_trace(dump)
        pads = 0
        for f in mm.find_traces(dump)[tid]:
            data = open(f, "rb").read()
            assert data.endswith(b"#end\n") and b"\0" not in data, f
            st = os.stat(f)
            assert st.st_blocks * 512 < st.st_size + 64 * 1024, (f, st.st_size, st.st_blocks)
            # each full half's flush ends on a page boundary, with one line of blanks
            for m in re.finditer(rb"(?m)^ *\n", data):
                assert m.end() % 4096 == 0 and m.end() < len(data), (f, m.start(), m.end())
                pads += 1
        if fs == "ext4":
            assert pads >= 10
        else:
            assert pads == 0
        got, sh = leaks(dump, tid, "hostile")
        assert sum(v for k, v in got.items() if k[0] == "churn_body") == 7
        assert sh.events > 390000 and sh.foreign_frees() == []
    finally:
        shutil.rmtree(dump, ignore_errors=True)


@pytest.mark.parametrize("end", ["return", "_exit"])
def test_short_threads_reuse_files(bins, dump, mm, end):
    """50 threads one after another: each exited thread's file goes to the next one, so the
    trace has a couple of files, not 51; memory freed by another library's thread-specific
    destructor while a thread exits is still recorded in that thread's file."""
    run_traced([bins["hostile"], "serial", "50"] + (["_exit"] if end == "_exit" else []), dump)
    tid = the_trace(dump)
    files = mm.find_traces(str(dump))[tid]
    assert len(files) <= 3, files
    assert not [n for n in os.listdir(dump) if n.endswith(".tail")]
    text = b"".join(open(f, "rb").read() for f in files)
    assert text.count(b"\n#thread tid=") >= 48          # the handovers are marked
    got, sh = leaks(dump, tid, "hostile")
    assert got == expect("hostile.c", [("early", "ctor", 1001, 1),
                                       ("short_body", "short", 910, 50)])
    assert sh.foreign_frees() == []


def test_daemon_dropping_root_keeps_being_traced(bins, mm):
    """A daemon started as root that becomes nobody: its files are handed over before the
    switch, so the flushes after it still land, and every event is there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="mmleak-dropuid.")   # /tmp: nobody can get in, like a real one
    try:
        os.chmod(d, 0o1777)
        r = run_traced([bins["hostile"], "dropuid"], d)
        assert r.stderr == b""
        tid = the_trace(d)
        for n in os.listdir(d):
            assert os.stat(os.path.join(d, n)).st_uid == 65534, n
        got, sh = leaks(d, tid, "hostile")
        assert got == expect("hostile.c", [("early", "ctor", 1001, 1),
                                           ("drop_root", "before_drop", 921, 1),
                                           ("drop_root", "after_drop", 922, 1),
                                           ("after_drop_body", "thread_after_drop", 923, 1)])
        assert sh.allocs > 100000
    finally:
        shutil.rmtree(d)


def test_scan_says_why_a_dropped_daemon_cannot_write_its_result(bins):
    """The same daemon in a directory only root can write (mmleak.py run's own, 0755): its
    files were made before the switch and handed over, but the scan at its exit, run as
    nobody, cannot create its result there, and says so with the reason and the uid
    (mosquitto and chronyd under mmleak.py run: docs/scan.rst, the fifth comparison)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="mmleak-dropuid.")
    try:
        os.chmod(d, 0o755)
        r = run_traced([bins["hostile"], "dropuid"], d)
        assert (b"mmleak-scan: cannot write the result in %s (as uid 65534): Permission denied\n"
                % d.encode()) in r.stderr, r.stderr
        assert not [n for n in os.listdir(d) if ".scan." in n]
    finally:
        shutil.rmtree(d)


def test_signal_handlers_recording_in_the_middle_of_a_line(bins, dump, mm):
    """A timer every 20 us whose handler allocates and frees, while the main loop does the
    same: thousands of handler events land in the middle of mmleak writing a line.  With an
    async-signal-safe allocator behind mmleak (glibc's would deadlock on its own), no line
    may be garbled and the result must be exact.  (A handler run that interrupts mmleak's
    slow path is not recorded at all, both its events, so nothing false appears.)"""
    r = run_traced([bins["sigstorm"]], dump,
                   env={"LD_PRELOAD": "%s %s" % (LIB, bins["libsigsafe_alloc.so"])})
    hits = int(r.stdout)
    assert hits > 100
    tid = the_trace(dump)
    sh = mm.shrink_files(mm.find_traces(str(dump))[tid])
    assert not sh.problems.malformed
    surv = sh.survivors()
    assert [a.size for a in surv if a.size == 999] == [999]
    lost, unknown = sh.gaps()
    handler_left = [a for a in surv if a.size == 48]
    if lost or unknown:
        # A storm that keeps one of our lines unfinished for longer than the slack behind
        # the staging half holds (a handler run longer than the timer's period, on a loaded
        # machine, and the interrupted code never gets to finish its line): those events
        # are lost, counted, and every report says the trace is incomplete.
        assert not unknown and len(handler_left) <= lost
        assert "INCOMPLETE TRACE" in (sh.gap_text() or ""), sh.gap_text()
    else:
        assert not handler_left                             # every handler block was freed
    assert sh.allocs >= 500000 and sh.frees >= 500000
    if lost:
        # a dropped allocation line is longer than its free's: the free may still fit in the
        # slack and be written, unmatched; never more of them than events lost
        assert len(sh.foreign_frees()) <= lost
    else:
        assert sh.foreign_frees() == []
    assert sh.allocs - 500000 >= hits // 2        # most handler runs were recorded


def test_failing_operator_new_throws_through_mmleak(bins, dump):
    """When malloc fails, mmleak calls libstdc++'s operator new, whose std::bad_alloc unwinds
    through mmleak's frame: the program must see exactly what it sees without mmleak."""
    plain = subprocess.run([bins["badalloc"]], capture_output=True, timeout=60)
    traced = run_traced([bins["badalloc"]], dump)
    assert plain.returncode == 0 and b"caught=" in plain.stdout
    assert traced.stdout == plain.stdout
    assert b"caught=0" not in traced.stdout


def test_mmleaks_own_system_calls_are_not_the_programs(dump, tmp_path, mm):
    """mmleak.so exports syscall() and prctl() (a seccomp filter the program installs is
    checked first); its own calls of them (a thread's id for a file's header, a mapping's
    name, the exit scan's signal masks, futexes and PR_SET_PTRACER, its child's
    exit_group...) bound to those exports too, and went on, counted as the program's, to a
    library preloaded after it that wraps them (tests/own_calls.c: one line per call it
    sees).  Made with the system call instruction (tracer/internal.h, mml_sys), only the
    program's three calls reach it, in order, through mmleak.so's interposers; the trace and
    its scan at exit are as usual."""
    src = os.path.join(ROOT, "tests", "own_calls.c")
    wrap, exe = str(tmp_path / "own_calls.so"), str(tmp_path / "own_calls")
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-DOWN_CALLS_LIB", "-o", wrap, src,
                    "-ldl"], check=True)
    subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", exe, src],
                   check=True)
    r = run_traced([exe], dump, env={"LD_PRELOAD": LIB + " " + wrap})
    assert r.stdout == b"own_calls done\n"
    seen = [l for l in r.stderr.decode().splitlines() if l.startswith("own_calls: ")]
    assert seen == ["own_calls: syscall %d" % 39, "own_calls: prctl 3",
                    "own_calls: syscall %d" % 39], r.stderr[-3000:]
    from mmleaklib import scan
    tid = the_trace(dump)
    k = scan.kinds_for(str(dump), tid)
    assert k.status == "done" and k.scan.why == "exit", k.reason
    surv = mm.shrink_files(mm.find_traces(str(dump))[tid]).survivors()
    assert [k.kind(b.ptr, b.seq) for b in surv if b.size == 4321] == ["definite"]


@pytest.fixture(scope="module")
def fork_phdr(tmp_path_factory, lib):
    """tests/fork_phdr.c, tests/phdr_park.c (preloaded after mmleak.so: parks mmleak.so's
    own dl_iterate_phdr) and tests/dl_lib.c, compiled."""
    d = tmp_path_factory.mktemp("fork_phdr")
    exe, park, dl = str(d / "fork_phdr"), str(d / "libphdr_park.so"), str(d / "libdl_test.so")
    t = os.path.join(ROOT, "tests")
    subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", exe,
                    os.path.join(t, "fork_phdr.c"), "-ldl"], check=True)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", park, os.path.join(t, "phdr_park.c"),
                    "-ldl"], check=True)
    subprocess.run(["cc", "-O1", "-g", "-shared", "-fPIC", "-o", dl,
                    os.path.join(t, "dl_lib.c")], check=True)
    return exe, park, dl


@pytest.mark.parametrize("who,end", [("prog", "_exit"), ("prog", "exit"), ("own", "exit"),
                                     ("none", "exit")])
def test_fork_while_the_loader_lock_is_held(fork_phdr, dump, who, end):
    """A thread inside dl_iterate_phdr (the loader's write lock held) while another forks
    (tests/fork_phdr.c): the program's own thread parked in its callback (prog), or
    mmleak.so's own thread parked in its check of the loaded objects at the thread's first
    allocation (own: tests/phdr_park.c). Untraced the child never calls dl_iterate_phdr;
    traced, mmleak.so's first check in the child called it, and the lock fork copied held was
    never released: the child hung (found as a hung child of attach_hostile's forker). Now
    the child's trace is exact: its two leaks at their sites, one in a library the parent
    loaded (the child cannot load one: dlopen waits for that lock too), and its scan at
    exit runs (it called dl_iterate_phdr too). none: the thread parked outside the loader,
    the lock free at the fork: the child loads the library itself, and the leak through it
    is named as well (a child taken to be stuck without cause would miss that load)."""
    exe, park, dl = fork_phdr
    argv = [exe, who, end, dl]
    want = rb"child (\d+) ok\nchild status 0\n"
    if who != "own":        # (own needs mmleak.so: nothing to park without it)
        plain = subprocess.run(argv, capture_output=True, timeout=120)
        assert plain.returncode == 0 and re.fullmatch(want, plain.stdout), plain.stdout
    env = {"LD_PRELOAD": LIB + " " + park} if who == "own" else None
    r = run_traced(argv, dump, env=env, check=False, timeout=120)
    m = re.fullmatch(want, r.stdout)
    assert r.returncode == 0 and m, r.stdout
    child = m.group(1).decode()
    got, _ = leaks(dump, child, "fork_phdr")
    assert got == expect("fork_phdr.c", [("main", "child", 48, 1)])
    got, _ = leaks(dump, child, "libdl_test.so")
    assert got == expect("dl_lib.c", [("dl_leak", "dl", 77, 1)])
    from mmleaklib import scan
    k = scan.kinds_for(str(dump), child)
    if end == "exit":
        assert k.status == "done" and k.scan.why == "exit", k.reason


def test_fork_stuck_with_segments_apart(dump, tmp_path, mm):
    """The child of tests/fork_phdr.c (the program's thread in its dl_iterate_phdr callback)
    built -DGAP -no-pie, with tests/dl_lib.c -DGAP: program and library each with a
    2 MiB-aligned .bss, the program's segments mapped apart, so that _dl_find_object knows
    it segment by segment.  In such a child mmleak.so reads the loader's list itself
    (tracer/maps.c, walk_stuck); it took the ELF header at the start of the segment that
    holds the dynamic section: the program's data, whose first bytes are a forged header
    (its TLS image) with one PT_LOAD over every address.  So the program was taken for the
    object that holds mmleak.so, the scan at exit found no mmleak-scan beside it
    (MMLEAK_SCAN_HERE=0: mmleak-scan's way) and the child ended with no scan at all.  Its
    headers are the auxiliary vector's now (the kernel's, which ld.so used): the child's
    maps file has one text line of each object, its leaks are at their sites, the scan at
    exit runs, and the block held from the far .bss is reachable."""
    t = os.path.join(ROOT, "tests")
    exe, dl = str(tmp_path / "fork_gap"), str(tmp_path / "libdl_gap.so")
    cc = [subprocess.Popen(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-DGAP",
                            "-no-pie", "-o", exe, os.path.join(t, "fork_phdr.c"), "-ldl"]),
          subprocess.Popen(["cc", "-O1", "-g", "-shared", "-fPIC", "-DGAP", "-o", dl,
                            os.path.join(t, "dl_lib.c")])]
    assert [p.wait() for p in cc] == [0, 0]
    r = run_traced([exe, "prog", "exit", dl], dump, env={"MMLEAK_SCAN_HERE": "0"},
                   check=False)
    m = re.fullmatch(rb"child (\d+) ok\nchild status 0\n", r.stdout)
    assert r.returncode == 0 and m, (r.stdout, r.stderr[-2000:])
    child = m.group(1).decode()
    maps = (dump / ("mmleak.%s.maps" % child)).read_text().splitlines()
    for obj in exe, dl:
        assert len([l for l in maps if l.endswith(" " + obj) and " r-xp " in l]) == 1, maps
    got, sh = leaks(dump, child, "fork_gap")
    assert got == expect("fork_phdr.c", [("main", "child", 48, 1), ("main", "far", 64, 1)])
    got, _ = leaks(dump, child, "libdl_gap.so")
    assert got == expect("dl_lib.c", [("dl_leak", "dl", 77, 1)])
    (b77,) = [b for b in sh.survivors() if b.size == 77]
    fr = mm.Symbolizer(str(dump / ("mmleak.%s.maps" % child))).lookup(sorted(set(b77.callers)))
    assert [fr[c].function for c in b77.callers][:2] == ["dl_leak", "main"]
    from mmleaklib import scan
    k = scan.kinds_for(str(dump), child)
    assert k.status == "done" and k.scan.why == "exit", k.reason
    assert [k.kind(b.ptr, b.seq) for b in sh.survivors() if b.size == 64] == ["reachable"]
