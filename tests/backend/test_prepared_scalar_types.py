"""A prepared launch takes per call the scalars ``kernel[grid]`` would type as it was prepared.

``kernel[grid](x, out, np.int8(100))`` types an unannotated run-time ``a`` by the NumPy scalar's own
type (``i8``: ``a * a + a`` wraps to 116), Python's ``3`` as ``i32``, ``1.0`` as ``f32``
(docs/language.md, "Parameter types"). A launch prepared for ``a=3`` took ``np.int8(100)`` per call
and packed it as an ``i32`` (10100): the same call gave another result than ``kernel[grid]``.
Prepared for ``1.0`` it took ``np.float64``, ``np.float16``, ``ml_dtypes.bfloat16`` and the int
``2`` as the ``f32`` it was prepared for, and prepared for ``True`` it took ``1``. Now a per-call
scalar of another type than the prepared one is SP0736, naming both types; one of the same type
is packed as ``kernel[grid]`` packs it. A parameter annotated with a scalar type takes the value in
that type on both paths, so it takes any number as before.

Fake device of tests/backend/test_prepared.py: kernels compile for sm_90a for real, launches are
recorded, nothing runs; the numerics that show why the types matter are the interpreter's."""

from __future__ import annotations

import struct
import warnings
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.runtime.arguments import describe_value
from sparsile.frontend.diagnostics import LaunchError

pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

from sparsile.tests.backend.test_prepared import arrays  # noqa: E402
from sparsile.tests.backend.test_prepared import gpu as gpu  # noqa: E402  (the fake device, a fixture)

N = 256
BF16 = ml_dtypes.bfloat16


@sp.jit
def poly(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], a, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < N
    c = a * a + a
    sp.store(out + offs, sp.load(x + offs, mask=mask) + c, mask=mask)


@sp.jit
def poly_i32(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], a: sp.i32, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < N
    c = a * a + a
    sp.store(out + offs, sp.load(x + offs, mask=mask) + c, mask=mask)


@sp.jit
def shift_f32(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], a: sp.f32, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < N
    sp.store(out + offs, sp.load(x + offs, mask=mask) + a, mask=mask)


@pytest.fixture(autouse=True)
def fresh_launchers():
    """Each test builds its launchers on its own fake device."""
    for k in (poly, poly_i32, shift_f32):
        k.__dict__.pop("_launchers", None)
        k.__dict__.pop("_fast_launches", None)


# (prepared for, given per call, the prepared type, the type kernel[grid] gives the other)
OTHER_TYPE = [
    (3, np.int8(100), "i32", "i8"),
    (3, np.int64(3), "i32", "i64"),
    (3, np.uint32(3), "i32", "u32"),
    (3, 2**40, "i32", "i64"),
    (np.int8(3), 3, "i8", "i32"),
    (np.int8(3), np.int16(3), "i8", "i16"),
    (2**40, 5, "i64", "i32"),
    (1.0, np.float64(1.0), "f32", "f64"),
    (1.0, np.float16(1.0), "f32", "f16"),
    (1.0, BF16(1.0), "f32", "bf16"),
    (1.0, 2, "f32", "i32"),
    (np.float16(1.5), 1.5, "f16", "f32"),
    (BF16(1.5), np.float16(1.5), "bf16", "f16"),
    (np.float64(1.5), 1.5, "f64", "f32"),
    (True, 1, "bool", "i32"),
    (1, True, "i32", "bool"),
    (1.0, np.bool_(True), "f32", "bool"),
    (np.bool_(True), np.int8(1), "bool", "i8"),
]

# (prepared for, given per call): one type (and 16-divisibility), so one specialization: the prepared
# launch packs what kernel[grid] packs
SAME_TYPE = [
    (3, np.int32(-7)), (3, -2**31 + 1), (np.int8(3), np.int8(-100)), (np.uint8(3), np.uint8(250)),
    (2**40 + 1, np.int64(5)), (2**40 + 1, -2**40 - 1), (1.0, np.float32(2.5)), (1.0, 1e30),
    (np.float16(1.5), np.float16(-300.0)), (BF16(1.5), BF16(3.25)), (np.float64(1.5), np.float64(1e300)),
    (True, np.bool_(False)), (np.bool_(True), False),
]


def _size(value: Any) -> int:
    """The bytes of the kernel parameter ``kernel[grid]`` makes of ``value``."""
    if isinstance(value, bool | np.bool_):
        return 1
    if isinstance(value, np.generic):
        return value.itemsize
    if isinstance(value, float):
        return 4
    return 4 if -2**31 <= value < 2**31 else 8


def _ids(cases: list[tuple[Any, ...]]) -> list[str]:
    return [f"{type(c[0]).__name__}({c[0]})-{type(c[1]).__name__}({c[1]})" for c in cases]


@pytest.mark.parametrize(("prepared_for", "other", "prepared_type", "other_type"), OTHER_TYPE, ids=_ids(OTHER_TYPE))
def test_a_prepared_launch_refuses_a_scalar_kernel_grid_types_otherwise(gpu: Any, prepared_for: Any, other: Any,
                                                                         prepared_type: str, other_type: str) -> None:
    gpu.sizes = [8, 8, _size(prepared_for)]
    x, _, out = arrays()
    launch_ = poly[(1,)].prepare(x, out, prepared_for)
    launch_(x, out, prepared_for)
    assert len(gpu.launches) == 1
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, other)
    assert exc.value.code == "SP0736"
    assert exc.value.message == (f"argument `a` = {describe_value(other)} has type {other_type} (`kernel[grid]` "
                                 f"types it so), but the launch was prepared for {prepared_type}")
    assert f"prepare another launch for {other_type}; or pass " in exc.value.help
    assert f"which `kernel[grid]` types as {prepared_type}; or annotate the parameter `a: sp.{prepared_type}`" \
        in exc.value.help
    assert len(gpu.launches) == 1  # nothing launched
    launch_(x, out, prepared_for)  # still usable afterwards
    poly[(1,)](x, out, other)  # kernel[grid] compiles the other type's specialization
    assert len(gpu.built) == 2
    assert gpu.built[-1].params[2].dtype == other_type


@pytest.mark.parametrize(("prepared_for", "same"), SAME_TYPE, ids=_ids(SAME_TYPE))
def test_a_prepared_launch_packs_a_scalar_of_its_type_as_kernel_grid_does(gpu: Any, prepared_for: Any,
                                                                         same: Any) -> None:
    gpu.sizes = [8, 8, _size(same)]
    x, _, out = arrays()
    poly[(1,)](x, out, same)
    launch_ = poly[(1,)].prepare(x, out, prepared_for)
    assert len(gpu.built) == 1  # one specialization
    launch_(x, out, same)
    assert gpu.launches[-1]["params"] == gpu.launches[0]["params"]


@pytest.mark.parametrize("value", [np.int8(100), np.int64(7), np.uint16(9), 5], ids=str)
def test_an_annotated_parameter_takes_any_integer_in_its_type_on_both_paths(gpu: Any, value: Any) -> None:
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    launch_ = poly_i32[(1,)].prepare(x, out, 3)
    launch_(x, out, value)
    poly_i32[(1,)](x, out, value)
    assert len(gpu.built) == 1
    assert gpu.launches[-1]["params"] == gpu.launches[-2]["params"]
    assert gpu.launches[-1]["params"][2] == struct.pack("<i", int(value))


def _reference(a: Any) -> float:
    """``a * a + a`` as NumPy computes it in ``a``'s type (an i8 wraps, an f16 overflows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(a * a + a)


@pytest.mark.parametrize(("typed", "untyped"), [(np.int8(100), 100), (np.float16(300.0), 300.0),
                                                (BF16(1.0078125), 1.0078125)], ids=str)
def test_the_two_types_compute_differently_in_the_interpreter(typed: Any, untyped: Any) -> None:
    """Why the prepared launch may not convert: the same value in the two types gives two results
    (the interpreter, against NumPy's arithmetic in each type)."""
    x = np.random.default_rng(55).uniform(-4.0, 4.0, N).astype(np.float32)
    results = []
    for a, c in ((typed, _reference(typed)), (untyped, float(np.float32(untyped) * np.float32(untyped)
                                                              + np.float32(untyped)))):
        out = np.full(N, np.nan, np.float32)
        poly.interpret[(1,)](x, out, a)
        ref = x.astype(np.float64) + c
        np.testing.assert_allclose(out, ref, rtol=2 * np.finfo(np.float32).eps, atol=0)
        results.append(out)
    assert not np.array_equal(results[0], results[1])


@pytest.mark.parametrize(("prepared", "value"), [("bool_", np.bool_(False)), ("i32", np.int32(7)),
                                                 ("f32", np.float32(2.5)), ("i8", np.int8(3)),
                                                 ("f16", np.float16(1.5))], ids=str)
def test_the_per_call_type_check_types_a_numpy_class_once(monkeypatch: pytest.MonkeyPatch, prepared: str,
                                                         value: Any) -> None:
    """The check runs on every call of a prepared launch (its fast path): a NumPy scalar of the
    prepared type is typed once per NumPy class, then let through on its class alone. ``np.bool_``
    was typed (``arg_spec``) on every call, and every NumPy class compared two language types per
    call: 0.6-2.5 us a call, against about 0.1 us for a Python number. Refusals stay per call."""
    from sparsile.driver import prepared_checks
    from sparsile.frontend.ir import types as T

    typed: list[Any] = []
    real_arg_spec = prepared_checks.arg_spec
    monkeypatch.setattr(prepared_checks, "arg_spec", lambda p, v: typed.append(v) or real_arg_spec(p, v))
    written: list[Any] = []
    check = prepared_checks.typed_scalar_writer("a", getattr(T, prepared), lambda v, call: written.append(v))
    check(value, None)
    compared: list[Any] = []
    real_eq = T.ScalarType.__eq__
    monkeypatch.setattr(T.ScalarType, "__eq__", lambda a, b: compared.append(b) or real_eq(a, b))
    for _ in range(4):
        check(value, None)
    monkeypatch.setattr(T.ScalarType, "__eq__", real_eq)
    assert written == [value] * 5
    assert len(typed) == 1
    assert compared == []  # (a dataclass comparison: about 0.3 us each)
    other = np.int64(1) if not isinstance(value, np.int64) else np.int32(1)
    for _ in range(2):  # another type is refused on every call, nothing written
        with pytest.raises(LaunchError) as exc:
            check(other, None)
        assert exc.value.code == "SP0736"
    assert written == [value] * 5


# (prepared for, a 0-d array given per call, the prepared type, the conversion the help names)
ZERO_D = [
    (3, np.array(3), "i32", "int"),
    (3, np.array(3, np.int32), "i32", "int"),
    (2**40, np.array(2**40), "i64", "np.int64"),
    (1.0, np.array(2.5, np.float32), "f32", "float"),
    (True, np.array(True), "bool", "bool"),
]


@pytest.mark.parametrize(("prepared_for", "array", "prepared_type", "conversion"), ZERO_D,
                         ids=[f"{c[2]}-{c[1].dtype}" for c in ZERO_D])
def test_a_prepared_launch_refuses_a_0d_array_kernel_grid_passes_as_a_pointer(
        gpu: Any, prepared_for: Any, array: Any, prepared_type: str, conversion: str) -> None:
    """``kernel[grid]`` types a 0-d array given for an unannotated parameter as a pointer (SP0310
    where the kernel computes with it); the prepared launch took it as the number it holds."""
    gpu.sizes = [8, 8, _size(prepared_for)]
    x, _, out = arrays()
    launch_ = poly[(1,)].prepare(x, out, prepared_for)
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, array)
    assert exc.value.code == "SP0736"
    assert exc.value.message == (f"argument `a` = a {array.dtype} numpy array of shape () is an array (`kernel[grid]` "
                                 f"passes it as a pointer), but the launch was prepared for the scalar {prepared_type}")
    assert exc.value.help.startswith(f"pass the number: `{conversion}(a)`")
    assert ("`a.item()`" in exc.value.help) == (conversion in ("int", "float", "bool"))
    assert exc.value.help.endswith(f", which `kernel[grid]` types as {prepared_type}")
    assert gpu.launches == []  # nothing launched
    launch_(x, out, prepared_for)  # still usable afterwards
    assert len(gpu.launches) == 1


def test_a_prepared_launch_refuses_a_0d_torch_tensor(gpu: Any) -> None:
    torch = pytest.importorskip("torch")
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    launch_ = poly[(1,)].prepare(x, out, 3)
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, torch.tensor(5))
    assert exc.value.code == "SP0736"
    assert exc.value.message == ("argument `a` = a int64 torch tensor of shape () is an array (`kernel[grid]` passes "
                                 "it as a pointer), but the launch was prepared for the scalar i32")
    assert gpu.launches == []


@pytest.mark.parametrize("array", [np.array(3), np.array(3, np.int8)], ids=["int64", "int8"])
def test_an_annotated_prepared_launch_refuses_a_0d_array_as_kernel_grid_does(gpu: Any, array: Any) -> None:
    """``kernel[grid]`` refuses a 0-d array for ``a: sp.i32`` (SP0708); the prepared launch packed
    the number it holds."""
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    launch_ = poly_i32[(1,)].prepare(x, out, 3)
    poly_i32[(1,)](x, out, 3)
    poly_i32[(1,)](x, out, 3)  # kernel[grid]'s cached launch too
    with pytest.raises(LaunchError) as grid_exc:
        poly_i32[(1,)](x, out, array)
    assert grid_exc.value.code == "SP0708"
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, array)
    assert exc.value.code == "SP0708"
    assert exc.value.message == (f"argument `a` expects an integer (i32), got a {array.dtype} numpy array of "
                                 f"shape (): an array, even of one element, is no scalar")
    assert exc.value.help == "pass the number: `int(a)` or `a.item()`"
    assert len(gpu.launches) == 2  # kernel[grid]'s two


@pytest.mark.parametrize(("alias", "message"), [
    (np.longlong(3), "argument `a` = int64 np.int64(3) has type i64"),
    (np.ulonglong(3), "argument `a` = uint64 np.uint64(3) has type u64"),
    (np.intc(3), "argument `a` = int32 np.int32(3) has type i32"),
    (np.uintc(3), "argument `a` = uint32 np.uint32(3) has type u32"),
], ids=str)
def test_sp0736_names_a_numpy_scalar_by_its_dtype_not_its_alias_class(gpu: Any, alias: Any, message: str) -> None:
    """``np.longlong`` is a class of its own beside ``np.int64`` on Linux (one dtype, int64; on
    Windows ``np.intc`` beside ``np.int32``): the message named the value by its class
    (``longlong np.int64(3)``), now by its NumPy dtype."""
    gpu.sizes = [8, 8, 1]
    x, _, out = arrays()
    launch_ = poly[(1,)].prepare(x, out, np.int8(3))
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, alias)
    assert exc.value.code == "SP0736"
    assert exc.value.message == message + " (`kernel[grid]` types it so), but the launch was prepared for i8"
    assert describe_value(alias) == message.split(" = ")[1].removesuffix(" has type " + message.split()[-1])


@pytest.mark.parametrize(("prepared_for", "value", "found"), [
    (1.0, Fraction(1, 3), "Fraction"), (1.0, Decimal("1.5"), "Decimal"), (1.0, complex(1, 0), "complex"),
    (3, Fraction(3, 1), "Fraction"), (3, Decimal(3), "Decimal"), (True, Fraction(1), "Fraction"),
], ids=str)
def test_a_prepared_launch_refuses_a_number_kernel_grid_refuses(gpu: Any, prepared_for: Any, value: Any,
                                                               found: str) -> None:
    """``kernel[grid]`` takes no ``Fraction``, ``Decimal`` or complex for an unannotated scalar
    (SP0708); a launch prepared for a float packed ``Fraction(1, 3)`` as the f32 0.33333334, and the
    others were refused by the writer in other words. Both paths now refuse alike."""
    gpu.sizes = [8, 8, _size(prepared_for)]
    x, _, out = arrays()
    launch_ = poly[(1,)].prepare(x, out, prepared_for)
    with pytest.raises(LaunchError) as grid_exc:
        poly[(1,)](x, out, value)
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, value)
    assert (exc.value.code, exc.value.message) == (grid_exc.value.code, grid_exc.value.message)
    assert exc.value.code == "SP0708"
    assert exc.value.message == f"argument `a` expects a scalar, found {found}"
    assert gpu.launches == []


@pytest.mark.parametrize("value", [Fraction(1, 3), Decimal("1.5"), np.timedelta64(3),
                                   ml_dtypes.float8_e4m3b11fnuz(2), ml_dtypes.float8_e4m3fnuz(2)], ids=repr)
def test_an_annotated_float_parameter_refuses_a_fraction_on_both_paths(gpu: Any, value: Any) -> None:
    """``kernel[grid]`` refuses a ``Fraction`` for ``a: sp.f32`` (SP0708), and an ml_dtypes float
    other than bf16 / e4m3 / e5m2; the prepared launch's writer took any ``numbers.Real`` and any
    ml_dtypes scalar, and packed ``Fraction(1, 3)`` as 0.33333334."""
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    launch_ = shift_f32[(1,)].prepare(x, out, 1.0)
    with pytest.raises(LaunchError) as grid_exc:
        shift_f32[(1,)](x, out, value)
    assert grid_exc.value.code == "SP0708"
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, value)
    assert exc.value.code == "SP0708"
    assert exc.value.message == f"argument `a` expects a number (f32), got {describe_value(value)}"
    assert gpu.launches == []
    launch_(x, out, 2)  # an int is a number for an f32 on both paths
    shift_f32[(1,)](x, out, 2)
    assert gpu.launches[0]["params"][2] == gpu.launches[1]["params"][2] == struct.pack("<f", 2.0)


@pytest.mark.parametrize("value", [BF16(2.5), ml_dtypes.float8_e4m3fn(2), np.float16(2)], ids=repr)
def test_an_annotated_integer_parameter_refuses_an_ml_dtypes_float_as_kernel_grid_does(gpu: Any, value: Any) -> None:
    """``kernel[grid]`` refuses a float for ``a: sp.i32`` as SP0703 (a float given for an integer);
    the prepared launch's writer knew NumPy's floats but not ml_dtypes' (no ``np.floating``), and
    answered SP0708 for ``ml_dtypes.bfloat16(2.5)``."""
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    launch_ = poly_i32[(1,)].prepare(x, out, 3)
    with pytest.raises(LaunchError) as grid_exc:
        poly_i32[(1,)](x, out, value)
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, value)
    assert grid_exc.value.code == exc.value.code == "SP0703"
    assert exc.value.message == f"argument `a` expects an integer (i32), got {type(value).__name__} {value!r}"
    assert gpu.launches == []
