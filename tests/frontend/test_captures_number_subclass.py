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

import sparsile as sp
from sparsile.driver import cache as cache_mod
from sparsile.frontend.sema.captures import fingerprint
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


class Size(int):
    pass


class Scale(float):
    pass


class Mode(str):
    pass


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

SIGNATURE = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32]}


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache_mod.reset_default_cache()
    yield
    cache_mod.reset_default_cache()


@pytest.mark.parametrize(("cls", "factory", "values", "scales"), [
    ("Size", "make_scaled", (2, 3), (2.0, 3.0)),
    ("Scale", "make_scaled", (2.5, -0.0), (2.5, -0.0)),
    ("Mode", "make_mode", ("fast", "slow"), (2.0, 3.0)),
])
def test_a_captured_subclass_instance_keys_the_compile_cache_by_value(tmp_path, fresh_cache, cls, factory, values,
                                                                      scales) -> None:
    module = import_source(SOURCE, tmp_path, "subclass_capture")
    x = np.random.default_rng(56).uniform(-4.0, 4.0, 8).astype(np.float32)
    ptxs: list[str] = []
    for value, scale in zip(values, scales, strict=True):
        k = getattr(module, factory)(getattr(module, cls)(value))
        out = np.full(8, np.nan, np.float32)
        k.interpret[(1,)](x, out)
        np.testing.assert_array_equal(out, x * np.float32(scale))
        cached = k.compile(SIGNATURE, stop_after="ptx").ptx
        assert cached == k.compile(SIGNATURE, stop_after="ptx", cache=False).ptx, value
        ptxs.append(cached)
    assert ptxs[0] != ptxs[1]


def test_subclass_instances_are_fingerprinted_by_type_and_value() -> None:
    class Size(int):
        pass

    assert fingerprint(Size(2)) == fingerprint(Size(2)) != fingerprint(Size(3))
    assert fingerprint(Size(2)) != fingerprint(2)
    assert fingerprint(np.float64(2.0)) == ("value", "float64", "2.0")  # (NumPy's float64, a float: as before)
