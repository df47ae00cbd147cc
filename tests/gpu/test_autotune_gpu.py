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
    from sparsile.stdlib.kernels.tuning import (
        GemmConfig,
        load_gemm_table,
        lookup,
        sparse_matmul_tuned,
        tune_sparse_matmul,
    )
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
