"""The PyTorch examples of README.md, docs/torch.md and docs/training.md run on the CPU, with only
what a machine without a GPU forces changed (``.cuda()`` dropped, ``interpret=True``, smaller
shapes, a tiny transformers Llama for ``MyModel``), and their stated results hold: printed reports,
shapes and dtypes, the float64 checks of the examples themselves.

Each adaptation is a text replacement that must find its text in the doc (``adapted``), so an
example that changes fails here instead of being run in a stale form."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import sparsile.torch as spt  # noqa: E402
from sparsile.tests.integrations.torch_helpers import tiny_llama  # noqa: E402
from sparsile.tests.support.doc_examples import ROOT, adapted, block_with, run_block  # noqa: E402


def run(block: str, doc: str, **names: Any) -> dict[str, Any]:
    return run_block(block, doc, torch=torch, spt=spt, **names)  # (later examples)


IDS = torch.randint(0, 61, (1, 5), generator=torch.Generator().manual_seed(1))
SPARSIFY_CPU = ("spt.sparsify_(model)", "spt.sparsify_(model, interpret=True, min_features=16)")
MLP = "model.layers.0.mlp.gate_proj+up_proj"


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


# ------------------------------------------------------------------------------------------------
# README.md


def test_readme_sparse_matmul_quick_start(monkeypatch: pytest.MonkeyPatch) -> None:
    block = block_with("README.md", "sparse_matmul(weight.values, weight.meta, x)")
    assert "# (4096, 512) f16 = W_pruned @ x.T" in block
    env = run(adapted(block, ('torch.randn(4096, 4096, device="cuda")', "torch.randn(256, 256)"),
                      ('torch.randn(512, 4096, device="cuda")', "torch.randn(32, 256)"),
                      ("sparse_matmul(weight.values, weight.meta, x)",
                       "sparse_matmul(weight.values, weight.meta, x, interpret=True)"),
                      (".cuda()", "")), "README.md")  # its assert_close compares y with float64
    assert env["weight"].values.shape == (256, 128) and env["weight"].values.dtype == torch.float16
    assert env["y"].shape == (256, 32) and env["y"].dtype == torch.float16


def test_readme_pytorch_quick_start(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    block = block_with("README.md", "spt.sparsify_(model)")
    head, timing = block.split("# time it", 1)
    tail = timing[timing.index("import tempfile"):]
    said = re.search(r'print\(spt\.sparsify_\(model\)\)\s+# "([^"]+)"', head)
    assert said is not None
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    env = run(adapted(head + tail, ("torch.nn.Linear(4096, 14336), torch.nn.SiLU(), torch.nn.Linear(14336, 4096)",
                                    "torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256)"),
                      ("model.cuda().to(", "model.to("),
                      ("spt.sparsify_(model)", "spt.sparsify_(model, interpret=True)"),
                      ('torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)',
                       "torch.randn(16, 256, dtype=torch.bfloat16)")), "README.md")
    assert capsys.readouterr().out.strip() == said.group(1)  # the report the comment shows
    assert "# (16, 4096) bfloat16" in head
    assert env["y"].shape == (16, 256) and env["y"].dtype == torch.bfloat16
    assert all(isinstance(m, spt.SparseLinear) for m in (env["model"][0], env["model"][2]))
    (folder,) = tmp_path.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


# ------------------------------------------------------------------------------------------------
# docs/torch.md


def test_torch_md_opening_example(capsys: pytest.CaptureFixture[str]) -> None:
    block = block_with("docs/torch.md", "model = MyModel()")
    env = run(adapted(block, ("MyModel().cuda()", "MyModel()"), SPARSIFY_CPU), "docs/torch.md",
              MyModel=tiny_llama, x=IDS)
    assert len(env["report"].swapped) == 8 and not env["report"].skipped  # q k v o gate up down, lm_head
    assert capsys.readouterr().out.strip() == str(env["report"])
    assert env["y"].logits.shape == (1, 5, 61)
    assert isinstance(env["fast"], torch.nn.Module)
    fused = env["model"].model.layers[0].self_attn.q_proj
    assert fused.values.untyped_storage().data_ptr() == (
        env["model"].model.layers[0].self_attn.v_proj.values.untyped_storage().data_ptr())  # one fused buffer


def test_torch_md_fusion_example(capsys: pytest.CaptureFixture[str]) -> None:
    block = block_with("docs/torch.md", "fusion = spt.fuse_projections_(model)          #")
    model = tiny_llama()
    env = run(adapted(block, SPARSIFY_CPU), "docs/torch.md", model=model)
    fusion = env["fusion"]
    assert sorted(fusion.fused) == [MLP, "model.layers.0.self_attn.q_proj+k_proj+v_proj"]
    assert isinstance(fusion, spt.FuseReport) and not fusion.skipped
    assert capsys.readouterr().out.strip() == str(fusion)


def test_torch_md_glu_example(capsys: pytest.CaptureFixture[str]) -> None:
    block = block_with("docs/torch.md", "print(fusion.glu, fusion.no_glu)")
    model = tiny_llama()
    spt.sparsify_(model, interpret=True, min_features=16)
    unfused = logits(model)
    env = run(block, "docs/torch.md", model=model)
    assert env["fusion"].glu == {MLP: "swiglu"} and env["fusion"].no_glu == {}
    assert capsys.readouterr().out.strip() == f"{{'{MLP}': 'swiglu'}} {{}}"
    # the report's text names the activation as the doc shows it ("gated activation fused into 32 MLPs (swiglu)")
    assert "`gated activation fused into 32 MLPs (swiglu)`" in (ROOT / "docs" / "torch.md").read_text()
    assert "gated activation fused into 1 MLP (swiglu)" in str(env["fusion"])  # (one MLP: singular)
    assert "forward" not in vars(model.model.layers[0].mlp)  # glu=False: the MLP's own forward again
    assert torch.equal(logits(model), unfused)


def test_torch_md_fused_numerics_on_the_cpu() -> None:
    """docs/torch.md, "Numerics": fused projections give the unfused model's logits bit for bit;
    the fused gated activation (the default) rounds once, so it differs in the last bits only."""
    model = tiny_llama()
    spt.sparsify_(model, interpret=True, min_features=16)
    unfused = logits(model)
    spt.fuse_projections_(model, glu=False)
    assert torch.equal(logits(model), unfused)
    spt.fuse_projections_(model)
    glu = logits(model)
    assert not torch.equal(glu, unfused)  # the doc no longer claims bit equality here
    torch.testing.assert_close(glu.float(), unfused.float(), rtol=2e-2, atol=2e-2)


# (tiny_llama's sparse lm_head, 61 outputs: vLLM cannot load it and reads lm_head dense; not the docs' subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMShapeWarning")
def test_torch_md_gqa_and_checkpoint_examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_llama()
    spt.sparsify_(model, interpret=True, min_features=16)
    before = logits(model)
    run(block_with("docs/torch.md", "spt.use_gqa_decode_attention(model)"), "docs/torch.md", model=model)
    assert model.config._attn_implementation != "sdpa"
    torch.testing.assert_close(logits(model), before)  # the prefill goes to transformers' own function
    monkeypatch.chdir(tmp_path)
    block = block_with("docs/torch.md", "save_sparse24_checkpoint")
    assert "# config.json + model.safetensors" in block
    fresh = tiny_llama(seed=1)
    env = run(adapted(block, ("spt.load_sparse24_checkpoint(model,", "spt.load_sparse24_checkpoint(fresh,")),
              "docs/torch.md", model=model, fresh=fresh)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors"]
    report = env["report"]  # .sparse, .missing, .unexpected
    assert len(report.sparse) == 8 and report.missing == [] and report.unexpected == []
    fresh.config._attn_implementation = model.config._attn_implementation
    assert torch.equal(logits(fresh), logits(model))


# (tiny_llama's sparse lm_head, 61 outputs: vLLM cannot load it and reads lm_head dense; not the docs' subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMShapeWarning")
def test_torch_md_untie_before_loading_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/torch.md, "Tied weights": the way to load a checkpoint with lm_head compressed into a
    model built tied (SP0914 otherwise)."""
    saved = tiny_llama(tie_word_embeddings=False)
    spt.sparsify_(saved, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(saved, tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    model = tiny_llama(tie_word_embeddings=True, seed=1)
    run(block_with("docs/torch.md", "model.config.tie_word_embeddings = False     #"), "docs/torch.md",
        model=model, nn=torch.nn)
    assert isinstance(model.lm_head, spt.SparseLinear)
    assert torch.equal(model.model.embed_tokens.weight, saved.model.embed_tokens.weight)
    assert torch.equal(logits(model), logits(saved))


# ------------------------------------------------------------------------------------------------
# docs/training.md


class MyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


def test_training_md_example() -> None:
    block = block_with("docs/training.md", "spt.SparseTrainer(model, optimizer")
    data = [(torch.randn(8, 128, generator=torch.Generator().manual_seed(i)), torch.randn(8, 128)) for i in range(2)]
    env = run(adapted(block, ("MyModel().cuda()", "MyModel()"),
                      ('spt.sparsify_(model, dtype="bf16", trainable=True)',
                       'spt.sparsify_(model, dtype="bf16", trainable=True, interpret=True)')),
              "docs/training.md", MyModel=MyModel, data=data, loss_fn=torch.nn.functional.mse_loss)
    layer, deployed = env["model"].layer, env["deployed"]
    assert isinstance(layer, spt.SemiSparseLinear) and layer.weight.dtype == torch.float32  # the master weight
    assert env["trainer"].steps == 2
    assert isinstance(deployed, spt.SparseLinear)
    masked = layer.to_dense()
    assert torch.equal(deployed.to_dense(), masked.bfloat16().float())  # the trainer re-compressed after step()
    x = torch.randn(4, 128)
    with torch.no_grad():
        torch.testing.assert_close(deployed(x), layer(x))


def test_training_md_checkpoint_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/training.md, "Checkpoints": a trained model written, then loaded trainable into a dense one."""
    model = MyModel()
    spt.sparsify_(model, dtype="bf16", trainable=True, interpret=True)
    with torch.no_grad():
        model.layer.weight.mul_(1.5)  # (a stale layer, as after an optimizer step: compressed when written)
    monkeypatch.chdir(tmp_path)
    env = run(block_with("docs/training.md", 'spt.save_sparse24_checkpoint(model, "ckpt/")'), "docs/training.md",
              model=model, MyModel=MyModel)
    layer, trained = env["fresh"].layer, model.layer
    assert isinstance(layer, spt.SemiSparseLinear) and layer.weight.dtype == torch.float32
    assert torch.equal(layer.mask, trained.mask)
    assert torch.equal(layer.weight.detach(), trained.to_dense().bfloat16().float())
    x = torch.randn(4, 128)
    with torch.no_grad():
        assert torch.equal(env["fresh"](x), model(x))


def test_training_md_activation_sparsity_example() -> None:
    block = block_with("docs/training.md", "sparse24_activation_linear(x, weight, bias=None)")
    torch.manual_seed(0)
    up, down = torch.nn.Linear(64, 128).bfloat16(), torch.nn.Linear(128, 32).bfloat16()
    x, weight = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    env = run(block, "docs/training.md", x=x, weight=weight, up=up, down=down)
    y, h = env["y"], env["h"]
    assert y.shape == (5, 32) and y.dtype == torch.bfloat16  # y (..., N) in x's dtype
    kept = (h * spt.sparse24_mask(h)).double()
    assert ((kept != 0).reshape(5, -1, 4).sum(-1) <= 2).all()
    ref = kept @ down.weight.double().T + down.bias.double()
    magnitude = kept.abs() @ down.weight.double().abs().T + down.bias.double().abs()
    assert ((y.double() - ref).abs() <= 2**-8 * magnitude + 1e-6).all()  # one bf16 rounding of the f32 result


def test_torch_md_warm_up_example(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up example on a tiny Llama (one token: each specialization compiles for sm_90a here),
    its first call then in the interpreter."""
    from sparsile.driver import cache as cache_mod

    monkeypatch.setenv(cache_mod.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache_mod.reset_default_cache()
    try:
        block = block_with("docs/torch.md", "report = spt.warm_up(model, tokens=(1, 16, 512))")
        block = adapted(block, ('spt.sparsify_(model, dtype="e4m3")',
                                'spt.sparsify_(model, dtype="e4m3", interpret=True, min_features=16)'),
                        ("tokens=(1, 16, 512)", "tokens=(1,)"), ("y = model(x)", "y = model(IDS)"))
        env = run(block, "docs/torch.md", model=tiny_llama(), IDS=IDS)
        report = env["report"]
        assert report.compiled == len(report.kernels) > 0 and report.cached == 0 and report.target == "sm_90a"
        assert capsys.readouterr().out.strip() == str(report)
        assert env["y"].logits.shape == (1, 5, 61)
    finally:
        cache_mod.reset_default_cache()
