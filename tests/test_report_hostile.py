"""mmleak-panda.py and `mmleak.py report` on extreme but legal dump lines, on garbage, and with
paths and options that cannot work: a correct page or one line on stderr with the documented
exit status, never a traceback (review #8, item 10).

Run: /usr/bin/python3 -m pytest tests/test_report_hostile.py
"""
import contextlib
import csv
import html
import io
import os
import random
import re
import subprocess
import sys
import time

import pytest

from test_report import PANDA, MMLEAK, PY, REPO, headline, mmleak, panda, table

U64 = (1 << 64) - 1
I64 = (1 << 63) - 1

# Legal in the format: every number is up to 16 hex digits.
EXTREME = (b"#mmleak 1 id=77 pid=77 tid=77 file=0 depth=1 start=1700000000\n"
           b"#cmd ./x\n"
           b"00000000aaaa 0 ffffffffffffffff 7fffffffffffffff 400000\n"
           b"00000000bbbb 0 ffffffffffffffff 0 400000\n"
           b"000000000000 0 0 ffffffffffffffff 0\n"
           b"ffffffffffff 0 10 0 ffffffffffff\n")
EXTREME_TOTAL = 2 * U64 + 16


def rows_of(text):
    return [(r["bytes"], r["blocks"], r["min"], r["max"], r["oldest"], r["youngest"])
            for r in table(text)[0]]


def run_panda(data, *args):
    p = subprocess.run([PY, PANDA] + list(args), input=data, capture_output=True)
    assert b"Traceback" not in p.stderr
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def run_mmleak(*args):
    p = subprocess.run([PY, MMLEAK] + list(args), capture_output=True, text=True)
    assert "Traceback" not in p.stderr
    return p.returncode, p.stdout, p.stderr


# --------------------------------------------------------------------------------------------
# 64-bit sizes and times: exact pages

def test_panda_extreme_numbers_exact():
    rc, out, err = run_panda(EXTREME)
    assert (rc, err) == (0, "")
    assert headline(out) == (EXTREME_TOTAL, 4)
    # end of the trace: the newest allocation, 2^64-1 s
    assert rows_of(out) == [(2 * U64, 2, U64, U64, U64, U64 - I64),
                            (16, 1, 16, 16, U64, U64),
                            (0, 1, 0, 0, 0, 0)]
    assert "32.0 EiB" in out
    assert '<td class="num" data-v="%d" title="%s bytes">' % (2 * U64, "{:,}".format(2 * U64)) \
        in out


def test_panda_extreme_numbers_filters():
    # an end before the newest allocation: ages never negative
    rc, out, err = run_panda(EXTREME, "--end-time", "5")
    assert (rc, err) == (0, "")
    assert rows_of(out) == [(2 * U64, 2, U64, U64, 5, 0), (16, 1, 16, 16, 5, 5),
                            (0, 1, 0, 0, 0, 0)]
    rc, out, err = run_panda(EXTREME, "--since", "1e19")
    assert (rc, err) == (0, "")
    assert headline(out) == (0, 1)
    # 2^64-1 - t >= 1e19  <=>  t <= 8446744073709551615: the blocks of time 0
    rc, out, err = run_panda(EXTREME, "--older-than", "1e19")
    assert (rc, err) == (0, "")
    assert headline(out) == (U64 + 16, 2)


def test_render_report_extreme_numbers(tmp_path):
    surv = [mmleak.parse_event(l + b"\n") for l in EXTREME.splitlines() if l[:1] != b"#"]
    out = str(tmp_path / "r.html")
    rep = {"trace": "77", "pid": "77", "cmd": "./x", "start": 0, "end_time": U64,
           "files": ["/x/mmleak.77.0.out"], "events": 4, "allocs": 4, "frees": 0,
           "survivors": surv, "foreign_frees": [], "frames": {}, "symbol_error": None,
           "depth": 1, "trace_depth": 1, "incomplete": False}
    panda.render_report(rep, out)
    text = open(out, encoding="utf-8").read()
    assert headline(text) == (EXTREME_TOTAL, 4)
    assert rows_of(text)[0] == (2 * U64, 2, U64, U64, U64, U64 - I64)


def test_report_extreme_numbers_exact(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "mmleak.77.0.out").write_bytes(EXTREME + b"#end\n")
    rc, out, err = run_mmleak("report", str(d), "--csv", str(tmp_path / "s.csv"))
    assert (rc, err) == (0, "")
    assert out == (
        "mmleak: trace 77 (pid 77): ./x\n"
        "  4 events read from 1 files; 32.0 EiB in 4 blocks not freed; 0 frees of blocks "
        "allocated before tracing\n"
        "  symbols: maps file %s/mmleak.77.maps missing\n"
        "                 bytes   blocks  call site\n"
        "  36893488147419103230        2  0x400000\n"
        "                    16        1  0xffffffffffff\n"
        "                     0        1  0x0\n"
        "CSV: %s/s.csv\n"
        "HTML report: %s/mmleak.77.html\n" % (d, tmp_path, d))
    with open(str(tmp_path / "s.csv")) as f:
        rows = list(csv.reader(f))
    assert [r[:7] + r[-1:] for r in rows[1:]] == [
        [str(2 * U64), "2", str(U64), str(U64), str(U64), str(U64), str(U64 - I64),
         "0x400000"],
        ["16", "1", "16", "16", "16", str(U64), str(U64), "0xffffffffffff"],
        ["0", "1", "0", "0", "0", "0", "0", "0x0"]]
    text = open(str(d / "mmleak.77.html"), encoding="utf-8").read()
    assert headline(text) == (EXTREME_TOTAL, 4)
    assert rows_of(text) == [(2 * U64, 2, U64, U64, U64, U64 - I64), (16, 1, 16, 16, U64, U64),
                             (0, 1, 0, 0, 0, 0)]
    rc, out2, err = run_mmleak("report", str(d), "--no-html")
    assert (rc, err) == (0, "")
    assert out2 == out.split("CSV:")[0]


def test_start_time_not_a_date(tmp_path):
    data = EXTREME.replace(b"start=1700000000", b"start=99999999999999999999")
    rc, out, err = run_panda(data)
    assert (rc, err) == (0, "")
    assert "start 99999999999999999999 (not a valid date)" in out
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "mmleak.77.0.out").write_bytes(data)
    rc, out, err = run_mmleak("report", str(d))
    assert (rc, err) == (0, "")
    assert "start 99999999999999999999 (not a valid date)" in \
        open(str(d / "mmleak.77.html"), encoding="utf-8").read()


# --------------------------------------------------------------------------------------------
# Paths and options that cannot work: one line, the documented status

def test_panda_output_in_missing_directory(tmp_path):
    out = str(tmp_path / "no" / "such" / "r.html")
    rc, stdout, err = run_panda(EXTREME, "-o", out)
    assert (rc, stdout) == (2, "")
    assert err == "mmleak-panda.py: cannot write %s: No such file or directory\n" % out
    rc, stdout, err = run_panda(EXTREME, "-o", str(tmp_path))     # a directory
    assert rc == 2 and err.startswith("mmleak-panda.py: cannot write %s" % tmp_path)
    assert os.listdir(str(tmp_path)) == []                         # no temporary left


def test_report_paths_that_cannot_work(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "mmleak.77.0.out").write_bytes(EXTREME)
    miss = str(tmp_path / "no" / "x")
    cases = [
        (["report", str(d), "-o", miss + ".html"],
         "mmleak.py: cannot write %s.html: No such file or directory\n" % miss),
        (["report", str(d), "--no-html", "--csv", miss + ".csv"],
         "mmleak.py: cannot write %s.csv: No such file or directory\n" % miss),
        (["report", str(d), "--no-html", "--baseline", miss + ".txt"],
         "mmleak.py: --baseline %s.txt: No such file or directory\n" % miss),
        (["shrink", str(d / "mmleak.77.0.out"), "-o", miss + ".txt"],
         "mmleak.py: cannot write %s.txt: No such file or directory\n" % miss),
    ]
    for args, msg in cases:
        rc, out, err = run_mmleak(*args)
        assert (rc, err) == (2, msg), args
    assert sorted(os.listdir(str(d))) == ["mmleak.77.0.out"]


@pytest.mark.parametrize("args,msg", [
    (["--end-time", "inf"], "--end-time: not a finite number: 'inf'"),
    (["--end-time", "nan"], "--end-time: not a finite number: 'nan'"),
    (["--end-time", "-1"], "--end-time: must not be negative: '-1'"),
    (["--since", "nan"], "--since: not a finite number: 'nan'"),
    (["--older-than=-inf"], "--older-than: not a finite number: '-inf'"),
    (["--depth", "0"], "--depth: must be at least 1: '0'"),
    (["--depth", "-3"], "--depth: must be at least 1: '-3'"),
    (["--top", "0"], "--top: must be at least 1: '0'"),
])
def test_panda_bad_numbers(args, msg):
    rc, out, err = run_panda(EXTREME, *args)
    assert (rc, out) == (1, "")
    assert err == "mmleak-panda.py: argument %s (see --help)\n" % msg


@pytest.mark.parametrize("args,msg", [
    (["--since", "nan"], "--since: not a finite number: 'nan'"),
    (["--older-than", "inf"], "--older-than: not a finite number: 'inf'"),
    (["--depth", "0"], "--depth: must be at least 1: '0'"),
    (["--top", "-1"], "--top: must be at least 1: '-1'"),
])
def test_report_bad_numbers(tmp_path, args, msg):
    rc, out, err = run_mmleak("report", str(tmp_path), "--no-html", *args)
    assert (rc, out) == (1, "")
    assert err.splitlines()[-1] == "mmleak.py report: error: argument %s" % msg


@pytest.mark.parametrize("cmd", [["run", "--depth", "%s", "--", "/bin/true"],
                                 ["attach", "--depth", "%s", "1"]])
@pytest.mark.parametrize("value,msg", [("65", "at most 64: '65'"),
                                       ("99999999999999999999", "at most 64: "
                                                                "'99999999999999999999'")])
def test_trace_depth_out_of_range(cmd, value, msg):
    """mmleak.so ignores an MMLEAK_DEPTH past 64 (and records the default): the commands
    that set it refuse it instead, before running or touching anything."""
    rc, out, err = run_mmleak(*[a % value if a == "%s" else a for a in cmd])
    assert (rc, out) == (1, "")
    assert err.splitlines()[-1] == "mmleak.py %s: error: argument --depth: %s" % (cmd[0], msg)


def test_bad_header_fields(tmp_path):
    data = EXTREME.replace(b"depth=1 start=1700000000", b"depth=x start=zz")
    # the pipe: a line not in the format, no page
    rc, out, err = run_panda(data)
    assert (rc, out) == (2, "")
    assert err == ("mmleak-panda.py: <stdin>:1: malformed header fields depth=x start=zz "
                   "(decimal numbers expected); no report written\n")
    # report: reported like any malformed line, the field ignored, status 3
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "mmleak.77.0.out").write_bytes(data)
    rc, out, err = run_mmleak("report", str(d), "--no-html")
    assert rc == 3
    assert err == ("mmleak.py: %s/mmleak.77.0.out:1: malformed header field depth=x (a decimal "
                   "number expected): ignored\n"
                   "mmleak.py: %s/mmleak.77.0.out:1: malformed header field start=zz (a "
                   "decimal number expected): ignored\n" % (d, d))
    assert "  36893488147419103230        2  0x400000\n" in out


# --------------------------------------------------------------------------------------------
# Fuzz: extreme legal lines, and garbage, through both commands, in-process (a traceback would
# be an exception out of main()).  Seeded; a fixed number of runs of a few seconds in all.

EDGE = [0, 1, 0xfff, 0xffffffffffff, I64, I64 + 1, U64]


def num(rnd):
    return rnd.choice(EDGE) if rnd.random() < 0.5 else rnd.getrandbits(rnd.choice((4, 16, 48,
                                                                                   64)))


def legal_lines(rnd, n, depth_max):
    """N lines, each of its own address: (bytes, survivor count, survivor bytes, frees)."""
    out, blocks, total, frees = [], 0, 0, 0
    ptrs = rnd.sample(range(1, 1 << 48), n)
    for i, ptr in enumerate(ptrs):
        if rnd.random() < 0.05:
            ptr = rnd.choice((0, 0xffffffffffff, U64))
            if any(l.startswith(b"%012x " % ptr) for l in out):
                continue
        if rnd.random() < 0.8:
            size, t = num(rnd), num(rnd)
            callers = " ".join("%x" % num(rnd) for _ in range(rnd.randint(1, depth_max)))
            out.append(b"%012x %x %x %x %s\n" % (ptr, num(rnd), size, t, callers.encode()))
            blocks += 1
            total += size
        else:
            out.append(b"%012x %x %x\n" % (ptr, num(rnd), num(rnd)))
            frees += 1
    return out, blocks, total, frees


GARBAGE = [b"", b"\n", b"\0\0\0", b"zz 1 2 3 4\n", b"1 2 3 4 5 6\n", b"AB 1 2 3 4\n",
           b"1  2 3 4 5\n", b"%x 1 2 3 4\n" % (1 << 68), b"1 2 12345678901234567 3 4\n",
           b"1 2 +\n", b"1 2 -\n", b"1 2\n", b"\xff\xfe\n", b"#mmleak\n", b"#mmleak 1\n",
           b"#mmleak 1 depth=-1 start=-5\n", b"#mmleak 1 depth=99999999999999999999\n",
           b"#mmleak 1 pid=\xff start=1e9\n", b"#mmleak 2 id=1\n", b"#cmd \xff\\x00\n",
           b"#thread tid=x\n", b"#end junk\n", b"#at 99\n", b"1 2 3 4 5" * 500 + b"\n",
           b"1 2 3 4 5"]


def garbage_lines(rnd, lines):
    lines = list(lines)
    for _ in range(rnd.randint(1, 4)):
        g = rnd.choice(GARBAGE)
        if rnd.random() < 0.3 and lines:
            l = rnd.choice(lines)
            cut = rnd.randrange(len(l) + 1)
            g = l[:cut] + rnd.choice((b"", b"\0", b" ", b"g", b"\n")) + l[cut:]
        lines.insert(rnd.randrange(len(lines) + 1), g)
    return lines


class StdIn:
    def __init__(self, data):
        self.buffer = io.BytesIO(data)

    def isatty(self):
        return False


def call(main, argv, stdin=b""):
    """Run MAIN(argv) as the command would run: -> (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    sys.stdin = StdIn(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
    finally:
        sys.stdin = old
    return rc, out.getvalue(), err.getvalue()


def check_stderr(err, prog):
    assert "Traceback" not in err
    for line in err.splitlines():
        assert line.startswith((prog + ": ", "usage: ")), line


HEADER = b"#mmleak 1 id=42 pid=42 tid=42 file=%d depth=%d start=%d\n"


def test_fuzz_panda_and_report(tmp_path, monkeypatch):
    rnd = random.Random(20261122)
    t0 = time.monotonic()
    runs = 0
    for case in range(24):
        garbage = case % 3 == 2
        depth = rnd.choice((1, 2, 8))
        lines, blocks, total, frees = legal_lines(rnd, rnd.randint(0, 40), depth)
        head = HEADER % (0, depth, rnd.choice((0, 1700000000, 99999999999)))
        body = garbage_lines(rnd, lines) if garbage else lines
        # -- mmleak-panda.py: survivor lines on stdin (the frees count as foreign frees)
        if case % 2 == 0:
            out_html = str(tmp_path / ("p%d.html" % case))
            extra = rnd.choice(([], ["--end-time", "0"], ["--since", "1e18"],
                                ["--older-than", "5"], ["--depth", "1"], ["--top", "1"]))
            rc, out, err = call(panda.main, ["-o", out_html] + extra,
                                b"".join([head] + body))
            check_stderr(err, "mmleak-panda.py")
            runs += 1
            if not garbage:
                assert (rc, err) == (0, ""), case
                if not extra or extra[0] in ("--end-time", "--depth", "--top"):
                    assert headline(open(out_html, encoding="utf-8").read()) == \
                        (total, blocks), case
            else:
                assert rc in (0, 2), (case, rc, err)
                assert os.path.exists(out_html) == (rc == 0)
        # -- mmleak.py report on a dump directory (two files of one process), with the
        # compiled shrinker and the Python one in turn
        monkeypatch.setenv("MMLEAK_SHRINK", ("python", "auto")[case % 2])
        d = tmp_path / ("d%d" % case)
        d.mkdir()
        half = len(body) // 2
        (d / "mmleak.42.0.out").write_bytes(b"".join([head] + body[:half]))
        (d / "mmleak.42.1.out").write_bytes(b"".join([HEADER % (1, depth, 0)] + body[half:]))
        modes = [["--no-html"], ["--no-html", "--csv", str(d / "s.csv")]]
        if case % 4 == 1:
            modes.append(["-o", str(d / "r.html")])
        for mode in modes:
            rc, out, err = call(mmleak.main, ["report", str(d)] + mode)
            check_stderr(err, "mmleak.py")
            runs += 1
            if not garbage:
                assert (rc, err) == (0, ""), (case, mode, err)
                assert out.splitlines()[1].startswith(
                    "  %d events read from 2 files; %s in %d blocks not freed; %d frees"
                    % (blocks + frees, mmleak.human_bytes(total), blocks, frees)), case
                if "-o" in mode:
                    assert headline(open(str(d / "r.html"), encoding="utf-8").read()) == \
                        (total, blocks), case
                if "--csv" in mode:
                    with open(str(d / "s.csv")) as f:
                        rows = list(csv.reader(f))[1:]
                    assert sum(int(r[0]) for r in rows) == total, case
                    assert sum(int(r[1]) for r in rows) == blocks, case
            else:
                assert rc in (0, 2, 3), (case, mode, rc, err)
    print("fuzz: %d runs in %.1f s" % (runs, time.monotonic() - t0))


def test_recover_missing_path_and_absurd_pid(tmp_path):
    # a path that does not exist is an input that could not be used (2), not "nothing"
    rc, out, err = run_mmleak("recover", str(tmp_path / "nope"))
    assert (rc, out, err) == (2, "nothing to recover\n",
                              "mmleak.py: %s: No such file or directory\n" % (tmp_path / "nope"))
    # a pid no system can have (from a file name): not running, folded
    big = "99999999999999999999"
    head = b"#mmleak 1 id=%s\n" % big.encode()
    (tmp_path / ("mmleak.%s.0.out" % big)).write_bytes(head)
    half = b"#at %016x\n1000 0 10 0 400000\n" % len(head)
    half += b"\0" * (128 - len(half))
    (tmp_path / ("mmleak.%s.0.tail" % big)).write_bytes(half + b"\0" * 128)
    rc, out, err = run_mmleak("recover", str(tmp_path))
    assert (rc, err) == (0, "")
    assert not (tmp_path / ("mmleak.%s.0.tail" % big)).exists()
    assert (tmp_path / ("mmleak.%s.0.out" % big)).read_bytes().endswith(
        b"1000 0 10 0 400000\n")


# --------------------------------------------------------------------------------------------
# A damaged growth series (mmleak.ID.series, written by the compactor): its bad lines are
# skipped, one line each on stderr, status 3; the compactor goes on appending to it.

SERIES_OK = (b"#series 1 id=77\n"
             b"p 1700000000 0 16 1 16 1 0 0\n"
             b"k 400000 16 1 16 1 0 0\n"
             b"p 1700000100 100 48 2 32 1 0 0\n"
             b"k 400000 48 2 32 1 0 0\n")
SERIES_BAD = [b"p 1700000050 1e9 16 1 16 1 0 0\n", b"p 1 2 3\n", b"p nan 0 0 0 0 0 0 0\n",
              b"k 400000 fffffffffffffffff 1 0 0 0 0\n", b"k @zz 1 1 1 1 1 1\n",
              b"k 400000 -1 1 1 1 1 1\n", b"k 400000\n", b"#s nothex 400000\n",
              b"p %s 0 0 0 0 0 0 0\n" % (b"9" * 40)]


def test_report_and_compact_with_a_damaged_series(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "mmleak.77.0.out").write_bytes(EXTREME.replace(b"#mmleak 1 ", b"#mmleak 2 ") +
                                        b"#end\n")
    lines = SERIES_OK.splitlines(keepends=True)
    (d / "mmleak.77.series").write_bytes(b"".join(lines[:3] + SERIES_BAD + lines[3:]))
    rc, out, err = run_mmleak("report", str(d), "--no-html")
    assert rc == 3
    series = str(d / "mmleak.77.series")
    assert err.splitlines() == ["mmleak.py: %s:%d: malformed series line skipped: %r"
                                % (series, 4 + i, b[:80]) for i, b in enumerate(SERIES_BAD[:5])
                                ] + ["mmleak.py: %s: %d more lines with the same problem "
                                     "(malformed) not shown" % (series, len(SERIES_BAD) - 5)]
    # the two good points make the growth section
    assert "growth over 2 points of the series (100 s of the trace's time)" in out
    assert "            16 ->           48          +32" in out
    rc, out, err = run_mmleak("report", str(d), "-o", str(d / "r.html"))
    assert rc == 3 and os.path.exists(str(d / "r.html"))
    # the compactor folds the file and adds its point; it writes the series whole (by
    # rename), with the good lines only
    rc, out, err = run_mmleak("compact", str(d))
    assert (rc, err) == (0, "")
    with open(series, "rb") as f:
        after = f.read().splitlines(keepends=True)
    assert all(mmleak.series_line_ok(l) for l in after)
    good = [l for l in after if l.startswith(b"p ")]
    assert len(good) == 3 and good[:2] == [lines[1], lines[3]]
    rc, out, err = run_mmleak("report", str(d), "--no-html")
    assert (rc, err) == (0, "") and "growth over 3 points of the series" in out


@pytest.mark.parametrize("points, header, row", [
    ([(0, 16), (100, 48)], "100 s of the trace's time), by call site (live bytes first -> last; "
     "no rate per hour from fewer than 3 points)", "+32  0x400000"),
    ([(0, 16), (10, 32), (30, 48)], "30 s of the trace's time), by call site (live bytes first "
     "-> last; no rate per hour from a series shorter than 60 s)", "+32  0x400000"),
    ([(0, 16), (60, 32), (120, 48)], "2 min of the trace's time), by call site (live bytes "
     "first -> last)", "+32 (+960 B/h)  0x400000")])
def test_a_rate_per_hour_only_from_a_minute_of_series_or_more(tmp_path, points, header, row):
    """A short run's series (2 points 2 s apart: make demo) gave "+130867200 B/h", an hour
    extrapolated from its start-up; now a rate needs 3 points over a minute or more, and the
    header says why there is none (the text report and the page alike)."""
    d = tmp_path / "dumps"
    d.mkdir()
    (d / "mmleak.77.0.out").write_bytes(EXTREME.replace(b"#mmleak 1 ", b"#mmleak 2 ") +
                                        b"#end\n")
    (d / "mmleak.77.series").write_bytes(b"#series 1 id=77\n" + b"".join(
        b"p %d %d %d 1 16 1 0 0\nk 400000 %d 1 16 1 0 0\n" % (1700000000 + t, t, b, b)
        for t, b in points))
    rc, out, err = run_mmleak("report", str(d), "--no-html")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    at = lines.index("  growth over %d points of the series (%s:" % (len(points), header))
    assert lines[at + 1:] == ["            16 ->           48          %s" % row]
    rc, out, err = run_mmleak("report", str(d), "-o", str(d / "r.html"))
    assert (rc, err) == (0, "")
    page = (d / "r.html").read_text()
    if "B/h" in row:
        assert "<th>bytes per hour</th>" in page and "<td class=n>+960</td>" in page
    else:
        assert "bytes per hour" not in page
        assert "No rate per hour from %s." % header.split("from ")[1][:-1] in page


def test_an_ended_file_takes_no_lines_from_a_staging_file_of_its_name(tmp_path):
    # A rotating thread renames its staging file to the next file's name
    # (tracer/threadfile.c, file_rotate): a name or hard link taken before (a backup, a shadow
    # copy) then holds the next file's lines, at offsets that may lie past the end of the
    # ended file.  Its lines
    # were all flushed before its "#end", so a reader takes none from the .tail.
    head = b"#mmleak 2 id=88\n"
    body = b"".join(b"%012x 1 10 0 400000\n" % (0x1000 + 16 * i) for i in range(4))
    out = tmp_path / "mmleak.88.3.out"
    tail = tmp_path / "mmleak.88.3.tail"
    half = b"#at %016x\n" % len(head + body) + b"%012x 2 20 0 400000\n" % 0x9000
    half += b"\0" * (256 - len(half))
    tail.write_bytes(half + b"\0" * 256)
    out.write_bytes(head + body)
    # not ended: the staged line is the newest event and is read
    assert mmleak.unflushed_tail(str(out)) == b"%012x 2 20 0 400000\n" % 0x9000
    out.write_bytes(head + body + b"#end\n")
    assert mmleak.unflushed_tail(str(out)) == b""
    assert mmleak.unflushed_tail(str(out), with_size=True) == (b"", len(head + body) + 5)
    got = mmleak.shrink_files([str(out)])
    assert sorted(a.size for a in got.survivors()) == [16] * 4
    assert not got.problems.malformed


# What a terminal acts on: ESC (C0), CSI as one character (C1, U+009B), a right-to-left
# override (U+202E): written by whoever made the trace's files, in its command line, its
# title, the paths of its maps file (the module a call site is shown in).
HOSTILE_TEXT = [b"\x1b]0;PWNED\x07", b"\x1b[2J", "\u009b31m".encode(), "\u202e".encode()]
RAW_UNSAFE = [b"\x1b", b"\x07", "\u009b".encode(), "\u202e".encode()]


def test_names_from_a_trace_reach_the_terminal_escaped(tmp_path):
    bad = b"".join(HOSTILE_TEXT)
    (tmp_path / "mmleak.79.0.out").write_bytes(
        b"#mmleak 2 id=79 pid=79 tid=79 file=0 depth=2 start=1700000000\n#cmd ./x" + bad +
        b"\n#s 11111111111 400010 500010\n1000 0 64 0 @11111111111\n#title t=1 T" + bad +
        b"\n#end\n")
    (tmp_path / "mmleak.79.maps").write_bytes(
        b"400000-401000 r-xp 00000000 fe:00 0    /nonexistent/m" + bad + b"\n"
        b"500000-501000 r-xp 00000000 fe:00 0    /nonexistent/n" + bad + b"\n")
    outs = []
    for args in (["report", str(tmp_path), "--no-html"],
                 ["report", str(tmp_path), "--no-html", "--check", "--leak-kinds", "all"],
                 ["symbolize", "--maps", str(tmp_path / "mmleak.79.maps"), "400010"],
                 ["report", str(tmp_path / "gone").encode() + bad]):
        p = subprocess.run([PY, MMLEAK] + args, capture_output=True)
        assert b"Traceback" not in p.stderr
        outs.append(p.stdout + p.stderr)
    for o in outs:
        assert not [c for c in RAW_UNSAFE if c in o], o
    text = b"".join(outs).decode()
    assert "\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m\\u202e" in text
    assert "m\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m\\u202e+0x10" in outs[0].decode()
    assert "T\\x1b]0;PWNED" in outs[0].decode() and "./x\\x1b]0;PWNED" in outs[0].decode()
    assert "check FAILED: trace 79 (./x\\x1b]0;PWNED" in outs[1].decode()
    assert "gone\\x1b]0;PWNED" in outs[3].decode()


def test_the_page_at_a_traces_name_is_as_private_as_its_dump_files(tmp_path):
    # The dump files are 0600 (mmleak.so): the page report writes beside them by default
    # (mmleak.ID.html) shows as much (the command line, the stacks), so it is 0600 too,
    # whatever the umask; a name the user chose that is not a trace's follows the umask.
    (tmp_path / "mmleak.80.0.out").write_bytes(
        b"#mmleak 2 id=80 pid=80 tid=80 file=0 depth=1 start=1700000000\n#cmd ./x --password=s\n"
        b"1000 0 64 0 400010\n#end\n")
    (tmp_path / "mmleak.80.maps").write_bytes(b"")
    os.chmod(str(tmp_path / "mmleak.80.0.out"), 0o600)
    other = tmp_path / "www"
    other.mkdir()
    for args, page, mode in (([], tmp_path / "mmleak.80.html", 0o600),
                             (["-o", str(other / "mmleak.80.html")], other / "mmleak.80.html",
                              0o600),
                             (["-o", str(other / "page.html")], other / "page.html", 0o644)):
        p = subprocess.run([PY, MMLEAK, "report", str(tmp_path)] + args, capture_output=True,
                           text=True, preexec_fn=lambda: os.umask(0o022))
        assert p.returncode == 0, p.stderr
        assert os.stat(str(page)).st_mode & 0o777 == mode, page


def test_a_reader_held_by_the_traces_lock_says_who_holds_it(tmp_path):
    # The lock file is the trace owner's: the owner can hold it as long as it likes, and a
    # reader (root's report of that trace) then waits; it says so at once, naming the
    # holder, and reads the trace once the lock is let go.
    import fcntl
    import select
    (tmp_path / "mmleak.81.0.out").write_bytes(
        b"#mmleak 2 id=81 pid=81 tid=81 file=0 depth=1 start=1700000000\n#cmd ./x\n"
        b"1000 0 64 0 400010\n#end\n")
    (tmp_path / "mmleak.81.maps").write_bytes(b"")
    fd = os.open(str(tmp_path / "mmleak.81.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        p = subprocess.Popen([PY, MMLEAK, "report", str(tmp_path), "--no-html"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = select.select([p.stderr], [], [], 60)[0]    # (only if it never says it)
        said = p.stderr.readline() if ready else ""
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    out, err = p.communicate(timeout=60)
    assert said == ("mmleak.py: trace 81: waiting for its lock %s, held by pid %d (%s)\n"
                    % (tmp_path / "mmleak.81.lock", os.getpid(),
                       open("/proc/self/comm").read().strip()))
    assert (p.returncode, err) == (0, "")
    assert "100 B in 1 blocks not freed" in out


LOADS_CHILD = r"""
import resource, sys
sys.path.insert(0, sys.argv[1])
from mmleaklib import symbolize
resource.setrlimit(resource.RLIMIT_AS, (256 << 20, 256 << 20))
sym = symbolize.Symbolizer(sys.argv[2], tool="mmleak-no-such-tool")
addrs = [int(a, 16) for a in sys.argv[3].split(",")]
frames = sym.lookup(addrs)
print(len({(f.module, f.offset, f.error) for f in frames.values()}),
      sum(1 for f in frames.values() if (f.module, f.offset) == ("true", 0x3010)))
"""


def test_a_log_of_loads_of_thousands_of_epochs(tmp_path):
    # The trace's owner writes its log of loads: 4,000 dlclose epochs, 10 new mappings in
    # each (40,000 lines, 2.4 MB), and 3,000 frames, each of another epoch.  Each epoch's
    # view was built from the whole log and kept: 45 million mappings, 4.2 GB and minutes
    # (docs/limits.rst, "Hostile users"); now the log's lines are indexed once.  The bound
    # is the address space (256 MiB; the fix peaks at 135 MB), not the time.
    epochs, per, nframes = 4000, 10, 3000
    maps, loads = tmp_path / "mmleak.7.maps", tmp_path / "mmleak.7.loads"
    lines = []
    for k in range(epochs):
        for j in range(per):
            a = 0x10000000 + (k * per + j) * 0x1000
            lines.append((k, "%x-%x r-xp %08x fe:00 1 /usr/bin/true\n"
                          % (a, a + 0x1000, j * 0x1000)))
    maps.write_text("".join(line for _, line in lines))
    loads.write_text("".join("+%d %s" % kl for kl in lines))
    # in epoch k, at 0x10 into its fourth mapping (file offset 0x3000)
    epoch = [k * epochs // nframes for k in range(nframes)]
    addrs = ["%x" % ((k << 48) | (0x10000000 + (k * per + 3) * 0x1000 + 0x10)) for k in epoch]
    assert len(set(epoch)) == nframes
    p = subprocess.run([PY, "-c", LOADS_CHILD, REPO, str(maps), ",".join(addrs)],
                       capture_output=True, text=True, timeout=600)
    assert (p.returncode, p.stderr, p.stdout) == (0, "", "1 %d\n" % nframes)


def test_names_from_a_trace_reach_the_page_as_text(tmp_path):
    # The page's charts (matplotlib) took "$...$" in a name as mathtext: a symbol "c$_$d"
    # (GCC allows $ in identifiers) was drawn as a subscript, "a$^{$b" failed the whole page
    # with a traceback; a control character went raw into the page (invisible there) and,
    # through matplotlib's missing-glyph warning, raw to the terminal.  Names are text in
    # the page, shown as on the terminal (\xHH), in the charts, the table and the flame data.
    bad = b"".join(HOSTILE_TEXT)
    names = [b"c$_$d", b"a$^{$b" + bad, b"</script><img src=x onerror=alert(1)>"]
    (tmp_path / "mmleak.78.0.out").write_bytes(
        b"#mmleak 2 id=78 pid=78 tid=78 file=0 depth=1 start=1700000000\n#cmd ./x" + bad +
        b"\n" + b"".join(b"%x 0 %x 0 %x\n" % (0x1000 + i, 64 * (i + 1), 0x400010 + 0x10000 * i)
                         for i in range(len(names))) + b"#end\n")
    (tmp_path / "mmleak.78.maps").write_bytes(b"".join(
        b"%x-%x r-xp 00000000 fe:00 0    /nonexistent/%s\n"
        % (0x400000 + 0x10000 * i, 0x401000 + 0x10000 * i, n) for i, n in enumerate(names)))
    p = subprocess.run([PY, MMLEAK, "report", str(tmp_path)], capture_output=True)
    assert (p.returncode, p.stderr) == (0, b""), p.stderr
    page = (tmp_path / "mmleak.78.html").read_bytes()
    assert not [c for c in RAW_UNSAFE if c in page]
    assert b"<img" not in page
    shown = "a$^{$b\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m\\u202e".encode()
    svg_text = re.findall(rb"<text[^>]*>([^<]*)</text>", page)
    assert b"#3 c$_$d+0x10" in svg_text                 # one text, not mathtext's pieces
    assert [t for t in svg_text if t.startswith(b"#2 " + shown[:20])]
    assert page.count(html.escape(shown.decode() + "+0x10").encode()) >= 2
    assert ("./x" + html.escape(shown[6:].decode())).encode() in page
