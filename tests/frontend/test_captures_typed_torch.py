"""A captured typed constant (``sp.f32(v)``) keys the compile cache by its bits, and a captured torch
dtype by its name (docs/language.md, "What a kernel captures").

History: ``fingerprint`` keyed a sparsile object by its ``repr`` (``f32(nan)`` for every NaN,
whose payload reaches the PTX) and a torch dtype as any other object: by its type's name alone on
disk, ``torch.dtype``, although ``if D == torch.float16:`` compiles one branch or the other. Two
kernels of one source shared one compile cache entry, and the second compiled to the first's PTX,
silently.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver import cache as cache_mod
from sparsile.frontend.sema.captures import fingerprint
from sparsile.tests.support.jit_source import import_source

SOURCE = '''
import sparsile as sp


def make_closure(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * v)

    return k


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

SIGNATURE = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32]}


def f32_nan(payload: int) -> float:
    """An f32 quiet NaN of ``payload``, as a Python float (exact in f32)."""
    return float(np.frombuffer(struct.pack("<I", 0x7FC0_0000 | payload), np.float32)[0])


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache_mod.reset_default_cache()
    yield
    cache_mod.reset_default_cache()


def distinct_cached_ptx(kernels: list[Any]) -> set[str]:
    """The PTX of each kernel through the compile cache, each checked against an uncached compile."""
    ptxs: set[str] = set()
    for k in kernels:
        cached = k.compile(SIGNATURE, stop_after="ptx").ptx
        assert cached == k.compile(SIGNATURE, stop_after="ptx", cache=False).ptx
        ptxs.add(cached)
    return ptxs


def test_a_captured_typed_nan_keys_the_compile_cache_by_its_payload(tmp_path, fresh_cache) -> None:
    module = import_source(SOURCE, tmp_path, "typed_capture")
    kernels = [module.make_closure(sp.f32(f32_nan(p))) for p in (1, 2)]
    assert len(distinct_cached_ptx(kernels)) == 2


def test_a_captured_torch_dtype_keys_the_compile_cache_by_its_name(tmp_path, fresh_cache) -> None:
    torch = pytest.importorskip("torch")
    module = import_source(SOURCE, tmp_path, "torch_capture")
    x = np.random.default_rng(56).uniform(-4.0, 4.0, 8).astype(np.float32)
    for dtype, scale in ((torch.float16, 2.0), (torch.float32, 3.0)):
        out = np.full(8, np.nan, np.float32)
        module.make_branch(dtype, torch).interpret[(1,)](x, out)
        np.testing.assert_array_equal(out, x * np.float32(scale))
    kernels = [module.make_branch(d, torch) for d in (torch.float16, torch.float32, torch.bfloat16)]
    assert len(distinct_cached_ptx(kernels)) == 2  # bfloat16 takes float32's branch


def test_typed_constants_and_torch_dtypes_are_fingerprinted_by_value() -> None:
    assert fingerprint(sp.f32(f32_nan(1))) == fingerprint(sp.f32(f32_nan(1))) != fingerprint(sp.f32(f32_nan(2)))
    assert fingerprint(sp.f32(-0.0)) != fingerprint(sp.f32(0.0)) != fingerprint(sp.f16(0.0))
    torch = pytest.importorskip("torch")
    assert fingerprint(torch.float16) == fingerprint(torch.float16) != fingerprint(torch.bfloat16)
