"""How Python objects seen by a ``@jit`` kernel become sema values.

Names a decorated function reads from its module or closure are compile-time constants: numbers,
strings, tuples, dtypes, the ``sparsile`` module and its builtins, other ``@jit`` functions (inlined
as helpers), and Python modules (whose attributes are wrapped the same way on access).
"""

from __future__ import annotations

import types as pytypes
from typing import Any

from ..ir import types as T
from .builtins import ROOT
from .consts import typed_constant
from .values import Builtin, Const, HelperFunction, Namespace


def wrap_python_value(obj: Any) -> Any:
    """The sema value for a Python object read by a kernel."""
    if isinstance(obj, Builtin | Namespace | HelperFunction):
        return obj
    if isinstance(obj, pytypes.ModuleType) and obj.__name__ == "sparsile":
        return ROOT
    alias = _builtin_alias(obj)
    if alias is not None:
        return alias
    if isinstance(obj, bool | int | float | str) or obj is None:
        return Const(obj)
    if isinstance(obj, T.Type):
        return Const(obj)
    if isinstance(obj, T.TypedConstant):  # `C = sp.u8(250)` in the module: what `u8(250)` is in the kernel
        try:
            return typed_constant(obj)
        except ValueError:
            return Const(obj)  # no value: any use of it reports what it is
    if isinstance(obj, tuple | list):
        return tuple(wrap_python_value(x) for x in obj)
    try:
        import numpy as np

        if isinstance(obj, np.integer):
            return Const(int(obj))
        if isinstance(obj, np.floating):
            return Const(float(obj))
        if isinstance(obj, np.dtype | type) and obj is not type:
            t = T.from_numpy_dtype(np.dtype(obj)) if _is_numpy_dtype_like(obj) else None
            if t is not None:
                return Const(t)
    except Exception:  # an object numpy cannot interpret stays a plain constant
        pass
    return Const(obj)


def _is_numpy_dtype_like(obj: Any) -> bool:
    import numpy as np

    try:
        np.dtype(obj)
        return True
    except TypeError:
        return False


def _builtin_alias(obj: Any) -> Any:
    """The language builtin a Python-side API object stands for inside a kernel (``sparsile.load``
    reads ``.spk`` files from Python and is the memory ``load`` in a kernel)."""
    if not callable(obj):
        return None
    try:
        name = getattr(obj, "__sparsile_builtin__", None)
    except Exception:  # an object with a failing __getattr__ is just a constant
        return None
    return ROOT.members.get(name) if isinstance(name, str) else None
