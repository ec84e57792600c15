"""Hostile processes, round two (issue #8): each test is a way a real program broke mmleak.so,
run for real under LD_PRELOAD (tests/adversary.c, tests/badalloc.cpp), with the exact leaks,
file counts and messages asserted.  Each of these failed before the fix it guards."""
import collections
import contextlib
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from conftest import LIB, ROOT, expect, leaks, run_traced, site_line

MMLEAK = os.path.join(ROOT, "mmleak.py")
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def traces(mm, d):
    return {k: v for k, v in mm.find_traces(str(d)).items()}


def report(d, *args):
    return subprocess.run(["/usr/bin/python3", MMLEAK, "report", str(d), "--no-html"] +
                          list(args), capture_output=True, text=True, timeout=120)


def adv(name, site, size, n=1, fn=None):
    return (fn, name, site, size, n)


def exp(rows):
    return expect("adversary.c", [(fn, site, size, n) for fn, _, site, size, n in rows])


def mmleak_lines(stderr):
    return [l for l in stderr.decode().splitlines() if l.startswith("mmleak:")]


# -- 1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("nthreads", [3, 80])
def test_threads_freeing_after_their_last_destructor_then_fork(bins, dump, mm, nthreads):
    """glibc frees a failed dlopen's dlerror() buffer and strerror()'s buffer after the
    thread's key destructors: those late events once re-registered the dying thread, whose
    reused TLS made the thread list a loop, and the next fork() child spun forever.  Now:
    no hang, a few files (not 2 per thread), no staging file left, exact leaks."""
    r = run_traced([bins["adversary"], "dlerr_fork", str(nthreads)], dump, timeout=30)
    assert r.stdout == b"child ok\n" and r.stderr == b""
    t = traces(mm, dump)
    assert len(t) == 2, t                       # parent and child
    # the parent made the threads' files, the child one (not by pid: pids wrap around)
    parent = max(t, key=lambda k: len(t[k]))
    child = min(t, key=lambda k: len(t[k]))
    assert len(t[child]) == 1 and len(t[parent]) >= 2, t
    assert len(t[parent]) <= 4, t[parent]        # main, one parked, one late file
    assert not [n for n in os.listdir(dump) if n.endswith(".tail")]
    got, sh = leaks(dump, parent, "adversary")
    assert got == exp([adv(0, "dlerr_parent", 771, fn="dlerr_fork")])
    assert sh.foreign_frees() == []
    # the late events are in the trace: every dlerror/strerror buffer was freed
    assert sh.gap_text() is None
    got, _ = leaks(dump, child, "adversary")
    assert got == exp([adv(0, "dlerr_child", 772, fn="dlerr_fork")])


def test_late_file_ends_and_a_new_one_starts(bins, dump, mm):
    """A daemon starting a thread per task sends a few late lines per thread to the shared
    late file for as long as it runs; that file never ended, so the compactor could never
    fold it while the process lived.  Now it ends ("#end") past 64 KiB and the next late line
    starts a new one: 1,500 threads (3 late frees each) make several, each complete but the
    newest, and the trace is exact."""
    r = run_traced([bins["adversary"], "dlerr_fork", "1500"], dump, timeout=60)
    assert r.stdout == b"child ok\n" and r.stderr == b""
    t = traces(mm, dump)
    parent = max(t, key=lambda k: len(t[k]))      # the threads' files, not the child's one
    late = []
    for n in os.listdir(str(dump)):
        if n.startswith("mmleak.%s." % parent) and n.endswith(".out"):
            with open(os.path.join(str(dump), n), "rb") as f:
                data = f.read()
            if b" late=1\n" in data.split(b"\n", 1)[0] + b"\n":
                late.append((int(n.split(".")[2]), data))
    late.sort()
    assert len(late) >= 3, [len(d) for _, d in late]
    for _, data in late[:-1]:
        assert data.endswith(b"\n#end\n") and 64 << 10 <= len(data) < (64 << 10) + 512, \
            len(data)
    assert not late[-1][1].endswith(b"#end\n")     # the newest: open until the process ended
    got, sh = leaks(dump, parent, "adversary")
    assert got == exp([adv(0, "dlerr_parent", 771, fn="dlerr_fork")])
    assert sh.foreign_frees() == [] and sh.gap_text() is None


@contextlib.contextmanager
def attached_when_ready(bins, args, dump):
    """The adversary program with ARGS, preloaded and paused (MMLEAK_PAUSED=1), attached by
    `mmleak.py attach` into DUMP once it says "ready"; killed at the end if it still runs."""
    p = subprocess.Popen([bins["adversary"]] + args, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_PAUSED="1"))
    try:
        assert p.stdout.readline() == b"ready\n"
        a = subprocess.run(["/usr/bin/python3", MMLEAK, "attach", str(p.pid), "-d", str(dump)],
                           capture_output=True, timeout=60)
        assert a.returncode == 0, a.stderr
        yield p
    finally:
        if p.poll() is None:
            p.kill()


def test_threads_whose_first_event_is_at_their_exit(bins, dump, mm):
    """The other door to item 1: tracing starts (MMLEAK_PAUSED=1, then attach) after 20
    threads failed a dlopen; when they end, glibc frees their dlerror() and strerror()
    buffers after their key destructors, and that free is their first event.  Each opened a
    file it could never give up (42 files, 20 staging files and mappings left behind); now
    those frees go to the shared late file, exact."""
    with attached_when_ready(bins, ["dlerr_attach", "20"], dump) as p:
        out, err = p.communicate(b"x", timeout=60)
    assert p.returncode == 0 and out == b"dlerr_attach done\n" and err == b""
    names = os.listdir(str(dump))
    assert not [n for n in names if n.endswith(".tail")], names
    t = traces(mm, dump)
    assert len(t) == 1 and len(t[str(p.pid)]) <= 3, t       # main, late, (one parked)
    got, sh = leaks(dump, str(p.pid), "adversary")
    assert got == exp([adv(0, "dlerr_attach", 773, fn="dlerr_attach")])
    assert sh.gap_text() is None
    # allocated before the attach, their frees are "foreign": three per thread in libc (the
    # dlerror() message and result, the strerror() buffer); the loader frees some of the
    # threads' TLS blocks, as many as it does not keep for reuse
    ff = sh.foreign_frees()
    sym = mm.Symbolizer(os.path.join(str(dump), "mmleak.%d.maps" % p.pid))
    frames = sym.lookup(sorted({f.caller for f in ff}))
    mods = collections.Counter(frames[f.caller].module for f in ff)
    assert mods["libc.so.6"] == 60 and set(mods) <= {"libc.so.6", "ld-linux-x86-64.so.2"}, mods


# -- 2 ------------------------------------------------------------------------------------
ALLOC_LEAKS = [adv(0, "alloc_strdup", 8, fn="allocator"),
               adv(0, "alloc_reallocarray", 300, fn="allocator"),
               adv(0, "alloc_pvalloc", 5000, fn="allocator"),
               adv(0, "alloc_malloc", 333, fn="allocator")]


@pytest.mark.parametrize("other", [JEMALLOC, TCMALLOC], ids=["jemalloc", "tcmalloc"])
def test_other_allocator_after_mmleak_is_traced(bins, dump, mm, other):
    """mmleak.so first, the allocator after it: its malloc is the one traced, and functions
    it lacks (pvalloc, reallocarray) are made from its own, never taken from libc (the
    program frees them with the allocator's free: that crashed)."""
    if not os.path.exists(other):
        pytest.skip("%s not installed (.ci/run installs libjemalloc2 and "
                    "libtcmalloc-minimal4)" % other)
    r = run_traced([bins["adversary"], "allocator"], dump,
                   env={"LD_PRELOAD": "%s %s" % (LIB, other)})
    assert r.stdout == b"allocator done\n" and r.stderr == b""
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "adversary")
    assert got == exp(ALLOC_LEAKS)
    assert sh.foreign_frees() == []
    assert sh.alloc == os.path.realpath(other) or os.path.realpath(sh.alloc) == \
        os.path.realpath(other)
    rep = report(dump)
    assert "allocator traced: %s" % sh.alloc in rep.stdout


@pytest.mark.parametrize("other", [JEMALLOC, TCMALLOC], ids=["jemalloc", "tcmalloc"])
def test_other_allocator_before_mmleak_is_left_alone(bins, dump, other):
    """The allocator first: its malloc is the program's and mmleak.so cannot see it.  The
    program must run exactly as without mmleak (it crashed), and one line says why nothing
    is traced."""
    if not os.path.exists(other):
        pytest.skip("%s not installed (.ci/run installs it)" % other)
    r = run_traced([bins["adversary"], "allocator"], dump,
                   env={"LD_PRELOAD": "%s %s" % (other, LIB)})
    assert r.stdout == b"allocator done\n"
    lines = mmleak_lines(r.stderr)
    assert lines == ["mmleak: malloc is replaced by %s, found before mmleak.so: nothing is "
                     "traced (put mmleak.so first in LD_PRELOAD)" % other]
    assert os.listdir(dump) == []


@pytest.mark.parametrize("order", ["this-first", "copy-first"])
def test_two_copies_of_mmleak_in_ld_preload_trace_once(bins, dump, mm, tmp_path, order):
    """Two mmleak.so files in LD_PRELOAD (an installed one and a build): the second found
    recorded every event again, as a second trace "PID-1" whose call sites were all inside
    the first copy.  Now the first traces, the other stays out and says so."""
    copy = str(tmp_path / "other" / "mmleak.so")
    os.makedirs(os.path.dirname(copy))
    shutil.copy2(LIB, copy)
    first, second = (LIB, copy) if order == "this-first" else (copy, LIB)
    r = run_traced([bins["adversary"], "plain"], dump,
                   env={"LD_PRELOAD": "%s %s" % (first, second)})
    assert mmleak_lines(r.stderr) == ["mmleak: %s is loaded after another mmleak.so (%s): it "
                                      "stays out of the way" % (second, first)]
    t = traces(mm, dump)
    assert len(t) == 1, t
    got, sh = leaks(dump, next(iter(t)), "adversary")
    assert got == exp([adv(0, "plain", 1101, fn="main")])
    assert sh.foreign_frees() == []


def test_run_replaces_another_mmleak_in_ld_preload(bins, dump, mm, tmp_path):
    """`mmleak.py run` with an LD_PRELOAD that already names another mmleak.so: that one is
    taken out (one line says so), the one `run` uses traces, once."""
    copy = str(tmp_path / "other" / "mmleak.so")
    os.makedirs(os.path.dirname(copy))
    shutil.copy2(LIB, copy)
    r = subprocess.run(["/usr/bin/python3", MMLEAK, "run", "--keep-all", "-d", str(dump), "--lib",
                        LIB, "--", bins["adversary"], "plain"], capture_output=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD="%s:/lib/x86_64-linux-gnu/libm.so.6" % copy))
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "mmleak.py: LD_PRELOAD named another mmleak.so, %s: replaced by %s\n" % (copy, LIB) \
        in err
    assert "child processes" not in err
    t = traces(mm, dump)
    assert len(t) == 1, t
    got, _ = leaks(dump, next(iter(t)), "adversary")
    assert got == exp([adv(0, "plain", 1101, fn="main")])


def test_program_with_its_own_malloc_runs_as_without_mmleak(bins, dump):
    """A program that defines malloc, free, calloc and realloc itself: mmleak stays out of
    the way, and every function it defines and the program does not (posix_memalign,
    memalign, aligned_alloc, valloc, reallocarray, strdup) must do what it does without
    mmleak.  posix_memalign failed with ENOMEM (the program has none, and mmleak found only
    its own)."""
    plain = subprocess.run([bins["own_malloc"]], capture_output=True, timeout=30)
    assert plain.returncode == 0
    r = run_traced([bins["own_malloc"]], dump)
    # the first line: every function works; the second counts the program's malloc calls,
    # which include mmleak's own look at who the process's malloc is (a malloc and a free)
    assert r.stdout.splitlines()[0] == plain.stdout.splitlines()[0] == \
        b"posix_memalign=0 memalign=1 aligned_alloc=1 valloc=1 reallocarray=1"
    assert mmleak_lines(r.stderr) == ["mmleak: malloc is replaced by %s, found before "
                                      "mmleak.so: nothing is traced (put mmleak.so first in "
                                      "LD_PRELOAD)" % bins["own_malloc"]]
    assert os.listdir(str(dump)) == []


# -- 3 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("pre", [0, 100], ids=["no-file-yet", "file-open"])
def test_no_descriptor_for_a_moment_loses_nothing(bins, dump, mm, pre):
    """At RLIMIT_NOFILE with every descriptor taken while a flush (or the thread's first
    file) is due: the staged events are kept and written once descriptors are back, and the
    result is exact.  (It used to delete the staging file and report "no leaks".)"""
    r = run_traced([bins["adversary"], "nofile", "400", str(pre)], dump)
    assert r.stdout == b"nofile done\n"
    lines = mmleak_lines(r.stderr)
    assert len(lines) == 1 and "no file descriptor left (RLIMIT_NOFILE)" in lines[0], lines
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "adversary")
    want = [adv(0, "nofile_during", 501, fn="nofile"), adv(0, "nofile_during2", 502, fn="nofile"),
            adv(0, "nofile_after", 503, fn="nofile")]
    if pre:
        want.append(adv(0, "nofile_pre", 500, fn="nofile"))
    assert got == exp(want)
    assert sh.gap_text() is None and sh.foreign_frees() == []
    assert sh.allocs == 1 + 400 + 1 + 5000 + 1 + pre + (1 if pre else 0)
    assert report(dump).returncode == 0


def test_long_failure_counts_what_is_lost_and_every_report_says_so(bins, dump, mm):
    """Far more events than the staging area and the hold (MMLEAK_HOLD_MB, 1 MB here: the
    default 64 MB would keep them all) hold while no descriptor is free: those are counted,
    not recorded; shrink and report say the trace is incomplete (exit status 3)."""
    r = run_traced([bins["adversary"], "nofile", "100000", "100"], dump,
                   env={"MMLEAK_HOLD_MB": "1"})
    assert r.stdout == b"nofile done\n"
    assert len(mmleak_lines(r.stderr)) == 1
    tid = next(iter(traces(mm, dump)))
    sh = mm.shrink_files(mm.find_traces(str(dump))[tid])
    lost, unknown = sh.gaps()
    total = 1 + 100 * 2 + 1 + 100000 * 2 + 1 + 5000 * 2 + 1
    assert unknown == 0 and 150000 < lost < 200002
    assert sh.events + lost == total                # every event is recorded or counted
    rep = report(dump)
    assert rep.returncode == 3
    assert "INCOMPLETE TRACE: %d events were not recorded" % lost in rep.stdout
    out = subprocess.run(["/usr/bin/python3", MMLEAK, "shrink", "--final"] +
                         mm.find_traces(str(dump))[tid], capture_output=True, timeout=60)
    assert out.returncode == 3 and b"INCOMPLETE TRACE" in out.stderr
    assert b"#lost %d" % lost in out.stdout         # partial results carry the count on


@contextlib.contextmanager
def small_tmpfs(size):
    """A directory with a tmpfs of SIZE mounted on it (skipped without root, or where it
    cannot be mounted), unmounted and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    d = tempfile.mkdtemp(prefix="mmleak-full.")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", d],
                       capture_output=True)
    if r.returncode:
        os.rmdir(d)
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield d
    finally:
        subprocess.run(["umount", d])
        os.rmdir(d)


def test_disk_full_one_message_with_its_reason_and_an_incomplete_report(bins, mm):
    """Three threads fill a 700 KiB file system: one message for the whole process (not
    one per thread), with the reason; the program ends normally; the report says the trace
    is incomplete instead of "no leaks"."""
    with small_tmpfs("700k") as d:
        r = run_traced([bins["adversary"], "fill", "3"], d)
        assert r.stdout == b"fill done\n"
        lines = mmleak_lines(r.stderr)
        assert len(lines) == 1 and "disk full (errno 28)" in lines[0], lines
        rep = report(d)
        assert rep.returncode == 3 and "INCOMPLETE TRACE" in rep.stdout


@pytest.mark.parametrize("hold", ["0", None], ids=["no-hold", "default-hold"])
def test_the_event_that_finds_writing_works_again_is_recorded(bins, dump, mm, hold):
    """After a failure long enough to drop events (MMLEAK_HOLD_MB=0: nothing is held in
    memory), the first event once descriptors are back retries and succeeds: it must be
    written, not counted as lost with the others (here it is a leak, which went missing).
    With the default hold nothing is lost at all."""
    r = run_traced([bins["adversary"], "recover"], dump,
                   env={"MMLEAK_HOLD_MB": hold} if hold else None)
    assert r.stdout == b"recover done\n"
    assert len(mmleak_lines(r.stderr)) == 1
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "adversary")
    assert got[("recover_first", "adversary.c", site_line("adversary.c", "recover_first"),
                511)] == 1, got
    lost, unknown = sh.gaps()
    assert unknown == 0 and sh.events + lost == 1 + 100000 * 2 + 1 + 100 * 2


def test_maps_file_written_once_the_disk_has_room_again(bins, mm):
    """The disk is full when the trace starts: the maps file cannot be written.  Once there
    is room, the events are written and so must the maps file be (it stayed empty: no call
    site of the report could be named)."""
    with small_tmpfs("2m") as d:
        filler = os.path.join(d, "filler")
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        p = subprocess.Popen([bins["adversary"], "waitdisk"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=d))
        # its first event is made (and the disk found full) before it says ready: room is
        # made only then, whatever the machine's speed
        assert p.stdout.readline() == b"ready\n"
        os.unlink(filler)
        out, err = p.communicate(b"x", timeout=60)
        assert p.returncode == 0 and out == b"waitdisk done\n", err
        assert "disk full (errno 28)" in err.decode()
        tid = next(iter(traces(mm, d)))
        assert os.path.getsize(os.path.join(d, "mmleak.%s.maps" % tid)) > 0
        got, sh = leaks(d, tid, "adversary")
        assert got == exp([adv(0, "disk_before", 921, fn="waitdisk"),
                           adv(0, "disk_after", 922, fn="waitdisk")])
        assert sh.gap_text() is None


def test_a_message_never_goes_into_the_programs_own_file(bins, dump, tmp_path):
    """A daemon closes descriptor 2 and opens a file of its own, which gets that number;
    then mmleak cannot write for a while.  Its message went into the daemon's file (after
    "precious data"): mmleak writes to descriptor 2 only while it is the file it was when
    the trace started."""
    data = tmp_path / "data"
    r = run_traced([bins["adversary"], "stderr_taken", str(data)], dump)
    assert r.stdout == b"stderr_taken done\n" and r.stderr == b""
    assert data.read_bytes() == b"precious data\n"


def test_a_umask_without_the_owners_write_bit(bins, mm):
    """umask(0777) in a program that is not root: mmleak's files were created mode 0000,
    it could not open them again, and nearly every event was lost.  They are 0600."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the program as nobody")
    d = tempfile.mkdtemp(prefix="mmleak-umask.")     # every directory up to it: 0755
    try:
        os.chmod(d, 0o1777)
        prog, lib = os.path.join(d, "adversary"), os.path.join(d, "mmleak.so")
        shutil.copy2(bins["adversary"], prog)
        shutil.copy2(LIB, lib)
        dump = os.path.join(d, "dump")
        os.mkdir(dump)
        os.chmod(dump, 0o1777)
        r = subprocess.run([prog, "umask"], capture_output=True, timeout=60,
                           preexec_fn=lambda: (os.setgroups([]), os.setresgid(65534, 65534, 65534),
                                               os.setresuid(65534, 65534, 65534)),
                           env=dict(os.environ, LD_PRELOAD=lib, MMLEAK_DIR=dump))
        assert r.returncode == 0 and r.stdout == b"umask done\n" and r.stderr == b""
        for n in os.listdir(dump):
            assert os.stat(os.path.join(dump, n)).st_mode & 0o777 == 0o600, n
        tid = next(iter(traces(mm, dump)))
        got, sh = leaks(dump, tid, "adversary")
        assert got == exp([adv(0, "umask_leak", 530, fn="strict_umask")])
        assert sh.gap_text() is None and sh.events == 1 + 2 * 50000
    finally:
        shutil.rmtree(d)


# -- 4 ------------------------------------------------------------------------------------
def test_file_size_limit_rotates_below_it_and_the_program_goes_on(bins, dump, mm):
    """RLIMIT_FSIZE of 300 kB: writing past it would kill the program with SIGXFSZ.  mmleak
    keeps every file below the limit (rotating early) and the result is exact."""
    r = run_traced([bins["adversary"], "fsize", "300000", "100000"], dump)
    assert r.returncode == 0 and r.stdout == b"fsize done\n" and r.stderr == b""
    for n in os.listdir(dump):
        assert os.path.getsize(os.path.join(dump, n)) <= 300000, n
    tid = next(iter(traces(mm, dump)))
    assert len(traces(mm, dump)[tid]) >= 10
    got, sh = leaks(dump, tid, "adversary")
    assert got == exp([adv(0, "fsize_before", 601, fn="fsize"),
                       adv(0, "fsize_after", 602, fn="fsize")])
    assert sh.events == 200002 and sh.gap_text() is None


def test_file_size_limit_too_small_stops_with_one_message(bins, dump, mm):
    r = run_traced([bins["adversary"], "fsize", "40000", "100000"], dump)
    assert r.returncode == 0 and r.stdout == b"fsize done\n"
    lines = mmleak_lines(r.stderr)
    assert len(lines) == 1 and "file size limit (RLIMIT_FSIZE)" in lines[0], lines
    rep = report(dump)
    assert rep.returncode == 3
    assert "INCOMPLETE TRACE: 200002 events were not recorded" in rep.stdout


@pytest.mark.parametrize("before,limit", [(100000, 2000000), (1000, 300000)],
                         ids=["file-past-the-limit", "staging-past-the-limit"])
def test_file_size_limit_lowered_below_the_file_goes_on_in_new_files(bins, dump, mm, before,
                                                                      limit):
    """RLIMIT_FSIZE lowered while the thread's file already holds more than it (or its
    staging halves do): what is staged goes on in new files below the limit (tracing stopped
    for good, and the report said the trace was incomplete)."""
    r = run_traced([bins["adversary"], "fsize_late", str(before), str(limit), "100000"], dump)
    assert r.returncode == 0 and r.stdout == b"fsize_late done\n" and r.stderr == b""
    names = sorted(os.listdir(dump))
    assert not [n for n in names if n.endswith(".tail")]
    tid = next(iter(traces(mm, dump)))
    big = [n for n in names if os.path.getsize(os.path.join(dump, n)) > limit]
    assert big in ([], ["mmleak.%s.0.out" % tid])   # written before the limit came
    got, sh = leaks(dump, tid, "adversary")
    assert got == exp([adv(0, "fsize_late_before", 611, fn="fsize_late"),
                       adv(0, "fsize_late_after", 612, fn="fsize_late")])
    assert sh.events == 2 + 2 * before + 2 * 100000 and sh.gap_text() is None
    assert report(dump).returncode == 0


def test_file_size_limit_and_the_log_of_loads(bins, dump, tmp_path):
    """Two plugins loaded and unloaded in turn, 400 times, under a 100 kB RLIMIT_FSIZE: the
    log of loads (mmleak.ID.loads) grows at every unload, and writing it past the limit
    killed the program with SIGXFSZ.  It stops below the limit, with one message."""
    libs = []
    for k in (0, 1):
        libs.append(str(tmp_path / ("libplugin%d.so" % k)))
        shutil.copy2(bins["libdl_test.so"], libs[-1])
    r = run_traced([bins["adversary"], "fsize_dl", "100000", "400"] + libs, dump, check=False)
    assert r.returncode == 0 and r.stdout == b"fsize_dl done\n", r
    assert mmleak_lines(r.stderr) == [
        "mmleak: cannot write the log of loads in %s: the file size limit (RLIMIT_FSIZE) is "
        "reached (errno 27): addresses in unloaded ranges may be put in the wrong library"
        % dump]
    for n in os.listdir(str(dump)):
        assert os.path.getsize(os.path.join(str(dump), n)) <= 100000, n


def test_detach_respects_the_file_size_limit(bins, dump, mm):
    """Detach appends each thread's staged lines to its file from outside, and wrote past
    the process's RLIMIT_FSIZE: a part of a line up to the limit (a thread of the program
    writing past it gets SIGXFSZ).  Now nothing is written that does not fit: the lines
    stay in the .tail (readers take them from there), the program goes on."""
    import resource
    with attached_when_ready(bins, ["detach_fsize"], dump) as p:
        p.stdin.write(b"x")
        p.stdin.flush()
        assert p.stdout.readline() == b"staged\n"
        out_file = [n for n in os.listdir(str(dump)) if n.endswith(".out")]
        size = os.path.getsize(os.path.join(str(dump), out_file[0]))
        resource.prlimit(p.pid, resource.RLIMIT_FSIZE, (size + 100, size + 100))
        d = subprocess.run(["/usr/bin/python3", MMLEAK, "detach", str(p.pid)],
                           capture_output=True, timeout=60)
        assert d.returncode == 0, d.stderr
        out, err = p.communicate(b"x", timeout=60)
    assert p.returncode == 0 and out == b"detach_fsize done\n"
    assert os.path.getsize(os.path.join(str(dump), out_file[0])) == size
    assert [n for n in os.listdir(str(dump)) if n.endswith(".tail")]
    got, _ = leaks(dump, str(p.pid), "adversary")
    assert got == exp([adv(0, "detach_staged", 1302, fn="detach_fsize")])


# -- 5 ------------------------------------------------------------------------------------
def with_threads(main, fn, site, sizes):
    """The leaks of adversary.c: MAIN (adv()), and one block of each of SIZES at SITE, in
    function FN."""
    want = exp([main])
    for size in sizes:
        want[(fn, "adversary.c", site_line("adversary.c", site), size)] += 1
    return want


def test_threads_creating_files_while_root_is_dropped(bins, mm):
    """Six threads create their files at the moment the main thread calls setresuid(): a
    file created as root just before the switch must be handed over too, or that thread's
    events are lost ("permission denied").  Ten runs, every one exact."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    for run in range(10):
        d = tempfile.mkdtemp(prefix="mmleak-uidrace.")
        try:
            os.chmod(d, 0o1777)
            r = run_traced([bins["adversary"], "uidrace", "6"], d)
            assert r.stderr == b"", (run, r.stderr)
            tid = next(iter(traces(mm, d)))
            got, sh = leaks(d, tid, "adversary")
            want = with_threads(adv(0, "uid_main", 799, fn="uidrace"), "uid_body", "uid_thread",
                                range(700, 706))
            assert got == want, run
            assert sh.gap_text() is None
        finally:
            shutil.rmtree(d)


def test_loads_log_goes_on_after_root_is_dropped(bins, mm):
    """The log of loaded and unloaded objects (mmleak.ID.loads) is one of mmleak's files too:
    once the process is another user it must still be written (it stayed root's, and the
    second plugin's lines were never written)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    d = tempfile.mkdtemp(prefix="mmleak-dlsetuid.")     # every directory up to it: 0755
    try:
        os.chmod(d, 0o1777)
        libs = [os.path.join(d, "libplugin%d.so" % k) for k in (0, 1)]
        for lib in libs:
            shutil.copy2(bins["libdl_test.so"], lib)
            os.chmod(lib, 0o755)
        r = run_traced([bins["adversary"], "dlsetuid"] + libs, d)
        assert r.stdout == b"dlsetuid done\n" and r.stderr == b""
        tid = next(iter(traces(mm, d)))
        loads_file = os.path.join(d, "mmleak.%s.loads" % tid)
        assert os.stat(loads_file).st_uid == 65534
        with open(loads_file) as f:
            loads = {l.split(None, 1)[0] + " " + l.split()[-1] for l in f
                     if l.split()[-1] in libs}
        # +0: the first plugin, seen at the first dlclose; -1: gone; +1 and -2: the second,
        # loaded and unloaded as another user
        assert sorted(loads) == ["+0 " + libs[0], "+1 " + libs[1], "-1 " + libs[0],
                                 "-2 " + libs[1]], loads
        line = site_line("dl_lib.c", "dl")
        for k in (0, 1):
            got, _ = leaks(d, tid, "libplugin%d.so" % k)
            assert got == collections.Counter({("dl_leak", "dl_lib.c", line, 730 + k): 1})
    finally:
        shutil.rmtree(d)


@pytest.mark.parametrize("how", ["setresuid", "fsuid"])
def test_a_thread_acting_as_another_user_for_a_while(bins, mm, how):
    """A file server (nfs-ganesha, samba) switches one thread's credentials around each
    request, with a raw setresuid or setfsuid that the other threads do not share: while it
    acts as another user, that thread's 0600 file (root's) was out of its reach, and almost
    all its events were lost.  mmleak now uses the files' owner for its own file operations
    (the thread's saved uid is still root's)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch credentials")
    d = tempfile.mkdtemp(prefix="mmleak-creds.")
    try:
        os.chmod(d, 0o1777)
        r = run_traced([bins["adversary"], "threadcreds", how], d)
        assert r.stdout == b"threadcreds done\n" and r.stderr == b""
        tid = next(iter(traces(mm, d)))
        got, sh = leaks(d, tid, "adversary")
        want = with_threads(adv(0, "creds_root", 740, fn="creds_body"), "creds_body",
                            "creds_request", range(741, 746))
        assert got == want
        assert sh.gap_text() is None and sh.events == 1 + 10 * 2 + 5 * (1 + 20000 * 2) + 1
    finally:
        shutil.rmtree(d)


def test_a_seccomp_filter_against_setfsuid_does_not_kill_the_program(bins, dump, mm):
    """A unit with SystemCallFilter=~@privileged kills the process at setfsuid: mmleak calls
    it only when a file operation of a thread acting as another user was refused, never in
    an ordinary run (an earlier fix for that called it at every open)."""
    r = run_traced([bins["adversary"], "no_setfsuid"], dump, env={"MMLEAK_ROTATE_MB": "1"},
                   check=False)
    assert r.returncode == 0 and r.stdout == b"no_setfsuid done\n" and r.stderr == b""
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "adversary")
    assert got == exp([adv(0, "seccomp_leak", 750, fn="no_setfsuid")])
    assert sh.events == 1 + 2 * 50000 and sh.gap_text() is None


def test_a_seccomp_filter_against_huge_pages_does_not_kill_the_program(bins, dump, mm):
    """The memo of walks moves to a huge page once it has kept 1024 walks (tracer/memo.c,
    memo_huge), but never under a seccomp filter: this one kills at madvise(MADV_HUGEPAGE)
    (and lets mmleak's own calls through), then the program makes 3000 walks from as many
    stack pointers.  It must run to its end, its trace whole."""
    r = run_traced([bins["adversary"], "no_hugepage"], dump, check=False)
    assert r.returncode == 0 and r.stdout == b"no_hugepage done\n" and r.stderr == b"", r
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "adversary")
    assert got == exp([adv(0, "hugepage_leak", 765, fn="no_hugepage")])
    assert sh.events == 1 + 2 * 3000 and sh.gap_text() is None


@pytest.mark.parametrize("how", ["prctl", "syscall"])
def test_a_seccomp_filter_the_program_installs_ends_the_trace_before_it(bins, dump, mm, how):
    """sshd's privilege-separated child (prctl) and chronyd -F 1 (libseccomp: the seccomp
    system call) filter their own system calls: mmleak's prlimit64 (a flush) or sigaltstack
    (a new thread's first event) got them killed with SIGSYS.  mmleak runs the new filter on
    its own calls first and, as this one refuses some, ends the trace there, complete: the
    program runs on untraced and exits 0; the block from before the filter is in the trace,
    nothing after it."""
    r = run_traced([bins["adversary"], "sandbox", how], dump, env={"MMLEAK_ROTATE_MB": "1"},
                   check=False)
    assert (r.returncode, r.stdout) == (0, b"sandbox done\n"), r
    assert mmleak_lines(r.stderr) == [
        "mmleak: the program enters seccomp with a filter that refuses openat, a system "
        "call of mmleak's: tracing ends here (the trace is complete up to this point)"]
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "adversary")
    assert got == exp([adv(0, "sandbox_before", 755, fn="sandbox")])
    assert sh.gap_text() is None


# -- 6 ------------------------------------------------------------------------------------
def test_vfork_child_allocating_before_exec(bins, dump, mm):
    """A vfork() child shares its parent's memory: what it allocates (and flushes) before
    exec is the parent's, and the parent's trace goes on under the same id, complete."""
    r = run_traced([bins["adversary"], "vfork"], dump)
    assert r.stdout == b"vfork child 0\n" and r.stderr == b""
    t = traces(mm, dump)
    # the parent's trace holds the one dump file (the exec'd child's image wrote none); not
    # by the smaller pid: pids wrap around
    with_files = [k for k in t if t[k]]
    assert len(with_files) == 1, t
    parent = with_files[0]
    assert "-" not in parent and len(t[parent]) == 1
    assert not [n for n in os.listdir(dump) if n.endswith(".tail")]
    got, sh = leaks(dump, parent, "adversary")
    assert got == exp([adv(0, "vfork_before", 801, fn="do_vfork"),
                       adv(0, "vfork_child", 802, fn="do_vfork"),
                       adv(0, "vfork_after", 803, fn="do_vfork")])
    assert sh.foreign_frees() == [] and not sh.problems.counts


def test_raw_fork_syscall_child_gets_its_own_trace(bins, dump, mm):
    """A child of a raw fork system call skips glibc's atfork handlers: it must not write
    into its parent's staging area (its events were overwritten there)."""
    r = run_traced([bins["adversary"], "rawfork"], dump)
    assert r.stdout == b"raw child 0\n" and r.stderr == b""
    t = traces(mm, dump)
    assert len(t) == 2
    # the parent wrote more events than the child (not the smaller pid: pids wrap around)
    child, parent = sorted(t, key=lambda k: leaks(dump, k, "adversary")[1].events)
    got, sh = leaks(dump, parent, "adversary")
    assert got == exp([adv(0, "raw_before", 811, fn="rawfork"),
                       adv(0, "raw_after", 813, fn="rawfork")])
    assert sh.events == 1 + 200 + 1 + 6000 and sh.foreign_frees() == []
    got, sh = leaks(dump, child, "adversary")
    assert got == exp([adv(0, "raw_child", 812, fn="rawfork")])
    assert sh.events == 1 + 6000


# -- 9 ------------------------------------------------------------------------------------
def test_chroot_keeps_tracing(bins, dump, mm, tmp_path):
    """After chroot() into an empty directory (no /proc, no dump directory inside), the
    trace goes on: exact leaks before and after, the files complete."""
    if os.geteuid() != 0:
        pytest.skip("chroot() needs root")
    jail = tmp_path / "jail"
    jail.mkdir()
    r = run_traced([bins["adversary"], "chroot", str(jail)], dump)
    assert r.stderr == b""
    tid = next(iter(traces(mm, dump)))
    assert not [n for n in os.listdir(dump) if n.endswith(".tail")]
    got, sh = leaks(dump, tid, "adversary")
    assert got == exp([adv(0, "chroot_before", 901, fn="do_chroot"),
                       adv(0, "chroot_after", 902, fn="do_chroot")])
    assert sh.events == 2 + 20000


def test_chroot_then_closing_every_descriptor_says_why(bins, dump, mm, tmp_path):
    """A daemon that closes every descriptor after chroot() takes away the one mmleak keeps
    for its directory: mmleak says so (the true reason, not "the file was removed")."""
    if os.geteuid() != 0:
        pytest.skip("chroot() needs root")
    jail = tmp_path / "jail"
    jail.mkdir()
    r = run_traced([bins["adversary"], "chroot", str(jail), "closeall"], dump)
    lines = mmleak_lines(r.stderr)
    assert len(lines) == 1 and "closed the directory descriptor mmleak keeps after chroot()" \
        in lines[0], lines


# -- 11 -----------------------------------------------------------------------------------
def test_too_long_mmleak_dir_is_refused(bins, tmp_path):
    long_dir = str(tmp_path) + "/" + "/".join(["d" * 200] * 25)
    before = set(os.listdir("/"))
    r = run_traced([bins["adversary"], "plain"], long_dir)
    assert mmleak_lines(r.stderr) == ["mmleak: MMLEAK_DIR is too long: tracing disabled "
                                      "(at most 4000 bytes)"]
    assert set(os.listdir("/")) == before


def test_relative_mmleak_dir_with_an_unresolvable_cwd_is_refused(bins, tmp_path):
    """A relative MMLEAK_DIR is made absolute with getcwd(); when that fails (here: a
    working directory deeper than the room for the path) tracing is refused with one line,
    never turned into "/" + the relative name."""
    fd = os.open(str(tmp_path), os.O_RDONLY)
    for _ in range(25):                         # longer than PATH_MAX: one level at a time
        os.mkdir("d" * 200, dir_fd=fd)
        nfd = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    before = set(os.listdir("/"))

    def into_deep():
        for part in ["d" * 200] * 25:
            os.chdir(part)

    r = subprocess.run([bins["adversary"], "plain"], cwd=str(tmp_path), preexec_fn=into_deep,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR="rel"),
                       capture_output=True, timeout=30)
    assert r.returncode == 0
    assert mmleak_lines(r.stderr) == ["mmleak: MMLEAK_DIR=rel is relative and the current "
                                      "directory cannot be resolved: tracing disabled (give "
                                      "an absolute MMLEAK_DIR)"]
    assert set(os.listdir("/")) == before


def test_relative_mmleak_dir_with_a_removed_cwd_names_the_real_place(bins, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    before = set(os.listdir("/"))
    r = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && LD_PRELOAD="$3" MMLEAK_DIR=rel '
                        'exec "$2" plain', "sh", str(gone), bins["adversary"], LIB],
                       capture_output=True, timeout=30)
    assert r.returncode == 0
    lines = mmleak_lines(r.stderr)
    assert len(lines) == 1 and "tracing disabled" in lines[0], lines
    assert " /rel" not in lines[0]
    assert set(os.listdir("/")) == before


# -- 12 -----------------------------------------------------------------------------------
def test_new_handler_allocations_and_bad_alloc_are_recorded(bins, dump, mm):
    """A failing operator new runs libstdc++'s new_handler loop: what the handler allocates
    and frees is recorded, the std::bad_alloc object is allocated and freed in the trace
    (not a "free of a block allocated before tracing"), and a retry that succeeds after the
    handler freed memory is the user's `new`, on the user's line."""
    plain = subprocess.run([bins["badalloc"], "handlers"], capture_output=True, timeout=60)
    r = run_traced([bins["badalloc"], "handlers"], dump)
    assert r.stdout == plain.stdout == b"caught=1 handler_calls=1 retry=pointer\n"
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "badalloc")
    assert got == expect("badalloc.cpp", [("greedy_handler", "handler", 1201, 2),
                                          ("handlers", "new_retry", 500 << 20, 1)])
    assert sh.foreign_frees() == []


def test_kept_bad_alloc_is_a_leak_at_the_users_new(bins, dump, mm):
    """The std::bad_alloc of a failing `new`, kept with std::current_exception and never
    released: one leak of its size at the user's `new`.  libstdc++ allocates it inside the
    operator mmleak.so retries (new_failed), and mmleak.so's frames are passed as the
    runtime's (it was reported at mmleak.c's line)."""
    r = run_traced([bins["badalloc"], "keep"], dump)
    assert r.stdout == b"kept=1\n"
    tid = next(iter(traces(mm, dump)))
    rep = mm.build_report(str(dump), tid, progress=False)
    sites = mm.leak_sites(rep["survivors"], rep["end_time"], rep["trace_depth"], rep["frames"],
                          mm.Wrappers())
    got = collections.Counter()
    for st in sites:
        fr = rep["frames"].get(st.caller)
        if fr and fr.file and fr.file.endswith("badalloc.cpp"):
            got[(mm.base_name(fr.function), fr.line)] += st.blocks
    line = site_line("badalloc.cpp", "kept_exception")
    assert got[("keep_exception", line)] == 1, got
    (ex,) = [st for st in sites if rep["frames"].get(st.caller) and
             rep["frames"][st.caller].line == line]
    assert ex.bytes > 0 and not mm.is_runtime(rep["frames"][ex.caller])


@pytest.mark.parametrize("other", [None, JEMALLOC, TCMALLOC], ids=["libc", "jemalloc", "tcmalloc"])
@pytest.mark.parametrize("form", ["plain", "array", "nothrow", "aligned", "alnothrow"])
def test_failing_new_retry_is_the_users_new_in_every_form(bins, dump, mm, form, other):
    """Every form of operator new whose malloc fails, then succeeds after the new_handler
    freed memory: the 500 MiB block is the user's `new`, at its line.  The nothrow forms call
    the throwing ones inside libstdc++ (a nested failure: its block was put at mmleak.c's
    line), and the operators of jemalloc and tcmalloc allocate inside themselves (the block
    was at mmleak.c's line, or not recorded at all)."""
    if other and not os.path.exists(other):
        pytest.skip("%s not installed (.ci/run installs it)" % other)
    pre = LIB + (" " + other if other else "")
    plain = subprocess.run([bins["badalloc"], "retry", form], capture_output=True, timeout=60,
                           env=dict(os.environ, LD_PRELOAD=other or ""))
    r = run_traced([bins["badalloc"], "retry", form], dump, env={"LD_PRELOAD": pre})
    assert r.stdout == plain.stdout == b"%s: handler_calls=1 retry=pointer\n" % form.encode()
    assert r.stderr == b""
    tid = next(iter(traces(mm, dump)))
    got, sh = leaks(dump, tid, "badalloc")
    assert got == expect("badalloc.cpp", [("retry", "retry_" + form, 500 << 20, 1)])
    assert sh.foreign_frees() == []


def test_a_threads_first_event_takes_little_more_stack_than_glibc(bins, tmp_path):
    """A thread's first event is mmleak's deepest moment (its files are made): it must fit in
    about what glibc's own first malloc of a thread takes (it makes the thread's arena), so
    that a thread with little stack left does not crash traced where it runs untraced.  It
    took 6.6 KB more before the file names were built in buffers of their own length and the
    header written straight into the staging half."""
    def used(env):
        r = subprocess.run([bins["stackuse"]], env=env, capture_output=True, text=True,
                           check=True, timeout=60)
        return int(r.stdout)
    base = used(dict(os.environ))
    for depth in (None, "1", "16"):
        env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(tmp_path))
        if depth:
            env["MMLEAK_DEPTH"] = depth
        got = used(env)
        assert got - base <= 1536, (depth, got, base)
        assert [n for n in os.listdir(tmp_path) if n.endswith(".out")], "it was traced"
        for n in os.listdir(tmp_path):
            os.unlink(os.path.join(tmp_path, n))


def forge_status(pid, text):
    """Write TEXT into mmleak.so's status word in process PID (what the process itself can
    do: the word is in its memory), as /proc/PID/mem lets root."""
    from mmleaklib import attach
    lib = attach.mmleak_in(pid)
    with open("/proc/%d/maps" % pid) as f:
        base = next(int(l.split("-")[0], 16) for l in f
                    if l.rstrip("\n").endswith(" " + lib) and int(l.split()[2], 16) == 0)
    off, size = attach._elf_symbol(lib, "mmleak_status")
    assert len(text) < size
    with open("/proc/%d/mem" % pid, "r+b", buffering=0) as m:
        m.seek(base + off)
        m.write(text.encode() + b"\0")


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a process of nobody's")
def test_scan_pid_writes_only_where_the_process_really_traces(tmp_path):
    # `mmleak.py scan PID` took the trace's id and directory from mmleak.so's status word,
    # in the process's memory: a process of nobody's that wrote "tracing ID DIR" there made
    # root's scan write mmleak.ID.scan.1 into root's own directory, or into another user's
    # trace (given to that user, and read by that trace's report as its newest scan).  The
    # .maps of the trace named must be a file of the process's user.  Its own still scans.
    from conftest import tree_for_others
    from test_shared_tmp import NOBODY, plant_trace
    lib = os.path.join(tree_for_others("mmleak.so"), "mmleak.so")
    share = tempfile.mkdtemp(prefix="mmleak-share-", dir="/tmp")
    os.chmod(share, 0o1777)
    mine = tmp_path / "root"
    mine.mkdir(mode=0o755)
    plant_trace(share, 99994, 1)                  # daemon's (uid 1) trace
    p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, user=NOBODY, group=NOBODY,
                         extra_groups=[], env=dict(PATH=os.environ["PATH"], LD_PRELOAD=lib,
                                                   MMLEAK_DIR=share))
    try:
        from mmleaklib import attach
        for _ in range(500):
            state = attach.traced_state(p.pid) or ""
            if state.startswith("tracing"):
                break
            time.sleep(0.01)
        own = state.split()[1]
        for tid, d, owner in (("99994", share, "uid 1's"), (own, str(mine),
                                                             "no file of anybody's")):
            forge_status(p.pid, "tracing %s %s" % (tid, d))
            r = subprocess.run(["/usr/bin/python3", MMLEAK, "scan", str(p.pid)],
                               capture_output=True, text=True, timeout=120)
            assert (r.returncode, r.stdout, r.stderr) == (
                2, "", "mmleak.py: process %d says it traces %s into %s, but mmleak.%s.maps "
                "there is %s, not the process's user's (uid %d): not scanned\n"
                % (p.pid, tid, d, tid, owner, NOBODY))
        assert os.listdir(str(mine)) == []
        assert not [n for n in os.listdir(share) if ".scan" in n]
        forge_status(p.pid, "tracing %s %s" % (own, share))
        r = subprocess.run(["/usr/bin/python3", MMLEAK, "scan", "--quiet", str(p.pid)],
                           capture_output=True, text=True, timeout=120)
        assert (r.returncode, r.stderr) == (0, "")
        st = os.lstat(os.path.join(share, "mmleak.%s.scan.1" % own))
        assert (st.st_uid, st.st_mode & 0o777) == (NOBODY, 0o600)
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(share)


def test_status_shows_a_forged_state_and_command_line_printable(tmp_path):
    # `status` (and detach's lines, mmleak-install.py status) print mmleak.so's status word
    # and the command line, both the process's to write: an escape or a newline there went
    # to the terminal as it was
    p = subprocess.Popen(["cat", "-", "\x1b[2J\nx"], stdin=subprocess.PIPE,
                         env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(tmp_path)))
    try:
        from mmleaklib import attach
        for _ in range(500):
            if (attach.traced_state(p.pid) or "").startswith("tracing"):
                break
            time.sleep(0.01)
        forge_status(p.pid, "tracing 1 /\x1b]0;owned\x07\n\x9b")
        r = subprocess.run(["/usr/bin/python3", MMLEAK, "status"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        (mine,) = [l for l in r.stdout.split("\n") if l.split()[:1] == [str(p.pid)]]
        assert mine.split(None, 1)[1].split() == [
            "tracing", "1", "/\\x1b]0;owned\\x07\\x0a\\x9b", "cat", "-", "\\x1b[2J\\x0ax"]
        assert r.stdout.count("\n") == len(r.stdout.splitlines())
    finally:
        p.kill()
        p.wait()
