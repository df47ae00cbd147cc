"""fuse_projections_: sibling SparseLinear layers (q/k/v, gate/up) run as one fused layer whose
buffers the children view. On the CPU (the interpreter): the metadata row-slice property it relies
on, a tiny transformers Llama fused against unfused (bit-identical without the gated activation:
``glu=False``; test_torch_glu.py tests the SwiGLU and GeGLU MLPs), one fused run per group per
forward, state dicts, fallback when a member is moved or replaced, copies, skipped groups, SP0944,
torch.compile (unfused inside, no graph break) and the serving rules (same x object and version)."""

from __future__ import annotations

import copy
import io
import logging
import pickle

import numpy as np
import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear
from sparsile.tests.integrations.torch_helpers import tiny_llama as dense_tiny_llama

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.errors import IntegrationError  # noqa: E402
from sparsile.integrations.torch.fuse import FuseReport  # noqa: E402
from sparsile.integrations.torch.projection_group import ProjectionGroup, fused_group_of  # noqa: E402
from sparsile.stdlib.sparsity import compress, encode_metadata  # noqa: E402

BUFFERS = ("values", "meta", "bias", "scale_w")


# ------------------------------------------------------------------------------------------------
# the metadata property


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_sm90_metadata_of_a_concatenation_is_the_row_slices(dtype):
    """The sm90 words of row-concatenated weights, sliced at multiples of 16 rows, are each part's own
    words (16-row blocks are encoded on their own); at a row count that is not a multiple of 16 they are not."""
    import ml_dtypes

    rng = np.random.default_rng(7)
    host = {"bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[dtype]
    k = 128
    parts = [rng.standard_normal((n, k)).astype(np.float32) for n in (48, 16, 32)]
    own = [encode_metadata(compress(p.astype(host), dtype, prune=True)[1], "sm90", dtype, k=k).data for p in parts]
    whole = encode_metadata(compress(np.concatenate(parts).astype(host), dtype, prune=True)[1], "sm90", dtype,
                            k=k).data
    start = 0
    for p, words in zip(parts, own):
        assert whole.shape[1] == words.shape[1] and np.array_equal(whole[start:start + len(p)], words)
        start += len(p)
    assert start == whole.shape[0]
    odd = [rng.standard_normal((n, k)).astype(np.float32) for n in (24, 40)]  # 24: the first block is split
    first = encode_metadata(compress(odd[0].astype(host), dtype, prune=True)[1], "sm90", dtype, k=k).data
    both = encode_metadata(compress(np.concatenate(odd).astype(host), dtype, prune=True)[1], "sm90", dtype, k=k).data
    assert first.shape[0] == 32 and not np.array_equal(both[:32], first)


# ------------------------------------------------------------------------------------------------
# a tiny Llama


def tiny_llama(seed: int = 0):
    """A 2-layer LlamaForCausalLM (hidden 64, intermediate 128, 4 heads, 2 kv heads) in bf16 with
    its projections sparse (the CPU interpreter), lm_head dense."""
    model = dense_tiny_llama(layers=2, seed=seed)
    report = spt.sparsify_(model, lambda m, fqn: "lm_head" not in fqn, interpret=True, min_features=16)
    assert len(report.swapped) == 14
    return model


PROMPT = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))
GROUPS = [f"model.layers.{i}.{g}" for i in range(2) for g in ("self_attn.q_proj+k_proj+v_proj",
                                                               "mlp.gate_proj+up_proj")]


def logits(model, ids=PROMPT):
    with torch.no_grad():
        return model(input_ids=ids).logits


def groups_of(model) -> list[ProjectionGroup]:
    layers = model.model.layers
    return [fused_group_of(g) for layer in layers for g in (layer.self_attn.q_proj, layer.mlp.gate_proj)]


@pytest.fixture(scope="module")
def llama_pair():
    model = tiny_llama()
    return model, logits(model)


def fused_copy(pair):
    model, unfused = pair
    model = copy.deepcopy(model)
    report = spt.fuse_projections_(model, glu=False)
    assert report.fused == GROUPS and report.skipped == {}
    return model, unfused


def test_fused_llama_equals_unfused_and_runs_once_per_group(llama_pair, caplog):
    model, _ = llama_pair
    model = copy.deepcopy(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.INFO, logger="sparsile.torch"):
        report = spt.fuse_projections_(model, glu=False)
    assert "fuse_projections_: 4 projection groups fused, 0 already fused, 0 skipped\n" in caplog.text
    assert "gated activation" not in caplog.text  # not asked for: not reported
    assert report.fused == GROUPS
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())
    attn = model.model.layers[0].self_attn
    group = fused_group_of(attn.q_proj)
    assert group is fused_group_of(attn.v_proj) and fused_group_of(attn.o_proj) is None
    assert group.fused.out_features == 64 + 32 + 32 and group.fused not in list(model.modules())
    base = group.fused.values.untyped_storage().data_ptr()
    for m in (attn.q_proj, attn.k_proj, attn.v_proj):  # views: no weight memory duplicated
        assert all(getattr(m, b) is None or getattr(m, b).untyped_storage().data_ptr()
                   == getattr(group.fused, b).untyped_storage().data_ptr() for b in BUFFERS)
        assert m.values.untyped_storage().data_ptr() == base and m.values.is_contiguous()
    calls = []
    for g in groups_of(model):
        real = g.fused.forward
        g.fused.forward = lambda x, real=real: (calls.append(x.shape), real(x))[1]
    # the CPU interpreter computes each output column from that column's weights alone: the fused
    # run gives the same bits as the three layers (a GPU kernel may split K differently per shape)
    assert torch.equal(logits(model), llama_pair[1])
    assert len(calls) == 4 and [g.runs for g in groups_of(model)] == [1, 1, 1, 1]
    assert all(g.pending is None for g in groups_of(model))  # every member served: the result is dropped
    with torch.inference_mode():  # inference tensors keep no version counter: served by identity
        assert torch.equal(model(input_ids=PROMPT).logits, llama_pair[1])
    assert [g.runs for g in groups_of(model)] == [2, 2, 2, 2]
    standalone = model.model.layers[1].mlp.up_proj  # each member still runs on its own
    x = torch.randn(3, 64).to(torch.bfloat16)
    ref = copy.deepcopy(llama_pair[0].model.layers[1].mlp.up_proj)
    y = standalone(x)
    assert torch.equal(y, ref(x)) and y.shape == (3, 128)
    check_against_float64(standalone, x, y)


def test_load_state_dict_copies_into_the_views(llama_pair):
    model, _ = fused_copy(llama_pair)
    other = tiny_llama(seed=5)
    expected = logits(other)
    assert not torch.equal(expected, llama_pair[1])
    buffer = io.BytesIO()
    torch.save(other.state_dict(), buffer)
    buffer.seek(0)
    result = model.load_state_dict(torch.load(buffer))
    assert not result.missing_keys and not result.unexpected_keys
    groups = groups_of(model)
    assert all(g is not None and not g.checked for g in groups)  # loading re-verifies on the next run
    assert torch.equal(logits(model), expected)
    assert groups_of(model) == groups and [g.runs for g in groups] == [1, 1, 1, 1]  # still fused
    saved = io.BytesIO()  # and a fused model's state dict round-trips (the views' shared storage saved once)
    torch.save(model.state_dict(), saved)
    saved.seek(0)
    back = copy.deepcopy(llama_pair[0])
    back.load_state_dict(torch.load(saved))
    assert torch.equal(logits(back), expected)


@pytest.mark.parametrize("how", ["setattr", "apply", "buffers", "data"])
def test_a_replaced_or_moved_member_falls_back(llama_pair, how, caplog):
    model, unfused = fused_copy(llama_pair)
    reference = copy.deepcopy(llama_pair[0])
    k_proj = model.model.layers[0].self_attn.k_proj
    group = fused_group_of(k_proj)
    changed = k_proj.values.flip(0).contiguous()  # other weights: stale fused weights would show
    if how == "setattr":
        k_proj.values = changed
    elif how == "buffers":  # no _invalidate: caught by the identity check of every fused run
        k_proj._buffers["values"] = changed
    elif how == "data":  # the same tensor on other memory: caught by the address check of every fused run
        k_proj.values.data = changed
    else:  # a device move makes new tensors (here: clones on the same device), then written in place;
        with caplog.at_level(logging.INFO, logger="sparsile.torch"):  # the group is released at once
            model.model.layers[0].self_attn._apply(lambda t: t.clone())
        assert "running the group unfused" in caplog.text and group.fused is None
        with torch.no_grad():
            k_proj.values.copy_(changed)
    reference.model.layers[0].self_attn.k_proj.values = changed.clone()
    expected = logits(reference)
    assert not torch.equal(expected, unfused)
    with caplog.at_level(logging.INFO, logger="sparsile.torch"):
        assert torch.equal(logits(model), expected)
    assert "unfused" in caplog.text
    assert fused_group_of(k_proj) is None and group.fused is None and group.runs == 0
    assert fused_group_of(model.model.layers[1].self_attn.k_proj) is not None  # the other layers stay fused
    report = spt.fuse_projections_(model, glu=False)  # fusing again picks the released group up
    assert report.fused == GROUPS[:1] and report.kept == GROUPS[1:] and report.skipped == {}
    assert torch.equal(logits(model), expected) and fused_group_of(k_proj).runs == 1


def test_sparse24_checkpoint_of_a_fused_model(llama_pair, tmp_path):
    """A fused model saves like the unfused one; loading a checkpoint swaps in new (unfused) layers,
    which fuse_projections_ fuses again."""
    model, _ = fused_copy(llama_pair)
    spt.save_sparse24_checkpoint(model, tmp_path / "fused")
    spt.save_sparse24_checkpoint(llama_pair[0], tmp_path / "plain")
    assert (tmp_path / "fused" / "model.safetensors").read_bytes() == (tmp_path / "plain" / "model.safetensors"
                                                                       ).read_bytes()
    other = tiny_llama(seed=5)
    expected = logits(other)
    spt.save_sparse24_checkpoint(other, tmp_path / "other")
    report = spt.load_sparse24_checkpoint(model, tmp_path / "other")
    assert len(report.sparse) == 14 and all(g is None for g in groups_of(model))
    assert torch.equal(logits(model), expected)
    assert spt.fuse_projections_(model, glu=False).fused == GROUPS and torch.equal(logits(model), expected)
    assert [g.runs for g in groups_of(model)] == [1, 1, 1, 1]


def test_save_pretrained_of_a_fused_model(llama_pair, tmp_path):
    """transformers' save_pretrained writes the same tensors for the fused model as for the unfused one."""
    safetensors = pytest.importorskip("safetensors.torch")
    model, _ = fused_copy(llama_pair)
    model.save_pretrained(tmp_path / "fused")
    llama_pair[0].save_pretrained(tmp_path / "plain")
    fused, plain = (safetensors.load_file(tmp_path / d / "model.safetensors") for d in ("fused", "plain"))
    assert sorted(fused) == sorted(plain) and all(torch.equal(fused[k], plain[k]) for k in plain)
    assert "model.layers.0.self_attn.k_proj.values" in fused


def test_fusing_a_moved_model_again(llama_pair):
    """After a move (new tensors for every buffer), fuse_projections_ releases the stale groups and
    fuses the moved layers, without a forward in between."""
    model, unfused = fused_copy(llama_pair)
    stale = groups_of(model)
    model._apply(lambda t: t.clone())
    assert spt.fuse_projections_(model, glu=False).fused == GROUPS
    fresh = groups_of(model)
    assert all(g.fused is None for g in stale) and not set(map(id, fresh)) & set(map(id, stale))
    assert torch.equal(logits(model), unfused) and [g.runs for g in fresh] == [1, 1, 1, 1]


def test_dtype_conversion_keeps_fusion(llama_pair):
    model, unfused = fused_copy(llama_pair)
    model.float()  # SparseLinear keeps its weight type: the views stay
    model.to(torch.bfloat16)
    assert torch.equal(logits(model), unfused) and all(g is not None and g.runs == 1 for g in groups_of(model))


def test_deepcopy_keeps_a_consistent_group_and_pickle_falls_back(llama_pair):
    model, unfused = fused_copy(llama_pair)
    twin = copy.deepcopy(model)  # deepcopy keeps views of one storage: the copy's group is its own
    q = twin.model.layers[0].self_attn.q_proj
    group = fused_group_of(q)
    assert group is not fused_group_of(model.model.layers[0].self_attn.q_proj)
    assert q.values.untyped_storage().data_ptr() == group.fused.values.untyped_storage().data_ptr()
    assert torch.equal(logits(twin), unfused) and [g.runs for g in groups_of(twin)] == [1, 1, 1, 1]
    with torch.no_grad():
        q.values.zero_()  # the copy's weights are its own
    assert torch.equal(logits(model), unfused) and not torch.equal(logits(twin), unfused)
    thawed = pickle.loads(pickle.dumps(model))  # plain pickle does not keep the shared storage
    q = thawed.model.layers[0].self_attn.q_proj
    assert q.values.untyped_storage().data_ptr() != fused_group_of(q).fused.values.untyped_storage().data_ptr()
    assert torch.equal(logits(thawed), unfused)
    assert all(g is None for g in groups_of(thawed))  # verified, found apart, released
    saved = io.BytesIO()
    torch.save(model, saved)  # torch.save keeps the shared storage: still fused
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert torch.equal(logits(loaded), unfused) and [g.runs for g in groups_of(loaded)] == [1, 1, 1, 1]


def test_torch_compile_runs_unfused_without_graph_breaks(llama_pair):
    model, unfused = fused_copy(llama_pair)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(input_ids=PROMPT)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        got = compiled(input_ids=PROMPT).logits
    assert torch.equal(got, unfused)
    assert [g.runs for g in groups_of(model)] == [0, 0, 0, 0]  # traced: each member's own op
    torch._dynamo.reset()


def sparse_ops_in_compiled_graph(model) -> tuple[list[str], torch.Tensor]:
    """The sparsile ops of the graph torch.compile traces for ``model`` on PROMPT, and its logits."""
    ops: list[str] = []

    def backend(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "sparsile" in str(n.target))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(input_ids=PROMPT).logits
    torch._dynamo.reset()
    return ops, got


def test_a_model_pickled_when_its_groups_lived_in_fuse_py_loads():
    """A fused model pickled before ProjectionGroup moved to projection_group.py names its class
    ``sparsile.integrations.torch.fuse.ProjectionGroup``: it still loads (fuse.py imports the class),
    and runs as the original (plain pickle does not keep the shared storage: released, unfused)."""
    block = Siblings()
    spt.fuse_projections_(block)
    data = pickle.dumps(block, protocol=0)  # (a text protocol: the module's name is one line)
    old = data.replace(b"sparsile.integrations.torch.projection_group\n", b"sparsile.integrations.torch.fuse\n")
    assert old != data and b"projection_group" not in old
    thawed = pickle.loads(old)
    assert isinstance(fused_group_of(thawed.q_proj), ProjectionGroup)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            check_against_float64(getattr(thawed, name), x, getattr(thawed, name)(x))
            assert torch.equal(getattr(thawed, name)(x), getattr(block, name)(x))


def test_traced_fusion_puts_one_op_per_group_in_the_compiled_graph(llama_pair):
    """fuse_projections_(traced=True): the torch.compile trace holds one fused sparse_linear per
    group (4 per layer instead of 7), with no graph break and the unfused logits."""
    model, unfused = llama_pair
    plain, _ = fused_copy(llama_pair)
    ops, got = sparse_ops_in_compiled_graph(plain)
    assert ops.count("sparsile.sparse_linear") == 14 and torch.equal(got, unfused)
    traced = copy.deepcopy(model)
    assert spt.fuse_projections_(traced, traced=True, glu=False).fused == GROUPS
    with torch.no_grad():
        explained = torch._dynamo.explain(traced)(input_ids=PROMPT)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    ops, got = sparse_ops_in_compiled_graph(traced)
    assert ops.count("sparsile.sparse_linear") == 8 and torch.equal(got, unfused)
    assert all(g.pending is None for g in groups_of(traced))  # nothing left held after the trace
    # reduce-overhead must not copy the fused weight into its graph per replay: marked static
    assert all(getattr(g.fused.values, "_dynamo_static_input_type", None) for g in groups_of(traced))
    assert not any(hasattr(g.fused.values, "_dynamo_static_input_type") for g in groups_of(plain))


def test_traced_fusion_of_a_replaced_member_runs_it_alone(llama_pair):
    model, unfused = llama_pair
    traced = copy.deepcopy(model)
    spt.fuse_projections_(traced, traced=True, glu=False)
    layer = traced.model.layers[0].self_attn
    with torch.no_grad():
        layer.k_proj.values = layer.k_proj.values.clone()  # no longer a view of the fused weight
    ops, got = sparse_ops_in_compiled_graph(traced)
    assert ops.count("sparsile.sparse_linear") == 10  # layer 0's q, k, v alone; the rest fused
    assert torch.equal(got, unfused)


# ------------------------------------------------------------------------------------------------
# the serving rules, the skip reasons, the diagnostics


class Siblings(torch.nn.Module):
    def __init__(self, sizes=(32, 16, 16), dtype=None, **kinds):
        super().__init__()
        for i, (name, n) in enumerate(zip(("q_proj", "k_proj", "v_proj"), sizes)):
            kind = kinds.get(name, {})
            layer = linear(n, 64, seed=i, bias=kind.pop("bias", True), dtype=kind.pop("x", torch.bfloat16))
            setattr(self, name, layer if kind.pop("dense", False) else
                    spt.SparseLinear.from_dense(layer, kind.pop("dtype", dtype), **kind))


def test_same_object_and_version_are_served_else_recomputed():
    block = Siblings()
    plain = copy.deepcopy(block)
    assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
    group = fused_group_of(block.q_proj)
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    q = block.q_proj(x)
    assert group.runs == 1 and q.shape == (2, 3, 32) and not q.is_contiguous()
    assert q.view(2, 3, 2, 16).shape == (2, 3, 2, 16)  # transformers' head split works on the column view
    assert torch.equal(q, plain.q_proj(x))
    x.add_(1)  # an in-place write between sibling calls: recomputed
    k = block.k_proj(x)
    assert group.runs == 2 and torch.equal(k, plain.k_proj(x))
    assert torch.equal(block.k_proj(x), k) and group.runs == 3  # k served already: a new run
    twin = x.clone()
    assert torch.equal(block.v_proj(twin), plain.v_proj(x)) and group.runs == 4  # another x object
    assert torch.equal(block.q_proj(twin), plain.q_proj(x)) and group.runs == 4  # served from that run
    assert group.pending is not None  # k is still owed
    assert torch.equal(block.k_proj(x), plain.k_proj(x)) and group.runs == 5  # equal values, not the object
    same = torch.randn(4, 64).to(torch.bfloat16)
    ys = [m(same) for m in (block.v_proj, block.q_proj, block.k_proj)]  # any order
    assert group.runs == 6 and group.pending is None
    for m, y in zip((plain.v_proj, plain.q_proj, plain.k_proj), ys):
        assert torch.equal(y, m(same))
    with pytest.raises(IntegrationError, match="x has shape") as err:  # a bad x: the layer's own diagnostic
        block.k_proj(torch.randn(2, 48).to(torch.bfloat16))
    assert err.value.code == "SP0901"


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("buffer", ["values", "bias", "scale_w"])
def test_a_weight_written_between_sibling_calls_is_recomputed(dtype, buffer):
    """A member's weight written in place after a sibling started the fused run (its bias, values or
    scales: views of the fused buffers, one version counter) is not served from that run, which
    computed with the weight from before: the member's columns were the old weight's (the bias
    off by 100 here, without a word)."""
    if buffer == "scale_w" and dtype != "e4m3":
        pytest.skip("16-bit weights have no scale_w")
    block = Siblings(dtype=dtype)
    assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
    x = torch.randn(5, 64).to(torch.bfloat16)
    check_against_float64(block.q_proj, x, block.q_proj(x))
    with torch.no_grad():
        written = getattr(block.k_proj, buffer)
        if buffer == "values":
            written.copy_(written.flip(0))  # (other rows' values under these metadata: another weight)
        else:
            written.mul_(2).add_(100)
    check_against_float64(block.k_proj, x, block.k_proj(x))
    check_against_float64(block.v_proj, x, block.v_proj(x))  # (served from the new run)
    check_against_float64(block.q_proj, x, block.q_proj(x))


def test_a_sibling_called_with_grad_after_a_run_without_gets_its_gradient():
    """A run started under ``torch.no_grad()`` holds outputs outside the autograd graph: a sibling
    called next with the same x (requiring grad) and grad mode on gets an output of its own, on the
    graph (it was served the no-grad columns: x's gradient silently lacked its part)."""
    block = Siblings()
    plain = copy.deepcopy(block)
    assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
    x = torch.randn(3, 64).requires_grad_()
    with torch.no_grad():
        block.q_proj(x)
    k = block.k_proj(x)
    assert k.requires_grad
    k.float().sum().backward()
    x2 = x.detach().clone().requires_grad_()
    plain.k_proj(x2).float().sum().backward()
    assert torch.equal(x.grad, x2.grad)


def _bias_grads(block, x):
    """The members' bias gradients (and x's) of a loss over q, k and v."""
    ys = [getattr(block, name)(x) for name in ("q_proj", "k_proj", "v_proj")]
    loss = sum((i + 1) * y.float().pow(2).sum() for i, y in enumerate(ys))
    loss.backward()
    return [getattr(block, name).bias.grad for name in ("q_proj", "k_proj", "v_proj")]


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_member_s_trainable_bias_gets_its_gradient(when, caplog):
    """A member's bias made trainable (``bias.requires_grad_()``): the fused layer's bias is another
    tensor (the members' are views of it), so the fused run gave the members' biases no gradient,
    without a word. Made trainable before fusing, the group is skipped with the reason; after, its
    next run releases the group, and the members' biases get the unfused layers' gradients."""
    block = Siblings()
    plain = copy.deepcopy(block)
    if when == "after":
        assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
        group = fused_group_of(block.q_proj)
    for b in (block, plain):
        b.k_proj.bias.requires_grad_()
        b.v_proj.bias.requires_grad_()
    if when == "before":
        assert spt.fuse_projections_(block).skipped == {
            "q_proj+k_proj+v_proj": "k_proj's bias requires grad (the fused layer's buffers are other tensors: its "
                                    "gradient would not reach it)"}
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="sparsile.torch"):
        got = _bias_grads(block, x.clone().requires_grad_())  # (x with grad: the fused run's graph had it too)
    want = _bias_grads(plain, x.clone().requires_grad_())
    assert got[0] is None and want[0] is None
    assert all(g is not None and torch.equal(g, w) for g, w in zip(got[1:], want[1:]))
    assert fused_group_of(block.q_proj) is None
    if when == "after":
        assert group.fused is None and "or require grad; running them unfused" in caplog.text


def test_a_member_s_frozen_parameter_bias_is_skipped_with_the_reason():
    """A member's bias made an nn.Parameter that needs no gradient: fusing replaced each member's
    tensors by views of the fused layer's, and torch refuses to assign a plain tensor to a parameter's
    name: a TypeError from torch, with q_proj's other buffers already swapped for views."""
    block = Siblings()
    block.k_proj.bias = torch.nn.Parameter(block.k_proj.bias.clone(), requires_grad=False)
    plain = copy.deepcopy(block)
    report = spt.fuse_projections_(block)
    assert report.fused == [] and report.skipped == {
        "q_proj+k_proj+v_proj": "k_proj's bias is an nn.Parameter (the fused layer's buffers are other tensors: "
                                "fusing would replace it by a view of them, which a parameter cannot be)"}
    assert all(fused_group_of(m) is None for m in block.children())
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            assert torch.equal(getattr(block, name)(x), getattr(plain, name)(x))
        check_against_float64(block.k_proj, x, block.k_proj(x))


@pytest.mark.parametrize("bias", [True, False])
def test_a_member_given_a_parameter_bias_after_fusing_runs_with_it(bias, caplog):
    """A member's bias set to an nn.Parameter after fusing (a bias to train): torch moves the name out of
    ``_buffers``. A group fused without biases still looked intact (the member's buffer dict had no bias,
    as when fused), so the member kept running fused without its new bias: a wrong output without a
    word; with biases, the released member's unfused call read ``_buffers["bias"]``: a KeyError. The group
    is released, and the member computes with its bias and gives it its gradient."""
    block = Siblings(q_proj={"bias": bias}, k_proj={"bias": bias}, v_proj={"bias": bias})
    assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
    group = fused_group_of(block.q_proj)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 64, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        block.q_proj(x)
        block.k_proj(x)  # served from the fused run
    new = torch.nn.Parameter(torch.rand(16, generator=gen) + 1.0)
    block.k_proj.bias = new
    with caplog.at_level(logging.INFO, logger="sparsile.torch"):
        with torch.no_grad():
            for _ in range(2):
                check_against_float64(block.k_proj, x, block.k_proj(x))
    assert group.fused is None and fused_group_of(block.k_proj) is None
    assert "moved or made parameters, or require grad; running them unfused" in caplog.text
    g = torch.randn(5, 16, generator=gen).to(torch.bfloat16)
    block.k_proj(x).backward(g)
    assert torch.allclose(new.grad.double(), g.double().sum(0), rtol=1e-5, atol=1e-6)  # d bias = Σ dy


def test_e4m3_group_and_no_bias():
    block = Siblings(dtype="e4m3", q_proj={"bias": False}, k_proj={"bias": False}, v_proj={"bias": False})
    plain = copy.deepcopy(block)
    assert spt.fuse_projections_(block).fused == ["q_proj+k_proj+v_proj"]
    group = fused_group_of(block.q_proj)
    assert group.fused.bias is None and group.fused.scale_w.shape == (64,)
    x = torch.randn(5, 64).to(torch.bfloat16)
    for name in ("k_proj", "q_proj", "v_proj"):
        y = getattr(block, name)(x)
        assert torch.equal(y, getattr(plain, name)(x))
        check_against_float64(getattr(block, name), x, y)
    assert group.runs == 1


@pytest.mark.parametrize(("kinds", "sizes", "reason"), [
    ({"v_proj": {"dense": True}}, (32, 16, 16), "v_proj is a Linear, not a SparseLinear"),
    ({}, (32, 24, 16), "k_proj has out_features = 24, not a multiple of 16 (its metadata rows would not be a slice "
                       "of the fused layer's)"),
    ({"k_proj": {"activation": "relu"}}, (32, 16, 16), "k_proj fuses activation 'relu'"),
    ({"v_proj": {"dtype": "e4m3"}}, (32, 16, 16), "v_proj has weight dtype e4m3 but q_proj has bf16"),
    ({"v_proj": {"bias": False}}, (32, 16, 16), "v_proj has bias False but q_proj has True"),
    ({"k_proj": {"out_dtype": torch.float32}}, (32, 16, 16),
     "k_proj has out_dtype torch.float32 but q_proj has None"),
])
def test_mismatched_groups_are_skipped_with_the_reason(kinds, sizes, reason):
    block = Siblings(sizes, **kinds)
    report = spt.fuse_projections_(block)
    assert report.fused == [] and report.skipped == {"q_proj+k_proj+v_proj": reason}
    assert str(report).splitlines()[1] == f"  skipped q_proj+k_proj+v_proj: {reason}"
    assert all(fused_group_of(m) is None for m in block.children())


def test_a_per_tensor_scale_w_is_skipped_and_left_as_it_is():
    """A member's scale_w may be one value (per tensor, (1,)) rather than one per output feature; its
    rows are no slice of a row concatenation, so the group is skipped: fusing it would leave the
    members views of the wrong length (state_dict with scale_w of 2 and 0 elements) and every call
    refused."""
    block = Siblings(dtype="e4m3")
    with torch.no_grad():
        block.k_proj.scale_w = torch.full((1,), 0.02)
    plain = copy.deepcopy(block)
    report = spt.fuse_projections_(block)
    assert report.fused == [] and report.skipped == {
        "q_proj+k_proj+v_proj": "k_proj has scale_w of shape (1,), not one value per output feature (16,)"}
    assert all(fused_group_of(m) is None for m in block.children())
    assert {k: v.shape for k, v in block.state_dict().items()} == {k: v.shape for k, v in plain.state_dict().items()}
    x = torch.randn(3, 64).to(torch.bfloat16)
    for name in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(getattr(block, name)(x), getattr(plain, name)(x))
    check_against_float64(block.k_proj, x, block.k_proj(x))


def test_in_features_mismatch_and_custom_groups():
    block = Siblings()
    block.k_proj = spt.SparseLinear.from_dense(linear(16, 32, seed=9))
    report = spt.fuse_projections_(block, [("q_proj", "v_proj"), ("q_proj", "k_proj"), ("up_proj", "q_proj")])
    assert report.fused == ["q_proj+v_proj"]  # up_proj is missing: not a candidate, not reported
    assert report.skipped == {"q_proj+k_proj": "q_proj is already fused"}
    block = Siblings()
    block.k_proj = spt.SparseLinear.from_dense(linear(16, 32, seed=9))
    assert spt.fuse_projections_(block).skipped == {"q_proj+k_proj+v_proj": "k_proj has in_features 32 but q_proj "
                                                                            "has 64"}


def test_aliased_and_meta_members_are_skipped():
    block = Siblings()
    block.v_proj = block.k_proj
    assert spt.fuse_projections_(block).skipped == {"q_proj+k_proj+v_proj": "v_proj is the same module as k_proj"}
    block = torch.nn.Module()
    block.q_proj, block.k_proj = (spt.SparseLinear(64, 32, device="meta") for _ in range(2))
    report = spt.fuse_projections_(block, [("q_proj", "k_proj")])
    assert report.skipped == {"q_proj+k_proj": "q_proj is on the meta device (no weights yet)"}


def test_sparsify_fuse_option():
    block = torch.nn.Module()
    for i, (name, n) in enumerate((("gate_proj", 32), ("up_proj", 32), ("down_proj", 64))):
        setattr(block, name, linear(n, 64 if name != "down_proj" else 32, seed=i))
    report = spt.sparsify_(block, interpret=True, min_features=16, fuse=True)
    assert report.fusion.fused == ["gate_proj+up_proj"] and fused_group_of(block.up_proj) is not None
    assert report.fusion.glu == {}  # glu by default, but this module is not a gated MLP:
    assert report.fusion.no_glu == {"gate_proj+up_proj": "the module has no act_fn module"}
    no_glu = spt.sparsify_(block, interpret=True, min_features=16, fuse=True, glu=False).fusion
    assert no_glu.glu == {} and no_glu.no_glu == {}  # glu=False: not asked for
    report = spt.sparsify_(block, interpret=True, min_features=16, fuse=True, glu=True)
    assert str(report).splitlines()[-2:] == [
        "fuse_projections_: 0 projection groups fused, 1 already fused, 0 skipped; gated activation fused into 0 MLPs",
        "  no gated activation for gate_proj+up_proj: the module has no act_fn module"]
    assert spt.sparsify_(torch.nn.Module(), interpret=True).fusion is None
    with pytest.raises(IntegrationError) as err:
        spt.sparsify_(block, fuse="gate_proj")
    assert err.value.code == "SP0944"


@pytest.mark.parametrize(("groups", "message"), [
    (("q_proj", "k_proj"), "projection group 'q_proj' is not a tuple of two or more distinct child module names"),
    ("q_proj", "groups must be a non-empty sequence of name tuples, got 'q_proj'"),
    ([], "groups must be a non-empty sequence of name tuples, got []"),
    ([("q_proj",)], "projection group ('q_proj',) is not a tuple of two or more distinct child module names"),
    ([("q_proj", "q_proj")], "projection group ('q_proj', 'q_proj') is not a tuple of two or more distinct child "
                             "module names"),
    ([("attn.q", "attn.k")], "projection group ('attn.q', 'attn.k') is not a tuple of two or more distinct child "
                             "module names"),
])
def test_bad_groups_are_sp0944(groups, message):
    with pytest.raises(IntegrationError) as err:
        spt.fuse_projections_(Siblings(), groups)
    assert err.value.code == "SP0944" and err.value.message == message
    assert "pass a sequence of name tuples" in err.value.help


def test_a_dtype_cast_keeps_traced_fusion_and_a_move_frees_the_fused_copy(llama_pair):
    """``model.half()`` leaves the members' views in place: the group stays verified, so the
    compiled graph keeps one op per group; a move (new tensors) releases every group at once, so
    the fused copy is freed even if the model then only runs traced."""
    model, _ = llama_pair
    traced = copy.deepcopy(model)
    spt.fuse_projections_(traced, traced=True, glu=False)
    traced.half()
    assert all(g.checked and g.fused is not None for g in groups_of(traced))
    ops, got = sparse_ops_in_compiled_graph(traced)
    assert ops.count("sparsile.sparse_linear") == 8
    assert torch.equal(got, logits(copy.deepcopy(model).half()))  # the unfused model, cast the same way
    groups = groups_of(traced)
    traced._apply(lambda t: t.clone())  # what a device move does to every buffer
    assert all(g.fused is None for g in groups) and all(fused_group_of(m) is None for m in traced.modules())


def test_fusing_again_with_traced_keeps_the_groups_and_fuses_them_in_traces(llama_pair):
    model, unfused = llama_pair
    again = copy.deepcopy(model)
    first = spt.fuse_projections_(again, glu=False)
    groups = groups_of(again)
    report = spt.fuse_projections_(again, traced=True, glu=False)
    assert report.fused == [] and report.kept == first.fused == GROUPS and report.skipped == {}
    assert groups_of(again) == groups and all(g.traced for g in groups)
    ops, got = sparse_ops_in_compiled_graph(again)
    assert ops.count("sparsile.sparse_linear") == 8 and torch.equal(got, unfused)


def test_members_fed_different_inputs_give_the_group_up():
    """Cross-attention's q reads the decoder's states and k / v the encoder's: every fused run then
    serves one member. After PARTIAL_RUNS_LIMIT such runs the group is released (right values
    throughout, unfused from then on)."""
    from sparsile.integrations.torch.projection_group import PARTIAL_RUNS_LIMIT

    block = Siblings()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    group = fused_group_of(block.q_proj)
    enc = torch.randn(3, 64).to(torch.bfloat16)
    for step in range(PARTIAL_RUNS_LIMIT + 2):
        dec = torch.randn(1, 64).to(torch.bfloat16)
        assert torch.equal(block.q_proj(dec), plain.q_proj(dec))
        if step == 0:
            assert torch.equal(block.k_proj(enc), plain.k_proj(enc))
            assert torch.equal(block.v_proj(enc), plain.v_proj(enc))
    assert group.fused is None and fused_group_of(block.q_proj) is None
    # q's run, k / v's run, then q alone: the run that would have been the LIMIT-th partial one in a row
    # is not made
    assert group.runs == PARTIAL_RUNS_LIMIT


def test_a_model_that_is_not_a_module_is_sp0907():
    """fuse_projections_('model') was an AttributeError from model.named_modules()."""
    from sparsile.integrations.errors import IntegrationError

    with pytest.raises(IntegrationError) as info:
        spt.fuse_projections_("model")
    assert (info.value.code, info.value.message) == ("SP0907", "fuse_projections_ takes an nn.Module, got str")


class TrainedAround(torch.nn.Module):
    """Trainable dense float32 layers before and after a fused group of frozen sparse bf16 layers: q/k/v
    siblings, or a Llama-style MLP's gate and up (its gated activation fused, glu.py)."""

    def __init__(self, block: str):
        super().__init__()
        self.block = block
        self.pre = linear(64, 64, torch.float32, seed=7)
        if block == "qkv":
            self.att = Siblings()
        else:
            from sparsile.tests.integrations.test_torch_glu import LlamaLikeMLP

            self.mlp = LlamaLikeMLP()
            with torch.no_grad():  # (outputs of order 1)
                for layer in self.mlp.children():
                    if isinstance(layer, torch.nn.Linear):
                        layer.weight.mul_(0.125)
            spt.sparsify_(self.mlp, interpret=True, min_features=16)
        self.head = linear(8, 16 if block == "qkv" else 64, torch.float32, seed=8)
        with torch.no_grad():  # (outputs of order 1: the steps stay finite)
            self.pre.weight.mul_(2 ** -3)
            self.head.weight.mul_(2 ** -6 if block == "qkv" else 2 ** -3)

    def forward(self, x):
        h = self.pre(x)
        if self.block == "qkv":
            return self.head(self.att.q_proj(h)[..., :16] + self.att.k_proj(h) - self.att.v_proj(h))
        return self.head(self.mlp(h))

    @property
    def trainable_member(self) -> str:
        return "att.k_proj" if self.block == "qkv" else "mlp.up_proj"

    @property
    def group(self) -> str:
        return "att.q_proj+k_proj+v_proj" if self.block == "qkv" else "mlp.gate_proj+up_proj"


def _steps(model, optimizer, seed: int, steps: int = 2) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(4, 64, generator=gen)
        loss = (model(x) - torch.randn(4, 8, generator=gen)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _uses_the_optimizer_s_tensors(model, optimizer, names: dict[int, str]) -> bool:
    """The model computes with the tensors the optimizer steps: a copy of it given the optimizer's
    tensors (by the names they had when given to it) computes the same, bit for bit (the copy runs
    as the model does: fused, gated, or not)."""
    twin = copy.deepcopy(model)
    slots = dict(twin.named_parameters()) | dict(twin.named_buffers())
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                slots[names[id(p)]].copy_(p)
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
        y = model(x)
        assert torch.isfinite(y).all()  # (the steps stayed finite: the comparison means something)
        return torch.equal(y, twin(x))


@pytest.mark.parametrize("block", ["qkv", "mlp"])
@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw_foreach"])
def test_an_optimizer_made_before_fusing_steps_the_weights_the_model_uses(kind, block):
    """fuse_projections_ makes each member's buffers views of a fused copy; an optimizer created
    before it holds what it held, and it holds no member tensor: a member whose buffer is an
    nn.Parameter or requires grad is not fused (and one made so later releases the group). So
    training after fusing (x's gradient through the fused run, or the gated MLP's), after the group
    is released (the members keep views of the fused copy), and with a member's bias made trainable
    after fusing, steps the tensors the model computes with."""
    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=1e-3),
            "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
            "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True)}[kind]
    model = TrainedAround(block)
    names = {id(p): name for name, p in model.named_parameters()}
    optimizer = make(model.parameters())
    report = spt.fuse_projections_(model)
    assert report.fused == [model.group] and report.glu == ({} if block == "qkv" else {model.group: "swiglu"})
    member = model.get_submodule(model.trainable_member)
    group = fused_group_of(member)
    for phase in ("fused", "released", "trainable bias"):
        if phase == "released":
            group.release()
        if phase == "trainable bias":
            assert spt.fuse_projections_(model).fused == [model.group]
            group = fused_group_of(member)
            bias = member.bias.requires_grad_()  # (a view of the fused copy: the group is released)
            optimizer.add_param_group({"params": [bias]})
            names[id(bias)] = model.trainable_member + ".bias"
        before = {name: t.detach().clone() for name, t in model.state_dict().items()}
        _steps(model, optimizer, seed=len(phase))
        after = model.state_dict()
        changed = {name for name, t in before.items() if not torch.equal(t, after[name])}
        trained = {"pre.weight", "pre.bias", "head.weight", "head.bias"}
        assert changed == (trained | {names[id(bias)]} if phase == "trainable bias" else trained), phase
        assert (group.fused is not None) == (phase == "fused")
        assert _uses_the_optimizer_s_tensors(model, optimizer, names), phase


def test_the_report_counts_one_group_and_one_mlp_in_the_singular() -> None:
    """The report said "1 projection groups fused" and "fused into 1 MLPs"; it counts as
    SparsifyReport does ("1 linear layer swapped")."""
    one = FuseReport(fused=["mlp.gate_proj+up_proj"], glu={"mlp.gate_proj+up_proj": "swiglu"}, glu_asked=True,
                     glu_removed=["other"])
    assert str(one) == ("fuse_projections_: 1 projection group fused, 0 already fused, 0 skipped; gated activation "
                        "fused into 1 MLP (swiglu); gated activation removed from 1 MLP (glu=False)")
    two = FuseReport(fused=["a.gate_proj+up_proj", "b.gate_proj+up_proj"], glu_asked=True,
                     glu={"a.gate_proj+up_proj": "swiglu", "b.gate_proj+up_proj": "geglu"}, glu_removed=["c", "d"])
    assert str(two) == ("fuse_projections_: 2 projection groups fused, 0 already fused, 0 skipped; gated activation "
                        "fused into 2 MLPs (1 geglu, 1 swiglu); gated activation removed from 2 MLPs (glu=False)")


def test_a_sibling_in_another_capture_is_not_served_the_run_of_the_first(monkeypatch):
    """Two CUDA graphs captured one after the other, q_proj(x) in the first and k_proj(x) in the
    second with the same x (a static input buffer): the second graph must launch its own fused run.
    Served from the first capture's run, its replay computed nothing and returned columns of the
    first graph's output (stale, or another graph's memory). The run stamp names the capture's id;
    siblings of one capture are still served from its run. (Faked on the CPU: the capture state and
    id that fuse.py reads.)"""
    import sparsile.integrations.torch.run_stamp as run_stamp

    block = Siblings()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    group = fused_group_of(block.q_proj)
    x = torch.randn(3, 64).to(torch.bfloat16)
    capture = [1]
    monkeypatch.setattr(run_stamp, "capturing", lambda: True)
    monkeypatch.setattr(run_stamp, "capture_id", lambda stream: capture[0])
    assert torch.equal(block.q_proj(x), plain.q_proj(x)) and group.runs == 1
    capture[0] = 2
    assert torch.equal(block.k_proj(x), plain.k_proj(x)) and group.runs == 2  # its own run
    assert torch.equal(block.v_proj(x), plain.v_proj(x)) and group.runs == 2  # served from it
    monkeypatch.setattr(run_stamp, "capturing", lambda: False)
    assert torch.equal(block.q_proj(x), plain.q_proj(x)) and group.runs == 3  # eager: not a capture's run


class _OnCuda:
    """x as the run stamp asks it, on CUDA device 0."""

    is_cuda = True

    def get_device(self) -> int:
        return 0


def test_a_sibling_on_a_new_stream_under_a_destroyed_stream_s_handle_is_not_served(monkeypatch):
    """q_proj(x) starts a fused run on stream 40, a stream somebody else owns (an ExternalStream); its owner
    destroys it, with the run maybe still queued there, and the driver gives handle 40 to a new stream, on
    which k_proj(x) is called with the same x. Served, k_proj got columns that the new stream's work reads
    with no wait for the old stream's kernel (a race). The run stamp names a foreign stream by its driver id
    too (noted_streams.stream_id): k_proj runs its own fused run, v_proj is served from it. A stream torch
    created is never asked for an id. (Faked on the CPU: the current stream, who created it, its id.)"""
    import sparsile.integrations.torch.run_stamp as run_stamp
    from sparsile.integrations.torch import noted_streams

    block = Siblings()
    plain = copy.deepcopy(block)
    spt.fuse_projections_(block)
    group = fused_group_of(block.q_proj)
    x = torch.randn(3, 64).to(torch.bfloat16)
    stream, ids, asked = [40], {40: 1001}, []
    group.fused.__dict__["_records"]._streams[0] = lambda: stream[0]  # (device 0's current stream)
    real = run_stamp.stream_and_capture
    monkeypatch.setattr(run_stamp, "stream_and_capture", lambda fused, x: real(fused, _OnCuda()))
    monkeypatch.setattr(noted_streams, "_TORCH_CREATED", lambda s, ordinal: s != 40)
    monkeypatch.setattr(noted_streams, "_STREAM_ID", lambda s: asked.append(s) or ids[s])
    assert torch.equal(block.q_proj(x), plain.q_proj(x)) and group.runs == 1
    ids[40] = 1002  # stream 40 destroyed, a new stream under its handle
    assert torch.equal(block.k_proj(x), plain.k_proj(x)) and group.runs == 2  # its own run
    assert torch.equal(block.v_proj(x), plain.v_proj(x)) and group.runs == 2  # served from it (the same stream)
    assert torch.equal(block.q_proj(x), plain.q_proj(x)) and group.runs == 2
    assert set(asked) == {40}
    stream[0], asked[:] = 11, []  # a stream torch created: never asked
    ys = [m(x) for m in (block.q_proj, block.k_proj, block.v_proj)]
    assert group.runs == 3 and asked == []
    assert all(torch.equal(y, m(x)) for y, m in zip(ys, (plain.q_proj, plain.k_proj, plain.v_proj)))
