"""The staging plan of a launch's host arrays (backend/runtime/host_groups.py) meets the arguments
more than once: the launcher converts them in a pass that checks them and collects the host arrays
(the plan is made from those), then again, staging each host array at its planned place from the
planned arrays; driver/launch.py plans the host arrays read through TMA. Found in a review of the
staging rework: what a host array's memory is kept alive by in the plan, and how the TMA staging
copies a group whose members are copied by their values.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory) and
the raw device memory of tests/backend/test_host_staging.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from sparsile.frontend import dlpack
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)


class _Owner:
    """What one export's memory belongs to: poisoned (NaN) when the export is released, as memory
    freed and reused would be (the producer keeps it allocated, so that no later export is made in
    the same memory, with the same values)."""

    def __init__(self, memory: np.ndarray):
        self.memory = memory

    def __del__(self) -> None:
        self.memory[...] = np.nan


class MaterializingExport:
    """A DLPack producer that exports its values in memory it allocates per export, alive until the
    consumer releases the capsule (a lazily computed or compressed array's pattern: read-only use)."""

    def __init__(self, values: np.ndarray):
        self.values, self.dtype, self.shape = values, values.dtype, values.shape
        self.memories: list[np.ndarray] = []

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        memory = self.values.copy()
        self.memories.append(memory)
        return dlpack.export_capsule(memory.ctypes.data, memory.shape, "f32", dlpack.DEVICE_CPU, 0,
                                     owner=_Owner(memory))

    def __dlpack_device__(self) -> Any:
        return (dlpack.DEVICE_CPU, 0)


def test_a_host_export_is_staged_from_memory_still_alive(device: FakeDevice) -> None:
    """The launcher staged a DLPack host export (a pointer argument) from the export of its
    checking pass, whose capsule it had let go (the plan held a view of the memory, not its owner):
    the copy read released memory (here poisoned: NaN results)."""
    rng = np.random.default_rng(5)
    x, y = (rng.uniform(-100, 100, N).astype(np.float32) for _ in range(2))
    out = np.full(N, np.nan, np.float32)
    vadd()[GRID](MaterializingExport(x), y, out, N, BLOCK=BLOCK)
    assert device.launches == 1
    got = out.astype(np.float64)
    assert not np.isnan(got).any(), "the staged copy read released memory"
    np.testing.assert_allclose(got, x.astype(np.float64) + y.astype(np.float64), rtol=1e-6, atol=1e-5)
