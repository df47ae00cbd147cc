"""The gated activation (SwiGLU, GeGLU) fused into the sparse gated MLP on the GPU
(integrations/torch/glu.py): the eager fused MLP's down_proj input against float64 at T = 1, 16, 64
(in the decode kernel's epilogue) and 128 (the fallback: the pre-activations in bf16, then torch, as
the unfused MLP), bf16 and e4m3, the steady-state call (LastCall) equal to the first; the op on
CUDA; CUDA-graph capture and replay; torch.compile(fullgraph=True) with Inductor and
mode="reduce-overhead" (traced=True: the gated op in the graph). Each for "swiglu" (an nn.SiLU
act_fn) and "geglu" (nn.GELU(approximate="tanh"))."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import check_glu, warm_up_on_a_side_stream

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]

HIDDEN, F = 512, 1024  # K of gate/up; F: the intermediate size (a multiple of 16)
KEY = "mlp.gate_proj+up_proj"
ACTIVATIONS = ("swiglu", "geglu")
DEVICE = "cuda"  # (a copy of this file pointed at "cpu" runs its eager and op cases in the interpreter)


def cuda_block(dtype=None, bias=True, hidden=HIDDEN, traced=False, activation="swiglu"):
    """(a Block whose Llama-style MLP is sparse and fused with its gated ``activation``, on CUDA;
    its GatedForward)."""
    from sparsile.tests.integrations.test_torch_glu import Block, LlamaLikeMLP, act_module

    block = Block(LlamaLikeMLP(act=act_module(activation), bias=bias, hidden=hidden, f=F, device=DEVICE))
    report = spt.sparsify_(block, dtype=dtype, min_features=16, interpret=DEVICE == "cpu")
    assert len(report.swapped) == 3
    fusion = spt.fuse_projections_(block, traced=traced, glu=True)
    assert fusion.glu == {KEY: activation}, fusion
    return block, block.mlp.__dict__["forward"].__self__


def down_input_hook(mlp, seen: list):
    return mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))


def x_of(tokens, hidden=HIDDEN, seed=0):
    """x scaled by 2 / sqrt(hidden): gate pre-activations of order 1, where silu and gelu_tanh differ
    (check_glu asserts y is not the other activation's result; at |g| ~ sqrt(hidden) both are g or 0)."""
    gen = torch.Generator(DEVICE).manual_seed(seed)
    return (torch.randn(tokens, hidden, device=DEVICE, generator=gen) * (2 * hidden ** -0.5)).to(torch.bfloat16)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 16, 64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("hidden", [HIDDEN, 8192])
def test_eager_fused_mlp_against_float64(tokens, dtype, hidden, activation):
    """At K = 8192 the decode kernel splits K (the eager call reduces in the kernel)."""
    block, forward = cuda_block(dtype, hidden=hidden, activation=activation)
    glu, pre = forward.layers()
    seen: list = []
    hook = down_input_hook(block.mlp, seen)
    with torch.no_grad():
        first = block.mlp(x_of(tokens, hidden))
        x = x_of(tokens, hidden, seed=1)
        second = block.mlp(x)  # the steady state: the glu layer's LastCall (T <= 64)
        again = block.mlp(x.clone())
    hook.remove()
    torch.cuda.synchronize()
    check_glu(forward.group.fused, x, seen[1], activation, unfused=tokens > 64, strict=hidden < 8192)
    assert torch.equal(seen[2], seen[1]) and torch.equal(again, second) and first.shape == second.shape
    in_kernel = tokens <= 64
    assert (len(glu.__dict__["_records"]) > 0) == in_kernel and (len(pre.__dict__["_records"]) > 0) != in_kernel
    if in_kernel:
        assert glu.__dict__["_last"] is not None  # the fast path was taken


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 64, 65])
def test_op_on_cuda_against_float64(tokens, activation):
    _, forward = cuda_block(activation=activation)
    glu, _ = forward.layers()
    x = x_of(tokens)
    y = torch.ops.sparsile.sparse_linear(x, glu.values, glu.meta, glu.bias, activation=activation)
    torch.cuda.synchronize()
    check_glu(forward.group.fused, x, y, activation, unfused=tokens > 64)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("tokens", [1, 16, 128])
def test_cuda_graph_capture_and_replay(dtype, tokens, activation):
    """A replay of the fused MLP equals an eager call bit for bit, and its down_proj input is within
    the float64 bound, for new inputs each replay."""
    block, forward = cuda_block(dtype, hidden=8192, activation=activation)
    static_x = x_of(tokens, 8192)
    with torch.no_grad():
        warm_up_on_a_side_stream(lambda: block.mlp(static_x), times=2)
        seen: list = []
        hook = down_input_hook(block.mlp, seen)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = block.mlp(static_x)
        hook.remove()
        for seed in range(3):
            static_x.copy_(x_of(tokens, 8192, seed=seed + 2))
            graph.replay()
            torch.cuda.synchronize()
            check_glu(forward.group.fused, static_x, seen[0], activation, unfused=tokens > 64, strict=False)
            assert torch.equal(static_y, block.mlp(static_x))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 16, 128])
def test_torch_compile_fullgraph_inductor(tokens, activation):
    block, forward = cuda_block(traced=True, activation=activation)
    ops = []

    def counting(gm, example_inputs):
        ops.extend((str(n.target), n.kwargs.get("activation")) for n in gm.graph.nodes
                   if n.op == "call_function" and "sparsile" in str(n.target))
        return gm.forward

    x = x_of(tokens)
    with torch.no_grad():
        torch.compile(block.mlp, backend=counting, fullgraph=True)(x)
    assert ops == [("sparsile.sparse_linear", activation), ("sparsile.sparse_linear", None)]
    torch._dynamo.reset()
    compiled = torch.compile(block.mlp, fullgraph=True)
    seen: list = []
    hook = down_input_hook(block.mlp, seen)
    with torch.no_grad():
        eager = block.mlp(x)
    hook.remove()
    check_glu(forward.group.fused, x, seen[0], activation, unfused=tokens > 64)
    with torch.no_grad():
        got = compiled(x)
    torch.cuda.synchronize()
    # the op runs the same kernel for the same shape as the eager call: the same bits
    assert torch.equal(got, eager)
    torch._dynamo.reset()


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_torch_compile_reduce_overhead(activation):
    block, _ = cuda_block(traced=True, activation=activation)
    compiled = torch.compile(block.mlp, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for seed in range(4):  # warm-up, recording, then replays
            x = x_of(16, seed=seed)
            got = compiled(x).clone()
            assert torch.equal(got, block.mlp(x))
    torch._dynamo.reset()
