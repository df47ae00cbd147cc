"""The op registry: one :class:`OpDef` per IR op name.

An op is defined in one place. Its module (``ops_*.py``) registers the OpDef with its typing rule
(``verify``), interpreter semantics (``interpret``), layout rule (``layout``) and legality rule
(``legality``), next to the language builtin(s) that create it. Backends register their lowering by
the same name in their own tables; nothing else needs editing to add an op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..diagnostics import InternalError
from ..ir.core import Operation


class OpDef:
    """What an IR op means. Hooks are attached with the decorator methods::

        load = define_op("tile.load", side_effects=False)

        @load.interpreter
        def _interp(ctx, op, args): ...
    """

    __slots__ = ("doc", "interpret", "layout", "legality", "name", "side_effects", "terminator", "verify")

    def __init__(self, name: str, *, side_effects: bool = False, terminator: bool = False, doc: str = ""):
        self.name = name
        self.side_effects = side_effects
        self.terminator = terminator
        self.doc = doc
        self.verify: Callable[[Operation], str | None] | None = None
        self.interpret: Callable[..., Any] | None = None
        self.layout: Callable[..., Any] | None = None
        self.legality: Callable[..., Any] | None = None

    def verifier(self, fn: Callable[[Operation], str | None]) -> Callable[[Operation], str | None]:
        self.verify = fn
        return fn

    def interpreter(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.interpret = fn
        return fn

    def layout_rule(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.layout = fn
        return fn

    def legality_rule(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.legality = fn
        return fn

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


OPS: dict[str, OpDef] = {}


def define_op(name: str, *, side_effects: bool = False, terminator: bool = False, doc: str = "") -> OpDef:
    if name in OPS:
        raise InternalError(f"op {name!r} defined twice")
    d = OpDef(name, side_effects=side_effects, terminator=terminator, doc=doc)
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
