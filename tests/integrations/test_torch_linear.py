"""SparseLinear on the CPU (the kernel in sparsile's interpreter): numerics of every weight type and
epilogue against float64, N-D inputs, T = 1 and T = 0, state_dict round trips, .to(), and the
SP0901-SP0905 diagnostics."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.stdlib.sparsity import compress
from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


@pytest.mark.parametrize(("dtype", "x_dtype"), [("bf16", torch.bfloat16), ("f16", torch.float16),
                                                ("e4m3", torch.bfloat16), ("e4m3", torch.float32),
                                                ("bf16", torch.float32)])
@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu_tanh"])
def test_every_weight_type_and_epilogue_against_float64(dtype, x_dtype, activation):
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=3), dtype, activation=activation)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4)).to(x_dtype)
    check_against_float64(layer, x, layer(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_on_small_integers(dtype):
    """±1 weights in a 2:4 pattern, integer x and bias: every sum is an integer below 256, exact in
    bf16 and f16, so y must equal the float64 product exactly (vLLM's identity-style check)."""
    gen = torch.Generator().manual_seed(5)
    signs = torch.randint(0, 2, (24, 16, 4), generator=gen) * 2 - 1
    keep = torch.zeros(24, 16, 4).scatter_(2, torch.rand(24, 16, 4, generator=gen).topk(2, dim=2).indices, 1.0)
    dense = torch.nn.Linear(64, 24).to(dtype)
    with torch.no_grad():
        dense.weight.copy_((signs * keep).reshape(24, 64))
        dense.bias.copy_(torch.randint(-8, 8, (24,), generator=gen))
    layer = spt.SparseLinear.from_dense(dense, activation="relu")
    assert torch.equal(layer.to_dense(), dense.weight.float())
    x = torch.randint(-4, 5, (7, 64), generator=gen).to(dtype)
    exact = torch.relu(x.double() @ dense.weight.double().T + dense.bias.double())
    assert torch.equal(layer(x).double(), exact)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_out_dtype_overrides_x_dtype(out_dtype):
    layer = spt.SparseLinear.from_dense(linear(32, 64), out_dtype=out_dtype)
    x = torch.randn(3, 64).to(torch.bfloat16)
    check_against_float64(layer, x, layer(x), out_dtype)


@pytest.mark.parametrize("lead", [(), (3,), (3, 1), (1,), (2, 3)])
def test_nd_inputs_and_one_token(lead):
    layer = spt.SparseLinear.from_dense(linear(32, 64, bias=False))
    x = torch.randn(*lead, 64).to(torch.bfloat16)
    y = layer(x)
    assert y.shape == (*lead, 32)
    check_against_float64(layer, x, y)


def test_zero_tokens_give_an_empty_output():
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    y = layer(torch.empty(0, 4, 64, dtype=torch.bfloat16))
    assert y.shape == (0, 4, 32) and y.dtype == torch.bfloat16


def test_non_contiguous_x():
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    x = torch.randn(64, 6).to(torch.bfloat16).T  # (6, 64), strided
    check_against_float64(layer, x, layer(x))


def test_from_dense_prunes_by_magnitude():
    dense = linear(16, 32, bias=False)
    layer = spt.SparseLinear.from_dense(dense)
    w, kept = dense.weight.float(), layer.to_dense()
    groups = kept.reshape(16, 8, 4)
    assert ((groups != 0).sum(-1) <= 2).all()
    top2 = w.abs().reshape(16, 8, 4).topk(2, dim=-1).indices
    assert torch.equal(torch.gather(groups, 2, top2), torch.gather(w.reshape(16, 8, 4), 2, top2))


def test_e4m3_weights_have_per_channel_scales():
    dense = linear(16, 32, dtype=torch.float32)
    layer = spt.SparseLinear.from_dense(dense, "e4m3")
    assert layer.values.dtype == torch.float8_e4m3fn and layer.scale_w.shape == (16,)
    pruned = spt.SparseLinear.from_dense(dense.to(torch.bfloat16), "bf16").to_dense()
    # each channel's largest |w| maps to 448 exactly; the rest within e4m3's half ulp
    assert torch.allclose(layer.values.float().abs().amax(1), torch.full((16,), 448.0))
    assert ((layer.to_dense() - dense.weight.float() * (pruned != 0)).abs()
            <= 2.0 ** -4 * dense.weight.float().abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", ["bf16", "f16", "e4m3"])
def test_the_layer_owns_its_bias_and_scales(dtype):
    """A float32 linear's bias was the layer's bias buffer itself (``.float()`` of a float32 tensor
    is that tensor; ``torch.as_tensor`` copies nothing): training or re-initializing the dense
    linear after ``from_dense`` (a sparse snapshot for evaluation) changed the sparse layer's outputs
    without a word. ``from_compressed`` kept the caller's bias and scale_w arrays too."""
    dense = linear(32, 64, dtype=torch.float32)
    layer = spt.SparseLinear.from_dense(dense, dtype)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7))
    y = layer(x)
    check_against_float64(layer, x, y)
    with torch.no_grad():
        dense.bias.add_(100.0)  # the dense model trains on
    assert torch.equal(layer(x), y)
    values, indices = compress(dense.weight.detach().numpy(), "e4m3" if dtype == "e4m3" else dtype, prune=True)
    bias, scale = torch.rand(32) + 0.5, np.full(32, 0.01, np.float32)
    built = spt.SparseLinear.from_compressed(values, indices, 64, bias=bias, scale_w=scale if dtype == "e4m3" else None)
    y = built(x)
    check_against_float64(built, x, y)
    bias.add_(100.0)
    scale *= 4
    assert torch.equal(built(x), y)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_scale_w_for_16_bit_values_is_sp0902(dtype):
    """``from_compressed`` takes ``scale_w`` for e4m3 values only: given with 16-bit values it was
    dropped without a word (the layer's outputs lacked the per-channel factor, W != values * scale_w)."""
    rng = np.random.default_rng(3)
    values, indices = compress(rng.standard_normal((16, 32)).astype(np.float32), dtype, prune=True)
    scale = rng.uniform(0.5, 2.0, 16).astype(np.float32)
    err = _error(spt.SparseLinear.from_compressed, values, indices, 32, scale_w=scale)
    assert (err.code, err.message) == ("SP0902", f"scale_w is given for {dtype} values, but only e4m3 weights take a "
                                                 "per-output-channel scale (the layer would drop it)")
    assert err.help == ("multiply the scales into the weight before compressing it (W * scale_w[:, None]), or "
                        "compress it as e4m3")


def test_state_dict_round_trip_and_to():
    layer = spt.SparseLinear.from_dense(linear(32, 64), "e4m3", activation="silu")
    state = layer.state_dict()
    assert sorted(state) == ["bias", "meta", "scale_w", "values"] and state["meta"].dtype == torch.int32
    fresh = spt.SparseLinear(64, 32, dtype="e4m3", activation="silu")
    x = torch.randn(2, 64).to(torch.bfloat16)
    assert torch.equal(fresh(x), torch.nn.functional.silu(fresh.bias).to(torch.bfloat16).expand(2, 32))
    fresh.load_state_dict(state)
    assert torch.equal(fresh(x), layer(x))
    fresh.half()  # a dtype conversion keeps the compressed weight, its scales and the bias
    assert fresh.values.dtype == torch.float8_e4m3fn and fresh.bias.dtype == torch.float32
    assert torch.equal(fresh(x), layer(x))
    moved = fresh.to("cpu")
    assert moved is fresh and torch.equal(moved.to_dense(), layer.to_dense())
    twin = copy.deepcopy(fresh)
    assert torch.equal(twin(x), layer(x)) and twin.meta.data_ptr() != fresh.meta.data_ptr()


def test_bad_metadata_in_a_state_dict_is_refused():
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    state = layer.state_dict()
    state["meta"] = torch.zeros_like(state["meta"])  # nibble 0x0 is undefined
    with pytest.raises(ValueError) as info:
        spt.SparseLinear(64, 32).load_state_dict(state)
    assert info.value.code == "SP0807"


def test_extra_repr_and_module_repr():
    layer = spt.SparseLinear.from_dense(linear(32, 64), out_dtype=torch.float32)
    assert repr(layer) == ("SparseLinear(in_features=64, out_features=32, bias=True, dtype=bf16, sparsity=2:4, "
                           "activation=None, out_dtype=torch.float32)")


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


def test_input_errors_are_sp0901():
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    cases = [
        ((np.ones((2, 64)),), "SparseLinear takes a torch.Tensor, got ndarray"),
        ((torch.ones(2, 63),), "x has shape (2, 63); this layer takes (..., 64)"),
        ((torch.ones(2, 64, dtype=torch.float64),), "x has dtype torch.float64; SparseLinear takes bfloat16, "
                                                    "float16 or float32 x"),
        ((torch.ones(2, 64, device="meta"),), "x is on meta but the layer's weight is on cpu"),
    ]
    for args, message in cases:
        err = _error(layer, *args)
        assert (err.code, err.message) == ("SP0901", message)


def test_build_errors_are_sp0902_to_sp0905():
    conv = torch.nn.Conv1d(4, 4, 1)
    err = _error(spt.SparseLinear.from_dense, conv)
    assert (err.code, err.message) == ("SP0902", "from_dense takes an nn.Linear, got Conv1d")
    err = _error(spt.SparseLinear.from_dense, torch.nn.Linear(8, 8, device="meta"))
    assert (err.code, err.message) == ("SP0902", "the linear's weight is on the meta device (no values)")
    values, indices = compress(np.tile(np.array([1, 0, 1, 0], np.float16), (8, 4)), "f16")
    err = _error(spt.SparseLinear.from_compressed, values, indices, 20)
    assert (err.code, err.message) == ("SP0902", "values (8, 8) and indices (8, 4, 2) do not describe a 2:4 weight of "
                                                 "20 input features")
    err = _error(spt.SparseLinear.from_compressed, values, indices, 16, bias=np.ones(3))
    assert (err.code, err.message) == ("SP0902", "bias has 3 elements for 8 output features")
    err = _error(spt.SparseLinear, 0, 8)
    assert (err.code, err.message) == ("SP0902", "a SparseLinear needs positive in/out features, got 0 x 8")
    err = _error(spt.SparseLinear.from_dense, torch.nn.Linear(8, 8))
    assert (err.code, err.message) == ("SP0903", "the linear's weight dtype torch.float32 has no 2:4 sparse linear "
                                                 "kernel")
    err = _error(spt.SparseLinear.from_dense, torch.nn.Linear(8, 8), "s8")
    assert (err.code, err.message) == ("SP0903", "dtype s8 has no 2:4 sparse linear kernel")
    err = _error(spt.SparseLinear, 8, 8, activation="tanh")
    assert (err.code, err.message) == ("SP0904", "unknown activation 'tanh'")
    err = _error(spt.SparseLinear, 8, 8, out_dtype=torch.int8)
    assert (err.code, err.message) == ("SP0905", "out_dtype torch.int8 is not one the kernel stores")
    err = _error(spt.SparseLinear, 8, 8, out_dtype=[torch.float32])  # was a TypeError (unhashable) from the lookup
    assert (err.code, err.message) == ("SP0905", "out_dtype [torch.float32] is not one the kernel stores")



@pytest.mark.parametrize(("attribute", "value"), [("activation", "relu"), ("out_dtype", torch.float32)])
def test_setting_the_activation_or_out_dtype_after_a_call_takes_effect(attribute, value):
    """The layer binds its weight, activation and output type into what its calls reuse (the bound
    weight; on CUDA the launch records and the last call): setting either attribute empties them,
    so the next call computes with the new value (a stale activation was a silent wrong result)."""
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=6))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    layer(x)
    setattr(layer, attribute, value)
    y = layer(x)
    check_against_float64(layer, x, y, layer.out_dtype)
    assert y.dtype == (torch.float32 if attribute == "out_dtype" else torch.bfloat16)
    if attribute == "activation":
        assert (y >= 0).all() and (layer.to_dense().double() @ x.double().T).min() < 0


@pytest.mark.parametrize(("attribute", "value", "code", "message"), [
    ("activation", "tanh", "SP0904", "unknown activation 'tanh'"),
    ("out_dtype", torch.int8, "SP0905", "out_dtype torch.int8 is not one the kernel stores"),
    ("out_dtype", "bf16", "SP0905", "out_dtype bf16 is not one the kernel stores"),
    ("out_dtype", [torch.float32], "SP0905", "out_dtype [torch.float32] is not one the kernel stores"),
    ("out_dtype", {}, "SP0905", "out_dtype {} is not one the kernel stores"),
])
def test_setting_a_bad_activation_or_out_dtype_is_refused_at_once(attribute, value, code, message):
    """Assigned after construction, a bad activation or output type is refused as the constructor
    refuses it, and the layer keeps its own (an int8 out_dtype was a KeyError inside the next call)."""
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    x = torch.randn(3, 64).to(torch.bfloat16)
    before = layer(x)
    err = _error(setattr, layer, attribute, value)
    assert (err.code, err.message) == (code, message)
    assert getattr(layer, attribute) is None and torch.equal(layer(x), before)


def test_e4m3_from_dense_with_non_finite_weights_computes():
    """A NaN or inf weight in an e4m3 layer: pruning multiplied the dropped weights by 0 (NaN * 0 is
    NaN), so from_dense failed with SP0803 "not 2:4 sparse". Now the layer builds, the rows holding
    them give non-finite outputs (as a dense layer would) and every other row is unchanged."""
    dense = linear(16, 64, dtype=torch.float32, seed=9)
    finite = spt.SparseLinear.from_dense(dense, "e4m3")
    with torch.no_grad():
        dense.weight[3, 5] = float("nan")
        dense.weight[7, 9] = float("inf")
    layer = spt.SparseLinear.from_dense(dense, "e4m3")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    y, ref = layer(x), finite(x)
    assert not y[:, 3].isfinite().any() and not y[:, 7].isfinite().any()
    others = [i for i in range(16) if i not in (3, 7)]
    assert torch.equal(y[:, others], ref[:, others])


def test_features_are_integers_not_bools():
    """SparseLinear(True, 8) was taken as one input feature and failed inside the metadata code
    (SP0804, "k must be a non-negative integer"); numpy integers were refused as not positive."""
    err = _error(spt.SparseLinear, True, 8)
    assert (err.code, err.message) == ("SP0902", "a SparseLinear needs positive in/out features, got True x 8")
    layer = spt.SparseLinear(np.int64(64), np.int32(32))
    assert (layer.in_features, layer.out_features) == (64, 32) and type(layer.in_features) is int
    assert layer(torch.ones(2, 64, dtype=torch.bfloat16)).shape == (2, 32)


def test_refused_metadata_is_not_loaded():
    """Words that fail validation (SP0807) were copied into the buffer before the check raised,
    leaving the layer with them (a CUDA call trusts its words); they are checked before the copy."""
    layer = spt.SparseLinear.from_dense(linear(32, 64))
    before = layer.meta.clone()
    state = layer.state_dict()
    state["meta"] = torch.full_like(state["meta"], -1)  # nibble 0xF is undefined
    with pytest.raises(ValueError) as info:
        layer.load_state_dict(state)
    assert info.value.code == "SP0807" and torch.equal(layer.meta, before)
    state["meta"] = before.long()  # words of another integer type load as int32
    layer.load_state_dict(state)
    assert layer.meta.dtype == torch.int32 and torch.equal(layer.meta, before)


@pytest.mark.parametrize(("dtype", "k"), [("bf16", 62), ("bf16", 61), ("f16", 63), ("e4m3", 62), ("e4m3", 61)])
def test_a_state_dict_of_more_input_features_is_refused(dtype, k):
    """A layer of K not a multiple of the group stores its weight padded to the next group, so a
    state dict of a layer with up to a group more input features has buffers of the same shapes: it
    loaded without a word and the weight's columns beyond K were dropped (x is padded with zeros),
    where nn.Linear refuses a size mismatch. Nonzero weights beyond K are refused before the copy;
    a state dict of a layer of that K (padding zero) still loads."""
    wide = spt.SparseLinear.from_dense(linear(32, 64, seed=3), dtype)
    layer = spt.SparseLinear(k, 32, dtype=dtype)
    assert layer.values.shape == wide.values.shape and layer.meta.shape == wide.meta.shape
    before = {name: t.clone() for name, t in layer.state_dict().items()}
    beyond = (wide.to_dense()[:, k:] != 0).nonzero()[0].tolist()
    with pytest.raises(ValueError) as info:
        layer.load_state_dict(wide.state_dict())
    assert (info.value.code, info.value.message) == (
        "SP0814", f"the state dict's weight has a nonzero value in row {beyond[0]}, column {k + beyond[1]} (and "
                  f"{int((wide.to_dense()[:, k:] != 0).sum()) - 1} more), beyond this layer's {k} input features")
    assert all(torch.equal(t, before[name]) for name, t in layer.state_dict().items())
    narrow = spt.SparseLinear.from_dense(linear(32, k, seed=4), dtype)
    layer.load_state_dict(narrow.state_dict())
    x = torch.randn(3, k).to(torch.bfloat16)
    y = layer(x)
    check_against_float64(layer, x, y)
    assert torch.equal(y, narrow(x))


@pytest.mark.parametrize(("dtype", "values_dtype"), [("bf16", torch.float32), ("f16", torch.bfloat16),
                                                    ("bf16", torch.float64)])
def test_assigned_values_of_another_float_type_keep_the_layer_s_type(dtype, values_dtype):
    """``load_state_dict(assign=True)`` of values in another float type (which a copy casts) assigned
    them as they were: float32 values left a bf16 layer without a kernel (SP0804 for "tf32" operands
    at the next call, a KeyError from ``to_dense``), bf16 values made an f16 layer compute in bf16.
    They are converted to the layer's type as the copy does, so both loads give the same layer; the
    bias and scales keep float32 too."""
    saved = spt.SparseLinear.from_dense(linear(32, 64, seed=5), dtype)
    state = {name: t.to(values_dtype) if name in ("values", "bias") else t for name, t in saved.state_dict().items()}
    copied, assigned = spt.SparseLinear(64, 32, dtype=dtype), spt.SparseLinear(64, 32, dtype=dtype)
    copied.load_state_dict(state)
    assigned.load_state_dict(state, assign=True)
    for name in ("values", "bias"):
        assert getattr(assigned, name).dtype == getattr(copied, name).dtype == getattr(saved, name).dtype
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6))
    y = assigned(x)
    check_against_float64(assigned, x, y)
    assert torch.equal(y, copied(x))
    assert torch.equal(assigned.to_dense(), copied.to_dense())


def test_assigned_metadata_of_another_integer_type_keeps_int32():
    """``load_state_dict(assign=True)`` of int64 metadata words (checked as int32, as a copy casts
    them) assigned them as they were: the next call was SP0806 ("must be uint32 words, found
    int64"). They take the buffer's int32, as the copy gives them."""
    saved = spt.SparseLinear.from_dense(linear(32, 64, seed=7), "bf16")
    state = {name: t.long() if name == "meta" else t for name, t in saved.state_dict().items()}
    copied, assigned = spt.SparseLinear(64, 32), spt.SparseLinear(64, 32)
    copied.load_state_dict(state)
    assigned.load_state_dict(state, assign=True)
    assert assigned.meta.dtype == copied.meta.dtype == torch.int32
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(8))
    y = assigned(x)
    check_against_float64(assigned, x, y)
    assert torch.equal(y, copied(x))


@pytest.mark.parametrize("assign", [False, True])
@pytest.mark.parametrize("values_dtype", [torch.bfloat16, torch.float32])
def test_loaded_values_beyond_the_f16_range_are_refused(assign, values_dtype):
    """A state dict whose values lie beyond ±65504 loaded into an f16 layer: the cast made them inf
    (outputs inf or NaN for every input) without a word, where ``from_dense(..., "f16")`` refuses the
    same weights (SP0902). Refused before anything is copied; values within range still load."""
    lin = linear(16, 64, seed=12)
    with torch.no_grad():
        lin.weight[3, 4:8] = torch.tensor([1e6, 0.0, 0.0, 0.5])
        lin.weight[7, 8:12] = torch.tensor([0.0, -7e4, 0.25, 0.0])
    saved = spt.SparseLinear.from_dense(lin, "bf16")
    state = {name: t.to(values_dtype) if name == "values" else t for name, t in saved.state_dict().items()}
    layer = spt.SparseLinear(64, 16, dtype="f16")
    before = {name: t.clone() for name, t in layer.state_dict().items()}
    with pytest.raises(ValueError) as info:
        layer.load_state_dict(state, assign=assign)
    assert (info.value.code, info.value.message) == (
        "SP0814", f"the state dict's values are {values_dtype}, 2 of them beyond ±65504: as this layer's f16 "
                  "(torch.float16) they would be inf")
    assert "dtype='bf16'" in info.value.help
    assert all(torch.equal(t, before[name]) for name, t in layer.state_dict().items())
    model = torch.nn.Sequential(layer)  # (through a model's load_state_dict too)
    with pytest.raises(ValueError):
        model.load_state_dict({f"0.{k}": v for k, v in state.items()}, assign=assign)
    assert all(torch.equal(t, before[name]) for name, t in layer.state_dict().items())
    with torch.no_grad():
        lin.weight[3, 4] = lin.weight[7, 9] = 6e4
    fits = spt.SparseLinear.from_dense(lin, "bf16")
    layer.load_state_dict({n: t.to(values_dtype) if n == "values" else t for n, t in fits.state_dict().items()},
                          assign=assign)
    assert layer.values.dtype == torch.float16 and torch.isfinite(layer.values.float()).all()
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    check_against_float64(layer, x, layer(x))


@pytest.mark.parametrize("strict", [True, False])
def test_a_dense_state_dict_is_refused(strict):
    """The state dict of the dense model (a linear's ``weight`` and ``bias``) loaded into the
    sparsified one: with ``strict=False`` torch loaded the new bias next to the old weight without an
    error (the output 50-100 % off the new dense model's). The dense weight is refused (SP0902),
    before anything is copied."""
    model = torch.nn.Sequential(linear(32, 64, seed=1))
    spt.sparsify_(model, interpret=True, min_features=16)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    with pytest.raises(IntegrationError) as info:
        model.load_state_dict(torch.nn.Sequential(linear(32, 64, seed=2)).state_dict(), strict=strict)
    assert (info.value.code, info.value.message) == (
        "SP0902", "the state dict holds a dense weight 0.weight of shape (32, 64) for this SparseLinear, which "
                  "stores its weight as compressed values and metadata: it would not be loaded (the old weight "
                  "kept, the new bias next to it)")
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())


@pytest.mark.parametrize(("saved", "loaded", "values_dtype"), [
    ("e4m3", "bf16", "torch.float8_e4m3fn"), ("bf16", "e4m3", "torch.bfloat16"), ("f16", "e4m3", "torch.float16")])
@pytest.mark.parametrize("strict", [True, False])
def test_values_of_another_weight_type_are_refused(saved, loaded, values_dtype, strict):
    """e4m3 values mean values * scale_w: copied into a 16-bit layer (or 16-bit values into an e4m3
    layer, its scale_w left at 1) they were cast to other numbers. strict=True raised only after the
    copy (scale_w unexpected or missing); strict=False loaded them (the output 130x off, or 88 %).
    Refused before the copy (SP0814); bf16 <-> f16 values still load (a cast of the same numbers)."""
    source = spt.SparseLinear.from_dense(linear(32, 64, seed=1), saved)
    layer = spt.SparseLinear(64, 32, dtype=loaded)
    before = {name: t.clone() for name, t in layer.state_dict().items()}
    with pytest.raises(ValueError) as info:
        layer.load_state_dict(source.state_dict(), strict=strict)
    dtype = {"bf16": "torch.bfloat16", "e4m3": "torch.float8_e4m3fn"}[loaded]
    assert (info.value.code, info.value.message) == (
        "SP0814", f"the state dict's values are {values_dtype}, but this layer's weight is {loaded} ({dtype}): a "
                  "copy would cast them to other numbers (e4m3 values mean values * scale_w)")
    assert all(torch.equal(t.float(), before[name].float()) for name, t in layer.state_dict().items())
    other = spt.SparseLinear(64, 32, dtype="f16")
    other.load_state_dict(spt.SparseLinear.from_dense(linear(32, 64, seed=1), "bf16").state_dict(), strict=strict)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    check_against_float64(other, x, other(x))


@pytest.mark.parametrize("how", ["buffers", "data"])
@pytest.mark.parametrize("name", ["values", "meta", "bias", "scale_w"])
def test_a_buffer_replaced_without_setattr_is_read_by_the_next_call(how, name, caplog):
    """``layer._buffers[name] = t`` (accelerate's ``set_module_tensor_to_device`` assigns buffers so)
    and ``layer.<name>.data = t`` bypass ``SparseLinear.__setattr__``: the next call still computes
    with the new tensor (the weight bound by the earlier calls, and on CUDA their launch records,
    read the old one: a silent stale result)."""
    dtype = "e4m3" if name == "scale_w" else "bf16"
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=6), dtype)
    other = spt.SparseLinear.from_dense(linear(32, 64, seed=8), dtype)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    before = layer(x)
    new = getattr(other, name).detach().clone()
    if how == "buffers":
        layer._buffers[name] = new
    else:
        getattr(layer, name).data = new
    with caplog.at_level(logging.INFO, logger="sparsile.torch"):
        y = layer(x)
    assert "rebuilding its launch records" in caplog.text
    assert not torch.equal(y, before)
    check_against_float64(layer, x, y, layer.out_dtype)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sparsile.torch"):
        assert torch.equal(layer(x), y)
    assert caplog.text == ""  # bound again: found once


def test_weights_beyond_the_f16_range_are_refused_as_f16():
    """from_dense(bf16 weights, "f16") cast them: a weight above 65504 became inf (kept, as the largest
    of its group), with only numpy's overflow warning. Now SP0902; within range it still converts."""
    lin = linear(16, 64, seed=11)
    with torch.no_grad():
        lin.weight[3, 5] = 1e6
        lin.weight[7, 9] = -7e4
    err = _error(spt.SparseLinear.from_dense, lin, "f16")
    assert (err.code, err.message) == ("SP0902", "2 weights lie beyond ±65504, the largest finite float16: as "
                                                 "f16 they would be inf")
    assert torch.isfinite(spt.SparseLinear.from_dense(lin, "bf16").values.float()).all()
    with torch.no_grad():
        lin.weight[3, 5] = lin.weight[7, 9] = 6e4
    layer = spt.SparseLinear.from_dense(lin, "f16")
    assert torch.isfinite(layer.values.float()).all() and layer.values.float().abs().max() == lin.weight.float().max()


@pytest.mark.parametrize(("dtype", "out_dtype"), [("bf16", None), ("e4m3", torch.float32), ("f16", None)])
def test_a_layer_moved_to_the_meta_device_runs_on_meta_inputs(dtype, out_dtype):
    """``layer.to("meta")`` (shape inference, an empty model before its weights load): a call with a
    meta x gave SP0804 ("cannot read values of type Tensor on the host"), where ``nn.Linear`` gives
    a meta y. It now gives y's shape and type (the ops' fake); ``to_empty`` and a state dict then
    give the layer back, computing as before."""
    saved = spt.SparseLinear.from_dense(linear(24, 64, seed=14), dtype, out_dtype=out_dtype)
    layer = copy.deepcopy(saved).to("meta")
    x = torch.randn(2, 3, 64, device="meta", dtype=torch.bfloat16)
    y = layer(x)
    assert (y.device.type, y.shape, y.dtype) == ("meta", (2, 3, 24), out_dtype or torch.bfloat16)
    assert layer(x[:0]).shape == (0, 3, 24)
    err = _error(layer, torch.ones(2, 64, dtype=torch.bfloat16))  # (x on another device: still SP0901)
    assert err.code == "SP0901"
    layer.to_empty(device="cpu")
    layer.load_state_dict(saved.state_dict())
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(15)).to(torch.bfloat16)
    y = layer(x)
    check_against_float64(layer, x, y, out_dtype)
    assert torch.equal(y, saved(x))


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_to_dense_and_to_linear_of_a_layer_on_the_meta_device(dtype):
    """A layer on the meta device (no values): ``to_dense()`` is a meta (N, K) float32 tensor and
    ``to_linear()`` an nn.Linear on the meta device, as torch's operations on meta tensors give (it was
    SP0804, "cannot read meta of type Tensor on the host", naming the metadata buffer)."""
    layer = spt.SparseLinear(62, 24, dtype=dtype, device="meta")
    dense = layer.to_dense()
    assert (dense.device.type, dense.shape, dense.dtype) == ("meta", (24, 62), torch.float32)
    twin = layer.to_linear()
    assert (twin.weight.device.type, twin.weight.shape, twin.weight.dtype) == ("meta", (24, 62), torch.bfloat16)
    assert (twin.bias.device.type, twin.bias.shape) == ("meta", (24,))
    assert twin.to_empty(device="cpu")(torch.ones(2, 62, dtype=torch.bfloat16)).shape == (2, 24)
