"""backend/runtime/release.py: resources garbage collection drops are released later, at a safe
point, never inside the collector (which may run during a CUDA graph capture). CPU only: the
driver calls are replaced by recorders."""

from __future__ import annotations

import gc
import threading

import pytest

from sparsile.backend.runtime import memory, module, release


@pytest.fixture(autouse=True)
def empty_queue():
    release.drain()
    yield
    release.drain()


def test_deferred_releases_run_at_drain_oldest_first():
    ran = []
    release.defer(lambda: ran.append("a"))
    release.defer(lambda: ran.append("b"))
    assert ran == [] and release.pending() == 2
    assert release.drain() == 2
    assert ran == ["a", "b"] and release.pending() == 0
    assert release.drain() == 0 and ran == ["a", "b"]


def test_a_release_deferred_while_draining_waits_for_the_next_drain():
    ran = []

    def first():
        ran.append(1)
        release.defer(lambda: ran.append(2))  # a collection inside a release

    release.defer(first)
    assert release.drain() == 1 and ran == [1] and release.pending() == 1
    assert release.drain() == 1 and ran == [1, 2]


def test_defer_from_many_threads_loses_nothing():
    """Every deferred release runs once. Releases earlier tests left (a collected buffer's or
    module's) are drained first, and no collection runs meanwhile to add more: the count is this
    test's 800 whatever ran before it on the worker."""
    gc.collect()
    release.drain()
    gc.disable()
    try:
        _defer_from_threads()
    finally:
        gc.enable()


def _defer_from_threads():
    ran = []
    lock = threading.Lock()

    def add(i):
        with lock:
            ran.append(i)

    threads = [threading.Thread(target=lambda j=j: [release.defer(lambda i=j * 100 + n: add(i)) for n in range(100)])
               for j in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert release.drain() == 800 and sorted(ran) == list(range(800))


def test_a_collected_device_buffer_is_freed_only_at_the_next_drain(monkeypatch):
    freed = []
    monkeypatch.setattr(memory, "_free_device_memory", lambda ptr, ctx: freed.append((ptr, ctx)))
    memory._collected(0x1000, "ctx")  # what the buffer's weakref.finalize runs
    assert freed == [] and release.pending() == 1
    release.drain()
    assert freed == [(0x1000, "ctx")]


def test_a_collected_module_is_unloaded_only_at_the_next_drain(monkeypatch):
    unloaded = []
    monkeypatch.setattr(module, "_unload_module", lambda handle, ctx: unloaded.append((handle, ctx)))
    module._collected("handle", "ctx")
    assert unloaded == [] and release.pending() == 1
    release.drain()
    assert unloaded == [("handle", "ctx")]


def test_a_failing_release_does_not_keep_the_others_queued():
    ran = []

    def broken():
        raise RuntimeError("a stale handle")

    release.defer(broken)
    release.defer(lambda: ran.append("after"))
    assert release.drain() == 2 and ran == ["after"] and release.pending() == 0
