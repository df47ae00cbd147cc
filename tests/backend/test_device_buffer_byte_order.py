"""``DeviceBuffer``'s host copies (backend/runtime/memory.py) of byte-swapped numpy arrays
(``dtype('>f4')``): they copied the raw bytes, so the device held (and a byte-swapped ``out`` read
back) other numbers, silently; ``from_numpy`` also made an untyped buffer. The values are copied now.
The launcher's staging of host arrays read through TMA (``driver/launch.py``) goes through both.

No GPU: the buffer is a stand-in at a made-up address and the two driver copies are replaced by
copies into a bytes dictionary (the device memory), as the CPU tests of the launch paths do."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.backend.runtime import memory
from sparsile.backend.runtime.memory import DeviceBuffer


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> dict[int, bytearray]:
    """Device memory by buffer address; allocation and the two copies act on it."""
    mem: dict[int, bytearray] = {}

    def init(self, nbytes, *, dtype=None, shape=None, device=None):
        self.nbytes, self.dtype, self.device = int(nbytes), dtype, 0
        self.shape = tuple(int(s) for s in shape) if shape is not None else None
        self.ptr = 0x7F00_0000_0000 + 0x10000 * len(mem)
        mem[self.ptr] = bytearray(max(self.nbytes, 1))

    def to_device(ptr, array, stream=None, device=None):
        assert array.flags.c_contiguous
        mem[ptr][: array.nbytes] = array.tobytes()

    def to_host(ptr, out, stream=None, device=None):
        assert out.flags.c_contiguous
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(bytes(mem[ptr][: out.nbytes]), np.uint8)

    monkeypatch.setattr(DeviceBuffer, "__init__", init)
    monkeypatch.setattr(memory, "copy_host_to_device", to_device)
    monkeypatch.setattr(memory, "copy_device_to_host", to_host)
    return mem


@pytest.mark.parametrize("swapped", [">f4", ">f2", ">i4"])
def test_byte_swapped_host_arrays_are_copied_by_value(device, swapped: str) -> None:
    rng = np.random.default_rng(11)
    native_dtype = np.dtype(swapped).newbyteorder("=")
    x = (rng.uniform(-100, 100, 37)).astype(native_dtype)
    buf = DeviceBuffer.from_numpy(x.astype(swapped))
    assert buf.dtype == DeviceBuffer.from_numpy(x).dtype is not None  # typed as the native array
    assert bytes(device[buf.ptr][: x.nbytes]) == x.tobytes()  # the device's bytes: the values, native
    out = np.full(37, -1, swapped)  # poisoned
    assert buf.copy_to_host(out) is out
    assert np.array_equal(out, x)
    y = (rng.uniform(-100, 100, 37)).astype(native_dtype)
    buf.copy_from_host(y.astype(swapped))
    assert bytes(device[buf.ptr][: y.nbytes]) == y.tobytes()
    assert np.array_equal(buf.copy_to_host(), y)
