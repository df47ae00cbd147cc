"""Recording what one high-level call launches, so that a later call of the same shapes can replay it
without planning again (``stdlib/kernels/call_cache.py``: ``sparse_matmul``'s call cache).

While a :class:`Recording` is active in this thread (``with recording() as rec:``):

- every ``kernel[grid](...)`` and ``kernel.interpret[grid](...)`` call appends its launcher, its
  positional arguments and its keyword arguments to ``rec.launches`` once it has returned;
- every array the stdlib's planners allocate as scratch (``stdlib/kernels/arrays.py``:
  ``empty_array``, ``zeros_array``) is noted in ``rec.scratch`` with whether it was zero-filled;
- a launch that cannot be replayed from that record (a prepared launch called directly, a launch on
  an explicit stream) sets ``rec.unreplayable`` to the reason.

Recording costs one ``ContextVar.get`` per launch when no recording is active.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Recording:
    """What one call launched (see the module docstring)."""

    launches: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    scratch: dict[int, tuple[Any, bool]] = field(default_factory=dict)  # id -> (array, zero-filled)
    unreplayable: str = ""


ACTIVE: ContextVar[Recording | None] = ContextVar("sparsile_recording", default=None)


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Record this thread's launches and scratch allocations until the block ends."""
    rec = Recording()
    token = ACTIVE.set(rec)
    try:
        yield rec
    finally:
        ACTIVE.reset(token)


def active() -> Recording | None:
    """The recording of this thread, or None."""
    return ACTIVE.get()


def record_launch(launcher: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stream: Any = None) -> None:
    """``launcher(*args, **kwargs)`` has returned (``kernel[grid]`` or ``kernel.interpret[grid]``)."""
    rec = ACTIVE.get()
    if rec is None:
        return
    if stream is not None:
        rec.unreplayable = "a launch on an explicit stream"
    rec.launches.append((launcher, args, dict(kwargs)))


def note_scratch(array: Any, zero: bool = False) -> Any:
    """``array`` was allocated as scratch of the call being recorded (``zero``: and zero-filled);
    returns it."""
    rec = ACTIVE.get()
    if rec is not None:
        rec.scratch[id(array)] = (array, zero)
    return array


def mark_unreplayable(reason: str) -> None:
    """The call being recorded launched something a replay would miss."""
    rec = ACTIVE.get()
    if rec is not None:
        rec.unreplayable = reason
