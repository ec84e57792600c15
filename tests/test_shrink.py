"""The dump format and the shrink algebra, on synthetic histories whose truth is known, and
mmleak.py's behaviour on bad input."""
import collections
import os
import random
import subprocess
import sys

import pytest

from conftest import ROOT, mmleak

MMLEAK_PY = [sys.executable, os.path.join(ROOT, "mmleak.py")]
HDR = b"#mmleak 1 id=4242 pid=4242 tid=%d file=%d depth=1 start=1700000000\n"
HDR2 = b"#mmleak 2 id=4242 pid=4242 tid=%d file=%d depth=auto start=1700000000\n"
# Format 2's stacks for the simulations: id -> frames (the ids need not be mmleak.so's hash).
STACKS = {0x1000 + 7 * k: tuple(0x55c000000000 + 0x100 * k + j for j in range(1 + k % 9))
          for k in range(30)}


def stack_line(i):
    return b"#s %x %s\n" % (i, b" ".join(b"%x" % f for f in STACKS[i]))


def simulate(seed, threads=3, events=20000, addrs=40, buckets=3, preexisting=5, v2=False):
    """A true multi-threaded history, numbered the way mmleak.so numbers it: one counter per
    address bucket (few buckets, so that other addresses often come in between).

    Threads allocate and free, often blocks another thread allocated; addresses are reused
    all the time; some blocks exist before tracing began (their frees are foreign).
    V2: format 2, allocations refer to stacks ("@ID"), each file holding the "#s" lines of
    the stacks it uses, once, sometimes after the first use (a signal handler's doing).
    Returns (files: {name: [lines]}, survivors: {line}, foreign: {line})."""
    rnd = random.Random(seed)
    defined = collections.defaultdict(set)
    ctr = collections.Counter()
    live = {}                        # ptr -> alloc line (or None: allocated before tracing)
    pool = [0x55d000001000 + 0x40 * i for i in range(addrs)]
    for p in rnd.sample(pool, preexisting):
        live[p] = None
    out = collections.defaultdict(list)
    part = collections.Counter()
    foreign = set()
    for i in range(events):
        t = rnd.randrange(threads)
        if rnd.random() < 0.002:
            part[t] += 1             # rotation: the thread goes on in a new file
        name = "t%d.%d" % (t, part[t])
        if not out[name]:
            out[name].append((HDR2 if v2 else HDR) % (t, len(out)))
        free_ptrs = [p for p in pool if p not in live]
        if live and (not free_ptrs or rnd.random() < 0.5):
            p = rnd.choice(sorted(live))
            s = ctr[p % buckets]
            ctr[p % buckets] += 1
            line = b"%012x %x %012x\n" % (p, s, 0x55c000000000 + rnd.randrange(50))
            if live.pop(p) is None:
                foreign.add(line)
        else:
            p = rnd.choice(free_ptrs)
            s = ctr[p % buckets]
            ctr[p % buckets] += 1
            if v2:
                k = rnd.choice(sorted(STACKS))
                line = b"%012x %x %x %x @%x\n" % (p, s, rnd.randrange(1, 600), i // 1000, k)
                if k not in defined[name]:
                    defined[name].add(k)
                    out[name].insert(rnd.randrange(1, len(out[name]) + 1), stack_line(k))
            else:
                line = b"%012x %x %x %x %012x\n" % (p, s, rnd.randrange(1, 600), i // 1000,
                                                    0x55c000000000 + rnd.randrange(50))
            live[p] = line
        out[name].append(line)
    survivors = {l for l in live.values() if l is not None}
    return dict(out), survivors, foreign


def shrink_lines(lines, final):
    sh = mmleak.Shrinker()
    sh.feed(iter(lines), "<test>")
    return [l for _, _, _, l in sh.entries(final)], sh


def write_lines(lines, final):
    """Shrinker.write's output (stack lines included), as lines."""
    import io
    sh = mmleak.Shrinker()
    sh.feed(iter(lines), "<test>")
    b = io.BytesIO()
    sh.write(b, final)
    return b.getvalue().splitlines(keepends=True)


def shrink_parts(parts, final):
    """PARTS (lists of lines, each a partial result) shrunk as separate inputs, as files
    are (one input of them joined can give a false foreign free: mmleak-format(5))."""
    sh = mmleak.Shrinker()
    for i, part in enumerate(parts):
        sh.feed(iter(part), "<test %d>" % i)
    return [l for _, _, _, l in sh.entries(final)], sh


def final_sets(lines, parts=None):
    res, sh = shrink_parts(parts, True) if parts is not None else shrink_lines(lines, True)
    surv = {l for l in res if len(l.split()) >= 5}
    foreign = {l for l in res if len(l.split()) == 3}
    return surv, foreign


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("seed", range(12))
def test_direct_shrink_equals_truth(seed, v2):
    files, survivors, foreign = simulate(seed, v2=v2)
    lines = [l for f in files.values() for l in f]
    assert final_sets(lines) == (survivors, foreign)
    if v2:                              # every survivor's stack is resolved to its frames
        _, sh = shrink_lines(lines, True)
        for a in sh.survivors():
            line = [l for l in survivors if l.startswith(b"%012x %x " % (a.ptr, a.seq))][0]
            assert a.callers == STACKS[int(line.split(b"@")[1], 16)]


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize("seed", range(12))
def test_any_grouping_and_order_gives_the_same_result(seed, v2):
    files, survivors, foreign = simulate(seed, threads=4, v2=v2)
    rnd = random.Random(1000 + seed)
    names = list(files)
    for _ in range(6):
        rnd.shuffle(names)
        # partial shrinks of random groups, possibly nested, then a final shrink of those
        groups = collections.defaultdict(list)
        for n in names:
            groups[rnd.randrange(1 + len(names) // 2)].extend(files[n])
        partials = []
        for g in groups.values():
            rnd.shuffle(g) if rnd.random() < 0.3 else None   # even shuffled lines
            out = write_lines(g, False)
            if rnd.random() < 0.5:                           # shrink a shrink again
                out = write_lines(out, False)
            partials.append(out)
        rnd.shuffle(partials)
        assert final_sets(None, partials) == (survivors, foreign)
        if v2:               # the partial results carried the stacks their survivors use
            _, sh = shrink_parts(partials, True)
            assert all(a.callers != mmleak.NO_STACK for a in sh.survivors())
        # the final output, as text, does not depend on the grouping either
        assert shrink_parts(partials, True)[0] == shrink_lines(
            [l for f in files.values() for l in f], True)[0]


def test_adjacent_pairs_are_cancelled_at_once():
    """Memory follows the live set: a pair whose numbers are consecutive is dropped."""
    lines = []
    for i in range(1000):
        lines.append(b"00000000%04x %x 10 0 000000001000\n" % (i * 16, 2 * i))
        lines.append(b"00000000%04x %x 000000001000\n" % (i * 16, 2 * i + 1))
    sh = mmleak.Shrinker()
    sh.feed(iter(lines), "x")
    assert sh.state == {}


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_classic_sort_pipeline_matches_direct(tmp_path, v2):
    files, survivors, foreign = simulate(7, threads=3, events=5000, v2=v2)
    paths = []
    for name, lines in files.items():
        p = tmp_path / ("mmleak.4242.%d.out" % len(paths))
        p.write_bytes(b"".join(lines))
        paths.append(p)
    env = dict(os.environ, LC_ALL="C")
    shrinked = []
    for p in paths:
        srt = subprocess.run(["sort", "-s", "-k1,1", str(p)], capture_output=True, env=env,
                             check=True).stdout
        r = subprocess.run(MMLEAK_PY + ["shrink"], input=srt, capture_output=True, check=True)
        shrinked.append(r.stdout)
    srt = subprocess.run(["sort", "-s", "-k1,1"], input=b"".join(shrinked), capture_output=True,
                         env=env, check=True).stdout
    r = subprocess.run(MMLEAK_PY + ["shrink", "--final"], input=srt, capture_output=True)
    assert r.returncode == 0, r.stderr
    classic = [l + b"\n" for l in r.stdout.splitlines() if not l.startswith(b"#")]
    direct = subprocess.run(MMLEAK_PY + ["shrink", "--final"] + [str(p) for p in paths],
                            capture_output=True, check=True).stdout
    assert classic == [l + b"\n" for l in direct.splitlines() if not l.startswith(b"#")]
    assert {l for l in classic if len(l.split()) >= 5} == survivors
    assert {l for l in classic if len(l.split()) == 3} == foreign
    if v2:          # the stacks the survivors use are in the final text, each once
        stacks = [l for l in r.stdout.splitlines() if l.startswith(b"#s ")]
        used = {int(l.split(b"@")[1], 16) for l in survivors}
        assert sorted(stacks) == sorted(stack_line(i).rstrip(b"\n") for i in used)


def test_realloc_moves_a_block():
    # realloc(p) -> q: a free of p and an allocation of q, both numbered
    lines = [b"000000001000 0 10 0 000000002000\n",
             b"000000001000 1 000000002100\n",
             b"000000003000 0 20 0 000000002100\n"]
    surv, foreign = final_sets(lines)
    assert surv == {lines[2]} and foreign == set()


def test_parse_event_fields():
    a = mmleak.parse_event(b"7f0000001000 1f 1f4 3 55d000001234 55d000005678\n")
    assert a == mmleak.Alloc(0x7f0000001000, 0x1f, 500, 3, (0x55d000001234, 0x55d000005678))
    f = mmleak.parse_event(b"7f0000001000 20 55d000001234\n")
    assert f == mmleak.Free(0x7f0000001000, 0x20, 0x55d000001234)
    for bad in [b"7f0000001000 20 55d000001234", b"7f0000001000 20\n", b"7F00 1 2\n",
                b"7f00 1 2 3\n", b"zz 1 2\n", b"7f00 1 2 3 4 x\n", b"7f00  1 2\n",
                b"7f00 1_0 2\n", b"\0\0\0\n", b""]:
        assert mmleak.parse_event(bad) is None, bad


def run_shrink(tmp_path, data, *args):
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(data)
    return subprocess.run(MMLEAK_PY + ["shrink", "--final"] + list(args) + [str(p)],
                          capture_output=True), str(p)


GOOD = HDR % (1, 0) + b"000000001000 0 10 0 000000002000\n"


def test_torn_last_line_and_padding_are_not_errors(tmp_path):
    r, p = run_shrink(tmp_path, GOOD + b"000000003000 1 1" + b"\0" * 4000)
    assert r.returncode == 0
    assert r.stdout.endswith(b"000000001000 0 10 0 000000002000\n")
    assert r.stderr.decode().splitlines() == [
        "mmleak.py: %s:3: torn line (process killed while writing it?) ignored: "
        "b'000000003000 1 1'" % p]


def test_blank_padding_skipped_and_a_cut_one_at_the_end_is_padding(tmp_path):
    """Blank lines (mmleak.so pads a busy thread's flushes to a page boundary with one) are
    skipped without a word; part of one at the very end, without its newline (a process
    killed between its lines and their padding), is reported as padding, not as a torn
    line, and is not an error."""
    data = (GOOD + b" " * 99 + b"\n" + b"000000003000 1 20 0 000000002000\n" + b"\n"
            + b" " * 700)
    r, p = run_shrink(tmp_path, data)
    assert r.returncode == 0
    assert r.stdout.endswith(b"000000001000 0 10 0 000000002000\n"
                             b"000000003000 1 20 0 000000002000\n")
    assert r.stderr.decode().splitlines() == [
        "mmleak.py: %s:6: padding after the last line (the process did not exit cleanly); "
        "ignored" % p]


def test_garbage_lines_reported_with_line_numbers(tmp_path):
    data = GOOD + b"hello world\n" + b"000000004000 1 10 5\n" * 9 + b"000000005000 1 2 3 4 5 6 x\n"
    r, p = run_shrink(tmp_path, data)
    assert r.returncode == mmleak.EXIT_PARTIAL
    err = r.stderr.decode().splitlines()
    assert err[0] == "mmleak.py: %s:3: malformed line skipped: b'hello world\\n'" % p
    assert len(err) == 6                      # 5 shown, then a count of the rest
    assert err[-1] == ("mmleak.py: %s: 6 more lines with the same problem (malformed) not "
                       "shown" % p)
    assert b"000000001000 0 10 0 000000002000\n" in r.stdout   # the rest still processed
    assert b"Traceback" not in r.stderr


def test_missing_and_empty_files(tmp_path):
    (tmp_path / "empty.out").write_bytes(b"")
    r = subprocess.run(MMLEAK_PY + ["shrink", str(tmp_path / "empty.out"),
                                    str(tmp_path / "nope.out")], capture_output=True)
    assert r.returncode == mmleak.EXIT_INPUT
    assert r.stderr.decode() == ("mmleak.py: %s: cannot read: No such file or directory\n"
                                 % (tmp_path / "nope.out"))


def test_two_processes_mixed_is_refused(tmp_path):
    a = tmp_path / "mmleak.1.0.out"
    b = tmp_path / "mmleak.2.0.out"
    a.write_bytes(b"#mmleak 1 id=1 pid=1 tid=1 file=0 depth=1 start=1\n")
    b.write_bytes(b"#mmleak 1 id=2 pid=2 tid=2 file=0 depth=1 start=1\n")
    r = subprocess.run(MMLEAK_PY + ["shrink", str(a), str(b)], capture_output=True)
    assert r.returncode == mmleak.EXIT_INPUT
    assert r.stderr.decode().startswith("mmleak.py: files of different processes mixed: 1 (")


def test_unknown_format_version(tmp_path):
    r, p = run_shrink(tmp_path, b"#mmleak 7 id=1 pid=1\n")
    assert r.returncode == mmleak.EXIT_INPUT
    assert "dump format version 7" in r.stderr.decode()


def damage(rnd, data, op, i):
    """DATA (a bytearray) damaged at I: random bytes (OP 0), bytes cut out (1), NULs (2), or
    the end cut off (3)."""
    if op == 0:
        data[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 30)))
    elif op == 1:
        del data[i:i + rnd.randrange(1, 50)]
    elif op == 2:
        data[i:i] = b"\0" * rnd.randrange(1, 100)
    else:
        data = data[:i]
    return data


@pytest.mark.parametrize("seed", range(30))
def test_fuzzed_input_never_crashes(tmp_path, seed):
    rnd = random.Random(seed)
    files, _, _ = simulate(seed, events=300)
    data = bytearray(b"".join(next(iter(files.values()))))
    for _ in range(rnd.randrange(1, 20)):
        op = rnd.randrange(4)
        data = damage(rnd, data, op, rnd.randrange(len(data) + 1))
    r, _ = run_shrink(tmp_path, bytes(data))
    assert r.returncode in (0, mmleak.EXIT_PARTIAL, mmleak.EXIT_INPUT), r.stderr
    assert b"Traceback" not in r.stderr
    for line in r.stderr.decode().splitlines():
        assert line.startswith("mmleak.py: ")


def test_help_describes_exit_codes():
    r = subprocess.run(MMLEAK_PY + ["shrink", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "exit status:" in r.stdout and "--final" in r.stdout


def test_command_line_escapes_are_decoded():
    sh = mmleak.Shrinker()
    sh.feed(iter([HDR % (1, 0), b"#cmd perl -e print \"ok\\x5cn\" caf\\xc3\\xa9\n"]), "x")
    assert sh.cmd == 'perl -e print "ok\\n" caf\u00e9'
