"""The ptrace injector (tools/inject.c, mmleak_inject_call in mmleak-tools.so) on real processes.

Every target is a real process (tests/inject_target.c modes, a C++ program, Debian's
python3, a non-PIE and a static build) that prints "ready" once in place and, at the end,
what it saw: each test checks the injection's result, that the library is mapped, and
that the target then carries on exactly as without the injection (a restarted read gets
its data, a nanosleep neither ends early nor fails, registers and signal dispositions are
intact, signals sent meanwhile are all delivered).  Failures must come back as one line,
with the target left as it was."""
import collections
import ctypes
import errno
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from conftest import PYTHON_SIDE, ROOT, TESTS, mmleak

CLI = os.path.join(TESTS, "inject_cli.py")
ABI = 1
EINVAL, ESRCH, EPERM, EUNSUPP, EBUSY, ELOAD, ECALL = -1, -2, -3, -4, -5, -6, -7
NR_READ, NR_NANOSLEEP, NR_RESTART_SYSCALL, NR_CLOCK_NANOSLEEP = 0, 35, 219, 230  # x86-64
# The line of inject_target's sleep (and segvblock, undumpable, mainexit) once the test ends its
# nanosleep with SIGUSR1 (Target.end_sleep): it ended at our signal, not before, and the time
# it slept plus the time it had left is the time it asked for (see inject_target.c).
SLEPT = "nanosleep -1 EINTR at_signal slept_enough\n"


@pytest.fixture(scope="module")
def ib(tmp_path_factory, lib):
    """Test programs and libraries, compiled once."""
    d = tmp_path_factory.mktemp("inject")
    out = {"dir": str(d)}

    def cc(name, src, *extra, compiler="cc"):
        exe = str(d / name)
        subprocess.run([compiler, "-O1", "-g", "-o", exe, os.path.join(TESTS, src)] +
                       list(extra), check=True)
        out[name] = exe
    cc("target", "inject_target.c", "-pthread", "-ldl")
    cc("target_nopie", "inject_target.c", "-pthread", "-ldl", "-no-pie", "-fno-pie")
    cc("target_cxx", "inject_target_cxx.cpp", "-std=c++17", "-pthread", compiler="c++")
    cc("libinject.so", "inject_lib.c", "-shared", "-fPIC")
    cc("libslowctor.so", "inject_slowctor.c", "-shared", "-fPIC")
    cc("inject_clock", "inject_clock.c", "-rdynamic", "-pthread", "-ldl")
    r = subprocess.run(["cc", "-O1", "-static", "-o", str(d / "target_static"),
                        os.path.join(TESTS, "inject_target.c"), "-pthread"],
                       capture_output=True, text=True)
    out["target_static"] = str(d / "target_static") if r.returncode == 0 else None
    out["static_why"] = r.stderr[-300:]
    return out


_fn = None


# The injector's timeout where a test does not judge it: long enough for a loaded machine
# (a timeout that a test expects is given small, explicitly)
LONG_MS = 30000


def inject(pid, lib, func, arg=None, timeout_ms=LONG_MS):
    """mmleak_inject_call in this process: (code, result, err)."""
    global _fn
    if _fn is None:
        assert mmleak.native.INJECT_ABI == ABI
        _fn = mmleak.native.inject_call()       # it checks the library's ABI
    res = ctypes.c_long(0)
    err = ctypes.create_string_buffer(1024)
    enc = lambda s: None if s is None else s.encode()
    rc = _fn(pid, enc(lib), enc(func), enc(arg), timeout_ms, ctypes.byref(res), err, len(err))
    return rc, res.value, err.value.decode()


_within = None


def inject_within(pid, lib, func, arg, search_ms, total_ms):
    """mmleak_inject_call_within in this process: (code, result, err)."""
    global _within
    if _within is None:
        _within = ctypes.CDLL(os.path.join(ROOT, "mmleak-tools.so")).mmleak_inject_call_within
        _within.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                            ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_long),
                            ctypes.c_char_p, ctypes.c_size_t]
        _within.restype = ctypes.c_int
    res = ctypes.c_long(0)
    err = ctypes.create_string_buffer(1024)
    enc = lambda s: None if s is None else s.encode()
    rc = _within(pid, enc(lib), enc(func), enc(arg), search_ms, total_ms, ctypes.byref(res), err,
                 len(err))
    return rc, res.value, err.value.decode()


class Target:
    """A process started with stdin and stdout pipes; waits for its "ready" line."""

    def __init__(self, argv, env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=e)
        self.pid = self.p.pid
        line = self.p.stdout.readline()
        assert line == b"ready\n", (line, self.p.stderr.read() if self.p.poll() else "")

    def wait_syscall(self, *nrs):
        """Wait until the main thread sleeps in one of the system calls NRS ("ready" comes
        just before it enters it)."""
        for _ in range(3000):
            with open("/proc/%d/syscall" % self.pid) as f:
                if f.read().split()[0] in [str(n) for n in nrs]:
                    return
            time.sleep(0.01)
        raise AssertionError("%d is not in system call %s" % (self.pid, nrs))

    def end_sleep(self):
        """Once a thread of the target sleeps (nanosleep, or its restart after an injection,
        a stop or a tracer), end that sleep with SIGUSR1: the rest of the output and the exit
        status.  The sleep lasts until then (an hour), whatever the machine's speed; the
        wait first makes sure the signal does not come before the sleep began (it would
        then last the hour)."""
        nrs = {str(n) for n in (NR_NANOSLEEP, NR_CLOCK_NANOSLEEP, NR_RESTART_SYSCALL)}
        for _ in range(3000):
            calls = []
            for tid in os.listdir("/proc/%d/task" % self.pid):
                try:
                    with open("/proc/%d/task/%s/syscall" % (self.pid, tid)) as f:
                        calls.append(f.read().split()[0])
                except OSError:
                    pass                                # a thread that just ended
            if nrs & set(calls):
                return self.finish(sig=signal.SIGUSR1)
            time.sleep(0.01)
        raise AssertionError("no thread of %d sleeps in nanosleep" % self.pid)

    def maps(self):
        out = ""
        for t in os.listdir("/proc/%d/task" % self.pid):
            with open("/proc/%d/task/%s/maps" % (self.pid, t)) as f:
                out += f.read()
        return out

    def alive(self):
        return self.p.poll() is None

    def until(self, want, timeout=LONG_MS / 1000):
        """Its output up to the line WANT: the lines before it (TIMEOUT: a bound for a
        failing test, not a measure)."""
        got = []

        def read():
            for line in iter(self.p.stdout.readline, b""):
                if line.decode() == want:
                    return
                got.append(line.decode())
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        assert not reader.is_alive(), "no %r in %d s, only %r" % (want, timeout, got)
        return got

    def finish(self, data=b"", sig=None, timeout=30):
        """Send DATA (then EOF) and/or SIG; the rest of the output and the exit status."""
        assert self.alive(), "target exited early: %r" % (self.p.stderr.read(),)
        if sig:
            os.kill(self.pid, sig)
        out, err = self.p.communicate(data, timeout=timeout)
        return out.decode(), self.p.returncode

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.communicate()


@pytest.fixture
def targets():
    started = []

    def start(argv, env=None):
        t = Target(argv, env)
        started.append(t)
        return t
    yield start
    for t in started:
        t.kill()


def records(path):
    with open(path) as f:
        return f.read().splitlines()


def test_abi_and_arguments(ib, targets):
    t = targets([ib["target"], "sleep"])
    assert inject(t.pid, "libinject.so", "inject_record", "x") == (
        EINVAL, 0, "the library must be an absolute path: libinject.so")
    assert inject(os.getpid(), ib["libinject.so"], "inject_record", "x") == (
        EINVAL, 0, "%d is this process itself" % os.getpid())
    assert inject(0, ib["libinject.so"], "inject_record", "x") == (
        EINVAL, 0, "no such process 0")
    assert inject(t.pid, ib["libinject.so"], "inject_record", "x" * 9000)[0] == EINVAL
    assert "libinject.so" not in t.maps()
    assert t.end_sleep() == (SLEPT, 0)


def test_sleeping_process(ib, targets, tmp_path):
    """nanosleep: interrupted, then restarted for the time left (not ended early, no EINTR).
    The target's sleep lasts until the test ends it with SIGUSR1 after the injections
    (end_sleep), so no machine is too slow for it; that the restart went on for the time
    left is then read from the nanosleep itself: it ended only at our signal (not at an
    injection: "at_signal"), and the time it slept plus the REM it returned make at least
    the hour it asked for ("slept_enough": a restart for less than the time left, such as
    none or an abandoned call's own sleep, falls short of it)."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "sleep"])
    t.wait_syscall(NR_CLOCK_NANOSLEEP, NR_NANOSLEEP)
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, t.pid)]
    assert ib["libinject.so"] in t.maps()
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert records(rec)[1] == "pid %d tid %d loads 1 calls 2" % (t.pid, t.pid)
    assert t.end_sleep() == (SLEPT, 0)


def test_read_restarts_and_gets_its_data(ib, targets, tmp_path):
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "read"])
    t.wait_syscall(NR_READ)
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert ib["libinject.so"] in t.maps()
    assert t.finish(b"hello\n") == ("read 6 hello\nusr1 0 usr2 0 rt 0 values 0\n", 0)


def test_epoll_wait_returns_eintr_as_under_a_debugger(ib, targets, tmp_path):
    """epoll_wait is never restarted by the kernel once interrupted (signal(7)): like under
    gdb, strace or after SIGSTOP/SIGCONT, it returns EINTR once; the program goes on."""
    t = targets([ib["target"], "epoll"])
    t.wait_syscall(232, 281)    # epoll_wait, epoll_pwait
    assert inject(t.pid, ib["libinject.so"], "inject_record", str(tmp_path / "rec")) == (
        0, 4242, "")
    assert t.finish(b"data\n") == ("epoll_wait -1 EINTR\nepoll_wait 1 0\nread 5 data\n", 0)


def test_signals_sent_during_the_call_are_delivered(ib, targets):
    """kill(SIGUSR1), raise(SIGUSR2) and two queued SIGRTMIN (values 11, 22) from inside the
    injected call: all reach the handlers, once each, the queued ones with their values."""
    t = targets([ib["target"], "read"])
    t.wait_syscall(NR_READ)
    assert inject(t.pid, ib["libinject.so"], "inject_signals") == (0, 7, "")
    assert t.finish(b"x\n") == ("read 2 x\nusr1 1 usr2 1 rt 2 values 1122\n", 0)


def test_no_signal_lost_or_doubled_under_a_stream_of_signals(ib, targets, tmp_path):
    """Another thread queues SIGRTMIN+1 to the target (each one counts: real-time signals
    are not merged) all along the injections, 10 of them or more, until at least 100 signals
    went (a count, not a time: on a loaded machine the sender once sent only 48 in the time
    of 10 injections); the target's handler sees every one once."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "rtcount"])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    sig = signal.SIGRTMIN + 1
    sent = [0]
    done = threading.Event()

    def send():
        while not done.is_set():
            if libc.sigqueue(t.pid, sig, None) == 0:
                sent[0] += 1
            else:
                assert ctypes.get_errno() == errno.EAGAIN
            time.sleep(0.0002)
    th = threading.Thread(target=send)
    th.start()
    try:
        time.sleep(0.05)
        calls = 0
        while calls < 10 or (sent[0] <= 100 and th.is_alive()):
            assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
            calls += 1
    finally:
        done.set()
        th.join()
    assert len(records(rec)) == calls and sent[0] > 100
    time.sleep(0.2)
    assert t.finish(b"end\n") == ("read 4 end rt %d\n" % sent[0], 0)


def test_a_burst_of_queued_signals_during_the_call_is_all_delivered_in_order(ib, targets):
    """The injected call queues 300 SIGRTMIN+1 (values 1 to 300) to its own process: each
    stops the thread while the call runs and is kept by the injector (the injector held
    only 64 once: the others were lost); all reach the handler when the thread is let go,
    once each, with their values, in the order they were sent."""
    t = targets([ib["target"], "rtcount"])
    assert inject(t.pid, ib["libinject.so"], "inject_rtburst", "300") == (0, 300, "")
    assert t.finish(b"end\n") == ("read 4 end rt 300\nvalues 300 in order\n", 0)


def test_result_is_all_of_rax_and_null_func_returns_the_handle(ib, targets):
    t = targets([ib["target"], "sleep"])
    assert inject(t.pid, ib["libinject.so"], "inject_long") == (0, -0x123456789abcdef, "")
    rc, handle, err = inject(t.pid, ib["libinject.so"], None)
    assert (rc, err) == (0, "") and handle > 4096
    assert t.end_sleep() == (SLEPT, 0)


def test_busy_user_code_keeps_its_registers(ib, targets, tmp_path):
    """A thread never in a system call: used where it runs; its SSE registers (the running
    sum), x87 and MXCSR control words survive a call that clobbers them all."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "busy"])
    for _ in range(3):
        assert inject(t.pid, ib["libinject.so"], "inject_clobber") == (0, 5, "")
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, t.pid)]
    assert t.finish(sig=signal.SIGUSR1) == ("busy same\n", 0)


def test_four_threads_busy_in_malloc_twenty_times(ib, targets, tmp_path):
    """4 threads (main included) in malloc/free all the time: no deadlock, 20 in a row."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "threads", "4"])
    tids = set(os.listdir("/proc/%d/task" % t.pid))
    assert len(tids) == 4
    for i in range(20):
        assert inject(t.pid, ib["libinject.so"], "inject_record", rec, 10000) == (0, 4242, "")
        assert t.alive()
    lines = records(rec)
    assert len(lines) == 20
    for i, line in enumerate(lines, 1):
        m = re.fullmatch(r"pid (\d+) tid (\d+) loads 1 calls (\d+)", line)
        assert m and int(m.group(1)) == t.pid and m.group(2) in tids and int(m.group(3)) == i
    assert t.finish(sig=signal.SIGUSR1) == ("threads 4 ok\n", 0)


def test_main_thread_exited(ib, targets, tmp_path):
    """The main thread called pthread_exit (a zombie leader): the other thread is used."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "mainexit"])
    wait_status(t.pid, "State:\tZ")
    others = [int(x) for x in os.listdir("/proc/%d/task" % t.pid) if int(x) != t.pid]
    assert len(others) == 1
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, others[0])]
    assert t.end_sleep() == (SLEPT, 0)


def test_cxx_program(ib, targets, tmp_path):
    rec = str(tmp_path / "rec")
    t = targets([ib["target_cxx"]])
    for i in range(3):
        assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert [l.split()[-1] for l in records(rec)] == ["1", "2", "3"]
    assert ib["libinject.so"] in t.maps()
    assert t.finish(b"hi\n") == ("line hi\nworker ok\n", 0)


def test_python_and_mmleak_tools_so(ib, targets, tmp_path):
    """Debian's /usr/bin/python3 (not position-independent: ELF type EXEC) waiting on
    stdin; mmleak-tools.so itself loads there and answers mmleak_shrink_abi."""
    rec = str(tmp_path / "rec")
    t = targets(["/usr/bin/python3", "-c", "import sys; print('ready', flush=True); "
                 "print('got', sys.stdin.readline().strip())"])
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, t.pid)]
    so = os.path.join(ROOT, "mmleak-tools.so")
    # the interface version mmleak.py checks (the C code reads the files the callback opens)
    assert inject(t.pid, so, "mmleak_shrink_abi") == (0, mmleak.NATIVE_ABI, "")
    assert so in t.maps()
    assert t.finish(b"there\n") == ("got there\n", 0)


def test_non_pie_program(ib, targets):
    t = targets([ib["target_nopie"], "sleep"])
    assert inject(t.pid, ib["libinject.so"], "inject_long") == (0, -0x123456789abcdef, "")
    assert ib["libinject.so"] in t.maps()
    assert t.end_sleep() == (SLEPT, 0)


def sig_fields(pid):
    """The SigBlk, SigCgt and SigIgn lines of PID's status: its signal mask and handlers."""
    with open("/proc/%d/status" % pid) as f:
        return [l for l in f.read().splitlines() if l.startswith(("SigBlk", "SigCgt", "SigIgn"))]


def test_sigsegv_blocked_ends_the_call_with_an_int3(ib, targets, tmp_path):
    """SIGSEGV blocked (a forced fault would reset its handler): SIGTRAP is used instead;
    handler and mask are as before."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "segvblock"])
    before = sig_fields(t.pid)
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert sig_fields(t.pid) == before
    assert t.end_sleep() == (SLEPT + "handler kept blocked kept\n", 0)


def test_sigsegv_and_sigtrap_blocked_ends_the_call_in_a_system_call(ib, targets, tmp_path):
    """SIGSEGV and SIGTRAP blocked (it was refused at the timeout): the call returns to a
    `syscall` instruction of libc's, seen under PTRACE_SYSCALL; twice; handler, mask and the
    interrupted nanosleep (restarted by hand: no signal goes to user space) as before."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "segvblock", "trap"])
    t.wait_syscall(NR_CLOCK_NANOSLEEP, NR_NANOSLEEP)
    before = sig_fields(t.pid)
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert inject(t.pid, ib["libinject.so"], "inject_long", None) == (0, -0x123456789abcdef, "")
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, t.pid)]
    assert sig_fields(t.pid) == before
    assert t.end_sleep() == (SLEPT + "handler kept blocked kept\n", 0)


def test_every_signal_blocked_read_restarts(ib, targets, tmp_path):
    """A thread that blocks every signal (a daemon that takes them with sigwait or signalfd),
    asleep in read(): injected, and its read restarted and given its data."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "blockread"])
    t.wait_syscall(NR_READ)
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, t.pid)]
    t.wait_syscall(NR_READ)
    assert t.finish(b"hello\n") == ("read 6 hello\n", 0)


def test_waits_while_the_loader_lock_is_held(ib, targets):
    """Main is in a library constructor (inside dlopen) until the test writes to its stdin;
    another thread sleeps in nanosleep.  dlopen anywhere would wait for the loader's lock:
    refused at the timeout, naming the holder; the program's own dlopen then completes."""
    t = targets([ib["target"], "ctor", ib["libslowctor.so"]])
    t.wait_syscall(NR_READ)     # main: in the constructor's read of stdin
    assert inject(t.pid, ib["libinject.so"], "inject_record", "x", 500) == (
        EBUSY, 0, "timed out after 500 ms waiting for a thread of %d that is safe to use "
        "(thread %d holds the dynamic loader's lock: a dlopen, dlclose or library constructor "
        "that does not return)" % (t.pid, t.pid))
    assert "libinject.so" not in t.maps()
    assert t.finish(b"go") == ("dlopen ok\n", 0)


def test_one_deadline_for_the_search_and_the_calls(ib, targets):
    """mmleak_inject_call_within: the search and the calls end by one deadline, TOTAL_MS from
    the start.  The injector runs on a clock the test moves (tests/inject_clock.c: it stands
    still meanwhile), so what it does at each time does not depend on the machine's speed.
    The loader's lock is held (main in a library constructor) while the clock goes to 8 s:
    the search goes on (SEARCH_MS 8.6 s).  The lock freed, the call begins (it sleeps an
    hour): still running at 8.999 s, abandoned at 9 s, the total.  A timeout of its own (as
    mmleak_inject_call gives the calls) would end it at 16.6 s.  The target carries on."""
    t = targets([ib["target"], "ctor", ib["libslowctor.so"]])
    t.wait_syscall(NR_READ)         # main: in the constructor's read of stdin
    d = subprocess.Popen([ib["inject_clock"], os.path.join(ROOT, "mmleak-tools.so"), str(t.pid),
                          ib["libinject.so"], "inject_tell_sleep", "-", "8600", "9000"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        def clock(ms):
            """Move the injector's clock to MS after its start: what it said."""
            d.stdin.write("%d\n" % ms)
            d.stdin.flush()
            return d.stdout.readline()
        assert clock(8000) == "at 8000\n"      # looked at the clock at 8 s: still searching
        assert "libinject.so" not in t.maps()
        t.p.stdin.write(b"g")                   # the constructor returns: the lock is free
        t.p.stdin.flush()
        # the call begins, in either thread: main's "dlopen ok" may come after it (the call
        # made in main, stopped anywhere after its dlopen), even after it was abandoned
        before = t.until("called\n")
        assert clock(8999) == "at 8999\n"      # the call runs on 1 ms before the total
        out, _ = d.communicate("9000\n", timeout=LONG_MS / 1000)
    finally:
        if d.poll() is None:
            d.kill()
            d.communicate()
    last = out.splitlines()[-1]
    assert re.fullmatch(
        r"error %d inject_tell_sleep did not return within the timeout in thread \d+ of %d: the "
        r"call was abandoned and the thread put back where it was, but %d may hold locks the "
        r"call took at 9000" % (ECALL, t.pid, t.pid), last), out
    rest, status = t.finish()
    assert ("".join(before) + rest, status) == ("dlopen ok\n", 0)


def test_dlopen_error_comes_back(ib, targets, tmp_path):
    t = targets([ib["target"], "sleep"])
    missing = str(tmp_path / "libnope.so")
    assert inject(t.pid, missing, "f") == (
        ELOAD, 0, "dlopen failed in %d: %s: cannot open shared object file: No such file or "
        "directory" % (t.pid, missing))
    assert inject(t.pid, ib["libinject.so"], "no_such_function") == (
        ELOAD, 0, "dlsym failed in %d: %s: undefined symbol: no_such_function"
        % (t.pid, ib["libinject.so"]))
    assert t.end_sleep() == (SLEPT, 0)


def test_crash_in_the_call_is_abandoned(ib, targets):
    t = targets([ib["target"], "sleep"])
    rc, res, err = inject(t.pid, ib["libinject.so"], "inject_crash")
    assert (rc, res) == (ECALL, 0)
    assert re.fullmatch(
        r"inject_crash crashed in thread %d of %d \(SIGSEGV at rip 0x[0-9a-f]+, address 0x10\): "
        r"the call was abandoned and the thread put back where it was, but %d may hold locks "
        r"the call took" % (t.pid, t.pid, t.pid), err), err
    assert t.end_sleep() == (SLEPT, 0)


def test_call_that_does_not_return_is_abandoned(ib, targets):
    """The call sleeps 60 s: abandoned at the timeout; the target's own nanosleep, whose
    kernel restart record the call's interrupted sleep replaced, restarts from its start (an
    hour) rather than resuming the call's 60 s sleep: when the test ends it, the time slept
    plus the time left is at least the hour ("slept_enough"; resuming the call's sleep would
    leave at most 60 s: "SHORT"), and it had not ended before ("at_signal")."""
    t = targets([ib["target"], "sleep"])
    t.wait_syscall(NR_CLOCK_NANOSLEEP, NR_NANOSLEEP)
    assert inject(t.pid, ib["libinject.so"], "inject_sleep", "60", 400) == (
        ECALL, 0, "inject_sleep did not return within the timeout in thread %d of %d: the call "
        "was abandoned and the thread put back where it was, but %d may hold locks the call "
        "took" % (t.pid, t.pid, t.pid))
    assert t.end_sleep() == (SLEPT, 0)


def wait_status(pid, text):
    """Until /proc/PID/status says TEXT (30 s at most: a loaded machine)."""
    for _ in range(3000):
        with open("/proc/%d/status" % pid) as f:
            if text in f.read():
                return
        time.sleep(0.01)
    raise AssertionError("/proc/%d/status never said %r" % (pid, text))


def test_no_such_process(ib):
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) + 1
    assert inject(pid, ib["libinject.so"], "inject_record", "x") == (
        ESRCH, 0, "no such process %d" % pid)


def test_zombie(ib):
    p = subprocess.Popen(["true"])
    wait_status(p.pid, "State:\tZ")
    assert inject(p.pid, ib["libinject.so"], "inject_record", "x") == (
        ESRCH, 0, "%d is a zombie: it exited and was not reaped" % p.pid)
    assert p.wait() == 0    # its exit status is still ours to collect


def test_thread_id_is_refused(ib, targets):
    t = targets([ib["target"], "threads", "2"])
    tid = max(int(x) for x in os.listdir("/proc/%d/task" % t.pid))
    assert inject(tid, ib["libinject.so"], "inject_record", "x") == (
        EINVAL, 0, "%d is a thread of process %d: give the process id" % (tid, t.pid))
    assert t.finish(sig=signal.SIGUSR1) == ("threads 2 ok\n", 0)


def test_static_binary_is_refused(ib, targets):
    if not ib["target_static"]:
        pytest.skip("cannot link statically here: %s" % ib["static_why"])
    t = targets([ib["target_static"], "sleep"])
    assert inject(t.pid, ib["libinject.so"], "inject_record", "x") == (
        EUNSUPP, 0, "%d is statically linked: no dynamic loader, cannot load a library" % t.pid)
    assert t.end_sleep() == (SLEPT, 0)


def test_stopped_process_is_refused_and_stays_stopped(ib, targets):
    t = targets([ib["target"], "sleep"])
    os.kill(t.pid, signal.SIGSTOP)
    wait_status(t.pid, "State:\tT")
    assert inject(t.pid, ib["libinject.so"], "inject_record", "x") == (
        EBUSY, 0, "%d is stopped (state T): resume it first (kill -CONT %d)" % (t.pid, t.pid))
    time.sleep(0.1)
    with open("/proc/%d/status" % t.pid) as f:
        assert "State:\tT (stopped)" in f.read()
    os.kill(t.pid, signal.SIGCONT)
    assert t.end_sleep() == (SLEPT, 0)


def test_traced_process_is_refused(ib, targets):
    if not shutil.which("strace"):
        pytest.skip("strace is not installed (apt-get install strace)")
    t = targets([ib["target"], "sleep"])
    s = subprocess.Popen(["strace", "-q", "-o", "/dev/null", "-p", str(t.pid)])
    try:
        wait_status(t.pid, "TracerPid:\t%d\n" % s.pid)
        assert inject(t.pid, ib["libinject.so"], "inject_record", "x") == (
            EPERM, 0, "%d is being traced by another process (%d strace)" % (t.pid, s.pid))
    finally:
        s.terminate()
        s.wait()
    assert "libinject.so" not in t.maps()
    assert t.end_sleep() == (SLEPT, 0)


@pytest.fixture
def nobody_dir(ib):
    """A directory nobody can read, with mmleak-tools.so, the CLI, the test target and
    library."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run processes as nobody")
    d = tempfile.mkdtemp(prefix="mmleak-inject.")
    try:
        os.chmod(d, 0o777)
        for f in (os.path.join(ROOT, "mmleak-tools.so"), CLI, ib["target"], ib["libinject.so"]):
            shutil.copy(f, d)
            os.chmod(os.path.join(d, os.path.basename(f)), 0o755)
        for f in PYTHON_SIDE:               # the CLI's binding (mmleaklib.native)
            os.makedirs(os.path.join(d, os.path.dirname(f)), mode=0o755, exist_ok=True)
            shutil.copy(os.path.join(ROOT, f), os.path.join(d, f))
            os.chmod(os.path.join(d, f), 0o644)
        yield d
    finally:
        shutil.rmtree(d)


AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def cli_as_nobody(d, pid, func, arg):
    return subprocess.run(AS_NOBODY + [sys.executable, os.path.join(d, "inject_cli.py"),
                                       os.path.join(d, "mmleak-tools.so"), str(pid),
                                       os.path.join(d, "libinject.so"), func, arg,
                                       str(LONG_MS)],
                          capture_output=True, text=True, timeout=60)


def test_other_users_process_is_refused(ib, targets, nobody_dir):
    """The injector runs as nobody, the target as root."""
    t = targets([ib["target"], "sleep"])
    r = cli_as_nobody(nobody_dir, t.pid, "inject_record", "x")
    assert (r.stdout, r.stderr, r.returncode) == (
        "error -3 %d belongs to another user (uid 0): run as that user or as root\n" % t.pid,
        "", 1)
    assert "libinject.so" not in t.maps()
    assert t.end_sleep() == (SLEPT, 0)


def test_same_user_without_privileges(ib, targets, nobody_dir):
    """Target and injector both run as nobody (no capability; no Yama here): it works."""
    with open("/proc/sys/kernel/yama/ptrace_scope" if os.path.exists(
            "/proc/sys/kernel/yama/ptrace_scope") else "/dev/null") as f:
        if f.read().strip() not in ("", "0"):
            pytest.skip("kernel.yama.ptrace_scope is not 0: only root or an ancestor may trace")
    rec = os.path.join(nobody_dir, "rec")
    t = targets(AS_NOBODY + [os.path.join(nobody_dir, "target"), "sleep"])
    r = cli_as_nobody(nobody_dir, t.pid, "inject_record", rec)
    assert (r.stdout, r.stderr, r.returncode) == ("result 4242\n", "", 0)
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, t.pid)]
    assert os.stat(rec).st_uid == pwd.getpwnam("nobody").pw_uid
    assert t.end_sleep() == (SLEPT, 0)


def test_undumpable_process_is_refused(ib, targets, nobody_dir):
    """Same user, but the target made itself not dumpable: only root may attach."""
    t = targets(AS_NOBODY + [os.path.join(nobody_dir, "target"), "undumpable"])
    r = cli_as_nobody(nobody_dir, t.pid, "inject_record", "x")
    assert (r.stdout, r.stderr, r.returncode) == (
        "error -3 %d is not dumpable (set-uid or set-gid program, file capabilities, or "
        "prctl(PR_SET_DUMPABLE, 0)): only root can attach to it\n" % t.pid, "", 1)
    assert t.end_sleep() == (SLEPT, 0)


@pytest.mark.parametrize("how, why", [
    ("strict", "thread {pid} of {pid} is in seccomp strict mode: the system calls of dlopen and "
               "of mmleak would kill it"),
    ("kill-openat", "{pid} has a seccomp filter that does not allow openat (it would kill the "
                    "process), a system call dlopen or mmleak makes"),
    ("kill-fallocate", "{pid} has a seccomp filter that does not allow fallocate (it would kill "
                       "the process), a system call dlopen or mmleak makes"),
    ("errno-openat", "{pid} has a seccomp filter that does not allow openat (it would fail with "
                     "errno 1), a system call dlopen or mmleak makes"),
])
def test_seccomp_that_forbids_what_we_need_is_refused(ib, targets, how, why):
    """Under seccomp, a system call that dlopen (openat) or mmleak, tracing afterwards
    (fallocate), makes would kill the process or fail: the filter is read and run on each of
    them first, and the process is left alone (it was killed by the attach before)."""
    t = targets([ib["target"], "seccomp", how])
    assert inject(t.pid, ib["libinject.so"], "inject_record", "x") == (
        EUNSUPP, 0, why.format(pid=t.pid))
    assert "libinject.so" not in t.maps()
    assert t.finish(b"hello") == ("read 5 hello\n", 0)


def test_seccomp_that_allows_what_we_need_is_used(ib, targets, tmp_path):
    """A filter that forbids only what neither dlopen nor mmleak make (acct): injected."""
    rec = str(tmp_path / "rec")
    t = targets([ib["target"], "seccomp", "errno-acct"])
    assert inject(t.pid, ib["libinject.so"], "inject_record", rec) == (0, 4242, "")
    assert records(rec) == ["pid %d tid %d loads 1 calls 1" % (t.pid, t.pid)]
    assert t.finish(b"hello") == ("read 5 hello\n", 0)


def test_seccomp_filter_unreadable_without_cap_sys_admin(ib, targets, nobody_dir):
    """Same user, no capability: the filter cannot be read (PTRACE_SECCOMP_GET_FILTER needs
    CAP_SYS_ADMIN), so nothing is known of it: refused, the process left alone."""
    t = targets(AS_NOBODY + [os.path.join(nobody_dir, "target"), "seccomp", "errno-acct"])
    r = cli_as_nobody(nobody_dir, t.pid, "inject_record", "x")
    assert (r.stdout, r.stderr, r.returncode) == (
        "error -3 %d has a seccomp filter, and only a process with CAP_SYS_ADMIN may read it "
        "to see whether dlopen and mmleak may run there (run as root)\n" % t.pid, "", 1)
    assert t.finish(b"hello") == ("read 5 hello\n", 0)


def test_process_exiting_during_the_attach_is_said_to_have_exited(ib):
    """600 processes that exit 0-3 ms after "ready" (a thread in malloc all along), each
    injected at once: the call works, or says the process exited, never anything else (an
    exit in progress empties /proc/PID/maps and refuses PTRACE_SEIZE: this read as
    "statically linked", "a libc without dlopen", "cannot read the dynamic symbols", "not
    permitted")."""
    outcomes = collections.Counter()
    for i in range(600):
        p = subprocess.Popen([ib["target"], "exitafter", str((i * 397) % 3000)],
                             stdout=subprocess.PIPE)
        try:
            assert p.stdout.readline() == b"ready\n"
            rc, res, err = inject(p.pid, ib["libinject.so"], "inject_long", None)
            if rc == 0:
                assert res == -0x123456789abcdef
                outcomes["ok"] += 1
            else:
                outcomes[(rc, err.replace(str(p.pid), "PID"))] += 1
        finally:
            p.stdout.read()
            assert p.wait(timeout=30) == 0
    assert set(outcomes) <= {"ok", (ESRCH, "PID exited while being attached"),
                             (ESRCH, "PID is a zombie: it exited and was not reaped"),
                             (ESRCH, "no such process PID")}, outcomes
