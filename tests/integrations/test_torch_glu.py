"""SwiGLU fused into the sparse gated MLP (integrations/torch/glu.py) on the CPU (the interpreter):
``torch.ops.sparsile.sparse_linear(activation="swiglu")`` against float64 in the kernel (T <= 64)
and through the fallback (T > 64: the unfused MLP's bits), its fake shapes and diagnostics; ``fuse_projections_``
on Llama-style MLPs (a tiny one of our own, transformers' LlamaMLP and a tiny Llama when
transformers is importable): the down_proj input against float64, parents that must keep their
forward, state dicts, release, copies and pickling, hooks, ``swiglu=False``, torch.compile."""

from __future__ import annotations

import copy
import io
import pickle

import pytest

from sparsile.tests.integrations.torch_helpers import check_swiglu, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.errors import IntegrationError  # noqa: E402
from sparsile.integrations.torch._kernels import kernel_api  # noqa: E402
from sparsile.integrations.torch.fuse import fused_group_of  # noqa: E402
from sparsile.integrations.torch.glu import SwigluForward, is_silu  # noqa: E402

HIDDEN, F = 64, 32  # the MLP's in_features and intermediate size (F: a multiple of 16)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The (activation, out_dtype) of each call of the stdlib kernel (the interpreter's)."""
    api = kernel_api()
    real = api.sparse_linear
    calls: list[tuple[str | None, str]] = []

    def spy(*args, **kwargs):
        calls.append((kwargs.get("activation"), kwargs.get("out_dtype")))
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "sparse_linear", spy)
    return calls


def gate_up(dtype=None, bias: bool = True, seed: int = 0):
    """A SparseLinear of 2F rows: the row concatenation [gate; up] the op takes."""
    return spt.SparseLinear.from_dense(linear(2 * F, HIDDEN, bias=bias, seed=seed), dtype)


# ------------------------------------------------------------------------------------------------
# the op


@pytest.mark.parametrize("tokens", [1, 5, 64, 65])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_op_swiglu_against_float64(tokens, x_dtype, bias, kernel_calls):
    """In the kernel up to 64 tokens (one call, activation "swiglu"), above through the
    pre-activations in x's type (one call, no activation) and torch's silu and product: the bits
    of the unfused MLP."""
    layer = gate_up("f16" if x_dtype == torch.float16 else "bf16", bias)
    x = torch.randn(tokens, HIDDEN).to(x_dtype)
    y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation="swiglu")
    check_swiglu(layer, x, y, unfused=tokens > 64)
    name = {torch.bfloat16: "bf16", torch.float16: "f16"}[x_dtype]
    assert kernel_calls == ([("swiglu", name)] if tokens <= 64 else [(None, name)])
    if tokens > 64:
        z = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias)
        assert torch.equal(y, torch.nn.functional.silu(z[:, :F]) * z[:, F:])


def test_op_swiglu_leading_dims_out_dtype_and_e4m3(kernel_calls):
    layer = gate_up()
    x = torch.randn(2, 3, HIDDEN).to(torch.bfloat16)
    y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation="swiglu",
                                         out_dtype=torch.float32)
    check_swiglu(layer, x, y, torch.float32)
    fp8 = gate_up("e4m3", seed=3)
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    y = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx, fp8.scale_w, activation="swiglu")
    assert y.dtype == torch.bfloat16
    check_swiglu(fp8, x, y)
    assert kernel_calls == [("swiglu", "f32"), ("swiglu", "bf16")]


def test_op_swiglu_no_tokens_and_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = gate_up()
    empty = torch.ops.sparsile.sparse_linear(torch.empty(0, HIDDEN, dtype=torch.bfloat16), layer.values, layer.meta,
                                             layer.bias, activation="swiglu")
    assert empty.shape == (0, F) and empty.dtype == torch.bfloat16
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        for lead in [(), (3,), (3, 1), (70,)]:
            x = torch.empty(*lead, HIDDEN, dtype=torch.bfloat16)
            y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation="swiglu",
                                                 out_dtype=torch.float16)
            assert y.shape == (*lead, F) and y.dtype == torch.float16 and mode.is_our_fake(y)


def test_opcheck_swiglu():
    layer = gate_up()
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.sparsile.sparse_linear.default, (x, layer.values, layer.meta, layer.bias),
                          {"activation": "swiglu"})


@pytest.mark.parametrize("rows", [48, 40, 17])
def test_op_swiglu_needs_two_halves_of_a_multiple_of_16_rows(rows):
    layer = spt.SparseLinear.from_dense(linear(rows, HIDDEN))
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    with pytest.raises(IntegrationError) as err:
        torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation="swiglu")
    assert err.value.code == "SP0906"
    assert err.value.message == ("sparsile.sparse_linear: activation 'swiglu' takes values of 2F rows [gate; up] "
                                 f"with F a multiple of 16, got {rows} rows")


def test_a_layer_refuses_swiglu_as_its_own_activation():
    with pytest.raises(IntegrationError) as err:
        spt.SparseLinear(HIDDEN, F, activation="swiglu")
    assert err.value.code == "SP0904" and "fuse_projections_" in err.value.help
    assert "silu(gate) by up" in err.value.message
    layer = spt.SparseLinear.from_dense(linear(F, HIDDEN))
    with pytest.raises(IntegrationError) as err:
        layer.activation = "swiglu"
    assert err.value.code == "SP0904" and layer.activation is None
    with pytest.raises(IntegrationError) as err:  # the op's help lists swiglu, a layer's does not
        torch.ops.sparsile.sparse_linear(torch.randn(1, HIDDEN).to(torch.bfloat16), layer.values, layer.meta,
                                         activation="swish")
    assert err.value.help == "use None, 'relu', 'silu', 'gelu_tanh' or 'swiglu'"
    with pytest.raises(IntegrationError) as err:
        spt.SparseLinear(HIDDEN, F, activation="swish")
    assert err.value.help == "use None, 'relu', 'silu' or 'gelu_tanh'"


# ------------------------------------------------------------------------------------------------
# the MLP


class LlamaLikeMLP(torch.nn.Module):
    """transformers' LlamaMLP, written out (its forward's bytecode is the reference form)."""

    def __init__(self, act=None, seed: int = 0, bias: bool = True, hidden: int = HIDDEN, f: int = F,
                 device: str = "cpu"):
        super().__init__()
        self.gate_proj = linear(f, hidden, seed=seed, bias=bias, device=device)
        self.up_proj = linear(f, hidden, seed=seed + 1, bias=bias, device=device)
        self.down_proj = linear(hidden, f, seed=seed + 2, bias=bias, device=device)
        self.act_fn = act if act is not None else torch.nn.SiLU()

    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class PlainMLP(LlamaLikeMLP):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class SwappedMLP(LlamaLikeMLP):
    def forward(self, x):
        down_proj = self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))
        return down_proj


class NoDownMLP(LlamaLikeMLP):
    def __init__(self):
        super().__init__()
        self.out_proj = self.down_proj
        del self.down_proj

    def forward(self, x):
        return self.out_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class SiLUByHand(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class Block(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp


KEY = "mlp.gate_proj+up_proj"


def sparse_block(mlp=None, dtype=None):
    block = Block(mlp if mlp is not None else LlamaLikeMLP())
    report = spt.sparsify_(block, dtype=dtype, interpret=True, min_features=16)
    assert len(report.swapped) == 3
    return block


def down_inputs(mlp, x):
    """(y, the input of down_proj) of ``mlp(x)``."""
    seen = []
    hook = mlp.down_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            y = mlp(x)
    finally:
        hook.remove()
    assert len(seen) == 1
    return y, seen[0]


def fused_gate_up(mlp):
    return fused_group_of(mlp.gate_proj).fused


@pytest.mark.parametrize("tokens", [1, 5, 64, 65])
@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_fused_mlp_against_float64(tokens, dtype, kernel_calls):
    block = sparse_block(dtype=dtype)
    plain = copy.deepcopy(block)
    before = {k: v.clone() for k, v in block.state_dict().items()}
    report = spt.fuse_projections_(block, swiglu=True)
    assert report.fused == [KEY] and report.swiglu == [KEY] and report.no_swiglu == {}
    assert str(report) == "fuse_projections_: 1 projection groups fused, 0 already fused, 0 skipped; SwiGLU " \
                          "fused into 1 MLPs"
    assert isinstance(block.mlp.__dict__["forward"].__self__, SwigluForward)
    after = block.state_dict()  # unchanged: the SwiGLU layers are not registered
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())
    x = torch.randn(1, tokens, HIDDEN).to(torch.bfloat16)
    kernel_calls.clear()
    y, h = down_inputs(block.mlp, x)
    assert kernel_calls == ([("swiglu", "bf16"), (None, "bf16")] if tokens <= 64 else
                            [(None, "bf16"), (None, "bf16")])  # SwiGLU in the kernel or the fallback; down_proj
    check_swiglu(fused_gate_up(block.mlp), x, h, unfused=tokens > 64)
    if tokens > 64:  # the fallback computes what the unfused MLP does, bit for bit
        spt.fuse_projections_(plain)
        with torch.no_grad():
            assert torch.equal(block.mlp(x), plain.mlp(x))
    with torch.no_grad():
        assert torch.equal(y, block.mlp.down_proj(h))
    assert fused_group_of(block.mlp.gate_proj).runs == 0  # gate and up were not run as siblings
    for name in ("gate_proj", "up_proj"):  # the fused weight is the members' own
        rows = slice(0, F) if name == "gate_proj" else slice(F, 2 * F)
        assert torch.equal(fused_gate_up(block.mlp).to_dense()[rows], getattr(plain.mlp, name).to_dense())


def test_llama_forward_variants_and_a_hand_written_silu_are_fused():
    for mlp in (PlainMLP(), LlamaLikeMLP(act=SiLUByHand()), LlamaLikeMLP(bias=False)):
        block = sparse_block(mlp)
        assert spt.fuse_projections_(block, swiglu=True).swiglu == [KEY]
        x = torch.randn(3, HIDDEN).to(torch.bfloat16)
        _, h = down_inputs(block.mlp, x)
        check_swiglu(fused_gate_up(block.mlp), x, h)


class HalfSiLU(torch.nn.SiLU):
    """An nn.SiLU subclass with its own forward (not SiLU)."""

    def forward(self, x):
        return super().forward(x) * 0.5


class SwishBeta(torch.nn.Module):
    """x * sigmoid(beta x) with a learnable beta: SiLU at beta = 1, but it may change after fusing."""

    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)


class ScaledSiLU(torch.nn.Module):
    """SiLU times a plain attribute (1.0 when fused): state the probe could not vouch for later."""

    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        return torch.nn.functional.silu(x) * self.scale


@pytest.mark.parametrize(("act", "silu"), [
    (torch.nn.SiLU(), True), (torch.nn.SiLU(inplace=True), True), (SiLUByHand(), True), (HalfSiLU(), False),
    (SwishBeta(), False), (ScaledSiLU(), False), (torch.nn.GELU(), False), (torch.nn.Identity(), False),
])
def test_which_act_fn_counts_as_silu(act, silu):
    assert is_silu(act) is silu


def test_transformers_silu_activation_counts_as_silu():
    activations = pytest.importorskip("transformers.activations")
    assert is_silu(activations.ACT2FN["silu"])
    assert not is_silu(activations.ACT2FN["gelu"])


@pytest.mark.parametrize(("mlp", "reason"), [
    (lambda: LlamaLikeMLP(act=HalfSiLU()), "its act_fn (HalfSiLU) is not SiLU"),
    (lambda: LlamaLikeMLP(act=SwishBeta()), "its act_fn (SwishBeta) is not SiLU"),
    (lambda: LlamaLikeMLP(act=torch.nn.GELU()), "its act_fn (GELU) is not SiLU"),
    (lambda: LlamaLikeMLP(act=torch.nn.GELU(approximate="tanh")), "its act_fn (GELU) is not SiLU"),
    (SwappedMLP, "SwappedMLP.forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x)) as Llama's MLP writes it"),
    (NoDownMLP, "the module has no down_proj"),
])
def test_other_mlps_keep_their_forward(mlp, reason):
    block = sparse_block(mlp())
    unfused = copy.deepcopy(block)
    spt.fuse_projections_(unfused, swiglu=False)
    report = spt.fuse_projections_(block, swiglu=True)
    assert report.fused == [KEY] and report.swiglu == [] and report.no_swiglu == {KEY: reason}
    assert str(report).splitlines()[1] == f"  no SwiGLU for {KEY}: {reason}"
    assert "forward" not in block.mlp.__dict__
    x = torch.randn(4, HIDDEN).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(block.mlp(x), unfused.mlp(x))  # fused as before, bit for bit
    assert fused_group_of(block.mlp.gate_proj).runs == 1


def test_gate_and_up_called_directly_and_swiglu_false():
    block = sparse_block()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block, swiglu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    for name in ("up_proj", "gate_proj"):
        assert torch.equal(getattr(block.mlp, name)(x), getattr(plain.mlp, name)(x))
    report = spt.fuse_projections_(block, swiglu=False)  # back to the class's forward, the group kept
    assert report.kept == [KEY] and report.swiglu == [] and report.no_swiglu == {}
    assert "forward" not in block.mlp.__dict__ and fused_group_of(block.mlp.gate_proj) is not None
    with torch.no_grad():
        assert torch.equal(block.mlp(x), plain.mlp(x))
    forward = None
    for _ in range(2):  # fusing SwiGLU again; a second call keeps the installed forward
        report = spt.fuse_projections_(block, swiglu=True)
        assert report.kept == [KEY] and report.swiglu == [KEY]
        assert forward is None or block.mlp.__dict__["forward"].__self__ is forward
        forward = block.mlp.__dict__["forward"].__self__


@pytest.mark.parametrize("how", ["apply", "buffers", "child"])
def test_a_released_group_restores_the_mlp_forward(how):
    block = sparse_block()
    reference = copy.deepcopy(block)
    spt.fuse_projections_(block, swiglu=True)
    group = fused_group_of(block.mlp.gate_proj)
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    if how == "apply":  # a move: released at once
        block._apply(lambda t: t.clone())
        assert group.fused is None and "forward" not in block.mlp.__dict__
    elif how == "buffers":  # seen by the next forward, which releases the group and runs unfused
        changed = block.mlp.up_proj.values.flip(0).contiguous()
        block.mlp.up_proj._buffers["values"] = changed
        reference.mlp.up_proj.values = changed.clone()
    else:  # another gate_proj: the class's forward runs it (the group stays, its members not the MLP's)
        block.mlp.gate_proj = copy.deepcopy(reference.mlp.gate_proj)
    with torch.no_grad():
        assert torch.equal(block.mlp(x), reference.mlp(x))
    if how != "child":
        assert group.fused is None and "forward" not in block.mlp.__dict__
        assert spt.fuse_projections_(block, swiglu=True).swiglu == [KEY]  # fused again
        _, h = down_inputs(block.mlp, x)
        check_swiglu(fused_gate_up(block.mlp), x, h)


def test_hooks_on_gate_or_up_run_the_class_forward():
    block = sparse_block()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block, swiglu=True)
    spt.fuse_projections_(plain, swiglu=False)
    seen = []
    hook = block.mlp.up_proj.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(block.mlp(x), plain.mlp(x))
    assert seen == [(2, F)]
    hook.remove()
    _, h = down_inputs(block.mlp, x)  # (a hook on down_proj or the MLP keeps SwiGLU fused)
    check_swiglu(fused_gate_up(block.mlp), x, h)


def test_copies_and_pickles():
    block = sparse_block()
    spt.fuse_projections_(block, swiglu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    y, _ = down_inputs(block.mlp, x)
    twin = copy.deepcopy(block)  # its own group and forward, on its own weights
    forward = twin.mlp.__dict__["forward"].__self__
    assert isinstance(forward, SwigluForward) and forward.parent is twin.mlp
    assert forward.group is fused_group_of(twin.mlp.gate_proj) is not fused_group_of(block.mlp.gate_proj)
    assert torch.equal(down_inputs(twin.mlp, x)[0], y)
    with torch.no_grad():
        twin.mlp.gate_proj.values.zero_()  # (written through the member's view: the fused weight follows)
    assert torch.equal(down_inputs(block.mlp, x)[0], y) and not torch.equal(down_inputs(twin.mlp, x)[0], y)
    saved = io.BytesIO()
    torch.save(block, saved)  # keeps the shared storage: still fused
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert isinstance(loaded.mlp.__dict__["forward"].__self__, SwigluForward)
    assert torch.equal(down_inputs(loaded.mlp, x)[0], y) and "forward" in loaded.mlp.__dict__
    thawed = pickle.loads(pickle.dumps(block))  # plain pickle does not: released at the first forward
    unfused = copy.deepcopy(block)
    spt.fuse_projections_(unfused, swiglu=False)
    with torch.no_grad():
        assert torch.equal(thawed.mlp(x), unfused.mlp(x))
    assert "forward" not in thawed.mlp.__dict__ and fused_group_of(thawed.mlp.gate_proj) is None


def test_weights_written_in_place_reach_the_swiglu_layers():
    block = sparse_block()
    other = sparse_block(LlamaLikeMLP(seed=7))
    spt.fuse_projections_(block, swiglu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    down_inputs(block.mlp, x)
    block.load_state_dict(other.state_dict())  # copies into the members' views
    _, h = down_inputs(block.mlp, x)
    assert "forward" in block.mlp.__dict__
    check_swiglu(fused_gate_up(block.mlp), x, h)
    spt.fuse_projections_(other, swiglu=True)
    assert torch.equal(h, down_inputs(other.mlp, x)[1])


def sparse_ops_in_compiled_graph(model, x) -> tuple[list[tuple[str, str | None]], torch.Tensor]:
    """(the sparsile ops of the graph torch.compile(fullgraph=True) traces for ``model(x)`` with their
    activation, the output)."""
    ops: list[tuple[str, str | None]] = []

    def backend(gm, example_inputs):
        ops.extend((str(n.target), n.kwargs.get("activation")) for n in gm.graph.nodes
                   if n.op == "call_function" and "sparsile" in str(n.target))
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = torch.compile(model, backend=backend, fullgraph=True)(x)
    finally:
        torch._dynamo.reset()
    return ops, got


@pytest.mark.parametrize("tokens", [3, 65])
def test_torch_compile_traced_runs_the_swiglu_op(tokens):
    block = sparse_block()
    untraced = copy.deepcopy(block)
    assert spt.fuse_projections_(block, traced=True, swiglu=True).swiglu == [KEY]
    spt.fuse_projections_(untraced, swiglu=True)
    x = torch.randn(tokens, HIDDEN).to(torch.bfloat16)
    eager, _ = down_inputs(block.mlp, x)
    ops, got = sparse_ops_in_compiled_graph(block.mlp, x)
    assert ops == [("sparsile.sparse_linear", "swiglu"), ("sparsile.sparse_linear", None)]
    assert torch.equal(got, eager)  # the op computes what the eager forward does (fallback included)
    ops, got = sparse_ops_in_compiled_graph(untraced.mlp, x)  # not traced=True: each member's own op
    assert ops == [("sparsile.sparse_linear", None)] * 3
    with torch.no_grad():
        assert torch.equal(got, type(untraced.mlp).forward(untraced.mlp, x))


@pytest.mark.parametrize("strict", [True, False])
def test_torch_export_of_a_fused_mlp(strict):
    """torch.export finds the installed forward's code (a bound method); non-strict export swaps
    the module buffers, so there gate and up run their own ops (the class's forward)."""
    block = sparse_block()
    spt.fuse_projections_(block, traced=True, swiglu=True)
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    eager, _ = down_inputs(block.mlp, x)
    program = torch.export.export(block.mlp, (x,), strict=strict)
    ops = [n.kwargs.get("activation") for n in program.graph.nodes if "sparsile" in str(n.target)]
    with torch.no_grad():
        got = program.module()(x)
        if strict:
            assert ops == ["swiglu", None] and torch.equal(got, eager)
        else:
            assert ops == [None] * 3 and torch.equal(got, type(block.mlp).forward(block.mlp, x))


# ------------------------------------------------------------------------------------------------
# transformers


def test_transformers_llama_mlp_is_fused():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(hidden_size=HIDDEN, intermediate_size=F, hidden_act="silu")
    torch.manual_seed(0)
    block = Block(LlamaMLP(config).to(torch.bfloat16))
    spt.sparsify_(block, interpret=True, min_features=16)
    assert spt.fuse_projections_(block, swiglu=True).swiglu == [KEY]
    x = torch.randn(1, 4, HIDDEN).to(torch.bfloat16)
    _, h = down_inputs(block.mlp, x)
    check_swiglu(fused_gate_up(block.mlp), x, h)


def test_tiny_llama_fused_with_swiglu():
    """Every layer's MLP of a tiny transformers Llama runs SwiGLU fused; each down_proj input is
    within its float64 bound of the MLP's own input."""
    from sparsile.tests.integrations.test_torch_fuse import GROUPS, PROMPT, logits, tiny_llama

    model = tiny_llama()
    report = spt.fuse_projections_(model, swiglu=True)
    assert report.fused == GROUPS and report.swiglu == [g for g in GROUPS if "mlp" in g] and not report.no_swiglu
    seen = {}
    hooks = []
    for layer in model.model.layers:
        mlp = layer.mlp
        hooks.append(mlp.register_forward_pre_hook(lambda m, args: seen.setdefault(m, {}).update(x=args[0])))
        hooks.append(mlp.down_proj.register_forward_pre_hook(
            lambda m, args, mlp=mlp: seen.setdefault(mlp, {}).update(h=args[0])))
    assert torch.isfinite(logits(model, PROMPT)).all()
    for h in hooks:
        h.remove()
    assert len(seen) == 2
    for mlp, io_ in seen.items():
        check_swiglu(fused_gate_up(mlp), io_["x"], io_["h"])


def test_swiglu_layer_reads_its_2f_rows():
    """The SwiGLU layer's out_features is F, its buffers the fused 2F rows: to_dense and
    check_metadata work on those rows (the fused layer's)."""
    block = sparse_block()
    spt.fuse_projections_(block, swiglu=True)
    glu = block.mlp.__dict__["forward"].__self__.glu
    fused = fused_gate_up(block.mlp)
    assert glu.out_features == F and fused.out_features == 2 * F
    assert torch.equal(glu.to_dense(), fused.to_dense())
    glu.check_metadata()
    from sparsile.stdlib.sparsity import SparsityError

    with pytest.raises(SparsityError) as info:
        glu.check_metadata(torch.zeros_like(fused.meta))  # code 0x0 is not a 2:4 pattern
    assert info.value.code == "SP0807" and "row 0" in info.value.message


def test_swiglu_flag_is_checked_and_its_removal_reported():
    block = sparse_block()
    for call in (lambda: spt.fuse_projections_(block, swiglu="no"),
                 lambda: spt.sparsify_(block, interpret=True, min_features=16, fuse=True, swiglu=1)):
        with pytest.raises(IntegrationError) as err:
            call()
        assert err.value.code == "SP0907" and "swiglu must be True or False" in err.value.message
    with pytest.raises(IntegrationError) as err:
        spt.sparsify_(block, interpret=True, min_features=16, swiglu=True)
    assert err.value.code == "SP0907" and "fuse is not set" in err.value.message
    assert "forward" not in block.mlp.__dict__  # nothing was fused by the refused calls
    spt.fuse_projections_(block, swiglu=True)
    report = spt.fuse_projections_(block, traced=True)  # swiglu=False by default: the MLP's own forward again
    assert report.swiglu_removed == [KEY] and "forward" not in block.mlp.__dict__
    assert str(report).startswith("fuse_projections_: 0 projection groups fused, 1 already fused, 0 skipped; "
                                  "SwiGLU removed from 1 MLPs (swiglu=False)")
    assert spt.fuse_projections_(block).swiglu_removed == []  # nothing left to remove


@pytest.mark.parametrize(("dtype", "x_dtype", "out_dtype"), [
    ("f16", torch.float16, None), ("bf16", torch.bfloat16, torch.float32), ("bf16", torch.bfloat16, torch.float16),
    ("e4m3", torch.bfloat16, None), ("e4m3", torch.bfloat16, torch.float32)])
def test_fallback_equals_the_unfused_computation(dtype, x_dtype, out_dtype):
    """Above 64 tokens the op's SwiGLU is the no-activation result in the output type, then
    F.silu and the product: the same bits, for every weight type and output type."""
    layer = gate_up(dtype, seed=4)
    x = torch.randn(2, 40, HIDDEN).to(x_dtype)
    if dtype == "e4m3":
        xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
        args = (xq, layer.values, layer.meta, layer.bias, sx, layer.scale_w)
    else:
        args = (x, layer.values, layer.meta, layer.bias)
    y = torch.ops.sparsile.sparse_linear(*args, activation="swiglu", out_dtype=out_dtype)
    z = torch.ops.sparsile.sparse_linear(*args, out_dtype=out_dtype)
    assert y.shape == (2, 40, F) and y.dtype == z.dtype
    assert torch.equal(y, torch.nn.functional.silu(z[..., :F]) * z[..., F:])
