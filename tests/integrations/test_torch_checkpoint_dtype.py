"""The type a loaded layer computes in: the model's, where the model is bf16 or f16. A checkpoint
whose layers are stored f16, loaded into a bf16 model, kept f16 weights: the layer cast x to f16,
so activations beyond ±65504 became inf without a word (and bf16 values in an f16 model cast x to
bf16, dropping 3 bits of it). compressed-tensors' loading (transformers) copies the decompressed
weight into the model's parameter, a cast; the loader now does the same (as it did for F32 / F64
values), refuses values the model's type would make inf (SP0913), and names the converted layers
in ``report.converted``."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer
from sparsile.tests.integrations.torch_helpers import check_against_float64

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


class _One(torch.nn.Module):
    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.proj = torch.nn.Linear(32, 16).to(dtype)

    def forward(self, x):
        return self.proj(x)


def _write(path, stored: np.dtype, big: float | None = None) -> np.ndarray:
    """A sparse layer ``proj`` of random 2:4 weights stored as ``stored`` (``big``: one of them), 2:4
    along rows and columns (a trainable mask); returns the stored weight (out, in)."""
    rng = np.random.default_rng(31)
    w = rng.standard_normal((16, 32)) + 0.05
    w[(np.arange(16)[:, None] + np.arange(32)[None, :]) % 2 == 1] = 0
    if big is not None:
        w[3, 0] = big
    q = w.astype(stored)
    tensors = {**compressed_tensors_layer(q), "proj.bias": rng.standard_normal(16).astype(np.float32)}
    st.save_file(tensors, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"quantization_config": {"sparsity_config": {
        "format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": []}}}))
    return q


def _poisoned_call(layer, x: torch.Tensor) -> torch.Tensor:
    y = torch.full((x.shape[0], layer.out_features), float("nan"), dtype=x.dtype)
    y.copy_(layer(x))
    return y


def test_f16_values_in_a_bf16_model_compute_in_bf16(tmp_path):
    """x of a bf16 model beyond f16's range: the layer kept f16 and its output was inf."""
    stored = _write(tmp_path, np.dtype(np.float16))
    model = _One(torch.bfloat16)
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert (report.sparse, report.missing, report.unexpected, report.converted) == (["proj"], [], [], ["proj"])
    layer = model.proj
    assert layer.weight_dtype == "bf16" and layer.values.dtype == torch.bfloat16
    # (the stored f16 weight rounded to nearest even into bf16, as load_state_dict's cast would)
    want = stored.astype(ml_dtypes.bfloat16).astype(np.float64)
    assert np.array_equal(layer.to_dense().double().numpy(), want)
    gen = torch.Generator().manual_seed(32)
    x = (torch.randn(4, 32, generator=gen) * 1e5).to(torch.bfloat16)  # (many beyond ±65504)
    assert (x.abs() > 65504).any()
    y = _poisoned_call(layer, x)
    assert torch.isfinite(y).all()
    check_against_float64(layer, x, y)


def test_bf16_values_in_an_f16_model_compute_in_f16(tmp_path):
    """bf16 values within f16's range convert exactly; x of the f16 model is not rounded to bf16."""
    stored = _write(tmp_path, np.dtype(ml_dtypes.bfloat16))
    model = _One(torch.float16)
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert report.converted == ["proj"]
    layer = model.proj
    assert layer.weight_dtype == "f16"
    assert np.array_equal(layer.to_dense().double().numpy(), stored.astype(np.float64))  # (exact)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(33)).to(torch.float16)
    check_against_float64(layer, x, _poisoned_call(layer, x))


def test_bf16_values_beyond_f16_into_an_f16_model_are_refused(tmp_path):
    _write(tmp_path, np.dtype(ml_dtypes.bfloat16), big=1e6)
    model = _One(torch.float16)
    with pytest.raises(IntegrationError) as info:
        spt.load_sparse24_checkpoint(model, tmp_path)
    err = info.value
    assert (err.code, err.message) == (
        "SP0913", "layer proj: the compressed values are bfloat16, 1 of them beyond ±65504: as the model's f16 they "
                  "would be inf")
    assert err.help == ("build the model in bf16 (torch_dtype=torch.bfloat16): the values are converted to the "
                        "model's dtype, and bf16 keeps float32's range")
    assert type(model.proj) is torch.nn.Linear


@pytest.mark.parametrize("stored", [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)])
@pytest.mark.parametrize("model_dtype", [torch.float32, "same"])
def test_values_are_kept_where_the_model_has_no_other_16_bit_type(tmp_path, stored, model_dtype):
    """A float32 model (no 16-bit type to follow) or one of the stored type: kept as stored."""
    values = _write(tmp_path, stored)
    same = torch.float16 if stored == np.float16 else torch.bfloat16
    model = _One(same if model_dtype == "same" else model_dtype)
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert report.converted == []
    assert model.proj.weight_dtype == ("f16" if stored == np.float16 else "bf16")
    assert np.array_equal(model.proj.to_dense().double().numpy(), values.astype(np.float64))


def test_a_sparse_layer_target_keeps_its_own_type(tmp_path):
    """A model sparsified in f16 from a bf16 model (``sparsify_(dtype="f16")``): its layer's type is
    the caller's choice, f16, which the checkpoint's bf16 values take."""
    stored = _write(tmp_path, np.dtype(ml_dtypes.bfloat16))
    model = _One(torch.bfloat16)
    spt.sparsify_(model, dtype="f16", interpret=True, min_features=16)
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert report.converted == ["proj"] and model.proj.weight_dtype == "f16"
    assert np.array_equal(model.proj.to_dense().double().numpy(), stored.astype(np.float64))


@pytest.mark.parametrize("model_dtype", [torch.float32, torch.bfloat16])
def test_a_trainable_layer_takes_the_model_s_type(tmp_path, model_dtype):
    """trainable=True: into a float32 model (no 16-bit type to follow) the layer computes in the
    stored f16 and its float32 master holds the values; into a bf16 model it computes in bf16, its
    master (the model's bf16) the values rounded."""
    stored = _write(tmp_path, np.dtype(np.float16))
    model = _One(model_dtype)
    report = spt.load_sparse24_checkpoint(model, tmp_path, trainable=True)
    layer = model.proj
    assert isinstance(layer, spt.SemiSparseLinear) and layer.weight.dtype == model_dtype
    want = stored.astype(np.float64)
    if model_dtype == torch.bfloat16:
        assert report.converted == ["proj"] and layer.weight_dtype == "bf16"
        want = stored.astype(ml_dtypes.bfloat16).astype(np.float64)
    else:
        assert report.converted == [] and layer.weight_dtype == "f16"
    assert np.array_equal(layer.weight.detach().double().numpy(), want)
    scale = 1e5 if model_dtype == torch.bfloat16 else 1.0  # (bf16: x beyond ±65504 stays finite)
    x = (torch.randn(3, 32, generator=torch.Generator().manual_seed(34)) * scale).to(model_dtype)
    with torch.no_grad():
        y = _poisoned_call(layer, x)
    assert torch.isfinite(y).all()
    ref = x.double() @ torch.from_numpy(want).T + layer.bias.double()
    assert torch.allclose(y.double(), ref, rtol=2 ** -6, atol=1e-2 * scale)


def test_a_mixed_precision_trainable_target_s_master_keeps_the_stored_values(tmp_path):
    """A float32 model sparsified trainable in bf16 (float32 master, bf16 compute): f16 values are
    converted to its bf16 compute type, and its float32 master holds them as stored (not rounded)."""
    stored = _write(tmp_path, np.dtype(np.float16))
    model = _One(torch.float32)
    spt.sparsify_(model, dtype="bf16", interpret=True, min_features=16, trainable=True)
    assert model.proj.weight.dtype == torch.float32 and model.proj.weight_dtype == "bf16"
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    layer = model.proj
    assert report.converted == ["proj"] and isinstance(layer, spt.SemiSparseLinear)
    assert layer.weight.dtype == torch.float32 and layer.weight_dtype == "bf16"
    assert np.array_equal(layer.weight.detach().double().numpy(), stored.astype(np.float64))
