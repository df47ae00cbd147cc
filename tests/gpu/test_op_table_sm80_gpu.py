"""The op table's bf16 cases built for **sm_80** and run on the GPU at hand through their PTX
(tests/support/foreign_arch.py), against the interpreter, as tests/gpu/test_op_table_gpu.py does
for the native target.

Below sm_90 the lowering has its own sequences for bf16 (backend/lower/elementwise.py): there is
no ``cvt.rn.bf16.f64`` nor a conversion to bf16 from a 32/64-bit integer, so f64 -> bf16 and
integer -> bf16 go through a value rounded toward zero with its last bit set where inexact (round
to odd), then ``cvt.rn.bf16.f32``; and LLVM legalizes bf16 arithmetic through f32. Neither
sequence runs natively on an sm_90 GPU, so this is where they meet hardware. The 8-bit float
conversions are refused on sm_80 (SP0577, tests/frontend/test_op_table_interp.py) and left out."""

from __future__ import annotations

import pytest

from sparsile.tests.support.foreign_arch import ptx_when_foreign_arch
from sparsile.tests.support.op_table_cases import groups, needs_fp8_cvt
from sparsile.tests.support.op_table_compare import check_device


def bf16_cases() -> dict[str, list]:
    """Every legal case whose operand or result is bf16 (and no 8-bit float conversion), by group."""
    out: dict[str, list] = {}
    for name, cases in groups().items():
        keep = [c for c in cases if "bf16" in (c.t, c.result) and not needs_fp8_cvt(c)]
        if keep:
            out[name] = keep
    return out


GROUPS = bf16_cases()


def sm80_launch(kernel, args: tuple) -> None:
    with ptx_when_foreign_arch("sm_80"):
        kernel[(1,)](*args, target="sm_80")


def test_the_selection_holds_the_below_sm90_sequences() -> None:
    """f64 -> bf16 and each integer -> bf16 conversion are among the cases (CPU)."""
    converted = {c.t for cases in GROUPS.values() for c in cases if c.op == "arith.cast" and c.result == "bf16"}
    assert {"f64", "i64", "u64", "i32", "u32", "f32"} <= converted, converted


@pytest.mark.gpu
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_op_table_bf16_group_on_sm80_ptx(group: str) -> None:
    rows, failed = [], []
    for case in GROUPS[group]:
        try:
            rows += check_device(case, sm80_launch)
        except Exception as e:  # one case that does not compile or launch: named, the others still run
            failed.append(f"{case.name}: {type(e).__name__}: {str(e)[:300]}")
    assert not rows and not failed, (f"{group} (sm_80 PTX): {len(rows)} elements disagree, {len(failed)} cases "
                                     "failed\n" + "\n".join(failed + rows))
