"""sparsify_ (the module swap and its skip report), and how sparsile.torch is imported: lazily,
as an alias of sparsile.integrations.torch, with SP0900 when torch is missing."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import check_against_float64, dense_twin, linear, tiny_llama

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.ModuleDict({"q": linear(64, 64, seed=1), "o": linear(64, 64, seed=2, bias=False)})
        self.mlp = torch.nn.Sequential(linear(64, 64, seed=3), torch.nn.ReLU(), linear(64, 64, seed=4))
        self.odd = linear(64, 30, seed=5)           # K = 30: not a multiple of 4
        self.narrow = linear(64, 40, seed=6)        # K = 40: a multiple of 4, not of 16
        self.tiny = linear(8, 16, seed=7)
        self.f32 = linear(64, 64, dtype=torch.float32, seed=8)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.mlp(self.attn["o"](self.attn["q"](x)))


def test_swap_and_skip_report(caplog):
    model = _Block()
    dense = {name: m.weight.detach().clone() for name, m in model.named_modules()
             if isinstance(m, torch.nn.Linear)}
    with caplog.at_level(logging.INFO, logger="sparsile.torch"):
        report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == ["attn.q", "attn.o", "mlp.0", "mlp.2"]
    assert report.skipped == {
        "odd": "in_features = 30 is not a multiple of the 2:4 group (4)",
        "narrow": "in_features = 40 is not a multiple of 16 (bf16): the kernel would copy and pad x on every call",
        "tiny": "too small to gain from 2:4 (8 x 16; min_features = 16)",
        "f32": "the linear's weight dtype torch.float32 has no 2:4 sparse linear kernel (pass dtype='bf16', "
               "'f16' or 'e4m3': the weight is converted)",
    }
    assert "sparsify_: 4 linear layers swapped for SparseLinear, 4 skipped" in caplog.text
    assert str(report).splitlines()[1] == "  skipped odd: in_features = 30 is not a multiple of the 2:4 group (4)"
    assert isinstance(model.mlp[0], spt.SparseLinear) and isinstance(model.attn["o"], spt.SparseLinear)
    assert type(model.odd) is torch.nn.Linear and type(model.norm) is torch.nn.LayerNorm
    kept = model.attn["q"].to_dense()
    assert torch.equal(kept[kept != 0], dense["attn.q"].float()[kept != 0])  # pruned, not changed
    x = torch.randn(2, 64).to(torch.bfloat16)
    check_against_float64(model.attn["q"], x, model.attn["q"](x))
    assert model(x).shape == (2, 64)


def test_filter_fn_dtype_and_cpu_default():
    model = _Block()
    seen = []

    def only_mlp(module, fqn):
        seen.append(fqn)
        return fqn.startswith("mlp")

    report = spt.sparsify_(model, only_mlp, "e4m3", interpret=True, min_features=16)
    assert report.swapped == ["mlp.0", "mlp.2"] and report.skipped == {}
    assert seen == ["attn.q", "attn.o", "mlp.0", "mlp.2", "odd", "narrow", "tiny", "f32"]
    assert model.mlp[0].weight_dtype == "e4m3"
    report = spt.sparsify_(model, min_features=16)  # on the CPU without interpret: nothing swapped
    assert report.swapped == []
    assert report.skipped["attn.q"] == ("on the CPU: the kernel runs on CUDA GPUs (pass interpret=True to run it in "
                                        "the slow interpreter)")
    assert "mlp.0" not in report.skipped  # already sparse


def test_root_linear_is_reported():
    report = spt.sparsify_(linear(64, 64), interpret=True, min_features=16)
    assert report.skipped == {"": "the root module cannot be replaced in place: use SparseLinear.from_dense(model)"}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": ":".join(p for p in sys.path if p)})


def test_import_is_lazy_and_aliased():
    run = _python("""
        import sys, sparsile
        assert "torch" not in sys.modules
        assert sparsile.torch.sparsify_  # attribute access imports it too
        import sparsile.torch as spt
        import sparsile.integrations.torch as real
        assert spt is real and sparsile.torch is real and spt.SparseLinear.__module__.endswith("torch.linear")
        from sparsile.torch import sparsify_
        print("ok")
    """)
    assert run.returncode == 0 and run.stdout.split() == ["ok"], run.stderr


def test_missing_torch_is_sp0900():
    run = _python("""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import sparsile
        assert not hasattr(sparsile, "torch")
        try:
            import sparsile.torch
        except ModuleNotFoundError as e:
            print(e.code, "|", e.message)
            print(str(e).splitlines()[1])
        from sparsile.stdlib.kernels import prune_and_compress  # the rest works without torch
        print(prune_and_compress([[1.0, 0, 0, 2]], "f16").values.tolist())
    """)
    # the help installs as README.md does (from the checkout; the CPU build of torch without a GPU), not
    # `pip install 'sparsile[...]'`, which asks the package index for a project named sparsile
    assert run.stdout.splitlines() == [
        "SP0900 | sparsile.torch needs PyTorch, which is not installed",
        " = help: install torch>=2.10: `pip install -e '.[torch]'` in the sparsile checkout (without a GPU, "
        "`pip install torch --index-url https://download.pytorch.org/whl/cpu` first)",
        "[[1.0, 2.0]]"], run.stderr


OLDER_TORCHES = ("2.9.1+cu128", "2.4.0a0+git1234", "1.13.1")


@pytest.fixture(scope="module")
def older_torch_imports() -> dict[str, list[str]]:
    """What ``import sparsile.torch`` prints under each of OLDER_TORCHES, all in one subprocess (each
    start imports torch: seconds of CI's CPU time apiece): the version string is patched before each
    attempt; the first attempt is a fresh process's, the next ones follow a refused import, which
    leaves no ``sparsile.torch`` behind to find (``hasattr`` is printed after each)."""
    run = _python(f"""
        import torch
        for version in {OLDER_TORCHES!r}:
            torch.__version__ = version
            print("==", version)
            try:
                import sparsile.torch
            except ImportError as e:  # an ImportError, as SP0900's and SP0937's
                print(type(e).__name__, e.code, "|", e.message, "|", e.help)
            import sparsile
            print(hasattr(sparsile, "torch"))  # False, as without torch; it raised SP0908 before
    """)
    assert run.returncode == 0, run.stderr
    out: dict[str, list[str]] = {}
    for line in run.stdout.splitlines():
        if line.startswith("== "):
            version = line[3:]
            out[version] = []
        else:
            out[version].append(line)
    return out


@pytest.mark.parametrize("version", OLDER_TORCHES)
def test_an_older_torch_is_sp0908(version, older_torch_imports):
    """A torch older than the floor (integrations/torch_version.py) gives SP0908 on import, not a
    traceback from inside torch; the version string is patched (the older torch is not installed)."""
    # the help installs as README.md does (the checkout's torch extra; torch's CPU build without a GPU)
    assert older_torch_imports[version] == [f"TorchVersionError SP0908 | sparsile.torch needs PyTorch 2.10 or later, "
                                            f"found {version} | install torch>=2.10: `pip install -e '.[torch]'` in "
                                            "the sparsile checkout (without a GPU, `pip install -U torch --index-url "
                                            "https://download.pytorch.org/whl/cpu` first); docs/torch.md lists the "
                                            "versions checked", "False"], older_torch_imports


@pytest.mark.parametrize(("version", "refused"), [("2.10.0a0+git1234", False), ("2.10.0", False), ("3.0.0", False),
                                                  ("2.11.0+cu130", False), ("2.9.9", True), ("", False)])
def test_only_a_release_before_the_floor_is_refused(version, refused):
    """Only a release before the floor is refused: a pre-release of the floor itself (an NGC build,
    2.10.0a0) is that release; a version string without numbers is not refused."""
    from sparsile.integrations.torch_version import require_torch_release

    if refused:
        with pytest.raises(IntegrationError) as err:
            require_torch_release(version)
        assert err.value.code == "SP0908" and err.value.message.startswith("sparsile.torch needs PyTorch 2.10 ")
    else:
        require_torch_release(version)


@pytest.mark.parametrize(("call", "code", "message"), [
    (lambda m: spt.sparsify_("model"), "SP0907", "sparsify_ takes an nn.Module, got str"),
    (lambda m: spt.sparsify_(m, filter_fn=3), "SP0907",
     "filter_fn must be None or a function (module, fqn) -> bool, got int"),
    (lambda m: spt.sparsify_(m, min_features="small"), "SP0907",
     "min_features must be a non-negative integer, got 'small'"),
    (lambda m: spt.sparsify_(m, min_features=None), "SP0907", "min_features must be a non-negative integer, got None"),
    (lambda m: spt.sparsify_(m, min_features=-1), "SP0907", "min_features must be a non-negative integer, got -1"),
    (lambda m: spt.sparsify_(m, "bf16"), "SP0907",  # dtype passed where filter_fn goes
     "filter_fn must be None or a function (module, fqn) -> bool, got str"),
    (lambda m: spt.sparsify_(m, dtype="fp64", interpret=True), "SP0903", "dtype fp64 has no 2:4 sparse linear kernel"),
    # a truthy string turned the option on: interpret="no" swapped CPU layers, trainable="no" swapped in
    # trainable layers
    (lambda m: spt.sparsify_(m, interpret="no", min_features=16), "SP0907",
     "sparsify_: interpret must be True or False, got 'no'"),
    (lambda m: spt.sparsify_(m, interpret=True, trainable="no", min_features=16), "SP0907",
     "sparsify_: trainable must be True or False, got 'no'"),
    (lambda m: spt.sparsify_(m, interpret=True, fuse=True, traced="no", min_features=16), "SP0907",
     "sparsify_: traced must be True or False, got 'no'"),
    (lambda m: spt.fuse_projections_(m, traced=1), "SP0907", "fuse_projections_: traced must be True or False, got 1"),
    (lambda m: spt.load_sparse24_checkpoint(m, ".", strict="no"), "SP0907",
     "load_sparse24_checkpoint: strict must be True or False, got 'no'"),
])
def test_bad_arguments_are_refused_before_any_swap(call, code, message):
    """A non-module, a filter_fn that cannot be called and a min_features that is not an integer were
    an AttributeError / TypeError from inside the loop; a dtype no layer can take skipped every linear."""
    model = torch.nn.Sequential(linear(64, 64, seed=1), torch.nn.ReLU(), linear(64, 64, seed=2))
    with pytest.raises(IntegrationError) as info:
        call(model)
    assert (info.value.code, info.value.message) == (code, message)
    assert all(isinstance(m, torch.nn.Linear) for m in (model[0], model[2]))


def test_multihead_attention_s_out_proj_stays_dense():
    """nn.MultiheadAttention passes out_proj.weight and .bias to its functional forward instead of
    calling out_proj: the swapped layer (it has no .weight) made every forward of the model an
    AttributeError from torch after sparsify_ returned. It is skipped with its reason, as torchao
    skips NonDynamicallyQuantizableLinear."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(torch.bfloat16)
            self.proj = linear(64, 64, seed=1)

        def forward(self, x):
            return self.proj(self.attn(x, x, x, need_weights=False)[0])

    model = Attention()
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == ["proj"] and report.skipped == {
        "attn.out_proj": "nn.MultiheadAttention reads this out_proj's weight itself (not through its forward)"}
    assert type(model.attn.out_proj) is torch.nn.modules.linear.NonDynamicallyQuantizableLinear
    with torch.no_grad():
        hidden = model.attn(x, x, x, need_weights=False)[0]
        y = model(x)
    check_against_float64(model.proj, hidden, y)


@pytest.mark.parametrize("trainable", [False, True])
def test_transformer_encoder_layer_s_linears_stay_dense(trainable):
    """nn.TransformerEncoderLayer (and nn.TransformerEncoder) read linear1.weight and linear2.weight
    themselves in eval mode, for the fast path's checks and its fused kernel: after sparsify_ the
    model's every eval forward was an AttributeError from torch ('SparseLinear' object has no
    attribute 'weight'), and with trainable=True the fast path computed with the dense master
    weights: the report said sparse, eval ran dense (training, sparse: other numbers). Both linears
    are skipped with their reason; the model's other linears are not."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, dim_feedforward=128, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                                linear(64, 64, seed=1)).to(torch.bfloat16).eval()
    x = torch.randn(2, 3, 64).to(torch.bfloat16)
    with torch.no_grad():
        before = model[0](x)
    report = spt.sparsify_(model, interpret=True, min_features=16, trainable=trainable)
    why = ("nn.TransformerEncoderLayer reads this linear's weight itself (its eval-mode fast path), "
           "not through its forward")
    assert report.swapped == ["1"]
    assert {name: reason for name, reason in report.skipped.items() if "linear" in name} == {
        f"0.layers.{i}.linear{j}": why for i in (0, 1) for j in (1, 2)}
    assert all(type(m) is torch.nn.Linear for name, m in model.named_modules() if name.endswith(("linear1", "linear2")))
    with torch.no_grad():
        hidden = model[0](x)
        y = model(x)
    assert torch.equal(hidden, before)  # the dense encoder's numbers
    if not trainable:
        check_against_float64(model[1], hidden, y)


def test_a_failing_filter_fn_leaves_the_model_unchanged():
    """Every filter_fn call (and skip reason) comes before the first swap: an exception there leaves
    no half-sparsified model behind."""
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 128)).bfloat16()

    def filter_fn(module, fqn):
        if fqn == "1":
            raise RuntimeError("filter failed")
        return True

    with pytest.raises(RuntimeError, match="filter failed"):
        spt.sparsify_(model, filter_fn, interpret=True)
    assert all(type(m) is torch.nn.Linear for m in model)


def test_weights_beyond_the_f16_range_are_skipped_for_f16():
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 128)).bfloat16()
    with torch.no_grad():
        model[1].weight[0, 0] = 1e5
    report = spt.sparsify_(model, dtype="f16", interpret=True)
    assert report.swapped == ["0"]
    assert report.skipped == {"1": "1 weights lie beyond ±65504, the largest finite float16 (use dtype='bf16')"}


def test_a_linear_registered_under_two_names_is_swapped_under_both():
    """``named_modules`` names a shared (tied) module once: the other name kept the dense layer, so the
    model ran the two halves of one weight differently."""
    shared = torch.nn.Linear(128, 128).bfloat16()
    model = torch.nn.Module()
    model.a, model.b = shared, shared
    report = spt.sparsify_(model, interpret=True)
    assert report.swapped == ["a", "b"] and model.a is model.b and isinstance(model.b, spt.SparseLinear)


def test_the_report_names_the_trainable_layers_it_swapped_in():
    """With ``trainable=True`` the report (what docs/torch.md's ``print(report)`` shows) said the
    layers were swapped for SparseLinear; they are SemiSparseLinear layers."""
    model = torch.nn.Sequential(linear(32, 32), torch.nn.ReLU(), linear(32, 32, seed=1))
    report = spt.sparsify_(model, interpret=True, min_features=16, trainable=True)
    assert isinstance(model[0], spt.SemiSparseLinear) and isinstance(model[2], spt.SemiSparseLinear)
    assert str(report) == "sparsify_: 2 linear layers swapped for SemiSparseLinear, 0 skipped"
    assert str(spt.sparsify_(torch.nn.Sequential(linear(32, 32)), interpret=True, min_features=16)) == (
        "sparsify_: 1 linear layer swapped for SparseLinear, 0 skipped")  # (it said "1 linear layers")


class _HalvedLinear(torch.nn.Linear):
    def forward(self, input):
        return super().forward(input) * 0.5


def _hooked(layer):
    layer.register_forward_hook(lambda module, args, out: out * 2)
    return layer


def _forward_replaced(layer):
    own = layer.forward
    layer.forward = lambda x: own(x) - 1
    return layer


def _backward_hooked(layer):
    layer.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    return layer


@pytest.mark.parametrize("make, reason", [
    (lambda: _HalvedLinear(64, 64).bfloat16(),
     "_HalvedLinear defines its own forward: a SparseLinear would compute the plain linear x @ W.T + b instead"),
    (lambda: _hooked(linear(64, 64)),
     "it has forward hooks, which a SparseLinear in its place would not run (remove them, then register "
     "them on the SparseLinear)"),
    (lambda: _forward_replaced(linear(64, 64)),
     "its forward is replaced on the instance: a SparseLinear would compute the plain linear x @ W.T + b"),
    (lambda: _backward_hooked(linear(64, 64)),
     "it has backward hooks, which a SparseLinear in its place would not run (remove them, then register "
     "them on the SparseLinear)"),
], ids=["subclass-forward", "forward-hook", "instance-forward", "backward-hook"])
def test_a_linear_that_computes_more_than_the_linear_stays_dense(make, reason):
    """A linear whose call does more than ``x @ W.T + b`` (a subclass's forward, a forward replaced on the
    instance, hooks registered on it) was swapped for a SparseLinear that computes the linear alone and
    runs none of it: the model's output changed without a word (a forward hook doubling the output: 50 %
    off). It is skipped with the reason."""
    model = torch.nn.Sequential(make(), torch.nn.ReLU(), linear(64, 64, seed=1))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with torch.no_grad():
        first = model[0](x)
        report = spt.sparsify_(model, interpret=True, min_features=16)
        y = model(x)
    assert report.swapped == ["2"] and report.skipped == {"0": reason}
    assert type(model[0]) is not spt.SparseLinear and torch.equal(model[0](x), first)
    check_against_float64(model[2], torch.relu(first), y)


# ------------------------------------------------------------------------------------------------
# tied weights


def _dense_twin(model, before, names):
    """A copy of ``before`` (the model as it was before sparsify_) with the layers ``names``, which
    ``model`` swapped for SparseLinear layers, replaced by nn.Linear layers of their pruned weights."""
    import copy

    twin = copy.deepcopy(before)
    for name in names:
        m = model.get_submodule(name)
        if isinstance(m, spt.SparseLinear):
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent), child, dense_twin(m))
    return twin


PROJECTIONS = [f"model.layers.0.{p}" for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                               "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
TIED_HEAD = ("its weight is tied to model.embed_tokens.weight: a SparseLinear in its place would hold a pruned copy "
             "of its own, untying them without a word (to sparsify it, untie them first: set "
             "model.config.tie_word_embeddings = False, so that tie_weights() does not tie them again, and give it "
             "a copy of its own, module.weight = nn.Parameter(module.weight.detach().clone()))")


def test_a_tied_lm_head_stays_dense_with_the_reason():
    """With ``tie_word_embeddings`` lm_head.weight IS embed_tokens.weight: sparsify_ swapped lm_head for a
    pruned copy while the embeddings stayed dense, breaking the tie without a word (and a later
    tie_weights() attached a weight the SparseLinear ignored). lm_head stays dense, tied, with the
    reason; every projection is swapped, and the logits are the dense model's with the same pruned
    projections (as close to float64 as that bf16 model is)."""
    import copy

    model = tiny_llama(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    before = copy.deepcopy(model)
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == PROJECTIONS and report.skipped == {"lm_head": TIED_HEAD}
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is model.model.embed_tokens.weight
    twin = _dense_twin(model, before, PROJECTIONS)  # the projections pruned as in model, lm_head as before
    assert twin.lm_head.weight is twin.model.embed_tokens.weight
    ids = torch.randint(0, 61, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(input_ids=ids).logits.double()
        model.tie_weights()  # (transformers calls it in several flows): still the one tied, dense weight
        assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is model.model.embed_tokens.weight
        assert torch.equal(model(input_ids=ids).logits.double(), got)
        exact = copy.deepcopy(twin).double()(input_ids=ids).logits
        bf16 = twin(input_ids=ids).logits.double()
    bf16_error = ((bf16 - exact).norm() / exact.norm()).item()
    assert ((got - exact).norm() / exact.norm()).item() <= 1.25 * bf16_error


def test_a_head_untied_as_the_reason_says_is_swapped():
    """The way in that the reason gives: tie_word_embeddings off and a copy of its own; then lm_head is
    swapped, and tie_weights() leaves it (and the embeddings) as they are."""
    model = tiny_llama(tie_word_embeddings=True)
    embeddings = model.model.embed_tokens.weight.detach().clone()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == [*PROJECTIONS, "lm_head"] and report.skipped == {}
    model.tie_weights()
    assert isinstance(model.lm_head, spt.SparseLinear) and "weight" not in model.lm_head._parameters
    assert torch.equal(model.model.embed_tokens.weight, embeddings)
    kept = model.lm_head.to_dense()
    assert torch.equal(kept[kept != 0], embeddings.float()[kept != 0])  # the head's weight, pruned


def test_an_untied_llama_has_every_linear_swapped():
    """Without the tie (LlamaConfig's default, the benchmark's models), nothing is skipped: lm_head too."""
    model = tiny_llama(tie_word_embeddings=False)
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == [*PROJECTIONS, "lm_head"] and report.skipped == {}


@pytest.mark.parametrize("how", ["same", "view", "embedding"])
def test_linears_sharing_a_weight_stay_dense(how):
    """Two linears sharing one weight tensor (the same parameter, or a parameter over the same memory),
    or a linear sharing it with an embedding: each was swapped for a pruned copy of its own, the tie
    broken without a word. Each stays dense with the reason (the same rule whatever holds the other)."""
    model = torch.nn.Module()
    model.a = linear(64, 64, seed=1)
    if how == "embedding":
        model.b = torch.nn.Embedding(64, 64).to(torch.bfloat16)
        model.b.weight = model.a.weight
    else:
        model.b = linear(64, 64, seed=2)
        model.b.weight = model.a.weight if how == "same" else torch.nn.Parameter(model.a.weight.data)
    model.c = linear(64, 64, seed=3)
    report = spt.sparsify_(model, interpret=True, min_features=16)

    def reason(other):
        return (f"its weight is tied to {other}.weight: a SparseLinear in its place would hold a pruned copy of its "
                "own, untying them without a word (to sparsify it, untie them first: give it a copy of its own, "
                "module.weight = nn.Parameter(module.weight.detach().clone()))")

    assert report.swapped == ["c"]
    assert report.skipped == ({"a": reason("b")} if how == "embedding" else {"a": reason("b"), "b": reason("a")})
    assert type(model.a) is torch.nn.Linear and model.a.weight.data_ptr() == model.b.weight.data_ptr()


def test_a_call_that_swaps_and_skips_nothing_says_why():
    """'0 linear layers swapped ..., 0 skipped' alone left a user of a model of other layer types
    (torch's Conv1d, say) guessing: the report says what it found instead."""
    none = spt.sparsify_(torch.nn.Sequential(torch.nn.Conv1d(3, 3, 1)), interpret=True)
    assert str(none).splitlines()[1] == ("  the model has no torch.nn.Linear module: sparsify_ swaps nn.Linear and "
                                         "transformers' Conv1D only (projections of another class are not swapped)")
    model = torch.nn.Sequential(linear(64, 64, seed=1), torch.nn.ReLU(), linear(64, 64, seed=2))
    refused = spt.sparsify_(model, interpret=True, min_features=16, filter_fn=lambda module, fqn: False)
    assert str(refused).splitlines()[1:] == ["  filter_fn turned down all 2 linear modules"]
    one = torch.nn.Sequential(linear(64, 64, seed=4))
    none = spt.sparsify_(one, interpret=True, min_features=16, filter_fn=lambda module, fqn: False)
    assert str(none).splitlines() == ["sparsify_: 0 linear layers swapped for SparseLinear, 0 skipped",
                                      "  filter_fn turned down the 1 linear module"]
    assert len(spt.sparsify_(model, interpret=True, min_features=16).swapped) == 2
    again = spt.sparsify_(model, interpret=True, min_features=16)
    assert str(again).splitlines()[1:] == ["  the model's 2 linear layers are sparse already"]
    trainable = torch.nn.Sequential(linear(64, 64, seed=3))
    spt.sparsify_(trainable, interpret=True, min_features=16, trainable=True)
    assert str(spt.sparsify_(trainable, interpret=True, min_features=16)).splitlines()[1:] == [
        "  the model's 1 linear layer is sparse already"]
    assert str(spt.sparsify_(torch.nn.Sequential(linear(64, 64, seed=4)), interpret=True, min_features=16)
               ).splitlines()[1:] == []


def test_a_float32_model_s_skip_reason_names_the_dtype_that_swaps_it():
    # nn.Linear is float32 by default: every layer of such a model was skipped with "has no 2:4 sparse
    # linear kernel" alone, not saying that sparsify_(model, dtype="bf16") swaps them
    model = torch.nn.Sequential(linear(64, 64, dtype=torch.float32, seed=1), torch.nn.ReLU(),
                                linear(64, 64, dtype=torch.float32, seed=2))
    report = spt.sparsify_(model, interpret=True, min_features=16)
    assert report.swapped == [] and "pass dtype='bf16', 'f16' or 'e4m3'" in report.skipped["0"]
    report = spt.sparsify_(model, dtype="bf16", interpret=True, min_features=16)  # as the reason says
    assert report.swapped == ["0", "2"] and report.skipped == {}
