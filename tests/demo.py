#!/usr/bin/python3
"""make demo: trace a bundled leaky C++ program and write its HTML leak report.

Steps: check the tools (installing them with apt-get when run as root), build mmleak.so,
compile tests/demo_leaky.cpp into demo/bin, run it under the tracer (mmleak.py run), then
mmleak.py report -> demo/report.html.  Everything it writes is under demo/ (git-ignored).
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEMO = os.path.join(REPO, "demo")
PY = sys.executable or "/usr/bin/python3"
APT = {"pandas": "python3-pandas", "matplotlib": "python3-matplotlib",
       "g++": "g++", "eu-addr2line": "elfutils", "make": "make"}


def say(msg):
    print("demo: " + msg, flush=True)


def missing_tools():
    miss = []
    for mod in ("pandas", "matplotlib"):
        r = subprocess.run([PY, "-c", "import " + mod], capture_output=True)
        if r.returncode:
            miss.append(mod)
    for tool in ("g++", "eu-addr2line", "make"):
        if not shutil.which(tool):
            miss.append(tool)
    return miss


def ensure_tools():
    miss = missing_tools()
    if not miss:
        return
    pkgs = sorted({APT[m] for m in miss})
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say("installing " + " ".join(pkgs))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False)
        r = subprocess.run(["apt-get", "install", "-y", "-q"] + pkgs, env=env)
        if r.returncode == 0 and not missing_tools():
            return
    sys.exit("demo: missing %s; install them first, e.g.\n  sudo apt-get install %s"
             % (", ".join(miss), " ".join(pkgs)))


def main():
    ensure_tools()
    if subprocess.run(["make", "-s", "-C", REPO, "mmleak.so", "mmleak-tools.so"]).returncode:
        sys.exit("demo: building mmleak.so failed")
    bindir = os.path.join(DEMO, "bin")
    dumps = os.path.join(DEMO, "dumps")
    os.makedirs(bindir, exist_ok=True)
    shutil.rmtree(dumps, ignore_errors=True)
    exe = os.path.join(bindir, "demo_leaky")
    src = os.path.join(HERE, "demo_leaky.cpp")
    say("compiling %s" % os.path.relpath(src, REPO))
    if subprocess.run(["g++", "-O0", "-g", "-pthread", "-o", exe, src]).returncode:
        sys.exit("demo: compiling %s failed" % src)
    rel = os.path.relpath
    say("running it under the tracer: mmleak.py run -d %s -- %s 3"
        % (rel(dumps, REPO), rel(exe, REPO)))
    mmleak_py = os.path.join(REPO, "mmleak.py")
    r = subprocess.run([PY, mmleak_py, "run", "-d", dumps, "--", exe, "3"],
                       cwd=REPO)
    if r.returncode:
        sys.exit("demo: the traced program failed (exit status %d)" % r.returncode)
    sys.path.insert(0, REPO)
    from mmleaklib.files import find_traces
    traces = find_traces(dumps)
    if len(traces) != 1:
        sys.exit("demo: expected one trace in %s, found %d" % (dumps, len(traces)))
    pid = next(iter(traces))
    out = os.path.join(DEMO, "report.html")
    say("mmleak.py report %s --pid %s -o %s" % (rel(dumps, REPO), pid, rel(out, REPO)))
    r = subprocess.run([PY, mmleak_py, "report", dumps, "--pid", pid, "-o", out], cwd=REPO)
    if r.returncode or not os.path.exists(out):
        sys.exit("demo: mmleak.py report failed (exit status %d)" % r.returncode)
    say("expected leaks (see tests/demo_leaky.cpp): load_config 4096 B; Worker::handle "
        "120 x 48 B; intern_name via xmalloc 30 x 24 B; grow_log 1 x 1920 B (realloc chain); "
        "Pool<Item<int> >::make 30 x 64 B; with the reachability scan at exit they are "
        "definitely lost (a few blocks whose stale pointers stay on a stack or in a register "
        "may show still reachable, as in valgrind), and the C/C++ runtime's own blocks "
        "(stdout's buffer) still reachable, not shown unless --show-reachable")
    say("open the report: file://%s" % out)


if __name__ == "__main__":
    main()
