"""A grid with a 0 dimension (an empty batch: ``grid = (sp.cdiv(n, BLOCK),)`` with n = 0) in the
interpreter: the launch checks every argument and specializes the kernel as any launch does, then
runs no program (docs/language.md, "Specialization and launching"; SP0710 in docs/diagnostics.md
for the grids still refused). The GPU launch paths: tests/backend/test_empty_grid_launch.py (fake
driver) and tests/gpu/test_empty_grid_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError, LaunchError

SOURCE = """
@kernel
def add_one(x: ptr[f32], n: i32, BLOCK: constexpr = 16):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(x + offs, load(x + offs, mask=offs < n) + 1.0, mask=offs < n)

@kernel
def broken(x: ptr[f32], n: i32):
    store(x + arange(0, 16), load(x + arange(0, 16)) + undefined_name)
"""


def kernels() -> dict[str, sp.Kernel]:
    return sp.loads(SOURCE, "empty_grid.spk").kernels


def poisoned(n: int = 32) -> np.ndarray:
    return np.full(n, np.nan, np.float32)


@pytest.mark.parametrize("grid", [0, (0,), (0, 1), (4, 0), (2, 3, 0), [0, 0, 0],
                                  lambda meta: (sp.cdiv(0, meta["BLOCK"]),)])
def test_an_empty_grid_runs_no_program(grid: object) -> None:
    x = poisoned()
    kernels()["add_one"].interpret[grid](x, 32)
    assert np.isnan(x).all()  # nothing ran: the output is as poisoned as before


def test_the_next_launch_after_an_empty_one_is_correct() -> None:
    k = kernels()["add_one"]
    x = np.arange(32, dtype=np.float32)
    k.interpret[(0,)](x, 0)
    k.interpret[(sp.cdiv(32, 16),)](x, 32)
    np.testing.assert_array_equal(x, np.arange(32, dtype=np.float32) + 1)


@pytest.mark.parametrize(("args", "kwargs", "code"), [
    ((poisoned().astype(np.float64), 32), {}, "SP0703"),  # the wrong element type
    ((poisoned(),), {}, "SP0701"),  # a missing argument
    ((poisoned(), 32, 16, 1), {}, "SP0701"),  # one too many
    ((poisoned(), 32), {"nope": 1}, "SP0702"),  # an unknown keyword
    ((poisoned(), 2**40), {}, "SP0709"),  # out of range for i32
])
def test_an_empty_grid_still_checks_every_argument(args: tuple, kwargs: dict, code: str) -> None:
    with pytest.raises(LaunchError) as info:
        kernels()["add_one"].interpret[(0,)](*args, **kwargs)
    assert info.value.code == code


def test_an_empty_grid_still_compiles() -> None:
    """The launch specializes the kernel as any launch does: a kernel that does not compile is
    its compile error, not a silent no-op, and the specialization is cached for the next launch."""
    ks = kernels()
    with pytest.raises(CompileError) as info:
        ks["broken"].interpret[(0,)](poisoned(16), 16)
    assert "undefined_name" in str(info.value)
    k = ks["add_one"]
    x = poisoned()
    assert not k._ir_cache
    k.interpret[(0,)](x, 32)
    assert len(k._ir_cache) == 1  # specialized by the empty launch
    (func, _), = k._ir_cache.values()
    assert k.ir(x, 32) is func  # the next launch of these arguments reuses it


@pytest.mark.parametrize(("grid", "message"), [
    ((-1,), "a grid dimension cannot be negative, found (-1,)"),
    ((0, -1), "a grid dimension cannot be negative, found (0, -1)"),
    ((0.0,), "every grid dimension must be an integer, found 0.0 in (0.0,)"),
    ((0, 0, 0, 0), "the grid must have 1 to 3 dimensions, found 4"),
    ((0, 65536), "grid (0, 65536) has 65536 programs along y; CUDA allows at most 65535"),
])
def test_grids_still_refused_with_a_zero_dimension(grid: object, message: str) -> None:
    x = poisoned()
    with pytest.raises(LaunchError) as info:
        kernels()["add_one"].interpret[grid](x, 32)
    assert info.value.code == "SP0710" and str(info.value).splitlines()[0] == f"error[SP0710]: {message}"
    assert np.isnan(x).all()
