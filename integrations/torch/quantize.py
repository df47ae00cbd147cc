"""Per-token e4m3 quantization of activations for ``sparsile.torch`` (the calls a launch record
does not quantize itself: large T, padded plans, the torch.compile path): the kernel API's
quantizer, through launches prepared once per shape."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch

from . import _kernels  # kernel_api, stream_getter, as_torch: looked up per call (tests stand in for them)

QUANTIZERS_KEPT = 256
"""Prepared quantizer launches kept (by T, K, x dtype, device; least recently built dropped first)."""
_QUANTIZERS: OrderedDict[tuple[int, int, torch.dtype, int], Any] = OrderedDict()
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
    key = (t, k, x.dtype, x.get_device())
    launch = _QUANTIZERS.get(key)
    if launch is None:
        launch = _kernels.kernel_api().prepare_quantize(x, xq, scale)
        with _QUANTIZERS_LOCK:
            _QUANTIZERS[key] = launch
            while len(_QUANTIZERS) > QUANTIZERS_KEPT:
                _QUANTIZERS.popitem(last=False)
    return launch
