"""JAX arrays given to ``kernel[grid](...)`` outside sparsile.jax, on the GPU: JAX arrays are
immutable, so one the kernel writes is SP0719 (as in the interpreter), before it is copied or
written in place, and keeps its values; one the kernel only reads is used (a CPU one staged to the
device, a CUDA one in place). The CPU tests of the same decision: tests/backend/test_host_staging.py,
tests/backend/test_launch_devices.py."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.frontend.diagnostics import LaunchError  # noqa: E402
from sparsile.tests.integrations.test_jax_call import scale_add  # noqa: E402

pytestmark = pytest.mark.gpu

N = 1000


def _devices() -> list[str]:
    kinds = ["cpu"]
    if jax.default_backend() == "gpu":
        kinds.append("gpu")
    return kinds


@pytest.mark.parametrize("kind", _devices())
def test_a_jax_array_the_kernel_writes_is_sp0719_and_keeps_its_values(kind: str) -> None:
    rng = np.random.default_rng(21)
    xs, ys, outs = (rng.uniform(0.25, 1.0, N).astype(np.float32) for _ in range(3))
    device = jax.devices(kind)[0]
    x, y, out = (jax.device_put(a, device) for a in (xs, ys, outs))
    with pytest.raises(LaunchError) as info:
        scale_add[(-(-N // 128),)](x, y, out, N, 1.5)
    assert info.value.code == "SP0719" and "argument `out` is a read-only ArrayImpl (a JAX array" in str(info.value)
    assert "sparsile.jax.call" in info.value.help
    np.testing.assert_array_equal(np.asarray(out), outs)


@pytest.mark.parametrize("kind", _devices())
def test_jax_arrays_the_kernel_only_reads_are_accepted(kind: str) -> None:
    rng = np.random.default_rng(22)
    xs, ys = (rng.uniform(0.25, 1.0, N).astype(np.float32) * rng.choice([-1, 1], N) for _ in range(2))
    device = jax.devices(kind)[0]
    x, y = (jax.device_put(a, device) for a in (xs, ys))
    out = np.full(N, np.nan, np.float32)  # poisoned
    scale_add[(-(-N // 128),)](x, y, out, N, 1.5)
    ref = 1.5 * xs.astype(np.float64) + ys
    bound = 2.0**-23 * (1.5 * np.abs(xs) + np.abs(ys))  # one f32 rounding of the product and of the sum
    assert (np.abs(out.astype(np.float64) - ref) <= bound).all()
