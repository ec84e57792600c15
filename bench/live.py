#!/usr/bin/python3
"""A big live heap, side by side with heaptrack (issue 19): bench/live_heap.c keeps N blocks
(default 10 million of 100 bytes) alive in linked lists from a global and loses 1,000.

    /usr/bin/python3 bench/live.py [--blocks N] [--runs R] [--dir DIR] [--steps a,b,...]

Steps, each one process timed from fork to exit with its peak RSS (wait4's ru_maxrss, the
largest of the process and the children it waited for):

    native      the program alone
    heaptrack   `heaptrack -o F prog`: its recording
    ht_print    `heaptrack_print F`: its report
    lsan        the program built with `cc -fsanitize=leak`: LeakSanitizer's exit check
    run         `mmleak.py run` with default settings (background compaction, the
                reachability scan at exit)
    check       `mmleak.py run --check`: from start to its exact verdict (exit status 23:
                the 1,000 lost blocks)
    keep_all    `mmleak.py run --keep-all` (every dump file kept)
    shrink      `mmleak.py shrink --final` on keep_all's files, output to /dev/null
    report      `mmleak.py report --no-html` on run's trace (compacted)
    report_raw  `mmleak.py report --no-html` on keep_all's trace (not compacted)
    page        `mmleak.py report -o page.html` on run's trace (with the HTML page)

report and page read run's trace when run is among the steps, else keep_all's (--steps
keep_all,report,page skips the long default run).

Runs are interleaved (round 1 of every step, then round 2...); medians are printed, and the
report's counts are checked exactly (N and 1,000 blocks at the two call sites).  Each round
writes about 1 GB per 10 million blocks (the two traces and heaptrack's file) under --dir
(default bench/out/live; put it on a size-limited tmpfs) and deletes it at the end of the
round.  Standard library only.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import MMLEAK_PY as MMLEAK, OUT, PY, build_c
STEPS = ("native", "lsan", "heaptrack", "ht_print", "run", "check", "keep_all", "shrink",
         "report", "report_raw", "page")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run_step(argv, **kw):
    """Wall time, peak RSS, exit status and stderr tail, with the peak RSS of exactly this child (a fork that execs ARGV, waited for
    with wait4)."""
    e = dict(os.environ, LC_ALL="C", **(kw.get("env") or {}))
    out = kw.get("stdout")
    errf = os.path.join(kw["scratch"], "stderr")
    with open(errf, "wb") as ferr:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out if out is not None else subprocess.DEVNULL,
                             stderr=ferr, env=e)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
    with open(errf, "rb") as f:
        err = f.read()[-3000:].decode("utf-8", "replace")
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024.0,
            "rc": p.returncode, "err": err}


def dir_mb(d):
    n = 0
    for name in os.listdir(d):
        st = os.lstat(os.path.join(d, name))
        n += st.st_blocks * 512
    return n / 1e6


def check_counts(text, blocks, lost):
    """The report's two sites, exactly (report --show-reachable): LOST blocks definitely
    lost from lose_one, BLOCKS still reachable from keep_one (or its caller, main, when
    keep_one is taken for an allocation wrapper), nothing else."""
    got = {}
    for line in text.splitlines():
        m = re.match(r"\s+(\d+)\s+(\d+)\s+(definite|indirect|possible|reachable|unknown)"
                     r"\s+(\w+)\b", line)
        if m:
            site = "keep_one" if m.group(4) == "main" else m.group(4)
            got[(site, m.group(3))] = (int(m.group(1)), int(m.group(2)))
    want = {("keep_one", "reachable"): (100 * blocks, blocks),
            ("lose_one", "definite"): (100 * lost, lost)}
    return got == want, got


def check_verdict(text, lost):
    """run --check's verdict on stderr: the LOST blocks definitely lost (its leak summary)."""
    m = re.search(r"definitely lost:\s+(\d+) bytes.* in (\d+) blocks", text)
    return bool(m) and (int(m.group(1)), int(m.group(2))) == (100 * lost, lost)


def one_round(steps, blocks, lost, root, binary, lsan_binary):
    res = {}
    prog = [binary, "-n", str(blocks), "-l", str(lost)]
    scratch = os.path.join(root, "scratch")
    os.makedirs(scratch, exist_ok=True)
    run_dir, keep_dir, ht_dir, check_dir = (os.path.join(root, x)
                                            for x in ("run", "keep", "ht", "check"))
    for d in (run_dir, keep_dir, ht_dir, check_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    need = set(steps)
    traced = run_dir if "run" in need else keep_dir
    if ("report" in need or "page" in need) and "run" not in need:
        need.add("keep_all")
    if "shrink" in need or "report_raw" in need:
        need.add("keep_all")
    if "ht_print" in need:
        need.add("heaptrack")
    for step in STEPS:
        if step not in need:
            continue
        stdout = None
        if step == "native":
            argv = prog
        elif step == "lsan":
            argv = [lsan_binary] + prog[1:]
        elif step == "check":
            argv = [PY, MMLEAK, "run", "--check", "-d", check_dir, "--"] + prog
        elif step == "heaptrack":
            argv = ["heaptrack", "-o", os.path.join(ht_dir, "ht")] + prog
        elif step == "ht_print":
            f = [x for x in os.listdir(ht_dir) if x.startswith("ht")]
            argv = ["heaptrack_print", os.path.join(ht_dir, f[0])]
        elif step == "run":
            argv = [PY, MMLEAK, "run", "-d", run_dir, "--"] + prog
        elif step == "keep_all":
            argv = [PY, MMLEAK, "run", "--keep-all", "-d", keep_dir, "--"] + prog
        elif step == "shrink":
            argv = [PY, MMLEAK, "shrink", "--final"] + sorted(
                os.path.join(keep_dir, x) for x in os.listdir(keep_dir) if x.endswith(".out"))
        elif step in ("report", "report_raw"):
            argv = [PY, MMLEAK, "report", "--no-html", "--show-reachable",
                    traced if step == "report" else keep_dir]
            stdout = open(os.path.join(scratch, "report.txt"), "wb")
        elif step == "page":
            argv = [PY, MMLEAK, "report", "-o", os.path.join(scratch, "page.html"), traced]
        r = run_step(argv, stdout=stdout, scratch=scratch)
        if stdout is not None:
            stdout.close()
            with open(stdout.name) as f:
                text = f.read()
            r["exact"], sites = check_counts(text, blocks, lost)
            r["sites"] = {"%s %s" % k: v for k, v in sites.items()}     # for --json
        if step in ("check", "lsan"):
            # LSan's and run --check's status for leaks is 23; LSan's summary is not checked
            # here beyond that (its "1000 allocation(s)" line), mmleak's leak summary is
            r["exact"] = r["rc"] == 23 and (
                check_verdict(r["err"], lost) if step == "check" else
                ("%d byte(s) leaked in %d allocation(s)" % (100 * lost, lost)) in r["err"])
            r["rc_ok"] = r["rc"] == 23
        if step == "page":
            p = os.path.join(scratch, "page.html")
            r["page_mb"] = os.path.getsize(p) / 1e6 if os.path.exists(p) else None
        if step in ("run", "keep_all"):
            r["disk_mb"] = dir_mb(run_dir if step == "run" else keep_dir)
        if step == "heaptrack":
            r["disk_mb"] = dir_mb(ht_dir)
        if r["rc"] != 0 and not r.get("rc_ok"):
            log("  %s: exit status %d: %s" % (step, r["rc"], r["err"].strip()[-400:]))
        log("  %-10s %7.2f s (cpu %.2f s) %8.0f MB%s" % (step, r["wall"], r["cpu"], r["rss_mb"], "".join(
            "  %s=%s" % (k, r[k]) for k in ("exact", "disk_mb", "page_mb") if k in r)))
        res[step] = r
    for d in (run_dir, keep_dir, ht_dir, check_dir, scratch):
        shutil.rmtree(d, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=10000000, help="live blocks (10 million)")
    ap.add_argument("--lost", type=int, default=1000, help="lost blocks (1,000)")
    ap.add_argument("--runs", type=int, default=3, help="rounds (3); medians printed")
    ap.add_argument("--dir", default=os.path.join(OUT, "live"),
                    help="scratch directory (about 1 GB per 10 million blocks per round)")
    ap.add_argument("--steps", default=",".join(STEPS),
                    help="comma-separated steps (default: all): " + ", ".join(STEPS))
    ap.add_argument("--json", help="also write every run's figures here")
    args = ap.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    bad = [s for s in steps if s not in STEPS]
    if bad:
        sys.exit("live.py: unknown step %s (steps: %s)" % (", ".join(bad), ", ".join(STEPS)))
    if not shutil.which("heaptrack"):
        steps = [s for s in steps if s not in ("heaptrack", "ht_print")]
        log("live.py: heaptrack not installed: its steps left out")
    binary = build_c("live_heap", "bench/live_heap.c", "-fno-omit-frame-pointer", out=args.dir)
    lsan_binary = os.path.join(args.dir, "live_heap_lsan")
    if "lsan" in steps:
        build_c("live_heap_lsan", "bench/live_heap.c", "-fno-omit-frame-pointer",
                "-fsanitize=leak", out=args.dir)
    rounds = []
    for i in range(args.runs):
        log("round %d of %d (%d live blocks):" % (i + 1, args.runs, args.blocks))
        rounds.append(one_round(steps, args.blocks, args.lost, args.dir, binary, lsan_binary))
    print("%d live blocks of 100 bytes + %d lost, medians of %d rounds (wall s, the runs' "
          "walls, CPU s, peak RSS MB)" % (args.blocks, args.lost, args.runs))
    for s in STEPS:
        rs = [r[s] for r in rounds if s in r]
        if not rs:
            continue
        extra = ""
        if "exact" in rs[0]:
            extra += "  counts exact: %s" % all(r["exact"] for r in rs)
        for k in ("disk_mb", "page_mb"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            if vals:
                extra += "  %s %.1f" % (k, statistics.median(vals))
        print("  %-10s %7.2f s  (%s)  cpu %6.2f s  %7.0f MB%s" % (
            s, statistics.median(r["wall"] for r in rs),
            " ".join("%.2f" % r["wall"] for r in rs),
            statistics.median(r["cpu"] for r in rs),
            statistics.median(r["rss_mb"] for r in rs), extra))
    if "run" in rounds[0] and "heaptrack" in rounds[0]:
        print("  run / heaptrack: %.2fx" % statistics.median(
            r["run"]["wall"] / r["heaptrack"]["wall"] for r in rounds))
    if "check" in rounds[0] and "lsan" in rounds[0]:
        print("  check / lsan: %.2fx" % statistics.median(
            r["check"]["wall"] / r["lsan"]["wall"] for r in rounds))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rounds, f, indent=1)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
