"""Scalar kernel arguments: kind and range checks (SP0708, SP0709, and SP0709 for a value the
specialization assumed divisible) and packing into the parameter buffer (:func:`encode_scalar`,
:func:`scalar_writer`; bf16 is rounded by hand)."""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from ...frontend.diagnostics import LaunchError
from ...frontend.ir.scalar_range import check_float_fits, float_overflow_error
from ...frontend.sema.specialize import ML_FLOAT_SCALARS, is_array_like
from .codes import ARG_DTYPE, ARG_KIND, ARG_RANGE
from .dtypes import DTYPES, DTypeInfo, dtype_info


def _int_range(info: DTypeInfo) -> tuple[int, int]:
    if info.category == "bool":
        return 0, 1
    if info.category == "uint":
        return 0, (1 << info.bits) - 1
    return -(1 << (info.bits - 1)), (1 << (info.bits - 1)) - 1


def _bf16_bits(value: float) -> int:
    """Round-to-nearest-even f64 -> bf16 bit pattern (one rounding step: exact rational
    arithmetic via the f64's integer mantissa would be needed only for f64 ties that f32 cannot
    hold; going through f32 first would double-round, so the rounding is done on the f64 bits)."""
    if math.isnan(value):
        return 0x7FC0
    bits64 = struct.unpack("<Q", struct.pack("<d", value))[0]
    sign = (bits64 >> 63) & 1
    magnitude = abs(value)
    if magnitude == 0.0:
        return sign << 15
    if math.isinf(magnitude):
        return (sign << 15) | 0x7F80
    mantissa, exponent = math.frexp(magnitude)  # magnitude = mantissa * 2**exponent, 0.5 <= m < 1
    if exponent > 128:  # >= 2**128: beyond every finite bf16 even before rounding
        return (sign << 15) | 0x7F80
    # bf16: 8 significant bits for normals (exponent >= -125), fewer for subnormals.
    e_min = -125
    precision = 8 if exponent >= e_min else 8 - (e_min - exponent)
    if precision < 0:  # below half the smallest subnormal (2**-134): rounds to zero
        return sign << 15
    scaled = mantissa * (1 << precision)  # exact in f64
    rounded = round(scaled)  # Python rounds half to even
    if rounded == 0:
        return sign << 15
    result = math.ldexp(rounded, exponent - precision)
    if result > 3.3895313892515355e38:  # above the largest finite bf16 after rounding
        return (sign << 15) | 0x7F80
    f32_bits = struct.unpack("<I", struct.pack("<f", result))[0]  # exact: result fits in bf16
    return (sign << 15) | ((f32_bits >> 16) & 0x7FFF)


def encode_scalar(dtype: str, value: Any, name: str = "value") -> bytes:
    """The little-endian bytes of ``value`` as a kernel scalar of ``dtype``, with the range and
    kind checks of the launcher (SP0708 not a number, SP0709 out of range)."""
    info = dtype_info(dtype)
    if info.category == "float":
        number = _to_float(value, name, dtype)
        if dtype in ("e4m3", "e5m2"):
            raise LaunchError(ARG_KIND, f"argument `{name}`: 8-bit float scalars ({dtype}) cannot be "
                              "kernel parameters", "pass the value as f16 or f32 and convert in the kernel")
        check_float_fits(name, value, dtype)  # the rule sema's launch check applies (frontend/ir/scalar_range.py)
        if dtype == "bf16":
            return struct.pack("<H", _bf16_bits(number))
        return struct.pack(info.struct_format, number)
    number = _to_int(value, name, dtype)
    low, high = _int_range(info)
    if not low <= number <= high:
        raise LaunchError(ARG_RANGE, f"argument `{name}` = {number} does not fit in {dtype} "
                          f"(range {low}..{high})", f"pass a value in {low}..{high}")
    return struct.pack(info.struct_format, number)


def _to_int(value: Any, name: str, dtype: str) -> int:
    if isinstance(value, bool | np.bool_):  # numpy's has no __index__; Python's is not taken for a number
        if dtype == "bool":
            return int(value)
        raise LaunchError(ARG_KIND, f"argument `{name}` expects an integer ({dtype}), got {describe_value(value)}",
                          "pass an int (int(flag) for 0 / 1), or annotate the parameter `bool`")
    if isinstance(value, (float, complex, np.floating)) or type(value) in ML_FLOAT_SCALARS:
        # SP0703, as when the call is specialized (sema); ml_dtypes' floats are no np.floating
        raise LaunchError(ARG_DTYPE, f"argument `{name}` expects an integer ({dtype}), got "
                          f"{type(value).__name__} {value!r}", "pass an int (round it explicitly)")
    if is_array_like(value):
        # a 0-d array has __index__, but kernel[grid] refuses an array for a scalar (SP0708, sema)
        raise LaunchError(ARG_KIND, f"argument `{name}` expects an integer ({dtype}), got {describe_value(value)}: "
                          "an array, even of one element, is no scalar", f"pass the number: `int({name})` or "
                          f"`{name}.item()`")
    try:
        return operator.index(value)
    except TypeError:
        raise LaunchError(ARG_KIND, f"argument `{name}` expects an integer ({dtype}), got "
                          f"{describe_value(value)}") from None


def _to_float(value: Any, name: str, dtype: str) -> float:
    if type(value) is float:
        return value
    # (the numbers kernel[grid] takes, sema's arg_spec: no Fraction, no ml_dtypes float other than its
    # bf16 / e4m3 / e5m2 (no np.floating))
    if (isinstance(value, int | float | np.integer | np.floating) or type(value) in ML_FLOAT_SCALARS) \
            and not isinstance(value, bool | np.bool_ | np.timedelta64):
        try:
            return float(value)
        except OverflowError:  # an int past the f64 range (2**1100): SP0709, not Python's OverflowError
            raise float_overflow_error(name, value, dtype) from None
    raise LaunchError(ARG_KIND, f"argument `{name}` expects a number ({dtype}), got {describe_value(value)}")


def scalar_writer(p: Any, offset: int, view: Any) -> Callable[[Any, Any], None]:
    """A converter ``(value, call)`` packing scalar parameter ``p`` (a :class:`ScalarParam`) into
    ``view[offset:]``: Python ints and floats in range are packed directly, anything else goes
    through :func:`encode_scalar` (which raises SP0708/SP0709); an integer the specialization
    assumed divisible is checked (SP0709)."""
    name, dtype, divisor = p.name, p.dtype, p.divisible_by
    info = DTYPES[dtype]
    size = info.itemsize
    packer = struct.Struct(info.struct_format)
    if info.category in ("int", "uint"):
        low, high = _int_range(info)

        def convert_int(value: Any, call: Any) -> None:
            if type(value) is not int or not low <= value <= high:
                view[offset:offset + size] = encode_scalar(dtype, value, name)  # checks and raises
                value = int(value)
            if divisor > 1 and value % divisor:
                check_divisible(name, value, divisor)  # raises SP0709
            packer.pack_into(view, offset, value)

        return convert_int
    if dtype in ("f32", "tf32", "f64"):
        def convert_float(value: Any, call: Any) -> None:
            if type(value) is float:
                try:
                    packer.pack_into(view, offset, value)
                    return
                except OverflowError:
                    pass
            view[offset:offset + size] = encode_scalar(dtype, value, name)

        return convert_float

    def convert_other(value: Any, call: Any) -> None:
        view[offset:offset + size] = encode_scalar(dtype, value, name)

    return convert_other


_ARRAY_SOURCES = {"numpy": "numpy array", "torch": "torch tensor", "cupy": "CuPy array", "jax": "JAX array",
                  "jaxlib": "JAX array"}


def describe_value(value: Any) -> str:
    """A launch argument as the diagnostics show it (SP0708, SP0709, SP0718): an array by its
    element type, kind and shape (``a float32 numpy array of shape (2, 3)``, as SP0703 and SP0720
    name arrays), a NumPy or ml_dtypes scalar by its dtype's name and repr (``int64 np.int64(3)``,
    ``np.longlong(3)`` too), an object whose repr is only its type and address by its type (``a
    `Foo` object``), anything else by its type and repr, cut at 40 characters (``float 2.5``; a class,
    ``np.float16`` given as a dtype, is no array: ``type <class 'numpy.float16'>``)."""
    cls = type(value)
    if not isinstance(value, np.generic | type) and hasattr(value, "shape") and hasattr(value, "dtype"):
        source = _ARRAY_SOURCES.get(cls.__module__.split(".")[0], f"`{cls.__name__}` array")
        try:
            shape = tuple(int(d) for d in value.shape)
        except (TypeError, ValueError):
            shape = None
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a {dtype} {source}" + ("" if shape is None else f" of shape {shape}")
    if cls.__repr__ is object.__repr__:
        return f"a `{cls.__name__}` object"
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    if isinstance(value, np.generic):  # by its dtype: np.longlong(3) is an int64, not a "longlong"
        return f"{value.dtype.name} {text}"
    return f"{cls.__name__} {text}"


def check_divisible(name: str, value: int, divisor: int) -> None:
    if divisor > 1 and value % divisor:
        raise LaunchError(ARG_RANGE, f"argument `{name}` = {value} is not a multiple of {divisor}, but the "
                          f"kernel was specialized assuming it is",
                          "pass a multiple, or recompile the kernel for this value")
