"""CPU tests of the launch-argument layer: dtypes, scalar encoding, binding, array description,
argument checks, parameter-buffer layout and the grid/block/shared-memory/cluster/stream checks."""

from __future__ import annotations

import ctypes
import struct
import sys
import types

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.backend.runtime import DeviceInfo, dlpack
from sparsile.backend.runtime import arguments as A
from sparsile.frontend.diagnostics import InternalError, LaunchError

H200 = DeviceInfo(ordinal=0, name="NVIDIA H200", compute_capability=(9, 0), sm_count=132,
                  max_shared_per_block=49152, max_shared_per_block_optin=232448, max_threads_per_block=1024,
                  max_block_dims=(1024, 1024, 64), max_grid_dims=(2**31 - 1, 65535, 65535),
                  max_cluster_size=8, l2_size=52428800)
AMPERE = DeviceInfo(ordinal=0, name="A100", compute_capability=(8, 0), sm_count=108,
                    max_shared_per_block=49152, max_shared_per_block_optin=166912, max_threads_per_block=1024,
                    max_block_dims=(1024, 1024, 64), max_grid_dims=(2**31 - 1, 65535, 65535),
                    max_cluster_size=1, l2_size=41943040)


def code_of(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.code


# ---------------------------------------------------------------------------------------------
# dtypes


def test_numpy_dtype_mapping_includes_ml_dtypes():
    assert A.dtype_from_numpy(np.dtype(np.float32)) == "f32"
    assert A.dtype_from_numpy(np.dtype(ml_dtypes.bfloat16)) == "bf16"
    assert A.dtype_from_numpy(np.dtype(ml_dtypes.float8_e4m3fn)) == "e4m3"
    assert A.dtype_from_numpy(np.dtype(ml_dtypes.float8_e5m2)) == "e5m2"
    assert A.dtype_from_numpy(np.dtype(np.complex64)) is None
    assert A.dtype_from_numpy(np.dtype(">f4")) is None  # (byte-swapped host arrays are staged by value)
    for name in ("i8", "u16", "i32", "u64", "f16", "f64", "bf16", "e4m3", "e5m2", "bool"):
        assert A.dtype_from_numpy(A.numpy_dtype(name)) == name
        assert A.numpy_dtype(name).itemsize * 8 == A.DTYPES[name].bits


def test_torch_dtype_names_by_string():
    assert A.dtype_from_torch("torch.bfloat16") == "bf16"
    assert A.dtype_from_torch("torch.float8_e4m3fn") == "e4m3"
    assert A.dtype_from_torch("torch.float8_e5m2") == "e5m2"
    assert A.dtype_from_torch("torch.complex64") is None


def test_tf32_pointer_accepts_f32_arrays():
    assert A.array_dtype_matches("tf32", "f32")
    assert not A.array_dtype_matches("f32", "f16")
    assert not A.array_dtype_matches("i8", "u8")


# ---------------------------------------------------------------------------------------------
# Scalars


@pytest.mark.parametrize("dtype,numpy_name", [("i8", "int8"), ("u8", "uint8"), ("i16", "int16"),
                                              ("u16", "uint16"), ("i32", "int32"), ("u32", "uint32"),
                                              ("i64", "int64"), ("u64", "uint64")])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_integer_scalars_match_numpy(dtype, numpy_name, data):
    info = np.iinfo(numpy_name)
    value = data.draw(st.integers(int(info.min), int(info.max)))
    assert A.encode_scalar(dtype, value) == np.array(value, dtype=numpy_name).tobytes()
    with pytest.raises(LaunchError) as exc:
        A.encode_scalar(dtype, int(info.max) + 1 + data.draw(st.integers(0, 10)), "n")
    assert code_of(exc) == A.ARG_RANGE and f"does not fit in {dtype}" in str(exc.value)
    with pytest.raises(LaunchError):
        A.encode_scalar(dtype, int(info.min) - 1, "n")


def test_numpy_and_ml_dtypes_scalars_pack_as_their_typed_parameters():
    """A NumPy scalar given for an unannotated parameter is a parameter of its own type (an
    ``ml_dtypes.bfloat16`` a ``bf16`` one): the launcher packs it (the bfloat16, no numbers.Real,
    was SP0708 "expects a number")."""
    import ml_dtypes

    assert A.encode_scalar("bf16", ml_dtypes.bfloat16(1.5)) == struct.pack("<H", 0x3FC0)
    assert A.encode_scalar("f16", np.float16(-2.5)) == np.float16(-2.5).tobytes()
    assert A.encode_scalar("i8", np.int8(-77)) == struct.pack("<b", -77)
    assert A.encode_scalar("u8", np.uint8(200)) == struct.pack("<B", 200)


def test_integer_scalars_accept_numpy_ints_and_reject_floats():
    assert A.encode_scalar("i32", np.int64(-7)) == struct.pack("<i", -7)
    with pytest.raises(LaunchError) as exc:
        A.encode_scalar("i32", 3.5, "n")
    assert code_of(exc) == A.ARG_DTYPE and "expects an integer (i32)" in str(exc.value)  # as kernel[grid] says
    with pytest.raises(LaunchError) as exc:
        A.encode_scalar("i64", "12", "n")
    assert code_of(exc) == A.ARG_KIND


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, width=64))
def test_float_scalars_match_numpy(value):
    for dtype, numpy_name in (("f32", "float32"), ("f64", "float64"), ("f16", "float16")):
        ref = np.array(value, dtype=np.float64)
        with np.errstate(over="ignore"):
            expected = ref.astype(numpy_name)
        if np.isinf(expected) and np.isfinite(value):
            with pytest.raises(LaunchError) as exc:
                A.encode_scalar(dtype, value, "alpha")
            assert code_of(exc) == A.ARG_RANGE and "overflows" in str(exc.value)
        else:
            assert A.encode_scalar(dtype, value) == expected.tobytes()


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, width=64))
def test_bf16_scalars_round_like_ml_dtypes(value):
    with np.errstate(over="ignore"):
        expected = np.array(value, dtype=np.float64).astype(ml_dtypes.bfloat16)
    if np.isinf(expected.astype(np.float64)) and np.isfinite(value):
        with pytest.raises(LaunchError):
            A.encode_scalar("bf16", value, "alpha")
    else:
        assert A.encode_scalar("bf16", value) == expected.tobytes()


def test_bf16_hand_values():
    # bf16 = top half of the f32 pattern, rounded to nearest even.
    assert A.encode_scalar("bf16", 1.0) == struct.pack("<H", 0x3F80)
    assert A.encode_scalar("bf16", -2.5) == struct.pack("<H", 0xC020)
    assert A.encode_scalar("bf16", 1.0 + 2**-8) == struct.pack("<H", 0x3F80)  # tie -> even
    assert A.encode_scalar("bf16", 1.0 + 3 * 2**-8) == struct.pack("<H", 0x3F82)  # tie -> even (up)
    assert A.encode_scalar("bf16", float("inf")) == struct.pack("<H", 0x7F80)
    assert A.encode_scalar("bf16", 2**-133) == struct.pack("<H", 0x0001)  # smallest subnormal
    assert A.encode_scalar("bf16", 2**-135) == struct.pack("<H", 0x0000)


def test_float_scalar_rejects_non_numbers_and_8bit_floats():
    with pytest.raises(LaunchError) as exc:
        A.encode_scalar("f32", "1.5", "alpha")
    assert code_of(exc) == A.ARG_KIND
    with pytest.raises(LaunchError) as exc:
        A.encode_scalar("e4m3", 1.0, "alpha")
    assert code_of(exc) == A.ARG_KIND
    assert A.encode_scalar("f32", 3) == struct.pack("<f", 3.0)
    assert A.encode_scalar("bool", True) == b"\x01"
    with pytest.raises(LaunchError):
        A.encode_scalar("bool", 2, "flag")


# ---------------------------------------------------------------------------------------------
# ParamSpec and binding


def _spec() -> A.ParamSpec:
    return A.ParamSpec((A.PointerParam("x", "f32"), A.PointerParam("y", "f32"), A.ScalarParam("n", "i32"),
                        A.ConstexprParam("BLOCK", 128), A.DerivedParam("x_rows", "x", "shape", 0)),
                       kernel_name="add")


def test_spec_user_and_kernel_params():
    spec = _spec()
    assert [p.name for p in spec.user_params] == ["x", "y", "n", "BLOCK"]
    assert [p.name for p in spec.kernel_params] == ["x", "y", "n", "x_rows"]


@pytest.mark.parametrize("params", [
    (A.PointerParam("x", "f32"), A.ScalarParam("x", "i32")),
    (A.PointerParam("x", "f99"),),
    (A.ScalarParam("s", "e4m3"),),
    (A.ScalarParam("n", "i32"), A.DerivedParam("d", "n", "shape", 0)),
    (A.PointerParam("x", "f32"), A.DerivedParam("d", "x", "size", 0)),
    (A.PointerParam("x", "f32"), A.DerivedParam("d", "x", "shape", 0, dtype="f32")),
])
def test_bad_specs_are_internal_errors(params):
    with pytest.raises(InternalError):
        A.ParamSpec(params)


def test_bind_positional_keyword_and_constexpr():
    binder = A.ArgumentBinder(_spec())
    assert list(binder.bind((1, 2, 3, 128))) == [1, 2, 3, 128]
    assert list(binder.bind((1,), {"n": 3, "y": 2})) == [1, 2, 3, A.MISSING]


@pytest.mark.parametrize("args,kwargs,code,text", [
    ((1, 2, 3, 4, 5), None, A.ARG_COUNT, "takes 4 arguments (x, y, n, BLOCK), got 5"),
    ((1,), None, A.ARG_COUNT, "missing arguments `y`, `n`"),
    ((1, 2), None, A.ARG_COUNT, "missing argument `n`"),
    ((1, 2, 3), {"m": 4}, A.ARG_KEYWORD, "has no parameter `m`"),
    ((1, 2, 3), {"x": 4}, A.ARG_KEYWORD, "both by position and by keyword"),
])
def test_bind_errors(args, kwargs, code, text):
    with pytest.raises(LaunchError) as exc:
        A.ArgumentBinder(_spec()).bind(args, kwargs)
    assert code_of(exc) == code and text in str(exc.value)


# ---------------------------------------------------------------------------------------------
# Describing arrays


def test_describe_numpy_array():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    info = A.describe_array(a)
    assert info.ptr == a.ctypes.data and info.dtype == "f32" and info.shape == (3, 4)
    assert info.strides == (4, 1) and info.contiguous and info.device == A.HOST
    assert info.host is a and not info.readonly
    t = A.describe_array(a.T)
    assert t.strides == (1, 4) and not t.contiguous
    assert A.describe_array(3.0) is None and A.describe_array([1, 2]) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data())
def test_is_c_contiguous_agrees_with_numpy(shape, data):
    base = np.zeros(shape)
    index = tuple(slice(None, None, data.draw(st.sampled_from([1, 2, -1]))) for _ in shape)
    view = base[index]
    if data.draw(st.booleans()):
        view = view.transpose(data.draw(st.permutations(range(len(shape)))))
    strides = tuple(s // view.itemsize for s in view.strides)
    assert A.is_c_contiguous(view.shape, strides) == view.flags.c_contiguous


class FakeCai:
    """An object exposing only ``__cuda_array_interface__`` (like Numba/CuPy); nothing is
    dereferenced on the CPU."""

    def __init__(self, ptr, shape, typestr, strides=None, readonly=False, stream=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, readonly),
                                         "version": 3, "strides": strides, "stream": stream}


def test_describe_cuda_array_interface():
    info = A.describe_array(FakeCai(0x7000_0000_0000, (4, 8), "<f2", stream=5))
    assert info.dtype == "f16" and info.device == A.UNKNOWN_DEVICE and info.stream == 5
    assert info.contiguous and info.strides == (8, 1)
    strided = A.describe_array(FakeCai(0x1000, (4, 8), "<f4", strides=(64, 4), readonly=True))
    assert strided.strides == (16, 1) and not strided.contiguous and strided.readonly
    # bfloat16 has no typestr of its own ('<V2'): without a DLPack fallback the dtype is unknown,
    # and a bf16 parameter refuses it with a message naming what was seen.
    bf = A.describe_array(FakeCai(0x1000, (2,), np.dtype(ml_dtypes.bfloat16).str))
    assert bf.dtype is None and bf.dtype_label == "void16"
    with pytest.raises(LaunchError) as exc:
        A.check_array_argument("w", "bf16", bf._replace(device=0), device=0, allow_host=True, writes=False)
    assert code_of(exc) == A.ARG_DTYPE and "got a void16" in str(exc.value)


def test_cuda_array_interface_falls_back_to_dlpack():
    class TorchLikeBf16(FakeDLPack):
        @property
        def __cuda_array_interface__(self):
            raise TypeError("dtype bfloat16 is not supported by __cuda_array_interface__")

    info = A.describe_array(TorchLikeBf16(0x2000, (3,), "bf16", device_id=0))
    assert info.dtype == "bf16" and info.device == 0 and "DLPack" in info.source


class FakeDLPack:
    """A producer of DLPack capsules for memory on any device type (nothing is dereferenced)."""

    def __init__(self, ptr, shape, dtype, device_type=dlpack.DEVICE_CUDA, device_id=0, strides=None):
        self.args = (ptr, shape, dtype, device_type, device_id, strides)
        self.streams = []

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        ptr, shape, dtype, device_type, device_id, strides = self.args
        return dlpack.export_capsule(ptr, shape, dtype, device_type, device_id, owner=self, strides=strides)

    def __dlpack_device__(self):
        return self.args[3], self.args[4]


def test_describe_dlpack_cuda_object_passes_the_stream():
    obj = FakeDLPack(0x7F00_0000_0000, (16, 32), "bf16", device_id=1)
    info = A.describe_array(obj, stream=0)
    assert info.dtype == "bf16" and info.device == 1 and info.shape == (16, 32) and info.contiguous
    assert obj.streams == [1]  # the legacy default stream is 1 in the DLPack protocol
    A.describe_array(obj, stream=0xABC)
    assert obj.streams[-1] == 0xABC
    e4 = A.describe_array(FakeDLPack(0x1000, (8,), "e4m3"))
    assert e4.dtype == "e4m3"


def test_describe_dlpack_host_object_builds_a_writable_view():
    backing = np.arange(6, dtype=np.int32)
    obj = FakeDLPack(backing.ctypes.data, (2, 3), "i32", device_type=dlpack.DEVICE_CPU)
    info = A.describe_array(obj)
    assert info.device == A.HOST and obj.streams == [None]
    info.host[1, 2] = 99
    assert backing[5] == 99  # same memory


def test_describe_fake_torch_tensors(monkeypatch):
    class Device:
        def __init__(self, kind, index):
            self.type, self.index = kind, index

        def __str__(self):
            return f"{self.type}:{self.index}"

    class Tensor:
        def __init__(self, ptr, shape, dtype, device, strides=None):
            self.shape, self.dtype, self.device, self._ptr = shape, dtype, device, ptr
            self._strides = strides or dlpack.compact_strides(shape)

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

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(Tensor=Tensor))
    cuda = A.describe_array(Tensor(0x5000, (4, 4), "torch.bfloat16", Device("cuda", 2)))
    assert (cuda.dtype, cuda.device, cuda.contiguous, cuda.dtype_label) == ("bf16", 2, True, "bfloat16")
    backing = np.zeros(4, dtype=np.float16)
    cpu = A.describe_array(Tensor(backing.ctypes.data, (4,), "torch.float16", Device("cpu", None)))
    assert cpu.device == A.HOST and cpu.host.dtype == np.float16
    cpu.host[:] = 2.0
    assert backing.tolist() == [2.0] * 4
    mps = A.describe_array(Tensor(0x10, (4,), "torch.float32", Device("mps", 0)))
    assert mps.device == A.FOREIGN_DEVICE


# ---------------------------------------------------------------------------------------------
# Checks on array arguments


def _check(info, **kw):
    options = {"device": 0, "allow_host": True, "writes": True} | kw
    dtype = options.pop("dtype", "f32")
    A.check_array_argument("x", dtype, info, **options)


def test_check_wrong_dtype_message():
    info = A.describe_array(np.zeros(4, dtype=np.float16))
    with pytest.raises(LaunchError) as exc:
        _check(info)
    assert code_of(exc) == A.ARG_DTYPE
    assert "argument `x` expects a pointer to f32, got a float16 numpy array" in str(exc.value)
    assert "float32" in exc.value.help


@pytest.mark.parametrize("kw,info_changes,code", [
    ({"allow_host": False}, {}, A.ARG_HOST_MEMORY),
    ({}, {"contiguous": False, "host": None}, A.ARG_CONTIGUOUS),
    ({}, {"readonly": True}, A.READ_ONLY),
    ({}, {"device": A.FOREIGN_DEVICE, "host": None, "device_label": "mps:0"}, A.ARG_DEVICE),
    ({}, {"device": 1, "host": None}, A.ARG_DEVICE),
    ({}, {"device": 0, "host": None, "contiguous": False}, A.ARG_CONTIGUOUS),
    ({"aligned16": True}, {"device": 0, "host": None, "ptr": 0x1008}, A.ARG_ALIGNMENT),
])
def test_check_array_errors(kw, info_changes, code):
    info = A.describe_array(np.zeros(4, dtype=np.float32))._replace(**info_changes)
    with pytest.raises(LaunchError) as exc:
        _check(info, **kw)
    assert code_of(exc) == code


def test_check_array_accepts_good_arguments():
    host = A.describe_array(np.zeros(4, dtype=np.float32))
    _check(host)
    _check(host._replace(readonly=True), writes=False)
    device = host._replace(device=0, host=None, ptr=0x7000_0000_0010)
    _check(device, aligned16=True)
    _check(device._replace(contiguous=False), contiguous=False)
    _check(device._replace(device=A.ANY_DEVICE))


def test_divisibility_and_derived_values():
    A.check_divisible("n", 64, 16)
    with pytest.raises(LaunchError) as exc:
        A.check_divisible("n", 65, 16)
    assert code_of(exc) == A.ARG_RANGE and "multiple of 16" in str(exc.value)
    info = A.describe_array(np.zeros((3, 5), dtype=np.float32))
    assert A.derived_value(A.DerivedParam("r", "x", "shape", 0), info) == 3
    assert A.derived_value(A.DerivedParam("s", "x", "stride", -2), info) == 5
    with pytest.raises(LaunchError) as exc:
        A.derived_value(A.DerivedParam("r", "x", "shape", 2), info)
    assert code_of(exc) == A.ARG_SHAPE


# ---------------------------------------------------------------------------------------------
# Parameter buffer


def test_slot_layout_aligns_each_parameter():
    layout = A.layout_slots([(4, 4), (8, 8), (2, 2), (128, 64), (4, 4)])
    assert layout.offsets == (0, 8, 16, 64, 192) and layout.total == 196


def test_param_buffer_pointers_point_at_slots():
    layout = A.layout_slots([(8, 8), (128, 64), (4, 4)])
    buf = A.ParamBuffer(layout)
    assert buf.base % 64 == 0
    pointers = (ctypes.c_void_p * 3).from_address(buf.address)
    assert [p - buf.base for p in pointers] == list(layout.offsets)
    struct.pack_into("<Q", buf.view, layout.offsets[0], 0xDEADBEEF)
    buf.view[layout.offsets[1]:layout.offsets[1] + 128] = bytes(range(128))
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0xDEADBEEF
    assert ctypes.string_at(pointers[1], 128) == bytes(range(128))
    assert buf.slot_bytes(1) == bytes(range(128))


# ---------------------------------------------------------------------------------------------
# Grid, block, shared memory, cluster, stream


def test_grid_normalization():
    assert A.normalize_grid(5, H200) == (5, 1, 1)
    assert A.normalize_grid((4, 3), H200) == (4, 3, 1)
    assert A.normalize_grid([2, 2, 2], H200) == (2, 2, 2)
    assert A.normalize_grid(np.int64(7), H200) == (7, 1, 1)
    assert A.normalize_grid(0, H200) == (0, 1, 1)  # empty grids: launched, they run nothing
    assert A.normalize_grid((4, 0), H200) == (4, 0, 1) and A.is_empty_grid((4, 0, 1))
    assert not A.is_empty_grid((4, 1, 1))


@pytest.mark.parametrize("grid,text", [
    (-1, "a grid dimension cannot be negative"), ((4, -2), "-2 blocks along y; a grid dimension cannot be negative"),
    ((0, 65536), "exceeds the device limit along y"),
    ((1, 65536), "exceeds the device limit along y"), (2**31, "exceeds the device limit along x"),
    ((1, 2, 3, 4), "tuple of 1 to 3"), (2.0, "must be an int"), ((1, 1.5), "non-integer"),
    (True, "must be an int"),
])
def test_grid_errors(grid, text):
    with pytest.raises(LaunchError) as exc:
        A.normalize_grid(grid, H200)
    assert code_of(exc) == A.GRID and text in str(exc.value)


def test_block_checks():
    assert A.normalize_block(256, H200) == (256, 1, 1)
    assert A.normalize_block((32, 4, 2), H200) == (32, 4, 2)
    for block, text in (((1025,), "1..1024"), ((32, 32, 2), "2048 threads"), ((1, 1, 65), "1..64"),
                        (0, "1..1024")):
        with pytest.raises(LaunchError) as exc:
            A.normalize_block(block, H200)
        assert code_of(exc) == A.BLOCK and text in str(exc.value)
    with pytest.raises(LaunchError) as exc:
        A.normalize_block(1024, H200, kernel_max_threads=512)
    assert code_of(exc) == A.BLOCK and "register usage" in str(exc.value)


def test_shared_memory_checks():
    A.check_shared_memory(1024, 231424, H200)  # exactly the opt-in limit
    with pytest.raises(LaunchError) as exc:
        A.check_shared_memory(1024, 231425, H200)
    assert code_of(exc) == A.SHARED_MEMORY and "232449 bytes" in str(exc.value)
    with pytest.raises(LaunchError):
        A.check_shared_memory(0, -1, H200)


def test_cluster_checks():
    assert A.check_cluster((2, 1, 1), H200) == (2, 1, 1)
    assert A.check_cluster(1, AMPERE) == (1, 1, 1)
    for cluster, limits, text in (((16, 1, 1), H200, "at most 8"), ((2,), AMPERE, "does not support"),
                                  ((0, 1, 1), H200, "below 1")):
        with pytest.raises(LaunchError) as exc:
            A.check_cluster(cluster, limits)
        assert code_of(exc) == A.CLUSTER and text in str(exc.value)
    A.check_grid_fits_cluster((8, 2, 1), (2, 2, 1))
    with pytest.raises(LaunchError) as exc:
        A.check_grid_fits_cluster((7, 1, 1), (2, 1, 1))
    assert code_of(exc) == A.CLUSTER and "not a multiple" in str(exc.value)


def test_stream_handles():
    assert A.stream_handle(None) == 0
    assert A.stream_handle(0x1234) == 0x1234
    assert A.stream_handle(types.SimpleNamespace(cuda_stream=77)) == 77  # torch.cuda.Stream
    assert A.stream_handle(types.SimpleNamespace(ptr=78)) == 78  # cupy
    assert A.stream_handle(types.SimpleNamespace(handle=ctypes.c_void_p(79))) == 79  # numba
    assert A.stream_handle(types.SimpleNamespace(handle=ctypes.c_void_p(None))) == 0
    assert A.stream_handle(types.SimpleNamespace(__cuda_stream__=lambda: (0, 80))) == 80

    from cuda.bindings import driver

    assert A.stream_handle(driver.CUstream(81)) == 81
    for bad in (-1, 1.5, "s", True, object()):
        with pytest.raises(LaunchError) as exc:
            A.stream_handle(bad)
        assert code_of(exc) == A.STREAM
