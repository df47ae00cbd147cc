"""Stand-ins for the launch record's tests (tests/integrations/test_torch_native.py,
test_torch_record_weight.py): fake libcuda entry points that record what they are given, stand-in
plans and prepared launches, and the ``fake`` fixture that routes ``sparsile.torch``'s records
through them."""

from __future__ import annotations

import ctypes as c
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from sparsile.backend.runtime import capture_mode  # noqa: E402
from sparsile.backend.runtime import native_launch as nl  # noqa: E402
from sparsile.backend.runtime.cudalib import LaunchConfig  # noqa: E402
from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import graph_launch, graph_life, native, noted_streams, stream_waits  # noqa: E402

_LAUNCH = c.CFUNCTYPE(c.c_int, c.c_void_p, *[c.c_uint] * 7, c.c_void_p, c.c_void_p, c.c_void_p)
_LAUNCH_EX = c.CFUNCTYPE(c.c_int, c.POINTER(LaunchConfig), c.c_void_p, c.c_void_p, c.c_void_p)
_ENCODE = c.CFUNCTYPE(c.c_int, c.c_void_p, c.c_int, c.c_uint, c.c_void_p, c.POINTER(c.c_uint64),
                      c.POINTER(c.c_uint64), c.POINTER(c.c_uint32), c.POINTER(c.c_uint32), c.c_int, c.c_int,
                      c.c_int, c.c_int)


class FakeDriver:
    """Fake libcuda launch and encode entry points; what each was given (parameter bytes read
    with ``sizes``). ``result``: what the launches return."""

    def __init__(self, sizes: list[int], result: int = 0):
        self.sizes, self.result = sizes, result
        self.results: list[int] = []  # what the next launches return, before ``result``
        self.launches: list[tuple] = []
        self.encodes: list[tuple] = []
        self.log: list[tuple] = []  # the launch record's stand-ins: records built, prepared launches run
        self.n_launches = 1  # the stand-in plan's launches
        self.decode = False  # the stand-in plan has a one-launch variant (reduce="kernel")
        self.reads_weight = False  # the stand-in plan reads the weight in place (else: copies of it)
        self.copies_bias = False  # with reads_weight, the plan reads a converted copy of the bias
        self.pads_values = False  # with reads_weight, the plan reads a padded copy of the values (only)
        self.lists_operands = True  # the stand-in plan has weight_operands (refresh_copies can write its copies)
        self.capture_id = 1  # the id of the capture a stream records while kernels._IS_CAPTURING says so
        self.stream_syncs: list[tuple[int, int]] = []  # (stream, ordinal) of each stream synchronize (stream_waits)
        self.capturing_streams: dict[int, bool | None] = {}  # what stream_waits hears of a stream: capturing, unknown
        # streams somebody else owns (an ExternalStream of a cuda-python or CuPy stream: noted_streams.lasting
        # says no); every other fake stream stands for one torch created (lasting)
        self.foreign_streams: set[int] = set()

        def params(address: int) -> list[bytes]:
            ptrs = (c.c_void_p * len(self.sizes)).from_address(address)
            return [c.string_at(ptrs[k], n) for k, n in enumerate(self.sizes)]

        def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra):
            self.launches.append((fn, (gx, gy, gz), (bx, by, bz), shared, stream or 0, params(kernel_params)))
            return self.results.pop(0) if self.results else self.result

        def launch_ex(config, fn, kernel_params, extra):
            cf = config.contents
            attrs = tuple((cf.attrs[i].id, tuple(cf.attrs[i].value[:3])) for i in range(cf.numAttrs))
            self.launches.append((fn, (cf.gridDimX, cf.gridDimY, cf.gridDimZ), (cf.blockDimX, cf.blockDimY,
                                  cf.blockDimZ), cf.sharedMemBytes, cf.hStream or 0, params(kernel_params),
                                  ("ex", cf.numAttrs, attrs)))
            return self.result

        def encode(out, dtype, rank, address, dims, strides, box, estr, interleave, swizzle, l2, oob):
            self.encodes.append((dtype, rank, address, dims[:rank], strides[:rank - 1], box[:rank], estr[:rank],
                                 interleave, swizzle, l2, oob))
            c.memmove(out, bytes([0xE0 + len(self.encodes)]) * 128, 128)
            return 0

        self.callbacks = (_LAUNCH(launch), _LAUNCH_EX(launch_ex), _ENCODE(encode))

    def entry_points(self) -> tuple[int, int, int]:
        return tuple(c.cast(f, c.c_void_p).value for f in self.callbacks)  # type: ignore[return-value]


class _Prepared:
    """A stand-in prepared launch with a record: pointer slots of x, y (and scale_x) at 0, 8, 16."""

    def __init__(self, log: list, per_call: tuple[str, ...], fixed: dict | None = None):
        self.log, self.per_call = log, per_call
        # what a prepared launch keeps: its fixed tensor arguments (the record's kept buffers)
        self._fixed = tuple(v for k, v in (fixed or {}).items() if k not in per_call and isinstance(v, torch.Tensor))

    def run(self, args, stream=None):
        self.log.append(("prepared", tuple(a.data_ptr() for a in args), stream))

    def native_record(self, args, sources, fixed_layout):
        self.log.append(("record", sources, fixed_layout))
        pointers = [(s, 8 * s, 15) for s in sources]
        words = nl.record_words(0xF00D, (3, 1, 1), (128, 1, 1), 256, 0, bytes(24), (0, 8, 16), pointers, [])
        return nl.NativeRecord(words, (self,), lambda force=False: self.log.append(("context", force)))


class _Plan:
    """A stand-in plan of ``n`` launches of one kernel taking (x, y) or (x, y, scale_x), then the
    weight's values and metadata (and bias) read in place, or ``(copy,)``: a padded copy of values."""

    def __init__(self, log, x, out, scale_x, n, weight=None):
        # the metadata as the real plans pass it: its int32 words viewed as uint32 (then the bias, if any);
        # a single tensor stands for the plan's padded copy of the values
        if weight is not None and len(weight) > 1:
            weight = (weight[0], weight[1].view(torch.uint32), *weight[2:])
        self.args = ((x, out) if scale_x is None else (x, out, scale_x)) + tuple(weight or ())
        self.names = (("x", "y", "scale_x")[:len(self.args) - len(weight or ())]
                      + ("values", "meta", "bias")[:len(weight or ())])
        self.log, self.n = log, n
        # (values, meta, bias, scale_w) as the launches read them, as the real plans list them
        self.weight_operands = (tuple(weight or ()) + (None,) * 4)[:4]

    def launches(self):
        launcher = SimpleNamespace(prepare=lambda per_call, **fixed: _Prepared(self.log, per_call, fixed))
        params = [SimpleNamespace(name=n) for n in self.names]
        return [(_Kernel(params, launcher), (3,), self.args, {})] * self.n


class _Kernel:
    def __init__(self, params, launcher):
        self.params, self.launcher = params, launcher

    def __getitem__(self, grid):
        return self.launcher


@pytest.fixture
def fake(monkeypatch) -> Iterator[FakeDriver]:
    """SPARSILE_TORCH_NATIVE=1, a record launcher over a fake driver, a stand-in plan."""
    driver = FakeDriver([8, 8, 8])
    monkeypatch.setenv(native.ENV, "1")
    monkeypatch.setattr(native, "ENTRY_POINTS", driver.entry_points())
    native.reset()

    def plan_sparse_linear(values, meta, x, *, out, scale_x=None, reduce=None, bias=None, **kwargs):
        bias = () if bias is None else (bias.double() if driver.copies_bias else bias,)
        plan = _Plan(driver.log, x, out, scale_x, 1 if reduce == "kernel" else driver.n_launches,
                     (values.clone() if driver.pads_values else values, meta, *bias) if driver.reads_weight
                     else (values.clone(),))  # else: a "padded" copy
        if not driver.lists_operands:
            del plan.weight_operands
        if driver.decode:  # a decode plan: split-K reduced in the kernel on request
            plan.reduces_in_kernel = reduce == "kernel"
        return plan

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=plan_sparse_linear))
    monkeypatch.setattr(kernels, "_CAPTURE_ID", lambda stream: driver.capture_id)
    # the fake streams (small ints) are no CUstream: the real cuStreamGetCaptureInfo of one crashes the
    # process where a GPU driver is loaded (the H100 run of the fiftieth session); tests of graph_life
    # put their own fake graph here
    monkeypatch.setattr(graph_life, "_CAPTURE_GRAPH", lambda stream: None)
    # nor is a capture's stream noted (graph_life.saw_capture): the backend would ask the driver about it later;
    # nor is the driver asked whether a record's own fake stream captures (graph_life.frees_captured): none does
    monkeypatch.setattr(graph_life, "_NATIVE_STREAM", lambda device: None)
    # nor synchronized or asked whether it captures (stream_waits.py, a PDL record's wait for weight writes)
    monkeypatch.setattr(stream_waits, "_SYNCHRONIZE", lambda stream, ordinal: driver.stream_syncs.append(
        (stream, ordinal)))
    monkeypatch.setattr(stream_waits, "_CAPTURING", lambda stream: driver.capturing_streams.get(stream, False))
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: False)
    monkeypatch.setattr(noted_streams, "_TORCH_CREATED", lambda stream, ordinal: stream not in driver.foreign_streams)
    # nor asked for a foreign stream's id (a record with scratch there: capture_keys.foreign_key); None: not known
    monkeypatch.setattr(noted_streams, "_STREAM_ID", lambda stream: None)
    # likewise no graph replays of a last call (graph_launch.py): the real libcuda would capture the fake
    # native launch and launch it on a fake stream; tests of them turn them on with a fake graph driver
    monkeypatch.setenv(graph_launch.ENV, "0")
    yield driver
    native.reset()


def _weight(bias=None):
    return kernels.Weight(torch.zeros(8, 16), torch.zeros(8, 1, dtype=torch.int32), bias, None, None)


def counting_plans(monkeypatch) -> list:
    """The values each plan the records ask for was given (a clone), in order."""
    planned = []
    plan = kernels.kernel_api().plan_sparse_linear

    def counting(*args, **kwargs):
        planned.append(args[0].clone())
        return plan(*args, **kwargs)

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=counting))
    return planned


def copy_of_values(record) -> torch.Tensor:
    """The stand-in plan's padded copy of the values that ``record``'s launches read."""
    (operands,) = record.operands
    return operands[0]


def frees_wait_for_a_capture_on(record, stream: int, monkeypatch) -> bool:
    """Whether, under cudaMallocAsync, ``graph_life.frees_captured(record)`` holds ``record``'s frees while
    another thread captures on ``stream``, and lets them go once that capture has ended."""
    capturing = {stream}
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync")
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda s: s in capturing)
    held = graph_life.frees_captured(record)
    capturing.clear()
    return held and not graph_life.frees_captured(record)
