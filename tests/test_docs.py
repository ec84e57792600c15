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
    tracer = ["mmleak.c"] + ["tracer/" + n for n in sorted(os.listdir(os.path.join(ROOT, "tracer")))]
    used = set(re.findall(r'"(MMLEAK_[A-Z_]+)"', "".join(read(n) for n in tracer)))
    used |= set(re.findall(r'"(MMLEAK_[A-Z_]+)"', read("mmleak.py")))
    used |= {"MMLEAK_SHRINK"} if "SHRINK_ENV" in read("mmleak.py") else set()
    readme = read("README.rst")
    table = readme[readme.index("Environment variables\n"):readme.index("The dump format\n")]
    documented = set(re.findall(r"``(MMLEAK_[A-Z_]+)``", table))
    assert used == documented
