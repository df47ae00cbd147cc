"""The Python work of one ``kernel[grid](...)`` launch on its fast path (driver/fast_launch.py), counted
with ``sys.setprofile``: what can be decided once per specialization is not redone per launch (issue
12), while every check a launch needs still runs. Fake device of tests/backend/test_prepared.py
(kernels compile for sm_90a, launches are recorded); benchmarks/bench_launch_cpu.py times the path."""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import sparsile as sp
from sparsile.backend.runtime import DeviceBuffer
from sparsile.tests.backend.test_prepared import arrays, gpu, q, scaled_copy, vadd  # noqa: F401
from sparsile.tests.frontend.test_jit_nested_launch_path import NESTED
from sparsile.tests.support.jit_source import import_source

PACKAGE = str(Path(sp.__file__).resolve().parent)
TESTS = str(Path(sp.__file__).resolve().parent / "tests")


def sparsile_calls(launch: Callable[[], Any]) -> list[str]:
    """The sparsile functions one ``launch()`` calls, in order (not the tests' stand-ins, nor what
    those call)."""
    calls: list[str] = []

    def inside(frame: Any, where: str) -> bool:
        return frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(where)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not inside(frame, PACKAGE) or inside(frame, TESTS):
            return
        if inside(frame.f_back, TESTS) and frame.f_back.f_code is not launch.__code__:  # (a stand-in's own call)
            return
        calls.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        launch()
    finally:
        sys.setprofile(None)
    return calls


def test_a_fast_launch_of_a_spk_kernel_does_only_the_per_call_work(gpu):  # noqa: F811
    """Before: the constexpr's fingerprint (two calls), the captures check of a kernel that captures
    nothing (three calls), the divisibility check of a divisible integer and the launch's own
    helper ran at every launch."""
    k = vadd()
    x, y, out = arrays()
    for _ in range(2):  # the full path, then the fast entry
        k[(4,)](x, y, out, 1024, BLOCK=256)
    calls = sparsile_calls(lambda: k[(4,)](x, y, out, 1024, BLOCK=256))
    writer = "PreparedLaunch._array_writer.<locals>.torch_array"
    assert calls == ["Kernel.__getitem__", "GpuLaunch.__init__", "GpuLaunch.__call__", "FastLaunches.key",
                     "FastEntry.launch", "PreparedLaunch.run", writer, writer, writer,
                     "scalar_writer.<locals>.convert_int"]
    assert gpu.launches[-1]["params"] == [q(x.data_ptr()), q(y.data_ptr()), q(out.data_ptr()), struct.pack("<i", 1024)]
    assert len(gpu.built) == 1 and len(gpu.launches) == 3


def test_a_fast_launch_checks_what_a_jit_kernel_captured_once(gpu, monkeypatch):  # noqa: F811
    """The kernel's parameter captures were checked, then the launcher's, which hold them too."""
    gpu.sizes = [8, 8, 4]  # x, out, n
    x, out, _ = arrays()
    for _ in range(2):
        scaled_copy[(4,)](x, out, 1024, BLOCK=256)
    calls = sparsile_calls(lambda: scaled_copy[(4,)](x, out, 1024, BLOCK=256))
    assert calls.count("CaptureSet.still_valid") == 1
    assert len(gpu.built) == 1
    monkeypatch.setitem(scaled_copy.globals.globs, "SCALE", 5.0)  # still noticed: compiled anew
    scaled_copy[(4,)](x, out, 1024, BLOCK=256)
    assert len(gpu.built) == 2


def test_a_changed_default_or_annotation_still_leaves_the_fast_path(gpu, tmp_path):  # noqa: F811
    """A nested @jit kernel's Python default and annotation are the parameters' captures: a fast
    entry checks them once per launch through its joined captures, and a change compiles anew
    (a default) or is refused as the full path refuses it (an annotation: SP0703)."""
    gpu.sizes = [8, 8, 4, 4]  # x, out, n, s
    module = import_source(NESTED, tmp_path, "fast_launch_calls_nested")
    kernel, function = module.make()
    x, out, _ = arrays()
    for _ in range(2):
        kernel[(1,)](x, out, 16, 1.5)
    assert len(gpu.built) == 1
    function.__defaults__ = (16,)  # BLOCK
    kernel[(1,)](x, out, 16, 1.5)
    assert len(gpu.built) == 2
    kernel[(1,)](x, out, 16, 1.5)  # the new fast entry
    assert len(gpu.built) == 2 and len(gpu.launches) == 4
    function.__annotations__["s"] = sp.i32
    with pytest.raises(sp.LaunchError) as info:
        kernel[(1,)](x, out, 16, 1.5)
    assert info.value.code == "SP0703" and len(gpu.launches) == 4


def buffers(base: int = 0x7F00_0000_0000, dtype: str = "f32", device: int = 0, n: int = 1024) -> list[DeviceBuffer]:
    """DeviceBuffers at made-up addresses (nothing allocated: only what a launch reads)."""
    out = []
    for i in range(3):
        b = DeviceBuffer.__new__(DeviceBuffer)
        b.ptr, b.nbytes, b.dtype, b.shape, b.device = base + i * 0x10000, 4 * n, dtype, (n,), device
        out.append(b)
    return out


def test_a_fast_launch_of_device_buffers_packs_their_pointers_without_describing_them(gpu):  # noqa: F811
    """Before: each DeviceBuffer's fingerprint took two calls and its prepared writer the generic
    path (described, then every check of any array): eight calls a buffer."""
    k = vadd()
    bx, by, bout = buffers()
    for _ in range(2):
        k[(4,)](bx, by, bout, 1024, BLOCK=256)
    calls = sparsile_calls(lambda: k[(4,)](bx, by, bout, 1024, BLOCK=256))
    for slow in ("fingerprint", "_buffer_fingerprint", "describe_array", "check_array_argument"):
        assert slow not in calls
    assert calls.count("PreparedLaunch._array_writer.<locals>.device_buffer") == 3
    assert gpu.launches[-1]["params"] == [q(bx.ptr), q(by.ptr), q(bout.ptr), struct.pack("<i", 1024)]
    cx, cy, cout = buffers(base=0x7E00_0000_0000)
    k[(4,)](cx, cy, cout, 2048, BLOCK=256)  # new buffers, the same fingerprint: the fast entry packs them
    assert gpu.launches[-1]["params"] == [q(cx.ptr), q(cy.ptr), q(cout.ptr), struct.pack("<i", 2048)]
    assert len(gpu.built) == 1


@pytest.mark.parametrize(("change", "code", "message"), [
    (lambda b: (buffers(dtype="f16")[0], *b[1:]), "SP0703",
     "argument `x` expects a pointer to f32, got a f16 DeviceBuffer"),
    (lambda b: (b[0], buffers(device=1)[1], b[2]), "SP0707", "argument `y` is on cuda:1 but the kernel runs on cuda:0"),
    (lambda b: (b[0], b[1], buffers(base=0x7F00_0000_0004)[2]), "SP0704",
     "argument `out` points to 0x7f0000020004, which is not 16-byte aligned, but the kernel was specialized "
     "assuming 16-byte alignment"),
])
def test_a_prepared_launch_of_device_buffers_still_refuses_another_kind(gpu, change, code, message):  # noqa: F811
    """The DeviceBuffer writer's shortcut takes only a buffer of the prepared dtype, device and
    alignment; any other goes through the launcher's checks and their diagnostics."""
    b = buffers()
    launch_ = vadd()[(4,)].prepare(*b, 1024, BLOCK=256)
    with pytest.raises(sp.LaunchError) as info:
        launch_(*change(b), 1024)
    assert (info.value.code, info.value.message) == (code, message)
    assert not gpu.launches

