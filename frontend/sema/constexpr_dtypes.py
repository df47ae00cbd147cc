"""Dtypes of launch arguments: an array's element type (:func:`dtype_of`) and the language type a
dtype given as a constexpr stands for, however it is spelled (:func:`dtype_constexpr`: ``sp.f16``,
``np.float16``, ``np.dtype("float16")`` are one constexpr; docs/language.md, "Parameter types"),
with SP0723 for a NumPy or torch dtype the language has no type for."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..diagnostics import LaunchError
from ..ir import types as T

_DTYPE_NAMES = {"float16": T.f16, "bfloat16": T.bf16, "float32": T.f32, "float64": T.f64, "int8": T.i8,
                "uint8": T.u8, "int16": T.i16, "int32": T.i32, "int64": T.i64, "bool": T.bool_,
                "float8_e4m3fn": T.e4m3, "float8_e5m2": T.e5m2, "uint32": T.u32, "uint16": T.u16,
                "uint64": T.u64}
_dtype_memo: dict[Any, T.ScalarType | None] = {}
"""Element type per dtype object already seen (numpy, torch, cupy and jax dtypes are hashable):
the launch path asks for every array argument of every call."""


def dtype_of(obj: Any) -> T.ScalarType | None:
    """The element type of an array-like argument (numpy, torch, cupy, jax, MetadataBuffer)."""
    dt = getattr(obj, "dtype", None)
    if dt is None:
        return None
    if type(dt) is str and dt in T.SCALAR_TYPES:  # a DeviceBuffer's language dtype ("i8" is not numpy's int64)
        return T.SCALAR_TYPES[dt]
    try:
        return _dtype_memo[dt]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    try:
        found: T.ScalarType | None = T.from_numpy_dtype(np.dtype(dt))
    except TypeError:
        found = _DTYPE_NAMES.get(str(dt).replace("torch.", ""))
    try:
        _dtype_memo[dt] = found
    except TypeError:
        pass
    return found


def dtype_constexpr(v: Any) -> T.ScalarType | None:
    """The element type a dtype given as a constexpr argument stands for, however it is spelled
    (``np.float16``, ``np.dtype("float16")``, ``ml_dtypes.bfloat16``, an object with a ``dtype``
    and no ``shape``: each is ``f16`` / ``bf16`` as ``sp.f16`` is; Python's ``float`` / ``int`` /
    ``bool`` as NumPy reads them, ``f64`` / ``i64`` / ``bool``, not the ``f32`` / ``i32`` of a
    Python float or int value: docs/language.md, "Parameter types"), or None for any other value
    (numbers, strings, NumPy scalars, ``sp`` types themselves: ``specialize.constexpr_value`` takes
    those first). The launcher's and a prepared launch's constexpr check compare by it too
    (``backend/runtime/params.py``), and so does the autotuning key, so every spelling of one type
    is one constexpr on every path."""
    if isinstance(v, type) or isinstance(v, np.dtype):
        try:
            return T.from_numpy_dtype(np.dtype(v))
        except (TypeError, ValueError):
            return None
    if hasattr(v, "dtype") and not hasattr(v, "shape") and not isinstance(v, np.generic | T.Type):
        return dtype_of(v)
    return None


_DTYPES_HELP = ("pass a dtype of the language (sp.f16, sp.bf16, sp.f32, sp.i8, ...) or its NumPy type (np.float16, "
                "ml_dtypes.bfloat16, np.float32, np.int8, ...)")


def unsupported_dtype_error(name: str, v: Any, depth: int = 0) -> LaunchError | None:
    """SP0723 for constexpr argument ``name`` = ``v``, a dtype :func:`dtype_constexpr` has no
    language type for: a NumPy one (``np.complex64``, ``np.dtype("complex64")``) or a torch one
    (``torch.float16``: the help names ``sp.f16``); None for any other value. ``depth``: how deep
    in a tuple or list ``v`` is."""
    within = " (inside a tuple or list)" if depth else ""
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return LaunchError("SP0723", f"constexpr argument `{name}` is the dtype {_dtype_shown(v)}, which has no type "
                           f"in the language{within}", help=_DTYPES_HELP)
    if type(v).__module__ == "torch" and type(v).__name__ == "dtype":  # torch.float16
        same = _DTYPE_NAMES.get(str(v).removeprefix("torch."))
        return LaunchError("SP0723", f"constexpr argument `{name}` is the torch dtype {v}{within}: a constexpr "
                           "dtype is the language's or NumPy's",
                           help=f"pass sp.{same} (or {_dtype_shown(T.numpy_dtype(same).type)})" if same is not None
                           else _DTYPES_HELP)
    return None


def _dtype_shown(v: Any) -> str:
    """A dtype object as SP0723 names it: ``np.complex64``, ``ml_dtypes.bfloat16``, ``dtype('complex64')``."""
    if isinstance(v, type):
        module = v.__module__.split(".")[0]
        return f"{'np' if module == 'numpy' else module}.{v.__name__}"
    return repr(v)


__all__ = ["dtype_constexpr", "dtype_of", "unsupported_dtype_error"]
