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


def test_a_pass_costs_what_its_new_files_hold(tmp_path, alive):
    """Over a folded live set of 100,000 blocks, passes of 100 new events each read and
    write lines in proportion to those (the runs they merge included: a few times the
    batch, amortized), never the live set;
    every count stays exact, and the trace's end puts everything into mmleak.ID.compact."""
    h = History(tmp_path)
    n = h.batch(allocs=100000)
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
    assert len(h.live) == 100000 + 30 * 50 - 30 * 50


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
