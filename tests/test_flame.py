"""The flame graph of the HTML report (mmleak-panda.py): unfreed bytes by stack.

Run: /usr/bin/python3 -m pytest tests/test_flame.py

The aggregation (panda.Flame) is checked in Python with exact numbers; the drawing in headless
Chromium: the page's own self-test (URL fragment #selftest) measures every box, clicks one,
hovers it, resets, and writes what it measured into the DOM (data-mw: width / root width;
data-zw: the same while zoomed; the tooltip text into <pre id="flame-selftest">), which
--dump-dom shows.  The real traced program's flame graph is in test_report.py.
"""
import html.parser
import json
import os
import random
import re
import subprocess

import pytest

from test_report import (CHROMIUM, EXPECTED_D4, MMLEAK, PY, SRC, F, chromium, demo_traces,
                         fake_rep, headline, marker_line, mmleak, panda, report_page)

A, B, B2, C, D, E = 0x401000, 0x402000, 0x402008, 0x403000, 0x404000, 0x405000


def frames_abcde():
    """Five functions, each at one line; B2 is a second return address on B's line; D is in
    libc (the runtime)."""
    return {A: F(A, "A(int)", "/src/a.c", 10), B: F(B, "B", "/src/b.c", 20),
            B2: F(B2, "B", "/src/b.c", 20), C: F(C, "C", "/src/c.c", 30),
            D: F(D, "D", "/src/d.c", 40, module="libc.so.6"), E: F(E, "E", "/src/e.c", 50)}


def survivors_abcde():
    """A>B>C 300 bytes in 3 blocks, A>B>D 100 bytes in 1 (through the other return address
    of B's line), A>E 600 bytes in 2.  Stacks are innermost first."""
    surv = [mmleak.Alloc(0x1000 + 16 * i, 1, 100, i, (C, B, A)) for i in range(3)]
    surv.append(mmleak.Alloc(0x2000, 1, 100, 5, (D, B2, A)))
    surv += [mmleak.Alloc(0x3000 + 16 * i, 1, 300, 7, (E, A)) for i in range(2)]
    return surv


def flame_of_allocs(surv, frames, **kw):
    stacks, sb, sk = {}, [], []
    for a in surv:
        i = stacks.setdefault(a.callers, len(stacks))
        if i == len(sb):
            sb.append(0)
            sk.append(0)
        sb[i] += a.size
        sk[i] += 1
    return panda.Flame(list(stacks), sb, sk, frames, **kw)


def rows(fl):
    """(labels path from the root, depth, bytes, blocks, cut) of every node, pre-order."""
    out, path = [], []
    for f, d, b, k, cut in fl.nodes:
        del path[d:]
        path.append("all" if f < 0 else fl.frames[f][0])
        out.append(("/".join(path[1:]) or "all", d, b, k, cut))
    return out


# ---------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------

def test_flame_aggregation_exact():
    fl = flame_of_allocs(survivors_abcde(), frames_abcde())
    # pre-order, children widest first; B's two return addresses are one box
    assert rows(fl) == [("all", 0, 1000, 6, 0), ("A", 1, 1000, 6, 0), ("A/E", 2, 600, 2, 0),
                        ("A/B", 2, 400, 4, 0), ("A/B/C", 3, 300, 3, 0),
                        ("A/B/D", 3, 100, 1, 0)]
    assert (fl.total, fl.blocks, fl.max_frames) == (1000, 6, 3)
    assert (fl.cut_boxes, fl.cut_bytes, fl.cut_blocks) == (0, 0, 0)
    labels = {fl.frames[n[0]][0]: fl.frames[n[0]] for n in fl.nodes if n[0] >= 0}
    assert labels["A"] == ("A", "A(int)", "/src/a.c", 10, "server", panda.KIND_PROGRAM)
    assert labels["D"] == ("D", "D", "/src/d.c", 40, "libc.so.6", panda.KIND_RUNTIME)
    assert fl.box("A", "B", "C")[2:4] == (300, 3)
    assert fl.box("A", "C") is None


def test_flame_merges_by_line_not_address_nor_function():
    """Two return addresses of one line are one box; the same function at two lines is two
    boxes; the same line reached by two paths is a box on each path."""
    fr = frames_abcde()
    fr[0x401010] = F(0x401010, "A(int)", "/src/a.c", 11)       # A, another line
    surv = [mmleak.Alloc(1, 1, 10, 0, (C, B, A)), mmleak.Alloc(2, 1, 20, 0, (C, B2, A)),
            mmleak.Alloc(3, 1, 40, 0, (C, B, 0x401010)), mmleak.Alloc(4, 1, 80, 0, (C, E))]
    fl = flame_of_allocs(surv, fr)
    assert rows(fl) == [("all", 0, 150, 4, 0), ("E", 1, 80, 1, 0), ("E/C", 2, 80, 1, 0),
                        ("A", 1, 40, 1, 0), ("A/B", 2, 40, 1, 0), ("A/B/C", 3, 40, 1, 0),
                        ("A", 1, 30, 2, 0), ("A/B", 2, 30, 2, 0), ("A/B/C", 3, 30, 2, 0)]
    lines = [fl.frames[n[0]][3] for n in fl.nodes if n[0] >= 0 and fl.frames[n[0]][0] == "A"]
    assert lines == [11, 10]


def test_flame_inlined_levels_and_unresolved_frames():
    """An address whose code was inlined is a box per inline level (outermost first, the
    inner ones flagged inlined); unsymbolized addresses are boxes of their own, by module and
    offset, or by address when not even the module is known."""
    inl = F(0x406000, "std::string::_M_construct", "/src/p.cc", 7,
            inlined=(("helper(int)", "/src/p.cc", 30), ("outer()", "/src/p.cc", 44)))
    nosym = mmleak.Frame(0x7f0000001234, "libfoo.so", 0x1234, None, None, None, (), "no info")
    fr = {0x406000: inl, 0x7f0000001234: nosym}
    surv = [mmleak.Alloc(1, 1, 64, 0, (0x406000, 0x7f0000001234)),
            mmleak.Alloc(2, 1, 36, 0, (0x7f00000055aa,))]
    fl = flame_of_allocs(surv, fr)
    assert rows(fl) == [
        ("all", 0, 100, 2, 0), ("libfoo.so+0x1234", 1, 64, 1, 0),
        ("libfoo.so+0x1234/outer", 2, 64, 1, 0),
        ("libfoo.so+0x1234/outer/helper", 3, 64, 1, 0),
        ("libfoo.so+0x1234/outer/helper/std::string::_M_construct", 4, 64, 1, 0),
        ("0x7f00000055aa", 1, 36, 1, 0)]
    kinds = [fl.frames[n[0]][5] for n in fl.nodes if n[0] >= 0]
    I, P, U = panda.KIND_INLINED, panda.KIND_PROGRAM, panda.KIND_UNRESOLVED
    assert kinds == [U, P, P | I, P | I, U]
    # the line of an inline level is where it is in its function: outer() calls at 44
    assert [fl.frames[n[0]][3] for n in fl.nodes[2:5]] == [44, 30, 7]


def test_flame_cuts_narrow_boxes_and_caps_the_count():
    # 5000 bytes end in A>B, 3 go on to A>B>C (and 2 of them to D): 3/5003 < 1/1000, not
    # drawn, and B says how much of it is cut
    surv = [mmleak.Alloc(1, 1, 5000, 0, (B, A)), mmleak.Alloc(2, 1, 1, 0, (C, B, A)),
            mmleak.Alloc(3, 1, 2, 0, (D, C, B, A))]
    fl = flame_of_allocs(surv, frames_abcde())
    assert rows(fl) == [("all", 0, 5003, 3, 0), ("A", 1, 5003, 3, 0), ("A/B", 2, 5003, 3, 3)]
    assert (fl.cut_boxes, fl.cut_bytes, fl.cut_blocks) == (1, 3, 2)      # C, with D in it
    # exactly 1/1000 is drawn
    surv = [mmleak.Alloc(1, 1, 999, 0, (B, A)), mmleak.Alloc(2, 1, 1, 0, (C, B, A))]
    assert rows(flame_of_allocs(surv, frames_abcde()))[-1] == ("A/B/C", 3, 1, 1, 0)
    # the cap keeps the widest boxes (a tree: a parent is at least as wide as its child)
    fr = {0x500000 + i: F(0x500000 + i, "f%d" % i, "/src/f.c", i + 1) for i in range(40)}
    surv = [mmleak.Alloc(i, 1, 100 + i, 0, (0x500000 + i, 0x500000 + 20 + i % 4))
            for i in range(20)]
    fl = flame_of_allocs(surv, fr, max_boxes=6)
    # 4 boxes at depth 1 (f20..f23: 540, 545, 550, 555 bytes), 20 at depth 2 (100..119)
    assert [r[:3] for r in rows(fl)] == [
        ("all", 0, 2190), ("f23", 1, 555), ("f23/f19", 2, 119), ("f22", 1, 550),
        ("f22/f18", 2, 118), ("f21", 1, 545), ("f20", 1, 540)]
    assert (fl.cut_boxes, fl.cut_bytes, fl.cut_blocks) == (18, 2190 - 119 - 118, 18)
    assert [n[4] for n in fl.nodes] == [0, 555 - 119, 0, 550 - 118, 0, 545, 540]


def test_flame_json_exact_64bit_and_safe():
    big = (1 << 64) - 1
    fr = {A: F(A, "</script><b>&", "/src/a.c", 10)}
    surv = [mmleak.Alloc(1, 1, big, 0, (A,)), mmleak.Alloc(2, 1, big, 0, (A,))]
    fl = flame_of_allocs(surv, fr)
    assert rows(fl) == [("all", 0, 2 * big, 2, 0), ("</script><b>&", 1, 2 * big, 2, 0)]
    text = panda.flame_json(fl)
    assert "<" not in text and ">" not in text and "&" not in text
    d = json.loads(text)
    assert d["n"] == [-1, 0, str(2 * big), 2, 0, 0, 1, str(2 * big), 2, 0]
    assert d["s"][d["f"][0][0]] == "</script><b>&"


def test_flame_of_filtered_blocks_and_overflowing_sums(tmp_path):
    """flame_of (render's path): bytes per stack from the blocks kept by the filters, exact
    also when the sizes' total does not fit in 64 bits."""
    big, half = (1 << 64) - 1, (1 << 63) - 1
    surv = [mmleak.Alloc(1, 1, big, 0, (C, B, A)), mmleak.Alloc(2, 1, big, 50, (C, B, A)),
            mmleak.Alloc(3, 1, half, 60, (E, A))]
    out = str(tmp_path / "big.html")
    panda.render_report(fake_rep(surv, frames_abcde(), 100, depth=3, trace_depth=3), out)
    nodes = page_nodes(open(out, encoding="utf-8").read())
    assert [(n["label"], n["bytes"], n["blocks"]) for n in nodes] == [
        ("all", 2 * big + half, 3), ("A", 2 * big + half, 3), ("B", 2 * big, 2),
        ("C", 2 * big, 2), ("E", half, 1)]
    panda.render_report(fake_rep(surv, frames_abcde(), 100, depth=3, trace_depth=3,
                                 since=40), out)
    text = open(out, encoding="utf-8").read()
    assert [(n["label"], n["bytes"]) for n in page_nodes(text)] == [
        ("all", big + half), ("A", big + half), ("B", big), ("C", big), ("E", half)]
    assert headline(text) == (big + half, 2)


# ---------------------------------------------------------------------------------------
# The page's data, as its script reads it
# ---------------------------------------------------------------------------------------

def page_nodes(text):
    """Decode the page's flame data (the format FLAME_JS reads) -> one dict per box, pre-order:
    label (the function's short name), name, file, line, module, kind, depth, bytes, blocks,
    cut, parent."""
    m = re.search(r'<script type="application/json" id="flame-data">(.*?)</script>', text, re.S)
    assert m, "no flame data in the page"
    d = json.loads(m.group(1))
    s, f, n = d["s"], d["f"], d["n"]
    out, path = [], []
    for i in range(0, len(n), 5):
        fi, dep, b, k, cut = n[i:i + 5]
        node = {"depth": dep, "bytes": int(b), "blocks": k, "cut": int(cut), "i": i // 5}
        if fi < 0:
            node.update(label="all", name=None, file=None, line=None, module=None, kind=None)
        else:
            name, fl, ln, mod, kind = f[fi]
            name = s[name]
            node.update(name=name, file=s[fl] if fl >= 0 else None, line=ln or None,
                        module=s[mod] if mod >= 0 else None, kind=kind,
                        label=name if kind & panda.KIND_NONAME else panda.short_function(name))
        del path[dep:]
        node["parent"] = path[-1] if path else None
        path.append(node["i"])
        out.append(node)
    return out


class Boxes(html.parser.HTMLParser):
    """The flame boxes of a --dump-dom: {data-i: {attrs..., 'text': label}}."""

    def __init__(self, text):
        super().__init__()
        self.boxes, self.cur = {}, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and "fb" in (a.get("class") or "").split():
            self.cur = a
            a["text"] = ""
            self.boxes[int(a["data-i"])] = a

    def handle_data(self, data):
        if self.cur is not None:
            self.cur["text"] += data

    def handle_endtag(self, tag):
        if tag == "div":
            self.cur = None


def selftest(page, tmp_path):
    """Open PAGE#selftest in headless Chromium -> (verdict, boxes, tooltip text, console)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("%s is not installed (CI installs it): browser test not run" % CHROMIUM)
    r = chromium(["--enable-logging=stderr", "--v=0", "--window-size=1200,900", "--dump-dom",
                  "file://%s#selftest" % page], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="selftest">([^<]*)</pre>', r.stdout)
    assert m, "self-test did not run: %s" % r.stdout[-500:]
    tip = re.search(r'<pre id="flame-selftest">([^<]*)</pre>', r.stdout)
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    return (m.group(1), Boxes(r.stdout).boxes,
            html.unescape(tip.group(1)) if tip else None, console)


def verdict_fields(v):
    return dict(p.split("=", 1) for p in v.split()[2:] if "=" in p)


# ---------------------------------------------------------------------------------------
# In the browser
# ---------------------------------------------------------------------------------------

def test_browser_flame_widths_zoom_reset_tooltip(tmp_path):
    out = str(tmp_path / "abcde.html")
    panda.render_report(fake_rep(survivors_abcde(), frames_abcde(), 10, depth=3,
                                 trace_depth=3), out)
    text = open(out, encoding="utf-8").read()
    assert headline(text) == (1000, 6)
    assert text.count('id="flame-panel"') == 1 and "are not drawn" not in text
    verdict, boxes, tip, console = selftest(out, tmp_path)
    assert verdict.startswith("SELFTEST PASS"), verdict
    assert not console, console
    v = verdict_fields(verdict)
    assert v["flame-boxes"] == "6" and v["flame-depth"] == "3"
    assert float(v["flame-maxerr-px"]) < 0.5 and int(v["flame-root-px"]) > 1000
    # every box: label, measured width / root width == bytes / total
    got = {b["text"]: b for b in boxes.values()}
    assert sorted(got) == sorted(["all: 1000 B in 6 blocks", "A  a.c:10", "E  e.c:50",
                                  "B  b.c:20", "C  c.c:30", "D  d.c:40"])
    want = {"all: 1000 B in 6 blocks": 1.0, "A  a.c:10": 1.0, "E  e.c:50": 0.6,
            "B  b.c:20": 0.4, "C  c.c:30": 0.3, "D  d.c:40": 0.1}
    for lab, frac in want.items():
        assert abs(float(got[lab]["data-mw"]) - frac) < 1e-3, (lab, got[lab]["data-mw"])
    # D is in libc: greyed (runtime class), the others are the program's
    assert got["D  d.c:40"]["class"] == "fb fk1"
    assert {got[l]["class"] for l in want if l not in ("D  d.c:40", "all: 1000 B in 6 blocks")} \
        == {"fb fk0"}
    # the self-test clicked B (the widest box with callees that is not the whole): B fills
    # the width, C and D share it 3:1, E (outside B) is hidden, all and A stay full width
    assert v["flame-zoom"] == "3" and boxes[3]["text"] == "B  b.c:20"
    assert v["flame-zoom-full"] == "true" and v["flame-zoom-hidden"] == "1/1"
    assert v["flame-zoom-ancestors"] == "2"
    zw = {b["text"]: float(b["data-zw"]) for b in boxes.values() if "data-zw" in b}
    assert set(zw) == {"B  b.c:20", "C  c.c:30", "D  d.c:40"}
    assert abs(zw["B  b.c:20"] - 1) < 1e-3 and abs(zw["C  c.c:30"] - 0.75) < 1e-3
    assert abs(zw["D  d.c:40"] - 0.25) < 1e-3
    # clicking "all", and the Reset button, restore every width
    assert v["flame-reset-all"] == "true" and v["flame-reset-button"] == "true"
    # the tooltip of B, hovered before the click
    assert v["flame-tooltip"] == "true"
    assert tip == "B\n/src/b.c:20\nserver\n400 bytes (400 B), 40.00% of all\n4 blocks"


def test_browser_flame_depth1_one_level(tmp_path):
    """Stacks of one frame: the graph is one level (the call sites) and the page says how to
    see more; it still draws, zooms and resets."""
    fr = frames_abcde()
    surv = ([mmleak.Alloc(i, 1, 100, 0, (A,)) for i in range(5)] +
            [mmleak.Alloc(100 + i, 1, 250, 0, (B,)) for i in range(2)])
    out = str(tmp_path / "d1.html")
    panda.render_report(fake_rep(surv, fr, 10), out)
    text = open(out, encoding="utf-8").read()
    assert "One frame per stack (trace depth 1)" in text and "--depth 16" in text
    assert [(n["label"], n["depth"], n["bytes"]) for n in page_nodes(text)] == [
        ("all", 0, 1000), ("A", 1, 500), ("B", 1, 500)]
    verdict, boxes, tip, console = selftest(out, tmp_path)
    assert verdict.startswith("SELFTEST PASS"), verdict
    assert not console, console
    v = verdict_fields(verdict)
    assert v["flame-depth"] == "1" and v["flame-zoom-hidden"] == "1/1"
    assert abs(float(boxes[1]["data-mw"]) - 0.5) < 1e-3
    assert tip == "A(int)\n/src/a.c:10\nserver\n500 bytes (500 B), 50.00% of all\n5 blocks"


def test_no_flame_graph_without_bytes(tmp_path):
    out = str(tmp_path / "z.html")
    panda.render_report(fake_rep([mmleak.Alloc(1, 1, 0, 0, (A,))], frames_abcde(), 10), out)
    text = open(out, encoding="utf-8").read()
    assert "No flame graph: the unfreed blocks hold 0 bytes." in text
    assert 'id="flame-data"' not in text
    panda.render_report(fake_rep([], {}, 10), out)
    text = open(out, encoding="utf-8").read()
    assert 'id="flame-panel"' not in text and 'id="flame-data"' not in text
    assert "No leaks" in text


# ---------------------------------------------------------------------------------------
# Big traces: the page stays small
# ---------------------------------------------------------------------------------------

def deep_survivors(n, nstacks, depth, distinct, seed=5):
    """N blocks over NSTACKS stacks of DEPTH symbolized frames: from a random call tree
    (stacks share their outer frames), or DISTINCT (no frame shared: the worst case)."""
    rnd = random.Random(seed)
    stacks = []
    for s in range(nstacks):
        if distinct:
            st = [0x400000 + 16 * (s * depth + d) for d in range(depth)]
        else:
            st = [0x400000 + 16 * (rnd.randrange(3 ** min(d + 1, 8)) + d * 7000)
                  for d in range(depth)]
        stacks.append(tuple(reversed(st)))
    frames = {}
    for st in stacks:
        for a in st:
            i = (a - 0x400000) // 16
            frames[a] = mmleak.Frame(a, "server", a - 0x400000,
                                     "ns::Service<std::string>::handler_%d(int, char const*)" % i,
                                     "/home/build/src/server/module_%d/handler.cpp" % (i % 50),
                                     100 + i % 900, (), None)
    surv = [mmleak.Alloc(0x5555000000 + 16 * i, 1, 8 + i % 100, i // 1000,
                         stacks[rnd.randrange(nstacks)]) for i in range(n)]
    return surv, frames


@pytest.mark.parametrize("nstacks,depth,distinct,limit", [(5000, 16, False, 100 * 1024),
                                                          (1000, 64, True, 700 * 1024)])
def test_million_blocks_flame_size(tmp_path, nstacks, depth, distinct, limit):
    surv, frames = deep_survivors(1000000, nstacks, depth, distinct)
    total = sum(a.size for a in surv)
    out = str(tmp_path / "big.html")
    panda.render_report(fake_rep(surv, frames, 1000, depth=depth, trace_depth=depth), out)
    text = open(out, encoding="utf-8").read()
    panel = re.search(r'<div class="flame-panel".*?</script>', text, re.S).group(0)
    print("1M blocks, %d stacks of %d frames%s: page %d bytes, flame graph %d bytes"
          % (nstacks, depth, " (no frame shared)" if distinct else "", len(text.encode()),
             len(panel.encode())))
    assert len(panel.encode()) < limit
    nodes = page_nodes(text)
    assert nodes[0]["bytes"] == total and nodes[0]["blocks"] == 1000000
    assert len(nodes) <= panda.FLAME_MAX_BOXES + 1
    assert all(n["bytes"] * 1000 >= total for n in nodes)
    # what was left out adds up: the bytes of every box's callees not drawn
    cut = sum(n["cut"] for n in nodes)
    m = re.search(r"Not drawn: ([\d,]+) boxes narrower than 0\.1% of the total \(or beyond "
                  r"the 5,000 widest\), with their callees; ([^<]*) in ([\d,]+) blocks", text)
    assert m, "no note on the boxes left out"
    assert m.group(2) == mmleak.human_bytes(cut)
    # widths add up: a box's callees drawn plus those cut are at most its own bytes
    kids = {}
    for n in nodes:
        if n["parent"] is not None:
            kids[n["parent"]] = kids.get(n["parent"], 0) + n["bytes"]
    for n in nodes:
        assert kids.get(n["i"], 0) + n["cut"] <= n["bytes"]


# ---------------------------------------------------------------------------------------
# A real traced program, whole stacks (MMLEAK_DEPTH=16)
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def leaky16(tmp_path_factory):
    d, exe, runs = demo_traces(tmp_path_factory, "leaky16", (16,))
    out = str(d / "report.html")
    _, dumps, pid = report_page((d, exe, runs), 16, out)
    return dumps, pid, out


def test_flame_real_program_depth16(leaky16, tmp_path):
    dumps, pid, out = leaky16
    text = open(out, encoding="utf-8").read()
    rep = mmleak.build_report(dumps, pid, progress=False)
    assert rep["trace_depth"] == 16
    total = sum(a.size for a in rep["survivors"])
    assert headline(text) == (total, len(rep["survivors"]))
    nodes = page_nodes(text)
    # the root is every unfreed byte of the report
    assert (nodes[0]["bytes"], nodes[0]["blocks"]) == (total, len(rep["survivors"]))
    # each leak of the program is one box at its line, with its exact bytes and blocks
    for fn, (tag, nbytes, blocks) in EXPECTED_D4.items():
        boxes = [n for n in nodes if n["name"] == fn and n["file"] == SRC]
        assert [(n["line"], n["bytes"], n["blocks"]) for n in boxes] == [
            (marker_line(tag), nbytes, blocks)], fn
        # whole stacks: main (or the thread's lambda) above it, _start or the thread's
        # start at the top
        up, n = [], boxes[0]
        while n["parent"] is not None:
            n = nodes[n["parent"]]
            up.append(n["label"])
        assert "main" in up or "main::{lambda()#1}::operator()" in up, (fn, up)
        assert up[-2] in ("_start", "__clone3"), (fn, up)
    # xmalloc below intern_name, with the same bytes: the wrapper is a box of its own
    xm = [n for n in nodes if n["name"] == "xmalloc"]
    assert len(xm) == 1 and nodes[xm[0]["parent"]]["name"] == "intern_name"
    assert (xm[0]["line"], xm[0]["bytes"]) == (marker_line("LEAK-xmalloc"),
                                               EXPECTED_D4["intern_name"][1])
    # in the browser: the page passes its self-test, the root box is the full width and the
    # Worker::handle box is as wide as its share of the bytes
    verdict, boxes, tip, console = selftest(out, tmp_path)
    assert verdict.startswith("SELFTEST PASS"), verdict
    assert not console, console
    assert boxes[0]["data-mw"] == "1.00000"
    assert boxes[0]["text"] == "all: %s in %s blocks" % (mmleak.human_bytes(total),
                                                         "{:,}".format(len(rep["survivors"])))
    wh = [n for n in nodes if n["name"] == "Worker::handle(int)"][0]
    assert boxes[wh["i"]]["text"] == "Worker::handle  demo_leaky.cpp:%d" % marker_line(
        "LEAK-session")
    frac = EXPECTED_D4["Worker::handle(int)"][1] / total
    assert abs(float(boxes[wh["i"]]["data-mw"]) - frac) < 2e-4
    # the classic pipe draws the same graph from the shrunk trace ("#s" stack lines and all)
    files = mmleak.find_traces(dumps)[pid]
    maps = os.path.join(dumps, "mmleak.%s.maps" % pid)
    shr = subprocess.run([PY, MMLEAK, "shrink", "--final"] + files, capture_output=True)
    assert shr.returncode == 0
    assert b"\n#s " in shr.stdout
    p = subprocess.run([PY, panda.__file__, "--maps", maps], input=shr.stdout,
                       capture_output=True)
    assert p.returncode == 0, p.stderr
    assert page_nodes(p.stdout.decode()) == nodes
    # without its "#s" lines every stack is unknown, and the page says so
    lines = b"".join(l + b"\n" for l in shr.stdout.split(b"\n")
                     if l[:1] not in (b"#", b"") and len(l.split()) >= 5)
    p = subprocess.run([PY, panda.__file__, "--maps", maps], input=lines, capture_output=True)
    assert p.returncode == 0, p.stderr
    n = len(rep["survivors"])
    assert ("%s blocks refer to %d stacks whose <code>#s</code> line is not in the input"
            % ("{:,}".format(n), len({a.callers for a in rep["survivors"]}))) in p.stdout.decode()


def test_pipe_resolves_stack_lines_in_any_order():
    """mmleak-panda.py on stdin (format 2): "#s ID FRAME..." lines give the stacks of the
    "@ID" events, also when defined after their first use; an undefined stack is 0x0, and the
    page says how many blocks."""
    data = (b"#mmleak 2 id=9 pid=9 tid=9 file=0 depth=16 start=1700000000\n"
            b"1000 1 40 0 @abc\n"
            b"#s abc 401000 402000\n"
            b"2000 1 20 1 @abc\n"
            b"3000 1 10 2 @def\n"
            b"4000 1 5 2 401000 403000\n")
    p = subprocess.run([PY, panda.__file__], input=data, capture_output=True)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    assert headline(text) == (0x40 + 0x20 + 0x10 + 5, 4)
    assert [(n["label"], n["depth"], n["bytes"], n["blocks"]) for n in page_nodes(text)] == [
        ("all", 0, 117, 4), ("0x402000", 1, 96, 2), ("0x401000", 2, 96, 2),
        ("0x0", 1, 16, 1), ("0x403000", 1, 5, 1), ("0x401000", 2, 5, 1)]
    assert "1 block refers to 1 stack whose <code>#s</code> line is not in the input" in text
    p = subprocess.run([PY, panda.__file__], input=data.replace(b"#s abc 4", b"#s abc 4zz"),
                       capture_output=True)
    assert p.returncode == mmleak.EXIT_INPUT
    assert p.stderr.decode() == ("mmleak-panda.py: <stdin>:3: malformed stack line (#s ID "
                                 "FRAME..., hex): b'#s abc 4zz01000 402000'; no report "
                                 "written\n")
