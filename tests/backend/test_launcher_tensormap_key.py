"""The launcher's tensor-map cache (backend/runtime/launcher.py) is keyed on what a map encodes,
not only on the array: one array passed to two tensor-map parameters of different boxes (the two
boxes a ``tensor[...]`` argument is loaded with, or the same weight given for two arguments) gets
the map of each parameter's own box. Run with a fake device and a fake encoder (no GPU)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from sparsile.backend import runtime
from sparsile.backend.runtime import arguments as A
from sparsile.backend.runtime import arrays as array_args
from sparsile.backend.runtime import launcher as launcher_module
from sparsile.backend.runtime.tensormap import Swizzle, TensorMap, TensorMapParam

torch = pytest.importorskip("torch")

from sparsile.tests.backend.test_prepared import ATTRS, OK, FakeCudaTensor, FakeModule  # noqa: E402


class MapRecorder:
    """The fake driver's launch: the two 128-byte tensor-map parameters of each launch."""

    def __init__(self) -> None:
        self.launches: list[list[bytes]] = []

    def __call__(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        pointers = (ctypes.c_void_p * 2).from_address(params)
        self.launches.append([ctypes.string_at(p, 128) for p in pointers])
        return (OK,)


def fake_encoding(spec) -> bytes:
    """A map's bytes that tell its box and swizzle apart (what cuTensorMapEncodeTiled encodes)."""
    text = f"{spec.box_shape}|{int(spec.swizzle)}|{spec.global_shape}".encode()
    return text.ljust(128, b"\0")


@pytest.fixture
def encode(monkeypatch):
    encoded = []

    def fake_make(spec, ptr, owner=None, device=None, validated=False):
        encoded.append((spec.box_shape, ptr))
        return TensorMap(spec, ptr, fake_encoding(spec))

    monkeypatch.setattr(launcher_module, "make_tensor_map", fake_make)
    monkeypatch.setitem(array_args._extractors, FakeCudaTensor, array_args._describe_torch)
    return encoded


def make_launcher(params):
    spec = A.ParamSpec(params, kernel_name="two_boxes")
    fn = SimpleNamespace(module=FakeModule(), attributes=ATTRS, handle=0x500, set_max_dynamic_shared=lambda n: None)
    launcher = runtime.Launcher(fn, spec, num_warps=4)
    recorder = MapRecorder()
    launcher._launch_kernel = recorder
    return launcher, recorder


def test_one_array_for_two_boxes_gets_a_map_of_each_box(encode):
    """``a.tmap0`` and ``a.tmap1``: the two boxes one tensor argument is loaded with (codegen gives a
    tensor parameter one map per distinct box); the launch passes the same array for both."""
    launcher, recorder = make_launcher((
        TensorMapParam("a.tmap0", "f16", (64, 64), swizzle=Swizzle.B128, readonly=True),
        TensorMapParam("a.tmap1", "f16", (128, 32), swizzle=Swizzle.B64, readonly=True)))
    a = FakeCudaTensor(0x7A00_0000_0000, (256, 512), dtype=torch.float16)
    launcher((1,), [a, a])
    first, second = recorder.launches[-1]
    assert first == fake_encoding(SimpleNamespace(box_shape=(64, 64), swizzle=Swizzle.B128, global_shape=(256, 512)))
    assert second == fake_encoding(SimpleNamespace(box_shape=(128, 32), swizzle=Swizzle.B64,
                                                   global_shape=(256, 512)))
    launcher((1,), [a, a])  # the second launch: both from the cache, each still its own box
    assert recorder.launches[-1] == [first, second]
    assert sorted(box for box, _ in encode) == [(64, 64), (128, 32)]


def test_the_same_weight_for_two_arguments_of_other_boxes(encode):
    launcher, recorder = make_launcher((
        TensorMapParam("a", "f16", (64, 64), readonly=True),
        TensorMapParam("b", "f16", (64, 128), readonly=True)))
    w = FakeCudaTensor(0x7A00_0000_0000, (256, 512), dtype=torch.float16)
    launcher((1,), [w, w])
    first, second = recorder.launches[-1]
    assert first.startswith(b"(64, 64)|") and second.startswith(b"(64, 128)|")
