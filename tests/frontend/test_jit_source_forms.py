"""``@sparsile.jit`` over unusual Python source forms: each computes what Python computes on the
same inputs, or is reported with a diagnostic at the user's own source line, with a help text."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import import_source

WRAPPING_DECORATOR = '''
import functools

SCALE = 100.0   # not the kernel module's SCALE: the kernel must never read it


def logged(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper
'''

KERNEL_UNDER_A_WRAPPER = '''
import sparsile as sp
{decorators}

SCALE = 2.0


def make():
    factor = 3.0

    @sp.jit
    @decorators.logged
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * SCALE * factor)

    @sp.jit
    @decorators.logged
    def bad(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * undefined_name)

    return k, bad
'''


def test_a_functools_wraps_decorator_below_jit_reads_the_kernels_own_names(tmp_path) -> None:
    # The wrapper's globals (another module's SCALE) and closure (`f`) were read instead of the
    # kernel's, and its first line placed every span a few lines off.
    decorators = import_source(WRAPPING_DECORATOR, tmp_path, "wrapping_decorator")
    sys.modules[decorators.__name__] = decorators
    try:
        text = KERNEL_UNDER_A_WRAPPER.format(decorators=f"import {decorators.__name__} as decorators")
        module = import_source(text, tmp_path, "under_a_wrapper")
    finally:
        del sys.modules[decorators.__name__]
    k, bad = module.make()
    x = np.random.default_rng(52).uniform(-2.0, 2.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    k.interpret[(1,)](x, out)
    np.testing.assert_allclose(out, x.astype(np.float64) * 2.0 * 3.0, rtol=1e-6)

    with pytest.raises(sp.CompileError) as info:
        bad.interpret[(1,)](x, out)
    d = info.value.diagnostics[0]
    assert d.code == "SP0202" and d.message == "unknown name `undefined_name`"
    lines = text.splitlines()
    line = next(n for n, s in enumerate(lines, 1) if "* undefined_name" in s)
    assert (d.span.file_line, d.span.file_col) == (line, lines[line - 1].index("undefined_name") + 1)


def decoration_error(tmp_path, body: str) -> tuple[sp.Diagnostic, list[str]]:
    """The first diagnostic raised when ``@sp.jit`` decorates ``def k(x, out)`` with ``body``
    (in a real file), and that file's lines."""
    text = "import sparsile as sp\n\n\n@sp.jit\ndef k(x, out):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    with pytest.raises(sp.CompileError) as info:
        import_source(text, tmp_path, "decorated")
    return info.value.diagnostics[0], text.splitlines()


def at(lines: list[str], needle: str) -> tuple[int, int]:
    """The (line, column) of the first ``needle`` in ``lines``, both 1-based."""
    n = next(n for n, s in enumerate(lines, 1) if needle in s)
    return n, lines[n - 1].index(needle) + 1


@pytest.mark.parametrize("body, needle", [
    ("i = sp.arange(0, 8)\nt = [j * 2 for j in (1, 2)]\n", "for j"),
    ("s = sum(j for j in (1, 2))\n", "for j"),
    ("t = (1, [j for j in (1, 2) if j > 1])\n", "for j"),
])
def test_comprehensions_are_reported_as_unsupported_as_the_docs_say(tmp_path, body: str, needle: str) -> None:
    # was SP0110 "expected `]`, an operator or `,`, found `for`", which does not say why
    d, lines = decoration_error(tmp_path, body)
    assert d.code == "SP0113"
    assert d.message == "comprehensions and generator expressions are not supported in kernels"
    assert (d.span.file_line, d.span.file_col) == at(lines, needle)
    assert "static_range" in (d.help or "")


@pytest.mark.parametrize("body, needle", [
    ("a, *b = 1.0, 2.0, 3.0\n", "*b"),
    ("t = (1, *(2, 3))\n", "*("),
])
def test_starred_expressions_are_reported_as_unsupported(tmp_path, body: str, needle: str) -> None:
    # was SP0111 "expected an expression, ..., found `*`"
    d, lines = decoration_error(tmp_path, body)
    assert d.code == "SP0113"
    assert d.message == "starred expressions (`*x`) are not supported in kernels"
    assert (d.span.file_line, d.span.file_col) == at(lines, needle)
    assert "t[1:]" in (d.help or "")


LATE_CLOSURE = '''
import sparsile as sp


def make():
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * late)

    def assign(value):
        nonlocal late
        late = value

    late_name_is_bound_below = k, assign
    late = None
    del late
    return late_name_is_bound_below
'''


def test_a_closure_variable_not_yet_assigned_says_so_and_is_read_once_assigned(tmp_path) -> None:
    # was "unknown name `late`" with the help "did you mean `float8e5`?"
    module = import_source(LATE_CLOSURE, tmp_path, "late_closure")
    k, assign = module.make()
    x = np.random.default_rng(7).uniform(-2.0, 2.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        k.interpret[(1,)](x, out)
    d = info.value.diagnostics[0]
    assert d.code == "SP0202"
    assert d.message == "`late` is a variable of an enclosing function that has no value yet"
    lines = LATE_CLOSURE.splitlines()
    assert (d.span.file_line, d.span.file_col) == at(lines, "late)")
    assert "before the kernel's first launch" in (d.help or "")
    assert np.isnan(out).all()
    assign(1.5)   # the cell now holds a value: the next launch reads it
    k.interpret[(1,)](x, out)
    np.testing.assert_allclose(out, x.astype(np.float64) * 1.5, rtol=1e-6)


STRING_ANNOTATION = '''
import sparsile as sp


@sp.jit
def k(x: "sp.ptr[sp.f32]", out):
    i = sp.arange(0, 8)
    n: "sp.i32" = 3
    sp.store(out + i, sp.load(x + i) + n)
'''


def test_a_quoted_annotation_says_to_remove_the_quotes(tmp_path) -> None:
    module = import_source(STRING_ANNOTATION, tmp_path, "quoted_annotation")
    x, out = np.ones(8, np.float32), np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](x, out)
    lines = STRING_ANNOTATION.splitlines()
    d = info.value.diagnostics[0]
    assert d.code == "SP0302" and d.message == ("the annotation of `x` must be a type such as `i32`, `ptr[f16]`, "
                                                "`tensor[f16, 2]` or `constexpr`, found 'sp.ptr[sp.f32]'")
    assert (d.span.file_line, d.span.file_col) == at(lines, '"sp.ptr')
    assert d.help == "kernel annotations are read as code, not as text: write `sp.ptr[sp.f32]` without the quotes"
    # the annotation of a local too (the first error stops the compile: fix `x` and look again)
    fixed = STRING_ANNOTATION.replace('x: "sp.ptr[sp.f32]"', "x")
    module = import_source(fixed, tmp_path, "quoted_annotation")
    with pytest.raises(sp.CompileError) as info:
        module.k.interpret[(1,)](x, out)
    lines = fixed.splitlines()
    d = info.value.diagnostics[0]
    assert d.code == "SP0302"
    assert d.message == "an annotation must be a type such as `i32` or `constexpr`, found 'sp.i32'"
    assert (d.span.file_line, d.span.file_col) == at(lines, '"sp.i32"')
    assert d.help == "kernel annotations are read as code, not as text: write `sp.i32` without the quotes"
    assert np.isnan(out).all()


TRITON_CONSTEXPR_GLOBAL = '''
import sparsile as sp

BLOCK = sp.constexpr(8)          # Triton's `BLOCK = tl.constexpr(8)`
SCALE: sp.constexpr = 2.5        # Triton's `SCALE: tl.constexpr = 2.5`


@sp.jit
def k(x, out):
    i = sp.arange(0, BLOCK)
    sp.store(out + i, sp.load(x + i) * SCALE + sp.constexpr(BLOCK // 2))


@sp.jit
def bad(x, out, n):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * sp.constexpr(n))
'''


def test_triton_constexpr_globals_and_constexpr_calls(tmp_path) -> None:
    # `sp.constexpr(8)` was a TypeError from Python ('ConstexprType' object is not callable) when
    # the module was imported, and SP0332 "the type constexpr is not callable" in a kernel
    module = import_source(TRITON_CONSTEXPR_GLOBAL, tmp_path, "constexpr_global")
    assert module.BLOCK == 8
    x = np.random.default_rng(3).uniform(-2.0, 2.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    module.k.interpret[(1,)](x, out)
    x64 = x.astype(np.float64)
    bound = 2 * np.finfo(np.float32).eps * (np.abs(x64) * 2.5 + 4)   # two f32 roundings
    assert np.all(np.abs(out - (x64 * 2.5 + 4)) <= bound)

    out[:] = np.nan
    with pytest.raises(sp.CompileError) as info:
        module.bad.interpret[(1,)](x, out, 3)
    d = info.value.diagnostics[0]
    assert d.code == "SP0201"
    assert d.message == "the argument of `constexpr(...)` must be a compile-time constant, found a run-time value"
    assert (d.span.file_line, d.span.file_col) == at(TRITON_CONSTEXPR_GLOBAL.splitlines(), "n))")
    assert "constexpr" in (d.help or "") and np.isnan(out).all()


NESTED_DEFAULTS = '''
import sparsile as sp

SC = 100.0   # the module's SC: Python's defaults below are the enclosing scope's, never this one


def make(sc):
    SC = sc

    @sp.jit
    def h(v, f=SC):
        return v * f

    @sp.jit
    def k(x, out, g: sp.constexpr = SC):
        i = sp.arange(0, 8)
        sp.store(out + i, h(sp.load(x + i)) + g)

    return k


class K:
    SC = 3.0

    @staticmethod
    @sp.jit
    def k(x, out, *, g: sp.constexpr = SC * 2):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) + g)
'''


def test_defaults_of_a_nested_or_class_body_function_are_pythons(tmp_path) -> None:
    # Python evaluates a default where the `def` is: the enclosing function's or class body's
    # names. They were read from the module instead (SC = 100.0): wrong numbers.
    module = import_source(NESTED_DEFAULTS, tmp_path, "nested_defaults")
    x = np.random.default_rng(11).uniform(-2.0, 2.0, 8).astype(np.float32)
    x64 = x.astype(np.float64)
    eps = np.finfo(np.float32).eps
    for sc in (2.0, -1.5):   # a kernel per factory call, each with its own defaults
        out = np.full(8, np.nan, np.float32)
        module.make(sc).interpret[(1,)](x, out)
        assert np.all(np.abs(out - (x64 * sc + sc)) <= 2 * eps * (np.abs(x64 * sc) + abs(sc)))
    out = np.full(8, np.nan, np.float32)
    module.K.k.interpret[(1,)](x, out)
    assert np.all(np.abs(out - (x64 + 6.0)) <= eps * (np.abs(x64) + 6.0))
