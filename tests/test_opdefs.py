"""Every op is defined in one place (frontend/ops/opdefs.py, docs/architecture.md "Adding an op"):
each has every part (typing rule, interpreter semantics, layout rule, legality rules, lowering) or an
explicit "none" with its reason; parts registered by name reach a defined op; `sparsile ops` lists
them; the MMA family reads its operands by name."""

from __future__ import annotations

import io
import re

import pytest

from sparsile.cli import main
from sparsile.driver.op_listing import compiles_for, load_registry, op_rows
from sparsile.frontend.diagnostics import InternalError
from sparsile.frontend.ir.core import Operation
from sparsile.frontend.ops.opdefs import PARTS, LayoutRule, NoPart, define_op, none, op_def, pending_names, undefine_op
from sparsile.target.targets import get_target

SPARSE_AND_MMA = ("sparse_dot", "dot", "hopper.wgmma", "hopper.wgmma_wait", "tcgen05.mma")


def test_every_op_has_every_part_or_an_explicit_none():
    ops = load_registry()
    assert len(ops) >= 66
    missing = [(name, part) for name, d in ops.items() for part, value in d.parts().items() if value is None]
    assert missing == []
    for d in ops.values():
        for value in d.parts().values():
            if isinstance(value, NoPart):
                assert value.why.strip(), d.name  # a "none" says why


def test_every_part_registered_by_name_reaches_a_defined_op():
    load_registry()
    assert pending_names() == []


def test_a_part_declared_none_cannot_be_attached_as_well():
    d = define_op("test.nothing", verify=none("x"), interpret=none("x"), layout=none("x"), legality=none("no rule"),
                  lower=none("never lowered"), doc="a test op")
    try:
        with pytest.raises(InternalError, match=re.escape("`test.nothing` declares no lowering (never lowered)")):
            d.lowering_rule(lambda cg, op: None)
        with pytest.raises(InternalError, match=re.escape("`test.nothing` declares no legality rule (no rule)")):
            d.legality_rule(lambda op, ctx: ())
    finally:
        undefine_op("test.nothing")


def test_the_sparse_and_mma_ops_have_their_parts_in_their_definition():
    load_registry()
    for name in SPARSE_AND_MMA[:4]:
        layout = op_def(name).layout
        assert isinstance(layout, LayoutRule) and layout.name == "accumulator('acc')", name
    assert op_def("sparse_dot").legality and op_def("hopper.wgmma").required == (
        "WGMMA", "`{op}` (warpgroup MMA, wgmma)")
    assert op_def("tcgen05.mma").required[0] == "TCGEN05"
    specific = {e.fn.__module__.rsplit(".", 1)[-1] for e in op_def("sparse_dot").lowerings if e.when is not None}
    assert specific == {"hopper", "mma", "blackwell_tile"}
    for name in SPARSE_AND_MMA:
        assert callable(op_def(name).interpret), name


@pytest.mark.parametrize("name,targets", [
    ("sparse_dot", {"sm_80", "sm_90a", "sm_100a"}),
    ("hopper.wgmma", {"sm_90a"}),
    ("tcgen05.mma", {"sm_100a"}),
])
def test_an_op_compiles_for_the_targets_with_its_feature_and_a_lowering(name, targets):
    d = load_registry()[name]
    for t in ("sm_80", "sm_90a", "sm_100a"):
        assert compiles_for(d, get_target(t)) == (t in targets), (name, t)


def test_named_operands_follow_the_op_attributes():
    load_registry()
    dense = Operation("hopper.wgmma", ["A", "B", "C"], [], {"sparse": False})
    sparse = Operation("hopper.wgmma", ["A", "B", "C", "E"], [], {"sparse": True})
    assert dense.operand("acc") == "C" and sparse.operand("a_meta") == "E"
    message = "`hopper.wgmma` has no operand named 'a_meta' (it has ('a', 'b', 'acc'))"
    with pytest.raises(InternalError, match=re.escape(message)):
        dense.operand("a_meta")
    mma = Operation("tcgen05.mma", ["A", "B", "D", "E", "SA", "SB", "EN"], [], {"sparse": True, "block_scale": True})
    assert [mma.operand(n) for n in ("d", "a_meta", "b_scale", "enable")] == ["D", "E", "SB", "EN"]
    assert Operation("sparse_dot", ["A", "E", "B", "C"], []).operand("a_meta") == "E"
    masked = Operation("load", ["P", "M"], [], {"has_mask": True, "has_other": False})
    assert masked.operand("mask") == "M" and masked.optional_operand("other") is None
    assert Operation("load", ["P", "M", "O"], [], {"has_mask": True, "has_other": True}).operand("other") == "O"
    tma = Operation("tma.load", ["T", "I", "J", "S", "B"], [])
    assert [tma.operand(n) for n in ("tensor", "offset1", "smem", "bar")] == ["T", "J", "S", "B"]


def test_the_ops_command_lists_every_op_with_its_targets_and_parts():
    out = io.StringIO()
    assert main(["ops", "-v"], stdout=out) == 0
    text = out.getvalue()
    rows = op_rows()
    for r in rows:
        assert f"{r.name:<22} [" in text
    sparse = text.split("\nsparse_dot ", 1)[1].split("\n")
    assert sparse[0].strip() == "[all targets]"
    assert text.split("\nhopper.wgmma ", 1)[1].split("\n")[0].strip() == "[sm_90a]"
    assert "layout: accumulator('acc')" in sparse[1] and "lower: generic + 3 per target" in sparse[1]
    assert "operands: a, a_meta, b, acc" in sparse[2]
    assert all(f"{p}: " in sparse[1] for p in PARTS)
    assert "MISSING" not in text


def test_the_ir_verifier_checks_the_operands_against_their_names():
    """An op emitted with fewer operands than its definition names is a compiler bug, caught by the
    IR verifier before any pass reads an operand by name."""
    import sparsile as sp
    from sparsile.driver.compiler import compile_kernel
    from sparsile.frontend.sema.builtins import NAMESPACES, ROOT, builtin
    from sparsile.frontend.sema.emitter import Emitter
    from sparsile.frontend.sema.values import Arg

    define_op("test.pair", operands=("x", "y"), verify=none("test"), layout=none("test"), legality=none("test"),
              doc="a test op emitted with one operand")

    @builtin("pair", ns="test")
    def pair(em: Emitter, x: Arg) -> None:
        v = em.tile_or_scalar(x)
        return em.op1("test.pair", [v], v.type)

    try:
        src = "@kernel\ndef k(x: ptr[f32]):\n    y = test.pair(load(x))\n    store(x, y)\n"
        with pytest.raises(InternalError, match=re.escape("`test.pair` has 1 operands, its definition names 2: x, y")):
            compile_kernel(sp.loads(src).kernels["k"], "x=ptr[f32]", target="sm_90a", stop_after="llvm",
                           cache=False)
    finally:
        undefine_op("test.pair")
        ROOT.members.pop("test", None)
        NAMESPACES.pop("test", None)
