"""fuse_projections_: in-place writes to the weights of a fused group's members, seen where they must be
and only there. A copied group (``copy.deepcopy``, ``torch.save`` / ``torch.load``) keeps the shared storage
but not the views' shared version counter: its members' buffers are made views of the fused buffers again
when the group is verified, so that a write to one member reaches the fused layer's counters (its backward's
check, a sibling's serving stamp). On the CPU (the interpreter)."""

from __future__ import annotations

import copy
import io

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch.projection_group import fused_group_of  # noqa: E402

NAMES = ("q_proj", "k_proj", "v_proj")


class Siblings(torch.nn.Module):
    """q_proj, k_proj, v_proj: SparseLinear layers of 64 input features (32, 16, 16 outputs), with a bias."""

    def __init__(self, dtype: str | None = None):
        super().__init__()
        for i, (name, n) in enumerate(zip(NAMES, (32, 16, 16))):
            setattr(self, name, spt.SparseLinear.from_dense(linear(n, 64, seed=i), dtype))


def _copied(block: torch.nn.Module, how: str) -> torch.nn.Module:
    if how == "deepcopy":
        return copy.deepcopy(block)
    saved = io.BytesIO()
    torch.save(block, saved)
    saved.seek(0)
    return torch.load(saved, weights_only=False)


def _x(rows: int = 3, seed: int = 5) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _written(layer, buffer: str = "values") -> None:
    """An in-place write that changes ``layer``'s weight (other rows' values under its metadata) or its bias."""
    with torch.no_grad():
        t = getattr(layer, buffer)
        if buffer == "values":
            t.copy_(t.flip(0))
        else:
            t.mul_(2).add_(100)


@pytest.mark.parametrize("how", ["deepcopy", "torch.load"])
def test_a_copied_group_s_backward_refuses_a_member_written_since_its_forward(how):
    """A copy's fused run, then k_proj's values written in place before the backward: the fused layer's
    backward computes x's gradient with its values, k_proj's rows of which are now the new weight, so it
    must refuse (torch's RuntimeError), as the original group's does. Before, the copy's members held tensors
    on the fused storage with version counters of their own: the write moved none of the fused layer's, and
    x got the gradient of the new weight without a word."""
    block = Siblings()
    spt.fuse_projections_(block)
    twin = _copied(block, how)
    group = fused_group_of(twin.q_proj)
    assert group is not None and group is not fused_group_of(block.q_proj)
    x = _x().requires_grad_()
    ys = [getattr(twin, name)(x) for name in NAMES]
    assert group.runs == 1 and group.fused is not None
    _written(twin.k_proj)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.cat(ys, -1).float().sum().backward()


@pytest.mark.parametrize("how", ["deepcopy", "torch.load"])
@pytest.mark.parametrize("buffer", ["values", "bias"])
def test_a_copied_group_s_member_written_between_sibling_calls_is_not_served_the_old_run(how, buffer):
    """After a copy's first run (which verifies it), q_proj starts a fused run, k_proj's weight or bias is
    written in place, then k_proj is called with the same x: its columns of that run are the old weight's, so
    it must run again. Before, the write moved no counter of the fused buffers (the copy's run stamp), and
    k_proj was served the old columns (its bias off by 100 and more)."""
    block = Siblings()
    spt.fuse_projections_(block)
    twin = _copied(block, how)
    group = fused_group_of(twin.q_proj)
    x = _x()
    for name in NAMES:
        getattr(twin, name)(x)
    assert group.runs == 1
    check_against_float64(twin.q_proj, x, twin.q_proj(x))
    _written(twin.k_proj, buffer)
    check_against_float64(twin.k_proj, x, twin.k_proj(x))
    check_against_float64(twin.v_proj, x, twin.v_proj(x))
    assert group.runs == 3


def _released(block: torch.nn.Module) -> None:
    """Feed q_proj and k_proj / v_proj different inputs (cross-attention) until the group is released."""
    from sparsile.integrations.torch.projection_group import PARTIAL_RUNS_LIMIT

    group = fused_group_of(block.q_proj)
    enc = _x(seed=9)
    with torch.no_grad():
        for step in range(PARTIAL_RUNS_LIMIT + 1):
            block.q_proj(_x(1, seed=10 + step))
            if step == 0:
                block.k_proj(enc)
                block.v_proj(enc)
    assert group.fused is None and fused_group_of(block.q_proj) is None


def _grad(layer, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().clone().requires_grad_()
    layer(x).float().sum().backward()
    return x.grad


def test_a_released_member_s_backward_is_not_refused_for_a_sibling_s_write():
    """A group released at run time (its members fed different inputs) leaves each member running on its
    own: q_proj's forward, then k_proj's weight written in place, then q_proj's backward. q_proj's weight did
    not change, so its backward must run (x's gradient of q_proj's weight); a write to q_proj's own weight is
    still refused. Before, the members kept row views of the fused copy, which share one version counter, so
    k_proj's write refused q_proj's backward too."""
    block = Siblings()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    _released(block)
    x = _x().requires_grad_()
    y = block.q_proj(x)
    _written(block.k_proj)
    y.float().sum().backward()
    assert torch.equal(x.grad, _grad(plain.q_proj, x))
    y = block.q_proj(x)
    _written(block.q_proj)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.float().sum().backward()
    _written(plain.k_proj)
    _written(plain.q_proj)
    for name in NAMES:  # every member computes with its own weight as it is now
        check_against_float64(getattr(block, name), x.detach(), getattr(block, name)(x.detach()))
        assert torch.equal(getattr(block, name).to_dense(), getattr(plain, name).to_dense())


def test_a_fused_run_s_backward_after_the_group_is_released_and_a_member_written_uses_the_forward_s_weight():
    """A fused run's outputs (x requiring grad), then the group released and q_proj's weight written in place,
    then the backward. The fused layer's backward computes x's gradient with the fused buffers: it must never
    give the gradient of a weight the forward did not use. Released, the members own their weights, so the
    write does not reach the fused buffers, which keep the forward's weight: the gradient is that of the same
    fused run without the write (a copy of the group), bit for bit. Before, the members' views shared the
    fused buffers, and the backward refused (rightly: the write was in them)."""
    block = Siblings()
    spt.fuse_projections_(block)
    twin = copy.deepcopy(block)
    x = _x().requires_grad_()
    ys = [getattr(block, name)(x) for name in NAMES]
    _released(block)
    _written(block.q_proj)
    torch.cat(ys, -1).float().sum().backward()
    x2 = x.detach().clone().requires_grad_()
    torch.cat([getattr(twin, name)(x2) for name in NAMES], -1).float().sum().backward()
    assert fused_group_of(twin.q_proj).runs == 1
    assert torch.equal(x.grad, x2.grad)


class GatedMLP(torch.nn.Module):
    """transformers' LlamaMLP written out (its forward is the form glu.py recognizes), sparse, SiLU."""

    def __init__(self):
        super().__init__()
        self.gate_proj = spt.SparseLinear.from_dense(linear(32, 64, seed=1))
        self.up_proj = spt.SparseLinear.from_dense(linear(32, 64, seed=2))
        self.down_proj = spt.SparseLinear.from_dense(linear(64, 32, seed=3))
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


def test_a_gated_mlp_released_at_run_time_leaves_its_members_their_own_weights():
    """The gated forward (glu=True) releases its group when a member's buffer was replaced (up_proj's bias
    here): gate_proj and up_proj then run on their own, and a write to up_proj's weight must not refuse
    gate_proj's backward. Before, they kept views of the fused weight, one version counter."""
    block = torch.nn.Module()
    block.mlp = GatedMLP()
    plain = copy.deepcopy(block)
    assert spt.fuse_projections_(block).glu == {"mlp.gate_proj+up_proj": "swiglu"}
    up = block.mlp.up_proj
    up._buffers["bias"] = up.bias.clone()  # (bypasses __setattr__: seen by the next forward)
    with torch.no_grad():
        assert torch.equal(block.mlp(_x()), plain.mlp(_x()))
    assert fused_group_of(block.mlp.gate_proj) is None
    x = _x().requires_grad_()
    y = block.mlp.gate_proj(x)
    _written(up)
    y.float().sum().backward()
    assert torch.equal(x.grad, _grad(plain.mlp.gate_proj, x))


def test_a_release_inside_a_capture_keeps_the_views_and_a_trainable_bias_stays_the_optimizer_s(monkeypatch):
    """What a run-time release does not copy: inside a CUDA-graph capture nothing (the copy would be recorded
    into the graph, not made: the members would read unfilled memory until a replay), so the members keep
    their views (the shared counter refuses too much, never too little); a bias made trainable, which an
    optimizer may hold, stays the tensor it is (and releases the group at its next run). (The capture faked
    on the CPU.)"""
    from sparsile.integrations.torch import own_rows

    block = Siblings()
    spt.fuse_projections_(block)
    monkeypatch.setattr(own_rows, "capturing", lambda: True)
    _released(block)
    assert all(getattr(block, name).values._is_view() for name in NAMES)
    monkeypatch.setattr(own_rows, "capturing", lambda: False)

    block = Siblings()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    bias = block.k_proj.bias.requires_grad_()
    optimizer = torch.optim.SGD([bias], lr=0.5)
    x = _x()
    block.q_proj(x)  # (not intact: released, the members given their rows)
    assert fused_group_of(block.q_proj) is None
    assert block.k_proj.bias is bias and bias._is_view() and not block.k_proj.values._is_view()
    block.k_proj(x).float().sum().backward()
    optimizer.step()
    with torch.no_grad():
        plain.k_proj.bias.sub_(0.5 * bias.grad)
    check_against_float64(block.k_proj, x, block.k_proj(x))
    assert torch.equal(block.k_proj.bias, plain.k_proj.bias)


def _clones_failing_at(monkeypatch, n: int) -> list:
    """The n-th tensor clone of a run-time release's own_rows raises the device's out of memory (the clones
    before it are made); returns the tensors own_rows cloned or tried to."""
    from sparsile.integrations.torch import own_rows, projection_group

    real_own, real_clone, tried = own_rows.own_rows, torch.Tensor.clone, []

    def clone(t, *args, **kwargs):
        tried.append(t)
        if len(tried) == n:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_clone(t, *args, **kwargs)

    def failing_own_rows(*args):
        with monkeypatch.context() as patch:
            patch.setattr(torch.Tensor, "clone", clone)
            return real_own(*args)

    monkeypatch.setattr(projection_group, "own_rows", failing_own_rows)
    return tried


def _poisoned(layer, x: torch.Tensor) -> torch.Tensor:
    """layer(x) with freed memory poisoned with NaN first (an output left unwritten would show)."""
    torch.empty(4096).fill_(float("nan"))
    return layer(x)


def _fused_run(block: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """x requiring grad and the fused run's outputs of every member, concatenated (backward pending)."""
    x = _x(seed=7).requires_grad_()
    ys = [getattr(block, name)(x) for name in NAMES]
    assert fused_group_of(block.q_proj).runs == 1
    return x, torch.cat(ys, -1).float().sum()


def _all_right(block: torch.nn.Module, plain: torch.nn.Module) -> None:
    """Every member computes with its weight as it is now (plain: the same writes, never fused)."""
    for name in NAMES:
        x = _x(seed=11)
        check_against_float64(getattr(block, name), x, _poisoned(getattr(block, name), x))
        assert torch.equal(getattr(block, name).to_dense(), getattr(plain, name).to_dense())
        assert torch.equal(getattr(block, name).bias, getattr(plain, name).bias)


def test_a_release_out_of_memory_keeps_the_views_and_no_write_goes_unnoticed(monkeypatch):
    """A run-time release whose first copy finds the device out of memory: every member keeps its views of
    the fused copy (one version counter), runs right on its own, and a write to a sibling refuses what it
    must: a fused run's pending backward, and a member's own backward (too much, never too little)."""
    block = Siblings()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    x, loss = _fused_run(block)
    tried = _clones_failing_at(monkeypatch, 1)
    _released(block)
    assert len(tried) == 1
    assert all(getattr(block, name).values._is_view() and getattr(block, name).bias._is_view() for name in NAMES)
    _all_right(block, plain)

    y = block.q_proj(x)
    _written(block.k_proj)
    _written(plain.k_proj)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.float().sum().backward()
    _all_right(block, plain)
    _written(block.v_proj, "bias")
    _written(plain.v_proj, "bias")
    _all_right(block, plain)


def test_a_release_out_of_memory_midway_leaves_the_members_copied_before_their_own_rows_and_the_rest_views(monkeypatch):
    """The copy runs out of memory at k_proj's second buffer: q_proj (copied before) owns its rows, k_proj
    (none of its buffers, not its values either: one counter for all of them) and v_proj keep their views.
    A write to q_proj then does not reach the fused run's pending backward (its gradient is the unwritten
    run's, bit for bit); a write to k_proj does (refused). Each member runs right after each write."""
    block = Siblings()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    twin = copy.deepcopy(block)
    x, loss = _fused_run(block)
    copied = sum(t is not None for t in (block.q_proj.values, block.q_proj.meta, block.q_proj.bias,
                                         block.q_proj.scale_w))
    tried = _clones_failing_at(monkeypatch, copied + 2)
    _released(block)
    assert len(tried) == copied + 2 and tried[copied] is block.k_proj.values
    assert not block.q_proj.values._is_view() and not block.q_proj.bias._is_view()
    assert all(getattr(block, name).values._is_view() and getattr(block, name).meta._is_view()
               and getattr(block, name).bias._is_view() for name in ("k_proj", "v_proj"))
    _all_right(block, plain)

    _written(block.q_proj)
    _written(plain.q_proj)
    loss.backward(retain_graph=True)
    x2, loss2 = _fused_run(twin)
    loss2.backward()
    assert torch.equal(x.grad, x2.grad)
    _all_right(block, plain)

    y = block.q_proj(x)
    _written(block.k_proj)
    _written(plain.k_proj)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    x.grad = None
    y.float().sum().backward()  # (q_proj owns its rows: k_proj's write is not q_proj's)
    assert torch.equal(x.grad, _grad(plain.q_proj, x))
    _all_right(block, plain)


@pytest.mark.parametrize("layer", ["fused", "gated"])
def test_a_release_keeps_the_views_where_a_cuda_graph_captured_the_fused_run(layer):
    """A CUDA graph captured a launch of the fused layer (or of the gated forward's layer over the fused
    buffers): it replays the fused buffers' memory, so a later in-place write to a member (load_state_dict,
    an edit of its weight) must still reach that memory, as it did while the group was fused. A release at
    run time then keeps the members' views (a sibling's write refuses a backward: too much, never too
    little). Before, the members were given copies: the write went to the copy, and every replay of the
    graph computed with the old weight without a word. (The captured record stands in on the CPU;
    tests/gpu/test_torch_fuse_graph_gpu.py captures a real graph.)"""
    import types

    if layer == "fused":
        block = Siblings()
        names, released = NAMES, _released
    else:
        block = torch.nn.Module()
        block.mlp = GatedMLP()
        names = ("gate_proj", "up_proj")

        def released(block):
            up = block.mlp.up_proj
            up._buffers["bias"] = up.bias.clone()  # (a replaced buffer: the gated forward releases the group)
            with torch.no_grad():
                block.mlp(_x())

    owner = block if layer == "fused" else block.mlp
    spt.fuse_projections_(block)
    group = fused_group_of(getattr(owner, names[0]))
    captured = types.SimpleNamespace(captured=True)  # (a LaunchRecord a graph captured, retired meanwhile)
    target = group.fused if layer == "fused" else group.glu.linear
    target.__dict__["_records"].retired[id(captured)] = captured
    fused_values = group.fused.values
    released(block)
    assert fused_group_of(getattr(owner, names[0])) is None
    member = getattr(owner, names[1])
    assert member.values._is_view()
    _written(member)
    start = getattr(owner, names[0]).out_features
    assert torch.equal(fused_values[start:start + member.out_features], member.values)  # what the graph replays
    x = _x()
    check_against_float64(member, x, _poisoned(member, x))


def test_a_release_waits_for_the_device_before_it_frees_the_fused_memory(monkeypatch):
    """A run-time release waits for the devices that hold the fused buffers (own_rows.quiesce) before the
    members get their copies: once they own copies the fused memory is freed, and the caching allocator may
    hand it out again on its allocation stream under a fused run still in flight on another stream."""
    from sparsile.integrations.torch import own_rows

    block = Siblings()
    spt.fuse_projections_(block)
    group = fused_group_of(block.q_proj)
    fused_values = group.fused.values
    seen: list[tuple[int, bool]] = []

    def quiesce(tensors) -> None:
        tensors = list(tensors)
        seen.append((sum(t is fused_values for t in tensors), all(
            getattr(block, name).values.untyped_storage().data_ptr() == fused_values.untyped_storage().data_ptr()
            for name in NAMES)))

    monkeypatch.setattr(own_rows, "quiesce", quiesce)
    _released(block)
    assert seen == [(1, True)]  # once, given the fused buffers, while every member still held its view
    assert all(getattr(block, name).values.untyped_storage().data_ptr() != fused_values.untyped_storage().data_ptr()
               for name in NAMES)  # (then copied)


def test_quiesce_synchronizes_each_cuda_device_once(monkeypatch):
    """quiesce: one torch.cuda.synchronize per CUDA device among the tensors (None and CPU tensors skipped)."""
    from types import SimpleNamespace

    from sparsile.integrations.torch import own_rows

    synced: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    tensors = [SimpleNamespace(is_cuda=True, device=cuda1), None, torch.zeros(2),
               SimpleNamespace(is_cuda=True, device=cuda0), SimpleNamespace(is_cuda=True, device=cuda1)]
    own_rows.quiesce(tensors)
    assert synced == [cuda0, cuda1]
    synced.clear()
    own_rows.quiesce([torch.zeros(2), None])
    assert synced == []


def test_a_group_released_by_another_thread_is_not_intact():
    """intact() of a group whose fused layer another thread released between a member's read of it and the
    check (group.fused is None by then) answers False, where it raised AttributeError on the fused layer's
    out_dtype."""
    block = Siblings()
    spt.fuse_projections_(block)
    group = fused_group_of(block.q_proj)
    group.invalidate()  # (the unchecked branch, which reads the fused layer)
    group.fused = None
    assert group.intact() is False
