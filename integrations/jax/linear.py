"""``sparsile.jax.sparse_linear``: a 2:4 sparse linear layer for JAX, ``y = x @ W_pruned.T (+ bias)``.

The conventions are those of ``sparsile.torch``'s layer: ``x`` is (..., K), the weight is
(N_out, K) given compressed as ``values`` (N_out, K/2) and its "sm90" metadata words ``meta``, and
``y`` is (..., N_out) in x's dtype. It runs the shipped Hopper sparse GEMM
(``stdlib/kernels/sparse_gemm_sm90.spk``: ``C = W @ x.T``, (N_out, T) float16) through
:func:`~.call.call`, so inside ``jax.jit`` it is one or two custom calls on XLA's stream, then XLA
transposes C, casts it to x's dtype and adds the bias (one fused elementwise kernel). The launch
plan (kernel, BN, split-K, CTA pairs) is chosen at trace time exactly as
:func:`~sparsile.stdlib.kernels.plan_sparse_matmul` chooses it.

``jax.vmap`` over x folds the batch into the tokens (one call); batching the weight raises SP0935.
Differentiation raises SP0934. :class:`SparseLinear` is the layer as a pytree dataclass (a Flax or
Equinox module can hold one, or call :func:`sparse_linear` with its own parameters).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...stdlib.kernels.gemm import BM, KERNELS, choose_split_k, kernel_module, pair_ctas
from ...stdlib.sparsity.dtypes import operand_type
from ...stdlib.sparsity.formats import decompress, metadata_shape
from .call import call
from .errors import SP_JAX_LINEAR_INPUT, SP_JAX_NO_VMAP, JaxCallError

LINEAR_OPERANDS = {"float16": "f16", "bfloat16": "bf16"}
"""values element type -> the operand type of its kernel. e4m3 weights need quantized activations
with scales (the fused epilogue kernels of ``stdlib/kernels/linear.py``), not yet wired here."""
REDUCE_BLOCK = 1024


def _bad(message: str, help: str) -> JaxCallError:
    return JaxCallError(SP_JAX_LINEAR_INPUT, message, help=help)


def _check(x: Any, values: Any, meta: Any, bias: Any) -> tuple[str, int, int, int]:
    """(operand type, N_out, K of x, K of values) after checking ranks, shapes and element types."""
    for what, a in (("x", x), ("values", values), ("meta", meta)):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise _bad(f"{what} must be an array, got {type(a).__name__}", "pass jax or numpy arrays")
    if np.ndim(x) < 1:
        raise _bad(f"x must have a feature axis, got shape {tuple(np.shape(x))}", "x is (..., K)")
    if np.ndim(values) != 2:
        raise _bad(f"values must be 2-D (N_out, K/2), got shape {tuple(np.shape(values))}",
                   "pass the compressed weight from SparseLinear.from_dense / prune_and_compress")
    op = LINEAR_OPERANDS.get(np.dtype(values.dtype).name)
    if op is None:
        raise _bad(f"there is no sparse linear kernel for {np.dtype(values.dtype)} values",
                   f"compress the weight as {', '.join(LINEAR_OPERANDS.values())}")
    if np.dtype(x.dtype).kind != "f" and np.dtype(x.dtype).name not in LINEAR_OPERANDS:
        raise _bad(f"x must be floating point, got {np.dtype(x.dtype)}", "cast x to bfloat16, float16 or float32")
    m, half_k = (int(s) for s in values.shape)
    k = int(np.shape(x)[-1])
    group = operand_type(op).group
    if not k <= 2 * half_k < k + max(group, KERNELS[op].k_align):
        raise _bad(f"x has K = {k} features but values cover K = {2 * half_k} (shape {tuple(values.shape)})",
                   "x is (..., in_features) and values (out_features, in_features / 2)")
    want = metadata_shape("sm90", operand_type(op), m, 2 * half_k)
    if tuple(meta.shape) != tuple(want) or np.dtype(meta.dtype).name not in ("uint32", "int32"):
        raise _bad(f"meta must be {want} uint32 sm90 metadata words for a {m} x {2 * half_k} {op} weight, got "
                   f"{tuple(meta.shape)} {np.dtype(meta.dtype)}", "pass the metadata that came with values")
    if bias is not None and tuple(np.shape(bias)) != (m,):
        raise _bad(f"bias must have shape ({m},), got {tuple(np.shape(bias))}", "one bias value per output feature")
    return op, m, k, 2 * half_k


def _sm_count() -> int:
    from ...stdlib.kernels.gemm import _sm_count as sm_count

    return sm_count(False)


def _matmul(values: Any, meta: Any, b: Any, op: str, interpret: bool, split_k: int | None) -> Any:
    """C (N_out, T) = W @ b.T with the Hopper kernel; b is (T, K padded) in the operand type."""
    choice = KERNELS[op]
    m, t, k = int(values.shape[0]), int(b.shape[0]), int(b.shape[1])
    bn = choice.block_n(t)
    sms = _sm_count()
    split = split_k if split_k is not None else choose_split_k(m, t, k, bn, choice, sms)
    pair = pair_ctas(m, t, bn, choice, split, True, sms)
    module = kernel_module()
    scalars = {"M": m, "N": t, "K": k, "lde": int(meta.shape[1]), "ldc": t}
    meta = meta if meta.dtype == jnp.uint32 else jax.lax.bitcast_convert_type(meta, jnp.uint32)
    if split == 1:
        kernel = getattr(module, f"{choice.kernel}_pair" if pair else choice.kernel)
        grid = (pair, 1) if pair else (-(-m // BM) * -(-t // bn), 1)
        out = jax.ShapeDtypeStruct((m, t), choice.out_dtype)
        return call(kernel, grid, values, meta, b, out_shapes=out, BN=bn, interpret=interpret, **scalars)
    kernel = getattr(module, f"{choice.kernel}_splitk")
    grid = (-(-m // BM) * -(-t // bn), split)
    work = jax.ShapeDtypeStruct((split, m, t), choice.partial_dtype)
    w = call(kernel, grid, values, meta, b, out_shapes=work, BN=bn, SPLIT_K=split, interpret=interpret, **scalars)
    reduce = module.splitk_reduce
    return call(reduce, (-(-m * t // REDUCE_BLOCK),), w, out_shapes=jax.ShapeDtypeStruct((m, t), choice.out_dtype),
                MN=m * t, SPLIT_K=split, interpret=interpret)


def _linear(x: Any, values: Any, meta: Any, bias: Any, interpret: bool, split_k: int | None) -> Any:
    op, m, k, k_values = _check(x, values, meta, bias)
    lead = tuple(int(s) for s in np.shape(x)[:-1])
    t = math.prod(lead)
    if t == 0 or m == 0:
        return jnp.zeros((*lead, m), x.dtype)
    choice = KERNELS[op]
    operand = jnp.dtype(operand_type(op).host_dtype)
    b = jnp.asarray(x).reshape(t, k).astype(operand)
    k_padded = -(-k_values // choice.k_align) * choice.k_align
    if k_padded != k:  # TMA rows must be 16-byte multiples: zero columns add nothing
        b = jnp.pad(b, ((0, 0), (0, k_padded - k)))
    if k_padded != k_values:
        values = jnp.pad(values, ((0, 0), (0, (k_padded - k_values) // 2)))
    c = _matmul(values, meta, b, op, interpret, split_k)
    y = c.T.astype(x.dtype)
    if bias is not None:
        y = y + jnp.asarray(bias).astype(x.dtype)
    return y.reshape(*lead, m)


def sparse_linear(x: Any, values: Any, meta: Any, bias: Any = None, *, interpret: bool = False,
                  split_k: int | None = None) -> Any:
    """``y = x @ W_pruned.T (+ bias)`` with the 2:4 sparse GEMM, usable inside ``jax.jit``.

    x: (..., K) floating point; values: (N_out, K/2) f16 or bf16 (x is cast to it); meta: its
    (sm90) metadata words, uint32 or int32; bias: (N_out,) or None. Returns (..., N_out) in x's
    dtype. ``interpret=True`` runs the kernel in the CPU interpreter through a host callback (on
    the CPU backend the FFI handler runs the interpreter anyway). ``split_k`` overrides the split-K
    choice (static). ``jax.vmap`` over x works (the batch is folded into the tokens).
    """
    fn = jax.custom_batching.custom_vmap(lambda x, values, meta, bias: _linear(x, values, meta, bias, interpret,
                                                                                split_k))

    @fn.def_vmap
    def _batched(axis_size: int, in_batched: Any, x: Any, values: Any, meta: Any, bias: Any) -> Any:
        x_batched, *weights = in_batched
        if any(jax.tree_util.tree_leaves(weights)):
            raise JaxCallError(SP_JAX_NO_VMAP, "jax.vmap over the weight of sparse_linear is not supported",
                               help="vmap over x only (in_axes=(0, None, None, None)); stack layers with "
                                    "jax.lax.scan or a Python loop")
        if not x_batched:
            x = jnp.broadcast_to(x, (axis_size, *np.shape(x)))
        return _linear(x, values, meta, bias, interpret, split_k), True

    return fn(x, values, meta, bias)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class SparseLinear:
    """A 2:4 sparse linear layer as a pytree: ``layer(x)`` is :func:`sparse_linear` with its arrays.

    ``values``, ``meta`` and ``bias`` are pytree leaves (so the layer can be a field of an
    Equinox module, a Flax variable, or an argument of ``jax.jit``); ``interpret`` is static.
    """

    values: Any
    meta: Any
    bias: Any = None
    interpret: bool = dataclasses.field(default=False, metadata={"static": True})

    @classmethod
    def from_dense(cls, weight: Any, dtype: str = "bf16", bias: Any = None, *, interpret: bool = False
                   ) -> SparseLinear:
        """Prune ``weight`` (N_out, K) to 2:4 by magnitude, cast to ``dtype`` (f16 or bf16) and
        compress it, on the host (``prune_and_compress``); the metadata is validated there, once."""
        from ...stdlib.kernels import prune_and_compress

        if dtype not in LINEAR_OPERANDS.values():
            raise _bad(f"there is no sparse linear kernel for {dtype!r} weights",
                       f"dtype is one of {', '.join(LINEAR_OPERANDS.values())}")
        values, meta = prune_and_compress(np.asarray(weight), dtype)
        return cls(jnp.asarray(values), jnp.asarray(meta.data.view(np.uint32)),
                   None if bias is None else jnp.asarray(bias), interpret)

    def dense(self) -> np.ndarray:
        """The pruned (N_out, K) weight on the host, in the values' dtype (for checks)."""
        op = LINEAR_OPERANDS[np.dtype(self.values.dtype).name]
        return decompress(np.asarray(self.values), np.asarray(self.meta).view(np.uint32), "sm90", op)

    def __call__(self, x: Any) -> Any:
        return sparse_linear(x, self.values, self.meta, self.bias, interpret=self.interpret)
