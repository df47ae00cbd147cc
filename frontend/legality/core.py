"""The legality pass: one pass over the typed IR, after layout inference and before any emission,
that decides every hardware rule statically and reports it at the line the user wrote
(docs/diagnostics.md, "The legality pass").

It is **data-driven per target**. An op's rules are part of its definition
(``OpDef.legality``, ``frontend/ops/opdefs.py``); the rule modules of this package register them
into the OpDefs by op name:

* :func:`rule` — ``rule(op, ctx) -> Iterable[Diagnostic]`` for the ops named; a rule may be
  restricted to targets with (or without) a :class:`~sparsile.target.targets.Feature`;
* :func:`require_feature` — the feature an explicit op needs (``hopper.*`` needs wgmma, ``tma.*``
  needs TMA, ...; ``OpDef.required``): a missing feature is ``SP0602`` at the op's span, before
  LLVM or ptxas ever see the instruction (docs/hardware.md §0 items 2 and 9);
* :data:`FUNCTION_RULES` — whole-kernel rules (shared-memory and TMEM capacity, thread and
  register budgets), which belong to no op.

:func:`rules_for` selects the rows that apply to one target; :func:`check_legality` walks the
kernel (each ``warp_specialize`` partition with its own warp count), collects every diagnostic
and raises one :class:`CompileError`.

Each rule either **diagnoses** (a code, the span of the offending expression, what was expected
and what was found, and a ``help:`` line) or documents that sparsile **lifts** the restriction;
``docs/diagnostics.md`` lists both, per condition of JAX Mosaic GPU ("JAX Mosaic GPU's conditions").

Codes of this pass (SP056x-SP058x; the descriptor rules of ``target/descriptors.py`` keep their
own SP050x-SP053x codes, layout pins use SP042x, target gating SP0602):
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...target.hooks import NO_HOOKS, TargetHooks
from ...target.targets import Feature, feature_problem, get_target
from ..diagnostics import Diagnostic, DiagnosticBag, InternalError, coded_error_diagnostic
from ..ir.core import Block, Function, Operation
from ..ops.opdefs import OPS, LegalityRule, OpDef, attach, attach_prefix, features, load_all_ops

# ------------------------------------------------------------------------------------------------
# Codes
# ------------------------------------------------------------------------------------------------
SP_SMEM_SWIZZLE_ROWS = "SP0560"
"""A swizzled shared-memory buffer whose rows do not fill whole swizzle atoms (PTX ISA 5.5.7)."""
SP_SMEM_SLICE_LAST_DIM = "SP0561"
"""``buf.slice`` along the last (contiguous) dimension of a swizzled buffer."""
SP_SMEM_STRIDED_VIEW = "SP0576"
"""A view sliced along its last dimension given to a unit that reads or writes whole rows (TMA, MMA
descriptors, tcgen05.cp)."""
SP_MBARRIER_IN_PARTITION = "SP0562"
"""``mbarrier.alloc`` inside a ``warp_specialize`` partition (the init must be seen by all)."""
SP_WS_WARPS = "SP0563"
"""The partitions of ``warp_specialize`` do not add up to the kernel's ``num_warps``."""
SP_WS_NESTED = "SP0564"
"""``warp_specialize`` inside a partition."""
SP_WS_WARPGROUPS = "SP0565"
"""A partition with a ``setmaxnreg`` budget that is not whole warpgroups (PTX ISA 9.7.17.1)."""
SP_ARRIVE_PER_WARPGROUP = "SP0566"
"""``mbarrier.arrive(per="warpgroup")`` in a partition that is not whole warpgroups."""
SP_WGMMA_UNSWIZZLED = "SP0567"
"""A wgmma operand buffer without a swizzle (sparsile's descriptors need 32/64/128 B)."""
SP_WGMMA_TILING = "SP0568"
"""A K-major wgmma operand whose swizzle row is narrower than one instruction's K bytes
(JAX's "B tiling too small": sparse B reads 64 bytes of K per instruction)."""
SP_WGMMA_MN_MAJOR = "SP0569"
"""An MN-major B for wgmma (legal for 16-bit types; not implemented by sparsile's lowering)."""
SP_WGMMA_F16_ACC = "SP0570"
"""An f16 wgmma accumulator (legal PTX; not implemented by sparsile's lowering)."""
SP_WGMMA_SHAPE = "SP0571"
"""A wgmma accumulator that does not split into m64 instructions per warpgroup of the partition."""
SP_SMEM_CAPACITY = "SP0572"
"""More shared memory than the target lets one CTA use (explicit buffers plus compiler scratch)."""
SP_TMA_BOX = "SP0573"
"""A TMA box the tensor map cannot describe (docs/hardware.md §5.4)."""
SP_META_WIDTH = "SP0574"
"""Sparse metadata declared (``meta[T]``) or allocated for one operand width used with another."""
SP_TMEM_CAPACITY = "SP0575"
"""More TMEM columns than a CTA has (512; allocations are packed into one power of two)."""
SP_TMEM_LANES = "SP0550"
"""A TMEM access outside the lanes the accessing warp may touch (warp w%4: lanes 32(w%4)..+31):
``tcgen05.ld``/``st`` need a partition of whole warpgroups starting at a warpgroup boundary (the
code of the same check in ``backend/lower_blackwell``, which now only guards)."""
SP_FP8_CONVERSION = "SP0577"
"""Arithmetic, math, comparisons, reductions or conversions of e4m3 / e5m2 values on a target below
sm_89: each needs ``cvt`` with .e4m3x2 / .e5m2x2, which ptxas accepts only from sm_89 on."""
SP_THREADS = "SP0580"
"""More threads per CTA than the target allows (1024)."""
SP_REGISTERS = "SP0581"
"""``setmaxnreg`` budgets that need more registers than an SM has."""

ALL_CODES: dict[str, str] = {
    code: name for name, code in dict(globals()).items() if name.startswith("SP_") and isinstance(code, str)
}
"""Every code of the legality pass, mapped to its constant's name (for docs and tests)."""


# ------------------------------------------------------------------------------------------------
# Context and tables
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Context:
    """Where a rule runs: the target, the warps of the current partition (the whole CTA outside
    ``warp_specialize``), the CTA's warps, the partition index (-1 outside), the kernel, and the
    CTA warp the partition starts at (partitions take consecutive warps in order)."""

    target: Any  # target.targets.Target
    num_warps: int
    total_warps: int
    partition: int
    func: Function
    first_warp: int = 0
    hooks: TargetHooks = NO_HOOKS  # the target lowering's layout anchor (backend/lower/hooks.py picks it)

    @property
    def in_partition(self) -> bool:
        return self.partition >= 0


Rule = Callable[[Operation, Context], Iterable[Diagnostic]]
FunctionRule = Callable[[Function, Context], Iterable[Diagnostic]]


RuleEntry = LegalityRule
"""One rule with the targets it applies to (``frontend/ops/opdefs.py``)."""

FUNCTION_RULES: list[RuleEntry] = []
"""Whole-kernel rules."""


def rule(*names: str, needs: Iterable[str] = (), unless: Iterable[str] = ()) -> Callable[[Rule], Rule]:
    """Register ``fn(op, ctx)`` as a rule of the ops ``names`` (into their OpDefs); ``needs`` /
    ``unless`` name :class:`Feature` members that select the targets it applies to."""

    def deco(fn: Rule) -> Rule:
        entry = RuleEntry(fn, features(needs), features(unless))
        for n in names:
            attach(n, lambda d, entry=entry: d.add_legality(entry))  # type: ignore[misc]
        return fn

    return deco


def function_rule(*, needs: Iterable[str] = (), unless: Iterable[str] = ()) -> Callable[[FunctionRule], FunctionRule]:
    """Register ``fn(func, ctx)`` as a whole-kernel rule."""

    def deco(fn: FunctionRule) -> FunctionRule:
        FUNCTION_RULES.append(RuleEntry(fn, features(needs), features(unless)))
        return fn

    return deco


def require_feature(feature: str, what: str, *names: str) -> None:
    """Explicit ops ``names`` (or name prefixes ending in ``.``) need ``feature`` (a Feature member
    name) on the target; ``what`` names the op in the message (``{op}`` is its IR name)."""

    def need(d: OpDef) -> None:
        d.require(feature, what)

    for n in names:
        if n.endswith("."):
            attach_prefix(n, need)
        else:
            attach(n, need)


@dataclass(frozen=True)
class TargetRules:
    """The rows of the tables that apply to one target."""

    op_rules: dict[str, tuple[Rule, ...]]
    function_rules: tuple[FunctionRule, ...]
    required: dict[str, tuple[Any, str]] = field(default_factory=dict)


def _rules_for_name(target_name: str) -> TargetRules:
    load_all_ops()
    load_rule_modules()
    target = get_target(target_name)
    ops = {name: tuple(e.rule for e in d.legality if e.applies(target))
           for name, d in OPS.items() if isinstance(d.legality, list)}
    funcs = tuple(e.rule for e in FUNCTION_RULES if e.applies(target))  # type: ignore[misc]
    required = {name: (Feature[d.required[0]], d.required[1]) for name, d in OPS.items() if d.required is not None}
    return TargetRules({k: v for k, v in ops.items() if v}, funcs, required)  # type: ignore[arg-type]


def rules_for(target: Any) -> TargetRules:
    """The legality table of ``target`` (a Target or a name), read from the OpDefs when called (a
    rule attached later, such as a test's op, is seen by the next call)."""
    name = target if isinstance(target, str) else target.name
    return _rules_for_name(name)


def load_rule_modules() -> None:
    """Import the rule modules, which register their rules into the OpDefs."""
    from . import cluster, fp8, grid_dependency, layout, memory, meta, mma, tmem, wgmma_inflight  # noqa: F401


# ------------------------------------------------------------------------------------------------
# The pass
# ------------------------------------------------------------------------------------------------
def check_legality(func: Function, target: Any, num_warps: int, hooks: TargetHooks = NO_HOOKS) -> None:
    """Run every rule of ``target`` over ``func`` (after layout inference with ``hooks.anchor``);
    raise one :class:`CompileError` listing all the errors found, in source order."""
    diags = legality_diagnostics(func, target, num_warps, hooks)
    bag = DiagnosticBag()
    bag.extend(sorted(diags, key=_source_order))
    bag.raise_if_errors()


def legality_diagnostics(func: Function, target: Any, num_warps: int,
                         hooks: TargetHooks = NO_HOOKS) -> list[Diagnostic]:
    """Every diagnostic the legality rules of ``target`` find in ``func`` (pinned layouts are
    resolved first, see :mod:`legality_layout`)."""
    from .layout import resolve_pins

    load_all_ops()
    tgt = get_target(target) if isinstance(target, str) else target
    table = rules_for(tgt)
    ctx = Context(tgt, num_warps, num_warps, -1, func, hooks=hooks)
    out: list[Diagnostic] = list(resolve_pins(func, ctx))
    for op, op_ctx in walk_with_context(func.body.block, ctx):
        out.extend(_gate(op, op_ctx, table))
        for r in table.op_rules.get(op.name, ()):
            out.extend(_run(r, op, op_ctx))
    for fr in table.function_rules:
        out.extend(_run(fr, func, ctx))
    return out


def walk_with_context(block: Block, ctx: Context) -> Iterator[tuple[Operation, Context]]:
    """Every op of ``block`` (nested regions included) with the context it runs in: the regions
    of ``warp_specialize`` run on their own warps."""
    for op in block.ops:
        yield op, ctx
        if op.name == "warp_specialize":
            first = ctx.first_warp
            for i, (region, w) in enumerate(zip(op.regions, op.attrs.get("warps", ()), strict=False)):
                inner = Context(ctx.target, w, ctx.total_warps, i, ctx.func, first, ctx.hooks)
                yield from walk_with_context(region.block, inner)
                first += w
        else:
            for region in op.regions:
                yield from walk_with_context(region.block, ctx)


def _gate(op: Operation, ctx: Context, table: TargetRules) -> list[Diagnostic]:
    need = table.required.get(op.name)
    if need is None:
        return []

    feature, what = need
    d = feature_problem(ctx.target, feature, op.span, what=what.format(op=op.name))
    return [d] if d is not None else []


def _run(fn: Callable[..., Iterable[Diagnostic]], subject: Any, ctx: Context) -> list[Diagnostic]:
    try:
        return list(fn(subject, ctx) or ())
    except InternalError:
        raise
    except Exception as e:  # a crashing rule is a compiler bug, reported with its span
        span = getattr(subject, "span", None)
        located = coded_error_diagnostic(e, span) if span is not None else None
        if located is not None:  # a LayoutError / SparsityError of the op's operands: the user's error
            return [located]
        raise InternalError(f"legality rule {getattr(fn, '__name__', fn)} failed: {type(e).__name__}: {e}",
                            span) from e


def _source_order(d: Diagnostic) -> tuple[int, int]:
    return (d.span.line, d.span.col)
