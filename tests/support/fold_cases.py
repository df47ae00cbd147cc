"""Cases for the differential test of constant folding (tests/frontend/test_constant_folding.py):
every elementwise operator and the folding builtins (``abs``, ``max``, ``min``) of the language on
every scalar type where they are legal, over edge values (zeros of both signs, one, minus one,
each type's extremes, NaN, infinities, subnormals, shift amounts at and past the width) and a
random one. :func:`folded_kernel` writes one ``store`` per case of the operation on typed
constants (``f16(0.1) * f16(3.0)``), which sema folds; :func:`runtime_kernel` computes the same
operation on the same values loaded from memory; the two outputs must agree bit for bit."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import ml_dtypes
import numpy as np

TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64", "e4m3")
NUMPY = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u16": np.uint16,
         "u32": np.uint32, "u64": np.uint64, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32,
         "f64": np.float64, "e4m3": ml_dtypes.float8_e4m3fn, "bool": np.bool_}
ARITH = ("+", "-", "*", "/", "//", "%", "**", "max", "min")
BITS = ("&", "|", "^", "<<", ">>")
COMPARE = ("<", "<=", ">", ">=", "==", "!=")
UNARY = ("-", "~", "not", "abs")


def is_float(t: str) -> bool:
    return t[0] in "fbe"


def values(t: str) -> list[int | float]:
    """Edge values of ``t`` and a random one (fixed seed), each exactly representable in ``t``."""
    rng = np.random.default_rng(44 + TYPES.index(t))
    dt = np.dtype(NUMPY[t])
    if not is_float(t):
        info = np.iinfo(dt)
        bits = info.bits
        vals = [0, 1, int(info.max), int(info.min) if info.min else int(info.max) - 1, bits - 1, bits, bits + 1]
        vals.append(-1 if info.min else 1 << (bits - 1))
        if bits >= 32:
            vals.append(2**24 + 1)  # not an f32: integer `/` converts it
        vals += [int(x) for x in rng.integers(info.min, info.max, 1, dtype=dt, endpoint=True)]
        return vals
    fi = ml_dtypes.finfo(dt)
    vals = [0.0, -0.0, 1.0, -1.0, math.nan, float(fi.max), float(fi.smallest_subnormal), -float(fi.smallest_normal),
            3.0, float(np.float64(0.1).astype(dt))]
    if t != "e4m3":  # e4m3 has no infinity
        vals += [math.inf, -math.inf]
    vals += [float(x) for x in (rng.standard_normal(1) * 100).astype(dt)]
    return vals


def literal(v: int | float) -> str:
    """``v`` as kernel source (an untyped constant of exactly that value)."""
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else '-float("inf")'
        return repr(v)
    return str(v)


def legal(op: str, t: str) -> bool:
    """Whether ``op`` compiles on ``t`` (SP0309: bitwise ops, shifts and ``~`` need integers, ``**``
    floats; SP0347: ``**`` of f64)."""
    if op in BITS or op == "~":
        return not is_float(t)
    if op == "**":
        return is_float(t) and t != "f64"
    return True


def result_type(op: str, t: str) -> str:
    if op in COMPARE or op == "not":
        return "bool"
    if op == "/" and not is_float(t):
        return "f32"
    return t


def defined(op: str, t: str, a: int | float, b: int | float) -> bool:
    """False for ``MIN // -1`` and ``MIN % -1`` (SP0790 both at compile time and at run time)."""
    if op in ("//", "%") and not is_float(t):
        return not (a == np.iinfo(NUMPY[t]).min and b == -1 and a != 0)
    return True


def folded(op: str, x: str, y: str | None = None) -> str:
    """The expression ``x op y`` (or ``op x``) in kernel source."""
    if y is None:
        return f"abs({x})" if op == "abs" else f"not {x}" if op == "not" else f"{op}{x}"
    if op in ("max", "min"):
        return f"{op}({x}, {y})"
    return f"{x} {op} {y}"


def at_run_time(op: str, x: str, y: str | None = None) -> str:
    """The same expression on run-time tiles (``maximum`` for ``max`` of two)."""
    if y is not None and op in ("max", "min"):
        return f"{op}imum({x}, {y})"
    return folded(op, x, y)


@dataclass
class Group:
    """The cases of one operation on one type: operand pairs (a single operand for unary ops)."""

    op: str
    t: str
    cases: list[tuple[int | float, ...]]

    @property
    def out(self) -> str:
        return result_type(self.op, self.t)


def groups(t: str) -> list[Group]:
    vals = values(t)
    out = [Group(op, t, [(a, b) for a in vals for b in vals if defined(op, t, a, b)])
           for op in (*ARITH, *BITS, *COMPARE) if legal(op, t)]
    out += [Group(op, t, [(a,) for a in vals]) for op in UNARY if legal(op, t)]
    return out


def folded_kernel(gs: list[Group]) -> str:
    """For each group ``j``, one store to ``O{j}`` per case of its op on typed constants (folded by
    sema): ``v3 = f16(0.1)`` for each value, then ``store(O0 + k, v3 * v5)``."""
    t = gs[0].t
    vals = values(t)
    index = {bits_key(v): i for i, v in enumerate(vals)}
    lines = [f"    v{i} = {t}({literal(v)})" for i, v in enumerate(vals)]
    for j, g in enumerate(gs):
        for k, case in enumerate(g.cases):
            lines.append(f"    store(O{j} + {k}, {folded(g.op, *(f'v{index[bits_key(v)]}' for v in case))})")
    params = ", ".join(f"O{j}: ptr[{g.out}]" for j, g in enumerate(gs))
    return f"@kernel\ndef k({params}):\n" + "\n".join(lines) + "\n"


def bits_key(v: int | float) -> tuple[str, int | float]:
    """A dictionary key telling ``-0.0`` from ``0.0`` and equal to itself for NaN."""
    if isinstance(v, float):
        if math.isnan(v):
            return ("nan", 0)
        return ("f", v) if v else ("zero", math.copysign(1.0, v))
    return ("i", v)


def runtime_kernel(gs: list[Group], n: int) -> str:
    """Each group's op on ``n`` operands loaded from ``A{j}`` (and ``B{j}``), stored to ``O{j}``."""
    params, lines = [], [f"    i = arange(0, {n})"]
    for j, g in enumerate(gs):
        names = [f"load(A{j} + i)", f"load(B{j} + i)"][:len(g.cases[0])]
        params += [f"{p}{j}: ptr[{g.t}]" for p in "AB"[:len(names)]] + [f"O{j}: ptr[{g.out}]"]
        lines.append(f"    store(O{j} + i, {at_run_time(g.op, *names)})")
    return f"@kernel\ndef k({', '.join(params)}):\n" + "\n".join(lines) + "\n"


def size(gs: list[Group]) -> int:
    """The power of two that holds the cases of every group."""
    return 1 << max(0, (max(len(g.cases) for g in gs) - 1).bit_length())


def padded(cases: list[tuple[int | float, ...]], t: str, n: int) -> list[np.ndarray]:
    """The operand arrays of ``cases``, padded with the first case to ``n`` elements."""
    full = cases + [cases[0]] * (n - len(cases))
    return [np.array([c[j] for c in full], np.float64 if is_float(t) else object).astype(NUMPY[t])
            for j in range(len(cases[0]))]


def bits_of(a: np.ndarray) -> list[int | str]:
    """The bit patterns of ``a`` (bools as 0 / 1), every NaN as ``"nan"``: the interpreter does not
    model NaN payloads and signs (numpy's differ between operations; the GPU gives its canonical NaN)."""
    a = np.asarray(a)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    nan = np.isnan(a.astype(np.float64)) if a.dtype.kind not in "biu" else np.zeros(a.shape, bool)
    return ["nan" if m else int(x) for x, m in zip(a.view(width), nan, strict=True)]


def poisoned(n: int, t: str, value: int) -> np.ndarray:
    """An output of ``n`` elements of ``t`` filled with ``value`` (``value % 2`` for bool): the
    two kernels' outputs get different ones, so that a missing store cannot agree."""
    return np.full(n, bool(value % 2) if t == "bool" else value, NUMPY[t])


def untyped_defined(op: str, t: str, case: tuple[int | float, ...]) -> bool:
    """Whether sema folds ``op`` on untyped constants (Python ints, float64) to a value of ``t``
    (``f64`` or ``i64``): not a division by zero (SP0330), a negative shift (SP0329) or an integer
    result beyond ``i64`` (SP0303: untyped integers do not wrap); ``**`` is Python's (rule 6), so it
    is not compared. Integer ``/`` is compared: it converts both operands to ``f32`` (rule 6)."""
    if op == "**" and t == "i64":
        return False
    if len(case) == 2 and op in ("/", "//", "%") and case[1] == 0:
        return False
    if t == "f64":
        return op != "**"
    if len(case) == 1:  # `-MIN` and `abs(MIN)` do not fit
        return op not in ("-", "abs") or case[0] != -(2**63)
    a, b = case
    if op in ("<<", ">>"):
        if not 0 <= b < 128:
            return False
        r = a << b if op == "<<" else a >> b
    else:
        r = {"+": a + b, "-": a - b, "*": a * b}.get(op, 0)
    return -(2**63) <= r < 2**63


def untyped_kernel(g: Group) -> str:
    """One store per case of ``g.op`` on untyped literals (``1e17 % 3.0``), folded by sema."""
    lines = [f"    store(O + {k}, {folded(g.op, *(literal(v) for v in case))})" for k, case in enumerate(g.cases)]
    return f"@kernel\ndef k(O: ptr[{g.out}]):\n" + "\n".join(lines) + "\n"


def tile_cases(t: str) -> list[tuple[str, int | float, int | float]]:
    """(op, a, b) for the LLVM folding check: the ops whose result has type ``t`` on six edge values
    (zeros of both signs, one, NaN, the largest value, the smallest subnormal; for integers 0, 1,
    the extremes and shift amounts at and past the width)."""
    vals = values(t)
    vals = [vals[i] for i in (0, 1, 2, 4, 5, 6)] if is_float(t) else vals[:7]
    ops = [op for op in (*ARITH, *BITS) if legal(op, t) and result_type(op, t) == t]
    return [(op, a, b) for op in ops for a in vals for b in vals if defined(op, t, a, b)]


def tile_kernel(t: str, cases: list[tuple[str, int | float, int | float]]) -> str:
    """Case ``k`` computed on two ``full((1,), c, t)`` tiles and stored to ``O[k]``: sema leaves the
    ops to run time and the GPU lowering's LLVM folds them to constants."""
    lines = [f"    store(O + arange({k}, {k + 1}), "
             f"{at_run_time(op, f'full((1,), {literal(a)}, {t})', f'full((1,), {literal(b)}, {t})')})"
             for k, (op, a, b) in enumerate(cases)]
    return f"@kernel\ndef k(O: ptr[{t}]):\n" + "\n".join(lines) + "\n"


_ST = re.compile(r"st\.global(?:\.v(\d))?\.b(\d+)\s+\[%rd\d+(?:\+(\d+))?\],\s*\{?([^}; ]+(?:,\s*[^}; ]+)*)\}?;")


def ptx_stored_bytes(ptx: str) -> dict[int, int]:
    """The bytes that the PTX's stores write as immediates (byte offset -> value), from
    ``st.global[.vN].bB [%rdK+off], {imm, ...}``; elements stored from registers are left out."""
    out: dict[int, int] = {}
    for m in _ST.finditer(ptx):
        width = int(m.group(2)) // 8
        base = int(m.group(3) or 0)
        for i, item in enumerate(x.strip() for x in m.group(4).split(",")):
            if not re.fullmatch(r"-?\d+", item):
                continue
            v = int(item) & ((1 << (8 * width)) - 1)
            for b in range(width):
                out[base + i * width + b] = (v >> (8 * b)) & 0xFF
    return out
