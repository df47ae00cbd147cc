"""Test helper: the global memory addresses a kernel's straight-line PTX accesses, for every thread of
one program at once (numpy).

tests/backend/address_eval.py evaluates the LLVM IR that code generation emits (or the IR after the
O3 pipeline), but NVPTX code generation runs passes of its own before instruction selection (the
separation of constant offsets from ``getelementptr`` indices, the straight-line strength
reduction), and those read the IR's ``inbounds`` and ``nsw`` flags. Their result is only in the PTX:
:func:`ptx_accesses` executes the PTX's integer arithmetic (``add``/``sub``/``mul``/``mad``, their
``.wide`` forms, shifts, bitwise operations, ``cvt`` between integers, ``setp``/``selp`` and the
predicate logic) from ``%tid.x``, ``%ctaid.x`` and the kernel parameters' values, and records each
``ld.global`` / ``st.global`` with its address and predicate per thread, following uniform branches
(a loop runs its iterations). Instructions whose results no access reads are skipped; an access that
reads a register the evaluator could not compute is an :class:`UnknownInstruction`.
"""

from __future__ import annotations

import re

import numpy as np

from .address_eval import Access, UnknownInstruction

_U64 = np.uint64
_INSTR = re.compile(r"^(@!?%p\d+\s+)?([a-z][\w.]*)\s+(.*?);?$")
_ACCESS = re.compile(r"(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d))?\.[bsuf](\d+)$")


def _bits(op: str) -> int:
    """The operand width of ``op``'s type suffix (``add.s32``: 32; ``mul.wide.s32``: 32)."""
    m = re.search(r"\.[bsu](\d+)$|\.pred$", op)
    if m is None:
        raise UnknownInstruction(op)
    return 1 if m.group(1) is None else int(m.group(1))


def _wrap(x: np.ndarray, bits: int) -> np.ndarray:
    return x & _U64((1 << bits) - 1) if bits < 64 else x


def _signed(x: np.ndarray, bits: int) -> np.ndarray:
    v = _wrap(x, bits).astype(np.int64) if bits < 64 else x.astype(np.int64)
    return v - ((v >> (bits - 1)) & 1) * (1 << bits) if bits < 64 else v


def _sext(x: np.ndarray, bits: int) -> np.ndarray:
    return _signed(x, bits).astype(_U64)


class _Machine:
    def __init__(self, n: int, ctaid: int, params: list[int]) -> None:
        self.n = n
        self.regs: dict[str, np.ndarray] = {}
        self.special = {"%tid.x": np.arange(n, dtype=_U64), "%ctaid.x": np.full(n, ctaid, _U64),
                        "%ntid.x": np.full(n, n, _U64)}
        self.params = [v & 0xFFFFFFFFFFFFFFFF for v in params]

    def val(self, tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in self.regs:
            return self.regs[tok]
        if tok in self.special:
            return self.special[tok]
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
            return np.full(self.n, int(tok, 0) & 0xFFFFFFFFFFFFFFFF, _U64)
        raise UnknownInstruction(f"the value of {tok}")

    def step(self, guard: str | None, op: str, args: list[str]) -> None:
        base = op.split(".")[0]
        if guard is not None:
            return  # (only the predicated accesses, handled by the caller)
        if base == "ld" and ".param" in op:
            m = re.search(r"_param_(\d+)", args[1])
            if m is None:
                raise UnknownInstruction(op)
            self.regs[args[0]] = np.full(self.n, self.params[int(m.group(1))], _U64)
            return
        if base in ("mov", "cvta") and len(args) == 2:
            self.regs[args[0]] = self.val(args[1])
            return
        if base == "cvt":
            dst, src = op.split(".")[-2:]
            sb = int(src[1:])
            v = _sext(self.val(args[1]), sb) if src[0] == "s" else _wrap(self.val(args[1]), sb)
            self.regs[args[0]] = _wrap(v, int(dst[1:]))
            return
        if base == "setp":
            self.regs[args[0]] = self._compare(op, self.val(args[1]), self.val(args[2])).astype(_U64)
            return
        if base == "selp":
            c = self.val(args[3]) != 0
            self.regs[args[0]] = np.where(c, self.val(args[1]), self.val(args[2]))
            return
        if base in ("not", "neg"):
            bits = _bits(op)
            v = self.val(args[1])
            self.regs[args[0]] = _wrap(~v if base == "not" else (_U64(0) - v), bits)
            return
        self.regs[args[0]] = self._arith(op, [self.val(a) for a in args[1:]])

    def _compare(self, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        cmp, ty = op.split(".")[1], op.split(".")[-1]
        bits = int(ty[1:])
        if ty[0] == "s":
            a, b = _signed(a, bits), _signed(b, bits)
        else:
            a, b = _wrap(a, bits), _wrap(b, bits)
        table = {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b,
                 "lo": a < b, "ls": a <= b, "hi": a > b, "hs": a >= b}
        if cmp not in table:
            raise UnknownInstruction(op)
        return table[cmp]

    def _arith(self, op: str, v: list[np.ndarray]) -> np.ndarray:
        parts = op.split(".")
        base, bits = parts[0], _bits(op)
        signed = parts[-1][0] == "s"
        if "wide" in parts:  # (mul|mad).wide: the full product of two `bits`-bit values, 2 * bits wide
            ext = _sext if signed else _wrap
            prod = ext(v[0], bits) * ext(v[1], bits)
            return _wrap(prod + (v[2] if base == "mad" else _U64(0)), 2 * bits)
        if base in ("add", "sub", "and", "or", "xor", "shl"):
            a, b = v
            out = {"add": lambda: a + b, "sub": lambda: a - b, "and": lambda: a & b, "or": lambda: a | b,
                   "xor": lambda: a ^ b, "shl": lambda: np.where(b < bits, a << np.minimum(b, 63), 0)}[base]()
            return _wrap(out.astype(_U64), bits)
        if base == "shr":
            a, b = v
            sh = np.minimum(b, _U64(bits - 1 if signed else 63)).astype(np.int64)
            if signed:
                return _wrap((_signed(a, bits) >> sh).astype(_U64), bits)
            return np.where(b < bits, _wrap(a, bits) >> sh.astype(_U64), 0).astype(_U64)
        if base in ("mul", "mad") and "lo" in parts:
            out = v[0] * v[1] + (v[2] if base == "mad" else _U64(0))
            return _wrap(out, bits)
        raise UnknownInstruction(op)


def _statements(ptx: str) -> list[str]:
    body = ptx[ptx.index("{", ptx.index(".entry")) + 1:]
    out = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        out.extend(s.strip() for s in line.split(";") if s.strip())
    return out


def ptx_accesses(ptx: str, num_threads: int, ctaid: int, params: list[int], max_steps: int = 100_000) -> list[Access]:
    """Every ``ld.global`` / ``st.global`` the kernel (one entry) executes for threads
    0..num_threads-1 of program ``ctaid`` (x only), in execution order; ``params``: the kernel
    parameters' values in order (a pointer's address). Branches (``bra``, loops included) must be
    uniform across the threads; more than ``max_steps`` statements executed is an
    :class:`UnknownInstruction`."""
    mach = _Machine(num_threads, ctaid, params)
    stmts = _statements(ptx)
    labels = {s[:-1]: i for i, s in enumerate(stmts) if s.endswith(":")}
    out = []
    pc = steps = 0
    with np.errstate(over="ignore"):
        while pc < len(stmts):
            stmt = stmts[pc]
            pc, steps = pc + 1, steps + 1
            if steps > max_steps:
                raise UnknownInstruction(f"more than {max_steps} statements executed")
            m = _INSTR.match(stmt)
            if m is None or stmt.startswith((".", "{", "}")) or stmt.endswith(":"):
                continue
            guard, op, rest = m.group(1), m.group(2), m.group(3)
            if op.split(".")[0] == "bra":
                if _taken(mach, guard, num_threads):
                    pc = labels[rest.strip()]
                continue
            if op == "ret":
                break
            acc = _ACCESS.match(op)
            if acc:
                addr = re.search(r"\[(%rd\d+)(?:\+(-?\d+))?\]", rest)
                if addr is None:
                    raise UnknownInstruction(stmt)
                a = mach.val(addr.group(1)) + _U64(int(addr.group(2) or 0) & 0xFFFFFFFFFFFFFFFF)
                pred = np.ones(num_threads, bool) if guard is None else _predicate(mach, guard)
                nbytes = int(acc.group(2) or 1) * int(acc.group(3)) // 8
                out.append(Access(acc.group(1) == "st", a, pred, nbytes))
                continue
            args = [a.strip() for a in rest.split(",")]
            try:
                if guard is not None:  # (uniform: executed or not; otherwise its result is unknown)
                    p = _predicate(mach, guard)
                    if p.any() != p.all():
                        raise UnknownInstruction(stmt)
                    if not p[0]:
                        continue
                mach.step(None, op, args)
            except UnknownInstruction:
                if args and args[0].startswith("%"):
                    mach.regs.pop(args[0], None)  # (unknown: an access that reads it fails)
    return out


def _predicate(mach: _Machine, guard: str) -> np.ndarray:
    """Per thread, whether ``@%p`` / ``@!%p`` holds."""
    p = mach.val(guard.strip().lstrip("@!")) != 0
    return ~p if guard.startswith("@!") else p


def _taken(mach: _Machine, guard: str | None, num_threads: int) -> bool:
    """Whether a (guarded) ``bra`` branches; the same for every thread, or an UnknownInstruction."""
    if guard is None:
        return True
    p = _predicate(mach, guard)
    if p.any() != p.all():
        raise UnknownInstruction(f"a divergent branch ({guard.strip()}, {num_threads} threads)")
    return bool(p[0])
