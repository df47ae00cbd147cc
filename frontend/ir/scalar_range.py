"""The one rule for a float scalar argument that overflows its type, shared by the launch-time
checks of the frontend (frontend/sema/specialize.py, the interpreter's launch) and the GPU launcher
(backend/runtime/scalars.py), so that both refuse the same values with the same diagnostic. It lives
in the frontend, which the backend may import and which may not import the backend
(docs/architecture.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..diagnostics import LaunchError

FLOAT_OVERFLOW = {"f16": 2**16 - 2**4, "bf16": 2**128 - 2**119, "f32": 2**128 - 2**103, "tf32": 2**128 - 2**103,
                  "f64": 2**1024 - 2**970}
"""Per float type, the least magnitude that rounds (to nearest, ties to even) to infinity: half an
ulp above its largest finite value. Exact integers, so that a Python int or float compares exactly."""

ARG_RANGE = "SP0709"
"""The code of an argument out of its parameter type's range."""

OVERFLOW_HELP = "pass a smaller value, or use a wider scalar type in the kernel"


def float_overflows(value: Any, type_name: str) -> bool:
    """Whether the finite number ``value`` rounds to infinity as a scalar of float type ``type_name``
    (False for other types, and for infinities and NaN, which are values of every float type). An
    integer is rounded to f64 first, as the launcher converts it (``2**128 - 2**103 - 1`` rounds onto
    the f32 midpoint, so overflows f32); one past the f64 range overflows every type."""
    limit = FLOAT_OVERFLOW.get(type_name)
    if limit is None or (isinstance(value, float | np.floating) and not math.isfinite(value)):
        return False
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    return abs(number) >= limit  # (a float compares exactly with the integer limit)


def float_overflow_error(name: str, value: Any, type_name: str) -> LaunchError:
    """The LaunchError SP0709 for argument ``name`` = ``value`` that overflows ``type_name``."""
    return LaunchError(ARG_RANGE, f"argument `{name}` = {value!r} overflows {type_name}", OVERFLOW_HELP)


def check_float_fits(name: str, value: Any, type_name: str) -> None:
    """LaunchError SP0709 for a finite number ``value`` given to scalar parameter ``name`` of float
    type ``type_name`` that rounds to infinity there (``a: f32`` given ``1e39`` or ``2**200``): see
    :func:`float_overflows`. The launcher refuses it; the interpreter would have made it inf."""
    if float_overflows(value, type_name):
        raise float_overflow_error(name, value, type_name)
