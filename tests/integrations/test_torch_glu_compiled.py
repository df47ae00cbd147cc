"""The gated activation fused into a sparse gated MLP whose act_fn is ``torch.compile(act_fn)``:
Dynamo's OptimizedModule wrapping the original module (integrations/torch/compiled_act.py), on the
CPU (the interpreter). What torch.compile makes of an act that gate_activation takes is taken as
that act (the fused forward, checked against float64); anything else that looks like it (a
subclass with its own forward, a forward or ``_orig_mod`` replaced, state or hooks added,
``torch._dynamo.disable``, a compiled act that is not a gate) is refused with a reason; the fused
forward's per-call checks see the wrapper and the module it wraps (``_orig_mod`` reassigned,
``approximate`` changed, a hook on either: the MLP's own forward)."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import check_glu

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch.compiled_act import compiled_module_of  # noqa: E402
from sparsile.integrations.torch.glu import GatedForward, gate_activation  # noqa: E402
from sparsile.tests.integrations.test_torch_glu import (  # noqa: E402
    ACTIVATIONS,
    HIDDEN,
    KEY,
    LlamaLikeMLP,
    PartialGELU,
    SiLUByHand,
    act_module,
    down_inputs,
    fused_gate_up,
    sparse_block,
    sparse_ops_in_compiled_graph,
)
from sparsile.tests.integrations.test_torch_glu import kernel_calls as kernel_calls  # noqa: E402 (a fixture)

OptimizedModule = torch._dynamo.eval_frame.OptimizedModule


def opt(act):
    """``torch.compile(act)`` with the eager backend (Dynamo's wrapper; no Inductor compile on the CPU)."""
    wrapper = torch.compile(act, backend="eager")
    assert type(wrapper) is OptimizedModule
    return wrapper


class PretendingWrapper(OptimizedModule):
    """An OptimizedModule subclass with a forward of its own: not what torch.compile makes."""

    def forward(self, x):
        return 2 * self._orig_mod(x)


def pretending(act):
    wrapper = PretendingWrapper(act, opt(torch.nn.Identity()).dynamo_ctx)
    del wrapper.__dict__["forward"]  # (its class's forward, as a subclass that defines one would run)
    return wrapper


def with_forward(wrapper, forward):
    wrapper.forward = forward  # (OptimizedModule keeps a forward set on it in its own __dict__)
    return wrapper


def with_orig(wrapper, module):
    wrapper._orig_mod = module  # (OptimizedModule keeps it in _modules; its forward still compiles the old one)
    return wrapper


def with_state(wrapper, name, value):
    wrapper.__dict__[name] = value
    return wrapper


def hooked(module):
    module.register_forward_hook(lambda m, args, out: None)
    return module


def own_compiled(module):
    module.compile(backend="eager")
    return module


def other_wrapper_forward():
    """A torch.compile wrapper of SiLU whose forward is that of a wrapper of tanh GELU."""
    return with_forward(opt(torch.nn.SiLU()), opt(torch.nn.GELU(approximate="tanh")).forward)


NOT_TORCH_COMPILES = "is not what torch.compile(module) makes"


@pytest.mark.parametrize(("make", "gate"), [
    (lambda: opt(torch.nn.SiLU()), "silu"), (lambda: opt(torch.nn.GELU(approximate="tanh")), "gelu_tanh"),
    (lambda: opt(SiLUByHand()), "silu"),  # (Dynamo compiles its __call__, not a wrap_inline of it)
    (lambda: opt(PartialGELU()), "gelu_tanh"), (lambda: opt(own_compiled(torch.nn.SiLU())), "silu"),
    (lambda: torch.compile(torch.nn.SiLU(), disable=True), "silu"),  # (the module itself)
    (lambda: opt(torch.nn.GELU()), None), (lambda: opt(torch.nn.ReLU()), None),
    (lambda: opt(PartialGELU("none")), None),
    (lambda: opt(hooked(torch.nn.SiLU())), None), (lambda: hooked(opt(torch.nn.SiLU())), None),
    (lambda: pretending(torch.nn.SiLU()), None),
    (lambda: with_forward(opt(torch.nn.SiLU()), torch.nn.functional.relu), None),
    (other_wrapper_forward, None),
    (lambda: with_orig(opt(torch.nn.ReLU()), torch.nn.SiLU()), None),
    (lambda: with_state(opt(torch.nn.SiLU()), "scale", 2.0), None),
    (lambda: torch._dynamo.disable(torch.nn.SiLU()), None),
    (lambda: torch.compile(opt(torch.nn.SiLU()), backend="eager"), None),  # (a function, not a module)
])
def test_gate_activation_of_torch_compile_of_an_act(make, gate):
    """torch.compile(act) is taken as act where it is exactly what torch.compile makes of a module:
    Dynamo's wrapper of that module's own call, nothing added (was: any OptimizedModule refused)."""
    assert gate_activation(make()) == gate


def test_what_compiled_module_of_says():
    silu = torch.nn.SiLU()
    assert compiled_module_of(silu) == (None, None)  # not a wrapper
    assert compiled_module_of(opt(silu)) == (silu, None)
    cases = {
        "a subclass of OptimizedModule": pretending(silu),
        "its forward is not Dynamo's compiled call of the module it wraps": with_forward(opt(silu), torch.relu),
        "its forward compiles another module's call than the one it wraps": with_orig(opt(silu), torch.nn.ReLU()),
        "it holds state torch.compile does not give it: scale": with_state(opt(silu), "scale", 2.0),
        "it has forward hooks": hooked(opt(silu)),
        "its Dynamo context is DisableContext, not torch.compile's OptimizeContext": torch._dynamo.disable(silu),
    }
    for why, wrapper in cases.items():
        assert compiled_module_of(wrapper) == (None, why)
    assert compiled_module_of(other_wrapper_forward())[1] == \
        "its forward is not Dynamo's compiled call of the module it wraps"  # (made by another wrapper's context)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [3, 65])
def test_torch_compile_of_act_fn_is_fused(activation, tokens, kernel_calls):
    """``mlp.act_fn = torch.compile(mlp.act_fn)`` before fuse_projections_(glu=True): the gated
    activation in the kernel (the fallback above 64 tokens), against float64, as for the act itself."""
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)))
    plain = copy.deepcopy(block)
    block.mlp.act_fn = opt(block.mlp.act_fn)
    report = spt.fuse_projections_(block, glu=True)
    assert report.fused == [KEY] and report.glu == {KEY: activation} and report.no_glu == {}
    assert isinstance(block.mlp.__dict__["forward"].__self__, GatedForward)
    x = torch.randn(1, tokens, HIDDEN, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    kernel_calls.clear()
    y, h = down_inputs(block.mlp, x)
    assert kernel_calls == ([(activation, "bf16"), (None, "bf16")] if tokens <= 64 else
                            [(None, "bf16"), (None, "bf16")])  # in the kernel or the fallback; down_proj
    check_glu(fused_gate_up(block.mlp), x, h, activation, unfused=tokens > 64)
    with torch.no_grad():
        assert torch.equal(y, block.mlp.down_proj(h))
        if tokens > 64:  # the fallback computes what the unfused MLP does, bit for bit
            spt.fuse_projections_(plain, glu=False)
            assert torch.equal(y, plain.mlp(x))


def test_a_transformers_act_compiled_is_fused(kernel_calls):
    activations = pytest.importorskip("transformers.activations")
    block = sparse_block(LlamaLikeMLP(act=opt(activations.ACT2FN["gelu_pytorch_tanh"])))
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "geglu"}
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    kernel_calls.clear()
    _, h = down_inputs(block.mlp, x)
    assert kernel_calls[0] == ("geglu", "bf16")
    check_glu(fused_gate_up(block.mlp), x, h, "geglu")


@pytest.mark.parametrize(("act", "reason"), [
    (lambda: opt(torch.nn.GELU()), "its act_fn (torch.compile of GELU, approximate='none') is exact GELU, not the "
                                   "tanh approximation the kernel applies"),
    (lambda: opt(torch.nn.ReLU()), "its act_fn (torch.compile of ReLU) is neither SiLU nor GELU with the tanh "
                                   "approximation"),
    (lambda: pretending(torch.nn.SiLU()), f"its act_fn (PretendingWrapper) {NOT_TORCH_COMPILES}: a subclass of "
                                          "OptimizedModule"),
    (lambda: with_orig(opt(torch.nn.GELU()), torch.nn.GELU(approximate="tanh")),
     f"its act_fn (OptimizedModule) {NOT_TORCH_COMPILES}: its forward compiles another module's call than the one "
     "it wraps"),
    (lambda: with_forward(opt(torch.nn.SiLU()), torch.nn.functional.silu),
     f"its act_fn (OptimizedModule) {NOT_TORCH_COMPILES}: its forward is not Dynamo's compiled call of the module "
     "it wraps"),
])
def test_torch_compile_of_act_fn_refused_with_a_reason(act, reason):
    block = sparse_block(LlamaLikeMLP(act=act()))
    report = spt.fuse_projections_(block, glu=True)
    assert report.fused == [KEY] and report.glu == {} and report.no_glu == {KEY: reason}
    assert "forward" not in block.mlp.__dict__


def unfused_call(block, seed, kernel_calls):
    """The MLP's output on 3 random tokens and its own class forward's, the kernel calls recorded."""
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    kernel_calls.clear()
    with torch.no_grad():
        return block.mlp(x), type(block.mlp).forward(block.mlp, x)


def _set_approximate(act):
    act.approximate = "none"  # (OptimizedModule sets it on the module it wraps)


def _swap_orig(act):
    act._orig_mod = torch.nn.GELU()


def _hook_inner(act):
    return act._orig_mod.register_forward_hook(lambda m, args, out: None)


def _hook_wrapper(act):
    return act.register_forward_hook(lambda m, args, out: None)


def _replace_forward(act):
    act.forward = opt(torch.nn.GELU()).forward


def _compile_inner(act):
    act._orig_mod._compiled_call_impl = torch.compile(torch.nn.functional.gelu, backend="eager")


@pytest.mark.parametrize("change", [_set_approximate, _swap_orig, _hook_inner, _hook_wrapper, _replace_forward,
                                    _compile_inner])
def test_a_compiled_act_fn_changed_after_fusing_runs_the_mlp_s_forward(change, kernel_calls):
    """After fusing, the wrapper or the module it wraps changed (``approximate`` "none", ``_orig_mod``
    reassigned, a hook on either, its forward replaced, another compiled call on the module): the
    MLP's own forward, which calls act_fn (gate and up as siblings, then torch's activation)."""
    block = sparse_block(LlamaLikeMLP(act=torch.nn.GELU(approximate="tanh")))
    block.mlp.act_fn = opt(block.mlp.act_fn)
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "geglu"}
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    kernel_calls.clear()
    down_inputs(block.mlp, x)
    assert kernel_calls[0] == ("geglu", "bf16")
    change(block.mlp.act_fn)
    kernel_calls.clear()
    with torch.no_grad():
        y = block.mlp(x)
        want = type(block.mlp).forward(block.mlp, x)
    assert kernel_calls[0] == (None, "bf16") and kernel_calls[2] == (None, "bf16")  # gate and up as siblings
    assert torch.equal(y, want)


def test_act_fn_compiled_after_fusing_runs_unfused_until_fused_again(kernel_calls):
    """Replacing act_fn by torch.compile(act_fn) after fusing replaces the child: the MLP's own forward
    until fuse_projections_ runs again, which fuses the compiled act (was: refused)."""
    block = sparse_block(LlamaLikeMLP(act=torch.nn.SiLU()))
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    block.mlp.act_fn = opt(block.mlp.act_fn)
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    kernel_calls.clear()
    down_inputs(block.mlp, x)
    assert kernel_calls[0] == (None, "bf16")
    report = spt.fuse_projections_(block, glu=True)
    assert report.glu == {KEY: "swiglu"} and report.no_glu == {}
    kernel_calls.clear()
    _, h = down_inputs(block.mlp, x)
    assert kernel_calls[0] == ("swiglu", "bf16")
    check_glu(fused_gate_up(block.mlp), x, h, "swiglu")


def test_compiling_the_act_again_after_fusing_keeps_it_fused(kernel_calls):
    """torch.compile(act) leaves a marker on act (torch 2.13: ``_is_torch_compile``, which
    OptimizedModule's __setattr__ forwards to the module it wraps) and ``act.compile()`` its compiled
    call: neither changes what act computes, so a fused MLP whose act_fn (or the module its
    torch.compile wrapper wraps) gains them stays fused (was, for the marker: an attribute added,
    every call unfused)."""
    block = sparse_block(LlamaLikeMLP(act=SiLUByHand()))
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    opt(block.mlp.act_fn)  # (a compiled copy kept elsewhere; act_fn itself not replaced)
    kernel_calls.clear()
    _, h = down_inputs(block.mlp, x)
    assert kernel_calls[0] == ("swiglu", "bf16")
    check_glu(fused_gate_up(block.mlp), x, h, "swiglu")
    block.mlp.act_fn = opt(block.mlp.act_fn)
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    own_compiled(block.mlp.act_fn._orig_mod)
    kernel_calls.clear()
    _, h = down_inputs(block.mlp, x)
    assert kernel_calls[0] == ("swiglu", "bf16")
    check_glu(fused_gate_up(block.mlp), x, h, "swiglu")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_torch_compile_of_a_model_whose_act_fn_is_compiled(activation):
    """The whole MLP traced by torch.compile(fullgraph=True) with act_fn a torch.compile wrapper: the
    class forward (gate and up as the group's one op, then act_fn), which computes what the eager class
    forward does. Dynamo traces the wrapper as the module it wraps and failed an internal assertion
    ("already tracked for mutation") where the fused forward compared act_fn with its own reference."""
    block = sparse_block(LlamaLikeMLP(act=act_module(activation)))
    block.mlp.act_fn = opt(block.mlp.act_fn)
    assert spt.fuse_projections_(block, traced=True, glu=True).glu == {KEY: activation}
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    ops, got = sparse_ops_in_compiled_graph(block.mlp, x)
    assert ops == [("sparsile.sparse_linear", None)] * 2  # [gate; up] as one op, then down_proj
    with torch.no_grad():
        assert torch.equal(got, type(block.mlp).forward(block.mlp, x))


# ------------------------------------------------------------------------------------------------
# the compile backend: torch's own trusted, a user's not


def doubling(gm, example_inputs):
    """A backend of the user's that changes what the graph computes (twice its outputs)."""
    def run(*args):
        out = gm(*args)
        return [2 * o for o in out] if isinstance(out, (list, tuple)) else 2 * out
    return run


def eager(gm, example_inputs):
    """A backend of the user's named as torch's eager one, that changes what the graph computes."""
    return doubling(gm, example_inputs)


def _optimized_by_hand(act):
    return OptimizedModule(act, torch._dynamo.optimize(doubling))


def _own_compiled_by(backend):
    module = torch.nn.SiLU()
    module.compile(backend=backend)
    return module


def _inner_compiled_by(backend):
    wrapper = opt(torch.nn.SiLU())
    wrapper._orig_mod.compile(backend=backend)
    return wrapper


def _testing_backend(act):
    return torch.compile(act, backend="relu_accuracy_error_TESTING_ONLY")


@pytest.mark.parametrize(("make", "gate"), [
    (lambda: torch.compile(torch.nn.SiLU()), "silu"),  # (Inductor: nothing compiled until called)
    (lambda: torch.compile(torch.nn.SiLU(), mode="reduce-overhead"), "silu"),
    (lambda: torch.compile(torch.nn.SiLU(), dynamic=True, options={"max_autotune": True}), "silu"),
    (lambda: torch.compile(torch.nn.SiLU(), backend="aot_eager"), "silu"),
    (lambda: torch.compile(torch.nn.SiLU(), backend="eager", fullgraph=True), "silu"),
    (lambda: OptimizedModule(torch.nn.SiLU(), opt(torch.nn.Identity()).dynamo_ctx), "silu"),  # (torch.compile's)
    (lambda: _own_compiled_by("aot_eager"), "silu"), (lambda: _inner_compiled_by("eager"), "silu"),
    (lambda: torch.compile(torch.nn.SiLU(), backend=doubling), None),
    (lambda: torch.compile(torch.nn.SiLU(), backend=eager), None),  # (named eager, not torch's)
    (lambda: _testing_backend(torch.nn.SiLU()), None),  # (torch's, but changes the graph)
    (lambda: _optimized_by_hand(torch.nn.SiLU()), None),
    (lambda: _own_compiled_by(doubling), None), (lambda: _inner_compiled_by(doubling), None),
])
def test_only_torch_s_own_backends_are_trusted(make, gate):
    """torch.compile(act) or act.compile() with a backend of torch's own that computes what its graph
    computes (Inductor in any mode, eager, aot_eager) is taken as act; a backend callable of the user's
    may compute anything (was: taken, and the fused kernel's silu replaced what act_fn computes)."""
    assert gate_activation(make()) == gate


def test_a_user_backend_is_refused_with_a_reason():
    assert compiled_module_of(torch.compile(torch.nn.SiLU(), backend=doubling)) == (
        None, "its compile backend (doubling) is not one of inductor, eager, aot_eager, aot_eager_decomp_partition, "
              "cudagraphs")
    assert compiled_module_of(_optimized_by_hand(torch.nn.SiLU()))[1] == (
        "its compile backend (not torch.compile's) is not one of inductor, eager, aot_eager, "
        "aot_eager_decomp_partition, cudagraphs")


def test_an_mlp_whose_act_fn_a_user_backend_compiles_is_not_fused(kernel_calls):
    """The MLP computes what its act_fn computes under that backend (twice silu here): not fused, its
    own forward (was: fused, the kernel's silu, 920 away from the MLP's own output)."""
    block = sparse_block(LlamaLikeMLP(act=torch.nn.SiLU()))
    block.mlp.act_fn = torch.compile(block.mlp.act_fn, backend=doubling)
    report = spt.fuse_projections_(block, glu=True)
    assert report.glu == {} and report.no_glu == {KEY: (
        f"its act_fn (OptimizedModule) {NOT_TORCH_COMPILES}: its compile backend (doubling) is not one of "
        "inductor, eager, aot_eager, aot_eager_decomp_partition, cudagraphs")}
    y, want = unfused_call(block, 10, kernel_calls)
    assert kernel_calls[0] == (None, "bf16") and torch.equal(y, want)


def test_the_wrapped_module_compiled_by_a_user_backend_after_fusing_runs_the_mlp_s_forward(kernel_calls):
    block = sparse_block(LlamaLikeMLP(act=torch.nn.SiLU()))
    block.mlp.act_fn = opt(block.mlp.act_fn)
    assert spt.fuse_projections_(block, glu=True).glu == {KEY: "swiglu"}
    block.mlp.act_fn._orig_mod.compile(backend=doubling)
    y, want = unfused_call(block, 11, kernel_calls)
    assert kernel_calls[0] == (None, "bf16") and torch.equal(y, want)


# ------------------------------------------------------------------------------------------------
# another torch version's structure (torch 2.11 on the GPU machine): refused, never raised


def _set_cell(fn, name, value):
    fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents = value


class OldLink:
    """A link of Dynamo's callback chain as older torch versions name it (``_torchdynamo_orig_callable``)."""

    __module__ = "torch._dynamo.convert_frame"

    def __init__(self, inner):
        self._torchdynamo_orig_callable = inner


class RaisingLink:
    """A link of Dynamo's callback chain whose attributes raise."""

    __module__ = "torch._dynamo.convert_frame"

    def __getattr__(self, name):
        raise RuntimeError(name)


def _innermost(wrapper):
    return torch._dynamo.eval_frame.innermost_backend(wrapper.dynamo_ctx.callback)


def test_a_callback_chain_named_as_in_older_torch_is_followed():
    wrapper = opt(torch.nn.SiLU())
    _set_cell(wrapper.forward, "callback", OldLink(OldLink(_innermost(wrapper))))
    assert gate_activation(wrapper) == "silu"


def test_a_callback_chain_that_raises_is_refused():
    wrapper = opt(torch.nn.SiLU())
    _set_cell(wrapper.forward, "callback", RaisingLink())
    assert compiled_module_of(wrapper)[1] == (
        "its compile backend (not recognized) is not one of inductor, eager, aot_eager, aot_eager_decomp_partition, "
        "cudagraphs")
    assert gate_activation(wrapper) is None


class FakeContext:
    """A torch version whose ``_TorchDynamoContext.__call__`` makes a ``compile_wrapper`` without a
    ``callback`` closure variable (the backend it runs not to be found)."""

    def __call__(self, fn):
        def compile_wrapper(*args, **kwargs):
            return self, fn(*args, **kwargs)
        return compile_wrapper


def test_a_compile_wrapper_without_a_callback_is_refused(monkeypatch):
    """Where the backend cannot be found, the wrapper is refused (was: taken, its backend unchecked)."""
    from sparsile.integrations.torch import compiled_act
    eval_frame = torch._dynamo.eval_frame
    wrapper = opt(torch.nn.SiLU())
    monkeypatch.setattr(eval_frame, "_TorchDynamoContext", FakeContext)
    compiled_act._dynamo_codes.cache_clear()
    try:
        wrapper.__dict__["forward"] = FakeContext.__call__(wrapper.dynamo_ctx, wrapper._orig_mod.__call__)
        assert compiled_module_of(wrapper) == (None, "its forward is not Dynamo's compiled call of the module it wraps")
        assert gate_activation(wrapper) is None
    finally:
        monkeypatch.undo()
        compiled_act._dynamo_codes.cache_clear()


def test_an_optimized_module_type_not_a_class_is_refused_not_raised(monkeypatch):
    """``isinstance`` of an OptimizedModule that is not a class (another torch's structure) raised
    TypeError out of fuse_projections_; now the MLP is fused without the gated activation."""
    block = sparse_block(LlamaLikeMLP(act=opt(torch.nn.SiLU())))
    monkeypatch.setattr(torch._dynamo.eval_frame, "OptimizedModule", lambda *args: None)
    report = spt.fuse_projections_(block, glu=True)
    assert report.fused == [KEY] and report.glu == {} and report.no_glu == {
        KEY: f"its act_fn (OptimizedModule) {NOT_TORCH_COMPILES}: it could not be inspected (TypeError)"}
