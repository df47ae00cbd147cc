"""The registry of language builtins: top-level names, dotted namespaces and value methods.

Op modules register their builtins with :func:`builtin`; sema resolves names through
:func:`lookup_global` and attribute access on values through :func:`lookup_method`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import types as T
from .values import Builtin, Const, Namespace

ROOT = Namespace("sparsile")
NAMESPACES: dict[str, Namespace] = {}
METHODS: dict[type, dict[str, Builtin]] = {}
PROPERTIES: dict[type, dict[str, Builtin]] = {}


def namespace(path: str) -> Namespace:
    """The namespace at dotted ``path`` (created on first use and linked from the root)."""
    if not path:
        return ROOT
    if path not in NAMESPACES:
        parent_path, _, leaf = path.rpartition(".")
        ns = Namespace(path)
        NAMESPACES[path] = ns
        namespace(parent_path).members[leaf] = ns
    return NAMESPACES[path]


def builtin(name: str, *, ns: str = "", method_of: tuple[type, ...] = (), prop_of: tuple[type, ...] = (),
            also: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Builtin]:
    """Register ``impl(em, ...)`` as builtin ``name`` in namespace ``ns`` (and as a method or
    property of values whose type is one of ``method_of`` / ``prop_of``)."""

    def deco(impl: Callable[..., Any]) -> Builtin:
        b = Builtin(f"{ns}.{name}" if ns else name, impl)
        if not prop_of:
            target = namespace(ns)
            for n in (name, *also):
                target.members[n] = b
        for cls in method_of:
            METHODS.setdefault(cls, {})[name] = b
        for cls in prop_of:
            PROPERTIES.setdefault(cls, {})[name] = b
        return b

    return deco


def _register_types() -> None:
    for name, t in {**T.SCALAR_TYPES, **T.ALIASES}.items():
        ROOT.members[name] = Const(t)
    ROOT.members["constexpr"] = Const(T.CONSTEXPR)


_register_types()


def lookup_global(name: str) -> Any | None:
    return ROOT.members.get(name)


def lookup_method(value_type: T.Type, name: str) -> tuple[str, Builtin] | None:
    """``("method", b)`` or ``("property", b)`` for attribute ``name`` of a value of ``value_type``."""
    for cls in type(value_type).__mro__:
        if name in PROPERTIES.get(cls, {}):
            return "property", PROPERTIES[cls][name]
        if name in METHODS.get(cls, {}):
            return "method", METHODS[cls][name]
    return None


def method_names(value_type: T.Type) -> list[str]:
    names: set[str] = set()
    for cls in type(value_type).__mro__:
        names |= set(METHODS.get(cls, {})) | set(PROPERTIES.get(cls, {}))
    return sorted(names)
