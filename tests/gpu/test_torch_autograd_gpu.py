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
