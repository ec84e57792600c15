"""mmleak.py's commands as a user types them: run, report, symbolize, shrink of a live
process; exact output."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import LIB, ROOT, expect, leaks, mmleak, run_traced, site_line

# these runs hold the report of blocks not freed, one row per call site: no reachability scan
# (MMLEAK_SCAN=0, issue 20; test_leakcheck.py has the kinds)
NO_SCAN = dict(os.environ, MMLEAK_SCAN="0")
MMLEAK_PY = [sys.executable, os.path.join(ROOT, "mmleak.py")]


def test_run_then_report(bins, tmp_path, lib):
    d = tmp_path / "dumps"
    r = subprocess.run(MMLEAK_PY + ["run", "-d", str(d), "--", bins["hostile"], "basic"],
                       capture_output=True, text=True, env=NO_SCAN)
    assert r.returncode == 0
    traces = {k: v for k, v in mmleak.find_traces(str(d)).items() if v}
    (tid,) = traces
    err = r.stderr.splitlines()
    # compacted in the background: the one result file, the dump files folded and gone
    assert [os.path.basename(f) for f in traces[tid]] == ["mmleak.%s.compact" % tid]
    assert err[0] == ("mmleak.py: %s ended (exit status 0); trace %s compacted in the "
                      "background: mmleak.%s.compact (%s) and 0 more dump files in %s"
                      % (bins["hostile"], tid, tid, mmleak.human_bytes(
                          os.path.getsize(traces[tid][0])), d))
    assert err[1] == "mmleak.py: next: %s report %s --pid %s" % (MMLEAK_PY[1], d, tid)
    r = subprocess.run(MMLEAK_PY + ["report", str(d), "--pid", tid, "--no-html", "--top",
                                    "50", "--csv", str(tmp_path / "sites.csv")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    src = os.path.join(ROOT, "tests", "hostile.c")
    # every known site, with its bytes and blocks, on one line of the table
    for fn, site, size in [("realloc_chain", "chain", 2016), ("early", "ctor", 1001),
                           ("entry_points", "malloc", 101), ("entry_points", "strdup", 11)]:
        line = "  %12d %8d  %s at %s:%d" % (size, 1, fn, src, site_line("hostile.c", site))
        assert line in out.splitlines(), (line, out)
    csv = (tmp_path / "sites.csv").read_text().splitlines()
    assert csv[0].startswith("bytes,blocks,mean,min,max,oldest_s,youngest_s,function,file,line")
    assert any(l.startswith("2016,1,2016,2016,2016,") and ",realloc_chain,%s,%d," % (
        src, site_line("hostile.c", "chain")) in l for l in csv)


def test_a_program_started_through_a_shell_is_its_pid(bins, tmp_path, lib):
    """Issue 17, item 12: `bash -c "...; exec PROGRAM"` (Debian's nfs-ganesha.service), and
    the program exec's itself once more: one process, three images, traces PID (bash), PID-1
    and PID-2.  run names the last one, calls the others the same process before its exec,
    and its next: line (report --pid PID) reports the last one, as does snapshot --pid;
    --trace reaches each earlier image."""
    d = tmp_path / "dumps"
    shell = "true; exec %s exec" % bins["hostile"]
    r = subprocess.run(MMLEAK_PY + ["run", "-d", str(d), "--", "/bin/bash", "-c", shell],
                       capture_output=True, text=True, env=NO_SCAN)
    assert r.returncode == 0, r.stderr
    traces = {k: v for k, v in mmleak.find_traces(str(d)).items() if v}
    (pid,) = {k for k in traces if "-" not in k}
    assert set(traces) == {pid, pid + "-1", pid + "-2"}
    cmds = {pid: "/bin/bash -c " + shell, pid + "-1": bins["hostile"] + " exec",
            pid + "-2": bins["hostile"] + " basic"}
    last = pid + "-2"
    assert r.stderr.splitlines() == [
        "mmleak.py: /bin/bash ended (exit status 0); trace %s compacted in the background: "
        "mmleak.%s.compact (%s) and 0 more dump files in %s"
        % (last, last, mmleak.human_bytes(os.path.getsize(traces[last][0])), d),
        "mmleak.py: before its last exec the same process was traced as: %s (%s), %s-1 (%s) "
        "(report one with --trace ID)" % (pid, cmds[pid], pid, cmds[pid + "-1"]),
        "mmleak.py: next: %s report %s --pid %s" % (MMLEAK_PY[1], d, pid)]

    def report(*how):
        r = subprocess.run(MMLEAK_PY + ["report", str(d), "--no-html", "--top", "50"] +
                           list(how), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines(), r.stderr
    out, err = report("--pid", pid)
    assert out[0] == "mmleak: trace %s (pid %s): %s" % (last, pid, cmds[last])
    assert err == ("mmleak.py: pid %s: 3 traces in %s, oldest first: %s; reporting %s, the "
                   "newest with dump files (another one: --trace ID)\n"
                   % (pid, d, ", ".join("%s (%s)" % (t, cmds[t]) for t in
                                        (pid, pid + "-1", last)), last))
    src = os.path.join(ROOT, "tests", "hostile.c")
    chain = "  %12d %8d  %s at %s:%d" % (2016, 1, "realloc_chain", src,
                                         site_line("hostile.c", "chain"))
    before_exec = "  %12d %8d  %s at %s:%d" % (604, 1, "main", src,
                                               site_line("hostile.c", "before_exec"))
    assert chain in out and before_exec not in out
    for how in (["--trace", pid + "-1"], ["--pid", pid + "-1"]):    # PID-K: that trace
        out, err = report(*how)
        assert (out[0], err) == ("mmleak: trace %s-1 (pid %s): %s" % (pid, pid,
                                                                     cmds[pid + "-1"]), "")
        assert before_exec in out and chain not in out
    out, err = report("--trace", pid)
    assert (out[0], err) == ("mmleak: trace %s (pid %s): %s" % (pid, pid, cmds[pid]), "")
    assert chain not in out and before_exec not in out
    r = subprocess.run(MMLEAK_PY + ["snapshot", str(d), "--pid", pid, "-o",
                                    str(tmp_path / "snap")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.splitlines()[-1].startswith(
        "mmleak.py: trace %s: " % last), r.stderr
    r = subprocess.run(MMLEAK_PY + ["report", str(d), "--pid", pid, "--trace", pid],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not allowed with argument" in r.stderr


def test_run_passes_exit_status_and_signals(bins, tmp_path, lib):
    r = subprocess.run(MMLEAK_PY + ["run", "-d", str(tmp_path), "--", bins["hostile"], "abort"],
                       capture_output=True, text=True)
    assert r.returncode == 128 + 6
    assert "ended (killed by signal 6)" in r.stderr


def test_run_passes_sigterm_and_sighup_on(tmp_path, lib):
    # `kill PID` of the mmleak.py a user (or a service manager) started stops the program,
    # whose trace is then compacted and announced; before, mmleak.py died of the signal at
    # once and the program ran on, orphaned, its trace never finished nor announced
    for sig in (signal.SIGTERM, signal.SIGHUP):
        d = tmp_path / str(int(sig))
        with open(tmp_path / "err", "w+") as err:
            p = subprocess.Popen(MMLEAK_PY + ["run", "-d", str(d), "--", "sleep", "600"],
                                 stderr=err, env=NO_SCAN)
            child = None
            try:
                for _ in range(1000):
                    with open("/proc/%d/task/%d/children" % (p.pid, p.pid)) as f:
                        kids = f.read().split()
                    # the child is traced once its dump files exist
                    if kids and os.path.exists(d / ("mmleak.%s.maps" % kids[0])):
                        child = int(kids[0])
                        break
                    time.sleep(0.01)
                assert child
                p.send_signal(sig)
                assert p.wait(timeout=60) == 128 + sig
                time.sleep(0.1)
                assert not os.path.exists("/proc/%d" % child)
            finally:
                if child and os.path.exists("/proc/%d" % child):
                    os.kill(child, signal.SIGKILL)
            err.seek(0)
            first = err.read().splitlines()[0]
        # (whether sleep's few events left its staging file before the signal is luck)
        assert first.startswith("mmleak.py: sleep ended (killed by signal %d); trace %d"
                                % (sig, child)), first


def test_report_header_escapes_control_characters_of_the_command_line(tmp_path):
    # a command line is the program's: GNU find rewrites its "-printf %s\\n" argument into a
    # real newline, which split the report's first line in two (and a program could write a
    # whole line of its own, "no leaks" say, into the report)
    d = tmp_path / "d"
    r = subprocess.run(MMLEAK_PY + ["run", "-d", str(d), "--", "sh", "-c", ":",
                                    "a\nmmleak: forged\x1b[2J"], capture_output=True,
                       text=True, env=NO_SCAN)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(MMLEAK_PY + ["report", str(d), "--no-html"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.endswith("): sh -c : a\\x0ammleak: forged\\x1b[2J"), first
    assert not any(l.startswith("mmleak: forged") for l in r.stdout.splitlines())
    assert "\x1b" not in r.stdout


def test_report_header_drops_the_blanks_a_title_is_padded_with(tmp_path):
    # redis-server rewrites its argv area as "redis-server *:6379" padded with spaces
    d = tmp_path / "d"
    r = subprocess.run(MMLEAK_PY + ["run", "-d", str(d), "--", "sh", "-c", ":", "x" + " " * 40],
                       capture_output=True, text=True, env=NO_SCAN)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(MMLEAK_PY + ["report", str(d), "--no-html"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith("): sh -c : x"), r.stdout


def test_run_without_command_is_a_usage_error():
    r = subprocess.run(MMLEAK_PY + ["run"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("mmleak.py: run: no command given")


def test_report_on_empty_dir(tmp_path):
    r = subprocess.run(MMLEAK_PY + ["report", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == ("mmleak.py: no mmleak dump files in %s (a traced program writes them "
                        "where `run -d DIR` or MMLEAK_DIR says, /tmp by default)\n" % tmp_path)


def test_first_errors_say_what_to_do(tmp_path):
    """What a newcomer meets first: a dump directory that does not exist (compact said "not
    a directory"), a dump file with no event, or a file that is not a dump at a dump file's
    name (report said "no leaks: every block ... was freed")."""
    (tmp_path / "file").write_text("x")
    # report and snapshot said "cannot list DIR: No such file or directory" (round 2 of the
    # docs' check): every command that takes the dump directory says the same, and what to give
    for cmd in ("compact", "report", "snapshot"):
        for name, what in (("none", "no such directory"), ("file", "not a directory")):
            r = subprocess.run(MMLEAK_PY + [cmd, str(tmp_path / name)], capture_output=True,
                               text=True)
            assert (r.returncode, r.stdout, r.stderr) == (
                2, "", "mmleak.py: %s: %s (the dump directory: `run -d DIR`, MMLEAK_DIR)\n"
                % (tmp_path / name, what)), cmd
    said = "  no events in these dump files: nothing was traced (a dump file starts with a " \
           "'#mmleak' line)\n"
    for name, text in (("empty", ""), ("foreign", "root:x:0:0\nbin:x:1:1\n")):
        d = tmp_path / name
        d.mkdir()
        (d / "mmleak.4242.0.out").write_text(text)
        r = subprocess.run(MMLEAK_PY + ["report", str(d), "--no-html"], capture_output=True,
                           text=True)
        if text:        # not a dump at all: refused in one line (tests/test_not_a_dump.py)
            assert (r.returncode, r.stdout, r.stderr) == (
                2, "", "mmleak.py: %s/mmleak.4242.0.out: %s\n" % (d, mmleak.dumpformat.NOT_DUMP))
            continue
        assert r.returncode == 0, r.stderr
        assert r.stdout.endswith(said), r.stdout
        assert "no leaks" not in r.stdout
    # a trace with no dump file (`run -- /bin/true`: nothing allocated; its maps file alone):
    # what `run` says next (`report DIR --pid ID`) said "no events in these dump files ... a
    # dump file starts with a '#mmleak' line", of files there are not
    d = tmp_path / "nofile"
    d.mkdir()
    (d / "mmleak.4243.maps").write_text("")
    r = subprocess.run(MMLEAK_PY + ["report", str(d), "--pid", "4243", "--no-html"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout.endswith("  no dump file of this trace: the program allocated nothing "
                             "while traced, or its files were removed\n"), r.stdout


def test_shrink_a_running_process(bins, dump):
    e = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump))
    p = subprocess.Popen([bins["hostile"], "wait"], env=e, stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        got, sh = leaks(dump, str(p.pid), "hostile")
        assert got == expect("hostile.c", [("early", "ctor", 1001, 1),
                                           ("main", "running", 555, 4)])
    finally:
        p.kill()
        p.wait()


def test_symbolize_refuses_a_replaced_binary(bins, tmp_path, dump):
    exe = tmp_path / "victim"
    shutil.copy(bins["hostile"], exe)
    run_traced([str(exe), "basic"], dump)
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    surv = mmleak.shrink_files(mmleak.find_traces(str(dump))[tid]).survivors()
    addr = [a for a in surv if a.size == 101][0].callers[0]
    maps = str(dump / ("mmleak.%s.maps" % tid))
    r = subprocess.run(MMLEAK_PY + ["symbolize", "--maps", maps, "%x" % addr],
                       capture_output=True, text=True)
    assert r.stdout.startswith("%012x  entry_points at " % addr)
    # rebuilt since the run (a linker writes a new file): the old lines can't be trusted
    time.sleep(1.1)
    shutil.copy(bins["hostile"], str(exe) + ".new")
    os.replace(str(exe) + ".new", exe)
    r = subprocess.run(MMLEAK_PY + ["symbolize", "--maps", maps, "%x" % addr],
                       capture_output=True, text=True)
    assert r.stdout == "%012x  victim+0x%x  (unresolved: %s was replaced since the run " \
        "(inode changed))\n" % (addr, mmleak.Maps(maps).find(addr)[0][2] + addr -
                                mmleak.Maps(maps).find(addr)[0][0], exe)
    # the report's table shows them as offsets, and says why under it
    r = subprocess.run(MMLEAK_PY + ["report", str(dump), "--no-html"], capture_output=True,
                       text=True)
    rows = [l for l in r.stdout.splitlines() if re.search(r"  victim\+0x[0-9a-f]+$", l)]
    assert rows and "  %d call site%s not symbolized: %s was replaced since the run (inode " \
        "changed)\n" % (len(rows), "s"[:len(rows) > 1], exe) in r.stdout, r.stdout


def test_symbolize_ambiguous_range(tmp_path):
    maps = tmp_path / "m.maps"
    maps.write_text("7f0000000000-7f0000010000 r-xp 00000000 fe:00 11 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
                    "7f0000000000-7f0000010000 r-xp 00000000 fe:00 12 /usr/lib/x86_64-linux-gnu/libm.so.6\n")
    r = subprocess.run(MMLEAK_PY + ["symbolize", "--maps", str(maps), "7f0000001234",
                                    "1234"], capture_output=True, text=True)
    assert r.stdout.splitlines() == [
        "7f0000001234  0x7f0000001234  (unresolved: address range used by several objects "
        "over the run (dlclose/dlopen): ambiguous)",
        "000000001234  0x1234  (unresolved: not in any mapped file)"]


def test_symbolize_without_elfutils(bins, dump, tmp_path):
    run_traced([bins["hostile"], "basic"], dump)
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    surv = mmleak.shrink_files(mmleak.find_traces(str(dump))[tid]).survivors()
    addr = [a for a in surv if a.size == 101][0].callers[0]
    env = dict(os.environ, PATH=str(tmp_path))      # no eu-addr2line on PATH
    r = subprocess.run(MMLEAK_PY + ["symbolize", "--maps", str(dump / ("mmleak.%s.maps" % tid)),
                                    "%x" % addr], capture_output=True, text=True, env=env)
    assert r.returncode == 4
    assert "eu-addr2line not found (install elfutils)" in r.stdout


def test_report_incremental_against_a_snapshot(bins, dump, tmp_path):
    """Snapshot a running process, let it leak more, report only what is new."""
    e = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump))
    p = subprocess.Popen([bins["hostile"], "wait"], env=e, stdout=subprocess.PIPE,
                         stdin=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        base = tmp_path / "snapshot.txt"
        files = mmleak.find_traces(str(dump))[str(p.pid)]
        subprocess.run(MMLEAK_PY + ["shrink", "-o", str(base)] + files, check=True,
                       capture_output=True)
        p.stdin.write(b"x")
        p.stdin.flush()
        assert p.stdout.readline() == b"more\n"
        r = subprocess.run(MMLEAK_PY + ["report", str(dump), "--pid", str(p.pid), "--no-html",
                                        "--baseline", str(base)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        src = os.path.join(ROOT, "tests", "hostile.c")
        cut = next(i for i, l in enumerate(lines) if l.startswith("  since the snapshot"))
        rows = [l for l in lines[:cut] if l.startswith("  ") and " at " in l]
        assert rows == ["  %12d %8d  main at %s:%d" % (1112, 2, src, site_line("hostile.c",
                                                                                "later"))]
        assert "showing only blocks allocated since the snapshot %s (2 of " % base in r.stdout
        # the incremental table: +2 blocks at "later", nothing of the snapshot freed
        inc = [l for l in lines[cut:] if " at " in l]
        assert inc == ["  %12d %8d %12d %8d  main at %s:%d" % (1112, 2, 0, 0, src, site_line(
            "hostile.c", "later"))]
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("script, argv, moments", [
    ("mmleak.py", ["shrink"], (0, 0.05, 0.25)),
    ("mmleak-panda.py", ["-o", os.devnull], (0, 0.05, 0.25)),
    ("mmleak-install.py", ["--root", "/nonexistent", "--dry-run", "status", "x.service"],
     (0,))])
def test_ctrl_c_at_any_moment_is_one_line_and_130(script, argv, moments):
    """Ctrl-C before main handles it (the imports, the command line) or while it waits:
    the one line and status 130, never a traceback (mmleaklib/interrupt.py).  The signal is
    blocked from the spawn on (as `env --block-signal=INT` does), so that every moment tried
    is one where the tool runs: it waits, pending, until the script's first line takes it;
    sent at the spawn, in the imports or while it reads stdin, the outcome is the same."""
    label = "error: " if script == "mmleak-install.py" else ""
    for moment in moments:
        p = subprocess.Popen([sys.executable, os.path.join(ROOT, script)] + argv,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK,
                                                                       [signal.SIGINT]))
        time.sleep(moment)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(b"", timeout=60)   # (stdin ends: a missed signal is seen)
        assert (p.returncode, out, err) == (130, b"", b"%s: %sinterrupted\n" % (
            script.encode(), label.encode())), moment
