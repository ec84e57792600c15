"""Stacks (issue #9): with no setting at all, a leak made inside the C or C++ runtime on the
program's behalf is reported at the program's own line, exactly; stacks are written once per
file; killed processes and the sort pipeline keep working with them."""
import collections
import os
import re
import signal
import struct
import subprocess
import sys

import pytest

from conftest import LIB, ROOT, TESTS, mmleak, run_traced, site_line

MALLOC_DEBUG = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0"
MARK = 777000            # tests/attrib.cpp's marker blocks: MARK + case number

CASES = ["string_new", "string_append", "vector_push", "map_insert", "ostringstream_str",
         "fopen_unclosed", "stdio_buffer", "asprintf_leak", "getline_leak", "realpath_leak",
         "strdup_leak", "memstream_leak", "scandir_leak", "glob_leak", "regcomp_leak",
         "getaddrinfo_leak"]


@pytest.fixture(scope="module", params=["-O0", "-O2"])
def attrib(request, tmp_path_factory, lib):
    d = tmp_path_factory.mktemp("attrib")
    exe = str(d / "attrib")
    subprocess.run(["c++", request.param, "-g", "-o", exe, os.path.join(TESTS, "attrib.cpp")],
                   check=True)
    data = d / "data"
    data.mkdir()
    (data / "input.txt").write_text("hello world line\n")
    (data / "b.txt").write_text("")
    return exe, str(data)


def mtrace_truth(exe, data, tmp_path):
    """glibc's own record of the same run (mtrace): the blocks each case left unfreed,
    {case: (blocks, bytes)}.  A case's blocks are those allocated after its marker, alive at
    the last marker (after it mtrace runs __libc_freeres, which a normal exit does not)."""
    if not os.path.exists(MALLOC_DEBUG):
        pytest.skip("glibc's libc_malloc_debug.so is missing (package libc6)")
    log = tmp_path / "mtrace.txt"
    subprocess.run([exe, data], check=True, capture_output=True, timeout=60,
                   env=dict(os.environ, LD_PRELOAD=MALLOC_DEBUG, MALLOC_TRACE=str(log)))
    live = {}
    phase = -1
    for line in log.read_text().splitlines():
        m = re.search(r" ([-+<>]) (0x[0-9a-f]+)(?: (0x[0-9a-f]+))?$", line)
        if not m:
            continue
        op, addr = m.group(1), int(m.group(2), 16)
        size = int(m.group(3), 16) if m.group(3) else 0
        if op == "+" and MARK <= size <= MARK + len(CASES):
            phase = size - MARK
            if phase == len(CASES):
                break       # the end of main: mtrace's exit handler then frees libc's caches
            continue
        if op in "-<":
            live.pop(addr, None)
        elif op in "+>":
            live[addr] = (phase, size)
    truth = collections.defaultdict(lambda: [0, 0])
    for ph, size in live.values():
        if 0 <= ph < len(CASES):
            truth[CASES[ph]][0] += 1
            truth[CASES[ph]][1] += size
    return {k: tuple(v) for k, v in truth.items()}


def site_lines(name):
    """Every line of tests/attrib.cpp inside function NAME that carries a site: marker."""
    src = open(os.path.join(TESTS, "attrib.cpp")).read().splitlines()
    start = next(i for i, l in enumerate(src) if re.match(r"CASE %s\(\)" % name, l))
    end = next((i for i in range(start + 1, len(src)) if src[i].startswith(("CASE ", "static"))),
               len(src))
    return {i + 1 for i in range(start, end) if "// site:" in src[i]}


def report_by_function(dump):
    """mmleak's default report of the one trace in DUMP: {function: (blocks, bytes, {lines})}."""
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    rep = mmleak.build_report(str(dump), tid, progress=False)
    got = collections.defaultdict(lambda: [0, 0, set()])
    # mtrace (glibc 2.36) leaves zero-size allocations out of its log; regcomp makes two
    # (re_node_set_alloc(set, 0)): those are compared on their own, by their line only
    surv = [a for a in rep["survivors"] if a.size]
    sites = mmleak.leak_sites(surv, rep["end_time"], rep["trace_depth"], rep["frames"],
                              mmleak.Wrappers())
    for s in sites:
        fr = rep["frames"].get(s.caller)
        fn = mmleak.base_name(fr.function) if fr and fr.function else "0x%x" % s.caller
        g = got[fn]
        g[0] += s.blocks
        g[1] += s.bytes
        if fr and fr.file and fr.file.endswith("attrib.cpp"):
            g[2].add(fr.line)
    return got, rep


def test_runtime_allocations_are_reported_at_the_programs_line(attrib, tmp_path):
    """Sixteen ways to leak through libc and libstdc++ (std::string, vector, map, streams,
    fopen and stdio buffers, asprintf, getline, realpath, strdup, open_memstream, scandir,
    glob, regcomp, getaddrinfo): with default settings every leak is reported at the case's
    own line, with exactly the blocks and bytes glibc's mtrace saw it leave."""
    exe, data = attrib
    truth = mtrace_truth(exe, data, tmp_path)
    assert set(truth) == set(CASES), truth          # every case leaks something
    dump = tmp_path / "dump"
    dump.mkdir()
    r = run_traced([exe, data], dump)
    assert r.stdout == b"16 cases\n"
    got, rep = report_by_function(dump)
    for case in CASES:
        blocks, size, lines = got.get(case, (0, 0, set()))
        assert (blocks, size) == truth[case], (case, got.get(case), truth[case])
        assert lines and lines <= site_lines(case), (case, lines, site_lines(case))
    # nothing else is reported but the runtime's own blocks (libstdc++'s emergency pool,
    # allocated before main) and main's stdout buffer
    for s in mmleak.leak_sites(rep["survivors"], rep["end_time"], rep["trace_depth"],
                               rep["frames"], mmleak.Wrappers()):
        fr = rep["frames"].get(s.caller)
        fn = mmleak.base_name(fr.function) if fr and fr.function else None
        assert fn in CASES or fn == "main" or mmleak.is_runtime(fr), (fn, fr)


def test_depth_one_still_names_the_runtime_line(attrib, tmp_path):
    """MMLEAK_DEPTH=1 keeps its old meaning: exactly the caller's address, no stack (the
    getline buffer is then getdelim's)."""
    exe, data = attrib
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([exe, data], dump, env={"MMLEAK_DEPTH": "1"})
    text = b"".join(open(f, "rb").read() for f in mmleak.find_traces(str(dump)).popitem()[1])
    assert b"\n#s " not in text and b" @" not in text and b" depth=1 " in text
    got, _ = report_by_function(dump)
    assert "getline_leak" not in got and "getdelim" in " ".join(got)


def test_each_stack_is_written_once_per_file(attrib, tmp_path):
    exe, data = attrib
    dump = tmp_path / "dump"
    dump.mkdir()
    run_traced([exe, data], dump, env={"MMLEAK_DEPTH": "16"})
    for f in mmleak.find_traces(str(dump)).popitem()[1]:
        lines = open(f, "rb").read().splitlines()
        defs = [l.split()[1] for l in lines if l.startswith(b"#s ")]
        assert len(defs) == len(set(defs)), f
        used = {l.split(b"@")[1] for l in lines if b" @" in l}
        assert used <= set(defs)                      # every reference has its definition
        assert all(len(l.split()) <= 2 + 16 for l in lines if l.startswith(b"#s "))


def test_killed_process_with_stacks_recovers_exactly(bins, tmp_path):
    """SIGKILL while the stacks are only in the staging file: report and recover still
    resolve every stack."""
    dump = tmp_path / "dump"
    dump.mkdir()
    env = dict(os.environ, LD_PRELOAD=LIB, MMLEAK_DIR=str(dump))
    p = subprocess.Popen([bins["adversary"], "stackwait"], env=env, stdout=subprocess.PIPE,
                         stdin=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    p.send_signal(signal.SIGKILL)
    p.wait()
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    rep = mmleak.build_report(str(dump), tid, progress=False)
    sites = mmleak.leak_sites(rep["survivors"], rep["end_time"], rep["trace_depth"],
                              rep["frames"], mmleak.Wrappers())
    mine = {(rep["frames"][s.caller].function, rep["frames"][s.caller].line): (s.blocks, s.bytes)
            for s in sites if rep["frames"].get(s.caller) and
            (rep["frames"][s.caller].file or "").endswith("adversary.c")}
    assert mine == {("stackwait", site_line("adversary.c", "stack_asprintf")): (3, 3 * 101)}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "recover", str(dump)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep2 = mmleak.build_report(str(dump), tid, progress=False)
    assert sorted(a.callers for a in rep2["survivors"]) == \
        sorted(a.callers for a in rep["survivors"])


@pytest.mark.parametrize("flags", [["-O2", "-fomit-frame-pointer"], ["-O0", "-no-pie"],
                                   ["-O2", "-fno-omit-frame-pointer"]],
                         ids=["pie-O2-nofp", "nopie-O0", "pie-O2-fp"])
def test_recorded_stack_equals_backtrace(tmp_path, lib, flags):
    """MMLEAK_DEPTH=64: the frames mmleak.so records for each allocation are the callers
    glibc's backtrace() sees at that place (main thread and a thread)."""
    exe = str(tmp_path / "bt")
    subprocess.run(["cc", "-g", "-pthread", "-o", exe, os.path.join(TESTS, "bt_compare.c")] +
                   flags, check=True)
    dump = tmp_path / "d"
    dump.mkdir()
    r = run_traced([exe], dump, env={"MMLEAK_DEPTH": "64"})
    want = {}
    for line in r.stdout.decode().splitlines():
        v = line.split()
        want[int(v[0])] = tuple(int(x, 16) for x in v[1:])
    assert sorted(want) == [301, 302, 303]
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    sh = mmleak.shrink_files(mmleak.find_traces(str(dump))[tid])
    got = {a.size: a.callers[1:] for a in sh.survivors() if a.size in want}
    assert got == want


def memo_run(tmp_path, flags, depth, args=(), env=None, total=5000):
    """Build and run tests/memo_stacks.c; check every leaked block's stack and every count."""
    exe = str(tmp_path / "memo")
    subprocess.run(["cc", "-g", "-pthread", "-o", exe, os.path.join(TESTS, "memo_stacks.c")] +
                   flags, check=True)
    dump = tmp_path / "d"
    dump.mkdir()
    r = run_traced([exe] + list(args), dump, env=dict(env or {}, MMLEAK_DEPTH=depth))
    want, counts = {}, {}
    for line in r.stdout.decode().splitlines():
        v = line.split()
        if v[0] == "count":
            counts[int(v[1])] = int(v[2])
        else:
            want[int(v[0])] = tuple(int(x, 16) for x in v[1:])
    assert sorted(counts) == sorted(want) and len(want) == 26
    assert total is None or sum(counts.values()) == total
    if depth == "auto":     # the wrapper's frame, then leaf's and four more
        want = {s: w[:5] for s, w in want.items()}
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    sh = mmleak.shrink_files(mmleak.find_traces(str(dump))[tid])
    assert not sh.problems.malformed
    got = collections.defaultdict(collections.Counter)
    for a in sh.survivors():
        if a.size in want:
            got[a.size][a.callers[1:]] += 1
    assert got == {s: collections.Counter({want[s]: counts[s]}) for s in want}
    return sh


@pytest.mark.parametrize("depth", ["64", "auto"])
@pytest.mark.parametrize("flags", [["-O2", "-fomit-frame-pointer"], ["-O0", "-no-pie"],
                                   ["-O2", "-fno-omit-frame-pointer"]],
                         ids=["pie-O2-nofp", "nopie-O0", "pie-O2-fp"])
def test_memo_never_mixes_stacks(tmp_path, lib, flags, depth):
    """The memo of walks (tracer/unwind.h) skips a walk from the same return address and stack
    pointer when the stack words it read are unchanged.  tests/memo_stacks.c reaches the
    allocating function at the same stack pointer through callers that differ only further
    up, at many depths, and through a frame of 3 KiB, 5,000 times in a shuffled order in two
    threads: every block still carries exactly the stack backtrace() saw for its path, and
    every path's count of blocks."""
    memo_run(tmp_path, flags, depth)


@pytest.mark.parametrize("depth", ["64", "auto"])
def test_memo_with_signal_handlers_allocating(tmp_path, lib, bins, depth):
    """The same, with a timer every 50 us whose handler allocates and frees through a wrapper:
    the handler's memo lookups and records land in the middle of the interrupted thread's
    (a record being written is skipped, never read half-written).  An async-signal-safe
    allocator is preloaded behind mmleak.so (glibc's malloc is not one)."""
    sh = memo_run(tmp_path, ["-O2"], depth, ["signals"], total=None,
                  env={"LD_PRELOAD": "%s %s" % (LIB, bins["libsigsafe_alloc.so"])})
    lost, unknown = sh.gaps()
    handler_left = sum(1 for a in sh.survivors() if 48 <= a.size < 56)
    assert handler_left <= lost and not unknown    # see the signal storm test (test_tracer)
    # the handler ran 1000 times; a run that interrupts mmleak's own slow path (with stacks,
    # most of the main thread's time) is not recorded, neither of its events (mmleak-limits(7))
    leaked = sum(1 for a in sh.survivors() if a.size >= 1000)
    assert sh.allocs - leaked >= 200


@pytest.mark.parametrize("prog, lo, hi", [
    ("rotate_stacks", 16, 80),          # two paths: the thread's recent walks serve them
    ("rotate_memo_stacks", 16, 32),     # 512 paths at random: the memo serves them
])
def test_stacks_defined_in_every_file_after_rotation(tmp_path, prog, lo, hi):
    """Whole stacks (the default) through several files per thread (MMLEAK_ROTATE_MB=1):
    every file defines every stack it references, and no allocation is lost; whether a
    recent walk's slot or a memo record says the file holds the stack."""
    exe = str(tmp_path / prog)
    subprocess.run(["cc", "-O1", "-g", "-pthread", "-o", exe,
                    os.path.join(TESTS, prog + ".c")], check=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    r = run_traced([exe], dump, env={"MMLEAK_ROTATE_MB": "1"})
    steps = int(r.stdout.split()[1])
    files = mmleak.find_traces(str(dump)).popitem()[1]
    assert len(files) >= 4, files
    refs = 0
    for f in files:
        lines = open(f, "rb").read().splitlines()
        defs = {l.split()[1] for l in lines if l.startswith(b"#s ")}
        used = {l.split(b"@")[1] for l in lines if b" @" in l}
        assert used and used <= defs, f             # every reference has its definition
        # the program's own blocks: lo to hi - 1 bytes (stdio and pthread_create make others)
        refs += sum(1 for l in lines if b" @" in l and lo <= int(l.split()[2], 16) < hi)
    assert refs == steps


@pytest.mark.parametrize("opt", ["-O1", "-O2"])
def test_stacks_differing_by_call_sites_keep_their_own_frames(tmp_path, lib, opt):
    """tests/stack_collide.c: 16 paths through two call sites of a recursive function, two of
    them (X Y Y X and Y X X Y) made one id by the former stack hash, linear in the frames
    (the second path's blocks were then given the first's frames: in python3 -m http.server
    two such pairs every run), and the memo of walks took one for the other alike.  Each path
    is taken 4 times: every block carries the frames backtrace() saw for its own path, and
    the 16 stacks have 16 ids."""
    exe = str(tmp_path / "collide")
    subprocess.run(["cc", opt, "-g", "-fno-omit-frame-pointer", "-o", exe,
                    os.path.join(TESTS, "stack_collide.c")], check=True)
    dump = tmp_path / "d"
    dump.mkdir()
    r = run_traced([exe], dump, env={"MMLEAK_DEPTH": "64"})
    want = {}
    for line in r.stdout.decode().splitlines():
        v = line.split()
        want[int(v[0])] = tuple(int(x, 16) for x in v[1:])
    assert sorted(want) == list(range(200, 216)) and len(set(want.values())) == 16
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    files = mmleak.find_traces(str(dump))[tid]
    sh = mmleak.shrink_files(files)
    assert not sh.problems.malformed
    got = collections.defaultdict(collections.Counter)
    for a in sh.survivors():
        if a.size in want:
            got[a.size][a.callers[1:]] += 1
    assert got == {s: collections.Counter({want[s]: 4}) for s in want}
    ids = set()
    for f in files:
        ids |= {l.split(b"@")[1] for l in open(f, "rb").read().splitlines()
                if b" @" in l and 200 <= int(l.split()[2], 16) < 216}
    assert len(ids) == 16


def walks_of(files):
    """The stack walks mmleak.so made for the events of FILES (their "#walks" lines)."""
    return [int(l.split()[1]) for f in files for l in open(f, "rb").read().splitlines()
            if l.startswith(b"#walks ")]


def test_memo_serves_many_call_sites_of_one_wrapper(tmp_path):
    """bench/sites_bench.c, the "d sites" shape: a wrapper (xmalloc) called from 16 call sites
    of one function, so 16 paths with one start (the wrapper's frame, at one stack pointer)
    that differ only in the return address one frame up.  The memo of walks (tracer/memo.c,
    memo_set) chooses a set by that address too; a change that put the 16 paths in one set of
    4 records walked again at almost every allocation (475 to 1,700 instructions an event,
    and nothing failed).  Counted (the file's "#walks" line), not timed: 20,000 allocations
    need about one walk per path, whatever addresses ASLR gives (64 at most here: 16 paths
    and the few of libc's start-up and stdio); with memo_set ignoring the frame above,
    thousands."""
    exe = str(tmp_path / "sites_bench")
    subprocess.run(["cc", "-O2", "-fomit-frame-pointer", "-I", os.path.join(ROOT, "bench"),
                    "-o", exe, os.path.join(ROOT, "bench", "sites_bench.c")], check=True)
    dump = tmp_path / "dump"
    dump.mkdir()
    r = run_traced([exe, "-n", "20000", "-s", "16"], dump)
    assert r.stdout.startswith(b"sites=16 steps=20000 "), r.stdout
    files = mmleak.find_traces(str(dump)).popitem()[1]
    walks = walks_of(files)
    assert len(walks) == len(files) == 1, (walks, files)
    sh = mmleak.shrink_files(files)
    assert sh.allocs >= 20000
    assert 16 <= walks[0] <= 64, (walks, sh.allocs)


def gap_names(exe, dump):
    """The functions of the stack of gap_stack's block of 4321 bytes, traced in DUMP."""
    dump.mkdir()
    r = run_traced([exe], dump)
    assert r.stdout == b"ok\n"
    (tid,) = [k for k, v in mmleak.find_traces(str(dump)).items() if v]
    sh = mmleak.shrink_files(mmleak.find_traces(str(dump))[tid])
    (block,) = [a for a in sh.survivors() if a.size == 4321]
    sym = mmleak.Symbolizer(os.path.join(str(dump), "mmleak.%s.maps" % tid))
    frames = sym.lookup(sorted(set(block.callers)))
    names = [frames[c].function for c in block.callers]
    return names[:names.index("main") + 1 if "main" in names else None]


def test_whole_stacks_through_objects_with_far_apart_segments(tmp_path, lib):
    """tests/gap_stack.c: a program and a library each with a 2 MiB-aligned .bss, so a gap
    between their segments.  glibc 2.36's _dl_find_object gives the program's text segment
    alone as its range, and its .eh_frame_hdr is in another segment: the unwinder refused it
    and every stack from the program's code was one frame (lib_leaf's block: lib_leaf,
    lib_rec x3, prog_rec, then nothing).  The block's stack names every frame down to
    main.  Then the same program with its PT_GNU_EH_FRAME moved into the gap (no mapping
    there): that table is refused, the walk stops in the program's first frame, and nothing
    faults."""
    so, exe = str(tmp_path / "libgap_stack.so"), str(tmp_path / "gap_stack")
    src = os.path.join(TESTS, "gap_stack.c")
    subprocess.run(["cc", "-O2", "-g", "-shared", "-fPIC", "-DGAP_LIB", "-o", so, src],
                   check=True)
    subprocess.run(["cc", "-O2", "-g", "-o", exe, src, so, "-Wl,-rpath," + str(tmp_path)],
                   check=True)
    lib_part = ["lib_leaf"] + ["lib_rec"] * 3 + ["prog_rec"]
    assert gap_names(exe, tmp_path / "d") == lib_part + ["prog_rec"] * 3 + ["main"]
    # the forged table: PT_GNU_EH_FRAME's address 1 MiB in, between the data and the .bss
    elf = bytearray(open(exe, "rb").read())
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    (ph,) = [phoff + i * phentsize for i in range(phnum)
             if struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 0x6474e550]
    struct.pack_into("<QQ", elf, ph + 16, 0x100000, 0x100000)   # p_vaddr, p_paddr
    open(exe, "wb").write(elf)
    assert gap_names(exe, tmp_path / "d2") == lib_part
