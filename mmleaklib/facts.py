"""The facts shared by mmleak.so (C) and the Python tools, each defined once, here.

The C side gets them as a header generated from this file:

    python3 -m mmleaklib.facts --c-header > build/gen/facts.h    (the Makefile does it)

(MMLEAK_FORMAT_VERSION, MMLEAK_MAX_DEPTH, the bounds, and the X-macro lists
MMLEAK_OPTIONS(X), MMLEAK_RUNTIME_OBJECTS(X), MMLEAK_WRAPPERS(X)); `mmleak.py options` prints
the option table, and docs/environment.rst's table (mmleak-env(7)) is held to it by a test.
"""
import collections
import re
import sys

VERSION = "1.0"                 # of the tools
FORMAT_VERSION = 2              # the dump format mmleak.so writes
READ_VERSIONS = ("1", "2")      # the formats the readers take
MAX_DEPTH = 64                  # frames mmleak.so records per allocation at most
LIBNAME = "mmleak.so"           # the tracer
TOOLS_LIBNAME = "mmleak-tools.so"   # the compiled helpers of the Python side (shrink, inject)
SCANNER_NAME = "mmleak-scan"        # the scanner mmleak.so starts at exit, from beside it
LINE_MAX = 1 << 20              # the longest line a reader keeps (bytes); longer: reported
COMPACT_ROTATE_MB = 8           # MMLEAK_ROTATE_MB under `run`, `attach` and the installer
# what to do when a process became a user who may not create files in its dump directory
# (the report's words, after a scan that wrote no result or threads that had no dump file)
WRITABLE_DIR = ("give the trace a directory the process's user can write (mmleak.py run -d "
                "DIR, or MMLEAK_DIR)")

# ---------------------------------------------------------------------------------------
# The environment variables: (NAME, variable, type, default, min, max, one-line help, who
# reads it).  TYPE: "path" (a string), "int" (MIN to MAX), "depth" (1 to MAX, or "auto"),
# "bool" (0 or 1), "choice" (a word).  WHO: "mmleak.so" for the tracer's own settings (also
# mmleak_attach's argument, and in the C header); the Python tools' otherwise (not in it).
# ---------------------------------------------------------------------------------------

Option = collections.namedtuple("Option", "name env type default min max help who")

OPTIONS = (
    Option("DIR", "MMLEAK_DIR", "path", "/tmp", 0, 0,
           "where the dump and maps files go (made absolute at start)", "mmleak.so"),
    Option("DEPTH", "MMLEAK_DEPTH", "depth", MAX_DEPTH, 1, MAX_DEPTH,
           "frames recorded per allocation at most: the whole stack up to the thread's start, "
           "or N frames (1: the caller alone, the cheapest); auto: through the runtime and the "
           "allocation wrappers to the program's first frame, and four more (see "
           "mmleak-tracer(7))", "mmleak.so"),
    Option("ROTATE_MB", "MMLEAK_ROTATE_MB", "int", 256, 1, 1 << 20,
           "a thread starts a new dump file past this size (mmleak.py run, attach and the "
           "installer set %d, for compaction)" % COMPACT_ROTATE_MB, "mmleak.so"),
    Option("BUFFER_KB", "MMLEAK_BUFFER_KB", "int", 1024, 16, 1 << 20,
           "staging area of a busy thread (its .tail file, two halves; each full half is one "
           "pwrite to the .out file). Every thread starts with 64 KiB and gets this much when "
           "its first half fills", "mmleak.so"),
    Option("HOLD_MB", "MMLEAK_HOLD_MB", "int", 64, 0, 1 << 20,
           "lines that cannot be written yet (no descriptor left, a full disk) are held in "
           "memory up to this much, for the whole process, before events are dropped "
           "(counted); 0: never held", "mmleak.so"),
    Option("QUIET", "MMLEAK_QUIET", "bool", 0, 0, 1,
           "1: never write to stderr, even when tracing fails", "mmleak.so"),
    Option("PAUSED", "MMLEAK_PAUSED", "bool", 0, 0, 1,
           "1: preloaded but paused, at no cost, until mmleak.py attach PID (see "
           "mmleak-attach(7))", "mmleak.so"),
    Option("SCAN", "MMLEAK_SCAN", "int", 1, 0, 2,
           "1: at the end of the process (exit, after its destructors, or _exit), tell each "
           "block still alive lost or still reachable (see mmleak-scan(7)); 2: the same, "
           "except at the _exit of a fork child that did not exec; 0: never", "mmleak.so"),
    Option("SCAN_HERE", "MMLEAK_SCAN_HERE", "int", 1, 0, 2,
           "1: the scan at the exit of a process left with one thread runs in a child that "
           "shares its memory, no mmleak-scan started, and so does that of a process whose "
           "other threads mmleak-scan may not trace (not dumpable: they are stopped by a "
           "signal of mmleak.so's; see mmleak-scan(7)), at the exit or at "
           "mmleak_leak_check; 2: the same, and those of every process with more threads; "
           "0: always in mmleak-scan", "mmleak.so"),
    Option("LIB", "MMLEAK_LIB", "path", None, 0, 0,
           "mmleak.py, mmleak-install.py: the mmleak.so to use", "mmleak.py"),
    Option("SHRINK", "MMLEAK_SHRINK", "choice", "auto", 0, 0,
           "mmleak.py: the shrink engine", "mmleak.py"),
    Option("SCAN_SECS", "MMLEAK_SCAN_SECS", "int", 60, 1, 1 << 20,
           "mmleak-scan: seconds before a scan gives up", "mmleak-scan"),
    Option("SCAN_DEBUG", "MMLEAK_SCAN_DEBUG", "int", 0, 0, 2,
           "mmleak-scan: 1 writes each step's time, the cut, the roots and marking's "
           "reads into mmleak.ID.scan-debug.K beside the trace; 2 also every word found "
           "pointing into a block",
           "mmleak-scan"),
    Option("SUPPRESSIONS", "MMLEAK_SUPPRESSIONS", "path", None, 0, 0,
           "mmleak.py report and run --check: files of leak:PATTERN suppressions, "
           "separated by colons, after --suppressions", "mmleak.py"),
)
OPTION = {o.env: o for o in OPTIONS}
# the words a "choice" option takes (besides auto, its default)
CHOICES = {"MMLEAK_SHRINK": ("python", "native")}


def option_default_text(o):
    """The default as the table shows it."""
    if o.default is None:
        return "(none)"
    return "(auto)" if o.type == "choice" else str(o.default)


def option_type(env):
    """argparse type of the value of the option ENV (its bounds)."""
    from .errors import int_range
    o = OPTION[env]
    check = int_range(max(o.min, 1) if o.type == "depth" else o.min, o.max)
    if o.type != "depth":
        return check
    return lambda v: "auto" if v == "auto" else check(v)     # depth: N, or "auto"


def print_options(out):
    """The option table, as `mmleak.py options` shows it."""
    import textwrap
    wide = max(len(o.env) for o in OPTIONS)
    out.write("%-*s  %-8s  %s\n" % (wide, "variable", "default", "meaning (read by)"))
    for o in OPTIONS:
        text = "%s (%s)" % (o.help, o.who)
        lines = textwrap.wrap(text, 92 - wide - 12, break_on_hyphens=False) or [""]
        out.write("%-*s  %-8s  %s\n" % (wide, o.env, option_default_text(o), lines[0]))
        for rest in lines[1:]:
            out.write("%s  %s\n" % (" " * (wide + 10), rest))


def option_range_text(o):
    """The values the option takes, as docs/environment.rst's table shows them."""
    if o.type == "path":
        return "a path"
    if o.type == "depth":
        return "``auto``, %d to %d" % (o.min, o.max)
    if o.type == "bool":
        return "%d or %d" % (o.min, o.max)
    if o.type == "choice":
        return ", ".join("``%s``" % c for c in CHOICES[o.env])
    return "%d to %d" % (o.min, o.max)


RST_BEGIN = (".. The table below is generated from mmleaklib/facts.py (python3 -m mmleaklib.facts "
             "--rst-options):\n.. edit it there; the manual page is built with a fresh copy.\n")
RST_END = ".. (end of the generated table)\n"


def rst_options():
    """The option table as reStructuredText: the generated part of docs/environment.rst
    (between RST_BEGIN and RST_END), from the same rows `mmleak.py options` prints."""
    import textwrap
    # the first column as wide as the longest name (``MMLEAK_SUPPRESSIONS``)
    widths = (max(21, max(len(o.env) + 4 for o in OPTIONS)), 8, 14, 42)
    rule = "  ".join("=" * w for w in widths)
    rows = [("variable", "default", "range", "meaning")]
    for o in OPTIONS:
        d = option_default_text(o)
        rows.append(("``%s``" % o.env, d if d.startswith("(") else "``%s``" % d,
                     option_range_text(o), o.help))
    out = [rule]
    for i, row in enumerate(rows):
        cells = [textwrap.wrap(c, w, break_on_hyphens=False, break_long_words=False) or [""]
                 for c, w in zip(row, widths)]
        if len(row[2]) > widths[2]:         # a list of values: one a line
            parts = row[2].split(", ")
            cells[2] = [p + "," for p in parts[:-1]] + parts[-1:]
        for j in range(max(len(c) for c in cells)):
            out.append("  ".join(("%-*s" % (w, c[j] if j < len(c) else ""))
                                 for c, w in zip(cells, widths)).rstrip())
        if i == 0:
            out.append(rule)
    out.append(rule)
    return RST_BEGIN + "\n" + "\n".join(out) + "\n\n" + RST_END


def with_rst_options(text):
    """TEXT (docs/environment.rst) with its generated table made anew from OPTIONS."""
    a = text.index(RST_BEGIN)
    b = text.index(RST_END, a) + len(RST_END)
    return text[:a] + rst_options() + text[b:]


# ---------------------------------------------------------------------------------------
# What is the C/C++ runtime, and what passes an allocation through (a call site is the first
# frame outside both; with MMLEAK_DEPTH=auto, mmleak.so records frames until one is outside)
# ---------------------------------------------------------------------------------------

# Objects of the C/C++ runtime: code in them allocates on the program's behalf (stdio
# buffers, std::string, getline, the loader's TLS blocks, NSS lookups), by the start of
# their file name (libc.so.6; libc-2.31.so, glibc's own name for it before 2.34).
# mmleak.so itself too: the retry of a failing operator new allocates in its new_failed.
RUNTIME_OBJECTS = (
    "libc.so", "libc-", "libstdc++.so", "libgcc_s.so", "ld-linux", "ld64.so", "libm.so",
    "libm-", "libpthread.so", "libpthread-", "libdl.so", "libdl-", "librt.so", "librt-",
    "libresolv.so", "libresolv-", "libnss_", "libjemalloc.so", "libtcmalloc", "libmimalloc.so",
    "mmleak.so",
)

RUNTIME_RE = re.compile("^(?:%s)" % "|".join(re.escape(p) for p in RUNTIME_OBJECTS))

# Code compiled into the program from the system's headers (std::string's and the containers'
# templates): the runtime's too, for the purpose of naming a call site.
RUNTIME_SOURCES = ("/usr/include/", "/usr/lib/gcc/", "/usr/local/include/")

# Functions that only pass an allocation through: with a trace depth > 1, a call site is the
# first frame outside these (so every caller of xmalloc is a site of its own).  C names are
# symbols (mmleak.so finds them in each object); a name with a space, '<' or "::" is a
# demangled C++ name ('*' stands for any template argument), which only the Python side
# matches (mmleak.so takes libstdc++ and std:: template code for the runtime).
WRAPPERS = (
    "xmalloc", "xcalloc", "xrealloc", "xstrdup", "xstrndup", "xmemdup", "xzalloc",
    "xnmalloc", "xcharalloc", "xasprintf", "xvasprintf", "xreallocarray",
    "g_malloc", "g_malloc0", "g_malloc_n", "g_malloc0_n", "g_realloc",
    "g_realloc_n", "g_try_malloc", "g_try_malloc0", "g_strdup", "g_strndup", "g_memdup",
    "g_memdup2", "g_slice_alloc", "g_slice_alloc0", "g_strdup_printf", "g_strdup_vprintf",
    "g_strconcat",
    "strdup", "strndup", "__strdup", "__libc_strdup", "asprintf", "vasprintf",
    "Perl_safesysmalloc", "Perl_safesyscalloc", "Perl_safesysrealloc",
    "PyMem_RawMalloc", "PyMem_RawCalloc", "PyMem_RawRealloc", "_PyMem_RawMalloc",
    "_PyMem_RawCalloc", "_PyMem_RawRealloc", "PyMem_Malloc", "PyMem_Calloc", "PyMem_Realloc",
    "PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc", "_PyObject_Malloc",
    "_PyObject_Calloc", "_PyObject_Realloc",
    "sqlite3Malloc", "sqlite3MallocZero", "sqlite3_malloc", "sqlite3_malloc64",
    "sqlite3Realloc", "sqlite3_realloc", "sqlite3_realloc64", "sqlite3DbMallocRaw",
    "sqlite3DbMallocZero", "sqlite3DbMallocRawNN", "sqlite3MemMalloc", "sqlite3MemRealloc",
    "OPENSSL_malloc", "OPENSSL_zalloc", "CRYPTO_malloc", "CRYPTO_zalloc", "CRYPTO_realloc",
    "xmlMalloc", "xmlMallocAtomic", "xmlRealloc", "xmlStrdup", "xmlStrndup",
    "operator new", "operator new[]", "__gnu_cxx::new_allocator<*>::allocate",
    "std::__new_allocator<*>::allocate", "std::allocator<*>::allocate",
    "std::allocator_traits<*>::allocate",
)


def is_cxx_name(name):
    return " " in name or "<" in name or "::" in name


# ---------------------------------------------------------------------------------------
# The C header
# ---------------------------------------------------------------------------------------

def _c_str(s):
    return '"%s"' % s.replace("\\", "\\\\").replace('"', '\\"')


def _c_value(o, v):
    return _c_str(v) if o.type == "path" else str(int(v))


def c_header():
    """facts.h (built into build/gen/ by the Makefile): the facts above for the C side."""
    out = ["/* facts.h: generated by `python3 -m mmleaklib.facts --c-header` from",
           " * mmleaklib/facts.py, the one definition of these facts; do not edit. */",
           "#ifndef MMLEAK_FACTS_H", "#define MMLEAK_FACTS_H", "",
           "/* The dump format's version (the \"#mmleak N\" header line of every dump file). */",
           "#define MMLEAK_FORMAT_VERSION %d" % FORMAT_VERSION,
           "/* Frames recorded per allocation at most: MMLEAK_DEPTH's upper bound. */",
           "#define MMLEAK_MAX_DEPTH %d" % MAX_DEPTH,
           "/* The longest line a reader keeps (bytes); a longer one is reported. */",
           "#define MMLEAK_LINE_MAX %d" % LINE_MAX, "",
           "/* The settings of mmleak.so: X(NAME, \"MMLEAK_<NAME>\", type, default, min, max, "
           "\"help\");",
           " * type: path (a directory), depth (min..max frames, or \"auto\": 0), int (min..max), "
           "bool (0 or 1);",
           " * default: a string for path, a number for the others. */",
           "#define MMLEAK_OPTIONS(X) \\"]
    rows = [o for o in OPTIONS if o.who == "mmleak.so"]
    for i, o in enumerate(rows):
        out.append("    X(%s, %s, %s, %s, %d, %d, %s)%s" % (
            o.name, _c_str(o.env), o.type, _c_value(o, o.default), o.min, o.max,
            _c_str(o.help), " \\" if i < len(rows) - 1 else ""))
    scan = [o for o in OPTIONS if o.who == "mmleak-scan"]
    out += ["", "/* The settings of mmleak-scan: X(NAME, \"MMLEAK_<NAME>\", type, default, min, "
            "max, \"help\"). */", "#define MMLEAK_SCAN_OPTIONS(X) \\"]
    for i, o in enumerate(scan):
        out.append("    X(%s, %s, %s, %s, %d, %d, %s)%s" % (
            o.name, _c_str(o.env), o.type, _c_value(o, o.default), o.min, o.max,
            _c_str(o.help), " \\" if i < len(scan) - 1 else ""))
    out += ["", "/* The runtime: a loaded object whose file name starts with one of these. */",
            "#define MMLEAK_RUNTIME_OBJECTS(X) \\"]
    out += ["    X(%s)%s" % (_c_str(s), " \\" if i < len(RUNTIME_OBJECTS) - 1 else "")
            for i, s in enumerate(RUNTIME_OBJECTS)]
    cnames = [w for w in WRAPPERS if not is_cxx_name(w)]
    out += ["", "/* Allocation wrappers by symbol name (the demangled C++ names of the Python "
            "side's list", " * are left out: libstdc++ and std:: template code are the "
            "runtime's). */", "#define MMLEAK_WRAPPERS(X) \\"]
    out += ["    X(%s)%s" % (_c_str(w), " \\" if i < len(cnames) - 1 else "")
            for i, w in enumerate(cnames)]
    out += ["", "#endif", ""]
    return "\n".join(out)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--c-header"]:
        sys.stdout.write(c_header())
        return 0
    if argv == ["--options"]:
        print_options(sys.stdout)
        return 0
    if argv == ["--rst-options"]:
        sys.stdout.write(rst_options())
        return 0
    sys.stderr.write("usage: python3 -m mmleaklib.facts --c-header | --options | "
                     "--rst-options\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
