"""Core tile ops compiled by the backend and run on the GPU, checked against numpy (float64 where
it matters) on random inputs with ragged sizes; outputs are poisoned before every run."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp

pytestmark = pytest.mark.gpu

SRC = '''
@kernel
def add(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)

@kernel
def add_typed(x, y, out, n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    a = load(x + offs, mask=mask)
    b = load(y + offs, mask=mask)
    store(out + offs, a * 2 + b, mask=mask)

@kernel
def softmax(x: ptr[f32], out: ptr[f32], n_cols: i32, stride: i32, BLOCK: constexpr):
    row = program_id(0)
    cols = arange(0, BLOCK)
    mask = cols < n_cols
    v = load(x + row * stride + cols, mask=mask, other=-1e30)
    v = v - max(v, axis=0)
    e = exp(v)
    store(out + row * stride + cols, e / sum(e, axis=0), mask=mask)

@kernel
def rowcol(x: ptr[f32], rows: ptr[f32], cols: ptr[f32], M: i32, N: i32, BM: constexpr, BN: constexpr):
    r = arange(0, BM)
    c = arange(0, BN)
    mask = (r[:, None] < M) & (c[None, :] < N)
    v = load(x + r[:, None] * N + c[None, :], mask=mask)
    store(rows + r, sum(v, axis=1), mask=r < M)
    store(cols + c, max(v, axis=0), mask=c < N)

@kernel
def transpose(x: ptr[f32], out: ptr[f32], M: i32, N: i32, B: constexpr):
    pm = program_id(0)
    pn = program_id(1)
    r = pm * B + arange(0, B)
    c = pn * B + arange(0, B)
    v = load(x + r[:, None] * N + c[None, :], mask=(r[:, None] < M) & (c[None, :] < N))
    t = trans(v)
    store(out + c[:, None] * M + r[None, :], t, mask=(c[:, None] < N) & (r[None, :] < M))

@kernel
def loop_sum(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr):
    acc = zeros((BLOCK,), f32)
    offs = arange(0, BLOCK)
    for i in range(0, n, BLOCK):
        acc += load(x + i + offs, mask=(i + offs) < n)
    if n > 5:
        acc = acc * 2.0
    else:
        acc = acc + 1.0
    store(out + offs, acc)

@kernel
def matmul(a: ptr[f16], b: ptr[f16], c: ptr[f32], M: i32, N: i32, K: i32,
           BM: constexpr, BN: constexpr, BK: constexpr):
    pm = program_id(0)
    pn = program_id(1)
    rm = pm * BM + arange(0, BM)
    rn = pn * BN + arange(0, BN)
    rk = arange(0, BK)
    acc = zeros((BM, BN), f32)
    for k in range(0, K, BK):
        av = load(a + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        bv = load(b + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = dot(av, bv, acc)
    store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

@kernel
def cast_math(x: ptr[f32], o16: ptr[f16], obf: ptr[bf16], oi: ptr[i32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    v = load(x + offs, mask=m)
    store(o16 + offs, sqrt(abs(v)).to(f16), mask=m)
    store(obf + offs, (v * 3.0).to(bf16), mask=m)
    store(oi + offs, where(v > 0, (v * 100.0).to(i32), offs // 3 - offs % 5), mask=m)
'''


@pytest.fixture(scope="module")
def mod():
    return sp.loads(SRC, "core_gpu.spk")


def poison(shape, dtype):
    a = np.empty(shape, dtype)
    a.view(np.uint8)[...] = 0xFF
    return a


@pytest.mark.parametrize("n", [1, 1000, 4096, 100003])
def test_vector_add(mod, n):
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = poison(n, np.float32)
    mod.add[((n + 1023) // 1024,)](x, y, out, n, BLOCK=1024)
    np.testing.assert_array_equal(out, x + y)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int32, np.int8])
def test_add_dtypes(mod, dtype):
    n = 3001
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(n) * 20).astype(dtype)
    y = (rng.standard_normal(n) * 20).astype(dtype)
    out = poison(n, dtype)
    mod.add_typed[((n + 255) // 256,)](x, y, out, n, BLOCK=256)
    ref = (x.astype(np.float64) * 2 + y.astype(np.float64))
    if np.dtype(dtype).kind == "f" or dtype is ml_dtypes.bfloat16:
        exp = (x * np.array(2, dtype) + y).astype(np.float64)
        np.testing.assert_array_equal(out.astype(np.float64), exp)
    else:
        np.testing.assert_array_equal(out, (x * 2 + y).astype(dtype))
    del ref


@pytest.mark.parametrize("shape", [(7, 100), (64, 1024), (3, 1)])
def test_softmax(mod, shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32) * 4
    out = poison(shape, np.float32)
    mod.softmax[(shape[0],)](x, out, shape[1], shape[1], BLOCK=1024)
    ref = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=1e-7)


def test_row_col_reductions(mod):
    rng = np.random.default_rng(2)
    M, N = 50, 100
    x = rng.standard_normal((M, N)).astype(np.float32)
    rows, cols = poison(M, np.float32), poison(N, np.float32)
    mod.rowcol[(1,)](x, rows, cols, M, N, BM=64, BN=128, num_warps=8)
    np.testing.assert_allclose(rows, x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cols, x.max(0))


@pytest.mark.parametrize("M,N", [(64, 64), (100, 37), (257, 513)])
def test_transpose(mod, M, N):
    x = np.random.default_rng(3).standard_normal((M, N)).astype(np.float32)
    out = poison((N, M), np.float32)
    mod.transpose[((M + 31) // 32, (N + 31) // 32)](x, out, M, N, B=32)
    np.testing.assert_array_equal(out, x.T)


@pytest.mark.parametrize("n", [3, 1000, 4096])
def test_loop_and_branch(mod, n):
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    out = poison(256, np.float32)
    mod.loop_sum[(1,)](x, out, n, BLOCK=256)
    ref = np.zeros(256)
    for i in range(0, n, 256):
        seg = x[i:i + 256].astype(np.float64)
        ref[:len(seg)] += seg
    ref = ref * 2 if n > 5 else ref + 1
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("M,N,K", [(64, 64, 64), (100, 70, 90)])
def test_matmul_portable(mod, M, N, K):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    c = poison((M, N), np.float32)
    mod.matmul[((M + 63) // 64, (N + 63) // 64)](a, b, c, M, N, K, BM=64, BN=64, BK=32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-3)


def test_casts_and_math(mod):
    n = 2049
    x = (np.random.default_rng(6).standard_normal(n) * 10).astype(np.float32)
    o16, obf, oi = poison(n, np.float16), poison(n, ml_dtypes.bfloat16), poison(n, np.int32)
    mod.cast_math[((n + 255) // 256,)](x, o16, obf, oi, n, BLOCK=256)
    np.testing.assert_allclose(o16.astype(np.float64), np.sqrt(np.abs(x)).astype(np.float16), rtol=1e-3)
    np.testing.assert_array_equal(obf, (x * np.float32(3)).astype(ml_dtypes.bfloat16))
    offs = np.arange(n, dtype=np.int64)
    c_div = np.trunc(offs / 3).astype(np.int64)
    ref = np.where(x > 0, np.trunc(x * np.float32(100)).astype(np.int64), c_div - offs % 5).astype(np.int32)
    np.testing.assert_array_equal(oi, ref)


def test_interpreter_agrees(mod):
    n = 5000
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    gpu, cpu = poison(n, np.float32), poison(n, np.float32)
    mod.add[((n + 1023) // 1024,)](x, y, gpu, n, BLOCK=1024)
    mod.add.interpret[((n + 1023) // 1024,)](x, y, cpu, n, BLOCK=1024)
    np.testing.assert_array_equal(gpu, cpu)


def test_torch_and_cupy_arguments(mod):
    torch = pytest.importorskip("torch")
    n = 10000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    mod.add[((n + 1023) // 1024,)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    assert torch.equal(out, x + y)
    cp = pytest.importorskip("cupy")
    xc, yc = cp.asarray(x.cpu().numpy()), cp.asarray(y.cpu().numpy())
    oc = cp.full(n, cp.nan, dtype=cp.float32)
    mod.add[((n + 1023) // 1024,)](xc, yc, oc, n, BLOCK=1024)
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(cp.asnumpy(oc), cp.asnumpy(xc + yc))


def test_non_ascii_kernel_and_parameter_names_launch():
    """`ké` / `é` reach PTX as `k$u00e9` / `p_$u00e9` (backend/codegen.llvm_name) and launch by name."""
    kernel = sp.loads(
        "@kernel\n"
        "def ké(é: ptr[f32], n: i32, BLOCK: constexpr):\n"
        "    offs = program_id(0) * BLOCK + arange(0, BLOCK)\n"
        "    store(é + offs, load(é + offs, mask=offs < n) * 2.0 + 1.0, mask=offs < n)\n").kernels["ké"]
    rng = np.random.default_rng(7)
    x = rng.standard_normal(1000).astype(np.float32)
    expected = x.astype(np.float64) * 2.0 + 1.0
    kernel[(8,)](x, 1000, BLOCK=128)
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-6)
