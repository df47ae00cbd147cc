"""Checks that captured values which compile differently key the compile cache differently
(frontend/sema/captures.py ``fingerprint``; docs/language.md, "What a kernel captures"): the
signature the tests compile for, NaNs of a given payload, and the PTX of kernels through the cache,
each checked against an uncached compile (a cache hit of another value's entry fails there)."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

import sparsile as sp

SIGNATURE = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32]}
"""The kernels' ``(x, out)`` signature, for ``k.compile``."""

FACTORIES = '''
import sparsile as sp


def make_closure(v):
    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, sp.load(x + i) * v)

    return k


def make_default(v):
    @sp.jit
    def h(x, b=v):
        return x * b

    @sp.jit
    def k(x, out):
        i = sp.arange(0, 8)
        sp.store(out + i, h(sp.load(x + i)))

    return k
'''
"""Source of a module whose ``make_closure(v)`` / ``make_default(v)`` make a kernel ``(x, out)`` writing
``x * v``, ``v`` captured as a closure cell / a helper's default (a test appends its own factories)."""


def f64_nan(payload: int) -> float:
    """A quiet f64 NaN whose payload survives the conversion to f32 (high mantissa bits)."""
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0000 | payload << 29))[0]


def f32_nan(payload: int) -> np.float32:
    """A quiet f32 NaN of ``payload``."""
    return np.frombuffer(struct.pack("<I", 0x7FC0_0000 | payload), np.float32)[0]


def cached_ptx(kernel: Any) -> str:
    """The kernel's PTX for :data:`SIGNATURE` through the compile cache, checked equal to an uncached compile's."""
    cached = kernel.compile(SIGNATURE, stop_after="ptx").ptx
    assert cached == kernel.compile(SIGNATURE, stop_after="ptx", cache=False).ptx, kernel
    return cached


def distinct_cached_ptx(kernels: Iterable[Any]) -> set[str]:
    """The distinct PTX of ``kernels`` through the compile cache (:func:`cached_ptx`)."""
    return {cached_ptx(k) for k in kernels}


def scales_x(kernel: Any, scale: float, seed: int = 56) -> None:
    """``kernel(x, out)`` in the interpreter, out poisoned, writes exactly ``x * scale`` in f32."""
    x = np.random.default_rng(seed).uniform(-4.0, 4.0, 8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    kernel.interpret[(1,)](x, out)
    np.testing.assert_array_equal(out, x * np.float32(scale))
