"""The diagnostic for ``NS.NAME`` in a kernel where the language's namespace NS (``sparsile``,
``hopper``, ``tma``, ...) has no member NAME, and the help of a ``.spk`` file's
``from sparsile import NAME`` for such a NAME. What is said depends on what NAME is:

* a name the Python package has (its API, a submodule): python_api.py says what it is;
* an attribute of the Python object that stands for a namespace (``sparsile.hopper.name`` and
  ``.members``, the fields of :class:`~sparsile.frontend.sema.values.Namespace`, or a dunder):
  Python has it, the language's namespace does not, and the message says both;
* Triton's spelling of something sparsile writes another way (triton_names.py);
* ``interpret``: a kernel runs in the interpreter when it is launched from Python that way;
* ``range`` / ``static_range``: the iterable of a ``for`` loop, nothing else;
* otherwise "no member", with the nearest member's name if one is close."""

from __future__ import annotations

import difflib

from ..diagnostics import Diagnostic
from ..spans import Span
from .builtins import ROOT
from .python_api import python_api_member
from .triton_names import name_help
from .values import Namespace

INTERPRET = ("to run a kernel in the CPU interpreter, launch it from Python as `kernel.interpret[grid](...)` "
             "(README.md); a kernel cannot start the interpreter itself")

FOR_ONLY = frozenset({"range", "static_range"})


def for_loop_help(name: str) -> str | None:
    """The help for ``range`` / ``static_range`` used anywhere but as a ``for`` loop's iterable."""
    return f"`{name}` can only be used as the iterable of a `for` loop" if name in FOR_ONLY else None

ROOT_HELP: dict[str, str] = {"interpret": INTERPRET}
"""Names users reach for as ``sparsile.NAME`` that neither the language nor the package has, with
what they are looking for."""


def _is_python_attribute(base: Namespace, attr: str) -> bool:
    """Whether the Python object ``base`` (not the package's root, a module on the Python side) has
    ``attr`` of its own: a field of the dataclass or an attribute every object has."""
    if base is ROOT:
        return False
    try:
        return hasattr(base, attr)  # (Namespace.__getattr__ answers members only; this one is none)
    except Exception:  # an attribute that raises when read: not one to name
        return False


def member_help(base: Namespace, attr: str) -> str | None:
    """The help for ``base.attr`` where ``base`` has no member ``attr`` (and the name is not one of
    the Python package's), or None where nothing better than the nearest member is known."""
    if base is ROOT and attr in ROOT_HELP:
        return ROOT_HELP[attr]
    if base is ROOT and attr in FOR_ONLY:
        return for_loop_help(attr)
    return name_help(attr)


def missing_member(base: Namespace, attr: str, span: Span) -> Diagnostic:
    """SP0204 at ``span`` (the member's name) for ``base.attr`` where ``base`` has no member ``attr``."""
    api = python_api_member(base, attr, span)
    if api is not None:
        return api
    if _is_python_attribute(base, attr):
        members = ", ".join(f"`{m}`" for m in sorted(base.members))
        return Diagnostic("SP0204", f"`sparsile.{base.name}.{attr}` is an attribute of the Python object "
                          f"`sparsile.{base.name}`, not a member of the kernel language's namespace `{base.name}`",
                          span, help=f"the members of `{base.name}` are {members}")
    help_ = member_help(base, attr)
    if help_ is None:
        close = difflib.get_close_matches(attr, sorted(base.members), n=1)
        help_ = f"did you mean `{close[0]}`?" if close else None
    return Diagnostic("SP0204", f"`{base.name}` has no member `{attr}`", span, help=help_)


def import_help(module: str, name: str) -> str | None:
    """The help of ``from MODULE import NAME`` in a ``.spk`` file where the namespace has no NAME
    (and the package has none either)."""
    if module == "sparsile" and name in FOR_ONLY:
        return f"`{name}` needs no import: a `for` loop names it as it is (`for i in {name}(n):`)"
    if module == "sparsile" and name in ROOT_HELP:
        return ROOT_HELP[name]
    return name_help(name)
