"""Integer kernels checked on the CPU: their PTX executed (tests/backend/ptx_exec.py) against the
interpreter, bit for bit, on the same edge and random inputs.

So far only a GPU run caught silent wrong results in compiled integer code (wrapping, shifts by the
width or more, ``//`` / ``%`` by zero, conversions, unsigned comparisons, selects); the same
comparison here runs in every CPU test run. Two tables:

* every integer case of the op table (tests/support/op_table_cases.py: each elementwise op and
  conversion with an integer or bool result, on every integer type and bool, with its edge values:
  0, +-1, MIN, MAX, shift amounts around the width, divisors 0 and -1), one kernel per (op, type);
* compound expressions (:data:`EXPRESSIONS`): divisions by constants (``mul.hi``), mixed types,
  conversions between operations, shifts by computed amounts, bools in arithmetic.

Each kernel works on a 1-D tile per program with a masked load (``other=``) and a masked store;
``n`` ends inside the last program, so the outputs' tails must keep their poison in both runs.
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
from sparsile.tests.support.compile import compile_src
from sparsile.tests.support.op_table_cases import array, edges, groups, hash_name, random_values, spelling
from sparsile.tests.support.op_table_reference import int_range

INT_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
BLOCK = 256
TAIL = 5
"""Elements past ``n`` at the end of the inputs: masked off, their outputs keep the poison."""


def _integer_groups() -> dict[str, list]:
    """The op table's groups on integer and bool operands, reduced to the cases with an integer or
    bool result (the others compute in floats)."""
    out = {}
    for name, cases in groups().items():
        kept = [c for c in cases if c.t in (*INT_TYPES, "bool") and c.result in (*INT_TYPES, "bool")]
        if kept:
            out[name] = kept
    return out


GROUPS = _integer_groups()


def kernel_source(inputs: list[tuple[str, str]], outputs: list[tuple[str, str]]) -> str:
    """A kernel of ``BLOCK`` elements per program: loads each ``(name, type)`` of ``inputs`` from
    pointer parameter ``NAME`` masked to ``i < n`` (``other=1``), stores each
    ``(result type, expression)`` of ``outputs`` masked too."""
    params = [f"{v.upper()}: ptr[{t}]" for v, t in inputs] + [f"O{j}: ptr[{r}]" for j, (r, _) in enumerate(outputs)]
    lines = ["@kernel", f"def k({', '.join(params)}, n: i32):",
             f"    i = program_id(0) * {BLOCK} + arange(0, {BLOCK})", "    m = i < n"]
    lines += [f"    {v} = load({v.upper()} + i, mask=m, other={'True' if t == 'bool' else '1'})" for v, t in inputs]
    lines += [f"    store(O{j} + i, {e}, mask=m)" for j, (_, e) in enumerate(outputs)]
    return "\n".join([*lines, ""])


@functools.cache
def _compiled(src: str, target: str) -> tuple[str, int]:
    c = compile_src(src, target=target, cache=False)
    return c.ptx, 32 * c.num_warps


def poisoned(t: str, n: int) -> np.ndarray:
    """An output array of ``n`` elements of ``t``, every byte 0x5A (a bool: alternating)."""
    out = np.empty(n, T.SCALAR_TYPES[t].numpy_dtype)
    if t == "bool":
        out[:] = np.arange(n) % 3 == 0
    else:
        out.view(np.uint8)[:] = 0x5A
    return out


def differences(src: str, target: str, inputs: list[np.ndarray], results: list[str],
                edit: Callable[[str], str] | None = None) -> list[str]:
    """Run the kernel ``src`` over ``inputs`` (n = their length - TAIL) in the interpreter and as
    PTX for ``target`` (changed by ``edit``, a test's mutation), outputs poisoned first: a line per
    output element whose bits differ."""
    size = len(inputs[0])
    n = size - TAIL
    grid = -(-n // BLOCK)
    dev = [poisoned(r, size) for r in results]
    ref = [poisoned(r, size) for r in results]
    sp.loads(src, "case.spk").kernels["k"].interpret[(grid,)](*[x.copy() for x in inputs], *ref, n)
    ptx, threads = _compiled(src, target)
    ptx = edit(ptx) if edit is not None else ptx
    args = [x.copy() for x in inputs]
    run_grid(ptx, threads, grid, [*args, *dev, n])
    for x, y in zip(args, inputs, strict=True):
        assert x.tobytes() == y.tobytes(), "the PTX wrote to an input"
    rows = []
    for j, (d, r) in enumerate(zip(dev, ref, strict=True)):
        width = d.dtype.itemsize
        bad = np.flatnonzero((d.view(np.uint8) != r.view(np.uint8)).reshape(size, width).any(axis=1))
        for i in bad[:8]:
            ins = ", ".join(f"{x[i]!r}" for x in inputs)
            rows.append(f"output {j} [{i}] inputs ({ins}): ptx={d[i]!r} interp={r[i]!r}")
    return rows


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_op_table_integer_group_ptx_matches_the_interpreter(group: str) -> None:
    """Every case of the group in one kernel, each on its own inputs (``a0``, ``b0``, ``a1``, ...)."""
    cases = GROUPS[group]
    inputs, arrays, outputs = [], [], []
    for j, case in enumerate(cases):
        for v, x in case.inputs.items():
            inputs.append((f"{v}{j}", "bool" if v == "c" else case.t))
            arrays.append(x)
        outputs.append((case.result, re.sub(r"\b([abc])\b", rf"\g<1>{j}", spelling(case.op, case.kind))))
    src = kernel_source(inputs, outputs)
    rows = differences(src, "sm_90a", arrays, [r for r, _ in outputs])
    assert not rows, f"{group}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


SIGNED, UNSIGNED = ("i8", "i16", "i32", "i64"), ("u8", "u16", "u32", "u64")
EXPRESSIONS: list[tuple[str, tuple[str, ...]]] = [
    ("(a + b) * (a - b)", INT_TYPES),
    ("a * 3 + b // 7", INT_TYPES),  # a division by a constant: mul.hi and shifts
    ("a % 5 - b // 16 + a % 16", INT_TYPES),  # by a power of two: signed rounding toward zero
    ("a // -3 + b % -7", SIGNED),
    ("(a >> 3) ^ (b << 5)", INT_TYPES),
    ("a >> (b & 7) | a << (b % 70)", INT_TYPES),  # computed shift amounts, some past the width
    ("where(a < b, a // b, b % a)", INT_TYPES),  # divisions by zero inside a select
    ("maximum(a, b) - minimum(a, b)", INT_TYPES),
    ("abs(a) + abs(b)", SIGNED),
    ("~a + -b", INT_TYPES),
    ("(a == b) + (a < b) * 2 + (a >= 0) * 4", INT_TYPES),  # bools in arithmetic (i32)
    ("(a.to(i8) + b.to(i8)).to(i32) - a.to(u8)", INT_TYPES),  # conversions between operations
    ("a.to(u16) * b.to(i16) + a.to(u32)", INT_TYPES),  # mixed widths and signedness promote
    ("a.to(i64) * b.to(i64) >> 16", INT_TYPES),  # the wide product
    ("(a * b).to(u32) % 1000 + (a ^ b).to(u64) // 3", INT_TYPES),
    ("where((a > b) != (b < 0), a, b).to(bool)", INT_TYPES),
]
"""Compound integer expressions of ``a`` and ``b`` (of each listed type)."""


def expression_inputs(t: str, size: int, seed: str) -> list[np.ndarray]:
    """``a``, ``b``: every pair of ``t``'s edge values, then seeded random pairs; never a pair where
    an expression could divide MIN by -1 (SP0790 in the interpreter, undefined on the GPU)."""
    e = edges(t)
    pairs = [(x, y) for x in e for y in e]
    rng = np.random.default_rng(hash_name(seed))
    pairs += list(zip(random_values(t, size, rng), random_values(t, size, rng), strict=True))
    lo = int_range(t)[0]
    pairs = [(x, y) for x, y in pairs if lo == 0 or not ({x, y} & {lo} and {x, y} & {-1})][:size]
    return [array([x for x, _ in pairs], t), array([y for _, y in pairs], t)]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80", "sm_100a"])
@pytest.mark.parametrize("t", INT_TYPES)
def test_compound_expressions_ptx_match_the_interpreter(t: str, target: str) -> None:
    """Every expression of :data:`EXPRESSIONS` on ``t`` in one kernel, on 1000 pairs of values."""
    exprs = [e for e, types in EXPRESSIONS if t in types]
    results = ["i64"] * len(exprs)  # (each result converted to i64 as it is stored: one to one)
    src = kernel_source([("a", t), ("b", t)], list(zip(results, exprs, strict=True)))
    rows = differences(src, target, expression_inputs(t, 1000, f"expr:{t}"), results)
    assert not rows, f"{t} on {target}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


@pytest.mark.parametrize("wrong, right", [(r"shr\.s32", "shr.u32"), (r"setp\.lt\.s32", "setp.lt.u32"),
                                          (r"mul\.hi\.s32", "mul.hi.u32"),
                                          (r"selp\.b32\s+(%r\d+), 0,", r"selp.b32 \1, 1,")])
def test_the_comparison_catches_a_changed_instruction(wrong: str, right: str) -> None:
    """The i32 expressions' PTX with one kind of instruction changed (a signed shift made logical, a
    signed comparison unsigned, the division by a constant's signed high product unsigned, the
    division by zero's selected 0 made 1): the comparison reports elements."""
    exprs = [e for e, types in EXPRESSIONS if "i32" in types]
    src = kernel_source([("a", "i32"), ("b", "i32")], [("i64", e) for e in exprs])
    inputs = expression_inputs("i32", 1000, "expr:i32")
    assert not differences(src, "sm_90a", inputs, ["i64"] * len(exprs))

    def edit(ptx: str) -> str:
        changed = re.sub(wrong, right, ptx)
        assert changed != ptx, f"no {wrong} in the PTX"
        return changed

    assert differences(src, "sm_90a", inputs, ["i64"] * len(exprs), edit)
