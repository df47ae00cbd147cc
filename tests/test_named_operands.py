"""Operands are read by the names their op declares (``op.operand("acc")``), never by a fixed position.

Every op names its operands once, in ``frontend/ops/opdefs.py``'s ``define_op``; a pass that reads
``op.operands[3]`` breaks silently when an op gains an optional operand, so no module of the
compiler may subscript ``.operands`` with an integer literal (or slice it at one). Loops over
``op.operands`` and reads at a computed index (``op.operands[op.operand_index("x")]``) stay allowed.
"""

from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest

from sparsile.cli import main
from sparsile.driver.op_listing import load_registry
from sparsile.frontend.interp.host_arrays import STORED_OPERAND
from sparsile.frontend.ir.core import Operation

PACKAGE = Path(__file__).resolve().parents[1]
CHECKED = ("frontend", "backend", "driver")


def _int_literal(node: ast.expr | None) -> bool:
    """``3`` or ``-1``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def positional_reads(source: str, filename: str = "<src>") -> list[str]:
    """``file:line: text`` of every ``X.operands[<int>]`` and ``X.operands[<int>:...]`` in ``source``
    (no exemption: even the accessors in frontend/ir/core.py index by a computed position)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "operands"):
            continue
        index = node.slice
        fixed = _int_literal(index) if not isinstance(index, ast.Slice) else \
            _int_literal(index.lower) or _int_literal(index.upper)
        if fixed:
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_checker_finds_fixed_positions_and_only_those():
    src = ("a = op.operands[0]\nb = cterm.operands[-1]\nc = loop.operands[3:]\nd = x.y.operands[1:-1]\n"
           "e = op.operands[i]\nf = op.operands[op.operand_index('x')]\ng = list(op.operands)\nh = operands[0]\n")
    assert [r.split(": ", 1)[1] for r in positional_reads(src)] == [
        "op.operands[0]", "cterm.operands[-1]", "loop.operands[3:]", "x.y.operands[1:-1]"]


def test_no_module_reads_an_operand_by_a_fixed_position():
    files = sorted(f for d in CHECKED for f in (PACKAGE / d).rglob("*.py"))
    assert len(files) > 50  # the walk really reached the package
    found = [r for f in files for r in positional_reads(f.read_text(), str(f.relative_to(PACKAGE)))]
    assert not found, "read these operands by name (op.operand / optional_operand / operand_group):\n" + \
        "\n".join(found)


def test_operand_group_reads_a_variadic_group_in_order():
    load_registry()
    loop = Operation("scf.for", ["LB", "UB", "ST", "I0", "I1"], [])
    assert loop.operand_group("init") == ["I0", "I1"] and loop.operand("step") == "ST"
    assert Operation("scf.for", ["LB", "UB", "ST"], []).operand_group("init") == []
    cond = Operation("scf.condition", ["C", "V0", "V1"], [])
    assert cond.operand("cond") == "C" and cond.operand_group("value") == ["V0", "V1"]
    store = Operation("tensor.store_tile", ["T", "I", "J", "V"], [])
    assert store.operand_group("offset") == ["I", "J"] and store.operand_group("value") == []


@pytest.mark.parametrize("name", ["store", "tensor.store_tile", "tma.store", "smem.store", "tmem.store", "atomic_rmw",
                                  "atomic_cas"])
def test_every_storing_op_names_the_operand_it_writes_through(name):
    """The interpreter finds the parameters a kernel writes (host copies read back) through this
    table: a storing op missing from it would leave a written array stale."""
    ops = load_registry()
    writers = {n for n in ops if n == "store" or n.endswith(".store") or n.startswith("atomic_")}
    assert writers <= set(STORED_OPERAND) <= set(ops)
    probe = Operation(name, ["V0", "V1", "V2", "V3"], [])
    assert STORED_OPERAND[name] in ops[name].operand_names(probe)


def test_the_ops_command_shows_each_ops_operand_names():
    out = io.StringIO()
    assert main(["ops", "-v"], stdout=out) == 0
    text = out.getvalue()

    def operands_of(op: str) -> str:
        block = text.split(f"\n{op} ", 1)[1].split("\n")
        return next(line.strip() for line in block[1:4] if line.strip().startswith("operands:"))

    assert operands_of("arith.binary") == "operands: lhs, rhs"
    assert operands_of("arith.select") == "operands: cond, x, y"
    assert operands_of("scf.for") == "operands: lower, upper, step, init0, ..."
    assert operands_of("load") == "operands: ptr, mask (when has_mask), other (when has_other)"
    # a naming function's docstring, on one line and without its markup
    assert operands_of("tcgen05.mma").startswith("operands: a, b, d (the TMEM accumulator), a_meta when sparse")
    assert operands_of("tcgen05.mma").endswith("and last enable (accumulate into d, or overwrite it).")
