"""``argmax`` / ``argmin`` compile for the GPU (backend/lower/reduce.py with the (value, index) fold
of backend/lower/reduce_fold.py) on every target that compiles ``max`` / ``min``: the PTX of each
case of tests/support/argmax_cases.py assembles with ptxas (when installed) for sm_80, sm_90a and
sm_100a, over element types, 1-D and 2-D tiles, both axes, all axes, ``keep_dims``, 1, 4 and 8 warps
and broadcast rows; fp8 from sm_89 (below it SP0577, as every fp8 reduction). Until this lowering
they were SP0622. Whether the GPU computes the interpreter's indices is tests/gpu/test_argmax_gpu.py.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.frontend.diagnostics import CompileError
from sparsile.target.targets import get_target
from sparsile.tests.support.argmax_cases import CASES, FP8_CASES, Case, inputs, reference, where_reduced

TARGETS = ("sm_80", "sm_90a", "sm_100a")


@functools.cache
def _compile(case: Case, target: str) -> object:
    """The case's kernel compiled for ``target`` (uncached by sparsile: the compile is what runs
    here), once per module: the register / lane / warp test reads the sm_90a cases' IR that the
    assembly test compiled."""
    return case.kernel().compile(case.consts(), target=target, stop_after="ptx", num_warps=case.num_warps,
                                 cache=False)


def _assembles(ptx: str, target: str) -> None:
    if ptxas_available():
        proc = assemble_with_ptxas(ptx, get_target(target))
        assert proc.returncode == 0, proc.stderr


# every case for sm_90a; every third (each element type, tile shape and broadcast row among them;
# 7 of the 8 axis x warps pairs) for sm_80 and sm_100a, which share the lowering: the whole product
# took 76 s of CI's time
TARGET_CASES = [(c, "sm_90a") for c in CASES] + [(c, t) for t in ("sm_80", "sm_100a") for c in CASES[::3]]


@pytest.mark.parametrize(("case", "target"), TARGET_CASES, ids=lambda v: v if isinstance(v, str) else v.id)
def test_argmax_compiles_and_assembles(case: Case, target: str) -> None:
    ck = _compile(case, target)
    assert ".entry" in ck.ptx  # type: ignore[attr-defined]
    _assembles(ck.ptx, target)  # type: ignore[attr-defined]


@pytest.mark.parametrize("target", ("sm_89", "sm_90a", "sm_100a"))
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: c.id)
def test_fp8_argmax_compiles_from_sm89(case: Case, target: str) -> None:
    ck = _compile(case, target)
    assert "cvt.rn.f16x2.e" in ck.ptx  # type: ignore[attr-defined]  # compared as the f32 values they encode
    _assembles(ck.ptx, target)  # type: ignore[attr-defined]


def test_fp8_argmax_below_sm89_is_sp0577() -> None:
    with pytest.raises(CompileError) as info:
        _compile(FP8_CASES[0], "sm_80")
    (d,) = info.value.diagnostics
    assert d.code == "SP0577" and d.message.startswith("the `argmax` reduction of e4m3 cannot be compiled for sm_80")


def test_the_cases_reduce_in_registers_lanes_and_warps() -> None:
    """The case table covers a reduced axis in registers only, one across lanes (shuffles) and one
    across warps (shared memory), on sm_90a."""
    seen = {frozenset(where_reduced(_compile(c, "sm_90a").ir))  # type: ignore[attr-defined]
            for c in CASES if c.dtype == "f32"}
    assert frozenset({"registers"}) in seen
    assert any("lanes" in s and "warps" not in s for s in seen)
    assert any("warps" in s for s in seen)


def test_argmax_uses_shuffles_and_shared_memory_for_value_and_index() -> None:
    """A row of 1024 over 8 warps (4 registers x 32 lanes x 8 warps): each of the five butterfly
    rounds shuffles the value and the index, and the cross-warp stage goes through shared memory."""
    ck = _compile(Case("f32", (4, 1024), 1, 8), "sm_90a")
    assert where_reduced(ck.ir) == {"registers", "lanes", "warps"}  # type: ignore[attr-defined]
    ptx = ck.ptx  # type: ignore[attr-defined]
    assert ptx.count("shfl.sync.bfly.b32") == 2 * 5
    assert "st.shared" in ptx and "bar.sync" in ptx
    assert "setp.nan.f32" in ptx  # the NaN rule


@pytest.mark.parametrize("case", CASES + FP8_CASES, ids=lambda c: c.id)
def test_the_cases_interpreter_results_are_numpys(case: Case) -> None:
    """The reference the GPU test compares with: the first extreme element (a NaN first of all)."""
    x = inputs(case, 0)
    tile = np.broadcast_to(x[None, :], case.shape) if case.broadcast else x
    fn = np.argmax if case.kind == "argmax" else np.argmin
    want = fn(tile) if case.axis is None else fn(tile, axis=case.axis)
    assert np.array_equal(reference(case, x), np.ravel(want).astype(np.int32))
