"""Whether folding a captured Python value runs the code of a user's class.

A kernel folds the values it captures through Python (``if cfg:``, ``cfg == FAST``, ``float(v)``,
``len(v)``, ``1 in v``, ``-v``, ``str(v)``). A dataclass instance, a ``SimpleNamespace``, an enum
member or an instance of a subclass of ``int`` / ``float`` / ``str`` is keyed by its value (its
fields, its name and value: frontend/sema/fingerprints.py), not by its class's code; where the
class defines a special method of its own (``__bool__``, ``__eq__``, ``__len__``, ``__float__``,
...), what the fold gives depends on that code, and on whatever the code reads (a module global,
another function). :func:`runs_own_code` says so, and the fold's result is then keyed
(captures.note_fold: part of every key, and computed again at every check in the process).

The code of Python itself, of the standard library's value types (enum, fractions, decimal,
dataclasses, collections), of NumPy and of sparsile is not a user's: it changes with their
versions, which the compile cache keys already. The special methods ``@dataclass`` writes
(``__eq__``, ``__hash__``) compare the fields, which the key holds.
"""

from __future__ import annotations

import functools
import importlib
import types as pytypes
from collections.abc import Iterable
from typing import Any

from .fingerprints import field_values

TRUSTED_MODULES = frozenset({
    "builtins", "abc", "collections", "dataclasses", "decimal", "_decimal", "_pydecimal", "enum", "fractions",
    "numbers", "types", "typing", "reprlib", "functools", "numpy", "ml_dtypes", "sparsile", "torch",
})
"""Top-level modules whose classes and functions are no user's code (their versions key the cache)."""

NOT_FOLDED = frozenset({
    "__init__", "__new__", "__post_init__", "__init_subclass__", "__class_getitem__", "__set_name__",
    "__setattr__", "__delattr__", "__del__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__",
    "__copy__", "__deepcopy__", "__getnewargs__", "__getnewargs_ex__", "__dir__", "__sizeof__",
    "__subclasshook__", "__replace__",
})
"""Special methods no fold in a kernel runs (making, copying, pickling, setting an attribute)."""

_C_CALLABLES = (pytypes.BuiltinFunctionType, pytypes.WrapperDescriptorType, pytypes.MethodDescriptorType,
                pytypes.MethodWrapperType, pytypes.ClassMethodDescriptorType, pytypes.GetSetDescriptorType,
                pytypes.MemberDescriptorType)

_MAX_DEPTH = 8

_HEAP_TYPE = 1 << 9
"""``Py_TPFLAGS_HEAPTYPE``: a class made by a ``class`` statement (Python's own, ``int``, are static)."""


def runs_own_code(values: Iterable[Any]) -> bool:
    """Whether one of ``values`` (in a tuple or list, or a field of a dataclass instance or
    namespace, too) is an instance of a class that defines a special method of a user's code."""
    seen: set[int] = set()
    return any(_runs_own_code(v, 0, seen) for v in values)


_PLAIN_KINDS = frozenset({bool, int, float, complex, str, bytes, type(None)})


def _runs_own_code(obj: Any, depth: int, seen: set[int]) -> bool:
    if type(obj) in _PLAIN_KINDS:  # (most folds: `BLOCK * 2`)
        return False
    if id(obj) in seen or depth > _MAX_DEPTH:
        return False
    seen.add(id(obj))
    kind = type(obj)
    if own_code(kind):
        return True
    if isinstance(obj, tuple | list):
        return any(_runs_own_code(x, depth + 1, seen) for x in obj)
    if kind is not pytypes.SimpleNamespace and _trusted(getattr(kind, "__module__", None)):
        return False  # (the language's types, NumPy's: no value of a user's among their fields)
    fields = field_values(obj)
    return fields is not None and any(_runs_own_code(v, depth + 1, seen) for _, v in fields)


def own_code(cls: type) -> bool:
    """Whether ``cls`` (or a class it inherits from) defines a special method in a user's code: a
    Python function (a ``staticmethod``, ``classmethod`` or ``property`` of one too) of a module
    outside :data:`TRUSTED_MODULES`, not written by ``@dataclass``, or a callable object."""
    for c in cls.__mro__:
        module = getattr(c, "__module__", None)
        if _trusted(module) and (module != "builtins" or not c.__flags__ & _HEAP_TYPE):
            continue  # (a class `exec`ed without `__name__` says "builtins": a heap type, unlike int's)
        for name, attr in vars(c).items():
            if name.startswith("__") and name.endswith("__") and name not in NOT_FOLDED and _user_callable(attr):
                return True
    return False


def _trusted(module: Any) -> bool:
    return isinstance(module, str) and module.split(".")[0] in TRUSTED_MODULES


def _user_callable(attr: Any) -> bool:
    if isinstance(attr, staticmethod | classmethod):
        attr = attr.__func__
    elif isinstance(attr, property):
        attr = attr.fget
    if attr is None or isinstance(attr, (*_C_CALLABLES, type)):
        return False
    code = getattr(attr, "__code__", None)
    if not isinstance(code, pytypes.CodeType):
        return callable(attr)
    for _ in range(_MAX_DEPTH):  # a Python function, and the functions it wraps (`__wrapped__`)
        if _user_code(attr, code):
            return True
        attr = getattr(attr, "__wrapped__", None)
        code = getattr(attr, "__code__", None)
        if not isinstance(code, pytypes.CodeType):
            return attr is not None and callable(attr) and not isinstance(attr, _C_CALLABLES)
    return True


def _user_code(function: Any, code: pytypes.CodeType) -> bool:
    """Whether a Python function is a user's: not of a trusted module, nor compiled from text by
    ``@dataclass`` (:func:`_dataclass_written`), nor a wrapper that a trusted module wrote
    (``@dataclass``'s ``__repr__`` guard, whose ``__module__`` is the class's)."""
    return (not _trusted(getattr(function, "__module__", None)) and not _dataclass_written(code)
            and code.co_filename not in _trusted_files())


def _dataclass_written(code: pytypes.CodeType) -> bool:
    """Whether ``code`` is of a method ``@dataclass`` wrote: compiled from text (file "<string>")
    inside its ``__create_fn__``. Other code compiled from text (a class a factory ``exec``s) is a
    user's: its special methods may read what no key holds."""
    return code.co_filename == "<string>" and code.co_qualname.startswith("__create_fn__.<locals>.")


@functools.cache
def _trusted_files() -> frozenset[str]:
    """The files of the standard library's modules among :data:`TRUSTED_MODULES`."""
    files = set()
    for name in ("abc", "collections", "dataclasses", "enum", "fractions", "functools", "numbers", "reprlib",
                 "types", "typing", "_pydecimal"):
        try:
            files.add(importlib.import_module(name).__file__)
        except ImportError:  # (a Python without the pure-Python decimal)
            continue
    return frozenset(f for f in files if f)


class ClassKey:
    """A class in a specialization key: equal to itself alone (two classes of one qualified name, a
    module imported again with another ``__eq__``, fold to other code: :func:`runs_own_code`),
    spelled by its qualified name in the disk key (the key's repr)."""

    __slots__ = ("cls",)

    def __init__(self, cls: type):
        self.cls = cls

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClassKey) and other.cls is self.cls

    def __hash__(self) -> int:
        return id(self.cls)

    def __repr__(self) -> str:
        return repr(f"{self.cls.__module__}.{self.cls.__qualname__}")
