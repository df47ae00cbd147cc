"""A small builder of LLVM IR *text* for the NVPTX backend.

llvmlite's ``ir`` module cannot express what this backend needs (``bfloat``, call-site
``convergent``, ``byval``/``nvvm.grid_constant`` parameter attributes with opaque pointers), so
the code generator writes textual IR and hands it to :mod:`llvm_to_ptx`. Values are
:class:`LLValue` (an SSA name or a literal, plus its type); instructions append to the current basic
block; ``entry`` instructions (thread indices, hoisted constants) go to the function's first block.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ...frontend.ir import types as T


@dataclass(frozen=True)
class LLValue:
    ref: str  # "%v12", "42", "0x3FF0000000000000", "poison"
    type: str

    def __str__(self) -> str:
        return f"{self.type} {self.ref}"


def llvm_type(t: T.ScalarType | T.PointerType) -> str:
    """The LLVM type holding one element of ``t`` in registers."""
    if isinstance(t, T.PointerType):
        return "ptr addrspace(1)"
    return {
        "bool": "i1", "i8": "i8", "u8": "i8", "i16": "i16", "u16": "i16", "i32": "i32", "u32": "i32",
        "i64": "i64", "u64": "i64", "f16": "half", "bf16": "bfloat", "f32": "float", "tf32": "float",
        "f64": "double", "e4m3": "i8", "e5m2": "i8",
    }[t.name]


def float_literal(value: float, ty: str) -> str:
    """An exact LLVM literal for ``value`` in float type ``ty`` (hex form)."""
    if ty == "double" or ty == "float":
        # LLVM prints float constants as the double with the same value (must be exact in float)
        if ty == "float":  # rounded to nearest even, overflowing to infinity (as numpy.float32)
            import numpy as np

            with np.errstate(over="ignore"):
                value = float(np.float32(value))
        return "0x{:016X}".format(struct.unpack("<Q", struct.pack("<d", value))[0])
    if ty == "half":
        import numpy as np

        with np.errstate(over="ignore"):  # overflowing to infinity, as for float
            return f"0xH{int(np.array(value, np.float16).view(np.uint16)):04X}"
    if ty == "bfloat":  # rounded once, as cvt.rn.bf16.f64 (ml_dtypes may round through f32)
        import numpy as np

        from ...frontend.interp.numerics import f64_to_bf16

        return f"0xR{int(f64_to_bf16(np.array(value, np.float64)).view(np.uint16)):04X}"
    raise ValueError(ty)


def const(value: int | float | bool, ty: str) -> LLValue:
    if ty == "i1":
        return LLValue("true" if value else "false", ty)
    if ty in ("half", "bfloat", "float", "double"):
        return LLValue(float_literal(float(value), ty), ty)
    return LLValue(str(int(value)), ty)


@dataclass
class Block:
    label: str
    lines: list[str] = field(default_factory=list)
    terminated: bool = False
    prologue: list[str] = field(default_factory=list)  # hoisted instructions, printed first


class FunctionBuilder:
    """Builds one function's body."""

    def __init__(self, name: str, params: list[str], attrs: str = ""):
        self.name = name
        self.params = params  # full parameter declarations, e.g. "ptr addrspace(1) %x"
        self.attrs = attrs
        self.blocks: list[Block] = [Block("entry")]
        self.current = self.blocks[0]
        self.hoist = self.blocks[0]  # where emit_entry puts instructions (a partition's first block)
        self._counter = 0
        self._labels = 0

    # -- names ---------------------------------------------------------------------------------
    def fresh(self, hint: str = "v") -> str:
        self._counter += 1
        return f"%{hint}{self._counter}"

    def new_block(self, hint: str) -> Block:
        self._labels += 1
        b = Block(f"{hint}{self._labels}")
        self.blocks.append(b)
        return b

    def set_block(self, b: Block) -> None:
        self.current = b

    # -- emission ------------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        assert not self.current.terminated, f"emitting into terminated block {self.current.label}: {line}"
        self.current.lines.append("  " + line)

    def emit_entry(self, line: str) -> None:
        """Emit where it dominates everything that follows: the function entry, or the first block of
        the warp-specialized partition being generated."""
        self.hoist.prologue.append("  " + line)

    def value(self, rhs: str, ty: str, hint: str = "v", entry: bool = False, function_entry: bool = False) -> LLValue:
        """``name = rhs``; ``entry``: hoisted to the current partition's first block;
        ``function_entry``: hoisted to the function's entry block (valid in every partition)."""
        name = self.fresh(hint)
        if function_entry:
            self.blocks[0].prologue.append(f"  {name} = {rhs}")
        elif entry:
            self.emit_entry(f"{name} = {rhs}")
        else:
            self.emit(f"{name} = {rhs}")
        return LLValue(name, ty)

    def terminate(self, line: str) -> None:
        self.emit(line)
        self.current.terminated = True

    def br(self, target: Block) -> None:
        self.terminate(f"br label %{target.label}")

    def cond_br(self, cond: LLValue, t: Block, f: Block) -> None:
        self.terminate(f"br i1 {cond.ref}, label %{t.label}, label %{f.label}")

    # -- common instructions -------------------------------------------------------------------
    def binop(self, op: str, a: LLValue, b: LLValue, flags: str = "") -> LLValue:
        f = f" {flags}" if flags else ""
        return self.value(f"{op}{f} {a.type} {a.ref}, {b.ref}", a.type)

    def icmp(self, pred: str, a: LLValue, b: LLValue) -> LLValue:
        return self.value(f"icmp {pred} {a.type} {a.ref}, {b.ref}", "i1")

    def fcmp(self, pred: str, a: LLValue, b: LLValue) -> LLValue:
        return self.value(f"fcmp {pred} {a.type} {a.ref}, {b.ref}", "i1")

    def select(self, c: LLValue, a: LLValue, b: LLValue) -> LLValue:
        return self.value(f"select i1 {c.ref}, {a.type} {a.ref}, {b.type} {b.ref}", a.type)

    def cast(self, op: str, v: LLValue, ty: str) -> LLValue:
        if v.type == ty and op in ("bitcast", "zext", "sext", "trunc"):
            return v
        return self.value(f"{op} {v.type} {v.ref} to {ty}", ty)

    def call(self, ret: str, fn: str, args: list[LLValue], attrs: str = "") -> LLValue | None:
        arglist = ", ".join(str(a) for a in args)
        a = f" {attrs}" if attrs else ""
        if ret == "void":
            self.emit(f"call void @{fn}({arglist}){a}")
            return None
        return self.value(f"call {ret} @{fn}({arglist}){a}", ret)

    def gep(self, elem_ty: str, ptr: LLValue, index: LLValue, flags: str = "inbounds") -> LLValue:
        kw = f"getelementptr {flags}" if flags else "getelementptr"
        return self.value(f"{kw} {elem_ty}, {ptr.type} {ptr.ref}, {index.type} {index.ref}", ptr.type)

    def phi(self, ty: str, incoming: list[tuple[LLValue, str]], hint: str = "phi") -> LLValue:
        parts = ", ".join(f"[ {v.ref}, %{lbl} ]" for v, lbl in incoming)
        return self.value(f"phi {ty} {parts}", ty, hint)

    def extract(self, agg: LLValue, index: int, ty: str) -> LLValue:
        return self.value(f"extractvalue {agg.type} {agg.ref}, {index}", ty)

    def extract_element(self, vec: LLValue, index: int, ty: str) -> LLValue:
        return self.value(f"extractelement {vec.type} {vec.ref}, i32 {index}", ty)

    def insert_element(self, vec: LLValue, v: LLValue, index: int) -> LLValue:
        return self.value(f"insertelement {vec.type} {vec.ref}, {v.type} {v.ref}, i32 {index}", vec.type)

    def render(self) -> str:
        out = [f"define {self.attrs_prefix()}void @{self.name}({', '.join(self.params)}) #0 {{"]
        for b in self.blocks:
            out.append(f"{b.label}:")
            out.extend(b.prologue)
            out.extend(b.lines)
        out.append("}")
        return "\n".join(out)

    def attrs_prefix(self) -> str:
        return f"{self.attrs} " if self.attrs else ""


class ModuleBuilder:
    """Declarations, globals and functions of one LLVM module for NVPTX."""

    def __init__(self) -> None:
        self.decls: dict[str, str] = {}
        self.globals: list[str] = []
        self.functions: list[str] = []
        self.attributes: dict[str, str] = {"0": "nounwind", "1": "convergent nounwind"}

    def declare(self, name: str, decl: str) -> str:
        """Declare an intrinsic once (``decl`` is the full ``declare ...`` line)."""
        self.decls.setdefault(name, decl)
        return name

    def render(self) -> str:
        parts = ['target triple = "nvptx64-nvidia-cuda"', ""]
        parts.extend(self.globals)
        parts.append("")
        parts.extend(self.decls.values())
        parts.append("")
        parts.extend(self.functions)
        parts.append("")
        for k, v in self.attributes.items():
            parts.append(f"attributes #{k} = {{ {v} }}")
        return "\n".join(parts) + "\n"
