"""Byte-swapped numpy arrays (``dtype('>f4')``) given to ``kernel[grid](...)``: the GPU path refused
them (SP0703 "expects a pointer to f32, got a float32 (byte-swapped) numpy array") where
``kernel.interpret[grid](...)`` converted them (frontend/interp/host_arrays.py). The two paths agree
now: a byte-swapped host array is staged as a copy of its values in the machine's byte order
(backend/runtime/staging.py), and one the kernel writes gets the results back in its own byte order.

No GPU: the launch path is the real one (binding, compilation for sm_90a, the launcher's checks,
staging and copy-back) on a faked H200 whose device memory is a bytes dictionary; its "kernel"
is vector_add computed on that memory in the device's (native) byte order, as the GPU computes.
The same launch on a GPU: tests/gpu/test_byte_order_gpu.py."""

from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

from sparsile.backend import runtime
from sparsile.backend.runtime import devices
from sparsile.backend.runtime.memory import DeviceBuffer
from sparsile.driver import fast_launch, launch
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import ATTRS, H200, OK, vadd

N = 1000
BLOCK = 256
GRID = (-(-N // BLOCK),)


class FakeDevice:
    """Device memory (buffer address -> bytes) and the launches of vector_add on it."""

    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}
        self.launches = 0

    def find(self, ptr: int) -> tuple[bytearray, int]:
        for base, data in self.mem.items():
            if base <= ptr < base + max(len(data), 1):
                return data, ptr - base
        raise AssertionError(f"no device memory at {ptr:#x}")

    def vector_add(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        """out[i] = x[i] + y[i] in float32 of the machine's byte order, on device memory."""
        pointers = (ctypes.c_void_p * 4).from_address(params)
        x, y, out = (struct.unpack("<Q", ctypes.string_at(p, 8))[0] for p in pointers[:3])
        (n,) = struct.unpack("<i", ctypes.string_at(pointers[3], 4))
        (xm, xo), (ym, yo), (om, oo) = self.find(x), self.find(y), self.find(out)
        a = np.frombuffer(bytes(xm[xo:xo + 4 * n]), np.float32)
        b = np.frombuffer(bytes(ym[yo:yo + 4 * n]), np.float32)
        om[oo:oo + 4 * n] = (a + b).astype(np.float32).tobytes()
        self.launches += 1
        return (OK,)


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    """A fake H200: kernels compile for real; allocation, the staging copies and the launch act on
    :class:`FakeDevice`."""
    from sparsile.driver.compiler import compile_cached
    from sparsile.frontend.interp.host_arrays import stored_params

    fake = FakeDevice()

    def init(self, nbytes, *, dtype=None, shape=None, device=None):
        self.nbytes, self.dtype, self.device = int(nbytes), dtype, 0
        self.shape = tuple(int(s) for s in shape) if shape is not None else None
        self.ptr = 0x7F00_0000_0000 + 0x100000 * len(fake.mem)
        fake.mem[self.ptr] = bytearray(max(self.nbytes, 1))

    def htod(dst, src, nbytes, stream):
        data, at = fake.find(dst)
        data[at:at + nbytes] = ctypes.string_at(src, nbytes)
        return (OK,)

    def dtoh(dst, src, nbytes, stream):
        data, at = fake.find(src)
        ctypes.memmove(dst, bytes(data[at:at + nbytes]), nbytes)
        return (OK,)

    def build(kernel, bindings, key, target, options, ordinal=None):
        ck = compile_cached(kernel, bindings, key, target, options)
        stores = stored_params(kernel.ir_for(bindings, key, options))
        spec = launch.param_spec(kernel, bindings, ck.params, stores)
        module = SimpleNamespace(device=H200, context_key=None, _state="state", activate=lambda force=False: None)
        fn = SimpleNamespace(module=module, attributes=ATTRS, handle=0x500, set_max_dynamic_shared=lambda n: None)
        launcher = runtime.Launcher(fn, spec, num_warps=ck.num_warps, cluster=ck.cluster, pdl=ck.pdl)
        launcher._launch_kernel = fake.vector_add
        launcher.spec_has_tensormaps = False
        launcher.written = stores
        launcher.captures = kernel.captures_for(bindings, key, options)
        return launcher

    monkeypatch.setattr(DeviceBuffer, "__init__", init)
    monkeypatch.setattr(DeviceBuffer, "free", lambda self: None)
    monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", htod)
    monkeypatch.setattr(driver, "cuMemcpyDtoHAsync", dtoh)
    monkeypatch.setattr(driver, "cuStreamSynchronize", lambda stream: (OK,))
    monkeypatch.setattr(devices, "_has_gpu", True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: H200)
    monkeypatch.setattr(launch, "_build_launcher", build)
    monkeypatch.setattr(fast_launch, "torch_current_stream", lambda ordinal: 0)
    return fake


def operands(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-100, 100, N).astype(np.float32)
    y = rng.uniform(-100, 100, N).astype(np.float32)
    return x, y, x.astype(np.float64) + y.astype(np.float64)


def check(out: np.ndarray, ref: np.ndarray) -> None:
    got = out.astype(np.float64)
    assert not np.isnan(got).any(), "unwritten outputs"
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("x_order, y_order, out_order", [("=", "=", "="), (">", "=", ">"), (">", ">", "="),
                                                         ("=", "=", ">"), (">", ">", ">")])
def test_byte_swapped_host_arrays_on_the_gpu_path(device: FakeDevice, x_order: str, y_order: str,
                                                  out_order: str) -> None:
    x, y, ref = operands(hash((x_order, y_order, out_order)) % 1000)
    k = vadd()
    out = np.full(N, np.nan, np.dtype(np.float32).newbyteorder(out_order))
    k[GRID](x.astype(x.dtype.newbyteorder(x_order)), y.astype(y.dtype.newbyteorder(y_order)), out, N, BLOCK=BLOCK)
    assert device.launches == 1
    assert out.dtype == np.dtype(np.float32).newbyteorder(out_order)  # written back in its own order
    check(out, ref)
    again = np.full(N, np.nan, out.dtype)  # the same kinds again (the fast path's fallback to the launcher)
    k[GRID](x.astype(x.dtype.newbyteorder(x_order)), y.astype(y.dtype.newbyteorder(y_order)), again, N, BLOCK=BLOCK)
    assert device.launches == 2
    check(again, ref)


def test_the_gpu_path_and_the_interpreter_agree_bit_for_bit(device: FakeDevice) -> None:
    x, y, ref = operands(21)
    k = vadd()
    gpu = np.full(N, np.nan, ">f4")
    interp = np.full(N, np.nan, ">f4")
    k[GRID](x.astype(">f4"), y, gpu, N, BLOCK=BLOCK)
    k.interpret[GRID](x.astype(">f4"), y, interp, N, BLOCK=BLOCK)
    check(interp, ref)
    assert gpu.tobytes() == interp.tobytes()


def test_one_byte_swapped_array_passed_twice_shares_one_copy(device: FakeDevice) -> None:
    """x and out the same byte-swapped array (an in-place add): one staged copy, as for native ones."""
    x, y, ref = operands(22)
    k = vadd()
    inout = x.astype(">f4")
    k[GRID](inout, y, inout, N, BLOCK=BLOCK)
    assert len(device.mem) == 2  # inout and y
    check(inout, ref)


def test_a_byte_swapped_array_of_another_type_is_still_refused(device: FakeDevice) -> None:
    x, y, _ = operands(23)
    with pytest.raises(LaunchError) as info:
        vadd()[GRID](x.astype(">f8"), y, np.zeros(N, np.float32), N, BLOCK=BLOCK)
    assert (info.value.code, info.value.message) == (
        "SP0703", "argument `x` expects a pointer to f32, found an array of f64")


def test_the_unstaged_copy_of_a_byte_swapped_tma_host_array_has_its_values_type() -> None:
    """An empty grid's stand-in for the device copy of a host array read through TMA (driver/launch.py)
    is described as that copy would be: DeviceBuffer.from_numpy types a byte-swapped array's copy as
    the native dtype, so the stand-in is f16 for ``'>f2'`` too (it was untyped: SP0703 on an empty
    grid where a launch that runs passes)."""
    from sparsile.backend.runtime.arrays import describe_array
    from sparsile.backend.runtime.staging import Unstaged

    host = np.zeros((64, 64), ">f2")
    info = describe_array(Unstaged(host))
    assert (info.dtype, info.shape) == ("f16", (64, 64))
    assert describe_array(host).dtype == "f16"  # the host array itself: its values' type
