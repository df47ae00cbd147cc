"""Tests for backend/toolchain/llvm_to_ptx.py: PTX emission, error mapping, and the intrinsic gate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from sparsile.backend.toolchain import llvm_to_ptx as L
from sparsile.frontend.diagnostics import CompileError, InternalError
from sparsile.target.targets import TARGETS, Feature, get_target

VADD_IR = """
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
define ptx_kernel void @vadd(ptr addrspace(1) %a, ptr addrspace(1) %b, ptr addrspace(1) %c) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %t
  %pb = getelementptr float, ptr addrspace(1) %b, i32 %t
  %pc = getelementptr float, ptr addrspace(1) %c, i32 %t
  %x = load float, ptr addrspace(1) %pa
  %y = load float, ptr addrspace(1) %pb
  %s = fadd float %x, %y
  store float %s, ptr addrspace(1) %pc
  ret void
}
"""

_KERNEL_ARGS = ("ptr %p, ptr addrspace(3) %s, ptr addrspace(7) %c, ptr addrspace(1) %g, ptr addrspace(6) %t, "
                "i64 %a, i32 %i, <2 x half> %h")


def kernel(decl: str, body: str) -> str:
    """A one-kernel module calling an intrinsic (arguments: every address space we need)."""
    return f"{decl}\ndefine ptx_kernel void @k({_KERNEL_ARGS}) {{\n  {body}\n  ret void\n}}\n"


_MMA_SP_DECL = ("declare void @llvm.nvvm.tcgen05.mma.sp.shared(ptr addrspace(6), i64, i64, i32, i1, "
                "ptr addrspace(6), i32, i32, i32)")


def tcgen05_mma_sp(kind_code: int) -> str:
    return kernel(_MMA_SP_DECL, "call void @llvm.nvvm.tcgen05.mma.sp.shared(ptr addrspace(6) %t, i64 %a, "
                  f"i64 %a, i32 %i, i1 true, ptr addrspace(6) %t, i32 {kind_code}, i32 1, i32 0)")


def _block_scaled(name: str, sparse: bool) -> str:
    meta = "ptr addrspace(6), " if sparse else ""
    meta_arg = "ptr addrspace(6) %t, " if sparse else ""
    decl = (f"declare void @llvm.nvvm.tcgen05.mma.{name}(ptr addrspace(6), i64, i64, i32, i1, {meta}"
            "ptr addrspace(6), ptr addrspace(6), i32, i32)")
    body = (f"call void @llvm.nvvm.tcgen05.mma.{name}(ptr addrspace(6) %t, i64 %a, i64 %a, i32 %i, i1 true, "
            f"{meta_arg}ptr addrspace(6) %t, ptr addrspace(6) %t, i32 1, i32 0)")
    return kernel(decl, body)


_G2S_DECL = ("declare void @llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d(ptr addrspace(7), ptr addrspace(3), "
             "ptr, i32, i32, i16, i64, i1, i1, i32)")


def _g2s(cta_group: int) -> str:
    return kernel(_G2S_DECL, "call void @llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d(ptr addrspace(7) %c, "
                  "ptr addrspace(3) %s, ptr %p, i32 0, i32 0, i16 0, i64 0, i1 false, i1 false, "
                  f"i32 {cta_group})")


# One module per intrinsic family, with the features it needs (written out from §6/§7).
CASES: dict[str, tuple[str, frozenset[Feature]]] = {
    "mma_sp": (kernel(
        "declare {float,float,float,float} @llvm.nvvm.mma.sp.ordered.metadata.m16n8k32.row.col.f32.f32("
        + ",".join(["<2 x half>"] * 8) + ",float,float,float,float,i32,i32)",
        "%r = call {float,float,float,float} @llvm.nvvm.mma.sp.ordered.metadata.m16n8k32.row.col.f32.f32("
        + ",".join(["<2 x half> %h"] * 8) + ",float 0.0,float 0.0,float 0.0,float 0.0,i32 %i,i32 0)\n"
        "  %e = extractvalue {float,float,float,float} %r, 0\n  store float %e, ptr %p"),
        frozenset({Feature.MMA_SP})),
    "cp_async": (kernel(
        "declare void @llvm.nvvm.cp.async.ca.shared.global.16(ptr addrspace(3), ptr addrspace(1))",
        "call void @llvm.nvvm.cp.async.ca.shared.global.16(ptr addrspace(3) %s, ptr addrspace(1) %g)"),
        frozenset({Feature.CP_ASYNC})),
    "wgmma_fence": (kernel("declare void @llvm.nvvm.wgmma.fence.sync.aligned()",
                           "call void @llvm.nvvm.wgmma.fence.sync.aligned()"), frozenset({Feature.WGMMA})),
    "elect": (kernel("declare {i32, i1} @llvm.nvvm.elect.sync(i32)",
                     "%r = call {i32,i1} @llvm.nvvm.elect.sync(i32 -1)\n  %e = extractvalue {i32,i1} %r, 0\n"
                     "  store i32 %e, ptr %p"), frozenset({Feature.ELECT})),
    "setmaxnreg": (kernel("declare void @llvm.nvvm.setmaxnreg.inc.sync.aligned.u32(i32)",
                          "call void @llvm.nvvm.setmaxnreg.inc.sync.aligned.u32(i32 232)"),
                   frozenset({Feature.SETMAXNREG})),
    "mbarrier_init": (kernel("declare void @llvm.nvvm.mbarrier.init.shared(ptr addrspace(3), i32)",
                             "call void @llvm.nvvm.mbarrier.init.shared(ptr addrspace(3) %s, i32 1)"),
                      frozenset({Feature.MBARRIER})),
    "mbarrier_try_wait": (kernel(
        "declare i1 @llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta(ptr addrspace(3), i32)",
        "%r = call i1 @llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta(ptr addrspace(3) %s, i32 0)\n"
        "  %z = zext i1 %r to i32\n  store i32 %z, ptr %p"), frozenset({Feature.MBARRIER_TX})),
    "fence_proxy_async": (kernel("declare void @llvm.nvvm.fence.proxy.async.shared_cta()",
                                 "call void @llvm.nvvm.fence.proxy.async.shared_cta()"),
                          frozenset({Feature.FENCE_PROXY_ASYNC})),
    "cluster_barrier": (kernel("declare void @llvm.nvvm.barrier.cluster.arrive()",
                               "call void @llvm.nvvm.barrier.cluster.arrive()"),
                        frozenset({Feature.CLUSTER})),
    "cluster_sreg": (kernel(
        "declare i32 @llvm.nvvm.read.ptx.sreg.cluster.ctarank()",
        "%r = call i32 @llvm.nvvm.read.ptx.sreg.cluster.ctarank()\n  store i32 %r, ptr %p"),
        frozenset({Feature.CLUSTER})),
    "tma_load": (_g2s(0), frozenset({Feature.TMA})),
    "tma_load_cta_group": (_g2s(1), frozenset({Feature.TMA, Feature.TMA_CTA_GROUP})),
    "tcgen05_alloc": (kernel("declare void @llvm.nvvm.tcgen05.alloc.shared.cg1(ptr addrspace(3), i32)",
                             "call void @llvm.nvvm.tcgen05.alloc.shared.cg1(ptr addrspace(3) %s, i32 32)"),
                      frozenset({Feature.TCGEN05})),
    "tcgen05_mma_f16": (tcgen05_mma_sp(0), frozenset({Feature.TCGEN05})),
    "tcgen05_mma_f8f6f4": (tcgen05_mma_sp(2), frozenset({Feature.TCGEN05})),
    "tcgen05_mma_i8": (tcgen05_mma_sp(3), frozenset({Feature.TCGEN05, Feature.TCGEN05_I8})),
    "tcgen05_mma_scale_d": (kernel(
        "declare void @llvm.nvvm.tcgen05.mma.sp.shared.scale_d(ptr addrspace(6), i64, i64, i32, i1, "
        "ptr addrspace(6), i64, i32, i32, i32)",
        "call void @llvm.nvvm.tcgen05.mma.sp.shared.scale_d(ptr addrspace(6) %t, i64 %a, i64 %a, i32 %i, "
        "i1 true, ptr addrspace(6) %t, i64 3, i32 0, i32 1, i32 0)"),
        frozenset({Feature.TCGEN05, Feature.TCGEN05_SCALE_D})),
    "tcgen05_shift": (kernel("declare void @llvm.nvvm.tcgen05.shift.down.cg1(ptr addrspace(6))",
                             "call void @llvm.nvvm.tcgen05.shift.down.cg1(ptr addrspace(6) %t)"),
                      frozenset({Feature.TCGEN05, Feature.TCGEN05_SHIFT})),
    "tcgen05_mxf8f6f4": (_block_scaled("sp.shared.mxf8f6f4.block_scale.block32", True),
                         frozenset({Feature.TCGEN05, Feature.TCGEN05_MXF8F6F4})),
    "tcgen05_sparse_mxf4": (_block_scaled("sp.shared.mxf4.block_scale.block32", True),
                            frozenset({Feature.TCGEN05, Feature.TCGEN05_MXF4})),
    "tcgen05_sparse_mxf4nvf4": (_block_scaled("sp.shared.mxf4nvf4.block_scale.block16", True),
                                frozenset({Feature.TCGEN05, Feature.TCGEN05_MXF4})),
    "tcgen05_dense_mxf4": (_block_scaled("shared.mxf4.block_scale.block32", False),
                           frozenset({Feature.TCGEN05, Feature.TCGEN05_MXF8F6F4})),
}


# --------------------------------------------------------------------------------------------
# Plain emission and error mapping
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "version"), [("sm_80", "8.8"), ("sm_90a", "8.8"), ("sm_100a", "8.8"),
                                               ("sm_110a", "9.0"), ("sm_120a", "8.8")])
def test_vector_add_to_ptx(name, version):
    ptx = L.llvm_ir_to_ptx(VADD_IR, get_target(name))
    assert f".version {version}" in ptx
    assert f".target {name}" in ptx
    assert ".visible .entry vadd(" in ptx
    assert "add.rn.f32" in ptx
    assert "%tid.x" in ptx


def test_opt_level_zero_also_works():
    ptx = L.llvm_ir_to_ptx(VADD_IR, get_target("sm_90a"), opt_level=0)
    assert ".visible .entry vadd(" in ptx


def test_parse_error_is_internal_error_with_line():
    bad = VADD_IR.replace("fadd float %x, %y", "fadd float %x, %undefined_value")
    with pytest.raises(InternalError) as info:
        L.llvm_ir_to_ptx(bad, get_target("sm_90a"))
    text = str(info.value)
    assert "could not parse" in text and "%undefined_value" in text and "internal compiler error" in text


def test_verifier_failure_is_internal_error():
    wrong_signature = kernel("declare void @llvm.nvvm.wgmma.fence.sync.aligned(i32)",
                             "call void @llvm.nvvm.wgmma.fence.sync.aligned(i32 1)")
    with pytest.raises(InternalError, match="does not verify"):
        L.llvm_ir_to_ptx(wrong_signature, get_target("sm_90a"))
    out_of_range_kind = tcgen05_mma_sp(7)
    with pytest.raises(InternalError, match="out of range"):
        L.llvm_ir_to_ptx(out_of_range_kind, get_target("sm_100a"))


def test_unknown_nvvm_intrinsic_is_internal_error():
    ir = kernel("declare void @llvm.nvvm.no.such.thing()", "call void @llvm.nvvm.no.such.thing()")
    with pytest.raises(InternalError, match="does not know"):
        L.llvm_ir_to_ptx(ir, get_target("sm_90a"))


def test_wrong_triple_and_opt_level():
    with pytest.raises(InternalError, match="triple"):
        L.llvm_ir_to_ptx('target triple = "x86_64-unknown-linux-gnu"\n' + VADD_IR, get_target("sm_90a"))
    with pytest.raises(InternalError, match="opt_level"):
        L.llvm_ir_to_ptx(VADD_IR, get_target("sm_90a"), opt_level=5)


# --------------------------------------------------------------------------------------------
# Intrinsic -> feature mapping
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "immargs", "expected"), [
    ("llvm.nvvm.read.ptx.sreg.tid.x", (), set()),
    ("llvm.nvvm.barrier0", (), set()),
    ("llvm.fma.f32", (), set()),
    ("llvm.nvvm.tcgen05.mma.sp.shared", (0, 1, 0), {Feature.TCGEN05}),
    ("llvm.nvvm.tcgen05.mma.sp.shared", (3, 1, 0), {Feature.TCGEN05, Feature.TCGEN05_I8}),
    ("llvm.nvvm.tcgen05.mma.shared", (3, 2, 0), {Feature.TCGEN05, Feature.TCGEN05_I8}),
    ("llvm.nvvm.tcgen05.mma.sp.tensor", (3, 1, 0), {Feature.TCGEN05, Feature.TCGEN05_I8}),
    ("llvm.nvvm.tcgen05.mma.sp.shared.disable_output_lane.cg1", (3, 0),
     {Feature.TCGEN05, Feature.TCGEN05_I8}),
    # scale_d: the first immediate is the scale (3), the kind (0) comes second
    ("llvm.nvvm.tcgen05.mma.sp.shared.scale_d", (3, 0, 1, 0), {Feature.TCGEN05, Feature.TCGEN05_SCALE_D}),
    ("llvm.nvvm.tcgen05.mma.sp.shared.mxf4nvf4.block_scale.block16", (1, 0),
     {Feature.TCGEN05, Feature.TCGEN05_MXF4}),
    ("llvm.nvvm.tcgen05.mma.shared.mxf4nvf4.block_scale.block16", (1, 0),
     {Feature.TCGEN05, Feature.TCGEN05_MXF8F6F4}),
    ("llvm.nvvm.tcgen05.mma.sp.shared.mxf8f6f4.block_scale", (1, 0),
     {Feature.TCGEN05, Feature.TCGEN05_MXF8F6F4}),
    ("llvm.nvvm.tcgen05.mma.sp.shared.mxf8f6f4.block_scale.scale_vec.1x", (1, 0),
     {Feature.TCGEN05, Feature.TCGEN05_MXF8F6F4, Feature.TCGEN05_SCALE_VEC}),
    ("llvm.nvvm.tcgen05.shift.down.cg2", (), {Feature.TCGEN05, Feature.TCGEN05_SHIFT}),
    ("llvm.nvvm.tcgen05.ld.red.32x32b.x2", (), {Feature.TCGEN05, Feature.TCGEN05_LD_RED}),
    ("llvm.nvvm.tcgen05.ld.32x32b.x2", (), {Feature.TCGEN05}),
    ("llvm.nvvm.wgmma.wait_group.sync.aligned", (), {Feature.WGMMA}),
    ("llvm.nvvm.mma.sp.ordered.metadata.m16n8k32.row.col.f32.f32", (0,), {Feature.MMA_SP}),
    ("llvm.nvvm.mma.m16n8k16.row.col.f32.f32", (), set()),
    ("llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d", (0, 0, 0), {Feature.TMA}),
    ("llvm.nvvm.cp.async.bulk.tensor.g2s.tile.2d", (0, 0, 2), {Feature.TMA, Feature.TMA_CTA_GROUP}),
    ("llvm.nvvm.cp.async.bulk.tensor.g2s.cta.tile.2d", (1,), {Feature.TMA}),  # trailing flag is use_hint
    ("llvm.nvvm.cp.async.bulk.tensor.s2g.tile.2d", (1,), {Feature.TMA}),
    ("llvm.nvvm.cp.async.bulk.commit.group", (), {Feature.TMA}),
    ("llvm.nvvm.cp.async.commit.group", (), {Feature.CP_ASYNC}),
    ("llvm.nvvm.mbarrier.init.shared", (), {Feature.MBARRIER}),
    ("llvm.nvvm.mbarrier.arrive.expect.tx.scope.cta.space.cta", (), {Feature.MBARRIER_TX}),
    ("llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta", (), {Feature.MBARRIER_TX}),
    ("llvm.nvvm.fence.mbarrier_init.release.cluster", (), {Feature.CLUSTER}),
    ("llvm.nvvm.fence.proxy.async.shared_cta", (), {Feature.FENCE_PROXY_ASYNC}),
    ("llvm.nvvm.prefetch.tensormap.p0", (), {Feature.TMA}),
    ("llvm.nvvm.setmaxnreg.dec.sync.aligned.u32", (), {Feature.SETMAXNREG}),
    ("llvm.nvvm.elect.sync", (), {Feature.ELECT}),
    ("llvm.nvvm.mapa.shared.cluster", (), {Feature.CLUSTER}),
])
def test_intrinsic_features(name, immargs, expected):
    assert L.intrinsic_features(name, immargs) == frozenset(expected)


def test_check_intrinsic():
    name = "llvm.nvvm.tcgen05.mma.sp.shared"
    assert L.check_intrinsic(get_target("sm_100a"), name, (3, 1, 0)) is None
    assert L.check_intrinsic(get_target("sm_100f"), name, (0, 1, 0)) is None
    with pytest.raises(CompileError) as info:
        L.check_intrinsic(get_target("sm_100f"), name, (L.TCGEN05_MMA_KIND_CODES["i8"], 1, 0))
    diag = info.value.diagnostics[0]
    assert diag.code == "SP0603"
    assert diag.message.startswith("`tcgen05.mma` with kind::i8")
    assert diag.message.endswith("is not available on sm_100f")
    assert diag.help == "targets that have it: sm_100a, sm_110a"
    # base feature reported first when the whole family is missing
    with pytest.raises(CompileError) as info:
        L.check_intrinsic(get_target("sm_90a"), name, (3, 1, 0))
    assert "`tcgen05` (TMEM" in info.value.diagnostics[0].message


def test_nvvm_intrinsic_calls_reads_immediates():
    module = L.parse_module(tcgen05_mma_sp(0) + "\n" + kernel("", "").replace("@k(", "@k2(").replace(
        "ret void", "call void @llvm.nvvm.tcgen05.mma.sp.shared(ptr addrspace(6) %t, i64 %a, i64 %a, i32 %i, "
        "i1 false, ptr addrspace(6) %t, i32 3, i32 2, i32 1)\n  ret void"))
    calls = set(L.nvvm_intrinsic_calls(module))
    assert calls == {L.IntrinsicCall("llvm.nvvm.tcgen05.mma.sp.shared", (0, 1, 0)),
                     L.IntrinsicCall("llvm.nvvm.tcgen05.mma.sp.shared", (3, 2, 1))}


def test_gate_collects_every_missing_feature():
    ir = _g2s(1).replace("@k(", "@k1(") + tcgen05_mma_sp(3).replace(_MMA_SP_DECL, "")
    with pytest.raises(CompileError) as info:
        L.llvm_ir_to_ptx(ir, get_target("sm_90a"))
    assert info.value.codes == ["SP0603", "SP0603"]
    text = str(info.value)
    assert "TMA with `.cta_group::N`" in text and "`tcgen05`" in text


# --------------------------------------------------------------------------------------------
# The gate against LLVM itself, every case x every target, in one subprocess
# --------------------------------------------------------------------------------------------

_MATRIX_CHILD = textwrap.dedent("""
    import json, sys
    from sparsile.backend.toolchain.llvm_to_ptx import llvm_ir_to_ptx
    from sparsile.target.targets import TARGETS
    from sparsile.frontend.diagnostics import CompileError
    cases = json.load(sys.stdin)
    for case, ir in cases.items():
        for name, target in TARGETS.items():
            print("START", case, name, flush=True)
            try:
                ptx = llvm_ir_to_ptx(ir, target)
                outcome = "ptx" if ".entry k(" in ptx else "no-kernel"
            except CompileError as exc:
                outcome = ",".join(exc.codes)
            print("RESULT", case, name, outcome, flush=True)
""")


def test_gate_matches_table_and_llvm_never_aborts():
    """For each intrinsic family and each target: the gate refuses exactly when the table says
    a feature is missing, and LLVM emits PTX whenever the gate lets the module through (if the
    table were too generous, LLVM would abort the child process and the test would name the case)."""
    modules = json.dumps({case: ir for case, (ir, _) in CASES.items()})
    proc = subprocess.run([sys.executable, "-c", _MATRIX_CHILD], input=modules, capture_output=True,
                          text=True, timeout=300)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        last = [ln for ln in lines if ln.startswith("START")][-1]
        pytest.fail(f"LLVM aborted on {last}: {proc.stderr[-500:]}")
    results = {(p[1], p[2]): p[3] for p in (ln.split() for ln in lines) if p[0] == "RESULT"}
    assert len(results) == len(CASES) * len(TARGETS)
    for case, (_, needs) in CASES.items():
        for name, target in TARGETS.items():
            expected = "ptx" if needs <= target.features else "SP0603"
            assert results[(case, name)] == expected, (case, name)


def test_llvm_really_aborts_without_the_gate():
    """Why the gate exists: LLVM 22 kills the process on tcgen05 for sm_90a (§0 item 2)."""
    child = textwrap.dedent("""
        import sys, llvmlite.binding as llvm
        llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()
        module = llvm.parse_assembly(sys.stdin.read())
        nvptx = llvm.Target.from_triple("nvptx64-nvidia-cuda")
        tm = nvptx.create_target_machine(cpu="sm_90a", features="+ptx88")
        tm.emit_assembly(module)
        print("survived")
    """)
    proc = subprocess.run([sys.executable, "-c", child], input=tcgen05_mma_sp(0), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "survived" not in proc.stdout
    assert "LLVM ERROR" in proc.stderr


def test_gate_in_subprocess_gives_diagnostic_and_normal_exit():
    """The brief's check: a tcgen05 module compiled for sm_90a in a subprocess ends normally
    with an SP0603 diagnostic instead of an LLVM abort."""
    child = textwrap.dedent("""
        import sys
        from sparsile.backend.toolchain.llvm_to_ptx import llvm_ir_to_ptx
        from sparsile.target.targets import get_target
        from sparsile.frontend.diagnostics import CompileError
        try:
            llvm_ir_to_ptx(sys.stdin.read(), get_target("sm_90a"))
        except CompileError as exc:
            print(exc)
            sys.exit(3)
        print("compiled")
    """)
    proc = subprocess.run([sys.executable, "-c", child], input=tcgen05_mma_sp(0), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "error[SP0603]" in proc.stdout
    assert "not available on sm_90a" in proc.stdout
    assert "LLVM ERROR" not in proc.stderr


def test_tcgen05_positive_path_sm100a(tmp_path):
    ptx = L.llvm_ir_to_ptx(tcgen05_mma_sp(0), get_target("sm_100a"))
    assert "tcgen05.mma.sp.cta_group::1.kind::f16" in ptx
    assert ".target sm_100a" in ptx
    if shutil.which("ptxas"):
        src = tmp_path / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run(["ptxas", "-arch=sm_100a", str(src), "-o", str(tmp_path / "k.cubin")],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr


def _stdlib_kernel_llvm() -> dict[str, str]:
    """The LLVM IR of stdlib kernels whose TMA loads (``cp.async.bulk.tensor.g2s``) take immediates:
    the sparse GEMM (mt), the decode kernel, and a tcgen05 one (Blackwell)."""
    import numpy as np

    from sparsile.driver.compile_pool import Specialization
    from sparsile.driver.compiler import compile_function
    from sparsile.stdlib.kernels import plan_sparse_linear
    from sparsile.tests.stdlib.test_gemm_api import problem

    weight, b = problem("bf16", 256, 128, 256, seed=1)
    out = {}
    for name, x, target in (("tiled", b, "sm_90a"), ("decode", b[:4], "sm_90a"), ("sm100", b, "sm_100a")):
        plan = plan_sparse_linear(weight.values, weight.meta, np.ascontiguousarray(x), target=target)
        kernel, _, args, cx = plan.launches()[0]
        spec = Specialization.of_launch(kernel, args, cx)
        func = kernel.fresh_ir(spec.bindings, spec.options)
        out[name] = compile_function(func, get_target(target), num_warps=int(spec.options.get("num_warps") or 4),
                                     stop_after="llvm").llvm
    return out


def test_immediates_read_from_the_text_are_those_of_the_instructions():
    """The gate reads the immediate arguments of call sites from the IR text (the instruction walk
    took a tenth of a large kernel's compile); both ways give the same intrinsic list, for the
    matrix's modules and for real kernels, and a text that does not read as expected falls back to
    the walk."""
    modules = {case: ir for case, (ir, _) in CASES.items()} | _stdlib_kernel_llvm()
    with_immargs = 0
    for case, ir in modules.items():
        module = L.parse_module(ir)
        walked = L.nvvm_intrinsic_calls(module)
        assert L.nvvm_intrinsic_calls(module, ir) == walked, case
        with_immargs += any(call.immargs for call in walked)
    assert with_immargs >= 4
    by_immargs = {"llvm.nvvm.tcgen05.mma.sp.shared": [5]}
    assert L._immargs_in_text("call void @llvm.nvvm.tcgen05.mma.sp.shared(i32 %a, i32 %b)", by_immargs) is None
