"""A file that is not a dump at all (text, a program, a picture, a cut gzip), given to
shrink, report or mmleak-panda.py or left under a dump file's name, is refused in one line
(status 2, nothing written, none of its bytes shown), by both shrink engines alike; a dump
whose start a crash damaged is still read as before (docs/format.rst).  The head of a file
(its '#' lines: dumpformat.read_head, for the readers that need only those) is read by the
same rules: good, truncated, of a version not read, garbage, fuzzed."""
import errno
import gzip
import io
import os
import random
import socket
import subprocess
import sys
import tty

import pytest

from conftest import ROOT, mmleak
from test_shrink import damage
from test_shrink_native import MMLEAK_PY, assert_same_cli, run_cli

NOT_DUMP = mmleak.dumpformat.NOT_DUMP
HEADER = b"#mmleak 1 pid=4242 tid=4242 file=0 depth=1\n"
NOT_DUMPS = {
    "text": b"hello world\nthis is not a dump\n" * 4,
    "binary": b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8,
    "png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64),
    "gzip": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",     # cut after its header
    "script": b"#!/bin/sh\necho hello\n",
}


# what a user may give by mistake, each refused by the first line's rule (dumpformat.not_a_dump,
# shared by both engines), whatever its '#' or NULs: a dump starts with one of the format's
# lines, not with any '#' and a lowercase letter; NULs start it only as a hole does
TEXT = "#mmleak 1 pid=4242\n" + "%012x 1 10 1 401000\n" % 0x10000
MISTAKES = {
    "c-source": b"#include <stdio.h>\n\nint main(void)\n{\n    return 0;\n}\n",
    "c-header": b"#ifndef LEAK_H\n#define LEAK_H\n#endif\n",
    "shell": b"#!/bin/sh\nexec true\n",
    "python": b'"""A module."""\nimport os\n',
    "python-coding": b"# -*- coding: utf-8 -*-\nimport os\n",
    "makefile": b"#build\nall: prog\n\tcc -o prog prog.c\n",
    "csv": b"ptr,seq,size\n10,1,16\n",
    "json": b'{"events": [1, 2]}\n',
    "core": b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\x04\x00\x3e\x00" + bytes(300),
    "gzip-text": gzip.compress(TEXT.encode() * 20),
    "utf-16": TEXT.encode("utf-16"),
    "utf-16-le": TEXT.encode("utf-16-le"),
    "utf-16-be": TEXT.encode("utf-16-be"),          # (NUL-led: no hole)
    "scan-result": b"#mmleak-scan 1 id=4242 pid=4242\n#status done\n#data\n",
    "series-live": b"#final\n#point 4242\n",
    "torn-include": b"#inc",                         # (a whole file: torn, but no tag's start)
}
# ... and what a dump may start with: a line of the format (a piece cut out, sorted), the
# torn start of one, blanks, a hole (NULs, then the end of the line it cut)
DUMP_STARTS = [b"#mmleak 2 id=1\n", b"#s 1 401000\n", b"#clock 5\n", b"#end\n",
               b"#cmd ./a.out\n", b"#compacted files=1\n", b"#at 0000000000000000\n",
               b"%012x 1 10 1 @1\n" % 0x10000, b"10 2 +\n", b"#mml", b"#mmleak 2 id=\0\0",
               b"1000 1 1", b"  \n\n#title t=1 x\n", b"\0" * 100 + b"cut\n#lost 3 k=1\n",
               b"\0" * 5000 + b" cut\n", b""]


@pytest.mark.parametrize("kind", sorted(MISTAKES))
def test_what_is_no_dump_by_its_start(kind):
    """The rule, on a file's first bytes and on a stream's (peek_stream's _stream_head)."""
    data = MISTAKES[kind]
    assert mmleak.dumpformat.not_a_dump(data[:mmleak.dumpformat.PEEK])
    decided, head = mmleak.shrink._stream_head(data, True)
    assert decided and mmleak.dumpformat.not_a_dump(head)
    if kind == "utf-16-be":             # (its NULs decide before the stream's first newline)
        assert mmleak.shrink._stream_head(data[:9], False)[0]


@pytest.mark.parametrize("start", DUMP_STARTS, ids=range(len(DUMP_STARTS)))
def test_what_a_dump_may_start_with(start):
    assert not mmleak.dumpformat.not_a_dump(start[:mmleak.dumpformat.PEEK])
    decided, head = mmleak.shrink._stream_head(start, True)
    assert decided and not mmleak.dumpformat.not_a_dump(head or b"")


def test_c_source_refused_by_every_reader(tmp_path, lib):
    """A C file (its '#include' once passed) given to shrink (both engines), left in a dump
    directory (report, compact), on mmleak-panda.py's stdin, or as symbolize's maps file:
    one line each, status 2, nothing written."""
    src = tmp_path / "mmleak.4242.0.out"
    src.write_bytes(MISTAKES["c-source"])
    (tmp_path / "mmleak.4242.maps").write_bytes(b"")
    said = b"%s: %s\n" % (bytes(src), NOT_DUMP.encode())
    assert assert_same_cli(["shrink", str(src)]) == (2, b"", b"mmleak.py: " + said)
    for cmd in (["report", "--no-html", str(tmp_path)], ["compact", str(tmp_path)]):
        assert run_cli("native", cmd) == (2, b"", b"mmleak.py: " + said), cmd
    with open(src, "rb") as f:
        r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak-panda.py"), "-o",
                            str(tmp_path / "page.html")], stdin=f, capture_output=True)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, b"", b"mmleak-panda.py: <stdin>: %s\n" % NOT_DUMP.encode())
    assert run_cli("native", ["symbolize", "--maps", str(src), "401000"]) == (
        2, b"", b"mmleak.py: %s: %s\n" % (bytes(src), mmleak.symbolize.NOT_MAPS.encode()))
    assert sorted(os.listdir(tmp_path)) == ["mmleak.4242.0.out", "mmleak.4242.lock",
                                            "mmleak.4242.maps"]


def events(n, first=1):
    """N allocations of 16 bytes, none freed: N survivors."""
    return b"".join(b"%012x %x 10 %x 401000\n" % (0x10000 + 16 * i, i, i)
                    for i in range(first, first + n))


@pytest.mark.parametrize("kind", sorted(NOT_DUMPS))
def test_not_a_dump_refused_in_one_line(tmp_path, kind, lib):
    p = tmp_path / "mmleak.4242.1.out"
    p.write_bytes(NOT_DUMPS[kind])
    rc, out, err = assert_same_cli(["shrink", str(p)])
    assert (rc, out, err) == (2, b"", b"mmleak.py: %s: %s\n" % (bytes(p), NOT_DUMP.encode()))


def test_several_inputs_one_not_a_dump_refuses_all(tmp_path, lib):
    good = tmp_path / "mmleak.4242.1.out"
    good.write_bytes(HEADER + events(3))
    bad = tmp_path / "mmleak.4242.2.out"
    bad.write_bytes(NOT_DUMPS["text"])
    res = tmp_path / "result"
    rc, out, err = assert_same_cli(["shrink", "-o", str(res), str(good), str(bad)])
    assert (rc, out, err) == (2, b"", b"mmleak.py: %s: %s\n" % (bytes(bad), NOT_DUMP.encode()))
    assert not res.exists()
    # the same in a dump directory: no page written
    r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak.py"), "report",
                        str(tmp_path)], capture_output=True)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, b"", b"mmleak.py: %s: %s\n" % (bytes(bad), NOT_DUMP.encode()))
    assert sorted(os.listdir(tmp_path)) == ["mmleak.4242.1.out", "mmleak.4242.2.out"]


def test_panda_refuses_a_file_that_is_not_a_dump_on_stdin(tmp_path):
    p = tmp_path / "picture.png"
    p.write_bytes(NOT_DUMPS["png"])
    with open(p, "rb") as f:
        r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak-panda.py"), "-o",
                            str(tmp_path / "page.html")], stdin=f, capture_output=True)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, b"", b"mmleak-panda.py: <stdin>: %s\n" % NOT_DUMP.encode())
    assert not (tmp_path / "page.html").exists()


@pytest.mark.parametrize("start, status, stderr", [
    (b"", 0, b""),                                          # empty: no events, as before
    (HEADER, 0, b""),
    (events(1, 900), 0, b""),                               # header-less event lines
    (b"\0" * 4096, 0, b"mmleak.py: F:1: NUL bytes skipped (padding, or a hole a crash left "
                      b"in the file)\n"),                   # a hole where the header was
    (b"   \n", 0, b""),                                     # blank padding
    (b"#mml", 0, b"mmleak.py: F:1: torn last line ignored\n"),    # killed in its header
])
def test_damaged_start_still_read(tmp_path, monkeypatch, start, status, stderr, lib):
    p = tmp_path / "F"
    p.write_bytes(start + (events(2) if start[-1:] != b"l" else b""))
    monkeypatch.chdir(tmp_path)         # (F: the name the messages give)
    rc, out, err = assert_same_cli(["shrink", "--final", "F"])
    assert (rc, err) == (status, stderr)
    n = 0 if start == b"#mml" else 2 + (start == events(1, 900))
    assert len([l for l in out.splitlines() if not l.startswith(b"#")]) == n


def test_dump_then_garbage_read_up_to_it(tmp_path, monkeypatch, lib):
    """A dump for 100 lines, then garbage: its events are read, the first bad line named
    (its bytes escaped), the rest counted: status 3 (incomplete), as any damaged dump."""
    p = tmp_path / "F"
    p.write_bytes(HEADER + events(99) + NOT_DUMPS["binary"].replace(b"\0", b"\1"))
    monkeypatch.chdir(tmp_path)         # (F: the name the messages give)
    rc, out, err = assert_same_cli(["shrink", "--final", "F"])
    assert rc == 3
    assert len([l for l in out.splitlines() if not l.startswith(b"#")]) == 99
    assert err.startswith(b"mmleak.py: F:101: malformed line skipped: b'\\x7fELF")
    assert err.isascii()


# A program's lines sorted (`... | sort | mmleak.py shrink`): the NUL-led ones come first
SORTED_PROGRAM = b"".join(sorted([b"\0\0\0\0\x02\n", b"\0\x01\x05abc\n", b"  \n",
                                  b"\x01\x02\x03ELF data\n", b"usage: prog [-h]\n"]))


@pytest.mark.parametrize("kind", sorted(NOT_DUMPS) + ["sorted"])
def test_not_a_dump_on_a_pipe_refused(kind, lib):
    """On a pipe, the first line that is neither blank nor starts with a NUL decides, before
    anything is read or written (both engines, shrink and mmleak-panda.py)."""
    data = SORTED_PROGRAM if kind == "sorted" else NOT_DUMPS[kind]
    rc, out, err = assert_same_cli(["shrink"], stdin=data)
    assert (rc, out, err) == (2, b"", b"mmleak.py: <stdin>: %s\n" % NOT_DUMP.encode())
    if kind == "sorted":
        r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak-panda.py"), "-o",
                            os.devnull], input=data, capture_output=True)
        assert (r.returncode, r.stdout, r.stderr) == (
            2, b"", b"mmleak-panda.py: <stdin>: %s\n" % NOT_DUMP.encode())


@pytest.mark.parametrize("sort", [False, True], ids=["as-written", "sorted"])
def test_dump_on_a_pipe_read_as_from_a_file(tmp_path, monkeypatch, sort, lib):
    """A dump on a pipe (sorted or not; blanks, then a hole a crash left at its start;
    bigger than a pipe holds: its first bytes are handed back ahead of the rest) gives what
    the same file gives."""
    data = b"  \n\n" + b"\0" * 5000 + b" cut\n" + HEADER + events(3000)  # (75 KB)
    if sort:
        data = b"".join(sorted(data.splitlines(True)))
    (tmp_path / "F").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    want = run_cli("native", ["shrink", "F"])
    got = assert_same_cli(["shrink"], stdin=data)
    assert got == (want[0], want[1], want[2].replace(b" F:", b" <stdin>:"))
    assert got[0] == 3 and got[1].count(b"\n") > 3000     # (" cut": a malformed line)


class FailingStream:
    """A stream that gives DATA, then a read error: a Unix socket whose peer closed with
    bytes of ours unread (ECONNRESET, said once: read again, it is an end; splice(2) reads
    it), or a terminal whose other side closed (EIO; no splice: read(2))."""

    def __init__(self, kind, data):
        if kind == "socket":
            ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            peer.sendall(data)
            ours.sendall(b"x")
            peer.close()
            self.fd = ours.detach()
        else:
            self.fd, other = os.openpty()
            tty.setraw(other)           # (the bytes as they are: no CR added)
            os.write(other, data)
            os.close(other)

    def __enter__(self):
        return self.fd

    def __exit__(self, *exc):
        os.close(self.fd)


@pytest.mark.parametrize("kind, sent", [("socket", "nothing"), ("socket", "a-dump"),
                                        ("terminal", "a-dump")])
def test_read_error_on_stdin_is_an_error(tmp_path, monkeypatch, kind, sent, lib):
    """A read error on stdin (a stream: peek_stream reads its first line, a thread hands
    it over through a pipe) is no end: one line naming it and the errno's text, status 2
    (an input could not be used), as a file's read error; what was read is still shrunk
    (both engines; mmleak-panda.py: no page)."""
    # (a dump of more than one read; a terminal holds 4 KiB)
    data = b"" if sent == "nothing" else HEADER + events(3000 if kind == "socket" else 100)
    (tmp_path / "F").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    want = run_cli("native", ["shrink", "F"])[1]
    why = os.strerror(errno.ECONNRESET if kind == "socket" else errno.EIO).encode()
    for engine in ("python", "native"):
        with FailingStream(kind, data) as s:
            r = subprocess.run(MMLEAK_PY + ["shrink"], stdin=s, capture_output=True,
                               env=dict(os.environ, MMLEAK_SHRINK=engine))
        assert (r.returncode, r.stdout, r.stderr) == (
            2, want, b"mmleak.py: <stdin>: cannot read: %s\n" % why), engine
        if kind == "terminal":
            continue                    # (mmleak-panda.py does not read a terminal)
        with FailingStream(kind, data) as s:
            r = subprocess.run([sys.executable, os.path.join(ROOT, "mmleak-panda.py"), "-o",
                                "page.html"], stdin=s, capture_output=True,
                               env=dict(os.environ, MMLEAK_SHRINK=engine))
        assert (r.returncode, r.stdout, r.stderr) == (
            2, b"", b"mmleak-panda.py: <stdin>: cannot read: %s; no report written\n"
            % why), engine
        assert not os.path.exists("page.html")


# The head of a file (dumpformat.read_head): what the readers that need only its '#' lines
# (the files a compacted result folded, its counts, a trace's start and command) take from
# it, read as the shrink reads it.
RESULT = (b"#mmleak 2 id=4242 pid=4242 depth=auto start=1700000000 pstart=99\n"
          b"#cmd ./leaky \\x2dv caf\\xc3\\xa9\n#alloc libc.so.6\n\n#clock 7\n"
          b"#compacted files=3 events=120 entries=2 allocs=70 entry_allocs=1 at=1700000100\n"
          b"#folded mmleak.4242.0.out\n#folded mmleak.4242.compact.1\n"
          b"#s 1 401000 402000\n" + b"%012x 1 10 1 @1\n" % 0x10000 +
          b"#folded mmleak.4242.9.out\n")      # (after the head: not read)
RESULT_HEAD = {
    "header": {"version": "2", "id": "4242", "pid": "4242", "depth": "auto",
               "start": "1700000000", "pstart": "99"},
    "cmd": "./leaky -v caf\u00e9", "clock": 7,
    "compacted": {"files": 3, "events": 120, "entries": 2, "allocs": 70, "entry_allocs": 1,
                  "at": 1700000100},
    "folded": ["mmleak.4242.0.out", "mmleak.4242.compact.1"]}


def head_of(data, name="r"):
    return mmleak.dumpformat.read_head(io.BytesIO(data), name)


def test_head_of_a_compacted_result():
    """All of it, as the shrink reads the same lines (both from dumpformat.parse_tagged)."""
    assert head_of(RESULT) == RESULT_HEAD
    sh = mmleak.Shrinker()
    sh.feed(io.BytesIO(RESULT), "r")
    assert {k: v for k, v in sh.headers[0].items() if k != "source"} == RESULT_HEAD["header"]
    assert (sh.cmd, sh.clock) == (RESULT_HEAD["cmd"], RESULT_HEAD["clock"])
    assert {k: sh.compacted[k] for k in sh.compacted} == {
        k: v for k, v in RESULT_HEAD["compacted"].items() if k != "at"}
    # and the compaction writes those lines with the same functions
    d = mmleak.dumpformat
    assert d.clock_line(7) + d.compacted_line(3, 120, 2, 70, 1, 1700000100) + \
        b"".join(d.folded_line(n) for n in RESULT_HEAD["folded"]) in RESULT


def test_head_of_a_dump_file_is_its_first_lines():
    data = HEADER + b"#cmd a b\n" + events(3) + b"#end\n"
    assert head_of(data) == {"header": mmleak.parse_header(HEADER), "cmd": "a b",
                             "clock": None, "compacted": None, "folded": []}


def test_truncated_head_takes_only_its_whole_lines():
    """Cut anywhere (a result being written, a file cut short): what the whole lines before
    the cut say, the torn one never (not a name cut short, not a count cut short)."""
    for n in range(len(RESULT) + 1):
        whole = RESULT[:n].split(b"\n")[:-1]
        h = head_of(RESULT[:n])
        assert h["folded"] == [l[8:].decode() for l in whole[:8] if l.startswith(b"#folded ")]
        assert (h["header"] is not None) == (len(whole) >= 1), n
        assert (h["cmd"] is not None, h["clock"] is not None, h["compacted"] is not None) == (
            len(whole) >= 2, len(whole) >= 5, len(whole) >= 6), n


@pytest.mark.parametrize("start, at", [(b"", 1), (b"  \n\n", 3), (b"\0\0cut\n", 2)])
def test_head_of_a_version_not_read(start, at):
    """One line, the file and the line, status 2: the shrink's own words."""
    data = start + b"#mmleak 9 id=1 pid=1\n" + events(1)
    with pytest.raises(mmleak.Fail) as e:
        head_of(data, "x/mmleak.1.compact")
    want = "x/mmleak.1.compact:%d: dump format version 9, this mmleak.py reads 1 and 2" % at
    assert (str(e.value), e.value.status) == (want, mmleak.EXIT_INPUT)
    with pytest.raises(mmleak.Fail) as e2:
        mmleak.Shrinker().feed(io.BytesIO(data), "x/mmleak.1.compact")
    assert str(e2.value) == want


@pytest.mark.parametrize("kind", sorted(MISTAKES) + sorted(NOT_DUMPS))
def test_head_of_garbage_refused_in_one_line(kind):
    data = MISTAKES.get(kind, NOT_DUMPS.get(kind))
    with pytest.raises(mmleak.Fail) as e:
        head_of(data, "x/mmleak.1.compact")
    assert (str(e.value), e.value.status) == ("x/mmleak.1.compact: " + NOT_DUMP,
                                              mmleak.EXIT_INPUT)


@pytest.mark.parametrize("start", DUMP_STARTS, ids=range(len(DUMP_STARTS)))
def test_head_of_a_damaged_start_is_read(start):
    h = head_of(start)
    assert h["header"] is None or start.startswith(b"#mmleak")


@pytest.mark.parametrize("seed", range(40))
def test_fuzzed_head(seed):
    """RESULT damaged at random (fixed seeds): the head, or Fail in one line naming the
    file (status 2); what it says is in whole lines of the file; a file not_a_dump refuses
    is refused."""
    rnd = random.Random(seed)
    data = bytearray(RESULT)
    for _ in range(rnd.randrange(1, 8)):
        data = damage(rnd, data, rnd.randrange(4), rnd.randrange(len(data) + 1))
    data = bytes(data)
    lines = set(data.split(b"\n")[:-1])
    try:
        h = head_of(data, "x/r")
    except mmleak.Fail as e:
        assert e.status == mmleak.EXIT_INPUT and "\n" not in str(e)
        assert str(e).startswith("x/r:")
        assert mmleak.dumpformat.not_a_dump(data[:mmleak.dumpformat.PEEK]) == \
            (str(e) == "x/r: " + NOT_DUMP)
        return
    assert not mmleak.dumpformat.not_a_dump(data[:mmleak.dumpformat.PEEK])
    assert all(b"#folded " + n.encode() in lines for n in h["folded"])
    if h["header"] is not None:
        assert h["header"]["version"] in ("1", "2")
        assert any(mmleak.parse_header(l + b"\n") == h["header"] for l in lines)
