"""A 0-d array given to an unannotated kernel parameter through ``sparsile.jax.call``: one rule for
jax and numpy arrays, that of ``kernel[grid]`` (docs/language.md, "Parameter types"): an array, even
a 0-d one, is a one-element array the kernel gets a pointer to. A 0-d jax array was refused as "a
scalar parameter" (SP0932) while a 0-d numpy array of the same value was passed as an array."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import sparsile as sp  # noqa: E402
from sparsile.frontend.diagnostics import CompileError  # noqa: E402
from sparsile.integrations.jax import call  # noqa: E402


@sp.jit
def doubled(a, out):
    sp.store(out, sp.load(a) * 2.0 + 0.5)


@sp.jit
def first_n(x, out, n, BLOCK: sp.constexpr = 64):
    offs = sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=mask), mask=mask)


ONE = jax.ShapeDtypeStruct((1,), jnp.float32)
KINDS = {"numpy": np.asarray, "jax": jnp.asarray}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_a_0d_array_is_an_array_for_an_unannotated_parameter(kind: str, jitted: bool) -> None:
    """np.asarray(v) and jnp.asarray(v), 0-d, reach ``a`` as one-element arrays (kernel[grid]'s
    rule), under jax.jit too (a traced 0-d array)."""
    value = np.float32(np.random.default_rng(5).uniform(0.5, 2.0))
    a = KINDS[kind](value)
    assert np.ndim(a) == 0

    def run(a):
        return call(doubled, (1,), a, out_shapes=ONE)

    got = np.asarray((jax.jit(run) if jitted else run)(a))
    np.testing.assert_allclose(got, [np.float64(value) * 2.0 + 0.5], rtol=1e-6)


@pytest.mark.parametrize("kind", [*KINDS, "traced"])
def test_a_0d_array_used_as_a_number_says_to_pass_a_number(kind: str) -> None:
    """A kernel that computes with the parameter as a number gets the pointer's SP0310 (as
    kernel[grid] gives for a 0-d numpy array), with a note naming the argument and what to pass."""
    x = np.random.default_rng(6).uniform(-1.0, 1.0, 64).astype(np.float32)
    s = jax.ShapeDtypeStruct((64,), jnp.float32)
    with pytest.raises(CompileError) as info:
        if kind == "traced":
            jax.jit(lambda n: call(first_n, (1,), x, out_shapes=s, n=n))(10)
        else:
            call(first_n, (1,), x, out_shapes=s, n=KINDS[kind](np.int32(10)))
    e = info.value
    lines, start = inspect.getsourcelines(first_n.fn)
    line = start + next(i for i, text in enumerate(lines) if "mask = offs < n" in text)
    assert (e.code, e.message, e.span.file_line) == ("SP0310", "cannot combine i32 with ptr[i32]", line)
    assert e.diagnostics[0].notes[-1] == (
        "`n` was given a 0-d array, which a kernel takes as a one-element array (a pointer), as kernel[grid] "
        "does; pass a Python number for a scalar (under jax.jit, a static argument: static_argnums, "
        "static_argnames or a closure)")
