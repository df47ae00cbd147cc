"""sparsify_(fuse=True) on tiny random transformers models of the architectures users try after Llama
(CPU, the interpreter, 2 layers, hidden 64): what is swapped, what is skipped or left out and why,
which groups fuse (q/k/v with biases, gate/up, the gated activation only where it is the kernel's
exactly), and the logits against the same model with the pruned weights dense, in float64 (as close
to it as that bf16 dense model is: the tolerance of the Llama tests in test_torch_sparsify.py)."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import dense_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch.projection_group import fused_group_of  # noqa: E402

SMALL = dict(vocab_size=61, hidden_size=64, num_hidden_layers=2, bos_token_id=None, eos_token_id=None,
             pad_token_id=None)
HEADS = dict(intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
PROMPT = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))
LAYERS = range(2)


def build(config, model_class, attention: str = "sdpa"):
    """``model_class(config)`` with random weights (seed 0) in bf16, eval mode."""
    config._attn_implementation = attention
    torch.manual_seed(0)
    return model_class(config).to(torch.bfloat16).eval()


def sparsified(model, **kwargs):
    """(the model sparsified in place with fuse=True, glu=True; the report; a dense copy from before)."""
    before = copy.deepcopy(model)
    report = spt.sparsify_(model, interpret=True, min_features=16, fuse=True, **kwargs)
    return report, before


def check_logits(model, before, report) -> None:
    """The sparsified model's logits are within 1.25x the bf16 dense model's error of the float64 model
    with the same pruned weights (each swapped linear replaced by a dense one of its pruned weight)."""
    twin = copy.deepcopy(before)
    for name in report.swapped:
        parent, _, child = name.rpartition(".")
        setattr(twin.get_submodule(parent), child, dense_twin(model.get_submodule(name)))
    with torch.no_grad():
        got = model(input_ids=PROMPT).logits.double()
        exact = copy.deepcopy(twin).double()(input_ids=PROMPT).logits
        bf16 = twin(input_ids=PROMPT).logits.double()
    assert torch.isfinite(got).all() and exact.abs().max() > 0.1
    bf16_error = ((bf16 - exact).norm() / exact.norm()).item()
    assert 0 < ((got - exact).norm() / exact.norm()).item() <= 1.25 * bf16_error


def names(pattern: str) -> list[str]:
    return [pattern.format(i=i) for i in LAYERS]


ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
QKV = "model.layers.{i}.self_attn.q_proj+k_proj+v_proj"
GATE_UP = "model.layers.{i}.mlp.gate_proj+up_proj"


def llama_like(report, head: bool = True) -> None:
    assert report.swapped == [f"model.layers.{i}.{p}" for i in LAYERS for p in ATTENTION + MLP] + ["lm_head"] * head
    assert report.fusion.fused == [g.format(i=i) for i in LAYERS for g in (QKV, GATE_UP)]
    assert not report.fusion.skipped and not report.fusion.no_glu


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_qwen2_and_mistral(arch):
    """Qwen2 (q, k, v with biases, o without) and Mistral: every linear swapped, q/k/v fused (with the
    biases' rows), gate/up fused with SwiGLU in the kernel."""
    config_class, model_class = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                                 "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}[arch]
    model = build(config_class(**SMALL, **HEADS), model_class)
    report, before = sparsified(model)
    llama_like(report)
    assert report.skipped == {} and report.not_linear == {}
    assert report.fusion.glu == dict.fromkeys(names(GATE_UP), "swiglu")
    fused = fused_group_of(model.model.layers[0].self_attn.q_proj).fused
    assert (fused.bias is not None) == (arch == "qwen2")
    if arch == "qwen2":  # the fused bias is the three biases' rows
        attn = before.model.layers[0].self_attn
        assert torch.equal(fused.bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).float())
    check_logits(model, before, report)


def test_phi3_packed_gate_up_runs_the_gated_activation():
    """Phi-3's qkv_proj and gate_up_proj are single linears: swapped, and no group fuses (nothing to split
    twice); its MLP (gate, up = gate_up_proj(x).chunk(2), down_proj(up * silu(gate))) runs SwiGLU in the
    gated kernel over gate_up_proj's [gate; up] rows. Before, it kept its own activation and product."""
    model = build(transformers.Phi3Config(**SMALL, **HEADS), transformers.Phi3ForCausalLM)
    report, before = sparsified(model)
    assert report.swapped == [f"model.layers.{i}.{p}" for i in LAYERS for p in
                              ("self_attn.o_proj", "self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj")
                              ] + ["lm_head"]
    assert report.skipped == {} and report.not_linear == {}
    assert report.fusion.fused == [] and not report.fusion.skipped and not report.fusion.no_glu
    assert report.fusion.glu == dict.fromkeys(names("model.layers.{i}.mlp.gate_up_proj"), "swiglu")
    assert fused_group_of(model.model.layers[0].self_attn.qkv_proj) is None
    assert fused_group_of(model.model.layers[0].mlp.gate_up_proj).members == (model.model.layers[0].mlp.gate_up_proj,)
    assert "forward" in vars(model.model.layers[0].mlp)
    check_logits(model, before, report)


TIED = "its weight is tied to {}"


@pytest.mark.parametrize(("arch", "act", "glu"), [("gemma", "gelu_pytorch_tanh", "geglu"),
                                                  ("gemma", "gelu_new", "geglu"),
                                                  ("gemma2", "gelu", None),
                                                  ("gemma2", "gelu_pytorch_tanh", "geglu")])
def test_gemma_geglu_only_with_the_tanh_gelu(arch, act, glu):
    """Gemma / Gemma2 (tied head: dense with the reason): GeGLU in the kernel with the tanh GELU
    (torch's, or transformers' gelu_new formula); an exact-GELU MLP is fused as a group but keeps its
    own activation (the kernel's tanh form differs by up to 5e-4), with the reason. (Gemma's config turns
    hidden_act="gelu" into the tanh form itself; Gemma2's hidden_activation="gelu" is exact GELU.)"""
    config_class, model_class, attention = {
        "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM, "sdpa"),
        "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM, "eager")}[arch]
    model = build(config_class(**SMALL, **HEADS, head_dim=16, hidden_act=act, hidden_activation=act), model_class,
                  attention)  # (Gemma reads hidden_act, Gemma2 hidden_activation)
    exact_gelu = type(model.model.layers[0].mlp.act_fn).__name__ == "GELUActivation"
    assert exact_gelu == (act == "gelu")
    report, before = sparsified(model)
    assert report.swapped == [f"model.layers.{i}.{p}" for i in LAYERS for p in ATTENTION + MLP]
    assert list(report.skipped) == ["lm_head"] and report.skipped["lm_head"].startswith(
        TIED.format("model.embed_tokens.weight"))
    assert report.fusion.fused == [g.format(i=i) for i in LAYERS for g in (QKV, GATE_UP)]
    if glu is None:
        assert report.fusion.glu == {} and list(report.fusion.no_glu) == names(GATE_UP)
        assert set(report.fusion.no_glu.values()) == {
            "its act_fn (GELUActivation) is neither SiLU nor GELU with the tanh approximation"}
    else:
        assert report.fusion.glu == dict.fromkeys(names(GATE_UP), glu) and not report.fusion.no_glu
    check_logits(model, before, report)


def test_gpt_neox_fused_qkv_and_opt_biased_qkv():
    """GPT-NeoX (one query_key_value linear, exact-GELU MLP without a gate): every linear swapped,
    nothing fused; OPT (q/k/v with biases, ReLU MLP, tied head): q/k/v fused."""
    neox = build(transformers.GPTNeoXConfig(**SMALL, intermediate_size=128, num_attention_heads=4,
                                            max_position_embeddings=64), transformers.GPTNeoXForCausalLM)
    report, before = sparsified(neox)
    assert len(report.swapped) == 9 and report.skipped == {} and report.not_linear == {}
    assert report.fusion.fused == [] and report.fusion.glu == {}
    check_logits(neox, before, report)
    opt = build(transformers.OPTConfig(**SMALL, ffn_dim=128, num_attention_heads=4, word_embed_proj_dim=64,
                                       max_position_embeddings=64), transformers.OPTForCausalLM)
    report, before = sparsified(opt)
    assert len(report.swapped) == 12 and list(report.skipped) == ["lm_head"] and report.not_linear == {}
    assert report.fusion.fused == [f"model.decoder.layers.{i}.self_attn.q_proj+k_proj+v_proj" for i in LAYERS]
    check_logits(opt, before, report)


GPT2 = dict(vocab_size=61, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None)
GPT2_PROJECTIONS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def assert_pruned_along_inputs(pruned, conv_weight) -> None:
    """``pruned`` (out, in) is the Conv1D weight (in, out) transposed and pruned 2:4 along the inputs:
    of each four consecutive inputs of an output, at most two kept, unchanged, none smaller in magnitude
    than one dropped."""
    weight_t = conv_weight.detach().t().float()
    n, k = weight_t.shape
    groups, kept = weight_t.reshape(n, k // 4, 4), pruned.reshape(n, k // 4, 4) != 0
    assert (kept.sum(-1) <= 2).all() and torch.equal(pruned, torch.where(kept, groups, 0).reshape(n, k))
    smallest_kept = groups.abs().masked_fill(~kept, float("inf")).amin(-1)
    assert (groups.abs().masked_fill(kept, -1).amax(-1) <= smallest_kept).all()


def test_gpt2_conv1d_projections_are_swapped():
    """GPT-2's projections are transformers Conv1D modules (y = x @ W + b, W stored (in, out)): each is
    swapped for the SparseLinear of W.T (pruned 2:4 along the input dimension, its bias kept); the tied
    head stays dense. Before, they stayed dense, listed in report.not_linear with no way forward. The
    state_dict then holds each projection's values / meta / bias in the (out, in) orientation."""
    model = build(transformers.GPT2Config(**GPT2), transformers.GPT2LMHeadModel)
    report, before = sparsified(model)
    projections = [f"transformer.h.{i}.{p}" for i in LAYERS for p in GPT2_PROJECTIONS]
    assert report.swapped == projections and list(report.skipped) == ["lm_head"] and report.not_linear == {}
    assert report.fusion.fused == [] and not report.fusion.skipped
    c_attn = model.transformer.h[0].attn.c_attn
    assert type(c_attn) is spt.SparseLinear and (c_attn.in_features, c_attn.out_features) == (64, 192)
    dense = before.transformer.h[0].attn.c_attn
    assert torch.equal(c_attn.bias, dense.bias.float())
    assert_pruned_along_inputs(c_attn.to_dense(), dense.weight)
    keys = {k: tuple(v.shape) for k, v in model.state_dict().items() if k.startswith("transformer.h.0.attn.c_attn")}
    assert keys == {"transformer.h.0.attn.c_attn.values": (192, 32), "transformer.h.0.attn.c_attn.meta": (192, 2),
                    "transformer.h.0.attn.c_attn.bias": (192,)}
    check_logits(model, before, report)


def test_gpt2_sparse_checkpoint_loads_into_a_dense_or_sparsified_gpt2(tmp_path):
    """A sparsified GPT-2 saved with save_sparse24_checkpoint holds each Conv1D in GPT-2's layout, shape (in, out)
    (test_torch_conv1d_checkpoint.py); it loads into a dense GPT-2 (its Conv1D modules replaced) and into one
    sparsified first, to the same logits. Before, the file held (out, in) and a dense GPT-2 was SP0914."""
    config = transformers.GPT2Config(**{**GPT2, "n_layer": 1})
    model = build(config, transformers.GPT2LMHeadModel)
    fresh = build(config, transformers.GPT2LMHeadModel)
    with torch.no_grad():
        for p in fresh.parameters():
            p.normal_()
    spt.sparsify_(model, interpret=True, min_features=16)
    with pytest.warns(spt.VLLMLayoutWarning):
        spt.save_sparse24_checkpoint(model, tmp_path)
    dense = copy.deepcopy(fresh)
    spt.sparsify_(fresh, interpret=True, min_features=16)
    prompt = PROMPT[:, :4]
    for target in (dense, fresh):
        report = spt.load_sparse24_checkpoint(target, tmp_path)
        assert sorted(report.sparse) == sorted(f"transformer.h.0.{p}" for p in GPT2_PROJECTIONS)
        assert tuple(target.transformer.h[0].mlp.c_fc.values.shape) == (256, 32)
        with torch.no_grad():
            assert torch.equal(target(input_ids=prompt).logits, model(input_ids=prompt).logits)


def test_conv1d_alone_against_float64():
    """One Conv1D swapped (the root's child) computes x @ prune(W.T).T + b against float64, on random
    inputs; with trainable=True the SemiSparseLinear's master weight is W.T (out, in)."""
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(3)
    holder = torch.nn.Sequential(Conv1D(48, 64)).to(torch.bfloat16)
    torch.nn.init.normal_(holder[0].bias)
    weight, bias = holder[0].weight.detach().clone(), holder[0].bias.detach().clone()
    report = spt.sparsify_(holder, interpret=True, min_features=16)
    assert report.swapped == ["0"] and type(holder[0]) is spt.SparseLinear
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    w = holder[0].to_dense().double()
    assert_pruned_along_inputs(w.float(), weight)
    exact = x.double() @ w.T + bias.double()
    with torch.no_grad():
        got = holder(x).double()
    assert ((got - exact).norm() / exact.norm()).item() < 1e-2
    trained = torch.nn.Sequential(Conv1D(48, 64)).to(torch.bfloat16)
    report = spt.sparsify_(trained, interpret=True, min_features=16, trainable=True)
    assert report.swapped == ["0"] and type(trained[0]) is spt.SemiSparseLinear
    assert trained[0].weight.shape == (48, 64)


def test_conv1d_with_its_own_behaviour_stays_dense():
    """A Conv1D with a forward hook, or of a subclass with its own forward, stays dense with the reason
    (a SparseLinear would compute the plain x @ W + b and run no hook)."""
    from transformers.pytorch_utils import Conv1D

    class Scaled(Conv1D):
        def forward(self, x):
            return 2 * super().forward(x)

    model = torch.nn.Sequential(Conv1D(32, 32), Scaled(32, 32)).to(torch.bfloat16)
    model[0].register_forward_hook(lambda module, args, y: y * 2)
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == [] and report.not_linear == {}
    assert report.skipped == {
        "0": "it has forward hooks, which a SparseLinear in its place would not run (remove them, then register them "
             "on the SparseLinear)",
        "1": "Scaled defines its own forward: a SparseLinear would compute the plain linear x @ W + b instead"}


def test_falcon_linears_are_swapped():
    """Falcon's FalconLinear (an nn.Linear whose own forward is input @ W.T, then + bias: the plain linear,
    rounded once more) is swapped as an nn.Linear, without and with biases; the tied head stays dense.
    Before, each was skipped ("FalconLinear defines its own forward")."""
    for bias in (False, True):
        model = build(transformers.FalconConfig(**SMALL, num_attention_heads=4, bias=bias),
                      transformers.FalconForCausalLM)
        report, before = sparsified(model)
        assert report.swapped == [f"transformer.h.{i}.{p}" for i in LAYERS for p in (
            "self_attention.query_key_value", "self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")]
        assert list(report.skipped) == ["lm_head"] and report.not_linear == {}
        assert (model.transformer.h[0].mlp.dense_h_to_4h.bias is not None) == bias
        check_logits(model, before, report)


def test_a_linear_subclass_with_another_forward_stays_dense():
    """Only FalconLinear's forward (by its bytecode) counts as the plain linear: a subclass whose forward
    adds anything else keeps the reason."""

    class Shifted(torch.nn.Linear):
        def forward(self, input):
            hidden_states = input @ self.weight.T
            if self.bias is None:
                return hidden_states
            return hidden_states + self.bias + 1

    model = torch.nn.Sequential(Shifted(32, 32)).to(torch.bfloat16)
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.skipped == {"0": "Shifted defines its own forward: a SparseLinear would compute the plain linear "
                                   "x @ W.T + b instead"}


def test_mixtral_and_qwen2_moe_experts_are_reported():
    """Mixtral and Qwen2-MoE hold their experts as stacked 3-D weights (transformers 5), not nn.Linear:
    listed as kept dense; attention swapped and q/k/v fused; Qwen2-MoE's shared expert (a Llama MLP) gets
    SwiGLU in the kernel, its 1 x 64 shared_expert_gate is too small. The routers are no linears."""
    mixtral = build(transformers.MixtralConfig(**SMALL, **HEADS, num_local_experts=4, num_experts_per_tok=2,
                                               experts_implementation="eager"), transformers.MixtralForCausalLM)
    report, before = sparsified(mixtral)
    assert report.swapped == [f"model.layers.{i}.{p}" for i in LAYERS for p in ATTENTION] + ["lm_head"]
    assert report.skipped == {} and report.fusion.fused == names(QKV)
    assert list(report.not_linear) == names("model.layers.{i}.mlp.experts")
    assert report.not_linear["model.layers.0.mlp.experts"] == (
        "MixtralExperts holds its projections as stacked 3-D weights (gate_up_proj 4 x 256 x 64, down_proj "
        "4 x 64 x 128: one matrix per expert), not nn.Linear modules, and sparsile has no grouped (per-expert) "
        "kernel: they stay dense, the nn.Linear modules around them are treated as usual (to sparsify the experts, "
        "replace the module by one holding an nn.Linear per expert and projection, weight = the expert's matrix, "
        "with the same routing, then call sparsify_ again)")
    assert "not an nn.Linear, kept dense model.layers.1.mlp.experts: MixtralExperts holds" in str(report)
    check_logits(mixtral, before, report)
    qwen = build(transformers.Qwen2MoeConfig(**SMALL, **HEADS, moe_intermediate_size=64, num_experts=4,
                                             num_experts_per_tok=2, shared_expert_intermediate_size=128,
                                             experts_implementation="eager"), transformers.Qwen2MoeForCausalLM)
    report, before = sparsified(qwen)
    shared = ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")
    assert report.swapped == [f"model.layers.{i}.{p}" for i in LAYERS for p in ATTENTION + shared] + ["lm_head"]
    assert report.skipped == dict.fromkeys(names("model.layers.{i}.mlp.shared_expert_gate"),
                                           "too small to gain from 2:4 (1 x 64; min_features = 16)")
    assert report.fusion.glu == dict.fromkeys(names("model.layers.{i}.mlp.shared_expert.gate_proj+up_proj"),
                                              "swiglu")
    assert list(report.not_linear) == names("model.layers.{i}.mlp.experts")
    check_logits(qwen, before, report)


def test_a_filter_sees_conv1d_and_leaves_other_projections_unlisted():
    """filter_fn is called with transformers Conv1D modules too (they are swapped like nn.Linear): one that
    takes nn.Linear modules only keeps GPT-2's projections dense (counted as turned down); with any
    filter_fn the report lists no other projections (the filter chose which layers matter)."""
    config = transformers.GPT2Config(**{**GPT2, "n_layer": 1})
    model = build(config, transformers.GPT2LMHeadModel)
    seen = []
    report = spt.sparsify_(model, lambda m, fqn: seen.append(fqn) or isinstance(m, torch.nn.Linear), interpret=True,
                           min_features=16)
    assert seen == [f"transformer.h.0.{p}" for p in GPT2_PROJECTIONS] + ["lm_head"]
    assert report.swapped == [] and report.unfiltered == 4 and list(report.skipped) == ["lm_head"]
    report = spt.sparsify_(model, lambda m, fqn: True, interpret=True, min_features=16)
    assert report.swapped == [f"transformer.h.0.{p}" for p in GPT2_PROJECTIONS] and list(report.skipped) == ["lm_head"]
    mixtral = build(transformers.MixtralConfig(**SMALL, **HEADS, num_local_experts=4, num_experts_per_tok=2,
                                               experts_implementation="eager"), transformers.MixtralForCausalLM)
    report = spt.sparsify_(mixtral, lambda m, fqn: "lm_head" not in fqn, interpret=True, min_features=16)
    assert report.not_linear == {} and report.unfiltered == 1 and len(report.swapped) == 8
