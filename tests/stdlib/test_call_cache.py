"""stdlib/kernels/call_cache.py: sparse_matmul's call cache. In the interpreter (the cache's
``INTERPRET`` switch on): a call like an earlier one replays its launches with its own arrays and
matches a float64 reference on new random contents; calls that read a padded or cast copy are not
cached; every replay returns a new C; the records hold no arrays. On the GPU (marked gpu): the same
with torch tensors, MetadataBuffers and a CUDA graph."""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from sparsile.driver import recording as R
from sparsile.stdlib.kernels import CompressedWeight, call_cache, prune_and_compress, sparse_matmul
from sparsile.stdlib.sparsity import SparsityError
from sparsile.tests.stdlib.test_gemm_api import problem, reference


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(call_cache, "INTERPRET", True)
    monkeypatch.delenv(call_cache.ENV, raising=False)
    call_cache.clear()
    for k in call_cache.stats:
        monkeypatch.setitem(call_cache.stats, k, 0)
    yield
    call_cache.clear()


def operands(m: int, n: int, k: int, seed: int, dtype: str = "bf16"):
    weight, b = problem(dtype, m, n, k, seed)
    return weight, np.ascontiguousarray(weight.values), np.asarray(weight.meta.data), b


def check(c: np.ndarray, weight, b: np.ndarray) -> None:
    ref, _ = reference(weight, b)
    assert not np.isnan(c.astype(np.float64)).any()
    err = np.abs(c.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err < 2e-3


@pytest.mark.parametrize("m,n,k,options", [(128, 80, 64, {}), (128, 16, 128, {}), (128, 80, 128, {"split_k": 2})],
                         ids=["tiled", "decode", "split-k"])
def test_a_call_like_an_earlier_one_replays_it_on_its_own_arrays(m, n, k, options):
    results = []
    for seed in range(3):
        weight, vals, meta, b = operands(m, n, k, seed)
        c = sparse_matmul(vals, meta, b, interpret=True, **options)
        check(c, weight, b)
        results.append((c, c.copy(), weight, b))
    assert call_cache.stats["recorded"] == 1 and call_cache.stats["hits"] == 2
    # every call returned its own C: a replay does not write an earlier result
    assert len({id(c) for c, *_ in results}) == 3
    for c, kept, weight, b in results:
        assert np.array_equal(c, kept, equal_nan=True)
        check(c, weight, b)


def test_out_is_written_in_place_and_earlier_outs_are_left_alone():
    outs = []
    for seed in range(2):
        weight, vals, meta, b = operands(128, 80, 64, seed)
        out = np.full((128, 80), np.nan, dtype=np.float16)
        assert sparse_matmul(vals, meta, b, out=out, interpret=True) is out
        check(out, weight, b)
        outs.append((out, out.copy()))
    assert call_cache.stats["hits"] == 1
    assert np.array_equal(*outs[0], equal_nan=True)


@pytest.mark.parametrize("k,cast", [(40, False), (64, True)], ids=["padded-K", "cast-b"])
def test_a_call_that_reads_a_padded_or_cast_copy_is_not_cached(k, cast):
    for seed in range(2):
        weight, vals, meta, b = operands(128, 80, k, seed)
        bb = b.astype(np.float32) if cast else b
        c = sparse_matmul(vals, meta, bb, dtype="bf16", interpret=True)
        check(c, weight, b)
    # refused once: the key then takes the full path without recording
    assert call_cache.stats["hits"] == 0 and call_cache.stats["not_cacheable"] == 1
    assert "padded or cast copy" in call_cache.last_refusal


def test_metadata_buffers_of_one_tag_share_a_record_and_each_is_validated():
    """The layers of one shape share a record; a replay gets each buffer's own words, and a buffer
    it has not seen is validated as planning validates it (SP0807 before any launch)."""
    weight, vals, _, b = operands(128, 80, 64, 0)
    check(sparse_matmul(vals, weight.meta, b, interpret=True), weight, b)
    other, vals2, _, b2 = operands(128, 80, 64, 1)  # same shapes, another buffer: the same key
    check(sparse_matmul(vals2, other.meta, b2, interpret=True), other, b2)
    check(sparse_matmul(vals, weight.meta, b, interpret=True), weight, b)
    assert call_cache.stats["hits"] == 2 and call_cache.stats["recorded"] == 1
    bad = dataclasses.replace(other.meta, data=np.zeros_like(np.asarray(other.meta.data)))
    with pytest.raises(SparsityError) as replayed:
        sparse_matmul(vals2, bad, b2, interpret=True)
    call_cache.clear()
    with pytest.raises(SparsityError) as planned:
        sparse_matmul(vals2, bad, b2, interpret=True)
    assert replayed.value.code == planned.value.code == "SP0807"
    assert str(replayed.value) == str(planned.value)
    narrower, vals3, _, b3 = operands(128, 80, 128, 2)  # another K: another key
    check(sparse_matmul(vals3, narrower.meta, b3, interpret=True), narrower, b3)
    assert call_cache.stats["recorded"] == 2


def test_a_replay_holds_a_buffers_words_only_while_the_buffer_lives():
    weight, vals, _, b = operands(128, 80, 64, 0)
    for _ in range(2):
        check(sparse_matmul(vals, weight.meta, b, interpret=True), weight, b)
    (entry,) = call_cache._entries.values()
    assert len(entry.words) == 1
    del weight
    gc.collect()
    assert len(entry.words) == 0


def test_a_call_that_keeps_nothing_is_not_recorded_again():
    """An empty K writes C on the host: never replayed, and not recorded on every call."""
    vals, meta, b = np.zeros((128, 0), np.float32), np.zeros((128, 0), np.int32), np.zeros((80, 0), np.float32)
    for _ in range(2):
        assert not sparse_matmul(vals, meta, b, dtype="bf16", interpret=True).any()
    assert call_cache.stats["not_cacheable"] == 1 and call_cache.last_refusal == "nothing was launched"


def test_records_hold_no_arrays():
    _weight, vals, meta, b = operands(128, 80, 128, 0)
    sparse_matmul(vals, meta, b, split_k=2, interpret=True)
    (entry,) = call_cache._entries.values()
    for _, refs, kwargs in entry.launches:
        for r in (*refs, *(kwargs or {}).values()):
            assert isinstance(r, call_cache.ArrayRef | int | float | str | bool | tuple | type(None)), type(r)
    assert [zero for _, _, zero in entry.scratch] == [False, False]  # C and the split-K workspace


def test_views_into_arguments_and_scratch_are_replayed_at_the_same_place():
    """Row blocks of A, the metadata and C (the tail split's launches) and a reinterpretation of the
    words: a replay reads the same rows of the new arrays and writes the same rows of its new C."""
    from sparsile.stdlib.kernels.arrays import empty_array

    seen = []

    def launcher(*args, **kwargs):
        seen.append(args)
        assert kwargs == {"BN": 16}

    def arrays(seed):
        rng = np.random.default_rng(seed)
        return (rng.standard_normal((8, 8)).astype(np.float32), rng.integers(0, 9, (8, 2)).astype(np.int32),
                rng.standard_normal((4, 8)).astype(np.float32))

    vals, meta, b = arrays(0)
    key = call_cache.call_key(vals, meta, b, None, True, ("views",))
    with R.recording() as rec:
        c = empty_array(None, (8, 4), "float16", True)
        R.record_launch(launcher, (vals[2:5], meta.view(np.uint32)[4:], c[4:], b, 7), {"BN": 16})
    call_cache.remember(key, rec, vals, meta, b, None, c, True)
    vals2, meta2, b2 = arrays(1)
    result = call_cache.replay(key, vals2, meta2, b2, None)
    a, e, cv, bb, seven = seen[-1]
    assert np.array_equal(a, vals2[2:5]) and np.shares_memory(a, vals2)
    assert e.dtype == np.uint32 and np.array_equal(e, meta2.view(np.uint32)[4:]) and np.shares_memory(e, meta2)
    assert result is not c and cv.shape == (4, 4) and cv.ctypes.data == result[4:].ctypes.data
    assert bb is b2 and seven == 7


def test_an_array_outside_the_arguments_memory_is_refused():
    from sparsile.stdlib.kernels.arrays import empty_array

    vals, b = np.ones((8, 8), np.float32), np.ones((4, 8), np.float32)
    meta = np.zeros((8, 2), np.int32)
    key = call_cache.call_key(vals, meta, b, None, True, ("copy",))
    with R.recording() as rec:
        c = empty_array(None, (8, 4), "float16", True)
        R.record_launch(print, (vals.copy(), meta, b, c), {})
    call_cache.remember(key, rec, vals, meta, b, None, c, True)
    assert call_cache.lookup(key) is call_cache.FULL_PATH
    assert call_cache.replay(key, vals, meta, b, None) is call_cache.MISS


def test_planning_environment_and_options_are_part_of_the_key(monkeypatch):
    weight, vals, meta, b = operands(128, 80, 64, 0)
    sparse_matmul(vals, meta, b, interpret=True)
    monkeypatch.setenv("SPARSILE_META_TMA", "0")
    check(sparse_matmul(vals, meta, b, interpret=True), weight, b)
    check(sparse_matmul(vals, meta, b, interpret=True, split_k=2), weight, b)
    assert call_cache.stats["hits"] == 0 and call_cache.stats["recorded"] == 3


def test_an_option_equal_to_a_recorded_one_but_of_another_type_is_planned():
    """split_k=2.0 equals and hashes as 2, but planning refuses it: a call with it after a recorded
    split_k=2 is refused too, not replayed. numpy's 2 is planned on its own key (and taken as 2)."""
    from sparsile.stdlib.sparsity import SparsityError

    weight, vals, meta, b = operands(128, 80, 128, 0)
    sparse_matmul(vals, meta, b, interpret=True, split_k=2)
    with pytest.raises(SparsityError, match="split_k must be an integer"):
        sparse_matmul(vals, meta, b, interpret=True, split_k=2.0)
    assert call_cache.stats["hits"] == 0
    check(sparse_matmul(vals, meta, b, interpret=True, split_k=np.int64(2)), weight, b)
    assert call_cache.stats["hits"] == 0 and call_cache.stats["recorded"] == 2


def test_arrays_of_element_types_with_the_same_type_string_have_their_own_keys():
    """ml_dtypes' float8_e4m3fn and float8_e4m3fnuz share numpy's type string "<V1": the same bits
    as e4m3fnuz are planned (SP0804: no kernel for them), not replayed as e4m3."""
    import ml_dtypes

    from sparsile.stdlib.sparsity import SparsityError

    weight, vals, meta, b = operands(128, 80, 128, 0, "e4m3")
    check(sparse_matmul(vals, meta, b, interpret=True), weight, b)
    fnuz = ml_dtypes.float8_e4m3fnuz
    assert np.dtype(fnuz).str == vals.dtype.str
    with pytest.raises(SparsityError, match="cannot tell the operand type"):
        sparse_matmul(vals.view(fnuz), meta, b.view(fnuz), interpret=True)
    assert call_cache.stats["hits"] == 0


def test_the_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(call_cache.ENV, "0")
    for seed in range(2):
        weight, vals, meta, b = operands(128, 80, 64, seed)
        check(sparse_matmul(vals, meta, b, interpret=True), weight, b)
    assert call_cache.stats == {"hits": 0, "recorded": 0, "not_cacheable": 0}


def test_the_least_recently_used_record_goes_first(monkeypatch):
    monkeypatch.setattr(call_cache, "MAX_ENTRIES", 2)
    calls = {n: operands(128, n, 64, 0)[1:] for n in (80, 96, 112)}
    for n in (80, 96, 80, 112):  # 80 replayed, so 96 is the least recently used when 112 arrives
        sparse_matmul(*calls[n], interpret=True)
    assert len(call_cache._entries) == 2 and call_cache.stats["recorded"] == 3
    sparse_matmul(*calls[80], interpret=True)
    assert call_cache.stats["hits"] == 2 and call_cache.stats["recorded"] == 3
    sparse_matmul(*calls[96], interpret=True)
    assert call_cache.stats["recorded"] == 4




def test_a_full_path_key_in_use_is_not_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(call_cache, "MAX_ENTRIES", 2)
    padded = operands(128, 80, 40, 0)[1:]  # reads a padded copy: full path
    calls = {n: operands(128, n, 64, 0)[1:] for n in (96, 112)}
    for args in (padded, calls[96], padded, calls[112], padded):  # 96 goes when 112 arrives
        sparse_matmul(*args, dtype="bf16", interpret=True)
    assert call_cache.stats["not_cacheable"] == 1 and call_cache.stats["recorded"] == 2

def test_a_key_recorded_again_evicts_no_other_record(monkeypatch):
    """Two threads that miss one key together both record it: the second keeps the cache's size."""
    monkeypatch.setattr(call_cache, "MAX_ENTRIES", 2)
    calls = {n: operands(128, n, 64, 0)[1:] for n in (80, 96)}
    for n in (80, 96):
        sparse_matmul(*calls[n], interpret=True)
    with monkeypatch.context() as m:  # the other thread's miss: its record is not there yet
        m.setattr(call_cache, "replay", lambda *args: call_cache.MISS)
        sparse_matmul(*calls[96], interpret=True)
    assert len(call_cache._entries) == 2
    sparse_matmul(*calls[80], interpret=True)
    assert call_cache.stats["hits"] == 1 and call_cache.stats["recorded"] == 3

def test_a_recording_refuses_launches_it_cannot_replay():
    with R.recording() as rec:
        R.record_launch(object(), (1,), {}, stream=7)
    assert rec.unreplayable == "a launch on an explicit stream"
    with R.recording() as rec:
        R.mark_unreplayable("a prepared launch")
    call_cache.remember(("k",), rec, None, None, None, None, None, True)
    assert call_cache.stats["not_cacheable"] == 1 and call_cache.last_refusal == "a prepared launch"
    assert R.active() is None
    R.record_launch(object(), (), {})  # no recording: nothing happens


def test_scratch_is_noted_only_while_recording():
    from sparsile.stdlib.kernels.arrays import empty_array, zeros_array

    with R.recording() as rec:
        a = empty_array(None, (4,), "float32", True)
        z = zeros_array(None, (3,), "int32", True)
    assert rec.scratch[id(a)] == (a, False) and rec.scratch[id(z)] == (z, True) and not z.any()
    empty_array(None, (4,), "float32", True)
    assert len(rec.scratch) == 2


# ------------------------------------------------------------------------------------------------
# on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(4096, 16, 4096), (6144, 512, 4096), (1024, 1024, 512)],
                         ids=["decode", "prefill", "tiled"])
def test_gpu_replays_match_float64_with_metadata_buffers(m, n, k):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(21)
    w = torch.randn(m, k, generator=g).cuda()
    values, meta = prune_and_compress(w, "bf16")
    dense = torch.from_numpy(CompressedWeight(values, meta).dense().astype(np.float64)).cuda()
    outs = []
    for _ in range(3):
        x = torch.randn(n, k, generator=g).cuda().to(torch.bfloat16)
        y = sparse_matmul(values, meta, x)
        outs.append((y, y.clone(), x))
    torch.cuda.synchronize()
    assert call_cache.stats["hits"] == 2, call_cache.last_refusal
    for y, kept, x in outs:
        assert torch.equal(y, kept)
        ref = dense @ x.double().T
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-3


@pytest.mark.gpu
def test_gpu_a_replay_captured_in_a_cuda_graph():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(22)
    m, n, k = 4096, 16, 4096
    w = torch.randn(m, k, generator=g).cuda()
    values, meta = prune_and_compress(w, "bf16")
    words = torch.from_numpy(np.array(meta.data).view(np.int32)).cuda()
    dense = torch.from_numpy(CompressedWeight(values, meta).dense().astype(np.float64)).cuda()
    x = torch.randn(n, k, generator=g).cuda().to(torch.bfloat16)
    sparse_matmul(values, words, x)  # recorded
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparse_matmul(values, words, x)  # a replay on the side stream before capture (warm-up)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = sparse_matmul(values, words, x)
    assert call_cache.stats["hits"] >= 2
    for _ in range(2):
        x.copy_(torch.randn(n, k, generator=g).cuda().to(torch.bfloat16))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = dense @ x.double().T
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 2e-3
    del graph
    gc.collect()


@pytest.mark.gpu
@pytest.mark.parametrize("words_kind", ["buffer", "raw"])
@pytest.mark.parametrize("m,n,k", [(6144, 16, 4096), (4096, 16, 4096), (1024, 1024, 512), (6144, 1024, 4096)],
                         ids=["decode", "decode-split", "tiled", "tail-split"])
def test_gpu_native_replays_of_layers_sharing_a_key(monkeypatch, words_kind, m, n, k):
    """Replays launch from native code (call_native.py; by default the split-K entry's two launches
    too, and the tail split's three, over row blocks of the weight and C): weights of one shape
    alternate (one native record each), into a
    poisoned out and as returned, and a weight made where a freed one was (its address, likely
    reused) reads its own contents; all against float64."""
    torch = pytest.importorskip("torch")
    from sparsile.stdlib.kernels import call_native

    g = torch.Generator().manual_seed(23)

    def layer():
        values, meta = prune_and_compress(torch.randn(m, k, generator=g).cuda(), "bf16")
        dense = torch.from_numpy(CompressedWeight(values, meta).dense().astype(np.float64)).cuda()
        if words_kind == "raw":
            meta = torch.from_numpy(np.array(meta.data).view(np.int32)).cuda()
        return values, meta, dense

    def checked(values, meta, dense, out=None):
        x = torch.randn(n, k, generator=g).cuda().to(torch.bfloat16)
        if out is not None:
            out.fill_(float("nan"))
        y = sparse_matmul(values, meta, x, out=out)
        assert out is None or y is out
        ref = dense @ x.double().T
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 2e-3

    monkeypatch.delenv(call_native.ENV, raising=False)  # the default: the split-K entry's two launches too
    layers = [layer(), layer()]
    launched = call_native.counts["launched"]
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    for _ in range(3):
        for values, meta, dense in layers:
            checked(values, meta, dense)
            checked(values, meta, dense, out)
    if n <= 64 or (m, n, k) == (6144, 1024, 4096):  # the table's decode entries: one launch (6144 rows), or two
        # through a workspace (4096); its tail-split entry at 6144 x 1024 x 4096 (head, tail, reduction)
        assert call_native.counts["launched"] - launched >= 8, call_cache.last_refusal  # 12 calls, 2 records
    del layers[0]
    gc.collect()
    layers.append(layer())  # perhaps at the freed weight's addresses: a native record made for those
    for values, meta, dense in layers:
        checked(values, meta, dense)
    monkeypatch.setenv(call_native.ENV, "0")
    call_cache.clear()
    launched = call_native.counts["launched"]
    for _ in range(2):
        checked(*layers[0])
    assert call_native.counts["launched"] == launched and call_cache.stats["hits"] >= 1


def test_a_blackwell_call_is_planned_every_time():
    """A Blackwell plan delivers C its own way (plan.result()): its key is remembered as full-path,
    not recorded again, and every call matches float64."""
    for seed in range(2):
        weight, _, _, b = operands(128, 80, 64, seed)
        c = sparse_matmul(weight.values, weight.meta, b, interpret=True, target="sm_100a", num_sms=2)
        check(c, weight, b)
    assert call_cache.stats["hits"] == 0 and call_cache.stats["not_cacheable"] == 1
    assert call_cache.last_refusal == "the call is not kept (an empty K, a Blackwell plan)"


def test_a_torch_tensor_of_another_layout_is_not_keyed(monkeypatch):
    torch = pytest.importorskip("torch")
    sparse = torch.eye(4).to_sparse()
    monkeypatch.setattr(call_cache, "array_kind", lambda x: "torch")  # as a CUDA tensor would be
    assert call_cache._array_signature(sparse, False) is None
    assert call_cache._array_signature(torch.eye(4), False) is not None


def test_torch_keys_name_shape_strides_type_device_and_alignment(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(call_cache, "array_kind", lambda x: "torch")  # as a CUDA tensor would be
    x = torch.zeros(8, 6, dtype=torch.bfloat16)
    sig = call_cache._array_signature(x, False)
    assert sig == ("t", (8, 6), (6, 1), torch.bfloat16, x.get_device(), x.data_ptr() & 15)
    assert call_cache._array_signature(x.T, False) != sig
    assert call_cache._array_signature(x[:, 1:], False)[5] == (x.data_ptr() + 2) & 15
    key = call_cache.call_key(x, x, x, None, False, (None, 2))
    assert hash(key) == hash(tuple(key)) and key == tuple(key)
    assert call_cache.call_key(x, x, x, None, False, (None, [2])) is None  # an unhashable option


# ------------------------------------------------------------------------------------------------
# which replays launch natively (call_native.native_plan), with a stand-in launch and launcher


class _FakeParam:
    def __init__(self, name):
        self.name = name


class _FakeGpuLaunch:
    kernel = type("K", (), {"params": [_FakeParam(n) for n in ("A", "E", "B", "Y", "K")]})()


@pytest.fixture
def native_rules(monkeypatch):
    from sparsile.driver import launch as launch_module
    from sparsile.stdlib.kernels import arrays, call_native

    monkeypatch.setattr(launch_module, "GpuLaunch", _FakeGpuLaunch)
    monkeypatch.setattr(arrays, "array_kind", lambda x: "torch")
    monkeypatch.setattr(call_native, "launcher", lambda: object())
    monkeypatch.setenv(call_native.ENV, "all")
    return call_native


def _plan(call_native, refs, scratch, source, *more_refs):
    """native_plan of launches with arguments ``refs`` (then ``more_refs``: one launch each)."""
    all_refs = (refs, *more_refs)
    launches = tuple((_FakeGpuLaunch(), tuple(range(len(r))), {}) for r in all_refs)
    return call_native.native_plan(launches, all_refs, scratch, source, (object(), object(), object(), None))


def test_a_one_launch_replay_of_values_words_b_and_c_launches_natively(native_rules, monkeypatch):
    Ref = call_cache.ArrayRef
    c_scratch = [((128, 16), "float16", False)]
    refs = (Ref("input", 0), Ref("words"), Ref("input", 2), Ref("scratch", 0), 4096)
    plan = _plan(native_rules, refs, c_scratch, Ref("scratch", 0))
    assert plan is not None and [(nl.names, nl.sources) for nl in plan.launches] == [(("B", "Y"), (0, 1))]
    assert plan.c_at == ("scratch", 0) and plan.w_at is None
    reinterpreted = (Ref("input", 0), Ref("input", 1, ("uint32", (8, 4), (4, 1), 0)), Ref("input", 2),
                     Ref("input", 3), 4096)
    assert _plan(native_rules, reinterpreted, [], Ref("input", 3)).launches[0].names == ("B", "Y")
    monkeypatch.setenv(native_rules.ENV, "0")
    assert _plan(native_rules, refs, c_scratch, Ref("scratch", 0)) is None


def test_a_split_k_replay_launches_natively_through_its_workspace(native_rules, monkeypatch):
    """The decode kernel's split-K partial sums into a workspace, then the reduction into C: b, C
    and the workspace are the per-call sources 0, 1, 2 (b passed twice is b twice)."""
    Ref = call_cache.ArrayRef
    scratch = [((4, 128, 16), "float32", False), ((128, 16), "float16", False)]
    partial = (Ref("input", 0), Ref("words"), Ref("input", 2), Ref("scratch", 0), 4096)
    reduce = (Ref("scratch", 0), Ref("scratch", 1), Ref("input", 2), 4096, 16)
    plan = _plan(native_rules, partial, scratch, Ref("scratch", 1), reduce)
    assert plan.c_at == ("scratch", 1) and plan.w_at == ("scratch", 0)
    assert [(nl.names, nl.sources) for nl in plan.launches] == [(("B", "Y"), (0, 2)), (("A", "E", "B"), (2, 1, 0))]
    into_out = _plan(native_rules, partial, scratch[:1], Ref("input", 3),
                     (Ref("scratch", 0), Ref("input", 3), 4096))
    assert into_out.c_at == ("input", 3) and into_out.w_at == ("scratch", 0)
    monkeypatch.setenv(native_rules.ENV, "1")  # "1": replays of one launch only
    assert _plan(native_rules, partial, scratch, Ref("scratch", 1), reduce) is None
    assert _plan(native_rules, (*partial[:3], Ref("scratch", 0), 4096), scratch[1:], Ref("scratch", 0)) is not None
    monkeypatch.delenv(native_rules.ENV)  # the default: several launches too
    assert len(_plan(native_rules, partial, scratch, Ref("scratch", 1), reduce).launches) == 2


def test_a_tail_split_replay_launches_natively_over_row_blocks(native_rules):
    """A tail split (gemm_tail.py): the head's GEMM into C's first rows, the tail's split-K GEMM over
    row blocks of the weight into the workspace, the reduction into C's last rows. Row blocks of the
    weight are fixed per weight; those of b, C and the workspace become offsets (call_native._offsets)."""
    Ref = call_cache.ArrayRef
    scratch = [((256, 64), "float16", False), ((2, 128, 64), "float32", False)]
    c_head = Ref("scratch", 0, ("float16", (128, 64), (64, 1), 0))
    c_tail = Ref("scratch", 0, ("float16", (128, 64), (64, 1), 128 * 64))
    head = (Ref("input", 0, ("bfloat16", (128, 32), (32, 1), 0)), Ref("words"), Ref("input", 2), c_head, 4096)
    tail = (Ref("input", 0, ("bfloat16", (128, 32), (32, 1), 128 * 32)), Ref("words"), Ref("input", 2),
            Ref("scratch", 1), 4096)
    reduce = (Ref("scratch", 1), c_tail, Ref("input", 2), 4096, 16)
    plan = _plan(native_rules, head, scratch, Ref("scratch", 0), tail, reduce)
    assert plan is not None and plan.c_at == ("scratch", 0) and plan.w_at == ("scratch", 1)
    assert [nl.sources for nl in plan.launches] == [(0, 1), (0, 2), (2, 1, 0)]
    assert _plan(native_rules, head, scratch, Ref("scratch", 0, ("float16", (128, 64), (64, 1), 8192)), tail) is None


@pytest.mark.parametrize("case", ["zeroed C", "zeroed workspace", "third scratch", "out and two scratch",
                                  "C not the result"])
def test_replays_that_launch_natively_only_with_their_own_arrays_and_one_workspace(native_rules, case):
    Ref = call_cache.ArrayRef
    refs = [Ref("input", 0), Ref("words"), Ref("input", 2), Ref("scratch", 0), 4096]
    scratch = [((128, 16), "float16", False)]
    source = Ref("scratch", 0)
    more = ()
    if case == "zeroed C":
        scratch = [((128, 16), "float16", True)]
    elif case == "zeroed workspace":
        scratch.append(((2, 128, 16), "float32", True))
        refs[4] = Ref("scratch", 1)
    elif case == "third scratch":
        scratch += [((2, 128, 16), "float32", False), ((8,), "int32", False)]
        refs[4] = Ref("scratch", 2)
    elif case == "out and two scratch":
        scratch.append(((2, 128, 16), "float32", False))
        refs[3], source = Ref("input", 3), Ref("input", 3)
        more = ((Ref("scratch", 0), Ref("scratch", 1), Ref("input", 3)),)
    else:  # "C not the result"
        refs[3], source = Ref("input", 3), Ref("scratch", 0)
    assert _plan(native_rules, tuple(refs), scratch, source, *more) is None


def test_a_replay_launches_natively_only_with_torch_tensors(native_rules, monkeypatch):
    """A launch reads the call's values and words by ``data_ptr()``: cupy values (or words, or out)
    with a torch b keep to the prepared launch."""
    from sparsile.stdlib.kernels import arrays

    Ref = call_cache.ArrayRef
    refs = (Ref("input", 0), Ref("words"), Ref("input", 2), Ref("input", 3), 4096)
    launch = (_FakeGpuLaunch(), tuple(range(len(refs))), {})
    cupy_like = object()
    monkeypatch.setattr(arrays, "array_kind", lambda x: "cupy" if x is cupy_like else "torch")
    torch_like = object()
    assert native_rules.native_plan((launch,), (refs,), [], Ref("input", 3), (torch_like,) * 4) is not None
    for i in range(4):
        call = [torch_like] * 4
        call[i] = cupy_like
        assert native_rules.native_plan((launch,), (refs,), [], Ref("input", 3), tuple(call)) is None, i


def test_an_out_that_is_b_is_not_replayed_in_place():
    """A record made with a separate out, replayed for out=b (same key: shape, strides, dtype), had
    the kernel write C over the b it was still reading (M = N = K, two M tiles, no split-K)."""
    for alias in (False, True, True):
        weight, vals, meta, b = operands(256, 256, 256, seed=int(alias), dtype="f16")
        out = b if alias else np.full((256, 256), np.nan, np.float16)
        ref_b = b.copy()
        assert sparse_matmul(vals, meta, b, out=out, interpret=True, split_k=1) is out
        check(out, weight, ref_b)


@pytest.mark.parametrize("layout", ["column-slice", "transposed"])
def test_a_non_contiguous_out_is_filled_by_a_copy_on_every_replay(layout):
    """An out the kernel cannot write in place (a column slice of a wider array, a transposed one)
    gets C through the replay's own scratch C and a copy: each call's out matches float64 on its
    own operands, and the memory beside out is left alone."""
    for seed in range(3):
        weight, vals, meta, b = operands(128, 80, 64, seed)
        if layout == "column-slice":
            outer = np.full((128, 88), np.nan, np.float16)
            out = outer[:, 4:84]
        else:
            outer = np.full((80, 128), np.nan, np.float16)
            out = outer.T
        assert sparse_matmul(vals, meta, b, out=out, interpret=True) is out
        check(out, weight, b)
        if layout == "column-slice":
            assert np.isnan(outer[:, :4]).all() and np.isnan(outer[:, 84:]).all()
    assert call_cache.stats["recorded"] == 1 and call_cache.stats["hits"] == 2
