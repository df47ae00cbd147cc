"""Greedy decoding of a Llama-3-8B-shaped ``transformers.LlamaForCausalLM`` (random weights, bf16) on
the GPU, dense against 2:4 sparse: tokens/s of dense bf16, sparsile (``sparsile.torch.sparsify_``),
sparsile-fused (``sparsify_`` then ``fuse_projections_(traced=True)``: q/k/v and gate/up run as one
kernel each, in eager and CUDA-graph decoding and under torch.compile, ``glu=True``: SwiGLU in the
gate/up kernel's epilogue up to 64 tokens), sparsile-fused-noglu (the same with ``glu=False``: silu
and the product run as torch's elementwise kernels on the fused output's views) and torch
semi-structured (``to_sparse_semi_structured``, cuSPARSELt), batch 1 and 16.

    python benchmarks/bench_llama.py                        # 8 layers, batch 1 and 16, CUDA graphs
    python benchmarks/bench_llama.py --layers 32 --modes graph compile --json llama.json
    python benchmarks/bench_llama.py --layers 32 --modes graph compile --models dense sparsile sparsile-fused

Every attention and MLP projection (q, k, v, o, gate, up, down; not lm_head) is pruned to 2:4 by
magnitude first, so the three models compute the same function. Decoding: a prompt of ``--prompt``
random tokens (prefill, eager), then ``--new-tokens`` greedy steps with a static KV cache
(transformers' ``StaticCache``); each decode step runs as one replayed CUDA graph (``graph``: the
step captured with ``torch.cuda.graph``), through ``torch.compile(mode="reduce-overhead")``
(``compile``) or eagerly (``eager``). Attention (``--attention``): by default ``sdpa-gqa``,
``sparsile.torch.use_gqa_decode_attention``'s (integrations/torch/decode_attention.py: transformers'
sdpa without its per-step copies of the KV cache, the same result); ``sdpa``: transformers' own.
tokens/s = batch x decode steps / decode time (prefill
excluded; median of ``--repeats`` runs). A mode that fails for a model is reported and skipped.

Check: one forward (no cache) of a fixed prompt through each model, its logits against those of a
float32 copy of the pruned dense model; a 2:4 model passes when its max |error| is at most twice
the dense bf16 model's (bf16 tolerance). Argmax agreement with the dense bf16 model is printed too.
Target (issue 12): sparsile (or sparsile-fused) >= 1.3x dense tokens/s at batch 1 and 16.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import (  # a sibling script, not a package
    environment,
    first_line,
    positive,
    prune_24,
    raise_dynamo_limits,
    torch_layer_missing,
)

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODELS = ("dense", "sparsile", "sparsile-fused", "sparsile-fused-noglu", "semi")
SPARSILE_MODELS = ("sparsile", "sparsile-fused", "sparsile-fused-noglu")  # the models the target is about
MODES = ("graph", "compile", "eager")
ATTENTIONS = ("sdpa", "sdpa-gqa")  # transformers' own sdpa attention; the same without its repeat_kv copies at decode
TARGET_SPEEDUP = 1.3
WARMUP_STEPS = 4  # decode steps that Decoder.prepare may run past the prompt (warm-up and capture)
DEVICE = "cuda"  # the tests run the whole script on "cpu" (eager decoding, a tiny config)
# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json), all but the layer count
LLAMA3_8B = {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=positive, default=8, help="decoder layers (Llama-3-8B has 32)")
    ap.add_argument("--batches", nargs="+", type=positive, default=[1, 16])
    ap.add_argument("--prompt", type=positive, default=128, help="prompt tokens")
    ap.add_argument("--new-tokens", type=positive, default=128, help="tokens generated (the first by the prefill)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--modes", nargs="+", choices=MODES, default=["graph"], help="how a decode step runs")
    ap.add_argument("--repeats", type=positive, default=3, help="timed decodes per case (median)")
    ap.add_argument("--check-tokens", type=int, default=32, help="prompt length of the logits check (0: no check)")
    ap.add_argument("--attention", choices=ATTENTIONS, default="sdpa-gqa",
                    help="sdpa-gqa (default): transformers' sdpa attention with the query heads of a KV head folded "
                         "into the query length at decode; sdpa: transformers' own (copies the K / V cache once per "
                         "query head at every decode step)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE")
    args = ap.parse_args(argv)
    if args.new_tokens < 2:
        ap.error("--new-tokens must be at least 2 (one from the prefill, one decode step)")
    return args


def llama3_config(layers: int, attention: str = "sdpa", **overrides: Any) -> Any:
    """A ``LlamaConfig`` of Llama-3-8B with ``layers`` decoder layers (``overrides`` for tiny test models),
    its attention one of :data:`ATTENTIONS`."""
    from transformers import LlamaConfig

    values = {**LLAMA3_8B, "num_hidden_layers": layers, **overrides}
    params = inspect.signature(LlamaConfig.__init__).parameters
    if "rope_theta" not in params and "rope_parameters" in params:  # transformers 5: rope settings in one dict
        values["rope_parameters"] = {"rope_type": "default", "rope_theta": values.pop("rope_theta")}
    config = LlamaConfig(**values)
    if attention == "sdpa":
        config._attn_implementation = "sdpa"
    else:  # sparsile.torch's decode attention (registered with transformers)
        from sparsile.integrations.torch.decode_attention import register_gqa_decode_attention

        config._attn_implementation = register_gqa_decode_attention()
    return config


def build_model(config: Any, device: str, dtype: Any) -> Any:
    """A randomly initialized ``LlamaForCausalLM`` on ``device`` in ``dtype``, in eval mode."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def is_projection(module: Any, fqn: str) -> bool:
    """The ``filter_fn`` of ``sparsify_`` (torchao's contract: module, fully qualified name): the
    attention and MLP projections."""
    import torch

    return isinstance(module, torch.nn.Linear) and fqn.rsplit(".", 1)[-1] in PROJECTIONS


def projections(model: Any) -> list[tuple[str, Any]]:
    return [(name, m) for name, m in model.named_modules() if is_projection(m, name)]


def prune_projections_(model: Any) -> int:
    """Prune every projection's weight to 2:4 by magnitude, in place; returns how many."""
    import torch

    found = projections(model)
    with torch.no_grad():
        for _, lin in found:
            lin.weight.copy_(prune_24(lin.weight))
    return len(found)


def sparsify_sparsile(model: Any) -> Any:
    """``sparsile.torch.sparsify_`` on the projections; returns its report."""
    from sparsile.torch import sparsify_

    return sparsify_(model, filter_fn=is_projection)


def sparsify_sparsile_fused(model: Any, glu: bool = True) -> Any:
    """:func:`sparsify_sparsile`, then ``sparsile.torch.fuse_projections_(traced=True, glu=glu)``
    (fused in the torch.compile trace too: transformers' Llama writes nothing in place between the
    sibling projections; ``glu``: the gated activation, Llama's SwiGLU, in the gate/up kernel's
    epilogue; its report becomes the sparsify report's ``fusion``); returns the sparsify report."""
    from sparsile.torch import fuse_projections_

    report = sparsify_sparsile(model)
    report.fusion = fuse_projections_(model, traced=True, glu=glu)
    return report


def sparsify_sparsile_fused_noglu(model: Any) -> Any:
    """:func:`sparsify_sparsile_fused` with ``glu=False`` (the MLP's own silu and product)."""
    return sparsify_sparsile_fused(model, glu=False)


def sparsify_semi(model: Any) -> str:
    """Replace each projection's weight by ``to_sparse_semi_structured`` of it; says how many."""
    import torch
    from torch.sparse import to_sparse_semi_structured

    found = projections(model)
    for _, lin in found:
        lin.weight = torch.nn.Parameter(to_sparse_semi_structured(lin.weight.detach()), requires_grad=False)
    return f"{len(found)} projection weights made semi-structured sparse"


# ------------------------------------------------------------------------------------------------
# decoding with a static cache, across transformers versions


def init_parameters(cls: type) -> set[str]:
    """The keyword arguments ``cls(...)`` takes: its ``__init__``'s named parameters and, where that
    passes ``**kwargs`` on, those of the base classes' ``__init__`` it forwards them to."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names - {"self"}


def make_static_cache(model: Any, batch: int, max_len: int) -> Any:
    """``StaticCache`` for ``batch`` sequences of ``max_len`` tokens, passing only the arguments this
    transformers version takes (batch size, device and dtype are lazy in recent versions)."""
    from transformers import StaticCache

    params = init_parameters(StaticCache)
    p = next(model.parameters())
    offered = {"config": model.config, "max_cache_len": max_len, "device": p.device, "dtype": p.dtype}
    size_kw = next((k for k in ("batch_size", "max_batch_size") if k in params), None)  # the newer name first
    if size_kw:
        offered[size_kw] = batch
    return StaticCache(**{k: v for k, v in offered.items() if k in params})


class Decoder:
    """Greedy decoding of ``batch`` sequences with a static cache; ``mode`` says how a decode step
    runs: "eager", "graph" (the whole step replayed from one CUDA graph) or "compile"
    (``torch.compile(model.forward, mode="reduce-overhead")``). State lives in fixed tensors (the
    last token, its position), so a replayed step reads and advances them."""

    def __init__(self, model: Any, batch: int, max_len: int, mode: str = "eager") -> None:
        import torch

        self.model, self.batch, self.mode = model, batch, mode
        device = next(model.parameters()).device
        self.cache = make_static_cache(model, batch, max_len + WARMUP_STEPS)  # room for the warm-up steps
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.use_cache_position = "cache_position" in params
        self.logits_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.cache_pos = torch.zeros(1, dtype=torch.long, device=device)
        self.forward = model.forward
        if mode == "compile":
            self.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        self.graph = None
        self.next_token = None

    def _call(self, forward: Callable[..., Any], ids: Any, pos: Any, cache_pos: Any) -> Any:
        kw: dict[str, Any] = {"input_ids": ids, "position_ids": pos, self.cache_kw: self.cache, "use_cache": True}
        if self.use_cache_position:
            kw["cache_position"] = cache_pos
        if self.logits_kw:
            kw[self.logits_kw] = 1
        return forward(**kw).logits[:, -1, :]

    def prefill(self, prompt: Any) -> Any:
        """Reset the cache, run the prompt (eagerly), return the first generated token (batch,)."""
        import torch

        self.cache.reset()
        n = prompt.shape[1]
        cache_pos = torch.arange(n, device=prompt.device)
        logits = self._call(self.model.forward, prompt, cache_pos[None].expand(prompt.shape[0], -1), cache_pos)
        first = logits.argmax(-1)
        self.ids.copy_(first[:, None])
        self.pos.fill_(n)
        self.cache_pos.fill_(n)
        return first

    def _step(self) -> Any:
        nxt = self._call(self.forward, self.ids, self.pos, self.cache_pos).argmax(-1)
        self.ids.copy_(nxt[:, None])
        self.pos.add_(1)
        self.cache_pos.add_(1)
        return nxt

    def prepare(self, prompt: Any) -> None:
        """Warm up (and for "graph" capture) the decode step; the cache state it leaves is discarded by
        the next ``prefill``."""
        import torch

        self.prefill(prompt)
        if self.mode == "eager":
            for _ in range(2):
                self._step()
            return
        if self.mode == "compile":
            for _ in range(3):  # cudagraph trees record on the third call
                torch.compiler.cudagraph_mark_step_begin()
                self._step()
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.next_token = self._step()
        torch.cuda.synchronize()

    def step(self) -> Any:
        """One decode step: the next token (batch,), a tensor that the following step may overwrite."""
        if self.graph is not None:
            self.graph.replay()
            return self.next_token
        if self.mode == "compile":
            import torch

            torch.compiler.cudagraph_mark_step_begin()
        return self._step()

    def generate(self, prompt: Any, new_tokens: int, sync: Callable[[], None] = lambda: None
                 ) -> tuple[Any, float]:
        """(tokens (batch, new_tokens), seconds of the decode steps, after the prefill)."""
        import torch

        out = torch.empty(prompt.shape[0], new_tokens, dtype=torch.long, device=prompt.device)
        out[:, 0] = self.prefill(prompt)
        sync()
        start = time.perf_counter()
        for i in range(1, new_tokens):
            out[:, i] = self.step()
        sync()
        return out, time.perf_counter() - start


def greedy_reference(model: Any, prompt: Any, new_tokens: int) -> Any:
    """Greedy tokens by recomputing the whole sequence at every step (no cache): the slow reference."""
    import torch

    seq = prompt
    for _ in range(new_tokens):
        logits = model(input_ids=seq, use_cache=False).logits[:, -1, :]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq[:, prompt.shape[1]:]


# ------------------------------------------------------------------------------------------------
# the logits check


def logits_of(model: Any, prompt: Any) -> Any:
    return model(input_ids=prompt, use_cache=False).logits.float()


def compare_logits(got: Any, ref: Any, dense: Any) -> dict[str, float]:
    """max |got - ref| (absolute and relative to max |ref|), and the fraction of positions whose argmax
    equals the dense bf16 model's."""
    err = (got - ref).abs().max().item()
    return {"max_abs_err": err, "rel_err": err / max(ref.abs().max().item(), 1e-30),
            "argmax_agree": (got.argmax(-1) == dense.argmax(-1)).float().mean().item()}


def within_bf16_tolerance(sparse_err: float, dense_err: float) -> bool:
    """A 2:4 model's logits are within bf16 tolerance when they are at most twice as far from the
    float32 reference as the dense bf16 model's."""
    return sparse_err <= 2.0 * dense_err


# ------------------------------------------------------------------------------------------------


def requirements_missing() -> str | None:
    """Why this benchmark cannot run here, or None."""
    return torch_layer_missing("transformers")


def build_models(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    """The pruned dense bf16 model and, as ``args.models`` asks, its sparsile and semi-structured
    copies (a model that cannot be built is reported and left out)."""
    import torch

    t = time.perf_counter()
    dense = build_model(config, DEVICE, torch.bfloat16)
    pruned = prune_projections_(dense)
    print(f"Llama-3-8B config, {args.layers} layers, {sum(p.numel() for p in dense.parameters()) / 1e9:.2f} B "
          f"parameters, {pruned} projections pruned to 2:4 ({time.perf_counter() - t:.1f} s)", flush=True)
    models = {"dense": dense}
    builders = {"sparsile": sparsify_sparsile, "sparsile-fused": sparsify_sparsile_fused,
                "sparsile-fused-noglu": sparsify_sparsile_fused_noglu, "semi": sparsify_semi}
    for name in [m for m in args.models if m != "dense"]:
        t = time.perf_counter()
        try:
            models[name] = copy.deepcopy(dense)
            report = builders[name](models[name])
            print(f"{name} ({time.perf_counter() - t:.1f} s): {report}", flush=True)
            swapped = getattr(report, "swapped", None)
            if swapped is not None and len(swapped) != pruned:
                print(f"WARNING: {name} swapped {len(swapped)} of the {pruned} projections: the rest stay dense")
            fusion = getattr(report, "fusion", None)
            if fusion is not None and fusion.skipped:
                print(f"WARNING: {name} left {len(fusion.skipped)} projection groups unfused")
            if fusion is not None and fusion.no_glu:
                print(f"WARNING: {name} left the gated activation unfused in {len(fusion.no_glu)} MLPs")
        except Exception as e:
            models.pop(name, None)
            print(f"{name}: could not be built: {first_line(e)}", flush=True)
    return models


def check_logits(models: dict[str, Any], vocab: int, tokens: int) -> dict[str, Any]:
    """Logits of one forward of a fixed (2, ``tokens``) prompt through every model, against a float32
    copy of the pruned dense model; prints and returns the comparison."""
    import torch

    g = torch.Generator(device=DEVICE).manual_seed(1)
    prompt = torch.randint(0, vocab, (2, tokens), device=DEVICE, generator=g)
    ref_model = copy.deepcopy(models["dense"]).float()
    ref = logits_of(ref_model, prompt)
    del ref_model
    torch.cuda.empty_cache()
    dense_logits = logits_of(models["dense"], prompt)
    base = compare_logits(dense_logits, ref, dense_logits)
    print(f"\nlogits vs the float32 pruned model (2x{tokens} tokens):")
    print(f"- dense bf16: max abs err {base['max_abs_err']:.3e} (rel {base['rel_err']:.2e})")
    out: dict[str, Any] = {"dense": base}
    for name in [m for m in models if m != "dense"]:
        try:
            got = logits_of(models[name], prompt)
            c = compare_logits(got, ref, dense_logits)
            c["vs_dense_bf16"] = (got - dense_logits).abs().max().item()
            c["ok"] = within_bf16_tolerance(c["max_abs_err"], base["max_abs_err"])
            print(f"- {name}: max abs err {c['max_abs_err']:.3e} (rel {c['rel_err']:.2e}); max |{name} - dense bf16| "
                  f"{c['vs_dense_bf16']:.3e}; argmax agrees with dense bf16 at {100 * c['argmax_agree']:.1f} % of "
                  f"positions: {'PASS' if c['ok'] else 'FAIL'} (bf16 tolerance: at most 2x the dense bf16 error)")
        except Exception as e:
            c = {"error": first_line(e)}
            print(f"- {name}: forward failed: {c['error']}")
        out[name] = c
    return out


def decode_runs(models: dict[str, Any], args: argparse.Namespace, vocab: int) -> list[dict[str, Any]]:
    """Time the decode of every model in every mode at every batch size, printing a table as it goes."""
    import torch

    runs: list[dict[str, Any]] = []
    header = "| model | batch | mode | tokens/s | ms/step | vs dense | tokens = eager |"
    print(f"\n{header}\n" + "|---" * 7 + "|", flush=True)
    for batch in args.batches:
        g = torch.Generator(device=DEVICE).manual_seed(batch)
        prompt = torch.randint(0, vocab, (batch, args.prompt), device=DEVICE, generator=g)
        for mode in args.modes:
            base = None
            for name, model in models.items():
                if name not in args.models:  # dense built as the source of the others, not asked to be timed
                    continue
                run: dict[str, Any] = {"model": name, "batch": batch, "mode": mode}
                try:
                    run.update(time_decode(model, prompt, args.new_tokens, mode, args.repeats))
                except Exception as e:
                    run["error"] = first_line(e)
                if name == "dense":
                    base = run.get("tokens_per_s")
                elif base and "tokens_per_s" in run:
                    run["speedup"] = run["tokens_per_s"] / base
                runs.append(run)
                print(format_run(run), flush=True)
                if mode == "compile":
                    fresh_compile_state()
                torch.cuda.empty_cache()
    return runs


def fresh_compile_state() -> None:
    """Forget the compiled step of the model just timed: its CUDA-graph tree keeps the static outputs
    of its last replay alive in the shared graph pool, and the next model's recording refuses a pool
    holding tensors it does not track ("Detected N tensor(s) in the cudagraph pool not tracked as
    outputs")."""
    import gc

    import torch

    torch._dynamo.reset()
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()
    gc.collect()


def target_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One verdict per sparsile model, batch and mode on the issue-12 target: >= 1.3x dense tokens/s."""
    lines = []
    for r in runs:
        if r["model"] not in SPARSILE_MODELS:
            continue
        where = f"batch {r['batch']}, {r['mode']}"
        if "speedup" not in r:
            lines.append(f"- [n/a ] {r['model']} >= {TARGET_SPEEDUP}x dense tokens/s, {where}: not measured")
        else:
            ok = r["speedup"] >= TARGET_SPEEDUP
            lines.append(f"- [{'PASS' if ok else 'FAIL'}] {r['model']} >= {TARGET_SPEEDUP}x dense tokens/s, {where}: "
                         f"{r['speedup']:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = requirements_missing()
    if missing is not None:
        print(f"bench_llama needs an NVIDIA GPU, torch, transformers and sparsile.torch: {missing}", file=sys.stderr)
        return 3  # (the sparsile CLI's exit status for what this machine or installation lacks)
    import torch
    import transformers

    started = time.perf_counter()
    env = {**environment(), "transformers": transformers.__version__}
    print(" | ".join(f"{k} {v}" for k, v in env.items()))
    if "compile" in args.modes:
        raise_dynamo_limits()
    config = llama3_config(args.layers, args.attention)
    print(f"attention: {args.attention} ({config._attn_implementation})")
    result: dict[str, Any] = {"env": env, "args": {k: str(v) for k, v in vars(args).items()}}
    with torch.no_grad():  # built as a user would build a model; run under inference_mode
        models = build_models(args, config)
    with torch.inference_mode():
        if args.check_tokens > 0:
            result["check"] = check_logits(models, config.vocab_size, args.check_tokens)
        result["runs"] = decode_runs(models, args, config.vocab_size)
    print(f"\ntokens/s = batch x decode steps / decode time (prefill excluded), median of {args.repeats} runs; "
          "tokens = eager: the first decode steps equal those of an eager decode of the same model")
    print("\n".join(target_lines(result["runs"])))
    print(f"{time.perf_counter() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


def time_decode(model: Any, prompt: Any, new_tokens: int, mode: str, repeats: int, agree_steps: int = 8
                ) -> dict[str, Any]:
    """Decode ``repeats`` times in ``mode``; tokens/s of the median run and whether its first
    ``agree_steps`` tokens equal an eager decode's."""
    import torch

    def sync() -> None:
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    decoder = Decoder(model, prompt.shape[0], prompt.shape[1] + new_tokens, mode)
    decoder.prepare(prompt)
    times, tokens = [], None
    for _ in range(repeats):
        tokens, seconds = decoder.generate(prompt, new_tokens, sync)
        times.append(seconds)
    seconds = statistics.median(times)
    steps = new_tokens - 1
    eager = Decoder(model, prompt.shape[0], prompt.shape[1] + new_tokens, "eager")
    check, _ = eager.generate(prompt, min(agree_steps, new_tokens))
    agree = bool((check == tokens[:, : check.shape[1]]).all().item())
    return {"tokens_per_s": prompt.shape[0] * steps / seconds, "ms_per_step": 1e3 * seconds / steps,
            "tokens_equal_eager": agree}


def format_run(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"| {r['model']} | {r['batch']} | {r['mode']} | failed: {r['error']} | | | |"
    speed = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
    return (f"| {r['model']} | {r['batch']} | {r['mode']} | {r['tokens_per_s']:.1f} | {r['ms_per_step']:.3f} | "
            f"{speed} | {'yes' if r['tokens_equal_eager'] else 'NO'} |")


if __name__ == "__main__":
    sys.exit(main())
