"""Allocation wrappers found, not listed (issue #21, part 2): a function that returns the
block the allocator gave it, to callers that use it, is a wrapper; the call site is then its
caller.  One program per shape (redis's zmalloc chain, nginx's pools, GLib-style macros), a
pool allocator whose slabs stay at its grow path, and counterexamples; exact blocks and bytes
at exact lines, with no wrapper named anywhere.

Whole stacks: MMLEAK_DEPTH=64 here until the tracer records them by default (issue #21
part 1, another branch); then WHOLE can become {}."""
import collections
import os
import subprocess

import pytest

from conftest import TESTS, mmleak, run_traced, site_line

# no reachability scan (MMLEAK_SCAN=0, issue 20): these tests hold the sites of the blocks not
# freed, whatever their kind (the terminal hides still reachable sites after a scan)
WHOLE = {"MMLEAK_DEPTH": "64", "MMLEAK_SCAN": "0"}

# program: {site marker: (blocks, bytes)}; the stdout buffer (printf's line) comes on top
EXPECTED = {
    "wrap_redis": {"z_a": (3, 300), "z_dup": (2, 14), "z_calloc": (1, 48), "z_b": (1, 64),
                   "z_ctor": (2, 80)},
    "wrap_ngx": {"n_pool": (1, 1024), "n_large": (3, 15000), "n_large2": (1, 6000),
                 "n_grow": (2, 2048)},
    "wrap_glib": {"g_items": (4, 96), "g_array": (1, 80), "g_dup": (1, 6), "g_dup2": (1, 6)},
    "wrap_pool": {"p_slab": (3, 12288), "p_new": (1, 24)},
    "wrap_not": {"own": (2, 64), "node": (5, 80), "keep": (4, 160)},
    "wrap_arity": {"a1": (1, 24), "a2": (1, 48), "reg": (5, 160), "buf": (2, 200),
                   "rec": (3, 120), "hook": (2, 20), "meth": (2, 60),
                   "direct": (1, 20), "blob": (2, 80), "conn": (3, 144), "pool": (1, 56)},
    "wrap_hook": {"hook3": (3, 120), "hook1": (1, 24)},
}
FOUND = {
    "wrap_redis": {"ztrymalloc_usable", "zmalloc", "zstrdup", "ztrycalloc_usable", "zcalloc"},
    "wrap_ngx": {"ngx_alloc", "ngx_memalign", "ngx_create_pool", "ngx_palloc_large",
                 "ngx_pcalloc"},
    "wrap_glib": {"my_malloc", "my_malloc0", "my_strdup"},
    "wrap_pool": set(),
    "wrap_not": set(),
    "wrap_arity": {"my_calloc", "my_alloc_at", "dup_hook", "make_str", "pool_get"},
    "wrap_hook": {"mem_malloc", "cfg_malloc"},
}
# built as a shared library's code is, so the hook's struct is reached through a register
FLAGS = {"wrap_hook": ["-fPIC"]}


@pytest.fixture(scope="module")
def progs(tmp_path_factory, lib):
    d = tmp_path_factory.mktemp("wrap")
    out = {}
    for name in EXPECTED:
        exe = str(d / name)
        subprocess.run(["cc", "-O2", "-g"] + FLAGS.get(name, []) +
                       ["-o", exe, os.path.join(TESTS, name + ".c")], check=True)
        out[name] = exe
    return out


def sites_in(rep, source, wrappers=None):
    """{line: (blocks, bytes)} of REP's sites in tests/SOURCE."""
    got = collections.defaultdict(lambda: [0, 0])
    for s in mmleak.site_table(rep, wrappers=wrappers):
        fr = rep["frames"].get(s.caller)
        assert fr is not None and fr.file, s
        if os.path.basename(fr.file) == source:
            got[fr.line][0] += s.blocks
            got[fr.line][1] += s.bytes
    return {k: tuple(v) for k, v in got.items()}


def printf_line(source):
    lines = open(os.path.join(TESTS, source)).read().splitlines()
    return next(i + 1 for i, l in enumerate(lines) if "printf(\"%" in l)


def trace(exe, tmp_path, **kw):
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([exe], dump, env=WHOLE)
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    return mmleak.build_report(str(dump), tid, progress=False, **kw)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_wrappers_found_and_sites_exact(progs, tmp_path, name):
    """The call sites are the wrappers' callers (or, for a pool's slabs and a function that
    keeps its block, the function that called malloc), with exactly the blocks and bytes
    leaked; the wrappers found are exactly those, each with its evidence."""
    rep = trace(progs[name], tmp_path)
    src = name + ".c"
    got = sites_in(rep, src)
    want = {site_line(src, k): v for k, v in EXPECTED[name].items()}
    stdout = got.pop(printf_line(src), None)
    assert stdout and stdout[0] == 1, got           # the stdout buffer, at printf's line
    assert got == want
    found = rep["found_wrappers"]
    assert set(found) == FOUND[name]
    for f in found.values():
        assert f.how.startswith("returns the block ") and f.where.startswith(name + "+0x")


@pytest.mark.parametrize("name", ["wrap_redis", "wrap_ngx"])
def test_wrapper_detection_off(progs, tmp_path, name):
    """--no-wrapper-detection: the sites are where the program called the allocator (the
    innermost wrapper), as before; --wrappers names still work then."""
    rep = trace(progs[name], tmp_path, detect_wrappers=False)
    src = name + ".c"
    got = sites_in(rep, src)
    assert rep["found_wrappers"] == {}
    fns = {rep["frames"][s.caller].function for s in mmleak.site_table(rep)}
    if name == "wrap_redis":
        assert {"ztrymalloc_usable", "ztrycalloc_usable"} <= fns and "main" in fns
        rep["wrappers"] = ["ztrymalloc_usable", "zmalloc"]
        named = sites_in(rep, src)
        assert named[site_line(src, "z_a")] == (3, 300)
        assert named[site_line(src, "z_b")] == (1, 64)
    else:
        assert {"ngx_alloc", "ngx_memalign"} <= fns


def test_wrappers_in_the_terminal_report(progs, tmp_path):
    """The report says which functions were taken as wrappers and from what evidence."""
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([progs["wrap_redis"]], dump, env=WHOLE)
    import io
    rep = mmleak.build_report(str(dump), progress=False)
    out = io.StringIO()
    mmleak.print_top_sites(rep, out)
    text = out.getvalue()
    assert "allocation wrappers found (their callers are the call sites):" in text
    assert "    zmalloc: returns the block ztrymalloc_usable gave it; its callers use it (at " \
        "wrap_redis+0x" in text
    assert "main at %s:%d" % (os.path.join(TESTS, "wrap_redis.c"),
                              site_line("wrap_redis.c", "z_a")) in text


def test_wrappers_on_the_page_and_the_switch(progs, tmp_path):
    """mmleak.py report: the HTML page's notes name the wrappers found and their evidence;
    --no-wrapper-detection says detection is off, and the site is the innermost wrapper."""
    import sys
    from conftest import ROOT
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([progs["wrap_glib"]], dump, env=WHOLE)
    page = tmp_path / "r.html"
    cmd = [sys.executable, os.path.join(ROOT, "mmleak.py"), "report", str(dump)]
    r = subprocess.run(cmd + ["-o", str(page)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = "main at %s:%d" % (os.path.join(TESTS, "wrap_glib.c"),
                              site_line("wrap_glib.c", "g_items"))
    assert "    my_malloc0: returns the block calloc gave it; its callers use it" in r.stdout
    assert line in r.stdout
    html = page.read_text()
    assert "<b>Allocation wrappers found</b>" in html
    assert "<code>my_malloc0</code>: returns the block calloc gave it" in html
    r = subprocess.run(cmd + ["--no-html", "--no-wrapper-detection"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "allocation wrappers: detection off (--no-wrapper-detection)" in r.stdout
    assert line not in r.stdout and "my_malloc0 at " in r.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_wrappers_of_a_stripped_program(progs, tmp_path, name):
    """A stripped program, no debug information anywhere (Debian's git, sqlite's and
    libxml2's static functions): its functions have no symbol, and are read between the
    bounds of their .eh_frame entries, which strip keeps.  The same wrappers are found, named
    by where they start (object+0xSTART), and the sites are the same, exactly: each stripped
    site's address is mapped to its line through the unstripped program's frames (the same
    code at the same offsets)."""
    import shutil
    from mmleaklib import elfcode
    exe = str(tmp_path / "bin" / name)
    os.mkdir(os.path.dirname(exe))
    shutil.copy(progs[name], exe)
    subprocess.run(["strip", "--strip-all", exe], check=True)
    src = name + ".c"
    (tmp_path / "plain").mkdir()
    (tmp_path / "stripped").mkdir()
    plain = trace(progs[name], tmp_path / "plain")
    line_of = {(fr.module, fr.offset): fr.line for fr in plain["frames"].values()
               if fr.file and os.path.basename(fr.file) == src}
    rep = trace(exe, tmp_path / "stripped")
    got = collections.defaultdict(lambda: [0, 0])
    for s in mmleak.site_table(rep):
        fr = rep["frames"][s.caller]
        if fr.module == name:
            assert not fr.file and not fr.function, fr
            line = line_of[(fr.module, fr.offset)]
            got[line][0] += s.blocks
            got[line][1] += s.bytes
    got = {k: tuple(v) for k, v in got.items()}
    want = {site_line(src, k): v for k, v in EXPECTED[name].items()}
    stdout = got.pop(printf_line(src), None)
    assert stdout and stdout[0] == 1, got
    assert got == want
    symbols = elfcode.elf(progs[name])
    names = set()
    for f in rep["found_wrappers"].values():
        assert f.name.startswith(name + "+0x") and f.how.startswith("returns the block "), f
        start = symbols.vaddr(int(f.name.split("+0x")[1], 16))
        names.add(symbols.function_at(start)[2])
    assert names == FOUND[name]


@pytest.mark.parametrize("strip", [False, True])
def test_batched_disassembly_is_exact(progs, tmp_path, monkeypatch, strip):
    """The code read ahead in few objdump runs (elfcode.disassemble_many: spans cut at the
    functions' bounds) is exactly the code read one run per function, for every function of
    the test programs (their symbols' bounds, or, stripped, their .eh_frame entries'), and
    for bounds inside an instruction (which a span's output cannot be cut at: read alone)."""
    import shutil
    from mmleaklib import elfcode
    runs = []
    objdump = elfcode._objdump

    def counted(*a):
        runs.append(a)
        return objdump(*a)
    monkeypatch.setattr(elfcode, "_objdump", counted)
    for name, prog in sorted(progs.items()):
        del runs[:]
        path = str(tmp_path / name)
        shutil.copy(prog, path)
        if strip:
            subprocess.run(["strip", "--strip-all", path], check=True)
        e = elfcode.Elf(path)
        ranges = [(s, t) for s, t, _ in e.funcs if t > s + 1] if not strip else e._read_fdes()
        assert len(ranges) >= 4
        # bounds inside an instruction (one of two bytes or more): in no span's output
        odd = []
        for s, t in ranges:
            addrs = [a for a, _, _ in objdump(path, s, t)[0]] + [t]
            inside = next(a + 1 for a, b in zip(addrs, addrs[1:]) if b > a + 1)
            odd += [(inside, t), (s, inside)]
        elfcode._code.clear()
        del runs[:]
        elfcode.disassemble_many(path, ranges)
        # a small program: one span, and a few ranges read alone (a size-0 symbol's, the
        # PLT's, whose bounds are not where an instruction of the span starts)
        assert len(runs) < len(ranges) / 2, (name, len(runs), len(ranges))
        first = len(runs)
        elfcode.disassemble_many(path, odd)
        assert len(runs) == first + 1 + len(odd), (name, len(runs), len(odd))  # each alone
        batched = {r: elfcode._code[(path,) + tuple(r)] for r in ranges + odd}
        for r, code in batched.items():
            alone = objdump(path, r[0], r[1])[0]
            assert code is not None and code == alone, (name, r)
    elfcode._code.clear()
