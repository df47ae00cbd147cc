"""sparsile.torch.use_gqa_decode_attention (integrations/torch/decode_attention.py): the fold of a
decode step's grouped-query attention against attention over repeated K / V in float64, what it
declines, its fallback to transformers' function, its registration and its diagnostics (SP0907,
SP0921). The model-level check (a static-cache decode equal to recomputing the sequence) is
tests/test_benchmarks.py's, through bench_llama; both skip what needs transformers without it."""

from __future__ import annotations

import builtins

import pytest

from sparsile.integrations.errors import IntegrationError

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
from sparsile.integrations.torch import decode_attention as da  # noqa: E402 (after the skip)


def test_fold_equals_attention_over_repeated_kv():
    """fold_gqa_decode (the query heads of a KV head as its query positions) against attention over
    K / V repeated per query head, in float64 on random inputs, with a boolean and an additive mask;
    it declines what it cannot fold."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(5)
    b, heads, kv_heads, length, d = 3, 8, 2, 11, 16
    q = torch.randn(b, heads, 1, d, dtype=torch.float64, generator=g)
    k = torch.randn(b, kv_heads, length, d, dtype=torch.float64, generator=g)
    v = torch.randn(b, kv_heads, length, d, dtype=torch.float64, generator=g)
    keep = torch.rand(b, 1, 1, length, generator=g) < 0.7
    keep[..., 0] = True  # every row attends to something
    additive = torch.where(keep, 0.0, float("-inf")).to(torch.float64)
    rep = heads // kv_heads
    for mask in (None, keep, additive):
        expected = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                  attn_mask=mask, scale=0.3)
        got = da.fold_gqa_decode(q, k, v, mask, scale=0.3)
        assert got.shape == (b, heads, 1, d)
        assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(da.fold_gqa_decode(q, k, v, keep), da.fold_gqa_decode(q, k, v, None))
    assert da.fold_gqa_decode(torch.cat([q, q], 2), k, v, None) is None  # two query tokens
    assert da.fold_gqa_decode(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), None) is None
    assert da.fold_gqa_decode(q, k, v, keep.expand(b, heads, 1, length)) is None  # a per-head mask


def test_attention_falls_back_on_arguments_it_would_drop(monkeypatch):
    """gqa_folded_sdpa folds only calls whose extra arguments leave sdpa's result alone (Llama's
    position_ids, use_cache); an attention bias or sinks go to transformers' own function."""
    pytest.importorskip("transformers")
    import transformers.integrations.sdpa_attention as tsa

    calls = []
    monkeypatch.setattr(tsa, "sdpa_attention_forward", lambda *a, **kw: calls.append(sorted(kw)) or ("theirs", None))
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 4, 1, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    folded, _ = da.gqa_folded_sdpa(None, q, k, k, None, position_ids=torch.zeros(1, 1), use_cache=True)
    assert folded.shape == (1, 1, 4, 8) and not calls
    for extra in ({"position_bias": torch.zeros(1)}, {"s_aux": torch.zeros(1)}, {"output_attentions": True}):
        assert da.gqa_folded_sdpa(None, q, k, k, None, **extra)[0] == "theirs"
    assert len(calls) == 3


def test_use_on_a_model_without_a_transformers_config_is_sp0907():
    with pytest.raises(IntegrationError) as info:
        spt.use_gqa_decode_attention(torch.nn.Linear(4, 4))
    assert info.value.code == "SP0907"
    assert info.value.message == "use_gqa_decode_attention takes a transformers model, got Linear"
    with pytest.raises(IntegrationError) as info:
        spt.use_gqa_decode_attention("model")
    assert info.value.code == "SP0907" and "got str" in info.value.message


def test_without_transformers_it_is_sp0921(monkeypatch):
    """Registering needs transformers' AttentionInterface: without it, SP0921 with the install line."""
    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(IntegrationError) as info:
        da.register_gqa_decode_attention()
    assert info.value.code == "SP0921"
    assert info.value.message == ("the decode attention needs transformers with AttentionInterface and "
                                  "AttentionMaskInterface (No module named 'transformers')")
    assert info.value.help == "pip install 'transformers>=4.48'"


def test_use_selects_the_registered_attention():
    """With transformers: registered (with sdpa's mask) under its name, and the model's shared config
    names it."""
    transformers = pytest.importorskip("transformers")
    from transformers.masking_utils import AttentionMaskInterface

    config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)
    assert spt.use_gqa_decode_attention(model) == da.ATTENTION_NAME == model.config._attn_implementation
    assert transformers.AttentionInterface()[da.ATTENTION_NAME] is da.gqa_folded_sdpa
    assert da.ATTENTION_NAME in AttentionMaskInterface()


def test_a_static_cache_generate_folds_the_decode_steps_with_the_same_tokens(monkeypatch):
    """``model.generate`` with a static cache (a tiny float32 Llama, 2 KV heads for 4 query heads)
    gives the same greedy tokens after ``use_gqa_decode_attention`` as before, and its decode steps
    took the fold (the prefill did not)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=None,
                                      eos_token_id=None, pad_token_id=0)
    config._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(1, 97, (2, 5), generator=torch.Generator().manual_seed(3))

    def generate():
        return model.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                              cache_implementation="static", pad_token_id=0)

    with torch.inference_mode():
        before = generate()
        folds = []
        real = da.fold_gqa_decode
        monkeypatch.setattr(da, "fold_gqa_decode", lambda *a, **k: folds.append(real(*a, **k)) or folds[-1])
        spt.use_gqa_decode_attention(model)
        after = generate()
    assert torch.equal(before, after)
    assert sum(f is not None for f in folds) == 2 * 5 and any(f is None for f in folds)  # 2 layers x 5 decode steps
