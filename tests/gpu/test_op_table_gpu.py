"""The op table on the GPU (tests/support/op_table_cases.py): every elementwise op of the registry
and every conversion between two scalar types, one kernel per (op, type) on a tile of edge and
random values, run on the GPU with its output poisoned first and compared with the interpreter
element by element (tests/support/op_table_compare.py):

* exact ops (integer ops, IEEE ``.rn`` arithmetic, comparisons, ``where``, negation, every
  conversion, ``sqrt`` / ``floor`` / ``ceil`` / ``abs``, f64 ``rsqrt``): the same bits, any NaN
  equal to any NaN, the sign of a zero counted;
* approximate math (``exp``, ``exp2``, ``log``, ``log2``, ``rsqrt``, ``sin``, ``cos``, ``sigmoid``,
  ``tanh``, ``erf`` in f32 and below, and float ``**``): NaN where the interpreter has NaN, else
  within twice the bound the PTX ISA's stated errors give (op_table_reference.approx_bound, each
  constant citing its section), plus an ulp of a narrower result type.

Each test is one (op, operand type) group and lists every disagreeing element of it (op, types,
inputs, device value, interpreter value, the reference's value and the bound) in one message, so
one run triages everything; ``-n 8`` compiles the groups' kernels in parallel (each launch compiles
its kernel: 864 small kernels). ``SPARSILE_OP_TABLE_DEVICE=interp`` runs the same comparison with
the interpreter standing in for the GPU, on a machine without one."""

from __future__ import annotations

import os

import pytest

from sparsile.tests.support.op_table_cases import groups
from sparsile.tests.support.op_table_compare import check_device, gpu_launch, interpreter_launch

GROUPS = groups()
DEVICES = [pytest.param("gpu", marks=pytest.mark.gpu),
           pytest.param("interp", marks=pytest.mark.skipif(os.environ.get("SPARSILE_OP_TABLE_DEVICE") != "interp",
                                                            reason="SPARSILE_OP_TABLE_DEVICE=interp not set"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_op_table_group_matches_the_interpreter(group: str, device: str) -> None:
    launch = gpu_launch if device == "gpu" else interpreter_launch
    rows, failed = [], []
    for case in GROUPS[group]:
        try:
            rows += check_device(case, launch)
        except Exception as e:  # one case that does not compile or launch: named, the others still run
            failed.append(f"{case.name}: {type(e).__name__}: {str(e)[:300]}")
    assert not rows and not failed, (f"{group}: {len(rows)} elements disagree, {len(failed)} cases failed\n"
                                     + "\n".join(failed + rows))
