"""The gated activation fused into a Phi-3 MLP (glu.PACKED: one gate_up_proj linear whose rows are
[gate; up], then ``up * activation_fn(gate)`` and down_proj): ``fuse_projections_(glu=True)`` runs its
gate_up_proj as a group of one and installs the gated forward. On the CPU (the interpreter): the
down_proj input against float64 in the kernel (outputs poisoned with NaN first), the fallback above
64 tokens equal to the unfused MLP, the reasons where it does not apply, hooks, ``glu=False``, state
dicts and a torch.compile trace."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import check_glu, down_inputs, linear

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spt = pytest.importorskip("sparsile.torch")
Phi3MLP = pytest.importorskip("transformers.models.phi3.modeling_phi3").Phi3MLP

from sparsile.integrations.torch._kernels import kernel_api  # noqa: E402
from sparsile.integrations.torch.glu import GatedForward  # noqa: E402
from sparsile.integrations.torch.projection_group import fused_group_of  # noqa: E402
from sparsile.stdlib.kernels.linear_args import is_gated  # noqa: E402

HIDDEN, F = 64, 32
KEY = "mlp.gate_up_proj"
OUT_TYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@pytest.fixture
def kernel_calls(monkeypatch):
    """The activation of each call of the stdlib kernel (the interpreter's), each writing into an
    output filled with NaN first."""
    api = kernel_api()
    real = api.sparse_linear
    calls: list[str | None] = []

    def spy(values, meta, x, **kwargs):
        calls.append(kwargs.get("activation"))
        if kwargs.get("out") is None:
            n = values.shape[0] // (2 if is_gated(kwargs.get("activation")) else 1)
            kwargs["out"] = torch.full((x.shape[0], n), float("nan"), dtype=OUT_TYPES[kwargs["out_dtype"]])
        return real(values, meta, x, **kwargs)

    monkeypatch.setattr(api, "sparse_linear", spy)
    return calls


class Block(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp


def phi3_block(hidden_act: str = "silu", intermediate: int = F, seed: int = 0) -> Block:
    """A sparsified Block around transformers' Phi3MLP (bf16, random weights of ``seed``)."""
    config = transformers.Phi3Config(hidden_size=HIDDEN, intermediate_size=intermediate, hidden_act=hidden_act)
    torch.manual_seed(seed)
    block = Block(Phi3MLP(config).to(torch.bfloat16))
    assert "mlp.gate_up_proj" in spt.sparsify_(block, interpret=True, min_features=16).swapped
    return block


@pytest.mark.parametrize("tokens", [1, 5, 64, 65])
def test_phi3_mlp_against_float64(tokens, kernel_calls):
    """Phi3MLP's gate_up_proj rows are [gate; up] (chunk(2) takes gate first): the gated kernel computes
    silu(gate) * up in float32, rounded once, which the float64 reference bounds; above 64 tokens the
    fallback gives the unfused MLP's bits. The state dict keeps its keys and values."""
    block = phi3_block()
    plain = copy.deepcopy(block)
    before = {k: v.clone() for k, v in block.state_dict().items()}
    report = spt.fuse_projections_(block, glu=True)
    assert report.glu == {KEY: "swiglu"} and report.fused == [] and report.no_glu == {} and not report.skipped
    assert str(report) == ("fuse_projections_: 0 projection groups fused, 0 already fused, 0 skipped; gated "
                           "activation fused into 1 MLP (swiglu)")
    assert isinstance(block.mlp.__dict__["forward"].__self__, GatedForward)
    after = block.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    x = torch.randn(1, tokens, HIDDEN).to(torch.bfloat16)
    kernel_calls.clear()
    y, h = down_inputs(block.mlp, x)
    group = fused_group_of(block.mlp.gate_up_proj)
    check_glu(group.fused, x, h, "swiglu", unfused=tokens > 64)
    assert kernel_calls == (["swiglu", None] if tokens <= 64 else [None, None])
    if tokens > 64:
        with torch.no_grad():
            assert torch.equal(y, plain.mlp(x))


def test_repeated_calls_keep_the_group_and_glu_false_restores_the_forward():
    """(The whole Phi-3 model through sparsify_(fuse=True) is in test_torch_architectures.py.) A repeated call
    keeps the group; glu=False gives the MLP its own forward back, reported, and computes the unfused MLP."""
    block = phi3_block()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    again = spt.fuse_projections_(block)
    assert again.kept == [KEY] and again.glu == {KEY: "swiglu"} and again.fused == []
    removed = spt.fuse_projections_(block, glu=False)
    assert removed.glu_removed == [KEY] and "forward" not in block.mlp.__dict__
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(block.mlp(x), plain.mlp(x))
    back = spt.fuse_projections_(block)
    assert back.glu == {KEY: "swiglu"} and "forward" in block.mlp.__dict__


@pytest.mark.parametrize(("hidden_act", "intermediate", "reason"), [
    ("gelu", F, "its activation_fn (GELUActivation) is neither SiLU nor GELU with the tanh approximation"),
    ("relu", F, "its activation_fn (ReLU) is neither SiLU nor GELU with the tanh approximation"),
    ("silu", 24, "gate_up_proj has out_features = 48: its halves (gate, up) are not multiples of 16 rows (the "
                 "metadata's blocks)"),
])
def test_phi3_mlps_the_kernel_cannot_take_keep_their_forward(hidden_act, intermediate, reason):
    block = phi3_block(hidden_act, intermediate)
    report = spt.fuse_projections_(block, glu=True)
    assert report.glu == {} and report.no_glu == {KEY: reason}
    assert "forward" not in block.mlp.__dict__ and fused_group_of(block.mlp.gate_up_proj) is None
    assert f"  no gated activation for {KEY}: {reason}" in str(report)


class OtherPacked(torch.nn.Module):
    """gate_up_proj, activation_fn and down_proj as Phi-3 names them, but up and gate the other way round."""

    def __init__(self):
        super().__init__()
        self.gate_up_proj = linear(2 * F, HIDDEN, bias=False, seed=1)
        self.down_proj = linear(HIDDEN, F, bias=False, seed=2)
        self.activation_fn = torch.nn.SiLU()

    def forward(self, x):
        up, gate = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * self.activation_fn(gate))


def test_another_packed_forward_is_not_fused():
    block = Block(OtherPacked())
    spt.sparsify_(block, interpret=True, min_features=16)
    report = spt.fuse_projections_(block, glu=True)
    assert report.glu == {} and report.no_glu == {KEY: (
        "OtherPacked.forward is not gate, up = gate_up_proj(x).chunk(2, dim=-1); down_proj(up * activation_fn(gate)) "
        "as Phi-3's MLP writes it")}
    assert "forward" not in block.mlp.__dict__


def test_groups_without_gate_up_leave_phi3_alone():
    block = phi3_block()
    report = spt.fuse_projections_(block, [("q_proj", "k_proj", "v_proj")], glu=True)
    assert report.glu == {} and report.no_glu == {} and "forward" not in block.mlp.__dict__


@pytest.mark.parametrize("child", ["gate_up_proj", "activation_fn"])
def test_hooks_on_gate_up_or_activation_run_the_class_forward(child):
    block = phi3_block()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block, glu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    seen = []
    hook = getattr(block.mlp, child).register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    with torch.no_grad():
        assert torch.equal(block.mlp(x), plain.mlp(x))
    assert seen == [(2, 2 * F) if child == "gate_up_proj" else (2, F)]
    hook.remove()
    _, h = down_inputs(block.mlp, x)
    check_glu(fused_group_of(block.mlp.gate_up_proj).fused, x, h)


def test_a_replaced_or_rewritten_gate_up_proj():
    """Weights written in place reach the gated layer; a gate_up_proj replaced by another module runs
    the class forward with it."""
    block = phi3_block()
    other = phi3_block(seed=5)
    spt.fuse_projections_(block, glu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    down_inputs(block.mlp, x)
    block.load_state_dict(other.state_dict())  # (copied into the member's views of the group's buffers)
    _, h = down_inputs(block.mlp, x)
    check_glu(fused_group_of(block.mlp.gate_up_proj).fused, x, h)
    assert torch.equal(fused_group_of(block.mlp.gate_up_proj).fused.to_dense(), other.mlp.gate_up_proj.to_dense())
    block.mlp.gate_up_proj = copy.deepcopy(other.mlp.gate_up_proj)
    block.mlp.down_proj = other.mlp.down_proj
    with torch.no_grad():
        assert torch.equal(block.mlp(x), other.mlp(x))


def test_torch_compile_traces_the_glu_op():
    block = phi3_block()
    spt.fuse_projections_(block, traced=True, glu=True)
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    eager, _ = down_inputs(block.mlp, x)
    ops: list[tuple[str, str | None]] = []

    def backend(gm, example_inputs):
        ops.extend((str(n.target), n.kwargs.get("activation")) for n in gm.graph.nodes
                   if n.op == "call_function" and "sparsile" in str(n.target))
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(block.mlp, backend=backend, fullgraph=True)(x)
    finally:
        torch._dynamo.reset()
    assert [activation for _, activation in ops] == ["swiglu", None]
    assert torch.equal(got, eager)
