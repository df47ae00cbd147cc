"""The per-call checks of a prepared launch's constexpr arguments (SP0718: the value it was prepared
for, :func:`constexpr_check`) and unannotated scalar arguments (SP0736: the type it was prepared
for, :func:`typed_scalar_writer`).

``kernel[grid]`` types the scalar given for an unannotated run-time parameter by the value
(docs/language.md, "Parameter types"): a Python int as ``i32`` (``i64`` outside its range), a float
as ``f32``, a bool as ``bool``, a NumPy or ml_dtypes scalar as its own type (``np.int8(100)`` is an
``i8``). A launch prepared for one of these types compiled that type's kernel, so a per-call scalar
``kernel[grid]`` would type otherwise would compute in the prepared type where ``kernel[grid]``
computes in its own (``a + a`` wraps in ``i8`` on one path and not on the other): it is refused,
naming both types. A parameter annotated with a scalar type takes any number in its type on both
paths and is not checked here. An array, even a 0-d one (``np.array(3)``, ``torch.tensor(5)``), is
refused too: ``kernel[grid]`` passes it as a pointer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend.runtime.arguments import CONSTEXPR, constexpr_equal, describe_value
from ..frontend.diagnostics import LaunchError
from ..frontend.ir import types as T
from ..frontend.sema.specialize import ParamInfo, arg_spec, is_array_like

PREPARED_SCALAR_TYPE = "SP0736"
"""A prepared launch given, for an unannotated scalar parameter, a value ``kernel[grid]`` types as
another type than the one the launch was prepared (compiled) for."""

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def constexpr_check(name: str, prepared: Any) -> Callable[[Any, Any], None]:
    """The per-call check of constexpr argument ``name``, prepared for ``prepared``: the same value
    of the same kind (``constexpr_equal``: ``2`` is not ``2.0``, ``np.float16`` is ``sp.f16``), SP0718
    else."""
    def check(v: Any, call: Any) -> None:
        if v is not prepared and not constexpr_equal(v, prepared):
            raise LaunchError(CONSTEXPR, f"argument `{name}` = {describe_value(v)}, but the launch was prepared "
                              f"for {name} = {describe_value(prepared)}", "prepare another launch for this value")

    return check


def typed_scalar_writer(name: str, prepared: T.ScalarType, write: Callable[[Any, Any], None]
                        ) -> Callable[[Any, Any], None]:
    """``write`` (a prepared launch's writer of scalar parameter ``name``, unannotated, prepared for
    type ``prepared``) behind the check that ``kernel[grid]`` types each value as ``prepared``
    (SP0736 else). The common values (a Python int, float or bool of the prepared type) cost one
    type test; a NumPy scalar of the prepared type one set lookup (its class decides its type: it
    is typed once per class, then known by its class, ``np.bool_`` included)."""
    param = ParamInfo(name, None)
    by_type: dict[type, T.Type | None] = {}
    accepted: set[type] = set()
    """NumPy scalar classes ``kernel[grid]`` types as ``prepared``."""

    def refuse(value: Any) -> None:
        """Raise SP0736 if ``kernel[grid]`` types ``value`` otherwise (its own diagnostic, SP0708 for
        a NumPy type the language has none for, if it refuses the value)."""
        cls = type(value)  # (never one of accepted: each check below tests that first)
        if isinstance(value, np.generic):
            given = by_type.get(cls)
            if given is None:
                given = by_type[cls] = arg_spec(param, value).type
                if given == prepared:
                    accepted.add(cls)
                    return
        elif isinstance(value, bool | int | float):
            given = arg_spec(param, value).type
        elif is_array_like(value):  # a 0-d array too: kernel[grid] passes it as a pointer (SP0310 on use)
            raise LaunchError(PREPARED_SCALAR_TYPE, f"argument `{name}` = {describe_value(value)} is an array "
                              f"(`kernel[grid]` passes it as a pointer), but the launch was prepared for the "
                              f"scalar {prepared}", f"pass the number: {_conversion(name, prepared)}, which "
                              f"`kernel[grid]` types as {prepared}")
        else:  # (a Fraction, Decimal, complex, str...: kernel[grid]'s SP0708, where the writer took a Fraction)
            given = arg_spec(param, value).type
        if given != prepared and isinstance(given, T.ScalarType):
            raise LaunchError(PREPARED_SCALAR_TYPE, f"argument `{name}` = {describe_value(value)} has type {given} "
                              f"(`kernel[grid]` types it so), but the launch was prepared for {prepared}",
                              f"prepare another launch for {given}; or pass {_spelling(prepared)}, which "
                              f"`kernel[grid]` types as {prepared}; or annotate the parameter "
                              f"`{name}: sp.{prepared}` to take any number as {prepared}")

    if prepared == T.i32:
        def check_i32(value: Any, call: Any) -> None:
            if (type(value) is not int or not _I32_MIN <= value <= _I32_MAX) and type(value) not in accepted:
                refuse(value)
            write(value, call)

        return check_i32
    if prepared == T.i64:
        def check_i64(value: Any, call: Any) -> None:
            if (type(value) is not int or _I32_MIN <= value <= _I32_MAX) and type(value) not in accepted:
                refuse(value)
            write(value, call)

        return check_i64
    fast = float if prepared == T.f32 else bool if prepared == T.bool_ else None

    def check(value: Any, call: Any) -> None:
        if type(value) is not fast and type(value) not in accepted:
            refuse(value)
        write(value, call)

    return check


def _conversion(name: str, t: T.ScalarType) -> str:
    """How the help converts a 0-d array ``name`` to a number ``kernel[grid]`` types as ``t``."""
    python = {T.i32: "int", T.f32: "float", T.bool_: "bool"}.get(t)
    if python is not None:
        return f"`{python}({name})` or `{name}.item()`"
    return f"`{_scalar_class(t)}({name})`"


def _spelling(t: T.ScalarType) -> str:
    """The values ``kernel[grid]`` types as ``t``, as the help names them."""
    if t == T.i32:
        return "a Python int in the i32 range or an np.int32"
    if t == T.i64:
        return "an np.int64 or a Python int outside the i32 range"
    if t == T.f32:
        return "a Python float or an np.float32"
    if t == T.bool_:
        return "a Python or NumPy bool"
    return f"an {_scalar_class(t)}"  # (np. and ml_dtypes. both read with a vowel)


def _scalar_class(t: T.ScalarType) -> str:
    """The NumPy or ml_dtypes scalar class of ``t`` as the help spells it (``np.int8``, ``ml_dtypes.bfloat16``)."""
    cls = T.numpy_dtype(t).type
    return f"{'np' if cls.__module__ == 'numpy' else cls.__module__}.{cls.__name__}"


__all__ = ["PREPARED_SCALAR_TYPE", "constexpr_check", "typed_scalar_writer"]
