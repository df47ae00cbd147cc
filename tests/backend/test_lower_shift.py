"""Shifts by run-time amounts (backend/lower/elementwise.py; docs/language.md rule 6: an amount at or
above the width gives 0, or the sign for a signed `>>`).

The first GPU run of the op table (tests/gpu/test_op_table_gpu.py, on an H100) found `a << b` on i64
giving `a` for b = -2**63: LLVM's NVPTX backend turned `select(b >= 64, 0, a << b)` into PTX's
clamping `shl.b64` with the amount truncated to 32 bits first, so every amount whose low 32 bits
are below 64 (2**32, 2**63, ...) shifted by those bits. These tests read the PTX: the 64-bit amount
is compared in 64 bits and masked before the 32-bit shift operand is taken from it."""

from __future__ import annotations

import re

import pytest

from sparsile.tests.support.compile import compile_src

SRC = """
@kernel
def k(A: ptr[{t}], B: ptr[{t}], O: ptr[{t}]):
    o = arange(0, 4)
    store(O + o, load(A + o) {op} load(B + o))
"""


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_80"])
@pytest.mark.parametrize("t,op", [("i64", "<<"), ("u64", "<<"), ("u64", ">>")])
def test_a_64_bit_amount_is_not_truncated_into_a_clamping_shift(target: str, t: str, op: str) -> None:
    ptx = compile_src(SRC.format(t=t, op=op), target).ptx
    shifts = re.findall(r"\b(?:shl\.b64|shr\.u64)\s+%rd\d+, %rd\d+, (%r\d+);", ptx)
    assert shifts, ptx
    for amount in shifts:
        # the 32-bit amount register is the masked one (`and.b32 %rN, %rM, 63`), never a bare cvt of b
        assert re.search(rf"and\.b32\s+{re.escape(amount)}, %r\d+, 63;", ptx), (amount, ptx)
    assert re.search(r"setp\.\w+\.u64\s+%p\d+, %rd\d+, 6[34];", ptx), ptx  # the >= 64 test on all 64 bits


VARIANTS = {
    "tile": SRC,
    "scalar amount": """
@kernel
def k(A: ptr[{t}], b: {t}, O: ptr[{t}]):
    o = arange(0, 4)
    store(O + o, load(A + o) {op} b)
""",
    "constant value": """
@kernel
def k(A: ptr[{t}], B: ptr[{t}], O: ptr[{t}]):
    o = arange(0, 4)
    store(O + o, {t}(5) {op} load(B + o))
""",
    "i32 amount": """
@kernel
def k(A: ptr[{t}], B: ptr[i32], O: ptr[{t}]):
    o = arange(0, 4)
    store(O + o, load(A + o) {op} load(B + o).to({t}))
""",
    "u32 amount": """
@kernel
def k(A: ptr[{t}], B: ptr[u32], O: ptr[{t}]):
    o = arange(0, 4)
    store(O + o, load(A + o) {op} load(B + o).to({t}))
""",
}


def _definitions(ptx: str) -> dict[str, tuple[str, list[str]]]:
    """Register -> (opcode, operands) of the PTX instruction that writes it (straight-line kernels)."""
    defs = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*([a-z][\w.]*)\s+(%\w+),\s*(.*);", line)
        if m:
            defs[m.group(2)] = (m.group(1), [x.strip() for x in m.group(3).split(",")])
    return defs


def _bounded_by_63(reg: str, defs: dict[str, tuple[str, list[str]]]) -> bool:
    """The 32-bit shift amount ``reg`` is at most 63 by construction: ``and ..., 63`` or ``min.u ..., 63``,
    directly or through the ``cvt`` that takes the low 32 bits of such a 64-bit value."""
    opcode, ops = defs.get(reg, ("", []))
    if opcode.startswith("cvt.u32.u64"):
        return _bounded_by_63(ops[0], defs)
    return (opcode.startswith("and.b") or opcode.startswith("min.u")) and ops[-1] == "63"


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("t,op", [("i64", "<<"), ("u64", "<<"), ("u64", ">>"), ("i64", ">>")])
def test_every_64_bit_shift_amount_is_bounded_before_the_32_bit_operand(target: str, variant: str, t: str,
                                                                         op: str) -> None:
    """Every 64-bit shift (``shl.b64``, ``shr.u64``, and the signed ``>>``'s ``shr.s64``, which LLVM forms
    as ``min.u64(b, 63)`` then the shift, the sign fill for every amount >= 63) takes an amount bounded
    by 63 in all of its bits before PTX's 32-bit amount operand is taken from it; so no amount of
    2**32 or more (a negative one as unsigned) is truncated to a small one. Amounts of other types,
    a scalar amount and a constant shifted value, on every target family."""
    ptx = compile_src(VARIANTS[variant].format(t=t, op=op), target).ptx
    defs = _definitions(ptx)
    shifts = re.findall(r"\b(?:shl\.b64|shr\.u64|shr\.s64)\s+%rd\d+, %rd\d+, (%r\d+);", ptx)
    assert shifts, ptx
    for amount in shifts:
        assert _bounded_by_63(amount, defs), (amount, ptx)
    if op == "<<" or t == "u64":  # the result for amounts >= 64 is selected: 0
        assert re.search(r"setp\.gt\.u(?:64|32)\s+%p\d+, %r\w+, 63;", ptx), ptx
        assert re.search(r"selp\.b64\s+%rd\d+, 0, %rd\d+, %p\d+;", ptx), ptx
