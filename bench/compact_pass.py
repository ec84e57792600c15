#!/usr/bin/python3
"""The cost of one compaction pass on a daemon's live set (issue #10): not part of `make bench`.

A trace of tests/daemon_load.c (two threads, PAIRS malloc/free pairs each, a 48-byte block
leaked every LEAK pairs, files rotating at 8 MB) is made once under `mmleak.py run
--keep-all`; all its files but the last NEW are folded (as a compactor would have, the
process still running), with a point of the series; then, from a fresh copy of that state
each time, one pass of `compact_dir` folds the NEW files (8 MB each: about what a daemon at
1 M events/s writes in a second), with or without a series point.  The process is made to
look alive (`trace_alive` returns True), as it would be.

    bench/compact_pass.py [--tree DIR] [--pairs N] [--leak N] [--new N] [--runs N] [--profile]

--tree: the source tree whose mmleak.py to measure (default: this one), so that two versions
can be compared on the same input (the trace is made once, with this tree's mmleak.so, in
--dir, and reused).  Prints the median wall and CPU time of a pass, the peak RSS of this
process, and the sizes of mmleak.ID.compact and .series.live; --profile adds cProfile's view
of one pass.
"""
import cProfile
import io
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import MMLEAK_PY, PY, ROOT, build_c, parser


def main():
    ap = parser(__doc__, [("pairs", 1500000), ("leak", 100), ("new", 4), ("runs", 7)])
    ap.add_argument("--tree", default=ROOT)
    ap.add_argument("--dir", default="/var/tmp/mmleak-compact-pass")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, args.tree)
    import mmleaklib as mm
    mm.compact.trace_alive = lambda *a, **k: True
    os.makedirs(args.dir, exist_ok=True)
    full = os.path.join(args.dir, "full-%d-%d" % (args.pairs, args.leak))
    if not os.path.isdir(full):
        exe = build_c("daemon_load", "tests/daemon_load.c", "-O1", "-pthread", "-ldl",
                      out=args.dir)
        subprocess.run([PY, MMLEAK_PY, "run", "--keep-all", "-d", full, "--", exe, "-t", "2",
                        "-n", str(args.pairs), "-l", str(args.leak)], check=True,
                       stdout=subprocess.DEVNULL, env=dict(os.environ, MMLEAK_ROTATE_MB="8"))
    tid = [k for k, v in mm.find_traces(full).items() if v][0]
    base = "%s-base-%s" % (full, os.path.realpath(args.tree).strip("/").replace("/", "_"))
    if not os.path.isdir(base):
        shutil.copytree(full, base)
        aside = base + ".aside"
        os.makedirs(aside)
        for f in mm.find_traces(base)[tid][-args.new:]:
            os.rename(f, os.path.join(aside, os.path.basename(f)))
        mm.series.SERIES_INTERVAL = 0.0
        mm.compact_dir(base, tid, out=io.StringIO())
        for n in os.listdir(aside):
            os.rename(os.path.join(aside, n), os.path.join(base, n))
        os.rmdir(aside)
    work = os.path.join(args.dir, "work")
    for point in (False, True):
        mm.series.SERIES_INTERVAL = 0.0 if point else 1e9

        def once(prof=None):
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(base, work)
            t0, c0 = time.perf_counter(), time.process_time()
            if prof:
                prof.enable()
            _, res = mm.compact_dir(work, tid, out=io.StringIO())
            if prof:
                prof.disable()
            assert res[0]["folded"] == args.new, res
            return time.perf_counter() - t0, time.process_time() - c0
        r = [once() for _ in range(args.runs)]
        print("%s, %s: a pass %.3f s wall, %.3f s CPU (medians of %d)" % (
            args.tree, "folding %d files and a series point" % args.new if point else
            "folding %d files" % args.new, statistics.median(x[0] for x in r),
            statistics.median(x[1] for x in r), args.runs))
        if args.profile:
            p = cProfile.Profile()
            once(p)
            pstats.Stats(p, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    live = mm.TraceFiles(base, tid).series + ".live"
    print("live set: mmleak.ID.compact %d bytes, .series.live %d bytes; peak RSS of this "
          "process %d MB" % (os.path.getsize(mm.TraceFiles(base, tid).compact),
                             os.path.getsize(live) if os.path.exists(live) else 0,
                             resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
