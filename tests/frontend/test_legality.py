"""The legality pass (frontend/legality/core.py, legality_memory.py): the per-target table, target
gating of explicit ops at the user's line, shared-memory / TMA / mbarrier / warp-specialization
rules, and the kernel's resource budgets.

Each error case is a small kernel with one mistake: the test asserts the code, the line and column
of the offending call, words of the message and that a help line is present. Each rule also has a
passing twin (the same kernel without the mistake compiles), so no rule can pass by rejecting
everything.
"""

from __future__ import annotations

import functools
import textwrap

import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError, Severity
from sparsile.frontend.legality import core as legality
from sparsile.frontend.legality.memory import smem_estimate, smem_footprint, tma_box
from sparsile.target.targets import TARGETS, Feature, get_target
from sparsile.tests import support

HEADER = "@kernel(num_warps={warps})\ndef k({params}):\n"
TMA_PARAMS = "A: tensor[f16, 2], C: ptr[f32]"


def kernel(body: str, params: str = TMA_PARAMS, warps: int = 4) -> str:
    """A kernel whose body starts on line 3, indented by 4 (a body column is 5 + its offset)."""
    lines = textwrap.dedent(body).strip("\n").split("\n")
    return HEADER.format(warps=warps, params=params) + "\n".join("    " + ln for ln in lines) + "\n"


compile_src = functools.partial(support.compile_src, stop_after="ir")  # the legality pass runs before "ir" ends


def first_error(src: str, target: str = "sm_90a", **consts):
    with pytest.raises(CompileError) as info:
        compile_src(src, target, **consts)
    errors = [d for d in info.value.diagnostics if d.severity is Severity.ERROR]
    assert errors
    return errors[0], info.value


def assert_error(src: str, code: str, line: int, col: int, words: str, target: str = "sm_90a", **consts) -> None:
    d, err = first_error(src, target, **consts)
    assert (d.code, d.span.line, d.span.col) == (code, line, col), err.render()
    assert words in d.message, d.message
    assert d.help, f"{code} has no help line"
    text = err.render()
    assert f"case.spk:{line}:{col}" in text and "Traceback" not in text


# ------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------
def test_codes_are_unique_and_in_the_legality_range() -> None:
    codes = list(legality.ALL_CODES)
    assert len(codes) == len(set(codes)) >= 18
    assert all(c.startswith("SP05") and 550 <= int(c[2:]) < 600 for c in codes)  # not the descriptor block


def test_rules_are_selected_per_target() -> None:
    hopper, blackwell, ampere = (legality.rules_for(t) for t in ("sm_90a", "sm_100a", "sm_80"))
    from sparsile.frontend.legality.mma import wgmma_operands
    from sparsile.frontend.legality.tmem import tcgen05_descriptors

    assert wgmma_operands in hopper.op_rules["hopper.wgmma"]
    assert wgmma_operands not in blackwell.op_rules.get("hopper.wgmma", ())
    assert tcgen05_descriptors in blackwell.op_rules["tcgen05.mma"]
    assert "tcgen05.mma" not in hopper.op_rules
    assert "smem.alloc" in ampere.op_rules  # target-independent rows apply everywhere
    # every explicit op with a hardware feature is gated, the same table for every target
    for name in ("hopper.wgmma", "tma.load", "tma.store", "mbarrier.expect", "fence.async_shared", "tcgen05.mma",
                 "tcgen05.commit", "tmem.alloc"):  # the last two by the prefixes `tcgen05.` and `tmem.`
        assert name in hopper.required
    assert legality.rules_for(get_target("sm_90a")) == hopper  # read from the OpDefs, a Target or its name


def test_every_gated_feature_exists_on_some_target() -> None:
    for feature, _ in legality.rules_for("sm_90a").required.values():
        assert any(t.has(feature) for t in TARGETS.values())


# ------------------------------------------------------------------------------------------------
# Target gating (SP0602 at the user's line)
# ------------------------------------------------------------------------------------------------
TMA_KERNEL = kernel("""
    buf = smem.alloc(f16, (64, 64), swizzle=128)
    bar = mbarrier.alloc(1)
    mbarrier.expect(bar[0], 64 * 64 * 2)
    tma.load(A, (0, 0), buf, bar[0])
    mbarrier.wait(bar[0], 0)
    x = buf.load()
""")


def test_tma_compiles_where_the_target_has_it() -> None:
    for t in ("sm_90a", "sm_100a"):
        assert "tma.load" in compile_src(TMA_KERNEL, t).ir


def test_tma_on_sm80_is_reported_at_each_call() -> None:
    with pytest.raises(CompileError) as info:
        compile_src(TMA_KERNEL, "sm_80")
    found = [(d.code, d.span.line, d.span.col) for d in info.value.diagnostics]
    assert found == [("SP0602", 5, 5), ("SP0602", 6, 5), ("SP0602", 7, 5)]
    assert "`tma.load` (TMA) is not available on sm_80" in info.value.render()
    assert "targets that have it: sm_90" in info.value.render()


def test_fence_gated_on_sm80() -> None:
    assert_error(kernel("fence.async_shared()"), "SP0602", 3, 5, "fence.async_shared", target="sm_80")
    compile_src(kernel("fence.async_shared()"), "sm_90a")


# ------------------------------------------------------------------------------------------------
# Shared memory
# ------------------------------------------------------------------------------------------------
def test_swizzled_rows_must_fill_atoms() -> None:
    bad = kernel("buf = smem.alloc(f16, (64, 96), swizzle=128)")
    assert_error(bad, "SP0560", 3, 11, "rows of 192 bytes do not fill whole 128-byte swizzle atoms")
    compile_src(kernel("buf = smem.alloc(f16, (64, 128), swizzle=128)"))
    compile_src(kernel("buf = smem.alloc(f16, (64, 96))"))


def test_slice_along_the_contiguous_dim_of_a_swizzled_buffer() -> None:
    bad = kernel("buf = smem.alloc(f16, (64, 64), swizzle=128)\nv = buf.slice(1, 0, 32)")
    assert_error(bad, "SP0561", 4, 9, "cannot slice smem<64x64xf16, swizzle=128> along its last")
    compile_src(kernel("buf = smem.alloc(f16, (64, 64), swizzle=128)\nv = buf.slice(0, 0, 32)"))


def test_an_unswizzled_buffer_slices_along_its_last_dim() -> None:
    """A strided view (the rows keep the buffer's pitch) that loads and stores take."""
    ok = kernel("""
        buf = smem.alloc(u32, (2, 64, 4))
        v = buf[1].slice(1, 2, 2)
        v.store(v.load() + 1)
    """)
    ir = compile_src(ok).ir
    assert "smem<64x2xu32, pitch=4>" in ir


STRIDED_TMA = kernel("""
    buf = smem.alloc(u32, (64, 8))
    bar = mbarrier.alloc(1)
    mbarrier.expect(bar[0], 64 * 4 * 4)
    tma.load(E, (0, 0), buf.slice(1, WHERE, 4), bar[0])
    mbarrier.wait(bar[0], 0)
""", params="E: tensor[u32, 2]")


def test_a_strided_view_is_no_tma_box() -> None:
    """A TMA box is written as whole rows: a view narrower than its buffer's rows is SP0576 (and a
    full-width slice is no strided view)."""
    src = STRIDED_TMA.replace("buf.slice(1, WHERE, 4)", "buf.slice(1, 4, 4)")
    assert_error(src, "SP0576", 6, 5, "operand `smem` is smem<64x4xu32, pitch=8>")
    compile_src(STRIDED_TMA.replace("buf.slice(1, WHERE, 4)", "buf.slice(1, 0, 8)"))
    compile_src(STRIDED_TMA.replace("buf.slice(1, WHERE, 4)", "buf.slice(0, 0, 64)"))


WS = """\
def work(bar):
    mbarrier.arrive(bar[0], per=PER)


def alloc_inside():
    bar = mbarrier.alloc(1)


@kernel(num_warps=WARPS)
def k(C: ptr[f32]):
    bar = mbarrier.alloc(1, 2)
    warp_specialize(partition(work, bar, warps=W0REGS), partition(BODY, warps=W1))
"""


def ws(per: str = '"partition"', warps: int = 8, w0: int = 4, w1: int = 4, r0: str = "None",
       body: str = "work, bar") -> str:
    regs = "" if r0 == "None" else f", regs={r0}"
    return (WS.replace("PER", per).replace("WARPS", str(warps)).replace("W0REGS", f"{w0}{regs}")
            .replace("W1", str(w1)).replace("BODY", body))


def test_warp_specialize_valid() -> None:
    compile_src(ws())
    compile_src(ws(per='"warpgroup"', r0="232"))


def test_partition_warps_must_add_up() -> None:
    assert_error(ws(warps=12), "SP0563", 12, 5, "4 + 4 = 8 warps but the kernel has num_warps=12")


def test_register_budget_needs_whole_warpgroups() -> None:
    assert_error(ws(warps=6, w0=2, r0="232"), "SP0565", 12, 5, "setmaxnreg applies to whole warpgroups")


def test_per_warpgroup_arrival_needs_whole_warpgroups() -> None:
    assert_error(ws(per='"warpgroup"', warps=6, w0=2), "SP0566", 2, 5, "this partition has 2 warps")


def test_barriers_are_allocated_outside_partitions() -> None:
    assert_error(ws(body="alloc_inside"), "SP0562", 6, 11, "outside warp_specialize")


def test_setmaxnreg_gated_and_budgeted() -> None:
    d, _ = first_error(ws(r0="232"), "sm_90")  # plain sm_90 has no setmaxnreg (docs/hardware.md §7)
    assert (d.code, d.span.line, d.span.col) == ("SP0602", 12, 5)
    two = 'partition(work, bar, warps=4, regs=240), partition(work, bar, warps=4, regs=240)'
    three = 'partition(work, bar, warps=4, regs=240), partition(work, bar, warps=4, regs=240), ' \
            'partition(work, bar, warps=4, regs=240)'
    src = ws(r0="240").replace("partition(work, bar, warps=4, regs=240), partition(work, bar, warps=4)", "PARTS")
    compile_src(src.replace("PARTS", two))  # 2 x 128 threads x 240 = 61440 <= 65536
    assert_error(src.replace("PARTS", three).replace("num_warps=8", "num_warps=12"), "SP0581", 12, 5,
                 "need 92160 registers")


# ------------------------------------------------------------------------------------------------
# TMA boxes
# ------------------------------------------------------------------------------------------------
def test_tma_box_of_a_swizzled_buffer_is_one_span_wide() -> None:
    from sparsile.frontend.ir import types as T

    assert tma_box(T.SmemType(T.f16, (128, 128), 128)) == ((128, 64), 2)
    assert tma_box(T.SmemType(T.f16, (4, 64, 32), 64)) == ((4, 64, 32), 1)
    assert tma_box(T.SmemType(T.f32, (8, 4), 0)) == ((8, 4), 1)


def test_tma_destination_must_start_128_byte_aligned() -> None:
    body = """
        buf = smem.alloc(f16, (64, 32))
        bar = mbarrier.alloc(1)
        mbarrier.expect(bar[0], 32 * 32 * 2)
        tma.load(A, (0, 0), buf.slice(0, ROW, 32), bar[0])
    """
    assert_error(kernel(body.replace("ROW", "1")), "SP0573", 6, 5, "this view starts 64 bytes into its buffer")
    compile_src(kernel(body.replace("ROW", "2")))  # row 2 of 64-byte rows: 128 bytes in


def test_tma_box_rules_on_synthetic_buffers() -> None:
    """The box rules in isolation (sema rejects most of these buffers before legality)."""
    from sparsile.frontend.ir import types as T
    from sparsile.frontend.ir.core import Builder, Function, Region
    from sparsile.frontend.legality.core import Context
    from sparsile.frontend.legality.memory import tma_box_limits

    func = Function("f", [], Region())
    b = Builder(func.body.block)
    ctx = Context(get_target("sm_90a"), 4, 4, -1, func)

    def problems(shape: tuple[int, ...], elem: T.ScalarType, swizzle: int) -> list[str]:
        t = b.create("tensor.param", [], [T.TensorType(elem, len(shape))]).result
        s = b.create("smem.alloc", [], [T.SmemType(elem, shape, swizzle)]).result
        op = b.create("tma.store", [t, s], [])
        return [d.message for d in tma_box_limits(op, ctx)]

    assert problems((64, 64), T.f16, 128) == []
    assert any("at most 256" in m for m in problems((512, 8), T.f16, 0))
    assert any("multiple of 16" in m for m in problems((64, 4), T.f16, 0))
    assert any("5 dimensions" in m for m in problems((2, 2, 2, 2, 2, 8), T.f32, 0))


# ------------------------------------------------------------------------------------------------
# Resources
# ------------------------------------------------------------------------------------------------
def test_shared_memory_capacity_per_target() -> None:
    body = "a = smem.alloc(f16, (STAGES, 128, 64), swizzle=128)\nb = smem.alloc(f16, (STAGES, 256, 64), swizzle=128)"
    ok = kernel(body.replace("STAGES", "4"))  # 64 KB + 128 KB = 192 KB < 227 KB
    compile_src(ok, "sm_90a")
    d, _ = first_error(ok, "sm_86")  # 99 KB opt-in
    assert d.code == "SP0572" and "196608 bytes" in d.message and "sm_86 allows 101376" in d.message
    assert (d.span.line, d.span.col) == (4, 9)  # the largest buffer
    assert any("buffer smem<4x256x64xf16" in n for n in d.notes)
    assert_error(kernel(body.replace("STAGES", "5")), "SP0572", 4, 9, "at least 245760 bytes", target="sm_100a")


def test_smem_estimate_is_exact_for_the_shipped_kernels() -> None:
    """A lower bound in general; for these kernels it equals what code generation reserves."""
    from pathlib import Path

    from sparsile.driver.compiler import compile_function
    from sparsile.driver.kernel import KERNEL_OPTIONS

    root = Path(__file__).resolve().parents[2]
    cases = [("stdlib/kernels/sparse_gemm_sm90.spk", "sparse_gemm_f16"),
             ("stdlib/kernels/dense_gemm_sm90.spk", "dense_gemm_bf16"),
             ("stdlib/kernels/sparse_gemm_tile.spk", "sparse_gemm_tile")]
    for path, name in cases:
        k = sp.load(root / path).kernels[name]
        sig = {p.name: p.annotation for p in k.params if p.annotation is not sp.constexpr}
        bindings, _ = k.signature_bindings(sig)
        opts = {**KERNEL_OPTIONS, **k.options}
        func = k.fresh_ir(bindings, opts)
        ck = compile_function(func, get_target("sm_90a"), num_warps=int(opts["num_warps"]), stop_after="llvm")
        assert smem_estimate(func) == ck.smem_bytes > 0, name


def test_scratch_of_conversions_and_reductions_is_a_lower_bound() -> None:
    src = kernel("""
        offs = arange(0, 64)
        x = load(C + offs[:, None] * 64 + offs[None, :])
        y = permute(x, (1, 0))
        s = sum(y, 0)
        store(C + offs, s)
    """, "C: ptr[f32]")
    from sparsile.driver.compiler import compile_function
    from sparsile.driver.kernel import KERNEL_OPTIONS

    k = sp.loads(src, "case.spk").kernels["k"]
    bindings, _ = k.signature_bindings({"C": k.params[0].annotation})
    opts = {**KERNEL_OPTIONS, **k.options}
    func = k.fresh_ir(bindings, opts)
    ck = compile_function(func, get_target("sm_90a"), num_warps=4, stop_after="llvm")
    assert 0 < smem_estimate(func) <= ck.smem_bytes
    assert {what for _, _, what in smem_footprint(func)} <= {"layout conversion through shared memory",
                                                             "cross-warp reduction"}


@pytest.mark.parametrize(("t", "per"), [("f32", 8), ("f16", 8), ("f64", 12)])
def test_scratch_of_an_argmax_across_warps_counts_the_value_and_the_index(t: str, per: int) -> None:
    """The cross-warp stage of argmax stores the value (compared in at least 32 bits) and the i32
    index of each warp's partial result: 8 warps, one output element."""
    src = kernel("""
        i = argmax(load(X + arange(0, 2048)), 0)
        store(Y, i)
    """, f"X: ptr[{t}], Y: ptr[i32]", warps=8)
    from sparsile.driver.compiler import compile_function
    from sparsile.driver.kernel import KERNEL_OPTIONS

    k = sp.loads(src, "case.spk").kernels["k"]
    bindings, _ = k.signature_bindings({p.name: p.annotation for p in k.params})
    opts = {**KERNEL_OPTIONS, **k.options}
    func = k.fresh_ir(bindings, opts)
    ck = compile_function(func, get_target("sm_90a"), num_warps=int(opts["num_warps"]), stop_after="llvm")
    assert [(what, n) for _, n, what in smem_footprint(func)] == [("cross-warp reduction", 8 * per)]
    assert smem_estimate(func) == ck.smem_bytes


def test_threads_per_cta() -> None:
    src = "@kernel(num_warps=40)\ndef k(C: ptr[f32]):\n    pass\n"
    d, _ = first_error(src)
    assert d.code == "SP0580" and "1280 threads" in d.message and d.span.line == 2


def test_the_pass_collects_errors_in_source_order() -> None:
    src = kernel("""
        a = smem.alloc(f16, (64, 96), swizzle=128)
        b = smem.alloc(f16, (64, 64), swizzle=128)
        v = b.slice(1, 0, 32)
    """)
    with pytest.raises(CompileError) as info:
        compile_src(src)
    assert [(d.code, d.span.line) for d in info.value.diagnostics] == [("SP0560", 3), ("SP0561", 5)]
    assert "aborting due to 2 previous errors" in info.value.render()


def test_a_crashing_rule_is_an_internal_error(monkeypatch) -> None:
    from sparsile.frontend.diagnostics import InternalError

    def broken(op, ctx):
        raise KeyError("boom")

    from sparsile.frontend.ops.opdefs import op_def

    monkeypatch.setattr(op_def("smem.alloc"), "legality", [legality.RuleEntry(broken)])
    with pytest.raises(InternalError, match="legality rule broken failed: KeyError"):
        compile_src(kernel("buf = smem.alloc(f16, (64, 64))"))


def test_features_used_by_rules_are_real() -> None:
    from sparsile.frontend.ops.opdefs import OPS

    legality.load_rule_modules()
    for d in OPS.values():
        for e in d.legality if isinstance(d.legality, list) else ():
            assert all(isinstance(f, Feature) for f in e.needs | e.unless)


def test_a_tma_box_into_matrices_that_are_not_consecutive() -> None:
    """A rank-3 box is written as consecutive matrices: a view whose rows were sliced (each matrix
    keeps its buffer's row count apart) is SP0576; a slice of the leading dimension is fine."""
    src = kernel("""
        buf = smem.alloc(f32, (2, 32, 16))
        bar = mbarrier.alloc(1)
        mbarrier.expect(bar[0], 2 * 16 * 16 * 4)
        tma.load(X, (0, 0, 0), VIEW, bar[0])
        mbarrier.wait(bar[0], 0)
    """, params="X: tensor[f32, 3]")
    assert_error(src.replace("VIEW", "buf.slice(1, 0, 16)"), "SP0576", 6, 5, "matrices are not consecutive")
    compile_src(src.replace("VIEW", "buf.slice(0, 0, 2)").replace("2 * 16 * 16 * 4", "2 * 32 * 16 * 4"))


def test_a_tma_box_into_a_constant_slice_of_a_1d_buffer_compiles() -> None:
    """The 128-byte start check of a slice of a 1-D buffer (it once raised an IndexError inside the
    legality pass)."""
    src = kernel("""
        buf = smem.alloc(f32, (256,))
        bar = mbarrier.alloc(1)
        mbarrier.expect(bar[0], 128 * 4)
        tma.load(X, (0,), buf.slice(0, START, 128), bar[0])
        mbarrier.wait(bar[0], 0)
    """, params="X: tensor[f32, 1]")
    compile_src(src.replace("START", "128"))
    assert_error(src.replace("START", "8"), "SP0573", 6, 5, "starts 32 bytes into its buffer")
