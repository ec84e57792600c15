"""Tests for the HTML leak report (mmleak-panda.py, and `mmleak.py report` which calls it).

Run: /usr/bin/python3 -m pytest tests/test_report.py

A known leaky C++ program (tests/demo_leaky.cpp) is compiled with g++ -O0 -g and run under
mmleak.so; the report must show its exact leaks (bytes, blocks, function, file:line).  The page
is opened in headless Chromium, which runs the page's own self-test (URL fragment #selftest:
the inline script clicks column headers, checks the order, filters, counts the SVG paths and
writes the verdict into document.title and a hidden <pre>, which --dump-dom shows).
"""
import html.parser
import os
import random
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PANDA = os.path.join(REPO, "mmleak-panda.py")
MMLEAK = os.path.join(REPO, "mmleak.py")
LIB = os.path.join(REPO, "mmleak.so")
SRC = os.path.join(HERE, "demo_leaky.cpp")
PY = "/usr/bin/python3"
CHROMIUM = "/usr/bin/chromium"

SECONDS, THREADS = 2, 3
TICKS = 10 * SECONDS


from conftest import mmleak, script  # noqa: E402 (the package, and the scripts by name)

panda = script("mmleak-panda.py")


def marker_line(tag):
    with open(SRC) as f:
        for i, line in enumerate(f, 1):
            if "// " + tag in line:
                return i
    raise AssertionError("marker %s not in %s" % (tag, SRC))


# function (as eu-addr2line demangles it), marker, bytes, blocks -- see demo_leaky.cpp
EXPECTED_D1 = {
    "load_config": ("LEAK-config", 4096, 1),
    "Worker::handle(int)": ("LEAK-session", 48 * THREADS * TICKS, THREADS * TICKS),
    "xmalloc": ("LEAK-xmalloc", 24 * TICKS, TICKS),
    "grow_log": ("LEAK-log", 64 * TICKS, 1),
    "Pool<Item<int> >::make()": ("LEAK-pool", 64 * TICKS, TICKS),
}
# with a deeper trace the xmalloc wrapper is looked through: the site is its caller
EXPECTED_D4 = dict(EXPECTED_D1)
EXPECTED_D4["intern_name"] = ("LEAK-intern", 24 * TICKS, TICKS)
del EXPECTED_D4["xmalloc"]


class Table(html.parser.HTMLParser):
    """The call-site table of a report: one dict per row, from the cells' data-v values."""
    COLS = ["rank", "func", "loc", "mod", "bytes", "blocks", "mean", "min", "max", "oldest",
            "youngest"]

    def __init__(self, text):
        super().__init__()
        self.rows, self.row, self.in_table = [], None, False
        self.ids = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids[a["id"]] = a
        if tag == "table" and a.get("id") == "sites":
            self.in_table = True
        elif self.in_table and tag == "tr" and "data-rank" in a:
            self.row = []
            self.rows.append(self.row)
        elif self.row is not None and tag == "td":
            self.row.append(a.get("data-v"))

    def handle_endtag(self, tag):
        if tag == "table":
            self.in_table = False
        if tag == "tr":
            self.row = None

    def dicts(self):
        out = []
        for r in self.rows:
            d = dict(zip(self.COLS, r))
            for k in ("rank", "bytes", "blocks", "min", "max", "oldest", "youngest"):
                d[k] = int(d[k])
            out.append(d)
        return out


def table(path_or_text):
    text = path_or_text
    if os.path.exists(path_or_text):
        with open(path_or_text, encoding="utf-8") as f:
            text = f.read()
    return Table(text).dicts(), text


def headline(text):
    m = re.search(r"<h1>mmleak: <b>([^<]*)</b> in <b>([\d,]+)</b> blocks not freed</h1>", text)
    assert m, "headline missing"
    exact = re.search(r'<div class="k">Unfreed bytes</div><div class="v">[^<]*</div>'
                      r'<div class="n">([\d,]+) bytes</div>', text)
    return int(exact.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


# ---------------------------------------------------------------------------------------
# A real traced program
# ---------------------------------------------------------------------------------------

def demo_traces(tmp_path_factory, name, depths):
    """tests/demo_leaky.cpp built and traced once per MMLEAK_DEPTH in DEPTHS: (directory,
    executable, {depth: (dump directory, trace id)})."""
    for tool in ("g++", "eu-addr2line", "make"):
        if not shutil.which(tool):
            pytest.fail("%s is needed for this test (apt-get install g++ elfutils make)" % tool)
    if subprocess.run(["make", "-s", "-C", REPO, "mmleak.so"]).returncode:
        pytest.fail("make mmleak.so failed")
    d = tmp_path_factory.mktemp(name)
    exe = str(d / "demo_leaky")
    subprocess.run(["g++", "-O0", "-g", "-pthread", "-o", exe, SRC], check=True)
    runs, procs = {}, {}
    # the depths' runs side by side (each in a dump directory of its own): the program
    # runs SECONDS seconds of ticks whatever the machine does, so one at a time cost the
    # sum
    for depth in depths:
        dumps = d / ("dumps%d" % depth)
        dumps.mkdir()
        # no reachability scan (MMLEAK_SCAN=0, issue 20): these tests hold the report of
        # blocks not freed, one row per call site; test_leakcheck.py has the kinds
        env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dumps), MMLEAK_DEPTH=str(depth),
                   MMLEAK_SCAN="0")
        procs[depth] = subprocess.Popen([exe, str(SECONDS), str(THREADS)], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
    for depth in depths:
        dumps = d / ("dumps%d" % depth)
        _, err = procs[depth].communicate(timeout=120)
        assert procs[depth].returncode == 0, err
        traces = mmleak.find_traces(str(dumps))
        assert len(traces) == 1, traces
        runs[depth] = (str(dumps), next(iter(traces)))
    return d, exe, runs


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    return demo_traces(tmp_path_factory, "leaky", (1, 4))


def report_page(leaky, depth, out, *args):
    """`mmleak.py report` of the depth DEPTH trace of LEAKY with its page at OUT: (the
    process, dump directory, trace id)."""
    d, exe, runs = leaky
    dumps, pid = runs[depth]
    p = subprocess.run([PY, MMLEAK, "report", dumps, "--pid", pid, "-o", out] + list(args),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p, dumps, pid


def own_rows(rows):
    """Rows whose call site is in the test program (libc and libstdc++ keep blocks of their
    own, which vary with the system)."""
    return {r["func"]: r for r in rows if r["mod"].startswith("demo_leaky+")}


def check_rows(rows, expected):
    own = own_rows(rows)
    assert set(own) == set(expected), sorted(own)
    for fn, (tag, nbytes, blocks) in expected.items():
        r = own[fn]
        assert r["loc"] == "%s:%d" % (SRC, marker_line(tag)), (fn, r["loc"])
        assert (r["bytes"], r["blocks"]) == (nbytes, blocks), fn
        assert r["min"] <= r["max"]
        if fn not in ("grow_log", "load_config"):
            assert r["min"] == r["max"] == nbytes // blocks, fn
    return own


def test_report_real_program_depth1(leaky, tmp_path):
    out = str(tmp_path / "r.html")
    p, dumps, pid = report_page(leaky, 1, out)
    assert "HTML report: %s" % out in p.stdout
    rows, text = table(out)
    check_rows(rows, EXPECTED_D1)
    # the headline equals the survivors mmleak.py finds, and the table adds up to it
    rep = mmleak.build_report(dumps, pid, progress=False)
    total_b, total_n = headline(text)
    assert total_b == sum(a.size for a in rep["survivors"])
    assert total_n == len(rep["survivors"])
    assert sum(r["bytes"] for r in rows) == total_b
    assert sum(r["blocks"] for r in rows) == total_n
    own_total = sum(v[1] for v in EXPECTED_D1.values())
    assert sum(r["bytes"] for r in own_rows(rows).values()) == own_total
    # process and time span in the headline; ages within the run
    assert "pid %s" % pid in text and "demo_leaky %d %d" % (SECONDS, THREADS) in text
    assert "{:,}".format(rep["events"]) in text
    assert all(0 <= r["youngest"] <= r["oldest"] <= SECONDS + 1 for r in rows)
    # C++ names escaped, never raw
    assert "Pool&lt;Item&lt;int&gt; &gt;::make()" in text
    assert "Pool<Item<int> >::make()" not in text
    # depth 1: the xmalloc wrapper is the site, and the page says how to see through it
    assert "--depth 4" in text and "(xmalloc)" in text
    assert text.count("<svg xmlns") == 2


def test_report_real_program_depth4_wrappers(leaky, tmp_path):
    out = str(tmp_path / "r4.html")
    p, dumps, pid = report_page(leaky, 4, out)
    rows, text = table(out)
    own = check_rows(rows, EXPECTED_D4)
    assert "via xmalloc" in text
    assert 'class="stk"' in text
    # the stack of the intern_name site starts in xmalloc and goes on through main
    tr = [t for t in text.split("<tr data-rank=")[1:]
          if 'data-v="intern_name"' in t]
    assert len(tr) == 1
    stack = tr[0][tr[0].index("<details"):tr[0].index("</details>")]
    assert 'xmalloc <span title="%s:%d">' % (SRC, marker_line("LEAK-xmalloc")) in stack
    assert "intern_name <span" in stack and "main <span" in stack
    assert own["intern_name"]["rank"] > 0


def test_report_filters_real_program(leaky, tmp_path):
    """mmleak.py report --since/--older-than: the page shows the filtered survivors that
    build_report keeps, and says what was hidden."""
    d, exe, runs = leaky
    dumps, pid = runs[1]
    out = str(tmp_path / "f.html")
    p = subprocess.run([PY, MMLEAK, "report", dumps, "--pid", pid, "-o", out, "--since", "1",
                        "--older-than", "0"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows, text = table(out)
    rep = mmleak.build_report(dumps, pid, progress=False, since=1, older_than=0)
    allrep = mmleak.build_report(dumps, pid, progress=False)
    kept = [a for a in allrep["survivors"] if a.time >= 1]
    assert headline(text) == (sum(a.size for a in kept), len(kept))
    assert headline(text) == (sum(a.size for a in rep["survivors"]), len(rep["survivors"]))
    assert "Filter applied" in text and "--since 1" in text and "--older-than 0" in text
    assert "{:,}".format(len(allrep["survivors"])) in text
    assert all(r["oldest"] <= allrep["end_time"] - 1 for r in rows)
    assert sum(r["bytes"] for r in rows) == sum(a.size for a in kept)


def test_report_progress_when_asked(leaky, monkeypatch):
    """report's progress (the reading's, the symbolizing's) is shown on a terminal, and with
    --progress ("always") elsewhere too, as shrink's and compact's: the reader is given a
    progress printer and the symbolizer told so; not otherwise (stderr here is no
    terminal).  (What the printer writes: test_compact's test of a fold's progress.)"""
    d, exe, runs = leaky
    dumps, pid = runs[1]
    made, told = [], []
    real_printer = mmleak.report.progress_printer
    real_sym = mmleak.report.Symbolizer

    def printer(*a, **k):
        made.append(1)
        return real_printer(*a, **k)

    def symbolizer(*a, **k):
        told.append(k.get("progress"))
        return real_sym(*a, **k)
    monkeypatch.setattr(mmleak.report, "progress_printer", printer)
    monkeypatch.setattr(mmleak.report, "Symbolizer", symbolizer)
    assert not sys.stderr.isatty()
    mmleak.build_report(dumps, pid, progress=True)
    assert (made, told) == ([], [False])
    mmleak.build_report(dumps, pid, progress="always")
    assert (made, told) == ([1], [False, True])
    # and the command line's option asks for it
    p = subprocess.run([PY, MMLEAK, "report", "--help"], capture_output=True, text=True)
    assert re.search(r"^  --progress\s", p.stdout, re.M), p.stdout


def test_classic_pipe_matches_report(leaky, tmp_path):
    d, exe, runs = leaky
    dumps, pid = runs[1]
    files = mmleak.find_traces(dumps)[pid]
    maps = os.path.join(dumps, "mmleak.%s.maps" % pid)
    shr = subprocess.run([PY, MMLEAK, "shrink", "--final"] + files, capture_output=True)
    assert shr.returncode == 0
    p = subprocess.run([PY, PANDA, "--maps", maps], input=shr.stdout, capture_output=True)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    rows, _ = table(text)
    check_rows(rows, EXPECTED_D1)
    rep = mmleak.build_report(dumps, pid, progress=False)
    assert headline(text) == (sum(a.size for a in rep["survivors"]), len(rep["survivors"]))
    # awk 'NF >= 5' of a shrink result: the same survivors, no headers
    lines = b"".join(l + b"\n" for l in shr.stdout.split(b"\n") if len(l.split()) >= 5)
    p2 = subprocess.run([PY, PANDA, "--maps", maps], input=lines, capture_output=True)
    assert p2.returncode == 0, p2.stderr
    rows2, text2 = table(p2.stdout.decode())
    check_rows(rows2, EXPECTED_D1)
    assert headline(text2) == headline(text)
    # without --maps: addresses only, and the page says why
    p3 = subprocess.run([PY, PANDA], input=lines, capture_output=True)
    assert p3.returncode == 0
    assert "no --maps given" in p3.stdout.decode()


# ---------------------------------------------------------------------------------------
# Headless Chromium: the page from disk, screenshot, console errors, sorting, charts
# ---------------------------------------------------------------------------------------

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]


def chromium(args, tmp_path):
    prof = tempfile.mkdtemp(dir=str(tmp_path))
    return subprocess.run([CHROMIUM] + CHROME_FLAGS + ["--user-data-dir=" + prof] + args,
                          capture_output=True, text=True, timeout=120)


def png_pixels(path):
    """Decode an 8-bit RGB/RGBA PNG (what Chromium writes) -> (width, height, rows)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, typ = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if typ == b"IHDR":
            w, h, bits, ctype = struct.unpack(">IIBB", body[:10])
            assert bits == 8 and ctype in (2, 6)
            bpp = 3 if ctype == 2 else 4
        elif typ == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, rows, bpp


@pytest.fixture(scope="module")
def demo_page(leaky, tmp_path_factory):
    d, exe, runs = leaky
    dumps, pid = runs[4]
    out = str(tmp_path_factory.mktemp("page") / "report.html")
    p = subprocess.run([PY, MMLEAK, "report", dumps, "--pid", pid, "-o", out],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


def test_browser_selftest_sort_filter_svg(demo_page, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip("%s is not installed (CI installs it): browser test not run" % CHROMIUM)
    r = chromium(["--enable-logging=stderr", "--v=0", "--dump-dom",
                  "file://%s#selftest" % demo_page], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="selftest">([^<]*)</pre>', r.stdout)
    assert m, "self-test did not run: %s" % r.stdout[-500:]
    verdict = m.group(1)
    assert verdict.startswith("SELFTEST PASS"), verdict
    for part in ("sort-bytes-asc=true", "sort-bytes-desc=true", "sort-blocks-asc=true",
                 "sort-blocks-desc=true", "errors=0", "filter-none=0", "hide-rt-visible=0"):
        assert part in verdict, verdict
    assert int(re.search(r"paths=(\d+)", verdict).group(1)) > 10
    # hiding the runtime libraries leaves exactly the program's own sites
    assert "own-sites=%d" % len(EXPECTED_D4) in verdict, verdict
    assert "<title>SELFTEST PASS</title>" in r.stdout
    # console messages from the page (errors, uncaught exceptions) are logged as CONSOLE
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert not console, console


def test_browser_console_check_catches_errors(tmp_path):
    """The console check above is live: a page with an error is caught by it."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("%s is not installed (CI installs it): browser test not run" % CHROMIUM)
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>noSuchFunction();</script></body></html>")
    r = chromium(["--enable-logging=stderr", "--v=0", "--dump-dom", "file://%s" % bad],
                 tmp_path)
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert any("noSuchFunction" in l for l in console), r.stderr[-2000:]


def test_browser_screenshot(demo_page, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip("%s is not installed (CI installs it): browser test not run" % CHROMIUM)
    png = str(tmp_path / "shot.png")
    r = chromium(["--screenshot=" + png, "--window-size=1200,900",
                  "file://%s" % demo_page], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.exists(png) and 10000 < os.path.getsize(png) < 5000000
    w, h, rows, bpp = png_pixels(png)
    assert (w, h) == (1200, 900)
    # not blank: many colours, the dark header band on top, the red bar of the top site
    colours = set()
    for y in range(0, h, 7):
        row = rows[y]
        for x in range(0, w * bpp, bpp * 5):
            colours.add(row[x:x + 3])
    assert len(colours) > 50
    top = rows[10][:3]
    assert max(top) < 80, top                       # header background #1d2630
    reds = sum(1 for y in range(0, h, 3) for x in range(0, w * bpp, bpp * 3)
               if rows[y][x] > 180 and rows[y][x + 1] < 80 and rows[y][x + 2] < 80)
    assert reds > 20                                 # bars drawn


# ---------------------------------------------------------------------------------------
# Synthetic input: escaping, filters, size, bad input
# ---------------------------------------------------------------------------------------

def fake_rep(survivors, frames, end_time, **kw):
    rep = {"trace": "4242", "pid": "4242", "cmd": "./server --port 80 <&>", "start": 1700000000,
           "end_time": end_time, "files": ["/tmp/x/mmleak.4242.0.out"], "maps": None,
           "events": 1000, "allocs": 600, "frees": 400, "survivors": survivors,
           "foreign_frees": [], "frames": frames, "symbol_error": None, "depth": 1,
           "trace_depth": 1, "incomplete": False}
    rep.update(kw)
    return rep


def F(addr, fn, fl, ln, module="server", inlined=()):
    return mmleak.Frame(addr, module, addr - 0x400000, fn, fl, ln, inlined, None)


def test_escaping_cpp_templates(tmp_path):
    evil = "std::map<int, std::vector<char> >::operator[](int&&) <script>alert(1)</script>"
    frames = {0x401000: F(0x401000, evil, "/src/a&b<c>.h", 12,
                          inlined=(("Foo<Bar>::get() &", "/src/x<y>.cc", 3),)),
              0x402000: F(0x402000, "plain", "/src/p.c", 5)}
    surv = [mmleak.Alloc(0x1000 + i, 1, 100, i, (0x401000,)) for i in range(3)]
    surv.append(mmleak.Alloc(0x9000, 1, 7, 1, (0x402000,)))
    out = str(tmp_path / "e.html")
    panda.render_report(fake_rep(surv, frames, 10), out)
    text = open(out, encoding="utf-8").read()
    assert "<script>alert" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "std::map&lt;int, std::vector&lt;char&gt; &gt;::operator[](int&amp;&amp;)" in text
    assert "/src/a&amp;b&lt;c&gt;.h:12" in text
    assert "inlined into Foo&lt;Bar&gt;::get() &amp; at /src/x&lt;y&gt;.cc:3" in text
    assert "./server --port 80 &lt;&amp;&gt;" in text
    # the SVG charts escape their labels too (matplotlib writes XML)
    for svg in re.findall(r"<svg.*?</svg>", text, re.S):
        assert "<script" not in svg and "<vector" not in svg
    rows, _ = table(text)
    assert [(r["bytes"], r["blocks"]) for r in rows] == [(300, 3), (7, 1)]


def test_page_says_how_deep_the_stacks_were_traced(tmp_path):
    """The page's Call sites note names the trace's depth as it was: the default (64, whole
    stacks) was called MMLEAK_DEPTH=auto, the default before issue 21."""
    frames = {0x402000: F(0x402000, "plain", "/src/p.c", 5)}
    surv = [mmleak.Alloc(0x9000, 1, 7, 1, (0x402000,))]
    out = str(tmp_path / "d.html")
    for kw, want in ((dict(depth=64, trace_depth=64), "traced with whole stacks (up to 64 "
                      "frames, MMLEAK_DEPTH's default)"),
                     (dict(depth=64, trace_depth=64, depth_auto=True), "traced with stacks "
                      "through the runtime and the wrappers to the program's own frame "
                      "(MMLEAK_DEPTH=auto)")):
        panda.render_report(fake_rep(surv, frames, 10, **kw), out)
        assert want in open(out, encoding="utf-8").read(), kw


def test_growth_legend_names_functions_that_start_with_an_underscore():
    """matplotlib leaves a label starting with '_' out of a legend: redis's growth chart
    showed one name (spt_init) for three lines (_sdsnewlen, _dictExpand...)."""
    import types
    frames = {0x401000: F(0x401000, "_sdsnewlen", "/src/sds.c", 5),
              0x402000: F(0x402000, "plain", "/src/p.c", 7)}
    rep = {"growth": {0x401000: [(0, 0, 0), (0, 0, 100)], 0x402000: [(0, 0, 0), (0, 0, 50)]},
           "series": [types.SimpleNamespace(time=0), types.SimpleNamespace(time=10)],
           "frames": frames, "trace": "4242"}
    svg = re.search(r"<svg.*?</svg>", panda.growth_panel(rep, []), re.S).group(0)
    assert re.findall(r">\s*(_sdsnewlen|plain)\s*</text>", svg) == ["_sdsnewlen", "plain"]


def synthetic(n, sites, seed=1, t_max=3600):
    """N survivor lines over SITES call sites, sizes and times known."""
    rnd = random.Random(seed)
    callers = [0x400000 + 0x40 * i for i in range(sites)]
    lines, total = [], 0
    for i in range(n):
        size = 16 + (i * 7) % 500
        total += size
        lines.append("%x %x %x %x %x\n" % (0x55550000000 + 16 * i, 1 + i % 3, size,
                                            (i * t_max) // n, callers[rnd.randrange(sites)]))
    return "".join(lines).encode(), total


def test_million_blocks_size_and_time(tmp_path):
    """A million blocks on 3,000 sites from stdin: the page is bounded (under 5 MB) and its
    counts exact.  How long it takes is measured in bench/ (bench/live.py), never here: a
    shared machine's load decides a test's wall and CPU time."""
    n = 1000000
    data, total = synthetic(n, 3000)
    data = b"#mmleak 1 id=777 pid=777 tid=777 file=0 depth=1 start=1700000000\n#cmd ./big\n" + data
    out = str(tmp_path / "big.html")
    p = subprocess.run([PY, PANDA, "-o", out], input=data, capture_output=True)
    assert p.returncode == 0, p.stderr
    size = os.path.getsize(out)
    assert size < 5 * 1024 * 1024
    rows, text = table(out)
    assert headline(text) == (total, n)
    assert len(rows) == panda.TOP_ROWS
    assert "Showing the top 500 of 3,000 call sites" in text
    assert "pid 777" in text and "./big" in text


def test_million_blocks_render_report(tmp_path):
    """The same through render_report (what `mmleak.py report` calls), depth 2 stacks."""
    n, sites = 1000000, 2000
    rnd = random.Random(2)
    callers = [(0x400000 + 0x40 * (i % 1500), 0x500000 + 0x10 * i) for i in range(sites)]
    surv = [mmleak.Alloc(0x5555000000 + 16 * i, 1, 8 + i % 100, i // 1000,
                         callers[rnd.randrange(sites)]) for i in range(n)]
    total = sum(a.size for a in surv)
    out = str(tmp_path / "big2.html")
    panda.render_report(fake_rep(surv, {}, 1000, depth=2, trace_depth=2), out)
    assert os.path.getsize(out) < 5 * 1024 * 1024     # (its time: bench/, not a test)
    rows, text = table(out)
    assert headline(text) == (total, n)
    assert "Showing the top 500 of 1,500 call sites" in text


def test_since_and_older_than(tmp_path):
    # one block of 10 bytes per second 0..99 at site A, 1000 bytes at t=0 at site B
    lines = "".join("%x 1 a %x 401000\n" % (0x1000 + i, i) for i in range(100))
    lines += "9000 1 3e8 0 402000\n"
    data = lines.encode()

    def run(*args):
        p = subprocess.run([PY, PANDA, "--end-time", "100"] + list(args), input=data,
                           capture_output=True)
        assert p.returncode == 0, p.stderr
        rows, text = table(p.stdout.decode())
        return headline(text), rows, text

    (b, n), rows, text = run()
    assert (b, n) == (1000 + 1000, 101) and "No filter" in text
    (b, n), rows, text = run("--since", "50")
    assert (b, n) == (500, 50)
    assert "--since 50" in text and "Filter applied" in text
    assert [(r["blocks"], r["oldest"], r["youngest"]) for r in rows] == [(50, 50, 1)]
    (b, n), rows, text = run("--older-than", "30")
    assert (b, n) == (1000 + 710, 72)        # allocated at 0..70
    assert "--older-than 30" in text
    (b, n), rows, text = run("--since", "20", "--older-than", "30")
    assert (b, n) == (510, 51)               # 20..70
    # render_report takes the same filters from the report dict
    surv = [mmleak.parse_event(l.encode() + b"\n") for l in lines.splitlines()]
    out = str(tmp_path / "f.html")
    panda.render_report(fake_rep(surv, {}, 100, since=20, older_than=30), out)
    rows, text = table(out)
    assert headline(text) == (510, 51) and "--since 20" in text and "--older-than 30" in text


def test_bad_input(tmp_path):
    data = b"1000 1 10 0 401000\nthis is not a dump line\n2000 1 10 0 401000\nmore junk\n"
    p = subprocess.run([PY, PANDA], input=data, capture_output=True)
    err = p.stderr.decode()
    assert p.returncode == mmleak.EXIT_INPUT
    assert p.stdout == b""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("mmleak-panda.py: <stdin>:2:") and "1 more" in err
    # usage errors, --help
    p = subprocess.run([PY, PANDA, "--no-such-option"], input=b"", capture_output=True)
    assert p.returncode == mmleak.EXIT_USAGE and p.stderr.count(b"\n") == 1
    p = subprocess.run([PY, PANDA, "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--since" in p.stdout and "exit status" in p.stdout
    p = subprocess.run([PY, PANDA, "--maps", str(tmp_path / "nope.maps")], input=data.decode(),
                       capture_output=True, text=True)
    assert p.returncode == mmleak.EXIT_INPUT and p.stderr.count("\n") == 1


def test_empty_input(tmp_path):
    p = subprocess.run([PY, PANDA], input=b"", capture_output=True)
    assert p.returncode == 0, p.stderr
    text = p.stdout.decode()
    assert headline(text) == (0, 0) and "No leaks" in text


def terminal_sites(stdout):
    """The call sites `mmleak.py report` prints: [(bytes, blocks, label)] in its order."""
    lines = stdout.splitlines()
    head = next(i for i, l in enumerate(lines) if l.split()[:3] == ["bytes", "blocks", "call"]
                or l.split()[:4] == ["bytes", "blocks", "kind", "call"])
    kind = r"(?:(?:definite|indirect|possible|reachable|unknown) +)?" \
        if "kind" in lines[head].split() else ""     # the kind column, when a scan ran
    out = []
    for line in lines[head + 1:]:
        m = re.match(r"^  +(\d+) +(\d+)  %s(.*?)(?:  \[[^]]*\])?$" % kind, line)
        if not m:
            break
        out.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    return out


def page_sites(rows):
    """The same of the page's table: its label is the terminal's (frame_label: 'function at
    file:line', 'function at module+offset', or the module and offset alone)."""
    def label(r):
        if r["loc"]:
            return "%s at %s" % (r["func"], r["loc"])
        return "%s at %s" % (r["func"], r["mod"]) if r["mod"] and r["func"] != r["mod"] \
            else r["func"]
    return [(r["bytes"], r["blocks"], label(r)) for r in rows]


@pytest.mark.parametrize("depth,args", [(1, []), (4, []), (4, ["--depth", "1"])])
def test_terminal_and_page_name_the_same_sites(leaky, tmp_path, depth, args):
    """make demo's program (tests/demo_leaky.cpp): `mmleak.py report` prints, and its page
    shows, the same call sites with the same bytes and blocks, in the same order (one table:
    report.site_table), also when --depth cuts the trace's stacks."""
    out = str(tmp_path / "r.html")
    p, _, _ = report_page(leaky, depth, out, "--top", "1000", "--show-reachable", *args)
    terminal = terminal_sites(p.stdout)
    rows, text = table(out)
    assert page_sites(rows) == terminal
    own = {l.split(" at ")[0] for _, _, l in terminal if "demo_leaky.cpp:" in l}
    assert own >= {"load_config", "Worker::handle(int)", "grow_log"}, own
    assert headline(text) == (sum(t[0] for t in terminal), sum(t[1] for t in terminal))
