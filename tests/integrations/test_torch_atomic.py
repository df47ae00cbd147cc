"""All or nothing: a sparsile call that edits a user's model and raises leaves it as it was (the same
module objects at every name, the same tensor objects holding the same values, the same output bit
for bit), never half changed: sparsify_, fuse_projections_, load_state_dict of sparse layers, their
.to() / .cuda() / .half(), load_sparse24_checkpoint, recompress_, reprune_ and SparseTrainer's re-prune,
SemiSparseLinear.refresh. Each test names what used to be left."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear, tiny_llama

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch import fuse as fuse_module  # noqa: E402
from sparsile.integrations.torch import group_build  # noqa: E402
from sparsile.integrations.torch.projection_group import fused_group_of  # noqa: E402


class Snapshot:
    """What a model is: its module at every name, its tensor objects (parameters, buffers, gradients)
    at every name with copies of their values, the instance forwards, and its output on ``x``."""

    def __init__(self, model, x):
        self.model, self.x = model, x
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.forwards = {name: m.__dict__.get("forward") for name, m in self.modules.items()}
        self.tensors = {}
        for name, m in self.modules.items():
            for kind in ("_parameters", "_buffers"):
                for key, t in getattr(m, kind).items():
                    grad = None if t is None or t.grad is None else (t.grad, t.grad.clone(), _address(t.grad))
                    self.tensors[(name, kind, key)] = (t, None if t is None else t.detach().clone(), grad,
                                                       _address(t))
        self.fused = {name: m.__dict__.get("_fused") for name, m in self.modules.items()}
        self.y = self.output()

    def output(self):
        with torch.no_grad():
            return self.model(self.x)

    def assert_unchanged(self, views=()):
        """``views``: sparse layers whose buffers may be other tensors with the same values (views of
        a fused copy: fuse_projections_ undone)."""
        after = dict(self.model.named_modules(remove_duplicate=False))
        assert after.keys() == self.modules.keys()
        changed = [name for name, m in after.items() if m is not self.modules[name]]
        assert not changed, f"modules replaced: {changed}"
        assert {name: m.__dict__.get("forward") for name, m in after.items()} == self.forwards
        assert {name: m.__dict__.get("_fused") for name, m in after.items()} == self.fused
        now = {(name, kind, key): t for name, m in after.items() for kind in ("_parameters", "_buffers")
               for key, t in getattr(m, kind).items()}
        assert now.keys() == self.tensors.keys()
        for where, (t, values, grad, address) in self.tensors.items():
            if self.modules[where[0]] in views and where[1] == "_buffers" and t is not None:
                assert torch.equal(now[where], values) and now[where].dtype == values.dtype, where
                continue
            assert now[where] is t, f"{where}: another tensor"
            if t is not None:
                assert (t.device, t.dtype, t.shape, _address(t)) == (values.device, values.dtype, values.shape,
                                                                     address), where
                assert torch.equal(t.detach(), values), f"{where}: other values"
                assert (t.grad is None) == (grad is None), where
                if grad is not None:
                    assert t.grad is grad[0] and _address(t.grad) == grad[2] and torch.equal(t.grad, grad[1]), where
        y = self.output()
        assert torch.equal(y, self.y) and y.dtype == self.y.dtype  # (the forward reads the right weights)


def _address(t):
    return None if t is None or t.is_meta else t.data_ptr()


def _x(k=64, tokens=3, seed=5, dtype=torch.bfloat16):
    return (torch.randn(tokens, k, generator=torch.Generator().manual_seed(seed)) + 0.1).to(dtype)


def _tokens(seed=3):
    return torch.randint(0, 61, (1, 5), generator=torch.Generator().manual_seed(seed))


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids).logits


def _failing_on(n, error=None):
    """A wrapper that lets ``fn`` run n - 1 times, then raises (a device out of memory)."""
    calls = [0]

    def wrap(fn):
        def wrapper(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                raise error or torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return fn(*args, **kwargs)
        return wrapper
    return wrap


# ------------------------------------------------------------------------------------------------
# sparsify_


def _three_linears():
    return torch.nn.Sequential(linear(64, 64, seed=1), torch.nn.ReLU(), linear(64, 64, seed=2), torch.nn.ReLU(),
                               linear(64, 64, seed=3))


def test_sparsify_a_layer_failing_to_build_leaves_the_model_as_it_was(monkeypatch):
    """The layers were swapped one at a time as each was built: a build that raised (here the device
    out of memory at the second layer) left the first one sparse."""
    model = _three_linears()
    snap = Snapshot(model, _x())
    from_dense = _failing_on(2)(spt.SparseLinear.from_dense.__func__)
    monkeypatch.setattr(spt.SparseLinear, "from_dense", classmethod(from_dense))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        spt.sparsify_(model, interpret=True, min_features=16)
    snap.assert_unchanged()


def test_sparsify_trainable_skips_a_float8_linear():
    """sparsify_(trainable=True) swapped the bf16 linear, then raised SP0916 at the float8 one (no
    trainable kernel): half the model trainable. A float8 linear is skipped with its reason."""
    model = _three_linears()
    model[2].to(torch.float8_e4m3fn)
    report = spt.sparsify_(model, interpret=True, min_features=16, trainable=True)
    assert report.swapped == ["0", "4"]
    assert report.skipped == {"2": "sparse training computes in bf16 or f16, not e4m3 (the weight is "
                                    "torch.float8_e4m3fn: pass dtype='bf16' or 'f16')"}


def test_sparsify_trainable_e4m3_is_refused_before_any_swap():
    model = _three_linears()
    snap = Snapshot(model, _x())
    with pytest.raises(IntegrationError) as info:
        spt.sparsify_(model, dtype="e4m3", interpret=True, min_features=16, trainable=True)
    assert (info.value.code, info.value.message) == ("SP0916", "sparse training computes in bf16 or f16, not e4m3")
    snap.assert_unchanged()


def test_sparsify_skips_a_linear_whose_bias_has_no_values():
    """A linear whose weight is materialized but whose bias is still on the meta device (a model
    loaded in part) was built into a SparseLinear after the ones before it were swapped, then
    raised torch's NotImplementedError ("Cannot copy out of meta tensor"). It is skipped."""
    model = _three_linears()
    model[2].bias = torch.nn.Parameter(torch.empty(64, device="meta", dtype=torch.bfloat16))
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == ["0", "4"] and report.skipped == {"2": "the bias is on the meta device (no values)"}


@pytest.mark.parametrize("returned", [np.array([True, False]), torch.ones(2)])
def test_sparsify_a_filter_fn_result_that_is_neither_true_nor_false_is_sp0907(returned):
    """A filter_fn returning an array or a tensor of several elements was numpy's ValueError or
    torch's RuntimeError ("ambiguous"), naming neither filter_fn nor the module."""
    model = _three_linears()
    snap = Snapshot(model, _x())
    with pytest.raises(IntegrationError) as info:
        spt.sparsify_(model, lambda m, fqn: returned if fqn == "2" else True, interpret=True, min_features=16)
    assert info.value.code == "SP0907"
    assert info.value.message.startswith(f"filter_fn returned a {type(returned).__name__} for '2', which is neither "
                                         "true nor false: ")
    snap.assert_unchanged()


def test_sparsify_fuse_failing_leaves_the_model_as_it_was(monkeypatch):
    """sparsify_(fuse=True): a fusion that raised (the device out of memory at the second group) left
    every linear swapped and the first group fused."""
    model = _Logits(tiny_llama(2))
    snap = Snapshot(model, _tokens())
    monkeypatch.setattr(group_build, "fused_buffers", _failing_on(2)(group_build.fused_buffers))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        spt.sparsify_(model, interpret=True, min_features=16, fuse=True)
    snap.assert_unchanged()


# ------------------------------------------------------------------------------------------------
# fuse_projections_


def _sparse_llama(layers=2):
    model = _Logits(tiny_llama(layers))
    spt.sparsify_(model, interpret=True, min_features=16)
    return model


def _members(model, layers):
    return [m for layer in layers for m in (*[getattr(model.model.model.layers[layer].self_attn, f"{p}_proj")
                                              for p in "qkv"], model.model.model.layers[layer].mlp.gate_proj,
                                            model.model.model.layers[layer].mlp.up_proj)]


def test_fuse_a_group_failing_to_build_leaves_the_model_as_it_was(monkeypatch):
    """The groups were fused one at a time: a fused copy that could not be made (the device out of
    memory at the third group) left the first two fused, their MLP's forward replaced. The call's
    groups are released, so the model runs unfused as before; the members of the groups fused
    before keep their weights as views of the fused copy (each member's own tensors were freed as
    its group was fused: fusing takes the memory of one group at a time)."""
    model = _sparse_llama()
    snap = Snapshot(model, _tokens())
    monkeypatch.setattr(group_build, "fused_buffers", _failing_on(3)(group_build.fused_buffers))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        spt.fuse_projections_(model)
    snap.assert_unchanged(views=_members(model, [0]))
    monkeypatch.undo()
    report = spt.fuse_projections_(model)  # (and again: all of it)
    assert len(report.fused) == 4 and not report.kept


def test_fuse_a_failure_after_the_views_leaves_the_model_as_it_was(monkeypatch):
    """A failure once the members hold views (here the gated forward's install, at the second MLP)
    undoes every group of the call: members' own buffers back, gated forwards removed; on a model
    fused before, the groups kept stay as they were (their gated forward, not traced)."""
    from sparsile.integrations.torch import glu as glu_module

    model = _sparse_llama()
    monkeypatch.setattr(fuse_module, "install_glu", _failing_on(2)(glu_module.install_glu))
    snap = Snapshot(model, _tokens())
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        spt.fuse_projections_(model)
    snap.assert_unchanged(views=_members(model, [0, 1]))

    monkeypatch.setattr(fuse_module, "install_glu", glu_module.install_glu)
    spt.fuse_projections_(model, glu=True)
    groups = {fused_group_of(m) for m in _members(model, [0, 1])}
    assert len(groups) == 4 and None not in groups
    snap = Snapshot(model, _tokens())
    monkeypatch.setattr(fuse_module, "uninstall_glu", _failing_on(2)(fuse_module.uninstall_glu))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        spt.fuse_projections_(model, traced=True, glu=False)
    snap.assert_unchanged()
    assert not any(g.traced for g in groups)
    assert sorted(g.glu is not None and g.glu.installed() for g in groups) == [False, False, True, True]


def test_fuse_skips_a_member_with_buffers_on_two_devices():
    """A member whose metadata is on another device than its values (here still on the meta device)
    was torch's RuntimeError from the concatenation, after the groups before it were fused. Skipped
    with its reason."""
    model = _sparse_llama()
    k_proj = model.model.model.layers[1].self_attn.k_proj
    k_proj.meta = k_proj.meta.to("meta")
    report = spt.fuse_projections_(model)
    assert report.skipped == {"model.model.layers.1.self_attn.q_proj+k_proj+v_proj":
                              "k_proj has its meta on meta but its values on cpu"}
    assert len(report.fused) == 3


# ------------------------------------------------------------------------------------------------
# load_state_dict


def _layer(seed=1, dtype="bf16"):
    return spt.SparseLinear.from_dense(linear(32, 64, seed=seed), dtype)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("refused", ["values", "meta", "bias", "scale_w"])
def test_a_layer_takes_all_of_its_tensors_or_none(refused, strict):
    """torch copies each tensor of the right shape and reports the others: a values of another shape
    left the layer with the new metadata and its old values (a weight of neither state dict), which
    the next call computed with."""
    dtype = "e4m3" if refused == "scale_w" else "bf16"
    layer = _layer(1, dtype)
    snap = Snapshot(layer, _x())
    state = _layer(2, dtype).state_dict()
    state[refused] = state[refused][:16]
    with pytest.raises(RuntimeError) as info:
        layer.load_state_dict(state, strict=strict)
    shape = tuple(getattr(layer, refused).shape)
    assert str(info.value) == (
        f"Error(s) in loading state_dict for SparseLinear:\n\tsize mismatch for {refused}: copying a param with "
        f"shape torch.Size([16{', ' if len(shape) > 1 else ''}{', '.join(map(str, shape[1:]))}]) from checkpoint, "
        f"the shape in current model is torch.Size({list(shape)}).")
    snap.assert_unchanged()


def test_a_layer_s_strict_load_with_a_missing_key_copies_nothing():
    """layer.load_state_dict(strict=True) of a state dict without meta copied the new values, then
    raised for the missing key: the layer computed with the new values and the old metadata."""
    layer = _layer(1)
    snap = Snapshot(layer, _x())
    state = _layer(2).state_dict()
    del state["meta"]
    state["extra"] = torch.ones(2)
    with pytest.raises(RuntimeError) as info:
        layer.load_state_dict(state)
    assert str(info.value) == ('Error(s) in loading state_dict for SparseLinear:\n\tMissing key(s) in state_dict: '
                               '"meta". \n\tUnexpected key(s) in state_dict: "extra". ')
    snap.assert_unchanged()
    del state["extra"]
    layer.load_state_dict(state, strict=False)  # (a load in parts, as transformers' loader makes: values alone)
    assert torch.equal(layer.values, _layer(2).values)


@pytest.mark.parametrize("strict", [True, False])
def test_in_a_model_a_refused_layer_copies_nothing(strict):
    """In a model's load_state_dict a sparse layer with a tensor of another shape copies none of its
    tensors (its output as before); the modules torch reached before it are loaded, as torch leaves
    a dense model."""
    model = torch.nn.Sequential(_layer(1), torch.nn.ReLU(), spt.SparseLinear.from_dense(linear(64, 32, seed=3)))
    other = torch.nn.Sequential(_layer(2), torch.nn.ReLU(), spt.SparseLinear.from_dense(linear(64, 32, seed=4)))
    x = _x()
    snap = Snapshot(model[2], model[1](model[0](x)))
    state = other.state_dict()
    state["2.values"] = state["2.values"][:8]
    with pytest.raises(RuntimeError, match=r"size mismatch for 2\.values"):
        model.load_state_dict(state, strict=strict)
    snap.assert_unchanged()


def test_a_trainable_layer_refusing_its_mask_copies_nothing():
    """A SemiSparseLinear's mask that keeps more than 2 of 4 was checked after the copy: the weight
    and the bad mask loaded, then SP0918, and every later call raised SP0918 too."""
    layer = spt.SemiSparseLinear.from_dense(linear(32, 64, dtype=torch.float32, seed=1), "bf16")
    snap = Snapshot(layer, _x(dtype=torch.float32))
    state = spt.SemiSparseLinear.from_dense(linear(32, 64, dtype=torch.float32, seed=2), "bf16").state_dict()
    state["mask"] = torch.ones_like(state["mask"])
    for strict in (True, False):
        with pytest.raises(IntegrationError) as info:
            layer.load_state_dict(state, strict=strict)
        assert (info.value.code, info.value.message) == (
            "SP0918", "the mask keeps 4 elements of row 0, group 0 (0..3); a trainable layer keeps at most 2 of every "
                      "4 along rows and columns")
        snap.assert_unchanged()


def test_a_trainable_layer_s_strict_load_with_a_missing_key_copies_nothing():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 64, dtype=torch.float32, seed=1), "bf16")
    snap = Snapshot(layer, _x(dtype=torch.float32))
    state = spt.SemiSparseLinear.from_dense(linear(32, 64, dtype=torch.float32, seed=2), "bf16").state_dict()
    del state["mask"]
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "mask"'):
        layer.load_state_dict(state)
    snap.assert_unchanged()


# ------------------------------------------------------------------------------------------------
# .to(), .cuda(), .half()


def _apply_failing_at(module, n):
    """module._apply as .cuda() makes it, with the device out of memory at the n-th tensor."""
    return module._apply(_failing_on(n)(lambda t: t.to("meta")))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_conversion_failing_midway_leaves_the_layer_as_it_was(n):
    """_apply converts the tensors one at a time (.cuda() out of memory at the third left values and
    meta on the GPU, bias and scale_w on the CPU). A trainable bias, with its gradient, included."""
    layer = _layer(1, "e4m3")
    layer.bias = torch.nn.Parameter(layer.bias.detach().clone())
    layer.bias.grad = torch.ones_like(layer.bias)
    snap = Snapshot(layer, _x())
    with pytest.raises(torch.OutOfMemoryError):
        _apply_failing_at(layer, n)
    snap.assert_unchanged()


def test_a_fused_member_s_failed_conversion_keeps_the_group():
    model = _sparse_llama(1)
    spt.fuse_projections_(model)
    k_proj = model.model.model.layers[0].self_attn.k_proj
    group = fused_group_of(k_proj)
    snap = Snapshot(model, _tokens())
    with pytest.raises(torch.OutOfMemoryError):
        _apply_failing_at(k_proj, 2)
    snap.assert_unchanged()
    runs = group.runs
    snap.output()
    assert fused_group_of(k_proj) is group and group.runs == runs + 1


@pytest.mark.parametrize("n", [2, 4])
def test_a_trainable_layer_s_conversion_failing_midway_leaves_it_as_it_was(n):
    layer = spt.SemiSparseLinear.from_dense(linear(32, 64, dtype=torch.float32, seed=1), "bf16")
    snap = Snapshot(layer, _x(dtype=torch.float32))
    with pytest.raises(torch.OutOfMemoryError):
        _apply_failing_at(layer, n)
    snap.assert_unchanged()


# ------------------------------------------------------------------------------------------------
# load_sparse24_checkpoint


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = linear(32, 64, seed=1)
        self.norm = torch.nn.LayerNorm(32).to(torch.bfloat16)
        self.head = linear(16, 32, bias=False, seed=2)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))


def _saved(tmp_path, **extra):
    model = _Net()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)
        model.norm.bias.uniform_(-1, 1)
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    tensors = st.load_file(tmp_path / "model.safetensors")
    tensors.update(extra)
    st.save_file({k: v for k, v in tensors.items() if v is not None}, tmp_path / "model.safetensors")


@pytest.mark.parametrize(("extra", "strict", "message"), [
    ({"norm.weight": np.ones(8, ml_dtypes.bfloat16)}, True,
     "the checkpoint and the model differ: size mismatch for norm.weight: copying a param with shape torch.Size([8]) "
     "from checkpoint, the shape in current model is torch.Size([32])."),
    ({"norm.weight": np.ones(8, ml_dtypes.bfloat16)}, False,
     "the checkpoint and the model differ: size mismatch for norm.weight: copying a param with shape torch.Size([8]) "
     "from checkpoint, the shape in current model is torch.Size([32])."),
    ({"extra.weight": np.ones(2, np.float32)}, True,
     "the checkpoint and the model differ: missing [], unexpected ['extra.weight']"),
    ({"norm.bias": None}, True, "the checkpoint and the model differ: missing ['norm.bias'], unexpected []"),
    ({"proj.bias": None}, True, "the checkpoint and the model differ: missing ['proj.bias'], unexpected []"),
])
def test_a_checkpoint_the_plain_tensors_refuse_leaves_the_model_as_it_was(tmp_path, extra, strict, message):
    """The sparse layers were swapped in, then the other tensors loaded (norm.bias copied), then a size
    mismatch or a strict key mismatch raised SP0914: the model kept the checkpoint's sparse layers and
    some of its tensors. Both are checked before anything is replaced."""
    _saved(tmp_path, **extra)
    model = _Net()
    snap = Snapshot(model, _x())
    with pytest.raises(IntegrationError) as info:
        spt.load_sparse24_checkpoint(model, tmp_path, strict=strict)
    assert (info.value.code, info.value.message) == ("SP0914", message)
    snap.assert_unchanged()


def test_a_checkpoint_whose_load_raises_inside_torch_puts_the_modules_back(tmp_path):
    """A failure inside the plain tensors' load itself (a module's own _load_from_state_dict) left the
    sparse layers swapped in: the model's own modules are put back."""

    class Refusing(torch.nn.LayerNorm):
        def _load_from_state_dict(self, *args, **kwargs):
            raise ValueError("refused")

    _saved(tmp_path)
    model = _Net()
    model.norm = Refusing(32).to(torch.bfloat16)
    modules = dict(model.named_modules())
    with pytest.raises(ValueError, match="refused"):
        spt.load_sparse24_checkpoint(model, tmp_path)
    assert dict(model.named_modules()) == modules and type(model.proj) is torch.nn.Linear


def test_a_checkpoint_into_a_meta_model_that_fails_inside_torch_is_undone(tmp_path):
    """On the meta device the load assigns the checkpoint's tensors (none copied in place): a failure
    after some were assigned puts the model's own meta tensors back too."""

    class Refusing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def _load_from_state_dict(self, *args, **kwargs):
            raise ValueError("refused")

    _saved(tmp_path)
    with torch.device("meta"):
        model = torch.nn.Module()
        model.proj = torch.nn.Linear(64, 32)
        model.norm = torch.nn.LayerNorm(32)
        model.head = torch.nn.Linear(32, 16, bias=False)
        model.z_last = Refusing()
    before = {k: t for k, t in model.state_dict(keep_vars=True).items()}
    modules = dict(model.named_modules())
    with pytest.raises(ValueError, match="refused"):
        spt.load_sparse24_checkpoint(model, tmp_path, strict=False)
    assert dict(model.named_modules()) == modules
    assert all(t is before[k] for k, t in model.state_dict(keep_vars=True).items())


# ------------------------------------------------------------------------------------------------
# training helpers


def test_recompress_checks_every_mask_before_it_recompresses_any():
    """recompress_ refreshed the layers one at a time: a bad mask (SP0918) in the second left the first
    recompressed from its new master weight, the second not."""
    model = torch.nn.Sequential(spt.SemiSparseLinear.from_dense(linear(64, 64, dtype=torch.float32, seed=1), "bf16"),
                                spt.SemiSparseLinear.from_dense(linear(64, 64, dtype=torch.float32, seed=2), "bf16"))
    values = [layer.values.clone() for layer in model]
    with torch.no_grad():
        for layer in model:
            layer.weight.mul_(2)
        model[1].mask.fill_(True)
    with pytest.raises(IntegrationError) as info:
        spt.recompress_(model)
    assert info.value.code == "SP0918"
    assert all(torch.equal(layer.values, v) for layer, v in zip(model, values, strict=True))


def _trainable(layers=3):
    """``layers`` trainable layers whose master weights were changed since their masks were made (so that a
    re-prune changes every mask), recompressed (their compressions up to date)."""
    model = torch.nn.Sequential(*[spt.SemiSparseLinear.from_dense(linear(64, 64, dtype=torch.float32, seed=s), "bf16")
                                  for s in range(1, layers + 1)])
    with torch.no_grad():
        for i, layer in enumerate(model):
            layer.weight.copy_(torch.randn(64, 64, generator=torch.Generator().manual_seed(40 + i)))
    spt.recompress_(model)
    return model


_TRAINED = ("mask", "values", "meta", "values_t", "meta_t")


def _compressions(model):
    """Each trainable layer's mask and compressions: (tensor object, address, a copy of its values)."""
    return [(layer, name, getattr(layer, name), getattr(layer, name).data_ptr(), getattr(layer, name).clone())
            for layer in model.modules() if isinstance(layer, spt.SemiSparseLinear) for name in _TRAINED]


def _assert_same_compressions(saved):
    for layer, name, t, address, values in saved:
        assert getattr(layer, name) is t and t.data_ptr() == address, f"{name}: another tensor"
        assert torch.equal(t, values), f"{name}: other values"


def test_copy_all_checks_every_pair_before_it_copies_any():
    from sparsile.integrations.torch.atomic import copy_all

    a, b = torch.zeros(4), torch.zeros(2, 2)
    with pytest.raises(ValueError, match=r"copy_all: a \(4,\) tensor for a \(2, 2\) one \(nothing copied\)"):
        copy_all([(a, torch.ones(4)), (b, torch.ones(4))])
    assert not a.any() and not b.any()
    copy_all([(a, torch.ones(4)), (b, torch.ones(2, 2))])
    assert a.all() and b.all()


@pytest.mark.parametrize(("where", "n"), [("transposable_mask", 3), ("_compressed", 5), ("_compressed", 6)])
def test_reprune_failing_at_a_layer_leaves_every_layer_as_it_was(monkeypatch, where, n):
    """reprune_ re-pruned the layers one at a time, each copying its new mask in, then its compressions of
    W, then of Wᵀ: the device out of memory at the third layer's mask (or its compression of W, or of
    Wᵀ) left the first two re-pruned, the third with its new mask (and new values of W with the old of
    Wᵀ), the others as they were. Every mask and compression is computed before any is copied in."""
    model = _trainable()
    snap = Snapshot(model, _x(dtype=torch.float32))
    from sparsile.integrations.torch import training

    monkeypatch.setattr(training, where, _failing_on(n)(getattr(training, where)))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        spt.reprune_(model)
    snap.assert_unchanged()
    monkeypatch.undo()
    assert spt.reprune_(model) > 0.1  # (the masks do change: the weights are not those they were made from)


def test_the_trainer_s_reprune_failing_at_a_layer_leaves_every_layer_as_it_was(monkeypatch):
    """SparseTrainer's re-prune (its own loop of layer.reprune) had the same half-done failure."""
    model = _trainable()
    trainer = spt.SparseTrainer(model, torch.optim.SGD(model.parameters(), lr=0.0), reprune_every=1)
    saved = _compressions(model)
    from sparsile.integrations.torch import training

    monkeypatch.setattr(training, "_compressed", _failing_on(5)(training._compressed))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        trainer.optimizer.step()
    _assert_same_compressions(saved)
    assert trainer.changed == []
    monkeypatch.undo()
    trainer.optimizer.step()
    assert trainer.changed and trainer.changed[0] > 0.1


@pytest.mark.parametrize("n", [1, 2])
def test_refresh_failing_at_the_transpose_leaves_both_compressions_as_they_were(monkeypatch, n):
    """refresh copied W's new compression in, then compressed Wᵀ: the device out of memory there left
    values and meta new, values_t and meta_t old (forward and dX of two weights). Both are computed
    before either is copied; the layer stays stale, so its next call compresses it again."""
    model = _trainable(1)
    layer = model[0]
    with torch.no_grad():
        layer.weight.mul_(-3)
    saved = _compressions(model)
    from sparsile.integrations.torch import training

    compressed = training._compressed
    monkeypatch.setattr(training, "_compressed", _failing_on(n)(compressed))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        layer.refresh()
    _assert_same_compressions(saved)
    monkeypatch.setattr(training, "_compressed", _failing_on(n)(compressed))  # (and a re-prune: its mask too)
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        layer.reprune()
    _assert_same_compressions(saved)
    monkeypatch.undo()
    with torch.no_grad():
        layer(_x(dtype=torch.float32))  # (compressed again by itself: the failed refresh did not mark it fresh)
    now = [layer.values.clone(), layer.values_t.clone()]
    assert not torch.equal(now[0], saved[1][4])
    layer.refresh()
    assert torch.equal(layer.values, now[0]) and torch.equal(layer.values_t, now[1])


# ------------------------------------------------------------------------------------------------
# save_sparse24_checkpoint


@pytest.mark.parametrize("old", ["model.safetensors.index.json", "model-00001-of-00002.safetensors"])
def test_saving_over_another_checkpoint_s_shards_is_refused(tmp_path, old):
    """Saved into the folder of a sharded checkpoint, the new model.safetensors sat next to the old
    index, and load_sparse24_checkpoint read the old shards: the old weights, without a word (or,
    without the index, a tensor in two files, SP0912, at load). Refused before anything is written."""
    model = torch.nn.Sequential(linear(64, 64, seed=1))
    spt.sparsify_(model, interpret=True, min_features=16)
    (tmp_path / old).write_text("{}")
    with pytest.raises(IntegrationError) as info:
        spt.save_sparse24_checkpoint(model, tmp_path)
    assert (info.value.code, info.value.message) == (
        "SP0912", f"{tmp_path} already holds {old}, which load_sparse24_checkpoint would read instead of or with "
                  "the new model.safetensors")
    assert sorted(f.name for f in tmp_path.iterdir()) == [old]
    (tmp_path / old).unlink()
    spt.save_sparse24_checkpoint(model, tmp_path)
    spt.save_sparse24_checkpoint(model, tmp_path)  # (its own model.safetensors is overwritten)


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (3, 5), (16, 24), (2, 3, 11)])
def test_a_re_prune_s_packed_masks_unpack_to_the_same_bits(shape):
    """The old masks a re-prune keeps for its rollback (bit-packed) come back bit for bit, also
    where the element count is no multiple of 8."""
    from sparsile.integrations.torch.training import _packed_bits, _unpacked_bits

    mask = torch.rand(shape, generator=torch.Generator().manual_seed(len(shape))) < 0.5
    packed = _packed_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-mask.numel() // 8)
    assert torch.equal(_unpacked_bits(packed, mask.shape), mask)


def test_reprune_interrupted_inside_a_layer_s_copy_leaves_every_layer_as_it_was(monkeypatch):
    """A failure inside the copy of a layer's new mask and compressions (a KeyboardInterrupt between two
    copies) left that layer with its new mask, outside the rollback (only the layers copied whole were
    given their old masks back): its next call compressed it under the new mask, re-pruned alone."""
    model = _trainable()
    snap = Snapshot(model, _x(dtype=torch.float32))
    from sparsile.integrations.torch import training

    copy_all, calls = training.copy_all, [0]

    def interrupted(writes):
        calls[0] += 1
        writes = list(writes)
        if calls[0] == 2:
            copy_all(writes[:1])  # the mask copied in, then the interrupt
            raise KeyboardInterrupt
        copy_all(writes)

    monkeypatch.setattr(training, "copy_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        spt.reprune_(model)
    monkeypatch.undo()
    snap.assert_unchanged()


def test_reprune_rolled_back_keeps_an_unchecked_mask_unchecked(monkeypatch):
    """The rollback gave a layer its old mask back marked as checked (as a re-prune's own mask is): a
    mask edited in place to keep 3 of 4, then a re-prune failing at a later layer, and the bad mask was
    compressed and used without SP0918."""
    model = _trainable(2)
    layer = model[0]
    with torch.no_grad():
        row = layer.mask[0]
        row[:4] = True  # keeps 4 of 4: SP0918 at the next refresh
    from sparsile.integrations.torch import training

    monkeypatch.setattr(training, "transposable_mask", _failing_on(2)(training.transposable_mask))
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        spt.reprune_(model)
    monkeypatch.undo()
    assert layer.mask[0, :4].all()
    with pytest.raises(IntegrationError, match="SP0918"):
        layer(_x(dtype=torch.float32))


def test_a_rollback_that_fails_itself_leaves_no_layer_with_its_new_mask(monkeypatch):
    """The device out of memory at the third layer's re-prune and again at the rollback's compression
    of the second: the rollback put back one mask and compression at a time, so the first layer kept
    its new mask. Every old mask goes back first; a layer whose compression then fails is left stale
    (its next eager call compresses it), and the original error goes up."""
    from sparsile.integrations.torch import training

    model = _trainable()
    masks = [layer.mask.clone() for layer in training.trainable_layers(model)]

    calls = [0]
    real = training._compressed

    def compressed(*args, **kwargs):  # layers 1, 2: 2 calls each; layer 3's first: the error;
        calls[0] += 1                 # the rollback's first (layer 2's W): the error again
        if calls[0] in (5, 6):
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated, call {calls[0]})")
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "_compressed", compressed)
    with pytest.raises(torch.OutOfMemoryError, match="call 5"):
        spt.reprune_(model)
    monkeypatch.undo()
    for layer, mask in zip(training.trainable_layers(model), masks, strict=True):
        assert torch.equal(layer.mask, mask)
    x = _x(dtype=torch.float32)
    y = model(x)  # the stale layer compresses itself again: the same output as a fresh model's
    for layer in training.trainable_layers(model):
        layer.refresh()
    assert torch.equal(model(x), y)
