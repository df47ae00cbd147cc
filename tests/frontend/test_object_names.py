"""What a diagnostic calls a compile-time object a kernel reads: a phrase, never a Python repr
(``<m.C object at 0x7f...>``, an address that changes from run to run; ``<class 'm.C'>``;
``TypeCtor(name='ptr')``; a ``BoundMethod(...)`` dataclass with spans), and an attribute whose
reading raises is not "no such attribute" (Python's ``hasattr`` says the same only for
AttributeError). Code, message and the span of the attribute, for @jit and .spk kernels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import first_compile_error, import_source, run_one_f32

PRELUDE = '''import dataclasses
import functools
import math

import numpy as np

import sparsile as sp


class Box:
    width = 4

    @property
    def broken(self):
        raise RuntimeError("no width yet")


BOX = Box()
HALF = lambda x: x / 2  # noqa: E731


def twice(x):
    return 2 * x


@dataclasses.dataclass
class Pair:
    a: int = 1
    b: int = 2


PAIR = Pair(3, 4)


@sp.jit
def hj(X: sp.ptr[sp.f32]):
    sp.store(X, 1.0)


@sp.autotune(configs=[sp.Config({"B": 1}), sp.Config({"B": 2})], key=[])
@sp.jit
def tuned(X: sp.ptr[sp.f32], B: sp.constexpr):
    sp.store(X, 2.0 * B)


ONE = functools.partial(twice, 1)
LAUNCH = functools.partial(hj)
HALVE = functools.partial(HALF)
'''

def _jit_diagnostic(expr: str, attr: str, folder: Path) -> Any:
    text = PRELUDE + f"\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    y = {expr}\n    sp.store(X, 1.0)\n"
    d = first_compile_error(import_source(text, folder, "object_names"))
    line = text.split("\n")[d.span.file_line - 1]
    assert line[d.span.file_col - 1:].startswith(attr), (line, d.span)
    return d


JIT_CASES = [
    ("BOX.broken", "broken",
     "reading `broken` of a Python `Box` object raised RuntimeError: no width yet"),
    ("BOX.height", "height", "a Python `Box` object has no attribute `height`"),
    ("Box.height", "height", "the Python class `Box` has no attribute `height`"),
    ("sp.ptr.height", "height", "the type constructor `ptr` has no attribute `height`"),
    ("sp.load.height", "height", "the builtin `load` has no attribute `height`"),
    ("sp.arange(0, 16).sum.height", "height",
     "the method `sum` of a run-time value of type tile<16xi32> has no attribute `height`"),
]


@pytest.mark.parametrize(("expr", "attr", "message"), JIT_CASES, ids=[c[0] for c in JIT_CASES])
def test_a_jit_kernel_names_python_objects_by_a_phrase(expr: str, attr: str, message: str, tmp_path) -> None:
    d = _jit_diagnostic(expr, attr, tmp_path)
    assert (d.code, d.message) == ("SP0204", message)
    if expr == "BOX.broken":
        assert d.help == "a kernel reads a Python object's attributes when it is compiled"


SPK_CASES = [
    ("ptr.height", "the type constructor `ptr` has no attribute `height`"),
    ("load.height", "the builtin `load` has no attribute `height`"),
    ("arange(0, 16).sum.height", "the method `sum` of a run-time value of type tile<16xi32> has no attribute `height`"),
]


@pytest.mark.parametrize(("expr", "message"), SPK_CASES, ids=[c[0] for c in SPK_CASES])
def test_a_spk_kernel_names_language_objects_by_a_phrase(expr: str, message: str) -> None:
    text = f"@kernel\ndef k(X: ptr[f32]):\n    y = {expr}\n    store(X, 1.0)\n"
    with pytest.raises(sp.CompileError) as info:
        sp.loads(text, "names.spk").kernels["k"].interpret[(1,)](np.full(1, np.nan, np.float32))
    d = info.value.diagnostics[0]
    assert (d.code, d.message) == ("SP0204", message)
    assert text.split("\n")[d.span.file_line - 1][d.span.file_col - 1:].startswith("height")


_DECORATE = "a Python function called from a kernel must be decorated with `@sparsile.jit` (it is inlined)"
CALL_CASES = [
    ("np.sqrt(2.0)", "the NumPy function `sqrt` is not callable in a kernel",
     "use the language's `sqrt(x)` (`sparsile.sqrt`): a numpy function does not run in a kernel"),
    ("math.exp(2.0)", "the Python function `exp` is not callable in a kernel",
     "use the language's `exp(x)` (`sparsile.exp`): a math function does not run in a kernel"),
    ("np.hypot(2.0, 1.0)", "the NumPy function `hypot` is not callable in a kernel",
     "a numpy function does not run in a kernel; only the language's builtins and `@sparsile.jit` functions "
     "can be called"),
    ("HALF(2.0)", "the Python function `<lambda>` is not callable in a kernel",
     "a lambda cannot be inlined: define the function with `def` and decorate it with `@sparsile.jit`"),
    ("twice(2.0)", "the Python function `twice` is not callable in a kernel", _DECORATE),
]


@pytest.mark.parametrize(("expr", "message", "help_"), CALL_CASES, ids=[c[0] for c in CALL_CASES])
def test_calling_a_python_function_says_what_to_do_instead(expr: str, message: str, help_: str, tmp_path) -> None:
    """NumPy's and math's functions cannot be decorated with @sparsile.jit (the help said to); where
    the language has the function, the help names it."""
    d = _jit_diagnostic(expr, expr.partition("(")[0], tmp_path)
    assert (d.code, d.message, d.help) == ("SP0332", message, help_)


_OBJECT = ("a kernel cannot create Python objects: create the object outside the kernel (a global object's "
           "attributes read in a kernel are compile-time constants) or pass the values as arguments")
CLASS_CASES = [
    ("Box()", "the Python class `Box` is not callable in a kernel", _OBJECT),
    ("Pair(1, 2)", "the Python class `Pair` is not callable in a kernel", _OBJECT),
    ("np.ndarray(3)", "the Python class `ndarray` is not callable in a kernel",
     "a numpy class cannot be instantiated in a kernel; only the language's builtins and `@sparsile.jit` "
     "functions can be called"),
    ("ONE(2.0)", "a `functools.partial` of the Python function `twice` is not callable in a kernel",
     "a `functools.partial` is not inlined: decorate `twice` with `@sparsile.jit` and call it with all its "
     "arguments"),
    ("LAUNCH(X)", "a `functools.partial` of the kernel `hj` is not callable in a kernel",
     "a `functools.partial` is not inlined: call `hj` itself with all its arguments"),
    ("HALVE(2.0)", "a `functools.partial` of the Python function `<lambda>` is not callable in a kernel",
     "a `functools.partial` is not inlined: call the function itself with all its arguments"),
    ("tuned(X, 2)", "the autotuned kernel `tuned` is not callable in a kernel",
     "an autotuned kernel picks its config when it is launched from Python; to inline its body call "
     "`tuned.kernel(...)` with one config's constexprs as arguments"),
]


@pytest.mark.parametrize(("expr", "message", "help_"), CLASS_CASES, ids=[c[0] for c in CLASS_CASES])
def test_calling_a_class_or_a_partial_says_what_it_is_and_what_to_do(expr: str, message: str, help_: str,
                                                                     tmp_path) -> None:
    """A class called in a kernel had no help line; a `functools.partial` was named by its repr (with
    `<sparsile kernel hj>` or a function's address)."""
    d = _jit_diagnostic(expr, expr.partition("(")[0], tmp_path)
    assert (d.code, d.message, d.help) == ("SP0332", message, help_)


def test_a_global_objects_attribute_is_a_constant_as_the_class_help_says(tmp_path) -> None:
    """What the help of calling a class advises works: a global object's attribute in a kernel."""
    text = PRELUDE + "\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    sp.store(X, PAIR.a * 1.5 + PAIR.b)\n"
    assert run_one_f32(import_source(text, tmp_path, "object_names"))[0] == np.float32(3 * 1.5 + 4)


def test_the_autotuned_kernel_help_works(tmp_path) -> None:
    """What the help of calling an autotuned kernel advises inlines its kernel."""
    text = PRELUDE + "\n\n@sp.jit\ndef k(X: sp.ptr[sp.f32]):\n    tuned.kernel(X, 3)\n"
    assert run_one_f32(import_source(text, tmp_path, "object_names"))[0] == 6.0


@pytest.mark.parametrize(("expr", "named"), [
    ("ONE + 1", "a `functools.partial` of the Python function `twice`"),
    ("LAUNCH + 1", "a `functools.partial` of the kernel `hj`"),
    ("hj + 1", "the kernel `hj`"),
    ("tuned + 1", "the autotuned kernel `tuned`"),
])
def test_a_partial_or_a_kernel_in_another_error_is_named_in_words(expr: str, named: str, tmp_path) -> None:
    """Not only SP0332: a diagnostic that names a partial or a kernel (here SP0329) says what it is
    (was `functools.partial(<function twice at 0x7f...>, 1)`, `<sparsile kernel hj>`)."""
    d = _jit_diagnostic(expr, expr.partition(" ")[0], tmp_path)
    assert (d.code, d.message) == ("SP0329", f"`+` is not defined between {named} and 1")
