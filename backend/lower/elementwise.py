"""Lowering of constants, program ids, ``arange``, shape ops that move no data, and elementwise
arithmetic, comparisons, math functions, selects and casts.

Elementwise semantics follow ``frontend/ops/core.py``: integer ``//`` and ``%`` round toward zero
(``sdiv``/``srem``, guarded against a zero divisor; ``MIN // -1`` is SP0790 in the interpreter);
shifts by the bit width or more give 0 (or the sign for ``>>`` of a negative); 16-bit float ops are computed natively
(correctly rounded, like the interpreter's per-op rounding); 8-bit floats (held as ``i8`` bits) and
math functions on 8/16-bit floats run in f32 and round once; float ``%`` is spelled out as the
interpreter models it; float->int casts saturate (NaN -> 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...frontend.diagnostics import CompileError, Diagnostic, InternalError
from ...frontend.ir import types as T
from ...frontend.ir.core import Operation, Value
from ...frontend.layout.tile import register_coords
from .codegen import CodeGen, DTile, lowering
from .deferred import Deferred, raw_regs, value_of
from .llvm_text import LLValue, const, llvm_type
from .special_math import erf_f32, tanh_f32

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def elem_of(v: Value) -> T.ScalarType | T.PointerType:
    return T.element_type(v.type)


def map_values(cg: CodeGen, op: Operation, fn: Callable[[list[LLValue]], LLValue]) -> None:
    """Apply ``fn`` register by register (memoized, so replicated registers cost nothing)."""
    args = [cg.get(v) for v in op.operands]
    res = op.results[0]
    if not isinstance(res.type, T.TileType):
        cg.set(res, fn(args))
        return
    tiles = [a for a in args if isinstance(a, DTile)]
    for t in tiles:
        if t.layout != res.layout:

            raise InternalError(f"`{op.name}` operands and result have different layouts", op.span)
    n = len(tiles[0].regs)
    if cg.defers(op):  # a deferred operand: each register emitted when first read (deferred.py)
        cg.set(res, DTile(res.layout, cg.pending.add(_deferred_map(args, n, fn)), elem_of(res)))
        return
    memo: dict[tuple[str, ...], LLValue] = {}
    regs = []
    for r in range(n):
        ins = [a.regs[r] if isinstance(a, DTile) else a for a in args]
        key = tuple(x.ref for x in ins)
        if key not in memo:
            memo[key] = fn(ins)
        regs.append(memo[key])
    cg.set(res, DTile(res.layout, regs, elem_of(res)))


def _deferred_map(args: list[Any], n: int, fn: Callable[[list[LLValue]], LLValue]) -> list[Deferred]:
    """Register r of ``fn`` over ``args`` as a Deferred of the operands' register r (one per
    distinct operand registers, as the memo of map_values)."""
    raws = [raw_regs(a.regs) if isinstance(a, DTile) else None for a in args]
    memo: dict[tuple[int, ...], Deferred] = {}
    regs = []
    for r in range(n):
        ins = [raw[r] if raw is not None else a for a, raw in zip(args, raws, strict=True)]
        key = tuple(id(x) for x in ins)
        d = memo.get(key)
        if d is None:
            d = memo[key] = Deferred(lambda ins=ins: fn([value_of(x) for x in ins]), ins)
        regs.append(d)
    return regs


@lowering("arith.constant")
def lower_constant(cg: CodeGen, op: Operation) -> None:
    res = op.result
    elem = elem_of(res)
    assert isinstance(elem, T.ScalarType)
    c = fp8_const(op.attrs["value"], elem) if elem.name in _F8 else const(op.attrs["value"], llvm_type(elem))
    if isinstance(res.type, T.TileType):
        n = res.layout.in_size("reg")
        cg.set(res, DTile(res.layout, [c] * n, elem))
    else:
        cg.set(res, c)


@lowering("program_id", "num_programs")
def lower_program_id(cg: CodeGen, op: Operation) -> None:
    axis = "xyz"[op.attrs["axis"]]
    cg.set(op.result, cg.sreg(("ctaid." if op.name == "program_id" else "nctaid.") + axis))


@lowering("arange")
def lower_arange(cg: CodeGen, op: Operation) -> None:
    res = op.result
    coords = cg.coords(res.layout)
    start = op.attrs["start"]
    regs = []
    for c in coords:
        v = c[0]
        if start:
            v = cg.fb.binop("add", v, const(start, "i32"))
        regs.append(v)
    cg.set(res, DTile(res.layout, regs, T.i32))


@lowering("splat")
def lower_splat(cg: CodeGen, op: Operation) -> None:
    res = op.result
    s = cg.get(op.operand("x"))
    cg.set(res, DTile(res.layout, [s] * res.layout.in_size("reg"), elem_of(res)))


@lowering("expand_dims", "reshape", "permute")
def lower_same_registers(cg: CodeGen, op: Operation) -> None:
    src = cg.get(op.operand("x"))
    res = op.result
    if isinstance(src, DTile):
        regs = raw_regs(src.regs)
        cg.set(res, DTile(res.layout, cg.pending.add(regs) if cg.defers(op) else regs, src.elem))
    else:  # expand_dims of a scalar is a splat to shape (1,)
        cg.set(res, DTile(res.layout, [src] * res.layout.in_size("reg"), elem_of(res)))


@lowering("broadcast")
def lower_broadcast(cg: CodeGen, op: Operation) -> None:
    src = cg.tile(op.operand("x"))
    res = op.result
    src_shape = T.shape_of(op.operand("x").type)
    lookup = {}
    for r, off in enumerate(register_coords(src.layout)):
        lookup.setdefault(off, r)
    src_regs = raw_regs(src.regs)
    regs = []
    for off in register_coords(res.layout):
        proj = tuple(0 if src_shape[d] == 1 else c for d, c in enumerate(off))
        if proj not in lookup:

            raise InternalError("broadcast source layout does not cover its result", op.span)
        regs.append(src_regs[lookup[proj]])
    cg.set(res, DTile(res.layout, cg.pending.add(regs) if cg.defers(op) else regs, src.elem))


# ------------------------------------------------------------------------------------------------
_INT_OPS = {"add": "add", "sub": "sub", "mul": "mul", "and": "and", "or": "or", "xor": "xor"}
_FLOAT_OPS = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv", "mod": "frem"}


def binary_value(cg: CodeGen, kind: str, t: T.ScalarType, a: LLValue, b: LLValue, span: object = None) -> LLValue:
    fb = cg.fb
    ty = a.type
    if t.name in _F8:  # held as i8 bits: computed in f32 (exact enough) and rounded back, saturating
        if kind == "floordiv":  # floor of the quotient rounded to the type, as for 16-bit floats
            q = through_f32(cg, t, [a, b], lambda v: binary_value(cg, "div", T.f32, v[0], v[1], span))
            return through_f32(cg, t, [q], lambda v: cg.intrinsic("float", "llvm.floor.f32", v))  # type: ignore
        return through_f32(cg, t, [a, b], lambda v: binary_value(cg, kind, T.f32, v[0], v[1], span))
    if t.is_float:
        if kind == "mod":
            return _float_mod(cg, a, b)
        if kind in _FLOAT_OPS:
            return fb.binop(_FLOAT_OPS[kind], a, b)
        if kind in ("max", "min"):
            return cg.intrinsic(ty, f"llvm.{kind}num.{_sfx(ty)}", [a, b])  # type: ignore[return-value]
        if kind == "floordiv":
            q = fb.binop("fdiv", a, b)
            return cg.intrinsic(ty, f"llvm.floor.{_sfx(ty)}", [q])  # type: ignore[return-value]
        if kind == "pow":
            return _float_pow(cg, t, a, b)
    else:
        signed = t.is_signed
        if kind in _INT_OPS:
            return fb.binop(_INT_OPS[kind], a, b)
        if kind in ("floordiv", "mod"):
            # division by zero is undefined on the GPU; avoid LLVM UB by dividing by 1 instead
            zero = fb.icmp("eq", b, const(0, ty))
            safe = fb.select(zero, const(1, ty), b)
            # MIN // -1 is not guarded (as in C): the interpreter reports it (SP0790); a guard in every
            # division made the stream-K kernel spill
            op = ("sdiv" if signed else "udiv") if kind == "floordiv" else ("srem" if signed else "urem")
            r = fb.binop(op, a, safe)
            return fb.select(zero, const(0, ty), r)
        if kind in ("max", "min"):
            name = f"llvm.{'s' if signed else 'u'}{kind}.{ty}"
            return cg.intrinsic(ty, name, [a, b])  # type: ignore[return-value]
        if kind in ("shl", "shr"):
            bits = t.bits
            big = fb.icmp("uge", b, const(bits, ty))
            # 64-bit: the amount masked, not selected. LLVM's NVPTX backend turns select(b >= 64, 0, a << b)
            # into PTX's clamping shl.b64 with the amount truncated to 32 bits (an amount of 2**32 shifted
            # by 0); with `b & 63` it cannot (docs/language.md rule 6: an amount >= the width gives 0 / the
            # sign). Narrower amounts are never truncated, and keep the one clamping shift.
            safe = fb.binop("and", b, const(bits - 1, ty)) if bits == 64 else fb.select(big, const(0, ty), b)
            r = fb.binop("shl" if kind == "shl" else ("ashr" if signed else "lshr"), a, safe)
            if kind == "shr" and signed:
                fill = fb.binop("ashr", a, const(bits - 1, ty))
            else:
                fill = const(0, ty)
            return fb.select(big, fill, r)
    raise CompileError([Diagnostic("SP0621", f"`{kind}` on {t} cannot be compiled", span)])  # type: ignore[arg-type]


def through_f32(cg: CodeGen, t: T.ScalarType, args: list[LLValue], fn: Callable[[list[LLValue]], LLValue]) -> LLValue:
    """``fn`` on ``args`` of the 8-bit float type ``t`` converted to f32; the f32 result converted
    back to ``t`` (``cvt.rn.satfinite``), as the interpreter rounds every op on 8-bit floats."""
    r = fn([cast_value(cg, t, T.f32, x) for x in args])
    return cast_value(cg, T.f32, t, r)


def _float_mod(cg: CodeGen, a: LLValue, b: LLValue) -> LLValue:
    """Float ``%``: ``fma(-trunc(a / b), b, a)``, ``a`` where ``b`` is infinite; 16-bit floats in
    f32, rounded once (the interpreter's ``gpu_fmod``). Spelled out rather than LLVM's ``frem``,
    whose NVPTX expansion is this sequence today but is no contract."""
    fb = cg.fb
    x, y = (a, b) if a.type == "double" else (to_f32(cg, a), to_f32(cg, b))
    ty, sfx = x.type, _sfx(x.type)
    t = cg.intrinsic(ty, f"llvm.trunc.{sfx}", [fb.binop("fdiv", x, y)])
    assert t is not None
    r = cg.intrinsic(ty, f"llvm.fma.{sfx}", [fb.value(f"fneg {ty} {t.ref}", ty), y, x])
    ay = cg.intrinsic(ty, f"llvm.fabs.{sfx}", [y])
    assert r is not None and ay is not None
    inf = fb.fcmp("oeq", ay, const(float("inf"), ty))
    return from_f32(cg, fb.select(inf, x, r), a.type) if a.type != "double" else fb.select(inf, x, r)


def _sfx(ty: str) -> str:
    return {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}[ty]


def _float_pow(cg: CodeGen, t: T.ScalarType, a: LLValue, b: LLValue) -> LLValue:
    x, y = to_f32(cg, a), to_f32(cg, b)
    lg = cg.intrinsic("float", "llvm.nvvm.lg2.approx.f", [x])
    assert lg is not None
    e = cg.intrinsic("float", "llvm.nvvm.ex2.approx.f", [cg.fb.binop("fmul", y, lg)])
    assert e is not None
    return from_f32(cg, e, a.type)


def to_f32(cg: CodeGen, v: LLValue) -> LLValue:
    if v.type == "float":
        return v
    return cg.fb.cast("fpext", v, "float")


def from_f32(cg: CodeGen, v: LLValue, ty: str) -> LLValue:
    if ty == "float":
        return v
    return cg.fb.cast("fptrunc", v, ty)


@lowering("arith.binary")
def lower_binary(cg: CodeGen, op: Operation) -> None:
    t = elem_of(op.results[0])
    assert isinstance(t, T.ScalarType)
    kind = op.attrs["op"]
    if t.is_bool and kind in ("and", "or", "xor"):
        map_values(cg, op, lambda v: cg.fb.binop(kind, v[0], v[1]))
        return
    map_values(cg, op, lambda v: binary_value(cg, kind, t, v[0], v[1], op.span))


_ICMP = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_FCMP = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}


@lowering("arith.cmp")
def lower_cmp(cg: CodeGen, op: Operation) -> None:
    t = elem_of(op.operand("lhs"))
    pred = op.attrs["pred"]
    if isinstance(t, T.PointerType) or not t.is_float:
        signed = isinstance(t, T.ScalarType) and t.is_signed
        p = pred if pred in ("eq", "ne") else ("s" if signed else "u") + _ICMP[pred]
        map_values(cg, op, lambda v: cg.fb.icmp(p, v[0], v[1]))
    elif t.name in _F8:  # i8 bits: compared as the f32 values they encode
        map_values(cg, op, lambda v: cg.fb.fcmp(_FCMP[pred], *(cast_value(cg, t, T.f32, x) for x in v)))
    else:
        map_values(cg, op, lambda v: cg.fb.fcmp(_FCMP[pred], v[0], v[1]))


@lowering("arith.unary")
def lower_unary(cg: CodeGen, op: Operation) -> None:
    t = elem_of(op.results[0])
    assert isinstance(t, T.ScalarType)
    kind = op.attrs["op"]

    def fn(v: list[LLValue]) -> LLValue:
        x = v[0]
        if kind == "neg":
            if t.name in _F8:  # flip the sign bit (NaN stays NaN)
                return cg.fb.binop("xor", x, const(-128, "i8"))
            if t.is_float:
                return cg.fb.value(f"fneg {x.type} {x.ref}", x.type)
            return cg.fb.binop("sub", const(0, x.type), x)
        if kind == "not":
            return cg.fb.binop("xor", x, const(1, "i1"))
        return cg.fb.binop("xor", x, const(-1, x.type))

    map_values(cg, op, fn)


def math_value(cg: CodeGen, fn: str, t: T.ScalarType, x: LLValue) -> LLValue:
    fb = cg.fb
    if t.name in _F8:
        return through_f32(cg, t, [x], lambda v: math_value(cg, fn, T.f32, v[0]))
    if fn == "abs":
        if t.is_float:
            return cg.intrinsic(x.type, f"llvm.fabs.{_sfx(x.type)}", [x])  # type: ignore[return-value]
        if not t.is_signed:  # llvm.abs reads its operand as signed: 0xFFFFFFFF would give 1
            return x
        return cg.intrinsic(x.type, f"llvm.abs.{x.type}", [x, const(0, "i1")])  # type: ignore[return-value]
    if x.type == "double":
        return _math_f64(cg, fn, x)
    f = to_f32(cg, x)
    if fn in ("exp", "exp2"):
        arg = fb.binop("fmul", f, const(LOG2E, "float")) if fn == "exp" else f
        r = cg.intrinsic("float", "llvm.nvvm.ex2.approx.f", [arg])
    elif fn in ("log", "log2"):
        r = cg.intrinsic("float", "llvm.nvvm.lg2.approx.f", [f])
        assert r is not None
        if fn == "log":
            r = fb.binop("fmul", r, const(LN2, "float"))
    elif fn == "sqrt":
        r = cg.intrinsic("float", "llvm.sqrt.f32", [f])
    elif fn == "rsqrt":
        r = cg.intrinsic("float", "llvm.nvvm.rsqrt.approx.f", [f])
    elif fn in ("sin", "cos"):
        r = cg.intrinsic("float", f"llvm.nvvm.{fn}.approx.f", [f])
    elif fn in ("floor", "ceil"):
        r = cg.intrinsic("float", f"llvm.{fn}.f32", [f])
    elif fn == "sigmoid":
        neg = fb.value(f"fneg float {f.ref}", "float")
        e = cg.intrinsic("float", "llvm.nvvm.ex2.approx.f", [fb.binop("fmul", neg, const(LOG2E, "float"))])
        assert e is not None
        # rcp.approx (PTX ISA, floating-point instructions: rcp), not the IEEE `rcp.rn` an fdiv becomes: it
        # assembles to a subroutine call for its slow path, and around the call ptxas spills every live register
        # (1.2 KB per thread in a 128 x 256 accumulator's silu epilogue; docs/hopper.md). 1 + e >= 1,
        # so the input is never subnormal; the result is within 1 ulp, flushed to 0 below 2^-126
        # (x < -87.3, where the exact sigmoid is below 1.2e-38) and 0 where e is infinite.
        r = cg.intrinsic("float", "llvm.nvvm.rcp.approx.ftz.f", [fb.binop("fadd", const(1.0, "float"), e)])
    elif fn == "tanh":
        r = tanh_f32(cg, f)
    elif fn == "erf":
        r = erf_f32(cg, f)
    else:
        raise CompileError([Diagnostic("SP0621", f"math function `{fn}` cannot be compiled")])
    assert r is not None
    return from_f32(cg, r, x.type)


def _math_f64(cg: CodeGen, fn: str, x: LLValue) -> LLValue:
    """The math builtins sema lets take f64 (``frontend/ops/core.py`` ``F64_MATH``), each IEEE-exact
    in f64: ``sqrt.rn.f64``, ``rsqrt`` as ``div.rn.f64(1, sqrt.rn.f64)`` (two roundings, as the
    interpreter), ``cvt.rmi`` / ``cvt.rpi`` for ``floor`` / ``ceil``."""
    if fn in ("sqrt", "rsqrt"):
        r = cg.intrinsic("double", "llvm.sqrt.f64", [x])
        assert r is not None
        return cg.fb.binop("fdiv", const(1.0, "double"), r) if fn == "rsqrt" else r
    if fn in ("floor", "ceil"):
        r = cg.intrinsic("double", f"llvm.{fn}.f64", [x])
        assert r is not None
        return r
    raise InternalError(f"math function `{fn}` of f64 reached the lowering (sema refuses it: SP0347)")


@lowering("math")
def lower_math(cg: CodeGen, op: Operation) -> None:
    t = elem_of(op.results[0])
    assert isinstance(t, T.ScalarType)
    map_values(cg, op, lambda v: math_value(cg, op.attrs["fn"], t, v[0]))


@lowering("arith.select")
def lower_select(cg: CodeGen, op: Operation) -> None:
    map_values(cg, op, lambda v: cg.fb.select(v[0], v[1], v[2]))


_F8 = {"e4m3": "e4m3x2", "e5m2": "e5m2x2"}


def fp8_const(value: float, elem: T.ScalarType) -> LLValue:
    """The ``i8`` bits of ``value`` in the 8-bit float type ``elem``, rounded as a cast to it
    (through f32, saturating; the interpreter's ``cast_array``), not ``int(value)``."""
    import numpy as np

    from ...frontend.interp.numerics import cast_array

    bits = cast_array(np.array(float(value), np.float64), T.f64, elem).view(np.int8)
    return const(int(bits), "i8")


def cast_value(cg: CodeGen, src: T.ScalarType, dst: T.ScalarType, x: LLValue) -> LLValue:
    """Convert one value (see the module docstring for the semantics)."""
    fb = cg.fb
    sty, dty = llvm_type(src), llvm_type(dst)
    if src == dst or (src.name in ("f32", "tf32") and dst.name in ("f32", "tf32") and dst.name == "f32"):
        return x
    if dst.is_bool:
        if src.name in _F8:  # i8 bits: nonzero unless +-0 (NaN is true, as `une`); no cvt, so any target
            return fb.icmp("ne", fb.binop("and", x, const(0x7F, "i8")), const(0, "i8"))
        if src.is_float:
            return fb.fcmp("une", x, const(0.0, sty))
        return fb.icmp("ne", x, const(0, sty))
    if src.name in _F8:
        # fp8 -> f16 exactly (cvt.rn.f16x2.e4m3x2), then on to the destination
        wide = fb.cast("zext", x, "i16")
        h2 = cg.asm("i32", f"cvt.rn.f16x2.{_F8[src.name]} $0, $1;", "=r,h", [wide], side_effect=False)
        assert h2 is not None
        lo = fb.cast("trunc", h2, "i16")
        h = fb.cast("bitcast", lo, "half")
        return cast_value(cg, T.f16, dst, h)
    if dst.name in _F8:
        f = cast_value(cg, src, T.f32, x) if src != T.f32 else x
        packed = cg.asm("i16", f"cvt.rn.satfinite.{_F8[dst.name]}.f32 $0, $2, $1;", "=h,f,f",
                        [f, const(0.0, "float")], side_effect=False)
        assert packed is not None
        return fb.cast("trunc", packed, "i8")
    if dst.name == "tf32":
        f = cast_value(cg, src, T.f32, x) if src.name != "f32" else x
        r = cg.asm("i32", "cvt.rna.tf32.f32 $0, $1;", "=r,f", [f], side_effect=False)
        assert r is not None
        return fb.cast("bitcast", r, "float")
    if src.is_float and dst.is_float:
        if dst.name == "bf16" and src.name == "f64" and cg.target.sm < 90:
            return _f64_to_bf16_below_sm90(cg, x)
        if src.bits == dst.bits and src.name != dst.name:  # f16 <-> bf16 through f32
            return cast_value(cg, T.f32, dst, cast_value(cg, src, T.f32, x))
        return fb.cast("fpext" if dst.bits > src.bits else "fptrunc", x, dty)
    if src.is_float and dst.is_int:
        sat = f"llvm.fpto{'s' if dst.is_signed else 'u'}i.sat.{dty}.{_sfx(sty)}"
        return cg.intrinsic(dty, sat, [x])  # type: ignore[return-value]
    if src.is_int and dst.is_float:
        if dst.name == "bf16" and src.bits >= 32 and cg.target.sm < 90:
            return _wide_int_to_bf16(cg, src, x)
        op = "uitofp" if (src.is_bool or not src.is_signed) else "sitofp"
        return fb.cast(op, x, dty)
    # int -> int
    if dst.bits > src.bits:
        return fb.cast("sext" if src.is_signed else "zext", x, dty)
    if dst.bits < src.bits:
        return fb.cast("trunc", x, dty)
    return x


def _wide_int_to_bf16(cg: CodeGen, src: T.ScalarType, x: LLValue) -> LLValue:
    """A 32- or 64-bit integer rounded once to bf16 on targets below sm_90, which have no
    ``cvt.rn.bf16.{s,u}{32,64}`` (PTX ISA 9.1, §9.7.9.21 "Data Movement and Conversion Instructions:
    cvt": bf16 from an integer needs sm_90), so LLVM converts to f32 and then to bf16: two
    roundings, and ``2**24 + 2**16 + 1`` became ``2**24`` instead of ``2**24 + 2**17`` (the
    interpreter, and sm_90's one instruction, round once: docs/language.md rule 8). Here the
    integer is converted to f32 toward zero (``cvt.rz``), the last bit is set where that dropped
    bits (rounding to odd: f32's 24 bits keep the sticky information for bf16's 8), and
    ``cvt.rn.bf16.f32`` then rounds once, correctly."""
    fb = cg.fb
    ity = llvm_type(src)
    sfx = f"{'s' if src.is_signed else 'u'}{src.bits}"
    truncated = cg.asm("float", f"cvt.rz.f32.{sfx} $0, $1;", f"=f,{'l' if src.bits == 64 else 'r'}", [x],
                       side_effect=False)
    assert truncated is not None
    back = fb.cast("fptosi" if src.is_signed else "fptoui", truncated, ity)  # exact: |truncated| <= |x|
    return _odd_to_bf16(cg, truncated, fb.icmp("ne", back, x))


def _f64_to_bf16_below_sm90(cg: CodeGen, x: LLValue) -> LLValue:
    """An f64 rounded once to bf16 on targets below sm_90, which have no ``cvt.rn.bf16.f64`` (PTX ISA
    9.1, §9.7.9.21 "cvt": sm_90), so LLVM rounded to f32 and then to bf16: twice (``2**24 + 2**16 + 1``
    gave ``2**24``, not ``2**24 + 2**17``). As :func:`_wide_int_to_bf16`: to f32 toward zero
    (``cvt.rz``; beyond f32's range its largest finite value, which still rounds to bf16's infinity),
    the last bit set where that was inexact (round to odd: f32 keeps 16 more bits than bf16 at every
    exponent, subnormals included), then ``cvt.rn.bf16.f32`` rounds once. NaN stays NaN."""
    fb = cg.fb
    truncated = cg.asm("float", "cvt.rz.f32.f64 $0, $1;", "=f,d", [x], side_effect=False)
    assert truncated is not None
    back = fb.cast("fpext", truncated, "double")  # exact
    return _odd_to_bf16(cg, truncated, fb.fcmp("une", back, x))


def _odd_to_bf16(cg: CodeGen, truncated: LLValue, inexact: LLValue) -> LLValue:
    """The f32 ``truncated`` (rounded toward zero) with its last bit set where ``inexact`` (an i1):
    rounded to odd, then ``cvt.rn.bf16.f32``, one correct rounding to bf16."""
    fb = cg.fb
    bits = fb.binop("or", fb.cast("bitcast", truncated, "i32"), fb.cast("zext", inexact, "i32"))
    return fb.cast("fptrunc", fb.cast("bitcast", bits, "float"), "bfloat")


@lowering("arith.cast")
def lower_cast(cg: CodeGen, op: Operation) -> None:
    src, dst = elem_of(op.operand("x")), elem_of(op.results[0])
    assert isinstance(src, T.ScalarType) and isinstance(dst, T.ScalarType)
    map_values(cg, op, lambda v: cast_value(cg, src, dst, v[0]))
