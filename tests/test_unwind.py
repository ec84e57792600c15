"""tracer/unwind.c, the stack unwinder of mmleak.so, tested without mmleak: test programs link
it directly and compare its frames, at many call sites, with glibc's backtrace() at the same
point (tests/unwind_check.c, tests/unwind_cxx.cpp), in several builds (PIE or not, -O0/-O2,
with and without frame pointers), through signal handlers, threads, fork, dlopen/dlclose; and
run it on hostile stacks (no CFI, tiny stacks, coroutines, alternate signal stacks, near the
guard page, nonsense start states) where the exact result is asserted."""
import concurrent.futures
import os
import re
import resource
import subprocess

import pytest

from conftest import ROOT, TESTS

# tracer/unwind.c as mmleak.so compiles it (the Makefile's CFLAGS_LIB), plus its test counters
UNWIND_CFLAGS = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden",
                 "-fexceptions", "-fno-omit-frame-pointer", "-O2", "-g", "-DMML_UNWIND_TESTING"]
NOPIE = ["-fno-pie", "-no-pie"]
C_VARIANTS = {
    "pie-O0": ["-O0"],
    "pie-O2": ["-O2", "-fomit-frame-pointer"],
    "pie-O2-fp": ["-O2", "-fno-omit-frame-pointer"],
    "nopie-O0": ["-O0"] + NOPIE,
    "nopie-O2": ["-O2", "-fomit-frame-pointer"] + NOPIE,
    "nopie-O2-fp": ["-O2", "-fno-omit-frame-pointer"] + NOPIE,
}
CXX_VARIANTS = {"cxx-O0": ["-O0"], "cxx-O2": ["-O2", "-fomit-frame-pointer"]}
ALL_C = sorted(C_VARIANTS)
TAIL = ["main", "?", "__libc_start_main", "_start"]  # "?": __libc_start_call_main (local)


def cc(argv):
    r = subprocess.run(argv, capture_output=True, text=True)
    assert r.returncode == 0, "%s:\n%s" % (" ".join(argv), r.stderr)


@pytest.fixture(scope="session")
def ubins(tmp_path_factory):
    """Every test program, built in parallel (2 jobs)."""
    d = tmp_path_factory.mktemp("unwind")
    obj = str(d / "mmleak-unwind.o")
    cc(["cc"] + UNWIND_CFLAGS + ["-c", "-o", obj, os.path.join(ROOT, "tracer", "unwind.c")])
    jobs, out = [], {}

    def c_variant(name, flags):
        nt = str(d / ("notables-%s.o" % name))
        cc(["cc", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"] + flags +
           ["-c", "-o", nt, os.path.join(TESTS, "unwind_notables.c")])
        exe = str(d / ("unwind_check-%s" % name))
        cc(["cc", "-g", "-rdynamic", "-pthread", "-DMML_UNWIND_TESTING"] + flags +
           ["-o", exe, os.path.join(TESTS, "unwind_check.c"), nt, obj, "-ldl"])
        return exe

    def cxx_variant(name, flags):
        exe = str(d / ("unwind_%s" % name))
        cc(["c++", "-g", "-std=c++17", "-rdynamic"] + flags +
           ["-o", exe, os.path.join(TESTS, "unwind_cxx.cpp"), obj, "-ldl"])
        return exe

    def lib(name, frame):
        so = str(d / name)
        cc(["cc", "-O2", "-g", "-fPIC", "-shared", "-DFRAME=%d" % frame, "-o", so,
            os.path.join(TESTS, "unwind_lib.c")])
        return so

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        for name, flags in C_VARIANTS.items():
            jobs.append((name, ex.submit(c_variant, name, flags)))
        for name, flags in CXX_VARIANTS.items():
            jobs.append((name, ex.submit(cxx_variant, name, flags)))
        jobs.append(("lib_a", ex.submit(lib, "libunwind_lib_a.so", 200)))
        jobs.append(("lib_b", ex.submit(lib, "libunwind_lib_b.so", 1000)))
        for name, fut in jobs:
            out[name] = fut.result()
    out["dir"] = str(d)
    return out


class Site:
    def __init__(self, line):
        m = re.match(r"site (\S+) n=(\d+) match=([01]) frames=(\S*) addrs=(\S*)( bt=\S*)?$", line)
        assert m, line
        self.name, self.n, self.match = m.group(1), int(m.group(2)), m.group(3) == "1"
        self.frames = m.group(4).split(",") if m.group(4) else []
        self.addrs = [int(x, 16) for x in m.group(5).split(",")] if m.group(5) else []
        self.line = line
        assert len(self.frames) == self.n == len(self.addrs), line

    def __repr__(self):
        return self.line


class Run:
    def __init__(self, exe, mode, *args, timeout=60):
        r = subprocess.run([exe, mode] + list(args), capture_output=True, text=True,
                           timeout=timeout)
        self.out = r.stdout
        assert r.returncode == 0, "%s %s: exit %d\n%s\n%s" % (
            exe, mode, r.returncode, r.stdout[-3000:], r.stderr[-2000:])
        self.lines = r.stdout.splitlines()
        assert self.lines and self.lines[-1] == "end " + mode, r.stdout[-3000:]
        self.sites = [Site(l) for l in self.lines if l.startswith("site ")]
        # mml_unwind_from_ra() (as mmleak.so calls it) gave another list than mml_unwind()
        assert not [l for l in self.lines if l.startswith("fromra=")], r.stdout[-3000:]
        self.kinds = {}
        self.info = {}
        for l in self.lines:
            if l.startswith("kinds "):
                self.kinds = {k: int(v) for k, v in (x.split("=") for x in l.split()[1:])}
            elif l.startswith("info "):
                for w in l.split()[1:]:
                    k, _, v = w.partition("=")
                    self.info.setdefault(k, []).append(v)
        self.restorer = int(self.info["restorer"][0], 16)

    def named(self, name):
        return [s for s in self.sites if s.name == name]


def all_match(sites):
    assert sites
    bad = [s for s in sites if not s.match]
    assert not bad, "frames differ from backtrace():\n" + "\n".join(map(str, bad))


CHAIN_SITES = ["small0", "small5", "big", "huge", "vla", "realign", "stackargs", "regs", "regs",
               "varargs", "ptr", "qsort"]
CHAIN_HEADS = {
    "small0": ["leaf", "f_small", "run_chains"],
    "small5": ["leaf"] + ["f_small"] * 6 + ["run_chains"],
    "big": ["leaf", "f_big", "run_chains"],
    "huge": ["leaf", "f_huge", "run_chains"],
    "vla": ["leaf", "f_vla", "run_chains"],
    "realign": ["leaf", "f_realign", "run_chains"],
    "stackargs": ["leaf", "many_args", "f_stackargs", "run_chains"],
    "regs": ["leaf", "f_regs", "run_chains"],
    "varargs": ["leaf", "f_varargs", "run_chains"],
    "ptr": ["leaf", "f_ptr", "run_chains"],
}


@pytest.mark.parametrize("variant", ALL_C)
def test_call_chains_equal_backtrace(ubins, variant):
    """Every kind of frame (rsp- and rbp-based CFA, stack realignment, a frame larger than a
    cache entry can describe, arguments on the stack, glibc's qsort calling back), first with
    the rules computed, then from the cache."""
    r = Run(ubins[variant], "chains")
    assert [s.name for s in r.sites] == CHAIN_SITES * 2
    all_match(r.sites)
    for s in r.sites:
        if s.name == "qsort":  # the comparator (static: "?") under glibc's sort functions
            assert s.frames[0] == "?" and s.frames[-7:] == ["qsort_r", "f_qsort", "run_chains"] + TAIL, s
        else:
            assert s.frames == CHAIN_HEADS[s.name] + TAIL, s
    k = r.kinds
    assert k["rsp"] > 0 and k["rbp"] > 0 and k["stop"] >= 1, k  # stop: _start
    if "fomit-frame-pointer" in C_VARIANTS[variant]:
        assert k["uncached"] >= 1, k  # f_huge: CFA = rsp + 300000 does not fit in an entry
    assert k["drap"] >= 1 and k["bderef"] >= 1, k  # f_realign: CFA = *(rbp - 8)


@pytest.mark.parametrize("variant", ALL_C)
def test_signal_handler_walks_into_the_interrupted_code(ubins, variant):
    """A handler of raise() in a chain: through glibc's __restore_rt, on into the code that
    raise()d, exactly as backtrace()."""
    r = Run(ubins[variant], "signal")
    assert [s.name for s in r.sites] == ["signal", "signal"]
    all_match(r.sites)
    for s in r.sites:
        i = s.addrs.index(r.restorer)
        assert s.frames[0] == "leaf" and set(s.frames[1:i]) <= {"on_usr1"}, s
        assert "gsignal" in s.frames[i + 1:], s
        assert s.frames[-8:] == ["raise_in_chain"] * 4 + TAIL, s
    assert r.kinds["signal"] == 1, r.kinds  # __restore_rt's rule, computed once


@pytest.mark.parametrize("variant", ["pie-O0", "pie-O2", "nopie-O2-fp"])
def test_asynchronous_signals_at_any_instruction(ubins, variant):
    """1000 signals from another thread interrupt a loop of small calls and of glibc functions
    (memcpy, strlen, malloc, snprintf, free, clock_gettime in the vDSO) at any instruction,
    prologues and epilogues included: the frame after the signal frame is looked up at the
    exact pc."""
    r = Run(ubins[variant], "async", "1000")
    assert len(r.sites) == 1000
    all_match(r.sites)
    for s in r.sites:
        assert s.frames[0] == "on_usr2_async" and s.addrs[1] == r.restorer, s
        assert s.frames[-5:] == ["spin"] + TAIL, s


@pytest.mark.parametrize("variant", ["pie-O0", "pie-O2"])
def test_threads_share_the_cache(ubins, variant):
    """4 threads walk the same chains 40 times each while another thread empties the cache
    all the time (as dlclose does): every walk equals backtrace()."""
    r = Run(ubins[variant], "threads")
    assert "threads captures=1920 mismatches=0" in r.lines


@pytest.mark.parametrize("variant", ["pie-O2", "nopie-O0"])
def test_fork_child(ubins, variant):
    r = Run(ubins[variant], "fork")
    assert [s.name for s in r.sites] == CHAIN_SITES + ["child-small", "child-vla", "child-realign"]
    all_match(r.sites)
    assert r.info["status"] == ["0"]  # "info child status=0"
    assert r.named("child-small")[0].frames == ["leaf"] + ["f_small"] * 3 + ["mode_fork"] + TAIL \
        or r.named("child-small")[0].frames == ["leaf"] + ["f_small"] * 3 + TAIL


@pytest.mark.parametrize("variant", ALL_C)
def test_plt_entries(ubins, variant):
    """An exact pc at every offset of PLT0, of two PLT entries and of a .plt.got entry (where a
    signal can interrupt them): the CFA is the PLT's DWARF expression evaluated at that pc
    (rsp + 8, or + 16 once the entry has pushed its index), so the walk goes on exactly as
    backtrace() from the fake frame's caller."""
    r = Run(ubins[variant], "plt")
    if "plt:" in r.info:
        pytest.skip("no classic lazy PLT in this build: %s" % r.info["plt:"])
    expected = 16 * 3 + (8 if "plt.got" in r.info else 0)
    assert len(r.sites) == expected
    all_match(r.sites)
    assert r.kinds["uncached"] >= 32, r.kinds  # rip-dependent rules are not cached


@pytest.mark.parametrize("variant", ALL_C)
def test_real_plt_frame_after_a_signal(ubins, variant):
    """With the GOT's pages unreadable, a call through the PLT faults on the entry's first
    instruction; the SIGSEGV handler walks through the signal frame into the PLT entry and on
    into its caller, as backtrace()."""
    r = Run(ubins[variant], "pltreal")
    if "plt:" in r.info:
        pytest.skip("no .plt/.got.plt in this build")
    s, = r.sites
    all_match([s])
    assert r.info["fault_in_got"] == ["1"]
    i = s.addrs.index(r.restorer)
    lo, hi = int(r.info["plt_lo"][0], 16), int(r.info["plt_hi"][0], 16)
    assert lo <= s.addrs[i + 1] < hi and (s.addrs[i + 1] - lo) % 16 == 0, s  # an entry's start
    assert s.frames[i + 2] == "plt_fault" and s.frames[-4:] == TAIL, s


@pytest.mark.parametrize("variant", ALL_C)
def test_stops_at_a_frame_without_cfi(ubins, variant):
    """Hand-written asm without CFI (rbp = 0x5a5a...) and a C function compiled without unwind
    tables: the walk ends with the return address into that frame, as backtrace()."""
    r = Run(ubins[variant], "nocfi")
    all_match(r.sites)
    assert [(s.name, s.frames) for s in r.sites] == [
        ("nocfi", ["leaf", "nocfi_cb", "nocfi_call"]),
        ("notables", ["leaf", "notables_cb", "notables_call"])]
    lo, hi = int(r.info["nocfi_call"][0], 16), int(r.info["nocfi_call_end"][0], 16)
    assert lo < r.sites[0].addrs[2] <= hi


@pytest.mark.parametrize("variant", ["pie-O2", "nopie-O0"])
def test_dlclose_then_another_library_at_the_same_address(ubins, variant):
    """lib a and lib b have return addresses at the same offsets with different frames and are
    loaded in turn at the same address: with the dlclose calls mmleak makes, no stale rule;
    without them (the control), the walk in b goes wrong, so the test can tell."""
    r = Run(ubins[variant], "dl", ubins["dir"])
    assert [s.name for s in r.sites] == ["dl-a0", "dl-b1", "dl-a2", "dl-b3"]
    all_match(r.sites)
    for s in r.sites:
        assert s.frames[1:3] == ["lib_inner", "lib_entry"], s
    bases, raoffs = set(r.info["base"]), set(r.info["raoff"])
    if len(bases) != 1 or len(raoffs) != 1:
        pytest.skip("the two libraries were not loaded at the same address (%s)" % r.info)
    c = Run(ubins[variant], "dl-noinval", ubins["dir"])
    assert [(s.name, s.match) for s in c.sites] == [
        ("dl-a0", True), ("dl-b1", False), ("dl-a2", True), ("dl-b3", False)]


@pytest.mark.parametrize("variant", ALL_C)
def test_tiny_thread_stack_near_its_guard_page(ubins, variant):
    """A PTHREAD_STACK_MIN thread recurses until about 1.5 KiB are left above its guard page;
    its first walk (bounds learnt, rules computed) happens there."""
    r = Run(ubins[variant], "tiny")
    bottom, = r.named("tiny-bottom")
    assert bottom.frames == ["deep"] * 32
    assert len(set(bottom.addrs[1:])) == 1  # the recursive call site
    assert 0 < int(r.info["left"][0]) <= 1536
    shallow, = r.named("tiny-shallow")
    assert shallow.match and shallow.frames[:3] == ["leaf", "f_small", "f_small"], shallow
    assert shallow.frames[3] == "tiny_thread" and shallow.n == 6, shallow  # + start_thread, clone3


@pytest.mark.parametrize("variant", ["pie-O0", "pie-O2", "nopie-O2-fp"])
def test_deep_recursion(ubins, variant):
    """The initial thread down to 256 KiB above its stack limit (the stack grows far below
    where the walk first learnt its bounds), and a thread 4 KiB above its guard page."""
    r = Run(ubins[variant], "deep")
    main_, = r.named("deep-main")
    thread, = r.named("deep-thread")
    assert main_.frames == ["deep"] * 32 and thread.frames == ["deep"] * 32
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    if soft != resource.RLIM_INFINITY and soft >= 8 << 20:
        assert int(r.info["depth"][0]) >= min(soft, 64 << 20) - (512 << 10)
    assert 0 < int(r.info["left"][0]) <= 4096 + 256


@pytest.mark.parametrize("variant", ALL_C)
def test_makecontext_coroutines(ubins, variant):
    """Coroutines on a malloc'd stack and on an mmap'd one with a guard page: pages probed as
    the walk needs them, which ends at __start_context (return address undefined)."""
    r = Run(ubins[variant], "ucontext")
    assert [s.name for s in r.sites] == ["uc-1", "uc-2"] * 2
    all_match(r.sites)
    for s in r.named("uc-1"):
        assert s.frames == ["leaf", "f_small", "f_small", "f_small", "coroutine", "?"], s
    for s in r.named("uc-2"):  # coroutine may tail-call f_small
        assert s.frames in (["leaf", "f_small", "coroutine", "?"], ["leaf", "f_small", "?"]), s
    ends = {s.addrs[-1] for s in r.sites}
    assert len(ends) == 1  # __start_context


@pytest.mark.parametrize("variant", ALL_C)
def test_sigaltstack_handlers(ubins, variant):
    """Handlers on an alternate signal stack: in a thread whose first walk is on it, and in
    the initial thread; the walk crosses from the alternate stack back to the thread's."""
    r = Run(ubins[variant], "altstack")
    assert [s.name for s in r.sites] == ["altstack"] * 3
    all_match(r.sites)
    for s in r.sites:
        i = s.addrs.index(r.restorer)
        assert s.frames[0] == "leaf" and set(s.frames[1:i]) <= {"on_alt"}, s
    t, m1, m2 = r.sites
    assert t.frames[-5:] == ["raise_in_chain", "raise_in_chain", "alt_thread", "?", "?"], t
    assert m1.frames.count("raise_in_chain") == 3 and m1.frames[-4:] == TAIL, m1
    assert m2.frames.count("raise_in_chain") == 1 and m2.frames[-4:] == TAIL, m2


@pytest.mark.parametrize("variant", ALL_C)
def test_nonsense_start_states(ubins, variant):
    """No fault and an exact result from start states that make no sense: sp at 0, near the
    top of user space, in the kernel's; ip 0 or in data; a heap block full of a constant as
    the stack; rbp pointing below sp; a stack that ends at a hole or at a PROT_NONE page."""
    r = subprocess.run([ubins[variant], "garbage"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    got = {}
    for l in r.stdout.splitlines():
        if l.startswith("garbage "):
            w = l.split()
            assert w[2] == "n=%d" % len(w[3:]), l
            got[w[1]] = [int(x, 16) for x in w[3:]]
        elif l.startswith("info ra_rsp="):
            ra_rsp, ra_vla = (int(x.split("=")[1], 16) for x in l.split()[1:])
    const = 0x1111111111111111
    assert got.pop("data-ip") and True
    assert got == {
        "max0": [], "null-sp": [ra_rsp], "high-sp": [ra_rsp], "kernel-sp": [ra_rsp],
        "null-ip": [0], "heap-const": [ra_rsp, const], "bad-rbp": [ra_vla],
        "heap-rbp": [ra_vla, const], "edge": [ra_rsp], "guard": [ra_rsp]}


CXX_SITES = ["template", "virtual-lambda", "sort-lambda", "before-throw", "dtor-during-unwind",
             "catch", "operator-new", "catch-ctor"]


@pytest.mark.parametrize("variant", sorted(CXX_VARIANTS))
def test_cxx_and_exceptions(ubins, variant):
    """Templates, a virtual call into a std::function, std::sort's comparator, a replaced
    operator new that walks and then a constructor that throws, and a destructor that walks
    while an exception unwinds through its frame: all as backtrace(), and the exceptions are
    caught as without the walks."""
    r = subprocess.run([ubins[variant]], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "end cxx"
    sites = [Site(l) for l in lines if l.startswith("site ")]
    assert [s.name for s in sites] == CXX_SITES * 2
    all_match(sites)
    for s in sites:
        if s.name == "template":
            assert s.frames == ["_ZN3RecILi%dEE2goEPKc" % i for i in range(7)] + TAIL, s
        elif s.name == "operator-new":
            assert s.frames == ["_Znwm"] + TAIL, s
        elif s.name == "dtor-during-unwind":
            assert s.frames[0] in ("_ZN5GuardD1Ev", "_ZN5GuardD2Ev") and s.frames[-4:] == TAIL, s
        elif s.name in ("catch", "catch-ctor"):
            assert s.n == 4 and s.frames[-2:] == TAIL[-2:], s
        else:
            assert s.frames[-4:] == TAIL, s


def test_mmleak_so_links_it_without_exporting_it(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    assert "mml_unwind" not in out
    syms = subprocess.run(["nm", lib], capture_output=True, text=True, check=True).stdout
    assert re.search(r" t mml_unwind\n", syms)



def test_memo_check_hits_and_misses_exactly(tmp_path):
    """tracer/memo.c's check, linked with unwind.c (tests/memo_check.c): a walk kept with
    mml_memo_put is found by mml_memo_get with and without the words, and any word it read
    changed, or any two different ones swapped, makes both miss; for a walk of 21 to 28 words
    and for one of at most 8 (which hashes fewer words)."""
    objs = []
    for src in ("unwind.c", "memo.c"):
        objs.append(str(tmp_path / (src[:-2] + ".o")))
        cc(["cc"] + UNWIND_CFLAGS + ["-c", "-o", objs[-1], os.path.join(ROOT, "tracer", src)])
    exe = str(tmp_path / "memo_check")
    cc(["cc", "-g", "-O2", "-fno-omit-frame-pointer", "-pthread", "-o", exe,
        os.path.join(TESTS, "memo_check.c")] + objs + ["-ldl"])
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr
    lines = dict(l.split() for l in r.stdout.splitlines()[:-1])
    assert 21 <= int(lines["words"]) <= 28 and 2 <= int(lines["short"]) <= 8
    assert int(lines["checks"]) > 2 * (int(lines["words"]) + int(lines["short"]))
