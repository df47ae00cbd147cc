"""docs/architecture.md "Adding an op", followed to the letter: the toy op ``toy.axpb(x, a, b)``
(``a * x + b`` on an f32 tile, ``a`` and ``b`` constexpr) is defined in ONE place, the function
:func:`define_toy` below, with its builtin, typing rule, layout rule, legality rule, interpreter
semantics and lowering. Nothing else in the package is edited: the passes find every part through
the op's :class:`~sparsile.frontend.ops.opdefs.OpDef`.

The op is registered for the tests of this file only (a fixture removes it again), so that the
language reference and the op registry the other tests see are unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower import codegen
from sparsile.backend.lower.elementwise import map_values
from sparsile.backend.lower.llvm_text import const
from sparsile.driver.compiler import compile_kernel
from sparsile.frontend.diagnostics import CompileError, Diagnostic, InternalError
from sparsile.frontend.ir import types as T
from sparsile.frontend.ir.core import Operation, Value
from sparsile.frontend.ops.opdefs import OPS, OpDef, define_op, undefine_op
from sparsile.frontend.sema.builtins import NAMESPACES, ROOT, builtin
from sparsile.frontend.sema.emitter import Emitter
from sparsile.frontend.sema.values import Arg
from sparsile.target.targets import Feature, feature_problem

KERNEL = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr):
    i = arange(0, BLOCK)
    y = toy.axpb(load(x + i, mask=i < n), 3.0, -0.5)
    store(out + i, y, mask=i < n)
"""
SIGNATURE = "x=ptr[f32], out=ptr[f32], n=i32, BLOCK=128"


def define_toy(calls: list[str]) -> OpDef:
    """Everything about ``toy.axpb``, in one place (``calls`` records which rule ran)."""
    axpb = define_op("toy.axpb", operands=("x",), doc="a * x + b, elementwise, on an f32 tile")

    @builtin("axpb", ns="toy")
    def toy_axpb(em: Emitter, x: Arg, a: Arg, b: Arg) -> Value:
        """``a * x + b`` elementwise on an f32 tile; ``a`` and ``b`` are constexpr numbers."""
        v = em.tile_or_scalar(x)
        if T.element_type(v.type) != T.f32:
            em.error("SP0311", f"`toy.axpb` needs an f32 operand, found {v.type}", x.span)
        return em.op1("toy.axpb", [v], v.type, a=float(em.constexpr(a, "a", (int, float))),
                      b=float(em.constexpr(b, "b", (int, float))))

    @axpb.verifier
    def _verify(op: Operation) -> str | None:  # the typing rule
        calls.append("verify")
        return None if op.result.type == axpb.operand(op, "x").type else "the result type is not x's"

    @axpb.layout_rule
    def _layout(op: Operation, get: Any, set: Any) -> bool:  # the result is laid out as x
        calls.append("layout")
        x, known = axpb.operand(op, "x"), get(axpb.operand(op, "x"))
        if known is not None:
            return set(op.result, known)
        return get(op.result) is not None and set(x, get(op.result))

    @axpb.legality_rule
    def _legality(op: Operation, ctx: Any) -> Iterator[Diagnostic]:  # per target: sm_90 and later
        calls.append("legality")
        d = feature_problem(ctx.target, Feature.ELECT, op.span, what="`toy.axpb`")
        if d is not None:
            yield d

    @axpb.interpreter
    def _interpret(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
        calls.append("interpret")
        (x,) = args
        return [(np.float32(op.attrs["a"]) * x + np.float32(op.attrs["b"])).astype(np.float32)]

    @axpb.lowering_rule
    def _lower(cg: Any, op: Operation) -> None:
        calls.append("lower")
        a, b = const(op.attrs["a"], "float"), const(op.attrs["b"], "float")
        map_values(cg, op, lambda v: cg.fb.binop("fadd", cg.fb.binop("fmul", v[0], a), b))

    return axpb


@pytest.fixture
def toy() -> Iterator[list[str]]:
    calls: list[str] = []
    define_toy(calls)
    try:
        yield calls
    finally:
        undefine_op("toy.axpb")
        ROOT.members.pop("toy", None)
        NAMESPACES.pop("toy", None)
        codegen._ENSURED_OPS.discard("toy.axpb")


def test_the_interpreter_runs_the_ops_semantics(toy):
    kernel = sp.loads(KERNEL).kernels["k"]
    rng = np.random.default_rng(5)
    x = rng.uniform(-4, 4, 100).astype(np.float32) + np.float32(0.25)
    out = np.full(128, np.nan, np.float32)  # poisoned: the tail past n must stay untouched
    kernel.interpret[(1,)](x, out, 100, BLOCK=128)
    product = 3.0 * x.astype(np.float64)
    expected = product - 0.5
    # two f32 roundings (the product, then the sum): each within half an ulp of its exact value
    assert (np.abs(out[:100] - expected) <= 2.0**-24 * (np.abs(product) + np.abs(expected))).all()
    assert np.isnan(out[100:]).all()
    assert toy == ["interpret"]  # the interpreter runs the semantics alone (no compile passes)


def test_the_compiler_uses_the_ops_layout_legality_and_lowering(toy):
    kernel = sp.loads(KERNEL).kernels["k"]
    ck = compile_kernel(kernel, SIGNATURE, target="sm_90a", stop_after="ptx", cache=False)
    assert {"verify", "layout", "legality", "lower"} <= set(toy)
    assert "toy.axpb" in ck.ir and "#L[" in ck.ir.split("toy.axpb", 1)[1].splitlines()[0]
    assert "fmul float" in ck.llvm and "fadd float" in ck.llvm
    # a * x, then + b: two roundings, as the interpreter computes (3.0 = 0f40400000, -0.5 = 0fBF000000)
    assert ", 0f40400000;" in ck.ptx.split("mul.rn.f32", 1)[1].splitlines()[0]
    assert ", 0fBF000000;" in ck.ptx.split("add.rn.f32", 1)[1].splitlines()[0] and "fma" not in ck.ptx


def test_the_ops_legality_rule_reports_at_the_users_line(toy):
    kernel = sp.loads(KERNEL).kernels["k"]
    with pytest.raises(CompileError) as info:
        compile_kernel(kernel, SIGNATURE, target="sm_80", stop_after="llvm", cache=False)
    (d,) = info.value.diagnostics
    assert d.code == "SP0602" and d.message == "`toy.axpb` is not available on sm_80"
    assert d.span.line == 5 and d.span.source.text.splitlines()[4].strip().startswith("y = toy.axpb(")


def test_the_ops_typing_rule_reports_a_wrong_operand(toy):
    bad = KERNEL.replace("x: ptr[f32]", "x: ptr[f16]")
    with pytest.raises(CompileError) as info:
        compile_kernel(sp.loads(bad).kernels["k"], SIGNATURE.replace("ptr[f32], out", "ptr[f16], out"),
                       target="sm_90a", stop_after="ir", cache=False)
    assert info.value.codes == ["SP0311"]
    assert info.value.message == "`toy.axpb` needs an f32 operand, found tile<128xf16>"


def test_named_operands_are_checked(toy):
    op = OPS["toy.axpb"]
    with pytest.raises(InternalError, match=re.escape("`toy.axpb` has no operand named 'acc' (it has ('x',))")):
        op.operand(Operation("toy.axpb", [], [], {}), "acc")


def test_the_toy_is_gone_after_its_tests():
    assert "toy.axpb" not in OPS and "toy" not in ROOT.members and "toy" not in NAMESPACES
