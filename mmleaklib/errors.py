"""Messages and exit statuses: one Fail, one warn, one set of exit statuses for the three tools
(mmleak.py, mmleak-panda.py, mmleak-install.py), and the command-line checks they share.

Every message is one line on stderr that starts with the tool's name (PROG, set by the tool
with set_tool); mmleak-install.py labels its lines ("error:", "warning:", "note:")."""
import argparse
import functools
import math
import re
import sys
import textwrap

PROG = "mmleak.py"      # the tool running: every message starts with its name
LABELLED = False        # messages say their kind ("mmleak-install.py: warning: ...")
INSTALLED = False       # run as an installed command (mmleak, not mmleak.py): see set_tool

EXIT_OK = 0             # done
EXIT_USAGE = 1          # the command line asks for what cannot be done
EXIT_INPUT = 2          # something needed could not be used: an input, an output, the system
EXIT_PARTIAL = 3        # done, but the answer is incomplete, or negative
EXIT_TOOL = 4           # a helper program, or the tool itself, failed

# The exit statuses, documented once: (status, what it means for each tool).  Each tool's
# --help shows its column (exit_help).
STATUSES = (
    (EXIT_OK, {
        "mmleak.py": "success",
        "mmleak-panda.py": "page written",
        "mmleak-install.py": "success (status: the drop-in is installed; uninstall: removed, "
                             "or was not installed)"}),
    (EXIT_USAGE, {
        "mmleak.py": "usage error",
        "mmleak-panda.py": "usage error",
        "mmleak-install.py": "usage or input error: bad option, malformed or unknown unit "
                             "name, masked unit, a control character or invalid UTF-8 in "
                             "--dir or --lib, a dump directory the tool refuses (a system "
                             "directory; under /tmp with PrivateTmp=yes; in the unit's "
                             "RuntimeDirectory= without RuntimeDirectoryPreserve=yes; an "
                             "existing directory the unit's user cannot write or reach that "
                             "the tool did not make; a link of another user's on a path it "
                             "writes), a mmleak.conf that mmleak-install.py did not write"}),
    (EXIT_INPUT, {
        "mmleak.py": "an input could not be used (missing or unreadable file, files of "
                     "different processes mixed, no dump files found, a file that is not "
                     "a dump at all: all inputs refused, nothing written, a file at one of "
                     "mmleak's names that is not a regular file of the trace's owner or root: "
                     "ignored or refused, in one line), a trace's lock still held after "
                     "--lock-wait seconds, or an output file could not be "
                     "written; whatever could be read was still processed",
        "mmleak-panda.py": "the input could not be used: a line that is not in the dump format "
                           "(reported on stderr with its line number), a file on stdin that "
                           "is not a dump at all, or no such maps file; "
                           "or the page cannot be written (-o); no report is written",
        "mmleak-install.py": "environment error: not root (without --root or --dry-run), "
                             "--root unreadable, mmleak.so not found, User=/Group= not "
                             "resolvable, a file operation or daemon-reload failed"}),
    (EXIT_PARTIAL, {
        "mmleak.py": "malformed lines were skipped (each reported on stderr with file and "
                     "line), or the trace lost events (INCOMPLETE TRACE): the result may miss "
                     "events",
        "mmleak-panda.py": "page written, but the trace lost events (\"#lost\", \"#dropping\" "
                           "lines): INCOMPLETE",
        "mmleak-install.py": "status only: not installed (no drop-in)"}),
    (EXIT_TOOL, {
        "mmleak.py": "eu-addr2line (elfutils) missing or failing: addresses left unresolved",
        "mmleak-panda.py": "eu-addr2line (elfutils) missing or failing: page written, "
                           "addresses left unresolved",
        "mmleak-install.py": "internal error (a bug: please report it)"}),
)

EXIT_CHECK = 23          # run --check, report --check: leaks found (LeakSanitizer's status)
EXIT_INTERRUPTED = 130   # SIGINT (Ctrl-C), as a shell reports a command it killed
INTERRUPTED_NOTE = "Interrupted (SIGINT, Ctrl-C): one line, \"interrupted\", status 130."

EXIT_NOTES = {
    "mmleak.py": "A torn last line or padding (NULs anywhere, blanks), which a killed process or "
                 "a crash leaves behind, is reported but is not an error: the complete events "
                 "around it are read.  With --check (run, report): 23 (--check-status) when, "
                 "after suppressions, a block of a --leak-kinds kind is not freed; `run` "
                 "otherwise exits with the command's status.",
    "mmleak-install.py": "Errors are one line on stderr, \"mmleak-install.py: error: ...\". "
                         "Warnings are one line each on stderr, \"mmleak-install.py: warning: "
                         "...\"; they never stop install.",
}


def exit_help(tool):
    """The exit statuses of TOOL, for the end of its --help."""
    out = ["exit status: one set for mmleak.py, mmleak-panda.py and mmleak-install.py",
           "exit codes:"]
    for status, text in STATUSES:
        out.extend(textwrap.wrap(text[tool], 92, initial_indent="  %d  " % status,
                                 subsequent_indent="     "))
    out.extend(textwrap.wrap(" ".join(filter(None, (EXIT_NOTES.get(tool),
                                                     INTERRUPTED_NOTE))), 92))
    return "\n".join(out)


def set_tool(script, labelled=False):
    """The tool that runs (SCRIPT: mmleak.py, mmleak-panda.py, mmleak-install.py): the name
    it was started by (layout.command_name: the installed command's has no .py) starts every
    message (LABELLED: and the kind), and is the one its --help uses.  -> that name."""
    global PROG, LABELLED, INSTALLED
    from . import layout
    PROG, LABELLED = layout.command_name(script), labelled
    INSTALLED = PROG != script
    return PROG


class Fail(Exception):
    """An error for the user: one line on stderr, then exit with .status."""

    def __init__(self, msg, status=EXIT_INPUT):
        super().__init__(msg)
        self.status = status


# What a terminal acts on instead of showing: the C0 controls (ESC starts its escape
# sequences), DEL, the C1 controls (U+009B is a whole CSI to some terminals), and the
# bidirectional overrides and isolates (they reorder the text after them on the line).  The
# names a report prints come from the traced program and from whoever wrote its files: its
# command line and title, the paths of its maps file, the symbols of its objects.
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(m):
    c = ord(m.group())
    return "\\x%02x" % c if c < 0x100 else "\\u%04x" % c


def printable(text):
    """TEXT, a name from the trace (a program's command line or title, a path, a symbol),
    with the characters a terminal acts on (_UNSAFE_RE; a newline too) as \\xHH (\\uHHHH):
    GNU find turns its "-printf %s\\n" into a real newline in its command line, and a
    planted name may carry an escape; neither may break a line of the report, write one, or
    send the terminal an escape."""
    return text if text is None else _UNSAFE_RE.sub(_escaped, text)


def line(msg, kind):
    """A message, printable (it may name a file or a symbol from a trace)."""
    return "%s: %s%s\n" % (PROG, kind + ": " if LABELLED else "",
                           "\n".join(printable(part) for part in str(msg).split("\n")))


def warn(msg, kind="warning"):
    sys.stderr.write(line(msg, kind))


def error(msg):
    sys.stderr.write(line(msg, "error"))


REFUSALS = set()        # the lines said about refused files (each once); exit status 2


class Refused(Fail):
    """A file at one of mmleak's names that is not what mmleak makes there."""


def refuse(msg):
    """Say MSG (about a refused file) once in this run, and make the exit status 2."""
    if msg not in REFUSALS:
        REFUSALS.add(msg)
        warn(msg)


def os_error_text(e):
    """An OSError as the rest of a message: 'FILE: reason'."""
    return "%s%s" % ((str(e.filename) + ": ") if e.filename else "", e.strerror or e)


def run_main(body, internal=False):
    """BODY() as a tool's main: its status, or the one line (and status) of what stopped it.
    INTERNAL: any other exception is an internal error (status 4), never a traceback."""
    try:
        return body()
    except Refused as e:
        refuse(str(e))
        return e.status
    except Fail as e:
        error(str(e))
        return e.status
    except BrokenPipeError:
        try:
            sys.stdout = None
        except Exception:  # noqa: BLE001
            pass
        return EXIT_OK
    except OSError as e:
        # a file that could not be read or written and was not caught with a better message
        error(os_error_text(e))
        return EXIT_INPUT
    except KeyboardInterrupt:
        error("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - never a traceback
        if not internal:
            raise
        error("internal error (%s: %s); please report it" % (type(e).__name__, e))
        return EXIT_TOOL


# ---------------------------------------------------------------------------------------
# Command lines: argparse with the documented usage status, and the checks of numbers
# ---------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits with EXIT_USAGE (1), as documented: the usage and
    one line (mmleak.py), or just the line (ONE_LINE: "PROG: error: MSG", or with SEE_HELP
    "PROG: MSG (see --help)"); long descriptions are wrapped (WRAP columns; the raw
    formatter keeps the epilogs' layout)."""

    def __init__(self, *args, one_line=False, see_help=False, wrap=92, **kw):
        if kw.get("description") and wrap:
            kw["description"] = textwrap.fill(kw["description"], wrap)
        kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        self.one_line, self.see_help, self.wrap = one_line, see_help, wrap
        super().__init__(*args, **kw)

    def add_subparsers(self, **kw):
        kw.setdefault("parser_class", functools.partial(
            type(self), one_line=self.one_line, see_help=self.see_help, wrap=self.wrap))
        return super().add_subparsers(**kw)

    def format_help(self):
        # an installed command's help names the commands as they are installed (mmleak
        # report, not mmleak.py report): the texts are written once, for both
        text = super().format_help()
        if INSTALLED:
            from . import layout
            text = layout.installed_names(text)
        return text

    def error(self, message):
        if self.see_help:
            self.exit(EXIT_USAGE, "%s: %s (see --help)\n" % (PROG, message))
        if self.one_line:
            self.exit(EXIT_USAGE, "%s: error: %s\n" % (PROG, message))
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, "%s: error: %s\n" % (self.prog, message))


def finite_float(v):
    """argparse type: a finite number (not nan, not inf)."""
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % v)
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError("not a finite number: %r" % v)
    return x


def nonnegative_float(v):
    x = finite_float(v)
    if x < 0:
        raise argparse.ArgumentTypeError("must not be negative: %r" % v)
    return x


def positive_float(v):
    x = finite_float(v)
    if x <= 0:
        raise argparse.ArgumentTypeError("must be above 0: %r" % v)
    return x


def int_range(lo, hi=None):
    """argparse type: a whole number from LO to HI (None: no upper bound)."""
    def check(v):
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError("not an integer: %r" % v)
        if n < lo:
            raise argparse.ArgumentTypeError("must be at least %d: %r" % (lo, v))
        if hi is not None and n > hi:
            raise argparse.ArgumentTypeError("at most %d: %r" % (hi, v))
        return n
    return check


positive_int = int_range(1)
