"""A captured named tuple keys the compile cache by its elements, as a tuple does (docs/language.md,
"What a kernel captures").

History: ``fingerprint`` took ``tuple`` itself only; a named tuple (a subclass) was an "object",
keyed on disk by its type's name alone. A kernel that indexes or unpacks it (``v[1]``,
``a, b = v``) folds its elements into the code, so two kernels of one source capturing
``NT(1.0, 2.0)`` and ``NT(1.0, 3.0)`` shared one compile cache entry, and the second compiled to
the first's PTX, silently.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from sparsile.frontend.sema.fingerprints import fingerprint
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import distinct_cached_ptx
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


def make_index(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * v[1])

    return k


def make_unpack(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        a, b = v
        sp.store(out + i, sp.load(x + i) * b + a)

    return k
'''

Pair = collections.namedtuple("Pair", "a b")


fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize("factory", ["make_index", "make_unpack"])
def test_a_captured_named_tuple_keys_the_compile_cache_by_its_elements(tmp_path, fresh_cache, factory: str) -> None:
    module = import_source(SOURCE, tmp_path, "nt_capture")
    x = np.random.default_rng(56).uniform(-4.0, 4.0, 8).astype(np.float32)
    kernels = []
    for b in (2.0, 3.0, -5.0):
        kernels.append(getattr(module, factory)(Pair(1.0, b)))
        out = np.full(8, np.nan, np.float32)
        kernels[-1].interpret[(1,)](x, out)
        want = x * np.float32(b) + (np.float32(1.0) if factory == "make_unpack" else np.float32(0.0))
        np.testing.assert_array_equal(out, want)
    assert len(distinct_cached_ptx(kernels)) == 3


def test_named_tuples_are_fingerprinted_by_type_and_elements() -> None:
    Other = collections.namedtuple("Other", "a b")
    assert fingerprint(Pair(1, 2)) == fingerprint(Pair(1, 2)) != fingerprint(Pair(1, 3))
    assert fingerprint(Pair(1, 2)) != fingerprint(Other(1, 2)) != fingerprint((1, 2))
    assert fingerprint(Pair(-0.0, 2)) != fingerprint(Pair(0.0, 2))
