"""Sparse training: ``SemiSparseLinear``, a 2:4 linear layer with a backward pass (docs/training.md).

    layer = SemiSparseLinear.from_dense(linear, "bf16")      # or SparseLinear.from_dense(linear, trainable=True)
    trainer = SparseTrainer(model, optimizer, reprune_every=100)
    loss(model(x)).backward(); optimizer.step()              # the hook re-compresses after each step

The weight is a dense *master* ``nn.Parameter`` (any float dtype; the optimizer sees an ordinary
dense tensor) with a fixed boolean ``mask`` buffer that is 2:4 along rows **and** columns
(transposable, docs/sparse-metadata.md §12). Two compressions of ``weight * mask`` live in buffers:
``values``/``meta`` of W (N, K) and ``values_t``/``meta_t`` of Wᵀ (K, N), both "sm90" metadata.

* forward: y = x @ (W·mask)ᵀ + bias, the sparse kernel with W (``torch.ops.sparsile.sparse_linear_train``);
* dX = dY @ (W·mask): the same kernel with the compressed Wᵀ (2:4 along its rows because the mask is
  transposable), through ``torch.ops.sparsile.sparse_linear``;
* dW = (dYᵀ @ X) · mask (a dense GEMM, ``torch.matmul``; ``mask_grad=False``: not masked, the
  straight-through estimator), db = dY summed over tokens.

After the optimizer changes the master weight the compressions are stale: :meth:`SemiSparseLinear.refresh`
(``compress_gpu`` twice on the GPU) rebuilds them in place. :class:`SparseTrainer` does it from an
optimizer step hook, and every ``reprune_every`` steps first recomputes the transposable mask from
the master weight's magnitude (:meth:`SemiSparseLinear.reprune`). An eager forward also refreshes by
itself when the weight or mask changed since the last compression (``Tensor._version``).
"""

from __future__ import annotations

import math
import warnings
import weakref
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from ...stdlib.kernels.sparsity_gpu import compress_gpu, prune_transposable_gpu
from ...stdlib.sparsity import as_host_array, compress, encode_metadata, metadata_shape, operand_type
from ...stdlib.sparsity.transposable import transposable_mask_2_4
from ..errors import SP_BAD_TENSOR, SP_TRAIN_LAYER, SP_TRAIN_MASK, SP_TRAIN_SETUP, IntegrationError
from ._kernels import OUT_DTYPES, Weight, kernel_api, run_interpreted
from .atomic import copy_all, in_own_types, restoring_tensors, strict_key_errors, withhold_refused
from .autograd import autograd_kernel, refuse_second_derivative
from .fx_trace import is_fx_proxy, recorded_call
from .layer_args import (
    F16_MAX,
    beyond_f16,
    check_devices,
    check_input,
    checked_features,
    dense_weight,
    weight_dtype_name,
)
from .linear import EMPTY_META_WORD, WEIGHT_DTYPES, SparseLinear
from .optimizer_steps import AfterStep, watch_optimizer_steps
from .parametrize_guard import guarded_parametrizations
from .record_cache import RecordCache
from .refused_grad import Refusal
from .train_transforms import (
    check_transformed_call,
    forward_mode_error,
    grad_tracked,
    grad_unwrapped,
    outside_transforms,
    traced,
)
from .vmap_rules import register_train_vmap_rule

_RECORDS = RecordCache()
_COMPRESSED = ("values", "meta", "values_t", "meta_t")
_LAYERS: weakref.WeakSet[SemiSparseLinear] = weakref.WeakSet()
"""Every live :class:`SemiSparseLinear`, for the optimizer step hooks (:func:`_follow_optimizer_steps`)."""


class _Same:
    """One tensor object, for the freshness keys of :class:`SemiSparseLinear` (a weak reference: the
    tensor is not kept alive): equal to another ``_Same`` of the same object while it lives. A weight
    or mask under ``torch.nn.utils.parametrize`` is a new tensor on each access, at version 0 and
    possibly at the address of the one before, so versions and addresses matched and the forward
    kept compressions of an older weight (docs/training.md, "Master weight and re-compression");
    it is never the tensor compressed, except under ``parametrize.cached()`` (one tensor a block)."""

    __slots__ = ("ref",)

    def __init__(self, t: torch.Tensor | None = None):
        self.ref = weakref.ref(t) if t is not None else _no_tensor

    def __eq__(self, other: object) -> bool:
        t = self.ref()
        return t is not None and isinstance(other, _Same) and t is other.ref()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Same, ())  # a copy (pickle, deepcopy) names no tensor: equal to none, the copy stale


def _no_tensor() -> None:
    return None


def _follow_optimizer_steps(layer: SemiSparseLinear) -> None:
    """Have every optimizer step mark ``layer`` stale where it steps its weight (docs/training.md,
    "Master weight and re-compression"): torch's fused optimizers (``fused=True``) write the
    parameters without bumping their version counters, so the forward's own check (``_version``)
    missed their steps and computed with the compressions of the weight from before (0.8 off in
    tests/integrations/test_torch_training.py). Global step hooks of ``torch.optim``
    (optimizer_steps.py), for any optimizer."""
    _LAYERS.add(layer)
    watch_optimizer_steps(_stepped_layers)


def _stepped_layers(params: list[torch.Tensor]) -> AfterStep | None:
    """Before a step of ``params``: the live layers whose master weight it steps, with their freshness
    marks; after it, each that no refresh reached during the step is marked stale (a
    :class:`SparseTrainer`'s hook, which runs before the global one, refreshed its layers: not
    compressed twice), so that its next eager call compresses the weight the step left."""
    if not _LAYERS:
        return None
    stepped = {id(p) for p in params}
    layers = [(layer, layer.__dict__.get("_fresh")) for layer in list(_LAYERS)
              if id(layer._parameters.get("weight")) in stepped]
    if not layers:
        return None

    def after() -> None:
        for layer, fresh in layers:
            if layer.__dict__.get("_fresh") is fresh:
                layer.__dict__["_fresh"] = None

    return after


# ------------------------------------------------------------------------------------------------
# the op and its backward


def _run_kernel(x: torch.Tensor, values: torch.Tensor, meta: torch.Tensor, bias: torch.Tensor | None,
                out_dtype: torch.dtype) -> torch.Tensor:
    """y (T, N) = x @ decompress(values, meta).T + bias for 2-D x in values' dtype."""
    if x.shape[0] == 0:
        return x.new_empty((0, values.shape[0]), dtype=out_dtype)
    kernel_bias = bias if bias is None or bias.dtype in (torch.float32, out_dtype) else bias.float()
    w = Weight(values, meta, kernel_bias, None, None)
    if x.device.type != "cuda":
        return run_interpreted(x.contiguous(), w, None, out_dtype)
    if kernel_bias is not bias:  # a converted bias is a new tensor per call: no launch record for it
        return kernel_api().sparse_linear(values, meta, x.contiguous(), bias=kernel_bias,
                                          out_dtype=OUT_DTYPES[out_dtype])
    ptrs = tuple(t.data_ptr() if t is not None else 0 for t in (values, meta, bias))
    key = (int(x.shape[0]), x.dtype, x.device.index, out_dtype, ptrs, tuple(values.shape))
    return _RECORDS.run(key, x.contiguous(), w, None, out_dtype, off_pool=True)


def _check_op(x: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, values: torch.Tensor,
              values_t: torch.Tensor, bias: torch.Tensor | None) -> None:
    n, k = int(weight.shape[0]), int(weight.shape[1])
    if x.dim() != 2 or x.shape[1] != k or x.dtype != values.dtype:
        raise IntegrationError(SP_BAD_TENSOR, f"sparsile.sparse_linear_train: x must be (T, {k}) {values.dtype}, "
                               f"got {x.dtype} {tuple(x.shape)}", help="call it through SemiSparseLinear")
    if (tuple(mask.shape) != (n, k) or values.shape[0] != n or values_t.shape[0] != k
            or (bias is not None and tuple(bias.shape) != (n,))):
        raise IntegrationError(SP_TRAIN_MASK, "sparsile.sparse_linear_train: weight, mask, compressions and bias "
                               "do not describe one layer", help="pass a SemiSparseLinear's own tensors")


_LIBRARY = torch.library.Library("sparsile", "FRAGMENT")
SPARSE_LINEAR_TRAIN_SCHEMA = (
    "sparse_linear_train(Tensor x, Tensor weight, Tensor mask, Tensor values, Tensor meta, Tensor values_t, "
    "Tensor meta_t, Tensor? bias=None, *, ScalarType? out_dtype=None, bool mask_grad=True) -> Tensor")
"""Defined with ``torch.library.Library``, not ``torch.library.custom_op`` (as it was): its autograd
formula is an Autograd kernel of its own (:class:`_TrainFormula`, which torch.func takes), and torch
before 2.13 refuses one registered over the decorator's (ops.py)."""
_LIBRARY.define(SPARSE_LINEAR_TRAIN_SCHEMA)


def sparse_linear_train(x: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, values: torch.Tensor,
                        meta: torch.Tensor, values_t: torch.Tensor, meta_t: torch.Tensor,
                        bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
                        mask_grad: bool = True) -> torch.Tensor:
    """y (T, N) = x @ (weight * mask).T + bias, computed by the sparse kernel from ``values``/``meta``
    (the compression of weight * mask; ``weight`` and ``mask`` are there for the backward)."""
    _check_op(x, weight, mask, values, values_t, bias)
    return _run_kernel(x, values, meta, bias, out_dtype or x.dtype)


_LIBRARY.impl("sparse_linear_train", sparse_linear_train, "CompositeExplicitAutograd")


@torch.library.register_fake("sparsile::sparse_linear_train", lib=_LIBRARY)
def _sparse_linear_train_fake(x: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, values: torch.Tensor,
                              meta: torch.Tensor, values_t: torch.Tensor, meta_t: torch.Tensor,
                              bias: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
                              mask_grad: bool = True) -> torch.Tensor:
    _check_op(x, weight, mask, values, values_t, bias)
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=out_dtype or x.dtype)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any) -> None:
    x, weight, mask, _values, _meta, values_t, meta_t, bias = inputs
    ctx.save_for_backward(x, mask, values_t, meta_t)
    ctx.weight_dtype = weight.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.mask_grad = keyword_only_inputs.get("mask_grad", True)


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """dX = dY @ (W·mask) (sparse kernel, Wᵀ compressed), dW = (dYᵀ @ X)·mask (dense GEMM), db = Σ dY."""
    x, mask, values_t, meta_t = ctx.saved_tensors
    dyk = dy.to(x.dtype)
    dx = dw = db = None
    # the weight as the call was given it (_TrainFormula.setup_context): under nested torch.func transforms
    # (jacrev of grad) an outer level may track it where this one does not (needs_input_grad[1] False)
    anchor = getattr(ctx, "weight_anchor", None)
    weight_tracked = ctx.needs_input_grad[1] or (anchor is not None and grad_tracked(anchor))
    if ctx.needs_input_grad[0]:
        dx = torch.ops.sparsile.sparse_linear(dyk, values_t, meta_t, out_dtype=x.dtype)
        if weight_tracked and torch.is_grad_enabled():  # create_graph=True: dX's graph lacks W
            dx = refuse_second_derivative(dx, (x, dy, anchor), wrapped_live=True, refusal=Refusal(
                SP_TRAIN_LAYER, "a trainable sparse layer has no second derivative through x's gradient: dX is "
                "computed from the compressed weight, so its dependence on the master weight would be missing",
                help="differentiate twice through a dense layer with the same masked weight (layer.to_dense()), "
                     "or freeze the weight (weight.requires_grad_(False)): then it is exact"))
    if ctx.needs_input_grad[1]:
        dw = torch.matmul(dyk.t(), x)
        if ctx.mask_grad:
            dw = dw * mask
        dw = dw.to(ctx.weight_dtype)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[7]:
        db = dy.float().sum(0).to(ctx.bias_dtype)
    return dx, dw, None, None, None, None, None, db


class _TrainFormula(torch.autograd.function._SingleLevelFunction):
    """The op's autograd formula (:func:`_setup_context`, :func:`_backward`) as its Autograd kernel applies
    it (autograd.autograd_kernel: a node at each torch.func grad level, as torch's own operators; the
    forward is the kernel below autograd, the last argument). Before, the formula came from
    ``torch.library.register_autograd``, an ``autograd.Function`` without ``setup_context``, which
    torch.func refuses: the op called directly under ``torch.func.grad`` stopped at torch's RuntimeError,
    and so did a torch.compile'd ``vmap(grad(f))`` of a layer in its parameters. The layer went through
    ``TransformedTrainCall``, an ``autograd.Function`` with the same formula, under the transforms (not
    under torch.compile, which saw the op); it calls the op everywhere now."""

    @staticmethod
    def forward(*args: Any) -> torch.Tensor:
        *tensors, _out_dtype, _mask_grad, redispatch = args
        return redispatch(*tensors)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        *tensors, _out_dtype, mask_grad, _ = inputs
        # (the dispatcher leaves a keyword at its default out: None, mask_grad's default is True)
        _setup_context(ctx, tuple(tensors), {"mask_grad": mask_grad is not False}, output)
        ctx.weight_anchor = tensors[1]  # (x's gradient refuses a second derivative in W, at any level: _backward)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (*_backward(ctx, dy), None, None, None)

    @staticmethod
    def jvp(ctx: Any, *tangents: Any) -> Any:
        raise forward_mode_error()

    # compiled autograd (torch._dynamo.compiled_autograd) keys a node's backward by its class's
    # _compiled_autograd_key, which autograd.Function has and a _SingleLevelFunction has not: before, any
    # backward through a SemiSparseLinear under compiled autograd stopped at torch's AttributeError
    # (autograd.py's Formula has the same)
    _compiled_autograd_key = staticmethod(torch.autograd.Function._compiled_autograd_key)


_LIBRARY.impl("sparse_linear_train", autograd_kernel("sparse_linear_train", _TrainFormula, 8,
                                                     ("out_dtype", "mask_grad")), "Autograd", with_keyset=True)
register_train_vmap_rule(_LIBRARY)  # torch.func.vmap: a batch of x is more tokens, one call (vmap_rules.py)


# ------------------------------------------------------------------------------------------------
# masks and compressions


def transposable_mask(weight: torch.Tensor, *, interpret: bool = False) -> torch.Tensor:
    """The transposable 2:4 keep mask (bool, weight's shape and device) of largest total magnitude
    (exact per 4x4 block, docs/sparse-metadata.md §12): ``prune_transposable_gpu`` on CUDA (or on
    the CPU with ``interpret=True``), else the host's ``transposable_mask_2_4``."""
    w = weight.detach()
    if not (w.is_cuda or interpret):
        return torch.from_numpy(transposable_mask_2_4(as_host_array(w.float(), "weight"))).to(w.device)
    mags = w.float().abs()
    # a zero keeps its place: the kernel keeps values, so a zero kept by the best pattern would look
    # dropped. Every pattern keeps 8 of 16, so lifting zeros to the smallest normal float moves no choice
    # except between patterns whose kept sums tie.
    mags = torch.where(mags == 0, torch.finfo(torch.float32).tiny, mags)
    pruned = prune_transposable_gpu(mags, interpret=interpret)
    if isinstance(pruned, np.ndarray):
        pruned = torch.from_numpy(np.ascontiguousarray(pruned))
    return (pruned != 0).to(w.device)


def check_mask(mask: torch.Tensor, shape: tuple[int, int]) -> None:
    """Raise SP0918 unless ``mask`` is a bool (N, K) tensor keeping at most 2 of every 4 along its
    rows and along its columns (groups from index 0; a partial last group counts as padded)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != tuple(shape):
        got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise IntegrationError(SP_TRAIN_MASK, f"the mask must be a bool tensor of shape {tuple(shape)}, got {got}",
                               help="build it with transposable_mask(weight)")
    n, k = shape
    padded = torch.zeros((-(-n // 4) * 4, -(-k // 4) * 4), dtype=torch.int32)
    padded[:n, :k] = mask.detach().cpu()
    for axis, what in ((1, "row"), (0, "column")):
        counts = (padded if axis == 1 else padded.t()).reshape(-1, 4).sum(1).reshape(padded.shape[1 - axis], -1)
        bad = (counts > 2).nonzero()
        if len(bad):
            line, group = (int(v) for v in bad[0])
            raise IntegrationError(SP_TRAIN_MASK, f"the mask keeps {int(counts[line, group])} elements of {what} "
                                   f"{line}, group {group} ({4 * group}..{4 * group + 3}); a trainable layer keeps "
                                   "at most 2 of every 4 along rows and columns",
                                   help="build the mask with transposable_mask(weight), or call layer.reprune()")


def _compressed(matrix: torch.Tensor, name: str, interpret: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, int32 "sm90" words) of a 2:4 matrix, on its device: ``compress_gpu`` on CUDA (or in
    the interpreter), else the host toolkit (compress + encode_metadata)."""
    if matrix.is_cuda or interpret:
        values, meta = compress_gpu(matrix, name, "sm90", interpret=interpret)
        words = meta.data
        if isinstance(values, np.ndarray):
            return (torch.from_numpy(np.ascontiguousarray(values).view(np.int16)).view(matrix.dtype),
                    torch.from_numpy(np.array(words, copy=True).view(np.int32)))
        return values, words.view(torch.int32)
    values, indices = compress(as_host_array(matrix, "weight"), name, prune=True)
    words = encode_metadata(indices, "sm90", name, k=int(matrix.shape[1])).data
    return (torch.from_numpy(np.ascontiguousarray(values).view(np.int16)).view(matrix.dtype),
            torch.from_numpy(np.array(words, copy=True).view(np.int32)))


# ------------------------------------------------------------------------------------------------
# the layer


class SemiSparseLinear(nn.Module):
    """A trainable 2:4 linear layer: ``y = x @ (weight * mask).T + bias``, forward and dX on the
    sparse kernel (module docstring; docs/training.md). ``dtype`` ("bf16" or "f16") is the type the
    kernel computes in; the master ``weight`` and ``bias`` keep their own dtype (float32 for mixed
    precision, or bf16). ``mask_grad=False`` lets dW through unmasked (straight-through), so the
    pruned weights keep learning and :meth:`reprune` can bring them back."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    mask: torch.Tensor
    transposed_from: str | None = None
    """The class of the layer it was made from where that one stores its weight transposed, (in, out):
    "transformers Conv1D" (set by ``sparsify_``). A dense weight of shape (in, out) without a mask in a
    state dict (such a layer's own) is refused: square, it would load transposed unseen."""
    source_classes: tuple[str, ...] | None = None
    """The class names (MRO) of the module it replaced where they are not ``nn.Linear``'s (a
    ``FalconLinear``, a transformers ``Conv1D``): what compressed-tensors matches a config group's
    class targets against (``layer_checkpoint.module_classes``); kept by :meth:`to_sparse_linear`."""

    parametrizations = guarded_parametrizations(dict.fromkeys(_COMPRESSED, (
        "parametrize the master weight instead: register_parametrization(layer, 'weight', P); values, meta, "
        "values_t and meta_t are compressed from weight * mask at each refresh")))
    """torch.nn.utils.parametrize's ModuleDict; SP0925 for the compressions (parametrize_guard.py)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype: Any = "bf16",
                 mask_grad: bool = True, device: Any = None, param_dtype: torch.dtype = torch.float32):
        super().__init__()
        in_features, out_features = checked_features(in_features, out_features, "SemiSparseLinear", SP_TRAIN_LAYER)
        self.in_features, self.out_features = in_features, out_features
        self.weight_dtype = weight_dtype_name(dtype)
        if self.weight_dtype == "e4m3":
            raise IntegrationError(SP_TRAIN_LAYER, "sparse training computes in bf16 or f16, not e4m3",
                                   help="train with dtype='bf16', then convert: layer.to_sparse_linear() keeps bf16")
        self.mask_grad = bool(mask_grad)
        n, k = out_features, in_features
        op = operand_type(self.weight_dtype)
        kind = WEIGHT_DTYPES[self.weight_dtype]
        self.weight = nn.Parameter(torch.zeros((n, k), dtype=param_dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(n, dtype=param_dtype, device=device)) if bias else None
        self.register_buffer("mask", torch.zeros((n, k), dtype=torch.bool, device=device))
        for name, rows, cols in (("values", n, k), ("values_t", k, n)):
            self.register_buffer(name, torch.zeros((rows, -(-cols // 4) * 2), dtype=kind, device=device))
            words = metadata_shape("sm90", op, rows, cols)
            self.register_buffer(name.replace("values", "meta"),
                                 torch.full(words, EMPTY_META_WORD, dtype=torch.int32, device=device))
        self.__dict__["_fresh"] = None
        self.__dict__["_mask_checked"] = None
        _follow_optimizer_steps(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        _follow_optimizer_steps(self)  # (a copy: copy.deepcopy, pickle)

    @classmethod
    def from_dense(cls, linear: nn.Module, dtype: Any = None, *, mask_grad: bool = True,
                   interpret: bool = False) -> SemiSparseLinear:
        """A trainable layer from ``linear``: its weight becomes the master weight (a copy, same
        dtype and device), the mask the transposable 2:4 mask of largest magnitude. ``dtype``:
        "bf16" or "f16" (None: the linear's own dtype; a float32 linear needs one, SP0903)."""
        weight = dense_weight(linear, SP_TRAIN_LAYER)
        name = weight_dtype_name(dtype, weight.dtype)
        big = beyond_f16(weight, name)
        if big:  # (as SparseLinear.from_dense: the compressions would hold inf)
            raise IntegrationError(SP_TRAIN_LAYER, f"{big} weights lie beyond ±{F16_MAX:g}, the largest finite "
                                   "float16: as f16 they would be inf", help="train with dtype='bf16'")
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype=name,
                    mask_grad=mask_grad, device=weight.device, param_dtype=weight.dtype)
        with torch.no_grad():
            layer.weight.copy_(weight)
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        layer.reprune(interpret=interpret)
        return layer

    # -------------------------------------------------------------------------------------------
    # keeping the compressions in step with the master weight

    def _compression_buffers(self) -> tuple[torch.Tensor, ...]:
        """values, meta, values_t, meta_t."""
        return tuple(getattr(self, name) for name in _COMPRESSED)

    def _state_key(self, weight: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> tuple[Any, ...]:
        """What the compressions were made from: the weight's and mask's (None: the layer's) versions,
        addresses and objects (:class:`_Same`: a parametrized one is a new object on each access)."""
        w = self.weight if weight is None else weight
        m = self.mask if mask is None else mask
        return (w._version, m._version, w.data_ptr(), m.data_ptr(), w.device.index or 0, _Same(w), _Same(m))

    @torch.no_grad()
    def refresh(self, *, interpret: bool = False) -> None:
        """Re-compress ``weight * mask`` into values/meta and its transpose into values_t/meta_t, in
        place (the buffers keep their addresses: launch records and CUDA graphs stay valid). On
        CUDA: two ``compress_gpu`` passes and a transposed copy (about 5 weight-sized passes of
        memory traffic in the compute dtype, docs/training.md); on the CPU: the host toolkit, or
        the same GPU kernels in the interpreter with ``interpret=True``. A mask changed since it was
        last checked (assigned or edited in place) is checked first (SP0918): compressing a mask that
        keeps more than 2 of 4 would prune W and Wᵀ differently, forward and dX unlike the mask.
        Both compressions are computed before either is copied in: one that raises (a device out of
        memory at Wᵀ's) leaves all four buffers as they were, and the layer stale (its next eager
        call compresses it again); it left W's new with Wᵀ's old, forward and dX of two weights."""
        mask = self.mask  # (read once: a parametrized mask is computed again on each access)
        self._refresh_from(self.weight, mask, interpret, stacklevel=5)

    def _refresh_from(self, weight: torch.Tensor, mask: torch.Tensor, interpret: bool = False,
                      stacklevel: int = 4) -> None:
        """:meth:`refresh` with ``weight`` and ``mask`` for the layer's (the plain tensors under a
        torch.func grad transform's wrappers, :func:`~.train_transforms.grad_unwrapped`), the layer
        marked fresh for them."""
        with torch.no_grad():
            self._check_mask_once(mask)
            copy_all(self._writes(self._compressions(mask, interpret, weight)))
            self._written(stacklevel=stacklevel, key=self._state_key(weight, mask))

    def _compressions(self, mask: torch.Tensor, interpret: bool,
                      weight: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """(values, meta, values_t, meta_t) of ``weight * mask`` (W's and Wᵀ's; None: the layer's
        weight), new tensors: nothing of the layer is written."""
        masked = torch.where(mask, (self.weight if weight is None else weight).detach(), 0).to(self.values.dtype)
        values, words = _compressed(masked, self.weight_dtype, interpret)
        values_t, words_t = _compressed(masked.t().contiguous(), self.weight_dtype, interpret)
        return values, words, values_t, words_t

    def _writes(self, compressions: tuple[torch.Tensor, ...],
                mask: torch.Tensor | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(buffer, its new value) for :func:`~.atomic.copy_all`: the compressions, and ``mask``."""
        writes = [(getattr(self, name), new) for name, new in zip(_COMPRESSED, compressions, strict=True)]
        return writes if mask is None else [(self.mask, mask), *writes]

    def _written(self, repruned: bool = False, stacklevel: int = 2, key: tuple[Any, ...] | None = None) -> None:
        """After its buffers were copied in: the layer marked fresh (``key``, the state key of what
        was compressed; None: the layer's weight and mask) and its mask checked (a re-prune's is
        transposable by construction), the launch records of its weight brought up to the write, a
        warning for those that cannot be (``stacklevel``: the user's frame)."""
        if repruned:
            self.__dict__["_mask_checked"] = self._mask_key()
        self.__dict__["_fresh"] = self._state_key() if key is None else key
        from .ops import RECORDS as op_records  # the dX launches go through the custom op

        # the records' padded copies follow now, also those CUDA graphs replay (RecordCache.sync)
        stale = _RECORDS.sync(self.values) + op_records.sync(self.values_t)
        if stale:
            warnings.warn(f"sparsile.torch: SemiSparseLinear({self.in_features}, {self.out_features}).refresh: "
                          f"{stale} launch record(s) captured in a CUDA graph read copies of this layer's weight "
                          "that could not be refreshed in place: replays of that graph keep the weight from "
                          "before it. Capture the graph again after each optimizer step", stacklevel=stacklevel)

    def _mask_key(self, mask: Any = None) -> tuple[Any, ...]:
        m = self.mask if mask is None else mask
        return (m._version, m.data_ptr(), m.device.index or 0, _Same(m))

    def _check_mask_once(self, mask: Any = None) -> None:
        """:func:`check_mask` of ``mask`` (None: the layer's) unless it is the one last checked (same
        tensor, memory and version; a parametrized mask is a new tensor on each access)."""
        m = self.mask if mask is None else mask
        if not isinstance(m, torch.Tensor) or self.__dict__.get("_mask_checked") != self._mask_key(m):
            check_mask(m, (self.out_features, self.in_features))
            self.__dict__["_mask_checked"] = self._mask_key(m)

    def reprune(self, *, interpret: bool = False) -> float:
        """Recompute the mask from the master weight's magnitude (:func:`transposable_mask`) and the
        compressions of W and Wᵀ under it, then copy all five in (all or nothing: one that raises
        leaves the layer as it was). Returns the share of mask entries that changed."""
        return _reprune_all([self], interpret)

    # -------------------------------------------------------------------------------------------
    # running

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_fx_proxy(x):  # torch.fx.symbolic_trace: a leaf, the eager layer when the graph runs (fx_trace.py)
            return recorded_call(self, x)
        values = self.values
        check_input(x, self.in_features, values.device, "SemiSparseLinear")
        weight, mask = self.weight, self.mask  # (read once: parametrized ones are computed on each access)
        # (no binding to check once: the op takes the tensors on each call; a few device comparisons)
        check_devices(values, (("weight", weight), ("mask", mask), ("meta", self.meta), ("values_t", self.values_t),
                               ("meta_t", self.meta_t), ("bias", self.bias)))
        check_transformed_call(x, weight, mask, self.bias, self.values)
        # the safety net everywhere but under a tracer (train_transforms.traced): an nn.Parameter x,
        # torch.vmap and a FlopCounterMode skipped it, and computed with a weight from before a step.
        # Under torch.func's grad transforms (functional_call of parameters) the plain tensors they
        # wrap: a weight passed in was ignored for the layer's last compressions
        # (not into compressions a transform wraps: buffers passed in, the caller's, as under vmap)
        plain_w, plain_m = grad_unwrapped(weight), grad_unwrapped(mask)
        if (plain_w is not None and plain_m is not None
                and not traced(x, plain_w, plain_m, *self._compression_buffers())
                and self.__dict__["_fresh"] != self._state_key(plain_w, plain_m)):
            if plain_w is weight and plain_m is mask:
                self.refresh()
            else:
                with outside_transforms():
                    self._refresh_from(plain_w, plain_m)
        # (not -1: ambiguous for x of no elements under vmap, a batch of 0 members)
        x2 = x.reshape(math.prod(x.shape[:-1]), self.in_features).to(self.values.dtype)
        # (under torch.func's transforms too: the op's formula, _TrainFormula, is one they take)
        y = torch.ops.sparsile.sparse_linear_train(x2, weight, mask, self.values, self.meta, self.values_t,
                                                   self.meta_t, self.bias, out_dtype=x.dtype, mask_grad=self.mask_grad)
        return y.reshape(*x.shape[:-1], self.out_features)

    # -------------------------------------------------------------------------------------------
    # conversions and nn.Module plumbing

    def to_dense(self) -> torch.Tensor:
        """``weight * mask`` in float32: the weight the forward multiplies by (before the cast to
        the compute dtype)."""
        return torch.where(self.mask, self.weight.detach().float(), 0)

    def to_sparse_linear(self) -> SparseLinear:
        """An inference :class:`SparseLinear` with copies of the current compression (refreshed
        first if stale): for deployment and ``save_sparse24_checkpoint``; it keeps
        :attr:`transposed_from` (a layer made from a transformers Conv1D is written in its layout) and
        :attr:`source_classes`. ``save_sparse24_checkpoint`` writes a SemiSparseLinear so."""
        if self.__dict__["_fresh"] != self._state_key():
            self.refresh()
        layer = SparseLinear(self.in_features, self.out_features, self.bias is not None, dtype=self.weight_dtype,
                             device="meta")
        layer.values = self.values.detach().clone()
        layer.meta = self.meta.detach().clone()
        if self.transposed_from is not None:  # (save_sparse24_checkpoint writes it in that layer's layout)
            layer.transposed_from = self.transposed_from
        if self.source_classes is not None:  # (the classes a config group's targets are matched against)
            layer.source_classes = self.source_classes
        if self.bias is not None:
            layer.bias = self.bias.detach().float().clone()
        return layer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={self.weight_dtype}, sparsity=2:4 transposable, mask_grad={self.mask_grad}")

    def _apply(self, fn: Any, recurse: bool = True) -> SemiSparseLinear:
        """Device moves apply to everything; dtype conversions only to the master weight and bias
        (the compressions and their metadata belong to the compute dtype)."""
        kept = {id(getattr(self, name)) for name in (*_COMPRESSED, "mask")}

        def keep_dtype(t: torch.Tensor) -> torch.Tensor:
            moved = fn(t)
            return t.to(device=moved.device) if id(t) in kept and moved.dtype != t.dtype else moved

        try:
            with restoring_tensors(self):  # (one that raises midway, a device out of memory: the layer as it was)
                return super()._apply(keep_dtype, recurse)
        finally:
            self.__dict__["_fresh"] = None

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        """The state dict holds the compressions of the master weight it holds: a stale layer (an
        optimizer step without a :class:`SparseTrainer`, before the next eager call) is compressed
        first (its state dict held the compressions from before the step next to the stepped
        weight), except under a tracer and for a weight on the meta device (no values)."""
        weight, mask = self.weight, self.mask
        if (weight.device.type != "meta" and not traced(weight, weight, mask)
                and self.__dict__.get("_fresh") != self._state_key()):
            self.refresh()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _check_state_dict(self, state_dict: Any, prefix: str) -> bool:
        """SP0918 for a mask of the state dict (of the buffer's shape) that keeps more than 2 of 4,
        before anything is copied (it was checked after the copy: the layer kept the bad mask);
        whether it was checked."""
        mask = state_dict.get(prefix + "mask")
        checked = isinstance(mask, torch.Tensor) and mask.shape == self.mask.shape
        if checked:
            check_mask(mask.detach().to(torch.bool), (self.out_features, self.in_features))  # (copy_ casts so)
        return checked

    def _transposed_weight(self, state_dict: Any, prefix: str) -> list[str]:
        """SP0916's message (in a list) where the layer was made from a layer that stores its weight
        transposed (:attr:`transposed_from`) and ``state_dict`` holds a dense weight of that layer's
        shape (in, out) without a mask: that layer's state dict, whose weight a square layer would
        take transposed without a word (a non-square one: torch's size mismatch too); else []."""
        given = state_dict.get(prefix + "weight")
        if (self.transposed_from is None or prefix + "mask" in state_dict or not torch.overrides.is_tensor_like(given)
                or tuple(given.shape) != (self.in_features, self.out_features)):
            return []
        k, n = self.in_features, self.out_features
        return [str(IntegrationError(
            SP_TRAIN_LAYER, f"{prefix}weight of shape ({k}, {n}) comes without {prefix}mask: this SemiSparseLinear "
            f"was made from a {self.transposed_from}, which stores its weight (in, out) = ({k}, {n}), while the "
            f"layer's master weight is its transpose W.T (out, in) = ({n}, {k}); a {self.transposed_from}'s weight "
            "would be loaded transposed",
            help=f"load the layer's own state dict (weight (out, in) with its mask), or transpose the "
                 f"{self.transposed_from}'s weight (state_dict['{prefix}weight'] = weight.T) and pass the layer's "
                 f"mask with it (state_dict['{prefix}mask'] = layer.mask)"))]

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        checked = self._check_state_dict(state_dict, prefix)
        if local_metadata.get("assign_to_params_buffers"):  # (assign=True: the compressions and the mask take
            # the layer's types, as a copy gives them; the master weight and bias keep the state dict's)
            state_dict = in_own_types(self, state_dict, prefix, (*_COMPRESSED, "mask"))
        if withhold_refused(self, state_dict, prefix, local_metadata, missing_keys, unexpected_keys, error_msgs,
                            self._transposed_weight(state_dict, prefix)):
            return  # (all of the layer's tensors or none: SparseLinear._load_from_state_dict)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if prefix + "mask" in state_dict and not checked:  # (a mask of another shape is refused above)
            check_mask(self.mask, (self.out_features, self.in_features))
        if self.weight.device.type != "meta":
            self.refresh()  # the compressions follow the loaded master weight and mask

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``, all or nothing as ``SparseLinear.load_state_dict``: with
        ``strict``, missing or unexpected keys are refused before anything is copied."""
        if strict:
            refused = strict_key_errors(self, state_dict)
            if refused is not None:
                self._check_state_dict(state_dict, "")
                raise RuntimeError(refused)
        return super().load_state_dict(state_dict, strict, assign)


# ------------------------------------------------------------------------------------------------
# the training loop


def trainable_layers(model: nn.Module) -> list[SemiSparseLinear]:
    """Every :class:`SemiSparseLinear` in ``model`` (the model itself included)."""
    return [m for m in model.modules() if isinstance(m, SemiSparseLinear)]


def _layers_of(model: Any) -> list[SemiSparseLinear]:
    if not isinstance(model, nn.Module):
        raise IntegrationError(SP_TRAIN_SETUP, f"expected an nn.Module, got {type(model).__name__}",
                               help="pass the model whose SemiSparseLinear layers are trained")
    layers = trainable_layers(model)
    if not layers:
        raise IntegrationError(SP_TRAIN_SETUP, f"the {type(model).__name__} has no SemiSparseLinear layer",
                               help="build them with SparseLinear.from_dense(linear, trainable=True) or "
                                    "sparsify_(model, trainable=True)")
    return layers


def recompress_(model: nn.Module, *, interpret: bool = False) -> int:
    """:meth:`SemiSparseLinear.refresh` of every trainable layer of ``model``; the number of layers.
    Every layer's mask is checked (SP0918) before any is recompressed."""
    layers = _layers_of(model)
    _refresh_all(layers, interpret)
    return len(layers)


def _refresh_all(layers: list[SemiSparseLinear], interpret: bool) -> None:
    """Each layer's :meth:`~SemiSparseLinear.refresh`, every mask checked first (SP0918): a bad mask in
    one layer left the layers before it recompressed, those after it not."""
    for layer in layers:
        layer._check_mask_once()
    for layer in layers:
        layer.refresh(interpret=interpret)


def reprune_(model: nn.Module, *, interpret: bool = False) -> float:
    """:meth:`SemiSparseLinear.reprune` of every trainable layer, all or nothing; the share of mask
    entries (over all layers) that changed."""
    return _reprune_all(_layers_of(model), interpret)


def _refuse_parametrized_masks(layers: list[SemiSparseLinear]) -> None:
    """SP0917 for a layer whose mask is under ``torch.nn.utils.parametrize``: the mask read is computed
    anew on each access, so a re-prune copied its new mask into a tensor thrown away after, and the
    layer kept its old mask without a word (docs/training.md, "Re-pruning")."""
    for layer in layers:
        if parametrize.is_parametrized(layer, "mask"):
            raise IntegrationError(
                SP_TRAIN_SETUP, f"SemiSparseLinear({layer.in_features}, {layer.out_features}) cannot be re-pruned: "
                "its mask is parametrized (torch.nn.utils.parametrize), a tensor computed on each access, so "
                "the new mask would be written into a copy and lost",
                help="remove the parametrization first (torch.nn.utils.parametrize.remove_parametrizations("
                     "layer, 'mask')), or re-prune the parametrization's original yourself "
                     "(layer.parametrizations.mask.original.copy_(transposable_mask(layer.weight))) and "
                     "keep the trainer's masks fixed (reprune_every=None)")


@torch.no_grad()
def _reprune_all(layers: list[SemiSparseLinear], interpret: bool) -> float:
    """Re-prune every layer, all or nothing; the share of mask entries that changed.

    Each layer's new transposable mask and its compressions of W and Wᵀ are computed, then copied
    in (:meth:`SemiSparseLinear._writes`), one layer at a time. The old mask of each layer copied in
    is kept bit-packed (1/8 byte per weight element). If a later layer raises (a device out of
    memory), the layers done so far get their old masks back and are compressed again. The
    compression is a function of the weight and the mask, so every layer's mask, values, meta,
    values_t and meta_t end as they were, the same tensors at the same addresses, where the
    compressions were up to date with the weight (after an optimizer step, the trainer's re-prune:
    those a refresh gives). If the rollback's own compression of a layer fails, that layer keeps its
    old mask and is left stale: its next eager call compresses it. Before this, each
    layer re-pruned itself: a failure at the third layer left the first two re-pruned. Holding
    every layer's new compressions until the end would cost about 3¼ bytes per weight element of
    the model at once; this costs one layer's compressions and the packed masks."""
    _refuse_parametrized_masks(layers)  # (every layer before any is re-pruned)
    done: list[tuple[SemiSparseLinear, torch.Tensor, bool]] = []
    changed = 0
    try:
        for layer in layers:
            mask = transposable_mask(layer.weight, interpret=interpret)
            compressions = layer._compressions(mask, interpret)
            checked = layer.__dict__.get("_mask_checked") == layer._mask_key()
            old = _packed_bits(layer.mask)
            changed += int((mask != layer.mask).sum())
            # in the rollback before its copy: one interrupted between two copies (a KeyboardInterrupt)
            # is given its old mask back too (it was left with its new one, re-pruned alone)
            done.append((layer, old, checked))
            copy_all(layer._writes(compressions, mask))
            layer._written(repruned=True, stacklevel=5)
    except BaseException:
        # every old mask back first (a copy each, no memory): a rollback that fails itself at a
        # layer's compression (out of memory again) still leaves no layer with its new mask
        for layer, old, _ in reversed(done):
            layer.mask.copy_(_unpacked_bits(old, layer.mask.shape))
            layer.__dict__["_fresh"] = None  # stale until compressed again: its next eager call does it
        for layer, _, checked in reversed(done):
            try:
                copy_all(layer._writes(layer._compressions(layer.mask, interpret)))
                layer._written(stacklevel=5)
            except Exception:  # left stale (its mask is the old one): the original error goes up
                layer.__dict__["_fresh"] = None
            # an old mask not checked (SP0918) stays so, and the layer stale: its next eager call
            # checks it (marked checked, a mask edited to keep 3 of 4 was compressed and used)
            layer.__dict__["_mask_checked"] = layer._mask_key() if checked else None
            if not checked:
                layer.__dict__["_fresh"] = None
        raise
    return changed / sum(layer.mask.numel() for layer in layers)


def _packed_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor as uint8 bytes, 8 elements each (bit i of byte j: element 8j + i)."""
    flat = mask.reshape(-1)
    flat = torch.nn.functional.pad(flat.to(torch.uint8), (0, -flat.numel() % 8)).view(-1, 8)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=mask.device)
    return (flat * weights).sum(dim=1, dtype=torch.uint8)


def _unpacked_bits(packed: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of :func:`_packed_bits`."""
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed[:, None] >> shifts) & 1
    return bits.reshape(-1)[:shape.numel()].bool().reshape(shape)


class SparseTrainer:
    """Keeps a model's trainable sparse layers in step with its optimizer: after every
    ``optimizer.step()`` (a step post-hook, so a step skipped by an AMP GradScaler does nothing)
    the compressions are rebuilt (:func:`recompress_`), and every ``reprune_every`` steps the masks
    are first recomputed from the master weights (:func:`reprune_`). ``remove()`` detaches it."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, reprune_every: int | None = None,
                 interpret: bool = False):
        self.layers = _layers_of(model)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise IntegrationError(SP_TRAIN_SETUP, f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}",
                                   help="pass the optimizer that steps the model's parameters")
        if reprune_every is not None and (not isinstance(reprune_every, int) or isinstance(reprune_every, bool)
                                          or reprune_every < 1):
            raise IntegrationError(SP_TRAIN_SETUP, f"reprune_every must be a positive integer or None, got "
                                   f"{reprune_every!r}", help="e.g. reprune_every=100; None keeps the masks fixed")
        if reprune_every is not None:
            _refuse_parametrized_masks(self.layers)  # (also at each re-prune: one parametrized since)
        self.model, self.optimizer = model, optimizer
        self.reprune_every, self.interpret = reprune_every, interpret
        self.steps = 0
        self.changed: list[float] = []
        """The share of mask entries each re-prune changed, in order."""
        self._handle = optimizer.register_step_post_hook(self._after_step)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.reprune_every and self.steps % self.reprune_every == 0:
            self.changed.append(_reprune_all(self.layers, self.interpret))  # (all or nothing, as reprune_)
        else:
            _refresh_all(self.layers, self.interpret)

    def remove(self) -> None:
        """Stop following the optimizer's steps."""
        self._handle.remove()


__all__ = ["SemiSparseLinear", "SparseTrainer", "check_mask", "recompress_", "reprune_", "sparse_linear_train",
           "trainable_layers", "transposable_mask"]
