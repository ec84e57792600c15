#!/usr/bin/python3
"""mmleak-panda.py: render the blocks a traced process never freed as one HTML page.

Two ways in:

* ``mmleak.py report DIR`` builds the report (shrink + symbolize) and calls
  ``render_report(rep, out_path)`` here;
* the classic pipe: the survivor lines of a shrunk trace on stdin::

      mmleak.py shrink --final mmleak.PID.*.out | mmleak-panda.py --maps mmleak.PID.maps > mmleak.PID.html
      awk '/^#s / || NF >= 5' mmleak.PID.txt | mmleak-panda.py > mmleak.PID.html

The page is self-contained (inline CSS, JS and SVG charts; no network): a headline (bytes and
blocks not freed, process, time span, events read, what could not be symbolized and why), a
chart of the top call sites, a chart of the survivors' bytes over the life of the process, a
flame graph of the unfreed bytes by stack (click to zoom, hover for details), and one
sortable, filterable table of the leaking call sites.

It renders the report model of mmleaklib (report.build_report's dict): the call sites are
the table the terminal prints (report.site_table), and the survivor lines on stdin are read
by the package's reader (shrink.Shrinker) into the same model.  Needs pandas and matplotlib.
"""
from mmleaklib import interrupt

if __name__ == "__main__":
    interrupt.guard("mmleak-panda.py")  # (first: Ctrl-C at any moment, see interrupt.py)

import collections  # noqa: E402
import datetime  # noqa: E402
import html
import io
import os
import re
import sys
import time

from mmleaklib import errors, files, layout, report, shrink, sites, symbolize
from mmleaklib.dumpformat import (DUPLICATE, KIND_END, KIND_START, MALFORMED, PROBLEMS,
                                  Q_BAD_FIELD, Q_BAD_STACK, Q_CUT_START, Q_MALFORMED,
                                  Q_TOO_LONG, Q_UNREADABLE, Problems, cannot_read,
                                  header_int, problem_text)
from mmleaklib.errors import EXIT_OK, EXIT_PARTIAL, EXIT_TOOL, EXIT_USAGE, Fail
from mmleaklib.facts import MAX_DEPTH

PROG = "mmleak-panda.py"
TOP_ROWS = 500          # table rows at most; the rest is summarized in a note
CHART_SITES = 15        # bars in the top-sites chart
TIMELINE_SITES = 5      # per-site lines in the timeline chart
TIMELINE_POINTS = 2000  # points per timeline line at most (longer histories are binned)
# ---------------------------------------------------------------------------------------
# Formatting helpers
# ---------------------------------------------------------------------------------------

def esc(s):
    """S for the page: its control characters shown as errors.printable shows them on a
    terminal (a name from the trace may hold an ESC, a newline, a bidirectional override),
    then HTML-escaped."""
    return html.escape(errors.printable("" if s is None else str(s)), quote=True)


def hb(n):
    return sites.human_bytes(int(n))


def dur(s):
    """Seconds -> '42 s', '3 min 05 s', '2 h 07 min', '3 d 04 h'."""
    s = int(round(s))
    if s < 60:
        return "%d s" % s
    if s < 3600:
        return "%d min %02d s" % (s // 60, s % 60)
    if s < 86400:
        return "%d h %02d min" % (s // 3600, s % 3600 // 60)
    return "%d d %02d h" % (s // 86400, s % 86400 // 3600)


def short_path(p, keep=3):
    parts = p.split("/")
    return p if len(parts) <= keep + 1 else ".../" + "/".join(parts[-keep:])


# ---------------------------------------------------------------------------------------
# The page's model: report.site_table (the terminal's table), and the blocks for the charts
# ---------------------------------------------------------------------------------------

# the most blocks the timeline chart is drawn from: a bigger trace is sampled (evenly, each
# site's curve scaled to end at its exact bytes), so the page's size and time do not grow
# with the block count
PAGE_SAMPLE = 20000


def page_model(rep, wrappers):
    """(the blocks the filters keep, the sites, the stacks) of the report REP: the sites are
    report.site_table's rows (what the terminal prints, the heaviest stack of each), the
    stacks {stack: [bytes, blocks, site, index]} those of the blocks kept.  A report of
    build_report (its per-stack aggregates in rep["groups"]) gives at most PAGE_SAMPLE blocks,
    their sizes scaled per site so that each site's blocks sum to its exact bytes."""
    if rep.get("groups") is not None and rep.get("live") is not None:
        stacks = {}
        table = report.site_table(rep, stacks, wrappers)
        keep = getattr(rep["survivors"], "keep", None) or (lambda a: True)
        if len(rep["survivors"]) <= PAGE_SAMPLE:
            return list(rep["survivors"]), table, stacks
        depth = report.site_depth(rep)
        kept = [a for a in rep["live"].sample(PAGE_SAMPLE) if keep(a)
                and a.callers[:depth] in stacks]
        got = {}
        for a in kept:
            k = stacks[a.callers[:depth]][2]
            got[k] = got.get(k, 0) + a.size
        exact = collections.Counter()          # a site's bytes, all its kinds together
        for t in table:
            exact[t.caller] += t.bytes
        scale = {k: exact[k] / got[k] if got[k] else 1.0 for k in got}   # (blocks of 0 bytes)
        kept = [a._replace(size=a.size * scale[stacks[a.callers[:depth]][2]]) for a in kept]
        return kept, table, stacks
    kept = sites.keep_blocks(rep["survivors"], rep.get("end_time") or 0, rep.get("since"),
                             rep.get("older_than"))
    stacks = {}
    table = report.site_table(dict(rep, survivors=kept), stacks, wrappers)
    return kept, table, stacks


def blocks_frame(kept, stacks, depth):
    """The blocks kept, as a DataFrame (size, time, site) for the timeline chart."""
    import numpy as np
    import pandas as pd
    return pd.DataFrame({
        "size": np.array([float(a.size) for a in kept], dtype=np.float64),
        "time": np.array([float(a.time) for a in kept], dtype=np.float64),
        "site": np.array([stacks[a.callers[:depth]][2] for a in kept], dtype=np.uint64)})


# ---------------------------------------------------------------------------------------
# Flame graph: unfreed bytes by stack (aggregated here, drawn by the page's script)
# ---------------------------------------------------------------------------------------

FLAME_MIN_PER_MILLE = 1   # boxes narrower than 1/1000 of the total are not drawn
FLAME_MAX_BOXES = 5000    # and at most this many boxes (the widest): the page stays small
KIND_PROGRAM, KIND_RUNTIME, KIND_UNRESOLVED = 0, 1, 2
KIND_INLINED = 4          # flag: this level was inlined into the box above it
KIND_NONAME = 8           # flag (page data): no function name, the label is the name


def short_function(fn):
    """A function's name without its parameter list (box labels):
    'ns::Foo<int>::bar(char const*) const' -> 'ns::Foo<int>::bar',
    'main::{lambda()#1}::operator()() const' -> 'main::{lambda()#1}::operator()'."""
    s = fn.rstrip()
    while True:                       # qualifiers after the parameter list
        for q in (" const", " volatile", " &&", " &", " noexcept"):
            if s.endswith(q):
                s = s[:-len(q)].rstrip()
                break
        else:
            break
    if not s.endswith(")"):
        return fn
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        depth += (s[i] == ")") - (s[i] == "(")
        if depth == 0:
            head = s[:i].rstrip()
            # 'operator()' alone (inline levels are named without parameters) is a name
            return fn if not head or head.endswith("operator") else head
    return fn


def frame_levels(fr, addr):
    """The source-level frames of one return address, outermost first: the functions its
    code was inlined into (Frame.inlined lists them innermost first), then the function at
    the address.  -> [(key, label, function, file, line, module, kind)].

    KEY merges boxes: (function, file, line, module) when symbolized, so two return
    addresses of one source line are one box; (function, module) without line information;
    the module and offset (or the address) when nothing is known."""
    if fr is None:
        lab = "0x%x" % addr
        return [(("?", addr), lab, None, None, None, None, KIND_UNRESOLVED)]
    if not (fr.function or fr.file):
        lab = symbolize.frame_label(fr)
        return [(("?", fr.module, fr.offset if fr.module else addr), lab, None, None, None,
                 fr.module, KIND_UNRESOLVED)]
    chain = [(fr.function, fr.file, fr.line)] + list(fr.inlined)
    out = []
    for j in range(len(chain) - 1, -1, -1):
        fn, fl, ln = chain[j]
        kind = KIND_RUNTIME if sites.is_runtime(
            symbolize.Frame(addr, fr.module, fr.offset, fn, fl, ln, (), None)) else KIND_PROGRAM
        if j < len(chain) - 1:             # inlined into the level above it
            kind |= KIND_INLINED
        key = ("f", fn, fl, ln if fl else None, fr.module)
        out.append((key, short_function(fn) if fn else "??", fn, fl, ln if fl else None,
                    fr.module, kind))
    return out


class Flame:
    """The unfreed bytes of every distinct stack as a tree of boxes, root ("all") first, then
    the outermost frame of each stack down to the caller of the allocator.  A box's bytes and
    blocks are those of every surviving block whose stack passes through it; boxes are merged
    by their path of (function, file, line) from the root.

    nodes: [(frame index or -1 for the root, depth, bytes, blocks, bytes of the callees not
    drawn)] in pre-order, children widest first; frames: [(label, function, file, line,
    module, kind)]; cut_boxes / cut_bytes / cut_blocks: what was left out: the boxes not
    drawn (narrower than PER_MILLE/1000 of the total, or beyond the MAX_BOXES widest) whose
    caller is drawn, and their bytes and blocks (with their callees); max_frames: the longest
    stack in return addresses."""

    def __init__(self, stack_list, stack_bytes, stack_blocks, frames,
                 per_mille=FLAME_MIN_PER_MILLE, max_boxes=FLAME_MAX_BOXES):
        frames = frames or {}
        key_idx, self.frames = {}, []
        levels = {}

        def levels_of(addr):
            lv = levels.get(addr)
            if lv is None:
                lv = []
                for key, *rest in frame_levels(frames.get(addr), addr):
                    i = key_idx.get(key)
                    if i is None:
                        i = key_idx[key] = len(self.frames)
                        self.frames.append(tuple(rest))
                    lv.append(i)
                levels[addr] = lv = tuple(lv)
            return lv

        # every stack as its path of frames from the root, and the totals
        paths, weights, total, blocks = [], [], 0, 0
        self.max_frames = 0
        for sid, st in enumerate(stack_list):
            k = stack_blocks[sid]
            if not k:
                continue
            b = stack_bytes[sid]
            self.max_frames = max(self.max_frames, len(st))
            p = ()
            for addr in reversed(st):
                p += levels_of(addr)
            paths.append(p)
            weights.append((b, k))
            total += b
            blocks += k
        self.total, self.blocks = total, blocks
        # the tree, one level at a time: the stacks that reach a box group by their next
        # frame into its children; only a box at least PER_MILLE/1000 of the total wide has
        # its children made (the memory stays proportional to what is drawn, not to the sum
        # of the stacks' lengths)
        fidx, depth, nbytes, nblocks, kids = [-1], [0], [total], [blocks], [[]]
        active = [(j, 0) for j in range(len(paths))]
        d = 0
        while active:
            made, nxt = {}, []
            for j, node in active:
                p = paths[j]
                if len(p) <= d:
                    continue
                c = made.get((node, p[d]))
                if c is None:
                    c = made[(node, p[d])] = len(fidx)
                    fidx.append(p[d])
                    depth.append(d + 1)
                    nbytes.append(0)
                    nblocks.append(0)
                    kids.append([])
                    kids[node].append(c)
                b, k = weights[j]
                nbytes[c] += b
                nblocks[c] += k
                nxt.append((j, c))
            active = [(j, c) for j, c in nxt if nbytes[c] * 1000 >= total * per_mille]
            d += 1
        # the boxes at least PER_MILLE/1000 of the total wide, at most the MAX_BOXES widest
        # (a parent is never narrower than its child, nor deeper: the kept set is a tree)
        keep = [i for i in range(1, len(fidx)) if nbytes[i] * 1000 >= total * per_mille]
        if len(keep) > max_boxes:
            keep.sort(key=lambda i: (-nbytes[i], depth[i], i))
            keep = keep[:max_boxes]
        kept = set(keep)
        kept.add(0)
        self.cut_boxes = self.cut_bytes = self.cut_blocks = 0
        fr = self.frames

        def order(i):
            f = fr[fidx[i]]
            return (-nbytes[i], f[0], f[1] or "", f[2] or "", f[3] or 0, i)

        nodes, todo = [], [0]
        while todo:
            i = todo.pop()
            cut = 0
            shown = []
            for c in kids[i]:
                if c in kept:
                    shown.append(c)
                else:
                    cut += nbytes[c]
                    self.cut_boxes += 1
                    self.cut_bytes += nbytes[c]
                    self.cut_blocks += nblocks[c]
            nodes.append((fidx[i], depth[i], nbytes[i], nblocks[i], cut))
            shown.sort(key=order, reverse=True)     # popped widest first
            todo.extend(shown)
        self.nodes = nodes

    def box(self, *labels):
        """The node of the path of box labels from the root (tests and tools): -> node tuple,
        or None."""
        path = []
        for n in self.nodes:
            d = n[1]
            del path[d:]
            path.append(self.frames[n[0]][0] if n[0] >= 0 else None)
            if tuple(path[1:]) == labels:
                return n
        return None

    def data(self):
        """The JSON the page's script reads: strings interned; bytes above 2^53 as strings."""
        strs, sidx = [], {}

        def s(v):
            if v is None:
                return -1
            i = sidx.get(v)
            if i is None:
                i = sidx[v] = len(strs)
                strs.append(errors.printable(v) if isinstance(v, str) else v)
            return i
        frames, fidx, flat = [], {}, []
        for f, d, b, k, cut in self.nodes:       # only the frames of the boxes drawn
            if f >= 0:
                j = fidx.get(f)
                if j is None:
                    j = fidx[f] = len(frames)
                    lab, fn, fl, ln, mod, kind = self.frames[f]
                    # the page makes the label: short_function(fn), or LAB without a name
                    frames.append([s(fn if fn else lab), s(fl), ln or 0, s(mod),
                                   kind | (0 if fn else KIND_NONAME)])
                f = j
            flat.extend((f, d, b if b < 1 << 53 else str(b), k, cut if cut < 1 << 53
                         else str(cut)))
        return {"s": strs, "f": frames, "n": flat, "pm": FLAME_MIN_PER_MILLE}


def flame_of(stacks, frames):
    """A Flame of the blocks kept: bytes and blocks per stack (page_model's STACKS), exact."""
    return Flame(list(stacks), [v[0] for v in stacks.values()],
                 [v[1] for v in stacks.values()], frames)


def flame_json(fl):
    """The flame data as JSON that is safe inside <script> (no <, >, & characters)."""
    import json
    return (json.dumps(fl.data(), separators=(",", ":"), ensure_ascii=True)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


# ---------------------------------------------------------------------------------------
# Charts (matplotlib -> inline SVG)
# ---------------------------------------------------------------------------------------

PALETTE = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def _svg(fig):
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    s = buf.getvalue()
    s = s[s.index("<svg"):]
    # scale with the page: drop the fixed pt size, keep the viewBox
    s = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1', s, count=1)
    return s


def _mpl():
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams.update({
        # the labels are the traced program's names (its symbols, its file names: "a$^{$b"
        # is one): never matplotlib's mathtext, which rendered "c$_$d" as a subscript and
        # failed the page on "$^{$" with a traceback
        "text.parse_math": False,
        "svg.fonttype": "none", "svg.hashsalt": "mmleak", "font.size": 9,
        "font.family": "sans-serif",
        "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"],
        "axes.spines.top": False, "axes.spines.right": False,
    })
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter
    return Figure, FuncFormatter


def _bytes_axis(axis, vmax):
    """Ticks at round multiples of B, KiB, ... EiB, labelled in that unit."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator
    vmax = max(float(vmax), 1.0)
    unit, name = 1, "B"
    for u, n in ((1 << 60, "EiB"), (1 << 50, "PiB"), (1 << 40, "TiB"), (1 << 30, "GiB"),
                 (1 << 20, "MiB"), (1 << 10, "KiB")):
        if vmax >= 2 * u:
            unit, name = u, n
            break
    raw = vmax / unit / 5.0
    mag = 10 ** int(__import__("math").floor(__import__("math").log10(raw))) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if unit == 1:
        step = max(round(step), 1)
    axis.set_major_locator(MultipleLocator(float(step * unit)))
    axis.set_major_formatter(FuncFormatter(
        lambda v, _: ("%g %s" % (round(v / unit, 3), name)) if v > 0 else "0"))


def _trunc(s, n=60):
    """A chart's label: printable (a control character was a glyph missing from the font,
    and matplotlib's warning wrote it raw to stderr), cut to N characters."""
    s = errors.printable(s)
    return s if len(s) <= n else s[:n - 1] + "\u2026"


def chart_top_sites(table, labels):
    Figure, FuncFormatter = _mpl()
    top = table[:CHART_SITES]
    n = len(top)
    fig = Figure(figsize=(6.4, max(3.9, 0.9 + 0.28 * max(n, 1))))
    ax = fig.add_subplot(111)
    if n == 0:
        ax.text(0.5, 0.5, "no unfreed blocks", ha="center", va="center")
        ax.set_axis_off()
        return _svg(fig)
    y = list(range(n))[::-1]
    exact = [s.bytes for s in top]
    vals = [float(v) for v in exact]          # plotting only; labels show the exact bytes
    colors = [PALETTE[i] if i < TIMELINE_SITES else "#8da0b3" for i in range(n)]
    ax.barh(y, vals, color=colors, height=0.7)
    ax.set_yticks(y)
    ax.set_yticklabels([_trunc(labels[i], 48) for i in range(n)])
    _bytes_axis(ax.xaxis, max(max(vals) * 1.3, 1.0))
    ax.set_xlabel("bytes not freed (label: bytes / blocks)")
    ax.set_title("Top call sites by unfreed bytes", loc="left", fontsize=10)
    for yi, v, e, b in zip(y, vals, exact, [s.blocks for s in top]):
        ax.text(v, yi, " %s / %d" % (hb(e), b), va="center", fontsize=8, color="#333")
    ax.set_xlim(0, max(max(vals) * 1.3, 1.0))
    ax.grid(axis="x", color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    return _svg(fig)


def _cumulative(times, sizes, t_end):
    """Step curve of cumulative bytes by allocation time, at most TIMELINE_POINTS points."""
    import numpy as np
    if len(times) == 0:
        return np.array([0, t_end]), np.array([0, 0])
    order = np.argsort(times, kind="stable")
    t, s = times[order], sizes[order]
    ut, idx = np.unique(t, return_index=True)
    cs = np.cumsum(s)
    last = np.append(idx[1:] - 1, len(t) - 1)
    y = cs[last]
    if len(ut) > TIMELINE_POINTS:
        edges = np.linspace(ut[0], ut[-1], TIMELINE_POINTS)
        pos = np.searchsorted(ut, edges, side="right") - 1
        ut, y = edges, y[pos]
    x = np.concatenate([[min(0, ut[0])], ut, [max(t_end, ut[-1])]])
    y = np.concatenate([[0], y, [y[-1]]])
    return x, y


def chart_timeline(df, table, labels, end_time):
    import numpy as np
    Figure, FuncFormatter = _mpl()
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot(111)
    # plotting only: floats (a cumulative sum of 64-bit sizes would wrap in integers)
    t = df["time"].to_numpy().astype(np.float64)
    s = df["size"].to_numpy().astype(np.float64)
    x, y = _cumulative(t, s, float(end_time))
    ax.plot(x, y, drawstyle="steps-post", color="#222", linewidth=2, label="all call sites")
    site = df["site"].to_numpy()
    for i in range(min(TIMELINE_SITES, len(table))):
        m = site == np.uint64(table[i].caller)
        xi, yi = _cumulative(t[m], s[m], float(end_time))
        ax.plot(xi, yi, drawstyle="steps-post", color=PALETTE[i], linewidth=1.4,
                label="#%d %s" % (i + 1, _trunc(labels[i], 40)))
    _bytes_axis(ax.yaxis, y.max() * 1.05 if len(y) else 1)
    ax.set_xlabel("allocation time (seconds since trace start)")
    ax.set_ylabel("bytes still not freed")
    ax.set_title("Unfreed bytes by allocation time (cumulative)", loc="left", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_xlim(left=min(0, x[0]), right=max(float(end_time), x[-1], 1))
    ax.legend(loc="upper left", bbox_to_anchor=(0, -0.2), ncol=2, fontsize=7.5, frameon=False)
    return _svg(fig)


# ---------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI","DejaVu Sans",Arial,sans-serif;
 margin:0;color:#1d2630;background:#f4f6f8}
header{background:#1d2630;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:21px;font-weight:600}
header h1 b{color:#ff8a80}
header .sub{color:#b8c4d0;font-size:13px;margin-top:3px;word-break:break-all}
main{padding:14px 24px 40px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-bottom:12px}
.card{background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:8px 14px;min-width:150px}
.card .k{font-size:11px;text-transform:uppercase;letter-spacing:.04em;color:#6a7785}
.card .v{font-size:19px;font-weight:600}
.card .n{font-size:12px;color:#6a7785}
.notes{background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:6px 14px;margin-bottom:12px}
.panel{background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:6px 14px;margin-bottom:12px}
.panel h2{font-size:14px;margin:6px 0}
table.small{border-collapse:collapse;font-size:12px;margin:6px 0}
table.small td,table.small th{border-bottom:1px solid #eef1f4;padding:2px 8px;text-align:left}
table.small td.n{text-align:right;font-variant-numeric:tabular-nums}
.notes ul{margin:4px 0;padding-left:18px}
.warn{color:#a14a00}
.charts{display:flex;flex-wrap:wrap;gap:12px;margin-bottom:12px}
.chart{background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:6px;flex:1 1 520px;min-width:0}
.chart svg{width:100%;height:auto;display:block}
.tools{display:flex;align-items:center;gap:12px;margin:6px 0}
.tools input[type=search]{font:inherit;padding:5px 9px;width:360px;border:1px solid #b9c3cd;border-radius:4px}
.tools .count{color:#6a7785;font-size:13px}
table{border-collapse:collapse;background:#fff;width:100%;border:1px solid #dde3ea;font-size:13px}
th{background:#e9edf2;text-align:left;padding:6px 8px;cursor:pointer;white-space:nowrap;
 position:sticky;top:0;user-select:none;border-bottom:1px solid #c9d1da}
th:hover{background:#dde3ea}
th.asc::after{content:" \\25B2";font-size:10px}
th.desc::after{content:" \\25BC";font-size:10px}
td{padding:5px 8px;border-top:1px solid #edf0f3;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr:hover td{background:#f7f9fb}
td.fn{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-word;max-width:420px}
td.loc{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all;max-width:330px}
td.mod{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:11.5px;color:#56636f;white-space:nowrap}
.inl,.stk{color:#56636f;font-size:11.5px}
.unres{color:#a14a00}
.via{color:#56636f;font-size:11.5px}
.rt{display:inline-block;margin-left:6px;padding:0 5px;border-radius:3px;background:#e9edf2;color:#56636f;font:11px system-ui,sans-serif}
tr.rtrow td{color:#6a7785}
.tools label{display:flex;align-items:center;gap:4px}
details summary{cursor:pointer;color:#2a62a6;font-size:11.5px}
.bar{display:block;height:3px;background:#d62728;margin-top:3px;border-radius:2px}
footer{color:#6a7785;font-size:12px;margin-top:14px}
#selftest{display:none}
"""

JS = r"""
(function(){
var tbl=document.getElementById('sites'), tb=tbl.tBodies[0];
var rows=Array.prototype.slice.call(tb.rows), ths=tbl.tHead.rows[0].cells;
function key(r,c){var td=r.cells[c], v=td.getAttribute('data-v');
 if(v!==null&&v!==''&&!isNaN(v))return parseFloat(v); return (v!==null?v:td.textContent).toLowerCase();}
function sortBy(c,dir){
 var num=ths[c].getAttribute('data-t')==='n';
 rows.sort(function(a,b){var x=key(a,c),y=key(b,c),r;
  if(num){x=+x;y=+y;} r=x<y?-1:x>y?1:0; if(!r)r=(+a.getAttribute('data-rank'))-(+b.getAttribute('data-rank'));
  return dir*r;});
 var f=document.createDocumentFragment(); rows.forEach(function(r){f.appendChild(r);}); tb.appendChild(f);
 for(var i=0;i<ths.length;i++){ths[i].classList.remove('asc','desc');}
 ths[c].classList.add(dir>0?'asc':'desc');}
for(var i=0;i<ths.length;i++)(function(c){ths[c].addEventListener('click',function(){
 var d=ths[c].classList.contains('desc')?1:ths[c].classList.contains('asc')?-1:
  (ths[c].getAttribute('data-t')==='n'?-1:1); sortBy(c,d);});})(i);
var inp=document.getElementById('filter'), cnt=document.getElementById('count');
var hrt=document.getElementById('hide-rt'), kv=document.getElementById('kind-view');
function kinds(){if(!kv)return null;return kv.options[kv.selectedIndex].getAttribute('data-kinds').split(',');}
function showView(){var v=kv.value, d=document.querySelectorAll('.kview');
 for(var i=0;i<d.length;i++)d[i].style.display=d[i].getAttribute('data-view')===v?'':'none';
 if(window.__flameShow&&document.getElementById('flame-data-'+v))window.__flameShow('flame-data-'+v);
 filt();}
function filt(){var q=inp.value.toLowerCase().trim(), n=0, b=0, h=hrt.checked, ks=kinds();
 rows.forEach(function(r){var ok=(!q||r.textContent.toLowerCase().indexOf(q)>=0)&&!(h&&r.hasAttribute('data-rt'))&&
  (!ks||ks.indexOf(r.getAttribute('data-kind'))>=0);
  r.style.display=ok?'':'none'; if(ok){n++;b+=+r.getAttribute('data-bytes');}});
 cnt.textContent=n+' of '+rows.length+' call sites shown'+(q?' ('+fmt(b)+' matching)':'');}
function fmt(n){var u=['B','KiB','MiB','GiB','TiB','PiB','EiB'],i=0;while(n>=1024&&i<6){n/=1024;i++;}return i?n.toFixed(1)+' '+u[i]:n+' B';}
inp.addEventListener('input',filt); hrt.addEventListener('change',filt); if(kv)kv.addEventListener('change',showView); filt();
if(location.hash==='#selftest'){var out=[],ok=true;
 function col(c){return rows.filter(function(r){return r.style.display!=='none';}).map(function(r){return key(r,c);});}
 function sorted(a,d){for(var i=1;i<a.length;i++)if(d*(a[i]-a[i-1])<0)return false;return true;}
 var view0=kv?kv.value:null; if(kv){kv.value='all';showView();}
 try{
  var bc=-1,kc=-1; for(var i=0;i<ths.length;i++){if(ths[i].id==='col-bytes')bc=i;if(ths[i].id==='col-blocks')kc=i;}
  ths[kc].click(); var a=col(kc); var s1=sorted(a,-1); ths[kc].click(); var s2=sorted(col(kc),1);
  ths[bc].click(); var s3=sorted(col(bc),-1); ths[bc].click(); var s4=sorted(col(bc),1);
  ths[bc].click();
  out.push('sort-blocks-desc='+s1,'sort-blocks-asc='+s2,'sort-bytes-desc='+s3,'sort-bytes-asc='+s4);
  ok=s1&&s2&&s3&&s4;
  var first=rows[0]?rows[0].getAttribute('data-rank'):'none'; out.push('first-rank='+first);
  var q=rows.length?rows[rows.length-1].cells[0].textContent:''; inp.value='zz-no-such-site-zz'; filt();
  var hidden=col(bc).length; inp.value=''; filt(); var shown=col(bc).length;
  out.push('filter-none='+hidden,'filter-all='+shown); ok=ok&&hidden===0&&shown===rows.length;
  hrt.click(); var vis=rows.filter(function(r){return r.hasAttribute('data-rt')&&r.style.display!=='none';}).length;
  var rest=col(bc).length; hrt.click(); out.push('hide-rt-visible='+vis,'own-sites='+rest);
  ok=ok&&vis===0&&col(bc).length===rows.length;
  var svgs=Array.prototype.filter.call(document.querySelectorAll('svg'),function(e){return e.getBoundingClientRect().width>0;}), paths=0;
  for(var j=0;j<svgs.length;j++)paths+=svgs[j].querySelectorAll('path').length;
  var r0=svgs.length?svgs[0].getBoundingClientRect():{width:0,height:0};
  out.push('svgs='+svgs.length,'paths='+paths,'svg0='+Math.round(r0.width)+'x'+Math.round(r0.height));
  ok=ok&&svgs.length>=2&&paths>0&&r0.width>100;
 }catch(e){ok=false;out.push('error='+e);}
 // the kind filter: every view shows only its kinds' rows, one set of charts, its flame graph
 if(kv)try{var opts=kv.options;
  for(var o=0;o<opts.length;o++){kv.value=opts[o].value; showView(); var ks=kinds(), nr=0, nb=0, bad=0;
   rows.forEach(function(r){if(r.style.display==='none')return; nr++; nb+=+r.getAttribute('data-bytes');
    if(ks.indexOf(r.getAttribute('data-kind'))<0)bad++;});
   var ch=0, gr=0, cv=document.querySelectorAll('.charts.kview'), gv=document.querySelectorAll('.panel.kview');
   for(var j=0;j<cv.length;j++)if(cv[j].getBoundingClientRect().height>0)ch++;
   for(var j=0;j<gv.length;j++)if(gv[j].getBoundingClientRect().height>0)gr++;
   var fr=window.__flameRoot?window.__flameRoot():null;
   out.push('view-'+kv.value+'=rows:'+nr+',bytes:'+nb+',charts:'+ch+',flame:'+(fr===null?'none':fr.replace(/[ ,]/g,'_'))+
    (gv.length?',growth:'+gr:''));
   ok=ok&&bad===0&&ch===1&&(!gv.length||gr===1);}
  kv.value=view0; showView(); out.push('view-default='+view0);
 }catch(e){ok=false;out.push('view-error='+e);}
 try{var ft=window.__flameTest?window.__flameTest():null;
  if(ft){out=out.concat(ft.out);ok=ok&&ft.ok;}
  else{out.push('flame=none');ok=ok&&!document.getElementById('flame');}
 }catch(e){ok=false;out.push('flame-error='+e);}
 out.push('errors='+window.__errs.length); ok=ok&&!window.__errs.length;
 var el=document.getElementById('selftest'); el.textContent=(ok?'SELFTEST PASS ':'SELFTEST FAIL ')+out.join(' ');
 document.title=(ok?'SELFTEST PASS':'SELFTEST FAIL');}
})();
"""

FLAME_CSS = """
.flame-panel{background:#fff;border:1px solid #dde3ea;border-radius:6px;padding:8px 10px;margin-bottom:12px}
.flame-head{display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 12px;margin-bottom:6px}
.flame-head button{font:inherit;font-size:12px;padding:2px 10px;border:1px solid #b9c3cd;border-radius:4px;background:#f4f6f8;cursor:pointer}
.flame{position:relative;width:100%;overflow:hidden;font:11.5px/17px ui-monospace,"DejaVu Sans Mono",monospace}
.fb{position:absolute;height:17px;overflow:hidden;white-space:nowrap;cursor:pointer;color:#1d2630;box-shadow:inset -1px -1px #fff}
.fb span{display:block;padding:0 3px;overflow:hidden;text-overflow:ellipsis}
.fb:hover{box-shadow:inset 0 0 0 1px #1d2630}
.fb.anc{opacity:.6}
.fb.zr{box-shadow:inset 0 0 0 2px #1d2630}
.flame-legend{font-size:12px;color:#56636f;margin-top:6px}
.flame-legend i.sw{display:inline-block;width:11px;height:11px;vertical-align:-1px;margin:0 3px 0 10px;border-radius:2px;font-style:normal}
.flame-tip{position:fixed;display:none;z-index:10;max-width:560px;background:#1d2630;color:#fff;font-size:12px;padding:6px 9px;border-radius:4px;white-space:pre-line;word-break:break-word;pointer-events:none}
#flame-selftest{display:none}
"""

FLAME_JS = r"""
(function(){
// flame(SRC): draw the graph of the JSON in the element SRC; again for another view of the
// kind filter (window.__flameShow(id)): the box container and the Reset button are replaced
// by fresh copies, so that no listener of the previous graph is left
function flame(src){
var el=document.getElementById('flame');
window.__flameTest=null;
if(!el||!src)return;
if(el.firstChild){var el2=el.cloneNode(false);el.parentNode.replaceChild(el2,el);el=el2;
 var r0=document.getElementById('flame-reset');if(r0)r0.parentNode.replaceChild(r0.cloneNode(true),r0);}
var D=JSON.parse(src.textContent), S=D.s, F=D.f, R=D.n, W=5, ROW=18, n=R.length/W;
var fi=[],dep=[],byt=[],bs=[],blk=[],cut=[],par=[],end=[],x0=[],box=[],path=[],off=[],maxd=0;
for(var i=0;i<n;i++){
 fi[i]=R[i*W];dep[i]=R[i*W+1];bs[i]=String(R[i*W+2]);byt[i]=+R[i*W+2];blk[i]=R[i*W+3];cut[i]=+R[i*W+4];
 path[dep[i]]=i; par[i]=dep[i]?path[dep[i]-1]:-1; end[i]=i+1;
 x0[i]=par[i]<0?0:off[par[i]]; if(par[i]>=0)off[par[i]]+=byt[i]; off[i]=x0[i];
 if(dep[i]>maxd)maxd=dep[i];}
for(var i=n-1;i>0;i--)if(end[i]>end[par[i]])end[par[i]]=end[i];
function str(j){return j>=0?S[j]:'';}
function shortFn(f){var s=f.replace(/\s+$/,''),q=[' const',' volatile',' &&',' &',' noexcept'],k,again=true;
 while(again){again=false;for(k=0;k<q.length;k++)if(s.slice(-q[k].length)===q[k]){s=s.slice(0,-q[k].length).replace(/\s+$/,'');again=true;break;}}
 if(s.charAt(s.length-1)!==')')return f;
 for(var d=0,i=s.length-1;i>=0;i--){var c=s.charAt(i);d+=(c===')')-(c==='(');
  if(d===0){var h=s.slice(0,i).replace(/\s+$/,'');return (!h||/operator$/.test(h))?f:h;}}
 return f;}
function hue(s){var h=0;for(var k=0;k<s.length;k++)h=(h*31+s.charCodeAt(k))>>>0;return h;}
function colour(i){if(i===0)return '#c9d1da'; var f=F[fi[i]],k=f[4]&3,h=hue(str(f[0]));
 if(k===1)return 'hsl(210,12%,'+(74+h%10)+'%)';
 if(k===2)return 'hsl(270,22%,'+(80+h%8)+'%)';
 return 'hsl('+(h%45)+','+(78+h%15)+'%,'+(58+(h>>>8)%14)+'%)';}
function fmt(v){var u=['B','KiB','MiB','GiB','TiB','PiB','EiB'],k=0;while(v>=1024&&k<6){v/=1024;k++;}return k?v.toFixed(1)+' '+u[k]:v+' B';}
function commas(s){return s.replace(/\B(?=(\d{3})+(?!\d))/g,',');}
function label(i){if(i===0)return 'all: '+fmt(byt[0])+' in '+commas(String(blk[0]))+(blk[0]===1?' block':' blocks');
 var f=F[fi[i]],fl=str(f[1]); return (f[4]&8?str(f[0]):shortFn(str(f[0])))+(fl?'  '+fl.split('/').pop()+':'+(f[2]||'?'):'');}
var frag=document.createDocumentFragment();
for(var i=0;i<n;i++){var d=document.createElement('div'),t=document.createElement('span');
 d.className='fb'+(i?' fk'+(F[fi[i]][4]&3):''); d.setAttribute('data-i',i);
 d.style.top=(dep[i]*ROW)+'px'; d.style.background=colour(i); t.textContent=label(i);
 d.appendChild(t); box[i]=d; frag.appendChild(d);}
el.appendChild(frag); el.style.height=((maxd+1)*ROW)+'px';
var Z=0;
function zoom(z){Z=z;
 for(var i=0;i<n;i++){var d=box[i],s=d.style;
  if(i>=z&&i<end[z]){s.display='';s.left=(100*(x0[i]-x0[z])/byt[z])+'%';s.width=(100*byt[i]/byt[z])+'%';
   d.classList.remove('anc');}
  else if(i<z&&z<end[i]){s.display='';s.left='0';s.width='100%';d.classList.add('anc');}
  else s.display='none';
  d.classList.toggle('zr',i===z&&z>0);}}
zoom(0);
el.addEventListener('click',function(e){var d=e.target.closest('.fb');if(d)zoom(+d.getAttribute('data-i'));});
var rst=document.getElementById('flame-reset'); if(rst)rst.addEventListener('click',function(){zoom(0);});
var tip=document.getElementById('flame-tip');
function tipText(i){var L=[];
 if(i===0)L.push('all stacks');
 else{var f=F[fi[i]],k=f[4];
  L.push(str(f[0]));
  if(str(f[1]))L.push(str(f[1])+':'+(f[2]||'?')); else L.push('no line information');
  L.push((str(f[3])||'module unknown')+((k&3)===1?' (C/C++ runtime)':(k&3)===2?' (not symbolized)':'')+
   (k&4?', inlined into the box above':''));}
 L.push(commas(bs[i])+' bytes ('+fmt(byt[i])+'), '+(100*byt[i]/byt[0]).toFixed(2)+'% of all'+
  (Z>0&&i!==Z&&i>=Z&&i<end[Z]?', '+(100*byt[i]/byt[Z]).toFixed(2)+'% of the zoomed box':''));
 L.push(commas(String(blk[i]))+(blk[i]===1?' block':' blocks'));
 if(cut[i]>0)L.push('not drawn: '+fmt(cut[i])+' in callees narrower than '+(D.pm/10)+'% of all');
 return L.join('\n');}
function showTip(e){var d=e.target.closest&&e.target.closest('.fb'); if(!d){tip.style.display='none';return;}
 tip.textContent=tipText(+d.getAttribute('data-i')); tip.style.display='block';
 var x=e.clientX+14,y=e.clientY+14,r=tip.getBoundingClientRect();
 if(x+r.width>window.innerWidth-4)x=Math.max(4,e.clientX-r.width-14);
 if(y+r.height>window.innerHeight-4)y=Math.max(4,e.clientY-r.height-14);
 tip.style.left=x+'px'; tip.style.top=y+'px';}
el.addEventListener('mousemove',showTip); el.addEventListener('mouseover',showTip);
el.addEventListener('mouseleave',function(){tip.style.display='none';});
// self-test (page URL #selftest): widths proportional to bytes, zoom, reset, tooltip
window.__flameTest=function(){var out=[],ok=true;
 function w(i){return box[i].getBoundingClientRect().width;}
 function vis(i){return box[i].style.display!=='none'&&w(i)>0;}
 var RW=w(0),err=0;
 for(var i=0;i<n;i++){var m=w(i);box[i].setAttribute('data-mw',(m/RW).toFixed(5));
  err=Math.max(err,Math.abs(m-RW*byt[i]/byt[0]));}
 out.push('flame-boxes='+n,'flame-depth='+maxd,'flame-root-px='+Math.round(RW),'flame-maxerr-px='+err.toFixed(3));
 ok=ok&&n>0&&RW>300&&err<0.5;
 var t=-1;for(var i=1;i<n;i++)if(byt[i]<byt[0]&&end[i]>i+1&&(t<0||byt[i]>byt[t]))t=i;
 if(t<0)for(var i=1;i<n;i++)if(byt[i]<byt[0]&&(t<0||byt[i]>byt[t]))t=i;
 if(t<0){out.push('flame-zoom=none');return {ok:ok,out:out};}
 box[t].dispatchEvent(new MouseEvent('mousemove',{bubbles:true,clientX:20,clientY:20}));
 var tt=tip.textContent, tipok=tip.style.display==='block'&&tt.indexOf(commas(bs[t])+' bytes')>=0&&
  tt.indexOf('\n'+commas(String(blk[t]))+(blk[t]===1?' block':' blocks'))>=0;
 var pre=document.getElementById('flame-selftest'); if(pre)pre.textContent=tt;
 box[t].click();
 var full=Math.abs(w(t)-RW)<0.5, zerr=0, hid=0, outside=0, anc=0;
 for(var i=0;i<n;i++){
  if(i>=t&&i<end[t]){var m=w(i);box[i].setAttribute('data-zw',(m/RW).toFixed(5));
   zerr=Math.max(zerr,Math.abs(m-RW*byt[i]/byt[t]));}
  else if(i<t&&t<end[i]){anc++;if(Math.abs(w(i)-RW)>=0.5)zerr=99;}
  else{outside++;if(!vis(i))hid++;}}
 out.push('flame-zoom='+t,'flame-zoom-full='+full,'flame-zoom-maxerr-px='+zerr.toFixed(3),
  'flame-zoom-hidden='+hid+'/'+outside,'flame-zoom-ancestors='+anc);
 ok=ok&&full&&zerr<0.5&&hid===outside&&outside>0;
 box[0].click(); var back=true;
 for(var i=0;i<n;i++)if(!vis(i)||Math.abs(w(i)/RW-(+box[i].getAttribute('data-mw')))>1e-4)back=false;
 box[t].click(); rst.click(); var back2=true;
 for(var i=0;i<n;i++)if(!vis(i)||Math.abs(w(i)/RW-(+box[i].getAttribute('data-mw')))>1e-4)back2=false;
 out.push('flame-reset-all='+back,'flame-reset-button='+back2,'flame-tooltip='+tipok);
 ok=ok&&back&&back2&&tipok;
 box[t].dispatchEvent(new MouseEvent('mouseleave',{bubbles:false}));
 el.dispatchEvent(new MouseEvent('mouseleave',{bubbles:false}));
 return {ok:ok,out:out};};
}
window.__flameShow=function(id){flame(document.getElementById(id));};
window.__flameRoot=function(){var d=document.querySelector('#flame .fb');return d?d.textContent:null;};
flame(document.getElementById('flame-data'));
})();
"""


def flame_panel(fl):
    """The flame graph's panel (HTML), or a one-line note why there is none."""
    if fl is None or not fl.blocks:
        return ""
    if not fl.total:
        return ('<p class="notes" id="flame-panel">No flame graph: the unfreed blocks hold 0 '
                'bytes.</p>\n')
    notes = []
    if fl.cut_boxes:
        notes.append("Not drawn: %s boxes narrower than %g%% of the total (or beyond the %s "
                     "widest), with their callees; %s in %s blocks have stacks drawn only down "
                     "to their last wider box (hover a box: <i>not drawn</i>)."
                     % ("{:,}".format(fl.cut_boxes), FLAME_MIN_PER_MILLE / 10,
                        "{:,}".format(FLAME_MAX_BOXES), esc(hb(fl.cut_bytes)),
                        "{:,}".format(fl.cut_blocks)))
    if fl.max_frames <= 1:
        notes.append('<span class="warn">One frame per stack (trace depth 1): the graph has '
                     'one level, the call sites; trace with <code>--depth 16</code> '
                     '(<code>MMLEAK_DEPTH=16</code>) to see whole stacks.</span>')
    return (
        '<div class="flame-panel" id="flame-panel"><div class="flame-head"><b>Unfreed bytes '
        'by stack</b><span class="count">flame graph (icicle): root at the top &middot; click '
        'a box to zoom into it, <i>all</i> or Reset to zoom out &middot; hover for details'
        '</span><button id="flame-reset" type="button">Reset zoom</button></div>\n'
        '<div id="flame" class="flame"></div>\n'
        '<div class="flame-legend">Under <i>all</i>, each row is one frame deeper: from the '
        'outermost frame recorded of each stack (<code>_start</code> or '
        '<code>start_thread</code> when the stack is whole) down to the caller of the '
        'allocator. A box is a function at one source line, as wide as the unfreed bytes of '
        'the blocks whose stacks pass through it; widest first.</div>\n'
        '<div class="flame-legend">Colours:<i class="sw" style="background:hsl(25,85%%,62%%)"></i>the '
        'program<i class="sw" style="background:hsl(210,12%%,78%%)"></i>C/C++ runtime (libc, libstdc++, '
        'ld.so, code from the system headers)<i class="sw" style="background:hsl(270,22%%,83%%)"></i>not '
        'symbolized</div>%s<div id="flame-tip" class="flame-tip"></div>'
        '<pre id="flame-selftest"></pre></div>\n'
        '<script type="application/json" id="flame-data">%s</script>\n'
        % ("".join('<div class="flame-legend">%s</div>' % n for n in notes), flame_json(fl)))


def frame_cells(fr, addr):
    """(function html, location html, module html, sortable texts) for one frame."""
    if fr is None:
        return ('<span class="unres">0x%x</span>' % addr, '<span class="unres">not symbolized'
                '</span>', "", ("0x%x" % addr, "", ""))
    if fr.function or fr.file:
        fn = esc(fr.function or "??")
        loc = ('<span title="%s">%s:%s</span>' % (esc(fr.file), esc(short_path(fr.file)),
                                                  esc(fr.line or "?"))
               if fr.file else '<span class="unres">no line info</span>')
        if fr.inlined:
            loc += "".join('<div class="inl">inlined into %s at %s:%s</div>'
                           % (esc(f or "??"), esc(short_path(fl or "??")), esc(ln or "?"))
                           for f, fl, ln in fr.inlined)
        texts = (fr.function or "??", "%s:%s" % (fr.file, fr.line) if fr.file else "")
    else:
        fn = '<span class="unres">%s</span>' % esc(symbolize.frame_label(fr))
        loc = '<span class="unres">%s</span>' % esc(fr.error or "unresolved")
        texts = (symbolize.frame_label(fr), "")
    mod = esc("%s+0x%x" % (fr.module, fr.offset)) if fr.module else ""
    return fn, loc, mod, texts + (("%s+0x%x" % (fr.module, fr.offset)) if fr.module else "",)


def site_label(fr, addr):
    """Short name for charts: the function without its argument list."""
    if fr is None:
        return "0x%x" % addr
    if fr.function:
        fn = fr.function
        depth = 0
        for i, c in enumerate(fn):
            depth += (c == "<") - (c == ">")
            if c == "(" and depth == 0 and not fn.startswith("operator"):
                return fn[:i] or fn
        return fn
    return symbolize.frame_label(fr)


def symbol_summary(addrs, frames, sym_error):
    """-> (resolved count, total, Counter of reasons)."""
    reasons = collections.Counter()
    ok = 0
    for a in addrs:
        fr = frames.get(a)
        if fr is None:
            reasons[sym_error or "not symbolized"] += 1
        elif fr.function or fr.file:
            ok += 1
        else:
            reasons[fr.error or "no symbol"] += 1
    return ok, len(addrs), reasons


def start_text(start):
    """The trace start (Unix seconds) as a local date, or why not."""
    if not start:
        return "start time unknown"
    try:
        return datetime.datetime.fromtimestamp(start).astimezone().strftime(
            "%Y-%m-%d %H:%M:%S %Z")
    except (OverflowError, ValueError, OSError):
        return "start %d (not a valid date)" % start


def build_html(ctx):
    """ctx: dict with everything the page shows (see render())."""
    table, frames = ctx["sites"], ctx["frames"]
    deep = ctx["depth"] > 1
    total_b, total_n = ctx["bytes"], ctx["blocks"]
    p = []
    w = p.append
    title = "mmleak: %s in %d blocks not freed" % (hb(total_b), total_n)
    proc = "pid %s" % ctx["pid"] if ctx["pid"] else "process unknown"
    w("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
      "<title>%s (%s)</title>\n<style>%s</style>\n"
      "<script>window.__errs=[];window.addEventListener('error',function(e){"
      "window.__errs.push(String(e.message));});</script>\n</head><body>\n"
      % (esc(title), esc(proc), CSS + FLAME_CSS))
    w("<header><h1>mmleak: <b>%s</b> in <b>%s</b> blocks not freed</h1>"
      % (esc(hb(total_b)), esc("{:,}".format(total_n))))
    w('<div class="sub">%s%s%s</div></header>\n<main>\n'
      % (esc(proc), (" &middot; trace %s" % esc(ctx["trace"])) if ctx.get("trace") and
         ctx["trace"] != ctx["pid"] else "",
         (" &middot; <code>%s</code>" % esc(ctx["cmd"])) if ctx["cmd"] else
         " &middot; command line unknown"))

    # -- headline cards --
    def card(k, v, n=""):
        w('<div class="card"><div class="k">%s</div><div class="v">%s</div>'
          '<div class="n">%s</div></div>' % (k, v, n))
    w('<div class="cards">')
    card("Unfreed bytes", esc(hb(total_b)), esc("{:,} bytes".format(total_b)))
    card("Unfreed blocks", esc("{:,}".format(total_n)),
         esc("mean %s" % hb(total_b // total_n)) if total_n else "")
    card("Call sites", esc("{:,}".format(len(table))),
         "top site: %s" % esc(hb(table[0].bytes)) if table else "")
    span = ctx["end_time"]
    start = ctx["start"]
    when = start_text(start)
    card("Time span", esc(dur(span)), esc("from %s" % when))
    card("Events read", esc("{:,}".format(ctx["events"])), esc(ctx["events_note"]))
    w("</div>\n")

    # -- notes: filters, symbols, problems --
    notes = []
    flt = []
    if ctx.get("since") is not None:
        flt.append("allocated at or after %g s from the start (--since %g)"
                   % (ctx["since"], ctx["since"]))
    if ctx.get("older_than") is not None:
        flt.append("at least %g s old at the end of the trace (--older-than %g)"
                   % (ctx["older_than"], ctx["older_than"]))
    if ctx.get("baseline"):
        flt.append("not alive yet in the snapshot %s (--baseline)" % ctx["baseline"])
    if flt:
        notes.append('<b>Filter applied:</b> only blocks %s: %s in %s blocks shown of %s in '
                     '%s blocks not freed.' % (esc(" and ".join(flt)), esc(hb(total_b)),
                                               esc("{:,}".format(total_n)),
                                               esc(hb(ctx["before_bytes"])),
                                               esc("{:,}".format(ctx["before_blocks"]))))
    else:
        notes.append("<b>No filter:</b> every block allocated while tracing and never freed "
                     "is counted.")
    # the reachability scan's word, as the text report gives it above its leak summary: why
    # the kinds are unknown (no scan, or the reason it wrote no result)
    if ctx.get("reachability_note"):
        notes.append('<span class="warn" id="reachability-note"><b>Reachability:</b> %s'
                     '</span>' % esc(ctx["reachability_note"]))
    ok, tot, reasons = ctx["symbols"]
    if tot:
        if reasons:
            hint = ""
            if any("no symbol or line information" in r for r in reasons):
                hint = (" &mdash; install the debug symbols of those libraries (Debian: the "
                        "<code>-dbgsym</code> packages, or set <code>DEBUGINFOD_URLS</code>)")
            notes.append('<span class="warn"><b>Symbols:</b> %d of %d addresses could not be '
                         'symbolized:</span> %s%s' % (tot - ok, tot, "; ".join(
                             "%s (%d)" % (esc(r), n) for r, n in reasons.most_common(6)), hint))
        else:
            notes.append("<b>Symbols:</b> all %d addresses resolved to function and file:line."
                         % tot)
    if deep:
        how = ("with stacks through the runtime and the wrappers to the program's own frame "
               "(MMLEAK_DEPTH=auto)" if ctx.get("depth_auto") else
               "with whole stacks (up to %d frames, MMLEAK_DEPTH's default)" % MAX_DEPTH
               if ctx["depth"] >= MAX_DEPTH else
               "with %d return addresses per allocation" % ctx["depth"])
        notes.append("<b>Call sites</b> are the first frame outside the C/C++ runtime and the "
                     "allocation wrappers (%s seen); traced %s (click <i>stack</i> to see "
                     "them)." % (esc(", ".join(ctx["wrapper_hits"]) or "none"), how))
    elif ctx["wrapped_sites"]:
        notes.append('<span class="warn"><b>Wrappers:</b> %d call sites are inside an '
                     'allocation wrapper (%s): trace with <code>--depth 4</code> to see who '
                     'called them.</span>' % (ctx["wrapped_sites"],
                                              esc(", ".join(ctx["wrapper_hits"]))))
    found, nfound = ctx.get("found_wrappers") or ([], 0)
    if ctx.get("found_wrappers") is None:
        notes.append("<b>Wrappers:</b> the program's own were not looked for "
                     "(<code>--no-wrapper-detection</code>).")
    elif nfound:
        notes.append("<b>Allocation wrappers found</b> in the program (their callers are the "
                     "call sites; mmleak-wrappers(7)): %s%s" % (
                         "; ".join("<code>%s</code>: %s" % (esc(l.split(": ", 1)[0]),
                                                            esc(l.split(": ", 1)[1]))
                                   for l in found),
                         "; and %d more" % (nfound - len(found)) if nfound > len(found) else ""))
    if ctx.get("foreign"):
        notes.append("%s frees of blocks allocated before tracing began (not leaks)."
                     % esc("{:,}".format(ctx["foreign"])))
    for n in ctx.get("extra_notes", []):
        notes.append(n)
    w('<div class="notes"><ul>%s</ul></div>\n' % "".join("<li>%s</li>" % n for n in notes))

    views = ctx.get("views")
    if views:
        w(kind_summary_html(ctx))
    # -- charts --
    if views:
        for v in views:
            w('<div class="charts kview" data-view="%s"%s><div class="chart">%s</div>'
              '<div class="chart">%s</div></div>\n'
              % (v["key"], "" if v["key"] == ctx["view_default"] else ' style="display:none"',
                 v["svg_sites"], v["svg_time"]))
    else:
        w('<div class="charts"><div class="chart" id="chart-sites">%s</div>'
          '<div class="chart" id="chart-time">%s</div></div>\n'
          % (ctx["svg_sites"], ctx["svg_time"]))

    # -- growth over time, and the incremental view (mmleak.py report only) --
    for panel in ctx.get("extra_panels", []):
        w(panel)

    # -- the flame graph --
    if views:
        dv = next(v for v in views if v["key"] == ctx["view_default"])
        w(flame_panel(dv["flame"] if dv["flame"].blocks else ctx.get("flame")))
        if ctx.get("flame") is not None and ctx["flame"].blocks:
            for v in views:
                w('<script type="application/json" id="flame-data-%s">%s</script>\n'
                  % (v["key"], flame_json(v["flame"])))
    else:
        w(flame_panel(ctx.get("flame")))

    # -- the table --
    shown = min(len(table), ctx["top"])
    w('<div class="tools"><input id="filter" type="search" placeholder="Filter call sites '
      '(function, file, module)&hellip;" autocomplete="off"><span class="count" id="count">'
      '</span><label class="count"><input type="checkbox" id="hide-rt"> hide call sites in '
      'runtime libraries (libc, libstdc++, ld.so)</label><span class="count">click a column '
      'header to sort</span></div>\n')
    cols = [("col-rank", "#", "n"), ("col-func", "Function", "s"),
            ("col-loc", "File:line", "s"), ("col-mod", "Module+offset", "s"),
            ("col-bytes", "Bytes", "n"), ("col-blocks", "Blocks", "n"),
            ("col-mean", "Mean", "n"), ("col-min", "Min", "n"), ("col-max", "Max", "n"),
            ("col-oldest", "Oldest", "n"), ("col-youngest", "Youngest", "n")]
    if views:
        cols.append(("col-kind", "Kind", "s"))     # last: the columns before keep their places
    w('<table id="sites"><thead><tr>%s</tr></thead><tbody>\n' % "".join(
        '<th id="%s" data-t="%s"%s>%s</th>' % (i, t, ' class="desc"' if i == "col-bytes"
                                               else "", n) for i, n, t in cols))
    top_bytes = max(table[0].bytes, 1) if table else 1
    for r, site in enumerate(table[:shown]):
        w(site_row(r, site, frames.get(site.caller), frames, deep, top_bytes, bool(views)))
    w("</tbody></table>\n")
    if not table:
        w("<p><b>No leaks:</b> every block allocated while tracing (and passing the filter) "
          "was freed.</p>\n")
    if len(table) > shown:
        rest = table[shown:]
        w('<p class="warn" id="capnote">Showing the top %d of %s call sites; the other %s '
          'hold %s in %s blocks (use <code>mmleak.py report --csv</code> for all).</p>\n'
          % (shown, "{:,}".format(len(table)), "{:,}".format(len(rest)),
             esc(hb(sum(s.bytes for s in rest))), "{:,}".format(sum(s.blocks for s in rest))))
    w('<footer>Generated by mmleak-panda.py on %s from %s. Ages are at the end of the trace '
      '(%s after its start). Mean, min, max: block sizes.</footer>\n'
      % (esc(time.strftime("%Y-%m-%d %H:%M:%S")), esc(ctx["source"]), esc(dur(span))))
    w('<pre id="selftest"></pre>\n</main>\n<script>%s</script>\n<script>%s</script>\n'
      '</body></html>\n' % (FLAME_JS, JS))
    return "".join(p)


def site_row(r, site, fr, frames, deep, top_bytes, kinds=False):
    """The table's row R (from 0) of a Site (report.site_table); KINDS: with its kind's
    column (a scan ran)."""
    fn, loc, mod, texts = frame_cells(fr, site.caller)
    b, n = site.bytes, site.blocks
    mean = b / n
    extra = ""
    if deep:
        st, k = site.stack, site.index
        if k:
            extra += '<div class="via">via %s</div>' % esc(" \u2190 ".join(
                site_label(frames.get(c), c) for c in st[:k][::-1]))
        lines = []
        for j, c in enumerate(st):
            f2 = frames.get(c)
            if f2 is not None and f2.file:
                lab = '%s <span title="%s">%s:%s</span>' % (
                    esc(f2.function or "??"), esc("%s:%s" % (f2.file, f2.line)),
                    esc(short_path(f2.file, 2)), esc(f2.line or "?"))
            else:
                lab = esc(symbolize.frame_label(f2) if f2 else "0x%x" % c)
            lines.append("<div>%s%d %s</div>" % ("&rarr; " if j == k else "", j, lab))
        extra += ('<details class="stk"><summary>stack%s</summary>%s</details>'
                  % (" (heaviest of %d)" % site.nstacks if site.nstacks > 1 else "",
                     "".join(lines)))
    rt = sites.is_runtime(fr)
    if rt:
        extra = '<span class="rt">runtime library</span>' + extra
    kcell = ('<td class="kind" data-v="%d">%s</td>' % (sites.KINDS.index(site.kind),
                                                        esc(site.kind))) if kinds else ""
    return ('<tr data-rank="%d" data-bytes="%d" data-kind="%s"%s><td class="num" data-v="%d">%d'
            '</td><td class="fn" data-v="%s">%s%s<span class="bar" style="width:%.1f%%"></span>'
            '</td><td class="loc" data-v="%s">%s</td><td class="mod" data-v="%s">%s</td>'
            '<td class="num" data-v="%d" title="%s bytes">%s</td><td class="num" data-v="%d">%s'
            '</td><td class="num" data-v="%.1f">%s</td><td class="num" data-v="%d">%s</td>'
            '<td class="num" data-v="%d">%s</td><td class="num" data-v="%d">%s</td>'
            '<td class="num" data-v="%d">%s</td>%s</tr>\n'
            % (r + 1, b, site.kind, ' data-rt="1" class="rtrow"' if rt else "", r + 1, r + 1,
               esc(texts[0]), fn, extra, 100.0 * b / top_bytes,
               esc(texts[1]), loc, esc(texts[2]), mod,
               b, "{:,}".format(b), esc(hb(b)), n, "{:,}".format(n),
               mean, esc(hb(mean)), site.min, esc(hb(site.min)), site.max, esc(hb(site.max)),
               site.oldest, esc(dur(site.oldest)), site.youngest, esc(dur(site.youngest)),
               kcell))


def render(rep, meta, wrappers=None, top=TOP_ROWS):
    """The page of the report REP (its survivors, frames, end_time, depth, trace_depth,
    since, older_than: see page_model).  META: the texts (pid, trace, cmd, start, events,
    events_note, symbol_error, foreign, baseline, unfiltered, source, extra_notes,
    extra_panels)."""
    wrappers = wrappers or report.report_wrappers(rep)
    frames = rep.get("frames") or {}
    depth = report.site_depth(rep)
    kept, table, stacks = page_model(rep, wrappers)
    labels = [site_label(frames.get(s.caller), s.caller)
              for s in table[:max(CHART_SITES, TIMELINE_SITES)]]
    # numbering makes identical function names (two sites in one function) distinguishable
    labels = ["#%d %s" % (i + 1, l) for i, l in enumerate(labels)]
    hits = {sites.base_name(frames[c].function) for st in stacks for c in st
            if frames.get(c) in wrappers}
    wrapped = sum(1 for s in table if frames.get(s.caller) in wrappers) if depth <= 1 else 0
    everything = rep["survivors"]
    ctx = dict(meta, depth=depth, end_time=rep.get("end_time") or 0,
               depth_auto=rep.get("depth_auto"))
    ctx["reachability_note"] = report.reachability_note(rep)
    ctx["views"] = (kind_views(rep, kept, wrappers, frames, depth, ctx["end_time"])
                    if rep.get("kinds") is not None else None)
    df = blocks_frame(kept, stacks, depth)
    if rep.get("groups") is not None:       # per-stack aggregates: no pass over the blocks
        used = {c for g in rep["groups"] for c in g.callers[:depth]}
    else:
        used = {c for a in everything for c in a.callers[:depth]}
    if ctx["views"]:
        keys = [v["key"] for v in ctx["views"]]
        ctx["view_default"] = "leaks" if next(v for v in ctx["views"] if v["key"] ==
                                              "leaks")["blocks"] else "all"
        assert ctx["view_default"] in keys
        ctx["kind_totals"] = report.kind_totals(rep)
        ctx["suppressed"] = rep.get("suppressed")
        ctx["suppressed_total"] = rep.get("suppressed_total")
        if rep.get("growth"):
            ctx["extra_panels"] = [growth_panel(rep, wrappers, v["sites"],
                                                (v["key"], v["key"] == ctx["view_default"]))
                                   for v in ctx["views"]] + list(ctx.get("extra_panels") or [])
    ctx.update({
        "sites": table, "labels": labels, "frames": frames, "top": top,
        "bytes": sum(s.bytes for s in table), "blocks": sum(s.blocks for s in table),
        "before_bytes": (meta["unfiltered"][1] if meta.get("unfiltered")
                         else sum(a.size for a in everything)),
        "before_blocks": (meta["unfiltered"][0] if meta.get("unfiltered")
                          else len(everything)),
        "symbols": symbol_summary(sorted(used), frames, meta.get("symbol_error")),
        "wrapper_hits": sorted(hits), "wrapped_sites": wrapped,
        "found_wrappers": report.found_wrapper_lines(rep, 12)
        if rep.get("detect_wrappers", True) else None,
        "flame": flame_of(stacks, frames),
        "svg_sites": chart_top_sites(table, labels),
        "svg_time": chart_timeline(df, table, [l.split(" ", 1)[1] for l in labels],
                                   ctx["end_time"]),
    })
    return build_html(ctx)


# The kind filter (issue 20): with a reachability scan, the page has a view per kind, and
# each view its own charts and flame graph, made here from the blocks of its kinds.
KIND_VIEWS = (("leaks", "not still reachable (lost, possibly lost, unknown)",
               ("definite", "indirect", "possible", "unknown")),
              ("lost", "definitely and indirectly lost", ("definite", "indirect")),
              ("definite", "definitely lost", ("definite",)),
              ("indirect", "indirectly lost", ("indirect",)),
              ("possible", "possibly lost", ("possible",)),
              ("reachable", "still reachable", ("reachable",)),
              ("unknown", "reachability unknown", ("unknown",)),
              ("all", "all blocks not freed", sites.KINDS))


def kind_views(rep, kept, wrappers, frames, depth, end_time):
    """[view dict] of the kinds' views that have blocks ("leaks" and "all" always): key,
    label, kinds, blocks, bytes, the charts (SVG) and the flame graph of its blocks."""
    kind_of = rep.get("kind_of") or (lambda a: "unknown")
    by_kind = collections.defaultdict(list)
    for a in kept:
        by_kind[kind_of(a)].append(a)
    # the exact totals per kind: from the (stack, kind) aggregates when the report has them
    # (then KEPT is a sample of the blocks), else from the blocks
    groups = rep.get("groups")
    count = collections.Counter()
    if groups is not None:
        for g in groups:
            count[g.kind or "unknown"] += g.blocks
    else:
        count.update({k: len(v) for k, v in by_kind.items()})
    views = []
    for key, label, kinds in KIND_VIEWS:
        blocks = [a for k in kinds for a in by_kind.get(k, ())]
        nblocks = sum(count[k] for k in kinds)
        if not nblocks and key not in ("leaks", "all"):
            continue
        if key == "lost" and (not count["definite"] or not count["indirect"]):
            continue            # the same as "definite" or "indirect" alone
        blocks.sort(key=lambda a: (a.time, a.ptr, a.seq))
        stacks = {}
        sub = dict(rep, survivors=blocks)
        if groups is not None:
            sub["groups"] = [g for g in groups if (g.kind or "unknown") in kinds]
        table = report.site_table(sub, stacks, wrappers)
        labels = ["#%d %s" % (i + 1, site_label(frames.get(s.caller), s.caller))
                  for i, s in enumerate(table[:max(CHART_SITES, TIMELINE_SITES)])]
        views.append({
            "key": key, "label": label, "kinds": kinds, "blocks": nblocks,
            "sites": {s.caller for s in table},
            "bytes": sum(s.bytes for s in table),
            "svg_sites": chart_top_sites(table, labels),
            "svg_time": chart_timeline(blocks_frame(blocks, stacks, depth), table,
                                       [l.split(" ", 1)[1] for l in labels], end_time),
            "flame": flame_of(stacks, frames)})
    return views


def kind_summary_html(ctx):
    """The LEAK SUMMARY (a row per kind and the suppressed) and the view chooser."""
    tot = ctx["kind_totals"]
    rows = "".join('<tr data-kind="%s"><td>%s</td><td class="num">%s</td><td class="num" '
                   'title="%s bytes">%s</td></tr>' % (k, esc(sites.KIND_TEXT[k]),
                                                     "{:,}".format(tot[k][0]),
                                                     "{:,}".format(tot[k][1]),
                                                     esc(hb(tot[k][1])))
                   for k in sites.KINDS)
    n, b = ctx.get("suppressed_total") or (0, 0)
    rows += ('<tr data-kind="suppressed"><td>suppressed</td><td class="num">%s</td>'
             '<td class="num" title="%s bytes">%s</td></tr>'
             % ("{:,}".format(n), "{:,}".format(b), esc(hb(b))))
    opts = "".join('<option value="%s" data-kinds="%s"%s>%s (%s in %s blocks)</option>'
                   % (v["key"], ",".join(v["kinds"]), " selected" if v["key"] ==
                      ctx["view_default"] else "", esc(v["label"]), esc(hb(v["bytes"])),
                      "{:,}".format(v["blocks"])) for v in ctx["views"])
    rules = "".join("<li>%s in %s blocks by <code>leak:%s</code> (%s)</li>"
                    % (esc(hb(rb)), "{:,}".format(rn), esc(r.pattern), esc(r.origin))
                    for r, rn, rb in ctx.get("suppressed") or ())
    return ('<div class="panel" id="kinds"><h2>Leak summary</h2><table class="small" '
            'id="kind-summary"><tr><th>kind</th><th>blocks</th><th>bytes</th></tr>%s</table>'
            '%s<p class="tools"><label>Show <select id="kind-view">%s</select></label>'
            '<span class="count">the charts, the flame graph and the table below follow '
            'it</span></p></div>\n' % (rows, "<ul>%s</ul>" % rules if rules else "", opts))


def write_page(page, out_path):
    if out_path in (None, "-"):
        sys.stdout.write(page)
        sys.stdout.flush()
        return
    # never opened by its name: a new file renamed over it (files.new_output)
    with files.new_output(out_path, text=True) as f:
        f.write(page)


def events_note(rep):
    """Under the count of events: allocations and frees, and where the events were read."""
    folded = rep.get("folded") or (0, 0)
    files = len(rep.get("files") or [])
    parts = []
    if rep.get("allocs") is not None:
        parts.append("%s allocations, %s frees" % ("{:,}".format(rep["allocs"]),
                                                   "{:,}".format(rep.get("frees") or 0)))
    if folded[1]:
        parts.append("%s of them folded by compaction from %d dump files, the rest read from "
                     "%d files" % ("{:,}".format(folded[0]), folded[1], files - 1))
    else:
        parts.append("%d dump files" % files)
    return ", ".join(parts)


def render_report(rep, out_path, wrappers=None, top=TOP_ROWS):
    """Entry point for ``mmleak.py report``: REP is report.build_report()'s dict.

    Optional keys read here: since, older_than (seconds; the --since/--older-than filters)
    and wrappers (more allocation wrapper names to look through)."""
    if wrappers is None or isinstance(wrappers, (list, tuple)):
        wrappers = report.report_wrappers(rep, wrappers or ())
    meta = {
        "pid": rep.get("pid"), "trace": rep.get("trace"), "cmd": rep.get("cmd"),
        "start": rep.get("start") or 0, "events": rep.get("events") or 0,
        "events_note": events_note(rep), "symbol_error": rep.get("symbol_error"),
        "foreign": len(rep.get("foreign_frees") or []),
        "since": rep.get("since"), "older_than": rep.get("older_than"),
        "baseline": rep.get("baseline"), "unfiltered": rep.get("unfiltered"),
        "source": "%d dump files%s in %s" % (
            len(rep.get("files") or []),
            " (one of them the compacted result of %d)" % rep["folded"][1]
            if (rep.get("folded") or (0, 0))[1] else "",
            os.path.dirname((rep.get("files") or ["?"])[0]) or "."),
        "extra_notes": [],
    }
    if rep.get("symbol_error"):
        meta["extra_notes"].append('<span class="warn">%s</span>' % esc(rep["symbol_error"]))
    if rep.get("gaps"):
        meta["extra_notes"].append('<span class="warn"><b>%s</b></span>' % esc(rep["gaps"]))
    if any(h.get("window") == "1" for h in (rep["shrinker"].headers if rep.get("shrinker")
                                            else [])):
        meta["extra_notes"].append("An attached window (<code>mmleak.py attach</code> .. "
                                   "<code>detach</code>): the blocks allocated while attached "
                                   "and still alive at its end; ages at its end.")
    meta["extra_panels"] = []
    if rep.get("growth") and rep.get("kinds") is None:    # (with kinds: one per view, render)
        meta["extra_panels"].append(growth_panel(rep, wrappers))
    if rep.get("freed_since_baseline") is not None:
        meta["extra_panels"].append(incremental_panel(rep))
    if rep.get("incomplete"):
        meta["extra_notes"].append('<span class="warn"><b>Incomplete input:</b> malformed '
                                   'lines were skipped (see the warnings of mmleak.py); some '
                                   'events may be missing.</span>')
    write_page(render(rep, meta, wrappers, top), out_path)


GROWTH_SITES = 8


def growth_panel(rep, wrappers, only=None, view=None):
    """Live bytes per call site at each point of mmleak.ID.series: the chart a
    daemon's leak is found with, a line that keeps rising; and the table of first, last,
    change and rate.  ONLY: just these call sites (a kind view's: the series has no kinds,
    so a site's whole series); VIEW: (key, shown) of the kind view the panel belongs to."""
    import numpy as np
    g, pts, frames = rep["growth"], rep["series"], rep["frames"]
    rows = sorted(((site, vals) for site, vals in g.items() if any(v[2] for v in vals)
                   and (only is None or site in only)),
                  key=lambda kv: (-(kv[1][-1][2] - kv[1][0][2]), kv[0]))
    Figure, _ = _mpl()
    # alone in its row, the chart takes the page's width: twice the others' width, so that
    # its text is drawn at their size (at 6.4 inches it was scaled up twice as big)
    fig = Figure(figsize=(12.8, 3.6))
    ax = fig.add_subplot(111)
    t = np.array([p.time for p in pts], dtype=np.float64)
    vmax = 1.0
    for i, (site, vals) in enumerate(rows[:GROWTH_SITES]):
        y = np.array([v[2] for v in vals], dtype=np.float64)
        vmax = max(vmax, float(y.max()))
        name = _trunc(site_label(frames.get(site), site), 40)
        # past the palette, the colours come round again: dashed, so no two lines look alike;
        # matplotlib leaves a label that starts with "_" out of the legend (redis's
        # _sdsnewlen, _dictExpand...): a space in front keeps it
        ax.plot(t, y, color=PALETTE[i % len(PALETTE)], linewidth=1.6, marker="o", markersize=2.5,
                linestyle="-" if i < len(PALETTE) else "--",
                label=" " + name if name.startswith("_") else name)
    _bytes_axis(ax.yaxis, vmax * 1.05)
    ax.set_xlabel("trace time at each point (seconds since start)")
    ax.set_ylabel("live bytes")
    ax.set_title("Live bytes per call site over time", loc="left", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(color="#ddd", linewidth=0.6)
    ax.legend(loc="upper left", bbox_to_anchor=(0, -0.22), ncol=4, fontsize=7.5, frameon=False)
    span = max(pts[-1].time - pts[0].time, 0)
    why = sites.no_rate_reason(pts)     # (a rate per hour from seconds misleads)
    trs = []
    for site, vals in rows[:40]:
        d = vals[-1][2] - vals[0][2]
        fr = frames.get(site)
        trs.append("<tr><td>%s</td><td class=n>%s</td><td class=n>%s</td><td class=n>%+d</td>"
                   "%s</tr>" % (esc(symbolize.frame_label(fr) if fr else "0x%x" % site),
                                "{:,}".format(vals[0][2]), "{:,}".format(vals[-1][2]), d,
                                "" if why else "<td class=n>%+.0f</td>"
                                % sites.hourly_rate(d, pts)))
    # the view shown first keeps the panel's id (a link to #growth lands there)
    head = ('<div class="panel" id="growth">' if view is None else
            '<div class="panel kview" data-view="%s"%s>' % (view[0], ' id="growth"' if view[1]
                                                            else ' style="display:none"'))
    note = ("" if view is None else " Only the call sites with blocks of the kinds shown "
            "(the series has no kinds: a site's line counts all its blocks).")
    if why:
        note += " No rate per hour from %s." % why
    return ('%s<h2>Growth over time</h2><p>%d points '
            'over %s of the trace (mmleak.%s.series). A call site whose live bytes keep '
            'rising is a leak.%s</p><div class="charts"><div class="chart">%s</div></div>'
            '<table class="small"><tr>'
            '<th>call site</th><th>live bytes, first point</th><th>last point</th>'
            '<th>change</th>%s</tr>%s</table></div>\n'
            % (head, len(pts), esc(dur(span)), esc(rep.get("trace") or ""), note, _svg(fig),
               "" if why else "<th>bytes per hour</th>", "".join(trs)))


def incremental_panel(rep):
    """Per call site, since the --baseline snapshot: allocated and still alive (+), of the
    snapshot freed since (-)."""
    rows = sites.incremental_sites(rep, report.report_wrappers(rep))
    frames = rep["frames"]
    trs = []
    for caller, pb, pn, mb, mn in rows[:200]:
        fr = frames.get(caller)
        trs.append("<tr><td>%s</td><td class=n>+%s</td><td class=n>+%s</td><td class=n>-%s</td>"
                   "<td class=n>-%s</td></tr>" % (esc(symbolize.frame_label(fr) if fr else
                                                      "0x%x" % caller), "{:,}".format(pb),
                                                  "{:,}".format(pn), "{:,}".format(mb),
                                                  "{:,}".format(mn)))
    freed = rep["freed_since_baseline"]
    return ('<div class="panel" id="incremental"><h2>Since the snapshot %s</h2><p>%s in %s '
            'blocks allocated since and still alive; %s in %s blocks of the snapshot freed '
            'since.</p><table class="small"><tr><th>call site</th><th>+bytes</th>'
            '<th>+blocks</th><th>&minus;bytes</th><th>&minus;blocks</th></tr>%s</table></div>\n'
            % (esc(rep["baseline"]), esc(hb(report.live_bytes(rep["survivors"]))),
               "{:,}".format(len(rep["survivors"])), esc(hb(sum(a.size for a in freed))),
               "{:,}".format(len(freed)), "".join(trs)))


# ---------------------------------------------------------------------------------------
# The classic pipe: survivor lines on stdin, read by the package's reader
# ---------------------------------------------------------------------------------------

class PageProblems(Problems):
    """The problems of the input, kept, not said: a page is written only from an input
    wholly in the format (a torn line or padding, which any dump may have, is said)."""

    def __init__(self):
        super().__init__()
        self.bad = []           # (line number, what, detail) of the lines not in the format
        self.unreadable = 0     # the errno of a read error that ended stdin

    def say(self, name, lineno, what, detail=b""):
        if what == Q_UNREADABLE:
            self.unreadable = self.unreadable or detail
        elif PROBLEMS[what][0] in (MALFORMED, DUPLICATE):
            self.bad.append((lineno, what, detail))
        else:
            super().say(name, lineno, what, detail)

    def refusal(self):
        """The one line that refuses the input (None if it is whole)."""
        if self.unreadable:     # what was read is not all of it
            return "%s; no report written" % cannot_read("<stdin>",
                                                          os.strerror(self.unreadable))
        if not self.bad:
            return None
        lineno, what, detail = self.bad[0]
        if what == Q_BAD_FIELD:
            fields = [d for n, w, d in self.bad if (n, w) == (lineno, what)]
            text = "malformed header field%s %s (%s expected)" % (
                "s" if len(fields) > 1 else "", " ".join("%s=%s" % kv for kv in fields),
                "decimal numbers" if len(fields) > 1 else "a decimal number")
        elif what == Q_BAD_STACK:
            text = "malformed stack line (#s ID FRAME..., hex): %r" % detail.rstrip(b"\n")[:60]
        elif what in LINE_NOT_IN_FORMAT:
            text = "not a dump line (PTR SEQ SIZE TIME CALLER..., hex): %r" % (
                detail.rstrip(b"\n")[:60])
        else:
            text = problem_text(what, detail)
        # every line: those the compiled reader counted without handing them back too
        lines = len({n for n, _, _ in self.bad}) + sum(
            n for (_, kind), n in self.counts.items() if kind in (MALFORMED, DUPLICATE)) - \
            len(self.bad)
        return "<stdin>:%d: %s%s; no report written" % (
            lineno, text, " (and %d more bad lines)" % (lines - 1) if lines > 1 else "")


LINE_NOT_IN_FORMAT = (Q_MALFORMED, Q_TOO_LONG, Q_CUT_START)


def read_stdin(depth=None, end_time=None):
    """The survivor lines on stdin as a report model (report.build_report's keys), read by
    shrink.Shrinker; Fail (no page) when a line is not in the format."""
    problems = PageProblems()
    sh = shrink.shrink_files(["-"], mixed=True, problems=problems)
    why = problems.refusal()
    if why:
        raise Fail(why)
    survivors = sh.survivors()
    headers = sh.headers
    hdr = headers[0] if headers else {}
    trace_depth = max([header_int(h, "depth", 1) for h in headers] or [1])
    trace_depth = max([trace_depth] + [len(a.callers) for a in survivors])
    brackets = sum(1 for e in sh.entries(False) if e[2] in (KIND_START, KIND_END))
    return {
        "trace": hdr.get("id"), "pid": hdr.get("pid"), "cmd": sh.cmd,
        "start": header_int(hdr, "start"), "survivors": survivors,
        "end_time": end_time if end_time is not None else sh.max_time,
        "depth": depth or trace_depth, "trace_depth": max(trace_depth, depth or 1),
        "foreign_frees": sh.foreign_frees(), "gaps": sh.gap_text(), "shrinker": sh,
        "clock": sh.clock, "brackets": brackets, "missing": sh.missing_stacks(),
    }


def add_arguments(p):
    p.add_argument("--maps", help="the process's mmleak.PID.maps: symbolize call sites "
                                  "(function, file:line) with eu-addr2line")
    p.add_argument("-o", "--output", help="write the page here (default: stdout)")
    p.add_argument("--since", type=errors.finite_float, metavar="SECONDS",
                   help="only blocks allocated at least SECONDS after the trace started")
    p.add_argument("--older-than", type=errors.finite_float, metavar="SECONDS",
                   help="only blocks at least SECONDS old at the end of the trace (hides "
                        "recent allocations that may still be freed)")
    p.add_argument("--end-time", type=errors.nonnegative_float, metavar="SECONDS",
                   help="when the trace ended, in seconds after its start (default: the "
                        "newest surviving allocation; survivors do not tell the true end)")
    p.add_argument("--wrappers", action="append", default=[], metavar="NAME[,NAME...]",
                   help="more allocation wrapper functions to look through (with a trace "
                        "depth > 1); default: xmalloc, xcalloc, xrealloc, xstrdup, g_malloc, "
                        "g_malloc0, g_realloc, g_strdup, operator new, ...")
    p.add_argument("--no-wrapper-detection", action="store_true",
                   help="do not look for the program's own allocation wrappers (functions "
                        "that return the block the allocator gave them) in its stacks and code")
    p.add_argument("--top", type=errors.positive_int, default=TOP_ROWS,
                   help="table rows at most (default %d)" % TOP_ROWS)
    p.add_argument("--depth", type=errors.positive_int,
                   help="frames per call site (default: the trace's)")


def build_parser():
    p = errors.Parser(
        prog=layout.command_name(PROG), see_help=True, wrap=90,
        description="Render the blocks a process never freed (the survivor lines of a shrunk "
                    "mmleak trace, on stdin) as one self-contained HTML page: headline, "
                    "charts, a flame graph of the unfreed bytes by stack and a sortable, "
                    "filterable table of the leaking call sites.  `mmleak.py report DIR` does "
                    "the same from the dump directory.",
        epilog="examples:\n"
               "  mmleak.py shrink --final mmleak.1234.*.out | %(prog)s --maps mmleak.1234.maps"
               " > mmleak.1234.html\n"
               "  awk '/^#s / || NF >= 5' mmleak.1234.txt | %(prog)s -o leaks.html\n"
               "  ... | %(prog)s --since 600 --older-than 60   # leaked after the warm-up\n\n"
               + errors.exit_help(PROG))
    add_arguments(p)
    return p


def main(argv=None):
    errors.set_tool(PROG)
    args = build_parser().parse_args(argv)
    return errors.run_main(lambda: run(args))


def run(args):
    if sys.stdin.isatty():
        raise Fail("reads survivor lines on stdin, e.g. mmleak.py shrink --final "
                   "mmleak.PID.*.out | %s > report.html (see --help)" % errors.PROG, EXIT_USAGE)
    if args.maps and not os.path.isfile(args.maps):
        raise Fail("%s: no such maps file" % args.maps)
    rep = read_stdin(args.depth, args.end_time)
    rep.update(since=args.since, older_than=args.older_than,
               wrappers=[n for w in args.wrappers for n in w.split(",") if n],
               detect_wrappers=not args.no_wrapper_detection)
    status = EXIT_OK
    frames, sym_error = {}, "no --maps given"
    if args.maps:
        sym = symbolize.Symbolizer(args.maps, trace_start=rep["start"] or None)
        frames = sym.lookup(sorted({c for a in rep["survivors"] for c in a.callers}))
        sym_error = sym.tool_error
        if sym_error:
            status = EXIT_TOOL
    rep["frames"] = frames
    rep["maps"] = args.maps
    notes = []
    if args.end_time is None and rep["clock"] is None:
        notes.append("End of the trace taken as the newest surviving allocation (%s s); ages "
                     "are relative to it (give --end-time for the real end)." % rep["end_time"])
    if rep["gaps"]:                             # events lost: every reader says so
        errors.warn(rep["gaps"])
        notes.append('<span class="warn"><b>%s</b></span>' % html.escape(rep["gaps"]))
        status = max(status, EXIT_PARTIAL)
    if rep["missing"]:
        nst, nbl = len(rep["missing"]), sum(rep["missing"].values())
        notes.append('<span class="warn">%s block%s refer%s to %d stack%s whose <code>#s</code> '
                     'line is not in the input: call site shown as 0x0 (pipe the whole output '
                     'of <code>mmleak.py shrink --final</code>, <code>#s</code> lines '
                     'included).</span>' % ("{:,}".format(nbl), "s" if nbl != 1 else "",
                                            "" if nbl != 1 else "s", nst,
                                            "s" if nst != 1 else ""))
    if rep["brackets"]:
        notes.append('<span class="warn">%d bracket lines (PTR SEQ +/-) skipped: the input was '
                     'a partial shrink; use <code>mmleak.py shrink --final</code>.</span>'
                     % rep["brackets"])
    events = len(rep["survivors"]) + len(rep["foreign_frees"])
    meta = {
        "pid": rep["pid"], "trace": rep["trace"], "cmd": rep["cmd"], "start": rep["start"],
        "events": events, "events_note": "survivor lines on stdin",
        "symbol_error": sym_error, "foreign": len(rep["foreign_frees"]),
        "since": args.since, "older_than": args.older_than,
        "source": "survivor lines on stdin" + (" and %s" % args.maps if args.maps else ""),
        "extra_notes": notes,
    }
    page = render(rep, meta, None, args.top)
    try:
        write_page(page, args.output)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise Fail("cannot write %s: %s" % (args.output, e.strerror or e))
    return status


if __name__ == "__main__":
    interrupt.exit(main())
