"""A ``SparseLinear``'s forward under ``torch.fx.symbolic_trace``.

FX's symbolic tracer calls the ``forward`` of every module outside ``torch.nn`` (a SparseLinear is no
leaf to it, unlike ``nn.Linear``) with an ``fx.Proxy`` for x: a placeholder that records the
operations applied to it, with no shape, dtype or ``requires_grad`` to read while tracing. The forward
records the layer's custom op on it, as torch.compile and torch.export trace it (docs/torch.md, "The
custom ops"); the layer itself is a ``get_attr`` node and its tensors are read from it when the graph
runs, so the graph computes with the weight as it is then, and the GraphModule holds the layer (its
``.half()`` / ``.to(dtype)`` keep the compressed values' type, as the model's do; tensors as nodes of
their own were copied into a plain ``torch.nn.Module``, which converted bf16 values to float16). x
is checked when the graph runs, as the eager call checks it (SP0901). Before, the proxy met the
layer's eager input check: SP0901, "SparseLinear takes a torch.Tensor, got Proxy".

A ``SemiSparseLinear`` is recorded as a leaf instead (:func:`recorded_call`): one ``call_module``
node, which runs the eager layer when the graph runs. Its forward does more than the op: it
compresses the master weight again where it changed since (an optimizer step), which a graph of
``get_attr`` nodes would not do (the graph would compute with the compressions from before the
step, without a word).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import SP_TRAIN_LAYER, IntegrationError
from .layer_args import check_input


def checked_x(x: torch.Tensor, values: torch.Tensor, in_features: int, layer: str) -> torch.Tensor:
    """x as (T, K), after the eager call's input check (SP0901: not a tensor, another last dimension,
    dtype or device): a node of the traced graph, run with the real x (``torch.fx.wrap``)."""
    check_input(x, in_features, values.device, layer)
    return x.reshape(-1, in_features)


torch.fx.wrap("checked_x")


def is_fx_proxy(x: Any) -> bool:
    """x is a ``torch.fx.Proxy``: ``torch.fx.symbolic_trace`` is tracing the layer."""
    return isinstance(x, torch.fx.Proxy)


def forward_fx(layer: Any, x: Any) -> Any:
    """The layer's forward recorded on the proxy ``x``: x checked and made (T, K) (:func:`checked_x`),
    then ``sparse_linear`` (which casts x to the weight's type, x's gradient in x's dtype), or for e4m3
    weights ``sparse_linear_e4m3``
    (x quantized per token, or with the layer's static ``input_scale``; x's gradient straight through,
    whether or not x will require grad: the numbers of the eager layer's two ops), y in ``out_dtype``
    or x's dtype, back to (..., N). The members of a ``fuse_projections_`` group run their own ops (the
    group's fused weight is no module attribute of the model)."""
    held = _layer_node(layer, x)
    values = held.values
    x2 = checked_x(x, values, layer.in_features, layer._user_name or type(layer).__name__)
    out = layer.out_dtype or x.dtype
    bias = None if layer.bias is None else held.bias
    if layer.weight_dtype == "e4m3":
        scale_x = None if layer.input_scale is None else held.input_scale
        y = torch.ops.sparsile.sparse_linear_e4m3.default(x2, values, held.meta, bias, held.scale_w, scale_x,
                                                          activation=layer.activation, out_dtype=out)
    else:
        y = torch.ops.sparsile.sparse_linear.default(x2, values, held.meta, bias, activation=layer.activation,
                                                     out_dtype=out)
    return y.reshape(x.shape[:-1] + (layer.out_features,))  # noqa: RUF005 (a Proxy cannot be unpacked)


def _layer_node(layer: torch.nn.Module, x: Any) -> Any:
    """A ``get_attr`` node of ``layer`` itself (its path in the traced root), whose tensors the graph
    reads when it runs: the GraphModule then holds the layer, so ``graph.half()`` / ``.to(dtype)`` /
    ``load_state_dict`` go through the layer's own rules (the compressed values keep their type, as in
    ``model.half()``). Tensors read as nodes of their own were copied into a plain ``torch.nn.Module``,
    which ``.half()`` converted (bf16 values to float16: other numbers, silently). The layer itself
    where it has no path (the root traced, which torch refuses later on)."""
    path = _path_in_root(layer, x)
    return x.tracer.create_proxy("get_attr", path, (), {}) if path else layer


def recorded_call(layer: torch.nn.Module, x: Any) -> Any:
    """``layer(x)`` recorded on the proxy ``x`` as one ``call_module`` node of the layer's path in the
    traced root, as the tracer records a ``torch.nn`` leaf: the graph runs the eager layer (its checks,
    its re-compression of a stale master weight, its autograd). SP0916 where the layer has no path, the
    root traced itself (a ``call_module`` node cannot name the root) or a proxy of no module tracer."""
    path = _path_in_root(layer, x)
    if not path:
        name = type(layer).__name__
        raise IntegrationError(
            SP_TRAIN_LAYER, f"torch.fx.symbolic_trace cannot record this {name}: it is recorded as a call of the "
            f"module (a call_module node, which runs the eager layer), and it is not a submodule of the module "
            "traced (it is the root, or outside it)",
            help=f"trace a module that holds it: torch.fx.symbolic_trace(torch.nn.Sequential(layer)), or the "
                 f"model the {name} is part of")
    return x.tracer.create_proxy("call_module", path, (x,), {})


def _path_in_root(layer: torch.nn.Module, x: Any) -> str:
    """``layer``'s path in the root that the tracer of proxy ``x`` traces; "" where it has none (the
    root itself, a layer outside the root, a tracer without a root)."""
    try:
        return x.tracer.path_of_module(layer)
    except (AttributeError, NameError):
        return ""
