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

from sparsile.integrations.torch.fuse import fused_group_of  # noqa: E402

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
