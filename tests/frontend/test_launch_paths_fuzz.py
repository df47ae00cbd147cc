"""Random programs (tests/support/program_gen.py) launched through every CPU launch path
(tests/support/launch_paths.py): ``kernel.interpret`` with positional arguments, keyword arguments
and numpy scalars, and ``sparsile.jax.call`` through the CPU FFI handler and ``interpret=True``.
Each path converts scalars, binds constexprs, normalizes the grid and writes outputs back its own
way; the outputs must agree bit for bit (NaN with NaN). The prepared launch (``kernel[grid].prepare``)
takes device memory only (SP0733) and so has no CPU path; the GPU test of program_gen covers
``kernel[grid]``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support import launch_paths as lp
from sparsile.tests.support.program_gen import generate

SEEDS = list(range(8))


@contextlib.contextmanager
def _x64() -> Iterator[None]:
    """jax_enable_x64 for the body (64-bit arrays stay 64-bit), where jax is installed."""
    try:
        import jax
    except ImportError:
        yield
        return
    enable = getattr(jax, "enable_x64", None)
    if enable is None:
        from jax.experimental import enable_x64 as enable
    with enable(True):
        yield


def _paths() -> dict[str, lp.Callable]:
    paths = {"keywords": lp.interpret_keywords, "numpy scalars": lp.interpret_numpy_scalars}
    try:
        import sparsile.jax  # noqa: F401
    except (ImportError, sp.SparsileError):
        return paths
    return {**paths, "jax ffi": lp.jax_call(False), "jax interpret": lp.jax_call(True)}


@pytest.mark.parametrize("seed", SEEDS)
def test_every_launch_path_computes_what_the_interpreter_does(seed: int) -> None:
    reports = []
    with _x64():
        for program in generate(seed).variants():
            args = lp.arguments(program, seed)
            want = lp.interpret_positional(program, args)
            for name, launch in _paths().items():
                diffs = lp.differences(launch(program, args), want)
                if diffs:
                    reports.append(f"{name}, K={program.consts.get('K')}: " + "; ".join(diffs))
    assert not reports, f"seed {seed}:\n" + "\n".join(reports) + "\n" + generate(seed).source


SUBNORMAL_SRC = """
@kernel
def k(X: ptr[f32], D: ptr[f64], O: ptr[f32], P: ptr[f64], s: f32, t: f64):
    offs = arange(0, 4)
    store(O + offs, load(X + offs) * 0.5 + s)
    store(P + offs, load(D + offs) + t)
"""


def _subnormal_case() -> tuple[object, dict[str, object], dict[str, np.ndarray]]:
    kernel = sp.loads(SUBNORMAL_SRC, "subnormal.spk").kernels["k"]
    args = {"X": np.array([2.0**-148, -(2.0**-140), 3.0, 2.0**-126], np.float32),
            "D": np.array([2.0**-1074, -(2.0**-1070), 1.0, 0.0]), "s": 2.0**-149, "t": 2.0**-1073}
    want = {"O": np.array([2.0**-149 * 2, -(2.0**-141) + 2.0**-149, 1.5 + 2.0**-149, 2.0**-127 + 2.0**-149],
                          np.float64).astype(np.float32),
            "P": np.array([3 * 2.0**-1074, -(2.0**-1070) + 2.0**-1073, 1.0, 2.0**-1073])}
    return kernel, args, want


@pytest.mark.parametrize("interpret", [False, True])
def test_jax_call_on_the_cpu_keeps_subnormals(interpret: bool) -> None:
    """XLA runs a CPU computation with flush-to-zero and denormals-are-zero set; the interpreter it
    called (the FFI handler, and ``pure_callback`` with ``interpret=True``) computed in that
    environment, so subnormal inputs, scalars and results were zeros there but not in
    ``kernel.interpret`` (the language keeps them: docs/language.md)."""
    jax = pytest.importorskip("jax")
    import sparsile.jax as spj

    kernel, args, want = _subnormal_case()
    with _x64():
        got = spj.call(kernel, (1,), **args, interpret=interpret,
                       out_shapes={"O": jax.ShapeDtypeStruct((4,), np.float32),
                                   "P": jax.ShapeDtypeStruct((4,), np.float64)})
        for name in want:
            assert np.asarray(got[name]).tobytes() == want[name].tobytes(), (name, np.asarray(got[name]), want[name])


def test_interpret_keeps_subnormals_under_torch_flush_denormal() -> None:
    """``torch.set_flush_denormal(True)`` sets FTZ / DAZ for the calling thread: ``kernel.interpret``
    computed in it and flushed subnormals."""
    torch = pytest.importorskip("torch")
    kernel, args, want = _subnormal_case()
    outs = {"O": np.full(4, np.nan, np.float32), "P": np.full(4, np.nan)}
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode torch can set")
    try:
        kernel.interpret[(1,)](**args, **outs)
        flushed = np.float32(2.0**-149) * np.float32(1.0)  # the caller's environment, kept after the launch
    finally:
        torch.set_flush_denormal(False)
    assert flushed == 0.0
    for name in want:
        assert outs[name].tobytes() == want[name].tobytes(), (name, outs[name], want[name])
