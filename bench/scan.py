#!/usr/bin/python3
"""The reachability benchmark of issue 20 (see mmleak-performance-heap(7), "Reachability").

    /usr/bin/python3 bench/scan.py [--blocks N] [--lists N] [--lost N] [--no-valgrind]

The program (bench/scan_bench.c): N live blocks of 100 bytes (default 10,000,000: 1 GB) in
1,000 lists whose heads are in a global array, plus 1,000 lost blocks.  Measured, side by
side on the same source:

  verdict   wall time from start to exact verdict: the plain build under mmleak.so (the scan
            at exit) and under `mmleak.py run --check` (the CI gate: exit 23), the
            LeakSanitizer build (clang -fsanitize=leak; its exit check), and
            valgrind memcheck (--leak-check=full); each verdict is checked (1,000 blocks
            definitely lost, nothing else lost)
  stall     a scan on demand (mmleak.py scan PID) of the same program kept running with 8
            threads: how long its threads were stopped (the result's #stall), against how
            long one fork of it takes (timed in the process itself, 3 times)

The trace goes to a tmpfs of its own (mounted here, removed after; root needed), so the disk
is never filled.  Standard library only."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import LIB, MMLEAK_PY, OUT, ROOT, build_c, parser

SRC = os.path.join(ROOT, "bench", "scan_bench.c")


def build():
    plain = build_c("scan_bench", "bench/scan_bench.c", "-pthread")
    lsan = os.path.join(OUT, "scan_bench_lsan")
    clang = shutil.which("clang") or shutil.which("clang-14")
    if clang:
        r = subprocess.run([clang, "-O2", "-g", "-pthread", "-fsanitize=leak", "-o", lsan, SRC],
                           capture_output=True, text=True)
        if r.returncode:
            print("no LeakSanitizer build: %s" % r.stderr.strip().splitlines()[-1:])
            lsan = None
    else:
        lsan = None
    return plain, lsan


def timed(argv, env=None, timeout=900):
    t = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - t, r


def scan_kinds(path):
    kinds = {}
    with open(path, "rb") as f:
        for line in f:
            if line.startswith(b"#data"):
                break
            w = line.split()
            if w[0] == b"#kind":
                kinds[w[1].decode()] = (int(w[2]), int(w[3]))
            elif w[0] == b"#stall":
                kinds["stall"] = float(w[1])
    return kinds


def newest_scan(d, pid):
    names = [n for n in os.listdir(d) if re.match(r"mmleak\.%d(-\d+)?\.scan\.\d+$" % pid, n)]
    names.sort(key=lambda n: os.stat(os.path.join(d, n)).st_mtime)
    return os.path.join(d, names[-1]) if names else None


def main():
    ap = parser(__doc__, [("blocks", 10000000), ("lists", 1000), ("lost", 1000),
                          ("tmpfs-mb", 3072)])
    ap.add_argument("--no-valgrind", action="store_true")
    args = ap.parse_args()
    plain, lsan = build()
    argv = [str(args.blocks), str(args.lists), str(args.lost)]
    d = tempfile.mkdtemp(prefix="mmleak-scan-bench.")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % args.tmpfs_mb, "none",
                              d]).returncode == 0
    rows = []
    try:
        # 1. verdict at exit: mmleak.so on the plain build
        env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=d, MMLEAK_ROTATE_MB="8")
        p = subprocess.Popen([plain] + argv, env=env)
        t0 = time.monotonic()
        p.wait(timeout=900)
        wall = time.monotonic() - t0
        k = scan_kinds(newest_scan(d, p.pid))
        ok = k.get("definite", (0, 0))[0] == args.lost and k.get("indirect") == (0, 0) and \
            k.get("reachable", (0, 0))[0] >= args.blocks
        rows.append(("mmleak.so, scan at exit", wall, "%d lost, %d reachable%s" % (
            k.get("definite", (0, 0))[0], k.get("reachable", (0, 0))[0],
            "" if ok else "  WRONG")))
        for n in os.listdir(d):
            os.unlink(os.path.join(d, n))
        # 1b. the CI gate, as a user runs it: `mmleak.py run --check` (its compactor, the scan
        # at exit, the last pass, the verdict), start to exit status
        wall, r = timed([sys.executable, MMLEAK_PY, "run", "--check", "-d", d, "--", plain] +
                        argv)
        m = re.search(r"^\s*definitely lost:\s+\d+ bytes.*? in (\d+) blocks$",
                      r.stdout + r.stderr, re.M)
        lost = int(m.group(1)) if m else -1
        rows.append(("mmleak.py run --check", wall, "%d lost (exit %d)%s" % (
            lost, r.returncode, "" if r.returncode == 23 and lost == args.lost else "  WRONG")))
        for n in os.listdir(d):
            os.unlink(os.path.join(d, n))
        # 2. LeakSanitizer
        if lsan:
            wall, r = timed([lsan] + argv, env=dict(os.environ, LSAN_OPTIONS="exitcode=23"))
            m = re.search(r"SUMMARY: LeakSanitizer: (\d+) byte\(s\) leaked in (\d+) allocation",
                          r.stderr)
            rows.append(("LeakSanitizer build", wall, "%s lost (exit %d)" % (
                m.group(2) if m else "?", r.returncode)))
        # 3. valgrind
        if not args.no_valgrind and shutil.which("valgrind"):
            wall, r = timed(["valgrind", "--leak-check=full", plain] + argv, timeout=1800)
            m = re.search(r"definitely lost: ([\d,]+) bytes in ([\d,]+) blocks", r.stderr)
            rows.append(("valgrind memcheck", wall, "%s lost" % (m.group(2) if m else "?")))
        # 4. stall of a scan on demand, against a fork of the same process
        env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=d, MMLEAK_ROTATE_MB="8", SCAN_WAIT="1",
                   SCAN_THREADS="8", MMLEAK_SCAN="0")
        p = subprocess.Popen([plain] + argv, env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline() == "ready\n"
            forks = []
            for _ in range(3):
                p.send_signal(10)       # SIGUSR1: time a fork
                forks.append(float(p.stdout.readline().split()[1]))
            wall, r = timed([sys.executable, MMLEAK_PY, "scan", "--quiet", str(p.pid)])
            k = scan_kinds(newest_scan(d, p.pid))
        finally:
            p.terminate()
            p.wait(timeout=600)
        fork = sorted(forks)[1]
        rows.append(("mmleak.py scan PID (8 threads)", wall, "stall %.3f s = %.1f forks "
                     "(one fork: %.3f s); %d lost" % (k.get("stall", -1), k.get("stall", -1) / fork,
                                                      fork, k.get("definite", (0, 0))[0])))
    finally:
        if mounted:
            for n in os.listdir(d):
                os.unlink(os.path.join(d, n))
            if subprocess.run(["umount", d]).returncode:
                subprocess.run(["umount", "-l", d])     # busy: detached, freed when idle
        shutil.rmtree(d, ignore_errors=True)
    print("reachability, %d live blocks of 100 bytes in %d lists, %d lost:" % (
        args.blocks, args.lists, args.lost))
    for name, wall, what in rows:
        print("  %-34s %8.2f s   %s" % (name, wall, what))


if __name__ == "__main__":
    main()
