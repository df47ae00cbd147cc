"""NaN, ±inf, -0.0 and ties through the steps a weight and its activations go through, host (numpy)
and GPU kernels (in the CPU interpreter) alike (docs/sparse-metadata.md, "Special values"):

* magnitude pruning and compression: the documented rule (the two largest magnitudes, ties to the
  lower index, NaN above every number, -0.0 counts as zero) on groups drawn from a few special
  values, host and GPU kernels bit for bit, decompression back to the pruned matrix bit for bit
  (NaN payloads included; a -0.0 the format does not store comes back as +0.0);
* the per-token e4m3 quantizer (quantize.spk and the decode kernel that quantizes x itself): a NaN
  stays NaN, ±inf makes the token's scale inf and becomes ±448, a zero row gives exact zeros;
* the sparse product: a NaN or inf of x at a position the weight stores reaches y as a dense product
  gives it; a position the metadata does not name is never multiplied (the sparse tensor cores
  select x's elements by the metadata), so its inf or NaN does not reach y; relu keeps NaN, as
  torch's does.

Every reference here is float64 (or the quantizer's own f32 arithmetic, element by element)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import prune_and_compress
from sparsile.stdlib.kernels import sparsity_gpu as G
from sparsile.stdlib.kernels.decode import plan_sparse_decode
from sparsile.stdlib.kernels.gemm import sparse_matmul
from sparsile.stdlib.kernels.linear import quantize_per_token_e4m3, sparse_linear
from sparsile.stdlib.sparsity.prune import keep_mask_reference

INF, NAN = np.inf, np.nan
FLOOR = np.float32(1 / (448 * 512))


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.itemsize}")


def stored_mask(values: np.ndarray, meta: S.MetadataBuffer) -> np.ndarray:
    """(M, K) bool: the positions the metadata names (the elements the MMA multiplies)."""
    values = np.asarray(S.as_host_array(values, "values"))
    return np.asarray(S.decompress(np.ones(values.shape, values.dtype), meta)) != 0


def stored_product(dense: np.ndarray, stored: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float64 y[t, n] = sum over the positions k that row n stores of dense[n, k] * x[t, k]."""
    d, xs = dense.astype(np.float64), x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.stack([np.where(stored, d * row, 0.0).sum(axis=1) for row in xs])


def assert_same_specials(y: np.ndarray, ref: np.ndarray, rtol: float, atol: float = 1e-3,
                         abs_sum: np.ndarray | None = None, sum_rtol: float = 0.0) -> None:
    """NaN, +inf and -inf at the same places; the finite values within ``rtol`` and ``atol``, plus
    ``sum_rtol`` times ``abs_sum`` (the sum of the products' magnitudes, which bounds the rounding
    error of a dot product whose terms cancel) where it is given."""
    y, ref = np.asarray(y).astype(np.float64), np.asarray(ref).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(y), np.isneginf(ref))
    finite = np.isfinite(ref)
    if abs_sum is None:
        np.testing.assert_allclose(y[finite], ref[finite], rtol=rtol, atol=atol)
        return
    error, allowed = np.abs(y - ref)[finite], (atol + rtol * np.abs(ref) + sum_rtol * abs_sum)[finite]
    worst = int(np.argmax(error / allowed))
    assert (error <= allowed).all(), (
        f"{int((error > allowed).sum())} of {error.size} finite values off; worst {y[finite][worst]} against "
        f"{ref[finite][worst]} (allowed {allowed[worst]:.3g})")


# ------------------------------------------------------------------------------------------------
# pruning and compression, host and GPU kernels


# magnitudes repeated with both signs (ties), both zeros, NaNs with other payloads and signs, ±inf
SPECIALS = {
    "f16": [0x0000, 0x8000, 0x3C00, 0xBC00, 0x4000, 0xC000, 0x0001, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01,
            0x7FFF],
    "bf16": [0x0000, 0x8000, 0x3F80, 0xBF80, 0x4000, 0xC000, 0x0001, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81,
             0x7FFF],
    "e4m3": [0x00, 0x80, 0x38, 0xB8, 0x40, 0xC0, 0x01, 0x7E, 0xFE, 0x7F, 0xFF],
    "e5m2": [0x00, 0x80, 0x3C, 0xBC, 0x40, 0xC0, 0x01, 0x7B, 0x7C, 0xFC, 0x7E, 0xFF, 0x7D],
    "tf32": [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x40000000, 0xC0000000, 0x00000001, 0x7F7FFFFF,
             0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF],
}


@st.composite
def special_matrix(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    """(operand, an (M, K) matrix of its host dtype) whose groups each mix a few of SPECIALS (so
    that ties, zeros of both signs and several NaNs meet in one group); K ragged now and then."""
    dtype = draw(st.sampled_from(sorted(SPECIALS)))
    op = S.operand_type(dtype)
    m, k = draw(st.integers(1, 20)), draw(st.integers(1, 40))
    alphabet = draw(st.lists(st.sampled_from(SPECIALS[dtype]), min_size=2, max_size=4, unique=True))
    seed = draw(st.integers(0, 2**16))
    raw = np.asarray(alphabet, f"u{op.host_dtype.itemsize}")[np.random.default_rng(seed).integers(
        0, len(alphabet), size=(m, k))]
    return dtype, raw.view(op.host_dtype)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(case=special_matrix(), fmt=st.sampled_from(("sm90", "tcgen05")))
def test_pruning_of_special_values_follows_the_rule_on_host_and_gpu(case: tuple[str, np.ndarray], fmt: str) -> None:
    """The keep mask is the documented rule (``keep_mask_reference`` on the magnitude keys, the
    bits of |x|: NaN above +inf, NaNs by their payload bits, ties to the lower index); the GPU
    kernels (interpreter) give the host's bits for the pruned matrix, the values and the metadata;
    decompression gives back the pruned matrix bit for bit, except that a -0.0 the format does not
    store (negative zero counts as zero) comes back +0.0, on both sides."""
    dtype, w = case
    op = S.operand_type(dtype)
    m, k = w.shape
    kp = -(-k // op.group) * op.group
    padded = np.zeros((m, kp), w.dtype)
    padded[:, :k] = w
    sign = np.array(1 << (8 * w.itemsize - 1), bits(w).dtype)
    keys = (bits(padded) & ~sign).reshape(m, kp // op.group, op.group)  # |x|'s bits: NaNs above inf, by payload
    rule = keep_mask_reference(keys, op.pattern.keep).reshape(m, kp)[:, :k]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's casts of NaN in the host keys
        mask = S.prune_mask(w, dtype)
        pruned = S.prune(w, dtype)
        values, indices = S.compress(w, dtype, prune=True)
    np.testing.assert_array_equal(mask, rule)
    np.testing.assert_array_equal(bits(pruned), np.where(rule, bits(w), 0))
    meta = S.encode_metadata(indices, fmt, dtype, k=k)
    np.testing.assert_array_equal(bits(G.prune_gpu(w, dtype, interpret=True)), bits(pruned))
    g_values, g_meta = G.compress_gpu(w, dtype, fmt, interpret=True)
    np.testing.assert_array_equal(bits(g_values), bits(values))
    np.testing.assert_array_equal(g_meta.data, meta.data)
    back, g_back = S.decompress(values, meta), G.decompress_gpu(g_values, g_meta, interpret=True)
    np.testing.assert_array_equal(bits(g_back), bits(back))
    stored = stored_mask(values, meta)
    np.testing.assert_array_equal(bits(back)[stored], bits(pruned)[stored])
    assert not bits(back)[~stored].any()  # +0.0: unstored elements are zeros (a pruned -0.0 included)
    assert (pruned[~stored].astype(np.float32) == 0).all()


# ------------------------------------------------------------------------------------------------
# the per-token e4m3 quantizer


def quantize_model(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The quantizer's f32 arithmetic element by element: amax over the row skipping NaN (NaN only
    for a row of NaNs), S = max(amax / 448, 1 / (448 * 512)), p = x * (1 / S), a NaN p (x NaN, or x
    infinite times 1 / inf = 0) replaced by x, then saturated to ±448 (NaN stays NaN) and rounded."""
    x = np.asarray(x, np.float32)
    amax = np.fmax.reduce(np.abs(x), axis=1)
    scale = np.fmax(amax / np.float32(448), FLOOR).astype(np.float32)
    with np.errstate(invalid="ignore"):
        p = x * (np.float32(1) / scale)[:, None]
    p = np.where(np.isnan(p), x, p)
    return np.clip(p, -448, 448).astype(ml_dtypes.float8_e4m3fn), scale


SPECIAL_ROWS = np.array([
    [1.0, NAN, 2.0, -3.0, 0.5, -0.25, 7.0, 1.0],      # a NaN: NaN, the rest scaled by the finite amax
    [1.0, INF, 2.0, -3.0, 0.5, -0.25, 7.0, 1.0],      # +inf: scale inf, +448, the rest ±0
    [1.0, -INF, 2.0, -3.0, 0.5, -0.25, 7.0, NAN],     # -inf and a NaN
    [INF, -INF, 0.0, -0.0, 1.0, -1.0, INF, 3.0],      # both infinities
    [0.0] * 8,                                         # zeros: the floor scale, exact zeros
    [-0.0] * 8,
    [NAN] * 8,                                         # every element NaN: the floor scale, NaN
    [1e-40, -1e-40, 0.0, 1e-38, 0, 0, 0, 0],          # subnormal: below the floor's resolution, zeros
    [1000.0, -1000.0, 448.0, 1.0, 0.001, 0, 0, 0],    # saturating: amax -> 448
    [3.4e38, -3.4e38, 1.0, 0, 0, 0, 0, 0],            # the largest f32
], np.float32)


@pytest.mark.parametrize("k", [8, 40, 20000])  # one pass; one pass, masked; two passes
def test_quantizer_propagates_nan_and_inf_and_keeps_zero_rows_exact(k: int) -> None:
    x = np.zeros((len(SPECIAL_ROWS), k), np.float32)
    x[:, :8] = SPECIAL_ROWS
    x[:, -8:] = SPECIAL_ROWS  # (in the last step of the two-pass loop too)
    xq, scale = quantize_per_token_e4m3(x, interpret=True)
    want_q, want_scale = quantize_model(x)
    np.testing.assert_array_equal(bits(scale), bits(want_scale))
    np.testing.assert_array_equal(bits(xq), bits(want_q))
    q = xq.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(q), np.isnan(x))  # a NaN stays NaN; nothing else becomes NaN
    np.testing.assert_array_equal(q[np.isposinf(x)], 448.0)
    np.testing.assert_array_equal(q[np.isneginf(x)], -448.0)
    infinite = np.isinf(x).any(axis=1)
    np.testing.assert_array_equal(np.isposinf(scale), infinite)
    assert (q[infinite][np.isfinite(x[infinite])] == 0).all()  # x / inf
    assert scale[4] == scale[5] == scale[6] == FLOOR and (q[4:6] == 0).all() and not np.isnan(q[4:6]).any()
    assert np.signbit(q[5][np.signbit(x[5])]).all()  # -0.0 stays -0.0
    assert scale[8] == np.float32(1000 / 448) and q[8, :3].tolist() == [448.0, -448.0, 208.0]  # (200.7 rounded)


def e4m3_problem(n_out: int, t: int, k: int, seed: int):
    """An e4m3 weight with per-channel scales and a bf16 x whose rows hold NaN or ±inf at a position
    row 0 of the weight stores (rows 1-3) or does not store (rows 4-5), and a zero row (6)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_out, k)).astype(np.float32) * 64
    weight = prune_and_compress(w, "e4m3")
    stored = stored_mask(weight.values, weight.meta)
    on = int(np.nonzero(stored[0] & (weight.dense()[0].astype(np.float32) != 0))[0][0])
    off = int(np.nonzero(~stored[0])[0][0])
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[1, on], x[2, on], x[3, on], x[3, on + 1] = NAN, INF, -INF, NAN
    x[4, off], x[5, off] = NAN, INF
    x[6] = 0
    return weight, stored, x.astype(ml_dtypes.bfloat16)


def e4m3_reference(weight, stored, xq, sx, sw, magnitudes: bool = False) -> np.ndarray:
    """float64 y = (x_q @ values^T over the stored positions) * scale_x * scale_w; with
    ``magnitudes``, the same sum of the products' magnitudes (the scale of its rounding error)."""
    dense, xq, sx = weight.dense().astype(np.float64), xq.astype(np.float64), sx.astype(np.float64)
    if magnitudes:
        dense, xq, sx = np.abs(dense), np.abs(xq), np.abs(sx)
    acc = stored_product(dense, stored, xq)
    with np.errstate(invalid="ignore"):
        return acc * sx[:, None] * sw.astype(np.float64)[None, :]


@pytest.mark.parametrize("path", ["tiled", "decode two launches", "decode one launch"])
def test_e4m3_linear_takes_nan_and_inf_of_x_to_y(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN or ±inf in a token of x give NaN or ±inf in its outputs, as float64 of the quantized
    operands does (never a finite number: before, NaN became -448 and +inf -448 times an infinite
    scale); the zero token gives the bias alone. The decode kernel that quantizes x itself gives the
    two-launch bits."""
    n_out, t, k = 64, 7, 256
    weight, stored, x = e4m3_problem(n_out, t, k, seed=3)
    sw = np.full(n_out, 1 / 64, np.float32)
    bias = np.linspace(-1, 1, n_out).astype(np.float32)
    xq, sx = quantize_per_token_e4m3(x, interpret=True)
    want_q, want_sx = quantize_model(x.astype(np.float32))  # (not the kernel's: it may be what is wrong)
    ref = e4m3_reference(weight, stored, want_q, want_sx, sw) + bias[None, :]
    out = np.full((t, n_out), NAN, np.float32)
    if path == "tiled":
        monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")
        y = sparse_linear(weight.values, weight.meta, xq, scale_x=sx, scale_w=sw, bias=bias, out=out,
                          out_dtype="float32", interpret=True)
    else:
        one = path == "decode one launch"
        plan = plan_sparse_decode(weight.values, weight.meta, x if one else xq, scale_x=None if one else sx,
                                  scale_w=sw, bias=bias, out=out, out_dtype="float32", interpret=True)
        assert plan.quantizes_x == one
        plan.run()
        y = out
    assert_same_specials(y, ref, rtol=2e-3)
    assert np.isnan(y[1]).any() and np.isposinf(y[2]).any() and np.isnan(y[4]).any()
    np.testing.assert_allclose(y[6], bias, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# the sparse product and its epilogue


def bf16_problem(n_out: int, t: int, k: int, seed: int):
    """A bf16 weight and x with NaN / ±inf at a position row 0 of the weight stores (rows 0-2) and
    at one it does not store (rows 3-4)."""
    rng = np.random.default_rng(seed)
    weight = prune_and_compress(rng.standard_normal((n_out, k)).astype(np.float32), "bf16")
    stored = stored_mask(weight.values, weight.meta)
    on = int(np.nonzero(stored[0] & (weight.dense()[0].astype(np.float32) != 0))[0][0])
    off = int(np.nonzero(~stored[0])[0][0])
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[0, on], x[1, on], x[2, on] = NAN, INF, -INF
    x[3, off], x[4, off] = NAN, INF
    return weight, stored, x.astype(ml_dtypes.bfloat16)


def torch_activation(y: np.ndarray, act: str | None) -> np.ndarray:
    """torch's relu / silu / tanh-GELU of float64 ``y`` (their NaN and inf conventions)."""
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(y)
    f = {None: lambda v: v, "relu": torch.relu, "silu": torch.nn.functional.silu,
         "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh")}[act]
    return f(t).numpy()


@pytest.mark.parametrize("act", [None, "relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("kernel", ["gemm", "decode"])
def test_nan_and_inf_of_x_reach_y_where_the_weight_stores_them(act: str | None, kernel: str) -> None:
    """y is float64 over the stored positions with torch's activation: NaN and ±inf where a dense
    product gives them (relu keeps NaN, as torch's does: before, max(NaN, 0) gave 0), and x's NaN or
    inf at a position a weight row does not store leaves that row's output as the finite sum of the
    rest (before, the interpreter multiplied the pruned zero: 0 * inf = NaN)."""
    n_out, t, k = 64, 6, 128
    weight, stored, x = bf16_problem(n_out, t, k, seed=5)
    y = sparse_linear(weight.values, weight.meta, x, activation=act, out_dtype="float32", interpret=True,
                      kernel=kernel)
    ref = torch_activation(stored_product(weight.dense(), stored, x), act)
    assert_same_specials(y, ref, rtol=1e-5)
    assert np.isfinite(y[3:5, 0]).all()  # row 0 does not store x's NaN / inf of tokens 3 and 4
    assert np.isnan(y[0, 0])


@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32", "e4m3"])
def test_sparse_matmul_and_its_reference_skip_unstored_positions(dtype: str) -> None:
    """sparse_matmul (interpreter) and ``sparse_matmul_reference`` agree with the float64 sum over
    the stored positions, for b with NaN and ±inf both where the weight stores them and where not."""
    rng = np.random.default_rng(len(dtype))
    m, n, k = 32, 16, 128
    weight = prune_and_compress(rng.standard_normal((m, k)).astype(np.float32), dtype)
    stored = stored_mask(weight.values, weight.meta)
    b = rng.standard_normal((n, k)).astype(np.float32)
    b[0, 0], b[1, 5], b[2, 9], b[3, 9], b[4, 100] = NAN, INF, -INF, NAN, INF
    host = S.operand_type(dtype).host_dtype if dtype != "tf32" else np.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e4m3: the cast saturates inf with a SaturationWarning
        b = S.cast_to_operand(b, S.operand_type(dtype), "b") if dtype != "tf32" else b.astype(host)
    want = stored_product(weight.dense(), stored, b).T  # (m, n)
    ref = S.sparse_matmul_reference(weight.values, weight.meta, np.ascontiguousarray(b.T))
    assert_same_specials(ref, want, rtol=0)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True, out_dtype="float32", kernel="gemm")
    assert_same_specials(c, want, rtol=1e-5, atol=0.1 if dtype == "tf32" else 1e-3)  # tf32: 10-bit mantissas
    assert np.isfinite(want).sum() > 0 and not np.isfinite(want).all()



@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_blackwell_interpreter_skips_unstored_positions(dtype: str) -> None:
    """The tcgen05 sparse MMA of the sm_100a kernels (interpreter) multiplies the stored positions
    only, as wgmma does (C is float16 on Blackwell)."""
    rng = np.random.default_rng(11)
    weight = prune_and_compress(rng.standard_normal((32, 128)).astype(np.float32), dtype)
    stored = stored_mask(weight.values, weight.meta)
    b = rng.standard_normal((16, 128)).astype(np.float32)
    off, on = int(np.nonzero(~stored[0])[0][0]), int(np.nonzero(stored[0])[0][0])
    b[0, off], b[1, off], b[2, on], b[3, on] = INF, NAN, -INF, NAN
    b = b.astype(S.operand_type(dtype).host_dtype)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True, target="sm_100a")
    assert_same_specials(c, stored_product(weight.dense(), stored, b).T, rtol=2e-3, atol=2e-2)
    assert np.isfinite(c[0, :2]).all() and np.isnan(c[0, 3])


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["gemm", "decode"])
def test_the_gpu_skips_unstored_positions_as_the_interpreter_does(kernel: str) -> None:
    """On the GPU (not yet run: written without one): the sparse tensor cores select x's elements by
    the metadata (NVIDIA's description of them), so y has NaN and ±inf exactly where the
    interpreter's model has them, for bf16 (stored and unstored positions) and for e4m3 with the
    per-token quantizer on the device."""
    from .test_linear_api import cuda_copy

    torch = pytest.importorskip("torch")
    weight, stored, x = bf16_problem(128, 16, 256, seed=7)
    y = sparse_linear(cuda_copy(np.asarray(weight.values)), weight.meta, cuda_copy(x), out_dtype="float32",
                      kernel=kernel).cpu().numpy()
    assert_same_specials(y, stored_product(weight.dense(), stored, x), rtol=1e-4)
    weight, stored, x = e4m3_problem(128, 16, 256, seed=7)
    sw = np.full(128, 1 / 64, np.float32)
    xq, sx = quantize_per_token_e4m3(cuda_copy(x))
    want_q, want_sx = quantize_model(x.astype(np.float32))
    np.testing.assert_array_equal(bits(xq.cpu().view(torch.uint8).numpy()), bits(want_q))
    y = sparse_linear(cuda_copy(np.asarray(weight.values)), weight.meta, xq, scale_x=sx, scale_w=cuda_copy(sw),
                      out_dtype="float32", kernel=kernel).cpu().numpy()
    # Hopper's e4m3 MMA adds into an accumulator of about 14 mantissa bits (docs/hopper.md): where the
    # products cancel (an H100, thirty-ninth session: 0.4250 for 0.4282, the magnitudes summing to 138) the error
    # follows the magnitudes' sum, 8 K steps x 2^-14 of it at most, not y
    assert_same_specials(y, e4m3_reference(weight, stored, want_q, want_sx, sw), rtol=2e-3,
                         abs_sum=e4m3_reference(weight, stored, want_q, want_sx, sw, magnitudes=True),
                         sum_rtol=8 * 2.0**-14)


@pytest.mark.parametrize("kernel", ["gemm", "decode"])
def test_the_interpreter_computes_special_values_without_numpy_warnings(kernel: str) -> None:
    """NaN and inf operands (and their products) are values the GPU computes without a word: the
    interpreter's MMA gave numpy's RuntimeWarning ("invalid value encountered in matmul") from its
    internals."""
    weight, _, x = bf16_problem(64, 6, 128, seed=7)
    values = weight.values.copy()
    values[0, 0], values[1, 3], values[2, 7] = np.nan, np.inf, -np.inf  # in A too: the dense product's path
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        y = sparse_linear(values, weight.meta, x, out_dtype="float32", interpret=True, kernel=kernel)
    assert np.isnan(y).any() and np.isfinite(y).any()
