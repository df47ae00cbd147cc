"""Two host arguments that are views of the same bytes in different byte orders (``x`` and
``x.view('>f4')``) at ``kernel[grid](...)``.

The staging path shared one device copy between host arrays covering the same bytes with the same
strides (backend/runtime/staging.py ``shared_host_copy``), whatever their element types. The copy
holds the first one's values converted to the machine's byte order (``device_values``), so the
second, a byte-swapped view of those bytes, read the first one's values: out = x + x where the
interpreter (the reference) computes out = x + byteswapped(x). With a write through one of them, the
interpreter refuses the pair (SP0750: two views, one converted through a copy) where the GPU path
wrote one copy back through the first view. Views whose device copies hold the same bytes (two
native views, or two byte-swapped ones) still share one copy, as before.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)


def _both_ways_finite(seed: int, length: int) -> np.ndarray:
    """``length`` random float32 whose byte-swapped reading is a normal float of modest size too (so
    that x + x.view('>f4') is an ordinary sum, never NaN or overflow)."""
    rng = np.random.default_rng(seed)
    found: list[np.ndarray] = []
    count = 0
    while count < length:
        candidates = rng.uniform(-100, 100, 8 * length).astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            swapped = candidates.view(">f4").astype(np.float64)
        ok = np.isfinite(swapped) & (np.abs(swapped) > 1e-20) & (np.abs(swapped) < 1e20)
        found.append(candidates[ok])
        count += int(ok.sum())
    return np.concatenate(found)[:length]


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), "unwritten outputs"
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("step", [1, 2, -1])
@pytest.mark.parametrize("swapped_first", [False, True])
def test_a_view_and_its_byte_swapped_reading_are_two_inputs(device: FakeDevice, step: int,
                                                           swapped_first: bool) -> None:
    """x and x.view('>f4') read: each is read by its own values on both paths."""
    memory = _both_ways_finite(1, N * abs(step))
    native = memory[::step][:N]
    swapped = native.view(">f4")
    assert native.__array_interface__["data"][0] == swapped.__array_interface__["data"][0]
    first, second = (swapped, native) if swapped_first else (native, swapped)
    ref = native.astype(np.float64) + swapped.astype(np.float64)
    assert np.abs(ref - 2 * native.astype(np.float64)).min() > 0  # (the two readings differ everywhere)
    k = vadd()
    results = []
    for run in (k, k.interpret):
        out = np.full(N, np.nan, np.float32)
        run[GRID](first, second, out, N, BLOCK=BLOCK)
        _close(out, ref)
        results.append(out.tobytes())
    assert device.launches == 1
    assert results[0] == results[1]
    assert memory.tobytes() == _both_ways_finite(1, N * abs(step)).tobytes()  # inputs untouched


@pytest.mark.parametrize("written_swapped", [False, True])
def test_a_write_through_one_byte_order_of_shared_bytes_is_refused_on_both_paths(device: FakeDevice,
                                                                               written_swapped: bool) -> None:
    """out is x.view('>f4') (or x), x the other reading: SP0750 on both paths (the interpreter's
    words differ: its copies are the interpreter's)."""
    y = _both_ways_finite(2, N)
    for run in (vadd(), vadd().interpret):
        memory = _both_ways_finite(3, N)
        before = memory.tobytes()
        x, out = (memory, memory.view(">f4")) if written_swapped else (memory.view(">f4"), memory)
        with pytest.raises(LaunchError) as info:
            run[GRID](x, y, out, N, BLOCK=BLOCK)
        assert info.value.code == "SP0750"
        assert memory.tobytes() == before
    assert device.launches == 0


def test_the_gpu_path_names_the_byte_orders_in_its_refusal(device: FakeDevice) -> None:
    memory = _both_ways_finite(4, N)
    with pytest.raises(LaunchError) as info:
        vadd()[GRID](memory.view(">f4"), _both_ways_finite(5, N), memory, N, BLOCK=BLOCK)
    assert (info.value.code, info.value.message, info.value.help) == (
        "SP0750", "host arrays `x` and `out` overlap in memory but are not the same array, and the kernel writes "
        "`out`; `x` (byte-swapped) is copied to the device by its values, on its own, so the writes would be lost",
        "pass the same array for both, or separate arrays (e.g. `y.copy()`); C-contiguous arrays of the machine's "
        "byte order share one device copy however they overlap")


def test_two_byte_swapped_views_of_the_same_bytes_still_share_one_copy(device: FakeDevice) -> None:
    """inout = x.view('>f4') read and written as x and out: one copy, written back in '>' order."""
    memory = _both_ways_finite(6, N)
    y = _both_ways_finite(7, N)
    a, b = memory.view(">f4"), memory.view(">f4")  # two objects, one view
    ref = a.astype(np.float64) + y
    vadd()[GRID](a, y, b, N, BLOCK=BLOCK)
    assert len(device.mem) == 2  # the shared view and y
    _close(b, ref)
    _close(memory.view(">f4"), ref)


@pytest.mark.parametrize("empty", [False, True])
def test_the_tma_staging_gives_a_byte_swapped_reading_no_share_of_its_copy(monkeypatch: pytest.MonkeyPatch,
                                                                           empty: bool) -> None:
    """driver/launch.py stages a host array read through TMA itself and hands its device copy to
    every other argument over the same bytes: a byte-swapped reading of them got that copy (the
    other values); it is now left to be staged by its own values, and a write through either one is
    SP0750, for an empty grid too."""
    from types import SimpleNamespace

    from sparsile.backend import runtime
    from sparsile.driver import launch

    made: list[np.ndarray] = []

    class Buffer:
        @classmethod
        def from_numpy(cls, array: np.ndarray, device: int | None = None, stream: object = None) -> Buffer:
            made.append(array)
            return cls()

    monkeypatch.setattr(runtime, "DeviceBuffer", Buffer)
    spec = SimpleNamespace(params=[SimpleNamespace(kind="tensormap", name="a.tmap0")])
    a = np.random.default_rng(8).uniform(0.5, 2.0, (64, 64)).astype(np.float16)
    reader = SimpleNamespace(spec=spec, written=set(), device=SimpleNamespace(ordinal=0))
    bound = {"a": a, "b": a.view(">f2"), "c": a}
    assert launch._stage_tma_host_arrays(reader, bound, empty=empty) == []
    assert bound["c"] is bound["a"]  # the same view shares the TMA copy
    assert bound["b"] is not bound["a"] and isinstance(bound["b"], np.ndarray)  # left to the launcher
    assert len(made) == (0 if empty else 1)
    for written in ({"a"}, {"b"}):
        writer = SimpleNamespace(spec=spec, written=written, device=SimpleNamespace(ordinal=0))
        with pytest.raises(LaunchError) as info:
            launch._stage_tma_host_arrays(writer, {"a": a, "b": a.view(">f2")}, empty=empty)
        assert info.value.code == "SP0750"
