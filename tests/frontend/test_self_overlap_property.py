"""``self_overlapping`` (frontend/interp/overlap.py: the interpreter's SP0750 for a written argument,
the standard library's SP0804 for an ``out=``) against the definition, element by element: two
elements of a view share memory iff their byte addresses are closer than the itemsize. Random small
views of any strides (negative, zero, smaller than the itemsize, interleaved), and real
``as_strided`` views of numpy memory checked against ``np.shares_memory`` of their elements."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.frontend.interp.overlap import EXACT_OVERLAP_CHECK, overlap_undecided, self_overlapping


def overlapping_by_definition(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether two distinct index tuples have byte ranges [a, a + itemsize) that intersect."""
    addresses = sorted(sum(i * s for i, s in zip(index, strides, strict=True))
                       for index in itertools.product(*(range(n) for n in shape)))
    return any(b - a < itemsize for a, b in itertools.pairwise(addresses))


layouts = st.integers(0, 4).flatmap(lambda nd: st.tuples(
    st.tuples(*[st.integers(0, 5)] * nd), st.tuples(*[st.integers(-48, 48)] * nd), st.sampled_from([1, 2, 4, 8])))


@settings(max_examples=600)
@given(layouts)
def test_self_overlapping_is_the_element_address_definition(layout: tuple) -> None:
    shape, strides, itemsize = layout
    assert self_overlapping(shape, strides, itemsize) == overlapping_by_definition(shape, strides, itemsize)


@settings(max_examples=300)
@given(shape=st.tuples(st.integers(1, 4), st.integers(1, 4)), steps=st.tuples(st.integers(-6, 6), st.integers(-6, 6)),
       dtype=st.sampled_from(["u1", "f2", "f4", "f8"]))
def test_self_overlapping_agrees_with_numpy_on_as_strided_views(shape: tuple[int, int], steps: tuple[int, int],
                                                                 dtype: str) -> None:
    """A view of a real buffer, strides in elements (negative ones from the buffer's middle):
    numpy's own exact answer for each pair of its elements."""
    itemsize = np.dtype(dtype).itemsize
    base = np.zeros(256, dtype)
    view = np.lib.stride_tricks.as_strided(base[128:], shape, (steps[0] * itemsize, steps[1] * itemsize))
    elements = [view[i:i + 1, j:j + 1] for i in range(shape[0]) for j in range(shape[1])]
    shared = any(np.shares_memory(a, b) for a, b in itertools.combinations(elements, 2))
    assert self_overlapping(view.shape, view.strides, itemsize) == shared


def test_a_view_beyond_the_exact_check_counts_as_overlapping() -> None:
    """Interleaved distinct elements the stride test cannot tell apart, more than the exact check
    compares: taken as overlapping (a refusal, never a silent collision)."""
    assert not overlapping_by_definition((40, 2), (4, 6), 2) and not self_overlapping((40, 2), (4, 6), 2)
    assert self_overlapping((EXACT_OVERLAP_CHECK // 2 + 1, 2), (4, 6), 2)  # (element i, 1 lies between i + 1 and i + 2)


def test_a_nested_outer_dimension_is_set_aside_before_the_exact_check() -> None:
    """Tangled inner dimensions (40 x 2 elements, strides 4 and 6 bytes: distinct) repeated along an
    outer stride past their span: exact whatever the outer extent (it was taken as overlapping once
    the product passed the exact check's size); an outer stride inside the span still meets."""
    big = EXACT_OVERLAP_CHECK  # 80 * big elements: far past the exact check
    assert not self_overlapping((big, 40, 2), (4096, 4, 6), 2)
    assert not overlap_undecided((big, 40, 2), (4096, 4, 6), 2)
    assert self_overlapping((big, 40, 2), (100, 4, 6), 2)  # (the span of the inner ones is 164 bytes)
    assert not overlapping_by_definition((3, 40, 2), (4096, 4, 6), 2)
    assert overlapping_by_definition((3, 40, 2), (100, 4, 6), 2)
    assert self_overlapping((3, 40, 2), (100, 4, 6), 2) and not self_overlapping((3, 40, 2), (4096, 4, 6), 2)


def test_only_arrays_past_the_exact_check_are_undecided() -> None:
    assert overlap_undecided((EXACT_OVERLAP_CHECK // 2 + 1, 2), (4, 6), 2)
    assert not overlap_undecided((40, 2), (4, 6), 2)
    assert not overlap_undecided((EXACT_OVERLAP_CHECK * 4,), (2,), 2)  # (dense)
