"""The compiled shrinker (tools/shrink.c in mmleak-tools.so) against the Python reference.

Every test of tests/test_shrink.py runs here twice, with MMLEAK_SHRINK=python and =native
(the CLI tests see the variable; the tests that drive a Shrinker directly get one whose feed
goes through the C code).  Then parity: simulated histories, fuzzed garbage, odd files and a
real multi-threaded dump give byte-identical stdout, stderr and exit status on both paths,
and shrink_files() returns the same data."""
import os
import random
import subprocess
import sys
import tempfile
import types

import pytest

import test_shrink
from conftest import ROOT, mmleak

MMLEAK_PY = [sys.executable, os.path.join(ROOT, "mmleak.py")]
ENGINES = ("python", "native")


@pytest.fixture(scope="module", autouse=True)
def native_available(lib):
    """mmleak.so is built (the `lib` fixture runs make); the compiled path must be there."""
    mmleak.native._native = None
    assert mmleak.native._native_engine() is not None, mmleak.native._native_why


class NativeFeedShrinker(mmleak.Shrinker):
    """A Shrinker whose (single) feed runs through the compiled shrinker."""

    def feed(self, f, name):
        with tempfile.NamedTemporaryFile(prefix="mmleak-test.") as tf:
            for line in f:
                tf.write(line)
            tf.flush()
            assert mmleak.native_shrink(self, [tf.name], [name])


def native_shrink_parts(parts, final):
    """test_shrink.shrink_parts through the compiled shrinker: each part a file."""
    sh = NativeFeedShrinker()
    with tempfile.TemporaryDirectory(prefix="mmleak-test.") as d:
        paths = []
        for i, part in enumerate(parts):
            paths.append(os.path.join(d, "part%d" % i))
            with open(paths[-1], "wb") as f:
                f.writelines(part)
        assert mmleak.native_shrink(sh, paths, ["<test %d>" % i for i in range(len(parts))])
    return [l for _, _, _, l in sh.entries(final)], sh


def native_shrink_lines(lines, final):
    sh = NativeFeedShrinker()
    sh.feed(iter(lines), "<test>")
    return [l for _, _, _, l in sh.entries(final)], sh


@pytest.fixture(params=ENGINES)
def shrink_engine(request, monkeypatch):
    monkeypatch.setenv("MMLEAK_SHRINK", request.param)
    if request.param == "native":
        monkeypatch.setattr(test_shrink, "shrink_lines", native_shrink_lines)
        monkeypatch.setattr(test_shrink, "shrink_parts", native_shrink_parts)
        monkeypatch.setattr(mmleak.shrink, "Shrinker", NativeFeedShrinker)
    return request.param


def _rebind(name, f):
    """A copy of test_shrink's test function (same globals, marks) that uses shrink_engine."""
    g = types.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__dict__.update(f.__dict__)
    g.pytestmark = list(getattr(f, "pytestmark", [])) + [pytest.mark.usefixtures("shrink_engine")]
    return g


for _name, _f in list(vars(test_shrink).items()):
    if _name.startswith("test_") and callable(_f):
        globals()["test_both_" + _name[5:]] = _rebind("test_both_" + _name[5:], _f)
del _name, _f


# ---------------------------------------------------------------------------------------
# Parity helpers
# ---------------------------------------------------------------------------------------

def run_cli(engine, args, stdin=None, env=None):
    e = dict(os.environ, MMLEAK_SHRINK=engine)
    e.update(env or {})
    r = subprocess.run(MMLEAK_PY + args, input=stdin, capture_output=True, env=e)
    return r.returncode, r.stdout, r.stderr


def assert_same_cli(args, stdin=None, env=None):
    py = run_cli("python", args, stdin, env)
    nat = run_cli("native", args, stdin, env)
    assert py[2] == nat[2], "stderr differs"
    assert py[1] == nat[1], "stdout differs"
    assert py[0] == nat[0], "exit status differs"
    return nat


def shrink_api(engine, paths, monkeypatch, mixed=False):
    monkeypatch.setenv("MMLEAK_SHRINK", engine)
    sh = mmleak.shrink_files(paths, mixed=mixed)
    return {
        "survivors": sh.survivors(), "foreign": sh.foreign_frees(), "headers": sh.headers,
        "header_lines": sh.header_lines, "cmd": sh.cmd, "max_time": sh.max_time,
        "events": sh.events, "allocs": sh.allocs, "frees": sh.frees,
        "files_done": sh.files_done, "malformed": sh.problems.malformed,
        "fatal": sh.problems.fatal, "counts": dict(sh.problems.counts),
        "ids": sh.trace_ids(), "partial": list(sh.entries(False)),
        "final": list(sh.entries(True)),
    }


def write_files(tmp_path, files, pid=4242):
    paths = []
    for lines in files.values():
        p = tmp_path / ("mmleak.%d.%d.out" % (pid, len(paths)))
        p.write_bytes(b"".join(lines))
        paths.append(str(p))
    return paths


# ---------------------------------------------------------------------------------------
# Parity tests
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(8))
def test_simulated_dumps_identical(tmp_path, seed, monkeypatch):
    files, survivors, foreign = test_shrink.simulate(seed, threads=4, events=6000)
    paths = write_files(tmp_path, files)
    for extra in ([], ["--final"], ["--final", "--stats"]):
        rc, out, _ = assert_same_cli(["shrink"] + extra + paths)
        assert rc == 0
    rc, out, _ = assert_same_cli(["shrink", "--final"] + paths)
    body = {l + b"\n" for l in out.splitlines() if not l.startswith(b"#")}
    assert body == survivors | foreign
    # partial shrinks of halves, merged again: same final text both ways
    half = len(paths) // 2
    parts = []
    for i, group in enumerate((paths[:half], paths[half:])):
        rc, out, _ = assert_same_cli(["shrink"] + group)
        p = tmp_path / ("part%d" % i)
        p.write_bytes(out)
        parts.append(str(p))
    assert_same_cli(["shrink", "--final"] + parts)
    # a file given twice: duplicates, reported the same way
    rc, _, err = assert_same_cli(["shrink", "--final", paths[0], paths[0]] + paths)
    assert rc == mmleak.EXIT_PARTIAL and b"event seen twice" in err
    # the API report uses
    assert shrink_api("python", paths, monkeypatch) == shrink_api("native", paths, monkeypatch)


def _by_address(lines):
    """LINES with their '#' lines first, then their events in ascending address order (a
    stable sort: an address's events keep their order)."""
    head = [l for l in lines if l.startswith(b"#")]
    return head + sorted((l for l in lines if not l.startswith(b"#")),
                         key=lambda l: int(l.split(b" ", 1)[0], 16))


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("seed", range(4))
def test_inputs_in_address_order_identical(tmp_path, seed, v2):
    """Inputs whose addresses ascend, wholly or for a long stretch: the compiled shrinker's
    table then builds no index (tools/shrink_state.c, a LAZY table: new addresses appended, the
    last one's events folded in place) until an address comes below the last one.  Each
    file sorted, all of them in one sorted file, that file cut in two (an address on both
    sides of the cut: two inputs), a sorted file with lines moved later (the index built
    mid-file), the same sorted file twice (duplicates): byte-identical to the Python
    engine, and the final result is the true one."""
    rnd = random.Random(9000 + seed)
    files, survivors, foreign = test_shrink.simulate(seed, threads=3, events=5000,
                                                     addrs=40 if seed % 2 else 600, v2=v2)
    every = [l for f in files.values() for l in f]
    whole = _by_address(every)
    head = [l for l in whole if l.startswith(b"#")]
    ev = whole[len(head):]
    cut = rnd.randrange(1, len(ev))
    while cut < len(ev) - 1 and ev[cut].split(b" ", 1)[0] != ev[cut - 1].split(b" ", 1)[0]:
        cut += 1                        # the cut inside one address's events
    moved = list(ev)
    for _ in range(5):                  # a few lines moved later: the index mid-file
        i = rnd.randrange(len(moved) // 2, len(moved))
        moved.insert(rnd.randrange(i, len(moved) + 1), moved.pop(i))
    cases = {
        "each": [_by_address(f) for f in files.values()],
        "one": [whole],
        "two": [head + ev[:cut], head + ev[cut:]],
        "moved": [head + moved],
    }
    for case, contents in cases.items():
        (tmp_path / case).mkdir()
        paths = write_files(tmp_path / case, dict(enumerate(contents)))
        for extra in ([], ["--final", "--stats"]):
            rc, _, _ = assert_same_cli(["shrink"] + extra + paths)
            assert rc == 0, case
        rc, out, _ = assert_same_cli(["shrink", "--final"] + paths)
        body = {l + b"\n" for l in out.splitlines() if not l.startswith(b"#")}
        assert body == survivors | foreign, case
    one = write_files(tmp_path / "one", {0: whole})[0]
    rc, _, err = assert_same_cli(["shrink", "--final", one, one])
    assert rc == mmleak.EXIT_PARTIAL and b"event seen twice" in err


def test_an_address_again_after_a_cancel(tmp_path):
    """In address order, A's block, then B's pair that cancels, then A's free: A is the last
    address again and changes after the compiled shrinker noted it for the head (stacks
    used, counts: taken while reading an input in address order).  Only C survives: the
    head names its stack only, and --stats counts one block, as the Python engine does."""
    a, b, c = 0x55d000001000, 0x55d000002000, 0x55d000003000
    lines = [test_shrink.HDR2 % (1, 0), test_shrink.stack_line(0x1000),
             test_shrink.stack_line(0x1007),
             b"%012x 0 a 0 @1007\n" % a, b"%012x 0 a 0 @1000\n" % b, b"%012x 1 1\n" % b,
             b"%012x 1 1\n" % a, b"%012x 0 b 0 @1000\n" % c]
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(b"".join(lines))
    for extra in ([], ["--final"]):
        rc, out, err = assert_same_cli(["shrink", "--stats"] + extra + [str(p)])
        assert rc == 0 and b"1 blocks (11 B) survive" in err, err
        assert b"#s 1000 " in out and b"#s 1007 " not in out
        assert [l for l in out.splitlines(True) if not l.startswith(b"#")] == [lines[-1]]


def test_stdin_and_classic_pipeline_identical(tmp_path):
    files, survivors, foreign = test_shrink.simulate(3, threads=3, events=5000)
    paths = write_files(tmp_path, files)
    env = dict(os.environ, LC_ALL="C")
    for p in paths:
        srt = subprocess.run(["sort", "-s", "-k1,1", p], capture_output=True, env=env,
                             check=True).stdout
        for args in (["shrink"], ["shrink", "-"], ["shrink", "--final", "-", "-"]):
            rc, _, _ = assert_same_cli(args, stdin=srt)
            assert rc == 0
    data = b"".join(open(p, "rb").read() for p in paths)
    rc, out, _ = assert_same_cli(["shrink", "--final"], stdin=data)
    assert {l + b"\n" for l in out.splitlines() if not l.startswith(b"#")} == \
        survivors | foreign


def mutate(rnd, data):
    data = bytearray(data)
    pieces = [b"\0" * 7, b"#mmleak 1 id=4242 pid=4242\n", b"#cmd ./x \xff\xfe y\n", b"#end\n",
              b"#mmleak 2 id=1\n" if rnd.random() < 0.1 else b"#other\n", b"\n", b"  \t\n",
              b"\r\n", b"000000001000 1 +\n", b"000000001000 2 -\n", b"1 2 3 4\n",
              b"00000000000000001 1 2\n", b"ABCD 1 2\n", b"abc 1  2\n", b"abc 1 2 \n",
              b"abc 1 2 3 4 5 6 7 8 9 a b c d e f\n", b"'\"\\ quotes\n", b"'only\n",
              b"\x1c\x1d\x0b\x0c\n", b"f" * 16 + b" " + b"f" * 16 + b" 1\n",
              b"0 0 0 0 0\n", b"0 1 0\n", b"x" * 200 + b"\n", b"\x80\x81\xc3\xa9\x7f\n"]
    for _ in range(rnd.randrange(1, 25)):
        op = rnd.randrange(7)
        i = rnd.randrange(len(data) + 1)
        if op < 4:
            data = test_shrink.damage(rnd, data, op, i)
        elif op == 4:
            j = data.rfind(b"\n", 0, i) + 1
            data[j:j] = rnd.choice(pieces)
        elif op == 5 and i < len(data):
            data[i] = rnd.choice(b"0123456789abcdefABCDEF +-#\n\0")
        else:
            j = data.rfind(b"\n", 0, i) + 1
            k = data.find(b"\n", i)
            if k > 0:
                data[k + 1:k + 1] = data[j:k + 1]     # repeat a line: a duplicate
    return bytes(data)


@pytest.mark.parametrize("seed", range(30))
def test_fuzzed_input_identical(tmp_path, seed):
    rnd = random.Random(5000 + seed)
    files, _, _ = test_shrink.simulate(seed, threads=3, events=600)
    paths = []
    for n, lines in enumerate(files.values()):
        p = tmp_path / ("mmleak.4242.%d.out" % n)
        data = b"".join(lines)
        p.write_bytes(mutate(rnd, data) if rnd.random() < 0.8 else data)
        paths.append(str(p))
    if rnd.random() < 0.3:
        paths.append(str(tmp_path / "missing.out"))
    if rnd.random() < 0.3:
        paths.append(str(tmp_path))                  # a directory
    if rnd.random() < 0.3:
        paths.append(paths[0])                       # the same file twice
    rnd.shuffle(paths)
    for args in (["shrink"], ["shrink", "--final", "--stats"], ["shrink", "--mixed"]):
        assert_same_cli(args + paths)
    assert_same_cli(["shrink", "--final"], stdin=open(paths[0], "rb").read()
                    if os.path.isfile(paths[0]) else b"")


def test_many_problems_summary_and_odd_names(tmp_path):
    """Six kinds of trouble in several files, names that need escaping, and the summary
    lines, sorted by (file, kind), after the output."""
    odd = tmp_path / "we\xe9ird 'n\"ame.out"
    data = (test_shrink.HDR % (1, 0) + b"zz\n" * 9 + b"000000001000 0 10 0 1\n" * 8 +
            b"\0\0\0\n" * 7 + b"#torn header")
    odd.write_bytes(data)
    plain = tmp_path / "mmleak.4242.1.out"
    plain.write_bytes(data.replace(b"zz", b"Zz 1 2"))
    for args in (["shrink"], ["shrink", "--final", "--stats"]):
        rc, out, err = assert_same_cli(args + [str(odd), str(plain), str(odd)])
        assert rc == mmleak.EXIT_PARTIAL
        assert b"more lines with the same problem (duplicate)" in err


def test_a_repeated_bad_hash_line_counts_once_in_both(tmp_path, monkeypatch):
    """A malformed "#s" line, a "#s" line that defines an id again with other frames and a
    malformed "#clock" line, each three times in a file and again in a second one: the
    compiled reader hands each '#' line's text to the Python side once (its header set), and
    counted each once; the Python engine counted every copy (9 problems against 3 in the
    first file, 9 against none in the second).  Both count each text once, at its first
    place, and say the same."""
    lines = (b"#s zz 1 2\n" + b"#s 1 aaa\n" + b"#s 1 bbb\n" + b"#clock x\n") * 3
    paths = write_files(tmp_path, {
        0: [test_shrink.HDR2 % (1, 0), lines, b"000000001000 0 10 0 @1\n"],
        1: [test_shrink.HDR2 % (2, 1), lines, b"000000002000 0 20 0 @1\n"]})
    py = shrink_api("python", paths, monkeypatch)
    nat = shrink_api("native", paths, monkeypatch)
    assert py == nat
    assert nat["counts"] == {(paths[0], "malformed"): 3}, nat["counts"]
    assert_same_cli(["shrink", "--final"] + paths)


def test_long_lines_beyond_the_read_buffer(tmp_path):
    """Lines longer than the C reader's buffer, an allocation with thousands of callers
    (a slab block of its own), a torn giant last line."""
    callers = b" ".join(b"%012x" % (0x55d000000000 + i) for i in range(40000))
    data = (test_shrink.HDR % (1, 0) + b"000000001000 0 10 0 " + callers + b"\n" +
            b"000000002000 0 10 0 " + callers + b"\n" + b"000000002000 1 1\n" +
            b"000000003000 5 10 0 " + callers + b"\n" + b"000000003000 7 1\n" +
            b"x" * (9 << 20) + b"\n" + b"000000004000 1 1\n" + b"y" * (5 << 20))
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(data)
    for args in (["shrink"], ["shrink", "--final"]):
        rc, out, err = assert_same_cli(args + [str(p)])
        assert rc == mmleak.EXIT_PARTIAL and b"000000001000 0 10 0 " + callers + b"\n" in out


def test_version_and_mixed_processes_identical(tmp_path):
    a = tmp_path / "mmleak.1.0.out"
    b = tmp_path / "mmleak.2.0.out"
    c = tmp_path / "mmleak.3.0.out"
    a.write_bytes(b"#mmleak 1 id=1 pid=1\nbad\n000000001000 0 10 0 1\n")
    b.write_bytes(b"#mmleak 1 id=2 pid=2\n000000002000 0 10 0 1\n")
    c.write_bytes(b"junk\n#mmleak 9 id=3\nmore junk\n")
    for files in ([a, b], [b, a], [a, c, b], [a, b, c], [c]):
        for args in (["shrink"], ["shrink", "--mixed"]):
            rc, _, _ = assert_same_cli(args + [str(f) for f in files])
            assert rc == mmleak.EXIT_INPUT or "--mixed" in args


def test_real_dump_identical(tmp_path, monkeypatch):
    exe = str(tmp_path / "alloc_bench")
    subprocess.run(["cc", "-O2", "-pthread", "-o", exe,
                    os.path.join(ROOT, "bench", "alloc_bench.c")], check=True)
    d = tmp_path / "dumps"
    d.mkdir()
    env = dict(os.environ, LD_PRELOAD=os.path.join(ROOT, "mmleak.so"), MMLEAK_DIR=str(d))
    subprocess.run([exe, "-t", "2", "-n", "200000"], env=env, check=True,
                   capture_output=True)
    (tid, paths), = mmleak.find_traces(str(d)).items()
    assert len(paths) >= 2
    for args in (["shrink"], ["shrink", "--final", "--stats"]):
        rc, out, _ = assert_same_cli(args + paths)
        assert rc == 0
    py = shrink_api("python", paths, monkeypatch)
    nat = shrink_api("native", paths, monkeypatch)
    assert py == nat
    assert nat["events"] >= 800000 and nat["ids"] == [tid]


def test_loading_the_library_does_not_trace(tmp_path):
    """ctypes loads mmleak.so into the Python process: the tracer must stay off."""
    d = tmp_path / "d"
    d.mkdir()
    code = ("import sys; sys.path.insert(0, %r); from mmleaklib import native as m; "
            "assert m._native_engine() is not None, m._native_why; "
            "x = [bytearray(100) for _ in range(1000)]; print('ok')" % ROOT)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, MMLEAK_DIR=str(d)))
    assert r.stdout == "ok\n", r.stderr
    assert os.listdir(d) == []


def test_engine_selection(tmp_path):
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(test_shrink.GOOD)
    fake = tmp_path / "nolib.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(fake), "-x", "c", "-"],
                   input=b"int unrelated(void) { return 0; }\n", check=True)
    # auto: falls back to Python when the library lacks the compiled shrinker
    rc, out, err = run_cli("auto", ["shrink", str(p)], env={"MMLEAK_LIB": str(fake)})
    assert rc == 0 and out == test_shrink.GOOD and err == b""
    # native forced: an error that says why
    rc, out, err = run_cli("native", ["shrink", str(p)], env={"MMLEAK_LIB": str(fake)})
    assert rc == mmleak.EXIT_TOOL and b"compiled shrinker is not available" in err
    rc, out, err = run_cli("bogus", ["shrink", str(p)])
    assert rc == mmleak.EXIT_USAGE and b"MMLEAK_SHRINK=bogus" in err
    for engine in ("", "auto", "native", "python"):
        assert run_cli(engine, ["shrink", str(p)])[:2] == (0, test_shrink.GOOD)


def test_native_path_really_runs(monkeypatch, tmp_path):
    """Guard against a silent fallback: with MMLEAK_SHRINK=native the C function is used."""
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(test_shrink.GOOD)
    monkeypatch.setenv("MMLEAK_SHRINK", "native")
    sh = mmleak.Shrinker()
    assert mmleak.native_shrink(sh, [str(p)]) is True
    assert sh.events == 1 and sh.allocs == 1 and sh.files_done == 1
    monkeypatch.setenv("MMLEAK_SHRINK", "python")
    assert mmleak.native_shrink(mmleak.Shrinker(), [str(p)]) is False


def test_bounded_reading_identical(tmp_path):
    """The two bounded readers (mmleaklib/dumpformat.py's dump_lines, tools/shrink_read.c's
    feed_fd) where they could part: lines and NUL runs across the 1 MiB chunks, lines just
    within, at and past the 1 MiB limit ended by a newline, a NUL or the end of the file,
    holes (a sparse file) inside a line, at the start and to the end; read from the file and
    from a pipe.
    Same stdout, stderr and status, and every complete event counted."""
    M = 1 << 20
    head = test_shrink.HDR % (1, 0)

    def ev(i):
        return b"%012x 0 10 0 400000\n" % (0x1000 + 16 * i)
    files, counts = [], []

    def add(name, build):
        p = tmp_path / ("mmleak.4242.%s.out" % name)
        with open(p, "wb") as f:
            counts.append(build(f))
        files.append(p)

    def chunky(f):
        n = 0
        f.write(head)
        while f.tell() < M - 30:            # an event across the first chunk's end
            f.write(ev(n))
            n += 1
        f.write(b"\0" * (M + 50))           # a NUL run across the next one
        f.write(ev(n) + b"x" * (M - 1) + b"\n" + ev(n + 1))     # LINE_MAX - 1 + "\n"
        f.write(b"y" * M + b"\n" + ev(n + 2))                   # exactly LINE_MAX
        f.write(b"z" * (M + 1) + b"\n" + ev(n + 3))             # one byte too long
        f.write(b"w" * (3 * M) + b"\0" + ev(n + 4))             # too long, cut by a NUL
        f.write(b"#" + b"h" * (2 * M) + b"\n" + ev(n + 5))      # a header too long
        f.write(b"v" * (2 * M))                                 # too long at the end
        return n + 6

    def holes(f):
        f.seek(M)                           # a hole at the start
        f.write(head + ev(0) + ev(1)[:7])
        f.seek(3 * M, os.SEEK_CUR)          # a hole in a line
        f.write(ev(1)[7:] + ev(2) + b"   ")
        f.seek(2 * M, os.SEEK_CUR)          # and to the end
        f.truncate()
        return 2
    add("0", chunky)
    add("1", holes)
    for p, n in zip(files, counts):
        rc, out, err = assert_same_cli(["shrink", "--final", "--stats", str(p)])
        assert b"mmleak.py: %d events (%d allocations" % (n, n) in err, err
        assert_same_cli(["shrink", "--final", "--stats", "-"], stdin=p.read_bytes())


def big_v2_dump(tmp_path, blocks=20000):
    """A format-2 dump whose final result (BLOCKS survivors, a foreign free, stacks used
    and not, a clock newer than the survivors) is far bigger than a pipe's buffer."""
    lines = [test_shrink.HDR2 % (1, 0), test_shrink.stack_line(0x1000),
             test_shrink.stack_line(0x1007), b"#clock 99\n"]
    for i in range(blocks):
        p = 0x55d000001000 + 0x70 * i
        lines.append(b"%012x %x %x %x @%x\n" % (p, 2 * i, 100 + i % 7, i // 1000,
                                               0x1000 if i % 3 else 0x1007))
        if i % 5 == 0:
            lines.append(b"%012x %x 1\n" % (p, 2 * i + 1))
    lines.append(b"%012x 0 1\n" % 0x55d0ffff0000)
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(b"".join(lines))
    return str(p)


@pytest.mark.parametrize("final", [[], ["--final"]])
def test_result_to_stdout_as_to_a_file(tmp_path, final):
    """The compiled shrinker writes a result on stdout itself, after the head mmleaklib
    writes (no temporary file): stdout a regular file, a pipe (assert_same_cli), the
    result of -o, and the Python engine's are the same bytes."""
    path = big_v2_dump(tmp_path)
    _, piped, _ = assert_same_cli(["shrink"] + final + [path])
    assert piped.count(b"\n#s ") == 2 and piped.count(b" @") == 16000
    for engine in ENGINES:
        to = tmp_path / ("stdout." + engine)
        with open(to, "wb") as f:
            r = subprocess.run(MMLEAK_PY + ["shrink"] + final + [path], stdout=f,
                               env=dict(os.environ, MMLEAK_SHRINK=engine))
        assert r.returncode == 0 and to.read_bytes() == piped
        o = tmp_path / ("o." + engine)
        r = subprocess.run(MMLEAK_PY + ["shrink"] + final + [path, "-o", str(o)],
                           env=dict(os.environ, MMLEAK_SHRINK=engine))
        assert r.returncode == 0 and o.read_bytes() == piped


def test_result_to_a_full_or_closed_stdout(tmp_path):
    """Writing the result fails the same way on both engines: stdout /dev/full (one line,
    exit status 2), a pipe whose reader is gone after 100 bytes (quietly, status 0)."""
    path = big_v2_dump(tmp_path)
    got = {}
    for engine in ENGINES:
        env = dict(os.environ, MMLEAK_SHRINK=engine)
        with open("/dev/full", "wb") as full:
            r = subprocess.run(MMLEAK_PY + ["shrink", "--final", path], stdout=full,
                               stderr=subprocess.PIPE, env=env)
        p = subprocess.Popen(MMLEAK_PY + ["shrink", "--final", path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        head = p.stdout.read(100)
        p.stdout.close()
        err = p.stderr.read()
        got[engine] = (r.returncode, r.stderr, p.wait(), err, head)
    assert got["native"] == got["python"]
    assert got["native"][:4] == (mmleak.EXIT_INPUT, b"mmleak.py: No space left on device\n",
                                 0, b"")
