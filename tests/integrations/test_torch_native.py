"""The native launch of the torch launch record, on by default (integrations/torch/native.py, the
record launch of backend/runtime/native_launch.py), JIT-compiled on the CPU and called through ctypes
with fake libcuda entry points (cuLaunchKernel, cuLaunchKernelEx, cuTensorMapEncodeTiled) that
record what they are given: the bytes a native launch passes are the prepared launch's
(driver/prepared.py, on the fake device of tests/backend/test_prepared.py), and the launch record
uses it for eager calls (each launch of a split-K plan), unless SPARSILE_TORCH_NATIVE=0. The same launches on the
H200: tests/gpu/test_torch_native_gpu.py."""

from __future__ import annotations

import ctypes as c
import struct
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.backend.runtime import cudalib  # noqa: E402
from sparsile.backend.runtime import native_launch as nl  # noqa: E402
from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import native  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.backend.test_prepared import FakeCudaTensor, arrays, q, tma_launch, vadd  # noqa: E402
from sparsile.tests.backend.test_prepared import gpu as gpu  # noqa: E402 (the fake device, a fixture)
from sparsile.tests.integrations.record_fakes import FakeDriver, _Kernel, _Plan, _Prepared, _weight  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)


def _replay(launcher: nl.RecordLauncher, record: nl.NativeRecord, a: int, b: int = 0, s: int = 0,
            stream: int = 0x5100) -> int:
    words = launcher.record(record.words)
    return launcher.launch(c.addressof(words), a, b, s, stream)


# ------------------------------------------------------------------------------------------------
# the record of a real prepared launch (pointer, derived sizes, tensor map)


def test_native_launch_passes_the_prepared_launch_s_bytes_and_reencodes_moved_maps(monkeypatch):
    encoded: list = []
    made, recorder, a = tma_launch(monkeypatch, encoded, per_call=(0,))  # a per call; k = 3 fixed
    record = made.native_record((a,), (0,), (True,))
    assert record is not None and record.keep[0] is made
    fake = FakeDriver(recorder.sizes)
    launcher = nl.RecordLauncher(fake.entry_points())
    assert _replay(launcher, record, a.data_ptr(), stream=0x5100) == 0  # the address the map was encoded for
    made.run((a,), stream=0x5100)
    prepared = recorder.launches[-1]
    fn, grid, block, shared, stream, params = fake.launches[-1]
    assert params == prepared["params"] and fake.encodes == []
    assert (fn, grid, block, shared, stream) == (0x500, prepared["grid"], prepared["block"], 0, prepared["stream"])
    moved = FakeCudaTensor(0x7A00_0020_0000, (256, 512), dtype=torch.float16)  # the same layout, moved
    assert _replay(launcher, record, moved.data_ptr()) == 0
    made.run((moved,))
    prepared, native_params = recorder.launches[-1]["params"], fake.launches[-1][5]
    assert native_params[:3] + native_params[4:] == prepared[:3] + prepared[4:]
    assert native_params[0] == q(moved.data_ptr()) and native_params[4] == struct.pack("<i", 3)
    assert native_params[3] == b"\xe1" * 128  # re-encoded in the call's copy
    spec = encoded[-1][0]
    args = spec.driver_arguments(moved.data_ptr())
    assert encoded[-1][1] == moved.data_ptr()  # the prepared launch encoded the same map
    assert fake.encodes == [(int(args["tensorDataType"]), 2, moved.data_ptr(), list(args["globalDim"]),
                             list(args["globalStrides"]), list(args["boxDim"]), list(args["elementStrides"]),
                             int(args["interleave"]), int(args["swizzle"]), int(args["l2Promotion"]),
                             int(args["oobFill"]))]
    assert _replay(launcher, record, a.data_ptr()) == 0 and len(fake.encodes) == 1  # the record is unchanged
    assert fake.launches[-1][5][3] == b"\x01" * 128
    assert launcher.counts() == {"launched": 3, "declined": 0, "launch_failures": 0}


def test_every_map_of_a_moved_source_is_reencoded(monkeypatch):
    """Two tensor maps of one per-call tensor (two boxes): when it moves, the native launch
    re-encodes both in its copy, each with its own box, as the prepared launch rewrites both."""
    from sparsile.backend import runtime
    from sparsile.backend.runtime import arguments as A
    from sparsile.backend.runtime import arrays as array_args
    from sparsile.backend.runtime.tensormap import Swizzle, TensorMap, TensorMapCache, TensorMapParam
    from sparsile.driver import prepared
    from sparsile.driver.prepared import PreparedLaunch
    from sparsile.frontend.ir import types as T
    from sparsile.frontend.sema.core import ArgSpec
    from sparsile.frontend.sema.specialize import ParamInfo
    from sparsile.tests.backend.test_prepared import ATTRS, FakeModule, Recorder

    encoded: list = []
    monkeypatch.setattr(runtime, "make_tensor_map", lambda spec, ptr, owner=None, device=None, validated=False: (
        encoded.append((spec, ptr)), TensorMap(spec, ptr, bytes([len(encoded)]) * 128))[1])
    monkeypatch.setattr(prepared, "SHARED_MAPS", TensorMapCache(8))
    spec = A.ParamSpec((A.PointerParam("a", "f16", aligned16=True, readonly=True),
                        TensorMapParam("a.tmap0", "f16", (64, 64), swizzle=Swizzle.B128, readonly=True),
                        TensorMapParam("a.tmap1", "f16", (8, 64), swizzle=Swizzle.B128, readonly=True)),
                       kernel_name="two_maps")
    fn = SimpleNamespace(module=FakeModule(), attributes=ATTRS, handle=0x500, set_max_dynamic_shared=lambda n: None)
    launcher = runtime.Launcher(fn, spec, num_warps=4)
    recorder = Recorder()
    recorder.sizes = [8, 128, 128]
    launcher._launch_kernel = recorder
    kernel = SimpleNamespace(name="two_maps", params=[ParamInfo("a", T.TensorType(T.f16, 2))])
    a = FakeCudaTensor(0x7A00_0000_0000, (256, 512), dtype=torch.float16)
    monkeypatch.setitem(array_args._extractors, FakeCudaTensor, array_args._describe_torch)
    monkeypatch.setattr(prepared, "torch_stream_getter", lambda ordinal: lambda: 0)
    made = PreparedLaunch(kernel, launcher, {"a": a}, {"a": ArgSpec.of(T.TensorType(T.f16, 2), True)}, [0], (1,))
    record = made.native_record((a,), (0,), (True,))
    fake = FakeDriver(recorder.sizes)
    native_launcher = nl.RecordLauncher(fake.entry_points())
    moved = FakeCudaTensor(0x7A00_0040_0000, (256, 512), dtype=torch.float16)
    assert _replay(native_launcher, record, moved.data_ptr()) == 0
    made.run((moved,))
    assert [e[2] for e in fake.encodes] == [moved.data_ptr()] * 2
    assert [e[5] for e in fake.encodes] == [[64, 64], [64, 8]]  # each map's own box (innermost first)
    assert [spec.box_shape for spec, _ in encoded[-2:]] == [(64, 64), (8, 64)]  # what the prepared launch encoded
    assert fake.launches[-1][5] == [q(moved.data_ptr()), b"\xe1" * 128, b"\xe2" * 128]


def test_pointer_arguments_of_a_compiled_kernel(request):
    """vector_add compiled for sm_90a, x and out per call (y and n fixed): the record's pointer
    slots take sources 0 and 1 with the 16-byte alignment x and out were specialized for."""
    gpu = request.getfixturevalue("gpu")
    x, y, out = arrays()
    made = vadd()[(4,)].prepare(x=x, y=y, out=out, n=1024, BLOCK=256, per_call=("x", "out"))
    record = made.native_record((x, out), (0, 1), (True, True))
    fake = FakeDriver(gpu.sizes)
    launcher = nl.RecordLauncher(fake.entry_points())
    x2, _, out2 = arrays(base=0x7E00_0000_0000)
    assert _replay(launcher, record, x2.data_ptr(), out2.data_ptr(), stream=77) == 0
    made.run((x2, out2), stream=77)
    prepared = gpu.launches[-1]
    assert fake.launches[-1] == (0x500, prepared["grid"], prepared["block"], 0, 77, prepared["params"])
    assert prepared["params"] == [q(x2.data_ptr()), q(y.data_ptr()), q(out2.data_ptr()), struct.pack("<i", 1024)]
    assert _replay(launcher, record, x2.data_ptr() + 4, out2.data_ptr()) == -1
    assert _replay(launcher, record, x2.data_ptr(), out2.data_ptr() + 8) == -1
    assert len(fake.launches) == 1


def test_misaligned_and_missing_buffers_are_not_launched(monkeypatch):
    made, recorder, a = tma_launch(monkeypatch, [], per_call=(0,))
    record = made.native_record((a,), (0,), (True,))
    fake = FakeDriver(recorder.sizes)
    launcher = nl.RecordLauncher(fake.entry_points())
    assert _replay(launcher, record, a.data_ptr() + 8) == -1  # specialized 16-byte aligned
    assert _replay(launcher, record, 0) == -1  # no buffer
    assert fake.launches == [] and launcher.counts() == {"launched": 0, "declined": 2, "launch_failures": 0}
    fake.result = 700
    words = launcher.record(record.words)
    assert launcher.launch(c.addressof(words), a.data_ptr(), 0, 0, 0) == 700
    assert words[nl.R_ERROR] == 700 and launcher.counts()["launch_failures"] == 1


def test_records_refuse_what_they_cannot_replay(monkeypatch):
    made, _, a = tma_launch(monkeypatch, [])  # a and the scalar k per call
    assert made.native_record((a, 3), (0, 1), (True, True)) is None  # a per-call scalar is no source
    made, _, a = tma_launch(monkeypatch, [], per_call=(0,))
    assert made.native_record((a,), (2,), (False,)) is None  # its sizes and map need a fixed layout
    assert made.native_record((a, a), (0, 1), (True, True)) is None  # not the launch's argument count


@pytest.mark.parametrize("cluster,pdl", [((2, 1, 1), False), ((1, 1, 1), True), ((2, 1, 1), True)])
def test_cluster_and_pdl_launches_go_through_cuLaunchKernelEx(monkeypatch, cluster, pdl):
    """A record's ``R_ATTRS`` is the address of its launch-attribute block (a count, then the
    attributes); the native launch passes the count and the attributes to cuLaunchKernelEx: the
    cluster dimensions for a cluster of more than one CTA, then programmatic stream serialization
    for a ``pdl=True`` launch."""
    made, recorder, a = tma_launch(monkeypatch, [], per_call=(0,))
    made.launcher.cluster, made.launcher.pdl = cluster, pdl
    record = made.native_record((a,), (0,), (True,))
    block = record.keep[1]
    expected = (((cudalib.CLUSTER_DIMENSION, cluster),) if cluster != (1, 1, 1) else ()) + \
        (((cudalib.PROGRAMMATIC_STREAM_SERIALIZATION, (1, 0, 0)),) if pdl else ())
    assert record.words[nl.R_ATTRS] == c.addressof(block) and block.count == len(expected)
    assert tuple((block.attrs[i].id, tuple(block.attrs[i].value[:3])) for i in range(block.count)) == expected
    fake = FakeDriver(recorder.sizes)
    assert _replay(nl.RecordLauncher(fake.entry_points()), record, a.data_ptr(), stream=9) == 0
    made.run((a,), stream=9)
    fn, grid, block_dims, shared, stream, params, attrs = fake.launches[-1]
    assert (fn, grid, block_dims, shared, stream) == (0x500, (1, 1, 1), (128, 1, 1), 0, 9)
    assert params == recorder.launches[-1]["params"] and attrs == ("ex", len(expected), expected)


def test_plain_records_have_no_attribute_block(monkeypatch):
    made, recorder, a = tma_launch(monkeypatch, [], per_call=(0,))
    record = made.native_record((a,), (0,), (True,))
    assert record.words[nl.R_ATTRS] == 0 and record.keep[1] is None
    fake = FakeDriver(recorder.sizes)
    assert _replay(nl.RecordLauncher(fake.entry_points()), record, a.data_ptr()) == 0
    assert len(fake.launches[-1]) == 6  # cuLaunchKernel, not cuLaunchKernelEx


# ------------------------------------------------------------------------------------------------
# the launch record: when the native launch is used


def test_eager_one_launch_calls_launch_natively(fake):
    cache, w = RecordCache(), _weight()
    x1, x2 = torch.randn(4, 32), torch.randn(4, 32)
    y1 = cache.run((4,), x1, w, None, torch.float32, stream=11)
    y2 = cache.run((4,), x2, w, None, torch.float32, stream=11)
    assert [e[0] for e in fake.log] == ["record", "context", "context"]  # no prepared launch ran
    assert fake.log[1] == ("context", False)
    assert fake.log[0][1:] == ((0, 1), (True, True))
    assert [p[0] for *_, p in fake.launches] == [q(x1.data_ptr()), q(x2.data_ptr())]
    assert [p[1] for *_, p in fake.launches] == [q(y1.data_ptr()), q(y2.data_ptr())]
    assert {launch[:5] for launch in fake.launches} == {(0xF00D, (3, 1, 1), (128, 1, 1), 256, 11)}
    assert native.counts() == {"launched": 2, "declined": 0, "launch_failures": 0}


def test_the_scale_is_source_2_and_a_misaligned_one_is_copied(fake):
    """scale_x is the native launch's source 2; one at an offset the kernel's 16-byte loads refuse (a
    per-token slice: torch.func.vmap's per-member calls of the op) is copied first and launched
    natively. (It went to the prepared launch as it was, whose launcher refused it on the GPU with
    SP0704, a38.)"""
    cache, w = RecordCache(), _weight()
    x, scale = torch.randn(4, 32), torch.ones(8)
    cache.run((4,), x, w, scale[:4], torch.float32, stream=3)
    assert fake.log[0][1:] == ((0, 1, 2), (True, True, False))
    assert fake.launches[-1][5][2] == q(scale.data_ptr())
    cache.run((4,), x, w, scale[1:5], torch.float32, stream=3)  # 4 bytes off: the slot wants 16
    copied = int.from_bytes(fake.launches[-1][5][2], "little")
    assert copied != scale.data_ptr() + 4 and copied % 16 == 0
    assert native.counts()["declined"] == 0 and native.counts()["launched"] == 2


def test_a_failed_native_launch_falls_back_and_disables_the_record(fake):
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    fake.result = 719
    with pytest.warns(RuntimeWarning, match="a native launch failed with CUresult 719; this launch record keeps"):
        y = cache.run((4,), x, w, None, torch.float32, stream=5)
    (record,) = cache.records.values()
    assert fake.log[-1] == ("prepared", (x.data_ptr(), y.data_ptr()), 5) and len(fake.launches) == 1
    assert record.native is None and record.native_error == 719
    fake.result = 0
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert len(fake.launches) == 1 and fake.log[-1][0] == "prepared"  # for good


def test_a_launch_in_another_context_is_retried_with_the_kernel_s_context(fake):
    """CUDA_ERROR_INVALID_CONTEXT (201) or INVALID_HANDLE (400): torch switched contexts behind the
    per-thread cache; the kernel's context is made current (forced) and the launch retried."""
    cache, w = RecordCache(), _weight()
    fake.results = [201]
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=5)
    assert [e for e in fake.log if e[0] != "record"] == [("context", False), ("context", True)]
    (record,) = cache.records.values()
    assert len(fake.launches) == 2 and record.native is not None
    assert native.counts() == {"launched": 1, "declined": 0, "launch_failures": 1}
    fake.results = [400, 400]
    with pytest.warns(RuntimeWarning, match="CUresult 400"):
        cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=5)
    assert record.native is None and fake.log[-1][0] == "prepared"


def test_a_record_keeps_its_launcher_s_machine_code_alive(fake):
    """The record calls machine code the launcher's LLVM engine owns (and reads its state array):
    forgetting the launcher (``native.reset``) must not free them under a live record."""
    import gc
    import weakref

    cache, w = RecordCache(), _weight()
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=5)
    first = weakref.ref(native.launcher())
    native.reset()
    gc.collect()
    assert first() is not None  # the record's launch still points into its engine
    x = torch.randn(4, 32)
    y = cache.run((4,), x, w, None, torch.float32, stream=5)
    assert [p[:2] for *_, p in fake.launches[-1:]] == [[q(x.data_ptr()), q(y.data_ptr())]]
    assert first().counts()["launched"] == 2


def test_not_used_while_capturing(fake, monkeypatch):
    cache, w = RecordCache(), _weight()
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=5)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    x = torch.randn(4, 32)
    y = cache.run((4,), x, w, None, torch.float32, stream=5)
    assert fake.log[-1] == ("prepared", (x.data_ptr(), y.data_ptr()), 5) and len(fake.launches) == 1


def test_the_one_launch_split_k_variant_launches_natively_and_a_capture_the_two_launch_plan(fake, monkeypatch):
    fake.n_launches, fake.decode = 2, True
    monkeypatch.delenv(kernels.DECODE_REDUCE_ENV, raising=False)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    (record,) = cache.records.values()
    assert record.eager is not None and record.native is not None and len(fake.launches) == 1
    assert [e[0] for e in fake.log] == ["record", "context"]
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    y = cache.run((4,), x, w, None, torch.float32, stream=5)
    assert fake.log[-2:] == [("prepared", (x.data_ptr(), y.data_ptr()), 5)] * 2 and len(fake.launches) == 1


def test_a_two_launch_plan_launches_both_natively(fake):
    """The split-K plan's second launch (the reduction) is native too: no prepared launch runs."""
    fake.n_launches = 2
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    y = cache.run((4,), x, w, None, torch.float32, stream=5)
    (record,) = cache.records.values()
    assert record.native is not None and [e[0] for e in fake.log] == ["record", "record", "context"]
    assert [p[:2] for *_, p in fake.launches] == [[q(x.data_ptr()), q(y.data_ptr())]] * 2
    assert native.counts() == {"launched": 2, "declined": 0, "launch_failures": 0}


def test_a_failed_second_launch_runs_only_the_rest_through_the_prepared_launches(fake):
    """The first launch ran natively: after the second fails, the prepared launches run the second
    only (the first is not repeated), and the record keeps to them for good."""
    fake.n_launches = 2
    fake.results = [0, 719]
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    with pytest.warns(RuntimeWarning, match="CUresult 719"):
        y = cache.run((4,), x, w, None, torch.float32, stream=5)
    assert len(fake.launches) == 2
    assert [e for e in fake.log if e[0] == "prepared"] == [("prepared", (x.data_ptr(), y.data_ptr()), 5)]
    (record,) = cache.records.values()
    assert record.native is None and record.native_error == 719
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert len(fake.launches) == 2 and [e[0] for e in fake.log[-2:]] == ["prepared"] * 2


def test_not_built_without_the_switch(fake, monkeypatch):
    w = _weight()  # the records live as long as the weight
    for value in ("0", "off"):  # anything but "1" switches it off
        monkeypatch.setenv(native.ENV, value)
        cache = RecordCache()
        cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=5)
        assert next(iter(cache.records.values())).native is None and fake.launches == []
        assert not native.enabled()


def test_on_by_default(fake, monkeypatch):
    monkeypatch.delenv(native.ENV)
    cache, w = RecordCache(), _weight()
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=5)
    assert native.enabled() and not native.requested()
    assert next(iter(cache.records.values())).native is not None and len(fake.launches) == 1


@pytest.mark.parametrize(("value", "warned"), [(None, False), ("1", True)])
def test_a_missing_launcher_warns_only_when_asked_for(monkeypatch, value, warned):
    import warnings

    from sparsile.backend.runtime import native_launch

    def unavailable(*args):
        raise OSError("no libcuda here")

    if value is None:
        monkeypatch.delenv(native.ENV, raising=False)
    else:
        monkeypatch.setenv(native.ENV, value)
    monkeypatch.setattr(native_launch, "RecordLauncher", unavailable)
    native.reset()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.launcher() is None
        messages = [str(c.message) for c in caught if issubclass(c.category, RuntimeWarning)]
        assert (messages == [f"sparsile.torch: {native.ENV}=1, but the native launcher is unavailable (OSError: "
                             "no libcuda here); calls use the prepared launches"]) == warned, messages
        assert warned or messages == []
    finally:
        native.reset()


def test_switch_is_documented():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "torch.md").read_text()
    assert "`SPARSILE_TORCH_NATIVE=0`" in docs and "on by default" in docs


def test_a_quantizing_record_launches_the_quantizer_and_the_gemm_natively(fake, monkeypatch):
    """e4m3 weights, eager: the record owns the quantized copy of x and its scales; its first launch
    quantizes x (per call: x only) into them, the GEMM reads them (per call: y only); one native call
    makes both launches, and the record is per stream."""
    planned: list[tuple] = []
    quantizers: list[tuple] = []

    def plan_sparse_linear(values, meta, x, *, out, scale_x=None, reduce=None, **kwargs):
        planned.append((x.data_ptr(), x.dtype, None if scale_x is None else scale_x.data_ptr()))
        return _Plan(fake.log, x, out, scale_x, 1)

    def prepare_quantize(x, xq, scale, per_call):
        quantizers.append((x.data_ptr(), xq.data_ptr(), scale.data_ptr(), per_call))
        return _Prepared(fake.log, per_call)

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=plan_sparse_linear,
                                                                       prepare_quantize=prepare_quantize))
    cache, w = RecordCache(), _weight()
    x1, x2 = torch.randn(4, 32), torch.randn(4, 32)
    y1 = cache.run((4, "quantize"), x1, w, None, torch.float32, stream=7, quantize=True)
    y2 = cache.run((4, "quantize"), x2, w, None, torch.float32, stream=7, quantize=True)
    ((key, record),) = cache.records.items()
    assert key == (4, "quantize", 7) and record.quantize and record.owns_workspace
    assert record.xq.dtype == torch.float8_e4m3fn and record.xq.shape == (4, 32) and record.sx.shape == (4,)
    assert quantizers == [(x1.data_ptr(), record.xq.data_ptr(), record.sx.data_ptr(), ("X",))]
    # then the one-launch plan of the 16-bit x, declined: this plan does not quantize x itself
    assert planned == [(record.xq.data_ptr(), torch.float8_e4m3fn, record.sx.data_ptr()),
                       (x1.data_ptr(), torch.float32, None)]
    assert record.eager is None
    assert [e for e in fake.log if e[0] == "record"] == [("record", (0,), (True,)), ("record", (1,), (True,))]
    assert not [e for e in fake.log if e[0] == "prepared"]  # every launch native
    assert [p[0] for *_, p in fake.launches[0::2]] == [q(x1.data_ptr()), q(x2.data_ptr())]  # the quantizer's x
    assert [p[1] for *_, p in fake.launches[1::2]] == [q(y1.data_ptr()), q(y2.data_ptr())]  # the GEMM's y
    assert native.counts()["launched"] == 4
    fake.results = [0, 719]  # the GEMM launch fails: only it is run again, by its prepared launch
    with pytest.warns(RuntimeWarning, match="CUresult 719"):
        y3 = cache.run((4, "quantize"), x1, w, None, torch.float32, stream=7, quantize=True)
    assert [e for e in fake.log if e[0] == "prepared"] == [("prepared", (y3.data_ptr(),), 7)]


def _quantizing_api(fake, planned: list, quantizers: list, qx_error: Exception | None = None,
                    split: bool = False, qx_shares: int = 1) -> SimpleNamespace:
    """A kernel API whose plan of a 16-bit x (no scale_x) is one launch that quantizes x itself
    (``quantizes_x``, reading x and writing y per call, in ``qx_shares`` K shares where the plan of
    the e4m3 x has one), or raises ``qx_error``; ``split``: two launches unless reduce="kernel"
    (split-K)."""
    def plan_sparse_linear(values, meta, x, *, out, scale_x=None, reduce=None, **kwargs):
        planned.append((x.dtype, scale_x is None, reduce))
        if x.dtype != torch.float8_e4m3fn and qx_error is not None:
            raise qx_error
        plan = _Plan(fake.log, x, out, scale_x, 2 if split and reduce != "kernel" else 1)
        plan.quantizes_x = x.dtype != torch.float8_e4m3fn
        plan.config = SimpleNamespace(split_k=qx_shares if plan.quantizes_x else 1)
        return plan

    def prepare_quantize(x, xq, scale, per_call):
        quantizers.append(per_call)
        return _Prepared(fake.log, per_call)

    return SimpleNamespace(plan_sparse_linear=plan_sparse_linear, prepare_quantize=prepare_quantize)


def test_a_small_quantizing_record_launches_once_eagerly_and_twice_in_a_capture(fake, monkeypatch):
    """quantizes_in_kernel (small T x N x K): an eager call is one native launch of the kernel
    that quantizes x itself (x and y per call, reduced in the kernel); a capture runs the quantizer
    and the GEMM (the prepared launches), which cost less GPU time."""
    planned, quantizers = [], []
    monkeypatch.setattr(kernels, "kernel_api", lambda: _quantizing_api(fake, planned, quantizers))
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    y = cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    ((_, record),) = cache.records.items()
    assert planned == [(torch.float8_e4m3fn, False, None), (torch.float32, True, "kernel")]
    assert quantizers == [("X",)] and len(record.prepared) == 2 and len(record.eager) == 1
    assert [e for e in fake.log if e[0] == "record"] == [("record", (0, 1), (True, True))]
    assert fake.launches[-1][5][:2] == [q(x.data_ptr()), q(y.data_ptr())] and len(fake.launches) == 1
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    y2 = record(x, None, 7)
    assert len(fake.launches) == 1  # nothing native in a capture: the quantizer, then the GEMM
    assert [e[1] for e in fake.log if e[0] == "prepared"] == [(x.data_ptr(),), (y2.data_ptr(),)]


@pytest.mark.parametrize("why", ["large", "no fit", "more shares", "env", "split beyond 16 tokens"])
def test_the_quantizing_eager_launch_is_not_planned(fake, monkeypatch, why):
    """Beyond quantizes_in_kernel's bounds, where the plan refuses (SP0852: the resident x does not
    fit) or fits the resident x only by splitting K more than the two-launch plan (8192 x 28672 at
    T = 1: 54 µs against 45 on the H200), or where it splits K and would reduce in a second launch
    (SPARSILE_DECODE_REDUCE set, or more than EAGER_REDUCE_MAX_T tokens, where the in-kernel
    reduction costs more GPU time than the launch it saves): the eager call keeps the quantizer and
    the GEMM."""
    from sparsile.stdlib.sparsity.errors import SparsityError

    planned, quantizers = [], []
    error = SparsityError("SP0852", "no fit") if why == "no fit" else None
    split = why in ("env", "split beyond 16 tokens")
    shares = 2 if why == "more shares" else 1
    monkeypatch.setattr(kernels, "kernel_api",
                        lambda: _quantizing_api(fake, planned, quantizers, error, split=split, qx_shares=shares))
    if why == "large":
        monkeypatch.setattr(kernels, "EAGER_QUANTIZE_IN_KERNEL_MAX", 4 * 8 * 32 - 1)
        monkeypatch.setattr(kernels, "EAGER_QUANTIZE_IN_KERNEL_SMALL", (4, 4 * 8 * 32 - 1))
        monkeypatch.setattr(kernels, "EAGER_QUANTIZE_IN_KERNEL_SMALL_WEIGHT", (16, 8 * 32 - 1))
    if why == "env":
        monkeypatch.setenv(kernels.DECODE_REDUCE_ENV, "launch")
    cache, w = RecordCache(), _weight()
    t = kernels.EAGER_REDUCE_MAX_T + 1 if why == "split beyond 16 tokens" else 4
    x = torch.randn(t, 32)
    cache.run((t, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    ((_, record),) = cache.records.items()
    if why == "split beyond 16 tokens":
        assert planned[-1] == (torch.float32, True, None)  # no reduce="kernel" asked for
    launches = 2 if why in ("large", "no fit", "more shares") else 3  # the quantizer and the GEMM (split-K: and
    # its reduction)
    assert record.eager is None and len(record.prepared) == launches
    assert len(fake.launches) == launches  # all native
    assert len(planned) == (1 if why == "large" else 2)


def test_the_quantizing_eager_launch_bounds():
    """The one launch where its GPU time stays within the host time it saves (the H200 measurements
    in EAGER_QUANTIZE_IN_KERNEL_MAX's and _SMALL_WEIGHT's docstrings): T = 1 up to N x K = 2^28
    (28672 x 4096, 8192 x 28672 whose split the record then checks), T = 4 up to 2^26 (8192 x 8192,
    4096 x 14336), T <= 16 on weights up to N x K = 2^25 (8B qkv and o), and T x N x K <= 2^26 at any
    T; not 57344 x 8192, nor 28672 x 4096 beyond T = 2, nor 4096 x 14336 beyond T = 4."""
    inside = [(1, 4096, 14336), (1, 28672, 4096), (1, 8192, 28672), (2, 28672, 4096), (2, 10240, 8192),
              (4, 8192, 8192), (4, 4096, 14336), (4, 6144, 4096), (16, 1024, 4096), (64, 1024, 1024),
              (5, 6144, 4096), (8, 4096, 4096), (16, 4096, 4096), (16, 6144, 4096)]
    outside = [(1, 57344, 8192), (3, 28672, 4096), (4, 10240, 8192), (5, 4096, 14336), (16, 4096, 14336),
               (16, 28672, 4096), (17, 6144, 4096), (32, 4096, 4096)]
    assert all(kernels.quantizes_in_kernel(*c) for c in inside)
    assert not any(kernels.quantizes_in_kernel(*c) for c in outside)


def test_a_launch_taking_nothing_per_call(fake, monkeypatch):
    """A quantizing record's split-K GEMM reads the record's own x copy and writes its workspace:
    nothing per call. Its prepared launch takes (), its native record no source; both still run."""
    class SplitPlan:
        def __init__(self, x, out, scale_x):
            self.workspace = torch.empty(2, 4, 8)
            self.x, self.out, self.scale_x = x, out, scale_x

        def launches(self):
            launcher = SimpleNamespace(prepare=lambda per_call, **fixed: _Prepared(fake.log, per_call))
            main = _Kernel([SimpleNamespace(name=n) for n in ("x", "w")], launcher)
            reduce = _Kernel([SimpleNamespace(name=n) for n in ("w", "y", "scale_x")], launcher)
            return [(main, (3,), (self.x, self.workspace), {}),
                    (reduce, (3,), (self.workspace, self.out, self.scale_x), {})]

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(
        plan_sparse_linear=lambda values, meta, x, *, out, scale_x=None, **kw: SplitPlan(x, out, scale_x),
        prepare_quantize=lambda x, xq, scale, per_call: _Prepared(fake.log, per_call)))
    monkeypatch.setattr(native, "ENTRY_POINTS", None)
    native.reset()
    monkeypatch.setenv(native.ENV, "0")  # the prepared launches, in order
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    y = cache.run((4, "quantize"), x, w, None, torch.float32, stream=3, quantize=True)
    assert [e for e in fake.log if e[0] == "prepared"] == [
        ("prepared", (x.data_ptr(),), 3), ("prepared", (), 3), ("prepared", (y.data_ptr(),), 3)]
    monkeypatch.setenv(native.ENV, "1")
    monkeypatch.setattr(native, "ENTRY_POINTS", fake.entry_points())
    native.reset()
    fake.log.clear()
    cache = RecordCache()
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=3, quantize=True)
    assert [e[1:] for e in fake.log if e[0] == "record"] == [((0,), (True,)), ((), ()), ((1,), (True,))]
    assert len(fake.launches) == 3 and not [e for e in fake.log if e[0] == "prepared"]


def test_a_quantizing_record_whose_plan_pads_x_quantizes_and_rebinds_each_call(fake, monkeypatch):
    """K not a multiple of the kernel's K step: the plan reads a zero-padded copy of x made when it
    was built, which the record's quantizer would never write. The record keeps no prepared
    launches then; each call quantizes x into fresh buffers and rebinds the plan to them."""
    rebound: list[tuple] = []

    class PaddedPlan:
        def __init__(self, x, out, scale_x):
            self.x, self.out, self.scale_x = torch.zeros(x.shape[0], x.shape[1] + 8, dtype=x.dtype), out, scale_x

        def launches(self):
            launcher = SimpleNamespace(prepare=lambda per_call, **fixed: _Prepared(fake.log, per_call))
            params = [SimpleNamespace(name=n) for n in ("x", "y", "scale_x")]
            return [(_Kernel(params, launcher), (3,), (self.x, self.out, self.scale_x), {})]

        def rebind(self, x, out, scale_x=None):
            rebound.append((x.dtype, tuple(x.shape), out.data_ptr(), tuple(scale_x.shape)))
            return SimpleNamespace(run=lambda stream=None: fake.log.append(("run", stream)))

    def quantize(x, interpret=False):
        return torch.zeros(x.shape, dtype=torch.float8_e4m3fn), torch.ones(x.shape[0])

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(
        plan_sparse_linear=lambda values, meta, x, *, out, scale_x=None, **kw: PaddedPlan(x, out, scale_x),
        prepare_quantize=lambda x, xq, scale, per_call: _Prepared(fake.log, per_call), quantize=quantize))
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    y = cache.run((4, "quantize"), x, w, None, torch.float32, stream=3, quantize=True)
    (record,) = cache.records.values()
    assert record.prepared is None and record.native is None and fake.launches == []
    assert rebound == [(torch.float8_e4m3fn, (4, 32), y.data_ptr(), (4,))] and fake.log[-1] == ("run", 3)


def test_a_static_quantizing_record_reads_the_scale_s_memory(fake, monkeypatch):
    """e4m3 weights with a static input scale, eager: the record's first launch is the static quantizer
    with x per call and the record's e4m3 copy and the layer's scale fixed (its memory, read by the
    kernel on each launch: no copy, no host read), the GEMM reads that copy with the scale itself as
    its per-tensor scale_x; one native call makes both launches (none takes a scale per call), and
    the one-launch kernel that quantizes x per token is never planned."""
    planned, quantizers, statics = [], [], []
    api = _quantizing_api(fake, planned, quantizers)

    def prepare_quantize_static(x, xq, scale, per_call):
        statics.append((x.data_ptr(), xq.data_ptr(), scale.data_ptr(), per_call))
        return _Prepared(fake.log, per_call)

    def plan_sparse_linear(values, meta, x, *, out, scale_x=None, **kwargs):
        planned.append((x.dtype, None if scale_x is None else scale_x.data_ptr()))
        return _Plan(fake.log, x, out, scale_x, 1)

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(
        plan_sparse_linear=plan_sparse_linear, prepare_quantize=api.prepare_quantize,
        prepare_quantize_static=prepare_quantize_static))
    cache, w, static = RecordCache(), _weight(), torch.tensor([0.25])
    x = torch.randn(4, 32)
    key = (4, "quantize-static", static.data_ptr())
    y = cache.run(key, x, w, None, torch.float32, stream=7, quantize=True, static=static)
    ((stored, record),) = cache.records.items()
    assert stored == (*key, 7) and record.static.data_ptr() == static.data_ptr() and record.sx is record.static
    assert statics == [(x.data_ptr(), record.xq.data_ptr(), static.data_ptr(), ("X",))] and quantizers == []
    assert planned == [(torch.float8_e4m3fn, static.data_ptr())] and record.eager is None
    assert [e for e in fake.log if e[0] == "record"] == [("record", (0,), (True,)), ("record", (1,), (True,))]
    assert [p[0] for *_, p in fake.launches[0::2]] == [q(x.data_ptr())]
    assert [p[1] for *_, p in fake.launches[1::2]] == [q(y.data_ptr())]
