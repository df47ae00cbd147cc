"""A module-scoped pytest fixture that moves what lives before a test module's first test out of the
garbage collector's generations (``gc.freeze``), for test modules that call ``gc.collect()`` (bind it
in a module as ``frozen_heap = frozen_heap.frozen_heap``: it is autouse there).

A full collection scans every object the collector tracks: in an xdist worker that has imported torch
and run many test files, seconds a collection on a loaded CI machine (test_torch_capture_frees.py's
three collections took 33 s in a full run on a contended machine, most of test_torch_graph_life.py's 193 s;
test_context_restore.py freezes for the same reason). Frozen, those objects are not scanned; the
tests' own objects, made after the freeze, are collected as before, and a newer object that a frozen
one refers to (a module's registry) is kept, as it would be. Garbage frozen with the rest (cycles left
by earlier files, not collected first: that collection would cost as much as the ones saved) is only
collected after the module's last test; it refers to nothing made later. ``gc.get_objects()`` lists
only the unfrozen objects: the tests'. Module-level objects that a test expects a collection to free
must not be made before the freeze (a test makes its own)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def frozen_heap() -> Iterator[None]:
    """Everything alive (or uncollected) before the module's first test frozen; unfrozen after its last."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
