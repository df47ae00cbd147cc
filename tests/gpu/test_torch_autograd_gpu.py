"""x's gradient through frozen sparse layers on the GPU (integrations/torch/autograd.py: the weight
decompressed by ``decompress_gpu``, the pre-activations recomputed by the kernel): SparseLinear of
bf16 / f16 / e4m3 weights with activations at decode and prefill token counts, and the op with the
gated activations, against float64; torch.func's grad, vjp, jacrev and vmap of grad. CPU twin:
tests/integrations/test_torch_autograd.py."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.test_torch_autograd import assert_close, reference_dx
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


@pytest.mark.parametrize("tokens", [1, 16, 200])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize(("weight", "x_dtype"), [("bf16", torch.bfloat16), ("f16", torch.float16),
                                                 ("e4m3", torch.bfloat16)])
def test_x_gradient_on_the_gpu(weight, x_dtype, activation, tokens):
    layer = spt.SparseLinear.from_dense(linear(512, 1024, seed=3, device="cuda"), weight, activation=activation)
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(tokens, 1024, device="cuda", generator=gen).to(x_dtype).requires_grad_()
    y = layer(x)
    with torch.no_grad():
        assert torch.equal(y, layer(x))
    g = torch.randn(y.shape, device="cuda", generator=gen).to(y.dtype)
    y.backward(g)
    pre = layer._forward_op(x.detach(), pre=True)
    assert_close(x.grad, reference_dx(layer, pre, g, activation), x_dtype)


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("tokens", [4, 100])
def test_the_gated_op_on_the_gpu(activation, tokens):
    layer = spt.SparseLinear.from_dense(linear(512, 1024, seed=5, device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(tokens, 1024, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_()
    y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation=activation)
    g = torch.randn(y.shape, device="cuda", generator=gen).to(y.dtype)
    y.backward(g)
    pre = torch.ops.sparsile.sparse_linear(x.detach(), layer.values, layer.meta, layer.bias,
                                           out_dtype=torch.float32)
    assert_close(x.grad, reference_dx(layer, pre, g, activation), torch.bfloat16)


@pytest.mark.parametrize("tokens", [1, 16, 200])
@pytest.mark.parametrize("weight", ["bf16", "e4m3"])
def test_a_bias_made_a_parameter_on_the_gpu(weight, tokens):
    """``layer.bias = nn.Parameter(b)`` on a CUDA layer: the launch records and the last call's path see
    the parameter (no KeyError, its values on every call, a step written in place read next call), and its
    gradient through the eager layer against float64. CPU twin: test_a_bias_made_a_parameter_is_the_layer_s_..."""
    from sparsile.tests.integrations.test_torch_autograd import _bias_grad_reference
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer = spt.SparseLinear.from_dense(linear(512, 1024, seed=7, device="cuda"), weight, activation="silu")
    gen = torch.Generator(device="cuda").manual_seed(8)
    x = torch.randn(tokens, 1024, device="cuda", generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        check_against_float64(layer, x, layer(x))  # records built for the buffer bias
    bias = torch.nn.Parameter(torch.rand(512, device="cuda", generator=gen) + 0.5)
    layer.bias = bias
    with torch.no_grad():
        for _ in range(3):
            check_against_float64(layer, x, layer(x))
    y = layer(x)
    g = torch.randn(y.shape, device="cuda", generator=gen).to(y.dtype)
    y.backward(g)
    want = _bias_grad_reference(layer, x, g, "silu")
    assert bias.grad is not None
    assert torch.allclose(bias.grad.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    with torch.no_grad():
        bias.add_(1.0)
        check_against_float64(layer, x, layer(x))


@pytest.mark.parametrize("tokens", [1, 200])
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float64])
def test_a_bias_parameter_trained_by_a_fused_optimizer_on_the_gpu(bias_dtype, tokens):
    """A bias made an ``nn.Parameter`` in a type the plan converts (bf16 under a float32 x and output,
    float64), trained by fused AdamW (``fused=True``: no version counter bumped): the launch record read
    its converted copy from before the step. Every call after a step computes with the stepped bias,
    through the full eager path and the last call's. CPU twin of the bookkeeping (the step hooks):
    tests/integrations/test_torch_record_weight.py, test_a_fused_optimizer_step_of_a_converted_bias_..."""
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer = spt.SparseLinear.from_dense(linear(512, 1024, seed=11, device="cuda"), "bf16")
    gen = torch.Generator(device="cuda").manual_seed(12)
    bias = torch.nn.Parameter((torch.rand(512, device="cuda", generator=gen) + 0.5).to(bias_dtype))
    layer.bias = bias
    x = torch.randn(tokens, 1024, device="cuda", generator=gen)
    optimizer = torch.optim.AdamW([bias], lr=0.5, fused=True)
    for _ in range(3):
        with torch.no_grad():
            for _ in range(2):  # the full path (a record built or refreshed), then the last call's
                check_against_float64(layer, x, layer(x))
        layer(x).square().mean().backward()
        before = bias.detach().clone()
        optimizer.step()
        optimizer.zero_grad()
        assert not torch.equal(bias.detach(), before)
    with torch.no_grad():
        check_against_float64(layer, x, layer(x))


@pytest.mark.parametrize("tokens", [1, 16, 200])
@pytest.mark.parametrize(("weight", "x_dtype", "activation"), [
    ("bf16", torch.bfloat16, None), ("bf16", torch.bfloat16, "silu"), ("f16", torch.float16, "gelu_tanh"),
    ("e4m3", torch.bfloat16, "relu"), ("e4m3", torch.bfloat16, None)])
def test_torch_func_grad_vjp_jacrev_and_vmap_on_the_gpu(weight, x_dtype, activation, tokens):
    """torch.func.grad, vjp, jacrev and vmap(grad) with respect to an N-D x on CUDA (the forward through
    the custom op's launch records, the backward the eager one: decompress_gpu and a float32 GEMM): the
    eager gradient, against float64. CPU twin: test_torch_func_grad_vjp_and_jacrev_through_a_layer."""
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer = spt.SparseLinear.from_dense(linear(512, 1024, seed=9, device="cuda"), weight, activation=activation)
    gen = torch.Generator(device="cuda").manual_seed(10)
    x = torch.randn(2, tokens, 1024, device="cuda", generator=gen).to(x_dtype)
    g = torch.randn(2, tokens, 512, device="cuda", generator=gen).to(torch.bfloat16).float()

    def loss(t, w):
        return layer(t).float().mul(w).sum()

    xe = x.clone().requires_grad_()
    loss(xe, g).backward()
    pre = layer._forward_op(x, pre=True)
    ref = reference_dx(layer, pre, g, activation).reshape(x.shape)
    assert_close(xe.grad, ref, x_dtype)

    got = torch.func.grad(loss)(x, g)
    # (the same backward, the same dy, but not always the same bits: at T = 200 with silu the H100 gave
    # another float32 rounding than the eager backward's, a38; both are checked against float64)
    assert got.dtype == x_dtype
    assert_close(got, ref, x_dtype)
    y, vjp_fn = torch.func.vjp(layer, x)
    check_against_float64(layer, x, y)
    (got,) = vjp_fn(g.to(y.dtype))
    assert_close(got, ref, x_dtype)
    per_sample = torch.func.vmap(torch.func.grad(loss))(x, g)
    for b in range(2):
        pre_b = layer._forward_op(x[b], pre=True)
        assert_close(per_sample[b], reference_dx(layer, pre_b, g[b], activation).reshape(x[b].shape), x_dtype)
    two = x[0, :min(tokens, 2)]
    jac = torch.func.jacrev(lambda t: layer(t).float())(two)  # (T, 512, T, 1024)
    pre_two = layer._forward_op(two, pre=True)
    rows = [(i, n) for i in range(two.shape[0]) for n in (0, 255, 511)]
    want = []
    for i, n in rows:  # each a one-hot dy's gradient (measured together: a row can be act' ≈ 0)
        one_hot = torch.zeros(two.shape[0], 512, device="cuda")
        one_hot[i, n] = 1
        want.append(reference_dx(layer, pre_two, one_hot, activation).reshape(two.shape))
    assert_close(torch.stack([jac[i, n] for i, n in rows]), torch.stack(want), x_dtype)


@pytest.mark.parametrize("tokens", [1, 16, 200])
@pytest.mark.parametrize(("weight", "activation"), [("bf16", None), ("bf16", "silu"), ("f16", "swiglu"),
                                                    ("e4m3", None), ("e4m3", "relu")])
def test_torch_func_on_the_op_called_directly_on_the_gpu(weight, activation, tokens):
    """(Not yet run on a GPU: written in the thirty-ninth session, without one.) torch.func.grad, vjp
    and vmap(grad) of torch.ops.sparsile.sparse_linear (sparse_linear_e4m3 for e4m3: x's
    straight-through gradient) called directly on CUDA tensors, through the op's own Autograd kernel:
    x's gradient against float64 at the pre-activations the op computes. CPU twin:
    test_torch_func_on_the_op_called_directly (bit-equal to torch.autograd there; here float64 only,
    as the layer's GPU test)."""
    layer = spt.SparseLinear.from_dense(linear(512, 1024, seed=12, device="cuda"), weight)
    gen = torch.Generator(device="cuda").manual_seed(13)
    x_dtype = torch.float16 if weight == "f16" else torch.bfloat16
    x = torch.randn(2, tokens, 1024, device="cuda", generator=gen).to(x_dtype)
    rows = 256 if activation in ("swiglu", "geglu") else 512
    g = torch.randn(2, tokens, rows, device="cuda", generator=gen).to(torch.bfloat16).float()

    def op(t):
        if weight == "e4m3":
            return torch.ops.sparsile.sparse_linear_e4m3(t, layer.values, layer.meta, layer.bias, layer.scale_w,
                                                         activation=activation)
        return torch.ops.sparsile.sparse_linear(t, layer.values, layer.meta, layer.bias, activation=activation)

    def reference(t, w):
        with torch.no_grad():
            xk, sx = torch.ops.sparsile.quantize_per_token_e4m3(t) if weight == "e4m3" else (t, None)
            pre = torch.ops.sparsile.sparse_linear(xk, layer.values, layer.meta, layer.bias, sx, layer.scale_w,
                                                   out_dtype=torch.float32)
        return reference_dx(layer, pre.reshape(-1, 512), w, activation).reshape(t.shape)

    ref = reference(x, g)
    got = torch.func.grad(lambda t: op(t).float().mul(g).sum())(x)
    assert got.dtype == x_dtype
    assert_close(got, ref, x_dtype)
    y, vjp_fn = torch.func.vjp(op, x)
    (got,) = vjp_fn(g.to(y.dtype))
    assert_close(got, ref, x_dtype)
    per_sample = torch.func.vmap(torch.func.grad(lambda t, w: op(t).float().mul(w).sum()))(x, g)
    for b in range(2):
        assert_close(per_sample[b], reference(x[b], g[b]), x_dtype)


def test_torch_func_grad_of_a_bias_parameter_on_the_gpu():
    """torch.func.grad of x and of a bias given through torch.func.functional_call on CUDA: the eager
    gradients (a bias made an nn.Parameter, trained through backward())."""
    from sparsile.tests.integrations.test_torch_autograd import _bias_grad_reference

    layer = spt.SparseLinear.from_dense(linear(512, 1024, seed=11, device="cuda"), activation="silu")
    layer.bias = torch.nn.Parameter(layer.bias.detach().clone())
    gen = torch.Generator(device="cuda").manual_seed(12)
    x = torch.randn(3, 5, 1024, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.randn(3, 5, 512, device="cuda", generator=gen).to(torch.bfloat16).float()
    xe = x.clone().requires_grad_()
    layer(xe).float().mul(g).sum().backward()
    want = _bias_grad_reference(layer, x, g, "silu")
    assert torch.allclose(layer.bias.grad.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())

    def loss(params, t):
        return torch.func.functional_call(layer, params, (t,)).float().mul(g).sum()

    grads = torch.func.grad(loss, argnums=(0, 1))({"bias": layer.bias.detach().clone()}, x)
    assert torch.equal(grads[1], xe.grad)
    assert torch.allclose(grads[0]["bias"].double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("tokens", [1, 8, 100])
@pytest.mark.parametrize(("activation", "has_bias"), [(None, True), (None, False), ("silu", True),
                                                      ("gelu_tanh", False)])
def test_a_compiled_e4m3_layer_gives_x_the_straight_through_gradient_on_the_gpu(activation, has_bias, tokens):
    """torch.compile(fullgraph=True) with Inductor of an e4m3 layer on CUDA whose N-D x requires grad
    (the op sparse_linear_e4m3; before: SP0922 at compile time): y against float64, x's gradient in x's
    dtype, and both it and the eager gradient within the rounding of the float64 straight-through
    gradient (Inductor compiles the backward's elementwise ops itself, so not always the eager bits).
    CPU twin: test_a_compiled_e4m3_layer_gives_x_the_eager_straight_through_gradient."""
    from sparsile.tests.integrations.test_torch_autograd import _straight_through_bound
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer = spt.SparseLinear.from_dense(linear(512, 1024, bias=has_bias, seed=13, device="cuda"), "e4m3",
                                        activation=activation)
    gen = torch.Generator(device="cuda").manual_seed(14)
    x = torch.randn(2, tokens, 1024, device="cuda", generator=gen).to(torch.bfloat16)
    g = torch.randn(2, tokens, 512, device="cuda", generator=gen).to(torch.bfloat16)
    xe = x.clone().requires_grad_()
    layer(xe).backward(g)
    torch._dynamo.reset()
    xc = x.clone().requires_grad_()
    y = torch.compile(layer, fullgraph=True)(xc)
    check_against_float64(layer, x, y.detach())
    y.backward(g)
    torch.cuda.synchronize()
    assert xc.grad is not None and xc.grad.dtype == torch.bfloat16 and xc.grad.shape == x.shape
    with torch.no_grad():
        pre = layer._forward_op(x, pre=True)
    ref = reference_dx(layer, pre, g, activation)
    bound = _straight_through_bound(layer, pre, g, torch.bfloat16)
    for got in (xe.grad, xc.grad):
        err = (got.reshape(ref.shape).double() - ref).abs()
        assert (err <= bound).all(), (err / bound).max().item()
    torch._dynamo.reset()


@pytest.mark.parametrize("tokens", [4, 100])
def test_a_compiled_e4m3_glu_mlp_gives_x_the_straight_through_gradient_on_the_gpu(tokens):
    """torch.compile(fullgraph=True) with Inductor of an e4m3 Llama-style MLP fused with SwiGLU in
    traces (fuse_projections_(traced=True, glu=True): the gated sparse_linear_e4m3, then down_proj's)
    whose N-D x requires grad: the compiled and the eager x gradients against the float64 straight-
    through gradient (in the kernel's epilogue at 4 tokens, the fallback at 100). CPU twin:
    test_a_compiled_e4m3_mlp_gives_x_the_eager_gradient."""
    from sparsile.tests.gpu.test_torch_glu_gpu import HIDDEN, cuda_block, x_of
    from sparsile.tests.integrations.test_torch_autograd import check_glu_mlp_dx

    block, _ = cuda_block("e4m3", traced=True)
    x = x_of(tokens, seed=15).reshape(2, tokens // 2, HIDDEN)
    g = torch.randn(x.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(16))
    g = g.to(torch.bfloat16)
    xe = x.clone().requires_grad_()
    block.mlp(xe).backward(g)
    torch._dynamo.reset()
    xc = x.clone().requires_grad_()
    torch.compile(block.mlp, fullgraph=True)(xc).backward(g)
    torch.cuda.synchronize()
    assert xc.grad.dtype == torch.bfloat16
    for got in (xe.grad, xc.grad):
        check_glu_mlp_dx(block.mlp, x, g, got)
    torch._dynamo.reset()


@pytest.mark.parametrize("tokens", [1, 16, 200])
@pytest.mark.parametrize("weight", [torch.bfloat16, torch.float16])
def test_a_float32_x_on_the_gpu_gets_the_eager_gradient_compiled(weight, tokens):
    """The op takes a float32 x for a 16-bit weight and casts it inside (its launch record keyed by the cast
    x): y bit for bit the op's on the cast x; a compiled (aot_eager) bf16 / f16 layer gives the float32 x the
    eager layer's float32 gradient, bit for bit. CPU twin: tests/integrations/test_torch_op_x_dtypes.py."""
    layer = spt.SparseLinear.from_dense(linear(512, 1024, dtype=weight, seed=31, device="cuda"), activation="silu",
                                        out_dtype=torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(32)
    x = torch.randn(tokens, 1024, device="cuda", generator=gen)
    g = torch.randn(tokens, 512, device="cuda", generator=gen)
    args = (layer.values, layer.meta, layer.bias)
    want = torch.ops.sparsile.sparse_linear(x.to(weight), *args, out_dtype=torch.float32)
    assert torch.equal(torch.ops.sparsile.sparse_linear(x, *args, out_dtype=torch.float32), want)
    grads = []
    for model in (layer, torch.compile(torch.nn.Sequential(layer), fullgraph=True, backend="aot_eager")):
        xi = x.clone().requires_grad_()
        model(xi).backward(g)
        grads.append(xi.grad)
    assert grads[0].dtype == torch.float32 and torch.equal(grads[1], grads[0])
    ref = reference_dx(layer, layer._forward_op(x, pre=True), g, "silu")
    err = (grads[0].double() - ref).abs().max().item()
    assert err <= 2 ** -16 * ref.abs().max().item(), err  # (float32 dx: a bf16 one is 2^-9 off)
