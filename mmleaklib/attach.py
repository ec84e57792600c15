"""Attach and detach (mmleak-attach(7), docs/attach.rst): the commands `attach`,
`detach` and `status` of mmleak.py, and what mmleak.so in a process says of itself.

The injector (tools/inject.c, in mmleak-tools.so: native.py's binding) makes the process
load mmleak.so and call mmleak_attach / mmleak_detach in it."""
import os
import stat
import sys
import time

from . import errors, files
from .errors import EXIT_INPUT, EXIT_OK, EXIT_PARTIAL, EXIT_TOOL, EXIT_USAGE, Fail, warn
from .facts import COMPACT_ROTATE_MB, LIBNAME
from .files import find_library
from .native import _inject


INJECT_ERRORS = {-1: EXIT_USAGE, -2: EXIT_INPUT, -3: EXIT_INPUT, -4: EXIT_INPUT,
                 -5: EXIT_INPUT, -6: EXIT_INPUT, -7: EXIT_INPUT, -8: EXIT_TOOL}


def _ended(stat_path):
    """Has the thread whose /proc/.../stat is STAT_PATH ended (a zombie, or gone)?"""
    try:
        with open(stat_path) as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def proc_of(pid):
    """The /proc directory through which process PID's memory is seen: /proc/PID, unless its
    main thread ended (pthread_exit) while others run: a zombie until the process ends, with
    no memory of its own (its maps empty, its mem unreadable, its root gone); then a live
    thread's, /proc/PID/task/TID, which shares the process's (tools/scan.c, reader_tid)."""
    base = "/proc/%d" % pid
    if not os.path.exists(base) or not _ended(base + "/stat"):
        return base
    try:
        tids = sorted(int(t) for t in os.listdir(base + "/task") if t.isdigit())
    except OSError:
        return base
    for tid in tids:
        if tid != pid and not _ended("%s/task/%d/stat" % (base, tid)):
            return "%s/task/%d" % (base, tid)
    return base


def not_permitted(pid, what=""):
    """The refusal of a process (WHAT of it) the kernel does not let us read: what to do.
    Root is refused too where the process holds privileges it lacks (a container's init, a
    process of another user namespace) or kernel.yama.ptrace_scope is 3: "run as root" would
    then be no answer."""
    if os.geteuid() == 0:
        return ("not permitted to look at process %d%s, even as root (it has privileges this "
                "one lacks, as in a container, or kernel.yama.ptrace_scope is 3)" % (pid, what))
    return "not permitted to look at process %d%s (run as root, or as its user)" % (pid, what)


def mmleak_in(pid, tries=3):
    """The mmleak.so mapped into process PID (its path), or None."""
    proc = proc_of(pid)
    try:
        with open(proc + "/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[5:] or [""]
                if os.path.basename(path[0]) == LIBNAME:
                    return path[0]
    except FileNotFoundError:
        if proc != "/proc/%d" % pid and tries > 1:     # that thread ended meanwhile
            return mmleak_in(pid, tries - 1)
        raise Fail("no such process %d" % pid, EXIT_INPUT)
    except PermissionError:
        raise Fail(not_permitted(pid), EXIT_INPUT)
    except (OSError, IndexError):
        pass
    return None


ELF_PART_MAX = 64 << 20     # a section table, .dynsym or .dynstr bigger than this: not ours


def _elf_symbol(path, name):
    """(value, size) of the dynamic symbol NAME in the ELF file PATH, or None.  PATH is a
    name from a process's maps, which the process chooses: only a regular file is opened
    (files.open_regular: never a FIFO or a device), only its headers and dynamic symbols
    are read, each part bounded (a sparse file of 100 GB named mmleak.so is not read whole),
    and anything malformed is None.  OSError (cannot be opened) passes."""
    import struct
    fd = files.open_regular(path)
    with os.fdopen(fd, "rb"):
        def part(off, n):
            if n > ELF_PART_MAX:
                raise ValueError("too big")
            return os.pread(fd, n, off)
        try:
            eh = part(0, 64)
            if eh[:4] != b"\x7fELF" or eh[4] != 2:
                return None
            shoff, = struct.unpack_from("<Q", eh, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", eh, 0x3a)
            if shentsize < 64:
                return None
            sh = part(shoff, shentsize * shnum)
            secs = [struct.unpack_from("<IIQQQQIIQQ", sh, i * shentsize) for i in range(shnum)]
            want = name.encode() + b"\0"
            for s in secs:
                if s[1] == 11:                               # SHT_DYNSYM
                    syms, strs = part(s[4], s[5]), part(secs[s[6]][4], secs[s[6]][5])
                    for off in range(0, len(syms) - 23, 24):
                        st_name, _, _, _, value, size = struct.unpack_from("<IBBHQQ", syms, off)
                        if strs[st_name:st_name + len(want)] == want:
                            return value, size
        except (struct.error, ValueError, IndexError, OverflowError, OSError):
            return None
    return None


def traced_state(pid, raw=False):
    """What mmleak.so in process PID says of itself ("tracing ID DIR", "paused",
    "dormant"), read from its memory without stopping it; None if mmleak.so is not there.
    The process writes that memory as it likes: printable (errors.printable) unless RAW,
    for whoever shows it on a terminal."""
    state = _traced_state(pid)
    return state if raw or state is None else errors.printable(state)


def _traced_state(pid):
    lib = mmleak_in(pid)
    if not lib:
        return None
    base = None
    proc = proc_of(pid)
    with open(proc + "/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].rstrip("\n") == lib and int(parts[2], 16) == 0:
                base = int(parts[0].split("-")[0], 16)
                break
    try:        # the file as the process sees it (its mount namespace, its root)
        sym = _elf_symbol("%s/root%s" % (proc, lib), "mmleak_status") \
            if base is not None else None
    except OSError:
        try:
            sym = _elf_symbol(lib, "mmleak_status") if base is not None else None
        except OSError:
            sym = None
    if not sym:
        return "loaded (state unknown: %s has no status word)" % lib
    try:
        with open(proc + "/mem", "rb") as m:
            m.seek(base + sym[0])
            raw = m.read(sym[1])
    except OSError as e:
        return "loaded (state unreadable: %s)" % (e.strerror or e)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or "starting"


def traced_processes():
    """[(pid, command, state)] of every process with mmleak.so loaded."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        try:
            if not mmleak_in(pid):
                continue
            state = traced_state(pid)
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").strip().decode("utf-8", "replace")
        except (Fail, OSError):
            continue
        out.append((pid, cmd, state))
    return out


def process_alive(pid, tail="", doing=None):
    """Refuse, with one line (ending in TAIL), a process that does not exist or has already
    exited.  A zombie main thread alone is not the process's end: after its pthread_exit the
    other threads run on (proc_of), and such a process is alive; but DOING (attach, detach)
    works through the main thread (its root, its maps, the injected call) and refuses it."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        raise Fail("no such process %d" % pid, EXIT_INPUT)
    except (OSError, IndexError):
        return
    if state in ("Z", "X") and proc_of(pid) == "/proc/%d" % pid:
        raise Fail("process %d has exited (a zombie: its parent has not collected it yet)%s"
                   % (pid, tail), EXIT_INPUT)
    if state in ("Z", "X") and doing:
        raise Fail("process %d's main thread has ended (pthread_exit) while its other threads "
                   "run: %s needs the main thread, not supported (`mmleak.py scan %d` reads "
                   "such a process)" % (pid, doing, pid), EXIT_INPUT)


def same_dir_for(pid, d):
    """Refuse a DIR that process PID sees as another directory, or not at all (its own mount
    namespace, PrivateTmp=, chroot): its files would not be where we look."""
    try:
        ours = os.stat(d)
    except OSError as e:
        raise Fail("%s: %s" % (d, e.strerror), EXIT_INPUT)
    theirs_path = "/proc/%d/root%s" % (pid, d)
    try:
        theirs = os.stat(theirs_path)
    except FileNotFoundError:
        raise Fail("%s does not exist for process %d (another mount namespace or root, such "
                   "as a service's PrivateTmp=): choose a directory it sees as we do"
                   % (d, pid), EXIT_INPUT)
    except PermissionError:
        raise Fail(not_permitted(pid, "'s files"), EXIT_INPUT)
    except OSError:
        return          # /proc not readable that way: the process says if it cannot write
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        raise Fail("%s is another directory for process %d (another mount namespace or root, "
                   "such as a service's PrivateTmp=): its files would not be in ours; choose a "
                   "directory it sees as we do" % (d, pid), EXIT_INPUT)


def _call(pid, func, arg, deadline, timeout):
    """FUNC(ARG) in process PID (see native._inject), by DEADLINE (time.monotonic()): each
    try searches a safe moment for at most three quarters of the time left, the calls get
    the rest; a try that finds mmleak.so busy is made again while a quarter of TIMEOUT (the
    whole, in seconds) is left, so that the calls of the next one have time."""
    loaded = mmleak_in(pid)     # a path in the process's own mount namespace: used as is
    lib = loaded or find_library()
    if not lib:
        raise Fail("mmleak.so not found (run `make`, or set MMLEAK_LIB)", EXIT_INPUT)
    if not loaded:
        lib = os.path.realpath(lib)
        if not os.path.exists("/proc/%d/root%s" % (pid, lib)):
            raise Fail("%s is not visible to process %d (another mount namespace or root: "
                       "install mmleak.so where it can see it, e.g. `make install`)"
                       % (lib, pid), EXIT_INPUT)
    what = func.replace("mmleak_", "")
    tries = 0
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if tries and left_ms < timeout * 250:
            raise Fail("%s %d: the process stayed busy inside mmleak.so (%d tries in %.1f s of "
                       "--timeout %g s); try again"
                       % (what, pid, tries, timeout - left_ms / 1000, timeout), EXIT_INPUT)
        rc, res, err = _inject(pid, lib, func, arg, max(1, left_ms * 3 // 4), max(1, left_ms))
        if rc != 0:
            if rc == -5 and err.startswith("timed out after"):
                err += " (--timeout %g s: three quarters of what was left for this search, " \
                       "the rest kept for the calls)" % timeout
            raise Fail("%s %d: %s" % (what, pid, err), INJECT_ERRORS.get(rc, EXIT_INPUT))
        if res != 3:            # 3: busy (a thread was inside mmleak): try again
            return res, lib
        tries += 1
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def process_owner(pid):
    """(uid, gid) process PID creates files as (its file-system ids), or None."""
    try:
        with open("/proc/%d/status" % pid) as f:
            ids = dict(line.split(":", 1) for line in f if line.startswith(("Uid:", "Gid:")))
        return int(ids["Uid"].split()[3]), int(ids["Gid"].split()[3])
    except (OSError, KeyError, IndexError, ValueError):
        return None


def attach(pid, directory=None, depth=None, rotate_mb=None, timeout=10.0):
    """`attach`: make process PID load mmleak.so and trace into DIRECTORY, within TIMEOUT
    seconds in all."""
    deadline = time.monotonic() + timeout
    process_alive(pid, doing="attach")
    d = os.path.abspath(directory or os.environ.get("MMLEAK_DIR") or "/tmp")
    if "\n" in d[:-1] or "\0" in d:
        raise Fail("%s: a newline in the directory name" % d, EXIT_USAGE)
    try:
        if not stat.S_ISDIR(os.stat(d).st_mode):
            raise Fail("%s: not a directory" % d, EXIT_INPUT)
    except FileNotFoundError:
        pass                    # made below, once the process may be traced, as run does
    except OSError as e:
        raise Fail("%s: %s" % (d, e.strerror), EXIT_INPUT)
    mmleak_in(pid)              # not permitted to look at it: said before anything else
    # a directory made here belongs to the process's user (it writes its files there
    # itself), and is removed again, still empty, when the attach fails
    made = files.make_dump_dir(d, owner=process_owner(pid))
    try:
        same_dir_for(pid, d)
        settings = "MMLEAK_DIR=%s\n" % d
        if depth:
            settings += "MMLEAK_DEPTH=%s\n" % depth
        settings += "MMLEAK_ROTATE_MB=%d\n" % (rotate_mb or COMPACT_ROTATE_MB)
        before = set(files.find_traces(d, said=False))
        res, lib = _call(pid, "mmleak_attach", settings, deadline, timeout)
        if res == 1:
            raise Fail("process %d is already being traced (%s)" % (pid, traced_state(pid)),
                       EXIT_INPUT)
        if res != 0:
            raise Fail("process %d could not start tracing into %s (its stderr says why: can "
                       "its user write there?)" % (pid, d), EXIT_INPUT)
    except BaseException:
        if made:
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise
    new = sorted(set(files.find_traces(d, said=False)) - before)
    sys.stdout.write("%s: process %d is traced into %s (trace %s); stop with: %s detach %d\n"
                     % (errors.PROG, pid, d, " ".join(new) or "?", sys.argv[0], pid))
    return EXIT_OK


def detach(pid, timeout=10.0):
    """`detach`: stop tracing process PID, within TIMEOUT seconds in all."""
    deadline = time.monotonic() + timeout
    process_alive(pid, doing="detach")
    state = traced_state(pid)
    if state is None:
        raise Fail("process %d does not have mmleak.so loaded: nothing to detach" % pid,
                   EXIT_INPUT)
    res, _ = _call(pid, "mmleak_detach", None, deadline, timeout)
    if res == 1:
        raise Fail("process %d is not being traced (%s)" % (pid, state), EXIT_INPUT)
    words = state.split(None, 2)
    where = " (trace %s in %s)" % (words[1], words[2]) if len(words) == 3 else ""
    if res == 4:
        warn("process %d is paused, but a thread stayed inside mmleak.so: its files were "
             "left as they are%s (report and recover read them)" % (pid, where))
        return EXIT_PARTIAL
    sys.stdout.write("%s: process %d is no longer traced%s; its files are closed\n"
                     % (errors.PROG, pid, where))
    if len(words) == 3:
        sys.stdout.write("%s: next: %s report %s --pid %s\n" % (errors.PROG, sys.argv[0],
                                                              words[2], words[1]))
    return EXIT_OK


def status():
    """`status`: every process with mmleak.so loaded, and its state."""
    procs = traced_processes()
    if not procs:
        sys.stdout.write("no process has mmleak.so loaded\n")
        return EXIT_OK
    for pid, cmd, state in sorted(procs):
        sys.stdout.write("%7d  %-40s  %s\n" % (pid, state, errors.printable(cmd[:120])))
    return EXIT_OK
