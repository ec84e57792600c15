#!/usr/bin/python3
"""tests/fuzz/compare.py: the inputs of the libFuzzer harnesses (tests/fuzz/fuzz_tools.c,
`make fuzz`'s corpora, build/fuzz/corpus/TARGET/) read by both engines of mmleaklib, the
compiled (MMLEAK_SHRINK=native) and the Python one, through the API the commands use; every
difference is printed, and the counts at the end (inputs compared, differences).

usage: tests/fuzz/compare.py [--mode MODE] CORPUS_DIR...

An input is cut as the harnesses cut it (its first byte the control, the rest files at each
SEP); the files are written as mmleak.4242.K.out, or the last mmleak.4242.compact (the
trace's compacted result) where the harness streams it, the first with a hole in its middle
when the control asks.  A control's shared names (4) are not replayed (mmleaklib names
files by their paths).  The mode follows the corpus's name (its harness), or --mode:

  blocks          shrink_files(blocks=True): a report's reading (mmleak_shrink_blocks);
                  with .compact last: the blocks_merge harness (streamed, or read again
                  when not sorted); compared: survivors, foreign frees, headers, counts,
                  problems and their words on stderr, or the error
  raw             shrink_raw(OUT): a compaction pass (result_blocks; merge: .compact last,
                  stream_last), the live survivors too (control 8, and result_blocks);
                  compared: the result's bytes, its counts, the survivors (the compiled
                  array against the Python reading of the same bytes), stderr
  pick            a series point from the levels (series.level_sums: mmleak_levels_pick,
                  BIG the .compact, the others its runs, the harness's extra addresses)
                  against the whole trace read by each engine, per site (bytes,
                  blocks).  The levels need BIG as a compaction writes it (the base is
                  bound to it): any other BIG is first folded into the result a pass
                  writes from it (compact._fold_into); where the pass refuses it (the
                  words are counted), or its result does not read clean, only the whole
                  readings of the two engines are compared
"""
import argparse
import collections
import contextlib
import io
import os
import re
import shutil
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from mmleaklib import compact, series, shrink           # noqa: E402
from mmleaklib.errors import Fail, Refused              # noqa: E402
from mmleaklib.native import _load_state                # noqa: E402

SEP = b"\n~~8<~~\n"
MAXF = 4
EXTRA = [0x1000, None, (1 << 64) - 1, 0]                # fuzz_tools.c's (None: ctl << 12)
MODES = {"blocks": "blocks", "blocks_merge": "blocks", "merge": "raw", "result_blocks": "raw",
         "pick": "pick", "shrink": "blocks"}
STREAMED = ("blocks_merge", "merge")                    # harnesses whose last file is streamed


def cut(data):
    return data[0], data[1:].split(SEP, MAXF - 1)


def write_input(d, ctl, parts, compact_last, hole):
    paths = []
    for k, part in enumerate(parts):
        last = compact_last and k == len(parts) - 1
        p = os.path.join(d, "mmleak.4242.compact" if last else "mmleak.4242.%d.out" % k)
        with open(p, "wb") as f:
            if hole and k == 0:
                f.write(part[:len(part) // 2])
                f.seek(12288, 1)
                f.write(part[len(part) // 2:])
                f.truncate()
            else:
                f.write(part)
        paths.append(p)
    return paths


def engine(name, fn):
    """FN() with MMLEAK_SHRINK=NAME: ("ok", its value, stderr) or the error's words."""
    os.environ["MMLEAK_SHRINK"] = name
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            v = fn()
        return ("ok", v, err.getvalue())
    except (Fail, Refused) as e:
        return ("fail", type(e).__name__, str(e), err.getvalue())
    except Exception as e:                              # a bug: shown whole
        return ("exc", type(e).__name__, str(e), traceback.format_exc()[-800:])


def blocks_reading(paths):
    sh = shrink.shrink_files(paths, mixed=True, blocks=True)
    sh.problems.summary()
    return (sorted(sh.survivors()), sorted(sh.foreign_frees()), sh.headers, sh.header_lines,
            sh.cmd, sh.max_time, sh.events, sh.allocs, sh.files_done, sh.problems.malformed,
            sh.problems.fatal, sorted(sh.problems.counts.items()))


def raw_reading(paths, stream, live):
    with tempfile.TemporaryFile() as out:
        sh, data = shrink.shrink_raw(paths, out=out, live=live, stream_last=stream)
        if data is None:
            out.seek(0)
            data = out.read()
    sh.problems.summary()
    # the survivors: the compiled array (LIVE) against the Python reading of the bytes
    again = shrink.Shrinker()
    again.stacks = sh.stacks
    _load_state(again, io.BytesIO(data))
    want = sorted(again.survivors())
    nb = getattr(sh, "native_blocks", None)
    if nb is not None and sorted(shrink.Shrinker.survivors(sh)) != want:
        raise AssertionError("the live array is not the result's survivors")
    return (data, sh.headers, sh.header_lines, sh.max_time, sh.events, sh.allocs,
            sh.result_lines, sh.problems.malformed, sh.problems.fatal,
            sorted(sh.problems.counts.items()), want)


def sums_of(sh):
    s, _ = series.site_sums(sh, sh.live())
    return {k: tuple(v) for k, v in s.items() if v[0] or v[1]}


def sorted_result(data):
    """Whether DATA (BIG) is what a compaction writes: head '#' lines, then event lines
    sorted by address (the point's base is bound to such a file)."""
    last = -1
    for line in data.split(b"\n")[:-1] if data.endswith(b"\n") else [None]:
        if line is None:
            return False
        if line.startswith(b"#"):
            if last >= 0:
                return False
            continue
        m = re.match(rb"([0-9a-f]{1,16}) ", line)
        if not m or not shrink.EVENT_RE.fullmatch(line + b"\n"):
            return False
        v = int(m.group(1), 16)
        if v < last:
            return False
        last = v
    return True


# why a compaction pass refuses an input (compact._fold_into's Fail), in words
NOT_COMPACTED = [(r"dump format version", "a header of a format version it does not read"),
                 (r"not an mmleak dump", "not a dump"),
                 (r"files of different processes", "headers of two processes"),
                 (r"partial results joined", "partial results joined in one file"),
                 (r"an input could not be read", "an input it cannot read whole")]


def compacted(big):
    """BIG made what a compaction pass writes (its base is bound to such a file): when it is
    not (not sorted, not a clean reading), BIG is folded as a dump file into the result it
    gives (compact._fold_into, the pass's own writer), in its place.  None when it cannot
    be (the words why: the fold refuses it, or its result does not read clean)."""
    with open(big, "rb") as f:
        if sorted_result(f.read()) and _clean(big):
            return None
    src = big[:-len(".compact")] + ".99.out"
    os.rename(big, src)
    try:
        compact._fold_into(os.path.dirname(big), "4242", big, None, [src],
                           collections.Counter())
    except (Fail, Refused) as e:
        os.rename(src, big)                             # (the trace as it was given)
        return "not compacted: " + next((why for pattern, why in NOT_COMPACTED
                                          if re.search(pattern, str(e))), str(e))
    return None if _clean(big) else "its compacted result does not read clean"


def _clean(big):
    try:
        return series._read_native([big]) is not None  # the fold's own reading: clean
    except (Fail, Refused):
        return False


def pick_point(paths, ctl):
    """(outcome, sums): the point from the levels ("levels", or "whole": it cannot and the
    trace is read whole), or ("n/a", why) when BIG cannot be made a compacted result."""
    big, runs = paths[-1], paths[:-1]
    why = compacted(big)
    if why is not None:
        return ("n/a", why)
    alone = series._read_native([big])
    base = sums_of(alone[0])
    extra = [ctl << 12 if x is None else x for x in EXTRA[:ctl & 3]]
    try:
        got = series.level_sums(big, base, runs, extra or None)
    except (Fail, Refused) as e:                        # (a run that is not a dump)
        return ("fail", str(e))
    return ("whole", None) if got is None else ("levels", dict(
        (k, tuple(v)) for k, v in got[0].items()))


def compare(mode, name, data, d, counts):
    ctl, parts = cut(data)
    hole = bool(ctl & 16) and mode != "pick"
    if mode == "pick":
        parts = parts[1:] + parts[:1] if len(parts) > 1 else parts
        paths = write_input(d, ctl, parts, True, False)
        os.environ["MMLEAK_SHRINK"] = "native"
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                got = pick_point(paths, ctl)
            except Exception:
                got = ("exc", traceback.format_exc()[-1500:])
        counts["pick " + got[0]] += 1
        if got[0] == "n/a":
            counts["n/a: " + got[1]] = counts.get("n/a: " + got[1], 0) + 1
        if got[0] in ("whole", "exc"):
            return (("exc",), got) if got[0] == "exc" else None
        if got[0] == "n/a":             # no point from the levels: the whole reading's
            a, b = (engine(eng, lambda: sums_of(shrink.shrink_files(paths, mixed=True,
                                                                     blocks=True)))
                    for eng in ("native", "python"))
            return None if a == b and a[0] != "exc" else (a, b)
        # the whole trace read as a point reads it when it cannot from the levels
        # (series.trace_live: blocks, the .compact streamed), by each engine
        for eng in ("native", "python"):
            whole = engine(eng, lambda: sums_of(shrink.shrink_files(paths, mixed=True,
                                                                    blocks=True)))
            # (the point names files by their base names)
            same = whole[:2] == ("ok", got[1]) if got[0] == "levels" else \
                whole[0] == "fail" and whole[2].replace(d + "/", "") == got[1]
            if not same:
                return (eng,) + whole, got
        return None
    paths = write_input(d, ctl, parts, mode_streams(name), hole)
    if mode == "blocks":
        fn = lambda: blocks_reading(paths)              # noqa: E731
    else:
        stream = paths[-1].endswith(".compact")
        fn = lambda: raw_reading(paths, stream, bool(ctl & 8) or not stream)   # noqa: E731
    a, b = engine("python", fn), engine("native", fn)
    return None if a == b and a[0] != "exc" else (a, b)


def mode_streams(corpus):
    return any(os.path.basename(corpus.rstrip("/")).replace("small-", "") == h
               for h in STREAMED)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("blocks", "raw", "pick"),
                    help="the mode for every corpus (default: by the corpus's name)")
    ap.add_argument("corpus", nargs="+")
    args = ap.parse_args()
    counts = {"pick n/a": 0, "pick levels": 0, "pick whole": 0, "pick fail": 0, "pick exc": 0}
    n = bad = 0
    top = tempfile.mkdtemp(prefix="mmleak-compare.")
    try:
        for corpus in args.corpus:
            base = os.path.basename(corpus.rstrip("/")).replace("small-", "")
            mode = args.mode or MODES.get(base)
            if mode is None:
                sys.exit("%s: which mode? (--mode)" % corpus)
            for name in sorted(os.listdir(corpus)):
                with open(os.path.join(corpus, name), "rb") as f:
                    data = f.read()
                if not data:
                    continue
                d = os.path.join(top, "t")
                os.mkdir(d)
                try:
                    diff = compare(mode, corpus, data, d, counts)
                finally:
                    shutil.rmtree(d)
                n += 1
                if diff is not None:
                    bad += 1
                    print("DIFF %s %s %s" % (mode, corpus, name))
                    a, b = diff
                    if mode != "pick" and a[0] == b[0] == "ok":     # the first part that differs
                        a, b = next((x, y) for x, y in zip(a[1], b[1]) if x != y) \
                            if isinstance(a[1], tuple) else (a[1], b[1])
                    la, lb = ("whole", "levels") if mode == "pick" else ("python", "native")
                    print("  %s: %.600r\n  %s: %.600r" % (la, a, lb, b))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    print("inputs compared: %d, differences: %d%s" % (
        n, bad, "" if not any(counts.values()) else
        " (pick: %d from the levels, %d read whole, %d refused, %d whole readings only, "
        "%d errors)"
        % (counts["pick levels"], counts["pick whole"], counts["pick fail"],
           counts["pick n/a"], counts["pick exc"])))
    for k in sorted(k for k in counts if k.startswith("n/a: ")):
        print("  whole readings only, %s: %d" % (k[5:], counts[k]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
