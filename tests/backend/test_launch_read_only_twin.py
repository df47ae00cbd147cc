"""A read-only view and a writable view of the same memory (``ro = x.view(); ro.flags.writeable =
False``) passed together, the kernel reading ``ro`` and writing ``x`` (out = ro + y, in place).

Both paths share one copy (or the memory itself) between identical views, but they kept the first
argument's array as the one to write through: the GPU path copied the results back into ``ro`` and
failed after the launch with an internal ``ValueError: assignment destination is read-only`` for a
strided or byte-swapped view (a contiguous native one was copied back by address and worked); the
interpreter ran a contiguous pair on ``ro``'s memory view and failed inside the run (an internal
compiler error around the same ValueError). The writable view of the memory is now the one written
through, on both paths; a read-only array the kernel writes through is still SP0719.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)

KINDS = ["contiguous", "strided", "reversed", "byte-swapped", "strided byte-swapped"]


def _memory(seed: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(the whole memory, the view of N elements of ``kind`` in it), random values."""
    memory = np.random.default_rng(seed).uniform(-100, 100, 2 * N).astype(np.float32)
    if "byte-swapped" in kind:
        memory = memory.astype(">f4")
    if kind.startswith("strided"):
        return memory, memory[::2]
    if kind == "reversed":
        return memory, memory[::-1][:N]
    return memory, memory[:N]


def _read_only(view: np.ndarray) -> np.ndarray:
    twin = view.view()
    twin.flags.writeable = False
    return twin


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("read_only_first", [True, False])
def test_out_written_through_its_writable_twin(device: FakeDevice, kind: str, read_only_first: bool) -> None:
    y = np.random.default_rng(2).uniform(-100, 100, N).astype(np.float32)
    k = vadd()
    results = []
    for run in (k, k.interpret):
        memory, view = _memory(1, kind)
        untouched = np.ones(memory.size, bool)
        untouched[np.nonzero(np.isin(np.arange(memory.size), _positions(memory, view)))] = False
        before = memory.copy()
        ref = view.astype(np.float64) + y
        if read_only_first:
            run[GRID](_read_only(view), y, view, N, BLOCK=BLOCK)
        else:  # (x written too: the ro twin is y; out = x + ro, in place)
            ref = view.astype(np.float64) * 2
            run[GRID](view, _read_only(view), view, N, BLOCK=BLOCK)
        np.testing.assert_allclose(view.astype(np.float64), ref, rtol=1e-6, atol=1e-5)
        np.testing.assert_array_equal(memory[untouched], before[untouched])
        results.append(memory.tobytes())
    assert device.launches == 1
    assert results[0] == results[1]


def _positions(memory: np.ndarray, view: np.ndarray) -> np.ndarray:
    """The indices into ``memory`` of ``view``'s elements."""
    base = memory.__array_interface__["data"][0]
    start = (view.__array_interface__["data"][0] - base) // memory.itemsize
    return start + np.arange(view.size) * (view.strides[0] // memory.itemsize)


@pytest.mark.parametrize("kind", KINDS)
def test_writing_through_the_read_only_twin_is_still_sp0719(device: FakeDevice, kind: str) -> None:
    y = np.random.default_rng(3).uniform(-100, 100, N).astype(np.float32)
    for run in (vadd(), vadd().interpret):
        memory, view = _memory(4, kind)
        before = memory.tobytes()
        with pytest.raises(LaunchError) as info:
            run[GRID](view, y, _read_only(view), N, BLOCK=BLOCK)
        assert info.value.code == "SP0719"
        assert memory.tobytes() == before
    assert device.launches == 0


def test_the_tma_staging_copies_back_through_the_writable_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """driver/launch.py stages a host array read through TMA itself and returns the (host, copy)
    pairs to copy back: the host of a pair is the writable view of the memory, not a read-only twin
    seen first (its copy back failed: assignment destination is read-only)."""
    from types import SimpleNamespace

    from sparsile.backend import runtime
    from sparsile.driver import launch

    class Buffer:
        @classmethod
        def from_numpy(cls, array: np.ndarray, device: int | None = None, stream: object = None) -> Buffer:
            return cls()

    monkeypatch.setattr(runtime, "DeviceBuffer", Buffer)
    spec = SimpleNamespace(params=[SimpleNamespace(kind="tensormap", name="a.tmap0")])
    fake = SimpleNamespace(spec=spec, written={"c"}, device=SimpleNamespace(ordinal=0))
    c = np.random.default_rng(5).uniform(-1, 1, (64, 128)).astype(np.float16)[:, ::2]
    bound = {"a": _read_only(c), "c": c}
    back = launch._stage_tma_host_arrays(fake, bound, empty=False)
    assert len(back) == 1 and back[0][0] is c and back[0][0].flags.writeable
    assert bound["c"] is bound["a"]  # one device copy
