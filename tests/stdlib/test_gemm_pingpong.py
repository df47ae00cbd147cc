"""The ping-pong Hopper sparse GEMM (stdlib/kernels/sparse_gemm_sm90_pingpong.spk) and its planner
switch (``schedule=`` of plan_sparse_matmul / sparse_matmul, stdlib/kernels/gemm_schedule.py):
the kernel in the interpreter against float64 with poisoned C, the persistent grid, the SP0865
diagnostics, and the compile for sm_90a through nvJitLink (SP0612) and the whole-program ptxas
(setmaxnreg kept, no local memory). The H200 runs are in tests/gpu/test_sparse_gemm_sm90.py."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.toolchain import linker as K
from sparsile.backend.toolchain import whole_program as W
from sparsile.driver import cache
from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import gemm_schedule as GS
from sparsile.stdlib.kernels.gemm import plan_sparse_matmul, sparse_matmul
from sparsile.stdlib.sparsity import SparsityError

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"


@pytest.fixture(scope="module")
def mod():
    return sp.load(KERNELS / "sparse_gemm_sm90_pingpong.spk")


def operands(m: int, n: int, k: int, seed: int, dtype: str):
    """Random non-zero 2:4 operands (values, metadata words, b) and the float64 product."""
    import ml_dtypes

    host = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0.5, 2.0, (m, k)) * rng.choice((-1.0, 1.0), (m, k))  # no zeros
    w = S.prune_2_4(dense.astype(np.float32)).astype(host)
    vals, idx = S.compress(w, dtype)
    meta = np.asarray(S.encode_metadata(idx, "sm90", dtype).data)
    b = (rng.uniform(0.5, 2.0, (n, k)) * rng.choice((-1.0, 1.0), (n, k))).astype(host)
    ref = w.astype(np.float64) @ b.astype(np.float64).T
    return vals, meta, b, ref, np.abs(w.astype(np.float64)) @ np.abs(b.astype(np.float64)).T


def check(c: np.ndarray, ref: np.ndarray, abs_products: np.ndarray) -> None:
    """f16 rounding of C (2^-11 relative) plus f32 accumulation (K terms, 2^-23 of sum |a||b| each)."""
    assert not np.isnan(c).any(), "unwritten output elements"
    err = np.abs(c.astype(np.float64) - ref)
    bound = 2.0 ** -11 * np.abs(ref) + 2.0 ** -20 * abs_products + 1e-6
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("dtype,m,n,k,programs,bm,bn", [
    ("f16", 300, 130, 192, 2, 128, 64),   # 3 x 3 = 9 tiles: CTA 0 has 5 (WG0 3, WG1 2), CTA 1 has 4; 3 K steps
    ("bf16", 200, 70, 96, 1, 128, 32),    # 2 x 3 = 6 tiles on one CTA (3 each); K = 96: 2 steps, the last ragged
    ("bf16", 130, 100, 256, 3, 64, 32),   # BM 64: 3 x 4 = 12 tiles, 4 per CTA; 4 K steps
    ("f16", 70, 40, 64, 1, 64, 32),       # 2 x 2 = 4 tiles, one K step (only the hand-over step)
    ("f16", 100, 50, 320, 2, 128, 32),    # 1 x 2 tiles: one per CTA, warpgroup 1 idle; 5 K steps
])
def test_kernel_matches_float64(mod, dtype, m, n, k, programs, bm, bn):
    """Both warpgroups compute several tiles (odd and even counts per CTA), M, N and K are not
    multiples of the tile, odd and even K-step counts; C is poisoned with NaN."""
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    kernel = getattr(mod, f"sparse_gemm_{dtype}_pingpong")
    kernel.interpret[(programs,)](vals, meta, b, c, m, n, k, meta.shape[1], n, BM=bm, BN=bn)
    check(c, ref, absp)


@pytest.mark.parametrize("dtype,m,n,k,programs,bm,bn", [
    ("f16", 70, 40, 64, 1, 64, 32),       # 1 K step: only the last step (its own metadata set)
    ("bf16", 200, 70, 96, 1, 128, 32),    # 2: one step, then the last
    ("f16", 300, 130, 192, 2, 128, 64),   # 3: two remainder steps, then the last
    ("bf16", 130, 100, 256, 3, 64, 32),   # 4: one round of three, then the last
    ("f16", 100, 50, 320, 2, 128, 32),    # 5: a round, one remainder step, the last
    ("bf16", 130, 60, 512, 2, 64, 32),    # 8: two rounds, one remainder step, the last; 3 x 2 tiles
])
def test_inflight_kernel_matches_float64(mod, dtype, m, n, k, programs, bm, bn):
    """INFLIGHT = 1 (one sparse MMA group in flight, three metadata sets and one for the last step):
    K-step counts 1 to 5 and 8, both warpgroups with several tiles; C is poisoned with NaN."""
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    kernel = getattr(mod, f"sparse_gemm_{dtype}_pingpong")
    kernel.interpret[(programs,)](vals, meta, b, c, m, n, k, meta.shape[1], n, BM=bm, BN=bn, INFLIGHT=1)
    check(c, ref, absp)


def test_the_turns_are_real_waits(mod):
    """Without warpgroup 1's first arrival (on behalf of tile -1), warpgroup 0 waits for its turn
    at tile 0 and warpgroup 1 for tile 0's last MMA: the interpreter finds every partition waiting
    (SP0782) instead of computing."""
    text = (KERNELS / "sparse_gemm_sm90_pingpong.spk").read_text()
    first = "        mbarrier.arrive(order[1])  # tile -1 is done"
    assert text.count(first) == 1
    broken = sp.loads(text.replace(first, "        pass  #"), "broken.spk", path=KERNELS / "broken_pingpong.spk")
    vals, meta, b, _, _ = operands(70, 40, 64, 1, "f16")
    c = np.full((70, 40), np.nan, np.float16)
    with pytest.raises(sp.InterpreterError) as exc:
        broken.sparse_gemm_f16_pingpong.interpret[(1,)](vals, meta, b, c, 70, 40, 64, meta.shape[1], 40, BM=64, BN=32)
    line = 1 + text[:text.index("mbarrier.wait(order[1 - WG]")].count("\n")  # the turn wait of turn_wait
    assert exc.value.code == "SP0782" and f"broken.spk:{line}:5: deadlock" in str(exc.value)


@pytest.mark.parametrize("dtype,y_dtype,act,scales,m,t,k,programs", [
    ("f16", "float32", "silu", (2, 1), 200, 70, 128, 1),      # 2 x 3 tiles on one CTA
    ("bf16", "bfloat16", "gelu_tanh", (1, 2), 130, 100, 192, 2),  # 2 x 4 tiles, 4 per CTA
])
def test_linear_kernel_matches_float64(mod, dtype, y_dtype, act, scales, m, t, k, programs):
    """sparse_linear_<t>_pingpong: Y[t, m] = act(C[m, t] * SW * SX + Bias[m]) in Y's type, stored
    transposed (the epilogue of sparse_gemm_sm90.spk's linear kernels), Y poisoned with NaN."""
    import ml_dtypes

    vals, meta, b, ref, absp = operands(m, t, k, m + t, dtype)
    rng = np.random.default_rng(3)
    bias = rng.uniform(-1, 1, m).astype(np.float32)
    sw = rng.uniform(0.5, 1.5, m if scales[0] == 2 else 1).astype(np.float32)
    sx = rng.uniform(0.5, 1.5, t if scales[1] == 2 else 1).astype(np.float32)
    host = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[y_dtype]
    y = np.full((t, m), np.nan, host)
    kernel = getattr(mod, f"sparse_linear_{dtype}_pingpong")
    kernel.interpret[(programs,)](vals, meta, b, y, bias, sw, sx, m, t, k, meta.shape[1], m, BN=32, BIAS=1,
                                  ACT=act, SCALE_W=scales[0], SCALE_X=scales[1])
    scale = sw.astype(np.float64)[:, None] * sx.astype(np.float64)[None, :]
    pre = ref * scale + bias.astype(np.float64)[:, None]
    if act == "silu":
        want = pre / (1 + np.exp(-pre))
    else:
        want = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre ** 3)))
    rounding = {"float32": 2.0 ** -22, "bfloat16": 2.0 ** -8}[y_dtype]  # Y's rounding (+ f32 epilogue ops)
    bound = rounding * np.abs(want) + 1.2 * (2.0 ** -20 * absp * scale) + 1e-5
    got = y.astype(np.float64).T
    assert not np.isnan(got).any(), "unwritten output elements"
    err = np.abs(got - want)
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_sparse_matmul_runs_the_pingpong_plan(dtype):
    """schedule="pingpong": the ping-pong kernel on min(tiles, SMs) CTAs (here 2 SMs, 3 x 1 tiles)."""
    vals, meta, b, ref, absp = operands(300, 20, 96, 7, dtype)
    plan = plan_sparse_matmul(vals, meta, b, interpret=True, num_sms=2, schedule="pingpong")
    assert plan.kernel.name == f"sparse_gemm_{dtype}_pingpong" and plan.grid == (2, 1) and plan.bn == 32
    out = np.full((300, 20), np.nan, np.float16)
    c = sparse_matmul(vals, meta, b, interpret=True, num_sms=2, schedule="pingpong", out=out)
    assert c is out
    check(c, ref, absp)


def test_pingpong_plan_caps_bn_and_the_grid():
    """BN at most 128 (the accumulator's 128 registers per thread); one CTA per SM for a large C,
    one per tile for a small one; the default schedule is unchanged."""
    vals, meta, b, _, _ = operands(512, 300, 64, 2, "bf16")
    big = plan_sparse_matmul(vals, meta, b, interpret=True, schedule="pingpong")
    assert big.bn == GS.PINGPONG_MAX_BN == 128 and big.grid == (4 * 3, 1)  # 12 tiles < 132 SMs
    assert plan_sparse_matmul(vals, meta, b, interpret=True, num_sms=5, schedule="pingpong").grid == (5, 1)
    default = plan_sparse_matmul(vals, meta, b, interpret=True, schedule="default")
    assert default.bn == 256 and not default.pingpong_ctas and default.kernel.name == "sparse_gemm_bf16"
    assert plan_sparse_matmul(vals, meta, b, interpret=True).kernel.name == "sparse_gemm_bf16"


@pytest.mark.parametrize("kwargs,dtype,message", [
    ({"schedule": "fast"}, "f16", "unknown sparse GEMM schedule 'fast'"),
    ({"schedule": 1}, "f16", "unknown sparse GEMM schedule 1"),
    ({"schedule": "pingpong"}, "e4m3",
     "the ping-pong schedule is not available for e4m3 operands (ping-pong kernels exist for f16, bf16)"),
    ({"schedule": "pingpong", "split_k": 2}, "f16",
     "the ping-pong schedule is not available for split_k=2 (a ping-pong warpgroup computes a tile's whole K)"),
    ({"schedule": "pingpong", "out_dtype": "float32"}, "bf16",
     "the ping-pong schedule is not available for out_dtype other than float16 (the ping-pong kernels store "
     "float16 C)"),
    ({"schedule": "pingpong", "persistent": False}, "bf16",
     "the ping-pong schedule is not available for persistent=False (its warpgroups alternate over the tiles of "
     "a persistent CTA)"),
    ({"schedule": "pingpong", "target": "sm_100a"}, "f16",
     "the ping-pong schedule is not available for target sm_100a (the ping-pong kernels are Hopper kernels: "
     "sm_90a)"),
])
def test_a_bad_schedule_is_sp0865(kwargs, dtype, message):
    values, meta = _compressed(np.ones((64, 64), np.float32), dtype)
    with pytest.raises(SparsityError) as exc:
        plan_sparse_matmul(values, meta, np.ones((16, 64), np.float32), interpret=True, **kwargs)
    assert exc.value.code == "SP0865" and exc.value.message == message


def _compressed(w: np.ndarray, dtype: str):
    from sparsile.stdlib.kernels import prune_and_compress

    return prune_and_compress(w, dtype)


# ------------------------------------------------------------------------------------------------
# the compile for sm_90a


def _pingpong_ptx(dtype: str) -> str:
    vals, meta, b, _, _ = operands(512, 512, 512, 0, dtype)
    plan = plan_sparse_matmul(vals, meta, b, interpret=True, schedule="pingpong", num_sms=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", W.RegisterBudgetWarning)
        return plan.compile("sm_90a").ptx


def _sm90():
    from sparsile.target.targets import get_target

    return get_target("sm_90a")


@pytest.fixture(scope="module")
def bf16_ptx() -> str:
    return _pingpong_ptx("bf16")


def test_the_ptx_has_the_register_budgets(bf16_ptx):
    budgets = sorted(int(m) for m in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+);", bf16_ptx))
    assert budgets == [40, 232, 232]  # the producer's, the two consumer warpgroups'
    assert ".minnctapersm 1" in bf16_ptx and W.needs_whole_program(bf16_ptx)



def test_nvjitlink_assembles_it_without_budgets_and_without_spills(bf16_ptx, monkeypatch):
    monkeypatch.setenv(W.ENV_PTXAS, "0")
    with pytest.warns(W.RegisterBudgetWarning, match=r"SP0612"):
        linked = K.ptx_to_cubin(bf16_ptx, _sm90(), name="pingpong.ptx")
    assert "C7504" in linked.info_log and "0 bytes spill stores" in linked.info_log
    assert "C7510" not in linked.info_log and "serialized" not in linked.info_log  # wgmma not serialized
    sass = K.nvdisasm_sass(linked.cubin)
    if sass is None:
        pytest.skip("nvdisasm is not installed")
    assert "USETMAXREG" not in sass and sass.count("HGMMA.SP.64x128x32.F32.BF16") == 32


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_inflight_ptx_keeps_one_group_in_flight(dtype):
    """INFLIGHT = 1: per consumer warpgroup three `wgmma.wait_group 1` in the unrolled loop and two in
    the remainder, one `wait_group 0` after the last step; no metadata register of a sparse wgmma in
    flight is written before the wait that retires it (backend/toolchain/ptx_inflight.py)."""
    from sparsile.backend.toolchain.ptx_inflight import metadata_hazards
    from sparsile.tests.support import compile_stdlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", W.RegisterBudgetWarning)
        ptx = compile_stdlib("sparse_gemm_sm90_pingpong.spk", f"sparse_gemm_{dtype}_pingpong", "sm_90a",
                             stop_after="ptx", INFLIGHT=1).ptx
    assert ptx.count("wgmma.wait_group.sync.aligned 1;") == 2 * 5
    assert ptx.count("wgmma.wait_group.sync.aligned 0;") == 2
    assert metadata_hazards(ptx) == []


@pytest.mark.skipif(not K.ptxas_available(), reason="no ptxas here (pip install -e '.[ptxas]' brings one)")
def test_whole_program_ptxas_keeps_the_budgets_without_local_memory(bf16_ptx, monkeypatch):
    monkeypatch.setenv(W.ENV_PTXAS, K.ptxas_path())
    with warnings.catch_warnings():
        warnings.simplefilter("error", W.RegisterBudgetWarning)
        linked = K.ptx_to_cubin(bf16_ptx, _sm90(), name="pingpong.ptx")
    assert "C7504" not in linked.info_log and "0 bytes spill stores" in linked.info_log
    assert "C7510" not in linked.info_log and "serialized" not in linked.info_log  # wgmma not serialized
    sass = K.nvdisasm_sass(linked.cubin)
    if sass is None:
        pytest.skip("nvdisasm is not installed")
    assert sass.count("USETMAXREG.TRY_ALLOC") == 2 and sass.count("USETMAXREG.DEALLOC") == 1
    assert not re.search(r"\b(STL|LDL)\b", sass)  # no local memory: the accumulators stay in registers
    assert sass.count("HGMMA.SP.64x128x32.F32.BF16") == 32  # 2 warpgroups x 4 K-step bodies x 2 m64 x 2 k32


# ------------------------------------------------------------------------------------------------
# benchmarks/bench_sparse_gemm.py --schedule pingpong (the GPU run is the lead's)


@pytest.fixture(scope="module")
def bench():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sparse_gemm.py"
    spec = importlib.util.spec_from_file_location("bench_sparse_gemm_pp", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_bench_pingpong_options(bench, capsys):
    args = bench.parse_args(["--schedule", "pingpong", "--case", "bf16:8192x8192x8192",
                             "--pingpong-config", "64x256x64x5", "--pingpong-config", "128x128x128x4"])
    assert args.schedule == "pingpong" and args.pingpong_config == ((64, 256, 64, 5), (128, 128, 128, 4))
    assert bench.parse_args([]).schedule == "default"
    for bad, message in ((["--pingpong-config", "128x128x64x6"], "add --schedule pingpong"),
                         (["--schedule", "pingpong", "--pingpong-config", "128x256x64x4"], "BM x BN <= 128 x 128"),
                         (["--schedule", "pingpong", "--pingpong-config", "128x128"], "expected BMxBNxBKxSTAGES"),
                         (["--schedule", "fast"], "invalid choice")):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
        assert message in capsys.readouterr().err


def test_bench_pingpong_times_every_config_once_and_reports_the_fastest(bench):
    seen = []

    def fake_run(kernel, cfg):  # (err, µs) as checked_time gives them; no GPU
        seen.append((kernel, tuple(cfg.values())))
        return 1e-4 * len(seen), {128: 900.0, 64: 850.0}[cfg["BM"]] + cfg["STAGES"]

    row = bench.pingpong_times(fake_run, "bf16", 8192, 8192, 256, 132, ((128, 128, 64, 6), (64, 256, 64, 5)))
    assert [cfg for _, cfg in seen] == [(128, 128, 64, 6), (64, 256, 64, 5)]  # the planner's config, once
    assert row["pingpong"] == 855.0 and row["pingpong_err"] == pytest.approx(2e-4)
    assert row["pingpong_configs"] == {"128x128x64x6": [906.0, pytest.approx(1e-4)],
                                       "64x256x64x5": [855.0, pytest.approx(2e-4)]}
    line = bench.format_pingpong_row({"dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "sparsile": 1080.0,
                                      "cslt": 950.0, "cslt_tuned": 942.0, **row})
    assert len(line.split("|")) == len(bench.PP_HEADER.split("|"))
    assert " 1.26    1.10 2.0e-04 | 128x128x64x6 906.0 64x256x64x5 855.0" in line


@pytest.mark.parametrize("assembler", ["nvjitlink", "whole-program"])
def test_linear_kernel_with_gelu_compiles_without_spills(mod, assembler, monkeypatch, request):
    """sparse_linear_bf16_pingpong at its default BN (64) with bias, both scales and gelu_tanh, the
    epilogue with the most live registers: no spills under either assembler."""
    import ml_dtypes

    if assembler == "whole-program" and not K.ptxas_available():
        pytest.skip("no ptxas here (pip install -e '.[ptxas]' brings one)")
    monkeypatch.setenv(W.ENV_PTXAS, "0" if assembler == "nvjitlink" else K.ptxas_path())
    cache.toolchain_versions.cache_clear()  # the compile cache keys on the assembler, read once per process
    request.addfinalizer(cache.toolchain_versions.cache_clear)
    vals, meta, b, _, _ = operands(256, 256, 256, 0, "bf16")
    y = np.zeros((256, 256), ml_dtypes.bfloat16)
    ones = np.ones(256, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", W.RegisterBudgetWarning)
        ck = mod.sparse_linear_bf16_pingpong[(4,)].compile_for(
            "sm_90a", vals, meta, b, y, ones, ones, ones, 256, 256, 256, meta.shape[1], 256, BIAS=1, ACT="gelu_tanh",
            SCALE_W=2, SCALE_X=2)
    assert "0 bytes spill stores" in ck.info_log and ("C7504" in ck.info_log) == (assembler == "nvjitlink")
