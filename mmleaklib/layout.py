"""Where mmleak's pieces are, decided once, here: the names of the commands, and the
directories the libraries are looked for in.

Two layouts:

* a source tree (or a copy of it): ``mmleak.py``, ``mmleak-panda.py``, ``mmleak-install.py``
  and ``mmleak.so``, ``mmleak-tools.so`` beside the ``mmleaklib`` package;
* installed (``make install``, the Debian package): the scripts and the package in a private
  directory (``PREFIX/share/mmleak``), the commands in ``PREFIX/bin`` and ``PREFIX/sbin``
  without ``.py`` (symbolic links to the scripts: ``mmleak``, ``mmleak-panda``,
  ``mmleak-install``), and the two libraries in ``LIBDIR`` (``PREFIX/lib/mmleak``, or
  ``/usr/lib/<multiarch>/mmleak`` in the package).  ``make install`` writes LIBDIR into the
  installed copy of this file (the line ``LIBDIR = None`` below); a source tree has none.
"""
import os
import re
import sys

# the library directory of an installed copy; None in a source tree (make install sets it)
LIBDIR = None   # (make install writes the installed copy's here)

# each script and the name of the command it is installed as
COMMANDS = {"mmleak.py": "mmleak", "mmleak-panda.py": "mmleak-panda",
            "mmleak-install.py": "mmleak-install"}
# where make install used to put everything, and other installs may still have it
OLD_LIBDIRS = ("/usr/local/lib/mmleak", "/usr/lib/mmleak")


def package_parent():
    """The directory that holds the mmleaklib package (the scripts are beside it)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def library_candidates(name, explicit=None, tracer="mmleak.so"):
    """Where the library NAME is looked for, in order: EXPLICIT, $MMLEAK_LIB (the tracer
    TRACER; another library: beside it), beside the package (a source tree), the installed
    LIBDIR, the older install places."""
    env = os.environ.get("MMLEAK_LIB")
    if env and name != tracer:
        env = os.path.join(os.path.dirname(env), name)
    dirs = [package_parent()] + ([LIBDIR] if LIBDIR else []) + list(OLD_LIBDIRS)
    return [explicit, env] + [os.path.join(d, name) for d in dirs]


def command_name(script, argv0=None):
    """The name the user runs SCRIPT by: the installed command's (no .py) when it was started
    by that name, else SCRIPT's (a source tree's ./mmleak.py)."""
    base = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    return COMMANDS[script] if base == COMMANDS.get(script) else script


_SCRIPT_RE = re.compile(r"(?<![\w./-])(%s)(?![\w-])" % "|".join(
    re.escape(s) for s in sorted(COMMANDS, key=len, reverse=True)))


def installed_names(text):
    """TEXT with each script's name as a command (``mmleak.py report`` -> ``mmleak
    report``), for the --help of an installed command and the manual pages; a path that ends
    in a script's name (/usr/local/lib/mmleak/mmleak.py) is left alone."""
    return _SCRIPT_RE.sub(lambda m: COMMANDS[m.group(1)], text)
