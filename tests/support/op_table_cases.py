"""The op table: one kernel per (elementwise op, type) and per conversion (source, destination),
each computing its op on one tile of edge values (zeros of both signs, 1, -1, the type's limits,
subnormals, infinities, NaN, rounding ties and their neighbours, shift amounts around the width,
divisors 0 and -1, values out of the destination's range) and seeded random ones.

The ops come from the op registry (``frontend/ops``): every IR op whose layout rule is
``ELEMENTWISE`` is either covered (:data:`KINDS` reads its kinds from the registry's own tables:
``BINARY_OPS``, ``PY_COMPARE``, ``UNARY_OPS``, ``MATH_FUNCS``) or listed in :data:`OUT_OF_SCOPE`
with the reason; the types are every scalar type of ``ir.types.SCALAR_TYPES``. A new op, kind or
type is covered, or the CPU test (tests/frontend/test_op_table_interp.py) fails naming it.

The expected values come from tests/support/op_table_reference.py (independent of the
interpreter); the comparison rules (exact bits, or the PTX ISA's bound for approximate math) are
in tests/support/op_table_compare.py. The GPU runs the same kernels in tests/gpu/test_op_table_gpu.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

import sparsile as sp
from sparsile.frontend.ir import types as T
from sparsile.frontend.layout.rules import ELEMENTWISE
from sparsile.frontend.ops import core
from sparsile.frontend.ops.opdefs import OPS
from sparsile.tests.support.op_table_reference import FMTS, INT_BITS, int_range, round_to

TYPES: tuple[str, ...] = tuple(dict.fromkeys(t.name for t in T.SCALAR_TYPES.values()))
"""Every scalar type of the language, once each (``SCALAR_TYPES`` also holds the aliases)."""
FLOATS = tuple(t for t in TYPES if T.SCALAR_TYPES[t].is_float)
F8 = ("e4m3", "e5m2")

KINDS: dict[str, tuple[str, ...]] = {
    "arith.binary": tuple(sorted(core.BINARY_OPS)),
    "arith.cmp": tuple(core.PY_COMPARE.values()),
    "arith.unary": core.UNARY_OPS,
    "math": core.MATH_FUNCS,
    "arith.select": ("where",),
    "arith.cast": TYPES,
}
"""The elementwise value ops the table covers, each with its kinds (for ``arith.cast``: the
destination types)."""

OUT_OF_SCOPE = {
    "addptr": "pointer arithmetic, no scalar result (tests/frontend/test_pointer_offsets*.py)",
    "load": "memory access (every case loads its inputs)",
    "store": "memory access (every case stores its result)",
    "atomic_rmw": "memory access (tests/gpu/test_atomics_gpu.py, tests/support/hw_agreement_cases.py)",
    "atomic_cas": "memory access (tests/gpu/test_atomics_gpu.py)",
}


def elementwise_ops() -> list[str]:
    """Every registered IR op whose layout rule is ``ELEMENTWISE``."""
    return sorted(name for name, d in OPS.items() if d.layout is ELEMENTWISE)


_SPELL_BINARY = {kind: f"a {sym} b" for sym, kind in core.PY_BINARY.items()}
_SPELL_BINARY.update({"max": "maximum(a, b)", "min": "minimum(a, b)"})
_SPELL_CMP = {kind: f"a {sym} b" for sym, kind in core.PY_COMPARE.items()}
_SPELL_UNARY = {"neg": "-a", "not": "not a", "invert": "~a"}


def spelling(op: str, kind: str) -> str:
    """The kernel expression of ``kind`` of IR op ``op`` on the loaded tiles ``a`` (``b``, ``c``);
    a KeyError names a kind the table cannot spell (a new one: add it here)."""
    if op == "arith.binary":
        return _SPELL_BINARY[kind]
    if op == "arith.cmp":
        return _SPELL_CMP[kind]
    if op == "arith.unary":
        return _SPELL_UNARY[kind]
    if op == "math":
        return f"{kind}(a)"
    if op == "arith.select":
        return "where(c, a, b)"
    return f"a.to({kind})"


def _is_int(t: str) -> bool:
    return T.SCALAR_TYPES[t].is_int


def result_type(op: str, kind: str, t: str) -> tuple[str | None, str | None]:
    """(the result type, None) of ``kind`` on operands of type ``t``, or (None, the SP code sema
    gives) where the language refuses it (docs/language.md rules 5, 6, 10; the ``~`` and bitwise
    rules of SP0309)."""
    if op == "arith.cast":
        return kind, None
    if op == "arith.cmp":
        return "bool", None
    if op == "arith.select":
        return t, None  # `where` of two bools is a bool (rule 5), else the operands' type
    if op == "arith.unary":
        if kind == "not":
            return "bool", None
        if kind == "invert":
            return (None, "SP0309") if t in FLOATS else (t, None)
        return ("i32" if t == "bool" else t), None
    if op == "math":
        if kind == "abs":
            return t, None
        if t == "f64" and kind not in core.F64_MATH:
            return None, "SP0347"
        return ("f32" if _is_int(t) else t), None
    # arith.binary
    if t == "bool":
        if kind in ("and", "or", "xor"):
            return "bool", None
        t = "i32"  # bool is an integer in arithmetic (rule 5)
    if _is_int(t):
        if kind == "pow":
            return None, "SP0309"
        return ("f32" if kind == "div" else t), None
    if kind in ("and", "or", "xor", "shl", "shr"):
        return None, "SP0309"
    if kind == "pow" and t == "f64":
        return None, "SP0347"
    return t, None


def needs_fp8_cvt(case: Case) -> bool:
    """Whether a case converts to or from an 8-bit float (SP0577 below sm_89): every op on one but
    the bit moves and tests of rule 8 (``where``, negation, ``not`` / ``.to(bool)``)."""
    types = {case.t, case.result}
    if not types & set(F8):
        return False
    if case.op == "arith.select" or (case.op == "arith.unary" and case.kind in ("neg", "not")):
        return False
    if case.op == "arith.cast" and (case.kind == "bool" or case.t == case.kind):
        return False
    return True


@dataclass
class Case:
    """One kernel of the table: IR op ``op``, its ``kind``, operand type ``t``, result type
    ``result`` (None: refused with ``refused``, an SP code) and its inputs (numpy arrays)."""

    op: str
    kind: str
    t: str
    result: str | None
    refused: str | None
    inputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.op}:{self.kind}:{self.t}"

    @property
    def n(self) -> int:
        return len(next(iter(self.inputs.values())))

    def source(self) -> str:
        names = list(self.inputs)
        params = [f"{p.upper()}: ptr[{'bool' if p == 'c' else self.t}]" for p in names]
        out = self.result or self.t
        lines = ["@kernel", f"def k({', '.join(params)}, O: ptr[{out}]):", f"    i = arange(0, {self.n})"]
        lines += [f"    {p} = load({p.upper()} + i)" for p in names]
        lines += [f"    r = {spelling(self.op, self.kind)}"]
        if self.result is not None:
            lines += [f"    static_assert(r.dtype == {self.result})"]
        lines += ["    store(O + i, r)", ""]
        return "\n".join(lines)

    def kernel(self) -> sp.Kernel:
        return _kernel(self.source())

    def output(self) -> np.ndarray:
        """The output array, poisoned (every byte 0x5A: no value any case should store everywhere)."""
        dt = T.SCALAR_TYPES[self.result].numpy_dtype  # type: ignore[index]
        out = np.empty(self.n, dt)
        if dt == np.bool_:
            out[:] = True
            out[::3] = False
        else:
            out.view(np.uint8)[:] = 0x5A
        return out


@functools.cache
def _kernel(src: str) -> sp.Kernel:
    return sp.loads(src, "op_table.spk").kernels["k"]


# -- values ------------------------------------------------------------------------------------------
def float_edges(t: str) -> list[float]:
    """Edge values of the float type ``t`` (tf32: those of f32, the values a ``ptr[tf32]`` holds)."""
    f = FMTS["f32" if t == "tf32" else t]
    one_up = 1 + f.ulp(1.0)
    vals = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.0, 7.0, -7.0, 0.1, -0.1, 100.0, -100.0,
            f.max, -f.max, f.max / 2, f.min_normal, -f.min_normal, f.min_subnormal, -f.min_subnormal,
            f.min_normal - f.min_subnormal, one_up, -one_up, 1 - f.ulp(1.0) / 2, math.inf, -math.inf, math.nan]
    return _dedupe([round_to(v, "f32" if t == "tf32" else t) for v in vals])


def int_edges(t: str) -> list[int]:
    lo, hi = int_range(t)
    if t == "bool":
        return [0, 1]
    w = INT_BITS[t]
    vals = [0, 1, 2, 3, 7, 100, w - 1, w, w + 1, 2 * w, hi, hi - 1, hi // 2, hi // 2 + 1]
    if lo < 0:
        vals += [-1, -2, -3, -7, -100, lo, lo + 1, -w, lo // 2]
    return [v for v in dict.fromkeys(vals) if lo <= v <= hi]


def edges(t: str) -> list:
    return int_edges(t) if _is_int(t) else float_edges(t)


_INTEGER_PROBES = sorted({
    *(s * (2**k + d) for k in (7, 8, 11, 15, 16, 24, 31, 32, 53, 63, 64) for d in (-1, 0, 1) for s in (1, -1)),
    2**24 + 2**16 + 1, 2**24 + 2**16, 2**24 + 3 * 2**16, 2**31 - 64, 2**31 - 128, 2**63 - 2**39,
    2**53 + 2, 2**62 + 2**38 + 1, -(2**24 + 2**16 + 1), 65504, 65519, 65520, 65536, -65520, 448, 464, 465, 480,
    -464, 57344, 61440, 61441, -61440, 255, 256, 257, 127, 128, 129, -128, -129, 32767, 32768, 65535,
}, key=abs)
CONVERSION_PROBES: list[float | int] = [
    *_INTEGER_PROBES,
    0.5, -0.5, 0.99999, -0.99999, 1.5, 2.5, -2.5, 255.5, 255.9, 256.5, -128.5, -128.9, -129.5, 32767.5, 65535.5,
    2147483647.5, 1e10, -1e10, 1e20, -1e20, 1e300, -1e300, 1e-300, 2.0**63, 2.0**64, -(2.0**63), 2.0**64 - 2048,
    1 + 2**-8, 1 + 2**-8 + 2**-20, 1 + 2**-8 + 2**-40, 3 * 2**-9 + 1, 1 + 2**-11, 1 + 2**-11 + 2**-20,
    1 + 2**-11 + 2**-40, 1 + 2**-4, 1 + 2**-4 + 2**-20, 1 + 3 * 2**-4, 1 + 2**-3, 1 + 2**-3 + 2**-20,
    1 + 2**-24, 1 + 2**-24 + 2**-40, 1 + 3 * 2**-24, 2**-24, 2**-25, 3 * 2**-25, 2**-25 + 2**-40, 2**-133,
    2**-149, 2**-150, 3 * 2**-150, 2**-150 + 2**-170, 2**-9, 2**-10, 2**-17, 2**-16, 1e-40, -1e-40, 1e-45,
    2**-126 * (1 - 2**-24), 3.4028235677973366e38, 3.4028235e38 * 0.9999999, 2.0**128 * (1 - 2**-25),
    0.1, 1 / 3, -1 / 3, math.pi, 1e38, -1e38,
]
"""Values around every conversion's rounding ties and range limits (the integer ones exact; both
kinds rounded to each source type before use)."""


def conversion_values(t: str) -> list:
    """Edge values of ``t`` and the probes rounded (floats) or limited (integers) to it."""
    vals = list(edges(t))
    if _is_int(t):
        lo, hi = int_range(t)
        vals += [int(v) for v in CONVERSION_PROBES if isinstance(v, int) and lo <= v <= hi]
        vals += [int(v) for v in CONVERSION_PROBES if isinstance(v, float) and v.is_integer() and lo <= v <= hi]
    else:
        vals += [round_to(float(v) if isinstance(v, float) else v, "f32" if t == "tf32" else t)
                 for v in CONVERSION_PROBES]
    return _dedupe(vals)


def _dedupe(vals: list) -> list:
    seen, out = set(), []
    for v in vals:
        key = ("nan",) if isinstance(v, float) and math.isnan(v) else (type(v) is float, v, math.copysign(1, v))
        if key not in seen:
            seen.add(key)
            out.append(v)
    return out


def random_values(t: str, n: int, rng: np.random.Generator) -> list:
    """``n`` seeded random values of ``t``: random bits (every class of value, NaN included) and
    values of moderate size."""
    if t == "bool":
        return [bool(v) for v in rng.integers(0, 2, n)]
    if _is_int(t):
        lo, hi = int_range(t)
        wide = [int(v) for v in rng.integers(lo, hi, n // 2, dtype=np.dtype(T.SCALAR_TYPES[t].numpy_dtype),
                                             endpoint=True)]
        small = [int(v) for v in rng.integers(max(lo, -300), min(hi, 300), n - n // 2, endpoint=True)]
        return wide + small
    fmt = "f32" if t == "tf32" else t
    bits = {"f64": 64, "f32": 32, "f16": 16, "bf16": 16, "e4m3": 8, "e5m2": 8}[fmt]
    raw = rng.integers(0, 2**bits, n // 2, dtype=np.uint64 if bits == 64 else np.int64)
    dt = T.SCALAR_TYPES[fmt].numpy_dtype
    with np.errstate(invalid="ignore"):
        as_float = raw.astype(f"u{bits // 8}").view(dt).astype(np.float64).tolist()
    scaled = (rng.standard_normal(n - n // 2) * 10.0 ** rng.integers(-3, 4, n - n // 2)).tolist()
    return as_float + [round_to(float(v), fmt) for v in scaled]


def array(vals: list, t: str) -> np.ndarray:
    """The values (exactly representable in ``t``) as an array of ``t``'s numpy dtype."""
    dt = T.SCALAR_TYPES[t].numpy_dtype
    if _is_int(t):
        return np.array([int(v) for v in vals], dt) if t != "bool" else np.array(vals, np.bool_)
    return np.array(vals, np.float64).astype(dt)


def _fill(vals: list, t: str, n: int, rng: np.random.Generator) -> list:
    vals = vals[:n]
    return vals + random_values(t, n - len(vals), rng) if len(vals) < n else vals


UNARY_N, BINARY_N = 256, 1024


def _pairs(op: str, kind: str, t: str, rng: np.random.Generator) -> tuple[list, list]:
    """(a, b) for a binary op or comparison: every pair of edge values (shifts: every edge value by
    every shift amount around the width), then random pairs."""
    e = edges(t)
    bs = e
    shift = kind in ("shl", "shr") and t in INT_BITS
    if shift:
        w = INT_BITS[t]
        lo, hi = int_range(t)
        bs = [b for b in (0, 1, 2, w // 2, w - 2, w - 1, w, w + 1, 2 * w, 255, -1, -2, -w, lo, hi,
                                2**32, 2**32 + 1, 2**40 + 3) if lo <= b <= hi]
        bs = list(dict.fromkeys(bs))
    pairs = [(x, y) for x in e for y in bs]
    if kind in ("floordiv", "mod") and t in INT_BITS and t[0] == "i":  # MIN // -1: SP0790 (its own test)
        lo = int_range(t)[0]
        pairs = [(x, y) for x, y in pairs if not (x == lo and y == -1)]
    pairs = pairs[:BINARY_N]
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    k = BINARY_N - len(pairs)
    ra, rb = random_values(t, k, rng), random_values(t, k, rng)
    if shift:
        rb = [int(v) for v in rng.integers(0, INT_BITS[t], k)]
    if kind in ("floordiv", "mod") and t in INT_BITS and t[0] == "i":
        lo = int_range(t)[0]
        rb = [(-2 if (x == lo and y == -1) else y) for x, y in zip(ra, rb, strict=True)]
    return a + ra, b + rb


def make_case(op: str, kind: str, t: str) -> Case:
    """The case of ``kind`` of ``op`` on type ``t``, with its inputs (seeded by the case's name)."""
    result, refused = result_type(op, kind, t)
    case = Case(op, kind, t, result, refused)
    rng = np.random.default_rng(abs(hash_name(case.name)))
    if op in ("arith.binary", "arith.cmp"):
        a, b = _pairs(op, kind, t, rng)
        case.inputs = {"a": array(a, t), "b": array(b, t)}
    elif op == "arith.select":
        a, b = _fill(edges(t), t, UNARY_N, rng), random_values(t, UNARY_N, rng)
        c = [bool(v) for v in rng.integers(0, 2, UNARY_N)]
        case.inputs = {"a": array(a, t), "b": array(b, t), "c": np.array(c, np.bool_)}
    elif op == "arith.cast":
        vals = conversion_values(t)
        n = 1 << max(8, (len(vals) - 1).bit_length())
        case.inputs = {"a": array(_fill(vals, t, n, rng), t)}
    elif t in F8:  # every value of an 8-bit float
        bits = np.arange(256, dtype=np.uint8)
        case.inputs = {"a": bits.view(T.SCALAR_TYPES[t].numpy_dtype).copy()}
    else:
        case.inputs = {"a": array(_fill(edges(t) + _math_edges(kind, t), t, UNARY_N, rng), t)}
    return case


def _math_edges(kind: str, t: str) -> list:
    """Values where math function ``kind`` changes behaviour (exp's overflow and underflow, the
    sigmoid flush, sin's stated range), rounded to ``t``."""
    if _is_int(t):
        return []
    fmt = "f32" if t == "tf32" else t
    vals = {"exp": [88.7, 88.8, -87.3, -103.0, -104.0, 20.0, -20.0], "exp2": [127.9, 128.0, -126.0, -149.0, -150.0,
            0.5, -0.5], "sigmoid": [-87.3, -87.4, -88.0, 15.0, -15.0], "sin": [100 * math.pi, 400.0, 1e4, 1e30],
            "cos": [100 * math.pi, 400.0, 1e4], "log": [2.0, 0.5, 1e-30], "log2": [2.0, 0.5, 1e-30, 2**-140]
            }.get(kind, [])
    return [round_to(v, fmt) for v in vals]


def hash_name(name: str) -> int:
    """A seed from a case's name that does not change between runs (``hash`` of a str does)."""
    h = 0
    for ch in name.encode():
        h = (h * 131 + ch) % (2**61 - 1)
    return h


@functools.lru_cache(maxsize=1)
def all_cases() -> tuple[Case, ...]:
    """Every case of the table (refused ones included: their ``refused`` code says why)."""
    return tuple(make_case(op, kind, t) for op, kinds in KINDS.items() for kind in kinds for t in TYPES)


def groups() -> dict[str, list[Case]]:
    """The legal cases by (op, operand type): the unit a test runs and reports together."""
    out: dict[str, list[Case]] = {}
    for c in all_cases():
        if c.refused is None:
            out.setdefault(f"{c.op}:{c.t}", []).append(c)
    return out


def group_source(cases: list[Case], n: int = 128) -> str:
    """One kernel computing every case of a group (same op, operand type and inputs) on tiles of
    ``n`` elements, each into its own output: what the CPU test compiles for each target (one
    compile per group, and one element per thread: the same instructions, an eighth of the code)."""
    first = cases[0]
    names = list(first.inputs)
    params = [f"{p.upper()}: ptr[{'bool' if p == 'c' else first.t}]" for p in names]
    params += [f"O{j}: ptr[{c.result}]" for j, c in enumerate(cases)]
    lines = ["@kernel", f"def k({', '.join(params)}):", f"    i = arange(0, {n})"]
    lines += [f"    {p} = load({p.upper()} + i)" for p in names]
    lines += [f"    store(O{j} + i, {spelling(c.op, c.kind)})" for j, c in enumerate(cases)]
    return "\n".join([*lines, ""])
