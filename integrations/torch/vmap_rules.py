"""``torch.func.vmap`` rules of the custom ops ``sparsile::sparse_linear``,
``sparsile::sparse_linear_e4m3``, ``sparsile::quantize_per_token_e4m3`` (docs/torch.md, "Gradients") and
the trainable layer's ``sparsile::sparse_linear_train`` (docs/training.md, "Transforms and tracers").

Without a rule torch runs a vmapped op once per batch member (its "batching fallback", with a
performance warning), handing each call slices of the batched tensors: one kernel launch per member,
and per-token scales at 4-byte offsets. The ops take x of any shape (..., K) and treat every
leading index as a token, so a batch of x (and of its per-token scale_x) is more tokens: the rule
moves the batch dimension to the front and makes one call. A batched weight (values, meta, bias,
scale_w: one weight per member, e.g. an ensemble through ``torch.func.functional_call``) cannot
be one launch, since a kernel multiplies by one weight: the rule calls the op once per member,
as torch's fallback would, without its warning.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .train_transforms import batched_without_compressions


def _tokens_first(t: torch.Tensor, dim: int | None, batch: int) -> torch.Tensor:
    """``t`` with its batch dimension ``dim`` moved to the front, or broadcast to ``batch`` there
    (``dim`` None: the same tensor for every member)."""
    return t.movedim(dim, 0) if dim is not None else t.unsqueeze(0).expand(batch, *t.shape)


def _per_token_scale(scale_x: torch.Tensor, dim: int | None, lead: tuple[int, ...]) -> torch.Tensor:
    """scale_x for the folded x of leading shape ``lead`` = (batch, *tokens of a member): one scale
    per token. A member's scale_x is per tensor (one element) or per token (its tokens' count)."""
    batch = lead[0]
    s = _tokens_first(scale_x, dim, batch).reshape(batch, -1)
    if s.shape[1] == 1:  # per tensor within each member: the member's scale for each of its tokens
        s = s.expand(batch, max(1, math.prod(lead[1:])))
    return s.reshape(lead)


def _sparse_linear_vmap(info: Any, in_dims: tuple[int | None, ...], x: torch.Tensor, values: torch.Tensor,
                        meta: torch.Tensor, bias: torch.Tensor | None = None, scale_x: torch.Tensor | None = None,
                        scale_w: torch.Tensor | None = None, *, activation: str | None = None,
                        out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, int]:
    op = torch.ops.sparsile.sparse_linear
    batch = info.batch_size
    x_dim, v_dim, m_dim, b_dim, sx_dim, sw_dim = (tuple(in_dims) + (None,) * 6)[:6]
    if v_dim is None and m_dim is None and b_dim is None and sw_dim is None:  # one weight: one launch
        xb = _tokens_first(x, x_dim, batch)
        sx = None if scale_x is None else _per_token_scale(scale_x, sx_dim, tuple(xb.shape[:-1]))
        return op(xb, values, meta, bias, sx, scale_w, activation=activation, out_dtype=out_dtype), 0

    def member(t: torch.Tensor | None, dim: int | None, i: int) -> torch.Tensor | None:
        return t if t is None or dim is None else t.select(dim, i)

    ys = [op(member(x, x_dim, i), member(values, v_dim, i), member(meta, m_dim, i), member(bias, b_dim, i),
             member(scale_x, sx_dim, i), member(scale_w, sw_dim, i), activation=activation, out_dtype=out_dtype)
          for i in range(batch)]
    return torch.stack(ys), 0


def _sparse_linear_e4m3_vmap(info: Any, in_dims: tuple[int | None, ...], x: torch.Tensor, values: torch.Tensor,
                             meta: torch.Tensor, bias: torch.Tensor | None, scale_w: torch.Tensor,
                             scale_x: torch.Tensor | None = None, *, activation: str | None = None,
                             out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, int]:
    """``sparse_linear_e4m3``'s: its quantizer is per token (or elementwise, with a static per-tensor
    ``scale_x``), so a batch of x is more tokens too (the same numbers, one call); a batched weight
    or scale runs one call per member."""
    op = torch.ops.sparsile.sparse_linear_e4m3
    batch = info.batch_size
    x_dim, v_dim, m_dim, b_dim, sw_dim, *rest = in_dims
    sx_dim = rest[0] if rest else None
    if v_dim is None and m_dim is None and b_dim is None and sw_dim is None and sx_dim is None:
        return op(_tokens_first(x, x_dim, batch), values, meta, bias, scale_w, scale_x, activation=activation,
                  out_dtype=out_dtype), 0

    def member(t: torch.Tensor | None, dim: int | None, i: int) -> torch.Tensor | None:
        return t if t is None or dim is None else t.select(dim, i)

    ys = [op(member(x, x_dim, i), member(values, v_dim, i), member(meta, m_dim, i), member(bias, b_dim, i),
             member(scale_w, sw_dim, i), member(scale_x, sx_dim, i), activation=activation, out_dtype=out_dtype)
          for i in range(batch)]
    return torch.stack(ys), 0


def _quantize_vmap(info: Any, in_dims: tuple[int | None, ...], x: torch.Tensor
                   ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]:
    # per token: every leading index of x is a token, the batch's included (x is batched: vmap calls
    # the rule only then)
    xq, scale = torch.ops.sparsile.quantize_per_token_e4m3(x.movedim(in_dims[0], 0))
    return (xq, scale), (0, 0)


def train_call_vmap(call: Any, batch: int, in_dims: tuple[int | None, ...], tensors: tuple[Any, ...],
                    out_dtype: torch.dtype | None) -> tuple[torch.Tensor, int]:
    """The vmap rule of a ``sparse_linear_train`` call ``call(*tensors)``: ``tensors`` the op's (x (T, K)
    per member, weight, mask, values, meta, values_t, meta_t, bias) and ``in_dims`` their batch
    dimensions (None: the same tensor for every member), ``batch`` the batch size, ``out_dtype`` the
    call's (None: x's dtype). Only x batched (a batch of inputs; per-sample gradients, whose weight is
    every member's): the batch is more tokens, one call on (batch * T, K), since the op's rows are
    independent tokens (its backward then computes the weight's gradient over every token at once, as
    for the flat batch). A batched weight, mask, compression or bias (an ensemble through
    ``torch.func.functional_call``): one call per member (a kernel multiplies by one weight), stacked.
    Returns (y, 0), y (batch, T, N)."""
    x, x_dim = tensors[0], in_dims[0]
    for name, dim in (("weight", in_dims[1]), ("mask", in_dims[2])):
        if dim is not None and in_dims[3] is None:  # (the layer's own check, where dynamo traced past it)
            raise batched_without_compressions(name)
    if x_dim is not None and all(d is None for d in in_dims[1:]) and x.dim() == 3:  # (else the op's diagnostic)
        xb = x.movedim(x_dim, 0)
        y = call(xb.reshape(batch * xb.shape[1], xb.shape[2]), *tensors[1:])
        return y.reshape(batch, xb.shape[1], y.shape[-1]), 0

    def member(t: Any, dim: int | None, i: int) -> Any:
        return t if dim is None else t.select(dim, i)

    ys = [call(*(member(t, d, i) for t, d in zip(tensors, in_dims, strict=True))) for i in range(batch)]
    if ys:
        return torch.stack(ys), 0
    # (no member: y has no rows; a member's T and N from the shapes, as the op's fake gives them)
    values, v_dim = tensors[3], in_dims[3]
    tokens = x.shape[1 if x_dim == 0 else 0]
    n = values.shape[1 if v_dim == 0 else 0]
    return x.new_empty((0, tokens, n), dtype=out_dtype or x.dtype), 0


def _sparse_linear_train_vmap(info: Any, in_dims: tuple[int | None, ...], x: torch.Tensor, weight: torch.Tensor,
                              mask: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, values_t: torch.Tensor,
                              meta_t: torch.Tensor, bias: torch.Tensor | None = None, *,
                              out_dtype: torch.dtype | None = None, mask_grad: bool = True
                              ) -> tuple[torch.Tensor, int]:
    """``sparse_linear_train``'s (:func:`train_call_vmap`): before, torch's batching fallback ran the op
    once per member, with its performance warning, also for a batch of x alone."""
    def call(*tensors: Any) -> torch.Tensor:
        return torch.ops.sparsile.sparse_linear_train(*tensors, out_dtype=out_dtype, mask_grad=mask_grad)

    tensors = (x, weight, mask, values, meta, values_t, meta_t, bias)
    return train_call_vmap(call, info.batch_size, (tuple(in_dims) + (None,) * 8)[:8], tensors, out_dtype)


def register_train_vmap_rule(lib: torch.library.Library) -> None:
    """Register ``sparsile::sparse_linear_train``'s rule on ``lib`` (the library of training.py, which
    defines the op)."""
    torch.library.register_vmap("sparsile::sparse_linear_train", _sparse_linear_train_vmap, lib=lib)


def register_vmap_rules(lib: torch.library.Library) -> None:
    """Register the three rules on ``lib`` (the ``sparsile`` library of ops.py)."""
    torch.library.register_vmap("sparsile::sparse_linear", _sparse_linear_vmap, lib=lib)
    torch.library.register_vmap("sparsile::sparse_linear_e4m3", _sparse_linear_e4m3_vmap, lib=lib)
    torch.library.register_vmap("sparsile::quantize_per_token_e4m3", _quantize_vmap, lib=lib)
