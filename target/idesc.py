"""The tcgen05 instruction descriptor (``docs/hardware.md`` §1.3), as pure functions on ints: plain
kinds f16/tf32/f8f6f4/i8 and block-scaled kinds mxf8f6f4/mxf4/mxf4nvf4, with the §1.2 shape table,
the §1.4 sparsity selector and the §9 precisions.

:func:`idesc_problems` returns every rule an :class:`InstrDesc` violates (codes SP0501-SP0513, see
``target/descriptors.py``); :func:`encode_idesc` packs a descriptor that has none,
:func:`decode_idesc` and :func:`describe_idesc` read a word back.
"""

from __future__ import annotations

from dataclasses import dataclass

from .descriptor_fields import Problem, code_name, field_bits, join_values, pack_fields, raise_if_problems

PLAIN_KINDS = ("f16", "tf32", "f8f6f4", "i8")
BLOCK_SCALED_KINDS = ("mxf8f6f4", "mxf4", "mxf4nvf4")
KINDS = PLAIN_KINDS + BLOCK_SCALED_KINDS

_F8F6F4_CODES = {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5}
# A/B type codes per kind (§1.3; mxf4 kinds: e2m1 = 1).
TYPE_CODES: dict[str, dict[str, int]] = {
    "f16": {"f16": 0, "bf16": 1},
    "tf32": {"tf32": 2},
    "f8f6f4": _F8F6F4_CODES,
    "i8": {"u8": 0, "s8": 1},
    "mxf8f6f4": _F8F6F4_CODES,
    "mxf4": {"e2m1": 1},
    "mxf4nvf4": {"e2m1": 1},
}
D_TYPE_CODES = {"f16": 0, "f32": 1, "s32": 2}
SCALE_TYPE_CODES = {"ue4m3": 0, "ue8m0": 1}
MAX_SHIFT_CODES = {0: 0, 8: 1, 16: 2, 32: 3}
MAJORS = ("K", "MN")
# §1.3 / CUTLASS InstrDescriptor: MN-major only for these source types.
MN_MAJOR_TYPES = frozenset({"e4m3", "e5m2", "s8", "u8", "f16", "bf16", "tf32"})
DTYPES = frozenset({"f16", "bf16", "tf32", "e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "s8", "u8"})

# Mixed A/B types are allowed within these kinds; f16/bf16 must match (PTX tcgen05.mma kinds).
_MIXED_AB_KINDS = frozenset({"f8f6f4", "i8", "mxf8f6f4"})


def _allowed_d_types(kind: str, a_dtype: str) -> tuple[str, ...]:
    """Accumulator types per kind (§1.2 table; bf16 accumulates in f32 only)."""
    if kind == "f16":
        return ("f32",) if a_dtype == "bf16" else ("f16", "f32")
    if kind == "f8f6f4":
        return ("f16", "f32")
    if kind == "i8":
        return ("s32",)
    return ("f32",)  # tf32 and every block-scaled kind


@dataclass(frozen=True)
class InstrDesc:
    """The fields of a tcgen05 instruction descriptor, in user terms.

    ``kind`` and ``cta_group`` are not stored in the 32-bit word (they are instruction
    qualifiers) but the rules depend on them. ``block_size`` (16 or 32; ``None`` = the kind's
    default) and the ``scale_*`` / ``k96`` fields only apply to block-scaled kinds.
    """

    kind: str
    a_dtype: str
    b_dtype: str
    d_dtype: str
    m: int
    n: int
    sparse: bool = True
    selector: int = 0
    a_major: str = "K"
    b_major: str = "K"
    negate_a: bool = False
    negate_b: bool = False
    saturate: bool = False
    max_shift: int = 0
    cta_group: int = 1
    scale_dtype: str | None = None
    a_scale_id: int = 0
    b_scale_id: int = 0
    block_size: int | None = None
    k96: bool = False

    @property
    def block_scaled(self) -> bool:
        return self.kind in BLOCK_SCALED_KINDS


@dataclass(frozen=True)
class _NRule:
    lo: int
    hi: int
    step: int
    allowed: frozenset[int]
    help: str
    why: str = ""


def _n_rule(lo: int, step: int, help_text: str | None = None, why: str = "") -> _NRule:
    return _NRule(lo, 256, step, frozenset(range(lo, 257, step)),
                  help_text or f"use N in {lo}..256, step {step}", why)


def _m_choices(kind: str, cta_group: int) -> tuple[int, ...]:
    """§1.2: M per kind and cta_group (block-scaled kinds: 128 with ::1, 256 with ::2)."""
    if kind in BLOCK_SCALED_KINDS:
        return (128,) if cta_group == 1 else (256,)
    return (64, 128) if cta_group == 1 else (128, 256)


def _n_rule_for(d: InstrDesc) -> _NRule:
    """§1.2 N ranges, with the §9 f8f6f4 granularity and CUTLASS's i8 list."""
    if d.kind == "i8":
        if d.cta_group == 2:
            return _n_rule(32, 32)
        allowed = frozenset({8, 16, 32, *range(48, 257, 16)})
        return _NRule(8, 256, 8, allowed, "use N in {8, 16, 32} or 48..256 step 16",
                      "N = 24 is listed by PTX but CUTLASS never emits it (unproven on silicon, §1.2)")
    if d.kind == "f8f6f4":
        if d.sparse:
            if d.cta_group == 2:
                return _n_rule(32, 32, why="sparse kind::f8f6f4 with cta_group::2 needs N % 32 (§9)")
            return _n_rule(8, 8) if d.m == 64 else _n_rule(16, 16)
        step = (8 if d.b_major == "K" else 16) * d.cta_group
        return _n_rule(step, step, why="dense kind::f8f6f4 granularity depends on B's major (§9)")
    if d.cta_group == 2:
        return _n_rule(16, 16)
    return _n_rule(8, 8)


def _where(d: InstrDesc) -> str:
    return f"kind::{d.kind} with cta_group::{d.cta_group}"


def _name_problems(d: InstrDesc) -> list[Problem]:
    out = []
    if d.kind not in KINDS:
        out.append(Problem("SP0501", f"unknown tcgen05 MMA kind `{d.kind}`", f"use one of: {join_values(KINDS)}",
                           "kind"))
    for fld in ("a_dtype", "b_dtype"):
        value = getattr(d, fld)
        if value not in DTYPES:
            out.append(Problem("SP0501", f"unknown element type `{value}`",
                               f"use one of: {join_values(sorted(DTYPES))}", fld))
    if d.d_dtype not in D_TYPE_CODES:
        out.append(Problem("SP0501", f"unknown accumulator type `{d.d_dtype}`", "use f16, f32 or s32",
                           "d_dtype"))
    for fld in ("a_major", "b_major"):
        if getattr(d, fld) not in MAJORS:
            out.append(Problem("SP0501", f"unknown major `{getattr(d, fld)}`", "use \"K\" or \"MN\"", fld))
    if d.cta_group not in (1, 2):
        out.append(Problem("SP0511", f"cta_group::{d.cta_group} does not exist", "use cta_group 1 or 2",
                           "cta_group"))
    return out


def _type_problems(d: InstrDesc) -> list[Problem]:
    out = []
    codes = TYPE_CODES[d.kind]
    for fld in ("a_dtype", "b_dtype"):
        value = getattr(d, fld)
        if value not in codes:
            out.append(Problem("SP0502", f"{fld[0].upper()} element type {value} is not valid for "
                               f"kind::{d.kind}", f"kind::{d.kind} takes {join_values(codes)}", fld))
    if not out and d.kind not in _MIXED_AB_KINDS and d.a_dtype != d.b_dtype:
        out.append(Problem("SP0502", f"kind::{d.kind} needs A and B of the same type, got {d.a_dtype} and "
                           f"{d.b_dtype}", f"convert B to {d.a_dtype}", "b_dtype"))
    allowed_d = _allowed_d_types(d.kind, d.a_dtype)
    if d.d_dtype not in allowed_d:
        out.append(Problem("SP0503", f"accumulator type {d.d_dtype} is not valid for kind::{d.kind} with "
                           f"{d.a_dtype} inputs", f"use a {' or '.join(allowed_d)} accumulator", "d_dtype"))
    return out


def _shape_problems(d: InstrDesc) -> list[Problem]:
    out = []
    ms = _m_choices(d.kind, d.cta_group)
    if d.m not in ms:
        out.append(Problem("SP0504", f"M = {d.m} is not valid for {_where(d)}",
                           f"use M = {' or '.join(map(str, ms))}", "m"))
    elif d.sparse and d.m == 64:
        out.append(Problem("SP0512", "sparse M = 64 is not supported: its TMEM metadata layout is "
                           "undocumented", "use M = 128 (cta_group::1) or M = 256 (cta_group::2) "
                           "(docs/hardware.md §0 item 6)", "m"))
    rule = _n_rule_for(d)
    n = d.n
    if not isinstance(n, int) or not rule.lo <= n <= rule.hi:
        msg = f"N = {n} is out of range for {_where(d)}"
    elif n % rule.step:
        msg = f"N = {n} is not a multiple of {rule.step} for {_where(d)}"
    elif n not in rule.allowed:
        msg = f"N = {n} is not a supported N for {_where(d)}"
    else:
        msg = ""
    if msg:
        help_text = rule.help + (f" ({rule.why})" if rule.why else "")
        out.append(Problem("SP0505", msg, help_text, "n"))
    return out


def _mode_problems(d: InstrDesc) -> list[Problem]:
    out = []
    for fld, dtype in (("a_major", d.a_dtype), ("b_major", d.b_dtype)):
        if getattr(d, fld) == "MN" and (dtype not in MN_MAJOR_TYPES or d.kind in ("mxf4", "mxf4nvf4")):
            out.append(Problem("SP0506", f"{fld[0].upper()} cannot be MN-major with {dtype} elements",
                               "store the operand K-major (MN-major only for e4m3, e5m2, s8, u8, f16, bf16, "
                               "tf32)", fld))
    if (d.negate_a or d.negate_b) and d.kind in ("i8", "mxf4", "mxf4nvf4"):
        out.append(Problem("SP0507", f"negating an operand is not allowed for kind::{d.kind}",
                           "negate the inputs or the result instead",
                           "negate_a" if d.negate_a else "negate_b"))
    if d.saturate and d.kind != "i8":
        out.append(Problem("SP0509", f"saturation is only available for kind::i8, not kind::{d.kind}",
                           "drop the saturate flag", "saturate"))
    if d.max_shift not in MAX_SHIFT_CODES:
        out.append(Problem("SP0510", f"max shift {d.max_shift} is not encodable",
                           "use a max shift of 0, 8, 16 or 32", "max_shift"))
    elif d.max_shift and d.block_scaled:
        out.append(Problem("SP0510", f"kind::{d.kind} has no max-shift field", "use max shift 0",
                           "max_shift"))
    out += _selector_problems(d)
    return out


def _selector_problems(d: InstrDesc) -> list[Problem]:
    """§1.4 "Selector and address": f16/tf32 select column 0/1 (2/3 unverified), 8-bit kinds
    need 0, the field is reserved for block-scaled kinds; dense MMAs have no selector."""
    sel = d.selector
    if not d.sparse:
        ok, help_text = sel == 0, "a dense MMA has no sparsity selector; use 0"
    elif d.kind in ("f16", "tf32"):
        ok, help_text = sel in (0, 1), ("use selector 0 or 1 (values 2 and 3 are encodable but their meaning "
                                        "is unverified, docs/hardware.md §8)")
    else:
        ok, help_text = sel == 0, f"kind::{d.kind} needs selector 0"
    if ok:
        return []
    return [Problem("SP0508", f"sparsity selector {sel} is not valid for {'sparse' if d.sparse else 'dense'} "
                    f"kind::{d.kind}", help_text, "selector")]


def _default_block_size(kind: str) -> int | None:
    return {"mxf8f6f4": 32, "mxf4": 32}.get(kind)


def _block_scale_problems(d: InstrDesc) -> list[Problem]:
    """Block-scaled kinds (§1.1: .block16 = scale_vec::4X; .block32 = 1X for mxf8f6f4 and 2X for
    mxf4/mxf4nvf4; mxf4nvf4 needs an explicit size). The scale-factor id (bits 29-30 / 4-5) is
    the byte of the 32-bit TMEM scale column, so it must be < 4 and a multiple of the scale
    vector width (PTX ISA "tcgen05 block scaling"; not run on hardware)."""
    out = []
    if not d.block_scaled:
        if d.scale_dtype is not None or d.a_scale_id or d.b_scale_id or d.block_size is not None or d.k96:
            out.append(Problem("SP0513", f"scale-factor fields are only used by block-scaled kinds, not "
                               f"kind::{d.kind}", "drop the scale-factor settings", "scale_dtype"))
        return out
    block = d.block_size or _default_block_size(d.kind)
    valid_blocks = (16, 32) if d.kind == "mxf4nvf4" else (32,)
    if block not in valid_blocks:
        shown = "no block size" if block is None else f"block size {block}"
        out.append(Problem("SP0513", f"{shown} is not valid for kind::{d.kind}",
                           f"use block size {' or '.join(map(str, valid_blocks))}", "block_size"))
        return out
    scales = ("ue8m0", "ue4m3") if (d.kind == "mxf4nvf4" and block == 16) else ("ue8m0",)
    if d.scale_dtype not in scales:
        out.append(Problem("SP0513", f"scale type {d.scale_dtype} is not valid for kind::{d.kind} with block "
                           f"size {block}", f"use {' or '.join(scales)} scale factors", "scale_dtype"))
    vec = 1 if d.kind == "mxf8f6f4" else (4 if block == 16 else 2)
    ids = tuple(range(0, 4, vec))
    for fld in ("a_scale_id", "b_scale_id"):
        if getattr(d, fld) not in ids:
            out.append(Problem("SP0513", f"{fld.replace('_', ' ')} {getattr(d, fld)} is not valid with "
                               f"scale_vec::{vec}X", f"use {' or '.join(map(str, ids))}", fld))
    if d.k96 and (d.sparse or d.kind == "mxf8f6f4"):
        out.append(Problem("SP0513", "K = 96 exists only for dense kind::mxf4 / kind::mxf4nvf4",
                           "drop k96", "k96"))
    return out


def idesc_problems(d: InstrDesc) -> list[Problem]:
    """Every rule ``d`` violates (empty when it can be encoded). §1.2, §1.3, §1.4, §9."""
    out = _name_problems(d)
    if out:
        return out
    out = _type_problems(d) + _shape_problems(d) + _mode_problems(d) + _block_scale_problems(d)
    return out


def pack_idesc(d: InstrDesc) -> int:
    """The 32-bit word for ``d`` without checking the rules (fields must be encodable)."""
    codes = TYPE_CODES[d.kind]
    common = [
        (int(d.sparse), 2, 1), (codes[d.a_dtype], 7, 3), (codes[d.b_dtype], 10, 3),
        (int(d.negate_a), 13, 1), (int(d.negate_b), 14, 1),
        (MAJORS.index(d.a_major), 15, 1), (MAJORS.index(d.b_major), 16, 1), (d.n >> 3, 17, 6),
    ]
    if not d.block_scaled:
        return pack_fields([*common, (d.selector, 0, 2), (int(d.saturate), 3, 1), (D_TYPE_CODES[d.d_dtype], 4, 2),
                      (d.m >> 4, 24, 5), (MAX_SHIFT_CODES[d.max_shift], 30, 2)])
    return pack_fields([*common, (d.b_scale_id, 4, 2),
                  (SCALE_TYPE_CODES[d.scale_dtype or "ue8m0"], 23, 1), (d.m >> 7, 27, 2),
                  (d.a_scale_id, 29, 2), (int(d.k96), 31, 1)])


def encode_idesc(d: InstrDesc) -> int:
    """The tcgen05 instruction descriptor for ``d``; :class:`InternalError` if it has problems.

    Bit layout (§1.3): 0-1 selector, 2 sparse, 3 saturate, 4-5 D type, 7-9 A type, 10-12 B type,
    13/14 negate A/B, 15/16 A/B major, 17-22 N>>3, 24-28 M>>4, 30-31 max shift. Block-scaled:
    0-1 reserved (no selector), 4-5 B scale id, 23 scale type, 27-28 M>>7, 29-30 A scale id, 31
    K=96 (4-bit kinds only).
    """
    raise_if_problems(idesc_problems(d), "tcgen05 instruction descriptor")
    return pack_idesc(d)


def decode_idesc(word: int, kind: str, *, cta_group: int = 1, block_size: int | None = None) -> InstrDesc:
    """The fields of the 32-bit descriptor ``word`` for an MMA of ``kind`` (the word alone does
    not say the kind: e4m3 and f16 share codes). Raises ``ValueError`` on undefined codes or
    reserved bits (PTX ISA "Instruction descriptor" tables; the block-scaled ones reserve bits
    0-1, which carry the sparsity selector only in the plain-kind table, and bit 31 for
    ``mxf8f6f4``, whose K = 96 flag exists only for the 4-bit kinds)."""
    if kind not in KINDS:
        raise ValueError(f"unknown tcgen05 MMA kind {kind!r}")
    if not 0 <= word < (1 << 32):
        raise ValueError(f"instruction descriptor {word:#x} does not fit 32 bits")
    codes = TYPE_CODES[kind]
    blocky = kind in BLOCK_SCALED_KINDS
    if blocky:  # bits 0-1 (no selector), 3, 6, 24-26; 12 for the 4-bit kinds, 31 for mxf8f6f4
        reserved = 0b11 | (1 << 3) | (1 << 6) | (0x7 << 24) | ((1 << 12) if kind in ("mxf4", "mxf4nvf4") else (1 << 31))
    else:  # bits 6, 23, 29 are reserved
        reserved = (1 << 6) | (1 << 23) | (1 << 29)
    if word & reserved:
        raise ValueError(f"reserved bits set in instruction descriptor {word:#010x}")
    fields = dict(
        kind=kind, a_dtype=code_name(codes, field_bits(word, 7, 3), f"A type (kind::{kind})"),
        b_dtype=code_name(codes, field_bits(word, 10, 3), f"B type (kind::{kind})"),
        n=field_bits(word, 17, 6) << 3, sparse=bool(field_bits(word, 2, 1)), selector=field_bits(word, 0, 2),
        a_major=MAJORS[field_bits(word, 15, 1)], b_major=MAJORS[field_bits(word, 16, 1)],
        negate_a=bool(field_bits(word, 13, 1)), negate_b=bool(field_bits(word, 14, 1)), cta_group=cta_group,
    )
    if not blocky:
        shift_code = field_bits(word, 30, 2)
        return InstrDesc(**fields, d_dtype=code_name(D_TYPE_CODES, field_bits(word, 4, 2), "D type"),
                         m=field_bits(word, 24, 5) << 4, saturate=bool(field_bits(word, 3, 1)),
                         max_shift=next(s for s, c in MAX_SHIFT_CODES.items() if c == shift_code))
    return InstrDesc(**fields, d_dtype="f32", m=field_bits(word, 27, 2) << 7,
                     scale_dtype=code_name(SCALE_TYPE_CODES, field_bits(word, 23, 1), "scale type"),
                     a_scale_id=field_bits(word, 29, 2), b_scale_id=field_bits(word, 4, 2), block_size=block_size,
                     k96=bool(field_bits(word, 31, 1)))


def describe_idesc(word: int, kind: str, *, cta_group: int = 1) -> str:
    """A one-line summary for ``--emit`` comments, e.g.
    ``idesc 0x08400014 kind::f16 sparse sel=0 A=f16/K B=f16/K D=f32 M=128 N=256``."""
    d = decode_idesc(word, kind, cta_group=cta_group)
    parts = [f"idesc {word:#010x} kind::{kind}", "sparse" if d.sparse else "dense"]
    if d.sparse:
        parts.append(f"sel={d.selector}")
    neg_a, neg_b = ("-" if d.negate_a else ""), ("-" if d.negate_b else "")
    parts += [f"A={neg_a}{d.a_dtype}/{d.a_major}", f"B={neg_b}{d.b_dtype}/{d.b_major}", f"D={d.d_dtype}",
              f"M={d.m}", f"N={d.n}"]
    if d.saturate:
        parts.append("satfinite")
    if d.block_scaled:
        parts += [f"scale={d.scale_dtype}", f"sfa_id={d.a_scale_id}", f"sfb_id={d.b_scale_id}"]
        if d.k96:
            parts.append("K=96")
    return " ".join(parts)


def tcgen05_k(kind: str, sparse: bool = True) -> int:
    """Logical K of one tcgen05 MMA (§1.2: sparse f16 32, tf32 16, 8-bit 64, fp4 128; dense half)."""
    dense = {"f16": 16, "tf32": 8, "f8f6f4": 32, "i8": 32, "mxf8f6f4": 32, "mxf4": 64, "mxf4nvf4": 64}[kind]
    return dense * 2 if sparse else dense
