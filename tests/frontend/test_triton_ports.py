"""Kernels from Triton's tutorials and common practice, ported as a Triton user writes them: unannotated
parameters, ``constexpr`` block sizes, grid lambdas with ``sp.cdiv``, masks at ragged edges. Each runs
in the interpreter against a float64 numpy reference on random inputs (sizes not multiples of the
blocks, outputs poisoned with NaN), compiles to PTX for sm_90a and sm_100a, and runs on the GPU
under the ``gpu`` marker. Two of them are also written as a .spk file (``triton_ports.spk``)."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib.sparsity import compress, encode_metadata, prune_2_4

RNG = np.random.default_rng(2024)
SPK = sp.load(pathlib.Path(__file__).with_name("triton_ports.spk"))
P = sp.ptr
f16, f32, i32, u32 = sp.f16, sp.f32, sp.i32, sp.u32


def rand(shape: Any, dtype: Any = np.float32, scale: float = 1.0) -> np.ndarray:
    x = RNG.standard_normal(shape) * scale
    x[x == 0] = 0.5
    return x.astype(dtype)


def nan_like(x: np.ndarray, shape: Any = None) -> np.ndarray:
    return np.full(x.shape if shape is None else shape, np.nan, x.dtype)


# ------------------------------------------------------------------ 1. vector add (tutorial 01)
@sp.jit
def add_kernel(x_ptr, y_ptr, output_ptr, n_elements, BLOCK_SIZE: sp.constexpr):
    pid = sp.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + sp.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = sp.load(x_ptr + offsets, mask=mask)
    y = sp.load(y_ptr + offsets, mask=mask)
    sp.store(output_ptr + offsets, x + y, mask=mask)


def case_vector_add(launch: Callable[[Any], Any]) -> None:
    n = 5003
    x, y = rand(n), rand(n)
    out = nan_like(x)
    launch(add_kernel)[lambda meta: (sp.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n, BLOCK_SIZE=1024)
    assert np.array_equal(out, (x.astype(np.float64) + y).astype(np.float32))  # one rounding: exact


# ------------------------------------------------------------------ 2. fused softmax (tutorial 02)
@sp.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                   BLOCK_SIZE: sp.constexpr, num_stages: sp.constexpr):
    row_start = sp.program_id(0)
    row_step = sp.num_programs(0)
    for row_idx in sp.range(row_start, n_rows, row_step, num_stages=num_stages):
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = sp.arange(0, BLOCK_SIZE)
        input_ptrs = row_start_ptr + col_offsets
        mask = col_offsets < n_cols
        row = sp.load(input_ptrs, mask=mask, other=-float("inf"))
        row_minus_max = row - sp.max(row, axis=0)
        numerator = sp.exp(row_minus_max)
        denominator = sp.sum(numerator, axis=0)
        softmax_output = numerator / denominator
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        sp.store(output_row_start_ptr + col_offsets, softmax_output, mask=mask)


def case_softmax(launch: Callable[[Any], Any]) -> None:
    rows, cols = 37, 181
    x = rand((rows, cols), scale=3.0)
    y = nan_like(x)
    launch(softmax_kernel)[(8,)](y, x, x.strides[0] // 4, y.strides[0] // 4, rows, cols, BLOCK_SIZE=256,
                                 num_stages=2)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)
    # exp to a few ulp (docs/language.md rule 10), a sum of 181 terms, one division
    assert np.all(np.abs(y - ref) <= 2e-6 * ref + 1e-9)


# ------------------------------------------------------------------ 3. matmul (tutorial 03)
@sp.jit
def leaky_relu(x):
    return sp.where(x >= 0, x, 0.01 * x)


@sp.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_SIZE_M: sp.constexpr, BLOCK_SIZE_N: sp.constexpr, BLOCK_SIZE_K: sp.constexpr,
                  GROUP_SIZE_M: sp.constexpr, ACTIVATION: sp.constexpr):
    pid = sp.program_id(axis=0)
    num_pid_m = sp.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = sp.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_SIZE_M + sp.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + sp.arange(0, BLOCK_SIZE_N)) % N
    offs_k = sp.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = sp.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=sp.float32)
    for k in range(0, sp.cdiv(K, BLOCK_SIZE_K)):
        a = sp.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = sp.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = sp.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    if ACTIVATION == "leaky_relu":
        accumulator = leaky_relu(accumulator)
    c = accumulator.to(sp.float16)
    offs_cm = pid_m * BLOCK_SIZE_M + sp.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + sp.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    sp.store(c_ptrs, c, mask=c_mask)


def case_matmul(launch: Callable[[Any], Any]) -> None:
    M, N, K = 100, 70, 90
    a, b = rand((M, K), np.float16), rand((K, N), np.float16)
    c = nan_like(a, (M, N))
    grid = lambda META: (sp.cdiv(M, META["BLOCK_SIZE_M"]) * sp.cdiv(N, META["BLOCK_SIZE_N"]),)  # noqa: E731
    launch(matmul_kernel)[grid](a, b, c, M, N, K, *(s // 2 for s in a.strides + b.strides + c.strides),
                                BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=2,
                                ACTIVATION="leaky_relu")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    ref = np.where(ref >= 0, ref, 0.01 * ref)
    bound = 2**-11 * np.abs(ref) + 90 * 2**-23 * (np.abs(a).astype(np.float64) @ np.abs(b)) + 1e-6
    assert np.all(np.abs(c - ref) <= bound)  # f32 accumulation of exact products, one f16 rounding


# ------------------------------------------------------------------ 4. layer norm forward (tutorial 05)
@sp.jit
def _layer_norm_fwd_fused(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_SIZE: sp.constexpr):
    row = sp.program_id(0)
    Y += row * stride
    X += row * stride
    mean = 0
    _mean = sp.zeros([BLOCK_SIZE], dtype=sp.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + sp.arange(0, BLOCK_SIZE)
        a = sp.load(X + cols, mask=cols < N, other=0.).to(sp.float32)
        _mean += a
    mean = sp.sum(_mean, axis=0) / N
    _var = sp.zeros([BLOCK_SIZE], dtype=sp.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + sp.arange(0, BLOCK_SIZE)
        x = sp.load(X + cols, mask=cols < N, other=0.).to(sp.float32)
        x = sp.where(cols < N, x - mean, 0.)
        _var += x * x
    var = sp.sum(_var, axis=0) / N
    rstd = 1 / sp.sqrt(var + eps)
    sp.store(Mean + row, mean)
    sp.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + sp.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = sp.load(W + cols, mask=mask)
        b = sp.load(B + cols, mask=mask)
        x = sp.load(X + cols, mask=mask, other=0.).to(sp.float32)
        x_hat = (x - mean) * rstd
        y = x_hat * w + b
        sp.store(Y + cols, y, mask=mask)


def check_layer_norm(launch: Callable[[Any], Any], kernel: Any) -> None:
    rows, N = 13, 300
    x = (rand((rows, N)) * 2 + 0.5).astype(np.float16)
    w, b = rand(N, np.float16), rand(N, np.float16)
    y = nan_like(x)
    mean, rstd = np.full(rows, np.nan, np.float32), np.full(rows, np.nan, np.float32)
    launch(kernel)[(rows,)](x, y, w, b, mean, rstd, x.strides[0] // 2, N, 1e-5, BLOCK_SIZE=128)
    x64 = x.astype(np.float64)
    mu, rs = x64.mean(1), 1 / np.sqrt(x64.var(1) + 1e-5)
    ref = (x64 - mu[:, None]) * rs[:, None] * w.astype(np.float64) + b.astype(np.float64)
    assert np.all(np.abs(mean - mu) <= 1e-5 * np.abs(x64).mean(1)) and np.all(np.abs(rstd / rs - 1) <= 1e-5)
    assert np.all(np.abs(y - ref) <= 2**-11 * np.abs(ref) + 1e-4 * (np.abs(ref) + np.abs(w) + np.abs(b)))


def case_layer_norm(launch: Callable[[Any], Any]) -> None:
    check_layer_norm(launch, _layer_norm_fwd_fused)


def case_layer_norm_spk(launch: Callable[[Any], Any]) -> None:
    check_layer_norm(launch, SPK.layer_norm_fwd)


# ------------------------------------------------------------------ 5. row max / row sum with a column loop
@sp.jit
def row_stats_kernel(x_ptr, max_ptr, sum_ptr, n_rows, n_cols, stride, BLOCK_M: sp.constexpr, BLOCK_N: sp.constexpr):
    rows = sp.program_id(0) * BLOCK_M + sp.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    m = sp.full((BLOCK_M,), float("-inf"), sp.float32)
    s = sp.zeros((BLOCK_M,), sp.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + sp.arange(0, BLOCK_N)
        mask = row_mask[:, None] & (cols[None, :] < n_cols)
        x = sp.load(x_ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=float("-inf"))
        m = sp.maximum(m, sp.max(x, axis=1))
        s += sp.sum(sp.where(mask, x, 0.0), axis=1, keep_dims=True).reshape((BLOCK_M,))
    sp.store(max_ptr + rows, m, mask=row_mask)
    sp.store(sum_ptr + rows, s, mask=row_mask)


def case_row_stats(launch: Callable[[Any], Any]) -> None:
    rows, cols = 45, 333
    x = rand((rows, cols))
    mx, sm = np.full(rows, np.nan, np.float32), np.full(rows, np.nan, np.float32)
    launch(row_stats_kernel)[(sp.cdiv(rows, 16),)](x, mx, sm, rows, cols, cols, BLOCK_M=16, BLOCK_N=64)
    assert np.array_equal(mx, x.max(1))
    assert np.all(np.abs(sm - x.astype(np.float64).sum(1)) <= cols * 2**-24 * np.abs(x).sum(1))


# ------------------------------------------------------------------ 6. where: clamp, NaN to zero, indices
@sp.jit
def where_kernel(x_ptr, out_ptr, idx_ptr, n, lo, hi, BLOCK: sp.constexpr):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    x = sp.load(x_ptr + offs, mask=mask)
    y = sp.where(x < lo, lo, sp.where(x > hi, hi, x))
    y = sp.where(x != x, 0.0, y)
    sp.store(out_ptr + offs, y, mask=mask)
    sp.store(idx_ptr + offs, sp.where(x > 0, offs, -1), mask=mask)


def case_where(launch: Callable[[Any], Any]) -> None:
    n = 777
    x = rand(n)
    x[5] = np.nan
    out, idx = nan_like(x), np.full(n, -7, np.int32)
    launch(where_kernel)[(sp.cdiv(n, 128),)](x, out, idx, n, -0.5, 0.75, BLOCK=128)
    x64 = x.astype(np.float64)
    assert np.array_equal(out, np.where(np.isnan(x64), 0.0, np.clip(x64, -0.5, 0.75)).astype(np.float32))
    assert np.array_equal(idx, np.where(x > 0, np.arange(n), -1))


# ------------------------------------------------------------ 7. constexpr blocks, a 2-D grid tuple, optional bias
@sp.jit
def scale2d_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_om, alpha, bias_ptr, BLOCK_M: sp.constexpr,
                   BLOCK_N: sp.constexpr):
    pid_m = sp.program_id(0)
    pid_n = sp.program_id(1)
    rm = pid_m * BLOCK_M + sp.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + sp.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    y = sp.load(x_ptr + rm[:, None] * stride_xm + rn[None, :], mask=mask) * alpha
    if bias_ptr is not None:
        y += sp.load(bias_ptr + rn, mask=rn < N)[None, :]
    sp.store(out_ptr + rm[:, None] * stride_om + rn[None, :], y, mask=mask)


def case_scale2d(launch: Callable[[Any], Any]) -> None:
    M, N = 50, 90
    x, bias = rand((M, N)), rand(N)
    x64 = x.astype(np.float64)
    out = nan_like(x)
    grid = lambda META: (sp.cdiv(M, META["BLOCK_M"]), sp.cdiv(N, META["BLOCK_N"]))  # noqa: E731
    launch(scale2d_kernel)[grid](x, out, M, N, N, N, 1.5, bias, BLOCK_M=16, BLOCK_N=32)
    ref = x64 * 1.5 + bias
    assert np.all(np.abs(out - ref) <= 2**-23 * (np.abs(x64 * 1.5) + np.abs(ref)))
    out = nan_like(x)
    launch(scale2d_kernel)[(sp.cdiv(M, 16), sp.cdiv(N, 32))](x, out, M, N, N, N, 1.5, None, BLOCK_M=16, BLOCK_N=32)
    assert np.array_equal(out, (x64 * 1.5).astype(np.float32))


# ------------------------------------------------------------------ 8. silu / gelu (tanh form, exact), f16 in and out
@sp.jit
def act_kernel(x_ptr, out_ptr, n, ACT: sp.constexpr, BLOCK: sp.constexpr):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    x = sp.load(x_ptr + offs, mask=mask).to(sp.float32)
    if ACT == "silu":
        y = x * sp.sigmoid(x)
    elif ACT == "gelu":  # tanh approximation, through tanh(u) = 2 sigmoid(2u) - 1
        y = 0.5 * x * (1.0 + (2.0 * sp.sigmoid(2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x)) - 1.0))
    elif ACT == "gelu_tanh":  # the same, as Triton's fused epilogues write it
        y = 0.5 * x * (1.0 + sp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    else:  # exact (erf) GELU
        y = 0.5 * x * (1.0 + sp.erf(x * 0.7071067811865476))
    sp.store(out_ptr + offs, y.to(sp.float16), mask=mask)


def case_activation(launch: Callable[[Any], Any]) -> None:
    n = 1000
    x = rand(n, np.float16, scale=3.0)
    x64 = x.astype(np.float64)
    refs = {"silu": x64 / (1 + np.exp(-x64)),
            "gelu": 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3))),
            "gelu_erf": 0.5 * x64 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x64.tolist()]))}
    refs["gelu_tanh"] = refs["gelu"]
    for act, ref in refs.items():
        out = nan_like(x)
        launch(act_kernel)[(sp.cdiv(n, 256),)](x, out, n, ACT=act, BLOCK=256)
        # one f16 rounding (2**-11) over an f32 evaluation; gelu's 1 + (2 s - 1) cancels near 0, and
        # 1 + tanh, 1 + erf (within 3 ulp of f32, docs/language.md rule 10) for x < 0
        assert np.all(np.abs(out - ref) <= 2**-11 * np.abs(ref) + 2**-20 * np.abs(x64) + 2**-24), act


# ------------------------------------------------------------------ 9. 2:4 sparse matmul through pointers
@sp.jit
def sparse_matmul_kernel(a_ptr, e_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: sp.constexpr, BLOCK_N: sp.constexpr,
                         BLOCK_K: sp.constexpr):
    rm = sp.program_id(0) * BLOCK_M + sp.arange(0, BLOCK_M)
    rn = sp.program_id(1) * BLOCK_N + sp.arange(0, BLOCK_N)
    meta_rows = sp.cdiv(M, 16) * 16  # the "sm90" words of the last 16-row group are all needed
    acc = sp.zeros((BLOCK_M, BLOCK_N), dtype=sp.float32)
    for k in range(0, K, BLOCK_K):
        ka = k // 2 + sp.arange(0, BLOCK_K // 2)
        ke = k // 32 + sp.arange(0, BLOCK_K // 32)
        kb = k + sp.arange(0, BLOCK_K)
        a = sp.load(a_ptr + rm[:, None] * (K // 2) + ka[None, :], mask=rm[:, None] < M, other=0.0)
        e = sp.load(e_ptr + rm[:, None] * (K // 32) + ke[None, :], mask=rm[:, None] < meta_rows, other=0x44444444)
        b = sp.load(b_ptr + kb[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        acc = sp.sparse_dot(a, e, b, acc)
    sp.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(sp.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def check_sparse(launch: Callable[[Any], Any], kernel: Any) -> None:
    M, N, K = 40, 50, 128  # M not a multiple of 16: the metadata has 48 rows
    w = prune_2_4(rand((M, K), np.float16))
    values, indices = compress(w)
    meta = np.asarray(encode_metadata(indices, "sm90", "f16"))
    assert meta.shape == (48, K // 32)
    b = rand((K, N), np.float16)
    c = nan_like(b, (M, N))
    launch(kernel)[(sp.cdiv(M, 32), sp.cdiv(N, 32))](values, meta, b, c, M, N, K, BLOCK_M=32, BLOCK_N=32, BLOCK_K=64)
    ref = w.astype(np.float64) @ b.astype(np.float64)
    bound = 2**-11 * np.abs(ref) + K * 2**-23 * (np.abs(w).astype(np.float64) @ np.abs(b)) + 1e-6
    assert np.all(np.abs(c - ref) <= bound)


def case_sparse_matmul(launch: Callable[[Any], Any]) -> None:
    check_sparse(launch, sparse_matmul_kernel)


def case_sparse_matmul_spk(launch: Callable[[Any], Any]) -> None:
    check_sparse(launch, SPK.sparse_matmul)


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_interpreter_matches_float64(name: str) -> None:
    CASES[name](lambda kernel: kernel.interpret)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_float64(name: str) -> None:
    CASES[name](lambda kernel: kernel)


# ------------------------------------------------------------------ ahead of time: PTX for Hopper and Blackwell
SIGNATURES: dict[str, tuple[Any, dict[str, Any]]] = {
    "vector_add": (add_kernel, dict(x_ptr=P[f32], y_ptr=P[f32], output_ptr=P[f32], n_elements=i32, BLOCK_SIZE=1024)),
    "softmax": (softmax_kernel, dict(output_ptr=P[f32], input_ptr=P[f32], input_row_stride=i32,
                                     output_row_stride=i32, n_rows=i32, n_cols=i32, BLOCK_SIZE=256, num_stages=2)),
    "matmul": (matmul_kernel, dict(a_ptr=P[f16], b_ptr=P[f16], c_ptr=P[f16], M=i32, N=i32, K=i32, stride_am=i32,
                                   stride_ak=i32, stride_bk=i32, stride_bn=i32, stride_cm=i32, stride_cn=i32,
                                   BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8,
                                   ACTIVATION="leaky_relu")),
    "layer_norm": (_layer_norm_fwd_fused, dict(X=P[f16], Y=P[f16], W=P[f16], B=P[f16], Mean=P[f32], Rstd=P[f32],
                                               stride=i32, N=i32, eps=f32, BLOCK_SIZE=1024)),
    "layer_norm_spk": (SPK.layer_norm_fwd, {}),
    "row_stats": (row_stats_kernel, dict(x_ptr=P[f32], max_ptr=P[f32], sum_ptr=P[f32], n_rows=i32, n_cols=i32,
                                         stride=i32, BLOCK_M=16, BLOCK_N=64)),
    "where": (where_kernel, dict(x_ptr=P[f32], out_ptr=P[f32], idx_ptr=P[i32], n=i32, lo=f32, hi=f32, BLOCK=128)),
    "scale2d": (scale2d_kernel, dict(x_ptr=P[f32], out_ptr=P[f32], M=i32, N=i32, stride_xm=i32, stride_om=i32,
                                     alpha=f32, bias_ptr=None, BLOCK_M=16, BLOCK_N=32)),
    "activation": (act_kernel, dict(x_ptr=P[f16], out_ptr=P[f16], n=i32, ACT="gelu", BLOCK=256)),
    "sparse_matmul": (sparse_matmul_kernel, dict(a_ptr=P[f16], e_ptr=P[u32], b_ptr=P[f16], c_ptr=P[f16], M=i32,
                                                 N=i32, K=i32, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)),
    "sparse_matmul_spk": (SPK.sparse_matmul, {}),
}


def test_every_case_is_compiled() -> None:
    assert set(SIGNATURES) == set(CASES)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_compiles_to_ptx(name: str, target: str) -> None:
    kernel, signature = SIGNATURES[name]
    ptx = kernel.compile(signature, target=target, stop_after="ptx").ptx
    assert f".target {target}" in ptx and ".entry" in ptx
    if name.startswith(("matmul", "sparse")) and target == "sm_90a":  # 64-row tiles of 4 warps: wgmma
        assert ("wgmma.mma_async.sp." if name.startswith("sparse") else "wgmma.mma_async.sync") in ptx
