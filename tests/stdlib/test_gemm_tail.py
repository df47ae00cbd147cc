"""stdlib/kernels/gemm_tail.py: the tail split of the sparse GEMM (whole waves unsplit, the last
wave's rows split along K). Its row arithmetic, its configs in the tuner's space and the table, and
its launches in the interpreter against float64 with poisoned outputs; on the GPU at the shape that
motivated it (8B qkv at T = 1024)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sparsile.stdlib.kernels import KERNELS, plan_sparse_matmul
from sparsile.stdlib.kernels.gemm import BM, SparseMatmul
from sparsile.stdlib.kernels.gemm_config import GemmConfig
from sparsile.stdlib.kernels.gemm_tail import TailSplitMatmul, head_rows, tail_splits, tail_tiles
from sparsile.stdlib.kernels.linear import plan_sparse_linear
from sparsile.stdlib.kernels.linear_tuning import layer_space, with_linear_config
from sparsile.stdlib.kernels.tuning import (
    TABLE_FORMAT,
    config_space,
    index_table,
    launch,
    run_with_table,
    table_key,
    with_config,
)
from sparsile.tests.stdlib.test_gemm_api import assert_close, problem, reference


@pytest.mark.parametrize("m,n,bn,sms,pair,rows", [
    (6144, 1024, 256, 132, False, 33 * BM),    # 192 tiles: one wave of 132 (33 row blocks x 4), 60 left
    (6144, 1024, 256, 132, True, 16 * 2 * BM),  # 96 pair tiles on 66 clusters: 16 pair rows (64 tiles) fill one round
    (28672, 512, 256, 132, False, 198 * BM),   # 448 tiles: three waves of 396, 52 left
    (4096, 4096, 256, 132, False, 24 * BM),    # 512 tiles, 16 per row block: 24 blocks (384 tiles) of 2.9 waves
    (4096, 512, 256, 132, False, 0),           # 64 tiles: less than one wave
    (132 * BM, 256, 256, 132, False, 0),       # exactly one wave: no tail
    (700, 40, 64, 4, False, 4 * BM),           # 6 tiles on 4 SMs
    (700, 40, 64, 1, True, 0),                 # no cluster fits on one SM
    (700, 0, 64, 4, False, 0),                 # an empty C
])
def test_head_rows_fill_whole_rounds(m: int, n: int, bn: int, sms: int, pair: bool, rows: int) -> None:
    assert head_rows(m, n, bn, sms, pair) == rows


@given(st.integers(1, 40_000), st.integers(1, 9000), st.sampled_from([16, 32, 64, 128, 256]),
       st.integers(1, 200), st.booleans())
def test_head_rows_are_the_most_whole_row_blocks_of_whole_rounds(m: int, n: int, bn: int, sms: int,
                                                                 pair: bool) -> None:
    rows = head_rows(m, n, bn, sms, pair)
    unit, slots = (2 * BM, sms // 2) if pair else (BM, sms)
    row_tiles = -(-n // bn)
    assert rows % unit == 0 and 0 <= rows < m
    if rows:
        rounds = -(-m // unit) * row_tiles // slots
        assert rows // unit * row_tiles <= rounds * slots < (rows // unit + 1) * row_tiles
        assert tail_tiles(m, n, bn, sms, pair) == -(-(m - rows) // BM) * row_tiles
        if pair:  # the head's pair tiles fill whole rounds of the CTA-pair kernel's grid
            ctas = min(2 * rows // unit * row_tiles, sms - sms % 2)
            assert -(-(rows // unit * row_tiles) // (ctas // 2)) <= rounds
    else:
        assert tail_tiles(m, n, bn, sms, pair) == 0


def test_tail_splits_fit_one_wave_and_keep_k_steps() -> None:
    assert tail_splits(6144, 1024, 64, 256, 132) == [2]      # 60 tail tiles: x2 fits, x4 does not
    assert tail_splits(6144, 1024, 8, 256, 132) == [2]       # shares of 4 K steps
    assert tail_splits(6144, 1024, 7, 256, 132) == []        # shares of 3
    assert tail_splits(28672, 512, 64, 256, 132) == [2]      # 52 tail tiles
    assert tail_splits(4096, 512, 64, 256, 132) == []        # no head
    assert tail_splits(6144, 1024, 64, 256, 132, pair=True) == [2]  # 64 tail tiles after a pair head


def test_config_space_offers_tail_splits_where_the_last_wave_is_part_full() -> None:
    space = config_space(KERNELS["bf16"], 6144, 1024, 4096, 132)
    tails = [c for c in space if c.tail_split]
    assert tails and {c.tail_split for c in tails} == {2} and {c.stages for c in tails} == {4, 5}
    assert GemmConfig(256, 4, 1, False, tail_split=2) in tails and GemmConfig(256, 4, 1, True, tail_split=2) in tails
    assert not any(c.tail_split for c in config_space(KERNELS["bf16"], 4096, 512, 4096, 132))  # < one wave
    assert not any(c.tail_split for c in config_space(KERNELS["bf16"], 6144, 1024, 4096, 132, tails=False))
    assert not any(c.tail_split for c in layer_space(KERNELS["bf16"], 6144, 1024, 4096, 132))


def test_the_layer_has_no_tail_split() -> None:
    """The torch layer's tuner times no tail split (its plans have none), and a config with one is
    refused rather than run as its unsplit twin."""
    weight, x = problem("bf16", 700, 80, 512, seed=1)
    base = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, num_sms=4, kernel="gemm")
    with pytest.raises(ValueError, match="no tail split"):
        with_linear_config(base, GemmConfig(64, 4, 1, tail_split=2), 4, interpret=True)


def test_tail_split_config_json_round_trip_and_checks() -> None:
    config = GemmConfig(256, 5, 1, True, 8, tail_split=2)
    assert GemmConfig.from_json(config.to_json()) == config and "tail_split=2" in str(config)
    assert "tail_split" not in GemmConfig(256).to_json()  # tables written before keep their form
    for bad in (dict(split_k=2, tail_split=2), dict(tail_split=1), dict(tail_split=-2)):
        with pytest.raises(ValueError, match="tail_split"):
            GemmConfig(128, **bad)
    bad_entry = {"config": {"BN": 128, "split_k": 2, "tail_split": 2}}
    assert index_table({table_key("bf16", 256, 64, 512): bad_entry}) == {}  # skipped like other malformed entries


@pytest.mark.parametrize("dtype,m,n,k,config,sms,mt", [
    ("bf16", 700, 40, 512, GemmConfig(64, 4, 1, tail_split=2), 4, True),    # head 512 rows, tail 188 (ragged) x2
    ("f16", 1100, 40, 1024, GemmConfig(64, 5, 1, tail_split=4), 8, True),   # tail split four ways
    ("e4m3", 650, 24, 1024, GemmConfig(32, 4, 1, tail_split=2), 4, True),   # 8-bit operands (BK 128)
    ("bf16", 700, 40, 512, GemmConfig(64, 4, 1, True, tail_split=2), 4, True),  # a CTA-pair head (2 clusters)
    ("f16", 900, 40, 512, GemmConfig(64, 4, 1, True, tail_split=2), 6, True),   # 3 pair tiles on 3 clusters
    ("s8", 700, 40, 1000, GemmConfig(64, 4, 1, tail_split=2), 4, False),    # 8-bit words, row-major
    ("tf32", 650, 60, 300, GemmConfig(32, 4, 1, tail_split=2), 5, False),   # tf32's interleave, ragged M, N, K
    ("f16", 700, 40, 520, GemmConfig(64, 4, 1, True, tail_split=2), 4, False),  # 17 words a row: no TMA for them
    ("e4m3", 517, 40, 1024, GemmConfig(64, 4, 1, True, tail_split=2), 4, True),  # a tail of 5 rows
])
def test_tail_split_matches_float64(dtype: str, m: int, n: int, k: int, config: GemmConfig, sms: int,
                                    mt: bool) -> None:
    weight, b = problem(dtype, m, n, k, seed=m + k)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    plan = with_config(base, config, sms, interpret=True)
    assert isinstance(plan, TailSplitMatmul)
    head, tail = plan.parts
    rows = head_rows(m, n, config.bn, sms, config.pair)
    assert rows and (head.m, tail.m, head.split_k, tail.split_k) == (rows, m - rows, 1, config.tail_split)
    assert (head.pair_ctas > 0) == config.pair and tail.pair_ctas == 0 and head.workspace is None
    assert plan.workspace is tail.workspace and tail.workspace.shape == (config.tail_split, m - rows, n)
    assert all(p.kernel.name.endswith("_mt") == mt for p in plan.parts)  # the metadata by TMA where it can go
    poison = np.nan if plan.out.dtype.kind == "f" else -12345
    plan.out[...] = poison
    plan.workspace[...] = poison
    c = launch(plan, config, interpret=True)
    assert c is plan.out
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_any_tail_split_that_applies_matches_float64(data: st.DataObject) -> None:
    """Random operand types, ragged M, N and K, BN, SMs, heads with and without CTA pairs, splits 2
    and 4, drawn so that the tail split applies (a head of one round, a tail of 1-2 row blocks whose
    CTAs fit one wave, shares of at least 4 K steps): C as float64 computes it, with the outputs and
    the partial sums poisoned."""
    dtype = data.draw(st.sampled_from(["f16", "bf16", "e4m3", "s8", "tf32"]))
    pair, split = data.draw(st.booleans()) and dtype in ("f16", "bf16", "e4m3"), data.draw(st.sampled_from([2, 4]))
    bn, row_tiles, tail_blocks = data.draw(st.sampled_from([16, 32, 64])), data.draw(st.integers(1, 3)), \
        data.draw(st.integers(1, 2))
    n = row_tiles * bn - data.draw(st.integers(0, bn - 1))
    tail_ctas = tail_blocks * row_tiles * split
    sms = data.draw(st.integers(max(tail_ctas, 2 * row_tiles if pair else row_tiles), tail_ctas + 4))
    unit, slots = (2 * BM, sms // 2) if pair else (BM, sms)
    m = slots // row_tiles * unit + tail_blocks * BM - data.draw(st.integers(0, BM - 1))
    choice = KERNELS[dtype]
    k_steps = data.draw(st.integers(4 * split, 4 * split + 3))
    k = k_steps * choice.block_k - data.draw(st.integers(0, 3)) * choice.k_align  # ragged last step
    steps = -(-(-(-k // choice.k_align) * choice.k_align) // choice.block_k)
    assume(split in tail_splits(m, n, steps, bn, sms, pair))
    weight, b = problem(dtype, m, n, k, seed=m * n + k)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    config = GemmConfig(bn, 4, 1, pair, tail_split=split)
    plan = with_config(base, config, sms, interpret=True)
    assert isinstance(plan, TailSplitMatmul) and (plan.head.pair_ctas > 0) == pair
    poison = np.nan if plan.out.dtype.kind == "f" else -12345
    plan.out[...] = poison
    plan.workspace[...] = poison
    ref, absprod = reference(weight, b)
    assert_close(launch(plan, config, interpret=True), ref, absprod, k, dtype)


@pytest.mark.parametrize("m,sms,why", [
    (512, 4, "4 tiles on 4 SMs: one full wave"),
    (640, 3, "a head of 3 tiles, a tail of 2 tiles x 2 shares > 3 SMs"),
])
def test_a_tail_split_entry_runs_unsplit_where_it_does_not_apply(m: int, sms: int, why: str) -> None:
    """A table entry is found for other N (the nearby rule); where C's last wave is full, or its
    tail's CTAs would not fit one wave, the entry's tail split is dropped and the rest of it runs."""
    weight, b = problem("bf16", m, 40, 512, seed=3)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    plan = with_config(base, GemmConfig(64, 4, 1, tail_split=2), sms, interpret=True)
    assert isinstance(plan, SparseMatmul) and (plan.split_k, plan.workspace) == (1, None), why
    plan.out[...] = np.nan
    ref, absprod = reference(weight, b)
    assert_close(launch(plan, GemmConfig(64, 4, 1, tail_split=2), interpret=True), ref, absprod, 512, "bf16")


def test_a_pair_config_for_an_operand_without_the_pair_kernel_runs_one_cta_per_tile() -> None:
    """s8 and tf32 have no CTA-pair kernel: a (hand-written) pair entry runs unpaired, with or
    without a tail split (a pair head does not apply), instead of failing to find the kernel."""
    weight, b = problem("s8", 700, 40, 1024, seed=6)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    for config in (GemmConfig(64, 4, 1, True), GemmConfig(64, 4, 1, True, tail_split=2)):
        plan = with_config(base, config, 4, interpret=True)
        assert isinstance(plan, SparseMatmul) and plan.pair_ctas == 0
        plan.out[...] = -12345
        ref, absprod = reference(weight, b)
        assert_close(launch(plan, config, interpret=True), ref, absprod, 1024, "s8")


def test_converting_plans_take_no_tail_split() -> None:
    """C of another type than the kernel's store type goes through partial sums for every row, so
    a head could not store it: the tail split is dropped."""
    weight, b = problem("bf16", 700, 40, 512, seed=5)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm", out_dtype="bfloat16")
    plan = with_config(base, GemmConfig(64, 4, 1, tail_split=2), 4, interpret=True)
    assert isinstance(plan, SparseMatmul) and plan.split_k == 1


def test_table_entry_with_a_tail_split_runs_it(monkeypatch: Any) -> None:
    weight, b = problem("bf16", 700, 40, 512, seed=9)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    table = {"format": TABLE_FORMAT, "gpu": "Fake",
             "entries": {table_key("bf16", 700, 40, 512): {"config": GemmConfig(64, 4, 1, tail_split=2).to_json()}}}
    import sparsile.stdlib.kernels.tuning as tuning

    seen = []
    real = tuning.launch
    monkeypatch.setattr(tuning, "launch", lambda p, c, i=False: seen.append(p) or real(p, c, i))
    plan.out[...] = np.nan
    assert run_with_table(plan, table=table, interpret=True, sms=4)
    assert len(seen) == 1 and isinstance(seen[0], TailSplitMatmul) and seen[0].head.m == 4 * BM
    ref, absprod = reference(weight, b)
    assert_close(plan.out, ref, absprod, 512, "bf16")


def test_compile_gives_the_head_and_the_tail() -> None:
    weight, b = problem("bf16", 700, 40, 512, seed=4)
    base = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    plan = with_config(base, GemmConfig(64, 4, 1, tail_split=2), 4, interpret=True)
    head, tail = plan.compile("sm_90a")
    assert "_splitk" not in head.name and "_splitk" in tail.name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,pair", [("bf16", False), ("bf16", True), ("f16", False)])
def test_gpu_tail_split_at_8b_qkv_t1024(dtype: str, pair: bool) -> None:
    """6144 x 1024 x 4096 (192 tiles of BN 256: a head of one wave, a tail of 60 tiles split two
    ways; with CTA pairs a head of 64 pair tiles) on torch CUDA tensors, so that the head and the
    tail read row views in place (TMA bases inside the tensors), twice from poisoned C and
    workspace, against float64."""
    torch = pytest.importorskip("torch")
    from sparsile.backend import runtime
    from sparsile.stdlib.kernels import CompressedWeight, prune_and_compress

    if not runtime.has_gpu():
        pytest.skip("no GPU")
    sms = runtime.current_device().sm_count
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator().manual_seed(21)
    w = torch.randn(6144, 4096, generator=g).cuda()
    x = torch.randn(1024, 4096, generator=g).cuda().to(tdt)
    values, meta = prune_and_compress(w, dtype)
    base = plan_sparse_matmul(values, meta, x, kernel="gemm", split_k=1)
    config = GemmConfig(256, 4, 1, pair, tail_split=2)
    plan = with_config(base, config, sms)
    assert isinstance(plan, TailSplitMatmul) and plan.head.m == head_rows(6144, 1024, 256, sms, pair) > 0
    assert (plan.head.pair_ctas > 0) == pair
    ref, absprod = reference(CompressedWeight(values, meta), x.float().cpu().numpy())
    for _ in range(2):
        plan.out.fill_(float("nan"))
        plan.workspace.fill_(float("nan"))
        c = launch(plan, config)
        torch.cuda.synchronize()
        assert c is plan.out
        assert_close(c.cpu().numpy(), ref, absprod, 4096, dtype)
