"""sparsile.jax.sparse_linear / SparseLinear on the CPU (the shipped Hopper sparse GEMM in the
interpreter, through the FFI handler or a host callback): numerics against float64, vmap, the
split-K and K-padding launch plans, and the errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import JaxCallError, SparseLinear, sparse_linear  # noqa: E402

EPS = {"f16": 2.0**-11, "bf16": 2.0**-8}


def _layer(n_out: int, k: int, dtype: str, bias: bool = True, seed: int = 0) -> SparseLinear:
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.25, 1.0, (n_out, k)) * rng.choice([-1, 1], (n_out, k))
    b = rng.standard_normal(n_out) if bias else None
    return SparseLinear.from_dense(w, dtype, bias=b)


def _x(shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.25, 1.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


def _check(layer: SparseLinear, x: np.ndarray, y: jax.Array, dtype: str) -> None:
    """y against float64: x rounded to the operand type, W @ x.T in f32 (error ~K f32 ulps),
    C stored in f16 (half an f16 ulp of |C|), then the bias in f32."""
    assert y.dtype == jnp.float32 and y.shape == (*x.shape[:-1], layer.values.shape[0])
    operand = np.float16 if dtype == "f16" else jnp.bfloat16
    xq = np.asarray(jnp.asarray(x).astype(operand)).astype(np.float64).reshape(-1, x.shape[-1])
    w = layer.dense().astype(np.float64)
    c = xq @ w.T
    bias = 0.0 if layer.bias is None else np.asarray(layer.bias, np.float64)
    ref = c + bias
    mag = np.abs(xq) @ np.abs(w).T
    bound = 2.0**-11 * np.abs(c) + x.shape[-1] * np.finfo(np.float32).eps * mag + 1e-6 * (1 + np.abs(ref))
    err = np.abs(np.asarray(y, np.float64).reshape(ref.shape) - ref)
    assert (err <= bound).all(), float((err / bound).max())


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_jitted_layer_matches_float64(dtype: str) -> None:
    layer = _layer(96, 64, dtype)
    x = _x((2, 3, 64))
    _check(layer, x, jax.jit(layer)(x), dtype)


def test_padding_of_k_and_no_bias() -> None:
    layer = _layer(64, 40, "f16", bias=False)  # K = 40: TMA rows need 16 elements, so K is padded to 48
    x = _x((5, 40))
    _check(layer, x, jax.jit(lambda x: sparse_linear(x, layer.values, layer.meta))(x), "f16")


def test_split_k_runs_the_reduce_kernel() -> None:
    layer = _layer(64, 128, "f16")
    x = _x((4, 128))
    f = jax.jit(lambda x: sparse_linear(x, layer.values, layer.meta, layer.bias, split_k=2))
    assert f.lower(x).as_text().count("sparsile_call") >= 2  # the split-K kernel, then splitk_reduce
    _check(layer, x, f(x), "f16")


def test_interpret_callback_matches_ffi_path() -> None:
    layer = _layer(64, 64, "bf16")
    x = _x((3, 64))
    a = jax.jit(layer)(x)
    b = jax.jit(lambda x: sparse_linear(x, layer.values, layer.meta, layer.bias, interpret=True))(x)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_vmap_folds_the_batch_into_tokens() -> None:
    layer = _layer(64, 64, "f16")
    x = _x((3, 2, 64))
    batched = jax.jit(jax.vmap(layer))(x)
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(jax.jit(layer)(x)))
    text = jax.jit(jax.vmap(layer)).lower(x).as_text()
    assert text.count("sparsile_call") == 1  # one call for the whole batch


def test_two_layer_mlp_jitted() -> None:
    l1, l2 = _layer(64, 64, "f16", seed=3), _layer(32, 64, "f16", seed=4)
    x = _x((4, 64))

    @jax.jit
    def mlp(x: jax.Array) -> jax.Array:
        return l2(jax.nn.relu(l1(x)))

    h = np.asarray(jax.jit(l1)(x))
    _check(l1, x, jnp.asarray(h), "f16")
    _check(l2, np.maximum(h, 0), mlp(x), "f16")


def test_pytree_layer_is_a_jit_argument() -> None:
    layer = _layer(32, 32, "bf16")
    x = _x((2, 32))
    leaves = jax.tree_util.tree_leaves(layer)
    assert len(leaves) == 3
    y = jax.jit(lambda layer, x: layer(x))(layer, x)
    _check(layer, x, y, "bf16")


# ------------------------------------------------------------------------------------------------
# errors


def _raises(code: str, fn, message: str) -> None:
    with pytest.raises(JaxCallError) as info:
        fn()
    assert info.value.code == code
    assert info.value.message.startswith(message), info.value.message


def test_input_errors() -> None:
    layer = _layer(32, 64, "f16")
    v, m = layer.values, layer.meta
    _raises("SP0938", lambda: sparse_linear(_x((2, 48)), v, m),
            "x has K = 48 features but values cover K = 64 (shape (32, 32))")
    _raises("SP0938", lambda: sparse_linear(_x((2, 64)), v, m[:, :1]), "meta must be (32, 2) uint32 sm90 metadata")
    _raises("SP0938", lambda: sparse_linear(_x((2, 64)), v, m, jnp.zeros(31)), "bias must have shape (32,), got (31,)")
    _raises("SP0938", lambda: sparse_linear(_x((2, 64)), v.astype(jnp.float32), m),
            "there is no sparse linear kernel for float32 values")
    _raises("SP0938", lambda: sparse_linear(_x((2, 64)).astype(np.int32), v, m), "x must be floating point, got int32")
    _raises("SP0938", lambda: SparseLinear.from_dense(np.ones((4, 8)), "e4m3"),
            "SparseLinear.from_dense has no 'e4m3' weights")
    _raises("SP0938", lambda: sparse_linear(_x((2, 64)), v, m, scale_x=np.ones(3)),
            "scale_x must be a number or of shape (2,), got shape (3,)")
    _raises("SP0938", lambda: sparse_linear(_x((2, 64)), v, m, scale_w=np.ones((2, 2))),
            "scale_w must be a number or of shape (32,), got shape (2, 2)")
    _raises("SP0938", lambda: sparse_linear(_x((2, 0)), v[:, :0], m[:, :0]), "x has no features (K = 0)")
    e4 = SparseLinear(v.astype(jnp.float8_e4m3fn), m)
    _raises("SP0938", lambda: e4(_x((2, 64))), "e4m3 weights need e4m3 activations, got x of float32")


@pytest.mark.parametrize(("activation", "message", "help"), [
    ("gelu", "unknown activation 'gelu'", "activation is None, 'relu', 'silu' or 'gelu_tanh'"),
    ("swiglu", "activation 'swiglu' is fused by the decode kernel only, which this call does not run",
     "pass activation=None and compute silu(y[:, :F]) * y[:, F:] of the (T, 2F) result"),
])
def test_activations_of_the_tiled_kernels_only(activation: str, message: str, help: str) -> None:
    """sparsile.jax runs the tiled kernels: "swiglu" (the decode kernel's) is refused before anything
    is planned, as an unknown name is (a plan of it would size y as (T, 2F))."""
    from sparsile.stdlib.sparsity import SparsityError

    layer = _layer(64, 64, "f16")
    for split_k in (None, 2):
        with pytest.raises(SparsityError) as info:
            sparse_linear(_x((2, 64)), layer.values, layer.meta, activation=activation, split_k=split_k)
        assert (info.value.code, info.value.message, info.value.help) == ("SP0850", message, help)


def test_grad_of_the_weight_is_refused() -> None:
    layer = _layer(32, 32, "f16")
    x = _x((2, 32))
    _raises("SP0934", lambda: jax.grad(lambda v: layer.__class__(v, layer.meta)(x).sum())(layer.values),
            "sparse_linear's weight is frozen: values has no gradient")
    # (jax.vmap over the weight runs one call per member: test_jax_vmap_weight.py)


def test_empty_batch() -> None:
    layer = _layer(32, 32, "f16")
    y = jax.jit(layer)(np.zeros((0, 32), np.float32))
    assert y.shape == (0, 32) and y.dtype == jnp.float32


def test_gpu_launch_values_of_the_sparse_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the CUDA handler hands the launcher, built from the real sm_90a parameter spec without a
    GPU: XLA's addresses for pointers, a described buffer for each TMA tensor, the static scalars
    and the epilogue's constexprs (a bias, no scales: their parameters are the integer 0, never read)."""
    from sparsile.backend.runtime.arguments import describe_array
    from sparsile.driver.compiler import compile_cached
    from sparsile.driver.kernel import KERNEL_OPTIONS
    from sparsile.driver.launch import param_spec
    from sparsile.frontend.interp.host_arrays import stored_params
    from sparsile.integrations.jax import ffi
    from sparsile.integrations.jax.call import DeviceView, needs_info
    from sparsile.target.targets import get_target

    layer = _layer(256, 64, "f16")
    traced = []
    add_plan = ffi.add_plan
    monkeypatch.setattr(ffi, "add_plan", lambda plan, *rest: traced.append(plan) or add_plan(plan, *rest))
    jax.jit(layer).lower(_x((24, 64)))
    (plan,) = traced
    options = {**KERNEL_OPTIONS, **plan.kernel.options}
    ck = compile_cached(plan.kernel, plan.bindings, plan.key, get_target("sm_90a"), options)
    spec = param_spec(plan.kernel, plan.bindings, ck.params, stored_params(plan.kernel.ir_for(plan.bindings, plan.key)))
    assert plan.kernel.name == "sparse_linear_f16"
    ins = [ffi.XlaBuffer(0x10000, "float16", (256, 32)), ffi.XlaBuffer(0x20000, "uint32", tuple(layer.meta.shape)),
           ffi.XlaBuffer(0x30000, "float16", (24, 64)), ffi.XlaBuffer(0x50000, "float32", (256,)),
           ffi.XlaBuffer(0x60000, "float32", (1,)), ffi.XlaBuffer(0x70000, "float32", (1,))]
    outs = [ffi.XlaBuffer(0x40000, "float32", (24, 256))]
    values = dict(zip([p.name for p in spec.user_params],
                      plan.launch_values(spec, needs_info(spec), ins, outs, 0), strict=True))
    assert {k: type(v).__name__ for k, v in values.items() if k in ("A", "A.tmap0", "B", "B.tmap1")} == \
        dict.fromkeys(("A", "A.tmap0", "B", "B.tmap1"), "DeviceView")
    assert (values["E"], values["Y"], values["Bias"], values["SW"], values["SX"]) == \
        (0x20000, 0x40000, 0x50000, 0, 0)
    assert (values["M"], values["N"], values["K"], values["lde"], values["ldy"], values["BN"]) == \
        (256, 24, 64, layer.meta.shape[1], 256, 32)
    assert (values["BIAS"], values["ACT"], values["SCALE_W"], values["SCALE_X"]) == (1, "none", 0, 0)
    assert values["BM"] == 128 and values["STAGES"] == 4  # defaults the call left out
    info = describe_array(values["B"])
    assert isinstance(values["B"], DeviceView)
    assert (info.ptr, info.dtype, info.shape, info.strides, info.device) == (0x30000, "f16", (24, 64), (64, 1), 0)


def test_plan_numbers_are_content_hashes() -> None:
    """The same program traced twice names the same plan (so a persistent compilation cache entry
    is valid in another process); another shape names another plan."""
    layer = _layer(32, 32, "f16")
    a = jax.jit(layer).lower(_x((2, 32))).as_text()
    b = jax.jit(lambda x: layer(x)).lower(_x((2, 32))).as_text()
    c = jax.jit(layer).lower(_x((3, 32))).as_text()

    def plans(text: str) -> list[str]:
        return re.findall(r"sparsile_plan = (\d+)", text)

    assert plans(a) and plans(a) == plans(b) and plans(a) != plans(c)


def test_call_the_shipped_kernel_with_tagged_metadata() -> None:
    """call() with the Hopper kernel itself: a MetadataBuffer is checked against the kernel's
    meta[T] parameter (its tag) and passed as its words; metadata of another width is SP0809."""
    from sparsile.integrations.jax import call
    from sparsile.stdlib.kernels import kernel_module, prune_and_compress
    from sparsile.stdlib.sparsity import SparsityError

    rng = np.random.default_rng(7)
    w = rng.uniform(0.25, 1.0, (128, 64)) * rng.choice([-1, 1], (128, 64))
    weight = prune_and_compress(w, "f16")
    values, meta = weight
    b = _x((16, 64)).astype(np.float16)
    scalars = {"M": 128, "N": 16, "K": 64, "lde": int(meta.data.shape[1]), "ldc": 16, "BN": 16}
    c = call(kernel_module().sparse_gemm_f16, (1, 1), values, meta, b,
             out_shapes=jax.ShapeDtypeStruct((128, 16), jnp.float16), **scalars)
    dense = weight.dense().astype(np.float64)
    ref = dense @ b.astype(np.float64).T
    bound = 2.0**-11 * np.abs(ref) + 64 * np.finfo(np.float32).eps * (np.abs(dense) @ np.abs(b.astype(np.float64)).T)
    assert (np.abs(np.asarray(c, np.float64) - ref) <= bound).all()
    _, e4m3_meta = prune_and_compress(w, "e4m3")
    with pytest.raises(SparsityError) as info:
        call(kernel_module().sparse_gemm_f16, (1, 1), values, e4m3_meta, b,
             out_shapes=jax.ShapeDtypeStruct((128, 16), jnp.float16), **scalars)
    assert info.value.code == "SP0809"


EPILOGUES = [
    # dtype, N_out, T, K, out_dtype, bias, activation, scale_w, scale_x, split_k
    ("f16", 130, 17, 96, None, True, "relu", None, None, 1),
    ("bf16", 96, 6, 64, "float32", False, "silu", "channel", None, 2),
    ("bf16", 100, 12, 80, "bfloat16", True, "gelu_tanh", "tensor", "token", 1),
    ("e4m3", 64, 5, 128, None, True, "relu", "channel", "token", 2),
]


@pytest.mark.parametrize(("dtype", "n_out", "t", "k", "out_dtype", "bias", "act", "sw", "sx", "split"), EPILOGUES)
def test_fused_epilogue_matches_float64(dtype: str, n_out: int, t: int, k: int, out_dtype: str | None, bias: bool,
                                        act: str, sw: str | None, sx: str | None, split: int) -> None:
    """The epilogue of stdlib/kernels/linear.py (bias, activation, scales, y's type) through JAX,
    with the bound its own tests use (tests/stdlib/test_linear_api.py)."""
    from sparsile.tests.stdlib.test_linear_api import assert_linear_close, problem, vectors

    rng = np.random.default_rng(t)
    weight, x = problem(dtype, n_out, t, k, t)
    want = out_dtype or ("bfloat16" if dtype == "e4m3" else str(x.dtype))
    epi = {"bias": rng.standard_normal(n_out).astype(np.float32) if bias else None, "activation": act,
           "scale_w": vectors(sw, n_out, rng), "scale_x": vectors(sx, t, rng, 3 / 448)}
    y = jax.jit(lambda x: sparse_linear(x, jnp.asarray(weight.values), jnp.asarray(weight.meta.data),
                                        out_dtype=out_dtype, split_k=split, **epi))(x)
    assert_linear_close(np.asarray(y), weight, x, k, dtype, want, **epi)


def test_vmap_with_per_token_scales() -> None:
    layer = _layer(32, 64, "bf16")
    x = _x((3, 4, 64))
    sx = np.random.default_rng(2).uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    batched = jax.jit(jax.vmap(lambda x, s: layer(x, scale_x=s)))(x, sx)
    whole = jax.jit(lambda x, s: layer(x, scale_x=s))(x, sx)
    np.testing.assert_array_equal(np.asarray(batched), np.asarray(whole))
    ref = jax.jit(layer)(x) - layer.bias  # scale_x multiplies the product, before the bias
    np.testing.assert_allclose(np.asarray(whole - layer.bias), np.asarray(ref) * sx[..., None], rtol=1e-5, atol=1e-5)


def test_vmap_with_one_scale_x_per_member() -> None:
    """vmap of a call whose scale_x is one number per member (x of several tokens): it was refused
    with SP0938 (the batched (B,) scale looked like a wrong per-token one); now each member's tokens
    take its scale, as B separate calls do, and as float64 says."""
    layer = _layer(32, 64, "bf16")
    x = _x((3, 4, 64))
    s = np.array([0.5, 2.0, 3.0], np.float32)
    for scales in (s, s[:, None]):
        batched = jax.jit(jax.vmap(lambda x, s: layer(x, scale_x=s)))(x, scales)
        one_by_one = np.stack([np.asarray(layer(x[i], scale_x=scales[i])) for i in range(3)])
        np.testing.assert_array_equal(np.asarray(batched), one_by_one)
    unbatched_x = jax.vmap(lambda s: layer(x[0], scale_x=s))(s)
    np.testing.assert_array_equal(np.asarray(unbatched_x), np.stack([np.asarray(layer(x[0], scale_x=v)) for v in s]))
    xq = np.asarray(jnp.asarray(x).astype(jnp.bfloat16)).astype(np.float64)
    ref = (xq @ layer.dense().astype(np.float64).T) * s[:, None, None] + np.asarray(layer.bias, np.float64)
    assert np.abs(np.asarray(batched, np.float64) - ref).max() <= 1e-5 * np.abs(ref).max()


def test_bad_options_and_operand_types_are_diagnostics() -> None:
    """split_k, interpret, bias and the scales are checked before jax sees them: a string bias or
    scale was jax's TypeError, split_k=0 / -1 / True a grid error of the launch plan and 100 ran,
    interpret="no" turned the interpreter on."""
    from sparsile.stdlib.sparsity import SparsityError

    layer = _layer(32, 64, "f16")
    v, m, x = layer.values, layer.meta, _x((2, 64))
    for split_k in (0, -1, 65, True, "2", 2.0):
        with pytest.raises(SparsityError) as info:
            sparse_linear(x, v, m, split_k=split_k)
        assert (info.value.code, info.value.message) == ("SP0804", f"split_k must be an integer from 1 to 64, "
                                                                   f"got {split_k!r}")
    with pytest.raises(SparsityError) as info:
        sparse_linear(x, v, m, interpret="no")
    assert (info.value.code, info.value.message) == ("SP0804", "interpret must be True or False, got 'no'")
    for what in ("bias", "scale_x", "scale_w"):
        _raises("SP0938", lambda what=what: sparse_linear(x, v, m, **{what: "1"}),
                f"{what} must be a real number or array, got str")
    _raises("SP0938", lambda: sparse_linear(x, v, m, np.ones(32, np.complex64)),
            "bias must be a real number or array, got complex64 array")


@pytest.mark.parametrize(("k", "x_k"), [(500, 490), (512, 500), (40, 36)])
def test_the_layer_checks_x_against_its_own_in_features(k: int, x_k: int) -> None:
    """A layer from_dense of K = 500 took an x of 490 features (the values' width check lets x be up to
    one K step narrower, as padded values need): y from a weight whose last columns met zeros, no
    error. SparseLinear records in_features (static) and checks x against it; dense() is (N, K)."""
    layer = _layer(32, k, "bf16")
    assert layer.in_features == k and layer.dense().shape == (32, k)
    with pytest.raises(JaxCallError) as info:
        layer(_x((2, x_k)))
    assert str(info.value).splitlines()[0].startswith(f"error[SP0938]: x has K = {x_k} features but the layer "
                                                      f"takes in_features = {k} (at test_jax_linear.py:")
    with pytest.raises(JaxCallError):
        jax.jit(layer)(_x((2, x_k)))
    _check(layer, _x((2, k)), jax.jit(layer)(_x((2, k))), "bf16")


def _tagged(n_out: int, k: int, dtype: str = "bf16", fmt: str = "sm90", seed: int = 5):
    """(dense weight, values as a jax array, the MetadataBuffer prune_and_compress returns)."""
    from sparsile.stdlib.kernels import prune_and_compress

    rng = np.random.default_rng(seed)
    w = rng.uniform(0.25, 1.0, (n_out, k)) * rng.choice([-1, 1], (n_out, k))
    values, meta = prune_and_compress(w, dtype, fmt)
    return w, jnp.asarray(values), meta


def test_the_metadata_buffer_of_prune_and_compress_is_a_meta_argument() -> None:
    """``prune_and_compress`` returns (values, MetadataBuffer): passed as it is, ``meta`` was jax's
    TypeError ("Error interpreting argument to custom_jvp_call as a JAX value"). The buffer's tag is
    checked (format, operand width, rows) and its K is the weight's true in_features, so an x a few
    features short of K (the padded values cannot tell) is SP0938 instead of a silent wrong y."""
    from sparsile.stdlib.sparsity import SparsityError

    _, values, meta = _tagged(32, 500)
    layer = SparseLinear(values, jnp.asarray(np.asarray(meta)), in_features=500)
    x = _x((3, 500))
    want = np.asarray(jax.jit(layer)(x))
    _check(layer, x, jnp.asarray(want), "bf16")
    got = jax.jit(lambda x: sparse_linear(x, values, meta))(x)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda x: sparse_linear(x, values, meta))(x[:, None])[:, 0]),
                                  want)
    dx = jax.grad(lambda x: sparse_linear(x, values, meta).sum())(x)
    np.testing.assert_allclose(np.asarray(dx), np.broadcast_to(layer.dense().astype(np.float32).sum(0), x.shape),
                               rtol=1e-6)
    short = _x((3, 490))
    for fn in (lambda: sparse_linear(short, values, meta),
               lambda: jax.jit(lambda x: sparse_linear(x, values, meta))(short),
               lambda: jax.vmap(lambda x: sparse_linear(x, values, meta))(short[:, None])):
        with pytest.raises(JaxCallError) as info:
            fn()
        assert info.value.code == "SP0938"
        assert info.value.message.startswith("x has K = 490 features but the weight has in_features = 500")
    _raises("SP0938", lambda: sparse_linear(x, values, meta, in_features=496),
            "in_features = 496 was given, but the metadata was encoded for K = 500")
    # the tag against the kernel: another format, another operand width, another weight's rows
    _, _, tcgen05 = _tagged(32, 500, fmt="tcgen05")
    _, _, e4m3 = _tagged(32, 500, "e4m3")
    _, _, taller = _tagged(64, 500)
    for meta_, code in ((tcgen05, "SP0810"), (e4m3, "SP0809"), (taller, "SP0812")):
        with pytest.raises(SparsityError) as info:
            sparse_linear(x, values, meta_)
        assert info.value.code == code, info.value


def test_a_layer_takes_the_metadata_buffer_and_its_in_features() -> None:
    """SparseLinear(values, MetadataBuffer) holds the words as a jax array (a pytree leaf: jax.jit of
    the layer failed on the buffer) and takes in_features from the tag."""
    _, values, meta = _tagged(32, 500)
    layer = SparseLinear(values, meta, bias=jnp.ones(32))
    assert layer.in_features == 500 and layer.meta.dtype == jnp.uint32
    assert layer.dense().shape == (32, 500)
    x = _x((2, 500))
    _check(layer, x, jax.jit(lambda layer, x: layer(x))(layer, x), "bf16")
    with pytest.raises(JaxCallError) as info:
        jax.jit(layer)(_x((2, 490)))
    assert info.value.code == "SP0938"
    _raises("SP0938", lambda: SparseLinear(values, meta, in_features=512),
            "in_features = 512 was given, but the metadata was encoded for K = 500")


def test_the_functional_form_takes_in_features() -> None:
    """``sparse_linear(..., in_features=K)`` refuses an x of another width (the functional form had
    no way to: a short x read zeros from the padding), checks K against the values, and is static."""
    layer = _layer(32, 500, "bf16")
    v, m = layer.values, layer.meta
    x = _x((2, 500))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: sparse_linear(x, v, m, layer.bias, in_features=500))(x)),
                                  np.asarray(jax.jit(layer)(x)))
    assert sparse_linear(_x((2, 490)), v, m).shape == (2, 32)  # (without it: the values' padded K, as documented)
    for fn in (lambda x: sparse_linear(x, v, m, in_features=500),
               jax.jit(lambda x: sparse_linear(x, v, m, in_features=500)),
               jax.vmap(lambda x: sparse_linear(x, v, m, in_features=500))):
        _raises("SP0938", lambda fn=fn: fn(_x((2, 490))), "x has K = 490 features but the weight has in_features = 500")
    _raises("SP0938", lambda: sparse_linear(_x((2, 100)), v, m, in_features=100),
            "in_features = 100 does not fit values of shape (32, 250), which hold a weight of K = 500")
    for bad in ("500", True, 0, -4, 500.0):
        _raises("SP0938", lambda bad=bad: sparse_linear(x, v, m, in_features=bad),
                f"in_features must be a positive integer, got {bad!r}")
    _raises("SP0932", lambda: jax.jit(lambda k: sparse_linear(x, v, m, in_features=k))(500),
            "in_features of sparse_linear is static, but got a traced value")
    assert sparse_linear(x, v, m, in_features=np.int64(500)).shape == (2, 32)


def test_the_layer_checks_its_own_in_features() -> None:
    """A hand-built layer's in_features is checked when it is made: a string compared unequal to
    every width (a call said "x has K = 64 features but the layer takes in_features = 64"), a traced
    one was jax's TracerBoolConversionError."""
    layer = _layer(32, 64, "f16")
    v, m = layer.values, layer.meta
    _raises("SP0938", lambda: SparseLinear(v, m, in_features="64"), "in_features must be a positive integer, got '64'")
    _raises("SP0932", lambda: jax.jit(lambda k: SparseLinear(v, m, in_features=k)(_x((2, 64))))(64),
            "in_features of sparse_linear is static, but got a traced value")
    assert SparseLinear(v, m, in_features=np.int32(64)).in_features == 64
    assert type(SparseLinear(v, m, in_features=np.int32(64)).in_features) is int
