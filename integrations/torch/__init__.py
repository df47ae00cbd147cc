"""``sparsile.torch``: 2:4 sparse linear layers for PyTorch models (needs the ``[torch]`` extra).

    import sparsile.torch as spt

    report = spt.sparsify_(model, dtype="bf16")     # nn.Linear -> SparseLinear (magnitude 2:4)
    spt.fuse_projections_(model)                    # q/k/v and gate/up: one launch each (eager, CUDA graphs)
    y = model(x)                                    # eager: a cached launch per input shape
    compiled = torch.compile(model, fullgraph=True) # traced through torch.ops.sparsile.sparse_linear
    spt.save_sparse24_checkpoint(model, "ckpt")     # compressed-tensors sparse-24-bitmask
    spt.load_sparse24_checkpoint(other_model, "ckpt")
    spt.use_gqa_decode_attention(hf_model)          # transformers' sdpa at decode without copying the KV cache
    spt.warm_up(model, tokens=(1, 16, 512))         # compile the first calls' kernels ahead, in parallel

    layer = spt.SparseLinear.from_dense(linear, trainable=True)   # 2:4 training (docs/training.md)
    y = spt.sparse24_activation_linear(x, weight)                 # 2:4 activation sparsity

docs/torch.md describes the API, the conventions and what is fused; docs/training.md sparse training.
"""

from __future__ import annotations

import torch as _torch

from ..torch_version import require_torch_release

require_torch_release(_torch.__version__)  # SP0908 before a module below fails inside an older torch

from ..vllm_match import VLLMMatchWarning  # noqa: E402
from ..vllm_shapes import VLLMLayoutWarning, VLLMShapeWarning  # noqa: E402
from . import ops, traced_errors  # noqa: E402
from .activation import sparse24_activation_linear, sparse24_mask  # noqa: E402
from .checkpoint import LoadReport, load_sparse24_checkpoint, save_sparse24_checkpoint  # noqa: E402
from .decode_attention import use_gqa_decode_attention  # noqa: E402
from .first_call import WarmUpReport, warm_up  # noqa: E402
from .fuse import DEFAULT_GROUPS, FuseReport, fuse_projections_  # noqa: E402
from .linear import WEIGHT_DTYPES, SparseLinear  # noqa: E402
from .sparsify import SparsifyReport, sparsify_  # noqa: E402
from .training import SemiSparseLinear, SparseTrainer, recompress_, reprune_, transposable_mask  # noqa: E402

traced_errors.install()  # sparsile's errors, not dynamo's, under torch.compile(fullgraph=True)

__all__ = ["DEFAULT_GROUPS", "WEIGHT_DTYPES", "FuseReport", "LoadReport", "SemiSparseLinear", "SparseLinear",
           "SparseTrainer", "SparsifyReport", "VLLMLayoutWarning", "VLLMMatchWarning", "VLLMShapeWarning",
           "WarmUpReport", "fuse_projections_",
           "load_sparse24_checkpoint", "ops", "recompress_", "reprune_", "save_sparse24_checkpoint",
           "sparse24_activation_linear", "sparse24_mask", "sparsify_", "transposable_mask",
           "use_gqa_decode_attention", "warm_up"]
