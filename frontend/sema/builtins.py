"""The registry of language builtins: top-level names, dotted namespaces and value methods.

Op modules register their builtins with :func:`builtin`; sema resolves names through
:func:`lookup_global` and attribute access on values through :func:`lookup_method`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir import types as T
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
            also: tuple[str, ...] = (), method_only: bool = False) -> Callable[[Callable[..., Any]], Builtin]:
    """Register ``impl(em, ...)`` as builtin ``name`` in namespace ``ns`` (and as a method or
    property of values whose type is one of ``method_of`` / ``prop_of``; ``method_only`` keeps a
    method out of the namespace, e.g. ``buf.load()`` must not shadow the global ``load``)."""

    def deco(impl: Callable[..., Any]) -> Builtin:
        b = Builtin(f"{ns}.{name}" if ns else name, impl)
        if not prop_of and not method_only:
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


# ------------------------------------------------------------------------------------------------
# The builtin reference of docs/language.md is generated from this registry (see
# tests/frontend/test_language_doc.py), so that the documentation cannot drift from the language.
# ------------------------------------------------------------------------------------------------
def _param_texts(b: Builtin) -> list[str]:
    import inspect

    parts = []
    for p in b.signature.parameters.values():
        if p.name.startswith("_"):  # (a parameter that only catches a misuse, e.g. max's *_values)
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.default is inspect.Parameter.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={p.default!r}")
    return parts


def signature_text(b: Builtin, name: str | None = None) -> str:
    """``name(a, b, c=None, *rest)`` for a builtin (without the emitter parameter)."""
    return f"{name or b.name.rpartition('.')[2]}({', '.join(_param_texts(b))})"


def _summary(b: Builtin) -> str:
    doc = " ".join((b.doc or "").strip().split("\n\n")[0].split())
    return doc or "(undocumented)"


_KIND_NAMES = {"TileType": "tiles", "ScalarType": "scalars", "TensorType": "global tensors",
               "PointerType": "pointers", "SmemType": "shared-memory buffers", "TmemType": "tensor-memory regions",
               "BarrierType": "barriers"}


def _method_text(b: Builtin, name: str, prop: bool) -> str:
    """``x.name(args)``, ``x.name`` (a property) or ``x[index]``: the receiver is the first parameter."""
    rest = _param_texts(b)[1:]
    if prop:
        return f"x.{name}"
    if name == "__getitem__":
        return f"x[{', '.join(rest)}]"
    return f"x.{name}({', '.join(rest)})"


def _functions(ns: Namespace, prefix: str, out: list[str]) -> None:
    names_of: dict[int, list[str]] = {}
    for name, m in ns.members.items():
        if isinstance(m, Builtin):
            names_of.setdefault(id(m), []).append(name)
    seen: set[int] = set()
    for name in sorted(ns.members):
        m = ns.members[name]
        if not isinstance(m, Builtin) or id(m) in seen:
            continue
        seen.add(id(m))
        others = [n for n in names_of[id(m)] if n != name]
        also = f" (also `{prefix}{'`, `'.join(others)}`)" if others else ""
        out.append(f"- `{prefix}{signature_text(m, name)}`{also}: {_summary(m)}")


def builtin_reference() -> str:
    """The Markdown reference of the language's builtins: the top-level functions, each namespace,
    and the methods and properties of each kind of value, with signatures and the first paragraph
    of each docstring."""
    out = ["#### Functions", ""]
    _functions(ROOT, "", out)

    def namespaces(ns: Namespace, prefix: str) -> None:
        for name in sorted(ns.members):
            m = ns.members[name]
            if isinstance(m, Namespace):
                out.extend(["", f"#### Namespace `{prefix}{name}`", ""])
                _functions(m, f"{prefix}{name}.", out)
                namespaces(m, f"{prefix}{name}.")

    namespaces(ROOT, "")
    top = {id(m) for m in ROOT.members.values() if isinstance(m, Builtin)}
    kinds = sorted({*METHODS, *PROPERTIES}, key=lambda c: _KIND_NAMES.get(c.__name__, c.__name__))
    for cls in kinds:
        out.extend(["", f"#### Methods and properties of {_KIND_NAMES.get(cls.__name__, cls.__name__)}", ""])
        members = [(n, b, False) for n, b in METHODS.get(cls, {}).items()]
        members += [(n, b, True) for n, b in PROPERTIES.get(cls, {}).items()]
        for name, b, prop in sorted(members, key=lambda e: e[0]):
            text = _method_text(b, name, prop)
            if id(b) in top and ROOT.members.get(name) is b:
                out.append(f"- `{text}`: the same as `{signature_text(b)}`")
            else:
                out.append(f"- `{text}`: {_summary(b)}")
    return "\n".join(out) + "\n"


def scalar_type_table() -> str:
    """The Markdown table of scalar types and their accepted spellings."""
    aliases: dict[str, list[str]] = {}
    for alias, t in T.ALIASES.items():
        aliases.setdefault(t.name, []).append(alias)
    rows = ["| type | kind | bits | also spelled |", "| --- | --- | --- | --- |"]
    for name, t in T.SCALAR_TYPES.items():
        spelled = ", ".join(f"`{a}`" for a in aliases.get(name, [])) or "—"
        rows.append(f"| `{name}` | {t.kind} | {t.bits} | {spelled} |")
    return "\n".join(rows) + "\n"
