"""The gated activation (SwiGLU, GeGLU) fused into the sparse gated MLP (integrations/torch/glu.py) on
the CPU (the interpreter): ``torch.ops.sparsile.sparse_linear(activation="swiglu" / "geglu")``
against float64 (stdlib's reference_linear) in the kernel (T <= 64, outputs poisoned with NaN
first) and through the fallback (T > 64: the unfused MLP's bits), its fake shapes and diagnostics;
which act_fn is which gate (``gate_activation``); ``fuse_projections_(glu=True)`` on Llama- and
Gemma-style MLPs (tiny ones of our own, transformers' LlamaMLP and GemmaMLP, a tiny Llama and a
tiny Gemma when transformers is importable): the down_proj input against float64, parents that
must keep their forward, state dicts, release, copies and pickling, hooks, ``glu=False``,
torch.compile, torch.export."""

from __future__ import annotations

import copy
import functools
import io
import pickle

import pytest

from sparsile.tests.integrations.torch_helpers import check_glu, down_inputs, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.errors import IntegrationError  # noqa: E402
from sparsile.integrations.torch._kernels import kernel_api  # noqa: E402
from sparsile.integrations.torch.glu import GatedForward, gate_activation  # noqa: E402
from sparsile.integrations.torch.projection_group import fused_group_of  # noqa: E402
from sparsile.stdlib.kernels.linear_args import is_gated  # noqa: E402

HIDDEN, F = 64, 32  # the MLP's in_features and intermediate size (F: a multiple of 16)
ACTIVATIONS = ("swiglu", "geglu")
GATES = {"swiglu": torch.nn.functional.silu,
         "geglu": functools.partial(torch.nn.functional.gelu, approximate="tanh")}
"""What the unfused MLP applies to gate_proj's output (nn.SiLU, nn.GELU(approximate="tanh"))."""
OUT_TYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def act_module(activation: str) -> torch.nn.Module:
    return torch.nn.SiLU() if activation == "swiglu" else torch.nn.GELU(approximate="tanh")


@pytest.fixture
def kernel_calls(monkeypatch):
    """The (activation, out_dtype) of each call of the stdlib kernel (the interpreter's); each call
    writes into an output filled with NaN first, so that an output it leaves unwritten shows."""
    api = kernel_api()
    real = api.sparse_linear
    calls: list[tuple[str | None, str]] = []

    def spy(values, meta, x, **kwargs):
        calls.append((kwargs.get("activation"), kwargs.get("out_dtype")))
        if kwargs.get("out") is None:
            n = values.shape[0] // (2 if is_gated(kwargs.get("activation")) else 1)
            kwargs["out"] = torch.full((x.shape[0], n), float("nan"), dtype=OUT_TYPES[kwargs["out_dtype"]])
        return real(values, meta, x, **kwargs)

    monkeypatch.setattr(api, "sparse_linear", spy)
    return calls


def gate_up(dtype=None, bias: bool = True, seed: int = 0):
    """A SparseLinear of 2F rows: the row concatenation [gate; up] the op takes."""
    return spt.SparseLinear.from_dense(linear(2 * F, HIDDEN, bias=bias, seed=seed), dtype)


# ------------------------------------------------------------------------------------------------
# the op


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 5, 64, 65])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_op_glu_against_float64(tokens, x_dtype, bias, activation, kernel_calls):
    """In the kernel up to 64 tokens (one call with the gated activation, its outputs poisoned
    first), above through the pre-activations in x's type (one call, no activation) and torch's
    activation and product: the bits of the unfused MLP."""
    layer = gate_up("f16" if x_dtype == torch.float16 else "bf16", bias)
    x = torch.randn(tokens, HIDDEN).to(x_dtype)
    y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation=activation)
    check_glu(layer, x, y, activation, unfused=tokens > 64)
    name = {torch.bfloat16: "bf16", torch.float16: "f16"}[x_dtype]
    assert kernel_calls == ([(activation, name)] if tokens <= 64 else [(None, name)])
    if tokens > 64:
        z = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias)
        assert torch.equal(y, GATES[activation](z[:, :F]) * z[:, F:])


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_op_glu_leading_dims_out_dtype_and_e4m3(activation, kernel_calls):
    layer = gate_up()
    x = torch.randn(2, 3, HIDDEN).to(torch.bfloat16)
    y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation=activation,
                                         out_dtype=torch.float32)
    check_glu(layer, x, y, activation, torch.float32)
    fp8 = gate_up("e4m3", seed=3)
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    y = torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, fp8.bias, sx, fp8.scale_w, activation=activation)
    assert y.dtype == torch.bfloat16
    check_glu(fp8, x, y, activation)
    assert kernel_calls == [(activation, "f32"), (activation, "bf16")]


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_op_glu_no_tokens_and_fake_shapes(activation):
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = gate_up()
    empty = torch.ops.sparsile.sparse_linear(torch.empty(0, HIDDEN, dtype=torch.bfloat16), layer.values, layer.meta,
                                             layer.bias, activation=activation)
    assert empty.shape == (0, F) and empty.dtype == torch.bfloat16
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        for lead in [(), (3,), (3, 1), (70,)]:
            x = torch.empty(*lead, HIDDEN, dtype=torch.bfloat16)
            y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation=activation,
                                                 out_dtype=torch.float16)
            assert y.shape == (*lead, F) and y.dtype == torch.float16 and mode.is_our_fake(y)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_opcheck_glu(activation):
    layer = gate_up()
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.sparsile.sparse_linear.default, (x, layer.values, layer.meta, layer.bias),
                          {"activation": activation})


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("rows", [48, 40, 17])
def test_op_glu_needs_two_halves_of_a_multiple_of_16_rows(rows, activation):
    layer = spt.SparseLinear.from_dense(linear(rows, HIDDEN))
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    with pytest.raises(IntegrationError) as err:
        torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation=activation)
    assert err.value.code == "SP0906"
    assert err.value.message == (f"sparsile.sparse_linear: activation '{activation}' takes values of 2F rows "
                                 f"[gate; up] with F a multiple of 16, got {rows} rows")


@pytest.mark.parametrize(("activation", "gate"), [("swiglu", "silu"), ("geglu", "gelu_tanh")])
def test_a_layer_refuses_a_gated_activation_as_its_own(activation, gate):
    message = (f"a SparseLinear cannot apply '{activation}' to its own outputs: it multiplies {gate}(gate) by up, "
               "the outputs of two projections")
    with pytest.raises(IntegrationError) as err:
        spt.SparseLinear(HIDDEN, F, activation=activation)
    assert err.value.code == "SP0904" and err.value.message == message
    assert "fuse_projections_(model, glu=True)" in err.value.help
    layer = spt.SparseLinear.from_dense(linear(F, HIDDEN))
    with pytest.raises(IntegrationError) as err:
        layer.activation = activation
    assert err.value.code == "SP0904" and err.value.message == message and layer.activation is None
    with pytest.raises(IntegrationError) as err:  # the op's help lists the gated ones, a layer's does not
        torch.ops.sparsile.sparse_linear(torch.randn(1, HIDDEN).to(torch.bfloat16), layer.values, layer.meta,
                                         activation="swish")
    assert err.value.code == "SP0904" and err.value.message == "unknown activation 'swish'"
    assert err.value.help == "use None, 'relu', 'silu', 'gelu_tanh', 'swiglu' or 'geglu'"
    for bad in ("swish", ["silu"]):
        with pytest.raises(IntegrationError) as err:
            spt.SparseLinear(HIDDEN, F, activation=bad)
        assert err.value.code == "SP0904" and err.value.message == f"unknown activation {bad!r}"
        assert err.value.help == "use None, 'relu', 'silu' or 'gelu_tanh'"


# ------------------------------------------------------------------------------------------------
# the MLP


class LlamaLikeMLP(torch.nn.Module):
    """transformers' LlamaMLP (and GemmaMLP), written out (its forward's bytecode is the reference form)."""

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


class GELUTanhByHand(torch.nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


class ExactGELUByHand(torch.nn.Module):
    """GELU without the approximation: up to 5e-4 from the tanh form, which the probe must see."""

    def forward(self, x):
        return 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))


class PartialGELU(torch.nn.Module):
    """transformers' GELUTanh's form: the function an attribute (a functools.partial)."""

    def __init__(self, approximate: str = "tanh"):
        super().__init__()
        self.act = functools.partial(torch.nn.functional.gelu, approximate=approximate)

    def forward(self, x):
        return self.act(x)


class BoundMethodAct(torch.nn.Module):
    """The function an attribute bound to another object: state the probe could not vouch for later."""

    def __init__(self, owner):
        super().__init__()
        self.act = owner.forward

    def forward(self, x):
        return self.act(x)


class ClosureAct(torch.nn.Module):
    def __init__(self):
        super().__init__()
        scale = torch.ones(())
        self.act = lambda x: torch.nn.functional.silu(x) * scale  # (a tensor in the closure)

    def forward(self, x):
        return self.act(x)


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


def fused_gate_up(mlp):
    return fused_group_of(mlp.gate_proj).fused


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 5, 64, 65])
@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_fused_mlp_against_float64(tokens, dtype, activation, kernel_calls):
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)), dtype=dtype)
    plain = copy.deepcopy(block)
    before = {k: v.clone() for k, v in block.state_dict().items()}
    report = spt.fuse_projections_(block, glu=True)
    assert report.fused == [KEY] and report.glu == {KEY: activation} and report.no_glu == {}
    assert str(report) == "fuse_projections_: 1 projection group fused, 0 already fused, 0 skipped; gated " \
                          f"activation fused into 1 MLP ({activation})"
    forward = block.mlp.__dict__["forward"].__self__
    assert isinstance(forward, GatedForward) and forward.activation == activation
    after = block.state_dict()  # unchanged: the gated layers are not registered
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())
    x = torch.randn(1, tokens, HIDDEN).to(torch.bfloat16)
    kernel_calls.clear()
    y, h = down_inputs(block.mlp, x)
    assert kernel_calls == ([(activation, "bf16"), (None, "bf16")] if tokens <= 64 else
                            [(None, "bf16"), (None, "bf16")])  # in the kernel or the fallback; down_proj
    check_glu(fused_gate_up(block.mlp), x, h, activation, unfused=tokens > 64)
    if tokens > 64:  # the fallback computes what the unfused MLP does, bit for bit
        spt.fuse_projections_(plain, glu=False)
        with torch.no_grad():
            assert torch.equal(block.mlp(x), plain.mlp(x))
    with torch.no_grad():
        assert torch.equal(y, block.mlp.down_proj(h))
    assert fused_group_of(block.mlp.gate_proj).runs == 0  # gate and up were not run as siblings
    for name in ("gate_proj", "up_proj"):  # the fused weight is the members' own
        rows = slice(0, F) if name == "gate_proj" else slice(F, 2 * F)
        assert torch.equal(fused_gate_up(block.mlp).to_dense()[rows], getattr(plain.mlp, name).to_dense())


@pytest.mark.parametrize(("mlp", "activation"), [
    (PlainMLP, "swiglu"), (lambda: LlamaLikeMLP(act=SiLUByHand()), "swiglu"),
    (lambda: LlamaLikeMLP(bias=False), "swiglu"), (lambda: PlainMLP(act=PartialGELU()), "geglu"),
    (lambda: LlamaLikeMLP(act=GELUTanhByHand(), bias=False), "geglu")])
def test_forward_variants_and_hand_written_activations_are_fused(mlp, activation):
    block = sparse_block(mlp())
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: activation}
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    _, h = down_inputs(block.mlp, x)
    check_glu(fused_gate_up(block.mlp), x, h, activation)


class HalfSiLU(torch.nn.SiLU):
    """An nn.SiLU subclass with its own forward (not SiLU)."""

    def forward(self, x):
        return super().forward(x) * 0.5


class TanhGELUSubclass(torch.nn.GELU):
    """An nn.GELU subclass with its own forward: checked as any module (its approximate attribute is state)."""

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


class SwishBeta(torch.nn.Module):
    """x * sigmoid(beta x) with a learnable beta: SiLU at beta = 1, but it may change after fusing."""

    def __init__(self):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)


class SwishFloatBeta(torch.nn.Module):
    """x * sigmoid(beta x) with a float beta (1.0 when fused): state the probe could not vouch for later."""

    def __init__(self):
        super().__init__()
        self.beta = 1.0

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)


class ScaledSiLU(torch.nn.Module):
    """SiLU times a plain attribute (1.0 when fused)."""

    def __init__(self):
        super().__init__()
        self.scale = 1.0

    def forward(self, x):
        return torch.nn.functional.silu(x) * self.scale


class WithChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.SiLU()

    def forward(self, x):
        return self.inner(x)


class Raising(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("no")


class ReturnsBF16(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.silu(x).to(torch.bfloat16)


class ClassBetaSwish(torch.nn.Module):
    """x * sigmoid(beta x) with beta = 1.0 on the class: state a later assignment changes."""

    beta = 1.0

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)


_GLOBAL_BETA = torch.ones(())


class GlobalTensorSwish(torch.nn.Module):
    """x * sigmoid(beta x) with beta a module-level tensor its forward reads."""

    def forward(self, x):
        return x * torch.sigmoid(_GLOBAL_BETA * x)


class DefaultTensorAct(torch.nn.Module):
    """A lambda holding a tensor in its default arguments (not its closure)."""

    def __init__(self):
        super().__init__()
        self.act = lambda x, b=_GLOBAL_BETA.clone(): x * torch.sigmoid(b * x)  # noqa: B008 (the point: a tensor default)

    def forward(self, x):
        return self.act(x)


class ClosureListAct(torch.nn.Module):
    """A lambda closing over a list that holds a tensor."""

    def __init__(self):
        super().__init__()
        box = [torch.ones(())]
        self.act = lambda x: x * torch.sigmoid(box[0] * x)

    def forward(self, x):
        return self.act(x)


class ClampedSiLU(torch.nn.Module):
    """silu of the gate clamped at 8: silu on -6..6, not beyond."""

    def forward(self, x):
        return torch.nn.functional.silu(x.clamp(max=8.0))


class BF16Elsewhere(torch.nn.Module):
    """silu in float32, something else for bfloat16 inputs (the type a model runs)."""

    def forward(self, x):
        return torch.nn.functional.silu(x) if x.dtype == torch.float32 else torch.relu(x)


class OwnCall(torch.nn.SiLU):
    """nn.SiLU's forward, but a class __call__ of its own."""

    def __call__(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


def instance_forward(act, fn):
    """``act`` with ``fn`` as its instance's forward (what nn.Module.__call__ runs)."""
    act.forward = fn
    return act


class StaticGlobalSwish(torch.nn.Module):
    """beta read by a static method from a module-level tensor."""

    @staticmethod
    def beta():
        return _GLOBAL_BETA

    def forward(self, x):
        return x * torch.sigmoid(self.beta() * x)


class NestedGlobalSwish(torch.nn.Module):
    """beta, a module-level tensor, read inside a lambda of the forward (nested code)."""

    def forward(self, x):
        return (lambda v: v * torch.sigmoid(_GLOBAL_BETA * v))(x)


def _attr_swish(x):
    return x * torch.sigmoid(_attr_swish.beta * x)


_attr_swish.beta = 1.0


class FunctionAttributeSwish(torch.nn.Module):
    """beta a function attribute (state)."""

    def __init__(self):
        super().__init__()
        self.act = _attr_swish

    def forward(self, x):
        return self.act(x)


class RecursiveClosureAct(torch.nn.Module):
    """silu through a closure that refers to itself: checked without endless recursion."""

    def __init__(self):
        super().__init__()

        def act(x, depth=0):
            return act(x, 1) if depth == 0 else torch.nn.functional.silu(x)

        self.act = act

    def forward(self, x):
        return self.act(x)


class HalfElsewhere(torch.nn.Module):
    """silu, except for float16 inputs."""

    def forward(self, x):
        return torch.relu(x) if x.dtype == torch.float16 else torch.nn.functional.silu(x)


class RankElsewhere(torch.nn.Module):
    """silu of 1-D inputs only (a probe's rank)."""

    def forward(self, x):
        return torch.nn.functional.silu(x) if x.dim() == 1 else torch.relu(x)


class LayoutElsewhere(torch.nn.Module):
    """silu of contiguous inputs only."""

    def forward(self, x):
        return torch.nn.functional.silu(x) if x.is_contiguous() else torch.relu(x)


class HubNamedSiLU(torch.nn.Module):
    """transformers' hub decorator names a class with a string: code and strings only, accepted."""

    kernel_layer_name = "SiLU"

    def forward(self, x):
        return torch.nn.functional.silu(x)


class NeverInitialized(torch.nn.SiLU):
    def __init__(self):  # no nn.Module.__init__: inspecting it raises inside gate_activation
        pass


def instance_call_impl(act, fn):
    """``act`` whose instance ``_call_impl`` is ``fn`` (what nn.Module.__call__ runs)."""
    act._call_impl = fn
    return act


def hooked(act):
    act.register_forward_hook(lambda m, args, out: None)
    return act


@pytest.mark.parametrize(("act", "gate"), [
    (torch.nn.SiLU(), "silu"), (torch.nn.SiLU(inplace=True), "silu"), (SiLUByHand(), "silu"),
    (torch.nn.GELU(approximate="tanh"), "gelu_tanh"), (GELUTanhByHand(), "gelu_tanh"), (PartialGELU(), "gelu_tanh"),
    (HalfSiLU(), None), (TanhGELUSubclass(approximate="tanh"), None), (torch.nn.GELU(), None),
    (ExactGELUByHand(), None), (PartialGELU("none"), None), (SwishBeta(), None), (SwishFloatBeta(), None),
    (ScaledSiLU(), None), (WithChild(), None), (Raising(), None), (ReturnsBF16(), None),
    (hooked(torch.nn.SiLU()), None), (hooked(GELUTanhByHand()), None), (BoundMethodAct(torch.nn.SiLU()), None),
    (ClosureAct(), None), (torch.nn.Identity(), None), (torch.nn.functional.silu, None),
    (ClassBetaSwish(), None), (GlobalTensorSwish(), None), (DefaultTensorAct(), None), (ClosureListAct(), None),
    (ClampedSiLU(), None), (BF16Elsewhere(), None), (OwnCall(), None),
    (instance_forward(torch.nn.SiLU(), functools.partial(torch.nn.functional.gelu, approximate="tanh")), None),
    (instance_forward(torch.nn.GELU(approximate="tanh"), torch.nn.functional.silu), None),
    (instance_forward(SiLUByHand(), torch.nn.functional.silu), None),
    (instance_call_impl(torch.nn.SiLU(), torch.nn.functional.relu), None),
    (StaticGlobalSwish(), None), (NestedGlobalSwish(), None), (FunctionAttributeSwish(), None),
    (RecursiveClosureAct(), "silu"), (HalfElsewhere(), None), (RankElsewhere(), None), (LayoutElsewhere(), None),
    (HubNamedSiLU(), "silu"), (NeverInitialized(), None),
])
def test_gate_activation(act, gate):
    assert gate_activation(act) == gate


def test_the_probe_tolerance_refuses_exact_gelu():
    """The probe's tolerance sits between the float32 evaluations of the tanh form (within 2.5e-7;
    silu's within 4e-7) and exact GELU (5e-4 away at its largest)."""
    from sparsile.integrations.torch.gate import _GATE_REFERENCES, _PROBE, PROBE_ATOL, PROBE_RTOL

    want = _GATE_REFERENCES["gelu_tanh"]
    for act in (torch.nn.GELU(approximate="tanh"), GELUTanhByHand(), PartialGELU()):
        err = (act(_PROBE.clone()).double() - want).abs()
        assert (err <= 0.25 * (PROBE_ATOL + PROBE_RTOL * want.abs())).all()
    exact = (torch.nn.functional.gelu(_PROBE.double()) - want).abs()
    assert (exact > 100 * (PROBE_ATOL + PROBE_RTOL * want.abs())).any()


def test_transformers_activations():
    activations = pytest.importorskip("transformers.activations")
    assert gate_activation(activations.ACT2FN["silu"]) == "silu"  # SiLUActivation
    assert gate_activation(activations.ACT2FN["gelu_pytorch_tanh"]) == "gelu_tanh"  # GELUTanh: a partial of F.gelu
    assert gate_activation(activations.GELUTanh(use_gelu_tanh_python=True)) == "gelu_tanh"  # its bound method
    assert gate_activation(activations.ACT2FN["gelu_new"]) == "gelu_tanh"  # the formula written out
    assert gate_activation(activations.ACT2FN["gelu"]) is None  # exact GELU (F.gelu as an attribute)
    assert gate_activation(activations.ACT2FN["quick_gelu"]) is None


NOT_A_GATE = "is neither SiLU nor GELU with the tanh approximation"


@pytest.mark.parametrize(("mlp", "reason"), [
    (lambda: LlamaLikeMLP(act=HalfSiLU()), f"its act_fn (HalfSiLU) {NOT_A_GATE}"),
    (lambda: LlamaLikeMLP(act=SwishBeta()), f"its act_fn (SwishBeta) {NOT_A_GATE}"),
    (lambda: LlamaLikeMLP(act=SwishFloatBeta()), f"its act_fn (SwishFloatBeta) {NOT_A_GATE}"),
    (lambda: LlamaLikeMLP(act=torch.nn.GELU()),
     "its act_fn (GELU, approximate='none') is exact GELU, not the tanh approximation the kernel applies"),
    (lambda: LlamaLikeMLP(act=ExactGELUByHand()), f"its act_fn (ExactGELUByHand) {NOT_A_GATE}"),
    (lambda: LlamaLikeMLP(act=TanhGELUSubclass(approximate="tanh")),
     f"its act_fn (TanhGELUSubclass, approximate='tanh') {NOT_A_GATE}"),
    (lambda: LlamaLikeMLP(act=instance_forward(torch.nn.GELU(approximate="tanh"), torch.nn.functional.silu)),
     f"its act_fn (GELU, approximate='tanh') {NOT_A_GATE}"),  # (not called exact: its forward is replaced)
    (SwappedMLP, "SwappedMLP.forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x)) as Llama's MLP writes it"),
    (NoDownMLP, "the module has no down_proj"),
])
def test_other_mlps_keep_their_forward(mlp, reason):
    block = sparse_block(mlp())
    unfused = copy.deepcopy(block)
    spt.fuse_projections_(unfused, glu=False)
    report = spt.fuse_projections_(block, glu=True)
    assert report.fused == [KEY] and report.glu == {} and report.no_glu == {KEY: reason}
    assert str(report).splitlines() == [
        "fuse_projections_: 1 projection group fused, 0 already fused, 0 skipped; gated activation fused into 0 MLPs",
        f"  no gated activation for {KEY}: {reason}"]
    assert "forward" not in block.mlp.__dict__
    x = torch.randn(4, HIDDEN).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(block.mlp(x), unfused.mlp(x))  # fused as before, bit for bit
    assert fused_group_of(block.mlp.gate_proj).runs == 1


def test_both_activations_in_one_model_and_an_act_fn_replaced():
    model = torch.nn.Module()
    model.a, model.b = Block(LlamaLikeMLP()), Block(LlamaLikeMLP(act=torch.nn.GELU(approximate="tanh"), seed=3))
    spt.sparsify_(model, interpret=True, min_features=16)
    report = spt.fuse_projections_(model, glu=True)
    assert report.glu == {"a.mlp.gate_proj+up_proj": "swiglu", "b.mlp.gate_proj+up_proj": "geglu"}
    assert str(report) == ("fuse_projections_: 2 projection groups fused, 0 already fused, 0 skipped; gated "
                           "activation fused into 2 MLPs (1 geglu, 1 swiglu)")
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    for block, activation in ((model.a, "swiglu"), (model.b, "geglu")):
        _, h = down_inputs(block.mlp, x)
        check_glu(fused_gate_up(block.mlp), x, h, activation)
    model.a.mlp.act_fn = torch.nn.GELU(approximate="tanh")  # a replaced act_fn: the class's forward runs it
    plain = copy.deepcopy(model)
    spt.fuse_projections_(plain, glu=False)
    with torch.no_grad():
        assert torch.equal(model.a.mlp(x), plain.a.mlp(x))
    report = spt.fuse_projections_(model, glu=True)  # fused again: now GeGLU
    assert report.kept == ["a.mlp.gate_proj+up_proj", "b.mlp.gate_proj+up_proj"]
    assert report.glu == {"a.mlp.gate_proj+up_proj": "geglu", "b.mlp.gate_proj+up_proj": "geglu"}
    assert str(report).endswith("gated activation fused into 2 MLPs (geglu)")
    _, h = down_inputs(model.a.mlp, x)
    check_glu(fused_gate_up(model.a.mlp), x, h, "geglu")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gate_and_up_called_directly_and_glu_false(activation):
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)))
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block, glu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    for name in ("up_proj", "gate_proj"):
        assert torch.equal(getattr(block.mlp, name)(x), getattr(plain.mlp, name)(x))
    report = spt.fuse_projections_(block, glu=False)  # back to the class's forward, the group kept
    assert report.kept == [KEY] and report.glu == {} and report.no_glu == {} and report.glu_removed == [KEY]
    assert "forward" not in block.mlp.__dict__ and fused_group_of(block.mlp.gate_proj) is not None
    with torch.no_grad():
        assert torch.equal(block.mlp(x), plain.mlp(x))
    forward = None
    for _ in range(2):  # fusing it again; a second call keeps the installed forward
        report = spt.fuse_projections_(block, glu=True)
        assert report.kept == [KEY] and report.glu == {KEY: activation}
        assert forward is None or block.mlp.__dict__["forward"].__self__ is forward
        forward = block.mlp.__dict__["forward"].__self__


@pytest.mark.parametrize("how", ["apply", "buffers", "child"])
def test_a_released_group_restores_the_mlp_forward(how):
    block = sparse_block()
    reference = copy.deepcopy(block)
    spt.fuse_projections_(block, glu=True)
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
        assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}  # fused again
        _, h = down_inputs(block.mlp, x)
        check_glu(fused_gate_up(block.mlp), x, h)


def test_a_trainable_gate_bias_releases_the_gated_mlp():
    """gate_proj's bias made trainable after the gated activation was fused: the gated layer's bias is
    the fused one (another tensor), so the MLP's forward gave it no gradient without a word. The
    group is released and the class's forward gives gate_proj's bias the unfused MLP's gradient."""
    block = sparse_block()
    reference = copy.deepcopy(block)
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    group = fused_group_of(block.mlp.gate_proj)
    for b in (block, reference):
        b.mlp.gate_proj.bias.requires_grad_()
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for b in (block, reference):
        b.mlp(x.clone().requires_grad_()).float().pow(2).sum().backward()
    want = reference.mlp.gate_proj.bias.grad
    assert want is not None and block.mlp.gate_proj.bias.grad is not None
    assert torch.equal(block.mlp.gate_proj.bias.grad, want)
    assert group.fused is None and "forward" not in block.mlp.__dict__


@pytest.mark.parametrize("bias", [True, False])
def test_a_gate_bias_made_a_parameter_releases_the_gated_mlp(bias):
    """gate_proj's bias set to an nn.Parameter after the gated activation was fused (a bias to train):
    torch moves the name out of ``_buffers``. Fused without biases, the group still looked intact and the
    MLP ran the gated layer without gate_proj's new bias (a wrong output, without a word); fused with
    them, the released gate_proj's own call read ``_buffers["bias"]``: a KeyError. The group is released;
    the class's forward computes with the new bias, as the unfused MLP does, and gives it its gradient."""
    block = sparse_block(LlamaLikeMLP(bias=bias))
    reference = copy.deepcopy(block)
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    group = fused_group_of(block.mlp.gate_proj)
    new = torch.rand(F, generator=torch.Generator().manual_seed(5)) + 1.0
    for b in (block, reference):
        b.mlp.gate_proj.bias = torch.nn.Parameter(new.clone())
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(block.mlp(x), reference.mlp(x))
    assert group.fused is None and "forward" not in block.mlp.__dict__
    for b in (block, reference):
        b.mlp(x).float().pow(2).sum().backward()
    want = reference.mlp.gate_proj.bias.grad
    assert want is not None and torch.equal(block.mlp.gate_proj.bias.grad, want)


@pytest.mark.parametrize("child", ["act_fn", "gate_proj", "up_proj"])
def test_a_backward_hook_on_gate_up_or_act_runs_the_class_forward(child):
    """A full backward hook registered after fusing (here one that doubles its grad_input): the fused
    forward never calls the child, so the hook did not run and x's gradient was the unhooked one. The
    MLP's own forward runs instead, hook and all, as on the unfused model."""
    block = sparse_block()
    reference = copy.deepcopy(block)
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    spt.fuse_projections_(reference, glu=False)
    seen = []

    def double(module, grad_input, grad_output):
        seen.append(module)
        return tuple(None if g is None else 2 * g for g in grad_input)

    grads = []
    for b in (block, reference):
        getattr(b.mlp, child).register_full_backward_hook(double)
        x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16).requires_grad_()
        b.mlp(x).float().pow(2).sum().backward()
        grads.append(x.grad)
    assert len(seen) == 2
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_hooks_on_gate_up_or_act_run_the_class_forward(activation):
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)))
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block, glu=True)
    spt.fuse_projections_(plain, glu=False)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    for child in ("up_proj", "act_fn"):
        seen = []
        hook = getattr(block.mlp, child).register_forward_hook(lambda m, args, out, seen=seen: seen.append(out.shape))
        with torch.no_grad():
            assert torch.equal(block.mlp(x), plain.mlp(x))
        assert seen == [(2, F)]
        hook.remove()
    _, h = down_inputs(block.mlp, x)  # (a hook on down_proj or the MLP keeps the gated activation fused)
    check_glu(fused_gate_up(block.mlp), x, h, activation)


def test_copies_and_pickles():
    block = sparse_block(LlamaLikeMLP(act=torch.nn.GELU(approximate="tanh")))
    spt.fuse_projections_(block, glu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    y, _ = down_inputs(block.mlp, x)
    twin = copy.deepcopy(block)  # its own group and forward, on its own weights
    forward = twin.mlp.__dict__["forward"].__self__
    assert isinstance(forward, GatedForward) and forward.parent is twin.mlp and forward.activation == "geglu"
    assert forward.group is fused_group_of(twin.mlp.gate_proj) is not fused_group_of(block.mlp.gate_proj)
    assert torch.equal(down_inputs(twin.mlp, x)[0], y)
    with torch.no_grad():
        twin.mlp.gate_proj.values.zero_()  # (written through the member's view: the fused weight follows)
    assert torch.equal(down_inputs(block.mlp, x)[0], y) and not torch.equal(down_inputs(twin.mlp, x)[0], y)
    saved = io.BytesIO()
    torch.save(block, saved)  # keeps the shared storage: still fused
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert isinstance(loaded.mlp.__dict__["forward"].__self__, GatedForward)
    assert torch.equal(down_inputs(loaded.mlp, x)[0], y) and "forward" in loaded.mlp.__dict__
    thawed = pickle.loads(pickle.dumps(block))  # plain pickle does not: released at the first forward
    unfused = copy.deepcopy(block)
    spt.fuse_projections_(unfused, glu=False)
    with torch.no_grad():
        assert torch.equal(thawed.mlp(x), unfused.mlp(x))
    assert "forward" not in thawed.mlp.__dict__ and fused_group_of(thawed.mlp.gate_proj) is None


def test_weights_written_in_place_reach_the_gated_layers():
    block = sparse_block()
    other = sparse_block(LlamaLikeMLP(seed=7))
    spt.fuse_projections_(block, glu=True)
    x = torch.randn(2, HIDDEN).to(torch.bfloat16)
    down_inputs(block.mlp, x)
    block.load_state_dict(other.state_dict())  # copies into the members' views
    _, h = down_inputs(block.mlp, x)
    assert "forward" in block.mlp.__dict__
    check_glu(fused_gate_up(block.mlp), x, h)
    spt.fuse_projections_(other, glu=True)
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


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [3, 65])
def test_torch_compile_traced_runs_the_glu_op(tokens, activation):
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)))
    untraced = copy.deepcopy(block)
    assert spt.fuse_projections_(block, traced=True, glu=True).glu == {KEY: activation}
    spt.fuse_projections_(untraced, glu=True)
    x = torch.randn(tokens, HIDDEN).to(torch.bfloat16)
    eager, _ = down_inputs(block.mlp, x)
    ops, got = sparse_ops_in_compiled_graph(block.mlp, x)
    assert ops == [("sparsile.sparse_linear", activation), ("sparsile.sparse_linear", None)]
    assert torch.equal(got, eager)  # the op computes what the eager forward does (fallback included)
    ops, got = sparse_ops_in_compiled_graph(untraced.mlp, x)  # not traced=True: each member's own op
    assert ops == [("sparsile.sparse_linear", None)] * 3
    with torch.no_grad():
        assert torch.equal(got, type(untraced.mlp).forward(untraced.mlp, x))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("strict", [True, False])
def test_torch_export_of_a_fused_mlp(strict, activation):
    """torch.export finds the installed forward's code (a bound method); non-strict export swaps
    the module buffers, so there gate and up run their own ops (the class's forward)."""
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)))
    spt.fuse_projections_(block, traced=True, glu=True)
    x = torch.randn(3, HIDDEN).to(torch.bfloat16)
    eager, _ = down_inputs(block.mlp, x)
    program = torch.export.export(block.mlp, (x,), strict=strict)
    ops = [n.kwargs.get("activation") for n in program.graph.nodes if "sparsile" in str(n.target)]
    with torch.no_grad():
        got = program.module()(x)
        if strict:
            assert ops == [activation, None] and torch.equal(got, eager)
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
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    x = torch.randn(1, 4, HIDDEN).to(torch.bfloat16)
    _, h = down_inputs(block.mlp, x)
    check_glu(fused_gate_up(block.mlp), x, h)


@pytest.mark.parametrize("python_gelu", [False, True])
@pytest.mark.parametrize("tokens", [4, 65])
def test_transformers_gemma_mlp_is_fused_with_geglu(tokens, python_gelu):
    """GemmaMLP (hidden_act "gelu_pytorch_tanh": GELUTanh) runs GeGLU; above 64 tokens the fallback
    equals the unfused MLP bit for bit where GELUTanh calls F.gelu(approximate="tanh") (its default),
    and is within the bound where it writes the formula out (use_gelu_tanh_python=True)."""
    transformers = pytest.importorskip("transformers")
    from transformers.activations import GELUTanh
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    config = transformers.GemmaConfig(hidden_size=HIDDEN, intermediate_size=F, hidden_act="gelu_pytorch_tanh")
    torch.manual_seed(0)
    mlp = GemmaMLP(config).to(torch.bfloat16)
    assert type(mlp.act_fn) is GELUTanh
    if python_gelu:
        mlp.act_fn = GELUTanh(use_gelu_tanh_python=True)
    block = Block(mlp)
    spt.sparsify_(block, interpret=True, min_features=16)
    plain = copy.deepcopy(block)
    spt.fuse_projections_(plain, glu=False)
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "geglu"}
    x = torch.randn(1, tokens, HIDDEN).to(torch.bfloat16)
    y, h = down_inputs(block.mlp, x)
    check_glu(fused_gate_up(block.mlp), x, h, "geglu", unfused=tokens > 64)
    if tokens > 64 and not python_gelu:
        with torch.no_grad():
            assert torch.equal(y, plain.mlp(x))


def test_tiny_llama_fused_with_glu():
    """Every layer's MLP of a tiny transformers Llama runs SwiGLU fused; each down_proj input is
    within its float64 bound of the MLP's own input."""
    from sparsile.tests.integrations.test_torch_fuse import GROUPS, PROMPT, logits, tiny_llama

    model = tiny_llama()
    report = spt.fuse_projections_(model, glu=True)
    assert report.fused == GROUPS and report.glu == {g: "swiglu" for g in GROUPS if "mlp" in g}
    assert not report.no_glu
    seen, hooks = capture_mlp_inputs(model)
    assert torch.isfinite(logits(model, PROMPT)).all()
    for h in hooks:
        h.remove()
    assert len(seen) == 2
    for mlp, io_ in seen.items():
        check_glu(fused_gate_up(mlp), io_["x"], io_["h"])


def capture_mlp_inputs(model) -> tuple[dict, list]:
    """Forward pre-hooks on every decoder layer's MLP and its down_proj: (``seen``, filled with
    {mlp: {"x": its input, "h": down_proj's input}} by the next forward, the hooks to remove)."""
    seen: dict = {}
    hooks = []
    for layer in model.model.layers:
        mlp = layer.mlp
        hooks.append(mlp.register_forward_pre_hook(lambda m, args: seen.setdefault(m, {}).update(x=args[0])))
        hooks.append(mlp.down_proj.register_forward_pre_hook(
            lambda m, args, mlp=mlp: seen.setdefault(mlp, {}).update(h=args[0])))
    return seen, hooks


def tiny_gemma(dtype: torch.dtype, seed: int = 0):
    """A 2-layer GemmaForCausalLM (hidden 64, intermediate 128, 4 heads of 16, 2 kv heads; its MLPs'
    act_fn GELUTanh) in ``dtype``, dense."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("transformers.models.gemma.modeling_gemma")
    config = transformers.GemmaConfig(vocab_size=61, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                                      max_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return transformers.GemmaForCausalLM(config).to(dtype).eval()


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.bfloat16, 2.0 ** -6), (torch.float32, 1e-5)])
def test_tiny_gemma_fused_with_geglu(dtype, tolerance, kernel_calls):
    """A tiny transformers Gemma sparsified with fuse=True, glu=True (the bf16 weights' kernel; x in
    the model's type) gives the logits of the same pruned model fused without it, within the
    roundings GeGLU in the kernel saves: bf16's (g and u rounded before the product there) or
    float32's (one evaluation against another; equal here); each down_proj input is within its
    float64 bound. (Measured: bf16 logits 0.002 apart at a largest |logit| of 1.42.)"""
    from sparsile.tests.integrations.test_torch_fuse import PROMPT, logits

    model = tiny_gemma(dtype)
    plain = copy.deepcopy(model)
    keep = lambda m, fqn: "lm_head" not in fqn  # noqa: E731
    report = spt.sparsify_(model, keep, "bf16", interpret=True, min_features=16, fuse=True, glu=True)
    assert len(report.swapped) == 14
    mlps = [f"model.layers.{i}.mlp.gate_proj+up_proj" for i in range(2)]
    assert report.fusion.glu == dict.fromkeys(mlps, "geglu") and not report.fusion.no_glu
    assert spt.sparsify_(plain, keep, "bf16", interpret=True, min_features=16, fuse=True, glu=False).fusion.glu == {}
    for a, b in zip(model.modules(), plain.modules()):  # the same pruned weights
        if isinstance(a, spt.SparseLinear):
            assert torch.equal(a.values, b.values) and torch.equal(a.meta, b.meta)
    seen, hooks = capture_mlp_inputs(model)
    kernel_calls.clear()
    got = logits(model, PROMPT)
    for h in hooks:
        h.remove()
    assert [a for a, _ in kernel_calls].count("geglu") == 2  # one per layer: GeGLU in the kernel
    want = logits(plain, PROMPT)
    assert got.dtype == dtype and torch.isfinite(got).all()
    scale = want.float().abs().max()
    assert scale > 0.1
    assert (got.float() - want.float()).abs().max() <= tolerance * scale
    assert len(seen) == 2
    for mlp, io_ in seen.items():
        check_glu(fused_gate_up(mlp), io_["x"], io_["h"], "geglu")


def test_gated_layer_reads_its_2f_rows():
    """The gated layer's out_features is F, its buffers the fused 2F rows: to_dense and
    check_metadata work on those rows (the fused layer's)."""
    block = sparse_block()
    spt.fuse_projections_(block, glu=True)
    gated = block.mlp.__dict__["forward"].__self__.linear
    fused = fused_gate_up(block.mlp)
    assert gated.out_features == F and fused.out_features == 2 * F and gated.activation == "swiglu"
    assert torch.equal(gated.to_dense(), fused.to_dense())
    gated.check_metadata()
    from sparsile.stdlib.sparsity import SparsityError

    with pytest.raises(SparsityError) as info:
        gated.check_metadata(torch.zeros_like(fused.meta))  # code 0x0 is not a 2:4 pattern
    assert info.value.code == "SP0807" and "row 0" in info.value.message


def test_glu_flag_is_checked_and_its_removal_reported():
    block = sparse_block()
    for call, where, value in ((lambda: spt.fuse_projections_(block, glu="no"), "fuse_projections_", "'no'"),
                               (lambda: spt.sparsify_(block, interpret=True, min_features=16, fuse=True, glu=1),
                                "sparsify_", "1")):
        with pytest.raises(IntegrationError) as err:
            call()
        assert err.value.code == "SP0907"
        assert err.value.message == f"{where}: glu must be True or False, got {value}"
    with pytest.raises(IntegrationError) as err:
        spt.sparsify_(block, interpret=True, min_features=16, glu=True)
    assert err.value.code == "SP0907"
    assert err.value.message == "sparsify_: glu=True applies to fused gate/up projections, but fuse is not set"
    assert "forward" not in block.mlp.__dict__  # nothing was fused by the refused calls
    spt.fuse_projections_(block, glu=True)
    report = spt.fuse_projections_(block, traced=True, glu=False)  # the MLP's own forward again
    assert report.glu_removed == [KEY] and "forward" not in block.mlp.__dict__
    assert str(report) == ("fuse_projections_: 0 projection groups fused, 1 already fused, 0 skipped; "
                           "gated activation removed from 1 MLP (glu=False)")
    assert spt.fuse_projections_(block, glu=False).glu_removed == []  # nothing left to remove
    assert spt.fuse_projections_(block).glu == {KEY: "swiglu"}  # glu=True, the default: fused again
    fresh = sparse_block()  # sparsify_'s default: the gated activation wherever gate/up are fused
    assert spt.sparsify_(fresh, interpret=True, min_features=16, fuse=True).fusion.glu == {KEY: "swiglu"}
    assert "forward" not in sparse_block().mlp.__dict__  # (and nothing fused without fuse)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize(("dtype", "x_dtype", "out_dtype"), [
    ("f16", torch.float16, None), ("bf16", torch.bfloat16, torch.float32), ("bf16", torch.bfloat16, torch.float16),
    ("e4m3", torch.bfloat16, None), ("e4m3", torch.bfloat16, torch.float32)])
def test_fallback_equals_the_unfused_computation(dtype, x_dtype, out_dtype, activation):
    """Above 64 tokens the op's gated activation is the no-activation result in the output type,
    then F.silu or F.gelu(approximate="tanh") and the product: the same bits, for every weight type
    and output type."""
    layer = gate_up(dtype, seed=4)
    x = torch.randn(2, 40, HIDDEN).to(x_dtype)
    if dtype == "e4m3":
        xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
        args = (xq, layer.values, layer.meta, layer.bias, sx, layer.scale_w)
    else:
        args = (x, layer.values, layer.meta, layer.bias)
    y = torch.ops.sparsile.sparse_linear(*args, activation=activation, out_dtype=out_dtype)
    z = torch.ops.sparsile.sparse_linear(*args, out_dtype=out_dtype)
    assert y.shape == (2, 40, F) and y.dtype == z.dtype
    assert torch.equal(y, GATES[activation](z[..., :F]) * z[..., F:])


@pytest.mark.parametrize("tokens", [4, 65])
def test_a_bad_x_of_a_gated_mlp_names_the_user_s_layer(tokens):
    """The gated forward's layer is internal (fuse_projections_ builds it): a bad x names SparseLinear,
    as above 64 tokens (it named GatedLinear at up to 64)."""
    block = sparse_block()
    spt.fuse_projections_(block, glu=True)
    with pytest.raises(IntegrationError) as info:
        block.mlp(torch.ones(tokens, HIDDEN, dtype=torch.int32))
    assert (info.value.code, info.value.message) == ("SP0901", "x has dtype torch.int32; SparseLinear takes "
                                                               "bfloat16, float16 or float32 x")


def _exact_and_tanh_geglu(fused, x):
    """(exact-GELU geglu, tanh-GELU geglu, the bound of a float32 evaluation of the first) of the fused
    [gate; up] layer on x (rounded to the weight's bf16 first, as the layer does), in float64: each
    pre-activation's float32 accumulation (K terms) carried through GELU (|gelu'| <= 1.13) and the
    product, and the float32 roundings of GELU and the product."""
    import math

    xd = x.to(torch.bfloat16).double()
    w, b = fused.to_dense().double(), fused.bias.double()
    pre = xd @ w.T + b
    err = (w.shape[1] + 2) * 2.0 ** -24 * (xd.abs() @ w.abs().T + b.abs())
    g, u, eg, eu = pre[:, :F], pre[:, F:], err[:, :F], err[:, F:]
    exact_g = 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))
    tanh_g = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    bound = 1.13 * eg * (u.abs() + eu) + exact_g.abs() * eu + 2 * 2.0 ** -24 * (exact_g * u).abs() \
        + 2.0 ** -24 * exact_g.abs() * u.abs()
    return exact_g * u, tanh_g * u, bound


@pytest.mark.parametrize("change", ["approximate", "partial"])
def test_an_act_fn_attribute_reassigned_after_fusing_is_computed(change, kernel_calls):
    """nn.GELU(approximate="tanh") made "none" after fuse_projections_(glu=True) (or a GELUTanh-style
    act's function replaced by exact GELU): the MLP computes exact GELU, as the unfused one does.
    The fused forward kept the tanh approximation gate_activation saw at fusing (up to 6e-3 off here),
    a silent wrong result; it now compares act_fn's attributes per call and runs the class forward
    when one changed."""
    act = torch.nn.GELU(approximate="tanh") if change == "approximate" else PartialGELU()
    block = sparse_block(LlamaLikeMLP(act=act))
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "geglu"}
    # float32, pre-activations of a few units: where exact and tanh GELU differ most, far above the roundings
    x = 0.05 * torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(5))
    kernel_calls.clear()
    down_inputs(block.mlp, x)
    assert kernel_calls[0] == ("geglu", "f32")  # fused into the kernel
    if change == "approximate":
        block.mlp.act_fn.approximate = "none"
    else:
        block.mlp.act_fn.act = functools.partial(torch.nn.functional.gelu, approximate="none")
    kernel_calls.clear()
    _, h = down_inputs(block.mlp, x)
    exact, tanh, bound = _exact_and_tanh_geglu(fused_gate_up(block.mlp), x)
    assert ((exact - tanh).abs() > 4 * bound).any()  # the bound tells the two apart
    assert ((h.double() - exact).abs() <= bound).all(), ((h.double() - exact).abs() / bound).max().item()
    assert kernel_calls[0] == (None, "f32")  # gate and up as siblings, then act_fn: exact GELU
    if change == "approximate":  # back to the tanh form: fused again once fuse_projections_ runs
        block.mlp.act_fn.approximate = "tanh"
        assert spt.fuse_projections_(block, glu=True).glu == {KEY: "geglu"}
        kernel_calls.clear()
        down_inputs(block.mlp, x)
        assert kernel_calls[0] == ("geglu", "f32")


def compiled(act, fn=None):
    """``act`` after ``act.compile(backend="eager")`` (nn.Module.compile: torch.compile of its own
    ``_call_impl`` stored as the instance's ``_compiled_call_impl``), or with ``fn`` compiled there
    instead (not its own call)."""
    if fn is None:
        act.compile(backend="eager")
    else:
        act._compiled_call_impl = torch.compile(fn, backend="eager")
    return act


@pytest.mark.parametrize(("act", "gate"), [
    (compiled(torch.nn.SiLU()), "silu"), (compiled(torch.nn.GELU(approximate="tanh")), "gelu_tanh"),
    (compiled(SiLUByHand()), "silu"), (compiled(PartialGELU()), "gelu_tanh"), (compiled(torch.nn.GELU()), None),
    (compiled(torch.nn.SiLU(), torch.nn.functional.relu), None),
    (compiled(torch.nn.SiLU(), torch.nn.SiLU()._call_impl), None),  # another module's call
])
def test_gate_activation_of_a_compiled_act(act, gate):
    """act_fn.compile() runs the module's own forward through Dynamo: the same function, still fused;
    anything else stored as its compiled call is not vouched for."""
    assert gate_activation(act) == gate


def inline_compiled(act, call_of=None):
    """``act`` with, as its compiled call, ``torch.compile`` of ``wrap_inline`` of ``call_of``'s
    ``_call_impl`` (default act's own): what torch 2.14's ``act.compile()`` stores for torch's own
    modules (nn.SiLU, nn.GELU: Dynamo wraps the bound method in an extra frame it can trace)."""
    from torch._dynamo import external_utils

    call = (act if call_of is None else call_of)._call_impl
    act._compiled_call_impl = torch.compile(external_utils.wrap_inline(call), backend="eager")
    return act


@pytest.mark.parametrize(("act", "gate"), [
    (inline_compiled(torch.nn.SiLU()), "silu"), (inline_compiled(torch.nn.GELU(approximate="tanh")), "gelu_tanh"),
    (inline_compiled(torch.nn.GELU()), None),
    (inline_compiled(torch.nn.SiLU(), torch.nn.ReLU()), None),  # another module's call
    (inline_compiled(torch.nn.SiLU(), torch.nn.SiLU()), None),  # another SiLU's: not vouched for either
])
def test_gate_activation_of_a_compiled_act_through_wrap_inline(act, gate):
    """torch 2.14's act.compile() of nn.SiLU stores Dynamo's compiled call of ``wrap_inline(act._call_impl)``,
    not of the bound method itself: it was refused there (the gated activation no longer fused under
    torch 2.14), though it runs the module's own call as torch 2.13's does."""
    assert gate_activation(act) == gate


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("when", ["before", "after"])
def test_an_act_fn_compiled_before_or_after_fusing_stays_fused(activation, when, kernel_calls):
    """act_fn.compile() (nn.Module.compile: ``_compiled_call_impl`` added to its __dict__) before
    fuse_projections_(glu=True) kept the gated activation out of the kernel (the report's no_glu),
    and after it made the fused forward's per-call check of act_fn fail, so every call ran the
    unfused forward: both correct and slower. The compiled module's own call is vouched for; a
    reassigned attribute is still seen after it (exact GELU then computed, unfused)."""
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)))
    if when == "before":
        compiled(block.mlp.act_fn)
    report = spt.fuse_projections_(block, glu=True)
    assert report.glu == {KEY: activation} and report.no_glu == {}
    if when == "after":
        compiled(block.mlp.act_fn)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    kernel_calls.clear()
    _, h = down_inputs(block.mlp, x)
    assert kernel_calls[0] == (activation, "bf16")  # fused into the kernel
    check_glu(fused_gate_up(block.mlp), x, h, activation)
    if activation == "geglu":
        block.mlp.act_fn.approximate = "none"
        kernel_calls.clear()
        down_inputs(block.mlp, x)
        assert kernel_calls[0] == (None, "bf16")  # gate and up as siblings, then the (compiled) exact GELU
    block.mlp.act_fn._compiled_call_impl = torch.compile(torch.nn.functional.relu, backend="eager")
    kernel_calls.clear()
    down_inputs(block.mlp, x)
    assert kernel_calls[0] == (None, "bf16")  # not its own call: the class's forward runs it


def _wrapping(fn, factor: float):
    """A function wrapped with functools.wraps (as timing or logging decorators do), which copies
    ``fn.__dict__``, Dynamo's ``_torchdynamo_orig_callable`` included, but computes ``factor * fn``."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) * factor
    return wrapper


def test_a_wrapper_of_the_compiled_call_that_computes_something_else_is_not_vouched_for(kernel_calls):
    """compiled_own_call took any function carrying ``_torchdynamo_orig_callable`` = act's own
    ``_call_impl``; functools.wraps copies that attribute onto a wrapper of the compiled call, so a
    wrapper that doubles the activation was taken as act_fn itself and the kernel's SiLU replaced it
    (half the right answer). Dynamo's own wrapper is a functools.wraps of that bound method: its
    ``__wrapped__`` is the callable it compiles, a wrapper's is the compiled function."""
    act = compiled(torch.nn.SiLU())
    act._compiled_call_impl = _wrapping(act._compiled_call_impl, 2.0)
    assert gate_activation(act) is None
    block = sparse_block(LlamaLikeMLP(act=act_module("swiglu")))
    report = spt.fuse_projections_(block, glu=True)
    assert report.glu == {KEY: "swiglu"}
    act = block.mlp.act_fn
    compiled(act)
    act._compiled_call_impl = _wrapping(act._compiled_call_impl, 2.0)
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    kernel_calls.clear()
    _, h = down_inputs(block.mlp, x)
    assert kernel_calls[0] == (None, "bf16")  # the MLP's own forward: act_fn's call, doubled
    check_glu(fused_gate_up(block.mlp), x, h / 2, "swiglu", unfused=True)  # (halving is exact in bf16)
