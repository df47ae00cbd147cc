"""Test helper: every register of every pointer tile a kernel forms (``addptr``), as the emitted LLVM IR
computes it for every thread of a program, against the interpreter's pointer at that register's
coordinates (address_eval.py evaluates the IR).

Unlike comparing the sorted addresses of the accesses, this sees an address given to the wrong
register (a permutation), and checks the pointer tiles of a chain ``(x + a) + b`` one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import sparsile as sp
from sparsile.backend.lower.codegen import DTile, generate_llvm
from sparsile.backend.lower.llvm_text import LLValue
from sparsile.driver.compiler import run_passes
from sparsile.frontend.interp.host_arrays import interpreter_params
from sparsile.frontend.interp.interpreter import Interpreter
from sparsile.frontend.ir import types as T
from sparsile.frontend.layout.layouts import LinearLayout
from sparsile.frontend.layout.tile import LANE, WARP, register_coords, thread_bases
from sparsile.target.targets import get_target
from sparsile.tests.backend.address_eval import UnknownInstruction, register_values

BASE = 1 << 40
"""The address of the first pointer parameter; the others follow, 2**36 bytes apart."""


@dataclass
class Checked:
    """What :func:`check_register_addresses` saw: the LLVM IR and how many pointer tiles it checked."""

    llvm: str
    tiles: int
    skipped: int


def _thread_coords(layout: LinearLayout, num_threads: int) -> np.ndarray:
    """(num_threads, rank): each thread's base coordinates (XOR of its lane and warp bases)."""
    rank = len(layout.out_dims)
    out = np.zeros((num_threads, rank), np.int64)
    for t in range(num_threads):
        for src, bases in ((t % 32, thread_bases(layout, LANE)), (t // 32, thread_bases(layout, WARP))):
            for b, basis in enumerate(bases):
                if src >> b & 1:
                    out[t] ^= np.array(basis, np.int64)
    return out


class _Recorder(Interpreter):
    """The interpreter, keeping each program's pointer tiles (by the addptr result's id)."""

    def __init__(self, *a: Any, **k: Any):
        super().__init__(*a, **k)
        self.seen: dict[tuple[int, int], Any] = {}

    def _op(self, op: Any, env: dict[int, Any], ctx: Any) -> None:
        super()._op(op, env, ctx)
        if op.name == "addptr":
            self.seen[(ctx.program_id[0], id(op.results[0]))] = env[id(op.results[0])]


def check_register_addresses(src: str, args: tuple, kwargs: dict[str, Any], num_warps: int = 4,
                             programs: int = 2, target: str = "sm_90a", name: str = "k") -> Checked:
    """Compile kernel ``name`` of ``src`` for ``args``/``kwargs`` (specialized as a launch would be),
    run the interpreter over ``programs`` programs, and assert that every register of every pointer
    tile of the entry block is, for every thread, the interpreter's address at its coordinates."""
    kern = sp.loads(src, "case.spk").kernels[name]
    bound, bindings, _ = kern.bind(args, dict(kwargs))
    func = kern.fresh_ir(bindings, {"num_warps": num_warps})
    tgt = get_target(target)
    llvm, cg = generate_llvm(func, tgt, num_warps, run_passes(func, tgt, num_warps))
    params, _ = interpreter_params(func, bound)
    rec = _Recorder(func)
    rec.run((programs, 1, 1), params)
    ll_params: dict[str, int] = {}
    base_of: dict[int, int] = {}
    for i, p in enumerate(func.runtime_params):
        v = params[p.name]
        if isinstance(p.type, T.PointerType):
            ll_params[p.name] = base_of.setdefault(id(v.buf), BASE + (i << 36))
        elif isinstance(p.type, T.ScalarType) and p.type.is_int:
            ll_params[p.name] = int(v)
    nthreads = 32 * num_warps
    tiles = skipped = 0
    for op in func.body.block.ops:
        if op.name != "addptr" or not isinstance(op.result.type, T.TileType):
            continue
        tile = cg.vals.get(id(op.result))
        if not isinstance(tile, DTile) or not all(isinstance(r, LLValue) for r in tile.regs):
            continue
        esize = T.element_type(op.result.type).elem.bytes
        coords = _thread_coords(tile.layout, nthreads)
        regc = register_coords(tile.layout)
        try:
            register_values(llvm, [r.ref for r in tile.regs], nthreads, 0, ll_params)
        except UnknownInstruction:  # (an offset through shared memory, say: not evaluated)
            skipped += 1
            continue
        tiles += 1
        for pid in range(programs):
            ptr = rec.seen[(pid, id(op.result))]
            base = base_of[id(ptr.buf)]
            got = register_values(llvm, [r.ref for r in tile.regs], nthreads, pid, ll_params)
            for r, reg in enumerate(tile.regs):
                at = tuple((coords ^ np.array(regc[r], np.int64)).T)
                want = np.uint64(base) + np.uint64(esize) * ptr.off[at].astype(np.uint64)  # (mod 2**64)
                bad = np.nonzero(got[reg.ref] != want)[0]
                assert not len(bad), (
                    f"program {pid}, register {r} ({reg.ref}), threads {bad[:4]}: IR addresses "
                    f"{[hex(int(x)) for x in got[reg.ref][bad[:4]]]}, interpreter "
                    f"{[hex(int(x)) for x in want[bad[:4]]]}")
    return Checked(llvm, tiles, skipped)
