"""NaN, ±inf, ties and tiny channels through ``sparsile.torch`` (docs/torch.md, "Special values"):

* a weight holding NaN or ±inf builds (the convention of the e4m3 fix in
  ``test_torch_linear.test_e4m3_from_dense_with_non_finite_weights_computes``): pruning keeps them,
  and the output features of their rows are NaN or ±inf as a dense layer's are, with the dense
  layer's signs (e4m3 too: an inf weight gave NaN for every input);
* e4m3 weights are pruned by the toolkit's rule (ties to the lower index, as ``prune_mask_2_4``
  and the bf16 / f16 layers), and a channel of tiny weights gets a usable scale;
* a layer's forward (CPU, the interpreter) takes NaN / ±inf of x to y as float64 over the stored
  positions does, and a zero token to the bias; the quantizer op keeps NaN and saturates inf."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib.sparsity import prune_mask_2_4
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def host(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


@pytest.mark.parametrize("name,dtype", [("bf16", torch.bfloat16), ("f16", torch.float16), ("e4m3", torch.bfloat16),
                                        ("e4m3", torch.float32)])
def test_nan_and_inf_weights_give_the_dense_layers_specials(name: str, dtype: torch.dtype) -> None:
    """Row 3 holds a NaN, row 7 a -inf (at column 60) and row 9 a +inf: their outputs are NaN, and
    -inf * x / +inf * x with x's sign (NaN where x is 0), as ``F.linear`` gives; the other rows are
    the layer of the finite weight's. Before, the e4m3 layer's inf channels had an infinite scale
    and every value NaN (inf / inf): NaN for every input."""
    dense = linear(16, 64, dtype, seed=9)
    finite = spt.SparseLinear.from_dense(dense, name)
    with torch.no_grad():
        dense.weight[3, 5] = float("nan")
        dense.weight[7, 60] = -float("inf")
        dense.weight[9, 60] = float("inf")
    layer = spt.SparseLinear.from_dense(dense, name)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(10))
    x[:, 60] = torch.tensor([1.0, 0.0, -2.0, 0.5])
    x = x.to(torch.bfloat16)
    with torch.no_grad():
        y, ref = host(layer(x)), host(finite(x))
        want = host(torch.nn.functional.linear(x.double(), dense.weight.double()))
    assert np.isnan(y[:, 3]).all() and np.isnan(want[:, 3]).all()
    for row in (7, 9):
        np.testing.assert_array_equal(y[:, row], want[:, row])  # -inf, NaN, +inf, -inf (row 9: the opposites)
    others = [i for i in range(16) if i not in (3, 7, 9)]
    np.testing.assert_array_equal(y[:, others], ref[:, others])


def test_e4m3_weights_are_pruned_with_the_toolkit_tie_rule() -> None:
    """Many equal magnitudes: the e4m3 layer keeps the elements the bf16 layer and ``prune_mask_2_4``
    keep (ties to the lower index). Before, torch.topk chose among ties (on the CPU the higher
    indices: 280 of 1024 positions differed here)."""
    layer = torch.nn.Linear(64, 16, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randint(-2, 3, (16, 64), generator=torch.Generator().manual_seed(0)))
    layer = layer.to(torch.bfloat16)
    w = host(layer.weight)
    keep = prune_mask_2_4(w) & (w != 0)
    e4m3 = spt.SparseLinear.from_dense(layer, "e4m3")
    bf16 = spt.SparseLinear.from_dense(layer, "bf16")
    np.testing.assert_array_equal(host(bf16.to_dense()) != 0, keep)
    np.testing.assert_array_equal(host(e4m3.to_dense()) != 0, keep)
    np.testing.assert_allclose(host(e4m3.to_dense()), np.where(keep, w, 0), rtol=2 ** -4)


def test_e4m3_scales_of_zero_and_tiny_channels() -> None:
    """A zero channel keeps scale 1 and zero values; a channel of tiny weights (float32 subnormals,
    whose amax / 448 underflows to 0) gets the smallest normal float32 as its scale: values finite,
    no NaN. Before: a scale of 0, a division by zero, and a misleading SP0803 ("not 2:4 sparse")."""
    layer = linear(4, 64, torch.float32, bias=False)
    with torch.no_grad():
        layer.weight[0] = 0
        layer.weight[1] = torch.linspace(-1e-44, 1e-44, 64)
        layer.weight[2] = torch.linspace(-1e-39, 1e-39, 64)
    sparse = spt.SparseLinear.from_dense(layer, "e4m3")
    scale = host(sparse.scale_w)
    tiny = np.finfo(np.float32).tiny
    assert scale[0] == 1 and scale[1] == tiny and scale[2] == tiny and np.isfinite(scale).all()
    values = host(sparse.values)
    assert np.isfinite(values).all() and not values[0].any() and np.abs(values).max() <= 448
    dense = host(sparse.to_dense())
    w = host(layer.weight)
    ref = np.where(prune_mask_2_4(w), w, 0)
    np.testing.assert_allclose(dense[3], ref[3], rtol=2 ** -4)
    np.testing.assert_allclose(dense[2], ref[2], rtol=2 ** -4, atol=2 ** -10 * tiny)  # (e4m3 subnormals near 0)
    assert not dense[1].any()  # 1e-44 / tiny is below e4m3's smallest subnormal: zero, within 1e-44


def test_forward_takes_nan_and_inf_of_x_to_y() -> None:
    """bf16 and e4m3 layers on the CPU (the interpreter): a token with NaN or inf at a position a
    weight row stores gives NaN or ±inf in that output feature, as float64 does; a position the row
    does not store does not reach it (bf16: the sparse product skips it); a zero token gives the
    bias exactly. e4m3: a token with an inf has an inf scale, so all its outputs are ±inf or NaN."""
    dense_layer = linear(32, 64)
    for name in ("bf16", "e4m3"):
        layer = spt.SparseLinear.from_dense(dense_layer, name)
        w = host(layer.to_dense())
        stored = w != 0
        on = int(np.nonzero(stored[0])[0][0])
        off = int(np.nonzero(~stored[0])[0][0])
        x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        x[0, on], x[1, on], x[2, off], x[3] = float("nan"), float("inf"), float("nan"), 0
        with torch.no_grad():
            y = host(layer(x))
        bias = host(layer.bias)
        assert np.isnan(y[0, 0]) and np.isposinf(y[1, 0]) == (w[0, on] > 0) and np.isneginf(y[1, 0]) == (w[0, on] < 0)
        assert not np.isfinite(y[1]).any() if name == "e4m3" else np.isfinite(y[1, ~stored[:, on]]).all()
        assert np.isfinite(y[2, 0]) and not np.isfinite(y[2, stored[:, off]]).any()
        np.testing.assert_array_equal(y[3], bias.astype(ml_dtypes.bfloat16).astype(np.float32))
        assert np.isfinite(y[4]).all()


def test_the_quantizer_op_keeps_nan_and_saturates_inf() -> None:
    """``torch.ops.sparsile.quantize_per_token_e4m3`` (the traced e4m3 path's quantizer): NaN stays
    NaN (it was -448), ±inf gives ±448 with an infinite scale (+inf was -448), a zero row zeros."""
    x = torch.tensor([[1.0, float("nan"), -2.0, 4.0], [float("inf"), 1.0, -float("inf"), 0.0], [0.0] * 4]).repeat(1, 8)
    xq, scale = torch.ops.sparsile.quantize_per_token_e4m3(x.to(torch.bfloat16))
    q = xq.float()
    assert torch.isnan(q[0, 1::4]).all() and not torch.isnan(q[0, 0::4]).any()
    assert float(scale[0]) == float(torch.tensor(4.0) / 448)
    assert (q[1, 0::4] == 448).all() and (q[1, 2::4] == -448).all() and (q[1, 1::4] == 0).all()
    assert torch.isinf(scale[1]) and not q[2].any() and float(scale[2]) == float(torch.tensor(1 / (448 * 512)))
