"""Host arrays that overlap in part at ``kernel[grid](...)``: C-contiguous arrays of the machine's
byte order that share memory (whatever their element types) are one device copy of the union of
their bytes, each argument at its own offset (backend/runtime/host_groups.py), so the GPU path runs
what the interpreter runs with the same arrays used in place; it refused them (SP0750) where either
was written. The plan is checked on its own (a property test over random views of one buffer), and
a launch on the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory)
against the interpreter, bit for bit. The launches on a GPU: tests/gpu/test_partial_overlap_gpu.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sparsile.backend.runtime.host_groups import ALIGNMENT, HostEntry, aliasable, plan_host_groups, written_spans
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)

DTYPES = (np.uint8, np.int16, np.float16, np.float32, np.uint32, np.float64)


@st.composite
def views(draw: st.DrawFn) -> tuple[np.ndarray, list[HostEntry]]:
    """A buffer and 1-5 C-contiguous views of random offsets, lengths and dtypes into it (a written
    flag each)."""
    base = np.zeros(512 + 7, np.uint8)[draw(st.integers(0, 7)):]  # (any alignment of the base)
    entries = []
    for i in range(draw(st.integers(1, 5))):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        start = draw(st.integers(0, 511))
        count = draw(st.integers(0, (512 - start) // dtype.itemsize))
        view = base[start:start + count * dtype.itemsize].view(dtype)
        entries.append(HostEntry(f"a{i}", view, draw(st.booleans()), aliasable(view)))
    return base, entries


@given(views())
def test_the_plan_keeps_each_arrays_offsets_and_alignment_and_covers_each_byte_once(
        drawn: tuple[np.ndarray, list[HostEntry]]) -> None:
    """Each argument's device address (a 256-aligned allocation + lead + offset) is as far from every
    other member's as on the host and, where the spans differ, as aligned mod 256; the groups' spans
    are disjoint and each is the union of its members' spans; only written members' bytes come back."""
    _, entries = drawn
    groups = plan_host_groups(entries)
    assert sorted(i for g in groups for i in g.members) == list(range(len(entries)))
    spans = [(g.lo, g.hi) for g in groups if g.hi > g.lo]
    for (lo, hi), (lo2, hi2) in zip(sorted(spans), sorted(spans)[1:], strict=False):
        assert hi <= lo2 or hi == lo or hi2 == lo2, "a byte staged twice"
    for g in groups:
        allocation = ALIGNMENT * 1000  # (cuMemAlloc's alignment)
        addresses = [allocation + g.lead + off for off in g.offsets]
        host = [entries[i].array.ctypes.data for i in g.members]
        assert [a - addresses[0] for a in addresses] == [h - host[0] for h in host]
        distinct = {entries[i].span for i in g.members}
        if len(distinct) > 1:
            assert all(a % ALIGNMENT == h % ALIGNMENT for a, h in zip(addresses, host, strict=True))
        else:
            assert g.lead == 0 and set(g.offsets) == {0}
        covered = np.zeros(g.hi - g.lo, np.int64)
        for i in g.members:
            lo, hi = entries[i].span
            covered[lo - g.lo:hi - g.lo] = 1
        assert covered.all() or g.hi == g.lo, "the union has a hole"
        assert g.nbytes == g.lead + g.hi - g.lo
        back = written_spans(g, entries)
        for lo, _ in back:
            assert any(entries[i].span[0] <= lo < entries[i].span[1] for i in g.written)
        assert sum(hi - lo for lo, hi in back) == len({b for i in g.written
                                                       for b in range(*entries[i].span)})


def test_overlapping_host_arrays_run_as_the_interpreter_runs_them(device: FakeDevice) -> None:
    """out = x + y with y four floats past x and out = x, all views of one buffer (was SP0750 on the
    GPU path): one device copy of their union; each reads the bytes as the interpreter's in-place
    arrays do (one program at a time, reads before writes: the faked kernel reads all, then writes)."""
    rng = np.random.default_rng(11)
    memory = rng.uniform(-100, 100, N + 4).astype(np.float32)
    interp, gpu = memory.copy(), memory.copy()
    k = vadd()
    k.interpret[GRID](interp[:N], interp[4:], interp[:N], N, BLOCK=BLOCK)
    k[GRID](gpu[:N], gpu[4:], gpu[:N], N, BLOCK=BLOCK)
    assert device.launches == 1
    ref = memory[:N].astype(np.float64) + memory[4:].astype(np.float64)
    np.testing.assert_allclose(interp[:N].astype(np.float64), ref, rtol=1e-6)
    assert gpu.tobytes() == interp.tobytes()
    (buffer,) = device.mem.values()  # one copy of the union of the three
    assert len(buffer) >= 4 * (N + 4)


def test_float_and_integer_views_of_shared_bytes_are_one_copy(device: FakeDevice) -> None:
    """x (f32) reads bytes half of which out writes, out an f32 view of a u32 view of them, half
    before x's (each program reads before it writes, and later programs write later bytes: no race);
    the GPU path and the interpreter agree bit for bit."""
    rng = np.random.default_rng(12)
    memory = rng.uniform(-100, 100, N + N // 2).astype(np.float32)
    y = rng.uniform(-100, 100, N).astype(np.float32)
    interp, gpu = memory.copy(), memory.copy()
    k = vadd()
    k.interpret[GRID](interp[N // 2:], y, interp.view(np.uint32)[:N].view(np.float32), N, BLOCK=BLOCK)
    k[GRID](gpu[N // 2:], y, gpu.view(np.uint32)[:N].view(np.float32), N, BLOCK=BLOCK)
    assert device.launches == 1
    ref = memory[N // 2:].astype(np.float64) + y.astype(np.float64)
    np.testing.assert_allclose(gpu[:N].astype(np.float64), ref, rtol=1e-6)
    assert gpu.tobytes() == interp.tobytes()
    np.testing.assert_array_equal(gpu[N:], memory[N:])  # not written: left alone
