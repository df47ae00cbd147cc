"""A grid function gets a dict of the call's arguments (docs/language.md, "Specialization and
launching": ``lambda meta: (sp.cdiv(meta["n"], meta["BLOCK"]),)``), run-time ones included, as in
the interpreter, on ``kernel[grid]``'s full path, its fast path (``n`` of this call, not the one
that filed the entry) and ``prepare``. The GPU paths gave it the constexprs only: ``meta["n"]`` was
a KeyError. On the fake device of test_prepared.py."""

from __future__ import annotations

import gc
import struct
import weakref
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.backend.test_prepared import arrays, vadd
from sparsile.tests.backend.test_prepared import gpu as gpu  # (the fake device, a fixture)
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # (a fixture: autouse)


def grid(meta: dict[str, Any]) -> tuple[int]:
    return (sp.cdiv(meta["n"], meta["BLOCK"]),)


def test_a_grid_function_reads_run_time_arguments(gpu: Any) -> None:
    x, y, out = arrays(n=4096)
    k = vadd()
    k[grid](x, y, out, 1000, BLOCK=256)  # the full path
    k[grid](x, y, out, 3000, BLOCK=256)  # the fast path: this call's n
    k[grid](x, y, out, 300, BLOCK=128)
    k.__dict__.pop("_fast_launches")
    k[grid](x, y, out, n=520, BLOCK=256)  # n by keyword: the full path
    vadd()[grid].prepare(x, y, out, 2000, BLOCK=512)(x, y, out, 2000)
    assert [r["grid"] for r in gpu.launches] == [(4, 1, 1), (12, 1, 1), (3, 1, 1), (3, 1, 1), (4, 1, 1)]


def test_the_interpreter_gives_the_same_arguments() -> None:
    x, y = np.ones(1000, np.float32), np.full(1000, 2.0, np.float32)
    out = np.full(1000, np.nan, np.float32)
    vadd().interpret[grid](x, y, out, 1000, BLOCK=256)
    np.testing.assert_array_equal(out, x + y)


@pytest.mark.parametrize("launch_grid", [grid, (4,)], ids=["grid function", "tuple"])
def test_the_fast_path_keeps_no_array_of_the_call_that_filed_it(gpu: Any, launch_grid: Any) -> None:
    """The fast entry gives a grid function this call's arguments; it kept the call that filed it
    as well (its arrays: the first x, y and out of every fingerprint alive, GPU memory held for as
    long as the kernel)."""
    k = vadd()
    x, y, out = arrays()
    k[launch_grid](x, y, out, 1024, BLOCK=256)  # the full path: files the fast entry
    assert k.__dict__["_fast_launches"].entries
    held = [weakref.ref(a) for a in (x, y, out)]
    del x, y, out
    gc.collect()
    assert [r() for r in held] == [None] * 3
    x, y, out = arrays(base=0x7E00_0000_0000)
    k[launch_grid](x, y, out, 1024, BLOCK=256)  # the fast path, this call's arrays
    assert gpu.launches[-1]["params"][0] == struct.pack("<Q", x.data_ptr())
