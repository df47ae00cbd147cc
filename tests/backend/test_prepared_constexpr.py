"""A prepared launch (and a launcher) compiled for one constexpr value refuses another value that
only compares equal to it: ``2.0 == 2``, ``True == 1`` and ``-0.0 == 0.0`` in Python, but each is
another specialization (``-7 // V`` is -3 on ints and -4.0 on floats; ``x * -0.0`` is -0.0). Fake
device of tests/backend/test_prepared.py: the kernel compiles for sm_90a for real, launches are
recorded, nothing runs."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.runtime.arguments import MISSING, constexpr_equal, describe_value
from sparsile.frontend.diagnostics import LaunchError

pytest.importorskip("torch")

from sparsile.tests.backend.test_prepared import arrays, gpu  # noqa: F401  (gpu: a fixture)


@sp.jit
def shift(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, V: sp.constexpr, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=mask) + (offs - 7) // V, mask=mask)


@sp.jit
def shift_by_pair(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, V: sp.constexpr, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=mask) + (offs - 7) // V[0] + V[1], mask=mask)


@sp.jit
def shift_if(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, V: sp.constexpr, BLOCK: sp.constexpr = 256):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    v = sp.load(x + offs, mask=mask)
    if V:  # a flag: takes True and 1 alike (a bool used as a number, `// V`, is SP0723)
        v = v + 1.0
    sp.store(out + offs, v, mask=mask)


@pytest.fixture(autouse=True)
def fresh_launchers():
    """Each test builds its launchers on its own fake device."""
    for k in (shift, shift_by_pair, shift_if):
        k.__dict__.pop("_launchers", None)
        k.__dict__.pop("_fast_launches", None)


@pytest.mark.parametrize(("prepared_for", "other"), [
    (2, 2.0), (2.0, 2), (1, True), (True, 1), (0.0, -0.0), (-0.0, 0.0), (2, np.float32(2.0)),
    (3, np.int64(3)), (np.int8(3), 3), (np.int8(3), np.int16(3)), (2.0, np.float64(2.0)),
])
def test_a_prepared_launch_refuses_an_equal_constexpr_of_another_kind(gpu, prepared_for, other):  # noqa: F811
    gpu.sizes = [8, 8, 4]  # x, out, n
    x, _, out = arrays()
    kernel = shift_if if isinstance(prepared_for, bool) or isinstance(other, bool) else shift
    launch_ = kernel[(4,)].prepare(x, out, 1024, prepared_for)  # V positional: checked per call
    launch_(x, out, 1024, prepared_for)
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, 1024, other)
    assert exc.value.code == "SP0718"
    assert f"the launch was prepared for V = {describe_value(prepared_for)}" in str(exc.value)
    kernel[(4,)](x, out, 1024, other)  # kernel[grid] compiles the other specialization
    assert len(gpu.built) == 2


def test_a_prepared_launch_takes_the_same_value_in_another_spelling(gpu):  # noqa: F811
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    launch_ = shift[(4,)].prepare(x, out, 1024, np.int64(3))
    launch_(x, out, 1024, np.int64(3))  # the same numpy integer: the same typed constant i64(3)
    launch_ = shift_by_pair[(4,)].prepare(x, out, 1024, (2, 3.5))
    launch_(x, out, 1024, [2, 3.5])  # a list is specialized as a tuple
    assert len(gpu.launches) == 2


def test_the_launchers_own_constexpr_check(gpu):  # noqa: F811
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    shift[(4,)](x, out, 1024, 2)
    launcher = next(iter(shift.__dict__["_launchers"].values()))
    launcher((4,), [x, out, 1024, 2, MISSING])
    for other in (2.0, True, np.float64(2.0)):
        with pytest.raises(LaunchError) as exc:
            launcher((4,), [x, out, 1024, other, MISSING])
        assert exc.value.code == "SP0718" and "the kernel was compiled for V = int 2" in str(exc.value)


def test_a_typed_constant_is_its_numpy_scalar(gpu):  # noqa: F811
    """``sp.i8(3)`` and ``np.int8(3)`` are one constant, the i8 3 (frontend/sema/specialize.py):
    a launch prepared (or a launcher compiled) for one refused the other with SP0718. Python's ``3``,
    ``np.int16(3)`` and ``sp.i16(3)`` are still other constants."""
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    for prepared_for, same in ((np.int8(3), sp.i8(3)), (sp.i8(3), np.int8(3)), (sp.i8(3), sp.i8(3))):
        launch_ = shift[(4,)].prepare(x, out, 1024, prepared_for)
        launch_(x, out, 1024, same)
        for other in (3, np.int16(3), sp.i16(3), sp.i8(4)):
            with pytest.raises(LaunchError) as exc:
                launch_(x, out, 1024, other)
            assert exc.value.code == "SP0718"
    shift[(4,)](x, out, 1024, np.int8(3))
    launcher = next(iter(shift.__dict__["_launchers"].values()))  # compiled for np.int8(3)
    launcher((4,), [x, out, 1024, sp.i8(3), MISSING])
    with pytest.raises(LaunchError) as exc:
        launcher((4,), [x, out, 1024, sp.i16(3), MISSING])
    assert exc.value.code == "SP0718" and "the kernel was compiled for V = int8 np.int8(3)" in str(exc.value)


def test_a_launcher_compiled_for_a_tf32_constant_takes_it_again(gpu):  # noqa: F811
    """The launcher held a typed constexpr as its NumPy scalar, and tf32's is float32's: compiled for
    ``sp.tf32(2.0)``, it refused ``sp.tf32(2.0)`` and took ``np.float32(2.0)``, another constant."""
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    shift[(4,)](x, out, 1024, sp.tf32(2.0))
    launcher = next(iter(shift.__dict__["_launchers"].values()))
    launcher((4,), [x, out, 1024, sp.tf32(2.0), MISSING])
    with pytest.raises(LaunchError) as exc:
        launcher((4,), [x, out, 1024, np.float32(2.0), MISSING])
    assert exc.value.code == "SP0718" and "the kernel was compiled for V = TypedConstant tf32(2.0)" in str(exc.value)


def test_constexpr_equal_of_typed_constants():
    assert constexpr_equal(sp.i8(3), np.int8(3)) and constexpr_equal(np.int8(3), sp.i8(3))
    assert constexpr_equal(sp.f16(0.1), np.float16(0.1)) and constexpr_equal(sp.u8(250), np.uint8(250))
    assert constexpr_equal(sp.i8(3), sp.i8(3)) and constexpr_equal((sp.i8(3), 2), (np.int8(3), 2))
    assert not constexpr_equal(sp.i8(3), 3) and not constexpr_equal(3, sp.i8(3))
    assert not constexpr_equal(sp.i8(3), np.int16(3)) and not constexpr_equal(sp.i8(3), sp.i16(3))
    assert not constexpr_equal(sp.f32(-0.0), sp.f32(0.0))  # (equal as dataclasses: -0.0 == 0.0)
    assert not constexpr_equal(sp.f32(-0.0), np.float32(0.0)) and constexpr_equal(sp.f32(-0.0), np.float32(-0.0))
    assert not constexpr_equal(sp.tf32(1.5), np.float32(1.5)) and constexpr_equal(sp.tf32(1.5), sp.tf32(1.5))
    assert not constexpr_equal(sp.f32(1.5), 1.5) and not constexpr_equal(sp.i8(1), True)


def test_constexpr_equal():
    assert constexpr_equal(3, 3) and constexpr_equal(np.int32(3), np.int32(3)) and constexpr_equal(2.5, 2.5)
    # a numpy scalar is the typed constant of its own type (np.int32(3) is i32(3)): not Python's 3 nor np.int16(3)
    assert not constexpr_equal(np.int32(3), 3) and not constexpr_equal(3, np.int32(3))
    assert not constexpr_equal(np.int32(3), np.int16(3)) and not constexpr_equal(2.5, np.float64(2.5))
    assert constexpr_equal(np.float16("nan"), np.float16("nan"))
    assert not constexpr_equal(np.float16(0), np.float16(-0.0))
    assert constexpr_equal(np.True_, True)  # a flag, as Python's bool
    assert constexpr_equal((1, (2.0, "a")), [1, (2.0, "a")]) and constexpr_equal(sp.f16, sp.f16)
    assert constexpr_equal(float("nan"), float("nan"))  # a kernel compiled for NaN is one for NaN
    assert not constexpr_equal(2, 2.0) and not constexpr_equal(True, 1) and not constexpr_equal(0.0, -0.0)
    assert not constexpr_equal((2, 1), (2.0, 1)) and not constexpr_equal((1,), (1, 1))
    assert not constexpr_equal(np.zeros(2), np.zeros(2))  # no truth value: unequal


def test_a_constexpr_tuple_holding_a_typed_constant_launches_and_is_checked(gpu):  # noqa: F811
    """A constexpr tuple holding a NumPy scalar or typed constant, ``(np.int8(3), 2)``, is bound as a
    tuple of constants (not one Const): ``kernel[grid]`` (and a prepared launch, a JAX call) failed
    with an internal KeyError building the launcher, whose launch paths took that binding for a
    run-time argument's. Now the launcher, the fast path and a prepared launch check it as a constexpr."""
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    shift_by_pair[(4,)](x, out, 1024, (np.int8(3), np.float16(0.5)))
    shift_by_pair[(4,)](x, out, 1024, (np.int8(3), np.float16(0.5)))  # the fast path
    assert len(gpu.built) == 1 and len(gpu.launches) == 2
    launcher = next(iter(shift_by_pair.__dict__["_launchers"].values()))
    launcher((4,), [x, out, 1024, (sp.i8(3), np.float16(0.5)), MISSING])
    launch_ = shift_by_pair[(4,)].prepare(x, out, 1024, (np.int8(3), np.float16(0.5)))
    launch_(x, out, 1024, [sp.i8(3), np.float16(0.5)])
    assert len(gpu.launches) == 4
    half = np.float16(0.5)
    for other in ((3, half), (np.int8(3), 0.5), (np.int16(3), half), (np.int8(4), half)):
        for run in (lambda v: launch_(x, out, 1024, v), lambda v: launcher((4,), [x, out, 1024, v, MISSING])):
            with pytest.raises(LaunchError) as exc:
                run(other)
            assert exc.value.code == "SP0718"
    assert len(gpu.launches) == 4


def test_a_grid_function_reads_a_constexpr_tuple_holding_a_typed_constant(gpu):  # noqa: F811
    gpu.sizes = [8, 8, 4]
    x, _, out = arrays()
    shift_by_pair[lambda meta: (meta["V"][0] + 1,)](x, out, 1024, (np.int8(3), 2))
    assert len(gpu.launches) == 1 and tuple(gpu.launches[0]["grid"])[:1] == (4,)
