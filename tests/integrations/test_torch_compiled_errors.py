"""The layer diagnostics of a compiled forward under ``torch.compile(fullgraph=True)``: the user's error
holds our code, message and help (``str(e)``) and is caused by our ``IntegrationError`` (``e.__cause__``).

Before, dynamo could not build the error object (its ``Span``) and every one of them surfaced as dynamo's
``Unsupported`` ("SourcelessBuilder ... Span") without a word of ours; without ``fullgraph`` the graph
break ran the frame eagerly and our error came through, as it still must (integrations/torch/traced_errors.py).
CPU tensors, the meta device standing for a second device."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import FusedSiblings, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

N, K = 32, 64


def _x(*shape: int, dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7)).to(dtype=dtype, device=device)


def _sparse(dtype: str = "bf16") -> spt.SparseLinear:
    return spt.SparseLinear.from_dense(linear(N, K, seed=1), dtype)


def _semi() -> spt.SemiSparseLinear:
    return spt.SemiSparseLinear.from_dense(linear(N, K, torch.float32, seed=1), "bf16")


def _moved(layer: torch.nn.Module, name: str) -> torch.nn.Module:
    """``layer`` with its tensor ``name`` on the meta device, put in without setattr (as accelerate does)."""
    where = layer._parameters if name in layer._parameters else layer._buffers
    where[name] = getattr(layer, name).detach().to("meta")
    return layer


def _static_on_meta() -> spt.SparseLinear:
    layer = _sparse("e4m3")
    layer.input_scale = torch.tensor([0.05])
    layer._buffers["input_scale"] = torch.tensor([0.05], device="meta")
    return layer



def _device_help(name: str) -> str:
    return (f"move the module (.to(device)) or assign {name} on the values' device: "
            f"layer.{name} = {name}.to(layer.values.device)")


_SHAPE_HELP = "the last dimension of x is the in_features"
_DTYPE_HELP = "cast x first"
_X_DEVICE_HELP = "move the module or x to the same device"

# (name, layer, x, message, help): every SP0901 of a layer's compiled forward
CASES = [
    ("sparse-features", _sparse, lambda: _x(2, 60), "x has shape (2, 60); this layer takes (..., 64)", _SHAPE_HELP),
    ("sparse-3d-features", _sparse, lambda: _x(2, 3, 48), "x has shape (2, 3, 48); this layer takes (..., 64)",
     _SHAPE_HELP),
    ("sparse-dtype", _sparse, lambda: _x(2, K, dtype=torch.float64),
     "x has dtype torch.float64; SparseLinear takes bfloat16, float16 or float32 x", _DTYPE_HELP),
    ("sparse-int-x", _sparse, lambda: torch.arange(2 * K).reshape(2, K),
     "x has dtype torch.int64; SparseLinear takes bfloat16, float16 or float32 x", _DTYPE_HELP),
    ("sparse-x-device", _sparse, lambda: _x(2, K, device="meta"), "x is on meta but the layer's weight is on cpu",
     _X_DEVICE_HELP),
    ("e4m3-features", lambda: _sparse("e4m3"), lambda: _x(4, 60), "x has shape (4, 60); this layer takes (..., 64)",
     _SHAPE_HELP),
    ("sparse-bias", lambda: _moved(_sparse(), "bias"), lambda: _x(2, K),
     "bias is on meta but the layer's values are on cpu", _device_help("bias")),
    ("sparse-meta", lambda: _moved(_sparse(), "meta"), lambda: _x(2, K),
     "meta is on meta but the layer's values are on cpu", _device_help("meta")),
    ("e4m3-scale_w", lambda: _moved(_sparse("e4m3"), "scale_w"), lambda: _x(2, K),
     "scale_w is on meta but the layer's values are on cpu", _device_help("scale_w")),
    ("e4m3-bias", lambda: _moved(_sparse("e4m3"), "bias"), lambda: _x(2, K),
     "bias is on meta but the layer's values are on cpu", _device_help("bias")),
    ("e4m3-input_scale", _static_on_meta, lambda: _x(2, K), "input_scale is on meta but the layer's weight is on cpu",
     "move the module (.to(device)) or assign the scale on the weight's device: "
     "layer.input_scale = scale.to(layer.values.device)"),
    ("fused-features", FusedSiblings, lambda: _x(2, 60), "x has shape (2, 60); this layer takes (..., 64)",
     _SHAPE_HELP),
    ("semi-features", _semi, lambda: _x(2, 60), "x has shape (2, 60); this layer takes (..., 64)", _SHAPE_HELP),
    ("semi-dtype", _semi, lambda: _x(2, K, dtype=torch.float64),
     "x has dtype torch.float64; SemiSparseLinear takes bfloat16, float16 or float32 x", _DTYPE_HELP),
    ("semi-x-device", _semi, lambda: _x(2, K, device="meta"), "x is on meta but the layer's weight is on cpu",
     _X_DEVICE_HELP),
    ("semi-bias", lambda: _moved(_semi(), "bias"), lambda: _x(2, K),
     "bias is on meta but the layer's values are on cpu", _device_help("bias")),
    ("semi-mask", lambda: _moved(_semi(), "mask"), lambda: _x(2, K),
     "mask is on meta but the layer's values are on cpu", _device_help("mask")),
    ("semi-values_t", lambda: _moved(_semi(), "values_t"), lambda: _x(2, K),
     "values_t is on meta but the layer's values are on cpu", _device_help("values_t")),
]


def _reset() -> None:
    """``torch._dynamo.reset()``, once more where it raised: after an inductor compile (the reduce-overhead
    test), the backends' reset adds to the dict it iterates over (torch's RuntimeError "dictionary changed
    size during iteration"); the second pass finds them all."""
    try:
        torch._dynamo.reset()
    except RuntimeError:
        torch._dynamo.reset()


def _compiled(layer: torch.nn.Module, x: torch.Tensor, **options) -> None:
    _reset()
    torch.compile(layer, backend="eager", **options)(x)


@pytest.mark.parametrize(("layer", "x", "message", "help"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fullgraph_shows_the_code_message_and_help(layer, x, message, help):
    layer, x = layer(), x()
    with pytest.raises(IntegrationError) as eager:  # (the eager call's error, for comparison)
        layer(x)
    assert (eager.value.code, eager.value.message, eager.value.help) == ("SP0901", message, help)
    with pytest.raises(Exception) as info:
        _compiled(layer, x, fullgraph=True)
    assert f"error[SP0901]: {message}\n = help: {help}" in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, IntegrationError), repr(info.value)
    assert (cause.code, cause.message, cause.help) == ("SP0901", message, help)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("sparse-features", "sparse-bias", "e4m3-input_scale",
                                                                 "fused-features", "semi-mask")], ids=lambda c: c[0])
def test_without_fullgraph_the_error_is_ours(case):
    """The graph break runs the frame eagerly: the user catches the IntegrationError itself (as before)."""
    _, layer, x, message, help = case
    with pytest.raises(IntegrationError) as info:
        _compiled(layer(), x())
    assert (info.value.code, info.value.message, info.value.help) == ("SP0901", message, help)


@pytest.mark.parametrize("layer", [_sparse, _semi], ids=["sparse", "semi"])
def test_a_dynamic_batch_shows_the_shape(layer):
    """x's batch size marked dynamic: the message's shape is numbers (a symbolic size made it a format
    dynamo could not hand over as text: its own error, "assume_constant_result argument conversion failed")."""
    x = _x(4, 3, 60)
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(Exception) as info:
        _compiled(layer(), x, fullgraph=True)
    want = f"error[SP0901]: x has shape (4, 3, 60); this layer takes (..., 64)\n = help: {_SHAPE_HELP}"
    assert want in str(info.value)
    assert isinstance(info.value.__cause__, IntegrationError)


def test_strict_export_shows_ours():
    """torch.export's strict tracer is dynamo's, with one graph: the same error as fullgraph."""
    with pytest.raises(Exception) as info:
        torch.export.export(_sparse(), (_x(2, 60),), strict=True)
    assert "error[SP0901]: x has shape (2, 60); this layer takes (..., 64)" in str(info.value)
    assert isinstance(info.value.__cause__, IntegrationError)


def test_reduce_overhead_mode_shows_ours():
    """``mode="reduce-overhead"`` (inductor, CUDA graphs where there is a GPU): the error is raised while tracing."""
    layer, x = _sparse(), _x(2, 60)
    _reset()
    with pytest.raises(Exception) as info:
        torch.compile(layer, mode="reduce-overhead", fullgraph=True)(x)
    assert "error[SP0901]: x has shape (2, 60); this layer takes (..., 64)" in str(info.value)
    assert isinstance(info.value.__cause__, IntegrationError)


def test_a_model_whose_sparse_layer_refuses_x_deep_inside():
    """A layer deep in a model (what a compiled LLM is): the same error, and a correct x still computes
    (the hook changes nothing on a call that does not fail)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 60).to(torch.bfloat16), torch.nn.ReLU(), _sparse())
    with pytest.raises(Exception) as info:
        _compiled(model, _x(3, 16), fullgraph=True)
    assert "error[SP0901]: x has shape (3, 60); this layer takes (..., 64)" in str(info.value)
    good = torch.nn.Sequential(torch.nn.Linear(16, K).to(torch.bfloat16), torch.nn.ReLU(), _sparse())
    x = _x(3, 16)
    _reset()
    assert torch.equal(torch.compile(good, backend="eager", fullgraph=True)(x), good(x))


def test_errors_outside_dynamo_are_built_as_before():
    """The hook returns outside dynamo: the eager error is built with its unknown span."""
    from sparsile.frontend.spans import UNKNOWN_SPAN

    with pytest.raises(IntegrationError) as info:
        _sparse()(_x(2, 60))
    assert info.value.span is UNKNOWN_SPAN and info.value.__cause__ is None
