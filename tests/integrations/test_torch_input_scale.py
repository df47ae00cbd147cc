"""A SparseLinear e4m3 layer with a static per-tensor activation scale (``input_scale``, compressed-tensors'
``input_activations: {dynamic: false, strategy: tensor}``): x is quantized as vLLM's static_scaled_fp8_quant
does (x / s saturated to ±448), on every path (eager, the custom ops under torch.compile, autograd's
straight-through gradient), the scale is a buffer (state dict, .to(), pickling), and a fused group never
serves it a sibling's run quantized per token. On the CPU through the interpreter."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.test_torch_checkpoint_static import check_static
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

S_X = 0.02  # 448 * S_X = 8.96: _x's first elements are saturated


def _layer(n: int = 16, k: int = 32, seed: int = 0, bias: bool = True, scale: float | None = S_X, **kwargs):
    layer = spt.SparseLinear.from_dense(linear(n, k, seed=seed, bias=bias), "e4m3", **kwargs)
    if scale is not None:
        layer.input_scale = torch.tensor([scale], dtype=torch.float32)
    return layer


def _parts(layer):
    """(W_q as float64 (N, K), s_w, bias, s_x) of an e4m3 layer, from its own buffers."""
    wq = (layer.to_dense().double() / layer.scale_w.double()[:, None]).numpy()
    bias = layer.bias.double().numpy() if layer.bias is not None else np.zeros(layer.out_features)
    return wq, layer.scale_w.double().numpy(), bias, float(layer.input_scale.item())


def _x(seed: int = 0, shape=(5, 32)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 3
    x.view(-1, shape[-1])[0, :3] = torch.tensor([20.0, -30.0, 9.5])
    return x.to(torch.bfloat16)


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


def test_the_eager_layer_quantizes_with_the_static_scale():
    layer = _layer()
    x = _x()
    y = layer(x)
    check_static(y, x, *_parts(layer))
    assert "input_scale=static" in repr(layer)
    layer.input_scale = None  # per token again: other numbers (x's row 0 is not saturated then)
    assert not torch.equal(layer(x), y)


def test_the_buffer_round_trips_and_moves():
    layer = _layer()
    state = layer.state_dict()
    assert torch.equal(state["input_scale"], torch.tensor([S_X]))
    fresh = spt.SparseLinear(32, 16, dtype="e4m3", input_scale=True)
    assert torch.equal(fresh.input_scale, torch.ones(1))
    fresh.load_state_dict(state)
    x = _x(1)
    assert torch.equal(fresh(x), layer(x))
    plain = spt.SparseLinear(32, 16, dtype="e4m3")  # (no static scale: torch's unexpected key, as for a bias)
    with pytest.raises(RuntimeError, match="input_scale"):
        plain.load_state_dict(state)
    half = copy.deepcopy(layer).half()
    assert half.input_scale.dtype == torch.float32 and torch.equal(half(x), layer(x))
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(layer), torch.load(buffer, weights_only=False), layer.to("cpu")):
        assert torch.equal(other.input_scale, layer.input_scale) and torch.equal(other(x), layer(x))


def test_loading_a_new_scale_changes_the_outputs():
    layer = _layer()
    x = _x(2)
    before = layer(x)
    state = {**layer.state_dict(), "input_scale": torch.tensor([0.05])}
    layer.load_state_dict(state)
    after = layer(x)
    assert not torch.equal(after, before)
    check_static(after, x, *_parts(layer))
    with torch.no_grad():
        layer.input_scale.fill_(0.03)  # in place, without load_state_dict: the kept reciprocal follows
    check_static(layer(x), x, *_parts(layer))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_and_the_ops_compute_the_same(dynamic):
    layer = _layer()
    x = _x(3, (2, 3, 32))
    eager = layer(x)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    assert torch.equal(compiled(x), eager)
    static = layer.input_scale
    direct = torch.ops.sparsile.sparse_linear_e4m3(x.reshape(-1, 32), layer.values, layer.meta, layer.bias,
                                                   layer.scale_w, static)
    assert torch.equal(direct.reshape(eager.shape), eager)


def _straight_through(layer, dy: torch.Tensor) -> torch.Tensor:
    """dx (float64) of the straight-through gradient: dy @ (W_q * s_w) (no activation)."""
    return dy.double().reshape(-1, layer.out_features) @ layer.to_dense().double()


@pytest.mark.parametrize("compiled", [False, True])
def test_x_s_gradient_is_straight_through(compiled):
    layer = _layer()
    x = _x(4).requires_grad_(True)
    run = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else layer
    y = run(x)
    with torch.no_grad():
        assert torch.equal(y.detach(), layer(x.detach()))
    dy = torch.randn(5, 16).to(torch.bfloat16)
    y.backward(dy)
    ref = _straight_through(layer, dy)
    assert torch.allclose(x.grad.double(), ref, rtol=2 ** -7, atol=1e-2 * ref.abs().max().item())


def test_the_op_refuses_a_gradient_for_the_static_scale():
    layer = _layer()
    scale = layer.input_scale.clone().requires_grad_(True)
    y = torch.ops.sparsile.sparse_linear_e4m3(_x(5), layer.values, layer.meta, layer.bias, layer.scale_w, scale)
    err = _error(y.sum().backward)
    assert err.code == "SP0922" and "scale_x (a static input scale)" in err.message


def test_a_static_layer_is_not_fused_and_a_scale_given_after_fusing_unfuses():
    class Block(torch.nn.Module):
        def __init__(self, static: str | None):
            super().__init__()
            for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
                setattr(self, name, _layer(16, 64, seed=i, scale=S_X if name == static else None))

    block = Block("k_proj")
    report = spt.fuse_projections_(block)
    assert report.fused == [] and report.skipped == {
        "q_proj+k_proj+v_proj": "k_proj has a static input scale (input_scale; the fused layer quantizes x per "
                                "token, or with one scale for all its rows)"}
    block = Block(None)
    plain = copy.deepcopy(block)
    assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
    x = _x(6, (5, 64))
    assert torch.equal(block.q_proj(x), plain.q_proj(x))  # a fused run pending for k_proj and v_proj
    for how in ("setattr", "buffers"):
        target = block.k_proj if how == "setattr" else block.v_proj
        if how == "setattr":
            target.input_scale = torch.tensor([S_X])
        else:  # (as accelerate's set_module_tensor_to_device writes a buffer: no setattr)
            target._buffers["input_scale"] = torch.tensor([S_X])
        y = target(x)
        check_static(y, x, *_parts(target))
        twin = copy.deepcopy(getattr(plain, "k_proj" if how == "setattr" else "v_proj"))
        twin.input_scale = torch.tensor([S_X])
        assert torch.equal(y, twin(x))


def test_input_scale_diagnostics():
    err = _error(spt.SparseLinear, 32, 16, dtype="bf16", input_scale=True)
    assert (err.code, err.message) == ("SP0902", "input_scale=True for a bf16 layer: only e4m3 layers quantize x")
    bf16 = spt.SparseLinear.from_dense(linear(16, 32))
    err = _error(setattr, bf16, "input_scale", torch.tensor([0.5]))
    assert (err.code, err.message) == ("SP0902", "input_scale: a static input scale is given to a bf16 layer, but "
                                                 "only e4m3 layers quantize x")
    layer = _layer(scale=None)
    for bad, got in ((torch.tensor(0.5), "torch.float32 ()"), (torch.tensor([0.5, 1.0]), "torch.float32 (2,)"),
                     (torch.tensor([0.5], dtype=torch.float64), "torch.float64 (1,)"), (0.5, "float")):
        err = _error(setattr, layer, "input_scale", bad)
        assert (err.code, err.message) == ("SP0902", f"input_scale: must be a float32 tensor of shape (1,), got {got}")
        assert "torch.tensor([scale], dtype=torch.float32)" in err.help
    err = _error(setattr, layer, "input_scale", torch.tensor([-1.0]))
    assert (err.code, err.message) == ("SP0902", "input_scale: -1.0 is not a positive finite number")
    assert layer.input_scale is None
    values, indices = np.zeros((16, 16), np.float32), np.tile(np.array([0, 1]), (16, 8, 1))
    import ml_dtypes
    err = _error(spt.SparseLinear.from_compressed, values.astype(ml_dtypes.float8_e4m3fn), indices, 32,
                 input_scale=[0.1, 0.2])
    assert (err.code, err.message) == ("SP0902", "input_scale: has 2 elements; a static input scale is per tensor "
                                                 "(one element)")
    err = _error(torch.ops.sparsile.sparse_linear_e4m3, _x(), layer.values, layer.meta, layer.bias, layer.scale_w,
                 torch.ones(5))
    assert (err.code, err.message) == ("SP0906", "sparsile.sparse_linear_e4m3: scale_x is a static per-tensor scale, "
                                                 "one float32 element, got torch.float32 (5,)")


@pytest.mark.parametrize("how", ["buffers after a call", "buffers before a call", "setattr"])
def test_a_static_scale_on_another_device_is_sp0901(how):
    """A static scale that is not on the weight's device (put into ``_buffers`` by hand, or assigned)
    is SP0901 when the layer binds its tensors (as an x on another device is), not torch's device
    error from inside the quantizer; the scale put back on the weight's device, the layer computes."""
    layer, x = _layer(), _x()
    if how == "buffers after a call":
        layer(x)
    elsewhere = torch.tensor([S_X], device="meta")
    if how == "setattr":
        layer.input_scale = elsewhere
    else:
        layer._buffers["input_scale"] = elsewhere
    for _ in range(2):  # (not bound: the next call is refused again)
        err = _error(layer, x)
        assert (err.code, err.message) == ("SP0901", "input_scale is on meta but the layer's weight is on cpu")
        assert err.help == ("move the module (.to(device)) or assign the scale on the weight's device: "
                            "layer.input_scale = scale.to(layer.values.device)")
    layer._buffers["input_scale"] = torch.tensor([S_X])
    check_static(layer(x), x, *_parts(layer))
    on_meta = _layer().to("meta")  # the other way round: a meta layer (meta x: y's shape) with a CPU scale
    assert on_meta(x.to("meta")).shape == (5, 16)
    on_meta._buffers["input_scale"] = torch.tensor([S_X])
    err = _error(on_meta, x.to("meta"))
    assert (err.code, err.message) == ("SP0901", "input_scale is on cpu but the layer's weight is on meta")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("scale", [S_X, 1.7, 1e-40, 4e-39, 3e38])
def test_the_static_quantizer_kernel_gives_torch_s_bits(dtype, scale):
    """The kernel the CUDA path quantizes x with (quantize.spk's quantize_e4m3_static, here in the
    interpreter) against the torch operations of quantize_static, bit for bit: rows longer than one
    step (K = 5000, BLOCK 4096), saturation, NaN, ±inf, ±0, a subnormal scale (1 / s = inf: 0 * inf is
    NaN in both), a subnormal one whose reciprocal is finite (4e-39: a flush to zero would
    make it inf) with subnormal x, and a huge one (x * (1 / s) subnormal, rounded to e4m3's zero or smallest values)."""
    from sparsile.integrations.torch.quantize import quantize_static
    from sparsile.stdlib.kernels.quantize_e4m3 import quantize_static_e4m3

    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(3, 5000, generator=gen) * 4).to(dtype)
    x[0, :7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e4, -9.0]).to(dtype)
    x[2, -3:] = torch.tensor([2 ** -12, -(2 ** -13), 1e-30]).to(dtype)
    x[1, -3:] = torch.tensor([1e-40, -3e-39, float("-nan")]).to(dtype)  # (f32 and bf16 subnormals; 0 in f16)
    s = torch.tensor([scale], dtype=torch.float32)
    got = quantize_static_e4m3(x, s, interpret=True)
    want = quantize_static(x, s)
    assert got.dtype == torch.float8_e4m3fn and got.shape == x.shape
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("path", ["eager", "eager x grad", "op", "compiled"])
def test_a_static_scale_that_requires_grad_has_its_gradient_refused(path):
    """input_scale made an nn.Parameter: every path computes the same y, and a backward reaching the
    scale is SP0922 (before, the eager call dropped its gradient: y had no grad_fn, or x's alone)."""
    layer = _layer()
    want = layer(_x(3))
    layer.input_scale = torch.nn.Parameter(layer.input_scale.clone())
    x = _x(3).requires_grad_(path == "eager x grad")
    if path == "op":
        y = layer._forward_op(x)
    elif path == "compiled":  # (AOTAutograd traces the backward at compile time: SP0922 then, in torch's wrapper)
        with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
            torch.compile(layer, backend="aot_eager", fullgraph=True)(x)
        inner = info.value.inner_exception
        assert isinstance(inner, IntegrationError) and inner.code == "SP0922"
        assert "scale_x (a static input scale)" in inner.message
        return
    else:
        y = layer(x)
    assert torch.equal(y.detach(), want) and y.requires_grad
    err = _error(y.float().sum().backward)
    assert err.code == "SP0922"
    assert err.message == ("sparse_linear has no gradient for scale_x (a static input scale): the sparse weight is "
                           "frozen (an inference layer)")
    assert layer.input_scale.grad is None
    with torch.no_grad():  # (no gradient asked: the eager launch as before)
        assert not layer(x).requires_grad


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 64, 65])
def test_every_path_of_a_static_scale_gives_the_same_bits(x_dtype, tokens):
    """The paths an e4m3 layer with a static scale takes for one x, on the CPU: the eager call (torch's
    operations with the kept reciprocal), the custom op (traces), and what a CUDA call launches, in the
    interpreter: the static quantizer kernel (a record's first launch up to 64 tokens, quantize_with_scale's
    beyond), with the scale aligned and at an odd address (the fallback of a misaligned scale reads a
    copy), then the GEMM of the e4m3 x with the scale as its per-tensor scale_x. The same bits, all within
    float64's numbers; subnormal x (f32, f16) and saturated elements included."""
    from sparsile.stdlib.kernels.quantize_e4m3 import quantize_static_e4m3

    layer = _layer(n=16, k=32)
    x = _x(11, (tokens, 32)).to(x_dtype)
    x[-1, 4:7] = torch.tensor([1e-40 if x_dtype == torch.float32 else 1e-7, -300.0, -0.0]).to(x_dtype)
    s = layer.input_scale
    eager = layer(x)
    check_static(eager, x, *_parts(layer))
    op = layer._forward_op(x)
    odd = torch.zeros(3, dtype=torch.float32)
    odd[1] = s[0]
    ys = [op]
    for scale in (s, odd[1:2]):  # (odd[1:2]: 4 bytes past a 64-byte aligned block)
        xq = quantize_static_e4m3(x, scale, interpret=True)
        ys.append(torch.ops.sparsile.sparse_linear(xq, layer.values, layer.meta, layer.bias, scale, layer.scale_w,
                                                   out_dtype=eager.dtype))
    bits = torch.int32 if eager.dtype == torch.float32 else torch.int16
    for y in ys:
        assert y.dtype == eager.dtype and torch.equal(y.view(bits), eager.view(bits))
