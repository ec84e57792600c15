"""Compaction in levels (issue 19): the result is mmleak.ID.compact and newer, smaller runs
mmleak.ID.compact.N, so that a pass costs what its new files hold, not the live set; exact
after every pass and after a pass stopped anywhere; everything in mmleak.ID.compact once
the trace is over.  Synthetic dump files whose truth is known; the work of a pass is read
from the counts the engine returns (lines read and written), never from time."""
import os

import pytest

from conftest import mmleak
import test_shrink

TID = "4242"
STACKS = b"".join(b"#s %x %x %x\n" % (0x100 + k, 0x401000 + k, 0x402000) for k in range(10))


class History:
    """Dump files of trace TID written batch by batch, and the blocks alive by the truth:
    {(ptr, seq): size}.  Every address counts its own events (seq)."""

    def __init__(self, d):
        self.d, self.files, self.live, self.seq = d, 0, {}, {}

    def batch(self, allocs=0, frees=0, first=0x10000, churn=0):
        """A dump file: FREES of the live blocks, ALLOCS new ones, and CHURN blocks
        allocated and freed in it (at addresses of their own, reused batch after batch)."""
        lines = []
        for i in range(churn):
            p = 0x7f0000000000 + 0x20 * i
            s = self.seq.get(p, -1) + 1
            self.seq[p] = s + 1
            lines.append(b"%012x %x %x 1 @%x\n" % (p, s, 16 + i % 7, 0x100 + i % 10))
            lines.append(b"%012x %x 402000\n" % (p, s + 1))
        for ptr in sorted(self.live)[:frees]:
            p, _ = ptr
            s = self.seq[p] = self.seq[p] + 1
            lines.append(b"%012x %x 402000\n" % (p, s))
            del self.live[ptr]
        base = first + 0x20 * len(self.seq)
        for i in range(allocs):
            p = base + 0x20 * i
            self.seq[p] = 0
            self.live[(p, 0)] = 16 + i % 7
            lines.append(b"%012x 0 %x 1 @%x\n" % (p, 16 + i % 7, 0x100 + i % 10))
        path = self.d / ("mmleak.%s.%d.out" % (TID, self.files))
        path.write_bytes(test_shrink.HDR2 % (1, self.files) + STACKS + b"".join(lines) +
                         b"#end\n")
        self.files += 1
        return len(lines)


def survivors(d):
    sh = mmleak.shrink_files(mmleak.find_traces(str(d))[TID])
    assert not sh.problems.fatal and not sh.problems.malformed
    assert not [k for k in sh.problems.counts if k[1] == "duplicate"]
    return {(a.ptr, a.seq): a.size for a in sh.survivors()}


@pytest.fixture
def alive(monkeypatch):
    """The trace's process is alive (state[0]) or over: the test says which."""
    state = [True]
    monkeypatch.setattr(mmleak.compact, "trace_alive", lambda *a, **k: state[0])
    return state


def one_pass(d):
    (res,) = mmleak.compact_dir(str(d), TID, series=False)[1]
    return res


def runs(d):
    return sorted(n for n in os.listdir(d) if ".compact." in n and not n.endswith(".tmp"))


LIVE = 25000


def test_a_pass_costs_what_its_new_files_hold(tmp_path, alive):
    """Over a folded live set of 25,000 blocks, passes of 100 new events each read and
    write lines in proportion to those (the runs they merge included: a few times the
    batch, amortized), never the live set;
    every count stays exact, and the trace's end puts everything into mmleak.ID.compact.
    (25,000: five times the biggest merge allowed below, so one pass that read the live set
    fails it; every pass's exact check reads the whole live set, hence not 100,000.)"""
    h = History(tmp_path)
    n = h.batch(allocs=LIVE)
    res = one_pass(tmp_path)
    assert (res["read"], res["written"], res["runs"]) == (n, n, 0)
    reads = []
    for k in range(30):
        n = h.batch(allocs=50, frees=50)
        assert n == 100
        res = one_pass(tmp_path)
        assert res["folded"] == 1
        reads.append(res["read"])
        assert res["written"] <= res["read"], (k, res)
        assert survivors(tmp_path) == h.live
    assert reads[0] == 100 and res["runs"] >= 1
    assert reads.count(100) >= 5            # a pass that merges nothing reads its batch
    assert max(reads) <= 5000               # the biggest merge: the runs, never the base
    assert sum(reads) <= 30 * 100 * 7       # amortized: each line merged a few times
    alive[0] = False
    res = one_pass(tmp_path)
    assert res["over"] and res["runs"] == 0 and runs(tmp_path) == []
    assert survivors(tmp_path) == h.live
    assert len(h.live) == LIVE + 30 * 50 - 30 * 50


def test_a_pass_of_freed_blocks_does_not_rewrite_the_live_set(tmp_path, alive):
    """A daemon's files hold mostly blocks allocated and freed (they leave nothing), a few
    more live blocks each: however big those files are beside the folded live set, a pass
    reads them and the small runs, never the live set (the merge rule goes by what the new
    files leave, not by their size: it went by their size and merged the live set again at
    every pass of such a load, seen in bench/run.py --long with a million live blocks)."""
    h = History(tmp_path)
    n = h.batch(allocs=40000)
    res = one_pass(tmp_path)
    assert (res["read"], res["written"], res["runs"]) == (n, n, 0)
    for k in range(12):
        n = h.batch(allocs=20, churn=15000)        # a file as big as the live set's
        assert n == 30020
        res = one_pass(tmp_path)
        assert res["folded"] == 1
        assert res["read"] < n + 1000, (k, res)     # its file and the small runs only
        assert res["written"] < 1000, (k, res)
        assert survivors(tmp_path) == h.live
    alive[0] = False
    res = one_pass(tmp_path)
    assert res["over"] and res["runs"] == 0 and runs(tmp_path) == []
    assert survivors(tmp_path) == h.live and len(h.live) == 40000 + 12 * 20


@pytest.mark.parametrize("stop", ["write", "delete"])
def test_a_merge_stopped_anywhere_loses_and_doubles_nothing(tmp_path, alive, monkeypatch,
                                                            stop):
    """A pass that merges runs, stopped before its rename or after it but before deleting
    the merged run: readers see every block once, the next pass cleans up, and a run name
    still named as folded is never given to a new run."""
    h = History(tmp_path)
    h.batch(allocs=20000)
    one_pass(tmp_path)
    h.batch(allocs=30, frees=10)
    one_pass(tmp_path)                              # run 1
    assert runs(tmp_path) == ["mmleak.%s.compact.1" % TID]
    h.batch(allocs=30, frees=10)

    class Stop(Exception):
        pass
    real_replace, real_remove = mmleak.files.replace, mmleak.compact._remove_dump
    with monkeypatch.context() as m:
        if stop == "write":
            def replace(path, fill, sync=False, guard=None):
                raise Stop()
            m.setattr(mmleak.files, "replace", replace)
        else:
            def remove(p):
                raise Stop()
            m.setattr(mmleak.compact, "_remove_dump", remove)
        with pytest.raises(Stop):
            one_pass(tmp_path)                      # folds the batch into run 1
    assert survivors(tmp_path) == h.live
    left = runs(tmp_path)
    assert left == ["mmleak.%s.compact.1" % TID]
    h.batch(allocs=5)
    res = one_pass(tmp_path)
    assert survivors(tmp_path) == h.live
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".out") and
                os.path.basename(n) != "mmleak.%s.%d.out" % (TID, h.files - 1)] or res
    alive[0] = False
    one_pass(tmp_path)
    assert runs(tmp_path) == [] and survivors(tmp_path) == h.live
    assert [n for n in os.listdir(tmp_path) if n.endswith(".out")] == []


def test_a_stale_folded_run_name_is_not_reused(tmp_path, alive, monkeypatch):
    """Run 2 and the new run 3 merged into run 1, the pass stopped before deleting run 2:
    run 1 names both as folded.  Readers leave them out; the next pass deletes them and
    numbers its new run 4, not 2 or 3."""
    h = History(tmp_path)
    h.batch(allocs=100000)
    one_pass(tmp_path)
    h.batch(allocs=400)
    one_pass(tmp_path)                              # run 1 (400 lines)
    h.batch(allocs=4)
    one_pass(tmp_path)                              # run 2 (4 lines)
    assert runs(tmp_path) == ["mmleak.%s.compact.%d" % (TID, n) for n in (1, 2)]
    h.batch(allocs=100)                             # run 3, merged with run 2 into run 1

    class Stop(Exception):
        pass

    def remove(p):
        if p.endswith(".compact.2"):
            raise Stop()
        return real(p)
    real = mmleak.compact._remove_dump
    with monkeypatch.context() as m:
        m.setattr(mmleak.compact, "_remove_dump", remove)
        with pytest.raises(Stop):
            one_pass(tmp_path)
    assert runs(tmp_path) == ["mmleak.%s.compact.%d" % (TID, n) for n in (1, 2, 3)]
    assert survivors(tmp_path) == h.live            # runs 2 and 3 left out: run 1 has them
    h.batch(allocs=2)
    one_pass(tmp_path)
    assert runs(tmp_path) == ["mmleak.%s.compact.%d" % (TID, n) for n in (1, 4)]
    assert survivors(tmp_path) == h.live


def test_a_run_of_somebody_else_is_neither_read_nor_trusted(tmp_path, alive, capsys):
    """A file at a run's name that is not the trace owner's (anybody may write to /tmp):
    its blocks and its "#folded" lines are ignored, and the pass's run takes its place."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a file to another user")
    h = History(tmp_path)
    h.batch(allocs=1000)
    one_pass(tmp_path)
    fake = tmp_path / ("mmleak.%s.compact.1" % TID)
    fake.write_bytes(test_shrink.HDR2 % (9, 9) + b"#folded mmleak.%s.1.out\n" % TID.encode() +
                     b"0000dead0000 0 40 1 @100\n")
    os.chown(fake, 65534, 65534)
    h.batch(allocs=3)
    one_pass(tmp_path)
    assert survivors(tmp_path) == h.live
    assert os.stat(fake).st_uid == os.getuid()      # replaced by the pass's run
    assert "compact.1" in capsys.readouterr().err


def _reader_fields(sh):
    """What a report takes of a Shrinker besides its survivors."""
    return {"history": sh.history(), "max_time": sh.max_time, "clock": sh.clock,
            "headers": sh.headers, "header_lines": sh.header_lines, "stacks": sh.stacks,
            "stack_lines": sh.stack_lines, "cmd": sh.cmd, "title": sh.title,
            "alloc": sh.alloc, "suppressions": sh.program_suppressions,
            "compacted": sh.compacted, "gaps": sh.gaps(), "events": sh.events,
            "allocs": sh.allocs, "frees": sh.frees, "files_done": sh.files_done,
            "foreign": sh.foreign_frees(), "malformed": sh.problems.malformed,
            "fatal": sh.problems.fatal}


@pytest.mark.parametrize("foreign", [False, True])
def test_the_last_pass_gives_what_a_reader_of_the_trace_gets(tmp_path, alive, foreign):
    """`run --check` takes its verdict from the last pass's reading (compact._result_view),
    not from a third reading of the trace: it must be exactly what report's reading of the
    result gives (counts, history, headers, stacks, survivors per site).  A result with a
    foreign free (a free line the report lists) gives no view: the trace is read."""
    from mmleaklib import native
    if native._shrink_engine() != "native":
        pytest.skip("the compiled shrinker is not built")
    h = History(tmp_path)
    events = h.batch(allocs=3000, churn=500)
    one_pass(tmp_path)
    events += h.batch(allocs=200, frees=700, churn=300)
    one_pass(tmp_path)
    events += h.batch(allocs=100, frees=50, churn=100)
    if foreign:                 # a free of a block allocated before the trace began
        p = tmp_path / ("mmleak.%s.%d.out" % (TID, h.files - 1))
        data = p.read_bytes()
        p.write_bytes(data[:-len(b"#end\n")] + b"%012x 5 402000\n#end\n" % 0x6f0000000000)
    alive[0] = False
    got = {}
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False,
                                folded=lambda tid, view: got.setdefault(tid, view))[1]
    assert res["over"] and runs(tmp_path) == []
    view = got[TID]
    sh, paths = mmleak.compact.read_trace(str(tmp_path), TID, blocks=True)
    assert [os.path.basename(p) for p in paths] == ["mmleak.%s.compact" % TID]
    if foreign:
        assert view is None and len(sh.foreign_frees()) == 1
        return
    vsh, vlive = view
    assert _reader_fields(vsh) == _reader_fields(sh)
    assert vsh.history()["events"] == events
    live = sh.live()
    assert len(vlive) == len(live) == len(h.live)
    assert sorted((a.ptr, a.seq, a.size, a.time, a.callers) for a in vlive) == \
        sorted((a.ptr, a.seq, a.size, a.time, a.callers) for a in live)
    g1, t1, _ = vlive.aggregate()
    g2, t2, _ = live.aggregate()
    assert t1 == t2 and [tuple(g) for g in g1] == [tuple(g) for g in g2]


def test_a_trace_folded_already_is_read_once_for_its_last_point_and_verdict(tmp_path, alive,
                                                                            monkeypatch):
    """The last pass of a trace whose files were all folded before it ended (nothing left
    to fold: `run`'s pass under way when the program exited took them) reads the trace
    once, for its last point and for `run --check`'s verdict (compact_dir VIEW) both: the
    point and the view are what a reader gets."""
    h = History(tmp_path)
    h.batch(allocs=2000, churn=300)
    h.batch(allocs=100, frees=400, churn=100)
    one_pass(tmp_path)                      # everything in mmleak.ID.compact
    assert runs(tmp_path) == [] and not [n for n in os.listdir(tmp_path)
                                         if n.endswith(".out")]
    alive[0] = False
    reads = []
    real = mmleak.series._live_now

    def counted(*a, **k):
        reads.append(a)
        return real(*a, **k)
    monkeypatch.setattr(mmleak.series, "_live_now", counted)
    got = {}
    (res,) = mmleak.compact_dir(str(tmp_path), TID, view=True,
                                folded=lambda tid, view: got.setdefault(tid, view))[1]
    assert res["over"] and res["folded"] == 0 and res["point"] is not None
    assert len(reads) == 1
    monkeypatch.undo()
    vsh, vlive = got[TID]
    sh, _ = mmleak.compact.read_trace(str(tmp_path), TID, blocks=True)
    assert _reader_fields(vsh) == _reader_fields(sh)
    assert sorted((a.ptr, a.seq) for a in vlive) == sorted(h.live)
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(tmp_path), TID).series)
    assert points[-1].live == (sum(h.live.values()), len(h.live))


def _shrink_both(monkeypatch, capsys, tmp_path, inputs):
    """shrink_raw of INPUTS the usual way and with the last one streamed
    (mmleak_shrink_merge): everything a caller gets from each, and how often the merge
    ran."""
    from mmleaklib import native
    calls = []
    real = native._blocks_api["merge"]

    def merge(*a):
        calls.append(a)
        return real(*a)
    monkeypatch.setitem(native._blocks_api, "merge", merge)
    got = []
    for stream in (False, True):
        with open(tmp_path / ("raw%d" % stream), "w+b") as raw:
            sh, data = mmleak.shrink.shrink_raw(inputs, out=raw, live=True, stream_last=stream)
            assert data is None
            raw.seek(0)
            body = raw.read()
        got.append({"body": body, "err": capsys.readouterr().err,
                    "headers": sh.header_lines, "events": sh.events, "allocs": sh.allocs,
                    "max_time": sh.max_time, "files_done": sh.files_done,
                    "lines": sh.result_lines, "raw": sh.raw_result,
                    "counts": dict(sh.problems.counts), "malformed": sh.problems.malformed,
                    "blocks": None if sh.native_blocks is None else list(sh.native_blocks)})
    return got, len(calls)


@pytest.mark.parametrize("v2", [True, False])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sorted_", [True, False])
def test_a_streamed_result_is_merged_exactly(tmp_path, monkeypatch, capsys, seed, v2,
                                             sorted_):
    """The last fold streams the biggest input, a compacted result (sorted by address),
    and merges it with the others' state (tools/shrink_merge.c, mmleak_shrink_merge): the result
    written, its survivors as blocks, every count, header line and problem message are
    those of the usual reading of the same inputs, and the Python engine's lines.  A
    result that is not sorted (lines reordered by hand, two malformed lines in it) is read
    again the usual way: the same again, no message said twice."""
    from mmleaklib import native
    if native._shrink_engine() != "native":
        pytest.skip("the compiled shrinker is not built")
    files, _, _ = test_shrink.simulate(seed, threads=4, events=20000, addrs=400, v2=v2)
    paths = []
    for lines in files.values():
        p = tmp_path / ("mmleak.4242.%d.out" % len(paths))
        p.write_bytes(b"".join(lines))
        paths.append(str(p))
    half = len(paths) // 2
    part = tmp_path / "part"
    with open(tmp_path / "partraw", "w+b") as raw:
        sh, _ = mmleak.shrink.shrink_raw(paths[:half], out=raw)
        raw.seek(0)
        events = raw.read().splitlines(keepends=True)
    assert len(events) > 100 and events == sorted(
        events, key=lambda l: (int(l.split()[0], 16), int(l.split()[1], 16)))
    if not sorted_:
        events = events[::-1] + [b"zz not an event\n", b"zz nor this\n"]
    part.write_bytes(b"".join(sh.header_lines) + b"".join(
        sh.stack_lines[i] for i in sorted(sh.stack_lines)) + b"".join(events))
    inputs = paths[half:] + [str(part)]
    (usual, streamed), merges = _shrink_both(monkeypatch, capsys, tmp_path, inputs)
    assert merges == 1
    assert streamed == usual
    assert usual["events"] > 1000 and usual["lines"][0] > 50
    assert usual["blocks"] is not None or not v2
    if not sorted_:
        assert usual["malformed"] and usual["err"].count("zz not an event") == 1
    monkeypatch.setenv("MMLEAK_SHRINK", "python")
    sh, data = mmleak.shrink.shrink_raw(inputs, out=None)
    assert data == usual["body"]
    # the final reading (a point of the series, a report) streams it the same way
    finals = []
    monkeypatch.setenv("MMLEAK_SHRINK", "native")
    capsys.readouterr()
    for stream in (False, True):
        sh = mmleak.shrink.Shrinker()
        assert native.native_shrink(sh, inputs, blocks=True, stream_last=stream)
        finals.append({"blocks": sorted(sh.native_blocks), "state": sorted(sh.state.items()),
                       "events": sh.events, "allocs": sh.allocs, "max_time": sh.max_time,
                       "counts": dict(sh.problems.counts), "headers": sh.header_lines,
                       "err": capsys.readouterr().err, "lines": sh.result_lines})
    assert finals[1] == finals[0]
    assert len(finals[0]["blocks"]) >= 5


def test_the_results_header_is_the_traces_first_whatever_the_order_read(tmp_path, alive):
    """The last fold reads the result last (streamed): the result's '#mmleak' line is still
    the trace's first (the result's own), not that of a new file read before it (here the
    process's late=1 file)."""
    h = History(tmp_path)
    h.batch(allocs=500)
    one_pass(tmp_path)
    h.batch(allocs=20, frees=10)
    p = tmp_path / ("mmleak.%s.%d.out" % (TID, h.files - 1))
    data = p.read_bytes()
    first = data.split(b"\n", 1)[0]
    p.write_bytes(first.replace(b" start=", b" late=1 start=") + b"\n" + data.split(b"\n", 1)[1])
    alive[0] = False
    res = one_pass(tmp_path)
    assert res["over"] and runs(tmp_path) == []
    with open(mmleak.TraceFiles(str(tmp_path), TID).compact, "rb") as f:
        hdr = [l for l in f.read(1 << 16).splitlines() if l.startswith(b"#mmleak ")]
    assert len(hdr) == 1 and b"late=" not in hdr[0] and b"file=" not in hdr[0], hdr
    assert survivors(tmp_path) == h.live


def _undefined_stacks(d):
    """{file name: the stack ids its allocation lines use that no '#s' line of it defines},
    over the trace's result and runs (a reader takes a block's stack from its own file)."""
    out = {}
    for n in sorted(os.listdir(d)):
        if ".compact" not in n or n.endswith(".tmp"):
            continue
        refs, defs = set(), set()
        with open(os.path.join(d, n), "rb") as f:
            for line in f:
                if line.startswith(b"#s "):
                    defs.add(int(line.split()[1], 16))
                elif not line.startswith(b"#") and b" @" in line:
                    refs.add(int(line.rsplit(b"@", 1)[1], 16))
        if refs - defs or not refs:
            out[n] = sorted(refs - defs) if refs else "no stack used"
    return out


def test_every_stack_a_streamed_result_uses_is_in_it(tmp_path, alive):
    """The last fold streams the result and frees each line once written; the stack of each
    survivor must still be in the file.  The writer skipped the lookup of a stack reference
    equal to the last line's by comparing the text at the last line's address, freed by then
    and reused by the next line: every block whose stack differed from its neighbour's lost
    it ('0x0' in the report; seen first in a systemd test).  Here the 13 survivors' stacks
    all differ from their neighbours'."""
    h = History(tmp_path)
    h.batch(allocs=13)
    one_pass(tmp_path)
    h.batch(churn=50)
    alive[0] = False
    res = one_pass(tmp_path)
    assert res["over"] and runs(tmp_path) == []
    assert _undefined_stacks(tmp_path) == {}
    assert survivors(tmp_path) == h.live


def test_a_merge_abandoned_as_it_reads_leaves_the_levels_valid(tmp_path, alive):
    """`run`'s compactor, once its program has ended, gives up a merge of levels under way
    (compact_dir ABANDON: the compiled shrinker asks it every 65,536 lines it reads) rather
    than have the last pass wait for it: the new files' run is written, the merge's inputs
    stay as they were (nothing renamed, nothing deleted, no temporary file left), every
    count is exact, and the last pass folds everything into mmleak.ID.compact."""
    from mmleaklib import native
    if native._shrink_engine() != "native":
        pytest.skip("the compiled shrinker is not built")
    h = History(tmp_path)
    h.batch(allocs=100000)
    one_pass(tmp_path)
    h.batch(allocs=20000, frees=500)
    one_pass(tmp_path)                              # run 1: 20,500 lines, no merge
    assert runs(tmp_path) == ["mmleak.%s.compact.1" % TID]
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)
              if ".compact" in n}
    # run 2, of 70,300 lines (more than a tick's 65,536), then a merge of the three levels
    # into the result (the rule wants it), which the caller gives up as it reads
    h.batch(allocs=70000, frees=300)
    run2 = tmp_path / ("mmleak.%s.compact.2" % TID)
    asked = []

    def abandon():              # True once run 2 is written and the merge was begun
        if run2.exists():
            asked.append(1)
        return len(asked) > 1
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False, abandon=abandon)[1]
    assert len(asked) >= 2                          # asked as the merge read
    assert (res["folded"], res["merged"], res["abandoned"]) == (1, 0, 1)
    assert runs(tmp_path) == ["mmleak.%s.compact.%d" % (TID, n) for n in (1, 2)]
    for n, data in before.items():                  # the merge's inputs: untouched
        assert (tmp_path / n).read_bytes() == data
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".out")]
    assert survivors(tmp_path) == h.live
    # the same pass, not abandoned, merges them (the rule did want that merge)
    h.batch(allocs=20000)
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False,
                                abandon=lambda: False)[1]
    assert (res["merged"], res["abandoned"]) == (3, 0) and runs(tmp_path) == []
    assert survivors(tmp_path) == h.live
    alive[0] = False
    res = one_pass(tmp_path)
    assert res["over"] and runs(tmp_path) == [] and survivors(tmp_path) == h.live


def test_a_point_abandoned_as_it_reads_is_not_written(tmp_path, alive, monkeypatch):
    """A point of the series of a running trace given up as it reads the live set (ABANDON,
    as `run`'s compactor does once its program ended): no point, no .series.live, nothing
    half written; the trace's last point then follows exactly."""
    from mmleaklib import native
    if native._shrink_engine() != "native":
        pytest.skip("the compiled shrinker is not built")
    monkeypatch.setattr(mmleak.series, "SERIES_INTERVAL", 0.0)
    h = History(tmp_path)
    h.batch(allocs=100000)
    one_pass(tmp_path)                              # (series=False: no point yet)
    h.batch(allocs=10)
    t = mmleak.TraceFiles(str(tmp_path), TID)
    asked = []

    def abandon():              # False before the fold and before the point, then True
        asked.append(1)
        return len(asked) > 2
    (res,) = mmleak.compact_dir(str(tmp_path), TID, abandon=abandon)[1]
    assert res["folded"] == 1 and res["point"] is None and res["abandoned"]
    assert not os.path.exists(t.series) and not os.path.exists(t.live)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    alive[0] = False
    (res,) = mmleak.compact_dir(str(tmp_path), TID)[1]
    assert res["over"] and res["point"] is not None
    points, _ = mmleak.read_series(t.series)
    assert len(points) == 1
    assert points[-1].live == (sum(h.live.values()), len(h.live))


def _given_up_at_the_pick(monkeypatch):
    """An ABANDON that turns True once the result's lines are picked (series._pick: the
    first step of a reading from the levels), and a record of the readings begun after it
    (series._read_native, then `asked`)."""
    state = {"picked": False, "read_after": 0}
    pick, read = mmleak.series._pick, mmleak.series._read_native

    def picking(*a, **k):
        state["picked"] = True
        return pick(*a, **k)

    def reading(*a, **k):
        state["read_after"] += state["picked"]
        return read(*a, **k)
    monkeypatch.setattr(mmleak.series, "_pick", picking)
    monkeypatch.setattr(mmleak.series, "_read_native", reading)

    def restore():
        monkeypatch.setattr(mmleak.series, "_pick", pick)
        monkeypatch.setattr(mmleak.series, "_read_native", read)
    return state, lambda: state["picked"], restore


def test_a_point_from_the_levels_is_given_up_too(tmp_path, alive, monkeypatch):
    """A point of a running trace made from the levels (the result's base there), given
    up once its pick of the result's lines is done (`run`'s program ended then): no reading
    begins after it, no point, the .live and the series as the previous point left them;
    the trace's last point then follows exactly.  (Before: level_sums did not ask, and the
    point read on, its sorts of the keys too, while `run`'s last pass waited for it.)"""
    from mmleaklib import native
    if native._shrink_engine() != "native":
        pytest.skip("the compiled shrinker is not built")
    monkeypatch.setattr(mmleak.series, "SERIES_INTERVAL", 0.0)
    h = History(tmp_path)
    h.batch(allocs=100000)
    (res,) = mmleak.compact_dir(str(tmp_path), TID)[1]     # the result, its base, a point
    t = mmleak.TraceFiles(str(tmp_path), TID)
    assert res["point"] is not None and os.path.exists(mmleak.series.base_path(
        str(tmp_path), TID))
    before = {n: (tmp_path / n).read_bytes() for n in (t.series, t.live)}
    h.batch(allocs=1000, frees=200)                 # a small run: no merge
    state, abandon, restore = _given_up_at_the_pick(monkeypatch)
    (res,) = mmleak.compact_dir(str(tmp_path), TID, abandon=abandon)[1]
    assert res["folded"] == 1 and res["merged"] == 0 and res["point"] is None
    assert res["abandoned"] and state["picked"] and state["read_after"] == 0
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    alive[0] = False
    restore()
    (res,) = mmleak.compact_dir(str(tmp_path), TID)[1]
    assert res["over"] and res["point"] is not None
    points, _ = mmleak.read_series(t.series)
    assert len(points) == 2
    assert points[-1].live == (sum(h.live.values()), len(h.live))
    assert points[-1].new[1] == 1000 and points[-1].freed[1] == 200
    assert survivors(tmp_path) == h.live


def test_a_merge_into_the_result_is_given_up_before_its_base(tmp_path, alive, monkeypatch):
    """A merge into the result reads first what its base and the series' .live become
    (series.before_result_merge, from the levels); given up there (the program ended):
    no reading begins after the pick, nothing is merged, the base and the .live stay those
    of the result, which is unchanged; the next pass merges, and every count is exact."""
    from mmleaklib import native
    if native._shrink_engine() != "native":
        pytest.skip("the compiled shrinker is not built")
    monkeypatch.setattr(mmleak.series, "SERIES_INTERVAL", 0.0)
    h = History(tmp_path)
    h.batch(allocs=100000)
    mmleak.compact_dir(str(tmp_path), TID)          # the result, its base, a point
    h.batch(allocs=1000)
    (res,) = mmleak.compact_dir(str(tmp_path), TID)[1]     # run 1, a partial .live
    assert runs(tmp_path) == ["mmleak.%s.compact.1" % TID] and res["point"] is not None
    t = mmleak.TraceFiles(str(tmp_path), TID)
    bpath = mmleak.series.base_path(str(tmp_path), TID)
    keep = [t.compact, bpath, t.live, t.series, str(tmp_path / runs(tmp_path)[0])]
    before = {p: open(p, "rb").read() for p in keep}
    h.batch(allocs=70000, frees=300)                # run 2, then a merge into the result
    state, abandon, restore = _given_up_at_the_pick(monkeypatch)
    (res,) = mmleak.compact_dir(str(tmp_path), TID, abandon=abandon)[1]
    assert res["folded"] == 1 and res["merged"] == 0 and res["abandoned"]
    assert state["picked"] and state["read_after"] == 0
    assert runs(tmp_path) == ["mmleak.%s.compact.%d" % (TID, n) for n in (1, 2)]
    assert {p: open(p, "rb").read() for p in keep} == before
    assert mmleak.series.load_base(str(tmp_path), TID, t.compact) is not None
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert survivors(tmp_path) == h.live
    restore()
    h.batch(allocs=20000)
    (res,) = mmleak.compact_dir(str(tmp_path), TID, abandon=lambda: False)[1]
    assert res["merged"] == 3 and runs(tmp_path) == [] and res["point"] is not None
    alive[0] = False
    (res,) = mmleak.compact_dir(str(tmp_path), TID)[1]
    assert res["over"]
    points, _ = mmleak.read_series(t.series)
    assert points[-1].live == (sum(h.live.values()), len(h.live))
    assert survivors(tmp_path) == h.live


def test_a_fold_abandoned_as_it_reads_leaves_its_files(tmp_path, alive):
    """The fold of new files into a run, given up as it reads them (ABANDON): the files
    stay, no run is written, nothing is deleted; the next pass folds them, exactly."""
    from mmleaklib import native
    if native._shrink_engine() != "native":
        pytest.skip("the compiled shrinker is not built")
    h = History(tmp_path)
    h.batch(allocs=1000)
    one_pass(tmp_path)
    h.batch(allocs=70000, frees=100)               # more lines than a tick's 65,536
    names = sorted(os.listdir(tmp_path))
    asked = []

    def abandon():                                  # False before the fold, then True
        asked.append(1)
        return len(asked) > 1
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False, abandon=abandon)[1]
    assert len(asked) >= 2 and res["abandoned"] and res["folded"] == 0
    assert sorted(os.listdir(tmp_path)) == names
    assert survivors(tmp_path) == h.live
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False, abandon=lambda: True)[1]
    assert res["abandoned"] and sorted(os.listdir(tmp_path)) == names
    res = one_pass(tmp_path)
    assert res["folded"] == 1 and not [n for n in os.listdir(tmp_path) if n.endswith(".out")]
    assert survivors(tmp_path) == h.live


def test_runs_last_pass_leaves_levels_that_read_as_the_merged_result(tmp_path, alive,
                                                                     monkeypatch):
    """`run`'s compactor does not merge a trace that is over into one file (that rewrote
    the whole live set after the program ended): its last pass folds the new files into a
    run, merges by the usual rule, and the levels it leaves are what the readers read.
    They read exactly as the one file `compact DIR` then merges them into: every block,
    byte and count, the history, the series' last point (made from the levels), the
    verdict of `report --check` (from the last pass's reading and from a report's), and the
    report itself."""
    import shutil
    import subprocess
    import sys
    from conftest import ROOT
    mmleak_py = [sys.executable, os.path.join(ROOT, "mmleak.py")]
    d = tmp_path / "levels"
    d.mkdir()
    h = History(d)
    h.batch(allocs=6000, churn=400)
    one_pass(d)
    h.batch(allocs=300, frees=200, churn=200)
    one_pass(d)                                     # run 1 (no merge: 6,100 > 4 x 500)
    h.batch(allocs=40, frees=30, churn=50)          # the files left when the program ends
    assert runs(d) == ["mmleak.%s.compact.1" % TID]
    alive[0] = False
    c = mmleak.compact.BackgroundCompactor(str(d), set(), interval=3600.0, views=True)
    c.start()
    c.finish(overlap=True)
    c.join()
    # the new file folded into a run of its own, the levels left as they are
    assert runs(d) == ["mmleak.%s.compact.%d" % (TID, n) for n in (1, 2)]
    assert not [n for n in os.listdir(d) if n.endswith((".out", ".tmp", ".live"))]
    assert survivors(d) == h.live
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(d), TID).series)
    assert len(points) == 1 and points[-1].live == (sum(h.live.values()), len(h.live))
    vsh, vlive = c.views[TID]                      # what run --check's verdict takes
    from mmleaklib import native
    streamed = []
    with monkeypatch.context() as m:
        if native._shrink_engine() == "native":     # a report streams the result, runs or not
            real = native._blocks_api["blocks_merge"]
            m.setitem(native._blocks_api, "blocks_merge",
                      lambda *a: streamed.append(1) or real(*a))
        sh, paths = mmleak.compact.read_trace(str(d), TID, blocks=True)
    assert len(paths) == 3
    assert streamed == ([1] if native._shrink_engine() == "native" else [])
    # the same history, counts and survivors as the one merged file
    m = tmp_path / "merged"
    shutil.copytree(d, m)
    (res,) = mmleak.compact_dir(str(m), TID)[1]
    assert res["over"] and res["point"] is None and runs(m) == []
    msh, mpaths = mmleak.compact.read_trace(str(m), TID, blocks=True)
    assert [os.path.basename(p) for p in mpaths] == ["mmleak.%s.compact" % TID]
    assert survivors(m) == h.live

    def fields(s, lines=True):
        f = _reader_fields(s)
        if not lines:           # the event lines read: the levels hold more than one file
            for k in ("events", "allocs", "frees", "files_done"):
                f.pop(k)
        f["header_lines"] = sorted(l for l in f["header_lines"]
                                   if not l.startswith((b"#compacted ", b"#folded ")))
        f.pop("compacted")      # the levels' own bookkeeping (entries, runs)
        # the file each '#mmleak' header was first read from (named only when processes
        # are mixed): a run's, when a reader reads the result last
        f["headers"] = [{k: v for k, v in x.items() if k != "source"} for x in f["headers"]]
        return f
    assert fields(vsh) == fields(sh)
    assert fields(sh, False) == fields(msh, False)
    assert vsh.history()["events"] == msh.history()["events"] > 6840
    assert msh.compacted["files"] == 3
    blocks = [sorted((a.ptr, a.seq, a.size, a.time, a.callers) for a in x)
              for x in (vlive, sh.live(), msh.live())]
    assert blocks[0] == blocks[1] == blocks[2] and len(blocks[0]) == len(h.live)
    agg = [x.aggregate() for x in (vlive, sh.live(), msh.live())]
    assert all(a[1] == agg[0][1] and [tuple(g) for g in a[0]] == [tuple(g) for g in agg[0][0]]
               for a in agg)
    outs = []
    for x in (d, m):
        r = subprocess.run(mmleak_py + ["report", str(x), "--pid", TID, "--no-html",
                                        "--check", "--leak-kinds", "all"],
                           capture_output=True, text=True, timeout=120)
        outs.append((r.returncode, r.stdout.replace(str(x), "DIR"),
                     r.stderr.replace(str(x), "DIR")))
    assert outs[0] == outs[1]
    assert outs[0][0] == 23 and "%d blocks" % len(h.live) in outs[0][1] + outs[0][2], outs[0]


def _fold_targets(monkeypatch):
    """The files each shrink of the compactor writes (compact._fold_into's targets)."""
    targets = []
    real = mmleak.compact._fold_into

    def counted(directory, tid, target, *a, **k):
        targets.append(os.path.basename(target))
        return real(directory, tid, target, *a, **k)
    monkeypatch.setattr(mmleak.compact, "_fold_into", counted)
    return targets


def test_runs_last_pass_folds_a_backlog_straight_into_the_result(tmp_path, alive,
                                                                monkeypatch):
    """The program outran `run`'s compactor: the files left at its end would make a run
    that the rule merges into the result at once (the levels kept every event so far, so
    these will keep theirs too).  The last pass shrinks them with the result in one go (no
    run written, then read again): one file written, everything in mmleak.ID.compact,
    every block exact, the last point from that reading's survivors."""
    h = History(tmp_path)
    h.batch(allocs=3000)
    one_pass(tmp_path)
    h.batch(allocs=2000)
    h.batch(allocs=2500, frees=100)               # the backlog: more than a quarter of it
    alive[0] = False
    targets = _fold_targets(monkeypatch)
    (res,) = mmleak.compact_dir(str(tmp_path), TID, levels=True)[1]
    assert res["over"] and res["folded"] == 2 and res["point"] is not None
    assert targets == ["mmleak.%s.compact" % TID]
    assert runs(tmp_path) == [] and survivors(tmp_path) == h.live
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(tmp_path), TID).series)
    assert points[-1].live == (sum(h.live.values()), len(h.live))
    # a small backlog still goes to a run of its own, the levels left as they are
    h2 = History(tmp_path / "small")
    (tmp_path / "small").mkdir()
    h2.batch(allocs=3000)
    one_pass(tmp_path / "small")
    h2.batch(allocs=20, frees=10)
    del targets[:]
    (res,) = mmleak.compact_dir(str(tmp_path / "small"), TID, levels=True)[1]
    assert targets == ["mmleak.%s.compact.1" % TID]
    assert survivors(tmp_path / "small") == h2.live


@pytest.mark.parametrize("run_lines", [5000, 400])
def test_runs_last_pass_mends_levels_a_merge_given_up_left(tmp_path, alive, monkeypatch,
                                                           run_lines):
    """A merge into the result given up at the program's end (`run`'s compactor does not
    wait for it) leaves a run not four times smaller than the result (bigger, here; then
    a third of it): the last pass then folds its files with every level into the result,
    rather than leave that run for every reader to put through its table."""
    h = History(tmp_path)
    h.batch(allocs=1200)
    one_pass(tmp_path)
    h.batch(allocs=run_lines)
    with monkeypatch.context() as m:
        m.setattr(mmleak.compact, "MERGE_FACTOR", 0)   # the merge that rule wanted: given up
        one_pass(tmp_path)
    assert runs(tmp_path) == ["mmleak.%s.compact.1" % TID]
    h.batch(allocs=10, frees=5)                        # a small file left at the end
    alive[0] = False
    targets = _fold_targets(monkeypatch)
    (res,) = mmleak.compact_dir(str(tmp_path), TID, levels=True)[1]
    assert res["over"] and targets == ["mmleak.%s.compact" % TID]
    assert runs(tmp_path) == [] and survivors(tmp_path) == h.live
    points, _ = mmleak.read_series(mmleak.TraceFiles(str(tmp_path), TID).series)
    assert points[-1].live == (sum(h.live.values()), len(h.live))


def test_a_point_is_put_off_while_the_compactor_is_behind(tmp_path, alive):
    """A point due while files the pass did not fold are complete (the program writes them
    faster than the pass folds: compact_dir DEFER, `run`'s compactor) waits for a pass that
    is not behind; it is then exact.  `run`'s compactor puts one off for DEFER_MAX seconds
    at most (a hook writes a file as each pass has folded its own)."""
    h = History(tmp_path)
    h.batch(allocs=500)
    asked = []

    def defer(tid, behind):
        asked.append(behind)
        return behind
    (res,) = mmleak.compact_dir(str(tmp_path), TID, defer=defer,
                                folded=lambda tid, now: h.batch(allocs=300, frees=50))[1]
    assert asked == [True] and res["deferred"] == 1 and res["point"] is None
    spath = mmleak.TraceFiles(str(tmp_path), TID).series
    assert not os.path.exists(spath)
    (res,) = mmleak.compact_dir(str(tmp_path), TID, defer=defer)[1]
    # (asked twice: for the merge of its run into the result, then for the point)
    assert asked == [True, False, False] and res["folded"] == 1 and res["point"] is not None
    points, _ = mmleak.read_series(spath)
    assert len(points) == 1 and points[-1].live == (sum(h.live.values()), len(h.live))
    # run's compactor: put off while behind, for DEFER_MAX seconds in a row at most
    c = mmleak.compact.BackgroundCompactor(str(tmp_path), set(), interval=3600.0)
    assert c._defer(TID, True) and c._defer(TID, True) and not c._defer(TID, False)
    c.defer_max = 0
    assert not c._defer(TID, True)
    assert survivors(tmp_path) == h.live


def test_the_result_is_not_rewritten_while_the_compactor_is_behind(tmp_path, alive,
                                                                 monkeypatch):
    """`run`'s compactor behind its program (complete files the pass did not fold are
    waiting: DEFER says so): the merge the rule wants (into the result, or the oldest run:
    it rewrites what the next pass's would rewrite again) waits, up to HOLD_RUNS levels;
    the last pass then folds everything straight into the result.  Exact after every pass;
    not behind, the merge is made as before."""
    h = History(tmp_path)
    h.batch(allocs=3000)
    one_pass(tmp_path)
    asked = []

    def defer(tid, behind):
        asked.append(behind)
        return behind
    targets = _fold_targets(monkeypatch)
    h.batch(allocs=2000)                # a run the rule merges into the result at once
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False, defer=defer,
                                folded=lambda tid, now: None,
                                abandon=lambda: h.files == 2 and h.batch(allocs=10) < 0)[1]
    assert asked[:1] == [True] and targets == ["mmleak.%s.compact.1" % TID]
    assert runs(tmp_path) == ["mmleak.%s.compact.1" % TID] and survivors(tmp_path) == h.live
    h.batch(allocs=1500)                # behind again: the runs are not merged either
    del targets[:], asked[:]
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False, defer=lambda t, b: True)[1]
    assert targets == ["mmleak.%s.compact.2" % TID]
    assert runs(tmp_path) == ["mmleak.%s.compact.%d" % (TID, n) for n in (1, 2)]
    assert survivors(tmp_path) == h.live
    # HOLD_RUNS levels: merged by the rule, behind or not
    with monkeypatch.context() as m:
        m.setattr(mmleak.compact, "HOLD_RUNS", 3)
        h.batch(allocs=1000)
        del targets[:]
        mmleak.compact_dir(str(tmp_path), TID, series=False, defer=lambda t, b: True)
    assert targets == ["mmleak.%s.compact.3" % TID, "mmleak.%s.compact" % TID]
    assert runs(tmp_path) == [] and survivors(tmp_path) == h.live
    # not behind: into the result, as the rule says
    h.batch(allocs=1000)
    one_pass(tmp_path)
    h.batch(allocs=1500)
    del targets[:]
    (res,) = mmleak.compact_dir(str(tmp_path), TID, series=False, defer=lambda t, b: False)[1]
    assert targets[1:] == ["mmleak.%s.compact" % TID]
    assert runs(tmp_path) == [] and survivors(tmp_path) == h.live
    # the program over: the last pass is never held (levels: a run bigger than the result
    # left by holding is folded straight into it)
    h.batch(allocs=4000)
    one_pass(tmp_path)
    h.batch(allocs=5000)
    with monkeypatch.context() as m:
        m.setattr(mmleak.compact, "MERGE_FACTOR", 0)
        one_pass(tmp_path)
    h.batch(allocs=5, frees=3)
    alive[0] = False
    del targets[:]
    (res,) = mmleak.compact_dir(str(tmp_path), TID, levels=True, defer=lambda t, b: True)[1]
    assert res["over"] and targets == ["mmleak.%s.compact" % TID]
    assert runs(tmp_path) == [] and survivors(tmp_path) == h.live
