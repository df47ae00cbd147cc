"""A stand-in for the driver's per-thread stream-capture mode (``cuThreadExchangeStreamCaptureMode``):
each thread starts in ``GLOBAL`` mode, as with the real driver; :class:`CaptureModes` records every
exchange and answers which mode the calling thread is in now (what a fake driver call reads to
decide whether it would invalidate another thread's global capture)."""

from __future__ import annotations

import threading

import pytest
from cuda.bindings import driver

from sparsile.backend.runtime import capture_mode

GLOBAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
THREAD_LOCAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


class CaptureModes:
    """The fake ``cuThreadExchangeStreamCaptureMode``: per thread, its mode (``GLOBAL`` at first);
    ``log``: (thread name, mode set) per exchange, in order; ``result``: what the exchange returns
    (a failure leaves the mode as it was)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.log: list[tuple[str, object]] = []
        self.result = driver.CUresult.CUDA_SUCCESS

    def mode(self) -> object:
        """The calling thread's mode now."""
        return getattr(self._local, "mode", GLOBAL)

    def exchange(self, mode: object) -> tuple[object, object]:
        assert isinstance(mode, driver.CUstreamCaptureMode), mode
        if self.result != driver.CUresult.CUDA_SUCCESS:
            return self.result, None
        previous = self.mode()
        self._local.mode = mode
        self.log.append((threading.current_thread().name, mode))
        return self.result, previous


@pytest.fixture
def modes(monkeypatch: pytest.MonkeyPatch) -> CaptureModes:
    """The fake capture modes in place of the driver's (also where no driver library is installed)."""
    fake = CaptureModes()
    monkeypatch.setattr(driver, "cuThreadExchangeStreamCaptureMode", fake.exchange)
    monkeypatch.setattr(capture_mode, "_available", True)
    return fake
