"""The typed state between the passes (issue 16): what a target's prepare hook hands to code
generation (``target.hooks.PreparedState``, returned by ``run_passes``) and what the lowerings of
one kernel leave for each other (``backend/lower/codegen_state.CodegenState``, ``CodeGen.state``).
"""

from __future__ import annotations

import dataclasses

import pytest

import sparsile as sp
from sparsile.backend.lower.codegen import generate_llvm
from sparsile.backend.lower.codegen_state import CodegenState
from sparsile.backend.lower.hooks import hooks_for
from sparsile.driver.compiler import run_passes
from sparsile.frontend.ir.core import Function
from sparsile.target.hooks import PreparedState
from sparsile.target.targets import get_target
from sparsile.tests.support.compile import signature

TMEM = """\
@kernel(num_warps=4)
def k():
    x = tmem.alloc(f32, (128, 100))
    y = tmem.alloc(u32, (128, 8), kind="meta", meta_dtype=f16)
    z = tmem.alloc(f32, (128, 16))
"""

CLUSTER = """\
@kernel(num_warps=16, cluster=(2, 1, 1))
def k():
    cluster.sync()
"""

PLAIN = """\
@kernel(num_warps=4)
def k(out: ptr[f32]):
    i = arange(0, 128)
    store(out + i, i.to(f32))
"""


def fresh(src: str) -> Function:
    """The sema IR of kernel ``k`` of ``src``, no pass run on it yet."""
    kern = sp.loads(src, "case.spk").kernels["k"]
    return kern.fresh_ir(signature(kern, aligned=True))


def init_ops(func: Function) -> list[int]:
    return [op.attrs["ncols"] for op in func.body.block.ops if op.name == "tmem.init"]


def test_tcgen05_prepare_hands_the_tmem_allocation_to_code_generation():
    """100 + 8 (at 100) + 16 (at 112) = 128 columns, a power of two >= 32: the hook inserts one
    ``tmem.init`` of 128 columns and hands the same count on; code generation keeps it as
    ``prepared`` and lowers ``tmem.init`` into ``state.tmem_base``."""
    tgt = get_target("sm_100a")
    func = fresh(TMEM)
    prepared = run_passes(func, tgt, 4)
    assert prepared == PreparedState(tmem_ncols=128)
    assert init_ops(func) == [128]
    _, cg = generate_llvm(func, tgt, 4, prepared)
    assert cg.prepared is prepared
    assert cg.state.tmem_base is not None and cg.state.tmem_base.type == "i32"


def test_tcgen05_prepare_twice_reports_the_existing_allocation():
    tgt = get_target("sm_100a")
    func = fresh(TMEM)
    prepare = hooks_for(tgt).prepare
    assert prepare is not None
    assert prepare(func, tgt, 4) == prepare(func, tgt, 4) == PreparedState(tmem_ncols=128)
    assert init_ops(func) == [128]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "sm_100a"])
def test_nothing_prepared_gives_the_defaults(target):
    """No prepare hook (sm_80, sm_90a), or a tcgen05 kernel without tensor memory: the defaults,
    and no ``tmem.init``."""
    tgt = get_target(target)
    func = fresh(PLAIN)
    prepared = run_passes(func, tgt, 4)
    assert prepared == PreparedState() and prepared.tmem_ncols == 0
    assert init_ops(func) == []
    _, cg = generate_llvm(func, tgt, 4)  # no prepared state given: the defaults too
    assert cg.prepared == PreparedState()
    assert cg.state.cluster is None and cg.state.tmem_base is None and cg.state.live_a == []


@pytest.mark.parametrize(("src", "warps", "cluster", "regs"), [(PLAIN, 4, None, 255), (CLUSTER, 16, (2, 1, 1), 128)])
def test_codegen_state_of_a_kernel(src, warps, cluster, regs):
    """``generate`` records the cluster shape (None without one) and the default register budget:
    64 Ki registers over the CTA's threads, at most 255 (4 warps: 512 -> 255; 16 warps: 128)."""
    tgt = get_target("sm_90a")
    func = fresh(src)
    _, cg = generate_llvm(func, tgt, warps, run_passes(func, tgt, warps))
    assert isinstance(cg.state, CodegenState)
    assert cg.state.cluster == cluster
    assert cg.state.default_regs == regs


def test_compile_function_reads_the_cluster_through_the_state():
    for src, cluster in ((CLUSTER, (2, 1, 1)), (PLAIN, (1, 1, 1))):
        kern = sp.loads(src, "case.spk").kernels["k"]
        assert kern.compile(signature(kern), target="sm_90a", stop_after="llvm").cluster == cluster


def test_prepared_state_is_frozen_and_every_field_has_a_default():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PreparedState().tmem_ncols = 1  # type: ignore[misc]
    for cls in (PreparedState, CodegenState):
        for f in dataclasses.fields(cls):
            assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, f.name
