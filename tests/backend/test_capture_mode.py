"""backend/runtime/capture_mode.py: sparsile's eager driver calls that allocate or release (a
DeviceBuffer's cuMemAlloc, release.drain's deferred frees) run with the calling thread in
THREAD_LOCAL capture mode, so that they neither fail nor invalidate another thread's global-mode
capture (torch.cuda.graph's default); the thread's previous mode is restored after, also when the
block raises. CPU only: the driver's per-thread mode is the stand-in of tests/support/capture_modes.py.
On a GPU: tests/gpu/test_runtime_capture_modes_gpu.py."""

from __future__ import annotations

import threading

import pytest
from cuda.bindings import driver

from sparsile.backend import runtime
from sparsile.backend.runtime import capture_mode, memory, release
from sparsile.tests.backend.test_runtime_driver import FakeDriver
from sparsile.tests.support.capture_modes import GLOBAL, THREAD_LOCAL
from sparsile.tests.support.capture_modes import modes as modes  # (a fixture)

RELAXED = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


@pytest.fixture(autouse=True)
def empty_queue():
    release.drain()
    yield
    release.drain()


def test_drain_runs_the_releases_in_thread_local_mode_and_restores_the_mode(modes):
    seen = []
    release.defer(lambda: seen.append(modes.mode()))
    release.defer(lambda: seen.append(modes.mode()))
    assert modes.mode() == GLOBAL
    assert release.drain() == 2
    assert seen == [THREAD_LOCAL, THREAD_LOCAL]
    assert modes.mode() == GLOBAL and [mode for _, mode in modes.log] == [THREAD_LOCAL, GLOBAL]


def test_an_empty_drain_makes_no_driver_call(modes):
    assert release.drain() == 0 and modes.log == []


def test_a_drain_inside_a_release_nests_and_restores_the_outer_mode(modes):
    """A release that drains again (a collection inside a release whose finalizer defers, then a
    DeviceBuffer): the inner block restores THREAD_LOCAL, the outer one the thread's GLOBAL."""
    seen = []

    def outer():
        release.defer(lambda: seen.append(("inner", modes.mode())))
        assert release.drain() == 1
        seen.append(("outer after", modes.mode()))

    release.defer(outer)
    assert release.drain() == 1
    assert seen == [("inner", THREAD_LOCAL), ("outer after", THREAD_LOCAL)]
    assert modes.mode() == GLOBAL
    assert [mode for _, mode in modes.log] == [THREAD_LOCAL, THREAD_LOCAL, THREAD_LOCAL, GLOBAL]


def test_the_mode_is_restored_when_a_release_raises_past_drain(modes):
    def interrupted():
        raise KeyboardInterrupt  # (not an Exception: drain does not swallow it)

    release.defer(interrupted)
    with pytest.raises(KeyboardInterrupt):
        release.drain()
    assert modes.mode() == GLOBAL and [mode for _, mode in modes.log] == [THREAD_LOCAL, GLOBAL]


def test_the_previous_mode_is_restored_whatever_it_was(modes):
    modes.exchange(RELAXED)  # (as torch's allocator sets around a cudaMalloc)
    with pytest.raises(ValueError):
        with capture_mode.thread_local_capture_mode():
            assert modes.mode() == THREAD_LOCAL
            raise ValueError("the block failed")
    assert modes.mode() == RELAXED


def test_a_refused_exchange_runs_the_block_in_the_mode_as_is(modes):
    modes.result = driver.CUresult.CUDA_ERROR_INVALID_VALUE
    ran = []
    with capture_mode.thread_local_capture_mode():
        ran.append(modes.mode())
    assert ran == [GLOBAL] and modes.log == []


def test_without_a_driver_library_the_block_runs_and_the_driver_is_not_asked_again(monkeypatch):
    class DynamicLibNotFoundError(Exception):
        pass

    asked = []

    def missing(mode):
        asked.append(mode)
        raise DynamicLibNotFoundError("no libcuda")

    monkeypatch.setattr(driver, "cuThreadExchangeStreamCaptureMode", missing)
    monkeypatch.setattr(capture_mode, "_available", True)
    ran = []
    for _ in range(2):
        with capture_mode.thread_local_capture_mode():
            ran.append(1)
    assert ran == [1, 1] and len(asked) == 1


def test_another_threads_drain_does_not_invalidate_a_global_capture(modes):
    """Thread A captures in global mode; thread B drains a deferred free meanwhile. The fake free
    invalidates A's capture when B calls it in global mode, as the driver does."""
    capture = {"by": None, "invalidated": False}

    def free():
        if capture["by"] not in (None, threading.current_thread().name) and modes.mode() == GLOBAL:
            capture["invalidated"] = True

    began, drained = threading.Event(), threading.Event()

    def user():  # thread A
        capture["by"] = threading.current_thread().name
        began.set()
        drained.wait(10)
        capture["by"] = None

    def eager():  # thread B
        began.wait(10)
        release.defer(free)
        release.drain()
        drained.set()

    threads = [threading.Thread(target=user, name="A"), threading.Thread(target=eager, name="B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not capture["invalidated"]
    assert modes.log == [("B", THREAD_LOCAL), ("B", GLOBAL)]


@pytest.mark.skipif(runtime.has_gpu(), reason="the fake driver is for machines without a GPU")
def test_a_device_buffer_allocates_and_frees_the_collected_in_thread_local_mode(monkeypatch, modes):
    FakeDriver(monkeypatch)
    during = []
    faked_alloc = driver.cuMemAlloc
    monkeypatch.setattr(driver, "cuMemAlloc", lambda n: during.append(("alloc", modes.mode())) or faked_alloc(n))
    monkeypatch.setattr(memory, "_free_device_memory", lambda ptr, ctx: during.append(("free", modes.mode())))
    memory._collected(0x1000, "ctx")  # a collected buffer's pending free
    buf = memory.DeviceBuffer(64)
    assert buf.ptr and during == [("free", THREAD_LOCAL), ("alloc", THREAD_LOCAL)]
    assert modes.mode() == GLOBAL


@pytest.mark.skipif(runtime.has_gpu(), reason="the fake driver is for machines without a GPU")
def test_a_failing_allocation_restores_the_mode(monkeypatch, modes):
    FakeDriver(monkeypatch)
    seen = []

    def refused(nbytes):
        seen.append(modes.mode())
        return (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)

    monkeypatch.setattr(driver, "cuMemAlloc", refused)
    with pytest.raises(runtime.CudaError) as exc:
        memory.DeviceBuffer(64)
    assert "cuMemAlloc" in str(exc.value)
    assert seen == [THREAD_LOCAL] and modes.mode() == GLOBAL


@pytest.fixture
def noted(monkeypatch) -> set[int]:
    """Capture streams as backend/runtime/capture_mode.py keeps them, fresh for the test; the returned
    set holds the streams capturing now (what the fake ``cuStreamIsCapturing`` answers)."""
    capturing: set[int] = set()
    monkeypatch.setattr(capture_mode, "_capture_streams", {})
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: stream in capturing)
    return capturing


def _spied(monkeypatch, modes, names: tuple[str, ...]) -> list[tuple[str, object]]:
    """(driver call, the calling thread's capture mode) for each call of ``names`` (the fake driver's)."""
    seen: list[tuple[str, object]] = []
    for name in names:
        fake = getattr(driver, name)
        monkeypatch.setattr(driver, name, lambda *a, _n=name, _f=fake: seen.append((_n, modes.mode())) or _f(*a))
    return seen


@pytest.mark.skipif(runtime.has_gpu(), reason="the fake driver is for machines without a GPU")
def test_a_device_buffer_s_copies_and_fill_synchronize_in_thread_local_mode(monkeypatch, modes):
    """copy_from_host, copy_to_host and fill_byte synchronize (a stream) in THREAD_LOCAL mode: another
    thread's global-mode capture neither refuses them nor is invalidated by them; the thread's mode is
    restored after. fill_byte waits for the legacy stream its memset ran on, never the whole device
    (cuCtxSynchronize invalidates another thread's capture in any mode). Before, all ran in GLOBAL mode
    and fill_byte called cuCtxSynchronize."""
    import numpy as np

    FakeDriver(monkeypatch)
    buf = memory.DeviceBuffer(16, dtype="f32", shape=(4,))
    seen = _spied(monkeypatch, modes, ("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemsetD8", "cuStreamSynchronize",
                                       "cuCtxSynchronize"))
    synced = []
    sync = driver.cuStreamSynchronize
    monkeypatch.setattr(driver, "cuStreamSynchronize", lambda s: synced.append(s) or sync(s))
    data = np.array([1.5, -2.0, 3.25, 7.0], dtype=np.float32)
    buf.copy_from_host(data, stream=5)
    assert np.array_equal(buf.copy_to_host(stream=5), data)
    buf.fill_byte(0xAB)
    assert seen == [("cuMemcpyHtoDAsync", THREAD_LOCAL), ("cuStreamSynchronize", THREAD_LOCAL),
                    ("cuMemcpyDtoHAsync", THREAD_LOCAL), ("cuStreamSynchronize", THREAD_LOCAL),
                    ("cuMemsetD8", THREAD_LOCAL), ("cuStreamSynchronize", THREAD_LOCAL)]
    assert synced == [5, 5, 0]
    assert modes.mode() == GLOBAL


@pytest.mark.skipif(runtime.has_gpu(), reason="the fake driver is for machines without a GPU")
@pytest.mark.parametrize("stream", [7, 0])
def test_fill_byte_on_a_stream_queues_the_memset_there_and_does_not_wait(monkeypatch, modes, stream):
    """fill_byte(value, stream=) (the autotuner's reset_to_zero) queues cuMemsetD8Async on that stream,
    in THREAD_LOCAL mode, and synchronizes nothing: the launch queued after it on the same stream is
    ordered after it, and a kernel still running there from before is not raced. 0 is the legacy
    default stream, still asynchronous. Without stream= it is as before (memset, then the legacy
    stream synchronized). Before, there was no stream= at all."""
    fake = FakeDriver(monkeypatch)
    buf = memory.DeviceBuffer(16, dtype="f32", shape=(4,))
    seen = _spied(monkeypatch, modes, ("cuMemsetD8", "cuMemsetD8Async", "cuStreamSynchronize", "cuCtxSynchronize"))
    fake.calls.clear()
    buf.fill_byte(0x1AB, stream=stream)
    assert seen == [("cuMemsetD8Async", THREAD_LOCAL)]
    (name, (ptr, value, nbytes, handle)), = [c for c in fake.calls if c[0].startswith("cuMemset")]
    assert (name, int(ptr), value, nbytes, int(handle)) == ("cuMemsetD8Async", buf.ptr, 0xAB, 16, stream)
    assert bytes(fake.memory[buf.ptr]) == b"\xab" * 16
    assert modes.mode() == GLOBAL
    seen.clear()
    buf.fill_byte(0)
    assert seen == [("cuMemsetD8", THREAD_LOCAL), ("cuStreamSynchronize", THREAD_LOCAL)]
    assert bytes(fake.memory[buf.ptr]) == bytes(16)


@pytest.mark.skipif(runtime.has_gpu(), reason="the fake driver is for machines without a GPU")
def test_synchronize_refuses_while_a_noted_stream_of_its_device_captures(monkeypatch, modes, noted):
    """runtime.synchronize() while a stream noted as a capture stream of its device captures: SP0752 and no
    cuCtxSynchronize (which would invalidate that capture, in any mode); a noted stream of another device,
    or one not capturing now, does not stop it. Before, it synchronized the device."""
    from sparsile.frontend.diagnostics import UNKNOWN_SPAN, LaunchError

    FakeDriver(monkeypatch)
    synced = _spied(monkeypatch, modes, ("cuCtxSynchronize",))
    capture_mode.note_capture_stream(0x51, 0)
    capture_mode.note_capture_stream(0x52, 3)
    capture_mode.note_capture_stream(0, 0)  # (the legacy stream is never noted: asking it is a synchronization)
    assert capture_mode._capture_streams == {0x51: 0, 0x52: 3}
    runtime.synchronize()
    noted.add(0x52)  # a capture on device 3
    runtime.synchronize(0)
    assert len(synced) == 2
    noted.add(0x51)
    with pytest.raises(LaunchError) as exc:
        runtime.synchronize(0)
    err = exc.value
    assert err.code == "SP0752" and err.span == UNKNOWN_SPAN  # (a launch error: no source span)
    assert err.message == ("runtime.synchronize() waits for all work on cuda:0, where a CUDA graph is being "
                           "captured (another thread's torch.cuda.graph, or this thread's); a device-wide "
                           "synchronize now would invalidate that capture")
    assert err.help == ("synchronize the stream you launched on instead (torch.cuda.current_stream().synchronize(), "
                        "DeviceBuffer.copy_to_host), or call synchronize() after the capture has ended")
    assert len(synced) == 2  # not called
    noted.clear()
    runtime.synchronize(0)
    assert len(synced) == 3


def test_a_stream_the_driver_gives_no_answer_about_counts_as_capturing_once_then_is_forgotten(monkeypatch):
    asked = []
    monkeypatch.setattr(capture_mode, "_capture_streams", {})
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: asked.append(stream))  # (None: no answer)
    capture_mode.note_capture_stream(0x61, 0)
    assert capture_mode.captures_under_way() and asked == [0x61]
    assert not capture_mode.captures_under_way() and asked == [0x61]


def test_without_noted_streams_the_driver_is_not_asked(monkeypatch):
    monkeypatch.setattr(capture_mode, "_capture_streams", {})
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: pytest.fail("asked"))
    assert not capture_mode.captures_under_way()


def test_streams_noted_while_the_noted_streams_are_looked_at_break_nothing(monkeypatch):
    """captures_under_way looks at a snapshot taken in one step (a dict copy, as the record cache takes
    its snapshots), so another thread noting a stream meanwhile cannot break the look. Here the other
    thread runs at each garbage collection (a switch of threads can happen there: a collection runs
    finalizers, Python code), and a collection at every allocation: before, the look iterated the
    dict while building a tuple of its items, whose allocations let the other thread add a stream
    mid-iteration ("dictionary changed size during iteration"; a free-threaded Python can do that at
    any time)."""
    import gc

    noted: dict[int, int] = {}
    monkeypatch.setattr(capture_mode, "_capture_streams", noted)
    asked: list[int] = []
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: asked.append(stream) or stream == 0x90)
    for k in range(64):  # (one torch capture stream a device and priority, several devices)
        capture_mode.note_capture_stream(0x1000 + 2 * k + 1, k % 8)
    late = iter(range(0x5001, 0x5001 + 2 * 4096, 2))

    def other_thread(phase: str, info: dict) -> None:
        if phase == "start":
            capture_mode.note_capture_stream(next(late), 0)

    old = gc.get_threshold()
    gc.callbacks.append(other_thread)
    gc.set_threshold(1)
    try:
        busy = capture_mode.captures_under_way()
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(other_thread)
    assert not busy and len(asked) >= 64 and set(range(0x1001, 0x1001 + 128, 2)) <= set(asked)
    assert len(noted) > 64  # (the other thread's streams are kept, for the next look)


@pytest.mark.parametrize(("status", "capturing"), [
    (driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE, False),
    (driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE, True),
    # invalidated (an error in the capture) but not yet ended: the driver's documentation says the stream is
    # not usable until cuStreamEndCapture, so a synchronize of the device or a free on it must still wait
    (driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED, True),
])
def test_a_stream_counts_as_capturing_until_its_capture_has_ended(monkeypatch, status, capturing):
    """What the driver's cuStreamIsCapturing answers, read by captures_under_way: a stream whose capture
    was invalidated is still in capture until it is ended. Before, only ACTIVE counted: a device
    synchronize (or an eager collect's cudaFreeAsync on that stream) went ahead into the invalidated
    capture, failing there instead of SP0752 (or waiting)."""
    asked = []
    monkeypatch.setattr(driver, "cuStreamIsCapturing",
                        lambda stream: asked.append(int(stream)) or (driver.CUresult.CUDA_SUCCESS, status))
    monkeypatch.setattr(capture_mode, "_capture_streams", {})
    capture_mode.note_capture_stream(0x71, 0)
    assert capture_mode.captures_under_way(0) is capturing and asked == [0x71]
    assert capture_mode._capture_streams == {0x71: 0}  # (an answer: kept)


@pytest.mark.parametrize(("answer", "capturing"), [
    ((driver.CUresult.CUDA_SUCCESS, driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE), False),
    ((driver.CUresult.CUDA_SUCCESS, driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE), True),
    ((driver.CUresult.CUDA_SUCCESS, driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED), True),
    ((driver.CUresult.CUDA_ERROR_INVALID_HANDLE, driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE), None),
])
def test_stream_capturing_asks_the_driver_about_one_stream(monkeypatch, answer, capturing):
    """stream_capturing (the torch integration's PDL weight wait asks it about each stream it would
    synchronize): the driver's cuStreamIsCapturing, an invalidated capture counting until it ends, no
    answer (a destroyed stream's handle) None; nothing noted or remembered."""
    asked = []
    monkeypatch.setattr(driver, "cuStreamIsCapturing", lambda stream: asked.append(int(stream)) or answer)
    monkeypatch.setattr(capture_mode, "_capture_streams", {})
    assert capture_mode.stream_capturing(0x83) is capturing and asked == [0x83]
    assert capture_mode._capture_streams == {}


@pytest.mark.parametrize("legacy", [0, 1])
def test_stream_capturing_never_asks_the_driver_about_the_legacy_default_stream(monkeypatch, legacy):
    """The legacy default stream (handle 0; ``CU_STREAM_LEGACY``, 1, names it too) cannot capture: stream_capturing
    says False without asking. Asking it while another thread captures on a blocking stream is an implicit
    synchronization, which invalidates that capture (graph_life.frees_captured asks it of each stream a record
    ran on, from a finalizer on any thread, and skipped only handle 0). Before, handle 1 was asked."""
    asked = []
    monkeypatch.setattr(driver, "cuStreamIsCapturing", lambda stream: asked.append(int(stream)) or (
        driver.CUresult.CUDA_SUCCESS, driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE))
    assert capture_mode.stream_capturing(legacy) is False and asked == []
    assert capture_mode.stream_capturing(2) is False and asked == [2]  # (the per-thread stream can capture)
