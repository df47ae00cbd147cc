"""Strided (non-contiguous) numpy arrays given to ``kernel[grid](...)``: the GPU path refused them
(SP0705 "a non-contiguous host array; host arrays are copied to the device and must be
C-contiguous") where ``kernel.interpret[grid](...)`` copied them (frontend/interp/host_arrays.py),
and where the GPU path itself already staged a strided array read through TMA (driver/launch.py).
Now a strided host array is staged by value as toolkit57 staged byte-swapped ones
(backend/runtime/staging.py): a dense copy of its elements in C order goes in; one the kernel
writes is copied back into the strided view after the stream synchronizes, leaving the memory
between its elements alone. The same view passed twice shares one copy; views that share memory
without being the same view, one written, are SP0750 on both paths, and so is a written array
whose own elements share memory (an ``as_strided`` view): a copy back would keep one value per
address. Interleaved views that share no element (x[::2] and x[1::2]) each get their own copy.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add computed on its
memory). The same launches on a GPU: tests/gpu/test_strided_host_gpu.py (not run here).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)

POISON = -12345.0


def _data(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-100, 100, length).astype(np.float32)


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), "unwritten outputs"
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("step", [2, 3, -1, -2])
def test_strided_inputs_and_output(device: FakeDevice, step: int) -> None:
    """x and y strided views, out a strided view of a poisoned array: the results land in out's
    elements only, the memory between them keeps its poison; the interpreter gives the same bits."""
    base_x, base_y = _data(1, N * abs(step)), _data(2, N * abs(step))
    x, y = base_x[::step][:N], base_y[::step][:N]
    ref = x.astype(np.float64) + y.astype(np.float64)
    k = vadd()
    results = []
    for run in (k, k.interpret):
        memory = np.full(N * abs(step), POISON, np.float32)
        out = memory[::step][:N]
        assert not out.flags.c_contiguous
        run[GRID](x, y, out, N, BLOCK=BLOCK)
        _close(out, ref)
        between = np.ones(memory.shape, bool)
        between[np.arange(memory.size)[::step][:N]] = False
        assert (memory[between] == POISON).all(), "memory between the view's elements was written"
        results.append(memory.tobytes())
    assert device.launches == 1
    assert results[0] == results[1]  # the GPU path and the interpreter agree bit for bit
    memory = np.full(N * abs(step), POISON, np.float32)  # again: the fast path's fallback to the launcher
    k[GRID](x, y, memory[::step][:N], N, BLOCK=BLOCK)
    assert device.launches == 2
    assert memory.tobytes() == results[0]


def test_a_strided_array_read_and_written_in_place(device: FakeDevice) -> None:
    """x and out the same strided view (out = x + y in place): one staged copy, copied back once."""
    memory = _data(3, 2 * N)
    y = _data(4, N)
    inout = memory[1::2]
    before = memory.copy()
    ref = inout.astype(np.float64) + y
    vadd()[GRID](inout, y, inout, N, BLOCK=BLOCK)
    assert len(device.mem) == 2  # inout and y
    _close(inout, ref)
    np.testing.assert_array_equal(memory[0::2], before[0::2])  # the other half untouched


def test_the_same_strided_view_twice_shares_one_copy(device: FakeDevice) -> None:
    """x and y one strided view (two objects of the same memory, shape and strides): one copy."""
    memory = _data(5, 3 * N)
    out = np.full(N, np.nan, np.float32)
    vadd()[GRID](memory[::3], memory[::3], out, N, BLOCK=BLOCK)
    assert len(device.mem) == 2  # the view and out
    _close(out, 2.0 * memory[::3].astype(np.float64))


def test_interleaved_views_that_share_no_element(device: FakeDevice) -> None:
    """out = memory[1::2] written, x = memory[0::2] read: no shared element, so each has its own
    copy (the interpreter's np.shares_memory test); the byte spans overlap, which was SP0750."""
    k = vadd()
    y = _data(6, N)
    results = []
    for run in (k, k.interpret):
        memory = _data(7, 2 * N)
        ref = memory[0::2].astype(np.float64) + y
        run[GRID](memory[0::2], y, memory[1::2], N, BLOCK=BLOCK)
        _close(memory[1::2], ref)
        results.append(memory.tobytes())
    assert results[0] == results[1]


def test_views_sharing_some_elements_with_a_write_are_refused_on_both_paths(device: FakeDevice) -> None:
    memory = _data(8, 2 * N + 2)
    for run in (vadd(), vadd().interpret):
        with pytest.raises(LaunchError) as info:
            run[GRID](memory[0:2 * N:2], _data(9, N), memory[2::2], N, BLOCK=BLOCK)
        assert info.value.code == "SP0750"
    assert device.launches == 0


def test_a_written_array_whose_elements_share_memory_is_refused(device: FakeDevice) -> None:
    """An as_strided view whose elements repeat (stride 0 along a dimension of 2): SP0750 on the GPU
    path, as in the interpreter, where a copy back kept one of the values written to each address."""
    memory = np.zeros(N, np.float32)
    out = np.lib.stride_tricks.as_strided(memory, shape=(N // 2, 2), strides=(4, 0))
    assert out.flags.writeable and not out.flags.c_contiguous
    for run in (vadd(), vadd().interpret):
        with pytest.raises(LaunchError) as info:
            run[GRID](_data(10, N), _data(11, N), out, N, BLOCK=BLOCK)
        assert info.value.code == "SP0750"
        assert info.value.message.startswith(f"elements of argument `out` overlap in memory (shape {out.shape}, "
                                             f"byte strides {out.strides}), and the kernel writes through it")
    assert device.launches == 0


def test_a_repeating_view_is_read_by_value(device: FakeDevice) -> None:
    """A read-only broadcast (stride 0) is an input like any other: its dense copy is read."""
    value = np.broadcast_to(np.float32(2.5), (N,))
    y = _data(12, N)
    out = np.full(N, np.nan, np.float32)
    vadd()[GRID](value, y, out, N, BLOCK=BLOCK)
    _close(out, 2.5 + y.astype(np.float64))


def test_a_strided_byte_swapped_array_read_and_written(device: FakeDevice) -> None:
    """Both conversions at once: a strided '>f4' view staged as dense native values and written
    back in its own order into its own elements."""
    memory = _data(13, 2 * N).astype(">f4")
    y = _data(14, N)
    inout = memory[::2]
    before = memory.copy()
    ref = inout.astype(np.float64) + y
    vadd()[GRID](inout, y, inout, N, BLOCK=BLOCK)
    _close(inout, ref)
    assert memory.dtype == np.dtype(">f4")
    np.testing.assert_array_equal(memory[1::2], before[1::2])


def test_an_empty_grid_checks_a_strided_array_and_copies_nothing(device: FakeDevice) -> None:
    memory = np.full(2 * N, POISON, np.float32)
    vadd()[(0,)](_data(15, 2 * N)[::2], _data(16, N), memory[::2], N, BLOCK=BLOCK)
    assert device.launches == 0 and not device.mem
    assert (memory == POISON).all()
    out = np.lib.stride_tricks.as_strided(memory, shape=(N // 2, 2), strides=(4, 0))
    with pytest.raises(LaunchError) as info:
        vadd()[(0,)](_data(17, N), _data(18, N), out, N, BLOCK=BLOCK)
    assert info.value.code == "SP0750"


def test_derived_strides_describe_the_dense_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor parameter's derived shape and strides of a staged strided array are those of its
    dense device copy (C order), as the interpreter's are of its dense copy: the kernel indexes the
    copy, so the host view's strides (8 and 3 elements here) would read the wrong elements."""
    import struct

    from sparsile.backend.runtime import arguments as A
    from sparsile.tests.backend.test_runtime import EmulatedGpu, make_launcher

    gpu = EmulatedGpu(monkeypatch)
    spec = A.ParamSpec((A.PointerParam("x", "f32"), A.DerivedParam("x.shape0", "x", "shape", 0),
                        A.DerivedParam("x.shape1", "x", "shape", 1), A.DerivedParam("x.stride0", "x", "stride", 0),
                        A.DerivedParam("x.stride1", "x", "stride", 1)), kernel_name="t")
    launcher = make_launcher(gpu, spec, [8, 4, 4, 4, 4])
    memory = _data(19, 64).reshape(8, 8)
    launcher(1, (memory[::2, ::3],))
    derived = [struct.unpack("<i", p)[0] for p in gpu.launches[0]["params"][1:]]
    assert derived == [4, 3, 3, 1]
    staged = struct.unpack("<Q", gpu.launches[0]["params"][0])[0]
    np.testing.assert_array_equal(gpu.array(staged, np.float32, 12).reshape(4, 3), memory[::2, ::3])


def test_strided_cpu_torch_tensors_are_staged_too(device: FakeDevice) -> None:
    """A non-contiguous CPU torch tensor (a slice with a step, a transpose's row) is host memory the
    launcher now views with its strides and stages as it stages a numpy view (it was SP0705; the
    interpreter copies it); a written ``expand`` (its elements one address) is SP0750 on both paths."""
    torch = pytest.importorskip("torch")
    k = vadd()
    x = torch.from_numpy(_data(20, 2 * N))[::2]
    y = torch.from_numpy(_data(21, 3 * N).reshape(N, 3)).t()[1]  # a row of a transpose: stride 3
    ref = x.double().numpy() + y.double().numpy()
    results = []
    for run in (k, k.interpret):
        memory = torch.full((3 * N,), POISON)
        out = memory[::3]
        run[GRID](x, y, out, N, BLOCK=BLOCK)
        _close(out.numpy(), ref)
        assert (memory.numpy().reshape(N, 3)[:, 1:] == POISON).all()
        results.append(memory.numpy().tobytes())
    assert device.launches == 1 and results[0] == results[1]
    for run in (vadd(), vadd().interpret):
        with pytest.raises(LaunchError) as info:
            run[GRID](x, y, torch.zeros(1).expand(N), N, BLOCK=BLOCK)
        assert info.value.code == "SP0750"
