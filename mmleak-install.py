#!/usr/bin/python3
"""mmleak-install.py: run a systemd service under the mmleak leak tracer, and undo it.

It writes one drop-in, /etc/systemd/system/UNIT.d/mmleak.conf, that sets LD_PRELOAD,
MMLEAK_DIR, MMLEAK_ROTATE_MB (and MMLEAK_DEPTH) for the service and Wants= its companion,
/etc/systemd/system/mmleak-compact-UNIT.service, which runs `mmleak.py compact --follow
--forever DIR` as the service's user while the service runs; it never starts, stops or
restarts a service itself.  The command line; the logic is mmleaklib/systemd.py (plan, then
apply).  Python 3 standard library only.
"""
from mmleaklib import interrupt

if __name__ == "__main__":
    interrupt.guard("mmleak-install.py", labelled=True)    # (first: see interrupt.py)

import argparse  # noqa: E402
import collections
import os
import re
import shlex
import subprocess
import sys

from mmleaklib import attach, errors, facts, layout
from mmleaklib.errors import EXIT_INPUT, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, Fail, warn
from mmleaklib.files import fsync_dir
from mmleaklib.systemd import (COMPANION_DIR, DEFAULT_DIR, DROPIN_NAME, ENV_KEYS, LOCAL_LIB_DEST,
                               PROG, LOCAL_PY_DEST, UNIT_PATH, apply, check_text_arg,
                               companion_name, describe, describe_cred, describe_st,
                               dropin_path, expand_specifiers, may, parse_bool,
                               parse_env_assignments, parse_unit_text, plan, read_ours,
                               reload_step, resolve_owner, setup, split_words, unreachable)

EXIT_HELP = errors.exit_help(PROG)


# ---------------------------------------------------------------------------------------------
# install

def cmd_install(args):
    for opt, value in (("--dir", args.dir), ("--lib", args.lib)):
        if value is not None:
            check_text_arg(opt, value)
    root, unit = setup(args)
    p = plan(args, root, unit)
    for n in p.notes:
        warn(n, "note")
    for w in p.warnings:
        warn(w)
    out = sys.stdout
    if args.dry_run:
        out.write("dry run: nothing changed%s.\n" % (
            " (root %s)" % root.top if args.root is not None else ""))
        for what, path, body in (("drop-in", p.dpath, p.text), ("companion", p.cpath, p.ctext)):
            out.write("%s %s:\n" % (what, path))
            for line in body.splitlines():
                out.write(("    " + line).rstrip(" ") + "\n")
        out.write("actions:\n")
        for step in p.steps:
            out.write("  " + describe(step) + "\n")
        out.write("  %s\n" % reload_step(args, root, []))
        return EXIT_OK
    if args.root is not None:
        out.write("root: %s\n" % root.top)
    apply(p, root, out)
    done = []
    reload_line = reload_step(args, root, done)
    for d in done:
        out.write(d + "\n")
    out.write("LD_PRELOAD=%s\nMMLEAK_DIR=%s\nMMLEAK_ROTATE_MB=%d\n" % (p.lib_value, p.ddir,
                                                                       p.rotate))
    if args.paused:
        out.write("MMLEAK_PAUSED=1\n")
    out.write("compactor: %s, as %s, starts and stops with %s\n"
              % (p.cname, describe_cred(p.cred), unit.name))
    out.write("next steps:\n")
    if reload_line:
        out.write("  %s\n" % reload_line)
    q = shlex.quote
    main = "$(systemctl show -p MainPID --value %s)" % q(unit.name)
    if args.paused:
        out.write("  systemctl restart %s     # starts %s too; the service starts paused\n"
                  % (q(unit.name), q(p.cname)))
        out.write("  %s status %s\n" % (PROG, q(unit.name)))
        out.write("  mmleak.py attach %s -d %s     # traces from now on\n" % (main, q(p.ddir)))
        out.write("  mmleak.py detach %s     # paused again; it prints the report command\n"
                  % main)
    else:
        out.write("  systemctl restart %s     # starts %s too\n" % (q(unit.name), q(p.cname)))
        out.write("  %s status %s\n" % (PROG, q(unit.name)))
        out.write("  mmleak.py report %s --pid %s\n" % (q(p.ddir), main))
    out.write("  %s uninstall %s     # when done\n" % (PROG, q(unit.name)))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# status

def dropin_values(text, unit):
    """(environment, ReadWritePaths) of our drop-in, as systemd reads them."""
    env = collections.OrderedDict()
    rwp = []
    for sec, key, val in parse_unit_text(text):
        if sec == "Service" and key == "Environment":
            for k, v in parse_env_assignments(val):
                env[k] = expand_specifiers(v, unit.name, unit.instance)
        elif sec == "Service" and key == "ReadWritePaths":
            try:
                rwp.extend(expand_specifiers(w, unit.name, unit.instance)
                           for w in split_words(val, cunescape=False))
            except ValueError:
                pass
    return env, rwp


def check_writable(root, unit, ddir):
    """Warn when the unit's user cannot create files in DDIR (status)."""
    s = unit.evaluate(skip_ours=False)
    if parse_bool(s["DynamicUser"] or "no"):
        return
    try:
        who = resolve_owner(root, unit, s)
    except Fail as e:
        warn(str(e))
        return
    real = root.resolve(ddir)
    blocked = unreachable(root, real, who)
    if blocked:
        warn("User=%s cannot reach %s: %s is %s: the service is not traced; run install again"
             % (who.user, ddir, blocked[0], describe_st(root, blocked[1])))
        return
    try:
        st = os.stat(root.host(ddir))
    except OSError:
        return
    if not may(st, who, 0o3):
        warn("User=%s cannot write %s (%s): the service is not traced; run install again"
             % (who.user, ddir, describe_st(root, st)))


def systemd_running(root):
    return root.top == "/" and os.path.isdir("/run/systemd/system")


def unit_state(root, name):
    """systemctl is-active NAME when systemd runs here (not with --root), else None."""
    if not systemd_running(root):
        return None
    try:
        r = subprocess.run(["systemctl", "is-active", name], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True)
    except OSError:
        return None
    return r.stdout.strip() or None


# Where systemd's cgroup tree is: cgroup v2 alone, the v2 tree of a hybrid system, v1.
CGROUP_BASES = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd")
PIDS_SHOWN = 12         # per line of status, for the processes other than the main one
STATUS_NAMES = 200      # files of the dump directory listed by status (the service's to make)


def unit_processes(name):
    """(ActiveState, MainPID or 0, the pids of the unit's cgroup and below, sorted) from
    systemd; None if systemctl cannot say."""
    try:
        r = subprocess.run(["systemctl", "show", "-p", "ActiveState", "-p", "MainPID", "-p",
                            "ControlGroup", name], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True)
    except OSError:
        return None
    if r.returncode != 0:
        return None
    props = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    try:
        main = int(props.get("MainPID") or 0)
    except ValueError:
        main = 0
    pids = {main} if main else set()
    cg = props.get("ControlGroup") or ""
    for base in CGROUP_BASES if cg.startswith("/") else ():
        top = base + cg.rstrip("/")
        if not os.path.isfile(top + "/cgroup.procs"):
            continue
        for d, _, _ in os.walk(top):
            try:
                with open(d + "/cgroup.procs") as f:
                    pids.update(int(x) for x in f.read().split())
            except (OSError, ValueError):
                pass
        break
    return props.get("ActiveState") or "unknown", main, sorted(pids)


def process_state(pid):
    """What mmleak says of process PID (attach.traced_state), as status shows it; None if
    the process is gone."""
    try:
        state = attach.traced_state(pid)
    except Fail as e:
        if not os.path.exists("/proc/%d" % pid):
            return None
        return "unknown: %s" % e
    except OSError as e:
        if not os.path.exists("/proc/%d" % pid):
            return None
        return "unknown: %s%s" % (e.filename + ": " if e.filename else "", e.strerror or e)
    except Exception as e:  # noqa: BLE001 - one process's state never stops status
        return "unknown: %s: %s (a bug in mmleak.py: please report it)" % (type(e).__name__, e)
    return "not traced (mmleak.so not loaded)" if state is None else state


def write_processes(out, root, unit):
    """The 'process:' lines of status: the unit's processes and mmleak's state in each."""
    label = "%-16s" % "processes:"
    if root.top != "/":
        out.write(label + "unknown (--root: a system tree, not the running system)\n")
        return
    if not systemd_running(root):
        out.write(label + "unknown (systemd is not running here)\n")
        return
    got = unit_processes(unit.name)
    if got is None:
        out.write(label + "unknown (systemctl show %s failed)\n" % unit.name)
        return
    active, main, pids = got
    states, seen = collections.OrderedDict(), False
    for pid in pids:
        st = process_state(pid)
        if st is None:
            continue            # gone since systemd and the cgroup named it
        seen = True
        if pid == main:
            out.write("%-16s%d (main): %s\n" % ("process:", pid, st))
        else:
            states.setdefault(st, []).append(pid)
    if not seen:
        out.write(label + "none (%s is %s)\n" % (unit.name, active))
    for st, group in states.items():
        shown = " ".join(str(p) for p in group[:PIDS_SHOWN])
        if len(group) > PIDS_SHOWN:
            shown += " and %d more" % (len(group) - PIDS_SHOWN)
        out.write("%-16s%s: %s\n" % ("process:", shown, st))


def cmd_status(args):
    root, unit = setup(args)
    dpath = dropin_path(unit)
    text, ours, _ = read_ours(root, dpath)
    if unit.path is None and text is None:
        raise Fail("unknown unit %s: no unit file in %s" % (
            unit.name, ", ".join(UNIT_PATH)), EXIT_USAGE)
    out = sys.stdout
    if args.root is not None:
        out.write("root:           %s\n" % root.top)
    out.write("unit:           %s (%s)\n" % (unit.name, unit.path or "unit file not found"))
    write_processes(out, root, unit)
    if text is None:
        out.write("drop-in:        %s: absent\n" % dpath)
        out.write("not installed\n")
        return EXIT_PARTIAL
    out.write("drop-in:        %s: present%s\n" % (
        dpath, "" if ours else " (not written by %s)" % PROG))
    env, rwp = dropin_values(text, unit)
    eff = unit.evaluate(skip_ours=False)["env"]
    for k in ENV_KEYS:
        v = env.get(k)
        if k == "MMLEAK_PAUSED":
            if v is not None:
                out.write("MMLEAK_PAUSED:  %s%s\n" % (v, " (the service starts paused: "
                                                        "mmleak.py attach MAINPID traces it)"
                                                        if v == "1" else ""))
                if eff.get(k) != v:
                    warn("%s is overridden by a later drop-in: the service gets %s=%s"
                         % (k, k, eff.get(k, "")))
            continue
        shown = v if v is not None else ("(not set: default %s)" % {
            "MMLEAK_DIR": "/tmp", "MMLEAK_DEPTH": "64", "MMLEAK_ROTATE_MB": "256"}[k]
            if k != "LD_PRELOAD" else "(not set)")
        out.write("%-16s%s\n" % (k + ":", shown) if len(k) < 15 else "%s: %s\n" % (k, shown))
        if v is not None and eff.get(k) != v:
            warn("%s is overridden by a later drop-in: the service gets %s=%s"
                 % (k, k, eff.get(k, "")))
    if rwp:
        out.write("%-16s%s\n" % ("ReadWritePaths:", " ".join(rwp)))
    libs = [e for e in re.split(r"[ \t\n\r:]+", env.get("LD_PRELOAD", "")) if e]
    lib = next((e for e in libs if os.path.basename(e) == "mmleak.so"), LOCAL_LIB_DEST)
    lh = root.host(lib)
    if os.path.isfile(lh):
        out.write("library:        %s: present, %d bytes\n" % (lib, os.path.getsize(lh)))
    else:
        out.write("library:        %s: MISSING (the service will start without it)\n" % lib)
    cname = companion_name(unit)
    cpath = COMPANION_DIR + "/" + cname
    ctext, cours, _ = read_ours(root, cpath)
    if ctext is None:
        out.write("companion:      %s: absent (the dump files are not compacted; run install "
                  "again)\n" % cpath)
    else:
        state = unit_state(root, cname)
        out.write("companion:      %s: present%s%s\n" % (
            cpath, "" if cours else " (not written by %s)" % PROG,
            ", " + state if state else ""))
    ddir = env.get("MMLEAK_DIR", "/tmp")
    dh = root.host(ddir)
    try:
        st = os.stat(dh)
        names = sorted(n for n in os.listdir(dh)
                       if n.startswith("mmleak.") and n.endswith((".out", ".maps", ".compact")))
    except OSError as e:
        out.write("dump dir:       %s: %s\n" % (ddir, e.strerror))
        return EXIT_OK
    ndump = sum(1 for n in names if not n.endswith(".compact"))
    ncomp = len(names) - ndump
    out.write("dump dir:       %s: %s, %d dump file%s, %d compacted trace%s\n" % (
        ddir, describe_st(root, st), ndump, "" if ndump == 1 else "s", ncomp,
        "" if ncomp == 1 else "s"))
    total = 0
    for i, n in enumerate(names):
        try:
            size = os.lstat(os.path.join(dh, n)).st_size
        except OSError:
            continue
        total += size
        # the service names them: printed as the reports print names (an escape, a newline)
        if i < STATUS_NAMES:
            out.write("  %12d  %s\n" % (size, errors.printable(n)))
    if len(names) > STATUS_NAMES:
        out.write("  and %d more files\n" % (len(names) - STATUS_NAMES))
    if names:
        out.write("  %12d  total\n" % total)
    out.flush()
    check_writable(root, unit, ddir)
    return EXIT_OK



# ---------------------------------------------------------------------------------------------
# uninstall

def cmd_uninstall(args):
    root, unit = setup(args)
    dpath = dropin_path(unit)
    text, ours, created = read_ours(root, dpath)
    cname = companion_name(unit)
    cpath = COMPANION_DIR + "/" + cname
    ctext, cours, _ = read_ours(root, cpath)
    out = sys.stdout
    if text is None and not (ctext is not None and cours):
        out.write("not installed: %s does not exist; nothing to do\n" % dpath)
        return EXIT_OK
    if text is not None and not ours:
        raise Fail("%s was not written by %s; not removing it" % (dpath, PROG), EXIT_USAGE)
    env, _ = dropin_values(text or "", unit)
    ddir = env.get("MMLEAK_DIR", DEFAULT_DIR + "/" + unit.name)
    dd_host = root.host(os.path.dirname(dpath))
    steps = []          # (description, function)
    if text is not None:
        steps.append(("remove %s" % dpath, lambda: os.unlink(dd_host + "/" + DROPIN_NAME)))
        if created and os.listdir(dd_host) == [DROPIN_NAME]:
            steps.append(("remove directory %s (created by install, now empty)"
                          % os.path.dirname(dpath), lambda: os.rmdir(dd_host)))
    if ctext is not None and not cours:
        warn("%s was not written by %s; not removing it" % (cpath, PROG))
    elif ctext is not None:
        ch = root.host(COMPANION_DIR, last=True) + "/" + cname
        steps.append(("remove %s" % cpath, lambda: os.unlink(ch)))
    if args.dry_run:
        out.write("dry run: nothing changed%s.\nactions:\n" % (
            " (root %s)" % root.top if args.root is not None else ""))
        for desc, _ in steps:
            out.write("  " + desc + "\n")
        out.write("  %s\n" % reload_step(args, root, []))
        return EXIT_OK
    if args.root is not None:
        out.write("root: %s\n" % root.top)
    for desc, fn in steps:
        try:
            fn()
        except OSError as e:
            raise Fail("%s: %s" % (e.filename or desc, e.strerror), EXIT_INPUT)
        out.write(desc + "\n")
    fsync_dir(dd_host)
    fsync_dir(root.host(COMPANION_DIR))
    done = []
    reload_line = reload_step(args, root, done)
    for d in done:
        out.write(d + "\n")
    libs = [e for e in re.split(r"[ \t\n\r:]+", env.get("LD_PRELOAD", "")) if e]
    lib = next((e for e in libs if os.path.basename(e) == "mmleak.so"), LOCAL_LIB_DEST)
    if lib == LOCAL_LIB_DEST:
        out.write("kept: library %s, %s and dump directory %s (delete them by hand when no "
                  "longer needed: rm -r %s)\n" % (LOCAL_LIB_DEST, LOCAL_PY_DEST, ddir, shlex.quote(ddir)))
    else:               # the installed copy's own library (use_destinations): its package's
        out.write("kept: dump directory %s (delete it by hand when no longer needed: rm -r "
                  "%s); the library %s is the installed mmleak's\n"
                  % (ddir, shlex.quote(ddir), lib))
    out.write("next steps:\n")
    if reload_line:
        out.write("  %s\n" % reload_line)
    q = shlex.quote
    out.write("  systemctl restart %s     # the running process is traced until then\n"
              % q(unit.name))
    if ctext is not None and cours:
        out.write("  systemctl stop %s     # after the restart: its last pass folds the old "
                  "process's dump files\n" % q(cname))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Command line

def add_globals(parser, default):
    """--root, --dry-run, --no-reload: on the tool (DEFAULT None) and on each command."""
    kw = {} if default is None else {"default": argparse.SUPPRESS}
    parser.add_argument("--root", metavar="DIR", **kw,
                        help="operate on the system tree under DIR (tests, image building): "
                             "every path, unit search and /etc/passwd lookup is under it; "
                             "no daemon-reload")
    for opt, help in (("--dry-run", "print the drop-in, the companion unit and the list of "
                                    "actions; change nothing"),
                      ("--no-reload", "do not run systemctl daemon-reload (print a reminder "
                                      "instead)")):
        parser.add_argument(opt, action="store_true", help=help,
                            **(kw or {"default": False}))


def command(sub, name, func, help, description):
    p = sub.add_parser(name, help=help, epilog=EXIT_HELP, description=description)
    add_globals(p, "suppress")
    p.add_argument("unit", metavar="UNIT", help="service unit name" + (
        ", e.g. nfs-ganesha.service or getty@tty1.service" if name == "install" else ""))
    p.set_defaults(func=func)
    return p


def add_install(sub):
    pi = command(sub, "install", cmd_install, "trace a service", (
        "Make UNIT run under mmleak at its next (re)start.\n\n"
        "Files touched (under --root DIR if given):\n"
        "  /usr/local/lib/mmleak/mmleak.so   the library, copied there atomically (mode 0644)\n"
        "                                    unless it already is that file, with the\n"
        "                                    mmleak-tools.so beside it (the compactor's\n"
        "                                    compiled shrinker) and mmleak-scan (mode\n"
        "                                    0755: the scan at the service's exit)\n"
        "  /usr/local/lib/mmleak/mmleak.py   the mmleak.py next to this tool, and its package\n"
        "                                    beside it (mmleaklib/), likewise: what the\n"
        "                                    companion runs\n"
        "  (an installed mmleak, such as the Debian package, whose own library is the one to\n"
        "  install, copies neither: the units name its files in place)\n"
        "  DIR (default /var/lib/mmleak/UNIT, in a root-owned /var/lib/mmleak, mode 0755)\n"
        "                                    dump directory, created mode 0700 and owned by the\n"
        "                                    unit's User=/Group= if missing; an existing one\n"
        "                                    that user cannot write is given to it only if it\n"
        "                                    holds nothing but mmleak.* files (and is not\n"
        "                                    another user's); system directories are refused\n"
        "  /etc/systemd/system/UNIT.d/mmleak.conf\n"
        "                                    the drop-in, written atomically: Environment=\n"
        "                                    LD_PRELOAD (mmleak.so first, then the unit's own\n"
        "                                    LD_PRELOAD, such as an allocator, which mmleak\n"
        "                                    then traces), MMLEAK_DIR, MMLEAK_ROTATE_MB (8, or\n"
        "                                    --rotate-mb), MMLEAK_DEPTH (with --depth),\n"
        "                                    MMLEAK_PAUSED=1 (with --paused),\n"
        "                                    ReadWritePaths=DIR when the unit's sandboxing\n"
        "                                    (ProtectSystem=strict/full, ProtectHome=,\n"
        "                                    DynamicUser=) would make DIR read-only, and\n"
        "                                    [Unit] Wants= the companion\n"
        "  /etc/systemd/system/mmleak-compact-NAME.service  (NAME: UNIT without .service)\n"
        "                                    the companion, written atomically: runs\n"
        "                                    /usr/bin/python3 /usr/local/lib/mmleak/mmleak.py\n"
        "                                    compact --follow --forever DIR as the unit's\n"
        "                                    User=/Group= (the same dynamic user for\n"
        "                                    DynamicUser=yes), sandboxed (ProtectSystem=strict,\n"
        "                                    ReadWritePaths=DIR, no network, no capabilities);\n"
        "                                    BindsTo= UNIT: it starts and stops with UNIT,\n"
        "                                    with a last pass once UNIT's processes ended\n"
        "Then runs systemctl daemon-reload if systemd is running (not with --root or\n"
        "--no-reload), and prints the commands to type next. Running it again is harmless.\n"
        "Warnings (stderr, install proceeds): setuid/setgid or static ExecStart binary, a #!\n"
        "script or 'env -i' wrapper, a later drop-in, EnvironmentFile= or UnsetEnvironment=\n"
        "overriding LD_PRELOAD, DynamicUser=yes, no /usr/bin/python3. Errors: see the exit\n"
        "codes."))
    pi.add_argument("--dir", metavar="DIR",
                    help="dump directory, MMLEAK_DIR (default %s/UNIT, one per unit, owned by "
                         "its User=; not in a private /tmp (PrivateTmp=) nor in the unit's "
                         "RuntimeDirectory=: systemd deletes both when it stops; one the User= "
                         "cannot write is refused unless the tool made it; no link of another "
                         "user's on the way)" % DEFAULT_DIR)
    depth = facts.OPTION["MMLEAK_DEPTH"]
    pi.add_argument("--depth", type=facts.option_type("MMLEAK_DEPTH"), metavar="N",
                    help="frames recorded per allocation, 1 to %d, MMLEAK_DEPTH (default: the "
                         "library's, %d: the whole stack)" % (depth.max, depth.max))
    rotate = facts.OPTION["MMLEAK_ROTATE_MB"]
    pi.add_argument("--rotate-mb", type=facts.option_type("MMLEAK_ROTATE_MB"), metavar="N",
                    help="MMLEAK_ROTATE_MB: a thread of the service starts a new dump file past "
                         "N MB, and the compactor folds and deletes the complete one (default "
                         "%d, so that it keeps up; mmleak.so's own default is %d)"
                         % (facts.COMPACT_ROTATE_MB, rotate.default))
    pi.add_argument("--paused", action="store_true",
                    help="start the service paused (MMLEAK_PAUSED=1): mmleak.so is loaded but "
                         "traces nothing, at no cost, until `mmleak.py attach MAINPID -d DIR`; "
                         "`mmleak.py detach MAINPID` pauses it again")
    pi.add_argument("--lib", metavar="PATH",
                    help="mmleak.so to install (default: mmleak.find_library(): $MMLEAK_LIB, "
                         "the build tree, the installed copy)")


def add_status(sub):
    command(sub, "status", cmd_status, "show whether a service is traced", (
        "Show which processes of UNIT run now and what mmleak does in each: its main\n"
        "process and the others of its cgroup, \"tracing ID DIR\", \"paused\", \"dormant\" or\n"
        "\"not traced\", read from their memory as `mmleak.py status` does (only when\n"
        "systemd runs here, not with --root). Then whether the drop-in\n"
        "/etc/systemd/system/UNIT.d/mmleak.conf is present, its LD_PRELOAD, MMLEAK_DIR,\n"
        "MMLEAK_DEPTH, MMLEAK_ROTATE_MB, MMLEAK_PAUSED and ReadWritePaths=, whether the\n"
        "library exists, whether the companion mmleak-compact-NAME.service exists and\n"
        "(when systemd runs here) whether it is active, and the dump directory with its\n"
        "mmleak.*.out and mmleak.*.maps files and compacted traces (mmleak.*.compact) and\n"
        "their sizes. Changes nothing; any user may run it (the state of another user's\n"
        "process then shows as unknown).\n"
        "Exit 0 if installed, 3 if not installed."))


def add_uninstall(sub):
    command(sub, "uninstall", cmd_uninstall, "stop tracing a service", (
        "Remove what install added: /etc/systemd/system/UNIT.d/mmleak.conf, the UNIT.d\n"
        "directory if install created it (recorded in the drop-in) and it is now empty, and\n"
        "the companion /etc/systemd/system/mmleak-compact-NAME.service. Keeps\n"
        "/usr/local/lib/mmleak/mmleak.so, mmleak.py and the dump directory (it prints where\n"
        "they are). Then daemon-reload as for install; restart the service to stop tracing,\n"
        "then stop the companion (its last pass folds the old process's dumps): it prints\n"
        "both commands and runs neither.\n"
        "Not installed: prints a message and exits 0. A mmleak.conf not written by\n"
        "mmleak-install.py is left alone (exit 1)."))


def build_parser():
    p = errors.Parser(prog=layout.command_name(PROG), one_line=True, wrap=0, description=(
        "Make a systemd service run under the mmleak malloc leak tracer (LD_PRELOAD), show\n"
        "the state, and undo it. It writes a drop-in, /etc/systemd/system/UNIT.d/mmleak.conf,\n"
        "and a companion unit, /etc/systemd/system/mmleak-compact-NAME.service, that compacts\n"
        "the dumps while the service runs; it never starts, stops or restarts a service.\n\n"
        "  %s install nfs-ganesha.service [--dir DIR] [--depth N]\n"
        "  systemctl restart nfs-ganesha\n"
        "  %s status nfs-ganesha.service\n"
        "  mmleak.py report /var/lib/mmleak/nfs-ganesha.service --pid $(systemctl show -p "
        "MainPID --value nfs-ganesha)\n"
        "  %s uninstall nfs-ganesha.service" % (PROG, PROG, PROG)), epilog=EXIT_HELP)
    add_globals(p, None)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    for add in (add_install, add_status, add_uninstall):
        add(sub)
    return p


def main(argv=None):
    errors.set_tool(PROG, labelled=True)

    def body():
        args = build_parser().parse_args(argv)
        return args.func(args)
    return errors.run_main(body, internal=True)


if __name__ == "__main__":
    interrupt.exit(main())
