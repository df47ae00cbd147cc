"""stdlib/kernels/call_native.py on the CPU: a NativePlan's launches with a real prepared launch on
the fake device of tests/backend/test_prepared.py (a kernel compiled for sm_90a, never run) and the
record launcher JIT-compiled over fake libcuda entry points (tests/integrations/record_fakes.py),
which record the parameter bytes each launch passes."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

import sparsile as sp  # noqa: E402
from sparsile.backend.runtime import native_launch as nl  # noqa: E402
from sparsile.stdlib.kernels import call_cache, call_native  # noqa: E402
from sparsile.tests.backend.test_prepared import FakeCudaTensor, q  # noqa: E402
from sparsile.tests.backend.test_prepared import gpu as gpu  # noqa: E402 (the fake device, a fixture)
from sparsile.tests.integrations.record_fakes import FakeDriver  # noqa: E402
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)


@sp.jit
def four(a: sp.ptr[sp.f32], e: sp.ptr[sp.f32], b: sp.ptr[sp.f32], y: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    x = sp.load(a + offs, mask=mask) + sp.load(e + offs, mask=mask) + sp.load(b + offs, mask=mask)
    sp.store(y + offs, x, mask=mask)


@pytest.fixture
def native(gpu, monkeypatch):
    """(the NativePlan of ``four`` reading values, words, b and C, the fake driver)."""
    driver = FakeDriver([8, 8, 8, 8, 4])
    monkeypatch.setattr(call_native, "_launcher", nl.RecordLauncher(driver.entry_points()))
    monkeypatch.setattr(call_native, "_capturing", lambda: False)
    Ref = call_cache.ArrayRef
    refs = (Ref("input", 0), Ref("words"), Ref("input", 2), Ref("scratch", 0), 64)
    launch = call_native.NativeLaunch(four[(1,)], refs, {"BLOCK": 64}, ("b", "y"), (0, 1))
    return call_native.NativePlan((launch,), ("scratch", 0)), driver


def arrays(base):
    return [FakeCudaTensor(base + i * 0x10000, (64,)) for i in range(4)]


def test_a_native_replay_passes_the_call_s_four_addresses(native):
    plan, driver = native
    for base in (0x7A00_0000_0000, 0x7B00_0000_0000):  # two weights: a record each
        values, words, _, _ = arrays(base)
        for at in (0x7C00_0000_0000, 0x7C00_0010_0000):  # b and C per call
            b, c = FakeCudaTensor(at, (64,)), FakeCudaTensor(at + 0x1000, (64,))
            assert plan.launch(values, words, b, c)
            assert driver.launches[-1][5] == [q(values.data_ptr()), q(words.data_ptr()), q(b.data_ptr()),
                                              q(c.data_ptr()), (64).to_bytes(4, "little")]
    assert len(plan.records) == 2


def test_a_native_record_keeps_no_weight_alive(native):
    """The records are keyed by address: a weight freed (a MetadataBuffer's device words with it)
    is not kept alive by the record made for it, and a weight made later at its addresses is
    launched from them."""
    plan, driver = native
    values, words, b, c = arrays(0x7A00_0000_0000)
    assert plan.launch(values, words, b, c)
    gone = weakref.ref(values), weakref.ref(words)
    del values, words
    gc.collect()
    assert [r() for r in gone] == [None, None]
    values, words, _, _ = arrays(0x7A00_0000_0000)  # at the freed weight's addresses
    assert plan.launch(values, words, b, c) and len(plan.records) == 1
    assert driver.launches[-1][5][:2] == [q(values.data_ptr()), q(words.data_ptr())]


def test_weights_beyond_the_record_limit_keep_to_the_prepared_launch(native, monkeypatch):
    """More weights of one key than MAX_RECORDS, called in turn: the first weights keep their
    records and the others take the prepared launch; no record is built again on every call (a
    build prepares the launch: several times a prepared launch's host time)."""
    plan, _ = native
    monkeypatch.setattr(call_native, "MAX_RECORDS", 2)
    builds = []
    build = call_native.NativePlan._build
    monkeypatch.setattr(call_native.NativePlan, "_build", lambda self, *a: (builds.append(a[0]), build(self, *a))[1])
    weights = [arrays(base)[:2] for base in (0x7A00_0000_0000, 0x7B00_0000_0000, 0x7C00_0000_0000)]
    b, c = arrays(0x7D00_0000_0000)[2:]
    launched = [plan.launch(values, words, b, c) for _ in range(3) for values, words in weights]
    assert launched == [True, True, False] * 3
    assert len(builds) == 2 and len(plan.records) == 2


def test_a_failed_native_launch_warns_at_the_caller_and_the_weight_keeps_to_the_prepared_launch(native):
    plan, driver = native
    driver.result = 700  # CUDA_ERROR_ILLEGAL_ADDRESS (not retried after a context switch)
    values, words, b, c = arrays(0x7A00_0000_0000)

    def replay():  # call_cache.replay, then Replay.__call__, as sparse_matmul calls them
        return (lambda: plan.launch(values, words, b, c))()

    def sparse_matmul():
        return replay()

    with pytest.warns(RuntimeWarning, match="CUresult 700") as warned:
        line = sys._getframe().f_lineno + 1
        assert not sparse_matmul()
    assert warned[0].filename == __file__ and warned[0].lineno == line
    n = len(driver.launches)
    assert not plan.launch(values, words, b, c) and len(driver.launches) == n  # not tried again
    assert plan.records[(values.data_ptr(), words.data_ptr())] is None


def test_two_launches_through_a_workspace_take_b_c_and_the_workspace_per_call(gpu, monkeypatch):
    """A split-K replay: the first launch reads the weight and b into the workspace, the second the
    workspace into C; a call passes b, C and the workspace (sources 0, 1, 2). Where the second launch
    is declined, one launch was made and the caller's prepared launches make the other."""
    driver = FakeDriver([8, 8, 8, 8, 4])
    monkeypatch.setattr(call_native, "_launcher", nl.RecordLauncher(driver.entry_points()))
    monkeypatch.setattr(call_native, "_capturing", lambda: False)
    Ref = call_cache.ArrayRef
    weight = (Ref("input", 0), Ref("words"))
    first = call_native.NativeLaunch(four[(1,)], (*weight, Ref("input", 2), Ref("scratch", 1), 64), {"BLOCK": 64},
                                     ("b", "y"), (0, 2))
    second = call_native.NativeLaunch(four[(1,)], (*weight, Ref("scratch", 1), Ref("scratch", 0), 64), {"BLOCK": 64},
                                      ("b", "y"), (2, 1))
    plan = call_native.NativePlan((first, second), ("scratch", 0), ("scratch", 1))
    values, words, b, c = arrays(0x7A00_0000_0000)
    w = FakeCudaTensor(0x7E00_0000_0000, (64,))
    assert plan.launch(values, words, b, c, w) == 2
    assert driver.launches[-2][5][:4] == [q(values.data_ptr()), q(words.data_ptr()), q(b.data_ptr()), q(w.data_ptr())]
    assert driver.launches[-1][5][:4] == [q(values.data_ptr()), q(words.data_ptr()), q(w.data_ptr()), q(c.data_ptr())]
    w2 = FakeCudaTensor(0x7E00_0010_0000, (64,))
    assert plan.launch(values, words, b, c, w2) == 2 and driver.launches[-1][5][2] == q(w2.data_ptr())
    n = len(driver.launches)
    misaligned = FakeCudaTensor(0x7E00_0020_0004, (64,))  # the workspace: both launches take it
    assert plan.launch(values, words, b, c, misaligned) == 0  # declined at the first launch
    assert len(driver.launches) == n
    misaligned_c = FakeCudaTensor(0x7E00_0030_0004, (64,))  # only the second launch takes C
    assert plan.launch(values, words, b, misaligned_c, w) == 1  # the first made, the second declined
    assert len(driver.launches) == n + 1 and driver.launches[-1][5][3] == q(w.data_ptr())
    assert plan.launch(values, words, b, c, w) == 2  # a decline is this call's only
    driver.results = [0, 700]  # the first launch made, the second failed: one made, the weight then prepared
    with pytest.warns(RuntimeWarning, match="CUresult 700"):
        assert plan.launch(values, words, b, c, w) == 1
    assert plan.launch(values, words, b, c, w) == 0 and plan.records[(values.data_ptr(), words.data_ptr())] is None


def test_views_at_an_offset_are_passed_as_their_arrays_address_plus_the_offset(gpu, monkeypatch):
    """A tail split's reduction writes C's last rows: a launch reading a view of C (or of b, or of
    the workspace) at an offset gets that call's array address plus the view's bytes; a launch that
    reads two different views of one of them is not packed (the prepared launches replay it)."""
    driver = FakeDriver([8, 8, 8, 8, 4])
    monkeypatch.setattr(call_native, "_launcher", nl.RecordLauncher(driver.entry_points()))
    monkeypatch.setattr(call_native, "_capturing", lambda: False)
    monkeypatch.setattr(call_native, "viewed",  # (the fake tensors have no views: one at offset * 4 bytes)
                        lambda a, view: FakeCudaTensor(a.data_ptr() + 4 * view[3], view[1]))
    Ref = call_cache.ArrayRef
    rows = ("float32", (64,), (1,), 64)  # elements 64..127
    weight = (Ref("input", 0, rows), Ref("words"))  # a row block of the weight: fixed per weight
    tail = call_native.NativeLaunch(four[(1,)], (*weight, Ref("input", 2), Ref("scratch", 1, rows), 64),
                                    {"BLOCK": 64}, ("b", "y"), (0, 2))
    reduce = call_native.NativeLaunch(four[(1,)], (*weight, Ref("scratch", 1), Ref("scratch", 0, rows), 64),
                                      {"BLOCK": 64}, ("b", "y"), (2, 1))
    plan = call_native.NativePlan((tail, reduce), ("scratch", 0), ("scratch", 1))
    values, words, b, c = arrays(0x7A00_0000_0000)
    for at in (0x7E00_0000_0000, 0x7E00_0010_0000):  # the workspace and C move between calls
        w, c = FakeCudaTensor(at, (128,)), FakeCudaTensor(at + 0x1000, (128,))
        assert plan.launch(values, words, b, c, w) == 2
        assert driver.launches[-2][5][:4] == [q(values.data_ptr() + 256), q(words.data_ptr()), q(b.data_ptr()),
                                              q(w.data_ptr() + 256)]
        assert driver.launches[-1][5][:4] == [q(values.data_ptr() + 256), q(words.data_ptr()), q(w.data_ptr()),
                                              q(c.data_ptr() + 256)]
    n = len(driver.launches)
    assert plan.launch(values, words, b, c) == 0 and len(driver.launches) == n  # no workspace: address 0, declined
    both = call_native.NativeLaunch(four[(1,)], (*weight, Ref("scratch", 0), Ref("scratch", 0, rows), 64),
                                    {"BLOCK": 64}, ("b", "y"), (1, 1))  # C whole and C's last rows
    n = len(driver.launches)
    assert call_native.NativePlan((both,), ("scratch", 0)).launch(values, words, b, c) == 0
    assert len(driver.launches) == n
