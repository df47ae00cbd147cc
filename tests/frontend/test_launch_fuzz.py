"""Fuzz of the interpreter launch path and the ahead-of-time compile path with wrong arguments and
malformed kernels: every failure must be a sparsile error (``SparsileError``: CompileError,
LaunchError, ...) with an ``SPxxxx`` code, never a bare Python exception from the internals
(TypeError, ValueError, KeyError, an InternalError, RecursionError).

Hypothesis draws a kernel (well formed, of every parameter kind, or malformed), a path (a launch
through ``kernel.interpret[grid]``, ``kernel.ir``, ``kernel.compile`` with a dict or a text
signature, a grid) and a wrong value for one argument: a string, None, a float (NaN, inf), a nested
list, a numpy scalar, a 0-d array, a negative size, an int past 2**63, a non-contiguous array, an
array of a wrong dtype or rank, an object. The CI profile is derandomized (conftest.py). The
mutation fuzzer of the shipped ``.spk`` kernels is tests/fuzz (``sparsile check`` and PTX)."""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sparsile as sp
from sparsile.frontend.diagnostics import SparsileError

CODE = re.compile(r"^SP\d{4}$")

GOOD = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, a: f32, flag: bool, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    v = load(x + offs, mask=mask) * a
    if flag:
        v = -v
    store(out + offs, v, mask=mask)
"""

UNTYPED = """
@kernel
def k(x, out, n, S: constexpr = (4, 4), D: constexpr = f32):
    offs = arange(0, S[0] * S[1])
    store(out + offs, load(x + offs, mask=offs < n).to(D), mask=offs < n)
"""

TENSOR = """
@kernel
def k(t: tensor[f32, 2], out: ptr[f32], BM: constexpr = 4):
    tile = t.load_tile((0, 0), (BM, BM))
    store(out + arange(0, BM), sum(tile, axis=1))
"""

LOOPS = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i64, STEP: constexpr = 4, UNROLL: constexpr = 2):
    acc = 0.0
    for i in range(0, n, STEP):
        acc += load(x + i)
    for j in static_range(UNROLL):
        acc += 1.0
    store(out, acc)
"""

MALFORMED = [
    "@kernel\ndef k(x: ptr[f32], n: i32, BLOCK: constexpr = 16):\n    offs = arange(0, BLOCK\n",
    "@kernel\ndef k(x: ptr[f32], n: i32, BLOCK: constexpr = 16):\n    y = undefined_name + 1\n",
    "@kernel\ndef k(x: ptr[nope], n: i32):\n    pass\n",
    "@kernel\ndef k(x: ptr[f32], n: i32, BLOCK: constexpr = missing):\n    pass\n",
    "@kernel(num_warps='four')\ndef k(x: ptr[f32], n: i32):\n    pass\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    store(x + arange(0, 3), 1.0)\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    store(x, load(x) @ load(x))\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    for i in static_range(n):\n        pass\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    return 1\n",
    "@kernel\ndef k(x: ptr[f32], n: i32, B: constexpr = 16):\n    t = zeros((B, 3.5), f32)\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n\tpass\n        pass\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    x[0] = 1.0\n",
    "@kernel\ndef k(x: tensor[f32, 0], n: i32):\n    pass\n",
    "@kernel\ndef k(x: ptr[f32], x: i32):\n    pass\n",
    "@kernel\ndef k(*args):\n    pass\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    y = load(x) + 'a'\n",
    "@kernel\ndef k(x: ptr[f32], n: i32):\n    import os\n",
]

SOURCES = [GOOD, UNTYPED, TENSOR, LOOPS]


def _kernel(text: str) -> sp.Kernel:
    return sp.loads(text, "case.spk").kernels["k"]


_KERNELS: dict[str, sp.Kernel] = {}


def kernel(text: str) -> sp.Kernel:
    """The kernel of ``text``, loaded once (its IR cache is what a user's launches share)."""
    if text not in _KERNELS:
        _KERNELS[text] = _kernel(text)
    return _KERNELS[text]


def good_arguments(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Arguments that launch the kernel of ``text`` (one program)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(16).astype(np.float32)
    out = np.full(16, np.nan, np.float32)
    if text is GOOD:
        return [x, out, 16, 1.5, True], {"BLOCK": 16}
    if text is UNTYPED:
        return [x, out, 16], {"S": (4, 4), "D": sp.f32}
    if text is TENSOR:
        return [rng.standard_normal((4, 4)).astype(np.float32), out], {"BM": 4}
    return [x, out, 16], {"STEP": 4, "UNROLL": 2}


def _strided() -> np.ndarray:
    return np.arange(32, dtype=np.float32)[::2]


def _transposed() -> np.ndarray:
    return np.zeros((4, 4), np.float32).T


def fixed_bad() -> list[Any]:
    """The fixed wrong values, built anew on every call: a launch that succeeds writes into an array
    among them, so each example (hypothesis's or one run of a parametrized case) takes fresh ones
    and none depends on what an earlier one left (about 60 small objects: microseconds)."""
    return [
        "a", "", None, 1.5, -0.0, float("nan"), float("inf"), -float("inf"), [[1.0]], [1, [2, [3]]], [], (), ((),),
        np.float32(2.0), np.float16(1.0), np.int8(-3), np.uint64(2**64 - 1), np.int64(-2**63), np.bool_(True),
        np.array(3), np.array(3.0), np.array([1, 2]), -4, -1, 0, 2**31, 2**63, 2**64, -2**63 - 1, 2**200, 2**1100,
        -2**1100, 1e39, -3.5e38, True, False,
        _strided(), _transposed(), np.zeros(16, np.float64), np.zeros(16, np.int32), np.zeros(16, np.complex64),
        np.zeros(16, object), np.zeros(16, "U1"), np.zeros(16, "M8[s]"), np.zeros((2, 8), np.float32),
        np.zeros(0, np.float32), np.zeros((4, 4), np.float32), object(), {"a": 1}, {1, 2}, b"x", bytearray(b"xy"),
        complex(1, 2), slice(1), Ellipsis, sp.f16, sp.ptr[sp.f32], sp.i32, np.float32, "f32", "ptr[f32]",
        lambda m: 1,
    ]


FIXED_COUNT = len(fixed_bad())
FIXED_IDS = [type(v).__name__ for v in fixed_bad()]
FIXED = st.integers(0, FIXED_COUNT - 1).map(lambda i: fixed_bad()[i])
"""One fixed wrong value, fresh for each example."""

leaves = st.one_of(st.integers(-3, 20), st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=3))
nested = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner), max_leaves=8)
BAD = st.one_of(
    FIXED,
    st.integers(min_value=-2**80, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    nested,
)
PATHS = ["interpret", "interpret_kw", "ir", "compile_dict", "compile_text", "grid", "grid_dim"]


def _signature_for(k: sp.Kernel, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An ahead-of-time signature equivalent to a launch's arguments (run-time ones as types)."""
    from sparsile.frontend.ir import types as T

    sig: dict[str, Any] = {}
    for p, a in zip(k.params, args, strict=False):
        if p.annotation is None:
            sig[p.name] = sp.ptr[sp.f32] if isinstance(a, np.ndarray) else sp.i32
    sig.update({n: v for n, v in kwargs.items() if any(p.name == n and p.annotation is T.CONSTEXPR for p in k.params)})
    return sig


def _run(text: str, path: str, position: int, bad: Any) -> None:
    k = kernel(text)
    args, kwargs = good_arguments(text)
    if path.startswith("grid") and isinstance(bad, int | np.integer) and 4 < bad < 2**31:
        bad = -int(bad)  # a grid of many programs is right, only slow to interpret: its negative is wrong
    names = [p.name for p in k.params]
    name = names[position % len(names)]
    index = names.index(name)
    if path in ("interpret", "ir"):
        if index < len(args):
            args[index] = bad
        else:
            kwargs[name] = bad
        if path == "ir":
            k.ir(*args, **kwargs)
        else:
            k.interpret[(1,)](*args, **kwargs)
    elif path == "interpret_kw":
        kwargs.update(dict(zip(names, args, strict=False)))
        kwargs[name] = bad
        k.interpret[(1,)](**kwargs)
    elif path == "compile_dict":
        sig = _signature_for(k, args, kwargs)
        sig[name] = bad
        k.compile(sig, target="sm_90a", stop_after="ir", cache=False)
    elif path == "compile_text":
        k.compile(f"{name}={bad!r}", target="sm_90a", stop_after="ir", cache=False)
    elif path == "grid":
        k.interpret[bad](*args, **kwargs)
    else:
        k.interpret[(1, bad)](*args, **kwargs)


def _must_be_sparsile_error(run: Any) -> None:
    """``run()`` succeeds or raises a sparsile error with a code; a RuntimeWarning (numpy's "overflow
    encountered in cast": a value silently made inf) fails too."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            run()
        except SparsileError as e:
            assert CODE.match(e.code), f"{type(e).__name__} without an SP code: {e!r}"


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.sampled_from(SOURCES), path=st.sampled_from(PATHS), position=st.integers(0, 5), bad=BAD)
def test_wrong_arguments_end_in_a_sparsile_error(text: str, path: str, position: int, bad: Any) -> None:
    _must_be_sparsile_error(lambda: _run(text, path, position, bad))


@pytest.mark.parametrize("index", range(FIXED_COUNT), ids=FIXED_IDS)
@pytest.mark.parametrize("path", PATHS)
def test_every_fixed_wrong_value_on_every_path(path: str, index: int) -> None:
    for position in range(6):
        for text in SOURCES:
            _must_be_sparsile_error(lambda text=text, position=position: _run(text, path, position,
                                                                              fixed_bad()[index]))


def test_each_example_gets_fresh_fixed_values() -> None:
    """No array (or other mutable value) reaches two examples: the shared module-level list did, and a
    launch that succeeded wrote into it before the next example read it. The values are the same each
    time (strides of the strided and transposed arrays included)."""
    drawn: list[Any] = []

    @settings(max_examples=100, database=None, derandomize=True)
    @given(bad=FIXED, position=st.integers(0, 5))  # (as the fuzz: one value, with other arguments)
    def draw(bad: Any, position: int) -> None:
        drawn.append(bad)

    draw()
    arrays = [v for v in drawn if isinstance(v, np.ndarray)]
    kinds = [(a.dtype, a.shape, a.strides) for a in arrays]
    assert len(set(kinds)) < len(kinds)  # the same fixed array was drawn more than once ...
    mutable = [v for v in drawn if isinstance(v, np.ndarray | list | dict | set | bytearray)]
    assert len({id(v) for v in mutable}) == len(mutable)  # ... each time a new object (all alive: no id reused)
    first, again = fixed_bad(), fixed_bad()
    for a, b in zip(first, again, strict=True):
        if isinstance(a, np.ndarray):
            assert a is not b and a.strides == b.strides and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_kernels_end_in_a_sparsile_error(text: str) -> None:
    x, out = np.ones(16, np.float32), np.full(16, np.nan, np.float32)
    with pytest.raises(SparsileError) as info:
        k = _kernel(text)
        k.interpret[(1,)](x, 16)
    assert CODE.match(info.value.code)
    try:
        k = _kernel(text)
    except SparsileError:
        return
    with pytest.raises(SparsileError) as info:
        k.compile({"x": sp.ptr[sp.f32], "n": sp.i32}, target="sm_90a", stop_after="ptx", cache=False)
    assert CODE.match(info.value.code)
    assert np.isnan(out).all()


def test_the_good_arguments_launch() -> None:
    """The arguments the fuzz spoils one at a time are right as they are (else every case would only
    test the first error), and the kernels compute what they should (float64 references)."""
    eps = np.finfo(np.float32).eps
    for text in SOURCES:
        args, kwargs = good_arguments(text)
        kernel(text).interpret[(1,)](*args, **kwargs)
        x, out = (args[0].astype(np.float64), args[1])
        if text is GOOD:  # -(x * 1.5): one rounding
            ref = -(x * 1.5)
            assert (np.abs(out - ref) <= eps / 2 * np.abs(ref)).all()
        elif text is UNTYPED:  # a copy
            np.testing.assert_array_equal(out, args[0])
        elif text is TENSOR:  # row sums of the 4 x 4 tile: three roundings of partial sums
            ref = x.sum(axis=1)
            assert (np.abs(out[:4] - ref) <= 3 * eps / 2 * np.abs(x).sum(axis=1)).all()
            assert np.isnan(out[4:]).all()
        else:  # x[0] + x[4] + x[8] + x[12] + 2.0: six additions
            ref = x[::4].sum() + 2.0
            assert abs(out[0] - ref) <= 6 * eps / 2 * (np.abs(x[::4]).sum() + 2.0)
            assert np.isnan(out[1:]).all()


@pytest.mark.parametrize("target", [np.zeros(3), np.zeros(0), 90, 9.0, ["sm_90a"], b"sm_90a", object()])
def test_a_target_of_the_wrong_type_is_sp0601(target: Any) -> None:
    with pytest.raises(SparsileError) as info:  # an array was numpy's "truth value ... is ambiguous"
        kernel(GOOD).compile({}, target=target, stop_after="ir", cache=False)
    assert info.value.code == "SP0601"
    assert info.value.message == f"a target name must be a string, got {target!r}"


def test_a_grid_of_none_or_a_class_is_sp0710() -> None:
    args, kwargs = good_arguments(GOOD)
    for grid, found in (((None,), "found None in (None,)"), ((1, None), "found None in (1, None)"),
                        (np.int32, "found the class int32")):
        with pytest.raises(SparsileError) as info:  # (None,) was a TypeError from int(None), np.int32 one from
            kernel(GOOD).interpret[grid](*args, **kwargs)  # np.int32(meta)
        assert info.value.code == "SP0710" and found in info.value.message
    assert np.isnan(args[1]).all()


@pytest.mark.parametrize(("value", "name", "t"), [(1e39, "a", "f32"), (2**200, "a", "f32"), (-2**1100, "a", "f32"),
                                                  (70000.0, "h", "f16"), (3.4e38, "b", "bf16"),
                                                  (2**128 - 2**103 - 1, "a", "f32"),
                                                  (-2**128 + 2**119 + 1, "b", "bf16")])
def test_a_float_scalar_that_overflows_its_type_is_sp0709_in_the_interpreter(value: Any, name: str, t: str) -> None:
    """As the GPU launcher (backend/runtime/scalars.py): the interpreter made it inf (a RuntimeWarning), and
    an int past the f64 range raised Python's OverflowError on both paths. An int just below half an ulp
    past the largest finite value overflows too: it rounds to f64 first (onto that midpoint), as the
    launcher converts it."""
    from sparsile.backend.runtime import arguments as A
    from sparsile.frontend.ir import types as T

    src = "@kernel\ndef k(out: ptr[f32], a: f32, h: f16, b: bf16):\n    store(out, a + h + b)\n"
    k = _kernel(src)
    out = np.full(1, np.nan, np.float32)
    k.interpret[(1,)](out, 1.0, 65504.0, 3.38e38)  # finite values near the largest pass
    ref = 1.0 + 65504.0 + float(np.asarray(3.38e38).astype(T.numpy_dtype(T.bf16)))  # b rounds to bf16 first
    assert abs(float(out[0]) - ref) <= np.finfo(np.float32).eps / 2 * ref  # one f32 rounding of the sum
    out[:] = np.nan
    args = {"a": 1.0, "h": 1.0, "b": 1.0, name: value}
    message = f"argument `{name}` = {value!r} overflows {t}"
    with pytest.raises(SparsileError) as info:  # after a launch of the same specialization (memoized)
        k.interpret[(1,)](out, **args)
    assert info.value.code == "SP0709" and info.value.message == message
    assert np.isnan(out).all()
    with pytest.raises(SparsileError) as info:
        A.encode_scalar(t, value, name)
    assert info.value.code == "SP0709" and info.value.message == message
