"""compressed-tensors sparse-24-bitmask checkpoints: write and read back (bf16, f16, e4m3 with scales),
a hand-written fixture with -0.0, all-zero groups and one-nonzero groups (the products must match,
not the masks), sharded files, and the SP0912-SP0914 diagnostics."""

from __future__ import annotations

import copy
import json
import warnings

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer
from sparsile.tests.integrations.torch_helpers import check_against_float64, linear, tiny_llama

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


class _Net(torch.nn.Module):
    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        self.proj = linear(32, 64, dtype=dtype, seed=1)
        self.head = linear(16, 32, dtype=dtype, bias=False, seed=2)
        self.norm = torch.nn.LayerNorm(32).to(dtype)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))


@pytest.mark.parametrize(("dtype", "weights"), [(None, torch.bfloat16), (None, torch.float16),
                                                ("e4m3", torch.bfloat16)])
def test_round_trip(tmp_path, dtype, weights):
    model = _Net(weights)
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
    assert spt.sparsify_(model, dtype=dtype, interpret=True, min_features=16).swapped == ["proj", "head"]
    spt.save_sparse24_checkpoint(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    sparsity = config["quantization_config"]["sparsity_config"]
    assert (sparsity["format"], sparsity["sparsity_structure"]) == ("sparse-24-bitmask", "2:4")
    tensors = st.load_file(tmp_path / "model.safetensors")
    assert tensors["proj.compressed"].shape == (32, 32) and tensors["proj.bitmask"].shape == (32, 8)
    assert tensors["proj.shape"].tolist() == [[32], [64]] and tensors["proj.shape"].dtype == np.int64
    assert tensors["proj.compressed"].dtype == (ml_dtypes.float8_e4m3fn if dtype else np.dtype(str(weights)[6:]))
    fresh = _Net(weights)
    report = spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["head", "proj"], [], [])
    for name in ("proj", "head"):
        a, b = getattr(model, name), getattr(fresh, name)
        assert isinstance(b, spt.SparseLinear) and b.weight_dtype == a.weight_dtype
        assert torch.equal(a.to_dense(), b.to_dense())
    assert torch.equal(fresh.norm.weight, model.norm.weight)
    x = torch.randn(3, 64).to(weights)
    assert torch.equal(fresh(x), model(x))


def _fixture(tmp_path, dense: np.ndarray, dtype: str = "F16") -> None:
    """A checkpoint written by hand the way compressed-tensors does: a top-2-by-magnitude mask per
    group (two bits even in an all-zero group), compressed = dense[mask]."""
    rows, cols = dense.shape
    order = np.argsort(-np.abs(dense.reshape(rows, -1, 4)), axis=2, kind="stable")[:, :, :2]
    mask = np.zeros((rows, cols // 4, 4), bool)
    np.put_along_axis(mask, order, True, axis=2)
    mask = mask.reshape(rows, cols)
    compressed = dense[mask].reshape(rows, cols // 2).astype(st.DTYPES[dtype])
    st.save_file({"proj.weight.compressed": compressed,
                  "proj.weight.bitmask": np.packbits(mask, axis=1, bitorder="little"),
                  "proj.weight.shape": np.array([rows, cols], np.int64),
                  "proj.bias": np.linspace(-1, 1, rows).astype(np.float32)}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"compression_config": {"sparsity_config": {
        "format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": []}}}))


class _One(torch.nn.Module):
    def __init__(self, n=16, k=32, dtype=torch.float16):
        super().__init__()
        self.proj = torch.nn.Linear(k, n).to(dtype)

    def forward(self, x):
        return self.proj(x)


def test_negative_zero_all_zero_and_single_nonzero_groups(tmp_path):
    rng = np.random.default_rng(3)
    dense = rng.standard_normal((16, 32)).astype(np.float16)
    dense.reshape(16, 8, 4)[:, :, 2:] = 0
    dense[0] = 0                                     # all-zero groups
    dense[1, 0:4] = [0, 0, 0, 2.5]                   # one nonzero
    dense[2, 4:8] = [-0.0, -0.0, 1.0, 0]             # -0.0 ranks with the zeros
    dense[3, 8:12] = [-0.0, 0, 0, 0]
    _fixture(tmp_path, dense)
    model = _One()
    spt.load_sparse24_checkpoint(model, tmp_path)
    layer = model.proj
    assert torch.equal(layer.to_dense(), torch.from_numpy(dense.astype(np.float32)))
    x = torch.randn(4, 32).to(torch.float16)
    y = layer(x)
    check_against_float64(layer, x, y)
    ref = x.double() @ torch.from_numpy(dense).double().T + torch.linspace(-1, 1, 16).double()
    assert torch.allclose(y.double(), ref, rtol=2e-3, atol=2e-3)


def test_fp8_int8_bits_with_weight_scale(tmp_path):
    rng = np.random.default_rng(4)
    dense = rng.standard_normal((16, 32)).astype(ml_dtypes.float8_e4m3fn)
    dense.reshape(16, 8, 4)[:, :, ::2] = 0
    _fixture(tmp_path, dense.view(np.int8).astype(np.int8), "I8")  # ranks the int8 bit patterns, as the writer does
    tensors = st.load_file(tmp_path / "model.safetensors")
    tensors = {**tensors, "proj.weight_scale": np.full((16, 1), 0.5, np.float32)}
    st.save_file(tensors, tmp_path / "model.safetensors")
    model = _One(dtype=torch.bfloat16)
    spt.load_sparse24_checkpoint(model, tmp_path)
    assert model.proj.weight_dtype == "e4m3" and torch.equal(model.proj.scale_w, torch.full((16,), 0.5))
    assert torch.equal(model.proj.to_dense(), torch.from_numpy(dense.astype(np.float32)) * 0.5)


def test_model_built_on_the_meta_device(tmp_path):
    model = _Net()
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    empty = _Net().to("meta")
    spt.load_sparse24_checkpoint(empty, tmp_path)
    assert not any(t.is_meta for t in empty.state_dict().values())
    x = torch.randn(2, 64).to(torch.bfloat16)
    assert torch.equal(empty(x), model(x))


def test_sharded_checkpoint(tmp_path):
    model = _Net()
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = st.load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        st.save_file({k: tensors[k] for k in keys}, tmp_path / file)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    fresh = _Net()
    spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert torch.equal(fresh.proj.to_dense(), model.proj.to_dense())


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


def test_config_errors_are_sp0912(tmp_path):
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0912", f"{tmp_path} has no config.json")
    (tmp_path / "config.json").write_text(json.dumps({"sparsity_config": {"format": "dense"}}))
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0912", f"{tmp_path / 'config.json'} declares format 'dense', not "
                                                 "'sparse-24-bitmask'")
    (tmp_path / "config.json").write_text(json.dumps({"sparsity_config": {"format": "sparse-24-bitmask"}}))
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0912", f"{tmp_path} holds no .safetensors file")


def test_layer_and_module_errors(tmp_path):
    dense = np.zeros((16, 32), np.float16)
    _fixture(tmp_path, dense)
    tensors = st.load_file(tmp_path / "model.safetensors")
    st.save_file({k: v for k, v in tensors.items() if not k.endswith("bitmask")}, tmp_path / "model.safetensors")
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0913", "layer proj.weight: the checkpoint has proj.weight.compressed but no "
                                                 "proj.weight.bitmask")
    _fixture(tmp_path, dense)
    err = _error(spt.load_sparse24_checkpoint, _One(n=8), tmp_path)
    assert (err.code, err.message) == ("SP0914", "layer proj is 8 x 32 in the model but 16 x 32 in the checkpoint")

    class Other(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Conv1d(2, 2, 1)

    err = _error(spt.load_sparse24_checkpoint, Other(), tmp_path)
    assert (err.code, err.message) == ("SP0914", "the checkpoint's sparse layer proj is Conv1d of the model")
    err = _error(spt.load_sparse24_checkpoint, torch.nn.Module(), tmp_path)
    assert (err.code, err.message) == ("SP0914", "the checkpoint's sparse layer proj is no module of the model")
    tensors = st.load_file(tmp_path / "model.safetensors")
    st.save_file({**tensors, "extra.weight": np.ones(2, np.float32)}, tmp_path / "model.safetensors")
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0914", "the checkpoint and the model differ: missing [], unexpected "
                                                 "['extra.weight']")
    report = spt.load_sparse24_checkpoint(_One(), tmp_path, strict=False)
    assert report.unexpected == ["extra.weight"]
    st.save_file({**tensors, "proj.weight.compressed": tensors["proj.weight.compressed"].view(np.int8)},
                 tmp_path / "model.safetensors")
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0913", "layer proj: int8 compressed values without proj.weight_scale (int8 "
                                                 "weights have no kernel here)")


def test_a_bias_or_weight_scale_only_one_side_has_is_reported(tmp_path):
    """The sparse layer is built from the checkpoint, so a bias the model's linear has and the
    checkpoint lacks (or the reverse), or a weight_scale next to 16-bit values, was dropped or
    added without a word: strict loading refuses them (SP0914), strict=False reports them."""
    _fixture(tmp_path, np.ones((16, 32), np.float16))
    tensors = st.load_file(tmp_path / "model.safetensors")
    st.save_file({k: v for k, v in tensors.items() if k != "proj.bias"}, tmp_path / "model.safetensors")
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0914", "the checkpoint and the model differ: missing ['proj.bias'], "
                                                 "unexpected []")
    model = _One()
    report = spt.load_sparse24_checkpoint(model, tmp_path, strict=False)
    assert (report.missing, report.unexpected, model.proj.bias) == (["proj.bias"], [], None)

    _fixture(tmp_path, np.ones((16, 32), np.float16))
    no_bias = _One()
    no_bias.proj = torch.nn.Linear(32, 16, bias=False).half()
    report = spt.load_sparse24_checkpoint(no_bias, tmp_path, strict=False)
    assert (report.missing, report.unexpected) == ([], ["proj.bias"])

    tensors = st.load_file(tmp_path / "model.safetensors")
    st.save_file({**tensors, "proj.weight_scale": np.ones((16, 1), np.float32)}, tmp_path / "model.safetensors")
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0914", "the checkpoint and the model differ: missing [], unexpected "
                                                 "['proj.weight_scale']")


def test_save_arguments_of_the_wrong_kind_are_sp0907(tmp_path):
    """A model that is not a module was an AttributeError, a config that is not a dict a TypeError
    from dict() ("cannot convert dictionary update sequence element #0 to a sequence")."""
    err = _error(spt.save_sparse24_checkpoint, "model", tmp_path)
    assert (err.code, err.message) == ("SP0907", "save_sparse24_checkpoint takes an nn.Module, got str")
    err = _error(spt.save_sparse24_checkpoint, _One(), tmp_path, config=[1])
    assert (err.code, err.message) == ("SP0907", "config must be a dict (config.json's contents), got list")


def test_saving_a_model_without_sparse_layers_is_sp0907_and_writes_nothing(tmp_path):
    """A model never sparsified (its linears still nn.Linear) was written as a "sparse-24-bitmask"
    checkpoint whose targets were empty, without a word: its loader then had nothing to load."""
    folder = tmp_path / "ckpt"
    err = _error(spt.save_sparse24_checkpoint, _One(), folder)
    assert (err.code, err.message) == ("SP0907", "save_sparse24_checkpoint: the model has no SparseLinear layer "
                                                 "(nothing to write as sparse-24-bitmask)")
    assert "sparsify_" in err.help
    assert not folder.exists()


def test_load_arguments_of_the_wrong_kind_are_sp0907(tmp_path):
    """A model that is not a module was SP0914 "no module of the model" (get_submodule's
    AttributeError caught as a missing layer), or an AttributeError from state_dict() for a
    checkpoint without sparse layers; a path of None was a TypeError from pathlib."""
    _fixture(tmp_path, np.ones((16, 32), np.float16))
    err = _error(spt.load_sparse24_checkpoint, "model", tmp_path)
    assert (err.code, err.message) == ("SP0907", "load_sparse24_checkpoint takes an nn.Module, got str")
    err = _error(spt.load_sparse24_checkpoint, _One(), None)
    assert (err.code, err.message) == ("SP0907", "load_sparse24_checkpoint: path must be a folder (str or "
                                                 "os.PathLike), got NoneType")
    err = _error(spt.save_sparse24_checkpoint, _One(), 3)
    assert (err.code, err.message) == ("SP0907", "save_sparse24_checkpoint: path must be a folder (str or "
                                                 "os.PathLike), got int")


def test_a_file_given_for_the_folder_is_sp0912(tmp_path):
    """The checkpoint's file given instead of its folder: loading said ".../model.safetensors/config.json
    cannot be read as JSON: [Errno 20] Not a directory" with the help "repair or rewrite config.json",
    and saving over a file was a FileExistsError from mkdir."""
    _fixture(tmp_path, np.ones((16, 32), np.float16))
    weights = tmp_path / "model.safetensors"
    err = _error(spt.load_sparse24_checkpoint, _One(), weights)
    assert (err.code, err.message) == ("SP0912", f"{weights} is a file; a checkpoint is a folder")
    assert err.help == f"pass the folder that holds config.json and the .safetensors files ({tmp_path})"
    before = weights.read_bytes()
    err = _error(spt.save_sparse24_checkpoint, _One(), weights)
    assert (err.code, err.message) == ("SP0912", f"{weights} is a file; a checkpoint is a folder")
    assert err.help == "pass the folder to write config.json and model.safetensors into (created if missing)"
    assert weights.read_bytes() == before
    sparse = _One()
    spt.sparsify_(sparse, interpret=True, min_features=16)
    err = _error(spt.save_sparse24_checkpoint, sparse, weights / "ckpt")  # a folder under a file
    assert (err.code, err.message[:len(f"cannot create {weights / 'ckpt'}: ")]) == (
        "SP0912", f"cannot create {weights / 'ckpt'}: ")


def test_a_plain_tensor_of_another_shape_is_sp0914(tmp_path):
    """A tensor of the checkpoint outside the sparse layers whose shape differs from the model's was
    torch's RuntimeError from load_state_dict."""

    class WithNorm(_One):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(16).half()

    _fixture(tmp_path, np.ones((16, 32), np.float16))
    tensors = st.load_file(tmp_path / "model.safetensors")
    st.save_file({**tensors, "norm.weight": np.ones(8, np.float16), "norm.bias": np.zeros(16, np.float16)},
                 tmp_path / "model.safetensors")
    for strict in (True, False):
        err = _error(spt.load_sparse24_checkpoint, WithNorm(), tmp_path, strict=strict)
        assert (err.code, err.message) == (
            "SP0914", "the checkpoint and the model differ: size mismatch for norm.weight: copying a param with shape "
                      "torch.Size([8]) from checkpoint, the shape in current model is torch.Size([16]).")


@pytest.mark.parametrize("indexed", [False, True])
def test_a_tensor_in_two_files_is_sp0912(tmp_path, indexed):
    """Every tensor of every shard is read, so a tensor that two files hold (a stale copy in another
    shard, or a stale file next to the shards) was taken from the file sorted last, whatever the
    index says it is in: here the stale bias of b.safetensors, which the index places in a."""
    _fixture(tmp_path, np.ones((16, 32), np.float16))
    tensors = st.load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    st.save_file({k: v for k, v in tensors.items() if k != "proj.weight.shape"}, tmp_path / "a.safetensors")
    st.save_file({"proj.weight.shape": tensors["proj.weight.shape"], "proj.bias": np.full(16, 9, np.float32)},
                 tmp_path / "b.safetensors")
    if indexed:
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {**{k: "a.safetensors" for k in tensors}, "proj.weight.shape": "b.safetensors"}}))
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0912", "tensor 'proj.bias' is in both a.safetensors and b.safetensors")


def test_a_sparse_layer_keeps_the_model_s_activation_and_out_dtype(tmp_path):
    """The checkpoint stores weights only; a SparseLinear of the model with a fused activation or an
    out_dtype was replaced by a layer without them (its outputs silently lost the ReLU and came back
    in x's dtype), as load_state_dict would not do."""
    model = _Net()
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = _Net()
    spt.sparsify_(fresh, interpret=True, min_features=16)
    fresh.proj.activation, fresh.proj.out_dtype = "relu", torch.float32
    spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert (fresh.proj.activation, fresh.proj.out_dtype, fresh.head.activation) == ("relu", torch.float32, None)
    assert torch.equal(fresh.proj.to_dense(), model.proj.to_dense())
    x = torch.randn(3, 64).to(torch.bfloat16)
    y = fresh.proj(x)
    check_against_float64(fresh.proj, x, y, torch.float32)
    assert (y >= 0).all() and (model.proj(x) < 0).any()


def test_a_bias_of_another_length_names_its_layer(tmp_path):
    """A checkpoint bias of the wrong length was SP0902 "bias has 7 elements for 16 output features"
    from SparseLinear.from_compressed, without the layer's name."""
    _fixture(tmp_path, np.ones((16, 32), np.float16))
    tensors = st.load_file(tmp_path / "model.safetensors")
    st.save_file({**tensors, "proj.bias": np.zeros(7, np.float32)}, tmp_path / "model.safetensors")
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert (err.code, err.message) == ("SP0913", "layer proj: bias has 7 elements for 16 output channels")


@pytest.mark.parametrize("sparse", [False, True])
def test_a_layer_with_hooks_is_not_replaced_without_them(tmp_path, sparse):
    """The loader swaps a new SparseLinear in for each sparse layer: forward hooks registered on the
    model's layer (an nn.Linear, or a SparseLinear of a sparsified model) were dropped without a word
    (a hook doubling the layer's output: 50 % off after the load). SP0914 names the layer, before it
    is replaced."""
    model = _Net()
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = _Net()
    if sparse:
        spt.sparsify_(fresh, interpret=True, min_features=16)
    layer = fresh.proj
    layer.register_forward_hook(lambda module, args, out: out * 2)
    err = _error(spt.load_sparse24_checkpoint, fresh, tmp_path)
    assert (err.code, err.message) == (
        "SP0914", "layer proj of the model cannot be replaced by the checkpoint's: it has forward hooks, which a "
                  "SparseLinear in its place would not run (remove them, then register them on the SparseLinear)")
    assert fresh.proj is layer


# ------------------------------------------------------------------------------------------------
# tied weights: the loader keeps the ties the model declares, or refuses to load (SP0914)

IDS = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _untied_sparse_llama(path):
    """A checkpoint of an untied Llama whose lm_head is sparse too (as sparsify_ leaves it), and the
    model it was written from."""
    model = tiny_llama(tie_word_embeddings=False)
    assert spt.sparsify_(model, interpret=True, min_features=16).swapped[-1] == "lm_head"
    spt.save_sparse24_checkpoint(model, path)
    return model


HEAD_FIX = ("the checkpoint's config.json has tie_word_embeddings = false: build the model from it, or untie the "
            "model before loading: set model.config.tie_word_embeddings = False (so that tie_weights() does not tie "
            "them again) and give lm_head its own weight, "
            "model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())")


# (vLLM reads lm_head dense, as an embedding class, and cannot load 61 outputs: not these tests' subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMShapeWarning")
def test_a_compressed_layer_tied_to_the_embeddings_is_refused(tmp_path):
    """A checkpoint with lm_head compressed loaded into a model whose lm_head.weight IS
    embed_tokens.weight (tie_word_embeddings): lm_head became a SparseLinear of the checkpoint's
    pruned head while the embeddings took the checkpoint's dense ones, the tie the model declares
    broken without a word (and a later tie_weights() attached a weight the SparseLinear ignores).
    SP0914 names both tensors and the fix, before any layer of the model is replaced."""
    _untied_sparse_llama(tmp_path)
    tied = tiny_llama(tie_word_embeddings=True, seed=1)
    err = _error(spt.load_sparse24_checkpoint, tied, tmp_path)
    assert (err.code, err.message) == (
        "SP0914", "layer lm_head of the model cannot be replaced by the checkpoint's: its weight is tied to "
                  "model.embed_tokens.weight, and a SparseLinear in its place would untie them without a word")
    assert err.help == HEAD_FIX
    assert type(tied.lm_head) is torch.nn.Linear and tied.lm_head.weight is tied.model.embed_tokens.weight
    assert not any(isinstance(m, spt.SparseLinear) for m in tied.modules())  # nothing replaced


# (vLLM reads lm_head dense, as an embedding class, and cannot load 61 outputs: not these tests' subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMShapeWarning")
def test_the_model_untied_as_the_help_says_loads_the_checkpoint(tmp_path):
    saved = _untied_sparse_llama(tmp_path)
    model = tiny_llama(tie_word_embeddings=True, seed=1)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert "lm_head" in report.sparse and (report.missing, report.unexpected) == ([], [])
    model.tie_weights()
    assert isinstance(model.lm_head, spt.SparseLinear) and "weight" not in model.lm_head._parameters
    assert torch.equal(model.model.embed_tokens.weight, saved.model.embed_tokens.weight)
    assert torch.equal(_logits(model), _logits(saved))


@pytest.mark.parametrize("how", ["same", "view"])
def test_a_compressed_linear_sharing_its_weight_with_another_linear_is_refused(tmp_path, how):
    """The same rule for two linears of any model sharing one weight (the same parameter, or one over
    the same memory): the help has no config to change."""
    model = torch.nn.Module()
    model.a, model.b = linear(32, 64, seed=1), linear(32, 64, seed=2)
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = torch.nn.Module()
    fresh.a, fresh.b = linear(32, 64, seed=3), linear(32, 64, seed=4)
    fresh.b.weight = fresh.a.weight if how == "same" else torch.nn.Parameter(fresh.a.weight.data)
    err = _error(spt.load_sparse24_checkpoint, fresh, tmp_path)
    assert (err.code, err.message) == (
        "SP0914", "layer a of the model cannot be replaced by the checkpoint's: its weight is tied to b.weight, and "
                  "a SparseLinear in its place would untie them without a word")
    assert err.help == ("if the checkpoint's model is untied, untie the model before loading: give a its own weight, "
                        "model.a.weight = nn.Parameter(model.a.weight.detach().clone())")
    assert type(fresh.a) is torch.nn.Linear and type(fresh.b) is torch.nn.Linear


def _tied_dense_head_llama(path):
    """A checkpoint of a tied Llama whose projections are sparse and lm_head dense (sparsify_ skips
    it): lm_head.weight and model.embed_tokens.weight are both in the file, equal."""
    model = tiny_llama(tie_word_embeddings=True)
    assert list(spt.sparsify_(model, interpret=True, min_features=16).skipped) == ["lm_head"]
    spt.save_sparse24_checkpoint(model, path)
    return model


@pytest.mark.parametrize("head_in_file", [True, False])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_tied_model_keeps_its_tie(tmp_path, device, head_in_file):
    """A tied model and a tied checkpoint: on the meta device load_state_dict(assign=True) gave
    lm_head and the embeddings a tensor each (the tie broken without a word); a checkpoint that holds
    the tied tensor once (as transformers writes it: no lm_head.weight) was SP0914 "missing
    ['lm_head.weight']", though loading the embeddings loads it (and on the meta device lm_head was
    left without values). The tie is kept, and a key the tie loads is not missing."""
    saved = _tied_dense_head_llama(tmp_path)
    if not head_in_file:
        tensors = st.load_file(tmp_path / "model.safetensors")
        st.save_file({k: v for k, v in tensors.items() if k != "lm_head.weight"}, tmp_path / "model.safetensors")
    with torch.device(device):
        model = tiny_llama(tie_word_embeddings=True, seed=1)
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert (report.missing, report.unexpected) == ([], [])
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not any(t.is_meta for t in model.state_dict().values())
    assert torch.equal(model.lm_head.weight, saved.lm_head.weight)
    if device == "meta":  # the rotary inv_freq is a non-persistent buffer: in no checkpoint, made by from_pretrained
        model.model.rotary_emb = copy.deepcopy(saved.model.rotary_emb)
    assert torch.equal(_logits(model), _logits(saved))


def test_different_values_for_one_tied_tensor_are_refused(tmp_path):
    """An untied checkpoint (lm_head dense, not the embeddings) loaded into a tied model: both were
    copied into the one tensor, the file's later key winning without a word. SP0914 names them."""
    model = tiny_llama(tie_word_embeddings=False)
    spt.sparsify_(model, lambda m, fqn: fqn != "lm_head", interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    tied = tiny_llama(tie_word_embeddings=True, seed=1)
    before = tied.lm_head.weight.detach().clone()
    err = _error(spt.load_sparse24_checkpoint, tied, tmp_path)
    assert (err.code, err.message) == (
        "SP0914", "the checkpoint holds different values for lm_head.weight and model.embed_tokens.weight, which are "
                  "one tensor of the model (tied)")
    assert err.help == ("load into a model where they are two tensors: build it from the checkpoint's config "
                        "(tie_word_embeddings = false), or give one of them a copy of its own before loading")
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and torch.equal(tied.lm_head.weight, before)


def _aliased(seed: int):
    model = torch.nn.Module()
    model.a = linear(32, 64, seed=seed)
    model.b = model.a  # one module under two names (no tie: swapped under both, as sparsify_ does)
    return model


# (the checkpoint naming it once, as a: vLLM's class rule reads target "a" as part of "Linear", b sparse too)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
def test_a_module_under_two_names_is_replaced_under_both(tmp_path):
    """A layer registered under two names: only the checkpoint's name was replaced, the other kept
    the dense layer (and the round trip of such a sparsified model was SP0914: the writer named it
    once and wrote its buffers under the other name as plain tensors)."""
    model = _aliased(1)
    assert spt.sparsify_(model, interpret=True, min_features=16).swapped == ["a", "b"]
    spt.save_sparse24_checkpoint(model, tmp_path)
    names = set(st.load_file(tmp_path / "model.safetensors"))
    assert {"a.compressed", "b.compressed"} <= names and "b.values" not in names
    fresh = _aliased(2)
    report = spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["a", "b"], [], [])
    assert fresh.a is fresh.b and isinstance(fresh.a, spt.SparseLinear)
    assert torch.equal(fresh.a.to_dense(), model.a.to_dense())

    single = torch.nn.Module()  # a checkpoint naming it once
    single.a = model.a
    spt.save_sparse24_checkpoint(single, tmp_path)
    fresh = _aliased(2)
    report = spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["a", "b"], [], [])
    assert fresh.a is fresh.b and torch.equal(fresh.b.to_dense(), model.a.to_dense())


def test_different_layers_for_one_module_are_refused(tmp_path):
    model = torch.nn.Module()
    model.a, model.b = linear(32, 64, seed=1), linear(32, 64, seed=2)
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = _aliased(3)
    err = _error(spt.load_sparse24_checkpoint, fresh, tmp_path)
    assert (err.code, err.message) == (
        "SP0914", "layers a and b are one module of the model, but the checkpoint holds different layers for them")
    assert type(fresh.a) is torch.nn.Linear and fresh.a is fresh.b


def test_a_bad_layer_leaves_the_model_as_it_was(tmp_path):
    """Every sparse layer is built before any is swapped in: a checkpoint whose later layer is bad
    (SP0913) left the layers before it replaced, a half-loaded model the caller could not tell from
    the one it passed."""
    model = _Net()
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = st.load_file(tmp_path / "model.safetensors")
    assert sorted(k for k in tensors if k.endswith(".compressed")) == ["head.compressed", "proj.compressed"]
    st.save_file({**tensors, "proj.bias": np.ones(7, np.float32)}, tmp_path / "model.safetensors")
    fresh = _Net()
    head, proj = fresh.head, fresh.proj
    err = _error(spt.load_sparse24_checkpoint, fresh, tmp_path)
    assert (err.code, err.message) == ("SP0913", "layer proj: bias has 7 elements for 32 output channels")
    assert fresh.head is head and fresh.proj is proj


def _write(tmp_path, tensors: dict[str, np.ndarray], config: dict) -> None:
    st.save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("fp8", [False, True])
def test_a_checkpoint_laid_out_as_compressed_tensors_writes_it_loads(tmp_path, fp8):
    """compressed-tensors writes ``.shape`` as a (2, 1) tensor; the reader took only (2,) and refused
    every checkpoint that library wrote (SP0913, "shape must hold two non-negative integers")."""
    rng = np.random.default_rng(7)
    pruned = rng.standard_normal((16, 32)) * 0.5
    pruned.reshape(16, 8, 4)[:, :, 1::2] = 0  # 2:4 by construction: the mask keeps what is stored
    dtype = ml_dtypes.float8_e4m3fn if fp8 else np.float16
    stored = pruned.astype(dtype)
    tensors = {**compressed_tensors_layer(stored), "proj.bias": np.linspace(-1, 1, 16).astype(ml_dtypes.bfloat16)}
    scale = np.linspace(0.5, 2, 16).astype(np.float32)
    quant: dict = {"quant_method": "compressed-tensors",
                   "sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4",
                                       "targets": ["Linear"], "ignore": []}}
    if fp8:
        tensors["proj.weight_scale"] = scale.reshape(-1, 1).astype(ml_dtypes.bfloat16)
        # (W8A8: a group without input_activations is weight-only, W8A16, loaded dequantized: test_torch_checkpoint_
        # matching.py)
        quant["config_groups"] = {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"},
                                              "input_activations": {"num_bits": 8, "type": "float",
                                                                    "strategy": "token", "dynamic": True}}}
    _write(tmp_path, tensors, {"quantization_config": quant})
    model = _One(dtype=torch.bfloat16 if fp8 else torch.float16)  # (f16 values: kept in an f16 model)
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])
    w = torch.from_numpy(stored.astype(np.float64))
    if fp8:
        w = w * torch.from_numpy(scale.astype(ml_dtypes.bfloat16).astype(np.float64))[:, None]
    layer = model.proj
    assert layer.weight_dtype == ("e4m3" if fp8 else "f16") and torch.equal(layer.to_dense().double(), w)
    x = torch.randn(5, 32).to(torch.bfloat16)
    y = layer(x)
    check_against_float64(layer, x, y)
    if not fp8:  # (the float64 product of the file's own weight, as an independent reference)
        ref = x.double() @ w.T + torch.from_numpy(tensors["proj.bias"].astype(np.float64))
        assert torch.allclose(y.double(), ref, rtol=2 ** -7, atol=1e-2)


# (vLLM's 2:4 kernel takes no weight-only scheme: it reads the layer dense, not this test's subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.parametrize("holder", ["quantization_config", "compression_config"])
def test_int8_quantized_weights_are_not_read_as_fp8_bits(tmp_path, holder):
    """compressed-tensors stores an int-quantized (W8A8 int8) weight as int8 values with a
    weight_scale, and fp8 weights as F8_E4M3; the loader read every int8 ``compressed`` with a scale
    as fp8 bit patterns: an int8 checkpoint loaded as other numbers without a word."""
    rng = np.random.default_rng(8)
    q = rng.integers(-127, 128, (16, 32)).astype(np.int8)
    q.reshape(16, 8, 4)[:, :, ::2] = 0
    tensors = {**compressed_tensors_layer(q), "proj.bias": np.zeros(16, np.float32),
               "proj.weight_scale": np.full((16, 1), 0.01, np.float32)}
    quant = {"config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int"}}},
             "format": "int-quantized"}
    config = {holder: {**quant, "sparsity_config": {"format": "sparse-24-bitmask"}}}
    _write(tmp_path, tensors, config)
    model = _One(dtype=torch.bfloat16)
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path)
    assert (err.code, err.message) == (
        "SP0913", "layer proj: the compressed values are int8 and config.json declares int weights (type 'int' "
                  "in config_groups): int8-quantized weights have no 2:4 kernel here (read as fp8 bits they "
                  "would be other numbers)")
    assert "bf16, f16 or fp8" in err.help
    assert type(model.proj) is torch.nn.Linear


@pytest.mark.parametrize(("dtype", "weights"), [(None, torch.bfloat16), ("e4m3", torch.bfloat16)])
def test_the_writer_s_layout_is_compressed_tensors(tmp_path, dtype, weights):
    """The file holds each layer as compressed-tensors' ``Sparse24BitMaskTensor.dict`` writes it, so
    that its reader (and vLLM's, whose ``shape`` parameter is (2, 1) int64 and whose fp8 ``compressed``
    is float8_e4m3fn) takes it: ``<name>.compressed`` / ``.bitmask`` / ``.shape`` (the reader nests
    every key ending in ``.compressed`` under the rest: ``proj.weight.compressed`` was a layer
    ``proj.weight``, decompressed to ``proj.weight.weight``), ``.shape`` (2, 1), fp8 values as F8_E4M3
    (int8 bits were taken as int8 numbers: decompressed to other values). Read back here as the
    library does, times the scale: the layer's own weight."""
    model = _Net(weights)
    spt.sparsify_(model, dtype=dtype, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = st.load_file(tmp_path / "model.safetensors")
    for name in ("proj", "head"):
        layer = getattr(model, name)
        assert f"{name}.weight.compressed" not in tensors
        shape = tensors[f"{name}.shape"]
        assert shape.shape == (2, 1) and shape.dtype == np.int64
        rows, cols = (int(s) for s in shape.reshape(-1))
        compressed = tensors[f"{name}.compressed"]
        assert compressed.dtype == (ml_dtypes.float8_e4m3fn if dtype else ml_dtypes.bfloat16)
        mask = np.unpackbits(tensors[f"{name}.bitmask"], axis=-1, count=cols, bitorder="little").astype(bool)
        dense = np.zeros((rows, cols), np.float32)
        dense[mask] = compressed.astype(np.float32).reshape(-1)  # (sparse24_bitmask_decompress)
        if dtype:  # (to_dense's product, in float32)
            dense *= tensors[f"{name}.weight_scale"].astype(np.float32)
        assert np.array_equal(dense, layer.to_dense().numpy())
    fresh = _Net(weights)
    spt.load_sparse24_checkpoint(fresh, tmp_path)
    x = torch.randn(3, 64).to(weights)
    assert torch.equal(fresh(x), model(x))


def _vllm_warnings(model, path) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spt.save_sparse24_checkpoint(model, path)
    return [w for w in caught if issubclass(w.category, spt.VLLMShapeWarning)]


def test_layers_vllm_cannot_load_are_written_with_one_warning(tmp_path):
    """vLLM's CompressedTensors24 sizes the bitmask (out, in // 8): layers whose in_features or
    out_features is no multiple of 8 are written (compressed-tensors and the loader read them) with
    one VLLMShapeWarning per save naming each of them, at the caller's line; layers of multiples of 8
    give none."""
    model = _sparse(linear(16, 36, seed=1), linear(24, 16, seed=2), linear(20, 24, seed=3))
    (caught,) = _vllm_warnings(model, tmp_path)
    assert str(caught.message) == (
        "save_sparse24_checkpoint: vLLM cannot load 2 layers of this checkpoint: 0 (36 in, 16 out), 2 (24 in, 20 out). "
        "Its 2:4 scheme (CompressedTensors24) sizes the bitmask (out_features, in_features // 8) and needs "
        "in_features and out_features to be multiples of 8; the checkpoint is written, and compressed-tensors and "
        "load_sparse24_checkpoint read it as it is. For vLLM, write those layers dense (layer.to_linear() in their "
        "place; q/k/v and gate/up parts all together)")
    assert caught.filename == __file__  # (the user's call of save_sparse24_checkpoint, not the package's)
    fresh = torch.nn.Sequential(linear(16, 36), linear(24, 16), linear(20, 24))
    assert spt.load_sparse24_checkpoint(fresh, tmp_path).sparse == ["0", "1", "2"]
    x = torch.randn(3, 36).to(torch.bfloat16)
    assert torch.equal(fresh(x), model(x))
    assert _vllm_warnings(_round_multiples(), tmp_path / "eights") == []
    many = _sparse(*[linear(12, 12, seed=i) for i in range(10)])
    (caught,) = _vllm_warnings(many, tmp_path / "many")
    assert str(caught.message).startswith("save_sparse24_checkpoint: vLLM cannot load 10 layers of this checkpoint: "
                                          "0 (12 in, 12 out), 1 (12 in, 12 out), ")
    assert "7 (12 in, 12 out), and 2 more. Its 2:4 scheme" in str(caught.message)
    with warnings.catch_warnings():  # as an error: raised before anything is written
        warnings.simplefilter("error", spt.VLLMShapeWarning)
        with pytest.raises(spt.VLLMShapeWarning):
            spt.save_sparse24_checkpoint(model, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def _sparse(*linears, dtype: str = "bf16"):
    """A Sequential of SparseLinear layers made from ``linears`` (any shape the layer takes)."""
    return torch.nn.Sequential(*[spt.SparseLinear.from_dense(m, dtype) for m in linears])


def _round_multiples():
    return _sparse(linear(24, 40, seed=4), linear(8, 24, seed=5), dtype="e4m3")
