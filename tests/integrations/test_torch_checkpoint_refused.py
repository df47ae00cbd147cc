"""sparse-24-bitmask checkpoints that loaded other numbers than they hold, without a word: a dense
quantized layer next to the sparse ones (its 8-bit weight copied without its ``weight_scale``, under
``strict=False``, which SP0914's help suggested), one layer under both of its tensor names
(``<name>.compressed`` and ``<name>.weight.compressed``: one of the two kept), a ``weight_scale`` of
another granularity whose size happens to be out_features (a block scale read per channel), and wide
values beyond bf16's range, refused with f16's wording."""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer
from sparsile.tests.integrations.torch_helpers import check_against_float64

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

W8A8 = {"config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                            "dynamic": True}}}}


class _Two(torch.nn.Module):
    """``proj`` (the checkpoint's sparse layer) and ``dense`` (a plain layer), 32 -> 16, random."""

    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.proj = torch.nn.Linear(32, 16)
        self.dense = torch.nn.Linear(32, 16)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        self.to(dtype)


def _pruned(seed: int, rows: int = 16, cols: int = 32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)) + 0.1
    w.reshape(rows, cols // 4, 4)[:, :, 1::2] = 0  # 2:4 by construction, no zero kept value
    return w


def _write(path, tensors: dict[str, np.ndarray], quant: dict | None = None) -> None:
    config = {"quant_method": "compressed-tensors", "sparsity_config": {"format": "sparse-24-bitmask"}}
    st.save_file(tensors, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"quantization_config": {**config, **(quant or {})}}))


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


def _load(model, path, **kwargs):
    with warnings.catch_warnings():  # (vLLM's matching of these hand-written configs is not the subject)
        warnings.simplefilter("ignore", spt.VLLMMatchWarning)
        return spt.load_sparse24_checkpoint(model, path, **kwargs)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("stored", ["F8_E4M3", "I8"])
def test_a_dense_quantized_weight_is_not_loaded_without_its_scale(tmp_path, strict, stored):
    """A checkpoint whose layer ``dense`` is quantized but not sparse (llm-compressor quantizes every
    Linear, sparsifies those its sparsity targets name): ``dense.weight`` 8-bit with
    ``dense.weight_scale``. load_state_dict copied the 8-bit values into the nn.Linear's bf16 weight
    (W_q, not W_q * s_w: here 40 to 400 times too large) and reported the scale unexpected: SP0914
    under strict, whose help said "or pass strict=False", which then loaded it so."""
    rng = np.random.default_rng(4)
    tensors = {**compressed_tensors_layer(_pruned(1).astype(ml_dtypes.bfloat16)),
               "proj.bias": rng.standard_normal(16).astype(np.float32),
               "dense.weight": (rng.standard_normal((16, 32)) * 20).astype(st.DTYPES[stored]),
               "dense.weight_scale": rng.uniform(0.0025, 0.025, (16, 1)).astype(np.float32),
               "dense.bias": rng.standard_normal(16).astype(ml_dtypes.bfloat16)}
    _write(tmp_path, tensors, W8A8 if stored == "F8_E4M3" else None)
    model = _Two()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    err = _error(_load, model, tmp_path, strict=strict)
    assert (err.code, err.message) == (
        "SP0914", f"the checkpoint's dense.weight is {stored} with a dense.weight_scale (a quantized layer stored "
                  "dense), and dense of the model has no weight_scale: loading would copy the quantized values "
                  "into its weight without their scale")
    assert err.help == ("sparsile loads quantized weights as sparse layers only: write dense as a sparse layer, or "
                        "its weight dequantized (dense.weight * dense.weight_scale, in the model's type) without a "
                        "weight_scale; strict=False does not skip it")
    assert type(model.proj) is torch.nn.Linear  # (nothing changed)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_dense_quantized_weight_into_a_model_that_holds_its_scale_loads(tmp_path):
    """The refusal is for a model without the scale: a model whose ``dense`` registers a
    ``weight_scale`` (as compressed-tensors' quantized modules do) and an 8-bit weight gets both."""
    rng = np.random.default_rng(5)
    wq = (rng.standard_normal((16, 32)) * 20).astype(ml_dtypes.float8_e4m3fn)
    scale = rng.uniform(0.0025, 0.025, (16, 1)).astype(np.float32)
    tensors = {**compressed_tensors_layer(_pruned(2).astype(ml_dtypes.bfloat16)),
               "proj.bias": rng.standard_normal(16).astype(np.float32),
               "dense.weight": wq, "dense.weight_scale": scale, "dense.bias": np.zeros(16, np.float32)}
    _write(tmp_path, tensors, W8A8)
    model = _Two()
    model.dense.weight = torch.nn.Parameter(torch.zeros(16, 32, dtype=torch.float8_e4m3fn), requires_grad=False)
    model.dense.weight_scale = torch.nn.Parameter(torch.zeros(16, 1), requires_grad=False)
    report = _load(model, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])
    assert np.array_equal(model.dense.weight.view(torch.uint8).numpy(), wq.view(np.uint8))
    assert np.array_equal(model.dense.weight_scale.numpy(), scale)


@pytest.mark.parametrize("strict", [True, False])
def test_one_layer_under_both_of_its_names_is_refused(tmp_path, strict):
    """``proj.compressed`` (compressed-tensors' names) and ``proj.weight.compressed`` (sparsile's
    before) are both layer ``proj``: the loader kept the second and, with strict=False, loaded it
    (the first reported unexpected), with strict=True refused the first's tensors as unexpected."""
    first = _pruned(6)
    tensors = {**compressed_tensors_layer(first.astype(ml_dtypes.bfloat16)),
               **{k.replace("proj.", "proj.weight."): v
                  for k, v in compressed_tensors_layer((3 * first).astype(ml_dtypes.bfloat16)).items()},
               "proj.bias": np.zeros(16, np.float32), "dense.weight": np.ones((16, 32), ml_dtypes.bfloat16),
               "dense.bias": np.zeros(16, ml_dtypes.bfloat16)}
    _write(tmp_path, tensors)
    model = _Two()
    err = _error(_load, model, tmp_path, strict=strict)
    assert (err.code, err.message) == (
        "SP0913", "layer proj: the checkpoint holds it twice, as proj.compressed, proj.bitmask, proj.shape and "
                  "as proj.weight.compressed, proj.weight.bitmask, proj.weight.shape")
    assert err.help == "write each sparse layer once (compressed-tensors names them <layer>.compressed)"
    assert type(model.proj) is torch.nn.Linear


@pytest.mark.parametrize("shape", [(1, 16), (2, 8), (4, 4)])
def test_a_weight_scale_of_another_granularity_is_refused(tmp_path, shape):
    """A weight_scale of out_features elements that is no per-channel scale ((out, 1) or (out,)):
    a block-quantized layer's (ceil(out / b0), ceil(in / b1)) can hold out_features scales, which
    the loader read as one per output channel (other numbers, without a word)."""
    tensors = {**compressed_tensors_layer(_pruned(7).astype(ml_dtypes.float8_e4m3fn)),
               "proj.bias": np.zeros(16, np.float32),
               "proj.weight_scale": np.linspace(0.5, 2, 16).astype(np.float32).reshape(shape),
               "dense.weight": np.ones((16, 32), ml_dtypes.bfloat16), "dense.bias": np.zeros(16, ml_dtypes.bfloat16)}
    _write(tmp_path, tensors, W8A8)
    model = _Two()
    err = _error(_load, model, tmp_path)
    assert (err.code, err.message) == (
        "SP0913", f"layer proj: weight_scale has shape {shape}; a weight scale is per output channel, (16, 1) or "
                  "(16,), or per tensor, one element")
    assert err.help == "sparsile reads fp8 weight scales of strategy 'channel' or 'tensor', not 'group' or 'block'"
    assert type(model.proj) is torch.nn.Linear


@pytest.mark.parametrize("shape", [(16, 1), (16,), (1,), (1, 1), ()])
def test_per_channel_and_per_tensor_scales_load(tmp_path, shape):
    """The shapes compressed-tensors writes (channel: (out, 1); tensor: (1,)) and their flat or 0-d
    forms load, each output channel scaled by its own scale (float64 reference of the file's values)."""
    pruned = _pruned(8)
    stored = pruned.astype(ml_dtypes.float8_e4m3fn)
    scale = np.linspace(0.5, 2, int(np.prod(shape))).astype(np.float32).reshape(shape)
    bias = np.random.default_rng(9).standard_normal(16).astype(np.float32)
    tensors = {**compressed_tensors_layer(stored), "proj.bias": bias, "proj.weight_scale": scale,
               "dense.weight": np.ones((16, 32), ml_dtypes.bfloat16), "dense.bias": np.zeros(16, ml_dtypes.bfloat16)}
    _write(tmp_path, tensors, W8A8)
    model = _Two()
    _load(model, tmp_path)
    per_row = np.broadcast_to(scale.reshape(-1, 1).astype(np.float64), (16, 1))
    want = stored.astype(np.float64) * per_row
    assert np.array_equal(model.proj.to_dense().double().numpy(), want.astype(np.float32).astype(np.float64))
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    check_against_float64(model.proj, x, model.proj(x))


def test_wide_values_beyond_bf16_are_refused_in_bf16_s_words(tmp_path):
    """F64 values beyond bf16's range loaded into a bf16 model would be inf: refused (SP0913), but the
    message said "beyond ±65504: as the model's f16", and its help to build the model in bf16, the
    type it was built in."""
    layer = compressed_tensors_layer(_pruned(11))
    layer["proj.compressed"][3, 0] = 1e39  # (row 3's first kept value: its column 0)
    tensors = {**layer, "proj.bias": np.zeros(16, np.float32),
               "dense.weight": np.ones((16, 32), ml_dtypes.bfloat16), "dense.bias": np.zeros(16, ml_dtypes.bfloat16)}
    _write(tmp_path, tensors)
    model = _Two()
    err = _error(_load, model, tmp_path)
    assert (err.code, err.message) == (
        "SP0913", "layer proj: the compressed values are float64, 1 of them beyond ±3.38953e+38: as the model's bf16 "
                  "they would be inf")
    assert err.help == "scale the layer's weights into the bf16 range before writing them"
    assert type(model.proj) is torch.nn.Linear
