"""Sparse GEMM on the H200: sparsile 2:4 vs cuSPARSELt (torch._cslt_sparse_mm) vs cuBLAS dense
(torch.mm) vs sparsile dense, in one run, one table.

    C (M x N) = A_2:4 (M x K) @ B^T,  B stored N x K

For the LLM rows, A is the pruned weight (M = out features, K = in features) and B the activations
(N = tokens), i.e. C = W X^T. Kernel times come from the CUDA profiler (device time of the kernels
a call launches, averaged over the timed calls), so per-call host work (torch's re-planning,
Python launch overhead) is excluded for every contender alike. Effective TFLOP/s = 2*M*N*K / time
for sparse and dense alike.

cuSPARSELt is measured twice: with its default algorithm (column *cuSPARSELt*) and with the one
``torch._cslt_sparse_mm_search`` picks (column *tuned*, passed as ``alg_id``); every ratio is
against the faster of the two (see docs/ for the kernels' design).

    python benchmarks/bench_sparse_gemm.py            # the full table
    python benchmarks/bench_sparse_gemm.py --quick    # 4096 and 8192 squares, f16 only
    python benchmarks/bench_sparse_gemm.py --grid llama3 --json gemm.json   # Llama-3 layers x T x dtype
    python benchmarks/plot_gemm.py gemm.json --out plots/                   # a PNG per layer shape
    python benchmarks/bench_sparse_gemm.py --grid llama3 --tokens 1 16 64 --l2 cold   # also from HBM
    python benchmarks/bench_sparse_gemm.py --schedule pingpong --case bf16:8192x8192x8192 \
        --pingpong-config 64x256x64x5       # also the ping-pong kernel (column pingpong; f16/bf16)

``--l2 cold`` adds a second table: sparse_matmul as a user calls it, cuBLAS and cuSPARSELt (both
algorithms), each rotating over copies of its weight of at least 3 x L2, so that every call reads
the weight from HBM as a model's layers do. The main table's calls repeat one weight, which stays in
the 50 MB L2 where it fits (8B o and qkv: 19-28 MB compressed, 34-50 MB dense), so small weights
there measure L2 rather than HBM.

Every run also prints a host-inclusive table: µs per call of sparse_matmul as a user calls it (its
call cache warm, stdlib/kernels/call_cache.py), torch.mm and torch's cuSPARSELt call with the
searched algorithm, each back to back with a synchronize after every block of calls, beside
sparse_matmul's kernel time: what a caller waits for, host work included.

``--schedule pingpong`` adds the kernel ``sparse_matmul(..., schedule="pingpong")`` runs
(sparse_gemm_sm90_pingpong.spk, docs/hopper.md "The ping-pong schedule": BM 128, BN = min(BN, 128),
BK 64, 6 stages, min(tiles, SMs) CTAs) to every f16/bf16 case without split-K; each
``--pingpong-config BMxBNxBKxSTAGES`` is timed too (JSON ``pingpong_configs``; the column shows the
fastest). Its register budgets need the whole-program ptxas: run with SPARSILE_PTXAS=<ptxas> or the
``nvidia-cuda-nvcc`` wheel installed, else it runs without them (warning SP0612, row ``pingpong_note``).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import environment, positive  # a sibling script, not a package

ROOT = Path(__file__).resolve().parents[1]

SQUARES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384)]
# (out features, in features) of Llama-3 8B / 70B MLP layers, with T tokens
LLM = [((14336, 4096), (16, 2048, 8192)), ((4096, 14336), (128, 4096)), ((28672, 8192), (16, 4096))]
# --grid llama3: (name, out features M, in features K) of the Llama-3 8B / 70B projections (QKV
# fused, gate+up fused), each with every T of LLAMA3_TOKENS, in bf16 and f16
LLAMA3_SHAPES = [("8B-qkv", 6144, 4096), ("8B-o", 4096, 4096), ("8B-gate_up", 28672, 4096),
                 ("8B-down", 4096, 14336), ("70B-qkv", 10240, 8192), ("70B-o", 8192, 8192),
                 ("70B-gate_up", 57344, 8192), ("70B-down", 8192, 28672)]
LLAMA3_TOKENS = (1, 16, 64, 256, 512, 1024, 4096, 8192)
GRIDS = {"llama3": LLAMA3_SHAPES}
DTYPES = ("f16", "bf16", "e4m3")


@dataclass(frozen=True)
class Case:
    """One measurement: C (M x N) = A_2:4 (M x K) @ B^T; ``shape`` names the layer (grid cases)."""

    dtype: str
    m: int
    n: int
    k: int
    shape: str | None = None


def select_shapes(grid: str, names: list[str] | None) -> list[tuple[str, int, int]]:
    """The grid's shapes whose name, model (``8B``) or layer (``down``) is one of ``names`` (all if None)."""
    shapes = GRIDS[grid]
    if not names:
        return list(shapes)
    return [s for s in shapes if {s[0], *s[0].split("-", 1)} & set(names)]


def grid_cases(grid: str, names: list[str] | None, tokens: tuple[int, ...], dtypes: list[str]) -> list[Case]:
    """Every (shape, T, dtype) of ``grid``: M = out features, N = T tokens, K = in features."""
    return [Case(dt, m, t, k, name) for name, m, k in select_shapes(grid, names) for t in tokens for dt in dtypes]


def shape_name(text: str) -> str:
    """An argparse type: a shape, model or layer name of some grid (``8B-qkv``, ``70B``, ``down``)."""
    known = {part for shapes in GRIDS.values() for s in shapes for part in (s[0], *s[0].split("-", 1))}
    if text not in known:
        raise argparse.ArgumentTypeError(f"unknown shape {text!r}; known: {', '.join(sorted(known))}")
    return text


def case_spec(text: str) -> Case:
    """An argparse type: ``DTYPE:MxNxK``, e.g. ``f16:8192x8192x8192``."""
    try:
        dt, dims = text.split(":")
        m, n, k = (int(x) for x in dims.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DTYPE:MxNxK (e.g. f16:8192x8192x8192), got {text!r}") from None
    if dt not in DTYPES or min(m, n, k) <= 0 or k % 4:
        raise argparse.ArgumentTypeError(f"{text!r}: dtype one of {', '.join(DTYPES)}, positive sizes, K % 4 == 0")
    return Case(dt, m, n, k)


# ------------------------------------------------------------------------------------------------
# row arithmetic (shared with plot_gemm.py; no GPU needed)


def ours(r: dict) -> float:
    """Time (µs) of what sparse_matmul runs: the decode kernel at N <= 64 (``decode``), else the
    shipped tuned table's choice where it has one for the shape (``table``), else the pair kernel
    where measured, else one CTA per tile."""
    return r.get("decode") or r.get("table") or r.get("pair") or r["sparsile"]


def best_cslt(r: dict) -> float | None:
    """The faster of cuSPARSELt's default and searched algorithm (µs), None if neither ran."""
    times = [t for t in (r.get("cslt"), r.get("cslt_tuned")) if t]
    return min(times) if times else None


def speedups(r: dict) -> dict[str, float | None]:
    """sparsile's speed-up over the best cuSPARSELt (``vs_cslt``) and over cuBLAS (``vs_cublas``)."""
    best, cublas = best_cslt(r), r.get("cublas")
    return {"vs_cslt": best / ours(r) if best else None, "vs_cublas": cublas / ours(r) if cublas else None}


def tflops(r: dict, t_us: float | None) -> float | None:
    """Effective TFLOP/s of a time in µs on the row's shape: 2MNK / t."""
    return 2.0 * r["m"] * r["n"] * r["k"] / t_us / 1e6 if t_us else None


def geomean(values: list[float]) -> float:
    """The geometric mean of positive numbers."""
    if not values or min(values) <= 0:
        raise ValueError("geometric mean of an empty list or of non-positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def profile_kernel_time(fn, iters: int, warmup: int = 3) -> float:
    """Mean device time (us) per call of the kernels ``fn`` launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for evt in prof.events():
        if evt.device_type.name == "CUDA" and evt.device_time_total > 0 and "Memcpy" not in evt.name \
                and "Memset" not in evt.name:
            total += evt.device_time_total
    return total / iters


def bn_for(n: int) -> int:
    bn = 16
    while bn < min(n, 256):
        bn *= 2
    return bn


def pingpong_config(text: str) -> tuple[int, int, int, int]:
    """An argparse type: ``BMxBNxBKxSTAGES`` of the ping-pong kernel, e.g. ``128x128x64x6``."""
    try:
        bm, bn, bk, stages = (int(x) for x in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BMxBNxBKxSTAGES (e.g. 128x128x64x6), got {text!r}") from None
    if bm not in (64, 128) or bm * bn > 128 * 128 or bn % 16 or bk not in (64, 128) or not 2 <= stages <= 12:
        raise argparse.ArgumentTypeError(f"{text!r}: BM 64 or 128, BM x BN <= 128 x 128, BK 64 or 128, 2-12 stages")
    return bm, bn, bk, stages


def pingpong_times(run, sp_dtype: str, m: int, n: int, bn: int, sms: int,
                   configs: tuple[tuple[int, int, int, int], ...]) -> dict:
    """The ping-pong kernel (sparse_gemm_<t>_pingpong) at the planner's configuration and at each of
    ``configs``: ``pingpong`` (µs) and ``pingpong_err`` of the fastest, ``pingpong_configs``
    {"BMxBNxBKxSTAGES": [µs, err]}. ``run(kernel, constexprs)`` -> (err, µs)."""
    from sparsile.backend.toolchain.whole_program import whole_program_ptxas
    from sparsile.stdlib.kernels.gemm_schedule import pingpong_block_n, pingpong_module

    mod = pingpong_module()
    out: dict = {"pingpong_configs": {}}
    if whole_program_ptxas() is None:  # nvJitLink assembles it (warning SP0612 on the first compile only)
        out["pingpong_note"] = "register budgets dropped (SP0612): no whole-program ptxas"
    planned = (128, pingpong_block_n(bn), 64, 6)
    for bm, bnp, bk, stages in dict.fromkeys((planned, *configs)):
        tiles = -(-m // bm) * -(-n // bnp)
        kern = getattr(mod, f"sparse_gemm_{sp_dtype}_pingpong")[(min(tiles, sms),)]
        err, t = run(kern, {"BM": bm, "BN": bnp, "BK": bk, "STAGES": stages})
        out["pingpong_configs"][f"{bm}x{bnp}x{bk}x{stages}"] = [t, err]
    best = min(out["pingpong_configs"].values())
    out["pingpong"], out["pingpong_err"] = best
    return out


def pruned_operands(dtype: str, m: int, n: int, k: int, seed: int) -> dict:
    """A (M x K, 2:4 by magnitude, pruned on the device), B (N x K), A's compression in the "sm90"
    format on the device (``values``, ``meta`` and its row stride ``lde``), and the float64 product
    A @ B^T (``ref``, with ``scale`` = max |ref|)."""
    import ml_dtypes
    import torch

    from sparsile.stdlib import sparsity as S

    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    a32 = torch.randn(m, k, device="cuda", generator=g)
    b32 = torch.randn(n, k, device="cuda", generator=g)
    # 2:4 magnitude pruning on the device (top-2 of every 4), compression with the sparsity toolkit
    grp = a32.view(m, k // 4, 4)
    keep = grp.abs().topk(2, dim=-1).indices
    mask = torch.zeros_like(grp, dtype=torch.bool).scatter_(-1, keep, True)
    w = (grp * mask).view(m, k).to(tdt)
    b = b32.to(tdt)
    host_dt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[dtype]
    w_host = w.view(torch.int16 if dtype != "e4m3" else torch.int8).cpu().numpy().view(host_dt)
    vals, idx = S.compress(w_host, dtype)
    meta = np.asarray(S.encode_metadata(idx, "sm90", dtype).data).view(np.int32)
    ints = np.int16 if dtype != "e4m3" else np.int8
    ref = (w.double() @ b.double().T).float()  # float64 product on the GPU
    return {"w": w, "b": b, "values": torch.from_numpy(np.ascontiguousarray(vals).view(ints)).cuda().view(tdt),
            "meta": torch.from_numpy(np.ascontiguousarray(meta)).cuda().view(torch.uint32), "lde": meta.shape[1],
            "ref": ref, "scale": ref.abs().max().item()}


def bench_case(sp_mod, dense_mod, dtype: str, m: int, n: int, k: int, iters: int, schedule: str = "default",
               pp_configs: tuple[tuple[int, int, int, int], ...] = (), l2: str = "warm") -> dict:
    import torch

    from sparsile.stdlib.kernels.gemm import choose_split_k, pair_ctas
    from sparsile.stdlib.kernels.gemm_choice import KERNELS

    o = pruned_operands(dtype, m, n, k, seed=m + n + k)
    w, b, vals_t, meta_t, ref, scale = o["w"], o["b"], o["values"], o["meta"], o["ref"], o["scale"]
    lde = o["lde"]
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    bn = bn_for(n)
    grid = (((m + 127) // 128) * ((n + bn - 1) // bn),)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split = choose_split_k(m, n, k, bn, KERNELS[dtype], sms)  # what sparse_matmul would pick
    kern = getattr(sp_mod, f"sparse_gemm_{dtype}" + ("_splitk" if split > 1 else ""))[(grid[0], split)]
    if split == 1:
        def ours():
            kern(vals_t, meta_t, b, c, m, n, k, lde, n, BN=bn)
    else:
        work = torch.empty(split, m, n, device="cuda", dtype=torch.float32)
        reduce = sp_mod.splitk_reduce[((m * n + 1023) // 1024,)]

        def ours():
            kern(vals_t, meta_t, b, work, m, n, k, lde, n, BN=bn, SPLIT_K=split)
            reduce(work, c, m * n, SPLIT_K=split)

    def checked_time(fn) -> tuple[float, float]:
        """(max |C - ref| / max |ref| of one poisoned run, mean kernel time in µs)."""
        c.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        return ((c.float() - ref).abs().max() / scale).item(), profile_kernel_time(fn, iters)

    err, t = checked_time(ours)
    row = {"dtype": dtype, "m": m, "n": n, "k": k, "sparsile": t, "err": err, "split": split}
    variants = {}
    if grid[0] > sms:  # persistent: one CTA per SM, each computing several tiles
        variants["persistent"] = getattr(sp_mod, f"sparse_gemm_{dtype}")[(sms,)]
    pairs = pair_ctas(m, n, bn, KERNELS[dtype], split, True, sms)
    if pairs:  # what sparse_matmul runs for large C: CTA pairs sharing B (multicast), persistent
        variants["pair"] = getattr(sp_mod, f"sparse_gemm_{dtype}_pair")[(pairs,)]
    for name, launch in variants.items():
        row[f"{name}_err"], row[name] = checked_time(
            lambda launch=launch: launch(vals_t, meta_t, b, c, m, n, k, lde, n, BN=bn))
    row.update(table_time(dtype, vals_t, meta_t, b, c, sms, checked_time))
    row.update(tail_time(vals_t, meta_t, b, c, sms, checked_time))
    row.update(streamk_time(vals_t, meta_t, b, c, sms, checked_time))
    row.update(decode_time(vals_t, meta_t, b, c, checked_time))
    if schedule == "pingpong" and dtype in ("f16", "bf16") and split == 1:
        row.update(pingpong_times(
            lambda kern, cfg: checked_time(lambda: kern(vals_t, meta_t, b, c, m, n, k, lde, n, **cfg)),
            dtype, m, n, bn, sms, pp_configs))
    row.update(cslt_times(w, b, dtype, iters))
    if dtype != "e4m3":
        row["cublas"] = profile_kernel_time(lambda: torch.mm(w, b.T), iters)
        dkern = getattr(dense_mod, f"dense_gemm_{dtype}")[grid]
        wd = w.contiguous()
        row["sp_dense"] = profile_kernel_time(lambda: dkern(wd, b, c, m, n, k, n, BN=bn), iters)
        row["dense_err"] = ((c.float() - ref).abs().max() / scale).item()
    else:
        try:
            one = torch.tensor(1.0, device="cuda")
            row["cublas"] = profile_kernel_time(lambda: torch._scaled_mm(w, b.T, scale_a=one, scale_b=one,
                                                                         out_dtype=torch.float16), iters)
        except Exception:
            row["cublas"] = None
        row["sp_dense"] = None
    if l2 == "cold":
        row.update(cold_times(dtype, o, m, n, k, iters, row.get("cslt_alg")))
    try:  # a failure here leaves the row's kernel times
        row.update(host_times(dtype, o, c, row.get("cslt_alg")))
    except Exception as e:
        row["host_error"] = f"{type(e).__name__}: {str(e)[:80]}"
    return row


def host_times(dtype: str, o: dict, c, cslt_alg: int | None) -> dict:
    """Host-inclusive µs per call as a torch user calls each contender, back to back with a
    synchronize after each block (``torch_timing.time_calls``, median block): ``host_ours``
    (sparse_matmul into C, its call cache warm: stdlib/kernels/call_cache.py), ``host_cublas``
    (torch.mm; e4m3: torch._scaled_mm) and ``host_cslt`` (torch._cslt_sparse_mm with the searched
    algorithm, else the default; compressed once). A contender that cannot run is left out."""
    import torch
    from torch_timing import time_calls

    from sparsile.stdlib.kernels.gemm import sparse_matmul

    w, b, vals, meta = o["w"], o["b"], o["values"], o["meta"]

    def timed(fn) -> float:
        for _ in range(10):  # compiled, recorded, planned
            fn()
        torch.cuda.synchronize()
        return time_calls(fn, torch.cuda.synchronize, blocks=5, target_s=0.01, max_calls=100).wall

    out: dict = {"host_ours": timed(lambda: sparse_matmul(vals, meta, b, out=c, dtype=dtype))}
    if dtype == "e4m3":
        one = torch.tensor(1.0, device="cuda")
        dense = lambda: torch._scaled_mm(w, b.T, scale_a=one, scale_b=one, out_dtype=torch.float16)  # noqa: E731
    else:
        dense = lambda: torch.mm(w, b.T)  # noqa: E731
    kw = {"out_dtype": torch.float16} if dtype == "e4m3" else {}
    for key, fn in (("host_cublas", lambda: dense), ("host_cslt", lambda: _cslt_call(w, b, cslt_alg, kw))):
        try:
            out[key] = timed(fn())
        except Exception as e:  # not in this torch build, or this dtype / shape refused
            out[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:80]}"
    return out


def _cslt_call(w, b, alg: int | None, kw: dict):
    """torch's cuSPARSELt call on W compressed once, with ``alg`` where searched (B^T as a view,
    else a contiguous copy made once, as :func:`cslt_times`)."""
    import torch

    comp, bt = torch._cslt_compress(w), b.T
    extra = {"alg_id": alg} if alg is not None else {}
    try:
        torch._cslt_sparse_mm(comp, bt, **extra, **kw)
    except Exception:
        bt = b.T.contiguous()
    return lambda: torch._cslt_sparse_mm(comp, bt, **extra, **kw)


def table_time(dtype: str, values, meta, b, c, sms: int, checked_time) -> dict:
    """``table`` (µs), ``table_err`` and ``table_config`` of the shipped tuned table's choice for
    this shape (stdlib/kernels/tuned/<gpu>.json, what sparse_matmul launches), or {} without one."""
    from sparsile.stdlib.kernels.gemm import plan_sparse_matmul
    from sparsile.stdlib.kernels.tuning import launch, shipped_config, with_config

    m, n, k = int(values.shape[0]), int(b.shape[0]), int(b.shape[1])
    config = shipped_config(dtype, m, n, k, nearby=True)  # as sparse_matmul (tuning.run_with_table)
    if config is None:
        return {}
    plan = with_config(plan_sparse_matmul(values, meta, b, out=c, target="sm_90a"), config, sms)
    err, t = checked_time(lambda: launch(plan, config))
    return {"table": t, "table_err": err, "table_config": str(config)}


def tail_time(values, meta, b, c, sms: int, checked_time) -> dict:
    """``tail`` (µs), ``tail_config`` and ``tail_err`` (the largest of every variant timed): the
    fastest tail split (stdlib/kernels/gemm_tail.py: whole waves unsplit, the last wave's rows
    split along K) of the config sparse_matmul runs here (the table's, else the planned default;
    STAGES and GROUP_M kept), where that config is unsplit and C's last wave is part-full; {}
    elsewhere, and where sparse_matmul runs the decode kernel (N <= 64), which has no tail split.
    sparse_matmul runs a tail split only where a table entry names one (``table``). A variant that
    fails leaves ``tail_error`` and the rest of the row is measured."""
    from sparsile.stdlib.kernels.gemm import has_pair_kernel
    from sparsile.stdlib.kernels.tuning import tail_variants

    def variants(plan, base, steps):
        if base.split_k != 1 or base.tail_split or base.streamk:
            return []
        return tail_variants(base, plan.m, plan.n, steps, sms, has_pair_kernel(plan.choice))
    return _fastest_variant("tail", variants, values, meta, b, c, checked_time, sms)


def streamk_time(values, meta, b, c, sms: int, checked_time) -> dict:
    """``streamk`` (µs), ``streamk_config`` and ``streamk_err``: the fastest stream-K launch
    (stdlib/kernels/gemm_streamk.py: every SM an even share of the (tile, K step) work) at the BN of
    the config sparse_matmul runs here and half of it, STAGES 4 and 5, where C's last wave is
    part-full and the stream-K kernel takes the operands; {} elsewhere (N <= 64 included).
    sparse_matmul runs it only where a table entry names it (``table``)."""
    from sparsile.stdlib.kernels.gemm import BM
    from sparsile.stdlib.kernels.gemm_config import GemmConfig
    from sparsile.stdlib.kernels.gemm_streamk import STREAMK_OPERANDS

    def variants(plan, base, steps):
        tiles = -(-plan.m // BM) * -(-plan.n // base.bn)
        if plan.choice.operand not in STREAMK_OPERANDS or not tiles % sms:
            return []
        return [GemmConfig(bn, stages, group_m=base.group_m, streamk=True)
                for bn in (base.bn, base.bn // 2) if bn >= 16 for stages in (4, 5)]
    return _fastest_variant("streamk", variants, values, meta, b, c, checked_time, sms)


def _fastest_variant(name: str, variants, values, meta, b, c, checked_time, sms: int) -> dict:
    """``{name: µs, name_config, name_err}`` of the fastest of ``variants(plan, base config, K
    steps)`` (configs; the base config is the table's, else the planned default), each checked and
    timed by ``checked_time``; {} where there are none or sparse_matmul runs the decode kernel. A
    variant that fails leaves ``name_error`` and the rest of the row is measured."""
    from sparsile.stdlib.kernels.gemm import SparseMatmul, plan_sparse_matmul
    from sparsile.stdlib.kernels.tuning import (
        default_config,
        launch,
        runs_the_decode_kernel,
        shipped_config,
        with_config,
    )

    plan = plan_sparse_matmul(values, meta, b, out=c, target="sm_90a", kernel="gemm")
    if not isinstance(plan, SparseMatmul) or runs_the_decode_kernel(plan.choice.operand, plan.m, plan.n, plan.k):
        return {}
    base = shipped_config(plan.choice.operand, plan.m, plan.n, plan.k, nearby=True) or default_config(plan)
    steps = -(-plan.k_padded // plan.choice.block_k)
    best: dict = {}
    worst = 0.0  # the largest error of any variant timed
    try:
        for cfg in variants(plan, base, steps):
            configured = with_config(plan, cfg, sms)
            err, t = checked_time(lambda configured=configured, cfg=cfg: launch(configured, cfg))
            worst = max(worst, err)
            if not best or t < best[name]:
                best = {name: t, f"{name}_config": str(cfg)}
    except Exception as e:  # a row keeps its other contenders
        return {**best, f"{name}_error": f"{type(e).__name__}: {str(e)[:80]}"}
    return {**best, f"{name}_err": worst} if best else {}


def decode_time(values, meta, b, c, checked_time) -> dict:
    """``decode`` (µs), ``decode_err`` and ``decode_config`` of the decode kernel where sparse_matmul
    runs it (N <= 64: stdlib/kernels/decode.py, C stored feature-major; its split and ring from the
    decode table or heuristic), or {} where it does not."""
    from sparsile.stdlib.kernels.decode import SparseDecodePlan
    from sparsile.stdlib.kernels.gemm import plan_sparse_matmul

    plan = plan_sparse_matmul(values, meta, b, out=c, target="sm_90a")
    if not isinstance(plan, SparseDecodePlan):
        return {}
    err, t = checked_time(plan.run)
    cfg = plan.config
    return {"decode": t, "decode_err": err,
            "decode_config": f"bm={cfg.bm} split_k={cfg.split_k} stages={cfg.stages} ({cfg.source})"}


def cold_times(dtype: str, o: dict, m: int, n: int, k: int, iters: int, cslt_alg: int | None = None) -> dict:
    """``--l2 cold``: the kernel times (µs) of ``sparse_matmul`` as a user calls it (``cold_ours``,
    whatever kernel and table entry it picks; ``cold_ours_err`` of one poisoned call), cuBLAS
    (``cold_cublas``) and cuSPARSELt's default and searched algorithms (``cold_cslt``,
    ``cold_cslt_tuned``), each rotating over copies of its weight that take at least 3 x L2
    together, so that every call reads its weight from HBM as a model's layers do (one call in the
    L2-warm columns reads a weight that fits in the 50 MB L2 from L2). ``cslt_alg``: the searched
    algorithm (from :func:`cslt_times`; searched here when None)."""
    import torch
    from bench_linear import rotating

    from sparsile.stdlib.kernels.gemm import sparse_matmul

    w, b, vals, meta, ref, scale = o["w"], o["b"], o["values"], o["meta"], o["ref"], o["scale"]
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    weights = cold_copies(vals, meta)
    ours = rotating([lambda v=v, e=e: sparse_matmul(v, e, b, out=c, dtype=dtype) for v, e in weights])
    c.fill_(float("nan"))
    sparse_matmul(vals, meta, b, out=c, dtype=dtype)
    torch.cuda.synchronize()
    out = {"cold_ours_err": ((c.float() - ref).abs().max() / scale).item(),
           "cold_ours": profile_kernel_time(ours, max(iters, len(weights)))}
    dense = [d for (d,) in cold_copies(w)]
    if dtype == "e4m3":
        one = torch.tensor(1.0, device="cuda")
        mm = [lambda d=d: torch._scaled_mm(d, b.T, scale_a=one, scale_b=one, out_dtype=torch.float16) for d in dense]
    else:
        mm = [lambda d=d: torch.mm(d, b.T) for d in dense]
    try:
        out["cold_cublas"] = profile_kernel_time(rotating(mm), max(iters, len(dense)))
    except Exception as e:  # torch._scaled_mm may refuse a shape
        out["cold_cublas_error"] = f"{type(e).__name__}: {str(e)[:80]}"
    out.update(cslt_times(w, b, dtype, iters, cold=True, alg=cslt_alg))
    return out


def cold_copies(*tensors) -> list[tuple]:
    """``tensors`` and copies of them (clones) that take at least 3 x L2 together, however many that
    takes (small e4m3 weights need up to 15)."""
    from bench_linear import copies_for_cold_l2

    size = sum(t.numel() * t.element_size() for t in tensors)
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(copies_for_cold_l2(size, most=None) - 1)]


def cold_speedups(r: dict) -> dict[str, float | None]:
    """``--l2 cold``: sparse_matmul's speed-up over the faster cuSPARSELt and over cuBLAS, every
    contender reading its weight from HBM."""
    ours = r.get("cold_ours")
    cslt = [t for t in (r.get("cold_cslt"), r.get("cold_cslt_tuned")) if t]
    cublas = r.get("cold_cublas")
    return {"vs_cslt": min(cslt) / ours if ours and cslt else None,
            "vs_cublas": cublas / ours if ours and cublas else None}


COLD_HEADER = (f"{'dtype':>5} {'M':>6} {'N':>6} {'K':>6} | {'ours':>9} {'TF':>5} | {'cuSPARSELt':>9} {'TF':>5} | "
               f"{'tuned':>9} {'TF':>5} | {'cuBLAS':>9} {'TF':>5} | {'vs cslt':>7} {'vs cuBLAS':>9} {'err':>7}")


def format_cold_row(r: dict) -> str:
    """The L2-cold table's line of a row (``--l2 cold``)."""
    f = 2.0 * r["m"] * r["n"] * r["k"]
    err = f"{r['cold_ours_err']:>7.1e}" if "cold_ours_err" in r else f"{'-':>7}"
    return (f"{r['dtype']:>5} {r['m']:>6} {r['n']:>6} {r['k']:>6} | {fmt(r.get('cold_ours'), f)} | "
            f"{fmt(r.get('cold_cslt'), f)} | {fmt(r.get('cold_cslt_tuned'), f)} | {fmt(r.get('cold_cublas'), f)} | "
            f"{ratio_cells(cold_speedups(r))} {err}")


def ratio_cells(s: dict[str, float | None]) -> str:
    """The "vs cslt" and "vs cuBLAS" cells of a table line ('-' where a contender did not run)."""
    vs = f"{s['vs_cslt']:>7.2f}" if s["vs_cslt"] else f"{'-':>7}"
    vb = f"{s['vs_cublas']:>9.2f}" if s["vs_cublas"] else f"{'-':>9}"
    return f"{vs} {vb}"


def cslt_search(comp, bt, **kw) -> int:
    """The algorithm id ``torch._cslt_sparse_mm_search`` picks (an int, or a tuple starting with it
    in some torch versions)."""
    import torch

    found = torch._cslt_sparse_mm_search(comp, bt, **kw)
    return int(found[0] if isinstance(found, tuple | list) else found)


def cslt_times(w, b, dtype: str, iters: int, cold: bool = False, alg: int | None = None) -> dict:
    """cuSPARSELt on W (M x K, 2:4) @ B^T: ``cslt`` with the default algorithm, ``cslt_tuned`` with
    the searched one (``cslt_alg``; ``alg``: that one, not searched again). Where it refuses B^T as a
    view, a contiguous copy is used (``cslt_note`` says so); what cannot run is None with
    ``cslt_error`` / ``cslt_tuned_error``. ``cold``: every key prefixed ``cold_``, the calls rotating
    over :func:`cold_copies` of the compressed weight (``--l2 cold``)."""
    import torch
    from bench_linear import rotating

    pre = "cold_" if cold else ""
    out: dict = {f"{pre}cslt": None, f"{pre}cslt_tuned": None}
    kw = {"out_dtype": torch.float16} if dtype == "e4m3" else {}
    try:
        comp = torch._cslt_compress(w)
    except Exception as e:  # cuSPARSELt may not take this dtype/shape
        out[f"{pre}cslt_error"] = f"{type(e).__name__}: {str(e)[:80]}"
        return out
    comps = [p for (p,) in cold_copies(comp)] if cold else [comp]
    bt = b.T
    try:
        torch._cslt_sparse_mm(comp, bt, **kw)
    except Exception as e:
        bt = b.T.contiguous()
        out[f"{pre}cslt_note"] = f"B^T copied to contiguous (the view was refused: {type(e).__name__})"
    for key, search in ((f"{pre}cslt", False), (f"{pre}cslt_tuned", True)):
        try:
            extra = {}
            if search:
                found = out[f"{pre}cslt_alg"] = alg if alg is not None else cslt_search(comp, bt, **kw)
                extra = {"alg_id": found}
            calls = [lambda p=p, extra=extra: torch._cslt_sparse_mm(p, bt, **extra, **kw) for p in comps]
            out[key] = profile_kernel_time(rotating(calls), max(iters, len(calls)))
        except Exception as e:
            out[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:80]}"
    return out


def run_isolated(dtype: str, m: int, n: int, k: int, iters: int, timeout: float, schedule: str = "default",
                 pp_configs: tuple[tuple[int, int, int, int], ...] = (), l2: str = "warm") -> dict:
    """One case in a child process (kernels come from the compile cache on disk after the first)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--iters", str(iters),
           "--case", f"{dtype}:{m}x{n}x{k}", "--schedule", schedule, "--l2", l2]
    for cfg in pp_configs:
        cmd += ["--pingpong-config", "x".join(map(str, cfg))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(lines[-1])


HEADER = (f"{'dtype':>5} {'M':>6} {'N':>6} {'K':>6} {'sk':>2} | {'sparsile':>9} {'TF':>5} | "
          f"{'persist.':>9} {'TF':>5} | {'pair':>9} {'TF':>5} | {'cuSPARSELt':>9} {'TF':>5} | "
          f"{'tuned':>9} {'TF':>5} | {'cuBLAS':>9} {'TF':>5} | {'sp.dense':>9} {'TF':>5} | {'table':>9} {'TF':>5} | "
          f"{'decode':>9} {'TF':>5} | {'tail':>9} {'TF':>5} | {'stream-K':>9} {'TF':>5} | "
          f"{'vs cslt':>7} {'vs cuBLAS':>9} {'dense/cuBLAS':>12} {'err':>7}")
HOST_HEADER = (f"{'dtype':>5} {'M':>6} {'N':>6} {'K':>6} | {'kernel':>8} {'ours':>8} | {'cuBLAS':>8} "
               f"{'cuSPARSELt':>10} | {'vs cuBLAS':>9} {'vs cslt':>7}")
PP_HEADER = (f"{'dtype':>5} {'M':>6} {'N':>6} {'K':>6} | {'ours':>9} {'TF':>5} | {'pingpong':>9} {'TF':>5} | "
             f"{'best cslt':>9} {'TF':>5} | {'pp/ours':>7} {'pp/cslt':>7} {'pp err':>7} | configs (µs)")


def format_row(r: dict) -> str:
    f = 2.0 * r["m"] * r["n"] * r["k"]
    dv = f"{r['cublas'] / r['sp_dense']:>12.2f}" if r.get("sp_dense") and r.get("cublas") else f"{'-':>12}"
    err = max(r["err"], r.get("persistent_err", 0.0), r.get("pair_err", 0.0), r.get("table_err", 0.0),
              r.get("decode_err", 0.0), r.get("tail_err", 0.0), r.get("streamk_err", 0.0))
    return (f"{r['dtype']:>5} {r['m']:>6} {r['n']:>6} {r['k']:>6} {r.get('split', 1):>2} | {fmt(r['sparsile'], f)} | "
            f"{fmt(r.get('persistent'), f)} | {fmt(r.get('pair'), f)} | {fmt(r.get('cslt'), f)} | "
            f"{fmt(r.get('cslt_tuned'), f)} | {fmt(r.get('cublas'), f)} | {fmt(r.get('sp_dense'), f)} | "
            f"{fmt(r.get('table'), f)} | {fmt(r.get('decode'), f)} | {fmt(r.get('tail'), f)} | "
            f"{fmt(r.get('streamk'), f)} | "
            f"{ratio_cells(speedups(r))} {dv} {err:>7.1e}")


def format_host_row(r: dict) -> str:
    """The host-inclusive table's line of a row: sparse_matmul's kernel time, then µs per call of it,
    cuBLAS and cuSPARSELt as torch users call them, and the ratios ('-': not measured)."""
    def cell(v: float | None, width: int) -> str:
        return f"{v:>{width}.1f}" if v else f"{'-':>{width}}"

    ours_t, cublas, cslt = r.get("host_ours"), r.get("host_cublas"), r.get("host_cslt")
    vs_cublas = f"{cublas / ours_t:>9.2f}" if ours_t and cublas else f"{'-':>9}"
    vs_cslt = f"{cslt / ours_t:>7.2f}" if ours_t and cslt else f"{'-':>7}"
    return (f"{r['dtype']:>5} {r['m']:>6} {r['n']:>6} {r['k']:>6} | {cell(ours(r), 8)} {cell(ours_t, 8)} | "
            f"{cell(cublas, 8)} {cell(cslt, 10)} | {vs_cublas} {vs_cslt}")


def format_pingpong_row(r: dict) -> str:
    """The ping-pong table's line of a row (``--schedule pingpong``): sparse_matmul's choice, the
    fastest ping-pong configuration, the faster cuSPARSELt, their ratios, every configuration's time."""
    f = 2.0 * r["m"] * r["n"] * r["k"]
    pp, best = r.get("pingpong"), best_cslt(r)
    pp_ours = f"{ours(r) / pp:>7.2f}" if pp else f"{'-':>7}"
    pp_cslt = f"{best / pp:>7.2f}" if pp and best else f"{'-':>7}"
    err = f"{r['pingpong_err']:>7.1e}" if pp else f"{'-':>7}"
    configs = " ".join(f"{name} {t:.1f}" for name, (t, _) in r.get("pingpong_configs", {}).items()) or "-"
    return (f"{r['dtype']:>5} {r['m']:>6} {r['n']:>6} {r['k']:>6} | {fmt(ours(r), f)} | {fmt(pp, f)} | "
            f"{fmt(best, f)} | {pp_ours} {pp_cslt} {err} | {configs}")


def fmt(t: float | None, flops: float) -> str:
    if t is None:
        return f"{'-':>9} {'-':>5}"
    return f"{t:>9.1f} {flops / t / 1e6:>5.0f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=positive, default=20)
    ap.add_argument("--case", action="append", default=[], type=case_spec,
                    help="only this case, e.g. f16:8192x8192x8192 (repeatable; overrides --grid and --quick)")
    ap.add_argument("--grid", choices=sorted(GRIDS),
                    help="llama3: the Llama-3 8B and 70B projections x T in --tokens x --dtypes")
    ap.add_argument("--shapes", nargs="+", type=shape_name, metavar="NAME",
                    help="with --grid: only these shapes (8B-qkv), models (70B) or layers (down)")
    ap.add_argument("--tokens", nargs="+", type=positive, metavar="T",
                    help=f"with --grid: the token counts N (default {' '.join(map(str, LLAMA3_TOKENS))})")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["bf16", "f16"], help="with --grid")
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the rows (and the machine) to FILE")
    ap.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                    help="measure each case in a fresh process (default; a long in-process run once stalled "
                         "for minutes inside one case that takes seconds on its own)")
    ap.add_argument("--case-timeout", type=float, default=180.0, help="seconds allowed per isolated case")
    ap.add_argument("--schedule", choices=("default", "pingpong"), default="default",
                    help="pingpong: also time the ping-pong kernel (f16/bf16 cases without split-K)")
    ap.add_argument("--pingpong-config", action="append", default=[], type=pingpong_config, metavar="BMxBNxBKxST",
                    help="with --schedule pingpong: also this configuration (repeatable), e.g. 64x256x64x5")
    ap.add_argument("--l2", choices=("warm", "cold"), default="warm",
                    help="cold: also time sparse_matmul, cuBLAS and cuSPARSELt rotating over copies of the weight "
                         "of at least 3 x L2, each call reading it from HBM as in a model (a second table)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the --isolate child
    args = ap.parse_args(argv)
    if (args.shapes or args.tokens) and not args.grid:
        ap.error("--shapes and --tokens select within a grid: add --grid llama3")
    if args.pingpong_config and args.schedule != "pingpong":
        ap.error("--pingpong-config configures the ping-pong kernel: add --schedule pingpong")
    args.pingpong_config = tuple(args.pingpong_config)
    args.tokens = tuple(args.tokens or LLAMA3_TOKENS)
    return args


def select_cases(args: argparse.Namespace) -> list[Case]:
    """The cases the options ask for: --case, else --grid, else --quick, else the full table."""
    if args.case:
        return list(args.case)
    if args.grid:
        return grid_cases(args.grid, args.shapes, args.tokens, args.dtypes)
    if args.quick:
        return [Case("f16", 4096, 4096, 4096), Case("f16", 8192, 8192, 8192)]
    cases = [Case(dt, *s) for dt in ("f16", "bf16") for s in SQUARES]
    cases.append(Case("e4m3", 8192, 8192, 8192))
    for (out, inp), tokens in LLM:
        for t in tokens:
            cases += [Case("f16", out, t, inp), Case("bf16", out, t, inp)]
    return cases


def print_table(header: str, lines: list[str], notes: list[str]) -> None:
    """A second table after the main one: a blank line, its header, its lines, its notes."""
    print()
    print(header)
    for line in lines + notes:
        print(line)


def write_json(path: Path, rows: list[dict], failed: list[dict], argv: list[str]) -> None:
    """``{"environment", "command", "rows", "failed"}`` to ``path`` (plot_gemm.py reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"environment": environment(), "command": " ".join(["benchmarks/bench_sparse_gemm.py", *argv]),
              "rows": rows, "failed": failed}
    path.write_text(json.dumps(report, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    import sparsile as sp

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    sp_mod = sp.load(ROOT / "stdlib" / "kernels" / "sparse_gemm_sm90.spk")
    dense_mod = sp.load(ROOT / "stdlib" / "kernels" / "dense_gemm_sm90.spk")
    cases = select_cases(args)
    if args.child:  # one case, measured in this process, as one JSON line (the --isolate child)
        for c in cases:
            print(json.dumps(bench_case(sp_mod, dense_mod, c.dtype, c.m, c.n, c.k, args.iters, args.schedule,
                                        args.pingpong_config, args.l2)), flush=True)
        return
    rows, failed = [], []
    print(HEADER, flush=True)
    for c in cases:
        started = time.perf_counter()
        if args.isolate:
            r = run_isolated(c.dtype, c.m, c.n, c.k, args.iters, args.case_timeout, args.schedule,
                             args.pingpong_config, args.l2)
        else:
            r = bench_case(sp_mod, dense_mod, c.dtype, c.m, c.n, c.k, args.iters, args.schedule,
                           args.pingpong_config, args.l2)
        if "error" in r:
            print(f"{c.dtype:>5} {c.m:>6} {c.n:>6} {c.k:>6}: {r['error']} ({time.perf_counter() - started:.0f} s)",
                  flush=True)
            failed.append({**asdict(c), "error": r["error"]})
            continue
        if c.shape:
            r["shape"] = c.shape
        rows.append(r)
        print(format_row(r), flush=True)  # as it comes, so a run stopped early still shows its rows
        if args.json:  # rewritten after every case, so a run stopped early keeps its rows
            write_json(args.json, rows, failed, argv)
    print()
    print(HEADER)
    for r in rows:
        print(format_row(r))
    print("times: us per call, CUDA profiler kernel time; TF: effective TFLOP/s = 2MNK/t (sparse and dense alike);")
    print("sk = split-K shares (sparse_matmul's choice: choose_split_k; the time includes splitk_reduce);")
    print("persist. = the one-CTA kernel on one CTA per SM (each computing several tiles; '-' when there are no")
    print("more tiles than SMs); pair = the CTA-pair kernel (B multicast, persistent), which sparse_matmul runs for")
    print("large C ('-' where it does not); table = the shipped tuned table's choice")
    print("(stdlib/kernels/tuned/<gpu>.json), which sparse_matmul runs where the table lists the shape ('-': no")
    print("entry; SPARSILE_TUNED_TABLE=0 ignores it); decode = the decode kernel, which sparse_matmul runs at")
    print("N <= 64 ('-': N > 64); tail = the fastest tail split of sparse_matmul's config (whole waves unsplit,")
    print("the last wave's rows split along K: gemm_tail.py; '-' where C's last wave is full or the config splits")
    print("K; not what sparse_matmul runs unless the table names it; its time adds its three kernels, not the gaps")
    print("between them, as sk's time adds splitk_reduce's); stream-K = the fastest stream-K launch at that config's")
    print("BN or half of it, STAGES 4 and 5 (gemm_streamk.py: every SM an even share of the (tile, K step) work;")
    print("'-' where the last wave is full; run only where the table names it); cuSPARSELt = torch._cslt_sparse_mm")
    print("with its default algorithm, tuned = with the algorithm torch._cslt_sparse_mm_search picks; vs cslt =")
    print("the faster of the two / the time of sparse_matmul's choice (decode, else table, else pair where shown,")
    print("else one CTA per tile); vs cuBLAS likewise; e4m3 cuBLAS column is torch._scaled_mm; err = max |C - ref|")
    print("/ max |ref| over the sparsile runs (ref: the same inputs multiplied in float64 on the GPU)")
    if any("host_ours" in r for r in rows):
        print_table(HOST_HEADER, [format_host_row(r) for r in rows], [
            "host-inclusive µs per call, as torch users call each (back to back, a synchronize after each block of",
            "calls, the median block): ours = sparse_matmul into C (its call cache warm), cuBLAS = torch.mm",
            "(e4m3: torch._scaled_mm), cuSPARSELt = torch._cslt_sparse_mm with the searched algorithm; kernel =",
            "the kernel time of sparse_matmul's choice from the table above; vs = their time / ours"])
    if args.schedule == "pingpong":
        note = "; " + rows[0]["pingpong_note"] if rows and "pingpong_note" in rows[0] else ""
        print_table(PP_HEADER, [format_pingpong_row(r) for r in rows], [
            "ours = sparse_matmul's choice (as above); pingpong = the fastest ping-pong configuration (BMxBNxBKx",
            "STAGES, all listed in µs); pp/ours and pp/cslt: speed-ups of the ping-pong kernel ('-': not run, for",
            "e4m3 and split-K cases); pp err = its max |C - ref| / max |ref|" + note])
    if args.l2 == "cold":
        print_table(COLD_HEADER, [format_cold_row(r) for r in rows], [
            "L2-cold: every contender rotates over copies of its weight of at least 3 x L2 (50 MB), so each call",
            "reads it from HBM, as a model's layers do; ours = sparse_matmul as called (its kernel and table choice:",
            "the decode kernel at N <= 64); kernel µs from the CUDA profiler; err of one poisoned call"])
    if args.json:
        write_json(args.json, rows, failed, argv)
        print(f"rows written to {args.json}")


if __name__ == "__main__":
    main()
