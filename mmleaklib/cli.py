"""The command line of mmleak.py: one add_CMD (its arguments) next to one cmd_CMD (what it
does) per subcommand, and main().

It is here, not in mmleak.py, so that it can be imported by name (by the tests, for one):
`import mmleak` finds mmleak.so beside mmleak.py first (.so is an extension module's suffix).
mmleak.py only calls main()."""
import argparse
import importlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from . import attach, compact, errors, facts, files, layout, report, series, shrink, symbolize
from .errors import (EXIT_CHECK, EXIT_INPUT, EXIT_OK, EXIT_PARTIAL, EXIT_TOOL, EXIT_USAGE, Fail,
                              finite_float, nonnegative_float, positive_float, positive_int,
                              warn)
from .sites import human_bytes

PROG = "mmleak.py"
EXIT_HELP = errors.exit_help(PROG)
trace_depth = facts.option_type("MMLEAK_DEPTH")     # MMLEAK_DEPTH as mmleak.so takes it


def command(sub, name, func, help, description, epilog=EXIT_HELP):
    """The subcommand NAME, run by FUNC."""
    p = sub.add_parser(name, help=help, description=description, epilog=epilog)
    p.set_defaults(func=func)
    return p


def add_output(p, what):
    p.add_argument("-o", "--output", help=what)


def add_dir(p):
    p.add_argument("dir", help="the dump directory (MMLEAK_DIR)")


TIMEOUT_HELP = ("the whole command's time limit (default 10): it returns within SECONDS "
                "of its start whatever it waits for.  At most three quarters of the time left "
                "go to waiting for a moment when a thread of the process is safe to borrow "
                "(none found: refused, exit status 2, the process left as it was); the calls "
                "in the process get the rest, and one still running at the limit is abandoned "
                "(exit status 2: the process may then hold a lock the call took).  Only a "
                "thread in uninterruptible sleep that does not stop when asked can hold the "
                "command up to 5 s longer")


def add_timeout(p):
    p.add_argument("--timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help=TIMEOUT_HELP)


TRACE_IDS_HELP = """\
Trace ids: mmleak.so names a process's first trace PID, and the next ones PID-1, PID-2...:
the image a process exec'd (a service started through a shell: the shell is PID, the
daemon it exec'd PID-1), a new attach after a detach, or a later process with the same pid.
--pid PID means that process as it is now, or was last: its newest trace with dump files (a
note on stderr lists the others, oldest first, each with its command); --trace ID takes
one trace exactly, an earlier image too.

"""


def add_lock_wait(p):
    p.add_argument("--lock-wait", type=nonnegative_float, default=compact.READ_LOCK_WAIT,
                   metavar="SECONDS",
                   help="wait at most SECONDS (default %g; 0: for ever) for the trace's lock "
                        "while a compaction pass, or any process of the trace's owner, holds "
                        "it; then exit with status 2" % compact.READ_LOCK_WAIT)


def add_trace_choice(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pid", help="the process: its newest trace (the image it exec'd last); "
                                 "default: the trace written last")
    g.add_argument("--trace", metavar="ID", help="exactly trace ID (PID or PID-K), e.g. the "
                                                 "image before an exec")
    p.epilog = TRACE_IDS_HELP + (p.epilog or "")


def write_result(sh, output, final, raw=None):
    """SH's result in the dump format to OUTPUT (stdout if None); RAW: the file its event
    lines are in, when the compiled shrinker wrote them (SH.raw_result)."""
    def put(out):
        if raw is not None and sh.raw_result is not None:
            sh.write_raw(out, raw)
        else:
            sh.write(out, final=final)
    if not output:
        put(sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return
    try:
        with files.new_output(output) as out:
            put(out)
    except OSError as e:
        raise Fail("cannot write %s: %s" % (output, e.strerror or e))


def result_status(sh):
    if sh.gap_text():
        warn(sh.gap_text())
    return EXIT_PARTIAL if sh.problems.malformed or sh.gap_text() else EXIT_OK


# ---------------------------------------------------------------------------------------
# shrink, symbolize
# ---------------------------------------------------------------------------------------

def add_shrink(sub):
    s = command(sub, "shrink", cmd_shrink, "cancel matching allocation/free pairs",
                "Read dump files (or stdin, sorted or not) and write what does not cancel out, "
                "in the dump format: the blocks still allocated, the frees of blocks allocated "
                "before tracing began, and the bracket lines (PTR SEQ +/-) a later merge "
                "needs.  Shrinking is repeatable: shrink the output of several shrinks again, "
                "in any grouping and order, and the survivors are the same.  With --final "
                "(the input is all of a process's files) only survivors and foreign frees are "
                "written.  Memory use is proportional to the addresses still open in the "
                "input, not to the number of events.  Lines a crashed or still running thread "
                "had only staged (mmleak.ID.N.tail) are read too.",
                "examples:\n"
                "  %(prog)s mmleak.1234.*.out > mmleak.1234.txt\n"
                "  for f in mmleak.1234.*.out; do LC_ALL=C sort -s -k1,1 $f | mmleak.py shrink "
                "> $f.shrinked; done\n"
                "  cat mmleak.1234.*.shrinked | LC_ALL=C sort -s -k1,1 | mmleak.py shrink "
                "--final > mmleak.1234.txt\n"
                "  awk 'NF >= 5' mmleak.1234.txt     # just the surviving allocations\n\n"
                + EXIT_HELP)
    s.add_argument("files", nargs="*", metavar="FILE", help="dump files; none or '-': stdin")
    s.add_argument("--final", action="store_true",
                   help="the input is complete: drop bracket lines, keep only survivors and "
                        "foreign frees")
    add_output(s, "write here instead of stdout")
    s.add_argument("--mixed", action="store_true",
                   help="allow files of different processes (their addresses are unrelated: "
                        "only for experts)")
    s.add_argument("--stats", action="store_true", help="print a summary line on stderr")
    s.add_argument("--progress", action="store_true",
                   help="progress on stderr even when it is not a terminal")


def cmd_shrink(args):
    paths = args.files or ["-"]
    prog = shrink.progress_printer() if (args.progress or sys.stderr.isatty()) else None
    # the compiled shrinker writes the result's lines to a temporary file, copied out after
    # the header lines: no Python object per line; to stdout, it writes them there itself,
    # after the header lines (no copy)
    with tempfile.TemporaryFile(prefix="mmleak-shrink.") as raw:
        sh = shrink.shrink_files(paths, progress=prog, mixed=args.mixed, raw=raw,
                                 final=args.final,
                                 direct=None if args.output else sys.stdout.buffer)
        if prog and sh.events > 1000000:
            prog(sh, paths[-1], 0, done=True)
        write_result(sh, args.output, args.final, raw)
    sh.problems.summary()
    if args.stats:
        if sh.raw_result is not None:
            n, size, frees = (sh.raw_result[k] for k in ("allocs", "alloc_bytes", "frees"))
        else:
            surv = sh.survivors()
            n, size, frees = len(surv), sum(a.size for a in surv), len(sh.foreign_frees())
        warn("%d events (%d allocations, %d frees) in %d inputs; %d blocks (%s) survive, "
             "%d foreign frees" % (sh.events, sh.allocs, sh.frees, len(paths), n,
                                   human_bytes(size), frees))
    status = result_status(sh)
    return EXIT_INPUT if sh.problems.fatal else status


def add_symbolize(sub):
    y = command(sub, "symbolize", cmd_symbolize, "turn caller addresses into function and "
                "file:line",
                "Resolve addresses from a dump (hex, as written there) with elfutils "
                "(eu-addr2line -M), in one batch: function (C++ demangled), file:line, and the "
                "chain of inlined calls.  Callers in the dump already point into the call "
                "instruction, so the line shown is the calling line.  Addresses in objects "
                "that were unloaded and replaced, or in files changed since the run, are "
                "reported unresolved, with the reason.")
    y.add_argument("--maps", required=True, help="the process's mmleak.PID.maps")
    y.add_argument("addrs", nargs="+", metavar="ADDR")


def cmd_symbolize(args):
    try:
        addrs = [int(a, 16) for a in args.addrs]
    except ValueError:
        raise Fail("addresses must be hex (as in the dump): %s" % " ".join(args.addrs),
                   EXIT_USAGE)
    if not os.path.isfile(args.maps):
        raise Fail("%s: no such maps file" % args.maps)
    sym = symbolize.Symbolizer(args.maps, trace_start=files.trace_start_for_maps(args.maps),
                               program_lines=False)
    frames = sym.lookup(addrs)
    status = EXIT_OK
    out = report.terminal(sys.stdout)     # the names are the maps file's and the objects'
    for a in addrs:
        fr = frames[a]
        label = symbolize.frame_label(fr)
        if fr.error and not fr.function:
            out.write("%012x  %s  (unresolved: %s)\n" % (a, label, fr.error))
            status = EXIT_TOOL if sym.tool_error else status
            continue
        out.write("%012x  %s  [%s+0x%x]\n" % (a, label, fr.module, fr.offset))
        for fn, fl, ln in fr.inlined:
            out.write("%12s    inlined into %s at %s:%s\n" % ("", fn or "??", fl or "??",
                                                              ln or "?"))
    return status


# ---------------------------------------------------------------------------------------
# run, recover
# ---------------------------------------------------------------------------------------

CHECK_HELP = """\
--check, the gate for a test suite: the process's blocks not freed, classified by the
reachability scan (definite: nothing points to them; indirect: only lost blocks do;
possible: only interior pointers; reachable: still referenced; unknown: no scan ran),
less those a suppression takes, fail the check when one has a kind in --leak-kinds:
exit status 23 (LeakSanitizer's; --check-status).  Suppressions are LeakSanitizer's
`leak:PATTERN` lines (* any characters, ^ and $ anchors), matched against the function,
source file or module of any frame of a block's stack; from --suppressions FILE, the
files in MMLEAK_SUPPRESSIONS (':'-separated), the program's own
__lsan_default_suppressions(), and a built-in list of the C runtime's one-time
allocations (applied to blocks a scan found not reachable).  The report says what each
rule took.

"""


def leak_kinds(text):
    """--leak-kinds: 'definite,indirect', 'all', 'none' (valgrind's --errors-for-leak-kinds)."""
    from .sites import KINDS
    if text == "all":
        return list(KINDS)
    if text == "none":
        return []
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise argparse.ArgumentTypeError("%r: kinds are %s (comma-separated), all or none"
                                         % (",".join(bad) or text, ", ".join(KINDS)))
    return kinds


DEFAULT_LEAK_KINDS = "definite,indirect,unknown"


def check_status(text):
    v = int(text) if text.isdigit() else -1
    if not 1 <= v <= 255:
        raise argparse.ArgumentTypeError("%r: an exit status from 1 to 255" % text)
    return v


def add_check_options(p, check_help):
    p.add_argument("--check", action="store_true", help=check_help)
    p.add_argument("--check-status", type=check_status, default=EXIT_CHECK, metavar="N",
                   help="the exit status of a failed --check (default %d, LeakSanitizer's)"
                        % EXIT_CHECK)
    p.add_argument("--leak-kinds", type=leak_kinds, default=leak_kinds(DEFAULT_LEAK_KINDS),
                   metavar="KIND[,KIND...]",
                   help="the kinds that fail --check, like valgrind's --errors-for-leak-kinds: "
                        "definite, indirect, possible, reachable, unknown (no scan ran), all, "
                        "none (default %s)" % DEFAULT_LEAK_KINDS)
    p.add_argument("--suppressions", action="append", default=[], metavar="FILE",
                   help="leak:PATTERN rules (LeakSanitizer's syntax) of blocks not to count "
                        "as leaks; repeatable; more in MMLEAK_SUPPRESSIONS")
    p.add_argument("--no-builtin-suppressions", action="store_true",
                   help="do not apply the built-in list of the C runtime's one-time "
                        "allocations")
    p.epilog = CHECK_HELP + (p.epilog or "")


def check_verdict(rep, args, out, child=False):
    """The --check verdict of REP (suppressions applied): True if it passes; says why on
    OUT either way, and when the trace is incomplete (a verdict on what was recorded only).
    CHILD: REP is a process the command started (run --check), which --no-check-children
    leaves out."""
    out = report.terminal(out)
    ok = _check_verdict(rep, args, out, child)
    if rep.get("gaps"):
        out.write("mmleak: the verdict is on what was recorded: %s\n" % rep["gaps"])
    return ok


def _check_verdict(rep, args, out, child):
    n, b = report.check_failures(rep, args.leak_kinds)
    what = ",".join(args.leak_kinds) or "none"
    cmd = report.printable(rep["cmd"]) or "command unknown"
    if n:
        out.write("mmleak: check FAILED: trace %s (%s): %d blocks (%s) not freed of the kinds "
                  "that count (%s)\n" % (rep["trace"], cmd, n, report.bytes_text(b), what))
        if n == report.kind_totals(rep)["unknown"][0] and "unknown" in args.leak_kinds:
            # no scan ran (killed, aborted, MMLEAK_SCAN=0; _exit is scanned, exitscan.c):
            # blocks nobody classified fail the gate; say how to leave them out
            # (or one that could not be done or saved: its reason, report.py's scan_note)
            why = (rep["scan_note"] if rep.get("scan_failed") else
                   "no scan ran in that process: it ended by abort or a signal, or scans "
                   "were off")
            out.write("mmleak: all %d of reachability unknown (%s); to not count them: "
                      "--leak-kinds definite,indirect%s\n"
                      % (n, why, " or --no-check-children" if child else ""))
        return False
    n, b = rep.get("suppressed_total") or (0, 0)
    out.write("mmleak: check passed: trace %s (%s): no block not freed of the kinds that "
              "count (%s)%s\n" % (rep["trace"], cmd, what,
                                  "; %d blocks (%s) suppressed" % (n, report.bytes_text(b))
                                  if n else ""))
    return True


def add_run(sub):
    r = command(sub, "run", cmd_run, "run a command under the tracer",
                "Run CMD with mmleak.so preloaded ($MMLEAK_LIB, else the one beside the "
                "scripts in a source tree, else the installed one), then say where its dump files are and the "
                "command that reports on them.  Exits with CMD's exit status; a SIGTERM or "
                "SIGHUP sent to mmleak.py is passed on to CMD.  While it runs, "
                "its dump files are compacted every second (see `compact`): the files rotate "
                "at %d MB (MMLEAK_ROTATE_MB, unless set) and each finished one is folded into "
                "mmleak.ID.compact and deleted, so the directory holds the live set, not the "
                "history (the result and a few smaller runs, mmleak.ID.compact.N, left as they "
                "are when CMD ends: `compact DIR` merges them into one file); --keep-all keeps "
                "every event instead." % facts.COMPACT_ROTATE_MB,
                "example:\n  %(prog)s -d /var/tmp/leaks --depth 16 -- ./server --port 8080\n")
    r.add_argument("-d", "--dir", help="dump directory (default: $MMLEAK_DIR or /tmp; made "
                                       "if missing)")
    r.add_argument("--depth", type=trace_depth,
                   help="frames per allocation at most, 1 to %d, or auto (MMLEAK_DEPTH; "
                        "default: %d, the whole stack)" % (facts.MAX_DEPTH, facts.MAX_DEPTH))
    r.add_argument("--keep-all", action="store_true",
                   help="no background compaction: keep every dump file as written")
    r.add_argument("--lib", help="path of mmleak.so to use")
    add_check_options(r, "when CMD ends, report its leaks on stderr and exit with "
                         "--check-status (23) if a block of a --leak-kinds kind is not freed "
                         "(suppressions applied) in its trace or a child's; otherwise with "
                         "CMD's status (the growth series gets the last point only)")
    r.add_argument("--no-check-children", action="store_true",
                   help="with --check: only CMD's own process (its last image), not the "
                        "processes it started (a shell script's subshells and tools)")
    r.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")


def preload_env(lib, d, depth, keep_all):
    """The environment of a command run under LIB, tracing into D."""
    env = dict(os.environ)
    # mmleak.so first (an allocator preloaded before it would hide malloc from it), and one
    # copy only (a second one stays out of the way, but say which one traces)
    pre = [p for p in re.split(r"[ \t\n:]+", env.get("LD_PRELOAD", "")) if p]
    for p in pre:
        if p != lib and os.path.basename(p) == os.path.basename(lib):
            warn("LD_PRELOAD named another %s, %s: replaced by %s"
                 % (os.path.basename(lib), p, lib))
    env["LD_PRELOAD"] = " ".join([lib] + [p for p in pre
                                          if os.path.basename(p) != os.path.basename(lib)])
    env["MMLEAK_DIR"] = d
    if depth:
        env["MMLEAK_DEPTH"] = str(depth)
    if not keep_all:
        env.setdefault("MMLEAK_ROTATE_MB", str(facts.COMPACT_ROTATE_MB))
    return env


def forward_signals(proc, sigs):
    """Pass SIGS on to PROC while it runs (Popen.send_signal: never to a pid already
    reaped); a signal we inherited ignored (nohup) stays ignored.  {signal: old handler}."""
    def forward(sig, frame):
        proc.send_signal(sig)
    old = {}
    for sig in sigs:
        if signal.getsignal(sig) != signal.SIG_IGN:
            old[sig] = signal.signal(sig, forward)
    return old


def cmd_run(args):
    cmd = args.command
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise Fail("run: no command given (mmleak.py run [-d DIR] -- CMD ARGS...)", EXIT_USAGE)
    lib = files.find_library(args.lib)
    if not lib:
        raise Fail("mmleak.so not found: run `make` in the source tree, `make install`, or "
                   "set MMLEAK_LIB", EXIT_INPUT)
    d = os.path.abspath(args.dir or os.environ.get("MMLEAK_DIR") or "/tmp")
    files.make_dump_dir(d)
    env = preload_env(lib, d, args.depth, args.keep_all)
    before = set(files.find_traces(d, said=False))
    try:
        proc = subprocess.Popen(cmd, env=env)
    except OSError as e:
        raise Fail("cannot run %s: %s" % (cmd[0], e.strerror))
    # The program gets the terminal's signals itself; we only wait for it, compacting its
    # traces (and its children's) in the background meanwhile.  SIGTERM and SIGHUP sent to
    # us alone (`kill PID` of what the user or a service manager started) are passed on, so
    # that the program stops and its trace is finished, not left running orphaned.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    passed = forward_signals(proc, (signal.SIGTERM, signal.SIGHUP))
    compactor = None
    if not args.keep_all:
        compactor = compact.BackgroundCompactor(d, before, views=bool(args.check))
        compactor.start()
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old)
        for sig, handler in passed.items():
            signal.signal(sig, handler)
        if compactor:
            # with --check, the verdict reads the trace while the last pass's last point
            # of the series is made (both under the trace's lock, shared)
            compactor.finish(overlap=bool(args.check))
    how = ("exit status %d" % rc) if rc >= 0 else ("killed by signal %d" % -rc)
    say_run_traces(d, before, proc.pid, cmd[0], how)
    status = rc if rc >= 0 else 128 - rc
    try:
        if args.check and not run_check(d, before, args, None if not args.no_check_children
                                        else proc.pid, compactor.views if compactor else {},
                                        main_pid=proc.pid):
            return args.check_status
    finally:
        if compactor:
            compactor.join()
    return status


def run_check(d, before, args, only_pid=None, views=None, main_pid=None):
    """run --check: the traces the run wrote (the command's and its children's) through the
    gate; False if one fails.  Of a process that exec'd, only its last image counts: the
    memory of the images before was released by the exec, not leaked.  ONLY_PID: that
    process alone (--no-check-children).  A trace that fails
    is reported on stderr (the command's stdout is its own), one that passes in a line (and
    its leak summary when suppressions took blocks).  VIEWS: {trace: (Shrinker, blocks.Live)}
    of the traces the compactor's last pass read whole (build_report NOW): not read again.
    MAIN_PID: the command's process (its children's failures say --no-check-children)."""
    traces = files.find_traces(d, said=False)
    new = compact.run_traces(d, before, traces)[0]
    for t in sorted(new):
        files.say_ignored(traces, t)
    last = []
    pids = {t.split("-")[0] for t in new}
    if only_pid is not None:
        pids &= {str(only_pid)}
    for pid in sorted(pids, key=int):
        images = [t for t in report.process_images(traces, pid) if t in new and traces[t]]
        if images:
            last.append(images[-1])
    ok = True
    for tid in last:
        rep = report.build_report(d, progress=False, trace=tid,
                                  now=(views or {}).pop(tid, None))
        report.apply_suppressions(rep, report.report_rules(
            rep, args.suppressions, not args.no_builtin_suppressions))
        rep["check"] = True
        rep["wrappers"] = []
        rep["growth"] = None            # a verdict, not a daemon's history
        if report.check_failures(rep, args.leak_kinds)[0]:
            report.print_top_sites(rep, sys.stderr)
        elif rep["suppressed"]:         # what the rules took, as LSan's "Suppressions used"
            report.print_kind_summary(rep, sys.stderr)
        ok = check_verdict(rep, args, sys.stderr, child=main_pid is not None and
                           tid.split("-")[0] != str(main_pid)) and ok
    return ok


def say_run_traces(d, before, pid, name, how):
    """Where the traces of a run are (PID: the command's process, which ended HOW)."""
    traces = files.find_traces(d, said=False)
    new, strangers = compact.run_traces(d, before, traces)
    for t in sorted(new):
        files.say_ignored(traces, t)
    new = sorted(new, key=lambda t: [int(x) for x in t.split("-")])
    if strangers:
        warn("traces of other users appeared in %s during the run (anybody can write there): "
             "%s: not this run's, left out (report one with --trace ID)"
             % (d, ", ".join(t + report.whose(d, t) for t in strangers)))
    # the command's own process: its traces of this run, oldest first (a shell that exec'd
    # the program is the same process: its trace is PID, the program's PID-1); the newest
    # one with files is the process as it ended, the one its next: line reports
    images = [t for t in report.process_images(traces, str(pid)) if t in new]
    done = [t for t in images if traces[t]]
    main = done[-1] if done else (images[-1] if images else (new[0] if new else None))
    if main is None:
        warn("%s ended (%s) and wrote no dump files in %s: was LD_PRELOAD cleared, or is "
             "the program static or setuid?" % (name, how, d))
        return
    size = sum(os.path.getsize(p) for p in traces[main] if os.path.exists(p))
    before_exec = [t for t in images if t != main]
    others = [t for t in new if t != main and t not in images]
    comp = files.TraceFiles(d, main).compact
    if os.path.exists(comp):
        # the levels the compactor left (mmleak-compaction(7)): the result and its runs
        runs = [p for p in traces[main] if files.RUN_RE.match(os.path.basename(p))]
        warn("%s ended (%s); trace %s compacted in the background: %s (%s)%s and %d more dump "
             "files in %s" % (name, how, main, os.path.basename(comp),
                              human_bytes(os.path.getsize(comp)),
                              ", %d newer run%s (%s)" % (
                                  len(runs), "s" if len(runs) > 1 else "",
                                  human_bytes(sum(os.path.getsize(p) for p in runs)))
                              if runs else "",
                              sum(1 for p in traces[main] if p.endswith(".out")), d))
    else:
        warn("%s ended (%s); trace %s: %d dump files, %s in %s"
             % (name, how, main, len(traces[main]), human_bytes(size), d))
    if before_exec:
        warn("before its last exec the same process was traced as: %s (report one with "
             "--trace ID)" % ", ".join("%s (%s)" % (t, report.trace_head(traces[t])[1] or
                                                    "no dump files") for t in before_exec))
    if others:
        warn("child processes traced too: %s" % " ".join(others))
    what = "--pid %d" % pid if main in images else "--trace %s" % main
    warn("next: %s report %s %s" % (sys.argv[0], d, what))


def add_recover(sub):
    v = command(sub, "recover", cmd_recover, "fold a crashed process's unflushed lines into "
                "its dump files",
                "mmleak.so stages each thread's newest events in mmleak.ID.N.tail and deletes "
                "it when the thread or process ends cleanly.  After a crash, SIGKILL or "
                "_exit() the .tail files remain; shrink and report read them as they are, but "
                "`sort` in the classic pipeline does not: recover appends the lines .out does "
                "not have yet and deletes the .tail.  Files of a process that is still running "
                "are left alone: one with that pid, or any that maps the .tail (a process in "
                "another pid namespace writes under its pid there).")
    v.add_argument("paths", nargs="+", metavar="DIR|FILE.out")
    v.add_argument("--force", action="store_true",
                   help="also when a process with that pid runs (a reused pid), or maps "
                        "the .tail")


def cmd_recover(args):
    return compact.recover(args.paths, args.force)


# ---------------------------------------------------------------------------------------
# report, compact, snapshot
# ---------------------------------------------------------------------------------------

def add_report(sub):
    q = command(sub, "report", cmd_report, "what a process leaked, and where",
                "Shrink all dump files of one process in DIR, symbolize the survivors' call "
                "sites, print the top leaking call sites, and write the HTML report (needs "
                "python3-pandas and python3-matplotlib).  The trace may be finished, compacted "
                "or still running.  --pprof, --folded and --heaptrack also write the live "
                "blocks for other tools, each file whole or not at all (a temporary file "
                "renamed over FILE); they and --csv follow the same filters (--since, "
                "--older-than, --baseline).",
                "examples:\n"
                "  %(prog)s /var/tmp/leaks --pid 1234 --no-html --pprof leaks.pb.gz\n"
                "  go tool pprof -top -sample_index=inuse_space leaks.pb.gz\n"
                "  %(prog)s /var/tmp/leaks --no-html --heaptrack leaks.heaptrack.gz && "
                "heaptrack_print leaks.heaptrack.gz\n"
                "  %(prog)s /var/tmp/leaks --no-html --folded leaks.folded && "
                "flamegraph.pl leaks.folded > leaks.svg\n\n" + EXIT_HELP)
    add_dir(q)
    add_trace_choice(q)
    add_output(q, "HTML file (default DIR/mmleak.PID.html)")
    for opt, help in (
            ("--csv", "also write the call-site table as CSV"),
            ("--pprof", "also write the live blocks by stack as a gzipped pprof profile "
                        "(profile.proto: go tool pprof, Parca, Pyroscope); sample types "
                        "inuse_objects and inuse_space, symbolized, with build ids"),
            ("--folded", "also write the live bytes as folded stacks, 'root;...;site BYTES' "
                         "(flamegraph.pl, inferno, speedscope, Pyroscope)"),
            ("--heaptrack", "also write the live blocks in heaptrack's format, for "
                            "heaptrack_print and heaptrack_gui (gzipped if FILE ends in .gz, "
                            "as heaptrack expects; plain text otherwise)")):
        q.add_argument(opt, metavar="FILE", help=help)
    q.add_argument("--export-allocator-frames", action="store_true",
                   help="in --pprof, --folded and --heaptrack, keep the frames between the "
                        "call site and the allocator (operator new, strdup, xmalloc...); by "
                        "default a stack ends at the call site the report names")
    q.add_argument("--top", type=positive_int, default=10,
                   help="call sites to print (default 10)")
    q.add_argument("--depth", type=positive_int, help="frames per call site (default: the trace's)")
    q.add_argument("--no-html", action="store_true", help="terminal output only")
    q.add_argument("--wrappers", action="append", default=[], metavar="NAME[,NAME...]",
                   help="more allocation wrapper functions to look through (trace depth "
                        "> 1; xmalloc, g_malloc and others are known)")
    q.add_argument("--no-wrapper-detection", action="store_true",
                   help="do not look for the program's own allocation wrappers (functions "
                        "that return the block the allocator gave them) in its stacks and "
                        "code; by default their callers are the call sites")
    q.add_argument("--debuginfo-path", action="append", default=[], metavar="DIR[:DIR...]",
                   help="more directories of separate debug information, looked in first "
                        "(a build-id tree DIR/.build-id/xx/rest.debug, or the "
                        ".gnu_debuglink name); then elfutils' own places: the object's "
                        "directory and its .debug, /usr/lib/debug, and debuginfod when "
                        "DEBUGINFOD_URLS is set")
    q.add_argument("--since", type=finite_float, metavar="SECONDS",
                   help="only blocks allocated at least SECONDS after the trace started "
                        "(hide the start-up state of a daemon)")
    q.add_argument("--older-than", type=finite_float, metavar="SECONDS",
                   help="only blocks at least SECONDS old at the last event (memleax-style)")
    q.add_argument("--baseline", metavar="FILE",
                   help="only blocks not alive in FILE, an earlier `mmleak.py shrink` "
                        "output of the same process (MTrace-style incremental report)")
    q.add_argument("--progress", action="store_true",
                   help="the reading's and the symbolizing's progress on stderr even when it "
                        "is not a terminal (on a terminal it is always shown)")
    q.add_argument("--show-reachable", action="store_true",
                   help="also print the call sites of still reachable blocks (hidden by "
                        "default; the CSV and the page always have them)")
    add_lock_wait(q)
    add_check_options(q, "exit with --check-status (23) if a block of a --leak-kinds kind "
                         "is not freed in the trace (suppressions applied): the gate of "
                         "`run --check` on an existing trace")


def cmd_report(args):
    rep = report.build_report(args.dir, args.pid, progress="always" if args.progress else True,
                              depth=args.depth,
                              since=args.since, older_than=args.older_than,
                              baseline=args.baseline, trace=args.trace,
                              wrappers=[n for w in args.wrappers for n in w.split(",") if n],
                              detect_wrappers=not args.no_wrapper_detection,
                              debuginfo_path=[d for p in args.debuginfo_path
                                              for d in p.split(":") if d],
                              lock_wait=args.lock_wait)
    rep["show_reachable"] = args.show_reachable
    rep["check"] = args.check
    report.apply_suppressions(rep, report.report_rules(rep, args.suppressions,
                                                       not args.no_builtin_suppressions))
    report.print_top_sites(rep, sys.stdout, args.top)
    if args.csv:
        report.write_csv(rep, args.csv)
        sys.stdout.write("CSV: %s\n" % args.csv)
    exported = report.write_exports(rep, args)
    out = args.output or files.TraceFiles(args.dir, rep["trace"]).html
    if not args.no_html and not write_page(rep, out):
        return EXIT_INPUT
    if not exported:
        return EXIT_INPUT
    if args.check and not check_verdict(rep, args, sys.stdout):
        return args.check_status
    if rep["incomplete"]:
        return EXIT_PARTIAL
    if rep["symbol_error"] and "not found" in rep["symbol_error"]:
        return EXIT_TOOL
    return EXIT_OK


def write_page(rep, out):
    """The HTML page of REP (mmleak-panda.py, beside this file: imported by its name); False
    if it could not be written."""
    try:
        panda = importlib.import_module("mmleak-panda")
    except ModuleNotFoundError as e:
        if e.name != "mmleak-panda":
            warn("no HTML report: %s (install python3-pandas and python3-matplotlib)" % e)
        else:
            warn("no HTML report: mmleak-panda.py not found next to mmleak.py")
        return True
    except ImportError as e:
        warn("no HTML report: %s (install python3-pandas and python3-matplotlib)" % e)
        return True
    try:
        panda.render_report(rep, out)
    except ImportError as e:            # pandas and matplotlib are imported when drawing
        warn("no HTML report: %s (install python3-pandas and python3-matplotlib)" % e)
        return True
    except OSError as e:
        warn("cannot write %s: %s" % (out, e.strerror or e))
        return False
    sys.stdout.write("HTML report: %s\n" % out)
    return True


def add_compact(sub):
    c = command(sub, "compact", cmd_compact, "fold finished dump files into a running result "
                "and delete them",
                "Fold every complete dump file of every trace in DIR (a file that ends with "
                "#end, or any file of a process that is gone) into that trace's running "
                "result, mmleak.ID.compact (the shrink of everything so far), and delete it, "
                "so that the disk holds the live set, not the history.  Safe at any moment: "
                "while the process runs, next to another compactor (a trace another one holds "
                "is skipped), next to `report` (which waits for a pass to end), and when "
                "killed in the middle (nothing is lost or counted twice).  A pass adds a point "
                "to mmleak.ID.series (at most every --series-interval seconds while the trace "
                "runs, and a last one when it is over): the live bytes and blocks per call "
                "site, for the report's growth chart.  A process is gone when its pid is and "
                "no process maps one of its staging files (.tail): a process in another pid "
                "namespace is found that way, if this compactor can see it.  Only regular "
                "files of the trace's owner (the owner of its .maps) or root are read; "
                "anything else at one of its names is left alone, in one line (exit status 2).",
                "examples:\n"
                "  %(prog)s /var/lib/mmleak/nfs-ganesha.service      # one pass\n"
                "  %(prog)s --follow /var/tmp/leaks    # every second, until no traced process "
                "is left\n\n" + EXIT_HELP)
    add_dir(c)
    c.add_argument("--pid", help="only this trace id")
    c.add_argument("--follow", action="store_true",
                   help="keep compacting every --interval seconds until no traced process "
                        "has been alive for --linger seconds (or until SIGTERM: the processes "
                        "traced then get %g seconds to end before the last pass)" % STOP_GRACE)
    c.add_argument("--forever", action="store_true",
                   help="with --follow: do not stop when no process is traced (a service's "
                        "companion, stopped with it); a trace it could not read is said once "
                        "and does not make the status 2 (systemctl would show it failed)")
    c.add_argument("--interval", type=positive_float, default=1.0, metavar="SECONDS",
                   help="with --follow, a pass starts this long after the previous one "
                        "started, or at once if that one took longer (default 1)")
    c.add_argument("--linger", type=positive_float, default=10.0, metavar="SECONDS",
                   help="with --follow: stop after this long without a traced process "
                        "(default 10)")
    c.add_argument("--no-series", action="store_true", help="do not add to mmleak.ID.series")
    c.add_argument("--series-interval", type=nonnegative_float, default=series.SERIES_INTERVAL,
                   metavar="SECONDS", help="while a trace runs, at most one point of its "
                   "series this often (default %g: a point reads what lies beside the "
                   "compacted result, or the whole live set; 0: every pass); a trace that is "
                   "over always gets its last point"
                   % series.SERIES_INTERVAL)
    c.add_argument("-v", "--verbose", action="store_true", help="one line per folding pass")
    c.add_argument("--progress", action="store_true",
                   help="the folds' progress on stderr (events read, files done, the file "
                        "read) even when it is not a terminal (on a terminal: always)")


STOP_GRACE = 10.0      # seconds the traces alive at a --follow's SIGTERM get to end


def cmd_compact(args):
    series.SERIES_INTERVAL = args.series_interval
    d = args.dir
    if not os.path.isdir(d):
        raise Fail(files.dir_error(d))
    stop = []
    if args.follow:
        def on_term(signum, frame):
            stop.append(signum)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)

    prog = shrink.progress_printer() if (args.progress or sys.stderr.isatty()) else None

    def one_pass(verbose):
        return compact.compact_dir(d, args.pid, series=not args.no_series, verbose=verbose,
                                   progress=prog)
    status = EXIT_OK
    idle_since = time.monotonic()
    while True:
        began = time.monotonic()
        live, results = one_pass(args.verbose or not args.follow)
        if any(r.get("malformed") for r in results):
            status = EXIT_PARTIAL
        if not args.follow or stop:
            break
        now = time.monotonic()
        if live:
            idle_since = now
        elif not args.forever and now - idle_since >= args.linger:
            one_pass(args.verbose)
            break
        deadline = began + args.interval    # from the start of this pass: see BackgroundCompactor
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
    if stop:        # stopped with its service: one last pass for what just ended
        # The service stops at the same time (a companion is not ordered before its service:
        # the service's restart would wait for this last pass, 20 s and more after sshd was
        # killed): the traces alive at the SIGTERM get STOP_GRACE seconds to end, so that the
        # last pass folds their last files (a process left running past it, such as a
        # session of a KillMode=process service, is folded at the companion's next start).
        waiting = set(live)
        deadline = time.monotonic() + STOP_GRACE
        while waiting and time.monotonic() < deadline:
            time.sleep(0.1)
            waiting = {t for t in waiting if compact.trace_alive(d, t)}
        one_pass(args.verbose)
    return status


def add_snapshot(sub):
    n = command(sub, "snapshot", cmd_snapshot, "the live set of a trace now, for a later "
                "--baseline report",
                "Write what is alive in the trace now (its compacted result and the files "
                "still being written, shrunk), in the dump format.  Give it to `report "
                "--baseline` later: the report then shows, per call site, what was allocated "
                "since and is still alive, and what of the snapshot was freed since (the "
                "incremental view MTrace users know).")
    add_dir(n)
    add_trace_choice(n)
    add_output(n, "file to write (default: stdout)")
    add_lock_wait(n)


def cmd_snapshot(args):
    """The live set of a trace now, in the dump format (an earlier moment for --baseline)."""
    tid, _ = report.choose_trace(args.dir, args.pid, args.trace)
    sh, _ = compact.read_trace(args.dir, tid, lock_wait=args.lock_wait)
    sh.problems.summary()
    if sh.problems.fatal:
        raise Fail("trace %s: a file could not be read: no snapshot written" % tid)
    write_result(sh, args.output, False)
    surv = sh.survivors()
    warn("trace %s: %d blocks alive (%s)" % (tid, len(surv), human_bytes(sum(a.size for a in
                                                                             surv))))
    return result_status(sh)


# ---------------------------------------------------------------------------------------
# attach, detach, status (mmleaklib/attach.py)
# ---------------------------------------------------------------------------------------

def add_attach(sub):
    a = command(sub, "attach", cmd_attach, "start tracing a running process, without "
                "restarting it",
                "Make the running process PID (started without mmleak) load mmleak.so and "
                "trace it from now on into DIR, exactly as if it had been started under the "
                "tracer.  Blocks allocated before show up as frees of blocks allocated before "
                "tracing.  A process started with mmleak.so preloaded and then detached (or "
                "started with MMLEAK_PAUSED=1) resumes, in a new trace.  Needs ptrace "
                "permission: root, or the same user where kernel.yama.ptrace_scope allows it "
                "(root for a process under a seccomp filter, which must be read).  The "
                "process's user must be able to write DIR, and the process must see DIR as we "
                "do (not in a mount namespace or root of its own).  Refusals are one line, exit "
                "status 2, the process left as it was.",
                "example:\n  %(prog)s 4242 -d /var/tmp/leaks    # ... later:\n"
                "  mmleak.py detach 4242\n  mmleak.py report /var/tmp/leaks --pid 4242\n\n"
                + EXIT_HELP)
    a.add_argument("pid", type=positive_int, help="the process")
    a.add_argument("-d", "--dir", help="dump directory (default: $MMLEAK_DIR or /tmp); made "
                                       "if missing, and given to the process's user")
    a.add_argument("--depth", type=trace_depth,
                   help="frames per allocation at most, 1 to %d, or auto (default: %d, see "
                        "MMLEAK_DEPTH)" % (facts.MAX_DEPTH, facts.MAX_DEPTH))
    a.add_argument("--rotate-mb", type=positive_int,
                   help="rotate dump files at this size (default %d, for compaction)"
                        % facts.COMPACT_ROTATE_MB)
    add_timeout(a)


def cmd_attach(args):
    return attach.attach(args.pid, args.dir, args.depth, args.rotate_mb, args.timeout)


def add_detach(sub):
    t = command(sub, "detach", cmd_detach, "stop tracing a process, which goes on at full "
                "speed",
                "Stop tracing process PID: its allocation calls no longer pass through mmleak "
                "(its speed is back to untraced) and its dump files are flushed and closed.  "
                "The trace then holds the window from attach to detach: `report` shows the "
                "blocks allocated in it and still alive at its end, with their age.  `attach` "
                "later starts a new trace.")
    t.add_argument("pid", type=positive_int, help="the process")
    add_timeout(t)


def cmd_detach(args):
    return attach.detach(args.pid, args.timeout)


def add_scan(sub):
    c = command(sub, "scan", cmd_scan, "tell leaks from memory still in use, in a running "
                "traced process, now",
                "Classify every block alive now in the traced (or attached) process PID with "
                "valgrind memcheck's kinds: definitely, indirectly or possibly lost, or still "
                "reachable (see mmleak-scan(7)).  The process is stopped only while its "
                "threads' registers, the trace's cut and a copy of it (a fork never run) are "
                "taken; the scan reads the copy (where no copy can be made, the process stays "
                "stopped for the whole scan).  The result, mmleak.ID.scan.S, is written next to the trace; `report` "
                "uses the newest.  Needs ptrace permission (root, or the same user where "
                "kernel.yama.ptrace_scope allows it).",
                "example:\n  %(prog)s 4242\n\n" + EXIT_HELP)
    c.add_argument("pid", type=positive_int, help="the process")
    c.add_argument("-q", "--quiet", action="store_true", help="no summary on stdout")


def cmd_scan(args):
    from . import scan
    # a zombie's maps are empty: it would be "does not have mmleak.so loaded"
    attach.process_alive(args.pid, ": nothing to scan")
    state = attach.traced_state(args.pid, raw=True)
    if state is None:
        raise Fail("process %d does not have mmleak.so loaded (see mmleak.py status)"
                   % args.pid)
    m = re.match(r"tracing (\S+) (.+)$", state)
    if not m:
        raise Fail("process %d is not tracing (mmleak.so says: %s)" % (args.pid, state))
    tid, directory = m.group(1), m.group(2)
    fd = scan.trace_dir(args.pid, tid, directory)
    held = "/proc/self/fd/%d" % fd
    try:
        rc, path, msg = scan.scan_process(args.pid, held, tid)
    finally:
        os.close(fd)
    path, msg = (t.replace(held, directory) for t in (path, msg))
    if rc:
        raise Fail("cannot scan process %d: %s (%s says so)" % (args.pid, msg, path))
    if not args.quiet:
        k = scan.Kinds(scan.read_scan(path))
        sys.stdout.write("%s\n" % errors.printable(path))
        for line in scan.summary_lines(k):
            sys.stdout.write(line + "\n")
    return EXIT_OK


def add_status(sub):
    command(sub, "status", cmd_status, "which processes have mmleak.so loaded, and what it "
            "does in them",
            "List every process with mmleak.so loaded and its state, read from its memory "
            "without stopping it: tracing (trace id and directory), paused, or dormant.")


def cmd_status(args):
    return attach.status()


# ---------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------

def add_options(sub):
    command(sub, "options", cmd_options, "the environment variables mmleak reads",
            "Print the table of the environment variables mmleak.so and the tools read: "
            "name, default, meaning, and who reads it (mmleak.so reads its own once at "
            "start, with secure_getenv; attach passes the same names to it).  An invalid "
            "value is ignored with a message.")


def cmd_options(args):
    facts.print_options(sys.stdout)
    return EXIT_OK


COMMANDS = (add_shrink, add_symbolize, add_run, add_recover, add_report, add_compact,
            add_snapshot, add_attach, add_detach, add_scan, add_status, add_options)
# a file refused (or ignored) in the dump directory makes these exit with status 2
READERS = (cmd_shrink, cmd_report, cmd_compact, cmd_snapshot, cmd_recover)


def build_parser():
    p = errors.Parser(
        prog=layout.command_name(PROG), description="Shrink, symbolize and report mmleak dump files "
                               "(mmleak.PID.N.out).",
        epilog="typical use:\n"
               "  %(prog)s run -d /var/tmp/leaks -- ./myprog args   # trace a program\n"
               "  %(prog)s report /var/tmp/leaks --pid PID          # what it leaked, where\n"
               "  %(prog)s shrink --final mmleak.PID.*.out > mmleak.PID.txt  # raw survivors\n\n"
               + EXIT_HELP)
    p.add_argument("--version", action="version", version="%(prog)s " + facts.VERSION)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    for add in COMMANDS:
        add(sub)
    return p


def main(argv=None):
    errors.set_tool(PROG)               # (mmleak when run as the installed command)
    args = build_parser().parse_args(argv)
    errors.REFUSALS.clear()             # (main may run more than once in one process)

    def body():
        rc = args.func(args)
        # a file refused (or ignored) in the dump directory: an input that could not be used;
        # not for a service's companion (compact --forever): it said so once and went on,
        # and a status 2 would show it failed (and restart it) for what it handled
        if errors.REFUSALS and args.func in READERS and rc in (EXIT_OK, EXIT_PARTIAL) and \
                not getattr(args, "forever", False):
            rc = EXIT_INPUT
        return rc
    return errors.run_main(body)

