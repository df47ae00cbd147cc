"""fuse_projections_ of a model made, fused or copied under ``torch.inference_mode()``: inference tensors keep
no version counter, so a fused group whose buffers were inference tensors could not see an in-place write to a
member's weight between two sibling calls of the same x, and served the sibling columns of the old weight. The
fused buffers are made normal tensors (their views count writes, in inference mode too); a copy whose fused
buffers are inference tensors runs unfused. On the CPU (the interpreter)."""

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

    def __init__(self, seed: int = 0):
        super().__init__()
        for i, (name, n) in enumerate(zip(NAMES, (32, 16, 16))):
            setattr(self, name, spt.SparseLinear.from_dense(linear(n, 64, seed=seed + i)))


def _x(rows: int = 3, seed: int = 5) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _write(layer, buffer: str, other) -> None:
    """``layer``'s ``buffer`` written in place with ``other``'s (values: with its metadata too), in inference
    mode (an inference tensor cannot be written outside it)."""
    with torch.inference_mode():
        getattr(layer, buffer).copy_(getattr(other, buffer))
        if buffer == "values":
            layer.meta.copy_(other.meta)


def _made(how: str) -> torch.nn.Module:
    """A fused Siblings made under inference_mode: built and fused there, built there and fused outside, or
    fused outside and then copied there (deepcopy, torch.save / torch.load)."""
    if how in ("built and fused", "built"):
        with torch.inference_mode():
            block = Siblings()
            if how == "built and fused":
                spt.fuse_projections_(block)
        if how == "built":
            spt.fuse_projections_(block)
        return block
    block = Siblings()
    spt.fuse_projections_(block)
    with torch.inference_mode():
        if how == "deepcopy":
            return copy.deepcopy(block)
        saved = io.BytesIO()
        torch.save(block, saved)
        saved.seek(0)
        return torch.load(saved, weights_only=False)


@pytest.mark.parametrize("how", ["built and fused", "built", "deepcopy", "torch.load"])
@pytest.mark.parametrize("buffer", ["values", "bias"])
def test_a_member_written_between_sibling_calls_in_inference_mode_is_not_served_the_old_weight(how, buffer):
    """Inside inference_mode: q_proj(x) starts a fused run, k_proj's weight (or bias) is written in place, then
    k_proj(x) with the same x must compute with the new weight (float64 of k_proj as it is now), and v_proj
    still with its own. Before, the fused buffers of a model fused (or copied) under inference_mode were
    inference tensors: the run stamp read no version counter (-1), and k_proj was served its columns of
    the run from before the write without a word."""
    block = _made(how)
    other = Siblings(seed=7).k_proj
    x = _x()
    with torch.inference_mode():
        block.q_proj(x)  # (a first run verifies a copy)
        block.k_proj(x)
        block.v_proj(x)
        q = block.q_proj(x)
        _write(block.k_proj, buffer, other)
        torch.empty(4096).fill_(float("nan"))
        k = block.k_proj(x)
        v = block.v_proj(x)
    assert torch.equal(getattr(block.k_proj, buffer), getattr(other, buffer))
    for name, y in zip(NAMES, (q, k, v)):
        check_against_float64(getattr(block, name), x, y)


@pytest.mark.parametrize("how", ["built and fused", "built"])
def test_a_group_fused_in_inference_mode_still_serves_its_siblings_once_per_x(how):
    """Made normal tensors, the fused buffers still serve: one fused run per x for the three members, in and
    out of inference_mode, each output right against float64."""
    block = _made(how)
    group = fused_group_of(block.q_proj)
    assert group is not None and not group.fused.values.is_inference()
    assert all(getattr(block, name).values._base is group.fused.values for name in NAMES)
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            x = _x(seed=11)
            ys = [getattr(block, name)(x) for name in NAMES]
        for name, y in zip(NAMES, ys):
            check_against_float64(getattr(block, name), x, y)
    assert group.runs == 2
