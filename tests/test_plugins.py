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
