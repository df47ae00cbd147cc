"""The native launch of the torch launch record (on by default, ``SPARSILE_TORCH_NATIVE=0`` off;
integrations/torch/native.py) on the GPU: the same bits as the prepared launches for bf16 decode
shapes (split-K too, its two-launch plans included), e4m3 with per-token scales, bias + silu; the
native launcher's counter shows the calls launched natively; a CUDA graph captured with it on
replays as eager calls compute."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear, warm_up_on_a_side_stream

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
native = pytest.importorskip("sparsile.integrations.torch.native")
kernels = pytest.importorskip("sparsile.integrations.torch._kernels")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


def spt_quantize(x):
    """x quantized per token by the generic launch of the kernel API (the reference bits)."""
    from sparsile.stdlib.kernels.linear import quantize_per_token_e4m3

    return quantize_per_token_e4m3(x)


def _records(layer):
    return list(layer.__dict__["_records"].records.values())


def _poisoned_call(layer, x):
    """layer(x) with y's memory poisoned first: a NaN block of y's size freed just before the call,
    which torch's caching allocator hands to the call's y (a y the kernel does not fully write keeps NaNs)."""
    torch.cuda.synchronize()
    poison = torch.full((x.shape[0], layer.out_features), float("nan"), device="cuda",
                        dtype=layer.out_dtype or x.dtype)
    del poison
    y = layer(x)
    torch.cuda.synchronize()
    return y


def _both_ways(layer, xs, monkeypatch):
    """The outputs of ``xs`` with prepared launches, then with the native launch (records rebuilt)."""
    monkeypatch.setenv(native.ENV, "0")
    layer.__dict__["_records"].clear()
    off = [_poisoned_call(layer, x).clone() for x in xs]
    assert all(r.native is None for r in _records(layer))
    monkeypatch.setenv(native.ENV, "1")
    layer.__dict__["_records"].clear()
    before = native.counts()["launched"]
    on = [_poisoned_call(layer, x).clone() for x in xs]
    return off, on, native.counts()["launched"] - before


@pytest.mark.parametrize("shape", [(4096, 4096), (6144, 4096), (1024, 8192)])  # (out, in); 1024x8192 splits K
@pytest.mark.parametrize("tokens", [1, 4, 16, 64, 256])
def test_bf16_native_launches_equal_prepared_launches_bit_for_bit(shape, tokens, monkeypatch):
    n, k = shape
    layer = spt.SparseLinear.from_dense(linear(n, k, seed=tokens, device="cuda"))
    gen = torch.Generator("cuda").manual_seed(tokens)
    xs = [torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3)]
    off, on, launched = _both_ways(layer, xs, monkeypatch)
    for x, a, b in zip(xs, off, on):
        assert torch.equal(a, b) and not b.isnan().any()
        check_against_float64(layer, x, b)
    (record,) = _records(layer)
    per_call = len(record.eager if record.eager is not None else record.prepared)
    assert record.native is not None and record.native_error == 0 and launched == per_call * len(xs)


def test_a_split_k_plan_of_two_launches_launches_both_natively(monkeypatch):
    """T = 64 through the decode kernel with split-K, its partial sums added by a second launch
    (eager calls add them in the kernel up to 16 tokens; SPARSILE_DECODE_REDUCE=launch makes sure):
    both launches are native."""
    from sparsile.stdlib.kernels.decode import DECODE_REDUCE_ENV

    monkeypatch.setenv(DECODE_REDUCE_ENV, "launch")
    layer = spt.SparseLinear.from_dense(linear(1024, 8192, seed=2, device="cuda"))
    gen = torch.Generator("cuda").manual_seed(2)
    xs = [torch.randn(64, 8192, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3)]
    off, on, launched = _both_ways(layer, xs, monkeypatch)
    (record,) = _records(layer)
    assert record.eager is None and len(record.prepared) == 2 and launched == 2 * len(xs)
    for x, a, b in zip(xs, off, on):
        assert torch.equal(a, b) and not b.isnan().any()
        check_against_float64(layer, x, b)


@pytest.mark.parametrize("tokens", [1, 16, 32])  # one launch at 1 and 16 (quantizes_in_kernel), two at 32
def test_e4m3_per_token_scales_bias_and_silu(tokens, monkeypatch):
    layer = spt.SparseLinear.from_dense(linear(4096, 4096, seed=5, device="cuda"), "e4m3", activation="silu")
    gen = torch.Generator("cuda").manual_seed(11)
    xs = [torch.randn(tokens, 4096, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3)]
    off, on, launched = _both_ways(layer, xs, monkeypatch)
    for x, a, b in zip(xs, off, on):
        assert torch.equal(a, b) and not b.isnan().any()
        check_against_float64(layer, x, b)
    (record,) = _records(layer)
    launches = record.eager if record.eager is not None else record.prepared
    assert record.quantize and record.native is not None and launched == len(launches) * len(xs)
    if kernels.quantizes_in_kernel(tokens, 4096, 4096):  # one launch: the kernel quantizes x
        # a capture's launches: the quantizer and the GEMM, and the split-K reduction where the config reduces in a
        # second launch (the H200 table's entries do not; another GPU's untuned default can: 3 on the H100)
        assert len(launches) == 1 and len(record.prepared) in (2, 3)
    else:  # the quantizer's launch, then the GEMM's: one native call
        assert len(launches) >= 2
        quantized, scale = spt_quantize(xs[-1])
        assert torch.equal(record.xq, quantized) and torch.equal(record.sx, scale)  # the last call's, in its buffers


@pytest.mark.parametrize("shape,tokens", [((4096, 4096), 1), ((4096, 4096), 4), ((6144, 4096), 2), ((6144, 4096), 4),
                                          ((4096, 14336), 1), ((1000, 4096), 3), ((28672, 4096), 1),
                                          ((4096, 14336), 4), ((8192, 8192), 4), ((6144, 4096), 16),
                                          ((4096, 4096), 16), ((4096, 4096), 9)])
def test_e4m3_one_launch_eager_calls_equal_the_captured_two_launches(shape, tokens):
    """quantizes_in_kernel: an eager e4m3 call is one launch of the kernel that
    quantizes x itself; a call captured into a CUDA graph is the quantizer and the GEMM. Both give the
    same bits (the same per-token arithmetic, the same MMAs), and both match float64."""
    n, k = shape
    layer = spt.SparseLinear.from_dense(linear(n, k, seed=17, device="cuda"), "e4m3", activation="silu")
    static_x = torch.randn(tokens, k, device="cuda").to(torch.bfloat16)
    warm_up_on_a_side_stream(lambda: layer(static_x))  # compile and plan outside the capture
    (record,) = _records(layer)
    # (the captured launches: the quantizer, the GEMM and, where it splits K, the reduction)
    assert record.eager is not None and len(record.eager) == 1 and len(record.prepared) >= 2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    for seed in range(3):
        new = torch.randn(tokens, k, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) * (seed + 1)
        new[0] *= 1000.0  # one token of large values: its own scale
        static_x.copy_(new.to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        eager = _poisoned_call(layer, static_x)
        assert torch.equal(static_y, eager) and not eager.isnan().any()
        check_against_float64(layer, static_x, eager)


def test_e4m3_eager_call_keeps_two_launches_where_the_resident_x_needs_more_k_shares():
    """8192 x 28672 at T = 1 is within quantizes_in_kernel's bound, but its one launch fits the
    resident x only in two K shares where the two-launch plan has one (slower on the H200): the
    eager call keeps the quantizer and the GEMM, and matches float64."""
    layer = spt.SparseLinear.from_dense(linear(8192, 28672, seed=5, device="cuda"), "e4m3")
    x = torch.randn(1, 28672, device="cuda").to(torch.bfloat16)
    assert kernels.quantizes_in_kernel(1, 8192, 28672)
    y = _poisoned_call(layer, x)
    (record,) = _records(layer)
    assert kernels.k_shares(record.plan) == 1, "the premise: the H200 decode table's entry (one K share)"
    assert record.eager is None and len(record.prepared) == 2
    check_against_float64(layer, x, y)


@pytest.mark.parametrize("k", [4096, 8192])
def test_cuda_graph_capture_and_replay_with_the_native_launch_on(k, monkeypatch):
    """Captured calls take the prepared launches (the two-launch plan where K is split); replays
    equal eager (native) calls bit for bit, and nothing is launched natively inside the capture."""
    monkeypatch.setenv(native.ENV, "1")
    layer = spt.SparseLinear.from_dense(linear(1024, k, seed=3, device="cuda"), activation="silu")
    static_x = torch.randn(16, k, device="cuda").to(torch.bfloat16)
    warm_up_on_a_side_stream(lambda: layer(static_x))  # compile and plan outside the capture
    graph = torch.cuda.CUDAGraph()
    before = native.counts()["launched"]
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    assert native.counts()["launched"] == before
    for seed in range(3):
        new = torch.randn(16, k, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        static_x.copy_(new.to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        eager = layer(static_x)
        assert torch.equal(static_y, eager)
        check_against_float64(layer, static_x, static_y)
    assert native.counts()["launched"] >= before + 3


@pytest.mark.parametrize("tokens", [1, 16, 100])
def test_e4m3_with_k_that_the_kernel_pads(tokens):
    """in_features = 1000: the plans pad K (to the decode kernel's 256 and the tiled kernel's 32), so
    the GEMM reads a padded copy of the quantized x: the record must quantize and rebind per call
    (T <= 64), or quantize into fresh buffers (T = 100); y right for every x, not only the first."""
    layer = spt.SparseLinear.from_dense(linear(512, 1000, seed=4, device="cuda"), "e4m3")
    gen = torch.Generator("cuda").manual_seed(tokens)
    for _ in range(3):
        x = torch.randn(tokens, 1000, device="cuda", generator=gen).to(torch.bfloat16)
        y = _poisoned_call(layer, x)
        assert not y.isnan().any()
        check_against_float64(layer, x, y)


@pytest.mark.parametrize("dtype,tokens", [("bf16", 1), ("bf16", 16), ("bf16", 64), ("e4m3", 1), ("e4m3", 16)])
def test_pdl_gives_the_same_bits_eagerly_in_graphs_and_after_weight_writes(dtype, tokens, monkeypatch):
    """SPARSILE_PDL=1: the decode launches (and the e4m3 quantizer's trigger) change scheduling, not
    results: eager calls and graph replays equal the plain records' bits; an in-place write of the
    weight before a call (its kernel right before ours) gives the new weight's result."""
    layer = spt.SparseLinear.from_dense(linear(4096, 4096, seed=8, device="cuda"), None if dtype == "bf16" else dtype,
                                        activation="silu")
    gen = torch.Generator("cuda").manual_seed(12)
    xs = [torch.randn(tokens, 4096, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3)]
    monkeypatch.setenv("SPARSILE_PDL", "0")
    layer.__dict__["_records"].clear()
    plain = [_poisoned_call(layer, x).clone() for x in xs]
    assert not any(r.pdl for r in _records(layer))
    monkeypatch.setenv("SPARSILE_PDL", "1")
    layer.__dict__["_records"].clear()
    with_pdl = [_poisoned_call(layer, x).clone() for x in xs]
    assert all(r.pdl for r in _records(layer))
    for a, b in zip(plain, with_pdl):
        assert torch.equal(a, b) and not b.isnan().any()
    static_x = xs[0].clone()
    warm_up_on_a_side_stream(lambda: layer(static_x))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    for x, want in zip(xs, plain):
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, want)
    # an in-place write of the weight: the record waits for it before its kernel reads the weight
    values = layer.values
    bits = values.view(torch.int8 if values.element_size() == 1 else torch.int16)
    bits.bitwise_xor_(-128 if values.element_size() == 1 else -32768)  # every value's sign flipped
    y = layer(xs[1])
    torch.cuda.synchronize()
    check_against_float64(layer, xs[1], y)


@pytest.mark.parametrize("dtype,out_features,in_features,tokens", [
    ("bf16", 200, 512, 4), ("bf16", 256, 520, 4), ("bf16", 200, 520, 100),
    ("e4m3", 200, 520, 4), ("e4m3", 200, 520, 100)])  # e4m3: the quantizing record, then torch's quantization
def test_an_in_place_weight_write_reaches_a_padded_plan(dtype, out_features, in_features, tokens):
    """Shapes the plans pad (out_features % 128, in_features % the K step): the records read copies
    of the weight, so an in-place write must reach them: the next call refreshes them in place
    (the same record, its copies at the same addresses; planned again on one token)."""
    layer = spt.SparseLinear.from_dense(linear(out_features, in_features, seed=9, device="cuda"), dtype=dtype)
    x = torch.randn(tokens, in_features, device="cuda").to(torch.bfloat16)
    before = layer(x).clone()
    (record,) = _records(layer)
    assert record.copies_weight
    bits = layer.values.view(torch.int16 if dtype == "bf16" else torch.int8)
    bits.bitwise_xor_(-32768 if dtype == "bf16" else -128)  # every value's sign flipped, in place
    after = layer(x)
    torch.cuda.synchronize()
    check_against_float64(layer, x, after)
    assert not torch.equal(before, after)
    assert _records(layer) == [record]


@pytest.mark.parametrize("out_features,in_features,tokens", [(200, 520, 4), (4096, 4096, 16)])
def test_a_graph_captured_before_load_state_dict_keeps_its_records(out_features, in_features, tokens):
    """load_state_dict copies into the buffers in place, refreshes the padded copies of the records
    of that weight (RecordCache.sync) and empties the layer's cache; the records a graph captured
    stay allocated (retired). Warmed up and captured on one stream, so the captured record was built
    outside the graph's pool (where it has no scratch: a record with a split-K workspace is planned
    by the capture, in the graph's pool): before the eleventh session's fix its buffers were freed
    and handed out again (a filler of their sizes, on that stream, takes them). The replay computes with the
    loaded weight, whether its plan reads padded copies (200 x 520: before the twelfth session it
    replayed the old copies with the new bias, a mix of both weights) or the weight in place
    (4096 x 4096, split-K workspace)."""
    layer = spt.SparseLinear.from_dense(linear(out_features, in_features, seed=13, device="cuda"))
    other = spt.SparseLinear.from_dense(linear(out_features, in_features, seed=14, device="cuda"))
    static_x = torch.randn(tokens, in_features, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static_y = layer(static_x)
    graph.replay()
    torch.cuda.synchronize()
    before = static_y.clone()
    # the captured record: the warm-up's (200 x 520: no scratch, one record for every stream and capture)
    # or, with a split-K workspace (4096 x 4096), one the capture planned for itself (capture_keys.py)
    (record,) = [r for r in _records(layer) if r.captured]
    padded = record.copies_weight
    assert padded == (out_features == 200)
    sizes = [t.numel() * t.element_size() for t in record.kept]
    assert sizes or not padded  # the padded copies (and the workspace, where split-K)
    del record
    layer.load_state_dict(other.state_dict())
    torch.cuda.synchronize()
    with torch.cuda.stream(side):  # the caching allocator reuses a block on the stream that freed it
        filler = [torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda") for n in sizes]
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    del filler
    after = layer(static_x)
    torch.cuda.synchronize()
    check_against_float64(layer, static_x, after)
    assert not torch.equal(before, after)
    assert torch.equal(static_y, after)
    cache = layer.__dict__["_records"]  # the captured record stays allocated (retired, or taken back)
    assert sum(r.captured for r in (*cache.records.values(), *cache.retired.values())) == 1


def test_a_capture_after_an_unseen_weight_write_records_the_new_weight():
    """A padded layer (200 x 520) whose weight is written in place and then captured with no call
    outside the capture in between. Its record has a split-K workspace, so the capture plans a record
    of its own (docs/torch.md, "Scratch per stream and per CUDA-graph capture") from the weight as it
    is now: the graph replays the new weight, never the old padded copies (before, SP0920 stopped
    such a capture; a record without scratch still does). After check_metadata() and a warm-up a
    capture records the new weight too."""

    layer = spt.SparseLinear.from_dense(linear(200, 520, seed=15, device="cuda"))
    static_x = torch.randn(4, 520, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()  # warmed up and captured on one stream: the same record (a split-K
    side.wait_stream(torch.cuda.current_stream())  # record serves one stream; another would plan anew)
    with torch.cuda.stream(side):
        layer(static_x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    layer.values.view(torch.int16).bitwise_xor_(-32768)  # an in-place write no call sees
    torch.cuda.synchronize()
    first = torch.cuda.CUDAGraph()
    with torch.cuda.graph(first, stream=side):
        first_y = layer(static_x)
    first_y.fill_(float("nan"))
    first.replay()
    torch.cuda.synchronize()
    check_against_float64(layer, static_x, first_y)
    layer.check_metadata()  # the layer's records are planned again at their next call
    with torch.cuda.stream(side):  # torch's warm-up before a capture
        layer(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static_y = layer(static_x)
    graph.replay()
    torch.cuda.synchronize()
    check_against_float64(layer, static_x, static_y)


@pytest.mark.parametrize("out_features,in_features,tokens", [(200, 520, 4), (200, 520, 100)])
def test_two_captures_without_an_eager_call_replay_in_either_order(out_features, in_features, tokens):
    """No warm-up, two graphs captured back to back on a padded layer: the second plans its own
    launch record (the first's padded copies are filled only by the first graph's replay), so the
    second graph replayed first, then the first, both match float64."""
    layer = spt.SparseLinear.from_dense(linear(out_features, in_features, seed=17, device="cuda"))
    static_x = torch.randn(tokens, in_features, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()
    graphs, outs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()], []
    for graph in graphs:
        with torch.cuda.graph(graph, stream=side):
            outs.append(layer(static_x))
    for graph, out in zip(reversed(graphs), reversed(outs)):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_float64(layer, static_x, out)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("out_features,in_features,tokens", [(200, 520, 4), (200, 520, 100)])
def test_a_record_planned_in_a_capture_is_filled_before_an_eager_call(out_features, in_features, tokens):
    """No warm-up: the launch record of a padded layer is planned inside the capture, so the kernels
    that fill its padded copies are captured, not run. An eager call on the capture's stream before
    the first replay uses that record: it fills the copies first (the record's ``unfilled``), and the
    result matches float64; so does the replay (not yet run on a GPU)."""
    layer = spt.SparseLinear.from_dense(linear(out_features, in_features, seed=16, device="cuda"))
    static_x = torch.randn(tokens, in_features, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static_y = layer(static_x)
    (record,) = _records(layer)
    assert record.unfilled and record.captured
    with torch.cuda.stream(side):
        eager = layer(static_x)
    torch.cuda.synchronize()
    # (its record has scratch, a split-K workspace: the eager call plans its own beside it)
    assert not record.unfilled and record in _records(layer)
    check_against_float64(layer, static_x, eager)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, eager)


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("lead", [(1,), (16,), (2, 1), (4, 4)])
def test_calls_through_the_last_call_equal_the_full_path(dtype, lead, monkeypatch):
    """A call like the layer's last one launches its record directly (integrations/torch/last_call.py):
    the same bits as the full path, x of any leading dimensions; an in-place weight write, a side
    stream and another token count go back to the full path, which computes with them."""
    from sparsile.integrations.torch.record_cache import RecordCache

    layer = spt.SparseLinear.from_dense(linear(4096, 4096, seed=8, device="cuda"), dtype, activation="silu")
    gen = torch.Generator(device="cuda").manual_seed(9)
    x = torch.randn(*lead, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    full = _poisoned_call(layer, x).clone()
    assert layer.__dict__["_last"] is not None
    run = RecordCache.run
    monkeypatch.setattr(RecordCache, "run", lambda *a, **k: pytest.fail("the full path ran"))
    fast = _poisoned_call(layer, x.clone())
    assert fast.shape == (*lead, 4096) and torch.equal(fast, full)
    check_against_float64(layer, x, fast)
    monkeypatch.setattr(RecordCache, "run", run)
    with torch.no_grad():
        layer.bias.add_(0.5)  # written in place: read by the next call
    written = _poisoned_call(layer, x)
    check_against_float64(layer, x, written)
    assert not torch.equal(written, full)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = layer(x)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, written)
    fewer = x.reshape(-1, 4096)[:1]  # (another plan: the rows' bits may differ, the values may not)
    check_against_float64(layer, fewer, _poisoned_call(layer, fewer))


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_the_direct_call_equals_module_call_and_hooks_still_run(dtype):
    """``SparseLinear.__call__`` runs a plain eager call without ``nn.Module.__call__``: the same bits
    as through it, on the default stream (no capture query there) and on a side stream; a forward
    hook sends calls through ``nn.Module.__call__`` again, and runs."""
    layer = spt.SparseLinear.from_dense(linear(4096, 4096, seed=10, device="cuda"), dtype)
    x = torch.randn(16, 4096, device="cuda", generator=torch.Generator(device="cuda").manual_seed(11)
                    ).to(torch.bfloat16)
    through_module = torch.nn.Module.__call__(layer, x).clone()
    direct = _poisoned_call(layer, x)
    assert torch.equal(direct, through_module)
    check_against_float64(layer, x, direct)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = [layer(x) for _ in range(2)]  # the second through the last call, on the side stream
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(y, direct) for y in on_side)
    seen = []
    handle = layer.register_forward_hook(lambda m, args, out: seen.append(out.shape) or out * 2)
    hooked = _poisoned_call(layer, x)
    handle.remove()
    assert seen == [(16, 4096)] and torch.equal(hooked, direct * 2)


@pytest.mark.parametrize(("dtype", "shape", "tokens"), [("bf16", (4096, 4096), 16), ("bf16", (1024, 8192), 4),
                                                         ("e4m3", (8192, 8192), 16), ("e4m3", (4096, 4096), 1)])
def test_repeated_calls_replay_a_captured_graph_with_the_same_bits(dtype, shape, tokens):
    """Calls with x and y at the same addresses are captured once and then launched as a CUDA graph
    (integrations/torch/graph_launch.py): the same bits as the native launch, every element of a
    poisoned y written, new contents of x read (8192 x 8192 e4m3 at T = 16: the quantizer and the
    GEMM, two launches in the graph)."""
    layer = spt.SparseLinear.from_dense(linear(*shape, seed=12, device="cuda"), dtype, activation="silu")
    gen = torch.Generator(device="cuda").manual_seed(13)
    x = torch.randn(tokens, shape[1], device="cuda", generator=gen).to(torch.bfloat16)
    first = _poisoned_call(layer, x).cpu()  # (host copies: no device block of y's size held between calls)
    outs = [_poisoned_call(layer, x).cpu() for _ in range(5)]
    replays = layer.__dict__["_last"].replays
    assert replays is not None and replays.replayed >= 2, "the calls at one address pair were not replayed"
    assert all(torch.equal(out, first) for out in outs)
    check_against_float64(layer, x, outs[-1].cuda())
    before = replays.replayed
    x.copy_(torch.randn(tokens, shape[1], device="cuda", generator=gen).to(torch.bfloat16))
    y = _poisoned_call(layer, x)
    assert replays.replayed == before + 1
    check_against_float64(layer, x, y)


@pytest.mark.parametrize("how", ["buffers", "data"])
@pytest.mark.parametrize("name", ["values", "meta", "bias"])
def test_a_buffer_replaced_without_setattr_reaches_replayed_calls(how, name):
    """After calls that launch natively and replay a captured graph, a buffer replaced the ways torch
    does not report (``layer._buffers[name] = t``, as accelerate's ``set_module_tensor_to_device``
    does; ``layer.<name>.data = t``) is read by the next call: the records and the graph of the old
    tensors are not launched again (they read the old memory: a silent stale result)."""
    layer = spt.SparseLinear.from_dense(linear(4096, 4096, seed=21, device="cuda"), "bf16")
    other = spt.SparseLinear.from_dense(linear(4096, 4096, seed=22, device="cuda"), "bf16")
    x = torch.randn(16, 4096, device="cuda", generator=torch.Generator(device="cuda").manual_seed(23)
                    ).to(torch.bfloat16)
    before = [_poisoned_call(layer, x).cpu() for _ in range(5)][-1]
    assert layer.__dict__["_last"].replays.replayed >= 1, "the calls were not replayed"
    new = getattr(other, name).detach().clone()
    if how == "buffers":
        layer._buffers[name] = new
    else:
        getattr(layer, name).data = new
    y = _poisoned_call(layer, x)
    assert not torch.equal(y.cpu(), before)
    check_against_float64(layer, x, y)
    assert torch.equal(_poisoned_call(layer, x), y)
