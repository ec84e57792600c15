"""A dump directory others can write to, and a process that cannot write for a while (issue
17, the tracer's side): names planted for a pid to come, FIFOs and links at the names of
mmleak's files, a name taken away while the trace runs, a transient EMFILE, and the title a
process gives itself.  Each test runs real processes and failed before the fix it guards.

The planting user is nobody (65534); the traced program runs as root, in a directory with
the mode of /tmp (1777).  A program whose pid must be known before it starts is started by
a shell that waits for a line on stdin, then execs it under mmleak.so (the same pid)."""
import contextlib
import html
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from conftest import LIB, ROOT, TESTS, expect, leaks, lib_for_others, site_line

MMLEAK = os.path.join(ROOT, "mmleak.py")
NOBODY = 65534


@contextlib.contextmanager
def run_like_dir():
    """A directory as mmleak.py run's own: root's, 0755, the directories above it searchable
    by anyone (tmp_path's are not); removed after."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="mmleak-root.", dir="/tmp"))
    try:
        os.chmod(str(d), 0o755)
        yield d
    finally:
        shutil.rmtree(str(d))


def uid_drop(tmp_path):
    """tests/uid_drop.c, built in TMP_PATH: its path."""
    exe = str(tmp_path / "uid_drop")
    subprocess.run(["cc", "-O1", "-g", "-o", exe, os.path.join(TESTS, "uid_drop.c")],
                   check=True)
    return exe

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another user")


@pytest.fixture
def shared():
    """A directory like /tmp, in /tmp (every directory up to it open to other users): anybody
    writes, nobody removes another's files."""
    d = tempfile.mkdtemp(prefix="mmleak-shared.", dir="/tmp")
    os.chmod(d, 0o1777)
    yield pathlib.Path(d)
    shutil.rmtree(d)


@pytest.fixture(scope="module")
def race_lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("race")
    so = str(d / "rename_race.so")
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", so,
                    os.path.join(TESTS, "rename_race.c"), "-ldl"], check=True)
    return so


def launch(argv, dump, env=None, preload=LIB):
    """ARGV, started but not yet run: returns the Popen (its pid is the trace's); go(p)
    lets it run, under mmleak.so."""
    e = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    e.update({"MMLEAK_DIR": str(dump), "MMLEAK_TEST_PRELOAD": preload})
    e.update(env or {})
    return subprocess.Popen(
        ["/bin/sh", "-c", 'read go; export LD_PRELOAD="$MMLEAK_TEST_PRELOAD"; '
         'unset MMLEAK_TEST_PRELOAD; exec "$@"', "sh"] + list(argv),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e)


def go(p, more=b""):
    p.stdin.write(b"go\n" + more)
    p.stdin.flush()


def finish(p, more=b"", timeout=60):
    """Send MORE, close stdin, wait (a process that hangs fails the test, killed)."""
    try:
        out, err = p.communicate(more, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("the traced program hung")
    return out, err


def plant(path, fifo=False):
    if fifo:
        os.mkfifo(path, 0o600)
    else:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def mmleak_lines(err):
    return [l for l in err.decode().splitlines() if l.startswith("mmleak:")]


def ours(mm, dump):
    """{trace id: its dump files} of the traces whose files root made (not the planted)."""
    got = {}
    for tid, files in mm.find_traces(str(dump)).items():
        mine = [f for f in files if os.stat(f).st_uid == 0]
        if mine:
            got[tid] = files
    return got


def adv(site, size, fn, n=1):
    return (fn, site, size, n)


def basic_expected():
    from test_tracer import basic_expected as b
    return b()


def report(d):
    return subprocess.run(["/usr/bin/python3", MMLEAK, "report", str(d), "--no-html"],
                          capture_output=True, text=True, timeout=120)


# -- 4: names planted for a pid to come ---------------------------------------------------
def test_thousands_of_planted_dump_names_do_not_blind_the_trace(bins, mm, shared):
    """Another user creates 5,000 empty mmleak.PID.N.out for the pid to come: the program
    still gets its files (the names are skipped), the trace is exact, and one message says
    what happened in words.  (It got no file: "0 events, no leaks", and "errno 17".)"""
    p = launch([bins["hostile"], "basic"], shared)
    for n in range(5000):
        plant(str(shared / ("mmleak.%d.%d.out" % (p.pid, n))))
    go(p)
    out, err = finish(p)
    assert p.returncode == 0, err
    assert mmleak_lines(err) == [
        "mmleak: names of dump files in %s are taken by files mmleak did not make (planted by "
        "another user?): they are skipped, and this trace's files are numbered past them"
        % shared]
    assert list(ours(mm, shared)) == [str(p.pid)]
    got, sh = leaks(shared, str(p.pid), "hostile")
    assert got == basic_expected()
    assert sh.gap_text() is None
    planted = [n for n in os.listdir(shared) if os.stat(shared / n).st_uid == NOBODY]
    assert len(planted) == 5000 and all(os.path.getsize(shared / n) == 0 for n in planted)


def test_planted_names_never_lose_the_count_of_dropped_events(bins, mm, shared):
    """The same, while the program drops events (no descriptor left for far longer than
    memory may hold, MMLEAK_HOLD_MB=1): every event is recorded or counted, and the report
    says the trace is incomplete.  (The count was lost with the files never made: the report
    said "no leaks", exit 0.)"""
    p = launch([bins["adversary"], "nofile", "100000", "100"], shared,
               env={"MMLEAK_HOLD_MB": "1"})
    for n in range(5000):
        plant(str(shared / ("mmleak.%d.%d.out" % (p.pid, n))))
    go(p)
    out, err = finish(p)
    assert out == b"nofile done\n", err
    sh = mm.shrink_files(ours(mm, shared)[str(p.pid)])
    lost, unknown = sh.gaps()
    total = 1 + 100 * 2 + 1 + 100000 * 2 + 1 + 5000 * 2 + 1
    assert unknown == 0 and 150000 < lost < 200002
    assert sh.events + lost == total
    rep = report(shared)
    # 2: files were ignored (the planted ones, one line); the trace says it lost events
    assert rep.returncode == 2
    assert "INCOMPLETE TRACE: %d events were not recorded" % lost in rep.stdout


def test_planted_trace_ids_do_not_disable_tracing(bins, mm, shared):
    """Another user creates mmleak.PID.maps and mmleak.PID-1.maps ... PID-999.maps: the
    program is traced all the same, under PID-T (T: microseconds since 1970, so that a later
    image of the process still sorts after it).  (Tracing was disabled: "errno 17".)"""
    p = launch([bins["hostile"], "basic"], shared)
    for k in range(1000):
        plant(str(shared / ("mmleak.%d%s.maps" % (p.pid, "-%d" % k if k else ""))))
    go(p)
    out, err = finish(p)
    assert p.returncode == 0, err
    assert mmleak_lines(err) == [
        "mmleak: names of trace files in %s are taken by files mmleak did not make (planted "
        "by another user?): this trace's id is the pid and the time in microseconds" % shared]
    (tid,) = ours(mm, shared)
    pid, k = tid.split("-")
    assert pid == str(p.pid) and int(k) > 10 ** 15
    got, sh = leaks(shared, tid, "hostile")
    assert got == basic_expected() and sh.gap_text() is None


# -- 5: FIFOs and links at the names of mmleak's files --------------------------------------
def test_a_fifo_at_the_loads_name_never_hangs_the_program(bins, mm, shared):
    """A FIFO planted at mmleak.PID.loads: the program hung for ever at its first dlclose
    (holding mmleak's lock).  The log of loads is now made with the trace id, O_EXCL: the
    planted name makes the id PID-1, whose log is written; the FIFO is left alone."""
    p = launch([bins["hostile"], "dl", bins["libdl_test.so"]], shared)
    fifo = str(shared / ("mmleak.%d.loads" % p.pid))
    plant(fifo, fifo=True)
    go(p)
    out, err = finish(p, timeout=30)
    assert p.returncode == 0 and err == b"", err
    st = os.lstat(fifo)
    assert stat.S_ISFIFO(st.st_mode) and st.st_uid == NOBODY
    assert list(ours(mm, shared)) == ["%d-1" % p.pid]
    loads = shared / ("mmleak.%d-1.loads" % p.pid)
    st = os.lstat(loads)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
    lines = loads.read_text().splitlines()
    signs = [l.split()[0] for l in lines if l.endswith("libdl_test.so")]
    assert set(signs) == {"+0", "-1"} and signs.count("+0") == signs.count("-1")
    got, sh = leaks(shared, "%d-1" % p.pid, "libdl_test.so")
    assert got == expect("dl_lib.c", [("dl_leak", "dl", 901, 1)])


def test_a_fifo_put_at_a_dump_files_name_while_it_runs(bins, mm, shared):
    """The thread's .out is deleted while the program runs (a compactor that took the trace
    for over, a careless cleaner) and another user puts a FIFO at its name: the next flush
    hung for ever, opening the FIFO.  Now it is refused (O_NONBLOCK, fstat, the file's
    identity), the thread goes on in a new file with everything it had staged, one message
    says so, and the trace is exact."""
    p = launch([bins["adversary"], "pause", "20000"], shared)
    go(p)
    assert p.stdout.readline() == b"ready\n"
    (out,) = [f for f in os.listdir(shared) if f.endswith(".out")]
    os.unlink(shared / out)
    plant(str(shared / out), fifo=True)
    out_, err = finish(p, b"x", timeout=30)
    assert out_ == b"pause done\n" and p.returncode == 0, err
    assert mmleak_lines(err) == [
        "mmleak: a dump file in %s: what stands at the name of a file of mmleak's is not that "
        "file (a FIFO, a device, another user's file or a link: planted?); its thread goes on "
        "in a new file" % shared]
    assert stat.S_ISFIFO(os.lstat(shared / out).st_mode)
    os.unlink(shared / out)             # the readers' business (they must not open it)
    got, sh = leaks(shared, str(p.pid), "adversary")
    assert got == expect("adversary.c", [adv("pause_before", 541, "pause_churn"),
                                         adv("pause_after", 542, "pause_churn")])
    assert sh.gap_text() is None and sh.events == 2 + 2 * 100 + 2 * 20000


def test_a_staging_file_swapped_before_its_rename_at_rotation(bins, mm, shared, race_lib):
    """At rotation the thread's staging file is renamed to the next file's name.  If the old
    name was taken away and another user's FIFO put there just before (tests/rename_race.c
    makes that race certain), the FIFO became the new file's staging file, and the lines
    staged since were in a deleted file: a SIGKILL lost them.  Now the rename goes onto a
    name made with O_EXCL, is checked to have moved our file, and otherwise the thread goes
    on in a new file: every staging file is ours, and a killed process loses nothing."""
    p = launch([bins["adversary"], "pause", "40000", "wait"], shared,
               env={"MMLEAK_ROTATE_MB": "1"}, preload=race_lib + ":" + LIB)
    go(p, b"x")
    assert p.stdout.readline() == b"ready\n"
    assert p.stdout.readline() == b"pause done\n"
    tails = [n for n in os.listdir(shared) if n.endswith(".tail")]
    for n in tails:
        st = os.lstat(shared / n)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0, n
    p.kill()
    p.communicate()
    assert len(ours(mm, shared)[str(p.pid)]) >= 3      # it did rotate
    got, sh = leaks(shared, str(p.pid), "adversary")
    assert got == expect("adversary.c", [adv("pause_before", 541, "pause_churn"),
                                         adv("pause_after", 542, "pause_churn")])
    assert sh.gap_text() is None and sh.events == 2 + 2 * 100 + 2 * 40000


def test_a_hard_link_at_a_freed_name_is_not_given_away(bins, mm, shared, tmp_path):
    """A daemon drops root: mmleak hands its files to the new user.  It did so by name, so a
    name freed meanwhile and made a hard link to a file of root's (fs.protected_hardlinks=0)
    gave root's file away.  Now a file is handed by its descriptor, only if it is still the
    file mmleak made."""
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    os.chmod(victim, 0o600)
    p = launch([bins["adversary"], "setuid_pause"], shared)
    go(p)
    assert p.stdout.readline() == b"ready\n"
    loads = shared / ("mmleak.%d.loads" % p.pid)
    if os.path.exists(loads):
        os.unlink(loads)
    os.link(victim, loads)
    out, err = finish(p, b"x")
    assert out == b"setuid done\n" and p.returncode == 0, err
    st = os.stat(victim)
    assert (st.st_uid, victim.read_text()) == (0, "root's\n")
    got, sh = leaks(shared, str(p.pid), "adversary")
    assert got == expect("adversary.c", [adv("setuid_before", 551, "setuid_pause"),
                                         adv("setuid_after", 552, "setuid_pause")])
    assert sh.gap_text() is None


def test_maps_written_when_another_user_holds_its_temporary_name(bins, mm, shared):
    """The maps file is rewritten to mmleak.ID.maps.tmp and renamed when a library is loaded
    (the first version is written into the .maps made for the trace's id).  Another user's
    file at that name cannot be removed by a traced program that is not root (the sticky
    bit): the maps file stayed without the library and its call sites could not be named.
    Now another, unguessable, temporary name is taken."""
    bindir = shared / "bin"             # the programs and mmleak.so, for nobody to run
    bindir.mkdir()
    os.chmod(bindir, 0o755)
    prog, lib = str(bindir / "hostile"), str(bindir / "mmleak.so")
    dl = str(bindir / "libdl_test.so")
    shutil.copy2(bins["hostile"], prog)
    shutil.copy2(bins["libdl_test.so"], dl)
    shutil.copy2(LIB, lib)
    p = subprocess.Popen(
        ["/bin/sh", "-c", 'read go; export LD_PRELOAD="$MMLEAK_TEST_PRELOAD"; exec "$@"', "sh",
         prog, "dl", dl],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
                 MMLEAK_DIR=str(shared), MMLEAK_TEST_PRELOAD=lib),
        preexec_fn=lambda: (os.setgroups([]), os.setresgid(NOBODY, NOBODY, NOBODY),
                            os.setresuid(NOBODY, NOBODY, NOBODY)))
    tmp = str(shared / ("mmleak.%d.maps.tmp" % p.pid))
    plant(tmp)
    os.chown(tmp, 1, 1)                 # daemon: neither root nor the traced user
    go(p)
    out, err = finish(p)
    assert p.returncode == 0 and err == b"", err
    maps = shared / ("mmleak.%d.maps" % p.pid)
    assert os.stat(maps).st_uid == NOBODY and b"libdl_test.so" in maps.read_bytes()
    assert os.stat(tmp).st_uid == 1     # (left alone)
    got, sh = leaks(shared, str(p.pid), "libdl_test.so")
    assert got == expect("dl_lib.c", [("dl_leak", "dl", 901, 1)])


# -- 10: a transient EMFILE -----------------------------------------------------------------
def test_a_transient_emfile_loses_no_event(bins, mm, dump):
    """RLIMIT_NOFILE 64, every descriptor taken, while 10,000 events happen; then they are
    closed and one block leaks: the events wait in memory, the leak is reported, and the
    trace is complete.  (9,215 events were dropped, the leak among them.)"""
    r = subprocess.run([bins["adversary"], "nofile_leak", "5000"], capture_output=True,
                       timeout=60, env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump)))
    assert r.returncode == 0 and r.stdout == b"nofile_leak done\n"
    lines = mmleak_lines(r.stderr)
    assert len(lines) == 1 and "no file descriptor left (RLIMIT_NOFILE)" in lines[0], lines
    (tid,) = mm.find_traces(str(dump))
    got, sh = leaks(dump, tid, "adversary")
    assert got == expect("adversary.c", [adv("nofile_leak_pre", 505, "nofile_leak"),
                                         adv("nofile_leak", 506, "nofile_leak")])
    assert sh.gap_text() is None
    assert (sh.allocs, sh.events) == (1 + 5000 + 1, 2 + 2 * 5000)
    rep = report(dump)
    assert rep.returncode == 0 and "INCOMPLETE" not in rep.stdout


def test_held_events_are_written_while_the_program_runs_on(bins, mm, dump):
    """Writing is tried again as soon as it can succeed, not at the end: once descriptors
    are free, a few hundred events later (HOLD_STEP) everything held is in the files, and a
    report of the running program sees a complete trace."""
    p = subprocess.Popen([bins["adversary"], "nofile_leak", "5000", "300"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump)))
    try:
        assert p.stdout.readline() == b"ready\n"
        (tid,) = mm.find_traces(str(dump))
        sh = mm.shrink_files(mm.find_traces(str(dump))[tid])
        assert sh.gap_text() is None
        assert sh.events == 1 + 2 * 5000 + 2 * 300
    finally:
        out, err = finish(p, b"x")
    assert out == b"nofile_leak done\n"
    got, sh = leaks(dump, tid, "adversary")
    assert got == expect("adversary.c", [adv("nofile_leak_pre", 505, "nofile_leak"),
                                         adv("nofile_leak", 506, "nofile_leak")])
    assert sh.gap_text() is None and sh.events == 2 + 2 * 5000 + 2 * 300


# -- 15: the title a process gives itself ---------------------------------------------------
def test_the_title_a_process_had_at_its_end_is_recorded(bins, mm, dump):
    """A worker writes its title over its arguments (PostgreSQL's backends, nginx's workers):
    "#cmd" is the command line at the start, "#title" what /proc/PID/cmdline says when the
    file is closed, and the report shows the title with the command it started as."""
    r = subprocess.run([bins["adversary"], "retitle", "adversary: worker 7 idle"],
                       capture_output=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump)))
    assert r.returncode == 0 and r.stdout == b"retitle done\n"
    (tid,) = mm.find_traces(str(dump))
    (f,) = mm.find_traces(str(dump))[tid]
    text = open(f, "rb").read()
    cmd = "%s retitle adversary: worker 7 idle" % bins["adversary"]
    assert b"\n#cmd %s\n" % cmd.encode() in text
    assert re.search(rb"\n#title t=[0-9]+ adversary: worker 7 idle\n#end\n\Z", text)
    sh = mm.shrink_files([f])
    assert (sh.cmd, sh.title) == (cmd, "adversary: worker 7 idle")
    rep = report(dump)
    assert rep.stdout.splitlines()[0] == (
        "mmleak: trace %s (pid %s): adversary: worker 7 idle (started as: %s)" % (tid, tid, cmd))


def test_an_empty_log_of_loads_is_none(mm, tmp_path):
    """Every trace's log of loads is made with its id: a process killed before it unloaded
    anything leaves it empty, which readers take for no log (the whole maps file is used)."""
    maps = tmp_path / "mmleak.7.maps"
    maps.write_text("400000-401000 r-xp 00000000 fe:00 1 /bin/true\n")
    (tmp_path / "mmleak.7.loads").write_text("")
    assert mm.Symbolizer(str(maps)).loads is None
    (tmp_path / "mmleak.7.loads").write_text("+0 400000-401000 r-xp 00000000 fe:00 1 /bin/true\n")
    assert mm.Symbolizer(str(maps)).loads.log == [
        ("+", 0, "400000-401000 r-xp 00000000 fe:00 1 /bin/true\n")]


# -- 16: what a start-up and an exit do in the dump directory -------------------------------
def test_a_start_up_and_its_exit_scan_make_no_file_they_need_not(bins, mm, dump, tmp_path):
    """A small program's start-up and exit, its scan at exit included (mmleak-performance-heap(7),
    "Start-up and exit, the scan at exit's costs counted"): the trace's first maps file is
    written into the .maps that reserved its id, not into a temporary file renamed over it
    (an inode, a rename and an unlink of a name that is not there, at every start); the scan
    looks the trace's owner up once (its .maps: it did three times, for the lock, the cut
    and the result).  And ("Start-up and exit, the files a start makes"): in a directory of
    its own no .loads nor .lock is made, and the scan's result is renamed to its name with
    RENAME_NOREPLACE (it was linked, then its temporary name unlinked).  The trace and its
    verdict are as ever."""
    if not shutil.which("strace"):
        pytest.skip("strace not installed (.ci/run installs it)")
    log = tmp_path / "strace.log"
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(log),
                    "-E", "LD_PRELOAD=" + LIB, "-E", "MMLEAK_DIR=" + str(dump),
                    bins["hostile"], "basic"], check=True, capture_output=True, timeout=120)
    (tid,) = mm.find_traces(str(dump))
    calls = [l for l in log.read_text().splitlines() if str(dump) in l]
    maps = "mmleak.%s.maps" % tid
    assert not [l for l in calls if ".maps" in l and "rename" in l], calls
    creates = [l for l in calls if "O_CREAT" in l and " = -1 " not in l]
    assert any("/%s\"" % maps in l for l in creates), creates
    assert not [l for l in creates if l.split('"')[1].endswith((".loads", ".lock"))], creates
    (renamed,) = [l for l in calls if "rename" in l or "link(" in l]
    assert "RENAME_NOREPLACE" in renamed and ".scan.1\"" in renamed, renamed
    owner = [l for l in calls if "/%s\"" % maps in l and "stat" in l]
    assert len(owner) == 1, owner
    assert b"hostile" in (dump / maps).read_bytes()
    got, sh = leaks(dump, tid, "hostile")
    assert got == basic_expected() and sh.gap_text() is None
    (scan,) = dump.glob("mmleak.%s.scan.*" % tid)
    assert scan.read_bytes().startswith(b"#mmleak-scan 1 id=%s " % tid.encode())


def test_a_new_staging_file_is_not_cleared_page_by_page(dump, tmp_path):
    """A thread's new staging file is fallocated, so zeros: its first half (32 KiB) is no
    longer cleared before the first lines go in, which wrote (and faulted in) all 8 of its
    pages; now the pages its lines reach are the only ones mapped (smaps' Rss of the .tail:
    4 kB for a few lines, 32 kB before).  Nor read ahead: the first of those faults put the
    whole 64 KiB file in the page cache, 16 pages allocated and zeroed (mincore: 16 pages
    of the mapping resident before MADV_RANDOM, 1 now)."""
    src = tmp_path / "tailrss.c"
    src.write_text(
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
        "#include <sys/mman.h>\n"
        "int main(void) {\n"
        "    void *volatile p = malloc(100);\n"
        "    FILE *f = fopen(\"/proc/self/smaps\", \"r\");\n"
        "    char line[512], perm[8];\n"
        "    unsigned long lo, hi, cached = 0;\n"
        "    unsigned char vec[64];\n"
        "    int in = 0;\n"
        "    while (f && fgets(line, sizeof line, f)) {\n"
        "        if (sscanf(line, \"%lx-%lx %7s\", &lo, &hi, perm) == 3) {\n"
        "            in = strstr(line, \".tail\\n\") != NULL;\n"
        "            if (in && hi - lo <= sizeof vec * 4096 && !mincore((void *)lo, hi - lo, vec))\n"
        "                for (unsigned long i = 0; i < (hi - lo) / 4096; i++)\n"
        "                    cached += vec[i] & 1;\n"
        "        } else if (in && !strncmp(line, \"Rss:\", 4))\n"
        "            printf(\"tail %ld\\n\", atol(line + 4));\n"
        "    }\n"
        "    printf(\"cached %lu\\n\", cached);\n"
        "    free(p);\n"
        "    return 0;\n}\n")
    exe = str(tmp_path / "tailrss")
    subprocess.run(["cc", "-O1", "-o", exe, str(src)], check=True)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump)))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "tail 4\ncached 1\n", r.stdout


@pytest.mark.parametrize("mode", [0o700, 0o1777])
def test_the_files_that_only_hold_names_wait_in_a_directory_of_ones_own(tmp_path, mode):
    """The .loads and the .lock are made empty at a start so that nobody else's file can
    stand at their names when they are needed.  In a directory only its owner can write
    (0700, 0755: ours, no write bit for group or others), nobody else can: there they wait
    for their first need (mmleak-performance-heap(7), "Start-up and exit, the files a start
    makes": two inodes made and one removed at every start), the log of loads for its first
    line, the lock for the first compactor.  In a directory others write to (1777), they are
    made at the start, as ever.  A name already taken in one's own directory (an older
    trace's file) still takes the id."""
    d = tmp_path / "d"
    d.mkdir()
    os.chmod(str(d), mode)
    own = mode == 0o700
    if own:
        (d / "mmleak.99999999.loads").write_text("")     # not a pid: the stale-name check
    code = ("import ctypes, _ctypes, sys\n"
            "sys.stdin.readline()\n"
            "lib = ctypes.CDLL('libbz2.so.1.0')\n"
            "_ctypes.dlclose(lib._handle)\n"
            "print('unloaded', flush=True)\n"
            "sys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE,
                         env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(d)))
    try:
        def mine():
            return sorted(n.split(".", 2)[2] for n in os.listdir(str(d))
                          if n.startswith("mmleak.%d." % p.pid))
        p.stdin.write(b"\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"unloaded\n"
        names = mine()
        # (the dump files of the start: python's threads make none before the first line)
        assert [n for n in names if not n.endswith((".out", ".tail"))] == (
            ["loads", "maps"] if own else ["loads", "lock", "maps"]), names
        p.stdin.write(b"\n")
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    finally:
        p.kill()
        p.wait()
    loads = (d / ("mmleak.%d.loads" % p.pid)).read_text().splitlines()
    assert [l for l in loads if l.startswith("-") and "/libbz2.so" in l], loads
    names = mine()
    assert [n for n in names if not n.startswith(("0.", "1.", "2.", "3."))] == (
        ["loads", "maps", "scan.1"] if own else ["loads", "lock", "maps", "scan.1"]), names


def test_a_child_forked_with_one_descriptor_left_is_traced(dump, tmp_path):
    """A process that took every descriptor but one forks: its child's trace is reserved
    one descriptor at a time as ever (the .maps made for the id is held for its first
    version only while a second descriptor is free: tracing was disabled in the child,
    "cannot create files")."""
    src = tmp_path / "fdfork.c"
    src.write_text(
        "#include <fcntl.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
        "#include <sys/resource.h>\n#include <sys/wait.h>\n#include <unistd.h>\n"
        "int main(void) {\n"
        "    struct rlimit r = { 64, 64 };\n"
        "    setrlimit(RLIMIT_NOFILE, &r);\n"
        "    int last = -1, fd;\n"
        "    while ((fd = open(\"/dev/null\", O_RDONLY)) >= 0)\n"
        "        last = fd;\n"
        "    close(last);\n"
        "    pid_t c = fork();\n"
        "    if (c == 0) {\n"
        "        void *volatile p = malloc(77);\n"
        "        (void)p;\n"
        "        exit(0);\n"
        "    }\n"
        "    int st;\n"
        "    waitpid(c, &st, 0);\n"
        "    printf(\"child %d\\n\", (int)c);\n"
        "    return 0;\n}\n")
    exe = str(tmp_path / "fdfork")
    subprocess.run(["cc", "-O1", "-o", exe, str(src)], check=True)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump)))
    assert r.returncode == 0 and r.stdout.startswith("child "), r.stderr
    child = r.stdout.split()[1]
    assert "tracing disabled" not in r.stderr, r.stderr
    maps = dump / ("mmleak.%s.maps" % child)
    assert b"fdfork" in maps.read_bytes()
    assert (dump / ("mmleak.%s.0.out" % child)).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
@pytest.mark.parametrize("mode, owner", [("t", 0), ("p", NOBODY), ("ep", NOBODY)])
def test_a_drop_of_root_for_a_while_keeps_the_trace_roots(shared, tmp_path, mode, owner):
    """mmleak.so handed the trace to the new user at every seteuid: a root daemon serving a
    request as that user for a while (seteuid, then back) gave that user its trace for good,
    its addresses and all.  Now only a drop for good (no real, effective or saved uid left
    0) hands the files over; from a drop for a while (t) they stay root's, and a drop for
    good made from there (ep) takes root back, in the thread, to hand them over."""
    exe = uid_drop(tmp_path)
    r = subprocess.run([exe, mode, str(NOBODY)], capture_output=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(shared)))
    assert (r.returncode, r.stderr) == (0, b"")
    names = sorted(os.listdir(str(shared)))
    assert [n.split(".", 2)[2] for n in names] == ["0.out", "lock", "maps", "scan.1"], names
    assert {os.lstat(str(shared / n)).st_uid for n in names} == {owner}
    import mmleaklib as mm
    (paths,) = mm.find_traces(str(shared)).values()
    assert sorted(a.size for a in mm.shrink_files(paths).survivors()) == [100, 200, 300]


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
def test_frees_after_the_exit_of_a_process_that_cannot_create_files(tmp_path):
    """ngircd, started as root by mmleak.py run, becomes nobody; the frees its libraries'
    destructors make after mmleak.so's own need a new dump file once the thread's is ended,
    which nobody cannot create in run's directory (root's, 0755): they were lost, unsaid,
    and their 50 blocks reported not freed.  Now the thread's file stays open for them."""
    lib = str(tmp_path / "liblate.so")
    exe = str(tmp_path / "late_frees")
    src = os.path.join(TESTS, "late_frees.c")
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-DLIB", "-o", lib, src], check=True)
    subprocess.run(["cc", "-O1", "-g", "-o", exe, src, "-Wl,--no-as-needed", lib,
                    "-Wl,-rpath," + str(tmp_path)], check=True)
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    r = subprocess.run([exe, str(NOBODY)], capture_output=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(d)))
    assert r.returncode == 0, r.stderr
    import mmleaklib as mm
    (paths,) = mm.find_traces(str(d)).values()
    sh = mm.shrink_files(paths)
    assert sorted(a.size for a in sh.survivors()) == [33]
    rep = subprocess.run([MMLEAK, "report", str(d), "--no-html"], capture_output=True,
                         text=True, timeout=60)
    # (and the shared file made at the drop for threads started later: none was, see
    # test_threads_started_after_a_drop_of_root_into_a_directory_of_roots)
    assert "101 events read from 2 files; 33 B in 1 blocks not freed" in rep.stdout, \
        rep.stdout + rep.stderr
    assert "INCOMPLETE" not in rep.stdout
    assert shared_file_unused(paths)


def shared_file_unused(paths):
    """Whether the trace's PATHS hold one shared file made at a drop of root (the late file,
    header "late=1", see test_threads_started_after_a_drop_of_root_into_a_directory_of_roots)
    with nothing but its header lines."""
    late = []
    for p in paths:
        with open(p, "rb") as f:
            lines = f.read().splitlines()
        if lines and b" late=1" in lines[0]:
            late.append(lines)
    return len(late) == 1 and all(l.startswith(b"#") for l in late[0]) and \
        late[0][0].startswith(b"#mmleak ")


def run_uid_drop_as_root(tmp_path, mode):
    """tests/uid_drop.c's MODE run as root with its dump directory root's own (0755, as
    mmleak.py run's): the directory, once it ended well."""
    exe = uid_drop(tmp_path)
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    r = subprocess.run([exe, mode, str(NOBODY)], capture_output=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(d)))
    assert (r.returncode, r.stderr) == (0, b"")
    return d


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
def test_the_exit_scan_of_a_root_process_acting_as_another_user(tmp_path):
    """varnishd's manager keeps root as its real and saved uid and acts as user varnish
    (seteuid) until its exit: its files stay root's (a drop for a while), and its scan at the
    exit, which runs with its credentials, said "cannot open the trace's lock file:
    Permission denied" and gave no verdict.  The scan now works on them as their owner, as
    mmleak.so's own file operations do."""
    d = run_uid_drop_as_root(tmp_path, "e")
    names = sorted(os.listdir(str(d)))
    # (no lock: in a directory of root's own it waits for the first compactor, and the scan
    # takes a trace without one for a trace no pass ever changed)
    assert [n.split(".", 2)[2] for n in names] == ["0.out", "maps", "scan.1"], names
    assert {os.lstat(str(d / n)).st_uid for n in names} == {0}
    rep = subprocess.run([MMLEAK, "report", str(d), "--no-html"], capture_output=True,
                         text=True, timeout=60)
    assert "still reachable:       600 bytes in 3 blocks" in rep.stdout, rep.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
def test_a_drop_of_root_for_good_makes_the_files_that_waited(tmp_path):
    """In a directory of root's own (0755) the .loads and the .lock wait for a first need
    (mmleak-format(5)); a drop of root for good is one: the new user could not make them
    there, so mmleak.so makes them as root at the handover and gives them away with the
    others."""
    exe = uid_drop(tmp_path)
    d = pathlib.Path(tempfile.mkdtemp(prefix="mmleak-root755.", dir="/tmp"))
    try:
        os.chmod(str(d), 0o755)
        r = subprocess.run([exe, "p", str(NOBODY)], capture_output=True, timeout=60,
                           env=dict(os.environ, LD_PRELOAD=lib_for_others(), MMLEAK_DIR=str(d)))
        assert r.returncode == 0, r.stderr
        names = sorted(os.listdir(str(d)))
        held = [n for n in names if n.endswith((".loads", ".lock"))]
        assert [n.split(".", 2)[2] for n in held] == ["loads", "lock"], names
        for n in held:
            st = os.lstat(str(d / n))
            assert (st.st_uid, st.st_size, st.st_mode & 0o777) == (NOBODY, 0, 0o600), n
    finally:
        shutil.rmtree(str(d))


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
def test_a_child_forked_while_acting_as_another_user_is_traced(tmp_path):
    """proftpd's master acts as nobody (seteuid, root kept) and forks a child per session:
    the child's trace took nobody as its owner, who may not create files in a directory of
    root's: "cannot create files ... tracing disabled", none of the sessions traced.  The
    child now keeps its parent's owner, as whom its files are made."""
    d = run_uid_drop_as_root(tmp_path, "ef")
    import mmleaklib as mm
    traces = mm.find_traces(str(d))
    assert len(traces) == 2, sorted(os.listdir(str(d)))
    sizes = sorted(sorted(a.size for a in mm.shrink_files(p).survivors())
                   for p in traces.values())
    assert sizes == [[100, 200, 300], [400]]       # (a child's trace starts at its fork)
    assert {os.lstat(str(d / n)).st_uid for n in os.listdir(str(d))} == {0}


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="mmleak-scan takes over a big trace's scan on two CPUs or more only")
def test_a_big_trace_of_a_process_not_dumpable_is_scanned(shared, tmp_path):
    """A process that became another user with setuid is not dumpable; with a big trace (8
    MB and more of dump files) its scan at the exit went to mmleak-scan, a process of its
    own, which the kernel does not let read it: "/proc/PID/maps: Permission denied", no
    verdict (nsd; squid, whose saved uid stays root).  Now the scan stays in the child that
    shares the process's memory."""
    exe = uid_drop(tmp_path)
    r = subprocess.run([exe, "pr", str(NOBODY)], capture_output=True, timeout=120,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(shared)))
    assert (r.returncode, r.stderr) == (0, b"")
    names = sorted(os.listdir(str(shared)))
    assert sum(os.lstat(str(shared / n)).st_size for n in names if n.endswith(".out")) \
        >= 8 << 20, names
    assert [n for n in names if ".scan." in n], names
    rep = subprocess.run([MMLEAK, "report", str(shared), "--no-html"], capture_output=True,
                         text=True, timeout=120)
    assert "still reachable:       600 bytes in 3 blocks" in rep.stdout, rep.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
def test_a_rotation_after_a_drop_of_root_keeps_the_file(tmp_path):
    """nsd (and any daemon started as root by mmleak.py run) becomes a user who may not
    create files in run's directory (root's, 0755).  Its dump file reached MMLEAK_ROTATE_MB:
    the file was ended, the next one could not be made, the thread went on in memory, and
    all of it was lost at the exit, unsaid: the report gave a block freed after the rotation
    as not freed and missed the blocks allocated after it, without a word of a gap.  Now the
    thread goes on in the file it has, and says so once."""
    exe = uid_drop(tmp_path)
    with run_like_dir() as d:
        r = subprocess.run([exe, "pr", str(NOBODY)], capture_output=True, timeout=120,
                           env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(d),
                                    MMLEAK_ROTATE_MB="1"))
        assert r.returncode == 0, r.stderr
        assert b"cannot create a dump file in %s: permission denied" % bytes(d) in r.stderr
        assert b"goes on writing its current dump file" in r.stderr
        import mmleaklib as mm
        (paths,) = mm.find_traces(str(d)).values()
        # (1.out: the shared file made at the drop, unused)
        assert [os.path.basename(p).split(".", 2)[2] for p in paths] == ["0.out", "1.out"]
        assert shared_file_unused(paths)
        assert sorted(a.size for a in mm.shrink_files(paths).survivors()) == [100, 200, 300]
        rep = subprocess.run([MMLEAK, "report", str(d), "--no-html"], capture_output=True,
                             text=True, timeout=120)
        assert rep.returncode == 0 and "INCOMPLETE" not in rep.stdout, rep.stdout + rep.stderr
        assert "400003 events read from 2 files" in rep.stdout, rep.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
@pytest.mark.parametrize("mode, here, failed", [
    ("p", "1", ""),         # alone: the scan in a child sharing its memory (scanhere.c)
    ("pt", "1", ""),        # a second thread, parked by a signal of ours (park.c)
    # mmleak-scan, a program, which the kernel does not let read a process not dumpable
    ("p", "0", " (and the scan failed: /proc/{pid}/maps: Permission denied)")])
def test_a_scan_that_cannot_write_its_result_says_why_in_the_report(tmp_path, mode, here,
                                                                     failed):
    """ngircd and nsd, started as root by mmleak.py run, become another user, who may not
    create the scan's result in run's directory (root's, 0755): the reason was on the
    daemon's stderr only, and the report said "no scan ran: the process ended by _exit,
    abort...", wrong.  The exiting process now keeps the reason in its dump file
    ("#noscan", through compaction), and the report gives it, and what to do."""
    exe = uid_drop(tmp_path)
    with run_like_dir() as d:
        check_no_result_reason(exe, d, mode, here, failed)


def check_no_result_reason(exe, d, mode, here, failed):
    # (mmleak-scan, started as nobody from beside mmleak.so: a copy others can run when the
    # tree is private, as CI's clone in a mktemp directory is)
    r = subprocess.run([exe, mode, str(NOBODY)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=lib_for_others(), MMLEAK_DIR=str(d),
                                MMLEAK_SCAN_HERE=here))
    assert r.returncode == 0, r.stderr
    assert not [n for n in os.listdir(str(d)) if ".scan." in n]
    import mmleaklib as mm
    (tid,) = mm.find_traces(str(d))
    reason = ("cannot write the result in %s (as uid %d): Permission denied%s"
              % (d, NOBODY, failed.format(pid=tid)))
    assert r.stderr == "mmleak-scan: %s\n" % reason
    want = ("  reachability unknown: the scan at the exit wrote no result: %s; give the trace "
            "a directory the process's user can write (mmleak.py run -d DIR, or "
            "MMLEAK_DIR)\n" % reason)
    for step in ("read", "compact"):
        if step == "compact":
            c = subprocess.run([MMLEAK, "compact", str(d)], capture_output=True, text=True,
                               timeout=60)
            assert c.returncode == 0, c.stderr
            assert [n for n in os.listdir(str(d)) if n.endswith(".compact")], os.listdir(str(d))
        rep = subprocess.run([MMLEAK, "report", str(d), "--no-html"], capture_output=True,
                             text=True, timeout=60)
        assert want in rep.stdout, (step, rep.stdout + rep.stderr)
        assert "no scan ran" not in rep.stdout
    # the page says it above its leak summary, as the text does
    page = os.path.join(str(d), "page.html")
    rep = subprocess.run([MMLEAK, "report", str(d), "-o", page], capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    with open(page) as f:
        assert ('<span class="warn" id="reachability-note"><b>Reachability:</b> %s</span>'
                % html.escape(want.strip(), quote=True)) in f.read()
    os.unlink(page)
    # --check's word on the blocks of unknown reachability gives it too
    rep = subprocess.run([MMLEAK, "report", str(d), "--no-html", "--check"],
                         capture_output=True, text=True, timeout=60)
    note = want.strip()[len("reachability unknown: "):]
    assert rep.returncode == 23, rep.stdout + rep.stderr
    assert "of reachability unknown (%s); to not count them" % note in rep.stdout, rep.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="changes its uid")
@pytest.mark.parametrize("mode, owner, pairs", [
    # (10,000 events a thread: past ten staging halves; 21, less than one, and such a
    # thread's end wrote them over the start of the main thread's file)
    ("j", 0, 5000), ("w", 0, 5000), ("j", 0, 10), ("j", NOBODY, 5000), ("w", NOBODY, 5000),
    ("r", 0, 5000), ("r", 0, 10)])
def test_threads_started_after_a_drop_of_root_into_a_directory_of_roots(tmp_path, mode, owner,
                                                                        pairs):
    """memcached -u, nsd: a daemon started as root (by mmleak.py run, in its own directory,
    root's, 0755) becomes another user for good, then starts threads.  A new thread's file is
    made at its first event, as that user, who may not: its events stayed in memory and were
    lost at its end, unsaid (and such a thread's end wrote them over the start of the main
    thread's file).  Now the shared file is made at the drop, while root, and takes them:
    every block and free of threads joined (j) or still waiting at the exit (w), as when the
    directory is the user's (owner NOBODY, where nothing changed: no shared file).  A drop
    mmleak.so does not see (r: raw system calls) still loses them, and now says how many
    (where that user may write, its files are not the trace owner's: docs/limits.rst)."""
    exe = str(tmp_path / "drop_threads")
    subprocess.run(["cc", "-O1", "-g", "-pthread", "-o", exe,
                    os.path.join(TESTS, "drop_threads.c")], check=True)
    threads = 3
    with run_like_dir() as d:
        os.chown(str(d), owner, -1)
        r = subprocess.run([exe, mode, str(NOBODY), str(threads), str(pairs)],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, LD_PRELOAD=lib_for_others(),
                                    MMLEAK_DIR=str(d)))
        assert r.returncode == 0, r.stderr
        lost = mode == "r" and owner == 0
        said = [l for l in r.stderr.splitlines() if l.startswith("mmleak:")]
        assert [l.split(" (")[0] for l in said] == (
            ["mmleak: cannot create a dump file in %s: permission denied" % d] if lost else []), \
            r.stderr
        import mmleaklib as mm
        (tid,) = mm.find_traces(str(d))
        got, sh = leaks(d, tid, "drop_threads")
        want = [("main", "before", 100, 1), ("main", "after", 200, 1), ("main", "last", 300, 1)]
        if not lost:
            want += [("worker", "kept", 1000 + i, 1) for i in range(threads)]
        assert got == expect("drop_threads.c", want)
        h = sh.history()
        assert h["frees"] == (0 if lost else threads * pairs), h
        shared = [n for n in os.listdir(str(d))
                  if n.endswith(".out") and b" late=1" in (d / n).read_bytes().split(b"\n")[0]]
        assert len(shared) == (owner == 0 and mode != "r"), shared
        gap = ("INCOMPLETE TRACE: %d events were not recorded (%d threads could not create "
               "their dump file in %s: Permission denied; give the trace a directory the "
               "process's user can write (mmleak.py run -d DIR, or MMLEAK_DIR)); blocks may "
               "show as leaks whose free was lost" % (threads * (1 + 2 * pairs), threads, d))
        for step in ("read", "compact"):
            if step == "compact":   # (the "#nofile" line is kept by compaction)
                c = subprocess.run([MMLEAK, "compact", str(d)], capture_output=True,
                                   text=True, timeout=120)
                assert c.returncode == 0, c.stderr
            rep = subprocess.run([MMLEAK, "report", str(d), "--no-html", "--check",
                                  "--leak-kinds", "definite"], capture_output=True, text=True,
                                 timeout=120)
            assert rep.returncode == (3 if lost else 0), rep.stdout + rep.stderr
            assert ("  %s\n" % gap in rep.stdout) == lost, (step, rep.stdout)
            assert ("mmleak: the verdict is on what was recorded: %s\n" % gap in rep.stdout) \
                == lost, rep.stdout
            assert ("INCOMPLETE" in rep.stdout) == lost, rep.stdout


def test_a_thread_without_a_file_that_forks(tmp_path, dump):
    """A thread that could not create its dump file (no descriptor left) stages in memory.
    Its end flushed those lines into file 0 of its zeroed state, the main thread's, over its
    start (and wrote its registry slot before the registry's start): the parent's trace lost
    the thread's 111 and 333 bytes; and a child it forked took that memory for a file's:
    6,882 events read for its 6,001.  Now the thread's lines go into a file of its own, and
    the child starts afresh."""
    import resource
    exe = str(tmp_path / "anon_fork")
    subprocess.run(["cc", "-O1", "-g", "-pthread", "-o", exe,
                    os.path.join(TESTS, "anon_fork.c")], check=True)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump)),
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
    assert r.returncode == 0, r.stderr
    import mmleaklib as mm
    traces = mm.find_traces(str(dump))
    assert len(traces) == 2, sorted(os.listdir(str(dump)))
    # (the child's trace is the one with its block: pids may wrap)
    (pgot, psh), (cgot, csh) = sorted((leaks(dump, t, "anon_fork") for t in traces),
                                      key=lambda g: len(g[0]), reverse=True)
    assert pgot == expect("anon_fork.c", [("main", "main", 44, 1),
                                          ("worker", "staged", 111, 1),
                                          ("worker", "after", 333, 1)])
    assert cgot == expect("anon_fork.c", [("worker", "child", 222, 1)])
    assert csh.history()["events"] == 6001
    assert not psh.gap_text() and not csh.gap_text()
