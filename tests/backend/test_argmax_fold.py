"""The ``argmax`` / ``argmin`` fold of backend/lower/reduce_fold.py, run on the CPU: the LLVM IR its
``start`` (widening an element) and ``combine`` emit is compiled for the host with llvmlite's MCJIT
and driven from Python. Folding the elements of random lines in random orders (any pairing, either
operand first, as the thread / lane / warp stages may) must give the interpreter's index
(numpy's argmax / argmin: the first extreme element, a NaN more extreme than any number, -0.0 equal
to 0.0): the combine is a total order on (value, index) pairs, so the order cannot matter.

fp8 widens through the PTX ``cvt`` (inline assembly, not for the host); its compare type is f32,
checked here through f32 inputs. The three stages themselves are tests/backend/test_lower_reduce.py.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower.codegen import DTile
from sparsile.backend.lower.llvm_text import FunctionBuilder, LLValue, ModuleBuilder, llvm_type
from sparsile.backend.lower.reduce_fold import compare_type, fold_for
from sparsile.frontend.ir import types as T
from sparsile.tests.support.warp_sim import host_engine

TYPES = ["f32", "f16", "bf16", "f64", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64"]


class _HostCodeGen:
    """What the fold needs of a CodeGen: the builder, the module, and each register's coordinates
    (here the function's index parameters)."""

    def __init__(self, fb: FunctionBuilder, coords: list[list[LLValue]]) -> None:
        self.fb = fb
        self.mod = ModuleBuilder()
        self._coords = coords

    def coords(self, layout: object) -> list[list[LLValue]]:
        return self._coords


def _bits_type(t: T.ScalarType) -> str:
    return f"i{max(8, t.bits)}"


def _from_bits(fb: FunctionBuilder, v: LLValue, t: T.ScalarType) -> LLValue:
    ty = llvm_type(t)
    return v if ty == v.type else fb.cast("bitcast", v, ty)


def _to_bits(fb: FunctionBuilder, v: LLValue) -> LLValue:
    return v if v.type.startswith("i") else fb.cast("bitcast", v, f"i{ {'float': 32, 'double': 64}[v.type]}")


def _compile_for_host(text: str) -> Any:
    return host_engine(text, opt=2)


@functools.cache
def _jit(dtype: str, kind: str) -> tuple[Any, Any, Any]:
    """(engine, widen, combine): ``widen(bits, index, out)`` writes an element's parts (compare
    type bits as u64, index as i32); ``combine(va, ia, vb, ib, out)`` the combined parts."""
    elem = getattr(T, dtype)
    vt = compare_type(elem)
    eb, vb = _bits_type(elem), _bits_type(vt)
    mod_text = []

    def function(name: str, params: list[str], body: Any) -> None:
        fb = FunctionBuilder(name, params)
        body(fb)
        fb.terminate("ret void")
        mod_text.append(fb.render().replace(" #0 {", " {"))

    def store(fb: FunctionBuilder, parts: tuple[LLValue, ...]) -> None:
        fb.emit(f"store i64 {fb.cast('zext', _to_bits(fb, parts[0]), 'i64').ref}, ptr %out, align 8")
        at = fb.gep("i8", LLValue("%out", "ptr"), LLValue("8", "i64"))
        fb.emit(f"store i32 {parts[1].ref}, ptr {at.ref}, align 4")

    def widen(fb: FunctionBuilder) -> None:
        x = _from_bits(fb, LLValue("%x", eb), elem) if eb != "i8" or elem.is_int else LLValue("%x", eb)
        cg = _HostCodeGen(fb, [[LLValue("%i", "i32")]])
        fold = fold_for(cg, kind, DTile(None, [x], elem), 0, T.i32)  # type: ignore[arg-type]
        store(fb, fold.start(0))

    def combine(fb: FunctionBuilder) -> None:
        cg = _HostCodeGen(fb, [])
        fold = fold_for(cg, kind, DTile(None, [], vt), 0, T.i32)  # type: ignore[arg-type]
        a = (_from_bits(fb, LLValue("%va", vb), vt), LLValue("%ia", "i32"))
        b = (_from_bits(fb, LLValue("%vb", vb), vt), LLValue("%ib", "i32"))
        store(fb, fold.combine(a, b))

    function("widen", [f"{eb} %x", "i32 %i", "ptr %out"], widen)
    function("combine", [f"{vb} %va", "i32 %ia", f"{vb} %vb", "i32 %ib", "ptr %out"], combine)
    engine = _compile_for_host("\n".join(mod_text) + "\n")
    cty = {8: ctypes.c_uint8, 16: ctypes.c_uint16, 32: ctypes.c_uint32, 64: ctypes.c_uint64}
    out_t = ctypes.POINTER(ctypes.c_uint64)
    w = ctypes.CFUNCTYPE(None, cty[max(8, elem.bits)], ctypes.c_int32, out_t)(engine.get_function_address("widen"))
    c = ctypes.CFUNCTYPE(None, cty[vt.bits], ctypes.c_int32, cty[vt.bits], ctypes.c_int32, out_t)(
        engine.get_function_address("combine"))
    return engine, w, c


def _call(fn: Any, *args: Any) -> tuple[int, int]:
    out = (ctypes.c_uint64 * 2)()
    fn(*args, ctypes.cast(out, ctypes.POINTER(ctypes.c_uint64)))
    return int(out[0]), int(out[1] & 0xFFFFFFFF)


def _line(dtype: str, rng: np.random.Generator, n: int) -> np.ndarray:
    dt = getattr(sp, dtype).numpy_dtype
    if np.dtype(dt).kind in "iu":
        info = np.iinfo(dt)
        pool = np.array([info.min, info.min + 1, -1 if info.min < 0 else 5, 0, 1, info.max - 1, info.max], dt)
        return rng.choice(pool, size=n)
    pool = np.array([0.0, -0.0, 1.0, -1.0, 3.5, np.inf, -np.inf, np.nan, -np.nan], np.float64)
    return rng.choice(pool, size=n, p=[.15, .15, .15, .15, .1, .08, .08, .07, .07]).astype(dt)


def _fold_randomly(dtype: str, kind: str, x: np.ndarray, rng: np.random.Generator) -> int:
    _, widen, combine = _jit(dtype, kind)
    bits = x.view(f"u{max(1, x.dtype.itemsize)}")
    items = [_call(widen, int(b), i) for i, b in enumerate(bits)]
    while len(items) > 1:  # any two partial results, either one first
        i, j = sorted(rng.choice(len(items), size=2, replace=False))
        b, a = items.pop(j), items.pop(i)
        if rng.random() < 0.5:
            a, b = b, a
        items.append(_call(combine, a[0], a[1], b[0], b[1]))
    return items[0][1]


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("dtype", TYPES)
def test_folding_in_any_order_gives_the_interpreters_index(dtype: str, kind: str) -> None:
    rng = np.random.default_rng(TYPES.index(dtype) * 2 + (kind == "argmin"))
    for n in (1, 2, 3, 7, 16, 33):
        for _ in range(12):
            x = _line(dtype, rng, n)
            want = int((np.argmax if kind == "argmax" else np.argmin)(x))
            assert _fold_randomly(dtype, kind, x, rng) == want, (x, kind)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_the_first_nan_wins_and_signed_zeros_tie(kind: str) -> None:
    rng = np.random.default_rng(0)
    cases = [([1.0, np.nan, 3.0, np.nan], 1), ([-0.0, 0.0], 0), ([0.0, -0.0], 0),
             ([np.inf, np.nan], 1), ([-np.inf, np.nan, -np.inf], 1), ([2.0, 2.0, 2.0], 0)]
    for values, want in cases:
        for dtype in ("f32", "bf16", "f64"):
            x = np.array(values, np.float64).astype(getattr(sp, dtype).numpy_dtype)
            assert _fold_randomly(dtype, kind, x, rng) == want, (values, dtype)


def test_narrow_values_are_compared_widened_exactly() -> None:
    assert [compare_type(getattr(T, t)).name for t in ("f16", "bf16", "e4m3", "i8", "u16", "bool_", "f64", "u64")] \
        == ["f32", "f32", "f32", "i32", "u32", "u32", "f64", "u64"]
