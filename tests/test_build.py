"""The build and `make install`: PREFIX and DESTDIR honoured, and the installed scripts find
the installed library (not the build tree's)."""
import os
import subprocess

from conftest import ROOT


def test_install_honours_prefix_and_destdir(tmp_path, lib):
    dest = tmp_path / "stage"
    r = subprocess.run(["make", "-s", "-C", ROOT, "install", "DESTDIR=%s" % dest,
                        "PREFIX=/opt/mm"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    root = dest / "opt" / "mm"
    so = root / "lib" / "mmleak" / "mmleak.so"
    assert so.is_file() and oct(so.stat().st_mode & 0o777) == "0o644"
    tools = root / "lib" / "mmleak" / "mmleak-tools.so"
    assert tools.is_file() and oct(tools.stat().st_mode & 0o777) == "0o644"
    for s in ("mmleak.py", "mmleak-panda.py", "mmleak-install.py"):
        p = root / "bin" / s
        assert p.is_file() and os.access(p, os.X_OK), s
        assert p.read_text().startswith("#!/usr/bin/python3\n"), s
    # the installed mmleak.py uses the installed library, found relative to itself
    env = {k: v for k, v in os.environ.items() if k != "MMLEAK_LIB"}
    out = subprocess.run([str(root / "bin" / "mmleak.py"), "run", "-d", str(tmp_path / "d"),
                          "--", "/bin/true"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    code = ("import os, sys; sys.path.insert(0, os.path.dirname(os.path.realpath(%r))); "
            "from mmleaklib.files import find_library; print(find_library())"
            % str(root / "bin" / "mmleak.py"))
    found = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                           env=env).stdout.strip()
    assert found == str(so)
    assert any(n.endswith(".maps") for n in os.listdir(tmp_path / "d"))
    # the module of report's exports is installed with the package, and found there
    mod = root / "lib" / "mmleak" / "mmleaklib" / "export.py"
    assert mod.is_file() and oct(mod.stat().st_mode & 0o777) == "0o644"
    out = subprocess.run([str(root / "bin" / "mmleak.py"), "run", "-d", str(tmp_path / "e"),
                          "--", "/bin/ls", "/"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([str(root / "bin" / "mmleak.py"), "report", str(tmp_path / "e"),
                          "--no-html", "--folded", str(tmp_path / "f.folded")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "folded: %s\n" % (tmp_path / "f.folded") in out.stdout


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


def test_tracer_has_no_tool_and_the_tools_library_has_them(lib):
    """mmleak.so is the tracer alone: the shrinker and the injector are in mmleak-tools.so,
    which only mmleak.py loads (beside mmleak.so)."""
    tools = os.path.join(os.path.dirname(lib), "mmleak-tools.so")
    assert not [s for s in dynamic_symbols(lib) if "shrink" in s or "inject" in s]
    assert dynamic_symbols(tools) == {"mmleak_shrink", "mmleak_shrink_abi",
                                      "mmleak_inject_call", "mmleak_inject_call_within",
                                      "mmleak_inject_abi", "mmleak_scan", "mmleak_scan_abi"}


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
