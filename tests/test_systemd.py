"""The daemon story under a real systemd as PID 1 (README "Tracing a daemon (systemd)").

Run: /usr/bin/python3 -m pytest tests/test_systemd.py  (as root; skipped otherwise)

The `box` fixture (tests/conftest.py, tests/nspawn_box.py) boots the host's own systemd with
systemd-nspawn on an overlay of / (upper layer on a tmpfs: the host is never written). In it,
tests/leaky_daemon.c runs as a service with User=, PrivateTmp=yes and ProtectSystem=strict;
mmleak-install.py installs the tracer for it, the service is restarted, and the report on the
running daemon must name its leak exactly; then uninstall, restart, and the tracer is gone.
"""
import os
import re
import shutil
import stat
import subprocess

import pytest

from conftest import LIB, ROOT, TESTS, site_line

PY = "/usr/bin/python3"
INSTALL = os.path.join(ROOT, "mmleak-install.py")
MMLEAK = os.path.join(ROOT, "mmleak.py")
UNIT = "mmleak-leaky.service"
USER = "mmleakd"
BIN = "/usr/local/bin/mmleak-leaky-daemon"
STATE = "/var/lib/mmleak-leaky"  # StateDirectory=: the daemon writes "ready" there
N, SIZE = 13, 777
UNIT_TEXT = """[Unit]
Description=leaky daemon for tests/test_systemd.py

[Service]
User=%s
ExecStart=%s %d %d
StateDirectory=mmleak-leaky
PrivateTmp=yes
ProtectSystem=strict
""" % (USER, BIN, N, SIZE)


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


def mapped(box, pid):
    """Paths of the files mapped by PID whose name is mmleak.so."""
    return {line.split(None, 5)[5] for line in proc(box, pid, "maps").splitlines()
            if line.count(" ") >= 5 and line.endswith("/mmleak.so")}


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


def start(box):
    """Restart the unit; wait until the daemon has leaked and says so. Returns MainPID."""
    box.run(["systemctl", "restart", UNIT])
    pid = box.wait_active(UNIT)
    box.wait_file(STATE + "/ready", content="%d\n" % pid)
    return pid


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
             "/etc/systemd/system/%s.d" % UNIT])
    if box.run(["id", "-u", USER], check=False).returncode != 0:
        box.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir",
                 "/nonexistent", "--shell", "/usr/sbin/nologin", USER])
    with open(box.path("/etc/systemd/system/" + UNIT), "w") as f:
        f.write(UNIT_TEXT)
    box.run(["systemctl", "daemon-reload"])
    uid = int(box.run(["id", "-u", USER]).stdout)
    gid = int(box.run(["id", "-g", USER]).stdout)
    yield uid, gid
    box.run(["systemctl", "stop", UNIT], check=False)


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


def test_daemon_traced_then_untraced(box, daemon, lib):
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
    fields, listing, out = status(box, 0)
    ddir, lib_in_box = fields["MMLEAK_DIR"], fields["LD_PRELOAD"]
    assert ddir.startswith("/var/lib/mmleak"), out  # not /tmp: PrivateTmp=yes
    assert "create directory %s (mode 0700 owner %s)\n" % (ddir, owner) in r.stdout
    assert fields["drop-in"] == "/etc/systemd/system/%s.d/mmleak.conf: present" % UNIT
    assert fields["library"] == "%s: present, %d bytes" % (lib_in_box, os.path.getsize(LIB))
    with open(box.path(lib_in_box), "rb") as a, open(LIB, "rb") as b:
        assert a.read() == b.read()
    assert ddir in fields["ReadWritePaths"].split()  # ProtectSystem=strict
    assert fields["dump dir"] == "%s: owner %s mode 0700, 0 dump files" % (ddir, owner)
    assert listing == {}
    # what systemd itself now has for the unit
    assert show(box, "Environment") == "LD_PRELOAD=%s MMLEAK_DIR=%s" % (lib_in_box, ddir)
    assert show(box, "ReadWritePaths") == fields["ReadWritePaths"]

    # restart: the new main process runs as the user, under the tracer
    pid = start(box)
    st = proc(box, pid, "status")
    assert re.search(r"^Uid:\t%d\t%d\t%d\t%d$" % ((uid,) * 4), st, re.M), st
    assert re.search(r"^Gid:\t%d\t%d\t%d\t%d$" % ((gid,) * 4), st, re.M), st
    assert mapped(box, pid) == {lib_in_box}
    env = environ(box, pid)
    assert (env.get("LD_PRELOAD"), env.get("MMLEAK_DIR")) == (lib_in_box, ddir)
    # its dump files, owned by the user; the daemon allocates nothing more, so they are still
    files = dump_files(box, ddir)
    assert sorted(files) == ["mmleak.%d.0.out" % pid, "mmleak.%d.0.tail" % pid,
                             "mmleak.%d.maps" % pid]
    assert {(u, g, m) for u, g, m, _ in files.values()} == {(uid, gid, 0o600)}
    fields, listing, out = status(box, 0)
    assert fields["dump dir"] == "%s: owner %s mode 0700, 2 dump files" % (ddir, owner)
    shown = {n: files[n][3] for n in files if n.endswith((".out", ".maps"))}
    assert listing == dict(shown, total=sum(shown.values())), out

    # the report on the running daemon names its leak, and nothing else
    r = box.run([PY, MMLEAK, "report", ddir, "--pid", str(pid), "--no-html"])
    lines = r.stdout.splitlines()
    assert lines[0] == "mmleak: trace %d (pid %d): %s %d %d" % (pid, pid, BIN, N, SIZE)
    # 1000 requests of 8 events (malloc, strdup, realloc = free + allocation, calloc, 3 frees)
    # and the N leaks, all in the main thread's file (its .tail: the daemon still runs)
    m = re.match(r"^  (\d+) events read from (\d+) files; .* in (\d+) blocks not freed; "
                 r"0 frees of blocks allocated before tracing$", lines[1])
    assert m and m.groups() == (str(8 * 1000 + N), "1", str(N)), lines[1]
    rows = [tuple(line.split(None, 2)) for line in lines[3:]]
    assert rows == [(str(N * SIZE), str(N), "remember at %s:%d" % (
        os.path.join(TESTS, "leaky_daemon.c"), site_line("leaky_daemon.c", "remember")))], \
        r.stdout

    # uninstall: the drop-in goes, systemd forgets the settings; the old process keeps the
    # tracer until the restart
    r = box.run([PY, INSTALL, "uninstall", UNIT])
    assert r.stderr == ""
    assert r.stdout.startswith(
        "remove /etc/systemd/system/{0}.d/mmleak.conf\n"
        "remove directory /etc/systemd/system/{0}.d (created by install, now empty)\n"
        "ran systemctl daemon-reload\n".format(UNIT)), r.stdout
    assert not os.path.lexists(box.path("/etc/systemd/system/%s.d" % UNIT))
    fields, _, out = status(box, 3)
    assert fields["drop-in"] == "/etc/systemd/system/%s.d/mmleak.conf: absent" % UNIT
    assert (show(box, "Environment"), show(box, "ReadWritePaths")) == ("", "")
    assert mapped(box, pid) == {lib_in_box}

    new = start(box)
    assert new != pid
    assert mapped(box, new) == set()
    env = environ(box, new)
    assert "LD_PRELOAD" not in env and "MMLEAK_DIR" not in env
    # the library and the old dumps are kept; the new process wrote none
    assert os.path.isfile(box.path(lib_in_box))
    assert sorted(dump_files(box, ddir)) == sorted(files)
