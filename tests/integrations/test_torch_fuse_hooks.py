"""fuse_projections_ without the gated activation (q/k/v, and gate/up with ``glu=False``) against the
unfused members, for what a member's call may meet besides x: its hooks (forward pre-hooks, forward
hooks, full backward hooks, backward pre-hooks; the member's own, registered before or after fusing,
and the global ones), an output written in place (by a forward hook or by the model), x made to
require grad (or not) between sibling calls, and ``torch.func.functional_call`` with a member's
buffers substituted. Outputs are compared with the unfused members' bit for bit (the CPU
interpreter computes each column from its own weight row) and with float64; x's gradient with
float64 (the fused run's is one product per group, the unfused members' are added in bf16)."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import EPS, check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch.projection_group import fused_group_of  # noqa: E402

K = 64
SIZES = {"q_proj": 32, "k_proj": 16, "v_proj": 16, "gate_proj": 32, "up_proj": 32}
MEMBERS = tuple(SIZES)
PARENT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}
GROUPS = ["attn.q_proj+k_proj+v_proj", "mlp.gate_proj+up_proj"]


class Block(torch.nn.Module):
    """An attention's q/k/v and an MLP's gate/up, sparse (the CPU interpreter); the forward returns the
    five projections of x, each called through its parent (as a decoder layer calls them)."""

    def __init__(self, edit: str | None = None):
        super().__init__()
        self.edit = edit  # a member whose output the forward writes in place (doubles), through the head split
        self.attn, self.mlp = torch.nn.Module(), torch.nn.Module()
        for i, (name, n) in enumerate(SIZES.items()):
            setattr(getattr(self, PARENT[name]), name, spt.SparseLinear.from_dense(linear(n, K, seed=i)))

    def member(self, name: str) -> torch.nn.Module:
        return getattr(getattr(self, PARENT[name]), name)

    def forward(self, x):
        ys = tuple(self.member(name)(x) for name in MEMBERS)
        if self.edit is not None:
            y = ys[MEMBERS.index(self.edit)]
            y.view(*y.shape[:-1], 2, SIZES[self.edit] // 2).transpose(-3, -2).mul_(2)
        return ys


def pair() -> tuple[Block, Block]:
    """(a Block fused with glu=False, its unfused twin with the same weights)."""
    block = Block()
    plain = copy.deepcopy(block)
    assert spt.fuse_projections_(block, glu=False).fused == GROUPS
    return block, plain


def x_of(seed: int = 5) -> torch.Tensor:
    return torch.randn(3, K, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def upstream() -> dict[str, torch.Tensor]:
    """A random gradient for each member's output (bf16 numbers: exact as the output's gradient)."""
    gen = torch.Generator().manual_seed(11)
    return {name: torch.randn(3, n, generator=gen).to(torch.bfloat16).float() for name, n in SIZES.items()}


def loss_of(ys: list[torch.Tensor], grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return sum((y.float() * grads[name]).sum() for name, y in zip(MEMBERS, ys))


def check_x_grad(block: Block, got: torch.Tensor, grads: dict[str, torch.Tensor], scale: dict[str, float]) -> None:
    """x's gradient == sum over the members of scale * dy @ W, in float64 from each member's dense
    weight, within bf16 rounding of each member's product and of their sum (one rounding per member,
    unfused; per group, fused), and the f32 accumulation: about 2 % of the magnitude sum |c dy| @ |W|,
    where a member's missing or doubled part is of the order of its share of it."""
    ref = torch.zeros(3, K, dtype=torch.float64)
    magnitude = torch.zeros(3, K, dtype=torch.float64)
    for name, c in scale.items():
        w = block.member(name).to_dense().double()
        ref += c * grads[name].double() @ w
        magnitude += abs(c) * grads[name].double().abs() @ w.abs()
    bound = (len(scale) + 1) * EPS[torch.bfloat16] * magnitude + 1.2 * K * 2.0 ** -23 * magnitude + 1e-6
    assert got.shape == ref.shape and torch.isfinite(got).all()
    err = (got.double() - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3f}"
    assert (err <= bound / 8).mean(dtype=torch.float64) > 0.5  # (the bound is loose; most are far inside it)


def both_with_grad(block: Block, plain: Block, handles: list, x: torch.Tensor,
                   grads: dict[str, torch.Tensor]) -> tuple:
    """:func:`run_with_grad` of the fused block and of its unfused twin on x and the upstream
    gradients, the hook ``handles`` removed afterwards: (got, got_grad, want, want_grad)."""
    try:
        got, got_grad = run_with_grad(block, x, grads)
        want, want_grad = run_with_grad(plain, x, grads)
    finally:
        for h in handles:
            h.remove()
    return got, got_grad, want, want_grad


def run_with_grad(block: Block, x: torch.Tensor, grads: dict[str, torch.Tensor]):
    """(the outputs, x's gradient) of a loss over the five outputs."""
    x = x.clone().requires_grad_()
    ys = block(x)
    loss_of(ys, grads).backward()
    return [y.detach() for y in ys], x.grad


# ------------------------------------------------------------------------------------------------
# an output written in place


def _double_in_place(module, args, output):
    output.mul_(2)  # (returns None: the output as written)


@pytest.mark.parametrize(("how", "member"), [*(("hook", m) for m in MEMBERS),
                                             *((how, m) for how in ("hook_before_fusing", "global_hook", "model")
                                               for m in ("k_proj", "up_proj"))])
def test_an_output_written_in_place_keeps_its_gradient(how, member):
    """A member's output written in place while x requires grad (a forward hook that edits it, as
    steering hooks do, the member's own or a global one; or the model, here through the head split
    ``.view(..., heads, head_dim).transpose`` then ``mul_``). Unfused, the member's output is a
    tensor of its own; fused, it was one of ``split_with_sizes``' column views of the fused output,
    which autograd refuses to write in place ("Output 0 of SplitWithSizes is a view and is being
    modified inplace ... returns multiple views"): a RuntimeError the unfused model does not raise.
    Under grad mode the columns are single slices now: the same outputs and x's gradient."""
    block = Block(edit=member if how == "model" else None)
    plain = copy.deepcopy(block)
    hooked = []
    if how == "hook_before_fusing":
        for b in (block, plain):
            hooked.append(b.member(member).register_forward_hook(_double_in_place))
    assert spt.fuse_projections_(block, glu=False).fused == GROUPS
    if how == "hook":
        for b in (block, plain):
            hooked.append(b.member(member).register_forward_hook(_double_in_place))
    targets = (block.member(member), plain.member(member))
    if how == "global_hook":
        hooked.append(torch.nn.modules.module.register_module_forward_hook(
            lambda m, args, out: _double_in_place(m, args, out) if any(m is t for t in targets) else None))
    x, grads = x_of(), upstream()
    got, got_grad, want, want_grad = both_with_grad(block, plain, hooked, x, grads)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    for name, y in zip(MEMBERS, got):
        check_against_float64(block.member(name), x, y / 2 if name == member else y)  # (/ 2: exact)
    scale = {name: 2.0 if name == member else 1.0 for name in MEMBERS}
    check_x_grad(block, got_grad, grads, scale)
    check_x_grad(plain, want_grad, grads, scale)
    assert fused_group_of(block.member(member)) is not None  # (fused throughout)


@pytest.mark.parametrize("member", ["k_proj", "up_proj"])
def test_an_output_written_in_place_with_a_trainable_tensor_gets_its_gradient(member):
    """x needs no gradient, but a forward hook adds a trainable steering vector to a member's output
    in place: with grad mode on, split_with_sizes' views refused that write (a RuntimeError) although
    the fused output needs no gradient; the vector's gradient is the sum of the output's."""
    block, plain = pair()
    x = x_of()
    grads = upstream()
    got = []
    for b in (block, plain):
        steer = torch.nn.Parameter(torch.linspace(-1, 1, SIZES[member]).to(torch.bfloat16))
        b.member(member).register_forward_hook(lambda m, args, out, steer=steer: out.add_(steer))
        ys = b(x)
        loss_of(ys, grads).backward()
        got.append((ys, steer.grad))
    (ys, g), (want, want_g) = got
    assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(ys, want))
    assert torch.equal(g, want_g)
    # (3 bf16 terms, summed exactly in f32 and rounded once)
    assert torch.allclose(g.double(), grads[member].double().sum(0), rtol=2 ** -8, atol=0)


def test_an_output_written_in_place_under_torch_compile_with_traced_fusion():
    """``traced=True``: the trace's fused op split its output with ``split_with_sizes`` too, and
    Dynamo failed on a forward hook writing a member's output in place while x requires grad (its
    fake run: the multi-output view error); compiled, the outputs and x's gradient are the unfused
    model's (compiled too), with one fused op per group in the graph. (aot_eager: Dynamo's "eager"
    backend runs the graph's ops eagerly, and there the unfused op's own output, a view made in its
    autograd Function, cannot be written in place either.)"""
    block = Block()
    plain = copy.deepcopy(block)
    assert spt.fuse_projections_(block, traced=True, glu=False).fused == GROUPS
    grads = upstream()
    x = x_of()
    results = []
    for b in (block, plain):
        b.member("k_proj").register_forward_hook(_double_in_place)
        ops: list[str] = []

        def backend(gm, example_inputs, ops=ops):
            ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "sparsile" in str(n.target))
            return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)  # (autograd as compiled)

        torch._dynamo.reset()
        try:
            results.append((*run_with_grad(torch.compile(b, backend=backend, fullgraph=True), x, grads), ops))
        finally:
            torch._dynamo.reset()
    (got, got_grad, ops), (want, want_grad, want_ops) = results
    assert ops.count("sparsile.sparse_linear") == 2 and want_ops.count("sparsile.sparse_linear") == 5
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    scale = {name: 2.0 if name == "k_proj" else 1.0 for name in MEMBERS}
    check_x_grad(block, got_grad, grads, scale)
    check_x_grad(plain, want_grad, grads, scale)


# ------------------------------------------------------------------------------------------------
# x made to require grad, or not, between sibling calls


@pytest.mark.parametrize("member", ["k_proj", "v_proj", "up_proj"])
@pytest.mark.parametrize("flip", [True, False], ids=["on", "off"])
def test_x_made_to_require_grad_between_sibling_calls(member, flip):
    """A forward pre-hook on a member served from a sibling's fused run makes x (a leaf) require grad
    (``flip``, as a saliency method does) or stop requiring it. ``requires_grad`` changes neither x's
    identity nor its version: the member was served the sibling's run, made off the autograd graph
    (x's gradient silently lacked this member's part and its later siblings') or on it (outputs that
    the unfused members give without a graph). The run now also holds x's ``requires_grad``: the
    member gets a run of its own, as unfused."""
    block, plain = pair()
    grads = upstream()
    x = x_of()
    results = []
    for b in (block, plain):
        xb = x.clone().requires_grad_(not flip)
        b.member(member).register_forward_pre_hook(lambda m, args: args[0].requires_grad_(flip))
        ys = b(xb)
        on_graph = [name for name, y in zip(MEMBERS, ys) if y.requires_grad]
        if flip:
            loss_of(ys, grads).backward()
        results.append((on_graph, xb.grad, [y.detach() for y in ys]))
    (on_graph, got, ys), (want_on_graph, want, want_ys) = results
    i = MEMBERS.index(member)
    assert want_on_graph == list(MEMBERS[i:] if flip else MEMBERS[:i])  # (the unfused model: the reference)
    assert on_graph == want_on_graph
    assert all(torch.equal(a, b) for a, b in zip(ys, want_ys))
    if flip:
        scale = {name: 1.0 for name in MEMBERS[i:]}
        check_x_grad(block, got, grads, scale)
        check_x_grad(plain, want, grads, scale)


# ------------------------------------------------------------------------------------------------
# hooks of every kind


def _register(kind: str, module: torch.nn.Module, seen: list, targets: tuple) -> object:
    """Register a hook of ``kind`` that changes what it sees (x doubled before the call, the output
    doubled, grad_input or grad_output tripled) on ``module``, or globally (``global_*``) for the
    modules ``targets`` only."""
    def pre(m, args):
        seen.append(m)
        return (args[0] * 2,)

    def fwd(m, args, out):
        seen.append(m)
        return out * 2

    def bwd(m, grad_input, grad_output):
        seen.append(m)
        return (grad_input[0] * 3,)

    def bwd_pre(m, grad_output):
        seen.append(m)
        return (grad_output[0] * 3,)

    fn = {"forward_pre": pre, "forward": fwd, "backward": bwd, "backward_pre": bwd_pre}[kind.removeprefix("global_")]
    if kind.startswith("global_"):
        register = {"forward_pre": torch.nn.modules.module.register_module_forward_pre_hook,
                    "forward": torch.nn.modules.module.register_module_forward_hook,
                    "backward": torch.nn.modules.module.register_module_full_backward_hook,
                    "backward_pre": torch.nn.modules.module.register_module_full_backward_pre_hook}[
                        kind.removeprefix("global_")]

        def only(m, *args):
            return fn(m, *args) if any(m is t for t in targets) else None
        return register(only)
    register = {"forward_pre": module.register_forward_pre_hook, "forward": module.register_forward_hook,
                "backward": module.register_full_backward_hook,
                "backward_pre": module.register_full_backward_pre_hook}[kind]
    return register(fn)


KINDS = ("forward_pre", "forward", "backward", "backward_pre")


HOOKED = ("q_proj", "k_proj", "up_proj")
"""The members hooked: q_proj starts its group's fused run, k_proj and up_proj are served from one."""


@pytest.mark.parametrize("kind", [*KINDS, *(f"global_{k}" for k in KINDS)])
@pytest.mark.parametrize("when", ["before", "after"])
def test_the_members_hooks_run_as_unfused(kind, when):
    """Every member's call goes through its own ``nn.Module.__call__`` (fusing replaces no call, only
    what the member's forward computes): its hooks, and the global ones, run as on the unfused model,
    registered before or after fusing. The same outputs, each hook called once per hooked member, and
    x's gradient of float64 with the hooks' factors."""
    block = Block()
    plain = copy.deepcopy(block)
    seen: list = []
    handles = []
    targets = tuple(b.member(name) for b in (block, plain) for name in HOOKED)
    hooked = (targets[0],) if kind.startswith("global_") else targets  # (a global hook: registered once)
    if when == "before":
        handles += [_register(kind, m, seen, targets) for m in hooked]
    assert spt.fuse_projections_(block, glu=False).fused == GROUPS
    if when == "after":
        handles += [_register(kind, m, seen, targets) for m in hooked]
    x, grads = x_of(), upstream()
    got, got_grad, want, want_grad = both_with_grad(block, plain, handles, x, grads)
    assert sorted(map(id, seen)) == sorted(map(id, targets))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    base = kind.removeprefix("global_")
    for name, y in zip(MEMBERS, got):
        if name in HOOKED and base == "forward_pre":
            check_against_float64(block.member(name), x * 2, y)
        else:
            check_against_float64(block.member(name), x, y / 2 if name in HOOKED and base == "forward" else y)
    factor = {"forward_pre": 2.0, "forward": 2.0, "backward": 3.0, "backward_pre": 3.0}[base]
    scale = {name: factor if name in HOOKED else 1.0 for name in MEMBERS}
    check_x_grad(block, got_grad, grads, scale)
    check_x_grad(plain, want_grad, grads, scale)


# ------------------------------------------------------------------------------------------------
# torch.func.functional_call


@pytest.mark.parametrize("name", ["k_proj.bias", "v_proj.values"])
def test_functional_call_with_a_member_s_buffer_substituted(name):
    """``functional_call`` puts the substituted tensor in the member's ``_buffers`` (no setattr): the
    group finds a member without its view and runs unfused, with the substitute; the model's own
    buffers are back afterwards, and it computes as the unfused model."""
    block, plain = pair()
    x = x_of()
    full = f"attn.{name}"
    original = plain.get_buffer(full)
    new = original.flip(0).clone() if name.endswith("values") else original * 2 + 1
    with torch.no_grad():
        got = torch.func.functional_call(block, {full: new}, (x,))
        want = torch.func.functional_call(plain, {full: new}, (x,))
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        member = name.split(".")[0]
        i = MEMBERS.index(member)
        assert not torch.equal(got[i], plain.member(member)(x))  # (the substitute was used)
        assert all(torch.equal(a, b) for a, b in zip(block(x), plain(x)))


def test_a_parametrized_fused_bias_is_no_key_error():
    """The run's stamp reads the fused layer's tensors as getattr finds them: a parametrization on its bias
    (torch moves the name out of ``_buffers``) gave a KeyError from the stamp on the second member's call."""
    from torch.nn.utils import parametrize

    block = Block()
    for i, name in enumerate(MEMBERS):
        block.member(name).bias = torch.randn(SIZES[name], generator=torch.Generator().manual_seed(i))
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block, glu=False)
    fused = fused_group_of(block.attn.q_proj).fused

    class Same(torch.nn.Module):
        def forward(self, b):
            return b

    parametrize.register_parametrization(fused, "bias", Same())
    x = x_of()
    with torch.no_grad():
        for got, want in zip(block(x), plain(x), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["bias", "values"])
def test_functional_call_on_a_member_between_sibling_calls(name):
    """``functional_call`` on one member, between its siblings' calls with the same x (a custom
    forward substituting that member's tensor): the member is not served the sibling's fused run,
    made with the tensor it holds no longer (its old columns, without a word), but computes with the
    substitute, as unfused; the group runs unfused from then on."""
    block, plain = pair()
    x = x_of()
    results = []
    for b in (block, plain):
        new = b.attn.k_proj.get_buffer(name)
        new = new * 2 + 1 if name == "bias" else new.flip(0).clone()
        with torch.no_grad():
            q = b.attn.q_proj(x)
            k = torch.func.functional_call(b.attn.k_proj, {name: new}, (x,))
            v = b.attn.v_proj(x)
        results.append((q, k, v))
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(results[0][1], plain.attn.k_proj(x))  # (the substitute was used)
    assert fused_group_of(block.attn.k_proj) is None
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(block(x), plain(x)))


def test_a_member_s_bias_made_trainable_between_sibling_calls():
    """A forward pre-hook makes a served member's bias require grad (a bias to train, set up on the
    first call): the member was served the sibling's run, made with a bias needing no gradient (its
    output off the graph, the bias's gradient silently None); now the group runs unfused, as a
    group with a trainable bias does, and the bias's gradient is the unfused one (the sum of the
    output's gradient over the rows)."""
    block, plain = pair()
    x = x_of()
    grads = upstream()
    got = []
    for b in (block, plain):
        m = b.member("k_proj")
        m.register_forward_pre_hook(lambda mod, args: (mod.bias.requires_grad_(True), None)[1])
        ys = b(x)
        assert ys[1].requires_grad
        loss_of(ys, grads).backward()
        got.append(([y.detach() for y in ys], m.bias.grad))
    (ys, g), (want, want_g) = got
    assert all(torch.equal(a, b) for a, b in zip(ys, want))
    assert g is not None and torch.equal(g, want_g)
    torch.testing.assert_close(g.double(), grads["k_proj"].double().sum(0), rtol=2 ** -8, atol=0)
    assert fused_group_of(block.member("k_proj")) is None


def test_inference_mode_left_between_sibling_calls():
    """q_proj under ``inference_mode``, k_proj and v_proj after it under plain ``no_grad`` on the same
    (inference) x: k's output is a normal tensor, written in place as unfused (served from q's run, it was
    an inference tensor: "Inplace update to inference tensor outside InferenceMode")."""
    block, plain = pair()
    with torch.inference_mode():
        x = x_of()
    outs = []
    for model in (block, plain):
        with torch.inference_mode():
            q = model.attn.q_proj(x)
        with torch.no_grad():
            k, v = model.attn.k_proj(x), model.attn.v_proj(x)
            assert not k.is_inference() and not v.is_inference()
            k.mul_(2)
        outs.append((q, k, v))
    for got, want in zip(*outs, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("member", ["k_proj", "up_proj"])
def test_x_given_another_dtype_at_the_same_address_between_sibling_calls(member):
    """A sibling's x reinterpreted between the calls (``x.data = x.view(torch.float16)``: the same object, memory,
    shape and strides, and no version bump) must run as unfused on what x now is: a float16 output of the
    float16 numbers. Before, the run stamp held no dtype: the sibling was served its bfloat16 columns of
    the run of the old x, without a word."""
    block, plain = pair()
    first = "q_proj" if PARENT[member] == "attn" else "gate_proj"
    outs = []
    for model in (block, plain):
        x = x_of()
        with torch.no_grad():
            model.member(first)(x)
            x.data = x.data.view(torch.float16)
            outs.append(model.member(member)(x))
    assert outs[0].dtype == torch.float16
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    check_against_float64(block.member(member), x, outs[0])
