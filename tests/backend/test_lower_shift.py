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
