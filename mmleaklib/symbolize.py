"""Symbolization (mmleak(1), docs/mmleak.rst, "symbolize"): addresses to function and file:line."""
import array
import bisect
import collections
import itertools
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

from . import elfcode, errors, files
from .errors import Refused, refuse
from .facts import RUNTIME_SOURCES
from .files import loads_of, read_lines


# ------------------------------------------------------------ end of compiled shrink path


# ---------------------------------------------------------------------------------------
# Symbolization (mmleak(1), docs/mmleak.rst, "symbolize")
# ---------------------------------------------------------------------------------------

Frame = collections.namedtuple("Frame", "addr module offset function file line inlined error")
MAPS_LINE_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) (\S+) (\d+)\s+(.*)$")


ADDR_MASK = (1 << 48) - 1      # a frame's top 16 bits: the dlclose epoch (mmleak.ID.loads)

# A maps file starts with a line of /proc/PID/maps, or is empty (a process killed as it
# made it), or holds only the torn start of its first line: anything else given as one (a
# dump, a program, a text) is refused in one line, as a file that is not a dump is.
NOT_MAPS = ("not an mmleak maps file (its first line is not one of /proc/PID/maps: START-END "
            "PERMS OFFSET DEV INODE PATH); refused")
_MAPS_START = re.compile(r"[0-9a-f]{1,16}-[0-9a-f]|[0-9a-f]{0,16}-?\Z")


class Maps:
    """The cumulative maps file: every file-backed mapping the process had (or LINES)."""

    def __init__(self, path, lines=None):
        self.path = path
        self.entries = []   # (start, end, offset, inode, pathname)
        if lines is None:
            lines = read_lines(path, text=True)
            first = next(lines, None)
            if first is not None and not _MAPS_START.match(first):
                raise Refused("%s: %s" % (path, NOT_MAPS))
            lines = itertools.chain([first] if first is not None else [], lines)
        for line in lines:
            m = MAPS_LINE_RE.match(line.rstrip("\n"))
            if not m:
                continue
            self.entries.append((int(m.group(1), 16), int(m.group(2), 16),
                                 int(m.group(4), 16), int(m.group(6)), m.group(7),
                                 line if line.endswith("\n") else line + "\n"))
        self.entries.sort()
        self.starts = [e[0] for e in self.entries]
        self._loads = None

    def load_of(self, entry):
        """The mappings of the load ENTRY belongs to (a tuple, in address order).  A file
        loaded at two addresses over the run (dlclose, then dlopen where the loader chose)
        has two loads here, and eu-addr2line must be shown one of them at a time: given the
        same file at two bases it resolves neither."""
        if self._loads is None:
            self._loads = {}
            groups = collections.defaultdict(list)     # path -> [[entries of one load]]
            ends = {}                                   # (path, end) -> the load ending there
            for e in self.entries:                      # (in address order)
                loads = groups[e[4]]
                # a load starts at its offset-0 mapping (the ELF header); a later mapping
                # joins the load it continues, else the nearest one below it
                g = None
                if e[2] != 0 and loads:
                    g = ends.get((e[4], e[0]), loads[-1])
                if g is None:
                    g = []
                    loads.append(g)
                g.append(e)
                ends[(e[4], e[1])] = g
            for loads in groups.values():
                for g in loads:
                    t = tuple(g)
                    for e in g:
                        self._loads[e] = t
        return self._loads[entry]

    def find(self, addr):
        """All mappings containing addr (more than one: the range was reused)."""
        if not hasattr(self, "_maxlen"):
            self._maxlen = max([e[1] - e[0] for e in self.entries] or [0])
        hits = []
        j = bisect.bisect_right(self.starts, addr) - 1
        while j >= 0 and addr - self.entries[j][0] < self._maxlen:
            if addr < self.entries[j][1]:
                hits.append(self.entries[j])
            j -= 1
        return hits


class Loads:
    """mmleak.ID.loads: "+EPOCH LINE" when a mapping appeared, "-EPOCH LINE" when it was gone,
    EPOCH counting the dlclose() calls before.  Tells which object was at an address in an
    epoch, where the maps file (every mapping ever) has several.

    The view of an epoch is the log's lines up to the first of a later epoch, applied in
    order.  It is not built: every line is parsed once, into one sorted list, with the
    prefix lengths (of the log) at which it appears and disappears, so that a view is a
    prefix length and whether a mapping is in it a bisection.  The log's owner may write
    thousands of epochs of thousands of lines: views built from the whole log, one per
    epoch used, took minutes and gigabytes (docs/limits.rst, "Hostile users")."""

    def __init__(self, path):
        self.log = []
        for line in read_lines(path, text=True):
            m = re.match(r"([-+])(\d+) (.*\n?)$", line)
            if m:
                self.log.append((m.group(1), int(m.group(2)), m.group(3)))
        # the view of EPOCH is the prefix up to the first line of a later epoch: the length
        # of the prefix is a bisection in the running maximum of the epochs
        self._upto = list(itertools.accumulate((e for _, e, _ in self.log), max))
        bounds = {}         # line -> [prefix lengths where it appears, disappears, ...]
        first = {}          # line -> (place, epoch) of its first "+"
        for i, (sign, e, line) in enumerate(self.log):
            b = bounds.setdefault(line, [])
            if (sign == "+") != (len(b) % 2 == 1):
                b.append(i + 1)
            if sign == "+":
                first.setdefault(line, (i, e))
        self.entries = []   # Maps' entries of every line ever present, + (bounds, first, line)
        for line, b in bounds.items():
            m = MAPS_LINE_RE.match(line.rstrip("\n"))
            if b and m:
                self.entries.append((int(m.group(1), 16), int(m.group(2), 16),
                                     int(m.group(4), 16), int(m.group(6)), m.group(7),
                                     line if line.endswith("\n") else line + "\n",
                                     b, first[line], line))
        self.entries.sort(key=lambda x: x[:6])
        self.starts = [x[0] for x in self.entries]
        self.maxlen = max([x[1] - x[0] for x in self.entries] or [0])
        self.index = {x[:6]: k for k, x in enumerate(self.entries)}
        of_line = {x[8]: k for k, x in enumerate(self.entries)}
        self.line_entry = [of_line.get(line) for _, _, line in self.log]  # (None: junk)
        self._views = {}
        self._checkpoints = {}

    def view(self, epoch):
        """The mappings present in EPOCH, as an object with Maps' find and load_of."""
        n = bisect.bisect_right(self._upto, epoch)
        if n not in self._views:
            self._views[n] = _LoadsView(self, n)
        return self._views[n]

    def checkpoint(self, n):
        """The mappings present after the first N lines, as a _Checkpoint."""
        if n not in self._checkpoints:
            self._checkpoints[n] = _Checkpoint(self, n)
        return self._checkpoints[n]

    def _containing(self, addr):
        """The indexes in entries of the mappings of any epoch containing ADDR, highest
        first (Maps.find's order)."""
        j = bisect.bisect_right(self.starts, addr) - 1
        while j >= 0 and addr - self.entries[j][0] < self.maxlen:
            if addr < self.entries[j][1]:
                yield j
            j -= 1

    def first_epoch(self, addr):
        """The epoch the first object mapped over ADDR appeared in (frames without an epoch
        were recorded before anything at their address was unloaded)."""
        firsts = [self.entries[j][7] for j in self._containing(addr)]
        return min(firsts)[1] if firsts else 0


class _LoadsView:
    """The mappings present after the first N lines of a log of loads: those of the
    checkpoint below (every CHECKPOINT lines of the log, built when first used) still
    present, and those the lines since touched.  A lookup looks at what its address has in
    both, not at every mapping the log ever put there (40,000 mappings stacked over one
    address, each present in one epoch, made each frame walk them all)."""

    CHECKPOINT = 1024

    def __init__(self, loads, n):
        self.loads, self.n = loads, n
        self.cp = loads.checkpoint(n // self.CHECKPOINT * self.CHECKPOINT)
        # (4 bytes a line: a frame of each of thousands of epochs keeps as many views)
        self.touched = array.array("i", sorted({k for k in loads.line_entry[self.cp.n:n]
                                                if k is not None}))
        self._load_of = {}

    def _present(self, k):
        return bisect.bisect_right(self.loads.entries[k][6], self.n) % 2 == 1

    def find(self, addr):
        """All mappings present containing addr (Maps.find)."""
        ents = self.loads.entries
        ks = {k for k in self.cp.containing(addr) if self._present(k)}
        ks.update(k for k in self.touched
                  if ents[k][0] <= addr < ents[k][1] and self._present(k))
        return [ents[k][:6] for k in sorted(ks, reverse=True)]

    def _walk(self, a, t, k0, step):
        """The present mappings of sorted lists A and T (a file's), from K0 on (step -1:
        at and below it, down; +1: above it, up), to the first at offset 0 (included)."""
        ia = bisect.bisect_right(a, k0) - (1 if step < 0 else 0)
        it = bisect.bisect_right(t, k0) - (1 if step < 0 else 0)
        while 0 <= ia < len(a) or 0 <= it < len(t):
            ka = a[ia] if 0 <= ia < len(a) else None
            kt = t[it] if 0 <= it < len(t) else None
            k = ka if kt is None else kt if ka is None else \
                (max if step < 0 else min)(ka, kt)
            if k == ka:
                ia += step
            if k == kt:
                it += step
            if self._present(k):
                yield k
                if self.loads.entries[k][2] == 0:
                    return

    def load_of(self, entry):
        """Maps.load_of in this view: the file's present mappings from the nearest one at
        offset 0 at or below ENTRY to the next one at offset 0 (a load starts at its ELF
        header), grouped as Maps.load_of does; only those are looked at, so that a log
        with many mappings of one file costs a load's size, not the file's."""
        if entry not in self._load_of:
            k0 = self.loads.index[entry]
            a = self.cp.by_path.get(entry[4], [])
            t = [k for k in self.touched if self.loads.entries[k][4] == entry[4]]
            run = list(self._walk(a, t, k0, -1))[::-1]
            run += [k for k in self._walk(a, t, k0, 1) if self.loads.entries[k][2] != 0]
            m = Maps(None, [])
            m.entries = [self.loads.entries[k][:6] for k in run]
            load = m.load_of(entry)
            for e in load:
                self._load_of[e] = load
        return self._load_of[entry]


class _Checkpoint:
    """The mappings present after the first N lines of a log of loads, as a list."""

    def __init__(self, loads, n):
        self.n = n
        self.ks = [k for k, x in enumerate(loads.entries)
                   if bisect.bisect_right(x[6], n) % 2 == 1]
        self.entries = loads.entries
        self.starts = [loads.entries[k][0] for k in self.ks]
        self.maxlen = max([loads.entries[k][1] - loads.entries[k][0] for k in self.ks] or [0])
        self.by_path = collections.defaultdict(list)
        for k in self.ks:
            self.by_path[loads.entries[k][4]].append(k)

    def containing(self, addr):
        """The indexes (in the log's entries) of those containing ADDR (Maps.find)."""
        j = bisect.bisect_right(self.starts, addr) - 1
        while j >= 0 and addr - self.starts[j] < self.maxlen:
            if addr < self.entries[self.ks[j]][1]:
                yield self.ks[j]
            j -= 1


def _module_problem(path, inode, trace_start):
    """Why a module's file cannot be trusted for the run, or None."""
    if path.endswith(" (deleted)"):
        return "the file was deleted or replaced while the process ran"
    try:
        st = os.stat(path)
    except OSError as e:
        return "cannot read %s: %s" % (path, e.strerror)
    if not stat.S_ISREG(st.st_mode):
        return "cannot read %s: not a regular file" % path
    if inode and st.st_ino != inode:
        return "%s was replaced since the run (inode changed)" % path
    if trace_start and st.st_mtime >= trace_start + 1:
        return "%s was modified after the run started" % path
    return None


class Symbolizer:
    """Turns caller addresses into Frames with eu-addr2line, one process per batch."""

    def __init__(self, maps_path, trace_start=None, tool="eu-addr2line", program_lines=True,
                 debuginfo_path=None, progress=False):
        """PROGRAM_LINES: show code inlined from the system's headers at the program's line
        that inlined it (see program_level); False: the innermost location, as it is.
        DEBUGINFO_PATH: more directories (a list) to look for separate debug information
        in, before elfutils' own (see debuginfo_args).  PROGRESS: the runs of a long
        symbolizing counted on stderr even when it is not a terminal (--progress)."""
        self.progress = progress
        self.program_lines = program_lines
        self.debuginfo_path = list(debuginfo_path or ())
        self.maps = Maps(maps_path)
        loads = loads_of(maps_path)
        try:
            self.loads = Loads(loads) if loads and os.path.lexists(loads) else None
        except Refused as e:
            refuse(str(e))
            self.loads = None
        except OSError:
            self.loads = None
        if self.loads is not None and not self.loads.log:
            self.loads = None           # made empty with the trace id: nothing was unloaded
        self.trace_start = trace_start
        self.tool = tool
        self.cache = {}
        self.tool_error = None
        self._checked = {}

    def _usable(self, entry):
        key = (entry[4], entry[3])
        if key not in self._checked:
            self._checked[key] = _module_problem(entry[4], entry[3], self.trace_start)
        return self._checked[key]

    def _view(self, a):
        """The mappings to resolve A with: the whole maps file, or, for a frame with an epoch
        or in a range several objects used over the run, those of its epoch."""
        real, epoch = a & ADDR_MASK, a >> 48
        if epoch and self.loads:
            return self.loads.view(epoch), real
        hits = self.maps.find(real)
        if self.loads and len({(h[4], h[0] - h[2]) for h in hits}) > 1:
            return self.loads.view(self.loads.first_epoch(real)), real
        return self.maps, real

    def lookup(self, addrs):
        """Return {addr: Frame} for every address (unresolved ones with .error set)."""
        todo = [a for a in set(addrs) if a not in self.cache]
        good = {}                   # addr -> (module, offset, its load, address in it)
        for a in todo:
            view, real = self._view(a)
            hits = view.find(real)
            code = [h for h in hits if h[5].split(None, 2)[1:2] and "x" in h[5].split()[1]]
            if code and len(code) < len(hits):
                hits = code         # a return address is in code: not in a data mapping
            paths = {(h[4], h[0] - h[2]) for h in hits}
            if not hits:
                self.cache[a] = Frame(a, None, None, None, None, None, (), "not in any mapped file")
            elif len(paths) > 1:
                self.cache[a] = Frame(a, None, None, None, None, None, (),
                                      "address range used by several objects over the run "
                                      "(dlclose/dlopen): ambiguous")
            else:
                h = hits[0]
                why = self._usable(h)
                mod = os.path.basename(h[4])
                off = real - h[0] + h[2]
                if why:
                    self.cache[a] = Frame(a, mod, off, None, None, None, (), why)
                else:
                    good[a] = (mod, off, view.load_of(h), real)
        batches = _batches(good)
        began = time.monotonic()
        for i, (loads, _, batch, at) in enumerate(batches):
            self._run_tool(batch, [e for l in loads.values() for e in l], at)
            if len(batches) > 1 and time.monotonic() - began > PROGRESS_AFTER:
                _progress(i + 1, len(batches), sum(len(b[2]) for b in batches),
                          self.progress)
        return {a: self.cache[a] for a in addrs}

    def _run_tool(self, good, entries, at):
        """Resolve GOOD ({addr: (module, offset)}) with ENTRIES, the mappings of the loads
        the addresses are in (no file twice), AT[addr] in them."""
        exe = shutil.which(self.tool)
        if not exe:
            self.tool_error = "%s not found (install elfutils)" % self.tool
            for a, (mod, off) in good.items():
                self.cache[a] = Frame(a, mod, off, None, None, None, (), self.tool_error)
            return
        paths = {os.path.basename(e[4]): e[4] for e in entries}
        OBJECTS.update((m, (p, tuple(self.debuginfo_path))) for m, p in paths.items())
        fds = {}
        try:
            given, broken = self._objects_for_tool(entries, fds)
            for a, (mod, off) in list(good.items()):
                if paths.get(mod) in broken:
                    self.cache[a] = Frame(a, mod, off, None, None, None, (),
                                          broken[paths[mod]])
                    del good[a]
            # two runs: the objects named as they are, and those given as descriptors,
            # whose directory the tool must not search (debuginfo_args)
            for own_dir in (True, False):
                objs = {p for p in given if (given[p] == p) == own_dir}
                self._resolve({a: mo for a, mo in good.items() if paths.get(mo[0]) in objs},
                              [e for e in entries if e[4] in objs], given, fds, paths,
                              own_dir, at)
        finally:
            for fd in fds.values():
                os.close(fd)

    @staticmethod
    def _objects_for_tool(entries, fds):
        """({path: the name the tool is given}, {path: why it cannot be}) for the objects of
        ENTRIES.  The tool opens an object, and looks for its debug file in its directory
        (DEBUGLINK, .debug/DEBUGLINK), by name, blocking: a FIFO there hangs it, a device is
        opened.  In a directory only root and we can change, that cannot happen; in any
        other (the trace's owner's, /tmp) the object is given as a descriptor of ours
        (files.open_regular: a regular file, the maps file's inode), /proc/self/fd/N, and
        its directory is not searched (debuginfo_args: its debug file is found by build id,
        or under /usr/lib/debug and --debuginfo-path).  FDS gets the descriptors."""
        given, broken = {}, {}
        for e in entries:
            p = e[4]
            if p in given or p in broken:
                continue
            if files.safe_directory(os.path.dirname(p)):
                given[p] = p
                continue
            try:
                fd = files.open_regular(p)
            except OSError as err:
                broken[p] = "cannot read %s: %s" % (p, err.strerror or err)
                continue
            if e[3] and os.fstat(fd).st_ino != e[3]:
                os.close(fd)
                broken[p] = "%s was replaced since the run (inode changed)" % p
                continue
            fds[p] = fd
            given[p] = "/proc/self/fd/%d" % fd
        return given, broken

    def _resolve(self, good, entries, given, fds, paths, own_dir, at):
        """Resolve GOOD ({addr: (module, offset)}) with ENTRIES, the mappings of the loads
        the addresses are in, each object under its name in GIVEN, at AT[addr] in them;
        OWN_DIR: whether the tool may look for their debug files in their directories."""
        if not good:
            return
        # A clean maps file for the tool: only the loads we trust, no ambiguous ranges.
        with tempfile.NamedTemporaryFile("w", prefix="mmleak-maps.", delete=False) as tf:
            for e in sorted(entries):
                head = e[5].rstrip("\n")
                tf.write(head[:len(head) - len(e[4])] + given[e[4]] + "\n")
            tmpmaps = tf.name
        try:
            order = sorted(good)
            inp = "".join("0x%x\n" % x for x in sorted({at[a] for a in order}))
            try:
                r = subprocess.run([shutil.which(self.tool)] +
                                   debuginfo_args(self.debuginfo_path, own_dir) +
                                   ["-M", tmpmaps, "-a", "-f", "-i", "-C"], input=inp,
                                   capture_output=True, text=True, errors="replace",
                                   pass_fds=tuple(fds.values()))
            except OSError as e:
                r = None
                self.tool_error = "%s failed: %s" % (self.tool, e)
            parsed = _parse_addr2line(r.stdout) if r is not None else {}
            for a in order:
                mod, off = good[a]
                chain = parsed.get(at[a])
                if not chain:
                    err = self.tool_error or ("%s gave no answer: %s"
                                              % (self.tool, (r.stderr.strip().splitlines()
                                                             or ["?"])[-1]))
                    self.cache[a] = Frame(a, mod, off, None, None, None, (), err)
                    continue
                if self.program_lines:
                    chain = program_level(chain)
                fn, fl, ln = chain[0]
                err = None if fn or fl else "no symbol or line information in %s" % mod
                if not fn and not fl and paths.get(mod):
                    # no answer: the function from the object's symbol table (the debug
                    # file's, or its exported .dynsym when stripped), if any
                    named = elfcode.exported_name(paths[mod], off, self.debuginfo_path)
                    if named:
                        fn = named[:named.rindex("+")]
                        err = "no debug information for %s (function from its symbol " \
                              "table)" % mod
                self.cache[a] = Frame(a, mod, off, fn, fl, ln, tuple(chain[1:]), err)
        finally:
            os.unlink(tmpmaps)


PROGRESS_AFTER = 2.0        # seconds of symbolizing after which its runs are counted on a terminal


def _progress(done, total, addrs, always=False):
    """How many of the tool's runs are done: a line on a terminal, rewritten; ALWAYS (not
    a terminal, --progress): a line each."""
    tty = sys.stderr.isatty()
    if not (tty or always):
        return
    sys.stderr.write("%s%s: symbolizing %d addresses: %d of %d runs of eu-addr2line%s"
                     % ("\r" if tty else "", errors.PROG, addrs, done, total,
                        "\n" if done == total or not tty else ""))
    sys.stderr.flush()


def _batches(good):
    """GOOD {addr: (module, offset, load, address in it)} grouped for the tool's runs:
    [({path: load}, [(start, end)] of those loads, {addr: (module, offset)}, {addr: address
    given to the tool})].  A run is shown each file once, and no two loads over the same
    addresses (the tool resolves neither).  A file loaded at many addresses over the run
    (dlclose, then dlopen where the loader chose: the maps file and the log of loads hold
    each load) is laid out alike in each: its frames are given to the tool at the same
    place in one of those loads, the first met (what the tool resolves is the offset in the
    file), so that 3,000 loads of one file are one run, not 3,000 (docs/limits.rst)."""
    reps = {}               # (path, layout) -> the load that stands for the loads alike
    place = {}              # id(load) -> its batch
    batches = []
    for a, (mod, off, load, real) in sorted(good.items()):
        base = load[0][0] - load[0][2]
        key = (load[0][4], tuple((e[0] - base, e[1] - base, e[2], e[3], e[5].split()[1])
                                 for e in load))
        rep = reps.setdefault(key, load)
        at = real - base + rep[0][0] - rep[0][2]
        b = place.get(id(rep))
        if b is None:
            path, lo, hi = rep[0][4], rep[0][0], rep[-1][1]
            b = next((b for b in batches if path not in b[0] and
                      not _overlaps(b[1], lo, hi)), None)
            if b is None:
                b = ({}, [], {}, {})
                batches.append(b)
            b[0][path] = rep
            bisect.insort(b[1], (lo, hi))
            place[id(rep)] = b
        b[2][a] = (mod, off)
        b[3][a] = at
    return batches


def _overlaps(spans, lo, hi):
    """Does [LO, HI) meet one of SPANS (sorted, disjoint (start, end))?"""
    i = bisect.bisect_left(spans, (lo, hi))
    return i < len(spans) and spans[i][0] < hi or i > 0 and spans[i - 1][1] > lo


# elfutils' own search path for separate debug information (libdwfl's default): the
# object's directory, its .debug subdirectory, /usr/lib/debug; in each absolute one, the
# build-id tree (.build-id/xx/rest.debug) and the .gnu_debuglink name; then, when
# DEBUGINFOD_URLS is set, debuginfod (libdw loads libdebuginfod itself).
ELFUTILS_DEBUGINFO_PATH = ":.debug:/usr/lib/debug"


def debuginfo_args(dirs, own_dir=True):
    """eu-addr2line's arguments to look in DIRS first, then where elfutils looks by itself
    (none: its default as it is).  Not OWN_DIR: nowhere the object's own directory (its
    relative entries, and the empty one, are that directory; an absolute one is followed by
    the object's directory)."""
    if own_dir and not dirs:
        return []
    tail = ELFUTILS_DEBUGINFO_PATH if own_dir else ":".join(
        d for d in ELFUTILS_DEBUGINFO_PATH.split(":") if d.startswith("/"))
    return ["--debuginfo-path=%s" % ":".join([os.path.abspath(d) for d in dirs] + [tail])]


ADDR_LINE_RE = re.compile(r"^0x([0-9a-f]{16})$")


def _parse_addr2line(text):
    """eu-addr2line -a -f -i output -> {addr: [(function, file, line), ...]} innermost first."""
    res = {}
    cur = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = ADDR_LINE_RE.match(lines[i])
        if m:
            cur = res.setdefault(int(m.group(1), 16), [])
            i += 1
            continue
        if cur is None or i + 1 >= len(lines):
            i += 1
            continue
        fn = lines[i].split(" inlined at ", 1)[0].strip()
        loc = lines[i + 1].strip()
        fl, _, rest = loc.partition(":")
        ln = rest.split(":", 1)[0]
        cur.append((None if fn == "??" else fn,
                    None if fl in ("??", "") else fl,
                    int(ln) if ln.isdigit() and int(ln) > 0 else None))
        i += 2
    return res


def program_level(chain):
    """An inline chain (innermost first) without its innermost levels from the system's
    headers, when the program's own code inlined them: std::string's constructor inlined into
    the program's function is shown at the program's line."""
    for j, (fn, fl, ln) in enumerate(chain):
        if not (fl and fl.startswith(RUNTIME_SOURCES)):
            return chain[j:]
    return chain


# the objects symbolized in this process, by file name: (path, debug directories), for
# frame_label's offset into a function when there is no line
OBJECTS = {}


def function_offset(fr):
    """'+0xN', the offset of FR's address into its function, from the symbol table of the
    object symbolized (elfcode.exported_name), or ''."""
    obj = OBJECTS.get(fr.module)
    named = elfcode.exported_name(obj[0], fr.offset, obj[1]) if obj else None
    return named[named.rindex("+"):] if named else ""


def frame_label(fr):
    """'function at file:line', 'function+0xN at module+0xoff' (no debug information: the
    offset into the function, from the symbol table) or 'module+0xoff'."""
    if fr.function or fr.file:
        if fr.file:
            return "%s at %s:%s" % (fr.function or "??", fr.file, fr.line)
        return "%s%s at %s+0x%x" % (fr.function, function_offset(fr), fr.module, fr.offset)
    if fr.module:
        return "%s+0x%x" % (fr.module, fr.offset)
    return "0x%x" % fr.addr
