"""The CPU-side parts of the benchmark scripts: bench_compile.py and bench_elementwise.py (argument
parsing, size and case tables, launch configurations that compile for sm_90a, the arithmetic of
the reports, and a short real run of the compile benchmark); bench_linear.py, bench_llama.py and
examples/llama_sparse.py (arguments, pruning and quantization numerics, the targets, and whole runs
on the CPU with the GPU-only timers replaced; the static-cache decode loop against recomputation);
bench_sparse_gemm.py and plot_gemm.py (the Llama-3 grid and its options, cuSPARSELt's default and
searched algorithm, the speed-up arithmetic, and the plots of a synthetic JSON).
The torch and transformers tests skip when those are not installed."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import sparsile
from sparsile.tests.support import ROOT
from sparsile.tests.support import load_script as _load


def load_script(name: str):
    return _load(f"benchmarks/{name}.py", f"bench_script_{name}", register=True)  # dataclasses look their module up


be = load_script("bench_elementwise")
bc = load_script("bench_compile")


# ------------------------------------------------------------------------------------------------
# bench_elementwise


def test_elementwise_arguments():
    args = be.parse_args([])
    assert args.iters == 50 and args.block == 1024 and not args.quick
    assert be.vector_sizes(args) == be.VECTOR_SIZES and be.softmax_shapes(args) == be.SOFTMAX_SHAPES
    quick = be.parse_args(["--quick", "--iters", "7"])
    assert be.vector_sizes(quick) == be.QUICK_VECTOR_SIZES and be.softmax_shapes(quick) == be.QUICK_SOFTMAX_SHAPES
    assert be.vector_sizes(be.parse_args(["--sizes", "1000", "5000"])) == (1000, 5000)
    for bad in (["--iters", "0"], ["--block", "100"], ["--block", "8"], ["--sizes", "0"]):
        with pytest.raises(SystemExit):
            be.parse_args(bad)


def test_sizes_are_large_enough_to_measure_bandwidth():
    """At least 1 GiB moved by the largest vector add; every softmax moves at least 128 MiB."""
    assert max(be.vector_add_bytes(n) for n in be.VECTOR_SIZES) >= 1 << 30
    assert all(be.softmax_bytes(r, c) >= 128 << 20 for r, c in be.SOFTMAX_SHAPES)
    assert set(be.QUICK_VECTOR_SIZES) <= set(be.VECTOR_SIZES)


@pytest.mark.parametrize("cols,block,rows,warps", [(512, 512, 8, 4), (1000, 1024, 4, 4), (1024, 1024, 4, 4),
                                                   (4096, 4096, 1, 4), (8192, 8192, 1, 8), (3, 16, 16, 4)])
def test_softmax_config_covers_a_row(cols, block, rows, warps):
    cfg = be.softmax_config(cols)
    assert (cfg.block, cfg.rows, cfg.num_warps) == (block, rows, warps)
    assert cfg.block >= cols and cfg.grid(1000) == (-(-1000 // rows),)


def test_every_softmax_configuration_compiles_for_sm90a():
    """What the GPU run will launch: each softmax configuration and the vector add compile here."""
    softmax = sparsile.load(ROOT / "examples" / "softmax.spk")
    for n_rows, n_cols in be.SOFTMAX_SHAPES:
        cfg = be.softmax_config(n_cols)
        x = np.zeros((2, n_cols), np.float32)
        ck = softmax.softmax[cfg.grid(n_rows)].compile_for("sm_90a", x, x.copy(), n_rows, n_cols, n_cols,
                                                           BLOCK=cfg.block, ROWS=cfg.rows, num_warps=cfg.num_warps)
        assert ck.num_warps == cfg.num_warps and ck.cubin[:4] == b"\x7fELF"
    vector = sparsile.load(ROOT / "examples" / "vector_add.spk")
    v = np.zeros(16, np.float32)
    assert vector.vector_add[(1,)].compile_for("sm_90a", v, v, v.copy(), 16, BLOCK=1024).cubin[:4] == b"\x7fELF"


def test_report_arithmetic_and_table():
    assert be.gbps(3_000_000_000, 1_000_000) == pytest.approx(3.0)  # 3 GB in 1 s
    assert be.gbps(4_800_000, 1.0) == pytest.approx(4800.0)  # 4.8 MB in 1 us
    rows = [be.Row("vector_add", "1048576", be.vector_add_bytes(1 << 20), 10.0, 8.0, 0.0)]
    assert rows[0].ratio == pytest.approx(0.8)
    table = be.format_rows(rows)
    assert "vector_add" in table and "0.80" in table and f"{be.gbps(12 << 20, 10.0):.0f}" in table
    text = be.format_overheads({"driver": 2.5, "triton kernel[grid]": None})
    assert "2.50 us" in text and "-" in text.splitlines()[1]


def test_elementwise_without_gpu_says_why(capsys):
    if be.requirements_missing() is None:
        pytest.skip("this machine can run the benchmark")
    assert be.main(["--quick"]) == 3  # (the CLI's "a feature this installation does not have": no GPU)
    assert "needs an NVIDIA GPU and torch" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# bench_compile


def test_compile_arguments_and_cases():
    args = bc.parse_args([])
    assert args.target == "sm_90a" and args.reps == 5 and args.case is None
    names = [c.name for c in bc.selected_cases(None, "sm_90a")]
    assert names == ["vector_add", "downcast_16k", "downcast_64k", "load_tile3d_64k", "softmax", "transpose",
                     "sparse_gemm_f16", "dense_gemm_f16"]
    assert [c.name for c in bc.selected_cases(None, "sm_80")] == ["vector_add", "downcast_16k", "downcast_64k",
                                                                   "load_tile3d_64k", "softmax", "transpose"]
    assert [c.name for c in bc.selected_cases(["softmax"], "sm_100a")] == ["softmax"]
    for bad in (["--reps", "0"], ["--case", "nope"]):
        with pytest.raises(SystemExit):
            bc.parse_args(bad)
    for case in bc.CASES:
        assert (ROOT / case.path).is_file() and case.kernel in sparsile.load(ROOT / case.path).kernels


def test_compile_benchmark_runs_one_case():
    (case,) = bc.selected_cases(["vector_add"], "sm_90a")
    r = bc.run_case(case, "sm_90a", reps=1)
    assert "error" not in r, r
    assert r["cold"] > 0 and r["warm"] > 0 and 0 < r["hit_mem"] < r["cold"] and r["cubin"] > 0
    assert set(r["stages"]) >= {"passes", "llvm", "ptx", "cubin"}
    row = bc.format_row(r)
    assert row.startswith("vector_add") and str(r["cubin"]) in row
    assert "error" in bc.format_row({"case": "x", "error": "boom"})


# ------------------------------------------------------------------------------------------------
# bench_linear (sparsile.torch.SparseLinear against dense and cuSPARSELt; the GPU run is the lead's)

bl = load_script("bench_linear")


def test_linear_arguments_and_shape_selection():
    args = bl.parse_args([])
    assert args.shape_list == bl.SHAPES and args.token_list == bl.TOKENS and args.dtypes == ["bf16", "e4m3"]
    assert bl.parse_args(["--quick"]).token_list == bl.QUICK_TOKENS
    assert bl.parse_args(["--quick", "--tokens", "2", "8"]).token_list == (2, 8)
    assert [s.name for s in bl.select_shapes(["70B"])] == ["70B qkv", "70B o", "70B gate_up", "70B down"]
    assert [s.name for s in bl.select_shapes(["down", "8B:o"])] == ["8B o", "8B down", "70B down"]
    by_name = {s.name: (s.n, s.k) for s in bl.SHAPES}  # Llama-3 8B / 70B: (out, in) features
    assert by_name == {"8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate_up": (28672, 4096),
                       "8B down": (4096, 14336), "70B qkv": (10240, 8192), "70B o": (8192, 8192),
                       "70B gate_up": (57344, 8192), "70B down": (8192, 28672)}
    assert bl.parse_args(["--variants", "eager", "graph"]).variants == ["eager", "graph"]
    assert bl.parse_args(["--dtypes", "f16"]).dtypes == ["f16"]
    torch = pytest.importorskip("torch")
    assert bl.activation_dtype("f16") is torch.float16 and bl.activation_dtype("e4m3") is torch.bfloat16
    for bad in (["--shapes", "13B"], ["--shapes", "8B:mlp"], ["--tokens", "0"], ["--dtypes", "f32"],
                ["--variants", "magic"], ["--blocks", "0"]):
        with pytest.raises(SystemExit):
            bl.parse_args(bad)


def test_linear_eager_qx_replaces_the_layer_rule(monkeypatch):
    assert bl.parse_args([]).eager_qx == "rule" and bl.parse_args(["--eager-qx", "never"]).eager_qx == "never"
    with pytest.raises(SystemExit):
        bl.parse_args(["--eager-qx", "sometimes"])
    pytest.importorskip("torch")
    from sparsile.integrations.torch import _kernels

    rule = _kernels.quantizes_in_kernel
    monkeypatch.setattr(_kernels, "quantizes_in_kernel", rule)  # restored after the test
    bl.set_eager_qx("rule")
    assert _kernels.quantizes_in_kernel is rule
    assert rule(1, 4096, 4096) and not rule(16, 28672, 4096)
    bl.set_eager_qx("always")
    assert _kernels.quantizes_in_kernel(16, 28672, 4096)
    bl.set_eager_qx("never")
    assert not _kernels.quantizes_in_kernel(1, 4096, 4096)


def test_linear_prune_and_quantize_on_cpu():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 32, generator=g, dtype=torch.float64)
    p = bl.prune_24(w).numpy()
    ref = w.numpy().reshape(8, 8, 4).copy()
    order = np.argsort(np.abs(ref), axis=-1)
    np.put_along_axis(ref, order[..., :2], 0.0, axis=-1)  # zero the two smallest |w| of each group of 4
    assert np.array_equal(p, ref.reshape(8, 32))
    x = torch.randn(5, 64, generator=g) * torch.tensor([1e-3, 1.0, 30.0, 1e3, 0.0])[:, None]
    q, s = bl.quantize_rows_e4m3(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 1)
    back = q.double() * s.double()
    err = (back - x.double()).abs().max(dim=1).values / x.double().abs().max(dim=1).values.clamp_min(1e-30)
    assert float(err[:4].max()) <= 2.0**-4  # e4m3: 3 mantissa bits, half an ulp relative to the row's max
    assert float(q.double().abs().amax(dim=1)[:4].min()) == pytest.approx(448.0)  # each row uses the full range
    assert not back[4].any()  # a zero row stays zero (no division by zero)


def test_linear_cold_l2_copies_and_rotation():
    """--l2 cold: enough copies of a weight for three times the L2 (at most 8), the graph's calls
    taking them in turn."""
    assert bl.parse_args([]).l2 == "warm" and bl.parse_args(["--l2", "cold"]).l2 == "cold"
    with pytest.raises(SystemExit):
        bl.parse_args(["--l2", "hot"])
    mb = 2 ** 20
    assert bl.copies_for_cold_l2(50 * mb) == 3 and bl.copies_for_cold_l2(28 * mb) == 6
    assert bl.copies_for_cold_l2(470 * mb) == 1 and bl.copies_for_cold_l2(1 * mb) == 8
    seen = []
    call = bl.rotating([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        call()
    assert seen == [0, 1, 2, 0, 1, 2, 0]


def test_linear_cold_contenders_copy_the_weights_on_cpu(monkeypatch):
    """The copies are new memory with the same values, for the dense anchor and SparseLinear."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("sparsile.torch")
    monkeypatch.setattr(bl, "DEVICE", "cpu")
    monkeypatch.setattr(bl, "L2_BYTES", 64 * 1024)  # a small layer then needs several copies
    monkeypatch.setattr(bl, "make_sparse_linear", lambda linear, dtype: __import__(
        "sparsile.torch", fromlist=["SparseLinear"]).SparseLinear.from_dense(linear))
    c = bl.Contenders(bl.Shape("8B", "o", 128, 256), "bf16", ("graph",), {}, l2="cold")
    assert c.cold and len(c.dense_copies) == bl.copies_for_cold_l2(128 * 256 * 2) - 1 >= 2
    assert all(t.w.data_ptr() != c.w.data_ptr() and torch.equal(t.w, c.w) for t in c.dense_copies)
    assert len(c.sparse_copies) >= 1
    for twin in c.sparse_copies:
        assert twin.values.data_ptr() != c.sparse.values.data_ptr() and torch.equal(twin.values, c.sparse.values)
        assert torch.equal(twin.meta, c.sparse.meta)
    assert not bl.Contenders(bl.Shape("8B", "o", 128, 256), "bf16", ("graph",), {}).cold


def test_linear_time_calls_counts_and_orders():
    calls = {"fn": 0, "sync": 0}

    def fn():
        calls["fn"] += 1

    def sync():
        calls["sync"] += 1

    t = bl.time_calls(fn, sync, blocks=3, max_calls=5)
    assert calls["fn"] == 2 + 3 * 5  # two warm-up calls, then 3 blocks of max_calls (fn is fast)
    assert calls["sync"] == 2 + 3 * 2
    assert 0 < t.host <= t.wall and 0 < t.wall_best <= t.wall
    assert bl.graph_reps(None) == 20 and bl.graph_reps(1000.0) == 1 and bl.graph_reps(20.0) == 10


def test_linear_time_calls_interleaved_alternates_the_blocks():
    """Two contenders timed together take their blocks in turn (after each one's two warm-up
    calls), each with its own call count and its own Timing."""
    order: list[str] = []
    t_a, t_b = bl.time_calls_interleaved([lambda: order.append("a"), lambda: order.append("b")], lambda: None,
                                         blocks=3, max_calls=2)
    assert order == ["a", "a", "b", "b"] + ["a", "a", "b", "b"] * 3
    assert 0 < t_a.host <= t_a.wall and 0 < t_b.host <= t_b.wall


def test_linear_time_calls_measures_the_threads_cpu_share():
    """A call that keeps the CPU busy for 2 ms: the calling thread's CPU time over the wall time is
    positive and at most about 1 (less only if the thread was descheduled); a call that sleeps
    shows a share near 0. Collections during the blocks are counted (at least the forced ones: of
    the youngest generation, which count as any other, not full ones, which take seconds each in a
    test process holding torch, jax and thousands of compiled kernels)."""
    import gc
    import time

    def busy():
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass

    t = bl.time_calls(busy, lambda: None, blocks=2, max_calls=2)
    assert 0 < t.cpu_share <= 1.1
    t = bl.time_calls(lambda: time.sleep(0.002), lambda: None, blocks=2, max_calls=2)
    assert t.cpu_share < 0.5
    t = bl.time_calls(lambda: gc.collect(0), lambda: None, blocks=2, max_calls=2)
    assert t.gc_runs >= 4


def _row(t: int, **values: float) -> dict:
    return {"model": "8B", "layer": "o", "n": 4096, "k": 4096, "t": t, "dtype": "bf16", "errors": {}, **values}


def test_linear_targets_and_table():
    rows = [_row(1, sl_ovh=3.0, speedup_best=1.2, speedup_wall=0.5, speedup_graph=1.6),  # best, not wall, judged
            _row(16, sl_ovh=9.5, speedup_best=0.9, speedup_graph=1.7),
            _row(64, sl_ovh=50.0, speedup_best=0.1, speedup_graph=0.1)]  # T > 16: not judged
    results = bl.check_targets(rows)
    assert [ok for _, ok, _ in results] == [False, False, True]
    assert "1/2 rows; worst 9.50 µs at 8B o T=16 bf16" in results[0][2]
    assert "worst 0.90x at 8B o T=16" in results[1][2] and "2/2 rows; worst 1.60x" in results[2][2]
    assert [ok for _, ok, _ in bl.check_targets([_row(4)])] == [None, None, None]
    text = bl.format_targets(results)
    assert text.count("[FAIL]") == 2 and text.count("[PASS]") == 1
    header = bl.table_header().splitlines()
    line = bl.format_row(_row(4, dense_wall=20.0, sl_wall=10.0, sl_kern=7.5, speedup_wall=2.0, err=1.5e-3))
    assert len(header[0].split("|")) == len(line.split("|")) == len(bl.COLUMNS) + 2
    assert "| 8B o | 4096×4096 | 4 | bf16 | 20.0 |" in line and "| 2.00x |" in line and line.endswith("| 1.5e-03 |")


def test_linear_without_gpu_says_why(capsys):
    if bl.requirements_missing() is None:
        pytest.skip("this machine can run the benchmark")
    assert bl.main(["--quick"]) == 3
    assert "bench_linear needs an NVIDIA GPU" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# bench_llama and examples/llama_sparse.py (decoding with a static cache: the loop runs eagerly here)

bll = load_script("bench_llama")


def test_llama_arguments():
    args = bll.parse_args([])
    assert (args.layers, args.batches, args.prompt, args.new_tokens) == (8, [1, 16], 128, 128)
    assert args.models == ["dense", "sparsile", "sparsile-fused", "sparsile-fused-noglu", "semi"]
    assert args.modes == ["graph"]
    assert args.attention == "sdpa-gqa" and bll.parse_args(["--attention", "sdpa"]).attention == "sdpa"
    assert bll.parse_args(["--models", "dense", "sparsile-fused"]).models == ["dense", "sparsile-fused"]
    for bad in (["--layers", "0"], ["--new-tokens", "1"], ["--modes", "fast"], ["--models", "moe"]):
        with pytest.raises(SystemExit):
            bll.parse_args(bad)
    assert bll.within_bf16_tolerance(0.02, 0.01) and not bll.within_bf16_tolerance(0.021, 0.01)
    ex = load_example("llama_sparse")
    assert ex.parse_args([]).layers == 4 and ex.is_projection(None, "model.layers.3.mlp.down_proj")
    assert not ex.parse_args([]).no_glu and ex.parse_args(["--no-glu"]).no_glu
    assert not ex.is_projection(None, "lm_head") and not ex.is_projection(None, "model.layers.3.mlp")
    with pytest.raises(SystemExit):
        ex.parse_args(["--batch", "0"])


def load_example(name: str):
    return importlib.import_module(f"sparsile.examples.{name}")


def test_llama_example_help_explains_every_option(capsys):
    """`python examples/llama_sparse.py -h` listed --batch and --new-tokens without a word, and no
    option's default (the docstring's [--layers 4] [--batch 1] [--new-tokens 64])."""
    ex = load_example("llama_sparse")
    with pytest.raises(SystemExit):
        ex.parse_args(["-h"])
    text = " ".join(capsys.readouterr().out.split())
    for option, default in (("--layers", 4), ("--batch", 1), ("--prompt", 128), ("--new-tokens", 64)):
        helped = re.search(rf"{option} {option.lstrip('-').replace('-', '_').upper()} (.*?) --", text)
        assert helped is not None and f"(default {default})" in helped.group(1), option


@pytest.mark.parametrize("attention", bll.ATTENTIONS)
def test_llama_static_cache_decode_matches_recompute(attention):
    """The benchmark's decode loop (prefill, then one token a step through StaticCache) gives the
    tokens of recomputing the whole sequence each step, on a tiny pruned Llama in float32, with either
    attention."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    config = bll.llama3_config(2, attention, vocab_size=97, hidden_size=64, intermediate_size=128,
                               num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None)
    assert config.num_key_value_heads == 2 and config.rms_norm_eps == 1e-5
    assert config._attn_implementation == ("sdpa" if attention == "sdpa" else "sparsile_sdpa_gqa_decode")
    with torch.no_grad():
        model = bll.build_model(config, "cpu", torch.float32)
        assert bll.prune_projections_(model) == 2 * 7
    with torch.inference_mode():
        w = model.model.layers[1].mlp.down_proj.weight.reshape(64, -1, 4)
        assert int((w != 0).sum(-1).max()) <= 2 and model.lm_head.weight.count_nonzero() == model.lm_head.weight.numel()
        prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(3))
        expected = bll.greedy_reference(model, prompt, 6)
        decoder = bll.Decoder(model, 2, 5 + 6, "eager")
        decoder.prepare(prompt)
        for _ in range(2):  # a second generate starts from a reset cache
            tokens, seconds = decoder.generate(prompt, 6)
            assert torch.equal(tokens, expected) and seconds > 0
        short = bll.Decoder(model, 2, 5 + 1, "eager")  # the warm-up steps fit past a short cache too
        short.prepare(prompt)
        assert torch.equal(short.generate(prompt, 1)[0], expected[:, :1])
        logits = bll.logits_of(model, prompt)
        same = bll.compare_logits(logits, logits.double().float(), logits)
        assert same["max_abs_err"] == 0 and same["argmax_agree"] == 1.0
        off = bll.compare_logits(logits + 0.5, logits, logits)
        assert off["max_abs_err"] == pytest.approx(0.5) and off["rel_err"] == pytest.approx(0.5 / logits.abs().max())


def test_llama_without_gpu_says_why(capsys):
    if bll.requirements_missing() is None:
        pytest.skip("this machine can run the benchmark")
    assert bll.main(["--layers", "1"]) == 3
    assert "bench_llama needs an NVIDIA GPU" in capsys.readouterr().err


def test_llama_report_lines():
    runs = [{"model": "dense", "batch": 1, "mode": "graph", "tokens_per_s": 100.0, "ms_per_step": 10.0,
             "tokens_equal_eager": True},
            {"model": "sparsile", "batch": 1, "mode": "graph", "tokens_per_s": 140.0, "ms_per_step": 7.1,
             "tokens_equal_eager": True, "speedup": 1.4},
            {"model": "sparsile", "batch": 16, "mode": "graph", "tokens_per_s": 1500.0, "ms_per_step": 10.7,
             "tokens_equal_eager": False, "speedup": 1.25},
            {"model": "sparsile", "batch": 16, "mode": "compile", "error": "RuntimeError: boom"},
            {"model": "sparsile-fused", "batch": 16, "mode": "graph", "tokens_per_s": 1560.0, "ms_per_step": 10.3,
             "tokens_equal_eager": True, "speedup": 1.3},
            {"model": "semi", "batch": 16, "mode": "graph", "tokens_per_s": 1000.0, "ms_per_step": 16.0,
             "tokens_equal_eager": True, "speedup": 0.83}]
    assert bll.target_lines(runs) == [
        "- [PASS] sparsile >= 1.3x dense tokens/s, batch 1, graph: 1.40x",
        "- [FAIL] sparsile >= 1.3x dense tokens/s, batch 16, graph: 1.25x",
        "- [n/a ] sparsile >= 1.3x dense tokens/s, batch 16, compile: not measured",
        "- [PASS] sparsile-fused >= 1.3x dense tokens/s, batch 16, graph: 1.30x"]
    assert bll.format_run(runs[0]) == "| dense | 1 | graph | 100.0 | 10.000 | - | yes |"
    assert bll.format_run(runs[2]).endswith("| 1.25x | NO |")
    assert "failed: RuntimeError: boom" in bll.format_run(runs[3])


def linear_on_cpu(monkeypatch, make: Any, kernel_us: float = 0.0) -> None:
    """bench_linear on the CPU on one tiny shape: no GPU check, the profiler's kernel time replaced by
    ``kernel_us``, and SparseLinear by ``make(linear)``."""
    monkeypatch.setattr(bl, "DEVICE", "cpu")
    monkeypatch.setattr(bl, "SHAPES", (bl.Shape("tiny", "o", 64, 128),))
    monkeypatch.setattr(bl, "requirements_missing", lambda: None)
    monkeypatch.setattr(bl, "kernel_time", lambda fn, calls=10: (fn(), kernel_us)[1])
    monkeypatch.setattr(bl, "make_sparse_linear", lambda linear, dtype: make(linear))


def test_linear_main_runs_end_to_end_on_cpu(monkeypatch, tmp_path, capsys):
    """The whole benchmark on the CPU on one tiny shape, with the GPU-only timers (profiler, CUDA
    graph) replaced by constants and SparseLinear by a dense stand-in: every column, note, target
    line and the JSON come out; contenders that need a GPU (cuSPARSELt) are reported, not fatal."""
    pytest.importorskip("torch")
    import torch.nn.functional as F

    class StandIn:
        def __init__(self, linear):
            self.weight = linear.weight.detach().clone()

        def __call__(self, x):
            return F.linear(x, self.weight)

    linear_on_cpu(monkeypatch, StandIn, kernel_us=5.0)
    monkeypatch.setattr(bl, "graph_time", lambda fn, reps, blocks: (fn(), 4.0)[1])
    out = tmp_path / "linear.json"
    assert bl.main(["--tokens", "1", "32", "--blocks", "1", "--variants", "eager", "graph", "cslt",
                    "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("| tiny o | 64×128 |") == 4 and "targets:" in text and "- [" in text
    report = json.loads(out.read_text())
    rows = {(r["dtype"], r["t"]): r for r in report["rows"]}
    assert set(rows) == {("bf16", 1), ("bf16", 32), ("e4m3", 1), ("e4m3", 32)}
    for r in rows.values():
        assert r["sl_kern"] == 5.0 and r["sl_graph"] == 4.0 and r["sl_ovh"] == pytest.approx(r["sl_best"] - 5.0)
        assert r["sl_best"] <= r["sl_wall"] and r["speedup_best"] == pytest.approx(r["dense_best"] / r["sl_best"])
        assert r["dense_ovh"] == pytest.approx(r["dense_best"] - r["dense_kern"])
        assert 0 < r["sl_host"] <= r["sl_wall"] and r["out_dtype"] == "bfloat16"
        assert r["err"] < 2**-7  # the stand-in is F.linear in bf16: its rounding only
        if "cslt" not in r["errors"]:  # cuSPARSELt ran (it should not on a CPU), so it was timed
            assert r["cslt_kern"] == 5.0
    assert rows[("bf16", 1)]["speedup_graph"] == 1.0 and rows[("bf16", 1)]["dense_err"] < 2**-7
    assert report["targets"][2][1] is False  # CUDA graph target: 1.00x < 1.5x at T = 1


def test_linear_host_diag_on_cpu(monkeypatch, capsys):
    """--host-diag: every row gets the host probe and the timed blocks' CPU share and collections, a
    row whose overhead misses the target gets a cProfile of its eager call (naming the call), and
    the diagnostics table lists them; a row that meets it gets no profile."""
    pytest.importorskip("torch")
    import torch.nn.functional as F

    def slow_stand_in(x):
        return F.linear(x, weight)

    import torch

    weight = torch.randn(64, 128, dtype=torch.bfloat16)
    linear_on_cpu(monkeypatch, lambda linear: slow_stand_in)
    monkeypatch.setattr(bl, "MAX_OVERHEAD_US", -1.0)  # every T <= 16 row misses, however fast the host
    assert bl.main(["--tokens", "1", "32", "--blocks", "1", "--dtypes", "bf16", "--variants", "eager",
                    "--host-diag"]) == 0
    text = capsys.readouterr().out
    assert "host diagnostics" in text and text.count("| tiny o | 1 | bf16 |") == 1
    assert "cProfile of the eager call, tiny o T=1 bf16" in text and "slow_stand_in" in text
    assert "T=32" not in text  # no profile beyond the targets' T
    diag = [line for line in text.splitlines() if line.startswith("| tiny o | ")][-2:]  # the diagnostics rows
    cells = [line.split(" | ") for line in diag]
    assert all(float(c[3]) > 0 for c in cells)  # the probe ran before each row
    assert all(0 <= float(c[6]) <= 1.5 for c in cells)  # SL cpu share


def test_linear_passes_keep_each_pass_and_take_the_fastest(monkeypatch, tmp_path, capsys):
    """--passes 3: the eager blocks of dense and SparseLinear at T <= 16 are timed again in two more passes
    (layers rebuilt per shape), every pass's fastest block is kept, 'best' and the overhead take the fastest
    of all, the first pass's targets are printed and written too; T > 16 rows are not re-timed."""
    pytest.importorskip("torch")
    import time

    import torch.nn.functional as F

    built = []

    class StandIn:  # slow (2 ms a call) in the first layer built, fast afterwards: the first pass's host
        def __init__(self, linear):
            self.weight, self.slow = linear.weight.detach().clone(), not built
            built.append(self)

        def __call__(self, x):
            if self.slow:
                time.sleep(0.002)
            return F.linear(x, self.weight)

    linear_on_cpu(monkeypatch, StandIn)
    monkeypatch.setattr(bl, "MAX_OVERHEAD_US", 1000.0)  # the slow pass misses it, a CPU F.linear meets it
    out = tmp_path / "linear.json"
    assert bl.main(["--tokens", "1", "32", "--blocks", "1", "--dtypes", "bf16", "--variants", "eager",
                    "--passes", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert len(built) == 3  # the first pass's layer and one per later pass
    assert "re-timed in 3 passes" in text and "targets, first pass alone:" in text
    report = json.loads(out.read_text())
    rows = {r["t"]: r for r in report["rows"]}
    assert "sl_best_passes" not in rows[32] and "dense_best_passes" not in rows[32]
    r = rows[1]
    assert len(r["sl_best_passes"]) == len(r["dense_best_passes"]) == 3
    assert r["sl_best_passes"][0] >= 2000 > max(r["sl_best_passes"][1:])  # the slow first pass, then fast
    assert r["sl_best"] == min(r["sl_best_passes"]) and r["dense_best"] == min(r["dense_best_passes"])
    assert r["sl_ovh"] == pytest.approx(r["sl_best"] - r["sl_kern"])
    assert r["speedup_best"] == pytest.approx(r["dense_best"] / r["sl_best"])
    first = {name: ok for name, ok, _ in report["targets_first_pass"]}
    final = {name: ok for name, ok, _ in report["targets"]}
    overhead = next(name for name in final if name.startswith("eager host overhead"))
    assert first[overhead] is False and final[overhead] is True  # 2 ms over a 0 µs kernel, then under 1 ms
    assert f"| tiny o | 1 | bf16 | {' / '.join(f'{v:.1f}' for v in r['dense_best_passes'])} |" in text


def _tiny_llama_on_cpu(monkeypatch) -> None:
    """bench_llama on the CPU with a tiny Llama config (skips without torch and transformers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    tiny = {**bll.LLAMA3_8B, "vocab_size": 61, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "bos_token_id": None, "eos_token_id": None}
    monkeypatch.setattr(bll, "DEVICE", "cpu")
    monkeypatch.setattr(bll, "LLAMA3_8B", tiny)
    monkeypatch.setattr(bll, "requirements_missing", lambda: None)


def test_llama_main_runs_end_to_end_on_cpu(monkeypatch, tmp_path, capsys):
    """The whole Llama benchmark on the CPU with a tiny config, eager decoding and a stand-in for
    sparsify_ (the projections stay dense): the check, the table and the JSON come out; the
    semi-structured model (GPU only) is reported as not built."""
    _tiny_llama_on_cpu(monkeypatch)
    class Report:
        swapped = ("one",)

        def __str__(self):
            return "stand-in report"

    monkeypatch.setattr(bll, "sparsify_sparsile", lambda model: Report())
    out = tmp_path / "llama.json"
    assert bll.main(["--layers", "1", "--batches", "1", "3", "--prompt", "4", "--new-tokens", "3", "--modes", "eager",
                     "--repeats", "1", "--check-tokens", "4", "--models", "dense", "sparsile", "semi",
                     "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "stand-in report" in text and "WARNING: sparsile swapped 1 of the 7 projections" in text
    assert "semi: could not be built" in text
    report = json.loads(out.read_text())
    assert report["check"]["sparsile"]["ok"] and report["check"]["sparsile"]["vs_dense_bf16"] == 0.0
    runs = {(r["model"], r["batch"]): r for r in report["runs"]}
    assert set(runs) == {("dense", 1), ("sparsile", 1), ("dense", 3), ("sparsile", 3)}
    assert all(r["tokens_equal_eager"] and r["tokens_per_s"] > 0 for r in runs.values())
    assert runs[("sparsile", 3)]["speedup"] > 0 and "batch 3, eager" in text


def test_llama_fused_model_decodes_on_cpu(monkeypatch, tmp_path, capsys):
    """The sparsile-fused model for real on the CPU (sparsify_ in the interpreter, then
    fuse_projections_(glu=True)): its groups are fused (SwiGLU into the MLP) and run while it decodes
    eagerly through the static cache, its tokens equal an eager decode's and its logits pass the bf16
    check."""
    _tiny_llama_on_cpu(monkeypatch)
    from sparsile.integrations.torch.projection_group import fused_group_of
    from sparsile.torch import sparsify_

    monkeypatch.setattr(bll, "sparsify_sparsile",
                        lambda model: sparsify_(model, filter_fn=bll.is_projection, interpret=True, min_features=16))
    built = []
    real = bll.sparsify_sparsile_fused
    monkeypatch.setattr(bll, "sparsify_sparsile_fused", lambda model: (built.append(model), real(model))[1])
    out = tmp_path / "llama.json"
    assert bll.main(["--layers", "1", "--batches", "2", "--prompt", "4", "--new-tokens", "3", "--modes", "eager",
                     "--repeats", "1", "--check-tokens", "4", "--models", "dense", "sparsile-fused",
                     "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sparsify_: 7 linear layers swapped" in text
    assert "fuse_projections_: 2 projection groups fused, 0 already fused, 0 skipped" in text
    assert "WARNING" not in text
    report = json.loads(out.read_text())
    assert report["check"]["sparsile-fused"]["ok"]
    runs = {r["model"]: r for r in report["runs"]}
    assert runs["sparsile-fused"]["tokens_equal_eager"] and runs["sparsile-fused"]["speedup"] > 0
    layer = built[0].model.layers[0]
    assert fused_group_of(layer.self_attn.q_proj).runs > 0 and fused_group_of(layer.mlp.up_proj) is not None
    forward = layer.mlp.__dict__["forward"].__self__  # the MLP runs SwiGLU fused
    assert type(forward).__name__ == "GatedForward" and forward.activation == "swiglu"
    assert "gated activation fused into 1 MLP (swiglu)" in text
    assert "sparsile-fused >= 1.3x dense tokens/s, batch 2, eager" in text


def test_linear_fp8_dense_anchor_with_and_without_quantization_agree(monkeypatch):
    """The e4m3 dense anchor gives the same output whether x is quantized inside the timed call
    (--fp8-dense-quantize) or beforehand, and it is close to the float64 product."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(bl, "DEVICE", "cpu")
    monkeypatch.setattr(bl, "make_sparse_linear", lambda linear, dtype: None)
    shape = bl.Shape("tiny", "o", 48, 64)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    outs = []
    for inside in (False, True):
        errors: dict = {}
        c = bl.Contenders(shape, "e4m3", ("eager",), errors, quantize_in_dense=inside)
        try:
            outs.append(c.dense(x)())
        except RuntimeError as e:  # torch builds without a CPU _scaled_mm
            pytest.skip(f"torch._scaled_mm does not run on this CPU: {e}")
        ref = x.double() @ c.w.double().T
        assert bl.relative_error(outs[-1], ref) < 0.1  # e4m3 x and w: a few per cent
    assert torch.equal(outs[0], outs[1])
    assert bl.parse_args(["--fp8-dense-quantize"]).fp8_dense_quantize and not bl.parse_args([]).fp8_dense_quantize


def test_linear_cslt_call_falls_back_to_the_layouts_cusparselt_takes(monkeypatch):
    """cuSPARSELt stand-in that takes only a contiguous B of a multiple of 16 columns: the call pads
    x, uses the searched algorithm and notes what it did; one that takes nothing is an error."""
    torch = pytest.importorskip("torch")
    seen = []

    def fake_mm(compressed, b, alg_id=0, **kw):
        if not b.is_contiguous() or b.shape[1] % 16:
            raise RuntimeError(f"layout {tuple(b.shape)} refused")
        seen.append((tuple(b.shape), alg_id, kw))
        return compressed @ b

    monkeypatch.setattr(torch, "_cslt_sparse_mm", fake_mm, raising=False)
    monkeypatch.setattr(torch, "_cslt_sparse_mm_search", lambda compressed, b, **kw: (7, 1, -1), raising=False)
    c = bl.Contenders.__new__(bl.Contenders)
    c.dtype, c.errors, c.cslt = "bf16", {}, torch.ones(8, 32, dtype=torch.bfloat16)
    x = torch.randn(3, 32).to(torch.bfloat16)
    y = c.cslt_call(x)()
    assert y.shape == (8, 16) and torch.equal(y[:, :3], c.cslt @ x.T) and not y[:, 3:].any()
    assert seen[-1] == ((32, 16), 7, {}) and "ran with x padded to 16 tokens" in c.errors["cslt T=3"]
    monkeypatch.setattr(torch, "_cslt_sparse_mm", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    with pytest.raises(RuntimeError, match="cuSPARSELt refused every layout"):
        c.cslt_call(x)


def test_llama_cache_arguments_follow_forwarded_kwargs():
    """StaticCache's keyword arguments across transformers versions: named ones, and those a
    ``**kwargs`` passes on to a base class (4.5x), stopping at a base that takes no ``**kwargs`` (5.x)."""

    class Base:
        def __init__(self, config=None, max_batch_size=None, max_cache_len=None, *, device=None):
            pass

    class Forwarding(Base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

    class Named(Base):
        def __init__(self, config, max_cache_len, offloading=False):
            pass

    assert bll.init_parameters(Forwarding) == {"config", "max_batch_size", "max_cache_len", "device"}
    assert bll.init_parameters(Named) == {"config", "max_cache_len", "offloading"}


# ------------------------------------------------------------------------------------------------
# bench_sparse_gemm (--grid, --json, cuSPARSELt default and tuned) and plot_gemm (the GPU run is the lead's)

bsg = load_script("bench_sparse_gemm")
pg = load_script("plot_gemm")


def test_sparse_gemm_arguments_and_llama3_grid():
    args = bsg.parse_args([])
    assert args.grid is None and args.json is None and not args.child and args.tokens == bsg.LLAMA3_TOKENS
    full = bsg.select_cases(args)  # the table as before: squares, e4m3 8192³, the LLM rows
    assert full[0] == bsg.Case("f16", 4096, 4096, 4096) and bsg.Case("e4m3", 8192, 8192, 8192) in full
    assert len(full) == 2 * 3 + 1 + 2 * 7 and all(c.shape is None for c in full)
    assert [c.m for c in bsg.select_cases(bsg.parse_args(["--quick"]))] == [4096, 8192]
    grid = bsg.select_cases(bsg.parse_args(["--grid", "llama3", "--json", "out.json"]))
    assert len(grid) == 8 * 8 * 2 and {c.dtype for c in grid} == {"bf16", "f16"}
    assert sorted({c.n for c in grid}) == [1, 16, 64, 256, 512, 1024, 4096, 8192]
    assert {c.shape: (c.m, c.k) for c in grid} == {  # M = out features, K = in features
        "8B-qkv": (6144, 4096), "8B-o": (4096, 4096), "8B-gate_up": (28672, 4096), "8B-down": (4096, 14336),
        "70B-qkv": (10240, 8192), "70B-o": (8192, 8192), "70B-gate_up": (57344, 8192), "70B-down": (8192, 28672)}
    few = bsg.select_cases(bsg.parse_args(["--grid", "llama3", "--shapes", "70B", "8B-o", "--tokens", "16", "64",
                                           "--dtypes", "bf16"]))
    assert [(c.shape, c.n) for c in few] == [("8B-o", 16), ("8B-o", 64), ("70B-qkv", 16), ("70B-qkv", 64),
                                             ("70B-o", 16), ("70B-o", 64), ("70B-gate_up", 16), ("70B-gate_up", 64),
                                             ("70B-down", 16), ("70B-down", 64)]
    assert [c.shape for c in bsg.select_cases(bsg.parse_args(["--grid", "llama3", "--shapes", "down",
                                                              "--tokens", "1"]))] == ["8B-down"] * 2 + ["70B-down"] * 2
    one = bsg.parse_args(["--grid", "llama3", "--case", "bf16:10240x512x8192"])  # --case wins
    assert bsg.select_cases(one) == [bsg.Case("bf16", 10240, 512, 8192)]
    assert bsg.parse_args(["--child", "--case", "f16:64x16x64"]).child


@pytest.mark.parametrize("bad,message", [
    (["--grid", "llama4"], "invalid choice"), (["--shapes", "8B"], "add --grid llama3"),
    (["--tokens", "16"], "add --grid llama3"), (["--grid", "llama3", "--shapes", "13B"], "unknown shape '13B'"),
    (["--grid", "llama3", "--tokens", "0"], "must be positive"), (["--iters", "0"], "must be positive"),
    (["--case", "f16:8192x8192"], "expected DTYPE:MxNxK"), (["--case", "f32:64x64x64"], "dtype one of"),
    (["--case", "f16:64x64x62"], "K % 4 == 0"), (["--grid", "llama3", "--dtypes", "f32"], "invalid choice")])
def test_sparse_gemm_bad_arguments_say_why(bad, message, capsys):
    with pytest.raises(SystemExit):
        bsg.parse_args(bad)
    assert message in capsys.readouterr().err


def _gemm_row(shape: str | None, dtype: str, n: int, **times: float | None) -> dict:
    return {"dtype": dtype, "m": 256, "n": n, "k": 512, "split": 1, "err": 1e-4, "shape": shape, **times}


def test_sparse_gemm_ratios_use_the_faster_cusparselt():
    r = _gemm_row("x", "bf16", 64, sparsile=10.0, pair=8.0, cslt=12.0, cslt_tuned=6.0, cublas=16.0)
    assert bsg.ours(r) == 8.0 and bsg.best_cslt(r) == 6.0  # the pair kernel; the searched algorithm
    assert bsg.speedups(r) == {"vs_cslt": pytest.approx(0.75), "vs_cublas": pytest.approx(2.0)}
    r2 = _gemm_row("x", "bf16", 64, sparsile=10.0, cslt=5.0, cslt_tuned=7.0, cublas=None)  # default faster
    assert bsg.speedups(r2) == {"vs_cslt": pytest.approx(0.5), "vs_cublas": None}
    r3 = _gemm_row("x", "bf16", 64, sparsile=10.0, cslt=None, cslt_tuned=20.0)
    assert bsg.best_cslt(r3) == 20.0 and bsg.best_cslt(_gemm_row("x", "f16", 1, sparsile=1.0)) is None
    assert bsg.tflops(r, 2.0) == pytest.approx(2 * 256 * 64 * 512 / 2e-6 / 1e12) and bsg.tflops(r, None) is None
    assert bsg.geomean([2.0, 8.0]) == pytest.approx(4.0) and bsg.geomean([1.5]) == pytest.approx(1.5)
    for bad in ([], [1.0, 0.0], [-2.0]):
        with pytest.raises(ValueError, match="geometric mean"):
            bsg.geomean(bad)
    line = bsg.format_row({**r, "persistent": 9.0, "sp_dense": 20.0})
    assert len(line.split("|")) == len(bsg.HEADER.split("|")) and "tuned" in bsg.HEADER
    assert line.rstrip().endswith("0.75      2.00         0.80 1.0e-04")
    # at N <= 64 sparse_matmul runs the decode kernel: its time, whatever the table says
    r4 = {**r, "table": 7.0, "decode": 4.0, "decode_err": 3e-4}
    assert bsg.ours(r4) == 4.0 and bsg.speedups(r4)["vs_cslt"] == pytest.approx(1.5)
    assert bsg.format_row(r4).rstrip().endswith(
        "|       4.0     4 |         -     - |         -     - |    1.50      4.00            - 3.0e-04")
    # the tail split's and stream-K's columns are shown, and their errors counted, but they are not
    # what sparse_matmul runs
    r5 = {**r, "tail": 5.0, "tail_err": 5e-4}
    assert bsg.ours(r5) == 8.0
    assert bsg.format_row(r5).rstrip().endswith(
        "|       5.0     3 |         -     - |    0.75      2.00            - 5.0e-04")
    r6 = {**r, "streamk": 4.0, "streamk_err": 6e-4}
    assert bsg.ours(r6) == 8.0
    assert bsg.format_row(r6).rstrip().endswith(
        "|         -     - |       4.0     4 |    0.75      2.00            - 6.0e-04")


def _synthetic_report(tmp_path) -> tuple:
    """A JSON as bench_sparse_gemm.py --json writes it, with made-up times (no measurement)."""
    rows = []
    for shape in ("8B-qkv", "70B-down"):
        for dtype in ("bf16", "f16"):
            for n, (ours_t, cslt, tuned, cublas) in zip((1, 16, 4096), ((2.0, 4.0, 3.0, 4.0), (4.0, 4.0, 4.0, 2.0),
                                                                      (8.0, 9.0, 16.0, 8.0)), strict=True):
                rows.append(_gemm_row(shape, dtype, n, sparsile=ours_t, cslt=cslt, cslt_tuned=tuned, cublas=cublas))
    rows.append(_gemm_row(None, "f16", 4096, sparsile=5.0, cslt=None, cslt_tuned=None, cublas=None))
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps({"environment": {}, "command": "synthetic", "rows": rows, "failed": []}))
    return path, rows


def test_plot_summary_geomeans_on_synthetic_rows(tmp_path):
    _, rows = _synthetic_report(tmp_path)
    assert set(pg.group_by_shape(rows)) == {"8B-qkv_256x512", "70B-down_256x512", "M256_K512"}
    lines = pg.summary(rows)
    # per row vs the faster cuSPARSELt: 3/2 = 1.5, 4/4 = 1, 9/8 = 1.125; vs cuBLAS: 2, 0.5, 1
    vs_cslt, vs_cublas = (1.5 * 1.0 * 1.125) ** (1 / 3), 1.0
    assert lines[0] == (f"bf16: vs cuSPARSELt (faster of default, tuned): geomean {vs_cslt:.2f}x, min 1.00x over "
                        f"6/6 rows; vs cuBLAS: geomean {vs_cublas:.2f}x, min 0.50x over 6/6 rows")
    assert "over 6/7 rows" in lines[1] and lines[2].startswith(" all:") and "over 12/13 rows" in lines[2]
    nothing = "vs cuSPARSELt (faster of default, tuned): not measured; vs cuBLAS: not measured"
    assert pg.summary([_gemm_row(None, "f16", 8, sparsile=1.0)]) == [f" f16: {nothing}", f" all: {nothing}"]


def test_plot_writes_one_png_per_shape(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _ = _synthetic_report(tmp_path)
    out = tmp_path / "plots"
    assert pg.main([str(path), "--out", str(out)]) == 0
    pngs = sorted(p.name for p in out.iterdir())
    assert pngs == ["70B-down_256x512.png", "8B-qkv_256x512.png", "M256_K512.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / p).stat().st_size > 5000 for p in pngs)
    text = capsys.readouterr().out
    assert text.count("wrote ") == 3 and f"geomean {(1.5 * 1.125) ** (1 / 3):.2f}x" in text
    assert "(1 rows without a cuSPARSELt time)" in text
    report = json.loads(path.read_text())  # the same rows split over two files, as runs split by model
    halves = [tmp_path / "a.json", tmp_path / "b.json"]
    for half, rows in zip(halves, (report["rows"][:6], report["rows"][6:]), strict=True):
        half.write_text(json.dumps({**report, "rows": rows}))
    assert pg.main([*map(str, halves), "--out", str(tmp_path / "split")]) == 0
    assert sorted(p.name for p in (tmp_path / "split").iterdir()) == pngs

    def summary_lines(out: str) -> list[str]:
        return [line for line in out.splitlines() if not line.startswith("wrote ")]

    assert summary_lines(capsys.readouterr().out) == summary_lines(text)


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch):
    """As README.md installs: the checkout's viz extra (not the package index)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as info:
        pg.import_pyplot()
    assert info.value.code == ("plot_gemm.py needs matplotlib: install matplotlib>=3.8: `pip install -e '.[viz]'` "
                               "in the sparsile checkout, or `pip install 'matplotlib>=3.8'`")


def test_plot_bad_json_says_why(tmp_path):
    bad = tmp_path / "bad.json"
    for content, message in (("not json", "not a bench_sparse_gemm.py --json file (JSONDecodeError"),
                             ('{"runs": []}', "not a bench_sparse_gemm.py --json file (KeyError"),
                             ('{"rows": [{"m": 1}]}', "row 0 lacks dtype, n, k, sparsile")):
        bad.write_text(content)
        with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
            pg.main([str(bad)])
    with pytest.raises(SystemExit, match="No such file"):
        pg.main([str(tmp_path / "absent.json")])
    bad.write_text('{"rows": []}')
    assert pg.main([str(bad)]) == 1


def test_sparse_gemm_cusparselt_default_and_searched_algorithm(monkeypatch):
    """cslt_times times torch._cslt_sparse_mm twice: without alg_id (default) and with the id the
    search picks; a B^T view it refuses is copied; a failing search is reported, not fatal."""
    torch = pytest.importorskip("torch")
    calls = []

    def fake_mm(comp, b, alg_id=None, **kw):
        if not b.is_contiguous():
            raise RuntimeError("view refused")
        calls.append(alg_id)
        return comp @ b

    monkeypatch.setattr(torch, "_cslt_compress", lambda w: w * 1, raising=False)
    monkeypatch.setattr(torch, "_cslt_sparse_mm", fake_mm, raising=False)
    monkeypatch.setattr(torch, "_cslt_sparse_mm_search", lambda comp, b, **kw: (3, 1, -1), raising=False)
    monkeypatch.setattr(bsg, "profile_kernel_time", lambda fn, iters: (fn(), 10.0 + len(calls))[1])
    w, b = torch.ones(8, 16), torch.ones(4, 16)
    out = bsg.cslt_times(w, b, "bf16", 5)
    assert calls == [None, 3] and out["cslt_alg"] == 3  # one call each: the default, then alg_id=3
    assert out["cslt"] == 11.0 and out["cslt_tuned"] == 12.0 and "B^T copied to contiguous" in out["cslt_note"]
    monkeypatch.setattr(torch, "_cslt_sparse_mm_search", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    out = bsg.cslt_times(w, b, "bf16", 5)
    assert out["cslt"] and out["cslt_tuned"] is None and out["cslt_tuned_error"] == "RuntimeError: no"
    monkeypatch.setattr(torch, "_cslt_compress", lambda w: (_ for _ in ()).throw(ValueError("dtype")))
    assert bsg.cslt_times(w, b, "bf16", 5) == {"cslt": None, "cslt_tuned": None, "cslt_error": "ValueError: dtype"}


# ------------------------------------------------------------------------------------------------
# gemm_variants (--inflight, --pingpong; the GPU run is the lead's)

gv = load_script("gemm_variants")


class _Launchable:
    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):
        return (self.name, grid)


class _Module:
    def __getattr__(self, name: str):
        return _Launchable(name)


def test_gemm_variants_arguments():
    args = gv.parse_args([])
    assert not args.inflight and not args.pingpong and not args.tma_store and args.dtypes == ["bf16", "f16"]
    args = gv.parse_args(["--inflight", "--pingpong", "--dtypes", "bf16", "--stages", "4", "5"])
    assert args.inflight and args.pingpong and args.stages == [4, 5]
    assert gv.parse_args(["--dtypes", "e4m3"]).dtypes == ["e4m3"]
    with pytest.raises(SystemExit):
        gv.parse_args(["--dtypes", "s8"])
    assert args.shape is None and gv.parse_args(["--shape", "57344x256x8192"]).shape == (57344, 256, 8192)
    for bad in ("57344x256", "0x256x8192", "ax256x8192"):
        with pytest.raises(SystemExit):
            gv.parse_args(["--shape", bad])


def test_gemm_variants_e4m3_rows():
    """e4m3: the tile, pair and metadata-by-TMA kernels of its own names (with INFLIGHT), no ping-pong kernel."""
    rows = gv.variants(_Module(), _Module(), "e4m3", gv.parse_args(["--meta-tma", "--inflight", "--pingpong"]),
                       8192, 8192, 132, _Module())
    assert list(rows) == ["tile", "pair", "pair, metadata by TMA", "tile, metadata by TMA", "tile, INFLIGHT=1",
                          "pair, INFLIGHT=1", "pair, metadata by TMA, INFLIGHT=1", "tile, metadata by TMA, INFLIGHT=1"]
    assert rows["tile, metadata by TMA"] == (("sparse_gemm_e4m3_mt", (2048,)), {})
    assert rows["pair, metadata by TMA, INFLIGHT=1"] == (("sparse_gemm_e4m3_pair_mt", (132,)), {"INFLIGHT": 1})


def test_gemm_variants_inflight_and_pingpong_rows():
    """--inflight adds each kernel again with INFLIGHT=1; --pingpong the ping-pong kernel at its best
    configuration on a CTA per SM (132 here, for 32 x 32 tiles of 128 x 256); the defaults are unchanged."""
    plain = gv.variants(_Module(), None, "bf16", gv.parse_args([]), 8192, 8192, 132)
    assert plain == {"tile": (("sparse_gemm_bf16", (2048,)), {}), "pair": (("sparse_gemm_bf16_pair", (132,)), {})}
    rows = gv.variants(_Module(), _Module(), "f16", gv.parse_args(["--inflight", "--pingpong"]), 8192, 8192, 132)
    assert list(rows) == ["tile", "pair", "ping-pong 128x128, BK 128", "tile, INFLIGHT=1", "pair, INFLIGHT=1",
                          "ping-pong 128x128, BK 128, INFLIGHT=1"]
    assert rows["tile, INFLIGHT=1"] == (("sparse_gemm_f16", (2048,)), {"INFLIGHT": 1})
    assert rows["ping-pong 128x128, BK 128"] == (("sparse_gemm_f16_pingpong", (132,)),
                                                  {"BN": 128, "BK": 128, "STAGES": 4})
    assert rows["ping-pong 128x128, BK 128, INFLIGHT=1"][1] == {"BN": 128, "BK": 128, "STAGES": 4, "INFLIGHT": 1}


def test_gemm_variants_l2_hint_rows():
    """--l2-hint adds the metadata-by-TMA kernels again with L2 eviction priorities (and nothing without
    --meta-tma)."""
    rows = gv.variants(_Module(), None, "bf16", gv.parse_args(["--meta-tma", "--l2-hint"]), 57344, 256, 132,
                       _Module())
    assert list(rows) == ["tile", "tile, metadata by TMA", "tile, metadata by TMA, L2 A first",  # (448 tiles: no pairs)
                          "tile, metadata by TMA, L2 B last", "tile, metadata by TMA, L2 A first B last"]
    assert rows["tile, metadata by TMA, L2 A first B last"] == (("sparse_gemm_bf16_mt", (448,)),
                                                                {"L2A": "evict_first", "L2B": "evict_last"})
    big = gv.variants(_Module(), None, "f16", gv.parse_args(["--meta-tma", "--l2-hint"]), 8192, 8192, 132, _Module())
    assert big["pair, metadata by TMA, L2 B last"] == (("sparse_gemm_f16_pair_mt", (132,)), {"L2B": "evict_last"})
    assert list(gv.variants(_Module(), None, "bf16", gv.parse_args(["--l2-hint"]), 57344, 256, 132)) == ["tile"]


# ------------------------------------------------------------------------------------------------
# bench_decode_heuristic


def test_decode_heuristic_without_gpu_says_why(capsys):
    from sparsile.backend import runtime

    if runtime.has_gpu():
        pytest.skip("this machine can run the benchmark")
    bdh = load_script("bench_decode_heuristic")
    assert bdh.main(["--shapes", "4608x3584", "--tokens", "1"]) == 3
    assert "no GPU here" in capsys.readouterr().err
    assert all("x" in shape for shape in bdh.QWEN)


# ------------------------------------------------------------------------------------------------
# bench_decode_qx


def test_decode_qx_rotates_and_parses():
    bq = load_script("bench_decode_qx")
    steps = []
    calls = bq.Calls(3, lambda i, stream: steps.append((i, stream)), calls=6)
    for _ in range(4):
        calls(stream="s")
    assert steps == [(0, "s"), (1, "s"), (2, "s"), (0, "s")] and calls.calls == 6
    with pytest.raises(SystemExit):
        bq.main(["--tokens", "one"])


def test_decode_qx_without_gpu_says_why(capsys):
    from sparsile.backend import runtime

    if runtime.has_gpu():
        pytest.skip("this machine can run the benchmark")
    bq = load_script("bench_decode_qx")
    assert bq.main(["--shapes", "4096x4096", "--tokens", "1", "--stages", "4"]) == 3
    assert "no GPU here" in capsys.readouterr().err


def test_profile_decode_defaults_to_8b_gate_up_at_1_and_64_tokens():
    pd = load_script("profile_decode")
    args = pd.parse_args([])
    assert (args.shape, args.tokens, args.dtype, args.no_peers) == ("28672x4096", [1, 64], "bf16", False)
    assert pd.parse_args(["--shape", "4096x4096", "--tokens", "16", "--no-peers"]).no_peers


def test_sparse_gemm_cold_table_uses_the_faster_cusparselt():
    r = _gemm_row("x", "bf16", 16, sparsile=10.0, cold_ours=5.0, cold_ours_err=2e-4, cold_cslt=12.0,
                  cold_cslt_tuned=10.0, cold_cublas=9.0)
    assert bsg.cold_speedups(r) == {"vs_cslt": pytest.approx(2.0), "vs_cublas": pytest.approx(1.8)}
    line = bsg.format_cold_row(r)
    assert len(line.split("|")) == len(bsg.COLD_HEADER.split("|"))
    assert line.rstrip().endswith("2.00      1.80 2.0e-04")
    missing = bsg.format_cold_row(_gemm_row("x", "e4m3", 16, sparsile=1.0, cold_ours=1.0))
    assert missing.rstrip().endswith("-         -       -")
    assert bsg.parse_args(["--l2", "cold"]).l2 == "cold" and bsg.parse_args([]).l2 == "warm"


def test_sparse_gemm_host_table_puts_each_call_beside_ours():
    r = _gemm_row("x", "bf16", 16, sparsile=10.0, decode=8.0, host_ours=20.0, host_cublas=30.0, host_cslt=90.0)
    line = bsg.format_host_row(r)
    assert len(line.split("|")) == len(bsg.HOST_HEADER.split("|"))
    assert line.rstrip().endswith("8.0     20.0 |     30.0       90.0 |      1.50    4.50")
    missing = bsg.format_host_row(_gemm_row("x", "e4m3", 16, sparsile=1.0, host_ours=5.0))
    assert missing.rstrip().endswith("-          - |         -       -")


def test_probe_graph_launch_without_gpu_says_why(monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    probe_graph_launch = load_script("probe_graph_launch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("sys.argv", ["probe_graph_launch.py"])
    probe_graph_launch.main()
    assert "needs torch with a CUDA GPU" in capsys.readouterr().out


def test_llama_example_without_gpu_exits_3(capsys):
    """examples/llama_sparse.py without a GPU: 3, as ``sparsile`` and tune_decode.py say "no GPU" (the CLI's
    exit statuses: 2 is a usage error, which is what the example said)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine can run the example")
    ex = load_example("llama_sparse")
    assert ex.main(["--layers", "1"]) == 3
    assert "llama_sparse.py needs an NVIDIA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        ex.parse_args(["--layers", "0"])
    assert info.value.code == 2


def test_profile_llama_step_arguments_names_and_missing_gpu(capsys):
    pls = load_script("profile_llama_step")
    args = pls.parse_args(["--batches", "16", "--models", "dense", "sparsile"])
    assert (args.batches, args.models, args.mode, args.layers) == ([16], ["dense", "sparsile"], "graph", 32)
    assert args.attention == "sdpa-gqa"
    assert pls.short("void cutlass::Kernel2<foo>(Params)") == "cutlass::Kernel2<foo>"
    assert len(pls.short("k" * 200)) == 70 and pls.short("k" * 200).endswith("...")
    if bll.requirements_missing() is None:
        return  # this machine can run it: nothing to say
    assert pls.main(["--layers", "1"]) == 3
    assert "profile_llama_step needs an NVIDIA GPU" in capsys.readouterr().err


def test_linear_a_failing_later_pass_keeps_the_first(monkeypatch, tmp_path, capsys):
    """--passes 2 where the second pass's SparseLinear call raises (a device out of memory, say): as in the
    first pass, where a contender's exception is a note in the row, the row keeps its first-pass times and
    gets a note, and the targets and the JSON are still written (the exception ended the run: the first
    pass's whole table lost from the JSON)."""
    pytest.importorskip("torch")
    import torch.nn.functional as F

    built = []

    class StandIn:  # fine in the first layer built, raising in the second pass's
        def __init__(self, linear):
            self.weight, self.fail = linear.weight.detach().clone(), bool(built)
            built.append(self)

        def __call__(self, x):
            if self.fail:
                raise RuntimeError("CUDA out of memory (stand-in)")
            return F.linear(x, self.weight)

    linear_on_cpu(monkeypatch, StandIn)
    out = tmp_path / "linear.json"
    assert bl.main(["--tokens", "1", "--blocks", "1", "--dtypes", "bf16", "--variants", "eager",
                    "--passes", "2", "--json", str(out)]) == 0
    assert len(built) == 2
    r = json.loads(out.read_text())["rows"][0]
    assert "sl_best_passes" not in r and "dense_best_passes" not in r and r["sl_best"] > 0
    assert r["errors"]["pass 2"] == "RuntimeError: CUDA out of memory (stand-in)"
    assert "targets:" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------
# bench_launch_cpu (in a process of its own: it replaces the device with a fake one)


def test_bench_launch_cpu_prints_every_row():
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_launch_cpu.py"), "--rounds", "1",
                          "--target-ms", "1"], capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert run.returncode == 0, run.stderr
    rows = {}
    for line in run.stdout.splitlines()[2:]:
        name, lo, med, calls = re.fullmatch(r"(.+?)\s+([\d.]+)\s+([\d.]+)\s+(\d+)", line).groups()
        assert 0 < float(lo) <= float(med)
        rows[name] = int(calls)
    assert len(rows) == 7
    full = rows["vadd, torch stand-ins, n= by keyword (full path)"]
    for name in ("vadd, torch stand-ins: kernel[grid]", "vadd, DeviceBuffers: kernel[grid]",
                 "vadd @jit (captures), torch stand-ins: kernel[grid]"):
        assert rows[name] < full / 3  # the fast path
