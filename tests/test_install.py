"""Tests for mmleak-install.py against scratch roots holding real unit files.

Run: /usr/bin/python3 -m pytest tests/test_install.py

Every install result is checked with ``systemd-analyze verify --root=ROOT UNIT``. The minimal
scratch tree it needs (found by trying): sysinit.target in a unit directory (the default
dependencies of a service pull it in; without it verify fails "Unit sysinit.target not found"),
and the ExecStart binary present and executable under the root. basic.target and
shutdown.target are added too so the tree looks like a system; no machine-id is needed.
"""
import hashlib
import shlex
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "mmleak-install.py")
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
        "# (or delete this file, run systemctl daemon-reload, and restart the service).\n"
        "# Kept on uninstall: the library /usr/local/lib/mmleak/mmleak.so, the dumps in %s.\n"
        "# mmleak-install: dropin-dir-created=%s\n" % (unit, unit, unit, ddir, created))


def next_steps(unit, ddir=None):
    ddir = ddir or "/var/lib/mmleak/" + unit
    return (
        "next steps:\n"
        "  systemctl daemon-reload     # needed: not run (--root given)\n"
        "  systemctl restart %s\n"
        "  mmleak-install.py status %s\n"
        "  mmleak.py report %s --pid $(systemctl show -p MainPID --value %s)\n"
        "  mmleak-install.py uninstall %s     # when done\n" % (unit, unit, ddir, unit, unit))


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    for d in ("etc/systemd/system", "usr/lib/systemd/system", "usr/bin", "usr/local/lib",
              "var/lib", "run", "tmp"):
        (r / d).mkdir(parents=True)
    shutil.copy2("/usr/bin/true", str(r / "usr/bin/true"))
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

def test_install_plain_exact(root, lib):
    rc, out, err = run(root, "install", "plain.service", lib=lib)
    assert (rc, err) == (0, "")
    assert out == (
        "root: ROOT\n"
        "create directory /usr/local/lib/mmleak (mode 0755)\n"
        "copy %s -> /usr/local/lib/mmleak/mmleak.so (mode 0644)\n"
        "create directory /var/lib/mmleak (mode 0755)\n"
        "create directory /var/lib/mmleak/plain.service (mode 0700 owner root:root)\n"
        "create directory /etc/systemd/system/plain.service.d (mode 0755)\n"
        "write /etc/systemd/system/plain.service.d/mmleak.conf\n"
        "LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "MMLEAK_DIR=/var/lib/mmleak/plain.service\n" % lib + next_steps("plain.service"))
    assert dropin(root, "plain.service") == header("plain.service") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=MMLEAK_DIR=/var/lib/mmleak/plain.service\n")
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
    assert os.listdir(str(so.parent)) == ["mmleak.so"]
    verify(root, "plain.service")


def test_install_depth_and_dir(root, lib):
    rc, out, err = run(root, "install", "plain.service", "--depth", "8", "--dir",
                       "/srv/leak dumps", lib=lib)
    assert (rc, err) == (0, "")
    assert dropin(root, "plain.service") == header("plain.service", "/srv/leak dumps") + (
        "[Service]\n"
        "Environment=LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "Environment=\"MMLEAK_DIR=/srv/leak dumps\"\n"
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
        "Environment=MMLEAK_DIR=/var/lib/mmleak/ptmp.service\n")
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
        "ReadWritePaths=/var/lib/mmleak/strict.service\n")
    verify(root, "strict.service")


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
    assert dropin(root, "home.service").endswith("MMLEAK_DIR=/var/lib/mmleak/home.service\n")
    assert run(root, "install", "home.service", "--dir", "/home/dumps", lib=lib)[0] == 0
    assert dropin(root, "home.service").endswith(
        "MMLEAK_DIR=/home/dumps\nReadWritePaths=/home/dumps\n")
    verify(root, "full.service")
    verify(root, "home.service")


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
        "Environment=MMLEAK_DIR=/var/lib/mmleak/preload.service\n")
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
        "Environment=MMLEAK_DIR=/var/lib/mmleak/foo@bar.service\n")
    verify(root, "foo@bar.service")
    rc, out, err = run(root, "status", "foo@bar.service")
    assert rc == 0
    assert out.splitlines()[1] == "unit:           foo@bar.service " \
                                  "(/usr/lib/systemd/system/foo@.service)"


def test_idempotent(root, lib):
    assert run(root, "install", "strict.service", lib=lib)[0] == 0
    first = snapshot(root)
    rc, out, err = run(root, "install", "strict.service", lib=lib)
    assert (rc, err) == (0, "")
    assert out == (
        "root: ROOT\n"
        "library /usr/local/lib/mmleak/mmleak.so is up to date\n"
        "dump directory /var/lib/mmleak/strict.service exists\n"
        "already installed: /etc/systemd/system/strict.service.d/mmleak.conf is up to date\n"
        "LD_PRELOAD=/usr/local/lib/mmleak/mmleak.so\n"
        "MMLEAK_DIR=/var/lib/mmleak/strict.service\n" + next_steps("strict.service"))
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
            "ReadWritePaths=/var/lib/mmleak/strict.service\n")).splitlines()) +
        "actions:\n"
        "  create directory /usr/local/lib/mmleak (mode 0755)\n"
        "  copy %s -> /usr/local/lib/mmleak/mmleak.so (mode 0644)\n"
        "  create directory /var/lib/mmleak (mode 0755)\n"
        "  create directory /var/lib/mmleak/strict.service (mode 0700 owner root:root)\n"
        "  create directory /etc/systemd/system/strict.service.d (mode 0755)\n"
        "  write /etc/systemd/system/strict.service.d/mmleak.conf\n"
        "  no systemctl daemon-reload (--root given)\n" % lib)
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
        "kept: library /usr/local/lib/mmleak/mmleak.so and dump directory "
        "/var/lib/mmleak/%s (delete them by hand when no longer needed: rm -r "
        "/var/lib/mmleak/%s)\n"
        "next steps:\n"
        "  systemctl daemon-reload     # needed: not run (--root given)\n"
        "  systemctl restart %s     # the running process is traced until then\n"
        % (unit, unit, unit, unit, unit))
    after = snapshot(root)
    # Exactly the documented leftovers differ: the library copy and the dump directory.
    kept = {"usr/local/lib/mmleak", "usr/local/lib/mmleak/mmleak.so", "var/lib/mmleak",
            "var/lib/mmleak/" + unit}
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
                   "drop-in:        /etc/systemd/system/plain.service.d/mmleak.conf: absent\n"
                   "not installed\n")
    assert run(root, "install", "owned.service", "--depth", "2", lib=lib)[0] == 0
    d = root / "var/lib/mmleak/owned.service"
    (d / "mmleak.123.out").write_bytes(b"x" * 100)
    (d / "mmleak.123.maps").write_bytes(b"y" * 7)
    (d / "unrelated.txt").write_bytes(b"z")
    rc, out, err = run(root, "status", "owned.service")
    assert (rc, err) == (0, "")
    assert out == (
        "root:           ROOT\n"
        "unit:           owned.service (/usr/lib/systemd/system/owned.service)\n"
        "drop-in:        /etc/systemd/system/owned.service.d/mmleak.conf: present\n"
        "LD_PRELOAD:     /usr/local/lib/mmleak/mmleak.so\n"
        "MMLEAK_DIR:     /var/lib/mmleak/owned.service\n"
        "MMLEAK_DEPTH:   2\n"
        "library:        /usr/local/lib/mmleak/mmleak.so: present, 26 bytes\n"
        "dump dir:       /var/lib/mmleak/owned.service: owner leaky:leakers mode 0700, 2 dump "
        "files\n"
        "             7  mmleak.123.maps\n"
        "           100  mmleak.123.out\n"
        "           107  total\n")
    os.unlink(str(root / LIB.lstrip("/")))
    rc, out, err = run(root, "status", "owned.service")
    assert rc == 0
    assert "library:        /usr/local/lib/mmleak/mmleak.so: MISSING (the service will start " \
           "without it)\n" in out


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
     "/etc/systemd/system, /run/systemd/system, /usr/local/lib/systemd/system, "
     "/usr/lib/systemd/system, /lib/systemd/system"),
    (["status", "nosuch.service"], 1, "unknown unit nosuch.service: no unit file in "
     "/etc/systemd/system, /run/systemd/system, /usr/local/lib/systemd/system, "
     "/usr/lib/systemd/system, /lib/systemd/system"),
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
        for name in ("mmleak-install.py", "mmleak.py"):
            shutil.copy(os.path.join(os.path.dirname(HERE), name), pub)
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


def test_missing_library_without_lib(tmp_path, root):
    # A copy of the tool with mmleak.py but no mmleak.so next to it, no $MMLEAK_LIB.
    if any(os.path.isfile(p) for p in (LIB, "/usr/lib/mmleak/mmleak.so")):
        pytest.skip("a mmleak.so is installed on this machine")
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(SCRIPT, str(d / "mmleak-install.py"))
    shutil.copy(os.path.join(os.path.dirname(SCRIPT), "mmleak.py"), str(d / "mmleak.py"))
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
    assert "copy" not in out and "library" not in out


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
    verify(root, "dyn.service")
    # under StateDirectory=: no warning, systemd creates the directory itself
    rc, out, err = run(root, "install", "dyn.service", "--dir", "/var/lib/dyn", lib=lib)
    assert (rc, err) == (0, "mmleak-install.py: note: /var/lib/dyn is under StateDirectory=; "
                            "systemd creates it for the dynamic user\n")
    assert not (root / "var/lib/dyn").exists()
    assert dropin(root, "dyn.service").endswith("MMLEAK_DIR=/var/lib/dyn\n")


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
    shutil.copy(SCRIPT, str(d / "mmleak-install.py"))
    shutil.copy(os.path.join(os.path.dirname(SCRIPT), "mmleak.py"), str(d / "mmleak.py"))
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
        env_seen = dict(l[len("Environment: "):].split("=", 1) for l in block
                        if l.startswith("Environment: "))
        rwp = [l[len("ReadWritePaths: "):] for l in block if l.startswith("ReadWritePaths: ")]
        complaints = [l for l in p.stderr.splitlines() if "mmleak.conf" in l]
        return env_seen, (rwp[0] if rwp else None), complaints
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
                                    "MMLEAK_DIR": "/var/lib/mmleak/" + unit}, None, [])


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


def test_existing_empty_directory_given_to_the_user(root, lib):
    # `mkdir /srv/dumps` by hand (root-owned 0755) then --dir: the service could not write
    # there; the directory is empty, so it is handed to the unit's user.
    d = root / "srv/dumps"
    d.mkdir(parents=True)
    (d / "mmleak.5.0.out").write_text("old dump")
    rc, out, err = run(root, "install", "owned.service", "--dir", "/srv/dumps", lib=lib)
    assert (rc, err) == (0, "")
    assert ("set owner leaky:leakers and mode 0700 of /srv/dumps (an existing dump directory "
            "User=leaky could not write)\n") in out
    assert owner_mode(d) == (4321, 4400, 0o700)
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
           "0 dump files\n" in out
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
    env, rwp, bad = systemd_sees(root, "strict.service")
    assert (env, rwp, bad) == ({"LD_PRELOAD": LIB, "MMLEAK_DIR": ddir}, ddir, [])
    rc, out, err = run(root, "status", "strict.service")
    assert (rc, err) == (0, "")
    assert "MMLEAK_DIR:     %s\n" % ddir in out
    assert "ReadWritePaths: %s\n" % ddir in out
    assert "dump dir:       %s: owner root:root mode 0700, 0 dump files\n" % ddir in out
    rc, out, err = run(root, "uninstall", "strict.service")
    assert (rc, err) == (0, "")
    q = shlex.quote(ddir)
    assert ("kept: library /usr/local/lib/mmleak/mmleak.so and dump directory %s (delete them "
            "by hand when no longer needed: rm -r %s)\n" % (ddir, q)) in out


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
    assert "  systemctl restart '%s'\n" % unit in out
    env, rwp, bad = systemd_sees(root, unit)
    assert (env, bad) == ({"LD_PRELOAD": LIB, "MMLEAK_DIR": ddir}, [])
    verify(root, unit)


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
    env = dict(os.environ, LD_PRELOAD="%s %s" % (os.path.join(top, "mmleak.so"), JEMALLOC),
               MMLEAK_DIR=str(d))
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
