#!/usr/bin/python3
"""mmleak-install.py: run a systemd service under the mmleak leak tracer, and undo it.

It writes one drop-in, /etc/systemd/system/UNIT.d/mmleak.conf, that sets LD_PRELOAD and
MMLEAK_DIR (and MMLEAK_DEPTH) for the service; it never restarts the service itself.
Python 3 standard library only.
"""
import argparse
import collections
import errno
import grp
import importlib.util
import os
import pwd
import re
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

PROG = "mmleak-install.py"
DROPIN_NAME = "mmleak.conf"
LIB_DEST = "/usr/local/lib/mmleak/mmleak.so"
DEFAULT_DIR = "/var/lib/mmleak"
MARKER = "# Written by mmleak-install.py"
STATE_KEY = "# mmleak-install: dropin-dir-created="
UNIT_PATH = ["/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
             "/usr/lib/systemd/system", "/lib/systemd/system"]
EXEC_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
UNIT_TYPES = ("service", "socket", "device", "mount", "automount", "swap", "target", "path",
              "timer", "slice", "scope")
NAME_RE = re.compile(r"^[A-Za-z0-9:_.\\@-]+$")

# Exit codes (also in the --help epilog).
EXIT_OK, EXIT_INPUT, EXIT_ENV, EXIT_NOT_INSTALLED, EXIT_INTERNAL = 0, 1, 2, 3, 4

EXIT_HELP = """\
exit codes:
  0  success (status: the drop-in is installed; uninstall: removed, or was not installed)
  1  usage or input error: bad option, malformed or unknown unit name, masked unit, a dump
     directory the unit cannot keep (under /tmp with PrivateTmp=yes), a mmleak.conf that
     mmleak-install.py did not write
  2  environment error: not root (without --root or --dry-run), --root unreadable, mmleak.so
     not found, User=/Group= not resolvable, a file operation or daemon-reload failed
  3  status only: not installed (no drop-in)
  4  internal error (a bug: please report it)
Errors are one line on stderr, "mmleak-install.py: error: ...". Warnings are one line each on
stderr, "mmleak-install.py: warning: ..."; they never stop install."""


class Fail(Exception):
    def __init__(self, code, msg):
        Exception.__init__(self, msg)
        self.code = code
        self.msg = msg


def warn(msg, kind="warning"):
    sys.stderr.write("%s: %s: %s\n" % (PROG, kind, msg))


def parse_bool(v):
    v = v.strip().lower()
    if v in ("1", "yes", "y", "true", "t", "on"):
        return True
    if v in ("0", "no", "n", "false", "f", "off"):
        return False
    return None


def under(path, top):
    """True if PATH is TOP or below it (both absolute, normalised)."""
    top = top.rstrip("/") or "/"
    return path == top or path.startswith(top + "/") or top == "/"


# ---------------------------------------------------------------------------------------------
# Unit names and specifiers

def check_unit_name(name):
    """Validate NAME; return (name, template-or-None, instance-or-None)."""
    if "/" in name:
        raise Fail(EXIT_INPUT, "invalid unit name %r: it must not contain '/'; give the unit's "
                               "name (like nfs-ganesha.service), not a path" % name)
    if ".." in name:
        raise Fail(EXIT_INPUT, "invalid unit name %r: it must not contain '..'" % name)
    if len(name) > 255 or not NAME_RE.match(name):
        raise Fail(EXIT_INPUT, "invalid unit name %r: only letters, digits and ':_.\\@-' are "
                               "allowed" % name)
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix not in UNIT_TYPES:
        raise Fail(EXIT_INPUT, "invalid unit name %r: it needs a unit type suffix such as "
                               ".service (did you mean %s.service?)" % (name, name))
    if suffix != "service":
        raise Fail(EXIT_INPUT, "%r is not a service: only .service units run a daemon that "
                               "mmleak can trace" % name)
    if not stem or stem.startswith("@") or stem.count("@") > 1:
        raise Fail(EXIT_INPUT, "invalid unit name %r" % name)
    if "@" in stem:
        prefix, instance = stem.split("@")
        if not instance:
            raise Fail(EXIT_INPUT, "%r is a template; name an instance such as %s@NAME.service"
                       % (name, prefix))
        return name, prefix + "@.service", instance
    return name, None, None


def unescape_name(s):
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), s).replace("-", "/")


def expand_specifiers(s, unit, instance):
    """Expand the few unit specifiers that matter here; leave the others alone."""
    prefix = unit.rsplit(".", 1)[0].split("@")[0]
    table = {"n": unit, "N": unit.rsplit(".", 1)[0], "p": prefix, "P": unescape_name(prefix),
             "i": instance or "", "I": unescape_name(instance or ""), "%": "%"}
    return re.sub(r"%(.)", lambda m: table.get(m.group(1), m.group(0)), s)


def quote_value(s):
    """Quote S for a unit file value list (Environment=, ReadWritePaths=)."""
    s = s.replace("%", "%%")
    if re.search(r'[\s"\'\\]', s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


# ---------------------------------------------------------------------------------------------
# The (alternative) root

class Root:
    def __init__(self, top):
        self.top = os.path.abspath(top) if top else "/"

    def resolve(self, path, last=True):
        """Resolve PATH (absolute, inside the root) following symlinks inside the root.

        Return the logical path (as seen from inside the root). If LAST is false the final
        component is not followed."""
        if self.top == "/" and last:
            return os.path.realpath(path)
        parts = [p for p in path.split("/") if p not in ("", ".")]
        cur, hops = [], 0
        while parts:
            c = parts.pop(0)
            if c == "..":
                if cur:
                    cur.pop()
                continue
            host = os.path.join(self.top, *(cur + [c]))
            if (parts or last) and os.path.islink(host):
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                t = os.readlink(host)
                if t.startswith("/"):
                    cur = []
                parts = [p for p in t.split("/") if p not in ("", ".")] + parts
            else:
                cur.append(c)
        return "/" + "/".join(cur)

    def host(self, path, last=True):
        """Host path of the in-root PATH."""
        logical = self.resolve(path, last)
        if self.top == "/":
            return logical
        return os.path.join(self.top, logical.lstrip("/"))

    def show(self, path):
        return path


# ---------------------------------------------------------------------------------------------
# Unit files

def parse_unit_text(text):
    """Yield (section, key, value) like systemd's parser (comments, continuation lines)."""
    section, pending = None, None
    for raw in text.splitlines():
        line = raw.strip()
        if pending is not None:
            if line.startswith(("#", ";")):
                continue
            line = pending + " " + line
            pending = None
        elif not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if "=" in line:
            key, _, val = line.partition("=")
            yield section, key.strip(), val.strip()
    if pending is not None and "=" in pending:
        key, _, val = pending.partition("=")
        yield section, key.strip(), val.strip()


def parse_env_assignments(val):
    try:
        words = shlex.split(val)
    except ValueError:
        return []
    return [w.partition("=")[::2] for w in words if "=" in w and not w.startswith("=")]


class Unit:
    """The files that make up a unit and the [Service] settings mmleak cares about."""

    SINGLE = ("User", "Group", "DynamicUser", "PrivateTmp", "ProtectSystem", "ProtectHome",
              "MemoryDenyWriteExecute", "RootDirectory", "RootImage")

    def __init__(self, root, name, template, instance):
        self.root, self.name, self.template, self.instance = root, name, template, instance
        self.path = None            # logical path of the unit file
        self.dropins = []           # logical paths, in the order systemd applies them
        for n in [name] + ([template] if template else []):
            for d in UNIT_PATH:
                p = d + "/" + n
                if os.path.lexists(root.host(p, last=False)):
                    if root.resolve(p) == "/dev/null":
                        raise Fail(EXIT_INPUT, "unit %s is masked (%s -> /dev/null)" % (name, p))
                    self.path = p
                    break
            if self.path:
                break
        seen = {}
        for n in [name] + ([template] if template else []):
            for d in UNIT_PATH:
                dd = root.host(d + "/" + n + ".d")
                if not os.path.isdir(dd):
                    continue
                for f in sorted(os.listdir(dd)):
                    if f.endswith(".conf") and f not in seen:
                        seen[f] = d + "/" + n + ".d/" + f
        self.dropins = [seen[k] for k in sorted(seen)]

    def read(self, path):
        host = self.root.host(path)
        if self.root.resolve(path) == "/dev/null":
            return ""
        with open(host, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()

    def evaluate(self, skip_ours=True):
        """Apply the unit file then its drop-ins (without mmleak.conf); return settings."""
        s = {"env": collections.OrderedDict(), "env_src": {}, "exec": [], "rwp": [],
             "statedir": [], "envfile": [], "later": []}
        for k in self.SINGLE:
            s[k] = None
        files = ([self.path] if self.path else []) + [
            d for d in self.dropins if not (skip_ours and os.path.basename(d) == DROPIN_NAME)]
        for path in files:
            later = path != self.path and os.path.basename(path) > DROPIN_NAME
            for sec, key, val in parse_unit_text(self.read(path)):
                if sec != "Service":
                    continue
                val = expand_specifiers(val, self.name, self.instance) if key != "Environment" \
                    else val
                if key == "Environment":
                    if not val:
                        s["env"].clear()
                        if later:
                            s["later"].append((path, "an empty Environment= (which resets it)"))
                        continue
                    for k, v in parse_env_assignments(expand_specifiers(val, self.name,
                                                                        self.instance)):
                        s["env"][k] = v
                        s["env_src"][k] = path
                        if later and k in ("LD_PRELOAD", "MMLEAK_DIR", "MMLEAK_DEPTH"):
                            s["later"].append((path, k))
                elif key in ("ExecStart", "ReadWritePaths", "StateDirectory", "EnvironmentFile"):
                    lst = {"ExecStart": "exec", "ReadWritePaths": "rwp",
                           "StateDirectory": "statedir", "EnvironmentFile": "envfile"}[key]
                    if not val:
                        s[lst] = []
                    elif key in ("ExecStart", "EnvironmentFile"):
                        s[lst].append(val)
                    else:
                        try:
                            s[lst].extend(shlex.split(val))
                        except ValueError:
                            pass
                elif key in self.SINGLE:
                    s[key] = val or None
        return s


# ---------------------------------------------------------------------------------------------
# ExecStart checks

def elf_has_interp(data, f):
    """Return True/False for an ELF file (PT_INTERP present), None if not parseable."""
    if len(data) < 52 or data[:4] != b"\x7fELF":
        return None
    cls, enc = data[4], data[5]
    end = "<" if enc == 1 else ">"
    try:
        if cls == 2:
            e_phoff, = struct.unpack_from(end + "Q", data, 32)
            e_phentsize, e_phnum = struct.unpack_from(end + "HH", data, 54)
        elif cls == 1:
            e_phoff, = struct.unpack_from(end + "I", data, 28)
            e_phentsize, e_phnum = struct.unpack_from(end + "HH", data, 42)
        else:
            return None
        f.seek(e_phoff)
        ph = f.read(e_phentsize * e_phnum)
        for i in range(e_phnum):
            p_type, = struct.unpack_from(end + "I", ph, i * e_phentsize)
            if p_type == 3:             # PT_INTERP
                return True
    except (struct.error, OSError, ValueError):
        return None
    return False


ENV_I_RE = re.compile(r"(?:^|[\s;&|`(])env((?:\s+-[^\s]*)*?)\s+(?:-[A-Za-z0-9]*i[A-Za-z0-9]*|"
                      r"--ignore-environment|-)(?=\s|$)", re.M)


def env_clears(args):
    """ARGS after 'env': (clears_environment, index of the command)."""
    clears, i = False, 0
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if a in ("-", "-i", "--ignore-environment") or re.match(r"^-[A-Za-z0-9]*i", a) and \
                not a.startswith("--"):
            clears = True
        elif a in ("-u", "-C", "-S", "--unset", "--chdir", "--split-string"):
            i += 1
        elif not a.startswith("-"):
            break
        i += 1
    opt_end = i
    while i < len(args) and "=" in args[i] and not args[i].startswith("/"):
        i += 1
    return clears, opt_end, i


def check_execstart(root, unit, settings, out):
    """Append warning lines (strings) about ExecStart= commands to OUT."""
    for val in settings["exec"]:
        v, flags = val, ""
        while v and v[0] in "-@:+!":
            flags, v = flags + v[0], v[1:]
        try:
            argv = shlex.split(v)
        except ValueError:
            out.append("cannot parse ExecStart=%s" % val)
            continue
        if not argv:
            continue
        path, args = argv[0], (argv[2:] if "@" in flags else argv[1:])
        seen = set()
        while path and path not in seen:
            seen.add(path)
            if not path.startswith("/"):
                for d in EXEC_PATH:
                    if os.path.isfile(root.host(d + "/" + path)):
                        path = d + "/" + path
                        break
                else:
                    out.append("cannot check ExecStart binary %s: not found in %s"
                               % (path, ":".join(EXEC_PATH)))
                    break
            host = root.host(path)
            try:
                st = os.stat(host)
                with open(host, "rb") as f:
                    head = f.read(4096)
                    interp = elf_has_interp(head, f)
            except OSError as e:
                out.append("cannot check ExecStart binary %s: %s" % (path, e.strerror))
                break
            if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                out.append("ExecStart binary %s is setuid/setgid: the dynamic loader ignores "
                           "LD_PRELOAD for it (secure-execution mode), so it will not be traced"
                           % path)
            if head.startswith(b"#!"):
                line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
                out.append("ExecStart %s is a script (#!%s): mmleak also traces the interpreter, "
                           "and the daemon is not traced if the script clears the environment"
                           % (path, line))
                if ENV_I_RE.search(head.decode("utf-8", "replace")):
                    out.append("ExecStart script %s runs 'env -i', which clears the environment: "
                               "the daemon it starts will not get LD_PRELOAD" % path)
                break
            if interp is False:
                out.append("ExecStart binary %s is statically linked (no PT_INTERP): LD_PRELOAD "
                           "has no effect on it, so it cannot be traced" % path)
            if os.path.basename(path) == "env":
                clears, opt_end, i = env_clears(args)
                if clears:
                    out.append("ExecStart runs '%s', which clears the environment: LD_PRELOAD "
                               "and MMLEAK_DIR will not reach the command it starts"
                               % " ".join([path] + [a for a in args[:opt_end] if a != "--"]))
                    break
                if i < len(args):
                    path, args = args[i], args[i + 1:]
                    continue
            break


# ---------------------------------------------------------------------------------------------
# Users and groups

def lookup(root, dbname, name):
    """Return (name, id, gid-or-None) from ROOT's passwd/group, or None."""
    if root.top == "/":
        try:
            if dbname == "passwd":
                e = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
                return e.pw_name, e.pw_uid, e.pw_gid
            e = grp.getgrgid(int(name)) if name.isdigit() else grp.getgrnam(name)
            return e.gr_name, e.gr_gid, None
        except (KeyError, OverflowError):
            return (name, int(name), None) if name.isdigit() else None
    try:
        with open(root.host("/etc/" + dbname), encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if len(fields) < 3 or not fields[2].isdigit():
                    continue
                if fields[0] == name or (name.isdigit() and fields[2] == name):
                    gid = int(fields[3]) if dbname == "passwd" and len(fields) > 3 and \
                        fields[3].isdigit() else None
                    return fields[0], int(fields[2]), gid
    except OSError:
        pass
    return (name, int(name), None) if name.isdigit() else None


def resolve_owner(root, unit, s):
    user = s["User"] or "root"
    pu = lookup(root, "passwd", user)
    where = "%s/etc/passwd" % (root.top.rstrip("/")) if root.top != "/" else "the user database"
    if pu is None:
        raise Fail(EXIT_ENV, "cannot resolve User=%s of %s in %s: create the user first, or "
                             "pass --dir and set its owner yourself" % (user, unit.name, where))
    if s["Group"]:
        pg = lookup(root, "group", s["Group"])
        if pg is None:
            gwhere = "%s/etc/group" % root.top.rstrip("/") if root.top != "/" \
                else "the group database"
            raise Fail(EXIT_ENV, "cannot resolve Group=%s of %s in %s" % (s["Group"], unit.name,
                                                                         gwhere))
        gname, gid = pg[0], pg[1]
    else:
        if pu[2] is None:
            raise Fail(EXIT_ENV, "cannot find the primary group of User=%s of %s"
                       % (user, unit.name))
        gid = pu[2]
        pg = lookup(root, "group", str(gid))
        gname = pg[0] if pg else str(gid)
    return pu[0], pu[1], gname, gid


# ---------------------------------------------------------------------------------------------
# File operations

def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(dest, data, mode):
    """Write DATA (bytes) to DEST atomically: temp file in the same dir, fsync, rename."""
    d = os.path.dirname(dest)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(dest) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.rename(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)


def atomic_copy(src, dest, mode):
    d = os.path.dirname(dest)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(dest) + ".")
    try:
        with os.fdopen(fd, "wb") as f, open(src, "rb") as s:
            shutil.copyfileobj(s, f)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.rename(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(d)


def same_content(a, b):
    try:
        if os.path.getsize(a) != os.path.getsize(b):
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x, y = fa.read(1 << 20), fb.read(1 << 20)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def missing_dirs(root, path):
    """The in-root directories (top first) that must be created to have PATH."""
    out = []
    p = path
    while p != "/" and not os.path.isdir(root.host(p)):
        out.insert(0, p)
        p = os.path.dirname(p)
    return out


# ---------------------------------------------------------------------------------------------
# Commands

def setup(args):
    name, template, instance = check_unit_name(args.unit)
    if args.root is not None:
        top = os.path.abspath(args.root)
        if not os.path.isdir(top):
            raise Fail(EXIT_ENV, "--root %s: not a directory" % args.root)
        if not os.access(top, os.R_OK | os.X_OK):
            raise Fail(EXIT_ENV, "--root %s: not readable" % args.root)
        try:
            os.listdir(top)
        except OSError as e:
            raise Fail(EXIT_ENV, "--root %s: %s" % (args.root, e.strerror))
    root = Root(args.root)
    changes = args.cmd in ("install", "uninstall") and not args.dry_run
    if changes and args.root is None and os.geteuid() != 0:
        raise Fail(EXIT_ENV, "must be run as root (it writes under /etc/systemd/system); use "
                             "sudo, or --dry-run to see what it would do")
    return root, Unit(root, name, template, instance)


def dropin_path(unit):
    return "/etc/systemd/system/%s.d/%s" % (unit.name, DROPIN_NAME)


def reload_step(args, root, actions_done):
    """Run daemon-reload when allowed; return the 'next steps' line about it, or None."""
    if args.root is not None:
        why = "--root given"
    elif args.no_reload:
        why = "--no-reload given"
    elif not os.path.isdir("/run/systemd/system"):
        why = "systemd is not running here"
    elif args.dry_run:
        return "run systemctl daemon-reload"
    else:
        try:
            r = subprocess.run(["systemctl", "daemon-reload"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, universal_newlines=True)
        except OSError as e:
            raise Fail(EXIT_ENV, "cannot run systemctl daemon-reload: %s" % e.strerror)
        if r.returncode != 0:
            raise Fail(EXIT_ENV, "systemctl daemon-reload failed (exit %d): %s; run it by hand"
                       % (r.returncode, " ".join(r.stdout.split())))
        actions_done.append("ran systemctl daemon-reload")
        return None
    if args.dry_run:
        return "no systemctl daemon-reload (%s)" % why
    return "systemctl daemon-reload     # needed: not run (%s)" % why


def import_mmleak():
    """Import the shared mmleak.py module from this script's (real) directory.

    A plain ``import mmleak`` is not enough: in a build tree mmleak.so sits next to
    mmleak.py, and Python's import system tries extension modules (*.so) before *.py, so it
    would try to load the tracer library as a C extension and fail. Load the .py by path when
    it is there, else fall back to the normal import (sys.path starts with this directory)."""
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), "mmleak.py")
    if not os.path.isfile(path):
        import mmleak
        return mmleak
    spec = importlib.util.spec_from_file_location("mmleak", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["mmleak"] = mod
    return mod


def find_lib(args, root):
    if args.lib is not None:
        if not os.path.isfile(args.lib):
            raise Fail(EXIT_ENV, "--lib %s: no such file" % args.lib)
        return os.path.realpath(args.lib)
    try:
        mmleak = import_mmleak()
    except Exception as e:  # noqa: BLE001 - any import failure is an environment error
        raise Fail(EXIT_ENV, "cannot import mmleak.py from %s: %s"
                   % (os.path.dirname(os.path.realpath(__file__)), e))
    lib = mmleak.find_library(None)
    if lib is None and os.path.isfile(root.host(LIB_DEST)):
        lib = root.host(LIB_DEST)
    if lib is None:
        raise Fail(EXIT_ENV, "mmleak.so not found ($MMLEAK_LIB, next to mmleak.py, "
                             "PREFIX/lib/mmleak, /usr/local/lib/mmleak, /usr/lib/mmleak): build "
                             "it with make, or pass --lib PATH")
    return lib


def read_ours(root, path):
    """Content of our drop-in if present: (text, written_by_us, dir_created)."""
    host = root.host(path, last=False)
    if not os.path.lexists(host):
        return None, False, False
    with open(host, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    ours = text.startswith(MARKER)
    created = (STATE_KEY + "yes") in text.splitlines()
    return text, ours, created


def render_dropin(unit, lib_value, ddir, depth, rwp, created):
    lines = [
        MARKER + ": run %s under the mmleak leak tracer." % unit.name,
        "# Undo: mmleak-install.py uninstall %s, then systemctl restart %s" % (unit.name,
                                                                              unit.name),
        "# (or delete this file, run systemctl daemon-reload, and restart the service).",
        "# Kept on uninstall: the library %s, the dumps in %s." % (LIB_DEST, ddir),
        STATE_KEY + ("yes" if created else "no"),
        "[Service]",
        "Environment=%s" % quote_value("LD_PRELOAD=" + lib_value),
        "Environment=%s" % quote_value("MMLEAK_DIR=" + ddir),
    ]
    if depth is not None:
        lines.append("Environment=%s" % quote_value("MMLEAK_DEPTH=%d" % depth))
    if rwp:
        lines.append("ReadWritePaths=%s" % quote_value(ddir))
    return "\n".join(lines) + "\n"


def cmd_install(args):
    root, unit = setup(args)
    if unit.path is None:
        raise Fail(EXIT_INPUT, "unknown unit %s: no unit file in %s" % (
            unit.name, ", ".join(UNIT_PATH)))
    ddir = os.path.normpath(args.dir)
    if not args.dir.startswith("/"):
        raise Fail(EXIT_INPUT, "--dir %s: must be an absolute path" % args.dir)
    src = find_lib(args, root)
    s = unit.evaluate()
    warnings, notes = [], []
    dyn = parse_bool(s["DynamicUser"] or "no")
    private_tmp = parse_bool(s["PrivateTmp"] or "no") or dyn
    if private_tmp and (under(ddir, "/tmp") or under(ddir, "/var/tmp")):
        raise Fail(EXIT_INPUT, "--dir %s is under %s but %s has PrivateTmp=yes%s: the service "
                               "sees a private %s that is deleted when it stops, so the dumps "
                               "would be lost; use --dir %s"
                   % (ddir, "/tmp" if under(ddir, "/tmp") else "/var/tmp", unit.name,
                      " (implied by DynamicUser=yes)" if dyn and not parse_bool(
                          s["PrivateTmp"] or "no") else "",
                      "/tmp" if under(ddir, "/tmp") else "/var/tmp", DEFAULT_DIR))
    psys = (s["ProtectSystem"] or "no").lower()
    phome = (s["ProtectHome"] or "no").lower()
    if dyn:
        psys = "strict"
        phome = phome if parse_bool(phome) is not False else "read-only"
    need_rwp = psys in ("strict", "full") or (
        parse_bool(psys) and (under(ddir, "/usr") or under(ddir, "/boot") or
                              under(ddir, "/efi"))) or (
        (parse_bool(phome) or phome in ("read-only", "tmpfs")) and
        any(under(ddir, h) for h in ("/home", "/root", "/run/user")))
    statedirs = ["/var/lib/" + d.split(":")[0] for d in s["statedir"]]
    in_statedir = any(under(ddir, d) for d in statedirs)
    if dyn and not in_statedir:
        warnings.append("%s has DynamicUser=yes: its user exists only while it runs and cannot "
                        "write %s (root-owned); the dump directory must be under its "
                        "StateDirectory= (%s), pass --dir; ReadWritePaths=%s was added"
                        % (unit.name, ddir, ", ".join(statedirs) or "none set: add one", ddir))
        need_rwp = True
    elif dyn:
        need_rwp = False
    if need_rwp:
        for p in s["rwp"]:
            if under(ddir, os.path.normpath(p.lstrip("-+"))) and p.lstrip("-+") != "/":
                need_rwp = False
    if parse_bool(s["MemoryDenyWriteExecute"] or "no"):
        notes.append("%s has MemoryDenyWriteExecute=yes: this is compatible, mmleak needs no "
                     "writable+executable memory" % unit.name)
    if s["RootDirectory"] or s["RootImage"]:
        warnings.append("%s has RootDirectory=/RootImage=: %s and %s must exist inside it"
                        % (unit.name, LIB_DEST, ddir))
    check_execstart(root, unit, s, warnings)
    for path, what in s["later"]:
        warnings.append("%s sorts after %s and sets %s, which overrides mmleak's setting; "
                        "merge it by hand" % (path, DROPIN_NAME, what))
    for ef in s["envfile"]:
        p = ef.lstrip("-")
        try:
            with open(root.host(p), encoding="utf-8", errors="replace") as f:
                if re.search(r"^\s*(export\s+)?LD_PRELOAD\s*=", f.read(), re.M):
                    warnings.append("EnvironmentFile=%s sets LD_PRELOAD, which overrides "
                                    "mmleak's Environment=LD_PRELOAD; add %s to it by hand"
                                    % (p, LIB_DEST))
        except OSError:
            pass

    # Owner of the dump directory (only when install creates it).
    dirs_dump = [] if (dyn and in_statedir) else missing_dirs(root, ddir)
    owner = None
    if dirs_dump and not dyn:
        owner = resolve_owner(root, unit, s)
    elif dirs_dump:
        owner = ("root", 0, "root", 0)

    # LD_PRELOAD: keep what the unit already preloads, append the library.
    existing = s["env"].get("LD_PRELOAD", "").strip()
    entries = [e for e in re.split(r"[\s:]+", existing) if e]
    if LIB_DEST in entries:
        lib_value = existing
    elif existing:
        lib_value = existing + " " + LIB_DEST
        notes.append("%s already sets LD_PRELOAD=%s (in %s): kept, mmleak's library appended"
                     % (unit.name, existing, s["env_src"]["LD_PRELOAD"]))
    else:
        lib_value = LIB_DEST

    dpath = dropin_path(unit)
    ddir_dropin = os.path.dirname(dpath)
    old, ours, was_created = read_ours(root, dpath)
    if old is not None and not ours:
        raise Fail(EXIT_INPUT, "%s exists and was not written by %s; not touching it"
                   % (dpath, PROG))
    create_dropin_dir = not os.path.isdir(root.host(ddir_dropin))
    created_flag = was_created if old is not None else create_dropin_dir
    text = render_dropin(unit, lib_value, ddir, args.depth, need_rwp, created_flag)

    # Plan.
    plan = []
    lib_host = root.host(LIB_DEST)
    same_path = os.path.realpath(src) == os.path.realpath(lib_host)
    lib_dirs = missing_dirs(root, os.path.dirname(LIB_DEST))
    if same_path:
        pass
    elif os.path.isfile(lib_host) and same_content(src, lib_host):
        plan.append(("keep", "library %s is up to date" % LIB_DEST))
    else:
        for d in lib_dirs:
            plan.append(("mkdir", d, 0o755, None))
        plan.append(("copy", src, LIB_DEST))
    if dyn and in_statedir:
        notes.append("%s is under StateDirectory=; systemd creates it for the dynamic user"
                     % ddir)
    for d in dirs_dump:
        plan.append(("mkdir", d, 0o700 if d == ddir else 0o755,
                     (owner[1], owner[3], owner[0], owner[2]) if d == ddir else None))
    if not dirs_dump and not (dyn and in_statedir):
        plan.append(("keep", "dump directory %s exists" % ddir))
    if create_dropin_dir:
        for d in missing_dirs(root, ddir_dropin):
            plan.append(("mkdir", d, 0o755, None))
    if old == text:
        plan.append(("keep", "already installed: %s is up to date" % dpath))
    else:
        plan.append(("write", dpath, text, "update" if old is not None else "write"))

    def describe(step):
        if step[0] == "keep":
            return step[1]
        if step[0] == "mkdir":
            own = " owner %s:%s" % (step[3][2], step[3][3]) if step[3] else ""
            return "create directory %s (mode %04o%s)" % (step[1], step[2], own)
        if step[0] == "copy":
            return "copy %s -> %s (mode 0644)" % (step[1], step[2])
        return "%s %s" % (step[3], step[1])

    for n in notes:
        warn(n, "note")
    for w in warnings:
        warn(w)

    out = sys.stdout
    if args.dry_run:
        out.write("dry run: nothing changed%s.\n" % (
            " (root %s)" % root.top if args.root is not None else ""))
        out.write("drop-in %s:\n" % dpath)
        for line in text.splitlines():
            out.write("    " + line + "\n")
        out.write("actions:\n")
        for step in plan:
            out.write("  " + describe(step) + "\n")
        out.write("  %s\n" % reload_step(args, root, []))
        return EXIT_OK

    if args.root is not None:
        out.write("root: %s\n" % root.top)
    done_undo = []
    try:
        for step in plan:
            if step[0] == "mkdir":
                h = root.host(step[1])
                os.mkdir(h, step[2])
                done_undo.append(("rmdir", h))
                os.chmod(h, step[2])
                if step[3] is not None and os.geteuid() == 0:
                    os.chown(h, step[3][0], step[3][1])
                elif step[3] is not None and os.stat(h).st_uid != step[3][0]:
                    warn("not root: %s left owned by you; chown it to %s:%s"
                         % (step[1], step[3][2], step[3][3]))
            elif step[0] == "copy":
                existed = os.path.exists(lib_host)
                atomic_copy(step[1], root.host(os.path.dirname(LIB_DEST)) + "/" +
                            os.path.basename(LIB_DEST), 0o644)
                if not existed:
                    done_undo.append(("unlink", lib_host))
            elif step[0] == "write":
                h = root.host(os.path.dirname(dpath)) + "/" + DROPIN_NAME
                atomic_write(h, text.encode("utf-8", "surrogateescape"), 0o644)
            out.write(describe(step) + "\n")
    except OSError as e:
        for kind, h in reversed(done_undo):
            try:
                (os.rmdir if kind == "rmdir" else os.unlink)(h)
            except OSError:
                pass
        raise Fail(EXIT_ENV, "%s%s: %s" % ("install failed, changes undone: ",
                                           e.filename or "", e.strerror))
    done = []
    reload_line = reload_step(args, root, done)
    for d in done:
        out.write(d + "\n")
    out.write("LD_PRELOAD=%s\nMMLEAK_DIR=%s\n" % (lib_value, ddir))
    out.write("next steps:\n")
    if reload_line:
        out.write("  %s\n" % reload_line)
    out.write("  systemctl restart %s\n" % unit.name)
    out.write("  %s status %s\n" % (PROG, unit.name))
    out.write("  mmleak.py report %s --pid $(systemctl show -p MainPID --value %s)\n"
              % (ddir, unit.name))
    out.write("  %s uninstall %s     # when done\n" % (PROG, unit.name))
    return EXIT_OK


def dropin_values(text):
    env = collections.OrderedDict()
    rwp = []
    for sec, key, val in parse_unit_text(text):
        if sec == "Service" and key == "Environment":
            for k, v in parse_env_assignments(val):
                env[k] = v
        elif sec == "Service" and key == "ReadWritePaths":
            rwp.append(val)
    return env, rwp


def cmd_status(args):
    root, unit = setup(args)
    dpath = dropin_path(unit)
    text, ours, _ = read_ours(root, dpath)
    if unit.path is None and text is None:
        raise Fail(EXIT_INPUT, "unknown unit %s: no unit file in %s" % (
            unit.name, ", ".join(UNIT_PATH)))
    out = sys.stdout
    if args.root is not None:
        out.write("root:           %s\n" % root.top)
    out.write("unit:           %s (%s)\n" % (unit.name, unit.path or "unit file not found"))
    if text is None:
        out.write("drop-in:        %s: absent\n" % dpath)
        out.write("not installed\n")
        return EXIT_NOT_INSTALLED
    out.write("drop-in:        %s: present%s\n" % (
        dpath, "" if ours else " (not written by %s)" % PROG))
    env, rwp = dropin_values(text)
    eff = unit.evaluate(skip_ours=False)["env"]
    for k in ("LD_PRELOAD", "MMLEAK_DIR", "MMLEAK_DEPTH"):
        v = env.get(k)
        shown = v if v is not None else ("(not set: default %s)" % (
            "/tmp" if k == "MMLEAK_DIR" else "1") if k != "LD_PRELOAD" else "(not set)")
        out.write("%-16s%s\n" % (k + ":", shown))
        if v is not None and eff.get(k) != v:
            warn("%s is overridden by a later drop-in: the service gets %s=%s"
                 % (k, k, eff.get(k, "")))
    if rwp:
        out.write("%-16s%s\n" % ("ReadWritePaths:", " ".join(rwp)))
    libs = [e for e in re.split(r"[\s:]+", env.get("LD_PRELOAD", "")) if e]
    lib = next((e for e in libs if os.path.basename(e) == "mmleak.so"), LIB_DEST)
    lh = root.host(lib)
    if os.path.isfile(lh):
        out.write("library:        %s: present, %d bytes\n" % (lib, os.path.getsize(lh)))
    else:
        out.write("library:        %s: MISSING (the service will start without it)\n" % lib)
    ddir = env.get("MMLEAK_DIR", "/tmp")
    dh = root.host(ddir)
    try:
        st = os.stat(dh)
        names = sorted(n for n in os.listdir(dh)
                       if n.startswith("mmleak.") and n.endswith((".out", ".maps")))
    except OSError as e:
        out.write("dump dir:       %s: %s\n" % (ddir, e.strerror))
        return EXIT_OK
    try:
        uname = lookup(root, "passwd", str(st.st_uid))[0]
    except TypeError:
        uname = str(st.st_uid)
    try:
        gname = lookup(root, "group", str(st.st_gid))[0]
    except TypeError:
        gname = str(st.st_gid)
    out.write("dump dir:       %s: owner %s:%s mode %04o, %d dump file%s\n" % (
        ddir, uname, gname, stat.S_IMODE(st.st_mode), len(names), "" if len(names) == 1
        else "s"))
    total = 0
    for n in names:
        try:
            size = os.path.getsize(os.path.join(dh, n))
        except OSError:
            continue
        total += size
        out.write("  %12d  %s\n" % (size, n))
    if names:
        out.write("  %12d  total\n" % total)
    return EXIT_OK


def cmd_uninstall(args):
    root, unit = setup(args)
    dpath = dropin_path(unit)
    text, ours, created = read_ours(root, dpath)
    out = sys.stdout
    if text is None:
        out.write("not installed: %s does not exist; nothing to do\n" % dpath)
        return EXIT_OK
    if not ours:
        raise Fail(EXIT_INPUT, "%s was not written by %s; not removing it" % (dpath, PROG))
    env, _ = dropin_values(text)
    ddir = env.get("MMLEAK_DIR", DEFAULT_DIR)
    dd_host = root.host(os.path.dirname(dpath))
    h = dd_host + "/" + DROPIN_NAME
    rm_dir = created and os.listdir(dd_host) == [DROPIN_NAME]
    steps = ["remove %s" % dpath]
    if rm_dir:
        steps.append("remove directory %s (created by install, now empty)" % os.path.dirname(dpath))
    if args.dry_run:
        out.write("dry run: nothing changed%s.\nactions:\n" % (
            " (root %s)" % root.top if args.root is not None else ""))
        for s in steps:
            out.write("  " + s + "\n")
        out.write("  %s\n" % reload_step(args, root, []))
        return EXIT_OK
    if args.root is not None:
        out.write("root: %s\n" % root.top)
    try:
        os.unlink(h)
        fsync_dir(dd_host)
        out.write(steps[0] + "\n")
        if rm_dir:
            os.rmdir(dd_host)
            out.write(steps[1] + "\n")
    except OSError as e:
        raise Fail(EXIT_ENV, "%s: %s" % (e.filename or dpath, e.strerror))
    done = []
    reload_line = reload_step(args, root, done)
    for d in done:
        out.write(d + "\n")
    out.write("kept: library %s and dump directory %s (delete them by hand when no longer "
              "needed: rm -r %s)\n" % (LIB_DEST, ddir, ddir))
    out.write("next steps:\n")
    if reload_line:
        out.write("  %s\n" % reload_line)
    out.write("  systemctl restart %s     # the running process is traced until then\n"
              % unit.name)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Command line

class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(EXIT_INPUT, "%s: error: %s\n" % (PROG, message))


def positive(v):
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % v)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1: %r" % v)
    return n


def build_parser():
    fmt = argparse.RawDescriptionHelpFormatter
    p = Parser(prog=PROG, formatter_class=fmt, description=(
        "Make a systemd service run under the mmleak malloc leak tracer (LD_PRELOAD), show\n"
        "the state, and undo it. It writes one drop-in,\n"
        "/etc/systemd/system/UNIT.d/mmleak.conf, and never restarts the service itself.\n\n"
        "  %s install nfs-ganesha.service [--dir /var/lib/mmleak] [--depth N]\n"
        "  systemctl restart nfs-ganesha\n"
        "  %s status nfs-ganesha.service\n"
        "  mmleak.py report /var/lib/mmleak --pid $(systemctl show -p MainPID --value "
        "nfs-ganesha)\n"
        "  %s uninstall nfs-ganesha.service" % (PROG, PROG, PROG)), epilog=EXIT_HELP)

    def add_globals(parser, default):
        parser.add_argument("--root", metavar="DIR", default=default if default is None
                            else argparse.SUPPRESS,
                            help="operate on the system tree under DIR (tests, image building): "
                                 "every path, unit search and /etc/passwd lookup is under it; "
                                 "no daemon-reload")
        parser.add_argument("--dry-run", action="store_true",
                            default=False if default is None else argparse.SUPPRESS,
                            help="print the drop-in and the list of actions; change nothing")
        parser.add_argument("--no-reload", action="store_true",
                            default=False if default is None else argparse.SUPPRESS,
                            help="do not run systemctl daemon-reload (print a reminder instead)")

    add_globals(p, None)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    pi = sub.add_parser("install", formatter_class=fmt, help="trace a service", epilog=EXIT_HELP,
                        description=(
        "Make UNIT run under mmleak at its next (re)start.\n\n"
        "Files touched (under --root DIR if given):\n"
        "  /usr/local/lib/mmleak/mmleak.so   the library, copied there atomically (mode 0644)\n"
        "                                    unless it already is that file\n"
        "  DIR (default /var/lib/mmleak)     dump directory, created mode 0700 and owned by the\n"
        "                                    unit's User=/Group= if missing\n"
        "  /etc/systemd/system/UNIT.d/mmleak.conf\n"
        "                                    the drop-in, written atomically: Environment=\n"
        "                                    LD_PRELOAD (appended to the unit's own LD_PRELOAD),\n"
        "                                    MMLEAK_DIR, MMLEAK_DEPTH (with --depth), and\n"
        "                                    ReadWritePaths=DIR when the unit's sandboxing\n"
        "                                    (ProtectSystem=strict/full, ProtectHome=,\n"
        "                                    DynamicUser=) would make DIR read-only\n"
        "Then runs systemctl daemon-reload if systemd is running (not with --root or\n"
        "--no-reload), and prints the commands to type next. Running it again is harmless.\n"
        "Warnings (stderr, install proceeds): setuid/setgid or static ExecStart binary, a #!\n"
        "script or 'env -i' wrapper, a later drop-in or EnvironmentFile= overriding LD_PRELOAD,\n"
        "DynamicUser=yes. Error: DIR under /tmp or /var/tmp with PrivateTmp=yes."))
    add_globals(pi, "suppress")
    pi.add_argument("unit", metavar="UNIT", help="service unit name, e.g. nfs-ganesha.service "
                                                 "or getty@tty1.service")
    pi.add_argument("--dir", default=DEFAULT_DIR, metavar="DIR",
                    help="dump directory, MMLEAK_DIR (default %(default)s; not /tmp: "
                         "PrivateTmp= hides it and deletes it on stop)")
    pi.add_argument("--depth", type=positive, metavar="N",
                    help="frames recorded per allocation, MMLEAK_DEPTH (default: the "
                         "library's, 1)")
    pi.add_argument("--lib", metavar="PATH",
                    help="mmleak.so to install (default: mmleak.find_library(): $MMLEAK_LIB, "
                         "the build tree, the installed copy)")
    pi.set_defaults(func=cmd_install)

    ps = sub.add_parser("status", formatter_class=fmt, help="show whether a service is traced",
                        epilog=EXIT_HELP, description=(
        "Show whether UNIT's drop-in /etc/systemd/system/UNIT.d/mmleak.conf is present, its\n"
        "LD_PRELOAD, MMLEAK_DIR, MMLEAK_DEPTH and ReadWritePaths=, whether the library\n"
        "exists, and the dump directory with its mmleak.*.out and mmleak.*.maps files and\n"
        "their sizes. Changes nothing; any user may run it.\n"
        "Exit 0 if installed, 3 if not installed."))
    add_globals(ps, "suppress")
    ps.add_argument("unit", metavar="UNIT", help="service unit name")
    ps.set_defaults(func=cmd_status)

    pu = sub.add_parser("uninstall", formatter_class=fmt, help="stop tracing a service",
                        epilog=EXIT_HELP, description=(
        "Remove what install added: /etc/systemd/system/UNIT.d/mmleak.conf, and the UNIT.d\n"
        "directory if install created it (recorded in the drop-in) and it is now empty.\n"
        "Keeps /usr/local/lib/mmleak/mmleak.so and the dump directory (it prints where they\n"
        "are). Then daemon-reload as for install; restart the service to stop tracing.\n"
        "Not installed: prints a message and exits 0. A mmleak.conf not written by\n"
        "mmleak-install.py is left alone (exit 1)."))
    add_globals(pu, "suppress")
    pu.add_argument("unit", metavar="UNIT", help="service unit name")
    pu.set_defaults(func=cmd_uninstall)
    return p


def main(argv=None):
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except Fail as e:
        sys.stderr.write("%s: error: %s\n" % (PROG, e.msg))
        return e.code
    except OSError as e:
        sys.stderr.write("%s: error: %s%s\n" % (
            PROG, (e.filename + ": ") if e.filename else "", e.strerror or e))
        return EXIT_ENV
    except KeyboardInterrupt:
        sys.stderr.write("%s: error: interrupted\n" % PROG)
        return 130
    except Exception as e:  # noqa: BLE001 - never a traceback
        sys.stderr.write("%s: error: internal error (%s: %s); please report it\n"
                         % (PROG, type(e).__name__, e))
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
