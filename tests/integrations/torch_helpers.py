"""Shared pieces of the sparsile.torch tests: tiny layers and a float64 reference with an error bound."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
"""Half an ulp, relative: the rounding of the stored output."""
GATE_SLOPE_MAX = 1.13  # max |silu'(g)| = 1.0998..., max |gelu_tanh'(g)| = 1.129...


def warm_up_on_a_side_stream(call, times: int = 1) -> None:
    """Run ``call()`` ``times`` times on a side stream ordered after torch's current one (kernels
    compiled, launch records planned), as torch's docs ask before capturing a CUDA graph, and make
    the current stream wait for it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            call()
    torch.cuda.current_stream().wait_stream(side)


def linear(n: int, k: int, dtype: torch.dtype = torch.bfloat16, bias: bool = True, seed: int = 0,
           device: str = "cpu") -> torch.nn.Linear:
    """An nn.Linear with random non-zero weights and bias (bias values well away from zero)."""
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen))
        if bias:
            layer.bias.copy_(torch.rand(n, generator=gen) + 0.5)
    return layer.to(device=device, dtype=dtype)


def tiny_llama(layers: int = 1, seed: int = 0, **config):
    """A dense LlamaForCausalLM in bf16 (hidden 64, intermediate 128, vocab 61, 4 heads, 2 kv heads;
    ``config``: more LlamaConfig fields, e.g. ``tie_word_embeddings``), in eval mode."""
    import pytest

    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=61, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=layers, max_position_embeddings=64,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None, **config)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def dense_twin(layer) -> torch.nn.Linear:
    """An ``nn.Linear`` in bf16 with ``layer``'s pruned weight and bias (a sparse layer's dense twin)."""
    twin = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    with torch.no_grad():
        twin.weight.copy_(layer.to_dense())
        if layer.bias is not None:
            twin.bias.copy_(layer.bias)
    return twin.to(torch.bfloat16)


def activation_fn(name: str | None, y: torch.Tensor) -> torch.Tensor:
    if name is None:
        return y
    if name == "relu":
        return torch.clamp_min(y, 0)
    if name == "silu":
        return y / (1 + torch.exp(-y))
    return 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))


def kernel_input(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x (T, K) as the kernel sees it (cast to the weight type, or quantized per token) and scale_x."""
    x2 = x.reshape(-1, layer.in_features)
    if layer.weight_dtype == "e4m3":
        xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x2)
        return xq.double() * sx.double()[:, None], sx
    return x2.to(layer.values.dtype).double(), None


def check_against_float64(layer, x: torch.Tensor, y: torch.Tensor, out_dtype: torch.dtype | None = None) -> None:
    """y == activation(x @ W.T + bias) computed in float64 from the layer's own dense weight, within
    the output's rounding, f32 accumulation (K terms) and the activation's f32 evaluation."""
    out_dtype = out_dtype or x.dtype
    n = layer.out_features
    assert y.shape == (*x.shape[:-1], n) and y.dtype == out_dtype
    xk, _ = kernel_input(layer, x)
    w = layer.to_dense().double()
    pre = xk @ w.T + (layer.bias.double() if layer.bias is not None else 0)
    ref = activation_fn(layer.activation, pre)
    absprod = xk.abs() @ w.abs().T
    accumulation = layer.in_features * 2.0 ** -23 * absprod
    if layer.weight_dtype == "e4m3":  # Hopper's fp8 MMA accumulator keeps about 14 mantissa bits (docs/hopper.md)
        accumulation = accumulation + (layer.in_features // 64 + 1) * 2.0 ** -13 * absprod
    bound = EPS[out_dtype] * ref.abs() + 1.2 * accumulation + 1e-5 * ref.abs() + 1e-6
    got = y.reshape(-1, n).double()
    assert torch.isfinite(got).all()
    err = (got - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3f}"


def check_glu(layer, x: torch.Tensor, y: torch.Tensor, activation: str = "swiglu",
              out_dtype: torch.dtype | None = None, unfused: bool = False, strict: bool = True) -> None:
    """y == act(g) * u for [g, u] = x @ W.T + bias of ``layer``'s 2F rows [gate; up] (a SparseLinear
    or anything with its buffers and to_dense) and the gated ``activation`` ("swiglu": silu, "geglu":
    gelu_tanh), computed in float64 by stdlib's ``reference_linear``, within the output's rounding,
    each pre-activation's f32 accumulation (K terms) and rounding to f32, carried through act(g) * u
    (|silu'| <= 1.10, |gelu_tanh'| <= 1.13), and the f32 evaluation of act and the product.
    ``unfused`` (the fallback above 64 tokens, as the unfused MLP computes it): g and u rounded to
    the output type, then act(g) rounded, then the product: one half ulp on each, carried through.
    y is also nearer (in mean) the asked activation's result than the other gated activation's
    (the one asked for was applied). ``strict`` (the default) also asserts that the bound says
    something: under 5 % of the largest |y|, and somewhere tighter than the two activations'
    difference (so y is not the other's result); at K = 8192 (e4m3's worst case above all) the
    worst-case bound is too wide for both, and the tests there pass ``strict=False``."""
    from sparsile.stdlib.kernels.linear import reference_activation, reference_linear
    from sparsile.stdlib.kernels.linear_args import GATED_ACTIVATIONS

    out_dtype = out_dtype or x.dtype
    f = layer.out_features // 2
    assert y.shape == (*x.shape[:-1], f) and y.dtype == out_dtype
    xk = kernel_input(layer, x)[0].cpu()  # (the reference runs in numpy: CUDA tensors are copied to the host)
    w = layer.to_dense().double().cpu()
    bias = None if layer.bias is None else layer.bias.double().cpu().numpy()
    z = torch.from_numpy(reference_linear(w.numpy(), xk.numpy(), bias=bias))
    absprod = xk.abs() @ w.abs().T
    acc = layer.in_features * 2.0 ** -23 * absprod + 2.0 ** -24 * z.abs()
    if layer.weight_dtype == "e4m3":  # Hopper's fp8 MMA accumulator keeps about 14 mantissa bits (docs/hopper.md)
        acc = acc + (layer.in_features // 64 + 1) * 2.0 ** -13 * absprod
    g, u, eg, eu = z[:, :f], z[:, f:], acc[:, :f], acc[:, f:]
    gates = {name: torch.from_numpy(reference_activation(g.numpy(), gate)) for name, gate in GATED_ACTIVATIONS.items()}
    act = gates[activation]
    ref = torch.from_numpy(reference_linear(w.numpy(), xk.numpy(), bias=bias, activation=activation))
    assert torch.allclose(ref, act * u, rtol=1e-12, atol=1e-12)  # (reference_linear pairs gate and up rows)
    if unfused:  # the roundings of g and u to the output type, and of act(g)
        eps = EPS[out_dtype]
        eg, eu = eg + eps * g.abs(), eu + eps * u.abs()
        act_err = eps * act.abs()
    else:
        act_err = 0.0
    bound = EPS[out_dtype] * ref.abs() + 1.2 * (GATE_SLOPE_MAX * eg * u.abs() + act.abs() * eu + eg * eu
                                                + act_err * (u.abs() + eu)) + 1e-5 * ref.abs() + 1e-6
    got = y.reshape(-1, f).double().cpu()
    assert torch.isfinite(got).all()
    err = (got - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3f}"
    other = next(name for name in GATED_ACTIVATIONS if name != activation)
    assert err.mean() < (got - gates[other] * u).abs().mean(), f"y is nearer {other}'s result"
    if strict:
        assert bound.max() < 0.05 * ref.abs().max()  # not a vacuous check
        assert ((got - gates[other] * u).abs() > bound).any(), f"y is {other}'s result"


def down_inputs(mlp, x):
    """(y, the input of down_proj) of ``mlp(x)``."""
    seen = []
    hook = mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            y = mlp(x)
    finally:
        hook.remove()
    assert len(seen) == 1
    return y, seen[0]


class FusedSiblings(torch.nn.Module):
    """q, k and v SparseLinear layers (16 outputs each) of one x of ``k`` features, fused for tracing
    (``fuse_projections_(traced=True)``: one op per group in a trace)."""

    def __init__(self, k: int = 64):
        super().__init__()
        import sparsile.torch as spt

        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            setattr(self, name, spt.SparseLinear.from_dense(linear(16, k, seed=i), "bf16"))
        assert spt.fuse_projections_(self, traced=True, glu=False).fused == ["q_proj+k_proj+v_proj"]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)
