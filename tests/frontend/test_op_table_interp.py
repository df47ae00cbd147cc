"""The op table on the CPU (tests/support/op_table_cases.py): every elementwise op of the registry
and every conversion between two scalar types, on edge and random values, (a) compiles to PTX for
sm_90a, sm_100a and sm_80 (8-bit float ops SP0577 there, as docs/language.md rule 8 says), (b) is
refused by sema exactly where the table says, with its SP code, and (c) gives in the interpreter
the values of an independent reference (tests/support/op_table_reference.py: exact rationals and
Python integers, not the interpreter's numerics). The GPU runs the same kernels against the
interpreter in tests/gpu/test_op_table_gpu.py; a few of its groups run here with the interpreter
standing in for the GPU, so its body cannot rot unseen."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T
from sparsile.frontend.ops import core
from sparsile.tests.support.compile import compile_src
from sparsile.tests.support.op_table_cases import (
    FLOATS,
    KINDS,
    OUT_OF_SCOPE,
    TYPES,
    all_cases,
    elementwise_ops,
    group_source,
    groups,
    needs_fp8_cvt,
    spelling,
)
from sparsile.tests.support.op_table_compare import check_device, check_interpreter, interpreter_launch
from sparsile.tests.support.op_table_reference import FMTS, ref_convert, round_to

GROUPS = groups()
OPS = sorted(KINDS)


def test_every_elementwise_op_kind_and_type_is_in_the_table() -> None:
    """Each ELEMENTWISE op of the registry is covered or out of scope with a reason; each kind has a
    spelling; every scalar type (tf32 and the 8-bit floats too) is an operand and a destination."""
    missing = [op for op in elementwise_ops() if op not in KINDS and op not in OUT_OF_SCOPE]
    assert not missing, f"elementwise ops the op table does not cover: {missing}"
    for op, kinds in KINDS.items():
        for kind in kinds:
            assert spelling(op, kind)
    assert set(TYPES) == {t.name for t in T.SCALAR_TYPES.values()}
    assert {"tf32", "e4m3", "e5m2", "bool", "u64"} <= set(TYPES)
    assert set(KINDS["arith.binary"]) == core.BINARY_OPS and KINDS["math"] == core.MATH_FUNCS
    cases = all_cases()
    assert len(cases) == sum(len(k) for k in KINDS.values()) * len(TYPES)


def test_sema_refuses_exactly_the_refused_cases() -> None:
    """The cases the table marks refused fail in sema with the SP code it names (never an internal
    error); the others pass sema (their static_assert checks the result type the table expects)."""
    wrong = []
    for case in all_cases():
        try:
            compile_src(case.source(), stop_after="ir", cache=False)
            got = None
        except CompileError as e:
            got = e.diagnostics[0].code
        if got != case.refused:
            wrong.append((case.name, got, case.refused))
    assert not wrong


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("target", ["sm_90a", "sm_100a", "sm_80"])
def test_every_case_compiles_to_ptx(op: str, target: str) -> None:
    """Each group's cases in one kernel, compiled to PTX; on sm_80 the cases converting to or from
    an 8-bit float are SP0577 (no ``cvt`` for them), the bit moves and tests compile."""
    for name, cases in sorted(GROUPS.items()):
        if not name.startswith(op + ":"):
            continue
        if target == "sm_80":
            for case in cases:
                if needs_fp8_cvt(case):
                    with pytest.raises(CompileError) as info:
                        compile_src(case.source(), target=target, cache=False)
                    assert info.value.diagnostics[0].code == "SP0577", case.name
            cases = [c for c in cases if not needs_fp8_cvt(c)]
            if not cases:
                continue
        ptx = compile_src(group_source(cases), target=target, cache=False).ptx
        assert ".entry k" in ptx, name


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_interpreter_matches_the_reference(group: str) -> None:
    """Every case of the group, every element: the interpreter's value is the reference's (exact
    ops: same bits, any NaN for NaN; approximate math: within the PTX ISA bound)."""
    rows = [r for case in GROUPS[group] for r in check_interpreter(case)]
    assert not rows, f"{len(rows)} disagreements:\n" + "\n".join(rows[:40])


@pytest.mark.parametrize("group", ["arith.binary:f16", "arith.cast:f64", "math:e4m3", "arith.unary:i8",
                                   "arith.cmp:bf16", "arith.select:u64"])
def test_the_gpu_comparison_passes_with_the_interpreter_as_device(group: str) -> None:
    """tests/gpu/test_op_table_gpu.py's body (poisoned outputs, the exact / bounded comparison)
    with the interpreter launched as the device: what can fail on the GPU is the hardware only."""
    rows = [r for case in GROUPS[group] for r in check_device(case, interpreter_launch)]
    assert not rows, "\n".join(rows[:20])


def test_abs_of_an_8_bit_float_saturates_as_every_op_on_one() -> None:
    """``abs`` of e5m2 +-inf is 57344, the largest finite e5m2: the GPU computes it in f32 and
    converts back with ``cvt.rn.satfinite`` (docs/language.md rule 8: 8-bit floats compute in f32
    and round as a cast to them does); the interpreter gave inf."""
    case = next(c for c in all_cases() if c.name == "math:abs:e5m2")
    src = case.source()
    out = case.output()
    case.kernel().interpret[(1,)](case.inputs["a"], out)
    x = case.inputs["a"].astype(np.float64)
    got = out.astype(np.float64)
    assert got[np.isinf(x)].tolist() == [57344.0, 57344.0]
    assert "cvt.rn.satfinite.e5m2x2.f32" in compile_src(src, cache=False).ptx


def test_reference_rounding_matches_numpy_where_numpy_rounds_once() -> None:
    """The reference's rounding (round_to) agrees with numpy's correctly rounded float64 -> f32 /
    f16 casts on random values and ties, and differs from rounding twice where that matters."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-40, 40, 3000),
                        (1 + (2 * rng.integers(0, 2**23, 500) + 1) * 2.0**-24)])
    for t, dt in (("f32", np.float32), ("f16", np.float16)):
        with np.errstate(over="ignore"):
            want = x.astype(dt).astype(np.float64)
        got = np.array([round_to(float(v), t) for v in x])
        assert np.array_equal(got, want), t
    assert ref_convert(2**24 + 2**16 + 1, "i64", "bf16") == 2**24 + 2**17  # once, not through f32
    assert ref_convert(1 + 2**-11, "f32", "tf32") == 1 + 2**-10  # cvt.rna: ties away from zero
    assert ref_convert(math.inf, "f32", "e4m3") == 448.0 and math.isnan(ref_convert(math.nan, "f16", "e5m2"))
    assert ref_convert(-1e10, "f64", "u32") == 0 and ref_convert(math.nan, "f32", "i64") == 0
    assert FMTS["f16"].max == 65504.0 and FMTS["bf16"].min_subnormal == 2.0**-133


def test_float_types_are_every_float_of_the_language() -> None:
    assert set(FLOATS) == {"f16", "bf16", "f32", "f64", "tf32", "e4m3", "e5m2"}
