"""Gradients through :func:`~.linear.sparse_linear` with a frozen weight (docs/jax.md, "Gradients").

``sparse_linear`` is an inference layer: its weight (``values``, ``meta``, ``scale_w``) has no
gradient. A model that trains something else (LoRA adapters, a prompt, the layers before a frozen
sparse block) still needs the gradient *through* it, with respect to x and the bias. This is the
JAX side of what ``sparsile.torch``'s layer does (its ``autograd.py``), as a ``jax.custom_jvp``
rule whose tangent map is linear, so that ``jax.grad`` / ``jax.vjp`` transpose it:

* ``pre = (x @ Wᵀ) * scale_w * scale_x + bias``, ``y = act(pre)``, W = the pruned weight decoded
  from ``values`` and the "sm90" words in float32 (:func:`dense_weight`, on the device, in jnp);
* ``t_pre = (t_x @ Wᵀ) * scale_w * scale_x + t_bias``: the rounding of x to the operand type is
  taken as the identity (a straight-through gradient), as the torch layer does;
* with an activation, the pre-activations are computed again (the kernel with no activation and a
  float32 output) and jax's own activation is differentiated there;
* ``dx = (d pre * scale_w * scale_x) @ W`` is then a dense GEMM: correct, not fast.

Refused (SP0934), never silently zero: a gradient with respect to ``values``, ``scale_w`` or
``scale_x``, and any gradient of an e4m3 layer (its x is 8-bit: a tangent in e4m3 would keep 3
mantissa bits). ``meta`` is integer and has none.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...stdlib.sparsity.dtypes import operand_type
from .errors import SP_JAX_NO_AUTODIFF, JaxCallError

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "gelu_tanh": lambda t: jax.nn.gelu(t, approximate=True),
}
"""The tiled kernels' activations (linear.TILED_ACTIVATIONS) as jax functions, in float32."""


def _deinterleave_rows(words: jax.Array) -> jax.Array:
    """16-bit operands' "sm90" words back in row order: the inverse of the layout's row interleave
    (16-row blocks whose two 8-row halves share words, one per 16-bit half; docs/sparse-metadata.md).
    The jnp twin of ``stdlib.sparsity.layouts._deinterleave_rows``."""
    mp, cols = words.shape
    by_half = words.reshape(mp // 16, 2, 8, cols).transpose(0, 2, 3, 1)  # (block, row, word, half)
    halves = jnp.stack([by_half & 0xFFFF, by_half >> 16], axis=1).reshape(mp, cols, 2)
    return halves[..., 0] | (halves[..., 1] << 16)


@partial(jax.jit, static_argnames="k")
def dense_weight(values: jax.Array, meta: jax.Array, k: int) -> jax.Array:
    """The pruned weight (N, k) in float32 from 16-bit ``values`` (N, Kv/2) and their "sm90"
    metadata words, in jnp (traceable, on the arrays' device): equal to the host's ``decompress``.
    Each 4-bit code of a 4-element group holds the two kept positions (2 bits each, PTX ISA
    9.7.15.5.1.1.1). Jitted (one XLA computation per shape and ``k``): eagerly, as in an un-jitted
    ``jax.grad``, its dozen jnp operations were each compiled on their own, ~0.4 s per new shape."""
    op = operand_type({"float16": "f16", "bfloat16": "bf16"}[np.dtype(values.dtype).name])
    n, half = (int(s) for s in values.shape)
    chunks = 2 * half // op.group
    words = meta if meta.dtype == jnp.uint32 else jax.lax.bitcast_convert_type(meta, jnp.uint32)
    if op.interleaved:
        words = _deinterleave_rows(words)
    shifts = 4 * jnp.arange(8, dtype=jnp.uint32)  # the nibbles of a word, lowest first (little-endian bytes)
    codes = ((words[:, :, None] >> shifts) & 0xF).reshape(words.shape[0], -1)[:n, :chunks]
    kept = values.astype(jnp.float32).reshape(n, chunks, 2)
    column = jnp.arange(op.group, dtype=jnp.uint32)
    dense = (jnp.where(column == (codes & 3)[..., None], kept[..., :1], 0.0)
             + jnp.where(column == (codes >> 2)[..., None], kept[..., 1:], 0.0))  # (not * one-hot: inf * 0)
    return dense.reshape(n, chunks * op.group)[:, :k]


def _given(tangent: Any) -> bool:
    """Whether a tangent is there: not None (an absent operand) and not a symbolic zero."""
    return tangent is not None and not isinstance(tangent, jax.custom_derivatives.SymbolicZero)


def _refuse(message: str, help: str) -> JaxCallError:
    return JaxCallError(SP_JAX_NO_AUTODIFF, message, help=help)


def linear_jvp(forward: Any, pre_forward: Any, activation: str | None, primals: tuple, tangents: tuple) -> tuple:
    """The JVP of ``forward(x, values, meta, bias, scale_x, scale_w)`` (y) for tangents of x and
    bias; ``pre_forward`` computes the float32 pre-activations (called only with an activation).
    Both are the differentiable functions (linear.py's ``_differentiable``), so that this rule can
    be differentiated again (second derivatives)."""
    x, values, meta, _, scale_x, scale_w = primals
    t_x, t_values, _, t_bias, t_scale_x, t_scale_w = tangents
    for what, tangent in (("values", t_values), ("scale_w", t_scale_w), ("scale_x", t_scale_x)):
        if _given(tangent):
            raise _refuse(f"sparse_linear's weight is frozen: {what} has no gradient",
                          f"take the gradient with respect to x or bias only (jax.lax.stop_gradient({what}), or "
                          "leave it out of the differentiated arguments); the weight is not trained here")
    y = forward(*primals)
    if not (_given(t_x) or _given(t_bias)):
        return y, jnp.zeros(y.shape, y.dtype)
    if np.dtype(values.dtype).name not in ("float16", "bfloat16"):
        raise _refuse(f"sparse_linear with {np.dtype(values.dtype)} weights cannot be differentiated",
                      "use f16 or bf16 weights for a gradient through the layer (an e4m3 x would carry an "
                      "8-bit tangent)")
    k = int(x.shape[-1])
    tokens = int(np.prod(x.shape[:-1]))
    n = int(values.shape[0])
    t_pre = jnp.zeros((tokens, n), jnp.float32)
    if _given(t_x):
        w = dense_weight(values, meta, k)
        t_pre = jnp.matmul(t_x.reshape(tokens, k).astype(jnp.float32), w.T, precision=jax.lax.Precision.HIGHEST)
        for scale, per_token in ((scale_w, False), (scale_x, True)):
            if scale is not None:
                s = jnp.asarray(scale, jnp.float32).reshape(-1)
                t_pre = t_pre * (s[:, None] if per_token and s.size != 1 else s)  # (T = 0: s is (0,))
    if _given(t_bias):
        t_pre = t_pre + t_bias.astype(jnp.float32)
    if activation is not None:
        pre = pre_forward(*primals).reshape(tokens, n)
        t_pre = jax.jvp(ACTIVATIONS[activation], (pre,), (t_pre,))[1]
    return y, t_pre.reshape(y.shape).astype(y.dtype)
