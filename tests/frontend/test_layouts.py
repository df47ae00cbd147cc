"""Property tests of the GF(2) linear-layout algebra (frontend/layout/layouts.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.frontend.diagnostics import Diagnostic
from sparsile.frontend.layout.layouts import (
    GF2Span,
    LayoutError,
    LinearLayout,
    identity_nd,
    next_power_of_two,
    padded_shape,
)
from sparsile.frontend.layout.tile import register_coords

SETTINGS = settings(max_examples=60, deadline=None)
NAMES = ["a", "b", "c"]


def xor_apply(layout: LinearLayout, point: dict[str, int]) -> dict[str, int]:
    """Reference evaluation straight from the definition: XOR the bases of the set bits."""
    out = dict.fromkeys(layout.out_names, 0)
    for (name, _size), row in zip(layout.in_dims, layout.bases):
        for bit, basis in enumerate(row):
            if point.get(name, 0) >> bit & 1:
                for o, c in zip(layout.out_names, basis):
                    out[o] ^= c
    return out


def all_points(layout: LinearLayout):
    names = layout.in_names
    for values in itertools.product(*[range(s) for _, s in layout.in_dims]):
        yield dict(zip(names, values))


@st.composite
def dims(draw, prefix: str, max_dims: int = 3, max_bits: int = 3, min_total: int = 0):
    n = draw(st.integers(1, max_dims))
    sizes = [1 << draw(st.integers(0, max_bits)) for _ in range(n)]
    if sum(s.bit_length() - 1 for s in sizes) < min_total:
        sizes[0] <<= min_total
    return [(f"{prefix}{i}", s) for i, s in enumerate(sizes)]


@st.composite
def layouts(draw, in_dims=None, out_dims=None):
    in_dims = in_dims if in_dims is not None else draw(dims("i"))
    out_dims = out_dims if out_dims is not None else draw(dims("o"))
    bases = {}
    for name, size in in_dims:
        row = []
        for _ in range(size.bit_length() - 1):
            row.append(tuple(draw(st.integers(0, s - 1)) for _, s in out_dims))
        bases[name] = row
    return LinearLayout.from_bases(bases, out_dims)


@st.composite
def bijective_layouts(draw, in_dims=None, out_dims=None):
    """Random invertible maps: a permutation of unit columns plus random column additions."""
    in_dims = in_dims if in_dims is not None else draw(dims("i", min_total=1))
    n = sum(s.bit_length() - 1 for _, s in in_dims)
    if out_dims is None:
        # split n output bits over 1-3 dims
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=0, max_size=2)))
        bounds = [0, *cuts, n]
        out_dims = [(f"o{i}", 1 << (bounds[i + 1] - bounds[i])) for i in range(len(bounds) - 1)]
    perm = draw(st.permutations(range(n)))
    cols = [1 << p for p in perm]
    for _ in range(draw(st.integers(0, 3 * n))):
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if i != j:
            cols[i] ^= cols[j]
    return LinearLayout._from_columns(tuple(in_dims), tuple(out_dims), cols)


def identity_like(out_dims) -> LinearLayout:
    layout = LinearLayout.empty()
    for name, size in out_dims:
        layout = layout * LinearLayout.identity(name, size)
    return layout


# ---------------------------------------------------------------------------------------------

@SETTINGS
@given(layouts())
def test_apply_and_table_agree_with_the_definition(layout):
    table = layout.table()
    for point in all_points(layout):
        want = xor_apply(layout, point)
        assert layout.apply(**point) == want
        idx = tuple(point[n] for n in layout.in_names)
        assert list(table[idx]) == [want[n] for n in layout.out_names]


@SETTINGS
@given(st.data())
def test_compose_is_function_composition_and_associative(data):
    a = data.draw(layouts())
    b = data.draw(layouts(in_dims=list(a.out_dims)))
    c = data.draw(layouts(in_dims=list(b.out_dims)))
    ab = a.compose(b)
    for point in all_points(a):
        assert ab.apply(**point) == b.apply(**a.apply(**point))
    assert ab.compose(c) == a.compose(b.compose(c))


@SETTINGS
@given(bijective_layouts())
def test_invert_then_compose_is_identity(layout):
    assert layout.is_bijective() and layout.num_free_bits() == 0
    inv = layout.invert()
    assert inv.compose(layout) == identity_like(layout.out_dims)
    assert layout.compose(inv) == identity_like(layout.in_dims)


@SETTINGS
@given(bijective_layouts(), st.integers(1, 3))
def test_pseudo_inverse_is_a_right_inverse_that_avoids_replicated_bits(layout, extra):
    # append replicated (zero) bits and bits that duplicate existing ones
    rep = LinearLayout.zeros("rep", 1 << extra)
    first = next(b for row in layout.bases for b in row)
    dup = LinearLayout.from_bases({"dup": [first]}, layout.out_dims)
    wide = (layout * rep).rename_ins({}).transpose_ins([*layout.in_names, "rep"])
    wide = LinearLayout(wide.in_dims + dup.in_dims, wide.out_dims, wide.bases + dup.bases)
    assert wide.is_surjective() and not wide.is_injective()
    assert wide.num_free_bits() == extra + 1
    right = wide.pseudo_invert()
    for y in all_points(right):
        x = right.apply(**y)
        assert x["rep"] == 0 and x["dup"] == 0
        assert wide.apply(**x) == y


@SETTINGS
@given(st.data())
def test_product_laws(data):
    a = data.draw(layouts(in_dims=data.draw(dims("p")), out_dims=data.draw(dims("x"))))
    b = data.draw(layouts(in_dims=data.draw(dims("q")), out_dims=data.draw(dims("y"))))
    c = data.draw(layouts(in_dims=data.draw(dims("r")), out_dims=data.draw(dims("z"))))
    ab = a * b
    # restricting a direct sum to one factor's dims gives the factor back
    assert ab.sublayout(a.in_names, a.out_names) == a
    assert ab.sublayout(b.in_names, b.out_names) == b
    assert (a * b) * c == a * (b * c)
    for pa in itertools.islice(all_points(a), 8):
        for pb in itertools.islice(all_points(b), 8):
            assert ab.apply(**pa, **pb) == {**a.apply(**pa), **b.apply(**pb)}
    assert ab.is_injective() == (a.is_injective() and b.is_injective())
    assert ab.rank == a.rank + b.rank


def test_product_on_shared_dims_stacks_bits():
    lo = LinearLayout.identity("reg", 4, "n")
    hi = LinearLayout.identity("reg", 2, "n")
    both = lo * hi
    assert both.in_dims == (("reg", 8),) and both.out_dims == (("n", 8),)
    assert [both.apply(reg=r)["n"] for r in range(8)] == list(range(8))
    lane = LinearLayout.identity("lane", 2, "n")
    stacked = lo * lane
    assert stacked.out_dims == (("n", 8),)
    assert stacked.apply(reg=3, lane=1) == {"n": 7}


@SETTINGS
@given(layouts())
def test_injective_surjective_and_free_bits_match_brute_force(layout):
    images = {tuple(layout.apply(**p).values()) for p in all_points(layout)}
    n_in = int(np.prod([s for _, s in layout.in_dims]))
    n_out = int(np.prod([s for _, s in layout.out_dims]))
    assert layout.is_injective() == (len(images) == n_in)
    assert layout.is_surjective() == (len(images) == n_out)
    assert 2 ** layout.num_free_bits() == n_in // len(images)


@SETTINGS
@given(layouts())
def test_reshape_and_transpose_round_trip(layout):
    total = int(np.prod(layout.out_shape))
    flat = layout.reshape_outs([("flat", total)])
    assert flat.reshape_outs(layout.out_dims) == layout
    # row-major: the last output dim is the fastest
    for point in itertools.islice(all_points(layout), 16):
        coords = layout.apply(**point)
        idx = 0
        for name, size in layout.out_dims:
            idx = idx * size + coords[name]
        assert flat.apply(**point)["flat"] == idx
    rev = list(reversed(layout.out_names))
    assert layout.transpose_outs(rev).transpose_outs(layout.out_names) == layout
    rin = list(reversed(layout.in_names))
    assert layout.transpose_ins(rin).transpose_ins(layout.in_names) == layout


@SETTINGS
@given(layouts())
def test_reshape_ins_and_merge_ins_are_row_major(layout):
    total = int(np.prod([s for _, s in layout.in_dims]))
    flat = layout.reshape_ins([("x", total)])
    for point in itertools.islice(all_points(layout), 32):
        idx = 0
        for name, size in layout.in_dims:
            idx = idx * size + point[name]
        assert flat.apply(x=idx) == layout.apply(**point)
    assert flat.reshape_ins(layout.in_dims) == layout
    names = list(layout.in_names)
    merged = layout.merge_ins(names, "m")
    assert merged == flat.rename_ins({"x": "m"})


@SETTINGS
@given(layouts())
def test_sublayout_projects(layout):
    keep_out = layout.out_names[:1]
    keep_in = layout.in_names[:1]
    sub = layout.sublayout(keep_in, keep_out)
    for point in itertools.islice(all_points(sub), 16):
        full = layout.apply(**point)
        assert sub.apply(**point) == {n: full[n] for n in keep_out}


def test_equality_and_hash_are_by_value():
    a = LinearLayout.from_bases({"reg": [(0, 1)], "lane": [(1, 0)]}, [("m", 2), ("n", 2)])
    b = LinearLayout.identity("lane", 2, "m") * LinearLayout.identity("reg", 2, "n")
    assert a != b  # input dims in a different order
    assert a == b.transpose_ins(["reg", "lane"])
    assert hash(a) == hash(b.transpose_ins(["reg", "lane"]))
    assert len({a, b.transpose_ins(["reg", "lane"])}) == 1
    c = LinearLayout.from_bases({"reg": [(1, 0)], "lane": [(0, 1)]}, [("m", 2), ("n", 2)])
    assert a != c


def test_repr_lists_bases_by_dim():
    layout = LinearLayout.from_bases({"reg": [(0, 1), (0, 2)], "lane": [(1, 0)]}, [("m", 2), ("n", 4)])
    text = repr(layout)
    assert "in=[reg:4, lane:2] -> out=[m:2, n:4]" in text
    assert "reg=[(0,1), (0,2)]" in text
    assert "lane=[(1,0)]" in text


def test_identity_nd_walks_the_requested_order():
    layout = identity_nd("t", [("r", 4), ("c", 8)])
    assert layout.apply(t=1) == {"r": 0, "c": 1}
    assert layout.apply(t=8) == {"r": 1, "c": 0}
    col_first = identity_nd("t", [("r", 4), ("c", 8)], order=[0, 1])
    assert col_first.apply(t=1) == {"r": 1, "c": 0}


def test_non_power_of_two_shapes_are_padded():
    assert padded_shape((100, 64, 1, 3)) == (128, 64, 1, 4)
    assert next_power_of_two(17) == 32


@pytest.mark.parametrize("build, code", [
    (lambda: LinearLayout.identity("x", 6), "SP0401"),
    (lambda: LinearLayout.from_bases({"x": [(5,)]}, [("y", 4)]), "SP0401"),
    (lambda: LinearLayout.from_bases({"x": [(1, 0)]}, [("y", 4)]), "SP0401"),
    (lambda: LinearLayout.from_bases({"x": [(1.5,)]}, [("y", 4)]), "SP0401"),  # (int() made it 1)
    (lambda: LinearLayout.from_bases({"x": [(True,)]}, [("y", 4)]), "SP0401"),
    (lambda: LinearLayout.identity("x", 4).compose(LinearLayout.identity("z", 4)), "SP0402"),
    (lambda: LinearLayout.identity("x", 8, "y").compose(LinearLayout.identity("y", 4)), "SP0402"),
    (lambda: LinearLayout.zeros("x", 4, [("y", 4)]).invert(), "SP0403"),
    (lambda: LinearLayout.zeros("x", 4, [("y", 4)]).pseudo_invert(), "SP0403"),
    (lambda: LinearLayout.identity("x", 4).apply(x=4), "SP0402"),
    (lambda: LinearLayout.identity("x", 4).apply(q=1), "SP0402"),
    (lambda: LinearLayout.identity("x", 4).reshape_outs([("y", 8)]), "SP0402"),
])
def test_misuse_raises_layout_errors_with_codes(build, code):
    with pytest.raises(LayoutError) as info:
        build()
    assert info.value.code == code
    diag = info.value.to_diagnostic()
    assert isinstance(diag, Diagnostic) and diag.code == code
    assert code in str(info.value.to_compile_error())


@SETTINGS
@given(st.lists(st.integers(0, 255), min_size=1, max_size=10), st.integers(0, 255))
def test_gf2_span_solves_exactly_the_span(columns, target):
    span = GF2Span(columns)
    reachable = set()
    for mask in range(1 << len(columns)):
        v = 0
        for i, c in enumerate(columns):
            if mask >> i & 1:
                v ^= c
        reachable.add(v)
    sol = span.solve(target)
    assert (sol is not None) == (target in reachable)
    if sol is not None:
        v = 0
        for i, c in enumerate(columns):
            if sol >> i & 1:
                v ^= c
                assert i in span.pivots
        assert v == target
    assert 2 ** span.rank == len(reachable)


@SETTINGS
@given(layouts(in_dims=[("reg", 16), ("lane", 4)]))
def test_register_coords_follow_the_definition(layout):
    """register_coords (built incrementally, once per layout) is the XOR of each register's bases;
    the caller's list is its own (changing it changes nothing for the next caller)."""
    expect = [tuple(xor_apply(layout, {"reg": r}).values()) for r in range(16)]
    got = register_coords(layout)
    assert got == expect
    got[0] = (-1,)
    got.append((7,))
    assert register_coords(layout) == expect
