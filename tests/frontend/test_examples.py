"""The examples (``examples/*.spk`` and their ``@jit`` twins ``examples/*.py``) run in the
interpreter and match float64 numpy references on random inputs whose sizes are not multiples of
the blocks."""

from __future__ import annotations

import importlib
import pathlib
from types import ModuleType

import numpy as np
import pytest

import sparsile as sp

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
RNG = np.random.default_rng(7)


def example_module(name: str) -> ModuleType:
    return importlib.import_module(f"sparsile.examples.{name}")


def rand(shape) -> np.ndarray:
    x = RNG.standard_normal(shape) * 3
    x[x == 0] = 1.0
    return x.astype(np.float32)


def softmax_ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# ------------------------------------------------------------------------------------ .spk files
@pytest.mark.parametrize(("n", "block"), [(1, 128), (1000, 256), (4097, 1024)])
def test_vector_add_spk(n: int, block: int) -> None:
    kernel = sp.load(EXAMPLES / "vector_add.spk").vector_add
    x, y = rand(n), rand(n)
    out = np.full(n, np.nan, np.float32)
    kernel.interpret[((n + block - 1) // block,)](x, y, out, n, BLOCK=block)
    assert np.array_equal(out, x + y)


@pytest.mark.parametrize(("rows", "cols", "rows_per_program"), [(1, 1, 1), (37, 50, 4), (9, 129, 2)])
def test_softmax_spk(rows: int, cols: int, rows_per_program: int) -> None:
    kernel = sp.load(EXAMPLES / "softmax.spk").softmax
    x = rand((rows, cols))
    out = np.full_like(x, np.nan)
    block = max(16, 1 << (cols - 1).bit_length())
    grid = ((rows + rows_per_program - 1) // rows_per_program,)
    kernel.interpret[grid](x, out, rows, cols, cols, BLOCK=block, ROWS=rows_per_program)
    np.testing.assert_allclose(out, softmax_ref(x), rtol=1e-6, atol=1e-7)


def test_softmax_spk_static_assert() -> None:
    kernel = sp.load(EXAMPLES / "softmax.spk").softmax
    x = rand((2, 3))
    with pytest.raises(sp.CompileError, match="BLOCK must be at least 16"):
        kernel.interpret[(1,)](x, np.zeros_like(x), 2, 3, 3, BLOCK=8)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (50, 70), (64, 32), (33, 97)])
def test_transpose_spk(m: int, n: int) -> None:
    kernel = sp.load(EXAMPLES / "transpose.spk").transpose
    x = rand((m, n))
    out = np.full((n, m), np.nan, np.float32)
    kernel.interpret[((m + 31) // 32, (n + 15) // 16)](x, out, m, n, n, m, BM=32, BN=16)
    assert np.array_equal(out, x.T)


# ------------------------------------------------------------------------------------ @jit twins
def test_vector_add_py() -> None:
    mod = example_module("vector_add")
    x, y = rand(3001), rand(3001)
    assert np.array_equal(mod.vector_add(x, y, block=512, gpu=False), x + y)


def test_softmax_py() -> None:
    mod = example_module("softmax")
    x = rand((19, 300))
    np.testing.assert_allclose(mod.softmax(x, rows_per_program=4, gpu=False), softmax_ref(x), rtol=1e-6, atol=1e-7)


def test_transpose_py() -> None:
    mod = example_module("transpose")
    x = rand((45, 70))
    assert np.array_equal(mod.transpose(x, 16, 32, gpu=False), x.T)


@pytest.mark.parametrize(("name", "argv"), [("vector_add", ["5000"]), ("softmax", ["10", "100"]),
                                            ("transpose", ["40", "30"])])
def test_example_main_reports_ok(name: str, argv: list[str], capsys) -> None:
    mod = example_module(name)
    assert mod.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(name) and out.rstrip().endswith("ok")


def test_spk_and_py_twins_build_the_same_ir() -> None:
    from sparsile.frontend.ir.printer import print_function

    x, y, out = rand(100), rand(100), np.zeros(100, np.float32)
    spk = sp.load(EXAMPLES / "vector_add.spk").vector_add.ir(x, y, out, 100, BLOCK=64)
    py = example_module("vector_add").vector_add_kernel.ir(x, y, out, 100, BLOCK=64)
    strip = lambda text: text.split("\n", 1)[1]  # noqa: E731  (the header names the kernel)
    assert strip(print_function(spk)) == strip(print_function(py))


@pytest.mark.parametrize(("name", "argv", "message"), [
    ("vector_add", ["abc"], "argument N: expected a positive integer, got 'abc'"),  # was int()'s traceback
    ("vector_add", ["0"], "argument N: expected a positive integer, got '0'"),
    ("softmax", ["0", "5"], "argument ROWS: expected a positive integer, got '0'"),  # numpy's traceback
    ("softmax", ["40"], "give both ROWS and COLS, or neither"),  # the 40 was ignored without a word
    ("softmax", ["4", "x"], "argument COLS: expected a positive integer, got 'x'"),
    ("transpose", ["7"], "give both M and N, or neither"),
    ("transpose", ["3", "4", "5"], "unrecognized arguments: 5"),
])
def test_example_main_refuses_bad_sizes(name: str, argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        example_module(name).main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err and not captured.out
