"""The reachability scan (issue 20; mmleak-scan(7), the result in mmleak-format(5)): one case
program per root and fate (tests/scan_cases.c), each with its exact kinds, checked against
valgrind memcheck on the same program; the scan on demand of a running process; the
program's own request (mmleak.h); the result file and its reader."""
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import LIB, ROOT, TESTS, run_traced

TARGET = 4321
CASES = {
    # case: the kinds of its TARGET blocks (sorted)
    "global": ["reachable"],
    "static": ["reachable"],
    "dlbss": ["reachable"],
    "tls": ["reachable"],
    "dltls": ["reachable"],
    "thread-stack": ["reachable"],
    "thread-register": ["reachable"],
    "mmap": ["reachable"],
    "pool": ["reachable"],
    "chain": ["reachable", "reachable", "reachable"],
    "cycle": ["definite", "indirect"],
    "lost-chain": ["definite", "indirect"],
    "interior": ["possible"],
    "xor": ["definite"],
    "freed": ["definite"],
    "lost": ["definite"],
}


@pytest.fixture(scope="module")
def scan_bins(tmp_path_factory, lib):
    subprocess.run(["make", "-s", "-C", ROOT, "mmleak-scan"], check=True)
    d = tmp_path_factory.mktemp("scanbin")
    out = {}
    for name, src, extra in (("scan_cases", "scan_cases.c", ["-pthread", "-ldl"]),
                             ("libscan.so", "scan_lib.c", ["-shared", "-fPIC"]),
                             ("scan_api", "scan_api.c", ["-I" + os.path.join(ROOT, "include")]),
                             ("scan_daemon", "scan_daemon.c", ["-pthread"])):
        exe = str(d / name)
        subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", exe,
                        os.path.join(TESTS, src)] + extra, check=True)
        out[name] = exe
    return out


def target_blocks(dump_dir, tid):
    """(address, SEQ) of the TARGET blocks alive at the end of trace TID."""
    import mmleaklib as mm
    paths = mm.find_traces(str(dump_dir))[tid]
    sh = mm.shrink_files(paths)
    return [(a.ptr, a.seq) for a in sh.survivors() if a.size == TARGET]


def only_trace(dump_dir):
    import mmleaklib as mm
    traces = mm.find_traces(str(dump_dir))
    assert len(traces) == 1, traces
    return next(iter(traces))


def mmleak_kinds(scan_bins, dump, case):
    env = {"SCAN_LIB": scan_bins["libscan.so"]}
    run_traced([scan_bins["scan_cases"], case], dump, env=env)
    from mmleaklib import scan
    tid = only_trace(dump)
    k = scan.kinds_for(str(dump), tid)
    assert k.status == "done", k.reason
    assert k.scan.why == "exit"
    return sorted(k.kind(*b) for b in target_blocks(dump, tid))


VG_RECORD = re.compile(r"^==\d+== ([\d,]+)(?: \(([\d,]+) direct, ([\d,]+) indirect\))? bytes in "
                       r"([\d,]+) blocks are (definitely lost|indirectly lost|possibly lost|"
                       r"still reachable) in loss record")
VG_KIND = {"definitely lost": "definite", "indirectly lost": "indirect",
           "possibly lost": "possible", "still reachable": "reachable"}


def valgrind_kinds(scan_bins, case):
    """The kinds valgrind memcheck gives the TARGET blocks (the loss records whose stack
    goes through target())."""
    env = dict(os.environ, SCAN_LIB=scan_bins["libscan.so"])
    env.pop("LD_PRELOAD", None)
    r = subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                        scan_bins["scan_cases"], case], env=env, capture_output=True,
                       text=True, timeout=300)
    kinds = []
    record = None
    for line in r.stderr.splitlines():
        m = VG_RECORD.match(line)
        if m:
            record = (VG_KIND[m.group(5)], int(m.group(4).replace(",", "")))
            continue
        if record and re.search(r"\btarget \(scan_cases\.c", line):
            kinds += [record[0]] * record[1]
            record = None
        elif record and not re.match(r"^==\d+==\s+(at|by) ", line):
            record = None
    return sorted(kinds)


needs_valgrind = pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind not installed")


@pytest.mark.parametrize("case", sorted(CASES))
def test_case_kinds_at_exit(scan_bins, dump, case):
    """Each root and fate: the exact kinds of its blocks at exit."""
    assert mmleak_kinds(scan_bins, dump, case) == CASES[case]


@needs_valgrind
@pytest.mark.parametrize("case", sorted(CASES))
def test_case_kinds_match_valgrind(scan_bins, case):
    """valgrind memcheck, the oracle, gives the same kinds on the same program."""
    assert valgrind_kinds(scan_bins, case) == CASES[case]
