"""The op registry: one :class:`OpDef` per IR op name.

An op is defined in one place. Its module registers the OpDef next to the language builtin(s) that
create it, with the names of its operands (``op_def(name).operand(op, "acc")``, not
``op.operands[3]``) and its rules:

* ``verify`` (typing rule, run by the IR verifier),
* ``interpret`` (numpy semantics, run by the interpreter),
* ``layout`` (how layout inference propagates layouts through it),
* ``legality`` (its per-target checks, run by the legality pass),
* ``lower`` (its LLVM lowering: ``lower(cg, op)``, run by ``backend/lower/codegen.py``).

The passes consult these hooks, so a new op needs no edit anywhere else (docs/architecture.md shows
a toy op defined in one place, tests/test_toy_op.py). The ops that predate the hooks still keep
their layout rules inside ``frontend/layout/inference.py``, their legality in
``frontend/legality/`` and their lowering in ``backend/lower/`` tables keyed by the op name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..diagnostics import InternalError
from ..ir.core import Operation, Value

LayoutGet = Callable[[Value], Any]
"""A layout inference's view of the layouts chosen so far: the value's layout or None."""
LayoutSet = Callable[[Value, Any], bool]
"""Give a value a layout if it has none yet; True when that changed something."""


class OpDef:
    """What an IR op means. Hooks are attached with the decorator methods::

        axpb = define_op("toy.axpb", operands=("x",))

        @axpb.interpreter
        def _interp(ctx, op, args): ...           # -> list of result values

        @axpb.layout_rule
        def _layout(op, get, set) -> bool: ...    # propagate layouts; True when one was set

        @axpb.legality_rule
        def _legal(op, ctx): ...                  # -> iterable of Diagnostic (ctx.target, ...)

        @axpb.lowering_rule
        def _lower(cg, op): ...                   # cg: backend/lower/codegen.py CodeGen
    """

    __slots__ = ("doc", "interpret", "layout", "legality", "lower", "name", "operands", "side_effects",
                 "terminator", "verify")

    def __init__(self, name: str, *, side_effects: bool = False, terminator: bool = False, doc: str = "",
                 operands: tuple[str, ...] = ()):
        self.name = name
        self.side_effects = side_effects
        self.terminator = terminator
        self.doc = doc
        self.operands = operands
        self.verify: Callable[[Operation], str | None] | None = None
        self.interpret: Callable[..., Any] | None = None
        self.layout: Callable[[Operation, LayoutGet, LayoutSet], bool] | None = None
        self.legality: Callable[..., Any] | None = None
        self.lower: Callable[[Any, Operation], None] | None = None

    def operand(self, op: Operation, name: str) -> Value:
        """The operand of ``op`` named ``name`` (one of :attr:`operands`)."""
        try:
            return op.operands[self.operands.index(name)]
        except ValueError:
            raise InternalError(f"`{self.name}` has no operand named {name!r} (it has {self.operands})") from None

    def verifier(self, fn: Callable[[Operation], str | None]) -> Callable[[Operation], str | None]:
        self.verify = fn
        return fn

    def interpreter(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.interpret = fn
        return fn

    def layout_rule(self, fn: Callable[[Operation, LayoutGet, LayoutSet], bool]
                    ) -> Callable[[Operation, LayoutGet, LayoutSet], bool]:
        self.layout = fn
        return fn

    def legality_rule(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.legality = fn
        return fn

    def lowering_rule(self, fn: Callable[[Any, Operation], None]) -> Callable[[Any, Operation], None]:
        self.lower = fn
        return fn

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


OPS: dict[str, OpDef] = {}


def define_op(name: str, *, side_effects: bool = False, terminator: bool = False, doc: str = "",
              operands: tuple[str, ...] = ()) -> OpDef:
    """Register a new IR op; its hooks are attached with the OpDef's decorators."""
    if name in OPS:
        raise InternalError(f"op {name!r} defined twice")
    d = OpDef(name, side_effects=side_effects, terminator=terminator, doc=doc, operands=operands)
    OPS[name] = d
    return d


def op_def(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise InternalError(f"unknown IR op {name!r}") from None


def load_all_ops() -> None:
    """Import every op module so that the registry is complete."""
    import importlib.util

    for name in ("..sema.type_ctors", ".core", ".control", ".dot", ".tensor", ".memory", ".layout",
                 ".hopper", ".blackwell", "..interp.blackwell", ".cluster"):
        try:
            importlib.import_module(name, __package__)
        except ModuleNotFoundError as e:  # an architecture namespace not written yet
            if e.name != importlib.util.resolve_name(name, __package__):
                raise
