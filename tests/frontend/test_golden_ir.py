"""Golden typed IR after layout inference (what ``frontend/ir_printer.py`` prints once
``backend/compiler.run_passes`` has inferred every layout and checked legality) of representative
kernels: an elementwise kernel, a reduction, the tile-level sparse GEMM (sparse_dot on sm_80) and
the explicit-level Hopper sparse GEMM (wgmma layouts, sm_90a). A change of an inferred layout
shows as a diff here; regenerate deliberately with
``SPARSILE_UPDATE_GOLDEN=1 python -m pytest tests/frontend/test_golden_ir.py``.

``stop_after="ir"`` compiles anew (never from the compile cache), and the IR is printed without
source locations, so the text holds no path."""

from __future__ import annotations

from typing import Any

import pytest

import sparsile as sp
from sparsile.tests.golden_ptx import check_golden
from sparsile.tests.support import ROOT, signature

# golden name -> (file, kernel, target, constexprs)
CASES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "vector_add": ("examples/vector_add.spk", "vector_add", "sm_90a", {}),
    "softmax": ("examples/softmax.spk", "softmax", "sm_90a", {"BLOCK": 128}),
    "sparse_gemm_tile": ("stdlib/kernels/sparse_gemm_tile.spk", "sparse_gemm_tile", "sm_80", {}),
    "sparse_gemm_sm90_f16": ("stdlib/kernels/sparse_gemm_sm90.spk", "sparse_gemm_f16", "sm_90a", {}),
}


def typed_ir(path: str, kernel: str, target: str, consts: dict[str, Any]) -> str:
    kern = sp.load(ROOT / path).kernels[kernel]
    return kern.compile(signature(kern, aligned=True, **consts), target=target, stop_after="ir").ir


@pytest.mark.parametrize("name", list(CASES))
def test_ir_after_layout_inference_matches_the_golden(name: str) -> None:
    path, kernel, target, consts = CASES[name]
    ir = typed_ir(path, kernel, target, consts)
    assert ir.startswith(f"kernel @{kernel}(") and "#L[" in ir  # typed, with inferred layouts
    assert str(ROOT) not in ir
    check_golden(ir, f"{name}.{target}.ir", what="IR after layout inference")


def test_ir_is_the_same_when_compiled_again() -> None:
    """Two compiles in one process print the same text (no ids, addresses or counters leak in)."""
    path, kernel, target, consts = CASES["sparse_gemm_tile"]
    assert typed_ir(path, kernel, target, consts) == typed_ir(path, kernel, target, consts)
