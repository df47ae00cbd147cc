"""Test helper: the PTX executor's (tests/backend/ptx_exec.py) global atomics, ``atom.global`` and
``red.global`` on integers: ``add`` / ``min`` / ``max`` / ``and`` / ``or`` / ``xor`` / ``exch`` /
``cas`` (PTX ISA, "Parallel Synchronization and Communication Instructions: atom").

The executor applies an instruction's atomics one thread after another in lane order (programs in
order, threads in order within a program); memory order (``.sem``) and scope change nothing in a
sequential execution. Where the order could change the memory's final value it refuses
(:class:`~.ptx_ops.MemoryFault`): two threads that are not ordered by a barrier of their program
(threads of different programs never are) updating one address with different operations, or with
``exch`` / ``cas`` at all. Concurrent ``add``s (or ``min``s, ...) leave the same final value in any
order; the *old* values they return still depend on the order: a test comparing those must keep the
addresses of unordered threads apart. Float atomics, ``inc`` / ``dec``, generic addresses and
vector forms are unknown (:class:`~.address_eval.UnknownInstruction`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .address_eval import UnknownInstruction
from .ptx_ops import U64, MemoryFault, signed, wrap

_SEMS = {"relaxed", "acquire", "release", "acq_rel"}
_SCOPES = {"cta", "cluster", "gpu", "sys"}
_TYPES = {"add": {"u32", "s32", "u64"}, "min": {"u32", "s32", "u64", "s64"}, "max": {"u32", "s32", "u64", "s64"},
          "and": {"b32", "b64"}, "or": {"b32", "b64"}, "xor": {"b32", "b64"}, "exch": {"b32", "b64"},
          "cas": {"b32", "b64"}}
"""The integer types of each operation in the PTX ISA's ``atom`` (``red`` the same, without ``exch`` / ``cas``)."""
ORDER_FREE = {"add", "min", "max", "and", "or", "xor"}


class GlobalMemory(Protocol):
    """The executor's global memory."""

    def load(self, addr: np.ndarray, nbytes: int) -> np.ndarray: ...

    def store(self, addr: np.ndarray, nbytes: int, value: np.ndarray) -> None: ...


@dataclass(frozen=True)
class Atomic:
    """One parsed atomic instruction: ``atom`` (gives the old value) or ``red``, its operation and type."""

    returns: bool
    op: str
    ty: str

    @property
    def bits(self) -> int:
        return int(self.ty[1:])

    @property
    def operands(self) -> int:
        """The value operands after the address: ``cas`` has two (compare, new)."""
        return 2 if self.op == "cas" else 1


def parse_atomic(op: str) -> Atomic:
    """``atom{.sem}{.scope}.global.<op>.<type>`` or ``red...``; any other form is unknown."""
    parts = op.split(".")
    if len(parts) < 4 or parts[0] not in ("atom", "red"):
        raise UnknownInstruction(op)
    quals, aop, ty = parts[1:-2], parts[-2], parts[-1]
    if "global" not in quals or not set(quals) - {"global"} <= _SEMS | _SCOPES or len(set(quals)) != len(quals):
        raise UnknownInstruction(f"{op} (only integer atomics on .global addresses are known)")
    if ty not in _TYPES.get(aop, ()) or (parts[0] == "red" and aop in ("exch", "cas")):
        raise UnknownInstruction(op)
    return Atomic(parts[0] == "atom", aop, ty)


def _combine(a: Atomic, old: int, v: list[int]) -> int:
    """The value the atomic leaves in memory (``old`` and ``v`` as unsigned ``a.bits``-bit integers)."""
    bits = a.bits
    m = (1 << bits) - 1
    if a.op in ("min", "max"):
        key: Callable[[int], int] = (lambda x: int(signed(np.array([x], U64), bits)[0])) if a.ty[0] == "s" \
            else (lambda x: x)
        pick = min if a.op == "min" else max
        return pick(old, v[0], key=key)
    if a.op == "cas":
        return v[1] if old == v[0] else old
    table = {"add": lambda: old + v[0], "and": lambda: old & v[0], "or": lambda: old | v[0],
             "xor": lambda: old ^ v[0], "exch": lambda: v[0]}
    return table[a.op]() & m


@dataclass
class AtomicLog:
    """Per address, per operation: the programs that updated it, and per program the epoch (barriers
    passed) and the threads of its latest updates."""

    seen: dict[int, dict[str, tuple[set[int], dict[int, tuple[int, set[int]]]]]] = field(default_factory=dict)

    def check(self, addr: int, op: str, program: int, thread: int, epoch: int) -> None:
        """``op``: the operation and type (``add.u32``). Refuse an update whose result depends on its
        order against an earlier one, then record it."""
        ops = self.seen.setdefault(addr, {})
        for other, (programs, current) in ops.items():
            if other == op and op.split(".")[0] in ORDER_FREE:
                continue
            last = current.get(program)
            unordered_here = last is not None and last[0] == epoch and bool(last[1] - {thread})
            if programs - {program} or unordered_here:
                raise MemoryFault(f"atomic {op} and {other} at {addr:#x} by threads no barrier orders: the "
                                  "result depends on their order")
        programs, current = ops.setdefault(op, (set(), {}))
        programs.add(program)
        last = current.get(program)
        current[program] = (epoch, (last[1] if last is not None and last[0] == epoch else set()) | {thread})


def execute_atomic(a: Atomic, memory: GlobalMemory, log: AtomicLog, addr: np.ndarray, values: list[np.ndarray],
                   program: np.ndarray, thread: np.ndarray, epoch: np.ndarray) -> np.ndarray:
    """Apply the atomic of each lane (the arrays: one element per active lane, in lane order) to
    ``memory`` (the executor's global memory: ``load(addr, nbytes)`` / ``store(addr, nbytes, value)``);
    the old values, one per lane."""
    nbytes = a.bits // 8
    old = np.zeros(len(addr), U64)
    for k in range(len(addr)):
        at = addr[k : k + 1]
        log.check(int(at[0]), f"{a.op}.{a.ty}", int(program[k]), int(thread[k]), int(epoch[k]))
        before = int(memory.load(at, nbytes)[0])
        after = _combine(a, before, [int(wrap(v[k : k + 1], a.bits)[0]) for v in values])
        memory.store(at, nbytes, np.array([after], U64))
        old[k] = before
    return old
