"""Symbols for stripped binaries (issue #21, part 3): separate debug information found as
elfutils finds it (a build-id tree, .gnu_debuglink; --debuginfo-path for a private root, so
nothing is written under /usr), and, with none, the function from the object's own symbol
table (an exported function of a stripped library) with the offset into it."""
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, TESTS, mmleak, run_traced, site_line

# whole stacks; no reachability scan (MMLEAK_SCAN=0): these tests hold the sites of the blocks
# not freed, and a stale pointer could leave one of them reachable, hidden by the terminal
WHOLE = {"MMLEAK_DEPTH": "64", "MMLEAK_SCAN": "0"}


def build_id(path):
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True,
                         check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def report_lines(dump, **kw):
    """{(function, file basename, line): (blocks, bytes)} of the report's sites."""
    rep = mmleak.build_report(str(dump), progress=False, **kw)
    out = {}
    for s in mmleak.site_table(rep):
        fr = rep["frames"][s.caller]
        key = (fr.function, os.path.basename(fr.file) if fr.file else None, fr.line)
        out[key] = (s.blocks, s.bytes)
    return out, rep


@pytest.fixture
def stripped(tmp_path, lib):
    """wrap_redis built with -g, its debug information moved to a private build-id tree,
    the binary stripped; traced once."""
    exe = str(tmp_path / "prog")
    subprocess.run(["cc", "-O2", "-g", "-o", exe, os.path.join(TESTS, "wrap_redis.c")],
                   check=True)
    bid = build_id(exe)
    root = tmp_path / "debug"
    dst = root / ".build-id" / bid[:2] / (bid[2:] + ".debug")
    dst.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", exe, str(dst)], check=True)
    subprocess.run(["strip", "--strip-all", exe], check=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([exe], dump, env=WHOLE)
    return exe, root, dump


def test_split_debug_in_a_build_id_tree(stripped):
    """--debuginfo-path ROOT: the stripped program's sites have file:line again, exactly;
    without it (no debug information anywhere elfutils looks) they are prog+0x..."""
    exe, root, dump = stripped
    got, _ = report_lines(dump, debuginfo_path=[str(root)])
    src = "wrap_redis.c"
    assert got[("main", src, site_line(src, "z_a"))] == (3, 300)
    assert got[("main", src, site_line(src, "z_dup"))] == (2, 14)
    assert got[("create_client", src, site_line(src, "z_ctor"))] == (2, 80)
    bare, rep = report_lines(dump)
    assert not any(f for f, _, _ in bare if f and f.startswith("main")), bare
    assert any(mmleak.frame_label(rep["frames"][s.caller]).startswith("prog+0x")
               for s in mmleak.site_table(rep))


def test_split_debug_through_gnu_debuglink(tmp_path, lib):
    """.gnu_debuglink, with the debug file in the binary's .debug directory: found with no
    option (elfutils' own search)."""
    d = tmp_path / "bin"
    (d / ".debug").mkdir(parents=True)
    exe = str(d / "prog")
    subprocess.run(["cc", "-O2", "-g", "-Wl,--build-id=none", "-o", exe,
                    os.path.join(TESTS, "wrap_glib.c")], check=True)
    dbg = str(d / ".debug" / "prog.debug")
    subprocess.run(["objcopy", "--only-keep-debug", exe, dbg], check=True)
    subprocess.run(["strip", "--strip-all", exe], check=True)
    subprocess.run(["objcopy", "--add-gnu-debuglink=" + dbg, exe], check=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([exe], dump, env=WHOLE)
    got, _ = report_lines(dump)
    src = "wrap_glib.c"
    assert got[("main", src, site_line(src, "g_items"))] == (4, 96)
    os.unlink(dbg)          # the check can fail: without the file, no line
    got, _ = report_lines(dump)
    assert ("main", src, site_line(src, "g_items")) not in got


def test_a_fifo_at_a_debug_files_name_in_a_directory_others_write(tmp_path, lib):
    """The objects and their directories are whoever made the trace's: a FIFO at the
    .gnu_debuglink name beside a stripped program (or in its .debug) would hang elfutils'
    search, a blocking open, and the report of whoever reads the trace (root's, of another
    user's trace in /tmp).  An object in a directory others can write is given to elfutils
    as a descriptor, and its directory is not searched: the report ends, the site
    unresolved; a debug file there is not used either (found by build id, not by name)."""
    d = tmp_path / "bin"
    (d / ".debug").mkdir(parents=True)
    exe = str(d / "prog")
    subprocess.run(["cc", "-O2", "-g", "-Wl,--build-id=none", "-o", exe,
                    os.path.join(TESTS, "wrap_glib.c")], check=True)
    subprocess.run(["objcopy", "--only-keep-debug", exe, str(d / "prog.dbg")], check=True)
    subprocess.run(["strip", "--strip-all", exe], check=True)
    subprocess.run(["objcopy", "--add-gnu-debuglink=" + str(d / "prog.dbg"), exe], check=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([exe], dump, env=WHOLE)
    src = "wrap_glib.c"
    site = ("main", src, site_line(src, "g_items"))
    got, _ = report_lines(dump)
    assert got[site] == (4, 96)         # the debug file beside it: found (elfutils' search)
    os.chmod(str(d), 0o777)             # anybody may now put a name there
    got, rep = report_lines(dump)
    assert site not in got
    os.unlink(str(d / "prog.dbg"))
    fifos = [str(d / "prog.dbg"), str(d / ".debug" / "prog.dbg")]
    for f in fifos:
        os.mkfifo(f)
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "mmleak.py"), "report",
                          str(dump), "--no-html"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)       # (only if it hangs)
    finally:
        if p.returncode is None:        # hung (without the fix): it and its eu-addr2line
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert (p.returncode, err) == (0, "")
    assert "prog+0x" in out and src not in out


LIB_SRC = r"""
#include <stdlib.h>
void *lib_keep(size_t n) { void *p = malloc(n); if (!p) abort(); return p; }
void lib_store(void **slot, size_t n) { *slot = malloc(n); if (!*slot) abort(); }
"""
MAIN_SRC = r"""
#include <stdio.h>
void *lib_keep(size_t); void lib_store(void **, size_t);
void *keep[4];
int main(void) { lib_store(&keep[0], 40); lib_store(&keep[1], 40); keep[2] = lib_keep(24);
                 printf("%p\n", keep[0]); return 0; }
"""


def test_exported_function_and_offset_without_debug_info(tmp_path, lib):
    """A stripped library with no debug information anywhere: a site in one of its exported
    functions is labelled 'function+0xN at lib+0x...', N the offset into the function as
    its .dynsym says (nm -D); the function itself stays the name (flame graph, CSV)."""
    (tmp_path / "lib.c").write_text(LIB_SRC)
    (tmp_path / "main.c").write_text(MAIN_SRC)
    so = str(tmp_path / "libstripped.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, str(tmp_path / "lib.c")],
                   check=True)
    subprocess.run(["strip", "--strip-all", so], check=True)
    exe = str(tmp_path / "main")
    subprocess.run(["cc", "-O2", "-g", "-o", exe, str(tmp_path / "main.c"), "-L", str(tmp_path),
                    "-lstripped", "-Wl,-rpath," + str(tmp_path)], check=True)
    syms = {}
    for line in subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True,
                               text=True, check=True).stdout.splitlines():
        addr, _, name = line.split()
        syms[name] = int(addr, 16)
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([exe], dump, env=WHOLE)
    rep = mmleak.build_report(str(dump), progress=False, detect_wrappers=False)
    rows = {}
    for s in mmleak.site_table(rep):
        fr = rep["frames"][s.caller]
        if fr.module == "libstripped.so":
            rows[fr.function] = (s.blocks, s.bytes, fr)
    assert set(rows) == {"lib_keep", "lib_store"}, rows
    for name, (n, b, fr) in rows.items():
        assert (n, b) == {"lib_store": (2, 80), "lib_keep": (1, 24)}[name]
        assert mmleak.frame_label(fr) == "%s+0x%x at libstripped.so+0x%x" % (
            name, fr.offset - syms[name], fr.offset)        # text: offset == vaddr


@pytest.fixture
def debuginfod(tmp_path):
    """A debuginfod server on loopback serving the files of a directory (the package
    debuginfod): (directory to put debug files in, its URL).  Stopped at the end."""
    import socket
    import time
    import urllib.request
    exe = shutil.which("debuginfod")
    if not exe:
        pytest.skip("debuginfod not installed (.ci/run installs it)")
    d = tmp_path / "served"
    d.mkdir()
    with socket.socket() as s:           # a free port, for the server to take
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    def start():
        return subprocess.Popen([exe, "-F", str(d), "-p", str(port), "-d",
                                 str(tmp_path / "db.sqlite"), "-t", "1", "-g", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    holder = {}

    def serve():
        holder["p"] = start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:     # until it has scanned the one file
            try:
                m = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
                if re.search(r'found_debuginfo_total\{source="files"\} [1-9]', m):
                    return url
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("debuginfod did not index %s in 60 s" % d)
    yield d, serve
    if "p" in holder:
        holder["p"].terminate()
        holder["p"].wait(timeout=30)


def test_split_debug_from_debuginfod(stripped, debuginfod, tmp_path, monkeypatch):
    """DEBUGINFOD_URLS set: the stripped program's debug information comes from the server
    (here one on loopback), for the lines (eu-addr2line) and for the wrapper detection
    (debuginfod-find); nothing in a build-id tree or beside the binary."""
    exe, root, dump = stripped
    served, serve = debuginfod
    (dbg,) = list(root.glob(".build-id/*/*.debug"))
    shutil.copy(str(dbg), str(served / "prog.debug"))
    url = serve()
    monkeypatch.setenv("DEBUGINFOD_URLS", url)
    monkeypatch.setenv("DEBUGINFOD_CACHE_PATH", str(tmp_path / "cache"))
    got, rep = report_lines(dump)
    src = "wrap_redis.c"
    assert got[("main", src, site_line(src, "z_a"))] == (3, 300)
    assert "zmalloc" in rep["found_wrappers"]
