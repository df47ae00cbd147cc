"""A table of computed constexpr defaults that involve NumPy scalars: module level, nested (Python's
value through ``computed_default``) and NumPy's own result of the expression must agree (or the
expression be a clear diagnostic in both). The rows marked xfail are known differences (the
fifty-fourth session's report): ``max(A, 1)`` and ``A + 1`` are Python's number at module level and
nested (a captured NumPy scalar is Python's number) where NumPy gives ``int8``. Both follow from
the documented rule that a captured NumPy scalar is Python's number (docs/language.md); following
NumPy there means typing captured NumPy scalars, a language decision not taken yet."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import numpy as np
import sparsile as sp

A = np.int8(100)


@sp.jit
def k(out, a: sp.constexpr = {expr}):
    sp.store(out, a * a + a)


def make():
    @sp.jit
    def k(out, a: sp.constexpr = {expr}):
        sp.store(out, a * a + a)
    return k
'''

KNOWN = "known difference (computed_default / captured NumPy scalars), see the module docstring"
LANGUAGE = ("known difference: a nested kernel's default is NumPy's arithmetic, a module-level one the "
            "language's (computed_default types Python's result)")
ROWS = [
    pytest.param("np.int8(5) + 1", id="np.int8(5)+1"),
    pytest.param("int(np.int8(5))", id="int(np.int8(5))"),
    pytest.param("np.int16(300)", id="np.int16(300)"),
    pytest.param("max(A, 1)", id="max(A,1)", marks=pytest.mark.xfail(strict=True, reason=KNOWN)),
    pytest.param("A + 1", id="A+1", marks=pytest.mark.xfail(strict=True, reason=KNOWN)),
    # `.item()` of a typed constant is Python's number, as NumPy's (it was SP0204 "5 has no attribute
    # `item`" at module level, Python's number nested)
    pytest.param("np.int8(5).item()", id="np.int8(5).item()"),
    pytest.param("np.uint8(200).item()", id="np.uint8(200).item()"),
    # NumPy's arithmetic is not the language's: nested, Python (NumPy) computes the default and
    # computed_default types its result; at module level sema computes it by the language's rules
    # (`%` and `//` truncate; u8 + i8 is not NumPy's i16; i8 MIN // -1 is SP0790), so the two differ
    pytest.param("np.int8(5) % -3", id="np.int8(5)%-3", marks=pytest.mark.xfail(strict=True, reason=LANGUAGE)),
    pytest.param("np.int8(-7) // 2", id="np.int8(-7)//2", marks=pytest.mark.xfail(strict=True, reason=LANGUAGE)),
    pytest.param("np.uint8(200) + np.int8(1)", id="np.uint8(200)+np.int8(1)",
                 marks=pytest.mark.xfail(strict=True, reason=LANGUAGE)),
]


def _run(kernel) -> int:
    out = np.full(1, -12345, np.int64)  # poisoned
    kernel.interpret[(1,)](out)
    return int(out[0])


@pytest.mark.parametrize("expr", ROWS)
def test_a_computed_default_follows_numpy_at_module_level_and_nested(tmp_path, expr: str) -> None:
    module = import_source(SOURCE.format(expr=expr), tmp_path, "np_table")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        v = eval(expr, {"np": np, "A": module.A})  # (the table's own expressions)
        want = int(v * v + v)
    assert (_run(module.k), _run(module.make())) == (want, want)


def test_item_of_a_typed_constant_in_a_kernel_body_is_pythons_number(tmp_path) -> None:
    module = import_source(BODY, tmp_path, "np_item")
    out = np.full(2, -12345, np.int64)
    module.k.interpret[(1,)](out)
    assert out.tolist() == [200 * 200 + 200, (200 * 200 + 200) % 256]  # .item(): untyped; without: u8 wraps


BODY = '''
import numpy as np
import sparsile as sp


@sp.jit
def k(out):
    a = np.uint8(200).item()
    b = np.uint8(200)
    sp.store(out, a * a + a)
    sp.store(out + 1, b * b + b)
'''


@pytest.mark.parametrize("expr", ["max(A, 1)", "A + 1", "max(np.int8(5), 1)", "min(A, np.int8(3))", "abs(A)"])
def test_a_computed_default_is_the_same_at_module_level_and_nested(tmp_path, expr: str) -> None:
    """Two spellings of one kernel agree: ``max(A, 1)`` (A a global np.int8) was Python's 10100 at module
    level but i8's 116 nested, where any call made the nested default typed; now only a call of a
    NumPy scalar type does, as sema's evaluation at module level."""
    module = import_source(SOURCE.format(expr=expr), tmp_path, "np_same")
    assert _run(module.k) == _run(module.make())
