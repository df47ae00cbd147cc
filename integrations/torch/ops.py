"""The custom ops ``torch.ops.sparsile.sparse_linear``, ``torch.ops.sparsile.quantize_per_token_e4m3`` and
``torch.ops.sparsile.sparse_linear_e4m3``.

Registered through ``torch.library`` with a fake (meta) implementation each, so
``torch.compile(..., fullgraph=True)`` and ``torch.export`` see one opaque node per layer. The
real implementation runs the kernel: on CUDA tensors through the launch records of
:mod:`._kernels` (a process-wide cache keyed by the weight's pointers), on CPU tensors in the
interpreter. ``SparseLinear`` calls these ops only while being traced; in eager mode it calls the
launch records directly (a custom op's dispatch costs tens of microseconds).

``sparse_linear(x, values, meta, bias=None, scale_x=None, scale_w=None, *, activation=None,
out_dtype=None)``: ``torch.library`` refuses keyword-only tensors, so the scales may also be passed
by position; by keyword the call reads as vLLM's ``cutlass_scaled_sparse_mm``. x (..., K): for
bf16 / f16 values bf16, f16 or float32, cast to values' dtype inside (so that a traced layer's float32
x keeps its float32 gradient, as the eager layer's; autograd.py), for float8_e4m3fn values
float8_e4m3fn with ``scale_x``; values (N, K/2), meta the int32 "sm90" metadata words, bias (N,),
scale_w (N,) or (1,), scale_x (T,) or (1,) for the T = x.numel() / K tokens; y (..., N) in
``out_dtype`` (default: x's dtype, bf16 for fp8 x). A gated activation,
``activation="swiglu"`` or ``"geglu"``: values are the 2F rows [gate; up] (bias and scale_w 2F
entries, gate's then up's) and y (..., F) = act(gate) * up, act silu or gelu_tanh: in the kernel
where :func:`._kernels.glu_in_kernel` (1 to 64 tokens, Hopper or the CPU interpreter), computed in
float32 and rounded once; else the pre-activations in the output type, then torch's activation and
multiply, as the unfused MLP (:func:`._kernels.glu_unfused`; docs/torch.md, "Fusing the gated
activation (SwiGLU, GeGLU)"). On CUDA the metadata is
checked for shape only (its nibbles are trusted, as ``sparse_matmul`` trusts device words); on the
CPU the interpreter checks them on every call.

``sparse_linear_e4m3(x, values, meta, bias, scale_w, scale_x=None, *, activation=None, out_dtype=None)``:
the two ops above in one, ``quantize_per_token_e4m3(x)`` then ``sparse_linear`` on the fp8 x with its
scale (the same numbers; with a static per-tensor ``scale_x``, x / scale_x saturated to ±448 instead),
taking the 16-bit or float32 x so that x has a gradient: the
straight-through one (the quantizer taken as the identity), in x's dtype, as an eager e4m3
``SparseLinear`` gives it (autograd.py). A traced e4m3 ``SparseLinear`` whose x requires grad calls
it; otherwise the two ops (an fp8 x's gradient would be fp8: SP0922).
"""

from __future__ import annotations

import functools
import math

import torch

try:
    from torch.fx.experimental.symbolic_shapes import guard_or_false
except ImportError:  # torch < 2.8: no unbacked-friendly guards (a plain bool, as before)
    def guard_or_false(condition: object) -> bool:
        return bool(condition)

from ...stdlib.kernels.linear_args import SP_LINEAR_VECTOR, is_gated, linear_error
from ...stdlib.sparsity import metadata_shape
from ..errors import SP_BAD_TENSOR, SP_OP_ARGUMENTS, IntegrationError
from ._kernels import (
    OP_ACTIVATIONS,
    OUT_DTYPES,
    Weight,
    glu_in_kernel,
    glu_unfused,
    quantize_per_token,
    run_interpreted,
)
from .autograd import register as register_autograd
from .layer_args import checked_activation, checked_out_dtype
from .neg_weights import register as register_neg_weights
from .quantize import quantize_with_scale
from .record_cache import RecordCache
from .vmap_rules import register_vmap_rules
from .weight import NAME_OF, WEIGHT_DTYPES

OP_RECORDS_PER_WEIGHT = 256
"""Uncaptured launch records the op keeps per weight (one per token count T, x's K and scale mode).
Under torch.compile's CUDA graph trees every size in use is warmed up before it is recorded; a
weight used at more sizes than this between a size's warm-up and its recording has that size's
record rebuilt inside the capture, which the graph's pool refuses (docs/torch.md). 256 covers a
server's usual capture sizes (vLLM captures 67); records of T > 64 hold no workspace."""
RECORDS = RecordCache(capacity=OP_RECORDS_PER_WEIGHT)


def _sm90_meta_shape(name: str, n: int, k: int) -> tuple[int, ...]:
    """The "sm90" metadata shape of an (n, k) weight, computed each time: the traced path (see
    :func:`check_arguments`)."""
    return tuple(metadata_shape("sm90", name, n, k))


_sm90_meta_shape_cached = functools.lru_cache(maxsize=1024)(_sm90_meta_shape)
"""The eager path's :func:`_sm90_meta_shape`, remembered (the op checks its arguments on every call)."""


def _bad(message: str, help: str, code: str = SP_OP_ARGUMENTS) -> IntegrationError:
    return IntegrationError(code, f"sparsile.sparse_linear: {message}", help=help)


def check_arguments(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None,
                    activation: str | None, scale_x: torch.Tensor | None, scale_w: torch.Tensor | None,
                    out_dtype: torch.dtype | None) -> torch.dtype:
    """The output dtype, after checking that the arguments fit together (shapes only: this runs
    on fake tensors too)."""
    for what, t in (("x", x), ("values", values), ("meta", meta)):
        if not isinstance(t, torch.Tensor):  # the dispatcher lets None through for a Tensor argument
            raise _bad(f"{what} must be a tensor, got {type(t).__name__}", help="pass x and a SparseLinear's "
                       "values and meta", code=SP_BAD_TENSOR if what == "x" else SP_OP_ARGUMENTS)
    checked_activation(activation, OP_ACTIVATIONS)
    checked_out_dtype(out_dtype)
    if values.dim() != 2 or values.dtype not in NAME_OF:
        raise _bad(f"values must be a 2-D bfloat16, float16 or float8_e4m3fn tensor, got {values.dtype} "
                   f"{tuple(values.shape)}", help="pass SparseLinear.values (N, K/2)")
    n, k = int(values.shape[0]), 2 * int(values.shape[1])
    if is_gated(activation) and (n % 2 or (n // 2) % 16):
        raise _bad(f"activation {activation!r} takes values of 2F rows [gate; up] with F a multiple of 16, got {n} "
                   "rows",
                   help="pass the row concatenation of a gate and an up weight of F = 16, 32, ... rows each "
                        "(sparsile.torch.fuse_projections_ builds it)")
    if x.dim() == 0 or not k - 4 < x.shape[-1] <= k:
        raise _bad(f"x has shape {tuple(x.shape)} but values {tuple(values.shape)} cover K = {k}",
                   help="x is (..., K) with the weight's in_features", code=SP_BAD_TENSOR)
    name = NAME_OF[values.dtype]
    if (x.dtype != values.dtype) if name == "e4m3" else (x.dtype not in OUT_DTYPES):  # (16-bit weight: x cast inside)
        takes = ("float8_e4m3fn, quantized with its scale_x" if name == "e4m3" else
                 "bfloat16, float16 or float32, cast to the weight's type inside")
        raise _bad(f"x has dtype {x.dtype} but the weight is {values.dtype}: x is {takes}",
                   help="cast x to float32 or the weight's dtype (fp8 weights: quantize_per_token_e4m3, or "
                        "sparse_linear_e4m3 on the 16-bit x)", code=SP_BAD_TENSOR)
    # (not the cache while dynamo traces: it warns "Dynamo detected a call to a `functools.lru_cache`-wrapped
    # function" in every compiled frame that runs the op eagerly, a graph break; about 70 ns an eager call)
    shape_of = _sm90_meta_shape if torch.compiler.is_compiling() else _sm90_meta_shape_cached
    want = shape_of(name, n, int(x.shape[-1]))
    if meta.dtype != torch.int32 or tuple(meta.shape) != want:
        raise _bad(f"meta must be int32 words of shape {want}, got {meta.dtype} {tuple(meta.shape)}",
                   help="pass SparseLinear.meta (sm90 metadata words)")
    if bias is not None and tuple(bias.shape) != (n,):
        raise _bad(f"bias must have shape ({n},), got {tuple(bias.shape)}", help="one bias per output feature")
    if (scale_x is None) != (name != "e4m3") or (scale_w is None) != (name != "e4m3"):
        raise _bad("scale_x and scale_w go with float8_e4m3fn x and values, and only with them",
                   help="fp8: pass both scales; bf16 / f16: pass neither")
    if scale_w is not None and scale_w.numel() not in (1, n):
        raise _bad(f"scale_w has {scale_w.numel()} elements; it is per tensor (1) or per output channel ({n})",
                   help="pass SparseLinear.scale_w")
    out = out_dtype or (torch.bfloat16 if name == "e4m3" else x.dtype)
    check_vectors(bias, scale_x, scale_w, n, out)
    tokens = math.prod(x.shape[:-1])
    # (guard_or_false: with an unbacked T (mark_unbacked; a scale_x of (u0,) for x's u0 tokens) ``numel == 1``
    # cannot be decided while tracing, and ``in (1, tokens)`` raised torch's data-dependent guard error; refused
    # here only where known to be wrong, and by the real op on every call)
    if scale_x is not None and guard_or_false(scale_x.numel() != 1) and guard_or_false(scale_x.numel() != tokens):
        raise _bad(f"scale_x has {scale_x.numel()} elements; it is per tensor (1) or per token ({tokens})",
                   help="pass the scale quantize_per_token_e4m3 returned")
    for what, t in (("values", values), ("meta", meta), ("bias", bias), ("scale_x", scale_x), ("scale_w", scale_w)):
        if t is not None and t.device != x.device:
            raise _bad(f"x is on {x.device} but {what} is on {t.device}", help="put every argument on one device")
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_vectors(bias: torch.Tensor | None, scale_x: torch.Tensor | None, scale_w: torch.Tensor | None, n: int,
                  out: torch.dtype) -> None:
    """The kernel's checks of the bias and scales (``stdlib.kernels.linear_args.bias_or_scale``: SP0851,
    its messages as the CPU interpreter gives them), in its order, for the ``n`` output columns and the
    output dtype ``out``: a scale_w of a shape it does not take ((1, N), (2, N/2): a number, (N,) or
    (N, 1) only), or a bias or scale that is not floating point. Here, on the real and the fake
    tensors alike, so that torch.compile and torch.export refuse them at trace time with the real
    call's diagnostic (before, the fake implementation accepted them and the compiled or exported
    program failed at its first run). Shapes and dtypes only: nothing read from memory. (Every eager
    call of the op checks them: the usual arguments pass one expression, 0.8 us for an e4m3 call's
    three and 0.16 us for a bias, where the loop below, which words the diagnostic, took 1.5 and
    0.56 us on the CPU host of the fifty-fifth session.)"""
    if ((bias is None or bias.is_floating_point()) and (scale_x is None or scale_x.is_floating_point())
            and (scale_w is None or (scale_w.is_floating_point()
                                     and tuple(map(int, scale_w.shape)) in ((), (1,), (1, 1), (n,), (n, 1))))):
        return
    for what, t, dtypes in (("bias", bias, ("float32", _dtype_name(out))), ("scale_w", scale_w, ("float32",)),
                            ("scale_x", scale_x, ("float32",))):
        if t is None:
            continue
        shape = tuple(int(s) for s in t.shape) if what == "scale_w" else ()
        if shape not in ((), (1,), (1, 1), (n,), (n, 1)):
            raise linear_error(SP_LINEAR_VECTOR, f"scale_w must be a number or of shape ({n},), got shape {shape}",
                               "pass one value, or one per output feature")
        if not t.is_floating_point():
            raise linear_error(SP_LINEAR_VECTOR, f"{what} must be floating point, got {_dtype_name(t.dtype)}",
                               f"pass {what} as {' or '.join(dtypes)}")


_LIBRARY = torch.library.Library("sparsile", "FRAGMENT")
SPARSE_LINEAR_SCHEMA = ("sparse_linear(Tensor x, Tensor values, Tensor meta, Tensor? bias=None, Tensor? scale_x=None, "
                        "Tensor? scale_w=None, *, str? activation=None, ScalarType? out_dtype=None) -> Tensor")
"""Defined with ``torch.library.Library`` rather than ``torch.library.custom_op``: the decorator's
Python layers cost about 6 µs more per call (measured with an empty body), which a compiled model
without CUDA graphs pays once per layer and step."""
_LIBRARY.define(SPARSE_LINEAR_SCHEMA)


def sparse_linear(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None = None,
                  scale_x: torch.Tensor | None = None, scale_w: torch.Tensor | None = None, *,
                  activation: str | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y (..., N) = activation((x @ W.T) * scale_x * scale_w + bias) with W = decompress(values, meta):
    the CPU and CUDA implementation of ``torch.ops.sparsile.sparse_linear``."""
    out = check_arguments(x, values, meta, bias, activation, scale_x, scale_w, out_dtype)
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).contiguous()  # (-1 is ambiguous for K = 0)
    if is_gated(activation) and not glu_in_kernel(x2.shape[0], x2.device):
        return glu_unfused(sparse_linear(x, values, meta, bias, scale_x, scale_w, activation=None, out_dtype=out),
                           activation)
    w = Weight(values, meta, bias, scale_w, activation)
    n = w.out_features
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n), dtype=out)
    if x2.dtype != values.dtype:  # (a 16-bit weight's float32 or other 16-bit x: the kernel's operand is the weight's
        x2 = x2.to(values.dtype)  # type; x's own dtype kept for its gradient, as the eager layer's)
    if scale_x is not None:  # 1-D and contiguous as the kernel reads it (a 0-d scale, a strided column)
        scale_x = scale_x.reshape(-1).contiguous()
    if x2.device.type == "cuda":
        y = run_cuda(x2, w, scale_x, out)
    else:
        y = run_interpreted(x2, w, scale_x, out)
    return y.reshape(*x.shape[:-1], n)


def run_record(x2: torch.Tensor, w: Weight, scale_x: torch.Tensor | None, out: torch.dtype,
               stream: int | None = None) -> torch.Tensor:
    """y of a CUDA call of the op on its checked arguments (2-D contiguous x2, the weight ``w``, a
    1-D scale_x or None, the output dtype ``out``), through its launch record in :data:`RECORDS`
    (built on a miss, outside any CUDA-graph memory pool), on ``stream`` (default torch's current
    one). A torch.compile'd (or CUDA-graphed) model's first call at a new T builds that record, which
    compiles its kernels; ``sparsile.torch.warm_up`` lists them (integrations/torch/first_call.py).
    Traced calls take :data:`run_record_untraced` instead."""
    key = record_key(x2, w.values, w.meta, w.bias, scale_x, w.scale_w, out, w.activation)
    return RECORDS.run(key, x2, w, scale_x, out, stream=stream, off_pool=True)


run_record_untraced = torch.compiler.disable(run_record)
""":func:`run_record`, never compiled by dynamo (see :func:`run_cuda`)."""


def run_cuda(x2: torch.Tensor, w: Weight, scale_x: torch.Tensor | None, out: torch.dtype) -> torch.Tensor:
    """The op's CUDA call: :func:`run_record`, or :data:`run_record_untraced` where dynamo traces the
    call. Host code, nothing to trace, as ``_kernels.run_interpreted``: where a compiled frame fell back
    to eager (a graph break, torch.compile without fullgraph) dynamo compiles the frames it calls, the
    op's Python implementation among them, and under ``torch.func.jvp`` its fake tensors met the
    record cache's Python (data pointers, version counters) instead of the layer's SP0922. Only traced
    calls (``torch.compiler.is_compiling()``) take the disabled wrapper: it costs about 3 us a call,
    which eager calls do not pay."""
    if torch.compiler.is_compiling():
        return run_record_untraced(x2, w, scale_x, out)
    return run_record(x2, w, scale_x, out)


def record_key(x2: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None,
               scale_x: torch.Tensor | None, scale_w: torch.Tensor | None, out: torch.dtype,
               activation: str | None) -> tuple:
    """The launch-record key of a CUDA call of the op: a record's plan and prepared launches are
    specialized on everything here (its native launch replays x's layout as packed), and take only
    x, y and scale_x's address per call. So the key holds x's (T, K) (check_arguments admits up to
    three K for one weight), the weight's memory and shape, and the scale modes: a per-tensor
    scale_x (one element) and a per-token one (T) plan different kernels, as do a per-tensor and
    a per-channel scale_w at one address; scale_x's dtype (the plan converts another to float32).
    The weight's tensors by address, dtype and strides: memory freed and handed out again by the
    caching allocator can hold a new bias of another dtype, or a view of other strides, at the same
    address."""
    ptrs = tuple((t.data_ptr(), t.dtype, t.stride()) if t is not None else 0 for t in (values, meta, bias, scale_w))
    scales = (None if scale_x is None else (scale_x.dtype, scale_x.numel() > 1),
              None if scale_w is None else scale_w.numel() > 1)
    return (x2.shape[0], x2.shape[1], x2.dtype, x2.device.index, out, ptrs, tuple(values.shape), scales, activation)


_LIBRARY.impl("sparse_linear", sparse_linear, "CPU")
_LIBRARY.impl("sparse_linear", sparse_linear, "CUDA")


@torch.library.register_fake("sparsile::sparse_linear", lib=_LIBRARY)
def _sparse_linear_fake(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None = None,
                        scale_x: torch.Tensor | None = None, scale_w: torch.Tensor | None = None, *,
                        activation: str | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    out = check_arguments(x, values, meta, bias, activation, scale_x, scale_w, out_dtype)
    return x.new_empty((*x.shape[:-1], Weight(values, meta, bias, scale_w, activation).out_features), dtype=out)


QUANTIZE_SCHEMA = "quantize_per_token_e4m3(Tensor x) -> (Tensor, Tensor)"
"""Defined with ``torch.library.Library`` as ``sparse_linear`` is, not ``torch.library.custom_op``: the
decorator registers a Python Autograd kernel of its own, and torch before 2.13 refuses the one
autograd.py registers over it (RuntimeError at import: every op was unusable on torch 2.11)."""
_LIBRARY.define(QUANTIZE_SCHEMA)


def quantize_per_token_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q float8_e4m3fn of x's shape, scale_x float32 of x.shape[:-1]) with x ≈ x_q * scale_x: the
    CPU and CUDA implementation of ``torch.ops.sparsile.quantize_per_token_e4m3``."""
    _check_quantize_input(x)
    x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).contiguous()
    xq, scale = quantize_per_token(x2)
    return xq.reshape(x.shape), scale.reshape(x.shape[:-1])


def _check_quantize_input(x: torch.Tensor) -> None:
    if x.dim() == 0 or x.dtype not in OUT_DTYPES:
        raise IntegrationError(SP_BAD_TENSOR, f"quantize_per_token_e4m3 takes (..., K) bfloat16, float16 or "
                               f"float32 x, got {x.dtype} {tuple(x.shape)}", help="cast x first")


_LIBRARY.impl("quantize_per_token_e4m3", quantize_per_token_e4m3, "CPU")
_LIBRARY.impl("quantize_per_token_e4m3", quantize_per_token_e4m3, "CUDA")


@torch.library.register_fake("sparsile::quantize_per_token_e4m3", lib=_LIBRARY)
def _quantize_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _check_quantize_input(x)
    # contiguous as the real op's (not empty_like: that keeps a transposed x's strides, which the real
    # output has not; torch.library.opcheck's test_faketensor refused it, and inductor trusts them)
    return x.new_empty(x.shape, dtype=torch.float8_e4m3fn), x.new_empty(x.shape[:-1], dtype=torch.float32)


SPARSE_LINEAR_E4M3_SCHEMA = ("sparse_linear_e4m3(Tensor x, Tensor values, Tensor meta, Tensor? bias, Tensor scale_w, "
                             "Tensor? scale_x=None, *, str? activation=None, ScalarType? out_dtype=None) -> Tensor")
_LIBRARY.define(SPARSE_LINEAR_E4M3_SCHEMA)


def _check_e4m3_values(values: torch.Tensor) -> None:
    if not isinstance(values, torch.Tensor) or values.dtype != torch.float8_e4m3fn:
        got = f"{values.dtype} {tuple(values.shape)}" if isinstance(values, torch.Tensor) else type(values).__name__
        raise IntegrationError(SP_OP_ARGUMENTS, f"sparsile.sparse_linear_e4m3: values must be float8_e4m3fn, got {got}",
                               help="pass an e4m3 SparseLinear's values (for bf16 / f16 weights: sparse_linear)")


def sparse_linear_e4m3(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None,
                       scale_w: torch.Tensor, scale_x: torch.Tensor | None = None, *, activation: str | None = None,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``sparse_linear(x_q, values, meta, bias, scale_x, scale_w)`` for ``(x_q, scale_x) =
    quantize_per_token_e4m3(x)``: the same two ops, the same numbers, as one op that takes the
    16-bit (or float32) x, so that its autograd formula (autograd.py) gives x its straight-through
    gradient in x's dtype. An e4m3 ``SparseLinear`` traced with an x that requires grad calls it
    (its eager call computes that gradient through ``LayerWithInputGrad``); the fp8 x of the two
    ops has no gradient (SP0922). ``scale_x``: a static per-tensor scale (1,) float32 (a layer's
    ``input_scale``): x is quantized with it instead (``quantize.quantize_static``: x / scale_x
    saturated to ±448)."""
    _check_e4m3_values(values)
    if scale_x is not None:
        _check_static_scale(scale_x)
        _check_quantize_input(x)
        x2 = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
        return sparse_linear(quantize_with_scale(x2, scale_x).reshape(x.shape), values, meta, bias, scale_x, scale_w,
                             activation=activation, out_dtype=out_dtype)
    xq, scale_x = quantize_per_token_e4m3(x)
    return sparse_linear(xq, values, meta, bias, scale_x, scale_w, activation=activation, out_dtype=out_dtype)


def _check_static_scale(scale_x: torch.Tensor) -> None:
    if scale_x.dtype != torch.float32 or scale_x.numel() != 1:
        raise IntegrationError(SP_OP_ARGUMENTS, f"sparsile.sparse_linear_e4m3: scale_x is a static per-tensor scale, "
                               f"one float32 element, got {scale_x.dtype} {tuple(scale_x.shape)}",
                               help="pass a SparseLinear's input_scale, or leave scale_x out (x quantized per token)")


_LIBRARY.impl("sparse_linear_e4m3", sparse_linear_e4m3, "CPU")
_LIBRARY.impl("sparse_linear_e4m3", sparse_linear_e4m3, "CUDA")


@torch.library.register_fake("sparsile::sparse_linear_e4m3", lib=_LIBRARY)
def _sparse_linear_e4m3_fake(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None,
                             scale_w: torch.Tensor, scale_x: torch.Tensor | None = None, *,
                             activation: str | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _check_e4m3_values(values)
    if scale_x is not None:
        _check_static_scale(scale_x)
        _check_quantize_input(x)
        return _sparse_linear_fake(x.new_empty(x.shape, dtype=torch.float8_e4m3fn), values, meta, bias, scale_x,
                                   scale_w, activation=activation, out_dtype=out_dtype)
    xq, scale_x = _quantize_fake(x)
    return _sparse_linear_fake(xq, values, meta, bias, scale_x, scale_w, activation=activation, out_dtype=out_dtype)


register_autograd(_LIBRARY)  # x's gradient through the frozen weight (autograd.py)
register_vmap_rules(_LIBRARY)  # torch.func.vmap: a batch of x is more tokens, one launch (vmap_rules.py)
register_neg_weights(_LIBRARY)  # a neg-view weight resolved once per memory, not per call (neg_weights.py)

__all__ = ["WEIGHT_DTYPES", "check_arguments", "quantize_per_token_e4m3", "sparse_linear", "sparse_linear_e4m3"]
