"""Repeated eager calls replayed as one CUDA-graph launch (docs/torch.md, "The eager call's fast path").

A decode loop calls each layer with x at the same address step after step (torch's caching allocator
hands out the same blocks for the same sequence of allocations), and the layer's y, allocated by the
call, lands at the same address too. For such a call the launches of the layer's record are the same
bytes as last time, so they can be captured once into a CUDA graph and replayed with one
``cuGraphLaunch``: on the H200's host that took 2.8 µs against 6.8-7.7 µs for one ``cuLaunchKernel``
and 12.0-13.8 µs for two (``benchmarks/probe_graph_launch.py``, benchmarks/RESULTS.md, thirtieth
session).

:class:`GraphReplays` belongs to a layer's :class:`~.last_call.LastCall`. After a call launched
natively with (x, y) at addresses it saw ``REPEATS`` times among its last calls, it captures
the record's native launch at those addresses on a private stream (thread-local capture mode: other
threads are not affected; the capturing thread itself in thread-local mode meanwhile, so that a user's
global-mode capture on another thread does not refuse its calls either, backend/runtime/capture_mode.py)
and instantiates it. A later call with x and y at exactly those addresses
launches the graph on torch's current stream; any other call launches natively as before. A graph
is only ever replayed at the addresses it was captured with, never updated, so threads sharing it
need no lock. At most ``MAX_GRAPHS`` graphs per last call (address pairs), at most ``MAX_CAPTURES``
capture attempts; a failed capture or replay turns the replays off for that last call (the native
launch goes on). ``SPARSILE_TORCH_GRAPH_REPLAY=0`` turns them off (read when a last call is made).

What the graph gives up: its first kernel cannot start early under programmatic dependent launch
while the kernel before it finishes (PDL between its own launches, as in an e4m3 call's quantizer and
GEMM, is kept as a programmatic edge of the graph). That overlap matters only where the GPU, not the
host, bounds the call.
"""

from __future__ import annotations

import ctypes as c
import functools
import os
import threading
import weakref
from typing import Any

from ...backend.runtime.capture_mode import thread_local_capture_mode
from ...backend.runtime.devices import RETRY_AFTER_CONTEXT_SWITCH, leave
from ...backend.runtime.release import defer, drain

ENV = "SPARSILE_TORCH_GRAPH_REPLAY"
REPEATS = 2
"""Native calls at the same (x, y) addresses before they are captured (a capture costs about as much
as a few dozen launches, once)."""
MAX_GRAPHS = 4
_SEEN_PAIRS = 8  # address pairs counted at a time (the count restarts beyond)
MAX_CAPTURES = 8
_CAPTURE_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
_STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
_RETRY = frozenset(int(e) for e in RETRY_AFTER_CONTEXT_SWITCH)  # another device's context was current

DRIVER: Any = None
"""The driver entry points (:class:`Driver`; tests set a fake before the first last call)."""
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get(ENV, "1") == "1"


class Driver:
    """The libcuda entry points a graph replay needs, bound by ctypes (each returns a CUresult)."""

    def __init__(self, lib: Any):
        vp, u32 = c.c_void_p, c.c_uint
        table = {"cuStreamCreate": [vp, u32], "cuStreamDestroy_v2": [vp],
                 "cuStreamBeginCapture_v2": [vp, c.c_int], "cuStreamEndCapture": [vp, vp],
                 "cuGraphInstantiateWithFlags": [vp, vp, c.c_ulonglong], "cuGraphDestroy": [vp],
                 "cuGraphExecDestroy": [vp], "cuGraphLaunch": [vp, vp]}
        for name, argtypes in table.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, c.c_int
            setattr(self, name, fn)

    def capture(self, launch: Any) -> tuple[int, int]:
        """(CUresult, graph exec handle): ``launch(stream)`` (returning a CUresult, or < 0 for not
        launched) captured on a new private stream and instantiated; (nonzero, 0) when any step
        failed (the stream, and a graph captured, are destroyed in every case)."""
        stream, graph, graph_exec = c.c_void_p(), c.c_void_p(), c.c_void_p()
        status = self.cuStreamCreate(c.pointer(stream), _STREAM_NON_BLOCKING)
        if status:
            return status, 0
        try:
            status = self.cuStreamBeginCapture_v2(stream, _CAPTURE_THREAD_LOCAL)
            if status:
                return status, 0
            launched = launch(stream.value or 0)
            ended = self.cuStreamEndCapture(stream, c.pointer(graph))  # (ends the capture whatever happened)
            try:
                if launched or ended:
                    return launched or ended, 0
                status = self.cuGraphInstantiateWithFlags(c.pointer(graph_exec), graph, 0)
                return (status, 0) if status else (0, graph_exec.value or 0)
            finally:
                if graph.value:
                    self.cuGraphDestroy(graph)
        finally:
            self.cuStreamDestroy_v2(stream)


def driver() -> Any:
    """The shared :class:`Driver` (or the fake tests set); None where libcuda cannot be loaded."""
    global DRIVER
    if DRIVER is None:
        with _lock:
            if DRIVER is None:
                from ...backend.runtime.cudalib import LIBCUDA

                try:
                    DRIVER = Driver(c.CDLL(LIBCUDA))
                except (OSError, AttributeError):
                    DRIVER = False
    return DRIVER or None


class GraphReplays:
    """The graph replays of one last call: its record's native launch ``native`` (a
    :class:`~.native.NativeLaunch`) captured per (x, y) address pair it saw repeated."""

    __slots__ = ("__weakref__", "_driver", "attempts", "graphs", "native", "replayed", "seen")

    def __init__(self, native: Any, drv: Any):
        self.native, self._driver = native, drv
        self.graphs: dict[tuple[int, int], int] = {}  # (x, y) addresses -> graph exec handle
        self.seen: dict[tuple[int, int], int] = {}  # address pairs launched natively, how often
        self.attempts = 0
        self.replayed = 0  # calls launched as a graph
        # the graph execs are destroyed after this object is collected, at the next safe point: garbage
        # collection may run inside a user's CUDA graph capture (release.py; a graph in flight is freed
        # when it completes)
        weakref.finalize(self, defer, functools.partial(_destroy, drv, self.graphs))

    @classmethod
    def of(cls, native: Any) -> GraphReplays | None:
        """The replays of ``native``'s launches, or None: turned off, or no driver here."""
        if not enabled():
            return None
        drv = driver()
        return cls(native, drv) if drv is not None else None

    def launch(self, pair: tuple[int, int], stream: int) -> bool:
        """Launch the graph captured at the address pair ``pair`` on ``stream``: True when it ran,
        False when there is none (or the launch failed: the replays are then off, the caller
        launches natively)."""
        graph_exec = self.graphs.get(pair)
        if graph_exec is None:
            return False
        restore = self.native._context_current()  # (None on one GPU: no driver call)
        try:
            status = self._driver.cuGraphLaunch(graph_exec, stream)
            if status in _RETRY:  # torch switched contexts behind sparsile's cache: this graph's device's, again
                again = self.native._context_current(True)
                restore = again if restore is None else restore
                status = self._driver.cuGraphLaunch(graph_exec, stream)
        finally:
            if restore is not None:  # the thread's own context again, as a torch op's device guard
                leave(restore)
        if status == 0:
            self.replayed += 1
            return True
        self.attempts = MAX_CAPTURES  # no more captures, and no more replays: a new empty table (the
        self.graphs = {}  # finalizer keeps the old one, whose graphs it destroys with this object)
        return False

    def launched_natively(self, pair: tuple[int, int]) -> None:
        """A call at ``pair`` was launched natively (all of it): captured once the pair was seen
        ``REPEATS`` times among the last few calls (a caller that keeps the previous y alive while
        it calls again alternates between two y addresses)."""
        seen = self.seen
        count = seen.get(pair, 0) + 1
        if count < REPEATS:
            if len(seen) >= _SEEN_PAIRS:
                seen.clear()
            seen[pair] = count
            return
        seen.pop(pair, None)
        if self.attempts >= MAX_CAPTURES or len(self.graphs) >= MAX_GRAPHS:
            return
        self.attempts += 1
        x, y = pair
        native = self.native
        drain()  # graphs of collected replays: destroyed here, in an eager call that captures itself next
        restore = native._context_current(True)  # the capture stream is created in the record's device's context

        def capture(stream: int) -> int:
            return native.launch(x, y, 0, stream)[0]  # (a nonzero status: not all captured, discarded)

        try:
            # the capture begins in THREAD_LOCAL mode (a user's global capture on another thread is not
            # affected by it), and this thread's calls around it (stream creation, instantiation, destroys)
            # run in THREAD_LOCAL mode too: a user's global capture on another thread does not refuse them
            # (and is not invalidated by them); this capture itself still refuses them inside it
            with thread_local_capture_mode():
                status, graph_exec = self._driver.capture(capture)
        finally:
            if restore is not None:  # the thread's own context again
                leave(restore)
        if status or not graph_exec:
            self.attempts = MAX_CAPTURES  # this record does not capture: no more attempts
            return
        self.graphs[pair] = graph_exec


def _destroy(drv: Any, graphs: dict[tuple[int, int], int]) -> None:
    for graph_exec in graphs.values():
        try:
            drv.cuGraphExecDestroy(graph_exec)
        except Exception:  # (at interpreter exit the driver may be gone)
            pass
    graphs.clear()
