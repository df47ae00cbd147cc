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
