"""A kernel called without its grid (``k(...)``, ``k.interpret(...)``, an autotuned kernel the same
way: a new user's first mistake) is SP0710 naming the spelling with a grid. Before, ``k(...)`` was a
RuntimeError without a code and the others Python's "'GridIndexer' object is not callable" /
"'Autotuner' object is not callable"."""

from __future__ import annotations

import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError

SOURCE = """
@kernel
def k(x: ptr[f32], n: i32, BLOCK: constexpr = 16):
    pass
"""


def kernels() -> tuple[object, object]:
    k = sp.loads(SOURCE, "case.spk").kernels["k"]
    return k, sp.autotune(configs=[sp.Config({"BLOCK": 16}), sp.Config({"BLOCK": 32})], key=["n"])(k)


@pytest.mark.parametrize(("which", "spelled", "message"), [
    ("kernel", "k(x, n)", "kernel `k` must be launched with a grid: `k[grid](...)`, or run on the CPU with "
                          "`k.interpret[grid](...)`"),
    ("kernel", "k.interpret(x, n)", "`k.interpret` runs the kernel for a grid: `k.interpret[grid](...)`"),
    ("autotuned", "k(x, n)", "kernel `k` must be launched with a grid: `k[grid](...)`, or run on the CPU with "
                             "`k.interpret[grid](...)`"),
    ("autotuned", "k.interpret(x, n)", "`k.interpret` runs the kernel for a grid: `k.interpret[grid](...)`"),
])
def test_a_kernel_called_without_a_grid_is_sp0710(which: str, spelled: str, message: str) -> None:
    kernel, tuned = kernels()
    k = kernel if which == "kernel" else tuned
    call = k if spelled.startswith("k(") else k.interpret
    with pytest.raises(LaunchError) as info:
        call(None, 4)
    assert (info.value.code, info.value.message) == ("SP0710", message)
    assert "e.g. (sp.cdiv(n, BLOCK),)" in (info.value.help or "")
    assert isinstance(info.value, RuntimeError)  # (what `k(...)` raised before: existing handlers still catch it)
