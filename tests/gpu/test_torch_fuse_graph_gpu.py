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
