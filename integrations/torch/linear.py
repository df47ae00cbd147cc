"""``SparseLinear``: an ``nn.Linear`` whose weight is 2:4 sparse, run by sparsile's fused kernel.

``forward(x)`` = ``activation(x @ W.T + bias)`` for x (..., K), y (..., N) in x's dtype (bf16, f16 or
f32; ``out_dtype=`` overrides). The weight is stored compressed: ``values`` (N, K/2), the "sm90"
metadata words ``meta`` (int32) of docs/sparse-metadata.md, ``bias`` (N,) float32 and, for e4m3
weights, the per-output-channel ``scale_w`` (N,) float32 (W = values * scale_w; x is quantized per
token on each call, or, where the layer holds a static per-tensor ``input_scale`` (1,) float32, with
that scale: x / input_scale saturated to ±448, as vLLM's ``static_scaled_fp8_quant``). All are
registered buffers: ``state_dict()``, ``load_state_dict()`` and ``.to(device)`` work; the metadata
is encoded when built and validated when loaded, never per call (moving the module keeps it valid).
Dtype conversions (``.half()``, ``.float()``, ``.to(dtype)``) leave the compressed
weight's type as it is: the output follows x. docs/torch.md has the conventions.
"""

from __future__ import annotations

import logging
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.nn.modules.module as _mm
from torch import nn

from ...stdlib.kernels.compress_weight import prunes_on_gpu
from ...stdlib.sparsity import (
    SparsityError,
    as_host_array,
    compress,
    encode_metadata,
    metadata_shape,
    operand_type,
    prune_mask_2_4,
    validate_metadata,
)
from ...stdlib.sparsity.errors import SP_VALUES_MISMATCH
from ..errors import (
    SP_BAD_TENSOR,
    SP_CANNOT_SPARSIFY,
    SP_TRAIN_LAYER,
    IntegrationError,
)
from ._kernels import (
    ACTIVATIONS,
    OUT_DTYPES,
    RECORD_QUANTIZE_MAX_T,
    Weight,
    capturing,
    quantize_per_token,
    run_interpreted,
)
from .atomic import in_own_types, restoring_tensors, strict_key_errors, withhold_refused
from .autograd import LayerWithInputGrad, TransformedLayerWithInputGrad, func_transformed, needs_autograd
from .fx_trace import forward_fx, is_fx_proxy
from .last_call import LastCall
from .layer_args import (
    F16_MAX,
    beyond_f16,
    check_devices,
    check_input,
    checked_activation,
    checked_features,
    checked_out_dtype,
    dense_weight,
    host_to_torch,
    not_dense,
    weight_dtype_name,
)
from .parametrize_guard import guarded_parametrizations
from .quantize import checked_input_scale, quantize_static, quantize_with_scale, static_inverse
from .record_cache import RecordCache
from .weight import WEIGHT_DTYPES, host_dense

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
EMPTY_META_WORD = 0x44444444  # every nibble "indices 0, 1": a valid pattern (with zero values, a zero weight)
_BUFFERS = frozenset({"values", "meta", "bias", "scale_w", "input_scale"})
LOG = logging.getLogger("sparsile.torch")


PRUNE_ROWS = 1024
"""Rows of a weight pruned at once for e4m3 (a float32 weight takes the toolkit's float64 path)."""


def _prune_quantize_e4m3(weight: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(2:4 e4m3 host weight (N, K rounded up to 4), float32 scales (N,)): the two largest |w| of
    every four along K kept by the toolkit's rule in the weight's own precision (``prune_mask_2_4``:
    ties to the lower index and NaN above every number, as the bf16 / f16 layers and the GPU
    toolkit; torch.topk chose among ties), then one scale per output channel mapping the channel's
    largest kept |w| to 448 (docs/torch.md, "Special values"):

    * 1 for a zero channel (zero values);
    * at least the smallest normal float32, so that a channel of tiny weights (amax / 448 below
      it: 0 or a subnormal, which the epilogue's multiply may flush) keeps a usable scale (a scale
      of 0 divided its zeros into NaN, and the build failed with SP0803);
    * amax skips NaN: a NaN weight stays NaN in the values (the channel's outputs are NaN, as a
      dense layer's), the channel's other weights are scaled as without it;
    * an infinite weight makes the scale inf, its value ±448 and the channel's finite weights ±0,
      so the channel's outputs are ±inf with the dense layer's sign (NaN where x is 0 there, or
      infinities cancel) rather than NaN (inf / inf).

    Values are saturated to ±448 before the cast (a rounding of amax / 448 could leave 448.0001, and
    a cast beyond 464 is NaN)."""
    w = as_host_array(weight.detach(), "weight")
    n, k = w.shape
    keep = np.concatenate([prune_mask_2_4(w[r:r + PRUNE_ROWS]) for r in range(0, n, PRUNE_ROWS)]) if n else \
        np.zeros((0, k), bool)
    kp = -(-k // 4) * 4
    pruned = np.zeros((n, kp), np.float32)
    pruned[:, :k] = np.where(keep, w.astype(np.float32), np.float32(0))
    amax = np.fmax.reduce(np.abs(pruned), axis=1, initial=0)  # (NaN skipped)
    scale = np.where(amax > 0, np.maximum(amax / np.float32(E4M3_MAX), np.finfo(np.float32).tiny),
                     np.float32(1)).astype(np.float32)
    with np.errstate(invalid="ignore"):
        q = pruned / scale[:, None]
    q = np.where(np.isnan(q), pruned, q)  # NaN stays NaN; inf / inf back to ±inf, saturated below
    return np.clip(q, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn), scale


def tensors_of(d: dict[str, Any]) -> dict[str, Any]:
    """A layer's values, meta, bias and scale_w by name (``d``: its ``__dict__``), as ``getattr`` finds
    them: its buffers, and those made an ``nn.Parameter`` since (``layer.bias = nn.Parameter(b)``, a bias
    to train: torch moves the name from ``_buffers`` to ``_parameters``, which ``getattr`` reads first)."""
    p = d["_parameters"]
    return {**d["_buffers"], **p} if p else d["_buffers"]


_NO_ARGUMENT: Any = object()  # SparseLinear.__call__ without a positional argument


def tracing(x: Any) -> bool:
    """True under torch.compile / torch.export / FakeTensorMode / make_fx / torch.jit.trace and
    torch.func's transforms (vmap, grad, jacrev: x is a BatchedTensor or a GradTrackingTensor, whose
    memory the eager path cannot read; it was SP0804): the forward goes through the custom op, which
    tracers see, instead of launching directly (under torch.func inside
    ``autograd.TransformedLayerWithInputGrad``, for x's gradient: :meth:`SparseLinear._forward_op`)."""
    # (a dispatch mode is on the stack: torch.utils._python_dispatch._get_current_dispatch_mode, without
    # its Python frame; torch.compiler.is_compiling first: dynamo evaluates it to True while tracing)
    return (torch.compiler.is_compiling() or type(x) is not torch.Tensor or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._get_tracing_state() is not None or torch._C._are_functorch_transforms_active())


def sync_records(values: torch.Tensor, own: RecordCache, fused: Any = None, replayed: Any = ()) -> int:
    """``RecordCache.sync`` of the weight in ``values``' memory in a layer's ``own`` cache, the
    custom op's, a fused group's layers' (``fused``: a member's ``(group, index)``, projection_group.py)
    and those of the layers of a released group whose launches a CUDA graph replays (``replayed``: a
    member's ``_replayed``, own_rows.keep_replayed); how many captured records still read copies from
    before (see ``sync``)."""
    from .ops import RECORDS  # (ops imports this module)

    caches = [own, RECORDS]
    if fused is not None:  # the group's fused layer, and its gated forward's layers (glu.py)
        caches += [layer.__dict__["_records"] for layer in fused[0].layers()]
    caches += [layer.__dict__["_records"] for layer in replayed]
    return sum(cache.sync(values) for cache in caches)


class SparseLinear(nn.Module):
    """A 2:4 sparse linear layer (a frozen weight; x has a gradient, autograd.py): ``y = activation(x @ W.T + bias)``.

    Build it with :meth:`from_dense` (magnitude pruning of an ``nn.Linear``) or load it (a state
    dict, or a ``sparse-24-bitmask`` checkpoint: ``load_sparse24_checkpoint``). The constructor makes
    a zero weight of the right shapes, ready for ``load_state_dict``.
    """

    values: torch.Tensor
    meta: torch.Tensor
    bias: torch.Tensor | None
    scale_w: torch.Tensor | None
    input_scale: torch.Tensor | None
    transposed_from: str | None = None  # "transformers Conv1D" where sparsify_ made it from one (checkpoint layout)
    # the class names (MRO) of the module sparsify_ or the loader put it in place of, where not nn.Linear's: what
    # compressed-tensors matches a config group's class targets against (layer_checkpoint.module_classes)
    source_classes: tuple[str, ...] | None = None
    _own_forward: bool = True  # forward is SparseLinear.forward (see __call__ and __init_subclass__)
    _activations: tuple[str | None, ...] = ACTIVATIONS  # what checked_activation admits for this class
    parametrizations = guarded_parametrizations({"values": (
        "the compressed values are a frozen weight: to transform them once, write them in place (with "
        "torch.no_grad(): layer.values.copy_(P(layer.values))); to parametrize the weight, train a "
        "SemiSparseLinear (SparseLinear.from_dense(linear, trainable=True)) and parametrize its master weight: "
        "register_parametrization(layer, 'weight', P)")})
    """torch.nn.utils.parametrize's ModuleDict; SP0925 before torch would break the layer at ``values``
    (parametrize_guard.py)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype: Any = "bf16",
                 activation: str | None = None, out_dtype: torch.dtype | None = None, device: Any = None,
                 input_scale: bool = False):
        """``input_scale=True`` (e4m3 only): the layer holds a static per-tensor activation scale, the
        buffer ``input_scale`` (1,) float32 (1 until loaded), and quantizes x with it instead of per token."""
        super().__init__()
        in_features, out_features = checked_features(in_features, out_features, "SparseLinear", SP_CANNOT_SPARSIFY)
        self.in_features, self.out_features = in_features, out_features
        self.weight_dtype = weight_dtype_name(dtype)
        self.activation = checked_activation(activation, self._activations)
        self.out_dtype = checked_out_dtype(out_dtype)
        op = operand_type(self.weight_dtype)
        k_values = -(-in_features // op.group) * op.group
        words = metadata_shape("sm90", op, out_features, in_features)
        self.register_buffer("values", torch.zeros((out_features, k_values // 2), device=device).to(
            WEIGHT_DTYPES[self.weight_dtype]))
        self.register_buffer("meta", torch.full(words, EMPTY_META_WORD, dtype=torch.int32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)
        self.register_buffer("scale_w", torch.ones(out_features, device=device)
                             if self.weight_dtype == "e4m3" else None)
        if input_scale and self.weight_dtype != "e4m3":
            raise IntegrationError(SP_CANNOT_SPARSIFY, f"input_scale=True for a {self.weight_dtype} layer: only e4m3 "
                                   "layers quantize x", help="pass dtype='e4m3', or leave input_scale out")
        self.register_buffer("input_scale", torch.ones(1, device=device) if input_scale else None)
        self.__dict__["_records"] = RecordCache(pdl=True)  # constant weights: decode launches with PDL
        self.__dict__["_weight"] = None
        self.__dict__["_last"] = None  # the last eager call's LastCall (last_call.py)

    # -------------------------------------------------------------------------------------------
    # building

    @classmethod
    def from_dense(cls, linear: nn.Module, dtype: Any = None, *, activation: str | None = None,
                   out_dtype: torch.dtype | None = None, trainable: bool = False) -> Any:
        """Magnitude-prune ``linear``'s weight to 2:4 (two largest |w| of every four along K),
        compress it and encode its metadata once. ``dtype``: "bf16", "f16" or "e4m3" (fp8 weights
        with per-output-channel scales; x quantized per token on each call); None keeps the
        linear's dtype (bf16 or f16). The layer lands on the linear's device.

        ``trainable=True`` returns a :class:`~.training.SemiSparseLinear` instead (a master weight,
        a transposable mask and a backward pass; docs/training.md): bf16 / f16 only, no fused
        activation or out_dtype (SP0916)."""
        if trainable:
            from .training import SemiSparseLinear

            if activation is not None or out_dtype is not None:
                raise IntegrationError(SP_TRAIN_LAYER, "a trainable sparse layer fuses no activation or out_dtype",
                                       help="apply the activation after the layer; y follows x's dtype")
            return SemiSparseLinear.from_dense(linear, dtype)
        weight = dense_weight(linear, SP_CANNOT_SPARSIFY)
        name = weight_dtype_name(dtype, weight.dtype)
        big = beyond_f16(weight, name)
        if big:
            raise IntegrationError(SP_CANNOT_SPARSIFY, f"{big} weights lie beyond ±{F16_MAX:g}, the largest finite "
                                   "float16: as f16 they would be inf", help="keep dtype='bf16' (the range of "
                                   "float32), or 'e4m3' (scaled per output channel)")
        scale = None
        if name == "e4m3":
            quantized, scale = _prune_quantize_e4m3(weight)
            values, indices = compress(quantized, "e4m3")
        elif prunes_on_gpu(weight, operand_type(name)):  # a CUDA weight of the layer's type: pruned there
            return cls._from_gpu(linear, name, activation=activation, out_dtype=out_dtype)
        else:  # pruned in the weight's own type (cast first when it differs), as prune_and_compress does
            values, indices = compress(as_host_array(weight.detach(), "weight"), name, prune=True)
        bias = None if linear.bias is None else linear.bias.detach().float()
        return cls.from_compressed(values, indices, linear.in_features, bias=bias, scale_w=scale,
                                   activation=activation, out_dtype=out_dtype, device=weight.device)

    @classmethod
    def _from_gpu(cls, linear: nn.Linear, name: str, *, activation: str | None,
                  out_dtype: torch.dtype | None) -> SparseLinear:
        """``from_dense`` of a CUDA weight in the layer's type: pruned, compressed and encoded on its
        GPU (``compress_gpu``, bit-identical to the host toolkit's ``compress`` + ``encode_metadata``)."""
        from ...stdlib.kernels.sparsity_gpu import compress_gpu

        values, meta = compress_gpu(linear.weight.detach(), name, "sm90")
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype=name,
                    activation=activation, out_dtype=out_dtype, device="meta")
        layer.values = values
        layer.meta = meta.data.view(torch.int32)
        if linear.bias is not None:  # (a copy: .float() of a float32 bias is that tensor, the linear's)
            layer.bias = linear.bias.detach().float().reshape(-1).clone()
        return layer

    @classmethod
    def from_compressed(cls, values: np.ndarray, indices: np.ndarray, in_features: int, *,
                        bias: Any = None, scale_w: Any = None, activation: str | None = None,
                        out_dtype: torch.dtype | None = None, device: Any = None,
                        input_scale: Any = None) -> SparseLinear:
        """A layer from the sparsity toolkit's host ``values`` (N, K/2) and logical ``indices``
        (N, K/4, 2) (``compress``), a bias (N,) and, for e4m3 values, the weight scales (N,) (SP0902 for
        scales with 16-bit values: such a layer holds none) and a static per-tensor activation scale
        ``input_scale`` (one positive finite number; None: x quantized per token)."""
        op_name = operand_type(str(values.dtype)).name
        n = int(values.shape[0])
        want = (int(indices.shape[0]), 2 * int(indices.shape[1])) if np.ndim(indices) == 3 else None
        if values.ndim != 2 or tuple(values.shape) != want or want[1] != 2 * -(-in_features // 4):
            raise IntegrationError(SP_CANNOT_SPARSIFY, f"values {tuple(values.shape)} and indices "
                                   f"{tuple(np.shape(indices))} do not describe a 2:4 weight of {in_features} "
                                   "input features",
                                   help="pass the values and indices compress(weight) returns, and the weight's K")
        for what, vector in (("bias", bias), ("scale_w", scale_w)):
            if vector is not None and int(np.prod(np.shape(vector))) != n:
                raise IntegrationError(SP_CANNOT_SPARSIFY, f"{what} has {int(np.prod(np.shape(vector)))} elements "
                                       f"for {n} output features", help=f"pass one {what} value per output feature")
        if scale_w is not None and op_name != "e4m3":  # (16-bit layers hold no scale_w: it was dropped silently)
            raise IntegrationError(SP_CANNOT_SPARSIFY, f"scale_w is given for {op_name} values, but only e4m3 weights "
                                   "take a per-output-channel scale (the layer would drop it)",
                                   help="multiply the scales into the weight before compressing it "
                                        "(W * scale_w[:, None]), or compress it as e4m3")
        if input_scale is not None:
            input_scale = checked_input_scale(input_scale, op_name)
        layer = cls(in_features, int(values.shape[0]), bias is not None, dtype=op_name, activation=activation,
                    out_dtype=out_dtype, device="meta", input_scale=input_scale is not None)
        meta = encode_metadata(indices, "sm90", op_name, k=in_features)
        layer.values = host_to_torch(values, device)
        layer.meta = host_to_torch(meta.data.view(np.int32), device)
        # copies (copy=True): as_tensor and .to() return a float32 tensor, or wrap a float32 array, as it is, and
        # the layer's bias was then the caller's (a float32 linear's, from_dense: training or re-initializing
        # the dense linear afterwards changed the sparse layer's outputs)
        if bias is not None:
            layer.bias = torch.as_tensor(bias, dtype=torch.float32).reshape(-1).to(device, copy=True)
        if op_name == "e4m3":
            scale = np.ones(values.shape[0], np.float32) if scale_w is None else scale_w
            layer.scale_w = torch.as_tensor(scale, dtype=torch.float32).reshape(-1).to(device, copy=True)
        if input_scale is not None:
            layer.input_scale = input_scale.to(device, copy=True)
        return layer  # encode_metadata checked the indices: its words are valid by construction

    def check_metadata(self, words: torch.Tensor | None = None) -> None:
        """Validate the metadata words (format, shape, every nibble): when a state dict is loaded,
        never per call (words encoded by :meth:`from_compressed` are valid by construction).
        ``words``: words about to be loaded (as int32, the buffer's type), checked before they are."""
        words = self.meta if words is None else words.to(torch.int32)
        host = as_host_array(words.detach(), "meta")
        validate_metadata(np.ascontiguousarray(host).view(np.uint32), "sm90", self.weight_dtype,
                          m=self.out_features, k=self.in_features)
        self._invalidate()

    # -------------------------------------------------------------------------------------------
    # running

    def _invalidate(self) -> None:
        """The buffers were written in place, replaced or moved: this layer's cache is emptied
        (records a graph captured are kept, retired), then the records of the weight that stay
        (those retired ones, the custom op's, a fused group's, a released group's that a graph
        replays) take in-place writes now, so that CUDA graphs replaying them compute with the
        weight as it is (``RecordCache.sync``)."""
        self.__dict__["_records"].clear()  # first: the records it drops are not refreshed for nothing
        self.__dict__["_last"] = None
        sync_records(self.values, self.__dict__["_records"], self.__dict__.get("_fused"),
                     self.__dict__.get("_replayed", ()))
        self.__dict__["_weight"] = None
        fused = self.__dict__.get("_fused")  # a fuse_projections_ group (projection_group.py): verified at its next run
        if fused is not None:
            fused[0].invalidate()

    def _tensors(self) -> dict[str, Any]:
        """values, meta, bias and scale_w by name as ``getattr`` finds them (:func:`tensors_of`), and
        those a ``torch.nn.utils.parametrize`` parametrization computes (on each access: a new tensor
        each call, unless under ``parametrize.cached()``): torch moves a parametrized tensor out of the
        buffers and parameters, and the eager call read ``_buffers["bias"]``, a KeyError."""
        d = self.__dict__
        b = tensors_of(d)
        parametrized = d["_modules"].get("parametrizations")
        if parametrized is not None:
            b = {**b, **{name: getattr(self, name) for name in _BUFFERS if name in parametrized}}
        return b

    def _bound(self, tensors: dict[str, Any] | None = None) -> Weight:
        """The layer's :class:`Weight` (bound once, until the layer's tensors change): ``tensors``
        (:meth:`_tensors`, this call's) where given, else the layer's attributes."""
        weight = self.__dict__["_weight"]
        if weight is None:
            t = tensors if tensors is not None else self._tensors()
            weight = Weight(t["values"], t["meta"], t["bias"], t["scale_w"], self.activation)
            static = t.get("input_scale")
            # (checked once per binding, not on the per-call path)
            check_devices(weight.values, (("meta", weight.meta), ("bias", weight.bias), ("scale_w", weight.scale_w)))
            if static is not None and static.device != weight.values.device:
                self._wrong_scale_device(static.device, weight.values.device)
            self.__dict__["_bound_static"] = static
            self.__dict__["_bound_ptrs"] = tuple(0 if t is None else t.data_ptr() for t in (
                weight.values, weight.meta, weight.bias, weight.scale_w, static))
            self.__dict__["_weight"] = weight
        return weight

    @staticmethod
    def _wrong_scale_device(scale: torch.device, weight: torch.device) -> None:
        """SP0901 (as for an x on another device): the static ``input_scale`` is not on the weight's
        device (put in without ``setattr`` or ``.to()``, ``layer._buffers["input_scale"] = t``); the
        quantizer would read it there (on the CPU: torch's own device error; on a GPU: a host address)."""
        raise IntegrationError(SP_BAD_TENSOR, f"input_scale is on {scale} but the layer's weight is on {weight}",
                               help="move the module (.to(device)) or assign the scale on the weight's device: "
                                    "layer.input_scale = scale.to(layer.values.device)")

    def _rebound(self, quiet: bool = False) -> None:
        """A buffer was replaced without ``setattr`` (``layer._buffers["values"] = t``, as accelerate's
        ``set_module_tensor_to_device`` does) or given other memory (``layer.values.data = t``), neither
        of which torch reports: the eager call found it (an identity and an address check per call,
        docs/torch.md "A weight written in place"), and the records built for the old tensors go, as
        after an assignment. ``quiet``: a parametrized tensor (computed again on each call), not logged."""
        if not quiet:
            LOG.info("SparseLinear: a buffer was replaced or moved to other memory without setattr; rebuilding "
                     "its launch records")
        self._invalidate()

    def _checked_input(self, x: Any) -> torch.dtype:
        """The output dtype for ``x``, after checking its type, last dimension, dtype and device."""
        check_input(x, self.in_features, self.values.device, self._user_name or type(self).__name__)
        return self.out_dtype or x.dtype

    def __call__(self, x: Any = _NO_ARGUMENT, /, *args: Any, **kwargs: Any) -> Any:
        """``layer(x)``. An eager call that leaves ``nn.Module.__call__`` nothing to do (one tensor
        argument; no hooks, global or the layer's; no ``Module.compile``; ``forward`` not replaced on
        the instance or a subclass; no tracer, dispatch mode or torch.compile) runs the eager forward
        directly: the Python of ``Module._wrapped_call_impl`` and ``_call_impl`` and the tracer
        checks of :meth:`forward` cost about 2 µs per call on a slow host (docs/torch.md, "The eager
        call's fast path"). Anything else takes ``nn.Module.__call__`` (under torch.compile
        :func:`tracing` is the only condition traced)."""
        if tracing(x) or args or kwargs:  # (no argument: not a tensor, so tracing() is True)
            return super().__call__(*args, **kwargs) if x is _NO_ARGUMENT else super().__call__(x, *args, **kwargs)
        d = self.__dict__
        if (d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]
                or _mm._global_forward_hooks or _mm._global_forward_pre_hooks or _mm._global_backward_hooks
                or _mm._global_backward_pre_hooks or d.get("_compiled_call_impl") is not None or "forward" in d
                or not self._own_forward):
            return super().__call__(x)
        try:  # (a try costs nothing until it raises: Python 3.11's zero-cost exceptions)
            return self._forward_eager(x)
        except (RuntimeError, NotImplementedError, ValueError):  # (ValueError: an e4m3 layer's SP0804)
            self._refuse_not_dense(x)
            raise

    _user_name: str | None = None  # the class a diagnostic names (an internal subclass: the user's layer's)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._own_forward = cls.forward is SparseLinear.forward  # (a subclass's forward: nn.Module.__call__ runs it)

    def forward(self, input: Any = _NO_ARGUMENT, *, x: Any = _NO_ARGUMENT) -> torch.Tensor:
        """y for one tensor, by position or as ``input=`` (nn.Linear's name) or ``x=``."""
        if (input is _NO_ARGUMENT) == (x is _NO_ARGUMENT):
            raise TypeError("SparseLinear.forward() takes one tensor: by position, input= or x=")
        if x is _NO_ARGUMENT:
            x = input
        if tracing(x):
            if is_fx_proxy(x):  # torch.fx.symbolic_trace: the op recorded on the proxy (fx_trace.py)
                return forward_fx(self, x)
            fused = self.__dict__.get("_fused")
            if fused is not None and fused[0].traced:  # fuse_projections_(traced=True): one op per group
                return fused[0].run_traced(fused[1], x)
            return self._forward_op(x)
        try:
            return self._forward_eager(x)
        except (RuntimeError, NotImplementedError, ValueError):  # (ValueError: an e4m3 layer's SP0804)
            self._refuse_not_dense(x)
            raise

    def _refuse_not_dense(self, x: torch.Tensor) -> None:
        """SP0901 where x, whose eager call failed, is no dense tensor (a nested tensor, a sparse or mkldnn
        layout: ``layer_args.not_dense``): torch's error from inside the call, "NestedTensorImpl doesn't
        support sizes", "Sparse CSR tensors do not have is_contiguous", said nothing of x. Checked once
        the call failed, so that a dense x pays nothing for it."""
        error = not_dense(x, self._user_name or type(self).__name__)
        if error is not None:
            raise error from None

    def _forward_eager(self, x: torch.Tensor) -> torch.Tensor:
        """The forward of an eager call (no tracer: :func:`tracing` is False)."""
        d = self.__dict__
        fused = d.get("_fused")
        if fused is not None:  # fuse_projections_: one launch for this layer and its siblings (projection_group.py)
            return fused[0].run(fused[1], x)
        b = d["_buffers"]
        if d["_parameters"] or d["_modules"]:  # (inline: no call on the usual path) a tensor made an
            b = self._tensors()                # nn.Parameter, or parametrized
        if needs_autograd(x, b):  # x's (and a trainable bias's) gradient through the frozen weight
            if (static := b.get("input_scale")) is not None and static.requires_grad:
                return self._forward_op(x)  # (sparse_linear_e4m3, whose backward refuses the scale's gradient)
            return LayerWithInputGrad.apply(x, b["bias"], self, b["values"], b["meta"], b["scale_w"])
        w = d["_weight"]
        if w is not None:  # still this layer's tensors, at the addresses its records were built for?
            ptrs = d["_bound_ptrs"]
            if (b["values"] is not w.values or b["meta"] is not w.meta or b["bias"] is not w.bias
                    or b["scale_w"] is not w.scale_w or w.values.data_ptr() != ptrs[0]
                    or w.meta.data_ptr() != ptrs[1] or (ptrs[2] and w.bias.data_ptr() != ptrs[2])
                    or (ptrs[3] and w.scale_w.data_ptr() != ptrs[3])
                    or (static := b.get("input_scale")) is not d["_bound_static"]  # (the static scale's records
                    or (ptrs[4] and static.data_ptr() != ptrs[4])):                # hold its memory)
                self._rebound(quiet=b is not d["_buffers"] and "parametrizations" in d["_modules"])
        last = d["_last"]
        if last is not None:  # the same kind of call as the last one: its record launched directly
            y = last(x)
            if y is not None:
                return y
        w = d["_weight"] or self._bound(b)
        shape = x.shape
        if not (shape and shape[-1] == self.in_features and x.dtype in OUT_DTYPES and x.device == w.values.device):
            self._checked_input(x)  # raises the diagnostic
        if x.is_meta:  # (a layer moved to the meta device: y's shape and type, from the ops' fake, as nn.Linear)
            return self._forward_op(x)
        out_dtype = self.out_dtype or x.dtype
        two_d = len(shape) == 2
        x2 = x if two_d else x.reshape(-1, self.in_features)
        tokens = x2.shape[0]
        if tokens == 0:
            return x.new_empty((*shape[:-1], self.out_features), dtype=out_dtype)
        scale_x = static = None
        if w.scale_w is not None:  # e4m3 weights: x quantized per token, or with a static per-tensor scale
            static = b.get("input_scale")
            x2 = x2.contiguous()
            if x2.is_cuda and tokens <= RECORD_QUANTIZE_MAX_T and (static is None or not static.data_ptr() % 16):
                # by the record's first launch (the quantizer; a static one reads the scale's memory): one native call
                records = d["_records"]
                key = (tokens, x2.dtype, x2.get_device(), out_dtype, "quantize") if static is None else \
                    (tokens, x2.dtype, x2.get_device(), out_dtype, "quantize-static", static.data_ptr())
                y = records.run(key, x2, w, None, out_dtype, quantize=True, static=static)
                self._remember(records, key, x, x2)
                return y if two_d else y.view(*shape[:-1], self.out_features)
            if static is None:
                x2, scale_x = quantize_per_token(x2)
            else:
                x2, scale_x = quantize_with_scale(x2, static, None if x2.is_cuda else static_inverse(d, static)), static
        elif x2.dtype != w.values.dtype:
            x2 = x2.to(w.values.dtype)
        x2 = x2.contiguous()
        if x2.is_cuda:
            records = self.__dict__["_records"]
            key = (tokens, x2.dtype, x2.get_device(), out_dtype) if static is None else \
                (tokens, x2.dtype, x2.get_device(), out_dtype, "static")
            y = records.run(key, x2, w, scale_x, out_dtype)
            if scale_x is None:
                self._remember(records, key, x, x2)
        else:
            y = run_interpreted(x2, w, scale_x, out_dtype)
        return y if two_d else y.view(*shape[:-1], self.out_features)

    def _remember(self, records: RecordCache, key: tuple, x: torch.Tensor, x2: torch.Tensor) -> None:
        """Keep the call ``records`` just ran for x (as ``x2``, 2-D) as this layer's :class:`LastCall`,
        where x2 is x's own memory (no copy, no conversion) and no CUDA graph is being captured."""
        if x2.data_ptr() == x.data_ptr() and not capturing():
            self.__dict__["_last"] = LastCall.of(records, x, records.stream_of(x.get_device()), key)

    def _forward_op(self, x: torch.Tensor, pre: bool = False, weight: tuple[Any, ...] | None = None) -> torch.Tensor:
        """The forward as custom ops (``torch.ops.sparsile``), for tracers; ``pre``: the float32
        pre-activations (T, rows of the weight) instead, for a backward (autograd.py). ``weight``:
        (values, meta, bias, scale_w) to compute with instead of the layer's (autograd.py's, under
        torch.func). Under torch.func's transforms a call goes through
        :class:`~.autograd.TransformedLayerWithInputGrad` (the op's autograd formula has no torch.func
        support: torch's RuntimeError), whether or not x looks like it needs a gradient: inside
        ``grad(vmap(f))`` x is a BatchedTensor that does not require grad over a GradTrackingTensor
        that does, and a ``jvp``'s dual x requires none (the op would drop its tangent). An e4m3
        layer whose x requires grad (grad mode on) runs ``sparse_linear_e4m3``, the quantizer and the
        kernel as one op on the 16-bit x, for x's straight-through gradient in its dtype (autograd.py),
        and so does one that torch.export traces, whose program may later be run with such an x;
        otherwise ``quantize_per_token_e4m3`` then ``sparse_linear``, as before. A layer with a static
        ``input_scale`` passes it to ``sparse_linear_e4m3`` (which then quantizes with it), or quantizes
        x with torch's operations (:func:`~.quantize.quantize_static`) before ``sparse_linear``."""
        static = self.input_scale if self.weight_dtype == "e4m3" else None
        static_grad = static is not None and static.requires_grad and torch.is_grad_enabled()
        if weight is None:
            if not pre and func_transformed() and not static_grad:
                return TransformedLayerWithInputGrad.apply(x, self.bias, self, self.values, self.meta, self.scale_w)
            weight = self.values, self.meta, self.bias, self.scale_w
        values, meta, bias, scale_w = weight
        # the devices first, as the eager call binds them (Weight: _bound) before it checks x: SP0901 in both (a
        # traced call reported a bias, meta or scale_w on another device as the op's SP0906, naming x's device)
        check_devices(values, (("meta", meta), ("bias", bias), ("scale_w", scale_w)))
        if static is not None and static.device != values.device:
            self._wrong_scale_device(static.device, values.device)
        out_dtype = self._checked_input(x)
        x2 = x.reshape(-1, self.in_features)
        scale_x = None
        if self.weight_dtype == "e4m3":
            # (torch.export: its program runs under autograd whatever the example x required, so the one op either
            # way, as fx_trace.py does; with the two, a program exported with an x without grad refused a later x's
            # gradient at backward(), SP0922. The same numbers; torch.compile guards on requires_grad instead)
            grad_x = (x.requires_grad or torch._C._are_functorch_transforms_active()) and torch.is_grad_enabled()
            grad_x = grad_x or torch.compiler.is_exporting()
            if not pre and (grad_x or static_grad):  # x's straight-through gradient: the quantizer and the kernel as
                # one op on the 16-bit x (autograd.py; apart, x's would be fp8); a static scale that requires grad: its
                # gradient refused there (SP0922), as x's is kept. (A torch.func transform under torch.compile: dynamo
                # traces grad's body with an x that does not require grad, and the fp8 x's gradient was SP0922.)
                y = torch.ops.sparsile.sparse_linear_e4m3(x2, values, meta, bias, scale_w, static,
                                                          activation=self.activation, out_dtype=out_dtype)
                return y.reshape(*x.shape[:-1], self.out_features)
            if static is not None:
                x2, scale_x = quantize_static(x2, static), static
            else:
                x2, scale_x = torch.ops.sparsile.quantize_per_token_e4m3(x2)
        # (a 16-bit weight: x passed in its own dtype, cast by the op, whose backward gives x's gradient in it:
        # cast here, a float32 x's gradient was rounded to the weight's dtype, unlike the eager call's)
        y = torch.ops.sparsile.sparse_linear(x2, values, meta, bias, activation=None if pre else self.activation,
                                             scale_x=scale_x, scale_w=scale_w,
                                             out_dtype=torch.float32 if pre else out_dtype)
        return y if pre else y.reshape(*x.shape[:-1], self.out_features)

    # -------------------------------------------------------------------------------------------
    # nn.Module plumbing

    def to_dense(self) -> torch.Tensor:
        """The pruned dense weight (N, K) in float32 on the layer's device (times ``scale_w`` for
        e4m3), rebuilt from values and metadata: ``x @ layer.to_dense().T`` is what forward computes
        before the epilogue. On the meta device (no values), a meta tensor of that shape and type."""
        if self.values.is_meta or self.meta.is_meta:
            return torch.empty((self.out_features, self.in_features), dtype=torch.float32, device="meta")
        dense = host_dense(self.values, self.meta, self.out_features, self.in_features).astype(np.float32)
        if self.scale_w is not None:
            dense = dense * as_host_array(self.scale_w.detach().float(), "scale_w").reshape(-1, 1)
        return torch.from_numpy(np.ascontiguousarray(dense)).to(self.values.device)

    def to_linear(self, dtype: torch.dtype | None = None) -> nn.Linear:
        """An ``nn.Linear`` with this layer's pruned weight (:meth:`to_dense`, times ``scale_w``) and
        bias, in ``dtype`` (default: the values' dtype, bf16 for e4m3), on the layer's device: the layer
        kept dense (``save_sparse24_checkpoint`` writes an ``nn.Linear`` as a plain ``.weight``; an
        in_features that is not a multiple of 4 cannot be written sparse). Without a fused activation,
        out_dtype or static input scale (the dense layer computes none of them): apply those after it."""
        dtype = dtype or (torch.bfloat16 if self.weight_dtype == "e4m3" else self.values.dtype)
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = nn.Parameter(self.to_dense().to(dtype))
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias.detach().to(dtype, copy=True))
        return linear

    def extra_repr(self) -> str:
        out = f", out_dtype={self.out_dtype}" if self.out_dtype is not None else ""
        static = ", input_scale=static" if self.__dict__["_buffers"].get("input_scale") is not None else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={self.weight_dtype}, sparsity=2:4, activation={self.activation}{out}{static}")

    def _apply(self, fn: Any, recurse: bool = True) -> SparseLinear:
        """Device moves apply; dtype conversions do not change the stored weight (its kernel and
        metadata depend on its type) nor the float32 bias and scales."""
        def keep_dtype(t: torch.Tensor) -> torch.Tensor:
            moved = fn(t)
            return moved if moved.dtype == t.dtype else t.to(device=moved.device)

        try:
            with restoring_tensors(self):  # (one that raises midway, a device out of memory: the layer as it was)
                result = super()._apply(keep_dtype, recurse)
        finally:
            self._invalidate()
        fused = self.__dict__.get("_fused")
        if fused is not None:  # checked now, not at a later (maybe traced) run: a moved member ends the
            fused[0].settle()  # group and frees the fused copy; a dtype cast keeps the views and fusion
        return result

    def _check_padding(self, values: torch.Tensor, words: torch.Tensor) -> None:
        """SP0814 when ``values`` with metadata ``words`` (about to be loaded) hold a nonzero weight in
        the padding beyond ``in_features``: the buffers of a layer of up to a group more input features
        have the same shapes, and x's padding is zero, so its last columns would be dropped unseen."""
        if values.is_meta or words.is_meta:  # (a layer built on the meta device, loaded in part: no values yet)
            return
        dense = host_dense(values.to(self.values.dtype), words.to(torch.int32), int(values.shape[0]),
                           2 * self.values.shape[1])
        beyond = np.argwhere(dense[:, self.in_features:] != 0)  # (NaN too)
        if len(beyond):
            row, col = (int(i) for i in beyond[0])
            raise SparsityError(SP_VALUES_MISMATCH, f"the state dict's weight has a nonzero value in row {row}, "
                                f"column {self.in_features + col} (and {len(beyond) - 1} more), beyond this "
                                f"layer's {self.in_features} input features",
                                help="load it into a SparseLinear of the in_features it was saved from")

    def _check_loaded_weight(self, state_dict: Any, prefix: str) -> None:
        """SP0902 for a dense ``weight`` in the state dict (an ``nn.Linear``'s: this layer has no such
        buffer, so torch would leave the old weight and, with ``strict=False``, load the bias next to
        it without an error), SP0814 for ``values`` that a copy would not carry over (fp8 values into
        a 16-bit layer or the reverse: their scale is another tensor; integer values)."""
        dense = state_dict.get(prefix + "weight")
        # (a weight registered on the layer since, as transformers' tie_weights sets one, takes it: torch loads it)
        if isinstance(dense, torch.Tensor) and "weight" not in self._parameters and "weight" not in self._buffers:
            raise IntegrationError(SP_CANNOT_SPARSIFY, f"the state dict holds a dense weight {prefix}weight of "
                                   f"shape {tuple(dense.shape)} for this SparseLinear, which stores its weight as "
                                   "compressed values and metadata: it would not be loaded (the old weight kept, "
                                   "the new bias next to it)", help="load the dense state dict into the dense model, "
                                   "then sparsify_ it (or SparseLinear.from_dense each linear)")
        values = state_dict.get(prefix + "values")
        if not isinstance(values, torch.Tensor) or values.dtype == self.values.dtype:
            return
        if self.weight_dtype == "e4m3" or values.dtype not in (torch.bfloat16, torch.float16, torch.float32,
                                                               torch.float64):
            raise SparsityError(SP_VALUES_MISMATCH, f"the state dict's {prefix}values are {values.dtype}, but this "
                                f"layer's weight is {self.weight_dtype} ({self.values.dtype}): a copy would cast "
                                "them to other numbers (e4m3 values mean values * scale_w)",
                                help="load it into a SparseLinear of the weight type it was saved from (dtype=)")
        big = 0 if values.is_meta else beyond_f16(values, self.weight_dtype)
        if big:  # (as from_dense refuses them: the cast makes them inf, the outputs of their rows inf or NaN)
            raise SparsityError(SP_VALUES_MISMATCH, f"the state dict's {prefix}values are {values.dtype}, {big} of "
                                f"them beyond ±{F16_MAX:g}: as this layer's {self.weight_dtype} ({self.values.dtype}) "
                                "they would be inf", help="load it into a SparseLinear of dtype='bf16' (the range of "
                                "float32), or of the weight type it was saved from")

    def _check_state_dict(self, state_dict: Any, prefix: str) -> bool:
        """The checks of a state dict about to be loaded (SP0902, SP0814, the metadata's SP08xx),
        nothing copied; whether its ``meta`` was checked (of the buffer's shape)."""
        self._check_loaded_weight(state_dict, prefix)
        incoming = state_dict.get(prefix + "meta")
        # checked before the copy, so that refused words never reach the buffer (on CUDA they are
        # trusted); words of another shape are torch's size mismatch, and not copied
        checked = isinstance(incoming, torch.Tensor) and incoming.shape == self.meta.shape
        if checked:
            self.check_metadata(incoming)
        values = state_dict.get(prefix + "values")
        if 2 * self.values.shape[1] != self.in_features and (incoming is None or checked):
            same = isinstance(values, torch.Tensor) and values.shape == self.values.shape
            self._check_padding(values if same else self.values, incoming if checked else self.meta)
        return checked

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        checked = self._check_state_dict(state_dict, prefix)
        if local_metadata.get("assign_to_params_buffers"):  # (assign=True: the types a copy gives them)
            state_dict = in_own_types(self, state_dict, prefix, _BUFFERS)
        # all of the layer's tensors or none: torch copies those that fit and reports the others (a values of
        # another shape left the new meta with the old values, a weight of neither state dict)
        if withhold_refused(self, state_dict, prefix, local_metadata, missing_keys, unexpected_keys, error_msgs):
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if prefix + "meta" in state_dict and not checked:
            self.check_metadata()
        self._invalidate()

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``, all or nothing: with ``strict``, missing or unexpected keys
        are refused before anything is copied (torch copies first: a state dict without ``meta``
        left the new values with the old metadata); a tensor torch would not copy (another shape)
        leaves the layer's others uncopied too. ``strict=False`` loads what the state dict holds
        (values alone included: a load in parts, as transformers' loader makes)."""
        if strict:
            refused = strict_key_errors(self, state_dict)
            if refused is not None:
                self._check_state_dict(state_dict, "")  # (its own diagnostic first, as when loaded)
                raise RuntimeError(refused)
        return super().load_state_dict(state_dict, strict, assign)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "input_scale" and value is not None:  # (SP0902: a 16-bit layer, or not one float32 element)
            checked_input_scale(value, self.__dict__.get("weight_dtype"), tensor=True)
        if name == "activation":  # checked here as in __init__, not at the next call (SP0904, SP0905)
            checked_activation(value, self._activations)
        elif name == "out_dtype":
            checked_out_dtype(value)
        super().__setattr__(name, value)
        if (name in _BUFFERS or name in ("activation", "out_dtype")) and "_records" in self.__dict__:
            self._invalidate()  # (the records fuse the activation and store the output type)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_last", None)  # (pickled before the last call existed)
        self.__dict__["_buffers"].setdefault("input_scale", None)  # (pickled before static input scales)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state["_records"], state["_weight"], state["_last"] = RecordCache(pdl=True), None, None
        state.pop("_static_inverse", None)
        state.pop("_replayed", None)  # (a copy's memory is replayed by no graph)
        return state
