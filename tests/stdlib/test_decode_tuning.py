"""The decode kernel's tuning sweep and tables (stdlib/kernels/decode_tuning.py): the table format,
its lookup by plan_sparse_decode / plan_sparse_linear (explicit > table > heuristic), the candidate
space and the sweep's choice with an injected timer. The GPU test runs a tiny sweep."""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.stdlib.kernels import KERNELS
from sparsile.stdlib.kernels import decode_tuning as dt
from sparsile.stdlib.kernels.decode import (
    DECODE_REDUCE_ENV,
    MAX_SPLIT,
    SMEM_PER_CTA,
    choose_decode_config,
    plan_sparse_decode,
)
from sparsile.stdlib.kernels.linear import plan_sparse_linear
from sparsile.stdlib.sparsity.errors import SparsityError

from .test_linear_api import assert_linear_close, problem

H200 = ("NVIDIA H200", 132)
N_OUT, T, K = 256, 4, 512  # bn 8


def table(entries: dict) -> dict:
    return {"format": dt.TABLE_FORMAT, "gpu": H200[0], "sms": H200[1], "entries": entries}


def entry(split: int, stages: int, reduce: str = "launch") -> dict:
    return {"config": {"split_k": split, "stages": stages, "reduce": reduce}, "us": 1.0}


KEY = dt.table_key(*H200, "bf16", N_OUT, K, 8)


@pytest.fixture
def on_h200(monkeypatch):
    """Plans look up tables as on an H200 (in the interpreter no table applies otherwise)."""
    monkeypatch.setattr(dt, "current_device", lambda interpret: H200)
    monkeypatch.delenv(dt.TABLE_ENV, raising=False)
    monkeypatch.delenv(DECODE_REDUCE_ENV, raising=False)


@pytest.fixture(scope="module")
def weight():
    return problem("bf16", N_OUT, T, K, seed=3)


def test_table_round_trip_and_key():
    t = table({KEY: entry(4, 3, "kernel")})
    loaded = dt.load_decode_table(json.loads(json.dumps(t)))
    assert loaded == {KEY: dt.DecodeCandidate(4, 3, "kernel")}
    assert KEY == "NVIDIA H200/132 bf16 256x512 bn8"
    assert dt.parse_key(KEY) == ("NVIDIA H200", 132, "bf16", 256, 512, 8)
    assert [dt.token_tile(t) for t in (1, 4, 8, 9, 16, 17, 33, 64)] == [8, 8, 8, 16, 16, 32, 64, 64]


def test_explicit_beats_table_beats_heuristic(on_h200, weight, tmp_path):
    (w, x) = weight
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(table({KEY: entry(2, 3, "kernel")})))
    heuristic = plan_sparse_decode(w.values, w.meta, x, interpret=True)
    assert heuristic.config.source == "heuristic"
    assert (heuristic.config.split_k, heuristic.config.stages) != (2, 3)
    tuned = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=path)
    assert (tuned.config.split_k, tuned.config.stages, tuned.reduces_in_kernel) == (2, 3, True)
    assert tuned.config.source == "table:decode.json"
    explicit = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=path, split_k=4)
    assert (explicit.config.split_k, explicit.config.source) == (4, "explicit")
    # the split given, the stages and 128-row slabs the heuristic gives with it (not the table's)
    assert explicit.config.bm == 128
    assert explicit.config.stages == plan_sparse_decode(w.values, w.meta, x, interpret=True, bm=128).config.stages
    # an explicit reduce wins over the table's, its split and stages stay
    launch = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=path, reduce="launch")
    assert (launch.config.split_k, launch.config.stages, launch.reduces_in_kernel) == (2, 3, False)
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True, table=False).config.source == "heuristic"


def test_environment_table_reaches_plan_sparse_linear(on_h200, weight, tmp_path, monkeypatch):
    """sparsile.torch plans through plan_sparse_linear: $SPARSILE_DECODE_TABLE changes its plan."""
    (w, x) = weight
    path = tmp_path / "env.json"
    path.write_text(json.dumps(table({KEY: entry(4, 2)})))
    monkeypatch.setenv(dt.TABLE_ENV, str(path))
    plan = plan_sparse_linear(w.values, w.meta, x, interpret=True)
    assert (plan.config.split_k, plan.config.stages, plan.config.source) == (4, 2, "table:env.json")
    assert len(plan.launches()) == 2  # reduce "launch"
    monkeypatch.setenv(DECODE_REDUCE_ENV, "kernel")  # the environment's reduce wins over the table's
    assert len(plan_sparse_linear(w.values, w.meta, x, interpret=True).launches()) == 1
    monkeypatch.setenv(dt.TABLE_ENV, "")  # empty: no table
    assert plan_sparse_linear(w.values, w.meta, x, interpret=True).config.source == "heuristic"


@pytest.mark.parametrize("key", [dt.table_key("NVIDIA H100 80GB HBM3", 132, "bf16", N_OUT, K, 8),
                                 dt.table_key("NVIDIA H200", 114, "bf16", N_OUT, K, 8),
                                 dt.table_key(*H200, "f16", N_OUT, K, 8),
                                 dt.table_key(*H200, "bf16", N_OUT, K, 16),
                                 dt.table_key(*H200, "bf16", N_OUT, 1024, 8)])
def test_only_the_exact_device_and_problem_apply(on_h200, weight, key):
    (w, x) = weight
    plan = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=table({key: entry(2, 2)}))
    assert plan.config.source == "heuristic"


def test_no_table_in_the_interpreter(weight, tmp_path, monkeypatch):
    (w, x) = weight
    monkeypatch.setenv(dt.TABLE_ENV, str(tmp_path / "missing.json"))
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True).config.source == "heuristic"


def _launch_error(call) -> tuple[str, str]:
    with pytest.raises(LaunchError) as info:
        call()
    return info.value.code, info.value.message


@pytest.mark.parametrize("data,code,message", [
    ({"entries": {}}, "SP0862",
     "the table is not a decode table (format 'sparsile-sparse-decode-table/1' with entries)"),
    ({"format": dt.TABLE_FORMAT, "entries": []}, "SP0862",
     "the table is not a decode table (format 'sparsile-sparse-decode-table/1' with entries)"),
    (table({KEY: entry(17, 3)}), "SP0863",
     f"entry '{KEY}' of the decode table: split_k must be an integer from 1 to 16, got 17"),
    (table({KEY: entry(2, 1)}), "SP0863",
     f"entry '{KEY}' of the decode table: stages must be an integer from 2 to 8, got 1"),
    (table({KEY: entry(2, 3, "host")}), "SP0863",
     f"entry '{KEY}' of the decode table: reduce must be 'launch' or 'kernel', got 'host'"),
    (table({KEY: {"config": {"split_k": 2, "stages": 3, "bm": 32}}}), "SP0863",
     f"entry '{KEY}' of the decode table: bm must be one of 128, 64, 256, got 32"),
    (table({KEY: {"config": {"split_k": 2, "stages": 3, "persistent": True}}}), "SP0863",
     f"entry '{KEY}' of the decode table: persistent must be true (with split_k 1) or false, got True"),
    (table({KEY: {"us": 1.0}}), "SP0863", f"entry '{KEY}' of the decode table: config is not an object"),
    (table({"bf16 256x512": entry(2, 3)}), "SP0863",
     "entry 'bf16 256x512' of the decode table: the name is not 'DEVICE/SMS DTYPE NxK bnB' "
     "(e.g. 'NVIDIA H200/132 bf16 4096x4096 bn16')"),
])
def test_malformed_tables_are_diagnosed(data, code, message):
    assert _launch_error(lambda: dt.load_decode_table(data)) == (code, message)


def test_a_bad_entry_names_every_config_key_in_its_help():
    with pytest.raises(LaunchError) as info:
        dt.load_decode_table(table({KEY: entry(17, 3)}))
    assert info.value.help == ('an entry is "DEVICE/SMS DTYPE NxK bnB": {"config": {"split_k", "stages", "reduce", '
                               '"bm", "persistent"}}')
    assert set(dt.DecodeCandidate(1, 2, persistent=True).to_json()) == {"split_k", "stages", "reduce", "bm",
                                                                          "persistent"}


def test_unreadable_table_through_the_environment(on_h200, weight, tmp_path, monkeypatch):
    (w, x) = weight
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv(dt.TABLE_ENV, str(bad))
    code, message = _launch_error(lambda: plan_sparse_linear(w.values, w.meta, x, interpret=True))
    assert code == "SP0861" and message.startswith(f"cannot read the decode table `{bad}`: Expecting property name")
    monkeypatch.setenv(dt.TABLE_ENV, str(tmp_path / "none.json"))
    code, message = _launch_error(lambda: plan_sparse_linear(w.values, w.meta, x, interpret=True))
    assert (code, message) == ("SP0861", f"cannot read the decode table `{tmp_path / 'none.json'}`: "
                                         "No such file or directory")


@pytest.mark.parametrize("call,message", [
    (lambda: dt.check_sweep_inputs(["4096"], [16], ["bf16"]),
     "a decode shape to tune must be N_out x K (two positive integers), found '4096'"),
    (lambda: dt.check_sweep_inputs(["0x16"], [16], ["bf16"]),
     "a decode shape to tune must be N_out x K (two positive integers), found '0x16'"),
    (lambda: dt.check_sweep_inputs(["16x16"], [65], ["bf16"]),
     "a token count to tune must be an integer from 1 to 64, got 65"),
    (lambda: dt.check_sweep_inputs(["16x16"], [8], ["e5m2"]), "no decode kernel for dtype 'e5m2'"),
])
def test_sweep_inputs_are_checked(call, message):
    assert _launch_error(call) == ("SP0864", message)


def test_sweep_inputs_group_tokens_by_tile():
    shapes, tiles, dtypes = dt.check_sweep_inputs(["6144x4096", (4096, 14336)], [1, 4, 8, 16, 32, 64, 20], ["bf16"])
    assert shapes == [(6144, 4096), (4096, 14336)] and dtypes == ["bf16"]
    assert list(tiles.items()) == [(8, 8), (16, 16), (32, 32), (64, 64)]  # in the order of the tokens


@pytest.mark.parametrize("m,k,t", [(28672, 4096, 16), (4096, 14336, 64), (4096, 4096, 1), (128, 256, 8)])
def test_candidate_space_is_valid_and_bounded(m, k, t):
    full = dt.candidate_space(m, k, t, 2, 132)
    assert len(full) == len(set(full)) and 1 <= len(full) <= 3 * (8 * 8 * 2 + 7)
    # 64-row slabs only where 128-row ones leave SMs idle (fewer slabs than SMs), 256-row ones from 32 tokens
    want = {128} | ({64} if -(-m // 128) < 132 else set()) | ({256} if dt.token_tile(t) >= 32 else set())
    assert {c.bm for c in full} == want
    bn = dt.token_tile(t)
    for bm in {c.bm for c in full}:
        space = [c for c in full if c.bm == bm]
        for c in space:
            cfg = choose_decode_config(m, t, k, KERNELS["bf16"], 132, c.split_k, c.stages, c.bm)
            assert cfg.bn == bn and cfg.bm == bm and cfg.stages * (cfg.stage_bytes(2) + 16) <= SMEM_PER_CTA
            assert 1 <= c.split_k <= MAX_SPLIT and (c.split_k == 1 or k // 128 // c.split_k >= 2)
            assert -(-m // bm) * c.split_k <= dt.MAX_WAVES * 2 * 132
            assert c.reduce == "launch" or c.split_k > 1
        stages = {c.stages for c in space}
        deepest = max(stages)
        assert stages == set(range(2, deepest + 1))
        assert deepest == 8 or (deepest + 1) * (cfg.stage_bytes(2) + 16) > SMEM_PER_CTA  # every ring that fits
        assert dt.DecodeCandidate(1, 2, "launch", bm) in space
        if k // 128 >= 4:
            assert dt.DecodeCandidate(2, 2, "kernel", bm) in space
        # the persistent kernel (no split) where there are more slabs than SMs, at every ring depth
        persistent = {c.stages for c in space if c.persistent}
        assert all(c.split_k == 1 for c in space if c.persistent)
        assert persistent == (stages if -(-m // bm) > 132 else set())


def test_persistent_candidates_round_trip_and_are_checked():
    cand = dt.DecodeCandidate(1, 4, "launch", 128, True)
    assert cand.to_json()["persistent"] is True and dt.DecodeCandidate.from_json(cand.to_json()) == cand
    assert "persistent" not in dt.DecodeCandidate(1, 4).to_json()  # older entries read the same
    assert str(cand) == "split_k=1 stages=4 persistent"
    for bad in ({"split_k": 2, "stages": 4, "persistent": True}, {"split_k": 1, "stages": 4, "persistent": 1}):
        with pytest.raises(ValueError, match="persistent must be true"):
            dt.DecodeCandidate.from_json(bad)


def test_sweep_picks_the_fastest_correct_candidate(weight, monkeypatch):
    """A fake timer ranks the candidates; the fastest one is wrong (its weight negated) and is
    rejected, the next fastest correct one wins, the default's time is kept for comparison."""
    (w, x) = weight
    base = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=False)
    default = dt.default_candidate(base)
    wrong, good, slow = dt.DecodeCandidate(2, 2, "kernel"), dt.DecodeCandidate(2, 3, "launch"), \
        dt.DecodeCandidate(1, 2)
    assert default not in (wrong, good, slow)
    real = dt.with_candidate

    def with_candidate(plan, cand, sms):
        out = real(plan, cand, sms)
        return out if cand != wrong else dataclasses.replace(out, values=-np.asarray(out.values))

    monkeypatch.setattr(dt, "with_candidate", with_candidate)
    times = {default: 0.010, wrong: 0.001, good: 0.004, slow: 0.020}
    seen = []

    def bench(run, *, warmup, rep, stream):
        seen.append(run.candidate)
        return times[run.candidate]

    got = dt.tune_decode_plan(base, 132, bench, space=lambda *a: [wrong, good, slow, default])
    assert got["config"] == good.to_json() and got["us"] == 4.0
    assert got["default"] == default.to_json() and got["default_us"] == 10.0
    assert got["skipped"] == {str(wrong): "wrong result against the default config"}
    assert seen == [default, good, slow] and got["tokens"] == T


@pytest.mark.gpu
def test_gpu_tiny_sweep_writes_a_table_plans_use(tmp_path, monkeypatch):
    """A sweep of one small shape and two token tiles on this GPU: every entry's best is at most the
    default's time, and a plan of that problem takes the table's config."""
    torch = pytest.importorskip("torch")
    from sparsile.backend import runtime

    if not runtime.has_gpu():
        pytest.skip("no GPU")
    monkeypatch.delenv(DECODE_REDUCE_ENV, raising=False)
    out = tmp_path / "decode.json"
    got = dt.tune_sparse_decode(["1024x1024"], [4, 16], warmup=2, rep=5, out=out)
    dev = runtime.current_device()
    assert set(got["entries"]) == {dt.table_key(dev.name, dev.sm_count, "bf16", 1024, 1024, bn) for bn in (8, 16)}
    for e in got["entries"].values():
        assert 0 < e["us"] <= e["default_us"] and not any("wrong" in why for why in e["skipped"].values())
    assert dt.load_decode_table(out).keys() == got["entries"].keys()
    monkeypatch.setenv(dt.TABLE_ENV, str(out))
    from sparsile.stdlib.kernels.sparsity_gpu import compress_gpu

    values, meta = compress_gpu(torch.randn(1024, 1024, device="cuda"), "bf16", "sm90")
    x = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    plan = plan_sparse_linear(values, meta.data, x)
    best = got["entries"][dt.table_key(dev.name, dev.sm_count, "bf16", 1024, 1024, 16)]["config"]
    assert plan.config.source == "table:decode.json"
    assert (plan.config.split_k, plan.config.stages) == (best["split_k"], best["stages"])
    assert plan.reduces_in_kernel == (best["reduce"] == "kernel" and best["split_k"] > 1)
    y = plan.run().float()
    ref = plan_sparse_decode(values, meta.data, x, table=False).run().float()
    torch.cuda.synchronize()
    assert not torch.isnan(y).any() and ((y - ref).abs() <= 2e-2 * ref.abs().max()).all()


def test_sweep_writes_a_table_in_token_order_and_merges(tmp_path):
    """tune_sparse_decode with interpreter plans and a fake timer (split_k=2, stages=2 fastest):
    entries in the order of the tokens, the file merged with the decode table already there (and
    replacing a file that is none), a time limit leaves the rest out; plans read the result."""
    w, x = problem("bf16", N_OUT, 16, K, seed=5)

    def plans(dtype, n_out, k, t):
        assert (dtype, n_out, k) == ("bf16", N_OUT, K)
        return plan_sparse_decode(w.values, w.meta, x[:t], interpret=True, table=False)

    def bench(run, *, warmup, rep, stream):
        return 0.001 if run.candidate == dt.DecodeCandidate(2, 2) else 0.002

    out = tmp_path / "decode.json"
    other = dt.table_key(*H200, "bf16", 999, 512, 8)
    out.write_text(json.dumps(table({other: entry(1, 2)})))
    sweep = functools.partial(dt.tune_sparse_decode, [f"{N_OUT}x{K}"], benchmarker=bench, problem=plans, device=H200)
    got = sweep([16, 2], out=out)
    assert list(got["entries"]) == [dt.table_key(*H200, "bf16", N_OUT, K, bn) for bn in (16, 8)]
    assert all(e["config"] == {"split_k": 2, "stages": 2, "reduce": "launch", "bm": 128}
               for e in got["entries"].values())
    assert [e["tokens"] for e in got["entries"].values()] == [16, 2] and got["left_out"] == []
    assert dt.load_decode_table(out).keys() == {*got["entries"], other}
    late = sweep([16, 2], max_seconds=0.0)
    assert late["entries"] == {} and late["left_out"] == list(got["entries"])
    sweep([16, 2], max_seconds=0.0, out=out)  # left out of this sweep, kept from the last: not "left out" in the file
    kept = json.loads(out.read_text())
    assert kept["left_out"] == [] and kept["entries"].keys() == {*got["entries"], other}
    gemm = tmp_path / "gemm.json"
    gemm.write_text(json.dumps({"format": "sparsile-sparse-gemm-table/1", "entries": {}}))
    sweep([2], out=gemm)
    assert list(dt.load_decode_table(gemm)) == [dt.table_key(*H200, "bf16", N_OUT, K, 8)]


def test_a_sweep_keeps_what_another_wrote_to_its_table_meanwhile(tmp_path, monkeypatch):
    """A sweep merges the file's entries at each write, read again under the file's lock: a sweep
    that wrote to the same table while this one ran keeps its entries (before, the file was read
    once, when the sweep started, and its next write dropped the other sweep's entries)."""
    monkeypatch.setattr(dt, "tune_decode_plan", lambda plan, sms, bench, **kw: entry(2, 2))
    out = tmp_path / "decode.json"
    h100 = ("NVIDIA H100 80GB HBM3", 132)
    made: list[int] = []

    def plans(dtype, n_out, k, t):
        made.append(t)
        if len(made) == 2:  # between this sweep's two problems, another sweep runs to the end
            dt.tune_sparse_decode([f"{N_OUT}x{K}"], [16], out=out, problem=lambda *a: None, device=h100)
        return None
    got = dt.tune_sparse_decode([f"{N_OUT}x{K}"], [16, 8], out=out, problem=plans, device=H200)
    assert made == [16, 8]
    assert set(dt.load_decode_table(out)) == {*got["entries"], dt.table_key(*h100, "bf16", N_OUT, K, 16)}
    assert [p.name for p in tmp_path.iterdir()] == ["decode.json"]


def test_timed_calls_rotate_over_weight_copies(weight):
    """The weight and its copies take 3 x L2 (at most 8 in all); each timed call runs the next copy,
    a graph holds whole rounds."""
    (w, x) = weight
    plan = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=False)
    size = plan.values.nbytes + plan.meta.nbytes
    assert len(dt.weight_copies(plan)) == 7
    assert len(dt.weight_copies(plan, cold_bytes=3 * size)) == 2 and dt.weight_copies(plan, cold_bytes=size) == []
    copies = dt.weight_copies(plan, cold_bytes=3 * size)
    assert all(np.array_equal(v, plan.values) and v is not plan.values for v, _ in copies)
    ran = []

    class Fake:
        def __init__(self, i):
            self.i = i

        def run(self, stream=None):
            ran.append((self.i, stream))

    rot = dt.Rotation([Fake(0), Fake(1), Fake(2)], dt.DecodeCandidate(1, 2))
    for _ in range(4):
        rot(stream="s")
    assert ran == [(0, "s"), (1, "s"), (2, "s"), (0, "s")] and rot.calls == 9
    assert dt.Rotation([Fake(0)], dt.DecodeCandidate(1, 2)).calls == dt.GRAPH_CALLS


def test_an_entry_of_64_row_slabs_plans_them(on_h200, weight):
    """An entry's "bm" reaches the plan (grid, warps, counters); one without it means 128; the
    result is the float64 reference's."""
    (w, x) = weight
    t = table({KEY: {"config": {"split_k": 2, "stages": 3, "reduce": "kernel", "bm": 64}}})
    plan = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=t)
    assert (plan.config.bm, plan.config.split_k, plan.config.source) == (64, 2, "table")
    (main,) = plan.launches()
    assert main[1] == (N_OUT // 64, 2) and main[3]["num_warps"] == 5 and plan.counters.shape == (N_OUT // 64,)
    plan.out[...] = np.nan
    assert_linear_close(plan.run(), w, x, K, "bf16", "bfloat16")
    assert str(dt.DecodeCandidate(2, 3, "kernel", 64)) == "split_k=2 stages=3 reduce=kernel bm=64"
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True, table=table({KEY: entry(2, 3)})).config.bm == 128


def test_a_plan_for_another_sm_count_takes_no_entry(on_h200, weight):
    (w, x) = weight
    t = table({KEY: entry(2, 3)})
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True, table=t).config.source == "table"
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True, table=t, num_sms=132).config.source == "table"
    plan = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=t, num_sms=66)
    assert plan.config.source == "heuristic"


def test_an_entry_whose_stages_do_not_fit_its_tile_names_the_table(on_h200):
    w, x = problem("bf16", N_OUT, 64, K, seed=5)  # bn 64: a step moves 34 KB, 8 stages do not fit
    key = dt.table_key(*H200, "bf16", N_OUT, K, 64)
    with pytest.raises(SparsityError) as e:
        plan_sparse_decode(w.values, w.meta, x, interpret=True, table=table({key: entry(1, 8)}))
    assert e.value.code == "SP0863"
    assert "the decode table (table) gives split_k=1 stages=8 for 256 x 512, 64 tokens: 8 stages do not fit " \
           "in 227 KB of shared memory" in str(e.value)


def test_e4m3_entries_apply_to_e4m3_plans_only(on_h200):
    """e4m3 is tuned as its own dtype: its entry reaches an e4m3 plan (scales as the layer passes
    them) and a bf16 plan of the same shape keeps its heuristic; the result is the reference's."""
    import numpy as np

    from .test_linear_api import NP_OUT, assert_linear_close, epilogue_case

    w, x = problem("e4m3", N_OUT, T, K, seed=5)
    want, epi = epilogue_case("e4m3", N_OUT, T, None, None, None, "channel", "token")
    key = dt.table_key(*H200, "e4m3", N_OUT, K, 8)
    out = np.full((T, N_OUT), np.nan, NP_OUT[want])
    plan = plan_sparse_decode(w.values, w.meta, x, out=out, interpret=True, table=table({key: entry(2, 3)}), **epi)
    assert (plan.config.split_k, plan.config.stages, plan.config.source) == (2, 3, "table")
    plan.run()
    assert_linear_close(out, w, x, K, "e4m3", want, **epi)
    wb, xb = problem("bf16", N_OUT, T, K, seed=5)
    assert plan_sparse_decode(wb.values, wb.meta, xb, interpret=True, table=table({key: entry(2, 3)})
                              ).config.source == "heuristic"
    assert dt.parse_key(key)[2] == "e4m3" and "e4m3" in dt.TUNE_DTYPES


def test_the_heuristic_takes_64_row_slabs_where_they_fit_in_one_wave(weight):
    """No table entry, nothing given: 64-row slabs where cdiv(N_out, 64) CTAs fit in one wave of the
    SMs and T <= 16 (the H200 tuner's choice for every bf16 / e4m3 weight of up to 8192 rows at
    T <= 16), else 128."""
    from sparsile.stdlib.kernels.decode import heuristic_bm

    assert [heuristic_bm(m, 16, 132) for m in (64, 1024, 4096, 6144, 8192, 8448, 8449, 10240, 57344)] == \
        [64, 64, 64, 64, 64, 64, 128, 128, 128]
    assert [heuristic_bm(4096, t, 132) for t in (1, 16, 17, 64)] == [64, 64, 128, 128]
    (w, x) = weight  # 256 rows: 4 slabs of 64
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True, table=False, num_sms=4).config.bm == 64
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True, table=False, num_sms=3).config.bm == 128
    assert plan_sparse_decode(w.values, w.meta, x, interpret=True, table=False, num_sms=4, split_k=1).config.bm == 128


@pytest.mark.parametrize("feature_major", [False, True])
def test_a_256_row_candidate_gets_words_of_whole_256_row_slabs(feature_major):
    """A 128-row plan of 300 rows has 384 rows of words; a candidate of 256-row slabs reads 512
    (no metadata box past the words), and a feature-major plan's workspace is (split, N_out, T)."""
    weight, x = problem("bf16", 300, 40, 512, seed=3)
    base = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, table=False, bm=128,
                              feature_major=feature_major)
    assert base.meta.shape[0] == 384
    plan = dt.with_candidate(base, dt.DecodeCandidate(2, 4, "launch", 256), 132)
    assert plan.meta.shape[0] == 512 and plan.grid == (2, 2)
    assert plan.workspace.shape == ((2, 300, 40) if feature_major else (2, 40, 300))
    assert (np.asarray(plan.meta)[384:] == 0x44444444).all()
    plan.out[...] = np.nan
    got = plan.run()
    assert_linear_close(got.T if feature_major else got, weight, x, 512, "bf16", "bfloat16")


def test_a_persistent_entry_is_taken_only_where_the_plan_can_run_it(on_h200, weight):
    """A table entry of the persistent kernel (timed on x of the weight's type, without pdl): a plan
    with pdl, or of e4m3 weights with 16-bit x (quantized by the kernel), runs the entry's split and
    stages on the other kernel instead of failing with SP0860; a caller's persistent=True takes no
    split from a non-persistent entry (nor from the heuristic)."""
    (w, x) = weight
    cfg = {"split_k": 1, "stages": 3, "reduce": "launch", "bm": 128, "persistent": True}
    tab = table({KEY: {"config": cfg, "us": 1.0}})
    plan = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=tab)
    assert plan.config.persist > 0 and plan.grid == (plan.config.persist, 1)
    plan = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=tab, pdl=True)
    assert (plan.config.persist, plan.config.split_k, plan.config.stages, plan.pdl) == (0, 1, 3, True)
    w8, x8 = problem("e4m3", N_OUT, T, K, seed=6)
    x16 = x8.astype(np.float32).astype(np.float16)
    tab8 = table({dt.table_key(*H200, "e4m3", N_OUT, K, 8): {"config": cfg, "us": 1.0}})
    assert plan_sparse_decode(w8.values, w8.meta, x8, interpret=True, table=tab8, scale_x=1.0,
                              scale_w=1 / 64).config.persist > 0
    plan = plan_sparse_decode(w8.values, w8.meta, x16, interpret=True, table=tab8, scale_w=1 / 64)
    assert plan.quantizes_x and plan.config.persist == 0
    plan.out[...] = np.nan
    assert not np.isnan(np.asarray(plan.run(), np.float32)).any()
    split = table({KEY: entry(2, 3, "kernel")})
    plan = plan_sparse_decode(w.values, w.meta, x, interpret=True, table=split, persistent=True)
    assert (plan.config.split_k, plan.grid) == (1, (plan.config.persist, 1)) and plan.config.persist > 0
    assert_linear_close(plan.run(), w, x, K, "bf16", "bfloat16")
