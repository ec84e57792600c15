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
    # bad '#' lines and malformed lines, in a dump and in a .compact that is not sorted
    # after all (report: streamed last, then read again the usual way): the compiled
    # reader's second reading counted afresh, without the problems of the '#' lines it
    # does not hand back again (the Python side counts those), so its "N more lines"
    # counts came short and a line past where the first reading stopped went unsaid
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
