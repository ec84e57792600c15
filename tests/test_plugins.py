"""Plugins (issue #10, point 3): a library dlclose'd and another, or the same one again,
dlopen'ed at the same address; every leak is attributed to the library, function and line
that made it, also when that library is no longer loaded when the report runs."""
import os
import re
import resource
import subprocess

import pytest

from conftest import LIB, TESTS, mmleak, run_traced, site_line


# Where the plugins are linked (-Ttext-segment): the loader of a non-PIE program (the hosts
# are linked -no-pie) asks the kernel for a library's link-time address, and gets it when it
# is free.  So the tests decide where a library goes, whatever the machine: alpha and beta
# both at PLUGIN_BASE, one after the other; elsewhere when plugin_host's "!PATH" has taken
# the range the last load left, or "=ADDR" a page at PLUGIN_BASE; and, after "^" (a pit),
# one right below the other.  None of them depends on where a loader happens to put a
# library.
PLUGIN_BASE = 0x200000000


@pytest.fixture(scope="module")
def plugins(tmp_path_factory, lib):
    # "^" (a pit) counts on the kernel's top-down placement of a mapping without an address,
    # which an unlimited stack turns into the legacy bottom-up one on some architectures (the
    # programs started from here on inherit this process's soft limit)
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    if soft == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, hard))
    d = tmp_path_factory.mktemp("plugins")
    for name in ("alpha", "beta"):
        subprocess.run(["cc", "-O0", "-g", "-shared", "-fPIC", "-DPLUGIN=%s" % name,
                        "-Wl,-Ttext-segment=%#x" % PLUGIN_BASE, "-o",
                        str(d / ("lib%s.so" % name)), os.path.join(TESTS, "plugin.c")],
                       check=True)
    subprocess.run(["cc", "-O0", "-g", "-no-pie", "-o", str(d / "host"),
                    os.path.join(TESTS, "plugin_host.c"), "-ldl"], check=True)
    return d


def plugin_leaks(dump):
    """{(module, function, line, size): blocks} of the leaks made inside the plugins."""
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    rep = mmleak.build_report(str(dump), tid, progress=False)
    got = {}
    for a in rep["survivors"]:
        fr = rep["frames"][a.callers[0]]
        if fr.function == "plugin_leak":
            k = (fr.module, fr.function, fr.line, a.size)
            got[k] = got.get(k, 0) + 1
    return got


def loads(out):
    """[(name, address of plugin_leak, size leaked, start, end)] from plugin_host's output."""
    return [(m.group(1),) + tuple(int(g, 0) for g in m.groups()[1:]) for m in
            re.finditer(r"^(\w+) at (0x[0-9a-f]+) leaked (\d+) in (0x[0-9a-f]+)-(0x[0-9a-f]+)$",
                         out.decode(), re.M)]


def at_base(seen, i):
    """Whether load I of SEEN went to PLUGIN_BASE (plugin_leak is in its first code page)."""
    return PLUGIN_BASE <= seen[i][1] < PLUGIN_BASE + 0x2000


def test_another_library_at_the_same_address(plugins, dump):
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    r = run_traced([str(plugins / "host"), "+" + a, "-" + a, "+" + b, "-" + b, "+" + a], dump)
    seen = loads(r.stdout)
    assert [s[0] for s in seen] == ["alpha", "beta", "alpha"]
    assert len({s[1] for s in seen}) == 1 and at_base(seen, 0), "the case tested: %s" % seen
    line = site_line("plugin.c", "plugin_leak")
    assert plugin_leaks(dump) == {("libalpha.so", "plugin_leak", line, 101): 1,
                                  ("libbeta.so", "plugin_leak", line, 103): 1,
                                  ("libalpha.so", "plugin_leak", line, 105): 1}


def test_reloaded_elsewhere_and_reported_after_unload(plugins, dump):
    """alpha is loaded, unloaded, beta takes its place, alpha comes back elsewhere; at the
    end nothing is loaded: every leak still has its library, function and line."""
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    r = run_traced([str(plugins / "host"), "+" + a, "-" + a, "+" + b, "+" + a, "-" + a,
                    "-" + b], dump)
    seen = loads(r.stdout)
    assert [s[0] for s in seen] == ["alpha", "beta", "alpha"]
    assert seen[0][1] == seen[1][1] and seen[2][1] != seen[0][1] and at_base(seen, 0), seen
    line = site_line("plugin.c", "plugin_leak")
    assert plugin_leaks(dump) == {("libalpha.so", "plugin_leak", line, 101): 1,
                                  ("libbeta.so", "plugin_leak", line, 103): 1,
                                  ("libalpha.so", "plugin_leak", line, 104): 1}


def exact_before_and_after_compaction(dump, *sizes):
    """The plugins' leaks are one block of each of SIZES, from alpha, beta and alpha again,
    read whole and after compaction."""
    line = site_line("plugin.c", "plugin_leak")
    want = {(lib, "plugin_leak", line, size): 1
            for lib, size in zip(("libalpha.so", "libbeta.so", "libalpha.so"), sizes)}
    assert plugin_leaks(dump) == want
    mmleak.compact_dir(str(dump))
    assert plugin_leaks(dump) == want


def test_depth_one_and_a_compacted_trace(plugins, dump):
    """The same with MMLEAK_DEPTH=1 (the fast writer asks where an address is after a
    dlclose), and after compaction (the epochs are in the frames, not in the files)."""
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    r = run_traced([str(plugins / "host"), "+" + a, "-" + a, "+" + b, "-" + b, "+" + a,
                    "-" + a], dump, env={"MMLEAK_DEPTH": "1"})
    seen = loads(r.stdout)
    assert len({s[1] for s in seen}) == 1 and at_base(seen, 0), seen
    exact_before_and_after_compaction(dump, 101, 103, 105)


@pytest.mark.parametrize("depth", [None, "1", "8"])
def test_one_library_loaded_at_two_addresses(plugins, dump, depth):
    """Issue 17, item 11: alpha loaded into a pit (plugin_host's "^"; a page held at
    PLUGIN_BASE keeps it from there), unloaded and its range taken ("!"), then beta and alpha
    again, each right below the first load (a page of the tracer's may come between).
    eu-addr2line, shown both loads of libalpha.so at once, took them for one module and
    could not resolve the first one's leak (the report said "libalpha.so+0x1133").  Each
    load is resolved at its own base, before and after compaction, with every depth."""
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    r = run_traced([str(plugins / "host"), "=%x" % PLUGIN_BASE, "^", "+" + a, "!" + a,
                    "+" + b, "-" + b, "+" + a, "-" + a], dump,
                   env={"MMLEAK_DEPTH": depth} if depth else {})
    seen = loads(r.stdout)
    assert [s[0] for s in seen] == ["alpha", "beta", "alpha"]
    assert seen[1][3:] == seen[2][3:], seen
    assert seen[0][3] - 0x2000 <= seen[2][4] <= seen[0][3], seen    # (a page may be between)
    exact_before_and_after_compaction(dump, 103, 105, 107)


# where the second load of alpha goes: right below the first, right above it (into beta's
# range, freed), or far from it (the first at PLUGIN_BASE, the second where the kernel
# puts a mapping without an address)
TWO_LOADS = {"below": ["=%x" % PLUGIN_BASE, "^", "+A", "!A", "+A"],
             "above": ["=%x" % PLUGIN_BASE, "^", "+B", "+A", "!A", "-B", "+A"],
             "far": ["+A", "!A", "+A"]}


@pytest.mark.parametrize("where", sorted(TWO_LOADS))
def test_two_loads_of_a_library_in_one_batch(plugins, dump, where):
    """The two loads of alpha, both resolved in the report's one lookup (the cumulative maps
    file holds alpha twice, and no other library at either address): two leaks, each at
    plugin_leak's line in libalpha.so."""
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    argv = [x.replace("A", a).replace("B", b) if x[1:] in "AB" else x for x in TWO_LOADS[where]]
    # MMLEAK_DEPTH=auto: the layout built here (a pit the next mappings fall into) assumes
    # mmleak.so maps nothing new between the loads; with stacks of every allocation (the
    # default since issue 21, or MMLEAK_DEPTH=16 before it) its own tables grow there and
    # the second load lands elsewhere.  The dlclose tests below run with whole stacks.
    r = run_traced([str(plugins / "host")] + argv, dump, env={"MMLEAK_DEPTH": "auto"})
    seen = [s for s in loads(r.stdout) if s[0] == "alpha"]
    assert len(seen) == 2, r.stdout
    first, second = seen[0][3:], seen[1][3:]
    # (a page the tracer maps may come between them)
    if where == "below":
        assert first[0] - 0x2000 <= second[1] <= first[0], seen
    elif where == "above":
        assert first[1] <= second[0] <= first[1] + 0x2000, seen
    else:
        assert at_base(seen, 0) and abs(second[0] - first[0]) > 0x100000, seen
    line = site_line("plugin.c", "plugin_leak")
    assert plugin_leaks(dump) == {("lib%s.so" % s[0], "plugin_leak", line, s[2]): 1
                                  for s in loads(r.stdout)}


def test_many_loads_of_one_library_take_one_run_of_the_tool(plugins, dump, monkeypatch):
    """alpha loaded 300 times, each load at another address ("!": the range of the one
    before taken) and in a dlclose epoch of its own: every leak at plugin_leak's line in
    libalpha.so, the 300 loads and the program resolved by one run of eu-addr2line (each
    load was a run of its own: 3,000 took 118 s; docs/limits.rst, "Hostile users")."""
    a = str(plugins / "libalpha.so")
    n = 300
    r = run_traced([str(plugins / "host")] + ["+" + a, "!" + a] * n, dump)
    seen = loads(r.stdout)
    assert len(seen) == n and len({s[3] for s in seen}) == n
    runs = []
    real = subprocess.run

    def counted(argv, *args, **kw):
        runs.extend(argv[:1])
        return real(argv, *args, **kw)
    monkeypatch.setattr(mmleak.symbolize.subprocess, "run", counted)
    line = site_line("plugin.c", "plugin_leak")
    assert plugin_leaks(dump) == {("libalpha.so", "plugin_leak", line, s[2]): 1 for s in seen}
    assert len(runs) == 1, len(runs)


@pytest.fixture(scope="module")
def race(plugins):
    exe = str(plugins / "plugin_race")
    subprocess.run(["cc", "-O0", "-g", "-no-pie", "-pthread", "-o", exe,
                    os.path.join(TESTS, "plugin_race.c"), "-ldl"], check=True)
    return exe


@pytest.mark.parametrize("depth", [None, "1", "8"])
def test_dlclose_in_one_thread_while_another_allocates(plugins, race, dump, depth):
    """The main thread swaps alpha and beta 120 times (each taking the address the other
    was just unloaded from) while a worker thread allocates in the loaded one and in the
    host: every leak is the library's that made it (alpha's blocks have an even size,
    beta's an odd one), at plugin_leak's line, with its caller in the host (a deep stack),
    exactly as many blocks and bytes as the program counted; also after compaction."""
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    r = run_traced([race, a, b, "120"], dump, env={"MMLEAK_DEPTH": depth} if depth else {})
    out = dict((m.group(1), (int(m.group(2)), int(m.group(3)))) for m in
               re.finditer(rb"^(alpha|beta) (\d+) (\d+)$", r.stdout, re.M))
    # both linked at PLUGIN_BASE: every load takes the address just freed.  (With every
    # swap reusing it, a snapshot of the maps inside dlclose() logged the unloaded library's
    # removal in the epoch that was ending, and frames of that epoch found nothing there.)
    reused = int(re.search(rb"^same address (\d+) of 120$", r.stdout, re.M).group(1))
    assert reused == 120, r.stdout
    assert out[b"alpha"][0] > 100 and out[b"beta"][0] > 100
    line = site_line("plugin.c", "plugin_leak")
    leak_line = [i for i, l in enumerate(open(os.path.join(TESTS, "plugin_race.c")), 1)
                 if "leak_fn(n);" in l][0]
    for compacted in (False, True):
        if compacted:
            mmleak.compact_dir(str(dump))
        (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
        rep = mmleak.build_report(str(dump), tid, progress=False)
        got = {}
        for s in rep["survivors"]:
            if s.size < 100:
                continue
            fr = rep["frames"][s.callers[0]]
            if fr.function != "plugin_leak":
                continue
            assert (fr.module, fr.line) == ("lib%s.so" % ("beta" if s.size % 2 else "alpha"),
                                            line), (fr, s.size)
            if depth == "8":
                up = rep["frames"][s.callers[1]]
                assert (up.module, up.function, up.line) == ("plugin_race", "leak", leak_line)
            k = fr.module[3:-3].encode()
            n, z = got.get(k, (0, 0))
            got[k] = (n + 1, z + s.size)
        assert got == out, compacted
