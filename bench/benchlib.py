"""What the benchmark scripts of bench/ share: where the source tree and the programs they
build are, their command line, and the build of a C program.  Standard library only; a
script run as `python3 bench/NAME.py` finds this module beside it."""
import argparse
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))      # bench/
ROOT = os.path.dirname(HERE)                           # the source tree measured
OUT = os.path.join(HERE, "out")                        # what the benchmarks build
LIB = os.path.join(ROOT, "mmleak.so")
MMLEAK_PY = os.path.join(ROOT, "mmleak.py")
PY = "/usr/bin/python3"                                # the interpreter with pandas


def parser(doc, counts=(), **kw):
    """A benchmark's argument parser: described by the first paragraph of its docstring DOC,
    with an integer option --NAME of default N for each (NAME, N) of COUNTS; KW go to
    argparse.ArgumentParser."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], **kw)
    for name, default in counts:
        ap.add_argument("--" + name, type=int, default=default, metavar="N",
                        help="(default %d)" % default)
    return ap


def build_c(name, src, *flags, cc="cc", out=OUT):
    """Compile SRC (a path from the source tree's top) with CC -O2 -g, then FLAGS (an -O
    among them wins; libraries come after the source), into OUT/NAME; the program's path."""
    os.makedirs(out, exist_ok=True)
    exe = os.path.join(out, name)
    subprocess.run([cc, "-O2", "-g", "-o", exe, os.path.join(ROOT, src)] + list(flags),
                   check=True)
    return exe
