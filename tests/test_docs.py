"""The documentation matches the code: README.rst renders without a warning, and every
environment variable the tracer or the scripts read is in its table (and nothing else is)."""
import io
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("name", ["README.rst", "bench/README.rst"])
def test_rst_renders_cleanly(name):
    docutils_core = pytest.importorskip("docutils.core",
                                        reason="python3-docutils not installed (.ci/run installs it)")
    err = io.StringIO()
    with open(os.path.join(ROOT, name)) as f:
        docutils_core.publish_string(f.read(), writer_name="html",
                                     settings_overrides={"warning_stream": err,
                                                         "report_level": 2})
    assert err.getvalue() == ""


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def test_every_environment_variable_is_documented():
    used = set(re.findall(r'"(MMLEAK_[A-Z_]+)"', read("mmleak.c")))
    # the Python side: the scripts and the package (but facts.py, which is the table)
    python = ["mmleak.py", "mmleak-install.py"] + ["mmleaklib/" + n for n in sorted(
        os.listdir(os.path.join(ROOT, "mmleaklib"))) if n.endswith(".py") and n != "facts.py"]
    for name in python:
        used |= set(re.findall(r'"(MMLEAK_[A-Z_]+)"', read(name)))
    readme = read("README.rst")
    table = readme[readme.index("Environment variables\n"):readme.index("The dump format\n")]
    documented = set(re.findall(r"``(MMLEAK_[A-Z_]+)``", table))
    assert used == documented


def plain(text):
    """RST text as the option table words it: no literal or link markup, one space."""
    text = re.sub(r"``([^`]*)``", r"\1", text)
    text = re.sub(r"`([^`<]*?)(?: <[^>]*>)?`_", r"\1", text)
    return " ".join(text.split())


def readme_options():
    """The README's table of environment variables: [(variable, default, meaning)]."""
    readme = read("README.rst")
    table = readme[readme.index("Environment variables\n"):readme.index("The dump format\n")]
    lines = table.splitlines()
    rules = [i for i, l in enumerate(lines) if re.fullmatch(r"=+( +=+)+", l)]
    cols = [m.start() for m in re.finditer(r"=+", lines[rules[0]])]
    rows = []
    for line in lines[rules[1] + 1:rules[2]]:
        cells = [line[a:b].strip() for a, b in zip(cols, cols[1:] + [None])]
        if cells[0]:
            rows.append(cells)
        else:
            rows[-1][2] += " " + cells[2]
    return [(plain(v), plain(d), plain(m)) for v, d, m in rows]


def test_option_table_readme_and_help_agree():
    """One table of the MMLEAK_* variables (mmleaklib/facts.py): the README's table says the
    same (name, default, meaning), `mmleak.py options` prints it, and the C header is made
    from it (one row per setting of mmleak.so)."""
    from mmleaklib import facts
    want = [(o.env, facts.option_default_text(o), o.help) for o in facts.OPTIONS]
    assert readme_options() == want
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "options"],
                       capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (0, "")
    printed = " ".join(r.stdout.split())
    for env, default, meaning in want:
        who = facts.OPTION[env].who
        assert " %s %s %s (%s) " % (env, default, meaning, who) in " %s " % printed, env
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "options", "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "environment variables" in r.stdout
    header = facts.c_header()
    rows = re.findall(r'^    X\((\w+), "(MMLEAK_\w+)", (\w+), ("[^"]*"|\d+), (\d+), (\d+), '
                      r'"((?:[^"\\]|\\.)*)"\)', header, re.M)
    assert [r[1] for r in rows] == [o.env for o in facts.OPTIONS if o.who == "mmleak.so"]
    for name, env, typ, default, lo, hi, text in rows:
        o = facts.OPTION[env]
        assert (name, typ, int(lo), int(hi), text) == (o.name, o.type, o.min, o.max, o.help)
    for macro in ("MMLEAK_FORMAT_VERSION", "MMLEAK_MAX_DEPTH", "MMLEAK_OPTIONS(X)",
                  "MMLEAK_RUNTIME_OBJECTS(X)", "MMLEAK_WRAPPERS(X)"):
        assert "#define " + macro in header, macro


def test_wrappers_and_runtime_objects_are_one_list():
    """The allocation wrappers and runtime objects the Python side uses are facts.py's, and
    the C header lists the same (the C names: demangled C++ names are the Python side's)."""
    from mmleaklib import facts, sites
    header = facts.c_header()
    block = header[header.index("#define MMLEAK_WRAPPERS(X)"):]
    block = block[:block.index("\n\n")]
    assert re.findall(r'X\("([^"]*)"\)', block) == [w for w in facts.WRAPPERS
                                                    if not facts.is_cxx_name(w)]
    block = header[header.index("#define MMLEAK_RUNTIME_OBJECTS(X)"):]
    block = block[:block.index("\n\n")]
    assert re.findall(r'X\("([^"]*)"\)', block) == list(facts.RUNTIME_OBJECTS)
    assert sites.Wrappers().names == set(facts.WRAPPERS)
    for name in ("libc.so.6", "libc-2.31.so", "libstdc++.so.6", "ld-linux-x86-64.so.2",
                 "libnss_files.so.2", "libtcmalloc_minimal.so.4", "mmleak.so", "librt.so.1"):
        assert facts.RUNTIME_RE.match(name), name
    for name in ("libcurl.so.4", "libmmleak_plugin.so", "demo_leaky", "libmagic.so.1"):
        assert not facts.RUNTIME_RE.match(name), name
