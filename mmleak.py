#!/usr/bin/python3
"""mmleak.py: shrink, symbolize and report mmleak dump files (stub, being written)."""
import os
import sys

VERSION = "0.1"
LIBNAME = "mmleak.so"


def find_library(explicit=None):
    """Return the absolute path of mmleak.so, or None.

    Search order: EXPLICIT, $MMLEAK_LIB, next to this file (a build tree), then where
    ``make install`` puts it (PREFIX/lib/mmleak/mmleak.so relative to this script's
    PREFIX/bin, then /usr/local and /usr).
    """
    here = os.path.dirname(os.path.realpath(__file__))
    cands = [explicit, os.environ.get("MMLEAK_LIB"),
             os.path.join(here, LIBNAME),
             os.path.join(here, os.pardir, "lib", "mmleak", LIBNAME),
             "/usr/local/lib/mmleak/" + LIBNAME, "/usr/lib/mmleak/" + LIBNAME]
    for c in cands:
        if c and os.path.isfile(c):
            return os.path.realpath(c)
    return None
