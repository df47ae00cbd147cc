"""The op registry as a table (``sparsile ops``): every IR op, the targets that can compile it, and
each part of its definition (``frontend/ops/opdefs.py``) or the explicit "none" it declares.

It lives in the driver because it loads every part, the backend's lowerings included (the frontend
may not import the backend, docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backend.lower.codegen import load_all_lowerings
from ..frontend.legality.core import load_rule_modules
from ..frontend.ops.opdefs import OPS, PARTS, LayoutRule, NoPart, OpDef, load_all_ops
from ..target.targets import TARGETS, Feature, Target


@dataclass(frozen=True)
class _TargetView:
    """What a lowering's ``when(cg)`` condition reads of the code generator: its target."""

    target: Target


@dataclass(frozen=True)
class OpRow:
    """One op: the targets it compiles for and a short description of each part (``None`` where
    the op declares none, with the reason in ``why``)."""

    name: str
    operands: str
    targets: tuple[str, ...]
    parts: dict[str, str | None]
    why: dict[str, str]


def load_registry() -> dict[str, OpDef]:
    """Every op with every part attached (op modules, legality rule modules, lowering modules)."""
    load_all_ops()
    load_rule_modules()
    load_all_lowerings()
    return OPS


def compiles_for(d: OpDef, target: Target) -> bool:
    """Whether ``target`` has the feature the op needs and a lowering of it (an op lowered by its
    enclosing op, such as ``scf.yield``, compiles wherever that one does)."""
    if d.required is not None and not target.has(Feature[d.required[0]]):
        return False
    if isinstance(d.lowerings, NoPart):
        return True
    return d.lowering_for(_TargetView(target)) is not None


def _describe(part: str, value: Any) -> str:
    if part == "layout" and isinstance(value, LayoutRule):
        return value.name
    if part == "legality" and isinstance(value, list):
        return f"{len(value)} rule{'s' * (len(value) != 1)}"
    if part == "lower" and isinstance(value, list):
        specific = sum(e.when is not None for e in value)
        generic = len(value) - specific
        return " + ".join(x for x in ("generic" * (generic > 0), f"{specific} per target" * (specific > 0)) if x)
    return getattr(value, "__qualname__", "yes")


def _operand_names(d: OpDef) -> str:
    """The op's operand names as one line: the tuple it declares, or the docstring of the function
    that names them from the op (its markup dropped, its lines joined)."""
    if isinstance(d.operands, tuple):
        return ", ".join(d.operands)
    return " ".join((d.operands.__doc__ or "").split()).replace("``", "")


def op_rows() -> list[OpRow]:
    """The table, one row per op in registry order."""
    rows = []
    for name, d in load_registry().items():
        parts: dict[str, str | None] = {}
        why: dict[str, str] = {}
        for part, value in d.parts().items():
            if isinstance(value, NoPart):
                parts[part], why[part] = None, value.why
            elif value is None:
                parts[part], why[part] = None, "MISSING: neither defined nor declared none"
            else:
                parts[part] = _describe(part, value)
        if d.required is not None:
            parts["legality"] = f"needs {d.required[0]}" + (f", {parts['legality']}" if d.legality else "")
        rows.append(OpRow(name, _operand_names(d),
                          tuple(t.name for t in TARGETS.values() if compiles_for(d, t)), parts, why))
    return rows


def render(rows: list[OpRow], verbose: bool = False) -> str:
    """The table as text; ``verbose`` adds the operand names and the reason of each "none"."""
    all_targets = len(TARGETS)
    lines = []
    for r in rows:
        targets = "all targets" if len(r.targets) == all_targets else (" ".join(r.targets) or "no target")
        cells = [f"{p}: {r.parts[p] if r.parts[p] is not None else 'none'}" for p in PARTS]
        lines.append(f"{r.name:<22} [{targets}]")
        lines.append("    " + " | ".join(cells))
        if verbose:
            if r.operands:
                lines.append(f"    operands: {r.operands}")
            lines.extend(f"    {p} none: {w}" for p, w in r.why.items())
    return "\n".join(lines)
