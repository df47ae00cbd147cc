"""Training step of a Llama-3-8B MLP block (gate, up, down; 8192 tokens; bf16) on the GPU, dense
against 2:4 sparse (docs/training.md).

    python benchmarks/bench_training.py
    python benchmarks/bench_training.py --tokens 4096 --json training.json

The block is ``down(silu(gate(x)) * up(x))`` with hidden 4096 and intermediate 14336, no biases,
bf16 weights and activations. Rows (median µs per call over ``--blocks`` timed blocks, each call
followed by nothing but the next; a block ends with a synchronize):

* ``dense fwd`` / ``dense fwd+bwd``: three ``nn.Linear`` (cuBLAS); backward = dX and dW of each;
* ``2:4 fwd`` / ``2:4 fwd+bwd``: three ``SemiSparseLinear`` with bf16 master weights and
  transposable masks: forward and dX on sparsile's sparse kernel, dW dense and masked;
* ``2:4 fwd+bwd+refresh``: the same plus ``recompress_`` (what a ``SparseTrainer`` adds after each
  optimizer step); ``refresh`` and ``reprune``: ``recompress_`` / ``reprune_`` alone;
* ``dense + 2:4 act fwd+bwd``: dense gate and up, the down projection on
  ``sparse24_activation_linear`` (the activation pruned to 2:4 at run time).

Check: the 2:4 block's output and input gradient against a dense block holding the same masked
weights (both bf16; max |error| / max |value| printed). Target (issue 14): 2:4 forward + backward
faster than dense. Needs an NVIDIA GPU, torch and sparsile.torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import (  # a sibling script
    environment,
    first_line,
    positive,
    relative_error,
    time_calls,
    torch_layer_missing,
)

HIDDEN, INTERMEDIATE, TOKENS = 4096, 14336, 8192  # Llama-3-8B's MLP, one 8192-token batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=positive, default=TOKENS)
    parser.add_argument("--hidden", type=positive, default=HIDDEN)
    parser.add_argument("--intermediate", type=positive, default=INTERMEDIATE)
    parser.add_argument("--blocks", type=positive, default=7, help="timed blocks per row (median)")
    parser.add_argument("--json", type=Path, help="also write the rows and the environment here")
    return parser.parse_args(argv)


def requirements_missing() -> str | None:
    """Why the benchmark cannot run here, or None."""
    return torch_layer_missing()


class Block:
    """``down(silu(gate(x)) * up(x))`` over three linear modules (any of nn.Linear / SemiSparseLinear);
    ``sparse_act`` runs the down projection on the 2:4-pruned activation."""

    def __init__(self, gate: Any, up: Any, down: Any, sparse_act: bool = False):
        self.gate, self.up, self.down, self.sparse_act = gate, up, down, sparse_act
        self.modules = (gate, up, down)

    def __call__(self, x: Any) -> Any:
        import torch.nn.functional as F

        h = F.silu(self.gate(x)) * self.up(x)
        if self.sparse_act:
            import sparsile.torch as spt

            return spt.sparse24_activation_linear(h, self.down.weight)
        return self.down(h)

    def parameters(self) -> list[Any]:
        return [p for m in self.modules for p in m.parameters()]


def training_call(block: Block, x: Any, grad: Any) -> Callable[[], None]:
    """One forward + backward (x requires grad: dX of the first layers is computed, as mid-network)."""
    params = block.parameters()

    def call() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        block(x).backward(grad)

    return call


def forward_call(block: Block, x: Any) -> Callable[[], None]:
    import torch

    def call() -> None:
        with torch.no_grad():
            block(x)

    return call


def build(args: argparse.Namespace) -> tuple[Block, Block, Block, Any, Any]:
    """(dense, 2:4, dense-with-the-2:4-masks) blocks, x and the output gradient."""
    import torch

    import sparsile.torch as spt

    torch.manual_seed(0)
    shapes = ((args.intermediate, args.hidden), (args.intermediate, args.hidden), (args.hidden, args.intermediate))
    dense = []
    for n, k in shapes:
        layer = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        dense.append(layer)
    sparse = [spt.SemiSparseLinear.from_dense(layer, "bf16") for layer in dense]
    masked = []
    for layer, s in zip(dense, sparse, strict=True):
        m = torch.nn.Linear(layer.in_features, layer.out_features, bias=False, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            m.weight.copy_(s.weight * s.mask)
        masked.append(m)
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16) / 64
    return Block(*dense), Block(*sparse), Block(*masked), x, grad


def check(sparse: Block, masked: Block, x: Any, grad: Any) -> dict[str, float]:
    """The 2:4 block's y and dX against the dense block holding the same masked weights."""
    outputs = []
    for block in (sparse, masked):
        x.grad = None
        y = block(x)
        y.backward(grad)
        outputs.append((y.detach().double(), x.grad.detach().double()))
    (y, dx), (y_ref, dx_ref) = outputs
    return {"y": relative_error(y, y_ref), "dx": relative_error(dx, dx_ref)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import sparsile.torch as spt

    dense, sparse, masked, x, grad = build(args)
    sync = torch.cuda.synchronize
    layers = torch.nn.ModuleList(sparse.modules)
    rows: dict[str, float | str] = {}

    def refresh_step() -> None:
        training_call(sparse, x, grad)()
        spt.recompress_(layers)

    cases: list[tuple[str, Callable[[], Any]]] = [
        ("dense fwd", forward_call(dense, x)),
        ("2:4 fwd", forward_call(sparse, x)),
        ("dense fwd+bwd", training_call(dense, x, grad)),
        ("2:4 fwd+bwd", training_call(sparse, x, grad)),
        ("2:4 fwd+bwd+refresh", refresh_step),
        ("refresh", lambda: spt.recompress_(layers)),
        ("reprune", lambda: spt.reprune_(layers)),
        ("dense + 2:4 act fwd+bwd", training_call(Block(*dense.modules, sparse_act=True), x, grad)),
    ]
    for name, fn in cases:
        try:
            rows[name] = time_calls(fn, sync, blocks=args.blocks, max_calls=20).wall
        except Exception as e:  # a failing row is reported, the others still run
            rows[name] = first_line(e)
    errors = check(sparse, masked, x, grad)
    return {"environment": environment(), "shape": vars(args) | {"json": None}, "rows": rows, "errors": errors}


def table(result: dict[str, Any]) -> str:
    """The rows as a markdown table, speedups against the dense row of the same pass."""
    rows = result["rows"]
    base = {"fwd": rows.get("dense fwd"), "fwd+bwd": rows.get("dense fwd+bwd")}
    lines = ["| case | µs | vs dense |", "|---|---|---|"]
    for name, value in rows.items():
        if not isinstance(value, float):
            lines.append(f"| {name} | {value} | |")
            continue
        ref = base["fwd"] if name.endswith(" fwd") else base["fwd+bwd"] if "fwd+bwd" in name else None
        speed = f"{ref / value:.2f}x" if isinstance(ref, float) and not name.startswith("dense fwd") else ""
        lines.append(f"| {name} | {value:.0f} | {speed} |" if speed else f"| {name} | {value:.0f} | |")
    errors = result["errors"]
    lines.append(f"\ncheck against dense with the same masks: y {errors['y']:.2e}, dX {errors['dx']:.2e} "
                 "(max |error| / max |value|, bf16)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = requirements_missing()
    if missing is not None:
        print(f"bench_training needs an NVIDIA GPU, torch and sparsile.torch: {missing}", file=sys.stderr)
        return 2
    result = run(args)
    env = result["environment"]
    print(f"# {env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, sparsile {env['commit']}, {env['date']}")
    print(f"# Llama-3-8B MLP block: hidden {args.hidden}, intermediate {args.intermediate}, {args.tokens} tokens, "
          "bf16")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
