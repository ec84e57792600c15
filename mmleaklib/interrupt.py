"""Ctrl-C (SIGINT) at whatever moment: one line, "interrupted", status 130, never a traceback.

Inside a tool's main (errors.run_main), Python's KeyboardInterrupt is caught: the outputs are
cleaned up on the way, the line said, 130 returned.  Outside it, it would print a traceback:
while the tool's modules are imported (before main), while main parses its command line,
and at the exit (the interpreter's shutdown).  guard(), the first thing a tool's script
does, makes any KeyboardInterrupt that reaches the top (sys.excepthook) say the line and end
the process with 130, and exit() ends it with main's status without the shutdown (nothing is
left to run there: every thread of mmleaklib is a daemon).  Only the interpreter's own start,
before the script's first line, is not covered: SIGINT kills the process there (-SIGINT),
or Python's start-up code prints its KeyboardInterrupt, as it does for any script.  A SIGINT
blocked by the one that started the tool (`env --block-signal=INT`, or a test that wants
every moment covered) waits until guard() has run, then says the line.

Only builtin modules are imported here: this runs before anything else."""
import _signal
import os
import sys

_tool = {"script": None, "labelled": False}


def guard(script, labelled=False):
    """SCRIPT (mmleak.py, mmleak-panda.py, mmleak-install.py) is starting: see above.
    LABELLED: its messages say their kind (errors.set_tool)."""
    _tool.update(script=script, labelled=labelled)
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)     # (a second one: the same end)
        say()
        os._exit(130)
    sys.excepthook = hook
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [_signal.SIGINT])


def say():
    """The one line, as errors.error words it (the installed command's name, without .py,
    when it was started by that name: layout.command_name)."""
    name = _tool["script"]
    try:
        from . import layout
        name = layout.command_name(name)
    except Exception:  # noqa: BLE001 - the script's name, then
        pass
    try:
        os.write(2, ("%s: %sinterrupted\n" % (
            name, "error: " if _tool["labelled"] else "")).encode())
    except OSError:
        pass


def exit(status):
    """End the process with STATUS (main's) once stdout and stderr are flushed, without the
    interpreter's shutdown (where a SIGINT would print "Exception ignored")."""
    for f in (sys.stdout, sys.stderr):
        try:
            if f is not None:
                f.flush()
        except BrokenPipeError:
            pass                        # (a reader that stopped early: nothing to say)
        except OSError:
            status = status or 2
    os._exit(0 if status is None else status if isinstance(status, int) else 1)
