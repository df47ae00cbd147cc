"""``sparsile.jax.sparse_linear``: a 2:4 sparse linear layer for JAX,
``y = act(x @ W_pruned.T * scale_w * scale_x + bias)``.

The conventions are those of ``sparsile.torch``'s layer and of
:func:`sparsile.stdlib.kernels.linear.sparse_linear`: ``x`` is (..., K), the weight is (N_out, K)
given compressed as ``values`` (N_out, K/2) and its "sm90" metadata words ``meta``, and ``y`` is
(..., N_out) in x's dtype (or ``out_dtype``). The launches are those of
:class:`~sparsile.stdlib.kernels.linear_plan.SparseLinearPlan` (the Hopper ``sparse_linear_<t>`` kernels
of ``sparse_gemm_sm90.spk``, whose fused epilogue scales, adds the bias, applies the activation and
stores (T, N_out) in y's type; with split-K a second kernel, ``splitk_reduce_linear``, applies the
epilogue), each run through :func:`~.call.call`: inside ``jax.jit`` one or two custom calls on
XLA's stream. The plan (BN, split-K, CTA pairs, K padding) is chosen at trace time by
``plan_sparse_linear``'s heuristics; the tuned table the torch layer reads (``linear-<dtype>``
entries, docs/autotune.md) is not used here, so the two may split K differently (and differ in the
order of the f32 sums).

``jax.vmap`` over x and scale_x, at any depth, folds every batch into the tokens (one call); a
batched bias or weight (values, meta, scale_w: a stack of layers) runs one call per member
(``jax.lax.map``).
Gradients flow to x and the bias, not to the frozen weight (grad.py; SP0934 for the weight and for
e4m3), and can be differentiated again (``jax.hessian``).
:class:`SparseLinear` is the layer as a pytree dataclass (a Flax or Equinox module can hold one, or
call :func:`sparse_linear` with its own parameters).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ...stdlib.kernels import linear as L
from ...stdlib.kernels.arrays import check_split_k
from ...stdlib.kernels.gemm import choose_split_k, pair_ctas
from ...stdlib.kernels.linear_plan import SparseLinearPlan
from ...stdlib.sparsity.dtypes import operand_type
from ...stdlib.sparsity.errors import SparsityError
from ...stdlib.sparsity.formats import decompress, metadata_shape
from ...stdlib.sparsity.hostarray import checked_flag
from .call import call, check_concrete
from .errors import SP_JAX_ARGUMENT, SP_JAX_LINEAR_INPUT, JaxCallError
from .grad import linear_jvp
from .primitive import check_special
from .shards import check_row_shard, rows_of

LINEAR_OPERANDS = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3"}
"""values element type -> the operand type of its ``sparse_linear_<t>`` kernel."""


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
    x_dtype = np.dtype(x.dtype).name
    if op == "e4m3" and x_dtype != "float8_e4m3fn":
        raise _bad(f"e4m3 weights need e4m3 activations, got x of {x_dtype}",
                   "quantize x per token to e4m3 and pass the scale as scale_x")
    if not jnp.issubdtype(x.dtype, jnp.floating):  # (not numpy's kind: ml_dtypes gives e5m2 "f", the others "V")
        raise _bad(f"x must be floating point, got {x_dtype}", "cast x to bfloat16, float16 or float32")
    m, half_k = (int(s) for s in values.shape)
    k = int(np.shape(x)[-1])
    if k == 0:
        raise _bad("x has no features (K = 0)", "a linear layer needs at least one input feature")
    if not _fits(k, op, half_k):
        raise _bad(f"x has K = {k} features but values cover K = {2 * half_k} (shape {tuple(values.shape)})",
                   "x is (..., in_features) and values (out_features, in_features / 2)")
    want = metadata_shape("sm90", operand_type(op), m, 2 * half_k)
    if tuple(meta.shape) != tuple(want) or np.dtype(meta.dtype).name not in ("uint32", "int32"):
        raise _bad(f"meta must be {want} uint32 sm90 metadata words for a {m} x {2 * half_k} {op} weight, got "
                   f"{tuple(meta.shape)} {np.dtype(meta.dtype)}", "pass the metadata that came with values")
    if bias is not None and tuple(np.shape(bias)) != (m,):
        raise _bad(f"bias must have shape ({m},), got {tuple(np.shape(bias))}", "one bias value per output feature")
    return op, m, k, 2 * half_k


def _fits(k: int, op: str, half_k: int) -> bool:
    """Whether values of ``half_k`` columns (K = 2 * half_k) can be a weight of K = ``k``: the same K,
    or ``k`` zero-padded to less than one K step more (as compressed values of such a K are)."""
    return k <= 2 * half_k < k + max(operand_type(op).group, L.LINEAR_KERNELS[op].k_align)


def _in_features(value: Any) -> int | None:
    """``in_features`` as an int (None stays None): SP0932 for a traced value (it is static), SP0938
    for anything but a positive integer (numpy's too; not a bool, a float or a string)."""
    value = _static(value, "in_features")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _bad(f"in_features must be a positive integer, got {value!r}",
                   "in_features is the weight's own K, the width of x: (..., in_features)")
    return value


def _out_features(value: Any, values: Any) -> int | None:
    """``out_features`` as an int: SP0932 for a traced value (it is static), SP0938 for anything but
    a non-negative integer; None takes the values' rows (:func:`~.shards.rows_of`: None where the
    values have no such shape)."""
    value = _static(value, "out_features")
    if value is None:
        return rows_of(values)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(f"out_features must be a non-negative integer, got {value!r}",
                   "out_features is the weight's row count, the width of y: (..., out_features)")
    return value


def _untagged(meta: Any, values: Any, in_features: int | None) -> tuple[Any, int | None]:
    """(``meta``'s words, in_features): a :class:`MetadataBuffer` (what ``prune_and_compress``
    returns) is checked against "sm90", the values' operand width and rows (the toolkit's
    ``validate_metadata``: SP0810, SP0809, SP0812), and its K is the weight's in_features (SP0938
    if ``in_features`` says otherwise); anything else is returned as it is."""
    from ...stdlib.sparsity.buffer import MetadataBuffer
    from ...stdlib.sparsity.validate import validate_metadata

    if not isinstance(meta, MetadataBuffer):
        return meta, in_features
    op = LINEAR_OPERANDS.get(np.dtype(values.dtype).name) if hasattr(values, "dtype") else None
    rows = int(np.shape(values)[0]) if np.ndim(values) == 2 else None
    checked = validate_metadata(meta, "sm90", op, m=rows)
    if in_features is not None and in_features != checked.k:
        raise _bad(f"in_features = {in_features} was given, but the metadata was encoded for K = {checked.k}",
                   "pass the in_features of the weight the metadata came with, or leave it out")
    return jnp.asarray(np.asarray(checked.data).view(np.uint32)), checked.k


def _check_in_features(x: Any, values: Any, in_features: int | None) -> None:
    """SP0938 unless x's width is ``in_features`` (where given) and the values can hold a weight of
    that K: the values' padded K alone lets an x up to one K step short through (docs/jax.md)."""
    if in_features is None:
        return
    op = LINEAR_OPERANDS.get(np.dtype(values.dtype).name) if hasattr(values, "dtype") else None
    if op is not None and np.ndim(values) == 2 and not _fits(in_features, op, int(np.shape(values)[1])):
        raise _bad(f"in_features = {in_features} does not fit values of shape {tuple(np.shape(values))}, which "
                   f"hold a weight of K = {2 * int(np.shape(values)[1])}",
                   "values are (out_features, in_features / 2), in_features rounded up to the K step")
    if np.ndim(x) >= 1 and int(np.shape(x)[-1]) != in_features:
        raise _bad(f"x has K = {int(np.shape(x)[-1])} features but the weight has in_features = {in_features}",
                   "x is (..., in_features)")


_VALUES = (jax.Array, jax.core.Tracer, np.ndarray, np.generic, numbers.Number, list, tuple, dict)
"""What the operands may be when they reach jax (lists and dicts, pytrees, get the checks' own words)."""


def _check_kinds(operands: dict[str, Any]) -> None:
    """SP0938 for an operand that jax cannot take as a value: another library's tensor (a torch
    one), a ``jax.ShapeDtypeStruct`` (it holds no data), a memoryview, a string for an array. They
    failed inside jax ("Error interpreting argument to custom_jvp_call as a JAX value") or as
    numpy's TypeError of a torch dtype. None (bias, scales), numbers, a ``MetadataBuffer`` for
    ``meta`` and a string for the bias or a scale (``_check_real`` words it) go on."""
    from ...stdlib.sparsity.buffer import MetadataBuffer

    for what, v in operands.items():
        vector = what in ("bias", "scale_x", "scale_w")
        if v is None or isinstance(v, _VALUES) or (what == "meta" and isinstance(v, MetadataBuffer)) or \
                (vector and isinstance(v, str)):
            continue
        if isinstance(v, jax.ShapeDtypeStruct):
            raise _bad(f"{what} got a jax.ShapeDtypeStruct, which describes an array but holds no data",
                       "pass a jax or numpy array; jax.eval_shape(f, struct) gives the result's shape and dtype "
                       "without running it")
        kind = f"{type(v).__module__}.{type(v).__qualname__}"
        raise _bad(f"{what} must be {'a number or ' if vector else ''}a jax or numpy array, got {kind}",
                   "convert it first: jax.numpy.asarray(value)")


def _check_real(v: Any, what: str) -> None:
    """SP0938 unless ``v`` is None, a real number or a real (integer, float or bool) array: a string
    failed inside jax's argument handling, a complex array lost its imaginary part."""
    if v is None or (isinstance(v, numbers.Real) and not isinstance(v, np.ndarray)):
        return
    dtype = getattr(v, "dtype", None)
    if not hasattr(v, "shape") or dtype is None or not (jnp.issubdtype(dtype, jnp.floating)
                                                        or jnp.issubdtype(dtype, jnp.integer)
                                                        or jnp.issubdtype(dtype, jnp.bool_)):
        got = f"{np.dtype(dtype)} array" if dtype is not None and hasattr(v, "shape") else type(v).__name__
        raise _bad(f"{what} must be a real number or array, got {got}",
                   f"pass {what} as a float32 array (or a number)")


def _scale(v: Any, what: str, shape: tuple[int, ...]) -> tuple[Any, int]:
    """(f32 vector, mode) of a scale: mode 0 none, 1 one value, 2 one per output feature / token.
    ``shape``: the shape a per-element scale has (N_out,) or x's leading shape (or flattened)."""
    if v is None:
        return None, 0
    got = tuple(np.shape(v))
    if math.prod(got) == 1:
        return jnp.asarray(v, jnp.float32).reshape(1), 1
    if got in (shape, (math.prod(shape),), (*shape, 1)):
        return jnp.asarray(v, jnp.float32).reshape(-1), 2
    raise _bad(f"{what} must be a number or of shape {shape}, got shape {got}",
               f"pass one value, or one per {'output feature' if what == 'scale_w' else 'token'}")


class _Slot:
    """Where an array of the launch plan comes from: a name, and the shape for ``lde``."""

    def __init__(self, name: str, shape: tuple[int, ...] = ()):
        self.name, self.shape = name, shape


def _linear(x: Any, values: Any, meta: Any, bias: Any, scale_x: Any, scale_w: Any, activation: str | None,
            out_dtype: Any, interpret: bool, split_k: int | None) -> Any:
    op, m, k, k_values = _check(x, values, meta, bias)
    act = L.activation_name(activation, L.TILED_ACTIVATIONS)  # (the tiled kernels: no gated activation)
    # (a float64 x, under jax_enable_x64, gets the widest output, as the same numpy x gets without x64)
    y_dtype = "float32" if out_dtype is None and np.dtype(x.dtype) == np.float64 else L.linear_out_dtype(out_dtype, x)
    lead = tuple(int(s) for s in np.shape(x)[:-1])
    t = math.prod(lead)
    sw, sw_mode = _scale(scale_w, "scale_w", (m,))
    sx, sx_mode = _scale(scale_x, "scale_x", lead)
    if t == 0 or m == 0:
        return jnp.zeros((*lead, m), y_dtype)
    choice = L.LINEAR_KERNELS[op]
    k_padded = -(-k_values // choice.k_align) * choice.k_align
    b = jnp.asarray(x).reshape(t, k).astype(operand_type(op).host_dtype)
    if k_padded != k:  # TMA rows must be 16-byte multiples: zero columns add nothing
        b = jnp.pad(b, ((0, 0), (0, k_padded - k)))
    if k_padded != k_values:
        values = jnp.pad(values, ((0, 0), (0, (k_padded - k_values) // 2)))
    bn = choice.block_n(t)
    sms = L.planned_sm_count(False)
    split = split_k if split_k is not None else choose_split_k(m, t, k_padded, bn, choice, sms)
    pair = pair_ctas(m, t, bn, choice, split, True, sms)
    plan = SparseLinearPlan(
        choice, m, t, k, k_padded, _Slot("values"), _Slot("meta", tuple(meta.shape)), _Slot("x"), (t, k),
        np.dtype(x.dtype).name, _Slot("out"), y_dtype, None if bias is None else _Slot("bias"),
        None if sw is None else _Slot("scale_w"), None if sx is None else _Slot("scale_x"), act,
        (int(bias is not None), sw_mode, sx_mode), bn, split, _Slot("workspace") if split > 1 else None, pair)
    meta = meta if meta.dtype == jnp.uint32 else jax.lax.bitcast_convert_type(meta, jnp.uint32)
    env = {"values": values, "meta": meta, "x": b, "scale_w": sw, "scale_x": sx,
           "bias": None if bias is None else jnp.asarray(bias, jnp.float32)}
    made = {"out": jax.ShapeDtypeStruct((t, m), y_dtype), "workspace": jax.ShapeDtypeStruct((split, t, m), "float32")}
    for kernel, grid, args, constexprs in plan.launches():
        given: dict[str, Any] = {}
        produced: tuple[str, str] | None = None
        for param, arg in zip([p.name for p in kernel.params], args):
            if not isinstance(arg, _Slot):
                given[param] = arg
            elif arg.name in env:
                given[param] = env[arg.name]
            elif produced is None:  # the array this launch writes
                produced = (param, arg.name)
            else:  # the plan passes y again for an epilogue pointer it does not read (its mode is 0)
                given[param] = jnp.zeros((1,), made[arg.name].dtype)
        assert produced is not None, f"{kernel.name} writes no array of the plan"
        result = call(kernel, grid, out_shapes={produced[0]: made[produced[1]]}, interpret=interpret,
                      **given, **constexprs)
        env[produced[1]] = result[produced[0]]
    return env["out"].reshape(*lead, m)


def sparse_linear(x: Any, values: Any, meta: Any, bias: Any = None, *, activation: str | None = None,
                  scale_x: Any = None, scale_w: Any = None, out_dtype: Any = None, interpret: bool = False,
                  split_k: int | None = None, in_features: int | None = None) -> Any:
    """``y = act(x @ W_pruned.T * scale_w * scale_x + bias)`` with the fused 2:4 sparse linear
    kernels, usable inside ``jax.jit``.

    x: (..., K) floating point (e4m3 for e4m3 weights); values: (N_out, K/2) f16, bf16 or e4m3 (x
    is cast to it); meta: its sm90 metadata words, uint32 or int32, or the tagged
    ``MetadataBuffer`` of ``prune_and_compress`` (checked against the values; its K is the
    weight's in_features); in_features: the weight's own K, checked against x's width (the values'
    zero-padded K alone cannot tell a short x from padding); bias: (N_out,) or None;
    activation: None, "relu", "silu", "gelu_tanh"; scale_w: a number or (N_out,); scale_x: a number
    or one per token (x's leading shape); out_dtype: y's type (default x's dtype for f16/bf16/f32 x,
    f32 for f64 x, bfloat16 for e4m3 and the other narrow float x). Returns (..., N_out).
    ``interpret=True`` runs the kernels in the CPU interpreter through a host callback (on the CPU
    backend the FFI handler runs the interpreter anyway). ``split_k`` overrides the split-K choice;
    it and the other options are static.
    ``jax.vmap`` (nested or not, any axes) over x and scale_x folds the batch into the tokens; over
    the bias or the weight (values, meta, scale_w, any of them) it runs one call per member.
    """
    _check_kinds({"x": x, "values": values, "meta": meta, "bias": bias, "scale_x": scale_x, "scale_w": scale_w})
    _check_concrete(x, values, meta, bias, scale_x, scale_w)
    split_k = _static(split_k, "split_k")
    interpret = checked_flag(_static(interpret, "interpret"), "interpret")
    check_split_k(split_k)  # (SP0804, as the torch layer: 0, -1, True or "2" failed deep in the launch plan)
    meta, in_features = _untagged(meta, values, _in_features(in_features))
    _check_in_features(x, values, in_features)
    for what, operand in (("bias", bias), ("scale_x", scale_x), ("scale_w", scale_w)):
        _check_real(operand, what)
    pre_forward = None
    if activation is not None:  # the float32 pre-activations the rule differentiates the activation at
        pre_forward = _differentiable(_batched_linear(None, "float32", interpret, split_k), None, None)
    run = _differentiable(_batched_linear(activation, out_dtype, interpret, split_k), pre_forward, activation)
    y = run(x, values, meta, bias, scale_x, scale_w)
    if not isinstance(y, jax.core.Tracer):
        # (an eager call: jax runs the batching wrapper's body with jax_debug_nans off, as it runs any
        # jax.custom_batching.custom_vmap function, so the kernel call's own check saw no NaN; infinities
        # it saw, jax_debug_infs staying on)
        check_special([y])
    return y


def _check_options(activation: Any, out_dtype: Any) -> None:
    """SP0850 for an ``activation`` the tiled kernels do not fuse or an ``out_dtype`` sparse_linear
    has no output of, located at the user's line (where a :class:`SparseLinear` is made: its
    constructor, ``from_dense``, ``dataclasses.replace``). ``sparse_linear`` checks them again at the
    call (a layer whose fields were set another way). A dict lookup or two: cheap enough for the
    constructor call of every pytree unflatten."""
    try:
        L.activation_name(activation, L.TILED_ACTIVATIONS)
        if out_dtype is not None:
            L.linear_out_dtype(out_dtype, None)  # (x only names y's type where out_dtype is None)
    except SparsityError as e:
        raise JaxCallError(e.code, e.message, help=e.help) from None


def _check_concrete(*operands: Any) -> None:
    """SP0932 for an operand of symbolic shape (``jax.export`` with shape polymorphism): the launch
    plan is made for the shapes at trace time (it failed inside the plan, as jax's
    InconclusiveDimensionOperation, or as a K mismatch naming the symbol)."""
    for what, a in zip(("x", "values", "meta", "bias", "scale_x", "scale_w"), operands):
        if a is not None and hasattr(a, "shape"):
            check_concrete(what, np.shape(a))


def _static(value: Any, what: str) -> Any:
    """A static option as a Python value: SP0932 for a value traced by ``jax.jit`` (the launch plan
    is chosen at trace time), a numpy integer as an int."""
    if isinstance(value, jax.core.Tracer):
        raise JaxCallError(SP_JAX_ARGUMENT, f"{what} of sparse_linear is static, but got a traced value",
                           help=f"pass {what} as a Python value; a jitted function that takes it as an argument "
                                f"must mark it static: jax.jit(f, static_argnames=('{what}',))")
    return int(value) if isinstance(value, np.integer) else value


def _differentiable(forward: Any, pre_forward: Any, activation: str | None) -> Any:
    """``forward`` as a ``jax.custom_jvp`` with grad.py's rule (gradients with respect to x and bias,
    at every T, kernel or not). The rule calls this function itself, and ``pre_forward`` (made the
    same way), for its primal outputs: so the rule can be differentiated again (``jax.hessian``),
    where a call of the bare kernels would be SP0934."""
    run = jax.custom_jvp(forward)
    run.defjvp(lambda primals, tangents: linear_jvp(run, pre_forward, activation, primals, tangents),
               symbolic_zeros=True)
    return run


def _batched_linear(activation: str | None, out_dtype: Any, interpret: bool, split_k: int | None) -> Any:
    """``_linear`` with these static options as a function of the arrays, with its batching rule
    (``_batched``): ``jax.vmap`` at any depth, any in_axes / out_axes, over any of the arrays."""
    statics = (activation, out_dtype, interpret, split_k)
    fn = jax.custom_batching.custom_vmap(lambda x, v, e, b, sx, sw: _linear(x, v, e, b, sx, sw, *statics))
    fn.def_vmap(functools.partial(_batched, fn))
    return fn


def _batched(fn: Any, size: int, in_batched: list[bool], x: Any, v: Any, e: Any, b: Any, sx: Any, sw: Any) -> Any:
    """The batching rule of ``fn`` (a ``_batched_linear``): jax has moved each batched operand's
    batch axis to the front (whatever the in_axes) and checked one member's shapes (it traced ``fn``
    on them). A batch of x (and of scale_x) becomes more tokens of x, and the result is ``fn`` again
    on those: under an enclosing ``jax.vmap`` that call is batched by this rule in turn (folding
    that batch too), so every level of a nested vmap, and of a vmap of a function that vmaps, adds
    tokens to one kernel call. (Calling ``_linear`` here instead bound the kernel call under the
    enclosing vmap, which cannot batch it: SP0935 for any nested vmap.) A batched bias or weight
    cannot be folded: one call per member."""
    operands = {"x": x, "values": v, "meta": e, "bias": b, "scale_x": sx, "scale_w": sw}
    x_b, v_b, e_b, b_b, sx_b, sw_b = in_batched
    if v_b or e_b or sw_b or b_b:
        # One weight or bias per member, and the kernel multiplies by one weight and adds one bias vector
        # to all its tokens: a call per member, each on its own slices of the batched operands (the
        # unbatched ones shared). Any mix is well defined: batched values with an unbatched meta (the
        # same kept positions), a batched scale_w alone. Under an enclosing vmap the map's body is
        # batched in turn, reaching this rule again.
        batched = {what: a for (what, a), on in zip(operands.items(), in_batched) if on}
        return jax.lax.map(lambda m: fn(*(m.get(what, a) for what, a in operands.items())), batched), True
    lead = tuple(np.shape(x)[1:-1] if x_b else np.shape(x)[:-1])  # one member's token axes
    if not x_b:
        x = jnp.broadcast_to(x, (size, *np.shape(x)))
    if sx is not None:
        member = np.shape(sx)[1:] if sx_b else np.shape(sx)
        if math.prod(member) != 1:  # one per token, in any shape one call takes: (size, *lead)
            sx = jnp.broadcast_to(jnp.reshape(sx, (size if sx_b else 1, *lead)), (size, *lead))
        elif sx_b:  # one per member: each member's tokens take its scale
            sx = jnp.broadcast_to(jnp.reshape(sx, (size,) + (1,) * len(lead)), (size, *lead))
    return fn(x, v, e, b, sx, sw), True


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class SparseLinear:
    """A 2:4 sparse linear layer as a pytree: ``layer(x)`` is :func:`sparse_linear` with its arrays.

    ``values``, ``meta``, ``bias`` and ``scale_w`` are pytree leaves (so the layer can be a field
    of an Equinox module, a Flax variable, or an argument of ``jax.jit``); ``activation``,
    ``out_dtype``, ``interpret``, ``in_features`` and ``out_features`` are static.

    ``in_features``: the weight's own K (:meth:`from_dense` records it). The values of a K that is no
    multiple of the kernel's K step are zero-padded, so from them alone an x a few features short of
    K passes as the padded weight's (the missing features read as zeros: a wrong y, no error); with
    ``in_features`` set, a call checks x's width against it (SP0938). None: the values' padded K.
    ``meta`` may be given as the tagged ``MetadataBuffer`` of ``prune_and_compress``: it is checked
    against the values, the layer holds its words, and its K is ``in_features``.

    ``out_features``: the weight's row count N_out (None: the values' rows, where the values are
    an array; :meth:`from_dense` records it). jax rebuilds the layer with its static fields, so
    inside ``shard_map`` or ``pmap`` of a layer sharded over its output features the leaves are a
    device's rows and ``out_features`` is still the whole weight's: a call (and :meth:`dense`) then
    checks that the shard is whole 16-row blocks of the sm90 metadata words (SP0939; a split inside
    a block reads the words of other rows, docs/jax.md "Several devices").
    """

    values: Any
    meta: Any
    bias: Any = None
    scale_w: Any = None
    activation: str | None = dataclasses.field(default=None, metadata={"static": True})
    out_dtype: Any = dataclasses.field(default=None, metadata={"static": True})
    interpret: bool = dataclasses.field(default=False, metadata={"static": True})
    in_features: int | None = dataclasses.field(default=None, metadata={"static": True})
    out_features: int | None = dataclasses.field(default=None, metadata={"static": True})

    @classmethod
    def from_dense(cls, weight: Any, dtype: str = "bf16", bias: Any = None, **options: Any) -> SparseLinear:
        """Prune ``weight`` (N_out, K) to 2:4 by magnitude, cast to ``dtype`` (f16 or bf16) and
        compress it, on the host (``prune_and_compress``); the metadata is validated there, once.
        ``options``: the static fields (activation, out_dtype, interpret; in_features and
        out_features are the weight's)."""
        from ...stdlib.kernels import prune_and_compress

        if dtype not in ("f16", "bf16"):
            raise _bad(f"SparseLinear.from_dense has no {dtype!r} weights",
                       "use f16 or bf16; e4m3 weights need a per-channel scale: build SparseLinear(values, meta, "
                       "scale_w=...) from your own quantization")
        if isinstance(weight, jax.core.Tracer):  # (np.asarray: jax's TracerArrayConversionError)
            raise JaxCallError(SP_JAX_ARGUMENT, "SparseLinear.from_dense prunes and compresses the weight on the "
                               "host, but got a traced weight",
                               help="make the layer once, outside the transformed function, from a concrete "
                                    "weight, and pass it in as an argument (it is a pytree); gradients flow to x "
                                    "and the bias, not to the frozen weight")
        weight = np.asarray(weight)
        values, meta = prune_and_compress(weight, dtype)
        options.setdefault("in_features", int(weight.shape[-1]) if weight.ndim == 2 else None)
        options.setdefault("out_features", int(weight.shape[0]) if weight.ndim == 2 else None)
        return cls(jnp.asarray(values), jnp.asarray(meta.data.view(np.uint32)),
                   None if bias is None else jnp.asarray(bias), **options)

    def __post_init__(self) -> None:
        # (also run when jax rebuilds the pytree: only the static fields and a MetadataBuffer are touched,
        # and the static fields jax rebuilds with are those a constructor checked: out_features among
        # them, so a layer rebuilt from shards of its leaves keeps the whole weight's row count)
        _check_options(self.activation, self.out_dtype)
        meta, in_features = _untagged(self.meta, self.values, _in_features(self.in_features))
        object.__setattr__(self, "meta", meta)
        object.__setattr__(self, "in_features", in_features)
        object.__setattr__(self, "out_features", _out_features(self.out_features, self.values))

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling: a layer pickled before ``out_features`` existed (its state has no such key)
        takes its values' rows, as a constructor would, so that it is checked for row shards and has
        the pytree structure of a layer made now from the same weight."""
        self.__dict__.update(state)
        if "out_features" not in state:
            self.__dict__["out_features"] = rows_of(self.values)

    def dense(self) -> np.ndarray:
        """The pruned (N_out, K) weight on the host, in the values' dtype (for checks); K is
        ``in_features`` where it is set (the padding's zero columns left out)."""
        if isinstance(self.values, jax.core.Tracer) or isinstance(self.meta, jax.core.Tracer):
            raise JaxCallError(SP_JAX_ARGUMENT, "SparseLinear.dense() decodes the weight on the host, but the "
                               "layer's values or meta are traced",
                               help="call it outside the transformed function (on a concrete layer), or decode on "
                                    "the device with sparsile.integrations.jax.grad.dense_weight(values, meta, "
                                    "in_features)")
        op = LINEAR_OPERANDS[np.dtype(self.values.dtype).name]
        check_row_shard(self.values, self.out_features, op)
        dense = decompress(np.asarray(self.values), np.asarray(self.meta).view(np.uint32), "sm90", op)
        return dense if self.in_features is None else dense[:, :self.in_features]

    def __call__(self, x: Any, scale_x: Any = None) -> Any:
        _check_concrete(x, self.values)  # (x, then the values, whose rows the shard check reads)
        k = np.shape(x)[-1] if np.ndim(x) >= 1 else None
        if self.in_features is not None and k is not None and k != self.in_features:
            raise _bad(f"x has K = {k} features but the layer takes in_features = {self.in_features}",
                       "x is (..., in_features)")
        if hasattr(self.values, "dtype"):
            check_row_shard(self.values, self.out_features, LINEAR_OPERANDS.get(np.dtype(self.values.dtype).name))
        return sparse_linear(x, self.values, self.meta, self.bias, activation=self.activation, scale_x=scale_x,
                             scale_w=self.scale_w, out_dtype=self.out_dtype, interpret=self.interpret,
                             in_features=self.in_features)
