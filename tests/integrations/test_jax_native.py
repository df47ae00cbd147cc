"""The native CUDA handler of sparsile.jax (integrations/jax/native.py), JIT-compiled on the CPU and
called through ctypes with call frames built here as XLA lays them out: a fake API table (Stream_Get),
fake cuLaunchKernel / cuLaunchKernelEx / cuTensorMapEncodeTiled recording what they are given, and a
fake Python slow path recording which frames reach it."""

from __future__ import annotations

import ctypes as c
from typing import Any

import pytest

pytest.importorskip("jax")
pytest.importorskip("llvmlite")

from sparsile.backend.runtime.cudalib import LaunchConfig
from sparsile.integrations.jax import ffi, native

X, W, OUT, W_CACHED, STREAM, CTX = 0xDEAD00, 0xA000, 0xBEEF00, 0xA000, 0x5100, 0xC7
TMAP_OFF, OUT_OFF, NBYTES = 64, 192, 200
_LAUNCH = c.CFUNCTYPE(c.c_int, c.c_void_p, *[c.c_uint] * 7, c.c_void_p, c.c_void_p, c.c_void_p)
_LAUNCH_EX = c.CFUNCTYPE(c.c_int, c.POINTER(LaunchConfig), c.c_void_p, c.c_void_p, c.c_void_p)
_ENCODE = c.CFUNCTYPE(c.c_int, c.c_void_p, c.c_int, c.c_uint, c.c_void_p, c.POINTER(c.c_uint64),
                      c.POINTER(c.c_uint64), c.POINTER(c.c_uint32), c.POINTER(c.c_uint32), c.c_int, c.c_int,
                      c.c_int, c.c_int)
OFFSETS = (0, 8, TMAP_OFF, OUT_OFF)  # x: pointer, n: i32 scalar, w: tensor map, out: pointer
SIZES = (8, 4, 128, 8)


def _template() -> bytes:
    raw = bytearray(b"\x11" * NBYTES)  # stale pointer slots
    raw[8:12] = (77).to_bytes(4, "little")
    raw[TMAP_OFF:TMAP_OFF + 128] = b"\xcd" * 128  # the map encoded for W_CACHED
    return bytes(raw)


TMAP_ARGS = {"tensorDataType": 9, "tensorRank": 2, "globalDim": [64, 32], "globalStrides": [128],
             "boxDim": [64, 16], "elementStrides": [1, 1], "interleave": 0, "swizzle": 3, "l2Promotion": 2,
             "oobFill": 0}


class Fakes:
    """The fake driver, API table and slow path; what each saw."""

    def __init__(self, launch_result: int = 0, encode_result: int = 0, sizes: tuple[int, ...] = SIZES):
        self.launches: list[tuple] = []
        self.encodes: list[tuple] = []
        self.slow: list[int] = []

        def params(kernel_params: int) -> list[bytes]:
            ptrs = (c.c_void_p * len(sizes)).from_address(kernel_params)
            return [c.string_at(ptrs[k], size) for k, size in enumerate(sizes)]

        def launch(fn: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: int,
                   kernel_params: int, extra: int) -> int:
            self.launches.append((fn, (gx, gy, gz), (bx, by, bz), shared, stream, params(kernel_params), extra))
            return launch_result

        def launch_ex(config: Any, fn: int, kernel_params: int, extra: int) -> int:
            cf = config.contents
            attrs = tuple((cf.attrs[i].id, tuple(cf.attrs[i].value[:3])) for i in range(cf.numAttrs))
            self.launches.append((fn, (cf.gridDimX, cf.gridDimY, cf.gridDimZ),
                                  (cf.blockDimX, cf.blockDimY, cf.blockDimZ), cf.sharedMemBytes, cf.hStream,
                                  params(kernel_params), ("ex", cf.numAttrs, attrs)))
            return launch_result

        def encode(out: int, dtype: int, rank: int, address: int, dims: Any, strides: Any, box: Any, estr: Any,
                   interleave: int, swizzle: int, l2: int, oob: int) -> int:
            self.encodes.append((out % 64, dtype, rank, address, dims[:rank], strides[:rank - 1], box[:rank],
                                 estr[:rank], interleave, swizzle, l2, oob))
            c.memmove(out, bytes([0xE0 + len(self.encodes)]) * 128, 128)
            return encode_result

        def slow(frame: int) -> int:
            self.slow.append(frame)
            return 0x5105

        def stream_get(args: Any) -> int:
            assert args.contents.ctx == CTX and args.contents.struct_size == c.sizeof(ffi._StreamGetArgs)
            args.contents.stream = STREAM
            return 0

        self.ordinal: int | None = None  # what DeviceOrdinal_Get answers (None: it fails)

        def ordinal_get(args: Any) -> int:
            assert args.contents.ctx == CTX and args.contents.struct_size == c.sizeof(ffi._OrdinalGetArgs)
            if self.ordinal is None:
                return 0xE770
            args.contents.device_ordinal = self.ordinal
            return 0

        self.callbacks = (_LAUNCH(launch), _LAUNCH_EX(launch_ex), _ENCODE(encode), ffi._HANDLER(slow),
                          ffi._STREAM_GET(stream_get), ffi._ORDINAL_GET(ordinal_get))
        self.api = ffi._Api(struct_size=c.sizeof(ffi._Api))
        self.api.Stream_Get = c.cast(self.callbacks[4], c.c_void_p).value

    def with_ordinal(self, ordinal: int | None) -> None:
        """Give the API table DeviceOrdinal_Get (answering ``ordinal``; None: failing)."""
        self.ordinal = ordinal
        self.api.DeviceOrdinal_Get = c.cast(self.callbacks[5], c.c_void_p).value

    def addresses(self) -> tuple[int, ...]:
        return tuple(c.cast(f, c.c_void_p).value for f in self.callbacks[:4])


class Frame:
    """A call frame with operands (x, w), one result and ``sparsile_plan`` (and another attribute)."""

    def __init__(self, api: Any, plan: int, data: tuple[int, ...] = (X, W, OUT), stage: int = 3,
                 extension: int = 0):
        self.bufs = [ffi._Buffer(c.sizeof(ffi._Buffer), None, 11, d, 0, None) for d in data]
        self.in_items = (c.c_void_p * 2)(*(c.addressof(b) for b in self.bufs[:2]))
        self.out_items = (c.c_void_p * 1)(c.addressof(self.bufs[2]))
        self.keep = []
        names, values = [], []
        for name, value in ((b"other_attr123", 5), (ffi.PLAN_ATTRIBUTE.encode(), plan)):
            text = c.create_string_buffer(name)
            span = (c.c_uint64 * 2)(c.addressof(text), len(name))
            number = c.c_int64(value)
            scalar = ffi._Scalar(5, c.addressof(number))
            self.keep += [text, span, number, scalar]
            names.append(c.addressof(span))
            values.append(c.addressof(scalar))
        self.names, self.attrs = (c.c_void_p * 2)(*names), (c.c_void_p * 2)(*values)
        self.frame = ffi._CallFrame(
            c.sizeof(ffi._CallFrame), extension or None, c.addressof(api), CTX, stage,
            ffi._List(c.sizeof(ffi._List), None, 2, None, c.addressof(self.in_items)),
            ffi._List(c.sizeof(ffi._List), None, 1, None, c.addressof(self.out_items)),
            ffi._Attrs(c.sizeof(ffi._Attrs), None, 2, None, c.addressof(self.names), c.addressof(self.attrs)), None)


def _record(cluster: bool = False, attrs: int = 0) -> list[int]:
    tmap = native.tmap_entry(1, TMAP_OFF, TMAP_ARGS, W_CACHED)
    return native.record_words(0xF00D, (3, 2, 1), (128, 1, 1), 1024, attrs if cluster else 0, _template(), OFFSETS,
                               [(0, 0, 0), (-1, OUT_OFF, 15)], [tmap])


PLAN = 0x1234_5678_9ABC


@pytest.fixture
def setup() -> Any:
    fakes = Fakes()
    h = native.NativeHandler(*fakes.addresses()[3:], *fakes.addresses()[:3])
    assert h.publish(PLAN, _record())
    run = c.CFUNCTYPE(c.c_void_p, c.c_void_p)(h.address)
    return fakes, h, lambda frame: run(c.addressof(frame.frame))


def _expected_params(x: int = X, tmap: bytes = b"\xcd" * 128, out: int = OUT) -> list[bytes]:
    return [x.to_bytes(8, "little"), (77).to_bytes(4, "little"), tmap, out.to_bytes(8, "little")]


def test_armed_plan_launches_natively_with_xla_pointers_and_stream(setup: Any) -> None:
    fakes, h, call = setup
    for _ in range(3):
        assert call(Frame(fakes.api, PLAN)) is None
    assert fakes.launches == [(0xF00D, (3, 2, 1), (128, 1, 1), 1024, STREAM, _expected_params(), None)] * 3
    assert fakes.slow == [] and fakes.encodes == []
    assert h.counts() == {"fast": 3, "slow": 0, "launch_failures": 0}


def test_moved_tensor_map_buffer_is_reencoded_natively_in_the_call_s_copy(setup: Any) -> None:
    fakes, h, call = setup
    assert call(Frame(fakes.api, PLAN, (X + 8, 0xB000, OUT + 512))) is None
    assert h.counts() == {"fast": 1, "slow": 0, "launch_failures": 0}
    assert fakes.encodes == [(0, 9, 2, 0xB000, [64, 32], [128], [64, 16], [1, 1], 0, 3, 2, 0)]
    assert fakes.launches[0][5] == _expected_params(X + 8, b"\xe1" * 128, OUT + 512)
    assert call(Frame(fakes.api, PLAN)) is None  # back at the cached address: the record's own map
    assert fakes.launches[1][5] == _expected_params() and len(fakes.encodes) == 1 and fakes.slow == []


@pytest.mark.parametrize("case", ["misaligned map buffer", "misaligned aligned16 pointer", "failing encode",
                                  "unarmed", "unknown plan", "other stage", "plan id 0"])
def test_slow_path_cases(setup: Any, case: str) -> None:
    fakes, h, call = setup
    plan, data, stage = PLAN, (X, W, OUT), 3
    if case == "misaligned map buffer":
        data = (X, 0xB008, OUT)
    elif case == "misaligned aligned16 pointer":
        data = (X, W, OUT + 8)
    elif case == "failing encode":
        fakes = Fakes(encode_result=1)
        h = native.NativeHandler(*fakes.addresses()[3:], *fakes.addresses()[:3])
        h.publish(PLAN, _record())
        run = c.CFUNCTYPE(c.c_void_p, c.c_void_p)(h.address)

        def call(frame: Frame) -> Any:
            return run(c.addressof(frame.frame))
        data = (X, 0xB000, OUT)
    elif case == "unarmed":
        h.publish(PLAN, None)
    elif case == "unknown plan":
        plan = PLAN + 1
    elif case == "other stage":
        stage = 1
    else:
        plan = 0
    frame = Frame(fakes.api, plan, data, stage)
    assert call(frame) == 0x5105  # the slow path's result is the handler's
    assert fakes.slow == [c.addressof(frame.frame)] and fakes.launches == []
    assert h.counts() == {"fast": 0, "slow": 1, "launch_failures": 0}


@pytest.mark.parametrize("grid", [(0, 2, 1), (3, 0, 1), (3, 2, 0)])
def test_a_record_with_an_empty_grid_takes_the_slow_path(grid: tuple) -> None:
    """CUDA refuses a 0 grid dimension: such a record never reaches cuLaunchKernel (arm makes none:
    test_arm_makes_no_record_of_an_empty_grid; this is the backstop in the launch core)."""
    from sparsile.backend.runtime.native_launch import R_GX, R_GZ

    fakes = Fakes()
    h = native.NativeHandler(*fakes.addresses()[3:], *fakes.addresses()[:3])
    words = _record()
    words[R_GX:R_GZ + 1] = grid
    h.publish(PLAN, words)
    frame = Frame(fakes.api, PLAN)
    assert c.CFUNCTYPE(c.c_void_p, c.c_void_p)(h.address)(c.addressof(frame.frame)) == 0x5105
    assert fakes.launches == [] and fakes.slow == [c.addressof(frame.frame)]
    assert h.counts() == {"fast": 0, "slow": 1, "launch_failures": 0}


def test_failing_launch_goes_to_the_slow_path_and_marks_the_record() -> None:
    fakes = Fakes(launch_result=700)
    h = native.NativeHandler(*fakes.addresses()[3:], *fakes.addresses()[:3])
    h.publish(PLAN, _record())
    frame = Frame(fakes.api, PLAN)
    assert c.CFUNCTYPE(c.c_void_p, c.c_void_p)(h.address)(c.addressof(frame.frame)) == 0x5105
    assert len(fakes.launches) == 1 and fakes.slow == [c.addressof(frame.frame)]
    assert native.launch_failed(h.record(PLAN)) == 700
    assert h.counts() == {"fast": 0, "slow": 1, "launch_failures": 1}


@pytest.mark.parametrize("cluster,pdl", [((2, 1, 1), False), ((1, 1, 1), True), ((2, 1, 1), True)])
def test_cluster_and_pdl_plans_launch_through_cuLaunchKernelEx(setup: Any, cluster: tuple, pdl: bool) -> None:
    from sparsile.backend.runtime import cudalib

    fakes, h, call = setup
    block = native.launch_attributes(cluster, pdl)
    h.publish(PLAN, _record(cluster=True, attrs=c.addressof(block)))
    assert call(Frame(fakes.api, PLAN)) is None
    expected = (((cudalib.CLUSTER_DIMENSION, cluster),) if cluster != (1, 1, 1) else ()) + \
        (((cudalib.PROGRAMMATIC_STREAM_SERIALIZATION, (1, 0, 0)),) if pdl else ())
    assert fakes.launches == [(0xF00D, (3, 2, 1), (128, 1, 1), 1024, STREAM, _expected_params(),
                               ("ex", len(expected), expected))]


def test_metadata_query_reaches_the_python_handler_and_is_answered() -> None:
    fakes = Fakes()
    python_handler = ffi._make_handler("cuda")
    h = native.NativeHandler(c.cast(python_handler, c.c_void_p).value, *fakes.addresses()[:3])
    metadata = ffi._Metadata(c.sizeof(ffi._Metadata))
    ext = ffi._MetadataExtension(ffi._ExtensionBase(c.sizeof(ffi._MetadataExtension), 1, None), c.pointer(metadata))
    frame = Frame(fakes.api, PLAN, extension=c.addressof(ext))
    assert c.CFUNCTYPE(c.c_void_p, c.c_void_p)(h.address)(c.addressof(frame.frame)) is None
    assert (metadata.api_version.major_version, metadata.api_version.minor_version) == ffi.api_version()
    assert h.counts()["slow"] == 1 and fakes.launches == []


def test_other_extensions_do_not_leave_the_fast_path(setup: Any) -> None:
    fakes, h, call = setup
    other = ffi._ExtensionBase(c.sizeof(ffi._ExtensionBase), 7, None)
    assert call(Frame(fakes.api, PLAN, extension=c.addressof(other))) is None
    assert len(fakes.launches) == 1 and fakes.slow == [] and h.counts()["fast"] == 1


@pytest.mark.parametrize(("record", "xla", "fast"), [(1, 1, True), (0, 0, True), (0, 1, False), (1, None, False)])
def test_the_device_xla_runs_on_must_be_the_record_s(setup: Any, record: int, xla: int | None, fast: bool) -> None:
    fakes, h, call = setup
    fakes.with_ordinal(xla)
    words = _record()
    words[15] = record
    h.publish(PLAN, words)
    assert call(Frame(fakes.api, PLAN)) == (None if fast else 0x5105)
    assert (len(fakes.launches), len(fakes.slow)) == ((1, 0) if fast else (0, 1))


def test_republishing_keeps_old_records_alive_and_swaps_the_pointer(setup: Any) -> None:
    fakes, h, call = setup
    first = h.record(PLAN)
    words = _record()
    words[2] = 9  # grid x
    h.publish(PLAN, words)
    assert h.record(PLAN) is not first and any(r is first for r, _ in h._records)
    call(Frame(fakes.api, PLAN))
    assert fakes.launches[0][1] == (9, 2, 1)


def test_a_pointer_slot_naming_a_missing_buffer_takes_the_slow_path(setup: Any) -> None:
    """A record whose pointer names operand 5 of a frame with 2 operands: never a launch with the
    out-of-range sentinel as an address."""
    fakes, h, call = setup
    words = native.record_words(0xF00D, (3, 2, 1), (128, 1, 1), 1024, 0, _template(), OFFSETS,
                                [(5, 0, 0), (-1, OUT_OFF, 15)], [native.tmap_entry(1, TMAP_OFF, TMAP_ARGS, W_CACHED)])
    assert h.publish(PLAN, words)
    frame = Frame(fakes.api, PLAN)
    call(frame)
    assert fakes.launches == [] and fakes.slow == [c.addressof(frame.frame)]


def test_the_same_plan_traced_again_keeps_the_first_plan_object() -> None:
    """A plan number names the plan's content: tracing it again (an eager call, a retrace) keeps the
    first CallPlan, whose launcher and module an armed native record launches."""
    first, second = object(), object()
    number = ffi.add_plan(first, "test plan: same content")
    assert ffi.add_plan(second, "test plan: same content") == number and ffi._plans[number] is first
    del ffi._plans[number]


def test_a_published_record_keeps_its_owner_alive(setup: Any) -> None:
    import gc
    import weakref

    _fakes, h, _call = setup

    class Launcher:
        pass

    owner = Launcher()
    alive = weakref.ref(owner)
    assert h.publish(PLAN, _record(), owner=owner)
    h.publish(PLAN, _record())  # replaced: the old record and its owner are still kept
    del owner
    gc.collect()
    assert alive() is not None


def test_env_switch() -> None:
    import os

    old = os.environ.get(native.ENV)
    try:
        os.environ[native.ENV] = "0"
        assert not native.enabled()
        os.environ[native.ENV] = "1"
        assert native.enabled()
    finally:
        os.environ.pop(native.ENV, None) if old is None else os.environ.__setitem__(native.ENV, old)


class FakeLauncher:
    """What native.arm reads of a runtime Launcher (snapshot: the bytes its converters packed)."""

    def __init__(self) -> None:
        from sparsile.backend.runtime.params import ParamSpec, PointerParam, ScalarParam

        self.spec = ParamSpec((PointerParam("x", "f32"), ScalarParam("n", "i32"), PointerParam("out", "f32")))
        self.jax_needs_info: set[str] = set()
        self.cluster, self.block, self.dynamic_shared = (1, 1, 1), (256, 1, 1), 0
        self.pdl = False
        self.function = type("F", (), {"handle": 0xF00D})()
        self.device = type("D", (), {"max_grid_dims": (2**31 - 1, 65535, 65535), "name": "fake"})()
        self.snapshots: list[list[Any]] = []

    def snapshot(self, values: list[Any]) -> tuple[bytes, tuple[int, ...]]:
        self.snapshots.append(list(values))
        x, n, out = values
        return x.to_bytes(8, "little") + n.to_bytes(4, "little") + bytes(4) + out.to_bytes(8, "little"), (0, 8, 16)


class FakePlan:
    grid = (5, 1, 1)

    def __init__(self) -> None:
        self.sources = [("x", "in", 0), ("n", "value", 33), ("out", "out", 0)]
        self._launcher = FakeLauncher()

    def launcher(self, ordinal: int) -> FakeLauncher:
        return self._launcher

    def launch_values(self, spec: Any, needs: set[str], ins: list, outs: list, ordinal: int) -> list[Any]:
        return [ins[0].ptr, 33, outs[0].ptr]


def test_arm_publishes_the_launcher_packing_once_and_failures_disable_the_plan() -> None:
    fakes = Fakes(sizes=(8, 4, 8))
    native.install(fakes.addresses()[3], fakes.addresses()[:3])
    try:
        plan, plan_id = FakePlan(), 0x77_0000_0001
        ins, outs = [ffi.XlaBuffer(0x1000, "float32", (4,)), ffi.XlaBuffer(0x2000, "float32", (4,))], \
            [ffi.XlaBuffer(0x3000, "float32", (4,))]
        assert native.arm(plan_id, plan, ins, outs, 0) and native.arm(plan_id, plan, ins, outs, 0)
        assert len(plan._launcher.snapshots) == 1  # armed once
        frame = Frame(fakes.api, plan_id, (0x1100, 0x2000, 0x3300))
        run = c.CFUNCTYPE(c.c_void_p, c.c_void_p)(native.handler().address)
        assert run(c.addressof(frame.frame)) is None and fakes.slow == []
        assert fakes.launches == [(0xF00D, (5, 1, 1), (256, 1, 1), 0, STREAM,
                                   [(0x1100).to_bytes(8, "little"), (33).to_bytes(4, "little"),
                                    (0x3300).to_bytes(8, "little")], None)]
        record = native.handler().record(plan_id)
        assert list(record[16:19]) == [0, 8, 16] and list(record[19:25]) == [0, 0, 0, -1, 16, 0]
        assert not native.arm(plan_id, plan, ins, outs, 1)
        assert native.DISABLED.pop(plan_id) == "runs on devices 0 and 1 (a record launches on one)"
        assert native.handler().record(plan_id) is None and native.arm(plan_id, plan, ins, outs, 0)
        native.handler().record(plan_id)[14] = 700  # as a failed fast launch leaves it
        assert not native.arm(plan_id, plan, ins, outs, 0)
        assert native.DISABLED[plan_id] == "the fast-path launch failed with CUresult 700"
        assert native.handler().record(plan_id) is None
        assert native.counts()["fast"] == 1
    finally:
        native.uninstall()


def test_arm_makes_no_record_of_an_empty_grid() -> None:
    """A plan of an empty grid stays on the Python handler, whose launcher checks the buffers and
    launches nothing."""
    fakes = Fakes(sizes=(8, 4, 8))
    native.install(fakes.addresses()[3], fakes.addresses()[:3])
    try:
        plan, plan_id = FakePlan(), 0x77_0000_0002
        plan.grid = (5, 0, 1)
        ins, outs = [ffi.XlaBuffer(0x1000, "float32", (4,)), ffi.XlaBuffer(0x2000, "float32", (4,))], \
            [ffi.XlaBuffer(0x3000, "float32", (4,))]
        assert not native.arm(plan_id, plan, ins, outs, 0)
        assert native.DISABLED.pop(plan_id) == "the grid is empty (a 0 dimension): nothing to launch"
        assert native.handler().record(plan_id) is None and plan._launcher.snapshots == []
    finally:
        native.uninstall()


@pytest.mark.parametrize("cluster", [(1, 1, 1), (2, 1, 1)])
def test_arm_of_a_pdl_launcher_launches_with_its_attributes(cluster: tuple) -> None:
    """A plan whose launcher is a programmatic dependent launch (``pdl=True``) records the launch
    attributes: the native launch passes programmatic stream serialization (after the cluster)."""
    from sparsile.backend.runtime import cudalib

    fakes = Fakes(sizes=(8, 4, 8))
    native.install(fakes.addresses()[3], fakes.addresses()[:3])
    try:
        plan, plan_id = FakePlan(), 0x77_0000_0005
        plan._launcher.pdl, plan._launcher.cluster = True, cluster
        ins, outs = [ffi.XlaBuffer(0x1000, "float32", (4,)), ffi.XlaBuffer(0x2000, "float32", (4,))], \
            [ffi.XlaBuffer(0x3000, "float32", (4,))]
        assert native.arm(plan_id, plan, ins, outs, 0), native.DISABLED
        frame = Frame(fakes.api, plan_id, (0x1100, 0x2000, 0x3300))
        assert c.CFUNCTYPE(c.c_void_p, c.c_void_p)(native.handler().address)(c.addressof(frame.frame)) is None
        expected = (((cudalib.CLUSTER_DIMENSION, cluster),) if cluster != (1, 1, 1) else ()) + \
            ((cudalib.PROGRAMMATIC_STREAM_SERIALIZATION, (1, 0, 0)),)
        params = [(0x1100).to_bytes(8, "little"), (33).to_bytes(4, "little"), (0x3300).to_bytes(8, "little")]
        assert fakes.slow == [] and fakes.launches == [
            (0xF00D, (5, 1, 1), (256, 1, 1), 0, STREAM, params, ("ex", len(expected), expected))]
    finally:
        native.uninstall()


def _launch_a_tensor_map_plan(params: tuple, source: str, plan_id: int, moved_to: int) -> Fakes:
    """Arm a plan whose one operand ``source`` (a 32 x 128 bf16 XLA buffer at 0x10000) the kernel
    reads through a tensor map (the launcher's ``params``), then run it natively with that buffer
    moved to ``moved_to``; the fakes it called."""
    from sparsile.backend.runtime.params import ParamSpec

    fakes = Fakes(sizes=(128,))
    native.install(fakes.addresses()[3], fakes.addresses()[:3])
    try:
        plan = FakePlan()
        plan.sources = [(source, "in", 0)]
        launcher = plan._launcher
        launcher.spec = ParamSpec(params)
        launcher.jax_needs_info = {source}
        launcher.snapshot = lambda values: (b"\xcd" * 128, (0,))
        plan.launch_values = lambda *args: [None]
        a = ffi.XlaBuffer(0x10000, "bfloat16", (32, 128))
        assert native.arm(plan_id, plan, [a], [ffi.XlaBuffer(0x3000, "float32", (4,))], 0), native.DISABLED
        frame = Frame(fakes.api, plan_id, (moved_to, 0x2000, 0x3000))
        assert c.CFUNCTYPE(c.c_void_p, c.c_void_p)(native.handler().address)(c.addressof(frame.frame)) is None
        return fakes
    finally:
        native.uninstall()


def test_arm_describes_a_derived_tensor_map_from_the_xla_buffer() -> None:
    from sparsile.backend.runtime.params import ArrayParam
    from sparsile.backend.runtime.tensormap import TensorMapParam

    fakes = _launch_a_tensor_map_plan((ArrayParam("a", "bf16"), TensorMapParam("a_map", "bf16", (16, 64), source="a")),
                                      "a", 0x77_0000_0002, 0x20000)
    # bf16 is CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 (9); dims innermost first, strides in bytes
    assert fakes.encodes == [(0, 9, 2, 0x20000, [128, 32], [256], [64, 16], [1, 1], 0, 0, 0, 0)]
    assert fakes.launches[0][5] == [b"\xe1" * 128] and fakes.slow == []


def test_arm_encodes_the_tensor_map_of_a_tensor_argument_from_its_xla_buffer() -> None:
    """A ``tensor[...]`` argument ``A`` reaches the launcher as the user parameter ``A.tmap0`` (no
    ``source``; the launch passes A's array again): the record re-encodes it from A's XLA buffer.
    (The H200 run of the GPU tests found every shipped sparse_linear plan left on the slow path with
    "KeyError: 'A.tmap0'".)"""
    from sparsile.backend.runtime.tensormap import TensorMapParam
    from sparsile.driver.launch import tmap_param_name

    fakes = _launch_a_tensor_map_plan((TensorMapParam(tmap_param_name("A", 0), "bf16", (16, 64)),), "A",
                                      0x77_0000_0003, 0x40000)
    assert fakes.encodes == [(0, 9, 2, 0x40000, [128, 32], [256], [64, 16], [1, 1], 0, 0, 0, 0)]
    assert fakes.launches[0][5] == [b"\xe1" * 128] and fakes.slow == []


def test_switch_is_documented() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert "| `SPARSILE_JAX_NATIVE=0` |" in (root / "README.md").read_text()
    assert "`SPARSILE_JAX_NATIVE=0` turns the native path off" in (root / "docs" / "jax.md").read_text()


def test_launcher_snapshot_packs_without_launching(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launcher.snapshot: the bytes a launch would pass, and None for a call that needs host copies."""
    import numpy as np

    from sparsile.tests.backend.test_runtime import VADD, EmulatedGpu, make_launcher

    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4], num_warps=4)
    params, offsets = launcher.snapshot([0x1000, 0x2000, 0x3000, 77, 128])
    assert offsets == (0, 8, 16, 24)
    assert params == b"".join(v.to_bytes(8, "little") for v in (0x1000, 0x2000, 0x3000)) + (77).to_bytes(4, "little")
    assert gpu.launches == []
    host = np.zeros(4, np.float32)
    assert launcher.snapshot([host, 0x2000, 0x3000, 4, 128]) is None and gpu.launches == []


def test_concurrent_calls_each_launch_their_own_pointers(setup: Any) -> None:
    """Threads calling the handler at once (ctypes drops the GIL around the call): every launch
    sees its own frame's addresses (each call packs into its own stack copy)."""
    import threading

    fakes, h, call = setup
    frames = {t: [Frame(fakes.api, PLAN, (X + 16 * (100 * t + i), W, OUT + 16 * (100 * t + i))) for i in range(50)]
              for t in range(4)}

    def worker(t: int) -> None:
        for frame in frames[t]:
            call(frame)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seen = sorted((int.from_bytes(p[0], "little"), int.from_bytes(p[3], "little")) for *_, p, _ in fakes.launches)
    assert seen == sorted((X + 16 * k, OUT + 16 * k) for k in (100 * t + i for t in range(4) for i in range(50)))
    assert h.counts() == {"fast": 200, "slow": 0, "launch_failures": 0}


JAX_HANDLER_IR_SHA256 = "fc64e97dbf10c718b3af5f14dc601f051cec775f45a219a97863e7a177ccb45f"
"""The handler's IR with its placeholders filled in as NativeHandler fills them (state at a fixed
address): the shared launch core (backend/runtime/native_launch.py) must not change it by accident.
The one deliberate change since the version verified on the H200: ``R_ATTRS`` is the address of a
launch-attribute block (a count, then the attributes: cluster, programmatic dependent launch), whose
count and attribute array the core passes to ``cuLaunchKernelEx`` (it passed one attribute before);
and a record whose grid has a 0 dimension takes the slow path instead of a launch (CUDA refuses a 0
grid dimension: test_a_record_with_an_empty_grid_takes_the_slow_path; on the GPU,
tests/gpu/test_empty_grid_gpu.py)."""


@pytest.mark.skipif(c.sizeof(c.c_void_p) != 8, reason="the struct offsets of a 64-bit host")
def test_handler_ir_is_unchanged_by_the_shared_launch_core() -> None:
    import hashlib

    text = native.handler_ir(0x7F00_0000_1000)
    assert "{" not in text.replace("{\n", "")  # every placeholder filled
    assert hashlib.sha256(text.encode()).hexdigest() == JAX_HANDLER_IR_SHA256
