"""sparsile.torch on the GPU: every weight type x epilogue against float64, N-D inputs and T = 1, the
launch record (one plan per shape, prepared launches), torch.compile(fullgraph=True) with Inductor,
CUDA graph capture and replay, a side stream, inference_mode, .cuda() of a CPU-built layer."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear, warm_up_on_a_side_stream

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


def _layer(n=256, k=512, dtype=None, activation=None, bias=True, seed=0):
    return spt.SparseLinear.from_dense(linear(n, k, bias=bias, seed=seed, device="cuda"), dtype,
                                       activation=activation)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "e4m3"])
@pytest.mark.parametrize("activation", [None, "relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(1,), (16,), (33,), (2, 3), ()])
def test_every_dtype_and_epilogue_against_float64(dtype, activation, bias, lead):
    layer = _layer(dtype=dtype, activation=activation, bias=bias)
    x_dtype = torch.float16 if dtype == "f16" else torch.bfloat16
    x = torch.randn(*lead, 512, device="cuda").to(x_dtype)
    check_against_float64(layer, x, layer(x))


@pytest.mark.parametrize("tokens", [1, 16, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_on_small_integers(tokens, dtype):
    """±1 weights in a 2:4 pattern, x in {-1, 0, 1}, integer bias: every sum is an integer of
    magnitude below 256, exact in bf16 and f16, so y equals the float64 product exactly."""
    gen = torch.Generator().manual_seed(tokens)
    n, k = 384, 256
    signs = torch.randint(0, 2, (n, k // 4, 4), generator=gen) * 2 - 1
    keep = torch.zeros(n, k // 4, 4).scatter_(2, torch.rand(n, k // 4, 4, generator=gen).topk(2, dim=2).indices, 1.0)
    dense = torch.nn.Linear(k, n)
    with torch.no_grad():
        dense.weight.copy_((signs * keep).reshape(n, k))
        dense.bias.copy_(torch.randint(-8, 8, (n,), generator=gen))
    dense = dense.to("cuda", dtype)
    layer = spt.SparseLinear.from_dense(dense)
    x = torch.randint(-1, 2, (tokens, k), generator=gen).to("cuda", dtype)
    exact = x.double() @ dense.weight.double().T + dense.bias.double()
    assert torch.equal(layer(x).double(), exact)


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("row_stride", [5 * 512, 512 + 4, 512 + 1], ids=["last-token", "8B", "odd"])
def test_a_single_row_of_any_stride(dtype, row_stride):
    """x = hidden[:, -1, :] and other (1, K) rows that torch calls contiguous whatever their row
    stride (here 5 K, K + 4 and K + 1 elements: the last two not 16-byte multiples): the layer and
    the op give the bits of a packed copy, eager and then replayed (arrays.packed_row)."""
    layer = _layer(dtype=dtype)
    wide = torch.randn(4, row_stride, device="cuda").to(torch.bfloat16)
    for _ in range(3):  # the first call plans, later ones replay the record
        wide.normal_()
        x = wide[1:2, :512]
        assert x.is_contiguous() and x.stride(0) == row_stride
        got = layer(x)  # (first: the record is planned with the strided row)
        assert torch.equal(got, layer(x.clone()))
        if dtype == "bf16":  # (an e4m3 x is a converted copy: packed)
            op = torch.ops.sparsile.sparse_linear
            with torch.no_grad():
                assert torch.equal(op(x, layer.values, layer.meta, layer.bias),
                                   op(x.clone(), layer.values, layer.meta, layer.bias))
        check_against_float64(layer, x, layer(x))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_out_dtype(out_dtype):
    layer = spt.SparseLinear.from_dense(linear(256, 512, device="cuda"), "e4m3", out_dtype=out_dtype)
    x = torch.randn(8, 512, device="cuda").to(torch.bfloat16)
    check_against_float64(layer, x, layer(x), out_dtype)


def test_large_values_do_not_overflow_bf16():
    layer = _layer(bias=False)
    x = torch.full((4, 512), 1.0e4, device="cuda").to(torch.bfloat16)  # |y| ~ 1e5, beyond float16 (65504)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    check_against_float64(layer, x, y)


def test_one_plan_per_shape_and_prepared_launches(monkeypatch):
    from sparsile.integrations.torch import _kernels

    api = _kernels.kernel_api()
    plans = []
    real = api.plan_sparse_linear

    def counting(*args, **kwargs):
        if kwargs.get("reduce") is None:  # not the one-launch variant a split-K record adds for eager calls
            plans.append(kwargs.get("out"))
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "plan_sparse_linear", counting)
    layer = _layer()
    x = torch.randn(16, 512, device="cuda").to(torch.bfloat16)
    first = layer(x)
    for _ in range(3):
        assert torch.equal(layer(x.clone()), first)
    layer(torch.randn(4, 512, device="cuda").to(torch.bfloat16))
    assert len(plans) == 2  # T = 16 and T = 4
    from sparsile.driver.launch import GpuLaunch

    if hasattr(GpuLaunch, "prepare"):  # the prepared launches are used, not plan.rebind
        assert all(r.prepared is not None for r in layer.__dict__["_records"].records.values())
    layer.cuda()  # a move drops the records; the metadata stays validated
    layer(x)
    assert len(plans) == 3


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_torch_compile_fullgraph_inductor(dtype):
    model = torch.nn.Sequential(linear(512, 256, device="cuda", seed=1), torch.nn.SiLU(),
                                linear(256, 512, device="cuda", seed=2))
    assert spt.sparsify_(model, dtype=dtype).swapped == ["0", "2"]
    x = torch.randn(2, 8, 256, device="cuda").to(torch.bfloat16)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=2 ** -7, atol=2 ** -7)


def test_torch_compile_reduce_overhead_cuda_graph_trees():
    """mode="reduce-overhead" (CUDA graph trees): the launch records of the custom op, built on the
    first compiled call with a split-K workspace (K = 8192, 4 tokens: the decode kernel splits K),
    stay out of the graph's memory pool, which refuses untracked tensors ("Detected N tensor(s) in
    the cudagraph pool not tracked as outputs", as a 32-layer Llama did before b899d46); replays
    equal eager calls of the same layers to bf16 rounding, for new inputs each time."""
    model = torch.nn.Sequential(linear(1024, 8192, device="cuda", seed=3), torch.nn.SiLU(),
                                linear(8192, 1024, device="cuda", seed=4))
    spt.sparsify_(model)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator("cuda").manual_seed(7)
    for _ in range(4):  # warm-up, recording, then replays
        x = torch.randn(4, 8192, device="cuda", generator=gen).to(torch.bfloat16)
        y = compiled(x).clone()
        torch.testing.assert_close(y, model(x), rtol=2 ** -7, atol=2 ** -7)


def test_reduce_overhead_with_more_layers_than_the_record_capacity():
    """More sparse layers than the op's record cache holds per weight (a 70B Llama has 560
    projections): every layer keeps its record from the warm-up to the recording (a record dropped
    there is rebuilt inside the capture, its allocations left in the graph's pool, which the
    recording refuses), and the records of a model that was deleted, captured ones too, are
    dropped with it, freeing its weights."""
    import gc

    from sparsile.integrations.torch import ops

    gc.collect()
    before = len(ops.RECORDS)
    layers = ops.RECORDS.capacity + 16
    model = torch.nn.Sequential(*[linear(256, 256, device="cuda", seed=i) for i in range(layers)])
    with torch.no_grad():
        for layer in model:  # randn weights scaled so that 80 layers in a row neither vanish nor overflow
            layer.weight.mul_(256 ** -0.5)
    spt.sparsify_(model)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator("cuda").manual_seed(9)
    for _ in range(4):  # warm-up, recording, then replays
        x = torch.randn(8, 256, device="cuda", generator=gen).to(torch.bfloat16)
        y = compiled(x).clone()
        torch.testing.assert_close(y, model(x), rtol=2 ** -6, atol=2 ** -6)
        assert y.isfinite().all() and y.abs().max() > 0.25
    assert len(ops.RECORDS) >= before + layers
    free_before = torch.cuda.memory_allocated()
    del model, compiled, y
    torch._dynamo.reset()
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()
    gc.collect()
    assert len(ops.RECORDS) == before
    assert torch.cuda.memory_allocated() < free_before


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("k", [512, 8192])
def test_cuda_graph_capture_and_replay(dtype, k):
    """Replays equal eager calls bit for bit; at K = 8192 the decode kernel splits K, and eager calls
    add the shares in the kernel while the captured call adds them in a second launch (e4m3: after
    the record's quantizer launch)."""
    layer = _layer(k=k, dtype=dtype, activation="relu")
    static_x = torch.randn(16, k, device="cuda").to(torch.bfloat16)
    warm_up_on_a_side_stream(lambda: layer(static_x))  # compile and plan outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    for seed in range(3):
        new = torch.randn(16, k, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        static_x.copy_(new.to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, layer(static_x))
        check_against_float64(layer, static_x, static_y)
    if k == 8192:
        records = layer.__dict__["_records"].records.values()
        # a captured e4m3 call's first launch is its quantizer's; an eager one of 16 x 256 x 8192 is
        # the one launch of the kernel that quantizes x itself (quantizes_in_kernel)
        from sparsile.integrations.torch._kernels import quantizes_in_kernel

        assert quantizes_in_kernel(16, 256, k)
        assert any(r.eager is not None and len(r.eager) == 1 and len(r.prepared) == 2 + r.quantize
                   for r in records)


def test_side_stream_is_followed():
    layer = _layer()
    x = torch.randn(16, 512, device="cuda").to(torch.bfloat16)
    expected = layer(x)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    torch.cuda._sleep(2_000_000_000)  # keep the default stream busy for about a second
    with torch.cuda.stream(side):
        y = layer(x)
        host = y.to("cpu")  # waits for the side stream only
    assert torch.equal(host, expected.cpu())
    torch.cuda.synchronize()


def test_inference_mode_and_cpu_built_layers():
    layer = spt.SparseLinear.from_dense(linear(256, 512), "bf16").cuda()
    assert layer.values.is_cuda and layer.meta.dtype == torch.int32
    x = torch.randn(1, 512, device="cuda").to(torch.bfloat16)
    with torch.inference_mode():
        y = layer(x)
    check_against_float64(layer, x, y)


def test_op_on_cuda_equals_the_module():
    layer = _layer(dtype="e4m3", activation="silu")
    x = torch.randn(5, 512, device="cuda").to(torch.bfloat16)
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    y = torch.ops.sparsile.sparse_linear(xq, layer.values, layer.meta, layer.bias, scale_x=sx,
                                         scale_w=layer.scale_w, activation="silu", out_dtype=torch.bfloat16)
    assert torch.equal(y, layer(x))


@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_op_with_a_scale_x_at_an_odd_offset(tokens):
    """A per-token scale_x that is a slice at a 4-byte offset (what torch.func.vmap's per-sample calls
    of the op pass: a38, SP0704 from the launcher inside torch's batching fallback) and an x at an odd
    offset: the same bits as the aligned call."""
    layer = _layer(dtype="e4m3")
    x = torch.randn(tokens, 512, device="cuda").to(torch.bfloat16)
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    want = torch.ops.sparsile.sparse_linear(xq, layer.values, layer.meta, layer.bias, scale_x=sx,
                                            scale_w=layer.scale_w, out_dtype=torch.bfloat16)
    check_against_float64(layer, x, want)
    odd_sx = torch.empty(tokens + 1, device="cuda")
    odd_sx[1:] = sx
    odd_xq = torch.empty(tokens * 512 + 1, device="cuda", dtype=xq.dtype)
    odd_xq[1:] = xq.reshape(-1)
    got = torch.ops.sparsile.sparse_linear(odd_xq[1:].view(tokens, 512), layer.values, layer.meta, layer.bias,
                                           scale_x=odd_sx[1:], scale_w=layer.scale_w, out_dtype=torch.bfloat16)
    assert odd_sx[1:].data_ptr() % 16 and torch.equal(got, want)


def test_reduce_overhead_at_several_token_counts_within_the_record_capacity(monkeypatch):
    """Six token counts per weight, every size warmed up before any is recorded (the order CUDA graph
    trees see when a loop cycles through sizes), with the op's per-weight capacity lowered to six:
    no size's record is dropped between its warm-up and its recording, and every size records and
    replays what eager calls compute. (With fewer records than sizes the first sizes' records would
    be rebuilt inside the capture: the documented limit, docs/torch.md.)"""
    from sparsile.integrations.torch import ops

    monkeypatch.setattr(ops.RECORDS, "capacity", 6)
    model = torch.nn.Sequential(linear(256, 256, device="cuda", seed=1), linear(256, 256, device="cuda", seed=2))
    spt.sparsify_(model)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True, dynamic=False)
    gen = torch.Generator("cuda").manual_seed(5)
    sizes = (1, 2, 3, 4, 5, 6)  # below dynamo's recompile limit (8)
    for _ in range(3):  # warm-up of every size, recording of every size, replays
        for t in sizes:
            x = torch.randn(t, 256, device="cuda", generator=gen).to(torch.bfloat16)
            torch.testing.assert_close(compiled(x).clone(), model(x), rtol=2 ** -6, atol=2 ** -6)


@pytest.mark.parametrize("native_launch", ["0", "1"])
@pytest.mark.parametrize("per_token_first", [False, True])
def test_op_per_tensor_then_per_token_scale(per_token_first, native_launch, monkeypatch):
    """One weight, one T, a per-tensor (1,) and a per-token (T,) scale_x: each call gets the record
    planned for its scale mode (ops.record_key), whichever comes first, with prepared or native
    launches (SPARSILE_TORCH_NATIVE). Token t's rows are 4^t times larger, so a record replaying
    the other mode is off by far more than rounding."""
    monkeypatch.setenv("SPARSILE_TORCH_NATIVE", native_launch)
    layer = _layer(dtype="e4m3", seed=3 + per_token_first)
    x = (torch.randn(5, 512, device="cuda") * 4.0 ** torch.arange(5, device="cuda")[:, None]).to(torch.bfloat16)
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    s1 = sx[:1].clone()

    def op(scale):
        return torch.ops.sparsile.sparse_linear(xq, layer.values, layer.meta, layer.bias, scale_x=scale,
                                                scale_w=layer.scale_w, out_dtype=torch.bfloat16)

    calls = [("token", sx), ("tensor", s1)] if per_token_first else [("tensor", s1), ("token", sx)]
    got = {mode: op(scale) for mode, scale in calls}
    assert torch.equal(got["token"], layer(x))
    same = op(s1.expand(5).contiguous())  # per-token scales all equal to the per-tensor one
    torch.testing.assert_close(got["tensor"].float(), same.float(), rtol=2 ** -7, atol=1e-3)


def small_cuda_llama():
    """A 2-layer bf16 LlamaForCausalLM on CUDA (hidden 256, 4 heads, 2 kv heads, vocab 128), seeded."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=64,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return model


@pytest.mark.parametrize("tokens", [1, 16])
def test_fused_projections_of_a_small_llama_under_a_cuda_graph(tokens):
    """fuse_projections_ on a 2-layer Llama (bf16, CUDA): one capture holds one fused launch per
    group; each member's columns of a replay are within its float64 bound (the fused shape may split
    K unlike the member's own, so fused and unfused logits need not be bit-identical), a replay
    equals an eager fused forward bit for bit, and the logits stay within the benchmark's bf16
    tolerance (at most twice the dense bf16 model's distance to a float32 copy of the pruned model)."""
    import copy

    from sparsile.integrations.torch.projection_group import fused_group_of

    model = small_cuda_llama()
    dense = copy.deepcopy(model)
    report = spt.sparsify_(model, lambda m, fqn: "lm_head" not in fqn, min_features=16)
    fusion = spt.fuse_projections_(model, glu=False)  # (the hooks below would turn the gated activation off
    # in the capture only; test_torch_glu_gpu.py tests it under CUDA graphs)
    assert len(report.swapped) == 14 and len(fusion.fused) == 4 and not fusion.skipped
    with torch.no_grad():  # the dense models carry the pruned weights
        for name, m in model.named_modules():
            if isinstance(m, spt.SparseLinear):
                dense.get_submodule(name).weight.copy_(m.to_dense())
    reference = copy.deepcopy(dense).float()
    members = [(m, fused_group_of(m)) for m in model.modules() if fused_group_of(m) is not None]
    assert len(members) == 10
    ids = torch.randint(0, 128, (tokens, 1), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def forward(ids):
        return model(input_ids=ids, use_cache=False).logits

    with torch.inference_mode():
        warm_up_on_a_side_stream(lambda: forward(ids), times=2)
        seen = {}
        hooks = [m.register_forward_hook(lambda mod, args, out: seen.__setitem__(mod, (args[0], out)))
                 for m, _ in members]
        runs = [g.runs for _, g in members]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = forward(ids)
        for h in hooks:
            h.remove()
        assert [g.runs - r for (_, g), r in zip(members, runs)] == [1] * 10  # one fused launch per group
        for seed in range(2):
            ids.copy_(torch.randint(0, 128, (tokens, 1), device="cuda", generator=torch.Generator("cuda")
                                    .manual_seed(seed + 2)))
            graph.replay()
            torch.cuda.synchronize()
            for m, (x, y) in seen.items():
                check_against_float64(m, x, y)
            assert torch.equal(static, forward(ids))
            ref = reference(input_ids=ids, use_cache=False).logits.float()
            dense_err = (dense(input_ids=ids, use_cache=False).logits.float() - ref).abs().max().item()
            assert (static.float() - ref).abs().max().item() <= 2.0 * dense_err


def test_traced_fusion_under_torch_compile_reduce_overhead():
    """fuse_projections_(traced=True) on CUDA: the traced graph of a 2-layer Llama holds one fused
    op per group (8 sparse ops, not 14), and under mode="reduce-overhead" (CUDA graph trees) the
    compiled model gives the eager unfused model's logits to bf16 tolerance on new inputs each
    replay. (Whether graph trees skip copying the fused weights, which are marked static, shows
    in bench_llama's timing, not here.)"""
    import copy

    model = small_cuda_llama()
    spt.sparsify_(model, lambda m, fqn: "lm_head" not in fqn, min_features=16)
    unfused = copy.deepcopy(model)
    assert len(spt.fuse_projections_(model, traced=True, glu=False).fused) == 4
    ops = []

    def counting(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "sparsile" in str(n.target))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=counting)(input_ids=torch.zeros((16, 1), dtype=torch.long, device="cuda"),
                                               use_cache=False)
    assert ops.count("sparsile.sparse_linear") == 8
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    gen = torch.Generator("cuda").manual_seed(3)
    with torch.no_grad():
        for _ in range(4):  # warm-up, recording, then replays
            ids = torch.randint(0, 128, (16, 1), device="cuda", generator=gen)
            got = compiled(input_ids=ids, use_cache=False).logits.float().clone()
            ref = unfused(input_ids=ids, use_cache=False).logits.float()
            torch.testing.assert_close(got, ref, rtol=2 ** -6, atol=2 ** -6)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_prepared_quantizer_equals_the_generic_one(x_dtype, monkeypatch):
    """Eager e4m3 calls quantize x through a launch prepared once per (T, K, dtype, device): the same
    bits as the generic kernel launch, a misaligned view included, one preparation per key, and
    at most QUANTIZERS_KEPT kept."""
    from sparsile.integrations.torch import _kernels, quantize

    monkeypatch.setattr(quantize, "_QUANTIZERS", type(quantize._QUANTIZERS)())
    monkeypatch.setattr(quantize, "QUANTIZERS_KEPT", 2)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for tokens, k in ((1, 512), (5, 4096), (64, 1000), (5, 4096)):
        x = (torch.randn(tokens, k + 8, device="cuda", generator=gen) * 50).to(x_dtype)
        for view in (x[:, :k].contiguous(), x.reshape(-1)[1:1 + tokens * k].view(tokens, k)):
            xq, scale = _kernels.quantize_per_token(view)
            ref_q, ref_scale = _kernels.kernel_api().quantize(view.clone())
            assert torch.equal(xq.view(torch.uint8), ref_q.view(torch.uint8))
            assert torch.equal(scale.view(torch.int32), ref_scale.reshape(-1).view(torch.int32))
    assert list(quantize._QUANTIZERS) == [(5, 4096, x_dtype, 0), (64, 1000, x_dtype, 0)]  # (1, 512) dropped
