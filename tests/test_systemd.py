"""The daemon story under a real systemd as PID 1 (README "Tracing a daemon (systemd)",
mmleak-systemd(7)).

Run: /usr/bin/python3 -m pytest tests/test_systemd.py  (as root; skipped otherwise)

The `box` fixture (tests/conftest.py, tests/nspawn_box.py) boots the host's own systemd with
systemd-nspawn on an overlay of / (upper layer on a tmpfs: the host is never written). In it,
tests/leaky_daemon.c runs as a service with User=, PrivateTmp=yes and ProtectSystem=strict;
mmleak-install.py installs the tracer and its companion (mmleak-compact-NAME.service) for it,
the service is restarted, the companion starts with it, its dump files (rotated at 8 MB: the
daemon churns 800,000 events first) are compacted while it runs, and the report on the running
daemon must name its leak exactly; stopping the service stops the companion, whose last pass
leaves only the compacted trace, still exact; then uninstall, restart, and the tracer and the
companion are gone. A DynamicUser=yes service shares its dynamic user with its companion.
A service started without mmleak is attached to and detached from twice (`mmleak.py
attach/detach MAINPID`), each window's leak exact, without a restart; one installed with
`install --paused` starts paused and is attached to the same way. `mmleak-install.py status`
says at each step what mmleak does in the service's main process.  A root service whose trace
goes to its user (ExecStart=!, then setpriv) is compacted by its root companion in children
that become that user (strace of the companion, in its sandbox).
"""
import glob
import os
import re
import shutil
import stat
import subprocess
import time

import pytest

import nspawn_box
from conftest import LIB, ROOT, TESTS, site_line

PY = "/usr/bin/python3"
INSTALL = os.path.join(ROOT, "mmleak-install.py")
MMLEAK = os.path.join(ROOT, "mmleak.py")
UNIT = "mmleak-leaky.service"
USER = "mmleakd"
BIN = "/usr/local/bin/mmleak-leaky-daemon"
STATE = "/var/lib/mmleak-leaky"  # StateDirectory=: the daemon writes "ready" there
COMPANION = "mmleak-compact-mmleak-leaky.service"
PY_DEST = "/usr/local/lib/mmleak/mmleak.py"
N, SIZE = 13, 777
CHURN = 100000          # requests of 8 events: about 27 MB of dumps, 3 files at 8 MB
EVENTS = 8 * (1000 + CHURN) + N
UNIT_TEXT = """[Unit]
Description=leaky daemon for tests/test_systemd.py

[Service]
User=%s
ExecStart=%s %d %d %d
StateDirectory=mmleak-leaky
PrivateTmp=yes
ProtectSystem=strict
""" % (USER, BIN, N, SIZE, CHURN)


def status(box, expect_rc):
    """mmleak-install.py status UNIT inside: (fields, dump file listing, stdout)."""
    r = box.run([PY, INSTALL, "status", UNIT], check=False)
    assert (r.returncode, r.stderr) == (expect_rc, ""), r
    fields, listing = {}, {}
    for line in r.stdout.splitlines():
        m = re.match(r"^\s+(\d+)\s+(\S+)$", line)
        if m:
            listing[m.group(2)] = int(m.group(1))
            continue
        key, sep, val = line.partition(":")
        if sep:
            fields[key] = val.strip()
    return fields, listing, r.stdout


def proc(box, pid, what):
    with open(box.path("/proc/%d/%s" % (pid, what)), "rb") as f:
        return f.read().decode()


def execed(box, pid, timeout=30):
    """Wait until PID, a unit's main process, has run its ExecStart= (systemd reports a simple
    service active at its fork; until the exec its command line is "(NAME)", systemd's, and
    its credentials may not be set yet): then PID."""
    end = time.monotonic() + timeout
    while proc(box, pid, "cmdline").startswith("(") and time.monotonic() < end:
        time.sleep(0.05)
    return pid


def mapped(box, pid, name="mmleak.so"):
    """Paths of the files mapped by PID whose name is NAME."""
    return {line.split(None, 5)[5] for line in proc(box, pid, "maps").splitlines()
            if line.count(" ") >= 5 and line.endswith("/" + name)}


def environ(box, pid):
    return dict(e.split("=", 1) for e in proc(box, pid, "environ").split("\0") if "=" in e)


def show(box, prop):
    return box.run(["systemctl", "show", "-p", prop, "--value", UNIT]).stdout.rstrip("\n")


def dump_files(box, ddir):
    """name -> (uid, gid, mode, size) of the files in the dump directory."""
    out = {}
    for n in os.listdir(box.path(ddir)):
        st = os.stat(box.path(ddir + "/" + n))
        out[n] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_size)
    return out


def start(box, unit=UNIT, state=STATE):
    """Restart the unit; wait until the daemon has leaked and says so. Returns MainPID."""
    box.run(["systemctl", "restart", unit])
    pid = box.wait_active(unit)
    box.wait_file(state + "/ready", content="%d\n" % pid)
    return pid


def active(box, unit):
    return box.run(["systemctl", "is-active", unit], check=False).stdout.strip()


def wait_inactive(box, unit, timeout=30):
    """`systemctl stop` returns when its own job is done; a unit stopped with it (the
    companion, after the service) may still be deactivating: wait for it."""
    deadline = time.monotonic() + timeout
    nap = nspawn_box.Backoff()
    while active(box, unit) != "inactive":
        if time.monotonic() > deadline:
            raise AssertionError("%s is %s after %ds:\n%s" % (unit, active(box, unit), timeout,
                                                               box.journal(unit)))
        nap()


def wait_compacted(box, ddir, pid, others=(), companion=COMPANION, timeout=30):
    """Wait until the companion has folded every complete dump file of PID: what is left is
    the file its thread still writes (K.out and its staging K.tail), the compactor's own, and
    the OTHERS (file names). Returns K, the number of files folded."""
    deadline = time.monotonic() + timeout
    while True:
        names = set(os.listdir(box.path(ddir))) - set(others)
        outs = [n for n in names if n.endswith(".out")]
        if len(outs) == 1:
            k = int(outs[0].split(".")[2])
            if names == live_set(pid, k):
                return k
        if time.monotonic() > deadline:
            raise AssertionError("%s not compacted after %ds: %s\n%s" % (
                ddir, timeout, sorted(names), box.journal(companion)))
        time.sleep(0.1)


def live_set(pid, k=None):
    """The files of a compacted trace of PID: of a finished one, or of one whose process
    still writes its file K (and the blocks of the series' last point, .series.live, and the
    first fold's per-site sums for the last point, .series.base, both deleted at the end).  No
    log of loads: in the service's own directory it waits for its first line (leaky_daemon
    unloads nothing); the lock is the compactor's."""
    out = {"mmleak.%d.%s" % (pid, x) for x in ("compact", "maps", "series", "lock")}
    if k is not None:
        out |= {"mmleak.%d.%d.out" % (pid, k), "mmleak.%d.%d.tail" % (pid, k),
                "mmleak.%d.series.live" % pid, "mmleak.%d.series.base" % pid}
    return out


def compacted_header(box, ddir, pid):
    """{files, events, entries} of the #compacted line of mmleak.PID.compact."""
    with open(box.path("%s/mmleak.%d.compact" % (ddir, pid)), "rb") as f:
        for line in f:
            if line.startswith(b"#compacted "):
                return {k: int(v) for k, v in (w.split("=") for w in
                                               line.decode().split()[1:]) if k != "at"}
    raise AssertionError("no #compacted line in mmleak.%d.compact" % pid)


def report(box, ddir, pid, tid=None):
    """`mmleak.py report DDIR --pid PID --no-html`: (events, folded events, folded files,
    rows); asserts its first line (TID: the trace it reads, default PID) and that the leak
    is the daemon's, exactly."""
    r = box.run([PY, MMLEAK, "report", ddir, "--pid", str(pid), "--no-html"])
    lines = r.stdout.splitlines()
    assert lines[0] == "mmleak: trace %s (pid %d): %s %d %d %d" % (tid or pid, pid, BIN, N,
                                                                   SIZE, CHURN), r.stdout
    m = re.match(r"^  (\d+) events \((\d+) of them folded by compaction from (\d+) files\); "
                 r".* in (\d+) blocks not freed; 0 frees of blocks allocated before tracing$",
                 lines[1])
    assert m, r.stdout
    assert int(m.group(4)) == N
    end = next((i for i, l in enumerate(lines) if l.startswith("  growth over ")), len(lines))
    rows = [tuple(line.split(None, 2)) for line in lines[3:end]]
    assert rows == [(str(N * SIZE), str(N), "remember at %s:%d" % (
        os.path.join(TESTS, "leaky_daemon.c"), site_line("leaky_daemon.c", "remember")))], \
        r.stdout
    return tuple(int(x) for x in m.groups()[:3])


def wait_journal(box, pid, files, over, timeout=10):
    """Wait until the companion's journal says it folded FILES files of PID (journald
    stores the lines a moment after they are written)."""
    deadline = time.monotonic() + timeout
    nap = nspawn_box.Backoff()
    while folded_in_journal(box, pid) != (files, over):
        if time.monotonic() > deadline:
            raise AssertionError("journal of %s: %r, expected %r\n%s" % (
                COMPANION, folded_in_journal(box, pid), (files, over), box.journal(COMPANION)))
        nap()


def folded_in_journal(box, pid):
    """The number of files the companion says it folded for PID (one line per pass with
    -v), and whether its last line says the trace is over."""
    total, over = 0, False
    text = box.run(["journalctl", "--no-pager", "-o", "cat", "-u", COMPANION]).stdout
    for line in text.splitlines():
        m = re.match(r"^mmleak\.py: trace %d: folded (\d+) files \(.*\) into mmleak\.%d\.compact "
                     r"\(.*\)(; the trace is over)?$" % (pid, pid), line)
        if m:
            total += int(m.group(1))
            over = bool(m.group(2))
    return total, over


@pytest.fixture
def daemon(box, tmp_path):
    """The leaky daemon installed in the box as UNIT (not started), with a dedicated user;
    no mmleak in the box (the host may have one installed: the overlay hides it)."""
    exe = tmp_path / "leaky_daemon"
    subprocess.run(["gcc", "-O0", "-g", "-o", str(exe), os.path.join(TESTS, "leaky_daemon.c")],
                   check=True)
    shutil.copy(str(exe), box.path(BIN))
    os.chmod(box.path(BIN), 0o755)
    box.run(["rm", "-rf", "/var/lib/mmleak", "/usr/local/lib/mmleak", STATE,
             "/etc/systemd/system/%s.d" % UNIT, "/etc/systemd/system/" + COMPANION])
    if box.run(["id", "-u", USER], check=False).returncode != 0:
        box.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
                 "/nonexistent", "--shell", "/usr/sbin/nologin", USER])
    with open(box.path("/etc/systemd/system/" + UNIT), "w") as f:
        f.write(UNIT_TEXT)
    box.reload()
    uid = int(box.run(["id", "-u", USER]).stdout)
    gid = int(box.run(["id", "-g", USER]).stdout)
    yield uid, gid
    box.run(["systemctl", "stop", UNIT, COMPANION], check=False)


def test_box_is_a_private_machine(box):
    """What the fixture promises: its own machine-id, no network but lo, nothing listening,
    booted to basic.target only, the host's files untouched, the source tree read-only."""
    mid = box.run(["cat", "/etc/machine-id"]).stdout
    assert re.match(r"^[0-9a-f]{32}\n$", mid)
    if os.path.exists("/etc/machine-id"):
        assert open("/etc/machine-id").read() != mid
    pid1 = box.pid1
    with open("/proc/%d/net/dev" % pid1) as f:
        assert [line.split(":")[0].strip() for line in f.readlines()[2:]] == ["lo"]
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with open("/proc/%d/net/%s" % (pid1, proto)) as f:
            assert f.readlines()[1:] == [], proto  # no socket at all in the box's network
    r = box.run(["systemctl", "is-active", "basic.target", "multi-user.target"], check=False)
    assert r.stdout == "active\ninactive\n"
    assert box.run(["systemctl", "is-enabled", "timers.target"], check=False).stdout == \
        "masked-runtime\n"
    probe = "/etc/mmleak-box-probe-%s" % box.name
    box.run(["touch", probe])
    assert os.path.exists(box.path(probe)) and not os.path.exists(probe)
    r = box.run(["touch", os.path.join(ROOT, "box-probe")], check=False)
    assert r.returncode == 1 and "Read-only file system" in r.stderr
    assert box.run(["test", "-f", MMLEAK]).returncode == 0




def test_daemon_traced_and_compacted_then_untraced(box, daemon, lib):
    uid, gid = daemon
    owner = "%s:%s" % (USER, USER)

    # not installed yet
    fields, _, out = status(box, 3)
    assert fields["drop-in"] == "/etc/systemd/system/%s.d/mmleak.conf: absent" % UNIT, out
    assert out.endswith("not installed\n")

    # install: systemd runs here, so the tool runs daemon-reload itself
    r = box.run([PY, INSTALL, "install", UNIT])
    assert r.stderr == ""
    assert "ran systemctl daemon-reload\n" in r.stdout
    assert "daemon-reload     # needed" not in r.stdout
    assert "write /etc/systemd/system/%s\n" % COMPANION in r.stdout
    assert "compactor: %s, as %s, starts and stops with %s\n" % (COMPANION, owner, UNIT) \
        in r.stdout
    fields, listing, out = status(box, 0)
    ddir, lib_in_box = fields["MMLEAK_DIR"], fields["LD_PRELOAD"]
    assert ddir.startswith("/var/lib/mmleak"), out  # not /tmp: PrivateTmp=yes
    assert "create directory %s (mode 0700 owner %s)\n" % (ddir, owner) in r.stdout
    assert fields["drop-in"] == "/etc/systemd/system/%s.d/mmleak.conf: present" % UNIT
    assert fields["MMLEAK_ROTATE_MB"] == "8"
    assert fields["library"] == "%s: present, %d bytes" % (lib_in_box, os.path.getsize(LIB))
    with open(box.path(lib_in_box), "rb") as a, open(LIB, "rb") as b:
        assert a.read() == b.read()
    with open(box.path(PY_DEST), "rb") as a, open(MMLEAK, "rb") as b:
        assert a.read() == b.read()
    # the companion exists, and does not run before the service is restarted
    assert fields["companion"] == "/etc/systemd/system/%s: present, inactive" % COMPANION
    assert ddir in fields["ReadWritePaths"].split()  # ProtectSystem=strict
    assert fields["dump dir"] == "%s: owner %s mode 0700, 0 dump files, 0 compacted traces" % (
        ddir, owner)
    assert listing == {}
    # what systemd itself now has for the unit
    assert show(box, "Environment") == "LD_PRELOAD=%s MMLEAK_DIR=%s MMLEAK_ROTATE_MB=8" % (
        lib_in_box, ddir)
    assert show(box, "ReadWritePaths") == fields["ReadWritePaths"]
    # (and tmp.mount, which PrivateTmp=yes adds)
    assert sorted(show(box, "Wants").split()) == [COMPANION, "tmp.mount"]
    props = {k: set(v.split()) for k, v in (line.split("=", 1) for line in box.run(
        ["systemctl", "show", "-p", "BindsTo", "-p", "Before", "-p", "User", "-p", "Group",
         COMPANION]).stdout.splitlines())}
    assert props == {"BindsTo": {UNIT}, "Before": {"shutdown.target"}, "User": {USER},
                     "Group": {USER}}

    # restart: the new main process runs as the user, under the tracer, and the companion
    # runs with it, as the same user, without any privilege
    pid = start(box)
    st = proc(box, pid, "status")
    assert re.search(r"^Uid:\t%d\t%d\t%d\t%d$" % ((uid,) * 4), st, re.M), st
    assert re.search(r"^Gid:\t%d\t%d\t%d\t%d$" % ((gid,) * 4), st, re.M), st
    assert mapped(box, pid) == {lib_in_box}
    env = environ(box, pid)
    assert (env.get("LD_PRELOAD"), env.get("MMLEAK_DIR"), env.get("MMLEAK_ROTATE_MB")) == (
        lib_in_box, ddir, "8")
    assert active(box, COMPANION) == "active"
    cpid = int(box.run(["systemctl", "show", "-p", "MainPID", "--value", COMPANION]).stdout)
    cst = proc(box, execed(box, cpid), "status")
    assert re.search(r"^Uid:\t%d\t%d\t%d\t%d$" % ((uid,) * 4), cst, re.M), cst
    assert re.search(r"^Gid:\t%d\t%d\t%d\t%d$" % ((gid,) * 4), cst, re.M), cst
    assert re.search(r"^CapBnd:\t0000000000000000$", cst, re.M), cst
    assert re.search(r"^NoNewPrivs:\t1$", cst, re.M), cst
    assert proc(box, cpid, "cmdline").split("\0") == [
        PY, PY_DEST, "compact", "--follow", "--forever", "--verbose", ddir, ""]
    # not traced itself (no LD_PRELOAD: it writes no dump of its own, see live_set below)
    assert "LD_PRELOAD" not in environ(box, cpid)

    # the daemon churned 100,000 requests before saying "ready": its thread's dump rotated
    # at 8 MB; the companion folds each complete file into mmleak.PID.compact and deletes it,
    # and leaves the one the thread still writes
    k = wait_compacted(box, ddir, pid)
    assert k >= 2, k
    # to fold, it loaded the compiled shrinker with dlopen (mmleak-tools.so, which the
    # installer put beside mmleak.so; never the tracer), which works in its sandbox
    # (MemoryDenyWriteExecute=yes, SystemCallFilter=@system-service); not before its first
    # pass, which may come after the daemon's "ready"
    tools_in_box = os.path.join(os.path.dirname(lib_in_box), "mmleak-tools.so")
    assert mapped(box, cpid, "mmleak-tools.so") == {tools_in_box}
    assert mapped(box, cpid) == set()
    files = dump_files(box, ddir)
    assert set(files) == live_set(pid, k)
    assert {(u, g, m) for u, g, m, _ in files.values()} == {(uid, gid, 0o600)}
    assert files["mmleak.%d.compact" % pid][3] < 4096     # 13 blocks: the live set, small
    head = compacted_header(box, ddir, pid)
    assert head["files"] == k
    wait_journal(box, pid, k, False)
    fields, listing, out = status(box, 0)
    assert fields["companion"] == "/etc/systemd/system/%s: present, active" % COMPANION
    assert fields["dump dir"] == "%s: owner %s mode 0700, 2 dump files, 1 compacted trace" % (
        ddir, owner)
    shown = {n: files[n][3] for n in files if n.endswith((".out", ".maps", ".compact"))}
    assert listing == dict(shown, total=sum(shown.values())), out

    # the report on the running daemon: every event, those folded and those of the running
    # file, and its leak, nothing else: 1000 + CHURN requests of 8 events (malloc, strdup,
    # realloc = free + allocation, calloc, 3 frees) and the N leaks
    assert report(box, ddir, pid) == (EVENTS, head["events"], k)

    # stop the service: the companion stops after it, and its last pass folds the rest
    box.run(["systemctl", "stop", UNIT])
    wait_inactive(box, COMPANION)
    files = dump_files(box, ddir)
    assert set(files) == live_set(pid), sorted(files)
    assert {(u, g, m) for u, g, m, _ in files.values()} == {(uid, gid, 0o600)}
    assert compacted_header(box, ddir, pid)["files"] == k + 1
    assert report(box, ddir, pid) == (EVENTS, EVENTS, k + 1)
    wait_journal(box, pid, k + 1, True)

    # start it again, then uninstall while it runs: the drop-in and the companion's file go,
    # systemd forgets the settings; the old process keeps the tracer and the companion runs
    # on (systemd keeps it loaded, "not-found", no longer bound) until the printed steps
    first = pid
    os.unlink(box.path(STATE + "/ready"))
    pid = start(box)
    assert active(box, COMPANION) == "active"
    k = wait_compacted(box, ddir, pid, others=live_set(first))
    r = box.run([PY, INSTALL, "uninstall", UNIT])
    assert r.stderr == ""
    assert r.stdout == (
        "remove /etc/systemd/system/{0}.d/mmleak.conf\n"
        "remove directory /etc/systemd/system/{0}.d (created by install, now empty)\n"
        "remove /etc/systemd/system/{1}\n"
        "ran systemctl daemon-reload\n"
        "kept: library {2}, {3} and dump directory {4} (delete them by hand when no longer "
        "needed: rm -r {4})\n"
        "next steps:\n"
        "  systemctl restart {0}     # the running process is traced until then\n"
        "  systemctl stop {1}     # after the restart: its last pass folds the old process's "
        "dump files\n".format(UNIT, COMPANION, lib_in_box, PY_DEST, ddir))
    assert not os.path.lexists(box.path("/etc/systemd/system/%s.d" % UNIT))
    assert not os.path.lexists(box.path("/etc/systemd/system/" + COMPANION))
    fields, _, out = status(box, 3)
    assert fields["drop-in"] == "/etc/systemd/system/%s.d/mmleak.conf: absent" % UNIT
    assert (show(box, "Environment"), show(box, "ReadWritePaths"), show(box, "Wants")) == (
        "", "", "tmp.mount")
    assert mapped(box, pid) == {lib_in_box}
    assert active(box, COMPANION) == "active"

    # the printed steps: the restart gives an untraced process, and starts no companion
    os.unlink(box.path(STATE + "/ready"))
    new = start(box)
    assert new != pid
    assert mapped(box, new) == set()
    env = environ(box, new)
    assert "LD_PRELOAD" not in env and "MMLEAK_DIR" not in env
    box.run(["systemctl", "stop", COMPANION])
    wait_inactive(box, COMPANION)
    assert box.run(["systemctl", "show", "-p", "LoadState", "--value", COMPANION]).stdout == \
        "not-found\n"
    # its last pass folded the old process's files; the new process wrote none; the
    # library, mmleak.py and the compacted traces are kept
    assert set(dump_files(box, ddir)) == live_set(pid) | live_set(first)
    assert report(box, ddir, pid) == (EVENTS, EVENTS, k + 1)
    assert report(box, ddir, first) == (EVENTS, EVENTS, compacted_header(box, ddir, first)[
        "files"])
    assert os.path.isfile(box.path(lib_in_box)) and os.path.isfile(box.path(PY_DEST))
    os.unlink(box.path(STATE + "/ready"))
    newer = start(box)
    assert (mapped(box, newer), active(box, COMPANION)) == (set(), "inactive")


DYN_UNIT = "mmleak.dyn.service"     # "mmleak.dyn" is no user name: systemd hashes it
DYN_STATE = "/var/lib/mmleak-dyn"
DYN_USER = "_du0e0a4d2f37caba9e"


def test_dynamic_user_shared_with_the_companion(box, lib, tmp_path):
    """DynamicUser=yes: the user exists only while a unit that uses it runs. The companion
    asks for the same name with DynamicUser=yes (systemd gives every unit that does the same
    uid) and for the service's StateDirectory=, where the dumps are."""
    exe = tmp_path / "leaky_daemon"
    subprocess.run(["gcc", "-O0", "-g", "-o", str(exe), os.path.join(TESTS, "leaky_daemon.c")],
                   check=True)
    shutil.copy(str(exe), box.path(BIN))
    os.chmod(box.path(BIN), 0o755)
    comp = "mmleak-compact-mmleak.dyn.service"
    with open(box.path("/etc/systemd/system/" + DYN_UNIT), "w") as f:
        f.write("[Service]\nDynamicUser=yes\nExecStart=%s %d %d %d\nStateDirectory=mmleak-dyn\n"
                % (BIN, N, SIZE, CHURN))
    box.reload()
    try:
        r = box.run([PY, INSTALL, "install", DYN_UNIT, "--dir", DYN_STATE])
        assert r.stderr == ("mmleak-install.py: note: %s is under StateDirectory=; systemd "
                            "creates it for the dynamic user\n" % DYN_STATE)
        assert "compactor: %s, as the dynamic user %s (shared with the service), starts and " \
               "stops with %s\n" % (comp, DYN_USER, DYN_UNIT) in r.stdout
        pid = start(box, DYN_UNIT, DYN_STATE)
        cpid = int(box.run(["systemctl", "show", "-p", "MainPID", "--value", comp]).stdout)
        # the name systemd chose for the service is the one the installer computed
        # (MainPID is known before the process has exec'd: until then its environment is
        # systemd's, USER=root; wait for the exec, up to 60 s)
        users = []
        for _ in range(600):
            users = [environ(box, p).get("USER") for p in (pid, cpid)]
            if "root" not in users and None not in users:
                break
            time.sleep(0.1)
        assert users == [DYN_USER, DYN_USER]
        uid = re.search(r"^Uid:\t(\d+)\t", proc(box, pid, "status"), re.M).group(1)
        assert re.search(r"^Uid:\t%s\t%s\t%s\t%s$" % ((uid,) * 4), proc(box, cpid, "status"),
                         re.M)
        k = wait_compacted(box, DYN_STATE, pid, others={"ready"}, companion=comp)
        assert compacted_header(box, DYN_STATE, pid)["files"] == k
        box.run(["systemctl", "stop", DYN_UNIT])
        wait_inactive(box, comp)
        assert set(os.listdir(box.path(DYN_STATE))) == live_set(pid) | {"ready"}
        r = box.run([PY, MMLEAK, "report", DYN_STATE, "--pid", str(pid), "--no-html"])
        lines = r.stdout.splitlines()
        assert lines[1].startswith("  %d events (%d of them folded by compaction from %d "
                                   "files); " % (EVENTS, EVENTS, k + 1)), r.stdout
        table = [l for l in lines[3:] if "->" not in l and not l.startswith("  growth over ")]
        assert [tuple(line.split(None, 2)) for line in table] == [
            (str(N * SIZE), str(N), "remember at %s:%d" % (
                os.path.join(TESTS, "leaky_daemon.c"), site_line("leaky_daemon.c",
                                                                  "remember")))], r.stdout
    finally:
        box.run([PY, INSTALL, "uninstall", DYN_UNIT], check=False)
        box.run(["systemctl", "stop", DYN_UNIT, comp], check=False)


# ---------------------------------------------------------------------------------------------
# Attaching to a running service (issue #11): no restart, no drop-in

ATT_UNIT = "mmleak-attach.service"
ATT_STATE = "/var/lib/mmleak-attach"    # its StateDirectory=: writable under ProtectSystem=strict
ATT_DIR = ATT_STATE + "/dumps"
ATT_COMPANION = "mmleak-compact-mmleak-attach.service"
K = 5                   # blocks of SIZE bytes leaked by window_leak() per SIGUSR1
ATT_CMD = "%s %d %d 0 %d" % (BIN, N, SIZE, K)
ATT_TEXT = """[Unit]
Description=leaky daemon for tests/test_systemd.py (attach)

[Service]
User=%s
ExecStart=%%s
StateDirectory=mmleak-attach
PrivateTmp=yes
ProtectSystem=strict
Restart=on-failure
""" % USER
# a shell leaves a `sleep` in the unit's cgroup, then becomes the daemon
WITH_SLEEP = '/bin/sh -c "sleep 3600 & exec %s"' % ATT_CMD


def write_att_unit(box, execstart):
    with open(box.path("/etc/systemd/system/" + ATT_UNIT), "w") as f:
        f.write(ATT_TEXT % execstart)
    box.reload()


@pytest.fixture
def attach_daemon(box, daemon):
    """ATT_UNIT: the leaky daemon serving on after "ready" (one request a millisecond, K
    blocks leaked per SIGUSR1), Restart=on-failure (a crash would show in NRestarts), and
    a `sleep` in its cgroup (WITH_SLEEP); not started, no mmleak installed for it."""
    box.run(["rm", "-rf", ATT_STATE, "/var/lib/mmleak/" + ATT_UNIT,
             "/etc/systemd/system/%s.d" % ATT_UNIT, "/etc/systemd/system/" + ATT_COMPANION])
    write_att_unit(box, WITH_SLEEP)
    yield daemon
    box.run(["systemctl", "stop", ATT_UNIT, ATT_COMPANION], check=False)
    box.run([PY, INSTALL, "uninstall", ATT_UNIT], check=False)


def unit_status(box, unit, expect_rc):
    """mmleak-install.py status UNIT: (its 'process:' lines, without the label, stdout)."""
    r = box.run([PY, INSTALL, "status", unit], check=False)
    assert (r.returncode, r.stderr) == (expect_rc, ""), r
    procs = [line[16:] for line in r.stdout.splitlines()
             if line.startswith(("process:", "processes:"))]
    return procs, r.stdout


def mm_status(box):
    return box.run([PY, MMLEAK, "status"]).stdout


def status_line(pid, state, cmd=ATT_CMD):
    return "%7d  %-40s  %s\n" % (pid, state, cmd)


def service_props(box, unit):
    return dict(line.split("=", 1) for line in box.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "MainPID", "-p",
         "NRestarts", "-p", "ExecMainStartTimestampMonotonic", unit]).stdout.splitlines())


def sleeper(box, pid):
    """The pid of the `sleep` the daemon's shell left in the unit's cgroup."""
    return int(box.run(["pgrep", "-P", str(pid), "-x", "sleep"]).stdout)


def leak_in_window(box, pid, total):
    """SIGUSR1: the daemon leaks K blocks, serves one more request, and says TOTAL."""
    box.run(["kill", "-USR1", str(pid)])
    box.wait_file(ATT_STATE + "/leaked", content="%d\n" % total)


def window_report(box, ddir, tid, pid):
    """`mmleak.py report DDIR --trace TID --no-html` of an attached window: exactly the K
    blocks of window_leak(), nothing of the requests (each freed what it allocated: a
    whole number of malloc+free pairs), nothing allocated before the attach. Returns the
    number of requests the window saw.  (--trace: an earlier window too; --pid PID would
    take the process's newest.)"""
    r = box.run([PY, MMLEAK, "report", ddir, "--trace", tid, "--no-html"])
    lines = r.stdout.splitlines()
    assert lines[0] == "mmleak: trace %s (pid %d): %s" % (tid, pid, ATT_CMD), r.stdout
    m = re.match(r"^  (\d+) events (?:read from \d+ files|\(\d+ of them folded by compaction "
                 r"from \d+ files\)); 3\.8 KiB in %d blocks not freed; 0 frees of blocks "
                 r"allocated before tracing$" % K, lines[1])
    assert m, r.stdout
    requests, odd = divmod(int(m.group(1)) - K, 2)
    assert odd == 0 and requests >= 1, r.stdout
    assert lines[2].startswith("  an attached window (mmleak.py attach .. detach): "), r.stdout
    end = next((i for i, l in enumerate(lines) if l.startswith("  growth over ")), len(lines))
    assert lines[3].split() == ["bytes", "blocks", "call", "site"], r.stdout
    rows = [tuple(line.split(None, 2)) for line in lines[4:end]]
    assert rows == [(str(K * SIZE), str(K), "window_leak at %s:%d" % (
        os.path.join(TESTS, "leaky_daemon.c"), site_line("leaky_daemon.c", "window_leak")))], \
        r.stdout
    return requests


def visible_tree(box):
    """mmleak.py and mmleak.so at a path the service sees as we do: the build tree's own, or,
    when the tree is under /tmp or /var/tmp (which the service's PrivateTmp= replaces), a
    copy in the box (its writes go to the overlay's tmpfs, never to the host)."""
    if not os.path.realpath(ROOT).startswith(("/tmp/", "/var/tmp/")):
        return LIB, MMLEAK
    d = "/opt/mmleak-attach-test"
    box.run(["install", "-d", d])
    box.run(["install", "-m", "0644", LIB, d + "/mmleak.so"])
    box.run(["install", "-m", "0644", os.path.join(ROOT, "mmleak-tools.so"),
             d + "/mmleak-tools.so"])
    box.run(["install", "-m", "0755", MMLEAK, d + "/mmleak.py"])
    box.run(["install", "-d", d + "/mmleaklib"])         # the package mmleak.py imports
    box.run(["install", "-m", "0644"] + sorted(glob.glob(os.path.join(ROOT, "mmleaklib", "*.py")))
            + [d + "/mmleaklib/"])
    return d + "/mmleak.so", d + "/mmleak.py"


def test_attach_to_a_running_service_and_detach(box, attach_daemon, lib):
    """A service started without mmleak (User=, PrivateTmp=yes, ProtectSystem=strict),
    serving all the time: `mmleak.py attach MAINPID -d DIR` from outside its sandbox (DIR in
    its StateDirectory=, the library read-only under /work, both visible in its mount
    namespace), its leak in the window reported exactly, `mmleak.py detach`, and again; the
    service never restarted."""
    uid, gid = attach_daemon
    LIB_, MMLEAK_ = visible_tree(box)
    pid = start(box, ATT_UNIT, ATT_STATE)
    before = service_props(box, ATT_UNIT)
    assert (before["ActiveState"], before["MainPID"], before["NRestarts"]) == (
        "active", str(pid), "0")
    assert mapped(box, pid) == set()
    other = "%d: not traced (mmleak.so not loaded)" % sleeper(box, pid)
    procs, out = unit_status(box, ATT_UNIT, 3)
    assert procs == ["%d (main): not traced (mmleak.so not loaded)" % pid, other], out
    assert out.endswith("drop-in:        /etc/systemd/system/%s.d/mmleak.conf: absent\n"
                        "not installed\n" % ATT_UNIT)
    assert mm_status(box) == "no process has mmleak.so loaded\n"

    # where it can write (ProtectSystem=strict: / is read-only for it, /tmp is its own):
    # a directory of its user in its StateDirectory=; and the library mmleak.py injects
    # (the build tree's, found next to mmleak.py) is at the same path in its namespace
    box.run(["install", "-d", "-o", USER, "-g", USER, "-m", "0700", ATT_DIR])
    with open(box.path("/proc/%d/root%s" % (pid, LIB_)), "rb") as a, open(LIB, "rb") as b:
        assert a.read() == b.read()
    # what it cannot see, refused in one line before the service is touched: a directory of
    # ours in /tmp (the service's /tmp is its own, PrivateTmp=yes: no such directory there),
    # a library in our /tmp
    box.run(["install", "-d", "-m", "1777", "/tmp/mmleak-x"])
    box.run(["install", "-m", "0644", LIB_, "/tmp/mmleak-x/mmleak.so"])
    r = box.run([PY, MMLEAK_, "attach", str(pid), "-d", "/tmp/mmleak-x"], check=False)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", (
        "mmleak.py: /tmp/mmleak-x does not exist for process %d (another mount namespace or "
        "root, such as a service's PrivateTmp=): choose a directory it sees as we do\n" % pid))
    r = box.run(["env", "MMLEAK_LIB=/tmp/mmleak-x/mmleak.so", PY, MMLEAK_, "attach", str(pid),
                 "-d", ATT_DIR], check=False)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", (
        "mmleak.py: /tmp/mmleak-x/mmleak.so is not visible to process %d (another mount "
        "namespace or root: install mmleak.so where it can see it, e.g. `make install`)\n"
        % pid))
    assert mapped(box, pid) == set()
    assert os.listdir(box.path(ATT_DIR)) == []

    for cycle, tid in enumerate([str(pid), "%d-1" % pid]):
        r = box.run([PY, MMLEAK_, "attach", str(pid), "-d", ATT_DIR])
        assert (r.stdout, r.stderr) == (
            "mmleak.py: process %d is traced into %s (trace %s); stop with: %s detach %d\n"
            % (pid, ATT_DIR, tid, MMLEAK_, pid), "")
        assert mapped(box, pid) == {LIB_}
        assert mm_status(box) == status_line(pid, "tracing %s %s" % (tid, ATT_DIR))
        procs, out = unit_status(box, ATT_UNIT, 3)
        assert procs == ["%d (main): tracing %s %s" % (pid, tid, ATT_DIR), other], out
        leak_in_window(box, pid, K * (cycle + 1))
        # the daemon writes its own files, as its user, in its view of DIR
        files = {n: v for n, v in dump_files(box, ATT_DIR).items() if n.startswith(
            "mmleak.%s." % tid)}
        # (no .loads nor .lock: in the daemon's own directory they wait for a first need)
        assert set(files) == {"mmleak.%s.0.out" % tid, "mmleak.%s.0.tail" % tid,
                              "mmleak.%s.maps" % tid}, files
        assert {(u, g, m) for u, g, m, _ in files.values()} == {(uid, gid, 0o600)}

        r = box.run([PY, MMLEAK_, "detach", str(pid)])
        assert (r.stdout, r.stderr) == (
            "mmleak.py: process %d is no longer traced (trace %s in %s); its files are closed\n"
            "mmleak.py: next: %s report %s --pid %s\n" % (pid, tid, ATT_DIR, MMLEAK_, ATT_DIR,
                                                          tid), "")
        assert mm_status(box) == status_line(pid, "paused")
        procs, out = unit_status(box, ATT_UNIT, 3)
        assert procs == ["%d (main): paused" % pid, other], out
        files = {n: v for n, v in dump_files(box, ATT_DIR).items() if n.startswith(
            "mmleak.%s." % tid)}
        assert set(files) == {"mmleak.%s.0.out" % tid, "mmleak.%s.maps" % tid}, files
        assert {(u, g, m) for u, g, m, _ in files.values()} == {(uid, gid, 0o600)}
        window_report(box, ATT_DIR, tid, pid)

    # the first window's report is unchanged by the second
    window_report(box, ATT_DIR, str(pid), pid)
    # the same process all along, never restarted, still serving
    after = service_props(box, ATT_UNIT)
    assert after == before
    assert set(os.listdir(box.path(ATT_DIR))) == {
        "mmleak.%s.%s" % (t, x) for t in (str(pid), "%d-1" % pid)
        for x in ("0.out", "maps")}
    leak_in_window(box, pid, 3 * K)     # untraced now: nothing more is written
    assert set(os.listdir(box.path(ATT_DIR))) == {
        "mmleak.%s.%s" % (t, x) for t in (str(pid), "%d-1" % pid)
        for x in ("0.out", "maps")}


def test_install_paused_then_attach(box, attach_daemon, lib):
    """install --paused: the service starts with mmleak.so loaded and tracing nothing (no
    file written) until `mmleak.py attach MAINPID -d DIR` (DIR: the drop-in's, writable
    in its sandbox through the drop-in's ReadWritePaths=); detach pauses it again."""
    uid, gid = attach_daemon
    write_att_unit(box, ATT_CMD)    # no shell: see test_paused_service_that_forks below
    ddir = "/var/lib/mmleak/" + ATT_UNIT
    lib_in_box = "/usr/local/lib/mmleak/mmleak.so"
    r = box.run([PY, INSTALL, "install", ATT_UNIT, "--paused"])
    assert r.stderr == ""
    main = "$(systemctl show -p MainPID --value %s)" % ATT_UNIT
    assert r.stdout.endswith(
        "LD_PRELOAD=%s\nMMLEAK_DIR=%s\nMMLEAK_ROTATE_MB=8\nMMLEAK_PAUSED=1\n"
        "compactor: %s, as %s:%s, starts and stops with %s\n"
        "next steps:\n"
        "  systemctl restart %s     # starts %s too; the service starts paused\n"
        "  mmleak-install.py status %s\n"
        "  mmleak.py attach %s -d %s     # traces from now on\n"
        "  mmleak.py detach %s     # paused again; it prints the report command\n"
        "  mmleak-install.py uninstall %s     # when done\n" % (
            lib_in_box, ddir, ATT_COMPANION, USER, USER, ATT_UNIT, ATT_UNIT, ATT_COMPANION,
            ATT_UNIT, main, ddir, main, ATT_UNIT)), r.stdout
    pid = start(box, ATT_UNIT, ATT_STATE)
    before = service_props(box, ATT_UNIT)
    assert environ(box, pid)["MMLEAK_PAUSED"] == "1"
    assert mapped(box, pid) == {lib_in_box}
    assert status_line(pid, "paused") in mm_status(box)
    procs, out = unit_status(box, ATT_UNIT, 0)
    assert procs == ["%d (main): paused" % pid], out
    assert "MMLEAK_PAUSED:  1 (the service starts paused: mmleak.py attach MAINPID traces " \
           "it)\n" in out
    assert os.listdir(box.path(ddir)) == []     # paused from its start: not a file

    r = box.run([PY, MMLEAK, "attach", str(pid), "-d", ddir])
    assert r.stdout == "mmleak.py: process %d is traced into %s (trace %d); stop with: %s " \
                       "detach %d\n" % (pid, ddir, pid, MMLEAK, pid)
    procs, out = unit_status(box, ATT_UNIT, 0)
    assert procs == ["%d (main): tracing %d %s" % (pid, pid, ddir)], out
    leak_in_window(box, pid, K)
    r = box.run([PY, MMLEAK, "detach", str(pid)])
    assert r.stdout.startswith("mmleak.py: process %d is no longer traced (trace %d in %s); "
                               % (pid, pid, ddir))
    procs, out = unit_status(box, ATT_UNIT, 0)
    assert procs == ["%d (main): paused" % pid], out
    assert {(st.st_uid, st.st_gid) for st in (os.stat(box.path(ddir + "/" + n))
                                             for n in os.listdir(box.path(ddir)))} == {
        (uid, gid)}
    window_report(box, ddir, str(pid), pid)
    assert service_props(box, ATT_UNIT) == before


def test_paused_service_that_forks(box, attach_daemon, lib):
    """install --paused on a unit whose shell forks a `sleep` before it becomes the daemon:
    every process of the unit is paused and none writes a file."""
    ddir = "/var/lib/mmleak/" + ATT_UNIT
    box.run([PY, INSTALL, "install", ATT_UNIT, "--paused"])
    pid = start(box, ATT_UNIT, ATT_STATE)
    procs, out = unit_status(box, ATT_UNIT, 0)
    assert procs == ["%d (main): paused" % pid, "%d: paused" % sleeper(box, pid)], out
    assert os.listdir(box.path(ddir)) == []


# ---------------------------------------------------------------------------------------------
# A root service's trace handed to its user: the root companion compacts it as that user

PRIV_UNIT = "mmleak-priv.service"
PRIV_STATE = "/var/lib/mmleak-priv"
PRIV_COMPANION = "mmleak-compact-mmleak-priv.service"
PRIV_DIR = "/var/lib/mmleak/" + PRIV_UNIT
SETPRIV = "/usr/bin/setpriv"
STRACE_UNIT = "mmleak-strace-companion.service"
WRITES = re.compile(r'^(?:openat\(AT_FDCWD, "([^"]*)", [^)]*O_(?:CREAT|WRONLY|RDWR)|'
                    r'(?:rename|unlink|link|mkdir|rmdir|truncate|f?chown|lchown)\("([^"]*)")')


def strace_by_pid(box, log):
    """{pid: [lines]} of `strace -ff -o LOG` in the box (a file LOG.PID per process)."""
    d, base = os.path.split(box.path(log))
    out = {}
    for n in os.listdir(d):
        if n.startswith(base + "."):
            with open(os.path.join(d, n)) as f:
                out[int(n[len(base) + 1:])] = f.read().splitlines()
    return out


@pytest.mark.skipif(not (shutil.which("strace") and os.path.exists(SETPRIV)),
                    reason="needs strace and setpriv (the box is the host's /)")
def test_root_companion_compacts_a_handed_over_trace_as_its_owner(box, daemon, lib):
    """Debian's chrony.service, with the unit's whole sandbox: User=mmleakd but
    ExecStart=! (root), where setpriv becomes mmleakd (mmleak.so hands it the trace it
    wrote as root) and execs the daemon (a second trace, PID-1, mmleakd's).  The companion
    is root's, with CAP_SETUID and CAP_SETGID in its bounding set (mmleak-systemd(7)): every
    file of those traces it writes or deletes, to the last pass's, is by a child that took
    mmleakd's ids first (compact._as_user), none by the companion itself (strace in the
    box); with db1e687's unit (no CAP_SETUID) it compacted them itself, as root."""
    uid, gid = daemon
    logs = "/var/tmp/mmleak-companion-strace"
    box.run(["rm", "-rf", PRIV_STATE, PRIV_DIR, logs, "/etc/systemd/system/%s.d" % PRIV_UNIT,
             "/etc/systemd/system/" + PRIV_COMPANION])
    box.run(["mkdir", logs])
    with open(box.path("/etc/systemd/system/" + PRIV_UNIT), "w") as f:
        f.write("[Service]\nUser=%s\nExecStart=!%s --reuid=%s --regid=%s --init-groups "
                "%s %d %d %d\nStateDirectory=mmleak-priv\n" % (
                    USER, SETPRIV, USER, USER, BIN, N, SIZE, CHURN))
    box.reload()
    try:
        r = box.run([PY, INSTALL, "install", PRIV_UNIT])
        assert "create directory %s (mode 0700 owner %s:%s)\n" % (PRIV_DIR, USER, USER) in \
            r.stdout
        assert "compactor: %s, as root (as the service), starts and stops with %s\n" % (
            PRIV_COMPANION, PRIV_UNIT) in r.stdout
        pid = start(box, PRIV_UNIT, PRIV_STATE)
        tid = "%d-1" % pid                  # the daemon, after setpriv's exec
        assert re.search(r"^Uid:\t%d\t%d\t%d\t%d$" % ((uid,) * 4), proc(box, pid, "status"),
                         re.M)
        cpid = int(box.run(["systemctl", "show", "-p", "MainPID", "--value",
                            PRIV_COMPANION]).stdout)
        cst = proc(box, execed(box, cpid), "status")
        assert re.search(r"^Uid:\t0\t0\t0\t0$", cst, re.M), cst
        # CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SETGID, CAP_SETUID; the sandbox on
        assert re.search(r"^CapEff:\t00000000000000cb$", cst, re.M), cst
        assert re.search(r"^CapBnd:\t00000000000000cb$", cst, re.M), cst
        assert re.search(r"^NoNewPrivs:\t1$", cst, re.M), cst
        assert re.search(r"^Seccomp:\t2$", cst, re.M), cst

        # the companion at work: it has folded every dump file but the one the daemon still
        # writes (setpriv's, whose trace ended at the exec, and the daemon's rotated ones),
        # so its SIGTERM handler is in (stopped earlier, it dies in its imports: no last pass)
        deadline = time.monotonic() + 30
        while True:
            names = os.listdir(box.path(PRIV_DIR))
            live = [n[:-len(".tail")] + ".out" for n in names if n.endswith(".tail")]
            outs = [n for n in names if n.endswith(".out")]
            if len(live) == 1 and outs == live:
                break
            assert time.monotonic() < deadline, (sorted(names), box.journal(PRIV_COMPANION))
            time.sleep(0.1)
        assert live[0].startswith("mmleak.%s." % tid), live
        last = "%s/%s" % (PRIV_DIR, live[0])

        # strace the companion from outside its sandbox, from now to its end
        box.run(["systemd-run", "--unit", STRACE_UNIT, "strace", "-ff", "-qq", "-o",
                 logs + "/strace", "-e", "trace=setresuid,setresgid,openat,rename,renameat,"
                 "renameat2,unlink,unlinkat,link,linkat,mkdir,rmdir,truncate,chown,fchown,"
                 "lchown,fchownat", "-p", str(cpid)])
        deadline = time.monotonic() + 30
        while re.search(r"^TracerPid:\t0$", proc(box, cpid, "status"), re.M):
            assert time.monotonic() < deadline, box.journal(STRACE_UNIT)
            time.sleep(0.05)
        # the daemon's last file: only the companion's last pass, traced, folds it
        box.run(["systemctl", "stop", PRIV_UNIT])
        wait_inactive(box, PRIV_COMPANION)
        wait_inactive(box, STRACE_UNIT)

        # every write in the dump directory (and any chown) by a child that became mmleakd
        # (its uid, its gid) before, none by the companion; the last file folded so too
        calls = strace_by_pid(box, logs + "/strace")
        took = re.compile(r"^setres([ug])id\((\d+), \2, \2\) += 0$").match
        last_by = None
        for p, lines in sorted(calls.items()):
            became = set()
            for line in lines:
                m = took(line)
                if m and int(m.group(2)) == {"u": uid, "g": gid}[m.group(1)]:
                    became.add(m.group(1))
                m = WRITES.match(line)
                path = m and (m.group(1) or m.group(2))
                if path and (path.startswith(PRIV_DIR + "/") or "chown" in line):
                    assert p != cpid and became == {"u", "g"}, (p, line)
                    last_by = p if line.startswith('unlink("%s")' % last) else last_by
        assert cpid in calls and not any(took(line) for line in calls[cpid]), calls.get(cpid)
        assert last_by is not None, sorted(calls)

        # what is left: the two traces, compacted, every file mmleakd's; setpriv's .loads,
        # made as root and handed over by mmleak.so (fchown of the uid only), keeps root's
        # group: the trace was root's.  mmleakd's own trace, in mmleakd's own directory, has
        # none (it waits for a first line there)
        files = dump_files(box, PRIV_DIR)
        assert set(files) == {"mmleak.%s.%s" % (t, x) for t in (str(pid), tid)
                              for x in ("compact", "maps", "series", "lock")} | {
                                  "mmleak.%d.loads" % pid}, files
        for n, (u, g, m, _) in files.items():
            # (the root trace's .loads and .lock, made with it, handed over as they are)
            assert (n, u, g, m) == (n, uid, 0 if n in ("mmleak.%d.loads" % pid,
                                                       "mmleak.%d.lock" % pid) else gid,
                                    0o600), files
        assert report(box, PRIV_DIR, pid, tid)[:2] == (EVENTS, EVENTS)
    finally:
        box.run(["systemctl", "stop", PRIV_UNIT, PRIV_COMPANION, STRACE_UNIT], check=False)
        box.run(["systemctl", "reset-failed", STRACE_UNIT], check=False)
        box.run([PY, INSTALL, "uninstall", PRIV_UNIT], check=False)
