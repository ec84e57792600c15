"""The series of a trace's live set (mmleaklib/series.py, issue 19): each point's NEW and
FREED per call site, on synthetic histories whose truth is known, with both engines; the
compiled one without a Python object per block."""
import os

import pytest

from conftest import mmleak
import test_shrink

TID = "4242"


def batches(tmp_path, seed, n):
    """A simulated history of format 2 (test_shrink.simulate) as dump files, split into N
    batches of files (the files a pass finds new)."""
    files, _, _ = test_shrink.simulate(seed, threads=4, events=6000, v2=True, addrs=400)
    names = sorted(files)
    out = []
    for i in range(n):
        out.append([files[k] for k in names[i::n]])
    return out


def truth(paths):
    """{(ptr, seq): (size, callers)} alive after PATHS, by the Python shrinker."""
    os.environ["MMLEAK_SHRINK"] = "python"
    try:
        sh = mmleak.shrink_files(paths)
        return {(a.ptr, a.seq): (a.size, a.callers) for a in sh.survivors()}
    finally:
        del os.environ["MMLEAK_SHRINK"]


def expected(prev, now):
    """{callers: (bytes, blocks, newb, newn, freedb, freedn)} by sets: NEW alive now and not
    at PREV, FREED alive at PREV and not now."""
    out = {}

    def add(k, i, size):
        v = out.setdefault(k, [0] * 6)
        v[i] += size
        v[i + 1] += 1
    for key, (size, callers) in now.items():
        add(callers, 0, size)
        if prev is not None and key not in prev:
            add(callers, 2, size)
    for key, (size, callers) in (prev or {}).items():
        if key not in now:
            add(callers, 4, size)
    return {k: tuple(v) for k, v in out.items()}


def points_of(tmp_path, seed, engine, monkeypatch, n=5, old_live_at=None):
    """Add the batches one by one to a dump directory, a point after each: the points read
    back, and the truth of each."""
    monkeypatch.setenv("MMLEAK_SHRINK", engine)
    monkeypatch.setattr(mmleak.series, "SERIES_SITES", 1000)
    d = tmp_path / engine
    d.mkdir()
    paths, truths = [], []
    for i, batch in enumerate(batches(tmp_path, seed, n)):
        for lines in batch:
            p = d / ("mmleak.%s.%d.out" % (TID, len(paths)))
            p.write_bytes(b"".join(lines))
            paths.append(str(p))
        truths.append(truth(paths))
        if old_live_at == i:
            old_live(str(d), truths[-2])
        mmleak.series.add_point(str(d), TID)
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(d), TID).series)
    return points, truths


def old_live(d, blocks):
    """Rewrite the .live as an older mmleak.py wrote it: its point's lines, then a line per
    block "PTR SEQ SIZE KEY" (KEY "@ID" for every block of an "@ID" line, even of a stack of
    one frame, which the series now keys by its caller)."""
    path = mmleak.TraceFiles(d, TID).live
    with open(path, "rb") as f:
        head = [l for l in iter(f.readline, b"") if l.startswith(b"#point ")
                or l.startswith(b"#keys")]
    head = [l for l in head if not l.startswith(b"#keys")]
    lines = [b"%x %x %x @%x\n" % (p, q, size, [k for k, v in test_shrink.STACKS.items()
                                                if v == c][0])
             for (p, q), (size, c) in blocks.items()]
    with open(path, "wb") as f:
        f.write(b"".join(head + lines))


@pytest.mark.parametrize("engine", ["native", "python"])
@pytest.mark.parametrize("seed", range(3))
def test_each_point_is_the_set_difference(tmp_path, monkeypatch, seed, engine):
    """Every point's per-site BYTES, BLOCKS, NEW and FREED are those of the sets of blocks
    alive at it and at the point before, exactly."""
    if engine == "native" and mmleak.native._native_engine() is None:
        pytest.skip("no compiled shrinker")
    points, truths = points_of(tmp_path, seed, engine, monkeypatch)
    assert len(points) == len(truths) == 5
    prev = None
    for pt, now in zip(points, truths):
        want = expected(prev, now)
        assert pt.sites == want
        assert pt.live == (sum(s for s, _ in now.values()), len(now))
        assert pt.new[1] == sum(v[3] for v in want.values())
        assert pt.freed[1] == sum(v[5] for v in want.values())
        prev = now
    assert any(pt.new[1] and pt.freed[1] for pt in points[1:])     # a history that moves


def test_the_engines_write_the_same_series(tmp_path, monkeypatch):
    if mmleak.native._native_engine() is None:
        pytest.skip("no compiled shrinker")
    a, _ = points_of(tmp_path, 7, "native", monkeypatch)
    b, _ = points_of(tmp_path, 7, "python", monkeypatch)
    assert [(p.time, p.live, p.new, p.freed, p.sites) for p in a] == \
        [(p.time, p.live, p.new, p.freed, p.sites) for p in b]


def test_the_compiled_engine_makes_no_object_per_block(tmp_path, monkeypatch):
    """A point reads the native blocks in C: iterating them (a Python tuple per block) or
    parsing their lines would fail here."""
    if mmleak.native._native_engine() is None:
        pytest.skip("no compiled shrinker")

    def refuse(*a, **k):
        raise AssertionError("a Python object per block")
    monkeypatch.setattr(mmleak.native.NativeBlocks, "__iter__", refuse)
    monkeypatch.setattr(mmleak.blocks.Live, "__iter__", refuse)
    points, truths = points_of(tmp_path, 1, "native", monkeypatch)
    assert [p.live[1] for p in points] == [len(t) for t in truths]


@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_live_file_of_an_older_mmleak_is_followed(tmp_path, monkeypatch, engine):
    """A .live left by an older mmleak.py (a text line per block) is read: the next point
    still follows exactly."""
    if engine == "native" and mmleak.native._native_engine() is None:
        pytest.skip("no compiled shrinker")
    points, truths = points_of(tmp_path, 2, engine, monkeypatch, old_live_at=2)
    prev = None
    for pt, now in zip(points, truths):
        assert pt.sites == expected(prev, now)
        prev = now


def big_trace(d, n, freed=0):
    """A dump file of N live blocks of format 2 (10 stacks), in D, the first FREED of them
    freed in a second file: the paths."""
    stacks = b"".join(b"#s %x %x %x\n" % (0x100 + k, 0x401000 + k, 0x402000) for k in range(10))
    hdr = test_shrink.HDR2 % (1, 0)
    a = d / ("mmleak.%s.0.out" % TID)
    a.write_bytes(hdr + stacks + b"".join(b"%012x 0 %x 1 @%x\n" % (0x10000 + 0x20 * i, 16 + i % 7,
                                                                  0x100 + i % 10)
                                          for i in range(n)) + b"#end\n")
    return a


def test_a_point_holds_bytes_not_objects_per_block(tmp_path, monkeypatch):
    """With the compiled engine, a point over 200,000 live blocks allocates less than 64
    bytes of Python memory per block (the sorted keys, 16 bytes, twice: the last point's and
    this one's); an object per block (a tuple, a dict entry, a bytes key) is well over 100."""
    import tracemalloc
    if mmleak.native._native_engine() is None:
        pytest.skip("no compiled shrinker")
    monkeypatch.setenv("MMLEAK_SHRINK", "native")
    n = 200000
    big_trace(tmp_path, n)
    peaks = []
    for _ in range(2):                  # the first point, and one against the first's table
        tracemalloc.start()
        pt = mmleak.series.add_point(str(tmp_path), TID)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert pt.live == (sum(16 + i % 7 for i in range(n)), n)
    assert pt.new == (0, 0) and pt.freed == (0, 0)
    assert max(peaks) < 64 * n, peaks
