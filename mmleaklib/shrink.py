"""Shrink (mmleak-format(5), "The shrink algorithm"): the reference engine, Shrinker; the
compiled one is native.py's, and gives the same bytes.

Events of one address P are totally ordered by SEQ.  In the true history they alternate
alloc, free, alloc, free...; what matters at the end is only the first and the last event
of P: a last event that is an allocation is a block still alive (a survivor), a first
event that is a free released a block allocated before tracing began (a foreign free).

For each P the shrinker keeps either one event, or a "hull": the lowest and the highest
event seen (events strictly between them are dropped; they can never be first or last).
One more rule cancels work: when P's whole state is an allocation with SEQ s and a free
with SEQ s+1, the two are adjacent in the true history (the tracer's counter for P's
bucket moved by one, so nothing else touched P in between) and both are dropped: at once
when both are of one input; from two inputs the pair is held as a hull until the second
one's input goes on (its next event of P next to it outside the pair, or its end), since
that event may be one end of a partial result's hull, the other end still to come.

These rules commute: any grouping of the input files, in any order, in any number of
partial shrinks, gives the same first and last event for every address, so the same
survivors and foreign frees.  A partial result keeps what later merges need: the ends of
every hull.  A hull end that can never be reported (an allocation at the low end, a free
at the high end) is written as a bracket line "PTR SEQ +" or "PTR SEQ -".
"""
import collections
import errno
import io
import os
import shutil
import stat
import sys
import tempfile
import time

from .dumpformat import (EVENT_RE, KIND_ALLOC, KIND_END, KIND_FREE, KIND_START, LINE_MAX,
                         Q_BAD_CLOCK, Q_BAD_FIELD, Q_BAD_STACK, Q_CUT_START, Q_DUPLICATE,
                         Q_JOINED, Q_MALFORMED, Q_NULS, Q_PADDING_END, Q_STACK_AGAIN, Q_TOO_LONG,
                         Q_TORN_LAST, Q_TORN_LINE, Problems, bad_header_fields, cannot_read,
                         alloc_time, bracket_line, check_version, clock_line, dump_lines,
                         is_header, parse_event, parse_tagged, stack_ref,
                         NOT, PEEK, Q_UNREADABLE, SKIP, line_verdict, not_a_dump,
                         not_dump_fail, problem_text)
from . import errors, files
from .errors import Fail, Refused, refuse, warn
from .facts import WRITABLE_DIR
from .files import open_trace_file
from .native import native_shrink


# peek_stream's streams that ended in a read error: {stream_key of the pipe that hands the
# stream back: the errno}, set before the pipe's end is written (its reader sees an end
# after it), taken by Shrinker.stream_ended
_relay_errors = {}


def stream_key(fd):
    """The key of the pipe at descriptor FD in _relay_errors (None: not a pipe)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISFIFO(st.st_mode) else None


class Shrinker:
    def __init__(self, progress=None):
        self.state = {}
        self.events = 0
        self.allocs = 0
        self.frees = 0
        self.headers = []          # header dicts, one per dump file seen
        self.header_lines = []     # '#' lines to pass through, first-seen order
        self._seen_header = set()
        self.cmd = None
        self.program_suppressions = None   # "#suppressions": __lsan_default_suppressions()
        self.title = None          # the command line at the end, from "#title t=T" (latest T)
        self._title_t = -1
        self.alloc = None          # the allocator's file, from "#alloc"
        self.stacks = {}           # stack id -> frames, from "#s" lines
        # what earlier compaction passes folded ("#compacted"): files, events, and how many
        # event lines their result holds (read again here, not new events)
        # ("allocs": allocations among the events, "entry_allocs": allocation lines among
        # the entries; None when a result of an older mmleak.py has no count of them)
        self.compacted = {"files": 0, "events": 0, "entries": 0, "allocs": 0,
                          "entry_allocs": 0}
        self.stack_lines = {}      # stack id -> its "#s" line
        self.lost = {}             # gap k -> events not recorded ("#lost N k=K")
        self.dropping = set()      # gaps that began ("#dropping k=K")
        self.noscan = None         # (why, reason): a scan that wrote no result ("#noscan")
        self.nofile = None         # (threads, errno): threads that had no dump file ("#nofile")
        self.max_time = 0
        self.clock = None          # the newest "#clock" line's time (None: no such line)
        self.problems = Problems()
        self.files_done = 0
        self.progress = progress
        self.result_lines = None   # shrink_raw: (event lines of the result, allocations)
        # the compiled shrinker's survivors of format 2 as a native array (native.NativeBlocks),
        # when asked for blocks: STATE then holds only the rest of the final result
        self.native_blocks = None
        # the compiled shrinker wrote the result's event lines to a file (shrink_files RAW):
        # what write_raw needs of them (native_shrink); RAW_DIRECT: they went straight to
        # the output, after the head (shrink_files DIRECT); HEAD_WRITTEN: write_head done
        self.raw_result = None
        self.raw_direct = self.head_written = False

    # -- input -------------------------------------------------------------------------
    def feed_path(self, path, name=None):
        f = self.open_input(path, name)
        if f is not None:
            with f:
                self.feed(f, name or path)

    def open_input(self, path, name=None):
        """PATH opened to be read (open_trace_file), or None after saying why not."""
        try:
            f = open_trace_file(path)
            try:
                self.check_start(f.fileno(), name or path)
            except Fail:
                f.close()
                raise
            return f
        except Refused as e:
            refuse(str(e))
        except OSError as e:
            warn(cannot_read(name or path, e.strerror or e))
        self.problems.fatal = True
        return None

    def stream_ended(self, name, fd=None, key=None):
        """The stream NAME (at descriptor FD, or KEY: its stream_key) was read to its end: a
        read error that ended it, which only peek_stream saw (its reader saw an end), is
        said as a reader says it (Q_UNREADABLE: "NAME: cannot read: TEXT"), once, and the
        run is fatal (status 2): what was read is not the whole input."""
        e = _relay_errors.pop(key if fd is None else stream_key(fd), 0)
        if e:
            self.problems.say(name, 0, Q_UNREADABLE, e)
            self.problems.fatal = True

    stream_key = staticmethod(stream_key)   # (for native.py, which cannot import this)

    def check_start(self, fd, name):
        """Refuse the input at descriptor FD (NAME), read from its offset, if it is not a
        dump (dumpformat.not_a_dump): Fail, all inputs refused, nothing written (as joined
        partial results).  A pipe (or any stream) is judged by its first non-blank line:
        its bytes up to there are taken from it (peek_stream) and handed back behind FD."""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                head = peek_stream(fd)
            else:
                head = os.pread(fd, PEEK, os.lseek(fd, 0, os.SEEK_CUR))
        except OSError:
            return                      # the reader says why
        if not_a_dump(head):
            self.problems.fatal = True
            raise not_dump_fail(name)

    def feed(self, f, name):
        D = self.state
        get = D.get
        match = EVENT_RE.fullmatch
        problems = self.problems
        lineno = 0
        events = allocs = 0
        max_time = self.max_time
        tick = time.monotonic() + 1.0
        after_nul = False
        fresh = set()           # the addresses whose one event is this input's
        pending = {}            # address -> this input's event of an adjacent pair held
        joined = 0              # 1: a bracket line seen; 2: a header after event lines
        for line in dump_lines(f):
            lineno += 1
            m = match(line)
            if m is None:
                # a whole line only, as tools/shrink_read.c's one_line: not the piece of
                # one cut by NULs, nor the head of one too long, nor a torn last line
                if events and is_header(line) and line[-1:] == b"\n" and \
                        len(line) <= LINE_MAX + 1:
                    joined |= 2
                    if joined == 3:
                        self._joined(name, lineno)
                self._odd_line(line, name, lineno)
                after_nul = line[-1:] == b"\0"
                if after_nul:
                    lineno -= 1         # text cut by NULs: the line goes on after them
                continue
            if after_nul:
                after_nul = False
                if m.end(1) < 12:       # see CUT_START
                    problems.add(name, lineno, Q_CUT_START, line)
                    continue
            key = int(m.group(1), 16)
            s = int(m.group(2), 16)
            if m.group(3) is not None:
                kind = KIND_ALLOC
                allocs += 1
                t = int(m.group(4), 16)
                if t > max_time:
                    max_time = t
            else:
                c = m.group(6)
                kind = KIND_START if c == b"+" else KIND_END if c == b"-" else KIND_FREE
                if kind != KIND_FREE and joined != 1:
                    joined |= 1
                    if joined == 3:
                        self._joined(name, lineno)
            events += 1
            # -- the state update: the whole algorithm --
            st = get(key)
            if st is None:
                D[key] = (s, kind, line)
                fresh.add(key)
            elif type(st) is tuple:
                s0 = st[0]
                if s0 == s:
                    problems.add(name, lineno, Q_DUPLICATE)
                    continue
                lo, hi = (st, (s, kind, line)) if s0 < s else ((s, kind, line), st)
                if lo[1] & 1 and not hi[1] & 1 and hi[0] == lo[0] + 1 and key in fresh:
                    del D[key]          # both of this input: they are all it has here
                    fresh.discard(key)
                else:
                    # an adjacent pair from two inputs: this input's event may be one end
                    # of a hull whose other end comes later in it (a result's two lines):
                    # held as a hull until this input's next event of the address, or
                    # its end, says it is not (_pending)
                    if lo[1] & 1 and not hi[1] & 1 and hi[0] == lo[0] + 1:
                        pending[key] = s
                    fresh.discard(key)
                    D[key] = [lo, hi]
            else:
                y = pending.pop(key, None) if pending else None
                if y is not None and s == (y + 1 if y == st[1][0] else y - 1):
                    # next to this input's event: nothing of this input lies between them,
                    # so the pair held was all there is of it: it cancels
                    D[key] = (s, kind, line)
                    fresh.add(key)
                elif s < st[0][0]:
                    st[0] = (s, kind, line)
                elif s > st[1][0]:
                    st[1] = (s, kind, line)
                elif s == st[0][0] or s == st[1][0]:
                    problems.add(name, lineno, Q_DUPLICATE)
            if self.progress and lineno & 0xFFFF == 0 and time.monotonic() > tick:
                tick = time.monotonic() + 1.0
                self.progress(self, name, events)
        for key in pending:     # the input's end: each pair held is all there is of it
            del D[key]
        self.events += events
        self.allocs += allocs
        self.frees += events - allocs
        self.max_time = max(self.max_time, max_time)       # "#clock" may have moved it
        self.files_done += 1
        try:
            fd = f.fileno()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            return
        self.stream_ended(name, fd)

    def _joined(self, name, lineno):
        """Partial results joined into one input (`cat` of shrink results: a header after
        event lines, and bracket lines): the shrink cannot tell its parts apart (a hull end
        of one part cancelled against another part's event made a false foreign free):
        refused, naming the line where both were known (tools/shrink_read.c, joined)."""
        self.problems.fatal = True
        raise Fail("%s:%d: %s" % (name, lineno, problem_text(Q_JOINED)))

    def _odd_line(self, line, name, lineno):
        """Everything that is not an event line (as dump_lines yields them)."""
        end = line[-1:]
        add = self.problems.add
        if end == b"\0":                # text cut by a run of NULs (dump_lines)
            if line[:-1].strip(b" "):
                add(name, lineno, Q_TORN_LINE, line[:-1])
            else:
                add(name, lineno, Q_NULS)
            return
        if len(line) > LINE_MAX + (end == b"\n"):   # cut by dump_lines: it was longer
            add(name, lineno, Q_TOO_LONG if end == b"\n" else Q_TORN_LAST
                if line.startswith(b"#") else Q_TORN_LINE, line)
            return
        if line.startswith(b"#"):
            if end != b"\n":
                add(name, lineno, Q_TORN_LAST)
                return
            tag, value = parse_tagged(line)
            if tag == b"s":
                self._stack_line(line, value, name, lineno)
            elif tag == b"clock":               # the trace's clock (by shrink, compact)
                if value is not None:
                    self.max_time = max(self.max_time, value)
                    self.clock = max(self.clock or 0, value)
                elif self._first_bad(line):
                    add(name, lineno, Q_BAD_CLOCK, line)
            elif line not in self._seen_header:
                self._seen_header.add(line)
                self.header_lines.append(line)
                self._header_line(tag, value, name, lineno)
            return
        if end != b"\n":                # the last line, without its newline
            add(name, lineno, Q_TORN_LINE if line.strip(b" ") else Q_PADDING_END, line)
        elif line.strip():
            add(name, lineno, Q_MALFORMED, line)

    def _first_bad(self, line):
        """Whether LINE, a '#' line with a problem, is the first of its text: each such line
        counts once, wherever it comes again (the compiled reader hands every '#' line over
        once: native.py)."""
        if line in self._seen_header:
            return False
        self._seen_header.add(line)
        return True

    def _stack_line(self, line, st, name, lineno):
        if st is None:
            if self._first_bad(line):
                self.problems.add(name, lineno, Q_BAD_STACK, line)
        elif st[0] not in self.stacks:
            self.stacks[st[0]] = st[1]
            self.stack_lines[st[0]] = line
        elif self.stacks[st[0]] != st[1] and self._first_bad(line):
            self.problems.add(name, lineno, Q_STACK_AGAIN, st[0])

    def _header_line(self, tag, value, name, lineno):
        """A '#' line seen for the first time: its tag and value (parse_tagged)."""
        if tag == b"mmleak" and value is not None:
            h = value
            check_version(h, name, lineno)
            for k, v in bad_header_fields(h):
                self.problems.add(name, lineno, Q_BAD_FIELD, (k, v))
                del h[k]
            h["source"] = name
            self.headers.append(h)
        elif tag == b"dropping":            # mmleak.so began to drop events: gap k
            self.dropping.add(value)
        elif tag == b"lost" and value[0] is not None:     # N events of gap k not recorded
            self.lost[value[1]] = value[0]
        elif tag == b"nofile" and value is not None:
            # that many threads lost their events (counted in "#lost") for want of a dump
            # file of their own
            n, err = value
            self.nofile = (n + (self.nofile[0] if self.nofile else 0),
                           err if self.nofile is None else self.nofile[1])
        elif tag == b"compacted":
            for k in self.compacted:
                v = value.get(k)
                if self.compacted[k] is not None and v is not None:
                    self.compacted[k] += v
                elif k in ("allocs", "entry_allocs"):
                    self.compacted[k] = None
        elif tag == b"alloc" and self.alloc is None:
            self.alloc = value
        elif tag == b"suppressions" and self.program_suppressions is None:
            self.program_suppressions = value
        elif tag == b"noscan":
            # the scan at the exit's reason wins over a failed one on demand (mmleak.h's)
            if self.noscan is None or value[0] == "exit":
                self.noscan = value
        elif tag == b"cmd" and self.cmd is None:
            self.cmd = value
        elif tag == b"title" and value is not None and value[0] >= self._title_t:
            self._title_t, self.title = value

    def gaps(self):
        """(events known lost, gaps of unknown size): events mmleak.so could not record.
        A trace with either is incomplete: a lost free shows as a leak, a lost allocation
        as a free of a block allocated before tracing."""
        return sum(self.lost.values()), len(self.dropping - set(self.lost))

    def gap_text(self):
        lost, unknown = self.gaps()
        if not lost and not unknown:
            return None
        parts = []
        if lost:
            parts.append("%d events were not recorded" % lost)
        if unknown:
            parts.append("%s%d gap%s of unknown size (the process ended while mmleak.so could "
                         "not write)" % ("and " if lost else "", unknown, "s" if unknown > 1 else ""))
        if self.nofile:
            parts.append(self._nofile_text())
        return ("INCOMPLETE TRACE: %s; blocks may show as leaks whose free was lost"
                % " ".join(parts))

    def _nofile_text(self):
        threads, err = self.nofile
        where = os.path.dirname(self.headers[0]["source"]) if self.headers else ""
        text = ("(%d thread%s could not create %s dump file%s: %s" %
                (threads, "s" if threads > 1 else "", "their" if threads > 1 else "its",
                 " in " + where if where else "", os.strerror(err) if err else "reason unknown"))
        if err in (errno.EACCES, errno.EPERM, errno.EROFS):
            # a daemon that became another user, in a directory only root could write, in
            # a way mmleak.so did not see (it makes a file for them at a drop it sees)
            text += "; " + WRITABLE_DIR
        return text + ")"

    def history(self):
        """What the trace recorded, the events folded by compaction ("#compacted") included:
        {events, allocs, frees (None when an older compacted result did not count them),
        folded_events, folded_files}."""
        c = self.compacted
        if not c["files"]:
            return {"events": self.events, "allocs": self.allocs, "frees": self.frees,
                    "folded_events": 0, "folded_files": 0}
        events = c["events"] + self.events - c["entries"]
        # (a result whose "#compacted" line lacks one of the two counts: neither is known)
        allocs = None if c["allocs"] is None or c["entry_allocs"] is None else \
            c["allocs"] + self.allocs - c["entry_allocs"]
        return {"events": events, "allocs": allocs,
                "frees": None if allocs is None else events - allocs,
                "folded_events": c["events"], "folded_files": c["files"]}

    # -- checks --------------------------------------------------------------------------
    def trace_ids(self):
        return sorted({h.get("id", "?") for h in self.headers})

    def check_single_process(self):
        ids = self.trace_ids()
        if len(ids) > 1:
            srcs = {}
            for h in self.headers:
                srcs.setdefault(h.get("id", "?"), h["source"])
            raise Fail("files of different processes mixed: %s (shrink each process on its "
                       "own, or pass --mixed)" % ", ".join("%s (%s)" % (i, srcs[i]) for i in ids))

    # -- output --------------------------------------------------------------------------
    def entries(self, final):
        """Yield (key, seq, kind, line) of the result, sorted by address then number.

        final=False: everything later merges need (survivors, foreign frees, brackets).
        final=True: only what the complete input proves: survivors and foreign frees."""
        for key in sorted(self.state):
            st = self.state[key]
            if type(st) is tuple:
                s, kind, line = st
                if kind in (KIND_ALLOC, KIND_FREE) or not final:
                    yield key, s, kind, line
                continue
            (s0, k0, l0), (s1, k1, l1) = st
            if k0 == KIND_FREE:
                yield key, s0, k0, l0
            elif not final:
                yield key, s0, KIND_START, bracket_line(l0, s0, True)
            if k1 == KIND_ALLOC:
                yield key, s1, k1, l1
            elif not final:
                yield key, s1, KIND_END, bracket_line(l1, s1, False)

    def write(self, out, final):
        """The result in the dump format: the header lines, the trace's clock when its
        newest event is not in the result ("#clock"), the stacks its allocations use, then
        the events, by address."""
        if self.native_blocks is not None:
            raise ValueError("Shrinker.write: the survivors are in native blocks")
        for h in self.header_lines:
            out.write(h)
        entries = list(self.entries(final))
        newest = max((alloc_time(line) for _, _, kind, line in entries
                      if kind == KIND_ALLOC), default=0)
        if self.max_time > newest:
            out.write(clock_line(self.max_time))
        used = sorted({stack_ref(line) for _, _, kind, line in entries
                       if kind == KIND_ALLOC} - {None})
        for i in used:
            if i in self.stack_lines:
                out.write(self.stack_lines[i])
        for _, _, _, line in entries:
            out.write(line)

    def write_raw(self, out, raw):
        """write() of a result whose event lines the compiled shrinker wrote to the file
        RAW (shrink_files RAW): the same bytes, without a Python object per line."""
        self.write_head(out)
        if self.raw_direct:             # its lines are there already (shrink_files DIRECT)
            return
        raw.seek(0)
        shutil.copyfileobj(raw, out, 1 << 20)

    def write_head(self, out):
        """The head of write_raw's result: header, clock and stack lines (written once)."""
        if self.head_written:
            return
        self.head_written = True
        info = self.raw_result
        for h in self.header_lines:
            out.write(h)
        if self.max_time > info["newest"]:
            out.write(clock_line(self.max_time))
        for i in info["stacks"]:
            if i in self.stack_lines:
                out.write(self.stack_lines[i])

    def live(self):
        """The survivors as a blocks.Live: the native array when the compiled shrinker
        filled one (no Python object per block), and the Alloc tuples of the rest."""
        from .blocks import Live
        res = [parse_event(line, self.stacks) for _, _, kind, line in self.entries(True)
               if kind == KIND_ALLOC]
        return Live(self.native_blocks, res, self.stacks)

    def survivors(self):
        """The blocks still allocated at the end (final semantics), as Alloc tuples."""
        if self.native_blocks is not None:
            return list(self.live())
        res = []
        for _, _, kind, line in self.entries(True):
            if kind == KIND_ALLOC:
                res.append(parse_event(line, self.stacks))
        return res

    def missing_stacks(self):
        """{stack id: blocks} of the survivors whose stack ("@ID") has no "#s" line here."""
        out = collections.Counter()
        for _, _, kind, line in self.entries(True):
            sid = stack_ref(line) if kind == KIND_ALLOC else None
            if sid is not None:
                if sid not in self.stacks:
                    out[sid] += 1
        return dict(out)

    def foreign_frees(self):
        return [parse_event(line) for _, _, kind, line in self.entries(True)
                if kind == KIND_FREE]


def progress_printer(stream=None):
    """A progress callback that rewrites one status line on a terminal.  Its SHOWN is True
    while a line is shown but not ended; end(sh, name) ends it (the last figures), if so."""
    stream = stream or sys.stderr
    start = time.monotonic()

    def show(sh, name, file_events, done=False):
        el = time.monotonic() - start
        n = sh.events + file_events
        stream.write("\r%s: %.1fM events, %d files done, %.1fM events/s, now %s%s"
                     % (errors.PROG, n / 1e6, sh.files_done, n / 1e6 / max(el, 1e-9),
                        os.path.basename(name), "\n" if done else "   "))
        stream.flush()
        show.shown = not done

    def end(sh, name):
        if show.shown:
            show(sh, name, 0, done=True)
    show.shown = False
    show.end = end
    return show


# how far into a stream peek_stream looks for its first line to judge (NUL-led lines, which
# `sort` puts first, and blanks are skipped): past it, the stream is read as a dump
STREAM_PEEK_MAX = 1 << 20


def _stream_head(buf, eof):
    """(decided, head): the first line of BUF (a stream's first bytes; EOF: all of it) that
    decides (dumpformat.line_verdict: blanks, and a hole's NULs with the end of the line it
    cut, which `sort` puts first, do not), up to PEEK bytes, for not_a_dump; head None when
    there is none (read as a dump)."""
    pos = len(buf) - len(buf.lstrip(b" \n"))
    while True:
        nl = buf.find(b"\n", pos)
        piece = buf[pos:] if nl < 0 else buf[pos:nl + 1]
        if nl < 0 and not eof:          # (more to come: the NULs of UTF-16 decide at once)
            if piece[:1] == b"\0":
                return (True, piece[:PEEK]) if line_verdict(piece, False) == NOT else \
                    (False, None)
            return (True, piece[:PEEK]) if len(piece) >= PEEK else (False, None)
        if line_verdict(piece, True) != SKIP:
            return True, piece[:PEEK]
        if nl < 0:
            return True, None
        pos = nl + 1


def peek_stream(fd):
    """The first line by which the stream at descriptor FD (a pipe, a socket, a terminal)
    is judged (not_a_dump): its first line neither blank nor NUL-led, read within its
    first STREAM_PEEK_MAX bytes (b"" when there is none: read as a dump).  The bytes read
    are taken from the stream, so they are handed back: FD is made (dup2) the reading end
    of a new pipe that gives them, then the rest of the stream (copied by a thread, with
    splice(2) where it can), so that either engine reads FD as before, from its first
    byte.  A read error of the stream (here or in the thread) ends the pipe there, and is
    kept for Shrinker.stream_ended, which the readers call at its end: an error, not an
    end (a socket's ECONNRESET, for one, is said once: read again, it would be an end)."""
    buf = b""
    eof = False
    err = 0
    while len(buf) < STREAM_PEEK_MAX:
        done, head = _stream_head(buf, False)
        if done:
            break
        try:
            chunk = os.read(fd, min(1 << 16, STREAM_PEEK_MAX - len(buf)))
        except OSError as e:
            err = e.errno or errno.EIO
            chunk = b""
        if not chunk:
            eof = True
            break
        buf += chunk
    done, head = _stream_head(buf, eof)
    src = os.dup(fd)
    r, w = os.pipe()
    key = stream_key(w)
    try:
        os.dup2(r, fd, inheritable=fd <= 2)
    except OSError:
        for x in (src, w):
            os.close(x)
        raise
    finally:
        os.close(r)
    if err:
        _relay_errors[key] = err
    if eof and len(buf) <= 4096:        # (a pipe holds a page at least: no wait)
        os.write(w, buf)
        os.close(src)
        os.close(w)
    else:
        import threading
        threading.Thread(target=_relay, args=(buf, None if eof else src, w, key),
                         name="mmleak-stdin", daemon=True).start()
        if eof:
            os.close(src)
    return head if done and head is not None else b""


def _relay(first, src, dst, key):
    """Write the bytes FIRST, then copy the stream SRC (None: nothing more) to the pipe
    DST (its stream_key KEY) until its end (peek_stream), then close them.  A reader that
    stopped early (EPIPE: SIGPIPE is ignored, as Python leaves it) ends it; a read error
    of SRC ends it too, kept in _relay_errors before DST's end is written."""
    try:
        view = memoryview(first)
        while view:
            view = view[os.write(dst, view):]
        splice = getattr(os, "splice", None)
        while src is not None:
            if splice is not None:
                try:
                    n = splice(src, dst, 1 << 20)
                except OSError as e:
                    if e.errno in (errno.EINVAL, errno.ENOSYS):
                        splice = None   # not a pipe, nor a file (a terminal, a socket)
                        continue
                    if e.errno != errno.EPIPE:      # (the reader's end: not an error)
                        _relay_errors[key] = e.errno or errno.EIO
                    break
                if not n:
                    break
            else:
                try:
                    data = os.read(src, 1 << 16)
                except OSError as e:
                    _relay_errors[key] = e.errno or errno.EIO
                    break
                if not data:
                    break
                view = memoryview(data)
                while view:
                    view = view[os.write(dst, view):]
    except OSError:
        pass                            # the reader stopped: nobody to tell
    finally:
        if src is not None:
            os.close(src)
        os.close(dst)


def shrink_files(paths, progress=None, mixed=False, problems=None, blocks=False, raw=None,
                 final=False, direct=None):
    """Shrink the given dump files (and '-' for stdin); return the Shrinker (its problems
    collected in PROBLEMS, a dumpformat.Problems, if given).

    Lines a thread had staged but not yet flushed to its .out (see unflushed_tail) are read
    too: a killed or still running process loses nothing.  BLOCKS: only the final result
    is wanted (survivors, foreign frees: what a report reads); the compiled shrinker then
    keeps the survivors as a native array (Shrinker.live).  RAW (a binary file): the
    compiled shrinker writes the result's event lines (FINAL or not) there, for
    Shrinker.write_raw (SH.raw_result set); the Python engine fills SH.state as always.
    DIRECT (a binary file, with RAW): where write_raw's result goes; the compiled shrinker
    then writes the head there (write_head) and the event lines straight after it, with no
    copy through RAW (SH.raw_direct: write_raw adds nothing).  Nothing is written there
    when the inputs are of different processes (not MIXED) or the run stops."""
    paths, names, tmpdir, refused = files.with_unflushed_tails(paths)
    try:
        for msg in refused:             # their .out is read as it is
            refuse(msg)
        sh = _shrink_files(paths, progress, mixed, names, problems, blocks, raw, final, direct)
        sh.problems.fatal = sh.problems.fatal or bool(refused)
        return sh
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def shrink_raw(paths, out=None, live=False, stream_last=False, cancel=None, progress=None):
    """Shrink PATHS (dump files of one trace, their unflushed lines included) without
    building the per-address state in Python: (Shrinker with headers, stacks and counts,
    the result's event lines as bytes, non-final, sorted by address then number).  What a
    compaction pass writes and what a series point reads, at the compiled shrinker's speed;
    the Python path gives the same bytes.  OUT (an empty file open for reading and writing):
    the compiled shrinker writes the event lines there, and None is returned in their
    place (sh.raw_result["stacks"]: the stack ids they use); the Python path still returns
    them as bytes.  LIVE (with OUT): the compiled shrinker also leaves the result's survivors
    in sh.native_blocks, from the same reading (None when it cannot: see native_shrink).
    STREAM_LAST (with OUT): the last of PATHS is a compacted result, which the compiled
    shrinker streams (native_shrink); the result is the same.  CANCEL (with OUT): see
    native_shrink (Abandoned).  PROGRESS: a progress callback (progress_printer)."""
    paths, names, tmpdir, refused = files.with_unflushed_tails(paths)
    try:
        if refused:                     # a compactor folds nothing it cannot read whole
            for msg in refused[1:]:
                refuse(msg)
            raise Refused(refused[0])
        sh = Shrinker(progress)
        if out is not None and native_shrink(sh, paths, names, raw=out, also_blocks=live,
                                             stream_last=stream_last, cancel=cancel):
            sh.check_single_process()
            return sh, None
        with tempfile.TemporaryFile(prefix="mmleak-shrink.") as out:
            if native_shrink(sh, paths, names, raw=out):
                out.seek(0)
                data = out.read()
            else:
                for p, name in zip(paths, names):
                    sh.feed_path(p, name)
                entries = list(sh.entries(False))
                data = b"".join(line for _, _, _, line in entries)
                sh.result_lines = (len(entries),
                                   sum(1 for e in entries if e[2] == KIND_ALLOC))
                sh.state = {}
        sh.check_single_process()
        return sh, data
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _direct(out, mixed):
    """native_shrink's DIRECT for the binary file OUT, or None (no descriptor: a stream of
    tests or embedding, written through RAW as before)."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return None

    def write_head(sh):
        if not mixed:
            sh.check_single_process()
        sh.write_head(out)
        out.flush()
    return fd, write_head


def _shrink_files(paths, progress=None, mixed=False, names=None, problems=None,
                  blocks=False, raw=None, final=False, direct=None):
    sh = Shrinker(progress)
    sh.problems = problems or sh.problems
    names = names or ["<stdin>" if p == "-" else p for p in paths]
    # a trace's compacted result (sorted by address, the biggest file), alone or with the
    # runs and files beside it: read last, streamed (no table entry per line of it); the
    # same survivors and counts (mmleak-compaction(7))
    stream, given = False, names
    if blocks:
        paths, names, stream = stream_order(paths, names)
    direct = _direct(direct, mixed) if direct is not None and raw is not None and not blocks \
        else None
    if "-" in paths:                    # (the files are looked at as they are opened)
        try:
            fd = sys.stdin.buffer.fileno()
        except (AttributeError, ValueError, OSError):
            fd = None                   # stdin replaced (tests, embedding): read as it is
        if fd is not None:
            sh.check_start(fd, names[paths.index("-")])
    if not native_shrink(sh, paths, names, raw=raw, blocks=blocks, final=final,
                         stream_last=stream, direct=direct):                           # compiled,
        # when it can run
        for p, name in zip(paths, names):
            if p == "-":
                sh.feed(sys.stdin.buffer, name)
            else:
                sh.feed_path(p, name)
    if stream:
        header_order(sh, given)
    if not mixed:
        sh.check_single_process()
    return sh


def stream_order(paths, names):
    """(PATHS, NAMES, stream): the trace's compacted result (mmleak.ID.compact: sorted by
    address) moved last, to be streamed (native_shrink STREAM_LAST), when exactly one of
    PATHS is one; stream False (nothing moved) otherwise.  header_order then puts the
    headers back in the order PATHS were given."""
    comp = [i for i, p in enumerate(paths) if p != "-" and p.endswith(".compact")]
    if len(comp) != 1:
        return paths, names, False
    i = comp[0]
    return (paths[:i] + paths[i + 1:] + [paths[i]], names[:i] + names[i + 1:] + [names[i]],
            True)


def header_order(sh, names):
    """SH's '#mmleak' headers in the order their files come in NAMES (the order a reader
    that does not stream gives them; report takes the first one's start): a streamed read
    saw the result's last."""
    order = {n: k for k, n in enumerate(names)}
    sh.headers.sort(key=lambda h: order.get(h.get("source"), len(order)))


def baseline_blocks(path):
    """The allocations alive in a saved snapshot (`mmleak.py snapshot`, or a `shrink` output
    of the same process), {(ptr, seq): Alloc} with their stacks."""
    sh = Shrinker()
    with open_trace_file(path) as f:
        sh.check_start(f.fileno(), path)   # (no dump at all: refused in one line)
        sh.feed(f, path)
    if sh.problems.malformed:
        raise Fail("--baseline %s: not a snapshot of a trace (malformed lines)" % path)
    blocks = {}
    for _, _, kind, line in sh.entries(False):
        if kind == KIND_ALLOC:
            a = parse_event(line, sh.stacks)
            blocks[(a.ptr, a.seq)] = a
    return blocks
