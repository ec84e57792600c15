"""A throw-away machine running the host's own systemd as PID 1, for tests that need a real
service manager (tests/test_systemd.py; the `box` fixture in tests/conftest.py).

    box = boot(bind_ro=[ROOT])       # or the session fixture `box`
    box.run(["systemctl", "is-active", "foo"])       -> CompletedProcess (text, captured)
    box.reload()                                     # systemctl daemon-reload (asked twice)
    box.run("echo $PATH", check=False, timeout=10)   # a string goes through /bin/sh -c
    open(box.path("/etc/passwd"))                    # host path of a file inside
    pid = box.wait_active("foo.service")             # waits for "active", returns MainPID
    box.wait_file("/var/lib/foo/ready")              # waits for a file, returns its text
    box.close()                                      # poweroff, kill, remove everything

How it is built:

* ``unshare --mount --propagation private`` starts a shell in a mount namespace of its own;
  it mounts a tmpfs, and on it an overlay whose lower layer is the host's ``/`` (only the
  root file system: /proc, /sys, /dev, /run, /tmp mounts are not part of it, and
  systemd-nspawn mounts fresh ones) and whose upper layer is on the tmpfs, with a fresh
  /etc/machine-id; then it execs ``systemd-nspawn --boot --register=no --keep-unit
  --private-network`` on it with ``systemd.unit=basic.target`` (no enabled host service
  starts, nothing takes a port) and ``systemd.mask=timers.target``.  The host's file systems
  are never written: everything the box writes goes to the tmpfs, and the tmpfs and the
  overlay exist only in that mount namespace, so they disappear with its last process, even
  if pytest is killed.  The directories given in ``bind_ro`` (the source tree) are bound
  read-only at the same path.
* Commands run inside with ``nsenter -t PID1 -m -u -i -n -p -r -w`` (PID1: the container's
  init, the child of the nspawn process), with a fixed environment, each in a session of its
  own: with sched_autogroup (Debian's default) a session is one scheduling group, and in
  pytest's session a command shared the CPU thread by thread with whatever the other
  workers' tests ran (500 polling threads once kept a CI machine's two cores busy and a
  60 s command in the box timed out); in a session of its own it gets a group's share.
* Host state it creates, all named after the box (``mmleaktest-PID-START-N``: the pytest pid
  and its start time, so a leftover of a dead run is recognised and a concurrent run is left
  alone): its directory ``/run/mmleak-nspawn/NAME`` (console log, the list of what to
  remove, the empty mount point), a cgroup ``NAME`` under pytest's own cgroup in each
  hierarchy nspawn uses (nspawn is moved there before it starts: with no systemd on the
  host it makes ``payload``/``supervisor`` sub-cgroups wherever it runs, so concurrent boxes
  would otherwise share them), ``/run/systemd/nspawn/propagate/NAME`` and nspawn's lock
  file in ``/run/systemd/nspawn/locks``, and those two directories when they did not exist.
  ``close()`` (the fixture's finalizer) powers the box off (SIGRTMIN+4 to its systemd),
  kills what is left in its cgroups, and removes all of it; ``sweep()`` (run before every
  boot) does the same for boxes whose pytest is gone (killed with SIGKILL).  nspawn gets
  SIGTERM when pytest dies (PR_SET_PDEATHSIG), which powers the container off.
"""
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

PREFIX = "mmleaktest-"
STATE = "/run/mmleak-nspawn"
NSPAWN_RUN = "/run/systemd/nspawn"
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "LANG": "C.UTF-8", "TERM": "dumb", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0",
       "HOME": "/root"}
PR_SET_PDEATHSIG = 1
CGROUP_MOVE_FAILED = "cannot move systemd-nspawn into cgroup"
CGROUP_MOVE_EXIT = 97

LAUNCH = r"""
set -e
base=$1; mid=$2; shift 2
mount -t tmpfs -o mode=0700 mmleaktest "$base"
mkdir -m 0700 "$base/upper" "$base/work"
mkdir -m 0755 "$base/root" "$base/upper/etc"
# the overlay's root takes the upper directory's owner and mode: make them the host's /
chown --reference=/ "$base/upper"
chmod --reference=/ "$base/upper"
printf '%s\n' "$mid" > "$base/upper/etc/machine-id"
chmod 0444 "$base/upper/etc/machine-id"
mount -t overlay -o "lowerdir=/,upperdir=$base/upper,workdir=$base/work" mmleaktest "$base/root"
exec "$@"
"""


class Unavailable(Exception):
    """The box cannot run here; the message is the one-line reason (tests skip with it)."""


def start_time(pid):
    """Field 22 of /proc/PID/stat (clock ticks since boot), or None if PID is gone (or a
    zombie: a killed pytest whose parent has not reaped it yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_parents():
    """Directories of our own cgroup in the hierarchies systemd-nspawn uses (cgroup2, and the
    named name=systemd v1 hierarchy on a hybrid or legacy host)."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and ctrls == "":
                own["cgroup2"] = path
            elif "name=systemd" in ctrls.split(","):
                own["systemd"] = path
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields, rfields = left.split(), right.split()
            root, mnt, fstype, opts = fields[3], fields[4], rfields[0], rfields[2].split(",")
            kind = "cgroup2" if fstype == "cgroup2" else \
                "systemd" if fstype == "cgroup" and "name=systemd" in opts else None
            if kind in own and not any(k == kind for k, _ in out):
                path = own[kind]
                rel = path[len(root):] if path.startswith(root) else path
                out.append((kind, os.path.normpath(mnt + "/" + rel.lstrip("/"))))
    return [d for _, d in out]


def why_not():
    """None if a box can boot here, else the reason."""
    if os.geteuid() != 0:
        return "needs root (mounts, systemd-nspawn)"
    for tool, pkg in (("systemd-nspawn", "systemd-container"), ("nsenter", "util-linux"),
                      ("unshare", "util-linux"), ("mount", "mount")):
        if shutil.which(tool, path=ENV["PATH"]) is None:
            return "%s not installed (Debian package %s)" % (tool, pkg)
    if not any(os.access(p, os.X_OK) for p in ("/usr/lib/systemd/systemd",
                                               "/lib/systemd/systemd")):
        return "no systemd to boot (/usr/lib/systemd/systemd missing)"
    if not cgroup_parents():
        return "no cgroup2 or name=systemd cgroup hierarchy mounted for systemd-nspawn"
    probe = ("d=$(mktemp -d) && mount -t tmpfs none $d && mkdir $d/u $d/w $d/m && "
             "mount -t overlay -o lowerdir=/,upperdir=$d/u,workdir=$d/w none $d/m; r=$?; "
             "umount -R $d 2>/dev/null; rmdir $d; exit $r")
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                        probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, env=ENV)
    if p.returncode != 0:
        return "cannot mount an overlay of / on a tmpfs in a private mount namespace: %s" % (
            " ".join(p.stdout.split()) or "exit %d" % p.returncode)
    return None


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _kill_cgroup(cg, deadline):
    """SIGKILL every process in cgroup directory CG and below until it is empty."""
    while True:
        pids = set()
        for d, _, _ in os.walk(cg):
            for line in (_read(os.path.join(d, "cgroup.procs")) or "").split():
                pids.add(int(line))
        if not pids or time.monotonic() > deadline:
            return not pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


class Backoff:
    """The pause between two polls that each start a command in the box (systemctl,
    journalctl: 36 to 42 ms of CPU a call, nsenter's included, measured at load 12): 50 ms
    at first, as a unit or a line is mostly there soon, then half as long again each time,
    up to 250 ms: a wait that lasts (the machine busy) no longer starts 10 to 20 commands a
    second, 40 % of a core spent beside the box while it is short of it."""

    def __init__(self, first=0.05, most=0.25):
        self.pause, self.most = first, most

    def __call__(self):
        time.sleep(self.pause)
        self.pause = min(self.most, self.pause * 1.5)


def remove_leftovers(name):
    """Remove everything box NAME left on the host (its processes included). Returns the
    list of what could not be removed, as messages."""
    problems = []
    sdir = os.path.join(STATE, name)
    ledger = {}
    for line in (_read(os.path.join(sdir, "ledger")) or "").splitlines():
        key, _, val = line.partition(" ")
        ledger.setdefault(key, []).append(val)
    deadline = time.monotonic() + 10
    for cg in ledger.get("cgroup", []):
        if not os.path.isdir(cg):
            continue
        if not _kill_cgroup(cg, deadline):
            problems.append("processes left in cgroup %s" % cg)
            continue
        for d, _, _ in os.walk(cg, topdown=False):
            try:
                os.rmdir(d)
            except OSError as e:
                problems.append("rmdir %s: %s" % (d, e.strerror))
    prop = os.path.join(NSPAWN_RUN, "propagate", name)
    if os.path.lexists(prop):
        shutil.rmtree(prop, ignore_errors=True)
        if os.path.lexists(prop):
            problems.append("cannot remove %s" % prop)
    for lock in ledger.get("lock", []):
        try:
            os.unlink(lock)
        except FileNotFoundError:
            pass
        except OSError as e:
            problems.append("unlink %s: %s" % (lock, e.strerror))
    # directories nspawn created for this box (deepest first), when nothing else uses them
    for d in sorted(ledger.get("created", []), key=len, reverse=True):
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # not empty: another nspawn uses it now
    if os.path.isdir(sdir):
        shutil.rmtree(sdir, ignore_errors=True)
        if os.path.isdir(sdir):
            problems.append("cannot remove %s" % sdir)
    try:
        os.rmdir(STATE)
    except OSError:
        pass
    return problems


def sweep():
    """Remove the leftovers of boxes whose pytest process is gone."""
    try:
        names = os.listdir(STATE)
    except FileNotFoundError:
        return []
    problems = []
    for n in names:
        m = re.match(re.escape(PREFIX) + r"(\d+)-(\d+)-\d+$", n)
        if not m:
            continue
        if start_time(int(m.group(1))) == int(m.group(2)):
            continue  # its pytest is alive: a concurrent run
        problems += remove_leftovers(n)
    return problems


_counter = [0]


def _pdeathsig_and_cgroups(cgroups):
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec():
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        for cg in cgroups:
            try:
                with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                    f.write("0\n")
            except OSError as e:  # stderr is the console log: Box turns this into a skip
                os.write(2, ("%s %s: %s\n" % (CGROUP_MOVE_FAILED, cg, e.strerror)).encode())
                os._exit(CGROUP_MOVE_EXIT)
    return preexec


class BoxTimeout(subprocess.TimeoutExpired):
    """A command in the box did not end in time; its message says what the box was doing."""
    def __init__(self, cmd, timeout, box_state):
        super().__init__(cmd, timeout)
        self.box_state = box_state

    def __str__(self):
        return "%s\n%s" % (super().__str__(), self.box_state)


class Box:
    def __init__(self, bind_ro=(), boot_timeout=60):
        reason = why_not()
        if reason:
            raise Unavailable(reason)
        sweep()
        _counter[0] += 1
        me = os.getpid()
        self.name = "%s%d-%d-%d" % (PREFIX, me, start_time(me), _counter[0])
        self.dir = os.path.join(STATE, self.name)
        self.leader = None
        self.pid1 = None
        self.cgroups = []
        self.log = os.path.join(self.dir, "console.log")
        os.makedirs(self.dir, mode=0o700)
        mnt = os.path.join(self.dir, "mnt")
        os.mkdir(mnt, 0o700)
        missing = [d for d in (os.path.dirname(NSPAWN_RUN), NSPAWN_RUN,
                               NSPAWN_RUN + "/propagate", NSPAWN_RUN + "/locks")
                   if not os.path.isdir(d)]
        try:
            for parent in cgroup_parents():
                cg = os.path.join(parent, self.name)
                self._note("cgroup", cg)
                try:
                    os.mkdir(cg)
                except OSError as e:
                    raise Unavailable("cannot create a cgroup in %s: %s" % (parent, e.strerror))
                self.cgroups.append(cg)
            for d in missing:
                self._note("created", d)
            nspawn = ["systemd-nspawn", "--quiet", "--settings=no", "--directory",
                      mnt + "/root", "--machine", self.name, "--boot", "--register=no",
                      "--keep-unit", "--private-network", "--link-journal=no"]
            nspawn += ["--bind-ro=%s" % d for d in bind_ro]
            nspawn += ["--", "systemd.unit=basic.target", "systemd.mask=timers.target"]
            with open(self.log, "wb") as log:
                self.leader = subprocess.Popen(
                    ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", LAUNCH,
                     "launch", mnt, uuid.uuid4().hex] + nspawn,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=ENV,
                    start_new_session=True, preexec_fn=_pdeathsig_and_cgroups(self.cgroups))
            self._wait_boot(boot_timeout)
        except BaseException:
            self.close()
            raise

    def _note(self, key, value):
        with open(os.path.join(self.dir, "ledger"), "a") as f:
            f.write("%s %s\n" % (key, value))

    def console(self, tail=3000):
        return (_read(self.log) or "")[-tail:]

    def _find_pid1(self):
        kids = (_read("/proc/%d/task/%d/children" % (self.leader.pid, self.leader.pid))
                or "").split()
        for k in kids:
            st = _read("/proc/%s/status" % k) or ""
            m = re.search(r"^NSpid:\s+(\d+)\s+1$", st, re.M)
            # the container's init once it has exec'd systemd: its mount namespace is final
            if m and (_read("/proc/%s/comm" % k) or "").strip() == "systemd":
                return int(k)
        return None

    def _wait_boot(self, timeout):
        deadline = time.monotonic() + timeout
        while self.pid1 is None:
            if self.leader.poll() is not None:
                first = self.console().partition("\n")[0]
                if self.leader.returncode == CGROUP_MOVE_EXIT and \
                        first.startswith(CGROUP_MOVE_FAILED):
                    raise Unavailable(first)
                raise RuntimeError("systemd-nspawn exited %d before the box booted:\n%s"
                                   % (self.leader.returncode, self.console()))
            if time.monotonic() > deadline:
                raise RuntimeError("box %s: no systemd in the container after %ds:\n%s"
                                   % (self.name, timeout, self.console()))
            self.pid1 = self._find_pid1()
            if self.pid1 is None:
                time.sleep(0.05)
        root = os.stat("/proc/%d/root/" % self.pid1)
        if (root.st_dev, root.st_ino) == (os.stat("/").st_dev, os.stat("/").st_ino):
            raise RuntimeError("box %s: PID %d has the host's root" % (self.name, self.pid1))
        # nspawn's lock on the image directory (the overlay's root), removed on a clean exit
        self._note("lock", "%s/locks/inode-%d:%d" % (NSPAWN_RUN, root.st_dev, root.st_ino))
        while True:
            # Not yet booted, however slow the machine: "offline" (and exit 1 at once) while
            # systemd, though exec'd, has not made /run/systemd/system, which is how systemctl
            # tells a booted system (sd_booted; a CI machine once asked in that window);
            # "Failed to connect to bus" (nothing on stdout) until it listens on
            # /run/systemd/private. Only the deadline ends the wait on those.
            left = max(1.0, deadline - time.monotonic())
            r = self.run(["systemctl", "is-system-running", "--wait"], check=False,
                         timeout=left)
            if r.stdout.strip() not in ("", "offline") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if r.stdout.strip() not in ("running", "degraded"):
            raise RuntimeError("box %s did not boot (is-system-running: %s %s):\n%s" % (
                self.name, r.stdout.strip(), r.stderr.strip(), self.console()))

    # ---- the API ---------------------------------------------------------------------------

    def alive(self):
        return self.leader is not None and self.leader.poll() is None and self.pid1 is not None

    def run(self, cmd, check=True, timeout=60, input=None):
        """Run CMD (a list, or a string for /bin/sh -c) inside as root; CompletedProcess with
        text stdout and stderr. check=True: AssertionError when it exits non-zero."""
        if not self.alive():
            raise RuntimeError("box %s is not running:\n%s" % (self.name, self.console()))
        argv = list(cmd) if not isinstance(cmd, str) else ["/bin/sh", "-c", cmd]
        try:
            r = subprocess.run(["nsenter", "-t", str(self.pid1), "-m", "-u", "-i", "-n", "-p",
                                "-r", "-w", "--"] + argv, input=input, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, env=ENV,
                               timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired as e:
            # what the box was doing, read from the host (the command may be waiting for
            # PID 1, so nothing here asks PID 1): in the error, for a CI log
            raise BoxTimeout(e.cmd, e.timeout, self.state()) from None
        if check and r.returncode != 0:
            raise AssertionError("in box %s: %s exited %d\nstdout: %s\nstderr: %s" % (
                self.name, argv, r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
        return r

    def reload(self, timeout=90):
        """systemctl daemon-reload. Once, on a CI machine, a reload did not answer in 60 s
        right after another one had (300 in a row answer in 0.3 to 0.5 s here; the cause is
        not known): if it does not answer in TIMEOUT, what
        PID 1 and the box were doing goes to stderr (pytest shows it with the test) and the
        reload is asked once more; a second silence fails with both states."""
        try:
            return self.run(["systemctl", "daemon-reload"], timeout=timeout)
        except BoxTimeout as e:
            first = e.box_state
        sys.stderr.write("box %s: systemctl daemon-reload did not answer in %ds; asked "
                         "again. The box then:\n%s\n" % (self.name, timeout, first))
        try:
            return self.run(["systemctl", "daemon-reload"], timeout=timeout)
        except BoxTimeout as e:
            raise AssertionError("box %s: systemctl daemon-reload did not answer twice in %ds."
                                 "\nThe first time:\n%s\nThe second:\n%s" % (
                                     self.name, timeout, first, e.box_state))

    def state(self):
        """What the box is doing, read from the host's /proc (asks nothing inside): every
        process of the box with its state and kernel wait channel, PID 1's kernel stack,
        and the console's tail."""
        lines = []
        try:
            pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        except OSError:
            pids = []
        try:
            ns = os.readlink("/proc/%d/ns/pid" % self.pid1)
        except OSError:
            ns = None
        for pid in pids:
            try:
                if ns is None or os.readlink("/proc/%d/ns/pid" % pid) != ns:
                    continue
            except OSError:
                continue
            st = _read("/proc/%d/stat" % pid) or ""
            state = st.rpartition(")")[2].split()[:1]
            lines.append("  %7d %s %-24s %s" % (
                pid, state[0] if state else "?", (_read("/proc/%d/wchan" % pid) or "").strip(),
                (_read("/proc/%d/cmdline" % pid) or "").replace("\0", " ").strip()[:100]))
        stack = _read("/proc/%d/stack" % self.pid1) or "(no kernel stack readable)\n"
        return "processes (pid, state, wait channel, command):\n%s\nPID 1's kernel stack:\n" \
            "%s\nconsole:\n%s" % ("\n".join(lines), stack, self.console(1500))

    def path(self, p):
        """Host path of P inside the box (through /proc/PID1/root: the container's view,
        its own /run, /tmp and /proc included)."""
        assert p.startswith("/"), p
        return "/proc/%d/root%s" % (self.pid1, p)

    def wait_active(self, unit, timeout=30):
        """Wait until UNIT is active; return its MainPID (in the box's pid namespace)."""
        deadline = time.monotonic() + timeout
        nap = Backoff()
        while True:
            state = self.run(["systemctl", "is-active", unit], check=False).stdout.strip()
            if state == "active":
                pid = self.run(["systemctl", "show", "-p", "MainPID", "--value", unit])
                return int(pid.stdout)
            if state == "failed" or time.monotonic() > deadline:
                raise AssertionError("%s is %s:\n%s\n%s" % (
                    unit, state, self.run(["systemctl", "status", "--no-pager", unit],
                                          check=False).stdout,
                    self.journal(unit)))
            nap()

    def wait_file(self, p, timeout=30, content=None):
        """Wait until file P exists inside (and holds CONTENT, if given); return its text."""
        deadline = time.monotonic() + timeout
        while True:
            text = _read(self.path(p))
            if text is not None and (content is None or text == content):
                return text
            if time.monotonic() > deadline:
                raise AssertionError("box %s: %s %s after %ds" % (
                    self.name, p, "missing" if text is None else "holds %r" % text, timeout))
            time.sleep(0.05)

    def journal(self, unit):
        return self.run(["journalctl", "--no-pager", "-o", "cat", "-u", unit],
                        check=False).stdout[-3000:]

    def close(self):
        """Power off (SIGRTMIN+4 to its systemd), kill what is left, remove what the box
        left on the host. Raises if something could not be removed."""
        if self.leader is not None and self.leader.poll() is None:
            if self.pid1 is not None and self._find_pid1() == self.pid1:
                try:
                    os.kill(self.pid1, signal.SIGRTMIN + 4)
                except ProcessLookupError:
                    pass
                try:
                    self.leader.wait(20)
                except subprocess.TimeoutExpired:
                    pass
            if self.leader.poll() is None:
                for cg in self.cgroups:
                    _kill_cgroup(cg, time.monotonic() + 5)
                self.leader.kill()
                self.leader.wait(10)
        self.pid1 = None
        problems = remove_leftovers(self.name)
        if problems:
            raise RuntimeError("box %s: %s" % (self.name, "; ".join(problems)))
