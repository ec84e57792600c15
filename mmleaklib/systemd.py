"""mmleak-install.py's logic: run a systemd service under the mmleak leak tracer, and undo it.

Install writes one drop-in, /etc/systemd/system/UNIT.d/mmleak.conf, that sets LD_PRELOAD,
MMLEAK_DIR, MMLEAK_ROTATE_MB (and MMLEAK_DEPTH) for the service and Wants= its companion,
/etc/systemd/system/mmleak-compact-UNIT.service, which runs `mmleak.py compact --follow
--forever DIR` as the service's user while the service runs; it never starts, stops or
restarts a service itself.  What systemd reads is read here as systemd reads it (unit files,
drop-ins, quoting, specifiers, users); plan() computes an install without changing
anything, apply() carries it out (and undoes it on failure)."""
import collections
import errno
import filecmp
import grp
import io
import os
import pwd
import re
import shlex
import shutil
import stat
import struct
import subprocess

from . import files, layout
from .errors import EXIT_INPUT, EXIT_USAGE, Fail, warn
from .facts import COMPACT_ROTATE_MB, SCANNER_NAME, TOOLS_LIBNAME

PROG = "mmleak-install.py"
DROPIN_NAME = "mmleak.conf"
# Where a service's library and its companion's mmleak.py are: copies here (a source tree's
# build, a --lib of the user's), or the installed copy's own files in place (package_paths).
LOCAL_LIB_DEST = "/usr/local/lib/mmleak/mmleak.so"
LOCAL_PY_DEST = "/usr/local/lib/mmleak/mmleak.py"    # what the companion runs, next to the library
LIB_DEST, PY_DEST = LOCAL_LIB_DEST, LOCAL_PY_DEST      # chosen per install by use_destinations


def package_paths():
    """(library, mmleak.py) of the installed copy this tool belongs to (make install, the
    Debian package: layout.LIBDIR is set), or None in a source tree."""
    if not layout.LIBDIR:
        return None
    return (os.path.join(layout.LIBDIR, "mmleak.so"),
            os.path.join(layout.package_parent(), "mmleak.py"))


def use_destinations(root, src):
    """Point LIB_DEST and PY_DEST at the installed copy's own files when SRC, the library to
    install, is that copy's and ROOT holds the same files: nothing is copied beside what dpkg
    owns, and a package upgrade reaches the service at its next restart.  Otherwise (a
    source tree, --lib, a root without the package) the copies in /usr/local/lib/mmleak,
    which the service keeps using whatever happens to the tree they came from."""
    global LIB_DEST, PY_DEST
    LIB_DEST, PY_DEST = LOCAL_LIB_DEST, LOCAL_PY_DEST
    p = package_paths()
    if p and os.path.realpath(src) == os.path.realpath(p[0]) and all(
            os.path.isfile(root.host(x)) and same_content(x, root.host(x)) for x in p):
        LIB_DEST, PY_DEST = p
PACKAGE = "mmleaklib"   # mmleak.py's package: copied beside it, with it
PYTHON = "/usr/bin/python3"
COMPANION_DIR = "/etc/systemd/system"
COMPANION_PREFIX = "mmleak-compact-"
# A root companion's only capabilities: to read, fold and delete the dumps of a daemon that
# hands them to the user it becomes (sshd's privilege-separated child: sshd, mode 0600, in a
# root directory), and to give the folded file that user (fchown: without CAP_CHOWN every
# fold of such a trace failed, "cannot write mmleak.ID.compact.tmp: Operation not permitted").
# CAP_SETUID and CAP_SETGID: a trace of such a user in a directory that user can write (a
# service started with full privileges, ExecStart=!, whose dump directory is its User='s:
# Debian's chrony) is compacted by a child that becomes its owner (compact._as_user), within
# that user's quota and not in the blocks reserved for root; the child keeps no capability.
ROOT_COMPANION_CAPS = "CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER CAP_SETUID CAP_SETGID"
ENV_KEYS = ("LD_PRELOAD", "MMLEAK_DIR", "MMLEAK_DEPTH", "MMLEAK_ROTATE_MB", "MMLEAK_PAUSED")
DEFAULT_DIR = "/var/lib/mmleak"
MARKER = "# Written by mmleak-install.py"
STATE_KEY = "# mmleak-install: dropin-dir-created="
# systemd's own order (systemd.unit(5)), with the units its generators write at boot: a SysV
# init script's (systemd-sysv-generator: Debian's exim4.service) is in generator.late.
UNIT_PATH = ["/run/systemd/generator.early", "/etc/systemd/system", "/run/systemd/system",
             "/run/systemd/generator", "/usr/local/lib/systemd/system",
             "/usr/lib/systemd/system", "/lib/systemd/system", "/run/systemd/generator.late"]
EXEC_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
UNIT_TYPES = ("service", "socket", "device", "mount", "automount", "swap", "target", "path",
              "timer", "slice", "scope")
NAME_RE = re.compile(r"^[A-Za-z0-9:_.\\@-]+$")

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
        raise Fail("invalid unit name %r: it must not contain '/'; give the unit's "
                               "name (like nfs-ganesha.service), not a path" % name, EXIT_USAGE)
    if ".." in name:
        raise Fail("invalid unit name %r: it must not contain '..'" % name, EXIT_USAGE)
    if len(name) > 255 or not NAME_RE.match(name):
        raise Fail("invalid unit name %r: only letters, digits and ':_.\\@-' are "
                               "allowed" % name, EXIT_USAGE)
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix not in UNIT_TYPES:
        raise Fail("invalid unit name %r: it needs a unit type suffix such as "
                               ".service (did you mean %s.service?)" % (name, name), EXIT_USAGE)
    if suffix != "service":
        raise Fail("%r is not a service: only .service units run a daemon that "
                               "mmleak can trace" % name, EXIT_USAGE)
    if not stem or stem.startswith("@") or stem.count("@") > 1:
        raise Fail("invalid unit name %r" % name, EXIT_USAGE)
    if "@" in stem:
        prefix, instance = stem.split("@")
        if not instance:
            raise Fail("%r is a template; name an instance such as %s@NAME.service"
                       % (name, prefix), EXIT_USAGE)
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


def companion_name(unit):
    """The compactor unit of UNIT: mmleak-compact-NAME.service (NAME: UNIT without .service;
    a template instance keeps its '@', so foo@bar.service gets mmleak-compact-foo@bar.service,
    a unit file for that one instance)."""
    name = COMPANION_PREFIX + unit.name[:-len(".service")] + ".service"
    if len(name) > 255:
        raise Fail("unit name %s is too long: its compactor %s would exceed the 255 "
                               "characters systemd allows" % (unit.name, name), EXIT_USAGE)
    return name


def siphash24(data, key):
    """SipHash-2-4 of DATA (bytes) with the 16-byte KEY, as a 64-bit integer."""
    mask = (1 << 64) - 1

    def rotl(x, b):
        return ((x << b) | (x >> (64 - b))) & mask

    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736f6d6570736575, k1 ^ 0x646f72616e646f6d,
         k0 ^ 0x6c7967656e657261, k1 ^ 0x7465646279746573]

    def rounds(n):
        for _ in range(n):
            v[0] = (v[0] + v[1]) & mask
            v[1] = rotl(v[1], 13) ^ v[0]
            v[0] = rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & mask
            v[3] = rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & mask
            v[3] = rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & mask
            v[1] = rotl(v[1], 17) ^ v[2]
            v[2] = rotl(v[2], 32)

    full = len(data) - len(data) % 8
    for i in range(0, full, 8):
        m, = struct.unpack_from("<Q", data, i)
        v[3] ^= m
        rounds(2)
        v[0] ^= m
    last = (len(data) & 0xff) << 56
    for i, c in enumerate(data[full:]):
        last |= c << (8 * i)
    v[3] ^= last
    rounds(2)
    v[0] ^= last
    v[2] ^= 0xff
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


# systemd's key for the name of a dynamic user whose unit name is not a valid user name
# (src/core/unit.c, user_from_unit_name()).
DYNAMIC_USER_KEY = bytes([0x58, 0x1a, 0xaf, 0xe6, 0x28, 0x58, 0x4e, 0x96,
                          0xb4, 0x4e, 0xf5, 0x3b, 0x8c, 0x92, 0x07, 0xec])


def dynamic_user_name(unit, user):
    """The user name systemd gives a DynamicUser=yes service: its User= if set, else the unit
    name's prefix (before '@' or the suffix) when it is a valid user name (letters, digits, _
    and -, not starting with a digit or -, at most 31 characters), else _du + a hash of it.
    A unit with DynamicUser=yes and the same User= shares that user (and its uid)."""
    if user:
        return user
    prefix = unit.name.split("@")[0] if "@" in unit.name else unit.name.rsplit(".", 1)[0]
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,30}", prefix):
        return prefix
    return "_du%016x" % siphash24(prefix.encode("utf-8", "surrogateescape"), DYNAMIC_USER_KEY)


def has_control(s):
    """True if S holds a control character (C0, DEL or C1): no unit file value may."""
    return any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in s)


def check_text_arg(opt, value):
    """Refuse what cannot go into a drop-in line: control characters, invalid UTF-8."""
    if has_control(value):
        raise Fail("%s %r: control characters are not allowed" % (opt, value), EXIT_USAGE)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Fail("%s %r: not valid UTF-8 (systemd requires it)" % (opt, value), EXIT_USAGE)


def quote_env(s, percent=True):
    """Quote S as one word of Environment= (systemd: quotes and C escapes are decoded, then
    % specifiers expanded). PERCENT: S is literal, so its % become %%."""
    if percent:
        s = s.replace("%", "%%")
    if not s or re.search(r'[ \t\n\r"\'\\]', s) or has_control(s):
        out = []
        for c in s:
            if c in '"\\':
                out.append("\\" + c)
            elif has_control(c):
                out.append("\\x%02x" % ord(c) if ord(c) < 0x100 else c)
            else:
                out.append(c)
        return '"' + "".join(out) + '"'
    return s


def quote_path(s):
    """Quote the literal path S as one word of ReadWritePaths= (quotes are removed and a
    backslash takes the next character as it is, no C escapes; then % specifiers)."""
    s = s.replace("%", "%%")
    if re.search(r'[ \t\n\r"\'\\]', s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


CUNESCAPE_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                    "v": "\v", "\\": "\\", '"': '"', "'": "'", "s": " "}


def split_words(text, cunescape):
    """Split a unit file value into words as systemd's extract_first_word() does with
    EXTRACT_UNQUOTE (and EXTRACT_CUNESCAPE if CUNESCAPE): whitespace separates words, '...'
    and "..." quote anywhere in a word, a backslash escapes the next character (a C escape
    sequence with CUNESCAPE). ValueError where systemd says "Invalid syntax" (the whole
    setting is then ignored)."""
    words, i, n = [], 0, len(text)
    while True:
        while i < n and text[i] in " \t\n\r":
            i += 1
        if i >= n:
            return words
        word, quote = [], None
        while i < n:
            c = text[i]
            if c == "\\":
                i += 1
                if i >= n:
                    raise ValueError("a backslash at the end")
                c = text[i]
                if not cunescape:
                    word.append(c)
                    i += 1
                elif c in CUNESCAPE_SIMPLE:
                    word.append(CUNESCAPE_SIMPLE[c])
                    i += 1
                elif c in "xuU":
                    k = {"x": 2, "u": 4, "U": 8}[c]
                    h = text[i + 1:i + 1 + k]
                    if len(h) != k or not re.fullmatch(r"[0-9a-fA-F]+", h) or int(h, 16) == 0 \
                            or int(h, 16) > 0x10ffff:
                        raise ValueError("bad escape \\%s%s" % (c, h))
                    word.append(chr(int(h, 16)) if c != "x" else
                                bytes([int(h, 16)]).decode("utf-8", "surrogateescape"))
                    i += 1 + k
                elif c in "01234567":
                    o = text[i:i + 3]
                    if not re.fullmatch(r"[0-7]{3}", o) or int(o, 8) in (0,) or \
                            int(o, 8) > 255:
                        raise ValueError("bad escape \\%s" % o)
                    word.append(bytes([int(o, 8)]).decode("utf-8", "surrogateescape"))
                    i += 3
                else:
                    raise ValueError("bad escape \\%s" % c)
                continue
            if quote:
                if c == quote:
                    quote = None
                else:
                    word.append(c)
                i += 1
                continue
            if c in "'\"":
                quote = c
                i += 1
                continue
            if c in " \t\n\r":
                break
            word.append(c)
            i += 1
        if quote:
            raise ValueError("unbalanced quotes")
        w = "".join(word)
        # \xHH escapes give bytes: join them into characters
        words.append(w.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape"))


# ---------------------------------------------------------------------------------------------
# The (alternative) root

class Root:
    def __init__(self, top):
        self.top = os.path.abspath(top) if top else "/"

    def resolve(self, path, last=True, trusted=None):
        """Resolve PATH (absolute, inside the root) following symlinks inside the root.

        Return the logical path (as seen from inside the root). If LAST is false the final
        component is not followed.  TRUSTED (a label for the message): a path the tool writes
        on; a link on it that neither root nor the user running the tool owns is refused."""
        if self.top == "/" and last and trusted is None:
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
                if trusted is not None and os.lstat(host).st_uid not in (0, os.geteuid()):
                    raise Fail("%s: %s is a symbolic link owned by uid %d, not "
                                           "root%s: %s does not follow it; give the real path"
                               % (trusted, "/" + "/".join(cur + [c]), os.lstat(host).st_uid,
                                  "" if os.geteuid() == 0 else " or you", PROG), EXIT_USAGE)
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

    def host(self, path, last=True, trusted=None):
        """Host path of the in-root PATH (TRUSTED: see resolve)."""
        logical = self.resolve(path, last, trusted)
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
    ws = " \t\n\r"                   # systemd's WHITESPACE; only \n ends a line
    for raw in text.split("\n"):
        line = raw.strip(ws)
        if pending is not None:
            if line.startswith(("#", ";")):
                continue
            line = pending + " " + line
            pending = None
        elif not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip(ws)
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if "=" in line:
            key, _, val = line.partition("=")
            yield section, key.strip(ws), val.strip(ws)
    if pending is not None and "=" in pending:
        key, _, val = pending.partition("=")
        yield section, key.strip(ws), val.strip(ws)


def parse_env_assignments(val):
    """Environment= value -> [(name, value)], as systemd reads it before specifiers."""
    try:
        words = split_words(val, cunescape=True)
    except ValueError:
        return []               # systemd: "Invalid syntax, ignoring"
    return [w.partition("=")[::2] for w in words if "=" in w and not w.startswith("=")]


class Unit:
    """The files that make up a unit and the [Service] settings mmleak cares about."""

    SINGLE = ("User", "Group", "DynamicUser", "PrivateTmp", "ProtectSystem", "ProtectHome",
              "MemoryDenyWriteExecute", "RootDirectory", "RootImage",
              "RuntimeDirectoryPreserve")

    def __init__(self, root, name, template, instance, allow_masked=False):
        self.root, self.name, self.template, self.instance = root, name, template, instance
        self.path = None            # logical path of the unit file
        self.dropins = []           # logical paths, in the order systemd applies them
        for n in [name] + ([template] if template else []):
            for d in UNIT_PATH:
                p = d + "/" + n
                if os.path.lexists(root.host(p, last=False)):
                    if root.resolve(p) == "/dev/null":
                        if allow_masked:    # uninstall: what install wrote still goes
                            continue
                        raise Fail("unit %s is masked (%s -> /dev/null)" % (name, p), EXIT_USAGE)
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
        s = {"env": collections.OrderedDict(), "env_raw": {}, "env_src": {}, "exec": [],
             "rwp": [], "statedir": [], "envfile": [], "later": [], "groups": [],
             "unset": [], "runtimedir": []}
        for k in self.SINGLE:
            s[k] = None
        paths = ([self.path] if self.path else []) + [
            d for d in self.dropins if not (skip_ours and os.path.basename(d) == DROPIN_NAME)]
        for path in paths:
            later = path != self.path and os.path.basename(path) > DROPIN_NAME
            for sec, key, val in parse_unit_text(self.read(path)):
                if sec != "Service":
                    continue
                orig = val
                val = expand_specifiers(val, self.name, self.instance) if key != "Environment" \
                    else val
                if key == "Environment":
                    if not val:
                        s["env"].clear()
                        if later:
                            s["later"].append((path, "an empty Environment= (which resets it)"))
                        continue
                    # systemd decodes quotes and escapes first, then specifiers
                    for k, v in parse_env_assignments(val):
                        s["env"][k] = expand_specifiers(v, self.name, self.instance)
                        s["env_raw"][k] = v
                        s["env_src"][k] = path
                        if later and k in ENV_KEYS:
                            s["later"].append((path, k))
                elif key in ("ExecStart", "ReadWritePaths", "StateDirectory", "EnvironmentFile",
                             "SupplementaryGroups", "UnsetEnvironment", "RuntimeDirectory"):
                    lst = {"ExecStart": "exec", "ReadWritePaths": "rwp",
                           "StateDirectory": "statedir", "EnvironmentFile": "envfile",
                           "SupplementaryGroups": "groups", "UnsetEnvironment": "unset",
                           "RuntimeDirectory": "runtimedir"}[key]
                    if not val:
                        s[lst] = []
                    elif key in ("ExecStart", "EnvironmentFile"):
                        s[lst].append(val)
                    else:
                        try:
                            # words first, then specifiers, as systemd does
                            s[lst].extend(expand_specifiers(w, self.name, self.instance)
                                          for w in split_words(
                                              orig, cunescape=key == "UnsetEnvironment"))
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


def full_privileges(val):
    """Does ExecStart=VAL run with full privileges (its prefix has "+" or "!"), as root
    whatever User= says?"""
    flags = re.match(r"^[-@:+!]*", val).group(0)
    return "+" in flags or "!" in flags


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


def member_gids(root, uname):
    """The groups that list UNAME as a member (what initgroups() adds)."""
    out = set()
    if root.top == "/":
        try:
            for g in grp.getgrall():
                if uname in g.gr_mem:
                    out.add(g.gr_gid)
        except OSError:
            pass
        return out
    try:
        with open(root.host("/etc/group"), encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if len(fields) >= 4 and fields[2].isdigit() and uname in fields[3].split(","):
                    out.add(int(fields[2]))
    except OSError:
        pass
    return out


Owner = collections.namedtuple("Owner", "user uid group gid gids")


def resolve_owner(root, unit, s):
    """The credentials the service runs with: Owner (user, uid, group, gid, all its gids).

    Fail (EXIT_ENV) if User= or Group= does not resolve: systemd cannot start the service
    either (DynamicUser= is handled by the caller)."""
    user = s["User"] or "root"
    pu = lookup(root, "passwd", user)
    where = "%s/etc/passwd" % (root.top.rstrip("/")) if root.top != "/" else "the user database"
    if pu is None:
        raise Fail("cannot resolve User=%s of %s in %s: create the user first "
                             "(systemd cannot start the service without it either)"
                   % (user, unit.name, where), EXIT_INPUT)
    if s["Group"]:
        pg = lookup(root, "group", s["Group"])
        if pg is None:
            gwhere = "%s/etc/group" % root.top.rstrip("/") if root.top != "/" \
                else "the group database"
            raise Fail("cannot resolve Group=%s of %s in %s" % (s["Group"], unit.name,
                                                                         gwhere), EXIT_INPUT)
        gname, gid = pg[0], pg[1]
    else:
        if pu[2] is None:
            raise Fail("cannot find the primary group of User=%s of %s"
                       % (user, unit.name), EXIT_INPUT)
        gid = pu[2]
        pg = lookup(root, "group", str(gid))
        gname = pg[0] if pg else str(gid)
    gids = {gid} | member_gids(root, pu[0])
    for g in s.get("groups") or ():
        e = lookup(root, "group", g)
        if e is not None:
            gids.add(e[1])
    return Owner(pu[0], pu[1], gname, gid, gids)


# ---------------------------------------------------------------------------------------------
# Dump directories

# Never a dump directory: mmleak-install.py would make it the service's (owner, mode 0700).
SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/efi", "/etc", "/home", "/lib", "/lib32",
               "/lib64", "/libx32", "/media", "/mnt", "/opt", "/proc", "/root", "/run",
               "/run/user", "/sbin", "/srv", "/sys", "/usr", "/var", "/var/backups",
               "/var/cache", "/var/lib", "/var/lib/private", "/var/local", "/var/log",
               "/var/mail", "/var/opt", "/var/spool"}
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/efi", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
                "/proc", "/run/systemd", "/sbin", "/sys", "/usr", "/var/lib/systemd")
# Usable as they are (world-writable, sticky), never changed.
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def is_system_dir(path):
    if path in SHARED_TMP:
        return False
    return path in SYSTEM_DIRS or any(under(path, t) for t in SYSTEM_TREES)


def may(st, who, bits):
    """May WHO (an Owner; None: root) do BITS (0o1 search, 0o3 create files) in ST?"""
    if who is None or who.uid == 0:
        return True
    if st.st_uid == who.uid:
        m = st.st_mode >> 6
    elif st.st_gid in who.gids:
        m = st.st_mode >> 3
    else:
        m = st.st_mode
    return m & bits == bits


def id_names(root, st):
    u = lookup(root, "passwd", str(st.st_uid))
    g = lookup(root, "group", str(st.st_gid))
    return (u[0] if u else str(st.st_uid)), (g[0] if g else str(st.st_gid))


def describe_st(root, st):
    return "owner %s:%s mode %04o" % (id_names(root, st) + (stat.S_IMODE(st.st_mode),))


def only_dumps(host, dirs_too=False):
    """True if the directory holds nothing but mmleak.* files (and directories if DIRS_TOO)."""
    for n in os.listdir(host):
        st = os.lstat(os.path.join(host, n))
        if stat.S_ISDIR(st.st_mode) and dirs_too:
            continue
        if not (n.startswith("mmleak.") and stat.S_ISREG(st.st_mode)):
            return False
    return True


def unreachable(root, path, who):
    """The first existing ancestor of PATH (logical, resolved) WHO cannot search, or None."""
    parts = [p for p in path.split("/") if p][:-1]
    cur = "/"
    for i in range(len(parts) + 1):
        cur = "/" + "/".join(parts[:i])
        try:
            st = os.stat(root.host(cur))
        except OSError:
            return None                 # missing from here on: created 0755 by install
        if not may(st, who, 0o1):
            return cur, st
    return None


def plan_dump_dir(root, unit, ddir, explicit, who):
    """Check the dump directory DDIR for the unit's user WHO (an Owner, None for a dynamic
    user) and return the plan steps that make it usable; Fail when it cannot be done without
    touching what is not a dump directory."""
    label = "--dir %s" % ddir if explicit else "the dump directory %s" % ddir
    default = DEFAULT_DIR + "/" + unit.name
    real = root.resolve(ddir, trusted=label)
    if ddir == DEFAULT_DIR or real == DEFAULT_DIR:
        raise Fail("--dir %s holds the per-unit dump directories; omit --dir to use "
                               "%s" % (ddir, default), EXIT_USAGE)
    if is_system_dir(ddir) or is_system_dir(real):
        raise Fail("--dir %s%s is a system directory: %s neither puts dumps there "
                               "nor changes its owner or mode; omit --dir to use %s"
                   % (ddir, " (%s)" % real if real != ddir else "", PROG, default), EXIT_USAGE)
    steps = []
    if not explicit or under(real, DEFAULT_DIR):
        # the root-owned parent every unit's own directory sits in
        ph = root.host(DEFAULT_DIR, trusted=DEFAULT_DIR)
        if os.path.isdir(ph):
            st = os.stat(ph)
            if st.st_uid != 0 or st.st_mode & 0o022 or not st.st_mode & 0o001:
                if only_dumps(ph, dirs_too=True):
                    steps.append(("fix", DEFAULT_DIR, 0o755, (0, 0, "root", "root"),
                                  "the parent of the per-unit dump directories",
                                  (st.st_dev, st.st_ino)))
                elif not may(st, who, 0o1):
                    raise Fail("%s holds files other than mmleak dumps and per-unit "
                                           "dump directories, and User=%s cannot traverse it "
                                           "(%s): not changing it; pass --dir"
                               % (DEFAULT_DIR, who.user, describe_st(root, st)), EXIT_USAGE)
    host = root.host(ddir)
    if not os.path.lexists(host):
        blocked = unreachable(root, real, who)
        if blocked and not (steps and blocked[0] == DEFAULT_DIR):
            raise Fail("User=%s cannot reach %s: %s is %s; choose another "
                                   "directory, or give %s search (x) permission on it yourself"
                       % (who.user, label, blocked[0], describe_st(root, blocked[1]), who.user), EXIT_USAGE)
        return steps, True
    if not os.path.isdir(host):
        raise Fail("%s exists and is not a directory" % label, EXIT_USAGE)
    if who is None:
        return steps, False
    blocked = unreachable(root, real, who)
    if blocked and not (steps and blocked[0] == DEFAULT_DIR):
        raise Fail("User=%s cannot reach %s: %s is %s; choose another directory, "
                               "or give %s search (x) permission on it yourself"
                   % (who.user, label, blocked[0], describe_st(root, blocked[1]), who.user), EXIT_USAGE)
    st = os.stat(host)
    if may(st, who, 0o3):
        steps.append(("keep", "dump directory %s exists" % ddir))
        return steps, False
    if real in SHARED_TMP or not only_dumps(host):
        raise Fail("%s holds files other than mmleak.* and User=%s cannot write it "
                               "(%s): %s does not change the owner or mode of such a directory; "
                               "choose an empty or new directory, or give %s write access "
                               "yourself" % (label, who.user, describe_st(root, st), PROG,
                                             who.user), EXIT_USAGE)
    if st.st_uid not in (0, who.uid) and real != default:
        raise Fail("%s belongs to %s (the dump directory of another service?) and "
                               "User=%s cannot write it: give each service its own dump "
                               "directory (omit --dir: %s)"
                   % (label, id_names(root, st)[0], who.user, default), EXIT_USAGE)
    if not tools_own(root, real):
        raise Fail("%s exists and User=%s cannot write it (%s): %s gives the unit's "
                               "user only a directory it creates (or one of its own in %s); give "
                               "%s write access yourself, or name a directory that does not "
                               "exist yet" % (label, who.user, describe_st(root, st), PROG,
                                              DEFAULT_DIR, who.user), EXIT_USAGE)
    steps.append(("fix", real, 0o700, (who.uid, who.gid, who.user, who.group),
                  "an existing dump directory User=%s could not write" % who.user,
                  (st.st_dev, st.st_ino)))
    return steps, False


def tools_own(root, real):
    """Is REAL (resolved) the tool's own, the only existing directory it gives to a unit's
    user: DEFAULT_DIR/NAME, in a DEFAULT_DIR only root can write (an earlier install's)?"""
    try:
        pst = os.lstat(os.path.join(root.top, DEFAULT_DIR.lstrip("/")))
    except OSError:
        return False
    return (os.path.dirname(real) == DEFAULT_DIR and stat.S_ISDIR(pst.st_mode) and
            pst.st_uid == 0 and not pst.st_mode & 0o022)


# ---------------------------------------------------------------------------------------------
# File operations

def atomic_write(dest, data, mode, src=None):
    """Write DATA (bytes), or the file SRC, to DEST as every output of mmleak's is written
    (files.new_output: a new file made O_EXCL|O_NOFOLLOW beside it, renamed over it)."""
    try:
        with files.new_output(dest, perm=mode, sync=True) as f, \
                (open(src, "rb") if src else io.BytesIO(data)) as s:
            shutil.copyfileobj(s, f)
    except Fail as e:
        raise OSError(0, str(e), dest)


def same_content(a, b):
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False


def open_dir(root, path, label):
    """A descriptor of the in-root directory PATH, resolved through root's links only
    (Root.resolve, LABEL), then opened one component at a time without following a link: a
    link that appears on it meanwhile makes the open fail instead of being followed."""
    logical = root.resolve(path, trusted=label)
    fd = os.open(root.top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for c in [c for c in logical.split("/") if c]:
        try:
            nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
        except OSError as e:
            raise OSError(e.errno, "%s (changed while installing?)" % e.strerror, logical)
        finally:
            os.close(fd)
        fd = nfd
    return fd


def set_dir(fd, path, mode, owner, inode, not_root):
    """Give the directory at FD (closed here; PATH for messages) MODE and OWNER ((uid, gid..)
    or None): it must be INODE (dev, ino), else ours.  NOT_ROOT: a warning without root."""
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != inode if inode else st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, "changed since it was checked", path)
        if owner is not None and os.geteuid() == 0:
            os.fchown(fd, owner[0], owner[1])
        elif owner is not None and st.st_uid != owner[0] and not_root:
            warn("not root: %s %s %s:%s%s" % (path, not_root, owner[2], owner[3],
                                              "; do it yourself" if inode else ""))
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


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
            raise Fail("--root %s: not a directory" % args.root, EXIT_INPUT)
        if not os.access(top, os.R_OK | os.X_OK):
            raise Fail("--root %s: not readable" % args.root, EXIT_INPUT)
        try:
            os.listdir(top)
        except OSError as e:
            raise Fail("--root %s: %s" % (args.root, e.strerror), EXIT_INPUT)
    root = Root(args.root)
    changes = args.cmd in ("install", "uninstall") and not args.dry_run
    if changes and args.root is None and os.geteuid() != 0:
        raise Fail("must be run as root (it writes under /etc/systemd/system); use "
                             "sudo, or --dry-run to see what it would do", EXIT_INPUT)
    return root, Unit(root, name, template, instance, allow_masked=args.cmd == "uninstall")


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
            raise Fail("cannot run systemctl daemon-reload: %s" % e.strerror, EXIT_INPUT)
        if r.returncode != 0:
            raise Fail("systemctl daemon-reload failed (exit %d): %s; run it by hand"
                       % (r.returncode, " ".join(r.stdout.split())), EXIT_INPUT)
        actions_done.append("ran systemctl daemon-reload")
        return None
    if args.dry_run:
        return "no systemctl daemon-reload (%s)" % why
    return "systemctl daemon-reload     # needed: not run (%s)" % why


def find_lib(args, root):
    if args.lib is not None:
        if not os.path.isfile(args.lib):
            raise Fail("--lib %s: no such file" % args.lib, EXIT_INPUT)
        return os.path.realpath(args.lib)
    lib = files.find_library(None)
    if lib is None and os.path.isfile(root.host(LOCAL_LIB_DEST)):
        lib = root.host(LOCAL_LIB_DEST)
    if lib is None:
        raise Fail("mmleak.so not found ($MMLEAK_LIB, next to mmleak.py, "
                             "PREFIX/lib/mmleak, /usr/local/lib/mmleak, /usr/lib/mmleak): build "
                             "it with make, or pass --lib PATH", EXIT_INPUT)
    return lib


def find_py():
    """(the mmleak.py the companion will run, copied to PY_DEST: the one beside this
    package; its package's files, [(path, name)])."""
    pkg = os.path.dirname(os.path.realpath(__file__))
    path = os.path.join(os.path.dirname(pkg), "mmleak.py")
    if not os.path.isfile(path):
        raise Fail("mmleak.py not found next to %s (the compactor runs it)" % PROG, EXIT_INPUT)
    return path, [(os.path.join(pkg, n), n) for n in sorted(os.listdir(pkg))
                  if n.endswith(".py")]


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


def render_dropin(unit, lib_raw, ddir, depth, rotate, rwp, created, companion, paused=False):
    """The drop-in. LIB_RAW is the LD_PRELOAD value as written in unit files (specifiers
    kept: systemd expands them); DDIR is literal."""
    lines = [
        MARKER + ": run %s under the mmleak leak tracer." % unit.name,
        "# Undo: mmleak-install.py uninstall %s, then systemctl restart %s" % (unit.name,
                                                                              unit.name),
        "# (or delete this file and %s/%s, run systemctl daemon-reload, and restart the "
        "service)." % (COMPANION_DIR, companion),
        "# Kept on uninstall: the library %s, %s, the dumps in %s." % (LIB_DEST, PY_DEST, ddir),
        STATE_KEY + ("yes" if created else "no"),
        "[Unit]",
        "Wants=%s" % companion,
        "[Service]",
        "Environment=%s" % quote_env("LD_PRELOAD=" + lib_raw, percent=False),
        "Environment=%s" % quote_env("MMLEAK_DIR=" + ddir),
        "Environment=MMLEAK_ROTATE_MB=%d" % rotate,
    ]
    if depth is not None:
        lines.append("Environment=%s" % quote_env("MMLEAK_DEPTH=%s" % depth))
    if paused:
        lines.append("Environment=MMLEAK_PAUSED=1")
    if rwp:
        lines.append("ReadWritePaths=%s" % quote_path(ddir))
    return "\n".join(lines) + "\n"


# The companion's sandbox: it reads and deletes files in DDIR, writes mmleak.ID.compact,
# .series and .lock there, reads /proc/PID/stat of the traced process, and nothing else.
COMPANION_SANDBOX = (
    ("NoNewPrivileges", "yes"), ("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
    ("PrivateNetwork", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "{home}"),
    ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"), ("ProtectControlGroups", "yes"), ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"), ("RestrictAddressFamilies", "AF_UNIX"),
    ("RestrictNamespaces", "yes"), ("RestrictRealtime", "yes"), ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"), ("MemoryDenyWriteExecute", "yes"),
    ("SystemCallArchitectures", "native"), ("SystemCallFilter", "@system-service"),
    ("SystemCallErrorNumber", "EPERM"), ("CapabilityBoundingSet", "{caps}"))


def describe_cred(cred):
    if cred["dynamic"]:
        return "the dynamic user %s (shared with the service)" % cred["user"]
    if cred["user"] is None:
        return "root (as the service)"
    return "%s:%s" % (cred["user"], cred["group"])


def render_companion(unit, ddir, cred):
    """The companion unit of UNIT: `mmleak.py compact --follow --forever DDIR` as CRED, a dict:
    user, group (None: root, or the dynamic user's default), dynamic (bool), statedir (a
    StateDirectory= entry holding DDIR, for a dynamic user, or None)."""
    home = "read-only" if any(under(ddir, h) for h in ("/home", "/root", "/run/user")) \
        else "yes"
    root = cred["user"] is None
    lines = [
        MARKER + ": the compactor of %s's mmleak dumps." % unit.name,
        "# Every second it folds the complete dump files in %s into" % ddir,
        "# mmleak.ID.compact and deletes them, so disk use stays bounded by the live set.",
        "# %s's drop-in mmleak.conf Wants= it: it starts with the service; BindsTo=:" % (
            unit.name),
        "# it stops with it, with one last pass (SIGTERM) once the traced processes ended.",
        "# Undo: mmleak-install.py uninstall %s (removes this file too)." % unit.name,
        "[Unit]",
        "Description=mmleak compactor for %s" % unit.name,
        "BindsTo=%s" % unit.name,
        "StartLimitIntervalSec=1min",
        "StartLimitBurst=5",
        "",
        "[Service]",
    ]
    if cred["dynamic"]:
        lines.append("DynamicUser=yes")
    if not root:
        lines.append("User=%s" % cred["user"])
    if cred["group"] is not None:
        lines.append("Group=%s" % cred["group"])
    in_tmp = under(ddir, "/tmp") or under(ddir, "/var/tmp")
    lines += [
        "Environment=%s" % quote_env("MMLEAK_DIR=" + ddir),
    ]
    if in_tmp:
        # the service's /tmp is the host's (a service with PrivateTmp= cannot use it): the
        # companion must see the same one, and, with ProtectSystem=strict and no private
        # /tmp, write its temporary files in the only place it may write
        lines.append("Environment=%s" % quote_env("TMPDIR=" + ddir))
    lines += [
        "ExecStart=%s %s compact --follow --forever --verbose ${MMLEAK_DIR}" % (PYTHON, PY_DEST),
        "Restart=on-failure",
        "RestartSec=5s",
        "TimeoutStopSec=5min",
        "UMask=0077",
    ]
    lines += ["%s=%s" % (k, v.format(home=home, caps=ROOT_COMPANION_CAPS if root
                                     else "")) for k, v in COMPANION_SANDBOX
              if not (in_tmp and k == "PrivateTmp")]
    if cred["statedir"]:
        lines.append("StateDirectory=%s" % quote_path(cred["statedir"]))
    else:
        lines.append("ReadWritePaths=-%s" % quote_path(ddir))
    return "\n".join(lines) + "\n"


def merge_preload(unit, s, notes):
    """LD_PRELOAD for the drop-in: mmleak.so FIRST, then what the unit preloads (an allocator
    such as jemalloc: mmleak's malloc calls it through RTLD_NEXT and records it; after it,
    mmleak would never see the allocations). -> (value as written, value the service gets)"""
    raw = s["env_raw"].get("LD_PRELOAD", "")
    keep_raw, keep, dropped = [], [], []
    for r in (e for e in re.split(r"[ \t\n\r:]+", raw) if e):
        x = expand_specifiers(r, unit.name, unit.instance)
        if os.path.basename(x) == os.path.basename(LIB_DEST):
            if x != LIB_DEST:
                dropped.append(x)
            continue
        keep_raw.append(r)
        keep.append(x)
    if keep or dropped:
        notes.append("%s already sets LD_PRELOAD=%s (in %s): kept, after mmleak's library: "
                     "mmleak.so goes first and records the allocations of the libraries after "
                     "it (such as jemalloc)%s"
                     % (unit.name, s["env"]["LD_PRELOAD"], s["env_src"]["LD_PRELOAD"],
                        "; %s dropped (one mmleak.so only)" % ", ".join(dropped)
                        if dropped else ""))
    return " ".join([LIB_DEST] + keep_raw), " ".join([LIB_DEST] + keep)


# ---------------------------------------------------------------------------------------------
# install: plan (nothing changed), then apply

class InstallPlan:
    """What install does for a unit (plan): the drop-in and the companion's texts, the steps
    (keep, mkdir, fix, copy, write), the notes and warnings to say, and the values the
    service gets.  Steps are tuples:
      ("keep", text)                          nothing to do, said
      ("mkdir", path, mode, owner or None)    a new directory
      ("fix", path, mode, owner, why, inode)  an existing directory given to the unit's user
      ("copy", src, dest, [(src, name)])      a file (and mmleak.py's package beside it, or
                                              the library's mmleak-tools.so beside it)
      ("write", path, text, verb)             a unit file"""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def plan(args, root, unit):
    """The install of UNIT (command-line ARGS: dir, depth, rotate_mb, paused, lib): an
    InstallPlan; Fail when it cannot be done.  Reads the root, changes nothing."""
    if unit.path is None:
        raise Fail("unknown unit %s: no unit file in %s" % (
            unit.name, ", ".join(UNIT_PATH)), EXIT_USAGE)
    explicit = args.dir is not None
    ddir = os.path.normpath(args.dir) if explicit else DEFAULT_DIR + "/" + unit.name
    if explicit and not args.dir.startswith("/"):
        raise Fail("--dir %s: must be an absolute path" % args.dir, EXIT_USAGE)
    if ddir.startswith("//"):
        ddir = "/" + ddir.lstrip("/")
    src = find_lib(args, root)
    use_destinations(root, src)
    py_src, package = find_py()
    rotate = args.rotate_mb if args.rotate_mb is not None else COMPACT_ROTATE_MB
    cname = companion_name(unit)
    s = unit.evaluate()
    warnings, notes = [], []
    for key in ("User", "Group"):       # they go into the companion unit as they are
        if s[key] is not None and has_control(s[key]):
            raise Fail("%s=%r of %s has a control character: systemd rejects this "
                       "unit; fix it first" % (key, s[key], unit.name), EXIT_USAGE)
    dyn = parse_bool(s["DynamicUser"] or "no")
    check_lost_dirs(unit, s, ddir, dyn)
    # The unit's credentials: always resolvable (systemd cannot start it otherwise), except
    # a dynamic user, which exists only while the service runs.
    who = None if dyn else resolve_owner(root, unit, s)
    statedirs = ["/var/lib/" + d.split(":")[0] for d in s["statedir"]]
    in_statedir = any(under(ddir, d) for d in statedirs)
    need_rwp = needs_read_write_paths(s, ddir, dyn, in_statedir)
    if dyn and not in_statedir:
        warnings.append("%s has DynamicUser=yes: its user exists only while it runs and cannot "
                        "write %s (root-owned); the dump directory must be under its "
                        "StateDirectory= (%s), pass --dir; ReadWritePaths=%s was added"
                        % (unit.name, ddir, ", ".join(statedirs) or "none set: add one", ddir))
    if parse_bool(s["MemoryDenyWriteExecute"] or "no"):
        notes.append("%s has MemoryDenyWriteExecute=yes: this is compatible, mmleak needs no "
                     "writable+executable memory" % unit.name)
    if s["RootDirectory"] or s["RootImage"]:
        warnings.append("%s has RootDirectory=/RootImage=: %s and %s must exist inside it, "
                        "and %s compacts %s outside it"
                        % (unit.name, LIB_DEST, ddir, cname, ddir))
    if not os.access(root.host(PYTHON), os.X_OK):
        warnings.append("%s not found%s: %s cannot start, the dump files of %s will not be "
                        "compacted; install python3" % (
                            PYTHON, " under %s" % root.top if root.top != "/" else "", cname,
                            unit.name))
    check_execstart(root, unit, s, warnings)
    check_overrides(root, unit, s, warnings)

    # The dump directory: created for the unit's user, or checked (and fixed only when it
    # holds nothing but dumps), never a system directory.
    if dyn and in_statedir:
        dump_steps, create = [], False
    else:
        dump_steps, create = plan_dump_dir(root, unit, ddir, explicit, who)
    dirs_dump = missing_dirs(root, ddir) if create else []
    owner = (0, 0, "root", "root") if who is None else (who.uid, who.gid, who.user, who.group)

    lib_raw, lib_value = merge_preload(unit, s, notes)

    # The companion runs as the service's user: it must read and delete the dumps, and be no
    # more than the service is. A dynamic user is shared by name (systemd allocates one uid
    # per name, for all the units that use it), and reaches its StateDirectory= the same way.
    if dyn:
        sd = next((d.split(":")[0] for d in s["statedir"]
                   if under(ddir, "/var/lib/" + d.split(":")[0])), None)
        cred = {"user": dynamic_user_name(unit, s["User"]), "group": s["Group"],
                "dynamic": True, "statedir": sd}
    elif who.uid == 0 or any(full_privileges(v) for v in s["exec"]):
        # ExecStart=!... or +... runs as root whatever User= says (Debian's chrony.service:
        # chronyd starts as root, forks, and only its child becomes _chrony): the files of
        # the root processes are root's, and a companion as User= was refused them
        cred = {"user": None, "group": None, "dynamic": False, "statedir": None}
    else:
        cred = {"user": who.user, "group": who.group, "dynamic": False, "statedir": None}
    ctext = render_companion(unit, ddir, cred)
    cpath = COMPANION_DIR + "/" + cname
    cold, cours, _ = read_ours(root, cpath)
    if cold is not None and not cours:
        raise Fail("%s exists and was not written by %s; not touching it" % (cpath, PROG),
                   EXIT_USAGE)

    dpath = dropin_path(unit)
    ddir_dropin = os.path.dirname(dpath)
    old, ours, was_created = read_ours(root, dpath)
    if old is not None and not ours:
        raise Fail("%s exists and was not written by %s; not touching it" % (dpath, PROG),
                   EXIT_USAGE)
    create_dropin_dir = not os.path.isdir(root.host(ddir_dropin))
    created_flag = was_created if old is not None else create_dropin_dir
    text = render_dropin(unit, lib_raw, ddir, args.depth, rotate, need_rwp, created_flag,
                         cname, args.paused)

    for p in (os.path.dirname(LIB_DEST), COMPANION_DIR, ddir_dropin):
        root.resolve(p, trusted=p)      # no link of another user's where it writes

    steps = copy_steps(root, src, py_src, package)
    if dyn and in_statedir:
        notes.append("%s is under StateDirectory=; systemd creates it for the dynamic user"
                     % ddir)
    steps.extend(dump_steps)
    for d in dirs_dump:
        steps.append(("mkdir", d, 0o700 if d == ddir else 0o755, owner if d == ddir else None))
    if not dirs_dump and not dump_steps and not (dyn and in_statedir):
        steps.append(("keep", "dump directory %s exists" % ddir))
    # the companion first: the drop-in's Wants= never names a unit that does not exist
    for d in missing_dirs(root, COMPANION_DIR):
        steps.append(("mkdir", d, 0o755, None))
    if cold == ctext:
        steps.append(("keep", "companion %s is up to date" % cpath))
    else:
        steps.append(("write", cpath, ctext, "update" if cold is not None else "write"))
    if create_dropin_dir:
        for d in missing_dirs(root, ddir_dropin):
            if d not in missing_dirs(root, COMPANION_DIR):
                steps.append(("mkdir", d, 0o755, None))
    if old == text:
        steps.append(("keep", "already installed: %s is up to date" % dpath))
    else:
        steps.append(("write", dpath, text, "update" if old is not None else "write"))
    return InstallPlan(unit=unit, ddir=ddir, rotate=rotate, paused=args.paused, cname=cname,
                       cpath=cpath, ctext=ctext, dpath=dpath, text=text, steps=steps,
                       notes=notes, warnings=warnings, cred=cred, lib_value=lib_value)


def check_lost_dirs(unit, s, ddir, dyn):
    """Refuse a dump directory systemd deletes when the service stops (a private /tmp, the
    unit's RuntimeDirectory=): the dumps would be lost."""
    private_tmp = parse_bool(s["PrivateTmp"] or "no") or dyn
    if private_tmp and (under(ddir, "/tmp") or under(ddir, "/var/tmp")):
        raise Fail("--dir %s is under %s but %s has PrivateTmp=yes%s: the service "
                   "sees a private %s that is deleted when it stops, so the dumps "
                   "would be lost; use --dir %s"
                   % (ddir, "/tmp" if under(ddir, "/tmp") else "/var/tmp", unit.name,
                      " (implied by DynamicUser=yes)" if dyn and not parse_bool(
                          s["PrivateTmp"] or "no") else "",
                      "/tmp" if under(ddir, "/tmp") else "/var/tmp",
                      DEFAULT_DIR + "/" + unit.name), EXIT_USAGE)
    preserve = (s["RuntimeDirectoryPreserve"] or "no").lower()
    for rd in s["runtimedir"]:
        rpath = os.path.normpath("/run/" + rd.split(":")[0])
        if under(ddir, rpath) and rpath != "/run" and parse_bool(preserve) is not True:
            raise Fail("--dir %s is under %s, the RuntimeDirectory= of %s, which "
                       "systemd deletes when the service stops "
                       "(RuntimeDirectoryPreserve=%s): the dumps would be lost "
                       "before the compactor's last pass; use --dir %s"
                       % (ddir, rpath, unit.name, preserve, DEFAULT_DIR + "/" + unit.name),
                       EXIT_USAGE)


def needs_read_write_paths(s, ddir, dyn, in_statedir):
    """Whether the unit's sandboxing makes DDIR read-only: the drop-in adds
    ReadWritePaths=DDIR."""
    psys = (s["ProtectSystem"] or "no").lower()
    phome = (s["ProtectHome"] or "no").lower()
    if dyn:
        psys = "strict"
        phome = phome if parse_bool(phome) is not False else "read-only"
    need = psys in ("strict", "full") or (
        parse_bool(psys) and (under(ddir, "/usr") or under(ddir, "/boot") or
                              under(ddir, "/efi"))) or (
        (parse_bool(phome) or phome in ("read-only", "tmpfs")) and
        any(under(ddir, h) for h in ("/home", "/root", "/run/user")))
    if dyn:
        need = not in_statedir
    if need:
        for p in s["rwp"]:
            if under(ddir, os.path.normpath(p.lstrip("-+"))) and p.lstrip("-+") != "/":
                return False
    return need


def check_overrides(root, unit, s, warnings):
    """Warn of what undoes the drop-in's settings: a later drop-in, UnsetEnvironment=, an
    EnvironmentFile= that sets LD_PRELOAD."""
    for path, what in s["later"]:
        warnings.append("%s sorts after %s and sets %s, which overrides mmleak's setting; "
                        "merge it by hand" % (path, DROPIN_NAME, what))
    for name in ENV_KEYS:
        if name in s["unset"]:
            warnings.append("%s has UnsetEnvironment=%s, which removes mmleak's setting; "
                            "remove it while tracing" % (unit.name, name))
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


def copy_steps(root, src, py_src, package):
    """The steps that put the library SRC at LIB_DEST and mmleak.py PY_SRC (with its PACKAGE
    files, [(path, name)]) at PY_DEST, unless they are there already.  The library's step
    also copies what the build has beside SRC: mmleak-tools.so, the compiled shrinker that
    the companion's compactor loads from beside LIB_DEST, and mmleak-scan, which mmleak.so
    starts from beside itself for the scan at a process's exit (without it a service left
    with two threads at its exit has no scan, and its leaks no kind)."""
    steps = []
    lib_host = root.host(LIB_DEST)
    lib_dirs = missing_dirs(root, os.path.dirname(LIB_DEST))
    tools = [(os.path.join(os.path.dirname(src), n), n) for n in (TOOLS_LIBNAME, SCANNER_NAME)]
    tools = [(p, n) for p, n in tools if os.path.isfile(p)]
    tools_same = all(same_content(p, os.path.join(os.path.dirname(lib_host), n))
                     for p, n in tools)
    if os.path.realpath(src) == os.path.realpath(lib_host):
        pass
    elif os.path.isfile(lib_host) and same_content(src, lib_host) and tools_same:
        steps.append(("keep", "library %s is up to date" % LIB_DEST))
    else:
        steps.extend(("mkdir", d, 0o755, None) for d in lib_dirs)
        lib_dirs = []
        steps.append(("copy", src, LIB_DEST, tools))
    py_host = root.host(PY_DEST)
    pkg_host = os.path.join(os.path.dirname(py_host), PACKAGE)
    pkg_same = all(same_content(p, os.path.join(pkg_host, n)) for p, n in package)
    if os.path.realpath(py_src) == os.path.realpath(py_host):
        pass
    elif os.path.isfile(py_host) and same_content(py_src, py_host):
        if pkg_same:
            steps.append(("keep", "%s is up to date" % PY_DEST))
        else:                   # an older install, of mmleak.py alone
            steps.append(("copy", os.path.join(os.path.dirname(py_src), PACKAGE),
                          os.path.join(os.path.dirname(PY_DEST), PACKAGE), package))
    else:
        steps.extend(("mkdir", d, 0o755, None) for d in lib_dirs)
        steps.append(("copy", py_src, PY_DEST, package))
    return steps


def describe(step):
    """One line of what a step does (or did)."""
    if step[0] == "keep":
        return step[1]
    if step[0] == "mkdir":
        own = " owner %s:%s" % (step[3][2], step[3][3]) if step[3] else ""
        return "create directory %s (mode %04o%s)" % (step[1], step[2], own)
    if step[0] == "fix":
        return "set owner %s:%s and mode %04o of %s (%s)" % (
            step[3][2], step[3][3], step[2], step[1], step[4])
    if step[0] == "copy":
        return "copy %s -> %s (mode 0644)" % (step[1], step[2])
    return "%s %s" % (step[3], step[1])


def in_root(root, path):
    """The host path of the in-root PATH whose directory is resolved (a link of another
    user's on the way refused) and whose last component is not."""
    return root.host(os.path.dirname(path), trusted=path) + "/" + os.path.basename(path)


def apply(p, root, out):
    """Carry out the steps of the InstallPlan P under ROOT, each said on OUT once done;
    directories are made and changed through descriptors (open_dir: a link planted since
    the plan makes a step fail, it is never followed).  A failure undoes what was done and
    is one Fail."""
    undo = []
    try:
        for step in p.steps:
            if step[0] == "mkdir":
                parent, name = os.path.split(step[1])
                h = root.host(parent, trusted=step[1]) + "/" + name
                pfd = open_dir(root, parent, step[1])
                try:
                    os.mkdir(name, step[2], dir_fd=pfd)
                except OSError as e:
                    raise OSError(e.errno, e.strerror, h)
                finally:
                    os.close(pfd)
                undo.append(("rmdir", h))
                set_dir(open_dir(root, step[1], step[1]), step[1], step[2], step[3], None,
                        "left owned by you; chown it to")
            elif step[0] == "fix":
                fd = open_dir(root, step[1], step[1])
                st = os.fstat(fd)
                undo.append(("restore", (step[1], stat.S_IMODE(st.st_mode),
                                         (st.st_uid, st.st_gid), step[5])))
                set_dir(fd, step[1], step[2], step[3], step[5], "cannot be given to")
            elif step[0] == "copy" and step[2].endswith(PACKAGE):
                copy_package(root, step[2], step[3], undo)
            elif step[0] == "copy" and step[2] == LIB_DEST:
                for path, name in step[3]:      # mmleak-tools.so and mmleak-scan, beside it
                    copy_file(in_root(root, os.path.join(os.path.dirname(LIB_DEST), name)),
                              None, path, undo, 0o755 if name == SCANNER_NAME else 0o644)
                copy_file(in_root(root, step[2]), None, step[1], undo)
            elif step[0] == "copy":
                copy_file(in_root(root, step[2]), None, step[1], undo)
                if step[3]:
                    copy_package(root, os.path.join(os.path.dirname(step[2]), PACKAGE),
                                 step[3], undo)
            elif step[0] == "write":
                copy_file(in_root(root, step[1]), step[2].encode("utf-8", "surrogateescape"),
                          None, undo)
            out.write(describe(step) + "\n")
    except (OSError, Fail) as e:
        for kind, h in reversed(undo):
            try:
                if kind == "restore":
                    set_dir(open_dir(root, h[0], h[0]), h[0], h[1], h[2], h[3], None)
                else:
                    (os.rmdir if kind == "rmdir" else os.unlink)(h)
            except (OSError, Fail):
                pass
        failed = isinstance(e, Fail)
        raise Fail("install failed, changes undone: " + (
            str(e) if failed else "%s: %s" % (e.filename or "", e.strerror)),
            e.status if failed else EXIT_INPUT)


def copy_file(h, data, src, undo, mode=0o644):
    """Write the host file H (DATA, or the file SRC), MODE; its undo (if it is new)."""
    existed = os.path.lexists(h)
    atomic_write(h, data, mode, src=src)
    if not existed:
        undo.append(("unlink", h))


def copy_package(root, d, package, undo):
    """mmleak.py's PACKAGE files ([(path, name)]) into the in-root directory D (made, mode
    0755, if missing)."""
    h = in_root(root, d)
    if not os.path.isdir(h):
        os.mkdir(h, 0o755)
        os.chmod(h, 0o755)
        undo.append(("rmdir", h))
    for path, name in package:
        copy_file(os.path.join(in_root(root, d), name), None, path, undo)
