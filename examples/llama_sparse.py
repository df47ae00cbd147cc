"""A Llama model made 2:4 sparse with sparsile, then generating text (token ids) faster.

Run it on a machine with an NVIDIA Hopper GPU, torch and transformers:
``python examples/llama_sparse.py [--layers 4] [--batch 1] [--new-tokens 64]``.

It builds a ``LlamaForCausalLM`` shaped like Llama-3-8B (random weights, bf16, ``--layers`` decoder
layers), times greedy generation with a static KV cache, swaps every attention and MLP projection
for a ``sparsile.torch.SparseLinear`` with ``sparsify_`` (each weight pruned to 2:4 by magnitude and
compressed; ``fuse=True``: q/k/v and gate/up each run as one kernel, docs/torch.md "Fusing sibling
projections"; the gated activation, Llama's SwiGLU, in the gate/up kernel's epilogue unless ``--no-glu``,
"Fusing the gated activation (SwiGLU, GeGLU)"), and times
the same generation again. Both use ``sparsile.torch.use_gqa_decode_attention`` (transformers'
sdpa attention without its per-step copies of the KV cache; ``--hf-attention`` keeps transformers'
own, docs/torch.md "Decoding with transformers"). With a real checkpoint, load it with
``LlamaForCausalLM.from_pretrained(...)`` instead and check the pruned model's quality before use.

Exit status, as the ``sparsile`` command line's: 0 success, 2 bad arguments, 3 what this machine or
installation lacks (no GPU, torch or transformers missing).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Sparsify a Llama model with sparsile and time its generation.")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers, Llama-3-8B has 32 (default 4)")
    ap.add_argument("--batch", type=int, default=1, help="sequences generated together (default 1)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt length in tokens (default 128)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens generated per sequence, timed (default 64)")
    ap.add_argument("--no-glu", action="store_true",
                    help="keep the MLP's own SiLU and product instead of the gated activation (SwiGLU) in the fused "
                         "gate/up kernel (docs/torch.md, 'Fusing the gated activation (SwiGLU, GeGLU)')")
    ap.add_argument("--hf-attention", action="store_true",
                    help="keep transformers' sdpa attention (it copies the KV cache per query head at every step)")
    args = ap.parse_args(argv)
    for name in ("layers", "batch", "prompt", "new_tokens"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    return args


def is_projection(module: Any, name: str) -> bool:
    """Which layers to sparsify: the attention and MLP projections (not the embedding or lm_head)."""
    return name.rsplit(".", 1)[-1] in PROJECTIONS


def tokens_per_second(model: Any, prompt: Any, new_tokens: int) -> float:
    """Greedy generation with a static KV cache (recent transformers compile its decode step); the
    first call warms up, the second is timed. Counts generated tokens over the whole call."""
    import torch

    def generate() -> Any:
        return model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              cache_implementation="static", pad_token_id=0)

    generate()
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = generate()
    torch.cuda.synchronize()
    return (out.shape[1] - prompt.shape[1]) * prompt.shape[0] / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"llama_sparse.py needs torch and transformers: {e}", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("llama_sparse.py needs an NVIDIA GPU (sparsile's sparse kernels run on Hopper)", file=sys.stderr)
        return 3

    from sparsile.torch import sparsify_, use_gqa_decode_attention

    config = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                         num_key_value_heads=8, num_hidden_layers=args.layers, max_position_embeddings=8192)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompt = torch.randint(0, config.vocab_size, (args.batch, args.prompt), device="cuda")
    if not args.hf_attention:
        use_gqa_decode_attention(model)  # for the dense and the sparse model alike

    with torch.inference_mode():
        dense = tokens_per_second(model, prompt, args.new_tokens)
    print(f"dense bf16:      {dense:8.1f} tokens/s")

    report = sparsify_(model, filter_fn=is_projection, fuse=True, glu=not args.no_glu)  # prune, compress, swap, fuse
    print(report)
    with torch.inference_mode():
        sparse = tokens_per_second(model, prompt, args.new_tokens)
    print(f"sparsile 2:4:    {sparse:8.1f} tokens/s ({sparse / dense:.2f}x dense)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
