"""An ml_dtypes scalar a ``@jit`` kernel captured (a closure value, a helper's parameter default) keys
the disk cache by its value, as a NumPy scalar does (docs/language.md, "What a kernel captures").

History: ``fingerprint`` took only NumPy's own scalars (module ``numpy``) as values; an ml_dtypes
scalar (module ``ml_dtypes``: ``bfloat16``, ``float8_e4m3fn``) was an "object", keyed by its type
alone, so two kernels of one source whose helper default was ``bfloat16(1.5)`` and ``bfloat16(2.5)``
shared one compile cache entry: the second compiled to the first's PTX, silently (the interpreter,
which does not go through that cache, gave the right numbers).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.sema.fingerprints import fingerprint
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import FACTORIES, distinct_cached_ptx, scales_x
from sparsile.tests.support.jit_source import import_source

ml_dtypes = pytest.importorskip("ml_dtypes")

SOURCE = FACTORIES



fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


@pytest.mark.parametrize("factory", ["make_default", "make_closure"])
@pytest.mark.parametrize("kind", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_an_ml_dtypes_capture_keys_the_compile_cache_by_value(tmp_path, fresh_cache, factory: str, kind: str) -> None:
    module = import_source(SOURCE, tmp_path, "ml_capture")
    scalar = getattr(ml_dtypes, kind)
    kernels = []
    for value in (1.5, 2.5, -3.0):  # exact in each type
        kernels.append(getattr(module, factory)(scalar(value)))
        scales_x(kernels[-1], value)
    assert len(distinct_cached_ptx(kernels)) == 3


def test_ml_dtypes_scalars_are_fingerprinted_by_type_and_value() -> None:
    bf16, e4m3 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
    assert fingerprint(bf16(1.5)) == fingerprint(bf16(1.5)) != fingerprint(bf16(2.5))
    assert fingerprint(bf16(1.5)) != fingerprint(e4m3(1.5)) != fingerprint(np.float16(1.5))
    assert fingerprint(bf16(0.0)) != fingerprint(bf16(-0.0))
    assert fingerprint((bf16(1.5),)) != fingerprint((bf16(2.5),))
