"""The series' last point from a finished trace's levels (mmleaklib/series.py, level_sums;
issue 19): the result's base (its per-site sums, written by the fold that wrote it) plus,
at the addresses the newer runs touch, what all the levels leave minus what the result
alone left (tools/levels.c picks the result's lines there).  It must equal the point the
full reading of the trace makes, whatever the history: threads freeing each other's
blocks, addresses reused, blocks allocated before tracing, levels grouped and merged as
compaction groups them."""
import os
import random
import shutil

import pytest

import test_shrink
from conftest import mmleak
from test_shrink_folds import HDR, completion_order, fold
from test_compact_levels import History, TID, alive, runs, survivors   # noqa: F401

series = mmleak.series


@pytest.fixture
def native(lib, monkeypatch):
    monkeypatch.setenv("MMLEAK_SHRINK", "native")
    mmleak.native._native = None
    assert mmleak.native._native_engine() is not None, mmleak.native._native_why


def levels_of(tmp_path, rnd, files):
    """FILES folded as compaction folds them while the trace runs (test_shrink_folds's
    compaction_folds, without its last pass): [result, run, run...], and whether the
    result is still the first fold's (no merge rewrote it)."""
    order, paths = completion_order(tmp_path, rnd, files)
    levels, n = [], 0
    while order:
        k = rnd.randint(1, 4)
        done, order = [paths[x] for x in order[:k]], order[k:]
        n += 1
        levels.append(fold(tmp_path, done, "c%d" % n))
        if len(levels) > 2 and rnd.random() < 0.3:
            i = mmleak.compact._merge_start([p.stat().st_size for p in levels])
            if 0 < i < len(levels) - 1:     # (a merge into the result would change its base)
                levels[i:] = [fold(tmp_path, levels[i + 1:] + [levels[i]], "m%d" % n,
                                   stream_last=True)]
    return [str(p) for p in levels]


def full_sums(paths):
    sh, live = series._read_native(paths)
    sums, _ = series.site_sums(sh, live)
    return {k: v for k, v in sums.items() if v[1] or v[0]}


@pytest.mark.parametrize("chunk", range(3))
def test_level_sums_equal_the_full_reading(tmp_path, native, chunk):
    """Random histories (test_shrink.simulate), their files folded into a result and runs:
    the base of the result plus the runs' effect at their addresses is, site by site, what
    one reading of all the levels sums."""
    checked = 0
    for seed in range(40 * chunk, 40 * chunk + 40):
        rnd = random.Random(seed)
        addrs = rnd.randint(1, 30)
        files, truth, _ = test_shrink.simulate(
            seed, threads=rnd.randint(2, 5), events=rnd.choice([200, 600, 1500]), addrs=addrs,
            buckets=rnd.randint(1, 3), preexisting=rnd.randint(0, addrs), v2=rnd.random() < 0.5)
        per = rnd.choice([5, 20, 80])
        small = {}
        for name, lines in files.items():
            t = int(name[1:].split(".")[0])
            head = [l for l in lines[1:] if l.startswith(b"#s ")]
            body = [l for l in lines[1:] if not l.startswith(b"#")]
            for j in range(0, len(body), per):
                small["t%d.%d" % (t, len(small))] = \
                    [HDR % (t, len(small))] + head + body[j:j + per]
        d = tmp_path / str(seed)
        d.mkdir()
        levels = levels_of(d, rnd, small)
        if len(levels) < 2:
            continue
        base = full_sums(levels[:1])            # the result read alone, as its fold read it
        got = series.level_sums(levels[0], base, levels[1:])
        assert got is not None
        want = full_sums(levels[1:] + levels[:1])
        assert got[0] == want, seed
        # and the truth's live bytes and blocks
        assert sum(v[0] for v in want.values()) == sum(int(l.split()[2], 16) for l in truth)
        assert sum(v[1] for v in want.values()) == len(truth)
        checked += 1
    assert checked > 30


@pytest.mark.parametrize("first_point", [False, True])
def test_runs_last_point_comes_from_the_levels(tmp_path, alive, native, monkeypatch,
                                               first_point):
    """`run`'s compactor (views off): the first fold writes the result's base, the last
    pass folds the files left into a run and makes the last point from the levels, without
    reading the result whole; the series is the one the full reading makes (a copy of the
    same state, the levels path switched off), and the base is gone with the trace.
    FIRST_POINT: the first pass made a point too (its .live names the result it saw): the
    last point's NEW and FREED are counted against it."""
    d = tmp_path / "levels"
    d.mkdir()
    h = History(d)
    h.batch(allocs=6000, churn=400)
    (res,) = mmleak.compact_dir(str(d), TID, stopping=lambda: not first_point)[1]
    base = series.base_path(str(d), TID)
    assert res["folded"] == 1 and os.path.exists(base)
    assert os.path.exists(mmleak.TraceFiles(str(d), TID).series) == first_point
    h.batch(allocs=300, frees=200, churn=200)
    h.batch(allocs=40, frees=800, churn=50)        # frees of the result's blocks
    alive[0] = False
    full = tmp_path / "full"
    shutil.copytree(d, full)
    used, read_whole = [], []
    real_sums, real_now = series.level_sums, series._live_now
    monkeypatch.setattr(series, "level_sums", lambda *a: used.append(1) or real_sums(*a))
    monkeypatch.setattr(series, "_live_now",
                        lambda *a, **k: read_whole.append(1) or real_now(*a, **k))

    def last_pass(where):
        c = mmleak.compact.BackgroundCompactor(str(where), set(), interval=3600.0)
        c.start()
        c.finish(overlap=True)
        c.join()
    last_pass(d)
    assert used == [1] and read_whole == []
    assert runs(d) and not os.path.exists(base)
    assert survivors(d) == h.live
    monkeypatch.setattr(series, "incremental_ready", lambda *a: None)
    last_pass(full)
    assert read_whole
    got, want = [mmleak.read_series(mmleak.TraceFiles(str(x), TID).series)[0] for x in (d, full)]
    assert [p._replace(unix=0) for p in got] == [p._replace(unix=0) for p in want]
    assert got[-1].live == (sum(h.live.values()), len(h.live))
    assert len(got) == 1 + first_point
    if first_point:     # 300 + 40 new blocks alive, 200 + 800 of the first point's freed
        assert got[-1].new[1] == 340 and got[-1].freed[1] == 1000


@pytest.mark.parametrize("damage", ["missing", "stale", "cut"])
def test_a_base_that_is_not_the_results_is_not_used(tmp_path, alive, native, damage):
    """A compactor killed between the result's rename and its base's (no base), a base
    of an earlier result (a merge since, another mmleak.py), a base cut short: the last
    point reads the trace whole, and is right."""
    d = tmp_path / "levels"
    d.mkdir()
    h = History(d)
    h.batch(allocs=3000, churn=100)
    mmleak.compact_dir(str(d), TID, stopping=lambda: True)
    base = series.base_path(str(d), TID)
    if damage == "missing":
        os.unlink(base)
    elif damage == "stale":
        cpath = mmleak.TraceFiles(str(d), TID).compact
        data = open(cpath, "rb").read()
        os.unlink(cpath)
        with open(cpath, "wb") as f:            # the same lines, another file
            f.write(data)
    else:
        data = open(base, "rb").read()
        with open(base, "wb") as f:
            f.write(data[:-6])
    assert series.load_base(str(d), TID, mmleak.TraceFiles(str(d), TID).compact) is None
    h.batch(allocs=40, frees=700, churn=50)
    alive[0] = False
    c = mmleak.compact.BackgroundCompactor(str(d), set(), interval=3600.0)
    c.start()
    c.finish(overlap=True)
    c.join()
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(d), TID).series)
    assert points[-1].live == (sum(h.live.values()), len(h.live))
    assert not os.path.exists(base)
