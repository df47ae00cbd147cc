"""A bool given for an integer or float scalar parameter (``n: i32``, ``a: f32``) is SP0708 naming
the argument on every path: ``kernel.interpret[grid]``, ``kernel[grid]`` (the fake device of
test_prepared.py), a prepared launch's per-call value and the runtime Launcher. Before, the
interpreter ran ``True`` as 1 for both, the GPU launched a Python ``True`` for ``i32`` as 1 but
refused a numpy ``np.True_`` there (and any bool for ``f32``): the CPU check and the GPU disagreed.
A ``bool`` parameter takes Python and numpy bools alike (``np.True_`` was SP0708 on the GPU)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.runtime import arguments as A
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import arrays, vadd
from sparsile.tests.backend.test_prepared import gpu as gpu  # (the fake device, a fixture)

BOOLS = [True, False, np.bool_(True)]


def _sp0708(launch: Any, name: str, what: str) -> None:
    with pytest.raises(LaunchError) as exc:
        launch()
    assert exc.value.code == "SP0708" and f"argument `{name}` expects {what}" in str(exc.value)
    assert "got bool" in str(exc.value)


@sp.jit
def scale_add(out: sp.ptr[sp.f32], a: sp.f32, n: sp.i32, flag: sp.bool, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    sp.store(out + offs, a * offs + n + flag, mask=offs < BLOCK)


@pytest.mark.parametrize("value", BOOLS)
def test_the_interpreter_refuses_a_bool_for_a_number(value: Any) -> None:
    out = np.full(16, np.nan, np.float32)
    _sp0708(lambda: scale_add.interpret[(1,)](out, 2.0, value, True), "n", "an integer (i32)")
    _sp0708(lambda: scale_add.interpret[(1,)](out, value, 3, True), "a", "a number (f32)")
    assert np.isnan(out).all()
    scale_add.interpret[(1,)](out, 2.0, 3, value)  # a bool parameter takes it
    np.testing.assert_array_equal(out, 2.0 * np.arange(16) + 3 + bool(value))


@pytest.mark.parametrize("value", BOOLS)
def test_kernel_grid_refuses_a_bool_for_an_integer(gpu: Any, value: Any) -> None:
    x, y, out = arrays()
    _sp0708(lambda: vadd()[(4,)](x, y, out, value, BLOCK=256), "n", "an integer (i32)")
    k = vadd()
    k[(4,)](x, y, out, 1024, BLOCK=256)
    _sp0708(lambda: k[(4,)](x, y, out, value, BLOCK=256), "n", "an integer (i32)")  # after a fast entry
    launch = k[(4,)].prepare(x, y, out, 1024, BLOCK=256, vary=("n",))
    _sp0708(lambda: launch(x, y, out, value), "n", "an integer (i32)")
    assert len(gpu.launches) == 1


@pytest.mark.parametrize("value", BOOLS)
def test_the_launcher_encodes_bools_for_bool_parameters_only(value: Any) -> None:
    for dtype in ("i32", "u8", "i64"):
        with pytest.raises(LaunchError) as exc:
            A.encode_scalar(dtype, value, "n")
        assert exc.value.code == "SP0708" and f"argument `n` expects an integer ({dtype}), got bool" in str(exc.value)
    assert A.encode_scalar("bool", value, "flag") == bytes([bool(value)])
