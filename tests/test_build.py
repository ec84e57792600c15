"""The build and `make install`: PREFIX and DESTDIR honoured, and the installed scripts find
the installed library (not the build tree's)."""
import os
import re
import subprocess

from conftest import ROOT


def test_install_honours_prefix_and_destdir(tmp_path, lib):
    """make install: the libraries in LIBDIR (PREFIX/lib/mmleak), the scripts and their
    package in SHAREDIR, the commands without .py in PREFIX/bin and PREFIX/sbin, the manual
    pages; the installed commands find the installed libraries (not the build tree's)."""
    dest = tmp_path / "stage"
    r = subprocess.run(["make", "-s", "-C", ROOT, "install", "DESTDIR=%s" % dest,
                        "PREFIX=/opt/mm"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    root = dest / "opt" / "mm"
    so = root / "lib" / "mmleak" / "mmleak.so"
    assert so.is_file() and oct(so.stat().st_mode & 0o777) == "0o644"
    tools = root / "lib" / "mmleak" / "mmleak-tools.so"
    assert tools.is_file() and oct(tools.stat().st_mode & 0o777) == "0o644"
    share = root / "share" / "mmleak"
    for s, cmd in (("mmleak.py", "bin/mmleak"), ("mmleak-panda.py", "bin/mmleak-panda"),
                   ("mmleak-install.py", "sbin/mmleak-install")):
        p = root / cmd
        assert p.is_symlink() and os.readlink(p) == "../share/mmleak/" + s, cmd
        assert p.is_file() and os.access(p, os.X_OK), cmd
        assert p.read_text().startswith("#!/usr/bin/python3\n"), cmd
        assert not (root / "bin" / s).exists(), s
    for page in ("man1/mmleak.1", "man1/mmleak-panda.1", "man8/mmleak-install.8",
                 "man5/mmleak-format.5", "man7/mmleak-env.7"):
        p = root / "share" / "man" / page
        assert p.is_file() and oct(p.stat().st_mode & 0o777) == "0o644", page
    # the installed package knows where the libraries are
    assert 'LIBDIR = "/opt/mm/lib/mmleak"\n' in (share / "mmleaklib" / "layout.py").read_text()
    # the installed mmleak uses the installed library: LIBDIR, under DESTDIR here, is not
    # where it runs from, so the copy is moved to where LIBDIR says, for the check
    env = {k: v for k, v in os.environ.items() if k != "MMLEAK_LIB"}
    code = ("import sys; sys.path.insert(0, %r); "
            "from mmleaklib.files import find_library; print(find_library())" % str(share))
    found = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                           env=env).stdout.strip()
    assert found != os.path.realpath(lib)         # not the build tree's
    out = subprocess.run([str(root / "bin" / "mmleak"), "run", "-d", str(tmp_path / "d"),
                          "--lib", str(so), "--", "/bin/true"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("mmleak: "), out.stderr      # its name, not mmleak.py's
    assert any(n.endswith(".maps") for n in os.listdir(tmp_path / "d"))
    # the module of report's exports is installed with the package, and found there
    mod = share / "mmleaklib" / "export.py"
    assert mod.is_file() and oct(mod.stat().st_mode & 0o777) == "0o644"
    out = subprocess.run([str(root / "bin" / "mmleak"), "run", "-d", str(tmp_path / "e"),
                          "--lib", str(so), "--", "/bin/ls", "/"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([str(root / "bin" / "mmleak"), "report", str(tmp_path / "e"),
                          "--no-html", "--folded", str(tmp_path / "f.folded")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "folded: %s\n" % (tmp_path / "f.folded") in out.stdout


def test_installed_copy_finds_its_library_directory(tmp_path):
    """The library directory make install writes into the installed mmleaklib/layout.py is
    where the installed commands look (after $MMLEAK_LIB and beside the package)."""
    dest = tmp_path / "stage"
    libdir = tmp_path / "lib" / "x86_64-linux-gnu" / "mmleak"
    r = subprocess.run(["make", "-s", "-C", ROOT, "install", "DESTDIR=%s" % dest,
                        "PREFIX=/usr", "LIBDIR=%s" % libdir], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    installed = dest / str(libdir).lstrip("/")
    libdir.mkdir(parents=True)
    for n in ("mmleak.so", "mmleak-tools.so"):
        os.rename(installed / n, libdir / n)
    share = dest / "usr" / "share" / "mmleak"
    env = {k: v for k, v in os.environ.items() if k != "MMLEAK_LIB"}
    code = ("import sys; sys.path.insert(0, %r); from mmleaklib import files, native; "
            "print(files.find_library()); print(native.tools_library())" % str(share))
    out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out == [str(libdir / "mmleak.so"), str(libdir / "mmleak-tools.so")]
    out = subprocess.run([str(dest / "usr" / "bin" / "mmleak"), "run", "-d",
                          str(tmp_path / "d"), "--", "/bin/true"], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert any(n.endswith(".maps") for n in os.listdir(tmp_path / "d"))


def test_library_exports_only_the_interposed_api(lib):
    syms = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True,
                          text=True, check=True).stdout.split()
    exported = {s for s in syms if not s.startswith("0") and len(s) > 1 and s not in "TWBDV"}
    for want in ("malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign",
                 "aligned_alloc", "memalign", "valloc", "pvalloc", "strdup", "strndup",
                 "_Znwm", "_ZdlPv", "_ZnamSt11align_val_tRKSt9nothrow_t",
                 "_ZdaPvmSt11align_val_t", "dlclose"):
        assert want in exported, want
    # nothing of the tracer's internals leaks into the program's namespace
    assert not any(s.startswith(("g_", "rec_", "slow_", "window_", "maps_")) for s in exported)


def dynamic_symbols(path):
    syms = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True,
                          text=True, check=True).stdout.split()
    return {s for s in syms if not s.startswith("0") and len(s) > 1 and s not in "TWBDV"}


def hooks_def():
    """{name: kind} of every HOOK(name, ret, (params), (args), KIND, ...) in tracer/hooks.def,
    the one list of the functions mmleak.so interposes."""
    with open(os.path.join(ROOT, "tracer", "hooks.def")) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    hooks = dict(re.findall(r"^HOOK\((\w+),[^(]*\([^)]*\),\s*\([^)]*\),\s*(\w+),", text,
                            re.M))
    assert len(hooks) == text.count("HOOK("), "a HOOK line this test cannot read"
    return hooks


# what mmleak.so exports besides the interposed functions: the attach entry and its state
# the attach entry points, and the program-side request of include/mmleak.h
TRACER_API = {"mmleak_attach", "mmleak_detach", "mmleak_state", "mmleak_status",
              "mmleak_do_leak_check"}
# what mmleak-tools.so exports: the compiled shrinker and the injector, for mmleaklib/native.py
# (and the dump lines' reader for tests/test_dumplines.py)
TOOLS_API = {"mmleak_shrink", "mmleak_shrink_abi", "mmleak_shrink_blocks",
             "mmleak_shrink_result_blocks", "mmleak_shrink_merge", "mmleak_shrink_blocks_merge",
             "mmleak_shrink_stats_free", "mmleak_blocks_aggregate", "mmleak_blocks_sample",
             "mmleak_blocks_free", "mmleak_aggregate_free", "mmleak_blocks_keys",
             "mmleak_blocks_leb_decode",
             "mmleak_inject_call", "mmleak_inject_call_within", "mmleak_inject_abi",
             "mmleak_scan", "mmleak_scan_abi", "mmleak_levels_pick", "mmleak_blocks_keys_minus",
             "mmleak_dump_lines"}


def test_tracer_exports_the_hooks_and_the_attach_entry_alone(lib):
    """mmleak.so exports exactly the functions tracer/hooks.def interposes (not the
    ATTACH_ONLY ones, which are only switched in the GOT of a process it was loaded into) and
    mmleak_attach/detach/state/status: nothing of the tracer's internals, no tool."""
    hooks = hooks_def()
    assert {"malloc", "free", "_Znwm", "dlclose", "execve", "setuid", "dlopen"} <= set(hooks)
    want = {n for n, kind in hooks.items() if kind != "ATTACH_ONLY"} | TRACER_API
    got = dynamic_symbols(lib)
    assert got == want, "exported but not listed: %s; listed but not exported: %s" % (
        sorted(got - want), sorted(want - got))


def test_tracer_has_no_tool_and_the_tools_library_has_them(lib):
    """mmleak.so is the tracer alone: the shrinker and the injector are in mmleak-tools.so,
    which only mmleak.py loads (beside mmleak.so), and which exports them alone."""
    tools = os.path.join(os.path.dirname(lib), "mmleak-tools.so")
    assert not [s for s in dynamic_symbols(lib) if "shrink" in s or "inject" in s]
    assert dynamic_symbols(tools) == TOOLS_API
    assert all(s.startswith(("mmleak_inject_", "mmleak_shrink", "mmleak_blocks_",
                             "mmleak_aggregate_", "mmleak_scan", "mmleak_levels_",
                             "mmleak_dump_lines")) for s in TOOLS_API)


def test_library_needs_glibc_alone_and_loads_nothing_into_a_c_program(lib, tmp_path):
    # libgcc_s (for the cleanups a C++ exception runs through mmleak's operator new) is a weak
    # reference: a C program traced gets no library of ours but mmleak.so itself
    dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True,
                         check=True).stdout
    needed = sorted(l.split("[")[1].rstrip("]") for l in dyn.splitlines() if "(NEEDED)" in l)
    assert needed == ["ld-linux-x86-64.so.2", "libc.so.6"], needed
    weak = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True,
                          text=True, check=True).stdout
    assert " w _Unwind_Resume\n" in weak and " w __gcc_personality_v0\n" in weak, weak
    src = tmp_path / "maps.c"
    src.write_text('#include <stdio.h>\n#include <stdlib.h>\n'
                   'int main(void){ free(malloc(7)); FILE *f = fopen("/proc/self/maps", "r");'
                   ' char l[512]; while (fgets(l, sizeof l, f)) fputs(l, stdout); return 0; }\n')
    exe = tmp_path / "maps"
    subprocess.run(["cc", "-O0", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, LD_PRELOAD=lib,
                                  MMLEAK_DIR=str(tmp_path))).stdout
    assert "mmleak.so" in out          # traced...
    assert "libgcc_s" not in out       # ...and nothing else was loaded for it
    assert [n for n in os.listdir(tmp_path) if n.endswith(".out")]
