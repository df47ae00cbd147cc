"""Kernels that use ``argmax`` / ``argmin`` beyond the one-reduction cases of
tests/support/argmax_cases.py: several reductions (and a ``sum``) in one kernel, each with its own
shared memory; a reduction in a run-time loop (one buffer, reused every iteration); a 3-D tile;
``warp_specialize`` partitions (named barriers, partition-relative warps); explicit blocked layouts
whose reduced axis has bits in registers, lanes and warps interleaved, or broadcast copies.

Each :class:`Pattern` writes its results to one i32 output, compared with the interpreter's by
the warp simulator (tests/backend/test_argmax_sim.py) and on the GPU (tests/gpu/test_argmax_gpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

import sparsile as sp


@dataclass(frozen=True)
class Pattern:
    name: str
    source: str
    shape: tuple[int, ...]  # of the f32 input
    out: int  # elements of the i32 output
    num_warps: int
    consts: dict[str, int] = field(default_factory=dict)

    def kernel(self) -> Any:
        return sp.loads(self.source, f"{self.name}.spk").kernels["k"]

    def inputs(self, seed: int) -> np.ndarray:
        """f32 values from a small pool (ties), with NaNs, both zeros and infinities."""
        pool = np.array([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan], np.float32)
        return np.random.default_rng(seed).choice(pool, size=self.shape).astype(np.float32)

    def reference(self, x: np.ndarray) -> np.ndarray:
        y = np.full(self.out, -7, np.int32)
        self.kernel().interpret[(1,)](x, y, **self.consts)
        return y


_SEVERAL = """@kernel
def k(X: ptr[f32], Y: ptr[i32], R: constexpr, C: constexpr):
    x = load(X + arange(0, R)[:, None] * C + arange(0, C)[None, :])
    a = argmax(x, axis=0)
    s = sum((x > 0.0).to(f32), axis=0)
    b = argmin(x, axis=0)
    c = argmax(x * 2.0, axis=1)
    d = argmin(x, axis=1)
    store(Y + arange(0, C), a)
    store(Y + C + arange(0, C), b)
    store(Y + 2 * C + arange(0, R), c)
    store(Y + 2 * C + R + arange(0, R), d)
    store(Y + 2 * C + 2 * R + arange(0, C), argmax(s[None, :] + x, axis=0))
"""

_LOOP = """@kernel
def k(X: ptr[f32], Y: ptr[i32], R: constexpr, C: constexpr, N: constexpr):
    for i in range(0, N):
        x = load(X + i * R * C + arange(0, R)[:, None] * C + arange(0, C)[None, :])
        store(Y + i * C + arange(0, C), argmax(x, axis=0))
        store(Y + N * C + i * R + arange(0, R), argmin(x, axis=1))
"""

_THREE_D = """@kernel
def k(X: ptr[f32], Y: ptr[i32]):
    x = load(X + arange(0, 4)[:, None, None] * 256 + arange(0, 8)[None, :, None] * 32 + arange(0, 32)[None, None, :])
    store(Y + arange(0, 4)[:, None] * 32 + arange(0, 32)[None, :], argmax(x, axis=1))
    store(Y + 128 + arange(0, 4)[:, None] * 8 + arange(0, 8)[None, :], argmin(x, axis=2))
    store(Y + 160 + arange(0, 8)[:, None] * 32 + arange(0, 32)[None, :], argmax(x, axis=0))
    store(Y + 416, argmin(x))
"""

_PARTITIONS = """
def part(X: ptr[f32], Y: ptr[i32], o: i32):
    x = load(X + arange(0, 64)[:, None] * 32 + arange(0, 32)[None, :])
    store(Y + o + arange(0, 32), argmax(x, axis=0))
    store(Y + o + 32 + arange(0, 64), argmin(x, axis=1))

@kernel(num_warps=8)
def k(X: ptr[f32], Y: ptr[i32]):
    warp_specialize(partition(part, X, Y, 0, warps=4), partition(part, X, Y, 96, warps=4))
"""


def _blocked(layout: str, axis: int | None, kind: str = "argmax") -> str:
    out = {0: "Y + arange(0, C)", 1: "Y + arange(0, R)", None: "Y"}[axis]
    return (f"@kernel\ndef k(X: ptr[f32], Y: ptr[i32], R: constexpr, C: constexpr):\n"
            f"    x = convert_layout(load(X + arange(0, R)[:, None] * C + arange(0, C)[None, :]), {layout})\n"
            f"    store({out}, {kind}(x, axis={axis}))\n")


# (R, C, size_per_thread, threads_per_warp, warps_per_cta, order, num_warps)
_LAYOUTS = [
    (8, 256, (1, 2), (2, 16), (1, 4), (1, 0), 4),  # C: 2 registers, 16 lanes, 4 warps, then registers again
    (64, 8, (2, 1), (8, 4), (4, 2), (0, 1), 8),  # R: registers, lanes, warps, registers
    (4, 16, (1, 1), (2, 16), (8, 1), (1, 0), 8),  # R over 2 lanes but 8 warps: warp copies
    (2, 8, (4, 4), (8, 4), (2, 2), (1, 0), 4),  # more threads than elements: lane and warp copies
    (32, 32, (1, 4), (4, 8), (2, 2), (0, 1), 4),
]

PATTERNS = [
    *(Pattern(f"several-w{nw}", _SEVERAL, (64, 32), 3 * 32 + 2 * 64, nw, {"R": 64, "C": 32}) for nw in (2, 8)),
    Pattern("loop-w4", _LOOP, (3, 64, 32), 3 * (64 + 32), 4, {"R": 64, "C": 32, "N": 3}),
    Pattern("3d-w8", _THREE_D, (4, 8, 32), 417, 8),
    Pattern("partitions", _PARTITIONS, (64, 32), 192, 8),
    *(Pattern(f"blocked{i}-ax{ax}", _blocked(f"layout.blocked(({r}, {c}), {spt}, {tpw}, {wpc}, order={order})", ax,
                                               "argmax" if ax != 1 else "argmin"),
              (r, c), {0: c, 1: r, None: 1}[ax], nw, {"R": r, "C": c})
      for i, (r, c, spt, tpw, wpc, order, nw) in enumerate(_LAYOUTS) for ax in (0, 1, None)),
]
