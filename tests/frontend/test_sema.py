"""Sema: name resolution, constant evaluation, promotion, shapes and broadcasting, helpers,
structured control flow and specialization, checked on the typed IR it builds."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import sparsile  # noqa: F401  (registers every op)
from sparsile.driver.module import loads
from sparsile.frontend.ir import types as T
from sparsile.frontend.ir.core import Function, Operation, Value
from sparsile.frontend.ir.verify import verify_function


def kernel(body: str, params: str = "out: ptr[f32]", helpers: str = "") -> str:
    lines = textwrap.dedent(body).strip("\n").split("\n")
    return helpers + "@kernel\ndef k(" + params + "):\n" + "\n".join("    " + ln for ln in lines) + "\n"


def ir_of(source: str, **signature: object) -> Function:
    """The verified IR of kernel `k`: run-time parameters typed by their annotations unless
    ``signature`` gives them; constexpr values from ``signature``."""
    k = loads(source, "t.spk").kernels["k"]
    sig = {p.name: signature.get(p.name, p.annotation) for p in k.params}
    bindings, key = k.signature_bindings(sig)
    func = k.ir_for(bindings, key)
    verify_function(func)
    return func


def ops(func: Function, name: str) -> list[Operation]:
    return [op for op in func.walk() if op.name == name]


def const_value(v: Value) -> object:
    """The value of the constant ``v`` is made of (through splats and broadcasts)."""
    op = v.owner
    while op is not None and op.name in ("splat", "broadcast"):
        op = op.operands[0].owner
    assert op is not None and op.name == "arith.constant", op
    return op.attrs["value"]


def top_level(func: Function) -> list[str]:
    return [op.name for op in func.body.block.ops]


# ------------------------------------------------------------------------------------ constants
@pytest.mark.parametrize(("expr", "consts"), [
    ("(B * 2 + 1) // 3 == 11", {"B": 16}),
    ("-7 // 2 == -3 and -7 % 2 == -1", {}),          # C division (types.py rule 6), not Python's
    ("7 // -2 == -3 and 7 % -2 == 1", {}),
    ("7 / 2 == 3.5", {}),
    ("2 ** 10 == 1024 and 1 << 4 == 16 and 0xF0 >> 4 == 15", {}),
    ("(6 & 3) == 2 and (6 | 3) == 7 and (6 ^ 3) == 5", {}),
    ("0 < B < 100 and not (B > 100)", {"B": 64}),
    ("B == 64 if True else False", {"B": 64}),
    ("S[1] == 2 * S[0] and len(S) == 2", {"S": (8, 16)}),
    ("S + (1,) == (8, 16, 1) and (1,) * 3 == (1, 1, 1)", {"S": (8, 16)}),
    ("S[-1] == 16 and S[:1] == (8,)", {"S": (8, 16)}),
    ("min(S) == 8 and max(S) == 16 and max(3, 4) == 4 and abs(-3) == 3", {"S": (8, 16)}),
    ("16 in S and 5 not in S", {"S": (8, 16)}),
    ("D == f16 and D.bits == 16 and D.is_float and not i8.is_float", {"D": T.f16}),
    ("cdiv(10, 4) == 3 and cdiv(B, 16) == 4", {"B": 64}),
    ("int(2.7) == 2 and float(3) == 3.0 and i32(2.9) == 2 and bool(0) == False", {}),
    ("N is None and M is not None", {"N": None, "M": 1}),
    ('"ab" + "c" == "abc" and len("abc") == 3', {}),
])
def test_constant_expressions_fold(expr: str, consts: dict) -> None:
    params = ", ".join(["out: ptr[f32]", *(f"{n}: constexpr" for n in consts)])
    func = ir_of(kernel(f"static_assert({expr})", params), **consts)
    assert top_level(func) == []  # nothing reached run time


def test_constants_stay_constants_until_used() -> None:
    func = ir_of(kernel("""
        a = B * 4
        b = (a, a + 1)
        c, d = b
        store(out + arange(0, c), d)
    """, "out: ptr[f32], B: constexpr"), B=8)
    (ar,) = ops(func, "arange")
    assert ar.attrs == {"start": 0, "end": 32}
    (const,) = [op for op in ops(func, "arith.constant") if op.attrs["value"] == 33]
    assert const.result.type == T.f32  # the literal took the pointee type at the store


# ------------------------------------------------------------------------------------ names
def test_names_resolve_locals_then_module_then_builtins() -> None:
    src = "BLOCK = 32\nexp = 3\n\n" + kernel("""
        x = arange(0, BLOCK)
        y = x + exp
        store(out + x, y)
    """)
    func = ir_of(src)
    assert ops(func, "arange")[0].attrs["end"] == 32
    assert not ops(func, "math")  # the module constant `exp` shadows the builtin


def test_module_imports_and_aliases() -> None:
    src = "import sparsile as sp\nfrom sparsile import arange as ar, f16\n\n" + kernel("""
        x = sp.load(out + ar(0, 16))
        store(out + ar(0, 16), x.to(f16).to(sp.f32))
    """)
    func = ir_of(src)
    assert [op.attrs["to"] for op in ops(func, "arith.cast")] == ["f16", "f32"]


# ------------------------------------------------------------------------------------ promotion
PROMOTION = [
    ("i8", "i32", T.i32), ("i32", "i64", T.i64), ("u8", "i8", T.u8), ("u32", "i32", T.u32),
    ("i32", "u8", T.i32), ("f16", "f32", T.f32), ("f16", "bf16", T.f32), ("bf16", "f32", T.f32),
    ("i32", "f16", T.f16), ("i64", "f32", T.f32), ("bool", "bool", T.i32), ("bool", "i8", T.i32),
    ("bool", "i64", T.i64), ("e4m3", "f16", T.f16), ("e5m2", "bf16", T.bf16), ("f32", "f64", T.f64),
]


@pytest.mark.parametrize(("a", "b", "expected"), PROMOTION)
def test_binary_promotion(a: str, b: str, expected: T.ScalarType) -> None:
    func = ir_of(kernel("z = x + y\nstatic_assert(z.dtype == R)", f"x: {a}, y: {b}, R: constexpr"), R=expected)
    (add,) = ops(func, "arith.binary")
    assert add.result.type == expected
    assert [v.type for v in add.operands] == [expected, expected]


@pytest.mark.parametrize(("t", "literal", "expected"), [
    ("f16", "1", T.f16), ("f16", "1.5", T.f16), ("i8", "1", T.i8), ("i32", "1.5", T.f32),
    ("u16", "3", T.u16), ("bool", "1", T.i32), ("bool", "True", T.bool_),
])
def test_literals_are_weakly_typed(t: str, literal: str, expected: T.ScalarType) -> None:
    op = "&" if literal == "True" else "+"
    func = ir_of(kernel(f"z = x {op} {literal}\nstatic_assert(z.dtype == R)", f"x: {t}, R: constexpr"), R=expected)
    assert ops(func, "arith.binary")[0].result.type == expected


def test_division_and_comparison_types() -> None:
    func = ir_of(kernel("""
        a = x / y
        b = x // y
        c = x % y
        d = x < y
        e = (x < y) & (y < 10)
        static_assert(a.dtype == f32 and b.dtype == i32 and c.dtype == i32)
        static_assert(d.dtype == bool and e.dtype == bool)
    """, "x: i32, y: i32"))
    kinds = [op.attrs["op"] for op in ops(func, "arith.binary")]
    assert kinds == ["div", "floordiv", "mod", "and"]
    assert ops(func, "arith.binary")[0].operands[0].type == T.f32  # ints converted before `/`


def test_pointer_arithmetic_types() -> None:
    func = ir_of(kernel("""
        p = out + arange(0, 16)
        q = p - 1
        r = out + i.to(i8)
        static_assert(p.dtype == f32)
    """, "out: ptr[f32], i: i32"))
    adds = ops(func, "addptr")
    assert [str(a.result.type) for a in adds] == ["tile<16xptr[f32]>", "tile<16xptr[f32]>", "ptr[f32]"]
    assert ops(func, "arith.cast")[-1].attrs["to"] == "i32"  # narrow offsets are widened


# ------------------------------------------------------------------------------------ shapes
def test_broadcasting_and_expand_dims() -> None:
    func = ir_of(kernel("""
        r = arange(0, 8)
        c = arange(0, 16)
        grid = r[:, None] * 16 + c[None, :]
        static_assert(grid.shape == (8, 16))
        col = r[:, None]
        static_assert(col.shape == (8, 1) and r[None, :].shape == (1, 8) and r[:].shape == (8,))
        s = n + grid
        static_assert(s.shape == (8, 16))
        t = expand_dims(c, 0) + zeros((4, 16), i32)
        static_assert(t.shape == (4, 16))
    """, "out: ptr[f32], n: i32"))
    assert {op.name for op in func.walk()} >= {"expand_dims", "broadcast", "splat"}


def test_reductions_reshape_and_permute_shapes() -> None:
    ir_of(kernel("""
        x = zeros((4, 8, 16), f16)
        static_assert(sum(x, axis=0).shape == (8, 16) and max(x, axis=-1).shape == (4, 8))
        static_assert(sum(x).shape == () and sum(x).dtype == f16 and x.sum(1).shape == (4, 16))
        static_assert(sum(zeros((4,), i8)).dtype == i32)
        static_assert(argmax(x, axis=2).dtype == i32)
        static_assert(reshape(x, (32, 16)).shape == (32, 16) and permute(x, (2, 0, 1)).shape == (16, 4, 8))
        static_assert(trans(zeros((4, 8), f32)).shape == (8, 4))
        static_assert(broadcast_to(zeros((1, 8), f32), (4, 8)).shape == (4, 8))
    """))


def test_where_full_and_casts() -> None:
    func = ir_of(kernel("""
        m = arange(0, 16) < n
        a = where(m, 1.0, zeros((16,), f16))
        static_assert(a.dtype == f16 and a.shape == (16,))
        b = full((2, 8), n, f32)
        static_assert(b.dtype == f32 and b.shape == (2, 8))
        c = b.to(i8)
        static_assert(c.dtype == i8)
    """, "out: ptr[f32], n: i32"))
    assert ops(func, "arith.select")[0].result.type == T.TileType(T.f16, (16,))


# ------------------------------------------------------------------------------------ helpers
def test_helpers_are_inlined_with_defaults_keywords_and_tuples() -> None:
    helpers = textwrap.dedent("""
        def scale(x, factor=2):
            return x * factor

        def split(x, B: constexpr):
            lo = x + arange(0, B)
            return lo, lo + B

    """)
    func = ir_of(kernel("""
        a, b = split(n, B=16)
        store(out + a, scale(a.to(f32)))
        store(out + b, scale(b.to(f32), factor=3.0))
    """, "out: ptr[f32], n: i32", helpers))
    assert not any(op.name.startswith("call") for op in func.walk())
    muls = [op for op in ops(func, "arith.binary") if op.attrs["op"] == "mul"]
    assert [const_value(m.operands[1]) for m in muls] == [2.0, 3.0]


def test_nested_helper_reads_enclosing_names_at_the_call() -> None:
    func = ir_of(kernel("""
        k = 3.0
        def f(x):
            return x * k
        k = 5.0
        store(out + arange(0, 16), f(arange(0, 16).to(f32)))
    """))
    (mul,) = [op for op in ops(func, "arith.binary") if op.attrs["op"] == "mul"]
    assert const_value(mul.operands[1]) == 5.0  # late binding, as in Python


def test_helper_with_early_return_merges_paths() -> None:
    helpers = "def pick(x, n):\n    if n > 0:\n        return x\n    return x + 1.0\n\n"
    func = ir_of(kernel("store(out, pick(1.5, n))", "out: ptr[f32], n: i32", helpers))
    (iff,) = ops(func, "scf.if")
    assert [r.type for r in iff.results] == [T.f32]


# ------------------------------------------------------------------------------------ control flow
def test_constant_if_prunes_and_runtime_if_merges() -> None:
    func = ir_of(kernel("""
        if B > 8:
            v = 1.0
        else:
            v = undefined_name_never_analysed
        if n > 0:
            w = v
            u = 1
        else:
            w = 2.0
            u = 2
        store(out, w + u)
    """, "out: ptr[f32], n: i32, B: constexpr"), B=16)
    (iff,) = ops(func, "scf.if")
    assert sorted(str(r.type) for r in iff.results) == ["f32", "i32"]


def test_elif_chain_nests() -> None:
    func = ir_of(kernel("""
        v = 0.0
        if n > 3:
            v = 1.0
        elif n > 1:
            v = 2.0
        store(out, v)
    """, "out: ptr[f32], n: i32"))
    assert len(ops(func, "scf.if")) == 2


def test_loops() -> None:
    func = ir_of(kernel("""
        acc = zeros((16,), f32)
        for i in range(n):
            acc += i
        for j in static_range(3):
            acc = acc * (j + 1)
        i = 0
        while i < n:
            i += 2
        store(out + arange(0, 16), acc + i)
    """, "out: ptr[f32], n: i32"))
    (loop,) = ops(func, "scf.for")
    assert [a.type for a in loop.regions[0].block.args] == [T.i32, T.TileType(T.f32, (16,))]
    assert len(ops(func, "scf.while")) == 1
    muls = [op for op in ops(func, "arith.binary") if op.attrs["op"] == "mul"]
    assert len(muls) == 3  # static_range unrolled


def test_constant_before_loop_takes_the_type_the_body_gives() -> None:
    func = ir_of(kernel("""
        acc = 0
        for i in range(n):
            acc += load(x + arange(0, 16))
        store(out + arange(0, 16), acc)
    """, "x: ptr[f16], out: ptr[f32], n: i32"))
    (loop,) = ops(func, "scf.for")
    assert loop.results[0].type == T.TileType(T.f16, (16,))


def test_name_reassigned_to_same_constant_is_not_carried() -> None:
    func = ir_of(kernel("""
        t = (1, 2)
        for i in range(n):
            t = (1, 2)
        store(out, t[1] + 0.0)
    """, "out: ptr[f32], n: i32"))
    (loop,) = ops(func, "scf.for")
    assert loop.results == []


def test_while_with_constant_false_condition_vanishes() -> None:
    func = ir_of(kernel("while B > 100:\n    pass\nstore(out, 1.0)", "out: ptr[f32], B: constexpr"), B=4)
    assert not ops(func, "scf.while")


def test_runtime_assert_becomes_device_assert() -> None:
    func = ir_of(kernel('assert n > 0, "n must be positive"', "out: ptr[f32], n: i32"))
    (a,) = ops(func, "device_assert")
    assert a.attrs["message"] == "n must be positive"


# ------------------------------------------------------------------------------------ specialization
def test_specialization_key_and_cache() -> None:
    k = loads(kernel("store(out + arange(0, B), 1.0)", "out: ptr[f32], n: i32, B: constexpr"), "t.spk").kernels["k"]
    x32 = np.zeros(64, np.float32)
    _, _, key_a = k.bind((x32, 32), {"B": 16})
    _, _, key_b = k.bind((x32, 32), {"B": 32})
    _, _, key_c = k.bind((x32, 33), {"B": 16})
    _, _, key_d = k.bind((x32, 48), {"B": 16})
    assert len({key_a, key_b, key_c}) == 3
    assert key_a == key_d  # 32 and 48 are both multiples of 16
    f1 = k.ir(x32, 32, B=16)
    assert k.ir(x32, 48, B=16) is f1  # cached
    assert k.ir(x32, 33, B=16) is not f1
    params = {p.name: p for p in f1.params}
    assert params["n"].divisible_16 and params["out"].divisible_16 and params["B"].constant == 16
    assert not {p.name: p for p in k.ir(x32, 33, B=16).params}["n"].divisible_16


def test_unannotated_parameters_take_the_argument_types() -> None:
    k = loads(kernel("store(out + arange(0, 16), x)", "out, x"), "t.spk").kernels["k"]
    f = k.ir(np.zeros(16, np.float16), 3)
    assert [str(p.type) for p in f.params] == ["ptr[f16]", "i32"]
    g = k.ir(np.zeros(16, np.int8), 2**40)
    assert [str(p.type) for p in g.params] == ["ptr[i8]", "i64"]


def test_launch_options_reach_the_ir_attributes() -> None:
    k = loads("@kernel(num_warps=8)\ndef k(out: ptr[f32]):\n    store(out, 1.0)\n", "t.spk").kernels["k"]
    x = np.zeros(4, np.float32)
    assert k.ir(x).attrs["num_warps"] == 8
    assert k.ir(x, num_warps=2).attrs["num_warps"] == 2


def test_a_constant_too_deeply_nested_to_evaluate_is_sp0205() -> None:
    # a flat chain of 3000 additions parses, but evaluating it recursed past Python's limit and
    # escaped as RecursionError (module constants, signature items, decorator options)
    from sparsile.frontend.diagnostics import CompileError

    source = "A = " + "1 + " * 3000 + "1\n"
    with pytest.raises(CompileError) as info:
        loads(source, "t.spk")
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("SP0205", "the expression is nested too deeply to evaluate")
    assert (str(d.span), d.help) == ("t.spk:1:5", "split it into named constants")


def test_a_signature_item_too_deeply_nested_is_sp0205() -> None:
    from sparsile.frontend.diagnostics import CompileError
    from sparsile.frontend.sema.specialize import parse_signature

    with pytest.raises(CompileError) as info:
        parse_signature("n=i32, BLOCK=" + "1+" * 3000 + "1")
    (d,) = info.value.diagnostics
    assert d.code == "SP0205"
    assert (d.span.source.name, d.span.col) == ("<signature>", 14)
