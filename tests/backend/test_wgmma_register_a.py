"""``hopper.wgmma`` with A from registers (backend/lower/hopper.py, frontend/ops/hopper.py,
legality_mma.py): the kernels of tests/gpu/test_wgmma_register_a.py compile to the register-A
``wgmma.mma_async[.sp]`` form, ptxas accepts them without local memory, the SASS has the
HGMMA/QGMMA/IGMMA with a register A operand; the producer of A is put in the fragment layout
(no conversion); A's registers are kept live up to the wait; and the diagnostics of what is not
allowed (code, message, span)."""

from __future__ import annotations

import re

import pytest

import sparsile as sp
from sparsile.backend.toolchain.linker import assemble_with_ptxas, nvdisasm_path, nvdisasm_sass, ptxas_available
from sparsile.driver.compiler import compile_kernel
from sparsile.frontend.diagnostics import CompileError, Severity
from sparsile.target.targets import get_target
from sparsile.tests.support import wgmma_register_a as K

PTX_REG_A = re.compile(r"wgmma\.mma_async(\.sp)?\.sync\.aligned\.m64n(\d+)k(\d+)\.(\w+)\.(\w+)\.\w+ "
                       r"\{[^}]*\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+")
SASS_REG_A = re.compile(r"\b([HQI])GMMA(\.SP)?\.64x(\d+)x(\d+)\S* R\d+, R\d+, gdesc\[")
SASS_KIND = {"f16": "H", "bf16": "H", "tf32": "H", "e4m3": "Q", "i8": "I"}
INSTR_K = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "i8": 32}


def build(kern, stop_after: str = "cubin"):
    return compile_kernel(kern, {p.name: p.annotation for p in kern.params}, target="sm_90a", stop_after=stop_after)


def case_k(dt: str, sparse: bool) -> int:
    return 2 * INSTR_K[dt] * (2 if sparse else 1)  # two K steps


@pytest.mark.parametrize("dt", ["f16", "bf16", "e4m3", "i8"])  # tf32 A from registers: SP0397
@pytest.mark.parametrize("sparse", [False, True])
def test_register_a_form_ptx_ptxas_sass(dt: str, sparse: bool) -> None:
    k = case_k(dt, sparse)
    ck = build(K.kernel(dt, 64, 64, k, sparse, 4))
    found = PTX_REG_A.findall(ck.ptx)
    assert len(found) == 2, ck.ptx  # one instruction per K step
    sp_flag, n, ik, dtype_d, dtype_a = found[0]
    assert (bool(sp_flag), int(n), int(ik)) == (sparse, 64, INSTR_K[dt] * (2 if sparse else 1))
    assert dtype_a == {"i8": "s8"}.get(dt, dt) and dtype_d == ("s32" if dt == "i8" else "f32")
    # the register form has no A transpose immediate: f16/bf16 end with scale-a, scale-b, tB
    if dt in ("f16", "bf16"):
        assert re.search(r"p, 1, 1, 0; \}", ck.ptx)
    assert ck.ptx.index("wgmma.fence") < ck.ptx.index("wgmma.mma_async")
    if ptxas_available():
        r = assemble_with_ptxas(ck.ptx, get_target("sm_90a"), extra_args=("-v",))
        assert r.returncode == 0, r.stderr
        log = r.stdout + r.stderr
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
        assert "C7510" not in log and "serialized" not in log, log  # no wgmma serialization warning
    if nvdisasm_path() is not None:
        sass = nvdisasm_sass(ck.cubin)
        assert sass is not None
        mmas = SASS_REG_A.findall(sass)
        assert len(mmas) == 2, sass
        assert mmas[0][0] == SASS_KIND[dt] and bool(mmas[0][1]) == sparse
        assert not re.search(r"\b(LDL|STL)\b", sass)  # no local memory


@pytest.mark.parametrize("m,warps,n", [(128, 8, 64), (128, 4, 32), (256, 8, 64)])
def test_warpgroups_and_m64_blocks(m: int, warps: int, n: int) -> None:
    """Two warpgroups (each its own 64 rows), and two m64 blocks per warpgroup (R = 2)."""
    ck = build(K.kernel("f16", m, n, 32, True, warps), stop_after="ptx")
    per_wg = m // 64 // (warps // 4)
    assert len(PTX_REG_A.findall(ck.ptx)) == per_wg  # one K step
    if ptxas_available():
        assert assemble_with_ptxas(ck.ptx, get_target("sm_90a")).returncode == 0


def test_producer_lands_in_the_fragment_layout() -> None:
    """The load, scale and cast feeding A are laid out as the A fragment: no convert_layout."""
    for dt, sparse in (("f16", False), ("bf16", True), ("e4m3", False), ("i8", True)):
        ck = build(K.kernel(dt, 64, 64, case_k(dt, sparse), sparse, 4), stop_after="ir")
        assert "convert_layout" not in ck.ir, ck.ir


@pytest.mark.parametrize("dt,sparse", [("f16", False), ("bf16", True), ("e4m3", False), ("i8", True)])
def test_producer_in_another_layout_is_converted(dt: str, sparse: bool) -> None:
    """A producer pinned to a blocked layout: one conversion into the A fragment, then the
    register form (the kernel of the H200 test ``test_gpu_converted_producer``)."""
    k = (128 if sparse else 64) if dt in ("e4m3", "i8") else 64
    ck = build(K.kernel(dt, 128, 64, k, sparse, 8, True), stop_after="ptx")
    assert re.search(r"= convert_layout %\d+ : tile<128x\d+x[fi]32> #L\[reg=", ck.ir), ck.ir  # the inserted one
    assert len(PTX_REG_A.findall(ck.ptx)) == k // (INSTR_K[dt] * (2 if sparse else 1))
    if ptxas_available():
        r = assemble_with_ptxas(ck.ptx, get_target("sm_90a"), extra_args=("-v",))
        assert r.returncode == 0 and "0 bytes spill stores" in r.stdout + r.stderr


def test_a_registers_live_until_the_wait() -> None:
    """The packed A registers are operands of an empty asm placed after wgmma.wait_group."""
    ck = build(K.kernel("f16", 64, 64, 32, False, 4), stop_after="llvm")
    llvm = ck.llvm
    wait = llvm.index("wgmma.wait_group")
    keep = llvm.index('asm sideeffect "", "r,r,r,r,r,r,r,r"')
    assert wait < keep
    mma_line = next(ln for ln in llvm.splitlines() if "wgmma.mma_async" in ln)
    a_regs = re.findall(r"i32 (%\S+)", mma_line.split('"(')[1])[:4]
    keep_line = llvm[keep:].splitlines()[0]
    assert all(r.rstrip(",)") in keep_line for r in a_regs), (mma_line, keep_line)


def test_k_loop_kernels_compile() -> None:
    for dt, sparse, warps, m, bk in (("f16", False, 4, 64, 64), ("bf16", True, 4, 64, 64), ("f16", True, 8, 128, 64),
                                     ("e4m3", True, 4, 64, 128)):
        ck = build(K.loop_kernel(dt, m, 128, bk, sparse, warps), stop_after="ptx")
        assert PTX_REG_A.search(ck.ptx)
        if ptxas_available():
            r = assemble_with_ptxas(ck.ptx, get_target("sm_90a"), extra_args=("-v",))
            assert r.returncode == 0 and "0 bytes spill" in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------------
# What is not allowed
# ------------------------------------------------------------------------------------------------
BAD = """\
@kernel(num_warps=4)
def k(B: tensor[f16, 2], P: ptr[f16], C: ptr[f32]):
    b = smem.alloc(f16, (64, 64), swizzle=128)
    a = zeros((64, 64), {adt})
    acc = zeros((64, 64), f32)
{body}
    store(C + arange(0, 64)[:, None] * 64 + arange(0, 64)[None, :], acc)
"""


def first_error(body: str, adt: str = "f16") -> tuple[str, int, int, str, str | None]:
    kern = sp.loads(BAD.format(body=body, adt=adt), "case.spk").kernels["k"]
    with pytest.raises(CompileError) as info:
        build(kern, stop_after="ir")
    d = next(d for d in info.value.diagnostics if d.severity is Severity.ERROR)
    return d.code, d.span.line, d.span.col, d.message, d.help


def test_wait_with_pending_groups_after_register_a() -> None:
    code, line, col, msg, hlp = first_error("    acc = hopper.wgmma(a, b, acc)\n    acc = hopper.wgmma_wait(1, acc)")
    assert (code, line, col) == ("SP0395", 7, 29)
    assert "A in registers" in msg and hlp and "wgmma_wait(0, acc)" in hlp


def test_register_a_wgmma_waited_outside_its_block() -> None:
    body = "    for i in range(0, 2):\n        acc = hopper.wgmma(a, b, acc)\n    acc = hopper.wgmma_wait(0, acc)"
    code, line, col, msg, hlp = first_error(body)
    assert (code, line, col) == ("SP0396", 7, 15)
    assert "not passed to `hopper.wgmma_wait(0, ...)`" in msg and hlp


def test_register_a_result_used_before_the_wait() -> None:
    body = "    acc = hopper.wgmma(a, b, acc)\n    acc = acc + 1.0\n    acc = hopper.wgmma_wait(0, acc)"
    assert first_error(body)[:3] == ("SP0396", 6, 11)


def test_chained_register_a_wgmmas_then_one_wait_compile() -> None:
    body = "    acc = hopper.wgmma(a, b, acc)\n    acc = hopper.wgmma(a, b, acc)\n    acc = hopper.wgmma_wait(0, acc)"
    kern = sp.loads(BAD.format(body=body, adt="f16"), "case.spk").kernels["k"]
    ck = build(kern, stop_after="llvm")
    keep = re.search(r'asm sideeffect "", "(r(,r)*)"', ck.llvm)
    assert keep is not None and keep.group(1).count("r") == 32  # 2 wgmmas x 4 K steps x 4 registers


def test_b_from_registers_is_refused() -> None:
    code, line, col, msg, _ = first_error("    acc = hopper.wgmma(a, a, acc)\n    acc = hopper.wgmma_wait(0, acc)")
    assert (code, line, col) == ("SP0391", 6, 27) and msg.startswith("B of wgmma must be a 2-D shared-memory")


def test_a_tile_of_pointers_is_refused() -> None:
    body = "    pa = P + arange(0, 64)[:, None] * 64 + arange(0, 64)[None, :]\n" \
           "    acc = hopper.wgmma(pa, b, acc)\n    acc = hopper.wgmma_wait(0, acc)"
    code, line, col, msg, _ = first_error(body)
    assert (code, line, col) == ("SP0391", 7, 24) and "2-D tile of numbers" in msg


def test_a_and_b_types_must_agree() -> None:
    body = "    acc = hopper.wgmma(a, b, acc)\n    acc = hopper.wgmma_wait(0, acc)"
    code, _, _, msg, _ = first_error(body, adt="bf16")
    assert code == "SP0337" and "A is bf16 but B is f16" in msg


def test_a_kept_live_past_a_wait_that_may_leave_it_pending() -> None:
    """``wait_group 1`` after an older shared-memory group and a newer register-A group may leave
    the register-A group in flight: A stays live until the ``wait_group 0``."""
    body = ("    acc2 = hopper.wgmma(b, b, zeros((64, 64), f32))\n    acc = hopper.wgmma(a, b, acc)\n"
            "    acc2 = hopper.wgmma_wait(1, acc2)\n    acc = hopper.wgmma_wait(0, acc)\n    acc = acc + acc2")
    kern = sp.loads(BAD.format(body=body, adt="f16"), "case.spk").kernels["k"]
    llvm = build(kern, stop_after="llvm").llvm
    keep = llvm.index('asm sideeffect "", "r,')
    assert llvm.index("wgmma.wait_group.sync.aligned 1") < llvm.index("wgmma.wait_group.sync.aligned 0") < keep


def test_tf32_a_in_registers_is_refused() -> None:
    """SP0397: the H200 gave results off by ~2^-12 relative for tf32 register A (2026-11-30)."""
    code, line, col, msg, hlp = first_error("    acc = hopper.wgmma(a, b, acc)\n    acc = hopper.wgmma_wait(0, acc)",
                                            adt="tf32")
    assert (code, line, col) == ("SP0397", 6, 24)
    assert "tf32 A in registers is not supported" in msg and hlp and "shared memory" in hlp
