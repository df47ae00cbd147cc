"""Sparse metadata typed by the operand it was formatted for: ``meta[T]``.

The physical metadata layout depends on the operand width (16-bit, tf32, 8-bit, 4-bit:
docs/hardware.md §1.4, §3, §4.2; ``docs/sparse-metadata.md``), but a word matrix formatted for f16
has exactly the shape of one formatted for e4m3 — so nothing downstream can tell them apart and
the MMA silently computes garbage (docs/hardware.md §11). sparsile types it:

The type constructor is registered as the language name ``meta`` by :mod:`ops_layout`.

* ``meta[f16]`` (or ``meta[e4m3, "sm90"]``) is a kernel parameter type: a pointer to ``u32``
  metadata words tagged with the operand type (and optionally the format) they were encoded for;
  ``meta[f16, 2]`` is the same for a global tensor (``tensor[u32, 2]``). Everything a kernel does
  with it is what it does with ``ptr[u32]`` / ``tensor[u32, rank]``.
* **compile time** (the legality rule below, ``SP0574``): the metadata operand of ``sparse_dot``
  and of a sparse ``hopper.wgmma`` is traced back to the ``meta[T]`` parameters it was loaded
  from; a tag of another width class than the A operand's is an error at the MMA, with a label at
  the parameter.
* **launch time** (:func:`check_metadata_argument`): a
  :class:`~sparsile.stdlib.sparsity.MetadataBuffer` passed for a ``meta[T]`` parameter must carry
  a tag of the same width class (and format, when the annotation names one): ``SP0809`` /
  ``SP0810`` from the sparsity toolkit's own validator. A raw ``uint32`` array is accepted
  unchecked (it carries no tag).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..diagnostics import Diagnostic, Label
from ..ir import types as T
from ..ir.core import Operation, Value
from ..sema.type_ctors import TypeCtor
from .core import SP_META_WIDTH, Context, rule

FORMATS = ("sm90", "tcgen05")
LANGUAGE_TO_OPERAND = {"i8": "s8", "f32": "tf32"}
"""Language type names whose sparsity-toolkit name differs."""


def operand_name(elem: T.ScalarType | str) -> str | None:
    """The sparsity toolkit's operand name for a language element type (None if not sparse-able)."""
    from ...stdlib.sparsity.dtypes import OPERAND_TYPES

    name = elem if isinstance(elem, str) else elem.name
    name = LANGUAGE_TO_OPERAND.get(name, name)
    return name if name in OPERAND_TYPES else None


def width_class(elem: T.ScalarType | str) -> str | None:
    """``16-bit``, ``tf32``, ``8-bit`` or ``4-bit`` (docs/hardware.md §1.4), or None."""
    from ...stdlib.sparsity.dtypes import OPERAND_TYPES

    name = operand_name(elem)
    return OPERAND_TYPES[name].width_class if name else None


@dataclass(frozen=True)
class MetaPointerType(T.PointerType):
    """A pointer to ``u32`` metadata words formatted for ``operand`` operands (a language type
    name), in ``fmt`` ("sm90", "tcgen05") when given."""

    operand: str = "f16"
    fmt: str | None = None

    def __str__(self) -> str:
        return f"meta[{self.operand}" + (f", {self.fmt!r}" if self.fmt else "") + "]"


@dataclass(frozen=True)
class MetaTensorType(T.TensorType):
    """A global tensor of ``u32`` metadata words (``meta[T, rank]``), tagged like
    :class:`MetaPointerType`."""

    operand: str = "f16"
    fmt: str | None = None

    def __str__(self) -> str:
        return f"meta[{self.operand}, {self.rank}" + (f", {self.fmt!r}" if self.fmt else "") + "]"


META_TYPES = (MetaPointerType, MetaTensorType)


class MetaCtor(TypeCtor):
    """``meta[T]`` (a pointer), ``meta[T, rank]`` (a global tensor), optionally with a format
    last (``meta[e4m3, "sm90"]``, ``meta[f16, 2, "sm90"]``), in annotations."""

    def apply(self, params: tuple[object, ...]) -> T.Type | str:
        usage = ("`meta[...]` takes the sparse operand's type, optionally a tensor rank, optionally a format: "
                 "`meta[f16]`, `meta[e4m3, 2]`, `meta[f16, \"sm90\"]`")
        if not 1 <= len(params) <= 3 or not isinstance(params[0], T.ScalarType):
            return usage
        elem, rest = params[0], list(params[1:])
        if operand_name(elem) is None:
            return f"`meta[{elem}]`: {elem} operands have no sparse metadata; use f16, bf16, tf32, e4m3, e5m2, i8 or u8"
        rank = rest.pop(0) if rest and isinstance(rest[0], int) and not isinstance(rest[0], bool) else None
        fmt = rest.pop(0) if rest else None
        if rest or (fmt is not None and not isinstance(fmt, str)):
            return usage
        if fmt is not None and fmt not in FORMATS:
            return f"`meta[{elem}, {fmt!r}]`: the format must be one of {', '.join(map(repr, FORMATS))}"
        if rank is None:
            return MetaPointerType(T.u32, operand=elem.name, fmt=fmt)
        if not 1 <= rank <= 5:
            return f"a tensor's rank must be 1 to 5 (the TMA limit), found {rank}"
        return MetaTensorType(T.u32, rank, operand=elem.name, fmt=fmt)


# ------------------------------------------------------------------------------------------------
# Compile time: where did this metadata come from?
# ------------------------------------------------------------------------------------------------
def metadata_sources(value: Value, param_spans: dict[int, Any] | None = None,
                     limit: int = 512) -> list[tuple[Any, Any]]:
    """The ``meta[T]`` pointer types that ``value`` was computed from, each with the span of the
    kernel parameter declaring it (``param_spans``: id of a parameter's value -> its span): a
    backward walk through defining ops, loop-carried values and branches."""
    spans = param_spans or {}
    seen: set[int] = set()
    found: dict[Any, Any] = {}
    stack = [value]
    while stack and len(seen) < limit:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v.type, T.ScalarType | T.PointerType | T.TileType):
            elem: Any = T.element_type(v.type)
        else:
            elem = v.type
        if isinstance(elem, META_TYPES) and v.owner is None:
            if id(v) in spans:
                found[elem] = spans[id(v)]
            else:
                found.setdefault(elem, None)
        if v.owner is not None:
            stack.extend(v.owner.operands)
        elif v.block is not None and v.block.parent is not None:
            stack.extend(_carried_sources(v))
    return list(found.items())


def _carried_sources(arg: Value) -> list[Value]:
    """Values that flow into block argument ``arg``: the loop's initial value and what the body
    yields (``scf.for``: args are (iv, carried...); ``scf.while``: carried...)."""
    block = arg.block
    assert block is not None and block.parent is not None
    loop = block.parent
    out: list[Value] = []
    if loop.name == "scf.for":
        i = arg.index - 1
        if i < 0:
            return out
    elif loop.name == "scf.while":
        i = arg.index
    else:
        return out
    inits = loop.operand_group("init")
    if i < len(inits):
        out.append(inits[i])
    for region in loop.regions:
        term = region.block.terminator
        if term is None:
            continue
        values = term.operand_group("value")  # scf.yield: value0, ...; scf.condition: cond, value0, ...
        if i < len(values):
            out.append(values[i])
    return out


def _check(op: Operation, meta: Value, a_elem: T.ScalarType, what: str, ctx: Context) -> Iterator[Diagnostic]:
    want = width_class(a_elem)
    if want is None:
        return
    spans = {id(p.value): p.span for p in ctx.func.params if p.value is not None}
    for tag, span in metadata_sources(meta, spans):
        have = width_class(tag.operand)
        if have != want:
            labels = (Label(span, f"declared {tag} here"),) if span is not None and span.line > 0 else ()
            yield Diagnostic(SP_META_WIDTH, f"{what} has {a_elem} operands ({want}) but its metadata was "
                             f"declared {tag}, formatted for {have} operands", op.span,
                             help=f"encode the metadata for {a_elem} (`encode_metadata(..., dtype=\"{a_elem}\")`) "
                                  f"and declare the parameter `meta[{a_elem}]`", labels=labels,
                             notes=("metadata layouts differ between operand widths (docs/hardware.md §1.4, §4.2); "
                                    "a mismatch is silently wrong on the GPU",))


@rule("sparse_dot")
def sparse_dot_metadata_width(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    a_elem = T.element_type(op.operand("a").type)
    assert isinstance(a_elem, T.ScalarType)
    yield from _check(op, op.operand("a_meta"), a_elem, "this sparse_dot", ctx)


@rule("hopper.wgmma")
def wgmma_metadata_width(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    meta = op.optional_operand("a_meta")  # a sparse wgmma's
    if meta is None:
        return
    ta = op.operand("a").type
    a_elem = ta.elem if isinstance(ta, T.SmemType) else T.element_type(ta)  # A in shared memory or registers
    assert isinstance(a_elem, T.ScalarType)
    yield from _check(op, meta, a_elem, "this sparse wgmma", ctx)


# ------------------------------------------------------------------------------------------------
# Launch time
# ------------------------------------------------------------------------------------------------
def check_metadata_argument(name: str, annotation: T.Type | None, value: Any) -> Any:
    """The array to pass for parameter ``name``: a :class:`MetadataBuffer` given for a
    ``meta[T]`` parameter is checked against the tag (``SparsityError`` SP0809 for another operand
    width, SP0810 for another format) and unwrapped to its words; anything else is returned as is.
    The launcher calls this before specializing the argument; the check is the toolkit's
    :func:`~sparsile.stdlib.sparsity.validate_metadata` (tag, then the words themselves)."""
    if type(value).__name__ != "MetadataBuffer":  # cheap test first: the launch path asks for every argument
        return value
    from ...stdlib.sparsity.buffer import MetadataBuffer

    if not isinstance(value, MetadataBuffer):
        return value
    if not isinstance(annotation, META_TYPES):
        return value.data
    from ...stdlib.sparsity.validate import validate_metadata

    return validate_metadata(value, annotation.fmt, operand_name(annotation.operand)).data
