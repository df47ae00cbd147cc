"""The lowering of the atomics (backend/lower/memory.py): the PTX ``atom`` forms per op, type,
memory order and scope on every GPU generation, assembled by nvJitLink (and ptxas where installed);
and the guarantee that a tile whose layout repeats elements (broadcast register bases, lanes or
warps holding the same element) performs each atomic exactly once, checked by emulating the
lowering's choice of holder over random layouts."""

from __future__ import annotations

import re

import pytest
from hypothesis import given

from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptx_to_cubin, ptxas_available
from sparsile.backend.toolchain.llvm_to_ptx import llvm_ir_to_ptx
from sparsile.frontend.layout.layouts import LinearLayout
from sparsile.frontend.layout.tile import (
    LANE,
    REG,
    WARP,
    distinct_registers,
    register_coords,
    replicated_thread_bits,
    thread_bases,
)
from sparsile.target.targets import get_target
from sparsile.tests.backend.test_lower_reduce import layouts, point
from sparsile.tests.support import compile_src

TARGETS = ("sm_80", "sm_90a", "sm_100a")

ALL_FORMS = """
@kernel
def k(I: ptr[i32], U: ptr[u32], L: ptr[i64], Q: ptr[u64], F: ptr[f32], D: ptr[f64], H: ptr[f16],
      out: ptr[i32], BLOCK: constexpr):
    offs = arange(0, BLOCK)
    m = offs < 100
    a = atomic_add(I + offs, 3, mask=m)
    b = atomic_max(U + offs, 7, sem="relaxed", scope="cta")
    c = atomic_min(L + offs, 9, sem="acquire", scope="sys")
    d = atomic_add(Q + offs, 2, sem="release")
    e = atomic_add(F + offs, 1.5)
    f = atomic_add(D + offs, 2.5, scope="cta")
    g = atomic_xchg(F + offs, 4.0, mask=m)
    h = atomic_cas(L + offs, 1, 2)
    i = atomic_add(H + offs, 0.5)
    j = atomic_min(I + offs, 5)
    x = atomic_xchg(D + offs, 1.0)
    y = atomic_cas(I, 0, 1)
    store(out + offs, a + b.to(i32) + c.to(i32) + d.to(i32) + e.to(i32) + f.to(i32) + g.to(i32) + h.to(i32)
          + i.to(i32) + j + x.to(i32) + y)
"""

EXPECTED = [
    "atom.acq_rel.gpu.global.add.s32", "atom.relaxed.cta.global.max.u32", "atom.acquire.sys.global.min.s64",
    "atom.release.gpu.global.add.u64", "atom.acq_rel.gpu.global.add.f32", "atom.acq_rel.cta.global.add.f64",
    "atom.acq_rel.gpu.global.exch.b32", "atom.acq_rel.gpu.global.cas.b64", "atom.acq_rel.gpu.global.add.noftz.f16",
    "atom.acq_rel.gpu.global.min.s32", "atom.acq_rel.gpu.global.exch.b64", "atom.acq_rel.gpu.global.cas.b32",
]


@pytest.fixture(scope="module", params=TARGETS)
def all_forms(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, compile_src(ALL_FORMS, request.param, "ptx", BLOCK=128).ptx


def test_each_builtin_becomes_its_atom_instruction(all_forms: tuple[str, str]) -> None:
    _, ptx = all_forms
    for form in EXPECTED:
        assert re.search(re.escape(form) + r"\s", ptx), form
    # masked lanes: the old value starts at 0 and the atom is predicated
    assert re.search(r"mov\.b32 (%r\d+), 0; @%p\d+ atom\.acq_rel\.gpu\.global\.add\.s32 \1,", ptx)


def test_the_atomics_assemble_with_nvjitlink(all_forms: tuple[str, str]) -> None:
    target, ptx = all_forms
    assert ptx_to_cubin(ptx, get_target(target)).cubin


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
def test_the_atomics_assemble_with_ptxas(all_forms: tuple[str, str]) -> None:
    target, ptx = all_forms
    proc = assemble_with_ptxas(ptx, get_target(target))
    assert proc.returncode == 0, proc.stderr


def test_llvm_atomicrmw_would_drop_the_memory_order() -> None:
    """Why the lowering writes ``atom`` itself: LLVM 22's NVPTX backend turns an ``acq_rel``
    block-scope ``atomicrmw`` into a relaxed gpu-scope ``atom.global.add.u32``. Should this test
    fail, LLVM learned the orders and ``atomicrmw`` could replace the inline asm."""
    ir = """target triple = "nvptx64-nvidia-cuda"
define ptx_kernel void @k(ptr addrspace(1) %p, i32 %v) {
entry:
  %a = atomicrmw add ptr addrspace(1) %p, i32 %v syncscope("block") acq_rel
  ret void
}
"""
    ptx = llvm_ir_to_ptx(ir, get_target("sm_90a"))
    atom = [ln.split()[0] for ln in ptx.splitlines() if "atom." in ln]
    assert atom == ["atom.global.add.u32"]
    assert "fence" not in ptx


# ------------------------------------------------------------------------------------------------
# replicated layouts: each element once
# ------------------------------------------------------------------------------------------------
def _executions(layout: LinearLayout) -> dict[tuple[int, ...], int]:
    """How many (register, lane, warp) perform the atomic of each element, as the lowering picks
    them: the distinct registers, in the threads whose replicated lane/warp bits are zero."""
    lanes, warps = thread_bases(layout, LANE), thread_bases(layout, WARP)
    lane_mask, warp_mask = replicated_thread_bits(layout)
    offs = register_coords(layout)

    count: dict[tuple[int, ...], int] = {}
    for lane in range(1 << len(lanes)):
        for warp in range(1 << len(warps)):
            if lane & lane_mask or warp & warp_mask:
                continue
            base = point(layout, lane=lane, warp=warp)
            for r in distinct_registers(layout):
                e = tuple(p ^ q for p, q in zip(base, offs[r], strict=True))
                count[e] = count.get(e, 0) + 1
    return count


def _all_elements(shape: tuple[int, ...]) -> set[tuple[int, ...]]:
    return {(i, j) for i in range(shape[0]) for j in range(shape[1])}


@given(layouts())
def test_every_element_is_updated_exactly_once(case: tuple[LinearLayout, tuple[int, ...]]) -> None:
    layout, shape = case
    count = _executions(layout)
    assert set(count) == _all_elements(shape)
    assert set(count.values()) == {1}, (layout, count)


def test_broadcast_register_and_lane_bases_are_masked() -> None:
    """Registers 1 and 2 repeat register 0's and 3's elements; lanes 1 and 4 repeat elements (a
    zero basis, and a basis equal to a register's); warp 1 repeats warp 0 XOR lane 0."""
    layout = LinearLayout.from_bases(
        {REG: [(0, 0), (1, 0)], LANE: [(0, 1), (0, 0), (0, 2), (0, 4), (1, 0)], WARP: [(0, 8), (0, 9)]},
        [("dim0", 2), ("dim1", 16)])
    assert distinct_registers(layout) == [0, 2]
    assert replicated_thread_bits(layout) == (0b10010, 0b10)
    count = _executions(layout)
    assert set(count) == _all_elements((2, 16)) and set(count.values()) == {1}
    # without the masks each element would be updated 2 (registers) x 4 (lanes) x 2 (warps) times
    assert len(register_coords(layout)) * 32 * 4 == 16 * 32


REPLICATED = """
@kernel(num_warps=4)
def k(h: ptr[i32], out: ptr[i32]):
    offs = arange(0, 16)
    old = atomic_add(h + offs, 1)
    store(out + offs, old)
"""


def test_a_replicated_tile_is_predicated_on_its_holder_threads() -> None:
    """16 elements on 128 threads, 4 consecutive ones per thread (layout
    ``reg=1,2; lane=4,8,0,0,0; warp=0,0``): lanes 4-31 and warps 1-3 hold copies; only lanes 0-3
    of warp 0 run the atomics, and the others read the old values from shared memory."""
    llvm = compile_src(REPLICATED, "sm_90a", "llvm").llvm
    assert re.search(r"%rep\d+ = and i32 %lane\d+, 28\n", llvm)
    assert re.search(r"%rep\d+ = and i32 %warp\d+, 3\n", llvm)
    atoms = [ln for ln in llvm.splitlines() if "atom." in ln]
    assert len(atoms) == 4 and all("@$3 atom.acq_rel.gpu.global.add.s32" in a for a in atoms)
    assert "load i32, ptr addrspace(3)" in llvm  # the copies read the holder's old value


SCALAR = """
@kernel(num_warps=4)
def k(counter: ptr[i32], out: ptr[i32]):
    ticket = atomic_add(counter, 1)
    store(out + program_id(0), ticket)
"""


def test_a_scalar_atomic_runs_in_one_thread() -> None:
    llvm = compile_src(SCALAR, "sm_90a", "llvm").llvm
    atoms = [ln for ln in llvm.splitlines() if "atom." in ln]
    assert len(atoms) == 1 and "@$3 atom" in atoms[0]
    lead = re.search(r"(%lead\d+) = icmp eq i32 %sr\d+, 0", llvm)
    assert lead is not None and f"i1 {lead.group(1)})" in atoms[0]
    assert "load i32, ptr addrspace(3)" in llvm  # every thread gets the ticket
