"""The Debian package (`make deb`, debian/): it builds, lintian finds nothing in it, and in a
throw-away machine (the `box` fixture: tests/nspawn_box.py, an overlay of / whose upper layer
is a tmpfs) it installs, `man mmleak` reads, the demo runs from the installed commands with
the installed tracer and reports make demo's leaks exactly, and a purge leaves the box's file
list as it was before the install (what the host changed meanwhile, through the overlay, is
told apart).

Run: /usr/bin/python3 -m pytest tests/test_deb.py   (as root; needs debhelper, dh-python,
dpkg-dev, python3-docutils, lintian: .ci/run installs them)."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT

DEMO_SRC = os.path.join(ROOT, "tests", "demo_leaky.cpp")
# make demo's leaks (tests/demo_leaky.cpp, 3 ticks a thread): bytes, blocks, function
DEMO_LEAKS = ((5760, 120, "Worker::handle(int)"), (4096, 1, "load_config"),
              (1920, 30, "Pool<Item<int> >::make()"), (1920, 1, "grow_log"),
              (720, 30, "intern_name"))
# where a package may write (the top-level entries of / are listed too); /work and the
# like, on the host's root file system, are not the package's business and are big; nor is
# /var/tmp, where other programs on the host come and go while the test runs (a file made
# and deleted there between the two listings once failed it)
TREES = ("/etc", "/usr", "/var", "/opt", "/srv", "/root", "/home")
SCRATCH = "/var/tmp/mmleak-deb-test"
MAN_CACHE = "/var/cache/man/"
UNIT = "/etc/systemd/system/mmleak-deb-test.service"     # a unit to install mmleak into


def tools_missing():
    miss = [t for t in ("dpkg-buildpackage", "dh", "dh_python3", "lintian")
            if not shutil.which(t)]
    try:
        import docutils  # noqa: F401
    except ImportError:
        miss.append("python3-docutils")
    return miss


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    """`make deb` into a scratch build directory: the path of the binary package."""
    miss = tools_missing()
    if miss:
        pytest.skip("cannot build the package here, missing: %s (.ci/run installs them)"
                    % " ".join(miss))
    b = tmp_path_factory.mktemp("build")
    r = subprocess.run(["make", "-s", "-C", ROOT, "deb", "B=%s" % b], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    # what make deb's own lintian run said (test_lintian_finds_nothing reads it)
    (b / "make-deb.stdout").write_text(r.stdout)
    debs = [n for n in os.listdir(b / "deb") if re.fullmatch(r"mmleak_[^_]+_amd64\.deb", n)]
    assert len(debs) == 1, os.listdir(b / "deb")
    return b / "deb" / debs[0]


def test_package_holds_the_commands_libraries_and_pages(deb):
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    paths = {line.split()[5].lstrip(".") for line in listing.splitlines()}
    multiarch = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"],
                               capture_output=True, text=True, check=True).stdout.strip()
    for p in ("/usr/bin/mmleak", "/usr/bin/mmleak-panda", "/usr/sbin/mmleak-install",
              "/usr/lib/%s/mmleak/mmleak.so" % multiarch,
              "/usr/lib/%s/mmleak/mmleak-tools.so" % multiarch,
              "/usr/share/mmleak/mmleak.py", "/usr/share/mmleak/mmleaklib/layout.py",
              "/usr/share/man/man1/mmleak.1.gz", "/usr/share/man/man1/mmleak-panda.1.gz",
              "/usr/share/man/man8/mmleak-install.8.gz", "/usr/share/man/man5/mmleak-format.5.gz",
              "/usr/share/man/man7/mmleak-env.7.gz", "/usr/share/doc/mmleak/copyright"):
        assert p in paths, p
    # no command with a language extension on PATH
    assert not [p for p in paths if p.startswith(("/usr/bin/", "/usr/sbin/"))
                and p.endswith(".py")]
    if os.path.isfile(os.path.join(ROOT, "include", "mmleak.h")):
        assert "/usr/include/mmleak.h" in paths
    fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends", "Recommends"],
                            capture_output=True, text=True, check=True).stdout
    depends = re.search(r"^Depends: (.*)$", fields, re.M).group(1)
    recommends = re.search(r"^Recommends: (.*)$", fields, re.M).group(1)
    assert {"elfutils", "python3"} <= {d.split()[0] for d in depends.split(", ")}, depends
    assert re.search(r"\blibc6 \(>= ", depends), depends            # ${shlibs:Depends}
    assert "pandas" not in depends and "matplotlib" not in depends
    assert set(recommends.split(", ")) == {"python3-pandas", "python3-matplotlib"}


def test_lintian_finds_nothing(deb):
    """make deb fails on an error or a warning (lintian --fail-on error,warning, its last
    command: the `deb` fixture saw it succeed); here nothing at all is accepted but the
    informational tags: no tag, overridden ones included (--show-overrides), in what that
    same run printed.  Read from make deb's output, not run again: a lintian run costs
    ~12 CPU-s."""
    with open(os.path.join(ROOT, "Makefile")) as f:     # make deb's run is this one
        assert "\tlintian --fail-on error,warning --show-overrides $(DEB)/*.changes\n" in \
            f.read()
    with open(deb.parent.parent / "make-deb.stdout") as f:
        out = f.read()
    tags = [line for line in out.splitlines() if re.match(r"[EWXO]: ", line)]
    assert tags == []


def file_list(box):
    """Every path in the box where a package may write, and the top level of /."""
    cmd = ("ls -A / | sed 's|^|/|'; find %s -xdev -path /var/tmp -prune -o -print "
           "2>/dev/null; true" % " ".join(t for t in TREES if os.path.isdir(box.path(t))))
    out = box.run(cmd, timeout=600).stdout
    # /var/cache/man is man-db's index of every package's pages: its trigger (run by dpkg -i
    # here, and by `man`) may create a locale's directory there that the host never indexed
    # (seen on a fresh machine: /var/cache/man/vi/CACHEDIR.TAG); no package's purge removes it
    return {p for p in out.splitlines()
            if p and not p.startswith(SCRATCH) and not p.startswith(MAN_CACHE)}


def test_install_run_the_demo_purge_in_a_box(deb, box):
    if box.run("dpkg-query -W -f='${Status}' mmleak", check=False).stdout.startswith(
            "install"):
        pytest.fail("mmleak is installed in the box already")
    before = file_list(box)
    box.run(["mkdir", "-p", SCRATCH])
    shutil.copy(deb, box.path(SCRATCH + "/mmleak.deb"))
    box.run(["dpkg", "-i", SCRATCH + "/mmleak.deb"], timeout=300)
    try:
        # the commands, found on PATH, name themselves as installed
        assert box.run("command -v mmleak").stdout == "/usr/bin/mmleak\n"
        for cmd in ("mmleak", "mmleak-panda", "mmleak-install"):
            out = box.run([cmd, "--help"]).stdout
            assert out.startswith("usage: %s " % cmd), out[:200]
        # man finds the pages, and mmleak(1) has the examples --help points to
        assert box.run(["man", "-w", "mmleak"]).stdout.strip() == \
            "/usr/share/man/man1/mmleak.1.gz"
        page = box.run("MANWIDTH=100 man mmleak 2>&1 | col -b",
                       timeout=120).stdout
        assert "EXAMPLES" in page and "mmleak report" in page, page[:500]
        assert box.run(["man", "-w", "7", "mmleak-env"]).returncode == 0
        # the demo, from the installed commands
        exe = SCRATCH + "/demo_leaky"
        box.run(["g++", "-O0", "-g", "-pthread", "-o", exe, DEMO_SRC], timeout=300)
        r = box.run(["mmleak", "run", "-d", SCRATCH + "/dumps", "--", exe, "3"],
                    timeout=300)
        m = re.search(r"^mmleak: next: /usr/bin/mmleak report (\S+) --pid (\d+)$", r.stderr,
                      re.M)
        assert m, r.stderr
        pid = m.group(2)
        maps = box.run(["cat", "%s/dumps/mmleak.%s.maps" % (SCRATCH, pid)]).stdout
        multiarch = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        assert "/usr/lib/%s/mmleak/mmleak.so" % multiarch in maps   # the installed tracer
        html = SCRATCH + "/report.html"
        # matplotlib (the page's plots) keeps its font cache and config in the user's home,
        # ~/.cache/matplotlib and ~/.config/matplotlib, the first time it runs for that user:
        # the user's files, not the package's, which no purge removes (seen on a fresh
        # machine, whose root had never run matplotlib): kept in the scratch directory here
        r = box.run(["env", "MPLCONFIGDIR=%s/mpl" % SCRATCH, "mmleak", "report",
                     SCRATCH + "/dumps", "--pid", pid, "-o", html, "--show-reachable"],
                    timeout=300)
        # the installed mmleak-scan ran at exit: a row per site and kind; each planted leak's
        # blocks not freed, whatever kind the scan gave them (a stale pointer on a stack may
        # keep one or two reachable, as in valgrind), are exact
        assert re.search(r"^\s+definitely lost:\s+\d+ bytes", r.stdout, re.M), r.stdout
        per_site = {}
        for m in re.finditer(r"^\s+(\d+)\s+(\d+)\s+(?:definite|indirect|possible|reachable|"
                             r"unknown)\s+(.+?) at \S*demo_leaky\.cpp:\d+$", r.stdout, re.M):
            got = per_site.setdefault(m.group(3), [0, 0])
            got[0] += int(m.group(1))
            got[1] += int(m.group(2))
        for nbytes, blocks, fn in DEMO_LEAKS:
            assert per_site.get(fn) == [nbytes, blocks], (fn, r.stdout)
        assert "Worker::handle" in box.run(["cat", html]).stdout
        # mmleak-install of the package's own library copies nothing into /usr/local: the
        # drop-in and the companion name the package's files, which an upgrade replaces
        box.run(["sh", "-c", "printf '[Service]\\nExecStart=/bin/sleep 1000\\n' > %s" % UNIT])
        r = box.run(["mmleak-install", "install", "--dry-run", os.path.basename(UNIT)])
        lib = "/usr/lib/%s/mmleak/mmleak.so" % multiarch
        assert "Environment=LD_PRELOAD=%s\n" % lib in r.stdout, r.stdout
        assert ("ExecStart=/usr/bin/python3 /usr/share/mmleak/mmleak.py compact --follow "
                "--forever --verbose ${MMLEAK_DIR}\n") in r.stdout, r.stdout
        assert "/usr/local" not in r.stdout and " copy " not in r.stdout, r.stdout
    finally:
        box.run(["rm", "-rf", SCRATCH, UNIT])
        box.run(["dpkg", "--purge", "mmleak"], timeout=300)
    assert box.run("dpkg-query -W -f='${Status}' mmleak", check=False).stdout in (
        "", "unknown ok not-installed")
    after = file_list(box)
    # the box's / is an overlay on the host's, which other programs may change meanwhile: a
    # path the box gained that the host has not is the box's doing (left behind), and so is
    # one it lost that the host still has
    left = sorted(p for p in after - before if not os.path.lexists(p))
    lost = sorted(p for p in before - after if os.path.lexists(p))
    assert (left, lost) == ([], [])
    assert len(before) > 1000            # the list is the box's files, not an empty answer


def test_package_version_is_the_tools_version():
    """debian/changelog's version is mmleaklib/facts.py's VERSION (what --version and the
    manual pages say)."""
    if not shutil.which("dpkg-parsechangelog"):
        pytest.skip("dpkg-dev not installed")
    from mmleaklib import facts
    v = subprocess.run(["dpkg-parsechangelog", "-l", os.path.join(ROOT, "debian", "changelog"),
                        "-S", "Version"], capture_output=True, text=True, check=True).stdout
    assert v.strip() == facts.VERSION
