"""CPU tests of the fast launch paths: ``kernel[grid].prepare(...)`` (driver/prepared.py), the
fingerprint cache of ``kernel[grid](...)`` (driver/fast_launch.py), the tensor-map LRU and the
ctypes structs of backend/runtime/cudalib.py.

A fake device stands in for the GPU: the kernel is compiled for sm_90a for real (no GPU needed),
but the launcher runs on a fake ``KernelFunction`` whose launch records the bytes the driver would
read from ``kernelParams``. Device arrays are :class:`FakeCudaTensor` objects that the launcher
describes as torch CUDA tensors (the seam ``register_array_type``); they are never dereferenced.
The same launches on a real GPU are in test_prepared_gpu.py."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

import sparsile as sp
from sparsile.backend import runtime
from sparsile.backend.runtime import arguments as A
from sparsile.backend.runtime import arrays as array_args
from sparsile.backend.runtime import cudalib, devices
from sparsile.backend.runtime.tensormap import Swizzle, TensorMap, TensorMapCache, TensorMapParam
from sparsile.driver import fast_launch, launch, prepared
from sparsile.driver.prepared import PreparedLaunch
from sparsile.frontend.diagnostics import LaunchError
from sparsile.frontend.ir import types as T
from sparsile.frontend.sema.core import ArgSpec
from sparsile.frontend.sema.specialize import ParamInfo
from sparsile.frontend.sema.values import Const

torch = pytest.importorskip("torch")

OK = driver.CUresult.CUDA_SUCCESS
H200 = runtime.DeviceInfo(ordinal=0, name="NVIDIA H200", compute_capability=(9, 0), sm_count=132,
                          max_shared_per_block=49152, max_shared_per_block_optin=232448,
                          max_threads_per_block=1024, max_block_dims=(1024, 1024, 64),
                          max_grid_dims=(2**31 - 1, 65535, 65535), max_cluster_size=8, l2_size=52428800)
ATTRS = runtime.FunctionAttributes(1024, 0, 48128, 32, 0, 0, 80, 90, (0, 0, 0))
TORCH_STREAM = 0x7070

VECTOR_ADD = Path(__file__).resolve().parents[2] / "examples" / "vector_add.spk"


SCALE = 2.0  # read by scaled_copy: a captured Python global


@sp.jit
def scaled_copy(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=mask) * SCALE, mask=mask)


class FakeCudaTensor:
    """What the launcher reads of a torch CUDA tensor, over a made-up address."""

    is_cuda = True

    def __init__(self, ptr, shape, dtype=torch.float32, device=0, strides=None):
        self._ptr, self.shape, self.dtype, self._device = ptr, torch.Size(shape), dtype, device
        self._strides = tuple(strides) if strides is not None else A.dlpack.compact_strides(tuple(shape))
        self.ndim = len(shape)

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return self._device

    def dim(self):
        return self.ndim

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def is_contiguous(self):
        return A.is_c_contiguous(tuple(self.shape), self._strides)

    negated = False  # torch's negative bit (torch._neg_view): the memory holds the values before the negation

    def is_neg(self):
        return self.negated

    def is_conj(self):
        return False


class Recorder:
    """The fake driver's launch: records grid, block, stream and the parameter bytes."""

    def __init__(self):
        self.launches = []
        self.sizes = [8, 8, 8, 4]

    def __call__(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        pointers = (ctypes.c_void_p * len(self.sizes)).from_address(params)
        data = [ctypes.string_at(p, n) for p, n in zip(pointers, self.sizes)]
        self.launches.append({"grid": (gx, gy, gz), "block": (bx, by, bz), "stream": stream, "params": data})
        return (OK,)


class FakeModule:
    device = H200
    context_key = None
    _state = "state"

    def activate(self, force=False):
        pass


@pytest.fixture
def gpu(monkeypatch):
    """A fake H200: kernels compile for real, launches are recorded."""
    from sparsile.driver.compiler import compile_cached
    from sparsile.frontend.interp.host_arrays import stored_params

    recorder = Recorder()
    built = []

    def build(kernel, bindings, key, target, options, ordinal=None):
        ck = compile_cached(kernel, bindings, key, target, options)
        stores = stored_params(kernel.ir_for(bindings, key, options))
        spec = launch.param_spec(kernel, bindings, ck.params, stores)
        fn = SimpleNamespace(module=FakeModule(), attributes=ATTRS, handle=0x500,
                             set_max_dynamic_shared=lambda n: None)
        launcher = runtime.Launcher(fn, spec, num_warps=ck.num_warps, cluster=ck.cluster, pdl=ck.pdl)
        launcher._launch_kernel = recorder
        launcher.spec_has_tensormaps = any(p.kind == "tensormap" for p in spec.params)
        launcher.written = stores
        launcher.captures = kernel.captures_for(bindings, key, options)
        built.append(spec)
        return launcher

    monkeypatch.setattr(devices, "_has_gpu", True)
    monkeypatch.setattr(runtime, "current_device", lambda ordinal=None: H200)
    monkeypatch.setattr(launch, "_build_launcher", build)
    monkeypatch.setattr(fast_launch, "torch_current_stream", lambda ordinal: TORCH_STREAM)
    monkeypatch.setattr(prepared, "torch_stream_getter", lambda ordinal: lambda: TORCH_STREAM)
    monkeypatch.setitem(array_args._extractors, FakeCudaTensor, array_args._describe_torch)
    recorder.built = built
    return recorder


def vadd():
    return sp.load(VECTOR_ADD).kernels["vector_add"]


def q(v):
    return struct.pack("<Q", v)


def arrays(base=0x7F00_0000_0000, n=1024, **kw):
    return tuple(FakeCudaTensor(base + i * 0x10000, (n,), **kw) for i in range(3))


# ------------------------------------------------------------------------------------------------
# prepared launches of a compiled kernel


def test_prepared_launch_packs_fresh_arguments_per_call(gpu):
    x, y, out = arrays()
    launch_ = vadd()[(4,)].prepare(x, y, out, 1024, BLOCK=256)
    assert len(gpu.built) == 1
    x2, y2, out2 = arrays(base=0x7E00_0000_0000)
    launch_(x2, y2, out2, 2048)
    record = gpu.launches[-1]
    assert record["params"] == [q(x2.data_ptr()), q(y2.data_ptr()), q(out2.data_ptr()), struct.pack("<i", 2048)]
    assert record["grid"] == (4, 1, 1) and record["block"] == (128, 1, 1)
    assert record["stream"] == TORCH_STREAM  # torch tensors: torch's current stream by default
    launch_(x, y, out, 16, stream=5, grid=(8, 2))
    assert gpu.launches[-1]["stream"] == 5 and gpu.launches[-1]["grid"] == (8, 2, 1)
    launch_(x, y, out, 16, stream=SimpleNamespace(cuda_stream=9))
    assert gpu.launches[-1]["stream"] == 9 and gpu.launches[-1]["grid"] == (4, 1, 1)
    assert len(gpu.built) == 1  # compiled once


def test_prepared_launch_matches_kernel_grid_call(gpu):
    k = vadd()
    x, y, out = arrays()
    k[(4,)](x, y, out, 1024, BLOCK=256)
    k[(4,)].prepare(x, y, out, 1024, BLOCK=256)(x, y, out, 1024)
    assert gpu.launches[0] == gpu.launches[1]
    assert len(gpu.built) == 1  # the same launcher: one compile


@pytest.mark.parametrize(("change", "code", "message"), [
    (lambda a: (FakeCudaTensor(a[0].data_ptr(), (1024,), dtype=torch.float16), *a[1:], 1024), "SP0703",
     "argument `x` expects a pointer to f32, got a float16 torch tensor"),
    (lambda a: (a[0], FakeCudaTensor(0x7F00_0001_0000, (1024,), device=1), a[2], 1024), "SP0707",
     "argument `y` is on cuda:1 but the kernel runs on cuda:0"),
    (lambda a: (a[0], a[1], FakeCudaTensor(0x7F00_0002_0004, (1024,)), 1024), "SP0704",
     "argument `out` points to 0x7f0000020004, which is not 16-byte aligned"),
    (lambda a: (FakeCudaTensor(0x7F00_0000_0000, (32, 32), strides=(1, 32)), *a[1:], 1024), "SP0705",
     "argument `x` is not contiguous"),
    (lambda a: (*a, 1000), "SP0709", "argument `n` = 1000 is not a multiple of 16"),
    (lambda a: (*a, 2**31), "SP0709", "argument `n` = 2147483648 does not fit in i32"),
    (lambda a: (*a, 1.5), "SP0703", "argument `n` expects an integer (i32), got float 1.5"),
    (lambda a: (*a,), "SP0732", "this prepared launch of `vector_add` takes 4 arguments, got 3"),
    (lambda a: (np.zeros(1024, np.float32), *a[1:], 1024), "SP0733",
     "argument `x` is a numpy array in host memory, but a prepared launch uses device memory in place only"),
    (lambda a: ("x", *a[1:], 1024), "SP0708", "argument `x` expects an array of f32, got str"),
])
def test_prepared_launch_refuses_arguments_that_break_the_specialization(gpu, change, code, message):
    args = arrays()
    launch_ = vadd()[(4,)].prepare(*args, 1024, BLOCK=256)
    with pytest.raises(LaunchError) as exc:
        launch_(*change(args))
    assert exc.value.code == code and message in str(exc.value)
    launch_(*args, 1024)  # still usable afterwards
    assert gpu.launches[-1]["params"][3] == struct.pack("<i", 1024)


def test_prepared_launch_checks_constexprs_stream_and_grid(gpu):
    x, y, out = arrays()
    launch_ = vadd()[(4,)].prepare(x, y, out, 1024, 256)  # BLOCK positional: checked per call
    launch_(x, y, out, 32, 256)
    with pytest.raises(LaunchError) as exc:
        launch_(x, y, out, 32, 128)
    assert exc.value.code == "SP0718" and "the launch was prepared for BLOCK = int 256" in str(exc.value)
    with pytest.raises(LaunchError) as exc:
        launch_(x, y, out, 32, 256, stream=-1)
    assert exc.value.code == "SP0717"
    with pytest.raises(LaunchError) as exc:
        launch_(x, y, out, 32, 256, grid=(-1,))
    assert exc.value.code == "SP0710"


class _Opaque:
    """A constexpr-like value whose repr is only its type and address."""


@pytest.mark.parametrize(("value", "shown"), [
    (_Opaque(), "a `_Opaque` object"),
    (np.zeros((2, 3), np.float32), "a float32 numpy array of shape (2, 3)"),
    (128, "int 128"),
])
def test_sp0718_describes_the_value_not_its_address(gpu, value, shown):
    x, y, out = arrays()
    launch_ = vadd()[(4,)].prepare(x, y, out, 1024, 256)  # BLOCK positional: checked per call
    with pytest.raises(LaunchError) as exc:
        launch_(x, y, out, 32, value)
    assert exc.value.code == "SP0718" and " at 0x" not in str(exc.value)
    assert exc.value.message == f"argument `BLOCK` = {shown}, but the launch was prepared for BLOCK = int 256"


def test_prepared_launch_vary_drops_the_divisibility_assumption(gpu):
    x, y, out = arrays()
    launch_ = vadd()[(4,)].prepare(x, y, out, 1024, BLOCK=256, vary=("n", "x"))
    launch_(FakeCudaTensor(0x7F00_0000_0004, (1024,)), y, out, 1001)
    assert gpu.launches[-1]["params"][0] == q(0x7F00_0000_0004)
    assert gpu.launches[-1]["params"][3] == struct.pack("<i", 1001)
    with pytest.raises(LaunchError) as exc:
        vadd()[(4,)].prepare(x, y, out, 1024, BLOCK=256, vary=("BLOCK",))
    assert exc.value.code == "SP0734" and "vary= names `BLOCK`, which is not a run-time parameter" in str(exc.value)
    with pytest.raises(LaunchError) as exc:
        vadd()[(4,)].prepare(x, y, out, 1024, BLOCK=256, vary=3)
    assert exc.value.code == "SP0734"


def test_prepared_launch_fixed_keyword_arguments(gpu):
    x, y, out = arrays()
    launch_ = vadd()[(1,)].prepare(x, y, out=out, n=64, BLOCK=64)
    x2 = FakeCudaTensor(0x7D00_0000_0000, (64,))
    launch_(x2, y)
    assert gpu.launches[-1]["params"] == [q(x2.data_ptr()), q(y.data_ptr()), q(out.data_ptr()), struct.pack("<i", 64)]


def test_prepared_launch_per_call_names_the_changing_arguments(gpu):
    """per_call= makes out and x (in that order) the per-call arguments; y and n stay as prepared
    and are not checked again."""
    x, y, out = arrays()
    launch_ = vadd()[(1,)].prepare(x, y, out, 64, BLOCK=64, per_call=("out", "x"))
    assert launch_.nargs == 2
    x2, out2 = FakeCudaTensor(0x7D00_0000_0000, (64,)), FakeCudaTensor(0x7C00_0000_0000, (64,))
    launch_(out2, x2)
    assert gpu.launches[-1]["params"] == [q(x2.data_ptr()), q(y.data_ptr()), q(out2.data_ptr()),
                                          struct.pack("<i", 64)]
    with pytest.raises(LaunchError) as exc:
        launch_(x2)
    assert exc.value.code == "SP0732"
    with pytest.raises(LaunchError) as exc:
        launch_(out2, FakeCudaTensor(0x7D00_0000_0004, (64,)))  # x was specialized 16-byte aligned
    assert exc.value.code == "SP0704"
    for bad, message in ((("BLOCK",), "per_call= names `BLOCK`, which is not a run-time parameter"),
                         (("x", "x"), "per_call= names `x` twice"),
                         (3, "per_call= takes parameter names")):
        with pytest.raises(LaunchError) as exc:
            vadd()[(1,)].prepare(x, y, out, 64, BLOCK=64, per_call=bad)
        assert exc.value.code == "SP0734" and message in str(exc.value)


def test_prepared_launch_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(devices, "_has_gpu", False)
    monkeypatch.setattr(runtime, "has_gpu", lambda: False)
    with pytest.raises(LaunchError) as exc:
        vadd()[(1,)].prepare(0, 0, 0, 1, BLOCK=16)
    assert exc.value.code == "SP0731"


# ------------------------------------------------------------------------------------------------
# the fingerprint cache of kernel[grid](...)


def test_kernel_grid_calls_reuse_the_fast_entry(gpu, monkeypatch):
    k = vadd()
    x, y, out = arrays()
    k[(4,)](x, y, out, 1024, BLOCK=256)
    binds = []
    real_bind = k.bind
    monkeypatch.setattr(k, "bind", lambda *a: binds.append(a) or real_bind(*a))
    x2, y2, out2 = arrays(base=0x7C00_0000_0000)
    k[(4,)](x2, y2, out2, 4096, BLOCK=256)
    k[lambda meta: (4096 // meta["BLOCK"],)](x2, y2, out2, 4096, BLOCK=256)
    assert not binds  # neither call bound nor specialized again
    assert gpu.launches[-2]["params"] == [q(x2.data_ptr()), q(y2.data_ptr()), q(out2.data_ptr()),
                                          struct.pack("<i", 4096)]
    assert gpu.launches[-1]["grid"] == (16, 1, 1) and gpu.launches[-1]["stream"] == TORCH_STREAM
    k[(4,)](x2, y2, out2, 1000, BLOCK=256)  # another fingerprint (not a multiple of 16): the full path
    assert len(binds) == 1 and len(gpu.built) == 2
    k[(4,)](x2, y2, out2, 1000, BLOCK=256)
    assert len(binds) == 1
    k.options["num_warps"] = 8  # options changed: entries are dropped
    k[(4,)](x2, y2, out2, 1000, BLOCK=256)
    assert len(binds) == 2 and gpu.launches[-1]["block"] == (256, 1, 1)
    with pytest.raises(LaunchError) as exc:  # the launcher still checks every argument
        k[(4,)](x2, y2, FakeCudaTensor(0x7C00_0002_0000, (1024,), device=1), 1000, BLOCK=256)
    assert exc.value.code == "SP0707"


def test_kernel_grid_run_time_keyword_takes_the_full_path(gpu):
    k = vadd()
    x, y, out = arrays()
    k[(4,)](x, y, out, n=1024, BLOCK=256)
    k[(4,)](x, y, out, n=1024, BLOCK=256)
    assert not k.__dict__["_fast_launches"].entries
    assert gpu.launches[0] == gpu.launches[1]


def test_a_changed_global_is_never_launched_stale(gpu, monkeypatch):
    gpu.sizes = [8, 8, 4]  # x, out, n
    x, _, out = arrays()
    launch_ = scaled_copy[(4,)].prepare(x, out, 1024, BLOCK=256)
    scaled_copy[(4,)](x, out, 1024, BLOCK=256)
    scaled_copy[(4,)](x, out, 1024, BLOCK=256)  # the fast entry
    assert len(gpu.built) == 1
    monkeypatch.setitem(globals(), "SCALE", 3.0)
    with pytest.raises(LaunchError) as exc:
        launch_(x, out, 1024)
    assert exc.value.code == "SP0735" and "changed after this launch was prepared" in str(exc.value)
    scaled_copy[(4,)](x, out, 1024, BLOCK=256)  # kernel[grid] compiles for the new value
    assert len(gpu.built) == 2
    scaled_copy[(4,)].prepare(x, out, 1024, BLOCK=256)(x, out, 1024)
    assert len(gpu.built) == 2


# ------------------------------------------------------------------------------------------------
# tensor maps


def test_tensor_map_cache_is_an_lru():
    cache = TensorMapCache(2)
    a, b, c = (bytes([i]) * 128 for i in range(3))
    cache.put("a", a)
    cache.put("b", b)
    assert cache.get("a") == a  # now most recent: b is evicted next
    cache.put("c", c)
    assert "b" not in cache and cache.get("a") == a and cache.get("c") == c and len(cache) == 2
    assert cache.get("b") is None and (cache.hits, cache.misses) == (3, 1)
    with pytest.raises(ValueError, match="128 bytes"):
        cache.put("d", b"\0" * 64)
    with pytest.raises(ValueError):
        TensorMapCache(0)


def tma_launch(monkeypatch, encoded, box=(64, 64), cache_size=8, aligned16=True, per_call=(0, 1), grid=(1,)):
    """A prepared launch of a hand-made spec on ``grid``: tensor ``a`` (pointer, shape, stride,
    tensor map), ``k``; ``per_call``: the per-call parameters (indices of a, k)."""
    def fake_make(spec, ptr, owner=None, device=None, validated=False):
        encoded.append((spec, ptr))
        return TensorMap(spec, ptr, bytes([len(encoded)]) * 128)

    monkeypatch.setattr(runtime, "make_tensor_map", fake_make)
    monkeypatch.setattr(prepared, "SHARED_MAPS", TensorMapCache(cache_size))
    spec = A.ParamSpec((A.PointerParam("a", "f16", aligned16=aligned16, readonly=True),
                        A.DerivedParam("a.tensor_dim0", "a", "shape", 0), A.DerivedParam("a.tensor_stride0", "a",
                                                                                           "stride", 0),
                        TensorMapParam("a.tmap0", "f16", box, swizzle=Swizzle.B128, readonly=True),
                        A.ScalarParam("k", "i32")), kernel_name="tma")
    fn = SimpleNamespace(module=FakeModule(), attributes=ATTRS, handle=0x500, set_max_dynamic_shared=lambda n: None)
    launcher = runtime.Launcher(fn, spec, num_warps=4)
    recorder = Recorder()
    recorder.sizes = [8, 4, 4, 128, 4]
    launcher._launch_kernel = recorder
    kernel = SimpleNamespace(name="tma", params=[ParamInfo("a", T.TensorType(T.f16, 2)), ParamInfo("k", T.i32),
                                                 ParamInfo("BK", T.CONSTEXPR)])
    bindings = {"a": ArgSpec.of(T.TensorType(T.f16, 2), aligned16), "k": ArgSpec.of(T.i32, False), "BK": Const(64)}
    a = FakeCudaTensor(0x7A00_0000_0000, (256, 512), dtype=torch.float16)
    monkeypatch.setitem(array_args._extractors, FakeCudaTensor, array_args._describe_torch)
    monkeypatch.setattr(prepared, "torch_stream_getter", lambda ordinal: lambda: 0)
    made = PreparedLaunch(kernel, launcher, {"a": a, "k": 3, "BK": 64}, bindings, list(per_call), grid)
    return made, recorder, a


def test_prepared_tensor_maps_are_encoded_once_per_layout(monkeypatch):
    encoded = []
    made, recorder, a = tma_launch(monkeypatch, encoded)
    made(a, 7)
    made(a, 8)
    assert len(encoded) == 1  # at prepare time, then reused (the slot is not even rewritten)
    spec, ptr = encoded[0]
    assert ptr == a.data_ptr() and spec.global_shape == (256, 512) and spec.global_strides == (1024, 2)
    assert spec.box_shape == (64, 64) and spec.swizzle == Swizzle.B128
    params = recorder.launches[-1]["params"]
    assert params == [q(a.data_ptr()), struct.pack("<i", 256), struct.pack("<i", 512), b"\x01" * 128,
                      struct.pack("<i", 8)]
    moved = FakeCudaTensor(0x7A00_0010_0000, (128, 512), dtype=torch.float16)
    made(moved, 8)
    assert len(encoded) == 2 and recorder.launches[-1]["params"][1:4] == [struct.pack("<i", 128),
                                                                         struct.pack("<i", 512), b"\x02" * 128]
    made(a, 8)  # back to the first layout: from the shared cache, not re-encoded
    assert len(encoded) == 2 and recorder.launches[-1]["params"][3] == b"\x01" * 128
    tma_launch(monkeypatch, encoded)  # a fresh shared cache: encodes again
    assert len(encoded) == 3
    with pytest.raises(LaunchError) as exc:
        made(FakeCudaTensor(0x7A00_0000_0000, (256 * 512,), dtype=torch.float16), 8)
    assert exc.value.code == "SP0720" and "prepared for a rank-2 tensor" in str(exc.value)


def test_prepared_tensor_map_layout_is_validated_once_and_addresses_per_encoding(monkeypatch):
    encoded = []
    made, recorder, _ = tma_launch(monkeypatch, encoded, aligned16=False)
    moved = FakeCudaTensor(0x7A00_0040_0000, (256, 512), dtype=torch.float16)
    made(moved, 1)
    assert len(encoded) == 2 and encoded[1][0] is encoded[0][0]  # the same layout: its spec is reused
    with pytest.raises(LaunchError) as exc:
        made(FakeCudaTensor(0x7A00_0050_0008, (256, 512), dtype=torch.float16), 1)
    assert exc.value.code == "SP0714" and str(exc.value).startswith(
        "error[SP0714]: the tensor map of argument `a` is invalid: global address 0x7a0000500008 is not 16-byte "
        "aligned")
    with pytest.raises(LaunchError) as exc:
        made(FakeCudaTensor(0x7A00_0060_0000, (256, 500), dtype=torch.float16), 1)
    assert exc.value.code == "SP0714" and "global stride of dimension 0 = 1000 bytes is not a multiple of 16" in \
        str(exc.value)
    made(moved, 2)  # still usable: every slot describes `moved` again, its map not re-encoded
    assert len(encoded) == 2
    assert recorder.launches[-1]["params"] == [q(moved.data_ptr()), struct.pack("<i", 256), struct.pack("<i", 512),
                                               b"\x02" * 128, struct.pack("<i", 2)]


def test_prepared_tensor_maps_are_shared_and_evicted_least_recently_used(monkeypatch):
    encoded = []
    made, _, a = tma_launch(monkeypatch, encoded, cache_size=2)
    cache = prepared.SHARED_MAPS
    assert len(cache) == 1
    b = FakeCudaTensor(0x7A00_0020_0000, (256, 512), dtype=torch.float16)
    c = FakeCudaTensor(0x7A00_0030_0000, (256, 512), dtype=torch.float16)
    made(b, 1)
    made(c, 1)  # a is the least recently used: evicted
    assert len(encoded) == 3 and len(cache) == 2
    made(b, 1)
    assert len(encoded) == 3
    made(a, 1)
    assert len(encoded) == 4 and encoded[-1][1] == a.data_ptr()
    key_box = [k[-1] for k in cache._entries]
    assert all(k[1] == (64, 64) for k in key_box)  # keyed by the box and swizzle too


# ------------------------------------------------------------------------------------------------
# libcuda through ctypes


def test_ctypes_launch_structs_match_cuda_bindings():
    mine = cudalib.launch_config((288, 1, 1), 41024, cudalib.attribute_list((2, 1, 1), True))
    mine.gridDimX, mine.gridDimY, mine.gridDimZ, mine.hStream = 5, 6, 7, 0x1234
    theirs = driver.CUlaunchConfig()
    theirs.gridDimX, theirs.gridDimY, theirs.gridDimZ = 5, 6, 7
    theirs.blockDimX, theirs.blockDimY, theirs.blockDimZ = 288, 1, 1
    theirs.sharedMemBytes, theirs.hStream = 41024, 0x1234
    cluster = driver.CUlaunchAttribute()
    cluster.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = 2, 1, 1
    pdl = driver.CUlaunchAttribute()
    pdl.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    pdl.value.programmaticStreamSerializationAllowed = 1
    theirs.attrs, theirs.numAttrs = [cluster, pdl], 2
    assert ctypes.sizeof(cudalib.LaunchConfig) == 56 and ctypes.sizeof(cudalib.LaunchAttribute) == 72
    raw_mine, raw_theirs = ctypes.string_at(ctypes.addressof(mine), 56), ctypes.string_at(theirs.getPtr(), 56)
    assert raw_mine[:40] == raw_theirs[:40] and raw_mine[48:52] == raw_theirs[48:52]  # 40..48: the attrs pointer
    their_attrs = ctypes.c_void_p.from_address(theirs.getPtr() + cudalib.LaunchConfig.attrs.offset).value
    assert ctypes.cast(mine.attrs, ctypes.c_void_p).value == ctypes.addressof(mine._attributes)
    assert ctypes.string_at(ctypes.addressof(mine._attributes), 144) == ctypes.string_at(their_attrs, 144)
    assert cudalib.attribute_list((1, 1, 1), False) == []
    assert [a.id for a in cudalib.attribute_list((1, 1, 1), True)] == [cudalib.PROGRAMMATIC_STREAM_SERIALIZATION]


def test_launcher_routes_launches_through_libcuda(monkeypatch):
    calls = []

    def raw_launch(*args):
        calls.append(args)
        return (OK,)

    monkeypatch.setattr(cudalib, "_library", SimpleNamespace(cuLaunchKernel=raw_launch, cuLaunchKernelEx=None,
                                                            cuTensorMapEncodeTiled=None))
    monkeypatch.setattr(cudalib, "_tried", True)
    fn = runtime.KernelFunction(FakeModule(), "k", driver.CUfunction(0x500))
    fn._attributes = ATTRS
    launcher = runtime.Launcher(fn, A.ParamSpec((A.PointerParam("x", "f32"),)), num_warps=1)
    launcher(3, (0x1000,), stream=7)
    assert calls and calls[-1][:9] == (0x500, 3, 1, 1, 32, 1, 1, 0, 7)
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda *a: (OK,))  # a patched binding is respected
    assert runtime.Launcher(fn, A.ParamSpec((A.PointerParam("x", "f32"),)), num_warps=1)._launch_kernel \
        is driver.cuLaunchKernel


def test_prepared_pdl_launch_passes_the_attribute_through_cuda_bindings(gpu, monkeypatch):
    """A prepared launch of a ``pdl=True`` launcher (here forced on a kernel compiled without it)
    launches through cuda.bindings' cuLaunchKernelEx with programmatic stream serialization, the
    same parameter bytes as a plain launch, its grid and stream."""
    seen = []
    pdl_id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION

    def launch_ex(config, f, params, extra):
        pointers = (ctypes.c_void_p * 4).from_address(params)
        data = [ctypes.string_at(p, n) for p, n in zip(pointers, [8, 8, 8, 4])]
        seen.append(((config.gridDimX, config.gridDimY, config.gridDimZ), int(config.hStream), config.numAttrs,
                     [(a.id, a.value.programmaticStreamSerializationAllowed) for a in config.attrs], data))
        return (OK,)

    kernel = vadd()
    monkeypatch.setitem(kernel.__dict__, "_launchers", {})  # a launcher of its own, forgotten afterwards
    monkeypatch.setattr(driver, "cuLaunchKernelEx", launch_ex)
    real = runtime.Launcher
    monkeypatch.setattr(runtime, "Launcher", lambda *args, **kwargs: real(*args, **{**kwargs, "pdl": True}))
    x, y, out = arrays()
    made = kernel[(4,)].prepare(x, y, out, 1024, BLOCK=256)
    made(x, y, out, 992, stream=0x42)
    assert seen == [((4, 1, 1), 0x42, 1, [(pdl_id, 1)], [q(x.data_ptr()), q(y.data_ptr()), q(out.data_ptr()),
                                                          struct.pack("<i", 992)])]
    assert gpu.launches == []  # nothing went through cuLaunchKernel


@pytest.mark.parametrize("cluster", [(1, 1, 1), (2, 1, 1)])
def test_pdl_launches_go_through_raw_cuLaunchKernelEx(monkeypatch, cluster):
    """With libcuda's raw entry points a ``pdl=True`` launcher and its prepared launches pass ctypes
    configs (each its own) whose attributes are the cluster's (if any), then programmatic stream
    serialization."""
    calls = []

    def raw_launch_ex(config, f, params, extra):
        attrs = [(config.attrs[i].id, tuple(config.attrs[i].value[:3])) for i in range(config.numAttrs)]
        calls.append((id(config), (config.gridDimX, config.gridDimY, config.gridDimZ),
                      (config.blockDimX, config.blockDimY, config.blockDimZ), config.hStream, attrs, f, params))
        return (OK,)

    monkeypatch.setattr(cudalib, "_library", SimpleNamespace(cuLaunchKernel=None, cuLaunchKernelEx=raw_launch_ex,
                                                            cuTensorMapEncodeTiled=None))
    monkeypatch.setattr(cudalib, "_tried", True)
    monkeypatch.setitem(array_args._extractors, FakeCudaTensor, array_args._describe_torch)
    fn = runtime.KernelFunction(FakeModule(), "k", driver.CUfunction(0x500))
    fn._attributes = ATTRS
    spec = A.ParamSpec((A.PointerParam("x", "f32"),))
    launcher = runtime.Launcher(fn, spec, num_warps=1, cluster=cluster, pdl=True)
    assert isinstance(launcher._config, cudalib.LaunchConfig)
    launcher(4, (0x1000,), stream=7)
    expected = ([(cudalib.CLUSTER_DIMENSION, cluster)] if cluster != (1, 1, 1) else []) + \
        [(cudalib.PROGRAMMATIC_STREAM_SERIALIZATION, (1, 0, 0))]
    assert calls[-1][1:6] == ((4, 1, 1), (32, 1, 1), 7, expected, 0x500)
    kernel = SimpleNamespace(name="k", params=[ParamInfo("x", T.PointerType(T.f32))])
    x = FakeCudaTensor(0x7F00_0000_0000, (16,))
    made = PreparedLaunch(kernel, launcher, {"x": x}, {"x": ArgSpec.of(T.PointerType(T.f32), True)}, [0], (2,))
    made(x, stream=9)
    assert calls[-1][1:6] == ((2, 1, 1), (32, 1, 1), 9, expected, 0x500)
    assert calls[-1][0] != calls[0][0] and made._config is not launcher._config  # its own config


def test_fast_entry_falls_back_to_the_launcher_for_host_arrays():
    calls = []

    class HostOnce:
        def run(self, args, stream=None, grid=None):
            raise LaunchError("SP0733", "host memory")

    entry = fast_launch.FastEntry(lambda grid, values, stream=None: calls.append((grid, values, stream)),
                                  lambda args: args[0], True, (), {"BLOCK": 4}, False, HostOnce())
    entry.launch(lambda meta: (meta["BLOCK"],), ("host array",), 3)
    assert calls == [((4,), ("host array",), 3)]

    class Refuses:
        def run(self, args, stream=None, grid=None):
            raise LaunchError("SP0707", "another device")

    entry.prepared = Refuses()
    with pytest.raises(LaunchError) as exc:  # any other diagnostic is the user's
        entry.launch((1,), ("x",), None)
    assert exc.value.code == "SP0707" and len(calls) == 1


def test_device_buffer_dtypes_are_language_dtypes():
    from sparsile.frontend.sema.specialize import dtype_of

    assert dtype_of(SimpleNamespace(dtype="i8", shape=(4,))) == T.i8  # numpy would read "i8" as int64
    assert dtype_of(SimpleNamespace(dtype="f16", shape=(4,))) == T.f16  # and "f16" as float128
    assert dtype_of(np.zeros(2, np.int64)) == T.i64


# ------------------------------------------------------------------------------------------------
# benchmarks/bench_launch.py on the CPU


def bench_launch_module():
    from sparsile.tests.support import load_script

    return load_script("benchmarks/bench_launch.py", "bench_script_launch", register=True)


def test_bench_launch_arguments_table_and_no_gpu(capsys):
    bench = bench_launch_module()
    args = bench.parse_args(["--tokens", "4", "--features", "128"])
    assert (args.tokens, args.features, args.calls, args.no_gemm) == (4, 128, 200, False)
    with pytest.raises(SystemExit):
        bench.parse_args(["--features", "100"])
    table = bench.format_rows([("empty", "prepare()d launch", 2.5, 3.25), ("vector add 1024", "kernel[grid]", 4, 5)])
    lines = table.splitlines()
    assert lines[0].split()[-2:] == ["us", "us/call"] and lines[1].endswith("2.50      3.25")
    if torch.cuda.is_available():
        return
    assert bench.main([]) == 2 and "needs an NVIDIA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("value", [None, "0", "yes"])
def test_calls_stay_on_cuda_bindings_unless_raw_driver_is_1(monkeypatch, value):
    from sparsile.backend.runtime import cudalib

    if value is None:
        monkeypatch.delenv("SPARSILE_RAW_DRIVER", raising=False)
    else:
        monkeypatch.setenv("SPARSILE_RAW_DRIVER", value)
    monkeypatch.setattr(cudalib, "_tried", False)
    monkeypatch.setattr(cudalib, "_library", None)
    assert cudalib.library() is None
    assert cudalib.raw("cuLaunchKernel") is None


def test_an_untyped_integer_past_i32_after_one_at_the_edge_is_an_i64_launch(gpu):
    """-2**31 fits i32 and -2**31 - 16 does not, with the same bit_length(), sign and divisibility:
    the fast entry of the first made the second an i32 launch the launcher refused (SP0709)."""
    k = sp.loads("@kernel\ndef k(out: ptr[i64], n):\n    store(out, n.to(i64))\n").k
    gpu.sizes = [8, 8]
    out = FakeCudaTensor(0x7F00_0000_0000, (1,), dtype=torch.int64)
    k[(1,)](out, -2**31)
    k[(1,)](out, -2**31 - 16)
    expected = [struct.pack("<i", -2**31), struct.pack("<q", -2**31 - 16)]  # (8 bytes read of each)
    assert [r["params"][1][:len(e)] for r, e in zip(gpu.launches, expected, strict=True)] == expected
    assert len(gpu.built) == 2
