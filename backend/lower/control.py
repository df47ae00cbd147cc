"""Lowering of structured control flow to basic blocks and phi nodes.

A tile carried through a loop or merged by a branch gets one phi per register; layout inference
guarantees that every carried tile has one layout on all edges.
"""

from __future__ import annotations

from typing import Any

from ...frontend.diagnostics import InternalError
from ...frontend.ir.core import Operation
from .codegen import CodeGen, DTile, lowering
from .llvm_text import LLValue


def _flatten(x: Any) -> list[LLValue]:
    if isinstance(x, DTile):
        return list(x.regs)
    if isinstance(x, LLValue):
        return [x]
    raise TypeError(f"cannot carry {x!r} through control flow")


def _check_layouts(values: list[Any], args: list[Any], what: str) -> None:
    """A carried tile must have one layout on every edge (inference guarantees it); anything else
    would silently mix up registers, so it is a compiler bug."""

    for v, a in zip(values, args, strict=True):
        lay = getattr(a, "layout", None)
        if isinstance(v, DTile) and lay is not None and v.layout != lay:
            raise InternalError(f"{what}: a carried tile changes layout across the loop edge")


def _unflatten(template: Any, regs: list[LLValue]) -> Any:
    if isinstance(template, DTile):
        n = len(template.regs)
        out = DTile(template.layout, regs[:n], template.elem)
        del regs[:n]
        return out
    return regs.pop(0)


def _phi_lines(cg: CodeGen, names: list[str], types: list[str], incoming: list[tuple[list[LLValue], str]]) -> list[str]:
    lines = []
    for i, (name, ty) in enumerate(zip(names, types, strict=True)):
        parts = ", ".join(f"[ {vals[i].ref}, %{label} ]" for vals, label in incoming)
        lines.append(f"  {name} = phi {ty} {parts}")
    return lines


@lowering("scf.for")
def lower_for(cg: CodeGen, op: Operation) -> None:
    fb = cg.fb
    lb, ub, step = (cg.scalar(op.operand(name)) for name in ("lower", "upper", "step"))
    inits = [cg.get(v) for v in op.operand_group("init")]
    flat_init = [r for x in inits for r in _flatten(x)]
    pre = fb.current
    header, body_bb, exit_bb = fb.new_block("for_head"), fb.new_block("for_body"), fb.new_block("for_exit")
    fb.br(header)
    fb.set_block(header)
    iv_name = fb.fresh("iv")
    iv = LLValue(iv_name, lb.type)
    phi_names = [fb.fresh("carry") for _ in flat_init]
    phi_vals = [LLValue(n, r.type) for n, r in zip(phi_names, flat_init, strict=True)]
    step_def = op.operand("step").owner
    step_const = step_def is not None and step_def.name == "arith.constant"
    if step_const and int(step_def.attrs["value"]) < 0:  # type: ignore[union-attr]
        cond = fb.icmp("sgt", iv, ub)
    elif step_const:
        cond = fb.icmp("slt", iv, ub)
    else:
        up = fb.icmp("slt", iv, ub)
        down = fb.icmp("sgt", iv, ub)
        pos = fb.icmp("sgt", step, LLValue("0", step.type))
        cond = fb.select(pos, up, down)
    fb.cond_br(cond, body_bb, exit_bb)
    fb.set_block(body_bb)
    body = op.regions[0].block
    _check_layouts(inits, body.args[1:], "scf.for")
    cg.set(body.args[0], iv)
    carried_templates = []
    regs = list(phi_vals)
    for arg, init in zip(body.args[1:], inits, strict=True):
        t = _unflatten(init, regs)
        cg.set(arg, t)
        carried_templates.append(t)
    cg.lower_block(body)
    term = body.terminator
    assert term is not None and term.name == "scf.yield"
    yielded = [r for v in term.operands for r in _flatten(cg.get(v))]
    iv_next = fb.binop("add", iv, step)
    latch = fb.current
    fb.br(header)
    iv_phi = f"  {iv_name} = phi {lb.type} [ {lb.ref}, %{pre.label} ], [ {iv_next.ref}, %{latch.label} ]"
    carried_phis = _phi_lines(cg, phi_names, [r.type for r in flat_init],
                              [(flat_init, pre.label), (yielded, latch.label)])
    header.lines[0:0] = [iv_phi, *carried_phis]
    fb.set_block(exit_bb)
    regs = list(phi_vals)
    for res, init in zip(op.results, inits, strict=True):
        cg.set(res, _unflatten(init, regs))


@lowering("scf.if")
def lower_if(cg: CodeGen, op: Operation) -> None:
    fb = cg.fb
    cond = cg.scalar(op.operand("cond"))
    then_bb, else_bb, merge = fb.new_block("then"), fb.new_block("else"), fb.new_block("endif")
    fb.cond_br(cond, then_bb, else_bb)
    ends = []
    yields = []
    for region, bb in zip(op.regions, (then_bb, else_bb), strict=True):
        fb.set_block(bb)
        cg.lower_block(region.block)
        term = region.block.terminator
        vals = [cg.get(v) for v in term.operands] if term is not None else []
        yields.append(vals)
        ends.append(fb.current.label)
        fb.br(merge)
    fb.set_block(merge)
    if not op.results:
        return
    flat_then = [r for x in yields[0] for r in _flatten(x)]
    flat_else = [r for x in yields[1] for r in _flatten(x)]
    names = [fb.fresh("ifv") for _ in flat_then]
    merge.lines[0:0] = _phi_lines(cg, names, [r.type for r in flat_then],
                                  [(flat_then, ends[0]), (flat_else, ends[1])])
    regs = [LLValue(n, r.type) for n, r in zip(names, flat_then, strict=True)]
    for res, tmpl in zip(op.results, yields[0], strict=True):
        cg.set(res, _unflatten(tmpl, regs))


@lowering("scf.while")
def lower_while(cg: CodeGen, op: Operation) -> None:
    fb = cg.fb
    inits = [cg.get(v) for v in op.operands]
    flat_init = [r for x in inits for r in _flatten(x)]
    pre = fb.current
    before_bb, after_bb, exit_bb = fb.new_block("while_cond"), fb.new_block("while_body"), fb.new_block("while_exit")
    fb.br(before_bb)
    fb.set_block(before_bb)
    names = [fb.fresh("wcarry") for _ in flat_init]
    phi_vals = [LLValue(n, r.type) for n, r in zip(names, flat_init, strict=True)]
    before, after = op.regions[0].block, op.regions[1].block
    regs = list(phi_vals)
    for arg, init in zip(before.args, inits, strict=True):
        cg.set(arg, _unflatten(init, regs))
    cg.lower_block(before)
    cterm = before.terminator
    assert cterm is not None and cterm.name == "scf.condition"
    cond = cg.scalar(cterm.operand("cond"))
    passed = [cg.get(v) for v in cterm.operand_group("value")]
    fb.cond_br(cond, after_bb, exit_bb)
    fb.set_block(after_bb)
    for arg, val in zip(after.args, passed, strict=True):
        cg.set(arg, val)
    cg.lower_block(after)
    yterm = after.terminator
    assert yterm is not None
    yielded = [r for v in yterm.operands for r in _flatten(cg.get(v))]
    latch = fb.current
    fb.br(before_bb)
    before_bb.lines[0:0] = _phi_lines(cg, names, [r.type for r in flat_init],
                                      [(flat_init, pre.label), (yielded, latch.label)])
    fb.set_block(exit_bb)
    for res, val in zip(op.results, passed, strict=True):
        cg.set(res, val)


@lowering("device_assert")
def lower_device_assert(cg: CodeGen, op: Operation) -> None:
    """Device assertions are checked by the interpreter only; GPU code ignores them."""
