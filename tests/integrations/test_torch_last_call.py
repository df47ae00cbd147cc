"""A layer's last eager call (integrations/torch/last_call.py): a call like the last one launches its
record's native launch directly, anything that could change between calls sends it back to the full
path (None, nothing launched), with the stand-ins of record_fakes.py (CPU tensors, a fake libcuda).
The layer's use of it on the H200: tests/gpu/test_torch_native_gpu.py."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch.last_call import LastCall  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.integrations.record_fakes import _weight  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)
from sparsile.tests.integrations.test_torch_native import q  # noqa: E402
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)


def _last(stream: list[int], x: torch.Tensor, w) -> tuple[RecordCache, LastCall]:
    """A cache that ran x once on ``stream[0]`` with weight ``w`` (kept alive by the caller: the
    cache drops the records of a collected weight), and its LastCall (reading the stream from the list)."""
    cache = RecordCache()
    cache.run((x.shape[0],), x.reshape(-1, x.shape[-1]), w, None, torch.float32, stream=stream[0])
    last = LastCall.of(cache, x, lambda: stream[0])
    assert last is not None
    return cache, last


def test_a_call_like_the_last_launches_the_record_directly(fake, monkeypatch):
    stream, w = [11], _weight()
    _, last = _last(stream, torch.randn(4, 32), w)
    monkeypatch.setattr(RecordCache, "run", lambda *a, **k: pytest.fail("the full path ran"))
    x = torch.randn(4, 32)
    y = last(x)
    assert y.shape == (4, 8) and y.dtype == torch.float32 and y.is_contiguous()
    assert fake.launches[-1][4] == 11 and fake.launches[-1][5][:2] == [q(x.data_ptr()), q(y.data_ptr())]
    assert [e[0] for e in fake.log].count("prepared") == 0


def test_leading_dimensions_give_y_of_x_s_shape(fake):
    stream, w = [3], _weight()
    _, last = _last(stream, torch.randn(2, 2, 32), w)
    x = torch.randn(2, 2, 32)
    y = last(x)
    assert y.shape == (2, 2, 8) and y.is_contiguous()
    assert fake.launches[-1][5][:2] == [q(x.data_ptr()), q(y.data_ptr())]


@pytest.mark.parametrize("change", ["shape", "dtype", "device", "stream", "written", "capturing", "unfilled", "strided",
                                    "misaligned", "failed", "cleared", "another call", "negated"])
def test_anything_that_changed_takes_the_full_path(fake, monkeypatch, change):
    """Each change sends the call back (None) before anything is launched or allocated."""
    stream, w = [5], _weight()
    cache, last = _last(stream, torch.randn(4, 32), w)
    x = torch.randn(4, 32)
    if change == "shape":
        x = torch.randn(5, 32)
    elif change == "dtype":
        x = x.double()
    elif change == "device":  # the last call's x was on cuda:1 (a model spread over GPUs): its record is that device's
        last.device = 1
    elif change == "stream":
        stream[0] = 6
    elif change == "written":
        w.values.add_(1.0)  # an in-place write: the full path refreshes or replaces the record
    elif change == "capturing":
        monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    elif change == "unfilled":
        cache.unfilled[0] = next(iter(cache.records.values()))
    elif change == "strided":
        x = torch.randn(32, 4).t()
    elif change == "misaligned":
        x = torch.randn(4 * 32 + 1)[1:].view(4, 32)
    elif change == "failed":  # a failed native launch: the record keeps to its prepared launches
        last.record.native = None
    elif change == "negated":  # a lazy negation (torch._neg_view, z.conj().imag): its memory holds x, not -x
        x = torch._neg_view(x)
    elif change == "cleared":  # (a layer's buffers replaced, moved or loaded; tests switching the native launch)
        cache.clear()
    elif change == "another call":  # through the cache, another token count: the layer's LastCall is replaced
        cache.run((2,), torch.randn(2, 32), w, None, torch.float32, stream=5)
    launched = len(fake.launches)
    assert last(x) is None
    assert len(fake.launches) == launched


def test_a_negated_x_is_launched_with_its_negation_applied(fake, monkeypatch):
    """The full path (``RecordCache.run``) of a torch neg view x (``torch._neg_view(x)``, ``z.conj().imag``)
    launches a copy with the negation applied: the launches read x by address, and the view's memory
    holds the values before the negation (a silent wrong result: y of x instead of -x)."""
    stream, w = [5], _weight()
    cache, _ = _last(stream, torch.randn(4, 32), w)
    seen = []
    call = kernels.LaunchRecord.__call__
    monkeypatch.setattr(kernels.LaunchRecord, "__call__",
                        lambda self, x, *a: seen.append(x.clone()) or call(self, x, *a))
    base = torch.randn(4, 32)
    x = torch._neg_view(base)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert fake.launches[-1][5][0] != q(base.data_ptr())
    assert not seen[0].is_neg() and torch.equal(seen[0], -base)


def test_the_default_stream_is_not_asked_about_a_capture(fake, monkeypatch):
    """CUDA never captures the legacy default stream (handle 0), so a call there skips the capture
    query; any other stream still asks it, and a capture there sends the call back."""
    asked = []
    w = _weight()
    _, last = _last([0], torch.randn(4, 32), w)
    _, other = _last([7], torch.randn(4, 32), w)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: asked.append(1) or True)
    assert last(torch.randn(4, 32)) is not None and asked == []
    assert other(torch.randn(4, 32)) is None and asked == [1]


def test_a_launch_the_native_code_fails_runs_the_rest_through_the_prepared_launches(fake):
    stream, w = [5], _weight()
    _, last = _last(stream, torch.randn(4, 32), w)
    fake.result = 719
    x = torch.randn(4, 32)
    with pytest.warns(RuntimeWarning, match="a native launch failed with CUresult 719"):
        y = last(x)
    assert y is not None and fake.log[-1] == ("prepared", (x.data_ptr(), y.data_ptr()), 5)
    assert last.record.native is None and last(x) is None  # for good: the full path from now on


def test_not_made_for_a_record_without_native_launch_or_for_another_token_count(fake, monkeypatch):
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    assert LastCall.of(cache, x, lambda: 0) is None  # nothing ran yet
    cache.run((4,), x, w, None, torch.float32, stream=1)
    assert LastCall.of(cache, torch.randn(8, 32), lambda: 1) is None
    assert LastCall.of(cache, torch.randn(32, 4).t(), lambda: 1) is None
    next(iter(cache.records.values())).native = None
    assert LastCall.of(cache, x, lambda: 1) is None


def test_the_cache_forgets_its_last_record_with_its_weight(fake):
    """``RecordCache.last`` must not pin a collected weight's memory (the custom op's cache is
    process-wide), nor outlive ``clear``."""
    cache, w = RecordCache(), _weight()
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=1)
    assert cache.last is not None
    cache.clear()
    assert cache.last is None
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=1)
    del w
    gc.collect()
    assert cache.last is None and not cache.records


def test_the_fake_fixture_keeps_graph_replays_off(fake, monkeypatch):
    """Under the fake fixture a last call makes no graph replays (unless a test turns them on with a
    fake graph driver, as test_torch_graph_launch.py does): they would capture the fake native
    launch with the real libcuda and launch that graph on the fake stream handle, which crashes the
    process inside the driver on a GPU machine whose CUDA context a GPU test made current."""
    from sparsile.integrations.torch import graph_launch

    monkeypatch.setattr(graph_launch, "DRIVER", object())  # (libcuda loaded, as on a GPU machine)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 16)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    last = LastCall.of(cache, x, lambda: 11)
    assert last is not None and last.replays is None
