"""The ``argmax`` / ``argmin`` kernels that the ptxas test (tests/backend/test_argmax_ptx.py) and the
GPU test (tests/gpu/test_argmax_gpu.py) both use, and inputs with ties, NaNs, signed zeros and
extremes.

A case is one kernel: a 1-D or 2-D tile of an element type reduced along an axis (or all axes),
with or without ``keep_dims``, under a number of warps. The tile sizes are chosen so that the
reduced axis lies in registers only, across lanes, or across warps (:func:`where_reduced` reads
it from the typed IR).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

import sparsile as sp


@dataclass(frozen=True)
class Case:
    dtype: str
    shape: tuple[int, ...]  # (C,) or (R, C)
    axis: int | None
    num_warps: int
    kind: str = "argmax"
    keep_dims: bool = False
    broadcast: bool = False  # the 2-D tile is one loaded row broadcast over R rows (repeated elements)

    @property
    def id(self) -> str:
        shape = "x".join(map(str, self.shape))
        extra = ("-keep" if self.keep_dims else "") + ("-bcast" if self.broadcast else "")
        return f"{self.kind}-{self.dtype}-{shape}-ax{self.axis}-w{self.num_warps}{extra}"

    def source(self) -> str:
        keep = ", keep_dims=True" if self.keep_dims else ""
        red = f"{self.kind}(x, axis={self.axis}{keep})"
        if len(self.shape) == 1:
            load = "load(X + arange(0, C))"
            out = "Y" if not self.keep_dims else "Y + arange(0, 1)"
        else:
            if self.broadcast:
                load = "broadcast_to(load(X + arange(0, C))[None, :], (R, C))"
            else:
                load = "load(X + arange(0, R)[:, None] * C + arange(0, C)[None, :])"
            r, c = "arange(0, R)[:, None]", "arange(0, C)[None, :]"
            out = {
                (0, False): "Y + arange(0, C)", (1, False): "Y + arange(0, R)",
                (0, True): f"Y + {c}", (1, True): f"Y + {r}",
                (None, False): "Y", (None, True): "Y + arange(0, 1)[:, None] + arange(0, 1)[None, :]",
            }[(self.axis, self.keep_dims)]
        params = "C: constexpr" if len(self.shape) == 1 else "R: constexpr, C: constexpr"
        if self.dtype == "bool":  # bool tiles come from comparisons: u8 in memory
            load = f"{load} != 0"
        return (f"@kernel\ndef k(X: ptr[{self.memory_dtype}], Y: ptr[i32], {params}):\n"
                f"    x = {load}\n    store({out}, {red})\n")

    @property
    def memory_dtype(self) -> str:
        return "u8" if self.dtype == "bool" else self.dtype

    def consts(self) -> dict[str, int]:
        return {"C": self.shape[-1]} if len(self.shape) == 1 else {"R": self.shape[0], "C": self.shape[1]}

    def kernel(self) -> Any:
        return sp.loads(self.source(), "case.spk").kernels["k"]

    def input_shape(self) -> tuple[int, ...]:
        return (self.shape[-1],) if self.broadcast else self.shape

    def out_numel(self) -> int:
        if self.axis is None or len(self.shape) == 1:
            return 1
        return self.shape[1 - self.axis]


def _cases() -> list[Case]:
    out: list[Case] = []
    # 2-D tiles whose reduced axis lies in registers only, across lanes, across warps (both axes)
    shapes = [(32, 64), (4, 1024), (64, 4), (128, 2)]
    for dtype in ("f32", "f16", "bf16", "i32", "u8"):
        for shape in shapes:
            for axis in (0, 1):
                for nw in (1, 4, 8):
                    kind = "argmax" if (nw + axis) % 2 else "argmin"
                    out.append(Case(dtype, shape, axis, nw, kind, keep_dims=nw == 4))
    for dtype in ("i8", "u16", "i16", "u32", "f64", "i64", "u64", "bool"):  # the other widths, fewer layouts
        for kind in ("argmax", "argmin"):
            out.append(Case(dtype, (32, 64), 1, 4, kind))
            out.append(Case(dtype, (4, 1024), 0, 8, kind))
    for dtype in ("f32", "bf16", "u8"):  # 1-D, all axes, broadcast rows
        for kind in ("argmax", "argmin"):
            for n, nw in ((16, 4), (32, 1), (2048, 8), (256, 4)):
                out.append(Case(dtype, (n,), 0, nw, kind))
            out.append(Case(dtype, (16, 32), None, 4, kind))
            out.append(Case(dtype, (16, 32), None, 8, kind, keep_dims=True))
            for axis in (0, 1):
                out.append(Case(dtype, (64, 32), axis, 4, kind, broadcast=True))
    return out


CASES = _cases()
FP8_CASES = [Case(t, shape, axis, nw, kind) for t in ("e4m3", "e5m2") for kind in ("argmax", "argmin")
             for shape, axis, nw in (((32, 64), 1, 4), ((4, 1024), 0, 8), ((128,), 0, 4))]

_LAYOUT = re.compile(r"#L\[reg=([^;]*); lane=([^;]*); warp=([^\]]*)\]")


def _bases(text: str) -> list[tuple[int, ...]]:
    text = text.strip()
    if not text:
        return []
    if "(" in text:
        return [tuple(int(v) for v in b.split(",")) for b in re.findall(r"\(([^)]*)\)", text)]
    return [(int(v),) for v in text.split(",")]


def where_reduced(ir: str) -> set[str]:
    """Where the reduced axis of the kernel's (last) reduction lies: some of ``registers``,
    ``lanes``, ``warps``, read from the layout of the reduced operand in the typed IR."""
    red = [ln for ln in ir.splitlines() if " = reduce " in ln][-1]
    operand, axis = re.search(r"reduce (%\w+) \{axis=(\d+)", red).groups()  # type: ignore[union-attr]
    line = next(ln for ln in ir.splitlines() if ln.strip().startswith(f"{operand} = "))
    m = _LAYOUT.search(line)
    assert m is not None, line
    ax = int(axis)
    return {name for name, text in zip(("registers", "lanes", "warps"), m.groups(), strict=True)
            if any(b[ax] for b in _bases(text))}


def inputs(case: Case, seed: int) -> np.ndarray:
    """Random values of the case's type from a small pool (many ties), with NaN, both zeros and the
    infinities for floats and the type's extremes for integers."""
    rng = np.random.default_rng(seed)
    dt = getattr(sp, case.memory_dtype).numpy_dtype
    shape = case.input_shape()
    if case.dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(dt)
    if np.dtype(dt).kind in "iu":
        info = np.iinfo(dt)
        pool = np.array([info.min, info.max, 0, 1, 2, 3, info.max - 1, info.min + 1], dt)
        return rng.choice(pool, size=shape)
    pool = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 448.0, -448.0, np.inf, -np.inf, np.nan], np.float32)
    if case.dtype == "e4m3":  # no infinities: they would round to NaN
        pool = pool[np.isfinite(pool) | np.isnan(pool)]
    x = rng.choice(pool, size=shape, p=None)
    nan_rows = rng.random(shape) < 0.05  # a few more NaNs, and some lines without any
    x = np.where(nan_rows, np.nan, x)
    if len(shape) == 2:
        x[rng.integers(0, shape[0]), :] = 1.0  # a line of ties
    return x.astype(np.float32).astype(dt)


def reference(case: Case, x: np.ndarray) -> np.ndarray:
    """The interpreter's result, flattened (the kernel stores the reduction's elements in order)."""
    y = np.full(case.out_numel(), -7, np.int32)
    case.kernel().interpret[(1,)](x, y, **case.consts())
    return y
