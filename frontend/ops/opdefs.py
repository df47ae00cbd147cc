"""The op registry: one :class:`OpDef` per IR op name, and every part of the op reached through it.

An op is defined in one place: its module calls :func:`define_op` next to the language builtin(s)
that create it, with the names of its operands (``op.operand("acc")``, not ``op.operands[3]``) and
its parts. Each pass finds its part in the OpDef, and in no other table:

* ``verify`` — the typing rule run by the IR verifier (most ops are typed where their builtin emits
  them, in ``frontend/sema``: their ``verify`` is an explicit :func:`none` saying so);
* ``interpret`` — the numpy semantics run by ``frontend/interp``;
* ``layout`` — a :class:`LayoutRule`: how layout inference propagates layouts through the op and
  which conversions it needs on its edges (``frontend/layout/rules.py`` holds the shared ones);
* ``legality`` — its per-target rules (:class:`LegalityRule`, each restricted to targets with or
  without a :class:`~sparsile.target.targets.Feature`) and the feature the op needs at all;
* ``lowerings`` — its per-target LLVM lowerings (``lower(cg, op)``, tried in order, the first whose
  ``when(cg)`` holds; a generic one last).

A part the op does not have is an explicit :func:`none` with the reason (``sparsile ops`` lists
every op with its parts; ``tests/test_opdefs.py`` fails on a part that is neither set nor ``none``).

Legality rules and lowerings may be registered **by op name** from the module that holds them
(:func:`attach`): the frontend may not import the backend (docs/architecture.md), so
``backend/lower`` registers its lowerings into the OpDefs when it is imported, and the rule
modules of ``frontend/legality`` register theirs (a registration for an op not defined yet waits
for :func:`define_op`). ``require_feature`` of a name prefix (``tcgen05.``) reaches every op with
that prefix (:func:`attach_prefix`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ...target.targets import Feature
from ..diagnostics import InternalError
from ..ir.core import OPERAND_NAMES, Operation, Value

LayoutGet = Callable[[Value], Any]
"""A layout inference's view of the layouts chosen so far: the value's layout or None."""
LayoutSet = Callable[[Value, Any], bool]
"""Give a value a layout if it has none yet; True when that changed something."""
OperandNames = tuple[str, ...] | Callable[[Operation], tuple[str, ...]]
"""The names of an op's operands, in order; a function of the op when optional operands depend on
its attributes (``hopper.wgmma`` has ``a_meta`` only when ``sparse``)."""


def variadic(head: tuple[str, ...], rest: str, tail: tuple[str, ...] = ()) -> Callable[[Operation], tuple[str, ...]]:
    """Operand names ``head``, then ``rest0, rest1, ...`` for the operands between, then ``tail``
    (``tma.load``: ``tensor, offset0, ..., dst, bar``)."""

    def names(op: Operation) -> tuple[str, ...]:
        n = len(op.operands) - len(head) - len(tail)
        return head + tuple(f"{rest}{i}" for i in range(max(0, n))) + tail

    names.__doc__ = ", ".join([*head, f"{rest}0, ...", *tail])
    return names


def flagged(head: tuple[str, ...], *optional: tuple[str, str]) -> Callable[[Operation], tuple[str, ...]]:
    """Operand names ``head``, then each ``(name, attr)`` of ``optional`` whose attribute is true
    (``load``: ``ptr``, then ``mask`` with ``has_mask``, ``other`` with ``has_other``)."""

    def names(op: Operation) -> tuple[str, ...]:
        return head + tuple(name for name, attr in optional if op.attrs.get(attr))

    names.__doc__ = ", ".join([*head, *(f"{name} (when {attr})" for name, attr in optional)])
    return names


@dataclass(frozen=True)
class NoPart:
    """An explicit "this op has no such part", with the reason (shown by ``sparsile ops``)."""

    why: str

    def __bool__(self) -> bool:
        return False


def none(why: str) -> NoPart:
    """Declare that an op has no part of some kind, and why."""
    return NoPart(why)


class LayoutResolver(Protocol):
    """What layout inference offers a layout rule when it fixes the op's edges (after every value
    has a layout): conversions on an operand or on the result, and the target's anchors."""

    def convert_operand(self, op: Operation, index: int, layout: Any) -> None: ...

    def convert_result(self, op: Operation, layout: Any) -> None: ...

    def anchored(self, op: Operation) -> dict[int, Any]: ...


@dataclass(frozen=True)
class LayoutRule:
    """How layout inference treats an op: ``propagate(op, get, set) -> bool`` spreads layouts
    through it (True when one was set); ``resolve(op, resolver)`` inserts the conversions its
    operands need once every value has a layout (None: none needed)."""

    name: str
    propagate: Callable[[Operation, LayoutGet, LayoutSet], bool]
    resolve: Callable[[Operation, LayoutResolver], None] | None = None


@dataclass(frozen=True)
class LegalityRule:
    """One legality rule ``rule(op, ctx) -> Iterable[Diagnostic]``: it applies to targets that have
    every feature of ``needs`` and none of ``unless``."""

    rule: Callable[..., Any]
    needs: frozenset[Any] = frozenset()
    unless: frozenset[Any] = frozenset()

    def applies(self, target: Any) -> bool:
        return all(target.has(f) for f in self.needs) and not any(target.has(f) for f in self.unless)


@dataclass(frozen=True)
class Lowering:
    """One lowering ``fn(cg, op)``; ``when(cg)`` restricts it to some targets (None: generic)."""

    fn: Callable[[Any, Operation], None]
    when: Callable[[Any], bool] | None = None


class OpDef:
    """What an IR op means. Parts are given to :func:`define_op` or attached with the decorator
    methods::

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

    __slots__ = ("doc", "interpret", "layout", "legality", "lowerings", "name", "operands", "required",
                 "side_effects", "terminator", "verify")

    def __init__(self, name: str, *, side_effects: bool = False, terminator: bool = False, doc: str = "",
                 operands: OperandNames = ()):
        self.name = name
        self.side_effects = side_effects
        self.terminator = terminator
        self.doc = doc
        self.operands = operands
        self.verify: Callable[[Operation], str | None] | NoPart | None = None
        self.interpret: Callable[..., Any] | NoPart | None = None
        self.layout: LayoutRule | NoPart | None = None
        self.legality: list[LegalityRule] | NoPart | None = None
        self.required: tuple[Any, str] | None = None  # (Feature member name, how the user wrote the op)
        self.lowerings: list[Lowering] | NoPart | None = None

    # ------------------------------------------------------------------------------ operands
    def operand_names(self, op: Operation) -> tuple[str, ...]:
        """The names of ``op``'s operands, in order."""
        return self.operands(op) if callable(self.operands) else self.operands

    def operand_index(self, op: Operation, name: str) -> int:
        names = self.operand_names(op)
        try:
            return names.index(name)
        except ValueError:
            raise InternalError(f"`{self.name}` has no operand named {name!r} (it has {names})") from None

    def operand(self, op: Operation, name: str) -> Value:
        """The operand of ``op`` named ``name``."""
        return op.operands[self.operand_index(op, name)]

    def has_operand(self, op: Operation, name: str) -> bool:
        return name in self.operand_names(op)

    # ------------------------------------------------------------------------------ parts
    def verifier(self, fn: Callable[[Operation], str | None]) -> Callable[[Operation], str | None]:
        self.verify = fn
        return fn

    def interpreter(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.interpret = fn
        return fn

    def layout_rule(self, fn: Callable[[Operation, LayoutGet, LayoutSet], bool]
                    ) -> Callable[[Operation, LayoutGet, LayoutSet], bool]:
        """Attach a propagation-only layout rule (no conversions on the op's edges)."""
        self.layout = LayoutRule(getattr(fn, "__name__", "layout"), fn)
        return fn

    def legality_rule(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Attach a legality rule that applies on every target."""
        self.add_legality(LegalityRule(fn))
        return fn

    def _entries(self, slot: str, what: str) -> list[Any]:
        """The list of part ``slot`` (``legality`` or ``lowerings``), created on first use; an
        internal error where the op declared that part none."""
        value = getattr(self, slot)
        if isinstance(value, NoPart):
            raise InternalError(f"`{self.name}` declares no {what} ({value.why}) but one is added")
        if value is None:
            value = []
            setattr(self, slot, value)
        return value

    def add_legality(self, entry: LegalityRule) -> None:
        self._entries("legality", "legality rule").append(entry)

    def require(self, feature: str, what: str) -> None:
        """The op needs ``feature`` (a Feature member name) on the target; ``what`` names it."""
        self._entries("legality", "legality rule")
        self.required = (feature, what)

    def lowering_rule(self, fn: Callable[[Any, Operation], None]) -> Callable[[Any, Operation], None]:
        """Attach the generic lowering."""
        self.add_lowering(Lowering(fn))
        return fn

    def add_lowering(self, lowering: Lowering) -> None:
        self._entries("lowerings", "lowering").append(lowering)

    def lowering_for(self, cg: Any) -> Callable[[Any, Operation], None] | None:
        """The lowering for the target of ``cg``: the first target-specific one whose ``when``
        holds, else the generic one (the last registered), else None."""
        entries = self.lowerings if isinstance(self.lowerings, list) else []
        for e in entries:
            if e.when is not None and e.when(cg):
                return e.fn
        generic = [e.fn for e in entries if e.when is None]
        return generic[-1] if generic else None

    def parts(self) -> dict[str, Any]:
        """Each part by name (a value, a :class:`NoPart`, or None when undeclared)."""
        return {"type": self.verify, "interpret": self.interpret, "layout": self.layout,
                "legality": self.legality, "lower": self.lowerings}

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


TYPED_BY_SEMA = none("typed where sema emits it: its builtin checks the operands and gives the result type "
                     "(frontend/sema, frontend/ops)")
"""The typing rule of an op whose builtin types it (the IR verifier has nothing left to check)."""
RUN_BY_REGION_WALK = none("run by the interpreter's walk of regions (frontend/interp/interpreter.py)")
NO_LAYOUT_RULE = none("moves no layout between its values: its tiles, if any, take an anchor (memory accesses, "
                      "the target's MMA layouts) or the default layout")
NO_LEGALITY = none("no rule of its own: legal on every target (the whole-kernel budgets still count it)")

PARTS = ("type", "interpret", "layout", "legality", "lower")
"""The parts every op has or declares :func:`none` (``sparsile ops``, tests/test_opdefs.py)."""

OPS: dict[str, OpDef] = {}
_PENDING: dict[str, list[Callable[[OpDef], None]]] = {}
_PREFIXED: list[tuple[str, Callable[[OpDef], None]]] = []


def define_op(name: str, *, side_effects: bool = False, terminator: bool = False, doc: str = "",
              operands: OperandNames = (), verify: Callable[[Operation], str | None] | NoPart | None = None,
              interpret: Callable[..., Any] | NoPart | None = None, layout: LayoutRule | NoPart | None = None,
              legality: NoPart | None = None, lower: NoPart | None = None) -> OpDef:
    """Register a new IR op with the parts known where it is defined (the others are attached with
    the OpDef's decorators, or by name with :func:`attach`)."""
    if name in OPS:
        raise InternalError(f"op {name!r} defined twice")
    d = OpDef(name, side_effects=side_effects, terminator=terminator, doc=doc, operands=operands)
    d.verify, d.interpret, d.layout, d.legality, d.lowerings = verify, interpret, layout, legality, lower
    OPS[name] = d
    OPERAND_NAMES[name] = d.operand_names
    for fn in _PENDING.pop(name, ()):
        fn(d)
    for prefix, fn in _PREFIXED:
        if name.startswith(prefix):
            fn(d)
    return d


def undefine_op(name: str) -> None:
    """Remove an op (a test's temporary op)."""
    OPS.pop(name, None)
    OPERAND_NAMES.pop(name, None)


def attach(name: str, fn: Callable[[OpDef], None]) -> None:
    """Apply ``fn`` to the OpDef of ``name`` now, or when it is defined (registration by name from
    the module that holds a part: legality rule modules, backend lowering modules)."""
    if name in OPS:
        fn(OPS[name])
    else:
        _PENDING.setdefault(name, []).append(fn)


def attach_prefix(prefix: str, fn: Callable[[OpDef], None]) -> None:
    """Apply ``fn`` to every op whose name starts with ``prefix`` (ends in ``.``), now and later."""
    _PREFIXED.append((prefix, fn))
    for name, d in OPS.items():
        if name.startswith(prefix):
            fn(d)


def pending_names() -> list[str]:
    """Names that parts were registered for but that no op defines (a typo or a dead part)."""
    return sorted(_PENDING)


def op_def(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise InternalError(f"unknown IR op {name!r}") from None


def features(names: Iterable[str]) -> frozenset[Any]:
    """Feature members by name."""
    return frozenset(Feature[n] for n in names)


def load_all_ops() -> None:
    """Import every op module so that the registry is complete."""
    import importlib.util

    for name in ("..sema.type_ctors", ".core", ".global_memory", ".control", ".dot", ".tensor", ".memory",
                 ".memory_interp", ".layout", ".hopper", ".blackwell", ".tmem", ".tcgen05", "..interp.blackwell",
                 ".cluster", ".atomic", ".grid_dependency"):
        try:
            importlib.import_module(name, __package__)
        except ModuleNotFoundError as e:  # an architecture namespace not written yet
            if e.name != importlib.util.resolve_name(name, __package__):
                raise
