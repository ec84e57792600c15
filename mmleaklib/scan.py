"""The reachability scan: its result files (mmleak-format(5), "The scan result") and
`mmleak.py scan PID` (see mmleak-scan(7)).

    kinds_for(directory, tid)   the newest scan of trace TID: a Kinds mapping
                                (address, SEQ) -> "definite" | "indirect" | "possible" |
                                "reachable"; a block it lacks is "unknown"
    newest_scan(directory, tid) the newest Scan of trace TID (header only), or None
    read_scan(path)             one Scan, header and (on demand) its columns
    scan_process(pid, ...)      scan a running traced process now (mmleak-tools.so)

A Kinds keeps the columns as arrays (8 + 8 + 1 bytes a block), not a dict: ten million
blocks stay about 170 MB."""
import array
import bisect
import os
import re
import stat

from . import facts, files, native
from .dumpformat import read_scan_head
from .errors import Fail, Refused

KINDS = ("definite", "indirect", "possible", "reachable")
UNKNOWN = "unknown"
SCAN_RE = re.compile(r"^mmleak\.%s\.scan\.(\d+)$" % files.ID)
NO_SCAN = ("no scan ran: the process ended by _exit, abort, a fatal signal or SIGKILL, "
           "scanning was off (MMLEAK_SCAN=0), or it still runs (mmleak.py scan PID)")



def no_result_text(why, reason):
    """The reachability note of a trace whose scan wrote no result: its "#noscan WHY REASON"
    line (mmleak-format(5)), the reason mmleak-scan gave on stderr only."""
    text = "the scan %s wrote no result: %s" % (
        "at the exit" if why == "exit" else "the program asked for", reason)
    if reason.startswith("cannot write the result"):     # tools/scan.c's words
        # a daemon that became another user, in a directory only root could write
        text += "; " + facts.WRITABLE_DIR
    return text


class Scan:
    """One scan result: its header fields; .columns() reads the data."""

    def __init__(self, path):
        self.path = path
        self.version = None
        self.id = self.pid = None
        self.why = None
        self.time = 0.0
        self.status = UNKNOWN
        self.reason = "the scan file is incomplete"
        self.attached = False
        self.threads = 0
        self.held = None                # ptrace, alone or signal (None: an older scanner)
        self.roots = {}                 # what -> (ranges, bytes)
        self.excluded = {}
        self.kinds = {}                 # kind -> (blocks, bytes)
        self.blocks = 0
        self.data_at = None             # offset of the binary part

    def columns(self):
        """(addresses array('Q'), seqs array('Q'), kinds bytearray), sorted by address."""
        if self.data_at is None:
            return array.array("Q"), array.array("Q"), bytearray()
        with files.open_trace_file(self.path) as f:
            f.seek(self.data_at)
            size = os.fstat(f.fileno()).st_size
            secs = []
            for _ in range(3):
                # the lengths and counts are the file's (its owner's) to say: checked against
                # what is there before anything is allocated for them
                n = int.from_bytes(f.read(8), "little")
                if n > size - f.tell():
                    raise Fail("%s: the scan's data is cut short" % self.path)
                secs.append(f.read(n))
        n = self.blocks
        if n > min(len(secs[0]), len(secs[1])):     # a number takes a byte at least
            raise Fail("%s: the scan's data is damaged (%d blocks in %d and %d bytes)"
                       % (self.path, n, len(secs[0]), len(secs[1])))
        addrs = native.leb_numbers(secs[0], n, delta=True)     # compiled, when it can be
        if addrs is None:
            addrs = _leb_numbers(secs[0], n, self.path)
            acc = 0
            for i in range(n):          # differences -> addresses (modulo 2**64, as in C)
                acc = (acc + addrs[i]) & 0xFFFFFFFFFFFFFFFF
                addrs[i] = acc
        seqs = native.leb_numbers(secs[1], n)
        if seqs is None:
            seqs = _leb_numbers(secs[1], n, self.path)
        runs = native.leb_numbers(secs[2], None)
        if runs is None:
            runs = _leb_numbers(secs[2], None, self.path)
        kinds = bytearray()
        for k in range(0, len(runs) - 1, 2):
            if runs[k] > 3:
                raise Fail("%s: a kind %d in the scan's data" % (self.path, runs[k]))
            if runs[k + 1] > n - len(kinds):
                break                   # more than the blocks: said below
            kinds += bytes((runs[k],)) * runs[k + 1]
        if len(kinds) != n or sum(runs[1::2]) != n:
            raise Fail("%s: the scan's kinds cover %d blocks, not %d"
                       % (self.path, sum(runs[1::2]), n))
        return addrs, seqs, kinds


def _leb_numbers(data, n, path):
    """The unsigned LEB128 numbers of DATA as array('Q') (N of them, if N is not None)."""
    out = array.array("Q")
    v = shift = 0
    for b in data:
        v |= (b & 0x7F) << shift
        if b & 0x80:
            shift += 7
            continue
        if v >> 64:
            raise Fail("%s: the scan's data is damaged (a number over 64 bits)" % path)
        out.append(v)
        v = shift = 0
    if shift or (n is not None and len(out) != n):
        raise Fail("%s: the scan's data is damaged (%d numbers where %s were expected)"
                   % (path, len(out), n))
    return out


def read_scan(path):
    """The header of the scan file PATH (a Scan).  Raises Fail on a file that is not one,
    Refused/OSError as open_trace_file."""
    s = Scan(path)
    with files.open_trace_file(path) as f:
        head = read_scan_head(f, path)
    for k, v in head.items():
        setattr(s, k, v)
    return s


def scan_files(directory, tid):
    """The scan files of trace TID in DIRECTORY that are the trace's own (the owner rules
    of every reader): [path], any order."""
    uids = files.trusted_uids(directory, tid)
    out = []
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise Fail("cannot list %s: %s" % (directory, e.strerror))
    for n in names:
        m = SCAN_RE.match(n)
        if not m or m.group(1) != tid:
            continue
        p = os.path.join(directory, n)
        try:
            if files.file_problem(p, os.lstat(p), "ignored", uids) is None:
                out.append(p)
        except OSError:
            pass
    return out


def newest_scan(directory, tid):
    """The newest scan of trace TID (highest time, then number), or None.  A file of the
    trace's own that is not a scan result, or whose header is damaged, stops the reader
    (Fail: which file, which line), as a dump that is not one does: without it, the kinds
    of the report would be another scan's, or none, and nothing would say why."""
    best = None
    for p in scan_files(directory, tid):
        try:
            s = read_scan(p)
        except (OSError, Refused):      # gone since it was listed, or not the owner's
            continue
        key = (s.time, int(SCAN_RE.match(os.path.basename(p)).group(2)))
        if best is None or key > best[0]:
            best = (key, s)
    return best[1] if best else None


class Kinds:
    """(address, SEQ) -> kind for the blocks of one scan (a read-only mapping); .status is
    "done" or "unknown" (.reason says why), .scan the Scan (None when there is none)."""

    def __init__(self, scan):
        self.scan = scan
        self.status = scan.status if scan else UNKNOWN
        self.reason = (scan.reason if scan else NO_SCAN)
        self.attached = bool(scan and scan.attached)
        if scan and scan.status == "done":
            self._a, self._s, self._k = scan.columns()
        else:
            self._a, self._s, self._k = array.array("Q"), array.array("Q"), bytearray()

    def kind(self, ptr, seq):
        """The kind of the block allocated at PTR with SEQ, or "unknown"."""
        i = bisect.bisect_left(self._a, ptr)
        if i < len(self._a) and self._a[i] == ptr and self._s[i] == seq:
            return KINDS[self._k[i]]
        return UNKNOWN

    def __getitem__(self, key):
        k = self.kind(*key)
        if k == UNKNOWN:
            raise KeyError(key)
        return k

    def get(self, key, default=None):
        k = self.kind(*key)
        return default if k == UNKNOWN else k

    def __contains__(self, key):
        return self.kind(*key) != UNKNOWN

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return iter(zip(self._a, self._s))

    def table(self):
        """(addresses, SEQs, kinds) as arrays sorted by address, the kinds as indexes into
        KINDS: what a join in C takes without a Python object per block."""
        return self._a, self._s, self._k

    def items(self):
        for a, s, k in zip(self._a, self._s, self._k):
            yield (a, s), KINDS[k]


def kinds_for(directory, tid):
    """The kinds of trace TID's newest scan (a Kinds; status "unknown" when there is none,
    or when it could not be done)."""
    return Kinds(newest_scan(directory, tid))


def summary_lines(k):
    """valgrind-like LEAK SUMMARY lines of a Kinds (from its header's totals)."""
    if k.status != "done":
        return ["reachability unknown: %s" % k.reason]
    out = []
    for name, label in zip(KINDS, ("definitely lost", "indirectly lost", "possibly lost",
                                   "still reachable")):
        blocks, nbytes = k.scan.kinds.get(name, (0, 0))
        out.append("%15s: %d bytes in %d blocks" % (label, nbytes, blocks))
    if k.attached:
        out.append("attached trace: blocks allocated before the attach are unknown; the heap "
                   "memory outside the known blocks was taken as roots")
    return out


def process_uids(pid):
    """The real, effective, saved and file-system uids of process PID (the kernel's word)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    return set(int(u) for u in line.split()[1:5])
    except (OSError, ValueError):
        pass
    return set()


def trace_dir(pid, tid, directory):
    """A descriptor of DIRECTORY, open, where process PID says it writes trace TID.  The
    process says so in its own memory (mmleak.so's status word), which it can write: a
    process of another user's could name root's directory, or another user's trace, and
    root's scan would write a result there (root's, or handed to that trace's owner, and
    taken by that trace's report).  So the trace's .maps file there must be a regular
    file of one of the process's uids; the scan then works in the directory held open
    (/proc/self/fd/N), which a move and a symbolic link left in its place do not change."""
    if not re.fullmatch(files.ID, tid) or not directory.startswith("/"):
        raise Fail("process %d says it traces %r into %r: not a trace id and a directory"
                   % (pid, tid, directory))
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise Fail("process %d traces into %s, which we cannot open: %s"
                   % (pid, directory, e.strerror))
    name = "mmleak.%s.maps" % tid
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        owner = st.st_uid if stat.S_ISREG(st.st_mode) else None
    except OSError:
        owner = None
    uids = process_uids(pid)
    if owner is None or owner not in uids:
        os.close(fd)
        raise Fail("process %d says it traces %s into %s, but %s there is %s, not the "
                   "process's user's (uid %s): not scanned"
                   % (pid, tid, directory, name,
                      "no file of anybody's" if owner is None else "uid %d's" % owner,
                      "/".join(str(u) for u in sorted(uids)) or "unknown"))
    return fd


def scan_process(pid, directory, tid, why="demand"):
    """Scan the running process PID (trace TID in DIRECTORY) now: (status, path of the
    result, message).  status 0 done, 1 could not be done (the result says why)."""
    from . import native
    import ctypes
    lib = native.tools_library()
    if lib is None:
        raise Fail("mmleak-tools.so not found beside mmleak.so: cannot scan")
    dll = ctypes.CDLL(lib)
    fn = dll.mmleak_scan
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                   ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                   ctypes.c_void_p]
    out = ctypes.create_string_buffer(4200)
    err = ctypes.create_string_buffer(512)
    rc = fn(pid, os.fsencode(directory), tid.encode(), why.encode(), out, len(out), err,
            len(err), None)
    msg = err.value.decode("utf-8", "replace")
    if rc < 0:
        raise Fail("cannot scan process %d: %s" % (pid, msg))
    return rc, out.value.decode(), msg
