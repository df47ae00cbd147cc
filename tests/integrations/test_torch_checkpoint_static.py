"""compressed-tensors checkpoints the loader took wrongly or not at all: fp8 with a static per-tensor
input scale (``input_activations: {dynamic: false, strategy: tensor}``, ``<name>.input_scale``: with
strict=False it was dropped and x quantized per token), F32 ``compressed`` values (refused, SP0913),
and the writer's help for a layer it cannot write sparse (K not a multiple of 4)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

E4M3_MAX = 448.0


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


class _One(torch.nn.Module):
    def __init__(self, n=16, k=32, dtype=torch.bfloat16):
        super().__init__()
        self.proj = torch.nn.Linear(k, n).to(dtype)

    def forward(self, x):
        return self.proj(x)


def _static_config() -> dict:
    group = {"targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False, "symmetric": True},
             "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                   "symmetric": True}}
    return {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"group_0": group},
                                    "sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4",
                                                        "targets": ["Linear"], "ignore": []}}}


def _static_checkpoint(tmp_path, input_scale: float = 0.02, scale_shape=(1,)):
    """An fp8 layer 16 x 32 with per-channel weight scales, a bias and a static input scale; returns
    (W_q as float64, s_w, bias, s_x)."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((16, 32)) * 100
    w.reshape(16, 8, 4)[:, :, 1::2] = 0
    wq = w.astype(ml_dtypes.float8_e4m3fn)
    s_w = np.linspace(0.5, 2, 16).astype(np.float32)
    bias = np.linspace(-1, 1, 16).astype(np.float32)
    s_x = np.full(scale_shape, input_scale, np.float32)
    tensors = {**compressed_tensors_layer(wq), "proj.bias": bias, "proj.weight_scale": s_w.reshape(-1, 1),
               "proj.input_scale": s_x}
    st.save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(_static_config()))
    return wq.astype(np.float64), s_w.astype(np.float64), bias.astype(np.float64), float(s_x.reshape(-1)[0])


def vllm_q(x: torch.Tensor, s_x: float) -> np.ndarray:
    """q(x) as vLLM's static_scaled_fp8_quant computes it: float32 x times the float32 reciprocal of
    the scale (a float32 product), saturated to ±448, rounded to e4m3 (ml_dtypes: nearest even)."""
    inverse = np.float32(1) / np.float32(s_x)
    xs = np.clip(x.float().numpy() * inverse, -E4M3_MAX, E4M3_MAX)
    return xs.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def vllm_reference(x: torch.Tensor, wq: np.ndarray, s_w: np.ndarray, bias: np.ndarray, s_x: float) -> np.ndarray:
    """What vLLM computes for a static per-tensor input scale, in float64 after q: y = (q(x) * s_x) @
    (W_q * s_w).T + bias (:func:`vllm_q`)."""
    return (vllm_q(x, s_x) * np.float32(s_x)) @ (wq * s_w[:, None]).T + bias


def check_static(y: torch.Tensor, x: torch.Tensor, wq, s_w, bias, s_x) -> None:
    """y == vllm_reference within bf16's rounding and the f32 accumulation of K products."""
    ref = vllm_reference(x.reshape(-1, x.shape[-1]), wq, s_w, bias, s_x)
    q = vllm_q(x.reshape(-1, x.shape[-1]), s_x)
    absprod = (np.abs(q) * s_x) @ np.abs(wq * s_w[:, None]).T
    bound = 2.0 ** -8 * np.abs(ref) + x.shape[-1] * 2.0 ** -23 * absprod + 1e-6
    got = y.reshape(-1, y.shape[-1]).double().numpy()
    assert np.isfinite(got).all()
    assert (np.abs(got - ref) <= bound).all(), float((np.abs(got - ref) / bound).max())


def _x(seed: int = 0, shape=(5, 32)) -> torch.Tensor:
    """Random bf16 x, a few elements beyond 448 * s_x (saturated by the static quantizer)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 3
    x.view(-1, shape[-1])[0, :3] = torch.tensor([20.0, -30.0, 9.5])  # 448 * 0.02 = 8.96
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("scale_shape", [(1,), ()])
def test_a_static_input_scale_is_loaded_and_used(tmp_path, strict, scale_shape):
    """strict=False dropped ``input_scale`` (reported unexpected) and quantized x per token: other numbers
    than vLLM's, which quantizes with the checkpoint's static scale, saturating at ±448."""
    wq, s_w, bias, s_x = _static_checkpoint(tmp_path, scale_shape=scale_shape)
    model = _One()
    report = spt.load_sparse24_checkpoint(model, tmp_path, strict=strict)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])
    layer = model.proj
    assert layer.weight_dtype == "e4m3" and layer.input_scale is not None
    assert layer.input_scale.dtype == torch.float32 and layer.input_scale.shape == (1,)
    assert layer.input_scale.item() == np.float32(s_x)
    x = _x()
    y = layer(x)
    check_static(y, x, wq, s_w, bias, s_x)
    y3 = layer(x.reshape(1, 5, 32))  # (..., K)
    assert torch.equal(y3.reshape(5, 16), y)
    per_token = vllm_reference(x, wq, s_w, bias, s_x)  # the test sees the difference per-token would make:
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    dynamic = (xq.double() * sx.double()[:, None]).numpy() @ (wq * s_w[:, None]).T + bias
    assert np.abs(dynamic - per_token).max() > 0.5


def test_a_static_input_scale_is_written_back(tmp_path):
    s_x = _static_checkpoint(tmp_path)[3]
    model = _One()
    spt.load_sparse24_checkpoint(model, tmp_path)
    out = tmp_path / "again"
    spt.save_sparse24_checkpoint(model, out)
    tensors = st.load_file(out / "model.safetensors")
    assert tensors["proj.input_scale"].dtype == np.float32 and tensors["proj.input_scale"].shape == (1,)
    assert tensors["proj.input_scale"][0] == np.float32(s_x)
    group = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert group["input_activations"]["dynamic"] is False and group["input_activations"]["strategy"] == "tensor"
    fresh = _One()
    assert spt.load_sparse24_checkpoint(fresh, out).unexpected == []
    x = _x(1)
    assert torch.equal(fresh.proj(x), model.proj(x))


@pytest.mark.parametrize("bad", [0.0, -0.5, float("inf"), float("nan")])
def test_a_bad_input_scale_is_sp0913(tmp_path, bad):
    _static_checkpoint(tmp_path, input_scale=bad)
    model = _One()
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path)
    assert err.code == "SP0913"
    shown = float(np.float32(bad))
    assert err.message == f"layer proj: input_scale is {shown!r}; a static input scale is a positive finite number"
    assert "input_scale" in err.help
    assert type(model.proj) is torch.nn.Linear


def test_an_input_scale_of_several_elements_is_sp0913(tmp_path):
    _static_checkpoint(tmp_path, scale_shape=(16,))
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0913", "layer proj: input_scale has 16 elements; a static input scale "
                                                 "is per tensor (one element)")
    assert "strategy 'tensor'" in err.help


def _drop_input_scale(tmp_path, config: dict | None = None) -> None:
    """The static checkpoint without proj.input_scale (and with ``config`` where given)."""
    tensors = st.load_file(tmp_path / "model.safetensors")
    del tensors["proj.input_scale"]
    st.save_file(tensors, tmp_path / "model.safetensors")
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))


def test_static_input_activations_without_an_input_scale_are_sp0913(tmp_path):
    """config.json declares static input activations (dynamic: false) for a layer the checkpoint has no
    input_scale for: SP0913 (it was loaded quantizing x per token, unseen), the model left as it was."""
    _static_checkpoint(tmp_path)
    _drop_input_scale(tmp_path)
    model = _One()
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path)
    assert err.code == "SP0913"
    assert err.message == ("layer proj: config.json declares static input activations for it (config group "
                           "'group_0': input_activations dynamic false), but the checkpoint has no proj.input_scale; "
                           "x would be quantized per token instead of with the calibrated scale")
    assert err.help == ("write proj.input_scale (x's calibrated amax / 448, one float32), or declare dynamic: true "
                        "for proj's input_activations (per-token scales)")
    assert type(model.proj) is torch.nn.Linear


# (ignored by a pattern, or no group naming it: vLLM reads or refuses the layer otherwise, and warns; not the subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.parametrize("how", ["dynamic", "ignored", "named dynamic", "other layer"])
def test_layers_not_declared_static_load_per_token_without_an_input_scale(tmp_path, how):
    """A layer the config does not declare static (dynamic: true, in ``ignore``, named by a more specific
    dynamic group than the static ``Linear`` one, or a static group naming another layer) loads without
    an input_scale: x quantized per token."""
    _static_checkpoint(tmp_path)
    config = _static_config()
    quant = config["quantization_config"]
    group = quant["config_groups"]["group_0"]
    if how == "dynamic":
        group["input_activations"] = {**group["input_activations"], "strategy": "token", "dynamic": True}
    elif how == "ignored":
        quant["ignore"] = ["re:.*proj$"]
    elif how == "named dynamic":
        quant["config_groups"]["group_1"] = {**group, "targets": ["proj"],
                                             "input_activations": {"strategy": "token", "dynamic": True}}
    else:
        group["targets"] = ["re:.*o_proj"]
    _drop_input_scale(tmp_path, config)
    model = _One()
    spt.load_sparse24_checkpoint(model, tmp_path)
    assert model.proj.weight_dtype == "e4m3" and model.proj.input_scale is None


# ------------------------------------------------------------------------------------------------
# F32 compressed values


def _f32_checkpoint(tmp_path, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(12)
    w = (rng.standard_normal((16, 32)) * scale).astype(np.float32)
    w.reshape(16, 8, 4)[:, :, ::2] = 0
    st.save_file({**compressed_tensors_layer(w), "proj.bias": np.linspace(-1, 1, 16).astype(np.float32)},
                 tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "sparsity_config": {"format": "sparse-24-bitmask",
                                                                  "sparsity_structure": "2:4", "targets": ["Linear"],
                                                                  "ignore": []}}}))
    return w


@pytest.mark.parametrize(("model_dtype", "want"), [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                                   (torch.float32, torch.bfloat16)])
def test_f32_compressed_values_are_converted_to_the_layer_s_dtype(tmp_path, model_dtype, want):
    """compressed-tensors decompresses to the stored dtype and copies into the model's parameter
    (nn.Linear's load_state_dict: a cast, round to nearest even): the loader refused F32 (SP0913)."""
    w = _f32_checkpoint(tmp_path)
    model = _One(dtype=model_dtype)
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert report.sparse == ["proj"]
    layer = model.proj
    assert layer.values.dtype == want
    assert torch.equal(layer.to_dense(), torch.from_numpy(w).to(want).float())
    x = torch.randn(4, 32).to(want)
    ref = x.double() @ torch.from_numpy(w).to(want).double().T + torch.linspace(-1, 1, 16).double()
    assert torch.allclose(layer(x).double(), ref, rtol=2 ** -7, atol=1e-2)


def test_f32_compressed_values_beyond_f16_are_sp0913(tmp_path):
    _f32_checkpoint(tmp_path, scale=1e5)
    model = _One(dtype=torch.float16)
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path)
    assert err.code == "SP0913" and err.message.startswith("layer proj: the compressed values are float32, ")
    assert "beyond ±65504" in err.message and "bf16" in err.help
    assert type(model.proj) is torch.nn.Linear


# ------------------------------------------------------------------------------------------------
# K not a multiple of 4


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = linear(32, 64, seed=1)
        self.down = linear(16, 30, seed=3)


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_a_layer_of_k_not_a_multiple_of_4_can_be_kept_dense_as_the_help_says(tmp_path, dtype):
    """The help said "keep this layer dense in the checkpoint", which the writer had no way to do;
    an nn.Linear of the model is written dense (``.weight``), so the help says to put one there, and
    ``to_linear()`` gives it; an fp8 checkpoint's quantization scheme then ignores it (vLLM would
    read it as fp8)."""
    model = _Mixed()
    model.up = spt.SparseLinear.from_dense(model.up, dtype)
    model.down = spt.SparseLinear.from_dense(model.down, dtype)
    err = _error(spt.save_sparse24_checkpoint, model, tmp_path)
    assert (err.code, err.message) == ("SP0915", "layer down: in_features = 30 is not a multiple of 4; "
                                                 "sparse-24-bitmask stores whole groups of 4")
    assert err.help == ("write it dense: put an nn.Linear in its place before saving (model.down = "
                        "model.down.to_linear(); save_sparse24_checkpoint writes an nn.Linear as a plain down.weight)")
    assert not (tmp_path / "model.safetensors").exists()
    sparse_down = model.down
    model.down = model.down.to_linear()
    assert type(model.down) is torch.nn.Linear and model.down.weight.dtype == torch.bfloat16
    assert torch.equal(model.down.weight, sparse_down.to_dense().to(torch.bfloat16))
    assert torch.equal(model.down.bias, sparse_down.bias.to(torch.bfloat16))
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = st.load_file(tmp_path / "model.safetensors")
    assert "down.weight" in tensors and "down.compressed" not in tensors
    quant = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert quant["sparsity_config"]["targets"] == ["up"]
    if dtype:
        assert quant["ignore"] == ["down"]
    fresh = _Mixed()
    assert spt.load_sparse24_checkpoint(fresh, tmp_path).sparse == ["up"]
    assert type(fresh.down) is torch.nn.Linear and torch.equal(fresh.down.weight, model.down.weight)
