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


def test_the_gradient_idiom_for_a_whole_layer_runs() -> None:
    """The "Differentiation" section: ``jax.grad`` over a whole ``SparseLinear`` is JAX's own
    TypeError about the uint32 ``meta`` leaf (raised before any sparsile code runs; with
    ``allow_int=True`` it is SP0934), and the documented idiom (the bias and x as the arguments,
    put back with ``dataclasses.replace``) gives d bias and dx equal to float64 references."""
    import numpy as np

    spj = pytest.importorskip("sparsile.jax")
    jnp = jax.numpy
    rng = np.random.default_rng(7)
    layer = spj.SparseLinear.from_dense(rng.standard_normal((48, 96)), "bf16", bias=rng.standard_normal(48))
    x = jnp.asarray(rng.uniform(-1, 1, (5, 96)), jnp.float32)
    dy = jnp.asarray(rng.uniform(-1, 1, (5, 48)), jnp.float32)
    with pytest.raises(TypeError, match="but got uint32"):
        jax.grad(lambda layer: jnp.sum(layer(x) * dy))(layer)
    with pytest.raises(spj.JaxCallError) as info:
        jax.grad(lambda layer: jnp.sum(layer(x) * dy), allow_int=True)(layer)
    assert info.value.code == "SP0934"
    assert info.value.message.startswith("sparse_linear's weight is frozen: values has no gradient")

    (block,) = [b for b in blocks("python") if "dataclasses.replace(layer, bias=bias)" in b]
    env: dict = {"__name__": "jax_doc", "jax": jax, "jnp": jnp, "layer": layer, "x": x, "dy": dy}
    exec(compile(block, str(DOC), "exec"), env)
    d_bias, dx = env["d_bias"], env["dx"]
    assert d_bias.shape == (48,) and dx.shape == x.shape and dx.dtype == x.dtype
    w, g = layer.dense().astype(np.float64), np.asarray(dy, np.float64)
    eps = 2.0**-24
    assert (np.abs(np.asarray(d_bias, np.float64) - g.sum(axis=0)) <= 5 * eps * np.abs(g).sum(axis=0)).all()
    assert (np.abs(np.asarray(dx, np.float64) - g @ w) <= 48 * eps * (np.abs(g) @ np.abs(w))).all()
