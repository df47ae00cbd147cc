"""fuse_projections_: what a released group's members still owe a CUDA graph that captured a launch of the
fused layer (or of the gated forward's layer over the fused buffers). The release keeps the members' views
(own_rows.graph_replays), and the graph replays the records of those layers: they must stay alive as long as
the members, and an in-place write to a member that syncs its records (``load_state_dict``,
``check_metadata``) must refresh their padded copies too. On the CPU a stand-in record plays the captured one
(tests/gpu/test_torch_fuse_graph_gpu.py captures a real graph)."""

from __future__ import annotations

import gc
import weakref

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch.projection_group import PARTIAL_RUNS_LIMIT, fused_group_of  # noqa: E402
from sparsile.integrations.torch.weight import storage_key, tracked_tensors, weight_versions  # noqa: E402
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)

NAMES = ("q_proj", "k_proj", "v_proj")


class Siblings(torch.nn.Module):
    """q_proj, k_proj, v_proj: SparseLinear layers of 64 input features (32, 16, 16 outputs), with a bias."""

    def __init__(self, seed: int = 0):
        super().__init__()
        for i, (name, n) in enumerate(zip(NAMES, (32, 16, 16))):
            setattr(self, name, spt.SparseLinear.from_dense(linear(n, 64, seed=seed + i)))


class GatedMLP(torch.nn.Module):
    """transformers' LlamaMLP written out (the form glu.py recognizes), sparse, SiLU."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.gate_proj = spt.SparseLinear.from_dense(linear(32, 64, seed=seed + 1))
        self.up_proj = spt.SparseLinear.from_dense(linear(32, 64, seed=seed + 2))
        self.down_proj = spt.SparseLinear.from_dense(linear(64, 32, seed=seed + 3))
        self.act_fn = torch.nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _x(rows: int = 3, seed: int = 5) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


class CapturedRecord:
    """A LaunchRecord that a CUDA graph captured and that reads a padded copy of its weight's values (what
    every replay reads): the parts of it that ``RecordCache.sync`` and ``own_rows.graph_replays`` use."""

    def __init__(self, layer):
        b = layer._buffers
        self.tracked = tracked_tensors(type("W", (), {"values": b["values"].detach(), "meta": b["meta"].detach(),
                                                      "bias": b["bias"].detach(), "scale_w": None})())
        self.versions = weight_versions(self.tracked)
        self.storage = storage_key(b["values"])
        self.copied = (True,) + (False,) * (len(self.tracked) - 1)
        self.captured, self.released, self.key = True, False, ("captured",)
        self.padded = torch.zeros(b["values"].shape[0], b["values"].shape[1] + 16, dtype=b["values"].dtype)
        self.refresh_copies()

    def copies_stale(self, versions) -> bool:
        return any(c and now != then for c, now, then in zip(self.copied, versions, self.versions))

    def refresh_copies(self) -> bool:
        self.padded[:, :self.tracked[0].shape[1]] = self.tracked[0]
        return True

    def weight_written(self, versions) -> None:
        self.versions = versions


def _released(owner, names) -> None:
    """Feed the first member and the others different inputs (cross-attention) until the group is released;
    for the gated MLP, replace up_proj's bias (its gated forward then releases the group)."""
    group = fused_group_of(getattr(owner, names[0]))
    with torch.no_grad():
        if names[0] == "gate_proj":
            up = owner.up_proj
            up._buffers["bias"] = up.bias.clone()
            owner(_x())
        else:
            for step in range(PARTIAL_RUNS_LIMIT + 1):
                getattr(owner, names[0])(_x(1, seed=10 + step))
                if step == 0:
                    for name in names[1:]:
                        getattr(owner, name)(_x(seed=9))
    assert group.fused is None and fused_group_of(getattr(owner, names[0])) is None


@pytest.mark.parametrize("layer", ["fused", "gated"])
@pytest.mark.parametrize("how", ["load_state_dict", "check_metadata"])
def test_a_released_member_s_load_state_dict_refreshes_the_padded_copy_the_graph_replays(layer, how):
    """A CUDA graph captured a launch of the fused layer (or the gated forward's) whose record reads a padded
    copy of the fused values; the group is then released at run time (the views kept: the graph replays the
    fused memory), the fused layer's Python object let go of, and a member's weight loaded anew with
    ``load_state_dict`` (or written in place, then ``check_metadata()``, the documented way to sync records
    after a write). The record must still live (its copies are the memory the graph replays) and its padded
    copy must hold the member's new rows. Before, the released group's fused layer was collected with its
    record cache (the graph replayed freed memory), and a member's sync never reached those records (the
    graph replayed the old weight without a word)."""
    if layer == "fused":
        owner, names = Siblings(), NAMES
        block = owner
    else:
        block = torch.nn.Module()
        block.mlp = owner = GatedMLP()
        names = ("gate_proj", "up_proj")
    spt.fuse_projections_(block)
    group = fused_group_of(getattr(owner, names[0]))
    target = group.fused if layer == "fused" else group.glu.linear
    record = CapturedRecord(target)
    target.__dict__["_records"].retired[id(record)] = record
    cache = weakref.ref(target.__dict__["_records"])
    del group, target
    _released(owner, names)
    gc.collect()
    assert cache() is not None, "the record cache of the fused launch the graph replays was collected"
    member = getattr(owner, names[1])
    assert member.values._is_view()
    new = (Siblings(seed=7).k_proj if layer == "fused" else GatedMLP(seed=7).up_proj)
    if how == "load_state_dict":
        member.load_state_dict(new.state_dict())
    else:
        with torch.no_grad():
            member.values.copy_(new.values)
            member.meta.copy_(new.meta)
        member.check_metadata()
    assert torch.equal(member.to_dense(), new.to_dense())
    start = getattr(owner, names[0]).out_features
    rows = record.padded[start:start + member.out_features, :member.values.shape[1]]
    assert torch.equal(rows, member.values), "the graph's padded copy holds the member's old weight"
    x = _x()
    check_against_float64(member, x, member(x))


def test_a_release_no_graph_replays_keeps_nothing_and_a_copy_drops_what_a_graph_replays():
    """Without a captured record the released group's fused layer is let go of (its memory freed once the
    members own their rows); with one, the members keep it, but a copy of a member (deepcopy, pickle) does
    not: no graph replays the copy's memory."""
    import copy

    block = Siblings()
    spt.fuse_projections_(block)
    fused = weakref.ref(fused_group_of(block.q_proj).fused)
    _released(block, NAMES)
    gc.collect()
    assert fused() is None and all("_replayed" not in getattr(block, name).__dict__ for name in NAMES)

    block = Siblings()
    spt.fuse_projections_(block)
    target = fused_group_of(block.q_proj).fused
    record = CapturedRecord(target)
    target.__dict__["_records"].retired[id(record)] = record
    del target
    _released(block, NAMES)
    assert all(getattr(block, name).__dict__["_replayed"][0].__dict__["_records"].retired for name in NAMES)
    twin = copy.deepcopy(block)
    assert all("_replayed" not in getattr(twin, name).__dict__ for name in NAMES)
    x = _x()
    for name in NAMES:
        check_against_float64(getattr(twin, name), x, getattr(twin, name)(x))
