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
(a loop runs its iterations). The instructions' values are tests/backend/ptx_ops.py's (which
tests/backend/ptx_exec.py, the evaluator with a memory image, executes too). Instructions it cannot
compute leave their result unknown; an access that reads such a register is an
:class:`UnknownInstruction`.
"""

from __future__ import annotations

import re

import numpy as np

from .address_eval import Access, UnknownInstruction
from .ptx_ops import INSTR, U64, integer_op, statements

_ACCESS = re.compile(r"(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d))?\.[bsuf](\d+)$")


class _Machine:
    def __init__(self, n: int, ctaid: int, params: list[int]) -> None:
        self.n = n
        self.regs: dict[str, np.ndarray] = {}
        self.special = {"%tid.x": np.arange(n, dtype=U64), "%ctaid.x": np.full(n, ctaid, U64),
                        "%ntid.x": np.full(n, n, U64)}
        self.params = [v & 0xFFFFFFFFFFFFFFFF for v in params]

    def val(self, tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in self.regs:
            return self.regs[tok]
        if tok in self.special:
            return self.special[tok]
        lit = re.fullmatch(r"(-?(?:0[xX][0-9a-fA-F]+|\d+))U?", tok)
        if lit:
            return np.full(self.n, int(lit.group(1), 0) & 0xFFFFFFFFFFFFFFFF, U64)
        raise UnknownInstruction(f"the value of {tok}")

    def step(self, guard: str | None, op: str, args: list[str]) -> None:
        base = op.split(".")[0]
        if guard is not None:
            return  # (only the predicated accesses, handled by the caller)
        if base == "ld" and ".param" in op:
            m = re.search(r"_param_(\d+)", args[1])
            if m is None:
                raise UnknownInstruction(op)
            self.regs[args[0]] = np.full(self.n, self.params[int(m.group(1))], U64)
            return
        if base in ("mov", "cvta") and len(args) == 2 and args[1] in self.special:
            self.regs[args[0]] = self.val(args[1])
            return
        self.regs[args[0]] = integer_op(op, [self.val(a) for a in args[1:]], np.ones(self.n, bool))


def ptx_accesses(ptx: str, num_threads: int, ctaid: int, params: list[int], max_steps: int = 100_000) -> list[Access]:
    """Every ``ld.global`` / ``st.global`` the kernel (one entry) executes for threads
    0..num_threads-1 of program ``ctaid`` (x only), in execution order; ``params``: the kernel
    parameters' values in order (a pointer's address). Branches (``bra``, loops included) must be
    uniform across the threads; more than ``max_steps`` statements executed is an
    :class:`UnknownInstruction`."""
    mach = _Machine(num_threads, ctaid, params)
    stmts = statements(ptx)
    labels = {s[:-1]: i for i, s in enumerate(stmts) if s.endswith(":")}
    out = []
    pc = steps = 0
    with np.errstate(over="ignore"):
        while pc < len(stmts):
            stmt = stmts[pc]
            pc, steps = pc + 1, steps + 1
            if steps > max_steps:
                raise UnknownInstruction(f"more than {max_steps} statements executed")
            m = INSTR.match(stmt)
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
                a = mach.val(addr.group(1)) + U64(int(addr.group(2) or 0) & 0xFFFFFFFFFFFFFFFF)
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
