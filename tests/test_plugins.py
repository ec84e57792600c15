"""Plugins (issue #10, point 3): a library dlclose'd and another, or the same one again,
dlopen'ed at the same address; every leak is attributed to the library, function and line
that made it, also when that library is no longer loaded when the report runs."""
import os
import re
import subprocess

import pytest

from conftest import LIB, TESTS, mmleak, run_traced, site_line


@pytest.fixture(scope="module")
def plugins(tmp_path_factory, lib):
    d = tmp_path_factory.mktemp("plugins")
    for name in ("alpha", "beta"):
        subprocess.run(["cc", "-O0", "-g", "-shared", "-fPIC", "-DPLUGIN=%s" % name, "-o",
                        str(d / ("lib%s.so" % name)), os.path.join(TESTS, "plugin.c")],
                       check=True)
    subprocess.run(["cc", "-O0", "-g", "-o", str(d / "host"),
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
    """[(name, address, size)] from plugin_host's output."""
    return [(m.group(1), m.group(2), int(m.group(3))) for m in
            re.finditer(r"^(\w+) at (0x[0-9a-f]+) leaked (\d+)$", out.decode(), re.M)]


def test_another_library_at_the_same_address(plugins, dump):
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    r = run_traced([str(plugins / "host"), "+" + a, "-" + a, "+" + b, "-" + b, "+" + a], dump)
    seen = loads(r.stdout)
    assert [s[0] for s in seen] == ["alpha", "beta", "alpha"]
    assert len({s[1] for s in seen}) == 1, "the loader reused the address: the case tested"
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
    assert seen[0][1] == seen[1][1] and seen[2][1] != seen[0][1]
    line = site_line("plugin.c", "plugin_leak")
    assert plugin_leaks(dump) == {("libalpha.so", "plugin_leak", line, 101): 1,
                                  ("libbeta.so", "plugin_leak", line, 103): 1,
                                  ("libalpha.so", "plugin_leak", line, 104): 1}


def test_depth_one_and_a_compacted_trace(plugins, dump):
    """The same with MMLEAK_DEPTH=1 (the fast writer asks where an address is after a
    dlclose), and after compaction (the epochs are in the frames, not in the files)."""
    a, b = str(plugins / "libalpha.so"), str(plugins / "libbeta.so")
    run_traced([str(plugins / "host"), "+" + a, "-" + a, "+" + b, "-" + b, "+" + a, "-" + a],
               dump, env={"MMLEAK_DEPTH": "1"})
    line = site_line("plugin.c", "plugin_leak")
    want = {("libalpha.so", "plugin_leak", line, 101): 1,
            ("libbeta.so", "plugin_leak", line, 103): 1,
            ("libalpha.so", "plugin_leak", line, 105): 1}
    assert plugin_leaks(dump) == want
    mmleak.compact_dir(str(dump))
    assert plugin_leaks(dump) == want


@pytest.fixture(scope="module")
def race(plugins):
    exe = str(plugins / "plugin_race")
    subprocess.run(["cc", "-O0", "-g", "-pthread", "-o", exe,
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
    reused = int(re.search(rb"^same address (\d+) of 120$", r.stdout, re.M).group(1))
    assert reused >= 80, r.stdout
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
