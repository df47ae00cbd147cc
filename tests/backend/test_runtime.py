"""CPU tests of the runtime and the Launcher. A small emulated GPU stands in for the driver:
device memory is a dict of bytearrays, and the "kernel" is a Python function that reads its
parameters back out of the ``kernelParams`` array exactly as the driver would (pointer i ->
bytes of parameter i). So the whole launch path (binding, conversion, packing, host copies in
and out, cluster configuration) runs without a GPU; the real thing runs in test_runtime_gpu.py."""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import sys
import types
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver

from sparsile.backend import runtime
from sparsile.backend.runtime import CudaError, FunctionAttributes, Launcher, check, dlpack, staging
from sparsile.backend.runtime import arguments as A
from sparsile.backend.runtime import launcher as launcher_module
from sparsile.backend.runtime.tensormap import Swizzle, TensorMap, TensorMapParam, TensorMapSpec
from sparsile.frontend.diagnostics import LaunchError

OK = driver.CUresult.CUDA_SUCCESS
H200 = runtime.DeviceInfo(ordinal=0, name="NVIDIA H200", compute_capability=(9, 0), sm_count=132,
                          max_shared_per_block=49152, max_shared_per_block_optin=232448,
                          max_threads_per_block=1024, max_block_dims=(1024, 1024, 64),
                          max_grid_dims=(2**31 - 1, 65535, 65535), max_cluster_size=8, l2_size=52428800)


class FakeCai:
    """Only ``__cuda_array_interface__`` (like Numba); never dereferenced."""

    def __init__(self, ptr, shape, typestr, stream=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": stream}


class FakeDLPack:
    """A DLPack producer for (fake) memory on any device; records the streams it was given."""

    def __init__(self, ptr, shape, dtype, device_type=dlpack.DEVICE_CUDA, device_id=0, strides=None):
        self.args = (ptr, shape, dtype, device_type, device_id, strides)
        self.streams = []

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        ptr, shape, dtype, device_type, device_id, strides = self.args
        return dlpack.export_capsule(ptr, shape, dtype, device_type, device_id, owner=self, strides=strides)

    def __dlpack_device__(self):
        return self.args[3], self.args[4]


ATTRS = FunctionAttributes(max_threads_per_block=1024, static_shared_bytes=1024,
                           max_dynamic_shared_bytes=48128, num_regs=32, local_bytes=0, const_bytes=0,
                           ptx_version=80, binary_version=90, required_cluster=(0, 0, 0))


class FakeModule:
    def __init__(self):
        self.device = H200
        self.context_key = object()
        self._state = "state"
        self.forced = 0

    def activate(self, force=False):
        self.forced += force


@dataclass
class FakeFunction:
    module: FakeModule = field(default_factory=FakeModule)
    attributes: FunctionAttributes = ATTRS
    handle: str = "kernel-handle"
    dynamic: list = field(default_factory=list)

    def set_max_dynamic_shared(self, nbytes):
        self.dynamic.append(nbytes)


class EmulatedGpu:
    """Device memory + memcpy + launch emulation patched into ``cuda.bindings.driver``."""

    def __init__(self, monkeypatch):
        self.memory: dict[int, bytearray] = {}
        self.next_ptr = 0x7F00_0000_0000
        self.launches: list[dict] = []
        self.kernel = None
        self.syncs = 0
        self.freed: list[int] = []
        gpu = self

        class Buffer:
            def __init__(self, nbytes, device=None, **_):
                self.ptr, self.nbytes = gpu.alloc(nbytes), nbytes

            def free(self):
                gpu.freed.append(self.ptr)

        monkeypatch.setattr(staging, "DeviceBuffer", Buffer)
        monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", self.htod)
        monkeypatch.setattr(driver, "cuMemcpyDtoHAsync", self.dtoh)
        monkeypatch.setattr(driver, "cuStreamSynchronize", self.sync)

    def alloc(self, nbytes):
        ptr = self.next_ptr
        self.memory[ptr] = bytearray(max(nbytes, 1))
        self.next_ptr += (nbytes + 511) // 256 * 256
        return ptr

    def array(self, ptr, dtype, count):
        return np.frombuffer(self.memory[ptr], dtype=dtype, count=count)

    def htod(self, dst, src, n, stream):
        self.memory[dst][:n] = ctypes.string_at(src, n)
        return (OK,)

    def dtoh(self, dst, src, n, stream):
        ctypes.memmove(dst, bytes(self.memory[src][:n]), n)
        return (OK,)

    def sync(self, stream):
        self.syncs += 1
        return (OK,)

    def launch(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra, sizes=None):
        record = {"f": f, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem, "stream": stream,
                  "params": self.read_params(params, sizes or self.sizes)}
        self.launches.append(record)
        if self.kernel is not None:
            self.kernel(record)
        return (OK,)

    def read_params(self, address, sizes):
        pointers = (ctypes.c_void_p * len(sizes)).from_address(address)
        return [ctypes.string_at(p, n) for p, n in zip(pointers, sizes)]


def make_launcher(gpu, spec, sizes, **kw):
    launcher = Launcher(FakeFunction(), spec, **kw)
    gpu.sizes = sizes
    launcher._launch_kernel = gpu.launch
    return launcher


def q(value):
    return struct.pack("<Q", value)


VADD = A.ParamSpec((A.PointerParam("x", "f32", readonly=True), A.PointerParam("y", "f32", readonly=True),
                    A.PointerParam("out", "f32"), A.ScalarParam("n", "i32"), A.ConstexprParam("BLOCK", 128)),
                   kernel_name="vadd")


def vadd_kernel(gpu):
    def run(record):
        x, y, out = (struct.unpack("<Q", p)[0] for p in record["params"][:3])
        n = struct.unpack("<i", record["params"][3])[0]
        gpu.array(out, np.float32, n)[:] = gpu.array(x, np.float32, n) + gpu.array(y, np.float32, n)

    return run


def test_numpy_arguments_are_copied_in_and_out(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    gpu.kernel = vadd_kernel(gpu)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4], num_warps=4)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    x.flags.writeable = False  # read-only parameter: fine
    out = np.full(1000, np.nan, dtype=np.float32)
    launcher(4, (x, y, out, 1000), {"BLOCK": 128})
    np.testing.assert_array_equal(out, x + y)
    record = gpu.launches[-1]
    assert record["grid"] == (4, 1, 1) and record["block"] == (128, 1, 1) and record["stream"] == 0
    assert record["params"][3] == struct.pack("<i", 1000)
    assert len(gpu.freed) == 3 and gpu.syncs == 1  # staged buffers freed after one synchronize


def test_read_only_parameters_are_not_copied_back(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)

    def scribble(record):  # the "kernel" writes through every pointer
        for p in record["params"][:3]:
            gpu.array(struct.unpack("<Q", p)[0], np.float32, 4)[:] = 7.0

    gpu.kernel = scribble
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    x, y, out = (np.zeros(4, dtype=np.float32) for _ in range(3))
    launcher(1, (x, y, out, 4))
    assert (x == 0).all() and (y == 0).all() and (out == 7).all()


def test_device_arrays_are_used_in_place_and_the_launch_stays_async(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    x = FakeDLPack(0x1000, (64,), "f32")
    y = FakeDLPack(0x2000, (64,), "f32")
    out = FakeDLPack(0x3000, (64,), "f32")
    launcher((1,), (x, y, out, 64), stream=0x55)
    record = gpu.launches[-1]
    assert record["params"][:3] == [q(0x1000), q(0x2000), q(0x3000)] and record["stream"] == 0x55
    assert gpu.syncs == 0 and not gpu.memory
    assert x.streams == [0x55]  # the producer was told which stream we use
    launcher.launch(2, x, y, out=out, n=5)
    assert gpu.launches[-1]["grid"] == (2, 1, 1) and gpu.launches[-1]["params"][3] == struct.pack("<i", 5)
    launcher(3, (0x1010, 0x2020, 0x3030, 1))  # raw addresses
    assert gpu.launches[-1]["params"][:3] == [q(0x1010), q(0x2020), q(0x3030)]


def test_every_scalar_kind_is_packed(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    names = ["i8", "u16", "i64", "u32", "f16", "bf16", "f32", "f64", "bool"]
    spec = A.ParamSpec(tuple(A.ScalarParam(f"s_{n}", n) for n in names))
    launcher = make_launcher(gpu, spec, [A.DTYPES[n].itemsize for n in names])
    values = [-5, 65535, -(2**40), 4000000000, 1.5, -0.3, 2.0**-20, 1e300, True]
    launcher(1, values)
    expected = [np.array(v, dtype=A.numpy_dtype(n)).tobytes() for n, v in zip(names, values)]
    assert gpu.launches[-1]["params"] == expected
    assert expected[5] == np.array(-0.3, dtype=ml_dtypes.bfloat16).tobytes()
    launcher(1, [np.int8(1), np.uint16(2), np.int64(3), np.uint32(4), np.float16(0.5), 0.25, 3, 2, False])
    assert struct.unpack("<f", gpu.launches[-1]["params"][6])[0] == 3.0


def test_derived_shape_and_stride_parameters(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    spec = A.ParamSpec((A.PointerParam("a", "f16", contiguous=False), A.DerivedParam("rows", "a", "shape", 0),
                        A.DerivedParam("cols", "a", "shape", -1),
                        A.DerivedParam("ld", "a", "stride", 0, "i64")))
    launcher = make_launcher(gpu, spec, [8, 4, 4, 8])
    launcher(1, (FakeDLPack(0x4000, (6, 10), "f16", strides=(16, 1)),))
    expected = [struct.pack("<i", 6), struct.pack("<i", 10), struct.pack("<q", 16)]
    assert gpu.launches[-1]["params"][1:] == expected
    with pytest.raises(LaunchError) as exc:
        launcher(1, (0x4000,))  # a raw address has no shape
    assert exc.value.code == A.ARG_KIND


def test_tensor_map_parameters(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    encoded = []

    def fake_make(spec, ptr, owner=None, device=None, validated=False):
        encoded.append((spec, ptr))
        return TensorMap(spec, ptr, bytes([len(encoded)]) * 128)

    monkeypatch.setattr(launcher_module, "make_tensor_map", fake_make)
    spec = A.ParamSpec((TensorMapParam("a", "f16", (64, 64), swizzle=Swizzle.B128, readonly=True),
                        A.DerivedParam("k", "a", "shape", 1)))
    launcher = make_launcher(gpu, spec, [128, 4])
    a = FakeDLPack(0x7000_0000_0000, (256, 512), "f16")
    launcher(1, (a,))
    launcher(1, (a,))
    assert len(encoded) == 1  # cached per (pointer, shape, strides)
    tspec, ptr = encoded[0]
    assert ptr == 0x7000_0000_0000 and tspec.global_shape == (256, 512) and tspec.global_strides == (1024, 2)
    assert tspec.box_shape == (64, 64) and tspec.swizzle == Swizzle.B128
    assert gpu.launches[-1]["params"] == [b"\x01" * 128, struct.pack("<i", 512)]
    host = np.zeros((64, 64), dtype=np.float16)
    launcher(1, (host,))  # host memory: copied, map built over the device copy
    assert encoded[-1][1] in gpu.memory and encoded[-1][0].global_shape == (64, 64)
    prebuilt = TensorMap(TensorMapSpec("f16", (32, 64), (128, 2), (64, 64), swizzle=Swizzle.B128), 0x9000,
                         b"\xab" * 128)
    launcher(1, (prebuilt,))
    assert gpu.launches[-1]["params"] == [b"\xab" * 128, struct.pack("<i", 64)]
    for other, what in ((TensorMapSpec("f16", (32, 64), (128, 2), (32, 64), swizzle=Swizzle.B128), "box (32, 64)"),
                        (TensorMapSpec("f16", (32, 64), (128, 2), (64, 64)), "swizzle NONE"),
                        (TensorMapSpec("bf16", (32, 64), (128, 2), (64, 64), swizzle=Swizzle.B128), "BFLOAT16")):
        with pytest.raises(LaunchError) as exc:  # a map of another box, swizzle or dtype: the kernel would
            launcher(1, (TensorMap(other, 0x9000, b"\xcd" * 128),))  # read its boxes as its own
        assert exc.value.code == A.TENSOR_MAP and "the tensor map passed for `a` was encoded for" in str(exc.value)
        assert what in str(exc.value) and gpu.launches[-1]["params"][0] == b"\xab" * 128
    with pytest.raises(LaunchError) as exc:
        launcher(1, (FakeDLPack(0x7000_0000_0000, (512,), "f16"),))
    assert exc.value.code == A.ARG_SHAPE


@pytest.mark.parametrize("cluster,pdl", [((2, 1, 1), False), ((1, 1, 1), True), ((2, 1, 1), True)])
def test_cluster_and_pdl_launches_use_launch_kernel_ex(monkeypatch, cluster, pdl):
    gpu = EmulatedGpu(monkeypatch)
    seen = []
    cluster_id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    pdl_id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

    def launch_ex(config, f, params, extra):
        attrs = [(a.id, (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z) if a.id == cluster_id
                  else a.value.programmaticStreamSerializationAllowed) for a in config.attrs[:config.numAttrs]]
        seen.append(((config.gridDimX, config.gridDimY, config.gridDimZ),
                     (config.blockDimX, config.blockDimY, config.blockDimZ), config.sharedMemBytes,
                     int(config.hStream), config.numAttrs, attrs, gpu.read_params(params, [8])))
        return (OK,)

    spec = A.ParamSpec((A.PointerParam("out", "u32"),))
    launcher = Launcher(FakeFunction(), spec, num_warps=2, cluster=cluster, dynamic_shared=4096, pdl=pdl)
    launcher._launch_kernel_ex = launch_ex
    launcher((8, 2), (0xA000,), stream=7)
    grid, block, smem, stream, nattrs, attrs, params = seen[-1]
    assert grid == (8, 2, 1) and block == (64, 1, 1) and smem == 4096 and stream == 7
    expected = ([(cluster_id, cluster)] if cluster != (1, 1, 1) else []) + ([(pdl_id, 1)] if pdl else [])
    assert nattrs == len(expected) and attrs == expected and params == [q(0xA000)]
    if cluster != (1, 1, 1):
        with pytest.raises(LaunchError) as exc:
            launcher(7, (0xA000,))
        assert exc.value.code == A.CLUSTER


def test_pdl_option_is_checked():
    spec = A.ParamSpec(())
    with pytest.raises(LaunchError) as exc:
        Launcher(FakeFunction(), spec, pdl=1)
    assert exc.value.code == A.PDL and str(exc.value).startswith("error[SP0726]: pdl must be True or False, got")
    ampere = FakeModule()
    ampere.device = dataclasses.replace(H200, name="NVIDIA A100", compute_capability=(8, 0), max_cluster_size=1)
    Launcher(FakeFunction(module=ampere), spec)
    with pytest.raises(LaunchError) as exc:
        Launcher(FakeFunction(module=ampere), spec, pdl=True)
    assert exc.value.code == A.PDL
    assert exc.value.message == ("programmatic dependent launch (pdl=True) needs compute capability 9.0 or later; "
                                 "NVIDIA A100 is sm_80")
    assert "launch without pdl=True" in exc.value.help


def test_construction_checks():
    spec = A.ParamSpec(())
    fn = FakeFunction()
    Launcher(fn, spec, dynamic_shared=100 * 1024)
    assert fn.dynamic == [102400]
    for kwargs, code in (({"dynamic_shared": 232448}, A.SHARED_MEMORY), ({"num_warps": 33}, A.BLOCK),
                         ({"cluster": (3, 3, 1)}, A.CLUSTER)):
        with pytest.raises(LaunchError) as exc:
            Launcher(FakeFunction(), spec, **kwargs)
        assert exc.value.code == code
    limited = FakeFunction(attributes=dataclasses.replace(ATTRS, max_threads_per_block=256))
    with pytest.raises(LaunchError) as exc:
        Launcher(limited, spec, num_warps=16)
    assert exc.value.code == A.BLOCK and "register usage" in str(exc.value)
    needs_cluster = FakeFunction(attributes=dataclasses.replace(ATTRS, required_cluster=(2, 1, 1)))
    with pytest.raises(LaunchError) as exc:
        Launcher(needs_cluster, spec)
    assert exc.value.code == A.CLUSTER and "compiled for cluster (2, 1, 1)" in str(exc.value)


@pytest.mark.parametrize("args,kwargs,launch_kw,code", [
    ((FakeDLPack(0x10, (4,), "f16"),) * 3 + (4,), None, {}, A.ARG_DTYPE),
    ((FakeDLPack(0x10, (4,), "f32"),) * 3, None, {}, A.ARG_COUNT),
    ((FakeDLPack(0x10, (4,), "f32"),) * 3 + (4,), {"m": 1}, {}, A.ARG_KEYWORD),
    ((FakeDLPack(0x10, (4,), "f32"),) * 3 + (2**31,), None, {}, A.ARG_RANGE),
    ((FakeDLPack(0x10, (4,), "f32"),) * 3 + (4, 64), None, {}, A.CONSTEXPR),
    ((FakeDLPack(0x10, (4,), "f32", device_id=1),) * 3 + (4,), None, {}, A.ARG_DEVICE),
    ((FakeDLPack(0x10, (4,), "f32", device_type=4),) * 3 + (4,), None, {}, A.ARG_DEVICE),
    ((FakeDLPack(0x10, (4, 4), "f32", strides=(1, 4)),) * 3 + (4,), None, {}, A.ARG_CONTIGUOUS),
    ((FakeDLPack(0x10, (4,), "f32"),) * 3 + (4,), None, {"stream": -3}, A.STREAM),
    (("x", "y", "z", 4), None, {}, A.ARG_KIND),
    ((FakeDLPack(0x10, (4,), "f32"),) * 3 + (4.0,), None, {}, A.ARG_DTYPE),
])
def test_launch_errors(monkeypatch, args, kwargs, launch_kw, code):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    with pytest.raises(LaunchError) as exc:
        launcher(1, args, kwargs, **launch_kw)
    assert exc.value.code == code
    assert not gpu.launches


def test_grid_errors_and_callable_grids(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    args = (0x10, 0x20, 0x30, 1000)
    for grid in (None, -1, (1, -1), (2**31, 1, 1), (1, 70000), (0, 70000), (1.0,), (1, 1, 1, 1)):
        with pytest.raises(LaunchError) as exc:
            launcher(grid, args)
        assert exc.value.code == A.GRID
    launcher(lambda meta: (meta["n"] + 127) // 128, args)
    assert gpu.launches[-1]["grid"] == (8, 1, 1)
    launcher((3, 2), args)
    launcher((3, 2), args)  # cached grid
    assert gpu.launches[-1]["grid"] == (3, 2, 1)


def test_host_arrays_can_be_refused_and_are_freed_on_errors(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    strict = make_launcher(gpu, VADD, [8, 8, 8, 4], allow_host_copies=False)
    with pytest.raises(LaunchError) as exc:
        strict(1, (np.zeros(4, np.float32), 0x20, 0x30, 4))
    assert exc.value.code == A.ARG_HOST_MEMORY and "allow_host_copies" in exc.value.help
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    with pytest.raises(LaunchError) as exc:
        launcher(1, (np.zeros(4, np.float32), np.zeros(4, np.float16), 0x30, 4))
    assert exc.value.code == A.ARG_DTYPE
    # nothing staged (the arguments are checked before the first host array is staged:
    # staging.PlanNeeded; x was staged, then freed, before), nothing launched
    assert gpu.freed == [] and not gpu.launches
    launcher(1, (0x10, 0x20, np.zeros(8, np.float32)[::2], 4))  # a strided one is staged by value
    assert len(gpu.launches) == 1
    with pytest.raises(LaunchError) as exc:  # (host memory the launcher cannot view)
        A.check_array_argument("x", "f32", A.describe_array(np.zeros(4, "f4"))._replace(contiguous=False, host=None),
                               device=0, allow_host=True, writes=True)
    assert exc.value.code == A.ARG_CONTIGUOUS
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(LaunchError) as exc:
        launcher(1, (0x10, 0x20, frozen, 4))
    assert exc.value.code == A.READ_ONLY


def test_cuda_array_interface_device_and_stream(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    waits = []
    monkeypatch.setattr(launcher_module, "stream_wait",
                        lambda state, consumer, producer: waits.append((consumer, producer)))
    monkeypatch.setattr(launcher_module, "pointer_device", lambda ptr: 0)
    x = FakeCai(0x1000, (4,), "<f4", stream=1)  # legacy default stream == our stream 0: no wait
    y = FakeCai(0x2000, (4,), "<f4", stream=0x99)
    launcher(1, (x, y, 0x3000, 4))
    assert waits == [(0, 0x99)]
    monkeypatch.setattr(launcher_module, "pointer_device", lambda ptr: 1)
    with pytest.raises(LaunchError) as exc:
        launcher(1, (x, y, 0x3000, 4))
    assert exc.value.code == A.ARG_DEVICE and "cuda:1" in str(exc.value)
    monkeypatch.setattr(launcher_module, "pointer_device", lambda ptr: A.HOST)
    with pytest.raises(LaunchError) as exc:
        launcher(1, (x, y, 0x3000, 4))
    assert exc.value.code == A.ARG_DEVICE and "does not point to CUDA device memory" in str(exc.value)
    aligned = A.ParamSpec((A.PointerParam("p", "f32", aligned16=True),))
    strict = make_launcher(gpu, aligned, [8])
    monkeypatch.setattr(launcher_module, "pointer_device", lambda ptr: 0)
    with pytest.raises(LaunchError) as exc:
        strict(1, (FakeCai(0x1004, (4,), "<f4"),))
    assert exc.value.code == A.ARG_ALIGNMENT and "0x1004" in str(exc.value)


def test_launch_failures_retry_once_after_a_context_switch(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    results = [driver.CUresult.CUDA_ERROR_INVALID_CONTEXT, OK]
    launcher._launch_kernel = lambda *a: (results.pop(0),)
    forced_before = launcher._module.forced
    launcher(1, (0x10, 0x20, 0x30, 4))
    assert not results and launcher._module.forced > forced_before
    launcher._launch_kernel = lambda *a: (driver.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,)
    with pytest.raises(CudaError) as exc:
        launcher(1, (0x10, 0x20, 0x30, 4))
    assert exc.value.code == A.DRIVER and exc.value.call == "cuLaunchKernel"
    assert "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in str(exc.value)


def test_check_unpacks_driver_results():
    assert check("cuX", (OK,)) is None
    assert check("cuX", (OK, 5)) == 5
    assert check("cuX", (OK, 1, 2)) == (1, 2)
    with pytest.raises(CudaError) as exc:
        check("cuMemAlloc", (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None))
    assert exc.value.code == A.DRIVER and "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in str(exc.value)


@pytest.mark.skipif(runtime.has_gpu(), reason="checks the no-GPU behaviour")
def test_without_a_gpu():
    assert runtime.has_gpu() is False and runtime.device_count() == 0
    calls = (runtime.current_device, lambda: runtime.load_module(b"\x7fELF"),
             lambda: runtime.DeviceBuffer(16))
    for call in calls:
        with pytest.raises(LaunchError) as exc:
            call()
        assert exc.value.code == A.NO_GPU


@pytest.mark.skipif(runtime.has_gpu(), reason="relies on the driver library being absent")
@pytest.mark.parametrize("cluster,pdl", [((1, 1, 1), False), ((2, 1, 1), False), ((1, 1, 1), True),
                                         ((2, 1, 1), True)])
def test_driver_accepts_our_launch_arguments(cluster, pdl):
    # cuda-python converts every argument before it loads libcuda: a well-typed cuLaunchKernel /
    # cuLaunchKernelEx call fails on the missing library here, never with a TypeError.
    launcher = Launcher(FakeFunction(handle=driver.CUfunction()), VADD, cluster=cluster, pdl=pdl)
    with pytest.raises(Exception) as exc:
        launcher(2, (0x10, 0x20, 0x30, 4), stream=0x1234)
    assert type(exc.value).__name__ == "DynamicLibNotFoundError", exc.value


def test_device_info_arch():
    assert H200.arch == "sm_90"


def test_dlpack_module_is_used_for_device_buffers():
    # DeviceBuffer's DLPack export is the generic one; its struct layout is checked here on CPU.
    capsule = dlpack.export_capsule(0x1234, (3,), "f32", dlpack.DEVICE_CUDA, 0, owner=None)
    t = dlpack.read_capsule(capsule)
    assert (t.data, t.device_type, t.dtype) == (0x1234, dlpack.DEVICE_CUDA, "f32")


class FakeTorchDevice:
    def __init__(self, kind, index):
        self.type, self.index = kind, index


class FakeTorchTensor:
    """Just the torch.Tensor surface the launcher reads (installed as ``torch.Tensor``)."""

    def __init__(self, ptr, n, dtype="torch.float32", device=("cuda", 0), strides=(1,)):
        self.shape, self.dtype, self.device = (n,), dtype, FakeTorchDevice(*device)
        self._ptr, self._strides = ptr, strides

    is_cuda = property(lambda self: self.device.type == "cuda")

    def get_device(self):
        return self.device.index if self.is_cuda else -1

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def is_contiguous(self):
        return A.is_c_contiguous(self.shape, self._strides)

    def is_neg(self):
        return False

    def is_conj(self):
        return False


def test_torch_tensors_take_the_fast_path_and_fall_back_for_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(Tensor=FakeTorchTensor))
    gpu = EmulatedGpu(monkeypatch)
    spec = A.ParamSpec((A.PointerParam("x", "f32", aligned16=True), A.PointerParam("out", "f32")))
    launcher = make_launcher(gpu, spec, [8, 8])
    x, out = FakeTorchTensor(0x1000, 64), FakeTorchTensor(0x2000, 64)
    for _ in range(3):  # first call classifies the type, later calls use the fast path
        launcher(1, (x, out))
        assert gpu.launches[-1]["params"] == [q(0x1000), q(0x2000)]
    cases = [(FakeTorchTensor(0x1000, 64, "torch.float16"), A.ARG_DTYPE),
             (FakeTorchTensor(0x1004, 64), A.ARG_ALIGNMENT),
             (FakeTorchTensor(0x1000, 64, device=("cuda", 1)), A.ARG_DEVICE),
             (FakeTorchTensor(0x1000, 64, device=("mps", 0)), A.ARG_DEVICE),
             (FakeTorchTensor(0x1000, 64, strides=(2,)), A.ARG_CONTIGUOUS)]
    for bad, code in cases:
        with pytest.raises(LaunchError) as exc:
            launcher(1, (bad, out))
        assert exc.value.code == code, str(exc.value)
    host = np.arange(64, dtype=np.float32)
    cpu_tensor = FakeTorchTensor(host.ctypes.data, 64, device=("cpu", None))

    def fill_out(record):
        gpu.array(struct.unpack("<Q", record["params"][1])[0], np.float32, 64)[:] = 5.0

    gpu.kernel = fill_out
    out_host = np.zeros(64, dtype=np.float32)
    launcher(1, (cpu_tensor, FakeTorchTensor(out_host.ctypes.data, 64, device=("cpu", None))))
    assert (out_host == 5.0).all()  # CPU tensors are copied in and back like numpy arrays


def test_tensor_maps_derived_from_array_arguments(monkeypatch):
    """The code generator's ``tensor[T, rank]`` lowering: one caller argument feeds a base
    pointer, shape/stride scalars and tensor maps (built over the device copy of host arrays)."""
    gpu = EmulatedGpu(monkeypatch)
    encoded = []

    def fake_make(spec, ptr, owner=None, device=None, validated=False):
        encoded.append((spec, ptr))
        return TensorMap(spec, ptr, ptr.to_bytes(8, "little") * 16)

    monkeypatch.setattr(launcher_module, "make_tensor_map", fake_make)
    spec = A.ParamSpec((A.PointerParam("a", "f16"), A.DerivedParam("a.dim1", "a", "shape", 1),
                        TensorMapParam("a.tmap0", "f16", (64, 64), swizzle=Swizzle.B128, source="a"),
                        TensorMapParam("a.tmap1", "f16", (16, 32), source="a"), A.ArrayParam("b", "f16"),
                        TensorMapParam("b.tmap0", "f16", (8, 64), source="b")))
    assert [p.name for p in spec.user_params] == ["a", "b"]
    assert [p.name for p in spec.kernel_params] == ["a", "a.dim1", "a.tmap0", "a.tmap1", "b.tmap0"]
    launcher = make_launcher(gpu, spec, [8, 4, 128, 128, 128])
    a, b = FakeDLPack(0x7000_0000_0000, (128, 256), "f16"), FakeDLPack(0x7100_0000_0000, (32, 64), "f16")
    launcher(1, (a, b))
    params = gpu.launches[-1]["params"]
    assert params[0] == q(0x7000_0000_0000) and params[1] == struct.pack("<i", 256)
    assert params[2] == params[3] == q(0x7000_0000_0000) * 16 and params[4] == q(0x7100_0000_0000) * 16
    assert [(s.box_shape, s.swizzle, p) for s, p in encoded] == [
        ((64, 64), Swizzle.B128, 0x7000_0000_0000), ((16, 32), Swizzle.NONE, 0x7000_0000_0000),
        ((8, 64), Swizzle.NONE, 0x7100_0000_0000)]
    host_a = np.zeros((128, 256), dtype=np.float16)
    launcher(1, (host_a, b))
    staged = struct.unpack("<Q", gpu.launches[-1]["params"][0])[0]
    assert staged in gpu.memory and encoded[-2][1] == staged  # maps describe the device copy
    with pytest.raises(LaunchError) as exc:
        launcher(1, (a, np.zeros((4, 4, 4), np.float16)))
    assert exc.value.code == A.ARG_SHAPE


@pytest.mark.parametrize("params", [
    (A.ScalarParam("n", "i32"), TensorMapParam("t", "f16", (8, 64), source="n")),
    (TensorMapParam("u", "f16", (8, 64)), TensorMapParam("t", "f16", (8, 64), source="u")),
    (TensorMapParam("t", "f16", (8, 64), source="missing"),),
])
def test_bad_derived_tensor_maps_are_internal_errors(params):
    from sparsile.frontend.diagnostics import InternalError

    with pytest.raises(InternalError):
        A.ParamSpec(params)
