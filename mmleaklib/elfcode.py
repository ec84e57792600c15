"""Reading the traced program's machine code (x86-64 ELF), for two things the report needs:

- the function symbols of an object (.symtab, else .dynsym): the exported-symbol fallback of
  the symbolizer (a frame in a stripped library shows `zmalloc+0x1c`, not only `lib+0x...`),
  and the bounds of a function to disassemble;
- whether a function hands back the block it got from the allocator (hands_back): the code
  evidence that makes it an allocation wrapper (sites.find_wrappers, docs/wrappers.rst).

The ELF headers are read with the standard library; the instructions with objdump (binutils),
which is optional: without objdump no function is found to be a wrapper.  objdump reads the
object's symbols again on every run, so the functions a pass of find_wrappers will ask about
are read ahead, those near each other in one run (read_ahead, disassemble_many).
"""
import bisect
import functools
import os
import re
import shutil
import struct
import subprocess

from . import files

# ---------------------------------------------------------------------------------------
# ELF: loadable segments and function symbols
# ---------------------------------------------------------------------------------------

SHT_SYMTAB, SHT_DYNSYM, SHT_NOBITS = 2, 11, 8
STT_FUNC, STT_GNU_IFUNC = 2, 10
PT_LOAD = 1


class Elf:
    """The load segments and function symbols of one ELF64 little-endian file."""

    def __init__(self, path):
        self.path = path
        self.loads = []         # (p_offset, p_vaddr, p_filesz, executable)
        self.funcs = []         # (start vaddr, end vaddr, name), sorted
        self.from_symtab = False
        self.debuglink = None
        self.build_id = None
        self.eh_frame = None    # (file offset, vaddr, size) of .eh_frame
        self._fdes = None       # [(start, end)] of its FDEs, sorted (read when first needed)
        with os.fdopen(files.open_regular(path), "rb") as f:
            self._read(f)
        self._starts = [s for s, _, _ in self.funcs]

    def _read(self, f):
        eh = f.read(64)
        if len(eh) < 64 or eh[:4] != b"\x7fELF" or eh[4] != 2 or eh[5] != 1:
            raise ValueError("not an ELF64 little-endian file")
        (phoff, shoff) = struct.unpack_from("<QQ", eh, 32)
        (phentsize, phnum, shentsize, shnum) = struct.unpack_from("<HHHH", eh, 54)
        f.seek(phoff)
        ph = f.read(phentsize * phnum)
        for i in range(phnum):
            p_type, p_flags, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
                "<IIQQQQ", ph, i * phentsize)
            if p_type == PT_LOAD:
                self.loads.append((p_offset, p_vaddr, p_filesz, bool(p_flags & 1)))
        if not shoff or not shnum:
            return
        f.seek(shoff)
        sh = f.read(shentsize * shnum)
        secs = [struct.unpack_from("<IIQQQQIIQQ", sh, i * shentsize) for i in range(shnum)]
        shstrndx = struct.unpack_from("<H", eh, 62)[0]
        if shstrndx < len(secs):
            f.seek(secs[shstrndx][4])
            names = f.read(secs[shstrndx][5])
            for sec in secs:
                name = names[sec[0]:names.find(b"\0", sec[0])]
                if name == b".gnu_debuglink" and sec[1] != SHT_NOBITS:
                    f.seek(sec[4])
                    self.debuglink = f.read(sec[5]).split(b"\0", 1)[0].decode("utf-8",
                                                                             "replace")
                elif name == b".eh_frame" and sec[1] != SHT_NOBITS:
                    self.eh_frame = (sec[4], sec[3], sec[5])
                elif name == b".note.gnu.build-id" and sec[1] != SHT_NOBITS:
                    f.seek(sec[4])
                    note = f.read(sec[5])
                    if len(note) >= 16:
                        namesz, descsz = struct.unpack_from("<II", note, 0)
                        at = 12 + ((namesz + 3) & ~3)
                        self.build_id = note[at:at + descsz].hex()
        tabs = {t: s for s in secs for t in (s[1],) if t in (SHT_SYMTAB, SHT_DYNSYM)}
        tab = tabs.get(SHT_SYMTAB) or tabs.get(SHT_DYNSYM)
        if tab is None or tab[1] == SHT_NOBITS or tab[6] >= len(secs):
            return
        self.from_symtab = tab[1] == SHT_SYMTAB
        strs = secs[tab[6]]
        f.seek(strs[4])
        strtab = f.read(strs[5])
        f.seek(tab[4])
        data = f.read(tab[5])
        funcs = {}
        for off in range(0, len(data) - 23, 24):
            name, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, off)
            if (info & 0xf) not in (STT_FUNC, STT_GNU_IFUNC) or not value or not shndx:
                continue
            end = strtab.find(b"\0", name)
            n = strtab[name:end if end >= 0 else None].decode("utf-8", "replace")
            # one name per address: a global name before a local alias, then the shortest
            prev = funcs.get(value)
            rank = (0 if info >> 4 else 1, len(n), n)
            if prev is None or rank < prev[0]:
                funcs[value] = (rank, max(size, 1), n)
        self.funcs = sorted((v, v + s, n) for v, (_, s, n) in funcs.items())

    def vaddr(self, offset):
        """The link-time address of file offset OFFSET (in a loadable segment), or None."""
        for p_offset, p_vaddr, p_filesz, _ in self.loads:
            if p_offset <= offset < p_offset + p_filesz:
                return offset - p_offset + p_vaddr
        return None

    def function_at(self, vaddr):
        """(start, end, name) of the function symbol containing VADDR, or None."""
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i >= 0 and self.funcs[i][0] <= vaddr < self.funcs[i][1]:
            return self.funcs[i]
        return None

    def code_at(self, vaddr):
        """(start, end, name) of the function around VADDR to read its code: its symbol's
        bounds, else (a static function of a stripped object: no symbol) the bounds of the
        .eh_frame entry covering it, with None for the name.  Every function gcc and clang
        compile for Debian has one (the unwind tables are kept when the symbols are
        stripped), so a stripped object's own functions can be read too."""
        fn = self.function_at(vaddr)
        if fn is not None:
            return fn
        if self._fdes is None:
            self._fdes = self._read_fdes()
        i = bisect.bisect_right(self._fdes, (vaddr, float("inf"))) - 1
        if i >= 0 and self._fdes[i][0] <= vaddr < self._fdes[i][1]:
            return (self._fdes[i][0], self._fdes[i][1], None)
        return None

    def _read_fdes(self):
        """The [start, end) address ranges of the FDEs of .eh_frame, sorted; [] when it cannot
        be read."""
        if self.eh_frame is None:
            return []
        off, base, size = self.eh_frame
        try:
            fd = files.open_regular(self.path)
            with os.fdopen(fd, "rb") as f:
                f.seek(off)
                data = f.read(size)
            return sorted(_fde_ranges(data, base))
        except (OSError, ValueError, struct.error, IndexError):
            return []


def _uleb(data, at):
    val = shift = 0
    while True:
        b = data[at]
        at += 1
        val |= (b & 0x7f) << shift
        shift += 7
        if b < 0x80:
            return val, at


def _encoded(data, at, enc, vaddr):
    """(value, next) of a DW_EH_PE-encoded pointer at AT of .eh_frame's DATA, which is loaded
    at VADDR (for pc-relative values)."""
    fmt = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0a: "<h", 0x0b: "<i",
           0x0c: "<q"}.get(enc & 0x0f)
    if fmt is None:
        if enc & 0x0f == 0x01:                  # uleb128
            val, nxt = _uleb(data, at)
        else:
            raise ValueError("pointer encoding 0x%x" % enc)
    else:
        val = struct.unpack_from(fmt, data, at)[0]
        nxt = at + struct.calcsize(fmt)
    if enc & 0x70 == 0x10:                      # pc-relative
        val += vaddr + at
    elif enc & 0x70:
        raise ValueError("pointer encoding 0x%x" % enc)
    return val & 0xffffffffffffffff, nxt


def _fde_ranges(data, vaddr):
    """The (start, end) of every FDE in the .eh_frame DATA loaded at VADDR."""
    cies, out, at = {}, [], 0
    while at + 8 <= len(data):
        length = struct.unpack_from("<I", data, at)[0]
        if length == 0:                         # the terminator
            break
        hdr = 4
        if length == 0xffffffff:
            length = struct.unpack_from("<Q", data, at + 4)[0]
            hdr = 12
        body = at + hdr
        end = body + length
        cie_id = struct.unpack_from("<I", data, body)[0]
        if cie_id == 0:                         # a CIE: the FDEs' pointer encoding
            p = body + 5
            aug_end = data.index(b"\0", p)
            aug = data[p:aug_end].decode("ascii", "replace")
            p = aug_end + 1
            if aug.startswith("z"):
                _, p = _uleb(data, p)           # code alignment
                while data[p] & 0x80:           # data alignment (sleb)
                    p += 1
                p += 1
                if data[body + 4] == 1:
                    p += 1                      # return register, a byte in version 1
                else:
                    _, p = _uleb(data, p)
                _, p = _uleb(data, p)           # augmentation length
                enc = 0x00
                for c in aug[1:]:
                    if c == "R":
                        enc = data[p]
                        p += 1
                    elif c == "P":
                        penc = data[p]
                        _, p = _encoded(data, p + 1, penc & 0x7f, vaddr)
                    elif c == "L":
                        p += 1
                    elif c not in "SB":
                        break
                cies[at] = enc
            else:
                cies[at] = 0x00
        else:                                   # an FDE: its CIE is CIE_ID bytes back
            enc = cies.get(body - cie_id)
            if enc is not None:
                start, p = _encoded(data, body + 4, enc, vaddr)
                rng, _ = _encoded(data, p, enc & 0x0f, vaddr)
                if rng:
                    out.append((start, start + rng))
        at = end
    return out


_elves = {}
DEFAULT_DEBUG_DIRS = ("/usr/lib/debug",)


def elf(path, debug_dirs=()):
    """Elf(PATH), cached; None when PATH cannot be read as one.  When PATH has no .symtab
    (stripped), the function symbols of its separate debug file, if one is found where
    elfutils looks (debug_file), in DEBUG_DIRS first."""
    key = (path, tuple(debug_dirs))
    if key not in _elves:
        try:
            e = Elf(path)
        except (OSError, ValueError, struct.error, IndexError):
            e = None
        if e is not None and not e.from_symtab:
            dbg = debug_file(path, e, debug_dirs)
            try:
                d = Elf(dbg) if dbg else None
            except (OSError, ValueError, struct.error, IndexError):
                d = None
            if d is not None and d.funcs:
                e.funcs, e._starts, e.from_symtab = d.funcs, d._starts, True
        _elves[key] = e
    return _elves[key]


def debug_file(path, e, debug_dirs=()):
    """The separate debug file of PATH (Elf E), where elfutils looks for one: in each of
    DEBUG_DIRS and /usr/lib/debug, the build-id tree (.build-id/xx/rest.debug); the
    .gnu_debuglink name in PATH's directory, its .debug, and under each of those
    directories followed by PATH's directory; then, when DEBUGINFOD_URLS is set, from
    debuginfod (debuginfod-find).  None if there is none."""
    dirs = [os.path.abspath(d) for d in debug_dirs] + list(DEFAULT_DEBUG_DIRS)
    cands = []
    if e.build_id and len(e.build_id) > 2:
        cands += [os.path.join(d, ".build-id", e.build_id[:2], e.build_id[2:] + ".debug")
                  for d in dirs]
    if e.debuglink:
        here = os.path.dirname(os.path.abspath(path))
        cands += [os.path.join(here, e.debuglink), os.path.join(here, ".debug", e.debuglink)]
        cands += [os.path.join(d, here.lstrip("/"), e.debuglink) for d in dirs]
    found = next((c for c in cands if c != path and os.path.isfile(c)), None)
    if found is None and e.build_id and os.environ.get("DEBUGINFOD_URLS") and \
            shutil.which("debuginfod-find"):
        # as elfutils does last: ask the servers (their answer is cached, so this is the
        # file eu-addr2line was given)
        try:
            r = subprocess.run(["debuginfod-find", "debuginfo", e.build_id],
                               capture_output=True, text=True, timeout=120)
            got = r.stdout.strip()
            found = got if r.returncode == 0 and os.path.isfile(got) else None
        except (OSError, subprocess.SubprocessError):
            found = None
    return found


def exported_name(path, offset, debug_dirs=()):
    """'function+0xN' for the code at file offset OFFSET of PATH from the object's own symbol
    table (.symtab, or the exported .dynsym of a stripped library), or None."""
    e = elf(path, debug_dirs)
    if e is None:
        return None
    v = e.vaddr(offset)
    fn = e.function_at(v) if v is not None else None
    if fn is None:
        return None
    return "%s+0x%x" % (fn[2], v - fn[0])


def unnamed_function(path, offset, debug_dirs=()):
    """'object+0xSTART' (START: a file offset, as frames are shown) of the function without a
    symbol around file offset OFFSET of PATH, from its .eh_frame entry; None if there is none
    (or it has a symbol: its name is the frame's)."""
    e = elf(path, debug_dirs)
    v = e.vaddr(offset) if e is not None else None
    fn = e.code_at(v) if v is not None else None
    if fn is None or fn[2] is not None:
        return None
    for p_offset, p_vaddr, p_filesz, _ in e.loads:
        if p_vaddr <= fn[0] < p_vaddr + p_filesz:
            return "%s+0x%x" % (os.path.basename(path), fn[0] - p_vaddr + p_offset)
    return None


# ---------------------------------------------------------------------------------------
# Does a function hand back what the allocator gave it?
# ---------------------------------------------------------------------------------------

REGS = {}
for _fam in ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp"):
    for _n in ("r" + _fam, "e" + _fam, _fam, _fam[0] + "l" if _fam[1] == "x" else _fam + "l"):
        REGS[_n] = "r" + _fam
for _i in range(8, 16):
    for _s in ("", "d", "w", "b"):
        REGS["r%d%s" % (_i, _s)] = "r%d" % _i
CLOBBERED = ("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11")
# callees whose return value is their first argument (memset(p, 0, n) hands p back)
RETURNS_FIRST = re.compile(r"^(?:__)?(?:memset|memcpy|memmove|strcpy|strcat|wmemset|wmemcpy)"
                           r"(?:_chk)?(?:@plt)?$")
# allocators that hand their block back through a pointer (the first argument)
OUT_PARAM = re.compile(r"^(?:posix_memalign)(?:@plt)?$")
PREFIXES = {"bnd", "notrack", "rep", "repz", "repe", "repnz", "repne", "lock", "data16", "cs",
            "ds", "addr32"}
MEM_RE = re.compile(r"^(?:[A-Z]+ PTR )?(?:[a-z]s:)?\[(r[sb]p)(?:([+-])0x([0-9a-f]+))?\]$")
TARGET_RE = re.compile(r"^([0-9a-f]+)(?: <([^>]*)>)?$")
MAX_STEPS = 4000


_code = {}                      # (path, start, end) -> _disassemble's answer
# ranges of one object closer than this are read in one objdump run: objdump reads the
# object's symbols again on every run (about as long as disassembling this many bytes)
SPAN_GAP = 64 * 1024
SPAN_MAX = 1024 * 1024


def _disassemble(path, start, end):
    """[(address, mnemonic, [operands])] of PATH's code in [START, END) (cached: a function
    is read for its return addresses and for its callers'), or None."""
    key = (path, start, end)
    if key not in _code:
        disassemble_many(path, [(start, end)])
    return _code[key]


def read_ahead(path, offsets, debug_dirs=()):
    """Read the code of the functions around file offsets OFFSETS of PATH (return addresses
    hands_back or uses_result will be asked about) into the cache, in few objdump runs
    (disassemble_many): the same answers as reading each when asked, at a fraction of the
    cost."""
    e = elf(path, debug_dirs)
    if e is None:
        return
    fns = (e.code_at(v) for v in map(e.vaddr, offsets) if v is not None)
    disassemble_many(path, [fn[:2] for fn in fns if fn is not None])


def disassemble_many(path, ranges):
    """Read the code of PATH's functions RANGES ([(start, end)]) into the cache, in as few
    objdump runs as the ranges allow: ranges near each other are read as one span and the
    output cut at their bounds.  A range is cut only when an instruction starts at each of
    its bounds in the span's output (the span decodes as a run of the range alone would);
    else it is read by itself."""
    todo = sorted({r for r in ranges if (path,) + tuple(r) not in _code})
    spans = []
    for s, e in todo:
        if spans and s - spans[-1][1] <= SPAN_GAP and e - spans[-1][0] <= SPAN_MAX:
            spans[-1][1] = max(spans[-1][1], e)
            spans[-1][2].append((s, e))
        else:
            spans.append([s, e, [(s, e)]])
    for s, e, rs in spans:
        code, starts = _objdump(path, s, e, rs)
        if len(rs) == 1:
            _code[(path, s, e)] = code
            continue
        addrs = [a for a, _, _ in code or ()]
        for rs_, re_ in rs:
            if code and rs_ in starts and (re_ in starts or re_ == e):
                _code[(path, rs_, re_)] = code[bisect.bisect_left(addrs, rs_):
                                               bisect.bisect_left(addrs, re_)]
            else:
                _code[(path, rs_, re_)] = _objdump(path, rs_, re_)[0]


def _objdump(path, start, end, wanted=None):
    """One objdump run over [START, END) of PATH, the place the instructions are read: (the
    instructions or None, the addresses among WANTED's bounds where one starts).  Only the
    lines in WANTED ([(start, end)], sorted; default the whole span) are parsed.  -z: runs
    of zero bytes are shown as instructions, as a run over any range shows them."""
    exe = shutil.which("objdump")
    if not exe:
        return None, set()
    try:
        fd = files.open_regular(path)   # a name from a maps file: nothing but a regular file
    except OSError:
        return None, set()
    try:
        r = subprocess.run([exe, "-d", "-z", "-M", "intel", "--no-show-raw-insn", "-w",
                            "--start-address=0x%x" % start, "--stop-address=0x%x" % end,
                            "/proc/self/fd/%d" % fd], pass_fds=(fd,),
                           capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None, set()
    finally:
        os.close(fd)
    union = []                          # WANTED's ranges merged, to skip the rest fast
    for s, e in wanted or [(start, end)]:
        if union and s <= union[-1][1]:
            union[-1][1] = max(union[-1][1], e)
        else:
            union.append([s, e])
    bounds = {a for r in wanted or [(start, end)] for a in r}
    out, starts, t, pos = [], set(), r.stdout, 0
    for us, ue in union:
        # to the line of the instruction at US ("   e6060:\tpush r15"), found fast; else
        # (no instruction starts there) every line on from POS is looked at
        key, at = "%x:\t" % us, pos
        while True:
            at = t.find(key, at)
            if at < 0 or at == 0 or t[at - 1] in " \n":
                break
            at += 1
        at = t.rfind("\n", 0, at) + 1 if at > pos else pos
        while at < len(t):
            nl = t.find("\n", at)
            nl = len(t) if nl < 0 else nl
            head, tab, text = t[at:nl].partition(":\t")
            if tab:
                try:
                    a = int(head, 16)
                except ValueError:
                    a = None
                if a is not None:
                    if a in bounds:
                        starts.add(a)
                    if a >= ue:
                        break               # the next range starts on this line or after
                    if a >= us:
                        words = text.split("#", 1)[0].split(None, 1)
                        while words and words[0] in PREFIXES:
                            words = words[1].split(None, 1) if len(words) > 1 else []
                        if words:
                            ops = _operands(words[1].strip()) if len(words) > 1 else []
                            out.append((a, words[0], tuple(ops)))
            at = nl + 1
        pos = at
    return tuple(out), starts


def _operands(s):
    ops, depth, cur = [], 0, ""
    for c in s:
        if c == "," and depth == 0:
            ops.append(cur.strip())
            cur = ""
            continue
        depth += c == "["
        depth -= c == "]"
        cur += c
    if cur.strip():
        ops.append(cur.strip())
    return ops


class _Path:
    """One path through the code after the call: where the block is (registers, stack
    slots), what registers point at a stack slot, the stack pointer's offset."""
    __slots__ = ("pc", "held", "addr_of", "sp")

    def __init__(self, pc, held, addr_of, sp):
        self.pc, self.held, self.addr_of, self.sp = pc, held, addr_of, sp

    def key(self):
        return (self.pc, frozenset(self.held), self.sp)

    def loc(self, op):
        """The location an operand names, if it is one we follow: a register family or a
        stack slot ('rsp', offset from the entry sp) or ('rbp', displacement)."""
        if op in REGS:
            return REGS[op]
        m = MEM_RE.match(op)
        if m:
            disp = int(m.group(3), 16) if m.group(3) else 0
            disp = -disp if m.group(2) == "-" else disp
            return ("rsp", self.sp + disp) if m.group(1) == "rsp" else ("rbp", disp)
        return None


def _code_around(path, offset, debug_dirs, what):
    """(the ELF, the function around file offset OFFSET of PATH, that offset's address, the
    function's disassembly, None), or with None for the disassembly and why not as the last:
    the start of hands_back and uses_result.  WHAT names the function in the message when
    objdump cannot read it."""
    e = elf(path, debug_dirs)
    if e is None:
        return e, None, None, None, "cannot read %s as ELF" % os.path.basename(path)
    ret = e.vaddr(offset)
    fn = e.code_at(ret) if ret is not None else None
    if fn is None:
        return e, fn, ret, None, "no function symbol around the call"
    code = _disassemble(path, fn[0], fn[1])
    if not code:
        return e, fn, ret, None, ("objdump could not read %s" % what if shutil.which("objdump")
                                  else "objdump not found (install binutils)")
    return e, fn, ret, code, None


def hands_back(path, offset, debug_dirs=()):
    """Does the function at file offset OFFSET of PATH (a return address, or the last byte
    of the call before it: a call to the allocator or to a wrapper) return the block that
    call gave it, on some path?
    (True, how) / (False, why) / (None, why not known).  The block is followed from rax
    through moves, pushes, stack slots and constant offsets (a header before the block) to
    a `ret` with it in rax; memset/memcpy return their first argument; a block from
    posix_memalign is the slot its first argument pointed at.  DEBUG_DIRS: see elf."""
    e, fn, ret, code, why = _code_around(path, offset, debug_dirs, "the function")
    if code is None:
        return None, why
    at = {a: i for i, (a, _, _) in enumerate(code)}
    # RET: a return address, or (as mmleak records callers) one byte before it, inside the
    # call: the instruction after the call containing RET - 1
    i = bisect.bisect_right([a for a, _, _ in code], ret - 1)
    if i <= 0 or i >= len(code) or not code[i - 1][1].startswith("call"):
        return None, "no call before the return address"
    ret = code[i][0]
    callee = _target(code[i - 1][2])
    what = _callee_name(e, callee)
    fixed = fixed_size(code, i - 1)
    if not fixed and callee and not any(pat.match(callee[1] or "") for pat, _ in SIZE_ARGS):
        # a wrapper's callee: the registers it reads may all be constants where some other
        # written before the call is not (only then is its code read: the cost)
        fixed = fixed_size(code, i - 1, args_read(path, callee[0], debug_dirs=debug_dirs))
    if fixed:
        return False, "calls %s with a fixed size (%s): a constructor" % (what, fixed)
    if callee is None and not _hook_call(code, i - 1):
        return False, "calls through a pointer read from an object (a method: dispatch)"
    start = _Path(ret, {"rax"}, {}, 0)
    if callee and OUT_PARAM.match(callee[1] or ""):
        slot = _addr_of_before(code, i - 1)
        if slot is None:
            return False, "posix_memalign's result slot not followed"
        start.held = {slot}
    ok, through = _follow(path, e, fn, code, start, 1)
    if ok:
        return True, "returns the block %s gave it%s" % (
            what, " (through %s)" % through if through else "")
    return False, "does not return the block %s gave it" % what


def _follow(path, e, fn, code, start, depth):
    """Does some path from START (a _Path) in the function FN (its CODE) reach a `ret` with
    the block in rax?  (verdict, the callee it went through or None).  A call with the block
    in rdi gives it back in rax when the callee is memset-like or, DEPTH > 0, a function of
    the object that returns its first argument (redis's extend_to_usable)."""
    at = {a: i for i, (a, _, _) in enumerate(code)}
    todo, seen, steps = [start], set(), 0
    while todo and steps < MAX_STEPS:
        p = todo.pop()
        while steps < MAX_STEPS:
            steps += 1
            if p.key() in seen or p.pc not in at:
                break
            seen.add(p.key())
            _, mn, ops = code[at[p.pc]]
            nxt = code[at[p.pc] + 1][0] if at[p.pc] + 1 < len(code) else None
            if mn.startswith("ret"):
                if "rax" in p.held:
                    return True, None
                break
            if mn in ("jmp", "call") or mn.startswith("j"):
                tgt = _target(ops)
                if mn == "call":
                    first = "rdi" in p.held
                    p.held -= set(CLOBBERED)
                    for r in CLOBBERED:
                        p.addr_of.pop(r, None)
                    if first and tgt and _returns_first(path, e, tgt, depth):
                        p.held.add("rax")
                    p.pc = nxt
                    continue
                inside = tgt is not None and fn[0] <= tgt[0] < fn[1]
                if mn == "jmp":
                    if inside:
                        p.pc = tgt[0]
                        continue
                    if tgt and "rdi" in p.held and _returns_first(path, e, tgt, depth):
                        return True, _callee_name(e, tgt)
                    break           # a tail call or an indirect jump: not followed
                if inside:          # a conditional jump: both ways
                    todo.append(_Path(tgt[0], set(p.held), dict(p.addr_of), p.sp))
                p.pc = nxt
                continue
            if mn in ("hlt", "ud2", "int3"):
                break
            _step(p, mn, ops)
            p.pc = nxt
            if nxt is None:
                break
    return False, None


_first = {}


def _returns_first(path, e, tgt, depth):
    """Does the call target TGT ((address, objdump's name)) return its first argument?"""
    if RETURNS_FIRST.match(tgt[1] or ""):
        return True
    if depth <= 0:
        return False
    key = (path, tgt[0])
    if key not in _first:
        _first[key] = False
        fn = e.code_at(tgt[0])
        if fn is not None and fn[0] == tgt[0]:
            code = _disassemble(path, fn[0], fn[1])
            if code:
                _first[key] = _follow(path, e, fn, code, _Path(fn[0], {"rdi"}, {}, 0),
                                      depth - 1)[0]
    return _first[key]


# the registers that carry an allocator's size (the rest: a wrapper's, see fixed_size)
SIZE_ARGS = [(re.compile(r"^(?:malloc|valloc|pvalloc|strdup|_Znwm|_Znam)\b"), ("rdi",)),
             (re.compile(r"^calloc\b"), ("rdi", "rsi")),
             (re.compile(r"^(?:realloc|aligned_alloc|memalign)\b"), ("rsi",)),
             (re.compile(r"^reallocarray\b"), ("rsi", "rdx")),
             (re.compile(r"^posix_memalign\b"), ("rdx",))]
ARG_REGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")


def fixed_size(code, i, args=None):
    """Is the call CODE[I] made with a size fixed in the code (a constructor's malloc(16),
    new T[4], zmalloc(sizeof(struct foo)))?  The argument registers are read back from the
    call to the previous call or jump: those holding an allocator's size (SIZE_ARGS), or, for
    another callee (a wrapper), the arguments it reads, ARGS (args_read), and when that is
    not known every one written there, which must include the first; fixed when each is an
    immediate, a zeroing, a constant address or a value read from one (a global: haproxy's
    pool_alloc(pool_head_connection), a size from the configuration; not the caller's).
    Returns the words or None."""
    callee = _target(code[i][2])
    name = (callee[1] or "") if callee else ""
    regs = next((r for pat, r in SIZE_ARGS if pat.match(name)), None)
    if regs is None and args is not None:
        regs = [r for r in ARG_REGS if r in args]
    start = i
    while start > max(i - 24, 0) and not code[start - 1][1].startswith(("j", "call", "ret")):
        start -= 1
    const, seen = {}, {}         # register -> the instruction that made it a constant
    for _, mn, ops in code[start:i]:
        reg = REGS.get(ops[0]) if ops else None
        if reg is None:
            continue
        zero = mn in ("xor", "sub") and len(ops) == 2 and ops[0] == ops[1]
        src = REGS.get(ops[1]) if len(ops) == 2 else None
        if (mn in ("mov", "movabs") and len(ops) == 2 and ops[1].startswith("0x")) or zero \
                or (mn in ("lea", "mov") and len(ops) == 2 and "[rip" in ops[1]):
            const[reg] = "%s %s" % (mn, ",".join(ops))
        elif mn == "mov" and src in const:
            const[reg] = const[src]
        elif mn not in ("test", "cmp", "push") and not (mn == "mov" and "[" in ops[0]):
            const.pop(reg, None)
        else:
            continue
        if reg in ARG_REGS:
            seen[reg] = const.get(reg)
    if regs is None:
        regs = [r for r in ARG_REGS if r in seen]
        if "rdi" not in seen:
            return None
    if regs and all(seen.get(r) for r in regs):
        return "; ".join(seen[r] for r in regs)
    return None


# how many argument registers the allocator's entries (and the string functions a wrapper
# calls) read: what a call to one of them consumes, for args_read
KNOWN_ARGS = [(re.compile(r"^(?:malloc|valloc|pvalloc|strdup|strlen|free|_Znwm|_Znam|_ZdlPv|"
                          r"_ZdaPv)(?:@plt)?$"), 1),
              (re.compile(r"^(?:calloc|realloc|aligned_alloc|memalign|strndup|"
                          r"_ZnwmSt11align_val_t|_ZnamSt11align_val_t|_ZdlPvm)(?:@plt)?$"), 2),
              (re.compile(r"^(?:reallocarray|posix_memalign|memcpy|memmove|memset|"
                          r"__memcpy_chk|__memset_chk)(?:@plt)?$"), 3)]
REG_WORD_RE = re.compile(r"\b(%s)\b" % "|".join(sorted(REGS, key=len, reverse=True)))
WRITE_ONLY = ("mov", "movabs", "lea", "movzx", "movsx", "movsxd", "pop", "movd", "movq")


def args_read(path, start, depth=2, debug_dirs=()):
    """The argument registers (rdi, rsi, rdx, rcx, r8, r9) the function at address START of
    PATH reads before it writes them, on some path: its arguments (ck_calloc(n, size) reads
    rdi and rsi, CRYPTO_zalloc(n, file, line) three).  A call or tail call reads the
    arguments of its target: a known allocator's (KNOWN_ARGS) or, DEPTH > 0, a function of
    the same object, read the same way.  None when not known (an indirect call, a callee in
    another object, a function without bounds): fixed_size then takes every argument
    register written before the call."""
    return _args_read(path, start, depth, tuple(debug_dirs))


@functools.lru_cache(maxsize=1024)
def _args_read(path, start, depth, debug_dirs):
    e = elf(path, debug_dirs)
    fn = e.code_at(start) if e is not None else None
    if fn is None or fn[0] != start:
        return None
    code = _disassemble(path, fn[0], fn[1])
    if not code:
        return None
    at = {a: k for k, (a, _, _) in enumerate(code)}
    read, todo, seen, steps = set(), [(start, frozenset())], set(), 0

    def callee_args(ops):
        tgt = _target(ops)
        if tgt is None:
            return None
        n = next((n for pat, n in KNOWN_ARGS if pat.match(tgt[1] or "")), None)
        if n is not None:
            return set(ARG_REGS[:n])
        if fn[0] <= tgt[0] < fn[1]:
            return None                 # a recursive call: not worth following
        if depth > 0:
            got = _args_read(path, tgt[0], depth - 1, debug_dirs)
            return set(got) if got is not None else None
        return None

    while todo:
        pc, written = todo.pop()
        written = set(written)
        while pc in at and steps < MAX_STEPS:
            if (pc, frozenset(written)) in seen:
                break
            seen.add((pc, frozenset(written)))
            steps += 1
            _, mn, ops = code[at[pc]]
            nxt = code[at[pc] + 1][0] if at[pc] + 1 < len(code) else None
            if mn.startswith("ret") or mn in ("hlt", "ud2", "int3"):
                break
            tgt = _target(ops) if mn.startswith(("j", "call")) else None
            inside = tgt is not None and fn[0] <= tgt[0] < fn[1]
            if mn == "call" or mn == "jmp" and not inside:
                if any(REG_WORD_RE.search(o) for o in ops) or tgt is None:
                    return None             # an indirect call: its arguments are not known
                got = callee_args(ops)
                if got is None:
                    return None
                read |= got - written
                if mn == "jmp":
                    break
                written |= set(ARG_REGS)    # clobbered by the call
                pc = nxt
                continue
            if mn.startswith("j"):
                if mn == "jmp":
                    pc = tgt[0] if inside else None
                    continue
                if inside:
                    todo.append((tgt[0], frozenset(written)))
                pc = nxt
                continue
            dst = REGS.get(ops[0]) if ops else None
            zero = mn in ("xor", "sub", "pxor") and len(ops) == 2 and ops[0] == ops[1]
            srcs = list(ops[1:]) + ([ops[0]] if ops and (dst is None or mn not in WRITE_ONLY)
                                    else [])
            if mn == "push":
                srcs = list(ops)
            if not zero:
                for o in srcs:
                    for m in REG_WORD_RE.findall(o):
                        r = REGS[m]
                        if r in ARG_REGS and r not in written:
                            read.add(r)
            if dst in ARG_REGS and mn not in ("push", "test", "cmp"):
                written.add(dst)
            pc = nxt
        if steps >= MAX_STEPS:
            return None
    return frozenset(read)


RAX_RE = re.compile(r"\b(?:rax|eax|ax|al|ah)\b")


def uses_result(path, offset, debug_dirs=()):
    """Does the caller, at file offset OFFSET of PATH (a return address, or the last byte of
    the call before it), read what the call returned (rax) before overwriting it, on some
    path?  (True, how) / (False, why) / (None, why not known).  A function that keeps its
    block (stores it, returns nothing) may still have it in rax when it returns: its callers
    never read it.  A caller that reached it through a method pointer (an interpreter's
    loop, a vtable) does not count: the dispatcher would be the site of every method's
    blocks, the method names what was made."""
    e, fn, ret, code, why = _code_around(path, offset, debug_dirs, "the caller")
    if code is None:
        return None, why
    addrs = [a for a, _, _ in code]
    i = bisect.bisect_right(addrs, ret - 1)
    if i <= 0 or i >= len(code) or not code[i - 1][1].startswith("call"):
        return None, "no call before the return address"
    if _target(code[i - 1][2]) is None and not _hook_call(code, i - 1):
        return False, "its callers reach it through a method pointer"
    at = {a: k for k, a in enumerate(addrs)}
    todo, seen = [code[i][0]], set()
    while todo and len(seen) < MAX_STEPS:
        pc = todo.pop()
        while pc in at and pc not in seen:
            seen.add(pc)
            _, mn, ops = code[at[pc]]
            nxt = code[at[pc] + 1][0] if at[pc] + 1 < len(code) else None
            if mn.startswith("ret"):
                return True, "returned on"
            if mn.startswith("call"):
                if any(RAX_RE.search(o) for o in ops):
                    return True, "used"
                break                           # rax clobbered
            if mn.startswith("j"):
                if any(RAX_RE.search(o) for o in ops):
                    return True, "used"
                tgt = _target(ops)
                inside = tgt is not None and fn[0] <= tgt[0] < fn[1]
                if mn == "jmp":
                    if not inside:
                        break                   # a tail call: rax is no argument
                    pc = tgt[0]
                    continue
                if inside:
                    todo.append(tgt[0])
                pc = nxt
                continue
            if mn in ("hlt", "ud2", "int3"):
                break
            if mn in ("nop", "endbr64") or mn == "xchg" and len(ops) == 2 and ops[0] == ops[1]:
                pc = nxt
                continue
            if ops and RAX_RE.fullmatch(ops[0]) and mn in ("xor", "sub") and \
                    len(ops) == 2 and ops[0] == ops[1]:
                break                           # xor eax,eax: zeroed, nothing read
            reads = [o for o in ops[1:]] + [o for o in ops[:1] if "[" in o]
            if any(RAX_RE.search(o) for o in reads):
                return True, "used"
            if ops and RAX_RE.fullmatch(ops[0]):
                if mn in ("mov", "movabs", "lea", "movzx", "movsx", "movsxd", "pop") or \
                        mn.startswith("set"):
                    break                       # overwritten first
                return True, "used"             # read-modify-write (add, and, cmp, test)
            pc = nxt
    return False, "the caller does not use the returned value"


def _hook_call(code, i):
    """Is the indirect call CODE[I] made through a pointer in a fixed place (an allocator hook:
    libxml2's xmlMalloc, `call [rip+...]`; sqlite's configured xMalloc, a field of a global
    struct, `call [rbp+0x20]` with rbp its address; a register loaded from one), not one read
    from an object the function was given (a method table: PyObject_Vectorcall,
    tp_getattro), which dispatches rather than allocates?"""
    ops = code[i][2]
    if not ops:
        return False
    m = re.match(r"^(?:[A-Z]+ PTR )?(?:[a-z]s:)?\[(\w+)", ops[0])
    if m:                                       # call [base+disp]: the table's address
        return m.group(1) == "rip" or _global_value(code, i, REGS.get(m.group(1)), 2, True)
    return _global_value(code, i, REGS.get(ops[0]), 2, False)


def _global_value(code, i, reg, depth, address):
    """Does REG hold, at CODE[I], a global's address (ADDRESS) or a value read from a global
    or from a field of one?  Read back from I to the nearest write of REG, in the order of
    the code (a register set up once, in the prologue, for the whole function)."""
    if reg is None or depth <= 0:
        return False
    for j in range(i - 1, -1, -1):
        mn, o = code[j][1], code[j][2]
        # (a pop: an epilogue's, restoring the register for another path)
        if not o or REGS.get(o[0]) != reg or mn in ("push", "pop", "cmp", "test") or \
                mn.startswith(("j", "call")):
            if mn.startswith("call") and reg in CLOBBERED:
                return False
            continue
        if len(o) != 2:
            return False
        if mn == "lea":
            return "[rip" in o[1]
        if mn != "mov":
            return False
        if o[1] in REGS:
            return _global_value(code, j, REGS[o[1]], depth, address)
        mm = re.match(r"^(?:[A-Z]+ PTR )?(?:[a-z]s:)?\[(\w+)", o[1])
        if not mm:
            return False
        if mm.group(1) == "rip":
            return True
        return not address and _global_value(code, j, REGS.get(mm.group(1)), depth - 1, True)
    return False


def _callee_name(e, callee):
    """The name of a call's target: its function symbol (the debug file's, for a stripped
    object), else objdump's name when it is one (malloc@plt), not an offset from one."""
    if callee is None:
        return "the call"
    fn = e.function_at(callee[0])
    if fn is not None and fn[0] == callee[0]:
        return fn[2]
    name = callee[1] or ""
    return name.split("@")[0] if name and "+" not in name else "the call"


def _target(ops):
    m = TARGET_RE.match(ops[0]) if ops else None
    return (int(m.group(1), 16), m.group(2)) if m else None


def _addr_of_before(code, i):
    """The stack slot rdi points at when the call CODE[I] is made (a lea shortly before)."""
    for j in range(i - 1, max(i - 12, -1), -1):
        _, mn, ops = code[j]
        if ops and REGS.get(ops[0]) == "rdi":
            if mn == "mov" and len(ops) == 2 and ops[1] in ("rsp", "rbp"):
                return (ops[1], 0)
            if mn == "lea":
                m = MEM_RE.match(ops[1])
                if m:
                    disp = int(m.group(3), 16) if m.group(3) else 0
                    disp = -disp if m.group(2) == "-" else disp
                    # rsp-relative slots are counted from the entry sp: unknown here, so
                    # the slot is named relative to the sp at the call (sp offset 0)
                    return ("rsp", disp) if m.group(1) == "rsp" else ("rbp", disp)
            return None
    return None


def _step(p, mn, ops):
    """One instruction that is not a jump, call or ret, on path P."""
    dst = p.loc(ops[0]) if ops else None
    src = p.loc(ops[1]) if len(ops) > 1 else None
    if mn == "push":
        p.sp -= 8
        if dst in p.held:
            p.held.add(("rsp", p.sp))
        else:
            p.held.discard(("rsp", p.sp))
        return
    if mn == "pop":
        if ("rsp", p.sp) in p.held:
            p.held.add(dst)
        elif dst is not None:
            p.held.discard(dst)
        p.sp += 8
        return
    if dst == "rsp" and mn in ("add", "sub") and len(ops) > 1 and ops[1].startswith("0x"):
        p.sp += int(ops[1], 16) * (1 if mn == "add" else -1)
        return
    if mn in ("test", "cmp", "nop", "endbr64", "bt", "ucomisd", "comisd") or \
            mn.startswith(("prefetch", "cmov")) and src not in p.held:
        return
    if dst is None:
        return
    if mn.startswith("cmov") or mn in ("mov", "movabs"):
        if src is not None and src in p.held:
            p.held.add(dst)
        else:
            p.held.discard(dst)
        p.addr_of.pop(dst, None)
        return
    if mn == "xchg" and src is not None:
        a, b = dst in p.held, src in p.held
        for loc, keep in ((dst, b), (src, a)):
            (p.held.add if keep else p.held.discard)(loc)
        return
    if mn == "lea":
        m = re.match(r"^(?:[A-Z]+ PTR )?\[(\w+)(?:[+-]0x[0-9a-f]+)?\]$", ops[1])
        base = REGS.get(m.group(1)) if m else None
        if base is not None and base in p.held:
            p.held.add(dst)         # the block plus a constant: a header before it
        else:
            p.held.discard(dst)
        return
    if mn in ("add", "sub") and dst in p.held and len(ops) > 1 and ops[1].startswith("0x"):
        return                      # the same block, a constant further
    p.held.discard(dst)
