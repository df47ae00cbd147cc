"""An ahead-of-time signature's constexpr keys its specialization as a launch's does: a float by
its bits (docs/language.md, "Specialization and launching").

History: ``Kernel.signature_bindings`` keyed a constexpr by ``repr``, which is ``nan`` for every
NaN. ``k.compile({..., "C": nan_1})`` and then ``{"C": nan_2}`` (an f32 NaN of payload 1, then 2,
which ``x * C`` keeps in the PTX) shared one specialization: the second compile returned the first's
IR and PTX (the in-memory IR cache and the disk cache alike), silently. A launch's key
(``specialize``) already took a float's bits.
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import f32_nan, f64_nan
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


@sp.jit
def k(x, out, C: sp.constexpr):
    i = sp.arange(0, 8)
    sp.store(out + i, sp.load(x + i) * C)
'''


fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize("nan", [f32_nan, f64_nan], ids=["np.float32", "float"])
@pytest.mark.parametrize("cache", [True, False], ids=["disk-cache", "no-disk-cache"])
def test_a_nan_constexpr_of_a_signature_is_keyed_by_its_payload(tmp_path, fresh_cache, nan, cache: bool) -> None:
    module = import_source(SOURCE, tmp_path, "sig_nan")
    ptxs = []
    for payload in (1, 2):
        signature = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "C": nan(payload)}
        ptx = module.k.compile(signature, stop_after="ptx", cache=cache).ptx
        fresh = import_source(SOURCE, tmp_path, "sig_nan").k.compile(signature, stop_after="ptx", cache=False).ptx
        assert ptx == fresh, payload
        ptxs.append(ptx)
    assert ptxs[0] != ptxs[1]


def test_a_signature_and_a_launch_key_one_constexpr_alike(tmp_path) -> None:
    module = import_source(SOURCE, tmp_path, "sig_key")
    x = np.random.default_rng(56).uniform(-4.0, 4.0, 8).astype(np.float32)
    for c in (-0.0, 0.0, 1.5, f32_nan(3), (1, 2.0)):
        _, key = module.k.signature_bindings({"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "C": c})
        _, _, launch_key = module.k.bind((x, x), {"C": c})
        assert key[-1] == launch_key[2], c
