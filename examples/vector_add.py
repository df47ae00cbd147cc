"""Vector addition written as a ``@sparsile.jit`` Python function (the same kernel as
``vector_add.spk``).

Run it: ``python examples/vector_add.py [N]``. On a machine with an NVIDIA GPU it launches the kernel
with ``kernel[grid](...)``; elsewhere it runs the same IR in the numpy interpreter
(``kernel.interpret[grid](...)``). Either way it checks the result against numpy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import sparsile as sp

DEFAULT_BLOCK = 1024  # a Python global read by the kernel as a compile-time constant


@sp.jit
def vector_add_kernel(x: sp.ptr[sp.f32], y: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32,
                      BLOCK: sp.constexpr = DEFAULT_BLOCK):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    a = sp.load(x + offs, mask=mask)
    b = sp.load(y + offs, mask=mask)
    sp.store(out + offs, a + b, mask=mask)


def has_gpu() -> bool:
    """Whether a GPU launch is possible here (False when the CUDA backend is not installed)."""
    try:
        from sparsile.backend.runtime import has_gpu as runtime_has_gpu
    except ImportError:
        return False
    return runtime_has_gpu()


def vector_add(x: np.ndarray, y: np.ndarray, block: int = DEFAULT_BLOCK, *, gpu: bool | None = None) -> np.ndarray:
    """x + y computed by the kernel (on the GPU when ``gpu`` is true, by default when one exists)."""
    out = np.empty_like(x)
    n = x.size
    grid = ((n + block - 1) // block,)
    launch = vector_add_kernel if (has_gpu() if gpu is None else gpu) else vector_add_kernel.interpret
    launch[grid](x, y, out, n, BLOCK=block)
    return out


def positive(text: str) -> int:
    """An argparse type: a size of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vector_add.py", description="Add two random float32 vectors of N "
                                     "elements and check the sum against numpy.")
    # the default is not a multiple of the block: the mask matters
    parser.add_argument("n", metavar="N", type=positive, nargs="?", default=98_765, help="default 98765")
    n = parser.parse_args(argv).n
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    gpu = has_gpu()
    out = vector_add(x, y, gpu=gpu)
    ok = np.array_equal(out, x + y)
    print(f"vector_add n={n} on {'the GPU' if gpu else 'the interpreter'}: {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
