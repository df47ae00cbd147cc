"""Row-wise softmax written as a ``@sparsile.jit`` Python function (the same kernel as
``softmax.spk``): 2-D tiles, broadcasting with ``[:, None]``, reductions along an axis, an
inlined ``@jit`` helper and a ``static_assert``.

Run it: ``python examples/softmax.py [ROWS COLS]``. Uses the GPU when there is one, the numpy
interpreter otherwise, and checks the result against a float64 reference.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import sparsile as sp


@sp.jit
def row_max(v):
    """A helper: called from a kernel, its body is inlined."""
    return sp.max(v, axis=1)


@sp.jit
def softmax_kernel(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n_rows: sp.i32, n_cols: sp.i32, stride: sp.i32,
                   BLOCK: sp.constexpr, ROWS: sp.constexpr = 4):
    sp.static_assert(BLOCK >= 16, "BLOCK must be at least 16")
    rows = sp.program_id(0) * ROWS + sp.arange(0, ROWS)
    cols = sp.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None] * stride + cols[None, :]
    v = sp.load(x + offsets, mask=mask, other=-float("inf"))
    e = sp.exp(v - row_max(v)[:, None])
    total = sp.sum(e, axis=1)
    sp.store(out + offsets, e / total[:, None], mask=mask)


def has_gpu() -> bool:
    """Whether a GPU launch is possible here (False when the CUDA backend is not installed)."""
    try:
        from sparsile.backend.runtime import has_gpu as runtime_has_gpu
    except ImportError:
        return False
    return runtime_has_gpu()


def softmax(x: np.ndarray, rows_per_program: int = 4, *, gpu: bool | None = None) -> np.ndarray:
    """Softmax of each row of the 2-D float32 array ``x``."""
    n_rows, n_cols = x.shape
    block = max(16, 1 << (n_cols - 1).bit_length())  # the next power of two covering a row
    out = np.empty_like(x)
    grid = ((n_rows + rows_per_program - 1) // rows_per_program,)
    launch = softmax_kernel if (has_gpu() if gpu is None else gpu) else softmax_kernel.interpret
    launch[grid](x, out, n_rows, n_cols, x.strides[0] // x.itemsize, BLOCK=block, ROWS=rows_per_program)
    return out


def reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def positive(text: str) -> int:
    """An argparse type: a size of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="softmax.py", description="Softmax of each row of a random "
                                     "ROWS x COLS float32 matrix, checked against float64 (default 123 x 781).")
    parser.add_argument("rows", metavar="ROWS", type=positive, nargs="?")
    parser.add_argument("cols", metavar="COLS", type=positive, nargs="?")
    args = parser.parse_args(argv)
    if args.rows is not None and args.cols is None:
        parser.error("give both ROWS and COLS, or neither")
    n_rows, n_cols = (args.rows, args.cols) if args.rows is not None else (123, 781)
    x = (np.random.default_rng(1).standard_normal((n_rows, n_cols)) * 3).astype(np.float32)
    gpu = has_gpu()
    out = softmax(x, gpu=gpu)
    err = float(np.abs(out - reference(x)).max())
    ok = err < 1e-6
    print(f"softmax {n_rows}x{n_cols} on {'the GPU' if gpu else 'the interpreter'}: max error {err:.2e} "
          f"{'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
