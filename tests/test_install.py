"""Tests for mmleak-install.py against scratch roots holding real unit files.

Run: /usr/bin/python3 -m pytest tests/test_install.py

Every install result is checked with ``systemd-analyze verify --root=ROOT UNIT``. The minimal
scratch tree it needs (found by trying): sysinit.target in a unit directory (the default
dependencies of a service pull it in; without it verify fails "Unit sysinit.target not found"),
and the ExecStart binary present and executable under the root. basic.target and
shutdown.target are added too so the tree looks like a system; no machine-id is needed.
"""
import hashlib
import re
import shlex
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import build_lib

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "mmleak-install.py")
MMLEAK_PY = os.path.join(os.path.dirname(HERE), "mmleak.py")
# mmleak.py's package, installed beside it
PACKAGE = sorted(n for n in os.listdir(os.path.join(os.path.dirname(HERE), "mmleaklib"))
                 if n.endswith(".py"))
PY = "/usr/bin/python3"
LIB = "/usr/local/lib/mmleak/mmleak.so"
ANALYZE = shutil.which("systemd-analyze")

UNITS = {
    "etc/systemd/system/plain.service":
        "[Unit]\nDescription=plain\n\n[Service]\nExecStart=/usr/bin/true\n",
    "usr/lib/systemd/system/ptmp.service":
        "[Unit]\nDescription=private tmp\n\n[Service]\nExecStart=/usr/bin/true\nPrivateTmp=yes\n",
    "usr/lib/systemd/system/strict.service":
        "[Unit]\nDescription=strict\n\n[Service]\nExecStart=-/usr/bin/true --flag\n"
        "ProtectSystem=strict\n",
    "usr/lib/systemd/system/owned.service":
        "[Unit]\nDescription=owned\n\n[Service]\nExecStart=/usr/bin/true\nUser=leaky\n"
        "Group=leakers\n",
    "usr/lib/systemd/system/preload.service":
        "[Unit]\nDescription=preload\n\n[Service]\n"
        "Environment=LD_PRELOAD=/usr/lib/libfoo.so\nExecStart=/usr/bin/true\n",
    "usr/lib/systemd/system/foo@.service":
        "[Unit]\nDescription=template %i\n\n[Service]\nExecStart=/usr/bin/true %i\n",
    "usr/lib/systemd/system/nouser.service":
        "[Unit]\nDescription=nouser\n\n[Service]\nExecStart=/usr/bin/true\nUser=ghost\n",
}
TARGETS = ("sysinit", "basic", "shutdown")


def header(unit, ddir=None, created="yes"):
    ddir = ddir or "/var/lib/mmleak/" + unit
    return (
        "# Written by mmleak-install.py: run %s under the mmleak leak tracer.\n"
        "# Undo: mmleak-install.py uninstall %s, then systemctl restart %s\n"
        "# (or delete this file and /etc/systemd/system/%s, run systemctl daemon-reload, and "
        "restart the service).\n"
        "# Kept on uninstall: the library /usr/local/lib/mmleak/mmleak.so, "
        "/usr/local/lib/mmleak/mmleak.py, the dumps in %s.\n"
        "# mmleak-install: dropin-dir-created=%s\n"
        "[Unit]\n"
        "Wants=%s\n" % (unit, unit, unit, companion(unit), ddir, created, companion(unit)))


def companion(unit):
    return "mmleak-compact-" + unit[:-len(".service")] + ".service"


def next_steps(unit, ddir=None):
    ddir = ddir or "/var/lib/mmleak/" + unit
    return (
        "next steps:\n"
        "  systemctl daemon-reload     # needed: not run (--root given)\n"
        "  systemctl restart %s     # starts %s too\n"
        "  mmleak-install.py status %s\n"
        "  mmleak.py report %s --pid $(systemctl show -p MainPID --value %s)\n"
        "  mmleak-install.py uninstall %s     # when done\n"
        % (unit, companion(unit), unit, ddir, unit, unit))


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    for d in ("etc/systemd/system", "usr/lib/systemd/system", "usr/bin", "usr/local/lib",
              "var/lib", "run", "tmp"):
        (r / d).mkdir(parents=True)
    shutil.copy2("/usr/bin/true", str(r / "usr/bin/true"))
    # the companion's ExecStart binary: systemd-analyze verify wants it executable
    shutil.copy2("/usr/bin/true", str(r / "usr/bin/python3"))
    for t in TARGETS:
        (r / "usr/lib/systemd/system" / (t + ".target")).write_text(
            "[Unit]\nDescription=%s\n" % t)
    (r / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                  "leaky:x:4321:4321:leaky daemon:/nonexistent:/usr/sbin/nologin\n")
    (r / "etc/group").write_text("root:x:0:\nleaky:x:4321:\nleakers:x:4400:leaky\n")
    for path, text in UNITS.items():
        (r / path).write_text(text)
    return r


@pytest.fixture
def lib(tmp_path):
    p = tmp_path / "build" / "mmleak.so"
    p.parent.mkdir()
    p.write_bytes(b"\x7fELF dummy mmleak library\n")
    return str(p)


def run(root, *args, lib=None, preexec=None, env=None, script=SCRIPT):
    cmd = [PY, script]
    if root is not None:
        cmd += ["--root", str(root)]
    cmd += list(args)
    if lib is not None:
        cmd += ["--lib", lib]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, preexec_fn=preexec, env=env)
    assert "Traceback" not in p.stderr
    out = p.stdout.replace(str(root), "ROOT") if root is not None else p.stdout
    err = p.stderr.replace(str(root), "ROOT") if root is not None else p.stderr
    return p.returncode, out, err


def snapshot(root):
    """Full listing: path -> (type, mode, uid, gid, sha256 or link target)."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(str(root)):
        for n in dirnames + filenames + ["."] if dirpath == str(root) else dirnames + filenames:
            p = os.path.normpath(os.path.join(dirpath, n))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    extra = hashlib.sha256(f.read()).hexdigest()
            else:
                extra = None
            snap[os.path.relpath(p, str(root))] = (stat.S_IFMT(st.st_mode),
                                                   stat.S_IMODE(st.st_mode), st.st_uid,
                                                   st.st_gid, extra)
    return snap


def verify(root, unit):
    if ANALYZE is None:
        pytest.skip("systemd-analyze not installed")
    p = subprocess.run([ANALYZE, "verify", "--root=%s" % root, unit], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    assert (p.returncode, p.stdout) == (0, "")


def dropin(root, unit):
    return (root / "etc/systemd/system" / (unit + ".d") / "mmleak.conf").read_text()


# --------------------------------------------------------------------------------------------
# install

# The companion of a root service (plain.service), exactly.
PLAIN_COMPANION = """\
# Written by mmleak-install.py: the compactor of plain.service's mmleak dumps.
# Every second it folds the complete dump files in /var/lib/mmleak/plain.service into
# mmleak.ID.compact and deletes them, so disk use stays bounded by the live set.
# plain.service's drop-in mmleak.conf Wants= it: it starts with the service; BindsTo=:
# it stops with it, with one last pass (SIGTERM) once the traced processes ended.
# Undo: mmleak-install.py uninstall plain.service (removes this file too).
[Unit]
Description=mmleak compactor for plain.service
BindsTo=plain.service
StartLimitIntervalSec=1min
StartLimitBurst=5

[Service]
Environment=MMLEAK_DIR=/var/lib/mmleak/plain.service
ExecStart=/usr/bin/python3 /usr/local/lib/mmleak/mmleak.py compact --follow --forever --verbose ${MMLEAK_DIR}
Restart=on-failure
RestartSec=5s
TimeoutStopSec=5min
UMask=0077
NoNewPrivileges=yes
PrivateTmp=yes
PrivateDevices=yes
PrivateNetwork=yes
ProtectSystem=strict
ProtectHome=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
CapabilityBoundingSet=CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_SETUID CAP_SETGID
ReadWritePaths=-/var/lib/mmleak/plain.service
"""


ROOT_CAPS = "CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_SETUID CAP_SETGID"


def companion_text(unit, ddir=None, user="", caps="", home="yes", last=None):
    """PLAIN_COMPANION for another unit: USER the User=/Group=/DynamicUser= lines, CAPS the
    capability bounding set, LAST the line that opens DDIR (default ReadWritePaths=-DDIR)."""
    ddir = ddir or "/var/lib/mmleak/" + unit
    t = PLAIN_COMPANION.replace("plain.service", unit).replace(
        "/var/lib/mmleak/" + unit, ddir)
    t = t.replace("[Service]\n", "[Service]\n" + user)
    t = t.replace("CapabilityBoundingSet=%s\n" % ROOT_CAPS,
                  "CapabilityBoundingSet=%s\n" % caps)
    t = t.replace("ProtectHome=yes\n", "ProtectHome=%s\n" % home)
    if last is not None:
        t = t.replace("ReadWritePaths=-%s\n" % ddir, last + "\n")
    return t


def companion_file(root, unit):
    return (root / "etc/systemd/system" / companion(unit)).read_text()


def test_install_plain_exact(root, lib):
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert (rc, err) == (0, "")
    assert out == (
        "root: ROOT\n"
        "create directory /usr/local/lib/mmleak (mode 0755)\n"
        "copy %s -> /usr/local/lib/mmleak/mmleak.so (mode 0644)\n"
        "copy %s -> /usr/local/lib/mmleak/mmleak.py (mode 0644)\n"
        "create directory /var/lib/mmleak (mode 0755)\n"
        "create directory /var/lib/mmleak/plain.service (mode 0700 owner root:root)\n"
        "write /etc/systemd/system/mmleak-compact-plain.service\n"
        "create directory /etc/systemd/system/plain.service.d (mode 0755)\n"
        "write /etc/systemd/system/plain.service.d/mmleak.conf\n"
        "LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "MMLEAK_DIR=/var/lib/mmleak/plain.service\n"
        "MMLEAK_ROTATE_MB=8\n"
        "compactor: mmleak-compact-plain.service, as root (as the service), starts and stops "
        "with plain.service\n" % (lib, MMLEAK_PY) + next_steps("plain.service"))
    assert companion_file(root, "plain.service") == PLAIN_COMPANION
    comp = root / "etc/systemd/system/mmleak-compact-plain.service"
    assert stat.S_IMODE(comp.stat().st_mode) == 0o644
    py = root / "usr/local/lib/mmleak/mmleak.py"
    assert py.read_bytes() == open(MMLEAK_PY, "rb").read()
    assert stat.S_IMODE(py.stat().st_mode) == 0o644
    assert dropin(root, "plain.service") == header("plain.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/plain.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n")
    conf = root / "etc/systemd/system/plain.service.d/mmleak.conf"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644
    so = root / LIB.lstrip("/")
    assert so.read_bytes() == open(lib, "rb").read()
    assert stat.S_IMODE(so.stat().st_mode) == 0o644
    d = (root / "var/lib/mmleak/plain.service").stat()
    assert (stat.S_IMODE(d.st_mode), d.st_uid, d.st_gid) == (0o700, 0, 0)
    d = (root / "var/lib/mmleak").stat()
    assert (stat.S_IMODE(d.st_mode), d.st_uid, d.st_gid) == (0o755, 0, 0)
    # no temporary files left behind by the atomic writes
    assert os.listdir(str(conf.parent)) == ["mmleak.conf"]
    assert sorted(os.listdir(str(so.parent))) == ["mmleak.py", "mmleak.so", "mmleaklib"]
    # mmleak.py's package beside it (the companion imports it), file for file, no temporary
    assert sorted(os.listdir(str(so.parent / "mmleaklib"))) == PACKAGE
    for n in PACKAGE:
        assert (so.parent / "mmleaklib" / n).read_bytes() == open(
            os.path.join(os.path.dirname(HERE), "mmleaklib", n), "rb").read()
    assert sorted(os.listdir(str(comp.parent))) == ["mmleak-compact-plain.service",
                                                    "plain.service", "plain.service.d"]
    verify(root, "plain.service")
    verify(root, "mmleak-compact-plain.service")


def test_install_depth_and_dir(root, lib):
    rc, out, err = run(root, "install", "plain.service", "--depth", "8", "--dir",
                       "/srv/leak dumps", lib=lib)
    assert (rc, err) == (0, "")
    assert dropin(root, "plain.service") == header("plain.service", "/srv/leak dumps") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=\"MMLEAK_DIR=/srv/leak dumps\"\n"
        "Environment=MMLEAK_ROTATE_MB=8\n"
        "Environment=MMLEAK_DEPTH=8\n")
    assert stat.S_IMODE((root / "srv/leak dumps").stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "srv").stat().st_mode) == 0o755
    verify(root, "plain.service")


def test_private_tmp_default_dir_ok(root, lib):
    rc, out, err = run(root, "install", "ptmp.service", lib=lib)
    assert (rc, err) == (0, "")
    assert dropin(root, "ptmp.service") == header("ptmp.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/ptmp.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n")
    verify(root, "ptmp.service")


@pytest.mark.parametrize("ddir", ["/tmp", "/tmp/mmleak", "/var/tmp/x"])
def test_private_tmp_dir_in_tmp_is_error(root, lib, ddir):
    before = snapshot(root)
    rc, out, err = run(root, "install", "ptmp.service", "--dir", ddir, lib=lib)
    top = "/var/tmp" if ddir.startswith("/var/tmp") else "/tmp"
    assert (rc, out) == (1, "")
    assert err == (
        "mmleak-install.py: error: --dir %s is under %s but ptmp.service has PrivateTmp=yes: "
        "the service sees a private %s that is deleted when it stops, so the dumps would be "
        "lost; use --dir /var/lib/mmleak/ptmp.service\n" % (ddir, top, top))
    assert snapshot(root) == before


def test_protect_system_strict_adds_readwritepaths(root, lib):
    rc, out, err = run(root, "install", "strict.service", lib=lib)
    assert (rc, err) == (0, "")
    assert dropin(root, "strict.service") == header("strict.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/strict.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n"
        "ReadWritePaths=/var/lib/mmleak/strict.service\n")
    verify(root, "strict.service")


def test_unit_made_by_a_generator(root, lib):
    """Debian's exim4.service has no unit file: systemd-sysv-generator makes it from
    /etc/init.d/exim4 at boot, in /run/systemd/generator.late ("unknown unit" before).  The
    drop-in goes to /etc/systemd/system as for any unit; a unit file in /etc overrides it."""
    gen = root / "run/systemd/generator.late"
    gen.mkdir(parents=True)
    (gen / "sysv.service").write_text(
        "# Automatically generated by systemd-sysv-generator\n[Unit]\nSourcePath=/etc/init.d/"
        "sysv\n[Service]\nType=forking\nUser=leaky\nExecStart=/usr/bin/true start\n")
    rc, out, err = run(root, "install", "sysv.service", "--no-reload", lib=lib)
    assert (rc, err) == (0, ""), err
    assert dropin(root, "sysv.service") == header("sysv.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/sysv.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n")
    assert "\nUser=leaky\n" in companion_file(root, "sysv.service")
    rc, out, err = run(root, "status", "sysv.service")
    assert rc == 0 and out.splitlines()[1] == \
        "unit:           sysv.service (/run/systemd/generator.late/sysv.service)", out


def test_protect_system_full_and_home(root, lib):
    (root / "usr/lib/systemd/system/full.service").write_text(
        "[Service]\nExecStart=/usr/bin/true\nProtectSystem=full\n")
    (root / "usr/lib/systemd/system/home.service").write_text(
        "[Service]\nExecStart=/usr/bin/true\nProtectHome=read-only\n")
    (root / "home").mkdir()
    assert run(root, "install", "full.service", lib=lib)[0] == 0
    assert dropin(root, "full.service").endswith("ReadWritePaths=/var/lib/mmleak/full.service\n")
    # ProtectHome only matters for a directory under /home
    assert run(root, "install", "home.service", lib=lib)[0] == 0
    assert dropin(root, "home.service").endswith("MMLEAK_DIR=/var/lib/mmleak/home.service\n"
                                                 "Environment=MMLEAK_ROTATE_MB=8\n")
    assert "\nProtectHome=yes\n" in companion_file(root, "home.service")
    assert run(root, "install", "home.service", "--dir", "/home/dumps", lib=lib)[0] == 0
    assert dropin(root, "home.service").endswith(
        "MMLEAK_DIR=/home/dumps\nEnvironment=MMLEAK_ROTATE_MB=8\nReadWritePaths=/home/dumps\n")
    # the companion too: /home read-only but for the dump directory
    assert companion_file(root, "home.service") == companion_text(
        "home.service", "/home/dumps", caps=ROOT_CAPS, home="read-only")
    for unit in ("full.service", "home.service"):
        verify(root, unit)
        verify(root, companion(unit))


def test_user_group_owns_dump_dir(root, lib):
    rc, out, err = run(root, "install", "owned.service", lib=lib)
    assert (rc, err) == (0, "")
    assert "create directory /var/lib/mmleak/owned.service (mode 0700 owner leaky:leakers)\n" \
        in out
    d = (root / "var/lib/mmleak/owned.service").stat()
    assert (stat.S_IMODE(d.st_mode), d.st_uid, d.st_gid) == (0o700, 4321, 4400)
    verify(root, "owned.service")


def test_user_without_group_uses_primary_group(root, lib):
    (root / "usr/lib/systemd/system/u.service").write_text(
        "[Service]\nExecStart=/usr/bin/true\nUser=leaky\n")
    assert run(root, "install", "u.service", lib=lib)[0] == 0
    d = (root / "var/lib/mmleak/u.service").stat()
    assert (d.st_uid, d.st_gid) == (4321, 4321)


def test_unresolvable_user_is_error(root, lib):
    before = snapshot(root)
    rc, out, err = run(root, "install", "nouser.service", lib=lib)
    assert (rc, out) == (2, "")
    assert err == ("mmleak-install.py: error: cannot resolve User=ghost of nouser.service in "
                   "ROOT/etc/passwd: create the user first (systemd cannot start the service "
                   "without it either)\n")
    assert snapshot(root) == before


def test_existing_ld_preload_is_merged(root, lib):
    # mmleak.so goes FIRST: an allocator preloaded by the unit (jemalloc) comes after it, so
    # mmleak's malloc calls that allocator through RTLD_NEXT and records its blocks
    rc, out, err = run(root, "install", "preload.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: note: preload.service already sets "
                   "LD_PRELOAD=/usr/lib/libfoo.so (in /usr/lib/systemd/system/preload.service):"
                   " kept, after mmleak's library: mmleak.so goes first and records the "
                   "allocations of the libraries after it (such as jemalloc)\n")
    assert dropin(root, "preload.service") == header("preload.service") + (
        "[Service]\n"
        "Environment=\"LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so /usr/lib/libfoo.so\"\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/preload.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n")
    assert "LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so /usr/lib/libfoo.so\n" in out
    verify(root, "preload.service")
    env, rwp, bad = systemd_sees(root, "preload.service")
    assert env["LD_PRELOAD"] == "/usr/local/lib/mmleak/mmleak.so /usr/lib/libfoo.so"
    # idempotent: the merge is computed without our own drop-in, so no double append
    rc, out, err = run(root, "install", "preload.service", lib=lib)
    assert rc == 0
    assert "already installed: /etc/systemd/system/preload.service.d/mmleak.conf is up to " \
           "date\n" in out
    assert dropin(root, "preload.service").count("mmleak.so") == 2   # 1 in a comment


def test_dropins_accumulate_and_reset(root, lib):
    # A drop-in that resets Environment= (empty assignment) removes the unit's LD_PRELOAD,
    # then sets another one: only that one must be kept.
    d = root / "usr/lib/systemd/system/preload.service.d"
    d.mkdir()
    (d / "10-reset.conf").write_text("[Service]\nEnvironment=\nEnvironment=A=1 "
                                     "\"LD_PRELOAD=/opt/libbar.so\"\n")
    assert run(root, "install", "preload.service", lib=lib)[0] == 0
    assert "Environment=\"LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so /opt/libbar.so\"\n" in \
        dropin(root, "preload.service")
    verify(root, "preload.service")


def test_later_dropin_overriding_ld_preload_warns(root, lib):
    d = root / "etc/systemd/system/plain.service.d"
    d.mkdir()
    (d / "override.conf").write_text("[Service]\nEnvironment=LD_PRELOAD=/opt/libz.so\n")
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert rc == 0
    assert err == (
        "mmleak-install.py: note: plain.service already sets LD_PRELOAD=/opt/libz.so (in "
        "/etc/systemd/system/plain.service.d/override.conf): kept, after mmleak's library: "
        "mmleak.so goes first and records the allocations of the libraries after it (such as "
        "jemalloc)\n"
        "mmleak-install.py: warning: /etc/systemd/system/plain.service.d/override.conf sorts "
        "after mmleak.conf and sets LD_PRELOAD, which overrides mmleak's setting; merge it by "
        "hand\n")
    # the directory existed before: recorded as not created by install
    assert header("plain.service", created="no") in dropin(root, "plain.service")
    run(root, "uninstall", "plain.service")
    assert os.listdir(str(d)) == ["override.conf"]


def test_template_instance(root, lib):
    td = root / "usr/lib/systemd/system/foo@.service.d"
    td.mkdir()
    (td / "env.conf").write_text("[Service]\nEnvironment=LD_PRELOAD=/usr/lib/libfoo.so\n")
    rc, out, err = run(root, "install", "foo@bar.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: note: foo@bar.service already sets "
                   "LD_PRELOAD=/usr/lib/libfoo.so (in "
                   "/usr/lib/systemd/system/foo@.service.d/env.conf): kept, after mmleak's "
                   "library: mmleak.so goes first and records the allocations of the libraries "
                   "after it (such as jemalloc)\n")
    assert not (root / "etc/systemd/system/foo@.service.d").exists()
    assert dropin(root, "foo@bar.service") == header("foo@bar.service") + (
        "[Service]\n"
        "Environment=\"LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so /usr/lib/libfoo.so\"\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/foo@bar.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n")
    verify(root, "foo@bar.service")
    rc, out, err = run(root, "status", "foo@bar.service")
    assert rc == 0
    assert out.splitlines()[1] == "unit:           foo@bar.service " \
                                  "(/usr/lib/systemd/system/foo@.service)"


def test_the_compiled_shrinker_goes_with_the_library(root, lib, tmp_path):
    """The library's step also copies mmleak-tools.so from beside it (the compactor's compiled
    shrinker, which it loads from beside the installed mmleak.so) and mmleak-scan (which
    mmleak.so starts from beside itself at a process's exit: without it a service left with
    two threads at its exit had no scan), and a new build of one alone is copied again: the
    library is not "up to date" until all are."""
    d = tmp_path / "newbuild"
    d.mkdir()
    shutil.copy(lib, d / "mmleak.so")
    (d / "mmleak-tools.so").write_bytes(b"tools 1")
    (d / "mmleak-scan").write_bytes(b"scan 1")
    assert run(root, "install", "plain.service", lib=str(d / "mmleak.so"))[0] == 0
    tools = root / "usr/local/lib/mmleak/mmleak-tools.so"
    scanner = root / "usr/local/lib/mmleak/mmleak-scan"
    assert tools.read_bytes() == b"tools 1" and oct(tools.stat().st_mode & 0o777) == "0o644"
    assert scanner.read_bytes() == b"scan 1" and oct(scanner.stat().st_mode & 0o777) == "0o755"
    (d / "mmleak-tools.so").write_bytes(b"tools 2")
    rc, out, err = run(root, "install", "plain.service", lib=str(d / "mmleak.so"))
    assert (rc, err) == (0, "")
    assert "copy %s -> /usr/local/lib/mmleak/mmleak.so (mode 0644)\n" % (d / "mmleak.so") in out
    assert tools.read_bytes() == b"tools 2"
    (d / "mmleak-scan").write_bytes(b"scan 2")
    rc, out, err = run(root, "install", "plain.service", lib=str(d / "mmleak.so"))
    assert (rc, err) == (0, "")
    assert scanner.read_bytes() == b"scan 2" and oct(scanner.stat().st_mode & 0o777) == "0o755"
    rc, out, err = run(root, "install", "plain.service", lib=str(d / "mmleak.so"))
    assert "library /usr/local/lib/mmleak/mmleak.so is up to date\n" in out


def test_idempotent(root, lib):
    assert run(root, "install", "strict.service", lib=lib)[0] == 0
    first = snapshot(root)
    rc, out, err = run(root, "install", "strict.service", lib=lib)
    assert (rc, err) == (0, "")
    assert out == (
        "root: ROOT\n"
        "library /usr/local/lib/mmleak/mmleak.so is up to date\n"
        "/usr/local/lib/mmleak/mmleak.py is up to date\n"
        "dump directory /var/lib/mmleak/strict.service exists\n"
        "companion /etc/systemd/system/mmleak-compact-strict.service is up to date\n"
        "already installed: /etc/systemd/system/strict.service.d/mmleak.conf is up to date\n"
        "LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "MMLEAK_DIR=/var/lib/mmleak/strict.service\n"
        "MMLEAK_ROTATE_MB=8\n"
        "compactor: mmleak-compact-strict.service, as root (as the service), starts and stops "
        "with strict.service\n" + next_steps("strict.service"))
    assert snapshot(root) == first


def test_reinstall_with_new_options_updates(root, lib):
    assert run(root, "install", "plain.service", lib=lib)[0] == 0
    rc, out, err = run(root, "install", "plain.service", "--depth", "3", lib=lib)
    assert rc == 0
    assert "update /etc/systemd/system/plain.service.d/mmleak.conf\n" in out
    # still recorded as created by install, so uninstall removes the directory
    assert dropin(root, "plain.service") == header("plain.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/plain.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n"
        "Environment=MMLEAK_DEPTH=3\n")
    run(root, "uninstall", "plain.service")
    assert not (root / "etc/systemd/system/plain.service.d").exists()


def test_dry_run_changes_nothing(root, lib):
    before = snapshot(root)
    rc, out, err = run(root, "--dry-run", "install", "strict.service", lib=lib)
    assert (rc, err) == (0, "")
    assert out == (
        "dry run: nothing changed (root ROOT).\n"
        "drop-in /etc/systemd/system/strict.service.d/mmleak.conf:\n" +
        "".join("    " + line + "\n" for line in (header("strict.service") + (
            "[Service]\n"
            "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
            "Environment=MMLEAK_DIR=/var/lib/mmleak/strict.service\n"
            "Environment=MMLEAK_ROTATE_MB=8\n"
            "ReadWritePaths=/var/lib/mmleak/strict.service\n")).splitlines()) +
        "companion /etc/systemd/system/mmleak-compact-strict.service:\n" +
        "".join(("    " + line).rstrip() + "\n" for line in companion_text(
            "strict.service", caps=ROOT_CAPS).splitlines()) +
        "actions:\n"
        "  create directory /usr/local/lib/mmleak (mode 0755)\n"
        "  copy %s -> /usr/local/lib/mmleak/mmleak.so (mode 0644)\n"
        "  copy %s -> /usr/local/lib/mmleak/mmleak.py (mode 0644)\n"
        "  create directory /var/lib/mmleak (mode 0755)\n"
        "  create directory /var/lib/mmleak/strict.service (mode 0700 owner root:root)\n"
        "  write /etc/systemd/system/mmleak-compact-strict.service\n"
        "  create directory /etc/systemd/system/strict.service.d (mode 0755)\n"
        "  write /etc/systemd/system/strict.service.d/mmleak.conf\n"
        "  no systemctl daemon-reload (--root given)\n" % (lib, MMLEAK_PY))
    assert snapshot(root) == before
    # the option is also accepted after the subcommand
    assert run(root, "install", "strict.service", "--dry-run", lib=lib)[1] == out
    assert snapshot(root) == before
    # and for uninstall
    assert run(root, "install", "strict.service", lib=lib)[0] == 0
    mid = snapshot(root)
    rc, out, err = run(root, "uninstall", "strict.service", "--dry-run")
    assert (rc, err) == (0, "")
    assert out == ("dry run: nothing changed (root ROOT).\n"
                   "actions:\n"
                   "  remove /etc/systemd/system/strict.service.d/mmleak.conf\n"
                   "  remove directory /etc/systemd/system/strict.service.d (created by "
                   "install, now empty)\n"
                   "  remove /etc/systemd/system/mmleak-compact-strict.service\n"
                   "  no systemctl daemon-reload (--root given)\n")
    assert snapshot(root) == mid


@pytest.mark.parametrize("unit", ["plain.service", "ptmp.service", "strict.service",
                                  "owned.service", "preload.service", "foo@bar.service"])
def test_round_trip_leaves_tree_identical(root, lib, unit):
    before = snapshot(root)
    assert run(root, "install", unit, lib=lib)[0] == 0
    assert snapshot(root) != before
    rc, out, err = run(root, "uninstall", unit)
    assert (rc, err) == (0, "")
    assert out == (
        "root: ROOT\n"
        "remove /etc/systemd/system/%s.d/mmleak.conf\n"
        "remove directory /etc/systemd/system/%s.d (created by install, now empty)\n"
        "remove /etc/systemd/system/%s\n"
        "kept: library /usr/local/lib/mmleak/mmleak.so, /usr/local/lib/mmleak/mmleak.py and "
        "dump directory /var/lib/mmleak/%s (delete them by hand when no longer needed: rm -r "
        "/var/lib/mmleak/%s)\n"
        "next steps:\n"
        "  systemctl daemon-reload     # needed: not run (--root given)\n"
        "  systemctl restart %s     # the running process is traced until then\n"
        "  systemctl stop %s     # after the restart: its last pass folds the old process's "
        "dump files\n"
        % (unit, unit, companion(unit), unit, unit, unit, companion(unit)))
    after = snapshot(root)
    # Exactly the documented leftovers differ: the library and mmleak.py copies and the
    # dump directory (the companion is gone).
    kept = {"usr/local/lib/mmleak", "usr/local/lib/mmleak/mmleak.so",
            "usr/local/lib/mmleak/mmleak.py", "var/lib/mmleak", "var/lib/mmleak/" + unit,
            "usr/local/lib/mmleak/mmleaklib"} | {"usr/local/lib/mmleak/mmleaklib/" + n
                                                 for n in PACKAGE}
    assert set(after) ^ set(before) == kept
    common = set(before) - {".", "usr/local/lib", "var/lib"}
    assert {k: after[k] for k in common} == {k: before[k] for k in common}
    # the parent directories differ only in nothing we compare (mtime is not compared)
    for k in (".", "usr/local/lib", "var/lib"):
        assert after[k] == before[k]


def test_uninstall_keeps_existing_dropin_dir(root, lib):
    d = root / "etc/systemd/system/plain.service.d"
    d.mkdir()
    (d / "limits.conf").write_text("[Service]\nLimitNOFILE=4096\n")
    before = snapshot(root)
    assert run(root, "install", "plain.service", lib=lib)[0] == 0
    rc, out, err = run(root, "uninstall", "plain.service")
    assert "remove directory" not in out
    after = snapshot(root)
    assert {k: v for k, v in after.items() if not k.startswith(("usr/local/lib/mmleak",
                                                                "var/lib/mmleak"))} == before


def test_uninstall_not_installed(root):
    rc, out, err = run(root, "uninstall", "plain.service")
    assert (rc, err) == (0, "")
    assert out == ("not installed: /etc/systemd/system/plain.service.d/mmleak.conf does not "
                   "exist; nothing to do\n")


def test_uninstall_refuses_foreign_dropin(root, lib):
    d = root / "etc/systemd/system/plain.service.d"
    d.mkdir()
    (d / "mmleak.conf").write_text("[Service]\nEnvironment=X=1\n")
    before = snapshot(root)
    rc, out, err = run(root, "uninstall", "plain.service")
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: /etc/systemd/system/plain.service.d/mmleak.conf "
                   "was not written by mmleak-install.py; not removing it\n")
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert rc == 1
    assert err == ("mmleak-install.py: error: /etc/systemd/system/plain.service.d/mmleak.conf "
                   "exists and was not written by mmleak-install.py; not touching it\n")
    assert snapshot(root) == before


# --------------------------------------------------------------------------------------------
# status

def test_status(root, lib):
    rc, out, err = run(root, "status", "plain.service")
    assert (rc, err) == (3, "")
    assert out == ("root:           ROOT\n"
                   "unit:           plain.service (/etc/systemd/system/plain.service)\n"
                   "processes:      unknown (--root: a system tree, not the running system)\n"
                   "drop-in:        /etc/systemd/system/plain.service.d/mmleak.conf: absent\n"
                   "not installed\n")
    assert run(root, "install", "owned.service", "--depth", "2", lib=lib)[0] == 0
    d = root / "var/lib/mmleak/owned.service"
    (d / "mmleak.123.out").write_bytes(b"x" * 100)
    (d / "mmleak.123.maps").write_bytes(b"y" * 7)
    (d / "mmleak.99.compact").write_bytes(b"c" * 1000)   # a compacted trace
    (d / "mmleak.99.maps").write_bytes(b"m" * 3)
    for n in ("mmleak.99.series", "mmleak.99.lock", "mmleak.123.0.tail", "unrelated.txt"):
        (d / n).write_bytes(b"z")                         # not listed
    rc, out, err = run(root, "status", "owned.service")
    assert (rc, err) == (0, "")
    # --root: systemd is not asked whether the companion runs
    assert out == (
        "root:           ROOT\n"
        "unit:           owned.service (/usr/lib/systemd/system/owned.service)\n"
        "processes:      unknown (--root: a system tree, not the running system)\n"
        "drop-in:        /etc/systemd/system/owned.service.d/mmleak.conf: present\n"
        "LD_PRELOAD:     /usr/local/lib/mmleak/mmleak.so\n"
        "MMLEAK_DIR:     /var/lib/mmleak/owned.service\n"
        "MMLEAK_DEPTH:   2\n"
        "MMLEAK_ROTATE_MB: 8\n"
        "library:        /usr/local/lib/mmleak/mmleak.so: present, 26 bytes\n"
        "companion:      /etc/systemd/system/mmleak-compact-owned.service: present\n"
        "dump dir:       /var/lib/mmleak/owned.service: owner leaky:leakers mode 0700, 3 dump "
        "files, 1 compacted trace\n"
        "             7  mmleak.123.maps\n"
        "           100  mmleak.123.out\n"
        "          1000  mmleak.99.compact\n"
        "             3  mmleak.99.maps\n"
        "          1110  total\n")
    os.unlink(str(root / LIB.lstrip("/")))
    rc, out, err = run(root, "status", "owned.service")
    assert rc == 0
    assert "library:        /usr/local/lib/mmleak/mmleak.so: MISSING (the service will start " \
           "without it)\n" in out


def test_status_of_a_hostile_services_dump_dir(root, lib):
    # The service writes its dump directory: a name of its with an escape or a newline went
    # raw to root's terminal (a title set, a line of status written), and a million names
    # were a million lines.  Now names are printed as the reports print them, and at most
    # STATUS_NAMES of them (the counts and the total are of all).
    assert run(root, "install", "owned.service", lib=lib)[0] == 0
    d = root / "var/lib/mmleak/owned.service"
    (d / "mmleak.1\x1b]2;pwned\x07.out").write_bytes(b"x")
    (d / "mmleak.0\ncompanion: forged.out").write_bytes(b"yy")
    for i in range(250):
        (d / ("mmleak.%d.maps" % (1000 + i))).write_bytes(b"")
    rc, out, err = run(root, "status", "owned.service")
    assert (rc, err) == (0, "")
    assert "\x1b" not in out and "\x07" not in out and "\ncompanion: forged" not in out
    assert "             1  mmleak.1\\x1b]2;pwned\\x07.out\n" in out, out
    assert "             2  mmleak.0\\x0acompanion: forged.out\n" in out, out
    assert "dump dir:       /var/lib/mmleak/owned.service: owner leaky:leakers mode 0700, " \
        "252 dump files, 0 compacted traces\n" in out
    assert out.endswith("  and 52 more files\n             3  total\n"), out[-300:]


# --------------------------------------------------------------------------------------------
# bad input: one error line, the documented exit code, nothing written

BAD = [
    (["install", "a/b.service"], 1, "invalid unit name 'a/b.service': it must not contain "
     "'/'; give the unit's name (like nfs-ganesha.service), not a path"),
    (["install", "x..y.service"], 1, "invalid unit name 'x..y.service': it must not contain "
     "'..'"),
    (["install", "fo o.service"], 1, "invalid unit name 'fo o.service': only letters, digits "
     "and ':_.\\@-' are allowed"),
    (["install", "nfs-ganesha"], 1, "invalid unit name 'nfs-ganesha': it needs a unit type "
     "suffix such as .service (did you mean nfs-ganesha.service?)"),
    (["install", "foo.socket"], 1, "'foo.socket' is not a service: only .service units run a "
     "daemon that mmleak can trace"),
    (["install", "foo@.service"], 1, "'foo@.service' is a template; name an instance such as "
     "foo@NAME.service"),
    (["install", "a@b@c.service"], 1, "invalid unit name 'a@b@c.service'"),
    (["install", "nosuch.service"], 1, "unknown unit nosuch.service: no unit file in "
     "/run/systemd/generator.early, /etc/systemd/system, /run/systemd/system, "
     "/run/systemd/generator, /usr/local/lib/systemd/system, /usr/lib/systemd/system, "
     "/lib/systemd/system, /run/systemd/generator.late"),
    (["status", "nosuch.service"], 1, "unknown unit nosuch.service: no unit file in "
     "/run/systemd/generator.early, /etc/systemd/system, /run/systemd/system, "
     "/run/systemd/generator, /usr/local/lib/systemd/system, /usr/lib/systemd/system, "
     "/lib/systemd/system, /run/systemd/generator.late"),
    (["install", "plain.service", "--lib", "/nonexistent/mmleak.so"], 2,
     "--lib /nonexistent/mmleak.so: no such file"),
    (["install", "plain.service", "--dir", "relative/dir"], 1,
     "--dir relative/dir: must be an absolute path"),
    (["install", "plain.service", "--depth", "0"], 1,
     "argument --depth: must be at least 1: '0'"),
    (["install", "plain.service", "--depth", "x"], 1,
     "argument --depth: not an integer: 'x'"),
    (["install"], 1, "the following arguments are required: UNIT"),
    ([], 1, "the following arguments are required: COMMAND"),
    (["frobnicate", "x.service"], 1, "argument COMMAND: invalid choice: 'frobnicate' (choose "
     "from 'install', 'status', 'uninstall')"),
]


@pytest.mark.parametrize("args,code,msg", BAD, ids=[" ".join(a) or "none" for a, c, m in BAD])
def test_bad_input(root, lib, args, code, msg):
    before = snapshot(root)
    extra = ["--lib", lib] if args[:1] == ["install"] and "--lib" not in args and \
        len(args) > 1 else []
    rc, out, err = run(root, *(args + extra))
    assert (rc, out, err) == (code, "", "mmleak-install.py: error: %s\n" % msg)
    assert snapshot(root) == before


def test_masked_unit(root, lib):
    os.symlink("/dev/null", str(root / "etc/systemd/system/ptmp.service"))
    before = snapshot(root)
    rc, out, err = run(root, "install", "ptmp.service", lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: unit ptmp.service is masked "
                   "(/etc/systemd/system/ptmp.service -> /dev/null)\n")
    assert snapshot(root) == before


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_unreadable_root(tmp_path, lib, kind):
    bad = tmp_path / "notaroot"
    if kind == "file":
        bad.write_text("x")
    rc, out, err = run(bad, "install", "plain.service", lib=lib)
    assert (rc, out, err) == (2, "", "mmleak-install.py: error: --root ROOT: not a directory\n")
    assert os.listdir(str(tmp_path)) == (["build", "notaroot"] if kind == "file" else ["build"])


def test_non_root_user_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")

    def drop():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    # the checkout may sit in a directory only root can enter (a CI clone in mktemp -d):
    # run a copy the unprivileged user can read
    pub = tempfile.mkdtemp(prefix="mmleak-install-test.")
    try:
        os.chmod(pub, 0o755)
        copy_tools(pathlib.Path(pub))
        for dirpath, _, names in os.walk(pub):
            os.chmod(dirpath, 0o755)
            for n in names:
                os.chmod(os.path.join(dirpath, n), 0o644)
        script = os.path.join(pub, "mmleak-install.py")
        rc, out, err = run(None, "install", "plain.service", "--lib", "/usr/bin/true",
                           preexec=drop, script=script)
        rc2, out2, err2 = run(None, "uninstall", "plain.service", preexec=drop, script=script)
    finally:
        shutil.rmtree(pub)
    assert (rc, out) == (2, "")
    assert err == ("mmleak-install.py: error: must be run as root (it writes under "
                   "/etc/systemd/system); use sudo, or --dry-run to see what it would do\n")
    assert rc2 == 2 and err2.startswith("mmleak-install.py: error: must be run as root")


def copy_tools(d):
    """A copy of the tool, with mmleak.py and the package (mmleaklib/) next to it, in D."""
    shutil.copy(SCRIPT, str(d / "mmleak-install.py"))
    shutil.copy(MMLEAK_PY, str(d / "mmleak.py"))
    shutil.copytree(os.path.join(os.path.dirname(SCRIPT), "mmleaklib"), str(d / "mmleaklib"),
                    ignore=shutil.ignore_patterns("__pycache__"))


def test_missing_library_without_lib(tmp_path, root):
    # A copy of the tool with mmleak.py but no mmleak.so next to it, no $MMLEAK_LIB.
    if any(os.path.isfile(p) for p in (LIB, "/usr/lib/mmleak/mmleak.so")):
        pytest.skip("a mmleak.so is installed on this machine")
    d = tmp_path / "bin"
    d.mkdir()
    copy_tools(d)
    env = {k: v for k, v in os.environ.items() if k != "MMLEAK_LIB"}
    before = snapshot(root)
    p = subprocess.run([PY, str(d / "mmleak-install.py"), "--root", str(root), "install",
                        "plain.service"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, env=env)
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == ("mmleak-install.py: error: mmleak.so not found ($MMLEAK_LIB, next to "
                        "mmleak.py, PREFIX/lib/mmleak, /usr/local/lib/mmleak, /usr/lib/mmleak): "
                        "build it with make, or pass --lib PATH\n")
    assert snapshot(root) == before
    # found through mmleak.find_library() via $MMLEAK_LIB, then copied to the stable path
    env["MMLEAK_LIB"] = str(tmp_path / "lib.so")
    (tmp_path / "lib.so").write_bytes(b"lib")
    p = subprocess.run([PY, str(d / "mmleak-install.py"), "--root", str(root), "install",
                        "plain.service"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, env=env)
    assert p.returncode == 0
    assert (root / LIB.lstrip("/")).read_bytes() == b"lib"


def test_library_already_at_stable_path(root, lib):
    (root / "usr/local/lib/mmleak").mkdir()
    shutil.copy(lib, str(root / LIB.lstrip("/")))
    rc, out, err = run(root, "install", "plain.service", lib=str(root / LIB.lstrip("/")))
    assert rc == 0
    assert "-> /usr/local/lib/mmleak/mmleak.so" not in out and "library" not in out


# --------------------------------------------------------------------------------------------
# warnings

def add_unit(root, name, body):
    (root / "usr/lib/systemd/system" / name).write_text("[Service]\n" + body)


def test_warn_setuid(root, lib):
    b = root / "usr/bin/suid-true"
    shutil.copy2("/usr/bin/true", str(b))
    os.chmod(str(b), 0o4755)
    add_unit(root, "suid.service", "ExecStart=!/usr/bin/suid-true\n")
    rc, out, err = run(root, "install", "suid.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: warning: ExecStart binary /usr/bin/suid-true is "
                   "setuid/setgid: the dynamic loader ignores LD_PRELOAD for it "
                   "(secure-execution mode), so it will not be traced\n")
    assert (root / "etc/systemd/system/suid.service.d/mmleak.conf").exists()
    verify(root, "suid.service")


def test_warn_static(root, lib, tmp_path):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed: cannot build a static binary")
    src = tmp_path / "s.c"
    src.write_text("int main(void){return 0;}\n")
    out_bin = root / "usr/bin/static-true"
    p = subprocess.run([gcc, "-static", "-o", str(out_bin), str(src)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    if p.returncode != 0:
        pytest.skip("gcc -static failed (no libc.a?)")
    add_unit(root, "static.service", "ExecStart=@/usr/bin/static-true static-true\n")
    rc, out, err = run(root, "install", "static.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: warning: ExecStart binary /usr/bin/static-true is "
                   "statically linked (no PT_INTERP): LD_PRELOAD has no effect on it, so it "
                   "cannot be traced\n")
    verify(root, "static.service")


def test_dynamic_binary_no_warning(root, lib):
    # /usr/bin/true is dynamically linked: no warning (the ELF parser finds PT_INTERP),
    # and a relative name is looked up in systemd's fixed search path.
    add_unit(root, "rel.service", "ExecStart=-true 'a b'\n")
    rc, out, err = run(root, "install", "rel.service", lib=lib)
    assert (rc, err) == (0, "")
    verify(root, "rel.service")


def test_warn_env_i(root, lib):
    shutil.copy2("/usr/bin/true", str(root / "usr/bin/env"))  # a stand-in env binary
    add_unit(root, "envi.service", "ExecStart=/usr/bin/env -i PATH=/bin /usr/bin/true\n")
    add_unit(root, "envok.service", "ExecStart=/usr/bin/env A=1 /usr/bin/true\n")
    add_unit(root, "envlong.service", "ExecStart=env --ignore-environment /usr/bin/true\n")
    rc, out, err = run(root, "install", "envi.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: warning: ExecStart runs '/usr/bin/env -i', which "
                   "clears the environment: LD_PRELOAD and MMLEAK_DIR will not reach the "
                   "command it starts\n")
    verify(root, "envi.service")
    assert run(root, "install", "envok.service", lib=lib)[:3:2] == (0, "")
    rc, out, err = run(root, "install", "envlong.service", lib=lib)
    assert err == ("mmleak-install.py: warning: ExecStart runs '/usr/bin/env "
                   "--ignore-environment', which clears the environment: LD_PRELOAD and "
                   "MMLEAK_DIR will not reach the command it starts\n")


def test_warn_shell_wrapper(root, lib):
    w = root / "usr/bin/wrapper"
    w.write_text("#!/bin/sh\nexec env -i /usr/bin/true \"$@\"\n")
    os.chmod(str(w), 0o755)
    add_unit(root, "wrap.service", "ExecStart=/usr/bin/wrapper --serve\n")
    rc, out, err = run(root, "install", "wrap.service", lib=lib)
    assert rc == 0
    assert err == (
        "mmleak-install.py: warning: ExecStart /usr/bin/wrapper is a script (#!/bin/sh): mmleak "
        "also traces the interpreter, and the daemon is not traced if the script clears the "
        "environment\n"
        "mmleak-install.py: warning: ExecStart script /usr/bin/wrapper runs 'env -i', which "
        "clears the environment: the daemon it starts will not get LD_PRELOAD\n")
    verify(root, "wrap.service")


def test_note_memory_deny_write_execute(root, lib):
    add_unit(root, "mdwe.service", "ExecStart=/usr/bin/true\nMemoryDenyWriteExecute=yes\n")
    rc, out, err = run(root, "install", "mdwe.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: note: mdwe.service has MemoryDenyWriteExecute=yes: this "
                   "is compatible, mmleak needs no writable+executable memory\n")
    verify(root, "mdwe.service")


def test_warn_dynamic_user(root, lib):
    add_unit(root, "dyn.service", "ExecStart=/usr/bin/true\nDynamicUser=yes\n"
                                  "StateDirectory=dyn\n")
    rc, out, err = run(root, "install", "dyn.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: warning: dyn.service has DynamicUser=yes: its user "
                   "exists only while it runs and cannot write /var/lib/mmleak/dyn.service "
                   "(root-owned); the dump directory must be under its StateDirectory= "
                   "(/var/lib/dyn), pass --dir; ReadWritePaths=/var/lib/mmleak/dyn.service was "
                   "added\n")
    assert dropin(root, "dyn.service").endswith("ReadWritePaths=/var/lib/mmleak/dyn.service\n")
    # the companion shares the service's dynamic user (by name: dyn, from the unit's name)
    assert companion_file(root, "dyn.service") == companion_text(
        "dyn.service", "/var/lib/mmleak/dyn.service", user="DynamicUser=yes\nUser=dyn\n")
    verify(root, "dyn.service")
    verify(root, "mmleak-compact-dyn.service")
    # under StateDirectory=: no warning, systemd creates the directory itself
    rc, out, err = run(root, "install", "dyn.service", "--dir", "/var/lib/dyn", lib=lib)
    assert (rc, err) == (0, "mmleak-install.py: note: /var/lib/dyn is under StateDirectory=; "
                            "systemd creates it for the dynamic user\n")
    assert not (root / "var/lib/dyn").exists()
    assert dropin(root, "dyn.service").endswith("MMLEAK_DIR=/var/lib/dyn\n"
                                                "Environment=MMLEAK_ROTATE_MB=8\n")
    assert "compactor: mmleak-compact-dyn.service, as the dynamic user dyn (shared with the " \
           "service), starts and stops with dyn.service\n" in out
    # ... and reaches the directory as the service does, through its StateDirectory=
    assert companion_file(root, "dyn.service") == companion_text(
        "dyn.service", "/var/lib/dyn", user="DynamicUser=yes\nUser=dyn\n",
        last="StateDirectory=dyn")
    verify(root, "mmleak-compact-dyn.service")


@pytest.mark.parametrize("unit,body,user", [
    # User= given: that name
    ("dyn2.service", "User=svc\nGroup=grp\n", "User=svc\nGroup=grp\n"),
    # a template instance: the prefix before '@'
    ("dyn3@x.service", "", "User=dyn3\n"),
    # not a valid user name ('.'): systemd hashes it; the value is the name systemd 252 gave
    # this unit's dynamic user (seen in a systemd-nspawn box, tests/test_systemd.py)
    ("mmleak.dyn.service", "", "User=_du0e0a4d2f37caba9e\n"),
    # longer than 31 characters: hashed too
    ("a234567890123456789012345678901x.service", "", None),
])
def test_dynamic_user_name_of_companion(root, lib, unit, body, user):
    add_unit(root, unit.replace("@x", "@"), "ExecStart=/usr/bin/true\nDynamicUser=yes\n"
                                            "StateDirectory=dd\n" + body)
    rc, out, err = run(root, "install", unit, "--dir", "/var/lib/dd", lib=lib)
    assert rc == 0
    text = companion_file(root, unit)
    lines = [l for l in text.splitlines() if l.startswith(("DynamicUser=", "User=", "Group="))]
    if user is None:
        assert lines[0] == "DynamicUser=yes" and re.fullmatch(r"User=_du[0-9a-f]{16}", lines[1])
        assert len(lines) == 2
    else:
        assert "\n".join(lines) + "\n" == "DynamicUser=yes\n" + user
    verify(root, companion(unit))


# --------------------------------------------------------------------------------------------
# help

@pytest.mark.parametrize("cmd", [[], ["install"], ["status"], ["uninstall"]])
def test_help(cmd):
    p = subprocess.run([PY, SCRIPT] + cmd + ["--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    assert (p.returncode, p.stderr) == (0, "")
    assert "exit codes:\n  0  success" in p.stdout
    assert "  3  status only: not installed (no drop-in)\n" in p.stdout
    if cmd:
        assert "/etc/systemd/system/UNIT.d" in p.stdout
    if cmd == ["install"]:
        assert "/usr/local/lib/mmleak/mmleak.so" in p.stdout
        assert "--dry-run" in p.stdout and "--root DIR" in p.stdout


def test_library_found_next_to_mmleak_py(tmp_path, root):
    # A build tree: mmleak.so next to mmleak.py. Python would import mmleak.so as a C
    # extension before mmleak.py; the tool must load mmleak.py and find the library.
    d = tmp_path / "tree"
    d.mkdir()
    copy_tools(d)
    (d / "mmleak.so").write_bytes(b"built library")
    env = {k: v for k, v in os.environ.items() if k != "MMLEAK_LIB"}
    p = subprocess.run([PY, str(d / "mmleak-install.py"), "--root", str(root), "install",
                        "plain.service"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, env=env)
    assert (p.returncode, p.stderr) == (0, "")
    assert "copy %s -> /usr/local/lib/mmleak/mmleak.so (mode 0644)\n" % (d / "mmleak.so") \
        in p.stdout
    assert (root / LIB.lstrip("/")).read_bytes() == b"built library"


# --------------------------------------------------------------------------------------------
# What systemd itself reads from the drop-in
#
# `systemd --user --test` loads units like the manager does (the same parser for quotes, C
# escapes and % specifiers as the system manager) and dumps them, "Environment: K=V" and
# "ReadWritePaths: P" included. It refuses to run as root, so it runs as nobody on a copy of
# the unit file and its drop-ins in a world-readable user configuration directory.

SYSTEMD = "/lib/systemd/systemd"


def systemd_sees(root, unit):
    """(environment dict, ReadWritePaths string or None, parse complaints) systemd reads."""
    block, complaints = systemd_dump(root, unit)
    env_seen = dict(l[len("Environment: "):].split("=", 1) for l in block
                    if l.startswith("Environment: "))
    rwp = [l[len("ReadWritePaths: "):] for l in block if l.startswith("ReadWritePaths: ")]
    return env_seen, (rwp[0] if rwp else None), complaints


def systemd_dump(root, unit):
    """The lines `systemd --test` dumps for UNIT (its settings, one per line; an ExecStart
    as "Command Line: ARGV..." quoted as systemd holds it), and its complaints about our
    files."""
    if not os.access(SYSTEMD, os.X_OK):
        pytest.skip("%s not installed" % SYSTEMD)
    top = tempfile.mkdtemp(prefix="mmleak-sd-test.")
    try:
        os.chmod(top, 0o755)
        udir = os.path.join(top, "cfg/systemd/user")
        os.makedirs(udir)
        template = unit.split("@")[0] + "@.service" if "@" in unit else None
        for name in [unit] + ([template] if template else []):
            for d in ("usr/lib/systemd/system", "etc/systemd/system"):
                src = root / d / name
                if src.is_file():
                    shutil.copy(str(src), os.path.join(udir, name))
                if (root / d / (name + ".d")).is_dir():
                    dst = os.path.join(udir, name + ".d")
                    os.makedirs(dst, exist_ok=True)
                    for f in os.listdir(str(root / d / (name + ".d"))):
                        shutil.copy(str(root / d / (name + ".d") / f), dst)
        with open(os.path.join(udir, "default.target"), "w") as f:
            f.write("[Unit]\nDescription=test\nWants=%s\n" % unit)
        os.mkdir(os.path.join(top, "run"), 0o700)
        for dirpath, dirnames, filenames in os.walk(top):
            for n in dirnames:
                os.chmod(os.path.join(dirpath, n), 0o755)
            for n in filenames:
                os.chmod(os.path.join(dirpath, n), 0o644)
        env = {"HOME": top, "XDG_CONFIG_HOME": os.path.join(top, "cfg"),
               "XDG_RUNTIME_DIR": os.path.join(top, "run"), "SYSTEMD_LOG_TARGET": "console",
               "PATH": "/usr/bin:/bin"}
        pre = None
        if os.geteuid() == 0:
            os.chown(os.path.join(top, "run"), 65534, 65534)

            def pre():
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
        p = subprocess.run([SYSTEMD, "--user", "--test", "--no-pager"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, preexec_fn=pre)
        assert p.returncode == 0, p.stderr
        block, inside = [], False
        for line in p.stdout.split("\n"):
            if line.startswith("\t-> Unit "):
                inside = line == "\t-> Unit %s:" % unit
            elif inside and line.startswith("\t\t"):
                block.append(line[2:])
        assert block, "unit %s not in the dump" % unit
        complaints = [l for l in p.stderr.splitlines() if "mmleak" in l]
        return [l.lstrip("\t") for l in block], complaints
    finally:
        shutil.rmtree(top)


# --------------------------------------------------------------------------------------------
# Review #8: several services with different users; --dir that must not be touched; values
# systemd would read differently

def add_user(root, name, uid):
    with open(str(root / "etc/passwd"), "a") as f:
        f.write("%s:x:%d:%d::/nonexistent:/usr/sbin/nologin\n" % (name, uid, uid))
    with open(str(root / "etc/group"), "a") as f:
        f.write("%s:x:%d:\n" % (name, uid))


def owner_mode(path):
    st = os.stat(str(path))
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_two_services_with_different_users(root, lib):
    # Each unit gets its own dump directory, owned by its own user, under a root-owned
    # /var/lib/mmleak that every user can traverse.
    add_user(root, "other", 4500)
    add_unit(root, "second.service", "ExecStart=/usr/bin/true\nUser=other\n")
    rc, out, err = run(root, "install", "owned.service", lib=lib)
    assert (rc, err) == (0, "")
    assert ("create directory /var/lib/mmleak (mode 0755)\n"
            "create directory /var/lib/mmleak/owned.service (mode 0700 owner leaky:leakers)\n"
            ) in out
    rc, out, err = run(root, "install", "second.service", lib=lib)
    assert (rc, err) == (0, "")
    assert "create directory /var/lib/mmleak/second.service (mode 0700 owner other:other)\n" \
        in out
    assert "MMLEAK_DIR=/var/lib/mmleak/second.service\n" in out
    assert next_steps("second.service", "/var/lib/mmleak/second.service") in out
    assert owner_mode(root / "var/lib/mmleak") == (0, 0, 0o755)
    assert owner_mode(root / "var/lib/mmleak/owned.service") == (4321, 4400, 0o700)
    assert owner_mode(root / "var/lib/mmleak/second.service") == (4500, 4500, 0o700)
    for unit in ("owned.service", "second.service"):
        verify(root, unit)
        env, rwp, bad = systemd_sees(root, unit)
        assert (env, rwp, bad) == ({"LD_PRELOAD": LIB,
                                    "MMLEAK_DIR": "/var/lib/mmleak/" + unit,
                                    "MMLEAK_ROTATE_MB": "8"}, None, [])


def test_old_layout_parent_is_made_traversable(root, lib):
    # /var/lib/mmleak as the previous version left it: mode 0700, owned by the first
    # service's user, its dumps inside. It becomes the root-owned parent, dumps kept.
    d = root / "var/lib/mmleak"
    d.mkdir(mode=0o700)
    (d / "mmleak.99.0.out").write_text("x")
    os.chown(str(d), 4321, 4321)
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert (rc, err) == (0, "")
    assert ("set owner root:root and mode 0755 of /var/lib/mmleak (the parent of the per-unit "
            "dump directories)\n"
            "create directory /var/lib/mmleak/plain.service (mode 0700 owner root:root)\n") in out
    assert owner_mode(d) == (0, 0, 0o755)
    assert (d / "mmleak.99.0.out").read_text() == "x"


def test_default_parent_with_foreign_files_is_not_changed(root, lib):
    d = root / "var/lib/mmleak"
    d.mkdir(mode=0o700)
    (d / "notes.txt").write_text("mine")
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: /var/lib/mmleak holds files other than mmleak "
                   "dumps and per-unit dump directories, and User=leaky cannot traverse it "
                   "(owner root:root mode 0700): not changing it; pass --dir\n")
    assert snapshot(root) == before


SYSTEM_DIRS = ["/", "/etc", "/usr", "/usr/lib", "/var", "/var/lib", "/var/log", "/home",
               "/root", "/boot", "/proc", "/dev", "/run", "/etc/mmleak", "/usr/local/lib/x",
               "/var/lib/mmleak"]


@pytest.mark.parametrize("ddir", SYSTEM_DIRS)
def test_system_directory_refused(root, lib, ddir):
    for d in ("usr/lib", "var/log", "home", "root", "boot", "proc", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", "--dir", ddir, lib=lib)
    assert (rc, out) == (1, "")
    if ddir == "/var/lib/mmleak":
        assert err == ("mmleak-install.py: error: --dir /var/lib/mmleak holds the per-unit "
                       "dump directories; omit --dir to use /var/lib/mmleak/owned.service\n")
    else:
        assert err == ("mmleak-install.py: error: --dir %s is a system directory: "
                       "mmleak-install.py neither puts dumps there nor changes its owner or "
                       "mode; omit --dir to use /var/lib/mmleak/owned.service\n" % ddir)
    assert snapshot(root) == before


def test_symlink_to_system_directory_refused(root, lib):
    (root / "srv").mkdir()
    os.symlink("/etc", str(root / "srv/dumps"))
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/dumps", lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: --dir /srv/dumps (/etc) is a system directory: "
                   "mmleak-install.py neither puts dumps there nor changes its owner or mode; "
                   "omit --dir to use /var/lib/mmleak/owned.service\n")
    assert snapshot(root) == before


def test_existing_directory_with_other_files_never_changed(root, lib):
    d = root / "srv/data"
    d.mkdir(parents=True)
    (d / "precious.db").write_text("data")
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/data", lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: --dir /srv/data holds files other than mmleak.* "
                   "and User=leaky cannot write it (owner root:root mode 0755): "
                   "mmleak-install.py does not change the owner or mode of such a directory; "
                   "choose an empty or new directory, or give leaky write access yourself\n")
    assert snapshot(root) == before
    # writable by the unit's user: used as it is, nothing changed
    os.chown(str(d), 4321, 4321)
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/data", lib=lib)
    assert (rc, err) == (0, "")
    assert "dump directory /srv/data exists\n" in out
    assert {k: v for k, v in snapshot(root).items() if k.startswith("srv")} == \
        {k: v for k, v in before.items() if k.startswith("srv")}


def test_existing_directory_the_tool_did_not_make_is_not_given_away(root, lib):
    # `mkdir /srv/dumps` by hand (root-owned 0755) then --dir: the service could not write
    # there.  Issue 17, item 3: the tool gives the unit's user only a directory it makes
    # (or one of its own in /var/lib/mmleak): refused, nothing changed.  (An earlier version
    # handed an empty or dumps-only directory to the unit's user.)
    d = root / "srv/dumps"
    d.mkdir(parents=True)
    (d / "mmleak.5.0.out").write_text("old dump")
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/dumps", lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: --dir /srv/dumps exists and User=leaky cannot "
                   "write it (owner root:root mode 0755): mmleak-install.py gives the unit's "
                   "user only a directory it creates (or one of its own in /var/lib/mmleak); "
                   "give leaky write access yourself, or name a directory that does not exist "
                   "yet\n")
    assert snapshot(root) == before
    # given to the user by hand: used as it is
    os.chown(str(d), 4321, 4400)
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/dumps", lib=lib)
    assert (rc, err) == (0, "")
    assert "dump directory /srv/dumps exists\n" in out
    assert owner_mode(d) == (4321, 4400, 0o755)
    verify(root, "owned.service")


NOBODY = 65534


def plant(root, link, target):
    """A symbolic link at LINK (in ROOT) to TARGET, owned by nobody, as a local user makes
    one in /tmp."""
    os.symlink(target, str(root / link))
    os.lchown(str(root / link), NOBODY, NOBODY)


@pytest.mark.parametrize("ddir", ["/tmp/dd", "/tmp/dd/sub", "/tmp/mid/dumps"])
def test_dir_through_another_users_link_is_refused(root, lib, ddir):
    """Issue 17, item 3: a link nobody planted in /tmp, to an empty directory of root's (or
    to its parent): install refused it, before changing anything, whether --dir is the link,
    goes on below it, or goes through one.  An earlier version chowned the link's target to
    the unit's user."""
    os.chmod(str(root / "tmp"), 0o1777)
    (root / "srv/victim").mkdir(parents=True)
    plant(root, "tmp/dd", "/srv/victim")
    plant(root, "tmp/mid", "/srv")
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", "--dir", ddir, lib=lib)
    link = "/" + "/".join(ddir.split("/")[1:3])
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: --dir %s: %s is a symbolic link owned by uid "
                   "65534, not root: mmleak-install.py does not follow it; give the real "
                   "path\n" % (ddir, link))
    assert snapshot(root) == before
    assert owner_mode(root / "srv/victim") == (0, 0, 0o755)


@pytest.mark.parametrize("link", ["usr/local/lib/mmleak", "etc/systemd/system/plain.service.d",
                                  "var/lib/mmleak"])
def test_other_paths_through_another_users_link_are_refused(root, lib, link):
    """The siblings: the library's directory, the drop-in directory, the parent of the
    per-unit dump directories, each a link of nobody's to a directory of root's: refused
    before anything is done, the link's target untouched."""
    (root / "srv/victim").mkdir(parents=True)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    plant(root, link, "/srv/victim")
    before = snapshot(root)
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert (rc, out) == (1, "")
    what = ("the dump directory /var/lib/mmleak/plain.service" if link == "var/lib/mmleak"
            else "/" + link)
    assert err == ("mmleak-install.py: error: %s: /%s is a symbolic link owned by uid 65534, "
                   "not root: mmleak-install.py does not follow it; give the real path\n"
                   % (what, link))
    assert snapshot(root) == before


def test_dir_through_roots_link_is_followed(root, lib):
    """A link of root's on the way is followed as before: the directory is made at its
    target and given to the unit's user."""
    (root / "data").mkdir()
    os.symlink("/data", str(root / "srv"))
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/dumps", lib=lib)
    assert (rc, err) == (0, "")
    assert "create directory /srv/dumps (mode 0700 owner leaky:leakers)\n" in out
    assert os.path.islink(str(root / "srv"))
    assert owner_mode(root / "data/dumps") == (4321, 4400, 0o700)
    verify(root, "owned.service")


def test_dump_directory_of_another_user_not_taken(root, lib):
    add_user(root, "other", 4500)
    add_unit(root, "second.service", "ExecStart=/usr/bin/true\nUser=other\n")
    assert run(root, "install", "owned.service", "--dir", "/srv/shared", lib=lib)[0] == 0
    assert owner_mode(root / "srv/shared") == (4321, 4400, 0o700)
    before = snapshot(root)
    rc, out, err = run(root, "install", "second.service", "--dir", "/srv/shared", lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: --dir /srv/shared belongs to leaky (the dump "
                   "directory of another service?) and User=other cannot write it: give each "
                   "service its own dump directory (omit --dir: /var/lib/mmleak/second.service)"
                   "\n")
    assert snapshot(root) == before


def test_unreachable_dump_directory_refused(root, lib):
    (root / "srv/locked/dumps").mkdir(parents=True)
    os.chmod(str(root / "srv/locked"), 0o700)
    before = snapshot(root)
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/locked/dumps",
                       lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: User=leaky cannot reach --dir /srv/locked/dumps: "
                   "/srv/locked is owner root:root mode 0700; choose another directory, or "
                   "give leaky search (x) permission on it yourself\n")
    assert snapshot(root) == before


@pytest.mark.parametrize("dir_exists", [False, True])
def test_unknown_user_always_refused(root, lib, dir_exists):
    args = ["install", "nouser.service"]
    if dir_exists:
        (root / "srv/d").mkdir(parents=True)
        os.chmod(str(root / "srv/d"), 0o1777)
        args += ["--dir", "/srv/d"]
    before = snapshot(root)
    rc, out, err = run(root, *args, lib=lib)
    assert (rc, out) == (2, "")
    assert err == ("mmleak-install.py: error: cannot resolve User=ghost of nouser.service in "
                   "ROOT/etc/passwd: create the user first (systemd cannot start the service "
                   "without it either)\n")
    assert snapshot(root) == before


def test_unknown_group_always_refused(root, lib):
    add_unit(root, "nogroup.service", "ExecStart=/usr/bin/true\nUser=leaky\nGroup=nosuch\n")
    (root / "srv/d").mkdir(parents=True)
    os.chmod(str(root / "srv/d"), 0o1777)
    before = snapshot(root)
    rc, out, err = run(root, "install", "nogroup.service", "--dir", "/srv/d", lib=lib)
    assert (rc, out) == (2, "")
    assert err == ("mmleak-install.py: error: cannot resolve Group=nosuch of nogroup.service "
                   "in ROOT/etc/group\n")
    assert snapshot(root) == before


def test_status_warns_when_the_user_cannot_write(root, lib):
    assert run(root, "install", "owned.service", lib=lib)[0] == 0
    rc, out, err = run(root, "status", "owned.service")
    assert (rc, err) == (0, "")
    assert "dump dir:       /var/lib/mmleak/owned.service: owner leaky:leakers mode 0700, " \
           "0 dump files, 0 compacted traces\n" in out
    os.chown(str(root / "var/lib/mmleak/owned.service"), 0, 0)
    rc, out, err = run(root, "status", "owned.service")
    assert rc == 0
    assert err == ("mmleak-install.py: warning: User=leaky cannot write "
                   "/var/lib/mmleak/owned.service (owner root:root mode 0700): the service is "
                   "not traced; run install again\n")


# -- (8) control characters, and what systemd would interpret ---------------------------------

@pytest.mark.parametrize("bad", ["/srv/a\nb", "/srv/a\tb", "/srv/a\rb", "/srv/\x1b[31m",
                                 "/srv/a\x7f", "/srv/a\x85b"])
@pytest.mark.parametrize("opt", ["--dir", "--lib"])
def test_control_characters_refused(root, lib, bad, opt):
    before = snapshot(root)
    args = ["install", "plain.service", opt, bad] + (["--lib", lib] if opt == "--dir" else [])
    rc, out, err = run(root, *args)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: %s %r: control characters are not allowed\n"
                   % (opt, bad))
    assert snapshot(root) == before


@pytest.mark.parametrize("setting", ["User=ab\x01c", "Group=g\x7fh"])
def test_control_characters_in_the_units_user_refused(root, lib, setting):
    """A DynamicUser= unit's User=/Group= go into the companion unit as they are: one with a
    control character made a companion that systemd rejects (exit 0).  systemd rejects the
    unit itself too: refused, nothing written."""
    (root / "etc/systemd/system/dyn.service").write_text(
        "[Service]\nExecStart=/usr/bin/true\nDynamicUser=yes\nStateDirectory=dyn\n%s\n"
        % setting)
    before = snapshot(root)
    rc, out, err = run(root, "install", "dyn.service", "--dir", "/var/lib/dyn/dumps", lib=lib)
    assert (rc, out) == (1, "")
    key, _, value = setting.partition("=")
    assert err == ("mmleak-install.py: error: %s=%r of dyn.service has a control character: "
                   "systemd rejects this unit; fix it first\n" % (key, value))
    assert snapshot(root) == before


def test_invalid_utf8_dir_refused(root, lib):
    before = snapshot(root)
    p = subprocess.run([PY.encode(), SCRIPT.encode(), b"--root", str(root).encode(), b"install",
                        b"plain.service", b"--dir", b"/srv/\xff", b"--lib", lib.encode()],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert (p.returncode, p.stdout) == (1, b"")
    assert p.stderr == (b"mmleak-install.py: error: --dir '/srv/\\udcff': not valid UTF-8 "
                        b"(systemd requires it)\n")
    assert snapshot(root) == before


ODD_DIRS = ["/srv/100%", "/srv/%i %n %%", "/srv/q\"uote", "/srv/it's", "/srv/back\\slash",
            "/srv/sp ace", "/srv/end\\", "/srv/\\x41", "/srv/d\u00e9j\u00e0",
            "/srv/a\u2028b", "/srv/ lead", "/srv/trail ", "/srv/$HOME;#x"]


@pytest.mark.parametrize("ddir", ODD_DIRS)
def test_odd_dir_reaches_systemd_exactly(root, lib, ddir):
    # strict.service: the value goes into Environment= and ReadWritePaths=
    rc, out, err = run(root, "install", "strict.service", "--dir", ddir, lib=lib)
    assert (rc, err) == (0, "")
    assert os.path.isdir(str(root) + ddir)
    verify(root, "strict.service")
    verify(root, "mmleak-compact-strict.service")
    env, rwp, bad = systemd_sees(root, "strict.service")
    assert (env, rwp, bad) == ({"LD_PRELOAD": LIB, "MMLEAK_DIR": ddir,
                                "MMLEAK_ROTATE_MB": "8"}, ddir, [])
    # the companion: the directory reaches its command line through ${MMLEAK_DIR}, one word
    # holding the value exactly, whatever it contains ($, %, quotes, spaces)
    block, bad = systemd_dump(root, "mmleak-compact-strict.service")
    assert bad == []
    assert [l for l in block if l.startswith(("Environment:", "ReadWritePaths:",
                                               "Command Line:"))] == [
        "Environment: MMLEAK_DIR=" + ddir,
        "ReadWritePaths: -" + ddir,
        "Command Line: /usr/bin/python3 /usr/local/lib/mmleak/mmleak.py compact --follow "
        "--forever --verbose \"\\${MMLEAK_DIR}\""]
    rc, out, err = run(root, "status", "strict.service")
    assert (rc, err) == (0, "")
    assert "MMLEAK_DIR:     %s\n" % ddir in out
    assert "ReadWritePaths: %s\n" % ddir in out
    assert ("dump dir:       %s: owner root:root mode 0700, 0 dump files, 0 compacted traces\n"
            % ddir) in out
    rc, out, err = run(root, "uninstall", "strict.service")
    assert (rc, err) == (0, "")
    q = shlex.quote(ddir)
    assert ("kept: library /usr/local/lib/mmleak/mmleak.so, /usr/local/lib/mmleak/mmleak.py and "
            "dump directory %s (delete them by hand when no longer needed: rm -r %s)\n"
            % (ddir, q)) in out


def test_escaped_unit_name(root, lib):
    # systemd-escape gives names with backslashes: the per-unit directory keeps the name,
    # systemd reads it back unchanged, and the printed commands are shell-quoted.
    unit = "foo@a\\x2db.service"
    rc, out, err = run(root, "install", unit, lib=lib)
    assert (rc, err) == (0, "")
    ddir = "/var/lib/mmleak/" + unit
    assert os.path.isdir(str(root) + ddir)
    assert ("  mmleak.py report '%s' --pid $(systemctl show -p MainPID --value '%s')\n"
            % (ddir, unit)) in out
    comp = "mmleak-compact-foo@a\\x2db.service"
    assert "  systemctl restart '%s'     # starts '%s' too\n" % (unit, comp) in out
    env, rwp, bad = systemd_sees(root, unit)
    assert (env, bad) == ({"LD_PRELOAD": LIB, "MMLEAK_DIR": ddir, "MMLEAK_ROTATE_MB": "8"}, [])
    verify(root, unit)
    # the companion: an instance file of its own, bound to the unit by its name as it is
    block, bad = systemd_dump(root, comp)
    assert bad == []
    assert [l for l in block if l.endswith("(origin-file)") and unit in l or
            l.startswith("Environment:")] == [
        "BindsTo: %s (origin-file)" % unit,
        "References: %s (origin-file)" % unit, "Environment: MMLEAK_DIR=" + ddir]
    verify(root, comp)


# -- existing LD_PRELOAD: mmleak.so first, the unit's value kept as systemd reads it -----------

def test_ld_preload_mmleak_first_values_as_systemd_reads_them(root, lib):
    import socket
    add_unit(root, "pre2.service",
             "ExecStart=/usr/bin/true\n"
             "Environment='LD_PRELOAD=/opt/a\\x2db/liba.so:/opt/%H/libb.so' X=1\n")
    rc, out, err = run(root, "install", "pre2.service", lib=lib)
    assert rc == 0
    # the C escape is decoded; %H (not one the tool expands) is left for systemd
    assert err == ("mmleak-install.py: note: pre2.service already sets LD_PRELOAD=/opt/a-b/"
                   "liba.so:/opt/%H/libb.so (in /usr/lib/systemd/system/pre2.service): kept, "
                   "after mmleak's library: mmleak.so goes first and records the allocations "
                   "of the libraries after it (such as jemalloc)\n")
    assert "LD_PRELOAD=%s /opt/a-b/liba.so /opt/%%H/libb.so\n" % LIB in out
    env, rwp, bad = systemd_sees(root, "pre2.service")
    assert (env["LD_PRELOAD"], bad) == ("%s /opt/a-b/liba.so /opt/%s/libb.so"
                                        % (LIB, socket.gethostname()), [])
    verify(root, "pre2.service")


def test_ld_preload_other_mmleak_copy_replaced(root, lib):
    add_unit(root, "pre3.service", "ExecStart=/usr/bin/true\n"
                                   "Environment=\"LD_PRELOAD=/usr/lib/libjemalloc.so.2 "
                                   "/home/me/src/mmleak/mmleak.so\"\n")
    rc, out, err = run(root, "install", "pre3.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: note: pre3.service already sets LD_PRELOAD=/usr/lib/"
                   "libjemalloc.so.2 /home/me/src/mmleak/mmleak.so (in /usr/lib/systemd/system/"
                   "pre3.service): kept, after mmleak's library: mmleak.so goes first and "
                   "records the allocations of the libraries after it (such as jemalloc); "
                   "/home/me/src/mmleak/mmleak.so dropped (one mmleak.so only)\n")
    env, rwp, bad = systemd_sees(root, "pre3.service")
    assert env["LD_PRELOAD"] == LIB + " /usr/lib/libjemalloc.so.2"


def test_user_changed_reinstall_gives_the_unit_its_directory_back(root, lib):
    add_user(root, "other", 4500)
    assert run(root, "install", "owned.service", lib=lib)[0] == 0
    d = root / "var/lib/mmleak/owned.service"
    (d / "mmleak.1.0.out").write_text("old")
    os.chown(str(d / "mmleak.1.0.out"), 4321, 4321)
    (root / "usr/lib/systemd/system/owned.service").write_text(
        UNITS["usr/lib/systemd/system/owned.service"].replace("User=leaky\nGroup=leakers\n",
                                                              "User=other\n"))
    rc, out, err = run(root, "install", "owned.service", lib=lib)
    assert (rc, err) == (0, "")
    assert ("set owner other:other and mode 0700 of /var/lib/mmleak/owned.service (an existing "
            "dump directory User=other could not write)\n") in out
    assert owner_mode(d) == (4500, 4500, 0o700)
    rc, out, err = run(root, "status", "owned.service")
    assert (rc, err) == (0, "")


def test_warn_unset_environment(root, lib):
    # UnsetEnvironment= is applied after Environment=: it would remove mmleak's settings
    add_unit(root, "unset.service", "ExecStart=/usr/bin/true\nUnsetEnvironment=LD_PRELOAD X\n")
    rc, out, err = run(root, "install", "unset.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: warning: unset.service has UnsetEnvironment=LD_PRELOAD, "
                   "which removes mmleak's setting; remove it while tracing\n")
    verify(root, "unset.service")


JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def test_preload_order_mmleak_first_traces_jemalloc(tmp_path):
    # Why install puts mmleak.so first: the program's malloc is then mmleak's, which calls
    # jemalloc's (the next in lookup order) and records the block. Exactly the program's
    # three leaked blocks must be found, at their line.
    if not os.path.exists(JEMALLOC):
        pytest.skip("libjemalloc2 not installed (%s)" % JEMALLOC)
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    top = os.path.dirname(HERE)
    subprocess.run(["make", "-s", "-C", top, "mmleak.so"], check=True)
    src = tmp_path / "leak.c"
    src.write_text("#include <stdlib.h>\n#include <string.h>\n#include <stdio.h>\n"
                   "int main(void) {\n"
                   "    for (int i = 0; i < 3; i++) { char *p = malloc(100); p[0] = 0; }\n"
                   "    char *s = strdup(\"hello\"); free(s);\n"
                   "    void *q = malloc(5000); free(q);\n"
                   "    return 0;\n}\n")
    exe = str(tmp_path / "leak")
    subprocess.run(["gcc", "-g", "-O0", "-o", exe, str(src)], check=True)
    d = tmp_path / "dumps"
    d.mkdir()
    # MMLEAK_SCAN=0: this test holds the blocks not freed, not their reachability (issue 20)
    env = dict(os.environ, LD_PRELOAD="%s %s" % (os.path.join(top, "mmleak.so"), JEMALLOC),
               MMLEAK_DIR=str(d), MMLEAK_SCAN="0")
    p = subprocess.run([exe], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    assert (p.returncode, p.stderr) == (0, "")
    with open(str(next(d.glob("mmleak.*.maps")))) as f:
        assert "libjemalloc.so.2" in f.read()
    p = subprocess.run([PY, os.path.join(top, "mmleak.py"), "report", str(d), "--no-html",
                        "--top", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    assert p.returncode == 0, p.stderr
    own = [l for l in p.stdout.splitlines() if str(src) in l]
    assert own == ["           300        3  main at %s:5" % src]


# --------------------------------------------------------------------------------------------
# The companion (issue #10): mmleak-compact-NAME.service runs `mmleak.py compact --follow
# --forever DIR` as the service's user while the service runs; MMLEAK_ROTATE_MB=8 so that it
# has complete files to fold. Its behaviour under a real systemd: tests/test_systemd.py.

def test_companion_of_a_user_service(root, lib):
    rc, out, err = run(root, "install", "owned.service", lib=lib)
    assert (rc, err) == (0, "")
    assert ("write /etc/systemd/system/mmleak-compact-owned.service\n"
            "create directory /etc/systemd/system/owned.service.d (mode 0755)\n"
            "write /etc/systemd/system/owned.service.d/mmleak.conf\n") in out
    assert "compactor: mmleak-compact-owned.service, as leaky:leakers, starts and stops with " \
           "owned.service\n" in out
    # as the service's user and group, no capability at all (the root companion of
    # PLAIN_COMPANION keeps ROOT_CAPS: a root service may hand its files to another user)
    assert companion_file(root, "owned.service") == companion_text(
        "owned.service", user="User=leaky\nGroup=leakers\n")
    verify(root, "owned.service")
    verify(root, "mmleak-compact-owned.service")
    block, bad = systemd_dump(root, "mmleak-compact-owned.service")
    assert bad == []
    assert [l for l in block if l.startswith(("User:", "Group:", "CapabilityBoundingSet:",
                                               "BindsTo:", "Before: owned"))] == [
        "BindsTo: owned.service (origin-file)",
        "CapabilityBoundingSet: ", "User: leaky", "Group: leakers"]
    # the service's drop-in pulls it in
    block, bad = systemd_dump(root, "owned.service")
    assert (bad, [l for l in block if l.startswith("Wants:")]) == (
        [], ["Wants: mmleak-compact-owned.service (origin-file)"])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv (util-linux)")
def test_root_companion_folds_a_trace_handed_to_another_user(root, lib, tmp_path):
    """A root service whose process becomes another user hands it its files (sshd's
    privilege-separated child: user sshd, in a root 0700 directory).  The root companion,
    with exactly the capabilities its unit gives it, folds that trace and gives the folded
    file to its owner (with CAP_DAC_OVERRIDE and CAP_FOWNER alone, the fchown failed: "cannot
    write mmleak.ID.compact.tmp: Operation not permitted", every pass, nothing folded)."""
    assert run(root, "install", "plain.service", lib=lib)[0] == 0
    caps = re.search(r"^CapabilityBoundingSet=(.*)$", companion_file(root, "plain.service"),
                     re.M).group(1).split()
    d = tmp_path / "dumps"
    d.mkdir(mode=0o700)
    e = dict(os.environ, LD_PRELOAD=build_lib(), MMLEAK_DIR=str(d))
    p = subprocess.run(["/bin/ls", "/"], env=e, stdout=subprocess.DEVNULL)
    assert p.returncode == 0
    for n in os.listdir(str(d)):            # what mmleak's setuid hand-over does
        os.chown(str(d / n), 65534, 65534)
    bset = "-all," + ",".join("+" + c[len("CAP_"):].lower() for c in caps)
    r = subprocess.run(["setpriv", "--bounding-set", bset, "--inh-caps=-all", PY, MMLEAK_PY,
                        "compact", str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    assert (r.returncode, r.stderr) == (0, ""), r
    comp = [n for n in os.listdir(str(d)) if n.endswith(".compact")]
    assert len(comp) == 1 and not [n for n in os.listdir(str(d)) if n.endswith(".out")]
    st = os.stat(str(d / comp[0]))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o600)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or
                    not shutil.which("strace"), reason="needs root, setpriv and strace")
def test_root_companion_compacts_a_users_trace_as_that_user(root, lib, tmp_path):
    """Debian's chrony.service: ExecStart=! (root), User=_chrony, whose dump directory is
    _chrony's; its child becomes _chrony and hands it its files.  The root companion, with
    exactly the capabilities its unit gives it, compacts that trace in a child that takes the
    owner's ids (compact._as_user: the owner's quota, not root's reserved blocks); without
    CAP_SETUID and CAP_SETGID in its bounding set it compacted as root."""
    (root / "usr/lib/systemd/system/priv.service").write_text(
        "[Service]\nUser=leaky\nExecStart=!/usr/bin/true\n")
    assert run(root, "install", "priv.service", lib=lib)[0] == 0
    caps = re.search(r"^CapabilityBoundingSet=(.*)$", companion_file(root, "priv.service"),
                     re.M).group(1).split()
    d = tempfile.mkdtemp(prefix="mmleak-owned-", dir="/tmp")    # (nobody reaches it)
    try:
        e = dict(os.environ, LD_PRELOAD=build_lib(), MMLEAK_DIR=d)
        assert subprocess.run(["/bin/ls", "/"], env=e, stdout=subprocess.DEVNULL).returncode == 0
        for n in os.listdir(d) + [""]:          # what mmleak's setuid hand-over does
            os.chown(os.path.join(d, n), 65534, 65534)
        os.chmod(d, 0o700)
        bset = "-all," + ",".join("+" + c[len("CAP_"):].lower() for c in caps)
        log = str(tmp_path / "strace")
        r = subprocess.run(["strace", "-f", "-qq", "-o", log, "-e", "trace=setresuid",
                            "setpriv", "--bounding-set", bset, "--inh-caps=-all", PY,
                            MMLEAK_PY, "compact", d], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, universal_newlines=True)
        assert (r.returncode, r.stderr) == (0, "")
        with open(log) as f:
            assert re.findall(r"setresuid\((.*)\) += (\S+)", f.read()) == [
                ("65534, 65534, 65534", "0")]
        names = sorted(os.listdir(d))
        assert [n.split(".", 2)[2] for n in names if ".scan." not in n] == [
            "compact", "lock", "maps", "series"]
        for n in names:
            st = os.lstat(os.path.join(d, n))
            assert (n, st.st_uid, st.st_gid, st.st_mode & 0o777) == (n, 65534, 65534, 0o600)
    finally:
        shutil.rmtree(d)


def test_companion_of_a_service_started_with_full_privileges(root, lib):
    """Debian's chrony.service: User=_chrony but ExecStart=!/usr/sbin/chronyd, which runs as
    root (the "!" prefix) and makes only its child _chrony: the files of the root processes
    are root's, and a companion as _chrony was refused them ("mmleak.ID.lock: owned by uid
    109, not by the trace's owner (uid 0) or root: refused", exit 2, until systemd gave up on
    it).  Its companion is root's, with the root companion's capabilities; the dump
    directory is still the user's (the daemon becomes that user)."""
    for prefix in ("!", "+", "-!"):
        (root / "usr/lib/systemd/system/priv.service").write_text(
            "[Service]\nUser=leaky\nExecStart=%s/usr/bin/true\n" % prefix)
        rc, out, err = run(root, "install", "priv.service", lib=lib)
        assert (rc, err) == (0, ""), err
        assert "compactor: mmleak-compact-priv.service, as root (as the service), " in out
        assert companion_file(root, "priv.service") == companion_text(
            "priv.service", caps=ROOT_CAPS)
        st = os.stat(str(root / "var/lib/mmleak/priv.service"))
        assert (st.st_uid, st.st_gid) == (4321, 4321)
        assert run(root, "uninstall", "priv.service")[0] == 0


def test_companion_follows_the_user(root, lib):
    add_user(root, "other", 4500)
    assert run(root, "install", "owned.service", lib=lib)[0] == 0
    (root / "usr/lib/systemd/system/owned.service").write_text(
        UNITS["usr/lib/systemd/system/owned.service"].replace("User=leaky\nGroup=leakers\n",
                                                              "User=other\n"))
    rc, out, err = run(root, "install", "owned.service", lib=lib)
    assert (rc, err) == (0, "")
    assert "update /etc/systemd/system/mmleak-compact-owned.service\n" in out
    assert companion_file(root, "owned.service") == companion_text(
        "owned.service", user="User=other\nGroup=other\n")


def test_rotate_mb(root, lib, mm):
    # the default is the constant mmleak.py's own `run` uses
    assert mm.COMPACT_ROTATE_MB == 8
    rc, out, err = run(root, "install", "plain.service", "--rotate-mb", "64", lib=lib)
    assert (rc, err) == (0, "")
    assert "MMLEAK_ROTATE_MB=64\n" in out
    assert dropin(root, "plain.service").endswith("Environment=MMLEAK_ROTATE_MB=64\n")
    env, rwp, bad = systemd_sees(root, "plain.service")
    assert (env["MMLEAK_ROTATE_MB"], bad) == ("64", [])
    rc, out, err = run(root, "status", "plain.service")
    assert "MMLEAK_ROTATE_MB: 64\n" in out
    # back to the default: the drop-in is updated, the companion is not
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert ("companion /etc/systemd/system/mmleak-compact-plain.service is up to date\n"
            "update /etc/systemd/system/plain.service.d/mmleak.conf\n") in out
    assert dropin(root, "plain.service").endswith("Environment=MMLEAK_ROTATE_MB=8\n")


@pytest.mark.parametrize("value,msg", [
    ("0", "must be at least 1: '0'"), ("65", "at most 64: '65'"),
    ("99999999999999999999", "at most 64: '99999999999999999999'")])
def test_depth_bad(root, lib, value, msg):
    """mmleak.so takes MMLEAK_DEPTH from 1 to 64 (past that it says "ignoring invalid" and
    records the default): the installer refuses what the library would ignore."""
    before = snapshot(root)
    rc, out, err = run(root, "install", "plain.service", "--depth", value, lib=lib)
    assert (rc, out, err) == (1, "", "mmleak-install.py: error: argument --depth: %s\n" % msg)
    assert snapshot(root) == before


@pytest.mark.parametrize("value,msg", [
    ("0", "must be at least 1: '0'"), ("x", "not an integer: 'x'"),
    ("1048577", "at most 1048576: '1048577'")])
def test_rotate_mb_bad(root, lib, value, msg):
    before = snapshot(root)
    rc, out, err = run(root, "install", "plain.service", "--rotate-mb", value, lib=lib)
    assert (rc, out, err) == (1, "", "mmleak-install.py: error: argument --rotate-mb: %s\n" % msg)
    assert snapshot(root) == before


def test_foreign_companion_never_touched(root, lib):
    c = root / "etc/systemd/system/mmleak-compact-plain.service"
    c.write_text("[Service]\nExecStart=/usr/bin/true\n")
    before = snapshot(root)
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: /etc/systemd/system/mmleak-compact-plain.service "
                   "exists and was not written by mmleak-install.py; not touching it\n")
    assert snapshot(root) == before
    # uninstall removes our drop-in and leaves that file alone, saying so
    c.unlink()
    assert run(root, "install", "plain.service", lib=lib)[0] == 0
    c.write_text("[Service]\nExecStart=/usr/bin/true\n")
    rc, out, err = run(root, "uninstall", "plain.service")
    assert rc == 0
    assert err == ("mmleak-install.py: warning: /etc/systemd/system/mmleak-compact-plain.service "
                   "was not written by mmleak-install.py; not removing it\n")
    assert "remove /etc/systemd/system/plain.service.d/mmleak.conf\n" in out
    assert "mmleak-compact" not in out
    assert c.read_text() == "[Service]\nExecStart=/usr/bin/true\n"


def test_install_of_an_older_version_upgraded(root, lib):
    # A drop-in written before the companion existed: status says the dumps are not
    # compacted, install again adds the companion and updates the drop-in, and uninstall of
    # the old state works too.
    d = root / "etc/systemd/system/plain.service.d"
    old = ("# Written by mmleak-install.py: run plain.service under the mmleak leak tracer.\n"
           "# mmleak-install: dropin-dir-created=yes\n"
           "[Service]\n"
           "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
           "Environment=MMLEAK_DIR=/var/lib/mmleak/plain.service\n")
    d.mkdir()
    (d / "mmleak.conf").write_text(old)
    rc, out, err = run(root, "status", "plain.service")
    assert (rc, err) == (0, "")
    assert ("MMLEAK_ROTATE_MB: (not set: default 256)\n"
            "library:        /usr/local/lib/mmleak/mmleak.so: MISSING (the service will start "
            "without it)\n"
            "companion:      /etc/systemd/system/mmleak-compact-plain.service: absent (the dump "
            "files are not compacted; run install again)\n") in out
    rc, out, err = run(root, "uninstall", "plain.service")
    assert (rc, err) == (0, "")
    assert "mmleak-compact" not in out
    assert not d.exists()
    d.mkdir()
    (d / "mmleak.conf").write_text(old)
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert (rc, err) == (0, "")
    assert ("write /etc/systemd/system/mmleak-compact-plain.service\n"
            "update /etc/systemd/system/plain.service.d/mmleak.conf\n") in out
    assert dropin(root, "plain.service") == header("plain.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/plain.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n")
    assert companion_file(root, "plain.service") == PLAIN_COMPANION


def test_uninstall_of_a_lone_companion(root, lib):
    # the drop-in was deleted by hand: uninstall still removes the companion
    assert run(root, "install", "plain.service", lib=lib)[0] == 0
    shutil.rmtree(str(root / "etc/systemd/system/plain.service.d"))
    rc, out, err = run(root, "uninstall", "plain.service")
    assert (rc, err) == (0, "")
    assert out.startswith("root: ROOT\nremove /etc/systemd/system/mmleak-compact-plain.service\n")
    assert "  systemctl stop mmleak-compact-plain.service     # after the restart: its last " \
           "pass folds the old process's dump files\n" in out
    assert not (root / "etc/systemd/system/mmleak-compact-plain.service").exists()
    rc, out, err = run(root, "uninstall", "plain.service")
    assert (rc, out, err) == (0, "not installed: /etc/systemd/system/plain.service.d/"
                                 "mmleak.conf does not exist; nothing to do\n", "")


def test_warn_no_python(root, lib):
    os.unlink(str(root / "usr/bin/python3"))
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: warning: /usr/bin/python3 not found under ROOT: "
                   "mmleak-compact-plain.service cannot start, the dump files of plain.service "
                   "will not be compacted; install python3\n")
    assert companion_file(root, "plain.service") == PLAIN_COMPANION


def test_failed_install_removes_the_new_companion(root, lib):
    # the drop-in directory cannot be created (a file is in the way): everything written
    # before, the companion included, is undone
    (root / "usr/local/lib/mmleak").mkdir()
    shutil.copy(lib, str(root / LIB.lstrip("/")))
    shutil.copy(MMLEAK_PY, str(root / "usr/local/lib/mmleak/mmleak.py"))
    (root / "var/lib/mmleak/plain.service").mkdir(parents=True, mode=0o700)
    blocker = root / "etc/systemd/system/plain.service.d"
    blocker.write_text("not a directory")
    before = snapshot(root)
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert rc == 2
    assert err == ("mmleak-install.py: error: install failed, changes undone: "
                   "ROOT/etc/systemd/system/plain.service.d: File exists\n")
    assert snapshot(root) == before


def test_long_unit_name_refused(root, lib):
    unit = "x" * 240 + ".service"
    add_unit(root, unit, "ExecStart=/usr/bin/true\n")
    before = snapshot(root)
    rc, out, err = run(root, "install", unit, lib=lib)
    assert (rc, out) == (1, "")
    assert err == ("mmleak-install.py: error: unit name %s is too long: its compactor "
                   "mmleak-compact-%s.service would exceed the 255 characters systemd allows\n"
                   % (unit, "x" * 240))
    assert snapshot(root) == before


def test_siphash24_reference_vectors():
    # SipHash-2-4 test vectors of the reference implementation (key 00..0f, message 00..)
    from mmleaklib import systemd as mod
    key = bytes(range(16))
    assert mod.siphash24(b"", key) == 0x726fdb47dd0e0e31
    assert mod.siphash24(bytes(range(8)), key) == 0x93f5f5799a932462
    assert mod.siphash24(bytes(range(15)), key) == 0xa129ca6149be45e5


# --------------------------------------------------------------------------------------------
# install --paused; status and the unit's processes (issue #11: attach to a running service)

def test_install_paused(root, lib):
    rc, out, err = run(root, "install", "plain.service", "--paused", lib=lib)
    assert (rc, err) == (0, "")
    assert out.endswith(
        "LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "MMLEAK_DIR=/var/lib/mmleak/plain.service\n"
        "MMLEAK_ROTATE_MB=8\n"
        "MMLEAK_PAUSED=1\n"
        "compactor: mmleak-compact-plain.service, as root (as the service), starts and stops "
        "with plain.service\n"
        "next steps:\n"
        "  systemctl daemon-reload     # needed: not run (--root given)\n"
        "  systemctl restart plain.service     # starts mmleak-compact-plain.service too; the "
        "service starts paused\n"
        "  mmleak-install.py status plain.service\n"
        "  mmleak.py attach $(systemctl show -p MainPID --value plain.service) -d "
        "/var/lib/mmleak/plain.service     # traces from now on\n"
        "  mmleak.py detach $(systemctl show -p MainPID --value plain.service)     # paused "
        "again; it prints the report command\n"
        "  mmleak-install.py uninstall plain.service     # when done\n"), out
    assert dropin(root, "plain.service") == header("plain.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/plain.service\n"
        "Environment=MMLEAK_ROTATE_MB=8\n"
        "Environment=MMLEAK_PAUSED=1\n")
    assert companion_file(root, "plain.service") == PLAIN_COMPANION   # the same companion
    env, rwp, bad = systemd_sees(root, "plain.service")
    assert (env["MMLEAK_PAUSED"], bad) == ("1", [])
    verify(root, "plain.service")
    rc, out, err = run(root, "status", "plain.service")
    assert (rc, err) == (0, "")
    assert "MMLEAK_ROTATE_MB: 8\nMMLEAK_PAUSED:  1 (the service starts paused: mmleak.py " \
           "attach MAINPID traces it)\nlibrary:" in out
    # the same again: nothing to do; without --paused: the drop-in loses the line
    rc, out, err = run(root, "install", "plain.service", "--paused", lib=lib)
    assert "already installed: /etc/systemd/system/plain.service.d/mmleak.conf is up to " \
           "date\n" in out
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert (rc, err) == (0, "")
    assert "update /etc/systemd/system/plain.service.d/mmleak.conf\n" in out
    assert "MMLEAK_PAUSED" not in out + dropin(root, "plain.service")
    rc, out, err = run(root, "status", "plain.service")
    assert "MMLEAK_PAUSED" not in out


def test_later_dropin_overriding_paused_warns(root, lib):
    d = root / "etc/systemd/system/plain.service.d"
    d.mkdir()
    (d / "zz-local.conf").write_text("[Service]\nEnvironment=MMLEAK_PAUSED=0\n")
    rc, out, err = run(root, "install", "plain.service", "--paused", lib=lib)
    assert rc == 0
    assert err == ("mmleak-install.py: warning: /etc/systemd/system/plain.service.d/"
                   "zz-local.conf sorts after mmleak.conf and sets MMLEAK_PAUSED, which "
                   "overrides mmleak's setting; merge it by hand\n")
    rc, out, err = run(root, "status", "plain.service")
    assert err == ("mmleak-install.py: warning: MMLEAK_PAUSED is overridden by a later "
                   "drop-in: the service gets MMLEAK_PAUSED=0\n")


def load_installer():
    from conftest import script
    return script("mmleak-install.py")


class Unit1:
    name = "leaky.service"


def processes_lines(inst, systemd=True, procs=None):
    """The 'process' lines status writes for leaky.service when systemd (is said to) run
    here and says PROCS (ActiveState, MainPID, pids) of it."""
    import io
    inst.systemd_running = lambda root: systemd
    inst.unit_processes = lambda name: procs
    out = io.StringIO()
    from mmleaklib.systemd import Root
    inst.write_processes(out, Root(None), Unit1())
    return out.getvalue()


def test_status_processes_and_their_state(tmp_path, mm):
    """What status says of the unit's processes, from their memory: a preloaded process
    tracing, a paused one, two without mmleak (one line), one that is gone; the main
    process first."""
    from conftest import LIB as lib, ROOT
    subprocess.run(["make", "-s", "-C", ROOT, "mmleak.so"], check=True)
    inst = load_installer()
    assert processes_lines(inst, systemd=False) == \
        "processes:      unknown (systemd is not running here)\n"
    assert processes_lines(inst, procs=("inactive", 0, [])) == \
        "processes:      none (leaky.service is inactive)\n"
    assert processes_lines(inst, procs=None) == \
        "processes:      unknown (systemctl show leaky.service failed)\n"
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    envs = [dict(base, LD_PRELOAD=lib, MMLEAK_DIR=str(tmp_path)),
            dict(base, LD_PRELOAD=lib, MMLEAK_DIR=str(tmp_path), MMLEAK_PAUSED="1"),
            base, base]
    ps = [subprocess.Popen(["sleep", "60"], env=e) for e in envs]
    try:
        pids = [p.pid for p in ps]
        for pid in pids[:2]:        # until the preloaded library has set its status word
            deadline = time.monotonic() + 10
            while mm.traced_state(pid) in (None, "starting", "dormant"):
                assert time.monotonic() < deadline, mm.traced_state(pid)
                time.sleep(0.01)
        gone = subprocess.Popen(["true"])
        gone.wait()
        got = processes_lines(inst, procs=("active", pids[0], sorted(pids + [gone.pid])))
        assert got == (
            "process:        %d (main): tracing %d %s\n"
            "process:        %d: paused\n"
            "process:        %d %d: not traced (mmleak.so not loaded)\n"
            % (pids[0], pids[0], tmp_path, pids[1], pids[2], pids[3]))
        # the main process gone, the others there: no "none" line; all gone: "none"
        got = processes_lines(inst, procs=("deactivating", gone.pid, [gone.pid, pids[2]]))
        assert got == "process:        %d: not traced (mmleak.so not loaded)\n" % pids[2]
        got = processes_lines(inst, procs=("deactivating", gone.pid, [gone.pid]))
        assert got == "processes:      none (leaky.service is deactivating)\n"
        # many others in one state: the first PIDS_SHOWN, then how many more
        inst.PIDS_SHOWN = 1
        got = processes_lines(inst, procs=("active", pids[0], pids))
        assert got.splitlines()[2] == "process:        %d and 1 more: not traced (mmleak.so " \
                                      "not loaded)" % pids[2]
        # another user may not read the processes' memory: it is told so, per process (run
        # from a tree the user nobody can read: the checkout, or a copy of what it needs)
        from conftest import tree_for_others
        from conftest import PYTHON_SIDE
        tests = os.path.join(tree_for_others("tests/test_install.py", "tests/conftest.py",
                                             "mmleak-install.py", "mmleak.py", "mmleak.so",
                                             *PYTHON_SIDE), "tests")
        code = ("import sys; sys.path.insert(0, %r); import test_install as t; "
                "sys.stdout.write(t.processes_lines(t.load_installer(), procs=('active', %d, "
                "[%d, %d])))" % (tests, pids[0], pids[0], pids[2]))
        r = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd="/",
                           preexec_fn=lambda: (os.setgroups([]), os.setgid(65534),
                                               os.setuid(65534)) if os.geteuid() == 0 else None)
        if os.geteuid() == 0:
            assert (r.returncode, r.stderr) == (0, ""), r
            assert r.stdout == (
                "process:        %d (main): unknown: not permitted to look at process %d (run "
                "as root, or as its user)\n"
                "process:        %d: unknown: not permitted to look at process %d (run as "
                "root, or as its user)\n" % (pids[0], pids[0], pids[2], pids[2]))
    finally:
        for p in ps:
            p.kill()
            p.wait()


def test_uninstall_of_a_masked_unit(root, lib):
    """A service masked after install (systemctl mask: a link to /dev/null in /etc) can still
    be uninstalled: the drop-in and the companion go, the mask stays."""
    before = snapshot(root)
    assert run(root, "install", "ptmp.service", lib=lib)[0] == 0
    os.symlink("/dev/null", str(root / "etc/systemd/system/ptmp.service"))
    rc, out, err = run(root, "uninstall", "ptmp.service")
    assert (rc, err) == (0, "")
    assert "remove /etc/systemd/system/ptmp.service.d/mmleak.conf\n" in out
    assert "remove /etc/systemd/system/%s\n" % companion("ptmp.service") in out
    assert not (root / "etc/systemd/system/ptmp.service.d").exists()
    assert not (root / "etc/systemd/system" / companion("ptmp.service")).exists()
    assert os.readlink(str(root / "etc/systemd/system/ptmp.service")) == "/dev/null"
    rc, out, err = run(root, "status", "ptmp.service")
    assert rc == 1 and "is masked" in err


def test_uninstall_of_a_unit_whose_file_is_gone(root, lib):
    """A service renamed or removed after install: uninstall still removes what install
    wrote for that name."""
    assert run(root, "install", "owned.service", lib=lib)[0] == 0
    os.unlink(str(root / "usr/lib/systemd/system/owned.service"))
    rc, out, err = run(root, "uninstall", "owned.service")
    assert (rc, err) == (0, "")
    assert not (root / "etc/systemd/system/owned.service.d").exists()
    assert not (root / "etc/systemd/system" / companion("owned.service")).exists()


@pytest.mark.parametrize("rdir,preserve", [("rt", None), ("rt/sub", "no"), ("rt", "restart"),
                                           ("rt", "yes")])
def test_dump_dir_in_the_runtime_directory(root, lib, rdir, preserve):
    """RuntimeDirectory=: systemd deletes it when the service stops (unless
    RuntimeDirectoryPreserve=yes), before the companion's last pass, and on every restart
    with =no: dumps there would be lost, so install refuses them."""
    (root / "usr/lib/systemd/system/rt.service").write_text(
        "[Service]\nExecStart=/usr/bin/true\nUser=leaky\nRuntimeDirectory=other rt\n" +
        ("RuntimeDirectoryPreserve=%s\n" % preserve if preserve else ""))
    before = snapshot(root)
    rc, out, err = run(root, "install", "rt.service", "--dir", "/run/" + rdir, lib=lib)
    if preserve == "yes":
        assert (rc, err) == (0, "")
        return
    assert (rc, out) == (1, "")
    assert err == (
        "mmleak-install.py: error: --dir /run/%s is under /run/rt, the RuntimeDirectory= of "
        "rt.service, which systemd deletes when the service stops (RuntimeDirectoryPreserve=%s)"
        ": the dumps would be lost before the compactor's last pass; use --dir "
        "/var/lib/mmleak/rt.service\n" % (rdir, preserve or "no"))
    assert snapshot(root) == before


@pytest.mark.parametrize("ddir", ["/tmp/dumps", "/var/tmp/dumps"])
def test_companion_sees_a_dump_dir_in_tmp(root, lib, ddir):
    """A service without PrivateTmp= may write its dumps under /tmp; its companion must see
    that same /tmp, not a private one of its own (where the directory does not exist)."""
    rc, out, err = run(root, "install", "owned.service", "--dir", ddir, lib=lib)
    assert (rc, err) == (0, "")
    text = companion_file(root, "owned.service")
    assert "\nPrivateTmp=yes\n" not in text
    assert "\nEnvironment=TMPDIR=%s\n" % ddir in text
    assert "\nReadWritePaths=-%s\n" % ddir in text
    verify(root, "owned.service")
    # elsewhere the companion keeps its private /tmp
    assert run(root, "install", "plain.service", lib=lib)[0] == 0
    assert "\nPrivateTmp=yes\n" in companion_file(root, "plain.service")
