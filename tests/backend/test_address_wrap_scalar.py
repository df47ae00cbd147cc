"""Scalar pointer offsets whose i32 value wraps: the GPU's address must be the language's
(docs/language.md rule 7: ``p + offs`` is ``p + sext(offs) * E`` with the wrapped i32 ``offs``).

``load(x + s)`` next to ``load(x + (s + 128))`` compiled to ``[%rd+512]`` from the first address: LLVM's
NVPTX code generation separates the constant of ``getelementptr p, sext(s + 128)``, which is
``x + (s + 128) * E`` in 64 bits, not the wrapped sum, where ``s + 128`` passes 2**31 - 1. Offsets that
LLVM may see as ``a + c`` (backend/lower/offset_addend.py) now take wide_address.py's ``mad.wide.s32``;
the checks execute the PTX (tests/backend/ptx_eval.py) and compare each access's address with the
wrapped offset's.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

import sparsile as sp
from sparsile.tests.backend.address_eval import element_addresses
from sparsile.tests.backend.ptx_eval import ptx_accesses

KERNEL = """
@kernel
def k(x: ptr[{t}], out: ptr[{t}], s: i32, t: i32):
    a = load(x + s)
    b = load(x + ({expr}))
    store(out + ({expr}), a + b)
"""

X_ADDR, OUT_ADDR = 1 << 40, 1 << 44
BYTES = {"f32": 4, "f16": 2, "i8": 1}
T_VALUE = 1000


def _wrap32(v: int) -> int:
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def _compiled(expr: str, t: str, stop_after: str = "ptx") -> object:
    kern = sp.loads(KERNEL.format(t=t, expr=expr), "case.spk").kernels["k"]
    ty = getattr(sp, t)
    sig = {"x": sp.ptr[ty], "out": sp.ptr[ty], "s": sp.i32, "t": sp.i32}
    return kern.compile(sig, target="sm_90a", stop_after=stop_after, cache=False)


def _addresses(expr: str, t: str, s: int) -> tuple[list[int], list[int]]:
    """The element addresses of x the loads read and of out the store writes (thread 0; every
    thread's are the same)."""
    c = _compiled(expr, t)
    acc = ptx_accesses(c.ptx, 32 * c.num_warps, 0, [X_ADDR, OUT_ADDR, s, T_VALUE])
    e = BYTES[t]
    first = lambda store: sorted({a for a in element_addresses(acc, store, e)})  # noqa: E731
    return first(False), first(True)


# (expression, its value in Python's integers, before wrapping)
CASES: list[tuple[str, Callable[[int], int]]] = [
    ("s + 128", lambda s: s + 128),
    ("s - 128", lambda s: s - 128),
    ("(s + 3) * 4", lambda s: (s + 3) * 4),
    ("(s + t) + 64", lambda s: s + T_VALUE + 64),
    ("s + (t + 64)", lambda s: s + T_VALUE + 64),
    ("-(s + 5)", lambda s: -(s + 5)),
    ("(s + 1) << 2", lambda s: (s + 1) * 4),
    ("(s + 1).to(i16)", lambda s: (s + 1 + (1 << 15)) % (1 << 16) - (1 << 15)),
]


@pytest.mark.parametrize("t", ["f32", "i8"])
@pytest.mark.parametrize("expr, value", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("s", [(1 << 31) - 100, -(1 << 31) + 100, (1 << 29) - 2, 12345])
def test_a_scalar_offset_with_a_constant_addend_addresses_the_wrapped_sum(
        t: str, expr: str, value: Callable[[int], int], s: int) -> None:
    """``load(x + s)`` and ``load(x + (s + 128))``, ``store(out + (s + 128), ...)``: each address is the
    pointer plus E times the wrapped i32 offset (was the unwrapped 64-bit sum for s + 128 past 2**31 - 1:
    the separated constant)."""
    e = BYTES[t]
    off = _wrap32(value(s))
    x, out = _addresses(expr, t, s)
    assert x == sorted({X_ADDR + e * s, X_ADDR + e * off})
    assert out == [OUT_ADDR + e * off]


def test_plain_scalar_offsets_keep_their_getelementptr() -> None:
    """``x + s``, ``x + s * t`` and ``x + program_id(0) * 128`` (no constant for LLVM to separate) keep
    the ``getelementptr inbounds`` they had; only ``s + 128`` takes the opaque ``mad.wide.s32``."""
    ir = _compiled("s * t + program_id(0) * 128", "f32", "llvm").llvm
    assert "mad.wide" not in ir
    assert len(re.findall(r"getelementptr inbounds float, ptr addrspace\(1\) %p_\w+, i64 %", ir)) == 3
    ir = _compiled("s + 128", "f32", "llvm").llvm
    assert len(re.findall(r'asm "mad\.wide\.s32 \$0, \$1, 4, \$2;"', ir)) == 2
    assert len(re.findall(r"getelementptr inbounds float, ptr addrspace\(1\) %p_\w+, i64 %", ir)) == 1
