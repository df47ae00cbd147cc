"""Adversarial review of the linear address form of generic ``load_tile`` / ``store_tile`` boxes
(backend/lower/tile_address.py).

Every register of every box, for every lane of a few programs, is compared with the interpreter
(register_addresses.py): its in-bounds predicate with the interpreter's ``box_offsets`` at the
offsets the interpreter computed, and where it holds its address with the interpreter's element's.
The kernels attack the proof: offsets, shapes and strides next to the i32 wrap (offsets whose
``v + k`` wraps inside the box, strides near ±2**31 whose products need all 64 bits), boxes across
the tensor's edges (negative offsets, the last rows), 1-, 2- and 3-D boxes in layouts of 1, 4 and 8
warps, replicated (broadcast) layouts, i8 to f64 elements, and boxes below the linear form's size
(the exact form, checked the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sparsile.backend.lower import tile_address
from sparsile.tests.backend.register_addresses import check_register_addresses

W = 1 << 31
OFFSETS = (0, -3, 5, W - 1, W - 40, -W, -W + 7, (1 << 22) - 1, 1000)
"""Run-time box offsets: small, negative (the box starts before the tensor) and next to the wrap."""
EXTENTS = ((W - 1, W - 1), (64, 7), (W - 1, 3), (100, W - 64))
"""Run-time (shape, stride) pairs of one dim (the stride may be negative: the address form must not care)."""

TWO_D = """
@kernel(num_warps={warps})
def k(X: tensor[{ty}, 2], Y: tensor[{ty}, 2], a: i32, b: i32, BM: constexpr, BN: constexpr):
    t = X.load_tile((a, b), (BM, BN))
    Y.store_tile((b + program_id(0), a), t)
"""

THREE_D = """
@kernel(num_warps=4)
def k(X: tensor[f16, 3], Y: tensor[f16, 3], a: i32, b: i32, BZ: constexpr, BR: constexpr, BC: constexpr):
    z0 = program_id(0) * BZ + -1
    r0 = program_id(1) * BR + a
    x = X.load_tile((z0, r0, b), (BZ, BR, BC))
    Y.store_tile((z0 + 1, r0 - 2, b), x)
"""


def _arrays(dtype: type, rank: int) -> tuple[np.ndarray, np.ndarray]:
    shape = (4,) * rank
    return np.ones(shape, dtype), np.ones(shape, dtype)


def _linear(src: str, args: tuple, kwargs: dict, **kw: object) -> tuple[int, int]:
    """Check one case; (boxes checked, linear-form boxes among them: those with asm adds)."""
    c = check_register_addresses(src, args, kwargs, programs=2, **kw)  # type: ignore[arg-type]
    return c.boxes, c.llvm.count('asm "add.s64')


@pytest.mark.parametrize("warps, bm, bn, ty, dtype", [
    (1, 64, 16, "f32", np.float32),    # 1024 elements, 32 a thread: the exact form
    (1, 64, 64, "f32", np.float32),    # 128 a thread: still exact
    (1, 32, 256, "f16", np.float16),   # 256 a thread: linear
    (4, 64, 256, "i8", np.int8),
    (8, 512, 16, "f64", np.float64),   # contiguity along the rows
    (4, 2048, 1, "i32", np.int32),     # a column
])
def test_every_register_of_a_2d_box_is_the_interpreters(warps: int, bm: int, bn: int, ty: str, dtype: type) -> None:
    """Boxes at offsets and over shapes and strides next to the i32 wrap: each lane's predicate and
    (where in bounds) address is the interpreter's; the linear form is used for boxes of more than
    128 registers a thread, and only there."""
    linear = 0
    src = TWO_D.format(warps=warps, ty=ty)
    for i, a in enumerate(OFFSETS):
        b = OFFSETS[(3 * i + 1) % len(OFFSETS)]
        (s0, t0), (s1, t1) = EXTENTS[i % len(EXTENTS)], EXTENTS[(i + 1) % len(EXTENTS)]
        tensors = {"X": ((s0, s1), (t0, t1)), "Y": ((s1, s0), (-t1, t0))}
        boxes, asm = _linear(src, (*_arrays(dtype, 2), a, b), {"BM": bm, "BN": bn}, num_warps=warps,
                             tensors=tensors)
        assert boxes == 2
        linear += asm
    assert (linear > 0) == (bm * bn // (32 * warps) > tile_address.LINEAR_ABOVE)


def test_a_3d_box_of_the_fuzz_case_matches_the_interpreter() -> None:
    """The shape of the mutation fuzzer's slow case (``sparse:156:2656``: 1 x BR x 16 boxes of a 3-D bf16
    tensor at ``program_id(1) * BR``), at 2048 rows (256 elements a thread), with program ids near
    the wrap of ``program_id(1) * BR`` and the tensor's real (small) shape and strides, then made-up
    ones near the wrap."""
    src = THREE_D
    kwargs = {"BZ": 1, "BR": 2048, "BC": 16}
    x = np.ones((3, 40, 16), np.float16)
    pids = [(0, 0, 0), (1, 1, 0), (1, W // 2048 - 1, 0), (0, W // 2048, 0)]
    grid = (2, W // 2048 + 1, 1)
    for a, b in ((0, 0), (-5, 3), (W - 3000, -7)):
        for tensors in (None, {"X": ((3, W - 1, 20), (W - 1, 1 - W, 3)), "Y": ((2, 5000, W - 1), (1, W - 16, -1))}):
            c = check_register_addresses(src, (x, x.copy(), a, b), kwargs,
                                         pids=pids, grid=grid, tensors=tensors)
            assert c.boxes == 2 and c.llvm.count('asm "add.s64') > 0


REPLICATED = """
@kernel(num_warps=4)
def k(X: tensor[f32, 2], Y: tensor[f32, 2], a: i32, BM: constexpr, BN: constexpr):
    t = X.load_tile((a, 0), (BM, BN))
    s = sum(t, axis=1)
    Y.store_tile((a, 0), broadcast_to(s[:, None], (BM, BN)) + t)
    r = X.load_tile((0, a), (BM, 1))
    Y.store_tile((a, a), r + broadcast_to(s[:, None], (BM, 1)))
"""


def test_sliced_and_broadcast_layouts_match_the_interpreter() -> None:
    """Boxes in the layouts a reduction and a broadcast leave (registers that repeat elements)."""
    for a in (0, 3, W - 100, -W + 5):
        c = check_register_addresses(REPLICATED, (np.ones((8, 8), np.float32), np.ones((8, 8), np.float32), a),
                                     {"BM": 512, "BN": 128},
                                     tensors={"X": ((W - 1, W - 1), (W - 1, 1)), "Y": ((700, 900), (-3, W - 2))})
        assert c.boxes == 4


def _planted(orig: Callable[..., Any], *, swap: tuple[int, int] | None = None,
             preds_swap: tuple[int, int] | None = None, zext: bool = False, signed: bool = False) -> Callable[..., Any]:
    """``orig`` (the linear form) with a bug planted: two registers' pointers or predicates swapped,
    the strides zero-extended (wrong for negative strides), the bounds compared signed (negative
    indices then pass)."""
    def planted(cg: Any, t: Any, offsets: Any, layout: Any) -> tuple[list, list]:
        fb = cg.fb
        cast, icmp = fb.cast, fb.icmp
        if zext:
            fb.cast = lambda op, v, ty: cast("zext" if op == "sext" and v.ref.endswith(tuple(
                f"_stride{d}" for d in range(4))) else op, v, ty)
        if signed:
            fb.icmp = lambda pred, a, b: icmp("slt" if pred == "ult" else pred, a, b)
        try:
            ptrs, preds = orig(cg, t, offsets, layout)
        finally:
            fb.cast, fb.icmp = cast, icmp
        if swap:
            ptrs[swap[0]], ptrs[swap[1]] = ptrs[swap[1]], ptrs[swap[0]]
        if preds_swap:
            preds[preds_swap[0]], preds[preds_swap[1]] = preds[preds_swap[1]], preds[preds_swap[0]]
        return ptrs, preds
    return planted


@pytest.mark.parametrize("bug", [{"swap": (1, 2)}, {"preds_swap": (0, -1)}, {"zext": True}, {"signed": True}])
def test_the_check_sees_a_wrong_form(monkeypatch: pytest.MonkeyPatch, bug: dict[str, Any]) -> None:
    """The check itself: a linear form with two registers' pointers or predicates swapped, with
    zero-extended strides, or with signed bounds checks fails it."""
    monkeypatch.setattr(tile_address, "linear_tile_addresses", _planted(tile_address.linear_tile_addresses, **bug))
    args = (*_arrays(np.float32, 2), -3, 5)
    tensors = {"X": ((W - 1, W - 1), (W - 1, 1)), "Y": ((W - 1, W - 1), (-7, 1))}
    with pytest.raises(AssertionError, match=r"IR (addresses|in bounds)"):
        check_register_addresses(TWO_D.format(warps=1, ty="f32"), args, {"BM": 32, "BN": 256}, num_warps=1,
                                 tensors=tensors)
