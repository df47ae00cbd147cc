"""Matrix transpose written as a ``@sparsile.jit`` Python function (the same kernel as
``transpose.spk``): a 2-D grid, 2-D masks and a store through transposed pointers.

Run it: ``python examples/transpose.py [M N]``. Uses the GPU when there is one, the numpy
interpreter otherwise, and checks the result against ``x.T``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import sparsile as sp


@sp.jit
def transpose_kernel(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], m: sp.i32, n: sp.i32, stride_x: sp.i32,
                     stride_out: sp.i32, BM: sp.constexpr = 32, BN: sp.constexpr = 32):
    rows = sp.program_id(0) * BM + sp.arange(0, BM)
    cols = sp.program_id(1) * BN + sp.arange(0, BN)
    mask = (rows[:, None] < m) & (cols[None, :] < n)
    tile = sp.load(x + rows[:, None] * stride_x + cols[None, :], mask=mask)
    sp.store(out + cols[None, :] * stride_out + rows[:, None], tile, mask=mask)


def has_gpu() -> bool:
    """Whether a GPU launch is possible here (False when the CUDA backend is not installed)."""
    try:
        from sparsile.backend.runtime import has_gpu as runtime_has_gpu
    except ImportError:
        return False
    return runtime_has_gpu()


def transpose(x: np.ndarray, bm: int = 32, bn: int = 32, *, gpu: bool | None = None) -> np.ndarray:
    """The transpose of the 2-D float32 array ``x``."""
    m, n = x.shape
    out = np.empty((n, m), dtype=x.dtype)
    grid = ((m + bm - 1) // bm, (n + bn - 1) // bn)
    launch = transpose_kernel if (has_gpu() if gpu is None else gpu) else transpose_kernel.interpret
    launch[grid](x, out, m, n, x.strides[0] // x.itemsize, out.strides[0] // out.itemsize, BM=bm, BN=bn)
    return out


def positive(text: str) -> int:
    """An argparse type: a size of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="transpose.py", description="Transpose a random M x N float32 "
                                     "matrix and check it against x.T (default 200 x 77).")
    parser.add_argument("m", metavar="M", type=positive, nargs="?")
    parser.add_argument("n", metavar="N", type=positive, nargs="?")
    args = parser.parse_args(argv)
    if args.m is not None and args.n is None:
        parser.error("give both M and N, or neither")
    m, n = (args.m, args.n) if args.m is not None else (200, 77)
    x = np.random.default_rng(2).standard_normal((m, n)).astype(np.float32)
    gpu = has_gpu()
    out = transpose(x, gpu=gpu)
    ok = np.array_equal(out, x.T)
    print(f"transpose {m}x{n} on {'the GPU' if gpu else 'the interpreter'}: {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
