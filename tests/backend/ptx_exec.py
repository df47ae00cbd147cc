"""Test helper: execute a kernel's integer and float PTX on the CPU for every thread of one program at once
(numpy), with a memory image: the kernel's pointer arguments are numpy arrays that ``ld.global``
reads and ``st.global`` writes, as a launch would. A CPU differential test compares the outputs
with the interpreter's (tests/backend/test_ptx_differential.py).

:func:`run_program` executes the instructions of tests/backend/ptx_ops.py (integer arithmetic,
comparisons, selects, conversions, bit operations, ``div`` / ``rem``), the float instructions the
PTX ISA defines exactly (tests/backend/ptx_float.py, ptx_fcvt.py: every rounding of ``add`` / ``mul``
/ ``fma`` / ``div`` / ``sqrt`` / ``cvt``, ``min`` / ``max`` / ``setp`` with their NaN rules),
float literals (``0f3F800000``, ``0d...``), ``ld.param``, the special
registers ``%tid.x`` / ``%ntid.x`` / ``%ctaid.*`` / ``%nctaid.*``, predicated instructions per
thread, branches (divergent ones too: each thread has its own program counter, and the
threads furthest behind run next, so paths reconverge where the others wait) and global loads and stores of every width
and vector form (``.v2`` / ``.v4``); shared memory, ``bar.sync`` and ``shfl.sync``
(tests/backend/ptx_shared.py: unordered accesses between barriers are races) and integer global
atomics (tests/backend/ptx_atomic.py). It never guesses:

* an instruction it does not know or cannot model exactly (``vote``, a float atomic, ``.approx``
  math such as ``ex2`` / ``sin`` / ``rcp.approx``, ``.ftz``) is an :class:`UnknownInstruction`;
* an active thread that accesses memory outside every argument array, or misaligned, or stores a
  register lane no instruction defined (or one computed from such a lane), is a :class:`MemoryFault`;
* threads that store different values to one byte in one instruction are a :class:`MemoryFault`;
* a ``div`` / ``rem`` by zero (or signed ``MIN / -1``) in an active thread is an
  :class:`~.ptx_ops.UndefinedResult`.

The threads at one statement run it together, so an instruction's loads see the stores of every
instruction run before it (global memory is not checked for races: the kernels it is for have no
cross-thread dependence through global memory within a program, atomics aside).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from .address_eval import UnknownInstruction
from .ptx_atomic import AtomicLog, execute_atomic, parse_atomic
from .ptx_float import FLOAT_LITERAL, instruction_value
from .ptx_ops import INSTR, U64, MemoryFault, mask, sext, statements, wrap
from .ptx_shared import SHARED_BASE, SharedImage, barrier_id, shuffle

__all__ = ["ARRAY_BASE", "ARRAY_STRIDE", "MemoryFault", "run_grid", "run_program"]

ARRAY_BASE, ARRAY_STRIDE = 1 << 40, 1 << 36
"""Where the evaluator places pointer argument k: ``ARRAY_BASE + k * ARRAY_STRIDE``."""
_ACCESS = re.compile(r"(ld|st)\.(global|shared(?:::cta)?)((?:\.[\w:]+)*?)(?:\.v(\d))?\.([bsuf])(\d+)$")
_REG_DECL = re.compile(r"\.reg\s+\.(\w+)\s+(%[a-z]+)<\d+>")
_ADDRESS = re.compile(r"^\[\s*(%\w+|[A-Za-z_$][\w$]*)\s*(?:\+\s*(-?\d+))?\s*\]$")
_EXTERN_SHARED = re.compile(r"\.extern\s+\.shared\s+\.align\s+\d+\s+\.b8\s+(\w+)\[\]\s*;")


class _Memory:
    """The pointer arguments' arrays at their addresses (their bytes read and written in place),
    the programs' shared memory and the record of the atomics."""

    def __init__(self, shared: SharedImage) -> None:
        self.regions: list[np.ndarray] = []  # (argument k's bytes; empty for a scalar argument)
        self.shared = shared
        self.atomics = AtomicLog()

    def add(self, k: int, arr: np.ndarray) -> int:
        if not arr.flags.c_contiguous:
            raise ValueError("pointer arguments must be C-contiguous arrays")
        while len(self.regions) <= k:
            self.regions.append(np.zeros(0, np.uint8))
        self.regions[k] = arr.reshape(-1).view(np.uint8)
        return ARRAY_BASE + k * ARRAY_STRIDE

    def locate(self, addr: np.ndarray, nbytes: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(lanes, region bytes, byte offsets) of the lanes ``addr`` covers; a lane in no region or
        misaligned is a MemoryFault."""
        if (addr % U64(nbytes)).any():
            lane = int(np.flatnonzero(addr % U64(nbytes))[0])
            raise MemoryFault(f"a misaligned {nbytes}-byte access at {int(addr[lane]):#x} (thread {lane})")
        rel = addr - U64(ARRAY_BASE)  # (below the first region: wraps past every region)
        k, off = rel // U64(ARRAY_STRIDE), (rel % U64(ARRAY_STRIDE)).astype(np.int64)
        sizes = np.array([len(r) for r in self.regions] + [0], np.int64)
        inside = off + nbytes <= sizes[np.minimum(k, U64(len(self.regions))).astype(np.int64)]
        if not inside.all():
            lane = int(np.flatnonzero(~inside)[0])
            raise MemoryFault(f"a {nbytes}-byte access at {int(addr[lane]):#x} (thread {lane}) is outside every "
                              "argument array")
        out = []
        for region in np.unique(k):
            lanes = np.flatnonzero(k == region)
            out.append((lanes, self.regions[int(region)], off[lanes]))
        return out

    def load(self, addr: np.ndarray, nbytes: int) -> np.ndarray:
        out = np.zeros(len(addr), U64)
        for lanes, buf, off in self.locate(addr, nbytes):
            for j in range(nbytes):
                out[lanes] |= buf[off + j].astype(U64) << U64(8 * j)
        return out

    def store(self, addr: np.ndarray, nbytes: int, value: np.ndarray) -> None:
        for lanes, buf, off in self.locate(addr, nbytes):
            for j in range(nbytes):
                byte = ((value[lanes] >> U64(8 * j)) & U64(0xFF)).astype(np.uint8)
                buf[off + j] = byte
                if (buf[off + j] != byte).any():
                    lane = int(lanes[np.flatnonzero(buf[off + j] != byte)[0]])
                    raise MemoryFault(f"threads store different values to {int(addr[lane]) + j:#x} in one "
                                      "instruction")


class _Machine:
    """Registers (value and, per thread, whether it is defined) and the special registers."""

    def __init__(self, ptx: str, num_threads: int, ctaids: list[tuple[int, int, int]],
                 grid: tuple[int, int, int]) -> None:
        """Lanes: the threads 0..num_threads-1 (x) of each program of ``ctaids``, one after another."""
        self.n = n = num_threads * len(ctaids)
        self.threads, self.programs = num_threads, len(ctaids)
        self.symbols = {name: SHARED_BASE for name in _EXTERN_SHARED.findall(ptx)}
        self.regs: dict[str, np.ndarray] = {}
        self.defined: dict[str, np.ndarray] = {}
        self.widths = {prefix: (1 if ty == "pred" else int(ty[1:])) for ty, prefix in _REG_DECL.findall(ptx)}
        self.special = {"%tid.x": np.tile(np.arange(num_threads, dtype=U64), len(ctaids)),
                        "%tid.y": np.zeros(n, U64), "%tid.z": np.zeros(n, U64), "%ntid.x": np.full(n, num_threads, U64),
                        "%ntid.y": np.ones(n, U64), "%ntid.z": np.ones(n, U64)}
        self.special["%laneid"] = self.special["%tid.x"] % U64(32)
        for d, axis in enumerate("xyz"):
            self.special[f"%ctaid.{axis}"] = np.repeat(np.array([c[d] for c in ctaids], U64), num_threads)
            self.special[f"%nctaid.{axis}"] = np.full(n, grid[d], U64)

    def val(self, tok: str) -> tuple[np.ndarray, np.ndarray]:
        """(value, defined) of an operand: a register, a special register or an integer literal."""
        tok = tok.strip()
        if tok in self.regs:
            return self.regs[tok], self.defined[tok]
        if tok in self.special:
            return self.special[tok], np.ones(self.n, bool)
        lit = re.fullmatch(r"(-?(?:0[xX][0-9a-fA-F]+|\d+))U?", tok)
        if lit:
            return np.full(self.n, int(lit.group(1), 0) & 0xFFFFFFFFFFFFFFFF, U64), np.ones(self.n, bool)
        flit = FLOAT_LITERAL.fullmatch(tok)
        if flit:  # its bits
            return np.full(self.n, int(flit.group(1) or flit.group(2), 16), U64), np.ones(self.n, bool)
        sym = re.fullmatch(r"([A-Za-z_$][\w$]*)\s*(?:\+\s*(\d+))?", tok)
        if sym and sym.group(1) in self.symbols:  # the address of a shared variable (in its window)
            return np.full(self.n, self.symbols[sym.group(1)] + int(sym.group(2) or 0), U64), np.ones(self.n, bool)
        if re.fullmatch(r"%[a-z]+\d+", tok):
            return np.zeros(self.n, U64), np.zeros(self.n, bool)  # never written: undefined
        raise UnknownInstruction(f"the value of {tok}")

    def width(self, reg: str) -> int:
        m = re.match(r"(%[a-z]+)\d+$", reg)
        if m is None or m.group(1) not in self.widths:
            raise UnknownInstruction(f"the register {reg}")
        return self.widths[m.group(1)]

    def write(self, reg: str, value: np.ndarray, defined: np.ndarray, active: np.ndarray) -> None:
        """``reg`` := ``value`` in the active threads (the others keep theirs)."""
        value = wrap(value, self.width(reg))
        if active.all():
            self.regs[reg], self.defined[reg] = value, np.asarray(defined, bool)
            return
        old, old_def = self.val(reg)
        self.regs[reg] = np.where(active, value, old)
        self.defined[reg] = np.where(active, defined, old_def)


def _dim3(v: int | Sequence[int], fill: int) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(v)
    return (*t, fill, fill)[:3]  # type: ignore[return-value]


def run_program(ptx: str, num_threads: int, ctaid: int | Sequence[int], args: Sequence[np.ndarray | int],
                grid: int | Sequence[int] = 1, max_steps: int = 200_000, smem_bytes: int = 0) -> None:
    """Execute program ``ctaid`` (threads 0..num_threads-1 along x) of the kernel's (one entry) PTX;
    ``args``: the kernel parameters in order, a numpy array for a pointer (read and written in
    place, at the address :data:`ARRAY_BASE` + k * :data:`ARRAY_STRIDE` for parameter k) and an
    int for a scalar; ``smem_bytes``: the dynamic shared memory of the launch (the compiled kernel's
    ``smem_bytes``). More than ``max_steps`` statements executed is an :class:`UnknownInstruction`."""
    _run(ptx, _Machine(ptx, num_threads, [_dim3(ctaid, 0)], _dim3(grid, 1)), args, max_steps, smem_bytes)


def run_grid(ptx: str, num_threads: int, grid: int | Sequence[int], args: Sequence[np.ndarray | int],
             max_steps: int = 200_000, smem_bytes: int = 0) -> None:
    """:func:`run_program` for every program of ``grid`` (up to three dimensions, x fastest) at once
    (their threads side by side: one pass over the statements; a store that two programs' threads
    make to one byte with different values in one instruction is a MemoryFault, as within a
    program; each program has its own shared memory)."""
    g = _dim3(grid, 1)
    ctaids = [(x, y, z) for z in range(g[2]) for y in range(g[1]) for x in range(g[0])]
    _run(ptx, _Machine(ptx, num_threads, ctaids, g), args, max_steps, smem_bytes)


def _run(ptx: str, mach: _Machine, args: Sequence[np.ndarray | int], max_steps: int, smem_bytes: int) -> None:
    memory = _Memory(SharedImage(mach.programs, mach.threads, smem_bytes))
    params = [memory.add(k, a) if isinstance(a, np.ndarray) else int(a) & 0xFFFFFFFFFFFFFFFF
              for k, a in enumerate(args)]
    num_threads = mach.n
    stmts = statements(ptx)
    labels = {s[:-1]: i for i, s in enumerate(stmts) if s.endswith(":")}
    pcs = np.zeros(num_threads, np.int64)  # each thread's next statement
    alive = np.ones(num_threads, bool)
    waiting = np.full(num_threads, -1, np.int64)  # the barrier a thread waits at (-1: none)
    steps = 0
    with np.errstate(over="ignore"):
        while alive.any():
            runnable = alive & (waiting < 0)
            if not runnable.any():
                _release(mach, memory.shared, alive, waiting)
                continue
            pc = int(pcs[runnable].min())  # the threads furthest behind run (reconverging where the others wait)
            if pc >= len(stmts):
                raise UnknownInstruction("the kernel runs past its last statement")
            here = runnable & (pcs == pc)
            pcs[here] = pc + 1
            steps += 1
            if steps > max_steps:
                raise UnknownInstruction(f"more than {max_steps} statements executed")
            stmt = stmts[pc]
            if stmt.startswith((".", "{", "}")) or stmt.endswith(":"):
                continue
            m = INSTR.match(stmt)
            if m is None:
                raise UnknownInstruction(stmt)
            guard, op, rest = m.group(1), m.group(2), m.group(3)
            active = here if guard is None else here & _predicate(mach, guard, here)
            base = op.split(".")[0]
            if base == "bra":
                pcs[active] = labels[rest.strip()]
            elif base in ("ret", "exit"):
                alive &= ~active
            elif base in ("bar", "barrier"):
                waiting[active] = barrier_id(op, _operands(rest), mach.threads)
            else:
                _execute(mach, memory, params, stmt, op, rest, active)


def _release(mach: _Machine, shared: SharedImage, alive: np.ndarray, waiting: np.ndarray) -> None:
    """Every running thread waits at a barrier: each program whose threads all wait at one barrier
    passes it (a new epoch of its shared memory); a program some of whose threads exited, or whose
    threads wait at different barriers, never would (refused)."""
    t = mach.threads
    for prog in np.unique(np.flatnonzero(waiting >= 0) // t):
        lanes = slice(prog * t, (prog + 1) * t)
        if not alive[lanes].all():
            raise UnknownInstruction(f"a barrier in program {prog} that its exited threads never reach")
        if len(set(waiting[lanes].tolist())) != 1:
            raise UnknownInstruction(f"the threads of program {prog} wait at different barriers")
        waiting[lanes] = -1
        shared.release(int(prog))


def _predicate(mach: _Machine, guard: str, here: np.ndarray) -> np.ndarray:
    """Per thread, whether ``@%p`` / ``@!%p`` holds; undefined in a thread ``here`` is a MemoryFault."""
    p, ok = mach.val(guard.strip().lstrip("@!"))
    if not ok[here].all():
        raise MemoryFault(f"the guard {guard.strip()} is undefined in thread {int(np.flatnonzero(~ok)[0])}")
    return ~(p != 0) if guard.startswith("@!") else p != 0


def _operands(rest: str) -> list[str]:
    """The operands, a vector ``{%r1, %r2}`` as one."""
    return [a.strip() for a in re.findall(r"\s*(\{[^}]*\}|\[[^\]]*\]|[^,\s][^,]*)", rest)]


def _vector(tok: str) -> list[str]:
    return [e.strip() for e in tok.strip("{}").split(",")] if tok.startswith("{") else [tok]


def _execute(mach: _Machine, memory: _Memory, params: list[int], stmt: str, op: str, rest: str,
             active: np.ndarray) -> None:
    """One non-branch statement in the active threads."""
    args = _operands(rest)
    if op.startswith("ld.param"):
        pm = re.search(r"_param_(\d+)", args[1])
        if pm is None:
            raise UnknownInstruction(stmt)
        bits = int(re.search(r"(\d+)$", op).group(1))  # type: ignore[union-attr]
        value = np.full(mach.n, params[int(pm.group(1))], U64) & mask(bits)
        if re.search(r"\.s\d+$", op):  # ld.param.s8 into a 16-bit register sign-extends, as a signed ld.global
            value = sext(value, bits)
        mach.write(args[0], value, np.ones(mach.n, bool), active)
        return
    acc = _ACCESS.match(op)
    if acc:
        _access(mach, memory, stmt, acc, args, active)
        return
    if op.startswith(("atom", "red")):
        _atomic(mach, memory, op, args, active)
        return
    if op.startswith("shfl.sync."):
        _shuffle(mach, op, args, active)
        return
    if op.startswith(("ld", "st")) or (op.startswith("cvta") and ".global" not in op):
        raise UnknownInstruction(stmt)
    if op.startswith("mov.b") and (args[0].startswith("{") or args[1].startswith("{")):
        _pack(mach, op, args, active)
        return
    if len(args) < 2 or not args[0].startswith("%"):
        raise UnknownInstruction(stmt)
    vals = [mach.val(a) for a in args[1:]]
    defined = np.logical_and.reduce([d for _, d in vals])
    if op.startswith("selp"):  # only the selected operand need be defined
        c = vals[2][0] != 0
        defined = vals[2][1] & np.where(c, vals[0][1], vals[1][1])
    value = instruction_value(op, [v for v, _ in vals], active & defined)
    dst = op.split(".")[-2] if op.startswith("cvt.") else ""
    if dst.startswith("s"):  # a signed destination narrower than its register is sign-extended to it
        value = sext(value, int(dst[1:]))  # (LLVM's sign extension in a register: cvt.s8.s32 %rs, %r)
    mach.write(args[0], value, defined, active)


def _pack(mach: _Machine, op: str, args: list[str], active: np.ndarray) -> None:
    """``mov.b<n> %r, {%a, %b}`` (packs the elements, the first lowest) and its inverse."""
    total = int(op[5:])
    if args[1].startswith("{"):  # pack
        elems = [mach.val(e) for e in _vector(args[1])]
        bits = total // len(elems)
        value, defined = np.zeros(mach.n, U64), np.ones(mach.n, bool)
        for j, (v, ok) in enumerate(elems):
            value |= wrap(v, bits) << U64(j * bits)
            defined &= ok
        mach.write(args[0], value, defined, active)
        return
    v, ok = mach.val(args[1])
    names = _vector(args[0])
    bits = total // len(names)
    for j, reg in enumerate(names):
        if reg != "_":
            mach.write(reg, wrap(v >> U64(j * bits), bits), ok, active)


def _access(mach: _Machine, memory: _Memory, stmt: str, acc: re.Match, args: list[str], active: np.ndarray) -> None:
    """``ld`` / ``st`` of ``.global`` or ``.shared`` (cache qualifiers ignored), scalar or vector, of an
    integer or bit type (a float type's bits move the same way)."""
    is_store, shared = acc.group(1) == "st", acc.group(2).startswith("shared")
    count, kind, bits = int(acc.group(4) or 1), acc.group(5), int(acc.group(6))
    addr_tok, regs = (args[0], args[1]) if is_store else (args[1], args[0])
    am = _ADDRESS.match(addr_tok)
    if am is None:
        raise UnknownInstruction(stmt)
    base, ok = mach.val(am.group(1))
    if not ok[active].all():
        raise MemoryFault(f"an undefined address: {stmt}")
    addr = base + U64(int(am.group(2) or 0) & 0xFFFFFFFFFFFFFFFF)
    elems = _vector(regs)
    if len(elems) != count:
        raise UnknownInstruction(stmt)
    nbytes = bits // 8
    if (addr[active] % U64(nbytes * count)).any():
        raise MemoryFault(f"a misaligned {nbytes * count}-byte access: {stmt}")
    lanes = np.flatnonzero(active)
    for j, reg in enumerate(elems):
        a = addr[active] + U64(j * nbytes)
        if shared:
            if is_store:
                value, ok = mach.val(reg)
                memory.shared.store(lanes, a, nbytes, value[active], ok[active])
            else:
                v, ok = memory.shared.load(lanes, a, nbytes)
                loaded, defined = np.zeros(mach.n, U64), np.zeros(mach.n, bool)
                loaded[active], defined[active] = sext(v, bits) if kind == "s" else v, ok
                if reg != "_":
                    mach.write(reg, loaded, defined, active)
        elif is_store:
            value, ok = mach.val(reg)
            if not ok[active].all():
                raise MemoryFault(f"a store of an undefined value: {stmt}")
            memory.store(a, nbytes, value[active])
        elif reg != "_":
            loaded = np.zeros(mach.n, U64)
            loaded[active] = memory.load(a, nbytes)
            if kind == "s":
                loaded = sext(loaded, bits)
            mach.write(reg, loaded, np.ones(mach.n, bool), active)


def _atomic(mach: _Machine, memory: _Memory, op: str, args: list[str], active: np.ndarray) -> None:
    """``atom.global`` / ``red.global`` (tests/backend/ptx_atomic.py) in the active threads, in lane order."""
    a = parse_atomic(op)
    dst, rest = (args[0], args[1:]) if a.returns else (None, args)
    am = _ADDRESS.match(rest[0]) if rest else None
    if am is None or len(rest) != 1 + a.operands:
        raise UnknownInstruction(f"{op} {', '.join(args)}")
    base, ok = mach.val(am.group(1))
    vals = [mach.val(r) for r in rest[1:]]
    if not ok[active].all() or not all(d[active].all() for _, d in vals):
        raise MemoryFault(f"an atomic with an undefined address or operand: {op} {', '.join(args)}")
    addr = (base + U64(int(am.group(2) or 0) & 0xFFFFFFFFFFFFFFFF))[active]
    if (addr % U64(a.bits // 8)).any():
        raise MemoryFault(f"a misaligned atomic: {op} {', '.join(args)}")
    lanes = np.flatnonzero(active)
    prog, thread = lanes // mach.threads, lanes % mach.threads
    old = execute_atomic(a, memory, memory.atomics, addr, [v[active] for v, _ in vals], prog, thread,
                         memory.shared.epoch[prog])
    if dst is not None:
        full = np.zeros(mach.n, U64)
        full[active] = old
        mach.write(dst, full, np.ones(mach.n, bool), active)


def _shuffle(mach: _Machine, op: str, args: list[str], active: np.ndarray) -> None:
    """``shfl.sync.<mode>.b32 d[|p], a, b, c, membermask`` (tests/backend/ptx_shared.py)."""
    parts = op.split(".")
    if len(parts) != 4 or parts[3] != "b32" or len(args) != 5:
        raise UnknownInstruction(f"{op} {', '.join(args)}")
    dst, _, pred = args[0].partition("|")
    b, c, mm = (mach.val(x) for x in args[2:])
    if not all(d[active].all() for _, d in (b, c, mm)):
        raise MemoryFault(f"a shuffle with an undefined lane, clamp or mask: {op} {', '.join(args)}")
    value, defined, pval = shuffle(parts[2], mach.val(args[1]), b[0], c[0], mm[0], active,
                                   mach.special["%tid.x"])
    mach.write(dst.strip(), value, defined, active)
    if pred:
        mach.write(pred.strip(), pval.astype(U64), np.ones(mach.n, bool), active)
