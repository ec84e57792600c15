#!/usr/bin/python3
"""The cost of report's exports (--pprof, --folded, --heaptrack) on a big report: not part of
`make bench`.

A report is made up in memory (no trace, no symbolizer): BLOCKS live blocks over STACKS
stacks of DEPTH frames drawn from 20,000 symbolized addresses, sizes 1..4096 bytes, times
0..3600 s (seeded).  Then mmleaklib/report.py's export_model builds the model (with the blocks'
times, as --heaptrack needs) and each writer of mmleaklib/export.py writes its file; the wall
time of each step, the files' sizes and this process's peak RSS are printed.

    bench/export.py [--blocks N] [--stacks N] [--depth N] [--dir DIR]
"""
import os
import random
import resource
import sys
import tempfile
import time

from benchlib import ROOT, parser


def main():
    ap = parser(__doc__, [("blocks", 1000000), ("stacks", 5000), ("depth", 16)])
    ap.add_argument("--dir", help="where the files go, made if missing and kept (default: a "
                    "temporary directory, removed at the end)")
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    import mmleaklib as mm
    from mmleaklib import export as mx
    rnd = random.Random(1)
    addrs = [0x400000 + 16 * i for i in range(20000)]
    frames = {x: mm.Frame(x, "prog", x - 0x400000, "fn%d" % (x % 977), "/src/f%d.c" % (x % 13),
                          x % 500 + 1, (), None) for x in addrs}
    stacks = [tuple(rnd.sample(addrs, a.depth)) for _ in range(a.stacks)]
    surv = [mm.Alloc(i, 0, rnd.randint(1, 4096), rnd.randint(0, 3600), stacks[i % a.stacks])
            for i in range(a.blocks)]
    rep = {"frames": frames, "survivors": surv, "trace_depth": mm.MAX_DEPTH,
           "maps": "/dev/null/no-maps", "start": 1700000000, "end_time": 3600, "trace": "1",
           "pid": "1", "cmd": "prog", "events": 2 * a.blocks, "wrappers": []}
    if a.dir:
        try:
            os.makedirs(a.dir, exist_ok=True)
        except OSError as e:
            sys.exit("export.py: --dir %s: %s" % (a.dir, e.strerror))
        run(a, rep, mm, mx, a.dir)
    else:
        with tempfile.TemporaryDirectory(prefix="mmleak-export-bench.") as d:
            run(a, rep, mm, mx, d)


def run(a, rep, mm, mx, d):
    t0 = time.perf_counter()
    model = mm.export_model(rep, mx, blocks=True)
    print("%d blocks, %d stacks of %d frames" % (a.blocks, a.stacks, a.depth))
    print("  model      %6.2f s" % (time.perf_counter() - t0))
    for kind, name in (("pprof", "big.pb.gz"), ("folded", "big.folded"),
                       ("heaptrack", "big.heaptrack.gz")):
        path = os.path.join(d, name)
        t0 = time.perf_counter()
        getattr(mx, "write_" + kind)(model, path)
        print("  %-10s %6.2f s  %9d bytes  %s" % (kind, time.perf_counter() - t0,
                                                  os.path.getsize(path), path))
    print("  peak RSS   %6.0f MB" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


if __name__ == "__main__":
    main()
