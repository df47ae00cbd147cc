"""A DLPack producer that exports a copy (DLPack 1.0's IS_COPIED flag: a producer may copy where it
cannot export its own memory) at ``kernel[grid](...)`` and ``kernel.interpret[grid](...)``.

Read, the copy holds the producer's values: both paths read it. Written, the results would land in
the copy and never reach the producer's object: both paths wrote the copy and returned with the
object unchanged, silently (the interpreter through ``np.from_dlpack``, which ignores the flag; the
GPU path staged the copy by value and wrote the results back into it). A write is now SP0719 on
both paths, in the same words.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)


class CopyingExport:
    """A DLPack producer that hands out a copy of its memory, flagged IS_COPIED (numpy's own export with
    ``copy=True``): the pattern of a library whose storage cannot be viewed (compressed, lazily computed,
    on another device)."""

    def __init__(self, array: np.ndarray):
        self.array, self.dtype, self.shape = array, array.dtype, array.shape

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        return self.array.__dlpack__(max_version=max_version or (1, 0), copy=True)

    def __dlpack_device__(self) -> Any:
        return self.array.__dlpack_device__()


def _data(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-100, 100, N).astype(np.float32)


def _paths() -> list[Any]:
    k = vadd()
    return [k, k.interpret]


def test_the_reader_sees_the_copied_flag() -> None:
    from sparsile.frontend import dlpack

    a = np.arange(4, dtype=np.float32)
    assert dlpack.read_capsule(a.__dlpack__(max_version=(1, 0), copy=True)).copied
    assert not dlpack.read_capsule(a.__dlpack__(max_version=(1, 0))).copied
    assert not dlpack.read_capsule(a.__dlpack__()).copied  # (a legacy capsule carries no flags)


def test_a_copied_export_is_read_on_both_paths(device: FakeDevice) -> None:
    x, y = _data(1), _data(2)
    ref = x.astype(np.float64) + y
    results = []
    for run in _paths():
        out = np.full(N, np.nan, np.float32)
        run[GRID](CopyingExport(x), y, out, N, BLOCK=BLOCK)
        got = out.astype(np.float64)
        assert not np.isnan(got).any(), "unwritten outputs"
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)
        results.append(out.tobytes())
    assert device.launches == 1 and results[0] == results[1]


def test_a_copied_export_written_is_sp0719_in_the_same_words_on_both_paths(device: FakeDevice) -> None:
    out = np.full(N, np.nan, np.float32)
    for run in _paths():
        with pytest.raises(LaunchError) as info:
            run[GRID](_data(3), _data(4), CopyingExport(out), N, BLOCK=BLOCK)
        assert (info.value.code, info.value.message, info.value.help) == (
            "SP0719", "argument `out` (a CopyingExport) exports a copy through DLPack (its IS_COPIED flag), which "
            "cannot be written back, but the kernel writes through it",
            "pass a numpy array or a torch tensor (e.g. `np.array(x)`) and read the results from it")
        assert info.value.span is not None
    assert device.launches == 0 and np.isnan(out).all()
