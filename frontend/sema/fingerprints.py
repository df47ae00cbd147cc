"""Fingerprints of the Python values a ``@jit`` kernel captures: a hashable description of a value,
equal for equal values and the same in every process, that keys the compile cache
(frontend/sema/captures.py records where each value was read; docs/language.md, "What a kernel
captures, and when it is recompiled", says what each kind of value is keyed on).

Fingerprints (docs/language.md, "What a kernel captures, and when it is recompiled"): numbers,
strings, ``None``, tuples (named tuples too), lists (compared element by element at every check: a list may be
changed in place), sparsile, NumPy and torch dtypes, NumPy and ml_dtypes scalars and typed
constants (``sp.f32(1.5)``; type and value), by value (a NaN by its bits: its payload reaches the
code; an enum member by its class, name and value; an instance of a subclass of ``int``, ``float``
or ``str`` by its class and value; a ``fractions.Fraction`` by its numerator and denominator; a
``decimal.Decimal`` by its sign, digits and exponent and the thread's decimal context, which its
arithmetic rounds in); modules and classes by name; ``@jit`` kernels
and ``.spk`` helpers by their source text (and the text of each ``.spk`` module their module
imports); any other object by identity in the process and its type's name on disk (a dataclass
instance's or ``SimpleNamespace``'s fields too: ``cfg == FAST`` compares them, and where a kernel
folds such an object's value its fields are compared at every check), together with each
attribute a kernel reads from it. Folding the value of an object keyed by its type alone is
refused (:func:`unkeyed_part`; SP0254, frontend/sema/keyed_values.py). A value is keyed without its
class's code: where a fold runs a special method of a user's class, what it gave is keyed
(frontend/sema/class_code.py, captures.note_fold).
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import fractions
import struct
import threading
import types as pytypes
from typing import Any

from .values import HelperFunction

MISSING: Any = object()
"""Where a name was looked up and not found (it then resolved to a builtin)."""

_IMMUTABLE = (bool, int, float, complex, str, bytes, type(None))

FUNCTION_TYPES: dict[type, str] = {HelperFunction: "helper"}
"""Classes whose objects a kernel inlines, fingerprinted by their source: class -> kind. The driver
adds its ``Kernel`` (:func:`register_function_type`), so that this module needs nothing above sema."""


def register_function_type(cls: type, kind: str) -> None:
    """Fingerprint objects of ``cls`` (which have a ``node`` with a span) by their source, as ``kind``."""
    FUNCTION_TYPES[cls] = kind


def fingerprint(obj: Any) -> tuple[Any, ...]:
    """A hashable description of ``obj`` that is equal for equal values and the same in every
    process (see the module docstring for what each kind of object is keyed on)."""
    if obj is MISSING:
        return ("missing",)
    kind = type(obj)
    if kind in _IMMUTABLE:
        if kind is float and obj != obj:  # a NaN: `repr` is `nan` for all, the payload reaches the code too
            return ("value", "float", repr(obj), struct.pack("<d", obj).hex())
        return ("value", kind.__name__, repr(obj))
    if kind is tuple or kind is list:
        return (kind.__name__, *(fingerprint(x) for x in obj))
    if isinstance(obj, tuple) and hasattr(kind, "_fields"):  # a named tuple (`v[1]`, `a, b = v`): by its elements
        return ("namedtuple", f"{kind.__module__}.{kind.__qualname__}", *(fingerprint(x) for x in obj))
    function_kind = next((name for cls, name in FUNCTION_TYPES.items() if isinstance(obj, cls)), None)
    if function_kind is not None:
        node = obj.node
        source = node.span.source
        imports = getattr(obj, "imports", ())  # the .spk modules its module imports (driver/imports.py)
        return (function_kind, source.name, source.text, node.name, node.span.line, *imports)
    if isinstance(obj, pytypes.ModuleType):
        return ("module", obj.__name__)
    module = getattr(kind, "__module__", "") or ""
    if module.startswith(("numpy", "ml_dtypes")) and not isinstance(obj, type):
        import numpy as np

        if isinstance(obj, np.generic):  # ml_dtypes' scalars too (bfloat16, float8_*): by value, as NumPy's
            if obj != obj and obj.dtype.itemsize <= 8:  # a NaN by its bits (longdouble's padding is not its value)
                return ("value", kind.__name__, repr(obj.item()), obj.tobytes().hex())
            return ("value", kind.__name__, repr(obj.item()))
        if isinstance(obj, np.dtype):
            return ("dtype", str(obj))
    if module == "torch" and kind.__name__ == "dtype":  # `D == torch.float16` compiles one branch or the other
        return ("dtype", str(obj))
    if isinstance(obj, enum.Enum):
        # and its value: two classes of one qualified name (made by one factory) may differ there
        return ("value", f"{module}.{kind.__qualname__}", obj.name, fingerprint(obj.value))
    if isinstance(obj, fractions.Fraction):  # `float(v)`, `v < 1` fold its exact value
        return ("value", f"{module}.{kind.__qualname__}", fingerprint(obj.numerator), fingerprint(obj.denominator))
    if isinstance(obj, decimal.Decimal):  # its sign, digits and exponent (a NaN's payload among them)
        return ("value", f"{module}.{kind.__qualname__}", repr(tuple(obj.as_tuple())), decimal_context())
    base = next((b for b in _IMMUTABLE if isinstance(obj, b)), None)
    if base is not None:  # `class Size(int)`: the kernel folds its value (`x * v`, `v == "fast"`)
        return ("value", f"{module}.{kind.__qualname__}", fingerprint(_PLAIN.get(base, base)(obj)))
    if module.split(".")[0] == "sparsile" and module != "sparsile.driver.module":
        from ..ir import types as T

        if kind is T.TypedConstant:  # `f32(nan)` is the repr of every NaN: its value's own fingerprint
            return ("sparsile", "TypedConstant", str(obj.dtype), fingerprint(obj.value))
        name = getattr(obj, "name", None)  # builtins, namespaces, type constructors: registered once
        label = repr(obj) if isinstance(obj, T.Type) or not isinstance(name, str) else name
        return ("sparsile", kind.__qualname__, label)
    if isinstance(obj, type):
        return ("class", f"{obj.__module__}.{obj.__qualname__}")
    if isinstance(obj, pytypes.FunctionType | pytypes.BuiltinFunctionType):
        return ("function", f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}")
    label = f"{module}.{kind.__qualname__}"
    fields = field_values(obj)
    if fields is None:
        return ("object", label)
    path: list[int] = _fields_path.__dict__.setdefault("ids", [])  # the objects whose fields are being read
    if id(obj) in path or len(path) >= _MAX_FIELD_DEPTH:  # a cycle (a tree's parent links) or deep nesting
        return ("object", label)
    path.append(id(obj))
    try:  # (`cfg == FAST` folds Python's `==`, which compares them)
        return ("object", label, *((name, fingerprint(v)) for name, v in fields))
    finally:
        path.pop()


def unkeyed_part(obj: Any, depth: int = 0) -> Any:
    """The part of ``obj`` whose value its fingerprint does not hold, else None: an object keyed by
    its type's name alone (an instance of your class, a NumPy array, a dict, a Python function),
    found in ``obj`` itself, its elements or its fields; a dataclass instance whose ``==`` is
    identity (``eq=False``) or whose fields nest too deep. A kernel folding that part's value
    (``v == w``, ``float(v)``, ``len(v)``) would compile to code no key distinguishes."""
    kind = type(obj)
    if kind in _IMMUTABLE:
        return None
    if isinstance(obj, tuple | list):
        return next((p for p in (unkeyed_part(x, depth) for x in obj) if p is not None), None)
    if (getattr(kind, "__module__", "") or "").startswith("sparsile.frontend"):
        return None  # the language's own objects (types, builtins, namespaces): what their key names
    fields = field_values(obj)
    if fields is not None:
        if depth >= _MAX_FIELD_DEPTH or (kind is not pytypes.SimpleNamespace and kind.__eq__ is object.__eq__):
            return obj
        return next((p for p in (unkeyed_part(v, depth + 1) for _, v in fields) if p is not None), None)
    kind_of_key = fingerprint(obj)[0]
    if kind_of_key == "sparsile":  # (a launcher's, an autotuner's objects are keyed by their name or repr only)
        return obj
    return obj if kind_of_key in ("object", "function") else None


def decimal_context() -> tuple[Any, ...]:
    """What of the thread's decimal context a Decimal's arithmetic in a kernel depends on (``v / 3``
    rounds to its precision, an untrapped division by zero gives Infinity, ``str(v)`` spells the
    exponent with its ``capitals``): part of a Decimal's fingerprint."""
    c = decimal.getcontext()
    traps = sorted(t.__name__ for t, on in c.traps.items() if on)
    return ("decimal-context", c.prec, c.rounding, c.Emin, c.Emax, c.capitals, c.clamp, *traps)


_PLAIN: dict[type, Any] = {int: int.__int__, float: float.__float__, str: str.__str__}
"""The plain value of an instance of a subclass, whatever its own ``__int__`` / ``__float__`` /
``__str__`` says (``str(v)`` of ``class Tag(str)`` with a ``__str__`` spelled every value alike)."""

_fields_path = threading.local()
_MAX_FIELD_DEPTH = 8
"""How deep :func:`fingerprint` reads the fields of dataclass instances and namespaces inside one
another; deeper ones (and one met again inside itself) by their type alone."""


def field_values(obj: Any) -> list[tuple[str, Any]] | None:
    """A dataclass instance's fields or a ``SimpleNamespace``'s attributes, by name; None for any
    other object."""
    if type(obj) is pytypes.SimpleNamespace:
        return sorted(vars(obj).items())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # (an instance, not the class)
        return [(f.name, getattr(obj, f.name, MISSING)) for f in dataclasses.fields(obj)]
    return None


def compared_by_value(obj: Any) -> bool:
    """Whether an unchanged identity does not prove an unchanged value (a list, or a tuple holding
    one, may be changed in place; a Decimal's key holds the thread's decimal context). An object with
    fields changed in place is noticed where a kernel folds its value (:func:`fields_may_change`)."""
    kind = type(obj)
    if kind is list or isinstance(obj, decimal.Decimal):
        return True
    if isinstance(obj, tuple):  # (named tuples too)
        return any(compared_by_value(x) for x in obj)
    return False


def fields_may_change(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` is a ``SimpleNamespace`` or a dataclass instance whose fields may change in
    place (``cfg.block = 2``, which ``cfg == FAST`` compares): one that is not frozen, or a frozen
    one holding such an object or a list, in a tuple too (or nested deeper than its fingerprint reads)."""
    fields = field_values(obj)
    if fields is None:
        return False
    kind = type(obj)
    if kind is pytypes.SimpleNamespace or not kind.__dataclass_params__.frozen or depth >= _MAX_FIELD_DEPTH:
        return True
    return any(_may_change(v, depth + 1) for _, v in fields)


def _may_change(v: Any, depth: int) -> bool:
    """Whether the field value ``v`` may change in place: a list, an object with such fields, or a
    tuple holding one at any depth (``([1, 2],)``: a frozen dataclass holding it kept its old code)."""
    if depth >= _MAX_FIELD_DEPTH:
        return isinstance(v, tuple | list) or field_values(v) is not None
    if type(v) is list or fields_may_change(v, depth):
        return True
    return isinstance(v, tuple) and any(_may_change(x, depth + 1) for x in v)
