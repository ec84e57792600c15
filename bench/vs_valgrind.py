#!/usr/bin/python3
"""mmleak's leak kinds against valgrind memcheck's (and LeakSanitizer's) on real programs.

    /usr/bin/python3 bench/vs_valgrind.py [--only NAME]... [--no-perturb] [--lsan]

Each program (Debian's python3, perl, git, sqlite3, gawk, sort, grep, sed, tar, xz, jq, bc,
openssl, a C++ program with iostream, exceptions and threads, cmake -P, cppcheck, doxygen,
zstd -T2, htpasswd (APR pools), ldbsearch (talloc), and the daemons redis-server and nginx,
stopped with SIGTERM once their socket exists, and one second more; then bash, grep -P
(PCRE2's JIT), tclsh, lua5.4, xmllint, make -n, openssl s_client, rsync, qemu-img,
ffprobe (libavcodec's threads, posix_memalign), a C++
program with thread_local, a detached thread and sigaltstack, and a C program under
jemalloc and tcmalloc preloaded after mmleak.so) runs, in a fresh directory of its own,
with its standard input /dev/null, under:

  vg      valgrind --leak-check=full --show-leak-kinds=all (its defaults: __libc_freeres
          and __gnu_cxx::__freeres run at exit)
  vgnf    the same with --run-libc-freeres=no: mmleak does not call __libc_freeres (see
          mmleak-scan(7)), so this is the column to compare with
  mm      mmleak.py run (the scan at exit), then mmleak.py report --no-builtin-suppressions
  mmp     the same with MALLOC_PERTURB_=165 GLIBC_TUNABLES=glibc.malloc.tcache_count=0:
          glibc overwrites freed and new blocks, so no stale pointer is left in memory a
          block was given uninitialised (memcheck knows such words are undefined and skips
          them; mmleak cannot tell), and its per-thread cache, whose blocks it would not
          overwrite, is off (mmleak-scan(7), LIMITS)
  lsan    with --lsan: LD_PRELOAD=liblsan.so.0 (LeakSanitizer preloaded into a binary built
          without it: a rough reference only)

and prints, per program and tool, blocks/bytes definitely lost, indirectly lost, possibly
lost, still reachable (LSan: blocks/bytes leaked).  A program that is not installed is
skipped.  Nothing is timed: the figures are the verdicts.  Standard library only."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchlib import MMLEAK_PY, OUT, PY, ROOT, parser

KINDS = ("definitely", "indirectly", "possibly", "still reachable")
NGINX_CONF = ("daemon off;\\nmaster_process off;\\nerror_log stderr;\\n"
              "pid nginx.pid;\\nevents { worker_connections 64; }\\nhttp { access_log off; "
              "client_body_temp_path tmp; proxy_temp_path tmp; fastcgi_temp_path tmp; "
              "uwsgi_temp_path tmp; scgi_temp_path tmp; server { listen unix:%s/ng.sock; "
              "root %s/html; } }\\n")
PROGRAMS = [
    # (name, argv, shell setup in the program's directory, the file whose making says a
    # daemon is ready (then SIGTERM), valgrind options[, environment added])
    ("python3", ["/usr/bin/python3", "-c", "import json, re\nd = {str(i): [i] * 10 for i in "
                 "range(1000)}\nprint(len(json.dumps(d)), re.sub('a+', 'b', 'caaat'))"],
     None, None, []),
    ("perl", ["perl", "-e", "my %h; $h{$_} = [($_) x 10] for 1..1000; my $s = join ',', map "
              "{ scalar @{$h{$_}} } keys %h; print length($s), qq(\\n);"], None, None, []),
    ("git init", ["git", "init", "-q", "repo"], None, None, []),
    ("git add", ["git", "-C", "repo", "add", "."],
     "git init -q repo && cd repo && for i in $(seq 50); do echo line $i > f$i.txt; done",
     None, []),
    ("git commit", ["git", "-C", "repo", "-c", "user.name=t", "-c", "user.email=t@e", "commit",
                    "-q", "-m", "m"],
     "git init -q repo && cd repo && for i in $(seq 50); do echo line $i > f$i.txt; done && "
     "git add .", None, []),
    ("sqlite3", ["sqlite3", ":memory:", "create table t(a,b); with recursive c(x) as (select 1 "
                 "union all select x+1 from c where x<2000) insert into t select x, "
                 "hex(randomblob(20)) from c; create index i on t(b); select count(*), "
                 "sum(length(b)) from t;"], None, None, []),
    ("gawk", ["gawk", "{ a[$1 % 97] += $1; s = s substr($0,1,1) } END { for (k in a) n++; "
              "print n, length(s) }", "in.txt"], "seq 1 20000 > in.txt", None, []),
    ("sort", ["sort", "-n", "in.txt", "-o", "out.txt"],
     "seq 1 20000 | shuf --random-source=/dev/zero > in.txt", None, []),
    ("grep", ["grep", "-E", "-c", "^(1|2)[0-9]*5$", "in.txt"], "seq 1 20000 > in.txt", None,
     []),
    ("sed", ["sed", "-E", "-n", "s/^([0-9])([0-9]*)$/\\2\\1/p", "in.txt"],
     "seq 1 20000 > in.txt", None, []),
    ("tar -cJ", ["tar", "-cJf", "o.tar.xz", "d"],
     "mkdir d && seq 1 20000 > d/a && seq 5 30000 > d/b", None, []),
    ("xz", ["xz", "-k", "-6", "in.txt"], "seq 1 50000 > in.txt", None, []),
    ("jq", ["jq", "-s", "map(select(.k % 3 == 0)) | length", "in.json"],
     "seq 1 2000 | sed 's/.*/{\"k\":&,\"v\":\"x&\"}/' > in.json", None, []),
    ("bc", ["bc", "-l", "-q", "in.bc"], "printf 'scale=300\\n4*a(1)\\nquit\\n' > in.bc", None,
     []),
    ("openssl dgst", ["openssl", "dgst", "-sha256", "in.txt"], "seq 1 20000 > in.txt", None,
     []),
    ("openssl genpkey", ["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                        "rsa_keygen_bits:1024", "-out", "k.pem"], None, None, []),
    ("C++ threads", [os.path.join(OUT, "vs_valgrind_cxx")], None, None, []),
    ("cmake -P", ["cmake", "-P", "s.cmake"],
     "printf 'set(L)\\nforeach(i RANGE 1 3000)\\n  string(SHA256 h \"x${i}\")\\n  list(APPEND L "
     "${h})\\nendforeach()\\nlist(SORT L)\\nlist(LENGTH L n)\\nmessage(\"${n}\")\\n' > s.cmake",
     None, []),
    ("cppcheck", ["cppcheck", "--enable=all", "--inconclusive", "-q", "a.c"],
     "printf '#include <stdlib.h>\\nint f(int n){char *p=malloc(n); if(n>3) return 1; free(p); "
     "return n;}\\nint main(void){return f(2);}\\n' > a.c", None, []),
    # one thread: with two, doxygen's own lost strings change from run to run
    ("doxygen", ["doxygen", "Doxyfile"],
     "cp %s/tracer/*.h . && doxygen -g Doxyfile >/dev/null && printf 'GENERATE_LATEX=NO\\n"
     "QUIET=YES\\nEXTRACT_ALL=YES\\nHAVE_DOT=NO\\nNUM_PROC_THREADS=1\\n' >> Doxyfile" % ROOT,
     None, []),
    ("zstd -T2", ["zstd", "-q", "-T2", "-3", "in.txt"], "seq 1 1500000 > in.txt", None, []),
    ("htpasswd", ["htpasswd", "-c", "-b", "-B", "-C", "5", "pw", "u", "secret"], None, None, []),
    ("ldbsearch", ["ldbsearch", "-H", "t.ldb", "(cn=u1*)", "cn"],
     "for i in $(seq 200); do printf 'dn: cn=u%d,dc=x\\ncn: u%d\\n\\n' $i $i; done > in.ldif && "
     "ldbadd -H t.ldb in.ldif >/dev/null", None, []),
    ("redis-server", ["redis-server", "--port", "0", "--save", "", "--appendonly", "no",
                      "--unixsocket", "r.sock", "--daemonize", "no"], None, "r.sock",
     ["--soname-synonyms=somalloc=*jemalloc*"]),     # Debian's redis uses jemalloc
    ("nginx", ["nginx", "-p", ".", "-c", "ng.conf"],
     "mkdir -p logs html && echo hi > html/index.html && printf '%s' \"$PWD\" \"$PWD\" > "
     "ng.conf" % NGINX_CONF, "ng.sock", []),
    # (bash: its exit() in the end; no command substitution, whose child would be another
    # trace)
    ("bash", ["bash", "-c", "declare -A a; f() { local x=$1; printf -v r '%s' \"${x//1/one}\"; "
              "}; for i in {1..2000}; do a[k$i]=$((i * i)); f $i; s+=${r:0:1}; done; "
              "echo ${#a[@]} ${#s}"], None, None, []),
    ("grep -P", ["grep", "-P", "-c", "^(\\d)\\d*\\1$", "in.txt"], "seq 1 20000 > in.txt",
     None, []),
    ("tclsh", ["tclsh", "s.tcl"],
     "printf 'set d [dict create]\\nfor {set i 0} {$i < 3000} {incr i} { dict set d k$i "
     "[string repeat x [expr {$i %% 50}]] }\\nset l [lsort [dict keys $d]]\\nputs "
     "[llength $l]\\n' > s.tcl", None, []),
    ("lua", ["lua5.4", "-e", "local t = {} for i = 1, 20000 do t[i] = string.rep('x', i % "
             "64) .. i end table.sort(t) local m = {} for _, v in ipairs(t) do m[v] = #v end "
             "print(#t) collectgarbage()"], None, None, []),
    ("xmllint", ["xmllint", "--xpath", "count(//e[@k mod 3 = 0])", "in.xml"],
     "(echo '<r>'; seq 1 3000 | sed 's/.*/<e k=\"&\">v&<\\/e>/'; echo '</r>') > in.xml",
     None, []),
    ("make -n", ["make", "-n", "-j1"],
     "printf 'OBJS := $(patsubst %%,o%%.o,$(shell seq 1 300))\\nall: $(OBJS)\\n"
     "o%%.o: s%%.c\\n\\tcc -c $< -o $@\\ns%%.c:\\n\\techo > $@\\n' > Makefile", None, []),
    ("openssl s_client", ["openssl", "s_client", "-connect", "127.0.0.1:1"], None, None, []),
    ("rsync", ["rsync", "-a", "src/", "dst/"],
     "mkdir src && for i in $(seq 100); do seq $i 2000 > src/f$i; done", None,
     []),
    ("qemu-img", ["qemu-img", "info", "d.qcow2"], "qemu-img create -q -f qcow2 d.qcow2 64M",
     None, []),
    ("ffprobe", ["ffprobe", "-v", "error", "-count_frames", "-show_streams", "t.mp4"],
     "ffmpeg -v error -f lavfi -i testsrc=duration=2:size=320x240:rate=25 -c:v mpeg4 t.mp4",
     None, []),
    ("C++ thread_local", [os.path.join(OUT, "vs_valgrind_tls")], None, None, []),
    ("jemalloc", [os.path.join(OUT, "vs_valgrind_alloc")], None, None,
     ["--soname-synonyms=somalloc=*jemalloc*"], {"LD_PRELOAD": "libjemalloc.so.2"}),
    ("tcmalloc", [os.path.join(OUT, "vs_valgrind_alloc")], None, None,
     ["--soname-synonyms=somalloc=*tcmalloc*"], {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}),
]


def run(argv, env, cwd, ready, child):
    """Run ARGV; with READY, a daemon: once the file READY exists in CWD (and one second
    more), send SIGTERM to it, or (CHILD) to its first child (the program under mmleak.py
    run).  The CompletedProcess."""
    if ready is None:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=900, stdin=subprocess.DEVNULL)
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    until = time.monotonic() + 120
    while not os.path.exists(os.path.join(cwd, ready)) and time.monotonic() < until:
        time.sleep(0.1)
    time.sleep(1)
    pid = p.pid
    if child:
        with open("/proc/%d/task/%d/children" % (p.pid, p.pid)) as f:
            pid = int(f.read().split()[0])
    os.kill(pid, signal.SIGTERM)
    out, err = p.communicate(timeout=900)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def number(s):
    return int(s.replace(",", ""))


class CannotRun(Exception):
    """The tool could not run the program to its end (a row of its own says why)."""


def valgrind(argv, env, cwd, ready, opts, freeres):
    r = run(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
             "--errors-for-leak-kinds=none"] + opts +
            ([] if freeres else ["--run-libc-freeres=no"]) + argv, env, cwd, ready, False)
    # an instruction its JIT does not know (valgrind 3.19: rdtscp, which some library of
    # ffprobe's runs) kills the program with SIGILL: its summary is that of a crash
    m = re.search(r"^==\d+== valgrind: Unrecognised instruction.*$", r.stderr, re.M)
    if m:
        bad = re.search(r"unhandled instruction bytes: ((?:0x[0-9A-F]+ ?){1,4})", r.stderr)
        raise CannotRun("valgrind: unrecognised instruction%s" % (
            " " + bad.group(1).strip() if bad else ""))
    # the command's own process: the first to write (a forked child, which valgrind follows
    # without --trace-children, writes its own summary, often before its parent's)
    pid = re.search(r"^==(\d+)==", r.stderr, re.M)
    pid = pid.group(1) if pid else r"\d+"
    got = {}
    for k in KINDS:
        m = re.search(r"==%s==\s+%s(?: lost)?: ([\d,]+) bytes in ([\d,]+) blocks" % (pid, k),
                      r.stderr)
        got[k] = (number(m.group(2)), number(m.group(1))) if m else (0, 0)
    if "LEAK SUMMARY" not in r.stderr and "no leaks are possible" not in r.stderr:
        raise RuntimeError("valgrind gave no leak summary: %s" % r.stderr[-500:])
    return got


def mmleak(argv, env, cwd, ready):
    d = os.path.join(cwd, ".mmleak")
    os.mkdir(d)
    r = run([PY, MMLEAK_PY, "run", "-d", d, "--"] + argv, env, cwd, ready, True)
    nxt = [l for l in r.stderr.splitlines() if " next: " in l]
    if not nxt:
        raise RuntimeError("mmleak.py run: %s" % r.stderr[-500:])
    nxt = nxt[-1].split()
    r = subprocess.run([PY, MMLEAK_PY, "report", d, "--no-html", "--no-builtin-suppressions",
                        nxt[-2], nxt[-1]], env=env, capture_output=True, text=True,
                       timeout=900)
    got = {}
    for k in KINDS:
        m = re.search(r"^    %s(?: lost)?: +(\d+) bytes.* in (\d+) blocks$" % k, r.stdout, re.M)
        if not m:
            raise RuntimeError("mmleak.py report: %s" % (r.stdout + r.stderr)[-500:])
        got[k] = (int(m.group(2)), int(m.group(1)))
    return got


def lsan(argv, env, cwd, ready):
    # first: the program's own preload (an allocator) after it, as for mmleak.so
    e = dict(env, LD_PRELOAD=" ".join(["liblsan.so.0"] + env.get("LD_PRELOAD", "").split()),
             LSAN_OPTIONS="exitcode=0")
    r = run(argv, e, cwd, ready, False)
    m = re.search(r"SUMMARY: LeakSanitizer: (\d+) byte\(s\) leaked in (\d+) allocation",
                  r.stderr)
    return (int(m.group(2)), int(m.group(1))) if m else (0, 0)


def main():
    ap = parser(__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="only this program (repeatable): %s" % ", ".join(
                        n for n, *_ in PROGRAMS))
    ap.add_argument("--no-perturb", action="store_true", help="no mmp column")
    ap.add_argument("--lsan", action="store_true", help="an lsan column (liblsan.so.0)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    a = ap.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("vs_valgrind.py: valgrind is not installed")
    os.makedirs(OUT, exist_ok=True)
    for exe, src in (("vs_valgrind_cxx", "vs_valgrind_cxx.cpp"),
                     ("vs_valgrind_tls", "vs_valgrind_tls.cpp"),
                     ("vs_valgrind_alloc", "vs_valgrind_alloc.c")):
        subprocess.run(["c++" if src.endswith(".cpp") else "cc", "-O1", "-g", "-pthread", "-o",
                        os.path.join(OUT, exe), os.path.join(ROOT, "bench", src)], check=True)
    tools = ["vg", "vgnf", "mm"] + ([] if a.no_perturb else ["mmp"]) + (["lsan"] if a.lsan
                                                                        else [])
    print("%-16s %-5s %14s %14s %14s %18s" % ("program", "tool", "definite", "indirect",
                                              "possible", "reachable"))
    results = {}
    for name, argv, setup, ready, vgopts, *more in PROGRAMS:
        if a.only and name not in a.only:
            continue
        added = more[0] if more else {}
        pre = [p for p in added.get("LD_PRELOAD", "").split() if not os.path.isabs(p)]
        missing = [argv[0]] if not shutil.which(argv[0]) else [
            p for p in pre if not os.path.exists(os.path.join("/usr/lib/x86_64-linux-gnu", p))]
        if missing:
            print("%-16s (not installed: %s)" % (name, missing[0]))
            continue
        results[name] = {}
        for tool in tools:
            with tempfile.TemporaryDirectory(prefix="vs-valgrind-") as cwd:
                env = dict(os.environ, LC_ALL="C", HOME=cwd, PYTHONMALLOC="malloc")
                env.pop("MMLEAK_SUPPRESSIONS", None)
                env.pop("LD_PRELOAD", None)
                env.update(added)
                if tool == "mmp":
                    env["MALLOC_PERTURB_"] = "165"
                    env["GLIBC_TUNABLES"] = ":".join(
                        [t for t in [env.get("GLIBC_TUNABLES")] if t] +
                        ["glibc.malloc.tcache_count=0"])
                if setup:
                    subprocess.run(setup, shell=True, cwd=cwd, env=env, check=True,
                                   capture_output=True)
                if tool in ("vg", "vgnf"):
                    try:
                        got = valgrind(argv, env, cwd, ready, vgopts, tool == "vg")
                    except CannotRun as e:
                        print("%-16s %-5s (%s)" % (name, tool, e), flush=True)
                        results[name][tool] = str(e)
                        continue
                elif tool in ("mm", "mmp"):
                    got = mmleak(argv, env, cwd, ready)
                else:
                    n, b = lsan(argv, env, cwd, ready)
                    print("%-16s %-5s %14s" % (name, tool, "%d/%d" % (n, b)), flush=True)
                    results[name][tool] = [n, b]
                    continue
            results[name][tool] = got
            print("%-16s %-5s %14s %14s %14s %18s" % ((name, tool) + tuple(
                "%d/%d" % got[k] for k in KINDS)), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
