#!/usr/bin/python3
"""The running trace's points of the series (and the folds between them), timed: a daemon
with a big live heap replaced slowly (bench/series_heap.c: N blocks kept, R replaced a
second for SECONDS), traced with mmleak.so preloaded, compacted in this process as
`mmleak.py compact --follow` does (a pass a second, a point every SERIES_INTERVAL).

    /usr/bin/python3 bench/series_points.py --dir DIR [--tree TREE] [-n N] [-t SECONDS] [-r R]

TREE (default: this one) is the source tree whose mmleaklib and mmleak.so are measured:
run it on two trees, run by run, to compare them.  Per point: the compactor's CPU time
(time.process_time of this process: the compiled shrinker runs in it) and wall time of
add_point, and the bytes it wrote (.series.live and .series, both rewritten whole); per
fold (_fold: the new files into a run, merges), its CPU time and whether it rewrote
mmleak.ID.compact.  Prints one JSON line per run.  DIR: put it on a size-limited tmpfs
(about 60 bytes per event and per live block).  Standard library only."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="dump directory (emptied first)")
    ap.add_argument("--tree", default=os.path.dirname(HERE), help="source tree to measure")
    ap.add_argument("-n", type=int, default=3000000, help="live blocks (default 3000000)")
    ap.add_argument("-t", type=float, default=75, help="seconds of replacements (default 75)")
    ap.add_argument("-r", type=int, default=2000, help="replacements a second (default 2000)")
    a = ap.parse_args()
    tree = os.path.abspath(a.tree)
    sys.path.insert(0, tree)
    from mmleaklib import compact, files, series
    exe = os.path.join(os.path.dirname(os.path.abspath(a.dir)), "series_heap")
    subprocess.run(["gcc", "-O2", "-g", "-o", exe, os.path.join(HERE, "series_heap.c")],
                   check=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    points, folds = [], []
    real_point, real_fold = compact.add_point, compact._fold

    def timed_point(directory, tid, **kw):
        c0, w0 = time.process_time(), time.perf_counter()
        r = real_point(directory, tid, **kw)
        t = files.TraceFiles(directory, tid)
        size = sum(os.path.getsize(p) for p in (t.live, t.series) if os.path.exists(p))
        points.append(dict(cpu=time.process_time() - c0, wall=time.perf_counter() - w0,
                           bytes=size, final=bool(kw.get("final")),
                           blocks=r.live[1] if r else None, load=os.getloadavg()[0]))
        print("point: %.2f s cpu, %.2f s wall, %d bytes written, %s blocks, load %.2f"
              % (points[-1]["cpu"], points[-1]["wall"], size, points[-1]["blocks"],
                 points[-1]["load"]), file=sys.stderr, flush=True)
        return r

    def timed_fold(directory, tid, cpath, *args, **kw):
        ino = os.stat(cpath).st_ino if os.path.exists(cpath) else None
        c0 = time.process_time()
        r = real_fold(directory, tid, cpath, *args, **kw)
        ino2 = os.stat(cpath).st_ino if os.path.exists(cpath) else None
        folds.append(dict(cpu=time.process_time() - c0, result=ino != ino2,
                          written=r["written"]))
        if folds[-1]["result"] or folds[-1]["cpu"] > 0.5:
            print("fold: %.2f s cpu%s" % (folds[-1]["cpu"], ", into the result"
                                          if folds[-1]["result"] else ""),
                  file=sys.stderr, flush=True)
        return r
    compact.add_point, compact._fold = timed_point, timed_fold
    env = dict(os.environ, LD_PRELOAD=os.path.join(tree, "mmleak.so"), MMLEAK_DIR=a.dir,
               MMLEAK_ROTATE_MB="8")
    load0 = os.getloadavg()
    p = subprocess.Popen([exe, "-n", str(a.n), "-t", str(a.t), "-r", str(a.r)], env=env)
    deadline = time.monotonic() + a.t + 300
    while True:
        began = time.monotonic()
        if began > deadline and p.poll() is None:
            p.kill()
        ended = p.poll() is not None        # (reaped: a zombie's pid would look alive)
        live, _ = compact.compact_dir(a.dir)
        if not live and ended:
            break
        time.sleep(max(0, began + 1 - time.monotonic()))
    p.wait()
    mid = [x for x in points if not x["final"] and x["blocks"] and x["blocks"] >= a.n]
    out = dict(tree=tree, n=a.n, seconds=a.t, rate=a.r, load_start=load0,
               load_end=os.getloadavg(), points=len(points), mid_points=len(mid),
               point_cpu_median=statistics.median([x["cpu"] for x in mid]) if mid else None,
               point_wall_median=statistics.median([x["wall"] for x in mid]) if mid else None,
               point_bytes_median=statistics.median([x["bytes"] for x in mid]) if mid else None,
               final=[x for x in points if x["final"]],
               fold_cpu_median=statistics.median([f["cpu"] for f in folds if not f["result"]])
               if any(not f["result"] for f in folds) else None,
               result_folds=[round(f["cpu"], 2) for f in folds if f["result"]],
               folds=len(folds), all_points=[(round(x["cpu"], 2), x["bytes"]) for x in points])
    print(json.dumps(out))
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
