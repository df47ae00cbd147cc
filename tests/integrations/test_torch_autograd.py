"""x's gradient through frozen sparse layers (integrations/torch/autograd.py), on the CPU (the kernel
in the interpreter, the weight decompressed on the host): SparseLinear of every weight type and
activation, the op with gated activations and a trainable bias, a transformers Llama whose input
gradient must match the dense model with the same pruned weights, and SP0922 for gradients of the
frozen weight. The GPU path (decompress_gpu): tests/gpu/test_torch_autograd_gpu.py."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import dense_twin, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
F = torch.nn.functional

from sparsile.integrations.errors import IntegrationError  # noqa: E402

EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
ACTS = {None: lambda t: t, "relu": F.relu, "silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "swiglu": lambda t: F.silu(t[:, :t.shape[1] // 2]) * t[:, t.shape[1] // 2:],
        "geglu": lambda t: F.gelu(t[:, :t.shape[1] // 2], approximate="tanh") * t[:, t.shape[1] // 2:]}


def reference_dx(layer, pre: torch.Tensor, g: torch.Tensor, activation) -> torch.Tensor:
    """dx in float64: the activation differentiated at ``pre`` (T, rows), times the pruned weight."""
    p = pre.detach().double().requires_grad_()
    (d_pre,) = torch.autograd.grad(ACTS[activation](p), p, g.double().reshape(p.shape[0], -1))
    return d_pre @ layer.to_dense().double()


def assert_close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Within the rounding of dx (computed in float32) to x's dtype, relative to the largest element."""
    err = (got.double() - ref).abs().max().item()
    assert err <= 1.5 * EPS[dtype] * ref.abs().max().item(), (err, ref.abs().max().item())


@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize(("weight", "x_dtype"), [("bf16", torch.bfloat16), ("f16", torch.float16),
                                                 ("e4m3", torch.bfloat16)])
def test_x_gradient_of_every_weight_type_and_activation(weight, x_dtype, activation):
    """dx = act'(pre) * dy @ W (W * scale_w for e4m3, whose x quantizer passes the gradient straight
    through), against float64 at the pre-activations the layer computes; N-D x."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=3), weight, activation=activation)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 64, generator=gen).to(x_dtype).requires_grad_()
    y = layer(x)
    assert y.requires_grad and y.shape == (2, 3, 48)
    with torch.no_grad():
        assert torch.equal(y, layer(x))  # the forward is the layer's own
    g = torch.randn(y.shape, generator=gen).to(y.dtype)
    y.backward(g)
    pre = layer._forward_op(x.detach(), pre=True)
    assert_close(x.grad.reshape(6, 64), reference_dx(layer, pre, g, activation), x_dtype)
    assert layer.values.grad is None and layer.bias.grad is None


@pytest.mark.parametrize("activation", [None, "silu", "swiglu", "geglu"])
def test_the_op_gives_x_and_a_trainable_bias_their_gradients(activation):
    layer = spt.SparseLinear.from_dense(linear(64, 64, seed=5))
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16).requires_grad_()
    bias = layer.bias.detach().clone().requires_grad_()
    y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, bias, activation=activation)
    g = torch.randn(y.shape, generator=gen).to(y.dtype)
    y.backward(g)
    pre = torch.ops.sparsile.sparse_linear(x.detach(), layer.values, layer.meta, bias.detach(),
                                           out_dtype=torch.float32)
    assert_close(x.grad, reference_dx(layer, pre, g, activation), torch.bfloat16)
    p = pre.double().requires_grad_()
    (d_pre,) = torch.autograd.grad(ACTS[activation](p), p, g.double())
    assert torch.allclose(bias.grad.double(), d_pre.sum(0), rtol=1e-5, atol=1e-5 * d_pre.abs().max().item())


def test_no_autograd_work_without_grad():
    """Under no_grad, or for an x that needs none, the call is the plain one: no graph, nothing saved."""
    layer = spt.SparseLinear.from_dense(linear(16, 64, seed=7))
    x = torch.randn(2, 64).to(torch.bfloat16).requires_grad_()
    with torch.no_grad():
        assert layer(x).grad_fn is None
    assert layer(x.detach()).grad_fn is None
    assert layer(x).grad_fn is not None


@pytest.mark.parametrize("what", ["values", "scale_w"])
def test_a_gradient_of_the_frozen_weight_is_sp0922(what):
    layer = spt.SparseLinear.from_dense(linear(16, 64, seed=8), "e4m3")
    getattr(layer, what).requires_grad_()
    y = layer(torch.randn(2, 64).to(torch.bfloat16).requires_grad_())
    with pytest.raises(IntegrationError) as info:
        y.float().sum().backward()
    assert info.value.code == "SP0922"
    assert info.value.message == f"sparse_linear has no gradient for {what}: the sparse weight is frozen (an " \
                                 "inference layer)"
    assert "sparsify_(model, trainable=True)" in info.value.help


@pytest.mark.parametrize("activation", [None, "silu"])
def test_a_trainable_bias_gets_its_gradient_from_an_x_without_grad(activation):
    """A layer's bias made trainable (``layer.bias.requires_grad_()``) fed an x that needs no gradient (the
    model's first layer, x from the data): the eager call took the plain launch, y had no graph and the
    bias silently got no gradient (the op, torch.compile's path, gave it one)."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=5), activation=activation)
    layer.bias.requires_grad_()
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    y = layer(x)
    g = torch.randn(y.shape, generator=gen).to(y.dtype)
    y.backward(g)
    pre = layer._forward_op(x, pre=True)
    p = pre.double().requires_grad_()
    (d_pre,) = torch.autograd.grad(ACTS[activation](p), p, g.double())
    assert layer.bias.grad is not None
    assert torch.allclose(layer.bias.grad.double(), d_pre.sum(0), rtol=1e-5, atol=1e-5 * d_pre.abs().max().item())


@pytest.mark.parametrize("what", ["values", "scale_w"])
def test_a_gradient_of_the_frozen_weight_is_sp0922_for_an_x_without_grad(what):
    """values (or scale_w) made to require grad, x not: y had no graph, so the gradient the weight asked
    for was left out without the SP0922 an x with grad gets."""
    layer = spt.SparseLinear.from_dense(linear(16, 64, seed=8), "e4m3")
    getattr(layer, what).requires_grad_()
    y = layer(torch.randn(2, 64).to(torch.bfloat16))
    with pytest.raises(IntegrationError) as info:
        y.float().sum().backward()
    assert (info.value.code, info.value.message) == (
        "SP0922", f"sparse_linear has no gradient for {what}: the sparse weight is frozen (an inference layer)")


HELP_FP8_X = ("call torch.ops.sparsile.sparse_linear_e4m3(x, values, meta, bias, scale_w) on the 16-bit x instead "
              "of quantize_per_token_e4m3 then sparse_linear; a graph traced by make_fx or torch.jit.trace with an x "
              "that did not require grad holds those two ops: trace it with an x that requires grad (torch.export "
              "and torch.compile need nothing)")


def test_the_op_refuses_gradients_of_values_and_of_an_fp8_x():
    layer = spt.SparseLinear.from_dense(linear(16, 64, seed=9))
    values = layer.values.detach().clone().requires_grad_()
    y = torch.ops.sparsile.sparse_linear(torch.randn(2, 64).to(torch.bfloat16), values, layer.meta)
    with pytest.raises(IntegrationError, match="no gradient for values"):
        y.float().sum().backward()
    fp8 = spt.SparseLinear.from_dense(linear(16, 64, seed=9), "e4m3")
    xq, scale = torch.ops.sparsile.quantize_per_token_e4m3(torch.randn(2, 64).requires_grad_())
    y = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, None, scale, fp8.scale_w)
    with pytest.raises(IntegrationError) as info:
        y.float().sum().backward()
    assert (info.value.code, info.value.message) == (
        "SP0922", "sparse_linear has no gradient for an fp8 x (it would be fp8 too, 3 mantissa bits): an e4m3 "
                  "SparseLinear, eager or traced, passes its 16-bit x's gradient straight through the quantizer")
    assert info.value.help == HELP_FP8_X
    # (it said "run this backward eagerly": a traced e4m3 SparseLinear refused x's gradient until it ran
    # sparse_linear_e4m3)


@pytest.mark.parametrize("activation", [None, "silu", "swiglu"])
def test_the_e4m3_op_gives_x_the_layer_s_straight_through_gradient(activation):
    """torch.ops.sparsile.sparse_linear_e4m3 on a 16-bit x (what a traced e4m3 layer whose x requires
    grad runs): y is quantize_per_token_e4m3 then sparse_linear's, bit for bit; x's gradient (in x's
    dtype) and a trainable bias's are the eager layer's (LayerWithInputGrad), bit for bit; a scale_w
    that requires grad is SP0922."""
    rows = 64 if activation == "swiglu" else 48
    layer = spt.SparseLinear.from_dense(linear(rows, 64, seed=39), "e4m3",
                                        activation=None if activation == "swiglu" else activation)
    if activation == "swiglu":  # (the gated layer of a fused MLP: its [gate; up] rows with the gated activation)
        from sparsile.integrations.torch.glu import GatedLinear

        layer = GatedLinear.over(layer, "swiglu")
    gen = torch.Generator().manual_seed(40)
    x = torch.randn(2, 3, 64, generator=gen).to(torch.float16)
    bias = torch.nn.Parameter(layer.bias.detach().clone())
    layer.bias = bias
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    apart = torch.ops.sparsile.sparse_linear(xq, layer.values, layer.meta, bias.detach(), sx, layer.scale_w,
                                             activation=activation, out_dtype=torch.float16)
    xo = x.clone().requires_grad_()
    y = torch.ops.sparsile.sparse_linear_e4m3(xo, layer.values, layer.meta, bias, layer.scale_w,
                                              activation=activation, out_dtype=torch.float16)
    assert torch.equal(y, apart)
    g = torch.randn(y.shape, generator=gen).to(y.dtype)
    y.backward(g)
    op_bias_grad, bias.grad = bias.grad, None
    xe = x.clone().requires_grad_()
    eager = layer(xe)
    assert torch.equal(eager, y)
    eager.backward(g)
    assert xo.grad.dtype == torch.float16 and torch.equal(xo.grad, xe.grad)
    assert torch.equal(op_bias_grad, bias.grad)
    scale_w = layer.scale_w.detach().clone().requires_grad_()  # (fp8 values cannot require grad)
    y = torch.ops.sparsile.sparse_linear_e4m3(x.clone().requires_grad_(), layer.values, layer.meta, None, scale_w,
                                              activation=activation)
    with pytest.raises(IntegrationError) as info:
        y.float().sum().backward()
    assert (info.value.code, info.value.message) == (
        "SP0922", "sparse_linear has no gradient for scale_w: the sparse weight is frozen (an inference layer)")


def test_a_llama_s_input_gradient_equals_the_dense_model_s():
    """The gradient of a transformers Llama's input embeddings through its sparse projections (plain,
    then fused with the SwiGLU epilogue) is as close to the float64 dense model with the same pruned
    weights as the bf16 dense model's is (before autograd.py: 65 % off, the projections' branches
    missing from it)."""
    from sparsile.tests.integrations.test_torch_fuse import tiny_llama

    model = tiny_llama()  # its projections sparse; the dense twin gets the same pruned weights
    dense = copy.deepcopy(model)
    for name, m in list(dense.named_modules()):
        if isinstance(m, spt.SparseLinear):
            parent, _, child = name.rpartition(".")
            setattr(dense.get_submodule(parent), child, dense_twin(m))
    ids = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))

    def input_grad(mdl) -> torch.Tensor:
        emb = mdl.get_input_embeddings()(ids).detach().requires_grad_()
        out = mdl(inputs_embeds=emb).logits
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.dtype))
        return emb.grad.double()

    exact = input_grad(copy.deepcopy(dense).double())
    bf16_error = ((input_grad(dense) - exact).norm() / exact.norm()).item()
    fused = copy.deepcopy(model)
    assert spt.fuse_projections_(fused, glu=True).glu
    for sparse in (model, fused):
        error = ((input_grad(sparse) - exact).norm() / exact.norm()).item()
        assert error <= 1.25 * bf16_error, (error, bf16_error)


@pytest.mark.parametrize(("path", "activation"), [("layer", "relu"), ("layer", "silu"), ("op", "gelu_tanh"),
                                                   ("op", "swiglu")])
def test_a_second_derivative_through_an_activation_is_sp0922(path, activation):
    """create_graph=True through a frozen layer with an activation: d pre came from detached
    pre-activations, so x's gradient had no graph to x or dy (a second backward silently treated it
    as a constant, or failed with torch's 'does not require grad'); it is SP0922 now. Without an
    activation dx = dy @ W is linear in dy, and the second derivative is exact (float64)."""
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=5), "bf16", activation=activation if path == "layer"
                                        else None)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).requires_grad_()
    op_activation = [activation]

    def run(t):
        if path == "layer":
            return layer(t)
        return torch.ops.sparsile.sparse_linear(t, layer.values, layer.meta, layer.bias, activation=op_activation[0])

    (gx,) = torch.autograd.grad(run(x).float().pow(2).sum(), x, create_graph=True)
    with pytest.raises(IntegrationError) as info:
        (gx.float().pow(2).sum() + run(x).float().sum()).backward()
    assert info.value.code == "SP0922"
    assert f"sparse_linear has no second derivative with activation {activation!r}" in info.value.message
    layer.activation = op_activation[0] = None
    (gx,) = torch.autograd.grad(run(x).float().pow(2).sum(), x, create_graph=True)
    gx.float().pow(2).sum().backward()
    w = layer.to_dense().double()
    xr = x.detach().double().requires_grad_()
    (gr,) = torch.autograd.grad((xr @ w.T + layer.bias.double()).pow(2).sum(), xr, create_graph=True)
    gr.pow(2).sum().backward()
    assert_close(x.grad, xr.grad, torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# a layer tensor made an nn.Parameter (``layer.bias = nn.Parameter(b)``: torch moves it out of _buffers)


def _bias_grad_reference(layer, x: torch.Tensor, g: torch.Tensor, activation) -> torch.Tensor:
    """d bias = Σ_tokens act'(pre) * g in float64, at the pre-activations the layer computes."""
    with torch.no_grad():
        pre = layer._forward_op(x, pre=True)
    p = pre.double().requires_grad_()
    (d_pre,) = torch.autograd.grad(ACTS[activation](p), p, g.double().reshape(p.shape))
    return d_pre.sum(0)


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("weight", ["bf16", "e4m3"])
def test_a_bias_made_a_parameter_is_the_layer_s_trainable_bias(weight, activation):
    """``layer.bias = nn.Parameter(b)``, the way to train a bias that ``model.parameters()`` (an
    optimizer) sees: torch moves the name from ``_buffers`` to ``_parameters``, and the eager call read
    ``_buffers["bias"]``: a KeyError on the second call without grad (on the first with it). It is the
    layer's bias now: its numbers on every call, its gradient through the eager layer and through the
    op (torch.compile's path), and x's."""
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=5), weight, activation=activation)
    gen = torch.Generator().manual_seed(6)
    bias = torch.nn.Parameter(torch.rand(48, generator=gen) + 0.5)
    layer.bias = bias
    assert layer.bias is bias and [name for name, _ in layer.named_parameters()] == ["bias"]
    x = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        for _ in range(3):  # the first call binds the weight, the next ones check it and take the last call's
            check_against_float64(layer, x, layer(x))
    y = layer(x)  # grad mode on and a bias that requires grad: through autograd.py
    assert y.requires_grad
    check_against_float64(layer, x, y.detach())
    g = torch.randn(y.shape, generator=gen).to(y.dtype)
    y.backward(g)
    want = _bias_grad_reference(layer, x, g, activation)
    assert bias.grad is not None and bias.grad.dtype == torch.float32
    assert torch.allclose(bias.grad.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    bias.grad = None
    xg = x.clone().requires_grad_()  # (e4m3: sparse_linear_e4m3, x's gradient straight through; it was SP0922)
    layer._forward_op(xg).backward(g)  # the custom op, what torch.compile traces
    assert torch.allclose(bias.grad.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    with torch.no_grad():
        pre = layer._forward_op(x, pre=True)
    assert_close(xg.grad.reshape(6, 64), reference_dx(layer, pre, g, activation), torch.bfloat16)
    with torch.no_grad():  # an optimizer's step writes the parameter in place: the next call reads it
        bias.add_(1.0)
        check_against_float64(layer, x, layer(x))


class _Affine(torch.nn.Module):
    """A parametrization: 3 t + 1."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t * 3 + 1


@pytest.mark.parametrize("called_before", [False, True])
def test_a_parametrized_bias_is_the_layer_s_bias(called_before):
    """``torch.nn.utils.parametrize.register_parametrization(layer, "bias", p)``: torch moves the bias
    out of the layer's buffers (into ``layer.parametrizations.bias.original``) and computes it on each
    access, and the eager call read ``_buffers["bias"]``: a KeyError at the first call with grad mode
    on, at the second without. The call computes with the parametrized bias (a new tensor each call,
    so the layer rebinds each call), follows in-place writes of the original and passes the bias's
    gradient through the parametrization to the original."""
    from torch.nn.utils import parametrize

    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=15))
    gen = torch.Generator().manual_seed(16)
    x = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    if called_before:
        with torch.no_grad():
            layer(x)
    layer.bias = torch.nn.Parameter(torch.rand(48, generator=gen) - 0.5)
    parametrize.register_parametrization(layer, "bias", _Affine())
    original = layer.parametrizations.bias.original
    with torch.no_grad():
        for step in range(3):  # each call computes the bias again: a write to the original is seen
            original.add_(0.25 * step)
            check_against_float64(layer, x, layer(x))
            assert torch.equal(layer.bias, original * 3 + 1)
    y = layer(x)
    check_against_float64(layer, x, y.detach())
    g = torch.randn(y.shape, generator=gen).to(y.dtype)
    y.backward(g)
    want = 3 * g.double().reshape(-1, 48).sum(0)
    assert torch.allclose(original.grad.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    with parametrize.cached():
        with torch.no_grad():
            check_against_float64(layer, x, layer(x))


def test_a_bias_parameter_trains_through_torch_compile():
    """torch.compile of a layer whose bias is an nn.Parameter: the op gets the parameter, and its gradient."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=9))
    gen = torch.Generator().manual_seed(10)
    layer.bias = torch.nn.Parameter(torch.rand(48, generator=gen) + 0.5)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    g = torch.randn(5, 48, generator=gen).to(torch.bfloat16)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    with torch.no_grad():
        assert torch.equal(y, layer(x))
    y.backward(g)
    want = _bias_grad_reference(layer, x, g, None)
    assert torch.allclose(layer.bias.grad.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


class _UpstreamThenSparse(torch.nn.Module):
    """A trainable nn.Linear feeding a frozen SparseLinear (with a trainable bias): the sparse layer's x
    requires grad, so a backward needs x's gradient through the weight (``dense_weight``)."""

    def __init__(self, activation):
        super().__init__()
        self.pre = linear(64, 64, seed=15)
        self.sparse = spt.SparseLinear.from_dense(linear(48, 64, seed=16), activation=activation)
        self.sparse.bias = torch.nn.Parameter(self.sparse.bias.clone())

    def forward(self, x):
        return self.sparse(self.pre(x))


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_a_compiled_training_step_gives_the_eager_gradients(activation):
    """torch.compile(fullgraph=True) of a forward and backward whose sparse layer's x requires grad:
    the backward AOTAutograd traces decompresses the weight through the op ``sparsile::dense_weight``
    (fake: its shape). Before, it read the FunctionalTensor's memory on the host: SP0804 at compile
    time. The gradients are the eager ones, bit for bit (the same kernel and float32 GEMM)."""
    assert_compiled_gradients_equal_eager(_UpstreamThenSparse(activation), seed=17)


def assert_compiled_gradients_equal_eager(model: torch.nn.Module, seed: int) -> None:
    """The gradients of x (2, 3, 64), of ``model.pre``'s weight and bias and of ``model.sparse``'s bias
    for dy (2, 3, 48): torch.compile(model, aot_eager, fullgraph) gives the eager ones, bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16).requires_grad_()
    g = torch.randn(2, 3, 48, generator=gen).to(torch.bfloat16)

    def grads(module):
        model.zero_grad(set_to_none=True)
        x.grad = None
        module(x).backward(g)
        return [x.grad, model.pre.weight.grad, model.pre.bias.grad, model.sparse.bias.grad]

    eager = grads(model)
    torch._dynamo.reset()
    compiled = grads(torch.compile(model, backend="aot_eager", fullgraph=True))
    for want, got in zip(eager, compiled):
        assert got is not None and got.dtype == want.dtype and torch.equal(got, want)


def test_a_bias_parameter_round_trips_through_the_state_dict():
    """The state dict of a layer whose bias is a parameter has the same keys (a plain layer loads it);
    loading into it copies into the parameter (an optimizer's tensor stays the layer's) and the next
    call, after launch records were built, computes with the loaded weight."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=11))
    bias = torch.nn.Parameter(torch.rand(48, generator=torch.Generator().manual_seed(12)) + 0.5)
    layer.bias = bias
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    state = layer.state_dict()
    assert sorted(state) == ["bias", "meta", "values"]
    plain = spt.SparseLinear(64, 48)
    plain.load_state_dict(state)
    other = spt.SparseLinear.from_dense(linear(48, 64, seed=14))
    with torch.no_grad():
        assert torch.equal(plain(x), layer(x))
        layer(x)
        layer.load_state_dict(other.state_dict())
        assert layer.bias is bias and torch.equal(bias, other.bias)
        assert torch.equal(layer(x), other(x)) and torch.equal(layer(x), other(x))


@pytest.mark.parametrize("what", ["values", "meta", "scale_w"])
def test_frozen_weight_tensors_made_parameters(what):
    """values, meta or scale_w made an nn.Parameter: without requires_grad (an int32 meta can have none)
    the layer computes as before, every call; values or scale_w that require grad are SP0922 at
    ``backward()``, as a buffer that requires grad is (before: a KeyError at the call)."""
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=15), "e4m3")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(16)).to(torch.bfloat16)
    setattr(layer, what, torch.nn.Parameter(getattr(layer, what).detach(), requires_grad=False))
    for _ in range(3):  # grad mode on, nothing requires grad: the plain launch
        y = layer(x)
        assert not y.requires_grad
        check_against_float64(layer, x, y)
    if what == "meta":
        return
    getattr(layer, what).requires_grad_()
    y = layer(x)
    with pytest.raises(IntegrationError) as info:
        y.float().sum().backward()
    assert (info.value.code, info.value.message) == (
        "SP0922", f"sparse_linear has no gradient for {what}: the sparse weight is frozen (an inference layer)")


# ------------------------------------------------------------------------------------------------
# torch.func: grad, vjp, jacrev and vmap of grad through a layer (x a GradTrackingTensor or a BatchedTensor)


def _float64_layer(layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """activation(x @ W_pruned.T + bias) in float64 (W times scale_w for e4m3; x as given, unquantized:
    the gradient passes the e4m3 quantizer straight through)."""
    bias = layer.bias if bias is None else bias
    pre = x.double() @ layer.to_dense().double().T + (0 if bias is None else bias.double())
    return ACTS[layer.activation](pre.reshape(-1, pre.shape[-1])).reshape(*x.shape[:-1], -1)


def _func_case(weight, activation, has_bias, seed):
    """A small layer, a random N-D x (never zeros) and a random cotangent of y's shape (float32 numbers
    that bf16 holds: sum(y.float() * g) hands y the same dy)."""
    layer = spt.SparseLinear.from_dense(linear(16, 32, bias=has_bias, seed=seed), weight, activation=activation)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(2, 3, 32, generator=gen).to(torch.bfloat16)
    g = torch.randn(2, 3, 16, generator=gen).to(torch.bfloat16).float()
    return layer, x, g


def _eager_dx(layer, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    xe = x.clone().requires_grad_()
    layer(xe).float().mul(g).sum().backward()
    return xe.grad


def _float64_dx(layer, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """x's gradient of sum(y * g) in float64 at the pre-activations the layer computes (reference_dx),
    checked against the float64 layer's own gradient where the activation is smooth."""
    with torch.no_grad():
        pre = layer._forward_op(x, pre=True)
    ref = reference_dx(layer, pre, g, layer.activation).reshape(x.shape)
    if layer.activation != "relu" and layer.weight_dtype != "e4m3":  # (relu's kink, e4m3's quantized x move pre)
        xr = x.double().requires_grad_()
        (direct,) = torch.autograd.grad(_float64_layer(layer, xr).mul(g.double()).sum(), xr)
        assert torch.allclose(direct, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    return ref


@pytest.mark.parametrize(("weight", "activation", "has_bias"), [
    ("bf16", None, True), ("bf16", "relu", False), ("f16", "silu", True), ("bf16", "gelu_tanh", True),
    ("e4m3", "silu", True), ("e4m3", None, False)])
def test_torch_func_grad_vjp_and_jacrev_through_a_layer(weight, activation, has_bias):
    """torch.func.grad, vjp and jacrev with respect to x (N-D) give the eager gradient, which is the float64
    one within bf16's rounding; the forward under the transform is the layer's. Before, each stopped at
    torch's RuntimeError (an autograd.Function without setup_context: the op's register_autograd one, or
    for e4m3 the quantizer's)."""
    layer, x, g = _func_case(weight, activation, has_bias, seed=21)
    if weight == "f16":
        x = x.half()
    eager = _eager_dx(layer, x, g)
    ref = _float64_dx(layer, x, g)
    assert_close(eager, ref, x.dtype)

    got = torch.func.grad(lambda t: layer(t).float().mul(g).sum())(x)
    assert got.dtype == x.dtype and torch.equal(got, eager)
    y, vjp_fn = torch.func.vjp(layer, x)
    with torch.no_grad():
        assert torch.equal(y, layer(x))
    (got,) = vjp_fn(g.to(y.dtype))  # (g rounded to y's dtype: the eager gradient of that g)
    assert torch.equal(got, _eager_dx(layer, x, g.to(y.dtype).float()))
    assert_close(got, ref, x.dtype)
    jac = torch.func.jacrev(lambda t: layer(t).float())(x[0, :2])  # (2, 16, 2, 32)
    for i in range(2):  # each token's rows: g one-hot, against the eager vjp
        for n in (0, 7, 15):
            one_hot = torch.zeros(2, 16)
            one_hot[i, n] = 1
            assert torch.equal(jac[i, n], _eager_dx(layer, x[0, :2], one_hot))


@pytest.mark.parametrize(("weight", "activation"), [("bf16", "silu"), ("e4m3", "relu")])
def test_torch_func_vmap_of_grad_gives_per_sample_gradients(weight, activation):
    """vmap(grad(f)) over a batch of x (per-sample gradients): each sample's is the eager one (the
    op's forward and the backward run under vmap, the kernel per sample)."""
    layer, x, g = _func_case(weight, activation, True, seed=23)
    got = torch.func.vmap(torch.func.grad(lambda t, w: layer(t).float().mul(w).sum()))(x, g)
    assert got.shape == x.shape
    for b in range(x.shape[0]):
        assert torch.equal(got[b], _eager_dx(layer, x[b], g[b]))
    # and grad of a vmapped function (BatchedTensor inside GradTrackingTensor)
    got = torch.func.grad(lambda t: torch.func.vmap(layer)(t).float().mul(g).sum())(x)
    assert torch.equal(got, _eager_dx(layer, x, g))


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_torch_func_grad_of_a_trainable_bias(activation):
    """A bias made an nn.Parameter: torch.func.grad of x and of the bias (torch.func.functional_call)
    give the eager gradients and the float64 ones; the forward computes with the bias it was given."""
    layer, x, g = _func_case("bf16", activation, True, seed=25)
    layer.bias = torch.nn.Parameter(layer.bias.detach().clone())
    xe = x.clone().requires_grad_()
    layer(xe).float().mul(g).sum().backward()
    eager_bias = layer.bias.grad.clone()
    want = _bias_grad_reference(layer, x, g, activation)
    assert torch.allclose(eager_bias.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())

    got = torch.func.grad(lambda t: layer(t).float().mul(g).sum())(x)
    assert torch.equal(got, xe.grad)

    def loss(params, t):
        return torch.func.functional_call(layer, params, (t,)).float().mul(g).sum()

    bias = layer.bias.detach().clone()
    grads = torch.func.grad(loss, argnums=(0, 1))({"bias": bias}, x)
    assert torch.equal(grads[0]["bias"], eager_bias) and torch.equal(grads[1], xe.grad)
    other = bias + 1.5  # the bias passed in is the one used: forward and gradient
    y, vjp_fn = torch.func.vjp(lambda b: torch.func.functional_call(layer, {"bias": b}, (x,)), other)
    with torch.no_grad():
        assert torch.allclose(y.double(), _float64_layer(layer, x, other), rtol=2e-2, atol=2e-2)
        pre = layer._forward_op(x, pre=True) + 1.5
    p = pre.double().requires_grad_()
    (d_pre,) = torch.autograd.grad(ACTS[activation](p), p, g.double().reshape(p.shape))
    (got,) = vjp_fn(g.to(y.dtype))
    assert torch.allclose(got.double(), d_pre.sum(0), rtol=2e-2, atol=2e-2 * d_pre.abs().max().item())


@pytest.mark.parametrize("what", ["values", "scale_w"])
def test_torch_func_grad_of_the_frozen_weight_is_sp0922(what):
    """torch.func.grad with respect to values (a bf16 layer's) or scale_w (an e4m3 layer's), through
    torch.func.functional_call: SP0922, never a zero gradient."""
    layer, x, _ = _func_case("bf16" if what == "values" else "e4m3", None, True, seed=27)

    def loss(t):
        return torch.func.functional_call(layer, {what: t}, (x,)).float().sum()

    with pytest.raises(IntegrationError) as info:
        torch.func.grad(loss)(getattr(layer, what).detach().clone())
    assert (info.value.code, info.value.message) == (
        "SP0922", f"sparse_linear has no gradient for {what}: the sparse weight is frozen (an inference layer)")


@pytest.mark.parametrize("activation", [None, "silu"])
def test_torch_func_second_derivatives(activation):
    """grad of grad: exact without an activation (x's gradient is linear in dy), SP0922 with one (it is
    computed from detached pre-activations), as with create_graph=True; forward mode (jvp, jacfwd) is
    SP0922 with a message that says what to use, not torch's NotImplementedError."""
    layer, x, _ = _func_case("bf16", activation, True, seed=29)
    x = x[0]

    def f(t):
        return layer(t).float().pow(2).sum()

    def gg(t):
        return torch.func.grad(f)(t).float().pow(2).sum()

    if activation is None:
        xr = x.double().requires_grad_()
        w = layer.to_dense().double()
        (gr,) = torch.autograd.grad((xr @ w.T + layer.bias.double()).pow(2).sum(), xr, create_graph=True)
        (want,) = torch.autograd.grad(gr.pow(2).sum(), xr)
        assert_close(torch.func.grad(gg)(x), want, torch.bfloat16)
    else:
        with pytest.raises(IntegrationError) as info:
            torch.func.grad(gg)(x)
        assert info.value.code == "SP0922"
        assert "sparse_linear has no second derivative with activation 'silu'" in info.value.message
    with pytest.raises(IntegrationError) as info:
        torch.func.jvp(layer, (x,), (torch.ones_like(x),))
    assert info.value.code == "SP0922" and "forward-mode" in info.value.message


def _mixed_nestings(loss):
    """Second derivatives of ``loss(x, b)`` that cross the two variables over nested levels: a
    torch.func transform over one inside a transform (or torch.autograd.grad) over the other."""
    grad, jacrev = torch.func.grad, torch.func.jacrev

    def autograd_outer(x, b):  # torch.func.grad in x inside a plain backward in b
        b = b.clone().requires_grad_()
        (got,) = torch.autograd.grad(grad(loss, 0)(x, b).float().pow(2).sum(), b)
        return got

    return {
        "jacrev_b(grad_x)": lambda x, b: jacrev(lambda c: grad(loss, 0)(x, c).float())(b),
        "jacrev_x(grad_b)": lambda x, b: jacrev(lambda t: grad(loss, 1)(t, b).float())(x),
        "grad_b(sq grad_x)": lambda x, b: grad(lambda c: grad(loss, 0)(x, c).float().pow(2).sum())(b),
        "vjp_b(grad_x)": lambda x, b: torch.func.vjp(lambda c: grad(loss, 0)(x, c).float(), b)[1](
            torch.linspace(-1, 1, x.numel()).reshape(x.shape))[0],
        "autograd_b(func grad_x)": autograd_outer,
    }


@pytest.mark.parametrize("nesting", ["jacrev_b(grad_x)", "jacrev_x(grad_b)", "grad_b(sq grad_x)", "vjp_b(grad_x)",
                                     "autograd_b(func grad_x)"])
@pytest.mark.parametrize(("path", "activation"), [("layer", "silu"), ("layer", "gelu_tanh"), ("op", "silu"),
                                                   ("op", "gelu_tanh"), ("layer", None), ("op", None)])
def test_mixed_second_derivatives_across_nested_levels(path, activation, nesting):
    """A second derivative in the bias through x's gradient (or in x through the bias's) across nested
    torch.func levels, with a loss linear in y (so dy does not depend on the outer variable): with an
    activation, x's and the bias's gradients come from detached pre-activations, and the inner level's
    backward saw the outer variable (a GradTrackingTensor of the outer level, or a plain tensor that
    requires grad under torch.func.grad) as requiring no grad, so no refusal was attached: a zero
    block, or torch's 'appears to not have been used in the graph'; it is SP0922 now. Without an
    activation (gradients linear in dy) the mixed derivatives are exact: float64 of the dense layer by
    torch's own autograd, with a loss quadratic in y (nonzero)."""
    layer, x, _ = _func_case("bf16", activation if path == "layer" else None, True, seed=31)
    x = x[0]
    bias = (torch.rand(16, generator=torch.Generator().manual_seed(32)) + 0.5).float()
    g = torch.randn(3, 16, generator=torch.Generator().manual_seed(33)).to(torch.bfloat16).float()
    w = layer.to_dense().double()

    def sparse(t, b):
        if path == "layer":
            return torch.func.functional_call(layer, {"bias": b}, (t,)).float()
        return torch.ops.sparsile.sparse_linear(t, layer.values, layer.meta, b, activation=activation).float()

    def dense(t, b):
        return ACTS[activation](t.double() @ w.T + b.double())

    if activation is None:
        want = _mixed_nestings(lambda t, b: dense(t, b).pow(2).sum())[nesting](x.double(), bias.double())
        got = _mixed_nestings(lambda t, b: sparse(t, b).pow(2).sum())[nesting](x, bias)
        assert want.abs().max() > 0 and got.shape == want.shape
        assert torch.allclose(got.double(), want, rtol=3e-2, atol=3e-2 * want.abs().max().item())
        return
    want = _mixed_nestings(lambda t, b: dense(t, b).mul(g).sum())[nesting](x.double(), bias.double())
    assert want.abs().max() > 1e-3  # the true mixed derivative is no zero: silu'' and gelu'' are not
    with pytest.raises(IntegrationError) as info:
        _mixed_nestings(lambda t, b: sparse(t, b).mul(g).sum())[nesting](x, bias)
    assert info.value.code == "SP0922"
    assert f"sparse_linear has no second derivative with activation {activation!r}" in info.value.message
    assert "differentiate twice through a layer without a fused activation" in info.value.help


@pytest.mark.parametrize("fuse", [None, "glu", "glu_traced"])
def test_torch_func_grad_of_a_llama_s_input(fuse):
    """torch.func.grad of a transformers Llama's loss with respect to its input embeddings, through its
    sparse projections (unfused; fuse_projections_ with the SwiGLU epilogue, eager or traced=True: the
    fused [gate; up] layer, GatedLinear): as close to the float64 dense model with the same pruned
    weights as the bf16 dense model's own torch.func gradient is."""
    from sparsile.tests.integrations.test_torch_fuse import tiny_llama

    model = tiny_llama()
    dense = copy.deepcopy(model)
    for name, m in list(dense.named_modules()):
        if isinstance(m, spt.SparseLinear):
            parent, _, child = name.rpartition(".")
            setattr(dense.get_submodule(parent), child, dense_twin(m))
    if fuse is not None:
        assert spt.fuse_projections_(model, glu=True, traced=fuse == "glu_traced").glu
    ids = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))
    g = torch.randn(2, 5, 61, generator=torch.Generator().manual_seed(3))

    def input_grad(mdl) -> torch.Tensor:
        emb = mdl.get_input_embeddings()(ids).detach()
        return torch.func.grad(lambda e: mdl(inputs_embeds=e).logits.double().mul(g.double()).sum())(emb).double()

    exact = input_grad(copy.deepcopy(dense).double())
    bf16_error = ((input_grad(dense) - exact).norm() / exact.norm()).item()
    error = ((input_grad(model) - exact).norm() / exact.norm()).item()
    assert error <= 1.25 * bf16_error, (error, bf16_error)


# ------------------------------------------------------------------------------------------------
# torch.func on the ops called directly (torch.ops.sparsile.sparse_linear, sparse_linear_e4m3)


def _op_case(weight, activation, has_bias, seed):
    """A layer (its values, meta, scale_w fed to the op by hand), the op's callable y = op(x, bias), a
    random x (2, 3, K) and a random cotangent g of y's shape. Gated: the 2F = 32 rows [gate; up], y F."""
    layer = spt.SparseLinear.from_dense(linear(32, 32, bias=has_bias, seed=seed), weight)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(2, 3, 32, generator=gen).to(torch.float16 if weight == "f16" else torch.bfloat16)
    rows = 16 if activation in ("swiglu", "geglu") else 32
    g = torch.randn(2, 3, rows, generator=gen).to(torch.bfloat16).float()

    def op(t, bias=layer.bias, **kw):
        if weight == "e4m3":
            return torch.ops.sparsile.sparse_linear_e4m3(t, layer.values, layer.meta, bias, layer.scale_w,
                                                         activation=activation, **kw)
        return torch.ops.sparsile.sparse_linear(t, layer.values, layer.meta, bias, activation=activation, **kw)

    return layer, op, x, g


def _autograd_grads(op, x, bias, g):
    """(x's gradient, the bias's) of sum(op(x, bias) * g) by torch.autograd (backward())."""
    xe = x.clone().requires_grad_()
    b = None if bias is None else bias.detach().clone().requires_grad_()
    op(xe, b).float().mul(g).sum().backward()
    return xe.grad, None if b is None else b.grad


@pytest.mark.parametrize(("weight", "activation", "has_bias"), [
    ("bf16", None, True), ("bf16", "relu", False), ("f16", "silu", True), ("bf16", "gelu_tanh", True),
    ("bf16", "swiglu", True), ("e4m3", "geglu", True), ("e4m3", None, False)])
def test_torch_func_on_the_op_called_directly(weight, activation, has_bias):
    """torch.func.grad, vjp, jacrev and vmap(grad) of torch.ops.sparsile.sparse_linear (sparse_linear_e4m3
    for e4m3: x's straight-through gradient) called directly: x's gradient, and a bias's, are the ones
    torch.autograd gives the op (bit for bit), which are the float64 ones within x's rounding. Before,
    each stopped at torch's RuntimeError ("In order to use an autograd.Function with functorch transforms
    ... it must override the setup_context staticmethod": the op's register_autograd formula)."""
    layer, op, x, g = _op_case(weight, activation, has_bias, seed=41)
    dx, db = _autograd_grads(op, x, layer.bias, g)
    with torch.no_grad():  # the pre-activations the op computes (of the quantized x for e4m3), float32
        xk, sx = torch.ops.sparsile.quantize_per_token_e4m3(x) if weight == "e4m3" else (x, None)
        pre = torch.ops.sparsile.sparse_linear(xk, layer.values, layer.meta, layer.bias, sx, layer.scale_w,
                                               out_dtype=torch.float32)
    assert_close(dx.reshape(6, 32), reference_dx(layer, pre.reshape(6, -1), g, activation), x.dtype)

    got = torch.func.grad(lambda t: op(t).float().mul(g).sum())(x)
    assert got.dtype == x.dtype and torch.equal(got, dx)
    y, vjp_fn = torch.func.vjp(op, x)
    with torch.no_grad():
        assert torch.equal(y, op(x))
    (got,) = vjp_fn(g.to(y.dtype))
    assert torch.equal(got, dx)
    jac = torch.func.jacrev(lambda t: op(t).float())(x[0, :2])  # (2, rows, 2, 32)
    for i in range(2):
        for n in (0, 7, g.shape[-1] - 1):
            one_hot = torch.zeros(2, g.shape[-1])
            one_hot[i, n] = 1
            assert torch.equal(jac[i, n], _autograd_grads(op, x[0, :2], layer.bias, one_hot)[0])
    got = torch.func.vmap(torch.func.grad(lambda t, w: op(t).float().mul(w).sum()))(x, g)
    for b in range(x.shape[0]):
        assert torch.equal(got[b], _autograd_grads(op, x[b], layer.bias, g[b])[0])
    if has_bias:
        grads = torch.func.grad(lambda t, b: op(t, b).float().mul(g).sum(), argnums=(0, 1))(x, layer.bias)
        # (the bias's, float32, within an ulp or so: under torch.func the activation's derivative is
        # torch.func.vjp's, whose float32 rounding can differ from torch.autograd's by an ulp)
        assert torch.equal(grads[0], dx)
        assert torch.allclose(grads[1], db, rtol=0, atol=2.0 ** -20 * db.abs().max().item())


def test_torch_func_on_the_op_refuses_what_autograd_refuses():
    """Called directly under torch.func: values' gradient is SP0922 (not zero); grad of grad is exact
    without an activation and SP0922 with one; forward mode (torch.func.jvp, and a dual x of
    torch.autograd.forward_ad) is SP0922, as for the layer; so is a gradient through the fp8 quantizer
    (quantize_per_token_e4m3). Before, torch.func.grad stopped at torch's RuntimeError (the quantizer's
    too), and forward mode returned y with a zero tangent (jvp) or none (forward_ad): the
    directional derivative silently dropped."""
    import torch.autograd.forward_ad as fwad

    layer, op, x, _ = _op_case("bf16", None, True, seed=43)
    x = x[0]
    with pytest.raises(IntegrationError) as info:
        torch.func.grad(lambda v: torch.ops.sparsile.sparse_linear(x, v, layer.meta).float().sum())(
            layer.values.detach().clone())
    assert (info.value.code, info.value.message) == (
        "SP0922", "sparse_linear has no gradient for values: the sparse weight is frozen (an inference layer)")

    def gg(t, activation):
        inner = torch.func.grad(lambda s: torch.ops.sparsile.sparse_linear(
            s, layer.values, layer.meta, layer.bias, activation=activation).float().pow(2).sum())
        return inner(t).float().pow(2).sum()

    xr = x.double().requires_grad_()
    w = layer.to_dense().double()
    (gr,) = torch.autograd.grad((xr @ w.T + layer.bias.double()).pow(2).sum(), xr, create_graph=True)
    (want,) = torch.autograd.grad(gr.pow(2).sum(), xr)
    assert_close(torch.func.grad(gg)(x, None), want, torch.bfloat16)
    with pytest.raises(IntegrationError) as info:
        torch.func.grad(gg)(x, "silu")
    assert info.value.code == "SP0922"
    assert "sparse_linear has no second derivative with activation 'silu'" in info.value.message

    fp8 = spt.SparseLinear.from_dense(linear(32, 32, seed=44), "e4m3")

    def quantized_then_op(t):
        xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(t)
        return torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, None, sx, fp8.scale_w).float().sum()

    with pytest.raises(IntegrationError) as info:  # (the quantizer and the op apart: an fp8 x's gradient)
        torch.func.grad(quantized_then_op)(x)
    assert info.value.code == "SP0922" and "sparse_linear has no gradient for an fp8 x" in info.value.message
    with pytest.raises(IntegrationError) as info:
        torch.func.grad(lambda t: torch.ops.sparsile.quantize_per_token_e4m3(t)[1].sum())(x)
    assert (info.value.code, info.value.message) == (
        "SP0922", "sparse_linear has no gradient for x through quantize_per_token_e4m3 (an fp8 x): SparseLinear "
                  "passes x's gradient straight through its quantizer by the op sparse_linear_e4m3, which takes the "
                  "16-bit x: the sparse weight is frozen (an inference layer)")

    with pytest.raises(IntegrationError) as info:
        torch.func.jvp(op, (x,), (torch.ones_like(x),))
    assert info.value.code == "SP0922" and "forward-mode" in info.value.message
    with fwad.dual_level():
        assert torch.equal(op(x), layer(x))  # a plain x inside the level: the plain call
        with pytest.raises(IntegrationError) as info:
            op(fwad.make_dual(x, torch.ones_like(x)))
    assert info.value.code == "SP0922" and "forward-mode" in info.value.message


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("weight", ["bf16", "e4m3"])
def test_eager_forward_mode_ad_is_refused_not_dropped(weight, requires_grad):
    """torch.autograd.forward_ad on an eager call: a dual x (whether or not it also requires grad) gets
    SP0922 with what to use instead; before, an x that did not require grad launched the kernel and y
    came back with no tangent (the directional derivative silently dropped). A call inside dual_level
    with a plain x still runs, and a call after the level is closed is the plain eager call."""
    import torch.autograd.forward_ad as fwad

    layer, x, _ = _func_case(weight, None, True, seed=31)
    want = layer(x)
    with fwad.dual_level():
        plain = layer(x)  # no tangent on x: nothing to differentiate
        dual = fwad.make_dual(x.clone().requires_grad_(requires_grad), torch.ones_like(x))
        with pytest.raises(IntegrationError) as info:
            layer(dual)
    assert info.value.code == "SP0922" and "forward-mode" in info.value.message
    assert torch.equal(plain, want) and torch.equal(layer(x), want)


# ------------------------------------------------------------------------------------------------
# torch.compile of e4m3 layers: x's straight-through gradient (the op sparsile::sparse_linear_e4m3)


def _straight_through_bound(layer, pre: torch.Tensor, g: torch.Tensor, x_dtype: torch.dtype) -> torch.Tensor:
    """|dx - float64 dx| elementwise, from float64: dx rounded once to x's dtype (half an ulp of the
    float64 dx), and the float32 products and sum of d pre * scale_w @ W (rows terms: the float32
    GEMM's accumulation bound, on |d pre| @ |W|), d pre itself computed in float32 (the same)."""
    from sparsile.tests.integrations.torch_helpers import EPS as OUT_EPS

    p = pre.detach().double().requires_grad_()
    (d_pre,) = torch.autograd.grad(ACTS[layer.activation](p), p, g.double().reshape(p.shape[0], -1))
    ref = d_pre @ layer.to_dense().double()
    absprod = d_pre.abs() @ layer.to_dense().double().abs()
    return OUT_EPS[x_dtype] * ref.abs() + (layer.out_features + 3) * 2.0 ** -24 * absprod + 1e-30


@pytest.mark.parametrize(("activation", "has_bias", "x_dtype", "backend"), [
    (None, True, torch.bfloat16, "aot_eager"), (None, False, torch.bfloat16, "aot_eager"),
    ("silu", True, torch.bfloat16, "aot_eager"), ("gelu_tanh", False, torch.float16, "aot_eager"),
    ("relu", True, torch.float32, "aot_eager"), ("silu", False, torch.bfloat16, "eager")])
def test_a_compiled_e4m3_layer_gives_x_the_eager_straight_through_gradient(activation, has_bias, x_dtype, backend):
    """torch.compile(fullgraph=True) of an e4m3 layer whose (N-D) x requires grad: y is the eager
    layer's, bit for bit, and x's gradient the eager straight-through one (the quantizer taken as the
    identity), bit for bit, in x's dtype, within the rounding of the float64 straight-through gradient
    (at the pre-activations the kernel computes). Before, the traced path (quantize_per_token_e4m3,
    then sparse_linear on the fp8 x) refused it: SP0922 while AOTAutograd traced the backward."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, bias=has_bias, seed=41), "e4m3", activation=activation)
    gen = torch.Generator().manual_seed(42)
    x = torch.randn(2, 3, 64, generator=gen).to(x_dtype)
    g = torch.randn(2, 3, 48, generator=gen).to(x_dtype)
    xe = x.clone().requires_grad_()
    eager = layer(xe)
    eager.backward(g)
    torch._dynamo.reset()
    xc = x.clone().requires_grad_()
    y = torch.compile(layer, backend=backend, fullgraph=True)(xc)
    assert y.requires_grad and y.dtype == x_dtype and torch.equal(y, eager)
    y.backward(g)
    assert xc.grad is not None and xc.grad.dtype == x_dtype and xc.grad.shape == x.shape
    assert torch.equal(xc.grad, xe.grad)
    with torch.no_grad():
        pre = layer._forward_op(x, pre=True)
    ref = reference_dx(layer, pre, g, activation)
    bound = _straight_through_bound(layer, pre, g, x_dtype)
    err = (xc.grad.reshape(6, 64).double() - ref).abs()
    assert (err <= bound).all(), (err / bound).max().item()
    assert ref.abs().min() > 0  # (random non-zero inputs: no column of dx vanishes)
    assert layer.values.grad is None and (layer.bias is None or layer.bias.grad is None)


class _UpstreamThenE4m3(torch.nn.Module):
    """A trainable nn.Linear feeding a frozen e4m3 SparseLinear with a trainable bias and an activation."""

    def __init__(self, activation):
        super().__init__()
        self.pre = linear(64, 64, seed=43)
        self.sparse = spt.SparseLinear.from_dense(linear(48, 64, seed=44), "e4m3", activation=activation)
        self.sparse.bias = torch.nn.Parameter(self.sparse.bias.clone())

    def forward(self, x):
        return self.sparse(self.pre(x))


@pytest.mark.parametrize("activation", [None, "gelu_tanh"])
def test_a_compiled_training_step_through_an_e4m3_layer_gives_the_eager_gradients(activation):
    """A compiled (fullgraph) model whose e4m3 layer's x comes from a trainable nn.Linear: the
    gradients of the model's input, the linear's weight and bias and the sparse layer's bias are the
    eager ones, bit for bit (before: SP0922 at compile time)."""
    assert_compiled_gradients_equal_eager(_UpstreamThenE4m3(activation), seed=45)


def _e4m3_block(fuse: str | None):
    """A Llama-style MLP (gate_proj, up_proj, down_proj, SiLU) of e4m3 SparseLinear layers, fused as
    ``fuse`` says: None (not fused), "traced" (fuse_projections_(traced=True, glu=False): one fused op
    per group in a trace), "glu" (glu=True, traced=False: each member's own op in a trace) or
    "glu_traced" (the fused gated op with SwiGLU in a trace)."""
    from sparsile.tests.integrations.test_torch_glu import LlamaLikeMLP, sparse_block

    block = sparse_block(LlamaLikeMLP(seed=46), dtype="e4m3")
    if fuse is not None:
        report = spt.fuse_projections_(block, glu=fuse != "traced", traced=fuse != "glu")
        assert report.fused == ["mlp.gate_proj+up_proj"] and bool(report.glu) == (fuse != "traced")
    return block


@pytest.mark.parametrize("fuse", [None, "traced", "glu", "glu_traced"])
def test_a_compiled_e4m3_mlp_gives_x_the_eager_gradient(fuse):
    """torch.compile(fullgraph=True) of an e4m3 gated MLP, unfused, fused in traces, and with the gated
    activation (SwiGLU) fused, in traces or not: x's gradient equals the eager one of the model whose
    ops the trace runs, bit for bit (the fused layer's eagerly where the trace holds the fused op; the
    unfused model's where each member runs its own). With the gated activation fused in the trace, it
    is also the float64 straight-through gradient within the roundings (d h to bf16, x's gradient to
    bf16, the float32 GEMMs)."""
    from torch._dynamo.backends.registry import lookup_backend

    block = _e4m3_block(fuse)
    same_ops = block if fuse in ("traced", "glu_traced") else _e4m3_block(None)  # (eagerly, the ops the trace runs)
    gen = torch.Generator().manual_seed(47)
    x = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    g = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    xe = x.clone().requires_grad_()
    eager = same_ops.mlp(xe)
    eager.backward(g)
    torch._dynamo.reset()
    ops = []

    def recording_aot_eager(gm, example_inputs):
        ops.extend((str(n.target).removesuffix(".default"), n.kwargs.get("activation")) for n in gm.graph.nodes
                   if n.op == "call_function" and "sparsile" in str(n.target))
        return lookup_backend("aot_eager")(gm, example_inputs)

    xc = x.clone().requires_grad_()
    y = torch.compile(block.mlp, backend=recording_aot_eager, fullgraph=True)(xc)
    gate_up = [("sparsile.sparse_linear_e4m3", "swiglu" if fuse == "glu_traced" else None)]
    gate_up = gate_up if fuse in ("traced", "glu_traced") else 2 * gate_up  # (one fused op, or each member's)
    assert ops == [*gate_up, ("sparsile.sparse_linear_e4m3", None)]  # (then down_proj's)
    assert torch.equal(y, eager)
    y.backward(g)
    assert xc.grad.dtype == torch.bfloat16 and torch.equal(xc.grad, xe.grad)
    if fuse == "glu_traced":
        check_glu_mlp_dx(block.mlp, x, g, xc.grad)


def check_glu_mlp_dx(mlp, x: torch.Tensor, g: torch.Tensor, dx: torch.Tensor) -> None:
    """dx, x's gradient of sum(mlp(x) * g) for a Llama-style MLP of e4m3 layers whose gate and up run as
    one fused layer with SwiGLU (fuse_projections_(glu=True)), against the float64 straight-through
    gradient at the [gate; up] pre-activations the kernel computes (float32): d h = g @ W_down, then
    d pre = swiglu'(pre) d h, dx = d pre @ W_[gate; up]; within the roundings: d h's float32 GEMM and
    its rounding to bf16 (y of the gated layer is bf16) carried through swiglu', dx's float32 GEMM and
    d pre's float32 evaluation, dx's rounding to bf16."""
    from sparsile.integrations.torch.projection_group import fused_group_of

    fused = fused_group_of(mlp.gate_proj).fused
    with torch.no_grad():
        pre = fused._forward_op(x, pre=True)  # [gate; up] pre-activations (T, 2F) in float32
    wd, w = mlp.down_proj.to_dense().double(), fused.to_dense().double()
    dy = g.double().reshape(-1, g.shape[-1])
    dh = dy @ wd  # down_proj's x gradient (no activation), then h = act(gate) * up's
    dh_err = (wd.shape[0] + 3) * 2.0 ** -24 * (dy.abs() @ wd.abs()) + EPS[torch.bfloat16] * dh.abs()
    p = pre.double().requires_grad_()
    (d_pre,) = torch.autograd.grad(ACTS["swiglu"](p), p, dh, retain_graph=True)
    (d_pre_err,) = torch.autograd.grad(ACTS["swiglu"](p), p, dh_err)  # (each d pre reads one d h)
    ref = d_pre @ w
    absprod = d_pre.abs() @ w.abs()
    bound = (EPS[torch.bfloat16] * ref.abs() + d_pre_err.abs() @ w.abs()
             + (w.shape[0] + 8) * 2.0 ** -24 * absprod)  # (the float32 GEMM, d pre in float32)
    err = (dx.reshape(ref.shape).double() - ref).abs()
    assert (err <= bound).all(), (err / bound).max().item()


def test_an_e4m3_layer_traced_by_make_fx_without_grad_says_to_trace_with_an_x_that_requires_grad():
    """make_fx (no torch.export: it keeps the quantizer and sparse_linear for an x without grad) of an e4m3
    layer, its graph later run with an x that requires grad: SP0922 at backward() whose help says to trace
    with such an x; traced so, the graph gives x the eager gradient."""
    from torch.fx.experimental.proxy_tensor import make_fx

    layer = spt.SparseLinear.from_dense(linear(16, 64, seed=29), "e4m3")
    gen = torch.Generator().manual_seed(30)
    x = torch.randn(2, 64, generator=gen).to(torch.bfloat16)
    graph = make_fx(layer)(x)
    xg = x.clone().requires_grad_()
    with pytest.raises(IntegrationError) as info:
        graph(xg).float().sum().backward()
    assert (info.value.code, info.value.help) == ("SP0922", HELP_FP8_X)
    graph = make_fx(layer)(x.clone().requires_grad_())
    graph(xg).float().sum().backward()
    want = x.clone().requires_grad_()
    layer(want).float().sum().backward()
    assert torch.equal(xg.grad, want.grad)
