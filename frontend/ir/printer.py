"""A stable textual form of the IR (``sparsile compile --emit ir``), used by golden tests.

Example::

    kernel @add(%x: ptr[f32], %n: i32) [BLOCK=1024, num_warps=4] {
      %0 = program_id {axis=0} : i32
      %1 = arange {end=1024, start=0} : tile<1024xi32>  #blocked<...>
      ...
    }

Values are numbered in program order; attributes are printed sorted by name; layouts (after layout
inference) follow the type; ``loc`` comments are printed only when asked for.
"""

from __future__ import annotations

from typing import Any

from .core import Block, Function, Operation, Value


def _fmt_attr(v: Any) -> str:
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple | list):
        return "[" + ", ".join(_fmt_attr(x) for x in v) + "]"
    if hasattr(v, "short_name"):
        return v.short_name()
    return str(v)


class _Printer:
    def __init__(self, with_locations: bool):
        self.names: dict[int, str] = {}
        self.counter = 0
        self.lines: list[str] = []
        self.with_locations = with_locations

    def name(self, v: Value) -> str:
        key = id(v)
        if key not in self.names:
            self.names[key] = f"%{self.counter}"
            self.counter += 1
        return self.names[key]

    def bind(self, v: Value, hint: str) -> str:
        n = f"%{hint}" if hint and f"%{hint}" not in self.names.values() else None
        if n is None:
            return self.name(v)
        self.names[id(v)] = n
        return n

    def type_str(self, v: Value) -> str:
        s = str(v.type)
        if v.layout is not None:
            from ..layout.tile import short_name

            lay = v.layout.short_name() if hasattr(v.layout, "short_name") else short_name(v.layout)
            s += f" #{lay}"
        return s

    def op(self, op: Operation, indent: int) -> None:
        pad = "  " * indent
        res = ", ".join(self.name(r) for r in op.results)
        lhs = f"{res} = " if op.results else ""
        operands = ", ".join(self.name(o) for o in op.operands)
        attrs = ""
        if op.attrs:
            attrs = " {" + ", ".join(f"{k}={_fmt_attr(op.attrs[k])}" for k in sorted(op.attrs)) + "}"
        types = ""
        if op.results:
            types = " : " + ", ".join(self.type_str(r) for r in op.results)
        loc = f"  // {op.span}" if self.with_locations and op.span.line > 0 else ""
        head = f"{pad}{lhs}{op.name}{(' ' + operands) if operands else ''}{attrs}{types}"
        if not op.regions:
            self.lines.append(head + loc)
            return
        self.lines.append(head + " {" + loc)
        for i, region in enumerate(op.regions):
            if i:
                self.lines.append(f"{pad}}} {{")
            self.block(region.block, indent + 1)
        self.lines.append(f"{pad}}}")

    def block(self, block: Block, indent: int) -> None:
        if block.args:
            args = ", ".join(f"{self.name(a)}: {self.type_str(a)}" for a in block.args)
            self.lines.append("  " * indent + f"^({args}):")
        for op in block.ops:
            self.op(op, indent)


def print_function(func: Function, *, with_locations: bool = False) -> str:
    p = _Printer(with_locations)
    params = []
    for prm in func.params:
        if prm.is_constexpr:
            continue
        assert prm.value is not None
        params.append(f"{p.bind(prm.value, prm.name)}: {p.type_str(prm.value)}")
    consts = [f"{prm.name}={_fmt_attr(prm.constant)}" for prm in func.params if prm.is_constexpr]
    consts += [f"{k}={_fmt_attr(v)}" for k, v in sorted(func.attrs.items())]
    attr = f" [{', '.join(consts)}]" if consts else ""
    p.lines.append(f"kernel @{func.name}({', '.join(params)}){attr} {{")
    for op in func.body.block.ops:
        p.op(op, 1)
    p.lines.append("}")
    return "\n".join(p.lines) + "\n"
