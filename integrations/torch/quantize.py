"""e4m3 quantization of activations for ``sparsile.torch``: per token (the calls a launch record
does not quantize itself: large T, padded plans, the torch.compile path), the kernel API's
quantizer, through launches prepared once per shape; and with a layer's static per-tensor
``input_scale``: torch's own operations (:func:`quantize_static`: on the CPU and in traces) or, on
CUDA, the kernel API's static quantizer, the same bits in one launch (:func:`quantize_with_scale`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import SP_CANNOT_SPARSIFY, IntegrationError
from . import _kernels  # kernel_api, stream_getter, as_torch: looked up per call (tests stand in for them)

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn

QUANTIZERS_KEPT = 256
"""Prepared quantizer launches kept (by T, K, x dtype, device; least recently built dropped first)."""
_QUANTIZERS: OrderedDict[tuple, Any] = OrderedDict()
_QUANTIZERS_LOCK = threading.Lock()


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q e4m3 (T, K), scale_x float32 (T,)) of a 2-D x, through the kernel API's quantizer. On
    the GPU through a launch prepared once per (T, K, x dtype, device): the generic launch's
    argument binding and checks cost about 100 µs of host time per eager e4m3 call on the H200. A
    neg view (``torch._neg_view(x)``) is quantized as the values it shows, through a resolved copy."""
    t, k = (int(s) for s in x.shape)
    if x.is_neg():  # a lazy negation (torch._neg_view): a launch reads its memory, the values before it
        x = x.resolve_neg()
    if x.is_cuda and t and k:
        if x.data_ptr() % 16:  # the kernel was specialized for 16-byte aligned rows
            x = x.clone()
        xq = torch.empty((t, k), dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.empty((t,), dtype=torch.float32, device=x.device)
        prepared_quantizer(x, xq, scale).run((x, xq, scale), _kernels.stream_getter(x.get_device())())
        return xq, scale
    xq, scale = _kernels.kernel_api().quantize(x, interpret=x.device.type == "cpu")
    xq = _kernels.as_torch(xq, x.device, torch.float8_e4m3fn)
    return xq, _kernels.as_torch(scale, x.device, torch.float32).reshape(-1)


def prepared_quantizer(x: torch.Tensor, xq: torch.Tensor, scale: torch.Tensor) -> Any:
    """The prepared quantizer launch of :func:`quantize_per_token` for 2-D x (and its outputs ``xq``
    and ``scale``): the one kept for x's (T, K, dtype, device), else prepared now (which compiles
    its kernel on first use) and kept. ``sparsile.torch.warm_up`` lists the same specialization
    (integrations/torch/first_call.py)."""
    t, k = (int(s) for s in x.shape)
    return _kept_quantizer((t, k, x.dtype, x.get_device()),
                           lambda: _kernels.kernel_api().prepare_quantize(x, xq, scale))


def _kept_quantizer(key: tuple, prepare: Callable[[], Any]) -> Any:
    """The prepared quantizer launch kept under ``key``, else ``prepare()``'s, kept (the oldest of more
    than ``QUANTIZERS_KEPT`` dropped)."""
    launch = _QUANTIZERS.get(key)
    if launch is None:
        launch = prepare()
        with _QUANTIZERS_LOCK:
            _QUANTIZERS[key] = launch
            while len(_QUANTIZERS) > QUANTIZERS_KEPT:
                _QUANTIZERS.popitem(last=False)
    return launch


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor, inverse: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`quantize_static` of a 2-D x with the static ``scale`` (1,) float32, the same bits: on CUDA
    one launch of the kernel API's static quantizer (prepared once per (T, K, x dtype, device); it
    reads the scale's memory itself, so a CUDA graph replays with the scale's value then), into a
    fresh x_q; elsewhere torch's operations (``inverse``: the scale's kept reciprocal, or None)."""
    t, k = (int(s) for s in x.shape)
    if not (x.is_cuda and t and k):
        return quantize_static(x, scale, inverse)
    if x.is_neg():
        x = x.resolve_neg()
    if not x.is_contiguous():
        x = x.contiguous()
    elif x.data_ptr() % 16:  # (the kernel was specialized for 16-byte aligned rows)
        x = x.clone()
    if scale.data_ptr() % 16:
        scale = scale.clone()  # (stream-ordered: the value at this point of the stream, in a capture too)
    xq = torch.empty((t, k), dtype=torch.float8_e4m3fn, device=x.device)
    launch = _kept_quantizer((t, k, x.dtype, x.get_device(), "static"), lambda: _kernels.kernel_api()
                             .prepare_quantize_static(x, xq, scale, per_call=("X", "XQ", "S")))
    launch.run((x, xq, scale), _kernels.stream_getter(x.get_device())())
    return xq


def quantize_static(x: torch.Tensor, scale: torch.Tensor, inverse: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) as e4m3 with a static per-tensor ``scale`` (1,) float32, as vLLM's
    ``static_scaled_fp8_quant`` computes it: x in float32 times the float32 reciprocal of the scale
    (``inverse``, computed here when not given), saturated to ±448, rounded to nearest even. (Not x /
    scale: a 16-bit x times a scale's reciprocal often lands exactly on a midpoint of two e4m3 values,
    and the float32 rounding decides the side; the exact quotient can lie on the other.) A NaN stays
    NaN (``clamp`` keeps it; vLLM's fminf / fmaxf make it 448), ±inf becomes ±448. No host read of
    the scale (it stays on x's device); under torch.compile the operations fuse into one kernel."""
    if inverse is None:
        inverse = torch.reciprocal(scale)
    return torch.mul(x, inverse).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def static_inverse(d: dict[str, Any], scale: torch.Tensor) -> torch.Tensor:
    """The float32 reciprocal of a layer's static ``scale`` (``d``: the layer's ``__dict__``), computed on
    its device once and kept while the scale is the same tensor, at the same address and version (a
    write to it in place, ``load_state_dict`` included, computes it again); not kept from inside a
    CUDA-graph capture (its memory would be the graph's)."""
    kept = d.get("_static_inverse")
    version = -1 if scale.is_inference() else scale._version
    if kept is not None and kept[0] is scale and kept[1] == version and kept[2] == scale.data_ptr():
        return kept[3]
    inverse = torch.reciprocal(scale.detach())
    if not (scale.is_cuda and _kernels.capturing()):
        d["_static_inverse"] = (scale, version, scale.data_ptr(), inverse)
    return inverse


def _bad_scale(message: str, help: str) -> IntegrationError:
    return IntegrationError(SP_CANNOT_SPARSIFY, f"input_scale: {message}", help=help)


def checked_input_scale(value: Any, weight_dtype: str | None, tensor: bool = False) -> torch.Tensor:
    """A layer's static per-tensor activation scale as a (1,) float32 tensor (SP0902 otherwise): only
    for an e4m3 layer; one positive finite number. ``tensor`` (``layer.input_scale = t``): ``t`` itself,
    which must already be a (1,) float32 tensor (a buffer is stored as given); its value is checked
    where it is on the CPU (on a GPU that would read it back, a synchronization)."""
    if weight_dtype != "e4m3":
        raise _bad_scale(f"a static input scale is given to a {weight_dtype} layer, but only e4m3 layers quantize x",
                         help="leave input_scale unset for bf16 / f16 layers (x is cast, not scaled)")
    if tensor:
        if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or tuple(value.shape) != (1,):
            got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise _bad_scale(f"must be a float32 tensor of shape (1,), got {got}",
                             help="assign torch.tensor([scale], dtype=torch.float32) on the layer's device")
        host = value.detach().numpy() if value.device.type == "cpu" else None
    else:
        try:
            host = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise _bad_scale(f"cannot be read as a number ({exc})", help="pass one positive float") from None
        if host.size != 1:
            raise _bad_scale(f"has {host.size} elements; a static input scale is per tensor (one element)",
                             help="pass one positive float")
        value = torch.from_numpy(host.reshape(1).copy())
    if host is not None and not (np.isfinite(host).all() and (host > 0).all()):
        raise _bad_scale(f"{float(host.reshape(-1)[0])!r} is not a positive finite number",
                         help="pass the scale that maps x's range to ±448 (amax / 448)")
    return value
