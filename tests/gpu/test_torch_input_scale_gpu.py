"""An e4m3 SparseLinear with a static per-tensor input scale on the GPU: eager calls of decode and
prefill sizes against vLLM's numbers in float64, a CUDA graph capture and replay, torch.compile, the
scale loaded in place (the kept reciprocal follows it), and no host read of the scale per call; the
static quantizer kernel (the record's first launch up to 64 tokens, quantize_with_scale's beyond)
bit for bit against torch's operations, the last-call fast path, a scale written in place between
graph replays and one replaced without setattr."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.test_torch_checkpoint_static import check_static
from sparsile.tests.integrations.torch_helpers import linear, warm_up_on_a_side_stream

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


def _layer(n: int = 256, k: int = 512, scale: float = 0.02):
    layer = spt.SparseLinear.from_dense(linear(n, k, seed=3, device="cuda"), "e4m3")
    layer.input_scale = torch.tensor([scale], device="cuda")
    return layer


def _parts(layer):
    wq = (layer.to_dense().double() / layer.scale_w.double()[:, None]).cpu().numpy()
    return wq, layer.scale_w.double().cpu().numpy(), layer.bias.double().cpu().numpy(), float(layer.input_scale.item())


def _x(tokens: int, k: int = 512) -> torch.Tensor:
    x = torch.randn(tokens, k, device="cuda") * 3
    x[0, :2] = torch.tensor([40.0, -50.0])  # beyond 448 * 0.02: saturated
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("tokens", [1, 4, 16, 64, 65, 300])
def test_eager_calls_compute_vllm_s_numbers(tokens):
    layer = _layer()
    x = _x(tokens)
    y = layer(x)
    y2 = layer(x)  # (the second call: kept records and the kept reciprocal)
    torch.cuda.synchronize()
    assert torch.equal(y, y2)
    check_static(y.cpu(), x.cpu(), *_parts(layer))


def _captured(layer, x):
    """(graph, y): ``layer(x)`` captured in a CUDA graph after two warm calls on a side stream."""
    warm_up_on_a_side_stream(lambda: layer(x), times=2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
    return graph, y


def test_a_cuda_graph_replays_the_static_quantizer():
    layer = _layer()
    x = _x(8)
    graph, y = _captured(layer, x)
    x.copy_(_x(8))
    graph.replay()
    torch.cuda.synchronize()
    check_static(y.cpu(), x.cpu(), *_parts(layer))


def test_torch_compile_and_a_scale_loaded_in_place():
    layer = _layer()
    x = _x(16)
    compiled = torch.compile(layer, fullgraph=True)
    assert torch.allclose(compiled(x).float(), layer(x).float(), rtol=2 ** -7, atol=1e-2)
    layer.load_state_dict({**layer.state_dict(), "input_scale": torch.tensor([0.05], device="cuda")})
    y = layer(x)
    check_static(y.cpu(), x.cpu(), *_parts(layer))
    with torch.no_grad():
        layer.input_scale.fill_(0.03)  # in place, without load_state_dict: the version counter tells
    check_static(layer(x).cpu(), x.cpu(), *_parts(layer))


def test_no_host_read_of_the_scale_per_call():
    layer = _layer()
    x = _x(4)
    layer(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a synchronizing call (a .item(), a host copy) raises
    try:
        for _ in range(3):
            layer(x)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("tokens", [1, 4, 16, 64, 65, 300])
def test_the_static_quantizer_gives_the_bits_of_torch_s_operations(tokens):
    """layer(x) (the static quantizer kernel, then the GEMM) against torch's quantize_static then the
    custom op sparse_linear with the same scale: the same bits; the quantizer alone too."""
    from sparsile.integrations.torch.quantize import quantize_static, quantize_with_scale

    layer = _layer()
    x = _x(tokens)
    x[-1, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0], dtype=torch.bfloat16)
    s = layer.input_scale
    xq = quantize_static(x, s)
    assert torch.equal(quantize_with_scale(x, s).view(torch.uint8), xq.view(torch.uint8))
    want = torch.ops.sparsile.sparse_linear(xq, layer.values, layer.meta, layer.bias, s, layer.scale_w)
    for _ in range(2):  # (the second: the last call's fast path up to 64 tokens)
        y = layer(x)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16))
    assert (layer.__dict__["_last"] is not None) == (tokens <= 64)


def test_a_scale_written_in_place_between_replays_and_on_the_fast_path():
    layer = _layer()
    x = _x(8)
    graph, y = _captured(layer, x)
    for value in (0.05, 0.011):
        with torch.no_grad():
            layer.input_scale.fill_(value)  # the quantizer reads the scale's memory at each replay
        graph.replay()
        torch.cuda.synchronize()
        check_static(y.cpu(), x.cpu(), *_parts(layer))
        check_static(layer(x).cpu(), x.cpu(), *_parts(layer))  # eager: the last call's fast path
    assert layer.__dict__["_last"] is not None


@pytest.mark.parametrize("how", ["buffers", "data"])
def test_a_scale_replaced_without_setattr_is_taken(how):
    """layer._buffers["input_scale"] = t (as accelerate does) or layer.input_scale.data = t: the next call
    quantizes with t (the records and the last call of the old tensor's memory are dropped)."""
    layer = _layer()
    x = _x(4)
    layer(x)
    layer(x)
    new = torch.tensor([0.07], device="cuda")
    if how == "buffers":
        layer._buffers["input_scale"] = new
    else:
        layer.input_scale.data = new
    check_static(layer(x).cpu(), x.cpu(), *_parts(layer))


@pytest.mark.parametrize("per_token", [False, True])
def test_a_prefill_of_more_than_2_31_elements_quantizes_its_last_rows(per_token):
    """NOT YET RUN ON A GPU. x of 37500 x 57344 (2.15e9 elements, past 2^31): quantize_with_scale's static
    quantizer, and quantize_per_token's, address row t at t * K in 64 bits (an i32 product wrapped, and
    the last rows were written below their start); their last rows against torch's operations (static)
    and the per-token formula in float64 (about 15 GiB of GPU memory in all)."""
    from sparsile.integrations.torch.quantize import quantize_per_token, quantize_static, quantize_with_scale

    t, k = 37500, 57344
    x = torch.empty((t, k), dtype=torch.bfloat16, device="cuda").normal_(0, 3)
    tail = x[-4:]
    if per_token:
        xq, s = quantize_per_token(x)
        amax = tail.double().abs().amax(dim=1)
        want_s = torch.clamp(amax / 448, min=1 / (448 * 512)).float()
        assert torch.equal(s[-4:], want_s)
        want = (tail.float() * torch.reciprocal(want_s)[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    else:
        scale = torch.tensor([0.02], device="cuda")
        xq = quantize_with_scale(x, scale)
        want = quantize_static(tail, scale)
    assert torch.equal(xq[-4:].view(torch.uint8), want.view(torch.uint8))
