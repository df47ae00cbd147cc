"""The reduction algorithm of backend/lower/reduce.py, checked by emulating its steps in Python over
random layouts: registers of a thread fold first (:func:`thread_combines`), then lanes whose basis
moves along the axis only (butterflies), then warps (through shared memory). Whatever layout the
lowering accepts must add every element of a reduced line exactly once.

The bug this guards against: a layout with a broadcast (zero) register basis repeats elements in
registers, and the thread fold summed each copy (the GPU metadata encoder produced 4x its words).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sparsile.backend.lower.reduce import _pure, counts_each_element_once, thread_combines
from sparsile.frontend.layout.layouts import LinearLayout
from sparsile.frontend.layout.tile import LANE, REG, WARP, thread_bases


def point(layout: LinearLayout, **inputs: int) -> tuple[int, ...]:
    """The element ``layout`` maps these (reg, lane, warp) inputs to (input dims it lacks are 0)."""
    return tuple(layout.apply(**{k: v for k, v in inputs.items() if k in layout.in_names}).values())


def _emulate(layout: LinearLayout, shape: tuple[int, ...], axis: int, x: np.ndarray,
             combine: Callable[[Any, Any], Any] = operator.add) -> dict[tuple[int, int], dict[tuple[int, ...], Any]]:
    """Each thread's (lane, warp) result per output key, as the lowering computes it: an element
    starts as ``(value, index along the axis)`` for argmax (``combine`` given), as its value for a sum."""
    lanes, warps = thread_bases(layout, LANE), thread_bases(layout, WARP)
    arg = combine is not operator.add

    def element(c: tuple[int, ...]) -> Any:
        v = int(x[c]) if all(v < s for v, s in zip(c, shape, strict=True)) else 0
        return (v, c[axis]) if arg else v

    partial = {}
    for lane in range(1 << len(lanes)):
        for warp in range(1 << len(warps)):
            groups: dict[tuple[int, ...], Any] = {}
            for key, r in thread_combines(layout, axis):
                e = element(point(layout, reg=r, lane=lane, warp=warp))
                groups[key] = combine(groups[key], e) if key in groups else e
            partial[(lane, warp)] = groups
    for b, basis in enumerate(lanes):  # butterflies, one lane bit at a time
        if _pure(basis, axis) == "axis":
            partial = {(lane, warp): {k: combine(v, partial[(lane ^ (1 << b), warp)][k]) for k, v in g.items()}
                       for (lane, warp), g in partial.items()}
    axis_warp_bits = [b for b, basis in enumerate(warps) if _pure(basis, axis) == "axis"]
    if axis_warp_bits:
        combos = [sum(1 << axis_warp_bits[i] for i in range(len(axis_warp_bits)) if m >> i & 1)
                  for m in range(1 << len(axis_warp_bits))]
        clear = ~sum(1 << b for b in axis_warp_bits)
        partial = {(lane, warp): {k: functools.reduce(combine, [partial[(lane, (warp & clear) | c)][k] for c in combos])
                                  for k in g}
                   for (lane, warp), g in partial.items()}
    return partial


def _line(layout: LinearLayout, shape: tuple[int, ...], axis: int, x: np.ndarray, lane: int, warp: int,
          key: tuple[int, ...]) -> np.ndarray | None:
    """The reduced line the thread's output ``key`` names (its other coordinates); None outside the tile."""
    lanes, warps = thread_bases(layout, LANE), thread_bases(layout, WARP)
    t = [0] * len(shape)
    for bits, bases in ((lane, lanes), (warp, warps)):
        for b, v in enumerate(bases):
            if bits >> b & 1:
                t = [p ^ q for p, q in zip(t, v, strict=True)]
    other = [d for d in range(len(shape)) if d != axis]
    coord = [0] * len(shape)
    for i, d in enumerate(other):
        coord[d] = t[d] ^ key[i]
    if any(coord[d] >= shape[d] for d in other):
        return None
    return np.array([int(x[tuple([*coord[:axis], i, *coord[axis + 1:]])]) for i in range(shape[axis])])


def _expected(layout: LinearLayout, shape: tuple[int, ...], axis: int, x: np.ndarray, lane: int, warp: int,
              key: tuple[int, ...]) -> int:
    """The true sum of the line the thread's output ``key`` names."""
    line = _line(layout, shape, axis, x, lane, warp, key)
    return 0 if line is None else int(line.sum())


def _first_max(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """argmax's combine on (value, index) pairs: the larger value, the smaller index on a tie."""
    return b if (b[0], -b[1]) > (a[0], -a[1]) else a


@st.composite
def layouts(draw: st.DrawFn) -> tuple[LinearLayout, tuple[int, ...]]:
    """A 2-D layout over a (2^a, 2^b) tile: each unit bit of each dim once, shuffled over the
    registers, 5 lane bits and some warp bits, plus broadcast (zero) or repeated bases."""
    shape = (1 << draw(st.integers(0, 3)), 1 << draw(st.integers(0, 4)))
    units = [(1 << i, 0) for i in range(shape[0].bit_length() - 1)]
    units += [(0, 1 << i) for i in range(shape[1].bit_length() - 1)]
    extra = draw(st.lists(st.sampled_from([(0, 0), *units]) if units else st.just((0, 0)), max_size=4))
    bases = draw(st.permutations(units + extra))
    slots = draw(st.lists(st.sampled_from([REG, LANE, WARP]), min_size=len(bases), max_size=len(bases)))
    by = {REG: [], LANE: [], WARP: []}
    for b, s in zip(bases, slots, strict=True):
        by[s].append(b)
    by[LANE] = (by[LANE] + [(0, 0)] * 5)[:5] if len(by[LANE]) <= 5 else by[LANE][:5]
    lost = [b for b in bases if b in units and b not in by[REG] + by[LANE] + by[WARP]]
    by[REG] += lost  # a unit bit cut from the lanes moves to the registers: the tile stays covered
    layout = LinearLayout.from_bases({REG: by[REG], LANE: by[LANE], WARP: by[WARP]},
                                     [("dim0", shape[0]), ("dim1", shape[1])])
    return layout, shape


@given(layouts(), st.integers(0, 1), st.integers(0, 2**31 - 1))
def test_an_accepted_layout_sums_each_element_once(case: tuple[LinearLayout, tuple[int, ...]], axis: int,
                                                   seed: int) -> None:
    layout, shape = case
    if any(_pure(b, axis) == "mixed" for n in (LANE, WARP) for b in thread_bases(layout, n)):
        return  # refused by the lowering (SP0623); unit bases never mix
    if not counts_each_element_once(layout, axis):
        # refused (SP0623) only when a lane or warp along the axis repeats an element
        moved = [b for n in (LANE, WARP) for b in thread_bases(layout, n) if _pure(b, axis) == "axis"]
        regs = [tuple(layout.basis(REG, i).values()) for i in range(layout.in_bits(REG))]
        assert len(set(moved)) < len(moved) or set(moved) & set(regs)
        return
    x = np.random.default_rng(seed).integers(1, 1000, size=shape)
    got = _emulate(layout, shape, axis, x)
    for (lane, warp), groups in got.items():
        for key, value in groups.items():
            assert value == _expected(layout, shape, axis, x, lane, warp, key), (layout, axis, lane, warp, key)


@given(layouts(), st.integers(0, 1), st.integers(0, 2**31 - 1))
def test_an_accepted_layout_gives_the_first_maximums_index(case: tuple[LinearLayout, tuple[int, ...]], axis: int,
                                                            seed: int) -> None:
    """argmax / argmin fold (value, index) pairs through the same stages; their combine is
    idempotent, so a layout that repeats an element (refused for a sum) is fine too: every element
    of the line must be seen at least once, and no other."""
    layout, shape = case
    if any(_pure(b, axis) == "mixed" for n in (LANE, WARP) for b in thread_bases(layout, n)):
        return  # refused by the lowering (SP0623)
    x = np.random.default_rng(seed).integers(0, 4, size=shape)  # many ties
    for (lane, warp), groups in _emulate(layout, shape, axis, x, _first_max).items():
        for key, (value, index) in groups.items():
            line = _line(layout, shape, axis, x, lane, warp, key)
            if line is not None:
                assert (value, index) == (line.max(), int(np.argmax(line))), (layout, axis, lane, warp, key)


def test_a_broadcast_register_basis_is_folded_once() -> None:
    """The layout of the GPU metadata encoder's second sum (8 registers, 4 of them copies)."""
    layout = LinearLayout.from_bases({REG: [(0, 0), (0, 0), (1, 0)], LANE: [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16)],
                                      WARP: [(0, 0)]}, [("dim0", 2), ("dim1", 32)])
    combines = thread_combines(layout, 0)
    assert [r for _, r in combines] == [0, 4]
    assert counts_each_element_once(layout, 0)


def test_a_lane_repeating_a_register_is_refused() -> None:
    layout = LinearLayout.from_bases({REG: [(1, 0)], LANE: [(1, 0), (0, 1), (0, 2), (0, 4), (0, 8)]},
                                     [("dim0", 2), ("dim1", 16)])
    assert not counts_each_element_once(layout, 0)
    assert counts_each_element_once(layout, 1)
