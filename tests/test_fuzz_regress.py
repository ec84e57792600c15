"""The inputs the libFuzzer harnesses (tests/fuzz/fuzz_tools.c, `make fuzz`) found trouble
with, minimised, in tests/fuzz/regress/, replayed through the real command: `mmleak.py
shrink`, plain and --final, with both engines (the same status, output and stderr), each
with its exact expected status and first stderr line.  An input of the merge harnesses
(the last file a compacted result) with a report's expectation is also a trace's directory
(mmleak.4242.K.out, the last mmleak.4242.compact) for `mmleak.py report --no-html`, which
streams the .compact last (a report's reading, the blocks): the same on both engines, its
expected status and last stderr line (the counts)."""
import os

import pytest

from conftest import ROOT, mmleak
from test_shrink_native import assert_same_cli

REGRESS = os.path.join(ROOT, "tests", "fuzz", "regress")
SEP = b"\n~~8<~~\n"                     # (tests/fuzz/fuzz_tools.c: files of one input)
NOT_DUMP = mmleak.dumpformat.NOT_DUMP.encode()

# name: (status, first stderr line: "FILE: message" with FILE the input's file in{K}.out)
# [, (report's status, its last stderr line: FILE t/mmleak.4242.K.out or .compact)]
EXPECT = {
    # tools/levels.c: an empty BIG gave NULL + 0 (UBSan); as a shrink input: in1 is one
    # byte that is no dump's start
    "pick-empty-big": (2, b"mmleak.py: in1.out: " + NOT_DUMP),
    # a bracket line, then a '#mmleak' header cut by NULs: the Python engine took the piece
    # for a header after events and refused the input as joined results (status 2), the
    # compiled one read it as a torn line (status 3); a whole line only counts now
    "joined-cut-header": (3, b"mmleak.py: in0.out:2: torn line (process killed while "
                             b"writing it?) ignored: b'#mmleak 2 id=14085 pid=14085 "
                             b"tid=14090 file=1 depth=1 start='"),
    # a bracket line, then a '#mmleak' header with a bad field: both refuse the input as
    # joined results, but the compiled reader also handed the header over after the
    # refusal (one more line, "malformed header field"); a refused header is not read now
    "joined-bad-header": (2, b"mmleak.py: in0.out:2: torn line (process killed while "
                             b"writing it?) ignored: b'55d50'"),
    # (tests/fuzz/compare.py, the merge and result_blocks corpora) a bracket line that
    # makes the input known as joined results, its event seen before in another file: the
    # compiled reader refused it, then still read the line ("event seen twice", one more
    # stderr line before the refusal); a refused line is not read now
    "joined-bracket-twice": (2, b"mmleak.py: in1.out:3: partial results joined into one "
                                b"file (a header after event lines, and bracket lines): the "
                                b"shrink cannot tell their lines apart; give them as "
                                b"separate files: refused"),
    # (the pick harness: in0 the compacted result, in1 a run) see test_pick_input_point
    "pick-no-stack-line": (0, b""),
    # bad '#' lines and malformed lines, in a dump and in a .compact that is not sorted
    # after all (report: streamed last, then read again the usual way): the compiled
    # reader's second reading counted afresh, without the problems of the '#' lines it
    # does not hand back again (the Python side counts those), so its "N more lines"
    # counts came short and a line past where the first reading stopped went unsaid
    # (tests/fuzz/compare.py, the pick corpora folded into a compacted result) a
    # "#compacted" line with allocs= but no entry_allocs=: the history's count of
    # allocations took one and not the other (report, compact: a traceback, status 1)
    "compacted-allocs-only": (0, b"", (0, b"")),
    "compact-unsorted-bad-hash": (
        3, b"mmleak.py: in0.out:1: malformed clock line skipped: b'#clock x1\\n'",
        (3, b"mmleak.py: t/mmleak.4242.compact: 1 more lines with the same problem "
            b"(malformed) not shown")),
}


def test_every_input_has_its_expectation():
    assert sorted(os.listdir(REGRESS)) == sorted(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_regress_input_replayed(tmp_path, monkeypatch, name, lib):
    with open(os.path.join(REGRESS, name), "rb") as f:
        data = f.read()
    monkeypatch.chdir(tmp_path)
    paths = []
    for k, part in enumerate(data[1:].split(SEP, 3)):
        paths.append("in%d.out" % k)
        (tmp_path / paths[-1]).write_bytes(part)
    status, first = EXPECT[name][:2]
    for args in (["shrink", "--mixed"], ["shrink", "--mixed", "--final"]):
        rc, out, err = assert_same_cli(args + paths)
        assert (rc, err.split(b"\n")[0]) == (status, first)
        assert b"Traceback" not in err
    if len(EXPECT[name]) > 2:
        (tmp_path / "t").mkdir()
        for k, p in enumerate(paths):
            to = "mmleak.4242.compact" if k == len(paths) - 1 else "mmleak.4242.%d.out" % k
            os.rename(p, os.path.join("t", to))
        rc, out, err = assert_same_cli(["report", "--no-html", "t"])
        assert (rc, err.rstrip(b"\n").split(b"\n")[-1]) == EXPECT[name][2]
        assert b"Traceback" not in err


# name: the series point of a pick harness's input (its first file the trace's compacted
# result, the others its runs), {site key: [bytes, blocks]}, however it is made
POINTS = {
    # blocks whose stack has no "#s" line: the Python reading keys them by NO_STACK's
    # caller (0), as the report shows them; a point read by the compiled shrinker (from the
    # levels, or whole) keyed them by their stack ids, defined nowhere
    "pick-no-stack-line": {b"0": [0x18 + 0x130, 2]},
}


@pytest.mark.parametrize("name", sorted(POINTS))
def test_pick_input_point(tmp_path, monkeypatch, name, lib):
    """The point from the levels (series.level_sums: the result's base, tools/levels.c's
    pick) and the whole trace read as a point reads it, by each engine: the same sums."""
    series = mmleak.series
    with open(os.path.join(REGRESS, name), "rb") as f:
        data = f.read()
    parts = data[1:].split(SEP, 3)
    big = str(tmp_path / "mmleak.4242.compact")
    runs = [str(tmp_path / ("mmleak.4242.%d.out" % k)) for k in range(len(parts) - 1)]
    for p, part in zip([big] + runs, parts):
        with open(p, "wb") as f:
            f.write(part)

    def sums(sh, live):
        return {k: v for k, v in series.site_sums(sh, live)[0].items() if v[0] or v[1]}
    monkeypatch.setenv("MMLEAK_SHRINK", "native")
    base = sums(*series._read_native([big]))
    got = series.level_sums(big, base, runs)
    assert got is not None and dict(got[0]) == POINTS[name]
    for engine in ("native", "python"):
        monkeypatch.setenv("MMLEAK_SHRINK", engine)
        sh = mmleak.shrink_files(runs + [big], mixed=True, blocks=True)
        assert sums(sh, sh.live()) == POINTS[name], engine
