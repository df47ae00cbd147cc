"""On the GPU: a launch after a captured value's class changed its own special method runs the new
code (docs/language.md, "What a kernel captures": the code of a value's class), through the
launchers' caches and the fast launch path, as tests/frontend/test_captures_class_code.py checks in
the interpreter and the PTX. Outputs poisoned, each compared with ``x * scale`` rounded once to f32."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.frontend.test_captures_class_code import CASES, FACTORY, class_module, value_of
from sparsile.tests.support.jit_source import import_source

pytestmark = pytest.mark.gpu


def _scales_x_on_the_gpu(kernel, scale: float) -> None:
    x = np.random.default_rng(58).uniform(-4.0, 4.0, 8).astype(np.float32)
    for _ in range(3):  # the first launch, the cached launcher, the fast path
        out = np.full(8, np.nan, np.float32)
        kernel[(1,)](x, out)
        np.testing.assert_array_equal(out, x * np.float32(scale))


@pytest.mark.parametrize("kind", ["dataclass", "enum"])
@pytest.mark.parametrize(("name", "args", "first", "second", "expr", "s1", "s2"), CASES[:3],
                         ids=[c[0].strip("_") for c in CASES[:3]])
def test_a_method_reassigned_on_the_class_relaunches_new_code(tmp_path, kind, name, args, first, second, expr, s1,
                                                              s2) -> None:
    one = class_module(tmp_path, "one.py", name, args, first)
    other = class_module(tmp_path, "other.py", name, args, second)
    kernel = import_source(FACTORY.format(expr=expr), tmp_path, "class_code_gpu").make(value_of(one, kind))
    _scales_x_on_the_gpu(kernel, s1)
    cls = type(value_of(one, kind))
    original = vars(cls)[name]
    setattr(cls, name, vars(type(value_of(other, kind)))[name])
    _scales_x_on_the_gpu(kernel, s2)
    setattr(cls, name, original)
    _scales_x_on_the_gpu(kernel, s1)
