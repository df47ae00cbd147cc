"""sparsile.jax on the GPU (needs jax with a CUDA plugin): kernels launched by XLA's FFI on XLA's
stream with XLA's buffers, checked against float64; no host staging on the call path."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import SparseLinear, call, sparse_linear  # noqa: E402
from sparsile.integrations.jax import ffi as spffi  # noqa: E402
from sparsile.tests.integrations.test_jax_call import scale_add  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda_backend() -> None:
    if jax.default_backend() != "gpu":
        pytest.skip(f"jax has no CUDA backend here (default backend: {jax.default_backend()})")


@pytest.fixture
def no_host_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if sparsile's launcher copies anything between host and device on the call path."""
    from sparsile.backend.runtime import launcher

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the launcher staged a host array: the FFI path must use XLA's device buffers")

    monkeypatch.setattr(launcher, "stage_host_array", refuse)
    monkeypatch.setattr(launcher, "finish_host_copies", refuse)


def _handler_calls() -> int:
    """Executions of the sparsile_call handler: the Python handler's and the native fast path's (a
    plan another test armed already runs natively from its first execution)."""
    from sparsile.integrations.jax import native

    return spffi.STATS["calls"] + native.counts()["fast"]


def _signed(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.25, 1.0, shape) * rng.choice([-1, 1], shape)


def test_jit_elementwise_kernel_in_jax_jit(no_host_staging: None) -> None:
    n = 1 << 20
    rng = np.random.default_rng(0)
    x, y = _signed(rng, (n,)).astype(np.float32), _signed(rng, (n,)).astype(np.float32)
    out = jax.ShapeDtypeStruct((n,), jnp.float32)
    f = jax.jit(lambda a, b: call(scale_add, (-(-n // 1024),), a, b, out_shapes=out, n=n, alpha=1.5, BLOCK=1024)
                + 1.0)
    assert "sparsile_call" in f.lower(x, y).as_text()
    before = _handler_calls()
    got = np.asarray(f(jnp.asarray(x), jnp.asarray(y)), np.float64)
    assert _handler_calls() > before  # the FFI handler ran (not a host callback)
    ref = 1.5 * x.astype(np.float64) + y + 1.0
    assert (np.abs(got - ref) <= 2 * np.finfo(np.float32).eps * (1.5 * np.abs(x) + np.abs(y) + 1.0)).all()


def _check_linear(layer: SparseLinear, x: np.ndarray, y: jax.Array) -> None:
    xq = np.asarray(jnp.asarray(x).astype(layer.values.dtype)).astype(np.float64).reshape(-1, x.shape[-1])
    w = layer.dense().astype(np.float64)
    c = xq @ w.T
    ref = c + (0.0 if layer.bias is None else np.asarray(layer.bias, np.float64))
    bound = 2.0**-11 * np.abs(c) + x.shape[-1] * np.finfo(np.float32).eps * (np.abs(xq) @ np.abs(w).T) + 1e-6
    err = np.abs(np.asarray(y, np.float64).reshape(ref.shape) - ref)
    assert (err <= bound).all(), float((err / bound).max())


@pytest.mark.parametrize(("dtype", "n_out", "k", "tokens"), [
    ("f16", 512, 1024, 256),      # one CTA per tile
    ("bf16", 1024, 4096, 16),     # few tiles: split-K, then splitk_reduce
    ("f16", 8192, 1024, 8192),    # many tiles: the CTA-pair kernel (a 2-CTA cluster launch)
    ("f16", 256, 200, 64),        # K = 200 padded to 208
])
def test_shipped_sparse_gemm_in_jax_jit(dtype: str, n_out: int, k: int, tokens: int, no_host_staging: None) -> None:
    rng = np.random.default_rng(1)
    layer = SparseLinear.from_dense(_signed(rng, (n_out, k)), dtype, bias=rng.standard_normal(n_out))
    x = _signed(rng, (tokens, k)).astype(np.float32)
    y = jax.jit(layer)(jnp.asarray(x))
    assert y.dtype == jnp.float32 and y.shape == (tokens, n_out)
    _check_linear(layer, x, y)


def test_two_layer_sparse_mlp_jitted(no_host_staging: None) -> None:
    rng = np.random.default_rng(2)
    l1 = SparseLinear.from_dense(_signed(rng, (2048, 1024)), "bf16", bias=rng.standard_normal(2048))
    l2 = SparseLinear.from_dense(_signed(rng, (512, 2048)), "bf16")
    x = _signed(rng, (4, 64, 1024)).astype(np.float32)

    @jax.jit
    def mlp(x: jax.Array) -> jax.Array:
        return l2(jax.nn.relu(l1(x)))

    y = mlp(jnp.asarray(x))
    h = np.asarray(jax.jit(l1)(jnp.asarray(x)))
    _check_linear(l1, x, jnp.asarray(h))
    _check_linear(l2, np.maximum(h, 0), y)
    assert jax.jit(jax.vmap(lambda x: sparse_linear(x, l1.values, l1.meta, l1.bias)))(x).shape == (4, 64, 2048)


def test_fused_epilogue_on_gpu(no_host_staging: None) -> None:
    """bias, gelu_tanh, per-channel and per-token scales, bf16 y: the epilogue of the fused kernel."""
    from sparsile.tests.stdlib.test_linear_api import assert_linear_close, problem, vectors

    rng = np.random.default_rng(4)
    weight, x = problem("bf16", 1024, 384, 2048, 4)
    epi = {"bias": rng.standard_normal(1024).astype(np.float32), "activation": "gelu_tanh",
           "scale_w": vectors("channel", 1024, rng), "scale_x": vectors("token", 384, rng, 3 / 448)}
    y = jax.jit(lambda x: sparse_linear(x, jnp.asarray(weight.values), jnp.asarray(weight.meta.data), **epi))(x)
    assert_linear_close(np.asarray(y), weight, x, 2048, "bf16", "bfloat16", **epi)


@pytest.mark.parametrize(("dtype", "act", "scaled"), [("bf16", "gelu_tanh", True), ("f16", "silu", False),
                                                      ("bf16", None, False)])
def test_gradients_through_x_and_bias_on_gpu(dtype: str, act: str | None, scaled: bool) -> None:
    """jax.grad through sparse_linear on the device (the kernel forward, the jnp weight decode and
    XLA's dense GEMM backward) against float64 (integrations/jax/grad.py)."""
    from sparsile.tests.integrations.test_jax_grad import check_grads

    check_grads(384, 1024, dtype, act, scaled, lead=(4, 24))


def test_interpret_flag_still_works_on_gpu() -> None:
    rng = np.random.default_rng(3)
    layer = SparseLinear.from_dense(_signed(rng, (128, 64)), "f16")
    x = _signed(rng, (8, 64)).astype(np.float32)
    a = jax.jit(layer)(jnp.asarray(x))
    b = jax.jit(lambda x: sparse_linear(x, layer.values, layer.meta, interpret=True))(jnp.asarray(x))
    _check_linear(layer, x, b)
    _check_linear(layer, x, a)


def test_seed_kernels_of_docs_jax_on_blackwell(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/jax.md's three seed kernels (tcgen05) inside jax.jit on a Blackwell GPU."""
    import re
    from pathlib import Path

    from sparsile.backend import runtime

    if runtime.current_device().compute_capability[0] < 10:
        pytest.skip("the seed kernels of docs/jax.md use tcgen05 (Blackwell, sm_100a and later)")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "jax.md").read_text()
    (spk,) = re.findall(r"^```spk\n(.*?)^```", doc, re.S | re.M)
    program = next(b for b in re.findall(r"^```python\n(.*?)^```", doc, re.S | re.M) if "seeds.spk" in b)
    (tmp_path / "seeds.spk").write_text(spk)
    monkeypatch.chdir(tmp_path)
    before = _handler_calls()
    exec(compile(program, "docs/jax.md", "exec"), {"__name__": "jax_doc"})
    assert _handler_calls() >= before + 3


def _poison_allocator(shape: tuple[int, ...], dtype: object) -> None:
    """Fill a buffer of the output's size with NaN and free it: XLA's allocator tends to hand that
    block to the next output, so a launch that did not happen leaves NaN (or stale values), not y."""
    jnp.full(shape, jnp.nan, dtype).block_until_ready()


@pytest.fixture
def native_path() -> object:
    from sparsile.integrations.jax import native

    if not native.enabled():
        pytest.skip(f"{native.ENV}=0: the native fast path is off")
    spffi.register("cuda")  # XLA's metadata query (a slow-path call) happens now, not inside a count
    assert native.handler() is not None, "the native handler was not installed (see the warning)"
    return native


def test_native_fast_path_serves_jitted_elementwise_calls(native_path, no_host_staging: None) -> None:
    n, calls = 1 << 16, 8
    rng = np.random.default_rng(5)
    out = jax.ShapeDtypeStruct((n,), jnp.float32)
    f = jax.jit(lambda a, b: call(scale_add, (n // 1024,), a, b, out_shapes=out, n=n, alpha=1.5, BLOCK=1024))
    pairs = [(_signed(rng, (n,)).astype(np.float32), _signed(rng, (n,)).astype(np.float32)) for _ in range(calls + 1)]
    f(*map(jnp.asarray, pairs[0])).block_until_ready()  # warm-up: compiles, runs the slow path, arms the plan
    before = native_path.counts()
    for x, y in pairs[1:]:  # new input buffers every call
        a, b = jnp.asarray(x), jnp.asarray(y)
        _poison_allocator((n,), jnp.float32)
        got = np.asarray(f(a, b), np.float64)
        ref = 1.5 * x.astype(np.float64) + y
        assert (np.abs(got - ref) <= 2 * np.finfo(np.float32).eps * (1.5 * np.abs(x) + np.abs(y))).all()
    after = native_path.counts()
    assert after["fast"] - before["fast"] == calls and after["slow"] == before["slow"], (before, after)
    assert after["launch_failures"] == before["launch_failures"]


def test_native_records_of_a_tensor_input_of_another_shape_are_their_own(native_path, no_host_staging: None) -> None:
    """Programs calling one TMA kernel with the same grid and output but an input of another shape:
    each gets its own plan number, so its own native record, whose tensor map has its own buffer's
    dimensions. (They shared one number, and the armed record re-encoded the next program's buffer
    with the first one's dimensions: zeros for rows past 8 after an (8, 16) input, reads past the
    end of an (8, 16) buffer after a (40, 16) one.) Not yet run on a GPU (written on the CPU, where
    tests/integrations/test_jax_plan_identity.py checks the numbers)."""
    from sparsile.tests.integrations.test_jax_plan_identity import tile_sums, tile_sums_kernel

    kernel = tile_sums_kernel()
    rng = np.random.default_rng(8)
    out = jax.ShapeDtypeStruct((16,), jnp.float32)
    for rows in (8, 40, 8, 40):
        f = jax.jit(lambda a: call(kernel, (1,), a, out_shapes=out))
        for _ in range(3):  # the first call arms the plan's record, the others run natively
            a = rng.uniform(0.5, 1.5, (rows, 16)).astype(np.float32)
            got = np.asarray(f(jnp.asarray(a)), np.float64)
            assert np.abs(got - tile_sums(a)).max() <= 16 * 2.0**-23 * 16 * 1.5, (rows, got)


@pytest.mark.parametrize(("n_out", "k", "tokens"), [(1024, 4096, 16), (512, 1024, 256), (8192, 1024, 8192)])
def test_native_fast_path_serves_jitted_sparse_linear(native_path, n_out: int, k: int, tokens: int,
                                                      no_host_staging: None) -> None:
    """Split-K (two custom calls), one CTA per tile, the CTA-pair cluster launch; x moves every call
    (its TMA tensor map is re-encoded natively)."""
    calls = 3
    rng = np.random.default_rng(6)
    layer = SparseLinear.from_dense(_signed(rng, (n_out, k)), "bf16", bias=rng.standard_normal(n_out))
    f = jax.jit(layer)
    xs = [_signed(rng, (tokens, k)).astype(np.float32) for _ in range(calls + 1)]
    start = native_path.counts()
    f(jnp.asarray(xs[0])).block_until_ready()  # warm-up: compiles, runs the slow path, arms the plans
    before = native_path.counts()
    per_call = before["fast"] + before["slow"] - start["fast"] - start["slow"]  # custom calls per call
    assert per_call in (1, 2, 3), (start, before)
    for x in xs[1:]:
        xj = jnp.asarray(x)
        _poison_allocator((tokens, n_out), jnp.float32)
        _check_linear(layer, x, f(xj))
    after = native_path.counts()
    assert after["slow"] == before["slow"], (before, after, native_path.DISABLED)
    assert after["fast"] - before["fast"] == calls * per_call, (before, after)


def test_nested_vmap_and_grad_on_gpu(no_host_staging: None) -> None:
    """vmap of vmap over x (in_axes other than 0) and vmap of grad on the CUDA kernels: the folded
    launch equals float64 (y) and the per-member float64 gradient of sum(y * g) (x's gradient is
    g @ W: x enters linearly, no activation)."""
    rng = np.random.default_rng(5)
    layer = SparseLinear.from_dense(_signed(rng, (512, 1024)), "bf16", bias=rng.standard_normal(512))
    x = _signed(rng, (3, 16, 2, 1024)).astype(np.float32)  # (A, T, B, K): vmapped over B, then A
    f = jax.jit(jax.vmap(jax.vmap(lambda t: sparse_linear(t, layer.values, layer.meta, layer.bias), in_axes=1),
                         in_axes=0))
    y = np.asarray(f(jnp.asarray(x)), np.float64)  # (A, B, T, N)
    _check_linear(layer, np.transpose(x, (0, 2, 1, 3)), jnp.asarray(y))
    g = _signed(rng, (3, 16, 512)).astype(np.float32)

    def loss(t: jax.Array, gi: jax.Array) -> jax.Array:
        return jnp.sum(sparse_linear(t, layer.values, layer.meta, layer.bias).astype(jnp.float32) * gi)

    dx = np.asarray(jax.jit(jax.vmap(jax.grad(loss)))(jnp.asarray(x[:, :, 0]), jnp.asarray(g)), np.float64)
    w = layer.dense().astype(np.float64)
    want = g.astype(np.float64) @ w
    bound = 1024 * np.finfo(np.float32).eps * (np.abs(g).astype(np.float64) @ np.abs(w)) + 1e-6
    assert dx.shape == want.shape and (np.abs(dx - want) <= bound).all(), float((np.abs(dx - want) / bound).max())
