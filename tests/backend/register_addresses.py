"""Test helper: every register of every pointer tile a kernel forms (``addptr``), as the emitted LLVM IR
computes it for every thread of a program, against the interpreter's pointer at that register's
coordinates (address_eval.py evaluates the IR).

Unlike comparing the sorted addresses of the accesses, this sees an address given to the wrong
register (a permutation), and checks the pointer tiles of a chain ``(x + a) + b`` one by one.

The boxes of ``tensor[T, rank]`` parameters read and written on the generic path (``load_tile`` /
``store_tile``, backend/lower/tile_address.py) are checked the same way: each register's in-bounds
predicate, for every lane, is the interpreter's (``box_offsets`` at the offsets the interpreter
computed), and where it holds its address is the interpreter's element's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import sparsile as sp
from sparsile.backend.lower import memory
from sparsile.backend.lower.codegen import DTile, generate_llvm
from sparsile.backend.lower.llvm_text import LLValue
from sparsile.driver.compiler import run_passes
from sparsile.frontend.interp.host_arrays import interpreter_params
from sparsile.frontend.interp.interpreter import Interpreter, ProgramContext
from sparsile.frontend.interp.values import OUT_OF_BOUNDS, InterpreterError, PtrVal
from sparsile.frontend.ir import types as T
from sparsile.frontend.ir.core import Block, Operation
from sparsile.frontend.layout.layouts import LinearLayout
from sparsile.frontend.layout.tile import LANE, WARP, register_coords, thread_bases
from sparsile.frontend.ops.tensor import box_offsets
from sparsile.target.targets import get_target
from sparsile.tests.backend.address_eval import UnknownInstruction, register_values

RUNS = 3
"""The runs of a pointer tile inside a loop that are checked: the first RUNS - 1 trips and the last."""
BASE = 1 << 40
"""The address of the first pointer parameter; the others follow, 2**36 bytes apart."""
TILE_OPS = ("tensor.load_tile", "tensor.store_tile")


@dataclass
class Checked:
    """What :func:`check_register_addresses` saw: the LLVM IR, how many pointer tiles it checked, how
    many it skipped (the evaluator cannot follow their offsets: a loop's ``phi``, a load; counted by
    instruction in ``reasons``), how many the interpreter did not reach (a branch not taken, a loop
    of no trips, a run stopped by ``errors``), the interpreter's errors (where tolerated) and its
    out-of-bounds accesses that were wrapped into their buffers (``wrapped``)."""

    llvm: str
    tiles: int
    skipped: int
    unreached: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    wrapped: list[str] = field(default_factory=list)
    boxes: int = 0
    """The ``load_tile`` / ``store_tile`` boxes checked (counted with ``tiles`` too)."""


def _thread_coords(layout: LinearLayout, num_threads: int) -> np.ndarray:
    """(num_threads, rank): each thread's base coordinates (XOR of its lane and warp bases)."""
    rank = len(layout.out_dims)
    out = np.zeros((num_threads, rank), np.int64)
    lane, warp = thread_bases(layout, LANE), thread_bases(layout, WARP)  # once, not per thread
    for t in range(num_threads):
        for src, bases in ((t % 32, lane), (t // 32, warp)):
            for b, basis in enumerate(bases):
                if src >> b & 1:
                    out[t] ^= np.array(basis, np.int64)
    return out


class _Recorder(Interpreter):
    """The interpreter, keeping each program's pointer tiles (by the addptr result's id)."""

    def __init__(self, *a: Any, lenient: bool = False, boxes_only: bool = False, **k: Any):
        super().__init__(*a, **k)
        self.seen: dict[tuple[tuple[int, ...], int], list[tuple[Any, dict[int, int]]]] = {}
        self.loop_args: dict[int, list[Any]] = {}
        self.lenient = lenient
        self.boxes_only = boxes_only
        self.wrapped: list[str] = []

    def _op(self, op: Any, env: dict[int, Any], ctx: Any) -> None:
        if op.name in TILE_OPS:
            tensor = env[id(op.operands[0])]
            offs = [int(env[id(v)]) for v in op.operand_group("offset")]
            runs = self.seen.setdefault((tuple(ctx.program_id), id(op)), [])
            scalars = {id(a): int(env[id(a)]) for a in self.loop_args.get(id(op), ())}
            runs[min(len(runs), RUNS - 1):] = [((tensor, offs), scalars)]
            if self.boxes_only:  # (tensors of made-up shapes and strides: the addresses, not the data)
                if op.name == "tensor.load_tile":
                    elem = T.element_type(op.result.type)
                    env[id(op.result)] = np.zeros(T.shape_of(op.result.type), elem.numpy_dtype)  # type: ignore[union-attr]
                return
        try:
            super()._op(op, env, ctx)
        except InterpreterError as e:
            ptr = env.get(id(op.operands[0])) if op.operands else None
            if not (self.lenient and e.code == OUT_OF_BOUNDS and isinstance(ptr, PtrVal)):
                raise
            # an access outside its buffer (of offsets made to wrap): wrapped into it, so that the
            # program goes on to its later pointer tiles (what it loads is then not the GPU's)
            self.wrapped.append(f"program {tuple(ctx.program_id)}: {str(e).splitlines()[0]}")
            size = max(1, ptr.buf.data.size)
            env[id(op.operands[0])] = PtrVal(ptr.buf, np.where((ptr.off < 0) | (ptr.off >= size),
                                                               ptr.off % size, ptr.off))
            try:
                super()._op(op, env, ctx)
            finally:
                env[id(op.operands[0])] = ptr
        if op.name == "addptr":
            runs = self.seen.setdefault((tuple(ctx.program_id), id(op.results[0])), [])
            scalars = {id(a): int(env[id(a)]) for a in self.loop_args.get(id(op), ())}
            run = (env[id(op.results[0])], scalars)
            runs[min(len(runs), RUNS - 1):] = [run]  # the first RUNS - 1 runs (loop trips) and the last

    def run_programs(self, pids: Sequence[tuple[int, int, int]], grid: tuple[int, int, int],
                     params: dict[str, Any], errors: list[str] | None) -> None:
        """Run the programs ``pids`` of ``grid`` (any ids, in this order); an interpreter error
        stops that program and is appended to ``errors`` where given, else raised."""
        for pid in pids:
            ctx = ProgramContext(pid, grid, {})
            ctx.warps = int(self.func.attrs.get("num_warps", 4))  # type: ignore[attr-defined]
            env: dict[int, Any] = {id(p.value): params[p.name] for p in self.func.runtime_params}
            try:
                self.exec_block(self.func.body.block, env, ctx)
            except InterpreterError as e:
                if errors is None:
                    raise
                errors.append(f"program {pid}: {str(e).splitlines()[0]}")


def _ops(block: Block, nested: bool, outer: tuple[Any, ...] = ()) -> Iterator[tuple[Operation, tuple[Any, ...]]]:
    """The ops of ``block`` and where ``nested`` those of the blocks of their regions, in order, each
    with the integer scalar arguments of the blocks around it (loop counters and carried scalars)."""
    for op in block.ops:
        yield op, outer
        if nested:
            for region in op.regions:
                args = tuple(a for a in region.block.args if isinstance(a.type, T.ScalarType) and a.type.is_int)
                yield from _ops(region.block, nested, outer + args)


def check_register_addresses(src: str, args: tuple, kwargs: dict[str, Any], num_warps: int | None = None,
                             programs: int = 2, target: str = "sm_90a", name: str = "k", *,
                             pids: Sequence[tuple[int, int, int]] | None = None,
                             grid: tuple[int, int, int] | None = None, nested: bool = False,
                             tolerate: bool = False, max_ops: int | None = None,
                             tensors: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None) -> Checked:
    """Compile kernel ``name`` of ``src`` for ``args``/``kwargs`` (specialized as a launch would be;
    ``num_warps``: the kernel's own where None, else 4), run the interpreter over programs
    0..``programs``-1 (or the program ids ``pids`` of ``grid``), and assert that every register of
    every pointer tile of the entry block (and where ``nested`` of the blocks inside loops and
    branches) is, for every thread, the interpreter's address at its coordinates. ``tolerate``:
    an out-of-bounds access (of arguments made to wrap) is wrapped into its buffer and counted, any
    other interpreter error stops only its program, and the tiles it did not reach are counted;
    ``max_ops`` bounds the interpreter's run. ``tensors``: (shape, strides) given to tensor parameters
    by name in place of their arrays' (any values, near the i32 wrap say: the interpreter then only
    computes the boxes' offsets, it reads and writes no data)."""
    kern = sp.loads(src, "case.spk").kernels[name]
    bound, bindings, _ = kern.bind(args, dict(kwargs))
    if num_warps is None:
        num_warps = int(kern.options.get("num_warps") or 4)
    func = kern.fresh_ir(bindings, {"num_warps": num_warps})
    tgt = get_target(target)
    boxes: list[tuple[LinearLayout, list[LLValue], list[LLValue]]] = []
    plain = memory.tile_addresses

    def recording(cg: Any, t: Any, offsets: list[LLValue], layout: LinearLayout) -> Any:
        ptrs, preds = plain(cg, t, offsets, layout)
        boxes.append((layout, ptrs, preds))
        return ptrs, preds

    memory.tile_addresses = recording  # (each box's registers, in the order the ops are lowered)
    try:
        llvm, cg = generate_llvm(func, tgt, num_warps, run_passes(func, tgt, num_warps))
    finally:
        memory.tile_addresses = plain
    params, _ = interpreter_params(func, bound)
    for name, (shape, strides) in (tensors or {}).items():
        params[name] = dataclasses.replace(params[name], shape=tuple(shape), strides=tuple(strides))
    if pids is None:
        pids = [(p, 0, 0) for p in range(programs)]
    if grid is None:
        grid = tuple(max(p[d] for p in pids) + 1 for d in range(3))  # type: ignore[assignment]
    rec = _Recorder(func, max_ops=max_ops, lenient=tolerate, boxes_only=bool(tensors))
    rec.loop_args = {id(op): list(args) for op, args in _ops(func.body.block, nested) if args}
    out = Checked(llvm, 0, 0)
    rec.run_programs(pids, grid, params, out.errors if tolerate else None)  # type: ignore[arg-type]
    out.wrapped = rec.wrapped
    ll_params: dict[str, int] = {}
    base_of: dict[int, int] = {}
    for i, p in enumerate(func.runtime_params):
        v = params[p.name]
        if isinstance(p.type, T.PointerType):
            ll_params[p.name] = base_of.setdefault(id(v.buf), BASE + (i << 36))
        elif isinstance(p.type, T.TensorType):
            ll_params[p.name] = base_of.setdefault(id(v.buf), BASE + (i << 36))
            for d in range(p.type.rank):
                ll_params[f"{p.name}_dim{d}"] = int(v.shape[d])
                ll_params[f"{p.name}_stride{d}"] = int(v.strides[d])
        elif isinstance(p.type, T.ScalarType) and p.type.is_int:
            ll_params[p.name] = int(v)
    nthreads = 32 * num_warps
    for op, outer in _ops(func.body.block, nested):
        if op.name != "addptr" or not isinstance(op.result.type, T.TileType):
            continue
        tile = cg.vals.get(id(op.result))
        if not isinstance(tile, DTile) or not all(isinstance(r, LLValue) for r in tile.regs):
            continue
        refs = {id(a): v.ref for a in outer if isinstance(v := cg.vals.get(id(a)), LLValue)}
        try:
            register_values(llvm, [r.ref for r in tile.regs], nthreads, 0, ll_params, dict.fromkeys(refs.values(), 0))
        except UnknownInstruction as e:  # (an offset through shared memory or a loop's phi: not evaluated)
            out.skipped += 1
            out.reasons[str(e).split(": ", 1)[-1].split(" ")[0]] += 1
            continue
        ran = [pid for pid in pids if (tuple(pid), id(op.result)) in rec.seen]
        if not ran:
            out.unreached += 1
            continue
        out.tiles += 1
        _compare(op, tile, llvm, ll_params, base_of, ran, rec, nthreads, refs)
    tile_ops = [(op, outer) for op, outer in _ops(func.body.block, True) if op.name in TILE_OPS]
    assert len(tile_ops) == len(boxes), f"{len(tile_ops)} load_tile / store_tile ops, {len(boxes)} boxes lowered"
    for (op, outer), (layout, ptrs, preds) in zip(tile_ops, boxes, strict=True):
        if not nested and outer:
            continue
        refs = {id(a): v.ref for a in outer if isinstance(v := cg.vals.get(id(a)), LLValue)}
        try:
            register_values(llvm, [r.ref for r in ptrs + preds], nthreads, 0, ll_params,
                            dict.fromkeys(refs.values(), 0))
        except UnknownInstruction as e:
            out.skipped += 1
            out.reasons[str(e).split(": ", 1)[-1].split(" ")[0]] += 1
            continue
        ran = [pid for pid in pids if (tuple(pid), id(op)) in rec.seen]
        if not ran:
            out.unreached += 1
            continue
        out.tiles += 1
        out.boxes += 1
        _compare_box(op, layout, ptrs, preds, llvm, ll_params, base_of, ran, rec, nthreads, refs)
    return out


def _compare_box(op: Operation, layout: LinearLayout, ptrs: list[LLValue], preds: list[LLValue], llvm: str,
                 ll_params: dict[str, int], base_of: dict[int, int], pids: Sequence[tuple[int, int, int]],
                 rec: _Recorder, nthreads: int, refs: dict[int, str]) -> None:
    """Assert that each register of a ``load_tile`` / ``store_tile`` box (its pointers ``ptrs`` and
    predicates ``preds`` in ``layout``) is, for every lane of each program of ``pids`` and each
    recorded run, in bounds exactly where the interpreter's element is, and there at its address."""
    coords = _thread_coords(layout, nthreads)
    regc = register_coords(layout)
    shape = tuple(T.shape_of(op.result.type if op.name == "tensor.load_tile" else op.operand("value").type))
    for pid in pids:
        for (tensor, offs), scalars in rec.seen[(tuple(pid), id(op))]:
            flat, inside = box_offsets(tensor, offs, shape)
            base = np.uint64(base_of[id(tensor.buf)])
            esize = np.uint64(tensor.buf.data.dtype.itemsize)
            known = {refs[a]: v for a, v in scalars.items() if a in refs}
            got = register_values(llvm, [r.ref for r in ptrs + preds], nthreads, pid, ll_params, known)
            for r, (ptr, pred) in enumerate(zip(ptrs, preds, strict=True)):
                at = tuple((coords ^ np.array(regc[r], np.int64)).T)
                want_in = inside[at]
                bad = np.nonzero((got[pred.ref] != 0) != want_in)[0]
                assert not len(bad), (
                    f"program {pid} {known or ''}, offsets {offs}, register {r} ({pred.ref}), threads {bad[:4]}: IR "
                    f"in bounds {(got[pred.ref][bad[:4]] != 0).tolist()}, interpreter {want_in[bad[:4]].tolist()}")
                want = base + esize * flat[at].astype(np.uint64)  # (mod 2**64)
                bad = np.nonzero(want_in & (got[ptr.ref] != want))[0]
                assert not len(bad), (
                    f"program {pid} {known or ''}, offsets {offs}, register {r} ({ptr.ref}), threads {bad[:4]}: IR "
                    f"addresses {[hex(int(x)) for x in got[ptr.ref][bad[:4]]]}, interpreter "
                    f"{[hex(int(x)) for x in want[bad[:4]]]}")


def _compare(op: Operation, tile: DTile, llvm: str, ll_params: dict[str, int], base_of: dict[int, int],
             pids: Sequence[tuple[int, int, int]], rec: _Recorder, nthreads: int, refs: dict[int, str]) -> None:
    """Assert that each register of ``tile`` (the LLVM values of ``op``'s pointer tile) is, for every
    thread of each program of ``pids`` and each recorded run (loop trip: the loops' scalars, named
    by ``refs``, set to that trip's), the interpreter's pointer at that register's coordinates."""
    esize = T.element_type(op.result.type).elem.bytes
    coords = _thread_coords(tile.layout, nthreads)
    regc = register_coords(tile.layout)
    for pid in pids:
        for ptr, scalars in rec.seen[(tuple(pid), id(op.result))]:
            _compare_run(tile, llvm, ll_params, base_of[id(ptr.buf)], esize, coords, regc, pid, ptr,
                         {refs[a]: v for a, v in scalars.items() if a in refs}, nthreads)


def _compare_run(tile: DTile, llvm: str, ll_params: dict[str, int], base: int, esize: int, coords: np.ndarray,
                 regc: list[tuple[int, ...]], pid: tuple[int, int, int], ptr: Any, known: dict[str, int],
                 nthreads: int) -> None:
    got = register_values(llvm, [r.ref for r in tile.regs], nthreads, pid, ll_params, known)
    for r, reg in enumerate(tile.regs):
        at = tuple((coords ^ np.array(regc[r], np.int64)).T)
        want = np.uint64(base) + np.uint64(esize) * ptr.off[at].astype(np.uint64)  # (mod 2**64)
        bad = np.nonzero(got[reg.ref] != want)[0]
        assert not len(bad), (
            f"program {pid} {known or ''}, register {r} ({reg.ref}), threads {bad[:4]}: IR addresses "
            f"{[hex(int(x)) for x in got[reg.ref][bad[:4]]]}, interpreter "
            f"{[hex(int(x)) for x in want[bad[:4]]]}")
