"""A special method of a user's class that a kernel folds (``if cfg:``, ``cfg == 1``, ``-cfg``,
``1 in cfg``, ``cfg + 1.5``) and that raises is SP0331 at the fold, at the first compile and at the
compile that follows a launch check where it raised (docs/language.md, "What a kernel captures").

History: the fold ran the method bare (``bool(v)`` in keyed_truth, the operator tables of
emitter.fold_binary, ``x in y``): an exception other than TypeError / ValueError (RuntimeError,
KeyError), or ``__bool__`` returning an int, escaped as an internal traceback. front58's launch
check runs such a method again at every launch, and a method that raised there (the check sees a
change) made the recompile raise the traceback from ``kernel[grid](...)``.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import dataclasses

import sparsile as sp

FAIL = {fail}


@dataclasses.dataclass(frozen=True)
class Cfg:
    a: int

    def {name}(self{args}):
        if FAIL:
            {raise_}
        return {value}

    __hash__ = object.__hash__


def make(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        c = {expr}
        sp.store(out + i, sp.load(x + i) * c)

    return k
'''

RAISE = "raise RuntimeError('cfg is stale')"

# (method, its parameters, its value when it does not raise, the kernel's use of `v`, column of the fold,
#  the words of the fold, the scale)
CASES = [
    ("__bool__", "", "True", "2.0 if v else 3.0", 20, "the condition", 2.0),
    ("__bool__", "", "True", "2.0 if not v else 3.0", 24, "`not`", 3.0),
    ("__eq__", ", other", "other == 1", "2.0 if v == 1 else 3.0", 20, "`==`", 2.0),
    ("__lt__", ", other", "other > 0", "2.0 if v < 5 else 3.0", 20, "`<`", 2.0),
    ("__neg__", "", "1.5", "-v", 13, "`-`", 1.5),
    ("__add__", ", other", "other + 1.0", "v + 1.5", 13, "`+`", 2.5),
    ("__contains__", ", other", "other == 1", "2.0 if 1 in v else 3.0", 20, "`in`", 2.0),
]
IDS = [f"{c[0].strip('_')}-{c[5].strip('`').replace(' ', '_')}" for c in CASES]


def kernel_module(tmp_path: Path, name: str, args: str, value: str, expr: str, fail: bool,
                  raise_: str = RAISE) -> ModuleType:
    """:data:`SOURCE` whose ``Cfg.<name>`` raises (``raise_``) while its module's ``FAIL`` is true."""
    text = SOURCE.format(name=name, args=args, value=value, expr=expr, fail=fail, raise_=raise_)
    return import_source(text, tmp_path, "class_code_raises")


def run(kernel: object) -> tuple[np.ndarray, np.ndarray]:
    """``kernel(x, out)`` in the interpreter on random x, out poisoned: (x, out)."""
    x = np.random.default_rng(58).uniform(-4.0, 4.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    kernel.interpret[(1,)](x, out)  # type: ignore[attr-defined]
    return x, out


def check_error(kernel: object, use: str, line_text: str, col: int, kind: str = "RuntimeError",
                words: str = "cfg is stale") -> None:
    """The launch is SP0331 at the fold (``use`` raised ``kind: words``), out not written."""
    out = np.full(8, np.nan, np.float32)
    with pytest.raises(sp.CompileError) as info:
        kernel.interpret[(1,)](np.ones(8, np.float32), out)  # type: ignore[attr-defined]
    assert np.isnan(out).all()
    d = info.value.diagnostics[0]
    assert d.code == "SP0331", info.value
    assert d.message == f"{use} failed on compile-time values: {kind}: {words}"
    assert (d.span.file_line, d.span.file_col) == (line_text.count("\n") + 1, col)
    assert "your class" in (d.help or "")


def expr_line(module: ModuleType) -> str:
    """The source of ``module`` up to the kernel's ``c = ...`` line (its line number is the count of lines)."""
    text = Path(module.__file__).read_text()
    return text[:text.index("        c = ")]


@pytest.mark.parametrize(("name", "args", "value", "expr", "col", "use", "scale"), CASES, ids=IDS)
def test_a_method_that_raises_at_the_first_compile_is_sp0331(tmp_path, name, args, value, expr, col, use,
                                                             scale) -> None:
    module = kernel_module(tmp_path, name, args, value, expr, fail=True)
    check_error(module.make(module.Cfg(1)), use, expr_line(module), col)


@pytest.mark.parametrize(("name", "args", "value", "expr", "col", "use", "scale"), CASES, ids=IDS)
def test_a_method_that_raises_at_a_later_launch_is_sp0331(tmp_path, name, args, value, expr, col, use,
                                                          scale) -> None:
    module = kernel_module(tmp_path, name, args, value, expr, fail=False)
    kernel = module.make(module.Cfg(1))
    x, out = run(kernel)
    np.testing.assert_array_equal(out, x * np.float32(scale))
    module.FAIL = True  # the launch check runs the method again: it raises, the compile that follows reports it
    check_error(kernel, use, expr_line(module), col)
    module.FAIL = False  # and it folds again once it no longer raises
    x, out = run(kernel)
    np.testing.assert_array_equal(out, x * np.float32(scale))


def test_a_bool_that_returns_an_int_is_sp0331(tmp_path) -> None:
    module = kernel_module(tmp_path, "__bool__", "", "True", "2.0 if v else 3.0", fail=True, raise_="return 1")
    check_error(module.make(module.Cfg(1)), "the condition", expr_line(module), 20, "TypeError",
                "__bool__ should return bool, returned int")
