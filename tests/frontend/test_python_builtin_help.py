"""Help lines that are true and advice that works for Python in a kernel: a library function with a
language builtin of its name is named with the builtin's signature (``np.zeros(4)`` is
``zeros(shape, dtype)`` here) and where they differ the help says how (``math.floor`` returns an
int, the language's ``floor`` a float); ``operator.add`` is not "a _operator function"; ``np.max``
is the NumPy function `max` (was a Python `_ArrayFunctionDispatcher` object); a Python built-in
with no kernel meaning (``dict``, ``ValueError``, ``round``, ``getattr``) has a help line (had
none, or "did you mean `store`?" for ``sorted``), in @jit and .spk kernels; ``isinstance(B, int)``
folds as the docs say (``int`` was no type to it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import first_compile_error, import_source, run_one_f32

PRELUDE = "import math\nimport operator\n\nimport numpy as np\n\nimport sparsile as sp\n"


def _jit(body: str, folder: Any) -> Any:
    text = PRELUDE + f"\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n{body}"
    return import_source(text, folder, "builtin_help"), text


def _jit_error(expr: str, folder: Any) -> Any:
    module, text = _jit(f"    y = {expr}\n    sp.store(X, 1.0)\n", folder)
    d = first_compile_error(module)
    line = text.split("\n")[d.span.file_line - 1]
    head = expr.partition("(")[0]
    assert line[d.span.file_col - 1:].startswith(head), (line, d.span)
    return d


def _spk_error(expr: str) -> Any:
    text = f"@kernel\ndef k(X: ptr[f32]):\n    y = {expr}\n    store(X, 1.0)\n"
    with pytest.raises(sp.CompileError) as info:
        sp.loads(text, "builtins.spk").kernels["k"].interpret[(1,)](np.full(1, np.nan, np.float32))
    d = info.value.diagnostics[0]
    assert text.split("\n")[d.span.file_line - 1][d.span.file_col - 1:].startswith(expr.partition("(")[0])
    return d


_LIB = ": a {} function does not run in a kernel"
CALL_CASES = [
    ("np.zeros(4)", "the NumPy function `zeros`",
     "use the language's `zeros(shape, dtype)` (`sparsile.zeros`)" + _LIB.format("numpy")),
    ("np.max(X)", "the NumPy function `max`",
     "use the language's `max(x, axis=None, keep_dims=None)` (`sparsile.max`)" + _LIB.format("numpy")),
    ("math.log(2.0, 3.0)", "the Python function `log`", "use the language's `log(x)` (`sparsile.log`)"
     + _LIB.format("math")),
    ("np.abs(2.0)", "the NumPy function `absolute`", "use the language's `abs(x)` (`sparsile.abs`)"
     + _LIB.format("numpy")),
    ("math.floor(2.5)", "the Python function `floor`",
     "`math.floor` returns an int; the language's `floor(x)` (`sparsile.floor`) returns a float of x's type: "
     "`floor(x).to(i32)` is the integer"),
    ("math.ceil(2.5)", "the Python function `ceil`",
     "`math.ceil` returns an int; the language's `ceil(x)` (`sparsile.ceil`) returns a float of x's type: "
     "`ceil(x).to(i32)` is the integer"),
    ("math.trunc(2.5)", "the Python function `trunc`",
     "the language has no `trunc`: of a float tile `x.to(i32)` truncates toward zero (docs/language.md rule 8); "
     "of a compile-time constant `int(x)` does"),
    ("math.fabs(2.5)", "the Python function `fabs`", "use the language's `abs(x)` (`sparsile.abs`)"),
    ("math.pow(2.0, 3.0)", "the Python function `pow`", "write `x ** y`"),
    ("operator.add(1, 2)", "the Python function `add`",
     "write the operator itself (`a + b`, `a[i]`): an `operator` function does not run in a kernel"),
]


@pytest.mark.parametrize(("expr", "named", "help_"), CALL_CASES, ids=[c[0] for c in CALL_CASES])
def test_a_library_call_names_the_language_spelling_truly(expr: str, named: str, help_: str, tmp_path) -> None:
    d = _jit_error(expr, tmp_path)
    assert (d.code, d.message, d.help) == ("SP0332", f"{named} is not callable in a kernel", help_)


def test_the_library_helps_advice_computes_what_python_does(tmp_path) -> None:
    """floor(x).to(i32), ceil(x).to(i32), x.to(i32), abs, `**` and int(2.5) as the helps above say,
    against the float64 values of math's functions (x = 2.7, one element, poisoned output)."""
    body = ("    x = sp.load(X)\n"
            "    sp.store(X, (sp.floor(x).to(sp.i32) * 1000 + sp.ceil(x).to(sp.i32) * 100 + x.to(sp.i32) * 10"
            " + int(2.5)).to(sp.f32) + sp.abs(-x) ** 2.0)\n")
    module, _ = _jit(body, tmp_path)
    x = np.array([2.7], np.float32)
    module.k.interpret[(1,)](x)
    v = float(np.float32(2.7))
    want = (np.floor(v) * 1000 + np.ceil(v) * 100 + np.trunc(v) * 10 + 2) + abs(-v) ** 2.0
    assert x[0] == pytest.approx(want, rel=1e-6)  # (`**` is ex2/lg2 approx in f32)


_CONTAINER = ("a kernel has no dicts, lists or sets: its only container is a tuple (`(a, b)`, indexed by constants; "
              "lists are tuples); run-time data lives in tiles")
_EXCEPTION = ("a kernel cannot raise exceptions: check with `assert cond, \"message\"` (at run time, by the "
              "interpreter) or `static_assert(cond, \"message\")` at compile time")
_SUPPORTED = ("`len`, `int`, `float`, `bool`, `abs`, `min`, `max`, `sum`, `tuple`, `str` and `isinstance` on "
              "compile-time values")
BUILTIN_CASES = [
    ("dict()", _CONTAINER),
    ("list((1, 2))", _CONTAINER),
    ("set()", _CONTAINER),
    ("ValueError(\"bad\")", _EXCEPTION),
    ("zip((1,), (2,))", "a `for` loop iterates over `range(...)` or `static_range(...)` only: loop over the indices "
     "and index the tuples (`for i in static_range(len(t)):`)"),
    ("getattr(X, \"dtype\")", "a kernel reads an attribute by writing it (`obj.name`, a compile-time constant under "
     "@jit); there is no lookup by a string"),
    ("round(2.5)", "the language has no `round`: `floor(x)` / `ceil(x)` round a float down / up; `x.to(i32)` "
     "truncates toward zero"),
    ("slice(1, 2)", "a kernel has no slice objects: write the subscript (`t[1:3]` of a tuple, `x[:, None]` of a tile)"),
    ("object()", f"`object` is a Python class; a kernel creates no objects. Python built-ins a kernel can call: "
     f"{_SUPPORTED}"),
    ("sorted((2, 1))", f"`sorted` is a Python built-in with no meaning in a kernel; those a kernel can call: "
     f"{_SUPPORTED}"),
    ("any((True,))", "combine conditions with `or`; a tile of bools `m` has a true element where "
     "`max(m.to(i32)) == 1`"),
]


@pytest.mark.parametrize(("expr", "help_"), BUILTIN_CASES, ids=[c[0] for c in BUILTIN_CASES])
def test_a_python_builtin_without_kernel_meaning_has_help(expr: str, help_: str, tmp_path) -> None:
    name = expr.partition("(")[0]
    for d in (_jit_error(expr, tmp_path), _spk_error(expr)):
        assert (d.code, d.message, d.help) == ("SP0202", f"unknown name `{name}`", help_)


def test_a_name_that_is_no_builtin_keeps_its_guess(tmp_path) -> None:
    """The built-in helps do not replace the near-name guess for a user's typo."""
    d = _spk_error("stor(X, 1.0)")
    assert (d.code, d.message, d.help) == ("SP0202", "unknown name `stor`", "did you mean `store`?")


def test_the_builtin_helps_advice_works(tmp_path) -> None:
    """A tuple indexed in a static_range loop, tuple slicing, any/all through max/min of a bool tile
    converted: the spellings the helps give, computed in the interpreter against Python's."""
    body = ("    t = (1.5, 2.25, 4.0)\n    s = 0.0\n    for i in sp.static_range(len(t)):\n        s = s + t[i]\n"
            "    u = t[1:3]\n    m = sp.arange(0, 16) < 3\n"
            "    a = sp.min(m.to(sp.i32)) == 1\n    b = sp.max(m.to(sp.i32)) == 1\n"
            "    sp.store(X, s * 100.0 + u[0] * 10.0 + sp.where(a, 2.0, 0.0) + sp.where(b, 1.0, 0.0))\n")
    module, _ = _jit(body, tmp_path)
    m = np.arange(16) < 3
    want = sum((1.5, 2.25, 4.0)) * 100 + 2.25 * 10 + (2.0 if m.all() else 0.0) + (1.0 if m.any() else 0.0)
    assert run_one_f32(module)[0] == np.float32(want)


def test_isinstance_of_a_python_type_folds(tmp_path) -> None:
    """docs/language.md: `isinstance` on constants; `int` was no type to it (SP0331)."""
    body = ("    sp.static_assert(isinstance(2, int))\n    sp.static_assert(not isinstance(2.5, (int, str)))\n"
            "    sp.store(X, 3.0 if isinstance(2.5, float) else 0.0)\n")
    module, _ = _jit(body, tmp_path)
    assert run_one_f32(module)[0] == 3.0


def test_isinstance_of_bool_folds(tmp_path) -> None:
    """`bool` in a kernel is the language's bool type; as isinstance's class it is Python's bool (it was
    SP0331 "arg 2 must be a type"), alone and in a tuple, in @jit and .spk kernels."""
    body = ("    sp.static_assert(isinstance(True, bool))\n    sp.static_assert(not isinstance(2, bool))\n"
            "    sp.static_assert(isinstance(False, (str, bool)))\n"
            "    sp.store(X, 3.0 if isinstance(B, bool) else 0.0)\n")
    module, _ = _jit(body.replace("B, bool", "True, bool"), tmp_path)
    assert run_one_f32(module)[0] == 3.0
    text = ("@kernel\ndef k(X: ptr[f32], B: constexpr):\n    static_assert(isinstance(B, bool))\n"
            "    static_assert(not isinstance(1, bool))\n    store(X, 3.0)\n")
    x = np.full(1, np.nan, np.float32)
    sp.loads(text, "isinstance_bool.spk").kernels["k"].interpret[(1,)](x, B=True)
    assert x[0] == 3.0
