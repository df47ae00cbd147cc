"""fuse_projections_ under a CUDA graph on the GPU: a group released at run time after a graph captured
its fused launch keeps its members' views of the fused copy (own_rows.graph_replays), so that an in-place
write to a member still reaches the memory the graph replays."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear, warm_up_on_a_side_stream

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]

NAMES = ("q_proj", "k_proj", "v_proj")


def _x(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 512, generator=gen).to(torch.bfloat16).cuda()


def test_a_group_released_after_a_graph_captured_its_fused_run_keeps_writes_reaching_the_graph():
    """q/k/v fused, one fused launch captured into a CUDA graph, then the group released eagerly (the members
    fed different inputs, as in cross-attention), then k_proj's weight written in place: each replay must
    compute k_proj's columns with the written weight (against float64 of the member's weight as it is now).
    Before, the release gave the members copies of their rows: the write went to the copy, and the graph
    replayed the fused copy's old rows without a word."""
    from sparsile.integrations.torch.projection_group import PARTIAL_RUNS_LIMIT, fused_group_of

    block = torch.nn.Module()
    for i, (name, n) in enumerate(zip(NAMES, (256, 128, 128))):
        setattr(block, name, spt.SparseLinear.from_dense(linear(n, 512, seed=i, device="cuda")))
    spt.fuse_projections_(block)
    group = fused_group_of(block.q_proj)
    fused = group.fused
    x = _x(4, 1)

    def calls():
        return [getattr(block, name)(x) for name in NAMES]

    with torch.inference_mode():
        warm_up_on_a_side_stream(calls, times=2)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = calls()
        captured = [r for cache in (fused.__dict__["_records"],)
                    for r in (*cache.records.values(), *cache.retired.values()) if r.captured]
        assert captured and not any(r.copies_weight for r in captured)  # (the graph reads the fused weight in place)
        for step in range(PARTIAL_RUNS_LIMIT + 1):  # released: q reads other inputs than k and v
            block.q_proj(_x(1, 10 + step))
            if step == 0:
                block.k_proj(_x(3, 9))
                block.v_proj(_x(3, 9))
        assert fused_group_of(block.q_proj) is None and block.k_proj.values._is_view()
        with torch.no_grad():
            block.k_proj.values.copy_(block.k_proj.values.flip(0))
        for seed in range(2):
            x.copy_(_x(4, 20 + seed))
            for y in static:
                y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for name, y in zip(NAMES, static):
                check_against_float64(getattr(block, name), x, y)


def test_a_released_group_s_padded_records_live_on_and_a_member_s_load_state_dict_refreshes_them():
    """As above, with shapes whose plan reads padded copies of the fused weight (192 fused rows, 520 input
    features: test_torch_native_gpu's padded shapes), and nothing left of the group but its members: after
    the release the fused layer was collected with its record cache, freeing the captured record's padded
    copies under the graph (a filler of their sizes takes the memory here), and k_proj's load_state_dict
    never refreshed them (the graph replayed k_proj's old rows). Now the members keep the fused layers
    (own_rows.keep_replayed) and sync them: each replay computes every member with its weight as it is now."""
    import gc

    from sparsile.integrations.torch.projection_group import PARTIAL_RUNS_LIMIT, fused_group_of

    def x_of(rows: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(rows, 520, generator=gen).to(torch.bfloat16).cuda()

    block = torch.nn.Module()
    for i, (name, n) in enumerate(zip(NAMES, (96, 48, 48))):
        setattr(block, name, spt.SparseLinear.from_dense(linear(n, 520, seed=i, device="cuda")))
    spt.fuse_projections_(block)
    x = x_of(4, 1)

    def calls():
        return [getattr(block, name)(x) for name in NAMES]

    side = torch.cuda.Stream()
    with torch.inference_mode():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # (warmed up and captured on one stream: the captured record is the warm-up's,
            calls()                   # outside the graph's pool, as test_torch_native_gpu's graph tests do)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            static = calls()
        group = fused_group_of(block.q_proj)
        captured = [r for r in (*group.fused.__dict__["_records"].records.values(),
                                *group.fused.__dict__["_records"].retired.values()) if r.captured]
        assert any(r.copies_weight for r in captured)  # (the graph reads padded copies)
        sizes = [t.numel() * t.element_size() for r in captured for t in r.kept]
        del group, captured
        for step in range(PARTIAL_RUNS_LIMIT + 1):  # released: q reads other inputs than k and v
            block.q_proj(x_of(1, 10 + step))
            if step == 0:
                block.k_proj(x_of(3, 9))
                block.v_proj(x_of(3, 9))
    assert fused_group_of(block.q_proj) is None and block.k_proj.values._is_view()
    gc.collect()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):  # (the caching allocator hands a freed block out again on the stream that freed it)
        filler = [torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda") for n in sizes]
    torch.cuda.synchronize()
    new = spt.SparseLinear.from_dense(linear(48, 520, seed=7, device="cuda"))
    block.k_proj.load_state_dict(new.state_dict())
    for seed in range(2):
        x.copy_(x_of(4, 20 + seed))
        with torch.inference_mode():  # (the outputs were made under inference mode: written there only)
            for y in static:
                y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for name, y in zip(NAMES, static):
            check_against_float64(getattr(block, name), x, y)
    del filler
