"""A constexpr argument that is an instance of a subclass of ``int`` or ``str`` keys its
specialization by its class and its value as the base type spells it (frontend/sema/specialize.py
``constexpr_key`` and the launch fingerprint).

History: the disk cache key held ``repr`` of each constexpr and the in-memory keys the value
itself: a subclass with its own ``__repr__`` (``class Size(int)`` spelled ``Size``) gave
``Size(2)`` and ``Size(3)`` one compile cache entry (the second compiled to the first's PTX,
silently), and one with its own ``__eq__`` / ``__hash__`` one specialization in the process (the
second launch ran the first's code).
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.sema.specialize import constexpr_key
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


class Size(int):
    def __repr__(self):
        return "Size"


class Loose(int):
    def __eq__(self, other):
        return isinstance(other, int)

    def __hash__(self):
        return 0


class Mode(str):
    def __repr__(self):
        return "Mode"


@sp.jit
def scaled(x, out, S: sp.constexpr):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * S)


@sp.jit
def moded(x, out, S: sp.constexpr):
    i = sp.arange(0, 8)
    if S == "fast":
        sp.store(out + i, sp.load(x + i) * 2.0)
    else:
        sp.store(out + i, sp.load(x + i) * 3.0)
'''

CASES = [("Size", "scaled", (2, 3), (2.0, 3.0)), ("Loose", "scaled", (2, 3), (2.0, 3.0)),
         ("Mode", "moded", ("fast", "slow"), (2.0, 3.0))]

fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


def _runs(kernel, value, scale: float) -> None:
    x = np.random.default_rng(57).uniform(-4.0, 4.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    kernel.interpret[(1,)](x, out, value)
    np.testing.assert_array_equal(out, x * np.float32(scale))


@pytest.mark.parametrize(("cls", "kernel", "values", "scales"), CASES, ids=[c[0] for c in CASES])
def test_each_subclass_value_is_its_own_specialization_in_the_process(tmp_path, cls, kernel, values,
                                                                      scales) -> None:
    module = import_source(SOURCE, tmp_path, "constexpr_subclass")
    for _ in range(2):
        for value, scale in zip(values, scales, strict=True):
            _runs(getattr(module, kernel), getattr(module, cls)(value), scale)


@pytest.mark.parametrize(("cls", "kernel", "values", "scales"), CASES, ids=[c[0] for c in CASES])
def test_each_subclass_value_is_its_own_compile_cache_entry(tmp_path, fresh_cache, cls, kernel, values,
                                                            scales) -> None:
    module = import_source(SOURCE, tmp_path, "constexpr_subclass_disk")
    k = getattr(module, kernel)
    ptx = set()
    for value in values:
        sig = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "S": getattr(module, cls)(value)}
        cached = k.compile(sig, stop_after="ptx").ptx
        assert cached == k.compile(sig, stop_after="ptx", cache=False).ptx, value
        ptx.add(cached)
    assert len(ptx) == 2


def test_plain_values_keep_their_keys() -> None:
    assert constexpr_key(2) == ("int", 2) and constexpr_key("a") == ("str", "a")
    assert constexpr_key(True) == ("bool", True)
