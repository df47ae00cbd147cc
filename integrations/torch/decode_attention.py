"""``use_gqa_decode_attention(model)``: transformers' sdpa attention without its copies of the KV
cache at decode (docs/torch.md, "Decoding with transformers").

A 2:4 model decodes faster only where the rest of the step lets it. With a static KV cache,
transformers' sdpa attention always has a mask, and then it does not pass ``enable_gqa`` to
``scaled_dot_product_attention``. Instead it copies each layer's whole K and V cache once per query
head (``repeat_kv``) at every step. At batch 16 on the H200 that was 1.6 ms of a 10.2 ms dense
Llama-3-8B step (benchmarks/RESULTS.md, thirty-first session), the same for dense and sparse
models, so it hid a third of what the sparse projections save.

:func:`fold_gqa_decode` computes the same attention without the copies. With one query token, the
``heads / kv_heads`` query heads that share a KV head become that head's query positions: q (b,
heads, 1, d) is reshaped to (b, kv_heads, heads / kv_heads, d). A mask that is the same for every
head broadcasts over them, and K and V are read once. :func:`gqa_folded_sdpa` is transformers'
sdpa attention function with this fold at decode. Everything else goes to transformers' own
function: the prefill, a per-head mask, ``output_attentions``, and any argument the fold would
drop. :func:`use_gqa_decode_attention` registers it (with sdpa's mask) and selects it for a model.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import SP_SPARSIFY_ARGUMENTS, SP_TRANSFORMERS, IntegrationError

ATTENTION_NAME = "sparsile_sdpa_gqa_decode"
"""The name :func:`gqa_folded_sdpa` is registered under in transformers' ``AttentionInterface``."""
FOLD_IGNORES = frozenset({"position_ids", "cache_position", "use_cache", "output_attentions"})
"""The keyword arguments transformers passes its attention functions that do not change what sdpa
computes (Llama's decoder passes position_ids and use_cache)."""


def fold_gqa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                    dropout: float = 0.0, scale: float | None = None) -> torch.Tensor | None:
    """Grouped-query attention of one query token, reading K and V once: query (b, heads, 1, d), key
    and value (b, kv_heads, L, d), ``mask`` None or (b, 1, 1, L) (bool or additive); returns
    (b, heads, 1, d), or None where the fold does not apply (more than one query token, no grouping,
    a per-head mask). Query head h reads KV head h // (heads / kv_heads), as after ``repeat_kv``."""
    b, heads, q_len, d = query.shape
    kv_heads = key.shape[1]
    per_head_mask = mask is not None and (mask.dim() != 4 or tuple(mask.shape[1:3]) != (1, 1))
    if q_len != 1 or heads == kv_heads or heads % kv_heads or per_head_mask:
        return None
    folded = query.reshape(b, kv_heads, heads // kv_heads, d)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=dropout,
                                                           scale=scale)
    return out.reshape(b, heads, 1, d)


def gqa_folded_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' sdpa attention function (its signature and its output layout (b, q, heads, d))
    with :func:`fold_gqa_decode` at decode; anything else, and any call with an argument outside
    :data:`FOLD_IGNORES` (an attention bias, sinks), goes to transformers' own."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = not kwargs.get("output_attentions") and all(v is None or k in FOLD_IGNORES for k, v in kwargs.items())
    out = fold_gqa_decode(query, key, value, attention_mask, dropout, scaling) if plain else None
    if out is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    return out.transpose(1, 2).contiguous(), None


def register_gqa_decode_attention() -> str:
    """Register :func:`gqa_folded_sdpa` in transformers, with sdpa's mask function (a name without
    one gets no mask); returns its name, :data:`ATTENTION_NAME`. SP0921 without a transformers that
    has ``AttentionInterface`` (4.48 and later)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as exc:
        raise IntegrationError(SP_TRANSFORMERS, f"the decode attention needs transformers with AttentionInterface "
                               f"and AttentionMaskInterface ({exc})",
                               help="pip install 'transformers>=4.48'") from None
    AttentionInterface.register(ATTENTION_NAME, gqa_folded_sdpa)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME


def use_gqa_decode_attention(model: Any) -> str:
    """Make ``model`` (a transformers model: its ``config`` names its attention) use
    :func:`gqa_folded_sdpa`; returns the attention's name. Its config is shared with its layers, so
    the next forward uses it. SP0907 for a model without a transformers config, SP0921 without
    transformers."""
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or not hasattr(config, "_attn_implementation"):
        what = type(model).__name__ + ("" if config is None else " whose config names no attention")
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS,
                               f"use_gqa_decode_attention takes a transformers model, got {what}",
                               help="pass the model transformers built (its config has _attn_implementation)")
    name = register_gqa_decode_attention()
    config._attn_implementation = name
    return name
