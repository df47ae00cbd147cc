"""``devices.using_device`` (backend/runtime/devices.py) makes a GPU sparsile's current device for a
block: a tuner runs a caller's ``benchmarker=`` in it (bench.on_device, docs/autotune.md). The
current device is the process's, so two threads' blocks overlapping (two GPUs tuned at once)
restored each other's choice out of order: the first thread's benchmarker saw the second's GPU as
current, the second's saw the first's previous one, and the process was left on the first thread's
GPU. A block now waits for another thread's to end. No GPU: the driver calls are faked."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from sparsile.backend.runtime import devices


def test_two_threads_blocks_do_not_interleave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "default_ordinal", 0)
    monkeypatch.setattr(devices, "device_state", lambda ordinal=None: SimpleNamespace(info=ordinal, context=None))
    monkeypatch.setattr(devices, "switch", lambda state: None)
    monkeypatch.setattr(devices, "leave", lambda previous: None)
    seen: dict[str, int] = {}
    a_in, b_trying, a_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with devices.using_device(1):
            a_in.set()
            b_trying.wait(5)
            time.sleep(0.2)  # (the other thread's block, were it let in, has begun by now)
            seen["first"] = devices.default_ordinal
        a_out.set()

    def second() -> None:
        a_in.wait(5)
        b_trying.set()
        with devices.using_device(2):
            a_out.wait(5)
            seen["second"] = devices.default_ordinal

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen == {"first": 1, "second": 2}
    assert devices.default_ordinal == 0


def test_a_block_in_a_block_of_the_same_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "default_ordinal", 0)
    monkeypatch.setattr(devices, "device_state", lambda ordinal=None: SimpleNamespace(info=ordinal, context=None))
    monkeypatch.setattr(devices, "switch", lambda state: None)
    monkeypatch.setattr(devices, "leave", lambda previous: None)
    with devices.using_device(1) as outer:
        with devices.using_device(2) as inner:
            assert (outer, inner, devices.default_ordinal) == (1, 2, 2)
        assert devices.default_ordinal == 1
    assert devices.default_ordinal == 0
