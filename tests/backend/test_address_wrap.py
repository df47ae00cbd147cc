"""Pointer tiles whose i32 offsets wrap: the GPU's addresses must be the language's (docs/language.md rule 7:
integers wrap; ``p + offs`` is ``p + sext(offs) * E``), as the interpreter computes them.

LLVM 22's NVPTX straight-line strength reduction rewrites ``getelementptr p, sext(a + 128)`` (with or
without ``inbounds``) as ``getelementptr p, sext(a)`` plus ``128 * E`` bytes: where ``a + 128`` wraps
past 2**31 - 1, the PTX then addresses ``p + (2**31 + ...) * E`` instead of ``p - (2**31 - ...) * E``.
That happens after the O3 pipeline, in code generation, so the checks here execute the PTX
(tests/backend/ptx_eval.py) for every thread of two programs and compare the accessed addresses with
the interpreter's offsets. Unproven small tiles (``s + arange(0, B)``) and proven ones with several
aligned blocks (``s * 4 + arange(0, B)``: each block's base offset may wrap relative to the others)
now take wide_address.py's opaque ``mad.wide.s32``; a product by a run-time stride (the shipped
GEMMs' ``rows[:, None] * ldc``) keeps its ``getelementptr`` (the golden PTX tests hold it).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.backend.address_eval import element_addresses
from sparsile.tests.backend.ptx_eval import ptx_accesses

KERNEL = """
@kernel
def k(x: ptr[{t}], out: ptr[{t}], n: i32, s: i32, B: constexpr):
    offs = {expr}
    m = offs < n
    store(out + offs, load(x + offs, mask=m), mask=m)
"""

OFFSETS = """
@kernel
def offsets(o: ptr[i64], s: i32, n: i32, B: constexpr):
    offs = {expr}
    store(o + program_id(0) * B + arange(0, B), offs.to(i64))
"""

X_ADDR, OUT_ADDR = 1 << 40, 1 << 44
BYTES = {"f32": 4, "f16": 2, "i8": 1}
WRAP_N = (1 << 31) - 1  # every offset but 2**31 - 1 is accessed, the wrapped (negative) ones too


def _compiled(expr: str, t: str, b: int, stop_after: str = "ptx") -> object:
    kern = sp.loads(KERNEL.format(t=t, expr=expr), "case.spk").kernels["k"]
    ty = getattr(sp, t)
    sig = {"x": sp.ptr[ty], "out": sp.ptr[ty], "n": sp.i32, "s": sp.i32, "B": b}
    return kern.compile(sig, target="sm_90a", stop_after=stop_after, cache=False)


def _interpreter_offsets(expr: str, s: int, n: int, b: int) -> np.ndarray:
    kern = sp.loads(OFFSETS.format(expr=expr), "case.spk").kernels["offsets"]
    o = np.full(2 * b, -7, np.int64)
    kern.interpret[(2,)](o, s, n, B=b)
    return o.reshape(2, b)


def _mismatches(expr: str, t: str, b: int, s: int, n: int) -> list[str]:
    """Per program and pointer: where the PTX's accessed element addresses differ from x/out + E *
    (the interpreter's offsets below n)."""
    c = _compiled(expr, t, b)
    offs = _interpreter_offsets(expr, s, n, b)
    e = BYTES[t]
    bad = []
    for pid in range(2):
        acc = ptx_accesses(c.ptx, 32 * c.num_warps, pid, [X_ADDR, OUT_ADDR, n, s])
        want = offs[pid][offs[pid] < n]
        assert len(want) > 0
        for store, base in ((False, X_ADDR), (True, OUT_ADDR)):
            got = sorted(set(element_addresses(acc, store, e)))  # (a replicated layout repeats some)
            if got != sorted({int(base + e * o) for o in want}):
                bad.append(f"program {pid}, {'out' if store else 'x'}")
    return bad


@pytest.mark.parametrize("t", ["f32", "f16", "i8"])
@pytest.mark.parametrize("s", [(1 << 31) - 600, -(1 << 31) + 5, 12345])
def test_an_unproven_small_tile_addresses_the_wrapped_offsets(t: str, s: int) -> None:
    """``s + arange(0, 1024)`` (8 or 16 registers per thread): the i32 sum wraps inside the tile for
    s = 2**31 - 600; each element's address is x + E * the wrapped offset (was x + E * (s + i) in 64
    bits: the strength reduction's constant steps from the thread's first register)."""
    assert _mismatches("s + arange(0, B)", t, 1024, s, WRAP_N) == []


@pytest.mark.parametrize("t", ["f32", "i8"])
@pytest.mark.parametrize("expr, s, b", [
    ("s * 4 + arange(0, B)", (1 << 29) - 1, 1024),        # blocks of 4: s * 4 = 2**31 - 4
    ("arange(0, B) + s * 16", (1 << 27) - 1, 4096),
    ("(s * 4 + 100) + arange(0, B)", (1 << 29) - 30, 1024),
    ("s * 1024 + arange(0, B)", (1 << 21) - 1, 4096),     # four aligned blocks of 1024
])
def test_proven_blocks_whose_bases_wrap(t: str, expr: str, s: int, b: int) -> None:
    """Offsets proven in aligned blocks (address_form.py) but not from block to block: the blocks'
    base addresses are the wrapped offsets' too."""
    assert _mismatches(expr, t, b, s, WRAP_N) == []


def test_one_aligned_block_keeps_its_form() -> None:
    """``program_id(0) * B + arange(0, B)``, the usual form (one block, one base per pointer): a
    ``getelementptr inbounds`` base and constant offsets as before, no inline asm."""
    ir = _compiled("program_id(0) * B + arange(0, B)", "f32", 1024, "llvm").llvm
    assert "mad.wide" not in ir
    assert len(re.findall(r"getelementptr inbounds float, ptr addrspace\(1\) %p_\w+, i64 %", ir)) == 2
    assert _mismatches("program_id(0) * B + arange(0, B)", "f32", 1024, 0, WRAP_N) == []


def test_the_emitted_ir_gives_llvm_no_wrapping_index_to_relate() -> None:
    """Structurally: the unproven tile's addresses are one ``mad.wide.s32`` of the i32 offset each
    (8 registers, two pointers), and no ``getelementptr`` with a sign-extended run-time index is left."""
    ir = _compiled("s + arange(0, B)", "f32", 1024, "llvm").llvm
    assert len(re.findall(r'asm "mad\.wide\.s32 \$0, \$1, 4, \$2;"', ir)) == 2 * 8
    assert "getelementptr" not in ir


def test_the_ptx_evaluator_sees_the_strength_reductions_constant_steps() -> None:
    """The evaluator executes what the PTX computes: for the steps ``add.s64 %rd, %rd, 512`` of an
    address kept as a ``getelementptr`` (an i64 offset, whose 64-bit sum does not wrap), the
    addresses are the offsets'."""
    expr = "s.to(i64) + arange(0, B).to(i64)"
    src = KERNEL.format(t="f32", expr=expr).replace("m = offs < n", "m = offs < n.to(i64)")
    kern = sp.loads(src, "case.spk").kernels["k"]
    sig = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "n": sp.i32, "s": sp.i32, "B": 1024}
    c = kern.compile(sig, target="sm_90a", cache=False)
    assert re.search(r"add\.s64\s+%rd\d+, %rd\d+, 512;", c.ptx)
    s = (1 << 31) - 600
    acc = ptx_accesses(c.ptx, 128, 0, [X_ADDR, OUT_ADDR, WRAP_N, s])
    want = sorted(X_ADDR + 4 * (s + i) for i in range(1024) if s + i < WRAP_N)
    assert element_addresses(acc, False, 4) == want
