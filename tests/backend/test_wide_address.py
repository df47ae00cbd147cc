"""Large pointer tiles whose offsets axis analysis does not relate (backend/lower/wide_address.py).

``x + (s + arange(0, B))`` with s a run-time scalar (the i32 sum may wrap inside the tile) or
``x + (arange(0, B) * s) % n`` kept one ``getelementptr p, sext(off_r)`` per register, and the
thread's coordinates ``base | k`` as ``or disjoint``: LLVM's NVPTX straight-line strength reduction
compared each with every earlier one (``s + arange(0, B)``, f32, 4 warps, B = 64k / 128k / 256k:
2.7 / 11 / 106 s of code generation). Tiles of more than ``tile_address.LINEAR_ABOVE`` registers a
thread now get one inline-asm ``mad.wide`` per address and ``add nuw nsw`` coordinates from an
opaque copy of the thread's base.

The checks are structural, not timed: the IR that enters NVPTX code generation (after LLVM's O3
pipeline) holds no candidate of that pass per register (no ``getelementptr`` with a run-time index,
no ``or disjoint`` coordinate), and the semantic ones: every element address the emitted IR computes,
for every thread of two programs, is the interpreter's, wrapped i32 offsets included, for 32- and
64-bit offsets, pointer tiles plus offsets, and elements of 1, 2 and 4 bytes. Tiles of at most
LINEAR_ABOVE registers keep their IR (test_address_form.py checks it byte for byte).
"""

from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower import tile_address
from sparsile.target.targets import get_target
from sparsile.tests.backend.address_eval import element_addresses, global_accesses
from sparsile.tests.backend.address_fuzz import Tally, check_program

ACCESS = """
@kernel
def k(x: ptr[{t}], out: ptr[{t}], n: i32, s: i32, B: constexpr):
    offs = {expr}
    m = offs < n
    store(out + offs, load(x + offs, mask=m), mask=m)
"""

OFFSETS = """
@kernel
def offsets(o: ptr[i64], s: i32, n: i32, B: constexpr):
    offs = {expr}
    store(o + program_id(0) * B + arange(0, B), offs.to(i64))
"""

B = 65536  # 512 registers per thread on 4 warps
X_ADDR, OUT_ADDR = 1 << 40, 1 << 44
BYTES = {"f32": 4, "f16": 2, "i8": 1}


def _llvm(src: str, sig: dict, target: str = "sm_90a") -> str:
    kern = sp.loads(src, "case.spk").kernels["k"]
    return kern.compile(sig, target=target, stop_after="llvm", cache=False).llvm


def _sig(t: str, b: int = B) -> dict:
    ty = getattr(sp, t)
    return {"x": sp.ptr[ty], "out": sp.ptr[ty], "n": sp.i32, "s": sp.i32, "B": b}


def _optimized(ir: str, target: str = "sm_90a") -> str:
    """``ir`` after LLVM's O3 pipeline for ``target``: what NVPTX code generation (and its
    straight-line strength reduction) receives."""
    tgt = get_target(target)
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    module = llvm.parse_assembly(ir)
    tm = llvm.Target.from_triple(module.triple).create_target_machine(
        cpu=tgt.llvm_cpu, features=tgt.llvm_features, opt=3)
    module.data_layout = str(tm.target_data)
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = False
    builder = llvm.create_pass_builder(tm, tuning)
    builder.getModulePassManager().run(module, builder)
    return str(module)


@pytest.mark.parametrize("expr", ["s + arange(0, B)", "(arange(0, B) * s) % n"])
def test_a_large_unproven_tile_gives_the_strength_reduction_no_candidate_per_register(expr: str) -> None:
    """512 f32 registers per thread, offsets not proven: one ``mad.wide.s32`` per address (two
    pointers), no ``getelementptr`` with a run-time index and no ``or disjoint`` coordinate, in the
    emitted IR and after O3 (was: 1024 ``getelementptr``s, 511 ``or disjoint``s; the pass's time grows
    with their square)."""
    ir = _llvm(ACCESS.format(t="f32", expr=expr), _sig("f32"))
    assert len(re.findall(r'asm "mad\.wide\.s32 \$0, \$1, 4, \$2;"', ir)) == 2 * 512
    assert len(re.findall(r"= add nuw nsw i32 %\w+, \d+\n", ir)) == 511
    for text in (ir, _optimized(ir)):
        assert "getelementptr" not in text
        assert "or disjoint" not in text


def test_a_tile_at_the_threshold_keeps_its_form() -> None:
    """128 registers per thread (B = 16384): the per-register ``getelementptr`` form as before (without
    ``inbounds`` on its sign-extended i32 offsets: test_address_wrap.py)."""
    ir = _llvm(ACCESS.format(t="f32", expr="s + arange(0, B)"), _sig("f32", 16384))
    assert "mad.wide" not in ir and 'asm "mov.b32' not in ir
    assert len(re.findall(r"getelementptr float, ptr addrspace\(1\) %p_\w+, i64 %", ir)) == 2 * 128


def _interpreter_offsets(expr: str, s: int, n: int, programs: int = 2) -> np.ndarray:
    kern = sp.loads(OFFSETS.format(expr=expr), "case.spk").kernels["offsets"]
    o = np.full(programs * B, -7, np.int64)
    kern.interpret[(programs,)](o, s, n, B=B)
    return o.reshape(programs, B)


def _check(llvm_ir: str, expr: str, s: int, n: int, elem_bytes: int) -> None:
    """Per program: the elements the IR loads and stores are at x/out + elem_bytes * (the
    interpreter's offset), for the offsets below n, and nowhere else."""
    offs = _interpreter_offsets(expr, s, n)
    for pid in range(2):
        acc = global_accesses(llvm_ir, 128, pid, {"x": X_ADDR, "out": OUT_ADDR, "n": n, "s": s})
        want = offs[pid][offs[pid] < n]
        assert len(want) > 0
        for store, base in ((False, X_ADDR), (True, OUT_ADDR)):
            got = element_addresses(acc, store, elem_bytes)
            assert got == sorted(int(base + elem_bytes * o) for o in want)


@pytest.mark.parametrize("t", ["f32", "f16", "i8"])
@pytest.mark.parametrize("s, n", [
    (12345, 70000),                   # a tail
    ((1 << 31) - 100, (1 << 31) - 1),  # wraps to -2**31 inside the tile: every offset accessed
    (-(1 << 31) + 5, 0),              # negative offsets only
])
def test_large_tile_addresses_are_the_interpreters_wrapped_offsets(t: str, s: int, n: int) -> None:
    """``s + arange(0, B)``: each element's address is x + E * sext(the i32 offset), wrapped."""
    expr = "s + arange(0, B)"
    ir = _llvm(ACCESS.format(t=t, expr=expr), _sig(t))
    assert "mad.wide.s32" in ir
    _check(ir, expr, s, n, BYTES[t])


def test_large_tile_of_64_bit_offsets() -> None:
    """i64 offsets (``mad.lo.s64``): ``s * 3 + arange`` in 64 bits, past 2**32 and negative."""
    src = ACCESS.format(t="f16", expr="s.to(i64) * 3 + arange(0, B).to(i64)").replace(
        "m = offs < n", "m = offs < n.to(i64) * 8")
    ir = _llvm(src, _sig("f16"))
    assert "mad.lo.s64" in ir and "getelementptr" not in ir
    for s in ((1 << 31) - 7, -(1 << 31) + 3):
        n = (1 << 31) - 1
        acc = global_accesses(ir, 128, 0, {"x": X_ADDR, "out": OUT_ADDR, "n": n, "s": s})
        want = sorted(X_ADDR + 2 * (s * 3 + i) for i in range(B))
        assert element_addresses(acc, False, 2) == want


TILE_2D = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, s: i32, ld: i32, BM: constexpr, BN: constexpr):
    rows = arange(0, BM)
    cols = s + arange(0, BN)
    m = (rows[:, None] < n) & (cols[None, :] < n)
    a = load(x + rows[:, None] * ld + cols[None, :], mask=m)
    store(out + rows[:, None] * ld + cols[None, :], a, mask=m)
"""


@pytest.mark.parametrize("s", [0, (1 << 31) - 300])
def test_a_large_pointer_tile_plus_unproven_columns(s: int) -> None:
    """``x + rows * ld + cols`` (a pointer tile plus offsets, 64 x 1024: 512 registers a thread):
    the addresses are x + 4 * (sext(rows * ld) + sext(cols)) of the interpreter's i32 values."""
    sig = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "n": sp.i32, "s": sp.i32, "ld": sp.i32,
           "BM": 64, "BN": 1024}
    ir = _llvm(TILE_2D, sig)
    assert "getelementptr" not in ir and "mad.wide.s32" in ir
    ld, n = 1000, (1 << 31) - 1
    rows = np.arange(64, dtype=np.int64)[:, None] * ld
    cols = ((s + np.arange(1024, dtype=np.int64) + (1 << 31)) % (1 << 32) - (1 << 31))[None, :]
    on = np.broadcast_to(cols < n, (64, 1024)).ravel()
    want = sorted(int(X_ADDR + 4 * o) for o in (rows + cols).ravel()[on])
    acc = global_accesses(ir, 128, 0, {"x": X_ADDR, "out": OUT_ADDR, "n": n, "s": s, "ld": ld})
    assert element_addresses(acc, False, 4) == want


def test_the_threshold_is_the_box_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The opaque form follows ``tile_address.LINEAR_ABOVE`` (the address fuzzer lowers it to check
    small generated tiles in it): at 0, an 8-register tile takes it too."""
    monkeypatch.setattr(tile_address, "LINEAR_ABOVE", 0)
    ir = _llvm(ACCESS.format(t="f32", expr="s + arange(0, B)"), _sig("f32", 1024))
    assert len(re.findall(r"mad\.wide\.s32", ir)) == 2 * 8
    _check_small(ir)


def _check_small(ir: str) -> None:
    s, n = (1 << 31) - 600, (1 << 31) - 1
    for pid in range(2):
        acc = global_accesses(ir, 128, pid, {"x": X_ADDR, "out": OUT_ADDR, "n": n, "s": s})
        offs = (s + np.arange(1024, dtype=np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)
        assert element_addresses(acc, False, 4) == sorted(int(X_ADDR + 4 * o) for o in offs if o < n)


def test_generated_pointer_tiles_in_the_opaque_form() -> None:
    """Every register of every pointer tile of a few random kernels (tests/support/program_gen.py),
    with the opaque form forced on every tile (``linear_above=0``), for sm_90a and sm_80, under
    run-time values near the i32 wrap, is the interpreter's pointer (tests/backend/address_fuzz.py;
    a sweep: ``python -m sparsile.tests.backend.address_fuzz --gen plain --seeds A:B --linear-above 0``)."""
    tally = Tally()
    for seed in (0, 1, 2, 3, 4, 5):
        check_program("plain", seed, tally, linear_above=0)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.wide >= 10 and tally.tiles >= 60, tally.line()
    assert tile_address.LINEAR_ABOVE == 128  # (restored)
