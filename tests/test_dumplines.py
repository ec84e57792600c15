"""The one reader of a dump file's lines (tools/dumplines.h), whose rules are those of
mmleak-format(5), "The dump format": driven through mmleak-tools.so's mmleak_dump_lines,
which reads a buffer in chunks of any size, as the shrink engine, the scan's live set and
the levels' pick read their files.  Every case is read in chunks of every size from 1 byte
to the whole: the pieces must not depend on where the chunks end."""
import ctypes
import os

import pytest

from conftest import ROOT
from mmleaklib import facts

# the reader's DL_* (tools/dumplines.h); 0, -1, -2: a line ended by its newline that is an
# event, blank, anything else
TORN, TORN_LAST, PADDING_END, NULS, TOO_LONG, CUT_START = 1, 2, 3, 4, 5, 7
EVENT, BLANK, OTHER = 0, -1, -2
HEAD = 80

PIECE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                         ctypes.POINTER(ctypes.c_char), ctypes.c_size_t)


@pytest.fixture(scope="module")
def reader(lib):
    f = ctypes.CDLL(os.path.join(ROOT, "mmleak-tools.so")).mmleak_dump_lines
    f.restype = ctypes.c_int64
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t, PIECE]
    return f


def pieces(reader, data, chunk, hole=0):
    """What the reader makes of DATA: (what, line number, bytes) each."""
    got = []

    def piece(what, lineno, p, n):
        got.append((what, lineno, ctypes.string_at(p, n) if n else b""))
        return 0
    r = reader(data, len(data), chunk, hole, PIECE(piece))
    assert r == len(got)
    return got


def every_chunk(reader, data, hole=0):
    """DATA read in chunks of every size: the same pieces each time; those."""
    first = pieces(reader, data, len(data) or 1, hole)
    for chunk in range(1, len(data) + 1):
        assert pieces(reader, data, chunk, hole) == first, chunk
    return first


A = b"aaaaaaaaaaaa 1 2\n"                   # a free, its pointer of 12 digits
B = b"bbbbbbbbbbbb 3 10 0 @5\n"             # an allocation


@pytest.mark.parametrize("data, want", [
    # lines ended by their newline: events, headers, blank lines (ASCII whitespace only)
    (b"#mmleak 2 id=1\n" + A + b"   \n" + b"\t \r\n\n" + B,
     [(OTHER, 1, b"#mmleak 2 id=1\n"), (EVENT, 2, A), (BLANK, 3, b"   \n"),
      (BLANK, 4, b"\t \r\n"), (BLANK, 5, b"\n"), (EVENT, 6, B)]),
    # a run of NULs between two lines: padding; the next line keeps the number
    (A + b"\0\0\0" + B, [(EVENT, 1, A), (NULS, 2, b""), (EVENT, 2, B)]),
    # text cut by NULs: torn; spaces cut by NULs: padding
    (A + b"aaaaaa\0\0" + B, [(EVENT, 1, A), (TORN, 2, b"aaaaaa"), (EVENT, 2, B)]),
    (A + b"   \0" + B, [(EVENT, 1, A), (NULS, 2, b"   "), (EVENT, 2, B)]),
    # NULs at the end, and at the start
    (A + b"\0" * 40, [(EVENT, 1, A), (NULS, 2, b"")]),
    (b"\0" * 5 + A, [(NULS, 1, b""), (EVENT, 1, A)]),
    # after NULs, an event whose pointer has fewer than 12 digits: the end of a cut line
    (A + b"\0\0aa 3 4\n" + B,
     [(EVENT, 1, A), (NULS, 2, b""), (CUT_START, 2, b"aa 3 4\n"), (EVENT, 3, B)]),
    # ... and only right after NULs
    (A + b"aa 3 4\n", [(EVENT, 1, A), (EVENT, 2, b"aa 3 4\n")]),
    # the last text without its newline: torn, a torn header (shown empty), padding
    (A + b"bbbbbbbbbbbb 3 1", [(EVENT, 1, A), (TORN, 2, b"bbbbbbbbbbbb 3 1")]),
    (A + b"#end", [(EVENT, 1, A), (TORN_LAST, 2, b"")]),
    (A + b"    ", [(EVENT, 1, A), (PADDING_END, 2, b"    ")]),
    # CRLF: the format's lines end with LF alone; an event line ended by CRLF is not one
    (A[:-1] + b"\r\n" + b"\r\n", [(OTHER, 1, A[:-1] + b"\r\n"), (BLANK, 2, b"\r\n")]),
    (b"", []),
])
def test_the_rules_whatever_the_chunks(reader, data, want):
    assert every_chunk(reader, data) == want


def test_a_hole_is_a_run_of_nuls(reader):
    """A run of NULs the reader did not read (a sparse file's hole, SEEK_DATA)."""
    data = A + b"aaa" + B
    assert every_chunk(reader, data, hole=len(A) + 3) == [
        (EVENT, 1, A), (TORN, 2, b"aaa"), (EVENT, 2, B)]
    assert every_chunk(reader, A + B, hole=len(A)) == [
        (EVENT, 1, A), (NULS, 2, b""), (EVENT, 2, B)]
    assert every_chunk(reader, A, hole=len(A)) == [(EVENT, 1, A), (NULS, 2, b"")]


@pytest.mark.parametrize("chunk", [4096, 65536 + 7, 1 << 20])
def test_a_line_too_long_keeps_its_head(reader, chunk):
    long = b"c" * (facts.LINE_MAX + 5)
    assert pieces(reader, A + long + b"\n" + B, chunk) == [
        (EVENT, 1, A), (TOO_LONG, 2, long[:HEAD]), (EVENT, 3, B)]
    assert pieces(reader, A + long + b"\0" + B, chunk) == [
        (EVENT, 1, A), (TORN, 2, long[:HEAD]), (EVENT, 2, B)]
    assert pieces(reader, A + long, chunk) == [(EVENT, 1, A), (TORN, 2, long[:HEAD])]
    assert pieces(reader, A + b"#" + long, chunk) == [
        (EVENT, 1, A), (TORN_LAST, 2, (b"#" + long)[:HEAD])]
    # the longest line kept whole
    most = b"d" * (facts.LINE_MAX - 1) + b"\n"
    assert pieces(reader, most + B, chunk) == [(OTHER, 1, most), (EVENT, 2, B)]
