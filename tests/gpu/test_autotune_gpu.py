"""The autotuner on the GPU (docs/autotune.md): a tuned vector add and the tuned sparse GEMM pick the
fastest config of their own measurements (the default among those timed), results are checked
against float64 with poisoned outputs, and tuning an in-place kernel leaves its output as one launch
makes it.

No test here re-times configs to assert a speed: a second measurement repeats the machine's noise
(and the GPU tests share the GPU between workers), so whether tuning pays is shown by
benchmarks/bench_sparse_gemm.py (default against tuned), not by a timed test."""

from __future__ import annotations

import json

import numpy as np
import pytest

import sparsile as sp

pytestmark = pytest.mark.gpu


def test_vector_add_tunes_to_its_fastest_measured_config(tmp_path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path))
    configs = [sp.Config({"BLOCK": 128}, num_warps=1), sp.Config({"BLOCK": 1024}, num_warps=4),
               sp.Config({"BLOCK": 4096}, num_warps=8), sp.Config({"BLOCK": 8192}, num_warps=8)]

    @sp.autotune(configs=configs, key=["n"])
    @sp.jit
    def add(x: sp.ptr[sp.f32], y: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        mask = offs < n
        sp.store(out + offs, sp.load(x + offs, mask=mask) + sp.load(y + offs, mask=mask), mask=mask)

    n = 1 << 24
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    grid = lambda meta: (-(-n // meta["BLOCK"]),)  # noqa: E731
    add[grid](x, y, out, n)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(out.cpu().numpy(), (x.double() + y.double()).float().cpu().numpy())
    record = next(iter(add.cache.values()))
    assert record.how == "tuned" and len(record.timings) + len(record.skipped) == 4 and len(record.timings) >= 2
    print(add.summary())
    assert record.timings[str(record.config)] == min(record.timings.values())


def test_tuning_an_in_place_kernel_restores_its_output(tmp_path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path))

    @sp.autotune(configs=[{"BLOCK": 256}, {"BLOCK": 1024}], key=["n"], warmup=3, rep=5)
    @sp.jit
    def bump(x: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        sp.store(x + offs, sp.load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

    x = torch.randn(100_000, device="cuda")
    before = x.clone()
    bump[lambda m: (-(-x.numel() // m["BLOCK"]),)](x, x.numel())
    torch.cuda.synchronize()
    assert torch.equal(x, before + 1)  # one launch's worth, not 1 + (warmup + rep) per config


def test_sparse_gemm_tunes_to_its_fastest_measured_config(tmp_path) -> None:
    """bf16 4096 x 512 x 4096 (64 tiles of BN 256 on 132 SMs: BN, STAGES and split-K all matter):
    the tuned config computes C within float64 bounds (poisoned output) and is the fastest of the
    tuner's measurements, the default's among them."""
    pytest.importorskip("torch")
    from sparsile.stdlib.kernels.gemm_config import GemmConfig
    from sparsile.stdlib.kernels.tuning import load_gemm_table, lookup, sparse_matmul_tuned, tune_sparse_matmul
    from sparsile.tests.stdlib.test_gemm_api import assert_close, problem, reference

    m, n, k = 4096, 512, 4096
    path = tmp_path / "table.json"
    table = tune_sparse_matmul([f"{m}x{n}x{k}"], dtypes=("bf16",), warmup=5, rep=20, out=path)
    print(json.dumps(table, indent=1))
    config = lookup(load_gemm_table(path), "bf16", m, n, k)
    assert isinstance(config, GemmConfig)
    entry = next(iter(table["entries"].values()))
    assert entry["default_us"] is not None and entry["us"] <= entry["default_us"]

    weight, b = problem("bf16", m, n, k, seed=21)
    out = np.full((m, n), np.nan, np.float16)
    c = sparse_matmul_tuned(weight.values, weight.meta, b, table=path, out=out)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, "bf16")


def test_the_linear_kernel_tunes_and_its_entry_is_planned(tmp_path, monkeypatch) -> None:
    """``sparsile tune --linear``'s body on the GPU: bf16 4096 x 256 x 4096 (the layer's tiled
    kernel; T <= 64 is skipped and said), each config replayed from a CUDA graph; the entry's time
    is the fastest measured, and the layer's plan takes it from the table (linear-bf16), with y
    within float64 bounds (poisoned first)."""
    torch = pytest.importorskip("torch")
    import io

    from sparsile.stdlib.kernels import linear, tuning
    from sparsile.stdlib.kernels.gemm_config import GemmConfig
    from sparsile.stdlib.kernels.linear_tuning import tune_sparse_linear
    from sparsile.stdlib.kernels.tuning import index_table, load_gemm_table
    from sparsile.tests.stdlib.test_linear_api import assert_linear_close, cuda_copy, problem

    m, t, k = 4096, 256, 4096
    path = tmp_path / "table.json"
    err = io.StringIO()
    table = tune_sparse_linear([f"{m}x{t}x{k}", f"{m}x16x{k}"], warmup=3, rep=10, out=path, stderr=err)
    assert list(table["entries"]) == [f"linear-bf16 {m}x{t}x{k}"] and "4096x16x4096 skipped" in err.getvalue()
    entry = table["entries"][f"linear-bf16 {m}x{t}x{k}"]
    assert entry["default_us"] is not None and entry["us"] <= entry["default_us"]
    config = GemmConfig.from_json(entry["config"])
    index = index_table(load_gemm_table(path))
    monkeypatch.setattr(tuning, "_shipped_index", lambda *gpu: index)
    weight, x = problem("bf16", m, t, k, seed=5)
    out = torch.full((t, m), float("nan"), device="cuda", dtype=torch.bfloat16)
    plan = linear.plan_sparse_linear(cuda_copy(np.asarray(weight.values)), weight.meta, cuda_copy(x), out=out)
    assert (plan.bn, plan.split_k, plan.stages, plan.group_m, bool(plan.pair)) == (
        config.bn, config.split_k, config.stages, config.group_m, config.pair)
    y = plan.run()
    torch.cuda.synchronize()
    assert_linear_close(y.float().cpu().numpy().astype(x.dtype), weight, x, k, "bf16", "bfloat16")
