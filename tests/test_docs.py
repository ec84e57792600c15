"""The documentation matches the code: README.rst renders without a warning, and every
environment variable the tracer or the scripts read is in its table (and nothing else is)."""
import io
import os
import re

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
