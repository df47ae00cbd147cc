"""Code generation: from the typed, layout-annotated IR of one kernel to LLVM IR text.

Every IR op's lowerings are part of its definition (``OpDef.lowerings``, frontend/ops/opdefs.py):
the modules of this package register them into the OpDefs by op name with :func:`lowering` when
they are imported (the frontend imports no backend code), the target-specific ones tried first. Scalars
become one LLVM value (the same in every thread); tiles become a :class:`DTile`, one LLVM value per
register of the tile's layout, whose logical coordinate in thread ``(lane, warp)`` is
``thread_base(lane, warp) XOR register_offset(reg)``. Structured control flow becomes basic blocks
with phi nodes. Shared memory for conversions and reductions is carved out of the kernel's dynamic
shared memory; its size goes into the compiled kernel's metadata for the launcher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...frontend.diagnostics import CompileError, Diagnostic, InternalError, coded_error_diagnostic
from ...frontend.ir import types as T
from ...frontend.ir.core import Block, Function, Operation, Value
from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.tile import LANE, WARP, register_coords, thread_bases
from ...frontend.ops.opdefs import OPS, Lowering, attach
from ...target.hooks import PreparedState
from ...target.targets import Target
from .address_form import disjoint_dims
from .codegen_state import CodegenState
from .deferred import DEFERRABLE_OPS, NEUTRAL_OPS, Pending, is_deferred
from .llvm_text import FunctionBuilder, LLValue, ModuleBuilder, const, llvm_type
from .wide_address import large_tile


@dataclass
class DTile:
    """A tile in registers: ``regs[r]`` holds the element at ``thread_base ^ reg_offset[r]``."""

    layout: LinearLayout
    regs: list[LLValue]
    elem: T.ScalarType | T.PointerType

    @property
    def ty(self) -> str:
        return self.regs[0].type


@dataclass
class TensorArg:
    """A ``tensor[T, rank]`` parameter: base pointer, shape and strides (elements, i32)."""

    ptr: LLValue
    shape: list[LLValue]
    strides: list[LLValue]
    elem: T.ScalarType
    tensormaps: dict[Any, LLValue] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelParam:
    """One parameter of the generated kernel, for the launcher: ``kind`` is ``"ptr"``,
    ``"scalar"``, ``"tensor_ptr"``, ``"tensor_dim"``, ``"tensor_stride"`` or ``"tensormap"``."""

    name: str  # source parameter
    kind: str
    dtype: str  # element/scalar type name
    index: int = 0  # dimension for tensor_dim/stride; box key for tensormap
    extra: Any = None


@dataclass(frozen=True)
class PartitionCtx:
    """The warps the code being generated runs on: the whole CTA (index -1) or one partition of
    ``warp_specialize``."""

    index: int
    first_warp: int
    num_warps: int


# Lowering modules imported for every kernel, and those imported only when a kernel has one of
# their ops (an op name, or a prefix ending in "."): blackwell alone costs a fresh process
# ~15 ms of imports (layout.tmem_access, descriptors), which a vector add should not pay.
# tests/backend/test_codegen_registry.py checks this table against what each module registers.
CORE_LOWERING_MODULES = ("asynchronous", "control", "dot", "elementwise", "memory", "reduce", "tma")
OPTIONAL_LOWERING_MODULES: dict[str, tuple[str, ...]] = {
    "hopper": ("hopper.", "dot", "sparse_dot"),
    "mma": ("dot", "sparse_dot"),
    "blackwell": ("tmem.", "dot", "sparse_dot"),  # imports blackwell_tile
    "blackwell_mma": ("tcgen05.",),  # imports blackwell
    "cluster": ("cluster.", "tma.load_cluster"),
    "grid_dependency": ("pdl.",),
}
_ENSURED_OPS: set[str] = set()


def llvm_name(name: str) -> str:
    """``name`` as an LLVM and PTX identifier: unchanged when it is ASCII letters, digits and ``_``
    (every kernel and parameter name in practice); any other character (Python identifiers may be
    non-ASCII, PTX ones may not: PTX ISA §4.4 "Identifiers") becomes ``$u<hex code point>``.
    ``$`` is legal in PTX identifiers and impossible in Python ones, so a mangled name never
    collides with a plain one. The kernel's PTX entry is ``llvm_name(kernel name)``."""
    if name.isascii():
        return name
    return "".join(ch if ch.isascii() else f"$u{ord(ch):04x}" for ch in name)


def _needs_module(op_name: str, entries: tuple[str, ...]) -> bool:
    return any(op_name == e or (e.endswith(".") and op_name.startswith(e)) for e in entries)


def ensure_lowerings(op_name: str) -> None:
    """Import the optional lowering modules that may register a lowering for ``op_name`` (the core
    ones are imported by :meth:`CodeGen.generate` before any op is lowered)."""
    if op_name in _ENSURED_OPS:
        return
    import importlib

    for module, entries in OPTIONAL_LOWERING_MODULES.items():
        if _needs_module(op_name, entries):
            importlib.import_module(f"{__package__}.{module}")
    _ENSURED_OPS.add(op_name)


def lowering(*names: str, when: Callable[[CodeGen], bool] | None = None
             ) -> Callable[[Callable[[CodeGen, Operation], None]], Callable[[CodeGen, Operation], None]]:
    """Register a lowering of the IR ops ``names`` into their OpDefs; with ``when``, only for
    targets where it holds (e.g. ``when=lambda cg: cg.target.has(Feature.WGMMA)``), tried before
    the generic one."""

    def deco(fn: Callable[[CodeGen, Operation], None]) -> Callable[[CodeGen, Operation], None]:
        entry = Lowering(fn, when)
        for n in names:
            attach(n, lambda d: d.add_lowering(entry))
        return fn

    return deco


def load_all_lowerings() -> None:
    """Import every lowering module (``sparsile ops`` and the tests list every op's lowerings)."""
    import importlib

    for module in (*CORE_LOWERING_MODULES, *OPTIONAL_LOWERING_MODULES):
        importlib.import_module(f"{__package__}.{module}")


class CodeGen:
    """Generates the LLVM IR of one kernel. ``prepared`` is what the target's prepare hook handed
    on (``run_passes``); ``state`` is what the lowerings leave for each other (codegen_state.py)."""

    def __init__(self, func: Function, target: Target, num_warps: int, prepared: PreparedState | None = None):
        self.func = func
        self.target = target
        self.total_warps = num_warps
        self.part = PartitionCtx(-1, 0, num_warps)
        self.mod = ModuleBuilder()
        self.params: list[KernelParam] = []
        self.vals: dict[int, Any] = {}
        self.smem_bytes = 0
        self.smem_align = 16
        self.extra_fn_attrs: dict[str, str] = {}
        self._thread_cache: dict[Any, list[LLValue]] = {}
        self._sreg_cache: dict[str, LLValue] = {}
        self.fb: FunctionBuilder = FunctionBuilder(func.name, [])
        self.prepared = prepared if prepared is not None else PreparedState()
        self.state = CodegenState()
        self.pending = Pending()
        """Tiles whose registers are emitted at first use (deferred.py): forced before every op
        that cannot take them deferred and at the end of every block."""

    # ------------------------------------------------------------------------------ driver
    def generate(self) -> str:
        self._load_lowerings()
        from .tma import collect_tma_keys

        collect_tma_keys(self)
        threads = 32 * self.total_warps
        cluster = self.func.attrs.get("cluster")
        if cluster:  # a thread-block cluster kernel: .explicitcluster + .reqnctapercluster, launched with it
            self.state.cluster = tuple(cluster)
            self.extra_fn_attrs["nvvm.cluster_dim"] = ",".join(str(int(c)) for c in cluster)
        self.state.default_regs = min(255, (65536 // threads) // 8 * 8)
        decls = self._declare_params()
        self.fb = FunctionBuilder(llvm_name(self.func.name), decls, "ptx_kernel")
        self._bind_params()
        self.lower_block(self.func.body.block)
        self.fb.terminate("ret void")
        self.mod.globals.append(f"@sparsile_smem = external addrspace(3) global [0 x i8], align {max(16, 1024)}")
        self.mod.functions.append(self.fb.render())
        attrs = {"nvvm.reqntid": str(threads), **self.extra_fn_attrs}
        maxnreg = self.func.attrs.get("maxnreg")
        if maxnreg:
            attrs["nvvm.maxnreg"] = str(maxnreg)
        self.mod.attributes["0"] = "nounwind " + " ".join(f'"{k}"="{v}"' for k, v in attrs.items())
        return self.mod.render()

    @staticmethod
    def _load_lowerings() -> None:
        """Import the lowering modules every kernel needs (the others: :func:`ensure_lowerings`)."""
        import importlib

        for module in CORE_LOWERING_MODULES:
            importlib.import_module(f"{__package__}.{module}")

    def _declare_params(self) -> list[str]:
        decls: list[str] = []
        for p in self.func.runtime_params:
            t, name = p.type, f"%p_{llvm_name(p.name)}"
            if isinstance(t, T.PointerType):
                align = " align 16" if p.divisible_16 else ""
                decls.append(f"ptr addrspace(1) noundef{align} {name}")
                self.params.append(KernelParam(p.name, "ptr", t.elem.name))
            elif isinstance(t, T.ScalarType):
                decls.append(f"{llvm_type(t)} noundef {name}")
                self.params.append(KernelParam(p.name, "scalar", t.name))
            elif isinstance(t, T.TensorType):
                align = " align 16" if p.divisible_16 else ""
                decls.append(f"ptr addrspace(1) noundef{align} {name}")
                self.params.append(KernelParam(p.name, "tensor_ptr", t.elem.name))
                for d in range(t.rank):
                    decls.append(f"i32 noundef {name}_dim{d}")
                    self.params.append(KernelParam(p.name, "tensor_dim", t.elem.name, d))
                for d in range(t.rank):
                    decls.append(f"i32 noundef {name}_stride{d}")
                    self.params.append(KernelParam(p.name, "tensor_stride", t.elem.name, d))
                for key in self.tensormap_keys(p.value):  # type: ignore[arg-type]
                    idx = len([q for q in self.params if q.kind == "tensormap"])
                    decls.append(f'ptr byval([128 x i8]) align 64 "nvvm.grid_constant" {name}_tmap{idx}')
                    self.params.append(KernelParam(p.name, "tensormap", t.elem.name, idx, key))
            else:
                raise InternalError(f"unsupported kernel parameter type {t}", p.span)
        return decls

    def tensormap_keys(self, v: Value) -> list[Any]:
        """The distinct TMA boxes a tensor parameter is accessed with (``TmaPlan.keys``), in order."""
        return list(self.state.tma_keys.get(id(v), []))

    def _bind_params(self) -> None:
        for p in self.func.runtime_params:
            t, name = p.type, f"%p_{llvm_name(p.name)}"
            assert p.value is not None
            if isinstance(t, T.PointerType):
                self.vals[id(p.value)] = LLValue(name, "ptr addrspace(1)")
            elif isinstance(t, T.ScalarType):
                self.vals[id(p.value)] = LLValue(name, llvm_type(t))
            elif isinstance(t, T.TensorType):
                maps = {}
                for q in self.params:
                    if q.name == p.name and q.kind == "tensormap":
                        maps[q.extra] = LLValue(f"{name}_tmap{q.index}", "ptr")
                self.vals[id(p.value)] = TensorArg(
                    LLValue(name, "ptr addrspace(1)"),
                    [LLValue(f"{name}_dim{d}", "i32") for d in range(t.rank)],
                    [LLValue(f"{name}_stride{d}", "i32") for d in range(t.rank)], t.elem, maps)

    # ------------------------------------------------------------------------------ blocks
    def lower_block(self, block: Block) -> None:
        for op in block.ops:
            if op.name in ("scf.yield", "scf.condition"):
                continue  # read by the parent's lowering
            if op.name not in NEUTRAL_OPS and op.name != "load" and not self.defers(op):  # (a load decides itself)
                self.pending.force()
            ensure_lowerings(op.name)
            d = OPS.get(op.name)
            fn = d.lowering_for(self) if d is not None else None
            if fn is None:
                raise CompileError([Diagnostic(
                    "SP0620", f"`{op.name}` cannot be compiled for {self.target.name} yet", op.span,
                    help="run the kernel in the interpreter (`kernel.interpret[grid](...)`) or choose another target")])
            try:
                fn(self, op)
            except (CompileError, InternalError):
                raise
            except ValueError as e:  # LayoutError, SparsityError: an operand the op cannot take
                located = coded_error_diagnostic(e, op.span)
                if located is None:
                    raise
                raise CompileError([located]) from None
        self.pending.force()

    def defers(self, op: Operation) -> bool:
        """Whether ``op``'s registers are deferred: a pure register op with a deferred operand."""
        if op.name not in DEFERRABLE_OPS:
            return False
        for v in op.operands:
            x = self.vals.get(id(v))
            if isinstance(x, DTile) and is_deferred(x.regs):
                return True
        return False

    # ------------------------------------------------------------------------------ values
    def get(self, v: Value) -> Any:
        try:
            return self.vals[id(v)]
        except KeyError:
            raise InternalError(f"value {v!r} used before it was generated") from None

    def set(self, v: Value, x: Any) -> None:
        self.vals[id(v)] = x

    def tile(self, v: Value) -> DTile:
        x = self.get(v)
        if not isinstance(x, DTile):
            raise InternalError(f"expected a tile for {v!r}")
        return x

    def scalar(self, v: Value) -> LLValue:
        x = self.get(v)
        if not isinstance(x, LLValue):
            raise InternalError(f"expected a scalar for {v!r}")
        return x

    @property
    def num_warps(self) -> int:
        """Warps of the current partition (the CTA outside warp specialization)."""
        return self.part.num_warps

    # ------------------------------------------------------------------------------ threads
    def sreg(self, name: str) -> LLValue:
        """A special register read once in the entry block (``tid.x``, ``ctaid.y``, ...)."""
        if name not in self._sreg_cache:
            fn = f"llvm.nvvm.read.ptx.sreg.{name}"
            self.mod.declare(fn, f"declare i32 @{fn}()")
            self._sreg_cache[name] = self.fb.value(f"call i32 @{fn}()", "i32", "sr", function_entry=True)
        return self._sreg_cache[name]

    @property
    def tid(self) -> LLValue:
        return self.sreg("tid.x")

    def lane_id(self) -> LLValue:
        if "lane" not in self._sreg_cache:
            self._sreg_cache["lane"] = self.fb.value(f"and i32 {self.tid.ref}, 31", "i32", "lane",
                                                     function_entry=True)
        return self._sreg_cache["lane"]

    def _part_key(self) -> str:
        """The cache scope of values hoisted to the current partition's first block: the partition
        and that block (two ``warp_specialize`` ops of one kernel both have a partition 0, and a
        value hoisted into the first does not dominate the second)."""
        return f"{self.part.index}@{self.fb.hoist.label}" if self.part.index >= 0 else "-1"

    def warp_id(self) -> LLValue:
        """The warp index within the current partition (uniform across the warp)."""
        key = f"warp{self._part_key()}"
        if key not in self._sreg_cache:
            w = self.fb.value(f"lshr i32 {self.tid.ref}, 5", "i32", "warp", entry=True)
            if self.part.first_warp:
                w = self.fb.value(f"sub i32 {w.ref}, {self.part.first_warp}", "i32", "warp", entry=True)
            self._sreg_cache[key] = w
        return self._sreg_cache[key]

    def local_tid(self) -> LLValue:
        """The thread index within the current partition."""
        key = f"ltid{self._part_key()}"
        if key not in self._sreg_cache:
            t = self.tid
            if self.part.first_warp:
                t = self.fb.value(f"sub i32 {t.ref}, {32 * self.part.first_warp}", "i32", "ltid", entry=True)
            self._sreg_cache[key] = t
        return self._sreg_cache[key]

    def is_leader(self) -> LLValue:
        """True in the first thread of the current partition (it issues single-thread ops)."""
        key = f"leader{self._part_key()}"
        if key not in self._sreg_cache:
            self._sreg_cache[key] = self.fb.value(f"icmp eq i32 {self.local_tid().ref}, 0", "i1", "lead", entry=True)
        return self._sreg_cache[key]

    def thread_base(self, layout: LinearLayout) -> list[LLValue]:
        """Per logical dim, the XOR of the lane and warp bases of this thread (entry block)."""
        lanes, warps = thread_bases(layout, LANE), thread_bases(layout, WARP)
        key = (self._part_key(), tuple(lanes), tuple(warps), len(layout.out_dims))
        if key in self._thread_cache:
            return self._thread_cache[key]
        rank = len(layout.out_dims)
        out = []
        for d in range(rank):
            acc: LLValue = const(0, "i32")
            for src, bases in ((self.lane_id(), lanes), (self.warp_id(), warps)):
                for b, basis in enumerate(bases):
                    if basis[d] == 0:
                        continue
                    bit = self.fb.value(f"lshr i32 {src.ref}, {b}", "i32", "tb", entry=True)
                    bit = self.fb.value(f"and i32 {bit.ref}, 1", "i32", "tb", entry=True)
                    term = self.fb.value(f"mul i32 {bit.ref}, {basis[d]}", "i32", "tb", entry=True)
                    acc = self.fb.value(f"xor i32 {acc.ref}, {term.ref}", "i32", "tb", entry=True)
            out.append(acc)
        self._thread_cache[key] = out
        return out

    def coords(self, layout: LinearLayout) -> list[list[LLValue]]:
        """For each register, its logical coordinates as i32 values (``base ^ offset``; on a dim
        whose register and thread bits are disjoint, ``base | offset``, which for a tile of more
        than ``tile_address.LINEAR_ABOVE`` registers per thread is ``add nuw nsw`` to an opaque copy
        of the base: :meth:`opaque_base`)."""
        base = self.thread_base(layout)
        offsets = register_coords(layout)
        disjoint = disjoint_dims(layout)
        large = large_tile(len(offsets))
        out = []
        for off in offsets:
            row = []
            for d, o in enumerate(off):
                if o == 0:
                    row.append(base[d])
                elif disjoint[d] and large:
                    row.append(self.fb.value(f"add nuw nsw i32 {self.opaque_base(base[d]).ref}, {o}", "i32", "c"))
                else:
                    op = "or disjoint" if disjoint[d] else "xor"
                    row.append(self.fb.value(f"{op} i32 {base[d].ref}, {o}", "i32", "c"))
            out.append(row)
        return out

    def opaque_base(self, base: LLValue) -> LLValue:
        """``base`` (a thread's coordinate) through an inline-asm ``mov`` (entry block, once).

        LLVM then knows none of its bits, so its sums with register offsets stay ``add nuw nsw``
        rather than becoming ``or disjoint``, which the NVPTX straight-line strength reduction cannot
        relate: for each ``s + (base | k)`` of a large tile it scanned every earlier one (quadratic:
        2 s of code generation for 1024 of them, 0.03 s as adds)."""
        if not base.ref.startswith("%"):
            return base
        key = f"opaque{base.ref}"
        if key not in self._sreg_cache:
            self._sreg_cache[key] = self.fb.value(f'call i32 asm "mov.b32 $0, $1;", "=r,r"(i32 {base.ref})',
                                                  "i32", "tb", entry=True)
        return self._sreg_cache[key]

    # ------------------------------------------------------------------------------ shared memory
    def smem_alloc(self, nbytes: int, align: int = 16) -> int:
        """Reserve ``nbytes`` of the kernel's dynamic shared memory; returns the byte offset."""
        off = (self.smem_bytes + align - 1) // align * align
        self.smem_bytes = off + nbytes
        self.smem_align = max(self.smem_align, align)
        return off

    def smem_ptr(self, offset: LLValue | int) -> LLValue:
        off = offset if isinstance(offset, LLValue) else const(offset, "i32")
        return self.fb.value(f"getelementptr inbounds i8, ptr addrspace(3) @sparsile_smem, i32 {off.ref}",
                             "ptr addrspace(3)", "sp")

    def barrier(self) -> None:
        """Synchronize the threads of the current partition (``bar.sync 0`` for the whole CTA, a
        named barrier ``1 + index`` for a partition)."""
        if self.part.index < 0:
            self.mod.declare("llvm.nvvm.barrier0", "declare void @llvm.nvvm.barrier0() #1")
            self.fb.emit("call void @llvm.nvvm.barrier0() #1")
        else:
            self.asm("void", f"bar.sync {1 + self.part.index}, {32 * self.part.num_warps};", "", [],
                     side_effect=True, convergent=True)

    def intrinsic(self, ret: str, name: str, args: list[LLValue], convergent: bool = False) -> LLValue | None:
        arg_types = ", ".join(a.type for a in args)
        attr = " #1" if convergent else ""
        self.mod.declare(name, f"declare {ret} @{name}({arg_types}){attr}")
        return self.fb.call(ret, name, args, "#1" if convergent else "")

    def asm(self, ret: str, text: str, constraints: str, args: list[LLValue], side_effect: bool = True,
            convergent: bool = False) -> LLValue | None:
        arglist = ", ".join(str(a) for a in args)
        se = " sideeffect" if side_effect else ""
        text = text.replace("\\", "\\\\").replace('"', '\\22').replace("\n", "\\0A")
        attr = " #1" if convergent else ""
        if ret == "void":
            self.fb.emit(f'call void asm{se} "{text}", "{constraints}"({arglist}){attr}')
            return None
        return self.fb.value(f'call {ret} asm{se} "{text}", "{constraints}"({arglist}){attr}', ret, "asm")


def generate_llvm(func: Function, target: Target, num_warps: int, prepared: PreparedState | None = None
                  ) -> tuple[str, CodeGen]:
    """The LLVM IR of ``func`` (laid out and checked by ``run_passes``, which returned ``prepared``),
    and the :class:`CodeGen` that generated it (its parameters, shared memory and state)."""
    cg = CodeGen(func, target, num_warps, prepared)
    return cg.generate(), cg
