"""Parameter annotations of a ``@sparsile.jit`` function defined in another function or in a class
body: Python evaluated them where the ``def`` is, and the kernel uses those values (never a module
global of the same name). Under ``from __future__ import annotations`` Python keeps them as text:
a name of the enclosing scope that the kernel cannot read is SP0202 at that name."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import import_source

NESTED_ANNOTATIONS = '''
import sparsile as sp

T = sp.f16   # the module's T: the annotations below are the enclosing scope's, never this one


def make(T):
    @sp.jit
    def h(v: T):
        return v * 2.0

    @sp.jit
    def k(x: sp.ptr[T], out: sp.ptr[T]):
        i = sp.arange(0, 8)
        sp.store(out + i, h(sp.load(x + i)) + 1.0)

    return k


class K:
    T = sp.f32

    @staticmethod
    @sp.jit
    def k(x: sp.ptr[T], out: sp.ptr[T]):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * 3.0)
'''


def _data(dtype: type, seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).uniform(-2.0, 2.0, 8).astype(dtype)
    return x, np.full(8, np.nan, dtype)


def test_annotations_of_a_nested_or_class_body_function_are_pythons(tmp_path) -> None:
    # They were read from the module (T = sp.f16): make(sp.f32) rejected an f32 array (SP0703)
    # and took an f16 one where f32 was meant.
    module = import_source(NESTED_ANNOTATIONS, tmp_path, "nested_annotations")
    k32, k16 = module.make(sp.f32), module.make(sp.f16)
    for kernel, dtype, seed in ((k32, np.float32, 1), (k16, np.float16, 2)):
        x, out = _data(dtype, seed)
        kernel.interpret[(1,)](x, out)
        x64 = x.astype(np.float64)
        eps = float(np.finfo(dtype).eps)
        assert np.all(np.abs(out - (x64 * 2.0 + 1.0)) <= 2 * eps * (np.abs(x64 * 2.0) + 1.0))
    x, out = _data(np.float16, 3)
    with pytest.raises(sp.LaunchError) as info:
        k32.interpret[(1,)](x, out)
    assert info.value.code == "SP0703" and "f32" in str(info.value)
    assert np.isnan(out).all()

    x, out = _data(np.float32, 4)
    module.K.k.interpret[(1,)](x, out)
    x64 = x.astype(np.float64)
    assert np.all(np.abs(out - x64 * 3.0) <= np.finfo(np.float32).eps * np.abs(x64 * 3.0))


def test_annotation_values_are_part_of_what_the_kernel_captured(tmp_path) -> None:
    # Two kernels of one source text with other annotation values must not share a disk key.
    module = import_source(NESTED_ANNOTATIONS, tmp_path, "nested_annotations")
    keys = []
    for t, dtype in ((sp.f32, np.float32), (sp.f16, np.float16)):
        kernel = module.make(t)
        x, out = _data(dtype, 5)
        _, bindings, key = kernel.bind((x, out), {})
        captures = kernel.captures_for(bindings, key)
        assert captures.still_valid()
        keys.append(captures.disk_key())
    assert keys[0] != keys[1]
    assert "annotation" in keys[0] and "f32" in keys[0] and "f16" in keys[1]


FUTURE_ANNOTATIONS = '''
from __future__ import annotations

import sparsile as sp

T = sp.f16


def make(T):
    @sp.jit
    def k(x: sp.ptr[T], out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) + 1.0)

    return k


def make_closure(S):
    @sp.jit
    def k(x: sp.ptr[S], out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i).to(S) + 1.0)

    return k


def make_global():
    @sp.jit
    def k(x: sp.ptr[sp.f32], out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) + 1.0)

    return k


class K:
    T = sp.f32

    @staticmethod
    @sp.jit
    def k(x, out: sp.ptr[T]):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i))
'''


def _at(text: str, line_needle: str, needle: str) -> tuple[int, int]:
    lines = text.splitlines()
    n = next(n for n, s in enumerate(lines, 1) if line_needle in s)
    return n, lines[n - 1].index(needle) + 1


def test_future_annotations_of_a_nested_function_never_read_the_modules_name(tmp_path) -> None:
    # Python keeps the annotations as text: `T` of `make` is gone when the kernel compiles. It was
    # the module's T (f16), silently.
    module = import_source(FUTURE_ANNOTATIONS, tmp_path, "future_annotations")
    x, out = _data(np.float32, 6)
    with pytest.raises(sp.CompileError) as info:
        module.make(sp.f32).interpret[(1,)](x, out)
    d = info.value.diagnostics[0]
    assert d.code == "SP0202"
    assert d.message == ("`T` in the annotation of a kernel defined in `make` is a variable of `make`, which "
                         "`from __future__ import annotations` leaves unevaluated")
    assert (d.span.file_line, d.span.file_col) == _at(FUTURE_ANNOTATIONS, "def k(x: sp.ptr[T]", "T]")
    assert d.help == ("remove `from __future__ import annotations` from the module (Python then evaluates the "
                      "annotation where the `def` is), or leave the parameter unannotated: its type comes from "
                      "the argument")
    with pytest.raises(sp.CompileError) as info:
        module.K.k.interpret[(1,)](x, out)
    d = info.value.diagnostics[0]
    assert d.code == "SP0202"
    assert d.message == ("`T` in the annotation of a kernel defined in `K` is a name of the class body `K`, which "
                         "`from __future__ import annotations` leaves unevaluated")
    assert (d.span.file_line, d.span.file_col) == _at(FUTURE_ANNOTATIONS, "def k(x, out: sp.ptr[T]", "T]")
    assert np.isnan(out).all()


def test_future_annotations_of_closure_and_module_names_are_read_where_python_would(tmp_path) -> None:
    module = import_source(FUTURE_ANNOTATIONS, tmp_path, "future_annotations")
    x, out = _data(np.float32, 7)
    module.make_closure(sp.f32).interpret[(1,)](x, out)   # S is in the kernel's closure: make_closure's S
    assert np.all(np.abs(out - (x.astype(np.float64) + 1.0)) <= np.finfo(np.float32).eps * (np.abs(x) + 1.0))
    out[:] = np.nan
    module.make_global().interpret[(1,)](x, out)          # sp is the module's: nothing encloses it
    assert np.all(np.abs(out - (x.astype(np.float64) + 1.0)) <= np.finfo(np.float32).eps * (np.abs(x) + 1.0))
    with pytest.raises(sp.LaunchError) as info:           # S = f16 in that closure: an f32 array is refused
        module.make_closure(sp.f16).interpret[(1,)](x, out)
    assert info.value.code == "SP0703"


NESTED_HELPER = '''
{future}
import sparsile as sp

C = sp.i32   # the module's C: a helper's `n: C` below is the enclosing function's


def make(C):
    @sp.jit
    def h(v, n: C):
        return v * n

    @sp.jit
    def k(x, out, m):
        i = sp.arange(0, 8)
        sp.store(out + i, h(sp.load(x + i), m))

    return k
'''


@pytest.mark.parametrize("future", ["", "from __future__ import annotations"])
def test_a_nested_helpers_annotation_is_read_where_python_reads_it(tmp_path, future: str) -> None:
    # `n: C` with make's C = constexpr: a run-time argument is refused (SP0201). The module's
    # C = i32 was read instead and the run-time value was taken; under PEP 563 that C is gone.
    text = NESTED_HELPER.format(future=future)
    module = import_source(text, tmp_path, "nested_helper")
    x, out = _data(np.float32, 8)
    with pytest.raises(sp.CompileError) as info:
        module.make(sp.constexpr).interpret[(1,)](x, out, 3)
    d = info.value.diagnostics[0]
    if future:
        assert d.code == "SP0202"
        assert d.message == ("`C` in the annotation of a kernel defined in `make` is a variable of `make`, which "
                             "`from __future__ import annotations` leaves unevaluated")
        assert (d.span.file_line, d.span.file_col) == _at(text, "def h(v, n: C)", "C)")
    else:
        assert d.code == "SP0201" and d.message == "`n` of `h` is constexpr but received a run-time value of type i32"
        assert (d.span.file_line, d.span.file_col) == _at(text, "h(sp.load", "h(sp.load")
    assert np.isnan(out).all()


def test_a_source_file_edited_before_the_first_compile_does_not_change_the_enclosing_scopes(tmp_path) -> None:
    # The module's symbol table was read at the first compile: lines added above `make` after the
    # kernel was made hid `make`'s T, and the module's T = f16 was taken silently.
    module = import_source(FUTURE_ANNOTATIONS, tmp_path, "future_annotations")
    kernel = module.make(sp.f32)
    path = tmp_path / f"{module.__name__}.py"
    path.write_text("# edited\n" * 5 + FUTURE_ANNOTATIONS)
    x, out = _data(np.float16, 9)
    with pytest.raises(sp.CompileError) as info:
        kernel.interpret[(1,)](x, out)
    d = info.value.diagnostics[0]
    assert d.code == "SP0202"
    assert d.message == ("`T` in the annotation of a kernel defined in `make` is a variable of `make`, which "
                         "`from __future__ import annotations` leaves unevaluated")
    assert (d.span.file_line, d.span.file_col) == _at(FUTURE_ANNOTATIONS, "def k(x: sp.ptr[T]", "T]")
    assert np.isnan(out).all()
