"""The CPU-side parts of benchmarks/bench_jax.py: arguments, shapes, the profiler-event classifier."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparsile.tests.support import load_script


def _script():
    return load_script("benchmarks/bench_jax.py", "bench_script_bench_jax", register=True)


def test_arguments_and_shapes() -> None:
    b = _script()
    args = b.parse_args([])
    assert args.iters == 200 and not args.quick and b.shapes(args) == b.SHAPES
    assert b.shapes(b.parse_args(["--quick"])) == b.QUICK_SHAPES


def test_classify_events() -> None:
    b = _script()
    names = ["MemcpyDtoH", "Memcpy DtoH (Device -> Pinned)", "MemcpyHtoD", "sparse_linear_bf16",
             "splitk_reduce_linear", "sparse_gemm_bf16", "loop_convert_fusion", "Memset", "sparsile_call.1",
             "end: sparsile_call.1"]
    kernels = ["sparse_linear_bf16", "splitk_reduce_linear"]
    assert b.classify_events(names, kernels) == {"dtoh": 2, "htod": 1, "sparsile_kernels": 2, "ffi_calls": 1}
    assert b.classify_events(names, []) == {"dtoh": 2, "htod": 1, "sparsile_kernels": 0, "ffi_calls": 1}
    assert b.sparse_names([*names, "sparse_linear_bf16"]) == ["sparse_gemm_bf16", "sparse_linear_bf16"]


def test_profile_check_on_the_cpu(tmp_path: Path) -> None:
    """The profiler part end to end on the CPU backend (the FFI handler runs the interpreter)."""
    jax = pytest.importorskip("jax")
    if getattr(jax.profiler, "ProfileData", None) is None:  # jax 0.6.2 has it, as None
        pytest.skip(f"jax {jax.__version__} cannot read a profile back (no jax.profiler.ProfileData)")
    counts = _script().profile_check(8, 64, 64, str(tmp_path))
    assert counts["ffi_calls"] >= 10 and counts["dtoh"] == 0


@pytest.mark.parametrize("absent", ["missing", "None"])
def test_profile_check_without_profile_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, absent: str) -> None:
    """A jax whose profiler cannot read its traces back (no jax.profiler.ProfileData: jax 0.4.36 to
    0.5.3; ProfileData = None: jax 0.6.2) gave an AttributeError; the counts are now -1, "not
    measured", as without a trace."""
    jax = pytest.importorskip("jax")
    if absent == "missing":
        monkeypatch.delattr(jax.profiler, "ProfileData", raising=False)
    else:
        monkeypatch.setattr(jax.profiler, "ProfileData", None, raising=False)
    counts = _script().profile_check(8, 64, 64, str(tmp_path))
    assert {k: counts[k] for k in ("dtoh", "htod", "sparsile_kernels", "ffi_calls")} == dict.fromkeys(
        ("dtoh", "htod", "sparsile_kernels", "ffi_calls"), -1)
    assert counts["sparse_names"] == []
