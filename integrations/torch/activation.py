"""2:4 activation sparsity: ``y = sparse24(x) @ W.T + bias`` with the *activation* as the sparse operand.

The workload of xformers' ``sparsify24`` and of 2:4 activation sparsity after squared-ReLU: at run
time every group of 4 consecutive features of each token keeps its 2 largest |x| (ties to the lower
index, the toolkit's rule), and the product runs on the sparse tensor cores with the compressed
activation as operand A. docs/training.md ("Activation sparsity") describes the costs.

    y = sparse24_activation_linear(x, weight, bias)      # x (..., K), weight (N, K) bf16 / f16

How it runs (``torch.ops.sparsile.sparse24_linear``):

1. x (T, K) is pruned and compressed to values (T, K/2) and "sm90" metadata in one pass:
   ``compress_gpu`` on CUDA (stdlib/kernels/sparsity_24.spk), the host toolkit on the CPU;
2. the sparse linear kernel (stdlib/kernels/linear.py) with A = compressed x and the dense weight
   as its B operand computes C = sparse24(x) @ Wᵀ; its epilogue stores C transposed, so the call
   returns (N, T) = Yᵀ in the output dtype (float32 when there is a bias);
3. one elementwise pass writes Y = (Yᵀ)ᵀ (+ bias) contiguous (T, N).

Not fused: the pruning runs as its own kernel before the GEMM (one read of x and a write of half
of it plus metadata), not inside the GEMM's producer. Backward (``register_autograd``): the 2:4
mask is recomputed from the saved x (:func:`sparse24_mask`), dX = (dY @ W)·mask and
dW = dYᵀ @ sparse24(x) are dense GEMMs, db = Σ dY.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...stdlib.kernels.sparsity_gpu import compress_gpu
from ...stdlib.sparsity import as_host_array, compress, encode_metadata
from ..errors import SP_ACT_SPARSE, IntegrationError
from ._kernels import OUT_DTYPES, as_torch, kernel_api

_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def sparse24_mask(x: torch.Tensor) -> torch.Tensor:
    """The bool mask (x's shape) of the 2 largest |x| of every 4 consecutive elements along the last
    axis, ties to the lower index, NaN above every number, -0 as 0: the toolkit's pruning rule,
    compared on the same integer keys (bits & 0x7FFF) as the GPU kernel. x is bf16 or f16; a last
    axis that is not a multiple of 4 is zero-padded."""
    if x.dtype not in _NAMES:
        raise IntegrationError(SP_ACT_SPARSE, f"sparse24_mask takes bfloat16 or float16 x, got {x.dtype}",
                               help="cast x to the compute dtype first")
    k = int(x.shape[-1])
    keys = x.contiguous().view(torch.int16).to(torch.int32) & 0x7FFF
    if k % 4:
        keys = torch.nn.functional.pad(keys, (0, 4 - k % 4))
    groups = keys.reshape(*keys.shape[:-1], -1, 4)
    ki, kj = groups.unsqueeze(-1), groups.unsqueeze(-2)        # [..., i, j]
    lower = torch.ones(4, 4, dtype=torch.bool, device=x.device).tril(-1)  # j < i
    beats = ((kj > ki) | ((kj == ki) & lower)).sum(-1)           # how many lanes beat lane i
    return (beats < 2).reshape(keys.shape)[..., :k]


def _compressed(x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (T, K/2), int32 "sm90" words) of x pruned to 2:4, where x lives."""
    if x.is_cuda:
        values, meta = compress_gpu(x, name, "sm90")
        return values, meta.data.view(torch.int32)
    values, indices = compress(as_host_array(x, "x"), name, prune=True)
    words = encode_metadata(indices, "sm90", name, k=int(x.shape[1])).data
    return (torch.from_numpy(np.ascontiguousarray(values).view(np.int16)).view(x.dtype),
            torch.from_numpy(np.array(words, copy=True).view(np.int32)))


def _check(x: Any, weight: Any, bias: Any, what: str = "sparse24_activation_linear") -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise IntegrationError(SP_ACT_SPARSE, f"{what} takes torch tensors x and weight, got "
                               f"{type(x).__name__} and {type(weight).__name__}", help="pass torch tensors")
    if weight.dim() != 2 or weight.dtype not in _NAMES:
        raise IntegrationError(SP_ACT_SPARSE, f"{what}: weight must be a 2-D bfloat16 or float16 (N, K) tensor, "
                               f"got {weight.dtype} {tuple(weight.shape)}",
                               help="cast the weight to the compute dtype (the kernel's B operand)")
    k = int(weight.shape[1])
    if x.dim() == 0 or x.shape[-1] != k or x.dtype not in OUT_DTYPES:
        raise IntegrationError(SP_ACT_SPARSE, f"{what}: x must be (..., {k}) bfloat16, float16 or float32 for a "
                               f"weight {tuple(weight.shape)}, got {x.dtype} {tuple(x.shape)}",
                               help="the last dimension of x is the weight's in_features")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (int(weight.shape[0]),)
                             or not bias.is_floating_point()):
        got = f"{bias.dtype} {tuple(bias.shape)}" if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise IntegrationError(SP_ACT_SPARSE, f"{what}: bias must be a floating ({int(weight.shape[0])},) tensor, "
                               f"got {got}", help="one bias value per output feature")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise IntegrationError(SP_ACT_SPARSE, f"{what}: x is on {x.device} but {name} is on {t.device}",
                                   help="put x, weight and bias on one device")


@torch.library.custom_op("sparsile::sparse24_linear", mutates_args=())
def sparse24_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y (T, N) = sparse24(x) @ weight.T + bias for 2-D x in weight's dtype; y in ``out_dtype``
    (default x's dtype)."""
    _check(x, weight, bias, "sparsile.sparse24_linear")
    if x.dim() != 2 or x.dtype != weight.dtype:
        raise IntegrationError(SP_ACT_SPARSE, f"sparsile.sparse24_linear: x must be 2-D {weight.dtype}, got "
                               f"{x.dtype} {tuple(x.shape)}", help="call sparse24_activation_linear")
    out = out_dtype or x.dtype
    t, n = int(x.shape[0]), int(weight.shape[0])
    y = torch.empty((t, n), dtype=out, device=x.device)
    if t == 0 or n == 0:
        return y
    values, words = _compressed(x.contiguous(), _NAMES[x.dtype])
    kernel_out = torch.float32 if bias is not None else out
    y_t = kernel_api().sparse_linear(values, words, weight.contiguous(), out_dtype=OUT_DTYPES[kernel_out],
                                     interpret=not x.is_cuda)
    y_t = as_torch(y_t, x.device, kernel_out)     # (N, T): the kernel's epilogue stores C transposed
    if bias is None:
        y.copy_(y_t.t())
    else:
        torch.add(y_t.t(), bias.float(), out=y)   # one rounding, of the f32 sum
    return y


@sparse24_linear.register_fake
def _sparse24_linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _check(x, weight, bias, "sparsile.sparse24_linear")
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=out_dtype or x.dtype)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    x, weight = ctx.saved_tensors
    mask = sparse24_mask(x)
    dyk = dy.to(x.dtype)
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = torch.matmul(dyk, weight) * mask
    if ctx.needs_input_grad[1]:
        dw = torch.matmul(dyk.t(), x * mask)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
        db = dy.float().sum(0).to(ctx.bias_dtype)
    return dx, dw, db


torch.library.register_autograd("sparsile::sparse24_linear", _backward, setup_context=_setup_context)


def sparse24_activation_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                               ) -> torch.Tensor:
    """``sparse24(x) @ weight.T + bias``: x (..., K) (bf16, f16 or f32, cast to the weight's type
    before pruning), weight (N, K) bf16 or f16, bias (N,) or None; y (..., N) in x's dtype.
    Differentiable in x, weight and bias (module docstring). SP0919 for arguments that do not fit."""
    _check(x, weight, bias)
    x2 = x.reshape(-1, int(weight.shape[1])).to(weight.dtype)
    y = torch.ops.sparsile.sparse24_linear(x2, weight, bias, out_dtype=x.dtype)
    return y.reshape(*x.shape[:-1], int(weight.shape[0]))


__all__ = ["sparse24_activation_linear", "sparse24_linear", "sparse24_mask"]
