"""A SparseLinear's kept launches (its launch records, its last call, the CUDA graphs of repeated calls;
integrations/torch/record_cache.py, last_call.py, graph_launch.py) after anything about x or the layer
changed (review49b): each case warms the layer up (records planned, the last call kept, a graph
captured and replayed), makes one change, and compares the next calls against float64 with y's
memory poisoned. The CPU side of the same review: tests/integrations/test_torch_kept_results.py."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]

K = 1024


def poisoned(layer, x, rows: int | None = None):
    """layer(x) after a NaN block of y's size was freed (torch's caching allocator hands it to y: a y the
    kernel does not fully write keeps NaNs)."""
    torch.cuda.synchronize()
    rows = x.numel() // x.shape[-1] if rows is None else rows
    poison = torch.full((rows, layer.out_features), float("nan"), device="cuda", dtype=layer.out_dtype or x.dtype)
    del poison
    y = layer(x)
    torch.cuda.synchronize()
    return y


def warm(layer, x, pads: bool = False) -> None:
    """Calls until the layer's last call replays a captured graph (or has no replays at all). A layer
    whose plan pads x (in features not a multiple of the tile's K: x is copied each call) keeps no
    last call (linear.py's ``_remember``: only a call on x's own memory is kept): its records run."""
    for _ in range(5):
        check_against_float64(layer, x, poisoned(layer, x))
    last = layer.__dict__["_last"]
    if pads:
        assert last is None
        return
    assert last is not None
    assert last.replays is None or last.replays.replayed >= 1


def _x(shape, seed: int):
    return torch.randn(*shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)
                       ).to(torch.bfloat16)


X_CHANGES = ["transposed", "aligned offset", "odd offset", "expanded", "channels last", "3-D permuted",
             "neg view", "previous output", "resized in place", "freed and reallocated", "float32", "float16",
             "requires grad", "inference mode"]


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("change", X_CHANGES)
def test_an_x_unlike_the_last_one_is_computed_with_its_own_memory(dtype, change):
    """x of the same shape (T = 8) as the warm calls' but other strides, offset, type, mode or memory:
    never the last call's record launched on memory it does not describe."""
    layer = spt.SparseLinear.from_dense(linear(K, K, seed=1, device="cuda"), dtype, activation="silu")
    x0 = _x((8, K), 2)
    warm(layer, x0)
    if change == "transposed":
        x = _x((K, 8), 3).t()
    elif change == "aligned offset":
        x = _x((8 * K + 8,), 3)[8:].view(8, K)
    elif change == "odd offset":
        x = _x((8 * K + 1,), 3)[1:].view(8, K)
    elif change == "expanded":
        x = _x((1, K), 3).expand(8, K)
    elif change == "channels last":
        x = _x((2, 2, 2, K), 3).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    elif change == "3-D permuted":
        x = _x((4, 2, K), 3).transpose(0, 1)
    elif change == "neg view":
        x = torch._neg_view(_x((8, K), 3))
    elif change == "previous output":  # (N == K: y of the last call fed back)
        x = poisoned(layer, x0).bfloat16()
    elif change == "resized in place":
        x = _x((8, K), 3)
        check_against_float64(layer, x, poisoned(layer, x))
        x.resize_(4, K)
    elif change == "freed and reallocated":  # the same address, other contents: a graph replays at it
        del x0
        x = _x((8, K), 3)
    elif change in ("float32", "float16"):
        x = _x((8, K), 3).to(getattr(torch, change))
    elif change == "requires grad":
        x = _x((8, K), 3).requires_grad_()
    else:
        with torch.inference_mode():
            x = _x((8, K), 3)
    for _ in range(3):  # the full path, then (where it qualifies) the last call, then a replay
        y = poisoned(layer, x)
        check_against_float64(layer, x.detach(), y.detach())
    if change == "requires grad":
        y.float().sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()


LAYER_CHANGES = ["bias add_", "values written", "load_state_dict", "load_state_dict assign", "activation",
                 "out_dtype", "half", "bias replaced", "bias made a parameter", "bias.data", "no bias",
                 "no_grad", "autocast"]


@pytest.mark.parametrize("shape", [(K, K), (1000, K - 8)])  # (out, in); 1000 x 1016: the plan pads (copies)
@pytest.mark.parametrize("change", LAYER_CHANGES)
def test_a_layer_changed_after_its_warm_calls_computes_with_the_change(shape, change):
    """Each change to the layer after warm calls (records, last call and a replayed graph of x's and y's
    addresses): the next calls compute with the layer as it is now."""
    layer = spt.SparseLinear.from_dense(linear(*shape, seed=4, device="cuda"), "bf16")
    other = spt.SparseLinear.from_dense(linear(*shape, seed=5, device="cuda"), "bf16")
    x = _x((8, shape[1]), 6)
    warm(layer, x, pads=shape != (K, K))
    before = layer(x).clone()
    out_dtype = None
    with torch.no_grad():
        if change == "bias add_":
            layer.bias.add_(1.0)
        elif change == "values written":
            layer.values.copy_(other.values)
            layer.meta.copy_(other.meta)
        elif change == "load_state_dict":
            layer.load_state_dict(other.state_dict())
        elif change == "load_state_dict assign":
            layer.load_state_dict(copy.deepcopy(other.state_dict()), assign=True)
        elif change == "activation":
            layer.activation = "relu"
        elif change == "out_dtype":
            layer.out_dtype = out_dtype = torch.float32
        elif change == "half":
            layer.half()  # (the weight keeps its type; y follows x)
        elif change == "bias replaced":
            layer.bias = other.bias.clone()
        elif change == "bias made a parameter":
            layer.bias = torch.nn.Parameter(other.bias.clone(), requires_grad=False)
        elif change == "bias.data":
            layer.bias.data = other.bias.clone()
        elif change == "no bias":
            layer.bias = None
    if change == "no_grad":
        with torch.no_grad():
            ys = [poisoned(layer, x) for _ in range(3)]
    elif change == "autocast":
        with torch.autocast("cuda", dtype=torch.float16):
            ys = [poisoned(layer, x) for _ in range(3)]
    else:
        ys = [poisoned(layer, x) for _ in range(3)]
    for y in ys:
        check_against_float64(layer, x, y, out_dtype=out_dtype)
    if change not in ("half", "no_grad", "autocast", "out_dtype"):  # (f32 y rounds to the bf16 one)
        assert not torch.equal(ys[-1].to(before.dtype), before)


class Block(torch.nn.Module):
    """q_proj, k_proj and v_proj (256, 128 and 128 outputs over K inputs) on the GPU."""

    def __init__(self):
        super().__init__()
        for i, (name, n) in enumerate((("q_proj", 256), ("k_proj", 128), ("v_proj", 128))):
            setattr(self, name, spt.SparseLinear.from_dense(linear(n, K, seed=10 + i, device="cuda")))


def _fused_block():
    from sparsile.integrations.torch.projection_group import fused_group_of

    block = Block()
    assert spt.fuse_projections_(block).fused
    return block, fused_group_of(block.q_proj)


def test_a_fused_member_given_other_memory_between_sibling_calls_runs_with_it():
    """The CPU test's case on the GPU: ``k_proj.bias.data = t`` after q_proj started the fused run."""
    block, _ = _fused_block()
    x = _x((4, K), 7)
    for _ in range(3):
        for name in ("q_proj", "k_proj", "v_proj"):
            check_against_float64(getattr(block, name), x, poisoned(getattr(block, name), x))
    block.q_proj(x)
    block.k_proj.bias.data = block.k_proj.bias.detach() * 2 + 100
    check_against_float64(block.k_proj, x, poisoned(block.k_proj, x))


def test_a_sibling_captured_after_an_eager_run_replays_its_own_launch():
    """q_proj(x) eagerly, then k_proj(x) captured into a CUDA graph: the graph holds k_proj's launch (served
    the eager run, it held none, and each replay handed back the eager numbers)."""
    block, group = _fused_block()
    x = _x((4, K), 8)
    for _ in range(2):  # warm-up (kernels compiled, records planned), each member served
        [getattr(block, name)(x) for name in ("q_proj", "k_proj", "v_proj")]
    torch.cuda.synchronize()
    block.q_proj(x)
    assert group.pending is not None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k = block.k_proj(x)
    x.copy_(_x((4, K), 9))
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    check_against_float64(block.k_proj, x, k)


def test_a_sibling_called_on_another_stream_runs_there():
    """q_proj(x) on torch's current stream, k_proj(x) on a side stream: k_proj starts a run of its own
    there (served, its columns came from a kernel on the other stream, which the side stream did not
    wait for)."""
    block, group = _fused_block()
    x = _x((4, K), 10)
    check_against_float64(block.q_proj, x, poisoned(block.q_proj, x))
    runs = group.runs
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        k = block.k_proj(x)
    torch.cuda.current_stream().wait_stream(side)
    assert group.runs == runs + 1
    check_against_float64(block.k_proj, x, k)
