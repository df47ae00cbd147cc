"""docs/jax.md runs: its three seed kernels (seeds.spk) compile for sm_100a, and its JAX program,
which calls each from jax.jit and checks the numbers against float64, passes on the CPU (the
kernels run in the interpreter through the FFI handler)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")

import sparsile as sp  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "jax.md"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", DOC.read_text(), re.S | re.M)


def test_seed_kernels_compile_for_blackwell() -> None:
    (spk,) = blocks("spk")
    kernels = sp.loads(spk, "seeds.spk")
    counts = {name: getattr(kernels, name).compile(target="sm_100a").ptx.count("tcgen05.mma.sp.cta_group::1")
              for name in ("meta_roundtrip", "two_m_tiles", "acc_through_smem")}
    assert counts == {"meta_roundtrip": 0, "two_m_tiles": 8, "acc_through_smem": 4}


def test_the_jax_program_of_the_doc_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (spk,) = blocks("spk")
    program = next(b for b in blocks("python") if 'sp.load("seeds.spk")' in b)
    (tmp_path / "seeds.spk").write_text(spk)
    monkeypatch.chdir(tmp_path)
    env: dict = {"__name__": "jax_doc"}
    exec(compile(program, str(DOC), "exec"), env)  # its asserts check words, codes and both products
    assert env["c"].shape == (128, 64)


def test_the_api_example_runs() -> None:
    """The "API" block: ``call``'s signature as shown; the layer lines run (on the CPU: the
    interpreter through the FFI handler) and give (..., N_out) in x's dtype, jitted or not."""
    import inspect

    import numpy as np

    spj = pytest.importorskip("sparsile.jax")
    block = next(b for b in blocks("python") if "spj.SparseLinear.from_dense(w" in b)
    shown = re.search(r"y = spj\.call\((.*?)\)\n", block, re.S)
    assert shown is not None
    names = [p.strip().split("=")[0].lstrip("*") for p in shown.group(1).split(",")]
    assert names == list(inspect.signature(spj.call).parameters)
    program = block.replace(shown.group(0), "").replace("y = jax.jit(layer)(x)", "y_jit = jax.jit(layer)(x)")
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    x = jax.numpy.asarray(rng.standard_normal((2, 3, 64)), jax.numpy.bfloat16)
    env: dict = {"__name__": "jax_doc", "w": w, "b": b, "x": x}
    exec(compile(program, str(DOC), "exec"), env)
    y, y_jit, layer = env["y"], env["y_jit"], env["layer"]
    assert y.shape == (2, 3, 96) and y.dtype == x.dtype and bool((y == y_jit).all())
    ref = np.asarray(x, np.float64) @ np.asarray(layer.dense(), np.float64).T + b
    magnitude = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(layer.dense(), np.float64)).T + np.abs(b)
    assert (np.abs(np.asarray(y, np.float64) - ref) <= 2.0**-8 * magnitude + 1e-3).all()


def test_the_documented_sparse_linear_signature_is_the_code_s() -> None:
    import inspect

    spj = pytest.importorskip("sparsile.jax")
    shown = re.search(r"\*\*`sparse_linear\((.*?)\)`\*\*", DOC.read_text(), re.S)
    assert shown is not None
    parts = []
    for p in inspect.signature(spj.sparse_linear).parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    assert " ".join(shown.group(1).split()) == ", ".join(parts)


def test_the_quick_start_runs_on_the_cpu(tmp_path: Path) -> None:
    """The "Quick start" block runs as it is, as a script (``@sp.jit`` reads its source from the
    file); its own asserts check y against float64 and the call's output."""
    import runpy

    (block,) = [b for b in blocks("python") if "jax.grad(lambda x: layer(x)" in b]
    script = tmp_path / "quick_start.py"
    script.write_text(block)
    env = runpy.run_path(str(script))
    assert env["dx"].shape == (8, 512) and env["y"].shape == (8, 256)
