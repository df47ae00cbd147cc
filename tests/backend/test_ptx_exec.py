"""The PTX evaluator with a memory image (tests/backend/ptx_exec.py) and its integer instructions
(tests/backend/ptx_ops.py) on hand-written PTX: what it computes, and that it refuses what it
cannot know (an unknown instruction, an unspecified division, an access outside the arrays, a
store of an undefined register, racing stores) instead of guessing."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.backend.address_eval import UnknownInstruction
from sparsile.tests.backend.ptx_exec import MemoryFault, run_grid, run_program
from sparsile.tests.backend.ptx_ops import UndefinedResult, integer_op

HEAD = """.visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1, .param .u32 k_param_2)
{
    .reg .pred %p<4>;
    .reg .b16 %rs<8>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    ld.param.b64 %rd1, [k_param_0];
    ld.param.b64 %rd2, [k_param_1];
    ld.param.b32 %r9, [k_param_2];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
"""


def _run(body: str, x: list[int], threads: int | None = None, scalar: int = 0) -> list[int]:
    """``out[tid] = f(x[tid])`` for the body (x in %r2 once loaded, the result stored from %r3)."""
    xs = np.array(x, np.int32)
    out = np.full(len(x), 0x5A5A5A5A, np.int32)
    ptx = HEAD + "    ld.global.b32 %r2, [%rd4];\n" + body + "    st.global.b32 [%rd5], %r3;\n    ret;\n}\n"
    run_program(ptx, threads or len(x), 0, [xs, out, scalar])
    return out.tolist()


def test_a_signed_conversion_into_a_wider_register_sign_extends() -> None:
    """``cvt.s8.s32 %rs, %r`` leaves the 8-bit value sign-extended in the 16-bit register (LLVM's
    sign extension in a register), so ``abs.s16`` of it is 7 for 0xF9."""
    body = "    cvt.s8.s32 %rs1, %r2;\n    abs.s16 %rs2, %rs1;\n    cvt.s32.s16 %r3, %rs2;\n"
    assert _run(body, [0xF9, -128, 0x17F, 5]) == [7, 128, 127, 5]


def test_a_divergent_branch_runs_both_paths_and_reconverges() -> None:
    body = """    and.b32 %r4, %r1, 1;
    setp.eq.b32 %p1, %r4, 0;
    @%p1 bra $EVEN;
    mul.lo.s32 %r3, %r2, 3;
    bra.uni $JOIN;
$EVEN:
    add.s32 %r3, %r2, 100;
$JOIN:
    add.s32 %r3, %r3, 1;
"""
    assert _run(body, [10, 10, 20, 20]) == [111, 31, 121, 61]


def test_a_masked_load_keeps_the_other_value_and_a_masked_off_address_is_not_accessed() -> None:
    """The masked load's form (``mov`` the other value, ``@%p ld``), reading past the array where
    the predicate is off: only the active threads access memory."""
    body = """    setp.lt.u32 %p1, %r1, %r9;
    mov.b32 %r3, -7;
    add.s64 %rd6, %rd4, 4096;
    @!%p1 ld.global.b32 %r3, [%rd6];
    @%p1 ld.global.b32 %r3, [%rd4];
"""
    assert _run(body, [1, 2, 3, 4], scalar=4) == [1, 2, 3, 4]
    with pytest.raises(MemoryFault, match="outside every argument array"):
        _run(body, [1, 2, 3, 4], scalar=2)


def test_a_division_by_zero_in_an_active_thread_is_refused() -> None:
    body = "    setp.ne.b32 %p1, %r2, 0;\n    mov.b32 %r3, 0;\n    @%p1 div.s32 %r3, 100, %r2;\n"
    assert _run(body, [7, 0, -9]) == [14, 0, -11]
    with pytest.raises(UndefinedResult, match=r"div\.s32 of 100 by 0"):
        _run("    div.s32 %r3, 100, %r2;\n", [7, 0, -9])
    with pytest.raises(UndefinedResult, match="of -2147483648 by -1"):
        _run("    rem.s32 %r3, %r2, -1;\n", [-(2**31)])


@pytest.mark.parametrize("body", ["    add.f32 %r3, %r2, %r2;\n", "    ld.local.b32 %r3, [%rd4];\n",
                                  "    add.cc.s32 %r3, %r2, 1;\n",
                                  "    setp.lt.b32 %p1, %r2, 0;\n    selp.b32 %r3, 1, 0, %p1;\n"])
def test_an_instruction_it_does_not_know_is_refused(body: str) -> None:
    with pytest.raises(UnknownInstruction):
        _run(body, [1, 2])


def test_a_store_of_an_undefined_register_and_racing_stores_are_faults() -> None:
    with pytest.raises(MemoryFault, match="undefined value"):
        _run("    setp.eq.b32 %p1, %r1, 0;\n    @%p1 mov.b32 %r3, 1;\n", [1, 2])
    ptx = HEAD + "    st.global.b32 [%rd2], %r1;\n    ret;\n}\n"
    with pytest.raises(MemoryFault, match="different values"):
        run_program(ptx, 2, 0, [np.zeros(2, np.int32), np.zeros(2, np.int32), 0])


def test_vector_accesses_and_the_programs_of_a_grid() -> None:
    """``ld.global.v2.b32`` / ``st.global.v2.b32`` at ``(ctaid * ntid + tid) * 8``: each program its part."""
    ptx = HEAD.replace("mul.wide.u32 %rd3, %r1, 4;", "mov.u32 %r5, %ctaid.x;\n    mov.u32 %r6, %ntid.x;\n"
                       "    mad.lo.s32 %r7, %r5, %r6, %r1;\n    mul.wide.u32 %rd3, %r7, 8;")
    ptx += "    ld.global.v2.b32 {%r2, %r3}, [%rd4];\n    sub.s32 %r4, %r2, %r3;\n"
    ptx += "    st.global.v2.b32 [%rd5], {%r4, %r3};\n    ret;\n}\n"
    x = np.arange(16, dtype=np.int32) ** 2
    out = np.zeros(16, np.int32)
    run_grid(ptx, 4, 2, [x, out, 0])
    assert out[0::2].tolist() == (x[0::2] - x[1::2]).tolist() and out[1::2].tolist() == x[1::2].tolist()


def _op(op: str, *vals: int) -> int:
    return int(integer_op(op, [np.array([v & 0xFFFFFFFFFFFFFFFF], np.uint64) for v in vals], np.ones(1, bool))[0])


@pytest.mark.parametrize("op, vals, want", [
    ("shr.s32", (-8, 40), 0xFFFFFFFF), ("shr.u32", (-8, 32), 0), ("shl.b16", (1, 15), 0x8000), ("shl.b16", (1, 16), 0),
    ("shr.s16", (0x8000, 3), 0xF000), ("min.s32", (-1, 1), 0xFFFFFFFF), ("min.u32", (-1, 1), 1),
    ("mul.hi.s32", (-2, 2**30 + 1), 0xFFFFFFFF), ("mul.hi.u32", (-2, 2), 1), ("mul.wide.s16", (-2, 3), 2**32 - 6),
    ("div.s32", (-7, 2), 2**32 - 3), ("rem.s32", (-7, 2), 2**32 - 1), ("div.u32", (-7, 2), 0x7FFFFFFC),
    ("abs.s32", (-(2**31),), 2**31), ("neg.s16", (1,), 0xFFFF), ("popc.b64", (-1,), 64), ("clz.b32", (1,), 31),
    ("brev.b32", (1,), 2**31), ("bfe.s32", (0xF0, 4, 4), 0xFFFFFFFF), ("bfe.u32", (0xF0, 4, 4), 15),
    ("bfi.b32", (0xF, 0, 8, 4), 0xF00), ("prmt.b32", (0x8000, 0, 0x9991), 0xFFFFFF80),
    ("cvt.sat.s8.s32", (300,), 127), ("cvt.sat.u8.s32", (-5,), 0), ("cvt.u16.u32", (0x12345,), 0x2345),
    ("setp.lt.u32", (-1, 1), 0), ("setp.lt.s32", (-1, 1), 1), ("setp.hi.u16", (0x8000, 1), 1),
    ("slct.b32.s32", (5, 6, -1), 6), ("selp.b64", (5, 6, 1), 5), ("mad.lo.s32", (3, 4, -20), 2**32 - 8),
])
def test_integer_instructions(op: str, vals: tuple[int, ...], want: int) -> None:
    """Each against its PTX ISA definition, at the edges (shift amounts past the width, MIN, -1)."""
    assert _op(op, *vals) == want
