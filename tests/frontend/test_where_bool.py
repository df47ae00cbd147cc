"""``where`` and ``... if ... else ...`` of two bools give a bool (numpy's and Triton's meaning), in
.spk kernels and ``@sparsile.jit`` functions alike: the result stores to a ``ptr[bool]`` and works as
a mask. Promotion rule 5 (a bool in arithmetic is an integer) still applies where only one side is
a bool. docs/language.md, "Promotion and arithmetic", rule 5."""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support import compile_src

SRC = """
@kernel
def k(X: ptr[i32], W: ptr[bool], E: ptr[bool], L: ptr[bool], V: ptr[f32], I: ptr[i32]):
    i = arange(0, 8)
    x = load(X + i)
    a = x > 2
    b = x < 5
    c = x % 2 == 0
    store(W + i, where(c, a, b))
    store(E + i, a if c else b)
    store(L + i, where(c, True, b))
    store(V + i, 1.5, mask=where(c, a, False))
    store(I + i, where(c, a, 7))
"""


def _inputs() -> tuple[np.ndarray, ...]:
    x = np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int32)
    # outputs poisoned (the bool outputs are run with each poison, so an unwritten element shows)
    return (x, np.zeros(8, np.bool_), np.zeros(8, np.bool_), np.zeros(8, np.bool_),
            np.full(8, -7.0, np.float32), np.full(8, -99, np.int32))


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    a, b, c = x > 2, x < 5, x % 2 == 0
    return {"where": np.where(c, a, b), "ifexp": np.where(c, a, b), "lit": np.where(c, True, b),
            "masked": np.where(np.where(c, a, False), 1.5, -7.0).astype(np.float32),
            "int": np.where(c, a.astype(np.int32), 7).astype(np.int32)}


def test_where_of_two_bools_is_a_bool_in_the_ir() -> None:
    text = compile_src(SRC, stop_after="ir", cache=False).ir
    selects = [ln for ln in text.splitlines() if "arith.select" in ln]
    assert len(selects) == 5, selects
    bool_selects = [ln for ln in selects if re.search(r": tile<8xbool>", ln)]
    assert len(bool_selects) == 4, selects  # where, if-else, with a literal True / False
    assert any(": tile<8xi32>" in ln for ln in selects)  # a bool with an integer: rule 5, i32


@pytest.mark.parametrize("poison", [False, True])
def test_where_of_two_bools_stores_to_a_bool_pointer_and_masks(poison: bool) -> None:
    x, w, e, lit, v, iv = _inputs()
    for arr in (w, e, lit):
        arr[:] = poison
    sp.loads(SRC, "where_bool.spk").kernels["k"].interpret[(1,)](x, w, e, lit, v, iv)
    want = _expected(x)
    assert w.tolist() == want["where"].tolist()
    assert e.tolist() == want["ifexp"].tolist()
    assert lit.tolist() == want["lit"].tolist()
    assert v.tolist() == want["masked"].tolist()
    assert iv.tolist() == want["int"].tolist()


def test_where_of_two_bools_compiles_to_ptx() -> None:
    """The bool select lowers (an ``i1`` select, a byte store to the ``ptr[bool]``, a predicate mask)."""
    text = compile_src(SRC, stop_after="ptx", cache=False).ptx
    assert "st.global" in text


@sp.jit
def jit_where_bool(x, w, v):
    i = sp.arange(0, 8)
    xv = sp.load(x + i)
    a = xv > 2
    b = xv < 5
    c = xv % 2 == 0
    m = sp.where(c, a, b)
    sp.store(w + i, a if c else b)
    sp.store(v + i, 1.5, mask=m)


def test_where_of_two_bools_in_a_jit_function() -> None:
    x = np.arange(8, dtype=np.int32)
    for poison in (False, True):
        w = np.full(8, poison, np.bool_)
        v = np.full(8, -7.0, np.float32)
        jit_where_bool.interpret[(1,)](x, w, v)
        a, b, c = x > 2, x < 5, x % 2 == 0
        assert w.tolist() == np.where(c, a, b).tolist()
        assert v.tolist() == np.where(np.where(c, a, b), 1.5, -7.0).tolist()
