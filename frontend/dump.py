"""Dumps of the program after named stages of the compile pipeline (docs/architecture.md).

``SPARSILE_DUMP_AFTER=sema,layout`` in the environment, or ``sparsile compile --dump-after layout``,
prints the program after each named stage to standard error, under a header naming the stage and
the kernel (or file). The stages and their order are listed once, in ``driver/compiler.py``
(``PIPELINE``); this module only knows which names were asked for, so that every layer can dump
without importing the driver.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TextIO

ENV_DUMP_AFTER = "SPARSILE_DUMP_AFTER"
"""Comma-separated stage names whose output is printed to standard error."""

_REQUESTED: ContextVar[frozenset[str] | None] = ContextVar("sparsile_dump_after", default=None)
_STREAM: ContextVar[TextIO | None] = ContextVar("sparsile_dump_stream", default=None)


def requested_stages() -> frozenset[str]:
    """The stage names to dump after: those of :func:`dumping` if active, else the environment's."""
    names = _REQUESTED.get()
    if names is not None:
        return names
    text = os.environ.get(ENV_DUMP_AFTER, "")
    return frozenset(n.strip() for n in text.split(",") if n.strip()) if text else frozenset()


def dump(stage: str, subject: str, render: Callable[[], str]) -> None:
    """Print ``render()`` under a header when ``stage`` was asked for (``render`` runs only then)."""
    if stage not in requested_stages():
        return
    stream = _STREAM.get() or sys.stderr
    text = render()
    stream.write(f"// ---- after {stage}: {subject} ----\n{text}{'' if text.endswith(chr(10)) else chr(10)}")


@contextlib.contextmanager
def dumping(stages: Iterable[str], stream: TextIO | None = None) -> Iterator[None]:
    """Dump after ``stages`` (instead of the environment's) to ``stream`` (default stderr) inside."""
    names = _REQUESTED.set(frozenset(stages))
    out = _STREAM.set(stream)
    try:
        yield
    finally:
        _REQUESTED.reset(names)
        _STREAM.reset(out)
