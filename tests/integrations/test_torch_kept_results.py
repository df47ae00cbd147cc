"""Results a sparse layer keeps between calls, served again only while what they were computed from is
unchanged (review49b, on the CPU: the kernel in the interpreter):

* a fused projection group's pending run (projection_group.py), served to the siblings of the member that started
  it: a sibling called with the same x object whose memory was swapped by ``x.data = t`` (no version
  bump), or a member whose buffer was given other memory by ``member.bias.data = t`` (the layer's own
  check of "A buffer replaced behind the layer's back", docs/torch.md), was served the columns of the
  run made before the swap: another input's outputs (of another shape), or the old bias's; and a
  sibling called inside a CUDA-graph capture was served a run from before it (no launch in its graph);
* the activation a layer's backward differentiates (autograd.py): the one the forward applied, not
  the layer's attribute at backward time (set in between, the gradient was that of another function).

Each test failed before its fix."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch.projection_group import fused_group_of  # noqa: E402


class Siblings(torch.nn.Module):
    """q_proj, k_proj and v_proj of 32, 16 and 16 output features over 64 inputs (bf16, a bias each)."""

    def __init__(self):
        super().__init__()
        for i, (name, n) in enumerate((("q_proj", 32), ("k_proj", 16), ("v_proj", 16))):
            setattr(self, name, spt.SparseLinear.from_dense(linear(n, 64, seed=i)))


def _fused() -> tuple[Siblings, object]:
    block = Siblings()
    assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
    return block, fused_group_of(block.q_proj)


def _x(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("rows", [5, 3])
def test_a_sibling_s_x_given_other_memory_is_not_served_the_old_run(rows):
    """``x.data = t`` between sibling calls keeps x's object and version counter: the sibling was
    served the run of x's old memory (rows=3: outputs of 5 rows for an x of 3)."""
    block, group = _fused()
    x = _x(5, 1)
    check_against_float64(block.q_proj, x, block.q_proj(x))
    assert group.pending is not None
    x.data = _x(rows, 2)
    check_against_float64(block.k_proj, x, block.k_proj(x))
    check_against_float64(block.v_proj, x, block.v_proj(x))
    check_against_float64(block.q_proj, x, block.q_proj(x))


def test_a_sibling_s_x_narrowed_in_place_through_data_is_not_served_the_old_run():
    """``x.data = x.data[:3]``: the same address, another shape."""
    block, group = _fused()
    x = _x(5, 3)
    block.q_proj(x)
    assert group.pending is not None
    x.data = x.data[:3]
    check_against_float64(block.k_proj, x, block.k_proj(x))


@pytest.mark.parametrize("buffer", ["values", "bias"])
def test_a_member_given_other_memory_between_sibling_calls_runs_with_it(buffer):
    """``k_proj.<buffer>.data = t`` after q_proj started the fused run: k_proj computes with t (it was
    served its columns of the run, made with the old tensor; 200 off for the bias)."""
    block, group = _fused()
    plain = copy.deepcopy(block)
    x = _x(4, 4)
    block.q_proj(x)
    assert group.pending is not None  # (k_proj and v_proj are owed their columns of this run)
    old = getattr(block.k_proj, buffer)
    new = old.detach().flip(0).clone() if buffer == "values" else old.detach() * 2 + 100
    getattr(block.k_proj, buffer).data = new.clone()
    getattr(plain.k_proj, buffer).data = new.clone()
    k = block.k_proj(x)
    check_against_float64(block.k_proj, x, k)
    assert torch.equal(k, plain.k_proj(x))
    for name in ("v_proj", "q_proj"):  # (the group gave up: each runs on its own, as it should)
        check_against_float64(getattr(block, name), x, getattr(block, name)(x))


@pytest.mark.parametrize(("forward", "backward"), [("relu", None), (None, "silu"), ("gelu_tanh", "relu")])
def test_the_backward_differentiates_the_activation_the_forward_applied(forward, backward):
    """The layer's activation set between forward and backward: x's gradient is still that of the
    forward's function (the backward read the attribute anew: relu's gradient without its mask, 0.87
    off here, or silu's for an identity)."""
    from sparsile.tests.integrations.test_torch_autograd import ACTS

    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=5), activation=forward)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 32, generator=gen).to(torch.bfloat16).requires_grad_()
    g = torch.randn(2, 4, 16, generator=gen)
    y = layer(x)
    layer.activation = backward
    y.float().mul(g).sum().backward()
    xr = x.detach().double().requires_grad_()
    pre = xr @ layer.to_dense().double().T + layer.bias.double()
    (ref,) = torch.autograd.grad(ACTS[forward](pre.reshape(8, 16)).mul(g.double().reshape(8, 16)).sum(), xr)
    err = (x.grad.double() - ref).abs().max().item()
    assert err <= 0.05 * ref.abs().max().item(), (err, ref.abs().max().item())


def test_a_sibling_called_inside_a_cuda_graph_capture_is_not_served_a_run_from_outside_it(monkeypatch):
    """A run started outside a capture, a sibling called inside one (a warm-up that left siblings owed,
    then ``torch.cuda.graph``): served, the graph would hold no launch for its columns, and each replay
    would hand back the warm-up's numbers. The capture is faked (``_kernels._IS_CAPTURING``): the
    sibling must start a run of its own. (The same for a sibling called on another CUDA stream, whose
    columns were computed on the first one: tests/gpu/test_torch_kept_launches_gpu.py.)"""
    from sparsile.integrations.torch import _kernels as kernels

    block, group = _fused()
    x = _x(4, 8)
    block.q_proj(x)
    assert group.pending is not None and group.runs == 1
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    check_against_float64(block.k_proj, x, block.k_proj(x))
    assert group.runs == 2
