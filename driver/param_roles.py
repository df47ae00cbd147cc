"""What a kernel's unannotated parameter is, as far as its body shows: a pointer (the address a
``load``/``store``/atomic reads, alone or plus offsets) or a scalar (compared, multiplied, a loop
bound). SP0740's help writes its example signature from it (``x=ptr[f32]``, ``n=i32``); a parameter
used neither way, or both ways, is None and the help shows both forms.

The reading is syntactic (no types are known before the signature is): names bound by ``p = x + offs``
are followed, so ``load(p)`` makes ``x`` a pointer; an address sum of two parameters tells nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from ..frontend.syntax import ast as A

Role = Literal["pointer", "scalar"]

POINTER_BUILTINS = frozenset({"load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg",
                              "atomic_cas"})
"""Builtins whose first argument (``pointer=``) is an address in global memory."""
SCALAR_OPERATORS = frozenset({"*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^"})
"""Binary operators a pointer cannot take (pointer arithmetic is ``+`` and ``-`` only)."""
SCALAR_CALLS = frozenset({"range", "static_range", "cdiv"})
"""Calls whose arguments are integers."""


def param_roles(fn: A.FunctionDef, names: Iterable[str], maybe_pointers: Iterable[str]) -> dict[str, Role | None]:
    """The role of each parameter of ``names`` in ``fn``'s body: "pointer", "scalar" or None
    (unused, or used as both). ``maybe_pointers``: the parameters that may hold an address (``names``
    and those annotated as pointers); an address whose sum has one of them takes its base from it."""
    wanted = set(names)
    candidates = set(maybe_pointers) | wanted
    aliases = _aliases(fn, {p.name for p in fn.params})
    pointers: set[str] = set()
    scalars: set[str] = set()
    for node in A.walk(fn):
        if isinstance(node, A.Call):
            callee = _callee(node.func)
            if callee in POINTER_BUILTINS:
                address = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.name == "pointer"), None)
                if address is not None:
                    bases = _bases(address, aliases) & candidates
                    if len(bases) == 1:
                        pointers |= bases
            elif callee in SCALAR_CALLS:
                scalars |= _names(node.args)
        elif isinstance(node, A.BinOp) and node.op in SCALAR_OPERATORS:
            scalars |= _names([node.left, node.right])
        elif isinstance(node, A.Compare) and not _is_none_test(node):
            scalars |= _names([node.left, *node.comparators])
    return {n: ("pointer" if n in pointers and n not in scalars else
                "scalar" if n in scalars and n not in pointers else None) for n in wanted}


def _callee(func: A.Expr) -> str | None:
    """``load`` of ``load(...)``, ``sp.load(...)`` and ``tl.load(...)``."""
    if isinstance(func, A.Name):
        return func.id
    if isinstance(func, A.Attribute):
        return func.attr
    return None


def _names(exprs: Iterable[A.Expr]) -> set[str]:
    """The plain names among ``exprs`` (not names inside larger expressions)."""
    return {e.id for e in exprs if isinstance(e, A.Name)}


def _is_none_test(node: A.Compare) -> bool:
    """``x is None``, ``x != None``: an optional pointer's test, no scalar use."""
    operands = [node.left, *node.comparators]
    return any(op in ("is", "is not") for op in node.ops) or any(
        isinstance(e, A.Constant) and e.value is None for e in operands)


def _aliases(fn: A.FunctionDef, params: set[str]) -> dict[str, list[A.Expr]]:
    """The values each local name is assigned (``p = x + offs``; ``p += step`` keeps p's base)."""
    out: dict[str, list[A.Expr]] = {}
    for node in A.walk(fn):
        if isinstance(node, A.Assign):
            for target in node.targets:
                if isinstance(target, A.Name) and target.id not in params:
                    out.setdefault(target.id, []).append(node.value)
        elif isinstance(node, A.AnnAssign) and node.value is not None and isinstance(node.target, A.Name):
            if node.target.id not in params:
                out.setdefault(node.target.id, []).append(node.value)
    return out


def _bases(expr: A.Expr, aliases: dict[str, list[A.Expr]]) -> set[str]:
    """The names an address expression may take its base pointer from: the operands of ``+``, the
    left one of ``-``, a subscripted or parenthesized tile of addresses, through local names."""
    found: set[str] = set()
    seen: set[str] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, A.Name):
            if e.id in aliases and e.id not in seen:
                seen.add(e.id)
                stack.extend(aliases[e.id])
            elif e.id not in aliases:
                found.add(e.id)
        elif isinstance(e, A.BinOp) and e.op == "+":
            stack += [e.left, e.right]
        elif isinstance(e, A.BinOp) and e.op == "-":
            stack.append(e.left)
        elif isinstance(e, A.Subscript):
            stack.append(e.value)
        elif isinstance(e, A.IfExp):
            stack += [e.body, e.orelse]
    return found
