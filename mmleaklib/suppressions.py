"""Leak suppressions in LeakSanitizer's syntax: `leak:PATTERN` rules, matched against the
function, the source file or the module of any frame of a block's stack (inlined frames
too).  A suppressed block is left out of the report's leaks and of the --check gate, and
counted under the rule that took it.

PATTERN: `*` matches any run of characters (none too), `^` at its start anchors it at the
start of the name, `$` at its end at the end; without them it may match anywhere in the name
(LSan's TemplateMatch).  One difference: LSan matches each piece at its leftmost place, so
that its `foo$` does not match `foofoo`; here it does (the pattern is tried at every place).

The rules come from, in this order (the first rule that matches a block takes it):
  - the files of --suppressions FILE (repeatable), then those of MMLEAK_SUPPRESSIONS
    (file names separated by ':');
  - the program's own __lsan_default_suppressions(), which mmleak.so calls once and writes
    into the trace ("#suppressions" line, docs/format.rst);
  - BUILTIN below, unless --no-builtin-suppressions.
"""
import collections
import os
import re

from .errors import Fail

# Known one-time allocations of the C/C++ runtime that a program cannot free and valgrind or
# LSan do not call leaks (they are still reachable, or freed only by __libc_freeres).  Each:
# (pattern, where it comes from).
BUILTIN = (
    ("_IO_file_doallocate", "glibc libio/filedoalloc.c: stdio's buffers (stdout, stderr, "
                            "a FILE's first read or write), freed only by __libc_freeres"),
    ("_dl_allocate_tls", "glibc elf/dl-tls.c: a thread's DTV and static TLS, kept for reuse "
                         "in glibc's cache of thread stacks"),
    ("*tls_get_addr*", "compiler-rt lsan_common.cpp kStdSuppressions: dynamic TLS blocks "
                       "(glibc bug 12650)"),
    ("__nss_module_allocate", "heaptrack src/analyze/suppressions.cpp: glibc NSS modules, "
                              "loaded once"),
    ("__gconv_read_conf", "heaptrack: glibc iconv's configuration, read once"),
    ("__new_exitfn", "heaptrack: glibc's atexit list"),
    ("tzset_internal", "heaptrack: glibc's time zone, read once"),
    ("dl_open_worker", "heaptrack: the dynamic linker's data of a dlopen'ed object"),
)

Rule = collections.namedtuple("Rule", "pattern origin")
ENV = "MMLEAK_SUPPRESSIONS"


def compile_pattern(pattern):
    """A PATTERN (LSan's syntax: *, ^, $) as a compiled regular expression to search with."""
    p = pattern
    start = p.startswith("^")
    if start:
        p = p[1:]
    end = p.endswith("$")
    if end:
        p = p[:-1]
    body = ".*".join(re.escape(piece) for piece in p.split("*"))
    return re.compile(("^" if start else "") + body + ("$" if end else ""), re.S)


def matches(pattern, name):
    """Does PATTERN match NAME (a function, file or module name)?  No name never matches."""
    if not name:
        return False
    return compile_pattern(pattern).search(name) is not None


def parse(text, origin):
    """The rules of TEXT (a suppression file's content); ORIGIN names it in messages ('FILE'
    gives 'FILE:LINE').  Blank lines and '#' comments are skipped; anything but
    `leak:PATTERN` is an error, one line naming the file and line."""
    rules = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, colon, pattern = line.partition(":")
        pattern = pattern.strip()
        if not colon or kind.strip() != "leak":
            raise Fail("%s:%d: not a leak suppression (want leak:PATTERN): %s"
                       % (origin, n, line[:200]))
        if not pattern:
            raise Fail("%s:%d: empty pattern after leak:" % (origin, n))
        rules.append(Rule(pattern, "%s:%d" % (origin, n)))
    return rules


def read_file(path):
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 24)
    except OSError as e:
        raise Fail("suppressions %s: %s" % (path, e.strerror or e))
    return parse(data.decode("utf-8", "replace"), path)


def load(files=(), env=None, program=None, builtin=True):
    """The rules, in order: FILES (--suppressions), the files in ENV (MMLEAK_SUPPRESSIONS,
    ':'-separated; default: the environment's), PROGRAM (the text of the program's
    __lsan_default_suppressions(), from the trace), then BUILTIN."""
    rules = []
    for p in files:
        rules += read_file(p)
    env = os.environ.get(ENV, "") if env is None else env
    for p in env.split(":"):
        if p:
            rules += read_file(p)
    if program:
        rules += parse(program, "__lsan_default_suppressions()")
    if builtin:
        rules += [Rule(p, "built-in") for p, _ in BUILTIN]
    return rules


class Matcher:
    """The rules, applied per stack (each distinct stack is matched once)."""

    def __init__(self, rules, frames):
        self.rules = list(rules)
        self._re = [compile_pattern(r.pattern) for r in self.rules]
        self.frames = frames or {}
        self._stack = {}
        self._addr = {}
        self.hits = [[0, 0] for _ in self.rules]      # blocks, bytes per rule

    def _names(self, addr):
        fr = self.frames.get(addr)
        if fr is None:
            return ()
        names = [fr.function, fr.file, fr.module]
        for fn, fl, _ in fr.inlined or ():
            names += [fn, fl]
        return [n for n in names if n]

    def _addr_rule(self, addr):
        r = self._addr.get(addr, -2)
        if r == -2:
            names = self._names(addr)
            r = next((i for i, rx in enumerate(self._re) if any(rx.search(n) for n in names)),
                     -1)
            self._addr[addr] = r
        return r

    def rule_of(self, stack):
        """The index of the first rule that matches a frame of STACK, or -1."""
        if not self.rules:
            return -1
        r = self._stack.get(stack)
        if r is None:
            hits = [self._addr_rule(a) for a in stack]
            hits = [h for h in hits if h >= 0]
            r = self._stack[stack] = min(hits) if hits else -1
        return r

    def take(self, stack, size, n=1):
        """Are N blocks of SIZE bytes in all with STACK suppressed?  Counts them under its
        rule."""
        if not self.rules:
            return False
        r = self.rule_of(stack)
        if r < 0:
            return False
        self.hits[r][0] += n
        self.hits[r][1] += size
        return True

    def used(self):
        """[(rule, blocks, bytes)] of the rules that took a block, most bytes first."""
        rows = [(rule, n, b) for rule, (n, b) in zip(self.rules, self.hits) if n]
        rows.sort(key=lambda r: (-r[2], -r[1], r[0].origin))
        return rows
