"""Float kernels checked on the CPU: their PTX executed (tests/backend/ptx_exec.py with the float
instructions of tests/backend/ptx_float.py and ptx_fcvt.py) against the interpreter, bit for bit,
on the op table's edge and random inputs (zeros of both signs, infinities, NaN, subnormals, the
limits, rounding ties and their neighbours: tests/support/op_table_cases.py).

Every op-table case on or to a float type whose code uses only instructions the PTX ISA defines
exactly: arithmetic, ``//``, ``%``, ``maximum`` / ``minimum``, comparisons, ``where``, negation,
``not``, ``sqrt`` / ``abs`` / ``floor`` / ``ceil`` and every conversion (fp8 and tf32 included).
Left out: ``**`` and the math functions of docs/language.md rule 10 (``ex2`` / ``lg2`` /
``sin`` / ``cos`` / ``rsqrt.approx`` / ``rcp.approx``: no bit-exact model; the GPU op table checks
them against their error bounds). NaN outputs compare by NaN-ness only: the language promises "a
NaN" (docs/language.md rule 9), and the PTX ISA gives the canonical NaN or "an unspecified NaN".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.ir import types as T
from sparsile.tests.backend.ptx_exec import run_grid
from sparsile.tests.backend.test_ptx_differential import TAIL, kernel_source, poisoned
from sparsile.tests.support.compile import compile_src
from sparsile.tests.support.op_table_cases import (
    FLOATS,
    Case,
    array,
    edges,
    groups,
    hash_name,
    needs_fp8_cvt,
    random_values,
    spelling,
)

EXACT_MATH = ("sqrt", "abs", "floor", "ceil")
"""The math functions whose GPU code is exact (the others use ``.approx`` instructions)."""


def exact_case(case: Case) -> bool:
    """Whether the case's GPU code uses only instructions with an exact model."""
    if case.op == "math":
        return case.kind in EXACT_MATH
    return not (case.op == "arith.binary" and case.kind == "pow")


def _float_groups() -> dict[str, list[Case]]:
    out = {}
    for name, cases in groups().items():
        kept = [c for c in cases if (c.t in FLOATS or c.result in FLOATS) and exact_case(c)]
        if kept:
            out[name] = kept
    return out


GROUPS = _float_groups()


@functools.cache
def _compiled(src: str, target: str) -> tuple[str, int]:
    c = compile_src(src, target=target, cache=False)
    return c.ptx, 32 * c.num_warps


def group_kernel(cases: list[Case]) -> tuple[str, list[np.ndarray], list[str]]:
    """One kernel computing every case on its own inputs (``a0``, ``b0``, ``a1``, ...; inputs of
    one length, the shorter ones repeated): (source, input arrays, result types)."""
    inputs, arrays, outputs = [], [], []
    size = max(len(x) for c in cases for x in c.inputs.values())
    for j, case in enumerate(cases):
        for v, x in case.inputs.items():
            inputs.append((f"{v}{j}", "bool" if v == "c" else case.t))
            arrays.append(np.resize(x, size))
        outputs.append((case.result, re.sub(r"\b([abc])\b", rf"\g<1>{j}", spelling(case.op, case.kind))))
    return kernel_source(inputs, outputs), arrays, [r for r, _ in outputs]


def _same(d: np.ndarray, r: np.ndarray, t: str) -> np.ndarray:
    """Per element: equal bits, or (a float type) both NaN."""
    width = d.dtype.itemsize
    same = ~(d.view(np.uint8) != r.view(np.uint8)).reshape(len(d), width).any(axis=1)
    if T.SCALAR_TYPES[t].is_float:
        with np.errstate(invalid="ignore"):
            same |= np.isnan(d.astype(np.float64)) & np.isnan(r.astype(np.float64))
    return same


def float_differences(src: str, target: str, inputs: list[np.ndarray], results: list[str],
                      edit: Callable[[str], str] | None = None) -> list[str]:
    """tests/backend/test_ptx_differential.py's ``differences`` with NaN outputs compared by
    NaN-ness: a line per output element that differs."""
    size = len(inputs[0])
    n = size - TAIL
    grid = -(-n // 256)
    dev = [poisoned(r, size) for r in results]
    ref = [poisoned(r, size) for r in results]
    with np.errstate(all="ignore"):
        sp.loads(src, "case.spk").kernels["k"].interpret[(grid,)](*[x.copy() for x in inputs], *ref, n)
    ptx, threads = _compiled(src, target)
    ptx = edit(ptx) if edit is not None else ptx
    args = [x.copy() for x in inputs]
    run_grid(ptx, threads, grid, [*args, *dev, n])
    rows = []
    for j, (d, r, t) in enumerate(zip(dev, ref, results, strict=True)):
        for i in np.flatnonzero(~_same(d, r, t))[:8]:
            ins = ", ".join(f"{x[i]!r}" for x in inputs)
            rows.append(f"output {j} [{i}] inputs ({ins}): ptx={d[i]!r} interp={r[i]!r}")
    return rows


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_op_table_float_group_ptx_matches_the_interpreter(group: str) -> None:
    src, arrays, results = group_kernel(GROUPS[group])
    rows = float_differences(src, "sm_90a", arrays, results)
    assert not rows, f"{group}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


SM80_GROUPS = {g: kept for g, cases in GROUPS.items()
               if (kept := [c for c in cases if "bf16" in (c.t, c.result) and not needs_fp8_cvt(c)])}
"""The cases on or to bf16, which sm_80 computes differently (``fma.rn.bf16`` for ``+``; an f64 or a
64-bit integer to bf16 by way of f32 rounded to odd)."""


@pytest.mark.parametrize("group", sorted(SM80_GROUPS))
def test_op_table_bf16_group_ptx_for_sm80_matches_the_interpreter(group: str) -> None:
    src, arrays, results = group_kernel(SM80_GROUPS[group])
    rows = float_differences(src, "sm_80", arrays, results)
    assert not rows, f"{group}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


@pytest.mark.parametrize("group, wrong, right", [
    ("arith.binary:f32", r"fma\.rn\.f32\s+(%r\d+), (%r\d+), (%r\d+), (%r\d+)",
     r"mul.rn.f32 \1, \2, \3; add.rn.f32 \1, \1, \4"),  # the remainder's fma unfused
    ("arith.binary:f32", r"cvt\.rzi\.f32\.f32", "cvt.rni.f32.f32"),
    ("arith.binary:f32", r"max\.f32", "max.NaN.f32"),  # maximum's NaN rule
    ("arith.binary:f64", r"div\.rn\.f64", "div.rp.f64"),
    ("arith.binary:bf16", r"add\.rn\.bf16", "add.rz.bf16"),
    ("arith.cast:f32", r"cvt\.rn\.f16\.f32", "cvt.rz.f16.f32"),
    ("arith.cast:f32", r"cvt\.rzi\.s32\.f32", "cvt.rmi.s32.f32"),
    ("arith.cast:i64", r"cvt\.rn\.f32\.s64", "cvt.rp.f32.s64"),
    ("arith.cast:f64", r"cvt\.rn\.satfinite\.e4m3x2\.f32\s+(%rs\d+), (%r\d+), (%r\d+)",
     r"cvt.rn.satfinite.e4m3x2.f32 \1, \3, \2"),  # the bytes swapped
    ("arith.cmp:f32", r"setp\.neu\.f32", "setp.ne.f32"),  # `!=` of a NaN
])
def test_the_comparison_catches_a_changed_float_instruction(group: str, wrong: str, right: str) -> None:
    """(The unchanged kernels agree: test_op_table_float_group_ptx_matches_the_interpreter.)"""
    src, arrays, results = group_kernel(GROUPS[group])

    def edit(ptx: str) -> str:
        changed = re.sub(wrong, right, ptx)
        assert changed != ptx, f"no {wrong} in the PTX"
        return changed

    assert float_differences(src, "sm_90a", arrays, results, edit)


FLOAT_EXPRESSIONS: list[tuple[str, bool]] = [
    ("a * b + a", False),  # (a product then a sum: each rounded to the type)
    ("(a + b) * (a - b)", False),
    ("a / b + b // a", False),
    ("a % b - b % a", False),
    ("maximum(a, b) - minimum(a, -b)", False),
    ("where(a < b, a, b * 2.0)", False),
    ("sqrt(abs(a)) + floor(b) - ceil(a)", False),
    ("(a.to(f32) * 3.0).to(a.dtype) + b", False),  # conversions between operations
    ("((a > b) != (b != b)).to(i32) + (a >= b) * 2", False),  # NaN in comparisons
    ("a.to(i32) + b.to(u8) - a.to(i16)", False),  # saturating conversions, NaN to 0
    ("(a * 0.1).to(e4m3).to(f32) + b.to(e5m2).to(f32)", True),  # fp8 rounding and saturation (sm_89+)
]
"""Compound float expressions of ``a`` and ``b``; True: it converts to fp8 (not for sm_80)."""


def float_expression_inputs(t: str, size: int) -> list[np.ndarray]:
    """``a``, ``b``: every pair of ``t``'s edge values, then seeded random pairs."""
    e = edges(t)
    pairs = [(x, y) for x in e for y in e][:size]
    rng = np.random.default_rng(hash_name(f"float-expr:{t}"))
    k = size - len(pairs)
    pairs += list(zip(random_values(t, k, rng), random_values(t, k, rng), strict=True))
    return [array([x for x, _ in pairs], t), array([y for _, y in pairs], t)]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("t", ["f32", "f16", "bf16", "f64"])
def test_compound_float_expressions_ptx_match_the_interpreter(t: str, target: str) -> None:
    """Every expression of :data:`FLOAT_EXPRESSIONS` on ``t`` in one kernel (each result widened to
    f64 as it is stored: exact), on 1024 pairs of values."""
    exprs = [e for e, fp8 in FLOAT_EXPRESSIONS if not (fp8 and target == "sm_80")]
    results = ["f64"] * len(exprs)
    src = kernel_source([("a", t), ("b", t)], [("f64", f"({e}).to(f64)") for e in exprs])
    rows = float_differences(src, target, float_expression_inputs(t, 1024), results)
    assert not rows, f"{t} on {target}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)
