"""``@sparsile.jit`` end to end from real Python files, and the public API of ``import sparsile``."""

from __future__ import annotations

import importlib.util
import inspect
import math
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import sparsile
import sparsile as sp
from sparsile import arange, jit, load, program_id, store
from sparsile.frontend.ir import types as T
from sparsile.frontend.sema.builtins import ROOT
from sparsile.frontend.sema.values import Builtin, Namespace

SCALE = 2.5                      # a Python global: a compile-time constant in kernels
SHAPE = (4, 8)                   # tuples too
HALF = np.float16                # numpy dtypes become language dtypes


def plain_python(x):
    return x * 2


@sp.jit
def triple(x, extra=0.0):
    """A @jit helper: inlined where a kernel calls it."""
    return x * 3 + extra


@sp.jit
def split_halves(x, B: sp.constexpr):
    return x[: B // 2], x[B // 2:]


@sp.jit(num_warps=8)
def axpy(x: sp.ptr[sp.f32], y: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    a = sp.load(x + offs, mask=mask)
    sp.store(out + offs, triple(a, extra=1.0) + SCALE * sp.load(y + offs, mask=mask), mask=mask)


@jit
def unqualified(x, out, n, BLOCK: sp.constexpr):  # names imported with `from sparsile import ...`
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n).to(HALF), mask=offs < n)


@sparsile.jit
def globals_and_modules(out):
    r = sp.arange(0, SHAPE[1])
    v = sp.full(SHAPE, math.pi, sp.f32) + r[None, :]
    sp.store(out + sp.arange(0, SHAPE[0])[:, None] * SHAPE[1] + r[None, :], v)


class Kernels:
    """Kernels defined in a class body: their source is indented."""

    OFFSET = 7

    @staticmethod
    @sp.jit
    def fill(out, n, BLOCK: sp.constexpr):
        i = sp.arange(0, BLOCK)
        sp.store(out + i, i.to(sp.f32) + 7, mask=i < n)


def make_scaler(factor: float, block: int):
    """A kernel built in a function: `factor` and `block` are closure constants."""

    @sp.jit
    def scaler(x, out, n):
        offs = sp.program_id(0) * block + sp.arange(0, block)
        m = offs < n
        sp.store(out + offs, sp.load(x + offs, mask=m) * factor, mask=m)

    return scaler


def rand(n: int, dtype=np.float32) -> np.ndarray:
    x = np.random.default_rng(n).uniform(-3, 3, n)
    x[x == 0] = 1.0
    return x.astype(dtype)


# ------------------------------------------------------------------------------------ running
def test_qualified_names_globals_and_jit_helpers() -> None:
    x, y = rand(1000), rand(1000) + 1
    out = np.zeros_like(x)
    axpy.interpret[(4,)](x, y, out, 1000, BLOCK=256)
    np.testing.assert_allclose(out, x.astype(np.float64) * 3 + 1 + 2.5 * y, rtol=1e-6, atol=1e-6)
    assert axpy.ir(x, y, out, 1000, BLOCK=256).attrs["num_warps"] == 8


def test_names_imported_from_sparsile_and_numpy_dtype_globals() -> None:
    x = rand(50)
    out = np.zeros(50, np.float32)
    unqualified.interpret[(1,)](x, out, 50, BLOCK=64)
    assert np.array_equal(out, x.astype(np.float16).astype(np.float32))


def test_python_modules_and_tuple_globals() -> None:
    out = np.zeros(SHAPE, np.float32)
    globals_and_modules.interpret[(1,)](out)
    assert np.array_equal(out, np.float32(math.pi) + np.arange(8, dtype=np.float32)[None, :].repeat(4, 0))


def test_kernel_in_a_class_body() -> None:
    out = np.zeros(16, np.float32)
    Kernels.fill.interpret[(1,)](out, 10, BLOCK=16)
    assert np.array_equal(out[:10], np.arange(10) + Kernels.OFFSET) and np.all(out[10:] == 0)


def test_closure_constants() -> None:
    x = rand(300)
    for factor in (0.5, -2.0):
        out = np.zeros_like(x)
        make_scaler(factor, 128).interpret[(3,)](x, out, 300)
        assert np.array_equal(out, x * np.float32(factor))


def test_jit_helper_with_constexpr_returning_tuples() -> None:
    @sp.jit
    def k(out, B: sp.constexpr):
        lo, hi = split_halves((B, B + 1, B + 2, B + 3), B=4)
        sp.store(out + sp.arange(0, 2), sp.full((2,), lo[1] * 100 + hi[0], sp.i32))

    out = np.zeros(2, np.int32)
    k.interpret[(1,)](out, B=4)
    assert np.array_equal(out, [(4 + 1) * 100 + 4 + 2] * 2)


def test_nested_kernel_source_keeps_real_file_positions() -> None:
    @sp.jit
    def broken(out):
        x = sp.arange(0, 10)  # not a power of two
        sp.store(out, x)

    with pytest.raises(sp.CompileError) as info:
        broken.ir(np.zeros(16, np.float32))
    lines, first = inspect.getsourcelines(test_nested_kernel_source_keeps_real_file_positions)
    want_line = first + next(i for i, ln in enumerate(lines) if "sp.arange(0, 10)" in ln)
    want_col = lines[want_line - first].index("sp.arange(0, 10)") + 1
    d = info.value.diagnostics[0]
    assert d.code == "SP0301"
    assert (d.span.file_line, d.span.file_col) == (want_line, want_col)
    assert f"test_jit.py:{want_line}:{want_col}" in str(info.value)
    assert "x = sp.arange(0, 10)" in str(info.value)  # the real, indented source line is shown


def test_calling_a_plain_python_function_says_how_to_fix_it() -> None:
    @sp.jit
    def k(out):
        sp.store(out, plain_python(1.0))

    with pytest.raises(sp.CompileError) as info:
        k.ir(np.zeros(1, np.float32))
    d = info.value.diagnostics[0]
    assert d.code == "SP0332" and "plain_python" in d.message and "@sparsile.jit" in (d.help or "")


def test_kernel_from_a_separate_module_file(tmp_path) -> None:
    path = tmp_path / "user_kernels.py"
    path.write_text(textwrap.dedent("""
        import sparsile as sp

        BLOCK = 32

        def outer():
            @sp.jit
            def inner(out, n):
                i = sp.arange(0, BLOCK)
                sp.store(out + i, (i * i).to(sp.f32), mask=i < n)
            return inner

        kernel = outer()
    """))
    spec = importlib.util.spec_from_file_location("user_kernels", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = np.zeros(32, np.float32)
    mod.kernel.interpret[(1,)](out, 20)
    assert np.array_equal(out[:20], np.arange(20.0) ** 2) and np.all(out[20:] == 0)


def test_kernels_are_not_called_directly_and_options_are_checked() -> None:
    with pytest.raises(RuntimeError, match="must be launched with a grid"):
        axpy(1, 2)
    with pytest.raises(TypeError, match="unknown kernel option `num_warpz`"):
        sp.jit(num_warpz=4)


# ------------------------------------------------------------------------------------ public API
def test_every_language_name_is_an_attribute() -> None:
    for name, member in ROOT.members.items():
        if name == "load":
            continue  # the Python-side `sparsile.load` reads .spk files (tested below)
        got = getattr(sparsile, name)
        expected = member.value if hasattr(member, "value") and not isinstance(member, Builtin) else member
        assert got is expected or got == expected, name
    assert sp.f16 is T.f16 and sp.ptr[sp.f16] == T.PointerType(T.f16) and sp.tensor[sp.f32, 2].rank == 2
    assert sp.constexpr is T.CONSTEXPR and isinstance(sp.program_id, Builtin)
    assert {"jit", "load", "loads", "CompileError", "LaunchError", "InternalError", "Diagnostic"} <= set(sp.__all__)
    assert "max" not in sp.__all__ and "sum" not in sp.__all__  # would shadow Python builtins
    namespaces = [n for n, m in ROOT.members.items() if isinstance(m, Namespace)]
    for n in namespaces:
        assert isinstance(getattr(sp, n), Namespace)


def test_load_reads_spk_files_from_python_and_loads_in_kernels(tmp_path) -> None:
    path = tmp_path / "k.spk"
    path.write_text("@kernel\ndef double(x: ptr[f32], n: i32, B: constexpr):\n"
                    "    i = arange(0, B)\n    store(x + i, load(x + i, mask=i < n) * 2, mask=i < n)\n")
    module = sp.load(path)
    x = rand(10)
    want = x * 2
    module.double.interpret[(1,)](x, 10, B=16)
    assert np.array_equal(x, want)
    with pytest.raises(sp.CompileError, match="SP0240"):
        sp.load(tmp_path / "missing.spk")


def test_import_is_light() -> None:
    code = ("import sys, sparsile; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('llvmlite', 'cuda', 'lark', 'torch')]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_functions_without_source_are_a_diagnostic() -> None:
    fn = eval("lambda out: None")  # no source file to read
    with pytest.raises(sp.CompileError) as info:
        sp.jit(fn)
    d = info.value.diagnostics[0]
    assert d.code == "SP0241" and "cannot read the source" in d.message and "sparsile.loads" in (d.help or "")


ANNOTATED_WITH_NUMPY = '''
import ml_dtypes
import numpy as np
import sparsile as sp


@sp.jit
def widen(x: sp.ptr[np.uint32], out: sp.ptr[ml_dtypes.bfloat16], t: sp.tensor[np.float16, 2]):
    i = sp.arange(0, 16)
    sp.store(out + i, sp.load(x + i).to(sp.bf16))


@sp.jit
def bad(x: sp.ptr[3]):
    pass


EVALUATED = (sp.ptr[np.uint32], sp.tensor[np.float16, 2], sp.ptr[ml_dtypes.bfloat16], sp.ptr[3])
'''


def test_annotations_python_evaluates_take_numpy_types_and_defer_errors(tmp_path) -> None:
    """Without ``from __future__ import annotations`` Python evaluates ``sp.ptr[...]`` when the
    function is defined: NumPy / ml_dtypes types stand for their scalar types there too (was a
    TypeError at ``def``), and an invalid parameter is reported by the compiler at its span (SP0302)
    instead of failing the definition."""
    path = tmp_path / "annotated_with_numpy.py"
    path.write_text(ANNOTATED_WITH_NUMPY)
    spec = importlib.util.spec_from_file_location("annotated_with_numpy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # defining the functions must not raise
    ptr_u32, tensor_f16, ptr_bf16, invalid = mod.EVALUATED
    assert (ptr_u32, tensor_f16, ptr_bf16) == (T.PointerType(T.u32), T.TensorType(T.f16, 2), T.PointerType(T.bf16))
    assert str(invalid) == "`ptr[...]` takes one scalar element type, e.g. `ptr[f32]`"
    rng = np.random.default_rng(3)
    x = rng.integers(1, 2**20, 16, dtype=np.uint32)
    import ml_dtypes

    out = np.full(16, np.nan, ml_dtypes.bfloat16)
    t = np.ones((2, 2), np.float16)
    mod.widen.interpret[(1,)](x, out, t)
    assert (out.astype(np.float64) == x.astype(ml_dtypes.bfloat16).astype(np.float64)).all()
    with pytest.raises(sparsile.CompileError) as info:
        mod.bad.interpret[(1,)](x)
    d = info.value.diagnostics[0]
    assert (d.code, d.message) == ("SP0302", "`ptr[...]` takes one scalar element type, e.g. `ptr[f32]`")
    assert d.span.file_line == 14 and ANNOTATED_WITH_NUMPY.split("\n")[13][d.span.file_col - 1:][:9] == "sp.ptr[3]"
    assert d.span.end_col - d.span.col == len("sp.ptr[3]")


PYTHON_API_IN_KERNELS = '''
import sparsile as sp
from sparsile import jit


@sp.jit
def annotated(X: sp.ptr[sp.f32], M: jit):
    sp.store(X, 1.0)


@sp.jit
def reads_the_decorator(X: sp.ptr[sp.f32]):
    y = sp.kernel
    sp.store(X, 1.0)


@sp.jit
def reads_an_error_class(X: sp.ptr[sp.f32]):
    y = sp.CompileError
    sp.store(X, 1.0)


@sp.jit
def annotates_a_local(X: sp.ptr[sp.f32]):
    y: jit = 1.0
    sp.store(X, y)
'''


def _diagnostic_of(kern: Any, x: np.ndarray) -> Any:
    with pytest.raises(sparsile.CompileError) as info:
        kern.interpret[(1,)](x)
    return info.value.diagnostics[0]


def test_python_api_objects_in_a_kernel_are_named_as_such(tmp_path) -> None:
    """``sparsile``'s Python API in a kernel: an annotation that is a Python function is SP0302
    naming the function (was its repr, ``<function jit at 0x...>``), and ``sp.kernel`` /
    ``sp.CompileError`` are SP0204 saying they are not names of the kernel language (was
    "`sparsile` has no member `kernel`", which the module has)."""
    path = tmp_path / "python_api_in_kernels.py"
    path.write_text(PYTHON_API_IN_KERNELS)
    spec = importlib.util.spec_from_file_location("python_api_in_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = np.full(1, np.nan, np.float32)
    lines = PYTHON_API_IN_KERNELS.split("\n")
    d = _diagnostic_of(mod.annotated, x)
    assert (d.code, d.message) == ("SP0302", "the annotation of `M` must be a type such as `i32`, `ptr[f16]`, "
                                   "`tensor[f16, 2]` or `constexpr`, found the Python function `jit`")
    assert lines[d.span.file_line - 1][d.span.file_col - 1:].startswith("jit)")
    d = _diagnostic_of(mod.reads_the_decorator, x)
    assert (d.code, d.message) == ("SP0204", "`sparsile.kernel` is a decorator of sparsile's Python API, not a "
                                   "name of the kernel language")
    assert d.help == "`sparsile.kernel` is the decorator that makes a kernel; it has no meaning inside one"
    assert lines[d.span.file_line - 1][d.span.file_col - 1:].startswith("kernel")
    d = _diagnostic_of(mod.reads_an_error_class, x)
    assert (d.code, d.message) == ("SP0204", "`sparsile.CompileError` is a class of sparsile's Python API, not a "
                                   "name of the kernel language")
    assert d.help == ("inside a kernel, `sparsile.` names the language's builtins, types and constants "
                      "(docs/language.md)")
    d = _diagnostic_of(mod.annotates_a_local, x)
    assert (d.code, d.message) == ("SP0302", "an annotation must be a type such as `i32` or `constexpr`, found "
                                   "the Python function `jit`")
    assert lines[d.span.file_line - 1][d.span.file_col - 1:].startswith("jit = 1.0")
    assert np.isnan(x).all()
