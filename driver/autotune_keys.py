"""The key of one autotuned call (driver/autotune.py): the ``key`` arguments' values (an array by its
shape and dtype), the dtypes of every array argument and the kernel options the call gives, as text
(``n=4096; dtypes: x=float32 out=float32``): the in-memory choice, the disk cache's entry and a
shipped table's row are found by it (docs/autotune.md)."""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..frontend.sema.constexpr_dtypes import dtype_constexpr


def describe(value: Any) -> str:
    """How one argument enters a cache key: an array by its shape and dtype, a scalar (a numpy
    scalar or 0-d array too: ``np.int64(4096)`` is ``4096``, its dtype is among the key's dtypes)
    and anything else by repr (a NaN other than Python's ``float("nan")`` by its bits too, in a tuple
    or list as well: :func:`exact_repr`); a dtype constexpr however spelled (``np.float16``,
    ``np.dtype("float16")``) as the language type it stands for (``sp.f16``'s repr: one
    specialization, one key)."""
    if isinstance(value, type | np.dtype):  # (a NumPy type has `shape` and `dtype` attributes: no array)
        dtype = dtype_constexpr(value)
        return repr(value if dtype is None else dtype)
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        return exact_repr(value)
    shape = array_shape(value)
    if shape == () and hasattr(value, "item"):
        return exact_repr(value.item())
    return f"{shape}:{dtype_name(value.dtype)}"


_CANONICAL_NAN = struct.pack("<d", float("nan"))
_PLAIN: dict[type, Any] = {bool: bool, int: int.__int__, float: float.__float__, str: str.__str__}
"""The plain value of an instance of a subclass of each (``bool`` has none)."""
_SPELLED = (bool, int, str, type(None))
"""Types whose ``repr`` is their key, inside a tuple too."""


def exact_repr(value: Any) -> str:
    """``repr(value)``, except that a NaN whose bits are not ``float("nan")``'s is ``nan(0x...)``
    with its f64 bits, alone or in a tuple or list: ``repr`` is ``nan`` for every payload and sign,
    and a kernel folds the payload (a key of the tuning cache is then one per NaN the code differs
    for; the plain ``nan`` stays spelled as before, as in a shipped table), and that an instance of
    a subclass of ``int``, ``float`` or ``str`` (no enum member) is ``Size(4096)``, its class and
    plain value, whatever its own ``__repr__`` says."""
    kind = type(value)
    if kind not in _PLAIN and isinstance(value, int | float | str) and not isinstance(value, enum.Enum):
        base = next(b for b in _PLAIN if isinstance(value, b))
        return f"{kind.__name__}({exact_repr(_PLAIN[base](value))})"
    if isinstance(value, float) and value != value:
        bits = struct.pack("<d", value)
        return "nan" if bits == _CANONICAL_NAN else f"nan(0x{bits[::-1].hex()})"
    if kind in (tuple, list) and any(type(v) not in _SPELLED for v in value):
        items = [exact_repr(v) for v in value]
        if type(value) is list:
            return f"[{', '.join(items)}]"
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    return repr(value)


def array_shape(value: Any) -> tuple[int, ...]:
    """An array's shape; a ``DeviceBuffer`` made without one has a single dimension: its elements
    (bytes where it has no dtype either)."""
    if value.shape is None:
        typed = getattr(value, "_typed_shape", None)
        return tuple(typed()) if callable(typed) else (int(getattr(value, "nbytes", 0)),)
    return tuple(int(s) for s in value.shape)


def dtype_name(dtype: Any) -> str:
    """``float16`` for numpy's, torch's (``torch.float16``) and cupy's dtypes alike."""
    name = getattr(dtype, "name", None)
    return str(name if isinstance(name, str) else dtype).removeprefix("torch.")


def key_string(key: Sequence[str], bound: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> str:
    """The cache key of one call: ``key``'s argument values, then the dtypes of every array
    argument, then the kernel options the call gives, if any (``n=4096; dtypes: x=float32
    out=float32; options: num_stages=2``)."""
    parts = [f"{name}={describe(bound[name])}" for name in key]
    dtypes = [f"{name}={dtype_name(v.dtype)}" for name, v in bound.items()
              if hasattr(v, "dtype") and hasattr(v, "shape") and not isinstance(v, type)]
    text = ", ".join(parts)
    if dtypes:
        text += ("; " if text else "") + "dtypes: " + " ".join(dtypes)
    if options:
        given = " ".join(f"{k}={describe(v)}" for k, v in sorted(options.items()))
        text += ("; " if text else "") + "options: " + given
    return text
