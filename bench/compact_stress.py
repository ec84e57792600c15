#!/usr/bin/python3
"""Compaction under random interleavings (issue #10): a stress run, not a test.

Each round runs tests/daemon_load.c under mmleak.so (random threads, rates, leaks, fork,
buffer size, depth, files rotating at 1 MB) and ends it in a random way (a normal exit, a
SIGKILL in the middle, a SIGKILL after the work but before exit).  Meanwhile:

  * one to three `mmleak.py compact --follow` run at once, each SIGKILLed (sometimes
    SIGTERMed) at random moments and started again;
  * readers (`mmleak.py snapshot`, `mmleak.py report --no-html`) run in a loop and must
    succeed without a warning about lost or doubled lines;
  * a shadow directory gets a hard link to every file the moment it appears, so the whole
    trace stays readable whatever the compactors delete: the truth.

After the process (and its fork child) are gone, the readers go on while the compactors are
still being killed, and every snapshot must equal the truth exactly.  Then one clean
`mmleak.py compact` pass, and the checks: the same survivors (address, number, size, stack)
and foreign frees as the shadow, the same event count, no dump, staging or temporary file
left (nor a run mmleak.ID.compact.N: the trace is over, everything is in mmleak.ID.compact),
the last point of the growth series equal to the final live set, and on a normal exit the
program's own count of leaked blocks.  Some rounds leak at every pair or every third: live
sets of up to 1.2 million blocks, folded in levels of runs.

  bench/compact_stress.py [--minutes M] [--seed S] [--dir DIR] [--keep]

Prints one line per round and a summary; exit status 1 if any round failed (its directory
is kept under DIR).  A round whose shadow missed a file (the linker, a process of its own at
a higher priority, did not see it between its creation and its folding: a busy machine) is
inconclusive, counted apart.
"""
import argparse
import collections
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"
MMLEAK = [PY, os.path.join(ROOT, "mmleak.py")]
LIB = os.path.join(ROOT, "mmleak.so")


sys.path.insert(0, ROOT)
import mmleaklib as mm  # noqa: E402 (the package, beside this tree's mmleak.py)
BAD_WORDS = ("twice", "cannot read", "malformed", "Traceback", "INCOMPLETE")


SHADOW = r"""
import os, re, sys, time
dump, shadow, stop = sys.argv[1:4]
pat = re.compile(r"mmleak\.\d+(-\d+)?\.\d+\.(out|tail)$")
seen = set()
def sweep():
    for n in os.listdir(dump):
        if n not in seen and pat.match(n):
            seen.add(n)
            try:
                os.link(os.path.join(dump, n), os.path.join(shadow, n))
            except FileNotFoundError:
                if n.endswith(".out"):
                    print(n, flush=True)
while not os.path.exists(stop):
    sweep()
    time.sleep(0.001)
sweep()
"""


class Shadow:
    """A process of its own (at a higher priority than the rest) that hard-links every dump
    and staging file of DUMP into SHADOW as soon as it appears.  A file it could not link in
    time (created, completed and folded between two of its looks) makes the round
    inconclusive: found by a gap in a trace's file numbers."""

    def __init__(self, dump, shadow):
        self.dump, self.shadow = dump, shadow
        self.stopfile = shadow + ".stop"

    def start(self):
        def nice():
            try:
                os.nice(-10)
            except OSError:
                pass
        self.p = subprocess.Popen([PY, "-c", SHADOW, self.dump, self.shadow, self.stopfile],
                                  stdout=subprocess.PIPE, preexec_fn=nice)

    def finish(self):
        open(self.stopfile, "w").close()
        out = self.p.communicate()[0].decode().split()
        gaps = []
        files = collections.defaultdict(set)
        for n in os.listdir(self.shadow):
            m = re.match(r"mmleak\.(\d+(?:-\d+)?)\.(\d+)\.out$", n)
            if m:
                files[m.group(1)].add(int(m.group(2)))
        for t, nums in files.items():
            gaps += ["mmleak.%s.%d.out" % (t, i) for i in range(max(nums) + 1) if i not in nums]
        return out + gaps


class Compactors(threading.Thread):
    """K compactors, killed at random moments and started again."""

    def __init__(self, dump, rnd, k, log):
        super().__init__(daemon=True)
        self.dump, self.rnd, self.k, self.log = dump, rnd, k, log
        self.stop = threading.Event()
        self.procs = []
        self.kills = 0
        self.terms = 0
        self.errors = []

    def start_one(self):
        iv = self.rnd.choice(["0.05", "0.2", "1"])
        si = self.rnd.choice(["0", "0.5", "10"])
        args = MMLEAK + ["compact", "--follow", "--forever", "--interval", iv,
                         "--series-interval", si, self.dump]
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def check(self, p):
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        # -SIGTERM: the signal came before Python had installed its handler
        if p.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM) or \
                any(w in err for w in BAD_WORDS):
            self.errors.append("compactor exit %s: %s" % (p.returncode, err[-500:]))

    def run(self):
        self.procs = [self.start_one() for _ in range(self.k)]
        while not self.stop.wait(self.rnd.uniform(0.0, 0.6)):
            i = self.rnd.randrange(len(self.procs))
            p = self.procs[i]
            if self.rnd.random() < 0.85:
                p.send_signal(signal.SIGKILL)
                self.kills += 1
            else:
                p.send_signal(signal.SIGTERM)
                self.terms += 1
            p.wait()
            self.check(p)
            self.procs[i] = self.start_one()

    def finish(self):
        self.stop.set()
        self.join()
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.check(p)


class Readers(threading.Thread):
    """snapshot and report in a loop; with TRUTH set ({tid: survivors}), every snapshot of
    a finished trace must equal it."""

    def __init__(self, dump, scratch, rnd):
        super().__init__(daemon=True)
        self.dump, self.scratch, self.rnd = dump, scratch, rnd
        self.stop = threading.Event()
        self.truth = None
        self.errors = []
        self.reads = self.exact = 0

    def run(self):
        n = 0
        while not self.stop.is_set():
            traces = [t for t, f in mm.find_traces(self.dump).items() if f]
            if not traces:
                time.sleep(0.05)
                continue
            tid = self.rnd.choice(traces)
            n += 1
            truth = self.truth
            if self.rnd.random() < 0.7:
                out = os.path.join(self.scratch, "snap%d" % (n % 4))
                r = self.read("snapshot", tid, "-o", out)
                if r is None:
                    continue
                if truth is not None and tid in truth:
                    got = {k: (a.size, a.callers) for k, a in mm.baseline_blocks(out).items()}
                    if got != truth[tid]:
                        self.errors.append("snapshot %s of the finished trace differs: %d blocks, "
                                           "truth %d" % (tid, len(got), len(truth[tid])))
                    else:
                        self.exact += 1
            else:
                r = self.read("report", tid, "--no-html")
                if r is None:
                    continue
                if truth is not None and tid in truth:
                    m = re.search(rb"in (\d+) blocks not freed", r.stdout)
                    if not m or int(m.group(1)) != len(truth[tid]):
                        self.errors.append("report %s of the finished trace: %s, truth %d blocks"
                                           % (tid, m and m.group(0), len(truth[tid])))
                    else:
                        self.exact += 1

    def read(self, command, tid, *args):
        """`mmleak.py COMMAND DUMP --pid TID ARGS`: its result, or None (an error noted)."""
        r = subprocess.run(MMLEAK + [command, self.dump, "--pid", tid] + list(args),
                           capture_output=True)
        self.reads += 1
        err = r.stderr.decode(errors="replace")
        if r.returncode != 0 or any(w in err for w in BAD_WORDS):
            self.errors.append("%s %s: exit %d: %s" % (command, tid, r.returncode, err[-400:]))
            return None
        return r


def whole(directory, tid):
    """(survivors {(ptr, seq): (size, callers)}, foreign frees, events, shrinker)."""
    files = mm.find_traces(directory).get(tid, [])
    sh = mm.shrink_files(files)
    surv = {(a.ptr, a.seq): (a.size, a.callers) for a in sh.survivors()}
    ff = sorted(sh.foreign_frees())
    c = sh.compacted
    events = c["events"] + sh.events - c["entries"] if c["files"] else sh.events
    return surv, ff, events, sh


def one_round(i, rnd, base, exe, log):
    rd = os.path.join(base, "round%04d" % i)
    dump, shadow, scratch = (os.path.join(rd, x) for x in ("dump", "shadow", "scratch"))
    for d in (dump, shadow, scratch):
        os.makedirs(d)
    threads = rnd.randint(1, 4)
    pairs = rnd.choice([20000, 60000, 150000, 300000])
    # 1 and 3: a large live set (up to 1.2 million blocks), folded into levels of runs
    leak = rnd.choice([1, 3, 97, 300, 1000])
    fork = rnd.random() < 0.4
    ending = rnd.choice(["exit", "exit", "kill", "kill-late"])
    buf = rnd.choice([64, 256, 1024])
    depth = rnd.choice([None, "1", "4"])
    ncomp = rnd.randint(1, 3)
    desc = "t=%d n=%d l=%d%s buf=%d depth=%s %s comp=%d" % (
        threads, pairs, leak, " fork" if fork else "", buf, depth or "auto", ending, ncomp)
    env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=dump, MMLEAK_ROTATE_MB="1",
               MMLEAK_BUFFER_KB=str(buf))
    if depth:
        env["MMLEAK_DEPTH"] = depth
    argv = [exe, "-t", str(threads), "-n", str(pairs), "-l", str(leak)]
    if fork:
        argv.append("-f")
    if ending == "kill-late":
        argv.append("-w")
    sh_t = Shadow(dump, shadow)
    sh_t.start()
    time.sleep(0.1)
    comps = Compactors(dump, rnd, ncomp, log)
    readers = Readers(dump, scratch, rnd)
    p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    comps.start()
    readers.start()
    out = b""
    if ending == "kill":
        time.sleep(rnd.uniform(0.05, 1.5))
        p.send_signal(signal.SIGKILL)
        out = p.stdout.read()
        p.wait()
    elif ending == "kill-late":
        while not out.endswith(b"ready\n"):
            line = p.stdout.readline()
            if not line:
                break
            out += line
        time.sleep(rnd.uniform(0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
    else:
        out = p.communicate()[0]
    # a fork child may still run (it is not killed with its parent): wait for it
    deadline = time.time() + 60
    while time.time() < deadline:
        kids = [t for t in mm.find_traces(dump) if t != str(p.pid) and
                mm.trace_alive(dump, t)]
        if not kids:
            break
        time.sleep(0.05)
    time.sleep(0.05)
    missed = sh_t.finish()
    for n in os.listdir(dump):      # maps and loads: the last version
        if n.endswith((".maps", ".loads")):
            shutil.copy(os.path.join(dump, n), os.path.join(shadow, n))
    errors = []
    tids = sorted(t for t, f in mm.find_traces(shadow).items() if f)
    truth = {}
    for t in tids:
        s, ff, ev, shs = whole(shadow, t)
        if shs.problems.malformed or shs.problems.fatal:
            errors.append("shadow of %s unreadable" % t)
        truth[t] = (s, ff, ev)
    readers.truth = {t: v[0] for t, v in truth.items()}
    time.sleep(rnd.uniform(0.5, 3.0))      # readers and killed compactors, trace finished
    comps.finish()
    readers.stop.set()
    readers.join()
    errors += comps.errors + readers.errors
    r = subprocess.run(MMLEAK + ["compact", dump], capture_output=True)
    if r.returncode != 0 or any(w in r.stderr.decode(errors="replace") for w in BAD_WORDS):
        errors.append("final compact: exit %d: %s" % (r.returncode, r.stderr[-400:]))
    left = [n for n in os.listdir(dump) if n.endswith((".out", ".tail", ".tmp")) or
            re.search(r"\.compact\.\d+$", n)]      # the final pass merges every run
    if left:
        errors.append("left after the final pass: %s" % left)
    got_tids = sorted(t for t, f in mm.find_traces(dump).items() if f)
    if got_tids != tids:
        errors.append("traces %s, shadow has %s" % (got_tids, tids))
    for t in tids:
        s, ff, ev, shc = whole(dump, t)
        ts, tff, tev = truth[t]
        if s != ts:
            lost = len(set(ts) - set(s))
            extra = len(set(s) - set(ts))
            errors.append("trace %s: survivors differ (%d missing, %d extra, of %d)"
                          % (t, lost, extra, len(ts)))
        if ff != tff:
            errors.append("trace %s: foreign frees differ (%d vs %d)" % (t, len(ff), len(tff)))
        if ev != tev:
            errors.append("trace %s: %d events counted, the trace has %d" % (t, ev, tev))
        pts, _ = mm.read_series(mm.TraceFiles(dump, t).series)
        live = (sum(v[0] for v in ts.values()), len(ts))
        if not pts:
            errors.append("trace %s: no series" % t)
        elif pts[-1].live != live:
            errors.append("trace %s: last series point %s, final live set %s"
                          % (t, pts[-1].live, live))
        for a, b in zip(pts, pts[1:]):
            if b.live[0] != a.live[0] + b.new[0] - b.freed[0] or \
                    b.live[1] != a.live[1] + b.new[1] - b.freed[1]:
                errors.append("trace %s: series point does not follow from the previous" % t)
                break
    # the program's own count, when it ended normally
    if ending == "exit" and str(p.pid) in truth:
        m = re.search(rb"^leaked (\d+)$", out, re.M)
        n48 = sum(1 for v in truth[str(p.pid)][0].values() if v[0] == 48)
        if not m or int(m.group(1)) != n48:
            errors.append("program said %r, the trace has %d blocks of 48 bytes"
                          % (m and m.group(0), n48))
    if missed:          # the truth is not whole: nothing can be concluded
        errors = ["INCONCLUSIVE: the shadow missed %s" % " ".join(sorted(missed))]
    nev = sum(v[2] for v in truth.values())
    line = "round %4d: %-58s %d trace(s), %8d events, %5d leaks; %3d kills, %2d terms, %3d reads (%d exact)" % (
        i, desc, len(tids), nev, sum(len(v[0]) for v in truth.values()), comps.kills,
        comps.terms, readers.reads, readers.exact)
    return errors, line, rd, dict(kills=comps.kills, terms=comps.terms, reads=readers.reads,
                                  exact=readers.exact, events=nev)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=0, help="stop after so many rounds")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", default="/var/tmp/mmleak-stress")
    ap.add_argument("--keep", action="store_true", help="keep every round's directory")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int(time.time())
    rnd = random.Random(seed)
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    subprocess.run(["make", "-s", "-C", ROOT, "mmleak.so", "mmleak-tools.so"], check=True)
    exe = os.path.join(args.dir, "daemon_load")
    subprocess.run(["cc", "-O1", "-g", "-pthread", "-o", exe,
                    os.path.join(ROOT, "tests", "daemon_load.c"), "-ldl"], check=True)
    print("seed %d" % seed, flush=True)
    end = time.time() + args.minutes * 60
    i = failed = inconclusive = 0
    tot = collections.Counter()
    while time.time() < end and (not args.rounds or i < args.rounds):
        i += 1
        errors, line, rd, stats = one_round(i, rnd, args.dir, exe, print)
        unsure = errors[:1] and errors[0].startswith("INCONCLUSIVE")
        print(line + ("  inconclusive" if unsure else "  FAILED" if errors else ""), flush=True)
        for e in errors:
            print("    " + e, flush=True)
        if unsure:
            inconclusive += 1
            shutil.rmtree(rd, ignore_errors=True)
        elif errors:
            failed += 1
        else:
            tot.update(stats)
            if not args.keep:
                shutil.rmtree(rd, ignore_errors=True)
    print("%d rounds, %d failed, %d inconclusive (the shadow missed a file); in the others: "
          "%d compactors SIGKILLed, %d SIGTERMed; %d reads, %d of a finished trace checked "
          "exact; %d events (seed %d)"
          % (i, failed, inconclusive, tot["kills"], tot["terms"], tot["reads"], tot["exact"],
             tot["events"], seed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
