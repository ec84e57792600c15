"""Survivors as bytes, not objects (issue 19): the compiled shrinker's blocks (tools/shrink.c
mmleak_shrink_blocks) and their aggregation per (stack, kind) (tools/blocks.c) against the
Python reference (Shrinker.survivors, blocks.aggregate_allocs), on large random histories;
the kind hook a reachability scan will use; and the report's peak memory on a real program
with millions of live blocks (measured with wait4, no timing)."""
import collections
import os
import random
import re
import resource
import subprocess
import sys

import pytest

from conftest import LIB, ROOT, mmleak
from test_shrink import HDR, HDR2, STACKS, stack_line

from mmleaklib import blocks as mblocks

MMLEAK_PY = [sys.executable, os.path.join(ROOT, "mmleak.py")]


@pytest.fixture(scope="module", autouse=True)
def native_available(lib):
    mmleak.native._native = None
    assert mmleak.native._native_engine() is not None, mmleak.native._native_why


def history(seed, addrs=20000, events=120000, files=6):
    """A random history over many addresses, spread over FILES dump files of one process in
    any order: allocations (of format 2 with "@ID", and with one caller inline), frees, and
    frees of blocks allocated before tracing.  Returns ({name: lines}, survivors {line},
    foreign frees {line})."""
    rnd = random.Random(seed)
    seq = collections.Counter()
    live = {}
    pool = [0x55d000001000 + 0x30 * i for i in range(addrs)]
    for p in rnd.sample(pool, addrs // 50):
        live[p] = None
    free_now = [p for p in pool if p not in live]
    live_list = list(live)
    out = {"f%d" % i: [(HDR2 % (i, i))] + [stack_line(k) for k in sorted(STACKS)]
           for i in range(files)}
    foreign = set()
    for i in range(events):
        name = "f%d" % rnd.randrange(files)
        if live_list and (not free_now or rnd.random() < 0.45):
            j = rnd.randrange(len(live_list))
            p = live_list[j]
            live_list[j] = live_list[-1]
            live_list.pop()
            line = b"%012x %x %012x\n" % (p, seq[p], 0x55c000000000 + rnd.randrange(50))
            if live.pop(p) is None:
                foreign.add(line)
            free_now.append(p)
        else:
            j = rnd.randrange(len(free_now))
            p = free_now[j]
            free_now[j] = free_now[-1]
            free_now.pop()
            if rnd.random() < 0.5:
                line = b"%012x %x %x %x @%x\n" % (p, seq[p], rnd.randrange(1, 600), i // 5000,
                                                  rnd.choice(sorted(STACKS)))
            else:
                line = b"%012x %x %x %x %012x\n" % (p, seq[p], rnd.randrange(1, 600),
                                                    i // 5000, 0x55c000000000 + rnd.randrange(9))
            live[p] = line
            live_list.append(p)
        seq[p] += 1
        out[name].append(line)
    return out, {l for l in live.values() if l is not None}, foreign


def write(tmp_path, files):
    paths = []
    for i, lines in enumerate(files.values()):
        p = tmp_path / ("mmleak.4242.%d.out" % i)
        p.write_bytes(b"".join(lines))
        paths.append(str(p))
    return paths


def both(paths, monkeypatch):
    """(Python engine's Shrinker, native engine's with blocks)."""
    monkeypatch.setenv("MMLEAK_SHRINK", "python")
    py = mmleak.shrink_files(paths, blocks=True)
    monkeypatch.setenv("MMLEAK_SHRINK", "native")
    nat = mmleak.shrink_files(paths, blocks=True)
    assert py.native_blocks is None and nat.native_blocks is not None
    return py, nat


@pytest.mark.parametrize("seed", range(3))
def test_engines_identical_on_large_histories(tmp_path, monkeypatch, seed):
    files, survivors, foreign = history(seed)
    paths = write(tmp_path, files)
    py, nat = both(paths, monkeypatch)
    # the blocks are the survivors, exactly: every one in the native array, none in lines
    assert len(nat.native_blocks) == len(survivors) > 5000
    assert py.survivors() == nat.survivors()
    assert {a.ptr for a in nat.survivors()} == {int(l.split()[0], 16) for l in survivors}
    assert py.foreign_frees() == nat.foreign_frees()
    assert len(nat.foreign_frees()) == len(foreign)
    # the aggregates, with and without filters, equal the reference's on the same blocks
    rnd = random.Random(seed)
    alive = [(a.ptr, a.seq) for a in py.survivors()]
    exclude = set(rnd.sample(alive, len(alive) // 3)) | {(1, 2), (0x55d000001000, 99999)}
    for tmin, tmax, ex in ((0, mblocks.TIME_MAX, None), (5, 17, None), (3, 20, exclude),
                           (1, 0, exclude)):
        want = py.live().aggregate(tmin, tmax, ex)
        got = nat.live().aggregate(tmin, tmax, ex)
        assert got == want
        ref, tot = mblocks.aggregate_allocs(py.survivors(), tmin, tmax, ex)
        assert got[1] == tot
        assert sorted(g.callers for g in got[0]) == sorted(k[0] for k in ref)
        assert sum(g.blocks for g in got[0]) == tot.blocks
    # the report's site table from aggregates is leak_sites's on every block
    frames = {}
    groups, _, _ = nat.live().aggregate()
    for depth in (1, 3):
        assert mmleak.sites.sites_from_groups(((g.callers, g.kind, g[2:]) for g in groups), 40, depth,
                                              frames) == \
            mmleak.sites.leak_sites(py.survivors(), 40, depth, frames)


def test_kind_table_splits_the_aggregates(tmp_path, monkeypatch):
    """The hook of the reachability scan: a table {(ptr, seq): kind} splits every stack's
    aggregate by kind, in C as in the reference; blocks not in the table have kind None,
    and an entry whose SEQ differs (the address reused since) does not match."""
    lines = [HDR2 % (0, 0), stack_line(0x1000)]
    lines += [b"%012x %x %x %x @%x\n" % (0x55d000001000 + 0x40 * i, 3, 10 + i, i, 0x1000)
              for i in range(8)]
    lines += [b"%012x %x %x %x %012x\n" % (0x55d000002000 + 0x40 * i, 0, 100, 1, 0x55c000000042)
              for i in range(4)]
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(b"".join(lines))
    py, nat = both([str(p)], monkeypatch)
    kinds = {(0x55d000001000, 3): "definite", (0x55d000001040, 3): "definite",
             (0x55d000001080, 3): "indirect", (0x55d0000010c0, 4): "definite",   # wrong SEQ
             (0x55d000002000, 0): "reachable", (0x55d000002040, 0): "possible",
             (0x55d000009000, 0): "unknown"}                                   # not alive
    got, tot, _ = nat.live().aggregate(kinds=kinds)
    assert got == py.live().aggregate(kinds=kinds)[0]
    per = {(g.callers, g.kind): (g.blocks, g.bytes) for g in got}
    st, one = STACKS[0x1000], (0x55c000000042,)
    assert per == {(st, "definite"): (2, 10 + 11), (st, "indirect"): (1, 12),
                   (st, None): (5, sum(10 + i for i in range(3, 8))),
                   (one, "reachable"): (1, 100), (one, "possible"): (1, 100),
                   (one, None): (2, 200)}
    assert tot == mblocks.Totals(12, sum(10 + i for i in range(8)) + 400, 12,
                                 sum(10 + i for i in range(8)) + 400)


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled", "runs"])
def test_kinds_and_exclusions_are_found_whatever_the_blocks_order(tmp_path, monkeypatch,
                                                                  order):
    """tools/blocks.c looks each block up in the sorted kind and exclusion tables starting
    from where the last one was found (a galloping search: blocks of a result read whole
    come sorted); blocks in any order (the shrinker's table order, descending, in runs)
    must find exactly their entries: a key of the same address with another SEQ, or one
    between two blocks, never matches."""
    rnd = random.Random(order)
    addrs = [0x55d000001000 + 0x20 * i for i in range(6000)]
    blocks = [(p, rnd.choice((0, 2, 4)), rnd.randrange(1, 300)) for p in addrs]
    if order == "descending":
        blocks.reverse()
    elif order == "shuffled":
        rnd.shuffle(blocks)
    elif order == "runs":           # ascending runs, each starting anywhere
        cuts = sorted(rnd.sample(range(1, len(blocks)), 40))
        parts = [blocks[a:b] for a, b in zip([0] + cuts, cuts + [len(blocks)])]
        rnd.shuffle(parts)
        blocks = [b for part in parts for b in part]
    lines = [HDR2 % (0, 0), stack_line(0x1000), stack_line(0x1007)]
    for i, (ptr, seq, size) in enumerate(blocks):
        lines.append(b"%012x %x %x %x @%x\n" % (ptr, seq, size, i % 50,
                                                 0x1000 if ptr & 0x20 else 0x1007))
    p = tmp_path / "mmleak.4242.0.out"
    p.write_bytes(b"".join(lines))
    py, nat = both([str(p)], monkeypatch)
    kinds, exclude = {}, set()
    names = ("definite", "indirect", "possible", "reachable")
    for ptr, seq, _ in blocks:
        r = rnd.random()
        if r < 0.3:
            kinds[(ptr, seq)] = rnd.choice(names)
        elif r < 0.4:
            kinds[(ptr, seq + 1)] = "definite"      # the address, another SEQ: no match
        elif r < 0.5:
            kinds[(ptr + 8, seq)] = "definite"      # between two blocks: no match
        if rnd.random() < 0.2:
            exclude.add((ptr, seq))
        elif rnd.random() < 0.05:
            exclude.add((ptr, seq + 2))
    for ex in (None, exclude):
        got = nat.live().aggregate(kinds=kinds, exclude=ex)
        assert got == py.live().aggregate(kinds=kinds, exclude=ex)
        ref, tot = mblocks.aggregate_allocs(py.survivors(), exclude=ex, kinds=kinds)
        assert got[1] == tot
        assert {(g.callers, g.kind): g.blocks for g in got[0]} == \
            {k: v[0] for k, v in ref.items()}
        if ex is not None:
            assert got[2] == {k for k in exclude if k in {(b[0], b[1]) for b in blocks}}


def test_time_bounds_match_the_filters():
    """--since and --older-than as integer bounds, exactly as sites.keep_blocks decides."""
    allocs = [mmleak.Alloc(i, 0, 1, t, (1,)) for i, t in enumerate(range(0, 50))]
    for since, older in ((None, None), (10, None), (9.5, None), (None, 7), (None, 7.5),
                         (12.2, 30.1), (None, 60), (40, 20)):
        want = mmleak.sites.keep_blocks(allocs, 49, since, older)
        b = mblocks.time_bounds(49, since, older)
        got = [] if b is None else [a for a in allocs if b[0] <= a.time <= b[1]]
        assert got == want, (since, older)


def peak_rss_mb(argv, **kw):
    """Run ARGV in a child; (its peak RSS in MB from wait4, stdout)."""
    with open(kw.pop("out"), "wb") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.PIPE, **kw)
        _, status, ru = os.wait4(p.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, p.stderr.read()[-2000:]
    return ru.ru_maxrss / 1024.0


# The report's memory per live block (docs/performance.rst): the compiled shrinker's entry
# (56 bytes, turned into the 48-byte block in place), its line (40) and its index (4 to 11):
# about 100 bytes.  mmleak.py before issue 19 took 460 bytes per block here (1.38 GB for
# these 3 million: a Python object each).
BYTES_PER_BLOCK = 150
BASE_MB = 80


def test_report_memory_is_bounded_by_the_live_set(tmp_path, lib):
    """A real program with 3 million live blocks and 1,000 lost: `report --no-html` counts
    every one exactly, with its peak RSS under BASE_MB + BYTES_PER_BLOCK per block (issue
    19: was about 430 bytes per block, a Python object each)."""
    n, lost = 3000000, 1000
    exe = str(tmp_path / "live_heap")
    subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", exe,
                    os.path.join(ROOT, "bench", "live_heap.c")], check=True)
    d = tmp_path / "d"
    r = subprocess.run(MMLEAK_PY + ["run", "--keep-all", "-d", str(d), "--", exe, "-n", str(n),
                                    "-l", str(lost)], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "report.txt"
    mb = peak_rss_mb(MMLEAK_PY + ["report", "--no-html", "--show-reachable", str(d)],
                     out=str(out),
                     env=dict(os.environ, MMLEAK_SHRINK="native"))
    text = out.read_text()
    rows = {m.group(3): (int(m.group(1)), int(m.group(2))) for m in
            re.finditer(r"^\s+(\d+)\s+(\d+)\s+(?:\w+\s+)?(keep_one|lose_one)\b", text,
                        re.M)}
    assert rows == {"keep_one": (100 * n, n), "lose_one": (100 * lost, lost)}, text
    # the scan at exit (issue 20): the blocks lost from the lists are lost, the rest reachable
    assert re.search(r"^\s+100000\s+1000\s+definite\s+lose_one\b", text, re.M), text
    assert re.search(r"^\s+%d\s+%d\s+reachable\s+keep_one\b" % (100 * n, n), text,
                     re.M), text
    assert "in %d blocks not freed" % (n + lost) in text
    assert mb < BASE_MB + BYTES_PER_BLOCK * (n + lost) / 1e6, mb


def test_page_of_a_big_trace_is_drawn_from_aggregates_and_a_sample(tmp_path):
    """More survivors than the page samples (mmleak-panda.PAGE_SAMPLE): the page's table
    still has every count exact (from the aggregates), and its size does not depend on the
    block count (the same page size, within a few KB, for 30,000 and 60,000 blocks)."""
    exe = str(tmp_path / "live_heap")
    subprocess.run(["cc", "-O1", "-g", "-fno-omit-frame-pointer", "-o", exe,
                    os.path.join(ROOT, "bench", "live_heap.c")], check=True)
    sizes = []
    for n in (30000, 60000):
        d = tmp_path / ("d%d" % n)
        r = subprocess.run(MMLEAK_PY + ["run", "--keep-all", "-d", str(d), "--", exe, "-n",
                                        str(n), "-l", "7", "-s", "24"], capture_output=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        page = tmp_path / ("p%d.html" % n)
        r = subprocess.run(MMLEAK_PY + ["report", "-o", str(page), str(d)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        html = page.read_text()
        # the site table's rows: bytes and blocks of keep_one and lose_one, exactly
        for blocks in (n, 7):
            assert 'data-bytes="%d"' % (24 * blocks) in html
            assert 'data-v="%d">%s</td>' % (blocks, "{:,}".format(blocks)) in html
        assert "keep_one" in html and "lose_one" in html
        sizes.append(len(html))
    assert abs(sizes[1] - sizes[0]) < 8000, sizes
