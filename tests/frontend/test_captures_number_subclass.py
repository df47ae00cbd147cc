"""A captured instance of a subclass of ``int``, ``float`` or ``str`` keys the compile cache by its
value, as one of the base type does (docs/language.md, "What a kernel captures").

History: ``fingerprint`` took ``int``, ``float`` and ``str`` themselves only (an ``IntEnum`` member
by its name); an instance of ``class Size(int)`` was an "object", keyed on disk by its type's name
alone, yet the kernel folds its value (``x * v``, ``v == "fast"``): two kernels of one source
capturing ``Size(2)`` and ``Size(3)`` shared one compile cache entry, and the second compiled to
the first's PTX, silently.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.sema.fingerprints import fingerprint
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import distinct_cached_ptx, scales_x
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


class Size(int):
    pass


class Scale(float):
    pass


class Mode(str):
    pass


class Spelled(str):
    def __str__(self):
        return "spelled"


def make_scaled(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * v)

    return k


def make_mode(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        if v == "fast":
            sp.store(out + i, sp.load(x + i) * 2.0)
        else:
            sp.store(out + i, sp.load(x + i) * 3.0)

    return k
'''



fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize(("cls", "factory", "values", "scales"), [
    ("Size", "make_scaled", (2, 3), (2.0, 3.0)),
    ("Scale", "make_scaled", (2.5, -0.0), (2.5, -0.0)),
    ("Mode", "make_mode", ("fast", "slow"), (2.0, 3.0)),
    ("Spelled", "make_mode", ("fast", "slow"), (2.0, 3.0)),  # (keyed by the value, not by its own `__str__`)
])
def test_a_captured_subclass_instance_keys_the_compile_cache_by_value(tmp_path, fresh_cache, cls, factory, values,
                                                                      scales) -> None:
    module = import_source(SOURCE, tmp_path, "subclass_capture")
    kernels = []
    for value, scale in zip(values, scales, strict=True):
        kernels.append(getattr(module, factory)(getattr(module, cls)(value)))
        scales_x(kernels[-1], scale)
    assert len(distinct_cached_ptx(kernels)) == 2


def test_subclass_instances_are_fingerprinted_by_type_and_value() -> None:
    class Size(int):
        pass

    assert fingerprint(Size(2)) == fingerprint(Size(2)) != fingerprint(Size(3))
    assert fingerprint(Size(2)) != fingerprint(2)

    class Counted(int):
        def __int__(self):
            return 1

    class Spelled(str):
        def __str__(self):
            return "spelled"

    assert fingerprint(Counted(2)) != fingerprint(Counted(3)) and fingerprint(Spelled("a")) != fingerprint(Spelled("b"))
    assert fingerprint(np.float64(2.0)) == ("value", "float64", "2.0")  # (NumPy's float64, a float: as before)
