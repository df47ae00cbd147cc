"""The diagnostics for ``sparsile.NAME`` in a kernel (or a ``.spk`` import) where NAME is something
the Python package has but the kernel language does not: its API (the ``jit`` / ``kernel``
decorators, ``CompileError``, ``autotune``, ...), a submodule (``sparsile.driver``,
``sparsile.torch``) or another attribute of the module (``sparsile.__version__``). The package has
the name, so "no member" would be untrue; "no member" stays for names the package lacks.

What a name is gets decided from the package's own namespace and the import system's finders
(``importlib.util.find_spec``, which locates a submodule without running it): nothing heavy (the
backend, the driver, torch) is imported to answer."""

from __future__ import annotations

import difflib
import importlib.util
import sys
from types import ModuleType

from ..diagnostics import Diagnostic
from ..spans import Span
from .builtins import NAMESPACES, ROOT
from .values import Namespace

DECORATORS = frozenset({"jit", "kernel"})

GENERAL_HELP = "inside a kernel, `sparsile.` names the language's builtins, types and constants (docs/language.md)"

CLOSE = 0.75
"""How close (difflib's ratio) a language name must be to a Python-side name to be suggested: the
user probably meant the Python object, so only a near spelling (`loads` -> `load`) is offered."""

_WHAT = {"decorator": "a decorator of sparsile's Python API",
         "class": "a class of sparsile's Python API",
         "function": "a function of sparsile's Python API",
         "api": "part of sparsile's Python API",
         "submodule": "a Python submodule of sparsile",
         "attribute": "an attribute of the Python module `sparsile`"}


def _package() -> ModuleType | None:
    """The package (sparsile), whatever name it was imported by."""
    return sys.modules.get(__name__.partition(".")[0])


def _is_submodule(package: ModuleType, name: str) -> bool:
    """Whether ``package.name`` is a module the import system can find (found, not imported)."""
    try:
        return importlib.util.find_spec(f"{package.__name__}.{name}") is not None
    except (ImportError, ValueError):  # a finder that cannot answer: not a submodule we can name
        return False


def python_member_kind(attr: str) -> str | None:
    """What ``sparsile.attr`` is on the Python side when it is not a name of the kernel language:
    ``"decorator"``, ``"class"``, ``"function"``, ``"api"`` (another public API name),
    ``"submodule"``, ``"attribute"`` (any other attribute of the module), or None where the package
    has no such name (or it is a language name)."""
    package = _package()
    if package is None or attr in ROOT.members:
        return None
    names = vars(package)
    if attr in names:
        obj = names[attr]
        if isinstance(obj, ModuleType):  # `sparsile.driver`; `sys`, which the package imports, is an attribute
            return "submodule" if obj.__name__.startswith(f"{package.__name__}.") else "attribute"
        if attr not in getattr(package, "__all__", ()):
            return "attribute"
        if attr in DECORATORS:
            return "decorator"
        return "class" if isinstance(obj, type) else "function" if callable(obj) else "api"
    if hasattr(ModuleType, attr):  # the module object's own (`__class__`, `__dict__`, `__init__`)
        return "attribute"
    return "submodule" if _is_submodule(package, attr) else None


def _nearest_language_name(attr: str) -> str | None:
    close = difflib.get_close_matches(attr, sorted(ROOT.members), n=1, cutoff=CLOSE)
    return f"did you mean `{close[0]}`?" if close else None


def python_api_member(base: Namespace, attr: str, span: Span) -> Diagnostic | None:
    """SP0204 at ``span`` if ``base`` is the ``sparsile`` namespace and ``attr`` is a name the Python
    package has (its API, a submodule, another attribute) that the language does not."""
    if base is not ROOT:
        return None
    kind = python_member_kind(attr)
    if kind is None:
        return None
    if kind == "decorator":
        help_ = f"`sparsile.{attr}` is the decorator that makes a kernel; it has no meaning inside one"
    else:
        help_ = _nearest_language_name(attr) or GENERAL_HELP
    return Diagnostic("SP0204", f"`sparsile.{attr}` is {_WHAT[kind]}, not a name of the kernel language",
                      span, help=help_)


def python_import_name(module: str, name: str, span: Span) -> Diagnostic | None:
    """SP0233 for ``from sparsile import NAME`` in a ``.spk`` file where NAME is a name the Python
    package has that the language does not (None for any other module or name)."""
    if module != "sparsile":
        return None
    kind = python_member_kind(name)
    if kind is None:
        return None
    if kind == "decorator":
        help_ = "a .spk file marks its kernels `@kernel` or `@jit` without importing them"
    else:
        help_ = _nearest_language_name(name) or "a .spk file imports the language's names from `sparsile`"
    return Diagnostic("SP0233", f"`sparsile.{name}` is {_WHAT[kind]}, not a name of the kernel language",
                      span, help=help_)


def python_import_module(module: str, span: Span) -> Diagnostic | None:
    """SP0232 for ``import sparsile.X...`` / ``from sparsile.X... import`` in a ``.spk`` file where
    ``sparsile.X`` is a Python submodule (or another name of the package) rather than a namespace of
    the language; None where the module path names nothing the package has."""
    head, _, rest = module.partition(".")
    if head != "sparsile" or not rest:
        return None
    parts = rest.split(".")
    for i in range(len(parts)):  # the first component that is not a language namespace
        if ".".join(parts[:i + 1]) not in NAMESPACES:
            if i > 0:
                return None  # `sparsile.hopper.foo`: the namespace has no such member, as said
            kind = python_member_kind(parts[0])
            if kind is None:
                return None
            names = ", ".join(f"`sparsile.{n}`" for n in sorted(n for n in NAMESPACES if "." not in n))
            return Diagnostic("SP0232", f"`sparsile.{parts[0]}` is {_WHAT[kind]}, not a namespace of the kernel "
                              "language", span, help=f"kernels can import `sparsile` and its namespaces: {names}")
    return None
