"""The runtime's driver-facing code (devices, modules, functions, buffers, launches, tensor maps,
stream waits, the overhead helper) run on the CPU against a *type-checking* fake driver.

Each patched ``cuda.bindings.driver.cu*`` function first calls the real binding with the very
same arguments: cuda-python converts (type-checks) every argument before it loads libcuda, so on
a machine without a driver a well-typed call fails with ``DynamicLibNotFoundError`` and an
ill-typed one with ``TypeError``. The fake then returns a canned result (and emulates device
memory), so every path is exercised end to end. Skipped where a real GPU is present: there the
GPU tests run the real thing."""

from __future__ import annotations

import ctypes
import gc
import threading

import numpy as np
import pytest
from cuda.bindings import driver

from sparsile.backend import runtime
from sparsile.backend.runtime import arguments as A
from sparsile.backend.runtime import devices
from sparsile.backend.runtime.tensormap import TensorMapParam, TensorMapSpec, encode_tensor_map
from sparsile.frontend.diagnostics import LaunchError

pytestmark = pytest.mark.skipif(runtime.has_gpu(), reason="the fake driver is for machines without a GPU")

OK = driver.CUresult.CUDA_SUCCESS
DEVICE_ATTRIBUTES = {
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 9, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0,
    "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK": 49152,
    "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448,
    "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1024, "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X": 1024,
    "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y": 1024, "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z": 64,
    "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X": 2**31 - 1, "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y": 65535,
    "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z": 65535, "CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH": 1,
    "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE": 52428800, "CU_DEVICE_ATTRIBUTE_WARP_SIZE": 32,
}
FUNCTION_ATTRIBUTES = {
    "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1024, "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES": 0,
    "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES": 49152, "CU_FUNC_ATTRIBUTE_NUM_REGS": 16,
    "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES": 0, "CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES": 0,
    "CU_FUNC_ATTRIBUTE_PTX_VERSION": 80, "CU_FUNC_ATTRIBUTE_BINARY_VERSION": 90,
    "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH": 0, "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT": 0,
    "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH": 0,
}


class FakeDriver:
    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, tuple]] = []
        self.memory: dict[int, bytearray] = {}
        self.next_ptr = 0x7F00_0000_0000
        self.launches: list[tuple] = []
        self.param_sizes: list[int] = []
        self.set_attributes: list[tuple] = []
        self.current = 0  # the thread's current context (none)
        fakes = {
            "cuInit": lambda flags: (OK,),
            "cuDeviceGetCount": lambda: (OK, 1),
            "cuDeviceGet": lambda ordinal: (OK, driver.CUdevice(ordinal)),
            "cuDevicePrimaryCtxRetain": lambda dev: (OK, driver.CUcontext(0xC0)),
            "cuCtxSetCurrent": self.set_current,
            "cuCtxGetCurrent": lambda: (OK, driver.CUcontext(self.current)),
            "cuCtxPushCurrent": lambda ctx: (OK,),
            "cuCtxPopCurrent": lambda: (OK, driver.CUcontext(0xC0)),
            "cuCtxSynchronize": lambda: (OK,),
            "cuDeviceGetAttribute": lambda attr, dev: (OK, DEVICE_ATTRIBUTES[attr.name]),
            "cuDeviceGetName": lambda n, dev: (OK, b"NVIDIA H200".ljust(n, b"\0")),
            "cuDeviceTotalMem": lambda dev: (OK, 150_000_000_000),
            "cuModuleLoadData": lambda image: (OK, driver.CUmodule(0x400)),
            "cuModuleUnload": lambda mod: (OK,),
            "cuModuleGetFunction": self.get_function,
            "cuModuleGetFunctionCount": lambda mod: (OK, 2),
            "cuModuleEnumerateFunctions": lambda n, mod: (OK, [driver.CUfunction(0x500), driver.CUfunction(0x501)]),
            "cuFuncGetName": lambda f: (OK, {0x500: b"axpy", 0x501: b"other"}[int(f)]),
            "cuFuncGetAttribute": lambda attr, f: (OK, FUNCTION_ATTRIBUTES[attr.name]),
            "cuFuncSetAttribute": lambda f, attr, value: self.set_attributes.append((attr.name, value)) or (OK,),
            "cuMemAlloc": self.alloc,
            "cuMemFree": lambda ptr: (OK,),
            "cuMemcpyHtoDAsync": self.htod,
            "cuMemcpyDtoHAsync": self.dtoh,
            "cuMemsetD8": self.memset,
            "cuMemsetD8Async": lambda dst, value, n, stream: self.memset(dst, value, n),
            "cuStreamSynchronize": lambda stream: (OK,),
            "cuPointerGetAttribute": lambda attr, ptr: (OK, 0),
            "cuEventCreate": lambda flags: (OK, driver.CUevent(0xE0)),
            "cuEventRecord": lambda event, stream: (OK,),
            "cuStreamWaitEvent": lambda stream, event, flags: (OK,),
            "cuLaunchKernel": self.launch,
            "cuLaunchKernelEx": self.launch_ex,
            "cuTensorMapEncodeTiled": self.encode,
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(driver, name, self._checked(name, getattr(driver, name), fake))
        monkeypatch.setattr(devices, "_devices", {})
        monkeypatch.setattr(devices, "tls", threading.local())
        monkeypatch.setattr(devices, "_has_gpu", False)  # the fake GPU must not be remembered afterwards

    def _checked(self, name, real, fake):
        def call(*args):
            # The real binding tries to load libcuda under a lock on every call here; a garbage
            # collection inside that could run a finalizer that calls the driver again and
            # deadlock on the lock, so collection is paused around the check.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                real(*args)
            except Exception as exc:
                if type(exc).__name__ != "DynamicLibNotFoundError":
                    raise AssertionError(f"driver.{name}{args!r} rejected its arguments: {exc!r}") from None
            else:
                raise AssertionError(f"driver.{name} unexpectedly ran")
            finally:
                if gc_was_enabled:
                    gc.enable()
            self.calls.append((name, args))
            return fake(*args)

        return call

    def set_current(self, ctx):
        self.current = int(ctx)
        return (OK,)

    def get_function(self, mod, name):
        if name == b"nope":
            return (driver.CUresult.CUDA_ERROR_NOT_FOUND, None)
        return (OK, driver.CUfunction(0x500))

    def alloc(self, nbytes):
        ptr = self.next_ptr
        self.memory[ptr] = bytearray(nbytes)
        self.next_ptr += (nbytes + 511) // 256 * 256
        return (OK, driver.CUdeviceptr(ptr))

    def region(self, ptr):
        for base, data in self.memory.items():
            if base <= ptr < base + len(data):
                return data, ptr - base
        raise AssertionError(f"{ptr:#x} is not device memory")

    def htod(self, dst, src, n, stream):
        data, off = self.region(int(dst))
        data[off:off + n] = ctypes.string_at(src, n)
        return (OK,)

    def dtoh(self, dst, src, n, stream):
        data, off = self.region(int(src))
        ctypes.memmove(dst, bytes(data[off:off + n]), n)
        return (OK,)

    def memset(self, dst, value, n):
        data, off = self.region(int(dst))
        data[off:off + n] = bytes([value]) * n
        return (OK,)

    def _read_params(self, address):
        pointers = (ctypes.c_void_p * len(self.param_sizes)).from_address(address)
        return [ctypes.string_at(p, n) for p, n in zip(pointers, self.param_sizes)]

    def launch(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launches.append(("plain", (gx, gy, gz), (bx, by, bz), smem, int(stream), self._read_params(params)))
        return (OK,)

    def launch_ex(self, config, f, params, extra):
        attrs = config.attrs[:config.numAttrs]
        cluster = next(((a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z) for a in attrs
                        if a.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION), (1, 1, 1))
        self.pdl_values = [a.value.programmaticStreamSerializationAllowed for a in attrs if a.id ==
                           driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
        self.launches.append(("ex", (config.gridDimX, config.gridDimY, config.gridDimZ), cluster,
                              config.sharedMemBytes, int(config.hStream), self._read_params(params)))
        return (OK,)

    def encode(self, *args):
        tmap = driver.CUtensorMap()
        ctypes.memset(tmap.getPtr(), 0x5A, 128)
        return (OK, tmap)


@pytest.fixture
def fake(monkeypatch):
    return FakeDriver(monkeypatch)


def test_device_discovery(fake):
    assert runtime.has_gpu() and runtime.device_count() == 1
    info = runtime.current_device()
    assert info.name == "NVIDIA H200" and info.compute_capability == (9, 0) and info.sm_count == 132
    assert info.max_block_dims == (1024, 1024, 64) and info.max_cluster_size == 8
    assert info.total_memory == 150_000_000_000 and info.arch == "sm_90"
    assert runtime.use_device(0) is info
    with pytest.raises(LaunchError) as exc:
        runtime.current_device(3)
    assert exc.value.code == A.NO_GPU and "no CUDA device 3" in str(exc.value)
    runtime.synchronize()


def test_modules_functions_and_attributes(fake):
    module = runtime.load_module(".version 8.0\n.target sm_90\n")  # PTX text: NUL-terminated for the driver
    image = next(args[0] for name, args in fake.calls if name == "cuModuleLoadData")
    assert image.endswith(b"\0")
    fn = module.function("axpy")
    assert module.function("axpy") is fn
    assert fn.attributes.max_threads_per_block == 1024 and fn.attributes.required_cluster == (0, 0, 0)
    assert module.kernel_names() == ["axpy", "other"]
    with pytest.raises(LaunchError) as exc:
        module.function("nope")
    assert exc.value.code == A.KERNEL_NOT_FOUND and "axpy, other" in exc.value.help
    fn.set_max_dynamic_shared(40 * 1024)  # within the default: nothing to do
    fn.set_max_dynamic_shared(100 * 1024)
    fn.set_max_dynamic_shared(64 * 1024)  # already allowed
    assert fake.set_attributes == [("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 102400)]
    module.unload()


def test_device_buffers(fake):
    data = np.arange(10, dtype=np.float32)
    buf = runtime.DeviceBuffer.from_numpy(data)
    assert buf.dtype == "f32" and buf.shape == (10,) and buf.ptr in fake.memory
    np.testing.assert_array_equal(buf.copy_to_host(), data)
    buf.fill_byte(0xFF)
    assert np.isnan(buf.to_numpy()).all()
    cai = buf.__cuda_array_interface__
    assert cai["data"] == (buf.ptr, False) and cai["typestr"] == "<f4" and cai["shape"] == (10,)
    with buf:
        pass
    with pytest.raises(LaunchError):
        buf.copy_from_host(np.zeros(11, np.float32))
    raw = runtime.DeviceBuffer(64)
    assert raw.copy_to_host().dtype == np.uint8 and "64 bytes" in repr(raw)


def test_launcher_end_to_end(fake):
    module = runtime.load_module(b"\x7fELF fake cubin")
    spec = A.ParamSpec((A.PointerParam("x", "f32", aligned16=True, readonly=True), A.PointerParam("out", "f32"),
                        A.ScalarParam("alpha", "f32"), A.ScalarParam("n", "i32")))
    launcher = runtime.Launcher(module.function("axpy"), spec, num_warps=8, dynamic_shared=64 * 1024)
    fake.param_sizes = [8, 8, 4, 4]
    x = runtime.DeviceBuffer.from_numpy(np.ones(100, np.float32))
    out = np.zeros(100, np.float32)
    launcher(4, (x, out, 0.5, 100), stream=9)
    kind, grid, block, smem, stream, params = fake.launches[-1]
    assert (kind, grid, block, smem, stream) == ("plain", (4, 1, 1), (256, 1, 1), 65536, 9)
    staged = int.from_bytes(params[1], "little")
    assert int.from_bytes(params[0], "little") == x.ptr and staged in fake.memory and staged != x.ptr
    assert params[2:] == [np.float32(0.5).tobytes(), np.int32(100).tobytes()]
    stream_waits = [n for n, _ in fake.calls if n == "cuStreamWaitEvent"]
    cai = type("Cai", (), {})()
    cai.__cuda_array_interface__ = {"shape": (100,), "typestr": "<f4", "data": (x.ptr, False), "version": 3,
                                    "strides": None, "stream": 0x77}
    launcher(4, (cai, x, 1.0, 100))
    assert len([n for n, _ in fake.calls if n == "cuStreamWaitEvent"]) == len(stream_waits) + 1


def test_cluster_and_tensor_map_launch(fake):
    module = runtime.load_module(b"\x7fELF fake cubin")
    spec = A.ParamSpec((TensorMapParam("g", "f16", (64, 64)), A.PointerParam("out", "u16")))
    launcher = runtime.Launcher(module.function("axpy"), spec, num_warps=4, cluster=(2, 1, 1))
    fake.param_sizes = [128, 8]
    g = runtime.DeviceBuffer.from_numpy(np.zeros((128, 128), np.float16))
    out = runtime.DeviceBuffer.empty((64, 64), "u16")
    launcher((4, 2), (g, out))
    kind, grid, cluster, smem, stream, params = fake.launches[-1]
    assert (kind, grid, cluster, smem, stream) == ("ex", (4, 2, 1), (2, 1, 1), 0, 0)
    assert params == [b"\x5a" * 128, out.ptr.to_bytes(8, "little")]
    assert encode_tensor_map(TensorMapSpec("f16", (128, 128), (256, 2), (64, 64)), g.ptr) == b"\x5a" * 128


def test_measure_launch_overhead_runs(fake):
    result = runtime.measure_launch_overhead(20)
    assert result.n == 20 and result.driver_us > 0 and result.launcher_int_us > 0 and result.launcher_buffer_us > 0
    assert sum(1 for launch in fake.launches if launch[0] == "plain") >= 3 * 20


@pytest.mark.parametrize("cluster", [(1, 1, 1), (2, 1, 1)])
def test_pdl_launch_passes_programmatic_stream_serialization(fake, cluster):
    """``pdl=True``: every launch is a cuLaunchKernelEx whose attributes hold the cluster (when it
    has more than one CTA) and programmatic stream serialization, allowed."""
    module = runtime.load_module(b"\x7fELF fake cubin")
    spec = A.ParamSpec((A.PointerParam("out", "u16"),))
    launcher = runtime.Launcher(module.function("axpy"), spec, num_warps=4, cluster=cluster, pdl=True)
    fake.param_sizes = [8]
    out = runtime.DeviceBuffer.empty((64,), "u16")
    launcher((4, 2), (out,), stream=0x51)
    kind, grid, seen_cluster, smem, stream, params = fake.launches[-1]
    assert (kind, grid, seen_cluster, smem, stream) == ("ex", (4, 2, 1), cluster, 0, 0x51)
    assert fake.pdl_values == [1] and params == [out.ptr.to_bytes(8, "little")]


def test_pdl_is_refused_below_compute_capability_9(fake, monkeypatch):
    monkeypatch.setitem(DEVICE_ATTRIBUTES, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", 8)
    module = runtime.load_module(b"\x7fELF fake cubin")
    spec = A.ParamSpec((A.PointerParam("out", "u16"),))
    runtime.Launcher(module.function("axpy"), spec, num_warps=4)  # a plain launch is fine
    with pytest.raises(LaunchError) as exc:
        runtime.Launcher(module.function("axpy"), spec, num_warps=4, pdl=True)
    assert exc.value.code == "SP0726"
    assert str(exc.value).startswith("error[SP0726]: programmatic dependent launch (pdl=True) needs compute "
                                     "capability 9.0 or later; NVIDIA H200 is sm_80")
