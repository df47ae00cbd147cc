"""A captured typed constant (``sp.f32(v)``) keys the compile cache by its bits, and a captured torch
dtype by its name (docs/language.md, "What a kernel captures").

History: ``fingerprint`` keyed a sparsile object by its ``repr`` (``f32(nan)`` for every NaN,
whose payload reaches the PTX) and a torch dtype as any other object: by its type's name alone on
disk, ``torch.dtype``, although ``if D == torch.float16:`` compiles one branch or the other. Two
kernels of one source shared one compile cache entry, and the second compiled to the first's PTX,
silently.
"""

from __future__ import annotations

import pytest

import sparsile as sp
from sparsile.frontend.sema.fingerprints import fingerprint
from sparsile.tests.support import cache_fixture
from sparsile.tests.support.capture_cache import FACTORIES, distinct_cached_ptx, f32_nan, scales_x
from sparsile.tests.support.jit_source import import_source

SOURCE = FACTORIES + '''

def make_branch(v, torch):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        if v == torch.float16:
            sp.store(out + i, sp.load(x + i) * 2.0)
        else:
            sp.store(out + i, sp.load(x + i) * 3.0)

    return k
'''



fresh_cache = cache_fixture.fresh_cache  # (an empty default compile cache: tests/support/cache_fixture.py)


def test_a_captured_typed_nan_keys_the_compile_cache_by_its_payload(tmp_path, fresh_cache) -> None:
    module = import_source(SOURCE, tmp_path, "typed_capture")
    kernels = [module.make_closure(sp.f32(f32_nan(p))) for p in (1, 2)]
    assert len(distinct_cached_ptx(kernels)) == 2


def test_a_captured_torch_dtype_keys_the_compile_cache_by_its_name(tmp_path, fresh_cache) -> None:
    torch = pytest.importorskip("torch")
    module = import_source(SOURCE, tmp_path, "torch_capture")
    for dtype, scale in ((torch.float16, 2.0), (torch.float32, 3.0)):
        scales_x(module.make_branch(dtype, torch), scale)
    kernels = [module.make_branch(d, torch) for d in (torch.float16, torch.float32, torch.bfloat16)]
    assert len(distinct_cached_ptx(kernels)) == 2  # bfloat16 takes float32's branch


def test_typed_constants_and_torch_dtypes_are_fingerprinted_by_value() -> None:
    assert fingerprint(sp.f32(f32_nan(1))) == fingerprint(sp.f32(f32_nan(1))) != fingerprint(sp.f32(f32_nan(2)))
    assert fingerprint(sp.f32(-0.0)) != fingerprint(sp.f32(0.0)) != fingerprint(sp.f16(0.0))
    torch = pytest.importorskip("torch")
    assert fingerprint(torch.float16) == fingerprint(torch.float16) != fingerprint(torch.bfloat16)
