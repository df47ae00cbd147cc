"""A table of computed constexpr defaults (many with NumPy scalars): module level, nested and
NumPy's (or Python's) own result of the expression agree, and both kernels take the default as the
same value given at a launch takes it.

The rule (docs/language.md, "What a kernel captures"): a ``@jit`` function's default is the value
Python evaluated when the ``def`` ran (``k.fn.__defaults__``, what ``inspect.signature(k)`` shows),
typed as that value given at a launch is: a NumPy scalar is the typed constant of its dtype, so
``max(A, 1)`` (``A = np.int8(100)``) is the ``i8`` 100 and ``np.int8(5) % -3`` NumPy's ``i8`` -1.

History: a module-level kernel's default was computed again by sema from the source text, by the
language's constant rules (``%`` and ``//`` truncate; ``u8 + i8`` is not NumPy's ``i16``; a captured
NumPy scalar is Python's number), while a nested kernel took Python's value: five rows of this table
were strict xfails (``max(A,1)``, ``A+1``, ``np.int8(5)%-3``, ``np.int8(-7)//2``,
``np.uint8(200)+np.int8(1)``), and the float ``//`` / ``%`` rows differed too."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np
import pytest

import sparsile as sp
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

ROWS = [
    pytest.param("np.int8(5) + 1", id="np.int8(5)+1"),
    pytest.param("int(np.int8(5))", id="int(np.int8(5))"),
    pytest.param("np.int16(300)", id="np.int16(300)"),
    # a captured NumPy scalar computed with: NumPy's result, typed (was Python's number at module
    # level and nested, an xfail: NumPy's `max(A, 1)` is `A`, the int8 100, and `A + 1` the int8 101)
    pytest.param("max(A, 1)", id="max(A,1)"),
    pytest.param("A + 1", id="A+1"),
    # `.item()` of a typed constant is Python's number, as NumPy's (it was SP0204 "5 has no attribute
    # `item`" at module level, Python's number nested)
    pytest.param("np.int8(5).item()", id="np.int8(5).item()"),
    pytest.param("np.uint8(200).item()", id="np.uint8(200).item()"),
    # NumPy's arithmetic, not the language's: `%` and `//` floor (the language's truncate), u8 + i8 is
    # NumPy's i16 (xfails: sema computed these by the language's rules at module level)
    pytest.param("np.int8(5) % -3", id="np.int8(5)%-3"),
    pytest.param("np.int8(-7) // 2", id="np.int8(-7)//2"),
    pytest.param("np.uint8(200) + np.int8(1)", id="np.uint8(200)+np.int8(1)"),
    # Python's bool arithmetic: the int 2
    pytest.param("True + 1", id="True+1"),
]

FLOAT_ROWS = [
    # Python's float `//` and `%` floor (an untyped number: a * a + a in f64 here, as Python's)
    pytest.param("-7.5 // 2", id="-7.5//2"),
    pytest.param("-7.5 % 2", id="-7.5%2"),
    pytest.param("1.1", id="1.1"),
    # NumPy float scalars: typed by their dtype; `%` is NumPy's floored one (the language's `%` of
    # f64 is C's fmod: it was 2.8125, not -0.1875, at module level)
    pytest.param("np.float32(-7.5) // 2", id="np.float32(-7.5)//2"),
    pytest.param("np.float64(7.25) % -2", id="np.float64(7.25)%-2"),
    pytest.param("np.float32(1.1) * 3", id="np.float32(1.1)*3"),
    pytest.param("np.float32(0.1) + np.float32(0.2)", id="np.float32(0.1)+np.float32(0.2)"),
]


def _run(kernel, dtype: type = np.int64, **kwargs: Any) -> Any:
    out = np.full(1, -12345, dtype)  # poisoned
    kernel.interpret[(1,)](out, **kwargs)
    return out[0].item()


def _default(kernel) -> Any:
    """Python's value of the default of ``a`` (what ``inspect.signature`` shows)."""
    return inspect.signature(kernel).parameters["a"].default


def _expected(expr: str, module: Any) -> Any:
    """NumPy's (or Python's) ``v * v + v`` of the table's own expression ``v``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (int8 wraps, as the kernel's i8 does)
        v = eval(expr, {"np": np, "A": module.A})
        return (v * v + v).item() if isinstance(v, np.generic) else v * v + v


@pytest.mark.parametrize("expr", ROWS)
def test_a_computed_default_follows_numpy_at_module_level_and_nested(tmp_path, expr: str) -> None:
    module = import_source(SOURCE.format(expr=expr), tmp_path, "np_table")
    want = int(_expected(expr, module))
    nested = module.make()
    assert (_run(module.k), _run(nested)) == (want, want)
    for kernel in (module.k, nested):  # the default is what the same value given at a launch is
        assert _run(kernel, a=_default(kernel)) == want


@pytest.mark.parametrize("expr", FLOAT_ROWS)
def test_a_computed_float_default_follows_python_and_numpy(tmp_path, expr: str) -> None:
    module = import_source(SOURCE.format(expr=expr), tmp_path, "np_float_table")
    want = float(_expected(expr, module))
    nested = module.make()
    assert (_run(module.k, np.float64), _run(nested, np.float64)) == (want, want)
    for kernel in (module.k, nested):
        assert _run(kernel, np.float64, a=_default(kernel)) == want


TUPLE_SOURCE = '''
import numpy as np
import sparsile as sp

A = np.int8(100)


@sp.jit
def k(out, a: sp.constexpr = (np.int8(5) % -3, A + 1, True + 1)):
    sp.store(out, a[0] * a[0] + a[0])
    sp.store(out + 1, a[1] * a[1] + a[1])
    sp.store(out + 2, a[2] * a[2] + a[2])


def make():
    @sp.jit
    def k(out, a: sp.constexpr = (np.int8(5) % -3, A + 1, True + 1)):
        sp.store(out, a[0] * a[0] + a[0])
        sp.store(out + 1, a[1] * a[1] + a[1])
        sp.store(out + 2, a[2] * a[2] + a[2])
    return k
'''


def test_a_tuple_default_is_pythons_tuple_typed_element_by_element(tmp_path) -> None:
    module = import_source(TUPLE_SOURCE, tmp_path, "np_tuple_table")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = [(v * v + v).item() if isinstance(v, np.generic) else v * v + v
                for v in (np.int8(5) % -3, module.A + 1, True + 1)]
    assert want == [0, 62, 6]  # i8: -1 * -1 - 1; i8: 101 * 101 + 101 wraps; Python's 2 * 2 + 2
    for kernel in (module.k, module.make()):
        for kwargs in ({}, {"a": _default(kernel)}):
            out = np.full(3, -12345, np.int64)
            kernel.interpret[(1,)](out, **kwargs)
            assert out.tolist() == want


DTYPE_SOURCE = '''
import sparsile as sp


@sp.jit
def k(x, out, DT: sp.constexpr = float):
    sp.store(out, (sp.load(x).to(DT) * 3.0).to(sp.f64))


def make():
    @sp.jit
    def k(x, out, DT: sp.constexpr = float):
        sp.store(out, (sp.load(x).to(DT) * 3.0).to(sp.f64))
    return k
'''


def test_a_dtype_default_float_is_f64_at_module_level_and_nested(tmp_path) -> None:
    # `DT=float` is NumPy's reading of Python's float, f64 (docs/language.md, "Parameter types"): the
    # product is f64's, exact here, not f32's
    module = import_source(DTYPE_SOURCE, tmp_path, "np_dtype_table")
    x = np.random.default_rng(58).uniform(0.5, 2.0, 1)
    want = float(x[0]) * 3.0
    assert np.float32(np.float32(x[0]) * np.float32(3.0)).item() != want  # (f32 would differ)
    for kernel in (module.k, module.make()):
        for kwargs in ({}, {"DT": sp.f64}):
            out = np.full(1, np.nan)
            kernel.interpret[(1,)](x, out, **kwargs)
            assert out[0] == want


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
    level but i8's 116 nested, where any call made the nested default typed; then only a call of a
    NumPy scalar type did, as sema's evaluation at module level; now both are Python's value, typed
    (NumPy's ``max`` gives ``A`` itself: the ``i8`` 100)."""
    module = import_source(SOURCE.format(expr=expr), tmp_path, "np_same")
    assert _run(module.k) == _run(module.make())
