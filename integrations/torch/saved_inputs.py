"""What the custom ops' autograd formulas (autograd.py) save for their backward.

Without an activation, dx = d pre @ W (times scale_w) and d bias = Σ d pre need neither x's nor the
bias's values: only their shapes and dtypes (:class:`Like`), as ``nn.Linear`` with a frozen weight
needs no x. With one, the pre-activations are computed again from x, the bias and scale_x. The weight
(values, meta, scale_w) is always saved: torch refuses it written in place before the backward.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class Like(NamedTuple):
    """What a backward without an activation needs of x or the bias: shape and dtype (not its values)."""

    shape: torch.Size
    dtype: torch.dtype


def shapes_only(*tensors: torch.Tensor | None) -> tuple[Like | None, ...]:
    """Each of ``tensors`` as its :class:`Like` (None stays None): what a backward without an
    activation keeps of x and the bias."""
    return tuple(None if t is None else Like(t.shape, t.dtype) for t in tensors)


def save_inputs(ctx: Any, activation: str | None, x: torch.Tensor, bias: torch.Tensor | None,
                weight: tuple[torch.Tensor | None, ...], scale_x: torch.Tensor | None) -> None:
    """Save what the op's backward needs: the weight (values, meta, scale_w; torch then refuses it
    written in place before the backward), and x, the bias and scale_x only with an activation (the
    pre-activations are computed again from them); without one, dx = d pre @ W and d bias = Σ d pre
    need x's and the bias's shapes and dtypes only (:class:`Like`): x and the bias may be written in
    place after the call and x is not held until the backward, as for ``nn.Linear`` with a frozen
    weight and the layer (``autograd.LayerWithInputGrad``). (Before, the op saved them all: torch's
    "modified by an inplace operation" for an x written after the call, which the layer accepts.)
    ``ctx.x_dtype``: x's dtype, which the backward's refusals read before the saved tensors."""
    ctx.activation, ctx.x_dtype = activation, x.dtype
    if activation is None:
        ctx.like = shapes_only(x, bias)
        ctx.save_for_backward(*weight)
    else:
        ctx.like = None
        ctx.save_for_backward(*weight, x, bias, scale_x)


def saved_inputs(ctx: Any) -> tuple[Any, ...]:
    """(x, bias, scale_x, values, meta, scale_w) of :func:`save_inputs`: x and the bias as
    :class:`Like` and scale_x None without an activation."""
    saved = ctx.saved_tensors
    like = ctx.like
    if like is None:
        values, meta, scale_w, x, bias, scale_x = saved
    else:
        (x, bias), scale_x, (values, meta, scale_w) = like, None, saved
    return x, bias, scale_x, values, meta, scale_w
