"""Knowing when a CUDA graph is destroyed: driver user objects whose destructor is native code.

A graph captured by the caller (``torch.cuda.graph``) may bake in memory that a cache owns (a launch
record's scratch); that memory must be kept while the graph, or any executable instantiated from
it, may still run, and may be let go once it is gone. The driver says when: a *user object*
(``cuUserObjectCreate``) whose references a graph holds (``cuGraphRetainUserObject`` with
``CU_GRAPH_USER_OBJECT_MOVE``, on the graph a capture is building, from ``cuStreamGetCaptureInfo``)
has its destroy callback called once the graph and every executable graph made from it are
destroyed, after their launches in flight are complete.

The callback runs on a driver thread shared with host functions (``cuLaunchHostFunc``) and must not
call CUDA or block. A Python callback (ctypes or cuda-bindings) would take the GIL there: it blocks
while any Python thread holds it (a ``.cpu()`` waiting on a stream whose host function that driver
thread should run would never finish), and after the interpreter is finalized taking the GIL ends
the driver's thread. So the callback is native code JIT-compiled by llvmlite (as the launch records
are: :mod:`.native_launch`), with no Python in it: it marks the object's *cell* (8 bytes of libc
memory) and adds one to a process-wide counter. Python looks at the counter when convenient
(:meth:`GraphReleases.released`: one 8-byte read) and only then scans the pending cells
(:meth:`GraphReleases.collect`), handing back the payload registered with each released cell.

Nothing here is ever freed while the driver may still call it: the machine code and the counter
live until the process ends (their Python owners are given an extra reference), and a cell is
freed only after its callback has run, or where no user object was made for it (a cell whose
making raised part way stays pending until its callback runs, for good if it never does). Where
anything of this is unavailable (no llvmlite engine, no driver entry point, an error)
:func:`graph_releases` returns None, or :meth:`GraphReleases.watch` False, and the caller keeps its
memory as it would without it.
"""

from __future__ import annotations

import ctypes as c
import functools
import threading
from collections.abc import Callable
from typing import Any

from .native_launch import compile_ir, fill

RELEASED_IR = r"""
define void @sparsile_graph_released(ptr %cell) {
entry:
  store atomic i64 1, ptr %cell seq_cst, align 8
  %counter = inttoptr i64 {COUNTER} to ptr
  %old = atomicrmw add ptr %counter, i64 1 seq_cst
  ret void
}
"""
"""The destroy callback of every user object: the cell marked, then the counter raised (both atomic)."""

TIED, RELEASED, FAILED = "tied", "released", "failed"
"""What :data:`Attach` reports: the object's reference moved to the graph; the object made but not
retained by the graph (so released at once: its callback runs, or ran); nothing made."""

Attach = Callable[[int, int, int], str]
"""``attach(graph, cell, callback)``: a user object of ``cell`` with destroy callback ``callback``
(a function address) whose one reference goes to ``graph`` (a ``CUgraph`` handle); one of
:data:`TIED`, :data:`RELEASED`, :data:`FAILED`."""


CU_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1
CU_GRAPH_USER_OBJECT_MOVE = 1
"""The flags of ``cuUserObjectCreate`` and ``cuGraphRetainUserObject`` (cuda.h)."""


@functools.cache
def _user_objects() -> tuple[Any, Any, Any]:
    """libcuda's ``cuUserObjectCreate``, ``cuGraphRetainUserObject`` and ``cuUserObjectRelease``
    through ctypes, argument types fixed (the callback and its cell pass as plain addresses)."""
    from .cudalib import LIBCUDA

    lib = c.CDLL(LIBCUDA)
    create, retain, release = lib.cuUserObjectCreate, lib.cuGraphRetainUserObject, lib.cuUserObjectRelease
    create.argtypes = [c.POINTER(c.c_void_p), c.c_void_p, c.c_void_p, c.c_uint, c.c_uint]
    retain.argtypes = [c.c_void_p, c.c_void_p, c.c_uint, c.c_uint]
    release.argtypes = [c.c_void_p, c.c_uint]
    for f in (create, retain, release):
        f.restype = c.c_int
    return create, retain, release


def driver_attach(graph: int, cell: int, callback: int) -> str:
    """:data:`Attach` through libcuda: ``cuUserObjectCreate`` (the cell, the callback, one
    reference, ``CU_USER_OBJECT_NO_DESTRUCTOR_SYNC``), then ``cuGraphRetainUserObject`` moving that
    reference to the graph; where the graph refuses it, the reference is released
    (``cuUserObjectRelease``: the callback runs, at once or soon)."""
    try:
        create, retain, release = _user_objects()
    except Exception:  # (no libcuda, no entry point: nothing made, the cell is the caller's to free)
        return FAILED
    obj = c.c_void_p()
    if create(c.byref(obj), cell, callback, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) != 0 or not obj.value:
        return FAILED
    try:
        retained = retain(graph, obj, 1, CU_GRAPH_USER_OBJECT_MOVE) == 0
    except Exception:  # (a ctypes error before the call: the reference is still ours)
        retained = False
    if retained:
        return TIED
    release(obj, 1)  # (raising here, the object and its cell are kept: GraphReleases.watch)
    return RELEASED


def _libc() -> c.CDLL:
    libc = c.CDLL(None)
    libc.calloc.restype, libc.calloc.argtypes = c.c_void_p, [c.c_size_t, c.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [c.c_void_p]
    return libc


def _immortal(obj: Any) -> None:
    """Give ``obj`` a reference nothing releases: it is never collected, not even when the
    interpreter finalizes (what the driver may call into must outlive every graph)."""
    c.pythonapi.Py_IncRef(c.py_object(obj))


class GraphReleases:
    """The native destroy callback, its counter and the cells of the user objects not yet released.
    ``attach`` (tests pass a fake): how a user object is made and given to a graph."""

    def __init__(self, attach: Attach = driver_attach):
        self._libc = _libc()
        counter = self._libc.calloc(1, 8)
        if not counter:
            raise MemoryError("no memory for the graph-release counter")
        self._engine = compile_ir(fill(RELEASED_IR, {"COUNTER": counter}))
        _immortal(self._engine)  # (its machine code is the callback)
        self.callback: int = self._engine.get_function_address("sparsile_graph_released")
        self._counter = c.c_int64.from_address(counter)
        self._attach = attach
        self._pending: dict[int, Any] = {}  # cell address -> payload (None: nothing to hand back)
        self._collected = 0  # releases collected: the counter's value once every release so far is collected
        self._lock = threading.Lock()

    def watch(self, graph: int, payload: Any) -> bool:
        """Hand ``payload`` back from :meth:`collect` once the graph ``graph`` (a ``CUgraph`` being
        captured, or built) and every executable graph made from it are destroyed. False where no
        user object could be given to it (nothing will be handed back)."""
        cell = self._libc.calloc(1, 8)
        if not cell:
            return False
        # under the lock: a collect on another thread must not see the cell before its payload is
        # settled (an object the graph refused runs its callback at once: that collect handed its
        # payload back, dropping a record the graph replays, and freed the cell, which this then
        # put back as pending, to be read and freed again). The driver calls made meanwhile run no
        # Python (the callback is native), so nothing here waits for this lock
        with self._lock:
            self._pending[cell] = payload
            try:
                state = self._attach(graph, cell, self.callback)
            except Exception:  # an object may have been made (and even given to the graph) before the
                state = None   # error: its callback may write to the cell at any later time
            if state == TIED:
                return True
            if state == FAILED:  # nothing made: nothing will write to the cell
                del self._pending[cell]
                self._libc.free(cell)
            else:  # RELEASED (its callback runs, or ran), or not known: freed once its callback has run
                self._pending[cell] = None  # (at a collect), never otherwise; nothing handed back
            return False

    def released(self) -> bool:
        """Whether a watched graph was destroyed since the last :meth:`collect` (one memory read)."""
        return self._counter.value != self._collected

    @property
    def counter(self) -> c.c_int64:
        """The counter every destroy callback raises by one (a ``c_int64`` over native memory that
        lives until the process ends): a caller that noted its ``value`` learns that a watched graph
        was destroyed since with one 8-byte read, no call and no lock (a layer's fast path)."""
        return self._counter

    def collect(self) -> list[Any]:
        """The payloads of the graphs destroyed since the last call (their cells freed)."""
        payloads = []
        with self._lock:
            for cell, payload in tuple(self._pending.items()):
                if c.c_int64.from_address(cell).value == 0:
                    continue
                self._pending.pop(cell, None)
                self._libc.free(cell)
                self._collected += 1
                if payload is not None:
                    payloads.append(payload)
        return payloads

    def pending(self) -> int:
        """How many user objects' graphs are not yet known to be destroyed."""
        return len(self._pending)

    def cells(self) -> list[int]:
        """The addresses of the pending cells (tests call the callback on them, as the driver would)."""
        return list(self._pending)


_shared: list[GraphReleases | None] = []
_shared_lock = threading.Lock()


def graph_releases() -> GraphReleases | None:
    """The process's :class:`GraphReleases` (JIT-compiled on first use), or None where it cannot be
    built (no llvmlite engine here): asked once."""
    with _shared_lock:
        if not _shared:
            try:
                _shared.append(GraphReleases())
            except Exception:
                _shared.append(None)
        return _shared[0]
