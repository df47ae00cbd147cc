"""Registers emitted at their first use: how an epilogue's broadcast vectors stay out of the
register file until the accumulator register they scale is consumed.

The code generator emits an op's registers in IR order, all of an op before the next op. For an
epilogue such as ``y = acc * load(SX + tok)[None, :]`` that order loads every register of the
per-token vector first: 64 values per thread for a 128 x 256 wgmma accumulator, live next to its
128 accumulator registers, under the 168 registers of a 9-warp CTA (docs/hopper.md). ptxas spills
rather than sink the loads.

A load whose registers repeat elements (a broadcast register basis, docs/layouts.md) is therefore
*deferred*: its registers are :class:`Deferred` values, emitted when first read, and the pure
register ops that consume them (elementwise arithmetic, casts, math, broadcasts, expand_dims,
reshapes) defer their own registers too. Before any other op, and at the end of every block, the
code generator forces what is pending (:meth:`Pending.force`), the latest tile first and register
by register, so that register r's chain (its load, multiply, add, activation) is emitted before
register r + 1's. (A load or a pure register op with no deferred operand does not force: moving
loads and pure ops past another load is safe.) Only loads and pure register ops move, and only
later, past other loads and pure ops: never past a store, an atomic, a barrier, an asynchronous op
or a block boundary, so the program's memory order is the one it wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, SupportsIndex, overload

from .llvm_text import LLValue

DEFERRABLE_OPS = frozenset({
    "arith.binary", "arith.cmp", "arith.unary", "arith.select", "arith.cast", "math", "addptr",
    "broadcast", "expand_dims", "reshape", "permute",
})
"""Ops whose registers are deferred when one of their operands' are: each register is a pure
function of the same register of its operands (or, for broadcasts and reshapes, is one of them)."""

NEUTRAL_OPS = frozenset({"arith.constant", "splat"})
"""Ops that emit no instruction (a constant, a scalar's value in every register): what is pending
stays pending across them (``y * v + 1.0`` defers the add as it does the multiply)."""


class Deferred:
    """One register's value, emitted by ``emit`` when first read (:meth:`force`). ``deps``: the
    values ``emit`` reads, forced before it (left to right) without recursion, so that a chain of
    any length (``for i in static_range(1000): y = y * w + 1.0``) stays within Python's stack."""

    __slots__ = ("_deps", "_emit", "_value")

    def __init__(self, emit: Callable[[], LLValue], deps: Sequence[Any] = ()):
        self._emit: Callable[[], LLValue] | None = emit
        self._deps: Sequence[Any] = deps
        self._value: LLValue | None = None

    def force(self) -> LLValue:
        stack = [self]
        while stack:
            d = stack[-1]
            if d._value is not None:
                stack.pop()
                continue
            waiting = [x for x in d._deps if isinstance(x, Deferred) and x._value is None]
            if waiting:
                stack.extend(reversed(waiting))  # the first operand is emitted first
                continue
            assert d._emit is not None
            d._value = d._emit()
            d._emit, d._deps = None, ()
            stack.pop()
        assert self._value is not None
        return self._value


def value_of(x: Any) -> Any:
    """``x`` itself, or the value of a :class:`Deferred` (emitted now if it was not yet)."""
    return x.force() if isinstance(x, Deferred) else x


class DeferredRegs(list):
    """A tile's registers, some of them :class:`Deferred`: reading one (index, iteration, slice)
    emits it, and the list keeps the value. :meth:`raw` reads without emitting."""

    def raw(self) -> list[Any]:
        return list.copy(self)

    def settled(self) -> bool:
        return not any(isinstance(x, Deferred) for x in list.__iter__(self))

    @overload
    def __getitem__(self, i: SupportsIndex) -> LLValue: ...
    @overload
    def __getitem__(self, i: slice) -> list[LLValue]: ...
    def __getitem__(self, i: SupportsIndex | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        x = list.__getitem__(self, i)
        if isinstance(x, Deferred):
            x = x.force()
            list.__setitem__(self, i, x)
        return x

    def __iter__(self) -> Iterator[LLValue]:
        for j in range(len(self)):
            yield self[j]

    def force_all(self) -> None:
        for j in range(len(self)):
            self[j]


def raw_regs(regs: Sequence[Any]) -> list[Any]:
    """The registers of a tile as stored: :class:`Deferred` ones not emitted."""
    return regs.raw() if isinstance(regs, DeferredRegs) else list(regs)


def is_deferred(regs: Sequence[Any]) -> bool:
    """Whether some of a tile's registers are not emitted yet."""
    return isinstance(regs, DeferredRegs) and not regs.settled()


class Pending:
    """The deferred tiles of the code generator, in creation order."""

    def __init__(self) -> None:
        self.tiles: list[DeferredRegs] = []

    def add(self, values: list[Any]) -> DeferredRegs:
        regs = DeferredRegs(values)
        self.tiles.append(regs)
        return regs

    def force(self) -> None:
        """Emit every deferred register: the latest tile first (its registers pull their
        operands' in), register by register."""
        tiles, self.tiles = self.tiles, []
        for regs in reversed(tiles):
            regs.force_all()
