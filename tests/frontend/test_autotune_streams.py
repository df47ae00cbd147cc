"""The autotuner's work on a call's arrays is ordered on the launch stream (docs/autotune.md,
"Streams"; driver/autotune_arrays.py): ``reset_to_zero``'s zeroing before each timed launch, the
saving and restoring of ``restore_value``, and a config's ``pre_hook``.

CPU only: device memory is the fake driver's (tests/backend/test_runtime_driver.py), whose calls
are logged with the stream each one names, and torch is a stand-in module that tells which stream
was torch's current one at each operation. The launches are replaced by a recorder of the stream
they were given. On a GPU: tests/gpu/test_autotune_streams_gpu.py."""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend import runtime
from sparsile.backend.runtime import arrays, memory
from sparsile.backend.runtime.launch_config import stream_handle
from sparsile.driver.autotune import Autotuner
from sparsile.tests.backend.test_runtime_driver import FakeDriver

N = 300
STREAM = 0x5100
"""A non-blocking stream of the caller's: nothing queued elsewhere is ordered with its work."""
TORCH_CURRENT = 0x77
"""torch's current stream in the torch tests (neither the launch stream nor the legacy one)."""


def _kernel() -> Any:
    @sp.jit
    def accumulate(x, out, n: sp.i32, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        mask = offs < n
        sp.store(out + offs, sp.load(out + offs, mask=mask) + sp.load(x + offs, mask=mask), mask=mask)
    return accumulate


def _grid(meta: dict[str, Any]) -> tuple[int]:
    return ((N + meta["BLOCK"] - 1) // meta["BLOCK"],)


def _twice(fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
    """A benchmarker: two launches back to back (as the GPU timer queues them), a time by BLOCK."""
    fn()
    fn()
    return {64: 2.0, 128: 1.0}[fn.config.kwargs["BLOCK"]]


def _tuner(log: list[tuple[str, int]], **kw: Any) -> Autotuner:
    tuner = sp.autotune([{"BLOCK": 64}, {"BLOCK": 128}], key=["n"], benchmarker=_twice, cache_results=False,
                        **kw)(_kernel())

    def launch(grid: Any, args: Any, call_kwargs: dict[str, Any], stream: Any) -> None:
        log.append(("launch", stream_handle(stream)))
    tuner.launch_kernel = launch  # type: ignore[method-assign]
    return tuner


@pytest.fixture(autouse=True)
def _env(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARSILE_AUTOTUNE", raising=False)
    monkeypatch.setattr(Autotuner, "_gpu_name", lambda self, ordinal=None: "Fake GPU")
    # (nothing is launched here, and the fake arrays have nothing to compile for: compiling is not what is tested)
    monkeypatch.setattr(Autotuner, "_compile", lambda self, *a, **k: None)


class _Cai:
    """A dense device array known only by ``__cuda_array_interface__`` (as CuPy's, Numba's)."""

    def __init__(self, buf: memory.DeviceBuffer):
        self.buf = buf
        self.shape = buf.shape

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.buf.__cuda_array_interface__


_MEMORY_CALLS = {"cuMemsetD8": None, "cuMemsetD8Async": 3, "cuMemcpyHtoDAsync": 3, "cuMemcpyDtoHAsync": 3,
                 "cuStreamSynchronize": 0, "cuCtxSynchronize": None}
"""The fake driver's memory calls -> the index of the stream among their arguments (None: a call that
names no stream, logged as 0: the legacy cuMemsetD8 runs on the legacy default stream)."""


def _memory_log(fake: FakeDriver, log: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Log each memory call of the fake driver with its stream, in order with the launches."""
    from cuda.bindings import driver

    for name, at in _MEMORY_CALLS.items():
        faked = getattr(driver, name)

        def logged(*args: Any, _name: str = name, _at: int | None = at, _faked: Any = faked) -> Any:
            log.append((_name, 0 if _at is None else int(args[_at])))
            return _faked(*args)
        monkeypatch.setattr(driver, name, logged)


@pytest.mark.skipif(runtime.has_gpu(), reason="the fake driver is for machines without a GPU")
@pytest.mark.parametrize("kind", ["DeviceBuffer", "cuda_array_interface"])
@pytest.mark.parametrize("stream", [STREAM, None])
def test_device_arrays_are_zeroed_saved_and_restored_on_the_launch_stream(monkeypatch: pytest.MonkeyPatch,
                                                                          kind: str, stream: int | None) -> None:
    """Each timed launch is preceded by a cuMemsetD8Async of the reset_to_zero array on the launch
    stream (the caller's non-blocking stream, or the legacy one for stream=None), not waited for; the
    array is saved before and restored after each config by copies on that stream. Before, the zeroing
    was a cuMemsetD8 on the legacy default stream followed by a synchronize of that stream only: not
    ordered after the previous repetition's kernel on a non-blocking stream, nor documented to be
    before the next (an accumulating kernel read non-zero memory); the copies ran on the legacy stream
    too; an array known by __cuda_array_interface__ only could not be zeroed at all (TypeError)."""
    fake = FakeDriver(monkeypatch)
    rng = np.random.default_rng(3)
    x = memory.DeviceBuffer.from_numpy(rng.standard_normal(N).astype(np.float32) + 2)
    start = rng.standard_normal(N).astype(np.float32) + 2
    buf = memory.DeviceBuffer.from_numpy(start)
    out = buf if kind == "DeviceBuffer" else _Cai(buf)
    log: list[tuple[str, int]] = []
    _memory_log(fake, log, monkeypatch)
    tuner = _tuner(log, reset_to_zero=["out"], restore_value=["out"])
    tuner[_grid](x, out, N, stream=stream)
    s = 0 if stream is None else stream
    zero_then_launch = [("cuMemsetD8Async", s), ("launch", s)] * 2
    restore = [("cuMemcpyHtoDAsync", s), ("cuStreamSynchronize", s)]
    assert log == [("cuMemcpyDtoHAsync", s), ("cuStreamSynchronize", s),  # saved once, before the first config
                   *zero_then_launch, *restore, *zero_then_launch, *restore,
                   ("launch", s)]  # the chosen config's launch: not zeroed (reset_to_zero is for timing)
    np.testing.assert_array_equal(buf.copy_to_host(), start)  # restored


class _FakeTorch:
    """A stand-in for torch with CUDA: its current stream (``cuda.stream(s)`` sets it for a block)
    and tensors whose operations log the stream they were queued on."""

    def __init__(self, log: list[tuple[str, int]]):
        self.log, self.current = log, TORCH_CURRENT
        self.cuda = SimpleNamespace(
            is_available=lambda: True, current_device=lambda: 0,
            current_stream=lambda device=None: SimpleNamespace(cuda_stream=self.current),
            default_stream=lambda device=None: SimpleNamespace(cuda_stream=0),
            ExternalStream=lambda handle, device=None: SimpleNamespace(cuda_stream=handle),
            stream=self.stream)
        self._C = SimpleNamespace(_cuda_getCurrentRawStream=lambda ordinal: self.current)

    @contextlib.contextmanager
    def stream(self, s: Any) -> Any:
        before, self.current = self.current, s.cuda_stream
        try:
            yield
        finally:
            self.current = before


class _FakeTensor:
    is_cuda = True
    device = "cuda:0"
    shape = (N,)

    def __init__(self, torch: _FakeTorch):
        self.torch = torch

    def get_device(self) -> int:
        return 0

    def _op(self, name: str) -> None:
        self.torch.log.append((name, self.torch.current))

    def zero_(self) -> _FakeTensor:
        self._op("zero_")
        return self

    def clone(self) -> _FakeTensor:
        self._op("clone")
        return _FakeTensor(self.torch)

    def copy_(self, other: _FakeTensor) -> _FakeTensor:
        self._op("copy_")
        return self


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> tuple[_FakeTorch, list[tuple[str, int]]]:
    log: list[tuple[str, int]] = []
    torch = _FakeTorch(log)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(arrays, "is_torch_type", lambda cls: cls is _FakeTensor)
    return torch, log


@pytest.mark.parametrize("stream", [STREAM, 0])
def test_torch_tensors_are_zeroed_saved_restored_and_hooked_on_the_launch_stream(
        fake_torch: tuple[_FakeTorch, list[tuple[str, int]]], stream: int) -> None:
    """With a launch stream that is not torch's current one (a non-blocking stream, or 0: the legacy
    default stream), a torch tensor's zero_, its saving clone and restoring copy_, and the torch
    operations of a config's pre_hook (timed launches and the chosen config's launch) are queued on
    the launch stream: torch's current stream is the launch stream while they run, and is put back
    after. Before, all ran on torch's current stream (TORCH_CURRENT), unordered with the launches."""
    torch, log = fake_torch
    hooked = sp.Config({"BLOCK": 128}, pre_hook=lambda args: args["out"].zero_())
    tuner = sp.autotune([{"BLOCK": 64}, hooked], key=["n"], benchmarker=_twice, cache_results=False,
                        reset_to_zero=["out"], restore_value=["out"])(_kernel())
    tuner.launch_kernel = lambda grid, args, kw, s: log.append(("launch", stream_handle(s)))
    x, out = _FakeTensor(torch), _FakeTensor(torch)
    tuner[_grid](x, out, N, stream=stream)
    s = stream
    assert log == [("clone", s),
                   *[("zero_", s), ("launch", s)] * 2, ("copy_", s),
                   *[("zero_", s), ("zero_", s), ("launch", s)] * 2, ("copy_", s),  # reset, then the hook
                   ("zero_", s), ("launch", s)]  # the chosen config (the hooked one): its hook, its launch
    assert torch.current == TORCH_CURRENT


def test_without_a_stream_torch_tensors_use_torch_s_current_stream(
        fake_torch: tuple[_FakeTorch, list[tuple[str, int]]]) -> None:
    """stream=None with a torch CUDA tensor among the arguments launches on torch's current stream
    (driver/launch.py), so that is where the zeroing goes (not the legacy stream)."""
    torch, log = fake_torch
    tuner = sp.autotune([{"BLOCK": 64}], key=["n"], benchmarker=_twice, cache_results=False,
                        reset_to_zero=["out"], restore_value=["out"])(_kernel())
    tuner.launch_kernel = lambda grid, args, kw, s: log.append(("launch", TORCH_CURRENT if s is None else -1))
    tuner[_grid](_FakeTensor(torch), _FakeTensor(torch), N)
    assert log == [("clone", TORCH_CURRENT), *[("zero_", TORCH_CURRENT), ("launch", TORCH_CURRENT)] * 2,
                   ("copy_", TORCH_CURRENT), ("launch", TORCH_CURRENT)]  # (a reset array is saved and restored too)
