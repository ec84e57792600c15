"""Shared fixtures: the mmleaklib package (imported as mmleak), test programs built once
per session, and helpers that run a program under mmleak.so and reduce its dump to the exact
leaks (function, file:line, size) of one binary."""
import collections
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
LIB = os.path.join(ROOT, "mmleak.so")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)        # the package and the scripts, imported by name
import mmleaklib as mmleak          # noqa: E402
# the files of the Python side a copy of the tools needs (see tree_for_others)
PYTHON_SIDE = ["mmleaklib/" + n for n in sorted(os.listdir(os.path.join(ROOT, "mmleaklib")))
               if n.endswith(".py")]


def script(name):
    """The script NAME (mmleak-panda.py, mmleak-install.py) as a module, imported by its name
    (mmleak.py's own is mmleaklib.cli)."""
    return importlib.import_module(name[:-len(".py")])


def readable_by_others(path):
    """Can a process of another user (nobody) read PATH: every directory above it searchable
    by others, the file itself readable."""
    path = os.path.realpath(path)
    d = path
    while d != "/":
        d = os.path.dirname(d)
        if not os.stat(d).st_mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


def tree_for_others(*names):
    """The root of a tree that another user (nobody) can read with NAMES (paths relative to
    the checkout) in it: the checkout itself, or, when it is private (a clone in a 0700
    directory such as mktemp -d's), a copy of those files in a directory of its own under
    /tmp, removed when the tests end."""
    if all(readable_by_others(os.path.join(ROOT, n)) for n in names):
        return ROOT
    import atexit
    import tempfile
    d = tempfile.mkdtemp(prefix="mmleak-tree-", dir="/tmp")
    atexit.register(shutil.rmtree, d, True)
    for n in names:
        dst = os.path.join(d, n)
        os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
        shutil.copy(os.path.join(ROOT, n), dst)
        os.chmod(dst, 0o755 if n.endswith(".py") or
                 os.access(os.path.join(ROOT, n), os.X_OK) and not n.endswith(".so")
                 else 0o644)
    for dirpath, _, _ in os.walk(d):
        os.chmod(dirpath, 0o755)
    return d


def mmleak_for_others():
    """The path of a mmleak.py that another user (nobody) can run, with mmleak.so,
    mmleak-tools.so and the package next to it (see tree_for_others)."""
    return os.path.join(tree_for_others("mmleak.py", "mmleak.so", "mmleak-tools.so",
                                        *PYTHON_SIDE), "mmleak.py")


def lib_for_others():
    """The path of a mmleak.so that a process become another user (nobody) can load, with
    mmleak-scan beside it, which it starts at its exit (see tree_for_others)."""
    return os.path.join(tree_for_others("mmleak.so", "mmleak-scan"), "mmleak.so")


@pytest.fixture(scope="session")
def mm():
    return mmleak


@pytest.fixture(scope="session")
def lib():
    return build_lib()


def build_lib():
    """make mmleak.so and mmleak-tools.so; the path of mmleak.so (the `lib` fixture, and
    modules whose own `lib` is something else)."""
    # one make at a time: the workers of a parallel run (make check) would otherwise compile
    # the same objects at once in a tree not built yet
    import fcntl
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", ".tests-make.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["make", "-s", "-C", ROOT, "mmleak.so", "mmleak-tools.so"], check=True)
    return LIB


@pytest.fixture(scope="session")
def bins(tmp_path_factory, lib):
    """Compile the test programs (-O1 -g) once."""
    d = tmp_path_factory.mktemp("bin")
    out = {}
    def cc(name, src, *extra, compiler="cc"):
        exe = str(d / name)
        subprocess.run([compiler, "-O1", "-g", "-fno-omit-frame-pointer", "-o", exe,
                        os.path.join(TESTS, src)] + list(extra), check=True)
        out[name] = exe
    cc("hostile", "hostile.c", "-pthread", "-ldl")
    cc("hostile_nopie", "hostile.c", "-pthread", "-ldl", "-no-pie", "-fno-pie")
    cc("libdl_test.so", "dl_lib.c", "-shared", "-fPIC")
    cc("hostile_cxx", "hostile_cxx.cpp", "-std=c++17", compiler="c++")
    cc("libsigsafe_alloc.so", "sigsafe_alloc.c", "-shared", "-fPIC")
    cc("sigstorm", "sigstorm.c")
    cc("badalloc", "badalloc.cpp", "-std=c++17", compiler="c++")
    # -O0: at -O1 GCC deletes free(malloc(n)), and these programs churn that way
    cc("adversary", "adversary.c", "-O0", "-pthread", "-ldl")
    cc("own_malloc", "own_malloc.c", "-O0")
    cc("stackuse", "stackuse.c", "-O0", "-pthread")
    return out


def site_line(source, name):
    """Line number of the 'site:NAME' marker in tests/SOURCE."""
    with open(os.path.join(TESTS, source)) as f:
        for i, line in enumerate(f, 1):
            if re.search(r"site:%s\b" % re.escape(name), line):
                return i
    raise KeyError(name)


def run_traced(argv, dump_dir, env=None, check=True, timeout=120):
    e = dict(os.environ)
    e.update({"LD_PRELOAD": LIB, "MMLEAK_DIR": str(dump_dir)})
    e.update(env or {})
    r = subprocess.run(argv, env=e, capture_output=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d: %s" % (argv, r.returncode, r.stderr[-2000:]))
    return r


def leaks(dump_dir, trace, module):
    """Survivors of TRACE whose call site is in MODULE, as a Counter of
    (function, file basename, line, size), plus the shrinker (for event counts)."""
    traces = mmleak.find_traces(str(dump_dir))
    files = traces[str(trace)]
    sh = mmleak.shrink_files(files)
    assert not sh.problems.malformed, "malformed lines in %s" % files
    surv = sh.survivors()
    sym = mmleak.Symbolizer(os.path.join(str(dump_dir), "mmleak.%s.maps" % trace))
    frames = sym.lookup(sorted({a.callers[0] for a in surv}))
    got = collections.Counter()
    for a in surv:
        fr = frames[a.callers[0]]
        if fr.module == module:
            got[(fr.function, os.path.basename(fr.file or "?"), fr.line, a.size)] += 1
    return got, sh


def expect(source, function_sites):
    """Counter of expected (function, source, line, size) from [(function, site, size, n)]."""
    c = collections.Counter()
    for fn, site, size, n in function_sites:
        c[(fn, source, site_line(source, site), size)] += n
    return c


@pytest.fixture
def dump(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    return d


# How the suite runs in parallel (make check: pytest-xdist, --dist loadgroup; see
# docs/testing.rst, RUNNING): each module is one xdist group, run by one worker in the order
# of a serial run, so that its module fixtures (programs compiled, make deb) are made once
# and its tests meet each other as they always did; the modules with a test of the box (a
# systemd-nspawn machine: test_systemd.py, test_deb.py) are one group, so that one box boots.
BOX_GROUP = "box"
# the modules that take longest (figures in docs/testing.rst) go to the workers first, so
# that no long one is left to run alone at the end; the others follow in their usual order
LONGEST_FIRST = [BOX_GROUP, "test_attach.py", "test_scan.py", "test_install.py",
                 "test_compact.py", "test_shrink_native.py", "test_inject.py",
                 "test_report.py", "test_flame.py", "test_compact_levels.py"]


def pytest_configure(config):
    # xdist registers it too; without xdist the marker is only a label
    config.addinivalue_line("markers", "xdist_group(name): tests run on one worker, in turn")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Put each test in its module's xdist group (BOX_GROUP for the modules that use the box
    fixture) and, in a worker of a parallel run, the groups of LONGEST_FIRST first. A marker
    without effect when the suite runs in one process. tryfirst: before xdist reads the
    groups in this same hook."""
    def module(item):
        return os.path.basename(str(item.fspath))
    boxed = {module(i) for i in items if "box" in getattr(i, "fixturenames", ())}
    group = {}
    for item in items:
        m = module(item)
        group[item] = BOX_GROUP if m in boxed else m
        item.add_marker(pytest.mark.xdist_group(group[item]))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {g: i for i, g in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda i: rank.get(group[i], len(rank)))     # stable


@pytest.fixture(scope="session")
def box():
    """A machine running the host's systemd as PID 1 (tests/nspawn_box.py: systemd-nspawn on
    an overlay of / whose upper layer is a tmpfs), with this source tree bound read-only at
    its own path. box.run(cmd, check=True, timeout=60) -> CompletedProcess; box.path(p): host
    path of P inside; box.wait_active(unit) -> MainPID; box.wait_file(p). Skipped, with the
    reason, where it cannot run. Powered off and removed at the end of the session, also on
    Ctrl-C and on SIGTERM (turned into KeyboardInterrupt while the box runs, so pytest runs
    the finalizers); leftovers of a run killed harder are removed before the next boot."""
    import nspawn_box
    try:
        b = nspawn_box.Box(bind_ro=[ROOT])
    except nspawn_box.Unavailable as e:
        pytest.skip("no systemd-nspawn box: %s" % e)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise KeyboardInterrupt("SIGTERM")
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_term)
    try:
        yield b
    finally:
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        b.close()
