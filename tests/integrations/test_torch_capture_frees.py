"""capture_frees.drop_held (integrations/torch/capture_frees.py): a held record (planned in a capture, let go of
while a capture was under way, under cudaMallocAsync) is freed by the thread that finds it free to go, right
after that look, and never by a look that found a capture under way. The driver's answers are faked
(``cuStreamIsCapturing`` of a stream: capture_mode._IS_CAPTURING); the records are stand-ins with the streams
they ran on and a payload standing for their tensors. Records and caches on fakes: test_torch_graph_life.py."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable

import pytest

pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.backend.runtime import capture_mode
from sparsile.integrations.torch import _kernels as kernels
from sparsile.integrations.torch import capture_frees, graph_life
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # (a fixture: autouse)


class _Tensors:
    """What a held record's tensors stand for (weakly referable: freed or not)."""


class _Record:
    """A held record as drop_held sees it: the streams its buffers are marked used on, and its tensors."""

    def __init__(self, streams: set[int]):
        self.marked = streams
        self.tensors = _Tensors()


@pytest.fixture
def asked(monkeypatch) -> dict[int, Callable[[], bool]]:
    """Under cudaMallocAsync, nothing noted, this thread not capturing: ``cuStreamIsCapturing`` of stream s answers
    ``asked[s]()`` (False where absent). HELD is empty before and after. No automatic garbage collection
    meanwhile: its hook (capture_frees._after_collection) would run drop_held at a moment no test chose."""
    answers: dict[int, Callable[[], bool]] = {}
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync")
    monkeypatch.setattr(capture_mode, "_capture_streams", {})
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: answers.get(stream, lambda: False)())
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    assert not capture_frees.HELD
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield answers
    finally:
        capture_frees.HELD.clear()
        if enabled:
            gc.enable()


def _hold(*records: _Record) -> list[weakref.ref]:
    """Put ``records`` into HELD, as CaptureRecord's finalizer does (only HELD refers to them then)."""
    refs = []
    for record in records:
        capture_frees.HELD[id(record)] = record
        refs.append(weakref.ref(record.tensors))
    return refs


def test_a_record_let_go_of_is_freed_before_the_next_record_is_looked_at(asked):
    """Two held records, of captures on streams 7 and 8; while drop_held asks about stream 8, thread B begins a
    capture on stream 7 (and 8). The first record, free to go when it was looked at, must be freed by then: its
    ``cudaFreeAsync`` on stream 7 would otherwise land in B's capture. Before, drop_held iterated a copy of HELD,
    which kept every record it let go of until the whole loop ended (after B's capture began)."""
    b_captures: set[int] = set()
    first_alive_when_b_began: list[bool] = []

    def b_begins() -> bool:
        first_alive_when_b_began.append(first() is not None)
        b_captures.update((7, 8))
        return True

    asked[7] = lambda: 7 in b_captures
    asked[8] = b_begins
    first, second = _hold(_Record({7}), _Record({8}))
    assert capture_frees.drop_held() == 1
    assert first_alive_when_b_began == [False] and first() is None and second() is not None


def test_a_record_another_thread_let_go_of_is_not_freed_by_a_look_that_found_a_capture(asked):
    """Thread A's drop_held is asking about the held record's stream 7 when thread B's drop_held runs, finds no
    capture, and lets the record go; then thread C begins a capture on stream 7 and A's look answers True. The
    record must stay held (freed now, its ``cudaFreeAsync`` lands in C's capture) and go at a later call after
    C's capture. Before, A's copy of HELD kept the record through B's drop_held and freed it when A's loop ended,
    during C's capture."""
    in_look, go_on = threading.Event(), threading.Event()
    c_captures: set[int] = set()
    looks = []

    def look() -> bool:
        looks.append(threading.current_thread().name)
        if threading.current_thread().name == "A" and len(looks) == 1:
            in_look.set()
            go_on.wait(10)
            c_captures.add(7)
        return 7 in c_captures

    asked[7] = look
    (tensors,) = _hold(_Record({7}))
    a = threading.Thread(target=capture_frees.drop_held, name="A")
    a.start()
    assert in_look.wait(10)
    b = threading.Thread(target=capture_frees.drop_held, name="B")
    b.start()
    b.join(10)
    go_on.set()
    a.join(10)
    freed_during_c = tensors() is None
    c_captures.clear()  # C's capture ended
    capture_frees.drop_held()
    assert not freed_during_c and tensors() is None and not capture_frees.HELD


def test_a_held_record_is_let_go_of_by_a_garbage_collection_once_no_capture_is_under_way(asked, monkeypatch):
    """A process that only replays graphs after its capture makes no full-path call: a record held by its
    finalizer (its stream 7 captured when it was let go of) is freed at the end of the first garbage collection
    that finds no capture (a gc.callbacks hook), never by one during a capture: another thread's on its stream,
    or the collecting thread's own. Before, it stayed held until the next full-path call of a cache."""
    capturing = {7}
    asked[7] = lambda: 7 in capturing
    record = object.__new__(capture_frees.CaptureRecord)  # (its finalizer looks at its streams only)
    record.marked = {7}
    record.tensors = _Tensors()
    tensors = weakref.ref(record.tensors)
    del record  # the finalizer holds it: stream 7 captures
    assert len(capture_frees.HELD) == 1
    gc.collect()
    assert tensors() is not None and len(capture_frees.HELD) == 1  # the capture on 7 is under way
    capturing.clear()
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)  # the collecting thread's own capture
    gc.collect()
    assert tensors() is not None and len(capture_frees.HELD) == 1
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    gc.collect()
    assert tensors() is None and not capture_frees.HELD


def test_a_collection_s_hook_never_raises_and_does_nothing_where_nothing_is_held(asked, monkeypatch):
    """The hook runs at every collection: nothing is asked where nothing is held, or at a collection's start;
    a failing look keeps the record held (drop_held puts it back) and is not raised into the collection."""
    looks = []
    monkeypatch.setattr(capture_frees, "must_wait", lambda record: looks.append(record) or 1 / 0)
    capture_frees._after_collection("stop", {})
    (tensors,) = _hold(_Record({7}))
    capture_frees._after_collection("start", {})
    assert looks == []
    capture_frees._after_collection("stop", {})
    assert len(looks) == 1 and tensors() is not None and len(capture_frees.HELD) == 1
