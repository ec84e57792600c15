"""Issue 20, the report and CI side: leak kinds in the report (terminal, CSV, page, exports),
the --check gate (run and report), LeakSanitizer-style suppressions.

The kinds come from the reachability scanner (mmleaklib/scan.py, kinds_for).  Until it is
merged, the tests of the report's kinds use a TEST DOUBLE of kinds_for (fake_kinds below:
it classifies the blocks of tests/leakcheck.c by their sizes, which are unique), so that this
side is tested on its own; the tests that need the real scan are marked NEEDS_SCANNER."""
import csv
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import LIB, ROOT, TESTS, mmleak, run_traced, site_line
from mmleaklib import cli, compact, report
from mmleaklib import suppressions as supp
from mmleaklib.symbolize import Frame

MMLEAK = os.path.join(ROOT, "mmleak.py")
SRC = os.path.join(TESTS, "leakcheck.c")
HAVE_SCANNER = os.path.exists(os.path.join(ROOT, "mmleaklib", "scan.py"))
NEEDS_SCANNER = pytest.mark.skipif(
    not HAVE_SCANNER, reason="needs the reachability scanner (issue 20, branch h20a: "
    "mmleaklib/scan.py); remove this mark when it is merged")


@pytest.fixture(scope="module")
def prog(tmp_path_factory, lib):
    d = tmp_path_factory.mktemp("leakcheck")
    out = {}
    for name, extra in (("leakcheck", []), ("leakcheck_supp", ["-DDEFAULT_SUPP"])):
        exe = str(d / name)
        subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", exe, SRC] + extra,
                       check=True)
        out[name] = exe
    return out


def run_check(dump, argv, *opts, env=None):
    e = dict(os.environ)
    e.pop("MMLEAK_SUPPRESSIONS", None)
    e.update(env or {})
    return subprocess.run([sys.executable, MMLEAK, "run", "-d", str(dump), "--lib", LIB]
                          + list(opts) + ["--"] + argv, capture_output=True, text=True,
                          env=e, timeout=120)


def verdict(stderr):
    return [l for l in stderr.splitlines() if l.startswith("mmleak: check ")]


def label(fn, site):
    return "%s at %s:%d" % (fn, SRC, site_line("leakcheck.c", site))


# ---------------------------------------------------------------------------------------
# the matcher (LSan's TemplateMatch syntax)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,name,hit", [
    ("foo", "xfooy", True),                 # anywhere without anchors
    ("foo", "xfoy", False),
    ("^foo", "foobar", True),
    ("^foo", "xfoo", False),
    ("bar$", "foobar", True),
    ("bar$", "barfoo", False),
    ("^foo$", "foo", True),
    ("^foo$", "foox", False),
    ("a*c", "xxabyyc", True),
    ("^a*c$", "abc", True),
    ("^a*c$", "abcd", False),
    ("^a*c$", "ac", True),                    # '*' matches nothing too
    ("*", "x", True),
    ("foo$", "foofoo", True),               # LSan's leftmost matching says no: see the doc
    ("operator new[]", "operator new[](unsigned long)", True),    # no regex: [ ] ( ) . literal
    ("a.b", "axb", False),
    ("std::vector<int>::push_back", "std::vector<int>::push_back(int const&)", True),
    ("x", "", False),                       # no name never matches
    ("x", None, False),
])
def test_pattern(pattern, name, hit):
    assert supp.matches(pattern, name) is hit


def test_parse_rules_and_errors(tmp_path):
    f = tmp_path / "supp.txt"
    f.write_text("# a comment\n\n  leak:foo  \nleak:^bar$\n   # indented comment\nleak:*baz*\n")
    rules = supp.read_file(str(f))
    assert [(r.pattern, r.origin) for r in rules] == [
        ("foo", "%s:3" % f), ("^bar$", "%s:4" % f), ("*baz*", "%s:6" % f)]
    for text, msg in (("leak:a\nrace:foo\n", "%s:2: not a leak suppression (want "
                                             "leak:PATTERN): race:foo"),
                      ("leakfoo\n", "%s:1: not a leak suppression (want leak:PATTERN): leakfoo"),
                      ("leak:a\n\nleak:   \n", "%s:3: empty pattern after leak:")):
        f.write_text(text)
        with pytest.raises(mmleak.Fail) as e:
            supp.read_file(str(f))
        assert str(e.value) == msg % f
    with pytest.raises(mmleak.Fail) as e:
        supp.read_file(str(tmp_path / "nope"))
    assert str(e.value) == "suppressions %s: No such file or directory" % (tmp_path / "nope")


def test_load_order(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    a.write_text("leak:A\n")
    b.write_text("leak:B\n")
    c.write_text("leak:C\n")
    rules = supp.load([str(a)], env="%s::%s" % (b, c), program="leak:P\n")
    assert [(r.pattern, r.origin) for r in rules][:4] == [
        ("A", "%s:1" % a), ("B", "%s:1" % b), ("C", "%s:1" % c),
        ("P", "__lsan_default_suppressions():1")]
    assert [r.pattern for r in rules[4:]] == [p for p, _ in supp.BUILTIN]
    assert all(r.origin == "built-in" for r in rules[4:])
    assert len(supp.load(env="", builtin=False)) == 0


def test_matcher_frames_and_counts():
    frames = {
        1: Frame(1, "libfoo.so.1", 0x10, "foo_alloc", "/src/foo/alloc.c", 12, (), None),
        2: Frame(2, "prog", 0x20, "main", "/src/prog/main.c", 5,
                 (("inlined_helper", "/src/prog/helper.h", 3),), None),
        3: Frame(3, "prog", 0x30, None, None, None, (), "no symbol"),
    }
    rules = [supp.Rule("^helper.h$", "r0"), supp.Rule("helper.h", "r1"),
             supp.Rule("inlined_helper", "r2"), supp.Rule("libfoo", "r3"),
             supp.Rule("alloc.c", "r4")]
    m = supp.Matcher(rules, frames)
    assert m.rule_of((1,)) == 3             # module (libfoo before alloc.c in rule order)
    assert m.rule_of((3, 2)) == 1           # an inlined frame's file, of an outer frame
    assert m.rule_of((3,)) == -1            # nothing to match: not suppressed
    assert m.take((1, 2), 10) and m.take((3, 2), 5) and m.take((1,), 7)
    assert not m.take((3,), 100)
    # (1, 2): the first rule in order that matches any frame, r1 (frame 2), not r3 (frame 1)
    assert [(r.origin, n, b) for r, n, b in m.used()] == [("r1", 2, 15), ("r3", 1, 7)]


# ---------------------------------------------------------------------------------------
# the gate, end to end (real processes)
# ---------------------------------------------------------------------------------------

def test_gate_fails_on_one_lost_block(prog, dump):
    r = run_check(dump, [prog["leakcheck"], "dn"], "--check")
    assert r.returncode == 23, r.stderr
    v = verdict(r.stderr)
    assert len(v) == 1 and re.match(r"mmleak: check FAILED: trace \d+ \(%s dn\): 1 blocks "
                                     r"\(32 bytes\) not freed of the kinds that count "
                                     r"\(definite,indirect,unknown\)$"
                                     % re.escape(prog["leakcheck"]), v[0]), r.stderr
    assert re.search(r"^ +32 +1  (definite +)?%s$" % re.escape(label("drop_one", "dropped")),
                     r.stderr, re.M), r.stderr
    r = run_check(dump, [prog["leakcheck"], "d"], "--check", "--check-status", "7")
    assert r.returncode == 7, r.stderr


def test_gate_passes_with_nothing_left_and_keeps_the_status(prog, dump):
    r = run_check(dump, [prog["leakcheck"], "n", "5"], "--check")
    assert r.returncode == 5, r.stderr
    assert verdict(r.stderr)[0].startswith("mmleak: check passed: trace ")
    r = run_check(dump, [prog["leakcheck"], "d", "0"])     # no --check: the program's status
    assert r.returncode == 0 and not verdict(r.stderr)
    r = run_check(dump, [prog["leakcheck"], "d", "5"], "--check")   # a leak: the check's status
    assert r.returncode == 23, r.stderr


def test_gate_counts_the_last_image_of_a_process(prog, dump):
    """A shell that exec's the program: the shell's blocks went with the exec, not leaked;
    the program's own verdict is the process's."""
    r = run_check(dump, ["/bin/sh", "-c", "exec %s n" % prog["leakcheck"]], "--check")
    assert r.returncode == 0, r.stderr
    assert len(verdict(r.stderr)) == 1 and " (%s n): " % prog["leakcheck"] in \
        verdict(r.stderr)[0], r.stderr
    r = run_check(dump, ["/bin/sh", "-c", "exec %s d" % prog["leakcheck"]], "--check")
    assert r.returncode == 23, r.stderr
    assert len(verdict(r.stderr)) == 1, r.stderr


@NEEDS_SCANNER
def test_gate_passes_with_reachable_blocks_only(prog, dump):
    r = run_check(dump, [prog["leakcheck"], "r"], "--check")
    assert r.returncode == 0, r.stderr
    v = verdict(r.stderr)
    assert len(v) == 1 and v[0].startswith("mmleak: check passed: trace "), r.stderr
    tid = v[0].split()[4]
    rc = cli.main(["report", str(dump), "--trace", tid, "--no-html", "--show-reachable"])
    assert rc == 0
    # (the scanner's exit path may add still reachable blocks of its own: not counted here)
    rep = report.build_report(str(dump), progress=False, trace=tid)
    kinds = {(fr.function, a.size, rep["kind_of"](a)) for a in rep["survivors"]
             for fr in [rep["frames"].get(a.callers[0])] if fr and fr.function == "keep_one"}
    assert kinds == {("keep_one", 200, "reachable")}
    r = run_check(dump, [prog["leakcheck"], "r"], "--check", "--leak-kinds", "reachable")
    assert r.returncode == 23, r.stderr
    r = run_check(dump, [prog["leakcheck"], "p"], "--check")
    assert r.returncode == 0, r.stderr
    r = run_check(dump, [prog["leakcheck"], "p"], "--check", "--leak-kinds", "definite,possible")
    assert r.returncode == 23, r.stderr
    r = run_check(dump, [prog["leakcheck"], "l"], "--check", "--leak-kinds", "indirect")
    assert r.returncode == 23 and "1 blocks (48 bytes)" in verdict(r.stderr)[0], r.stderr


@pytest.mark.parametrize("rule,suppressed", [
    ("leak:drop_one", True),                # the function
    ("leak:leakcheck.c", True),             # the source file
    ("leak:^leakcheck$", True),             # the module (the executable)
    ("leak:^drop_on$", False),              # anchored: not the whole name
    ("leak:drop*one", True),
])
def test_gate_suppression_file(prog, dump, tmp_path, rule, suppressed):
    f = tmp_path / "leaks.supp"
    f.write_text("# known\n%s\n" % rule)
    r = run_check(dump, [prog["leakcheck"], "d"], "--check", "--suppressions", str(f))
    assert r.returncode == (0 if suppressed else 23), r.stderr
    if suppressed:
        assert "      32 bytes in 1 blocks by %s (%s:2)\n" % (rule, f) in r.stderr
        assert "    suppressed:            32 bytes in 1 blocks\n" in r.stderr


def test_gate_suppression_any_frame_and_env(prog, dump, tmp_path):
    # an outer frame (the trace has it: --depth 16), from MMLEAK_SUPPRESSIONS
    f = tmp_path / "outer.supp"
    f.write_text("leak:^caller_of_drop$\n")
    r = run_check(dump, [prog["leakcheck"], "d"], "--check", "--depth", "16",
                  env={"MMLEAK_SUPPRESSIONS": str(f)})
    assert r.returncode == 0, r.stderr
    assert "      32 bytes in 1 blocks by leak:^caller_of_drop$ (%s:1)\n" % f in r.stderr
    # the same rule, the first of two files given: the first rule that matches takes it
    g = tmp_path / "second.supp"
    g.write_text("leak:drop_one\n")
    r = run_check(dump, [prog["leakcheck"], "dl"], "--check", "--depth", "16",
                  "--suppressions", str(g), env={"MMLEAK_SUPPRESSIONS": str(f)})
    assert r.returncode == 23, r.stderr     # the lost_one blocks are not suppressed
    assert "      32 bytes in 1 blocks by leak:drop_one (%s:1)\n" % g in r.stderr
    assert "^caller_of_drop$" not in r.stderr
    # a bad file: one line with its file and line number
    h = tmp_path / "bad.supp"
    h.write_text("leak:ok\nnot a rule\n")
    r = run_check(dump, [prog["leakcheck"], "d"], "--check", "--suppressions", str(h))
    assert r.returncode == 2, r.stderr
    assert "mmleak.py: %s:2: not a leak suppression (want leak:PATTERN): not a rule\n" % h \
        in r.stderr


def test_gate_program_default_suppressions(prog, dump):
    """The program's own __lsan_default_suppressions(), called by mmleak.so, in the trace."""
    r = run_check(dump, [prog["leakcheck_supp"], "dl"], "--check")
    assert r.returncode == 23, r.stderr             # lost_one's blocks are not suppressed
    assert ("      32 bytes in 1 blocks by leak:^drop_one$ "
            "(__lsan_default_suppressions():2)\n") in r.stderr
    r = run_check(dump, [prog["leakcheck_supp"], "d"], "--check")
    assert r.returncode == 0, r.stderr
    tid = verdict(r.stderr)[0].split()[4].rstrip(":")
    sh, _ = compact.read_trace(str(dump), tid)
    assert sh.program_suppressions == "# the program's own rules\nleak:^drop_one$\n"
    # the same program without the function: no rules, no header line
    r = run_check(dump, [prog["leakcheck"], "d"], "--check")
    assert r.returncode == 23, r.stderr
    tid = verdict(r.stderr)[0].split()[4].rstrip(":")
    assert compact.read_trace(str(dump), tid)[0].program_suppressions is None


# ---------------------------------------------------------------------------------------
# the report per kind, with a test double of the scanner
# ---------------------------------------------------------------------------------------

FAKE_KIND_BY_SIZE = {104: "definite", 48: "indirect", 72: "possible", 200: "reachable",
                     32: "definite"}


@pytest.fixture
def fake_kinds(monkeypatch):
    """TEST DOUBLE of the scanner's kinds_for: the survivors of the trace, classified by
    their sizes (tests/leakcheck.c's blocks have unique sizes and known kinds)."""
    def scan_kinds(directory, tid):
        sh, _ = compact.read_trace(directory, tid)
        return {(a.ptr, a.seq): FAKE_KIND_BY_SIZE.get(a.size, "unknown")
                for a in sh.survivors()}
    monkeypatch.setattr(report, "scan_kinds", scan_kinds)


def traced(prog, dump, mode, *env):
    """Trace leakcheck MODE without the scan at exit (MMLEAK_SCAN=0): the test double gives
    the kinds, and the scan's own exit path adds no block."""
    r = run_traced([prog["leakcheck"], mode], dump, env=dict(env, MMLEAK_SCAN="0"))
    assert r.returncode == 0
    return [t for t in mmleak.find_traces(str(dump))][0]


SUMMARY = ("  leak summary:\n"
           "    definitely lost:       136 bytes in 2 blocks\n"
           "    indirectly lost:       48 bytes in 1 blocks\n"
           "    possibly lost:         72 bytes in 1 blocks\n"
           "    still reachable:       200 bytes in 1 blocks\n"
           "    suppressed:            0 bytes in 0 blocks\n")


def test_report_all_reachable_prints_no_empty_table(prog, dump, fake_kinds, capsys):
    """Every block not freed still reachable (cppcheck's run): one line, not a table's
    header over no row."""
    traced(prog, dump, "rn")
    assert cli.main(["report", str(dump), "--no-html"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("    suppressed:            0 bytes in 0 blocks\n"
                        "  no leaks: every block not freed is still reachable; 1 call site "
                        "not shown (--show-reachable)\n"), out


def test_report_per_kind(prog, dump, tmp_path, fake_kinds, capsys):
    traced(prog, dump, "lrpdn")
    csvf = tmp_path / "sites.csv"
    rc = cli.main(["report", str(dump), "--no-html", "--csv", str(csvf)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert SUMMARY in out
    # lost first (definite and indirect by bytes), then possibly lost; reachable hidden
    table = out[out.index("         bytes   blocks  kind       call site\n"):].splitlines()
    assert table[1:6] == [
        "           104        1  definite   " + label("lost_one", "lost"),
        "            48        1  indirect   " + label("lost_one", "indirect"),
        "            32        1  definite   " + label("drop_one", "dropped"),
        "            72        1  possible   " + label("possible_one", "possible"),
        "  1 call sites of still reachable blocks not shown (--show-reachable)"]
    rc = cli.main(["report", str(dump), "--no-html", "--show-reachable"])
    out = capsys.readouterr().out
    assert "           200        1  reachable  %s\n" % label("keep_one", "reachable") in out
    assert "not shown" not in out
    with open(str(csvf), newline="") as f:
        rows = list(csv.DictReader(f))
    got = [(r["kind"], int(r["bytes"]), int(r["blocks"]), r["function"], r["line"], r["caller"]
            != "total") for r in rows]
    line = lambda s: str(site_line("leakcheck.c", s))    # noqa: E731
    assert got == [
        ("definite", 104, 1, "lost_one", line("lost"), True),
        ("indirect", 48, 1, "lost_one", line("indirect"), True),
        ("definite", 32, 1, "drop_one", line("dropped"), True),
        ("possible", 72, 1, "possible_one", line("possible"), True),
        ("reachable", 200, 1, "keep_one", line("reachable"), True),
        ("definite", 136, 2, "", "", False), ("indirect", 48, 1, "", "", False),
        ("possible", 72, 1, "", "", False), ("reachable", 200, 1, "", "", False),
        ("unknown", 0, 0, "", "", False)]
    # the gate on the existing trace, per kinds
    for kinds, status in (("definite", 23), ("reachable", 23), ("unknown", 0), ("none", 0),
                          ("indirect,possible", 23)):
        rc = cli.main(["report", str(dump), "--no-html", "--check", "--leak-kinds", kinds])
        assert rc == status, (kinds, capsys.readouterr().out)
    capsys.readouterr()


def test_report_suppressions_per_kind(prog, dump, tmp_path, fake_kinds, capsys):
    """A rule never takes a still reachable block; the built-in rules only blocks a scan
    classified (here: a stdio buffer the double calls definitely lost)."""
    traced(prog, dump, "lrpd")
    f = tmp_path / "s.supp"
    f.write_text("leak:leakcheck\n")                # the module: every block
    rc = cli.main(["report", str(dump), "--no-html", "--suppressions", str(f), "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert ("    suppressed:            256 bytes in 4 blocks\n"
            "      256 bytes in 4 blocks by leak:leakcheck (%s:1)\n" % f) in out
    assert "    still reachable:       200 bytes in 1 blocks\n" in out


def test_builtin_rules_only_on_scanned_blocks(prog, dump, monkeypatch, capsys):
    # a block allocated through a frame named like a built-in rule (the double says lost)
    frames_hit = []
    real = report.build_report

    def build(*a, **k):
        rep = real(*a, **k)
        fr = rep["frames"]
        for addr, f in list(fr.items()):
            if f.function == "drop_one":
                fr[addr] = f._replace(function="_IO_file_doallocate")
                frames_hit.append(addr)
        return rep
    monkeypatch.setattr(report, "build_report", build)
    traced(prog, dump, "d")
    monkeypatch.setattr(report, "scan_kinds", lambda d, t: None)
    rc = cli.main(["report", str(dump), "--no-html", "--check"])
    out = capsys.readouterr().out
    assert frames_hit and rc == 23, out         # no scan: the built-in list does not apply
    monkeypatch.setattr(report, "scan_kinds", lambda d, t: {
        (a.ptr, a.seq): "definite" for a in compact.read_trace(d, t)[0].survivors()})
    rc = cli.main(["report", str(dump), "--no-html", "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "      32 bytes in 1 blocks by leak:_IO_file_doallocate (built-in)\n" in out
    rc = cli.main(["report", str(dump), "--no-html", "--check", "--no-builtin-suppressions"])
    assert rc == 23, capsys.readouterr().out


def test_help_says_check(capsys):
    for cmd in ("run", "report"):
        with pytest.raises(SystemExit):
            cli.main([cmd, "--help"])
        text = capsys.readouterr().out
        for opt in ("--check", "--check-status", "--leak-kinds", "--suppressions",
                    "--no-builtin-suppressions", "leak:PATTERN", "23"):
            assert opt in text, (cmd, opt)
    with pytest.raises(SystemExit):
        cli.main(["report", "x", "--leak-kinds", "definite,lots"])
    assert "'lots': kinds are definite, indirect, possible, reachable, unknown" in \
        capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# the page's kind filter, in headless Chromium
# ---------------------------------------------------------------------------------------

def test_page_kind_filter_in_browser(prog, dump, tmp_path, fake_kinds, capsys):
    from test_flame import selftest, verdict_fields
    traced(prog, dump, "lrpdn", ("MMLEAK_DEPTH", "16"))
    page = tmp_path / "kinds.html"
    assert cli.main(["report", str(dump), "-o", str(page)]) == 0
    capsys.readouterr()
    text = page.read_text()
    # the summary table, one row per kind, and the suppressed
    summary = re.findall(r'<tr data-kind="(\w+)"><td>[^<]*</td><td class="num">([\d,]+)</td>'
                         r'<td class="num" title="([\d,]+) bytes">', text)
    assert summary == [("definite", "2", "136"), ("indirect", "1", "48"),
                       ("possible", "1", "72"), ("reachable", "1", "200"),
                       ("unknown", "0", "0"), ("suppressed", "0", "0")]
    assert re.findall(r'<option value="(\w+)" data-kinds="([\w,]+)"( selected)?>', text) == [
        ("leaks", "definite,indirect,possible,unknown", " selected"),
        ("lost", "definite,indirect", ""), ("definite", "definite", ""),
        ("indirect", "indirect", ""), ("possible", "possible", ""),
        ("reachable", "reachable", ""),
        ("all", "definite,indirect,possible,reachable,unknown", "")]
    # the table: a row per (site, kind), lost first
    assert re.findall(r'<tr data-rank="\d+" data-bytes="(\d+)" data-kind="(\w+)"', text) == [
        ("104", "definite"), ("48", "indirect"), ("32", "definite"), ("72", "possible"),
        ("200", "reachable")]
    verdict, boxes, tip, console = selftest(str(page), tmp_path)
    assert verdict.startswith("SELFTEST PASS"), verdict
    assert not console, console
    v = verdict_fields(verdict)
    want = {"leaks": (4, 256), "lost": (3, 184), "definite": (2, 136), "indirect": (1, 48),
            "possible": (1, 72), "reachable": (1, 200), "all": (5, 456)}
    for key, (n, b) in want.items():
        assert v["view-" + key] == "rows:%d,bytes:%d,charts:1,flame:all:_%d_B_in_%d_block%s" % (
            n, b, b, n, "" if n == 1 else "s"), (key, v)
    assert v["view-default"] == "leaks"
    # the default view's flame graph is the one left drawn: not still reachable, 256 bytes
    assert [b["text"] for b in boxes.values() if b["text"].startswith("all:")] == \
        ["all: 256 B in 4 blocks"]


def test_page_without_scan_has_no_kind_filter(prog, dump, tmp_path, capsys):
    traced(prog, dump, "lr")
    page = tmp_path / "plain.html"
    assert cli.main(["report", str(dump), "-o", str(page)]) == 0
    capsys.readouterr()
    text = page.read_text()
    assert 'id="kind-view"' not in text and 'class="charts kview"' not in text
    assert 'id="col-kind"' not in text


# ---------------------------------------------------------------------------------------
# real programs: definitely plus indirectly lost, against valgrind on the same command
# ---------------------------------------------------------------------------------------

REAL = [
    ("python3", ["/usr/bin/python3", "-c", "pass"]),
    ("perl", ["perl", "-e", "my $x = 1"]),
    ("git", ["git", "init", "-q", "{tmp}/repo"]),
    ("sqlite3", ["sqlite3", ":memory:", "select 1;"]),
    ("gawk", ["gawk", "BEGIN { x = 1 }"]),
]
FEW_BLOCKS = 5


def valgrind_lost(argv, env):
    """(definitely lost blocks, indirectly lost blocks) by valgrind memcheck."""
    r = subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=none",
                        "--errors-for-leak-kinds=none"] + argv, capture_output=True, text=True,
                       env=env, timeout=300)
    got = {}
    for kind in ("definitely", "indirectly"):
        m = re.search(r"==\d+==\s+%s lost: ([\d,]+) bytes in ([\d,]+) blocks" % kind, r.stderr)
        got[kind] = int(m.group(2).replace(",", "")) if m else 0
    assert "LEAK SUMMARY" in r.stderr or "no leaks are possible" in r.stderr, r.stderr[-2000:]
    return got["definitely"], got["indirectly"]


def mmleak_lost(dump, argv, env):
    """(definitely lost blocks, indirectly lost blocks) by mmleak: `run` then `report` of the
    command's own process (its last image)."""
    r = subprocess.run([sys.executable, MMLEAK, "run", "-d", str(dump), "--lib", LIB, "--"]
                       + argv, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    nxt = [l for l in r.stderr.splitlines() if " next: " in l][-1].split()
    r = subprocess.run([sys.executable, MMLEAK, "report", str(dump), "--no-html",
                        "--no-builtin-suppressions", nxt[-2], nxt[-1]], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "reachability unknown" not in r.stdout, r.stdout
    got = {}
    for kind in ("definitely", "indirectly"):
        m = re.search(r"^    %s lost: +(\d+) bytes.* in (\d+) blocks$" % kind, r.stdout, re.M)
        got[kind] = int(m.group(2))
    return got["definitely"], got["indirectly"]


@NEEDS_SCANNER
@pytest.mark.parametrize("name,argv", REAL, ids=[n for n, _ in REAL])
def test_real_program_lost_as_valgrind(name, argv, dump, tmp_path):
    if not shutil.which("valgrind") or not shutil.which(argv[0]):
        pytest.fail("%s or valgrind is not installed (.ci/run installs them)" % argv[0])
    env = dict(os.environ, PYTHONMALLOC="malloc", LC_ALL="C")
    env.pop("MMLEAK_SUPPRESSIONS", None)
    vd = str(tmp_path / "vg")
    md = str(tmp_path / "mm")
    vg = valgrind_lost([a.replace("{tmp}", vd) for a in argv], env)
    mm = mmleak_lost(dump, [a.replace("{tmp}", md) for a in argv], env)
    assert abs(sum(vg) - sum(mm)) <= FEW_BLOCKS, (name, "valgrind", vg, "mmleak", mm)


def test_export_labels_kind(prog, dump, fake_kinds):
    """The pprof model (export.py) gets a stack per (stack, kind), labelled kind=..."""
    from mmleaklib import export as mx
    traced(prog, dump, "lrpd")
    rep = report.build_report(str(dump), progress=False)
    model = report.export_model(rep, mx)
    got = sorted((dict(st.labels)["kind"], st.inuse_bytes, st.inuse_objects)
                 for st in model.stacks)
    assert got == [("definite", 32, 1), ("definite", 104, 1), ("indirect", 48, 1),
                   ("possible", 72, 1), ("reachable", 200, 1)]
    rep["kind_of"] = None
    assert all(st.labels == () for st in report.export_model(rep, mx).stacks)


def test_gate_children_and_no_check_children(prog, dump):
    """A child that leaks fails the check; --no-check-children checks the command alone."""
    sh = ["/bin/sh", "-c", "%s d; exec %s n" % (prog["leakcheck"], prog["leakcheck"])]
    r = run_check(dump, sh, "--check")
    assert r.returncode == 23, r.stderr
    v = verdict(r.stderr)
    assert sorted(x.split(":")[1] for x in v) == [" check FAILED", " check passed"], v
    assert " (%s d): 1 blocks (32 bytes) " % prog["leakcheck"] in "".join(v), v
    r = run_check(dump, sh, "--check", "--no-check-children")
    assert r.returncode == 0, r.stderr
    assert len(verdict(r.stderr)) == 1 and " (%s n): " % prog["leakcheck"] in r.stderr


def test_gate_unknown_says_how_to_leave_it_out(prog, dump):
    """A process no scan ran in (killed, aborted, MMLEAK_SCAN=0) fails the gate with blocks
    of reachability unknown: the verdict says so and how not to count them,
    --no-check-children only for a child."""
    lc = prog["leakcheck"]
    sh = ["/bin/sh", "-c", "MMLEAK_SCAN=0 %s d; MMLEAK_SCAN=0 exec %s d" % (lc, lc)]
    r = run_check(dump, sh, "--check")
    assert r.returncode == 23, r.stderr
    lines = r.stderr.splitlines()
    hints = [lines[i + 1] for i, l in enumerate(lines) if l.startswith("mmleak: check FAILED")]
    assert sorted(hints) == sorted(
        "mmleak: all 1 of reachability unknown (no scan ran in that process: it ended by abort "
        "or a signal, or scans were off); to not count them: --leak-kinds definite,indirect" + more
        for more in ("", " or --no-check-children")), r.stderr


def test_gate_system_child_scanned_at_its__exit(prog, dump):
    """A program's system("true") starts `sh -c true`, which dash ends with _exit: scanned
    there, its blocks are classified (still reachable: valgrind says 48 blocks still
    reachable of `sh -c true`, none lost) and the gate passes; before, all of them were of
    reachability unknown and failed it.  A program that ends by _exit is scanned too: its
    dropped block is definitely lost, not unknown."""
    r = run_check(dump, [prog["leakcheck"], "rs"], "--check")
    assert r.returncode == 0, r.stderr
    v = verdict(r.stderr)
    assert len(v) == 2 and all(l.startswith("mmleak: check passed: ") for l in v), r.stderr
    r = run_check(dump / "x", [prog["leakcheck"], "drx"], "--check")
    assert r.returncode == 23, r.stderr
    v = verdict(r.stderr)
    assert len(v) == 1 and re.fullmatch(
        r"mmleak: check FAILED: trace \d+ \(%s drx\): 1 blocks \(32 bytes\) not freed of the "
        r"kinds that count \(definite,indirect,unknown\)" % re.escape(prog["leakcheck"]), v[0]), v
    assert "reachability unknown" not in r.stderr, r.stderr


def test_page_growth_follows_the_kind_filter(prog, dump, tmp_path, fake_kinds):
    """With a growth series, each kind view has its growth panel, of the call sites with
    blocks of its kinds.  The series is made here (two points: nothing, then every survivor
    of the trace), as compaction writes it for a program that runs longer."""
    from conftest import script
    from mmleaklib import series as ms
    from mmleaklib.sites import growth_sites
    panda = script("mmleak-panda.py")
    traced(prog, dump, "lrpd")
    rep = report.build_report(str(dump), progress=False)
    last = {}
    for a in rep["survivors"]:
        g = last.setdefault(a.callers, [0, 0])
        g[0] += a.size
        g[1] += 1
    rep["series"] = [ms.SeriesPoint(0, 0, 0, 0, 0, {}),
                     ms.SeriesPoint(1, 1, 456, 5, 0, {k: tuple(v) for k, v in last.items()})]
    rep["growth"] = growth_sites(rep["series"], rep["frames"], None, rep["trace_depth"])
    page = tmp_path / "growth.html"
    panda.render_report(rep, str(page))
    text = page.read_text()
    panels = re.findall(r'<div class="panel kview" data-view="(\w+)"', text)
    assert panels == ["leaks", "lost", "definite", "indirect", "possible", "reachable", "all"]

    def growth_table(view):
        i = text.index('<div class="panel kview" data-view="%s"' % view)
        part = text[i:text.index("</table></div>", i)]
        return sorted(set(re.findall(r"<tr><td>(\w+) at ", part)))
    assert growth_table("reachable") == ["keep_one"]
    assert growth_table("lost") == ["drop_one", "lost_one"]
    assert growth_table("all") == ["drop_one", "keep_one", "lost_one", "possible_one"]
    from test_flame import selftest, verdict_fields
    verdict, _, _, console = selftest(str(page), tmp_path)
    assert verdict.startswith("SELFTEST PASS"), verdict
    assert not console, console
    v = verdict_fields(verdict)
    assert all(v["view-" + k].endswith(",growth:1") for k in panels), v
