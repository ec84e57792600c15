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
import subprocess
import sys
import time

import pytest

import test_shrink
from conftest import mmleak
from test_shrink_folds import HDR, completion_order, fold
from test_compact_levels import STACKS, History, TID, alive, runs, survivors   # noqa: F401

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
    h.batch(allocs=40, frees=300, churn=50)        # frees of the result's blocks
    alive[0] = False                               # (a backlog the rule leaves in a run)
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
    if first_point:     # 300 + 40 new blocks alive, 200 + 300 of the first point's freed
        assert got[-1].new[1] == 340 and got[-1].freed[1] == 500


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


# ---- the points taken while the trace runs --------------------------------------------------

class Running:
    """A running trace's dump files with a known truth: random allocations and frees over a
    small pool of addresses (reused, each address counting its own events), in files of
    their own threads, some left open (no "#end": read as they are, not folded) for a few
    passes, so that files complete out of order."""

    def __init__(self, d, rnd, pool=3000, tid=TID, start=1700000000):
        self.d, self.rnd, self.pool, self.tid = d, rnd, pool, tid
        self.head = (b"#mmleak 2 id=%s pid=%s tid=%%d file=%%d depth=auto start=%d\n"
                     % (tid.encode(), tid.encode(), start))
        self.live, self.seq, self.files, self.open = {}, {}, 0, []

    def batch(self, events):
        lines = []
        for _ in range(events):
            p = 0x10000 + 0x20 * self.rnd.randrange(self.pool)
            s = self.seq.get(p, -1) + 1
            self.seq[p] = s
            if p in self.live:
                del self.live[p]
                lines.append(b"%012x %x 402000\n" % (p, s))
            else:
                size, k = self.rnd.randint(1, 300), self.rnd.randrange(10)
                self.live[p] = (s, size, k)
                lines.append(b"%012x %x %x 1 @%x\n" % (p, s, size, 0x100 + k))
        n = self.files
        self.files += 1
        path = self.d / ("mmleak.%s.%d.out" % (self.tid, n))
        tmp = self.d.parent / path.name                 # (in whole: a reader may look)
        end = self.rnd.random() >= 0.3
        tmp.write_bytes(self.head % (100 + n, n) + STACKS + b"".join(lines) +
                        (b"#end\n" if end else b""))
        os.rename(tmp, path)
        if not end:
            self.open.append(path)          # completes later
        for q in [q for q in self.open if q != path and self.rnd.random() < 0.4]:
            with open(q, "ab") as f:
                f.write(b"#end\n")
            self.open.remove(q)

    def close_all(self):
        for q in self.open:
            with open(q, "ab") as f:
                f.write(b"#end\n")
        self.open = []

    def by_site(self):
        """{site key as read_series gives it: {(ptr, seq): size}}."""
        out = {}
        for p, (s, size, k) in self.live.items():
            out.setdefault((0x401000 + k, 0x402000), {})[(p, s)] = size
        return out


def last_point(t):
    return mmleak.read_series(t.series)[0][-1]


def truth_point(now, before):
    out = {}
    for site in set(now) | set(before or {}):
        a, b = now.get(site, {}), (before or {}).get(site, {})
        new = [z for i, z in a.items() if before is not None and i not in b]
        freed = [z for i, z in b.items() if i not in a]
        v = (sum(a.values()), len(a), sum(new), len(new), sum(freed), len(freed))
        if any(v):
            out[site] = v
    return out


@pytest.mark.parametrize("seed,every,lose", [(s, 1, False) for s in range(4)] +
                         [(s, 3, False) for s in range(4)] + [(9, 1, True), (10, 3, True)])
def test_running_points_from_the_levels_are_exact(tmp_path, alive, native, monkeypatch, seed,
                                                  every, lose):
    """A point at every pass of a running trace, or at every third (EVERY: merges between
    two points), files folded into runs, runs merged, merges into the result among them,
    (LOSE: the base lost after the fifth pass, as a compactor killed between a merge's
    rename and the base's leaves it: the next merge into the result writes it again),
    files still being written beside: every point, per site,
    is the truth's live bytes and blocks, and the blocks new and freed since the previous
    point; most points come from the levels (the base and the files beside the result, not
    the result read whole); the base is the result's own after every pass, never a stale
    one; and the trace's last point too."""
    monkeypatch.setattr(series, "SERIES_INTERVAL", 0.0)
    rnd = random.Random(seed)
    d = tmp_path / "d"
    d.mkdir()
    h = Running(d, rnd)
    calls = {"levels": 0, "whole": 0}
    real_sums, real_now = series.level_sums, series._live_now

    def counted_sums(*a):
        calls["levels"] += 1
        return real_sums(*a)

    def counted_now(*a, **k):
        calls["whole"] += 1
        return real_now(*a, **k)
    monkeypatch.setattr(series, "level_sums", counted_sums)
    monkeypatch.setattr(series, "_live_now", counted_now)
    real_merge, excluded = series.before_result_merge, []

    def counted_merge(*a, **k):
        token = real_merge(*a, **k)
        excluded.append(len(token["excl"][0]) if token and token["excl"] else 0)
        return token
    monkeypatch.setattr(series, "before_result_merge", counted_merge)
    t = mmleak.TraceFiles(str(d), TID)
    base = series.base_path(str(d), TID)
    h.batch(3000)
    before, results, points = None, set(), 0
    monkeypatch.setattr(mmleak.compact, "point_due", lambda *a: k % every == 0)
    for k in range(40):
        h.batch(rnd.choice([20, 60, 200]))
        (res,) = mmleak.compact_dir(str(d), TID)[1]
        results.add(os.stat(t.compact).st_ino)
        if lose and k == 5:
            os.unlink(base)
            lost = len(results)
        if k % every:
            assert res["point"] is None
            continue
        assert res["point"] is not None
        now = h.by_site()
        assert last_point(t).sites == truth_point(now, before), (seed, k)
        before = now
        points += 1
        if os.path.exists(base):                # the result's own base, or none
            assert series.load_base(str(d), TID, t.compact) is not None
    if lose:                                    # merged into the result since: a base again
        assert len(results) > lost and os.path.exists(base)
    assert len(results) >= 2                    # merges into the result happened
    assert any(excluded)                        # ... with blocks beside it since a point
    assert calls["levels"] >= points - 2 * len(results), calls
    h.close_all()
    alive[0] = False
    (res,) = mmleak.compact_dir(str(d), TID)[1]
    assert res["over"] and last_point(t).sites == truth_point(h.by_site(), before)
    assert not os.path.exists(base) and not os.path.exists(t.live)
    assert survivors(d) == {(p, s): size for p, (s, size, _) in h.live.items()}


def test_running_points_under_compact_follow(tmp_path):
    """`mmleak.py compact --follow` (a pass every 0.1 s, a point at every pass) over a running
    trace (its process a `sleep`), whose random batches are written while the test holds the
    trace's lock: every point sees the state after a known batch, and equals the truth site
    by site (live, new, freed), through merges into the result; the .live keeps partial
    keys, the base is the result's own whenever it is there; the last point too."""
    if mmleak.native._native_engine() is None:
        pytest.skip("no compiled shrinker")
    d = tmp_path / "d"
    d.mkdir()
    proc = subprocess.Popen(["sleep", "600"])
    comp = None
    try:
        tid = str(proc.pid)
        h = Running(d, random.Random(11), tid=tid, start=int(time.time()))
        t = mmleak.TraceFiles(str(d), tid)
        lock = mmleak.compact.TraceLock(str(d), tid)
        lock.__enter__()
        h.batch(3000)
        comp = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(mmleak.__file__),
                                                              "..", "mmleak.py"),
                                 "compact", "--follow", "--interval", "0.1", "--linger", "0.5",
                                 "--series-interval", "0", str(d)])
        states, results, partial = [], set(), 0
        for k in range(25):
            state, n = h.by_site(), len(states)
            lock.__exit__()
            deadline = time.monotonic() + 60
            while not os.path.exists(t.series) or \
                    len(mmleak.read_series(t.series)[0]) <= n:
                assert time.monotonic() < deadline and comp.poll() is None
                time.sleep(0.02)
            lock = mmleak.compact.TraceLock(str(d), tid)
            lock.__enter__()                    # no pass now: the points are all in
            got = len(mmleak.read_series(t.series)[0])
            states.extend([state] * (got - n))
            results.add(os.stat(t.compact).st_ino)
            if os.path.exists(series.base_path(str(d), tid)):
                assert series.load_base(str(d), tid, t.compact) is not None
            partial += b"\n#partial\n" in open(t.live, "rb").read().split(b"#keys ")[0]
            h.batch(rnd_size(k))
        h.close_all()
        states.append(h.by_site())
        proc.kill()                 # before the lock is let go: the next pass finds the
        proc.wait()                 # trace over and makes its one last point (a pass while
        lock.__exit__()             # it ran would make a point of its own, of this state)
        assert comp.wait(timeout=120) == 0
        points, _ = mmleak.read_series(t.series)
        assert len(points) == len(states)
        for i, pt in enumerate(points):
            assert pt.sites == truth_point(states[i], states[i - 1] if i else None), i
        assert len(results) >= 2 and partial >= 20
        assert not os.path.exists(t.live) and not os.path.exists(series.base_path(str(d), tid))
    finally:
        proc.kill()
        if comp is not None and comp.poll() is None:
            comp.kill()
            comp.wait()


def rnd_size(k):
    return (20, 60, 200, 400)[k % 4]


def test_a_partial_live_of_another_result_is_taken_as_lost(tmp_path, alive, native,
                                                           monkeypatch):
    """A compactor killed between a merge's rename and its update of the .live leaves keys
    of blocks beside another result: the next point does not count against them (they say
    nothing of the blocks the merge took in) but takes the .live as lost: every block alive
    counts as new, the previous point's as freed; its live bytes and blocks are exact."""
    monkeypatch.setattr(series, "SERIES_INTERVAL", 0.0)
    rnd = random.Random(5)
    d = tmp_path / "d"
    d.mkdir()
    h = Running(d, rnd)
    t = mmleak.TraceFiles(str(d), TID)
    h.batch(3000)
    mmleak.compact_dir(str(d), TID)
    h.batch(100)
    mmleak.compact_dir(str(d), TID)
    data = open(t.live, "rb").read()
    assert b"\n#partial\n" in data
    head, sep, rest = data.partition(b"#levels ")
    ident, _, rest = rest.partition(b"\n")
    fields = ident.split()
    fields[2] = b"%d" % (int(fields[2]) + 1)             # another size: another result
    with open(t.live, "wb") as f:
        f.write(head + sep + b" ".join(fields) + b"\n" + rest)
    before = last_point(t)
    h.batch(100)
    mmleak.compact_dir(str(d), TID)
    now = h.by_site()
    got = last_point(t)
    want = {k: v[:2] + v[:2] + tuple(before.sites.get(k, (0, 0))[:2])
            for k, v in truth_point(now, None).items()}
    for k, v in before.sites.items():
        want.setdefault(k, (0, 0, 0, 0) + v[:2])
    assert got.sites == want


def test_level_sums_skip_the_padding_of_files_being_written(tmp_path, native):
    """The files beside the result of a running trace hold padding (docs/format.rst): a line
    of spaces where a busy thread's flush ended on a page boundary, a run of NULs.  The
    levels still give the point, equal to one reading of all the files (mmleak_levels_pick
    failed with EINVAL on such a line, and every running point of a busy program read the
    whole live set again)."""
    checked = 0
    for seed in range(20):
        rnd = random.Random(1000 + seed)
        addrs = rnd.randint(1, 30)
        files, truth, _ = test_shrink.simulate(
            seed, threads=rnd.randint(2, 4), events=rnd.choice([200, 600]), addrs=addrs,
            buckets=rnd.randint(1, 3), preexisting=rnd.randint(0, addrs), v2=True)
        d = tmp_path / str(seed)
        d.mkdir()
        names = sorted(files)
        cut = max(1, len(names) // 2)
        result = fold(d, [_write(d, n, files[n]) for n in names[:cut]], "c1")
        beside = []
        for n in names[cut:]:
            body = list(files[n])
            for _ in range(3):          # padding at random line boundaries (not the header)
                i = rnd.randint(1, len(body))
                body.insert(i, rnd.choice([b" " * rnd.randint(1, 120) + b"\n",
                                           b"\0" * rnd.randint(1, 300),
                                           b" \t\r\n"]))     # (blank: ASCII whitespace)
            beside.append(str(_write(d, n, body, raw=True)))
        if not beside:
            continue
        base = full_sums([str(result)])
        got = series.level_sums(str(result), base, beside)
        assert got is not None, seed
        assert got[0] == full_sums(beside + [str(result)]), seed
        checked += 1
    assert checked >= 15


def _write(d, name, lines, raw=False):
    p = d / ("raw." + name if raw else name)
    p.write_bytes(b"".join(l if l.endswith(b"\n") or l.endswith(b"\0") else l + b"\n"
                           for l in lines))
    return p


def _spies(monkeypatch):
    """Record the readings of level_sums ([runs, readings, sorts] per call) and of
    _keys_beside ([both is alone, 0, sorts] per call)."""
    sums_calls, beside_calls, current = [], [], [None]
    real_sums, real_read, real_beside = series.level_sums, series._read_native, \
        series._keys_beside
    real_sort = mmleak.native.sorted_keys

    def sums(*a):
        current[0] = [len(a[2]), 0, 0]
        sums_calls.append(current[0])
        try:
            return real_sums(*a)
        finally:
            current[0] = None

    def read(*a):
        if current[0] is not None:
            current[0][1] += 1
        return real_read(*a)

    def beside(*a):
        current[0] = [a[0] is a[1], 0, 0]
        beside_calls.append(current[0])
        try:
            return real_beside(*a)
        finally:
            current[0] = None

    def sort(*a, **k):
        if current[0] is not None:
            current[0][2] += 1
        return real_sort(*a, **k)
    monkeypatch.setattr(series, "level_sums", sums)
    monkeypatch.setattr(series, "_read_native", read)
    monkeypatch.setattr(series, "_keys_beside", beside)
    monkeypatch.setattr(mmleak.native, "sorted_keys", sort)
    return sums_calls, beside_calls


def _point_is_the_truth(point, h, before, allocs, frees):
    now = dict(h.live)
    new = [z for k, z in now.items() if k not in before]
    freed = [z for k, z in before.items() if k not in now]
    assert point.live == (sum(now.values()), len(now))
    assert point.new == (sum(new), len(new)) and len(new) == allocs
    assert point.freed == (sum(freed), len(freed)) and len(freed) == frees


def _running_levels(tmp_path, monkeypatch):
    """A running trace: the result (100,000 blocks) with its base and a point, then run 1
    and a point whose keys are partial; the truth as that point saw it."""
    monkeypatch.setattr(series, "SERIES_INTERVAL", 0.0)
    h = History(tmp_path)
    h.batch(allocs=100000)
    mmleak.compact_dir(str(tmp_path), TID)          # the result, its base, a point
    h.batch(allocs=1000, frees=100)
    (res,) = mmleak.compact_dir(str(tmp_path), TID)[1]     # run 1; the point's keys partial
    assert runs(tmp_path) == ["mmleak.%s.compact.1" % TID] and res["point"] is not None
    return h, dict(h.live)


def test_the_last_point_without_runs_reads_its_lines_once(tmp_path, alive, native,
                                                          monkeypatch):
    """A running pass merges every run into the result, without a point (the .live's keys
    get the merged blocks as "#exclude"); the trace ends with nothing new: the last point
    comes from the levels, no run beside the result, the result's lines picked at the
    excluded addresses.  Those lines read with the runs and read alone are one reading:
    read once, and the keys beside the result (both minus alone) are none without sorting
    anything.  The point is exact (live, new, freed against the running point)."""
    h, before = _running_levels(tmp_path, monkeypatch)
    h.batch(allocs=30000, frees=300)
    monkeypatch.setattr(mmleak.compact, "point_due", lambda *a: False)
    (res,) = mmleak.compact_dir(str(tmp_path), TID)[1]
    assert res["merged"] == 2 and runs(tmp_path) == [] and res["point"] is None
    sums_calls, beside_calls = _spies(monkeypatch)
    alive[0] = False
    (res,) = mmleak.compact_dir(str(tmp_path), TID, levels=True)[1]     # as `run`'s last pass
    assert res["over"] and res["folded"] == 0 and res["point"] is not None
    assert [c[:2] for c in sums_calls] == [[0, 1]]
    assert [c[0] for c in beside_calls] == [True] and beside_calls[0][2] == 0
    _point_is_the_truth(res["point"], h, before, 30000, 300)
    assert survivors(tmp_path) == h.live


def test_the_last_pass_merging_into_the_result_makes_the_last_point_of_it(
        tmp_path, alive, native, monkeypatch):
    """`run`'s last pass (levels kept) whose rule merges every run into the result: the
    merge keeps its survivors (one reading), and the last point and the verdict's view are
    made of them, not from the levels again: no pick of the result's lines, before the
    merge (no new base for a trace over) or after it.  The point is exact (live, new,
    freed against the running point before it, whose keys were partial)."""
    h, before = _running_levels(tmp_path, monkeypatch)
    h.batch(allocs=30000, frees=300)
    sums_calls, beside_calls = _spies(monkeypatch)
    views = {}
    alive[0] = False
    (res,) = mmleak.compact_dir(str(tmp_path), TID, levels=True, view=True,
                                folded=lambda tid, v: views.update({tid: v}))[1]
    assert res["over"] and res["merged"] == 2 and runs(tmp_path) == []
    assert res["point"] is not None and views[TID] is not None
    assert sums_calls == [] and beside_calls == []
    _point_is_the_truth(res["point"], h, before, 30000, 300)
    sh, live = views[TID]
    assert {(b[0], b[1]): b[2] for b in live.native.sample(10 ** 6)} == h.live
    assert survivors(tmp_path) == h.live
