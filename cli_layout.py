"""``sparsile layout``: a layout constructor call parsed as literals only (never evaluated as Python),
its arguments checked, and the layout drawn (frontend/layout/pictures.py)."""

from __future__ import annotations

import argparse
import inspect
from typing import Any, TextIO

from .cli_common import EXIT_DIAGNOSTICS, EXIT_OK, EXIT_UNAVAILABLE
from .cli_common import Usage as _Usage

MAX_LAYOUT_ARGUMENT = 1 << 62


def _check_layout_arguments(name: str, values: list[Any]) -> None:
    """A usage error for an integer argument too large to be a layout size (pictures only draw
    the shown cells, but a constructor may still build per-element tables)."""
    for v in values:
        if isinstance(v, list | tuple):
            _check_layout_arguments(name, list(v))
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_LAYOUT_ARGUMENT:
            raise _Usage(f"`{name}` argument {v} is too large: layout sizes go up to 2**62")


def _check_layout_types(fn: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """TypeError for an argument of a constructor's ``int`` or ``bool`` parameter that is no int or
    bool: ``wgmma_accumulator(64.5)`` or ``packed='no'`` used to draw the picture of 64 / of
    ``packed=True`` (other mistakes are the constructor's own to report)."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return
    for param, value in bound.arguments.items():
        kind = fn.__annotations__.get(param)
        if kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"`{param}` takes an integer, found {value!r}")
        if kind == "bool" and not isinstance(value, bool):
            raise TypeError(f"`{param}` takes True or False, found {value!r}")


def layout_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``sparsile layout "CONSTRUCTOR(args...)"`` / ``--list``: draw a layout of the library."""
    try:
        from .frontend.layout import library as layout_library
        from .frontend.layout import pictures as layout_pictures
        from .frontend.layout.layouts import LinearLayout
    except ImportError as e:
        print(f"error: layout pictures are not part of this installation yet ({e})", file=err)
        return EXIT_UNAVAILABLE
    constructors = {n: f for n, f in vars(layout_library).items()
                    if inspect.isfunction(f) and not n.startswith("_") and n in layout_library.__all__}
    if args.list:  # the functions that build a layout (not operand_class, swizzle_name, ...)
        for n in _layout_builders(constructors, LinearLayout):
            doc = (inspect.getdoc(constructors[n]) or "").split("\n")[0]
            print(f"{n}{inspect.signature(constructors[n])}\n    {doc}", file=out)
        return EXIT_OK
    if not args.expr:
        raise _Usage('give a layout constructor call, e.g. `sparsile layout "wgmma_accumulator(64)"`, or --list')
    name, call_args, call_kwargs = _literal_call(args.expr)
    if name not in constructors:
        raise unknown_constructor(name, _layout_builders(constructors, LinearLayout))
    _check_layout_arguments(name, [*call_args, *call_kwargs.values()])
    try:
        _check_layout_types(constructors[name], call_args, call_kwargs)
        layout = constructors[name](*call_args, **call_kwargs)
    except Exception as e:  # the constructor's own argument checks, or arguments of the wrong kind
        from .frontend.diagnostics import SparsileError

        signature = f"{name}{inspect.signature(constructors[name])}"
        if isinstance(e, SparsileError):  # already rendered as `error[SPxxxx]: ...` (with its help)
            print(f"{e}\n = note: in `{args.expr.strip()}`; the constructor is {signature}", file=err)
        else:
            print(f"error: {args.expr.strip()}: {e}\n  the constructor is {signature}", file=err)
        return EXIT_DIAGNOSTICS
    if not isinstance(layout, LinearLayout):
        raise unknown_constructor(name, _layout_builders(constructors, LinearLayout), builds_none=True)
    print(layout_pictures.layout_picture(layout, title=args.expr, max_rows=args.max_rows), file=out)
    return EXIT_OK


def _layout_builders(constructors: dict[str, Any], layout_type: type) -> list[str]:
    """The names of the library's functions that return a layout (not a swizzle name or an address)."""
    return sorted(n for n, f in constructors.items()
                  if inspect.signature(f).return_annotation in ("LinearLayout", layout_type))


def unknown_constructor(name: str, known: list[str], builds_none: bool = False) -> _Usage:
    """SP0423 for ``sparsile layout NAME(...)`` of a name that builds no layout (unknown, or a
    library function of another kind: ``builds_none``): the help lists the layout constructors (and
    the nearest one, for a misspelling)."""
    import difflib

    near = difflib.get_close_matches(name, known, n=1)
    guess = f"did you mean `{near[0]}`? " if near and not builds_none else ""
    what = "does not build a layout" if builds_none else "is not a layout constructor"
    return _Usage(f"`{name}` {what}", code="SP0423",
                  help=f"{guess}the layout constructors: {', '.join(known)} (`sparsile layout --list` shows "
                       "their arguments)")


def _literal_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """``name(literal, key=literal)`` parsed without evaluating anything but literals."""
    import ast

    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        node = None
    if isinstance(node, ast.Name):
        return node.id, [], {}
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise _Usage(f"expected a call such as `wgmma_accumulator(64)`, found `{text}`")
    try:
        pos = [ast.literal_eval(a) for a in node.args]
        kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except ValueError:
        raise _Usage("layout constructor arguments must be literals (numbers, strings, tuples)") from None
    return node.func.id, pos, kw
