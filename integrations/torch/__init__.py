"""``sparsile.torch``: 2:4 sparse linear layers for PyTorch models (needs the ``[torch]`` extra).

    import sparsile.torch as spt

    report = spt.sparsify_(model, dtype="bf16")     # nn.Linear -> SparseLinear (magnitude 2:4)
    y = model(x)                                    # eager: a cached launch per input shape
    compiled = torch.compile(model, fullgraph=True) # traced through torch.ops.sparsile.sparse_linear
    spt.save_sparse24_checkpoint(model, "ckpt")     # compressed-tensors sparse-24-bitmask
    spt.load_sparse24_checkpoint(other_model, "ckpt")

docs/torch.md describes the API, the conventions and what is fused.
"""

from __future__ import annotations

from . import ops
from .checkpoint import LoadReport, load_sparse24_checkpoint, save_sparse24_checkpoint
from .linear import WEIGHT_DTYPES, SparseLinear
from .sparsify import SparsifyReport, sparsify_

__all__ = ["WEIGHT_DTYPES", "LoadReport", "SparseLinear", "SparsifyReport", "load_sparse24_checkpoint", "ops",
           "save_sparse24_checkpoint", "sparsify_"]
