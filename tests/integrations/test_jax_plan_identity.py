"""What a ``sparsile_plan`` number names (integrations/jax/call.py, ``_describe``; ffi.py, ``add_plan``):
the content of one traced kernel call, the shapes of its operands included, and what an executable
whose number this process never traced gets (SP0936, not a Python traceback)."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import sparsile as sp  # noqa: E402
from sparsile.integrations.jax import call, ffi  # noqa: E402

TILE_SUMS = """\
@kernel(num_warps=4)
def tile_row_sums(A: tensor[f32, 2], C: ptr[f32]):
    a = smem.alloc(f32, (16, 16))
    bars = mbarrier.alloc(1)
    mbarrier.expect(bars[0], 16 * 16 * 4)
    tma.load(A, (0, 0), a, bars[0])
    mbarrier.wait(bars[0], 0)
    store(C + arange(0, 16), sum(a.load(), 1))
"""
"""The row sums of A's first 16 x 16 tile, read by TMA: rows past A's end read as zeros (the
tensor map's bounds are A's shape), so the result depends on A's shape, which nothing but the
operand itself tells the call."""


def tile_sums_kernel() -> sp.Kernel:
    return sp.loads(TILE_SUMS, "tile_row_sums.spk").tile_row_sums


def _plans_named(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"sparsile_plan = (-?\d+)", text)]


def tile_sums(a: np.ndarray) -> np.ndarray:
    """float64: the 16 row sums of a's first 16 x 16 tile, zeros past a's rows."""
    out = np.zeros(16)
    rows = min(16, a.shape[0])
    out[:rows] = a[:rows, :16].astype(np.float64).sum(1)
    return out


def test_operands_of_other_shapes_are_other_plans() -> None:
    """Two programs calling one kernel with the same grid, statics and outputs, but an input of
    another shape, name two plans. They named one (the number hashed everything but the operands'
    shapes), and the native CUDA path arms one record per plan number with the tensor map encoded
    for the first program's buffer: the second program's calls re-encoded its own buffer with the
    first one's dimensions (rows 8..15 of a (40, 16) A read as zeros after an (8, 16) A, or reads past
    the end of an (8, 16) A after a (40, 16) one). Both still compute their own sums here."""
    kernel = tile_sums_kernel()
    rng = np.random.default_rng(7)
    out = jax.ShapeDtypeStruct((16,), jnp.float32)
    numbers = []
    for rows in (8, 40):
        a = rng.uniform(0.5, 1.5, (rows, 16)).astype(np.float32)
        f = jax.jit(lambda a: call(kernel, (1,), a, out_shapes=out))
        (number,) = _plans_named(f.lower(a).as_text())
        numbers.append(number)
        y = np.asarray(f(a))  # (the interpreter fills the output with NaN first)
        assert np.abs(y - tile_sums(a)).max() <= 16 * 2.0**-23 * 16 * 1.5
    assert numbers[0] != numbers[1]
    again = jax.jit(lambda a: call(kernel, (1,), a, out_shapes=out))
    assert _plans_named(again.lower(np.zeros((8, 16), np.float32)).as_text()) == numbers[:1]  # same shape: same plan


def test_operand_dtype_is_part_of_the_plan() -> None:
    """An untyped pointer parameter given f32 and then i32 data is two plans (as it is two
    specializations)."""

    @sp.jit
    def copy(x, out, n: sp.i32, BLOCK: sp.constexpr = 64):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs, mask=offs < n).to(sp.f32), mask=offs < n)

    out = jax.ShapeDtypeStruct((64,), jnp.float32)
    texts = [jax.jit(lambda x: call(copy, (1,), x, n=64, out_shapes=out)).lower(np.ones(64, dtype)).as_text()
             for dtype in (np.float32, np.int32)]
    assert len(set(_plans_named(texts[0]) + _plans_named(texts[1]))) == 2


def test_an_executable_naming_a_plan_this_process_never_traced_is_sp0936() -> None:
    """An executable made in another process (jax.export, a serialized executable) names plans by
    number; where this process never traced them, the handler found no plan and XLA reported
    Python's ``KeyError`` with its traceback. Now it is SP0936 saying so, and tracing the same
    program here (same content, same number) makes the executable run."""
    kernel = tile_sums_kernel()
    a = np.random.default_rng(3).uniform(0.5, 1.5, (16, 16)).astype(np.float32)
    out = jax.ShapeDtypeStruct((16,), jnp.float32)
    lowered = jax.jit(lambda a: call(kernel, (1,), a, out_shapes=out)).lower(a)
    (number,) = _plans_named(lowered.as_text())
    compiled = lowered.compile()
    plan = ffi._plans.pop(number)  # as in a process that never traced it
    try:
        with pytest.raises(Exception) as info:
            np.asarray(compiled(a))
        text = str(info.value)
        assert "error[SP0936]: a sparsile kernel call failed while XLA ran it" in text
        assert (f"the program names sparsile plan {number}, which this process has not traced (an executable "
                "compiled in another process: jax.export, a serialized executable)") in text
        assert ("help: trace the same program in this process first (call the jitted function once, or "
                "jax.jit(f).lower(*args)): its sparsile calls get the same plan numbers") in text
        assert "Traceback" not in text and "KeyError" not in text
        jax.jit(lambda a: call(kernel, (1,), a, out_shapes=out)).lower(a)  # traced here: registered again
        assert number in ffi._plans
        y = np.asarray(compiled(a))
        assert np.abs(y - tile_sums(a)).max() <= 16 * 2.0**-23 * 16 * 1.5
    finally:
        ffi._plans.setdefault(number, plan)


@sp.jit
def scaled_copy(X, S, out, MODE: sp.constexpr = 0, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    x = sp.load(X + offs)
    if MODE == 1:
        x = x * sp.load(S + offs)
    sp.store(out + offs, x)


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_each_call_runs_its_own_specialization(interpret: bool) -> None:
    """Calls of one kernel with another specialization (an unannotated parameter given an array,
    then the number 0, as sparse_linear passes an absent scale; another constexpr) each run their
    own IR, in either order. A call's specialization key, shadowed by a loop over the outputs, once
    named the last output parameter: every call of a kernel then shared the first call's IR."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(16).astype(np.float32)
    s = rng.uniform(0.5, 2.0, 16).astype(np.float32)
    out = jax.ShapeDtypeStruct((16,), jnp.float32)
    for modes in ((1, 0), (0, 1)):
        kernel = sp.jit(scaled_copy.fn)  # (a fresh kernel: an empty IR cache)
        for mode in modes:
            got = call(kernel, (1,), x, s if mode else 0, out_shapes={"out": out}, MODE=mode, interpret=interpret)
            want = x.astype(np.float64) * (s if mode else 1.0)
            np.testing.assert_allclose(np.asarray(got["out"], np.float64), want, rtol=2**-23)
