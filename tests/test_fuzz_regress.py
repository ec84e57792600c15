"""The inputs the libFuzzer harnesses (tests/fuzz/fuzz_tools.c, `make fuzz`) found trouble
with, minimised, in tests/fuzz/regress/, replayed through the real command: `mmleak.py
shrink`, plain and --final, with both engines (the same status, output and stderr), each
with its exact expected status and first stderr line."""
import os

import pytest

from conftest import ROOT, mmleak
from test_shrink_native import assert_same_cli

REGRESS = os.path.join(ROOT, "tests", "fuzz", "regress")
SEP = b"\n~~8<~~\n"                     # (tests/fuzz/fuzz_tools.c: files of one input)
NOT_DUMP = mmleak.dumpformat.NOT_DUMP.encode()

# name: (status, first stderr line: "FILE: message" with FILE the input's file in{K}.out)
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
    status, first = EXPECT[name]
    for args in (["shrink", "--mixed"], ["shrink", "--mixed", "--final"]):
        rc, out, err = assert_same_cli(args + paths)
        assert (rc, err.split(b"\n")[0]) == (status, first)
        assert b"Traceback" not in err
