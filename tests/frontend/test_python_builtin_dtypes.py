"""Python's builtin ``float`` / ``int`` / ``bool`` are dtypes wherever a kernel takes one, as NumPy
reads them: ``f64`` / ``i64`` / ``bool`` (docs/language.md, "Parameter types"). They were already
that as a ``constexpr`` (``DT: sp.constexpr = float`` is ``f64``), but ``x.to(float)`` and
``sp.zeros(shape, float)`` in the body were SP0302 "dtype must be a scalar type such as `f32`, found
<python builtin float>", and ``ptr[float]`` an invalid annotation."""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.ir.printer import print_function
from sparsile.tests.support.jit_source import import_source

BODY = '''
import sparsile as sp


{indent}@sp.jit
{indent}def k(xi, xf, out_f, out_i, out_b, full_f, full_i):
{indent}    i = sp.arange(0, 8)
{indent}    sp.store(out_f + i, sp.load(xi + i).to(float))
{indent}    sp.store(out_i + i, sp.load(xf + i).to(int))
{indent}    sp.store(out_b + i, sp.load(xf + i).to(bool))
{indent}    sp.store(full_f + i, sp.full((8,), 0.1, float) + sp.zeros((8,), dtype=float))
{indent}    sp.store(full_i + i, sp.full((8,), 2**40 + 7, dtype=int))
'''

ANNOTATED = '''
import sparsile as sp


{indent}@sp.jit
{indent}def k(x: sp.ptr[float], y: sp.ptr[int], out: sp.ptr[float]):
{indent}    i = sp.arange(0, 8)
{indent}    sp.store(out + i, sp.load(x + i) * 3.0 + sp.load(y + i).to(float))
'''


def _kernel(text: str, where: str, tmp_path, name: str):
    indent = {"module": "", "function": "    ", "class": "    "}[where]
    text = text.format(indent=indent)
    if where == "function":
        text = text.replace("\n\n\n    @sp.jit", "\n\n\ndef make():\n    @sp.jit") + "    return k\n"
    elif where == "class":
        text = text.replace("\n\n\n    @sp.jit", "\n\n\nclass K:\n    @staticmethod\n    @sp.jit")
    module = import_source(text, tmp_path, name)
    return {"module": lambda: module.k, "function": lambda: module.make(), "class": lambda: module.K.k}[where]()


@pytest.mark.parametrize("where", ["module", "function", "class"])
def test_python_builtin_types_are_dtypes_in_the_body(tmp_path, where: str) -> None:
    kernel = _kernel(BODY, where, tmp_path, "builtin_dtypes_body")
    rng = np.random.default_rng(59)
    xi = rng.integers(2**40, 2**41, 8, dtype=np.int64) | 1  # odd and above 2**24: not exact in f32
    xf = rng.uniform(2.0**33, 2.0**34, 8) * rng.choice([-1.0, 1.0], 8)  # beyond i32
    xf[::3] = 0.0  # some false bools
    out_f, out_i = np.full(8, np.nan), np.full(8, -12345, np.int64)
    out_b, full_f, full_i = np.zeros(8, np.bool_), np.full(8, np.nan), np.full(8, -12345, np.int64)
    out_b[::2] = True  # poisoned: the opposite of the result for some elements
    kernel.interpret[(1,)](xi, xf, out_f, out_i, out_b, full_f, full_i)
    assert out_f.tolist() == [float(v) for v in xi]  # f64: exact
    assert out_i.tolist() == [int(v) for v in xf]  # i64: truncated toward zero, not wrapped to i32
    assert out_b.tolist() == [bool(v) for v in xf]
    assert full_f.tolist() == [0.1] * 8  # f64's 0.1, not f32's
    assert full_i.tolist() == [2**40 + 7] * 8


@pytest.mark.parametrize("where", ["module", "function", "class"])
def test_ptr_of_a_python_builtin_type_is_a_pointer_to_its_dtype(tmp_path, where: str) -> None:
    kernel = _kernel(ANNOTATED, where, tmp_path, "builtin_dtypes_ptr")
    rng = np.random.default_rng(60)
    x, y = rng.uniform(-2.0, 2.0, 8), rng.integers(-1000, 1000, 8, dtype=np.int64)
    out = np.full(8, np.nan)
    kernel.interpret[(1,)](x, y, out)
    np.testing.assert_array_equal(out, x * 3.0 + y.astype(np.float64))  # (exact in f64)
    with pytest.raises(sp.LaunchError) as info:
        kernel.interpret[(1,)](x.astype(np.float32), y, np.full(8, np.nan))
    assert (info.value.code, info.value.message) == ("SP0703", "argument `x` expects a pointer to f64, found an "
                                                               "array of f32")


def test_a_constexpr_float_and_the_body_float_are_one_dtype(tmp_path) -> None:
    # `DT=float` (a constexpr: f64 since before) and `float` in the body give the same IR
    module = import_source(CONSTEXPR, tmp_path, "builtin_dtypes_constexpr")
    x = np.random.default_rng(61).integers(2**40, 2**41, 8, dtype=np.int64) | 1
    irs = []
    for kernel in (module.k_param, module.k_body):
        out = np.full(8, np.nan)
        kernel.interpret[(1,)](x, out)
        assert out.tolist() == [float(v) for v in x]
        irs.append(re.sub(r"@\w+\(", "@k(", print_function(kernel.ir(x, out)), count=1).replace("DT=f64, ", ""))
    assert irs[0] == irs[1]


CONSTEXPR = '''
import sparsile as sp


@sp.jit
def k_param(x, out, DT: sp.constexpr = float):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i).to(DT))


@sp.jit
def k_body(x, out):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i).to(float))
'''


SCALAR_ANNOTATION = '''
import sparsile as sp


{indent}@sp.jit
{indent}def k(out, a: {name}):
{indent}    sp.store(out, a)
'''


@pytest.mark.parametrize("where", ["module", "function"])
@pytest.mark.parametrize("name, help", [
    ("float", "write `f32` or `f64` (an unannotated Python float at a launch is `f32`; as a dtype, e.g. "
              "`x.to(float)`, Python's float is `f64`)"),
    ("int", "write `i32` or `i64` (an unannotated Python int at a launch is `i32`; as a dtype, e.g. `x.to(int)`, "
            "Python's int is `i64`)"),
])
def test_a_scalar_annotated_with_a_python_builtin_type_says_which_type_to_write(tmp_path, where: str, name: str,
                                                                                help: str) -> None:
    """A scalar parameter annotated ``a: float`` stays SP0302 (unannotated, a Python float given at a
    launch is f32, while ``float`` as a dtype is f64: the annotation must say which), now with a help
    naming the choice (it had none)."""
    kernel = _kernel(SCALAR_ANNOTATION.replace("{name}", name), where, tmp_path, f"builtin_scalar_{name}")
    with pytest.raises(sp.CompileError) as info:
        kernel.interpret[(1,)](np.zeros(1), 1)
    d = info.value.diagnostics[0]
    assert d.code == "SP0302"
    assert d.message.startswith("the annotation of `a` must be a type such as `i32`, `ptr[f16]`, `tensor[f16, 2]` "
                                "or `constexpr`, found ")
    assert d.help == f"a scalar parameter's annotation names the language's type: {help}"
    source = next(tmp_path.glob(f"builtin_scalar_{name}*.py")).read_text().split("\n")
    assert source[d.span.file_line - 1][d.span.file_col - 1:] == f"{name}):"  # (the annotation, in the file)
    assert d.span.end_col - d.span.col == len(name)
