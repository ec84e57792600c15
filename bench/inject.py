#!/usr/bin/python3
"""Time of one injection by mmleak_inject_call (tools/inject.c): what `mmleak.py attach PID`
costs the target and the caller.

    /usr/bin/python3 bench/inject.py [--runs N] [--lib PATH]

Injects mmleak.so (dlopen, dlsym, then a call of the trivial mmleak_state) into:
  idle     tests/inject_target.c `sleep` (one thread in nanosleep);
  busy-1   tests/inject_target.c `threads 1` (one thread in malloc/free all the time);
  busy-4   tests/inject_target.c `threads 4` (4 threads, main included, in malloc/free all
           the time);
  busy-64  the same with 64 threads: they are stopped while the injection runs (those inside
           malloc first run out of it), else each step of it waits for the borrowed thread to
           get a CPU back among them.
"first" is the first injection into a fresh process (the library is loaded: N processes);
"again" the following ones into one process (the library is there already: dlopen only
counts a reference; N injections).  Times are wall-clock around the C call, from this
process (ctypes), in milliseconds: median, min, max.  Standard library only."""
import ctypes
import os
import platform
import statistics
import subprocess
import sys
import time

from benchlib import LIB, ROOT, build_c, parser


def build():
    return build_c("inject_target", "tests/inject_target.c", "-O1", "-pthread", "-ldl")


def binding():
    """mmleak_inject_call, from the tools library beside this tree's mmleak.so."""
    sys.path.insert(0, ROOT)
    from mmleaklib.native import inject_call
    return inject_call()


def start(argv):
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    return p


def stop(p):
    p.kill()
    p.wait()


def one(fn, pid, lib):
    res = ctypes.c_long()
    err = ctypes.create_string_buffer(512)
    t0 = time.perf_counter()
    rc = fn(pid, lib.encode(), b"mmleak_state", None, 10000, ctypes.byref(res), err, 512)
    dt = time.perf_counter() - t0
    if rc != 0:
        sys.exit("injection into %d failed: %d %s" % (pid, rc, err.value.decode()))
    return dt * 1000


def main():
    ap = parser(__doc__, [("runs", 20)])
    ap.add_argument("--lib", default=LIB)
    a = ap.parse_args()
    lib = os.path.abspath(a.lib)
    exe = build()
    fn = binding()
    kinds = {"idle": [exe, "sleep"], "busy-1": [exe, "threads", "1"],
             "busy-4": [exe, "threads", "4"], "busy-64": [exe, "threads", "64"]}
    rows = []
    for name, argv in kinds.items():
        first = []
        for _ in range(a.runs):
            p = start(argv)
            first.append(one(fn, p.pid, lib))
            stop(p)
        p = start(argv)
        one(fn, p.pid, lib)
        again = [one(fn, p.pid, lib) for _ in range(a.runs)]
        stop(p)
        rows.append((name, "first", first))
        rows.append((name, "again", again))
    cores = os.cpu_count()
    print("mmleak_inject_call, %s, %d CPUs, %s, load average %s, %d runs each" % (
        platform.machine(), cores, platform.release(),
        " ".join("%.2f" % x for x in os.getloadavg()), a.runs))
    head = ("target", "injection", "median ms", "min ms", "max ms")
    lines = [head] + [(n, k, "%.2f" % statistics.median(v), "%.2f" % min(v), "%.2f" % max(v))
                      for n, k, v in rows]
    w = [max(len(r[i]) for r in lines) for i in range(len(head))]
    sep = "  ".join("=" * x for x in w)
    print(sep)
    for i, r in enumerate(lines):
        print("  ".join(c.ljust(w[j]) for j, c in enumerate(r)).rstrip())
        if i == 0:
            print(sep)
    print(sep)


if __name__ == "__main__":
    main()
