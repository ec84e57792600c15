"""Reading the traced program's machine code (x86-64 ELF), for two things the report needs:

- the function symbols of an object (.symtab, else .dynsym): the exported-symbol fallback of
  the symbolizer (a frame in a stripped library shows `zmalloc+0x1c`, not only `lib+0x...`),
  and the bounds of a function to disassemble;
- whether a function hands back the block it got from the allocator (hands_back): the code
  evidence that makes it an allocation wrapper (sites.find_wrappers, docs/wrappers.rst).

The ELF headers are read with the standard library; the instructions with objdump (binutils),
one run per function, which is optional: without objdump no function is found to be a wrapper.
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
INSN_RE = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
PREFIXES = {"bnd", "notrack", "rep", "repz", "repe", "repnz", "repne", "lock", "data16", "cs",
            "ds", "addr32"}
MEM_RE = re.compile(r"^(?:[A-Z]+ PTR )?(?:[a-z]s:)?\[(r[sb]p)(?:([+-])0x([0-9a-f]+))?\]$")
TARGET_RE = re.compile(r"^([0-9a-f]+)(?: <([^>]*)>)?$")
MAX_STEPS = 4000


@functools.lru_cache(maxsize=1024)
def _disassemble(path, start, end):
    """[(address, mnemonic, [operands])] of PATH's code in [START, END) (cached: a function
    is read for its return addresses and for its callers')."""
    exe = shutil.which("objdump")
    if not exe:
        return None
    try:
        fd = files.open_regular(path)   # a name from a maps file: nothing but a regular file
    except OSError:
        return None
    try:
        r = subprocess.run([exe, "-d", "-M", "intel", "--no-show-raw-insn", "-w",
                            "--start-address=0x%x" % start, "--stop-address=0x%x" % end,
                            "/proc/self/fd/%d" % fd], pass_fds=(fd,),
                           capture_output=True, text=True, errors="replace", timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        os.close(fd)
    out = []
    for line in r.stdout.splitlines():
        m = INSN_RE.match(line)
        if not m:
            continue
        text = m.group(2).split("#", 1)[0].strip()
        words = text.split(None, 1)
        while words and words[0] in PREFIXES:
            words = words[1].split(None, 1) if len(words) > 1 else []
        if not words:
            continue
        ops = _operands(words[1]) if len(words) > 1 else []
        out.append((int(m.group(1), 16), words[0], tuple(ops)))
    return tuple(out)


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
    fn = e.function_at(ret) if ret is not None else None
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
    if fixed:
        return False, "calls %s with a fixed size (%s): a constructor" % (what, fixed)
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
        fn = e.function_at(tgt[0])
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


def fixed_size(code, i):
    """Is the call CODE[I] made with a size fixed in the code (a constructor's malloc(16),
    new T[4], zmalloc(sizeof(struct foo)))?  The argument registers are read back from the
    call to the previous call or jump: those holding an allocator's size (SIZE_ARGS), or, for
    another callee (a wrapper), every one written there, which must include the first; fixed
    when each is an immediate, a zeroing or a constant address.  Returns the words or None."""
    callee = _target(code[i][2])
    name = (callee[1] or "") if callee else ""
    regs = next((r for pat, r in SIZE_ARGS if pat.match(name)), None)
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
                or (mn == "lea" and "[rip" in ops[1]):
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


RAX_RE = re.compile(r"\b(?:rax|eax|ax|al|ah)\b")


def uses_result(path, offset, debug_dirs=()):
    """Does the caller, at file offset OFFSET of PATH (a return address, or the last byte of
    the call before it), read what the call returned (rax) before overwriting it, on some
    path?  (True, how) / (False, why) / (None, why not known).  A function that keeps its
    block (stores it, returns nothing) may still have it in rax when it returns: its callers
    never read it."""
    e, fn, ret, code, why = _code_around(path, offset, debug_dirs, "the caller")
    if code is None:
        return None, why
    addrs = [a for a, _, _ in code]
    i = bisect.bisect_right(addrs, ret - 1)
    if i <= 0 or i >= len(code) or not code[i - 1][1].startswith("call"):
        return None, "no call before the return address"
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
