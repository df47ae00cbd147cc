"""Trained sparse layers (``SemiSparseLinear``) and sparse-24-bitmask checkpoints (docs/training.md,
"Checkpoints"). Before, ``save_sparse24_checkpoint`` of a model that ``sparsify_(trainable=True)`` made
was SP0907 ("the model has no SparseLinear layer", its help "sparsify_ first"), and one holding a
SparseLinear besides wrote the trainable layer's raw state (its dense master weight under
``<name>.weight``, unpruned, read by transformers as the dense weight) next to the sparse layers;
``load_sparse24_checkpoint`` into such a model was SP0914 ("is SemiSparseLinear of the model"). Now a
trainable layer is written as its ``to_sparse_linear()`` (the same bytes), and the loader makes
SemiSparseLinear layers (the checkpoint's mask) where the model has them, or everywhere with
``trainable=True``."""

from __future__ import annotations

import copy
import json

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.integrations.torch.training import check_mask
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import masked_weight, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

X = torch.randn(5, 64, generator=torch.Generator().manual_seed(9))


class _Net(torch.nn.Module):
    def __init__(self, dtype=torch.float32, seed: int = 1):
        super().__init__()
        self.proj = linear(32, 64, dtype=dtype, seed=seed)
        self.head = linear(16, 32, dtype=dtype, bias=False, seed=seed + 1)

    def forward(self, x):
        return self.head(torch.relu(self.proj(x)))


def _trained(steps: int = 3) -> _Net:
    """A model sparsified with trainable=True (float32 master weights, bf16 compute) and stepped by a
    plain SGD (no SparseTrainer: its layers stale after the last step, until their next call)."""
    model = _Net()
    assert spt.sparsify_(model, dtype="bf16", trainable=True, interpret=True, min_features=16).swapped == \
        ["proj", "head"]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(X).square().mean().backward()
        opt.step()
    return model


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


def _decoded(tensors: dict[str, np.ndarray], name: str) -> np.ndarray:
    """The float64 dense weight of ``name`` from the format's definition (bit j % 8 of byte j // 8 of a
    row; the compressed values in row-major order), apart from the package's reader."""
    rows, cols = (int(v) for v in tensors[f"{name}.shape"].reshape(-1))
    column = np.arange(cols)
    mask = ((tensors[f"{name}.bitmask"][:, column // 8] >> (column % 8)) & 1).astype(bool)
    dense = np.zeros((rows, cols))
    dense[mask] = tensors[f"{name}.compressed"].astype(np.float64).reshape(-1)
    return dense


def test_a_trained_model_is_written_as_its_to_sparse_linear_form(tmp_path):
    model = _trained()
    before = {k: v.clone() for k, v in model.state_dict().items() if k.endswith(("weight", "mask", "bias"))}
    spt.save_sparse24_checkpoint(model, tmp_path / "trained")
    converted = copy.deepcopy(model)
    for name in ("proj", "head"):
        setattr(converted, name, getattr(converted, name).to_sparse_linear())
    spt.save_sparse24_checkpoint(converted, tmp_path / "converted")
    for file in ("model.safetensors", "config.json"):
        assert (tmp_path / "trained" / file).read_bytes() == (tmp_path / "converted" / file).read_bytes()
    tensors = st.load_file(tmp_path / "trained" / "model.safetensors")
    # the pruned weights only: no master weight, mask or Wᵀ compression
    assert sorted(tensors) == ["head.bitmask", "head.compressed", "head.shape", "proj.bias", "proj.bitmask",
                               "proj.compressed", "proj.shape"]
    assert tensors["proj.compressed"].dtype == ml_dtypes.bfloat16 and tensors["proj.bias"].dtype == np.float32
    for name in ("proj", "head"):  # the weights after the last step (the stale layer compressed first)
        layer = getattr(model, name)
        assert isinstance(layer, spt.SemiSparseLinear)
        assert np.array_equal(_decoded(tensors, name), masked_weight(layer).numpy())
    assert np.array_equal(tensors["proj.bias"], model.proj.bias.detach().numpy())
    config = json.loads((tmp_path / "trained" / "config.json").read_text())
    assert config["quantization_config"]["sparsity_config"]["targets"] == ["head", "proj"]
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # (the master weights and masks untouched)


def test_a_trainable_layer_next_to_a_sparse_one_is_written_sparse(tmp_path):
    """Before, the trainable layer's raw state went into the file (proj.weight: its unpruned master weight,
    which transformers reads as the dense weight; proj.mask, proj.values_t, ...)."""
    model = _Net()
    spt.sparsify_(model, lambda m, n: n == "proj", dtype="bf16", trainable=True, interpret=True, min_features=16)
    spt.sparsify_(model, dtype="bf16", interpret=True, min_features=16)
    assert (type(model.proj), type(model.head)) == (spt.SemiSparseLinear, spt.SparseLinear)
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = st.load_file(tmp_path / "model.safetensors")
    assert sorted(tensors) == ["head.bitmask", "head.compressed", "head.shape", "proj.bias", "proj.bitmask",
                               "proj.compressed", "proj.shape"]
    assert np.array_equal(_decoded(tensors, "proj"), masked_weight(model.proj).numpy())


@pytest.mark.parametrize("target", ["dense", "trainable"])
def test_a_trained_checkpoint_loads_back(tmp_path, target):
    """Into a dense model: SparseLinear layers; into a model sparsify_(trainable=True) made (other
    weights): SemiSparseLinear layers whose mask is the trained one and whose float32 master weight
    holds the pruned bf16 weight (zero where the mask keeps nothing). Either computes the trained
    model's pruned forward."""
    model = _trained()
    spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = _Net(seed=7)
    if target == "trainable":
        spt.sparsify_(fresh, dtype="bf16", trainable=True, interpret=True, min_features=16)
    report = spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["head", "proj"], [], [])
    for name in ("proj", "head"):
        a, b = getattr(model, name), getattr(fresh, name)
        want = masked_weight(a)
        if target == "dense":
            assert type(b) is spt.SparseLinear and b.weight_dtype == "bf16"
            assert torch.equal(b.to_dense().double(), want)
        else:
            assert type(b) is spt.SemiSparseLinear and b.weight_dtype == "bf16" and b.weight.dtype == torch.float32
            assert torch.equal(b.mask, a.mask)
            assert torch.equal(b.weight.detach().double(), want)  # (the kept values; zeros elsewhere)
            check_mask(b.mask, (b.out_features, b.in_features))
        x = torch.randn(5, b.in_features, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        y = torch.full((5, b.out_features), float("nan"), dtype=torch.bfloat16)
        y[:] = b(x)
        ref = x.double() @ want.T + (a.bias.detach().double() if a.bias is not None else 0)
        within(y, ref, x.double().abs() @ want.abs().T, b.in_features, torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(fresh(X), model(X))


def test_a_loaded_trainable_layer_trains(tmp_path):
    """The loaded SemiSparseLinear has a gradient in its master weight, masked, and a step moves its
    output (the compressions follow the weight)."""
    spt.save_sparse24_checkpoint(_trained(), tmp_path)
    fresh = _Net(seed=3)
    spt.load_sparse24_checkpoint(fresh, tmp_path, trainable=True)
    layer = fresh.proj
    assert isinstance(layer, spt.SemiSparseLinear)
    before = fresh(X).detach()
    fresh(X).square().mean().backward()
    assert layer.weight.grad is not None and bool((layer.weight.grad[~layer.mask] == 0).all())
    assert bool((layer.weight.grad != 0).any())
    with torch.no_grad():
        layer.weight -= 0.01 * layer.weight.grad
    assert not torch.equal(fresh(X).detach(), before)


def test_trainable_chooses_the_layer_kind(tmp_path):
    """trainable=True into a dense bf16 model: SemiSparseLinear with bf16 master weights (the model's
    type, which holds the values); trainable=False into a trainable model: SparseLinear."""
    spt.save_sparse24_checkpoint(_trained(), tmp_path)
    dense = _Net(dtype=torch.bfloat16, seed=4)
    spt.load_sparse24_checkpoint(dense, tmp_path, trainable=True)
    assert type(dense.proj) is spt.SemiSparseLinear and dense.proj.weight.dtype == torch.bfloat16
    trainable = _Net(seed=5)
    spt.sparsify_(trainable, dtype="bf16", trainable=True, interpret=True, min_features=16)
    spt.load_sparse24_checkpoint(trainable, tmp_path, trainable=False)
    assert type(trainable.proj) is spt.SparseLinear and type(trainable.head) is spt.SparseLinear
    for name in ("proj", "head"):
        assert torch.equal(getattr(dense, name).to_dense(), getattr(trainable, name).to_dense())
    # (the checkpoint's float32 bias in the bf16 model's type, as nn.Linear's load_state_dict casts it)
    assert torch.equal(dense.proj.bias.detach(), trainable.proj.bias.to(torch.bfloat16))


class _One(torch.nn.Module):
    def __init__(self, rows: int = 4, cols: int = 8):
        super().__init__()
        self.proj = torch.nn.Linear(cols, rows, bias=False).to(torch.bfloat16)

    def forward(self, x):
        return self.proj(x)


def _write(path, dense: np.ndarray) -> None:
    st.save_file(compressed_tensors_layer(dense.astype(ml_dtypes.bfloat16)), path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({"quantization_config": {"sparsity_config": {
        "format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": []}}}))


def test_kept_zeros_beyond_two_of_a_column_are_dropped(tmp_path):
    """A writer keeps two positions of every row group even where the weight is zero (compressed-tensors:
    the top two magnitudes, ties to the lower index): here every row keeps input 0, a zero, so the
    bitmask keeps 4 of 4 down that column. The trainable mask keeps the nonzeros and the first two
    of those zeros; the product is the checkpoint's."""
    dense = np.zeros((4, 8))
    for row, col in enumerate((1, 2, 3, 1)):
        dense[row, col] = row + 1.5
        dense[row, 4 + (col + 1) % 4] = -(row + 0.25)
    _write(tmp_path, dense)
    kept = np.unpackbits(st.load_file(tmp_path / "model.safetensors")["proj.bitmask"], axis=1,
                         bitorder="little")[:, :8].astype(bool)
    assert kept[:, 0].all()  # (the file's mask: 4 of 4 down input 0)
    model = _One()
    spt.load_sparse24_checkpoint(model, tmp_path, trainable=True)
    layer = model.proj
    check_mask(layer.mask, (4, 8))
    assert layer.mask[:, 0].tolist() == [True, True, False, False]
    assert bool((layer.mask.numpy() <= kept).all()) and bool((layer.mask.numpy() >= (dense != 0)).all())
    assert np.array_equal(layer.to_dense().double().numpy(), dense)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = torch.full((3, 4), float("nan"), dtype=torch.bfloat16)
    y[:] = layer(x)
    w = torch.from_numpy(dense)
    within(y, x.double() @ w.T, x.double().abs() @ w.abs().T, 8, torch.bfloat16)


def test_a_checkpoint_mask_that_is_not_transposable_is_sp0918(tmp_path):
    """Three nonzero weights of input 1 among outputs 0..3 (a row-wise 2:4 checkpoint, as SparseGPT
    writes): no trainable mask keeps them; SP0918 before anything changes, and the help's way works."""
    dense = np.zeros((4, 8))
    dense[:, 1] = [1.0, 2.0, 3.0, 0.0]
    dense[:, 2] = [4.0, 5.0, 6.0, 7.0]
    dense[3, 0] = 8.0
    dense[:, 5] = [1.0, 1.0, 1.0, 1.0]
    dense[:, 6] = [2.0, 2.0, 2.0, 2.0]
    _write(tmp_path, dense)
    model = _One()
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path, trainable=True)
    assert err.code == "SP0918"
    assert err.message == ("layer proj: the checkpoint's weight cannot be trained with its 2:4 mask: input 1 has 3 "
                           "nonzero weights among outputs 0..3; a trainable layer keeps at most 2 of every 4 along "
                           "rows and columns (x's gradient runs on the transposed weight)")
    assert err.help.startswith("load it for inference (trainable=False)")
    assert "model.proj = SemiSparseLinear.from_dense(model.proj.to_linear())" in err.help
    assert type(model.proj) is torch.nn.Linear
    spt.load_sparse24_checkpoint(model, tmp_path, trainable=False)
    model.proj = spt.SemiSparseLinear.from_dense(model.proj.to_linear())
    check_mask(model.proj.mask, (4, 8))


def test_fp8_weights_do_not_load_trainable(tmp_path):
    model = _Net(dtype=torch.bfloat16)
    spt.sparsify_(model, dtype="e4m3", interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = _Net(dtype=torch.bfloat16)
    err = _error(spt.load_sparse24_checkpoint, fresh, tmp_path, trainable=True)
    assert (err.code, err.message, err.help) == (
        "SP0916", "layer head: the checkpoint's weights are float8_e4m3fn; sparse training computes in bf16 or f16",
        "load it for inference (trainable=False)")
    assert type(fresh.head) is torch.nn.Linear and type(fresh.proj) is torch.nn.Linear


def test_trainable_of_the_wrong_kind_is_sp0907(tmp_path):
    spt.save_sparse24_checkpoint(_trained(), tmp_path)
    err = _error(spt.load_sparse24_checkpoint, _Net(), tmp_path, trainable="yes")
    assert (err.code, err.message) == ("SP0907", "load_sparse24_checkpoint: trainable must be None, True or False, "
                                                 "got 'yes'")
    assert "SemiSparseLinear" in err.help


def test_a_sparse_layer_with_an_activation_does_not_become_trainable(tmp_path):
    spt.save_sparse24_checkpoint(_trained(), tmp_path)
    model = _Net(dtype=torch.bfloat16)
    spt.sparsify_(model, interpret=True, min_features=16)
    model.proj.activation = "relu"
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path, trainable=True)
    assert (err.code, err.message) == ("SP0916", "layer proj of the model is a SparseLinear with activation='relu', "
                                                 "which a trainable SemiSparseLinear in its place would not compute")
    assert "trainable=False" in err.help
    assert type(model.head) is spt.SparseLinear and model.proj.activation == "relu"


def test_a_trainable_layer_of_in_features_no_multiple_of_4_is_sp0915(tmp_path):
    """The help's statement converts the trainable layer first (a SemiSparseLinear has no to_linear)."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 16))
    layer = spt.SemiSparseLinear(6, 16)
    model[0] = layer
    err = _error(spt.save_sparse24_checkpoint, model, tmp_path / "ckpt")
    assert err.code == "SP0915" and err.message.startswith("layer 0: in_features = 6 is not a multiple of 4")
    assert "model[0] = model[0].to_sparse_linear().to_linear()" in err.help
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(("stored", "model_dtype"), [(np.float32, torch.float32), (np.float32, torch.float64),
                                                     (np.float64, torch.float64)])
def test_a_wide_checkpoint_keeps_its_values_in_a_wide_master_weight(tmp_path, stored, model_dtype):
    """F32 / F64 compressed values loaded trainable into a model whose weights hold them (float32,
    float64): the master weight is the checkpoint's weight itself; the layer computes in bf16 (its
    compressions, as the inference layer's). Before, the master weight held the values rounded to
    bf16 (the compute type) first: training resumed from other weights than the checkpoint's."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((16, 32))
    rows, cols = np.indices(w.shape)
    w[(cols - rows) % 4 >= 2] = 0  # (2 of 4 along rows and columns: transposable)
    w = w.astype(stored)
    bias = rng.standard_normal(16).astype(np.float32)
    st.save_file({**compressed_tensors_layer(w), "proj.bias": bias}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"sparsity_config": {
        "format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": []}}}))
    model = torch.nn.Sequential()
    model.proj = torch.nn.Linear(32, 16).to(model_dtype)
    spt.load_sparse24_checkpoint(model, tmp_path, trainable=True)
    layer = model.proj
    assert type(layer) is spt.SemiSparseLinear and layer.weight.dtype == model_dtype and layer.weight_dtype == "bf16"
    want = torch.from_numpy(w.astype(np.float64))
    assert torch.equal(layer.weight.detach().double(), want)
    assert torch.equal(layer.mask, want != 0)
    inference = torch.nn.Sequential()
    inference.proj = torch.nn.Linear(32, 16).to(model_dtype)
    spt.load_sparse24_checkpoint(inference, tmp_path, trainable=False)
    assert torch.equal(layer.to_dense().to(torch.bfloat16), inference.proj.to_dense().to(torch.bfloat16))
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    y = torch.full((5, 16), float("nan"), dtype=torch.bfloat16)
    y[:] = layer(x)
    rounded = want.to(torch.bfloat16).double()  # (the forward's weight: the compute type's)
    ref = x.double() @ rounded.T + torch.from_numpy(bias.astype(np.float64))
    within(y, ref, x.double().abs() @ rounded.abs().T, 32, torch.bfloat16)


class _Halved(torch.nn.Module):
    def forward(self, w):
        return w * 0.5


def test_a_parametrized_trainable_layer_writes_no_master_weight(tmp_path):
    """A SemiSparseLinear whose weight is parametrized (torch.nn.utils.parametrize) is written as its
    to_sparse_linear() only. Before, its state dict's ``proj.parametrizations.weight.original`` (the
    unpruned master weight) went into the file next to the sparse layer, and a strict load of the
    checkpoint was SP0914 (unexpected key)."""
    from torch.nn.utils import parametrize

    model = _Net()
    spt.sparsify_(model, dtype="bf16", trainable=True, interpret=True, min_features=16)
    parametrize.register_parametrization(model.proj, "weight", _Halved())
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = st.load_file(tmp_path / "model.safetensors")
    assert sorted(tensors) == ["head.bitmask", "head.compressed", "head.shape", "proj.bias", "proj.bitmask",
                               "proj.compressed", "proj.shape"]
    want = masked_weight(model.proj)  # (the parametrized weight, halved)
    assert np.array_equal(_decoded(tensors, "proj"), want.numpy())
    fresh = _Net(seed=6)
    report = spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert (report.missing, report.unexpected) == ([], [])
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    y = torch.full((5, 32), float("nan"), dtype=torch.bfloat16)
    y[:] = fresh.proj(x)
    ref = x.double() @ want.T + model.proj.bias.detach().double()
    within(y, ref, x.double().abs() @ want.abs().T, 64, torch.bfloat16)


class _F16(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4).to(torch.float16)

    def forward(self, x):
        return self.proj(x)


def test_a_bias_beyond_f16_into_an_f16_trainable_layer_is_sp0913(tmp_path):
    """The trainable layer's bias takes its master type (as nn.Linear's load_state_dict casts it); in an
    f16 model a float32 bias beyond ±65504 would be inf: refused like the weights' (SP0913), the model
    unchanged. The inference layer keeps the float32 bias and loads."""
    dense = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float16)
    tensors = compressed_tensors_layer(dense)
    tensors["proj.bias"] = np.array([1.0, -2.0, 7.0e4, 0.5], np.float32)
    st.save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"sparsity_config": {
        "format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": []}}}))
    model = _F16()
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path, trainable=True)
    assert (err.code, err.message, err.help) == (
        "SP0913", "layer proj: its bias has 1 value beyond ±65504: as the f16 master's bias it would be inf",
        "build the model in bf16 (torch_dtype=torch.bfloat16), or load it for inference (trainable=False), "
        "which keeps the bias in float32")
    assert type(model.proj) is torch.nn.Linear
    spt.load_sparse24_checkpoint(model, tmp_path, trainable=False)
    assert torch.equal(model.proj.bias.float(), torch.from_numpy(tensors["proj.bias"]))
