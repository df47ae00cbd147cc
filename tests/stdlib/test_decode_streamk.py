"""The stream-K decode kernel (STREAMK of sparse_decode_sm90.spk, ``plan_sparse_decode(streamk=True)``):
the (slab, K step) units split evenly over a grid of the resident CTA slots, shared slabs added up by
the last CTA to arrive. Interpreter tests against float64 with poisoned outputs, the split's
arithmetic as a property, the checks, the register budget; GPU tests marked."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparsile.stdlib.kernels.decode import SparseDecodePlan, plan_sparse_decode
from sparsile.stdlib.kernels.decode_config import STREAMK_MAX_PRODUCT, DecodeConfig, streamk_ctas
from sparsile.stdlib.kernels.decode_tuning import DecodeCandidate, candidate_space

from .test_decode_api import GPU_CASES, check_gpu_decode, ptxas_report
from .test_linear_api import _code_message, assert_linear_close, epilogue_case, problem


def runs(units: int, ctas: int) -> list[tuple[int, int]]:
    """The kernel's split (``unit_range``): CTA p's units [p * units // P, (p + 1) * units // P)."""
    return [(p * units // ctas, (p + 1) * units // ctas) for p in range(ctas)]


def owner(u: int, units: int, ctas: int) -> int:
    """The kernel's ``owner``: the CTA whose run holds unit u."""
    return ((u + 1) * ctas + units - 1) // units - 1


@given(units=st.integers(1, 5000), ctas=st.integers(1, 300))
def test_owner_inverts_the_split(units, ctas):
    """Every unit's owner is the CTA whose run holds it; the runs tile [0, units) in order."""
    split = runs(units, ctas)
    assert split[0][0] == 0 and split[-1][1] == units
    assert all(a[1] == b[0] for a, b in itertools.pairwise(split))
    for u in {0, units - 1, units // 2, units // 3, (2 * units) // 3}:
        p = owner(u, units, ctas)
        assert split[p][0] <= u < split[p][1]


@given(slabs=st.integers(1, 80), steps=st.integers(1, 40), ctas=st.integers(1, 300))
def test_every_cta_between_a_slabs_owners_reports_a_part(slabs, steps, ctas):
    """The arrivals a shared slab waits for (owner of its last unit - owner of its first + 1) are the
    CTAs whose slab loop visits it with a part of it (``multiply_units``: slabs first // steps ..
    cdiv(last, steps) - 1, an empty run included), and each writes its part to a tile no other part
    of another slab uses (W[2 p + min(slab - first slab, 1)])."""
    units = slabs * steps
    split = runs(units, ctas)
    visits: dict[int, list[int]] = {}
    tiles = set()
    for p, (first, last) in enumerate(split):
        for slab in range(first // steps, -(-last // steps)):
            lo, hi = max(first, slab * steps), min(last, slab * steps + steps)
            if hi - lo != steps:
                visits.setdefault(slab, []).append(p)
                tile = 2 * p + min(slab - first // steps, 1)
                assert tile not in tiles
                tiles.add(tile)
    for slab, ps in visits.items():
        c0, c1 = owner(slab * steps, units, ctas), owner(slab * steps + steps - 1, units, ctas)
        assert ps == list(range(c0, c1 + 1))


# dtype, N_out, T, K, bm, SMs, tiled, feature-major: slabs and K steps against the CTAs so that runs
# end inside slabs, a slab spans several runs, runs are empty (more CTAs than units), M is ragged
STREAMK_CASES = [
    ("bf16", 1000, 5, 512, 128, 3, False, False),   # 8 slabs x 4 steps on 6 CTAs: runs of 5-6 units
    ("e4m3", 700, 33, 768, 64, 4, True, False),     # 11 slabs x 3 steps on 8 CTAs, tiled
    ("f16", 520, 64, 384, 256, 1, False, True),     # 3 slabs x 3 steps on 1 CTA: every slab whole
    ("bf16", 130, 16, 1000, 128, 8, False, False),  # 2 slabs x 8 steps on 16 CTAs: one unit each
    ("f16", 200, 3, 1280, 64, 3, False, True),      # 4 slabs x 10 steps on 6 CTAs, feature-major
]


@pytest.mark.parametrize("dtype,n_out,t,k,bm,sms,tiled,fm", STREAMK_CASES)
def test_streamk_kernel_matches_float64_reference(dtype, n_out, t, k, bm, sms, tiled, fm):
    """streamk=True: the resident CTA slots (at most one per unit), every run of units streamed through
    one ring, shared slabs added by the last CTA to arrive; the fused epilogue; output poisoned; run
    twice (the counters back at zero after each run)."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + k + 1)
    want, epi = epilogue_case(dtype, n_out, t, "float32", "f32", "silu", "channel", "token")
    out = np.full((n_out, t) if fm else (t, n_out), np.nan, np.float32)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=bm, split_k=1, streamk=True,
                              num_sms=sms, tiled=tiled, feature_major=fm, out=out, out_dtype="float32", **epi)
    units = -(-n_out // bm) * -(-plan.k_padded // plan.config.bk)
    assert plan.config.streamk == min(units, plan.config.ctas_per_sm * sms) and plan.grid == (plan.config.streamk, 1)
    assert plan.constexprs()["STREAMK"] == 1 and plan.constexprs()["SPLIT_K"] == 1 and len(plan.launches()) == 1
    assert plan.kernel.name.startswith("sparse_decode_reduce_") and plan.reduces_in_kernel
    for _ in range(2):
        out[...] = np.nan
        assert plan.run() is out
        assert_linear_close(out.T if fm else out, weight, x, k, dtype, want, **epi)
        assert not np.asarray(plan.counters).any()


def test_streamk_runs_that_outnumber_the_units():
    """More CTAs than units (a plan asked for more SMs than the problem has units takes one CTA per
    unit): every unit its own run, every slab shared by all its steps' CTAs."""
    weight, x = problem("bf16", 64, 8, 384, seed=3)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=64, split_k=1, streamk=True,
                              num_sms=50)
    assert plan.config.streamk == 3  # one 64-row slab of three 128-column steps
    out = plan.run()
    assert_linear_close(out, weight, x, 384, "bf16", "bfloat16")


def test_streamk_is_checked():
    weight, x = problem("bf16", 512, 16, 1024, seed=6)
    for kwargs, words in [({"split_k": 2}, "split_k=2"), ({"split_k": 1, "pdl": True}, "pdl=True"),
                          ({"split_k": 1, "persistent": True}, "persistent=True")]:
        code, message = _code_message(functools.partial(plan_sparse_decode, weight.values, weight.meta, x,
                                                        interpret=True, streamk=True, **kwargs))
        assert code == "SP0860" and "the stream-K decode kernel takes no split-K" in message and words in message
    w8, x16 = problem("e4m3", 256, 4, 512, seed=6)
    code, message = _code_message(functools.partial(plan_sparse_decode, w8.values, w8.meta, x16.astype(np.float16),
                                                    interpret=True, streamk=True, split_k=1))
    assert code == "SP0860" and "16-bit x for e4m3 weights" in message
    code, message = _code_message(functools.partial(plan_sparse_decode, weight.values, weight.meta, x,
                                                    interpret=True, streamk=1))
    assert code == "SP0860" and "streamk of the decode kernel must be True, False or None" in message


def test_streamk_grid_keeps_the_kernels_arithmetic_in_32_bits():
    cfg = DecodeConfig(16, 128, 4, 1, 2)
    assert streamk_ctas(28672, 4096, cfg, 132) == 264
    assert streamk_ctas(128, 256, cfg, 132) == 2  # one slab of two steps
    huge = 2 ** 20 * 128
    assert (huge // 128 * (huge // 128) + 1) * 264 > STREAMK_MAX_PRODUCT
    assert streamk_ctas(huge, huge, cfg, 132) == 0


def test_streamk_without_split_k_takes_no_split():
    """streamk=True alone on a weight the heuristic would split: split 1."""
    weight, x = problem("bf16", 256, 4, 4096, seed=2)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, num_sms=132, streamk=True)
    assert plan.config.split_k == 1 and plan.config.streamk > 0


def test_table_entries_and_candidates_take_streamk():
    cand = DecodeCandidate.from_json({"split_k": 1, "stages": 5, "bm": 128, "streamk": True})
    assert cand.streamk and cand.to_json()["streamk"] is True and str(cand).endswith("streamk")
    for bad in ({"split_k": 2, "stages": 5, "streamk": True}, {"split_k": 1, "stages": 5, "streamk": 1},
                {"split_k": 1, "stages": 5, "streamk": True, "persistent": True}):
        with pytest.raises(ValueError, match="streamk must be true"):
            DecodeCandidate.from_json(bad)
    # 8B gate_up at T = 64: 224 slabs on 132 SMs (one CTA each at deep rings) leave a wave part-full
    space = candidate_space(28672, 4096, 64, 2, 132)
    assert any(c.streamk and c.bm == 128 for c in space)
    # 264 slabs of 128 rows at 8 tokens, two CTAs per SM at every depth that fits: whole waves
    assert not any(c.streamk and c.bm == 128 and c.stages <= 4 for c in candidate_space(33792, 4096, 8, 2, 132))


def test_streamk_plan_from_a_table_entry(monkeypatch):
    """A table entry with "streamk" gives the stream-K plan (its grid: the H200's CTA slots), unless
    pdl is asked for (the entry's split and stages on the other kernel then)."""
    from sparsile.stdlib.kernels import decode_tuning as dt

    monkeypatch.setattr(dt, "current_device", lambda interpret: ("NVIDIA H200", 132))
    monkeypatch.delenv(dt.TABLE_ENV, raising=False)
    weight, x = problem("bf16", 512, 16, 1024, seed=9)
    table = {"format": dt.TABLE_FORMAT, "gpu": "NVIDIA H200", "sms": 132, "entries": {
        dt.table_key("NVIDIA H200", 132, "bf16", 512, 1024, 16):
            {"config": {"split_k": 1, "stages": 3, "bm": 64, "streamk": True}, "us": 1.0}}}
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, table=table, num_sms=132)
    assert plan.config.source == "table" and plan.config.bm == 64
    assert plan.config.streamk == 64  # 8 slabs x 8 steps: one unit per CTA
    assert_linear_close(plan.run(), weight, x, 1024, "bf16", "bfloat16")
    with_pdl = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, table=table, num_sms=132, pdl=True)
    assert with_pdl.config.streamk == 0 and with_pdl.config.split_k == 1 and with_pdl.config.stages == 3


@pytest.mark.parametrize("dtype,bm,t", [("bf16", 128, 64), ("f16", 64, 16), ("e4m3", 128, 64), ("bf16", 256, 64)])
def test_streamk_kernel_compiles_for_sm90a(dtype, bm, t, tmp_path):
    """The stream-K kernel within its register budget (ptxas, where installed)."""
    weight, x = problem(dtype, 2048, t, 2048, seed=4)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=bm, split_k=1, streamk=True,
                              num_sms=4)
    (ck,) = plan.compile("sm_90a")
    assert "atom.acq_rel.gpu.global.add.s32" in ck.ptx and "atom.acq_rel.gpu.global.exch.b32" in ck.ptx
    report = ptxas_report(ck.ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report


@pytest.mark.gpu
@pytest.mark.parametrize("bm,tiled,sms", [(128, False, 3), (64, True, 5), (256, False, 2)])
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", [c for c in GPU_CASES if c[-1] is None])
def test_gpu_decode_streamk(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, bm, tiled, sms):
    """The stream-K kernel on the GPU, on a few SMs' worth of CTAs so that runs share slabs."""
    plan = check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, 1, tiled=tiled, bm=bm,
                            streamk=True, num_sms=sms)
    assert isinstance(plan, SparseDecodePlan) and plan.config.streamk > 0


def test_streamk_space_keeps_the_tables_entry():
    """--streamk-only: the file's entry and the stream-K candidates, nothing else (a bad entry is
    left out)."""
    from sparsile.stdlib.kernels.decode_tuning import streamk_space

    entry = {"config": {"split_k": 2, "stages": 4, "reduce": "kernel", "bm": 64}, "us": 9.0}
    space = streamk_space(entry)(28672, 4096, 64, 2, 132)
    assert space[0] == DecodeCandidate(2, 4, "kernel", 64)
    assert len(space) > 1 and all(c.streamk for c in space[1:])
    assert all(c.streamk for c in streamk_space({"config": {"split_k": 0}})(28672, 4096, 64, 2, 132))
    assert all(c.streamk for c in streamk_space(None)(28672, 4096, 64, 2, 132))
