"""A sparsified GPT-2 (transformers ``Conv1D`` projections, y = x @ W + b with W stored (in, out), swapped for
the SparseLinear of W.T) written with save_sparse24_checkpoint: each Conv1D-origin layer is in GPT-2's own
layout, shape (in, out), so that a reader decompressing the bitmask (compressed-tensors inside transformers,
which recreates the dense tensor of the stored shape for the Conv1D's weight) gets W itself. Before, the file
held W.T (out, in) under GPT-2's names: a square projection (attn.c_proj) was read transposed without an
error, the others failed on shape. The loader reads the layout back into a dense GPT-2 (its Conv1D modules
replaced) or a sparsified one; an (out, in) shape for a Conv1D target is SP0914."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spt = pytest.importorskip("sparsile.torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from sparsile.integrations.errors import IntegrationError  # noqa: E402

CONFIG = dict(vocab_size=61, n_embd=64, n_layer=1, n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None)
PROJECTIONS = {"attn.c_attn": (64, 192), "attn.c_proj": (64, 64), "mlp.c_fc": (64, 256), "mlp.c_proj": (256, 64)}
NAMES = [f"transformer.h.0.{p}" for p in PROJECTIONS]
PROMPT = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))
# (every save here writes Conv1D layers: the warning has its own test, pytest.warns records it all the same)
pytestmark = pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMLayoutWarning")


def gpt2(seed: int):
    """A tiny random GPT-2 in bf16 (eval mode), its Conv1D biases random too (GPT-2 initializes them to 0)."""
    config = transformers.GPT2Config(**CONFIG)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name in NAMES:
            model.get_submodule(name).bias.normal_()
    return model


def sparsified(seed: int = 0, **kwargs):
    model = gpt2(seed)
    assert spt.sparsify_(model, interpret=True, min_features=16, **kwargs).swapped == NAMES
    return model


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=PROMPT).logits


def decoded(tensors: dict[str, torch.Tensor], name: str) -> np.ndarray:
    """The dense float64 weight of ``name`` decoded from the sparse-24-bitmask format's definition, written here
    apart from sparsile's reader: the mask is bit j % 8 (least significant first) of byte j // 8 of each row of
    ``bitmask``, of the dense shape ``shape``; the flattened ``compressed`` values fill the mask's positions in
    row-major order (compressed-tensors' sparse24_bitmask_decompress)."""
    rows, cols = (int(v) for v in tensors[f"{name}.shape"].reshape(-1))
    bits = tensors[f"{name}.bitmask"].numpy()
    column = np.arange(cols)
    mask = ((bits[:, column // 8] >> (column % 8)) & 1).astype(bool)
    dense = np.zeros((rows, cols))
    dense[mask] = tensors[f"{name}.compressed"].double().numpy().reshape(-1)
    return dense


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_the_file_holds_each_conv1d_in_gpt2s_layout(tmp_path):
    model = sparsified()
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = safetensors_torch.load_file(tmp_path / "model.safetensors")
    for name, (k, n) in zip(NAMES, PROJECTIONS.values(), strict=True):
        assert tensors[f"{name}.shape"].reshape(-1).tolist() == [k, n]
        assert tuple(tensors[f"{name}.compressed"].shape) == (k, n // 2)
        assert tuple(tensors[f"{name}.bitmask"].shape) == (k, n // 8)
        assert tuple(tensors[f"{name}.bias"].shape) == (n,)
        layer = model.get_submodule(name)
        assert np.array_equal(decoded(tensors, name), layer.to_dense().double().T.numpy())  # W, not W.T


def test_a_dense_gpt2_takes_the_decoded_weights_with_plain_load_state_dict(tmp_path):
    """What transformers does with the file: each Conv1D's weight is the decompressed tensor of the stored shape.
    A dense GPT-2 given those weights (plain load_state_dict, strict) computes the sparsified model's logits, as
    close to the float64 model as the bf16 dense one is."""
    model = sparsified()
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = safetensors_torch.load_file(tmp_path / "model.safetensors")
    dense = gpt2(seed=5)  # (other random weights: everything comes from the file)
    state = {k: v for k, v in tensors.items() if not k.endswith((".compressed", ".bitmask", ".shape"))}
    for name in NAMES:
        state[f"{name}.weight"] = torch.from_numpy(decoded(tensors, name)).to(torch.bfloat16)
    state["lm_head.weight"] = state["transformer.wte.weight"]
    dense.load_state_dict(state, strict=True)
    exact = logits(copy.deepcopy(dense).double())
    bf16_error = relative(logits(dense), exact)
    got = logits(model)
    assert exact.abs().max() > 0.1 and torch.isfinite(got).all()
    assert 0 < relative(got, exact) <= 1.25 * bf16_error


@pytest.mark.parametrize("target", ["dense", "sparsified"])
def test_load_sparse24_checkpoint_into_a_dense_or_sparsified_gpt2(tmp_path, target):
    model = sparsified()
    spt.save_sparse24_checkpoint(model, tmp_path / "a")
    fresh = gpt2(seed=7) if target == "dense" else sparsified(seed=7)
    report = spt.load_sparse24_checkpoint(fresh, tmp_path / "a")
    assert sorted(report.sparse) == sorted(NAMES) and not report.missing and not report.unexpected
    for name in NAMES:
        layer = fresh.get_submodule(name)
        assert type(layer) is spt.SparseLinear and layer.transposed_from == "transformers Conv1D"
        assert torch.equal(layer.to_dense(), model.get_submodule(name).to_dense())
        assert torch.equal(layer.bias, model.get_submodule(name).bias)
    assert torch.equal(logits(fresh), logits(model))
    spt.save_sparse24_checkpoint(fresh, tmp_path / "b")  # (the loaded layers know their origin: the same file)
    first = safetensors_torch.load_file(tmp_path / "a" / "model.safetensors")
    again = safetensors_torch.load_file(tmp_path / "b" / "model.safetensors")
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)


def test_a_trainable_gpt2_converted_saved_and_reloaded(tmp_path):
    """sparsify_(trainable=True), then to_sparse_linear() in place of each SemiSparseLinear (the inference layer
    keeps the Conv1D origin), saved: the file holds (weight * mask).T in GPT-2's layout, and a dense GPT-2 loads it
    to the converted model's logits."""
    model = sparsified(trainable=True)
    masked = {name: (model.get_submodule(name).weight * model.get_submodule(name).mask).detach() for name in NAMES}
    for name in NAMES:
        parent, _, child = name.rpartition(".")
        layer = model.get_submodule(name).to_sparse_linear()
        assert layer.transposed_from == "transformers Conv1D"
        setattr(model.get_submodule(parent), child, layer)
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = safetensors_torch.load_file(tmp_path / "model.safetensors")
    for name in NAMES:
        assert np.array_equal(decoded(tensors, name), masked[name].double().T.numpy())
    fresh = gpt2(seed=9)
    spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert torch.equal(logits(fresh), logits(model))


def test_an_out_in_shape_for_a_conv1d_target_is_refused(tmp_path):
    """A file holding a Conv1D-origin layer as (out, in) (what sparsile wrote before; here a layer whose origin
    was dropped) is SP0914 for a Conv1D target and for a Conv1D-origin SparseLinear, the model left as it was."""
    model = sparsified()
    model.transformer.h[0].mlp.c_fc.transposed_from = None  # (written as an nn.Linear's: (out, in))
    spt.save_sparse24_checkpoint(model, tmp_path)
    for fresh, what in ((gpt2(seed=3), "is a"), (sparsified(seed=3), "was made from a")):
        before = copy.deepcopy(fresh)
        with pytest.raises(IntegrationError) as info:
            spt.load_sparse24_checkpoint(fresh, tmp_path)
        assert info.value.code == "SP0914"
        assert info.value.message == (
            f"layer transformer.h.0.mlp.c_fc {what} transformers Conv1D of 64 inputs and 256 outputs, stored "
            "(in, out) = (64, 256), but the checkpoint's shape is [256, 64]")
        assert info.value.help.startswith("a Conv1D's sparse layer is written in GPT-2's layout (in, out)")
        assert type(fresh.transformer.h[0].mlp.c_fc) is type(before.transformer.h[0].mlp.c_fc)
        assert torch.equal(logits(fresh), logits(before))


def test_a_conv1d_bitmask_keeping_three_of_four_inputs_is_refused(tmp_path):
    """In GPT-2's layout the 2:4 groups run down the columns (four consecutive inputs of an output): a bitmask that
    keeps three of them is SP0913, naming the column and the rows."""
    model = sparsified()
    spt.save_sparse24_checkpoint(model, tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    name = "transformer.h.0.attn.c_proj"
    dense = torch.from_numpy(decoded(tensors, name))
    column = 5
    kept = dense[0:4, column] != 0
    row = int(torch.nonzero(~kept)[0])
    dense[row, column] = 1.0  # (a third kept input of output 5, rows 0..3)
    mask = dense != 0
    bits = np.packbits(mask.numpy(), axis=1, bitorder="little")
    tensors[f"{name}.bitmask"] = torch.from_numpy(bits)
    tensors[f"{name}.compressed"] = dense[mask].to(torch.bfloat16).reshape(1, -1)  # (the mask is checked first)
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(IntegrationError) as info:
        spt.load_sparse24_checkpoint(gpt2(seed=3), tmp_path)
    assert info.value.code == "SP0913"
    assert info.value.message.startswith(f"layer {name}: ")
    assert f"keeps 3 elements of column {column}, group 0 (rows 0..3)" in info.value.message


def test_an_fp8_conv1d_layer_is_not_written(tmp_path):
    """compressed-tensors scales a weight per channel along its first dimension: a Conv1D's (in, out) weight per
    input, not per output as the layer does. An e4m3 layer made from a Conv1D is SP0915, nothing written."""
    model = sparsified(dtype="e4m3")
    with pytest.raises(IntegrationError) as info:
        spt.save_sparse24_checkpoint(model, tmp_path / "ckpt")
    assert info.value.code == "SP0915"
    assert info.value.message == (
        "layer transformer.h.0.attn.c_attn: an e4m3 layer made from a transformers Conv1D cannot be written; its "
        "weight is stored (in, out), along which compressed-tensors' per-channel weight_scale would scale the inputs, "
        "not the outputs")
    assert not (tmp_path / "ckpt").exists()


def test_saving_a_conv1d_layer_warns_for_vllm(tmp_path):
    """vLLM's GPT-2 transposes the Conv1D tensors named .weight only: its 2:4 scheme takes .compressed and .bitmask
    as (out, in), so a square projection would load transposed. One VLLMLayoutWarning names the layers."""
    model = sparsified()
    with pytest.warns(spt.VLLMLayoutWarning) as record:
        spt.save_sparse24_checkpoint(model, tmp_path / "a")
    assert len([w for w in record if w.category is spt.VLLMLayoutWarning]) == 1
    text = str(record[0].message)
    assert text.startswith("save_sparse24_checkpoint: vLLM cannot load 4 layers made from a transformers Conv1D "
                           "(transformer.h.0.attn.c_attn, transformer.h.0.attn.c_proj, ")
    assert "the square ones (transformer.h.0.attn.c_proj) would load transposed without an error" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error", spt.VLLMLayoutWarning)
        with pytest.raises(spt.VLLMLayoutWarning):
            spt.save_sparse24_checkpoint(model, tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_a_conv1d_layer_of_odd_out_features_is_not_written(tmp_path):
    """GPT-2's layout stores the compressed values (in, out / 2): an odd out_features is SP0915, nothing written."""
    from transformers.pytorch_utils import Conv1D

    holder = torch.nn.Sequential(Conv1D(33, 64)).to(torch.bfloat16)
    assert spt.sparsify_(holder, interpret=True, min_features=16).swapped == ["0"]
    with pytest.raises(IntegrationError) as info:
        spt.save_sparse24_checkpoint(holder, tmp_path / "ckpt")
    assert info.value.code == "SP0915"
    assert info.value.message == ("layer 0: out_features = 33 is odd; a transformers Conv1D's sparse layer is stored "
                                  "(in, out) with compressed values (in, out / 2)")
    assert info.value.help == "keep it dense: sparsify_ with a filter_fn that leaves 0 out"
    assert not (tmp_path / "ckpt").exists()


def test_8_bit_values_for_a_conv1d_target_are_refused(tmp_path):
    model = sparsified()
    spt.save_sparse24_checkpoint(model, tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    name = "transformer.h.0.attn.c_proj"
    tensors[f"{name}.compressed"] = tensors[f"{name}.compressed"].to(torch.float8_e4m3fn)
    tensors[f"{name}.weight_scale"] = torch.ones(64, 1)
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    fresh = gpt2(seed=3)
    with pytest.raises(IntegrationError) as info:
        spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert info.value.code == "SP0913"
    assert info.value.message == (
        f"layer {name}: 8-bit compressed values for a layer stored in a transformers Conv1D's layout (in, out): a "
        "per-channel weight_scale of that weight scales its inputs, which the fp8 kernel's scale (per output) cannot")
    assert info.value.help == "load a checkpoint of bf16 or f16 weights for a Conv1D layer"
    assert all(type(fresh.get_submodule(n)).__name__ == "Conv1D" for n in NAMES)


def test_a_conv1d_target_with_a_hook_is_refused(tmp_path):
    model = sparsified()
    spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = gpt2(seed=3)
    fresh.transformer.h[0].mlp.c_fc.register_forward_hook(lambda module, args, out: out)
    with pytest.raises(IntegrationError) as info:
        spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert info.value.code == "SP0914"
    assert info.value.message.startswith("layer transformer.h.0.mlp.c_fc of the model cannot be replaced by the "
                                         "checkpoint's: it has forward hooks, which a SparseLinear in its place")
    assert all(type(fresh.get_submodule(n)).__name__ == "Conv1D" for n in NAMES)


def _conv1d_help(at: str, n: int, k: int) -> str:
    return (f"linear = {at}.to_linear(); conv = Conv1D({n}, {k}) (transformers.pytorch_utils; "
            "Conv1D(out, in)); "
            f"conv.weight.data = linear.weight.T.contiguous(); conv.bias.data = linear.bias.data; {at} = conv")


def _put_a_conv1d_back(holder: torch.nn.Module, name: str):
    """What the help says, done: the Conv1D of the SparseLinear ``holder.<name>``'s weight, in its place."""
    from transformers.pytorch_utils import Conv1D

    layer = holder.get_submodule(name)
    linear = layer.to_linear()
    conv = Conv1D(layer.out_features, layer.in_features)
    conv.weight.data = linear.weight.T.contiguous()
    conv.bias.data = linear.bias.data
    holder.register_module(name, conv)
    return layer, conv


def test_sp0915_for_a_conv1d_layer_says_to_put_a_conv1d_back(tmp_path):
    """A Conv1D-origin layer whose in_features is no multiple of 4 cannot be written sparse. The help said to put
    an nn.Linear (layer.to_linear()) in its place: written (out, in) under the Conv1D's name, which transformers
    reads transposed. It says to put a Conv1D back, of weight to_linear().weight.T; done, the file holds the
    Conv1D's weight (in, out) and a model of Conv1D layers loads it."""
    from transformers.pytorch_utils import Conv1D

    from sparsile.integrations.torch.conv1d import CONV1D_ORIGIN, linear_of

    def holder():
        torch.manual_seed(5)
        model = torch.nn.Sequential(Conv1D(16, 30), Conv1D(64, 16)).to(torch.bfloat16)
        with torch.no_grad():
            for m in model:
                m.bias.normal_()
        return model

    model = holder()
    assert spt.sparsify_(model, interpret=True, min_features=16).swapped == ["1"]
    first = spt.SparseLinear.from_dense(linear_of(model[0]))  # (as a trainer's or a user's conversion makes it)
    first.transposed_from = CONV1D_ORIGIN
    model[0] = first
    with pytest.raises(IntegrationError) as info:
        spt.save_sparse24_checkpoint(model, tmp_path / "a")
    assert info.value.code == "SP0915"
    assert info.value.message == ("layer 0: in_features = 30 is not a multiple of 4; sparse-24-bitmask stores whole "
                                  "groups of 4")
    assert info.value.help == (
        "write it dense: put a transformers Conv1D back in its place before saving, not an nn.Linear, whose weight "
        f"(out, in) transformers would read transposed under a Conv1D's name ({_conv1d_help('model[0]', 16, 30)}); "
        "save_sparse24_checkpoint writes it as a plain 0.weight (in, out), as transformers reads a Conv1D's")
    sparse, conv = _put_a_conv1d_back(model, "0")
    assert conv.weight.shape == (30, 16) and torch.equal(conv.weight, sparse.to_dense().to(torch.bfloat16).T)
    spt.save_sparse24_checkpoint(model, tmp_path / "b")
    tensors = safetensors_torch.load_file(tmp_path / "b" / "model.safetensors")
    assert torch.equal(tensors["0.weight"], conv.weight) and "0.compressed" not in tensors
    fresh = holder()
    assert spt.load_sparse24_checkpoint(fresh, tmp_path / "b").sparse == ["1"]
    assert type(fresh[0]) is Conv1D and torch.equal(fresh[0].weight, conv.weight)
    x = torch.randn(3, 30).to(torch.bfloat16)
    assert torch.equal(fresh(x), model(x))


def test_the_vllm_shape_warning_says_to_put_a_conv1d_back_for_a_conv1d_layer(tmp_path):
    """The VLLMShapeWarning's way to write a layer dense for vLLM (an nn.Linear in its place) would write a
    Conv1D-origin layer (out, in) under GPT-2's name; for such layers it says to put a Conv1D back."""
    from transformers.pytorch_utils import Conv1D

    model = torch.nn.Sequential(Conv1D(12, 64)).to(torch.bfloat16)
    assert spt.sparsify_(model, interpret=True, min_features=8).swapped == ["0"]
    with pytest.warns(spt.VLLMShapeWarning) as record:
        spt.save_sparse24_checkpoint(model, tmp_path)
    told = [str(w.message) for w in record if w.category is spt.VLLMShapeWarning]
    assert len(told) == 1 and told[0].startswith("save_sparse24_checkpoint: vLLM cannot load 1 layer of this "
                                                 "checkpoint: 0 (64 in, 12 out).")
    assert told[0].endswith(
        "For vLLM, write those layers dense (layer.to_linear() in their place; q/k/v and gate/up parts all together), "
        "and those made from a transformers Conv1D (0) as a Conv1D, not an nn.Linear, whose weight (in, out) "
        "transformers reads under their names (an nn.Linear's (out, in) would be read transposed): "
        f"{_conv1d_help('model[0]', 12, 64)}")
    sparse, conv = _put_a_conv1d_back(model, "0")
    assert conv.weight.shape == (64, 12) and torch.equal(conv.weight, sparse.to_dense().to(torch.bfloat16).T)
    x = torch.randn(3, 64).to(torch.bfloat16)
    ref = x.double() @ sparse.to_dense().double().T + sparse.bias.double()
    assert torch.allclose(conv(x).double(), ref, rtol=2e-2, atol=2e-2)


def test_help_texts_name_a_submodule_in_python_that_runs():
    """A help's statement names a layer as Python: numeric parts of its module name are indexing
    (``model.transformer.h[0].attn.c_proj``; ``model.transformer.h.0`` is a syntax error), and the
    expression reaches that module."""
    from sparsile.integrations.errors import attribute_path

    model = torch.nn.Module()
    model.transformer = torch.nn.Module()
    model.transformer.h = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(4, 4))])
    path = attribute_path("model", "transformer.h.0.0")
    assert path == "model.transformer.h[0][0]"
    assert eval(path, {"model": model}) is model.get_submodule("transformer.h.0.0")
    assert attribute_path("model", "") == "model"


def test_a_trainable_gpt2_is_written_as_its_inference_form_and_loads_back_trainable(tmp_path):
    """sparsify_(trainable=True) of GPT-2: each SemiSparseLinear made from a Conv1D is written as its
    to_sparse_linear() (the same bytes, in GPT-2's layout); loaded into a dense GPT-2 with trainable=True,
    each Conv1D becomes a SemiSparseLinear of the trained mask and weight (bf16 master, the model's type),
    which knows its origin (written again in that layout; matched as a Conv1D by config class targets)."""
    model = sparsified(trainable=True)
    spt.save_sparse24_checkpoint(model, tmp_path / "trained")
    converted = copy.deepcopy(model)
    for name in NAMES:
        parent, _, child = name.rpartition(".")
        setattr(converted.get_submodule(parent), child, converted.get_submodule(name).to_sparse_linear())
    spt.save_sparse24_checkpoint(converted, tmp_path / "converted")
    for file in ("model.safetensors", "config.json"):
        assert (tmp_path / "trained" / file).read_bytes() == (tmp_path / "converted" / file).read_bytes()
    tensors = safetensors_torch.load_file(tmp_path / "trained" / "model.safetensors")
    dense = gpt2(5)
    report = spt.load_sparse24_checkpoint(dense, tmp_path / "trained", trainable=True)
    assert (report.missing, report.unexpected) == ([], [])
    for name, (k, n) in zip(NAMES, PROJECTIONS.values(), strict=True):
        a, b = model.get_submodule(name), dense.get_submodule(name)
        assert type(b) is spt.SemiSparseLinear and (b.in_features, b.out_features) == (k, n)
        assert (b.transposed_from, b.source_classes) == ("transformers Conv1D", ("Conv1D", "Module"))
        assert b.weight.dtype == torch.bfloat16 and torch.equal(b.mask, a.mask)
        want = a.to_dense().double()
        assert torch.equal(b.weight.detach().double(), want)
        assert np.array_equal(decoded(tensors, name), want.T.numpy())  # (the file: W (in, out))
    assert torch.equal(logits(dense), logits(model))
    spt.save_sparse24_checkpoint(dense, tmp_path / "again")  # (written again in GPT-2's layout)
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == \
        (tmp_path / "trained" / "model.safetensors").read_bytes()
